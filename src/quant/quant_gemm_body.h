/* The gemm kernels (quant_gemm.h), written once and compiled twice: by
 * quant_gemm_avx2.c (QG_VNNI 0: vpmaddubsw + vpmaddwd, 16 ymm registers) and
 * by quant_gemm_avx512.c (QG_VNNI 1: vpdpbusd, zmm tiles). Each includer
 * defines QG_VNNI, QG_R (rows per tile), QG_C (tokens per ymm tile) and
 * QG_TABLE (its table's name).
 *
 * Every format is cut into 32-weight UNITS that match a 32-byte run of
 * activation quants: a legacy block, or a sub-block of a 256-weight
 * super-block. A GROUP is up to 8 units; a CHUNK 32 units (1024 weights).
 * One call (nr rows x nc <= QT_GEMM_MAX_TOK tokens) goes chunk by chunk:
 *   1. each token's units are PREPARED once: float unit scale da, min
 *      partner sa (Q8_1's s, or dy * unit sum from Q8_K's bsums), and the
 *      quants stored unsigned as a+128 (a xor 0x80);
 *   2. each row tile of R rows is DECODED once: signed int8 weights per unit,
 *      z = -128 * sum(w) as int32 lanes, float unit scale dw (d, or d times
 *      the sub-block scale) and min coefficient mw;
 *   3. per (row, token, unit): P = z + dot(a+128, w) = dot(a, w) EXACTLY in
 *      int32 (vpdpbusd takes the unsigned a+128 against signed w and starts
 *      from z), then acc += float(P) * dw*da; formats with a min add mw * sa
 *      once per group (8 units in one FMA).
 * Offsets are exact on purpose: a float correction (-128 * sum(a) * da * dw)
 * cancels badly on activations with a large mean, and the next layer's
 * activation quantization amplifies it (seen in tests/ref, qwen3 q8_0).
 * Decode work is paid once per chunk per row for all nc tokens; activation
 * preparation once per chunk per token for all nr rows.
 *
 * Byte ranges for the integer core:
 *   VNNI: vpdpbusd(u8 a+128 in 1..255, s8 w) sums 4 products in int32: exact.
 *   AVX2: vpmaddubsw sums pairs into int16 and saturates past 32767:
 *     2 * 255 * |w| must stay below 2^15, true for |w| <= 31 (Q4_0 -8..7,
 *     Q5_0 -16..15, Q4_1/Q4_K 0..15, Q5_1/Q5_K 0..31). Q8_0, IQ4_NL and
 *     IQ4_XS (|w| up to 128) use the sign trick instead: |w| x sign(a, w) on
 *     the original activations (|w| <= 128 as unsigned, 2*128*127 fits).
 * AVX-512 adds two paths: blocks of 16 rows with the rows interleaved (lane =
 * row, qg_run16: the fastest, for every format but Q4_K/Q5_K/Q6_K) and, for
 * Q4_K/Q5_K, integer sub-block scales in the zmm tile (qg_kint). With AMX,
 * tiles (quant_gemm_amx.h) for every format here, Q6_K by half units.
 * Q6_K has 16-weight sub-blocks and int8 scales: it keeps the integer scale
 * (vpmaddubsw, then vpdpwssd / vpmaddwd with the scale pair vectors made at
 * decode) and applies d * dy once per super-block; its -32 offset is
 * -32 * sum_g sc_g * bsum_g, one vpmaddwd per (row, token).
 */
#ifndef STRATA_QUANT_QUANT_GEMM_BODY_H
#define STRATA_QUANT_QUANT_GEMM_BODY_H

#include <immintrin.h>

#include "quant/quant_dot_common.h"
#include "quant/quant_gemm_impl.h"
#include "quant/quant_simd_bits.h"

#define QG_INLINE static inline __attribute__((always_inline))
#define QG_ALIGN  __attribute__((aligned(32)))

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

/* 32 bits -> 32 bytes, 0xff where bit i of p is set */
QG_INLINE __m256i qg_bits(const uint8_t *p) {
    uint32_t bits;
    memcpy(&bits, p, 4);
    __m256i v =
        _mm256_shuffle_epi8(_mm256_set1_epi32((int)bits), _mm256_set_epi64x(0x0303030303030303, 0x0202020202020202,
                                                                            0x0101010101010101, 0x0000000000000000));
    const __m256i bit = _mm256_set1_epi64x((long long)0x8040201008040201ull);
    return _mm256_cmpeq_epi8(_mm256_and_si256(v, bit), bit);
}

/* IQ4 table lookup of 32 nibbles (signed values) */
QG_INLINE __m256i qg_iq4(__m256i nib) {
    const __m256i lut = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)kvalues_iq4nl));
    return _mm256_shuffle_epi8(lut, nib);
}

/* Units per chunk: the row length is cut into chunks of 1024 weights so
 * that the decoded rows and the prepared tokens of one chunk live on the
 * stack and in L1/L2; partial sums are added into y between chunks. */
#define QG_CHUNK  32
#define QG_GROUPS (QG_CHUNK / 8)

/* Prepared activations, tokens per 32-byte slot group: on VNNI two tokens'
 * units sit side by side (64 bytes: one zmm holds unit k of tokens 2p and
 * 2p+1, see qg_micro512); on AVX2 one. */
#if QG_VNNI
#define QG_TP 2
#else
#define QG_TP 1
#endif
#define QG_AP_BYTES ((size_t)QT_GEMM_MAX_TOK * QG_CHUNK * 32)

/* unit k of token c in the prepared-activation buffer */
QG_INLINE uint8_t *qg_ap(uint8_t *apb, int c, int k) {
    return apb + ((size_t)((c / QG_TP) * QG_CHUNK + k) * QG_TP + (size_t)(c % QG_TP)) * 32;
}

/* AVX2 and a full-range format: the sign trick on the original activations.
 * Every other case: unsigned activations a+128 x signed weights, with the
 * exact correction -128 * sum(w) per unit as the integer accumulator's start. */
QG_INLINE int qg_sign_path(int f) { return !QG_VNNI && qg_wide(f); }

/* One weight row's decoded chunk. */
typedef struct {
    int8_t q[QG_CHUNK][32] QG_ALIGN; /* signed weights of each unit */
    int32_t z[QG_CHUNK][8] QG_ALIGN; /* -128 * sum of the unit's weights, spread over 8 lanes */
#if !QG_VNNI
    uint8_t qa[QG_CHUNK][32] QG_ALIGN; /* |q| (sign path only) */
#endif
    float dw[QG_GROUPS][8] QG_ALIGN; /* unit scale; 0 past the row's units */
    float mw[QG_GROUPS][8] QG_ALIGN; /* min coefficient (qg_has_min); 0 past the units */
#if QG_VNNI
    /* Q4_K/Q5_K integer scales (qg_kint): */
    int32_t zs[QG_GROUPS][8] QG_ALIGN; /* sum_j sc_j * z_j: the super-block's offset, scaled */
    uint32_t sc2[QG_CHUNK];            /* unit j's 6-bit scale in both int16 halves */
    float dk[QG_GROUPS];               /* the super-block's d */
#endif
} qg_wrow;

/* Q4_K/Q5_K on VNNI: integer sub-block scales (vpmaddubsw + vpdpwssd), d * dy
 * once per super-block, instead of a float scale per unit */
QG_INLINE int qg_kint(int f) { return QG_VNNI && (f == QG_Q4_K || f == QG_Q5_K); }

/* One token's prepared group. */
typedef struct {
    float da[8] QG_ALIGN; /* unit scale; 0 past the row's units */
    float sa[8] QG_ALIGN; /* min partner (qg_has_min): Q8_1's s, or dy * unit sum */
} qg_tgrp;

/* int32 lanes whose sum is 128 * the sum of 32 signed bytes w (|2*128*w| fits int16 for AVX2) */
QG_INLINE __m256i qg_sum128(__m256i w) {
    const __m256i k = _mm256_set1_epi8((char)0x80);
#if QG_VNNI
    return _mm256_dpbusd_epi32(_mm256_setzero_si256(), k, w);
#else
    return _mm256_madd_epi16(_mm256_maddubs_epi16(k, w), _mm256_set1_epi16(1));
#endif
}

/* wz: also the offset z (and Q4_K/Q5_K's integer-scale fields), which only
 * qg_run's kernels read; qg_run16 and the tile path start from the tokens' side */
QG_INLINE void qg_put_unit(const int f, const int wz, qg_wrow *o, int k, __m256i v) {
    _mm256_store_si256((__m256i *)o->q[k], v);
    if (qg_sign_path(f)) {
#if !QG_VNNI
        _mm256_store_si256((__m256i *)o->qa[k], _mm256_abs_epi8(v));
#endif
    } else if (wz) {
        _mm256_store_si256((__m256i *)o->z[k], _mm256_sub_epi32(_mm256_setzero_si256(), qg_sum128(v)));
    }
}

/* g (<= 8) f16 values, p + k*stride for k < g, as 8 floats (0 past g). Packed
 * in general registers: 8 narrow stores read back by one 16-byte load would
 * miss store forwarding (~15% of the Q4_1 kernel's time when measured). */
QG_INLINE __m256 qg_f16x8(const uint8_t *p, size_t stride, int g) {
    uint64_t lo = 0, hi = 0;
    for (int k = 0; k < g; k++) {
        uint16_t h;
        memcpy(&h, p + (size_t)k * stride, 2);
        if (k < 4) lo |= (uint64_t)h << (16 * k);
        else hi |= (uint64_t)h << (16 * (k - 4));
    }
    return _mm256_cvtph_ps(_mm_set_epi64x((long long)hi, (long long)lo));
}

/* Decode units u0..u0+g-1 (group gi of the chunk) of row w. */
QG_INLINE void qg_decode(const int f, const int wz, const uint8_t *w, int u0, int g, qg_wrow *o, int gi) {
    const int k0 = 8 * gi;
    float *dw = o->dw[gi], *mw = o->mw[gi];
    if (!qg_super(f)) {
        const uint8_t *b0 = w + (size_t)u0 * qg_wblock(f), *b = b0;
        for (int k = 0; k < g; k++, b += qg_wblock(f)) {
            __m256i v;
            switch (f) {
            case QG_Q4_0: v = _mm256_sub_epi8(qt_nibbles32(((const block_q4_0 *)b)->qs), _mm256_set1_epi8(8)); break;
            case QG_Q4_1: v = qt_nibbles32(((const block_q4_1 *)b)->qs); break;
            case QG_Q5_0: /* q - 16 in one step: a clear 5th bit makes the byte nibble | 0xf0 */
                v = _mm256_or_si256(
                    qt_nibbles32(((const block_q5_0 *)b)->qs),
                    _mm256_andnot_si256(qg_bits(((const block_q5_0 *)b)->qh), _mm256_set1_epi8((char)0xf0)));
                break;
            case QG_Q5_1:
                v = _mm256_or_si256(qt_nibbles32(((const block_q5_1 *)b)->qs),
                                    _mm256_and_si256(qg_bits(((const block_q5_1 *)b)->qh), _mm256_set1_epi8(0x10)));
                break;
            case QG_Q8_0: v = qg_load(((const block_q8_0 *)b)->qs); break;
            default: v = qg_iq4(qt_nibbles32(((const block_iq4_nl *)b)->qs)); break;
            }
            qg_put_unit(f, wz, o, k0 + k, v);
        }
        /* every legacy block starts with its f16 d; Q4_1/Q5_1 follow it with m */
        _mm256_store_ps(dw, qg_f16x8(b0, qg_wblock(f), g));
        if (qg_has_min(f)) _mm256_store_ps(mw, qg_f16x8(b0 + 2, qg_wblock(f), g));
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
        _mm256_store_ps(dw, _mm256_mul_ps(scf, _mm256_set1_ps(d)));
        _mm256_store_ps(mw, _mm256_mul_ps(mnf, _mm256_set1_ps(-dmin)));
        /* chunk c of 32 bytes: low nibbles = unit 2c, high = unit 2c+1; Q5_K's
         * qh bit 2c / 2c+1 of byte l is the 5th bit of element l of those units
         * (16-bit shifts pull bits across bytes; only bits 0..1 are read) */
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
            qg_put_unit(f, wz, o, k0 + 2 * c, lo);
            qg_put_unit(f, wz, o, k0 + 2 * c + 1, hi);
        }
#if QG_VNNI
        if (!wz) return;
        __m256i zs = _mm256_setzero_si256();
        for (int j = 0; j < 8; j++) {
            o->sc2[k0 + j] = (uint32_t)sc[j] * 0x10001u;
            zs = _mm256_add_epi32(
                zs, _mm256_mullo_epi32(_mm256_load_si256((const __m256i *)o->z[k0 + j]), _mm256_set1_epi32(sc[j])));
        }
        _mm256_store_si256((__m256i *)o->zs[gi], zs);
        o->dk[gi] = d;
#endif
        return;
    }
    /* IQ4_XS: unit j = 16 bytes of qs (low nibbles elements 0..15, high 16..31),
     * signed 6-bit scale */
    const block_iq4_xs *x = (const block_iq4_xs *)w + sb;
    const float d = _cvtsh_ss(x->d);
    for (int j = 0; j < 8; j++) {
        qg_put_unit(f, wz, o, k0 + j, qg_iq4(qt_nibbles32(x->qs + 16 * j)));
        dw[j] = d * (float)qdot_iq4xs_scale(x, j);
    }
}

/* quants of unit u of an activation row */
QG_INLINE const int8_t *qg_act(const int f, const uint8_t *act, int u) {
    if (qg_super(f)) return ((const block_q8_K *)act)[u / 8].qs + 32 * (u % 8);
    if (qg_has_min(f)) return ((const block_q8_1 *)act)[u].qs;
    return ((const block_q8_0 *)act)[u].qs;
}

/* Prepare units u0..u0+g-1 (group gi) of a token: scales, and on the
 * offset path the unsigned quants a+128 into its slots of the buffer apb. */
QG_INLINE void qg_prep(const int f, const uint8_t *act, int u0, int g, qg_tgrp *o, uint8_t *apb, int c, int gi) {
    if (!qg_sign_path(f) && apb) /* qg_run16 reads the activations in place: no copy */
        for (int k = 0; k < g; k++)
            _mm256_store_si256((__m256i *)qg_ap(apb, c, 8 * gi + k),
                               _mm256_xor_si256(qg_load(qg_act(f, act, u0 + k)), _mm256_set1_epi8((char)0x80)));
    if (!qg_super(f)) {
        if (qg_has_min(f)) { /* Q8_1: d, then s */
            const uint8_t *y = (const uint8_t *)((const block_q8_1 *)act + u0);
            _mm256_store_ps(o->da, qg_f16x8(y, sizeof(block_q8_1), g));
            _mm256_store_ps(o->sa, qg_f16x8(y + 2, sizeof(block_q8_1), g));
        } else {
            _mm256_store_ps(o->da, qg_f16x8((const uint8_t *)((const block_q8_0 *)act + u0), sizeof(block_q8_0), g));
        }
        return;
    }
    const block_q8_K *y = (const block_q8_K *)act + u0 / 8;
    const __m256 dy = _mm256_set1_ps(y->d);
    _mm256_store_ps(o->da, dy);
    if (qg_has_min(f)) {
        /* pair sums of the 16 bsums = the 8 unit sums */
        __m256i bs = qg_load(y->bsums);
        __m128i s16 = _mm_hadd_epi16(_mm256_castsi256_si128(bs), _mm256_extracti128_si256(bs, 1));
        _mm256_store_ps(o->sa, _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi16_epi32(s16)), dy));
    }
}

QG_INLINE float qg_hsum(__m256 v) {
    __m128 t = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    t = _mm_add_ps(t, _mm_movehl_ps(t, t));
    t = _mm_add_ss(t, _mm_movehdup_ps(t));
    return _mm_cvtss_f32(t);
}

/* One tile over one chunk: R decoded rows x C prepared tokens; y = (first) or += the sums. */
QG_INLINE void qg_micro(const int f, const int R, const int C, int u0, int cu, const qg_wrow *wr,
                        qg_tgrp (*tp)[QG_GROUPS], uint8_t *apb, int c0, const uint8_t *const *act, float *y, size_t ldy,
                        int first) {
    float dd[QG_R][QG_C][8] QG_ALIGN;
    __m256 acc[QG_R][QG_C];
    (void)u0; /* u0 and act: read by the sign path only; apb and c0 by the others */
    (void)act;
    (void)apb;
    (void)c0;
    _Pragma("GCC unroll 8") for (int r = 0; r < R; r++) _Pragma("GCC unroll 8") for (int c = 0; c < C; c++) acc[r][c] =
        _mm256_setzero_ps();
    for (int gi = 0; gi * 8 < cu; gi++) {
        const int g = cu - 8 * gi < 8 ? cu - 8 * gi : 8;
        _Pragma("GCC unroll 8") for (int r = 0; r < R; r++) {
            __m256 dw = _mm256_load_ps(wr[r].dw[gi]);
            _Pragma("GCC unroll 8") for (int c = 0; c < C; c++) {
                _mm256_store_ps(dd[r][c], _mm256_mul_ps(dw, _mm256_load_ps(tp[c][gi].da)));
                if (qg_has_min(f))
                    acc[r][c] = _mm256_fmadd_ps(_mm256_load_ps(wr[r].mw[gi]), _mm256_load_ps(tp[c][gi].sa), acc[r][c]);
            }
        }
        for (int k = 0; k < g; k++) {
            const int uk = 8 * gi + k;
            _Pragma("GCC unroll 8") for (int r = 0; r < R; r++) {
                const __m256i q = _mm256_load_si256((const __m256i *)wr[r].q[uk]);
                _Pragma("GCC unroll 8") for (int c = 0; c < C; c++) {
                    __m256i p;
                    if (qg_sign_path(f)) {
#if !QG_VNNI
                        __m256i av = qg_load(qg_act(f, act[c], u0 + uk));
                        p = _mm256_maddubs_epi16(_mm256_load_si256((const __m256i *)wr[r].qa[uk]),
                                                 _mm256_sign_epi8(av, q));
                        p = _mm256_madd_epi16(p, _mm256_set1_epi16(1));
#else
                        p = _mm256_setzero_si256(); /* not reached: VNNI has no sign path */
#endif
                    } else {
                        const __m256i z = _mm256_load_si256((const __m256i *)wr[r].z[uk]);
                        const __m256i a = _mm256_load_si256((const __m256i *)qg_ap(apb, c0 + c, uk));
#if QG_VNNI
                        p = _mm256_dpbusd_epi32(z, a, q);
#else
                        p = _mm256_add_epi32(z, _mm256_madd_epi16(_mm256_maddubs_epi16(a, q), _mm256_set1_epi16(1)));
#endif
                    }
                    acc[r][c] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p), _mm256_broadcast_ss(&dd[r][c][k]), acc[r][c]);
                }
            }
        }
    }
    _Pragma("GCC unroll 8") for (int r = 0; r < R; r++) _Pragma("GCC unroll 8") for (int c = 0; c < C; c++) {
        float *o = &y[(size_t)c * ldy + (size_t)r];
        *o = first ? qg_hsum(acc[r][c]) : *o + qg_hsum(acc[r][c]);
    }
}

#if QG_VNNI
/* The AVX-512 tile: R rows x NP token pairs in zmm. One vpdpbusd does unit k
 * of a row against tokens 2p and 2p+1 at once (the row's 32 bytes broadcast
 * to both halves, the tokens' prepared units side by side); 512-bit
 * VNNI/convert/FMA issue on two ports, as 256-bit FMA-class work does, so
 * each instruction does twice the work. The per-half scale [da(2p) | da(2p+1)]
 * of unit k comes from one vpermps per (pair, unit), shared by the R rows;
 * the row's unit scale multiplies it by embedded broadcast. Tokens past ct
 * (an odd count) compute on zeroed slots and are not written. */
QG_INLINE void qg_micro512(const int f, const int R, const int NP, int cu, const qg_wrow *wr, qg_tgrp (*tp)[QG_GROUPS],
                           uint8_t *apb, int c0, int ct, float *y, size_t ldy, int first) {
    __m512 acc[QG_R][4];
    _Pragma("GCC unroll 8") for (int r = 0; r < R; r++) _Pragma("GCC unroll 8") for (int p = 0; p < NP; p++) acc[r][p] =
        _mm512_setzero_ps();
    const __m512i half = _mm512_set_epi32(8, 8, 8, 8, 8, 8, 8, 8, 0, 0, 0, 0, 0, 0, 0, 0);
    for (int gi = 0; gi * 8 < cu; gi++) {
        const int g = cu - 8 * gi < 8 ? cu - 8 * gi : 8;
        __m512 dap[4];
        _Pragma("GCC unroll 8") for (int p = 0; p < NP; p++) {
            dap[p] = _mm512_insertf32x8(_mm512_castps256_ps512(_mm256_load_ps(tp[2 * p][gi].da)),
                                        _mm256_load_ps(tp[2 * p + 1][gi].da), 1);
            if (qg_has_min(f)) {
                __m512 sap = _mm512_insertf32x8(_mm512_castps256_ps512(_mm256_load_ps(tp[2 * p][gi].sa)),
                                                _mm256_load_ps(tp[2 * p + 1][gi].sa), 1);
                _Pragma("GCC unroll 8") for (int r = 0; r < R; r++) acc[r][p] =
                    _mm512_fmadd_ps(_mm512_broadcast_f32x8(_mm256_load_ps(wr[r].mw[gi])), sap, acc[r][p]);
            }
        }
        if (qg_kint(f)) {
            /* a super-block: per row, isum = sum_j sc_j * (z_j + dot(a+128, w_j)) in
             * int32 (|isum| < 8 * 63 * 32 * 255 * 31: exact), then acc += isum * d*dy */
            _Pragma("GCC unroll 8") for (int r = 0; r < R; r++) {
                __m512i isum[4];
                const __m512i zs = _mm512_broadcast_i64x4(_mm256_load_si256((const __m256i *)wr[r].zs[gi]));
                _Pragma("GCC unroll 8") for (int p = 0; p < NP; p++) isum[p] = zs;
                _Pragma("GCC unroll 8") for (int k = 0; k < 8; k++) {
                    const int uk = 8 * gi + k;
                    const __m512i q2 = _mm512_broadcast_i64x4(_mm256_load_si256((const __m256i *)wr[r].q[uk]));
                    const __m512i sc = _mm512_set1_epi32((int)wr[r].sc2[uk]);
                    _Pragma("GCC unroll 8") for (int p = 0; p < NP; p++) {
                        const __m512i a2 = _mm512_loadu_si512(qg_ap(apb, c0 + 2 * p, uk));
                        isum[p] = _mm512_dpwssd_epi32(isum[p], _mm512_maddubs_epi16(a2, q2), sc);
                    }
                }
                _Pragma("GCC unroll 8") for (int p = 0; p < NP; p++) acc[r][p] = _mm512_fmadd_ps(
                    _mm512_cvtepi32_ps(isum[p]), _mm512_mul_ps(dap[p], _mm512_set1_ps(wr[r].dk[gi])), acc[r][p]);
            }
            continue;
        }
        for (int k = 0; k < g; k++) {
            const int uk = 8 * gi + k;
            const __m512i idx = _mm512_add_epi32(half, _mm512_set1_epi32(k));
            __m512i q2[QG_R];
            _Pragma("GCC unroll 8") for (int r = 0; r < R; r++) q2[r] =
                _mm512_broadcast_i64x4(_mm256_load_si256((const __m256i *)wr[r].q[uk]));
            _Pragma("GCC unroll 8") for (int p = 0; p < NP; p++) {
                const __m512 dax = _mm512_permutexvar_ps(idx, dap[p]);
                const __m512i a2 = _mm512_loadu_si512(qg_ap(apb, c0 + 2 * p, uk));
                _Pragma("GCC unroll 8") for (int r = 0; r < R; r++) {
                    __m512i z2 = _mm512_broadcast_i64x4(_mm256_load_si256((const __m256i *)wr[r].z[uk]));
                    __m512i pv = _mm512_dpbusd_epi32(z2, a2, q2[r]);
                    __m512 dd = _mm512_mul_ps(dax, _mm512_set1_ps(wr[r].dw[gi][k]));
                    acc[r][p] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(pv), dd, acc[r][p]);
                }
            }
        }
    }
    _Pragma("GCC unroll 8") for (int r = 0; r < R; r++) _Pragma("GCC unroll 8") for (int p = 0; p < NP; p++) {
        for (int h = 0; h < 2; h++) {
            const int c = 2 * p + h;
            if (c >= ct) break;
            __m256 v = h ? _mm512_extractf32x8_ps(acc[r][p], 1) : _mm512_castps512_ps256(acc[r][p]);
            float *o = &y[(size_t)c * ldy + (size_t)r];
            *o = first ? qg_hsum(v) : *o + qg_hsum(v);
        }
    }
}
#endif

#if QG_VNNI
/* ---- AVX-512: 16 rows interleaved (lane = row) ----
 * For blocks of 16 rows (every full cpu_matmul task), the chunk's decoded
 * rows are stored interleaved: for unit k and dword j, one 64-byte vector
 * holds bytes 4j..4j+3 of the 16 rows, as unsigned w+128. One vpdpbusd then
 * multiplies 16 rows x 4 weights with a token's 4 activation bytes, broadcast
 * from the activation row itself ({1to16}: no copy, no shuffle); 8 of them
 * cover a unit, whose int32 sums start at -128 * sum(a) (exact offset). The
 * lane-per-row result takes the rows' unit scales as one vector: per (unit,
 * token) 8 vpdpbusd + convert + multiply + FMA for 512 multiply-adds, against
 * 4 instructions per 64 in qg_micro512. The outputs are 16 consecutive floats
 * of y per token (no horizontal sums). It is llama.cpp's repacked layout,
 * built per call in L1 from the decoded chunk instead of once at load. */
#define QG_RB 16

typedef struct {
    uint8_t w[QG_CHUNK][8][64]; /* unit k, dword j: lane r = row r's bytes 4j..4j+3, as w+128 */
    float dw[QG_CHUNK][QG_RB];  /* unit scale per row */
    float mw[QG_CHUNK][QG_RB];  /* min coefficient per row (qg_has_min) */
} qg_wblk;

/* per token and unit of the chunk */
typedef struct {
    int32_t zt[QT_GEMM_MAX_TOK][QG_CHUNK]; /* -128 * sum of the unit's quants */
    float da[QT_GEMM_MAX_TOK][QG_CHUNK];
    float sa[QT_GEMM_MAX_TOK][QG_CHUNK];
} qg_tblk;

/* CT tokens (c0..c0+CT-1) x 16 rows over the chunk's cu units */
QG_INLINE void qg_micro16(const int f, const int CT, int u0, int cu, const qg_wblk *b, const qg_tblk *t,
                          const uint8_t *const *act, int c0, float *y, size_t ldy, int first) {
    __m512 acc[16];
    _Pragma("GCC unroll 16") for (int c = 0; c < CT; c++) acc[c] = _mm512_setzero_ps();
    for (int k = 0; k < cu; k++) {
        __m512i wv[8];
        _Pragma("GCC unroll 8") for (int j = 0; j < 8; j++) wv[j] = _mm512_load_si512(b->w[k][j]);
        const __m512 dw = _mm512_load_ps(b->dw[k]);
        _Pragma("GCC unroll 16") for (int c = 0; c < CT; c++) {
            const int8_t *a = qg_act(f, act[c0 + c], u0 + k);
            __m512i isum = _mm512_set1_epi32(t->zt[c0 + c][k]);
            _Pragma("GCC unroll 8") for (int j = 0; j < 8; j++) {
                int32_t a4;
                memcpy(&a4, a + 4 * j, 4);
                isum = _mm512_dpbusd_epi32(isum, wv[j], _mm512_set1_epi32(a4));
            }
            acc[c] =
                _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum), _mm512_mul_ps(dw, _mm512_set1_ps(t->da[c0 + c][k])), acc[c]);
            if (qg_has_min(f))
                acc[c] = _mm512_fmadd_ps(_mm512_load_ps(b->mw[k]), _mm512_set1_ps(t->sa[c0 + c][k]), acc[c]);
        }
    }
    _Pragma("GCC unroll 16") for (int c = 0; c < CT; c++) {
        float *o = y + (size_t)(c0 + c) * ldy;
        _mm512_storeu_ps(o, first ? acc[c] : _mm512_add_ps(_mm512_loadu_ps(o), acc[c]));
    }
}

QG_INLINE void qg_run16(const int f, int n, int nr, int nc, const void *wv, size_t ws, const void *const *actv,
                        float *y, size_t ldy) {
    const uint8_t *const *act = (const uint8_t *const *)actv;
    qg_wblk b __attribute__((aligned(64)));
    qg_tblk t;
    qg_wrow tmp;
    const int n_units = n / 32;
    for (int u0 = 0; u0 < n_units; u0 += QG_CHUNK) {
        const int cu = n_units - u0 < QG_CHUNK ? n_units - u0 : QG_CHUNK;
        const int first = u0 == 0;
        /* tokens: scales and the exact offset -128 * sum(a) per unit, 8 units at a time */
        for (int c = 0; c < nc; c++)
            for (int gi = 0; gi * 8 < cu; gi++) {
                const int g = cu - 8 * gi < 8 ? cu - 8 * gi : 8;
                qg_tgrp tg;
                qg_prep(f, act[c], u0 + 8 * gi, g, &tg, NULL, 0, gi);
                __m256i sums;
                if (qg_super(f)) { /* pair sums of Q8_K's 16 bsums */
                    __m256i bs = qg_load(((const block_q8_K *)act[c])[(u0 + 8 * gi) / 8].bsums);
                    sums = _mm256_cvtepi16_epi32(
                        _mm_hadd_epi16(_mm256_castsi256_si128(bs), _mm256_extracti128_si256(bs, 1)));
                } else { /* lane sums of each unit, then a transposing add tree: lane k = unit k */
                    __m256i u[8];
                    for (int k = 0; k < 8; k++)
                        u[k] = k < g ? _mm256_dpbusd_epi32(_mm256_setzero_si256(), _mm256_set1_epi8(1),
                                                           qg_load(qg_act(f, act[c], u0 + 8 * gi + k)))
                                     : _mm256_setzero_si256();
                    __m256i lo = _mm256_hadd_epi32(_mm256_hadd_epi32(u[0], u[1]), _mm256_hadd_epi32(u[2], u[3]));
                    __m256i hi = _mm256_hadd_epi32(_mm256_hadd_epi32(u[4], u[5]), _mm256_hadd_epi32(u[6], u[7]));
                    sums = _mm256_add_epi32(_mm256_permute2x128_si256(lo, hi, 0x20),
                                            _mm256_permute2x128_si256(lo, hi, 0x31));
                }
                int32_t zt[8];
                _mm256_storeu_si256((__m256i *)zt,
                                    _mm256_sub_epi32(_mm256_setzero_si256(), _mm256_slli_epi32(sums, 7)));
                for (int k = 0; k < g; k++) {
                    t.zt[c][8 * gi + k] = zt[k];
                    t.da[c][8 * gi + k] = tg.da[k];
                    t.sa[c][8 * gi + k] = qg_has_min(f) ? tg.sa[k] : 0.0f;
                }
            }
        const uint8_t *w = wv;
        for (int r0 = 0; r0 < nr; r0 += QG_RB, w += (size_t)QG_RB * ws) {
            /* rows: decoded once per chunk, then interleaved dword by dword */
            for (int r = 0; r < QG_RB; r++) {
                for (int gi = 0; gi * 8 < cu; gi++)
                    qg_decode(f, 0, w + (size_t)r * ws, u0 + 8 * gi, cu - 8 * gi < 8 ? cu - 8 * gi : 8, &tmp, gi);
                for (int k = 0; k < cu; k++) {
                    uint32_t d[8];
                    _mm256_storeu_si256((__m256i *)d, _mm256_xor_si256(_mm256_load_si256((const __m256i *)tmp.q[k]),
                                                                       _mm256_set1_epi8((char)0x80)));
                    for (int j = 0; j < 8; j++) memcpy(&b.w[k][j][4 * r], &d[j], 4);
                    b.dw[k][r] = tmp.dw[k / 8][k % 8];
                    b.mw[k][r] = qg_has_min(f) ? tmp.mw[k / 8][k % 8] : 0.0f;
                }
            }
            float *yr = y + r0;
            int c = 0;
            for (; c + 16 <= nc; c += 16) qg_micro16(f, 16, u0, cu, &b, &t, act, c, yr, ldy, first);
            for (; c + 8 <= nc; c += 8) qg_micro16(f, 8, u0, cu, &b, &t, act, c, yr, ldy, first);
            for (; c + 4 <= nc; c += 4) qg_micro16(f, 4, u0, cu, &b, &t, act, c, yr, ldy, first);
            for (; c < nc; c++) qg_micro16(f, 1, u0, cu, &b, &t, act, c, yr, ldy, first);
        }
    }
}
#endif

QG_INLINE void qg_run(const int f, int n, int nr, int nc, const void *wv, size_t ws, const void *const *actv, float *y,
                      size_t ldy) {
    const uint8_t *const *act = (const uint8_t *const *)actv;
    qg_wrow wr[QG_R];
    qg_tgrp tp[QT_GEMM_MAX_TOK][QG_GROUPS];
    uint8_t apb[QG_AP_BYTES] __attribute__((aligned(64))); /* unsigned activations (offset path), qg_ap layout */
    const int n_units = n / 32;
    for (int u0 = 0; u0 < n_units; u0 += QG_CHUNK) {
        const int cu = n_units - u0 < QG_CHUNK ? n_units - u0 : QG_CHUNK;
        const int first = u0 == 0;
        /* tokens: prepared once per chunk, used by every row tile */
        for (int c = 0; c < nc; c++)
            for (int gi = 0; gi * 8 < cu; gi++)
                qg_prep(f, act[c], u0 + 8 * gi, cu - 8 * gi < 8 ? cu - 8 * gi : 8, &tp[c][gi], apb, c, gi);
#if QG_VNNI
        if (nc % 2) { /* the odd token's partner slot: zeros, computed on and not written */
            memset(tp[nc], 0, sizeof tp[nc]);
            for (int k = 0; k < cu; k++) memset(qg_ap(apb, nc, k), 0, 32);
        }
#endif
        const uint8_t *w = wv;
        for (int r = 0; r < nr; r += QG_R, w += (size_t)QG_R * ws) {
            const int rt = nr - r < QG_R ? nr - r : QG_R;
            /* rows: decoded once per chunk, used by every token */
            for (int i = 0; i < rt; i++)
                for (int gi = 0; gi * 8 < cu; gi++)
                    qg_decode(f, 1, w + (size_t)i * ws, u0 + 8 * gi, cu - 8 * gi < 8 ? cu - 8 * gi : 8, &wr[i], gi);
            if (rt < QG_R) { /* leftover rows (rare: models' row counts are multiples of 4) */
                for (int i = 0; i < rt; i++)
                    for (int c = 0; c < nc; c++)
                        qg_micro(f, 1, 1, u0, cu, &wr[i], &tp[c], apb, c, act + c, y + (size_t)c * ldy + r + i, ldy,
                                 first);
                continue;
            }
#if QG_VNNI
            for (int c = 0; c < nc; c += 8) {
                const int ct = nc - c < 8 ? nc - c : 8;
                float *yt = y + (size_t)c * ldy + (size_t)r;
                switch ((ct + 1) / 2) {
                case 1: qg_micro512(f, QG_R, 1, cu, wr, &tp[c], apb, c, ct, yt, ldy, first); break;
                case 2: qg_micro512(f, QG_R, 2, cu, wr, &tp[c], apb, c, ct, yt, ldy, first); break;
                case 3: qg_micro512(f, QG_R, 3, cu, wr, &tp[c], apb, c, ct, yt, ldy, first); break;
                default: qg_micro512(f, QG_R, 4, cu, wr, &tp[c], apb, c, ct, yt, ldy, first); break;
                }
            }
#else
            for (int c = 0; c < nc; c += QG_C) {
                const int ct = nc - c < QG_C ? nc - c : QG_C;
                float *yt = y + (size_t)c * ldy + (size_t)r;
                switch (ct) {
                case 1: qg_micro(f, QG_R, 1, u0, cu, wr, &tp[c], apb, c, act + c, yt, ldy, first); break;
                case 2: qg_micro(f, QG_R, 2, u0, cu, wr, &tp[c], apb, c, act + c, yt, ldy, first); break;
                case 3: qg_micro(f, QG_R, 3, u0, cu, wr, &tp[c], apb, c, act + c, yt, ldy, first); break;
                default: qg_micro(f, QG_R, QG_C, u0, cu, wr, &tp[c], apb, c, act + c, yt, ldy, first); break;
                }
            }
#endif
        }
    }
}

/* ---- Q6_K ---- */

typedef struct {
    uint8_t q[8][32] QG_ALIGN;  /* unit k = weights 32k..32k+31, values 0..63 */
    int16_t sc[8][16] QG_ALIGN; /* unit k's scales: 8 lanes sc[2k], 8 lanes sc[2k+1] */
    int16_t nb[16] QG_ALIGN;    /* -32 * sc[g]: the offset against the bsums */
    float d;
} qg_q6sb;

QG_INLINE void qg_q6_decode(const block_q6_K *x, qg_q6sb *o) {
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
    _mm256_store_si256((__m256i *)o->nb,
                       _mm256_slli_epi16(_mm256_sub_epi16(_mm256_setzero_si256(), _mm256_cvtepi8_epi16(sc8)), 5));
    o->d = _cvtsh_ss(x->d);
}

QG_INLINE __m256i qg_dpwssd(__m256i acc, __m256i p, __m256i s) {
#if QG_VNNI
    return _mm256_dpwssd_epi32(acc, p, s);
#else
    return _mm256_add_epi32(acc, _mm256_madd_epi16(p, s));
#endif
}

#define QG_Q6_CHUNK 8 /* super-blocks per chunk */

QG_INLINE void qg_q6_micro(const int R, const int C, int sb0, int nsb, qg_q6sb (*wr)[QG_Q6_CHUNK],
                           const uint8_t *const *act, float *y, size_t ldy, int first) {
    __m256 acc[QG_R][QG_C];
    _Pragma("GCC unroll 8") for (int r = 0; r < R; r++) _Pragma("GCC unroll 8") for (int c = 0; c < C; c++) acc[r][c] =
        _mm256_setzero_ps();
    for (int s = 0; s < nsb; s++) {
        const block_q8_K *ya[QG_C];
        _Pragma("GCC unroll 8") for (int c = 0; c < C; c++) ya[c] = (const block_q8_K *)act[c] + sb0 + s;
        _Pragma("GCC unroll 8") for (int r = 0; r < R; r++) {
            const qg_q6sb *x = &wr[r][s];
            __m256i isum[QG_C];
            __m256i nb = _mm256_load_si256((const __m256i *)x->nb);
            _Pragma("GCC unroll 8") for (int c = 0; c < C; c++) isum[c] = _mm256_madd_epi16(nb, qg_load(ya[c]->bsums));
            _Pragma("GCC unroll 8") for (int k = 0; k < 8; k++) {
                __m256i q = _mm256_load_si256((const __m256i *)x->q[k]);
                __m256i sc = _mm256_load_si256((const __m256i *)x->sc[k]);
                _Pragma("GCC unroll 8") for (int c = 0; c < C; c++) isum[c] =
                    qg_dpwssd(isum[c], _mm256_maddubs_epi16(q, qg_load(ya[c]->qs + 32 * k)), sc);
            }
            _Pragma("GCC unroll 8") for (int c = 0; c < C; c++) acc[r][c] =
                _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum[c]), _mm256_set1_ps(x->d * ya[c]->d), acc[r][c]);
        }
    }
    _Pragma("GCC unroll 8") for (int r = 0; r < R; r++) _Pragma("GCC unroll 8") for (int c = 0; c < C; c++) {
        float *o = &y[(size_t)c * ldy + (size_t)r];
        *o = first ? qg_hsum(acc[r][c]) : *o + qg_hsum(acc[r][c]);
    }
}

static void gemm_q6_k(int n, int nr, int nc, const void *wv, size_t ws, const void *const *actv, float *y, size_t ldy) {
    const uint8_t *const *act = (const uint8_t *const *)actv;
    qg_q6sb wr[QG_R][QG_Q6_CHUNK];
    const int n_sb = n / QK_K;
    for (int sb0 = 0; sb0 < n_sb; sb0 += QG_Q6_CHUNK) {
        const int nsb = n_sb - sb0 < QG_Q6_CHUNK ? n_sb - sb0 : QG_Q6_CHUNK;
        const uint8_t *w = wv;
        for (int r = 0; r < nr; r += QG_R, w += (size_t)QG_R * ws) {
            const int rt = nr - r < QG_R ? nr - r : QG_R;
            for (int i = 0; i < rt; i++)
                for (int s = 0; s < nsb; s++)
                    qg_q6_decode((const block_q6_K *)(w + (size_t)i * ws) + sb0 + s, &wr[i][s]);
            for (int c = 0; c < nc; c += QG_C) {
                const int ct = nc - c < QG_C ? nc - c : QG_C;
                float *yt = y + (size_t)c * ldy + (size_t)r;
                if (rt < QG_R) {
                    for (int i = 0; i < rt; i++)
                        for (int j = 0; j < ct; j++)
                            qg_q6_micro(1, 1, sb0, nsb, &wr[i], act + c + j, yt + (size_t)j * ldy + i, ldy, sb0 == 0);
                    continue;
                }
                switch (ct) {
                case 1: qg_q6_micro(QG_R, 1, sb0, nsb, wr, act + c, yt, ldy, sb0 == 0); break;
                case 2: qg_q6_micro(QG_R, 2, sb0, nsb, wr, act + c, yt, ldy, sb0 == 0); break;
                case 3: qg_q6_micro(QG_R, 3, sb0, nsb, wr, act + c, yt, ldy, sb0 == 0); break;
                default: qg_q6_micro(QG_R, QG_C, sb0, nsb, wr, act + c, yt, ldy, sb0 == 0); break;
                }
            }
        }
    }
}

/* ---- entry points ---- */

#ifndef QG_AMX
#define QG_AMX 0
#endif
#if QG_AMX
#include "quant/quant_gemm_amx.h"
#endif
#if QG_VNNI
/* Q4_K/Q5_K keep qg_micro512's integer sub-block scales (faster than a
 * float scale per unit here); Q6_K has its own kernel */
#define QG_RUN16(f, n, nr, nc, w, ws, act, y, ldy)                                                                     \
    if ((nr) % QG_RB == 0 && !qg_kint(f)) {                                                                            \
        qg_run16(f, n, nr, nc, w, ws, act, y, ldy);                                                                    \
        return;                                                                                                        \
    }
#else
#define QG_RUN16(f, n, nr, nc, w, ws, act, y, ldy)
#endif

#define QG_ENTRY(name, f)                                                                                              \
    static void name(int n, int nr, int nc, const void *w, size_t ws, const void *const *act, float *y, size_t ldy) {  \
        QG_RUN16(f, n, nr, nc, w, ws, act, y, ldy)                                                                     \
        qg_run(f, n, nr, nc, w, ws, act, y, ldy);                                                                      \
    }                                                                                                                  \
    QG_ENTRY_AMX(name, f)

#if QG_AMX
/* Up to QT_GEMM_AMX_MAX_TOK tokens: blocks of 16 rows and enough tokens take
 * the tile path (every format qg_decode reads); blocks of 16 rows and fewer
 * tokens take qg_run16, Q4_K and Q5_K too, whose float work per unit is the
 * tile path's, operation for operation: a (row, token) pair's output is the
 * same bits whichever of the two computed it, so how a product's tokens
 * are batched (the expert lanes split them) cannot change a result, nor
 * flip a near-tied expert choice downstream (tests/quant/test_gemm.c checks
 * it). Rows past the last whole block of 16: the kernels above,
 * QT_GEMM_MAX_TOK tokens at a time; the caller's row blocks are multiples of
 * 16, so which rows those are does not depend on how it cut the product. */
QG_INLINE void qg_pieces(qt_gemm_fn fn, int n, int nr, int nc, const void *w, size_t ws, const void *const *act,
                         float *y, size_t ldy) {
    for (int c = 0; c < nc; c += QT_GEMM_MAX_TOK)
        fn(n, nr, nc - c < QT_GEMM_MAX_TOK ? nc - c : QT_GEMM_MAX_TOK, w, ws, act + c, y + (size_t)c * ldy, ldy);
}
#define QG_ENTRY_AMX(name, f)                                                                                          \
    static void name##_t(int n, int nr, int nc, const void *w, size_t ws, const void *const *act, float *y,            \
                         size_t ldy) {                                                                                 \
        const int nr16 = nr / QG_RB * QG_RB;                                                                           \
        if (nr16 && nc >= QG_AMX_MIN_TOK) qg_run_amx(f, n, nr16, nc, w, ws, act, y, ldy);                              \
        else if (nr16) qg_run16(f, n, nr16, nc, w, ws, act, y, ldy);                                                   \
        if (nr > nr16)                                                                                                 \
            qg_pieces(name, n, nr - nr16, nc, (const uint8_t *)w + (size_t)nr16 * ws, ws, act, y + nr16, ldy);         \
    }
#define QG_NAME(name) name##_t
#else
#define QG_ENTRY_AMX(name, f)
#define QG_NAME(name) name
#endif

QG_ENTRY(gemm_q4_0, QG_Q4_0)
QG_ENTRY(gemm_q4_1, QG_Q4_1)
QG_ENTRY(gemm_q5_0, QG_Q5_0)
QG_ENTRY(gemm_q5_1, QG_Q5_1)
QG_ENTRY(gemm_q8_0, QG_Q8_0)
QG_ENTRY(gemm_iq4_nl, QG_IQ4_NL)
QG_ENTRY(gemm_q4_k, QG_Q4_K)
QG_ENTRY(gemm_q5_k, QG_Q5_K)
QG_ENTRY(gemm_iq4_xs, QG_IQ4_XS)
#if QG_AMX
/* Q6_K: its own tile path and a companion for fewer tokens (quant_gemm_amx.h) */
static void gemm_q6_k_t(int n, int nr, int nc, const void *w, size_t ws, const void *const *act, float *y, size_t ldy) {
    const int nr16 = nr / QG_RB * QG_RB;
    if (nr16 && nc >= QG_AMX_MIN_TOK) qg_run_amx_q6(n, nr16, nc, w, ws, act, y, ldy);
    else if (nr16) qg_run16_q6(n, nr16, nc, w, ws, act, y, ldy);
    if (nr > nr16)
        qg_pieces(gemm_q6_k, n, nr - nr16, nc, (const uint8_t *)w + (size_t)nr16 * ws, ws, act, y + nr16, ldy);
}
#endif

const qt_gemm_fn QG_TABLE[QT_COUNT] = {
    [QT_Q4_0] = QG_NAME(gemm_q4_0),     [QT_Q4_1] = QG_NAME(gemm_q4_1), [QT_Q5_0] = QG_NAME(gemm_q5_0),
    [QT_Q5_1] = QG_NAME(gemm_q5_1),     [QT_Q8_0] = QG_NAME(gemm_q8_0), [QT_IQ4_NL] = QG_NAME(gemm_iq4_nl),
    [QT_Q4_K] = QG_NAME(gemm_q4_k),     [QT_Q5_K] = QG_NAME(gemm_q5_k), [QT_Q6_K] = QG_NAME(gemm_q6_k),
    [QT_IQ4_XS] = QG_NAME(gemm_iq4_xs),
};

#endif
