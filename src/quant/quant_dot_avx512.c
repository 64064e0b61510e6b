/* AVX-512 (F/BW/VL/DQ + VNNI) dot products of the "main" weight formats;
 * compiled with those flags and only called after cpuid/xgetbv say the CPU
 * and OS run them (quant_dot.c). Formats without an entry here fall back to
 * the AVX2 kernels.
 *
 * Integer core: vpdpbusd (VNNI), unsigned x signed bytes, 4 products summed
 * into int32 with no int16 saturation step. Signed weights: |x| and
 * sign(y, x) (Q8_0, ymm has vpsignb), or an unsigned table offset by +128
 * whose extra 128*sum(y) is removed with the Q8_K bsums (IQ4_XS). Unsigned
 * weights (K-quants: Q4_K/Q5_K nibbles, Q6_K's 6-bit values before their -32)
 * go in as they are; their lane sums are small enough to be exact int16, so
 * vpdpwssd against dwords (scale, 0) applies the sub-block scale and
 * accumulates in one instruction (dot_k4, dot_q6_k).
 * zmm where it measured faster (K-quants, IQ4_XS, floats); ymm + VNNI where
 * zmm lost (Q8_0: 512-bit work has two vector ports instead of three, and its
 * per-block scale shuffles and 256-bit inserts crowd port 5). The K-quants
 * avoid such shuffles by loading 32-byte pieces broadcast into both halves of
 * a zmm (a load, no shuffle) and shifting the halves apart.
 * Layouts: see blocks.h and quant_dot_scalar.c.
 */
#include <immintrin.h>

#include "quant/dot_impl.h"
#include "quant/quant_dot_common.h"
#include "quant/quant_dot_legacy.h"
#include "quant/quant_simd_bits.h"

static inline float f16(uint16_t h) { return _cvtsh_ss(h); }

static inline __m512i load64(const void *p) { return _mm512_loadu_si512(p); }
static inline __m256i load32(const void *p) { return _mm256_loadu_si256((const __m256i *)p); }

/* ---- float formats ---- */

static void dot_f32(int n, float *s, const void *w, const void *a) {
    const float *x = w, *y = a;
    __m512 acc0 = _mm512_setzero_ps(), acc1 = acc0, acc2 = acc0, acc3 = acc0;
    int i = 0;
    for (; i + 64 <= n; i += 64) {
        acc0 = _mm512_fmadd_ps(_mm512_loadu_ps(x + i), _mm512_loadu_ps(y + i), acc0);
        acc1 = _mm512_fmadd_ps(_mm512_loadu_ps(x + i + 16), _mm512_loadu_ps(y + i + 16), acc1);
        acc2 = _mm512_fmadd_ps(_mm512_loadu_ps(x + i + 32), _mm512_loadu_ps(y + i + 32), acc2);
        acc3 = _mm512_fmadd_ps(_mm512_loadu_ps(x + i + 48), _mm512_loadu_ps(y + i + 48), acc3);
    }
    for (; i + 16 <= n; i += 16) acc0 = _mm512_fmadd_ps(_mm512_loadu_ps(x + i), _mm512_loadu_ps(y + i), acc0);
    if (i < n) { /* masked tail: no scalar loop, no read past the row */
        __mmask16 m = (__mmask16)((1u << (n - i)) - 1);
        acc1 = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(m, x + i), _mm512_maskz_loadu_ps(m, y + i), acc1);
    }
    *s = _mm512_reduce_add_ps(_mm512_add_ps(_mm512_add_ps(acc0, acc1), _mm512_add_ps(acc2, acc3)));
}

static inline __m512 cvt_f16x16(__m256i h) { return _mm512_cvtph_ps(h); }
static inline __m512 cvt_bf16x16(__m256i h) {
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}

#define DOT_HALF(name, cvt)                                                                                            \
    static void name(int n, float *s, const void *w, const void *a) {                                                  \
        const uint16_t *x = w;                                                                                         \
        const float *y = a;                                                                                            \
        __m512 acc0 = _mm512_setzero_ps(), acc1 = acc0, acc2 = acc0, acc3 = acc0;                                      \
        int i = 0;                                                                                                     \
        for (; i + 64 <= n; i += 64) {                                                                                 \
            acc0 = _mm512_fmadd_ps(cvt(load32(x + i)), _mm512_loadu_ps(y + i), acc0);                                  \
            acc1 = _mm512_fmadd_ps(cvt(load32(x + i + 16)), _mm512_loadu_ps(y + i + 16), acc1);                        \
            acc2 = _mm512_fmadd_ps(cvt(load32(x + i + 32)), _mm512_loadu_ps(y + i + 32), acc2);                        \
            acc3 = _mm512_fmadd_ps(cvt(load32(x + i + 48)), _mm512_loadu_ps(y + i + 48), acc3);                        \
        }                                                                                                              \
        for (; i + 16 <= n; i += 16) acc0 = _mm512_fmadd_ps(cvt(load32(x + i)), _mm512_loadu_ps(y + i), acc0);         \
        if (i < n) {                                                                                                   \
            __mmask16 m = (__mmask16)((1u << (n - i)) - 1);                                                            \
            __m256i h = _mm256_maskz_loadu_epi16(m, x + i);                                                            \
            acc1 = _mm512_fmadd_ps(cvt(h), _mm512_maskz_loadu_ps(m, y + i), acc1);                                     \
        }                                                                                                              \
        *s = _mm512_reduce_add_ps(_mm512_add_ps(_mm512_add_ps(acc0, acc1), _mm512_add_ps(acc2, acc3)));                \
    }

DOT_HALF(dot_f16, cvt_f16x16)
DOT_HALF(dot_bf16, cvt_bf16x16)

/* ---- the 32-weight block formats in ymm (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, IQ4_NL) ----
 * Two blocks per zmm measured slower here (the per-block scale vectors and
 * 256-bit inserts crowd port 5, and zmm work has two vector ports, ymm three),
 * so this stays 256-bit and gains from VNNI only: vpsignb + vpdpbusd replace
 * vpsignb + vpmaddubsw + vpmaddwd (Q4_1/Q5_1's unsigned weights: vpdpbusd
 * alone). Q5_0/Q5_1 also take their 5th bits as a mask register (one
 * masked vpsubb / vpaddb) where AVX2 spreads them to bytes with a shuffle,
 * an and and a compare. Each lane
 * holds the same four products as the AVX2 kernels' lanes, and the float
 * work is theirs step for step (QT_LEGACY_DOT), so the bits are the same:
 * quant_gemm_small_avx512.c's kernels equal these bit for bit. */

QT_LEGACY_SCALES()

/* signed weights x signed activations: |x| x sign(y, x) */
static inline __m256i dot_ss_vnni(__m256i xv, __m256i yv) {
    return _mm256_dpbusd_epi32(_mm256_setzero_si256(), _mm256_sign_epi8(xv, xv), _mm256_sign_epi8(yv, xv));
}

static inline __m256i qd_q8_0(const block_q8_0 *x, const block_q8_0 *y) {
    return dot_ss_vnni(load32(x->qs), load32(y->qs));
}

static inline __m256i qd_q4_0(const block_q4_0 *x, const block_q8_0 *y) {
    return dot_ss_vnni(_mm256_sub_epi8(qt_nibbles32(x->qs), _mm256_set1_epi8(8)), load32(y->qs));
}

/* Q4_1/Q5_1: unsigned weights straight into vpdpbusd; the min term apart */
static inline __m256i qd_q4_1(const block_q4_1 *x, const block_q8_1 *y) {
    return _mm256_dpbusd_epi32(_mm256_setzero_si256(), qt_nibbles32(x->qs), load32(y->qs));
}

static inline __m256i qd_q5_1(const block_q5_1 *x, const block_q8_1 *y) {
    uint32_t qh;
    memcpy(&qh, x->qh, 4);
    const __m256i nib = qt_nibbles32(x->qs);
    return _mm256_dpbusd_epi32(_mm256_setzero_si256(),
                               _mm256_mask_add_epi8(nib, (__mmask32)qh, nib, _mm256_set1_epi8(16)), load32(y->qs));
}

static inline __m256i qd_iq4_nl(const block_iq4_nl *x, const block_q8_0 *y) {
    const __m256i lut = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)kvalues_iq4nl));
    return dot_ss_vnni(_mm256_shuffle_epi8(lut, qt_nibbles32(x->qs)), load32(y->qs));
}

static inline __m256i qd_q5_0(const block_q5_0 *x, const block_q8_0 *y) {
    uint32_t qh;
    memcpy(&qh, x->qh, 4);
    const __m256i nib = qt_nibbles32(x->qs);
    return dot_ss_vnni(_mm256_mask_sub_epi8(nib, (__mmask32)~qh, nib, _mm256_set1_epi8(16)), load32(y->qs));
}

QT_LEGACY_DOTS()

/* ---- K-quants x Q8_K ---- */

/* Q4_K in zmm with vpdpbusd on the nibbles. Chunk c (32 bytes) holds
 * sub-block 2c in its low nibbles and 2c+1 in its high ones, weight l at byte
 * l: broadcast to both halves of a zmm (a load, no shuffle), shifted by 0 and
 * 4 per half and masked, it lines up with the 64 contiguous activations
 * 64c..64c+63. vpdpbusd (unsigned nibble x signed quant, 4 products per lane:
 * |sum| <= 4*15*127 = 7620) leaves each lane's sum exactly in its low int16
 * and the sign in the high one, so vpdpwssd against dwords (scale, 0) applies
 * the sub-block scale and accumulates in one instruction (|total| <=
 * 256*15*127*63 < 2^31). The min term sum_j mn_j * (bsum_2j + bsum_2j+1)
 * is one vpmaddwd with each min doubled into an int16 pair. */
/* One Q4_K/Q5_K kernel: with qh (Q5_K), the 5th bit of each weight comes
 * from qh bit 2c (sub-block 2c) or 2c+1 of byte l; qh is broadcast as the
 * nibbles are and shifted so that the bit of chunk c lands on bit 4. */
static inline __attribute__((always_inline)) void dot_k4(int n, float *s, const uint8_t *x, size_t bs,
                                                         const block_q8_K *y, const int q5) {
    const __m512i m4 = _mm512_set1_epi8(0x0f), b4 = _mm512_set1_epi8(0x10);
    const __m512i sh = _mm512_setr_epi64(0, 0, 0, 0, 4, 4, 4, 4);
    __m512i idx[4]; /* dword lanes 0..7 take scale 2c, lanes 8..15 scale 2c+1 */
    for (int c = 0; c < 4; c++)
        idx[c] = _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_set1_epi32(2 * c)), _mm256_set1_epi32(2 * c + 1), 1);
    __m512 acc = _mm512_setzero_ps();
    __m256 accm = _mm256_setzero_ps();
    for (int ib = 0; ib < n / QK_K; ib++, x += bs, y++) {
        /* both layouts start d, dmin, scales[12]; Q5_K has qh[32] before qs */
        const uint8_t *qs = x + 16 + (q5 ? 32 : 0);
        uint64_t sc, mn;
        qdot_k4_scales64(x + 4, &sc, &mn);
        uint32_t dh;
        memcpy(&dh, x, 4);
        const __m128 dd = _mm_mul_ps(_mm_cvtph_ps(_mm_cvtsi32_si128((int)dh)), _mm_set1_ps(y->d)); /* d*dy, dmin*dy */
        /* each min twice, as int16: lanes 2j, 2j+1 meet bsums 2j, 2j+1 */
        const __m128i mn2 = _mm_unpacklo_epi8(_mm_cvtsi64_si128((long long)mn), _mm_cvtsi64_si128((long long)mn));
        const __m256i msum = _mm256_madd_epi16(_mm256_cvtepu8_epi16(mn2), load32(y->bsums));
        accm = _mm256_fmadd_ps(_mm256_cvtepi32_ps(msum), _mm256_broadcastss_ps(_mm_movehdup_ps(dd)), accm);
        const __m512i scv = _mm512_cvtepu8_epi32(_mm_cvtsi64_si128((long long)sc));
        /* Q5_K: qh rotated so that bit 2c (half 0) / 2c+1 (half 1) sits on
         * bit 4 of its byte: left by 4 / 3, then right by 2 per chunk (a
         * rotation loses no bits; a shift would drop the top byte's) */
        const __m512i rot = _mm512_setr_epi64(4, 4, 4, 4, 3, 3, 3, 3);
        __m512i hb = q5 ? _mm512_rolv_epi64(_mm512_broadcast_i64x4(load32(x + 16)), rot) : _mm512_setzero_si512();
        __m512i isum = _mm512_setzero_si512();
#pragma GCC unroll 4
        for (int c = 0; c < 4; c++) {
            const __m512i q = _mm512_broadcast_i64x4(load32(qs + 32 * c));
            __m512i w8 = _mm512_and_si512(_mm512_srlv_epi64(q, sh), m4);
            if (q5) {
                w8 = _mm512_ternarylogic_epi32(w8, hb, b4, 0xf8); /* w8 | (hb & b4) */
                hb = _mm512_ror_epi64(hb, 2);
            }
            const __m512i p = _mm512_dpbusd_epi32(_mm512_setzero_si512(), w8, load64(y->qs + 64 * c));
            isum = _mm512_dpwssd_epi32(isum, p, _mm512_permutexvar_epi32(idx[c], scv));
        }
        acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum), _mm512_broadcastss_ps(dd), acc);
    }
    *s = _mm512_reduce_add_ps(acc) - qt_hsum8(accm);
}

static void dot_q4_k(int n, float *s, const void *w, const void *a) { dot_k4(n, s, w, sizeof(block_q4_K), a, 0); }

static void dot_q5_k(int n, float *s, const void *w, const void *a) { dot_k4(n, s, w, sizeof(block_q5_K), a, 1); }

/* Q6_K in zmm: per 128 weights, ql (64 bytes: chunk k holds weights 32k+l
 * in its low nibbles and 64+32k+l in its high ones) and qh (32 bytes: bits
 * 2s..2s+1 of byte l top up weight 32s+l). qh is loaded broadcast and its
 * upper half shifted by 2, so weights 0..63 and 64..127 come out in order,
 * against contiguous activations. vpdpbusd on the unsigned 6-bit values
 * (|lane| <= 4*63*127 = 32004, an exact int16), then vpdpwssd against
 * dwords (scale, 0) per 16 weights; the -32 offset is -32 * sum_g sc_g *
 * bsum_g, one vpmaddwd per block. */
static void dot_q6_k(int n, float *s, const void *w, const void *a) {
    const block_q6_K *x = w;
    const block_q8_K *y = a;
    const __m512i m4 = _mm512_set1_epi8(0x0f), m2 = _mm512_set1_epi8(0x30), lo16 = _mm512_set1_epi32(0xffff);
    const __m512i sh = _mm512_setr_epi64(0, 0, 0, 0, 2, 2, 2, 2);
    __m512i idx[4]; /* weights 64m..64m+63: dword lanes 4j..4j+3 take scale 4m+j */
    for (int m = 0; m < 4; m++)
        idx[m] = _mm512_add_epi32(_mm512_set1_epi32(4 * m),
                                  _mm512_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3));
    __m512 acc = _mm512_setzero_ps();
    for (int ib = 0; ib < n / QK_K; ib++) {
        const __m128i sc8 = _mm_loadu_si128((const __m128i *)x[ib].scales);
        /* the -32 comes back as -32 * sum_g sc_g * bsum_g, subtracted after the
         * products: starting the accumulator from it put the bsums load (an
         * L2 miss when the activations change per call) at the head of the
         * vpdpwssd chain; 35% of the time of a dot loop over 64 tokens */
        const __m256i bias = _mm256_madd_epi16(_mm256_cvtepi8_epi16(sc8), load32(y[ib].bsums));
        __m512i isum = _mm512_setzero_si512();
        const __m512i scv = _mm512_and_si512(_mm512_cvtepi8_epi32(sc8), lo16); /* (scale, 0) */
#pragma GCC unroll 2
        for (int hf = 0; hf < 2; hf++) {
            const __m512i ql = load64(x[ib].ql + 64 * hf);
            const __m512i h = _mm512_srlv_epi64(_mm512_broadcast_i64x4(load32(x[ib].qh + 32 * hf)), sh);
            const __m512i z0 = _mm512_ternarylogic_epi32(_mm512_and_si512(ql, m4), _mm512_slli_epi16(h, 4), m2, 0xf8);
            const __m512i z1 = _mm512_ternarylogic_epi32(_mm512_and_si512(_mm512_srli_epi16(ql, 4), m4), h, m2, 0xf8);
            const __m512i p0 = _mm512_dpbusd_epi32(_mm512_setzero_si512(), z0, load64(y[ib].qs + 128 * hf));
            const __m512i p1 = _mm512_dpbusd_epi32(_mm512_setzero_si512(), z1, load64(y[ib].qs + 128 * hf + 64));
            isum = _mm512_dpwssd_epi32(isum, p0, _mm512_permutexvar_epi32(idx[2 * hf], scv));
            isum = _mm512_dpwssd_epi32(isum, p1, _mm512_permutexvar_epi32(idx[2 * hf + 1], scv));
        }
        isum = _mm512_sub_epi32(isum, _mm512_zextsi256_si512(_mm256_slli_epi32(bias, 5)));
        acc = _mm512_fmadd_ps(_mm512_set1_ps(y[ib].d * f16(x[ib].d)), _mm512_cvtepi32_ps(isum), acc);
    }
    *s = _mm512_reduce_add_ps(acc);
}

/* IQ4_XS: the table offset by +128 makes the weights unsigned for vpdpbusd;
 * the extra 128 * sum(y) per sub-block is removed with the bsums. Scales:
 * byte j of pdep(scales_l, 0x0f..) is the low nibble of scale j, and
 * pdep(scales_h, 0x30..) puts its 2 high bits at bits 4..5. */
static void dot_iq4_xs(int n, float *s, const void *w, const void *a) {
    const block_iq4_xs *x = w;
    const block_q8_K *y = a;
    int8_t lut_u[16];
    for (int i = 0; i < 16; i++) lut_u[i] = (int8_t)(kvalues_iq4nl[i] + 128);
    const __m512i lut = _mm512_broadcast_i32x4(_mm_loadu_si128((const __m128i *)lut_u));
    const __m512i m4 = _mm512_set1_epi8(0x0f);
    const __m512i idx_lo = _mm512_set_epi32(3, 3, 3, 3, 2, 2, 2, 2, 1, 1, 1, 1, 0, 0, 0, 0);
    const __m512i idx_hi = _mm512_add_epi32(idx_lo, _mm512_set1_epi32(4));
    __m512 acc = _mm512_setzero_ps();
    for (int ib = 0; ib < n / QK_K; ib++) {
        uint32_t sl;
        memcpy(&sl, x[ib].scales_l, 4);
        uint64_t ls8 = _pdep_u64(sl, 0x0f0f0f0f0f0f0f0full) | _pdep_u64(x[ib].scales_h, 0x3030303030303030ull);
        __m128i ls = _mm_sub_epi16(_mm_cvtepu8_epi16(_mm_cvtsi64_si128((long long)ls8)), _mm_set1_epi16(32));
        /* correction: 128 * sum_j ls_j * (bsum_2j + bsum_2j+1) */
        __m256i ls_dup = _mm256_cvtepu8_epi16(
            _mm_unpacklo_epi8(_mm_cvtsi64_si128((long long)ls8), _mm_cvtsi64_si128((long long)ls8)));
        ls_dup = _mm256_sub_epi16(ls_dup, _mm256_set1_epi16(32));
        __m256i corr = _mm256_madd_epi16(ls_dup, load32(y[ib].bsums));
        __m512i isum = _mm512_sub_epi32(_mm512_setzero_si512(), _mm512_zextsi256_si512(_mm256_slli_epi32(corr, 7)));
        __m512i ls32 = _mm512_castsi256_si512(_mm256_cvtepi16_epi32(ls));
        for (int h = 0; h < 2; h++) {
            /* 64 bytes = sub-blocks 4h..4h+3 (16 bytes each: low nibbles weights 0..15,
             * high 16..31); the y halves are regrouped to match */
            __m512i q = load64(x[ib].qs + 64 * h);
            __m512i ulo = _mm512_shuffle_epi8(lut, _mm512_and_si512(q, m4));
            __m512i uhi = _mm512_shuffle_epi8(lut, _mm512_and_si512(_mm512_srli_epi16(q, 4), m4));
            __m512i y0 = load64(y[ib].qs + 128 * h), y1 = load64(y[ib].qs + 128 * h + 64);
            __m512i ylo = _mm512_shuffle_i64x2(y0, y1, _MM_SHUFFLE(2, 0, 2, 0));
            __m512i yhi = _mm512_shuffle_i64x2(y0, y1, _MM_SHUFFLE(3, 1, 3, 1));
            __m512i p = _mm512_dpbusd_epi32(_mm512_setzero_si512(), ulo, ylo);
            p = _mm512_dpbusd_epi32(p, uhi, yhi);
            __m512i lsv = _mm512_permutexvar_epi32(h ? idx_hi : idx_lo, ls32);
            isum = _mm512_add_epi32(isum, _mm512_mullo_epi32(p, lsv));
        }
        acc = _mm512_fmadd_ps(_mm512_set1_ps(y[ib].d * f16(x[ib].d)), _mm512_cvtepi32_ps(isum), acc);
    }
    *s = _mm512_reduce_add_ps(acc);
}

/* ---- MXFP4 x Q8_0 ----
 * Two blocks per zmm, each 128-bit lane 16 weights: block j's 16 code bytes
 * broadcast to lanes (2j, 2j+1) (a load, an insert, one vshufi64x2), lanes
 * 2j+1 shifted right by 4 (high nibbles: weights 16..31), masked: the lanes
 * then line up with the two Q8_0 blocks' 64 contiguous activations (a load
 * and an insert, no shuffle). The E2M1 table (doubled values, -12..12) is
 * offset by +12 so that vpdpbusd takes it unsigned; the extra 12 * sum(y) is
 * one more vpdpbusd of the same activations, subtracted. Scales: 8 blocks'
 * E8M0 and f16 products at once, each pair's spread to its lanes with one
 * vpermps. The AVX2 kernel (vpmaddubsw + vpmaddwd per block, ymm) ran 11
 * GB/s in L2 on one core of this machine's class; this one: docs/cpu-kernels.md. */

static inline __m256 d8_mxfp4(const block_mxfp4 *b) { /* qdot_e8m0_half of 8 blocks */
    uint8_t e[8];
    for (int k = 0; k < 8; k++) e[k] = b[k].e;
    const __m256i v = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)e));
    const __m256i normal = _mm256_slli_epi32(_mm256_sub_epi32(v, _mm256_set1_epi32(1)), 23);
    const __m256i sub = _mm256_sllv_epi32(_mm256_set1_epi32(0x00200000), v);
    return _mm256_castsi256_ps(_mm256_mask_blend_epi32(_mm256_cmpgt_epi32_mask(v, _mm256_set1_epi32(1)), sub, normal));
}

/* the int32 lane sums of blocks x[0], x[1] against y[0], y[1] (lanes 0-1, 2-3) */
static inline __m512i qd_mxfp4_pair(const block_mxfp4 *x, const block_q8_0 *y, __m512i lut, __m512i sh) {
    const __m256i q2 = _mm256_inserti128_si256(_mm256_castsi128_si256(_mm_loadu_si128((const __m128i *)x[0].qs)),
                                               _mm_loadu_si128((const __m128i *)x[1].qs), 1);
    const __m512i q =
        _mm512_shuffle_i64x2(_mm512_castsi256_si512(q2), _mm512_castsi256_si512(q2), _MM_SHUFFLE(1, 1, 0, 0));
    const __m512i codes = _mm512_and_si512(_mm512_srlv_epi64(q, sh), _mm512_set1_epi8(0x0f));
    const __m512i yv = _mm512_inserti64x4(_mm512_castsi256_si512(load32(y[0].qs)), load32(y[1].qs), 1);
    const __m512i p = _mm512_dpbusd_epi32(_mm512_setzero_si512(), _mm512_shuffle_epi8(lut, codes), yv);
    return _mm512_sub_epi32(p, _mm512_dpbusd_epi32(_mm512_setzero_si512(), _mm512_set1_epi8(12), yv));
}

static void dot_mxfp4(int n, float *s, const void *w, const void *a) {
    const block_mxfp4 *x = w;
    const block_q8_0 *y = a;
    const int nb = n / QK_MXFP4;
    int8_t lut_u[16];
    for (int i = 0; i < 16; i++) lut_u[i] = (int8_t)(kvalues_mxfp4[i] + 12);
    const __m512i lut = _mm512_broadcast_i32x4(_mm_loadu_si128((const __m128i *)lut_u));
    const __m512i sh = _mm512_set_epi64(4, 4, 0, 0, 4, 4, 0, 0);
    const __m512i pair_idx = _mm512_set_epi32(1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0);
    __m512 acc0 = _mm512_setzero_ps(), acc1 = _mm512_setzero_ps();
    int ib = 0;
    for (; ib + 8 <= nb; ib += 8) {
        uint16_t h[8];
        for (int k = 0; k < 8; k++) h[k] = y[ib + k].d;
        const __m512 dd = _mm512_castps256_ps512(
            _mm256_mul_ps(d8_mxfp4(x + ib), _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)h))));
        for (int k = 0; k < 8; k += 4) {
            const __m512 s0 = _mm512_permutexvar_ps(_mm512_add_epi32(pair_idx, _mm512_set1_epi32(k)), dd);
            const __m512 s1 = _mm512_permutexvar_ps(_mm512_add_epi32(pair_idx, _mm512_set1_epi32(k + 2)), dd);
            acc0 = _mm512_fmadd_ps(s0, _mm512_cvtepi32_ps(qd_mxfp4_pair(x + ib + k, y + ib + k, lut, sh)), acc0);
            acc1 =
                _mm512_fmadd_ps(s1, _mm512_cvtepi32_ps(qd_mxfp4_pair(x + ib + k + 2, y + ib + k + 2, lut, sh)), acc1);
        }
    }
    for (; ib + 2 <= nb; ib += 2) {
        const __m512 sc = _mm512_insertf32x8(_mm512_set1_ps(qdot_e8m0_half(x[ib].e) * f16(y[ib].d)),
                                             _mm256_set1_ps(qdot_e8m0_half(x[ib + 1].e) * f16(y[ib + 1].d)), 1);
        acc0 = _mm512_fmadd_ps(sc, _mm512_cvtepi32_ps(qd_mxfp4_pair(x + ib, y + ib, lut, sh)), acc0);
    }
    float sum = _mm512_reduce_add_ps(_mm512_add_ps(acc0, acc1));
    for (; ib < nb; ib++) { /* an odd last block */
        int isum = 0;
        for (int j = 0; j < QK_MXFP4 / 2; j++)
            isum += kvalues_mxfp4[x[ib].qs[j] & 0xf] * y[ib].qs[j] + kvalues_mxfp4[x[ib].qs[j] >> 4] * y[ib].qs[j + 16];
        sum += qdot_e8m0_half(x[ib].e) * f16(y[ib].d) * (float)isum;
    }
    *s = sum;
}

/* ---- activation quantizers (qt_quantize_act when AVX-512 runs) ----
 * The AVX2 ones (quant_dot_avx2.c) 16 lanes wide, writing the scalar
 * path's bytes: the same d = amax/127 and id = 1/d in scalar, the same
 * products x*id, round half away from zero from the exact remainder, and a
 * saturating narrow to bytes (vpmovsdb) where AVX2 packs twice. Q8_0 and
 * Q8_1 need no clamp (|x*id| <= 127 plus rounding). A prompt's quantizing
 * took 9.5% of SmolLM2's pp512 on the AVX2 code. */

static inline float absmax_avx512(const float *x, int n) {
    __m512 m = _mm512_setzero_ps();
    for (int i = 0; i < n; i += 16) m = _mm512_max_ps(m, _mm512_abs_ps(_mm512_loadu_ps(x + i)));
    return _mm512_reduce_max_ps(m);
}

static inline __m512i round_away_avx512(__m512 v) {
    const __m512 t = _mm512_roundscale_ps(v, _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC);
    const __mmask16 up = _mm512_cmp_ps_mask(_mm512_abs_ps(_mm512_sub_ps(v, t)), _mm512_set1_ps(0.5f), _CMP_GE_OQ);
    const __m512 one = _mm512_or_ps(_mm512_and_ps(v, _mm512_set1_ps(-0.0f)), _mm512_set1_ps(1.0f)); /* copysign */
    return _mm512_cvtps_epi32(_mm512_mask_add_ps(t, up, t, one));
}

/* 16 floats * id, clamped to [lo, hi] when clamp, rounded, as int32 */
static inline __m512i quant16_avx512(const float *x, __m512 id, int clamp) {
    __m512 v = _mm512_mul_ps(_mm512_loadu_ps(x), id);
    if (clamp) v = _mm512_min_ps(_mm512_max_ps(v, _mm512_set1_ps(-127.0f)), _mm512_set1_ps(127.0f));
    return round_away_avx512(v);
}

/* f32 -> f16 by F16C, nearest even: st_f32_to_f16's bits for every finite
 * value (the scales here are), without its branches */
static inline uint16_t f16_of(float f) { return (uint16_t)_cvtss_sh(f, _MM_FROUND_TO_NEAREST_INT); }

static inline void store32_i8(int8_t *q, __m512i a, __m512i b) {
    _mm_storeu_si128((__m128i *)q, _mm512_cvtsepi32_epi8(a));
    _mm_storeu_si128((__m128i *)(q + 16), _mm512_cvtsepi32_epi8(b));
}

void qdot_quantize_q8_0_avx512(const float *x, block_q8_0 *y, int64_t nb) {
    for (int64_t ib = 0; ib < nb; ib++, x += QK8_0) {
        const float d = absmax_avx512(x, QK8_0) / 127.0f, id = d != 0.0f ? 1.0f / d : 0.0f;
        y[ib].d = f16_of(d);
        store32_i8(y[ib].qs, quant16_avx512(x, _mm512_set1_ps(id), 0), quant16_avx512(x + 16, _mm512_set1_ps(id), 0));
    }
}

void qdot_quantize_q8_1_avx512(const float *x, block_q8_1 *y, int64_t nb) {
    for (int64_t ib = 0; ib < nb; ib++, x += QK8_1) {
        const float d = absmax_avx512(x, QK8_1) / 127.0f, id = d != 0.0f ? 1.0f / d : 0.0f;
        const __m512i a = quant16_avx512(x, _mm512_set1_ps(id), 0), b = quant16_avx512(x + 16, _mm512_set1_ps(id), 0);
        store32_i8(y[ib].qs, a, b);
        y[ib].d = f16_of(d);
        y[ib].s = f16_of(d * (float)_mm512_reduce_add_epi32(_mm512_add_epi32(a, b)));
    }
}

void qdot_quantize_q8_k_avx512(const float *x, block_q8_K *y, int64_t nb) {
    for (int64_t ib = 0; ib < nb; ib++, x += QK_K) {
        const float amax = absmax_avx512(x, QK_K);
        if (amax == 0.0f) {
            memset(&y[ib], 0, sizeof y[ib]);
            continue;
        }
        const float iscale = 127.0f / amax;
        for (int c = 0; c < QK_K / 16; c += 2) {
            const __m512i a = quant16_avx512(x + 16 * c, _mm512_set1_ps(iscale), 1);
            const __m512i b = quant16_avx512(x + 16 * c + 16, _mm512_set1_ps(iscale), 1);
            store32_i8(y[ib].qs + 16 * c, a, b);
            y[ib].bsums[c] = (int16_t)_mm512_reduce_add_epi32(a);
            y[ib].bsums[c + 1] = (int16_t)_mm512_reduce_add_epi32(b);
        }
        y[ib].d = 1.0f / iscale;
    }
}

const qt_vec_dot_fn qt_dots_main_avx512[QT_COUNT] = {
    [QT_F32] = dot_f32,       [QT_F16] = dot_f16,     [QT_BF16] = dot_bf16, [QT_Q4_0] = dot_q4_0,
    [QT_Q4_1] = dot_q4_1,     [QT_Q5_0] = dot_q5_0,   [QT_Q5_1] = dot_q5_1, [QT_Q8_0] = dot_q8_0,
    [QT_IQ4_NL] = dot_iq4_nl, [QT_Q4_K] = dot_q4_k,   [QT_Q5_K] = dot_q5_k, [QT_Q6_K] = dot_q6_k,
    [QT_IQ4_XS] = dot_iq4_xs, [QT_MXFP4] = dot_mxfp4,
};
