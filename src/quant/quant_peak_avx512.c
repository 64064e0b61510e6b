/* The AVX-512 VNNI gemm kernels' integer core at full rate, for
 * qt_int8_rate (quant_gemm.c): vpdpbusd on zmm (64 multiply-adds) or ymm
 * (32; the kernels use both widths), 12 independent accumulators so that
 * latency never limits. Which width is faster differs by core: one Zen 4
 * core ran 0.5 zmm or ~0.9 ymm per cycle (the same multiply-adds). */
#include <immintrin.h>

#include "quant/quant_gemm_impl.h"

uint64_t qt_peak_avx512(int64_t iters, int zmm) {
    if (zmm) {
        __m512i a[12];
        for (int k = 0; k < 12; k++) a[k] = _mm512_set1_epi32(k);
        const __m512i u = _mm512_set1_epi8(3), s = _mm512_set1_epi8(5);
        for (int64_t i = 0; i < iters; i++) {
#pragma GCC unroll 12
            for (int k = 0; k < 12; k++) a[k] = _mm512_dpbusd_epi32(a[k], u, s);
            __asm__ volatile("" : "+v"(a[0]), "+v"(a[1]), "+v"(a[2]), "+v"(a[3]), "+v"(a[4]), "+v"(a[5]));
            __asm__ volatile("" : "+v"(a[6]), "+v"(a[7]), "+v"(a[8]), "+v"(a[9]), "+v"(a[10]), "+v"(a[11]));
        }
        return (uint64_t)iters * 12 * 64;
    }
    __m256i a[12];
    for (int k = 0; k < 12; k++) a[k] = _mm256_set1_epi32(k);
    const __m256i u = _mm256_set1_epi8(3), s = _mm256_set1_epi8(5);
    for (int64_t i = 0; i < iters; i++) {
#pragma GCC unroll 12
        for (int k = 0; k < 12; k++) a[k] = _mm256_dpbusd_epi32(a[k], u, s);
        __asm__ volatile("" : "+v"(a[0]), "+v"(a[1]), "+v"(a[2]), "+v"(a[3]), "+v"(a[4]), "+v"(a[5]));
        __asm__ volatile("" : "+v"(a[6]), "+v"(a[7]), "+v"(a[8]), "+v"(a[9]), "+v"(a[10]), "+v"(a[11]));
    }
    return (uint64_t)iters * 12 * 32;
}
