/* The gemm kernels (quant_gemm.h), written once and compiled twice: by
 * quant_gemm_avx2.c (QG_VNNI 0: vpmaddubsw + vpmaddwd, 16 ymm registers) and
 * by quant_gemm_avx512.c (QG_VNNI 1: vpdpbusd / vpdpwssd on ymm, 32
 * registers). Each includer defines QG_VNNI, QG_R (rows per tile), QG_C
 * (tokens per tile, <= QT_GEMM_MAX_TOK) and QG_TABLE (its table's name).
 *
 * Every format is cut into 32-weight UNITS that match a 32-byte run of
 * activation quants: a legacy block, or a sub-block of a 256-weight
 * super-block. A GROUP is up to 8 units (one super-block, or 8 legacy blocks).
 * Per group:
 *   1. each of R weight rows is decoded once into 8 x 32 bytes (L1 buffer),
 *      a float scale per unit dw (d, or d * sub-block scale) and, for formats
 *      with a min, a float min coefficient per unit mw;
 *   2. each of C tokens gets its per-unit scale da, min partner sa (Q8_1's s,
 *      or dy * sub-block sum from Q8_K's bsums) and, for formats stored with
 *      an offset, Z = -offset * (sum of the unit's activation quants) as an
 *      int32 vector: the accumulator the unit's integer dot starts from;
 *   3. per (row, token) and unit: P = Z + dot(u, a) in int32 (exact), then
 *      acc += float(P) * (dw * da)[unit], with the 8 scale products of a
 *      group made by one vector multiply; the min term adds mw * sa once per
 *      group (8 units in one FMA).
 * Q6_K has 16-weight sub-blocks and int8 scales: it keeps the integer scale
 * (vpmaddubsw, then vpdpwssd / vpmaddwd with the scale pair vectors made at
 * decode) and applies d * dy once per super-block; its -32 offset is
 * -32 * sum_g sc_g * bsum_g, one vpmaddwd per (row, token).
 *
 * Weight bytes must make exact products with the integer core:
 *   VNNI: vpdpbusd takes unsigned 0..255 x signed: values are stored as
 *     unsigned with an offset (Q4_0 8, Q5_0 16, Q8_0/IQ4_NL/IQ4_XS 128).
 *   AVX2: vpmaddubsw sums pairs into int16 and saturates past 32767, so an
 *     unsigned byte may be at most 128 (2*128*127 fits): nibble formats are
 *     stored unsigned as above; Q8_0, IQ4_NL, IQ4_XS signed, and each pair
 *     uses the sign trick |w| x sign(a, w) (|w| <= 128 as unsigned).
 * Sub-block scale ranges: Q4_K/Q5_K 0..63, IQ4_XS -32..31; the float dw holds
 * d * that exactly up to f32 rounding of the product.
 */
#ifndef STRATA_QUANT_QUANT_GEMM_BODY_H
#define STRATA_QUANT_QUANT_GEMM_BODY_H

#include <immintrin.h>

#include "quant/quant_dot_common.h"
#include "quant/quant_gemm_impl.h"

#define QG_INLINE static inline __attribute__((always_inline))
#define QG_ALIGN __attribute__((aligned(32)))

enum { QG_Q4_0, QG_Q4_1, QG_Q5_0, QG_Q5_1, QG_Q8_0, QG_IQ4_NL, QG_Q4_K, QG_Q5_K, QG_IQ4_XS };

/* 256-weight super-blocks with Q8_K activations */
QG_INLINE int qg_super(int f) { return f == QG_Q4_K || f == QG_Q5_K || f == QG_IQ4_XS; }
QG_INLINE int qg_has_min(int f) { return f == QG_Q4_1 || f == QG_Q5_1 || f == QG_Q4_K || f == QG_Q5_K; }
/* full-range signed weights: sign trick on AVX2, +128 on VNNI */
QG_INLINE int qg_wide(int f) { return f == QG_Q8_0 || f == QG_IQ4_NL || f == QG_IQ4_XS; }
QG_INLINE int qg_signed(int f) { return !QG_VNNI && qg_wide(f); }
QG_INLINE int qg_offset(int f) {
    if (f == QG_Q4_0) return 8;
    if (f == QG_Q5_0) return 16;
    return QG_VNNI && qg_wide(f) ? 128 : 0;
}
/* bytes of one weight block (a unit for legacy, a super-block otherwise) */
QG_INLINE size_t qg_wblock(int f) {
    switch (f) {
    case QG_Q4_0: return sizeof(block_q4_0);
    case QG_Q4_1: return sizeof(block_q4_1);
    case QG_Q5_0: return sizeof(block_q5_0);
    case QG_Q5_1: return sizeof(block_q5_1);
    case QG_Q8_0: return sizeof(block_q8_0);
    case QG_IQ4_NL: return sizeof(block_iq4_nl);
    case QG_Q4_K: return sizeof(block_q4_K);
    case QG_Q5_K: return sizeof(block_q5_K);
    default: return sizeof(block_iq4_xs);
    }
}

QG_INLINE __m256i qg_load(const void *p) { return _mm256_loadu_si256((const __m256i *)p); }

/* 16 packed nibbles -> 32 bytes: low nibbles (weights 0..15), then high */
QG_INLINE __m256i qg_nibbles(const uint8_t *p) {
    __m256i v = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)p));
    v = _mm256_srlv_epi64(v, _mm256_set_epi64x(4, 4, 0, 0));
    return _mm256_and_si256(v, _mm256_set1_epi8(0x0f));
}

/* 32 bits -> 32 bytes, 0xff where bit i of p is set */
QG_INLINE __m256i qg_bits(const uint8_t *p) {
    uint32_t bits;
    memcpy(&bits, p, 4);
    __m256i v = _mm256_shuffle_epi8(_mm256_set1_epi32((int)bits),
                                    _mm256_set_epi64x(0x0303030303030303, 0x0202020202020202,
                                                      0x0101010101010101, 0x0000000000000000));
    const __m256i bit = _mm256_set1_epi64x((long long)0x8040201008040201ull);
    return _mm256_cmpeq_epi8(_mm256_and_si256(v, bit), bit);
}

/* IQ4 table lookup of 32 nibbles, plus 128 on VNNI (unsigned storage) */
QG_INLINE __m256i qg_iq4(__m256i nib) {
    const __m256i lut = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)kvalues_iq4nl));
    __m256i v = _mm256_shuffle_epi8(lut, nib);
    return QG_VNNI ? _mm256_xor_si256(v, _mm256_set1_epi8((char)0x80)) : v;
}

/* Decoded weights of one row's group. */
typedef struct {
    uint8_t q[8][32] QG_ALIGN; /* unit bytes: unsigned (offset) or signed (qg_signed) */
    uint8_t qa[8][32] QG_ALIGN; /* |q| for the sign trick (qg_signed only) */
    float dw[8] QG_ALIGN;      /* unit scale; 0 past the group's units */
    float mw[8] QG_ALIGN;      /* min coefficient (qg_has_min); 0 past the units */
} qg_wrow;

/* Decode g units starting at unit u0 of row w. */
QG_INLINE void qg_decode(const int f, const uint8_t *w, int u0, int g, qg_wrow *o) {
    if (g < 8) { /* tail of a legacy row: zero scales keep unused lanes out of the sums */
        for (int k = 0; k < 8; k++) o->dw[k] = o->mw[k] = 0.0f;
    }
    if (!qg_super(f)) {
        const uint8_t *b = w + (size_t)u0 * qg_wblock(f);
        for (int k = 0; k < g; k++, b += qg_wblock(f)) {
            __m256i v;
            uint16_t d, m = 0;
            memcpy(&d, b, 2);
            switch (f) {
            case QG_Q4_0: v = qg_nibbles(((const block_q4_0 *)b)->qs); break;
            case QG_Q4_1:
                v = qg_nibbles(((const block_q4_1 *)b)->qs);
                m = ((const block_q4_1 *)b)->m;
                break;
            case QG_Q5_0:
                v = _mm256_or_si256(qg_nibbles(((const block_q5_0 *)b)->qs),
                                    _mm256_and_si256(qg_bits(((const block_q5_0 *)b)->qh), _mm256_set1_epi8(0x10)));
                break;
            case QG_Q5_1:
                v = _mm256_or_si256(qg_nibbles(((const block_q5_1 *)b)->qs),
                                    _mm256_and_si256(qg_bits(((const block_q5_1 *)b)->qh), _mm256_set1_epi8(0x10)));
                m = ((const block_q5_1 *)b)->m;
                break;
            case QG_Q8_0:
                v = qg_load(((const block_q8_0 *)b)->qs);
                if (QG_VNNI) v = _mm256_xor_si256(v, _mm256_set1_epi8((char)0x80));
                break;
            default: v = qg_iq4(qg_nibbles(((const block_iq4_nl *)b)->qs)); break;
            }
            _mm256_store_si256((__m256i *)o->q[k], v);
            if (qg_signed(f)) _mm256_store_si256((__m256i *)o->qa[k], _mm256_abs_epi8(v));
            o->dw[k] = _cvtsh_ss(d);
            if (qg_has_min(f)) o->mw[k] = _cvtsh_ss(m);
        }
        return;
    }
    const int sb = u0 / 8;
    const __m256i m4 = _mm256_set1_epi8(0x0f);
    if (f == QG_Q4_K || f == QG_Q5_K) {
        /* Q4_K and Q5_K share d, dmin, scales and qs offsets up to qh */
        const block_q4_K *x4 = (const block_q4_K *)w + sb;
        const block_q5_K *x5 = (const block_q5_K *)w + sb;
        const uint8_t *qs = f == QG_Q4_K ? x4->qs : x5->qs;
        const uint8_t *scales = f == QG_Q4_K ? x4->scales : x5->scales;
        const float d = _cvtsh_ss(f == QG_Q4_K ? x4->d : x5->d);
        const float dmin = _cvtsh_ss(f == QG_Q4_K ? x4->dmin : x5->dmin);
        uint8_t sc[8], mn[8];
        qdot_k4_scales(scales, sc, mn);
        __m256 scf = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)sc)));
        __m256 mnf = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)mn)));
        _mm256_store_ps(o->dw, _mm256_mul_ps(scf, _mm256_set1_ps(d)));
        _mm256_store_ps(o->mw, _mm256_mul_ps(mnf, _mm256_set1_ps(-dmin)));
        /* chunk c of 32 bytes: low nibbles = unit 2c, high = unit 2c+1; Q5_K's
         * qh bit 2c / 2c+1 of byte l is the 5th bit of element l of those units */
        __m256i hb = f == QG_Q5_K ? qg_load(x5->qh) : _mm256_setzero_si256();
        for (int c = 0; c < 4; c++) {
            __m256i v = qg_load(qs + 32 * c);
            __m256i lo = _mm256_and_si256(v, m4), hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), m4);
            if (f == QG_Q5_K) {
                const __m256i b4 = _mm256_set1_epi8(0x10);
                lo = _mm256_or_si256(lo, _mm256_and_si256(_mm256_slli_epi16(hb, 4), b4));
                hi = _mm256_or_si256(hi, _mm256_and_si256(_mm256_slli_epi16(hb, 3), b4));
                hb = _mm256_srli_epi16(hb, 2);
            }
            _mm256_store_si256((__m256i *)o->q[2 * c], lo);
            _mm256_store_si256((__m256i *)o->q[2 * c + 1], hi);
        }
        return;
    }
    /* IQ4_XS: unit j = 16 bytes of qs (low nibbles elements 0..15, high 16..31),
     * signed 6-bit scale */
    const block_iq4_xs *x = (const block_iq4_xs *)w + sb;
    const float d = _cvtsh_ss(x->d);
    for (int j = 0; j < 8; j++) {
        __m256i v = qg_iq4(qg_nibbles(x->qs + 16 * j));
        _mm256_store_si256((__m256i *)o->q[j], v);
        if (qg_signed(f)) _mm256_store_si256((__m256i *)o->qa[j], _mm256_abs_epi8(v));
        o->dw[j] = d * (float)qdot_iq4xs_scale(x, j);
    }
}

/* Prepared activations of one token's group. */
typedef struct {
    int32_t z[8][8] QG_ALIGN; /* -offset * sum of the unit's quants, spread over 8 lanes */
    float da[8] QG_ALIGN;     /* unit scale; 0 past the group's units */
    float sa[8] QG_ALIGN;     /* min partner (qg_has_min); 0 past the units */
    const int8_t *a[8];       /* the unit's 32 quants */
} qg_arow;

/* int32 lanes whose sum is sum(a) * s for 32 int8 a, s an unsigned byte value (s * 2 * 127 < 2^15) */
QG_INLINE __m256i qg_sum_scaled(__m256i a, int s) {
    const __m256i sv = _mm256_set1_epi8((char)s);
#if QG_VNNI
    return _mm256_dpbusd_epi32(_mm256_setzero_si256(), sv, a);
#else
    return _mm256_madd_epi16(_mm256_maddubs_epi16(sv, a), _mm256_set1_epi16(1));
#endif
}

QG_INLINE void qg_prep(const int f, const uint8_t *act, int u0, int g, qg_arow *o) {
    const int off = qg_offset(f);
    if (g < 8) {
        for (int k = 0; k < 8; k++) o->da[k] = o->sa[k] = 0.0f;
    }
    if (!qg_super(f)) {
        if (qg_has_min(f)) { /* Q8_1 */
            const block_q8_1 *y = (const block_q8_1 *)act + u0;
            for (int k = 0; k < g; k++) {
                o->a[k] = y[k].qs;
                o->da[k] = _cvtsh_ss(y[k].d);
                o->sa[k] = _cvtsh_ss(y[k].s);
            }
        } else { /* Q8_0 */
            const block_q8_0 *y = (const block_q8_0 *)act + u0;
            for (int k = 0; k < g; k++) {
                o->a[k] = y[k].qs;
                o->da[k] = _cvtsh_ss(y[k].d);
            }
        }
    } else {
        const block_q8_K *y = (const block_q8_K *)act + u0 / 8;
        const float dy = y->d;
        _mm256_store_ps(o->da, _mm256_set1_ps(dy));
        for (int k = 0; k < 8; k++) o->a[k] = y->qs + 32 * k;
        if (qg_has_min(f)) {
            /* pair sums of the 16 bsums -> 8 sub-block sums, times dy */
            __m256i bs = qg_load(y->bsums);
            __m128i s16 = _mm_hadd_epi16(_mm256_castsi256_si128(bs), _mm256_extracti128_si256(bs, 1));
            __m256 s = _mm256_cvtepi32_ps(_mm256_cvtepi16_epi32(s16));
            _mm256_store_ps(o->sa, _mm256_mul_ps(s, _mm256_set1_ps(dy)));
        }
    }
    if (off)
        for (int k = 0; k < g; k++)
            _mm256_store_si256((__m256i *)o->z[k],
                               _mm256_sub_epi32(_mm256_setzero_si256(), qg_sum_scaled(qg_load(o->a[k]), off)));
}

/* int32 dot of unit k of a weight row with 32 activation quants, started at z */
QG_INLINE __m256i qg_udot(const int f, const qg_wrow *w, int k, __m256i q, const int8_t *a, __m256i z) {
    __m256i av = qg_load(a);
    if (qg_signed(f)) {
        __m256i p = _mm256_maddubs_epi16(_mm256_load_si256((const __m256i *)w->qa[k]), _mm256_sign_epi8(av, q));
        return _mm256_madd_epi16(p, _mm256_set1_epi16(1));
    }
#if QG_VNNI
    return _mm256_dpbusd_epi32(z, q, av);
#else
    return _mm256_add_epi32(z, _mm256_madd_epi16(_mm256_maddubs_epi16(q, av), _mm256_set1_epi16(1)));
#endif
}

QG_INLINE float qg_hsum(__m256 v) {
    __m128 t = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    t = _mm_add_ps(t, _mm_movehl_ps(t, t));
    t = _mm_add_ss(t, _mm_movehdup_ps(t));
    return _mm_cvtss_f32(t);
}

/* One tile: R rows x C tokens, all of the row's units. */
QG_INLINE void qg_tile(const int f, const int R, const int C, int n, const uint8_t *w, size_t ws,
                       const void *const *act, float *y, size_t ldy) {
    qg_wrow wr[QG_R];
    qg_arow ar[QG_C];
    float dd[QG_R][QG_C][8] QG_ALIGN;
    __m256 acc[QG_R][QG_C];
    for (int r = 0; r < R; r++)
        for (int c = 0; c < C; c++) acc[r][c] = _mm256_setzero_ps();
    const int n_units = n / 32;
    const int off = qg_offset(f);
    for (int u0 = 0; u0 < n_units; u0 += 8) {
        const int g = n_units - u0 < 8 ? n_units - u0 : 8;
        for (int r = 0; r < R; r++) qg_decode(f, w + (size_t)r * ws, u0, g, &wr[r]);
        for (int c = 0; c < C; c++) qg_prep(f, act[c], u0, g, &ar[c]);
        for (int r = 0; r < R; r++) {
            __m256 dw = _mm256_load_ps(wr[r].dw);
            for (int c = 0; c < C; c++) {
                _mm256_store_ps(dd[r][c], _mm256_mul_ps(dw, _mm256_load_ps(ar[c].da)));
                if (qg_has_min(f))
                    acc[r][c] = _mm256_fmadd_ps(_mm256_load_ps(wr[r].mw), _mm256_load_ps(ar[c].sa), acc[r][c]);
            }
        }
        for (int k = 0; k < g; k++) {
            for (int r = 0; r < R; r++) {
                __m256i q = _mm256_load_si256((const __m256i *)wr[r].q[k]);
                for (int c = 0; c < C; c++) {
                    __m256i z = off ? _mm256_load_si256((const __m256i *)ar[c].z[k]) : _mm256_setzero_si256();
                    __m256i p = qg_udot(f, &wr[r], k, q, ar[c].a[k], z);
                    acc[r][c] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p), _mm256_broadcast_ss(&dd[r][c][k]), acc[r][c]);
                }
            }
        }
    }
    for (int r = 0; r < R; r++)
        for (int c = 0; c < C; c++) y[(size_t)c * ldy + (size_t)r] = qg_hsum(acc[r][c]);
}

/* ---- Q6_K ---- */

typedef struct {
    uint8_t q[8][32] QG_ALIGN;  /* unit k = weights 32k..32k+31, values 0..63 */
    int16_t sc[8][16] QG_ALIGN; /* unit k's scales: 8 lanes sc[2k], 8 lanes sc[2k+1] */
    int16_t nb[16] QG_ALIGN;    /* -32 * sc[g]: the offset against the bsums */
    float d;
} qg_q6row;

QG_INLINE void qg_q6_decode(const block_q6_K *x, qg_q6row *o) {
    const __m256i m4 = _mm256_set1_epi8(0x0f), m2 = _mm256_set1_epi8(0x30);
    for (int h = 0; h < 2; h++) {
        /* 32-weight slice 4h+k: nibble k/2 of ql chunk k%2, qh bits 2k..2k+1 */
        __m256i l0 = qg_load(x->ql + 64 * h), l1 = qg_load(x->ql + 64 * h + 32), qh = qg_load(x->qh + 32 * h);
        __m256i q0 = _mm256_or_si256(_mm256_and_si256(l0, m4), _mm256_and_si256(_mm256_slli_epi16(qh, 4), m2));
        __m256i q1 = _mm256_or_si256(_mm256_and_si256(l1, m4), _mm256_and_si256(_mm256_slli_epi16(qh, 2), m2));
        __m256i q2 = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l0, 4), m4), _mm256_and_si256(qh, m2));
        __m256i q3 = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l1, 4), m4),
                                     _mm256_and_si256(_mm256_srli_epi16(qh, 2), m2));
        _mm256_store_si256((__m256i *)o->q[4 * h], q0);
        _mm256_store_si256((__m256i *)o->q[4 * h + 1], q1);
        _mm256_store_si256((__m256i *)o->q[4 * h + 2], q2);
        _mm256_store_si256((__m256i *)o->q[4 * h + 3], q3);
    }
    __m128i sc8 = _mm_loadu_si128((const __m128i *)x->scales);
    for (int k = 0; k < 8; k++) {
        __m128i idx = _mm_set_epi64x((long long)(0x0101010101010101ull * (uint64_t)(2 * k + 1)),
                                     (long long)(0x0101010101010101ull * (uint64_t)(2 * k)));
        _mm256_store_si256((__m256i *)o->sc[k], _mm256_cvtepi8_epi16(_mm_shuffle_epi8(sc8, idx)));
    }
    _mm256_store_si256((__m256i *)o->nb, _mm256_slli_epi16(_mm256_sub_epi16(_mm256_setzero_si256(),
                                                                             _mm256_cvtepi8_epi16(sc8)), 5));
    o->d = _cvtsh_ss(x->d);
}

QG_INLINE __m256i qg_dpwssd(__m256i acc, __m256i p, __m256i s) {
#if QG_VNNI
    return _mm256_dpwssd_epi32(acc, p, s);
#else
    return _mm256_add_epi32(acc, _mm256_madd_epi16(p, s));
#endif
}

QG_INLINE void qg_q6_tile(const int R, const int C, int n, const uint8_t *w, size_t ws, const void *const *act,
                          float *y, size_t ldy) {
    qg_q6row wr[QG_R];
    __m256 acc[QG_R][QG_C];
    for (int r = 0; r < R; r++)
        for (int c = 0; c < C; c++) acc[r][c] = _mm256_setzero_ps();
    for (int sb = 0; sb < n / QK_K; sb++) {
        for (int r = 0; r < R; r++) qg_q6_decode((const block_q6_K *)(w + (size_t)r * ws) + sb, &wr[r]);
        const block_q8_K *ya[QG_C];
        for (int c = 0; c < C; c++) ya[c] = (const block_q8_K *)act[c] + sb;
        for (int r = 0; r < R; r++) {
            __m256i isum[QG_C];
            __m256i nb = _mm256_load_si256((const __m256i *)wr[r].nb);
            for (int c = 0; c < C; c++) isum[c] = _mm256_madd_epi16(nb, qg_load(ya[c]->bsums));
            for (int k = 0; k < 8; k++) {
                __m256i q = _mm256_load_si256((const __m256i *)wr[r].q[k]);
                __m256i s = _mm256_load_si256((const __m256i *)wr[r].sc[k]);
                for (int c = 0; c < C; c++)
                    isum[c] = qg_dpwssd(isum[c], _mm256_maddubs_epi16(q, qg_load(ya[c]->qs + 32 * k)), s);
            }
            for (int c = 0; c < C; c++)
                acc[r][c] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum[c]), _mm256_set1_ps(wr[r].d * ya[c]->d), acc[r][c]);
        }
    }
    for (int r = 0; r < R; r++)
        for (int c = 0; c < C; c++) y[(size_t)c * ldy + (size_t)r] = qg_hsum(acc[r][c]);
}

/* ---- entry points: full tiles of QG_R rows, then single rows ---- */

#define QG_FMT_Q6K (-1)

QG_INLINE void qg_any_tile(const int f, const int R, const int C, int n, const uint8_t *w, size_t ws,
                           const void *const *act, float *y, size_t ldy) {
    if (f == QG_FMT_Q6K) qg_q6_tile(R, C, n, w, ws, act, y, ldy);
    else qg_tile(f, R, C, n, w, ws, act, y, ldy);
}

QG_INLINE void qg_run(const int f, int n, int nr, int nc, const void *wv, size_t ws, const void *const *act,
                      float *y, size_t ldy) {
    const uint8_t *w = wv;
    int r = 0;
    for (; r + QG_R <= nr; r += QG_R, w += (size_t)QG_R * ws, y += QG_R) {
        switch (nc) {
        case 1: qg_any_tile(f, QG_R, 1, n, w, ws, act, y, ldy); break;
        case 2: qg_any_tile(f, QG_R, 2, n, w, ws, act, y, ldy); break;
        case 3: qg_any_tile(f, QG_R, 3, n, w, ws, act, y, ldy); break;
        default: qg_any_tile(f, QG_R, 4, n, w, ws, act, y, ldy); break;
        }
    }
    /* leftover rows: one at a time, each token alone (rare: row counts are
     * multiples of 4 in the models we run) */
    for (; r < nr; r++, w += ws, y++)
        for (int c = 0; c < nc; c++) qg_any_tile(f, 1, 1, n, w, ws, act + c, y + (size_t)c * ldy, ldy);
}

#define QG_ENTRY(name, f)                                                                          \
    static void name(int n, int nr, int nc, const void *w, size_t ws, const void *const *act, float *y, \
                     size_t ldy) {                                                                 \
        qg_run(f, n, nr, nc, w, ws, act, y, ldy);                                                  \
    }

QG_ENTRY(gemm_q4_0, QG_Q4_0)
QG_ENTRY(gemm_q4_1, QG_Q4_1)
QG_ENTRY(gemm_q5_0, QG_Q5_0)
QG_ENTRY(gemm_q5_1, QG_Q5_1)
QG_ENTRY(gemm_q8_0, QG_Q8_0)
QG_ENTRY(gemm_iq4_nl, QG_IQ4_NL)
QG_ENTRY(gemm_q4_k, QG_Q4_K)
QG_ENTRY(gemm_q5_k, QG_Q5_K)
QG_ENTRY(gemm_iq4_xs, QG_IQ4_XS)
QG_ENTRY(gemm_q6_k, QG_FMT_Q6K)

const qt_gemm_fn QG_TABLE[QT_COUNT] = {
    [QT_Q4_0] = gemm_q4_0, [QT_Q4_1] = gemm_q4_1, [QT_Q5_0] = gemm_q5_0,     [QT_Q5_1] = gemm_q5_1,
    [QT_Q8_0] = gemm_q8_0, [QT_IQ4_NL] = gemm_iq4_nl, [QT_Q4_K] = gemm_q4_k, [QT_Q5_K] = gemm_q5_k,
    [QT_Q6_K] = gemm_q6_k, [QT_IQ4_XS] = gemm_iq4_xs,
};

#endif
