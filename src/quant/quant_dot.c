/* CPU dot products: which ISA this CPU runs, the dispatcher over the per-ISA
 * kernel tables, and the activation quantizers.
 *
 * ISA detection asks cpuid for the instruction sets AND xgetbv for the OS's
 * promise to save the register state (ymm for AVX2, opmask+zmm for AVX-512):
 * a CPU with AVX-512 under an OS (or hypervisor) that does not save zmm must
 * not run the AVX-512 path. The AVX-512 path is compiled with F/BW/VL/DQ/VNNI
 * (src/quant/CMakeLists.txt), so it needs all five.
 *
 * AMX (the int8 tiles, for the gemm kernels only) needs three more yeses:
 * cpuid's AMX-TILE and AMX-INT8, XCR0's tile bits (17, 18), and Linux's
 * leave to use the tile data (arch_prctl ARCH_REQ_XCOMP_PERM, once per
 * process; without it the first tile instruction is a SIGILL).
 *
 * STRATA_ISA=scalar|avx2|avx512|amx lowers the choice of qt_cpu_isa() (to test or
 * compare paths); it never raises it above what the CPU runs. A bad value is
 * reported once and ignored.
 *
 * Activation formats (qt_quantize_act):
 *   Q8_0: d = absmax/127 stored as f16, q = round(x/d) (ties away from zero,
 *         as the gguf package and ggml), using the f32 d for the division.
 *   Q8_1: as Q8_0, plus s = f16(d * sum(q)) so Q4_1/Q5_1 add their min term
 *         with one multiply.
 *   Q8_K: d = absmax/127 kept in f32, q = round(x/d) in -127..127, and bsums
 *         the sums of each 16 quants. ggml maps the signed extreme value to
 *         -127 (a negative d when the extreme is positive); Q8_K is internal
 *         (never in a file), so we keep the symmetric positive-d convention:
 *         the kernels only need d*q to approximate x and |q| <= 127.
 *   F32:  a copy.
 * With AVX2 the quantizers run vectorised (quant_dot_avx2.c) and write the
 * same bytes as the scalar ones here (checked by tests/quant/test_dot.c).
 */
#include <cpuid.h>
#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#ifdef __linux__
#include <sys/syscall.h>
#include <unistd.h>
#endif

#include "core/fp16.h"
#include "core/log.h"
#include "core/switches.h"
#include "quant/dot_impl.h"
#include "quant/quant_dot_common.h"

/* ---- ISA detection ---- */

static uint64_t read_xcr0(void) {
    uint32_t lo, hi;
    __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
    return ((uint64_t)hi << 32) | lo;
}

static qt_isa detect_hw_isa(void) {
    unsigned a, b, c, d;
    if (!__get_cpuid(1, &a, &b, &c, &d)) return QT_ISA_SCALAR;
    int osxsave = (c >> 27) & 1, avx = (c >> 28) & 1, fma = (c >> 12) & 1, f16c = (c >> 29) & 1;
    if (!osxsave || !avx) return QT_ISA_SCALAR;
    uint64_t xcr0 = read_xcr0();
    if ((xcr0 & 0x6) != 0x6) return QT_ISA_SCALAR; /* xmm+ymm state not saved */
    if (!__get_cpuid_count(7, 0, &a, &b, &c, &d)) return QT_ISA_SCALAR;
    int avx2 = (b >> 5) & 1, bmi2 = (b >> 8) & 1;
    if (!(avx2 && fma && f16c && bmi2)) return QT_ISA_SCALAR;
    int f = (b >> 16) & 1, dq = (b >> 17) & 1, bw = (b >> 30) & 1, vl = (b >> 31) & 1;
    int vnni = (c >> 11) & 1;
    /* bits 5..7: opmask, upper halves of zmm0-15, zmm16-31 */
    int zmm_os = (xcr0 & 0xe0) == 0xe0;
    if (!(f && dq && bw && vl && vnni && zmm_os)) return QT_ISA_AVX2;
    /* edx bits 24, 25: AMX-TILE, AMX-INT8; xcr0 bits 17, 18: tile config and data */
    if (!((d >> 24) & 1) || !((d >> 25) & 1) || (xcr0 & 0x60000) != 0x60000) return QT_ISA_AVX512;
#ifdef __linux__
    if (syscall(SYS_arch_prctl, 0x1023 /* ARCH_REQ_XCOMP_PERM */, 18 /* XFEATURE_XTILEDATA */) == 0) return QT_ISA_AMX;
#endif
    return QT_ISA_AVX512;
}

/* AMD's gathers are slow enough that the AVX-512 i-quant kernels, built on
 * them, lose there. On AMD an AVX-512 request gets, per format, what ran
 * fastest on one Zen 5 core (tests/quant/test_dot speed table, in cache):
 * the AVX-512 kernel that loads grid rows one by one (IQ2_XXS: 8.9 GB/s;
 * gather 5.6, AVX2 6.2), else the AVX2 kernel where it beat the gathers
 * (IQ2_XS 6.8 vs 6.2, IQ2_S 9.4 vs 7.5, IQ3_XXS 7.4 vs 6.2; IQ3_S and IQ1_S
 * keep AVX-512). Intel keeps the gathers over the loads (one Xeon core with
 * AVX-512 VBMI: IQ2_XXS 4.0-4.7 GB/s gathered, 3.3-4.0 loaded). Both, with
 * VBMI, take the grid-in-registers kernels where they won (regs_wins): on
 * one Zen 4 core IQ3_XXS 8.9-9.3 GB/s from registers against 5.0 (AVX2),
 * IQ3_S 7.2-9.3 against 4.3 (gathers). */
static int detect_amd(void) {
    unsigned a, b, c, d;
    if (!__get_cpuid(0, &a, &b, &c, &d)) return 0;
    return b == 0x68747541u && d == 0x69746e65u && c == 0x444d4163u; /* "Auth" "enti" "cAMD" */
}

/* VBMI (vpermb, vpmultishiftqb), for the grid-in-registers i-quant kernels;
 * asked only where the AVX-512 path runs (the zmm state is saved). */
static int detect_vbmi(void) {
    unsigned a, b, c, d;
    if (!__get_cpuid_count(7, 0, &a, &b, &c, &d)) return 0;
    return (c >> 1) & 1;
}

/* Formats whose grid-in-registers kernel (quant_dot_iq_avx512vbmi.c) was
 * not slower than the gather on one Intel core and faster under contention,
 * and about twice the AMD path on one Zen 4 core (test_dot speed table, in
 * cache; docs/cpu-kernels.md): IQ2_XXS and IQ2_XS keep the gather (Intel) or
 * the AMD path under STRATA_IQ_GRID=auto. */
static int regs_wins(qt_type t) { return t == QT_IQ3_XXS || t == QT_IQ3_S; }

static qt_isa g_hw_isa, g_isa;
static int g_amd, g_vbmi;
static int g_iq_grid; /* STRATA_IQ_GRID: 0 auto, 1 gather, 2 regs */
static pthread_once_t g_isa_once = PTHREAD_ONCE_INIT;

static void isa_init(void) {
    g_hw_isa = detect_hw_isa();
    g_amd = detect_amd();
    g_vbmi = g_hw_isa >= QT_ISA_AVX512 && detect_vbmi();
    const char *grid = st_switch_get("STRATA_IQ_GRID");
    if (grid && *grid && strcmp(grid, "auto") != 0) {
        if (strcmp(grid, "gather") == 0) g_iq_grid = 1;
        else if (strcmp(grid, "regs") == 0) g_iq_grid = 2;
        else st_log(ST_LOG_ERROR, "STRATA_IQ_GRID=%s is not one of auto|gather|regs; ignored", grid);
    }
    g_isa = g_hw_isa;
    const char *env = st_switch_get("STRATA_ISA");
    if (!env || !*env) return;
    int want = -1;
    for (int i = 0; i < QT_ISA_COUNT; i++)
        if (strcmp(env, qt_isa_name((qt_isa)i)) == 0) want = i;
    if (want < 0) {
        st_log(ST_LOG_ERROR, "STRATA_ISA=%s is not one of scalar|avx2|avx512|amx; ignored", env);
        return;
    }
    if ((qt_isa)want < g_isa) g_isa = (qt_isa)want;
}

qt_isa qt_cpu_isa(void) {
    pthread_once(&g_isa_once, isa_init);
    return g_isa;
}

const char *qt_isa_name(qt_isa isa) {
    switch (isa) {
    case QT_ISA_SCALAR: return "scalar";
    case QT_ISA_AVX2: return "avx2";
    case QT_ISA_AVX512: return "avx512";
    case QT_ISA_AMX: return "amx";
    default: return "unknown";
    }
}

int qt_cpu_is_amd(void) {
    pthread_once(&g_isa_once, isa_init);
    return g_amd;
}

int qt_cpu_has_vbmi(void) {
    pthread_once(&g_isa_once, isa_init);
    return g_vbmi;
}

int qt_isa_supported(qt_isa isa) {
    pthread_once(&g_isa_once, isa_init);
    return isa >= QT_ISA_SCALAR && isa <= g_hw_isa;
}

/* ---- dispatch ---- */

static const qt_vec_dot_fn *const g_main[QT_ISA_COUNT] = {qt_dots_main_scalar, qt_dots_main_avx2, qt_dots_main_avx512};
static const qt_vec_dot_fn *const g_iq[QT_ISA_COUNT] = {qt_dots_iq_scalar, qt_dots_iq_avx2, qt_dots_iq_avx512};

qt_vec_dot_fn qt_vec_dot(qt_type t, qt_isa isa) {
    if ((int)t < 0 || t >= QT_COUNT) return NULL;
    pthread_once(&g_isa_once, isa_init);
    /* a path the CPU cannot run is never handed out, whatever was asked;
     * the dots have no tile kernels: AMX's are AVX-512's */
    int top = (int)isa > (int)g_hw_isa ? (int)g_hw_isa : (int)isa;
    if (top > QT_ISA_AVX512) top = QT_ISA_AVX512;
    for (int i = top; i >= 0; i--) {
        if (i == QT_ISA_AVX512 && g_vbmi && qt_dots_iq_avx512_regs[t] &&
            (g_iq_grid == 2 || (g_iq_grid == 0 && regs_wins(t))))
            return qt_dots_iq_avx512_regs[t];
        if (i == QT_ISA_AVX512 && g_amd) {
            if (qt_dots_iq_avx512_loads[t]) return qt_dots_iq_avx512_loads[t];
            if (t == QT_IQ2_XS || t == QT_IQ2_S || t == QT_IQ3_XXS) continue; /* to AVX2 */
        }
        if (g_main[i][t]) return g_main[i][t];
        if (g_iq[i][t]) return g_iq[i][t];
    }
    return NULL;
}

/* ---- activation quantizers ---- */

static float absmax(const float *x, int n) {
    float m = 0;
    for (int i = 0; i < n; i++) m = fmaxf(m, fabsf(x[i]));
    return m;
}

static void quantize_q8_0(const float *x, block_q8_0 *y, int64_t nb) {
    for (int64_t ib = 0; ib < nb; ib++, x += QK8_0) {
        float d = absmax(x, QK8_0) / 127.0f;
        float id = d != 0.0f ? 1.0f / d : 0.0f;
        y[ib].d = st_f32_to_f16(d);
        for (int j = 0; j < QK8_0; j++) y[ib].qs[j] = (int8_t)roundf(x[j] * id);
    }
}

static void quantize_q8_1(const float *x, block_q8_1 *y, int64_t nb) {
    for (int64_t ib = 0; ib < nb; ib++, x += QK8_1) {
        float d = absmax(x, QK8_1) / 127.0f;
        float id = d != 0.0f ? 1.0f / d : 0.0f;
        int sum = 0;
        for (int j = 0; j < QK8_1; j++) {
            y[ib].qs[j] = (int8_t)roundf(x[j] * id);
            sum += y[ib].qs[j];
        }
        y[ib].d = st_f32_to_f16(d);
        y[ib].s = st_f32_to_f16(d * (float)sum);
    }
}

static void quantize_q8_k(const float *x, block_q8_K *y, int64_t nb) {
    for (int64_t ib = 0; ib < nb; ib++, x += QK_K) {
        float amax = absmax(x, QK_K);
        if (amax == 0.0f) {
            memset(&y[ib], 0, sizeof y[ib]);
            continue;
        }
        float iscale = 127.0f / amax;
        for (int j = 0; j < QK_K; j++) {
            /* x*iscale can round to 127.00001: clamp so |q| <= 127 holds */
            float v = fminf(fmaxf(roundf(x[j] * iscale), -127.0f), 127.0f);
            y[ib].qs[j] = (int8_t)v;
        }
        for (int g = 0; g < QK_K / 16; g++) {
            int sum = 0;
            for (int j = 0; j < 16; j++) sum += y[ib].qs[16 * g + j];
            y[ib].bsums[g] = (int16_t)sum;
        }
        y[ib].d = 1.0f / iscale;
    }
}

void qdot_quantize_act_isa(qt_type vec_dot_type, const float *x, void *dst, int64_t n, qt_isa isa) {
    pthread_once(&g_isa_once, isa_init);
    const int simd = isa >= QT_ISA_AVX2 && g_hw_isa >= QT_ISA_AVX2;
    const int wide = isa >= QT_ISA_AVX512 && g_hw_isa >= QT_ISA_AVX512;
    switch (vec_dot_type) {
    case QT_F32: memcpy(dst, x, (size_t)n * sizeof(float)); return;
    case QT_Q8_0:
        ST_ASSERT(n % QK8_0 == 0);
        if (wide) qdot_quantize_q8_0_avx512(x, dst, n / QK8_0);
        else if (simd) qdot_quantize_q8_0_avx2(x, dst, n / QK8_0);
        else quantize_q8_0(x, dst, n / QK8_0);
        return;
    case QT_Q8_1:
        ST_ASSERT(n % QK8_1 == 0);
        if (wide) qdot_quantize_q8_1_avx512(x, dst, n / QK8_1);
        else if (simd) qdot_quantize_q8_1_avx2(x, dst, n / QK8_1);
        else quantize_q8_1(x, dst, n / QK8_1);
        return;
    case QT_Q8_K:
        ST_ASSERT(n % QK_K == 0);
        if (wide) qdot_quantize_q8_k_avx512(x, dst, n / QK_K);
        else if (simd) qdot_quantize_q8_k_avx2(x, dst, n / QK_K);
        else quantize_q8_k(x, dst, n / QK_K);
        return;
    default: ST_ASSERT(!"qt_quantize_act: not an activation format");
    }
}

void qt_quantize_act(qt_type vec_dot_type, const float *x, void *dst, int64_t n) {
    qdot_quantize_act_isa(vec_dot_type, x, dst, n, qt_cpu_isa());
}
