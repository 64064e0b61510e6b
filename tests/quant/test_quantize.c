/* Tests of the reference quantizers (quant_quantize*.c) through the public
 * qt_quantize()/qt_dequantize() pair.
 *
 * For every weight format: quantize rows of Gaussian weights, a Gaussian row
 * with a few large outliers, a row of zeros and constant rows, decode them with
 * the reference dequantizers (which are themselves checked against the gguf
 * package), and require
 *   - NMSE = sum((x-y)^2) / sum(x^2) under the format's stated bound
 *     (bounds sit a little above the measured values, docs/quant-accuracy.md),
 *   - exact zeros for a zero row, and no NaN/Inf ever,
 *   - for the formats whose method guarantees it, idempotence:
 *     quantize(dequantize(quantize(x))) has the same bytes as quantize(x).
 * It also prints the speed of the quantizers that `strata synth` relies on.
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "quant/quant.h"

typedef struct {
    qt_type t;
    double gauss_bound;   /* NMSE bound on Gaussian rows */
    double outlier_bound; /* NMSE bound on the row with outliers */
    double const_bound;   /* NMSE bound on constant rows */
    int idempotent;       /* method guarantees Q(D(Q(x))) == Q(x) */
} fmt_case;

/* Bounds: see docs/quant-accuracy.md for the measured values they sit above. */
static const fmt_case CASES[] = {
    {QT_F32, 0.0, 0.0, 0.0, 1},
    {QT_F16, 1e-6, 1e-6, 1e-6, 1},
    {QT_BF16, 2e-5, 2e-5, 2e-5, 1},
    {QT_Q4_0, 1.2e-2, 6e-2, 1e-5, 1},
    {QT_Q4_1, 1e-2, 6e-2, 1e-5, 1},
    {QT_Q5_0, 3e-3, 1.5e-2, 1e-5, 1},
    {QT_Q5_1, 2.5e-3, 1.5e-2, 1e-5, 1},
    {QT_Q8_0, 1e-4, 3e-4, 1e-5, 1},
    {QT_Q8_1, 1e-4, 3e-4, 1e-5, 0}, /* s = d*sum(q) uses the unrounded d: not a fixed point */
    {QT_Q2_K, 1.2e-1, 2e-1, 1e-5, 0},
    {QT_Q3_K, 4e-2, 1e-1, 1e-5, 0},
    {QT_Q4_K, 1e-2, 3e-2, 1e-5, 0},
    {QT_Q5_K, 3e-3, 1e-2, 1e-5, 0},
    {QT_Q6_K, 1e-3, 3e-3, 1e-5, 0},
    {QT_Q8_K, 1e-4, 3e-3, 1e-5, 0},
    {QT_MXFP4, 5e-2, 2e-1, 5e-3, 0}, /* 0.37 is not an E2M1 value */
    {QT_IQ4_NL, 8e-3, 2e-2, 1e-5, 0},
    {QT_IQ4_XS, 8e-3, 2e-2, 1e-5, 0},
    {QT_IQ3_S, 2.5e-2, 1.2e-1, 1e-5, 0},
    {QT_IQ3_XXS, 4.5e-2, 1.2e-1, 1e-5, 0},
    {QT_IQ2_S, 8e-2, 3e-1, 1e-5, 0},
    {QT_IQ2_XS, 1e-1, 3e-1, 1e-5, 0},
    {QT_IQ2_XXS, 1.4e-1, 4.5e-1, 1e-5, 0},
    {QT_IQ1_M, 2.3e-1, 2.5e-1, 1e-5, 0},
    {QT_IQ1_S, 2.7e-1, 4e-1, 1e-5, 0},
};

/* ---- deterministic Gaussian source (xorshift64* + Box-Muller) ---- */
static uint64_t rng_state = 0x9e3779b97f4a7c15ULL;
static double rng_uniform(void) {
    rng_state ^= rng_state >> 12;
    rng_state ^= rng_state << 25;
    rng_state ^= rng_state >> 27;
    return (double)((rng_state * 0x2545f4914f6cdd1dULL) >> 11) * (1.0 / 9007199254740992.0);
}
static float rng_gauss(void) {
    double u1 = rng_uniform(), u2 = rng_uniform();
    if (u1 < 1e-300) u1 = 1e-300;
    return (float)(sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2));
}

#define ROW    4096 /* weights per row: a multiple of every block size */
#define NGAUSS 16   /* Gaussian rows */

static int failures = 0;

static void check(int ok, const char *what, const char *fmt_name, double val, double bound) {
    if (!ok) {
        failures++;
        printf("FAIL %-8s %s: %.3g (bound %.3g)\n", fmt_name, what, val, bound);
    }
}

/* Quantize + dequantize one row; returns NMSE (or -1 on a non-finite output). */
static double roundtrip(qt_type t, const float *x, void *q, float *y) {
    qt_quantize(t, x, q, ROW);
    qt_dequantize(t, q, y, ROW);
    double num = 0.0, den = 0.0;
    for (int i = 0; i < ROW; i++) {
        if (!isfinite(y[i])) return -1.0;
        double e = (double)x[i] - (double)y[i];
        num += e * e;
        den += (double)x[i] * (double)x[i];
    }
    return den > 0.0 ? num / den : num;
}

static void test_format(const fmt_case *c, const float *gauss, const float *outl) {
    const qt_traits *tr = qt_get(c->t);
    if (tr == NULL || tr->quantize == NULL) {
        failures++;
        printf("FAIL type %d has no quantizer in the table\n", (int)c->t);
        return;
    }
    const size_t rs = qt_row_size(c->t, ROW);
    uint8_t *q = malloc(rs), *q2 = malloc(rs);
    float *y = malloc(ROW * sizeof(float));

    /* Gaussian rows: pooled NMSE over all rows, and the worst row */
    double num = 0.0, den = 0.0, worst = 0.0;
    int nonfinite = 0, idem_bad = 0;
    /* the lattice i-quants search their grids by brute force (slow): fewer rows */
    const int lattice = tr->name[0] == 'I' && tr->name[2] != '4';
    const int nrows = lattice ? NGAUSS / 4 : NGAUSS;
    for (int r = 0; r < nrows; r++) {
        const float *x = gauss + (size_t)r * ROW;
        double e = roundtrip(c->t, x, q, y);
        if (e < 0) {
            nonfinite++;
            continue;
        }
        double ss = 0.0;
        for (int i = 0; i < ROW; i++) ss += (double)x[i] * x[i];
        num += e * ss;
        den += ss;
        worst = e > worst ? e : worst;
        /* measured for every format, asserted only where the method guarantees it */
        qt_quantize(c->t, y, q2, ROW);
        if (memcmp(q, q2, rs) != 0) idem_bad++;
    }
    const double gauss_nmse = num / den;
    check(nonfinite == 0, "non-finite output on Gaussian rows", tr->name, nonfinite, 0);
    check(worst <= c->gauss_bound, "Gaussian NMSE (worst row)", tr->name, worst, c->gauss_bound);
    if (c->idempotent) check(idem_bad == 0, "Q(D(Q(x))) != Q(x) rows", tr->name, idem_bad, 0);

    double eo = roundtrip(c->t, outl, q, y);
    check(eo >= 0 && eo <= c->outlier_bound, "outlier-row NMSE", tr->name, eo, c->outlier_bound);

    /* zeros decode to exact zeros */
    float *z = calloc(ROW, sizeof(float));
    roundtrip(c->t, z, q, y);
    int zbad = 0;
    for (int i = 0; i < ROW; i++) zbad += (y[i] != 0.0f);
    check(zbad == 0, "zero row: non-zero outputs", tr->name, zbad, 0);

    /* constant rows, both signs */
    double ec = 0.0;
    const float consts[2] = {0.37f, -1.9f};
    for (int k = 0; k < 2; k++) {
        for (int i = 0; i < ROW; i++) z[i] = consts[k];
        double e = roundtrip(c->t, z, q, y);
        if (e < 0) e = INFINITY;
        ec = e > ec ? e : ec;
    }
    check(ec <= c->const_bound, "constant-row NMSE", tr->name, ec, c->const_bound);

    printf("%-8s %6.3f bpw  gauss NMSE %.3e (worst row %.3e, bound %.1e)  outliers %.3e  const %.2e  "
           "Q(D(Q)) same bytes %d/%d rows%s\n",
           tr->name, 8.0 * (double)tr->type_size / tr->blck, gauss_nmse, worst, c->gauss_bound, eo, ec,
           nrows - idem_bad, nrows, c->idempotent ? " (asserted)" : "");
    free(z);
    free(q);
    free(q2);
    free(y);
}

/* Weights per CPU-second of one format, single thread, over ~0.2 s. */
static double speed(qt_type t, const float *x, size_t nrows) {
    uint8_t *q = malloc(qt_row_size(t, ROW) * nrows);
    /* thread CPU time: the test machine is shared, wall time would measure the neighbours */
    struct timespec a, b;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &a);
    double el = 0.0;
    size_t done = 0;
    do {
        for (size_t r = 0; r < nrows; r++) qt_quantize(t, x + r * ROW, q + r * qt_row_size(t, ROW), ROW);
        done += nrows * ROW;
        clock_gettime(CLOCK_THREAD_CPUTIME_ID, &b);
        el = (double)(b.tv_sec - a.tv_sec) + 1e-9 * (double)(b.tv_nsec - a.tv_nsec);
    } while (el < 0.2);
    free(q);
    return (double)done / el;
}

int main(void) {
    float *gauss = malloc((size_t)NGAUSS * ROW * sizeof(float));
    for (size_t i = 0; i < (size_t)NGAUSS * ROW; i++) gauss[i] = rng_gauss();
    /* outliers: a Gaussian row where 1 weight in 256 is 30x larger */
    float *outl = malloc(ROW * sizeof(float));
    for (int i = 0; i < ROW; i++) outl[i] = rng_gauss() * ((i % 256) == 77 ? 30.0f : 1.0f);

    const int ncases = (int)(sizeof(CASES) / sizeof(CASES[0]));
    for (int k = 0; k < ncases; k++) test_format(&CASES[k], gauss, outl);

    /* strata synth quantizes multi-GB files with these: >= 20 M weights per
     * CPU-second each, asserted in optimized builds only (NDEBUG) */
    const qt_type fast[3] = {QT_Q8_0, QT_Q4_K, QT_Q6_K};
    for (int k = 0; k < 3; k++) {
        const double wps = speed(fast[k], gauss, NGAUSS);
        printf("speed %-5s %.1f M weights/s (one thread, CPU time)\n", qt_get(fast[k])->name, wps / 1e6);
#ifdef NDEBUG
        check(wps >= 20e6, "speed (weights per CPU-second)", qt_get(fast[k])->name, wps, 20e6);
#endif
    }

    free(gauss);
    free(outl);
    if (failures) {
        printf("test_quantize: %d failure(s)\n", failures);
        return 1;
    }
    printf("test_quantize: all %d formats OK\n", ncases);
    return 0;
}
