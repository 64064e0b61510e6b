/* Dot products of the i-quant weight formats (IQ2_XXS, IQ2_XS, IQ2_S,
 * IQ3_XXS, IQ3_S, IQ1_S, IQ1_M) with Q8_K activations: the AVX-512 path
 * (F, BW, VL, DQ, VNNI).
 *
 * Same integer arithmetic as quant_dot_iq_scalar.c, 64 weights per step:
 *   - grid rows come in with one gather (8 qword rows, or 16 dword rows for
 *     IQ3), the indices built in vector registers from the packed bits;
 *   - the 64 sign bits of a step are exactly an AVX-512 byte mask, so the
 *     activations are negated with one masked subtract and the grid stays
 *     unsigned for vpmaddubsw (pairs fit int16: 2*62*127 < 32767);
 *   - vpdpwssd (VNNI) multiplies the int16 pair sums by the sub-block's odd
 *     scale 2s+1 and accumulates in int32; the per-block scale vector is
 *     built once and spread per step with vpermw.
 * 7-bit sign indices expand to 8 bits with the parity rule of ksigns_iq2xs:
 * for IQ2_XXS/IQ3_XXS, whose indices sit in 8 aux words, all 32 of a block
 * at once in a ymm (ksigns32); for IQ2_XS, 8 groups at a time in a 64-bit
 * register (ksigns8).
 * Gathers are slow on AMD (Zen 5: IQ2_XXS 4.7 GB/s on one core with them):
 * IQ2_XXS also has a variant loading its grid rows one by one (8.7 GB/s
 * there), qt_dots_iq_avx512_loads; quant_dot.c picks by vendor.
 * Activations must be Q8_K as qt_quantize_act makes them: |q| <= 127 (so
 * that negating never overflows) and bsums filled (IQ1).
 * IQ1_M uses the unsigned weight 8*(g+1) + (delta+1) in 0..18 and subtracts
 * 9*sum(q) per scale group using the Q8_K bsums; IQ1_S, whose delta is
 * constant per 32 weights, uses g+1 and takes the whole delta from bsums.
 */
#include <immintrin.h>
#include <string.h>

#include "quant/dot_impl.h"
#include "quant/iq_tables.h"
#include "quant/quant_dot_iq_avx512.h"

/* 8 qword gather indices lo[j] | hi[j] << 8: bytes interleaved into words
 * (lo is read as 16 bytes, of which the first 8 count). */
static inline __m512i idx_lo_hi(const uint8_t *lo, uint64_t hi) {
    const __m128i l = _mm_loadu_si128((const __m128i *)lo);
    return _mm512_cvtepu16_epi64(_mm_unpacklo_epi8(l, _mm_cvtsi64_si128((long long)hi)));
}

/* 8 qword grid rows, indices i0[0..3] then i1[0..3], by scalar loads and
 * inserts: where vpgatherqq is slow (AMD Zen 5 here: the IQ2_XXS dot ran at
 * 4.7 GB/s with it, 8.7 without) */
static inline __m512i rows8_loads(const uint64_t *grid, const uint8_t *i0, const uint8_t *i1) {
    const __m128i a = _mm_insert_epi64(_mm_cvtsi64_si128((long long)grid[i0[0]]), (long long)grid[i0[1]], 1);
    const __m128i b = _mm_insert_epi64(_mm_cvtsi64_si128((long long)grid[i0[2]]), (long long)grid[i0[3]], 1);
    const __m128i c = _mm_insert_epi64(_mm_cvtsi64_si128((long long)grid[i1[0]]), (long long)grid[i1[1]], 1);
    const __m128i e = _mm_insert_epi64(_mm_cvtsi64_si128((long long)grid[i1[2]]), (long long)grid[i1[3]], 1);
    return _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_set_m128i(b, a)), _mm256_set_m128i(e, c), 1);
}

static inline __m512i rows8_gather(const uint64_t *grid, const uint8_t *i0, const uint8_t *i1) {
    const __m128i ix = _mm_unpacklo_epi32(_mm_cvtsi32_si128((int)load_u32(i0)), _mm_cvtsi32_si128((int)load_u32(i1)));
    return _mm512_i64gather_epi64(_mm512_cvtepu8_epi64(ix), (const void *)grid, 8);
}

/* qs: 8 x (aux0: 4 grid bytes, aux1: 4x7 sign bits | scale << 28) */
static inline __attribute__((always_inline)) void iq2_xxs_impl(int n, float *s, const block_iq2_xxs *x,
                                                               const block_q8_K *y, const int gather) {
    const __m512i odd = _mm512_setr_epi32(1, 3, 5, 7, 9, 11, 13, 15, 1, 3, 5, 7, 9, 11, 13, 15);
    __m512i pidx[4]; /* int16 lanes 0..15 take sub-block 2k's scale (lane 4k), 16..31 2k+1's */
    for (int k = 0; k < 4; k++)
        pidx[k] = _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_set1_epi16((short)(4 * k))),
                                     _mm256_set1_epi16((short)(4 * k + 2)), 1);
    __m512 accf = _mm512_setzero_ps();
    for (int i = 0; i < n / QK_K; i++) {
        const float d = _cvtsh_ss(x[i].d) * y[i].d;
        const uint8_t *qb = (const uint8_t *)x[i].qs;
        const __m256i aux = _mm512_castsi512_si256(_mm512_permutexvar_epi32(odd, _mm512_loadu_si512(qb)));
        const __m256i t = _mm256_srli_epi32(aux, 28);
        const __m512i sc = _mm512_castsi256_si512(_mm256_add_epi32(_mm256_add_epi32(t, t), _mm256_set1_epi32(1)));
        uint64_t sg[4]; /* read back by kmovq from memory, no shuffle */
        _mm256_storeu_si256((__m256i *)sg, ksigns32(aux));
        const int8_t *q8 = y[i].qs;
        __m512i acc = _mm512_setzero_si512();
#pragma GCC unroll 8
        for (int k = 0; k < 4; k++) {
            const uint8_t *ix = qb + 16 * k; /* sub-blocks 2k, 2k+1: index bytes at 0..3 and 8..11 */
            const __m512i g = gather ? rows8_gather(iq2xxs_grid, ix, ix + 8) : rows8_loads(iq2xxs_grid, ix, ix + 8);
            const __m512i q = load_signed(q8 + 64 * k, sg[k]);
            const __m512i p = _mm512_maddubs_epi16(g, q);
            acc = _mm512_dpwssd_epi32(acc, p, _mm512_permutexvar_epi16(pidx[k], sc));
        }
        accf = _mm512_fmadd_ps(_mm512_set1_ps(d), _mm512_cvtepi32_ps(acc), accf);
    }
    *s = 0.125f * _mm512_reduce_add_ps(accf);
}

static void dot_iq2_xxs(int n, float *s, const void *w, const void *a) { iq2_xxs_impl(n, s, w, a, 1); }
static void dot_iq2_xxs_loads(int n, float *s, const void *w, const void *a) { iq2_xxs_impl(n, s, w, a, 0); }

static void dot_iq2_xs(int n, float *s, const void *w, const void *a) {
    const block_iq2_xs *x = w;
    const block_q8_K *y = a;
    const scale_perm sp = perm_per16();
    __m512i pidx[4]; /* hoisted: the step loops are unrolled, so these stay in registers */
    for (int k = 0; k < 4; k++) pidx[k] = perm_at(sp, k);
    const __m512i m511 = _mm512_set1_epi64(511);
    __m512 accf = _mm512_setzero_ps();
    for (int i = 0; i < n / QK_K; i++) {
        const float d = _cvtsh_ss(x[i].d) * y[i].d;
        const __m512i sc = odd_scales_nib16(load_u64(x[i].scales));
        const int8_t *q8 = y[i].qs;
        __m512i acc = _mm512_setzero_si512();
#pragma GCC unroll 8
        for (int k = 0; k < 4; k++) {
            /* eight uint16: 9-bit grid index | 7-bit sign index << 9 */
            const __m128i v = _mm_loadu_si128((const __m128i *)(x[i].qs + 8 * k));
            const __m512i idx = _mm512_and_si512(_mm512_cvtepu16_epi64(v), m511);
            const __m512i g = _mm512_i64gather_epi64(idx, (const void *)iq2xs_grid, 8);
            /* the sign fields again from memory: cheaper than moving lanes out of v */
            const uint64_t sg = _pext_u64(load_u64(x[i].qs + 8 * k), 0xfe00fe00fe00fe00ULL) |
                                (_pext_u64(load_u64(x[i].qs + 8 * k + 4), 0xfe00fe00fe00fe00ULL) << 28);
            const __m512i q = load_signed(q8 + 64 * k, ksigns8(sg));
            const __m512i p = _mm512_maddubs_epi16(g, q);
            acc = _mm512_dpwssd_epi32(acc, p, _mm512_permutexvar_epi16(pidx[k], sc));
        }
        accf = _mm512_fmadd_ps(_mm512_set1_ps(d), _mm512_cvtepi32_ps(acc), accf);
    }
    *s = 0.125f * _mm512_reduce_add_ps(accf);
}

static void dot_iq2_s(int n, float *s, const void *w, const void *a) {
    const block_iq2_s *x = w;
    const block_q8_K *y = a;
    const scale_perm sp = perm_per16();
    __m512i pidx[4]; /* hoisted: the step loops are unrolled, so these stay in registers */
    for (int k = 0; k < 4; k++) pidx[k] = perm_at(sp, k);
    __m512 accf = _mm512_setzero_ps();
    for (int i = 0; i < n / QK_K; i++) {
        const float d = _cvtsh_ss(x[i].d) * y[i].d;
        const __m512i sc = odd_scales_nib16(load_u64(x[i].scales));
        const uint8_t *signs = x[i].qs + QK_K / 8;
        const int8_t *q8 = y[i].qs;
        __m512i acc = _mm512_setzero_si512();
#pragma GCC unroll 8
        for (int k = 0; k < 4; k++) {
            /* 10-bit indices: low bytes in qs, 2 high bits each from qh[2k], qh[2k+1] */
            const uint64_t hb = _pdep_u64(load_u32(x[i].qh + 2 * k) & 0xffff, 0x0303030303030303ULL);
            const __m512i g = _mm512_i64gather_epi64(idx_lo_hi(x[i].qs + 8 * k, hb), (const void *)iq2s_grid, 8);
            const __m512i q = load_signed(q8 + 64 * k, load_u64(signs + 8 * k));
            const __m512i p = _mm512_maddubs_epi16(g, q);
            acc = _mm512_dpwssd_epi32(acc, p, _mm512_permutexvar_epi16(pidx[k], sc));
        }
        accf = _mm512_fmadd_ps(_mm512_set1_ps(d), _mm512_cvtepi32_ps(acc), accf);
    }
    *s = 0.125f * _mm512_reduce_add_ps(accf);
}

/* qs: 64 grid bytes (4 weights each), then 8 aux words as IQ2_XXS's aux1 */
static void dot_iq3_xxs(int n, float *s, const void *w, const void *a) {
    const block_iq3_xxs *x = w;
    const block_q8_K *y = a;
    const scale_perm sp = perm_per32(2, 0);
    __m512i pidx[4]; /* hoisted: the step loops are unrolled, so these stay in registers */
    for (int k = 0; k < 4; k++) pidx[k] = perm_at(sp, k);
    __m512 accf = _mm512_setzero_ps();
    for (int i = 0; i < n / QK_K; i++) {
        const float d = _cvtsh_ss(x[i].d) * y[i].d;
        const uint8_t *qs = x[i].qs;
        const __m256i aux = _mm256_loadu_si256((const __m256i *)(x[i].qs + QK_K / 4));
        /* 2s+1 of sub-block ib in int16 lane 2ib */
        const __m256i t = _mm256_srli_epi32(aux, 28);
        const __m512i sc = _mm512_zextsi256_si512(_mm256_add_epi32(_mm256_add_epi32(t, t), _mm256_set1_epi32(1)));
        uint64_t sg[4];
        _mm256_storeu_si256((__m256i *)sg, ksigns32(aux));
        const int8_t *q8 = y[i].qs;
        __m512i acc = _mm512_setzero_si512();
#pragma GCC unroll 8
        for (int k = 0; k < 4; k++) {
            const __m512i idx = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(qs + 16 * k)));
            const __m512i g = _mm512_i32gather_epi32(idx, (const void *)iq3xxs_grid, 4);
            const __m512i q = load_signed(q8 + 64 * k, sg[k]);
            const __m512i p = _mm512_maddubs_epi16(g, q);
            acc = _mm512_dpwssd_epi32(acc, p, _mm512_permutexvar_epi16(pidx[k], sc));
        }
        accf = _mm512_fmadd_ps(_mm512_set1_ps(d), _mm512_cvtepi32_ps(acc), accf);
    }
    *s = 0.25f * _mm512_reduce_add_ps(accf);
}

static void dot_iq3_s(int n, float *s, const void *w, const void *a) {
    const block_iq3_s *x = w;
    const block_q8_K *y = a;
    const scale_perm sp = perm_per16(); /* scales are spread per 32 below: lanes 2ib, 2ib+1 */
    __m512i pidx[4];                    /* hoisted: the step loops are unrolled, so these stay in registers */
    for (int k = 0; k < 4; k++) pidx[k] = perm_at(sp, k);
    const __m512i bit8 = _mm512_set1_epi32(256);
    __m512 accf = _mm512_setzero_ps();
    for (int i = 0; i < n / QK_K; i++) {
        const float d = _cvtsh_ss(x[i].d) * y[i].d;
        /* 8 nibbles -> 2s+1, each duplicated so that the per-16 permutation applies */
        const uint64_t nib = load_u32(x[i].scales);
        const uint64_t dup = _pdep_u64(nib, 0x0f0f0f0f0f0f0f0fULL);
        const __m256i s8 = _mm256_cvtepu8_epi16(
            _mm_unpacklo_epi8(_mm_cvtsi64_si128((long long)dup), _mm_cvtsi64_si128((long long)dup)));
        const __m512i sc = _mm512_zextsi256_si512(_mm256_add_epi16(_mm256_add_epi16(s8, s8), _mm256_set1_epi16(1)));
        const int8_t *q8 = y[i].qs;
        __m512i acc = _mm512_setzero_si512();
#pragma GCC unroll 8
        for (int k = 0; k < 4; k++) {
            /* 9-bit indices: bit j of qh[2k..2k+1] is index j's 9th bit */
            const __m512i lo = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(x[i].qs + 16 * k)));
            const __mmask16 h = (__mmask16)(load_u32(x[i].qh + 2 * k) & 0xffff);
            const __m512i g = _mm512_i32gather_epi32(_mm512_mask_or_epi32(lo, h, lo, bit8), (const void *)iq3s_grid, 4);
            const __m512i q = load_signed(q8 + 64 * k, load_u64(x[i].signs + 8 * k));
            const __m512i p = _mm512_maddubs_epi16(g, q);
            acc = _mm512_dpwssd_epi32(acc, p, _mm512_permutexvar_epi16(pidx[k], sc));
        }
        accf = _mm512_fmadd_ps(_mm512_set1_ps(d), _mm512_cvtepi32_ps(acc), accf);
    }
    *s = _mm512_reduce_add_ps(accf);
}

/* The unsigned IQ1 weight 8*(g+1) + (delta+1): bytes of g+1 are <= 2, so a
 * 16-bit shift by 3 cannot carry; dneg has a bit set where delta = -1. */
static inline __m512i iq1_weights(__m512i g, __mmask64 dneg) {
    const __m512i g1 = _mm512_add_epi8(g, _mm512_set1_epi8(1));
    const __m512i g8 = _mm512_slli_epi16(g1, 3);
    return _mm512_mask_add_epi8(g8, ~dneg, g8, _mm512_set1_epi8(2));
}

static void dot_iq1_s(int n, float *s, const void *w, const void *a) {
    const block_iq1_s *x = w;
    const block_q8_K *y = a;
    const scale_perm sp = perm_per16();
    __m512i pidx[4]; /* hoisted: the step loops are unrolled, so these stay in registers */
    for (int k = 0; k < 4; k++) pidx[k] = perm_at(sp, k);
    const __m512i one = _mm512_set1_epi8(1);
    __m512 accf = _mm512_setzero_ps();
    for (int i = 0; i < n / QK_K; i++) {
        const float d = _cvtsh_ss(x[i].d) * y[i].d;
        /* per 32 weights: qh = 4x3 high index bits | scale << 12 | delta sign << 15.
         * The delta is constant over the 32 weights, so with the unsigned weight
         * g+1: sum (8g + delta) q = 8 sum (g+1) q + (delta - 8) sum q, and sum q
         * comes from bsums. */
        const __m128i qh = _mm_loadu_si128((const __m128i *)x[i].qh);
        const __m128i ls = _mm_add_epi16(_mm_and_si128(_mm_srli_epi16(qh, 11), _mm_set1_epi16(14)), _mm_set1_epi16(1));
        const __m128i dm8 = _mm_sub_epi16(_mm_set1_epi16(-7), _mm_slli_epi16(_mm_srli_epi16(qh, 15), 1));
        const __m256i ls2 = _mm256_cvtepu16_epi32(_mm_slli_epi16(ls, 3));
        const __m256i c2 = _mm256_cvtepu16_epi32(_mm_mullo_epi16(ls, dm8));
        /* duplicated into both int16 halves: one value per 16 weights */
        const __m512i sc = _mm512_zextsi256_si512(_mm256_or_si256(ls2, _mm256_slli_epi32(ls2, 16)));
        const __m256i coef =
            _mm256_or_si256(_mm256_and_si256(c2, _mm256_set1_epi32(0xffff)), _mm256_slli_epi32(c2, 16));
        const __m256i corr = _mm256_madd_epi16(_mm256_loadu_si256((const __m256i *)y[i].bsums), coef);
        const uint8_t *qs = x[i].qs;
        const int8_t *q8 = y[i].qs;
        __m512i acc = _mm512_zextsi256_si512(corr);
#pragma GCC unroll 8
        for (int k = 0; k < 4; k++) {
            const uint32_t h = load_u32(x[i].qh + 2 * k); /* qh of ib 2k | of ib 2k+1 << 16 */
            const uint64_t hb = _pdep_u64((h & 0xfff) | ((h >> 4) & 0xfff000), 0x0707070707070707ULL);
            const __m512i g = _mm512_i64gather_epi64(idx_lo_hi(qs + 8 * k, hb), (const void *)iq1s_grid, 8);
            const __m512i p = _mm512_maddubs_epi16(_mm512_add_epi8(g, one), _mm512_loadu_si512(q8 + 64 * k));
            acc = _mm512_dpwssd_epi32(acc, p, _mm512_permutexvar_epi16(pidx[k], sc));
        }
        accf = _mm512_fmadd_ps(_mm512_set1_ps(d), _mm512_cvtepi32_ps(acc), accf);
    }
    *s = 0.125f * _mm512_reduce_add_ps(accf);
}

static void dot_iq1_m(int n, float *s, const void *w, const void *a) {
    const block_iq1_m *x = w;
    const block_q8_K *y = a;
    const scale_perm sp = perm_per16();
    __m512i pidx[4]; /* hoisted: the step loops are unrolled, so these stay in registers */
    for (int k = 0; k < 4; k++) pidx[k] = perm_at(sp, k);
    __m512 accf = _mm512_setzero_ps();
    for (int i = 0; i < n / QK_K; i++) {
        const uint64_t sc64 = load_u64(x[i].scales);
        const uint16_t d16 = (uint16_t)(((sc64 >> 12) & 0x000f) | ((sc64 >> 24) & 0x00f0) | ((sc64 >> 36) & 0x0f00) |
                                        ((sc64 >> 48) & 0xf000));
        const float d = _cvtsh_ss(d16) * y[i].d;
        /* 16 3-bit scales (12 low bits of each word) -> int16 2s+1 */
        const uint64_t f = _pext_u64(sc64, 0x0fff0fff0fff0fffULL);
        const __m256i s16 = _mm256_cvtepu8_epi16(_mm_set_epi64x((long long)_pdep_u64(f >> 24, 0x0707070707070707ULL),
                                                                (long long)_pdep_u64(f, 0x0707070707070707ULL)));
        const __m256i ls = _mm256_add_epi16(_mm256_add_epi16(s16, s16), _mm256_set1_epi16(1));
        const __m256i corr = _mm256_madd_epi16(_mm256_loadu_si256((const __m256i *)y[i].bsums),
                                               _mm256_mullo_epi16(ls, _mm256_set1_epi16(9)));
        const __m512i sc = _mm512_zextsi256_si512(ls);
        const uint8_t *qs = x[i].qs;
        const int8_t *q8 = y[i].qs;
        __m512i acc = _mm512_sub_epi32(_mm512_setzero_si512(), _mm512_zextsi256_si512(corr));
#pragma GCC unroll 8
        for (int k = 0; k < 4; k++) {
            /* 8 nibbles, one per 8 weights: 3 high index bits | delta sign << 3 */
            const uint32_t h = load_u32(x[i].qh + 4 * k);
            const uint64_t hb = _pdep_u64(_pext_u32(h, 0x77777777u), 0x0707070707070707ULL);
            const __m512i g = _mm512_i64gather_epi64(idx_lo_hi(qs + 8 * k, hb), (const void *)iq1s_grid, 8);
            const __mmask64 dneg = _pdep_u64(_pext_u32(h, 0x88888888u), 0x0101010101010101ULL) * 0xff;
            const __m512i p = _mm512_maddubs_epi16(iq1_weights(g, dneg), _mm512_loadu_si512(q8 + 64 * k));
            acc = _mm512_dpwssd_epi32(acc, p, _mm512_permutexvar_epi16(pidx[k], sc));
        }
        accf = _mm512_fmadd_ps(_mm512_set1_ps(d), _mm512_cvtepi32_ps(acc), accf);
    }
    *s = 0.125f * _mm512_reduce_add_ps(accf);
}

/* Variants that load grid rows one by one instead of gathering them; NULL:
 * the format has only the gather kernel. quant_dot.c picks these on AMD. */
const qt_vec_dot_fn qt_dots_iq_avx512_loads[QT_COUNT] = {
    [QT_IQ2_XXS] = dot_iq2_xxs_loads,
};

const qt_vec_dot_fn qt_dots_iq_avx512[QT_COUNT] = {
    [QT_IQ2_XXS] = dot_iq2_xxs, [QT_IQ2_XS] = dot_iq2_xs, [QT_IQ2_S] = dot_iq2_s, [QT_IQ3_XXS] = dot_iq3_xxs,
    [QT_IQ3_S] = dot_iq3_s,     [QT_IQ1_S] = dot_iq1_s,   [QT_IQ1_M] = dot_iq1_m,
};
