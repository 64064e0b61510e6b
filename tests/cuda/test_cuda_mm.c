/* The CUDA matrix products (backend/cuda/mm.h) against the CPU reference.
 *
 * For every weight format: random blocks (scale fields replaced by sane f16
 * values so that no block decodes to inf/NaN), random activations, and the
 * reference y = dequant(W) x computed in double from qt_dequantize (quant/,
 * itself tested bit-exact against the gguf package). Checked per format and
 * shape, by NMSE = |y - ref|^2 / |ref|^2 against a bound per path:
 *   - matrix-vector on quantized weights: the activations are int8 per 32
 *     values, NMSE about 3e-5 for Gaussian x; bound 5e-4;
 *   - matrix-vector on F32/F16/BF16 weights: f32 arithmetic; bound 1e-9;
 *   - GEMM path: bf16 weights and activations, NMSE about 3e-6; bound 5e-5
 *     (F32 weights stay f32: 1e-9).
 * Outputs are poisoned with NaN before every product, so an unwritten row
 * fails. Shapes include odd row counts, single rows and 32-wide rows.
 * The MoE product is checked per pair on its paths (device pairs; host
 * grouping with the GEMM and the matrix-vector groups; the tensor-core path
 * of prompt chunks, moe_mma.cu: f16 weights and activations, bound 5e-6),
 * with a device pointer table and with contiguous experts, with skipped (-1)
 * pairs, and routed like a model at Qwen3-30B-A3B's expert shapes.
 *
 * Without a CUDA device it prints "SKIPPED: no CUDA device" and exits 0.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cuda/compat.h" /* the CUDA runtime, or HIP's (STRATA_HIP) */
#include "backend/cuda/mm/mm.h"
#include "core/fp16.h"
#include "core/log.h"
#include "quant/quant.h"
#include "ck.h"

static uint64_t g_rng = 0x9E3779B97F4A7C15ull;
static uint32_t rnd(void) {
    g_rng ^= g_rng << 13, g_rng ^= g_rng >> 7, g_rng ^= g_rng << 17;
    return (uint32_t)(g_rng >> 16);
}
static float rnd_unit(void) { return (float)(rnd() & 0xFFFFFF) / 16777216.0f; }
static float rnd_gauss(void) {
    const float u = rnd_unit() + 1e-7f, v = rnd_unit();
    return sqrtf(-2.0f * logf(u)) * cosf(6.2831853f * v);
}

static void put_f16(uint8_t *p, float v) {
    const uint16_t h = st_f32_to_f16(v);
    memcpy(p, &h, 2);
}

/* Overwrite the scale fields of one block with f16 values in [1e-3, 1e-2). */
static void sanitize_block(qt_type t, uint8_t *b) {
    static const struct {
        qt_type t;
        int off[2];
    } tab[] = {
        {QT_Q4_0, {0, -1}},    {QT_Q4_1, {0, 2}},    {QT_Q5_0, {0, -1}},   {QT_Q5_1, {0, 2}},     {QT_Q8_0, {0, -1}},
        {QT_Q2_K, {80, 82}},   {QT_Q3_K, {108, -1}}, {QT_Q4_K, {0, 2}},    {QT_Q5_K, {0, 2}},     {QT_Q6_K, {208, -1}},
        {QT_IQ2_XXS, {0, -1}}, {QT_IQ2_XS, {0, -1}}, {QT_IQ2_S, {0, -1}},  {QT_IQ3_XXS, {0, -1}}, {QT_IQ3_S, {0, -1}},
        {QT_IQ1_S, {0, -1}},   {QT_IQ4_NL, {0, -1}}, {QT_IQ4_XS, {0, -1}},
    };
    for (size_t i = 0; i < sizeof(tab) / sizeof(tab[0]); i++) {
        if (tab[i].t != t) continue;
        for (int k = 0; k < 2; k++)
            if (tab[i].off[k] >= 0) put_f16(b + tab[i].off[k], 1e-3f + 9e-3f * rnd_unit());
        return;
    }
    if (t == QT_IQ1_M) { /* the f16 scale is spread over the top nibbles of 4 words at 48 */
        const uint16_t d = st_f32_to_f16(1e-3f + 9e-3f * rnd_unit());
        for (int k = 0; k < 4; k++) {
            uint16_t w;
            memcpy(&w, b + 48 + 2 * k, 2);
            w = (uint16_t)((w & 0x0FFF) | (((d >> (4 * k)) & 0xF) << 12));
            memcpy(b + 48 + 2 * k, &w, 2);
        }
    } else if (t == QT_MXFP4) {
        b[0] = (uint8_t)(118 + rnd() % 8); /* 2^-10 .. 2^-3 */
    }
}

/* A random weight matrix of n_mat x rows x n_in in type t (host bytes). */
static uint8_t *make_weights(qt_type t, int64_t n_in, int64_t rows) {
    const size_t rb = qt_row_size(t, n_in), n = rb * (size_t)rows;
    uint8_t *w = malloc(n);
    if (t == QT_F32 || t == QT_F16 || t == QT_BF16) {
        float *f = malloc(sizeof(float) * (size_t)(n_in * rows));
        for (int64_t i = 0; i < n_in * rows; i++) f[i] = 0.05f * rnd_gauss();
        qt_quantize(t, f, w, n_in * rows);
        free(f);
        return w;
    }
    for (size_t i = 0; i < n; i++) w[i] = (uint8_t)rnd();
    const qt_traits *tr = qt_get(t);
    for (size_t i = 0; i < n / (size_t)tr->type_size; i++) sanitize_block(t, w + i * (size_t)tr->type_size);
    return w;
}

/* ref[t][r] = sum_k dequant(W)[r][k] x[t][k] in double. */
static void reference(qt_type t, const uint8_t *w, int64_t n_in, int64_t n_out, const float *x, int n_tok,
                      double *ref) {
    float *row = malloc(sizeof(float) * (size_t)n_in);
    const size_t rb = qt_row_size(t, n_in);
    for (int64_t r = 0; r < n_out; r++) {
        qt_dequantize(t, w + (size_t)r * rb, row, n_in);
        for (int k = 0; k < n_tok; k++) {
            double s = 0;
            for (int64_t i = 0; i < n_in; i++) s += (double)row[i] * x[(size_t)k * n_in + i];
            ref[(size_t)k * n_out + r] = s;
        }
    }
    free(row);
}

static double nmse(const float *y, const double *ref, size_t n) {
    double num = 0, den = 0;
    for (size_t i = 0; i < n; i++) {
        if (!isfinite(y[i])) return INFINITY;
        num += (y[i] - ref[i]) * (y[i] - ref[i]);
        den += ref[i] * ref[i];
    }
    return den > 0 ? num / den : num;
}

static int g_fail, g_checks;

static void report(const char *what, const char *fmt, int64_t n_in, int64_t n_out, int n_tok, double e, double bound) {
    const int ok = e <= bound;
    g_checks++;
    if (!ok) g_fail++;
    printf("%-6s %-8s %5lld x %-5lld tok %3d  nmse %.3e  bound %.0e  %s\n", what, fmt, (long long)n_out,
           (long long)n_in, n_tok, e, bound, ok ? "ok" : "FAIL");
}

/* One dense product on the given path (mode as cuda_mm_force_path). */
static void check_dense(qt_type t, int64_t n_in, int64_t n_out, int n_tok, int mode) {
    const qt_traits *tr = qt_get(t);
    uint8_t *w = make_weights(t, n_in, n_out);
    const size_t wbytes = qt_row_size(t, n_in) * (size_t)n_out;
    float *x = malloc(sizeof(float) * (size_t)(n_in * n_tok));
    for (int64_t i = 0; i < n_in * n_tok; i++) x[i] = rnd_gauss();
    double *ref = malloc(sizeof(double) * (size_t)(n_out * n_tok));
    reference(t, w, n_in, n_out, x, n_tok, ref);

    void *dw;
    float *dx, *dy;
    CK(cudaMalloc(&dw, wbytes));
    CK(cudaMalloc((void **)&dx, sizeof(float) * (size_t)(n_in * n_tok)));
    CK(cudaMalloc((void **)&dy, sizeof(float) * (size_t)(n_out * n_tok)));
    CK(cudaMemcpy(dw, w, wbytes, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(dx, x, sizeof(float) * (size_t)(n_in * n_tok), cudaMemcpyHostToDevice));
    CK(cudaMemset(dy, 0xFF, sizeof(float) * (size_t)(n_out * n_tok))); /* NaN poison */

    st_weight sw = {.data = dw, .type = t, .n_in = n_in, .n_out = n_out, .n_mat = 1, .row_bytes = qt_row_size(t, n_in)};
    const int old = cuda_mm_force_path(mode);
    const int rc = cuda_matmul(&sw, 0, dx, dy, n_tok, 0, 0);
    cuda_mm_force_path(old);
    float *y = malloc(sizeof(float) * (size_t)(n_out * n_tok));
    CK(cudaDeviceSynchronize());
    CK(cudaMemcpy(y, dy, sizeof(float) * (size_t)(n_out * n_tok), cudaMemcpyDeviceToHost));
    const int gemm = mode == 2 || (mode == 0 && n_tok > MM_MMV_MAX_TOK);
    const int isf = t == QT_F32 || t == QT_F16 || t == QT_BF16;
    const double bound = t == QT_F32 ? 1e-9 : gemm ? 5e-5 : isf ? 1e-9 : 5e-4;
    const double e = rc == 0 ? nmse(y, ref, (size_t)(n_out * n_tok)) : INFINITY;
    if (rc != 0) printf("cuda_matmul failed: %s\n", st_error_get());
    report(gemm ? "gemm" : "mmv", tr->name, n_in, n_out, n_tok, e, bound);
    CK(cudaFree(dw));
    CK(cudaFree(dx));
    CK(cudaFree(dy));
    free(w), free(x), free(ref), free(y);
}

/* MoE: n_mat experts, n_pairs pairs over n_x activation rows. */
static void check_moe(qt_type t, int64_t n_in, int64_t n_out, int n_mat, int n_pairs, int n_x, int use_tab, int mode) {
    const qt_traits *tr = qt_get(t);
    const size_t rb = qt_row_size(t, n_in), mbytes = rb * (size_t)n_out;
    uint8_t *w = make_weights(t, n_in, n_out * n_mat);
    float *x = malloc(sizeof(float) * (size_t)(n_in * n_x));
    for (int64_t i = 0; i < n_in * n_x; i++) x[i] = rnd_gauss();
    int32_t *ids = malloc(sizeof(int32_t) * (size_t)n_pairs), *xrow = malloc(sizeof(int32_t) * (size_t)n_pairs);
    for (int p = 0; p < n_pairs; p++) {
        /* skewed so that some experts get many tokens (the GEMM groups) */
        ids[p] = p % 11 == 5 ? -1 : (rnd() % 3 == 0 ? (int)(rnd() % (unsigned)n_mat) : 0);
        xrow[p] = (int)(rnd() % (unsigned)n_x);
    }
    double *ref = calloc((size_t)(n_out * n_pairs), sizeof(double)), *r1 = malloc(sizeof(double) * (size_t)n_out);
    for (int p = 0; p < n_pairs; p++) {
        if (ids[p] < 0) continue; /* expected zeros */
        reference(t, w + (size_t)ids[p] * mbytes, n_in, n_out, x + (size_t)xrow[p] * n_in, 1, r1);
        memcpy(ref + (size_t)p * n_out, r1, sizeof(double) * (size_t)n_out);
    }
    /* experts in separate allocations when a table is used, in reverse order */
    void *dw = NULL, **dmats = malloc(sizeof(void *) * (size_t)n_mat), **dtab = NULL;
    if (use_tab) {
        for (int e = n_mat - 1; e >= 0; e--) {
            CK(cudaMalloc(&dmats[e], mbytes));
            CK(cudaMemcpy(dmats[e], w + (size_t)e * mbytes, mbytes, cudaMemcpyHostToDevice));
        }
        CK(cudaMalloc((void **)&dtab, sizeof(void *) * (size_t)n_mat));
        CK(cudaMemcpy(dtab, dmats, sizeof(void *) * (size_t)n_mat, cudaMemcpyHostToDevice));
    } else {
        CK(cudaMalloc(&dw, mbytes * (size_t)n_mat));
        CK(cudaMemcpy(dw, w, mbytes * (size_t)n_mat, cudaMemcpyHostToDevice));
    }
    float *dx, *dy;
    int32_t *dids, *dxrow;
    CK(cudaMalloc((void **)&dx, sizeof(float) * (size_t)(n_in * n_x)));
    CK(cudaMalloc((void **)&dy, sizeof(float) * (size_t)(n_out * n_pairs)));
    CK(cudaMalloc((void **)&dids, sizeof(int32_t) * (size_t)n_pairs));
    CK(cudaMalloc((void **)&dxrow, sizeof(int32_t) * (size_t)n_pairs));
    CK(cudaMemcpy(dx, x, sizeof(float) * (size_t)(n_in * n_x), cudaMemcpyHostToDevice));
    CK(cudaMemcpy(dids, ids, sizeof(int32_t) * (size_t)n_pairs, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(dxrow, xrow, sizeof(int32_t) * (size_t)n_pairs, cudaMemcpyHostToDevice));
    CK(cudaMemset(dy, 0xFF, sizeof(float) * (size_t)(n_out * n_pairs)));
    st_weight sw = {.data = dw, .type = t, .n_in = n_in, .n_out = n_out, .n_mat = n_mat, .row_bytes = rb};
    const int old = cuda_mm_force_path(mode);
    const int rc = cuda_moe_matmul(&sw, (const void *const *)dtab, dids, dxrow, n_pairs, dx, n_x, dy, 0, NULL, 0);
    cuda_mm_force_path(old);
    CK(cudaDeviceSynchronize());
    float *y = malloc(sizeof(float) * (size_t)(n_out * n_pairs));
    CK(cudaMemcpy(y, dy, sizeof(float) * (size_t)(n_out * n_pairs), cudaMemcpyDeviceToHost));
    if (rc != 0) printf("cuda_moe_matmul failed: %s\n", st_error_get());
    double e = rc == 0 ? nmse(y, ref, (size_t)(n_out * n_pairs)) : INFINITY;
    for (int p = 0; p < n_pairs && rc == 0; p++)
        for (int64_t r = 0; ids[p] < 0 && r < n_out; r++)
            if (y[(size_t)p * n_out + r] != 0.0f) e = INFINITY; /* skipped pairs must be zero */
    const int isf = t == QT_F32 || t == QT_F16 || t == QT_BF16;
    const int grouped = mode == 2 || (mode == 0 && n_pairs > MM_MOE_DEVICE_MAX);
    const double bound = grouped ? 5e-4 : isf ? 1e-9 : 5e-4; /* grouped mixes GEMM and mmv groups */
    char what[16];
    snprintf(what, sizeof what, "moe%s%s", grouped ? "G" : "D", use_tab ? "t" : "");
    report(what, tr->name, n_in, n_out, n_pairs, e, bound);
    if (use_tab) {
        for (int i = 0; i < n_mat; i++) CK(cudaFree(dmats[i]));
        CK(cudaFree(dtab));
    } else {
        CK(cudaFree(dw));
    }
    CK(cudaFree(dx));
    CK(cudaFree(dy));
    CK(cudaFree(dids));
    CK(cudaFree(dxrow));
    free(w), free(x), free(ids), free(xrow), free(ref), free(r1), free(dmats), free(y);
}

/* MoE at prompt sizes, routed like a model: n_tok tokens, k distinct experts
 * each (pair p = t*k + j). flags: MR_HOT every token picks expert 0 (more
 * tokens than one tile of the tensor-core path), MR_COLD expert 1 gets none,
 * MR_SKIP every 13th pair is -1 (zeros), MR_XNULL no xrow (row p of x, as the
 * down product reads). The reference dequantizes each expert once. */
enum { MR_HOT = 1, MR_COLD = 2, MR_SKIP = 4, MR_XNULL = 8 };

/* Whether this device runs the tensor-core MoE path (moe_mma.cu) for every
 * quantized format: sm_80+ with room for the largest stage (Q6_K, 109 KB). */
static int moe_tc_expected(void) {
#ifdef STRATA_HIP
    return 0;
#else
    int dev = 0, major = 0, optin = 0;
    CK(cudaGetDevice(&dev));
    CK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev));
    CK(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev));
    return major >= 8 && optin >= 112 * 1024;
#endif
}

static void check_moe_routed(qt_type t, int64_t n_in, int64_t n_out, int n_mat, int n_tok, int k, int flags) {
    const qt_traits *tr = qt_get(t);
    const size_t rb = qt_row_size(t, n_in), mbytes = rb * (size_t)n_out;
    const int n_pairs = n_tok * k, xnull = (flags & MR_XNULL) != 0, n_x = xnull ? n_pairs : n_tok;
    uint8_t *w = make_weights(t, n_in, n_out * n_mat);
    float *x = malloc(sizeof(float) * (size_t)n_in * (size_t)n_x);
    for (size_t i = 0; i < (size_t)n_in * (size_t)n_x; i++) x[i] = rnd_gauss();
    int32_t *ids = malloc(sizeof(int32_t) * (size_t)n_pairs), *xrow = malloc(sizeof(int32_t) * (size_t)n_pairs);
    for (int tk = 0; tk < n_tok; tk++)
        for (int j = 0; j < k; j++) {
            int e;
            for (;;) { /* distinct experts per token */
                e = j == 0 && (flags & MR_HOT) ? 0 : (int)(rnd() % (unsigned)n_mat);
                if ((flags & MR_COLD) && e == 1) continue;
                int dup = 0;
                for (int i = 0; i < j; i++) dup |= ids[tk * k + i] == e;
                if (!dup) break;
            }
            ids[tk * k + j] = e;
            xrow[tk * k + j] = tk;
        }
    for (int p = 0; (flags & MR_SKIP) && p < n_pairs; p += 13) ids[p] = -1;
    double *ref = calloc((size_t)n_out * (size_t)n_pairs, sizeof(double));
    float *wf = malloc(sizeof(float) * (size_t)n_in * (size_t)n_out);
    for (int e = 0; e < n_mat; e++) {
        int used = 0;
        for (int p = 0; p < n_pairs && !used; p++) used = ids[p] == e;
        if (!used) continue;
        for (int64_t r = 0; r < n_out; r++)
            qt_dequantize(t, w + (size_t)e * mbytes + (size_t)r * rb, wf + r * n_in, n_in);
        for (int p = 0; p < n_pairs; p++) {
            if (ids[p] != e) continue;
            const float *xr = x + (size_t)(xnull ? p : xrow[p]) * (size_t)n_in;
            for (int64_t r = 0; r < n_out; r++) {
                double acc = 0;
                for (int64_t i = 0; i < n_in; i++) acc += (double)wf[r * n_in + i] * xr[i];
                ref[(size_t)p * n_out + r] = acc;
            }
        }
    }
    void *dw;
    float *dx, *dy;
    int32_t *dids, *dxrow;
    CK(cudaMalloc(&dw, mbytes * (size_t)n_mat));
    CK(cudaMalloc((void **)&dx, sizeof(float) * (size_t)n_in * (size_t)n_x));
    CK(cudaMalloc((void **)&dy, sizeof(float) * (size_t)n_out * (size_t)n_pairs));
    CK(cudaMalloc((void **)&dids, sizeof(int32_t) * (size_t)n_pairs));
    CK(cudaMalloc((void **)&dxrow, sizeof(int32_t) * (size_t)n_pairs));
    CK(cudaMemcpy(dw, w, mbytes * (size_t)n_mat, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(dx, x, sizeof(float) * (size_t)n_in * (size_t)n_x, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(dids, ids, sizeof(int32_t) * (size_t)n_pairs, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(dxrow, xrow, sizeof(int32_t) * (size_t)n_pairs, cudaMemcpyHostToDevice));
    CK(cudaMemset(dy, 0xFF, sizeof(float) * (size_t)n_out * (size_t)n_pairs));
    st_weight sw = {.data = dw, .type = t, .n_in = n_in, .n_out = n_out, .n_mat = n_mat, .row_bytes = rb};
    const int rc = cuda_moe_matmul(&sw, NULL, dids, xnull ? NULL : dxrow, n_pairs, dx, n_x, dy, 0, NULL, 0);
    CK(cudaDeviceSynchronize());
    float *y = malloc(sizeof(float) * (size_t)n_out * (size_t)n_pairs);
    CK(cudaMemcpy(y, dy, sizeof(float) * (size_t)n_out * (size_t)n_pairs, cudaMemcpyDeviceToHost));
    if (rc != 0) printf("cuda_moe_matmul failed: %s\n", st_error_get());
    double e = rc == 0 ? nmse(y, ref, (size_t)n_out * (size_t)n_pairs) : INFINITY;
    for (int p = 0; p < n_pairs && rc == 0; p++)
        for (int64_t r = 0; ids[p] < 0 && r < n_out; r++)
            if (y[(size_t)p * n_out + r] != 0.0f) e = INFINITY;
    /* tensor-core path: f16 weights and activations (a power of two per
     * row), f32 sums: NMSE ~2e-7 expected, bound 5e-6 (the int8 paths give
     * ~3e-5 and would fail it); more experts than it groups: host path */
    const int tc = moe_tc_expected() && n_mat <= 512 && n_pairs > MM_MOE_DEVICE_MAX;
    char what[16];
    snprintf(what, sizeof what, "moe%s%s", tc ? "T" : "G", xnull ? "x" : "");
    report(what, tr->name, n_in, n_out, n_pairs, e, tc ? 5e-6 : 5e-4);
    CK(cudaFree(dw));
    CK(cudaFree(dx));
    CK(cudaFree(dy));
    CK(cudaFree(dids));
    CK(cudaFree(dxrow));
    free(w), free(x), free(ids), free(xrow), free(ref), free(wf), free(y);
}

/* Timing only (no bound): the three expert products of one Qwen3-30B-A3B
 * layer for a 512-token prompt chunk (4096 pairs, top-8 of 128; gate and up
 * 768 x 2048 Q4_K, down 2048 x 768 Q6_K), on the default path (the
 * tensor-core one on sm_80+) and with every expert forced through the
 * host-grouped GEMM path. The roofline (docs/cuda-kernels.md): ~87 us for
 * the weights (390 MB), ~100 us for the flops. */
static void time_moe_layer(void) {
    const int n_tok = 512, k = 8, n_mat = 128, np = n_tok * k;
    const int64_t E = 2048, F = 768;
    const qt_type tt[3] = {QT_Q4_K, QT_Q4_K, QT_Q6_K};
    const int64_t nin[3] = {E, E, F}, nout[3] = {F, F, E};
    void *dw[3];
    size_t wbytes = 0;
    for (int m = 0; m < 3; m++) {
        const size_t b = qt_row_size(tt[m], nin[m]) * (size_t)nout[m] * n_mat;
        uint8_t *w = make_weights(tt[m], nin[m], nout[m] * n_mat);
        CK(cudaMalloc(&dw[m], b));
        CK(cudaMemcpy(dw[m], w, b, cudaMemcpyHostToDevice));
        free(w);
        wbytes += b;
    }
    int32_t *ids = malloc(sizeof(int32_t) * np), *xrow = malloc(sizeof(int32_t) * np);
    for (int t = 0; t < n_tok; t++)
        for (int j = 0; j < k; j++) {
            int e, dup;
            do {
                e = (int)(rnd() % (unsigned)n_mat);
                dup = 0;
                for (int i = 0; i < j; i++) dup |= ids[t * k + i] == e;
            } while (dup);
            ids[t * k + j] = e, xrow[t * k + j] = t;
        }
    const size_t nx = (size_t)np * E; /* big enough for both inputs */
    float *hx = malloc(sizeof(float) * nx);
    for (size_t i = 0; i < nx; i++) hx[i] = rnd_gauss();
    float *dx, *dy;
    int32_t *dids, *dxrow;
    CK(cudaMalloc((void **)&dx, sizeof(float) * nx));
    CK(cudaMalloc((void **)&dy, sizeof(float) * (size_t)np * E));
    CK(cudaMalloc((void **)&dids, sizeof(int32_t) * np));
    CK(cudaMalloc((void **)&dxrow, sizeof(int32_t) * np));
    CK(cudaMemcpy(dx, hx, sizeof(float) * nx, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(dids, ids, sizeof(int32_t) * np, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(dxrow, xrow, sizeof(int32_t) * np, cudaMemcpyHostToDevice));
    cudaEvent_t ev[2];
    for (int i = 0; i < 2; i++) CK(cudaEventCreate(&ev[i]));
    for (int mode = 0; mode < 3; mode += 2) {
        const int old = cuda_mm_force_path(mode), reps = mode ? 2 : 20;
        float ms[3] = {0, 0, 0};
        for (int rep = -1; rep < reps; rep++) { /* rep -1: warm-up (scratch, first launches) */
            for (int m = 0; m < 3; m++) {
                st_weight sw = {.data = dw[m],
                                .type = tt[m],
                                .n_in = nin[m],
                                .n_out = nout[m],
                                .n_mat = n_mat,
                                .row_bytes = qt_row_size(tt[m], nin[m])};
                CK(cudaEventRecord(ev[0], 0));
                const int rc =
                    cuda_moe_matmul(&sw, NULL, dids, m < 2 ? dxrow : NULL, np, dx, m < 2 ? n_tok : np, dy, 0, NULL, 0);
                CK(cudaEventRecord(ev[1], 0));
                CK(cudaEventSynchronize(ev[1]));
                float t = 0;
                CK(cudaEventElapsedTime(&t, ev[0], ev[1]));
                if (rc != 0) printf("cuda_moe_matmul failed: %s\n", st_error_get());
                if (rep >= 0) ms[m] += t / (float)reps;
            }
        }
        cuda_mm_force_path(old);
        const float tot = ms[0] + ms[1] + ms[2];
        printf("time   moe pp512 layer (qwen3-30b-a3b experts, %s): gate %.1f us, up %.1f us, down %.1f us, "
               "total %.1f us (%.0f GB/s of weights)\n",
               mode ? "every expert on the host-grouped GEMM path" : "default path", 1e3 * ms[0], 1e3 * ms[1],
               1e3 * ms[2], 1e3 * tot, (double)wbytes / (tot * 1e-3) / 1e9);
    }
    for (int i = 0; i < 2; i++) CK(cudaEventDestroy(ev[i]));
    for (int m = 0; m < 3; m++) CK(cudaFree(dw[m]));
    CK(cudaFree(dx));
    CK(cudaFree(dy));
    CK(cudaFree(dids));
    CK(cudaFree(dxrow));
    free(ids), free(xrow), free(hx);
}

int main(void) {
    int n_dev = 0;
    if (cudaGetDeviceCount(&n_dev) != cudaSuccess || n_dev == 0) {
        printf("SKIPPED: no CUDA device\n");
        return 0;
    }
    static const qt_type types[] = {QT_F32,     QT_F16,    QT_BF16,   QT_Q4_0,    QT_Q4_1,   QT_Q5_0,
                                    QT_Q5_1,    QT_Q8_0,   QT_Q2_K,   QT_Q3_K,    QT_Q4_K,   QT_Q5_K,
                                    QT_Q6_K,    QT_IQ4_NL, QT_IQ4_XS, QT_IQ2_XXS, QT_IQ2_XS, QT_IQ2_S,
                                    QT_IQ3_XXS, QT_IQ3_S,  QT_IQ1_S,  QT_IQ1_M,   QT_MXFP4};
    const int nt = (int)(sizeof(types) / sizeof(types[0]));
    printf("path   format    rows x cols   tokens  NMSE vs double reference\n");
    for (int i = 0; i < nt; i++) {
        const qt_type t = types[i];
        if (!cuda_mm_supports(t)) {
            printf("%s: not supported\n", qt_get(t)->name);
            g_fail++;
            continue;
        }
        const int blk = qt_get(t)->blck;
        check_dense(t, 1024, 131, 1, 0);
        check_dense(t, 2048, 67, 3, 0);
        check_dense(t, 512, 1, 8, 0);
        check_dense(t, 768, 129, 13, 1);             /* matrix-vector in groups of 8 */
        check_dense(t, 1024, 131, 13, 0);            /* GEMM */
        check_dense(t, 256, 77, 2, 2);               /* GEMM forced at few tokens */
        if (blk == 32) check_dense(t, 96, 33, 5, 0); /* rows of 3 blocks: fewer units than lanes */
        if (blk == 1) {
            check_dense(t, 100, 45, 2, 0); /* unaligned rows: the scalar float kernel */
            check_dense(t, 100, 45, 20, 0);
        }
    }
    static const qt_type moe_types[] = {QT_Q4_K, QT_Q6_K, QT_IQ2_XXS, QT_BF16, QT_F16, QT_Q8_0};
    for (size_t i = 0; i < sizeof(moe_types) / sizeof(moe_types[0]); i++) {
        const qt_type t = moe_types[i];
        check_moe(t, 512, 96, 5, 12, 4, 1, 0);   /* decode: pairs on the device, table */
        check_moe(t, 512, 96, 5, 12, 4, 0, 0);   /* contiguous experts */
        check_moe(t, 512, 96, 5, 200, 50, 1, 0); /* grouped: GEMM for the busy expert, mmv groups */
        check_moe(t, 256, 40, 3, 150, 30, 0, 2); /* grouped: every expert through GEMM */
    }
    /* prompt chunks on the tensor-core path (moe_mma.cu): every quantized
     * format at a small shape (160 rows: a full and a partial 128-row tile),
     * then model-like shapes: Qwen3-30B-A3B's gate/up (2048 -> 768, 128
     * experts, top-8) and down (768 -> 2048, rows of x per pair), a hot
     * expert with more tokens than a tile, a cold one with none, skipped
     * pairs; past 65535 pairs (grouped in chunks); past 512 experts (the
     * host-grouped path). */
    for (int i = 0; i < nt; i++) {
        const qt_type t = types[i];
        if (t == QT_F32 || t == QT_F16 || t == QT_BF16) continue;
        check_moe_routed(t, 512, 160, 32, 100, 4, MR_HOT | MR_SKIP);
    }
    check_moe_routed(QT_Q4_K, 2048, 768, 128, 300, 8, MR_HOT | MR_COLD | MR_SKIP);
    check_moe_routed(QT_Q6_K, 768, 2048, 128, 300, 8, MR_HOT | MR_COLD | MR_XNULL);
    check_moe_routed(QT_Q8_0, 1024, 256, 128, 300, 8, MR_COLD);
    check_moe_routed(QT_Q4_0, 1024, 256, 128, 300, 8, MR_HOT | MR_SKIP);
    check_moe_routed(QT_IQ4_XS, 1024, 256, 128, 300, 8, MR_HOT | MR_COLD);
    check_moe_routed(QT_IQ2_XXS, 256, 256, 64, 300, 8, MR_HOT | MR_SKIP | MR_XNULL);
    check_moe_routed(QT_Q4_0, 256, 32, 8, 35000, 2, MR_SKIP | MR_XNULL);
    check_moe_routed(QT_Q4_K, 256, 40, 600, 100, 8, MR_SKIP);
    time_moe_layer();
    cuda_mm_release();
    printf("%d of %d checks passed\n", g_checks - g_fail, g_checks);
    return g_fail ? 1 : 0;
}
