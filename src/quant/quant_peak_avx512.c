/* The AVX-512 VNNI gemm kernels' integer core at full rate, for
 * qt_int8_rate (quant_gemm.c): vpdpbusd on zmm (64 multiply-adds) or ymm
 * (32; the kernels use both widths), 12 independent accumulators so that
 * latency never limits. Which width is faster differs by core: one Zen 4
 * core ran 0.5 zmm or ~0.9 ymm per cycle (the same multiply-adds). */
#include <immintrin.h>

#include "quant/quant_gemm_impl.h"

/* iters rounds of 12 vpdpbusd of vector type V (set1_32 / set1_8 / dp: its
 * intrinsics); returns the multiply-adds (4 per int32 lane) */
#define PEAK_LOOP(V, set1_32, set1_8, dp)                                                                              \
    do {                                                                                                               \
        V a[12];                                                                                                       \
        for (int k = 0; k < 12; k++) a[k] = set1_32(k);                                                                \
        const V u = set1_8(3), s = set1_8(5);                                                                          \
        for (int64_t i = 0; i < iters; i++) {                                                                          \
            _Pragma("GCC unroll 12") for (int k = 0; k < 12; k++) a[k] = dp(a[k], u, s);                               \
            __asm__ volatile("" : "+v"(a[0]), "+v"(a[1]), "+v"(a[2]), "+v"(a[3]), "+v"(a[4]), "+v"(a[5]));             \
            __asm__ volatile("" : "+v"(a[6]), "+v"(a[7]), "+v"(a[8]), "+v"(a[9]), "+v"(a[10]), "+v"(a[11]));           \
        }                                                                                                              \
        return (uint64_t)iters * 12 * sizeof(V);                                                                       \
    } while (0)

uint64_t qt_peak_avx512(int64_t iters, int zmm) {
    if (zmm) PEAK_LOOP(__m512i, _mm512_set1_epi32, _mm512_set1_epi8, _mm512_dpbusd_epi32);
    PEAK_LOOP(__m256i, _mm256_set1_epi32, _mm256_set1_epi8, _mm256_dpbusd_epi32);
}
