/* The op checks of the newer families (backend_check.h): gpt-oss's clamped
 * SwiGLU and biased experts in every MoE path, and glm4moe's and
 * deepseek2's routing rules, copy_2d, products over a whole stack, partial
 * rotary and the latent attention. backend_check_ops runs both; the
 * helpers and bounds are backend_check.c's (backend_check_impl.h).
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend_check.h"
#include "backend/backend_check_impl.h"
#include "core/alloc.h"
#include "quant/quant.h"

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

/* gpt-oss's MoE FFN: the experts' biases and the clamped SwiGLU, through
 * the path of check_moe's numbering (0: fused decode kernels when n_tok*k
 * <= 64, else the grouped products; 1: the expert loop; 2: grouped only),
 * renormalised softmax top-k as gpt-oss routes. Bound as check_moe's. */
static void check_moe_oai(chk *c, int n_tok, int n_expert, int k, int64_t E, int64_t F, int path, qt_type tg,
                          qt_type td) {
    const st_moe_gating gt = {ST_GATE_SOFTMAX, 1, NULL, 1.0f, 0, 0};
    wpair g = make_weight(c, tg, E, F, n_expert), u = make_weight(c, tg, E, F, n_expert);
    wpair d = make_weight(c, td, F, E, n_expert);
    void *bb[3][2]; /* gate and up sd 4 (with products of sd ~8, the clamps act on many values), down sd 1 */
    give_bias(c, &g, 4.0f, bb[0]), give_bias(c, &u, 4.0f, bb[1]), give_bias(c, &d, 1.0f, bb[2]);
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
        give_bias(c, &w[i], i < 2 ? 4.0f : 1.0f, bb[i]);
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

void check_oai_family(chk *c, int size) {
    /* gpt-oss: sinks (decode and prompt, with and without the window), the
     * clamped SwiGLU, and biased experts in every MoE path; MXFP4 as
     * published, and a K-quant pair */
    check_glu_oai(c, size ? 2880 * 9 : 2880);
    for (int t = 0; t < 2; t++)
        check_attention_x(c, (st_kv_type)t, size ? 700 : 300, 8, 2, 64, size ? 37 : 17, 1, 1.0f);
    if (size)
        check_attention_x(c, ST_KV_F16, 2100, 64, 8, 64, 40, 1, 1.0f); /* gpt-oss's heads: 64 of 64 over 8 KV heads */
    for (int path = 0; path < 3; path++) {
        check_moe_oai(c, 1, 8, 4, 256, 256, path, QT_MXFP4, QT_MXFP4);
        check_moe_oai(c, size ? 19 : 5, 8, 4, 256, 256, path, QT_MXFP4, QT_MXFP4);
        if (size) check_moe_oai(c, 40, 16, 4, 512, 256, path, QT_Q4_K, QT_Q6_K);
    }
    check_moe_oai(c, 40, 8, 4, 256, 256, 0, QT_MXFP4, QT_MXFP4); /* 160 pairs: the tensor-core grouped products */
    check_moe_oai(c, 40, 8, 4, 576, 384, 0, QT_MXFP4,
                  QT_MXFP4); /* rows of 192-multiples (gpt-oss's 2880): 192-wide stages */
    if (size) {
        check_moe_oai(c, 40, 8, 4, 288, 320, 0, QT_MXFP4, QT_MXFP4); /* neither: host-grouped */
        /* gpt-oss's own widths (2880 in and out), 4 experts: a decode step and an 80-pair chunk */
        check_moe_oai(c, 1, 4, 2, 2880, 2880, 0, QT_MXFP4, QT_MXFP4);
        check_moe_oai(c, 40, 4, 2, 2880, 2880, 0, QT_MXFP4, QT_MXFP4);
    }
    check_moe_experts_oai(c, 1, 8, 4, 256, 256, QT_MXFP4, QT_MXFP4);
    check_moe_experts_oai(c, 3, 8, 4, 256, 256, QT_MXFP4, QT_MXFP4);
    check_moe_experts_oai(c, 40, 8, 4, 256, 256, QT_MXFP4, QT_MXFP4);
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
        /* on a CUDA backend: a prompt of 16+ tokens on tensor cores (two GEMMs; f16 queries and
         * weights, bound 5e-6 as check_attention_x's), the latent kernel, the per-head one */
        for (int mode = 2; mode >= (is_cuda ? 0 : 2); mode--) {
            const int gemm = is_cuda && mode == 2 && nt >= 16;
            if (is_cuda && mode == 2 && !gemm) continue; /* mode 1's kernel */
            void *od = put(c->dut, NULL, nq * 4);
            const int old = is_cuda ? set_variant(c, ST_VARIANT_ATTN, mode) : -1;
            const double t0 = now_ms();
            c->dut->attention(c->dut, qd, &kd, nt, pos0, n_head, scale, win, od);
            const double e = cmp_bufs(c, or_, od, nq);
            if (is_cuda) set_variant(c, ST_VARIANT_ATTN, old);
            static const char *const kn[] = {", per-head kernel", ", latent kernel", ", tensor cores (two GEMMs)"};
            report(c, "attention", e, gemm && win == 0 ? 5e-6 : bound, now_ms() - t0,
                   "%s, %s %d tokens at pos %d, %d heads on one latent row of %d, window %d%s", tn,
                   nt == 1 ? "decode" : "prompt", nt, pos0, n_head, hd, win, is_cuda ? kn[gemm ? 2 : mode] : "");
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
void check_mla_family(chk *c, int size) {
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
    check_matmul_all(c, QT_Q4_K, 512, 128, 128, size ? 70 : 9); /* deepseek-v3's 128 heads (9, 70: one batched GEMM) */
    check_copy_2d(c, 64, 576, 9 * 192, 5, 128);                 /* a head's rope part of q (16-byte path) */
    check_copy_2d(c, 512, 576, 576, 3, 64);                     /* the latent of the cache row */
    check_copy_2d(c, 37, 41, 43, 6, 1);                         /* odd: the scalar path */
    check_copy_2d(c, 128, 128, 16 * 192, size ? 300 : 20, 64);  /* a prompt chunk's q_nope of one head */
    for (int t = 0; t < 2; t++) {
        check_qkv_prep_part(c, (st_kv_type)t, 7, 16, 1, 576, 64, 0, 0, 1); /* deepseek2's latent row */
        check_qkv_prep_part(c, (st_kv_type)t, 5, 8, 2, 128, 64, 1, 1, 0);  /* glm4moe: half rotary, head norms */
        check_qkv_prep_part(c, (st_kv_type)t, 5, 8, 2, 128, 64, 0, 0, 0);
        check_attention_mla(c, (st_kv_type)t, size ? 1500 : 200, 16, 576, size ? 40 : 16);
        /* deepseek-v3's 128 heads; 70 tokens: 8960 query rows, two tiles of the GEMM path */
        if (size) check_attention_mla(c, (st_kv_type)t, 600, 128, 576, 70);
        check_attention_mla(c, (st_kv_type)t, 100, 4, 288, 5); /* the tiny preset's: fewer heads than a block's 8 */
    }
}

int backend_check_mla_ops(st_backend *ref, st_backend *dut, int size, uint64_t seed, bcheck_report_fn fn, void *ctx) {
    chk c = {ref, dut, seed * 0x2545f4914f6cdd1dull + 1, fn, ctx, 0};
    check_mla_family(&c, size);
    return c.fails;
}

int backend_check_oai_ops(st_backend *ref, st_backend *dut, int size, uint64_t seed, bcheck_report_fn fn, void *ctx) {
    chk c = {ref, dut, seed * 0x2545f4914f6cdd1dull + 1, fn, ctx, 0};
    check_oai_family(&c, size);
    return c.fails;
}
