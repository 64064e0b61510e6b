/* llama.cpp's MTP block on a token list, for comparisons with Strata on the
 * same GGUF (tests/ref/compare_llama_mtp.py). Not part of the build: compile
 * it against a llama.cpp build's static libraries (b11434), e.g.
 *   c++ -O2 -std=c++17 tests/ref/llama_mtp.cpp -I$LLAMA/include -I$LLAMA/common -I$LLAMA/ggml/include \
 *       -I$LLAMA/src $BUILD/common/libllama-common.a $BUILD/common/libllama-common-base.a \
 *       $BUILD/src/libllama.a $BUILD/ggml/src/libggml.a $BUILD/ggml/src/libggml-cpu.a \
 *       $BUILD/ggml/src/libggml-base.a -fopenmp -lpthread -o llama_mtp
 *
 * usage: llama_mtp MODEL OUT.bin K PENDING TOK,TOK,...
 * As llama.cpp's own MTP driver (common/speculative.cpp, draft-mtp) does:
 * the target context reads the prompt with its final hidden states kept
 * (llama_set_embeddings_nextn); an MTP context on the same model
 * (LLAMA_CONTEXT_TYPE_MTP) reads every prompt token paired with the hidden
 * state of the position before it (zeros for the first), all rows output;
 * then PENDING at position n with the last hidden state, and each greedy
 * guess with the block's own output row, K steps. Writes the prompt rows'
 * MTP logits ([n][n_vocab] float32) and prints the K guesses on stdout,
 * comma-separated. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <vector>

#include "../src/llama-ext.h"
#include "common.h"
#include "llama.h"

static int argmax(const float *x, int n) {
    int b = 0;
    for (int i = 1; i < n; i++)
        if (x[i] > x[b]) b = i;
    return b;
}

int main(int argc, char **argv) {
    if (argc != 6) {
        fprintf(stderr, "usage: llama_mtp MODEL OUT.bin K PENDING TOK,TOK,...\n");
        return 2;
    }
    const int k = atoi(argv[3]);
    const llama_token pending = atoi(argv[4]);
    std::vector<llama_token> toks;
    for (char *p = strtok(argv[5], ","); p; p = strtok(NULL, ",")) toks.push_back(atoi(p));
    const int n = (int)toks.size();
    llama_backend_init();
    llama_model_params mp = llama_model_default_params();
    mp.load_mtp = true;
    llama_model *m = llama_model_load_from_file(argv[1], mp);
    if (!m) return 1;
    llama_context_params cp = llama_context_default_params();
    cp.n_ctx = 256;
    cp.n_batch = cp.n_ubatch = 256;
    cp.n_threads = cp.n_threads_batch = 2;
    llama_context *tgt = llama_init_from_model(m, cp);
    if (!tgt) return 1;
    llama_set_embeddings_nextn(tgt, true, false);
    llama_context_params cd = cp;
    cd.ctx_type = LLAMA_CONTEXT_TYPE_MTP;
    cd.n_rs_seq = 0;
    cd.ctx_other = tgt;
    llama_context *dft = llama_init_from_model(m, cd);
    if (!dft) return 1;
    llama_set_embeddings_nextn(dft, true, true);
    const int E = llama_model_n_embd(m), V = llama_vocab_n_tokens(llama_model_get_vocab(m));

    common_batch bt(tgt);
    for (int i = 0; i < n; i++) bt.add(toks[i], i, 0, true);
    if (llama_process(tgt, LLAMA_PROCESS_TYPE_DECODE, bt.get()) != 0) return 1;
    std::vector<float> h((size_t)n * E), zero(E, 0.0f);
    for (int i = 0; i < n; i++) memcpy(&h[(size_t)i * E], llama_get_embeddings_nextn_ith(tgt, i), E * sizeof(float));

    common_batch bd(dft);
    for (int i = 0; i < n; i++) {
        const int idx = bd.add(toks[i], i, 0, true);
        bd.set_embd(idx, {i ? &h[(size_t)(i - 1) * E] : zero.data(), 1, (size_t)E});
    }
    if (llama_process(dft, LLAMA_PROCESS_TYPE_DECODE, bd.get()) != 0) return 1;
    FILE *f = fopen(argv[2], "wb");
    for (int i = 0; i < n; i++) fwrite(llama_get_logits_ith(dft, i), sizeof(float), V, f);
    fclose(f);

    std::vector<float> hp(h.end() - E, h.end());
    llama_token t = pending;
    for (int s = 0; s < k; s++) {
        bd.clear();
        const int idx = bd.add(t, n + s, 0, true);
        bd.set_embd(idx, {hp.data(), 1, (size_t)E});
        if (llama_process(dft, LLAMA_PROCESS_TYPE_DECODE, bd.get()) != 0) return 1;
        t = argmax(llama_get_logits_ith(dft, 0), V);
        memcpy(hp.data(), llama_get_embeddings_nextn_ith(dft, 0), E * sizeof(float));
        printf("%s%d", s ? "," : "", t);
    }
    printf("\n");
    llama_free(dft);
    llama_free(tgt);
    llama_model_free(m);
    return 0;
}
