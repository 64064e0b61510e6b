/* The CPU ops of the hybrid Qwen family (qwen3next, qwen35moe, qwen35): the gated
 * DeltaNet of the linear-attention layers, and the two small helpers of the
 * gated full-attention layers (backend.h: gated_delta_net, split_halves,
 * sigmoid_mul).
 *
 * The DeltaNet of a prompt chunk runs in three passes: the causal
 * convolution, SiLU and L2 norms for every token (parallel over tokens), the
 * recurrence (parallel over value heads, tokens in order inside a head: the
 * state is one head_dim x head_dim matrix that stays in L1/L2 for the whole
 * chunk), then the gated RMS norm (parallel over tokens). The projections
 * around it are batched matrix products of the whole chunk (forward.c); the
 * recurrence itself is the per-token delta rule, not the chunked WY form,
 * with an AVX2/FMA inner loop (a row of S is 8 lanes at a time) where the
 * CPU has it.
 *
 * Speculative decoding verifies drafted tokens in one such pass and may
 * reject the last ones. The state cannot be run backwards (the decay is a
 * product), so the pass records how to redo it instead (st_kv_layer undo):
 * the state before it, and per token the inputs of the recurrence (a few
 * rows, not a state per position: for Qwen3.5-35B-A3B a state is 2 MiB per
 * layer, a token's record 64 KB). Keeping n of them puts the saved state
 * back and replays the delta rule of those n tokens only (no projection, no
 * other layer): the same function on the same inputs, so the same bits as a
 * pass that had been given only them.
 */
#include "backend/cpu/cpu_hybrid.h"

#include <math.h>
#include <string.h>

#include "core/log.h"
#include "quant/quant.h"

static float silu(float x) { return x / (1.0f + expf(-x)); }
static float sigmoid(float x) { return 1.0f / (1.0f + expf(-x)); }
static float softplus(float x) { return x > 20.0f ? x : log1pf(expf(x)); }

typedef struct {
    const st_gdn *g;
    st_kv_layer *st;
    int n_tok, conv_dim;
    const float *qkv, *z, *beta, *alpha;
    float *c;  /* [n_tok][conv_dim]: convolved, activated, normed q | k | v */
    float *gb; /* [n_tok][n_v][2]: decay, beta */
    float *o;  /* [n_tok][n_v][hd]: the recurrence's output */
    float *out;
    /* a verify pass (st->undo_cap > 0): the state before it is saved into snap
     * (per head, by rec_task), and token t's inputs of the recurrence into rec
     * + t * rec_row (conv_task); NULL otherwise */
    float *snap, *rec;
    size_t rec_row;
} gdn_job;

/* Input i of the convolution window of token t: the state holds the d_conv-1
 * inputs before the chunk, then come the chunk's own. */
static const float *conv_in(const gdn_job *j, int t, int i) {
    const int back = j->g->d_conv - 1, p = t + i; /* index in [state | chunk] */
    return p < back ? j->st->conv + (size_t)p * j->conv_dim : j->qkv + (size_t)(p - back) * j->conv_dim;
}

static void l2norm(float *x, int n, float eps, float scale) {
    double s = 0;
    for (int i = 0; i < n; i++) s += (double)x[i] * x[i];
    const float f = scale / sqrtf((float)s + eps);
    for (int i = 0; i < n; i++) x[i] *= f;
}

/* Pass 1, one token: convolution, SiLU, L2 norms; decay and beta per head. */
static void conv_task(void *ctx, int64_t task, int thread) {
    (void)thread;
    const gdn_job *j = ctx;
    const st_gdn *g = j->g;
    const int t = (int)task, K = g->d_conv, hd = g->head_dim, nk = g->n_k_head, nv = g->n_v_head;
    float *c = j->c + (size_t)t * j->conv_dim;
    for (int ch = 0; ch < j->conv_dim; ch++) {
        const float *w = g->conv_w + (size_t)ch * K;
        float s = 0;
        for (int i = 0; i < K; i++) s += w[i] * conv_in(j, t, i)[ch];
        c[ch] = silu(s);
    }
    const float qs = 1.0f / sqrtf((float)hd);
    for (int h = 0; h < nk; h++) {
        l2norm(c + (size_t)h * hd, hd, g->eps, qs);
        l2norm(c + (size_t)(nk + h) * hd, hd, g->eps, 1.0f);
    }
    const int r = nv / nk;
    for (int h = 0; h < nv; h++) {
        float b, a;
        if (g->ba_fused) { /* per key head: its r betas, then its r alphas */
            const float *ba = j->beta + (size_t)t * 2 * nv + (size_t)(h / r) * 2 * r;
            b = ba[h % r], a = ba[r + h % r];
        } else {
            b = j->beta[(size_t)t * nv + h], a = j->alpha[(size_t)t * nv + h];
        }
        j->gb[((size_t)t * nv + h) * 2] = expf(softplus(a + g->dt_bias[h]) * g->a[h]);
        j->gb[((size_t)t * nv + h) * 2 + 1] = sigmoid(b);
    }
    if (j->rec) { /* what a replay needs: the input (for the window), the recurrence's inputs */
        float *r = j->rec + (size_t)t * j->rec_row;
        memcpy(r, j->qkv + (size_t)t * j->conv_dim, (size_t)j->conv_dim * sizeof(float));
        memcpy(r + j->conv_dim, c, (size_t)j->conv_dim * sizeof(float));
        memcpy(r + 2 * (size_t)j->conv_dim, j->gb + (size_t)t * nv * 2, (size_t)nv * 2 * sizeof(float));
    }
}

/* One token's delta rule on one head's state S (hd rows of hd): per row jv,
 * decay it, then add beta (v[jv] - row.k) k, and o[jv] = row.q. */
static void delta_step(float *S, const float *q, const float *k, const float *v, float decay, float beta, float *o,
                       int hd) {
    for (int jv = 0; jv < hd; jv++) {
        float *row = S + (size_t)jv * hd;
        float sk = 0;
        for (int i = 0; i < hd; i++) sk += (row[i] *= decay) * k[i];
        const float d = beta * (v[jv] - sk);
        float oq = 0;
        for (int i = 0; i < hd; i++) oq += (row[i] += d * k[i]) * q[i];
        o[jv] = oq;
    }
}

#if defined(__x86_64__)
#include <immintrin.h>
__attribute__((target("avx2,fma"))) static inline float hsum8(__m256 a) {
    __m128 h = _mm_add_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
    h = _mm_add_ps(h, _mm_movehl_ps(h, h));
    h = _mm_add_ss(h, _mm_movehdup_ps(h));
    return _mm_cvtss_f32(h);
}

/* The same, 8 lanes at a time (hd a multiple of 8; the callers check). */
__attribute__((target("avx2,fma"))) static void
delta_step_avx2(float *S, const float *q, const float *k, const float *v, float decay, float beta, float *o, int hd) {
    const __m256 dv = _mm256_set1_ps(decay);
    for (int jv = 0; jv < hd; jv++) {
        float *row = S + (size_t)jv * hd;
        __m256 sk = _mm256_setzero_ps();
        for (int i = 0; i < hd; i += 8) {
            const __m256 r = _mm256_mul_ps(_mm256_loadu_ps(row + i), dv);
            _mm256_storeu_ps(row + i, r);
            sk = _mm256_fmadd_ps(r, _mm256_loadu_ps(k + i), sk);
        }
        const __m256 d = _mm256_set1_ps(beta * (v[jv] - hsum8(sk)));
        __m256 oq = _mm256_setzero_ps();
        for (int i = 0; i < hd; i += 8) {
            const __m256 r = _mm256_fmadd_ps(d, _mm256_loadu_ps(k + i), _mm256_loadu_ps(row + i));
            _mm256_storeu_ps(row + i, r);
            oq = _mm256_fmadd_ps(r, _mm256_loadu_ps(q + i), oq);
        }
        o[jv] = hsum8(oq);
    }
}
#endif

typedef void (*delta_step_fn)(float *, const float *, const float *, const float *, float, float, float *, int);

static delta_step_fn pick_step(int hd) {
#if defined(__x86_64__)
    if (hd % 8 == 0 && qt_cpu_isa() >= QT_ISA_AVX2) return delta_step_avx2;
#endif
    (void)hd;
    return delta_step;
}

/* The key/query head that value head h reads. */
static int key_head(const st_gdn *g, int h) { return g->k_grouped ? h / (g->n_v_head / g->n_k_head) : h % g->n_k_head; }

/* Pass 2, one value head over the chunk's tokens in order: the delta rule. */
static void rec_task(void *ctx, int64_t task, int thread) {
    (void)thread;
    const gdn_job *j = ctx;
    const st_gdn *g = j->g;
    const int h = (int)task, hd = g->head_dim, nk = g->n_k_head, nv = g->n_v_head;
    const int kh = key_head(g, h);
    float *S = j->st->ssm + (size_t)h * hd * hd; /* S[jv][ik] */
    const delta_step_fn step = pick_step(hd);
    if (j->snap) memcpy(j->snap + (size_t)h * hd * hd, S, (size_t)hd * hd * sizeof(float));
    for (int t = 0; t < j->n_tok; t++) {
        const float *c = j->c + (size_t)t * j->conv_dim;
        const float *q = c + (size_t)kh * hd, *k = c + (size_t)(nk + kh) * hd;
        const float *v = c + (size_t)(2 * nk + h) * hd;
        const size_t gi = ((size_t)t * nv + h) * 2;
        step(S, q, k, v, j->gb[gi], j->gb[gi + 1], j->o + ((size_t)t * nv + h) * hd, hd);
    }
}

/* Pass 3, one token: per head RMS norm times the weight, times silu(z). */
static void norm_task(void *ctx, int64_t task, int thread) {
    (void)thread;
    const gdn_job *j = ctx;
    const st_gdn *g = j->g;
    const int t = (int)task, hd = g->head_dim, nv = g->n_v_head;
    for (int h = 0; h < nv; h++) {
        const size_t off = ((size_t)t * nv + h) * hd;
        const float *o = j->o + off, *z = j->z + off;
        double s = 0;
        for (int i = 0; i < hd; i++) s += (double)o[i] * o[i];
        const float f = 1.0f / sqrtf((float)(s / hd) + g->eps);
        for (int i = 0; i < hd; i++) j->out[off + i] = o[i] * f * g->norm[i] * silu(z[i]);
    }
}

void cpu_gated_delta_net(st_pool *pool, cpu_scratch *scr, const st_gdn *g, st_kv_layer *st, int n_tok, int pos0,
                         const float *qkv, const float *z, const float *beta, const float *alpha, float *out) {
    const int hd = g->head_dim, nk = g->n_k_head, nv = g->n_v_head, back = g->d_conv - 1;
    ST_ASSERT(n_tok > 0 && nv % nk == 0 && st->conv && st->ssm);
    const int conv_dim = 2 * nk * hd + nv * hd;
    if (pos0 == 0) { /* a new sequence: no history */
        memset(st->conv, 0, (size_t)back * conv_dim * sizeof(float));
        memset(st->ssm, 0, (size_t)nv * hd * hd * sizeof(float));
    }
    const size_t nc = (size_t)n_tok * conv_dim, ng = (size_t)n_tok * nv * 2, no = (size_t)n_tok * nv * hd;
    float *buf = cpu_scratch_reserve(scr, (nc + ng + no) * sizeof(float));
    gdn_job j = {g, st, n_tok, conv_dim, qkv, z, beta, alpha, buf, buf + nc, buf + nc + ng, out, NULL, NULL, 0};
    if (st->undo_cap > 0) { /* a verify pass: record how to undo it (gated_delta_net_keep) */
        ST_ASSERT(st->undo && st->undo_n + n_tok <= st->undo_cap);
        const size_t ns = (size_t)nv * hd * hd, ncv = (size_t)back * conv_dim;
        if (st->undo_n == 0) { /* the state before the pass: the window here, S in rec_task */
            j.snap = st->undo;
            memcpy(st->undo + ns, st->conv, ncv * sizeof(float));
        }
        j.rec_row = 2 * (size_t)conv_dim + 2 * (size_t)nv;
        j.rec = st->undo + ns + ncv + (size_t)st->undo_n * j.rec_row;
        st->undo_n += n_tok;
    }
    st_pool_run(pool, n_tok, conv_task, &j);
    st_pool_run(pool, nv, rec_task, &j);
    st_pool_run(pool, n_tok, norm_task, &j);
    /* the convolution's state: the last d_conv-1 inputs of [state | chunk] */
    for (int i = 0; i < back; i++) {
        const int p = n_tok + i; /* index in [state | chunk] of the i-th kept input */
        const float *src = p < back ? st->conv + (size_t)p * conv_dim : qkv + (size_t)(p - back) * conv_dim;
        if (src != st->conv + (size_t)i * conv_dim)
            memmove(st->conv + (size_t)i * conv_dim, src, conv_dim * sizeof(float));
    }
}

typedef struct {
    const st_gdn *g;
    st_kv_layer *st;
    int n_keep, conv_dim;
    float *o; /* [n_v][hd]: the replay's outputs, not needed */
} keep_job;

/* One value head: the saved S, then the kept tokens' delta rule again, from
 * the recorded inputs, with the step function the pass used. */
static void replay_task(void *ctx, int64_t task, int thread) {
    (void)thread;
    const keep_job *j = ctx;
    const st_gdn *g = j->g;
    const int h = (int)task, hd = g->head_dim, nk = g->n_k_head, nv = g->n_v_head, kh = key_head(g, h);
    const size_t ns = (size_t)nv * hd * hd, row = 2 * (size_t)j->conv_dim + 2 * (size_t)nv;
    const float *rec = j->st->undo + ns + (size_t)(g->d_conv - 1) * j->conv_dim;
    float *S = j->st->ssm + (size_t)h * hd * hd;
    memcpy(S, j->st->undo + (size_t)h * hd * hd, (size_t)hd * hd * sizeof(float));
    const delta_step_fn step = pick_step(hd);
    for (int t = 0; t < j->n_keep; t++) {
        const float *c = rec + (size_t)t * row + j->conv_dim, *gb = c + j->conv_dim;
        step(S, c + (size_t)kh * hd, c + (size_t)(nk + kh) * hd, c + (size_t)(2 * nk + h) * hd, gb[2 * h],
             gb[2 * h + 1], j->o + (size_t)h * hd, hd);
    }
}

void cpu_gated_delta_net_keep(st_pool *pool, cpu_scratch *scr, const st_gdn *g, st_kv_layer *st, int n_keep) {
    ST_ASSERT(st->undo_cap > 0 && n_keep >= 0 && n_keep <= st->undo_n);
    if (n_keep < st->undo_n) {
        const int hd = g->head_dim, nv = g->n_v_head, back = g->d_conv - 1;
        const int conv_dim = (2 * g->n_k_head + nv) * hd;
        keep_job j = {g, st, n_keep, conv_dim, cpu_scratch_reserve(scr, (size_t)nv * hd * sizeof(float))};
        st_pool_run(pool, nv, replay_task, &j);
        /* the window: the last d_conv-1 inputs of [saved window | the kept tokens' inputs] */
        const size_t ns = (size_t)nv * hd * hd, row = 2 * (size_t)conv_dim + 2 * (size_t)nv;
        const float *win = st->undo + ns, *rec = win + (size_t)back * conv_dim;
        for (int i = 0; i < back; i++) {
            const int p = n_keep + i;
            const float *src = p < back ? win + (size_t)p * conv_dim : rec + (size_t)(p - back) * row;
            memcpy(st->conv + (size_t)i * conv_dim, src, (size_t)conv_dim * sizeof(float));
        }
    }
    st->undo_cap = 0;
    st->undo_n = 0;
}

void cpu_split_halves(const float *src, float *a, float *b, int n_rows, int n_group, int w) {
    for (size_t r = 0; r < (size_t)n_rows * n_group; r++) {
        memcpy(a + r * w, src + r * 2 * w, (size_t)w * sizeof(float));
        memcpy(b + r * w, src + r * 2 * w + w, (size_t)w * sizeof(float));
    }
}

void cpu_sigmoid_mul(float *x, const float *g, int dim, int g_dim, int n_rows) {
    for (size_t r = 0; r < (size_t)n_rows; r++) {
        float *xr = x + r * dim;
        if (g_dim == 1) {
            const float s = sigmoid(g[r]);
            for (int i = 0; i < dim; i++) xr[i] *= s;
        } else {
            for (int i = 0; i < dim; i++) xr[i] *= sigmoid(g[r * dim + i]);
        }
    }
}
