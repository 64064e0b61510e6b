/* cpu_matvec / cpu_matmul / cpu_matmul_q against a double-precision
 * reference: for every quant type that has a CPU dot product, random valid
 * weights (cpu_fill_random_blocks) are dequantized with the reference
 * dequantizer (qt_dequantize), the activations are quantized to the type's
 * vec_dot_type and dequantized back the same way, and each output must equal
 * sum_c w*a within tol * sum_c |w*a| (the kernels only reorder and round the
 * same products; a wrong row, block, or scale is off by far more).
 * Shapes: odd row counts, two widths, 1..7 threads (and a NULL pool), n_tok
 * 1, 3, 17; plus row padding, output stride, token gather, and bad input.
 */
#include "backend/cpu/cpu_ops.h"

#include "core/alloc.h"
#include "core/log.h"
#include "quant/quant.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../common/check.h"

static double worst_ratio[QT_COUNT]; /* max |err| / (sum|w*a|) seen per type */

static uint64_t rng_state = 12345;
static float frand(void) {
    rng_state = rng_state * 6364136223846793005ull + 1442695040888963407ull;
    return (float)((rng_state >> 40) * (1.0 / 16777216.0)) * 2.0f - 1.0f;
}

/* Everything the reference needs for one weight matrix. */
typedef struct {
    qt_type type;
    int64_t n_rows, n_cols;
    size_t stride; /* row stride in bytes (>= row size: tests padding) */
    uint8_t *W;    /* (n_rows, stride bytes) */
    double *Wd;    /* (n_rows, n_cols) dequantized */
} weights;

static int make_weights(weights *w, qt_type type, int64_t n_rows, int64_t n_cols, size_t pad, uint64_t seed) {
    const qt_traits *tr = qt_get(type);
    w->type = type;
    w->n_rows = n_rows;
    w->n_cols = n_cols;
    size_t row = qt_row_size(type, n_cols);
    w->stride = row + pad;
    w->W = st_calloc((size_t)n_rows, w->stride);
    w->Wd = st_malloc(sizeof(double) * (size_t)(n_rows * n_cols));
    float *tmp = st_malloc(sizeof(float) * (size_t)n_cols);
    int64_t blocks = n_cols / tr->blck;
    for (int64_t r = 0; r < n_rows; r++) {
        if (cpu_fill_random_blocks(type, w->W + r * w->stride, blocks, seed * 1000003 + (uint64_t)r) != 0) {
            st_free(tmp);
            return -1;
        }
        qt_dequantize(type, w->W + r * w->stride, tmp, n_cols);
        for (int64_t c = 0; c < n_cols; c++) {
            CHECK(isfinite(tmp[c]), "%s: filler gave a non-finite weight", tr->name);
            w->Wd[r * n_cols + c] = tmp[c];
        }
    }
    st_free(tmp);
    return 0;
}

static void free_weights(weights *w) {
    st_free(w->W);
    st_free(w->Wd);
}

/* The activations as the kernel sees them: quantized to vec_dot_type, then
 * dequantized by the reference dequantizer. */
static void act_reference(qt_type type, const float *x, int64_t n_cols, double *out) {
    qt_type at = qt_get(type)->vec_dot_type;
    void *q = st_malloc(qt_row_size(at, n_cols));
    float *tmp = st_malloc(sizeof(float) * (size_t)n_cols);
    qt_quantize_act(at, x, q, n_cols);
    qt_dequantize(at, q, tmp, n_cols);
    for (int64_t c = 0; c < n_cols; c++) out[c] = tmp[c];
    st_free(q);
    st_free(tmp);
}

/* Checks Y[i*ldy + r] against the reference for token rows tok[i]. */
static void check_output(const weights *w, const double *Ad, const int32_t *tok, int64_t n_out, const float *Y,
                         int64_t ldy, double tol, const char *what, int n_threads) {
    const char *name = qt_get(w->type)->name;
    for (int64_t i = 0; i < n_out; i++) {
        const double *a = Ad + (int64_t)tok[i] * w->n_cols;
        for (int64_t r = 0; r < w->n_rows; r++) {
            const double *wr = w->Wd + r * w->n_cols;
            double ref = 0, mag = 0;
            for (int64_t c = 0; c < w->n_cols; c++) {
                ref += wr[c] * a[c];
                mag += fabs(wr[c] * a[c]);
            }
            double y = Y[i * ldy + r];
            double err = fabs(y - ref);
            double ratio = mag > 0 ? err / mag : err;
            if (ratio > worst_ratio[w->type] || !isfinite(y)) worst_ratio[w->type] = isfinite(y) ? ratio : INFINITY;
            if (!(err <= tol * mag + 1e-30)) {
                CHECK(
                    0,
                    "%s %s rows=%lld cols=%lld threads=%d out %lld row %lld: got %.7g want %.7g (|err|/sum|wa| = %.3g)",
                    name, what, (long long)w->n_rows, (long long)w->n_cols, n_threads, (long long)i, (long long)r, y,
                    ref, ratio);
                return; /* one message per case is enough */
            }
        }
    }
}

/* cpu_matmul_q_batch: 70 products of mixed types, shapes and token counts
 * (0, 1, several; gathered) in one call, so that the batch spans two groups
 * of 64; each output checked against the reference. Then a batch with one bad
 * entry must fail without writing anything. */
static void check_batch(st_pool *pool) {
    const qt_type types[] = {QT_Q4_K, QT_Q8_0, QT_IQ4_XS, QT_F16, QT_Q6_K, QT_IQ2_XS};
    enum { N = 70, NT = 6 };
    weights w[N];
    cpu_mm mm[N];
    double *Ad[NT];
    void *Xq[NT];
    const int64_t n_cols = 512;
    float *X = st_malloc(sizeof(float) * 17 * n_cols);
    for (int i = 0; i < 17 * n_cols; i++) X[i] = frand();
    for (int k = 0; k < NT; k++) {
        Ad[k] = st_malloc(sizeof(double) * 17 * n_cols);
        for (int i = 0; i < 17; i++) act_reference(types[k], X + i * n_cols, n_cols, Ad[k] + i * n_cols);
        Xq[k] = st_malloc(cpu_act_row_size(types[k], n_cols) * 17);
        ST_ASSERT(cpu_quantize_act(pool, types[k], n_cols, 17, X, Xq[k]) == 0);
    }
    static const int32_t ids[5] = {3, 16, 0, 7, 7};
    const int64_t toks[4] = {1, 0, 5, 1};
    for (int i = 0; i < N; i++) {
        int k = i % NT;
        ST_ASSERT(make_weights(&w[i], types[k], 1 + (i * 37) % 61, n_cols, 0, 9000 + (uint64_t)i) == 0);
        mm[i] = (cpu_mm){w[i].W, 0, types[k], w[i].n_rows, n_cols, toks[i % 4], Xq[k], ids + (i % 2), NULL, 0};
        mm[i].Y = st_malloc(sizeof(float) * 5 * (size_t)w[i].n_rows);
        memset(mm[i].Y, 0xff, sizeof(float) * 5 * (size_t)w[i].n_rows);
    }
    CHECK(cpu_matmul_q_batch(pool, mm, N) == 0, "cpu_matmul_q_batch failed: %s", st_error_get());
    for (int i = 0; i < N; i++)
        check_output(&w[i], Ad[i % NT], mm[i].x_ids, mm[i].n_tok, mm[i].Y, w[i].n_rows, 1e-5, "batch",
                     st_pool_n_threads(pool));
    printf("batch of %d products (6 types, 0/1/5 tokens, gathered) in one call: outputs match the reference\n", N);

    /* one bad entry (a partial block): error, and the good ones untouched */
    for (int i = 0; i < 3; i++) memset(mm[i].Y, 0xff, sizeof(float) * 5 * (size_t)w[i].n_rows);
    cpu_mm bad[3] = {mm[0], mm[1], mm[2]};
    bad[2].n_cols = 100;
    CHECK(cpu_matmul_q_batch(pool, bad, 3) == -1, "batch with a bad entry accepted");
    uint32_t bits;
    memcpy(&bits, mm[0].Y, 4);
    CHECK(bits == 0xffffffffu, "batch with a bad entry wrote an output");
    printf("batch with a bad entry rejected before running: %s\n", st_error_get());

    for (int i = 0; i < N; i++) {
        st_free(mm[i].Y);
        free_weights(&w[i]);
    }
    for (int k = 0; k < NT; k++) {
        st_free(Ad[k]);
        st_free(Xq[k]);
    }
    st_free(X);
}

int main(void) {
    st_pool *pools[8] = {NULL};
    for (int n = 1; n <= 7; n++) pools[n] = st_pool_init(n);
    cpu_scratch scratch = {0};
    printf("ISA path: %s\n", qt_isa_name(qt_cpu_isa()));

    const int64_t row_counts[] = {1, 7, 37, 133, 1001}; /* 1001: many row tasks per thread */
    const int64_t tok_counts[] = {1, 3, 17};
    int n_types = 0, n_cases = 0, combo = 0;
    char tested[512] = "";

    for (int t = 0; t < QT_COUNT; t++) {
        const qt_traits *tr = qt_get((qt_type)t);
        if (!tr || !qt_vec_dot((qt_type)t, QT_ISA_SCALAR) || !tr->dequant) continue;
        if (!qt_get(tr->vec_dot_type) || !qt_get(tr->vec_dot_type)->dequant) {
            CHECK(0, "%s: its activation format %d has no reference dequantizer", tr->name, (int)tr->vec_dot_type);
            continue;
        }
        int ab = qt_get(tr->vec_dot_type)->blck;
        int64_t unit = tr->blck > ab ? tr->blck : ab;
        if (unit < 32) unit = 32; /* float formats: blocks of 1 */
        /* Every format's products are exact in its kernel (integer sums times
         * the same scales the dequantizer uses); only float summation order
         * differs, ~1e-7 of sum|w*a|. */
        double tol = 1e-5;
        /* except Q8_1's sum field, stored in f16 (2^-11 relative), which meets the min term */
        if (tr->vec_dot_type == QT_Q8_1) tol = 1e-3;
        n_types++;
        snprintf(tested + strlen(tested), sizeof tested - strlen(tested), "%s%s", n_types > 1 ? " " : "", tr->name);

        const int64_t widths[] = {unit * (unit == 32 ? 3 : 1), unit * (unit == 32 ? 72 : 9)};
        for (int wi = 0; wi < 2; wi++) {
            int64_t n_cols = widths[wi];
            for (int ri = 0; ri < 5; ri++) {
                weights w;
                int64_t n_rows = row_counts[ri];
                size_t pad = (ri == 2) ? 64 : 0; /* one shape with padded rows */
                if (make_weights(&w, (qt_type)t, n_rows, n_cols, pad, (uint64_t)(t * 100 + wi * 10 + ri)) != 0) {
                    CHECK(0, "%s: cannot fill random blocks: %s", tr->name, st_error_get());
                    continue;
                }
                float *X = st_malloc(sizeof(float) * (size_t)(17 * n_cols));
                double *Ad = st_malloc(sizeof(double) * (size_t)(17 * n_cols));
                float *Y = st_malloc(sizeof(float) * (size_t)(17 * n_rows * 2));
                for (int64_t i = 0; i < 17 * n_cols; i++) X[i] = frand();
                for (int64_t i = 0; i < 17; i++) act_reference((qt_type)t, X + i * n_cols, n_cols, Ad + i * n_cols);
                int32_t ids[17];
                for (int i = 0; i < 17; i++) ids[i] = i;

                for (int ti = 0; ti < 3; ti++, combo++) {
                    int64_t n_tok = tok_counts[ti];
                    /* cycle thread counts over the cases: every count meets every type */
                    int nt = 1 + combo % 8; /* 8 = the NULL pool */
                    st_pool *pool = nt == 8 ? NULL : pools[nt];
                    memset(Y, 0xff, sizeof(float) * (size_t)(n_tok * n_rows)); /* NaN: catches unwritten outputs */
                    /* every other case with tiny token blocks, so that tiles split the tokens too */
                    cpu_set_act_block_bytes(combo % 2 ? 4096 : 256 * 1024);
                    int rc = n_tok == 1
                                 ? cpu_matvec(pool, &scratch, w.W, w.stride, (qt_type)t, n_rows, n_cols, X, Y)
                                 : cpu_matmul(pool, &scratch, w.W, w.stride, (qt_type)t, n_rows, n_cols, n_tok, X, Y);
                    CHECK(rc == 0, "%s: cpu_matmul failed: %s", tr->name, st_error_get());
                    check_output(&w, Ad, ids, n_tok, Y, n_rows, tol, n_tok == 1 ? "matvec" : "matmul", nt);
                    n_cases++;
                }

                /* pre-quantized entry: tokens gathered in reverse, outputs at stride 2*n_rows */
                {
                    size_t act_row = cpu_act_row_size((qt_type)t, n_cols);
                    void *Xq = st_malloc(act_row * 17);
                    CHECK(cpu_quantize_act(pools[3], (qt_type)t, n_cols, 17, X, Xq) == 0, "quantize_act");
                    int32_t rev[5] = {16, 9, 4, 1, 0};
                    memset(Y, 0xff, sizeof(float) * (size_t)(17 * n_rows * 2));
                    for (int k = 0; k < 2; k++) { /* 5 tokens, then 1 token (the matvec split) */
                        int64_t nt = k ? 1 : 5;
                        CHECK(cpu_matmul_q(pools[1 + (combo % 7)], w.W, w.stride, (qt_type)t, n_rows, n_cols, nt, Xq,
                                           rev + k, Y, 2 * n_rows) == 0,
                              "%s: cpu_matmul_q failed: %s", tr->name, st_error_get());
                        check_output(&w, Ad, rev + k, nt, Y, 2 * n_rows, tol, "matmul_q gather", 1 + combo % 7);
                    }
                    /* the gaps between output rows were not written */
                    uint32_t bits;
                    memcpy(&bits, &Y[n_rows], 4);
                    CHECK(n_rows == 0 || bits == 0xffffffffu, "%s: matmul_q wrote outside its output rows", tr->name);
                    st_free(Xq);
                    n_cases += 2;
                }
                st_free(X);
                st_free(Ad);
                st_free(Y);
                free_weights(&w);
            }
        }
    }
    printf("types with a dot product (%d): %s\n", n_types, tested);
    CHECK(n_types >= 6, "only %d types have a dot product", n_types);
    for (int t = 0; t < QT_COUNT; t++)
        if (worst_ratio[t] > 0)
            printf("  %-8s max |y - ref| / sum|w*a| = %.2e\n", qt_get((qt_type)t)->name, worst_ratio[t]);

    check_batch(pools[5]);

    /* bad input: an error code and a message, no crash */
    float x[256] = {0}, y[4];
    uint8_t wbuf[4 * 256 * 4];
    CHECK(cpu_matvec(pools[2], &scratch, wbuf, 0, (qt_type)5, 4, 256, x, y) == -1, "type 5 (unused id) accepted");
    CHECK(cpu_matvec(pools[2], &scratch, wbuf, 0, QT_Q4_K, 4, 100, x, y) == -1, "Q4_K with 100 columns accepted");
    CHECK(cpu_matmul_q(pools[2], wbuf, 10, QT_F32, 4, 256, 1, x, NULL, y, 0) == -1,
          "row stride below row size accepted");
    printf("bad input (unknown type, partial block, short stride) rejected: %s\n", st_error_get());

    printf("%d cases checked over %d types\n", n_cases, n_types);
    cpu_scratch_free(&scratch);
    for (int n = 1; n <= 7; n++) st_pool_free(pools[n]);
    return check_report("test_cpu_ops");
}
