/* The prompt path of the CPU attention on AVX-512 (cpu_attn.h): a block of
 * up to CPU_ATTN_ROWS query rows (tokens x the query heads of one KV head)
 * against the cache, tile by tile of keys, as small matrix products.
 *
 * The per-(token, KV head) loops it replaces computed each score as a dot
 * product ending in a horizontal sum and converted every cache row again for
 * every query token: ~10 GMAC/s per core against ~80 for the core's FMAs.
 * Here the rows sit in the lanes of 1-3 zmm:
 * - Q is transposed once per block (qt[i][row], times the scale), and each
 *   tile of keys is converted to f32 once per block (kf[key][i], vf[key][i];
 *   int8 rows times their scale);
 * - scores: for 8 keys at a time, over i, qt[i] times a broadcast kf[key][i]
 *   into 8 x NR accumulators: vertical FMAs, no horizontal sum;
 * - softmax online per row (the flash-attention recurrence), and since the
 *   rows are lanes its max, exp and sum are vertical too: per tile the row
 *   max m grows to m', the row's sum and output are scaled by e^(m - m'),
 *   and the tile's weights are e^(s - m') (the polynomial exp);
 * - P x V: 4 rows x 64 values of the output (16 zmm) over the tile's keys,
 *   a broadcast weight times a vf row chunk: vertical FMAs.
 * Masks (causal, the sliding window, rows past the block, keys past the
 * last) are applied to the scores of the tiles that need them; a sink
 * (gpt-oss) starts a row's max at its logit and its sum at 1.
 */
#include "backend/cpu/cpu_attn.h"
#include "backend/cpu/cpu_exp_avx512.h"

#include <immintrin.h>
#include <limits.h>
#include <math.h>

#define KB 8 /* keys per score micro-tile: 8 x NR accumulators */
#define RB 4 /* output rows per P x V block */

/* Keys per tile: the f32 key and value tiles stay near L1 (2 x 32 KB at
 * hd <= 128), and the output's rescale (a load, multiply and store of every
 * output value per tile) stays a few percent of the P x V FMAs. */
static int tile_keys(int hd) { return hd <= 128 ? 64 : hd <= 256 ? 32 : 16; }

size_t cpu_attn_block_scratch(int hd) {
    const size_t tk = (size_t)tile_keys(hd), rows = CPU_ATTN_ROWS;
    /* qt [hd][rows], o [rows][hd], kf and vf [tk][hd], s [tk][rows], alpha [rows] */
    return 2 * (size_t)hd * rows + 2 * tk * (size_t)hd + tk * rows + rows;
}

/* 16 x 16 floats transposed in registers (unpack, then 128-bit lane shuffles). */
static inline void transpose16(__m512 r[16]) {
    __m512 t[16];
    for (int i = 0; i < 16; i += 2) {
        t[i] = _mm512_unpacklo_ps(r[i], r[i + 1]);
        t[i + 1] = _mm512_unpackhi_ps(r[i], r[i + 1]);
    }
    for (int i = 0; i < 16; i += 4) {
        r[i] = _mm512_castpd_ps(_mm512_unpacklo_pd(_mm512_castps_pd(t[i]), _mm512_castps_pd(t[i + 2])));
        r[i + 1] = _mm512_castpd_ps(_mm512_unpackhi_pd(_mm512_castps_pd(t[i]), _mm512_castps_pd(t[i + 2])));
        r[i + 2] = _mm512_castpd_ps(_mm512_unpacklo_pd(_mm512_castps_pd(t[i + 1]), _mm512_castps_pd(t[i + 3])));
        r[i + 3] = _mm512_castpd_ps(_mm512_unpackhi_pd(_mm512_castps_pd(t[i + 1]), _mm512_castps_pd(t[i + 3])));
    }
    /* r[4a + c] now holds, in 128-bit lane j, column 4j + c of rows 4a..4a+3 */
    for (int a = 0; a < 2; a++)
        for (int c = 0; c < 4; c++) {
            t[8 * a + c] = _mm512_shuffle_f32x4(r[8 * a + c], r[8 * a + 4 + c], 0x88);
            t[8 * a + 4 + c] = _mm512_shuffle_f32x4(r[8 * a + c], r[8 * a + 4 + c], 0xdd);
        }
    for (int c = 0; c < 8; c++) {
        r[c] = _mm512_shuffle_f32x4(t[c], t[8 + c], 0x88);
        r[8 + c] = _mm512_shuffle_f32x4(t[c], t[8 + c], 0xdd);
    }
}

static inline const float *q_row(const cpu_attn_block *b, int r) {
    return b->q + (size_t)(r / b->n_g) * b->ld + (size_t)(r % b->n_g) * b->kv->head_dim;
}

/* qt[i][r] = scale * q_r[i] for r < R, 0 for the lanes past R (nl lanes). */
static void load_queries(const cpu_attn_block *b, int R, int nl, float *qt) {
    const int hd = b->kv->head_dim;
    const __m512 sc = _mm512_set1_ps(b->scale);
    for (int r0 = 0; r0 < nl; r0 += 16)
        for (int i0 = 0; i0 < hd; i0 += 16) {
            __m512 x[16];
            for (int j = 0; j < 16; j++)
                x[j] = r0 + j < R ? _mm512_mul_ps(sc, _mm512_loadu_ps(q_row(b, r0 + j) + i0)) : _mm512_setzero_ps();
            transpose16(x);
            for (int j = 0; j < 16; j++) _mm512_storeu_ps(qt + (size_t)(i0 + j) * nl + r0, x[j]);
        }
}

/* dst[k][0..hd) = the f32 values of cache row p0 + k of this KV head for
 * k < n (int8: times the row's scale), zeros for n <= k < n8. Asks for the
 * same rows of the next tile (a head's rows are short strided reads). */
static void load_rows(const st_kv_layer *kv, int hkv, int is_v, int p0, int n, int n8, int tk, float *dst) {
    const int hd = kv->head_dim, nkv = kv->n_head_kv;
    const size_t row = (size_t)nkv * hd;
    for (int k = 0; k < n; k++) {
        const size_t p = (size_t)(p0 + k), off = p * row + (size_t)hkv * hd;
        float *d = dst + (size_t)k * hd;
        if (kv->type == ST_KV_F16) {
            const uint16_t *s = (const uint16_t *)(is_v ? kv->v : kv->k) + off;
            if (p0 + k + tk < kv->n_ctx)
                for (int i = 0; i < hd; i += 32) __builtin_prefetch(s + (size_t)tk * row + i, 0, 3);
            for (int i = 0; i < hd; i += 16)
                _mm512_storeu_ps(d + i, _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(s + i))));
        } else {
            const int8_t *s = (const int8_t *)(is_v ? kv->v : kv->k) + off;
            const __m512 f = _mm512_set1_ps((is_v ? kv->v_scale : kv->k_scale)[p * nkv + hkv]);
            if (p0 + k + tk < kv->n_ctx) __builtin_prefetch(s + (size_t)tk * row, 0, 3);
            for (int i = 0; i < hd; i += 16)
                _mm512_storeu_ps(
                    d + i,
                    _mm512_mul_ps(f, _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const void *)(s + i))))));
        }
    }
    for (int k = n; k < n8; k++)
        for (int i = 0; i < hd; i += 16) _mm512_storeu_ps(dst + (size_t)k * hd + i, _mm512_setzero_ps());
}

/* s[k][0..16*NR) = qt^T kf_k for KB keys: per i, NR row vectors times a
 * broadcast key value into KB x NR accumulators. */
static inline __attribute__((always_inline)) void scores_kb(const float *qt, int nl, int NR, int hd, const float *kf,
                                                            float *s) {
    __m512 a[KB][3];
#pragma GCC unroll 8
    for (int k = 0; k < KB; k++)
#pragma GCC unroll 8
        for (int n = 0; n < NR; n++) a[k][n] = _mm512_setzero_ps();
    for (int i = 0; i < hd; i++) {
        __m512 q[3];
#pragma GCC unroll 8
        for (int n = 0; n < NR; n++) q[n] = _mm512_loadu_ps(qt + (size_t)i * nl + 16 * n);
#pragma GCC unroll 8
        for (int k = 0; k < KB; k++) {
            const __m512 kv = _mm512_set1_ps(kf[(size_t)k * hd + i]);
#pragma GCC unroll 8
            for (int n = 0; n < NR; n++) a[k][n] = _mm512_fmadd_ps(q[n], kv, a[k][n]);
        }
    }
#pragma GCC unroll 8
    for (int k = 0; k < KB; k++)
#pragma GCC unroll 8
        for (int n = 0; n < NR; n++) _mm512_storeu_ps(s + (size_t)k * nl + 16 * n, a[k][n]);
}

static void scores_tile(const float *qt, int nl, int hd, const float *kf, int n8, float *s) {
    for (int k = 0; k < n8; k += KB) {
        const float *kk = kf + (size_t)k * hd;
        float *sk = s + (size_t)k * nl;
        switch (nl / 16) {
        case 1: scores_kb(qt, nl, 1, hd, kk, sk); break;
        case 2: scores_kb(qt, nl, 2, hd, kk, sk); break;
        default: scores_kb(qt, nl, 3, hd, kk, sk); break;
        }
    }
}

/* o[r][d0 .. d0 + 16*DB) for RB rows: o * alpha + sum over the tile's keys
 * of p[k][r] * vf[k]; RB x DB zmm accumulators. */
static inline __attribute__((always_inline)) void values_blk(const float *p, int nl, int DB, const float *vf, int hd,
                                                             int d0, int nk, const float *alpha, float *o) {
    __m512 a[RB][4];
#pragma GCC unroll 8
    for (int j = 0; j < RB; j++) {
        const __m512 f = _mm512_set1_ps(alpha[j]);
#pragma GCC unroll 8
        for (int c = 0; c < DB; c++) a[j][c] = _mm512_mul_ps(f, _mm512_loadu_ps(o + (size_t)j * hd + d0 + 16 * c));
    }
    for (int k = 0; k < nk; k++) {
        __m512 v[4];
#pragma GCC unroll 8
        for (int c = 0; c < DB; c++) v[c] = _mm512_loadu_ps(vf + (size_t)k * hd + d0 + 16 * c);
#pragma GCC unroll 8
        for (int j = 0; j < RB; j++) {
            const __m512 w = _mm512_set1_ps(p[(size_t)k * nl + j]);
#pragma GCC unroll 8
            for (int c = 0; c < DB; c++) a[j][c] = _mm512_fmadd_ps(w, v[c], a[j][c]);
        }
    }
#pragma GCC unroll 8
    for (int j = 0; j < RB; j++)
#pragma GCC unroll 8
        for (int c = 0; c < DB; c++) _mm512_storeu_ps(o + (size_t)j * hd + d0 + 16 * c, a[j][c]);
}

static void values_tile(const float *p, int nl, int R, const float *vf, int hd, int nk, const float *alpha, float *o) {
    for (int r = 0; r < R; r += RB)
        for (int d0 = 0; d0 < hd; d0 += 64) {
            const float *pr = p + r;
            float *orow = o + (size_t)r * hd;
            switch (hd - d0 >= 64 ? 4 : (hd - d0) / 16) {
            case 1: values_blk(pr, nl, 1, vf, hd, d0, nk, alpha + r, orow); break;
            case 2: values_blk(pr, nl, 2, vf, hd, d0, nk, alpha + r, orow); break;
            case 3: values_blk(pr, nl, 3, vf, hd, d0, nk, alpha + r, orow); break;
            default: values_blk(pr, nl, 4, vf, hd, d0, nk, alpha + r, orow); break;
            }
        }
}

void cpu_attn_block_avx512(const cpu_attn_block *b, float *scratch) {
    const st_kv_layer *kv = b->kv;
    const int hd = kv->head_dim, R = b->n_t * b->n_g, NR = (R + 15) / 16, nl = 16 * NR, tk = tile_keys(hd);
    const int Rp = (R + RB - 1) / RB * RB; /* <= nl: nl is a multiple of 16 */
    float *qt = scratch, *o = qt + (size_t)hd * CPU_ATTN_ROWS, *kf = o + (size_t)hd * CPU_ATTN_ROWS;
    float *vf = kf + (size_t)tk * hd, *s = vf + (size_t)tk * hd, *alpha = s + (size_t)tk * CPU_ATTN_ROWS;
    /* token t sees keys first_t .. pos + t: the block's keys run from the
     * first token's first to the last token's position; a tile inside
     * [first of the last token, position of the first] needs no mask */
    const int w = b->window, last = b->pos + b->n_t - 1;
    const int lo = w > 0 && b->pos - w + 1 > 0 ? b->pos - w + 1 : 0;
    const int all_from = w > 0 && last - w + 1 > 0 ? last - w + 1 : 0, all_to = b->pos;
    __m512i first_v[3], last_v[3];
    __m512 m[3], l[3];
    for (int n = 0; n < NR; n++) {
        int fi[16], la[16];
        float m0[16], l0[16];
        for (int j = 0; j < 16; j++) {
            const int r = 16 * n + j, t = r / b->n_g, pt = b->pos + t;
            const float sink = r < R && b->sinks ? b->sinks[r % b->n_g] : -INFINITY;
            fi[j] = r >= R ? INT_MAX : w > 0 && pt - w + 1 > 0 ? pt - w + 1 : 0; /* rows past R see nothing */
            la[j] = r >= R ? -1 : pt;
            m0[j] = sink; /* a sink is one more logit, with no value */
            l0[j] = sink > -INFINITY ? 1.0f : 0.0f;
        }
        first_v[n] = _mm512_loadu_si512(fi);
        last_v[n] = _mm512_loadu_si512(la);
        m[n] = _mm512_loadu_ps(m0);
        l[n] = _mm512_loadu_ps(l0);
    }
    load_queries(b, R, nl, qt);
    for (int r = 0; r < Rp; r++)
        for (int i = 0; i < hd; i += 16) _mm512_storeu_ps(o + (size_t)r * hd + i, _mm512_setzero_ps());

    const __m512 ninf = _mm512_set1_ps(-INFINITY), zero = _mm512_setzero_ps();
    for (int p0 = lo; p0 <= last; p0 += tk) {
        const int nk = last - p0 + 1 < tk ? last - p0 + 1 : tk, n8 = (nk + KB - 1) / KB * KB;
        load_rows(kv, b->hkv, 0, p0, nk, n8, tk, kf);
        load_rows(kv, b->hkv, 1, p0, nk, nk, tk, vf);
        scores_tile(qt, nl, hd, kf, n8, s);
        const int masked = p0 < all_from || p0 + n8 - 1 > all_to; /* lanes past R: zero queries, never stored */
        for (int n = 0; n < NR; n++) {
            __m512 mt = ninf;
            for (int k = 0; k < n8; k++) {
                float *sk = s + (size_t)k * nl + 16 * n;
                __m512 x = _mm512_loadu_ps(sk);
                if (masked) {
                    const __m512i pk = _mm512_set1_epi32(p0 + k);
                    const __mmask16 vis =
                        _mm512_cmple_epi32_mask(first_v[n], pk) & _mm512_cmple_epi32_mask(pk, last_v[n]);
                    x = _mm512_mask_mov_ps(ninf, vis, x);
                    _mm512_storeu_ps(sk, x);
                }
                mt = _mm512_max_ps(mt, x);
            }
            const __m512 mn = _mm512_max_ps(m[n], mt);
            /* a row that has seen nothing yet keeps max -inf: subtract 0 so that e^(-inf) is 0, not NaN */
            const __m512 ms = _mm512_mask_mov_ps(mn, _mm512_cmp_ps_mask(mn, ninf, _CMP_EQ_OQ), zero);
            const __m512 a = exp_avx512(_mm512_sub_ps(m[n], ms));
            __m512 sum = zero;
            for (int k = 0; k < n8; k++) {
                float *sk = s + (size_t)k * nl + 16 * n;
                const __m512 e = exp_avx512(_mm512_sub_ps(_mm512_loadu_ps(sk), ms));
                _mm512_storeu_ps(sk, e);
                sum = _mm512_add_ps(sum, e);
            }
            l[n] = _mm512_fmadd_ps(l[n], a, sum);
            m[n] = mn;
            _mm512_storeu_ps(alpha + 16 * n, a);
        }
        values_tile(s, nl, Rp, vf, hd, nk, alpha, o);
    }

    float inv[CPU_ATTN_ROWS];
    for (int n = 0; n < NR; n++) _mm512_storeu_ps(inv + 16 * n, _mm512_div_ps(_mm512_set1_ps(1.0f), l[n]));
    for (int r = 0; r < R; r++) {
        float *dst = b->out + (size_t)(r / b->n_g) * b->ld + (size_t)(r % b->n_g) * hd;
        const __m512 f = _mm512_set1_ps(inv[r]);
        for (int i = 0; i < hd; i += 16)
            _mm512_storeu_ps(dst + i, _mm512_mul_ps(f, _mm512_loadu_ps(o + (size_t)r * hd + i)));
    }
}
