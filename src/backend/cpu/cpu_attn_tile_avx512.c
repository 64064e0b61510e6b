/* The CPU attention on AVX-512 (cpu_attn.h): a block of query rows (tokens
 * x the query heads of one KV head) against the cache, tile by tile of keys,
 * as small matrix products with an online softmax.
 *
 * The per-(token, KV head) loops this replaced computed each score as a dot
 * product ending in a horizontal sum and converted every cache row again for
 * every query token: ~10 GMAC/s per core against ~80 for the core's FMAs.
 * Two layouts, one arithmetic:
 * - rows in lanes (prompt blocks of 16-48 rows, 1-3 zmm): Q is transposed
 *   once per block (qt[i][row], times the scale) and each key tile
 *   converted to f32 once per block (kf[key][i]; int8 rows times their
 *   scale); scores for 8 keys at a time over i, qt[i] times a broadcast
 *   kf[key][i] into 8 x NR accumulators; the softmax's max, exp and sums
 *   across a tile's keys are vertical too;
 * - keys in lanes (decode, a few rows): the key tile transposed (kt[i][key],
 *   16 x 16 in registers), scores of 4 rows x 16-64 keys over i, a broadcast
 *   q value times kt[i].
 * Either way a score is one FMA chain over i = 0..hd-1, the softmax runs on
 * the same tiles of the absolute position grid (multiples of tile_keys),
 * per tile the row max m grows to m', the row's sum and output are scaled by
 * e^(m - m') and the weights are e^(s - m') (the polynomial exp), a tile's
 * weights are summed in one fixed order (16 lanes' sums, then a tree), and
 * P x V runs over 4 rows x 64 values of the output (16 zmm), a broadcast
 * weight times a value row chunk, key by key. So a row's result has the same
 * bits whichever layout, block or batch computes it: a verify pass of drafts
 * or a chunked prompt gives what one-token steps give.
 * Masks (causal, the sliding window, keys past the last) are applied to the
 * scores of the tiles that need them; a sink (gpt-oss) starts a row's max
 * at its logit and its sum at 1.
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

/* 16 f32 values i0..i0+15 of cache row p (keys, or values if is_v) of KV
 * head hkv: f16 converted, int8 times the row's scale. */
static inline __m512 cache_chunk(const st_kv_layer *kv, int is_v, int hkv, int p, int i0) {
    const size_t off = ((size_t)p * kv->n_head_kv + (size_t)hkv) * kv->head_dim + (size_t)i0;
    if (kv->type == ST_KV_F16)
        return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)((const uint16_t *)(is_v ? kv->v : kv->k) + off)));
    const float f = (is_v ? kv->v_scale : kv->k_scale)[(size_t)p * kv->n_head_kv + (size_t)hkv];
    const __m128i b = _mm_loadu_si128((const __m128i *)((const int8_t *)(is_v ? kv->v : kv->k) + off));
    return _mm512_mul_ps(_mm512_set1_ps(f), _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(b)));
}

/* A head's rows are hd values every n_head_kv * hd: short strided reads
 * that the hardware prefetcher follows late, so each row read asks for the
 * same row of the next tile. */
static inline void prefetch_row(const st_kv_layer *kv, int is_v, int hkv, int p) {
    if (p >= kv->n_ctx) return;
    const size_t esz = kv->type == ST_KV_F16 ? 2 : 1, hd = (size_t)kv->head_dim;
    const char *r = (const char *)(is_v ? kv->v : kv->k) + ((size_t)p * kv->n_head_kv + (size_t)hkv) * hd * esz;
    for (size_t o = 0; o < hd * esz; o += 64) __builtin_prefetch(r + o, 0, 3);
}

/* dst[k][0..hd) = cache row p0 + k for k < n, zeros for n <= k < n8. */
static void load_rows(const st_kv_layer *kv, int is_v, int hkv, int p0, int n, int n8, int tk, float *dst) {
    const int hd = kv->head_dim;
    for (int k = 0; k < n; k++) {
        prefetch_row(kv, is_v, hkv, p0 + k + tk);
        for (int i = 0; i < hd; i += 16)
            _mm512_storeu_ps(dst + (size_t)k * hd + i, cache_chunk(kv, is_v, hkv, p0 + k, i));
    }
    for (int k = n; k < n8; k++)
        for (int i = 0; i < hd; i += 16) _mm512_storeu_ps(dst + (size_t)k * hd + i, _mm512_setzero_ps());
}

/* kt[i][k] = the keys of rows p0 + k (k < n, zeros up to n16), transposed
 * 16 x 16 in registers; kt rows are tk floats. */
static void load_keys_t(const st_kv_layer *kv, int hkv, int p0, int n, int n16, int tk, float *kt) {
    const int hd = kv->head_dim;
    for (int k = 0; k < n; k++) prefetch_row(kv, 0, hkv, p0 + k + tk);
    for (int c = 0; c < n16; c += 16)
        for (int i0 = 0; i0 < hd; i0 += 16) {
            __m512 x[16];
            for (int j = 0; j < 16; j++)
                x[j] = c + j < n ? cache_chunk(kv, 0, hkv, p0 + c + j, i0) : _mm512_setzero_ps();
            transpose16(x);
            for (int j = 0; j < 16; j++) _mm512_storeu_ps(kt + (size_t)(i0 + j) * tk + c, x[j]);
        }
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

/* s[r][c*16 ..] = scores of RB rows of qs (rows hd floats) against NC x 16
 * keys of kt: per i, a broadcast q value times NC key vectors. */
static inline __attribute__((always_inline)) void scores_keys_blk(const float *qs, int hd, const float *kt, int tk,
                                                                  int NC, float *s) {
    __m512 a[RB][4];
#pragma GCC unroll 8
    for (int j = 0; j < RB; j++)
#pragma GCC unroll 8
        for (int c = 0; c < NC; c++) a[j][c] = _mm512_setzero_ps();
    for (int i = 0; i < hd; i++) {
        __m512 k[4];
#pragma GCC unroll 8
        for (int c = 0; c < NC; c++) k[c] = _mm512_loadu_ps(kt + (size_t)i * tk + 16 * c);
#pragma GCC unroll 8
        for (int j = 0; j < RB; j++) {
            const __m512 q = _mm512_set1_ps(qs[(size_t)j * hd + i]);
#pragma GCC unroll 8
            for (int c = 0; c < NC; c++) a[j][c] = _mm512_fmadd_ps(q, k[c], a[j][c]);
        }
    }
#pragma GCC unroll 8
    for (int j = 0; j < RB; j++)
#pragma GCC unroll 8
        for (int c = 0; c < NC; c++) _mm512_storeu_ps(s + (size_t)j * tk + 16 * c, a[j][c]);
}

/* o[r][d0 .. d0 + 16*DB) of RB rows: o * alpha, then + p[k][r] * vf[k] key
 * by key (p[k][r] at p + k*ks + r*js); RB x DB zmm accumulators. */
static inline __attribute__((always_inline)) void values_blk(const float *p, size_t ks, size_t js, int DB,
                                                             const float *vf, int hd, int d0, int nk,
                                                             const float *alpha, float *o) {
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
            const __m512 w = _mm512_set1_ps(p[k * ks + j * js]);
#pragma GCC unroll 8
            for (int c = 0; c < DB; c++) a[j][c] = _mm512_fmadd_ps(w, v[c], a[j][c]);
        }
    }
#pragma GCC unroll 8
    for (int j = 0; j < RB; j++)
#pragma GCC unroll 8
        for (int c = 0; c < DB; c++) _mm512_storeu_ps(o + (size_t)j * hd + d0 + 16 * c, a[j][c]);
}

/* o = o * alpha + P V over the tile's nk keys, for rows 0..Rp (a multiple of RB). */
static void values_tile(const float *p, size_t ks, size_t js, int Rp, const float *vf, int hd, int nk,
                        const float *alpha, float *o) {
    for (int r = 0; r < Rp; r += RB)
        for (int d0 = 0; d0 < hd; d0 += 64) {
            const float *pr = p + r * js;
            float *orow = o + (size_t)r * hd;
            switch (hd - d0 >= 64 ? 4 : (hd - d0) / 16) {
            case 1: values_blk(pr, ks, js, 1, vf, hd, d0, nk, alpha + r, orow); break;
            case 2: values_blk(pr, ks, js, 2, vf, hd, d0, nk, alpha + r, orow); break;
            case 3: values_blk(pr, ks, js, 3, vf, hd, d0, nk, alpha + r, orow); break;
            default: values_blk(pr, ks, js, 4, vf, hd, d0, nk, alpha + r, orow); break;
            }
        }
}

/* The rows of a block and their softmax state. Row r = t * n_g + g sees
 * keys first[r] .. to[r]; rows past R see none. */
typedef struct {
    int R, Rp, hd, tk;
    int p_start, last; /* the tiles: from p_start (a multiple of tk) to last */
    int first[CPU_ATTN_ROWS], to[CPU_ATTN_ROWS];
    float m[CPU_ATTN_ROWS], l[CPU_ATTN_ROWS]; /* running max and sum */
} rows_state;

static void rows_init(const cpu_attn_block *b, rows_state *st) {
    const int w = b->window;
    st->R = b->n_t * b->n_g;
    st->Rp = (st->R + RB - 1) / RB * RB;
    st->hd = b->kv->head_dim;
    st->tk = tile_keys(st->hd);
    st->last = b->pos + b->n_t - 1;
    st->p_start = (w > 0 && b->pos - w + 1 > 0 ? b->pos - w + 1 : 0) / st->tk * st->tk;
    for (int r = 0; r < CPU_ATTN_ROWS; r++) {
        const int pt = b->pos + r / b->n_g, in = r < st->R;
        const float sink = in && b->sinks ? b->sinks[r % b->n_g] : -INFINITY;
        st->first[r] = !in ? INT_MAX : w > 0 && pt - w + 1 > 0 ? pt - w + 1 : 0;
        st->to[r] = in ? pt : -1;
        st->m[r] = sink; /* a sink is one more logit, with no value */
        st->l[r] = sink > -INFINITY ? 1.0f : 0.0f;
    }
}

/* A row that has seen nothing yet keeps max -inf: subtract 0 then, so that
 * e^(-inf) is 0, not NaN. */
static inline __m512 safe_max(__m512 mn) {
    return _mm512_mask_mov_ps(mn, _mm512_cmp_ps_mask(mn, _mm512_set1_ps(-INFINITY), _CMP_EQ_OQ), _mm512_setzero_ps());
}

/* Rows in lanes: the sum over a tile's keys k < n8 of p[k] (lanes = rows),
 * in the order of keys_tile_sum: u[j] = p[j] + p[16 + j] + ..., then the
 * tree (j, j+8), (j, j+4), (j, j+2), (j, j+1). */
static inline __m512 lanes_tile_sum(const float *p, int nl, int n8) {
    __m512 u[16];
#pragma GCC unroll 16
    for (int j = 0; j < 16; j++) u[j] = j < n8 ? _mm512_loadu_ps(p + (size_t)j * nl) : _mm512_setzero_ps();
    for (int c = 16; c < n8; c += 16)
#pragma GCC unroll 16
        for (int j = 0; j < 16; j++)
            if (c + j < n8) u[j] = _mm512_add_ps(u[j], _mm512_loadu_ps(p + (size_t)(c + j) * nl));
#pragma GCC unroll 8
    for (int j = 0; j < 8; j++) u[j] = _mm512_add_ps(u[j], u[j + 8]);
#pragma GCC unroll 4
    for (int j = 0; j < 4; j++) u[j] = _mm512_add_ps(u[j], u[j + 4]);
    u[0] = _mm512_add_ps(u[0], u[2]);
    u[1] = _mm512_add_ps(u[1], u[3]);
    return _mm512_add_ps(u[0], u[1]);
}

/* Keys in lanes: the same sum of u (lane j = p[j] + p[16 + j] + ...). */
static inline float keys_tile_sum(__m512 u) {
    u = _mm512_add_ps(u,
                      _mm512_permutexvar_ps(_mm512_set_epi32(7, 6, 5, 4, 3, 2, 1, 0, 15, 14, 13, 12, 11, 10, 9, 8), u));
    u = _mm512_add_ps(u,
                      _mm512_permutexvar_ps(_mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 3, 2, 1, 0, 7, 6, 5, 4), u));
    u = _mm512_add_ps(u,
                      _mm512_permutexvar_ps(_mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 1, 0, 3, 2), u));
    u = _mm512_add_ps(u,
                      _mm512_permutexvar_ps(_mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 0, 1), u));
    return _mm512_cvtss_f32(u);
}

/* Rows in lanes, a block of 16-48 rows (NR = 1-3 zmm of rows). */
static void block_lanes(const cpu_attn_block *b, rows_state *st, float *scratch) {
    const int hd = st->hd, tk = st->tk, R = st->R, NR = (R + 15) / 16, nl = 16 * NR, Rp = st->Rp;
    float *qt = scratch, *o = qt + (size_t)hd * CPU_ATTN_ROWS, *kf = o + (size_t)hd * CPU_ATTN_ROWS;
    float *vf = kf + (size_t)tk * hd, *s = vf + (size_t)tk * hd, *alpha = s + (size_t)tk * CPU_ATTN_ROWS;
    /* a tile inside [first of the last token, position of the first] needs no mask */
    const int all_from = st->first[R - 1], all_to = b->pos;
    __m512i first_v[3], to_v[3];
    __m512 m[3], l[3];
    for (int n = 0; n < NR; n++) {
        first_v[n] = _mm512_loadu_si512(st->first + 16 * n);
        to_v[n] = _mm512_loadu_si512(st->to + 16 * n);
        m[n] = _mm512_loadu_ps(st->m + 16 * n);
        l[n] = _mm512_loadu_ps(st->l + 16 * n);
    }
    load_queries(b, R, nl, qt);
    for (int r = 0; r < Rp; r++)
        for (int i = 0; i < hd; i += 16) _mm512_storeu_ps(o + (size_t)r * hd + i, _mm512_setzero_ps());

    const __m512 ninf = _mm512_set1_ps(-INFINITY);
    for (int p0 = st->p_start; p0 <= st->last; p0 += tk) {
        const int nk = st->last - p0 + 1 < tk ? st->last - p0 + 1 : tk, n8 = (nk + KB - 1) / KB * KB;
        load_rows(b->kv, 0, b->hkv, p0, nk, n8, tk, kf);
        load_rows(b->kv, 1, b->hkv, p0, nk, nk, tk, vf);
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
                        _mm512_cmple_epi32_mask(first_v[n], pk) & _mm512_cmple_epi32_mask(pk, to_v[n]);
                    x = _mm512_mask_mov_ps(ninf, vis, x);
                    _mm512_storeu_ps(sk, x);
                }
                mt = _mm512_max_ps(mt, x);
            }
            const __m512 mn = _mm512_max_ps(m[n], mt), ms = safe_max(mn);
            const __m512 a = exp_avx512(_mm512_sub_ps(m[n], ms));
            for (int k = 0; k < n8; k++) {
                float *sk = s + (size_t)k * nl + 16 * n;
                _mm512_storeu_ps(sk, exp_avx512(_mm512_sub_ps(_mm512_loadu_ps(sk), ms)));
            }
            l[n] = _mm512_fmadd_ps(l[n], a, lanes_tile_sum(s + 16 * n, nl, n8));
            m[n] = mn;
            _mm512_storeu_ps(alpha + 16 * n, a);
        }
        values_tile(s, (size_t)nl, 1, Rp, vf, hd, nk, alpha, o);
    }
    for (int n = 0; n < NR; n++) _mm512_storeu_ps(st->l + 16 * n, l[n]);
}

/* Keys in lanes, a block of up to CPU_ATTN_ROWS rows (decode: the query
 * heads of one KV head). */
static void block_keys(const cpu_attn_block *b, rows_state *st, float *scratch) {
    const int hd = st->hd, tk = st->tk, R = st->R, Rp = st->Rp;
    float *qs = scratch, *o = qs + (size_t)hd * CPU_ATTN_ROWS, *kt = o + (size_t)hd * CPU_ATTN_ROWS;
    float *vf = kt + (size_t)tk * hd, *s = vf + (size_t)tk * hd, *alpha = s + (size_t)tk * CPU_ATTN_ROWS;
    const __m512 sc = _mm512_set1_ps(b->scale), ninf = _mm512_set1_ps(-INFINITY);
    for (int r = 0; r < Rp; r++)
        for (int i = 0; i < hd; i += 16) {
            _mm512_storeu_ps(qs + (size_t)r * hd + i,
                             r < R ? _mm512_mul_ps(sc, _mm512_loadu_ps(q_row(b, r) + i)) : _mm512_setzero_ps());
            _mm512_storeu_ps(o + (size_t)r * hd + i, _mm512_setzero_ps());
        }
    for (int r = R; r < Rp; r++) alpha[r] = 1.0f; /* rows past R: zero queries, scores 0, never stored */
    const __m512i lane = _mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0);
    for (int p0 = st->p_start; p0 <= st->last; p0 += tk) {
        const int nk = st->last - p0 + 1 < tk ? st->last - p0 + 1 : tk, NC = (nk + 15) / 16;
        load_keys_t(b->kv, b->hkv, p0, nk, 16 * NC, tk, kt);
        load_rows(b->kv, 1, b->hkv, p0, nk, nk, tk, vf);
        for (int r = 0; r < Rp; r += RB) {
            const float *q = qs + (size_t)r * hd;
            float *sr = s + (size_t)r * tk;
            switch (NC) {
            case 1: scores_keys_blk(q, hd, kt, tk, 1, sr); break;
            case 2: scores_keys_blk(q, hd, kt, tk, 2, sr); break;
            case 3: scores_keys_blk(q, hd, kt, tk, 3, sr); break;
            default: scores_keys_blk(q, hd, kt, tk, 4, sr); break;
            }
        }
        for (int r = 0; r < R; r++) {
            float *sr = s + (size_t)r * tk;
            const __m512i f = _mm512_set1_epi32(st->first[r]), t = _mm512_set1_epi32(st->to[r]);
            __m512 x[4], mt = ninf;
            for (int c = 0; c < NC; c++) {
                const __m512i pk = _mm512_add_epi32(_mm512_set1_epi32(p0 + 16 * c), lane);
                const __mmask16 vis = _mm512_cmple_epi32_mask(f, pk) & _mm512_cmple_epi32_mask(pk, t);
                x[c] = _mm512_mask_mov_ps(ninf, vis, _mm512_loadu_ps(sr + 16 * c));
                mt = _mm512_max_ps(mt, x[c]);
            }
            const __m512 mn = _mm512_max_ps(_mm512_set1_ps(st->m[r]), _mm512_set1_ps(_mm512_reduce_max_ps(mt)));
            const __m512 ms = safe_max(mn), a = exp_avx512(_mm512_sub_ps(_mm512_set1_ps(st->m[r]), ms));
            __m512 u = _mm512_setzero_ps();
            for (int c = 0; c < NC; c++) {
                const __m512 e = exp_avx512(_mm512_sub_ps(x[c], ms));
                _mm512_storeu_ps(sr + 16 * c, e);
                u = c ? _mm512_add_ps(u, e) : e;
            }
            alpha[r] = _mm512_cvtss_f32(a);
            st->l[r] = fmaf(st->l[r], alpha[r], keys_tile_sum(u));
            st->m[r] = _mm512_cvtss_f32(mn);
        }
        values_tile(s, 1, (size_t)tk, Rp, vf, hd, nk, alpha, o);
    }
}

void cpu_attn_block_avx512(const cpu_attn_block *b, float *scratch) {
    rows_state st;
    rows_init(b, &st);
    if (st.R >= CPU_ATTN_LANES_MIN) block_lanes(b, &st, scratch);
    else block_keys(b, &st, scratch);
    const float *o = scratch + (size_t)st.hd * CPU_ATTN_ROWS;
    for (int r = 0; r < st.R; r++) {
        float *dst = b->out + (size_t)(r / b->n_g) * b->ld + (size_t)(r % b->n_g) * st.hd;
        const __m512 f = _mm512_set1_ps(1.0f / st.l[r]);
        for (int i = 0; i < st.hd; i += 16)
            _mm512_storeu_ps(dst + i, _mm512_mul_ps(f, _mm512_loadu_ps(o + (size_t)r * st.hd + i)));
    }
}
