/* forward_dump: runs Strata's forward pass over a given token list and writes
 * every position's logits, so that an independent reference (the NumPy
 * forward pass in tests/ref/) can check them. The program does no checking
 * of its own beyond its input: it is the Strata side of the comparison.
 *
 *   forward_dump MODEL.gguf OUT.bin --tokens 1,2,3 [--kv f16|int8]
 *                [--ubatch N] [--ctx N] [--threads N] [--split] [--last] [--router R.bin]
 *
 * OUT.bin is float32 [n_tok][n_vocab], native byte order, no header.
 * --split runs the first half of the tokens as one call and then the rest one
 * token at a time (the prompt-then-decode pattern), which must give the same
 * logits as one call over all of them: the KV cache carries the state.
 * --ubatch below n_tok makes model_forward cut the call into chunks itself.
 * --last asks for the last token's logits only (all_logits = 0, the prompt
 * path of the engine): OUT.bin then holds [1][n_vocab].
 * --router appends the router logits of every MoE call (float32
 * [n_tok][n_expert] per call, so [n_layer][n_tok][n_expert] for one call of
 * the whole list): the reference can then follow Strata's expert choice at a
 * near-tie instead of counting a flipped choice as a forward-pass error. It
 * wraps the backend's moe_ffn entry, so the forward pass itself is untouched.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/alloc.h"
#include "core/log.h"
#include "engine/kv_cache.h"
#include "model/forward.h"
#include "model/model.h"

#define MAX_TOKENS 65536

/* --router: the backend's own moe_ffn, and where its inputs are recorded */
static void (*real_moe_ffn)(st_backend *, const float *, const float *, int, int, int, const st_moe_gating *, st_act,
                            const st_weight *, const st_weight *, const st_weight *, float *);
static FILE *router_file;

static void recording_moe_ffn(st_backend *be, const float *h, const float *router_logits, int n_tok, int n_expert,
                              int k, const st_moe_gating *gt, st_act act, const st_weight *gate, const st_weight *up,
                              const st_weight *down, float *out) {
    size_t n = (size_t)n_tok * (size_t)n_expert;
    float *host = st_malloc(n * sizeof(float));
    be->to_host(be, host, router_logits, n * sizeof(float));
    if (fwrite(host, sizeof(float), n, router_file) != n) {
        fprintf(stderr, "forward_dump: cannot write the router logits\n");
        exit(1);
    }
    st_free(host);
    real_moe_ffn(be, h, router_logits, n_tok, n_expert, k, gt, act, gate, up, down, out);
}

static int usage(void) {
    fprintf(stderr, "usage: forward_dump MODEL.gguf OUT.bin --tokens 1,2,3 [--kv f16|int8] [--ubatch N] "
                    "[--ctx N] [--threads N] [--split] [--last] [--router R.bin]\n");
    return 2;
}

/* Comma-separated non-negative ids; returns the count or -1. */
static int parse_tokens(const char *s, int32_t *out, int cap) {
    int n = 0;
    while (*s) {
        char *end;
        errno = 0;
        long v = strtol(s, &end, 10);
        if (end == s || errno || v < 0 || v > INT32_MAX || n >= cap) return -1;
        out[n++] = (int32_t)v;
        if (*end == ',') end++;
        else if (*end) return -1;
        s = end;
    }
    return n;
}

static int parse_int(const char *s, int *out) {
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (end == s || *end || errno || v < 0 || v > (1L << 30)) return -1;
    *out = (int)v;
    return 0;
}

int main(int argc, char **argv) {
    if (argc < 3) return usage();
    const char *model_path = argv[1], *out_path = argv[2];
    const char *tok_arg = NULL, *kv_arg = "f16", *router_path = NULL;
    int ubatch = 0, n_ctx = 0, n_threads = 0, split = 0, last_only = 0;
    for (int i = 3; i < argc; i++) {
        const char *a = argv[i];
        int has_val = i + 1 < argc;
        if (!strcmp(a, "--split")) split = 1;
        else if (!strcmp(a, "--last")) last_only = 1;
        else if (!strcmp(a, "--tokens") && has_val) tok_arg = argv[++i];
        else if (!strcmp(a, "--kv") && has_val) kv_arg = argv[++i];
        else if (!strcmp(a, "--router") && has_val) router_path = argv[++i];
        else if (!strcmp(a, "--ubatch") && has_val) {
            if (parse_int(argv[++i], &ubatch) || ubatch < 1) return usage();
        } else if (!strcmp(a, "--ctx") && has_val) {
            if (parse_int(argv[++i], &n_ctx) || n_ctx < 1) return usage();
        } else if (!strcmp(a, "--threads") && has_val) {
            if (parse_int(argv[++i], &n_threads)) return usage();
        } else return usage();
    }
    if (!tok_arg || (split && last_only)) return usage();
    int32_t *tokens = st_malloc(MAX_TOKENS * sizeof(int32_t));
    int n_tok = parse_tokens(tok_arg, tokens, MAX_TOKENS);
    if (n_tok <= 0) {
        fprintf(stderr, "forward_dump: bad --tokens list\n");
        return 2;
    }
    int kv_type = kv_type_from_name(kv_arg);
    if (kv_type < 0) {
        fprintf(stderr, "forward_dump: --kv must be f16 or int8, not '%s'\n", kv_arg);
        return 2;
    }
    if (!n_ctx) n_ctx = n_tok;
    if (n_ctx < n_tok) {
        fprintf(stderr, "forward_dump: --ctx %d is below the %d tokens\n", n_ctx, n_tok);
        return 2;
    }
    if (!ubatch) ubatch = n_tok;

    model *m = model_load(model_path);
    if (!m) {
        fprintf(stderr, "forward_dump: %s\n", st_error_get());
        return 1;
    }
    const model_hparams *hp = &m->hp;
    for (int i = 0; i < n_tok; i++)
        if (tokens[i] >= hp->n_vocab) {
            fprintf(stderr, "forward_dump: token %d is outside the vocabulary (%d)\n", tokens[i], hp->n_vocab);
            return 2;
        }
    st_backend *be = backend_cpu_create(n_threads);
    if (router_path) {
        router_file = fopen(router_path, "wb");
        if (!router_file) {
            fprintf(stderr, "forward_dump: cannot open %s\n", router_path);
            return 1;
        }
        real_moe_ffn = be->moe_ffn;
        be->moe_ffn = recording_moe_ffn;
    }
    model_ctx *ctx = model_ctx_create(m, be, ubatch);
    kv_cache *kv = kv_cache_create(be, hp, n_ctx, (st_kv_type)kv_type);
    size_t nv = (size_t)hp->n_vocab;
    float *logits = st_malloc((size_t)n_tok * nv * sizeof(float));

    if (split && n_tok > 1) {
        /* prompt: the first half in one call; decode: the rest one at a time */
        int first = n_tok / 2;
        model_forward(ctx, kv->layers, tokens, first, 0, logits, 1);
        for (int t = first; t < n_tok; t++)
            model_forward(ctx, kv->layers, tokens + t, 1, t, logits + (size_t)t * nv, 1);
    } else model_forward(ctx, kv->layers, tokens, n_tok, 0, logits, !last_only);
    size_t n_out = last_only ? nv : (size_t)n_tok * nv;

    if (router_file && fclose(router_file) != 0) {
        fprintf(stderr, "forward_dump: cannot write %s\n", router_path);
        return 1;
    }
    FILE *f = fopen(out_path, "wb");
    if (!f || fwrite(logits, sizeof(float), n_out, f) != n_out || fclose(f) != 0) {
        fprintf(stderr, "forward_dump: cannot write %s\n", out_path);
        return 1;
    }
    printf("forward_dump: %s arch %s, %d tokens, vocab %d, kv %s, ubatch %d%s -> %s\n", model_path,
           model_arch_name(hp->arch), n_tok, hp->n_vocab, kv_arg, ubatch,
           split       ? ", split"
           : last_only ? ", last only"
                       : "",
           out_path);

    st_free(logits);
    kv_cache_free(kv);
    model_ctx_free(ctx);
    be->destroy(be);
    model_free(m);
    st_free(tokens);
    return 0;
}
