/* Dot products of the i-quant weight formats (IQ2_XXS, IQ2_XS, IQ2_S,
 * IQ3_XXS, IQ3_S, IQ1_S, IQ1_M) with Q8_K activations: the portable path.
 *
 * Every format stores, per group of 8 (or 4) weights, an index into a
 * codebook of small unsigned magnitudes (the "grid", iq_tables.h) plus sign
 * bits, and per 16 or 32 weights a small odd integer scale. So the dot of a
 * super-block is exact integer arithmetic up to one float multiply:
 *   sum_i w_i a_i = d_w * d_a * k * sum_sub ls_sub * sum_{i in sub} g_i s_i q_i
 * with k the format's constant (1/8 for IQ2, 1/4 for IQ3_XXS, ...). The SIMD
 * paths compute exactly the same integers, so scalar and SIMD agree up to the
 * order of float additions across blocks.
 *
 * IQ1_S / IQ1_M add a constant delta (+-1/8) to every grid value {-1,0,1};
 * we fold it in as the integer weight 8*g +- 1 and multiply by 1/8 at the end,
 * which keeps one integer dot per sub-block and needs no activation sums.
 */
#include <string.h>

#include "core/fp16.h"
#include "quant/dot_impl.h"
#include "quant/iq_tables.h"

static inline uint32_t load_u32(const void *p) {
    uint32_t v;
    memcpy(&v, p, 4);
    return v;
}

/* sum_j grid[j] * (+-q[j]) over 8 weights, sign bit j of `signs` set = negative. */
static inline int32_t dot8_signed(const uint8_t *grid, uint8_t signs, const int8_t *q) {
    int32_t s = 0;
    for (int j = 0; j < 8; j++) {
        int32_t p = (int32_t)grid[j] * q[j];
        s += (signs >> j) & 1 ? -p : p;
    }
    return s;
}

static void dot_iq2_xxs(int n, float *s, const void *w, const void *a) {
    const block_iq2_xxs *x = w;
    const block_q8_K *y = a;
    float sumf = 0.0f;
    for (int i = 0; i < n / QK_K; i++) {
        const float d = st_f16_to_f32(x[i].d) * y[i].d;
        const int8_t *q8 = y[i].qs;
        int32_t bsum = 0;
        for (int ib = 0; ib < QK_K / 32; ib++) {
            /* aux0: four 8-bit grid indices; aux1: 4x7 sign bits, scale in bits 28..31 */
            const uint32_t aux0 = load_u32(x[i].qs + 4 * ib);
            const uint32_t aux1 = load_u32(x[i].qs + 4 * ib + 2);
            int32_t sumi = 0;
            for (int l = 0; l < 4; l++) {
                const uint8_t *g = (const uint8_t *)(iq2xxs_grid + ((aux0 >> (8 * l)) & 255));
                sumi += dot8_signed(g, ksigns_iq2xs[(aux1 >> (7 * l)) & 127], q8);
                q8 += 8;
            }
            bsum += sumi * (int32_t)(2 * (aux1 >> 28) + 1);
        }
        /* d*(0.5+s)/4 == d*(2s+1)/8 */
        sumf += d * (float)bsum;
    }
    *s = 0.125f * sumf;
}

static void dot_iq2_xs(int n, float *s, const void *w, const void *a) {
    const block_iq2_xs *x = w;
    const block_q8_K *y = a;
    float sumf = 0.0f;
    for (int i = 0; i < n / QK_K; i++) {
        const float d = st_f16_to_f32(x[i].d) * y[i].d;
        const int8_t *q8 = y[i].qs;
        int32_t bsum = 0;
        for (int ib = 0; ib < QK_K / 32; ib++) {
            /* each uint16: 9-bit grid index, 7-bit sign index; one 4-bit scale per 16 weights */
            int32_t sum[2] = {0, 0};
            for (int l = 0; l < 4; l++) {
                const uint16_t v = x[i].qs[4 * ib + l];
                const uint8_t *g = (const uint8_t *)(iq2xs_grid + (v & 511));
                sum[l >> 1] += dot8_signed(g, ksigns_iq2xs[v >> 9], q8);
                q8 += 8;
            }
            const uint8_t sc = x[i].scales[ib];
            bsum += sum[0] * (2 * (sc & 15) + 1) + sum[1] * (2 * (sc >> 4) + 1);
        }
        sumf += d * (float)bsum;
    }
    *s = 0.125f * sumf;
}

static void dot_iq2_s(int n, float *s, const void *w, const void *a) {
    const block_iq2_s *x = w;
    const block_q8_K *y = a;
    float sumf = 0.0f;
    for (int i = 0; i < n / QK_K; i++) {
        const float d = st_f16_to_f32(x[i].d) * y[i].d;
        const uint8_t *qs = x[i].qs;
        const uint8_t *signs = x[i].qs + QK_K / 8; /* plain sign bits, 8 per 8 weights */
        const int8_t *q8 = y[i].qs;
        int32_t bsum = 0;
        for (int ib = 0; ib < QK_K / 32; ib++) {
            int32_t sum[2] = {0, 0};
            for (int l = 0; l < 4; l++) {
                /* 10-bit index: low 8 in qs, high 2 in qh (2 bits per group of 8) */
                const int idx = qs[4 * ib + l] | ((x[i].qh[ib] << (8 - 2 * l)) & 0x300);
                const uint8_t *g = (const uint8_t *)(iq2s_grid + idx);
                sum[l >> 1] += dot8_signed(g, signs[4 * ib + l], q8);
                q8 += 8;
            }
            const uint8_t sc = x[i].scales[ib];
            bsum += sum[0] * (2 * (sc & 15) + 1) + sum[1] * (2 * (sc >> 4) + 1);
        }
        sumf += d * (float)bsum;
    }
    *s = 0.125f * sumf;
}

static void dot_iq3_xxs(int n, float *s, const void *w, const void *a) {
    const block_iq3_xxs *x = w;
    const block_q8_K *y = a;
    float sumf = 0.0f;
    for (int i = 0; i < n / QK_K; i++) {
        const float d = st_f16_to_f32(x[i].d) * y[i].d;
        const uint8_t *qs = x[i].qs;              /* 64 grid indices, 4 weights each */
        const uint8_t *gas = x[i].qs + QK_K / 4;  /* 8 words: 4x7 sign bits + scale */
        const int8_t *q8 = y[i].qs;
        int32_t bsum = 0;
        for (int ib = 0; ib < QK_K / 32; ib++) {
            const uint32_t aux = load_u32(gas + 4 * ib);
            int32_t sumi = 0;
            for (int l = 0; l < 4; l++) {
                uint8_t g[8];
                memcpy(g, iq3xxs_grid + qs[8 * ib + 2 * l], 4);
                memcpy(g + 4, iq3xxs_grid + qs[8 * ib + 2 * l + 1], 4);
                sumi += dot8_signed(g, ksigns_iq2xs[(aux >> (7 * l)) & 127], q8);
                q8 += 8;
            }
            bsum += sumi * (int32_t)(2 * (aux >> 28) + 1);
        }
        /* d*(0.5+s)/2 == d*(2s+1)/4 */
        sumf += d * (float)bsum;
    }
    *s = 0.25f * sumf;
}

static void dot_iq3_s(int n, float *s, const void *w, const void *a) {
    const block_iq3_s *x = w;
    const block_q8_K *y = a;
    float sumf = 0.0f;
    for (int i = 0; i < n / QK_K; i++) {
        const float d = st_f16_to_f32(x[i].d) * y[i].d;
        const int8_t *q8 = y[i].qs;
        int32_t bsum = 0;
        for (int ib = 0; ib < QK_K / 32; ib++) {
            int32_t sumi = 0;
            for (int l = 0; l < 4; l++) {
                /* two 9-bit indices per 8 weights: low 8 in qs, 9th bit in qh */
                const int k = 8 * ib + 2 * l;
                const int i0 = x[i].qs[k] | ((x[i].qh[ib] << (8 - 2 * l)) & 256);
                const int i1 = x[i].qs[k + 1] | ((x[i].qh[ib] << (7 - 2 * l)) & 256);
                uint8_t g[8];
                memcpy(g, iq3s_grid + i0, 4);
                memcpy(g + 4, iq3s_grid + i1, 4);
                sumi += dot8_signed(g, x[i].signs[4 * ib + l], q8);
                q8 += 8;
            }
            const int sc = (x[i].scales[ib >> 1] >> (4 * (ib & 1))) & 15;
            bsum += sumi * (2 * sc + 1);
        }
        sumf += d * (float)bsum;
    }
    *s = sumf;
}

/* sum_j (8*g_j + delta) * q_j over 8 weights, g_j in {-1,0,1} (int8 grid bytes). */
static inline int32_t dot8_iq1(const int8_t *g, int32_t delta, const int8_t *q) {
    int32_t s = 0;
    for (int j = 0; j < 8; j++) s += (8 * g[j] + delta) * q[j];
    return s;
}

static void dot_iq1_s(int n, float *s, const void *w, const void *a) {
    const block_iq1_s *x = w;
    const block_q8_K *y = a;
    float sumf = 0.0f;
    for (int i = 0; i < n / QK_K; i++) {
        const float d = st_f16_to_f32(x[i].d) * y[i].d;
        const int8_t *q8 = y[i].qs;
        int32_t bsum = 0;
        for (int ib = 0; ib < QK_K / 32; ib++) {
            /* qh: 4x3 high index bits, 3-bit scale in 12..14, delta sign in 15 */
            const uint16_t qh = x[i].qh[ib];
            const int32_t delta = qh & 0x8000 ? -1 : 1;
            int32_t sumi = 0;
            for (int l = 0; l < 4; l++) {
                const int idx = x[i].qs[4 * ib + l] | (((qh >> (3 * l)) & 7) << 8);
                sumi += dot8_iq1((const int8_t *)(iq1s_grid + idx), delta, q8);
                q8 += 8;
            }
            bsum += sumi * (2 * ((qh >> 12) & 7) + 1);
        }
        sumf += d * (float)bsum;
    }
    *s = 0.125f * sumf; /* the 8 of 8*g +- 1 */
}

static void dot_iq1_m(int n, float *s, const void *w, const void *a) {
    const block_iq1_m *x = w;
    const block_q8_K *y = a;
    float sumf = 0.0f;
    for (int i = 0; i < n / QK_K; i++) {
        uint16_t sc[4];
        memcpy(sc, x[i].scales, 8);
        /* the f16 super-scale is the top nibbles of the four scale words */
        const uint16_t d16 = (uint16_t)((sc[0] >> 12) | ((sc[1] >> 8) & 0x00f0) |
                                        ((sc[2] >> 4) & 0x0f00) | (sc[3] & 0xf000));
        const float d = st_f16_to_f32(d16) * y[i].d;
        const int8_t *q8 = y[i].qs;
        int32_t bsum = 0;
        for (int ib = 0; ib < QK_K / 32; ib++) {
            int32_t sum[2] = {0, 0};
            for (int l = 0; l < 4; l++) {
                /* per 8 weights a nibble of qh: 3 high index bits + delta sign */
                const int nib = (x[i].qh[2 * ib + (l >> 1)] >> (4 * (l & 1))) & 15;
                const int idx = x[i].qs[4 * ib + l] | ((nib & 7) << 8);
                sum[l >> 1] += dot8_iq1((const int8_t *)(iq1s_grid + idx), nib & 8 ? -1 : 1, q8);
                q8 += 8;
            }
            /* 16 3-bit scales, 4 per word, one per 16 weights */
            const int sh = 6 * (ib & 1);
            const int ls0 = 2 * ((sc[ib >> 1] >> sh) & 7) + 1;
            const int ls1 = 2 * ((sc[ib >> 1] >> (sh + 3)) & 7) + 1;
            bsum += sum[0] * ls0 + sum[1] * ls1;
        }
        sumf += d * (float)bsum;
    }
    *s = 0.125f * sumf;
}

const qt_vec_dot_fn qt_dots_iq_scalar[QT_COUNT] = {
    [QT_IQ2_XXS] = dot_iq2_xxs, [QT_IQ2_XS] = dot_iq2_xs, [QT_IQ2_S] = dot_iq2_s,
    [QT_IQ3_XXS] = dot_iq3_xxs, [QT_IQ3_S] = dot_iq3_s,   [QT_IQ1_S] = dot_iq1_s,
    [QT_IQ1_M] = dot_iq1_m,
};
