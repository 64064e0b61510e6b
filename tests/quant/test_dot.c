/* Tests of the CPU dot products (qt_vec_dot) and activation quantizers
 * (qt_quantize_act), on every ISA path this CPU runs.
 *
 * For every weight type that has a dot product (main and i-quant tables),
 * every supported ISA, and rows of one block, 8 blocks, 13 blocks and 4096
 * weights (4096+37 for the float formats):
 *   weights  = random valid blocks (qt_testutil.h),
 *   acts     = Gaussian values quantized with qt_quantize_act,
 *   ref      = double-precision sum of qt_dequantize(weights) * qt_dequantize(acts),
 *   rel err  = |dot - ref| / sum|w_i * a_i|, required <= the format's bound.
 * Each SIMD path is also compared with the scalar path under the same bound.
 * The bounds (BOUNDS below) say why each is what it is.
 *
 * Also checked: the activation quantizers (error per element within half a
 * step, |q| <= 127, Q8_1's s and Q8_K's bsums consistent with the quants, a
 * zero row quantizes to zeros), the dispatcher (unknown types give NULL,
 * STRATA_ISA lowers qt_cpu_isa() but never raises it: run with --isa-env),
 * every AVX-512 i-quant variant directly (gather, loads, grid in registers:
 * bit-equal to the gather kernel), and which of them STRATA_IQ_GRID hands
 * out (run with --iq-grid-env).
 * Finally it prints the speed of each path on 4096-wide rows held in cache
 * (GB/s of weight bytes on one core); speed is reported, not asserted.
 */
#include <cpuid.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "qt_testutil.h"
#include "quant/quant.h"
#include "quant/dot_impl.h"         /* the AVX-512 i-quant variants, both run whatever the vendor */
#include "quant/quant_dot_common.h" /* qdot_quantize_act_isa: one quantizer path on demand */

#include "../common/check.h"

/* Relative bound vs sum|w_i*a_i| for each weight type.
 * - Integer paths (quants x int8 summed exactly in int32) differ from the
 *   reference only by float rounding of the per-block scale products and the
 *   float sum over blocks: ~1e-7 measured at most (4096 weights), so 1e-6.
 *   Tighter than float summation needs, on purpose: a kernel that gets an
 *   integer term slightly wrong (a sign-extended scale in vpdpwssd adds 1 per
 *   negative lane) lands near 3e-6 and must fail.
 * - F32/F16/BF16: float FMAs over up to 4096 terms in a different order than
 *   the double reference: worst case ~n/lanes * 2^-24; 1e-5.
 * - Q4_1/Q5_1: the min term uses Q8_1's s = f16(d * sum q), rounded to 11
 *   significant bits (relative 2^-11 = 4.9e-4 of |m * s|); |m*s| can exceed
 *   sum|w*a| a few times over on one block, so 4e-3.
 * - i-quants with a fractional grid offset (IQ1_S/IQ1_M: delta 1/8) and the
 *   other lattice formats are integer in their kernels too: 1e-6. */
static double bound_of(qt_type t) {
    switch (t) {
    case QT_Q4_1:
    case QT_Q5_1: return 4e-3;
    case QT_F32:
    case QT_F16:
    case QT_BF16: return 1e-5;
    default: return 1e-6;
    }
}

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void *xmalloc(size_t n) {
    void *p = malloc(n ? n : 1);
    if (!p) {
        fprintf(stderr, "out of memory\n");
        exit(2);
    }
    return p;
}

/* ---- activation quantizers ---- */

static void test_quantize_act(qtt_rng *r) {
    const int n = 1024;
    float *x = xmalloc(n * sizeof(float)), *back = xmalloc(n * sizeof(float));
    void *q = xmalloc(qt_row_size(QT_Q8_1, n) + qt_row_size(QT_Q8_K, n) + 4 * n);
    const qt_type kinds[] = {QT_F32, QT_Q8_0, QT_Q8_1, QT_Q8_K};
    for (size_t k = 0; k < sizeof kinds / sizeof kinds[0]; k++) {
        qt_type t = kinds[k];
        const int blck = qt_get(t)->blck;
        double worst = 0;
        for (int i = 0; i < n; i++) x[i] = qtt_gauss(r) * (i % 97 == 0 ? 8.0f : 1.0f);
        qt_quantize_act(t, x, q, n);
        qt_dequantize(t, q, back, n);
        for (int b = 0; b < n / blck; b++) {
            float amax = 0;
            for (int i = 0; i < blck; i++) amax = fmaxf(amax, fabsf(x[b * blck + i]));
            /* half a step, plus for f16 d the rounding of d itself times 127 */
            double step = amax / 127.0, tol = t == QT_F32 ? 0 : step * (0.5 + 127.0 / 2048.0) + 1e-12;
            for (int i = 0; i < blck; i++) {
                double e = fabs((double)back[b * blck + i] - x[b * blck + i]);
                if (step > 0 && e / step > worst) worst = e / step;
                CHECK(e <= tol, "%s: element %d error %g > %g", qt_get(t)->name, b * blck + i, e, tol);
            }
        }
        if (t == QT_Q8_1) {
            const block_q8_1 *y = q;
            for (int b = 0; b < n / QK8_1; b++) {
                int sum = 0;
                for (int i = 0; i < QK8_1; i++) sum += y[b].qs[i];
                double want = st_f16_to_f32(y[b].d) * sum, got = st_f16_to_f32(y[b].s);
                CHECK(fabs(got - want) <= 2e-3 * fabs(want) + 1e-6, "Q8_1 block %d: s %g vs d*sum %g", b, got, want);
            }
        }
        if (t == QT_Q8_K) {
            const block_q8_K *y = q;
            for (int b = 0; b < n / QK_K; b++)
                for (int g = 0; g < QK_K / 16; g++) {
                    int sum = 0;
                    for (int i = 0; i < 16; i++) {
                        sum += y[b].qs[16 * g + i];
                        CHECK(y[b].qs[16 * g + i] >= -127, "Q8_K quant -128");
                    }
                    CHECK(sum == y[b].bsums[g], "Q8_K block %d bsum %d: %d vs %d", b, g, y[b].bsums[g], sum);
                }
        }
        /* a zero row gives zeros, not NaN */
        memset(x, 0, n * sizeof(float));
        qt_quantize_act(t, x, q, n);
        qt_dequantize(t, q, back, n);
        int zeros = 1;
        for (int i = 0; i < n; i++) zeros &= back[i] == 0.0f;
        CHECK(zeros, "%s: zero row does not round-trip to zeros", qt_get(t)->name);
        printf("quantize_act %-5s: max error %.3f steps (<= 0.56), zero row ok\n", qt_get(t)->name, worst);
    }
    free(x);
    free(back);
    free(q);
}

/* Every ISA's activation quantizer must write the scalar path's bytes, also
 * on exact ties (x*id = k + 0.5, rounded away from zero) and on rows whose
 * largest value is negative. */
static void test_quantize_act_paths(qtt_rng *r) {
    const int n = 4096;
    float *x = xmalloc(n * sizeof(float));
    const size_t cap = qt_row_size(QT_Q8_K, n) + qt_row_size(QT_Q8_1, n);
    uint8_t *ref = xmalloc(cap), *got = xmalloc(cap);
    const qt_type kinds[] = {QT_Q8_0, QT_Q8_1, QT_Q8_K};
    for (size_t k = 0; k < sizeof kinds / sizeof kinds[0]; k++) {
        qt_type t = kinds[k];
        const int blck = qt_get(t)->blck;
        const size_t bytes = qt_row_size(t, n);
        for (int pass = 0; pass < 3; pass++) {
            for (int i = 0; i < n; i++) x[i] = qtt_gauss(r);
            if (pass == 1) /* ties: block max 127 makes id = 1, so halves are exact ties */
                for (int b = 0; b < n / blck; b++) {
                    x[b * blck] = 127.0f;
                    for (int i = 1; i < blck; i++) x[b * blck + i] = (float)((int)(qtt_next(r) % 254) - 127) + 0.5f;
                }
            if (pass == 2)
                for (int i = 0; i < n; i++) x[i] = -fabsf(x[i]);
            qdot_quantize_act_isa(t, x, ref, n, QT_ISA_SCALAR);
            for (int isa = 1; isa < QT_ISA_COUNT; isa++) {
                if (!qt_isa_supported((qt_isa)isa)) continue;
                memset(got, 0xa5, bytes);
                qdot_quantize_act_isa(t, x, got, n, (qt_isa)isa);
                CHECK(memcmp(ref, got, bytes) == 0, "%s quantize_act on %s differs from scalar (pass %d)",
                      qt_get(t)->name, qt_isa_name((qt_isa)isa), pass);
            }
        }
        /* speed of each path, n = 4096 (not asserted) */
        printf("quantize_act %-5s: every ISA writes the scalar bytes (random, ties, negative rows);", qt_get(t)->name);
        for (int isa = 0; isa < QT_ISA_COUNT; isa++) {
            if (!qt_isa_supported((qt_isa)isa)) continue;
            double best = 1e30;
            for (int rep = 0; rep < 20; rep++) {
                double t0 = now_s();
                qdot_quantize_act_isa(t, x, got, n, (qt_isa)isa);
                double dt = now_s() - t0;
                if (dt < best) best = dt;
            }
            printf(" %s %.1f us", qt_isa_name((qt_isa)isa), best * 1e6);
        }
        printf("\n");
    }
    free(x);
    free(ref);
    free(got);
}

/* ---- dot products vs the double reference ---- */

typedef struct {
    double max_err[QT_ISA_COUNT]; /* vs the double reference */
    double max_vs_scalar[QT_ISA_COUNT];
} type_result;

static void test_type(qt_type t, qtt_rng *r, type_result *res) {
    const qt_traits *tr = qt_get(t);
    const qt_type vt = tr->vec_dot_type;
    const int blck = tr->blck;
    /* 13 blocks: kernels that take 8 (or 2, 4) blocks per step plus a tail run both parts */
    int ns[5] = {blck, 8 * blck, 13 * blck, 4096, 0};
    if (blck == 1) ns[4] = 4096 + 37; /* float formats: a tail that is no multiple of 8 or 16 */
    for (int k = 0; k < 5; k++) {
        const int n = ns[k];
        if (n == 0) continue;
        const int trials = n >= 1024 ? 6 : 40;
        void *w = xmalloc(qt_row_size(t, n));
        void *act = xmalloc(qt_row_size(vt, n));
        float *x = xmalloc(n * sizeof(float)), *wf = xmalloc(n * sizeof(float)), *af = xmalloc(n * sizeof(float));
        for (int trial = 0; trial < trials; trial++) {
            qtt_fill_blocks(t, w, n / blck, r);
            for (int i = 0; i < n; i++) x[i] = qtt_gauss(r);
            qt_quantize_act(vt, x, act, n);
            qt_dequantize(t, w, wf, n);
            qt_dequantize(vt, act, af, n);
            double ref = 0, mag = 0;
            for (int i = 0; i < n; i++) {
                ref += (double)wf[i] * af[i];
                mag += fabs((double)wf[i] * af[i]);
            }
            if (mag == 0) mag = 1e-30;
            float scalar = NAN;
            for (int isa = 0; isa < QT_ISA_COUNT; isa++) {
                if (!qt_isa_supported((qt_isa)isa)) continue;
                qt_vec_dot_fn fn = qt_vec_dot(t, (qt_isa)isa);
                float got = NAN;
                fn(n, &got, w, act);
                if (isa == QT_ISA_SCALAR) scalar = got;
                double e = fabs((double)got - ref) / mag;
                if (!(e <= res->max_err[isa])) res->max_err[isa] = isnan(e) ? INFINITY : e;
                double es = fabs((double)got - scalar) / mag;
                if (!(es <= res->max_vs_scalar[isa])) res->max_vs_scalar[isa] = isnan(es) ? INFINITY : es;
            }
        }
        free(w);
        free(act);
        free(x);
        free(wf);
        free(af);
    }
}

/* ---- AVX-512 i-quant kernels: grid rows gathered, loaded one by one, or
 * looked up in registers ----
 * qt_vec_dot hands out, by CPU vendor and VBMI, the gather kernel, the one
 * loading grid rows one by one, the one holding the grid in registers or the
 * AVX2 one (quant_dot.c), so some would go untested on a given machine: every
 * AVX-512 i-quant kernel runs here (the register ones where the CPU has
 * VBMI). Each must be within the format's bound of the scalar dot; a loads or
 * registers variant does the gather kernel's integer and float operations in
 * the same order, so each must agree with it bit for bit. Returns the number
 * of formats checked. */
static int test_iq_avx512_tables(qtt_rng *r) {
    if (!qt_isa_supported(QT_ISA_AVX512)) return 0;
    int n_types = 0;
    for (int ti = 0; ti < QT_COUNT; ti++) {
        const qt_type t = (qt_type)ti;
        const qt_vec_dot_fn loads = qt_dots_iq_avx512_loads[t], gather = qt_dots_iq_avx512[t];
        const qt_vec_dot_fn regs = qt_cpu_has_vbmi() ? qt_dots_iq_avx512_regs[t] : NULL;
        CHECK(!loads || gather, "%s: a loads variant but no gather kernel", qt_get(t)->name);
        CHECK(!qt_dots_iq_avx512_regs[t] || gather, "%s: a registers variant but no gather kernel", qt_get(t)->name);
        if (!gather) continue;
        n_types++;
        const qt_traits *tr = qt_get(t);
        const int ns[3] = {tr->blck, 13 * tr->blck, 4096};
        double worst = 0;
        int same = 1, same_regs = 1;
        for (int k = 0; k < 3; k++)
            for (int trial = 0; trial < 8; trial++) {
                const int n = ns[k];
                void *w = xmalloc(qt_row_size(t, n)), *act = xmalloc(qt_row_size(tr->vec_dot_type, n));
                float *x = xmalloc(n * sizeof(float)), *wf = xmalloc(n * sizeof(float));
                float *af = xmalloc(n * sizeof(float));
                qtt_fill_blocks(t, w, n / tr->blck, r);
                for (int i = 0; i < n; i++) x[i] = qtt_gauss(r);
                qt_quantize_act(tr->vec_dot_type, x, act, n);
                qt_dequantize(t, w, wf, n);
                qt_dequantize(tr->vec_dot_type, act, af, n);
                double mag = 0;
                for (int i = 0; i < n; i++) mag += fabs((double)wf[i] * af[i]);
                float ref, a = NAN, b = NAN, c = NAN;
                qt_vec_dot(t, QT_ISA_SCALAR)(n, &ref, w, act);
                gather(n, &a, w, act);
                if (loads) loads(n, &b, w, act);
                else b = a;
                if (regs) regs(n, &c, w, act);
                else c = a;
                same &= memcmp(&a, &b, sizeof a) == 0;
                same_regs &= memcmp(&a, &c, sizeof a) == 0;
                const double e = fmax(fmax(fabs((double)a - ref), fabs((double)b - ref)), fabs((double)c - ref)) /
                                 (mag > 0 ? mag : 1e-30);
                if (!(e <= worst)) worst = isnan(e) ? INFINITY : e;
                free(w);
                free(act);
                free(x);
                free(wf);
                free(af);
            }
        CHECK(same, "%s: gather and loads variants differ", tr->name);
        CHECK(same_regs, "%s: gather and registers variants differ", tr->name);
        CHECK(worst <= bound_of(t), "%s: avx512 variant %.3e from scalar > %.1e", tr->name, worst, bound_of(t));
        printf("%-8s avx512 gather kernel%s%s: %.3e vs scalar (bound %.1e)\n", tr->name,
               loads ? (same ? " and loads variant (bit-equal)" : " and loads variant (NOT bit-equal)") : "",
               regs ? (same_regs ? " and registers variant (bit-equal)" : " and registers variant (NOT bit-equal)")
                    : "",
               worst, bound_of(t));
    }
    return n_types;
}

static double speed_fn_gbs(qt_type t, qt_vec_dot_fn fn, qtt_rng *r);

/* ---- speed: 4096-wide rows, 16 of them (<= 70 KB of weights: in L2) ---- */

static double speed_gbs(qt_type t, qt_isa isa, qtt_rng *r) { return speed_fn_gbs(t, qt_vec_dot(t, isa), r); }

static double speed_fn_gbs(qt_type t, qt_vec_dot_fn fn, qtt_rng *r) {
    const qt_traits *tr = qt_get(t);
    const int n = 4096, rows = 16;
    const size_t rs = qt_row_size(t, n);
    uint8_t *w = xmalloc(rs * rows);
    void *act = xmalloc(qt_row_size(tr->vec_dot_type, n));
    float *x = xmalloc(n * sizeof(float));
    qtt_fill_blocks(t, w, (int64_t)rows * n / tr->blck, r);
    for (int i = 0; i < n; i++) x[i] = qtt_gauss(r);
    qt_quantize_act(tr->vec_dot_type, x, act, n);
    volatile float sink = 0;
    float out;
    double best = 1e30;
    /* best of many single passes (microseconds each): on a shared machine the
     * passes that nothing preempted give the speed */
    for (int rep = 0; rep < 400; rep++) {
        double t0 = now_s();
        for (int i = 0; i < rows; i++) {
            fn(n, &out, w + i * rs, act);
            sink += out;
        }
        double dt = now_s() - t0;
        if (dt < best) best = dt;
    }
    (void)sink; /* clang: "set but not used" is an error under -Werror */
    free(w);
    free(act);
    free(x);
    return (double)rs * rows / best / 1e9;
}

/* ---- dispatcher and STRATA_ISA ---- */

static void test_dispatch(void) {
    CHECK(qt_vec_dot((qt_type)-1, QT_ISA_SCALAR) == NULL, "negative type id gives a kernel");
    CHECK(qt_vec_dot((qt_type)QT_COUNT, QT_ISA_SCALAR) == NULL, "type id QT_COUNT gives a kernel");
    CHECK(qt_vec_dot((qt_type)1000, QT_ISA_AVX512) == NULL, "type id 1000 gives a kernel");
    CHECK(qt_vec_dot(QT_Q8_K, QT_ISA_SCALAR) == NULL, "Q8_K (activation only) has a dot");
    CHECK(qt_isa_supported(QT_ISA_SCALAR), "scalar path unsupported");
    CHECK(!qt_isa_supported((qt_isa)QT_ISA_COUNT), "ISA past the table supported");
    CHECK(qt_isa_supported(qt_cpu_isa()), "qt_cpu_isa() returns an unsupported ISA");
    /* asking a path above the CPU's must still give a runnable kernel */
    qt_vec_dot_fn top = qt_vec_dot(QT_Q8_0, QT_ISA_AVX512);
    int hw = 0;
    for (int i = 0; i < QT_ISA_COUNT; i++)
        if (qt_isa_supported((qt_isa)i)) hw = i;
    CHECK(top == qt_vec_dot(QT_Q8_0, (qt_isa)hw), "avx512 request not lowered to the CPU's best");
    printf("dispatch: bad ids -> NULL, best hardware ISA %s, qt_cpu_isa() %s\n", qt_isa_name((qt_isa)hw),
           qt_isa_name(qt_cpu_isa()));
}

/* --isa-env: STRATA_ISA is set by CTest; qt_cpu_isa() must be min(request, hardware),
 * or the hardware's best for a bad value. */
static int run_isa_env(void) {
    const char *env = getenv("STRATA_ISA");
    int hw = 0;
    for (int i = 0; i < QT_ISA_COUNT; i++)
        if (qt_isa_supported((qt_isa)i)) hw = i;
    int want = hw;
    for (int i = 0; i < QT_ISA_COUNT; i++)
        if (env && strcmp(env, qt_isa_name((qt_isa)i)) == 0) want = i < hw ? i : hw;
    qt_isa got = qt_cpu_isa();
    printf("STRATA_ISA=%s: hardware %s, qt_cpu_isa() %s, expected %s\n", env ? env : "(unset)", qt_isa_name((qt_isa)hw),
           qt_isa_name(got), qt_isa_name((qt_isa)want));
    CHECK((int)got == want, "qt_cpu_isa() %s, expected %s", qt_isa_name(got), qt_isa_name((qt_isa)want));
    CHECK(qt_cpu_isa() == got, "qt_cpu_isa() not stable");
    return check_report("isa-env");
}

/* --iq-grid-env: STRATA_IQ_GRID is set by CTest (unset: auto). On a CPU
 * with VBMI (Intel or AMD), gather must hand out no grid-in-registers kernel,
 * regs every one there is, auto exactly those of quant_dot.c's regs_wins
 * (IQ3_XXS, IQ3_S); without VBMI never one. */
static int run_iq_grid_env(void) {
    const char *env = getenv("STRATA_IQ_GRID");
    const char *mode = env && *env ? env : "auto";
    unsigned a, b, c, d;
    const int amd = __get_cpuid(0, &a, &b, &c, &d) && b == 0x68747541u; /* "Auth" */
    const int can = qt_cpu_has_vbmi();
    int n_regs = 0;
    for (int ti = 0; ti < QT_COUNT; ti++) {
        const qt_vec_dot_fn regs = qt_dots_iq_avx512_regs[ti];
        if (!regs) continue;
        const int got = qt_vec_dot((qt_type)ti, QT_ISA_AVX512) == regs;
        const int want =
            can && (strcmp(mode, "regs") == 0 || (strcmp(mode, "auto") == 0 && (ti == QT_IQ3_XXS || ti == QT_IQ3_S)));
        n_regs += got;
        CHECK(got == want, "STRATA_IQ_GRID=%s: %s %s the registers kernel", mode, qt_get((qt_type)ti)->name,
              got ? "got" : "did not get");
    }
    printf("STRATA_IQ_GRID=%s: VBMI %d, AMD %d: %d formats dispatch to the grid-in-registers kernel\n", mode,
           qt_cpu_has_vbmi(), amd, n_regs);
    return check_report("iq-grid-env");
}

int main(int argc, char **argv) {
    if (argc > 1 && strcmp(argv[1], "--isa-env") == 0) return run_isa_env();
    if (argc > 1 && strcmp(argv[1], "--iq-grid-env") == 0) return run_iq_grid_env();
    int do_speed = !(argc > 1 && strcmp(argv[1], "--no-speed") == 0);
    int speed_only = argc > 1 && strcmp(argv[1], "--speed-only") == 0;
    qtt_rng r = {0x243f6a8885a308d3ULL};
    if (speed_only) goto speed;

    for (int isa = 0; isa < QT_ISA_COUNT; isa++)
        if (!qt_isa_supported((qt_isa)isa))
            printf("skipped: CPU lacks %s (its rows below are not run)\n", qt_isa_name((qt_isa)isa));
    test_dispatch();
    test_quantize_act(&r);
    test_quantize_act_paths(&r);

    printf("\n%-8s %-7s %12s %12s %9s  %s\n", "type", "isa", "max rel err", "vs scalar", "bound", "result");
    int ntypes = 0;
    for (int ti = 0; ti < QT_COUNT; ti++) {
        qt_type t = (qt_type)ti;
        if (!qt_get(t) || !qt_vec_dot(t, QT_ISA_SCALAR)) continue;
        ntypes++;
        type_result res;
        memset(&res, 0, sizeof res);
        test_type(t, &r, &res);
        double bound = bound_of(t);
        for (int isa = 0; isa < QT_ISA_COUNT; isa++) {
            if (!qt_isa_supported((qt_isa)isa)) {
                printf("%-8s %-7s %12s %12s %9.1e  skipped: CPU lacks %s\n", qt_get(t)->name, qt_isa_name((qt_isa)isa),
                       "-", "-", bound, qt_isa_name((qt_isa)isa));
                continue;
            }
            int ok = res.max_err[isa] <= bound && res.max_vs_scalar[isa] <= bound;
            if (!ok) check_fail();
            printf("%-8s %-7s %12.3e %12.3e %9.1e  %s\n", qt_get(t)->name, qt_isa_name((qt_isa)isa), res.max_err[isa],
                   res.max_vs_scalar[isa], bound, ok ? "PASS" : "FAIL");
        }
    }
    printf("checked %d weight types with a dot product\n", ntypes);
    CHECK(ntypes >= 16, "only %d types have a dot product", ntypes);
    const int n_iq = test_iq_avx512_tables(&r);
    printf("checked the AVX-512 table of %d i-quant formats directly\n", n_iq);
    if (qt_isa_supported(QT_ISA_AVX512)) CHECK(n_iq >= 7, "only %d AVX-512 i-quant kernels checked", n_iq);

speed:
    if (do_speed) {
        printf("\nspeed, one core, 16 rows of 4096 weights in cache (GB/s of weights; not asserted)\n");
        printf("%-8s", "type");
        for (int isa = 0; isa < QT_ISA_COUNT; isa++)
            if (qt_isa_supported((qt_isa)isa)) printf(" %8s", qt_isa_name((qt_isa)isa));
        printf("\n");
        for (int ti = 0; ti < QT_COUNT; ti++) {
            qt_type t = (qt_type)ti;
            if (!qt_get(t) || !qt_vec_dot(t, QT_ISA_SCALAR)) continue;
            printf("%-8s", qt_get(t)->name);
            for (int isa = 0; isa < QT_ISA_COUNT; isa++)
                if (qt_isa_supported((qt_isa)isa)) printf(" %8.2f", speed_gbs(t, (qt_isa)isa, &r));
            printf("\n");
        }
        if (qt_isa_supported(QT_ISA_AVX512))
            for (int ti = 0; ti < QT_COUNT; ti++)
                if (qt_dots_iq_avx512_loads[ti])
                    printf("%-8s avx512 grid rows gathered %.2f, loaded one by one %.2f GB/s\n",
                           qt_get((qt_type)ti)->name, speed_fn_gbs((qt_type)ti, qt_dots_iq_avx512[ti], &r),
                           speed_fn_gbs((qt_type)ti, qt_dots_iq_avx512_loads[ti], &r));
        if (qt_cpu_has_vbmi())
            for (int ti = 0; ti < QT_COUNT; ti++)
                if (qt_dots_iq_avx512_regs[ti])
                    printf("%-8s avx512 grid rows gathered %.2f, grid in registers %.2f GB/s\n",
                           qt_get((qt_type)ti)->name, speed_fn_gbs((qt_type)ti, qt_dots_iq_avx512[ti], &r),
                           speed_fn_gbs((qt_type)ti, qt_dots_iq_avx512_regs[ti], &r));
    }
    printf("\n");
    return check_report("test_dot");
}
