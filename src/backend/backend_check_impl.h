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

#endif
