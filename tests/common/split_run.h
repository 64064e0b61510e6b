/* Shared by the layer split's tests (tests/engine/test_split_local.c,
 * tests/cuda/test_cuda_split.c): three prompts, then greedy tokens, one
 * sequence at a time and then the three in batched steps, every step's
 * logits kept, so that a split run and a whole-model run can be compared
 * row by row. Header-only: each test is one executable. */
#ifndef STRATA_TESTS_COMMON_SPLIT_RUN_H
#define STRATA_TESTS_COMMON_SPLIT_RUN_H

#include <string.h>

#include "core/log.h"
#include "engine/engine.h"

#include "logits.h"

#define N_GEN 12
#define N_SEQ 3

static const char *const SPLIT_PROMPTS[N_SEQ] = {
    "The capital of France is",
    "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n",
    "Once upon a time, in a small village by the sea, there lived",
};

/* Greedy tokens of every prompt, one sequence at a time, then the three
 * batched: each step's logits into out ([2][N_SEQ][N_GEN + 1][n_vocab]). */
static inline void split_run(engine *e, float *out) {
    const int nv = e->m->hp.n_vocab;
    for (int pass = 0; pass < 2; pass++) {
        engine_seq *s[N_SEQ];
        int32_t tok[N_SEQ];
        for (int q = 0; q < N_SEQ; q++) {
            s[q] = engine_seq_new(e);
            int32_t ids[256];
            const char *p = SPLIT_PROMPTS[q];
            const int n = (int)tokenizer_encode(e->tok, p, strlen(p), 1, 0, ids, 256);
            ST_ASSERT(n > 0 && engine_seq_eval(e, s[q], ids, n) == 0);
            memcpy(out + ((size_t)(pass * N_SEQ + q) * (N_GEN + 1)) * nv, s[q]->logits, (size_t)nv * sizeof(float));
            tok[q] = logits_argmax(s[q]->logits, nv, NULL);
        }
        for (int i = 1; i <= N_GEN; i++) {
            if (pass == 0)
                for (int q = 0; q < N_SEQ; q++) ST_ASSERT(engine_seq_eval(e, s[q], &tok[q], 1) == 0);
            else ST_ASSERT(engine_decode_batch(e, s, tok, N_SEQ) == 0);
            for (int q = 0; q < N_SEQ; q++) {
                memcpy(out + ((size_t)(pass * N_SEQ + q) * (N_GEN + 1) + i) * nv, s[q]->logits,
                       (size_t)nv * sizeof(float));
                tok[q] = logits_argmax(s[q]->logits, nv, NULL);
            }
        }
        for (int q = 0; q < N_SEQ; q++) engine_seq_free(e, s[q]);
    }
}

#endif
