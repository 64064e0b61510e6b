/* Internal to quant/: the per-format reference functions behind the type
 * table (quant_table.c).
 *
 * Dequantizers (quant_ref_*.c) are named qt_dequant_<lower name>, quantizers
 * (quant_quantize*.c) qt_quantize_<lower name>. Each takes whole blocks: n is
 * the number of weights, a multiple of the format's block size. Public code
 * calls qt_dequantize()/qt_quantize() (quant.h), which check n and dispatch.
 */
#ifndef STRATA_QUANT_QUANT_IMPL_H
#define STRATA_QUANT_QUANT_IMPL_H

#include <stdint.h>
#include <string.h>

#include "quant/quant.h"

/* ---- reference dequantizers: quant_ref_k.c (floats, ints, legacy, K-quants) ---- */
void qt_dequant_f32(const void *src, float *dst, int64_t n);
void qt_dequant_f16(const void *src, float *dst, int64_t n);
void qt_dequant_bf16(const void *src, float *dst, int64_t n);
void qt_dequant_f64(const void *src, float *dst, int64_t n);
void qt_dequant_i8(const void *src, float *dst, int64_t n);
void qt_dequant_i16(const void *src, float *dst, int64_t n);
void qt_dequant_i32(const void *src, float *dst, int64_t n);
void qt_dequant_i64(const void *src, float *dst, int64_t n);
void qt_dequant_q4_0(const void *src, float *dst, int64_t n);
void qt_dequant_q4_1(const void *src, float *dst, int64_t n);
void qt_dequant_q5_0(const void *src, float *dst, int64_t n);
void qt_dequant_q5_1(const void *src, float *dst, int64_t n);
void qt_dequant_q8_0(const void *src, float *dst, int64_t n);
void qt_dequant_q8_1(const void *src, float *dst, int64_t n);
void qt_dequant_q2_k(const void *src, float *dst, int64_t n);
void qt_dequant_q3_k(const void *src, float *dst, int64_t n);
void qt_dequant_q4_k(const void *src, float *dst, int64_t n);
void qt_dequant_q5_k(const void *src, float *dst, int64_t n);
void qt_dequant_q6_k(const void *src, float *dst, int64_t n);
void qt_dequant_q8_k(const void *src, float *dst, int64_t n);

/* ---- reference dequantizers: quant_ref_iq.c (i-quants, MXFP4) ---- */
void qt_dequant_iq2_xxs(const void *src, float *dst, int64_t n);
void qt_dequant_iq2_xs(const void *src, float *dst, int64_t n);
void qt_dequant_iq2_s(const void *src, float *dst, int64_t n);
void qt_dequant_iq3_xxs(const void *src, float *dst, int64_t n);
void qt_dequant_iq3_s(const void *src, float *dst, int64_t n);
void qt_dequant_iq1_s(const void *src, float *dst, int64_t n);
void qt_dequant_iq1_m(const void *src, float *dst, int64_t n);
void qt_dequant_iq4_nl(const void *src, float *dst, int64_t n);
void qt_dequant_iq4_xs(const void *src, float *dst, int64_t n);
void qt_dequant_mxfp4(const void *src, float *dst, int64_t n);

/* Shared decoders of packed scale fields (also used by the dot products). */

/* Q4_K/Q5_K: scale and min of sub-block j (0..7) from the 12 packed bytes. */
static inline void qt_get_scale_min_k4(int j, const uint8_t *q, uint8_t *sc, uint8_t *m) {
    if (j < 4) {
        *sc = q[j] & 63;
        *m = q[j + 4] & 63;
    } else {
        *sc = (uint8_t)((q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4));
        *m = (uint8_t)((q[j + 4] >> 4) | ((q[j] >> 6) << 4));
    }
}

/* MXFP4: E8M0 exponent e -> 2^(e-128) as f32, i.e. half the block scale,
 * because kvalues_mxfp4 holds doubled E2M1 values. e < 2 gives subnormals;
 * e = 255 gives 2^127 (finite: this is the gguf/ggml convention, not NaN). */
static inline float qt_e8m0_to_f32_half(uint8_t e) {
    uint32_t bits = e < 2 ? 0x00200000u << e : (uint32_t)(e - 1) << 23;
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

/* ---- reference quantizers from f32 (quant_quantize*.c, helper-owned) ---- */
void qt_quantize_f32(const float *src, void *dst, int64_t n);
void qt_quantize_f16(const float *src, void *dst, int64_t n);
void qt_quantize_bf16(const float *src, void *dst, int64_t n);
void qt_quantize_q4_0(const float *src, void *dst, int64_t n);
void qt_quantize_q4_1(const float *src, void *dst, int64_t n);
void qt_quantize_q5_0(const float *src, void *dst, int64_t n);
void qt_quantize_q5_1(const float *src, void *dst, int64_t n);
void qt_quantize_q8_0(const float *src, void *dst, int64_t n);
void qt_quantize_q8_1(const float *src, void *dst, int64_t n);
void qt_quantize_q2_k(const float *src, void *dst, int64_t n);
void qt_quantize_q3_k(const float *src, void *dst, int64_t n);
void qt_quantize_q4_k(const float *src, void *dst, int64_t n);
void qt_quantize_q5_k(const float *src, void *dst, int64_t n);
void qt_quantize_q6_k(const float *src, void *dst, int64_t n);
void qt_quantize_q8_k(const float *src, void *dst, int64_t n);
void qt_quantize_iq2_xxs(const float *src, void *dst, int64_t n);
void qt_quantize_iq2_xs(const float *src, void *dst, int64_t n);
void qt_quantize_iq2_s(const float *src, void *dst, int64_t n);
void qt_quantize_iq3_xxs(const float *src, void *dst, int64_t n);
void qt_quantize_iq3_s(const float *src, void *dst, int64_t n);
void qt_quantize_iq1_s(const float *src, void *dst, int64_t n);
void qt_quantize_iq1_m(const float *src, void *dst, int64_t n);
void qt_quantize_iq4_nl(const float *src, void *dst, int64_t n);
void qt_quantize_iq4_xs(const float *src, void *dst, int64_t n);
void qt_quantize_mxfp4(const float *src, void *dst, int64_t n);

#endif
