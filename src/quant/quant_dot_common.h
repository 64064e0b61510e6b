/* Internal to the "main" dot-product kernels (quant_dot_*.c): small decoders
 * that the scalar, AVX2 and AVX-512 paths share so that every path reads a
 * block's packed fields the same way.
 *
 * Everything is static inline and ISA-neutral (plain C), so it compiles in
 * the baseline file and in the files built with -mavx2 / -mavx512*.
 */
#ifndef STRATA_QUANT_DOT_COMMON_H
#define STRATA_QUANT_DOT_COMMON_H

#include <stdint.h>
#include <string.h>

#include "core/fp16.h"
#include "quant/blocks.h"

#include "quant/iq_tables.h"
#include "quant/quant.h"

/* Activation quantizers of the AVX2 path (quant_dot_avx2.c), bit-identical
 * to the scalar ones; nb = number of blocks. */
void qdot_quantize_q8_0_avx2(const float *x, block_q8_0 *y, int64_t nb);
void qdot_quantize_q8_1_avx2(const float *x, block_q8_1 *y, int64_t nb);
void qdot_quantize_q8_k_avx2(const float *x, block_q8_K *y, int64_t nb);
/* The same 16 lanes wide (quant_dot_avx512.c), the same bytes. */
void qdot_quantize_q8_0_avx512(const float *x, block_q8_0 *y, int64_t nb);
void qdot_quantize_q8_1_avx512(const float *x, block_q8_1 *y, int64_t nb);
void qdot_quantize_q8_k_avx512(const float *x, block_q8_K *y, int64_t nb);

/* qt_quantize_act on a chosen ISA path (clamped to what the CPU runs); the
 * tests use it to check that every path writes the same bytes. */
void qdot_quantize_act_isa(qt_type vec_dot_type, const float *x, void *dst, int64_t n, qt_isa isa);

/* The 8 6-bit scales and 8 6-bit mins of a Q4_K / Q5_K super-block, unpacked
 * into bytes: sc[j] and mn[j] for sub-block j (32 weights each).
 * Packing (12 bytes s): j<4: sc=s[j]&63, mn=s[j+4]&63; j>=4: the low 4 bits
 * come from s[j+4] (sc low nibble, mn high nibble), the top 2 bits from the
 * top bits of s[j-4] (sc) and s[j] (mn). Done on 32-bit words: 4 at a time. */
static inline void qdot_k4_scales(const uint8_t s[12], uint8_t sc[8], uint8_t mn[8]) {
    uint32_t w0, w1, w2;
    memcpy(&w0, s, 4);
    memcpy(&w1, s + 4, 4);
    memcpy(&w2, s + 8, 4);
    uint32_t sc_lo = w0 & 0x3f3f3f3fu;
    uint32_t mn_lo = w1 & 0x3f3f3f3fu;
    uint32_t sc_hi = (w2 & 0x0f0f0f0fu) | ((w0 >> 2) & 0x30303030u);
    uint32_t mn_hi = ((w2 >> 4) & 0x0f0f0f0fu) | ((w1 >> 2) & 0x30303030u);
    memcpy(sc, &sc_lo, 4);
    memcpy(sc + 4, &sc_hi, 4);
    memcpy(mn, &mn_lo, 4);
    memcpy(mn + 4, &mn_hi, 4);
}

/* qdot_k4_scales into two 64-bit words (byte j = sub-block j), for kernels
 * that move them straight into a vector register. */
static inline void qdot_k4_scales64(const uint8_t s[12], uint64_t *sc, uint64_t *mn) {
    uint32_t w0, w1, w2;
    memcpy(&w0, s, 4);
    memcpy(&w1, s + 4, 4);
    memcpy(&w2, s + 8, 4);
    const uint64_t sc_lo = w0 & 0x3f3f3f3fu, mn_lo = w1 & 0x3f3f3f3fu;
    const uint64_t sc_hi = (w2 & 0x0f0f0f0fu) | ((w0 >> 2) & 0x30303030u);
    const uint64_t mn_hi = ((w2 >> 4) & 0x0f0f0f0fu) | ((w1 >> 2) & 0x30303030u);
    *sc = sc_lo | sc_hi << 32;
    *mn = mn_lo | mn_hi << 32;
}

/* The 16 signed 6-bit scales of a Q3_K super-block (value - 32), one per 16
 * weights. Low 4 bits: scales 0..7 in the low nibbles of s[0..7], 8..15 in
 * their high nibbles; top 2 bits: scale i in bits 2*(i/4) of s[8 + i%4]. */
static inline void qdot_q3k_scales(const uint8_t s[12], int8_t out[16]) {
    /* on 32-bit words, 4 scales at a time: scales 4k..4k+3 take their low
     * nibbles from word k%2 (shifted by 4 for k >= 2) and their top bits from
     * bits 2k..2k+1 of each byte of word 2 */
    uint32_t w0, w1, w2, r[4];
    memcpy(&w0, s, 4);
    memcpy(&w1, s + 4, 4);
    memcpy(&w2, s + 8, 4);
    r[0] = (w0 & 0x0f0f0f0fu) | ((w2 & 0x03030303u) << 4);
    r[1] = (w1 & 0x0f0f0f0fu) | (((w2 >> 2) & 0x03030303u) << 4);
    r[2] = ((w0 >> 4) & 0x0f0f0f0fu) | (((w2 >> 4) & 0x03030303u) << 4);
    r[3] = ((w1 >> 4) & 0x0f0f0f0fu) | (((w2 >> 6) & 0x03030303u) << 4);
    uint8_t u[16];
    memcpy(u, r, 16);
    for (int i = 0; i < 16; i++) out[i] = (int8_t)(u[i] - 32);
}

/* IQ4_XS: signed 6-bit scale (value - 32) of sub-block ib (32 weights). */
static inline int qdot_iq4xs_scale(const block_iq4_xs *b, int ib) {
    int lo = (b->scales_l[ib / 2] >> (4 * (ib % 2))) & 0xf;
    int hi = (b->scales_h >> (2 * ib)) & 3;
    return (lo | (hi << 4)) - 32;
}

/* MXFP4's E8M0 exponent as a float scale, halved because kvalues_mxfp4 holds
 * the E2M1 values doubled (so that they are integers). e < 2 gives the f32
 * subnormals 2^-128 and 2^-127; otherwise 2^(e-128) is a plain exponent. */
static inline float qdot_e8m0_half(uint8_t e) {
    uint32_t bits = e < 2 ? 0x00200000u << e : (uint32_t)(e - 1) << 23;
    return st_bits_to_f32(bits);
}

#endif
