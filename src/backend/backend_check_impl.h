/* What the op checks share (backend_check.c, backend_check_hybrid.c): the
 * two backends and the report callback, a seeded generator of Gaussian
 * inputs, buffers copied to a backend (or NaN-poisoned, so that an op must
 * write every value it owns), NMSE against the reference, and the device
 * under test's variants. Internal to backend/.
 */
#ifndef STRATA_BACKEND_BACKEND_CHECK_IMPL_H
#define STRATA_BACKEND_BACKEND_CHECK_IMPL_H

#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "backend/backend_check.h"
#include "core/alloc.h"
#include "quant/quant.h"

typedef struct {
    st_backend *ref, *dut;
    uint64_t rng;
    bcheck_report_fn fn;
    void *ctx;
    int fails;
} chk;

static inline uint64_t next_u64(chk *c) { /* splitmix64 */
    uint64_t z = (c->rng += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static inline float uniform(chk *c) { return (float)((next_u64(c) >> 40) + 0.5) / 16777216.0f; }

static inline float gauss(chk *c) {
    float u = uniform(c), v = uniform(c);
    return sqrtf(-2.0f * logf(u)) * cosf(6.2831853f * v);
}

static inline float *rand_host(chk *c, size_t n, float sd) {
    float *h = st_malloc(n * sizeof(float));
    for (size_t i = 0; i < n; i++) h[i] = gauss(c) * sd;
    return h;
}

/* A buffer on a backend holding a copy of host data (or NaN-poisoned when h is NULL). */
static inline void *put(st_backend *be, const void *h, size_t bytes) {
    void *p = be->alloc(be, bytes);
    if (h) {
        be->to_device(be, p, h, bytes);
    } else {
        void *nan = st_malloc(bytes);
        memset(nan, 0xff, bytes); /* all-ones floats are NaN */
        be->to_device(be, p, nan, bytes);
        st_free(nan);
    }
    return p;
}

static inline float *get(st_backend *be, const void *p, size_t n) {
    float *h = st_malloc(n * sizeof(float));
    be->to_host(be, h, p, n * sizeof(float));
    return h;
}

static inline double nmse(const float *out, const float *ref, size_t n) {
    double num = 0, den = 0;
    for (size_t i = 0; i < n; i++) {
        if (!isfinite(out[i]) || !isfinite(ref[i])) return INFINITY;
        double d = (double)out[i] - ref[i];
        num += d * d;
        den += (double)ref[i] * ref[i];
    }
    return den > 0 ? num / den : num;
}

static inline double now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

/* Sets the device under test's variant kind to v (backend.h st_variant);
 * returns the one before, or -1 where it has no such choice (then nothing
 * changed). */
static inline int set_variant(chk *c, st_variant kind, int v) {
    return c->dut->variant ? c->dut->variant(c->dut, kind, v) : -1;
}

/* The same for the reference. */
static inline int set_ref_variant(chk *c, st_variant kind, int v) {
    return c->ref->variant ? c->ref->variant(c->ref, kind, v) : -1;
}

static inline void report(chk *c, const char *op, double e, double bound, double ms, const char *fmt, ...)
    __attribute__((format(printf, 6, 7)));
static inline void report(chk *c, const char *op, double e, double bound, double ms, const char *fmt, ...) {
    bcheck_result r = {op, "", e, bound, ms, e <= bound};
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(r.what, sizeof r.what, fmt, ap);
    va_end(ap);
    if (!r.pass) c->fails++;
    if (c->fn) c->fn(c->ctx, &r);
}

/* Compare dut buffer d against ref buffer r, n floats. */
static inline double cmp_bufs(chk *c, const void *r, const void *d, size_t n) {
    float *a = get(c->ref, r, n), *b = get(c->dut, d, n);
    double e = nmse(b, a, n);
    st_free(a);
    st_free(b);
    return e;
}

/* A weight of n_mat matrices on both backends, quantized from Gaussians. */
typedef struct {
    st_weight r, d;
    void *rp, *dp;
} wpair;

static inline wpair make_weight_sd(chk *c, qt_type t, int64_t n_in, int64_t n_out, int64_t n_mat, float sd) {
    size_t rb = qt_row_size(t, n_in), bytes = rb * (size_t)(n_out * n_mat);
    float *f = rand_host(c, (size_t)(n_in * n_out * n_mat), sd);
    void *q = st_malloc(bytes);
    for (int64_t r = 0; r < n_out * n_mat; r++) qt_quantize(t, f + r * n_in, (uint8_t *)q + (size_t)r * rb, n_in);
    wpair w;
    w.rp = put(c->ref, q, bytes);
    w.dp = put(c->dut, q, bytes);
    st_weight base = {NULL, NULL, t, n_in, n_out, n_mat, rb, NULL};
    w.r = base;
    w.d = base;
    w.r.data = w.rp;
    w.d.data = w.dp;
    st_free(f);
    st_free(q);
    return w;
}

static inline wpair make_weight(chk *c, qt_type t, int64_t n_in, int64_t n_out, int64_t n_mat) {
    return make_weight_sd(c, t, n_in, n_out, n_mat, 0.5f);
}

/* Biases for w (st_weight.bias, n_mat rows of n_out, Gaussian of sd) on
 * both backends; bufs[0], bufs[1]: the ref's and the dut's, to free. */
static inline void give_bias(chk *c, wpair *w, float sd, void **bufs) {
    const size_t n = (size_t)w->r.n_mat * (size_t)w->r.n_out;
    float *b = rand_host(c, n, sd);
    bufs[0] = put(c->ref, b, n * 4), bufs[1] = put(c->dut, b, n * 4);
    w->r.bias = bufs[0], w->d.bias = bufs[1];
    st_free(b);
}

static inline void free_weight(chk *c, wpair *w) {
    c->ref->free(c->ref, w->rp);
    c->dut->free(c->dut, w->dp);
}

static inline st_kv_layer make_kv(st_backend *be, st_kv_type t, int n_ctx, int hkv, int hd) {
    st_kv_layer kv = {.type = t, .n_ctx = n_ctx, .n_head_kv = hkv, .head_dim = hd};
    size_t elems = (size_t)n_ctx * hkv * hd, es = t == ST_KV_F16 ? 2 : 1;
    kv.k = put(be, NULL, elems * es);
    kv.v = put(be, NULL, elems * es);
    if (t == ST_KV_INT8) {
        kv.k_scale = put(be, NULL, (size_t)n_ctx * hkv * 4);
        kv.v_scale = put(be, NULL, (size_t)n_ctx * hkv * 4);
    }
    return kv;
}

static inline void free_kv(st_backend *be, st_kv_layer *kv) {
    void *p[] = {kv->k, kv->v, kv->k_scale, kv->v_scale};
    for (int i = 0; i < 4; i++)
        if (p[i]) be->free(be, p[i]);
}

/* n_tok rows of k and v (f32, this backend's) into the cache at positions
 * pos0..: the engine's qkv_prep with no head norms and no rotation (a
 * position scale of 0 turns every pair by exactly 0), so the rows go in as
 * given. q: scratch of n_tok x head_dim. */
static inline void kv_fill(st_backend *be, st_kv_layer *kv, float *q, float *k, const float *v, int n_tok, int pos0) {
    const st_rope none = {10000.0f, 0.0f, 0, NULL, 0};
    be->qkv_prep(be, q, k, v, NULL, NULL, 1e-6f, n_tok, 1, &none, kv, pos0);
}

/* Stored caches compared as dequantized values (f16 must be bit-equal; an
 * int8 value may differ by one step where x*127/amax lands on a tie). */
static inline double kv_diff(chk *c, const st_kv_layer *r, const st_kv_layer *d, int npos, int which) {
    size_t row = (size_t)r->n_head_kv * r->head_dim, n = row * npos;
    size_t es = r->type == ST_KV_F16 ? 2 : 1;
    uint8_t *a = st_malloc(n * es), *b = st_malloc(n * es);
    float *fa = st_malloc(n * 4), *fb = st_malloc(n * 4);
    c->ref->to_host(c->ref, a, which ? r->v : r->k, n * es);
    c->dut->to_host(c->dut, b, which ? d->v : d->k, n * es);
    float *sa = NULL, *sb = NULL;
    if (r->type == ST_KV_INT8) {
        sa = get(c->ref, which ? r->v_scale : r->k_scale, (size_t)npos * r->n_head_kv);
        sb = get(c->dut, which ? d->v_scale : d->k_scale, (size_t)npos * r->n_head_kv);
    }
    for (size_t i = 0; i < n; i++) {
        if (r->type == ST_KV_F16) {
            uint16_t x, y;
            memcpy(&x, a + 2 * i, 2);
            memcpy(&y, b + 2 * i, 2);
            fa[i] = (float)x; /* bit patterns: equal or not */
            fb[i] = (float)y;
        } else {
            size_t s = i / r->head_dim;
            fa[i] = sa[s] * (float)(int8_t)a[i];
            fb[i] = sb[s] * (float)(int8_t)b[i];
        }
    }
    double e = nmse(fb, fa, n);
    st_free(a), st_free(b), st_free(fa), st_free(fb), st_free(sa), st_free(sb);
    return e;
}

/* The families' checks (backend_check_family.c), which backend_check_ops runs:
 * gpt-oss's (sinks' kernels are checked with attention's), and glm4moe's and
 * deepseek2's. */
void check_oai_family(chk *c, int size);
/* Attention (and attention_sinks when sinks) over a cache of n_ctx
 * positions, every kernel variant of the device under test
 * (backend_check.c). */
void check_attention_x(chk *c, st_kv_type t, int n_ctx, int n_head, int hkv, int hd, int n_prompt, int sinks,
                       float vmag);
void check_mla_family(chk *c, int size);

#endif
