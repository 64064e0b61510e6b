/* Portable C dot products of the "main" weight formats with their activation
 * formats: the fallback on any CPU and the model every SIMD path is checked
 * against (besides the double-precision reference in the tests).
 *
 * They compute the way the SIMD paths do: integer products of the quants
 * summed exactly in int32 per block (or per sub-block), then one float
 * multiply by the block's scales. So the scalar path differs from the SIMD
 * ones only in float summation order. Overflow bounds are noted per kernel.
 *
 * Weight formats and their activations (vec_dot_type):
 *   F32, F16, BF16                   x F32
 *   Q4_0, Q5_0, Q8_0, IQ4_NL, MXFP4  x Q8_0
 *   Q4_1, Q5_1                       x Q8_1 (its s = d*sum(q) carries the min term)
 *   Q2_K..Q6_K, IQ4_XS               x Q8_K (its bsums carry min/offset terms)
 */
#include "quant/dot_impl.h"
#include "quant/quant_dot_common.h"

static float f16(uint16_t h) { return st_f16_to_f32(h); }

/* ---- float formats: 4 accumulators so the compiler may vectorise ---- */

static void dot_f32(int n, float *s, const void *w, const void *a) {
    const float *x = w, *y = a;
    float acc[4] = {0, 0, 0, 0};
    int i = 0;
    for (; i + 4 <= n; i += 4)
        for (int k = 0; k < 4; k++) acc[k] += x[i + k] * y[i + k];
    for (; i < n; i++) acc[0] += x[i] * y[i];
    *s = (acc[0] + acc[1]) + (acc[2] + acc[3]);
}

static void dot_f16(int n, float *s, const void *w, const void *a) {
    const uint16_t *x = w;
    const float *y = a;
    float acc[4] = {0, 0, 0, 0};
    int i = 0;
    for (; i + 4 <= n; i += 4)
        for (int k = 0; k < 4; k++) acc[k] += st_f16_to_f32(x[i + k]) * y[i + k];
    for (; i < n; i++) acc[0] += st_f16_to_f32(x[i]) * y[i];
    *s = (acc[0] + acc[1]) + (acc[2] + acc[3]);
}

static void dot_bf16(int n, float *s, const void *w, const void *a) {
    const uint16_t *x = w;
    const float *y = a;
    float acc[4] = {0, 0, 0, 0};
    int i = 0;
    for (; i + 4 <= n; i += 4)
        for (int k = 0; k < 4; k++) acc[k] += st_bf16_to_f32(x[i + k]) * y[i + k];
    for (; i < n; i++) acc[0] += st_bf16_to_f32(x[i]) * y[i];
    *s = (acc[0] + acc[1]) + (acc[2] + acc[3]);
}

/* ---- 32-weight blocks x Q8_0 / Q8_1 (|sum| <= 32*128*127: int32 is plenty) ---- */

static void dot_q4_0(int n, float *s, const void *w, const void *a) {
    const block_q4_0 *x = w;
    const block_q8_0 *y = a;
    float sum = 0;
    for (int ib = 0; ib < n / QK4_0; ib++) {
        int isum = 0;
        for (int j = 0; j < QK4_0 / 2; j++) {
            isum += ((x[ib].qs[j] & 0xf) - 8) * y[ib].qs[j];
            isum += ((x[ib].qs[j] >> 4) - 8) * y[ib].qs[j + 16];
        }
        sum += f16(x[ib].d) * f16(y[ib].d) * (float)isum;
    }
    *s = sum;
}

static void dot_q4_1(int n, float *s, const void *w, const void *a) {
    const block_q4_1 *x = w;
    const block_q8_1 *y = a;
    float sum = 0;
    for (int ib = 0; ib < n / QK4_1; ib++) {
        int isum = 0;
        for (int j = 0; j < QK4_1 / 2; j++) {
            isum += (x[ib].qs[j] & 0xf) * y[ib].qs[j];
            isum += (x[ib].qs[j] >> 4) * y[ib].qs[j + 16];
        }
        /* w = d*q + m: the m term is m * sum(a) = m * s */
        sum += f16(x[ib].d) * f16(y[ib].d) * (float)isum + f16(x[ib].m) * f16(y[ib].s);
    }
    *s = sum;
}

static void dot_q5_0(int n, float *s, const void *w, const void *a) {
    const block_q5_0 *x = w;
    const block_q8_0 *y = a;
    float sum = 0;
    for (int ib = 0; ib < n / QK5_0; ib++) {
        uint32_t qh;
        memcpy(&qh, x[ib].qh, 4);
        int isum = 0;
        for (int j = 0; j < QK5_0 / 2; j++) {
            int q0 = (x[ib].qs[j] & 0xf) | (int)(((qh >> j) & 1) << 4);
            int q1 = (x[ib].qs[j] >> 4) | (int)(((qh >> (j + 16)) & 1) << 4);
            isum += (q0 - 16) * y[ib].qs[j] + (q1 - 16) * y[ib].qs[j + 16];
        }
        sum += f16(x[ib].d) * f16(y[ib].d) * (float)isum;
    }
    *s = sum;
}

static void dot_q5_1(int n, float *s, const void *w, const void *a) {
    const block_q5_1 *x = w;
    const block_q8_1 *y = a;
    float sum = 0;
    for (int ib = 0; ib < n / QK5_1; ib++) {
        uint32_t qh;
        memcpy(&qh, x[ib].qh, 4);
        int isum = 0;
        for (int j = 0; j < QK5_1 / 2; j++) {
            int q0 = (x[ib].qs[j] & 0xf) | (int)(((qh >> j) & 1) << 4);
            int q1 = (x[ib].qs[j] >> 4) | (int)(((qh >> (j + 16)) & 1) << 4);
            isum += q0 * y[ib].qs[j] + q1 * y[ib].qs[j + 16];
        }
        sum += f16(x[ib].d) * f16(y[ib].d) * (float)isum + f16(x[ib].m) * f16(y[ib].s);
    }
    *s = sum;
}

static void dot_q8_0(int n, float *s, const void *w, const void *a) {
    const block_q8_0 *x = w;
    const block_q8_0 *y = a;
    float sum = 0;
    for (int ib = 0; ib < n / QK8_0; ib++) {
        int isum = 0;
        for (int j = 0; j < QK8_0; j++) isum += x[ib].qs[j] * y[ib].qs[j];
        sum += f16(x[ib].d) * f16(y[ib].d) * (float)isum;
    }
    *s = sum;
}

static void dot_iq4_nl(int n, float *s, const void *w, const void *a) {
    const block_iq4_nl *x = w;
    const block_q8_0 *y = a;
    float sum = 0;
    for (int ib = 0; ib < n / QK4_NL; ib++) {
        int isum = 0;
        for (int j = 0; j < QK4_NL / 2; j++) {
            isum += kvalues_iq4nl[x[ib].qs[j] & 0xf] * y[ib].qs[j];
            isum += kvalues_iq4nl[x[ib].qs[j] >> 4] * y[ib].qs[j + 16];
        }
        sum += f16(x[ib].d) * f16(y[ib].d) * (float)isum;
    }
    *s = sum;
}

static void dot_mxfp4(int n, float *s, const void *w, const void *a) {
    const block_mxfp4 *x = w;
    const block_q8_0 *y = a;
    float sum = 0;
    for (int ib = 0; ib < n / QK_MXFP4; ib++) {
        int isum = 0;
        for (int j = 0; j < QK_MXFP4 / 2; j++) {
            isum += kvalues_mxfp4[x[ib].qs[j] & 0xf] * y[ib].qs[j];
            isum += kvalues_mxfp4[x[ib].qs[j] >> 4] * y[ib].qs[j + 16];
        }
        sum += qdot_e8m0_half(x[ib].e) * f16(y[ib].d) * (float)isum;
    }
    *s = sum;
}

/* ---- K-quants x Q8_K: per super-block |isum| stays below 2^28 ---- */

static void dot_q2_k(int n, float *s, const void *w, const void *a) {
    const block_q2_K *x = w;
    const block_q8_K *y = a;
    float sum = 0;
    for (int ib = 0; ib < n / QK_K; ib++) {
        const uint8_t *q = x[ib].qs;
        const int8_t *q8 = y[ib].qs;
        int isum = 0, msum = 0;
        for (int g = 0; g < 16; g++) msum += (x[ib].scales[g] >> 4) * y[ib].bsums[g];
        /* quant of weight 128*h + 32*k + l is bits 2k..2k+1 of qs[32*h + l] */
        for (int h = 0; h < 2; h++)
            for (int k = 0; k < 4; k++)
                for (int half = 0; half < 2; half++) {
                    int g = 8 * h + 2 * k + half; /* 16-weight group */
                    int gs = 0;
                    for (int l = 16 * half; l < 16 * half + 16; l++)
                        gs += ((q[32 * h + l] >> (2 * k)) & 3) * q8[128 * h + 32 * k + l];
                    isum += (x[ib].scales[g] & 0xf) * gs;
                }
        float dy = y[ib].d;
        sum += dy * f16(x[ib].d) * (float)isum - dy * f16(x[ib].dmin) * (float)msum;
    }
    *s = sum;
}

static void dot_q3_k(int n, float *s, const void *w, const void *a) {
    const block_q3_K *x = w;
    const block_q8_K *y = a;
    float sum = 0;
    for (int ib = 0; ib < n / QK_K; ib++) {
        int8_t sc[16];
        qdot_q3k_scales(x[ib].scales, sc);
        const int8_t *q8 = y[ib].qs;
        int isum = 0;
        for (int g = 0; g < 16; g++) {
            int gs = 0;
            for (int i = 16 * g; i < 16 * g + 16; i++) {
                /* weight i: low 2 bits at qs[32*(i/128) + i%32] >> 2*((i/32)%4);
                 * hmask bit i/32 of byte i%32 set means no -4 offset */
                int lo = (x[ib].qs[32 * (i / 128) + i % 32] >> (2 * ((i / 32) % 4))) & 3;
                int hi = (x[ib].hmask[i % 32] >> (i / 32)) & 1;
                gs += (lo - (hi ? 0 : 4)) * q8[i];
            }
            isum += sc[g] * gs;
        }
        sum += y[ib].d * f16(x[ib].d) * (float)isum;
    }
    *s = sum;
}

static void dot_q4_k(int n, float *s, const void *w, const void *a) {
    const block_q4_K *x = w;
    const block_q8_K *y = a;
    float sum = 0;
    for (int ib = 0; ib < n / QK_K; ib++) {
        uint8_t sc[8], mn[8];
        qdot_k4_scales(x[ib].scales, sc, mn);
        const int8_t *q8 = y[ib].qs;
        int isum = 0, msum = 0;
        for (int j = 0; j < 8; j++) msum += mn[j] * (y[ib].bsums[2 * j] + y[ib].bsums[2 * j + 1]);
        /* 32 bytes per 64 weights: low nibbles sub-block 2c, high nibbles 2c+1 */
        for (int c = 0; c < 4; c++) {
            int s0 = 0, s1 = 0;
            for (int l = 0; l < 32; l++) {
                s0 += (x[ib].qs[32 * c + l] & 0xf) * q8[64 * c + l];
                s1 += (x[ib].qs[32 * c + l] >> 4) * q8[64 * c + 32 + l];
            }
            isum += sc[2 * c] * s0 + sc[2 * c + 1] * s1;
        }
        float dy = y[ib].d;
        sum += dy * f16(x[ib].d) * (float)isum - dy * f16(x[ib].dmin) * (float)msum;
    }
    *s = sum;
}

static void dot_q5_k(int n, float *s, const void *w, const void *a) {
    const block_q5_K *x = w;
    const block_q8_K *y = a;
    float sum = 0;
    for (int ib = 0; ib < n / QK_K; ib++) {
        uint8_t sc[8], mn[8];
        qdot_k4_scales(x[ib].scales, sc, mn);
        const int8_t *q8 = y[ib].qs;
        int isum = 0, msum = 0;
        for (int j = 0; j < 8; j++) msum += mn[j] * (y[ib].bsums[2 * j] + y[ib].bsums[2 * j + 1]);
        /* as Q4_K, plus the 5th bit of weight 32*j + l in bit j of qh[l] */
        for (int c = 0; c < 4; c++) {
            int s0 = 0, s1 = 0;
            for (int l = 0; l < 32; l++) {
                int h0 = (x[ib].qh[l] >> (2 * c)) & 1, h1 = (x[ib].qh[l] >> (2 * c + 1)) & 1;
                s0 += ((x[ib].qs[32 * c + l] & 0xf) | (h0 << 4)) * q8[64 * c + l];
                s1 += ((x[ib].qs[32 * c + l] >> 4) | (h1 << 4)) * q8[64 * c + 32 + l];
            }
            isum += sc[2 * c] * s0 + sc[2 * c + 1] * s1;
        }
        float dy = y[ib].d;
        sum += dy * f16(x[ib].d) * (float)isum - dy * f16(x[ib].dmin) * (float)msum;
    }
    *s = sum;
}

static void dot_q6_k(int n, float *s, const void *w, const void *a) {
    const block_q6_K *x = w;
    const block_q8_K *y = a;
    float sum = 0;
    for (int ib = 0; ib < n / QK_K; ib++) {
        const int8_t *q8 = y[ib].qs;
        int isum = 0;
        /* weight 128*h + 64*p + 32*k + l (p: nibble, k: half of the 64):
         * low 4 bits from ql[64*h + 32*k + l] nibble p, high 2 bits from
         * bits 2*(2p+k) of qh[32*h + l]; value q - 32 */
        for (int h = 0; h < 2; h++)
            for (int p = 0; p < 2; p++)
                for (int k = 0; k < 2; k++) {
                    int base = 128 * h + 64 * p + 32 * k;
                    for (int half = 0; half < 2; half++) {
                        int gs = 0;
                        for (int l = 16 * half; l < 16 * half + 16; l++) {
                            int lo = (x[ib].ql[64 * h + 32 * k + l] >> (4 * p)) & 0xf;
                            int hi = (x[ib].qh[32 * h + l] >> (2 * (2 * p + k))) & 3;
                            gs += ((lo | (hi << 4)) - 32) * q8[base + l];
                        }
                        isum += x[ib].scales[(base + 16 * half) / 16] * gs;
                    }
                }
        sum += y[ib].d * f16(x[ib].d) * (float)isum;
    }
    *s = sum;
}

static void dot_iq4_xs(int n, float *s, const void *w, const void *a) {
    const block_iq4_xs *x = w;
    const block_q8_K *y = a;
    float sum = 0;
    for (int ib = 0; ib < n / QK_K; ib++) {
        const int8_t *q8 = y[ib].qs;
        int isum = 0;
        for (int j = 0; j < QK_K / 32; j++) {
            const uint8_t *q = x[ib].qs + 16 * j;
            int gs = 0;
            for (int l = 0; l < 16; l++) {
                gs += kvalues_iq4nl[q[l] & 0xf] * q8[32 * j + l];
                gs += kvalues_iq4nl[q[l] >> 4] * q8[32 * j + 16 + l];
            }
            isum += qdot_iq4xs_scale(&x[ib], j) * gs;
        }
        sum += y[ib].d * f16(x[ib].d) * (float)isum;
    }
    *s = sum;
}

const qt_vec_dot_fn qt_dots_main_scalar[QT_COUNT] = {
    [QT_F32] = dot_f32,       [QT_F16] = dot_f16,     [QT_BF16] = dot_bf16, [QT_Q4_0] = dot_q4_0,
    [QT_Q4_1] = dot_q4_1,     [QT_Q5_0] = dot_q5_0,   [QT_Q5_1] = dot_q5_1, [QT_Q8_0] = dot_q8_0,
    [QT_IQ4_NL] = dot_iq4_nl, [QT_MXFP4] = dot_mxfp4, [QT_Q2_K] = dot_q2_k, [QT_Q3_K] = dot_q3_k,
    [QT_Q4_K] = dot_q4_k,     [QT_Q5_K] = dot_q5_k,   [QT_Q6_K] = dot_q6_k, [QT_IQ4_XS] = dot_iq4_xs,
};
