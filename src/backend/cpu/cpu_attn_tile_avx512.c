/* The CPU attention on AVX-512 (cpu_attn.h): a block of query rows (tokens
 * x the query heads of one KV head) against the cache, tile by tile of keys,
 * as small matrix products with an online softmax.
 *
 * The per-(token, KV head) loops this replaced computed each score as a dot
 * product ending in a horizontal sum and converted every cache row again for
 * every query token: 10-17 GMAC/s per core against ~83 for the core's FMAs.
 * Two layouts, one arithmetic:
 * - rows in lanes (prompt blocks of 24-48 rows, 2-3 zmm): Q is transposed
 *   once per block (qt[i][row], times the scale) and each key tile
 *   converted to f32 once per block (kf[key][i]; int8 rows times their
 *   scale); scores for 8 keys at a time over i, qt[i] times a broadcast
 *   kf[key][i] into 8 x NR accumulators; the softmax's max, exp and sums
 *   across a tile's keys are vertical too;
 * - keys in lanes (fewer rows: decode, drafts): the key tile transposed
 *   (kt[i][key], 16 x 16 in registers), scores of 1-4 rows x 16-64 keys over
 *   i, a broadcast q value times kt[i]; value rows read from the cache.
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
static inline __attribute__((always_inline)) void transpose16(__m512 r[16]) {
    __m512 t[16];
#pragma GCC unroll 16
    for (int i = 0; i < 16; i += 2) {
        t[i] = _mm512_unpacklo_ps(r[i], r[i + 1]);
        t[i + 1] = _mm512_unpackhi_ps(r[i], r[i + 1]);
    }
#pragma GCC unroll 16
    for (int i = 0; i < 16; i += 4) {
        r[i] = _mm512_castpd_ps(_mm512_unpacklo_pd(_mm512_castps_pd(t[i]), _mm512_castps_pd(t[i + 2])));
        r[i + 1] = _mm512_castpd_ps(_mm512_unpackhi_pd(_mm512_castps_pd(t[i]), _mm512_castps_pd(t[i + 2])));
        r[i + 2] = _mm512_castpd_ps(_mm512_unpacklo_pd(_mm512_castps_pd(t[i + 1]), _mm512_castps_pd(t[i + 3])));
        r[i + 3] = _mm512_castpd_ps(_mm512_unpackhi_pd(_mm512_castps_pd(t[i + 1]), _mm512_castps_pd(t[i + 3])));
    }
    /* r[4a + c] now holds, in 128-bit lane j, column 4j + c of rows 4a..4a+3 */
#pragma GCC unroll 2
    for (int a = 0; a < 2; a++)
#pragma GCC unroll 4
        for (int c = 0; c < 4; c++) {
            t[8 * a + c] = _mm512_shuffle_f32x4(r[8 * a + c], r[8 * a + 4 + c], 0x88);
            t[8 * a + 4 + c] = _mm512_shuffle_f32x4(r[8 * a + c], r[8 * a + 4 + c], 0xdd);
        }
#pragma GCC unroll 8
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
#pragma GCC unroll 16
            for (int j = 0; j < 16; j++)
                x[j] = r0 + j < R ? _mm512_mul_ps(sc, _mm512_loadu_ps(q_row(b, r0 + j) + i0)) : _mm512_setzero_ps();
            transpose16(x);
#pragma GCC unroll 16
            for (int j = 0; j < 16; j++) _mm512_storeu_ps(qt + (size_t)(i0 + j) * nl + r0, x[j]);
        }
}

/* One KV head's rows of the keys or the values: row p at base + p *
 * stride elements (f16 or int8; int8 rows times scale[p * sstride]). */
typedef struct {
    const char *base;
    size_t stride, esz;
    const float *scale; /* int8: this head's first scale; NULL for f16 */
    size_t sstride;
    int n_ctx;
} head_rows;

static head_rows head_rows_of(const st_kv_layer *kv, int is_v, int hkv) {
    const int f16 = kv->type == ST_KV_F16;
    const size_t esz = f16 ? 2 : 1, row = (size_t)kv->n_head_kv * kv->head_dim;
    return (head_rows){(const char *)(is_v ? kv->v : kv->k) + (size_t)hkv * kv->head_dim * esz,
                       row,
                       esz,
                       f16 ? NULL : (is_v ? kv->v_scale : kv->k_scale) + hkv,
                       (size_t)kv->n_head_kv,
                       kv->n_ctx};
}

static inline const char *row_ptr(const head_rows *h, int p) { return h->base + (size_t)p * h->stride * h->esz; }

/* 16 f32 values at r (a row pointer) + i0: f16 converted, int8 times f. */
static inline __attribute__((always_inline)) __m512 row_chunk(const head_rows *h, const char *r, __m512 f, int i0) {
    if (!h->scale) return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(r + 2 * (size_t)i0)));
    return _mm512_mul_ps(f, _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(r + i0)))));
}

static inline __m512 row_scale(const head_rows *h, int p) {
    return h->scale ? _mm512_set1_ps(h->scale[(size_t)p * h->sstride]) : _mm512_setzero_ps();
}

/* A head's rows are hd values every n_head_kv * hd: short strided reads
 * that the hardware prefetcher follows late, so each row read asks for the
 * same row of the next tile. Always inlined: GCC 12 finds a function that
 * only prefetches pure and drops its calls. */
static inline __attribute__((always_inline)) void prefetch_row(const head_rows *h, int hd, int p) {
    if (p >= h->n_ctx) return;
    const char *r = row_ptr(h, p);
    for (size_t o = 0; o < (size_t)hd * h->esz; o += 64) __builtin_prefetch(r + o, 0, 3);
}

/* dst[k][0..hd) = row p0 + k for k < n, zeros for n <= k < n8. */
static void load_rows(const head_rows *h, int hd, int p0, int n, int n8, int tk, float *dst) {
    for (int k = 0; k < n; k++) {
        prefetch_row(h, hd, p0 + k + tk);
        const char *r = row_ptr(h, p0 + k);
        const __m512 f = row_scale(h, p0 + k);
        float *d = dst + (size_t)k * hd;
        if (h->scale) /* the same loop twice: in each, row_chunk knows the cache type */
            for (int i = 0; i < hd; i += 16) _mm512_storeu_ps(d + i, row_chunk(h, r, f, i));
        else
            for (int i = 0; i < hd; i += 16) _mm512_storeu_ps(d + i, row_chunk(h, r, f, i));
    }
    for (int k = n; k < n8; k++)
        for (int i = 0; i < hd; i += 16) _mm512_storeu_ps(dst + (size_t)k * hd + i, _mm512_setzero_ps());
}

/* kt[i][k] = the keys of rows p0 + k (k < n, zeros up to n16), transposed
 * 16 x 16 in registers; kt rows are tk floats. */
static void load_keys_t(const head_rows *h, int hd, int p0, int n, int n16, int tk, float *kt) {
    for (int c = 0; c < n16; c += 16) {
        const char *r[16];
        __m512 f[16];
        for (int j = 0; j < 16; j++) {
            const int k = c + j < n ? c + j : n - 1; /* rows past n: not read (live), zeros */
            if (c + j < n) prefetch_row(h, hd, p0 + k + tk);
            r[j] = row_ptr(h, p0 + k);
            f[j] = row_scale(h, p0 + k);
        }
        const __mmask16 live = c + 16 <= n ? 0xffff : (__mmask16)((1u << (n - c)) - 1);
        for (int i0 = 0; i0 < hd; i0 += 16) {
            __m512 x[16];
#pragma GCC unroll 16
            for (int j = 0; j < 16; j++) x[j] = (live >> j) & 1 ? row_chunk(h, r[j], f[j], i0) : _mm512_setzero_ps();
            transpose16(x);
#pragma GCC unroll 16
            for (int j = 0; j < 16; j++) _mm512_storeu_ps(kt + (size_t)(i0 + j) * tk + c, x[j]);
        }
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

/* s[r][c*16 ..] = scores of NJ (1..4) rows of qs (rows hd floats) against
 * NC x 16 keys of kt: per i, a broadcast q value times NC key vectors. */
static inline __attribute__((always_inline)) void scores_keys_blk(const float *qs, int hd, const float *kt, int tk,
                                                                  int NJ, int NC, float *s) {
    __m512 a[RB][4];
#pragma GCC unroll 8
    for (int j = 0; j < NJ; j++)
#pragma GCC unroll 8
        for (int c = 0; c < NC; c++) a[j][c] = _mm512_setzero_ps();
    for (int i = 0; i < hd; i++) {
        __m512 k[4];
#pragma GCC unroll 8
        for (int c = 0; c < NC; c++) k[c] = _mm512_loadu_ps(kt + (size_t)i * tk + 16 * c);
#pragma GCC unroll 8
        for (int j = 0; j < NJ; j++) {
            const __m512 q = _mm512_set1_ps(qs[(size_t)j * hd + i]);
#pragma GCC unroll 8
            for (int c = 0; c < NC; c++) a[j][c] = _mm512_fmadd_ps(q, k[c], a[j][c]);
        }
    }
#pragma GCC unroll 8
    for (int j = 0; j < NJ; j++)
#pragma GCC unroll 8
        for (int c = 0; c < NC; c++) _mm512_storeu_ps(s + (size_t)j * tk + 16 * c, a[j][c]);
}

/* o[r][d0 .. d0 + 16*DB) of NJ (1..4) rows: o * alpha, then + p[k][r] *
 * v_k key by key (p[k][r] at p + k*ks + r*js); NJ x DB zmm accumulators.
 * v_k: row k of vf, or with h, cache row p0 + k read directly (a block of
 * a few rows converts each row chunk once either way; pf: also ask for
 * the row of the next tile). */
static inline __attribute__((always_inline)) void values_blk(const float *p, size_t ks, size_t js, int NJ, int DB,
                                                             const float *vf, const head_rows *h, int p0, int tk,
                                                             int pf, int hd, int d0, int nk, const float *alpha,
                                                             float *o) {
    __m512 a[RB][4];
#pragma GCC unroll 8
    for (int j = 0; j < NJ; j++) {
        const __m512 f = _mm512_set1_ps(alpha[j]);
#pragma GCC unroll 8
        for (int c = 0; c < DB; c++) a[j][c] = _mm512_mul_ps(f, _mm512_loadu_ps(o + (size_t)j * hd + d0 + 16 * c));
    }
    for (int k = 0; k < nk; k++) {
        __m512 v[4];
        if (h) {
            if (pf) prefetch_row(h, hd, p0 + k + tk);
            const char *r = row_ptr(h, p0 + k);
            const __m512 f = row_scale(h, p0 + k);
#pragma GCC unroll 8
            for (int c = 0; c < DB; c++) v[c] = row_chunk(h, r, f, d0 + 16 * c);
        } else {
#pragma GCC unroll 8
            for (int c = 0; c < DB; c++) v[c] = _mm512_loadu_ps(vf + (size_t)k * hd + d0 + 16 * c);
        }
#pragma GCC unroll 8
        for (int j = 0; j < NJ; j++) {
            const __m512 w = _mm512_set1_ps(p[k * ks + j * js]);
#pragma GCC unroll 8
            for (int c = 0; c < DB; c++) a[j][c] = _mm512_fmadd_ps(w, v[c], a[j][c]);
        }
    }
#pragma GCC unroll 8
    for (int j = 0; j < NJ; j++)
#pragma GCC unroll 8
        for (int c = 0; c < DB; c++) _mm512_storeu_ps(o + (size_t)j * hd + d0 + 16 * c, a[j][c]);
}

/* o = o * alpha + P V over the tile's nk keys, for rows 0..R, 4 at a time. */
static inline __attribute__((always_inline)) void values_tile(const float *p, size_t ks, size_t js, int R,
                                                              const float *vf, const head_rows *h, int p0, int tk,
                                                              int hd, int nk, const float *alpha, float *o) {
    for (int r = 0; r < R; r += RB)
        for (int d0 = 0; d0 < hd; d0 += 64) {
            const float *pr = p + r * js, *al = alpha + r;
            float *orow = o + (size_t)r * hd;
            const int pf = r == 0 && d0 == 0, nj = R - r < RB ? R - r : RB, db = hd - d0 >= 64 ? 4 : (hd - d0) / 16;
#define VB(NJ, DB) values_blk(pr, ks, js, NJ, DB, vf, h, p0, tk, pf, hd, d0, nk, al, orow)
            switch (4 * nj + db) {
            case 5: VB(1, 1); break;
            case 6: VB(1, 2); break;
            case 7: VB(1, 3); break;
            case 8: VB(1, 4); break;
            case 9: VB(2, 1); break;
            case 10: VB(2, 2); break;
            case 11: VB(2, 3); break;
            case 12: VB(2, 4); break;
            case 13: VB(3, 1); break;
            case 14: VB(3, 2); break;
            case 15: VB(3, 3); break;
            case 16: VB(3, 4); break;
            case 17: VB(4, 1); break;
            case 18: VB(4, 2); break;
            case 19: VB(4, 3); break;
            default: VB(4, 4); break;
            }
#undef VB
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

/* Rows in lanes, a block of CPU_ATTN_LANES_MIN-48 rows (NR zmm of rows). */
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
    const head_rows hk = head_rows_of(b->kv, 0, b->hkv), hv = head_rows_of(b->kv, 1, b->hkv);
    for (int p0 = st->p_start; p0 <= st->last; p0 += tk) {
        const int nk = st->last - p0 + 1 < tk ? st->last - p0 + 1 : tk, n8 = (nk + KB - 1) / KB * KB;
        load_rows(&hk, hd, p0, nk, n8, tk, kf);
        load_rows(&hv, hd, p0, nk, nk, tk, vf);
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
        values_tile(s, (size_t)nl, 1, Rp, vf, NULL, p0, tk, hd, nk, alpha, o);
    }
    for (int n = 0; n < NR; n++) _mm512_storeu_ps(st->l + 16 * n, l[n]);
}

/* Keys in lanes, a block of up to CPU_ATTN_ROWS rows (decode: the query
 * heads of one KV head). */
static void block_keys(const cpu_attn_block *b, rows_state *st, float *scratch) {
    const int hd = st->hd, tk = st->tk, R = st->R;
    float *qs = scratch, *o = qs + (size_t)hd * CPU_ATTN_ROWS, *kt = o + (size_t)hd * CPU_ATTN_ROWS;
    float *s = kt + 2 * (size_t)tk * hd, *alpha = s + (size_t)tk * CPU_ATTN_ROWS; /* no f32 value tile */
    const __m512 sc = _mm512_set1_ps(b->scale), ninf = _mm512_set1_ps(-INFINITY);
    for (int r = 0; r < R; r++)
        for (int i = 0; i < hd; i += 16) {
            _mm512_storeu_ps(qs + (size_t)r * hd + i, _mm512_mul_ps(sc, _mm512_loadu_ps(q_row(b, r) + i)));
            _mm512_storeu_ps(o + (size_t)r * hd + i, _mm512_setzero_ps());
        }
    const __m512i lane = _mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0);
    const head_rows hk = head_rows_of(b->kv, 0, b->hkv), hv = head_rows_of(b->kv, 1, b->hkv);
    for (int p0 = st->p_start; p0 <= st->last; p0 += tk) {
        const int nk = st->last - p0 + 1 < tk ? st->last - p0 + 1 : tk, NC = (nk + 15) / 16;
        load_keys_t(&hk, hd, p0, nk, 16 * NC, tk, kt);
        for (int r = 0; r < R; r += RB) {
            const float *q = qs + (size_t)r * hd;
            float *sr = s + (size_t)r * tk;
#define SK(NJ, NC) scores_keys_blk(q, hd, kt, tk, NJ, NC, sr)
            switch (4 * (R - r < RB ? R - r : RB) + NC) {
            case 5: SK(1, 1); break;
            case 6: SK(1, 2); break;
            case 7: SK(1, 3); break;
            case 8: SK(1, 4); break;
            case 9: SK(2, 1); break;
            case 10: SK(2, 2); break;
            case 11: SK(2, 3); break;
            case 12: SK(2, 4); break;
            case 13: SK(3, 1); break;
            case 14: SK(3, 2); break;
            case 15: SK(3, 3); break;
            case 16: SK(3, 4); break;
            case 17: SK(4, 1); break;
            case 18: SK(4, 2); break;
            case 19: SK(4, 3); break;
            default: SK(4, 4); break;
            }
#undef SK
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
        values_tile(s, 1, (size_t)tk, R, NULL, &hv, p0, tk, hd, nk, alpha, o);
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
