/* Tests of the multi-token gemm kernels (quant/quant_gemm.h) against the
 * single-row dot product (qt_vec_dot, itself tested against the double
 * reference by test_dot.c), on every ISA path this CPU runs.
 *
 * For every format with a gemm kernel, every ISA that has one, row lengths
 * that end in a partial group of units and span several chunks of 1024
 * weights (legacy: 1, 18 and 131 blocks; K/IQ4_XS: 1, 6 and 17 super-blocks),
 * row counts 1..9, 16, 17, 32 and 48 (full tiles, leftover rows, one and
 * several interleaved 16-row blocks), token counts 1..7, 9, 16 and
 * QT_GEMM_MAX_TOK (full and partial token tiles), a row stride with padding
 * and an output stride wider than the tile:
 *   weights = random valid blocks (qt_testutil.h), acts = Gaussian values
 *   (every other token with a large common mean: 4 + 0.5 N(0,1)) quantized
 *   with qt_quantize_act, scattered in memory (act[] pointers);
 *   each output must equal qt_vec_dot(t, same isa) on that (row, token) pair
 *   within 1e-6 * sum|w_i * a_i| (w, a dequantized by the reference).
 * Why not bitwise: the integer sum of each unit is exact in both kernels, but
 * the gemm kernels multiply each 32-weight unit by a float scale product
 * (d * sub-block scale * dy) where the dot multiplies the integer sum of a
 * super-block, and they add blocks in another order. Measured differences are
 * ~1e-7 of sum|w*a|; the bound leaves a 10x margin while still catching any
 * wrong unit (one unit off is ~1e-2 of the sum or more).
 * Also checked: outputs outside the tile are untouched; qt_gemm gives NULL
 * for the scalar ISA, for types without a kernel and for bad ids; the
 * fallback qt_gemm_by_dot equals the dot bit for bit.
 * The small-batch kernels (qt_gemm_small: 1-8 tokens, the same weights,
 * tokens and row counts, legacy rows also of 48 blocks, i.e. no tail) must
 * equal the dot BIT FOR BIT, and leave everything outside the tile alone.
 * Finally it prints the speed of each kernel vs the dot loop on rows held in
 * cache (one core), and the small kernels vs the gemm and the dot loop at
 * 1-16 tokens (--small-speed: that table alone); speed is reported, not
 * asserted.
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "qt_testutil.h"
#include "quant/quant.h"
#include "quant/quant_gemm.h"

#include "../common/check.h"

#define REL_BOUND 1e-6
#define MAX_ROWS  48
#define SENTINEL  -12345.0f

static void *xmalloc(size_t n) {
    void *p = malloc(n ? n : 1);
    if (!p) {
        fprintf(stderr, "out of memory\n");
        exit(2);
    }
    return p;
}

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static const qt_type FORMATS[] = {QT_Q4_0,   QT_Q4_1, QT_Q5_0, QT_Q5_1, QT_Q8_0,
                                  QT_IQ4_NL, QT_Q4_K, QT_Q5_K, QT_Q6_K, QT_IQ4_XS};
#define N_FORMATS (int)(sizeof FORMATS / sizeof FORMATS[0])

/* the most tokens any ISA's kernels take per call */
#define MAX_TOK QT_GEMM_AMX_MAX_TOK

/* One format, one ISA, one row length: returns the largest relative difference. */
static double check_case(qt_type t, qt_isa isa, int n, qtt_rng *rng, int *n_checked, int *n_small) {
    const qt_traits *tr = qt_get(t), *at = qt_get(tr->vec_dot_type);
    qt_gemm_fn gemm = qt_gemm(t, isa);
    qt_vec_dot_fn dot = qt_vec_dot(t, isa);
    const size_t row = qt_row_size(t, n), arow = qt_row_size(tr->vec_dot_type, n);
    const size_t stride = row + 3 * (size_t)tr->type_size; /* padded rows: the kernel must use w_stride */
    uint8_t *W = xmalloc(stride * MAX_ROWS);
    qtt_fill_blocks(t, W, (int64_t)(stride / (size_t)tr->type_size) * MAX_ROWS, rng);
    /* activations: MAX_TOK rows, each in its own allocation (act[] gathers) */
    void *A[MAX_TOK];
    float *x = xmalloc(sizeof(float) * (size_t)n);
    for (int c = 0; c < MAX_TOK; c++) {
        /* odd tokens: a large common mean (as after SiLU or in outlier channels);
         * an offset corrected in float instead of in int32 cancels badly there */
        for (int i = 0; i < n; i++) x[i] = (c & 1) ? 4.0f + 0.5f * qtt_gauss(rng) : qtt_gauss(rng);
        A[c] = xmalloc(arow);
        qt_quantize_act(tr->vec_dot_type, x, A[c], n);
    }
    /* sum|w*a| per pair, from reference dequantization */
    float *wd = xmalloc(sizeof(float) * (size_t)n), *ad = xmalloc(sizeof(float) * (size_t)n * MAX_TOK);
    for (int c = 0; c < MAX_TOK; c++) at->dequant(A[c], ad + (size_t)c * n, n);
    static double mag[MAX_ROWS][MAX_TOK];
    for (int r = 0; r < MAX_ROWS; r++) {
        tr->dequant(W + (size_t)r * stride, wd, n);
        for (int c = 0; c < MAX_TOK; c++) {
            double m = 0;
            for (int i = 0; i < n; i++) m += fabs((double)wd[i] * (double)ad[(size_t)c * n + i]);
            mag[r][c] = m;
        }
    }
    double worst = 0;
    static const int NRS[] = {1, 2, 3, 4, 5, 7, 8, 9, 16, 17, 32, 48};
    for (int in = 0; in < (int)(sizeof NRS / sizeof NRS[0]); in++) {
        int nr = NRS[in];
        /* past QT_GEMM_MAX_TOK only where the kernels take more (AMX) */
        static const int NCS[] = {1, 2, 3, 4, 5, 6, 7, 9, 16, QT_GEMM_MAX_TOK, 100, MAX_TOK};
        for (int ic = 0; ic < (int)(sizeof NCS / sizeof NCS[0]); ic++) {
            int nc = NCS[ic];
            if (nc > qt_gemm_max_tok(isa)) continue;
            /* a rotated token order, so act[c] is not always A[c] (nor in address order) */
            const void *act[MAX_TOK];
            int which[MAX_TOK];
            for (int c = 0; c < nc; c++) {
                which[c] = (c * 7 + nr) % MAX_TOK;
                act[c] = A[which[c]];
            }
            const size_t ldy = (size_t)nr + 5;
            static float y[MAX_TOK * (MAX_ROWS + 5)];
            for (size_t i = 0; i < sizeof y / sizeof y[0]; i++) y[i] = SENTINEL;
            gemm(n, nr, nc, W, stride, act, y, ldy);
            for (int c = 0; c < MAX_TOK; c++)
                for (size_t r = 0; r < ldy; r++) {
                    float v = y[(size_t)c * ldy + r];
                    if (c < nc && (int)r < nr) {
                        float ref;
                        dot(n, &ref, W + r * stride, act[c]);
                        double rel = fabs((double)v - (double)ref) / (mag[r][which[c]] > 0 ? mag[r][which[c]] : 1);
                        if (!(rel <= worst)) worst = rel; /* NaN also lands here */
                        (*n_checked)++;
                        CHECK(rel <= REL_BOUND, "%s %s n=%d nr=%d nc=%d row %zu tok %d: gemm %.9g dot %.9g rel %.3g",
                              tr->name, qt_isa_name(isa), n, nr, nc, r, c, v, ref, rel);
                    } else {
                        CHECK(v == SENTINEL, "%s %s n=%d nr=%d nc=%d: wrote outside the tile at tok %d row %zu",
                              tr->name, qt_isa_name(isa), n, nr, nc, c, r);
                    }
                }
        }
    }
    /* the small-batch kernel: every output bit for bit the dot's */
    qt_gemm_fn small = qt_gemm_small(t, isa);
    for (int in = 0; small && in < (int)(sizeof NRS / sizeof NRS[0]); in++) {
        const int nr = NRS[in];
        for (int nc = 1; nc <= QT_GEMM_SMALL_MAX_TOK; nc++) {
            const void *act[QT_GEMM_SMALL_MAX_TOK];
            for (int c = 0; c < nc; c++) act[c] = A[(c * 5 + nr) % MAX_TOK];
            const size_t ldy = (size_t)nr + 3;
            float y[QT_GEMM_SMALL_MAX_TOK * (MAX_ROWS + 3)];
            for (size_t i = 0; i < sizeof y / sizeof y[0]; i++) y[i] = SENTINEL;
            small(n, nr, nc, W, stride, act, y, ldy);
            for (int c = 0; c < QT_GEMM_SMALL_MAX_TOK; c++)
                for (size_t r = 0; r < ldy; r++) {
                    const float v = y[(size_t)c * ldy + r];
                    if (c < nc && (int)r < nr) {
                        float ref;
                        dot(n, &ref, W + r * stride, act[c]);
                        (*n_small)++;
                        CHECK(memcmp(&v, &ref, sizeof v) == 0,
                              "%s %s n=%d nr=%d nc=%d row %zu tok %d: small %.9g, dot %.9g (must be equal bit for bit)",
                              tr->name, qt_isa_name(isa), n, nr, nc, r, c, v, ref);
                    } else {
                        CHECK(v == SENTINEL, "%s %s n=%d nr=%d nc=%d: small kernel wrote outside at tok %d row %zu",
                              tr->name, qt_isa_name(isa), n, nr, nc, c, r);
                    }
                }
        }
    }
    for (int c = 0; c < MAX_TOK; c++) free(A[c]);
    free(W);
    free(x);
    free(wd);
    free(ad);
    return worst;
}

static void test_formats(qtt_rng *rng) {
    for (int isa = QT_ISA_AVX2; isa < QT_ISA_COUNT; isa++) {
        if (!qt_isa_supported((qt_isa)isa)) {
            printf("gemm: %s not run by this CPU: skipped\n", qt_isa_name((qt_isa)isa));
            continue;
        }
        for (int i = 0; i < N_FORMATS; i++) {
            qt_type t = FORMATS[i];
            const qt_traits *tr = qt_get(t);
            CHECK(qt_gemm(t, (qt_isa)isa) != NULL, "%s has no gemm kernel on %s", tr->name, qt_isa_name((qt_isa)isa));
            if (!qt_gemm(t, (qt_isa)isa)) continue;
            /* legacy: 48 blocks = whole groups of 8 only (the small kernel's tail empty) */
            int blocks[4], nbl = 3;
            if (tr->blck == 32) {
                blocks[0] = 1, blocks[1] = 18, blocks[2] = 131, blocks[3] = 48, nbl = 4;
            } else {
                blocks[0] = 1, blocks[1] = 6, blocks[2] = 17;
            }
            double worst = 0;
            int checked = 0, small = 0;
            for (int b = 0; b < nbl; b++) {
                double w = check_case(t, (qt_isa)isa, blocks[b] * tr->blck, rng, &checked, &small);
                if (!(w <= worst)) worst = w;
            }
            printf("gemm %-7s %-6s: %5d outputs vs qt_vec_dot, max |diff| / sum|w*a| = %.2e (bound %.0e)\n", tr->name,
                   qt_isa_name((qt_isa)isa), checked, worst, REL_BOUND);
            if (small)
                printf("small %-7s %-6s: %5d outputs (1-%d tokens) equal to qt_vec_dot bit for bit\n", tr->name,
                       qt_isa_name((qt_isa)isa), small, QT_GEMM_SMALL_MAX_TOK);
        }
    }
}

/* AMX: a (row, token) output must be the same bits however the tokens are
 * batched (quant_gemm_body.h: the tile path for 8+ tokens, qg_run16 below
 * that, the same float work per unit; rows past the last block of 16 the
 * same kernel either way), so that the expert lanes' batching cannot move
 * a result. 37 rows (two blocks and 5 more) x 40 tokens, once in one call
 * and once 1, 3, 4 and 7 tokens at a time; every format. */
static void test_amx_batching(qtt_rng *rng) {
    if (!qt_isa_supported(QT_ISA_AMX)) {
        printf("gemm batching: amx not run by this CPU (or OS): skipped\n");
        return;
    }
    enum { NR = 37, NC = 40 };
    static const int PIECES[] = {1, 3, 4, 7};
    int checked = 0;
    for (int i = 0; i < N_FORMATS; i++) {
        const qt_type t = FORMATS[i];
        const qt_traits *tr = qt_get(t);
        const int n = tr->blck == 32 ? 131 * 32 : 17 * 256; /* more than one 1024-weight chunk */
        const size_t row = qt_row_size(t, n), arow = qt_row_size(tr->vec_dot_type, n);
        uint8_t *W = xmalloc(row * NR), *A = xmalloc(arow * NC);
        qtt_fill_blocks(t, W, (int64_t)NR * n / tr->blck, rng);
        float *x = xmalloc(sizeof(float) * (size_t)n);
        const void *act[NC];
        for (int c = 0; c < NC; c++) {
            for (int k = 0; k < n; k++) x[k] = (c & 1) ? 4.0f + 0.5f * qtt_gauss(rng) : qtt_gauss(rng);
            qt_quantize_act(tr->vec_dot_type, x, A + (size_t)c * arow, n);
            act[c] = A + (size_t)c * arow;
        }
        static float y1[NC * NR], y2[NC * NR];
        qt_gemm_fn gemm = qt_gemm(t, QT_ISA_AMX);
        gemm(n, NR, NC, W, row, act, y1, NR);
        for (int p = 0; p < (int)(sizeof PIECES / sizeof PIECES[0]); p++) {
            for (int c = 0; c < NC; c += PIECES[p])
                gemm(n, NR, NC - c < PIECES[p] ? NC - c : PIECES[p], W, row, act + c, y2 + (size_t)c * NR, NR);
            CHECK(!memcmp(y1, y2, sizeof y1), "%s amx: %d tokens at a time differ from one call of %d", tr->name,
                  PIECES[p], NC);
            checked += NC * NR;
        }
        free(W);
        free(A);
        free(x);
    }
    printf("gemm batching: %d amx outputs bit-equal between one call of %d tokens and calls of 1, 3, 4, 7\n", checked,
           NC);
}

static void test_dispatch(qtt_rng *rng) {
    CHECK(qt_gemm(QT_Q4_K, QT_ISA_SCALAR) == NULL, "scalar ISA must have no gemm kernel");
    CHECK(qt_gemm((qt_type)-1, qt_cpu_isa()) == NULL, "bad id -1");
    CHECK(qt_gemm((qt_type)QT_COUNT, qt_cpu_isa()) == NULL, "bad id QT_COUNT");
    CHECK(qt_gemm((qt_type)4, qt_cpu_isa()) == NULL, "unknown id 4");
    CHECK(qt_gemm(QT_Q2_K, qt_cpu_isa()) == NULL, "Q2_K has no gemm kernel: the dot fallback is used");
    CHECK(qt_gemm(QT_F32, qt_cpu_isa()) == NULL, "F32 has no gemm kernel");
    CHECK(qt_gemm_small(QT_Q4_1, QT_ISA_SCALAR) == NULL && qt_gemm_small_max_tok(QT_Q4_1, QT_ISA_SCALAR) == 0,
          "scalar ISA must have no small-batch kernel");
    CHECK(qt_gemm_small((qt_type)-1, qt_cpu_isa()) == NULL && qt_gemm_small((qt_type)QT_COUNT, qt_cpu_isa()) == NULL,
          "small: bad ids");
    CHECK(qt_gemm_small(QT_Q2_K, qt_cpu_isa()) == NULL && qt_gemm_small_max_tok(QT_Q2_K, qt_cpu_isa()) == 0,
          "Q2_K has no small-batch kernel");
    /* the fallback is the dot, pair by pair */
    const int n = 512, nr = 3, nc = 3;
    const size_t row = qt_row_size(QT_Q2_K, n), arow = qt_row_size(QT_Q8_K, n);
    uint8_t *W = xmalloc(row * nr), *A = xmalloc(arow * nc);
    qtt_fill_blocks(QT_Q2_K, W, (int64_t)nr * n / QK_K, rng);
    float x[512];
    const void *act[3];
    for (int c = 0; c < nc; c++) {
        for (int i = 0; i < n; i++) x[i] = qtt_gauss(rng);
        qt_quantize_act(QT_Q8_K, x, A + c * arow, n);
        act[c] = A + c * arow;
    }
    float y[9], ref;
    qt_vec_dot_fn dot = qt_vec_dot(QT_Q2_K, qt_cpu_isa());
    qt_gemm_by_dot(dot, n, nr, nc, W, row, act, y, 3);
    int same = 1;
    for (int r = 0; r < nr; r++)
        for (int c = 0; c < nc; c++) {
            dot(n, &ref, W + r * row, act[c]);
            same &= memcmp(&ref, &y[c * 3 + r], sizeof ref) == 0;
        }
    CHECK(same, "qt_gemm_by_dot differs from the dot");
    printf("gemm dispatch: NULL for scalar, bad ids, Q2_K, F32; qt_gemm_by_dot bitwise equal to the dot\n");
    free(W);
    free(A);
}

/* Speed on one core, rows in cache: 16 rows x 64 tokens of 4096 weights
 * (16 rows of Q8_0 are 70 KiB: L2), the shape of one cpu_matmul task, on
 * each ISA this CPU runs; best of 9. Reported as multiply-adds per second
 * and the gemm's speed-up over the dot loop on the same ISA. */
static void bench_isa(qtt_rng *rng, qt_isa isa) {
    if (!qt_gemm(QT_Q4_K, isa)) {
        printf("gemm speed: no gemm kernels on %s\n", qt_isa_name(isa));
        return;
    }
    const int n = 4096, nr = 16, nt = MAX_TOK; /* calls of qt_gemm_max_tok(isa) tokens */
    for (int i = 0; i < N_FORMATS; i++) {
        qt_type t = FORMATS[i];
        const qt_traits *tr = qt_get(t);
        const size_t row = qt_row_size(t, n), arow = qt_row_size(tr->vec_dot_type, n);
        uint8_t *W = xmalloc(row * nr), *A = xmalloc(arow * nt);
        qtt_fill_blocks(t, W, (int64_t)nr * n / tr->blck, rng);
        float *x = xmalloc(sizeof(float) * n), *y = xmalloc(sizeof(float) * nr * nt);
        for (int c = 0; c < nt; c++) {
            for (int k = 0; k < n; k++) x[k] = qtt_gauss(rng);
            qt_quantize_act(tr->vec_dot_type, x, A + c * arow, n);
        }
        qt_gemm_fn gemm = qt_gemm(t, isa);
        qt_vec_dot_fn dot = qt_vec_dot(t, isa);
        double best_g = 1e9, best_d = 1e9;
        for (int rep = 0; rep < 9; rep++) {
            double t0 = now_s();
            const int mt = qt_gemm_max_tok(isa);
            for (int c = 0; c < nt; c += mt) {
                const void *act[MAX_TOK];
                for (int k = 0; k < mt; k++) act[k] = A + (c + k) * arow;
                gemm(n, nr, mt, W, row, act, y + c * nr, nr);
            }
            double t1 = now_s();
            for (int r = 0; r < nr; r++)
                for (int c = 0; c < nt; c++) dot(n, &y[c * nr + r], W + r * row, A + c * arow);
            double t2 = now_s();
            if (t1 - t0 < best_g) best_g = t1 - t0;
            if (t2 - t1 < best_d) best_d = t2 - t1;
        }
        double gmac = (double)n * nr * nt * 1e-9;
        printf("gemm speed %-7s %s: gemm %6.1f GMAC/s, dot loop %6.1f GMAC/s, x%.2f\n", tr->name, qt_isa_name(isa),
               gmac / best_g, gmac / best_d, best_d / best_g);
        free(W);
        free(A);
        free(x);
        free(y);
    }
}

/* Small batches on one core, rows in L2: 64 rows of n weights times nc
 * tokens, the small-batch kernel against the gemm and the dot loop; best of
 * 15. This is the crossover qt_gemm_small_max_tok is read from. */
static void bench_small(qtt_rng *rng, qt_isa isa) {
    static const qt_type T[] = {QT_Q4_0, QT_Q4_1, QT_Q5_0, QT_Q5_1, QT_Q8_0, QT_IQ4_NL};
    static const int NS[] = {576, 4096}, NCS[] = {1, 2, 3, 4, 6, 8, 12, 16};
    const int nr = 64;
    for (int i = 0; i < (int)(sizeof T / sizeof T[0]); i++) {
        const qt_type t = T[i];
        const qt_traits *tr = qt_get(t);
        qt_gemm_fn small = qt_gemm_small(t, isa), gemm = qt_gemm(t, isa);
        if (!small) continue;
        for (int in = 0; in < 2; in++) {
            const int n = NS[in];
            const size_t row = qt_row_size(t, n), arow = qt_row_size(tr->vec_dot_type, n);
            uint8_t *W = xmalloc(row * nr), *A = xmalloc(arow * 16);
            qtt_fill_blocks(t, W, (int64_t)nr * n / tr->blck, rng);
            float *x = xmalloc(sizeof(float) * n), *y = xmalloc(sizeof(float) * nr * 16);
            const void *act[16];
            for (int c = 0; c < 16; c++) {
                for (int k = 0; k < n; k++) x[k] = qtt_gauss(rng);
                qt_quantize_act(tr->vec_dot_type, x, A + c * arow, n);
                act[c] = A + c * arow;
            }
            qt_vec_dot_fn dot = qt_vec_dot(t, isa);
            printf("small speed %-6s n=%4d %s, GMAC/s small / gemm / dot loop:", tr->name, n, qt_isa_name(isa));
            for (int ic = 0; ic < (int)(sizeof NCS / sizeof NCS[0]); ic++) {
                const int nc = NCS[ic];
                double bs = 1e9, bg = 1e9, bd = 1e9;
                for (int rep = 0; rep < 15; rep++) {
                    double t0 = now_s();
                    for (int c = 0; c < nc; c += QT_GEMM_SMALL_MAX_TOK)
                        small(n, nr, nc - c < QT_GEMM_SMALL_MAX_TOK ? nc - c : QT_GEMM_SMALL_MAX_TOK, W, row, act + c,
                              y + c * nr, nr);
                    double t1 = now_s();
                    gemm(n, nr, nc, W, row, act, y, nr);
                    double t2 = now_s();
                    for (int r = 0; r < nr; r++)
                        for (int c = 0; c < nc; c++) dot(n, &y[c * nr + r], W + r * row, act[c]);
                    double t3 = now_s();
                    if (t1 - t0 < bs) bs = t1 - t0;
                    if (t2 - t1 < bg) bg = t2 - t1;
                    if (t3 - t2 < bd) bd = t3 - t2;
                }
                const double gmac = (double)n * nr * nc * 1e-9;
                printf(" %d: %.1f/%.1f/%.1f", nc, gmac / bs, gmac / bg, gmac / bd);
            }
            printf("\n");
            free(W);
            free(A);
            free(x);
            free(y);
        }
    }
}

static void bench(qtt_rng *rng) {
    for (int isa = QT_ISA_AVX2; isa <= (int)qt_cpu_isa(); isa++) bench_isa(rng, (qt_isa)isa);
    bench_small(rng, qt_cpu_isa());
}

int main(int argc, char **argv) {
    qtt_rng rng = {0x9e3779b97f4a7c15ULL};
    if (argc > 1 && strcmp(argv[1], "--small-speed") == 0) { /* the small-batch crossover alone */
        bench_small(&rng, qt_cpu_isa());
        return 0;
    }
    printf("gemm tests on %s (best ISA of this CPU)\n", qt_isa_name(qt_cpu_isa()));
    test_dispatch(&rng);
    test_formats(&rng);
    test_amx_batching(&rng);
    if (!(argc > 1 && strcmp(argv[1], "--no-bench") == 0)) bench(&rng);
    return check_report("test_gemm");
}
