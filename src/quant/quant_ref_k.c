/* Reference (scalar) dequantizers, part 1: plain floats and integers, the
 * legacy 32-weight formats (Q4_0 .. Q8_1) and the K-quants (Q2_K .. Q8_K).
 *
 * These are the oracle every SIMD and GPU kernel is tested against, and they
 * are themselves tested against the gguf package's dequantizers
 * (tests/quant/test_dequant.py), which they must match bit for bit. So every
 * formula rounds exactly where gguf/quants.py does: a sub-block scale is
 * formed first as one f32 product (d * scale), then multiplied by the quant,
 * then the min is subtracted, each step rounded to f32. The build has no FMA
 * contraction in these files (baseline x86-64, ISO C mode), which keeps each
 * step a separate rounding.
 *
 * Layouts are in blocks.h; each function takes n weights, a multiple of the
 * block size (qt_dequantize checks that).
 */
#include <string.h>

#include "core/fp16.h"
#include "quant/quant_impl.h"

/* ---- plain element types (block size 1) ---- */

void qt_dequant_f32(const void *src, float *dst, int64_t n) { memcpy(dst, src, (size_t)n * sizeof(float)); }

void qt_dequant_f16(const void *src, float *dst, int64_t n) {
    const uint16_t *x = src;
    for (int64_t i = 0; i < n; i++) dst[i] = st_f16_to_f32(x[i]);
}

void qt_dequant_bf16(const void *src, float *dst, int64_t n) {
    const uint16_t *x = src;
    for (int64_t i = 0; i < n; i++) dst[i] = st_bf16_to_f32(x[i]);
}

/* Integer and f64 tensors (rare in weight files) convert with the C cast,
 * rounding to nearest like numpy's astype(float32). */
void qt_dequant_f64(const void *src, float *dst, int64_t n) {
    const double *x = src;
    for (int64_t i = 0; i < n; i++) dst[i] = (float)x[i];
}

void qt_dequant_i8(const void *src, float *dst, int64_t n) {
    const int8_t *x = src;
    for (int64_t i = 0; i < n; i++) dst[i] = (float)x[i];
}

void qt_dequant_i16(const void *src, float *dst, int64_t n) {
    const int16_t *x = src;
    for (int64_t i = 0; i < n; i++) dst[i] = (float)x[i];
}

void qt_dequant_i32(const void *src, float *dst, int64_t n) {
    const int32_t *x = src;
    for (int64_t i = 0; i < n; i++) dst[i] = (float)x[i];
}

void qt_dequant_i64(const void *src, float *dst, int64_t n) {
    const int64_t *x = src;
    for (int64_t i = 0; i < n; i++) dst[i] = (float)x[i];
}

/* ---- legacy formats: 32 weights, one scale (and min) per block ---- */

/* Low nibbles hold weights 0..15, high nibbles 16..31; w = d * (q - 8). */
void qt_dequant_q4_0(const void *src, float *dst, int64_t n) {
    const block_q4_0 *b = src;
    for (int64_t i = 0; i < n / QK4_0; i++, b++, dst += QK4_0) {
        const float d = st_f16_to_f32(b->d);
        for (int j = 0; j < QK4_0 / 2; j++) {
            dst[j] = d * (float)((b->qs[j] & 0xF) - 8);
            dst[j + QK4_0 / 2] = d * (float)((b->qs[j] >> 4) - 8);
        }
    }
}

/* w = d * q + m, q unsigned 4-bit. */
void qt_dequant_q4_1(const void *src, float *dst, int64_t n) {
    const block_q4_1 *b = src;
    for (int64_t i = 0; i < n / QK4_1; i++, b++, dst += QK4_1) {
        const float d = st_f16_to_f32(b->d), m = st_f16_to_f32(b->m);
        for (int j = 0; j < QK4_1 / 2; j++) {
            dst[j] = d * (float)(b->qs[j] & 0xF) + m;
            dst[j + QK4_1 / 2] = d * (float)(b->qs[j] >> 4) + m;
        }
    }
}

/* Bit i of the little-endian 32-bit qh is the 5th bit of weight i; w = d * (q - 16). */
void qt_dequant_q5_0(const void *src, float *dst, int64_t n) {
    const block_q5_0 *b = src;
    for (int64_t i = 0; i < n / QK5_0; i++, b++, dst += QK5_0) {
        const float d = st_f16_to_f32(b->d);
        uint32_t qh;
        memcpy(&qh, b->qh, 4);
        for (int j = 0; j < QK5_0 / 2; j++) {
            const int h0 = (int)((qh >> j) & 1) << 4;
            const int h1 = (int)((qh >> (j + 16)) & 1) << 4;
            dst[j] = d * (float)(((b->qs[j] & 0xF) | h0) - 16);
            dst[j + QK5_0 / 2] = d * (float)(((b->qs[j] >> 4) | h1) - 16);
        }
    }
}

/* w = d * q + m, q unsigned 5-bit. */
void qt_dequant_q5_1(const void *src, float *dst, int64_t n) {
    const block_q5_1 *b = src;
    for (int64_t i = 0; i < n / QK5_1; i++, b++, dst += QK5_1) {
        const float d = st_f16_to_f32(b->d), m = st_f16_to_f32(b->m);
        uint32_t qh;
        memcpy(&qh, b->qh, 4);
        for (int j = 0; j < QK5_1 / 2; j++) {
            const int h0 = (int)((qh >> j) & 1) << 4;
            const int h1 = (int)((qh >> (j + 16)) & 1) << 4;
            dst[j] = d * (float)((b->qs[j] & 0xF) | h0) + m;
            dst[j + QK5_1 / 2] = d * (float)((b->qs[j] >> 4) | h1) + m;
        }
    }
}

void qt_dequant_q8_0(const void *src, float *dst, int64_t n) {
    const block_q8_0 *b = src;
    for (int64_t i = 0; i < n / QK8_0; i++, b++, dst += QK8_0) {
        const float d = st_f16_to_f32(b->d);
        for (int j = 0; j < QK8_0; j++) dst[j] = d * (float)b->qs[j];
    }
}

/* Q8_1 is an activation format; its s field (d * sum q) is not needed here. */
void qt_dequant_q8_1(const void *src, float *dst, int64_t n) {
    const block_q8_1 *b = src;
    for (int64_t i = 0; i < n / QK8_1; i++, b++, dst += QK8_1) {
        const float d = st_f16_to_f32(b->d);
        for (int j = 0; j < QK8_1; j++) dst[j] = d * (float)b->qs[j];
    }
}

/* ---- K-quants: 256-weight super-blocks ---- */

/* 16 sub-blocks of 16 weights; scales[s]: low nibble scale, high nibble min.
 * Weight 128h + 32k + l is bits 2k..2k+1 of qs[32h + l]. w = d*sc * q - dmin*m. */
void qt_dequant_q2_k(const void *src, float *dst, int64_t n) {
    const block_q2_K *b = src;
    for (int64_t i = 0; i < n / QK_K; i++, b++, dst += QK_K) {
        const float d = st_f16_to_f32(b->d), dmin = st_f16_to_f32(b->dmin);
        for (int e = 0; e < QK_K; e++) {
            const int h = e / 128, k = (e % 128) / 32, l = e % 32;
            const uint8_t sc = b->scales[e / 16];
            const float dl = d * (float)(sc & 0xF);
            const float ml = dmin * (float)(sc >> 4);
            const int q = (b->qs[32 * h + l] >> (2 * k)) & 3;
            dst[e] = dl * (float)q - ml;
        }
    }
}

/* 16 sub-blocks of 16 weights with signed 6-bit scales (minus 32), packed as
 * 16 low nibbles in bytes 0..7 (byte i: sub-block i low, i+8 high nibble) and
 * 16 high bit-pairs in bytes 8..11 (byte 8+i, bits 2k: sub-block 4k+i).
 * Weight 128h + 32k + l: low 2 bits from qs[32h + l] >> 2k, and 4 is
 * subtracted unless bit (4h + k) of hmask[l] is set. */
void qt_dequant_q3_k(const void *src, float *dst, int64_t n) {
    const block_q3_K *b = src;
    for (int64_t i = 0; i < n / QK_K; i++, b++, dst += QK_K) {
        const float d = st_f16_to_f32(b->d);
        float dl[16];
        for (int s = 0; s < 16; s++) {
            const int lo = (b->scales[s % 8] >> (4 * (s / 8))) & 0xF;
            const int hi = (b->scales[8 + s % 4] >> (2 * (s / 4))) & 3;
            dl[s] = d * (float)((lo | (hi << 4)) - 32);
        }
        for (int e = 0; e < QK_K; e++) {
            const int h = e / 128, k = (e % 128) / 32, l = e % 32;
            const int ql = (b->qs[32 * h + l] >> (2 * k)) & 3;
            const int hbit = (b->hmask[l] >> (4 * h + k)) & 1;
            dst[e] = dl[e / 16] * (float)(ql - (hbit ? 0 : 4));
        }
    }
}

/* 8 sub-blocks of 32 weights, 6-bit scale and min each (qt_get_scale_min_k4).
 * Sub-block 2c+k is nibble k of qs[32c .. 32c+31]. w = d*sc * q - dmin*m. */
void qt_dequant_q4_k(const void *src, float *dst, int64_t n) {
    const block_q4_K *b = src;
    for (int64_t i = 0; i < n / QK_K; i++, b++, dst += QK_K) {
        const float d = st_f16_to_f32(b->d), dmin = st_f16_to_f32(b->dmin);
        for (int s = 0; s < 8; s++) {
            uint8_t sc, m;
            qt_get_scale_min_k4(s, b->scales, &sc, &m);
            const float ds = d * (float)sc, dm = dmin * (float)m;
            const uint8_t *q = b->qs + 32 * (s / 2);
            const int shift = 4 * (s % 2);
            for (int l = 0; l < 32; l++) dst[32 * s + l] = ds * (float)((q[l] >> shift) & 0xF) - dm;
        }
    }
}

/* As Q4_K, plus a 5th bit: bit s of qh[l] for weight l of sub-block s. */
void qt_dequant_q5_k(const void *src, float *dst, int64_t n) {
    const block_q5_K *b = src;
    for (int64_t i = 0; i < n / QK_K; i++, b++, dst += QK_K) {
        const float d = st_f16_to_f32(b->d), dmin = st_f16_to_f32(b->dmin);
        for (int s = 0; s < 8; s++) {
            uint8_t sc, m;
            qt_get_scale_min_k4(s, b->scales, &sc, &m);
            const float ds = d * (float)sc, dm = dmin * (float)m;
            const uint8_t *q = b->qs + 32 * (s / 2);
            const int shift = 4 * (s % 2);
            for (int l = 0; l < 32; l++) {
                const int v = ((q[l] >> shift) & 0xF) | (((b->qh[l] >> s) & 1) << 4);
                dst[32 * s + l] = ds * (float)v - dm;
            }
        }
    }
}

/* 16 sub-blocks of 16 weights, int8 scales. Weight 128h + e' (e' < 128):
 * low 4 bits = nibble (e'/64) of ql[64h + e'%64], high 2 bits = bits
 * 2*(e'/32) of qh[32h + e'%32]; w = d*scale * (q - 32). */
void qt_dequant_q6_k(const void *src, float *dst, int64_t n) {
    const block_q6_K *b = src;
    for (int64_t i = 0; i < n / QK_K; i++, b++, dst += QK_K) {
        const float d = st_f16_to_f32(b->d);
        for (int e = 0; e < QK_K; e++) {
            const int h = e / 128, r = e % 128;
            const int lo = (b->ql[64 * h + r % 64] >> (4 * (r / 64))) & 0xF;
            const int hi = (b->qh[32 * h + r % 32] >> (2 * (r / 32))) & 3;
            const float ds = d * (float)b->scales[e / 16];
            dst[e] = ds * (float)((lo | (hi << 4)) - 32);
        }
    }
}

/* Activation format of the K/IQ dots: f32 scale; bsums are not needed here. */
void qt_dequant_q8_k(const void *src, float *dst, int64_t n) {
    const block_q8_K *b = src;
    for (int64_t i = 0; i < n / QK_K; i++, b++, dst += QK_K) {
        for (int j = 0; j < QK_K; j++) dst[j] = b->d * (float)b->qs[j];
    }
}
