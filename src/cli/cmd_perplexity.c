/* `strata perplexity`: perplexity of a model on a text file, computed the way
 * llama.cpp's llama-perplexity does so the two can be compared on the same
 * file: the tokens are cut into chunks of --ctx tokens, each chunk starts with
 * BOS (when the model adds one) in place of its first token, is evaluated
 * from an empty cache, and only the second half of each chunk is scored
 * (every scored token sees at least ctx/2 tokens of context).
 *
 * With --kl-divergence-base FILE it also writes the scored positions'
 * log-probabilities in llama.cpp's base-file format (ppl_kld.h); adding
 * --kl-divergence reads such a file instead (written by Strata or by
 * llama.cpp) and prints llama.cpp's KL-divergence statistics of this run
 * against it. The chunks come from the file (its ctx and tokens); a text
 * given with -f must tokenize to the same tokens. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "cli/cli.h"
#include "cli/engine_opts.h"
#include "cli/ppl_kld.h"
#include "core/alloc.h"
#include "core/log.h"
#include "core/timer.h"

#define PPL_USAGE                                                                                                      \
    "strata perplexity " ENGINE_OPTS_USAGE " -f TEXTFILE [--chunks N] [--kl-divergence-base FILE [--kl-divergence]]"

/* Reading a base file: the model's vocabulary, --chunks when given and, with
 * -f, the text's tokens must agree with the file; 0, or -1 with a message on
 * stderr naming both sides. */
static int check_base(const kld_file *k, const engine *e, const char *model_path, const char *text_path,
                      const int32_t *toks, int64_t n_tok, long long max_chunks) {
    const char *base = k->path;
    if (e->m->hp.n_vocab != k->n_vocab) {
        fprintf(stderr,
                "strata perplexity: the base file '%s' has a vocabulary of %d tokens, the model '%s' has %d: "
                "another model family\n",
                base, k->n_vocab, model_path, (int)e->m->hp.n_vocab);
        return -1;
    }
    if (max_chunks > 0 && max_chunks != k->n_chunk) {
        fprintf(stderr, "strata perplexity: the base file '%s' has %d chunks, --chunks asks for %lld\n", base,
                k->n_chunk, max_chunks);
        return -1;
    }
    if (!toks) return 0;
    int64_t need = (int64_t)k->n_chunk * k->n_ctx;
    if (n_tok < need) {
        fprintf(stderr,
                "strata perplexity: the base file '%s' has %d chunks of %d tokens (%lld), the text '%s' only %lld "
                "tokens: another text\n",
                base, k->n_chunk, k->n_ctx, (long long)need, text_path, (long long)n_tok);
        return -1;
    }
    for (int64_t i = 0; i < need; i++)
        if (toks[i] != k->tokens[i]) {
            fprintf(stderr,
                    "strata perplexity: token %lld differs: %d in the base file '%s', %d in the text '%s': another "
                    "text or another tokenizer\n",
                    (long long)i, k->tokens[i], base, toks[i], text_path);
            return -1;
        }
    return 0;
}

/* The ctx and chunk count a base file was written with, read before the
 * engine opens so that its context is sized from the file. */
static int peek_base(const char *path, kld_file *k) {
    if (kld_open(k, path) == 0) return 0;
    fprintf(stderr, "strata perplexity: %s\n", st_error_get());
    kld_close(k);
    return -1;
}

int cmd_perplexity(int argc, char **argv) {
    args_t a = {.cmd = "perplexity", .usage = PPL_USAGE, .argc = argc, .argv = argv, .i = 1};
    engine_params ep = engine_defaults();
    ep.model_path = STRATA_DEFAULT_MODEL;
    ep.n_ctx = 0; /* 512, or the base file's */
    const char *path = NULL, *base_path = NULL;
    int read_base = 0;
    long long max_chunks = 0;
    while (a.i < argc) {
        if (args_is_help(&a)) {
            printf("usage: %s\n\nPerplexity over chunks of --ctx tokens (default 512), scoring the second half\n"
                   "of each chunk, as llama.cpp's llama-perplexity does.\n\n"
                   "  --kl-divergence-base FILE  write the scored log-probabilities to FILE in the format of\n"
                   "                             llama-perplexity --kl-divergence-base\n"
                   "  --kl-divergence            read FILE instead (from Strata or llama.cpp) and print the KL\n"
                   "                             divergence of this run against it, as llama.cpp does; the\n"
                   "                             file's ctx and tokens are used, -f is optional and must match\n",
                   PPL_USAGE);
            return 0;
        }
        if (!strcmp(argv[a.i], "--kl-divergence")) {
            read_base = 1;
            a.i++;
            continue;
        }
        int r = engine_opts_parse(&a, &ep);
        if (r > 0) continue;
        if (r < 0) return a.err;
        const char *v;
        if ((r = args_value(&a, "-f", &v))) {
            if (r < 0) return a.err;
            path = v;
        } else if ((r = args_value(&a, "--kl-divergence-base", &v))) {
            if (r < 0) return a.err;
            base_path = v;
        } else if ((r = args_value(&a, "--chunks", &v))) {
            if (r < 0 || args_int(&a, "--chunks", v, 1, 1 << 30, &max_chunks)) return a.err;
        } else return args_unknown(&a);
    }
    if (read_base && !base_path)
        return cli_usage_error("perplexity", PPL_USAGE, "--kl-divergence needs --kl-divergence-base FILE");
    if (!path && !read_base) return cli_usage_error("perplexity", PPL_USAGE, "missing -f TEXTFILE");

    kld_file kf = {0};
    if (read_base) {
        if (peek_base(base_path, &kf)) return 1;
        if (ep.n_ctx && ep.n_ctx != kf.n_ctx) {
            fprintf(stderr, "strata perplexity: the base file '%s' was computed with ctx %d, --ctx asks for %d\n",
                    base_path, kf.n_ctx, ep.n_ctx);
            kld_close(&kf);
            return 1;
        }
        ep.n_ctx = kf.n_ctx;
    } else if (!ep.n_ctx) ep.n_ctx = 512;

    int32_t *toks = NULL;
    int64_t n_tok = 0;
    int toks_owned = 1;
    char *text = NULL;
    size_t len = 0;
    if (path && !(text = cli_read_file(path, &len))) {
        fprintf(stderr, "strata perplexity: cannot read '%s'\n", path);
        kld_close(&kf);
        return 1;
    }
    engine *e = engine_open(&ep);
    if (!e) {
        fprintf(stderr, "strata perplexity: %s\n", st_error_get());
        st_free(text);
        kld_close(&kf);
        return 1;
    }
    if (text) {
        n_tok = tokenizer_encode(e->tok, text, len, 1, 0, NULL, 0);
        toks = n_tok > 0 ? st_malloc((size_t)n_tok * sizeof(int32_t)) : NULL;
        if (toks) tokenizer_encode(e->tok, text, len, 1, 0, toks, n_tok);
        st_free(text);
    }
    int n_ctx = e->n_ctx, nv = e->m->hp.n_vocab, rc = 1;
    int64_t n_chunks;
    if (read_base) {
        if (check_base(&kf, e, ep.model_path, path, toks, n_tok, max_chunks)) goto out;
        st_free(toks);
        toks = kf.tokens; /* owned by kf from here */
        toks_owned = 0;
        n_chunks = kf.n_chunk;
    } else {
        n_chunks = n_tok / n_ctx;
        if (max_chunks > 0 && n_chunks > max_chunks) n_chunks = max_chunks;
        if (n_chunks < 1) {
            fprintf(stderr, "strata perplexity: the text has %lld tokens, fewer than one chunk of %d\n",
                    (long long)n_tok, n_ctx);
            goto out;
        }
        if (base_path && kld_create(&kf, base_path, n_ctx, nv, (int)n_chunks, toks)) {
            fprintf(stderr, "strata perplexity: %s\n", st_error_get());
            goto out;
        }
    }
    float *logits = st_malloc((size_t)n_ctx * nv * sizeof(float));
    int32_t *chunk = st_malloc((size_t)n_ctx * sizeof(int32_t));
    int32_t bos = tokenizer_bos(e->tok);
    int add_bos = tokenizer_add_bos(e->tok) && bos >= 0;
    int first = n_ctx / 2;
    double nll = 0, nll2 = 0;
    int64_t count = 0;
    kld_stats ks = {0};
    if (read_base) {
        kld_stats_init(&ks, n_chunks * kld_rows_per_chunk(n_ctx));
        kld_print_header(stdout);
    }
    int64_t t0 = st_now_ns();
    rc = 0;
    for (int64_t c = 0; c < n_chunks && !rc; c++) {
        const int32_t *ct = toks + c * n_ctx;
        memcpy(chunk, ct, (size_t)n_ctx * sizeof(int32_t));
        if (add_bos) chunk[0] = bos;
        model_forward(e->mc, e->kv->layers, chunk, n_ctx, 0, logits, 1);
        const float *scored = logits + (size_t)first * nv;
        if (read_base) {
            if ((rc = kld_read_chunk(&kf)) != 0) break;
            kld_stats_chunk(&ks, scored, &kf, ct + first + 1);
            kld_print_chunk(stdout, &ks, c + 1);
            fflush(stdout);
            continue;
        }
        if (base_path && (rc = kld_write_chunk(&kf, scored)) != 0) break;
        for (int j = first; j < n_ctx - 1; j++) {
            const float *l = logits + (size_t)j * nv;
            float mx = l[0];
            for (int i = 1; i < nv; i++) mx = fmaxf(mx, l[i]);
            double sum = 0;
            for (int i = 0; i < nv; i++) sum += exp((double)(l[i] - mx));
            double v = -((double)(l[ct[j + 1]] - mx) - log(sum));
            nll += v;
            nll2 += v * v;
            count++;
        }
        printf("[%lld]%.4f%s", (long long)(c + 1), exp(nll / count), c + 1 < n_chunks ? "," : "\n");
        fflush(stdout);
    }
    double secs = (double)(st_now_ns() - t0) / 1e9;
    if (!rc && read_base) {
        printf("\n");
        kld_print_summary(stdout, &ks);
        printf("(%lld chunks of %d against '%s', %.1f s, %.1f tok/s)\n", (long long)n_chunks, n_ctx, base_path, secs,
               n_chunks * n_ctx / secs);
    } else if (!rc) {
        double mean = nll / count, var = nll2 / count - mean * mean;
        double ppl = exp(mean), err = ppl * sqrt(var > 0 ? var / (count - 1) : 0);
        printf("Final estimate: PPL = %.4f +/- %.5f  (%lld chunks of %d, %lld scored tokens, %.1f s, %.1f tok/s)\n",
               ppl, err, (long long)n_chunks, n_ctx, (long long)count, secs, n_chunks * n_ctx / secs);
    }
    if (rc) fprintf(stderr, "strata perplexity: %s\n", st_error_get());
    kld_stats_free(&ks);
    st_free(logits);
    st_free(chunk);
out:
    if (toks_owned) st_free(toks);
    if (!read_base && base_path && kf.f && kld_close(&kf)) {
        fprintf(stderr, "strata perplexity: %s\n", st_error_get());
        rc = 1;
    }
    kld_close(&kf);
    engine_close(e);
    return rc ? 1 : 0;
}
