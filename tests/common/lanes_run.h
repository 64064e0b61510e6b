/* Shared by the expert-lane tests (tests/engine/test_lanes.c, test_tiers.c):
 * the small MoE file both run, and one run of the engine over a file: a
 * fixed prompt, then greedy decode, keeping the logits of every step and
 * the lanes' counters, which the tests then compare between placements.
 * Header-only: each test is one executable; include after check.h. */
#ifndef STRATA_TESTS_COMMON_LANES_RUN_H
#define STRATA_TESTS_COMMON_LANES_RUN_H

#include <stdio.h>
#include <string.h>

#include "core/alloc.h"
#include "core/log.h"
#include "engine/engine.h"
#include "engine/moe_lanes.h"
#include "model/synth.h"

#define LANES_MAX_GEN 32

typedef struct {
    float *logits;              /* [n_gen + 1][n_vocab]: after the prompt, then after each token (st_free it) */
    int32_t tok[LANES_MAX_GEN]; /* the greedy tokens */
    moe_lane_stats stats;       /* the lanes' counters; zero when the engine ran without lanes */
    int lanes;                  /* the engine ran the expert lanes */
    int n_layer, n_expert;
} lanes_run_out;

/* Writes the tests' MoE file to path: the qwen3moe tiny synth cut to 3
 * layers of 16 experts, top-4, routed by a Zipf law (s = 1) so that some
 * experts are hot. 0, or -1 with the error printed; *hp gets its shape. */
static inline int lanes_tiny(const char *path, synth_hparams *hp) {
    ST_ASSERT(synth_preset("qwen3moe", "tiny", hp) == 0);
    hp->n_layer = 3;
    hp->n_expert = 16;
    hp->n_expert_used = 4;
    synth_opts o;
    synth_opts_init(&o, hp);
    o.zipf_s = 1.0;
    if (synth_write(&o, path) != 0) {
        printf("synth: %s\n", st_error_get());
        return -1;
    }
    return 0;
}

/* Opens an engine with p, reads a prompt of n_prompt fixed tokens, then
 * decodes n_gen tokens greedily. n_vocab, or -1 (printed) when the engine
 * does not open. */
static inline int lanes_run(const engine_params *p, int n_prompt, int n_gen, lanes_run_out *o) {
    ST_ASSERT(n_gen <= LANES_MAX_GEN && n_prompt <= 64);
    engine *e = engine_open(p);
    if (!e) {
        printf("engine_open: %s\n", st_error_get());
        return -1;
    }
    const int nv = e->m->hp.n_vocab;
    int32_t prompt[64];
    for (int i = 0; i < n_prompt; i++) prompt[i] = (int32_t)((i * 7919 + 13) % nv);
    o->logits = st_malloc((size_t)(n_gen + 1) * nv * sizeof(float));
    ST_ASSERT(engine_read_prompt(e, prompt, n_prompt) == 0);
    memcpy(o->logits, e->logits, (size_t)nv * sizeof(float));
    for (int t = 0; t < n_gen; t++) {
        const float *l = o->logits + (size_t)t * nv;
        int best = 0;
        for (int i = 1; i < nv; i++)
            if (l[i] > l[best]) best = i;
        o->tok[t] = best;
        ST_ASSERT(engine_eval(e, &o->tok[t], 1) == 0);
        memcpy(o->logits + (size_t)(t + 1) * nv, e->logits, (size_t)nv * sizeof(float));
    }
    const moe_lane_stats *s = moe_lanes_stats(e->be);
    o->stats = s ? *s : (moe_lane_stats){0};
    o->lanes = s != NULL;
    o->n_layer = e->m->hp.n_layer;
    o->n_expert = e->m->hp.n_expert;
    engine_close(e);
    return nv;
}

#endif
