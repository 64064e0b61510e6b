/* Shared by the model-family tests (tests/engine/test_glm4moe.c,
 * test_deepseek2.c, test_gpt_oss.c): a fresh sequence's logits, the
 * largest difference of two logit rows, and the check every MoE family
 * makes that the expert lanes (the MoE seam) give the plain engine's
 * logits. Header-only: each test is one executable; include after
 * check.h. */
#ifndef STRATA_TESTS_COMMON_FAMILY_H
#define STRATA_TESTS_COMMON_FAMILY_H

#include <math.h>
#include <string.h>

#include "core/log.h"
#include "engine/engine.h"
#include "engine/moe_lanes.h"
#include "model/synth.h"

static inline double family_maxdiff(const float *a, const float *b, int n) {
    double m = 0;
    for (int i = 0; i < n; i++) m = fmax(m, fabs((double)a[i] - b[i]));
    return m;
}

/* Writes arch's tiny synth preset to path (type_default: a qt_type for
 * every matrix, or -1: the preset's own types) and the engine parameters the
 * family tests open it with: 64 positions, 2 threads, chunks of 8. */
static inline engine_params family_tiny(const char *arch, int type_default, const char *path) {
    synth_hparams hp;
    ST_ASSERT(synth_preset(arch, "tiny", &hp) == 0);
    synth_opts o;
    synth_opts_init(&o, &hp);
    if (type_default >= 0) o.type_default = type_default;
    ST_ASSERT(synth_write(&o, path) == 0);
    engine_params p = engine_defaults();
    p.model_path = path;
    p.n_ctx = 64;
    p.n_threads = 2;
    p.n_ubatch = 8;
    return p;
}

/* The logits after prompt[0..n) in a new sequence of e, into out (n_vocab). */
static inline void family_fresh(engine *e, const int32_t *prompt, int n, float *out) {
    engine_seq *s = engine_seq_new(e);
    ST_ASSERT(engine_seq_read_prompt(e, s, prompt, n) == 0);
    memcpy(out, s->logits, (size_t)e->m->hp.n_vocab * sizeof(float));
    engine_seq_free(e, s);
}

/* The same prompt with the experts split between a cache of n_cache slots
 * and the CPU lane, then the PCIe lane (p as the plain engine was opened):
 * each within tol of want, and each lane computed pairs. */
static inline void family_check_lanes(engine_params p, const int32_t *prompt, int n, const float *want, int nv,
                                      long n_cache, double tol) {
    p.expert_cache = n_cache;
    for (int lane = 0; lane < 2; lane++) {
        p.pcie_frac = lane;
        engine *el = engine_open(&p);
        CHECK(el && el->lanes, "lanes engine: %s", el ? "no lanes" : st_error_get());
        if (!el) continue;
        ST_ASSERT(engine_read_prompt(el, prompt, n) == 0);
        CHECK(family_maxdiff(el->logits, want, nv) < tol, "expert lanes (pcie_frac %d) %.3g from plain", lane,
              family_maxdiff(el->logits, want, nv));
        const moe_lane_stats *st = moe_lanes_stats(el->be);
        CHECK(st && st->pairs_dev > 0 && (lane ? st->pairs_pcie : st->pairs_cpu) > 0,
              "pcie_frac %d: pairs %llu cached, %llu CPU, %llu PCIe", lane,
              st ? (unsigned long long)st->pairs_dev : 0ull, st ? (unsigned long long)st->pairs_cpu : 0ull,
              st ? (unsigned long long)st->pairs_pcie : 0ull);
        engine_close(el);
    }
}

#endif
