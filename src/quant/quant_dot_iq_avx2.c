/* Dot products of the i-quant weight formats (IQ2_XXS, IQ2_XS, IQ2_S,
 * IQ3_XXS, IQ3_S, IQ1_S, IQ1_M) with Q8_K activations: the AVX2 path.
 *
 * Same integer arithmetic as quant_dot_iq_scalar.c, 32 weights per step:
 *   - grid rows are looked up with plain loads and assembled with unpacks
 *     (rows4_u64/rows8_u32), except IQ3_S, whose 9-bit indices are built
 *     faster in a vector and fed to a dword gather (23 vs 37 ns per block on
 *     the dev Xeon; gathers are much slower on Skylake-derived cores with the
 *     GDS microcode, which is why the other formats avoid them here);
 *   - the sign bits of the 32 weights become a byte mask (shuffle, test bit;
 *     one broadcast of 64 bits serves two sub-blocks) and negate the
 *     activations, so that the grid stays unsigned for vpmaddubsw
 *     (|grid * q8| pairs fit int16: 2*62*127 < 32767);
 *   - vpmaddwd with the sub-block's odd scale 2s+1 sums to int32, and each
 *     super-block is converted to float once.
 * The 7-bit sign indices of IQ2_XXS/IQ2_XS/IQ3_XXS expand to 8 sign bits with
 * the parity rule of ksigns_iq2xs (bit 7 = parity of bits 0..6), done for
 * eight groups at once with pdep and a few shifts instead of table loads.
 * Activations must be Q8_K as qt_quantize_act makes them: |q| <= 127 (so
 * that negating never overflows) and bsums filled (IQ1).
 * IQ1_M uses the unsigned weight 8*(g+1) + (delta+1) in 0..18 and subtracts
 * 9*sum(q) per scale group from the Q8_K bsums (see the scalar file for why
 * 8*g +- 1); IQ1_S, whose delta is constant per 32 weights, uses g+1 and
 * takes the whole delta term from bsums.
 */
#include <immintrin.h>
#include <string.h>

#include "quant/dot_impl.h"
#include "quant/iq_tables.h"
#include "quant/quant_dot_iq_bits.h"

/* q8 of sub-block `half` (0/1) of a pair, with byte k negated where bit
 * 32*half + k of the 64 sign bits is set; sv holds those bits in every qword
 * (one broadcast serves both sub-blocks of the pair). */
static inline __m256i apply_signs(__m256i q, __m256i sv, int half) {
    const __m256i shuf = _mm256_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1, //
                                          2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3);
    const __m256i bits = _mm256_set1_epi64x((long long)0x8040201008040201ULL);
    __m256i v = _mm256_shuffle_epi8(sv, _mm256_add_epi8(shuf, _mm256_set1_epi8((char)(4 * half))));
    __m256i m = _mm256_cmpeq_epi8(_mm256_and_si256(v, bits), bits);
    return _mm256_sub_epi8(_mm256_xor_si256(q, m), m);
}

/* Eight 4-byte grid rows in one vector, with plain loads and unpacks: the
 * loads go to the load ports and the unpacks to two shuffle ports, which
 * beats vpinsrd chains and does not depend on gather speed (slow on many
 * AVX2-only CPUs). */
static inline __m256i rows8_u32(const uint32_t *grid, int i0, int i1, int i2, int i3, int i4, int i5, int i6, int i7) {
    const __m128i a = _mm_unpacklo_epi32(_mm_loadu_si32(grid + i0), _mm_loadu_si32(grid + i1));
    const __m128i b = _mm_unpacklo_epi32(_mm_loadu_si32(grid + i2), _mm_loadu_si32(grid + i3));
    const __m128i c = _mm_unpacklo_epi32(_mm_loadu_si32(grid + i4), _mm_loadu_si32(grid + i5));
    const __m128i d = _mm_unpacklo_epi32(_mm_loadu_si32(grid + i6), _mm_loadu_si32(grid + i7));
    return _mm256_set_m128i(_mm_unpacklo_epi64(c, d), _mm_unpacklo_epi64(a, b));
}

/* Four 8-byte grid rows in one vector, the same way. */
static inline __m256i rows4_u64(const uint64_t *grid, int i0, int i1, int i2, int i3) {
    const __m128i a = _mm_unpacklo_epi64(_mm_loadl_epi64((const __m128i *)(grid + i0)),
                                         _mm_loadl_epi64((const __m128i *)(grid + i1)));
    const __m128i b = _mm_unpacklo_epi64(_mm_loadl_epi64((const __m128i *)(grid + i2)),
                                         _mm_loadl_epi64((const __m128i *)(grid + i3)));
    return _mm256_set_m128i(b, a);
}

/* Four grid indices of up to 11 bits as 16-bit fields of a uint64_t: the low
 * bytes from four index bytes, the high bits already spread by the caller
 * (pdep) into bits 8.. of each field. Cheaper than per-index shifts/masks. */
static inline uint64_t idx4(const uint8_t *lo, uint64_t hi) {
    return _pdep_u64(load_u32(lo), 0x00ff00ff00ff00ffULL) | hi;
}

static inline __m256i rows4_idx(const uint64_t *grid, uint64_t v) {
    return rows4_u64(grid, (int)(v & 0xffff), (int)((v >> 16) & 0xffff), (int)((v >> 32) & 0xffff), (int)(v >> 48));
}

static inline float hsum_ps(__m256 v) {
    __m128 x = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    x = _mm_add_ps(x, _mm_movehl_ps(x, x));
    x = _mm_add_ss(x, _mm_movehdup_ps(x));
    return _mm_cvtss_f32(x);
}

/* 16 odd scales 2s+1 as bytes from 16 nibbles (low nibble first). */
static inline __m128i odd_scales_nib16(uint64_t nibbles) {
    const uint64_t lo = _pdep_u64(nibbles, 0x0f0f0f0f0f0f0f0fULL);
    const uint64_t hi = _pdep_u64(nibbles >> 32, 0x0f0f0f0f0f0f0f0fULL);
    __m128i s = _mm_set_epi64x((long long)hi, (long long)lo);
    return _mm_add_epi8(_mm_add_epi8(s, s), _mm_set1_epi8(1));
}

/* int16 scale vector for sub-block ib of 32 weights with one scale per 16:
 * lanes 0..7 = sc[2ib], lanes 8..15 = sc[2ib+1]. */
static inline __m256i scale_pair16(__m128i sc, int ib) {
    const __m128i base = _mm_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1);
    return _mm256_cvtepu8_epi16(_mm_shuffle_epi8(sc, _mm_add_epi8(base, _mm_set1_epi8((char)(2 * ib)))));
}

static void dot_iq2_xxs(int n, float *s, const void *w, const void *a) {
    const block_iq2_xxs *x = w;
    const block_q8_K *y = a;
    __m256 accf = _mm256_setzero_ps();
    for (int i = 0; i < n / QK_K; i++) {
        const float d = _cvtsh_ss(x[i].d) * y[i].d;
        const uint16_t *qs = x[i].qs;
        const int8_t *q8 = y[i].qs;
        __m256i acc = _mm256_setzero_si256();
        __m256i sv = _mm256_setzero_si256(); /* sign bits of the current pair of sub-blocks */
#pragma GCC unroll 8
        for (int ib = 0; ib < QK_K / 32; ib++) {
            const uint32_t aux0 = load_u32(qs + 4 * ib);
            const uint32_t aux1 = load_u32(qs + 4 * ib + 2);
            if (!(ib & 1)) {
                const uint64_t pk = (aux1 & 0x0fffffffu) | ((uint64_t)(load_u32(qs + 4 * ib + 6) & 0x0fffffffu) << 28);
                sv = _mm256_set1_epi64x((long long)ksigns8(pk));
            }
            const __m256i g = rows4_u64(iq2xxs_grid, aux0 & 255, (aux0 >> 8) & 255, (aux0 >> 16) & 255, aux0 >> 24);
            const __m256i q = apply_signs(_mm256_loadu_si256((const __m256i *)(q8 + 32 * ib)), sv, ib & 1);
            const __m256i p = _mm256_maddubs_epi16(g, q);
            acc = _mm256_add_epi32(acc, _mm256_madd_epi16(p, _mm256_set1_epi16((short)(2 * (aux1 >> 28) + 1))));
        }
        accf = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(acc), accf);
    }
    *s = 0.125f * hsum_ps(accf);
}

static void dot_iq2_xs(int n, float *s, const void *w, const void *a) {
    const block_iq2_xs *x = w;
    const block_q8_K *y = a;
    __m256 accf = _mm256_setzero_ps();
    for (int i = 0; i < n / QK_K; i++) {
        const float d = _cvtsh_ss(x[i].d) * y[i].d;
        const __m128i sc = odd_scales_nib16(load_u64(x[i].scales));
        const int8_t *q8 = y[i].qs;
        __m256i acc = _mm256_setzero_si256();
        __m256i sv = _mm256_setzero_si256(); /* sign bits of the current pair of sub-blocks */
#pragma GCC unroll 8
        for (int ib = 0; ib < QK_K / 32; ib++) {
            /* four uint16: 9-bit grid index | 7-bit sign index << 9 */
            const uint64_t v = load_u64(x[i].qs + 4 * ib);
            const __m256i g = rows4_u64(iq2xs_grid, v & 511, (v >> 16) & 511, (v >> 32) & 511, (v >> 48) & 511);
            if (!(ib & 1)) {
                const uint64_t pk = _pext_u64(v, 0xfe00fe00fe00fe00ULL) |
                                    (_pext_u64(load_u64(x[i].qs + 4 * ib + 4), 0xfe00fe00fe00fe00ULL) << 28);
                sv = _mm256_set1_epi64x((long long)ksigns8(pk));
            }
            const __m256i q = apply_signs(_mm256_loadu_si256((const __m256i *)(q8 + 32 * ib)), sv, ib & 1);
            const __m256i p = _mm256_maddubs_epi16(g, q);
            acc = _mm256_add_epi32(acc, _mm256_madd_epi16(p, scale_pair16(sc, ib)));
        }
        accf = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(acc), accf);
    }
    *s = 0.125f * hsum_ps(accf);
}

static void dot_iq2_s(int n, float *s, const void *w, const void *a) {
    const block_iq2_s *x = w;
    const block_q8_K *y = a;
    __m256 accf = _mm256_setzero_ps();
    for (int i = 0; i < n / QK_K; i++) {
        const float d = _cvtsh_ss(x[i].d) * y[i].d;
        const __m128i sc = odd_scales_nib16(load_u64(x[i].scales));
        const uint8_t *qs = x[i].qs;
        const uint8_t *signs = x[i].qs + QK_K / 8;
        const int8_t *q8 = y[i].qs;
        __m256i acc = _mm256_setzero_si256();
        __m256i sv = _mm256_setzero_si256(); /* sign bits of the current pair of sub-blocks */
#pragma GCC unroll 8
        for (int ib = 0; ib < QK_K / 32; ib++) {
            const uint32_t qh = x[i].qh[ib];
            const __m256i g = rows4_idx(iq2s_grid, idx4(qs + 4 * ib, _pdep_u64(qh, 0x0300030003000300ULL)));
            if (!(ib & 1)) sv = _mm256_set1_epi64x((long long)load_u64(signs + 4 * ib));
            const __m256i q = apply_signs(_mm256_loadu_si256((const __m256i *)(q8 + 32 * ib)), sv, ib & 1);
            const __m256i p = _mm256_maddubs_epi16(g, q);
            acc = _mm256_add_epi32(acc, _mm256_madd_epi16(p, scale_pair16(sc, ib)));
        }
        accf = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(acc), accf);
    }
    *s = 0.125f * hsum_ps(accf);
}

static void dot_iq3_xxs(int n, float *s, const void *w, const void *a) {
    const block_iq3_xxs *x = w;
    const block_q8_K *y = a;
    __m256 accf = _mm256_setzero_ps();
    for (int i = 0; i < n / QK_K; i++) {
        const float d = _cvtsh_ss(x[i].d) * y[i].d;
        const uint8_t *qs = x[i].qs;
        const uint8_t *gas = x[i].qs + QK_K / 4;
        const int8_t *q8 = y[i].qs;
        __m256i acc = _mm256_setzero_si256();
        __m256i sv = _mm256_setzero_si256(); /* sign bits of the current pair of sub-blocks */
#pragma GCC unroll 8
        for (int ib = 0; ib < QK_K / 32; ib++) {
            const uint32_t aux = load_u32(gas + 4 * ib);
            const uint8_t *ix = qs + 8 * ib;
            const __m256i g = rows8_u32(iq3xxs_grid, ix[0], ix[1], ix[2], ix[3], ix[4], ix[5], ix[6], ix[7]);
            if (!(ib & 1)) {
                const uint64_t pk = (aux & 0x0fffffffu) | ((uint64_t)(load_u32(gas + 4 * ib + 4) & 0x0fffffffu) << 28);
                sv = _mm256_set1_epi64x((long long)ksigns8(pk));
            }
            const __m256i q = apply_signs(_mm256_loadu_si256((const __m256i *)(q8 + 32 * ib)), sv, ib & 1);
            const __m256i p = _mm256_maddubs_epi16(g, q);
            acc = _mm256_add_epi32(acc, _mm256_madd_epi16(p, _mm256_set1_epi16((short)(2 * (aux >> 28) + 1))));
        }
        accf = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(acc), accf);
    }
    *s = 0.25f * hsum_ps(accf);
}

static void dot_iq3_s(int n, float *s, const void *w, const void *a) {
    const block_iq3_s *x = w;
    const block_q8_K *y = a;
    const __m256i hshift = _mm256_setr_epi32(8, 7, 6, 5, 4, 3, 2, 1);
    const __m256i bit8 = _mm256_set1_epi32(256);
    __m256 accf = _mm256_setzero_ps();
    for (int i = 0; i < n / QK_K; i++) {
        const float d = _cvtsh_ss(x[i].d) * y[i].d;
        const int8_t *q8 = y[i].qs;
        __m256i acc = _mm256_setzero_si256();
        __m256i sv = _mm256_setzero_si256(); /* sign bits of the current pair of sub-blocks */
#pragma GCC unroll 8
        for (int ib = 0; ib < QK_K / 32; ib++) {
            /* 9-bit indices: 8 low bits in qs, bit k of qh[ib] is index k's 9th */
            const __m256i lo = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(x[i].qs + 8 * ib)));
            const __m256i hi = _mm256_and_si256(_mm256_sllv_epi32(_mm256_set1_epi32(x[i].qh[ib]), hshift), bit8);
            const __m256i g = _mm256_i32gather_epi32((const int *)iq3s_grid, _mm256_or_si256(lo, hi), 4);
            if (!(ib & 1)) sv = _mm256_set1_epi64x((long long)load_u64(x[i].signs + 4 * ib));
            const __m256i q = apply_signs(_mm256_loadu_si256((const __m256i *)(q8 + 32 * ib)), sv, ib & 1);
            const __m256i p = _mm256_maddubs_epi16(g, q);
            const int sc = (x[i].scales[ib >> 1] >> (4 * (ib & 1))) & 15;
            acc = _mm256_add_epi32(acc, _mm256_madd_epi16(p, _mm256_set1_epi16((short)(2 * sc + 1))));
        }
        accf = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(acc), accf);
    }
    *s = hsum_ps(accf);
}

/* The unsigned IQ1 weight 8*(g+1) + dp, dp = delta+1 in {0,2} per byte:
 * g+1 <= 2 so a 16-bit shift by 3 cannot carry into the next byte. */
static inline __m256i iq1_weights(__m256i g, __m256i dp) {
    const __m256i g1 = _mm256_add_epi8(g, _mm256_set1_epi8(1));
    return _mm256_add_epi8(_mm256_slli_epi16(g1, 3), dp);
}

static void dot_iq1_s(int n, float *s, const void *w, const void *a) {
    const block_iq1_s *x = w;
    const block_q8_K *y = a;
    const __m256i one = _mm256_set1_epi8(1);
    __m256 accf = _mm256_setzero_ps();
    for (int i = 0; i < n / QK_K; i++) {
        const float d = _cvtsh_ss(x[i].d) * y[i].d;
        const uint8_t *qs = x[i].qs;
        const int8_t *q8 = y[i].qs;
        __m256i acc = _mm256_setzero_si256();
        /* The delta is constant over 32 weights, so with the unsigned weight
         * g+1: sum (8g + delta) q = 8 sum (g+1) q + (delta - 8) sum q, the last
         * sum from bsums; corr collects ls * (delta - 8) * sum q. */
        int32_t corr = 0;
#pragma GCC unroll 8
        for (int ib = 0; ib < QK_K / 32; ib++) {
            const uint32_t qh = x[i].qh[ib];
            const __m256i g = rows4_idx(iq1s_grid, idx4(qs + 4 * ib, _pdep_u64(qh & 0xfff, 0x0700070007000700ULL)));
            const __m256i p =
                _mm256_maddubs_epi16(_mm256_add_epi8(g, one), _mm256_loadu_si256((const __m256i *)(q8 + 32 * ib)));
            const int ls = 2 * ((qh >> 12) & 7) + 1;
            acc = _mm256_add_epi32(acc, _mm256_madd_epi16(p, _mm256_set1_epi16((short)(8 * ls))));
            corr += ls * (qh & 0x8000 ? -9 : -7) * (y[i].bsums[2 * ib] + y[i].bsums[2 * ib + 1]);
        }
        const __m256i sumi = _mm256_add_epi32(acc, _mm256_setr_epi32(corr, 0, 0, 0, 0, 0, 0, 0));
        accf = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(sumi), accf);
    }
    *s = 0.125f * hsum_ps(accf);
}

static void dot_iq1_m(int n, float *s, const void *w, const void *a) {
    const block_iq1_m *x = w;
    const block_q8_K *y = a;
    /* byte k of a 32-weight step reads qh byte k/16, bit 3 (k%16 < 8) or 7 */
    const __m256i dshuf = _mm256_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, //
                                           1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1);
    const __m256i dbit = _mm256_setr_epi8(8, 8, 8, 8, 8, 8, 8, 8, (char)0x80, (char)0x80, (char)0x80, (char)0x80,
                                          (char)0x80, (char)0x80, (char)0x80, (char)0x80, //
                                          8, 8, 8, 8, 8, 8, 8, 8, (char)0x80, (char)0x80, (char)0x80, (char)0x80,
                                          (char)0x80, (char)0x80, (char)0x80, (char)0x80);
    const __m256i two = _mm256_set1_epi8(2);
    __m256 accf = _mm256_setzero_ps();
    for (int i = 0; i < n / QK_K; i++) {
        const uint64_t sc64 = load_u64(x[i].scales);
        const uint16_t d16 = (uint16_t)(((sc64 >> 12) & 0x000f) | ((sc64 >> 24) & 0x00f0) | ((sc64 >> 36) & 0x0f00) |
                                        ((sc64 >> 48) & 0xf000));
        const float d = _cvtsh_ss(d16) * y[i].d;
        /* 16 3-bit scales (12 low bits of each word) -> bytes 2s+1 */
        const uint64_t f = _pext_u64(sc64, 0x0fff0fff0fff0fffULL);
        __m128i sc = _mm_set_epi64x((long long)_pdep_u64(f >> 24, 0x0707070707070707ULL),
                                    (long long)_pdep_u64(f, 0x0707070707070707ULL));
        sc = _mm_add_epi8(_mm_add_epi8(sc, sc), _mm_set1_epi8(1));
        /* the 9*sum(q) correction of every 16 weights, weighted by its scale */
        const __m256i corr = _mm256_madd_epi16(_mm256_loadu_si256((const __m256i *)y[i].bsums),
                                               _mm256_mullo_epi16(_mm256_cvtepu8_epi16(sc), _mm256_set1_epi16(9)));
        const uint8_t *qs = x[i].qs;
        const int8_t *q8 = y[i].qs;
        __m256i acc = _mm256_setzero_si256();
#pragma GCC unroll 8
        for (int ib = 0; ib < QK_K / 32; ib++) {
            const uint32_t qh = load_u32(x[i].qh + 2 * ib) & 0xffff; /* 4 nibbles: 3 index bits + delta sign */
            const __m256i g =
                rows4_idx(iq1s_grid, idx4(qs + 4 * ib, _pdep_u64(_pext_u32(qh, 0x7777u), 0x0700070007000700ULL)));
            const __m256i hb = _mm256_shuffle_epi8(_mm256_set1_epi16((short)qh), dshuf);
            const __m256i dp = _mm256_andnot_si256(_mm256_cmpeq_epi8(_mm256_and_si256(hb, dbit), dbit), two);
            const __m256i wq = iq1_weights(g, dp);
            const __m256i p = _mm256_maddubs_epi16(wq, _mm256_loadu_si256((const __m256i *)(q8 + 32 * ib)));
            acc = _mm256_add_epi32(acc, _mm256_madd_epi16(p, scale_pair16(sc, ib)));
        }
        accf = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(_mm256_sub_epi32(acc, corr)), accf);
    }
    *s = 0.125f * hsum_ps(accf);
}

const qt_vec_dot_fn qt_dots_iq_avx2[QT_COUNT] = {
    [QT_IQ2_XXS] = dot_iq2_xxs, [QT_IQ2_XS] = dot_iq2_xs, [QT_IQ2_S] = dot_iq2_s, [QT_IQ3_XXS] = dot_iq3_xxs,
    [QT_IQ3_S] = dot_iq3_s,     [QT_IQ1_S] = dot_iq1_s,   [QT_IQ1_M] = dot_iq1_m,
};
