/* Device decoders of every GGUF weight format, shared by the matrix-vector
 * kernels (mmv*.cu), the dequantize-to-bf16 pass of the GEMM path (gemm*.cu)
 * and the kernel lab (dev/cuda/).
 *
 * One idea carries all 20 block formats: a "unit" is 32 consecutive weights
 * of a row, decoded into 32 int8 values (8 packed words, weight 4i+j in byte
 * j of word i) plus float scales, so that a dot product with 32 int8
 * activations is 8 dp4a instructions, whatever the format:
 *
 *     w_i = d[i/16 if SCALE16 else 0] * q_i + (min term)
 *     MIN 0: none; 1: + m[0]; 2: + m[i/16]; 3: + m[i/8]
 *
 * A min term is applied to the activation sum (one multiply per unit), never
 * per weight. Offsets such as Q4_0's "-8" become a min term (m = -8d), so no
 * byte-wise subtraction is needed; Q3_K/Q6_K instead sign-extend in SWAR
 * because their scales are per 16 weights and a per-16 activation sum would
 * cost more than the three logic operations.
 *
 * Alignment: a weight matrix starts 16-byte aligned and its rows are whole
 * blocks, so a block starts at a multiple of gcd(block bytes, 16); each
 * format's loads use only the alignment its fields are guaranteed (ld_u32<A>).
 *
 * Float formats (F32/F16/BF16) have no units: mmv.cu reads them directly.
 */
#ifndef STRATA_BACKEND_CUDA_QUANT_CUDA_CUH
#define STRATA_BACKEND_CUDA_QUANT_CUDA_CUH

#include <stdint.h>

#include "backend/cuda/compat.h"
#include "quant/blocks.h"

/* Device copies of the i-quant grids (each translation unit gets its own). */
#ifndef STRATA_IQ_DEVICE_TABLES
#define STRATA_IQ_DEVICE_TABLES
#undef IQ_TABLE_QUAL
#define IQ_TABLE_QUAL static const __device__
#include "quant/iq_tables.h"
#endif

/* One decoded unit of 32 weights (see the top of the file). */
struct mm_unit {
    int q[8];   /* 32 int8 quants, 4 per word, in weight order */
    float d[2]; /* scale of weights 0..15 and 16..31 (d[1] unused unless SCALE16) */
    float m[4]; /* min terms (MIN 1: m[0]; 2: m[0..1] per 16; 3: m[0..3] per 8) */
};

/* ---- small helpers ---- */

static __device__ __forceinline__ float mm_f16(uint16_t h) { return __half2float(__ushort_as_half(h)); }

/* 32-bit little-endian load from p, which is known to be A-byte aligned. */
template <int A> static __device__ __forceinline__ uint32_t ld_u32(const uint8_t *p) {
    if constexpr (A >= 4) {
        return *(const uint32_t *)p;
    } else if constexpr (A == 2) {
        return (uint32_t) * (const uint16_t *)p | ((uint32_t) * (const uint16_t *)(p + 2) << 16);
    } else {
        return (uint32_t)p[0] | ((uint32_t)p[1] << 8) | ((uint32_t)p[2] << 16) | ((uint32_t)p[3] << 24);
    }
}

/* 32 bytes at a 2-byte aligned p as 8 words: 9 aligned 32-bit loads and
 * funnel shifts instead of 16 16-bit loads (the Q6_K lab measured 1.6x on a
 * large matrix). It touches the aligned words around [p, p+32), i.e. up to
 * 2 bytes on either side, so use it only for runs followed by at least 2
 * more bytes of the same block. */
static __device__ __forceinline__ void ld8_a2(const uint8_t *p, uint32_t o[8]) {
    const uint32_t *b = (const uint32_t *)((uintptr_t)p & ~(uintptr_t)3);
    const uint32_t sh = (uint32_t)((uintptr_t)p & 2) * 8;
    uint32_t w[9];
#pragma unroll
    for (int i = 0; i < 8; i++) w[i] = b[i];
    w[8] = sh ? b[8] : 0;
#pragma unroll
    for (int i = 0; i < 8; i++) o[i] = __funnelshift_r(w[i], w[i + 1], sh);
}

static __device__ __forceinline__ uint16_t ld_u16(const uint8_t *p) { return *(const uint16_t *)p; }

/* Low 4 bits of x -> bytes of 0 or 1 (bit j -> byte j). The four shifted
 * copies occupy disjoint bit ranges, so the multiply is a carry-free OR. */
static __device__ __forceinline__ uint32_t spread4(uint32_t x) { return ((x & 0xF) * 0x00204081u) & 0x01010101u; }

/* Negate the bytes of g selected by the 4 low bits of s. Per byte: ~g + 1;
 * the +1 never carries out of a byte because grid magnitudes are never 0. */
static __device__ __forceinline__ int apply_signs(uint32_t g, uint32_t s) {
    const uint32_t m = spread4(s);
    return (int)((g ^ (m * 0xFFu)) + m);
}

/* 7 stored sign bits -> 8 (bit 7 makes the count of minus signs even); the
 * same as ksigns_iq2xs, without a table load. */
static __device__ __forceinline__ uint32_t ksigns8(uint32_t s7) { return s7 | ((__popc(s7) & 1) << 7); }

/* Four 4-bit indices (the low nibble of each byte of x) -> four int8 values
 * of a 16-entry table held in 4 words: two byte permutes pick from the low
 * and high halves, bit 3 of each index chooses between them. */
static __device__ __forceinline__ int lut16(uint32_t x, uint32_t t0, uint32_t t1, uint32_t t2, uint32_t t3) {
    const uint32_t y = x | (x >> 4);
    const uint32_t sel = ((y & 0xFF) | ((y >> 8) & 0xFF00)) & 0x7777;
    const uint32_t lo = __byte_perm(t0, t1, sel), hi = __byte_perm(t2, t3, sel);
    const uint32_t m = ((x >> 3) & 0x01010101u) * 0xFFu;
    return (int)((lo & ~m) | (hi & m));
}

/* Packs four int8 into a word at compile time (for the LUT constants). */
static __host__ __device__ constexpr uint32_t pack4(int a, int b, int c, int d) {
    return (uint32_t)(uint8_t)a | ((uint32_t)(uint8_t)b << 8) | ((uint32_t)(uint8_t)c << 16) |
           ((uint32_t)(uint8_t)d << 24);
}
/* kvalues_iq4nl and kvalues_mxfp4 (iq_tables.h) as packed words; the tests
 * check every format against the reference, which reads the tables. */
#define MM_IQ4NL_LUT                                                                                                   \
    pack4(-127, -104, -83, -65), pack4(-49, -35, -22, -10), pack4(1, 13, 25, 38), pack4(53, 69, 89, 113)
#define MM_MXFP4_LUT pack4(0, 1, 2, 3), pack4(4, 6, 8, 12), pack4(0, -1, -2, -3), pack4(-4, -6, -8, -12)

/* Q4_K/Q5_K: 6-bit scale and min of sub-block j from the 12 packed bytes. */
static __device__ __forceinline__ void scale_min_k4(int j, const uint8_t *q, int &sc, int &m) {
    if (j < 4) {
        sc = q[j] & 63;
        m = q[j + 4] & 63;
    } else {
        sc = (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4);
        m = (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
    }
}

/* ---- the formats ----
 * Each mmf<T> has QK (weights per block), BYTES, UPB (units per block),
 * SCALE16, MIN, and unit(block, u, out) decoding unit u of the block. */
template <int T> struct mmf;

template <> struct mmf<QT_Q4_0> {
    static constexpr int QK = 32, BYTES = 18, UPB = 1, SCALE16 = 0, MIN = 1;
    static __device__ __forceinline__ void unit(const uint8_t *b, int, mm_unit &o) {
        const float d = mm_f16(ld_u16(b));
        o.d[0] = d;
        o.m[0] = -8.0f * d; /* w = d*(q-8) */
#pragma unroll
        for (int i = 0; i < 4; i++) {
            const uint32_t w = ld_u32<2>(b + 2 + 4 * i);
            o.q[i] = (int)(w & 0x0F0F0F0Fu);
            o.q[i + 4] = (int)((w >> 4) & 0x0F0F0F0Fu);
        }
    }
};

template <> struct mmf<QT_Q4_1> {
    static constexpr int QK = 32, BYTES = 20, UPB = 1, SCALE16 = 0, MIN = 1;
    static __device__ __forceinline__ void unit(const uint8_t *b, int, mm_unit &o) {
        o.d[0] = mm_f16(ld_u16(b));
        o.m[0] = mm_f16(ld_u16(b + 2));
#pragma unroll
        for (int i = 0; i < 4; i++) {
            const uint32_t w = ld_u32<4>(b + 4 + 4 * i);
            o.q[i] = (int)(w & 0x0F0F0F0Fu);
            o.q[i + 4] = (int)((w >> 4) & 0x0F0F0F0Fu);
        }
    }
};

template <> struct mmf<QT_Q5_0> {
    static constexpr int QK = 32, BYTES = 22, UPB = 1, SCALE16 = 0, MIN = 1;
    static __device__ __forceinline__ void unit(const uint8_t *b, int, mm_unit &o) {
        const float d = mm_f16(ld_u16(b));
        o.d[0] = d;
        o.m[0] = -16.0f * d;
        const uint32_t qh = ld_u32<2>(b + 2);
#pragma unroll
        for (int i = 0; i < 4; i++) {
            const uint32_t w = ld_u32<2>(b + 6 + 4 * i);
            o.q[i] = (int)((w & 0x0F0F0F0Fu) | (spread4(qh >> (4 * i)) << 4));
            o.q[i + 4] = (int)(((w >> 4) & 0x0F0F0F0Fu) | (spread4(qh >> (16 + 4 * i)) << 4));
        }
    }
};

template <> struct mmf<QT_Q5_1> {
    static constexpr int QK = 32, BYTES = 24, UPB = 1, SCALE16 = 0, MIN = 1;
    static __device__ __forceinline__ void unit(const uint8_t *b, int, mm_unit &o) {
        o.d[0] = mm_f16(ld_u16(b));
        o.m[0] = mm_f16(ld_u16(b + 2));
        const uint32_t qh = ld_u32<4>(b + 4);
#pragma unroll
        for (int i = 0; i < 4; i++) {
            const uint32_t w = ld_u32<8>(b + 8 + 4 * i);
            o.q[i] = (int)((w & 0x0F0F0F0Fu) | (spread4(qh >> (4 * i)) << 4));
            o.q[i + 4] = (int)(((w >> 4) & 0x0F0F0F0Fu) | (spread4(qh >> (16 + 4 * i)) << 4));
        }
    }
};

template <> struct mmf<QT_Q8_0> {
    static constexpr int QK = 32, BYTES = 34, UPB = 1, SCALE16 = 0, MIN = 0;
    static __device__ __forceinline__ void unit(const uint8_t *b, int, mm_unit &o) {
        o.d[0] = mm_f16(ld_u16(b));
#pragma unroll
        for (int i = 0; i < 8; i++) o.q[i] = (int)ld_u32<2>(b + 2 + 4 * i);
    }
};

/* Q2_K: unit u = weights 128h + 32k + l, 2-bit field k of qs[32h + l]. */
template <> struct mmf<QT_Q2_K> {
    static constexpr int QK = 256, BYTES = 84, UPB = 8, SCALE16 = 1, MIN = 2;
    static __device__ __forceinline__ void unit(const uint8_t *b, int u, mm_unit &o) {
        const int h = u >> 2, k = u & 3;
        const float d = mm_f16(ld_u16(b + 80)), dmin = mm_f16(ld_u16(b + 82));
#pragma unroll
        for (int i = 0; i < 8; i++) o.q[i] = (int)((ld_u32<4>(b + 16 + 32 * h + 4 * i) >> (2 * k)) & 0x03030303u);
        const int s0 = b[2 * u], s1 = b[2 * u + 1];
        o.d[0] = d * (float)(s0 & 0xF);
        o.d[1] = d * (float)(s1 & 0xF);
        o.m[0] = -dmin * (float)(s0 >> 4);
        o.m[1] = -dmin * (float)(s1 >> 4);
    }
};

/* Q3_K: 2 low bits as Q2_K; a clear hmask bit means "minus 4", i.e. the
 * byte becomes ql | 0xFC (ql - 4 in two's complement). */
template <> struct mmf<QT_Q3_K> {
    static constexpr int QK = 256, BYTES = 110, UPB = 8, SCALE16 = 1, MIN = 0;
    static __device__ __forceinline__ void unit(const uint8_t *b, int u, mm_unit &o) {
        const int h = u >> 2, k = u & 3;
        const float d = mm_f16(ld_u16(b + 108));
        uint32_t qw[8], hw[8];
        ld8_a2(b + 32 + 32 * h, qw); /* followed by more qs or the scales */
        ld8_a2(b, hw);               /* followed by qs */
#pragma unroll
        for (int i = 0; i < 8; i++) {
            const uint32_t ql = (qw[i] >> (2 * k)) & 0x03030303u;
            const uint32_t hb = (hw[i] >> (4 * h + k)) & 0x01010101u;
            o.q[i] = (int)(ql | ((hb ^ 0x01010101u) * 0xFCu));
        }
        const uint8_t *sc = b + 96;
#pragma unroll
        for (int j = 0; j < 2; j++) {
            const int s = 2 * u + j;
            const int lo = (sc[s & 7] >> (4 * (s >> 3))) & 0xF;
            const int hi = (sc[8 + (s & 3)] >> (2 * (s >> 2))) & 3;
            o.d[j] = d * (float)((lo | (hi << 4)) - 32);
        }
    }
};

template <> struct mmf<QT_Q4_K> {
    static constexpr int QK = 256, BYTES = 144, UPB = 8, SCALE16 = 0, MIN = 1;
    static __device__ __forceinline__ void unit(const uint8_t *b, int u, mm_unit &o) {
        const uint4 *qp = (const uint4 *)(b + 16 + 32 * (u >> 1));
        const uint4 w0 = qp[0], w1 = qp[1];
        const uint32_t w[8] = {w0.x, w0.y, w0.z, w0.w, w1.x, w1.y, w1.z, w1.w};
        const int sh = 4 * (u & 1);
#pragma unroll
        for (int i = 0; i < 8; i++) o.q[i] = (int)((w[i] >> sh) & 0x0F0F0F0Fu);
        int sc, m;
        scale_min_k4(u, b + 4, sc, m);
        o.d[0] = mm_f16(ld_u16(b)) * (float)sc;
        o.m[0] = -mm_f16(ld_u16(b + 2)) * (float)m;
    }
};

template <> struct mmf<QT_Q5_K> {
    static constexpr int QK = 256, BYTES = 176, UPB = 8, SCALE16 = 0, MIN = 1;
    static __device__ __forceinline__ void unit(const uint8_t *b, int u, mm_unit &o) {
        const uint4 *qp = (const uint4 *)(b + 48 + 32 * (u >> 1));
        const uint4 *hp = (const uint4 *)(b + 16);
        const uint4 w0 = qp[0], w1 = qp[1], h0 = hp[0], h1 = hp[1];
        const uint32_t w[8] = {w0.x, w0.y, w0.z, w0.w, w1.x, w1.y, w1.z, w1.w};
        const uint32_t hh[8] = {h0.x, h0.y, h0.z, h0.w, h1.x, h1.y, h1.z, h1.w};
        const int sh = 4 * (u & 1);
#pragma unroll
        for (int i = 0; i < 8; i++) o.q[i] = (int)(((w[i] >> sh) & 0x0F0F0F0Fu) | (((hh[i] >> u) & 0x01010101u) << 4));
        int sc, m;
        scale_min_k4(u, b + 4, sc, m);
        o.d[0] = mm_f16(ld_u16(b)) * (float)sc;
        o.m[0] = -mm_f16(ld_u16(b + 2)) * (float)m;
    }
};

/* Q6_K: 6-bit x, value x - 32: flip bit 5 and sign-extend it into bits 6, 7. */
template <> struct mmf<QT_Q6_K> {
    static constexpr int QK = 256, BYTES = 210, UPB = 8, SCALE16 = 1, MIN = 0;
    static __device__ __forceinline__ void unit(const uint8_t *b, int u, mm_unit &o) {
        const int h = u >> 2, c = u & 3;
        const uint8_t *ql = b + 64 * h + 32 * (c & 1);
        const uint8_t *qh = b + 128 + 32 * h;
        const int ns = 4 * (c >> 1);
        uint32_t lw[8], hw[8];
        ld8_a2(ql, lw); /* both runs end before the scales at 192 */
        ld8_a2(qh, hw);
#pragma unroll
        for (int i = 0; i < 8; i++) {
            const uint32_t x = ((lw[i] >> ns) & 0x0F0F0F0Fu) | (((hw[i] >> (2 * c)) & 0x03030303u) << 4);
            const uint32_t y = x ^ 0x20202020u, s = y & 0x20202020u;
            o.q[i] = (int)(y | (s << 1) | (s << 2));
        }
        const float d = mm_f16(ld_u16(b + 208));
        const int8_t *sc = (const int8_t *)(b + 192);
        o.d[0] = d * (float)sc[2 * u];
        o.d[1] = d * (float)sc[2 * u + 1];
    }
};

template <> struct mmf<QT_IQ2_XXS> {
    static constexpr int QK = 256, BYTES = 66, UPB = 8, SCALE16 = 0, MIN = 0;
    static __device__ __forceinline__ void unit(const uint8_t *b, int u, mm_unit &o) {
        const uint32_t a0 = ld_u32<2>(b + 2 + 8 * u), a1 = ld_u32<2>(b + 6 + 8 * u);
        o.d[0] = mm_f16(ld_u16(b)) * (0.5f + (float)(a1 >> 28)) * 0.25f;
#pragma unroll
        for (int l = 0; l < 4; l++) {
            const uint64_t g = iq2xxs_grid[(a0 >> (8 * l)) & 0xFF];
            const uint32_t s = ksigns8((a1 >> (7 * l)) & 127);
            o.q[2 * l] = apply_signs((uint32_t)g, s);
            o.q[2 * l + 1] = apply_signs((uint32_t)(g >> 32), s >> 4);
        }
    }
};

template <> struct mmf<QT_IQ2_XS> {
    static constexpr int QK = 256, BYTES = 74, UPB = 8, SCALE16 = 1, MIN = 0;
    static __device__ __forceinline__ void unit(const uint8_t *b, int u, mm_unit &o) {
        const float d = mm_f16(ld_u16(b));
#pragma unroll
        for (int l = 0; l < 4; l++) {
            const uint32_t q = ld_u16(b + 2 + 2 * (4 * u + l));
            const uint64_t g = iq2xs_grid[q & 511];
            const uint32_t s = ksigns8(q >> 9);
            o.q[2 * l] = apply_signs((uint32_t)g, s);
            o.q[2 * l + 1] = apply_signs((uint32_t)(g >> 32), s >> 4);
        }
        const int sc = b[66 + u];
        o.d[0] = d * (0.5f + (float)(sc & 0xF)) * 0.25f;
        o.d[1] = d * (0.5f + (float)(sc >> 4)) * 0.25f;
    }
};

template <> struct mmf<QT_IQ2_S> {
    static constexpr int QK = 256, BYTES = 82, UPB = 8, SCALE16 = 1, MIN = 0;
    static __device__ __forceinline__ void unit(const uint8_t *b, int u, mm_unit &o) {
        const float d = mm_f16(ld_u16(b));
        const uint32_t idx = ld_u32<2>(b + 2 + 4 * u), sg = ld_u32<2>(b + 34 + 4 * u);
        const uint32_t qh = b[66 + u];
#pragma unroll
        for (int l = 0; l < 4; l++) {
            const uint64_t g = iq2s_grid[((idx >> (8 * l)) & 0xFF) | (((qh >> (2 * l)) & 3) << 8)];
            const uint32_t s = sg >> (8 * l);
            o.q[2 * l] = apply_signs((uint32_t)g, s);
            o.q[2 * l + 1] = apply_signs((uint32_t)(g >> 32), s >> 4);
        }
        const int sc = b[74 + u];
        o.d[0] = d * (0.5f + (float)(sc & 0xF)) * 0.25f;
        o.d[1] = d * (0.5f + (float)(sc >> 4)) * 0.25f;
    }
};

template <> struct mmf<QT_IQ3_XXS> {
    static constexpr int QK = 256, BYTES = 98, UPB = 8, SCALE16 = 0, MIN = 0;
    static __device__ __forceinline__ void unit(const uint8_t *b, int u, mm_unit &o) {
        const uint32_t i0 = ld_u32<2>(b + 2 + 8 * u), i1 = ld_u32<2>(b + 6 + 8 * u);
        const uint32_t aux = ld_u32<2>(b + 66 + 4 * u);
        o.d[0] = mm_f16(ld_u16(b)) * (0.5f + (float)(aux >> 28)) * 0.5f;
#pragma unroll
        for (int l = 0; l < 4; l++) {
            const uint32_t iw = l < 2 ? i0 : i1;
            const uint32_t s = ksigns8((aux >> (7 * l)) & 127);
            o.q[2 * l] = apply_signs(iq3xxs_grid[(iw >> (16 * (l & 1))) & 0xFF], s);
            o.q[2 * l + 1] = apply_signs(iq3xxs_grid[(iw >> (16 * (l & 1) + 8)) & 0xFF], s >> 4);
        }
    }
};

template <> struct mmf<QT_IQ3_S> {
    static constexpr int QK = 256, BYTES = 110, UPB = 8, SCALE16 = 0, MIN = 0;
    static __device__ __forceinline__ void unit(const uint8_t *b, int u, mm_unit &o) {
        const uint32_t i0 = ld_u32<2>(b + 2 + 8 * u), i1 = ld_u32<2>(b + 6 + 8 * u);
        const uint32_t qh = b[66 + u];
        const uint32_t sg = ld_u32<2>(b + 74 + 4 * u);
        const int sc = (b[106 + (u >> 1)] >> (4 * (u & 1))) & 0xF;
        o.d[0] = mm_f16(ld_u16(b)) * (float)(1 + 2 * sc);
#pragma unroll
        for (int l = 0; l < 4; l++) {
            const uint32_t iw = l < 2 ? i0 : i1;
            const int k = 2 * l;
            const uint32_t s = sg >> (8 * l);
            const uint32_t g0 = iq3s_grid[((iw >> (16 * (l & 1))) & 0xFF) | (((qh >> k) & 1) << 8)];
            const uint32_t g1 = iq3s_grid[((iw >> (16 * (l & 1) + 8)) & 0xFF) | (((qh >> (k + 1)) & 1) << 8)];
            o.q[2 * l] = apply_signs(g0, s);
            o.q[2 * l + 1] = apply_signs(g1, s >> 4);
        }
    }
};

/* IQ1_S: w = dl * (g + delta), g in {-1, 0, 1}: the delta is a min term. */
template <> struct mmf<QT_IQ1_S> {
    static constexpr int QK = 256, BYTES = 50, UPB = 8, SCALE16 = 0, MIN = 1;
    static __device__ __forceinline__ void unit(const uint8_t *b, int u, mm_unit &o) {
        const uint32_t qh = ld_u16(b + 34 + 2 * u);
        const uint32_t qs = ld_u32<2>(b + 2 + 4 * u);
        const float dl = mm_f16(ld_u16(b)) * (float)(2 * ((qh >> 12) & 7) + 1);
        o.d[0] = dl;
        o.m[0] = dl * ((qh & 0x8000) ? -IQ1S_DELTA : IQ1S_DELTA);
#pragma unroll
        for (int l = 0; l < 4; l++) {
            const uint64_t g = iq1s_grid[((qs >> (8 * l)) & 0xFF) | (((qh >> (3 * l)) & 7) << 8)];
            o.q[2 * l] = (int)(uint32_t)g;
            o.q[2 * l + 1] = (int)(uint32_t)(g >> 32);
        }
    }
};

/* IQ1_M: scale per 16 weights, delta sign per 8 (MIN 3). */
template <> struct mmf<QT_IQ1_M> {
    static constexpr int QK = 256, BYTES = 56, UPB = 8, SCALE16 = 1, MIN = 3;
    static __device__ __forceinline__ void unit(const uint8_t *b, int u, mm_unit &o) {
        const uint32_t s01 = ld_u32<8>(b + 48), s23 = ld_u32<8>(b + 52);
        const uint16_t dbits = (uint16_t)(((s01 >> 12) & 0x000F) | ((s01 >> 24) & 0x00F0) | ((s23 >> 4) & 0x0F00) |
                                          ((s23 >> 16) & 0xF000));
        const float d = mm_f16(dbits);
        /* halves t = 2u, 2u+1 live in 16-bit word t/4 = u/2 (selects, not an
         * indexed array, so nothing goes to local memory) */
        const uint32_t sw = (u & 4) ? s23 : s01;
        const uint32_t scw = (u & 2) ? sw >> 16 : sw & 0xFFFF;
#pragma unroll
        for (int j = 0; j < 2; j++) {
            const int t = 2 * u + j;
            o.d[j] = d * (float)(2 * ((scw >> (3 * (t & 3))) & 7) + 1);
        }
        const uint32_t qs = ld_u32<8>(b + 4 * u);
        const uint32_t qh = ld_u16(b + 32 + 2 * u);
#pragma unroll
        for (int l = 0; l < 4; l++) {
            const uint32_t nib = (qh >> (4 * l)) & 0xF;
            const uint64_t g = iq1s_grid[((qs >> (8 * l)) & 0xFF) | ((nib & 7) << 8)];
            o.q[2 * l] = (int)(uint32_t)g;
            o.q[2 * l + 1] = (int)(uint32_t)(g >> 32);
            o.m[l] = o.d[l >> 1] * ((nib & 8) ? -IQ1M_DELTA : IQ1M_DELTA);
        }
    }
};

template <> struct mmf<QT_IQ4_NL> {
    static constexpr int QK = 32, BYTES = 18, UPB = 1, SCALE16 = 0, MIN = 0;
    static __device__ __forceinline__ void unit(const uint8_t *b, int, mm_unit &o) {
        o.d[0] = mm_f16(ld_u16(b));
#pragma unroll
        for (int i = 0; i < 4; i++) {
            const uint32_t w = ld_u32<2>(b + 2 + 4 * i);
            o.q[i] = lut16(w & 0x0F0F0F0Fu, MM_IQ4NL_LUT);
            o.q[i + 4] = lut16((w >> 4) & 0x0F0F0F0Fu, MM_IQ4NL_LUT);
        }
    }
};

template <> struct mmf<QT_IQ4_XS> {
    static constexpr int QK = 256, BYTES = 136, UPB = 8, SCALE16 = 0, MIN = 0;
    static __device__ __forceinline__ void unit(const uint8_t *b, int u, mm_unit &o) {
        const int lo = (b[4 + (u >> 1)] >> (4 * (u & 1))) & 0xF;
        const int hi = (ld_u16(b + 2) >> (2 * u)) & 3;
        o.d[0] = mm_f16(ld_u16(b)) * (float)((lo | (hi << 4)) - 32);
        const uint2 *qp = (const uint2 *)(b + 8 + 16 * u);
        const uint2 v0 = qp[0], v1 = qp[1];
        const uint32_t w[4] = {v0.x, v0.y, v1.x, v1.y};
#pragma unroll
        for (int i = 0; i < 4; i++) {
            o.q[i] = lut16(w[i] & 0x0F0F0F0Fu, MM_IQ4NL_LUT);
            o.q[i + 4] = lut16((w[i] >> 4) & 0x0F0F0F0Fu, MM_IQ4NL_LUT);
        }
    }
};

/* MXFP4: 17-byte blocks, so only byte alignment; E8M0 -> 2^(e-128) because
 * the table holds doubled E2M1 values (quant_impl.h's qt_e8m0_to_f32_half). */
template <> struct mmf<QT_MXFP4> {
    static constexpr int QK = 32, BYTES = 17, UPB = 1, SCALE16 = 0, MIN = 0;
    static __device__ __forceinline__ void unit(const uint8_t *b, int, mm_unit &o) {
        const uint32_t e = b[0];
        o.d[0] = __uint_as_float(e < 2 ? 0x00200000u << e : (e - 1) << 23);
#pragma unroll
        for (int i = 0; i < 4; i++) {
            const uint32_t w = ld_u32<1>(b + 1 + 4 * i);
            o.q[i] = lut16(w & 0x0F0F0F0Fu, MM_MXFP4_LUT);
            o.q[i + 4] = lut16((w >> 4) & 0x0F0F0F0Fu, MM_MXFP4_LUT);
        }
    }
};

/* ---- using a unit ---- */

/* Dot of a unit with 32 int8 activations a (scale ds.x, ds.y = ds.x * sum). */
template <class F> static __device__ __forceinline__ float mm_unit_dot(const mm_unit &w, const int a[8], float2 ds) {
    int s0 = 0, s1 = 0;
#pragma unroll
    for (int i = 0; i < 4; i++) s0 = __dp4a(w.q[i], a[i], s0);
#pragma unroll
    for (int i = 4; i < 8; i++) s1 = __dp4a(w.q[i], a[i], s1);
    float r = F::SCALE16 ? w.d[0] * (float)s0 + w.d[1] * (float)s1 : w.d[0] * (float)(s0 + s1);
    if constexpr (F::MIN == 1) {
        return fmaf(r, ds.x, w.m[0] * ds.y);
    } else if constexpr (F::MIN == 2) {
        int t0 = 0, t1 = 0;
#pragma unroll
        for (int i = 0; i < 4; i++) t0 = __dp4a(a[i], 0x01010101, t0);
#pragma unroll
        for (int i = 4; i < 8; i++) t1 = __dp4a(a[i], 0x01010101, t1);
        return (r + w.m[0] * (float)t0 + w.m[1] * (float)t1) * ds.x;
    } else if constexpr (F::MIN == 3) {
#pragma unroll
        for (int l = 0; l < 4; l++)
            r += w.m[l] * (float)__dp4a(a[2 * l + 1], 0x01010101, __dp4a(a[2 * l], 0x01010101, 0));
        return r * ds.x;
    } else {
        return r * ds.x;
    }
}

/* Weight i (0..31) of a decoded unit as a float. */
template <class F> static __device__ __forceinline__ float mm_unit_weight(const mm_unit &w, int i) {
    const float q = (float)(int8_t)(w.q[i >> 2] >> (8 * (i & 3)));
    const float d = F::SCALE16 ? w.d[i >> 4] : w.d[0];
    float m = 0.0f;
    if constexpr (F::MIN == 1) m = w.m[0];
    if constexpr (F::MIN == 2) m = w.m[i >> 4];
    if constexpr (F::MIN == 3) m = w.m[i >> 3];
    return fmaf(d, q, m);
}

#endif
