/* AVX-512 inner loops of the CPU attention over an f16 cache (cpu_attn.h):
 * the scores of a KV head's query heads against its cache rows, and the
 * weighted sum of its value rows.
 *
 * What the AVX2 loops they replace lost time on (bench_attn, one core):
 * - each cache row was converted once per query head of the group; here a
 *   16-value chunk is converted once and multiplied into every head of the
 *   group (up to 4 at a time);
 * - the value pass loaded and stored the accumulators for every position;
 *   here a head's accumulators (up to 64 values of up to 4 heads: 16 zmm)
 *   stay in registers over all positions, and the row chunk is converted
 *   once for the heads;
 * - a head's rows are hd values every n_head_kv * hd, short strided reads
 *   the hardware prefetcher follows late: each row asks for the row
 *   PF_ROWS positions ahead.
 */
#include "backend/cpu/cpu_attn.h"
#include "backend/cpu/cpu_exp_avx512.h"

#include <immintrin.h>
#include <math.h>

#define PF_ROWS 8 /* positions ahead to prefetch */

static inline void prefetch_row(const uint16_t *r, int hd) {
    for (int i = 0; i < hd; i += 32) __builtin_prefetch(r + i, 0, 3);
}

static inline __m512 load_f16(const uint16_t *p) { return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)p)); }

/* Scores of NG (1..4) heads over positions p0..p1. */
static inline __attribute__((always_inline)) void scores_ng(const float *q, int NG, int hd, const uint16_t *k,
                                                            size_t row, int p0, int p1, float scale, float *sc,
                                                            size_t nc) {
    for (int p = p0; p <= p1; p++) {
        const uint16_t *kr = k + (size_t)p * row;
        if (p + PF_ROWS <= p1) prefetch_row(kr + PF_ROWS * row, hd);
        __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
        for (int i = 0; i < hd; i += 16) {
            const __m512 kc = load_f16(kr + i);
            a0 = _mm512_fmadd_ps(_mm512_loadu_ps(q + i), kc, a0);
            if (NG > 1) a1 = _mm512_fmadd_ps(_mm512_loadu_ps(q + hd + i), kc, a1);
            if (NG > 2) a2 = _mm512_fmadd_ps(_mm512_loadu_ps(q + 2 * hd + i), kc, a2);
            if (NG > 3) a3 = _mm512_fmadd_ps(_mm512_loadu_ps(q + 3 * hd + i), kc, a3);
        }
        sc[p] = scale * _mm512_reduce_add_ps(a0);
        if (NG > 1) sc[nc + p] = scale * _mm512_reduce_add_ps(a1);
        if (NG > 2) sc[2 * nc + p] = scale * _mm512_reduce_add_ps(a2);
        if (NG > 3) sc[3 * nc + p] = scale * _mm512_reduce_add_ps(a3);
    }
}

void cpu_attn_scores_f16_avx512(const float *q, int G, int hd, const uint16_t *k, size_t row, int p0, int p1,
                                float scale, float *sc, size_t nc) {
    for (int g = 0; g < G; g += 4) {
        const float *qg = q + (size_t)g * hd;
        float *s = sc + (size_t)g * nc;
        switch (G - g < 4 ? G - g : 4) {
        case 1: scores_ng(qg, 1, hd, k, row, p0, p1, scale, s, nc); break;
        case 2: scores_ng(qg, 2, hd, k, row, p0, p1, scale, s, nc); break;
        case 3: scores_ng(qg, 3, hd, k, row, p0, p1, scale, s, nc); break;
        default: scores_ng(qg, 4, hd, k, row, p0, p1, scale, s, nc); break;
        }
    }
}

/* acc[g][d0 .. d0 + 16*ND) of NG heads over positions p0..p1, held in
 * NG*ND zmm registers (ND, NG <= 4). */
static inline __attribute__((always_inline)) void values_block(const float *w, size_t nc, int NG, int ND, int hd,
                                                               int d0, const uint16_t *v, size_t row, int p0, int p1,
                                                               float *acc) {
    __m512 a[4][4];
    for (int g = 0; g < NG; g++)
        for (int d = 0; d < ND; d++) a[g][d] = _mm512_setzero_ps();
    for (int p = p0; p <= p1; p++) {
        const uint16_t *vr = v + (size_t)p * row + d0;
        if (p + PF_ROWS <= p1) prefetch_row(vr + PF_ROWS * row, 16 * ND);
        __m512 vc[4];
        for (int d = 0; d < ND; d++) vc[d] = load_f16(vr + 16 * d);
        for (int g = 0; g < NG; g++) {
            const __m512 wg = _mm512_set1_ps(w[(size_t)g * nc + p]);
            for (int d = 0; d < ND; d++) a[g][d] = _mm512_fmadd_ps(wg, vc[d], a[g][d]);
        }
    }
    for (int g = 0; g < NG; g++)
        for (int d = 0; d < ND; d++) _mm512_storeu_ps(acc + (size_t)g * hd + d0 + 16 * d, a[g][d]);
}

void cpu_attn_values_f16_avx512(const float *w, size_t nc, int G, int hd, const uint16_t *v, size_t row, int p0, int p1,
                                float *acc) {
    for (int g = 0; g < G; g += 4) {
        const int ng = G - g < 4 ? G - g : 4;
        const float *wg = w + (size_t)g * nc;
        float *ag = acc + (size_t)g * hd;
        for (int d0 = 0; d0 < hd;) {
            if (hd - d0 >= 64) {
                switch (ng) {
                case 1: values_block(wg, nc, 1, 4, hd, d0, v, row, p0, p1, ag); break;
                case 2: values_block(wg, nc, 2, 4, hd, d0, v, row, p0, p1, ag); break;
                case 3: values_block(wg, nc, 3, 4, hd, d0, v, row, p0, p1, ag); break;
                default: values_block(wg, nc, 4, 4, hd, d0, v, row, p0, p1, ag); break;
                }
                d0 += 64;
            } else {
                switch (ng) {
                case 1: values_block(wg, nc, 1, 1, hd, d0, v, row, p0, p1, ag); break;
                case 2: values_block(wg, nc, 2, 1, hd, d0, v, row, p0, p1, ag); break;
                case 3: values_block(wg, nc, 3, 1, hd, d0, v, row, p0, p1, ag); break;
                default: values_block(wg, nc, 4, 1, hd, d0, v, row, p0, p1, ag); break;
                }
                d0 += 16;
            }
        }
    }
}

void cpu_attn_softmax_avx512(float *s, int n, float sink) {
    __m512 vm = _mm512_set1_ps(sink);
    int i = 0;
    for (; i + 16 <= n; i += 16) vm = _mm512_max_ps(vm, _mm512_loadu_ps(s + i));
    float mx = _mm512_reduce_max_ps(vm);
    for (; i < n; i++) mx = s[i] > mx ? s[i] : mx;
    const __m512 m = _mm512_set1_ps(mx);
    /* the sum in double, as the scalar loop did: thousands of terms */
    __m512d sd = _mm512_setzero_pd();
    double sum = sink > -INFINITY ? (double)_mm512_cvtss_f32(exp_avx512(_mm512_set1_ps(sink - mx))) : 0.0;
    for (i = 0; i + 16 <= n; i += 16) {
        const __m512 e = exp_avx512(_mm512_sub_ps(_mm512_loadu_ps(s + i), m));
        _mm512_storeu_ps(s + i, e);
        sd = _mm512_add_pd(sd, _mm512_cvtps_pd(_mm512_castps512_ps256(e)));
        sd = _mm512_add_pd(sd, _mm512_cvtps_pd(_mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(e), 1))));
    }
    if (i < n) { /* the tail through a mask: lanes past n read as -inf, give 0 */
        const __mmask16 k = (__mmask16)((1u << (n - i)) - 1);
        const __m512 e = exp_avx512(_mm512_sub_ps(_mm512_mask_loadu_ps(_mm512_set1_ps(-INFINITY), k, s + i), m));
        _mm512_mask_storeu_ps(s + i, k, e);
        sd = _mm512_add_pd(sd, _mm512_cvtps_pd(_mm512_castps512_ps256(e)));
        sd = _mm512_add_pd(sd, _mm512_cvtps_pd(_mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(e), 1))));
    }
    sum += _mm512_reduce_add_pd(sd);
    const __m512 inv = _mm512_set1_ps((float)(1.0 / sum));
    for (i = 0; i + 16 <= n; i += 16) _mm512_storeu_ps(s + i, _mm512_mul_ps(_mm512_loadu_ps(s + i), inv));
    for (; i < n; i++) s[i] *= _mm512_cvtss_f32(inv);
}
