/* Shared by the model-family tests (tests/engine/test_glm4moe.c,
 * test_deepseek2.c, test_gpt_oss.c): a fresh sequence's logits, the
 * largest difference of two logit rows, the checks every MoE family makes
 * (a batched step against fresh sequences; the expert lanes, the MoE seam,
 * against the plain engine) and the tensor list's bytes. Header-only: each
 * test is one executable; include after check.h. */
#ifndef STRATA_TESTS_COMMON_FAMILY_H
#define STRATA_TESTS_COMMON_FAMILY_H

#include <math.h>
#include <string.h>

#include "core/log.h"
#include "engine/engine.h"
#include "engine/engine_place.h"
#include "engine/moe_lanes.h"
#include "gguf/gguf.h"
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

/* Two prompts of n tokens spread over the vocabulary (a, b: n + 1 room). */
static inline void family_prompts(int nv, int n, int32_t *a, int32_t *b) {
    for (int i = 0; i < n; i++) {
        a[i] = (int32_t)((i * 7919 + 13) % nv);
        b[i] = (int32_t)((i * 104729 + 5) % nv);
    }
}

/* One batched decode step of two sequences (prompts a and b of n tokens,
 * next tokens 5 and 6, written to a[n] and b[n]) against each sequence read
 * fresh: within tol. want: n_vocab floats of scratch. */
static inline void family_check_batched(engine *e, int32_t *a, int32_t *b, int n, float *want, double tol) {
    const int nv = e->m->hp.n_vocab;
    engine_seq *s1 = engine_seq_new(e), *s2 = engine_seq_new(e);
    ST_ASSERT(engine_seq_read_prompt(e, s1, a, n) == 0);
    ST_ASSERT(engine_seq_read_prompt(e, s2, b, n) == 0);
    engine_seq *pair[2] = {s1, s2};
    const int32_t next[2] = {5, 6};
    ST_ASSERT(engine_decode_batch(e, pair, next, 2) == 0);
    a[n] = next[0];
    b[n] = next[1];
    for (int q = 0; q < 2; q++) {
        family_fresh(e, q ? b : a, n + 1, want);
        CHECK(family_maxdiff(pair[q]->logits, want, nv) < tol, "batched step, sequence %d: %.3g from fresh", q,
              family_maxdiff(pair[q]->logits, want, nv));
    }
    engine_seq_free(e, s2);
    engine_seq_free(e, s1);
}

/* The bytes of the file's tensors; *dense and *routed: the engine's tensor list's. */
static inline size_t family_file_bytes(const engine *e, size_t *dense, size_t *routed) {
    size_t file = 0;
    *dense = engine_weight_bytes(e->m, routed);
    for (int64_t i = 0; i < gguf_n_tensors(e->m->file); i++) file += gguf_tensor_at(e->m->file, i)->size;
    return file;
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
