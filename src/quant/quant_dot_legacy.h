/* Pieces the AVX2 and AVX-512 dot products of the 32-weight block formats
 * share (quant_dot_avx2.c, quant_dot_avx512.c), so that both run the same
 * float work: AVX-512 kernels that only change the integer core (VNNI)
 * then give the AVX2 kernels' results to the bit, which the small-batch
 * kernels (quant_gemm_small_avx512.c) rely on. Include only from files
 * built with at least -mavx2 -mfma -mf16c.
 */
#ifndef STRATA_QUANT_QUANT_DOT_LEGACY_H
#define STRATA_QUANT_QUANT_DOT_LEGACY_H

#include <immintrin.h>

static inline float qt_hsum8(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

/* fn(b): the f16 field F of 8 consecutive blocks of type BT, as 8 floats */
#define QT_F16X8(fn, BT, F)                                                                                            \
    static inline __m256 fn(const BT *b) {                                                                             \
        uint16_t h[8];                                                                                                 \
        for (int k = 0; k < 8; k++) h[k] = b[k].F;                                                                     \
        return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)h));                                                   \
    }

/* A block's scale as a float: the f16 d (most formats) */
#define QT_XD1_D(b) _cvtsh_ss((b)->d)

/* float name(n, x, y): sum over the 32-weight blocks of x (BT) and y (YT) of
 * d_x * d_y * qd(x, y), qd giving 8 int32 lane sums. The scale products of
 * 8 blocks are converted at once (one vcvtph2ps each side), kept in memory
 * and read back with vbroadcastss (no shuffle per block); two accumulators
 * hide the FMA latency; blocks past the last 8 use xd1 and the f16 d of y. */
#define QT_LEGACY_DOT(name, BT, YT, qd, xd8, yd8, xd1)                                                                 \
    static float name(int n, const BT *x, const YT *y) {                                                               \
        const int nb = n / 32;                                                                                         \
        __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();                                                 \
        int ib = 0;                                                                                                    \
        for (; ib + 8 <= nb; ib += 8) {                                                                                \
            float dd[8] __attribute__((aligned(32)));                                                                  \
            _mm256_store_ps(dd, _mm256_mul_ps(xd8(x + ib), yd8(y + ib)));                                              \
            for (int k = 0; k < 8; k += 2) {                                                                           \
                acc0 = _mm256_fmadd_ps(_mm256_broadcast_ss(dd + k), _mm256_cvtepi32_ps(qd(&x[ib + k], &y[ib + k])),    \
                                       acc0);                                                                          \
                acc1 = _mm256_fmadd_ps(_mm256_broadcast_ss(dd + k + 1),                                                \
                                       _mm256_cvtepi32_ps(qd(&x[ib + k + 1], &y[ib + k + 1])), acc1);                  \
            }                                                                                                          \
        }                                                                                                              \
        for (; ib < nb; ib++)                                                                                          \
            acc0 = _mm256_fmadd_ps(_mm256_set1_ps(xd1(&x[ib]) * _cvtsh_ss(y[ib].d)),                                   \
                                   _mm256_cvtepi32_ps(qd(&x[ib], &y[ib])), acc0);                                      \
        return qt_hsum8(_mm256_add_ps(acc0, acc1));                                                                    \
    }

/* float name(n, x, y): the min term of Q4_1/Q5_1, sum over blocks of m * s,
 * 8 blocks per vector (m8: the m of 8 blocks of BT, s8: the s of 8 Q8_1) */
#define QT_MIN_TERM(name, BT, m8, s8, mfield)                                                                          \
    static float name(int n, const BT *x, const block_q8_1 *y) {                                                       \
        const int nb = n / 32;                                                                                         \
        __m256 acc = _mm256_setzero_ps();                                                                              \
        int ib = 0;                                                                                                    \
        for (; ib + 8 <= nb; ib += 8) acc = _mm256_fmadd_ps(m8(x + ib), s8(y + ib), acc);                              \
        float sum = qt_hsum8(acc);                                                                                     \
        for (; ib < nb; ib++) sum += _cvtsh_ss(x[ib].mfield) * _cvtsh_ss(y[ib].s);                                     \
        return sum;                                                                                                    \
    }

/* The f16 gathers of the six block formats (d8_*, m8_*, s8_q8_1). */
#define QT_LEGACY_SCALES()                                                                                             \
    QT_F16X8(d8_q4_0, block_q4_0, d)                                                                                   \
    QT_F16X8(d8_q4_1, block_q4_1, d)                                                                                   \
    QT_F16X8(m8_q4_1, block_q4_1, m)                                                                                   \
    QT_F16X8(d8_q5_0, block_q5_0, d)                                                                                   \
    QT_F16X8(d8_q5_1, block_q5_1, d)                                                                                   \
    QT_F16X8(m8_q5_1, block_q5_1, m)                                                                                   \
    QT_F16X8(d8_q8_0, block_q8_0, d)                                                                                   \
    QT_F16X8(d8_q8_1, block_q8_1, d)                                                                                   \
    QT_F16X8(s8_q8_1, block_q8_1, s)                                                                                   \
    QT_F16X8(d8_iq4_nl, block_iq4_nl, d)

/* dot_q4_0, dot_q4_1, dot_q5_0, dot_q5_1, dot_q8_0, dot_iq4_nl (qt_vec_dot_fn)
 * from the including file's integer cores qd_<format>(x, y) (8 int32 lane
 * sums of one block) and QT_LEGACY_SCALES()'s gathers. */
#define QT_LEGACY_DOTS()                                                                                               \
    QT_LEGACY_DOT(sum_q4_0, block_q4_0, block_q8_0, qd_q4_0, d8_q4_0, d8_q8_0, QT_XD1_D)                               \
    QT_LEGACY_DOT(sum_q4_1, block_q4_1, block_q8_1, qd_q4_1, d8_q4_1, d8_q8_1, QT_XD1_D)                               \
    QT_LEGACY_DOT(sum_q5_0, block_q5_0, block_q8_0, qd_q5_0, d8_q5_0, d8_q8_0, QT_XD1_D)                               \
    QT_LEGACY_DOT(sum_q5_1, block_q5_1, block_q8_1, qd_q5_1, d8_q5_1, d8_q8_1, QT_XD1_D)                               \
    QT_LEGACY_DOT(sum_q8_0, block_q8_0, block_q8_0, qd_q8_0, d8_q8_0, d8_q8_0, QT_XD1_D)                               \
    QT_LEGACY_DOT(sum_iq4_nl, block_iq4_nl, block_q8_0, qd_iq4_nl, d8_iq4_nl, d8_q8_0, QT_XD1_D)                       \
    QT_MIN_TERM(min_q4_1, block_q4_1, m8_q4_1, s8_q8_1, m)                                                             \
    QT_MIN_TERM(min_q5_1, block_q5_1, m8_q5_1, s8_q8_1, m)                                                             \
    static void dot_q4_0(int n, float *s, const void *w, const void *a) { *s = sum_q4_0(n, w, a); }                    \
    static void dot_q4_1(int n, float *s, const void *w, const void *a) {                                              \
        *s = sum_q4_1(n, w, a) + min_q4_1(n, w, a);                                                                    \
    }                                                                                                                  \
    static void dot_q5_0(int n, float *s, const void *w, const void *a) { *s = sum_q5_0(n, w, a); }                    \
    static void dot_q5_1(int n, float *s, const void *w, const void *a) {                                              \
        *s = sum_q5_1(n, w, a) + min_q5_1(n, w, a);                                                                    \
    }                                                                                                                  \
    static void dot_q8_0(int n, float *s, const void *w, const void *a) { *s = sum_q8_0(n, w, a); }                    \
    static void dot_iq4_nl(int n, float *s, const void *w, const void *a) { *s = sum_iq4_nl(n, w, a); }

#endif
