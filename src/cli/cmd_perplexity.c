/* `strata perplexity`: perplexity of a model on a text file, computed the way
 * llama.cpp's llama-perplexity does so the two can be compared on the same
 * file: the tokens are cut into chunks of --ctx tokens, each chunk starts with
 * BOS (when the model adds one) in place of its first token, is evaluated
 * from an empty cache, and only the second half of each chunk is scored
 * (every scored token sees at least ctx/2 tokens of context). */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "cli/cli.h"
#include "cli/engine_opts.h"
#include "core/alloc.h"
#include "core/log.h"
#include "core/timer.h"

#define PPL_USAGE "strata perplexity " ENGINE_OPTS_USAGE " -f TEXTFILE [--chunks N]"

int cmd_perplexity(int argc, char **argv) {
    args_t a = {.cmd = "perplexity", .usage = PPL_USAGE, .argc = argc, .argv = argv, .i = 1};
    engine_params ep = engine_defaults();
    ep.model_path = STRATA_DEFAULT_MODEL;
    ep.n_ctx = 512;
    const char *path = NULL;
    long long max_chunks = 0;
    while (a.i < argc) {
        if (args_is_help(&a)) {
            printf("usage: %s\n\nPerplexity over chunks of --ctx tokens (default 512), scoring the second half\n"
                   "of each chunk, as llama.cpp's llama-perplexity does.\n",
                   PPL_USAGE);
            return 0;
        }
        int r = engine_opts_parse(&a, &ep);
        if (r > 0) continue;
        if (r < 0) return a.err;
        const char *v;
        if ((r = args_value(&a, "-f", &v))) {
            if (r < 0) return a.err;
            path = v;
        } else if ((r = args_value(&a, "--chunks", &v))) {
            if (r < 0 || args_int(&a, "--chunks", v, 1, 1 << 30, &max_chunks)) return a.err;
        } else
            return args_unknown(&a);
    }
    if (!path) return cli_usage_error("perplexity", PPL_USAGE, "missing -f TEXTFILE");
    size_t len;
    char *text = cli_read_file(path, &len);
    if (!text) {
        fprintf(stderr, "strata perplexity: cannot read '%s'\n", path);
        return 1;
    }
    engine *e = engine_open(&ep);
    if (!e) {
        fprintf(stderr, "strata perplexity: %s\n", st_error_get());
        st_free(text);
        return 1;
    }
    int64_t n_tok = tokenizer_encode(e->tok, text, len, 1, 0, NULL, 0);
    int32_t *toks = n_tok > 0 ? st_malloc((size_t)n_tok * sizeof(int32_t)) : NULL;
    if (toks) tokenizer_encode(e->tok, text, len, 1, 0, toks, n_tok);
    st_free(text);
    int n_ctx = e->n_ctx, nv = e->m->hp.n_vocab;
    int64_t n_chunks = n_tok / n_ctx;
    if (max_chunks > 0 && n_chunks > max_chunks) n_chunks = max_chunks;
    if (n_chunks < 1) {
        fprintf(stderr, "strata perplexity: the text has %lld tokens, fewer than one chunk of %d\n",
                (long long)n_tok, n_ctx);
        st_free(toks);
        engine_close(e);
        return 1;
    }
    float *logits = st_malloc((size_t)n_ctx * nv * sizeof(float));
    int32_t *chunk = st_malloc((size_t)n_ctx * sizeof(int32_t));
    int32_t bos = tokenizer_bos(e->tok);
    int add_bos = tokenizer_add_bos(e->tok) && bos >= 0;
    int first = n_ctx / 2;
    double nll = 0, nll2 = 0;
    int64_t count = 0;
    int64_t t0 = st_now_ns();
    for (int64_t c = 0; c < n_chunks; c++) {
        memcpy(chunk, toks + c * n_ctx, (size_t)n_ctx * sizeof(int32_t));
        if (add_bos) chunk[0] = bos;
        model_forward(e->mc, e->kv->layers, chunk, n_ctx, 0, logits, 1);
        for (int j = first; j < n_ctx - 1; j++) {
            const float *l = logits + (size_t)j * nv;
            float mx = l[0];
            for (int i = 1; i < nv; i++) mx = fmaxf(mx, l[i]);
            double sum = 0;
            for (int i = 0; i < nv; i++) sum += exp((double)(l[i] - mx));
            double v = -((double)(l[toks[c * n_ctx + j + 1]] - mx) - log(sum));
            nll += v;
            nll2 += v * v;
            count++;
        }
        printf("[%lld]%.4f%s", (long long)(c + 1), exp(nll / count), c + 1 < n_chunks ? "," : "\n");
        fflush(stdout);
    }
    double mean = nll / count, var = nll2 / count - mean * mean;
    double ppl = exp(mean), err = ppl * sqrt(var > 0 ? var / (count - 1) : 0);
    double secs = (double)(st_now_ns() - t0) / 1e9;
    printf("Final estimate: PPL = %.4f +/- %.5f  (%lld chunks of %d, %lld scored tokens, %.1f s, %.1f tok/s)\n", ppl,
           err, (long long)n_chunks, n_ctx, (long long)count, secs, n_chunks * n_ctx / secs);
    st_free(logits);
    st_free(chunk);
    st_free(toks);
    engine_close(e);
    return 0;
}
