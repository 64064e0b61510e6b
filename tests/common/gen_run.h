/* Shared by the tests that run whole generations through gen_begin
 * (tests/engine/test_drafts.c, test_mtp.c, tests/cuda/test_cuda_hybrid.c):
 * a fresh sequence after a prompt, the token collector, the loop that
 * generates to the end (one token a step, or with drafts), and the
 * server-like loop of several sequences drafting in shared batched steps.
 * Header-only: each test is one executable. */
#ifndef STRATA_TESTS_COMMON_GEN_RUN_H
#define STRATA_TESTS_COMMON_GEN_RUN_H

#include <stddef.h>
#include <stdint.h>

#include "core/log.h"
#include "engine/engine.h"

/* The tokens a generation chose (the gen_hooks token callback's ctx). */
typedef struct {
    int32_t *t;
    int n, cap;
} gen_tokens;

static inline int gen_tokens_on_token(void *ctx, int32_t t, const float *raw) {
    (void)raw;
    gen_tokens *c = ctx;
    ST_ASSERT(c->n < c->cap);
    c->t[c->n++] = t;
    return GEN_GO;
}

static inline int gen_ignore_text(void *ctx, const char *text, size_t len) {
    (void)ctx, (void)text, (void)len;
    return 0;
}

/* A new sequence of e after prompt[0..n). */
static inline engine_seq *gen_read_new(engine *e, const int32_t *prompt, int n) {
    engine_seq *s = engine_seq_new(e);
    ST_ASSERT(engine_seq_read_prompt(e, s, prompt, n) == 0);
    return s;
}

/* After gen_begin on sequence s: every token to the end, one a step as
 * engine_generate decodes (draft_n 0) or with drafts of up to draft_n. */
static inline void gen_run_to_end(engine *e, engine_seq *s, gen_state *g, int draft_n) {
    int32_t t;
    if (gen_next(g, &t) != 0) return;
    if (draft_n > 0)
        while (gen_next_drafted(g, &t, draft_n) == 0) {
        }
    else
        while (engine_seq_eval(e, s, &t, 1) == 0 && gen_next(g, &t) == 0) {
        }
}

/* n_seq generations drafting in shared steps, as the server's scheduler
 * runs its slots: each live one drafts up to draft_n after next[i]
 * (gen_draft), one engine_step_drafts for all, gen_verify each; until none
 * is live. toks: n_seq * (draft_n + 1) rows of scratch, ntok: n_seq. */
static inline void gen_drafted_steps(engine *e, engine_seq *const *seq, gen_state *const *g, int32_t *next, int *live,
                                     int n_seq, int draft_n, int32_t *toks, int *ntok) {
    enum { MOST = 16 };
    ST_ASSERT(n_seq <= MOST);
    engine_seq *step_seq[MOST];
    int map[MOST];
    for (;;) {
        int n = 0, rows = 0;
        for (int i = 0; i < n_seq; i++) {
            if (!live[i]) continue;
            step_seq[n] = seq[i];
            map[n] = i;
            ntok[n] = gen_draft(g[i], next[i], draft_n, toks + rows);
            rows += ntok[n++];
        }
        if (!n) return;
        const float *logits;
        ST_ASSERT(engine_step_drafts(e, NULL, 0, step_seq, toks, ntok, n, &logits) == 0);
        for (int k = 0, r = 0; k < n; r += ntok[k], k++) {
            const int i = map[k];
            live[i] = gen_verify(g[i], &next[i], toks + r, ntok[k], logits + (size_t)r * e->m->hp.n_vocab) == 0;
        }
    }
}

#endif
