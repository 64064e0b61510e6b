/* mtp_dump: the Strata side of the MTP block's check against the NumPy
 * reference (tests/ref/test_mtp.py, ref_mtp.py). It reads a token list into
 * a sequence of an engine opened with --draft mtp's setting, writes the MTP
 * block's logits of every position (engine_seq_mtp_logits: row p from the
 * token at p and the final hidden state of p - 1), and, with --draft T,K,
 * the K tokens the engine drafts after pending token T (engine_seq_draft_mtp,
 * no logit bias). No checking of its own beyond its input.
 *
 *   mtp_dump MODEL.gguf OUT.bin --tokens 1,2,3 [--draft T,K] [--ubatch N] [--threads N]
 *
 * OUT.bin: float32 [n_tok][n_vocab]; OUT.bin.drafts: int32 [K]. With
 * --ubatch below the token count, the prompt and the block read in chunks.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/alloc.h"
#include "core/log.h"
#include "engine/engine.h"

#define MAX_TOKENS 4096

static int usage(void) {
    fprintf(stderr, "usage: mtp_dump MODEL.gguf OUT.bin --tokens 1,2,3 [--draft T,K] [--ubatch N] [--threads N]\n");
    return 2;
}

/* Comma-separated non-negative ids; returns the count or -1. */
static int parse_ints(const char *s, int32_t *out, int cap) {
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

int main(int argc, char **argv) {
    if (argc < 3) return usage();
    const char *model_path = argv[1], *out_path = argv[2], *tok_arg = NULL, *draft_arg = NULL;
    int32_t ub[1] = {0}, th[1] = {2}, dr[2] = {0, 0};
    for (int i = 3; i < argc; i++) {
        const int has_val = i + 1 < argc;
        if (!strcmp(argv[i], "--tokens") && has_val) tok_arg = argv[++i];
        else if (!strcmp(argv[i], "--draft") && has_val) draft_arg = argv[++i];
        else if (!strcmp(argv[i], "--ubatch") && has_val) {
            if (parse_ints(argv[++i], ub, 1) != 1 || ub[0] < 1) return usage();
        } else if (!strcmp(argv[i], "--threads") && has_val) {
            if (parse_ints(argv[++i], th, 1) != 1) return usage();
        } else return usage();
    }
    if (!tok_arg || (draft_arg && (parse_ints(draft_arg, dr, 2) != 2 || dr[1] < 1))) return usage();
    int32_t *toks = st_malloc(MAX_TOKENS * sizeof(int32_t));
    const int n = parse_ints(tok_arg, toks, MAX_TOKENS);
    if (n <= 0) return usage();
    st_log_set_level(ST_LOG_WARN);
    engine_params p = engine_defaults();
    p.model_path = model_path;
    p.n_ctx = n + dr[1] + 1;
    p.n_threads = th[0];
    p.n_ubatch = ub[0];
    p.draft_mtp = 1;
    engine *e = engine_open(&p);
    if (!e) {
        fprintf(stderr, "mtp_dump: %s\n", st_error_get());
        return 1;
    }
    const size_t nv = (size_t)e->m->hp.n_vocab;
    float *logits = st_malloc((size_t)n * nv * sizeof(float));
    if (engine_read_prompt(e, toks, n) < 0 || engine_seq_mtp_logits(e, &e->seq, 0, n, logits) != 0) {
        fprintf(stderr, "mtp_dump: %s\n", st_error_get());
        return 1;
    }
    FILE *f = fopen(out_path, "wb");
    if (!f || fwrite(logits, sizeof(float), (size_t)n * nv, f) != (size_t)n * nv || fclose(f) != 0) {
        fprintf(stderr, "mtp_dump: cannot write %s\n", out_path);
        return 1;
    }
    if (draft_arg) {
        int32_t *d = st_malloc((size_t)dr[1] * sizeof(int32_t));
        const int k = engine_seq_draft_mtp(e, &e->seq, dr[0], dr[1], NULL, d);
        char path[4096];
        snprintf(path, sizeof path, "%s.drafts", out_path);
        f = fopen(path, "wb");
        if (k != dr[1] || !f || fwrite(d, sizeof(int32_t), (size_t)k, f) != (size_t)k || fclose(f) != 0) {
            fprintf(stderr, "mtp_dump: %d of %d drafts, or cannot write %s\n", k, dr[1], path);
            return 1;
        }
        st_free(d);
    }
    printf("mtp_dump: %s, %d tokens, vocab %zu%s -> %s\n", model_path, n, nv, draft_arg ? ", drafts" : "", out_path);
    st_free(logits);
    st_free(toks);
    engine_close(e);
    return 0;
}
