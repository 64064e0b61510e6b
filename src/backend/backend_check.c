/* Op-by-op comparison of two backends (backend_check.h).
 *
 * Bounds, and why: ops that do the same float arithmetic in the same order
 * per value (get_rows, add, scale, the cache's f16 rounding) must match
 * exactly or within a few ulp (bound 1e-12); ops whose sums are ordered
 * differently (rmsnorm, softmax in attention and routing, transcendental
 * functions in rope and act_mul) get 1e-9 to 1e-7; matrix products quantize
 * the activations differently on each backend (the CPU to Q8_1/Q8_K, the GPU
 * to int8 blocks of 32 or bf16), so they and the MoE FFN get 2e-3, about ten
 * times the NMSE that one 8-bit activation rounding adds.
 */
#include "backend/backend_check.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend_check_impl.h"
#include "core/alloc.h"
#include "core/log.h"
#include "quant/quant.h"

/* A weight of n_mat matrices on both backends, quantized from Gaussians. */
typedef struct {
    st_weight r, d;
    void *rp, *dp;
} wpair;

static wpair make_weight(chk *c, qt_type t, int64_t n_in, int64_t n_out, int64_t n_mat) {
    size_t rb = qt_row_size(t, n_in), bytes = rb * (size_t)(n_out * n_mat);
    float *f = rand_host(c, (size_t)(n_in * n_out * n_mat), 0.5f);
    void *q = st_malloc(bytes);
    for (int64_t r = 0; r < n_out * n_mat; r++) qt_quantize(t, f + r * n_in, (uint8_t *)q + (size_t)r * rb, n_in);
    wpair w;
    w.rp = put(c->ref, q, bytes);
    w.dp = put(c->dut, q, bytes);
    st_weight base = {NULL, NULL, t, n_in, n_out, n_mat, rb, NULL};
    w.r = base;
    w.d = base;
    w.r.data = w.rp;
    w.d.data = w.dp;
    st_free(f);
    st_free(q);
    return w;
}

static void free_weight(chk *c, wpair *w) {
    c->ref->free(c->ref, w->rp);
    c->dut->free(c->dut, w->dp);
}

static void check_get_rows(chk *c, qt_type t, int64_t n_in) {
    const int n_out = 64, n = 5;
    wpair w = make_weight(c, t, n_in, n_out, 1);
    int32_t ids[5];
    for (int i = 0; i < n; i++) ids[i] = (int32_t)(next_u64(c) % n_out);
    void *ir = put(c->ref, ids, sizeof ids), *id = put(c->dut, ids, sizeof ids);
    size_t no = (size_t)n * n_in;
    void *or_ = put(c->ref, NULL, no * 4), *od = put(c->dut, NULL, no * 4);
    c->ref->get_rows(c->ref, &w.r, ir, n, or_);
    double t0 = now_ms();
    c->dut->get_rows(c->dut, &w.d, id, n, od);
    double e = cmp_bufs(c, or_, od, no);
    report(c, "get_rows", e, 1e-12, now_ms() - t0, "%s, %d rows of %lld", qt_get(t)->name, n, (long long)n_in);
    void *bufs[][2] = {{ir, id}, {or_, od}};
    for (int i = 0; i < 2; i++) {
        c->ref->free(c->ref, bufs[i][0]);
        c->dut->free(c->dut, bufs[i][1]);
    }
    free_weight(c, &w);
}

static void check_matmul(chk *c, qt_type t, int64_t n_in, int64_t n_out, int n_tok) {
    wpair w = make_weight(c, t, n_in, n_out, 2);
    float *x = rand_host(c, (size_t)n_tok * n_in, 1.0f);
    void *xr = put(c->ref, x, (size_t)n_tok * n_in * 4), *xd = put(c->dut, x, (size_t)n_tok * n_in * 4);
    size_t no = (size_t)n_tok * n_out;
    void *yr = put(c->ref, NULL, no * 4), *yd = put(c->dut, NULL, no * 4);
    c->ref->matmul(c->ref, &w.r, 1, xr, yr, n_tok);
    double t0 = now_ms();
    c->dut->matmul(c->dut, &w.d, 1, xd, yd, n_tok);
    double e = cmp_bufs(c, yr, yd, no);
    report(c, "matmul", e, 2e-3, now_ms() - t0, "%s, %lld -> %lld, %d tokens, matrix 1 of 2", qt_get(t)->name,
           (long long)n_in, (long long)n_out, n_tok);
    c->ref->free(c->ref, xr), c->dut->free(c->dut, xd), c->ref->free(c->ref, yr), c->dut->free(c->dut, yd);
    st_free(x);
    free_weight(c, &w);
}

/* A producer op then a product of its output, as the forward pass chains
 * them: rmsnorm -> matmul (several products of one normed input), and
 * act_mul -> matmul. On the GPU the producer may write the product's int8
 * input itself (the CUDA backend does); the products' results must still match
 * the CPU's as a plain product does (bound 2e-3, as check_matmul). */
static void check_chain(chk *c, qt_type t, int64_t dim, int64_t n_out, int n_tok) {
    wpair w = make_weight(c, t, dim, n_out, 2);
    size_t n = (size_t)n_tok * dim, no = (size_t)n_tok * n_out;
    float *x = rand_host(c, n, 2.0f), *g = rand_host(c, (size_t)dim, 1.0f);
    void *xr = put(c->ref, x, n * 4), *xd = put(c->dut, x, n * 4), *gr = put(c->ref, g, (size_t)dim * 4);
    void *gd = put(c->dut, g, (size_t)dim * 4), *hr = put(c->ref, NULL, n * 4), *hd = put(c->dut, NULL, n * 4);
    void *yr = put(c->ref, NULL, no * 4), *yd = put(c->dut, NULL, no * 4);
    double e = 0;
    for (int rep = 0; rep < 2; rep++) { /* the second product reuses what the first read */
        c->ref->rmsnorm(c->ref, xr, NULL, gr, hr, (int)dim, n_tok, 1e-6f);
        c->dut->rmsnorm(c->dut, xd, NULL, gd, hd, (int)dim, n_tok, 1e-6f);
        for (int m = 0; m < 2; m++) {
            c->ref->matmul(c->ref, &w.r, m, hr, yr, n_tok);
            c->dut->matmul(c->dut, &w.d, m, hd, yd, n_tok);
            double em = cmp_bufs(c, yr, yd, no);
            e = em > e ? em : e;
        }
        /* act_mul(h, x) -> h, then a product of h */
        c->ref->act_mul(c->ref, rep ? ST_ACT_GELU : ST_ACT_SILU, hr, xr, hr, (int64_t)n);
        c->dut->act_mul(c->dut, rep ? ST_ACT_GELU : ST_ACT_SILU, hd, xd, hd, (int64_t)n);
        c->ref->matmul(c->ref, &w.r, 1, hr, yr, n_tok);
        c->dut->matmul(c->dut, &w.d, 1, hd, yd, n_tok);
        double em = cmp_bufs(c, yr, yd, no);
        e = em > e ? em : e;
    }
    report(c, "chain", e, 2e-3, 0, "%s, rmsnorm -> 2 products, act_mul -> product, %lld -> %lld, %d tokens",
           qt_get(t)->name, (long long)dim, (long long)n_out, n_tok);
    void *b[][2] = {{xr, xd}, {gr, gd}, {hr, hd}, {yr, yd}};
    for (int i = 0; i < 4; i++) c->ref->free(c->ref, b[i][0]), c->dut->free(c->dut, b[i][1]);
    st_free(x), st_free(g);
    free_weight(c, &w);
}

/* with_res: the residual form (x += res, then the norm): both the norm and
 * the updated x are compared. */
static void check_rmsnorm(chk *c, int dim, int rows, int in_place, int with_res) {
    size_t n = (size_t)dim * rows;
    float *x = rand_host(c, n, 2.0f), *w = rand_host(c, (size_t)dim, 1.0f), *r = rand_host(c, n, 1.0f);
    void *xr = put(c->ref, x, n * 4), *xd = put(c->dut, x, n * 4);
    void *wr = put(c->ref, w, (size_t)dim * 4), *wd = put(c->dut, w, (size_t)dim * 4);
    void *rr = with_res ? put(c->ref, r, n * 4) : NULL, *rd = with_res ? put(c->dut, r, n * 4) : NULL;
    void *yr = in_place ? xr : put(c->ref, NULL, n * 4), *yd = in_place ? xd : put(c->dut, NULL, n * 4);
    c->ref->rmsnorm(c->ref, xr, rr, wr, yr, dim, rows, 1e-6f);
    double t0 = now_ms();
    c->dut->rmsnorm(c->dut, xd, rd, wd, yd, dim, rows, 1e-6f);
    double e = cmp_bufs(c, yr, yd, n);
    if (with_res && !in_place) {
        double ex = cmp_bufs(c, xr, xd, n);
        e = ex > e ? ex : e;
    }
    report(c, "rmsnorm", e, 1e-10, now_ms() - t0, "%d rows of %d%s%s", rows, dim, in_place ? ", in place" : "",
           with_res ? ", residual added first" : "");
    if (!in_place) c->ref->free(c->ref, yr), c->dut->free(c->dut, yd);
    if (with_res) c->ref->free(c->ref, rr), c->dut->free(c->dut, rd);
    c->ref->free(c->ref, xr), c->dut->free(c->dut, xd), c->ref->free(c->ref, wr), c->dut->free(c->dut, wd);
    st_free(x);
    st_free(w);
    st_free(r);
}

static void check_elementwise(chk *c, int64_t n, int dim) {
    float *g = rand_host(c, (size_t)n, 2.0f), *u = rand_host(c, (size_t)n, 1.0f);
    void *gr = put(c->ref, g, (size_t)n * 4), *gd = put(c->dut, g, (size_t)n * 4);
    void *ur = put(c->ref, u, (size_t)n * 4), *ud = put(c->dut, u, (size_t)n * 4);
    void *or_ = put(c->ref, NULL, (size_t)n * 4), *od = put(c->dut, NULL, (size_t)n * 4);
    for (int a = 0; a < 2; a++) {
        c->ref->act_mul(c->ref, (st_act)a, gr, ur, or_, n);
        double t0 = now_ms();
        c->dut->act_mul(c->dut, (st_act)a, gd, ud, od, n);
        report(c, "act_mul", cmp_bufs(c, or_, od, (size_t)n), 1e-10, now_ms() - t0, "%s, %lld values",
               a == ST_ACT_SILU ? "silu" : "gelu", (long long)n);
    }
    /* add: a bias row over n/dim rows, then a whole-tensor residual (n_rows = 1) */
    c->ref->add(c->ref, gr, ur, dim, (int)(n / dim));
    double t0 = now_ms();
    c->dut->add(c->dut, gd, ud, dim, (int)(n / dim));
    report(c, "add", cmp_bufs(c, gr, gd, (size_t)n), 1e-12, now_ms() - t0, "bias of %d over %lld rows", dim,
           (long long)(n / dim));
    c->ref->add(c->ref, gr, ur, n, 1);
    c->dut->add(c->dut, gd, ud, n, 1);
    report(c, "add", cmp_bufs(c, gr, gd, (size_t)n), 1e-12, 0, "residual of %lld values", (long long)n);
    c->ref->scale(c->ref, gr, 0.37f, n);
    c->dut->scale(c->dut, gd, 0.37f, n);
    report(c, "scale", cmp_bufs(c, gr, gd, (size_t)n), 1e-12, 0, "%lld values", (long long)n);
    void *bufs[][2] = {{gr, gd}, {ur, ud}, {or_, od}};
    for (int i = 0; i < 3; i++) c->ref->free(c->ref, bufs[i][0]), c->dut->free(c->dut, bufs[i][1]);
    st_free(g);
    st_free(u);
}

static st_kv_layer make_kv(st_backend *be, st_kv_type t, int n_ctx, int hkv, int hd) {
    st_kv_layer kv = {.type = t, .n_ctx = n_ctx, .n_head_kv = hkv, .head_dim = hd};
    size_t elems = (size_t)n_ctx * hkv * hd, es = t == ST_KV_F16 ? 2 : 1;
    kv.k = put(be, NULL, elems * es);
    kv.v = put(be, NULL, elems * es);
    if (t == ST_KV_INT8) {
        kv.k_scale = put(be, NULL, (size_t)n_ctx * hkv * 4);
        kv.v_scale = put(be, NULL, (size_t)n_ctx * hkv * 4);
    }
    return kv;
}

static void free_kv(st_backend *be, st_kv_layer *kv) {
    void *p[] = {kv->k, kv->v, kv->k_scale, kv->v_scale};
    for (int i = 0; i < 4; i++)
        if (p[i]) be->free(be, p[i]);
}

/* n_tok rows of k and v (f32, this backend's) into the cache at positions
 * pos0..: the engine's qkv_prep with no head norms and no rotation (a
 * position scale of 0 turns every pair by exactly 0), so the rows go in as
 * given. q: scratch of n_tok x head_dim. */
static void kv_fill(st_backend *be, st_kv_layer *kv, float *q, float *k, const float *v, int n_tok, int pos0) {
    const st_rope none = {10000.0f, 0.0f, 0, NULL, 0};
    be->qkv_prep(be, q, k, v, NULL, NULL, 1e-6f, n_tok, 1, &none, kv, pos0);
}

/* The rotary embedding of qkv_prep on x as its queries [n_tok][heads][hd]
 * at positions pos0.. (k: one head, cached in a cache of pos0 + n_tok rows). */
static void check_rope(chk *c, int n_tok, int heads, int hd, int pos0, float theta, float fs, int neox) {
    size_t n = (size_t)n_tok * heads * hd, nk = (size_t)n_tok * hd;
    float *x = rand_host(c, n, 1.0f), *k = rand_host(c, nk, 1.0f);
    void *xr = put(c->ref, x, n * 4), *xd = put(c->dut, x, n * 4);
    void *kr = put(c->ref, k, nk * 4), *kd = put(c->dut, k, nk * 4);
    st_kv_layer cr = make_kv(c->ref, ST_KV_F16, pos0 + n_tok, 1, hd),
                cd = make_kv(c->dut, ST_KV_F16, pos0 + n_tok, 1, hd);
    const st_rope r = {theta, fs, neox, NULL, 0};
    c->ref->qkv_prep(c->ref, xr, kr, kr, NULL, NULL, 1e-6f, n_tok, heads, &r, &cr, pos0);
    double t0 = now_ms();
    c->dut->qkv_prep(c->dut, xd, kd, kd, NULL, NULL, 1e-6f, n_tok, heads, &r, &cd, pos0);
    double e = cmp_bufs(c, xr, xd, n);
    report(c, "rope", e, 1e-10, now_ms() - t0, "%s, %d tokens x %d heads x %d, pos %d, theta %g, scale %g (qkv_prep)",
           neox ? "neox" : "normal", n_tok, heads, hd, pos0, theta, fs);
    c->ref->free(c->ref, xr), c->dut->free(c->dut, xd), c->ref->free(c->ref, kr), c->dut->free(c->dut, kd);
    free_kv(c->ref, &cr), free_kv(c->dut, &cd);
    st_free(x), st_free(k);
}

/* Stored caches compared as dequantized values (f16 must be bit-equal; an
 * int8 value may differ by one step where x*127/amax lands on a tie). */
static double kv_diff(chk *c, const st_kv_layer *r, const st_kv_layer *d, int npos, int which) {
    size_t row = (size_t)r->n_head_kv * r->head_dim, n = row * npos;
    size_t es = r->type == ST_KV_F16 ? 2 : 1;
    uint8_t *a = st_malloc(n * es), *b = st_malloc(n * es);
    float *fa = st_malloc(n * 4), *fb = st_malloc(n * 4);
    c->ref->to_host(c->ref, a, which ? r->v : r->k, n * es);
    c->dut->to_host(c->dut, b, which ? d->v : d->k, n * es);
    float *sa = NULL, *sb = NULL;
    if (r->type == ST_KV_INT8) {
        sa = get(c->ref, which ? r->v_scale : r->k_scale, (size_t)npos * r->n_head_kv);
        sb = get(c->dut, which ? d->v_scale : d->k_scale, (size_t)npos * r->n_head_kv);
    }
    for (size_t i = 0; i < n; i++) {
        if (r->type == ST_KV_F16) {
            uint16_t x, y;
            memcpy(&x, a + 2 * i, 2);
            memcpy(&y, b + 2 * i, 2);
            fa[i] = (float)x; /* bit patterns: equal or not */
            fb[i] = (float)y;
        } else {
            size_t s = i / r->head_dim;
            fa[i] = sa[s] * (float)(int8_t)a[i];
            fb[i] = sb[s] * (float)(int8_t)b[i];
        }
    }
    double e = nmse(fb, fa, n);
    st_free(a), st_free(b), st_free(fa), st_free(fb), st_free(sa), st_free(sb);
    return e;
}

/* sinks: attention_sinks with one sink logit per head (gpt-oss), drawn
 * around the scores' scale with one head's far above them (the sink takes
 * nearly all of that head's weight: the kernels' rescaling must not
 * overflow), and a fourth case, a prompt with a window (gpt-oss's sliding
 * layers read prompts so). */
static void check_attention_x(chk *c, st_kv_type t, int n_ctx, int n_head, int hkv, int hd, int n_prompt, int sinks) {
    const char *tn = t == ST_KV_F16 ? "f16" : "int8";
    st_kv_layer kr = make_kv(c->ref, t, n_ctx, hkv, hd), kd = make_kv(c->dut, t, n_ctx, hkv, hd);
    /* fill positions 0..n_ctx-2 in two writes (the second at an offset), keep the last for decode */
    int fill = n_ctx - 1, first = fill / 3;
    size_t kvw = (size_t)hkv * hd;
    float *k = rand_host(c, (size_t)fill * kvw, 1.0f), *v = rand_host(c, (size_t)fill * kvw, 1.0f);
    void *kr_ = put(c->ref, k, (size_t)fill * kvw * 4), *kd_ = put(c->dut, k, (size_t)fill * kvw * 4);
    void *vr_ = put(c->ref, v, (size_t)fill * kvw * 4), *vd_ = put(c->dut, v, (size_t)fill * kvw * 4);
    void *sr = put(c->ref, NULL, (size_t)fill * hd * 4), *sd = put(c->dut, NULL, (size_t)fill * hd * 4);
    kv_fill(c->ref, &kr, sr, kr_, vr_, first, 0);
    kv_fill(c->dut, &kd, sd, kd_, vd_, first, 0);
    size_t off = (size_t)first * kvw * 4;
    kv_fill(c->ref, &kr, sr, (float *)((uint8_t *)kr_ + off), (float *)((uint8_t *)vr_ + off), fill - first, first);
    double t0 = now_ms();
    kv_fill(c->dut, &kd, sd, (float *)((uint8_t *)kd_ + off), (float *)((uint8_t *)vd_ + off), fill - first, first);
    double ms = now_ms() - t0;
    c->ref->free(c->ref, sr), c->dut->free(c->dut, sd);
    double ek = kv_diff(c, &kr, &kd, fill, 0), ev = kv_diff(c, &kr, &kd, fill, 1);
    report(c, "kv fill", ek > ev ? ek : ev, t == ST_KV_F16 ? 0.0 : 1e-5, ms,
           "%s, %d positions x %d kv heads x %d (qkv_prep unrotated)", tn, fill, hkv, hd);
    double bound = t == ST_KV_F16 ? 1e-9 : 1e-6; /* same cache contents up to int8 ties */
    float scale = 1.0f / sqrtf((float)hd);
    /* decode: the last stored position attends over everything, then with a window;
     * prompt: n_prompt tokens ending at the last stored position, causal */
    int cases[4][3] = {{1, fill - 1, 0},
                       {1, fill - 1, n_ctx / 5},
                       {n_prompt, fill - n_prompt, 0},
                       {n_prompt, fill - n_prompt, n_ctx / 7 + 1}};
    float *sk = sinks ? rand_host(c, (size_t)n_head, 2.0f) : NULL;
    if (sk) sk[n_head / 2] = 40.0f;
    void *skr = sk ? put(c->ref, sk, (size_t)n_head * 4) : NULL, *skd = sk ? put(c->dut, sk, (size_t)n_head * 4) : NULL;
    for (int ci = 0; ci < (sinks ? 4 : 3); ci++) {
        int nt = cases[ci][0], pos0 = cases[ci][1], win = cases[ci][2];
        size_t nq = (size_t)nt * n_head * hd;
        float *q = rand_host(c, nq, 1.0f);
        void *qr = put(c->ref, q, nq * 4), *qd = put(c->dut, q, nq * 4);
        void *or_ = put(c->ref, NULL, nq * 4);
        if (sinks) c->ref->attention_sinks(c->ref, qr, &kr, nt, pos0, n_head, scale, win, skr, or_);
        else c->ref->attention(c->ref, qr, &kr, nt, pos0, n_head, scale, win, or_);
        /* with attention variants (the CUDA backend's) every kernel: per query head, GQA-shared,
         * tensor cores (prompts of 16+ tokens with 64- or 128-wide heads; its f16 rounding of q and
         * of the softmax weights adds ~1e-7 of NMSE: bound 5e-6) */
        const int has = set_variant(c, ST_VARIANT_ATTN, -1) >= 0;
        for (int mode = 0; mode < (has ? 3 : 1); mode++) {
            const int tc = mode == 2 && nt >= 16 && (hd == 64 || hd == 128);
            if (mode == 2 && !tc) continue;       /* the same kernels as mode 1 */
            void *od = put(c->dut, NULL, nq * 4); /* NaN again: each kernel must write every value */
            const int old = has ? set_variant(c, ST_VARIANT_ATTN, mode) : -1;
            t0 = now_ms();
            if (sinks) c->dut->attention_sinks(c->dut, qd, &kd, nt, pos0, n_head, scale, win, skd, od);
            else c->dut->attention(c->dut, qd, &kd, nt, pos0, n_head, scale, win, od);
            double e = cmp_bufs(c, or_, od, nq);
            if (has) set_variant(c, ST_VARIANT_ATTN, old);
            static const char *const kn[] = {", per-head kernel", ", GQA kernel", ", tensor-core kernel"};
            report(c, sinks ? "attention_sinks" : "attention", e, tc ? 5e-6 : bound, now_ms() - t0,
                   "%s, %s %d tokens at pos %d, %d/%d heads x %d, window %d%s", tn, nt == 1 ? "decode" : "prompt", nt,
                   pos0, n_head, hkv, hd, win, has ? kn[mode] : "");
            c->dut->free(c->dut, od);
        }
        c->ref->free(c->ref, qr), c->dut->free(c->dut, qd), c->ref->free(c->ref, or_);
        st_free(q);
    }
    c->ref->free(c->ref, kr_), c->dut->free(c->dut, kd_), c->ref->free(c->ref, vr_), c->dut->free(c->dut, vd_);
    if (sk) c->ref->free(c->ref, skr), c->dut->free(c->dut, skd);
    st_free(sk);
    st_free(k);
    st_free(v);
    free_kv(c->ref, &kr);
    free_kv(c->dut, &kd);
}

static void check_attention(chk *c, st_kv_type t, int n_ctx, int n_head, int hkv, int hd, int n_prompt) {
    check_attention_x(c, t, n_ctx, n_head, hkv, hd, n_prompt, 0);
}

/* moe_ffn with gate/up of type tg and down of type td. skew: every token's
 * logit of expert 0 raised by 8 (it is in every top-k: with more than 64
 * tokens, past one tile of the tensor-core grouped products) and expert 1's
 * lowered by 30 (it gets no tokens). */
static void check_moe(chk *c, int n_tok, int n_expert, int k, int64_t E, int64_t F, int norm_topk, int path, qt_type tg,
                      qt_type td, int skew) {
    const st_moe_gating gt = {ST_GATE_SOFTMAX, norm_topk, NULL, 1.0f, 0, 0};
    wpair g = make_weight(c, tg, E, F, n_expert), u = make_weight(c, tg, E, F, n_expert);
    wpair d = make_weight(c, td, F, E, n_expert);
    float *h = rand_host(c, (size_t)n_tok * E, 1.0f), *l = rand_host(c, (size_t)n_tok * n_expert, 2.0f);
    for (int t = 0; skew && t < n_tok; t++) l[(size_t)t * n_expert] += 8.0f, l[(size_t)t * n_expert + 1] -= 30.0f;
    void *hr = put(c->ref, h, (size_t)n_tok * E * 4), *hd = put(c->dut, h, (size_t)n_tok * E * 4);
    void *lr = put(c->ref, l, (size_t)n_tok * n_expert * 4), *ld = put(c->dut, l, (size_t)n_tok * n_expert * 4);
    void *or_ = put(c->ref, NULL, (size_t)n_tok * E * 4), *od = put(c->dut, NULL, (size_t)n_tok * E * 4);
    c->ref->moe_ffn(c->ref, hr, lr, n_tok, n_expert, k, &gt, ST_ACT_SILU, &g.r, &u.r, &d.r, or_);
    const int old = set_variant(c, ST_VARIANT_MOE_PATH, path);
    double t0 = now_ms();
    c->dut->moe_ffn(c->dut, hd, ld, n_tok, n_expert, k, &gt, ST_ACT_SILU, &g.d, &u.d, &d.d, od);
    double e = cmp_bufs(c, or_, od, (size_t)n_tok * E);
    if (old >= 0) set_variant(c, ST_VARIANT_MOE_PATH, old);
    report(c, "moe_ffn", e, 2e-3, now_ms() - t0, "%s, %d tokens, top-%d of %d, %lld/%lld, %s/%s%s%s",
           path == 1                     ? "expert loop"
           : path == 2 || n_tok * k > 64 ? "grouped"
                                         : "fused decode",
           n_tok, k, n_expert, (long long)E, (long long)F, qt_get(tg)->name, qt_get(td)->name,
           norm_topk ? ", renormalised" : "", skew ? ", one hot and one cold expert" : "");
    void *bufs[][2] = {{hr, hd}, {lr, ld}, {or_, od}};
    for (int i = 0; i < 3; i++) c->ref->free(c->ref, bufs[i][0]), c->dut->free(c->dut, bufs[i][1]);
    st_free(h);
    st_free(l);
    free_weight(c, &g), free_weight(c, &u), free_weight(c, &d);
}

/* gpt-oss's clamped SwiGLU (ST_ACT_SWIGLU_OAI) on values wide enough that
 * about half of them meet a clamp (sd 8 against the limit 7). */
static void check_glu_oai(chk *c, int64_t n) {
    float *g = rand_host(c, (size_t)n, 8.0f), *u = rand_host(c, (size_t)n, 8.0f);
    void *gr = put(c->ref, g, (size_t)n * 4), *gd = put(c->dut, g, (size_t)n * 4);
    void *ur = put(c->ref, u, (size_t)n * 4), *ud = put(c->dut, u, (size_t)n * 4);
    void *or_ = put(c->ref, NULL, (size_t)n * 4), *od = put(c->dut, NULL, (size_t)n * 4);
    c->ref->act_mul(c->ref, ST_ACT_SWIGLU_OAI, gr, ur, or_, n);
    double t0 = now_ms();
    c->dut->act_mul(c->dut, ST_ACT_SWIGLU_OAI, gd, ud, od, n);
    report(c, "act_mul", cmp_bufs(c, or_, od, (size_t)n), 1e-10, now_ms() - t0, "swiglu_oai (clamped), %lld values",
           (long long)n);
    void *bufs[][2] = {{gr, gd}, {ur, ud}, {or_, od}};
    for (int i = 0; i < 3; i++) c->ref->free(c->ref, bufs[i][0]), c->dut->free(c->dut, bufs[i][1]);
    st_free(g), st_free(u);
}

/* Expert biases (st_weight.bias, n_expert rows of n_out) on both backends:
 * gate and up sd 4 (with products of sd ~8, the clamps act on many values),
 * down sd 1. */
static void oai_biases(chk *c, wpair *w, float sd, void **bufs) {
    const size_t n = (size_t)w->r.n_mat * (size_t)w->r.n_out;
    float *b = rand_host(c, n, sd);
    bufs[0] = put(c->ref, b, n * 4), bufs[1] = put(c->dut, b, n * 4);
    w->r.bias = bufs[0], w->d.bias = bufs[1];
    st_free(b);
}

/* gpt-oss's MoE FFN: the experts' biases and the clamped SwiGLU, through
 * the path of check_moe's numbering (0: fused decode kernels when n_tok*k
 * <= 64, else the grouped products; 1: the expert loop; 2: grouped only),
 * renormalised softmax top-k as gpt-oss routes. Bound as check_moe's. */
static void check_moe_oai(chk *c, int n_tok, int n_expert, int k, int64_t E, int64_t F, int path, qt_type tg,
                          qt_type td) {
    const st_moe_gating gt = {ST_GATE_SOFTMAX, 1, NULL, 1.0f, 0, 0};
    wpair g = make_weight(c, tg, E, F, n_expert), u = make_weight(c, tg, E, F, n_expert);
    wpair d = make_weight(c, td, F, E, n_expert);
    void *bb[3][2];
    oai_biases(c, &g, 4.0f, bb[0]), oai_biases(c, &u, 4.0f, bb[1]), oai_biases(c, &d, 1.0f, bb[2]);
    float *h = rand_host(c, (size_t)n_tok * E, 1.0f), *l = rand_host(c, (size_t)n_tok * n_expert, 2.0f);
    void *hr = put(c->ref, h, (size_t)n_tok * E * 4), *hd = put(c->dut, h, (size_t)n_tok * E * 4);
    void *lr = put(c->ref, l, (size_t)n_tok * n_expert * 4), *ld = put(c->dut, l, (size_t)n_tok * n_expert * 4);
    void *or_ = put(c->ref, NULL, (size_t)n_tok * E * 4), *od = put(c->dut, NULL, (size_t)n_tok * E * 4);
    c->ref->moe_ffn(c->ref, hr, lr, n_tok, n_expert, k, &gt, ST_ACT_SWIGLU_OAI, &g.r, &u.r, &d.r, or_);
    const int old = set_variant(c, ST_VARIANT_MOE_PATH, path);
    double t0 = now_ms();
    c->dut->moe_ffn(c->dut, hd, ld, n_tok, n_expert, k, &gt, ST_ACT_SWIGLU_OAI, &g.d, &u.d, &d.d, od);
    double e = cmp_bufs(c, or_, od, (size_t)n_tok * E);
    if (old >= 0) set_variant(c, ST_VARIANT_MOE_PATH, old);
    report(c, "moe_ffn", e, 2e-3, now_ms() - t0, "%s, %d tokens, top-%d of %d, %lld/%lld, %s/%s, biases, swiglu_oai",
           path == 1                     ? "expert loop"
           : path == 2 || n_tok * k > 64 ? "grouped"
                                         : "fused decode",
           n_tok, k, n_expert, (long long)E, (long long)F, qt_get(tg)->name, qt_get(td)->name);
    void *bufs[][2] = {{hr, hd}, {lr, ld}, {or_, od}, {bb[0][0], bb[0][1]}, {bb[1][0], bb[1][1]}, {bb[2][0], bb[2][1]}};
    for (int i = 0; i < 6; i++) c->ref->free(c->ref, bufs[i][0]), c->dut->free(c->dut, bufs[i][1]);
    st_free(h), st_free(l);
    free_weight(c, &g), free_weight(c, &u), free_weight(c, &d);
}

/* The seam's expert half as the expert lanes call it for the device's
 * pairs: the even experts cached, in reversed slots (slot n-1-e holds expert
 * e), the odd ones computed elsewhere (emap -1: they add nothing). The
 * biases are indexed by expert id, not by slot: a kernel that took the slot
 * reads another expert's bias. The reference computes the same pairs from
 * its unpermuted experts. Routing from the reference (both sides the same
 * pairs). n_tok*k <= 64: the fused kernels, else the grouped products. */
static void check_moe_experts_oai(chk *c, int n_tok, int n_expert, int k, int64_t E, int64_t F, qt_type tg,
                                  qt_type td) {
    const st_moe_gating gt = {ST_GATE_SOFTMAX, 1, NULL, 1.0f, 0, 0};
    wpair w[3] = {make_weight(c, tg, E, F, n_expert), make_weight(c, tg, E, F, n_expert),
                  make_weight(c, td, F, E, n_expert)};
    void *bb[3][2];
    for (int i = 0; i < 3; i++) {
        oai_biases(c, &w[i], i < 2 ? 4.0f : 1.0f, bb[i]);
        /* the device's copy with its matrices in reversed order */
        const size_t mb = (size_t)w[i].r.n_out * w[i].r.row_bytes, all = mb * (size_t)n_expert;
        uint8_t *q = st_malloc(all), *rv = st_malloc(all);
        c->ref->to_host(c->ref, q, w[i].rp, all);
        for (int e = 0; e < n_expert; e++) memcpy(rv + (size_t)(n_expert - 1 - e) * mb, q + (size_t)e * mb, mb);
        c->dut->to_device(c->dut, w[i].dp, rv, all);
        st_free(q), st_free(rv);
    }
    int32_t *mr = st_malloc((size_t)n_expert * 4), *md = st_malloc((size_t)n_expert * 4);
    for (int e = 0; e < n_expert; e++) mr[e] = e % 2 ? -1 : e, md[e] = e % 2 ? -1 : n_expert - 1 - e;
    const size_t nk = (size_t)n_tok * k;
    float *h = rand_host(c, (size_t)n_tok * E, 1.0f), *l = rand_host(c, (size_t)n_tok * n_expert, 2.0f);
    int32_t *sel = st_malloc(nk * 4);
    float *wsel = st_malloc(nk * 4);
    c->ref->moe_route(c->ref, l, n_tok, n_expert, k, &gt, sel, wsel); /* the CPU's memory is the host's */
    void *b[6][2]; /* h, sel, wsel, the reference's map, the device's map, out */
    const void *init[5] = {h, sel, wsel, mr, md};
    const size_t sz[6] = {(size_t)n_tok * E * 4, nk * 4, nk * 4, (size_t)n_expert * 4, (size_t)n_expert * 4,
                          (size_t)n_tok * E * 4};
    for (int i = 0; i < 6; i++)
        b[i][0] = put(c->ref, i < 5 ? init[i] : NULL, sz[i]), b[i][1] = put(c->dut, i < 5 ? init[i] : NULL, sz[i]);
    c->ref->moe_experts(c->ref, b[0][0], n_tok, n_expert, k, b[1][0], b[2][0], b[3][0], ST_ACT_SWIGLU_OAI, &w[0].r,
                        &w[1].r, &w[2].r, b[5][0]);
    double t0 = now_ms();
    c->dut->moe_experts(c->dut, b[0][1], n_tok, n_expert, k, b[1][1], b[2][1], b[4][1], ST_ACT_SWIGLU_OAI, &w[0].d,
                        &w[1].d, &w[2].d, b[5][1]);
    double e = cmp_bufs(c, b[5][0], b[5][1], (size_t)n_tok * E);
    report(c, "moe_experts", e, 2e-3, now_ms() - t0,
           "%s, %d tokens, top-%d of %d, %lld/%lld, %s/%s, even experts in reversed slots, biases, swiglu_oai",
           nk > 64 ? "grouped" : "fused decode", n_tok, k, n_expert, (long long)E, (long long)F, qt_get(tg)->name,
           qt_get(td)->name);
    for (int i = 0; i < 6; i++) c->ref->free(c->ref, b[i][0]), c->dut->free(c->dut, b[i][1]);
    for (int i = 0; i < 3; i++) c->ref->free(c->ref, bb[i][0]), c->dut->free(c->dut, bb[i][1]), free_weight(c, &w[i]);
    st_free(h), st_free(l), st_free(sel), st_free(wsel), st_free(mr), st_free(md);
}

/* qkv_prep: a prompt of n_tok at position 0, then one decode token after it,
 * with and without head norms, with frequency divisors (Llama 3.1's
 * rope_freqs: 1 for the fast pairs up to 8 for the slow ones) or without; q,
 * k and both caches compared. */
static void check_qkv_prep(chk *c, st_kv_type t, int n_tok, int n_head, int hkv, int hd, int norms, int neox,
                           int divs) {
    const char *tn = t == ST_KV_F16 ? "f16" : "int8";
    const int n_ctx = n_tok + 1;
    st_kv_layer kr = make_kv(c->ref, t, n_ctx, hkv, hd), kd = make_kv(c->dut, t, n_ctx, hkv, hd);
    float *qn = rand_host(c, (size_t)hd, 1.0f), *kn = rand_host(c, (size_t)hd, 1.0f);
    void *qnr = put(c->ref, qn, (size_t)hd * 4), *qnd = put(c->dut, qn, (size_t)hd * 4);
    void *knr = put(c->ref, kn, (size_t)hd * 4), *knd = put(c->dut, kn, (size_t)hd * 4);
    float *dv = st_malloc((size_t)hd / 2 * sizeof(float));
    for (int i = 0; i < hd / 2; i++) dv[i] = 1.0f + 7.0f * (float)i / (float)(hd / 2 - 1);
    void *dvr = put(c->ref, dv, (size_t)hd / 2 * 4), *dvd = put(c->dut, dv, (size_t)hd / 2 * 4);
    st_rope rope = {1e6f, 1.0f, neox, divs ? dvr : NULL, 0}, roped = {1e6f, 1.0f, neox, divs ? dvd : NULL, 0};
    double eq = 0, ek = 0, ms = 0;
    for (int step = 0; step < 2; step++) {
        int nt = step ? 1 : n_tok, pos0 = step ? n_tok : 0;
        size_t nq = (size_t)nt * n_head * hd, nk = (size_t)nt * hkv * hd;
        float *q = rand_host(c, nq, 1.0f), *k = rand_host(c, nk, 1.0f), *v = rand_host(c, nk, 1.0f);
        void *qr = put(c->ref, q, nq * 4), *qd = put(c->dut, q, nq * 4), *kr_ = put(c->ref, k, nk * 4);
        void *kd_ = put(c->dut, k, nk * 4), *vr = put(c->ref, v, nk * 4), *vd = put(c->dut, v, nk * 4);
        c->ref->qkv_prep(c->ref, qr, kr_, vr, norms ? qnr : NULL, norms ? knr : NULL, 1e-6f, nt, n_head, &rope, &kr,
                         pos0);
        double t0 = now_ms();
        c->dut->qkv_prep(c->dut, qd, kd_, vd, norms ? qnd : NULL, norms ? knd : NULL, 1e-6f, nt, n_head, &roped, &kd,
                         pos0);
        ms += now_ms() - t0;
        double e1 = cmp_bufs(c, qr, qd, nq), e2 = cmp_bufs(c, kr_, kd_, nk);
        eq = e1 > eq ? e1 : eq;
        ek = e2 > ek ? e2 : ek;
        void *b[][2] = {{qr, qd}, {kr_, kd_}, {vr, vd}};
        for (int i = 0; i < 3; i++) c->ref->free(c->ref, b[i][0]), c->dut->free(c->dut, b[i][1]);
        st_free(q), st_free(k), st_free(v);
    }
    double ck = kv_diff(c, &kr, &kd, n_ctx, 0), cv = kv_diff(c, &kr, &kd, n_ctx, 1);
    double e = eq > ek ? eq : ek;
    e = e > ck ? e : ck;
    e = e > cv ? e : cv;
    report(c, "qkv_prep", e, t == ST_KV_F16 ? 1e-9 : 1e-5, ms, "%s, %s%s%s, %d+1 tokens, %d/%d heads x %d", tn,
           neox ? "neox" : "normal", norms ? ", head norms" : "", divs ? ", frequency divisors" : "", n_tok, n_head,
           hkv, hd);
    c->ref->free(c->ref, dvr), c->dut->free(c->dut, dvd);
    st_free(dv);
    free_kv(c->ref, &kr), free_kv(c->dut, &kd);
    c->ref->free(c->ref, qnr), c->dut->free(c->dut, qnd), c->ref->free(c->ref, knr), c->dut->free(c->dut, knd);
    st_free(qn), st_free(kn);
}

static int desc_float(const void *a, const void *b) {
    const float x = *(const float *)a, y = *(const float *)b;
    return (x < y) - (x > y);
}

/* The least gap, over the tokens, between the k-th and the (k+1)-th
 * largest router logits, in units of the logits' RMS: how far the routing
 * is from a choice that noise in h could flip. */
static double route_margin(const float *r, int n_tok, int n_expert, int k) {
    double ss = 0, least = INFINITY;
    for (size_t i = 0; i < (size_t)n_tok * n_expert; i++) ss += (double)r[i] * r[i];
    const double rms = sqrt(ss / ((double)n_tok * n_expert));
    float *row = st_malloc((size_t)n_expert * sizeof(float));
    for (int t = 0; t < n_tok && k < n_expert; t++) {
        memcpy(row, r + (size_t)t * n_expert, (size_t)n_expert * sizeof(float));
        qsort(row, (size_t)n_expert, sizeof(float), desc_float);
        least = fmin(least, (row[k - 1] - row[k]) / (rms > 0 ? rms : 1.0));
    }
    st_free(row);
    return least;
}

/* One decode layer's products and norms as the forward pass calls them,
 * fused ops where a GPU backend fuses (the CUDA backend):
 *   o = Wo a; x += o, h = norm(x); r = Wr h   (matmul_res_norm: FUSE bit 4)
 *   m = moe(h, r)                             (routing in the MoE kernel)
 *   x += m, h2 = norm(x)                      (the next layer's attention norm)
 *   q, k, v = Wq h2, Wk h2, Wv h2             (matmul_multi: FUSE bit 1)
 * x, h, the router logits, m, h2, q, k and v compared. tq: wo, q, k; tv: v.
 * fuse >= 0: a backend with the ST_VARIANT_FUSE variant runs it with those bits (0: each
 * fused op as its composition).
 * The inputs are drawn again while the reference's routing has a near-tie
 * (route_margin below 0.1): there the two sides may rightly choose
 * different experts, which is not the error this check measures (check_moe
 * checks the routing). */
static void check_decode_layer(chk *c, qt_type tq, qt_type tv, int64_t dim, int64_t qw, int64_t kvw, int n_expert,
                               int k, int64_t F, int n_tok, int fuse) {
    wpair wo = make_weight(c, tq, qw, dim, 1), wq = make_weight(c, tq, dim, qw, 1),
          wk = make_weight(c, tq, dim, kvw, 1);
    wpair wv = make_weight(c, tv, dim, kvw, 1), wr = make_weight(c, QT_F32, dim, n_expert, 1);
    wpair g = make_weight(c, QT_Q4_K, dim, F, n_expert), u = make_weight(c, QT_Q4_K, dim, F, n_expert);
    wpair d = make_weight(c, QT_Q6_K, F, dim, n_expert);
    const size_t nx = (size_t)n_tok * dim, nq = (size_t)n_tok * qw, nk = (size_t)n_tok * kvw;
    const size_t nr = (size_t)n_tok * n_expert;
    float *hx = rand_host(c, nx, 2.0f), *ha = rand_host(c, nq, 1.0f), *hn = rand_host(c, (size_t)dim, 1.0f);
    float *hn2 = rand_host(c, (size_t)dim, 1.0f);
    void *b[11][2];
    const size_t sz[11] = {nx, nq, (size_t)dim, (size_t)dim, nx, nx, nq, nk, nk, nr, nx};
    const float *init[11] = {hx, ha, hn, hn2, NULL, NULL, NULL, NULL, NULL, NULL, NULL};
    for (int i = 0; i < 11; i++) b[i][0] = put(c->ref, init[i], sz[i] * 4), b[i][1] = put(c->dut, init[i], sz[i] * 4);
    enum { X, A, N1, N2, O, H, Q, K, V, R, M };
    double t0 = now_ms();
    const int set_fuse = fuse >= 0 && set_variant(c, ST_VARIANT_FUSE, -1) >= 0;
    double margin = 0;
    int tries = 1;
    for (int side = 0; side < 2; side++) {
        st_backend *be = side ? c->dut : c->ref;
        const int old_fuse = side && set_fuse ? set_variant(c, ST_VARIANT_FUSE, fuse) : -1;
#define B(i) ((float *)b[i][side])
        const wpair *w[] = {&wo, &wq, &wk, &wv, &wr, &g, &u, &d};
        const st_weight *W[8];
        for (int i = 0; i < 8; i++) W[i] = side ? &w[i]->d : &w[i]->r;
        be->matmul_res_norm(be, W[0], B(A), B(O), B(X), B(N1), 1e-6f, B(H), W[4], B(R), n_tok);
        const st_moe_gating gt = {ST_GATE_SOFTMAX, 1, NULL, 1.0f, 0, 0};
        be->moe_ffn(be, B(H), B(R), n_tok, n_expert, k, &gt, ST_ACT_SILU, W[5], W[6], W[7], B(M));
        be->rmsnorm(be, B(X), B(M), B(N2), B(A), (int)dim, n_tok, 1e-6f); /* h2 into a's buffer, as layers reuse them */
        float *qkv[] = {B(Q), B(K), B(V)};
        be->matmul_multi(be, 3, W + 1, B(A), qkv, n_tok);
        if (old_fuse >= 0) set_variant(c, ST_VARIANT_FUSE, old_fuse);
#undef B
        if (side == 0) {
            float *r = get(c->ref, b[R][0], nr);
            margin = route_margin(r, n_tok, n_expert, k);
            st_free(r);
            if (margin < 0.1 &&
                tries++ < 20) { /* a near-tie: other x and a, on both sides, and run the reference again */
                st_free(hx), st_free(ha);
                hx = rand_host(c, nx, 2.0f), ha = rand_host(c, nq, 1.0f);
                for (int sd = 0; sd < 2; sd++) {
                    st_backend *bs = sd ? c->dut : c->ref;
                    bs->to_device(bs, b[X][sd], hx, nx * 4);
                    bs->to_device(bs, b[A][sd], ha, nq * 4);
                }
                side = -1;
            }
        }
    }
    const double ms = now_ms() - t0;
    static const char *nm[] = {"x", "h2", "", "", "o", "h", "q", "k", "v", "router", "moe"};
    double e = 0, e2 = 0; /* the worst and the next */
    const char *worst = "", *next = "";
    for (int i = 0; i < 11; i++) {
        if (i == N1 || i == N2) continue;
        const size_t n = i == A ? nx : sz[i]; /* h2 fills the first n_tok x dim values of a */
        const double ei = cmp_bufs(c, b[i][0], b[i][1], n);
        if (ei > e || !worst[0]) e2 = e, next = worst, e = ei, worst = nm[i];
        else if (ei > e2 || !next[0]) e2 = ei, next = nm[i];
    }
    /* 6e-3: the chain holds five quantized-activation steps whose errors
     * stack, and the CPU reference takes 8-bit activations of its own (256
     * per scale for the K-quants against the GPU's 32), so the two sides'
     * noise adds. Measured: the CPU's own 8-bit mode against its f32 mode
     * (STRATA_PRECISE) up to 3.0e-3 on these cases; on an H200 the GPU
     * against the f32 CPU 1.31e-3 where it was 2.99e-3 against the default
     * CPU (the same with every fusion off and with the unfused MoE kernels,
     * so no fusion adds to it); over 40 GPU cases of two runs (routing
     * margins >= 0.1) 4e-4 to 4.14e-3. A wrong kernel is off by 1e-1 or more. */
    char fz[16] = "";
    if (set_fuse) snprintf(fz, sizeof fz, ", fuse %d", fuse);
    report(c, "decode layer", e, 6e-3, ms,
           "%s/%s, %lld wide, %d tokens, top-%d of %d%s (worst: %s; next: %s %.2g; routing margin %.2f%s)",
           qt_get(tq)->name, qt_get(tv)->name, (long long)dim, n_tok, k, n_expert, fz, worst, next, e2, margin,
           margin < 0.1 ? ", a near-tie kept after 20 draws" : "");
    for (int i = 0; i < 11; i++) c->ref->free(c->ref, b[i][0]), c->dut->free(c->dut, b[i][1]);
    st_free(hx), st_free(ha), st_free(hn), st_free(hn2);
    wpair *all[] = {&wo, &wq, &wk, &wv, &wr, &g, &u, &d};
    for (int i = 0; i < 8; i++) free_weight(c, all[i]);
}

/* top_k (the sampler's candidates) on the device under test against a plain
 * host reference: k rounds of a linear scan for the best value after the
 * previous pick (larger first, equal values by the lower index, NaNs never).
 * levels > 0: values drawn from that many levels, so that ties are
 * everywhere; nans: that many NaNs, the first at index 0 and the best value
 * beside it in the same thread's slots. Exact: the mismatching places are
 * the error (bound 0). */
static void check_top_k(chk *c, int n, int k, int levels, int nans) {
    if (!c->dut->top_k) return;
    float *x = rand_host(c, (size_t)n, 3.0f);
    for (int i = 0; levels && i < n; i++) x[i] = (float)(next_u64(c) % (uint64_t)levels) * 0.5f;
    for (int j = 0; j < nans; j++) x[j ? next_u64(c) % (uint64_t)n : 0] = NAN;
    if (nans && n > 256) x[256] = 100.0f; /* stage 1 holds index 256 in thread 0, beside index 0 */
    void *xd = put(c->dut, x, (size_t)n * 4);
    int32_t *ids = st_malloc((size_t)k * sizeof(int32_t)), *ref = st_malloc((size_t)k * sizeof(int32_t));
    float *vals = st_malloc((size_t)k * sizeof(float));
    double t0 = now_ms();
    const int rc = c->dut->top_k(c->dut, xd, n, k, ids, vals);
    const double ms = now_ms() - t0;
    int last = -1, bad = rc != 0 ? k : 0;
    for (int j = 0; j < k && rc == 0; j++) {
        int b = -1;
        for (int i = 0; i < n; i++) {
            if (isnan(x[i])) continue;
            const int after = last < 0 || x[i] < x[last] || (x[i] == x[last] && i > last);
            if (after && (b < 0 || x[i] > x[b] || (x[i] == x[b] && i < b))) b = i;
        }
        ref[j] = b;
        last = b;
        bad += ids[j] != ref[j] || (b >= 0 && vals[j] != x[b]);
    }
    report(c, "top_k", bad, 0, ms, "%d of %d values%s%s%s", k, n, levels ? ", ties everywhere" : "",
           nans ? ", NaNs among them" : "", rc ? ": refused" : "");
    c->dut->free(c->dut, xd);
    st_free(x), st_free(ids), st_free(ref), st_free(vals);
}

/* upload_many against the bytes given: 40 ranges (past one launch's 32) of
 * odd sizes at odd offsets in page-locked memory, into a poisoned buffer,
 * and the bytes between them untouched. */
static void check_upload_many(chk *c) {
    st_backend *be = c->dut;
    if (!be->upload_many || !be->host_register) return;
    enum { N = 40 };
    const size_t cap = (size_t)2 << 20;
    uint8_t *h = aligned_alloc(4096, cap), *back = st_malloc(cap), *want = st_malloc(cap);
    for (size_t i = 0; i < cap; i++) h[i] = (uint8_t)next_u64(c);
    if (be->host_register(be, h, cap) != 0) {
        report(c, "upload_many", INFINITY, 0, 0, "host_register refused: %s", st_error_get());
        free(h), st_free(back), st_free(want);
        return;
    }
    uint8_t *d = put(be, NULL, cap);
    memset(want, 0xff, cap);
    void *dst[N];
    const void *src[N];
    size_t bytes[N], off = 0;
    static const size_t sizes[] = {1, 15, 16, 17, 4099, 65536, 300001, 31};
    for (int i = 0; i < N; i++) {
        bytes[i] = sizes[i % 8] + (size_t)(i / 8);
        const size_t so = (size_t)(next_u64(c) % (cap - bytes[i]));
        off += (size_t)(next_u64(c) % 40); /* gaps that must stay poisoned; 16-aligned or not */
        ST_ASSERT(off + bytes[i] <= cap);
        src[i] = h + so, dst[i] = d + off;
        memcpy(want + off, h + so, bytes[i]);
        off += bytes[i];
    }
    const double t0 = now_ms();
    be->upload_many(be, N, dst, src, bytes);
    be->to_host(be, back, d, cap);
    size_t bad = 0;
    for (size_t i = 0; i < cap; i++) bad += back[i] != want[i];
    report(c, "upload_many", (double)bad, 0, now_ms() - t0, "%d ranges, %zu bytes (bytes wrong)", N, off);
    be->free(be, d);
    be->host_unregister(be, h);
    free(h), st_free(back), st_free(want);
}

/* ---- glm4moe and deepseek2: every routing rule, copy_2d, partial rotary,
 * and multi-head latent attention's one shared 576-wide row ---- */

/* A routing rule of the checks below; bias drawn per check. */
typedef struct {
    const char *name;
    st_gate_fn fn;
    int norm, bias;
    float scale;
    int n_group, n_group_used;
} gating_case;

static const gating_case GATINGS[] = {
    {"softmax", ST_GATE_SOFTMAX, 0, 0, 1.0f, 0, 0},
    {"sigmoid, renormalised", ST_GATE_SIGMOID, 1, 0, 1.0f, 0, 0},
    {"sigmoid + bias, scale 2.5 (glm4moe)", ST_GATE_SIGMOID, 1, 1, 2.5f, 0, 0},
    {"sigmoid + bias, 8 groups keep 4, scale 2.5 (deepseek-v3)", ST_GATE_SIGMOID, 1, 1, 2.5f, 8, 4},
    {"softmax, 8 groups keep 3, scale 16 (deepseek-v2)", ST_GATE_SOFTMAX, 0, 0, 16.0f, 8, 3},
    {"sigmoid + bias, 4 groups keep 1, not renormalised", ST_GATE_SIGMOID, 0, 1, 1.0f, 4, 1},
};
#define N_GATINGS (sizeof GATINGS / sizeof GATINGS[0])

/* moe_route alone, exact: the same experts in the same order, weights within
 * 4e-6 relative (p = softmax or sigmoid with another exp; the sums in float
 * on the GPU, double on the CPU). levels > 0: logits from that many levels
 * (ties everywhere: the lower id must win on both sides); nans: that many
 * NaN logits (never chosen). The error is the count of places that differ. */
static void check_route(chk *c, const gating_case *g, int n_tok, int n_expert, int k, int levels, int nans) {
    const size_t nl = (size_t)n_tok * n_expert, nk = (size_t)n_tok * k;
    float *l = rand_host(c, nl, 2.0f), *b = rand_host(c, (size_t)n_expert, 0.5f);
    for (size_t i = 0; levels && i < nl; i++) l[i] = (float)(next_u64(c) % (uint64_t)levels) * 0.25f;
    if (levels) /* bias levels too: p + bias keeps the ties */
        for (int e = 0; e < n_expert; e++) b[e] = (float)(next_u64(c) % 3) * 0.5f;
    for (int j = 0; j < nans; j++) l[next_u64(c) % nl] = NAN;
    void *lr = put(c->ref, l, nl * 4), *ld = put(c->dut, l, nl * 4);
    void *br = put(c->ref, b, (size_t)n_expert * 4), *bd = put(c->dut, b, (size_t)n_expert * 4);
    void *sr = put(c->ref, NULL, nk * 4), *sd = put(c->dut, NULL, nk * 4);
    void *wr = put(c->ref, NULL, nk * 4), *wd = put(c->dut, NULL, nk * 4);
    st_moe_gating gr = {g->fn, g->norm, g->bias ? br : NULL, g->scale, g->n_group, g->n_group_used}, gd = gr;
    gd.bias = g->bias ? bd : NULL;
    c->ref->moe_route(c->ref, lr, n_tok, n_expert, k, &gr, sr, wr);
    const double t0 = now_ms();
    c->dut->moe_route(c->dut, ld, n_tok, n_expert, k, &gd, sd, wd);
    const double ms = now_ms() - t0;
    int32_t *si = (int32_t *)get(c->ref, sr, nk), *sj = (int32_t *)get(c->dut, sd, nk);
    float *wi = get(c->ref, wr, nk), *wj = get(c->dut, wd, nk);
    int bad = 0;
    for (size_t i = 0; i < nk; i++) bad += si[i] != sj[i] || fabsf(wi[i] - wj[i]) > 4e-6f * fabsf(wi[i]) + 1e-9f;
    report(c, "moe_route", bad, 0, ms, "%s, %d tokens, top-%d of %d%s%s", g->name, n_tok, k, n_expert,
           levels ? ", ties everywhere" : "", nans ? ", NaN logits" : "");
    void *bufs[][2] = {{lr, ld}, {br, bd}, {sr, sd}, {wr, wd}};
    for (int i = 0; i < 4; i++) c->ref->free(c->ref, bufs[i][0]), c->dut->free(c->dut, bufs[i][1]);
    st_free(l), st_free(b), st_free(si), st_free(sj), st_free(wi), st_free(wj);
}

/* moe_ffn under a routing rule, on every path of a CUDA backend (fused
 * decode with the routing inside its first kernel, the per-expert loop, the
 * grouped products); bound 2e-3 as check_moe. */
static void check_moe_gating(chk *c, const gating_case *g, int n_tok, int n_expert, int k, int64_t E, int64_t F) {
    wpair wg = make_weight(c, QT_Q4_K, E, F, n_expert), wu = make_weight(c, QT_Q4_K, E, F, n_expert);
    wpair wd = make_weight(c, QT_Q6_K, F, E, n_expert);
    float *h = rand_host(c, (size_t)n_tok * E, 1.0f), *l = rand_host(c, (size_t)n_tok * n_expert, 2.0f);
    float *b = rand_host(c, (size_t)n_expert, 0.5f);
    void *hr = put(c->ref, h, (size_t)n_tok * E * 4), *hd = put(c->dut, h, (size_t)n_tok * E * 4);
    void *lr = put(c->ref, l, (size_t)n_tok * n_expert * 4), *ld = put(c->dut, l, (size_t)n_tok * n_expert * 4);
    void *br = put(c->ref, b, (size_t)n_expert * 4), *bd = put(c->dut, b, (size_t)n_expert * 4);
    void *or_ = put(c->ref, NULL, (size_t)n_tok * E * 4);
    st_moe_gating gr = {g->fn, g->norm, g->bias ? br : NULL, g->scale, g->n_group, g->n_group_used}, gd = gr;
    gd.bias = g->bias ? bd : NULL;
    c->ref->moe_ffn(c->ref, hr, lr, n_tok, n_expert, k, &gr, ST_ACT_SILU, &wg.r, &wu.r, &wd.r, or_);
    const int has = set_variant(c, ST_VARIANT_MOE_PATH, -1) >= 0;
    for (int path = 0; path < (has ? 3 : 1); path++) {
        void *od = put(c->dut, NULL, (size_t)n_tok * E * 4);
        const int old = has ? set_variant(c, ST_VARIANT_MOE_PATH, path) : -1;
        const double t0 = now_ms();
        c->dut->moe_ffn(c->dut, hd, ld, n_tok, n_expert, k, &gd, ST_ACT_SILU, &wg.d, &wu.d, &wd.d, od);
        const double e = cmp_bufs(c, or_, od, (size_t)n_tok * E);
        if (has) set_variant(c, ST_VARIANT_MOE_PATH, old);
        report(c, "moe_ffn", e, 2e-3, now_ms() - t0, "%s, %s, %d tokens, top-%d of %d, %lld/%lld",
               path == 1                     ? "expert loop"
               : path == 2 || n_tok * k > 64 ? "grouped"
                                             : "fused decode",
               g->name, n_tok, k, n_expert, (long long)E, (long long)F);
        c->dut->free(c->dut, od);
    }
    void *bufs[][2] = {{hr, hd}, {lr, ld}, {br, bd}};
    for (int i = 0; i < 3; i++) c->ref->free(c->ref, bufs[i][0]), c->dut->free(c->dut, bufs[i][1]);
    c->ref->free(c->ref, or_);
    st_free(h), st_free(l), st_free(b);
    free_weight(c, &wg), free_weight(c, &wu), free_weight(c, &wd);
}

/* copy_2d: a head's slice of every row into a packed matrix (and the other
 * way), the 16-byte path and the scalar one (odd strides); exact. */
static void check_copy_2d(chk *c, int64_t width, int64_t dst_stride, int64_t src_stride, int n_rows, int64_t at) {
    const size_t ns = (size_t)n_rows * src_stride + at, nd = (size_t)n_rows * dst_stride;
    float *s = rand_host(c, ns, 1.0f), *d0 = rand_host(c, nd, 1.0f);
    void *sr = put(c->ref, s, ns * 4), *sd = put(c->dut, s, ns * 4);
    void *dr = put(c->ref, d0, nd * 4), *dd = put(c->dut, d0, nd * 4); /* values between the rows must stay */
    c->ref->copy_2d(c->ref, dr, dst_stride, (const float *)sr + at, src_stride, width, n_rows);
    const double t0 = now_ms();
    c->dut->copy_2d(c->dut, dd, dst_stride, (const float *)sd + at, src_stride, width, n_rows);
    report(c, "copy_2d", cmp_bufs(c, dr, dd, nd), 0, now_ms() - t0,
           "%lld of rows %lld apart (from %lld) into rows %lld apart, %d rows", (long long)width, (long long)src_stride,
           (long long)at, (long long)dst_stride, n_rows);
    c->ref->free(c->ref, sr), c->dut->free(c->dut, sd), c->ref->free(c->ref, dr), c->dut->free(c->dut, dd);
    st_free(s), st_free(d0);
}

/* matmul with ST_MAT_ALL: every matrix of a stack of n_mat on its own input
 * of each row (the per-head products with attn_k_b / attn_v_b); the CPU's
 * form is one product per matrix. Bound 2e-3 as the products. */
static void check_matmul_all(chk *c, qt_type t, int64_t n_in, int64_t n_out, int n_mat, int n_tok) {
    wpair w = make_weight(c, t, n_in, n_out, n_mat);
    const size_t nx = (size_t)n_tok * n_mat * n_in, ny = (size_t)n_tok * n_mat * n_out;
    float *x = rand_host(c, nx, 1.0f);
    void *xr = put(c->ref, x, nx * 4), *xd = put(c->dut, x, nx * 4);
    void *yr = put(c->ref, NULL, ny * 4), *yd = put(c->dut, NULL, ny * 4);
    c->ref->matmul(c->ref, &w.r, ST_MAT_ALL, xr, yr, n_tok);
    const double t0 = now_ms();
    c->dut->matmul(c->dut, &w.d, ST_MAT_ALL, xd, yd, n_tok);
    report(c, "matmul", cmp_bufs(c, yr, yd, ny), 2e-3, now_ms() - t0, "%s, every matrix of %d: %lld -> %lld, %d tokens",
           qt_get(t)->name, n_mat, (long long)n_in, (long long)n_out, n_tok);
    c->ref->free(c->ref, xr), c->dut->free(c->dut, xd), c->ref->free(c->ref, yr), c->dut->free(c->dut, yd);
    st_free(x);
    free_weight(c, &w);
}

/* An MLA layer's cache (kv_cache.c): one array serves as K and V, one int8 scale per row. */
static st_kv_layer make_kv_mla(st_backend *be, st_kv_type t, int n_ctx, int hd) {
    st_kv_layer kv = {.type = t, .n_ctx = n_ctx, .n_head_kv = 1, .head_dim = hd};
    kv.k = kv.v = put(be, NULL, (size_t)n_ctx * hd * (t == ST_KV_F16 ? 2 : 1));
    if (t == ST_KV_INT8) kv.k_scale = kv.v_scale = put(be, NULL, (size_t)n_ctx * 4);
    return kv;
}

static void free_kv_mla(st_backend *be, st_kv_layer *kv) {
    be->free(be, kv->k);
    if (kv->k_scale) be->free(be, kv->k_scale);
}

/* qkv_prep with partial rotary (n_rot of hd values turned: glm4moe's half,
 * deepseek2's 64 of 576), frequency divisors (YaRN's), and for mla the
 * row as its own value row (k passed as v, one cache array): a prompt of
 * n_tok at position 0, then one decode token; q, k and the cache compared. */
static void check_qkv_prep_part(chk *c, st_kv_type t, int n_tok, int n_head, int hkv, int hd, int n_rot, int neox,
                                int norms, int mla) {
    const char *tn = t == ST_KV_F16 ? "f16" : "int8";
    const int n_ctx = n_tok + 1;
    st_kv_layer kr = mla ? make_kv_mla(c->ref, t, n_ctx, hd) : make_kv(c->ref, t, n_ctx, hkv, hd);
    st_kv_layer kd = mla ? make_kv_mla(c->dut, t, n_ctx, hd) : make_kv(c->dut, t, n_ctx, hkv, hd);
    float *qn = rand_host(c, (size_t)hd, 1.0f), *kn = rand_host(c, (size_t)hd, 1.0f);
    void *qnr = put(c->ref, qn, (size_t)hd * 4), *qnd = put(c->dut, qn, (size_t)hd * 4);
    void *knr = put(c->ref, kn, (size_t)hd * 4), *knd = put(c->dut, kn, (size_t)hd * 4);
    float *dv = st_malloc((size_t)n_rot / 2 * sizeof(float));
    for (int i = 0; i < n_rot / 2; i++) dv[i] = 1.0f + 39.0f * (float)i / (float)(n_rot / 2 - 1); /* YaRN x40-like */
    void *dvr = put(c->ref, dv, (size_t)n_rot / 2 * 4), *dvd = put(c->dut, dv, (size_t)n_rot / 2 * 4);
    st_rope rope = {1e4f, 1.0f, neox, dvr, n_rot}, roped = {1e4f, 1.0f, neox, dvd, n_rot};
    double eq = 0, ek = 0, ms = 0;
    for (int step = 0; step < 2; step++) {
        const int nt = step ? 1 : n_tok, pos0 = step ? n_tok : 0;
        const size_t nq = (size_t)nt * n_head * hd, nk = (size_t)nt * hkv * hd;
        float *q = rand_host(c, nq, 1.0f), *k = rand_host(c, nk, 1.0f), *v = rand_host(c, nk, 1.0f);
        void *qr = put(c->ref, q, nq * 4), *qd = put(c->dut, q, nq * 4), *kr_ = put(c->ref, k, nk * 4);
        void *kd_ = put(c->dut, k, nk * 4), *vr = put(c->ref, v, nk * 4), *vd = put(c->dut, v, nk * 4);
        c->ref->qkv_prep(c->ref, qr, kr_, mla ? kr_ : vr, norms ? qnr : NULL, norms ? knr : NULL, 1e-6f, nt, n_head,
                         &rope, &kr, pos0);
        const double t0 = now_ms();
        c->dut->qkv_prep(c->dut, qd, kd_, mla ? kd_ : vd, norms ? qnd : NULL, norms ? knd : NULL, 1e-6f, nt, n_head,
                         &roped, &kd, pos0);
        ms += now_ms() - t0;
        const double e1 = cmp_bufs(c, qr, qd, nq), e2 = cmp_bufs(c, kr_, kd_, nk);
        eq = e1 > eq ? e1 : eq;
        ek = e2 > ek ? e2 : ek;
        void *b[][2] = {{qr, qd}, {kr_, kd_}, {vr, vd}};
        for (int i = 0; i < 3; i++) c->ref->free(c->ref, b[i][0]), c->dut->free(c->dut, b[i][1]);
        st_free(q), st_free(k), st_free(v);
    }
    double e = eq > ek ? eq : ek;
    const double ck = kv_diff(c, &kr, &kd, n_ctx, 0), cv = mla ? 0 : kv_diff(c, &kr, &kd, n_ctx, 1);
    e = e > ck ? e : ck;
    e = e > cv ? e : cv;
    report(c, "qkv_prep", e, t == ST_KV_F16 ? 1e-9 : 1e-5, ms,
           "%s, %s, %d of %d rotated, YaRN-like divisors%s%s, %d+1 tokens, %d/%d heads", tn, neox ? "neox" : "normal",
           n_rot, hd, norms ? ", head norms" : "", mla ? ", latent row (k is v, one array)" : "", n_tok, n_head, hkv);
    c->ref->free(c->ref, dvr), c->dut->free(c->dut, dvd);
    st_free(dv);
    if (mla) free_kv_mla(c->ref, &kr), free_kv_mla(c->dut, &kd);
    else free_kv(c->ref, &kr), free_kv(c->dut, &kd);
    c->ref->free(c->ref, qnr), c->dut->free(c->dut, qnd), c->ref->free(c->ref, knr), c->dut->free(c->dut, knd);
    st_free(qn), st_free(kn);
}

/* Attention over an MLA cache: one 576-wide row per position that is its own
 * value row, n_head query heads on it; decode, decode in a window and a
 * prompt chunk. Bounds as check_attention's. */
static void check_attention_mla(chk *c, st_kv_type t, int n_ctx, int n_head, int hd, int n_prompt) {
    const char *tn = t == ST_KV_F16 ? "f16" : "int8";
    st_kv_layer kr = make_kv_mla(c->ref, t, n_ctx, hd), kd = make_kv_mla(c->dut, t, n_ctx, hd);
    const int fill = n_ctx - 1;
    float *k = rand_host(c, (size_t)fill * hd, 1.0f);
    void *kr_ = put(c->ref, k, (size_t)fill * hd * 4), *kd_ = put(c->dut, k, (size_t)fill * hd * 4);
    /* the rows stored as given (kv_fill: qkv_prep unrotated; k is its own value row) */
    void *sr = put(c->ref, NULL, (size_t)fill * hd * 4), *sd = put(c->dut, NULL, (size_t)fill * hd * 4);
    kv_fill(c->ref, &kr, sr, kr_, kr_, fill, 0);
    kv_fill(c->dut, &kd, sd, kd_, kd_, fill, 0);
    c->ref->free(c->ref, sr), c->dut->free(c->dut, sd);
    const double bound = t == ST_KV_F16 ? 1e-9 : 1e-6;
    const float scale = 1.0f / sqrtf(192.0f);
    const int cases[3][3] = {{1, fill - 1, 0}, {1, fill - 1, n_ctx / 5}, {n_prompt, fill - n_prompt, 0}};
    const int is_cuda = set_variant(c, ST_VARIANT_ATTN, -1) >= 0; /* the latent kernel is a variant there */
    for (int ci = 0; ci < 3; ci++) {
        const int nt = cases[ci][0], pos0 = cases[ci][1], win = cases[ci][2];
        const size_t nq = (size_t)nt * n_head * hd;
        float *q = rand_host(c, nq, 0.3f);
        void *qr = put(c->ref, q, nq * 4), *qd = put(c->dut, q, nq * 4);
        void *or_ = put(c->ref, NULL, nq * 4);
        c->ref->attention(c->ref, qr, &kr, nt, pos0, n_head, scale, win, or_);
        /* on a CUDA backend the latent kernel (the default) and the per-head one (mode 0) */
        for (int mode = 2; mode >= (is_cuda ? 0 : 2); mode -= 2) {
            void *od = put(c->dut, NULL, nq * 4);
            const int old = is_cuda ? set_variant(c, ST_VARIANT_ATTN, mode) : -1;
            const double t0 = now_ms();
            c->dut->attention(c->dut, qd, &kd, nt, pos0, n_head, scale, win, od);
            const double e = cmp_bufs(c, or_, od, nq);
            if (is_cuda) set_variant(c, ST_VARIANT_ATTN, old);
            report(c, "attention", e, bound, now_ms() - t0,
                   "%s, %s %d tokens at pos %d, %d heads on one latent row of %d, window %d%s", tn,
                   nt == 1 ? "decode" : "prompt", nt, pos0, n_head, hd, win,
                   !is_cuda ? ""
                   : mode   ? ", latent kernel"
                            : ", per-head kernel");
            c->dut->free(c->dut, od);
        }
        c->ref->free(c->ref, qr), c->dut->free(c->dut, qd), c->ref->free(c->ref, or_);
        st_free(q);
    }
    c->ref->free(c->ref, kr_), c->dut->free(c->dut, kd_);
    st_free(k);
    free_kv_mla(c->ref, &kr), free_kv_mla(c->dut, &kd);
}

/* The ops glm4moe and deepseek2 add (when the backend under test has them). */
static void check_mla_family(chk *c, int size) {
    if (!(c->dut->moe_gatings & ST_GATINGS_ALL) || !c->dut->copy_2d) return;
    for (size_t i = 0; i < N_GATINGS; i++) {
        check_route(c, &GATINGS[i], 5, 64, 8, 0, 0);
        check_route(c, &GATINGS[i], 3, 256, 8, 4, 0); /* ties */
        if (size) { /* the self-test (tiny shapes) makes one MoE only: its weights are quantized on the CPU */
            check_moe_gating(c, &GATINGS[i], 1, 64, 4, 256, 256);
            check_moe_gating(c, &GATINGS[i], 6, 64, 4, 256, 256);
        }
    }
    if (!size) check_moe_gating(c, &GATINGS[3], 1, 16, 4, 256, 256);
    check_route(c, &GATINGS[3], 33, 256, 8, 0, 0);                    /* deepseek-v3's routing at its size */
    check_route(c, &GATINGS[3], 4, 256, 8, 0, 40);                    /* NaN logits */
    check_route(c, &GATINGS[2], 9, 128, 8, 0, 0);                     /* GLM-4.5-Air's */
    check_route(c, &GATINGS[4], 7, 160, 6, 0, 0);                     /* deepseek-v2's 160 experts, top-6 */
    if (size) check_moe_gating(c, &GATINGS[3], 40, 256, 8, 512, 256); /* a prompt chunk: the grouped products */
    static const qt_type heads_types[] = {QT_Q8_0, QT_F16, QT_Q4_0, QT_F32};
    for (size_t i = 0; i < sizeof heads_types / sizeof heads_types[0]; i++) {
        check_matmul_all(c, heads_types[i], 128, 512, 16, 1);             /* attn_k_b: nope -> latent */
        check_matmul_all(c, heads_types[i], 512, 128, 16, 5);             /* attn_v_b: latent -> values, 80 pairs */
        if (size) check_matmul_all(c, heads_types[i], 128, 512, 16, 100); /* a prompt chunk */
    }
    check_matmul_all(c, QT_Q4_K, 512, 128, 128, size ? 70 : 1); /* deepseek-v3's 128 heads (70: tensor cores) */
    check_copy_2d(c, 64, 576, 9 * 192, 5, 128);                 /* a head's rope part of q (16-byte path) */
    check_copy_2d(c, 512, 576, 576, 3, 64);                     /* the latent of the cache row */
    check_copy_2d(c, 37, 41, 43, 6, 1);                         /* odd: the scalar path */
    check_copy_2d(c, 128, 128, 16 * 192, size ? 300 : 20, 64);  /* a prompt chunk's q_nope of one head */
    for (int t = 0; t < 2; t++) {
        check_qkv_prep_part(c, (st_kv_type)t, 7, 16, 1, 576, 64, 0, 0, 1); /* deepseek2's latent row */
        check_qkv_prep_part(c, (st_kv_type)t, 5, 8, 2, 128, 64, 1, 1, 0);  /* glm4moe: half rotary, head norms */
        check_qkv_prep_part(c, (st_kv_type)t, 5, 8, 2, 128, 64, 0, 0, 0);
        check_attention_mla(c, (st_kv_type)t, size ? 1500 : 200, 16, 576, size ? 40 : 7);
        if (size) check_attention_mla(c, (st_kv_type)t, 600, 128, 576, 20); /* deepseek-v3's 128 heads */
        check_attention_mla(c, (st_kv_type)t, 100, 4, 288, 5); /* the tiny preset's: fewer heads than a block's 8 */
    }
}

int backend_check_ops(st_backend *ref, st_backend *dut, int size, uint64_t seed, bcheck_report_fn fn, void *ctx) {
    chk c = {ref, dut, seed * 0x2545f4914f6cdd1dull + 1, fn, ctx, 0};
    static const qt_type rows_types[] = {QT_F32,  QT_F16,  QT_BF16, QT_Q4_0, QT_Q4_1, QT_Q5_0, QT_Q5_1,
                                         QT_Q8_0, QT_Q2_K, QT_Q3_K, QT_Q4_K, QT_Q5_K, QT_Q6_K, QT_IQ4_XS};
    for (size_t i = 0; i < sizeof rows_types / sizeof rows_types[0]; i++) check_get_rows(&c, rows_types[i], 512);
    static const qt_type mm_tiny[] = {QT_F32, QT_Q4_1, QT_Q8_0, QT_Q4_K, QT_Q6_K};
    static const qt_type mm_all[] = {QT_F32,  QT_F16,    QT_BF16,   QT_Q4_0,    QT_Q4_1,  QT_Q5_0,
                                     QT_Q5_1, QT_Q8_0,   QT_Q2_K,   QT_Q3_K,    QT_Q4_K,  QT_Q5_K,
                                     QT_Q6_K, QT_IQ4_XS, QT_IQ4_NL, QT_IQ2_XXS, QT_IQ3_S, QT_MXFP4};
    const qt_type *mm = size ? mm_all : mm_tiny;
    size_t n_mm = size ? sizeof mm_all / sizeof mm_all[0] : sizeof mm_tiny / sizeof mm_tiny[0];
    static const int toks[] = {1, 5, 33};
    for (size_t i = 0; i < n_mm; i++)
        for (int j = 0; j < 3; j++)
            if (size || j != 1) check_matmul(&c, mm[i], size ? 1024 : 256, size ? 320 : 64, toks[j]);
    if (size) { /* the shapes of SmolLM2-135M: 576-wide rows (not a multiple of 256), a 49152-row output */
        check_matmul(&c, QT_Q8_0, 576, 49152, 1);
        static const int64_t sh[3][2] = {{576, 1536}, {1536, 576}, {576, 192}};
        for (int i = 0; i < 3; i++)
            for (int j = 0; j < 2; j++) check_matmul(&c, QT_Q4_1, sh[i][0], sh[i][1], j ? 5 : 1);
        check_rope(&c, 5, 9, 64, 17, 100000.0f, 1.0f, 0);
        check_attention(&c, ST_KV_F16, 300, 9, 3, 64, 5);
        /* a 33-token product after cuBLAS refused: the matrix-vector kernels take it */
        const int old = set_variant(&c, ST_VARIANT_NO_BLAS, 1);
        if (old >= 0) {
            check_matmul(&c, QT_Q4_K, 1024, 320, 33);
            set_variant(&c, ST_VARIANT_NO_BLAS, old);
        }
    }
    check_chain(&c, QT_Q4_K, 1024, 320, 1);
    check_chain(&c, QT_Q8_0, 576, 192, 5);
    if (size) check_chain(&c, QT_Q4_K, 1024, 320, 33); /* prompt-sized: no producer quantization */
    check_rmsnorm(&c, 576, size ? 33 : 3, 0, 0);
    check_rmsnorm(&c, 64, size ? 200 : 8, 1, 0);
    check_rmsnorm(&c, 2048, 1, 0, 1); /* a decode row: quantized for the products too */
    check_rmsnorm(&c, 576, size ? 33 : 3, 0, 1);
    check_rmsnorm(&c, 64, 8, 1, 1);
    check_rmsnorm(&c, 7168, 2, 1, 1); /* wide rows: several values per thread */
    check_rmsnorm(&c, 20000, 1, 0, 1);
    check_rope(&c, 3, 4, 64, 1000, 10000.0f, 1.0f, 1);
    check_rope(&c, 3, 4, 64, 1000, 10000.0f, 1.0f, 0);
    check_rope(&c, 5, 2, 128, 30000, 1e6f, 0.25f, 1);
    check_elementwise(&c, size ? 576 * 37 : 576 * 3, 576);
    for (int t = 0; t < 2; t++) {
        check_qkv_prep(&c, (st_kv_type)t, 7, 8, 2, 64, 1, 1, 0);
        check_qkv_prep(&c, (st_kv_type)t, 7, 8, 2, 64, 0, 0, 0);
        check_qkv_prep(&c, (st_kv_type)t, 7, 8, 2, 64, 0, 0, 1); /* llama 3.1-like */
        if (size) check_qkv_prep(&c, (st_kv_type)t, 40, 16, 4, 256, 1, 1, 0);
        check_qkv_prep(&c, (st_kv_type)t, 3, 8, 2, 128, 1, 1, 0); /* qwen3's heads */
        check_qkv_prep(&c, (st_kv_type)t, 3, 6, 2, 96, 0, 0, 0);  /* pairs past a lane's first 32 */
    }
    for (int t = 0; t < 2; t++) {
        check_attention(&c, (st_kv_type)t, size ? 2100 : 300, 8, 2, 64, size ? 37 : 7);
        if (size) check_attention(&c, (st_kv_type)t, 700, 4, 1, 256, 64); /* gemma3-like head size, MQA */
        if (size)
            check_attention(&c, (st_kv_type)t, 2100, 32, 4, 128, 16); /* qwen3-30b-a3b: 8 query heads per KV head */
    }
    check_attention(&c, ST_KV_F16, 300, 12, 1, 64, 5);   /* 12 per KV head: a GQA instance with unused heads */
    check_attention(&c, ST_KV_INT8, 300, 16, 1, 128, 5); /* 16 per KV head (qwen3-235b): the GQA kernel's most */
    check_attention(&c, ST_KV_F16, 300, 20, 1, 64, 5);   /* 20 per KV head: past it, the per-head kernel */
    if (size)
        check_attention(&c, ST_KV_F16, 300, 4, 2, 96, 5); /* a head size the GQA kernel leaves to the per-head one */
    for (int path = 0; path < 3; path++) {                /* default (fused decode), expert loop, grouped only */
        check_moe(&c, 1, 8, 2, 256, 256, 1, path, QT_Q4_K, QT_Q6_K, 0);
        check_moe(&c, size ? 19 : 5, 8, 2, 256, 256, path == 1, path, QT_Q4_K, QT_Q6_K, 0);
        if (size) check_moe(&c, 70, 16, 4, 512, 256, 1, path, QT_Q4_K, QT_Q6_K, 0); /* past the device-pairs limit */
    }
    if (size) { /* qwen3-30b-a3b's experts: one token, and a batched step of 8 (64 pairs) */
        check_moe(&c, 1, 128, 8, 2048, 768, 1, 0, QT_Q4_K, QT_Q6_K, 0);
        check_moe(&c, 8, 32, 8, 2048, 768, 1, 0, QT_Q4_K, QT_Q6_K, 0); /* 32 experts: quicker to make on the CPU */
    }
    check_upload_many(&c);
    check_mla_family(&c, size);
    /* gpt-oss: sinks (decode and prompt, with and without the window), the
     * clamped SwiGLU, and biased experts in every MoE path; MXFP4 as
     * published, and a K-quant pair */
    check_glu_oai(&c, size ? 2880 * 9 : 2880);
    for (int t = 0; t < 2; t++) check_attention_x(&c, (st_kv_type)t, size ? 700 : 300, 8, 2, 64, size ? 37 : 17, 1);
    if (size) check_attention_x(&c, ST_KV_F16, 2100, 64, 8, 64, 40, 1); /* gpt-oss's heads: 64 of 64 over 8 KV heads */
    for (int path = 0; path < 3; path++) {
        check_moe_oai(&c, 1, 8, 4, 256, 256, path, QT_MXFP4, QT_MXFP4);
        check_moe_oai(&c, size ? 19 : 5, 8, 4, 256, 256, path, QT_MXFP4, QT_MXFP4);
        if (size) check_moe_oai(&c, 40, 16, 4, 512, 256, path, QT_Q4_K, QT_Q6_K);
    }
    check_moe_oai(&c, 40, 8, 4, 256, 256, 0, QT_MXFP4, QT_MXFP4); /* 160 pairs: the tensor-core grouped products */
    check_moe_oai(&c, 40, 8, 4, 576, 384, 0, QT_MXFP4,
                  QT_MXFP4); /* rows of 192-multiples (gpt-oss's 2880): 192-wide stages */
    if (size) {
        check_moe_oai(&c, 40, 8, 4, 288, 320, 0, QT_MXFP4, QT_MXFP4); /* neither: host-grouped */
        /* gpt-oss's own widths (2880 in and out), 4 experts: a decode step and an 80-pair chunk */
        check_moe_oai(&c, 1, 4, 2, 2880, 2880, 0, QT_MXFP4, QT_MXFP4);
        check_moe_oai(&c, 40, 4, 2, 2880, 2880, 0, QT_MXFP4, QT_MXFP4);
    }
    check_moe_experts_oai(&c, 1, 8, 4, 256, 256, QT_MXFP4, QT_MXFP4);
    check_moe_experts_oai(&c, 3, 8, 4, 256, 256, QT_MXFP4, QT_MXFP4);
    check_moe_experts_oai(&c, 40, 8, 4, 256, 256, QT_MXFP4, QT_MXFP4);
    check_top_k(&c, 1000, 1, 0, 0);
    check_top_k(&c, 1000, 40, 7, 0); /* ties across the whole array */
    check_top_k(&c, 70, 64, 3, 0);
    check_top_k(&c, 151936, 1, 0, 0); /* qwen3's vocabulary: greedy */
    check_top_k(&c, 151936, 40, 0, 0);
    check_top_k(&c, 5000, 8, 0, 30);              /* NaNs: never chosen, and they hide nothing */
    if (size) check_top_k(&c, 262144, 64, 20, 0); /* gemma 3's vocabulary, the most candidates, ties */
    for (int f = 0; f < 2; f++) {                 /* the backend's fusions (by default all), then none */
        check_decode_layer(&c, QT_Q4_K, QT_Q6_K, 256, 512, 128, 16, 4, 256, 1, f ? 0 : -1);
        check_decode_layer(&c, QT_Q8_0, QT_Q8_0, 256, 256, 64, 16, 4, 256, 3, f ? 0 : -1);
        check_decode_layer(&c, QT_Q5_K, QT_Q6_K, 256, 512, 128, 16, 4, 256, 2,
                           f ? 0 : -1); /* the other type pair, 2 tokens */
    }
    check_matmul(&c, QT_F32, 2048, 128, 1); /* few float rows (a router): the split kernel */
    check_matmul(&c, QT_F16, 512, 100, 5);
    if (size) /* qwen3-30b-a3b */
        for (int f = 0; f < 2; f++)
            check_decode_layer(&c, QT_Q4_K, QT_Q6_K, 2048, 4096, 512, 128, 8, 768, 1, f ? 0 : -1);
    /* a small prompt chunk (80 pairs): the self-test runs the tensor-core grouped products once too */
    check_moe(&c, 40, 8, 2, 256, 256, 1, 0, QT_Q4_K, QT_Q6_K, 0);
    if (size) { /* prompt chunks at model sizes: the tensor-core grouped products (moe_mma.cu) on sm_80+ */
        check_moe(&c, 300, 128, 8, 2048, 768, 1, 0, QT_Q4_K, QT_Q6_K, 1); /* qwen3-30b-a3b's experts */
        /* the other formats with 32 experts: their random weights are quantized on the CPU first */
        check_moe(&c, 300, 32, 8, 1024, 512, 1, 0, QT_Q4_K, QT_Q6_K, 0);
        check_moe(&c, 300, 32, 8, 256, 256, 1, 0, QT_Q8_0, QT_Q8_0, 1);
        check_moe(&c, 300, 32, 8, 512, 256, 0, 0, QT_Q4_0, QT_Q4_0, 1);
        check_moe(&c, 300, 32, 8, 512, 512, 1, 0, QT_IQ4_XS, QT_Q6_K, 1);
        check_moe(&c, 200, 32, 8, 256, 256, 1, 0, QT_IQ3_S, QT_Q5_K, 1);
    }
    c.fails += backend_check_hybrid(ref, dut, size, seed, fn, ctx); /* gated DeltaNet, gates (qwen35moe, qwen3next) */
    return c.fails;
}

int backend_check_mla_ops(st_backend *ref, st_backend *dut, int size, uint64_t seed, bcheck_report_fn fn, void *ctx) {
    chk c = {ref, dut, seed * 0x2545f4914f6cdd1dull + 1, fn, ctx, 0};
    check_mla_family(&c, size);
    return c.fails;
}
