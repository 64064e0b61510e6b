/* llama.cpp's logits for a token list, for comparisons with Strata on the
 * same GGUF (tests/ref/compare_llama.py). Not part of the build: compile it
 * against a llama.cpp build, e.g.
 *   cc -O2 tests/ref/llama_logits.c -I$LLAMA/include -I$LLAMA/ggml/include \
 *      -L$BUILD/bin -lllama -Wl,-rpath,$BUILD/bin -o llama_logits
 *
 * usage: llama_logits MODEL OUT.bin N_GEN TOK,TOK,...
 * Reads the prompt tokens in one batch, then generates N_GEN tokens greedily
 * one at a time; writes the logits of the prompt's last token and of every
 * generated step ((N_GEN + 1) rows of n_vocab float32) and prints the
 * generated ids on stdout, comma-separated. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "llama.h"

int main(int argc, char **argv) {
    if (argc != 5) {
        fprintf(stderr, "usage: llama_logits MODEL OUT.bin N_GEN TOK,TOK,...\n");
        return 2;
    }
    int n_gen = atoi(argv[3]), n = 0;
    llama_token toks[4096];
    for (char *p = strtok(argv[4], ","); p && n < 4000; p = strtok(NULL, ",")) toks[n++] = atoi(p);
    llama_backend_init();
    struct llama_model_params mp = llama_model_default_params();
    struct llama_model *m = llama_model_load_from_file(argv[1], mp);
    if (!m) return 1;
    struct llama_context_params cp = llama_context_default_params();
    cp.n_ctx = 256;
    cp.n_batch = cp.n_ubatch = 256;
    cp.n_threads = cp.n_threads_batch = 2;
    struct llama_context *ctx = llama_init_from_model(m, cp);
    if (!ctx) return 1;
    const int nv = llama_vocab_n_tokens(llama_model_get_vocab(m));
    FILE *f = fopen(argv[2], "wb");
    if (!f) return 1;
    if (llama_decode(ctx, llama_batch_get_one(toks, n)) != 0) return 1;
    for (int g = 0; g <= n_gen; g++) {
        const float *l = llama_get_logits_ith(ctx, -1);
        fwrite(l, sizeof(float), (size_t)nv, f);
        if (g == n_gen) break;
        llama_token best = 0;
        for (int i = 1; i < nv; i++)
            if (l[i] > l[best]) best = i;
        printf("%s%d", g ? "," : "", best);
        if (llama_decode(ctx, llama_batch_get_one(&best, 1)) != 0) return 1;
    }
    printf("\n");
    fclose(f);
    llama_free(ctx);
    llama_model_free(m);
    return 0;
}
