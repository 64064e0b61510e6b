/* The AVX2 gemm kernels' integer core at full rate, for qt_int8_rate
 * (quant_gemm.c): vpmaddubsw (32 u8 x s8 products summed in pairs) then
 * vpmaddwd against ones (the pairs summed into int32), 12 independent
 * chains so that latency never limits. 32 multiply-adds per pair. */
#include <immintrin.h>

#include "quant/quant_gemm_impl.h"

uint64_t qt_peak_avx2(int64_t iters) {
    __m256i x[12];
    for (int k = 0; k < 12; k++) x[k] = _mm256_set1_epi8((char)(k + 1));
    const __m256i w = _mm256_set1_epi8(3), ones = _mm256_set1_epi16(1);
    for (int64_t i = 0; i < iters; i++) {
#pragma GCC unroll 12
        for (int k = 0; k < 12; k++) x[k] = _mm256_madd_epi16(_mm256_maddubs_epi16(x[k], w), ones);
        __asm__ volatile("" : "+x"(x[0]), "+x"(x[1]), "+x"(x[2]), "+x"(x[3]), "+x"(x[4]), "+x"(x[5]));
        __asm__ volatile("" : "+x"(x[6]), "+x"(x[7]), "+x"(x[8]), "+x"(x[9]), "+x"(x[10]), "+x"(x[11]));
    }
    return (uint64_t)iters * 12 * 32;
}
