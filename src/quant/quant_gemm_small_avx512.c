/* Small-batch products on AVX-512 VNNI (quant_gemm.h, qt_gemm_small): a run
 * of weight rows times 1-8 activation rows, for decode steps of a few
 * sequences (the server's batched step) and MoE experts with few tokens.
 *
 * Why: with 2-8 tokens the gemm kernels (quant_gemm_body.h) spend most of
 * their time decoding and interleaving rows into L1 tiles and preparing the
 * tokens per chunk, work that only pays with many tokens; on SmolLM2-135M a
 * decode step of 2 sequences took over twice the one-sequence step. Here
 * each weight block is decoded once in registers and dotted with every
 * token right away, so the per-token work is what the single-row dot does
 * per block (an int8 dot, its conversion and one FMA) and nothing else.
 *
 * Bit for bit the single-row dot (qt_vec_dot on AVX-512: quant_dot_avx512.c,
 * through quant_dot_legacy.h's QT_LEGACY_DOT and QT_MIN_TERM, the loops the
 * AVX2 kernels run too): per token the same int32 lanes (vpdpbusd in both:
 * the same 4 products per lane, exact; the signed formats use the same |x|
 * and sign(a, x)), the same scale products d_w * d_a rounded once,
 * the even blocks of each group of 8 in one accumulator and the odd ones in
 * another, tail blocks into the first, the same horizontal sum, and for
 * Q4_1/Q5_1 the same min term (m * s per group of 8 in its own accumulator,
 * then the tail blocks added in order). So a sequence's logits do not depend
 * on how many others share its step, and mixing this kernel with the dot
 * (one token: dot, 2-8: here) changes no result.
 * tests/quant/test_gemm.c checks that equality on every format and token
 * count; a changed accumulation order fails it.
 *
 * Activation side, once per call for all rows: each token's f16 block scales
 * (and Q8_1's s) as floats. Weight side, once per group of 8 blocks: the 8
 * scales (and mins) by one gather of the blocks' first dwords.
 */
#include <immintrin.h>

#include "quant/quant_dot_common.h"
#include "quant/quant_simd_bits.h"
#include "quant/quant_gemm_impl.h"

#define QS_INLINE static inline __attribute__((always_inline))
/* tokens' prepared scales per call: rows of up to 1024 blocks (32768 weights);
 * longer rows go through the dot per pair (same bits) */
#define QS_MAX_BLOCKS 1024

enum { QS_Q4_0, QS_Q4_1, QS_Q5_0, QS_Q5_1, QS_Q8_0, QS_IQ4_NL };

QS_INLINE int qs_has_min(int f) { return f == QS_Q4_1 || f == QS_Q5_1; }
/* unsigned weights go straight into vpdpbusd; signed ones as |x| and sign(a, x) */
QS_INLINE int qs_unsigned(int f) { return f == QS_Q4_1 || f == QS_Q5_1; }

QS_INLINE size_t qs_wblock(int f) {
    switch (f) {
    case QS_Q4_0: return sizeof(block_q4_0);
    case QS_Q4_1: return sizeof(block_q4_1);
    case QS_Q5_0: return sizeof(block_q5_0);
    case QS_Q5_1: return sizeof(block_q5_1);
    case QS_Q8_0: return sizeof(block_q8_0);
    default: return sizeof(block_iq4_nl);
    }
}
/* activation blocks: Q8_1 {d, s, qs} for the formats with a min, else Q8_0 {d, qs} */
QS_INLINE size_t qs_ablock(int f) { return qs_has_min(f) ? sizeof(block_q8_1) : sizeof(block_q8_0); }
QS_INLINE size_t qs_aoff(int f) { return qs_has_min(f) ? 4 : 2; }

QS_INLINE __m256i qs_load(const void *p) { return _mm256_loadu_si256((const __m256i *)p); }

/* 32 bits -> 32 bytes, 0xff where bit i is set: one mask move */
QS_INLINE __m256i qs_bits(const uint8_t *p) {
    uint32_t bits;
    memcpy(&bits, p, 4);
    return _mm256_movm_epi8((__mmask32)bits);
}

/* The 32 weights of block b as bytes: unsigned (Q4_1, Q5_1) or signed. */
QS_INLINE __m256i qs_decode(const int f, const uint8_t *x) {
    switch (f) {
    case QS_Q4_0: return _mm256_sub_epi8(qt_nibbles32(((const block_q4_0 *)x)->qs), _mm256_set1_epi8(8));
    case QS_Q4_1: return qt_nibbles32(((const block_q4_1 *)x)->qs);
    case QS_Q5_0: {
        const block_q5_0 *b = (const block_q5_0 *)x;
        return _mm256_or_si256(qt_nibbles32(b->qs), _mm256_andnot_si256(qs_bits(b->qh), _mm256_set1_epi8((char)0xf0)));
    }
    case QS_Q5_1: {
        const block_q5_1 *b = (const block_q5_1 *)x;
        return _mm256_or_si256(qt_nibbles32(b->qs), _mm256_and_si256(qs_bits(b->qh), _mm256_set1_epi8(0x10)));
    }
    case QS_Q8_0: return qs_load(((const block_q8_0 *)x)->qs);
    default: {
        const __m256i lut = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)kvalues_iq4nl));
        return _mm256_shuffle_epi8(lut, qt_nibbles32(((const block_iq4_nl *)x)->qs));
    }
    }
}

/* The int32 lanes of one block against one token's quants a: 4 products per
 * lane, exactly the dot's lanes. u: the decoded weights, or their |x| for
 * signed formats (then sx holds the signed weights). */
QS_INLINE __m256i qs_idot(const int f, __m256i u, __m256i sx, const int8_t *a) {
    __m256i av = qs_load(a);
    if (!qs_unsigned(f)) av = _mm256_sign_epi8(av, sx);
    return _mm256_dpbusd_epi32(_mm256_setzero_si256(), u, av);
}

/* quant_dot_avx2.c's hsum_ps, operation for operation */
QS_INLINE float qs_hsum(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

/* nr rows x NC tokens (NC a constant after inlining: the accumulators stay in registers). */
QS_INLINE void qs_rows(const int f, const int NC, int n, int nr, const uint8_t *w, size_t ws, const uint8_t *const *act,
                       float *y, size_t ldy) {
    const int nb = n / 32;
    const size_t bs = qs_wblock(f), as = qs_ablock(f), ao = qs_aoff(f);
    /* the tokens' block scales (and Q8_1's s) as floats, once for all rows */
    float yd[QT_GEMM_SMALL_MAX_TOK][QS_MAX_BLOCKS] __attribute__((aligned(32)));
    float ys[QT_GEMM_SMALL_MAX_TOK][QS_MAX_BLOCKS] __attribute__((aligned(32))); /* Q8_1's s */
    for (int c = 0; c < NC; c++)
        for (int b = 0; b < nb; b++) {
            uint16_t h[2];
            memcpy(h, act[c] + (size_t)b * as, sizeof h);
            yd[c][b] = _cvtsh_ss(h[0]);
            if (qs_has_min(f)) ys[c][b] = _cvtsh_ss(h[1]);
        }
    const __m256i gidx = _mm256_mullo_epi32(_mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7), _mm256_set1_epi32((int)bs));
    for (int r = 0; r < nr; r++) {
        const uint8_t *x = w + (size_t)r * ws;
        __m256 acc0[QT_GEMM_SMALL_MAX_TOK], acc1[QT_GEMM_SMALL_MAX_TOK], accm[QT_GEMM_SMALL_MAX_TOK];
        _Pragma("GCC unroll 8") for (int c = 0; c < NC; c++) acc0[c] = acc1[c] = accm[c] = _mm256_setzero_ps();
        int ib = 0;
        for (; ib + 8 <= nb; ib += 8) {
            /* the 8 blocks' first dwords: d (and m) */
            const __m256i dm = _mm256_i32gather_epi32((const int *)(x + (size_t)ib * bs), gidx, 1);
            const __m256 xd8 = _mm256_cvtph_ps(_mm256_cvtepi32_epi16(dm));
            float dd[QT_GEMM_SMALL_MAX_TOK][8] __attribute__((aligned(32)));
            _Pragma("GCC unroll 8") for (int c = 0; c < NC; c++)
                _mm256_store_ps(dd[c], _mm256_mul_ps(xd8, _mm256_loadu_ps(&yd[c][ib])));
            if (qs_has_min(f)) {
                const __m256 xm8 = _mm256_cvtph_ps(_mm256_cvtepi32_epi16(_mm256_srli_epi32(dm, 16)));
                _Pragma("GCC unroll 8") for (int c = 0; c < NC; c++) accm[c] =
                    _mm256_fmadd_ps(xm8, _mm256_loadu_ps(&ys[c][ib]), accm[c]);
            }
            _Pragma("GCC unroll 8") for (int k = 0; k < 8; k++) {
                const uint8_t *xb = x + (size_t)(ib + k) * bs;
                const __m256i q = qs_decode(f, xb);
                const __m256i u = qs_unsigned(f) ? q : _mm256_sign_epi8(q, q);
                _Pragma("GCC unroll 8") for (int c = 0; c < NC; c++) {
                    const __m256 p =
                        _mm256_cvtepi32_ps(qs_idot(f, u, q, (const int8_t *)(act[c] + (size_t)(ib + k) * as + ao)));
                    if (k % 2 == 0) acc0[c] = _mm256_fmadd_ps(_mm256_broadcast_ss(&dd[c][k]), p, acc0[c]);
                    else acc1[c] = _mm256_fmadd_ps(_mm256_broadcast_ss(&dd[c][k]), p, acc1[c]);
                }
            }
        }
        const int tail = ib;
        for (; ib < nb; ib++) {
            const uint8_t *xb = x + (size_t)ib * bs;
            uint16_t xd;
            memcpy(&xd, xb, 2);
            const float xdf = _cvtsh_ss(xd);
            const __m256i q = qs_decode(f, xb);
            const __m256i u = qs_unsigned(f) ? q : _mm256_sign_epi8(q, q);
            _Pragma("GCC unroll 8") for (int c = 0; c < NC; c++) {
                const __m256 p = _mm256_cvtepi32_ps(qs_idot(f, u, q, (const int8_t *)(act[c] + (size_t)ib * as + ao)));
                acc0[c] = _mm256_fmadd_ps(_mm256_set1_ps(xdf * yd[c][ib]), p, acc0[c]);
            }
        }
        _Pragma("GCC unroll 8") for (int c = 0; c < NC; c++) {
            float s = qs_hsum(_mm256_add_ps(acc0[c], acc1[c]));
            if (qs_has_min(f)) {
                float m = qs_hsum(accm[c]);
                for (int b = tail; b < nb; b++) {
                    uint16_t xm;
                    memcpy(&xm, x + (size_t)b * bs + 2, 2);
                    m += _cvtsh_ss(xm) * ys[c][b];
                }
                s = s + m;
            }
            y[(size_t)c * ldy + (size_t)r] = s;
        }
    }
}

static const qt_type QS_TYPE[] = {QT_Q4_0, QT_Q4_1, QT_Q5_0, QT_Q5_1, QT_Q8_0, QT_IQ4_NL};

QS_INLINE void qs_entry(const int f, int n, int nr, int nc, const void *wv, size_t ws, const void *const *actv,
                        float *y, size_t ldy) {
    const uint8_t *w = wv;
    const uint8_t *const *act = (const uint8_t *const *)actv;
    if (n / 32 > QS_MAX_BLOCKS) { /* very long rows: the dot itself, per pair */
        qt_gemm_by_dot(qt_vec_dot(QS_TYPE[f], QT_ISA_AVX512), n, nr, nc, wv, ws, actv, y, ldy);
        return;
    }
    switch (nc) {
    case 1: qs_rows(f, 1, n, nr, w, ws, act, y, ldy); break;
    case 2: qs_rows(f, 2, n, nr, w, ws, act, y, ldy); break;
    case 3: qs_rows(f, 3, n, nr, w, ws, act, y, ldy); break;
    case 4: qs_rows(f, 4, n, nr, w, ws, act, y, ldy); break;
    case 5: qs_rows(f, 5, n, nr, w, ws, act, y, ldy); break;
    case 6: qs_rows(f, 6, n, nr, w, ws, act, y, ldy); break;
    case 7: qs_rows(f, 7, n, nr, w, ws, act, y, ldy); break;
    default: qs_rows(f, 8, n, nr, w, ws, act, y, ldy); break;
    }
}

#define QS_ENTRY(name, f)                                                                                              \
    static void name(int n, int nr, int nc, const void *w, size_t ws, const void *const *act, float *y, size_t ldy) {  \
        qs_entry(f, n, nr, nc, w, ws, act, y, ldy);                                                                    \
    }
QS_ENTRY(small_q4_0, QS_Q4_0)
QS_ENTRY(small_q4_1, QS_Q4_1)
QS_ENTRY(small_q5_0, QS_Q5_0)
QS_ENTRY(small_q5_1, QS_Q5_1)
QS_ENTRY(small_q8_0, QS_Q8_0)
QS_ENTRY(small_iq4_nl, QS_IQ4_NL)

const qt_gemm_fn qt_gemms_small_avx512[QT_COUNT] = {
    [QT_Q4_0] = small_q4_0, [QT_Q4_1] = small_q4_1, [QT_Q5_0] = small_q5_0,
    [QT_Q5_1] = small_q5_1, [QT_Q8_0] = small_q8_0, [QT_IQ4_NL] = small_iq4_nl,
};
