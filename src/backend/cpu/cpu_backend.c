/* The CPU backend: fills the st_backend op table (backend/backend.h) with
 * kernels running on a thread pool. Matrix products go through cpu_ops
 * (quantized dot products, rows split over threads); the rest are light
 * elementwise and attention loops parallelised over rows or heads.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "backend/backend_compose.h"
#include "backend/cpu/cpu_act.h"
#include "backend/cpu/cpu_attn.h"
#include "backend/cpu/cpu_hybrid.h"
#include "backend/cpu/cpu_mla.h"
#include "backend/cpu/cpu_ops.h"
#include "core/alloc.h"
#include "core/fp16.h"
#include "core/log.h"
#include "core/switches.h"
#include "core/threadpool.h"
#include "quant/quant.h"

typedef struct {
    int pos0, n_tok, head_dim;
    float theta, freq_scale;
    const float *freq_div;
    float *cs; /* [n_tok][head_dim/2][2] */
    size_t cap;
} rope_cache;

typedef struct {
    st_pool *pool;
    int n_threads;
    cpu_scratch act;   /* quantized activations of matmul */
    cpu_scratch moe;   /* MoE routing and per-expert buffers */
    cpu_scratch moeq;  /* MoE quantized activations */
    cpu_scratch route; /* moe_ffn's routing (sel, wsel) */
    cpu_scratch moep;  /* routing probabilities of one token */
    int precise;       /* f32 activations in matrix products (STRATA_PRECISE=1) */
    int expert_tasks;  /* decode experts one per task: -1 auto, 0 never, 1 always (STRATA_CPU_EXPERT_TASKS) */
    cpu_scratch rows;  /* precise mode: one dequantized weight row per thread */
    cpu_scratch gath;  /* precise mode: an expert's gathered input rows */
    cpu_scratch attn;  /* attention scores and accumulators, per thread */
    cpu_scratch gdn;   /* gated DeltaNet's per-chunk buffers */
    /* rope angles (cos, sin per pair and position) of the last two (positions,
     * theta, scale, head size) seen: every layer of a step rotates the same
     * positions, and Gemma alternates two bases */
    rope_cache rope[2];
    int rope_next;
} cpu_ctx;

static cpu_ctx *CTX(st_backend *be) { return (cpu_ctx *)be->ctx; }

static void *cpu_alloc(st_backend *be, size_t bytes) {
    (void)be;
    return st_malloc(bytes);
}

static void cpu_free(st_backend *be, void *p) {
    (void)be;
    st_free(p);
}

static void cpu_copy(st_backend *be, void *dst, const void *src, size_t bytes) {
    (void)be;
    if (dst != src) memcpy(dst, src, bytes);
}

static void cpu_get_rows(st_backend *be, const st_weight *w, const int32_t *ids, int n, float *out) {
    (void)be;
    for (int i = 0; i < n; i++) {
        ST_ASSERT(ids[i] >= 0 && ids[i] < w->n_out);
        qt_dequantize(w->type, (const uint8_t *)w->data + (size_t)ids[i] * w->row_bytes, out + (size_t)i * w->n_in,
                      w->n_in);
    }
}

/* Precise mode: each weight row is dequantized to f32 and dotted with the
 * f32 activations, instead of quantizing the activations to 8 bits. Slower
 * (the dequantization is paid per row and call), but it isolates the one
 * rounding that the integer path adds, for accuracy comparisons with f32
 * references such as transformers. */
typedef struct {
    const st_weight *w;
    const uint8_t *base;
    const float *x;
    float *y;
    int n_tok;
    float *rows; /* [thread][n_in] */
    qt_vec_dot_fn dot;
} precise_job;

static void precise_task(void *ctx, int64_t task, int thread) {
    precise_job *j = ctx;
    int64_t n = j->w->n_in;
    float *row = j->rows + (size_t)thread * (size_t)n;
    for (int64_t r = task * 16; r < (task + 1) * 16 && r < j->w->n_out; r++) {
        qt_dequantize(j->w->type, j->base + (size_t)r * j->w->row_bytes, row, n);
        for (int t = 0; t < j->n_tok; t++)
            j->dot((int)n, &j->y[(size_t)t * j->w->n_out + r], row, j->x + (size_t)t * n);
    }
}

static void matmul_precise(cpu_ctx *c, const st_weight *w, int64_t mat, const float *x, float *y, int n_tok) {
    precise_job j = {w, st_weight_mat(w, mat), x, y, n_tok, NULL, qt_vec_dot(QT_F32, qt_cpu_isa())};
    j.rows = cpu_scratch_reserve(&c->rows, (size_t)c->n_threads * (size_t)w->n_in * sizeof(float));
    st_pool_run(c->pool, (w->n_out + 15) / 16, precise_task, &j);
}

/* Matrix mat's row of w's bias (backend.h) added to each of n_tok rows of y. */
static void add_bias(const st_weight *w, int64_t mat, float *y, int n_tok) {
    if (!w->bias) return;
    const float *b = w->bias + (size_t)mat * (size_t)w->n_out;
    for (int t = 0; t < n_tok; t++)
        for (int64_t r = 0; r < w->n_out; r++) y[(size_t)t * w->n_out + r] += b[r];
}

static void cb_matmul(st_backend *be, const st_weight *w, int64_t mat, const float *x, float *y, int n_tok) {
    cpu_ctx *c = CTX(be);
    if (mat == ST_MAT_ALL) { /* per matrix through this function (cpu_mla.c) */
        cpu_matmul_all(be, w, x, y, n_tok);
        return;
    }
    if (c->precise) {
        matmul_precise(c, w, mat, x, y, n_tok);
    } else { /* types were checked at model load: a failure here is a bug */
        int rc = n_tok == 1 ? cpu_matvec(c->pool, &c->act, st_weight_mat(w, mat), w->row_bytes, w->type, w->n_out,
                                         w->n_in, x, y)
                            : cpu_matmul(c->pool, &c->act, st_weight_mat(w, mat), w->row_bytes, w->type, w->n_out,
                                         w->n_in, n_tok, x, y);
        ST_ASSERT(rc == 0);
    }
    add_bias(w, mat, y, n_tok);
}

/* One input, several weights (a layer's q, k, v): the input quantized once
 * per activation format and every product in one pool dispatch, where a
 * matmul per weight quantizes and dispatches for each. Each output is the
 * bits that weight's matmul gives (same quantization, same kernel). */
#define MULTI_MAX 8
static void cpu_matmul_multi(st_backend *be, int n, const st_weight *const *w, const float *x, float *const *y,
                             int n_tok) {
    cpu_ctx *c = CTX(be);
    if (c->precise || n > MULTI_MAX || n < 1) {
        backend_compose_matmul_multi(be, n, w, x, y, n_tok);
        return;
    }
    const int64_t K = w[0]->n_in;
    size_t at[MULTI_MAX], bytes = 0; /* each weight's activations: offset in the scratch, or SIZE_MAX for x */
    for (int i = 0; i < n; i++) {
        ST_ASSERT(w[i]->n_in == K);
        const qt_type vt = qt_get(w[i]->type)->vec_dot_type;
        at[i] = SIZE_MAX;
        if (vt == QT_F32) continue;
        for (int j = 0; j < i && at[i] == SIZE_MAX; j++)
            if (at[j] != SIZE_MAX && qt_get(w[j]->type)->vec_dot_type == vt) at[i] = at[j];
        if (at[i] == SIZE_MAX) {
            at[i] = bytes;
            bytes += (size_t)n_tok * qt_row_size(vt, K);
        }
    }
    uint8_t *q = bytes ? cpu_scratch_reserve(&c->act, bytes) : NULL;
    cpu_mm mm[MULTI_MAX];
    for (int i = 0; i < n; i++) {
        int first = 1; /* the first weight of its activation format quantizes */
        for (int j = 0; j < i; j++) first &= at[j] != at[i];
        if (at[i] != SIZE_MAX && first) ST_ASSERT(cpu_quantize_act(c->pool, w[i]->type, K, n_tok, x, q + at[i]) == 0);
        const void *xq = at[i] == SIZE_MAX ? (const void *)x : q + at[i];
        mm[i] = (cpu_mm){st_weight_mat(w[i], 0), w[i]->row_bytes, w[i]->type, w[i]->n_out, K, n_tok, xq, NULL, y[i], 0};
    }
    ST_ASSERT(cpu_matmul_q_batch(c->pool, mm, n) == 0);
    for (int i = 0; i < n; i++) add_bias(w[i], 0, y[i], n_tok);
}

typedef struct {
    float *x, *y;
    const float *res, *w;
    int dim, n_rows, rows_per_task;
    float eps;
} norm_job;

/* y = x / rms(x) * w: the sum of squares in double, in four chains (one
 * chain's add latency bound a prompt's norms: 7% of SmolLM2's pp512, on one
 * thread while the others waited). */
static void norm_row(const float *x, float *y, const float *w, int dim, float eps) {
    double ss[4] = {0, 0, 0, 0};
    int i = 0;
    for (; i + 4 <= dim; i += 4)
        for (int k = 0; k < 4; k++) ss[k] += (double)x[i + k] * x[i + k];
    for (; i < dim; i++) ss[0] += (double)x[i] * x[i];
    const float s = (float)(1.0 / sqrt((ss[0] + ss[1] + ss[2] + ss[3]) / dim + eps));
    for (i = 0; i < dim; i++) y[i] = x[i] * s * w[i];
}

/* Rows [task * rows_per_task, ...), the residual added first when given. */
static void norm_task(void *ctx, int64_t task, int thread) {
    (void)thread;
    const norm_job *j = ctx;
    const int r0 = (int)task * j->rows_per_task,
              r1 = r0 + j->rows_per_task < j->n_rows ? r0 + j->rows_per_task : j->n_rows;
    const int dim = j->dim;
    for (int r = r0; r < r1; r++) {
        float *xr = j->x + (size_t)r * dim;
        if (j->res)
            for (int i = 0; i < dim; i++) xr[i] += j->res[(size_t)r * dim + i];
        norm_row(xr, j->y + (size_t)r * dim, j->w, dim, j->eps);
    }
}

static void cpu_rmsnorm(st_backend *be, float *x, const float *res, const float *w, float *y, int dim, int n_rows,
                        float eps) {
    /* tasks of about 16k values: a decode step's row is one task, which
     * st_pool_run runs on the caller */
    const int rows = dim >= 16384 ? 1 : 16384 / dim;
    norm_job j = {x, y, res, w, dim, n_rows, rows, eps};
    st_pool_run(CTX(be)->pool, (n_rows + rows - 1) / rows, norm_task, &j);
}

/* cos and sin of every pair's angle at positions pos0.. (angles in double:
 * at tens of thousands of positions a float angle drifts visibly), from the
 * cache when a layer before asked for the same. */
static const float *rope_angles(cpu_ctx *c, int n_tok, int head_dim, int pos0, float theta, float freq_scale,
                                const float *freq_div) {
    for (int i = 0; i < 2; i++) {
        const rope_cache *r = &c->rope[i];
        if (r->cs && r->pos0 == pos0 && r->n_tok == n_tok && r->head_dim == head_dim && r->theta == theta &&
            r->freq_scale == freq_scale && r->freq_div == freq_div)
            return r->cs;
    }
    rope_cache *r = &c->rope[c->rope_next];
    c->rope_next ^= 1;
    const int half = head_dim / 2;
    const size_t need = (size_t)n_tok * half * 2;
    if (need > r->cap) {
        st_free(r->cs);
        r->cs = st_malloc(need * sizeof(float));
        r->cap = need;
    }
    for (int t = 0; t < n_tok; t++) {
        const double p = (double)(pos0 + t) * freq_scale;
        for (int i = 0; i < half; i++) {
            double a = p * pow((double)theta, -2.0 * i / head_dim);
            if (freq_div) a /= freq_div[i];
            r->cs[((size_t)t * half + i) * 2] = (float)cos(a);
            r->cs[((size_t)t * half + i) * 2 + 1] = (float)sin(a);
        }
    }
    r->pos0 = pos0, r->n_tok = n_tok, r->head_dim = head_dim, r->theta = theta, r->freq_scale = freq_scale;
    r->freq_div = freq_div;
    return r->cs;
}

/* The first head_dim values of one head v by a token's angles ct. */
static void rope_head(float *v, const float *ct, int head_dim, int neox) {
    const int half = head_dim / 2;
    for (int i = 0; i < half; i++) {
        int i0 = neox ? i : 2 * i, i1 = neox ? i + half : 2 * i + 1;
        float a = v[i0], b = v[i1], co = ct[2 * i], si = ct[2 * i + 1];
        v[i0] = a * co - b * si;
        v[i1] = a * si + b * co;
    }
}

/* Tokens [t0, t1) of x (n_heads heads of head_stride values per token, the
 * first head_dim of each rotated) by the angles cs (rope_angles). */
static void rope_rows(float *x, const float *cs, int t0, int t1, int n_heads, int head_dim, int head_stride, int neox) {
    for (int t = t0; t < t1; t++)
        for (int h = 0; h < n_heads; h++)
            rope_head(x + ((size_t)t * n_heads + h) * head_stride, cs + (size_t)t * (head_dim / 2) * 2, head_dim, neox);
}

/* int8 rows: one scale per head = absmax / 127 */
static void store_row_int8(const float *src, int8_t *dst, float *scale, int n_head, int hd) {
    for (int h = 0; h < n_head; h++) {
        const float *s = src + (size_t)h * hd;
        float amax = 0;
        for (int i = 0; i < hd; i++) amax = fmaxf(amax, fabsf(s[i]));
        float d = amax / 127.0f, id = d > 0 ? 1.0f / d : 0.0f;
        scale[h] = d;
        for (int i = 0; i < hd; i++) dst[(size_t)h * hd + i] = (int8_t)lrintf(s[i] * id);
    }
}

/* f32 -> f16 of n values, rounding to nearest even like st_f32_to_f16 (F16C
 * on AVX2 machines: the software conversion was 2.7% of a prompt's time). */
static void f16_row(uint16_t *d, const float *s, size_t n) {
    for (size_t i = 0; i < n; i++) d[i] = st_f32_to_f16(s[i]);
}
#if defined(__x86_64__)
#include <immintrin.h>
__attribute__((target("avx2,f16c"))) static void f16_row_avx2(uint16_t *d, const float *s, size_t n) {
    size_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm_storeu_si128((__m128i *)(d + i), _mm256_cvtps_ph(_mm256_loadu_ps(s + i), _MM_FROUND_TO_NEAREST_INT));
    for (; i < n; i++) d[i] = st_f32_to_f16(s[i]);
}
#endif
static void (*g_f16_row)(uint16_t *, const float *, size_t) = f16_row;

/* KV heads [h0, h0 + nh) of position p from kr and vr (head h0's values first). */
static void kv_store_heads(const st_kv_layer *kv, size_t p, int h0, int nh, const float *kr, const float *vr) {
    const size_t at = (p * kv->n_head_kv + (size_t)h0) * kv->head_dim, n = (size_t)nh * kv->head_dim;
    if (kv->type == ST_KV_F16) {
        g_f16_row((uint16_t *)kv->k + at, kr, n);
        g_f16_row((uint16_t *)kv->v + at, vr, n);
    } else {
        const size_t sc = p * kv->n_head_kv + (size_t)h0;
        store_row_int8(kr, (int8_t *)kv->k + at, kv->k_scale + sc, nh, kv->head_dim);
        store_row_int8(vr, (int8_t *)kv->v + at, kv->v_scale + sc, nh, kv->head_dim);
    }
}

static void kv_store_rows(st_backend *be, st_kv_layer *kv, const float *k, const float *v, int n_tok, int pos0) {
    (void)be;
    const size_t row = (size_t)kv->n_head_kv * kv->head_dim;
    for (int t = 0; t < n_tok; t++) kv_store_heads(kv, (size_t)(pos0 + t), 0, kv->n_head_kv, k + t * row, v + t * row);
}

typedef struct {
    st_backend *be;
    float *q, *k;
    const float *v, *cs;
    st_kv_layer *kv;
    int n_tok, n_head, nkv, nr, hd, neox, pos0, per_task;
} prep_job;

/* A few tokens: RoPE on their q and k heads, then their K and V rows into
 * the cache. */
static void prep_task(void *ctx, int64_t task, int thread) {
    (void)thread;
    const prep_job *j = ctx;
    const int t0 = (int)task * j->per_task, t1 = t0 + j->per_task < j->n_tok ? t0 + j->per_task : j->n_tok;
    rope_rows(j->q, j->cs, t0, t1, j->n_head, j->nr, j->hd, j->neox);
    rope_rows(j->k, j->cs, t0, t1, j->nkv, j->nr, j->hd, j->neox);
    const size_t row = (size_t)j->nkv * j->hd;
    kv_store_rows(j->be, j->kv, j->k + (size_t)t0 * row, j->v + (size_t)t0 * row, t1 - t0, j->pos0 + t0);
}

typedef struct {
    const prep_job *p;
    const float *qn, *kn;
    float eps;
} head_prep_job;

/* per_task heads of the few tokens' q heads and k heads (n_head + nkv a
 * token, q first): each normed and rotated; a k head stored in the cache
 * with its v head. */
static void head_prep_task(void *ctx, int64_t task, int thread) {
    (void)thread;
    const head_prep_job *hj = ctx;
    const prep_job *j = hj->p;
    const int per = j->n_head + j->nkv, hd = j->hd;
    const int64_t g1 = (int64_t)j->n_tok * per, g0 = task * j->per_task;
    for (int64_t g = g0; g < g0 + j->per_task && g < g1; g++) {
        const int t = (int)(g / per), h = (int)(g % per), kh = h - j->n_head;
        float *x = kh < 0 ? j->q + ((size_t)t * j->n_head + h) * hd : j->k + ((size_t)t * j->nkv + kh) * hd;
        const float *nw = kh < 0 ? hj->qn : hj->kn;
        if (nw) norm_row(x, x, nw, hd, hj->eps);
        rope_head(x, j->cs + (size_t)t * (j->nr / 2) * 2, j->nr, j->neox);
        if (kh >= 0) kv_store_heads(j->kv, (size_t)(j->pos0 + t), kh, 1, x, j->v + ((size_t)t * j->nkv + kh) * hd);
    }
}

/* Over the pool in blocks of tokens (on one thread, a prompt's RoPE and
 * cache stores were 5% of SmolLM2's pp512 while the others waited). A few
 * tokens (decode) go by heads instead, norms included, so that every
 * thread takes a few: on one thread the step read q and k row by row from
 * the cores whose products wrote them, 18.6 us a layer on the H200 host's
 * 16 cores for a few us of arithmetic. */
static void cpu_qkv_prep(st_backend *be, float *q, float *k, const float *v, const float *qn, const float *kn,
                         float eps, int n_tok, int n_head, const st_rope *r, st_kv_layer *kv, int pos0) {
    const int hd = kv->head_dim, nkv = kv->n_head_kv;
    const int nr = r->n_rot > 0 && r->n_rot < hd ? r->n_rot : hd;
    const float *cs = rope_angles(CTX(be), n_tok, nr, pos0, r->theta, r->freq_scale, r->freq_div);
    prep_job j = {be, q, k, v, cs, kv, n_tok, n_head, nkv, nr, hd, r->neox, pos0, 8};
    const int threads = st_pool_n_threads(CTX(be)->pool);
    if (n_tok < j.per_task && threads > 1) {
        const int64_t heads = (int64_t)n_tok * (n_head + nkv);
        j.per_task = (int)((heads + threads - 1) / threads);
        head_prep_job hj = {&j, qn, kn, eps};
        st_pool_run(CTX(be)->pool, (heads + j.per_task - 1) / j.per_task, head_prep_task, &hj);
        return;
    }
    if (qn) cpu_rmsnorm(be, q, NULL, qn, q, hd, n_tok * n_head, eps);
    if (kn) cpu_rmsnorm(be, k, NULL, kn, k, hd, n_tok * nkv, eps);
    st_pool_run(CTX(be)->pool, (n_tok + j.per_task - 1) / j.per_task, prep_task, &j);
}

static void cpu_run_step(st_backend *be, int n_tok, int pos0, void (*body)(void *, int), void *arg, size_t size) {
    (void)be, (void)n_tok, (void)size;
    body(arg, pos0);
}

typedef struct {
    const float *q;
    const st_kv_layer *kv;
    int n_tok, pos0, n_head, window;
    int n_part;       /* tasks per (token, KV head): its query heads split in this many parts */
    int blk_t, n_blk; /* AVX-512 blocks (attn_block_task): tokens per block, blocks */
    float scale;
    const float *sinks; /* (n_head) or NULL */
    float *out;
    float *scratch; /* per thread: scores of the group's heads, then their accumulators */
    size_t scratch_stride;
} attn_job;

/* Dot products and axpys of f32 query/accumulator rows with one f16 or int8
 * cache row. The AVX2 versions convert 8 halves per instruction (F16C); the
 * portable ones convert through st_f16_to_f32. Picked once per call. */
static float dot_f16(const float *q, const uint16_t *k, int n) {
    float s = 0;
    for (int i = 0; i < n; i++) s += q[i] * st_f16_to_f32(k[i]);
    return s;
}

static void axpy_f16(float *acc, float w, const uint16_t *v, int n) {
    for (int i = 0; i < n; i++) acc[i] += w * st_f16_to_f32(v[i]);
}

#if defined(__x86_64__)
#include <immintrin.h>
__attribute__((target("avx2,fma,f16c"))) static float dot_f16_avx2(const float *q, const uint16_t *k, int n) {
    __m256 a = _mm256_setzero_ps();
    int i = 0;
    for (; i + 8 <= n; i += 8)
        a = _mm256_fmadd_ps(_mm256_loadu_ps(q + i), _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(k + i))), a);
    __m128 h = _mm_add_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
    h = _mm_add_ps(h, _mm_movehl_ps(h, h));
    h = _mm_add_ss(h, _mm_movehdup_ps(h));
    float s = _mm_cvtss_f32(h);
    for (; i < n; i++) s += q[i] * st_f16_to_f32(k[i]);
    return s;
}

__attribute__((target("avx2,fma,f16c"))) static void axpy_f16_avx2(float *acc, float w, const uint16_t *v, int n) {
    __m256 wv = _mm256_set1_ps(w);
    int i = 0;
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(acc + i, _mm256_fmadd_ps(wv, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(v + i))),
                                                  _mm256_loadu_ps(acc + i)));
    for (; i < n; i++) acc[i] += w * st_f16_to_f32(v[i]);
}
#endif

static float dot_i8(const float *q, const int8_t *k, int n) {
    float s = 0;
    for (int i = 0; i < n; i++) s += q[i] * (float)k[i];
    return s;
}

static void axpy_i8(float *acc, float w, const int8_t *v, int n) {
    for (int i = 0; i < n; i++) acc[i] += w * (float)v[i];
}

typedef float (*dot_f16_fn)(const float *, const uint16_t *, int);
typedef void (*axpy_f16_fn)(float *, float, const uint16_t *, int);
static dot_f16_fn g_dot_f16 = dot_f16;
static int g_attn_avx512; /* cpu_attn_tile_avx512.c's blocks */
static axpy_f16_fn g_axpy_f16 = axpy_f16;

/* Without AVX-512 or with head_dim not a multiple of 16 (attn_block_task
 * otherwise): one (token, KV head) pair, the query heads that share this
 * KV head (GQA) together, so each cache row is read and converted once for
 * all of them: scores over the visible positions, softmax, weighted sum of V.
 * With fewer pairs than threads (decode with one KV head: deepseek2's latent
 * attention, 128 query heads) the heads are split into n_part tasks, each
 * reading the rows for its part; a head's arithmetic is the same either way. */
#define ATTN_PF 8 /* positions ahead that attn_task prefetches */

static void attn_prefetch(const uint8_t *p, size_t bytes) {
    for (size_t o = 0; o < bytes; o += 64) __builtin_prefetch(p + o, 0, 3);
}

static void attn_task(void *ctx, int64_t task, int thread) {
    attn_job *j = ctx;
    const st_kv_layer *kv = j->kv;
    const int G_all = j->n_head / kv->n_head_kv, per = (G_all + j->n_part - 1) / j->n_part;
    const int part = (int)(task % j->n_part), g0 = part * per;
    task /= j->n_part;
    if (g0 >= G_all) return;
    int hd = kv->head_dim, G = G_all - g0 < per ? G_all - g0 : per;
    int t = (int)(task / kv->n_head_kv), hkv = (int)(task % kv->n_head_kv);
    int pos = j->pos0 + t;
    int first = (j->window > 0 && pos - j->window + 1 > 0) ? pos - j->window + 1 : 0;
    size_t row = (size_t)kv->n_head_kv * hd, nc = (size_t)kv->n_ctx;
    float *sc = j->scratch + (size_t)thread * j->scratch_stride; /* [G][n_ctx] */
    float *acc = sc + (size_t)G * nc;                            /* [G][hd] */
    const float *q = j->q + ((size_t)t * j->n_head + (size_t)hkv * G_all + g0) * hd;
    int f16 = kv->type == ST_KV_F16;
    /* A head's cache rows are hd elements every n_head_kv * hd: short strided
     * reads that the hardware prefetcher follows late, so at depth the loops
     * waited on memory for every position. Ask for the row ATTN_PF positions
     * ahead (a few cache lines) before each one. */
    const size_t esz = f16 ? 2 : 1, rb = (size_t)hd * esz;
    for (int p = first; p <= pos; p++) {
        size_t off = (size_t)p * row + (size_t)hkv * hd;
        if (p + ATTN_PF <= pos) attn_prefetch((const uint8_t *)kv->k + (off + ATTN_PF * row) * esz, rb);
        for (int g = 0; g < G; g++)
            sc[(size_t)g * nc + p] = j->scale * (f16 ? g_dot_f16(q + (size_t)g * hd, (const uint16_t *)kv->k + off, hd)
                                                     : kv->k_scale[(size_t)p * kv->n_head_kv + hkv] *
                                                           dot_i8(q + (size_t)g * hd, (const int8_t *)kv->k + off, hd));
    }
    for (int g = 0; g < G; g++) {
        float *s = sc + (size_t)g * nc, mx = -INFINITY;
        /* a sink (gpt-oss) is one more logit in the softmax, with no value */
        const float sink = j->sinks ? j->sinks[hkv * G_all + g0 + g] : -INFINITY;
        for (int p = first; p <= pos; p++) mx = s[p] > mx ? s[p] : mx; /* fmaxf was a libm call per score */
        mx = fmaxf(mx, sink);
        double sum = j->sinks ? expf(sink - mx) : 0.0;
        for (int p = first; p <= pos; p++) sum += s[p] = expf(s[p] - mx);
        float inv = (float)(1.0 / sum);
        for (int p = first; p <= pos; p++) s[p] *= inv;
    }
    memset(acc, 0, (size_t)G * hd * sizeof(float));
    for (int p = first; p <= pos; p++) {
        size_t off = (size_t)p * row + (size_t)hkv * hd;
        if (p + ATTN_PF <= pos) attn_prefetch((const uint8_t *)kv->v + (off + ATTN_PF * row) * esz, rb);
        float vs = f16 ? 1.0f : kv->v_scale[(size_t)p * kv->n_head_kv + hkv];
        for (int g = 0; g < G; g++) {
            float w = sc[(size_t)g * nc + p];
            if (f16) g_axpy_f16(acc + (size_t)g * hd, w, (const uint16_t *)kv->v + off, hd);
            else axpy_i8(acc + (size_t)g * hd, w * vs, (const int8_t *)kv->v + off, hd);
        }
    }
    memcpy(j->out + ((size_t)t * j->n_head + (size_t)hkv * G_all + g0) * hd, acc, (size_t)G * hd * sizeof(float));
}

/* On AVX-512 (cpu_attn_tile_avx512.c), prompt chunks and decode alike: a
 * task is blk_t tokens x the query heads of one KV head, or a part of them
 * (more than CPU_ATTN_ROWS, or too few tasks for the threads); the blocks of
 * the last tokens go first: they see the most keys, and the short ones fill
 * in at the end. A row's result is the same in any block. */
static void attn_block_task(void *ctx, int64_t task, int thread) {
    const attn_job *j = ctx;
    const st_kv_layer *kv = j->kv;
    const int hd = kv->head_dim, G_all = j->n_head / kv->n_head_kv, per = (G_all + j->n_part - 1) / j->n_part;
    const int g0 = (int)(task % j->n_part) * per;
    task /= j->n_part;
    const int hkv = (int)(task % kv->n_head_kv), t0 = (j->n_blk - 1 - (int)(task / kv->n_head_kv)) * j->blk_t;
    if (g0 >= G_all) return;
    const size_t ld = (size_t)j->n_head * hd, off = (size_t)t0 * ld + ((size_t)hkv * G_all + g0) * hd;
    const cpu_attn_block b = {j->q + off,
                              j->out + off,
                              ld,
                              j->n_tok - t0 < j->blk_t ? j->n_tok - t0 : j->blk_t,
                              G_all - g0 < per ? G_all - g0 : per,
                              j->pos0 + t0,
                              j->window,
                              j->sinks ? j->sinks + (size_t)hkv * G_all + g0 : NULL,
                              j->scale,
                              kv,
                              hkv};
    cpu_attn_block_avx512(&b, j->scratch + (size_t)thread * j->scratch_stride);
}

static void cpu_attention_sinks(st_backend *be, const float *q, const st_kv_layer *kv, int n_tok, int pos0, int n_head,
                                float scale, int window, const float *sinks, float *out) {
    cpu_ctx *c = CTX(be);
    int G = n_head / kv->n_head_kv;
    if (n_tok <= 0) return; /* nothing to do (and no tasks to divide the threads among) */
    if (g_attn_avx512 && kv->head_dim % 16 == 0) {
        const int64_t pairs = (int64_t)n_tok * kv->n_head_kv;
        int n_part = (G + CPU_ATTN_ROWS - 1) / CPU_ATTN_ROWS;
        if (pairs * n_part < c->n_threads) n_part = (int)((c->n_threads + pairs - 1) / pairs);
        if (n_part > G) n_part = G;
        const int per = (G + n_part - 1) / n_part;
        int blk_t = CPU_ATTN_ROWS / per;
        /* short chunks: smaller blocks rather than idle threads */
        const int fill = (int)(pairs * n_part / c->n_threads);
        if (blk_t > fill) blk_t = fill > 1 ? fill : 1;
        const int n_blk = (n_tok + blk_t - 1) / blk_t;
        attn_job j = {
            q,     kv,    n_tok, pos0,  n_head, window, n_part,
            blk_t, n_blk, scale, sinks, out,    NULL,   (cpu_attn_block_scratch(kv->head_dim) + 15) / 16 * 16};
        j.scratch = cpu_scratch_reserve(&c->attn, j.scratch_stride * (size_t)c->n_threads * sizeof(float));
        st_pool_run(c->pool, (int64_t)n_blk * kv->n_head_kv * n_part, attn_block_task, &j);
        return;
    }
    const int64_t pairs = (int64_t)n_tok * kv->n_head_kv;
    int n_part = pairs >= c->n_threads ? 1 : (int)((c->n_threads + pairs - 1) / pairs);
    if (n_part > G) n_part = G;
    attn_job j = {q, kv, n_tok, pos0,  n_head, window, n_part,
                  0, 0,  scale, sinks, out,    NULL,   (size_t)G * ((size_t)kv->n_ctx + (size_t)kv->head_dim)};
    j.scratch = cpu_scratch_reserve(&c->attn, j.scratch_stride * (size_t)c->n_threads * sizeof(float));
    st_pool_run(c->pool, pairs * n_part, attn_task, &j);
}

static void cpu_attention(st_backend *be, const float *q, const st_kv_layer *kv, int n_tok, int pos0, int n_head,
                          float scale, int window, float *out) {
    cpu_attention_sinks(be, q, kv, n_tok, pos0, n_head, scale, window, NULL, out);
}

static float gelu_tanh(float x) {
    const float k = 0.7978845608028654f; /* sqrt(2/pi) */
    return 0.5f * x * (1.0f + tanhf(k * (x + 0.044715f * x * x * x)));
}

typedef struct {
    st_act act;
    const float *g, *u;
    float *out;
    int64_t n;
} act_job;

static int g_act_avx512; /* cpu_act_avx512.c's SiLU and GELU */

#define ACT_CHUNK 512 /* values per task: a few microseconds of expf/tanhf */

static void act_task(void *ctx, int64_t task, int thread) {
    (void)thread;
    const act_job *j = ctx;
    const int64_t i0 = task * ACT_CHUNK, i1 = i0 + ACT_CHUNK < j->n ? i0 + ACT_CHUNK : j->n;
    if (j->act == ST_ACT_SILU && g_act_avx512) cpu_silu_mul_avx512(j->g + i0, j->u + i0, j->out + i0, i1 - i0);
    else if (j->act == ST_ACT_SILU)
        for (int64_t i = i0; i < i1; i++) j->out[i] = j->g[i] / (1.0f + expf(-j->g[i])) * j->u[i];
    else if (j->act == ST_ACT_SWIGLU_OAI) /* gpt-oss: gate clamped above, up both ways, up + 1 */
        for (int64_t i = i0; i < i1; i++) {
            const float g = fminf(j->g[i], ST_OAI_LIMIT), u = fminf(fmaxf(j->u[i], -ST_OAI_LIMIT), ST_OAI_LIMIT);
            j->out[i] = g / (1.0f + expf(-ST_OAI_ALPHA * g)) * (u + 1.0f);
        }
    else if (g_act_avx512) cpu_gelu_mul_avx512(j->g + i0, j->u + i0, j->out + i0, i1 - i0);
    else
        for (int64_t i = i0; i < i1; i++) j->out[i] = gelu_tanh(j->g[i]) * j->u[i];
}

static void cpu_act_mul(st_backend *be, st_act act, const float *g, const float *u, float *out, int64_t n) {
    act_job j = {act, g, u, out, n};
    st_pool_run(CTX(be)->pool, (n + ACT_CHUNK - 1) / ACT_CHUNK, act_task, &j); /* one task: on the caller */
}

static void cpu_add(st_backend *be, float *x, const float *b, int64_t dim, int n_rows) {
    (void)be;
    for (int r = 0; r < n_rows; r++)
        for (int64_t i = 0; i < dim; i++) x[(size_t)r * dim + i] += b[i];
}

static void cpu_scale(st_backend *be, float *x, float s, int64_t n) {
    (void)be;
    for (int64_t i = 0; i < n; i++) x[i] *= s;
}

/* Routing of n_tok tokens on the host (st_moe_gating): p = softmax or
 * sigmoid of the logits; top-k by repeated argmax of p (+ bias) (k is small:
 * 8), ties to the lower id; the weights are the chosen p, renormalised,
 * scaled. p, s: n_expert floats of scratch each. */
static void route_tokens(const float *logits, int n_tok, int n_expert, int k, const st_moe_gating *gt, int32_t *sel,
                         float *wsel, float *p, float *s) {
    for (int t = 0; t < n_tok; t++) {
        const float *l = logits + (size_t)t * n_expert;
        if (gt->fn == ST_GATE_SIGMOID) {
            for (int e = 0; e < n_expert; e++) p[e] = 1.0f / (1.0f + expf(-l[e]));
        } else {
            float mx = l[0];
            for (int e = 1; e < n_expert; e++) mx = fmaxf(mx, l[e]);
            double sum = 0;
            for (int e = 0; e < n_expert; e++) sum += p[e] = expf(l[e] - mx);
            for (int e = 0; e < n_expert; e++) p[e] = (float)(p[e] / sum);
        }
        /* the score the choice ranks; NaN never wins, a chosen expert is -inf */
        for (int e = 0; e < n_expert; e++) s[e] = gt->bias ? p[e] + gt->bias[e] : p[e];
        if (gt->n_group > 1) cpu_route_groups(s, n_expert, gt->n_group, gt->n_group_used);
        double wsum = 0;
        for (int j = 0; j < k; j++) {
            int b = -1;
            for (int e = 0; e < n_expert; e++)
                if (s[e] > -INFINITY && (b < 0 || s[e] > s[b])) b = e;
            sel[t * k + j] = b; /* -1: NaN logits left nothing to choose (the GPU's routing says the same) */
            wsel[t * k + j] = b < 0 ? 0.0f : p[b];
            if (b < 0) continue;
            wsum += p[b];
            s[b] = -INFINITY;
        }
        /* llama.cpp clamps the sum at f16's smallest normal before dividing */
        const double div = wsum > 6.103515625e-5 ? wsum : 6.103515625e-5;
        if (gt->norm_topk)
            for (int j = 0; j < k; j++) wsel[t * k + j] = (float)(wsel[t * k + j] / div);
        if (gt->scale != 1.0f)
            for (int j = 0; j < k; j++) wsel[t * k + j] *= gt->scale;
    }
}

static void cpu_moe_route(st_backend *be, const float *logits, int n_tok, int n_expert, int k, const st_moe_gating *gt,
                          int32_t *sel, float *wsel) {
    float *p = cpu_scratch_reserve(&CTX(be)->moep, 2 * (size_t)n_expert * sizeof(float));
    route_tokens(logits, n_tok, n_expert, k, gt, sel, wsel, p, p + n_expert);
}

/* Expert e's bias (st_weight.bias, by expert id) added to its n rows of w values at y. */
static void add_expert_bias(const float *bias, int e, int n, int64_t w, float *y) {
    if (!bias) return;
    const float *b = bias + (size_t)e * w;
    for (int r = 0; r < n; r++)
        for (int64_t i = 0; i < w; i++) y[(size_t)r * w + i] += b[i];
}

/* Every expert's biases over its pairs' rows (off: the pairs of expert e are off[e]..off[e+1]). */
static void add_experts_bias(const float *bias, const int32_t *off, int n_expert, int64_t w, float *y) {
    if (!bias) return;
    for (int e = 0; e < n_expert; e++) add_expert_bias(bias, e, off[e + 1] - off[e], w, y + (size_t)off[e] * w);
}

/* One token's routed experts, one expert per pool task: gate and up, the
 * activation, its quantization and down, all on the task's thread, so a
 * decode step's experts cost one dispatch instead of three (gate/up, the
 * down input's quantization, down) and no thread waits at the barriers
 * between them. Each product is the one the row split computes, row for
 * row with the same kernel, so the outputs are the same bits. */
typedef struct {
    const st_weight *gate, *up, *down;
    st_act act;
    const int32_t *eid, *mat; /* per pair: expert id (biases), matrix index */
    const uint8_t *hq_g, *hq_u;
    uint8_t *gq; /* per pair: the down product's quantized input */
    size_t rd;
    float *ge, *ue, *ye;
} expert_job;

static void expert_task(void *p, int64_t i, int thread) {
    (void)thread;
    const expert_job *j = p;
    const st_weight *gate = j->gate, *up = j->up, *down = j->down;
    const int64_t E = gate->n_in, F = gate->n_out, m = j->mat[i];
    float *g = j->ge + i * F, *u = j->ue + i * F, *y = j->ye + i * E;
    const cpu_mm pg = {st_weight_mat(gate, m), gate->row_bytes, gate->type, F, E, 1, j->hq_g, NULL, g, 0};
    const cpu_mm pu = {st_weight_mat(up, m), up->row_bytes, up->type, F, E, 1, j->hq_u, NULL, u, 0};
    ST_ASSERT(cpu_matmul_q_here(&pg) == 0 && cpu_matmul_q_here(&pu) == 0);
    add_expert_bias(gate->bias, j->eid[i], 1, F, g);
    add_expert_bias(up->bias, j->eid[i], 1, F, u);
    const act_job aj = {j->act, g, u, g, F};
    for (int64_t t = 0; t * ACT_CHUNK < F; t++) act_task((void *)&aj, t, 0);
    uint8_t *q = j->gq + (size_t)i * j->rd;
    ST_ASSERT(cpu_quantize_act(NULL, down->type, F, 1, g, q) == 0); /* one row: no pool */
    const cpu_mm pd = {st_weight_mat(down, m), down->row_bytes, down->type, E, F, 1, q, NULL, y, 0};
    ST_ASSERT(cpu_matmul_q_here(&pd) == 0);
    add_expert_bias(down->bias, j->eid[i], 1, E, y);
}

/* Whether a step of np pairs for n_tok tokens runs one expert per task:
 * one token (each pair its own expert) and at least two experts a thread,
 * so that equal tasks balance (the 2-core decode step's 8 of 64 experts);
 * with more threads than that the row split keeps them all busy. */
static int use_expert_tasks(const cpu_ctx *c, int n_tok, int np) {
    if (n_tok != 1 || c->expert_tasks == 0) return 0;
    return c->expert_tasks == 1 || np >= 2 * c->n_threads;
}

/* The given pairs' experts (backend.h). Pairs are sorted by expert (tokens
 * in order within one), so that each expert's weights are read once per call
 * however many tokens share it (prompt chunks); all experts' gate and up
 * products go out in one pool dispatch and all down products in another (a
 * decode step's 8 small experts would otherwise cost ~30 dispatches), and
 * their outputs are summed per token in increasing expert order. */
static void cpu_moe_experts(st_backend *be, const float *h, int n_tok, int n_expert, int k, const int32_t *sel,
                            const float *wsel, const int32_t *emap, st_act act, const st_weight *gate,
                            const st_weight *up, const st_weight *down, float *out) {
    cpu_ctx *c = CTX(be);
    const int64_t E = gate->n_in, F = gate->n_out;
    const size_t nk = (size_t)n_tok * k;
    memset(out, 0, (size_t)n_tok * E * sizeof(float));
    /* one arena: per-expert list offsets, the pairs' tokens and weights, the
     * products' descriptors, then gate/up/down outputs per pair */
    size_t bytes = (size_t)(n_expert + 1) * 4 * 2 + nk * 8 + 2 * nk * sizeof(cpu_mm) + nk * (size_t)(2 * F + E) * 4;
    uint8_t *a = cpu_scratch_reserve(&c->moe, bytes);
    int32_t *off = (int32_t *)a, *fill = off + n_expert + 1, *tok = fill + n_expert + 1;
    float *tw = (float *)(tok + nk);
    cpu_mm *mm = (cpu_mm *)(tw + nk);
    float *ge = (float *)(mm + 2 * nk), *ue = ge + nk * F, *ye = ue + nk * F;
    memset(off, 0, (size_t)(n_expert + 1) * 4);
    for (size_t i = 0; i < nk; i++) {
        ST_ASSERT(sel[i] >= -1 && sel[i] < n_expert);
        if (sel[i] >= 0 && (!emap || emap[sel[i]] >= 0)) off[sel[i] + 1]++;
    }
    for (int e = 0; e < n_expert; e++) off[e + 1] += off[e];
    const int np = off[n_expert]; /* pairs computed here */
    if (!np) return;
    memcpy(fill, off, (size_t)n_expert * 4);
    for (size_t i = 0; i < nk; i++) {
        const int e = sel[i];
        if (e < 0 || (emap && emap[e] < 0)) continue;
        tok[fill[e]] = (int32_t)(i / (size_t)k);
        tw[fill[e]++] = wsel[i];
    }
    if (c->precise) { /* gather each expert's rows, then f32 products */
        for (int e = 0; e < n_expert; e++) {
            const int n = off[e + 1] - off[e];
            if (!n) continue;
            const int64_t m = emap ? emap[e] : e;
            float *xe = cpu_scratch_reserve(&c->gath, (size_t)n * (size_t)E * sizeof(float));
            for (int i = 0; i < n; i++)
                memcpy(xe + (size_t)i * E, h + (size_t)tok[off[e] + i] * E, (size_t)E * sizeof(float));
            float *g = ge + (size_t)off[e] * F, *u = ue + (size_t)off[e] * F;
            matmul_precise(c, gate, m, xe, g, n);
            matmul_precise(c, up, m, xe, u, n);
            add_expert_bias(gate->bias, e, n, F, g);
            add_expert_bias(up->bias, e, n, F, u);
            cpu_act_mul(be, act, g, u, g, (int64_t)n * F);
            matmul_precise(c, down, m, g, ye + (size_t)off[e] * E, n);
            add_expert_bias(down->bias, e, n, E, ye + (size_t)off[e] * E);
        }
    } else {
        /* gate and up read the same input: quantized once (twice if their formats differ) */
        size_t rg = cpu_act_row_size(gate->type, E), ru = cpu_act_row_size(up->type, E);
        size_t rd = cpu_act_row_size(down->type, F);
        int same = qt_get(gate->type)->vec_dot_type == qt_get(up->type)->vec_dot_type;
        uint8_t *q = cpu_scratch_reserve(&c->moeq, (size_t)n_tok * (rg + (same ? 0 : ru)) + (size_t)np * rd);
        uint8_t *hq_g = q, *hq_u = same ? q : q + (size_t)n_tok * rg;
        uint8_t *gq = hq_u + (size_t)n_tok * (same ? rg : ru); /* after the input rows, never over them */
        ST_ASSERT(cpu_quantize_act(c->pool, gate->type, E, n_tok, h, hq_g) == 0);
        if (!same) ST_ASSERT(cpu_quantize_act(c->pool, up->type, E, n_tok, h, hq_u) == 0);
        if (use_expert_tasks(c, n_tok, np)) {
            int32_t *eid = (int32_t *)mm, *mat = eid + np; /* the descriptors' room, unused here */
            for (int e = 0, i = 0; e < n_expert; e++)
                if (off[e + 1] > off[e]) eid[i] = e, mat[i++] = emap ? emap[e] : e;
            expert_job ej = {gate, up, down, act, eid, mat, hq_g, hq_u, gq, rd, ge, ue, ye};
            st_pool_run(c->pool, np, expert_task, &ej);
        } else {
            int n_mm = 0;
            for (int e = 0; e < n_expert; e++) {
                const int n = off[e + 1] - off[e];
                if (!n) continue;
                const int64_t m = emap ? emap[e] : e;
                mm[n_mm++] = (cpu_mm){st_weight_mat(gate, m), gate->row_bytes,         gate->type, F, E, n, hq_g,
                                      tok + off[e],           ge + (size_t)off[e] * F, 0};
                mm[n_mm++] = (cpu_mm){st_weight_mat(up, m), up->row_bytes,           up->type, F, E, n, hq_u,
                                      tok + off[e],         ue + (size_t)off[e] * F, 0};
            }
            ST_ASSERT(cpu_matmul_q_batch(c->pool, mm, n_mm) == 0);
            add_experts_bias(gate->bias, off, n_expert, F, ge);
            add_experts_bias(up->bias, off, n_expert, F, ue);
            cpu_act_mul(be, act, ge, ue, ge, (int64_t)np * F);
            ST_ASSERT(cpu_quantize_act(c->pool, down->type, F, np, ge, gq) == 0);
            n_mm = 0;
            for (int e = 0; e < n_expert; e++) {
                const int n = off[e + 1] - off[e];
                if (!n) continue;
                mm[n_mm++] = (cpu_mm){st_weight_mat(down, emap ? emap[e] : e),
                                      down->row_bytes,
                                      down->type,
                                      E,
                                      F,
                                      n,
                                      gq + (size_t)off[e] * rd,
                                      NULL,
                                      ye + (size_t)off[e] * E,
                                      0};
            }
            ST_ASSERT(cpu_matmul_q_batch(c->pool, mm, n_mm) == 0);
            add_experts_bias(down->bias, off, n_expert, E, ye);
        }
    }
    for (int i = 0; i < np; i++) {
        float *o = out + (size_t)tok[i] * E;
        const float *y = ye + (size_t)i * E;
        for (int64_t col = 0; col < E; col++) o[col] += tw[i] * y[col];
    }
}

static void cpu_gdn(st_backend *be, const st_gdn *g, st_kv_layer *st, int n_tok, int pos0, const float *qkv,
                    const float *z, const float *beta, const float *alpha, float *out) {
    cpu_gated_delta_net(CTX(be)->pool, &CTX(be)->gdn, g, st, n_tok, pos0, qkv, z, beta, alpha, out);
}

static void cpu_gdn_keep(st_backend *be, const st_gdn *g, st_kv_layer *st, int n_keep) {
    cpu_gated_delta_net_keep(CTX(be)->pool, &CTX(be)->gdn, g, st, n_keep);
}

static void cpu_split(st_backend *be, const float *src, float *a, float *b, int n_rows, int n_group, int w) {
    (void)be;
    cpu_split_halves(src, a, b, n_rows, n_group, w);
}

static void cpu_sigmul(st_backend *be, float *x, const float *g, int dim, int g_dim, int n_rows) {
    (void)be;
    cpu_sigmoid_mul(x, g, dim, g_dim, n_rows);
}

/* Routing then every expert here: the two halves of the seam, composed. */
static void cpu_moe_ffn(st_backend *be, const float *h, const float *logits, int n_tok, int n_expert, int k,
                        const st_moe_gating *gt, st_act act, const st_weight *gate, const st_weight *up,
                        const st_weight *down, float *out) {
    cpu_ctx *c = CTX(be);
    const size_t nk = (size_t)n_tok * k;
    uint8_t *a = cpu_scratch_reserve(&c->route, nk * 8);
    int32_t *sel = (int32_t *)a;
    float *wsel = (float *)(sel + nk);
    cpu_moe_route(be, logits, n_tok, n_expert, k, gt, sel, wsel);
    cpu_moe_experts(be, h, n_tok, n_expert, k, sel, wsel, NULL, act, gate, up, down, out);
}

static void cpu_destroy(st_backend *be) {
    cpu_ctx *c = CTX(be);
    cpu_scratch_free(&c->act);
    cpu_scratch_free(&c->moe);
    cpu_scratch_free(&c->moeq);
    cpu_scratch_free(&c->route);
    cpu_scratch_free(&c->moep);
    cpu_scratch_free(&c->rows);
    cpu_scratch_free(&c->gath);
    cpu_scratch_free(&c->attn);
    cpu_scratch_free(&c->gdn);
    for (int i = 0; i < 2; i++) st_free(c->rope[i].cs);
    st_pool_free(c->pool);
    st_free(be->ctx);
    st_free(be);
}

void backend_cpu_set_spin_us(st_backend *cpu, int us) {
    ST_ASSERT(cpu->destroy == cpu_destroy);
    st_pool_set_spin_us(((cpu_ctx *)cpu->ctx)->pool, us);
}

/* The one variant (backend.h st_variant) of this backend: f32 activations,
 * which a comparison takes as the more exact reference. */
static int cpu_variant(st_backend *be, st_variant kind, int value) {
    if (kind != ST_VARIANT_PRECISE) return -1;
    const int old = CTX(be)->precise;
    if (value >= 0) CTX(be)->precise = value != 0;
    return old;
}

st_backend *backend_cpu_create(int n_threads) {
    st_backend *be = st_calloc(1, sizeof *be);
    cpu_ctx *c = st_calloc(1, sizeof *c);
    c->pool = st_pool_init(n_threads);
    c->n_threads = st_pool_n_threads(c->pool);
#if defined(__x86_64__)
    if (qt_cpu_isa() >= QT_ISA_AVX2) { /* AVX2 machines have F16C and FMA */
        g_dot_f16 = dot_f16_avx2;
        g_axpy_f16 = axpy_f16_avx2;
        g_f16_row = f16_row_avx2;
    }
    g_attn_avx512 = g_act_avx512 = qt_cpu_isa() >= QT_ISA_AVX512;
#endif
    const char *p = st_switch_get("STRATA_PRECISE");
    c->precise = p && !strcmp(p, "1");
    if (c->precise) ST_INFO("STRATA_PRECISE=1: matrix products use f32 activations (slower)");
    const char *et = st_switch_get("STRATA_CPU_EXPERT_TASKS");
    c->expert_tasks = et && !strcmp(et, "0") ? 0 : et && !strcmp(et, "1") ? 1 : -1;
    *be = (st_backend){
        .name = "cpu",
        .ctx = c,
        .alloc = cpu_alloc,
        .free = cpu_free,
        .destroy = cpu_destroy,
        .get_rows = cpu_get_rows,
        .matmul = cb_matmul,
        .matmul_multi = cpu_matmul_multi,
        .matmul_res_norm = backend_compose_matmul_res_norm,
        .rmsnorm = cpu_rmsnorm,
        .qkv_prep = cpu_qkv_prep,
        .attention = cpu_attention,
        .attention_sinks = cpu_attention_sinks,
        .act_mul = cpu_act_mul,
        .add = cpu_add,
        .scale = cpu_scale,
        .gated_delta_net = cpu_gdn,
        .gated_delta_net_keep = cpu_gdn_keep,
        .split_halves = cpu_split,
        .sigmoid_mul = cpu_sigmul,
        .copy_2d = cpu_copy_2d,
        .moe_ffn = cpu_moe_ffn,
        .moe_route = cpu_moe_route,
        .moe_experts = cpu_moe_experts,
        .moe_gatings = ST_GATINGS_SOFTMAX | ST_GATINGS_ALL | ST_GATINGS_OAI,
        .run_step = cpu_run_step,
        .to_host = cpu_copy,
        .to_device = cpu_copy,
        .variant = cpu_variant,
    };
    return be;
}
