/* Internal to quant/: the nibble unpacking that the AVX2 dot products, the
 * gemm tiles (quant_gemm_body.h) and the small-batch kernel share. Include
 * only from files built with AVX2 or more (*_avx2.c, *_avx512*.c). */
#ifndef STRATA_QUANT_SIMD_BITS_H
#define STRATA_QUANT_SIMD_BITS_H

#include <immintrin.h>
#include <stdint.h>

/* 16 packed nibbles -> 32 bytes: low nibbles first (weights 0..15), then high.
 * vbroadcasti128 from memory is a plain load and vpsrlvq shifts only the upper
 * copy, so no shuffle-port work (the 64-bit shift pulls bits across bytes, the
 * mask drops them). */
static inline __m256i qt_nibbles32(const uint8_t *p) {
    __m256i v = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)p));
    v = _mm256_srlv_epi64(v, _mm256_set_epi64x(4, 4, 0, 0));
    return _mm256_and_si256(v, _mm256_set1_epi8(0x0f));
}

#endif
