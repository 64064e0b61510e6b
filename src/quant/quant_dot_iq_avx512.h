/* Internal to quant/: helpers shared by the AVX-512 i-quant dot products
 * (quant_dot_iq_avx512.c: grid rows gathered or loaded; quant_dot_iq_avx512vbmi.c:
 * the grid held in registers). Include only from files built with AVX-512
 * flags (cmake/isa.cmake). */
#ifndef STRATA_QUANT_DOT_IQ_AVX512_H
#define STRATA_QUANT_DOT_IQ_AVX512_H

#include <immintrin.h>
#include <stdint.h>
#include <string.h>

#include "quant/quant_dot_iq_bits.h"

/* The 64 activations of step k, negated where the sign bit is set. */
static inline __m512i load_signed(const int8_t *q8, uint64_t signs) {
    const __m512i q = _mm512_loadu_si512(q8);
    return _mm512_mask_sub_epi8(q, (__mmask64)signs, _mm512_setzero_si512(), q);
}

/* vpermw index vectors spreading a per-block int16 scale vector over the
 * steps: idx(k) = base + k * step (k is a constant once the loop is unrolled). */
typedef struct {
    __m512i base;
    int step;
} scale_perm;

/* One scale per 32 weights at int16 lane stride*ib + off: lanes 0..15 of step
 * k take sub-block 2k, lanes 16..31 sub-block 2k+1. */
static inline scale_perm perm_per32(int stride, int off) {
    const __m512i half = _mm512_inserti64x4(_mm512_setzero_si512(), _mm256_set1_epi16((short)stride), 1);
    scale_perm p = {_mm512_add_epi16(half, _mm512_set1_epi16((short)off)), 2 * stride};
    return p;
}

/* One scale per 16 weights at int16 lane j: lanes 8j'..8j'+7 of step k take 4k+j'. */
static inline scale_perm perm_per16(void) {
    const __m512i quarter = _mm512_set_epi64(3, 3, 2, 2, 1, 1, 0, 0);
    const __m512i j = _mm512_or_si512(quarter, _mm512_slli_epi64(quarter, 16));
    scale_perm p = {_mm512_or_si512(j, _mm512_slli_epi64(j, 32)), 4};
    return p;
}

static inline __m512i perm_at(scale_perm p, int k) {
    return _mm512_add_epi16(p.base, _mm512_set1_epi16((short)(k * p.step)));
}

/* int16 odd scales 2s+1 from 16 nibbles (low nibble first), lanes 0..15. */
static inline __m512i odd_scales_nib16(uint64_t nibbles) {
    const uint64_t lo = _pdep_u64(nibbles, 0x0f0f0f0f0f0f0f0fULL);
    const uint64_t hi = _pdep_u64(nibbles >> 32, 0x0f0f0f0f0f0f0f0fULL);
    const __m256i s = _mm256_cvtepu8_epi16(_mm_set_epi64x((long long)hi, (long long)lo));
    return _mm512_zextsi256_si512(_mm256_add_epi16(_mm256_add_epi16(s, s), _mm256_set1_epi16(1)));
}

/* The 7-bit sign indices of a block's 8 sub-blocks (aux words: 4 x 7 bits,
 * scale in bits 28..31, one dword per sub-block) -> 32 sign bytes (group
 * 4ib+l at byte 4ib+l), with ksigns_iq2xs's parity rule: bit 7 = parity of
 * bits 0..6. In vector registers for the whole block: ~17 operations instead
 * of ~15 general-register ones per 64 weights. The 32-bit shifts only move
 * bits within a byte where it counts (bit 0 of each byte after >>4, >>2, >>1
 * comes from the same byte). */
static inline __m256i ksigns32(__m256i aux) {
    __m256i x = _mm256_and_si256(aux, _mm256_set1_epi32(0x7f));
    x = _mm256_ternarylogic_epi32(x, _mm256_slli_epi32(aux, 1), _mm256_set1_epi32(0x7f00), 0xf8); /* x | (b & c) */
    x = _mm256_ternarylogic_epi32(x, _mm256_slli_epi32(aux, 2), _mm256_set1_epi32(0x7f0000), 0xf8);
    x = _mm256_ternarylogic_epi32(x, _mm256_slli_epi32(aux, 3), _mm256_set1_epi32(0x7f000000), 0xf8);
    __m256i p = _mm256_xor_si256(x, _mm256_srli_epi32(x, 4));
    p = _mm256_xor_si256(p, _mm256_srli_epi32(p, 2));
    p = _mm256_xor_si256(p, _mm256_srli_epi32(p, 1));
    return _mm256_ternarylogic_epi32(x, _mm256_slli_epi32(p, 7), _mm256_set1_epi8((char)0x80), 0xf8);
}

#endif
