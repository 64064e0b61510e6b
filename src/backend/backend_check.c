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

/* sinks: attention_sinks with one sink logit per head (gpt-oss), drawn
 * around the scores' scale with one head's far above them (the sink takes
 * nearly all of that head's weight: the kernels' rescaling must not
 * overflow), and a fourth case, a prompt with a window (gpt-oss's sliding
 * layers read prompts so). vmag: the values' magnitude (small ones put an
 * int8 cache's row scales, times the softmax weights, far below 1). */
void check_attention_x(chk *c, st_kv_type t, int n_ctx, int n_head, int hkv, int hd, int n_prompt, int sinks,
                       float vmag) {
    const char *tn = t == ST_KV_F16 ? "f16" : "int8";
    st_kv_layer kr = make_kv(c->ref, t, n_ctx, hkv, hd), kd = make_kv(c->dut, t, n_ctx, hkv, hd);
    /* fill positions 0..n_ctx-2 in two writes (the second at an offset), keep the last for decode */
    int fill = n_ctx - 1, first = fill / 3;
    size_t kvw = (size_t)hkv * hd;
    float *k = rand_host(c, (size_t)fill * kvw, 1.0f), *v = rand_host(c, (size_t)fill * kvw, vmag);
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
         * tensor cores (prompts of 16+ tokens with 64-, 128- or 256-wide heads, and decode over spans
         * past CUDA_ATT_SHORT_SPAN, 1280, with 64- or 128-wide heads and up to 16 query heads per KV
         * head; their f16 rounding of
         * q and of the softmax weights adds ~1e-7 of NMSE: bound 5e-6) */
        const int has = set_variant(c, ST_VARIANT_ATTN, -1) >= 0;
        const int span = win > 0 && pos0 + nt > win ? win : pos0 + nt;
        const int tc_decode = nt < 16 && span > 1280 && n_head / hkv <= 16 && (hd == 64 || hd == 128);
        const int tc_prompt = nt >= 16 && (hd == 64 || hd == 128 || hd == 256);
        for (int mode = 0; mode < (has ? 3 : 1); mode++) {
            const int tc = mode == 2 && (tc_prompt || tc_decode);
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
    check_attention_x(c, t, n_ctx, n_head, hkv, hd, n_prompt, 0, 1.0f);
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

/* Whether the two sides' router logits pick a different set of top-k
 * experts for some token (ra, rb: [n_tok][n_expert]). */
static int route_sets_differ(const float *ra, const float *rb, int n_tok, int n_expert, int k) {
    for (int t = 0; t < n_tok; t++) {
        const float *a = ra + (size_t)t * n_expert, *b = rb + (size_t)t * n_expert;
        for (int e = 0; e < n_expert; e++) { /* rank of e on each side: in or out of the top k */
            int above_a = 0, above_b = 0;
            for (int f = 0; f < n_expert; f++) {
                above_a += a[f] > a[e] || (a[f] == a[e] && f < e);
                above_b += b[f] > b[e] || (b[f] == b[e] && f < e);
            }
            if ((above_a < k) != (above_b < k)) return 1;
        }
    }
    return 0;
}

/* One decode layer's products and norms as the forward pass calls them,
 * fused ops where a GPU backend fuses (the CUDA backend):
 *   o = Wo a; x += o, h = norm(x); r = Wr h   (matmul_res_norm: FUSE bit 4)
 *   m = moe(h, r)                             (routing in the MoE kernel)
 *   x += m, h2 = norm(x)                      (the next layer's attention norm)
 *   q, k, v = Wq h2, Wk h2, Wv h2             (matmul_multi: FUSE bit 1)
 * x, h, the router logits, m, h2, q, k and v compared. tq: wo, q, k; tv: v.
 * fuse >= 0: a backend with the ST_VARIANT_FUSE variant runs it with those bits (0: each
 * fused op as its composition). bias: wo, wq, wk, wv and the router carry
 * biases (st_weight.bias: gpt-oss's five), which every product adds.
 * The inputs are drawn again (up to 20 times) when the two sides' router
 * logits pick different experts: a rounding difference in h can flip a
 * near-tie, which is not the error this check measures (check_moe checks
 * the routing). A near-tie that flips nothing stays: both sides then route
 * the same experts. The routing margin (route_margin) is reported. */
static void check_decode_layer(chk *c, qt_type tq, qt_type tv, int64_t dim, int64_t qw, int64_t kvw, int n_expert,
                               int k, int64_t F, int n_tok, int fuse, int bias) {
    wpair wo = make_weight(c, tq, qw, dim, 1), wq = make_weight(c, tq, dim, qw, 1),
          wk = make_weight(c, tq, dim, kvw, 1);
    wpair wv = make_weight(c, tv, dim, kvw, 1);
    /* a router at a model's scale: logits of RMS ~2 (weights of sd 0.5, as the
     * others, made logits of RMS ~0.5 sqrt(dim): 23 at 2048, where one
     * expert took nearly all the weight and w(1 - w) times the logits'
     * rounding moved the output by up to 2e-2 when the best two were close) */
    wpair wr = make_weight_sd(c, QT_F32, dim, n_expert, 1, 2.0f / sqrtf((float)dim));
    void *bb[5][2] = {{NULL, NULL}};
    wpair *biased[] = {&wo, &wq, &wk, &wv, &wr};
    for (int i = 0; i < 5 && bias; i++) give_bias(c, biased[i], 1.0f, bb[i]);
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
    const int ref_8bit = set_ref_variant(c, ST_VARIANT_PRECISE, 1); /* f32 activations: the reference's own noise out */
    double margin = 0;
    int tries = 1, flipped = 0;
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
        if (side == 1) { /* the sides' logits chose other experts: a flip, not a kernel's error */
            float *ra = get(c->ref, b[R][0], nr), *rb = get(c->dut, b[R][1], nr);
            flipped = route_sets_differ(ra, rb, n_tok, n_expert, k);
            margin = route_margin(ra, n_tok, n_expert, k);
            st_free(ra), st_free(rb);
            if (flipped && tries++ < 20) { /* other x and a, on both sides, and the reference again */
                flipped = 0;
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
    if (ref_8bit >= 0) set_ref_variant(c, ST_VARIANT_PRECISE, ref_8bit);
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
     * stack. The reference runs with f32 activations (ST_VARIANT_PRECISE)
     * so that only the device's own 8-bit noise is measured. With the
     * router's logits at RMS 23 (before its scale above), 4 draws in 80 of
     * the 2048-wide layer read 7.7e-3 to 2.2e-2 on an H200 (2026-12-03),
     * the same to three digits through the fused decode kernels and the
     * grouped ones: the best two experts close, their weights moved by the
     * logits' rounding. A wrong kernel is off by 1e-1 or more. */
    char fz[16] = "";
    if (set_fuse) snprintf(fz, sizeof fz, ", fuse %d", fuse);
    report(c, "decode layer", e, 6e-3, ms,
           "%s/%s, %lld wide, %d tokens, top-%d of %d%s%s, %s CPU (worst: %s; next: %s %.2g; routing margin %.2f%s)",
           qt_get(tq)->name, qt_get(tv)->name, (long long)dim, n_tok, k, n_expert, fz, bias ? ", biased" : "",
           ref_8bit >= 0 ? "f32" : "8-bit", worst, next, e2, margin,
           flipped ? ", other experts on the two sides after 20 draws" : "");
    for (int i = 0; i < 11; i++) c->ref->free(c->ref, b[i][0]), c->dut->free(c->dut, b[i][1]);
    st_free(hx), st_free(ha), st_free(hn), st_free(hn2);
    wpair *all[] = {&wo, &wq, &wk, &wv, &wr, &g, &u, &d};
    for (int i = 0; i < 8; i++) free_weight(c, all[i]);
    for (int i = 0; i < 5 && bias; i++) c->ref->free(c->ref, bb[i][0]), c->dut->free(c->dut, bb[i][1]);
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

/* draw (a temperature-only draw on the device) against the host's walk in
 * double: n logits (a run of -inf among them), n_draw draws at spread u.
 * The error of a draw: how far r = u * sum lies outside the chosen id's
 * interval of the running sum, as a share of the sum (float sums on the
 * device: ~1e-7); 1 for an id without mass, a refusal, or a NaN not
 * refused (one NaN among the logits must give 1: the host draws then). */
static void check_draw(chk *c, int n, float temp, int n_draw) {
    if (!c->dut->draw) return;
    float *x = rand_host(c, (size_t)n, 3.0f);
    for (int i = n / 3; i < n / 3 + 20 && i < n; i++) x[i] = -INFINITY;
    void *xd = put(c->dut, x, (size_t)n * 4);
    double *cum = st_malloc((size_t)(n + 1) * sizeof(double)), m = -INFINITY;
    for (int i = 0; i < n; i++) m = x[i] > m ? x[i] : m;
    cum[0] = 0;
    for (int i = 0; i < n; i++) cum[i + 1] = cum[i] + exp(((double)x[i] - m) / temp);
    const double total = cum[n];
    double worst = 0, ms = 0;
    for (int k = 0; k < n_draw; k++) {
        const double u =
            k == n_draw - 1 ? 1.0 - 1.0 / 9007199254740992.0 : (k + 0.5 * (double)(next_u64(c) % 1000) / 1000) / n_draw;
        int32_t tok = -1;
        const double t0 = now_ms();
        const int rc = c->dut->draw(c->dut, xd, n, 1.0f / temp, u, &tok);
        ms += now_ms() - t0;
        /* the distance from r to the token's interval; an id of -inf never.
         * An id whose share is below double's rounding of the running sum
         * (at temperature 0.05, most of them) has an interval of width 0:
         * the device (float p > 0) may take it beside the boundary r is at */
        double e = 1;
        if (rc == 0 && tok >= 0 && tok < n && x[tok] > -INFINITY) {
            const double r = u * total, lo = cum[tok] - r, hi = r - cum[tok + 1];
            e = (lo > 0 ? lo : hi > 0 ? hi : 0) / total;
        }
        worst = e > worst ? e : worst;
    }
    report(c, "draw", worst, 1e-5, ms / n_draw, "%d logits (20 at -inf), temperature %.2f, %d draws", n, temp, n_draw);
    x[n / 2] = NAN;
    c->dut->to_device(c->dut, (float *)xd + n / 2, &x[n / 2], 4);
    int32_t tok = -1;
    const int rc = c->dut->draw(c->dut, xd, n, 1.0f / temp, 0.5, &tok);
    report(c, "draw", rc == 1 ? 0 : 1, 0, 0, "a NaN among %d logits: left to the host (rc %d)", n, rc);
    c->dut->free(c->dut, xd);
    st_free(x), st_free(cum);
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

/* The decode layers, each with the backend's fusions (by default all), then
 * none: part 0 the small shapes, part 1 qwen3-30b-a3b's (test size only). */
static void check_decode_layers(chk *c, int part, int size) {
    for (int f = 0; f < 2 && part == 0; f++) {
        check_decode_layer(c, QT_Q4_K, QT_Q6_K, 256, 512, 128, 16, 4, 256, 1, f ? 0 : -1, 0);
        check_decode_layer(c, QT_Q8_0, QT_Q8_0, 256, 256, 64, 16, 4, 256, 3, f ? 0 : -1, 0);
        check_decode_layer(c, QT_Q5_K, QT_Q6_K, 256, 512, 128, 16, 4, 256, 2, f ? 0 : -1,
                           0); /* the other pair, 2 tokens */
        /* biased products: one token (the fused kernels), three (one launch for q, k, v), nine (the GEMM path) */
        check_decode_layer(c, QT_Q8_0, QT_Q8_0, 256, 256, 64, 16, 4, 256, 1, f ? 0 : -1, 1);
        check_decode_layer(c, QT_Q4_K, QT_Q6_K, 256, 512, 128, 16, 4, 256, 3, f ? 0 : -1, 1);
        check_decode_layer(c, QT_Q4_K, QT_Q6_K, 256, 512, 128, 16, 4, 256, 9, f ? 0 : -1, 1);
    }
    if (size && part == 1)
        for (int f = 0; f < 2; f++)
            check_decode_layer(c, QT_Q4_K, QT_Q6_K, 2048, 4096, 512, 128, 8, 768, 1, f ? 0 : -1, 0);
}

int backend_check_layer_ops(st_backend *ref, st_backend *dut, int size, uint64_t seed, bcheck_report_fn fn, void *ctx) {
    chk c = {ref, dut, seed * 0x2545f4914f6cdd1dull + 1, fn, ctx, 0};
    check_decode_layers(&c, 0, size);
    check_decode_layers(&c, 1, size);
    return c.fails;
}

/* A batched decode step's attention (backend.h qkv_prep_seqs and
 * attention_seqs, where the device under test has them): n sequences of one
 * token each, each at its own position (10 to n_ctx - 2) of its own cache,
 * against the reference's qkv_prep and attention run per sequence: the
 * rotated q rows, every cache row written, the outputs. */
static void check_seqs(chk *c, st_kv_type t, int n, int n_head, int hkv, int hd, int win, int sinks) {
    if (!c->dut->attention_seqs) return;
    const char *tn = t == ST_KV_F16 ? "f16" : "int8";
    const int n_ctx = 600;
    const size_t qw = (size_t)n_head * hd, kvw = (size_t)hkv * hd;
    st_kv_layer *kr = st_calloc((size_t)n, sizeof *kr), *kd = st_calloc((size_t)n, sizeof *kd);
    st_kv_layer **pr = st_calloc((size_t)n, sizeof *pr), **pd = st_calloc((size_t)n, sizeof *pd);
    int *pos = st_malloc((size_t)n * sizeof *pos);
    for (int i = 0; i < n; i++) { /* sequence i: its history 0..pos-1 */
        kr[i] = make_kv(c->ref, t, n_ctx, hkv, hd), kd[i] = make_kv(c->dut, t, n_ctx, hkv, hd);
        pr[i] = &kr[i], pd[i] = &kd[i];
        pos[i] = 10 + (int)((i * 7919u + 31) % (unsigned)(n_ctx - 12));
        float *k = rand_host(c, (size_t)pos[i] * kvw, 1.0f), *v = rand_host(c, (size_t)pos[i] * kvw, 1.0f);
        void *a[2] = {put(c->ref, k, (size_t)pos[i] * kvw * 4), put(c->ref, v, (size_t)pos[i] * kvw * 4)};
        void *b[2] = {put(c->dut, k, (size_t)pos[i] * kvw * 4), put(c->dut, v, (size_t)pos[i] * kvw * 4)};
        void *sr = put(c->ref, NULL, (size_t)pos[i] * hd * 4), *sd = put(c->dut, NULL, (size_t)pos[i] * hd * 4);
        kv_fill(c->ref, &kr[i], sr, a[0], a[1], pos[i], 0);
        kv_fill(c->dut, &kd[i], sd, b[0], b[1], pos[i], 0);
        c->ref->free(c->ref, sr), c->dut->free(c->dut, sd);
        for (int j = 0; j < 2; j++) c->ref->free(c->ref, a[j]), c->dut->free(c->dut, b[j]);
        st_free(k), st_free(v);
    }
    const size_t nq = (size_t)n * qw, nk = (size_t)n * kvw;
    float *q = rand_host(c, nq, 1.0f), *k = rand_host(c, nk, 1.0f), *v = rand_host(c, nk, 1.0f);
    float *qn = rand_host(c, (size_t)hd, 1.0f), *kn = rand_host(c, (size_t)hd, 1.0f);
    float *sk = sinks ? rand_host(c, (size_t)n_head, 2.0f) : NULL;
    void *qr = put(c->ref, q, nq * 4), *qd = put(c->dut, q, nq * 4), *kr_ = put(c->ref, k, nk * 4);
    void *kd_ = put(c->dut, k, nk * 4), *vr = put(c->ref, v, nk * 4), *vd = put(c->dut, v, nk * 4);
    void *qnr = put(c->ref, qn, (size_t)hd * 4), *qnd = put(c->dut, qn, (size_t)hd * 4);
    void *knr = put(c->ref, kn, (size_t)hd * 4), *knd = put(c->dut, kn, (size_t)hd * 4);
    void *skr = sk ? put(c->ref, sk, (size_t)n_head * 4) : NULL, *skd = sk ? put(c->dut, sk, (size_t)n_head * 4) : NULL;
    void *or_ = put(c->ref, NULL, nq * 4), *od = put(c->dut, NULL, nq * 4);
    const st_rope rope = {1e6f, 1.0f, 1, NULL, 0};
    const float scale = 1.0f / sqrtf((float)hd);
    for (int i = 0; i < n; i++) {
        float *qi = (float *)qr + i * qw, *oi = (float *)or_ + i * qw;
        c->ref->qkv_prep(c->ref, qi, (float *)kr_ + i * kvw, (float *)vr + i * kvw, qnr, knr, 1e-6f, 1, n_head, &rope,
                         &kr[i], pos[i]);
        if (sinks) c->ref->attention_sinks(c->ref, qi, &kr[i], 1, pos[i], n_head, scale, win, skr, oi);
        else c->ref->attention(c->ref, qi, &kr[i], 1, pos[i], n_head, scale, win, oi);
    }
    double t0 = now_ms();
    c->dut->qkv_prep_seqs(c->dut, qd, kd_, vd, qnd, knd, 1e-6f, n, n_head, &rope, pd, 0, pos);
    const int rc = c->dut->attention_seqs(c->dut, qd, pd, 0, n, pos, n_head, scale, win, skd, od);
    const double ms = now_ms() - t0;
    double e = rc ? 1.0 : cmp_bufs(c, or_, od, nq), eq = cmp_bufs(c, qr, qd, nq), ec = 0;
    for (int i = 0; i < n; i++) {
        const double ek = kv_diff(c, &kr[i], &kd[i], pos[i] + 1, 0), ev = kv_diff(c, &kr[i], &kd[i], pos[i] + 1, 1);
        ec = ek > ec ? ek : ec;
        ec = ev > ec ? ev : ec;
    }
    report(c, "qkv_prep_seqs", eq > ec ? eq : ec, t == ST_KV_F16 ? 1e-9 : 1e-5, ms,
           "%s, %d sequences of one token, %d/%d heads x %d, head norms, neox", tn, n, n_head, hkv, hd);
    report(c, sinks ? "attention_seqs (sinks)" : "attention_seqs", e, t == ST_KV_F16 ? 1e-9 : 1e-6, ms,
           "%s, %d sequences at positions 10..%d, %d/%d heads x %d, window %d%s", tn, n, n_ctx - 2, n_head, hkv, hd,
           win, rc ? " (declined: rc 1)" : "");
    void *bufs[][2] = {{qr, qd}, {kr_, kd_}, {vr, vd}, {qnr, qnd}, {knr, knd}, {or_, od}};
    for (int i = 0; i < 6; i++) c->ref->free(c->ref, bufs[i][0]), c->dut->free(c->dut, bufs[i][1]);
    if (sk) c->ref->free(c->ref, skr), c->dut->free(c->dut, skd);
    for (int i = 0; i < n; i++) free_kv(c->ref, &kr[i]), free_kv(c->dut, &kd[i]);
    st_free(q), st_free(k), st_free(v), st_free(qn), st_free(kn), st_free(sk);
    st_free(kr), st_free(kd), st_free(pr), st_free(pd), st_free(pos);
}

/* Attention over caches of both types, every kernel's head shapes. */
static void check_attentions(chk *c, int size) {
    for (int t = 0; t < 2; t++) { /* a batched decode step's: 5 sequences, and 37 (two launches of 32 and 5) */
        check_seqs(c, (st_kv_type)t, 5, 32, 4, 128, 0, 0);
        check_seqs(c, (st_kv_type)t, 37, 8, 2, 64, 0, 0);
    }
    check_seqs(c, ST_KV_F16, 9, 8, 2, 64, 101, 1); /* gpt-oss: a window and sinks */
    for (int t = 0; t < 2; t++) {
        check_attention(c, (st_kv_type)t, size ? 2100 : 300, 8, 2, 64, size ? 37 : 7);
        if (size) check_attention(c, (st_kv_type)t, 700, 4, 1, 256, 64); /* gemma3-like head size, MQA */
        /* qwen3-next / qwen3.5 full attention: 16 query heads of 256 over 2 KV heads, 80 tokens (two and a
         * half blocks of 64 rows a KV head, each over ~20 tiles of 32 keys) */
        if (size) check_attention(c, (st_kv_type)t, 700, 16, 2, 256, 80);
        if (size)
            check_attention(c, (st_kv_type)t, 2100, 32, 4, 128, 16); /* qwen3-30b-a3b: 8 query heads per KV head */
        /* glm-4.5-air: 12 query heads per KV head, so a block's 64 rows end inside a token; 96 tokens: 18
         * blocks a KV head, each over ~30 key tiles (the prompt kernel's stages, alternating) */
        if (size) check_attention(c, (st_kv_type)t, 2100, 24, 2, 128, 96);
    }
    check_attention(c, ST_KV_F16, 300, 12, 1, 64, 5);   /* 12 per KV head: a GQA instance with unused heads */
    check_attention(c, ST_KV_INT8, 300, 16, 1, 128, 5); /* 16 per KV head (qwen3-235b): the GQA kernel's most */
    if (size) { /* the same past the short span: the tensor-core decode kernel's most rows, and unused rows */
        check_attention(c, ST_KV_F16, 2100, 16, 1, 128, 5);
        check_attention(c, ST_KV_INT8, 2100, 12, 1, 128, 5);
        /* values of 0.02: an int8 row scale times a weight of ~1/2100 is below f16's normal range */
        check_attention_x(c, ST_KV_INT8, 2100, 32, 4, 128, 16, 0, 0.02f);
    }
    check_attention(c, ST_KV_F16, 300, 20, 1, 64, 5); /* 20 per KV head: past it, the per-head kernel */
    if (size)
        check_attention(c, ST_KV_F16, 300, 4, 2, 96, 5); /* a head size the GQA kernel leaves to the per-head one */
}

int backend_check_attn_ops(st_backend *ref, st_backend *dut, int size, uint64_t seed, bcheck_report_fn fn, void *ctx) {
    chk c = {ref, dut, seed * 0x2545f4914f6cdd1dull + 1, fn, ctx, 0};
    check_attentions(&c, size);
    return c.fails;
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
    check_attentions(&c, size);
    for (int path = 0; path < 3; path++) { /* default (fused decode), expert loop, grouped only */
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
    check_oai_family(&c, size);
    check_top_k(&c, 1000, 1, 0, 0);
    check_top_k(&c, 1000, 40, 7, 0); /* ties across the whole array */
    check_top_k(&c, 70, 64, 3, 0);
    check_top_k(&c, 151936, 1, 0, 0); /* qwen3's vocabulary: greedy */
    check_top_k(&c, 151936, 40, 0, 0);
    check_top_k(&c, 5000, 8, 0, 30);              /* NaNs: never chosen, and they hide nothing */
    if (size) check_top_k(&c, 262144, 64, 20, 0); /* gemma 3's vocabulary, the most candidates, ties */
    check_draw(&c, 1000, 1.0f, 50);
    check_draw(&c, 151936, 0.7f, size ? 200 : 20); /* qwen3's vocabulary */
    /* peaked ones: a few ids hold the mass, and the draw of u near 1 walks
     * past runs of ids whose p underflows (43 x in 100 found no token
     * before draw.cu skipped runs and blocks without mass, in a NumPy model of
     * the kernel): six x at test sizes */
    for (int i = 0; i < (size ? 6 : 1); i++) check_draw(&c, 151936, 0.05f, 20);
    if (size) check_draw(&c, 262144, 1.5f, 100); /* gemma 3's */
    check_decode_layers(&c, 0, size);
    check_matmul(&c, QT_F32, 2048, 128, 1); /* few float rows (a router): the split kernel */
    check_matmul(&c, QT_F16, 512, 100, 5);
    check_decode_layers(&c, 1, size);
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
