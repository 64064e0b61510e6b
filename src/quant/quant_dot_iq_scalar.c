/* Dot products of the i-quant weight formats (IQ2_XXS, IQ2_XS, IQ2_S,
 * IQ3_XXS, IQ3_S, IQ1_S, IQ1_M) with Q8_K activations: the portable path
 * (the only one on non-x86 hosts, and the oracle the SIMD paths match).
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
 *
 * Speed without intrinsics: the signed weights of a sub-block are built 8 at
 * a time in a uint64_t (SWAR: byte j of a grid row is weight j, which assumes
 * a little-endian host, as do the GGUF layouts themselves) and stored as int8,
 * then a plain int8 x int8 loop sums them; compilers vectorize that loop
 * (SSE2 on baseline x86-64, NEON on arm64).
 */
#include <string.h>

#include "core/fp16.h"
#include "quant/dot_impl.h"
#include "quant/iq_tables.h"

#define LO7  0x7f7f7f7f7f7f7f7fULL
#define HI1  0x8080808080808080ULL
#define ONES 0x0101010101010101ULL

static inline uint32_t load_u32(const void *p) {
    uint32_t v;
    memcpy(&v, p, 4);
    return v;
}

/* 0xff in byte j where bit j of s is set, else 0x00. */
static inline uint64_t sign_bytes(uint8_t s) {
    const uint64_t bit = (s * ONES) & 0x8040201008040201ULL; /* byte j keeps only bit j */
    return (((bit + LO7) & HI1) >> 7) * 0xff;                /* nonzero byte -> 0xff, no carries */
}

/* Eight unsigned grid bytes (each 1..127), negated where the sign bit is set:
 * -g = ~g + 1 per byte, and ~g <= 0xfe so the +1 never carries out. */
static inline uint64_t signed_row(uint64_t g, uint8_t s) {
    const uint64_t m = sign_bytes(s);
    return (g ^ m) + (m & ONES);
}

/* Byte-wise a + b mod 256 without carries between bytes. */
static inline uint64_t add_bytes(uint64_t a, uint64_t b) { return ((a & LO7) + (b & LO7)) ^ ((a ^ b) & HI1); }

/* IQ1 weights 8*g + delta per byte, g in {-1,0,1} (0xff, 0, 1), delta = +-1:
 * the 64-bit shift moves each byte's top bits into the next byte, which the
 * 0xf8 mask drops. */
static inline uint64_t iq1_row(uint64_t g, int neg) {
    return add_bytes((g << 3) & 0xf8f8f8f8f8f8f8f8ULL, neg ? 0xffffffffffffffffULL : ONES);
}

static inline void put_row(int8_t *dst, uint64_t v) { memcpy(dst, &v, 8); }

/* sum_j w[j] * q[j] over n (16 or 32) int8 pairs. */
static inline int32_t dot_i8(const int8_t *w, const int8_t *q, int n) {
    int32_t s = 0;
    for (int j = 0; j < n; j++) s += (int32_t)w[j] * q[j];
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
            int8_t wv[32];
            for (int l = 0; l < 4; l++)
                put_row(wv + 8 * l,
                        signed_row(iq2xxs_grid[(aux0 >> (8 * l)) & 255], ksigns_iq2xs[(aux1 >> (7 * l)) & 127]));
            bsum += dot_i8(wv, q8 + 32 * ib, 32) * (int32_t)(2 * (aux1 >> 28) + 1);
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
            int8_t wv[32];
            for (int l = 0; l < 4; l++) {
                const uint16_t v = x[i].qs[4 * ib + l];
                put_row(wv + 8 * l, signed_row(iq2xs_grid[v & 511], ksigns_iq2xs[v >> 9]));
            }
            const uint8_t sc = x[i].scales[ib];
            bsum += dot_i8(wv, q8 + 32 * ib, 16) * (2 * (sc & 15) + 1) +
                    dot_i8(wv + 16, q8 + 32 * ib + 16, 16) * (2 * (sc >> 4) + 1);
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
            int8_t wv[32];
            for (int l = 0; l < 4; l++) {
                /* 10-bit index: low 8 in qs, high 2 in qh (2 bits per group of 8) */
                const int idx = qs[4 * ib + l] | ((x[i].qh[ib] << (8 - 2 * l)) & 0x300);
                put_row(wv + 8 * l, signed_row(iq2s_grid[idx], signs[4 * ib + l]));
            }
            const uint8_t sc = x[i].scales[ib];
            bsum += dot_i8(wv, q8 + 32 * ib, 16) * (2 * (sc & 15) + 1) +
                    dot_i8(wv + 16, q8 + 32 * ib + 16, 16) * (2 * (sc >> 4) + 1);
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
        const uint8_t *qs = x[i].qs;             /* 64 grid indices, 4 weights each */
        const uint8_t *gas = x[i].qs + QK_K / 4; /* 8 words: 4x7 sign bits + scale */
        const int8_t *q8 = y[i].qs;
        int32_t bsum = 0;
        for (int ib = 0; ib < QK_K / 32; ib++) {
            const uint32_t aux = load_u32(gas + 4 * ib);
            int8_t wv[32];
            for (int l = 0; l < 4; l++) {
                const uint64_t g = iq3xxs_grid[qs[8 * ib + 2 * l]] | (uint64_t)iq3xxs_grid[qs[8 * ib + 2 * l + 1]]
                                                                         << 32;
                put_row(wv + 8 * l, signed_row(g, ksigns_iq2xs[(aux >> (7 * l)) & 127]));
            }
            bsum += dot_i8(wv, q8 + 32 * ib, 32) * (int32_t)(2 * (aux >> 28) + 1);
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
            int8_t wv[32];
            for (int l = 0; l < 4; l++) {
                /* two 9-bit indices per 8 weights: low 8 in qs, 9th bit in qh */
                const int k = 8 * ib + 2 * l;
                const int i0 = x[i].qs[k] | ((x[i].qh[ib] << (8 - 2 * l)) & 256);
                const int i1 = x[i].qs[k + 1] | ((x[i].qh[ib] << (7 - 2 * l)) & 256);
                const uint64_t g = iq3s_grid[i0] | (uint64_t)iq3s_grid[i1] << 32;
                put_row(wv + 8 * l, signed_row(g, x[i].signs[4 * ib + l]));
            }
            const int sc = (x[i].scales[ib >> 1] >> (4 * (ib & 1))) & 15;
            bsum += dot_i8(wv, q8 + 32 * ib, 32) * (2 * sc + 1);
        }
        sumf += d * (float)bsum;
    }
    *s = sumf;
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
            int8_t wv[32];
            for (int l = 0; l < 4; l++) {
                const int idx = x[i].qs[4 * ib + l] | (((qh >> (3 * l)) & 7) << 8);
                put_row(wv + 8 * l, iq1_row(iq1s_grid[idx], qh & 0x8000));
            }
            bsum += dot_i8(wv, q8 + 32 * ib, 32) * (2 * ((qh >> 12) & 7) + 1);
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
        const uint16_t d16 =
            (uint16_t)((sc[0] >> 12) | ((sc[1] >> 8) & 0x00f0) | ((sc[2] >> 4) & 0x0f00) | (sc[3] & 0xf000));
        const float d = st_f16_to_f32(d16) * y[i].d;
        const int8_t *q8 = y[i].qs;
        int32_t bsum = 0;
        for (int ib = 0; ib < QK_K / 32; ib++) {
            int8_t wv[32];
            for (int l = 0; l < 4; l++) {
                /* per 8 weights a nibble of qh: 3 high index bits + delta sign */
                const int nib = (x[i].qh[2 * ib + (l >> 1)] >> (4 * (l & 1))) & 15;
                const int idx = x[i].qs[4 * ib + l] | ((nib & 7) << 8);
                put_row(wv + 8 * l, iq1_row(iq1s_grid[idx], nib & 8));
            }
            /* 16 3-bit scales, 4 per word, one per 16 weights */
            const int sh = 6 * (ib & 1);
            const int ls0 = 2 * ((sc[ib >> 1] >> sh) & 7) + 1;
            const int ls1 = 2 * ((sc[ib >> 1] >> (sh + 3)) & 7) + 1;
            bsum += dot_i8(wv, q8 + 32 * ib, 16) * ls0 + dot_i8(wv + 16, q8 + 32 * ib + 16, 16) * ls1;
        }
        sumf += d * (float)bsum;
    }
    *s = 0.125f * sumf;
}

const qt_vec_dot_fn qt_dots_iq_scalar[QT_COUNT] = {
    [QT_IQ2_XXS] = dot_iq2_xxs, [QT_IQ2_XS] = dot_iq2_xs, [QT_IQ2_S] = dot_iq2_s, [QT_IQ3_XXS] = dot_iq3_xxs,
    [QT_IQ3_S] = dot_iq3_s,     [QT_IQ1_S] = dot_iq1_s,   [QT_IQ1_M] = dot_iq1_m,
};
