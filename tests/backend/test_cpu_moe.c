/* The CPU backend's one-dispatch forms against the forms they replace, bit
 * for bit:
 * - moe_experts with one routed expert per pool task (STRATA_CPU_EXPERT_TASKS=1)
 *   against every expert's rows split across the pool (=0): one token, 8 or
 *   3 pairs, some pairs not here (emap -1, sel -1), gate and up of the same
 *   and of different activation formats, biases and the clamped SwiGLU, 1-4
 *   threads; and "auto" takes the same path as one of the two;
 * - matmul_multi (the input quantized once per activation format, one
 *   dispatch) against a matmul per weight, 1 and 7 tokens, mixed formats.
 * Both forms run the same kernels on the same quantized rows, so any
 * difference at all is a wrong matrix, row, bias or activation buffer. How
 * close either is to exact arithmetic is backend_check_cpu's job.
 * Also the AVX-512 SiLU (cpu_act_avx512.c) against expf, where the CPU has
 * AVX-512: every length 0-40 (masked tails), large and tiny inputs. */
#include "backend/backend.h"
#include "backend/cpu/cpu_act.h"
#include "backend/cpu/cpu_ops.h"
#include "core/alloc.h"
#include "quant/quant.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../common/check.h"

static uint64_t rng = 88172645463325252ull;
static float frand(void) {
    rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
    return (float)((rng >> 40) * (1.0 / 16777216.0)) * 2.0f - 1.0f;
}

/* A stack of n_mat random valid matrices (n_out x n_in) of one format, with
 * per-expert biases when bias is set. */
static st_weight make_stack(qt_type type, int64_t n_out, int64_t n_in, int64_t n_mat, int bias, uint64_t seed) {
    st_weight w = {0};
    w.type = type;
    w.n_in = n_in;
    w.n_out = n_out;
    w.n_mat = n_mat;
    w.row_bytes = qt_row_size(type, n_in);
    uint8_t *d = st_malloc(w.row_bytes * (size_t)(n_out * n_mat));
    int bad = 0;
    for (int64_t r = 0; r < n_out * n_mat; r++)
        bad |= cpu_fill_random_blocks(type, d + (size_t)r * w.row_bytes, n_in / qt_get(type)->blck, seed + (uint64_t)r);
    CHECK(!bad, "fill %s", qt_get(type)->name);
    w.data = d;
    if (bias) {
        float *b = st_malloc(sizeof(float) * (size_t)(n_out * n_mat));
        for (int64_t i = 0; i < n_out * n_mat; i++) b[i] = 0.1f * frand();
        w.bias = b;
    }
    return w;
}

static void free_stack(st_weight *w) {
    st_free((void *)w->data);
    st_free((void *)w->bias);
}

static st_backend *cpu_with(const char *expert_tasks, int n_threads) {
    setenv("STRATA_CPU_EXPERT_TASKS", expert_tasks, 1);
    return backend_cpu_create(n_threads);
}

/* One token's experts through both splits (and auto); outputs must be equal. */
static void check_experts(qt_type tg, qt_type tu, qt_type td, int bias, st_act act, int k, int n_threads) {
    const int n_expert = 16, E = 512, F = 256;
    st_weight gate = make_stack(tg, F, E, n_expert, bias, 11), up = make_stack(tu, F, E, n_expert, bias, 22);
    st_weight down = make_stack(td, E, F, n_expert, bias, 33);
    float h[512], w8[8];
    for (int i = 0; i < E; i++) h[i] = frand();
    int32_t sel[8] = {3, 14, 0, 7, 9, -1, 12, 5}; /* -1: a choice NaN logits left empty */
    for (int j = 0; j < k; j++) w8[j] = 0.5f + 0.5f * frand();
    int32_t emap[16]; /* expert 9 is computed elsewhere; the others in reversed slots */
    for (int e = 0; e < n_expert; e++) emap[e] = e == 9 ? -1 : n_expert - 1 - e;
    for (int use_map = 0; use_map < 2; use_map++) {
        float out[3][512];
        const char *mode[3] = {"0", "1", "auto"};
        for (int m = 0; m < 3; m++) {
            st_backend *be = cpu_with(mode[m], n_threads);
            for (int i = 0; i < E; i++) out[m][i] = 1e30f; /* every value must be written */
            be->moe_experts(be, h, 1, n_expert, k, sel, w8, use_map ? emap : NULL, act, &gate, &up, &down, out[m]);
            be->destroy(be);
        }
        char what[160];
        snprintf(what, sizeof what, "moe_experts %s/%s/%s bias %d act %d k %d threads %d emap %d", qt_get(tg)->name,
                 qt_get(tu)->name, qt_get(td)->name, bias, (int)act, k, n_threads, use_map);
        double mag = 0;
        for (int i = 0; i < E; i++) mag += out[0][i] < 0 ? -out[0][i] : out[0][i];
        CHECK(mag > 1e-3 * E && mag < 1e6 * E, "%s: the rows split gave an empty or wild output (%g)", what, mag);
        CHECK(!memcmp(out[0], out[1], sizeof out[0]), "%s: experts as tasks differ from the rows split", what);
        CHECK(!memcmp(out[2], out[0], sizeof out[0]) || !memcmp(out[2], out[1], sizeof out[0]),
              "%s: auto matches neither", what);
    }
    free_stack(&gate);
    free_stack(&up);
    free_stack(&down);
}

/* matmul_multi against one matmul per weight. */
static void check_multi(int n_tok, int n_threads) {
    const int K = 512;
    const qt_type types[4] = {QT_Q4_K, QT_Q6_K, QT_Q8_0, QT_Q4_K};
    const int64_t rows[4] = {96, 32, 48, 16};
    st_weight w[4];
    for (int i = 0; i < 4; i++) w[i] = make_stack(types[i], rows[i], K, 1, 0, 100 + (uint64_t)i * 1000);
    float *x = st_malloc(sizeof(float) * (size_t)(n_tok * K));
    for (int i = 0; i < n_tok * K; i++) x[i] = frand();
    st_backend *be = cpu_with("auto", n_threads);
    float *ya[4], *yb[4];
    for (int i = 0; i < 4; i++) {
        ya[i] = st_malloc(sizeof(float) * (size_t)(n_tok * rows[i]));
        yb[i] = st_malloc(sizeof(float) * (size_t)(n_tok * rows[i]));
        be->matmul(be, &w[i], 0, x, ya[i], n_tok);
    }
    const st_weight *wp[4] = {&w[0], &w[1], &w[2], &w[3]};
    be->matmul_multi(be, 4, wp, x, yb, n_tok);
    for (int i = 0; i < 4; i++) {
        CHECK(!memcmp(ya[i], yb[i], sizeof(float) * (size_t)(n_tok * rows[i])),
              "matmul_multi weight %d (%s), %d tokens, %d threads: differs from its matmul", i, qt_get(types[i])->name,
              n_tok, n_threads);
        st_free(ya[i]);
        st_free(yb[i]);
        free_stack(&w[i]);
    }
    be->destroy(be);
    st_free(x);
}

/* The references in double. SiLU within 4 float ulps of the result; GELU
 * (tanh form) within 1e-6 of |g u|, the activation's scale: far left of
 * zero its result is a tiny part of that, whose relative error grows with
 * |z| in any float evaluation. */
static double silu_ref(double g) { return g / (1.0 + exp(-g)); }
static double gelu_ref(double x) { return 0.5 * x * (1.0 + tanh(0.7978845608028654 * (x + 0.044715 * x * x * x))); }

/* One AVX-512 gated activation against its reference: lengths 0..40 (the
 * masked tail), inputs up to +-6*spread and one round up to +-120 (e^-g
 * past float), nothing written past the end. */
static void check_act(const char *name, void (*fn)(const float *, const float *, float *, int64_t),
                      double (*ref_fn)(double), double spread, int of_input) {
    if (qt_cpu_isa() < QT_ISA_AVX512) {
        printf("AVX-512 %s: not checked (this CPU's path is %s)\n", name, qt_isa_name(qt_cpu_isa()));
        return;
    }
    float g[40], u[40], out[41];
    double worst = 0;
    for (int n = 0; n <= 40; n++)
        for (int rep = 0; rep < 4; rep++) {
            for (int i = 0; i < n; i++) {
                g[i] = rep == 3 ? 120.0f * frand() : (float)((rep + 1) * spread) * frand();
                u[i] = frand();
            }
            out[n] = 12345.0f; /* past the end: untouched */
            fn(g, u, out, n);
            for (int i = 0; i < n; i++) {
                const double ref = ref_fn(g[i]) * u[i];
                const double scale = of_input ? fabs((double)g[i] * u[i]) : fabs(ref);
                const double bound = of_input ? 1e-6 : 4.8e-7;
                if (scale > 1e-30 && fabs(out[i] - ref) / scale > worst) worst = fabs(out[i] - ref) / scale;
                CHECK(isfinite(out[i]) && fabs(out[i] - ref) <= bound * scale + 1e-37, "%s(%g) * %g: %g, expected %g",
                      name, g[i], u[i], out[i], ref);
            }
            CHECK(out[n] == 12345.0f, "%s over %d values wrote past them", name, n);
        }
    printf("AVX-512 %s: worst error %.2g of %s against double\n", name, worst, of_input ? "|g u|" : "the result");
}

int main(void) {
    check_act("silu", cpu_silu_mul_avx512, silu_ref, 6.0, 0);
    check_act("gelu", cpu_gelu_mul_avx512, gelu_ref, 3.0, 1);
    for (int t = 1; t <= 4; t++) {
        check_experts(QT_Q4_K, QT_Q4_K, QT_Q6_K, 0, ST_ACT_SILU, 8, t);
        check_experts(QT_Q4_K, QT_Q4_K, QT_Q6_K, 0, ST_ACT_SILU, 3, t);
        check_experts(QT_Q8_0, QT_Q4_K, QT_Q5_K, 1, ST_ACT_SWIGLU_OAI, 8, t);
        check_experts(QT_IQ4_XS, QT_IQ4_XS, QT_Q8_0, 0, ST_ACT_GELU, 8, t);
        check_multi(1, t);
        check_multi(7, t);
    }
    return check_report("cpu_moe");
}
