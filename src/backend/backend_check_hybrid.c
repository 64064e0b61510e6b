/* The hybrid Qwen family's ops (gated_delta_net and its keep, split_halves,
 * sigmoid_mul) of one backend against another (backend_check.h). Its own
 * file so that the family's checks stay apart from the common ones; the
 * helpers both use are in backend_check_impl.h.
 *
 * Bounds, and why: the DeltaNet sums its dot products in another order on
 * each backend (the CPU in 8 AVX2 lanes, the GPU in a warp's tree) and the
 * CPU sums its norms in double, so values differ by float rounding, which
 * the recurrence carries from token to token: measured NMSE near 1e-13,
 * bound 1e-8 (a wrong head, gate or window is off by 1e-1 or more). The
 * keep path is checked twice: against the reference (the same bound), and
 * on the backend under test against itself, bit for bit (bound 0): a pass
 * recorded and cut back to n tokens must leave the state a pass of only
 * those n tokens leaves, since the replay is the same arithmetic on the
 * same inputs (backend.h). A product after each op that writes the next
 * product's int8 input (the DeltaNet's output, sigmoid_mul's) checks that
 * input as check_chain does (bound 2e-3).
 */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "backend/backend_check.h"
#include "backend/backend_check_impl.h"
#include "core/alloc.h"
#include "quant/quant.h"

/* A quantized weight (n_out x n_in) on a backend, from Gaussians (the same
 * bytes on both sides: quantized once on the host). */
static void *make_matrix(chk *c, qt_type t, int64_t n_in, int64_t n_out, void **dut_copy) {
    const size_t rb = qt_row_size(t, n_in), bytes = rb * (size_t)n_out;
    float *f = rand_host(c, (size_t)(n_in * n_out), 0.5f);
    void *q = st_malloc(bytes);
    for (int64_t r = 0; r < n_out; r++) qt_quantize(t, f + r * n_in, (uint8_t *)q + (size_t)r * rb, n_in);
    void *rp = put(c->ref, q, bytes);
    *dut_copy = put(c->dut, q, bytes);
    st_free(f);
    st_free(q);
    return rp;
}

/* One side's DeltaNet layer: its constants, state and the call's buffers. */
typedef struct {
    st_backend *be;
    st_gdn g;
    st_kv_layer st;
    float *qkv, *z, *beta, *alpha, *out; /* sized for the longest call */
} gdn_side;

/* A one-token call through run_step, so that the GPU records it in a CUDA
 * graph (the position read on the device) and replays it for the next
 * token while the buffers stay the same. The argument is a copy of the
 * side, whose bytes (every buffer's address) are the recording's key. */
static void gdn_step_body(void *arg, int pos0) {
    gdn_side *s = arg;
    s->be->gated_delta_net(s->be, &s->g, &s->st, 1, pos0, s->qkv, s->z, s->beta, s->g.ba_fused ? NULL : s->alpha,
                           s->out);
}

static void gdn_call(gdn_side *s, int n_tok, int pos0, int via_step) {
    if (via_step) {
        gdn_side a; /* not recording an undo record: nothing of st to carry back */
        memcpy(&a, s, sizeof a);
        s->be->run_step(s->be, 1, pos0, gdn_step_body, &a, sizeof a);
        return;
    }
    s->be->gated_delta_net(s->be, &s->g, &s->st, n_tok, pos0, s->qkv, s->z, s->beta, s->g.ba_fused ? NULL : s->alpha,
                           s->out);
}

static void side_free(gdn_side *s) {
    st_backend *be = s->be;
    void *p[] = {(void *)s->g.conv_w,
                 (void *)s->g.dt_bias,
                 (void *)s->g.a,
                 (void *)s->g.norm,
                 s->st.conv,
                 s->st.ssm,
                 s->st.undo,
                 s->qkv,
                 s->z,
                 s->beta,
                 s->alpha,
                 s->out};
    for (size_t i = 0; i < sizeof p / sizeof p[0]; i++)
        if (p[i]) be->free(be, p[i]);
}

/* gated_delta_net on n_k key and n_v value heads of hd: a decode token at
 * position 0 (through run_step, over a NaN-poisoned state that position 0
 * must not read), a prompt of n_prompt tokens continuing it, two decode
 * tokens through run_step (the second a replayed graph), and 3 tokens
 * more; each call's output, then the state and window, compared. Then the
 * keep path (a recorded pass of 6 tokens in two calls, cut to 1, 3 and 6).
 * grouped: qwen3next's layout (value heads of one key head adjacent, beta
 * and alpha fused), else qwen35moe's. */
static void check_gdn(chk *c, int nk, int nv, int hd, int grouped, int n_prompt) {
    const int K = 4, back = K - 1, n_rec = 6, n_max = n_prompt > n_rec ? n_prompt : n_rec;
    const size_t cd = (size_t)(2 * nk + nv) * hd, vd = (size_t)nv * hd, ns = vd * hd;
    const size_t bw = grouped ? 2 * (size_t)nv : (size_t)nv;
    float *conv_w = rand_host(c, cd * K, 0.5f), *dt = rand_host(c, (size_t)nv, 1.0f);
    float *a = st_malloc((size_t)nv * sizeof(float)), *norm = rand_host(c, (size_t)hd, 0.1f);
    for (int h = 0; h < nv; h++) a[h] = -(0.2f + 2.0f * uniform(c)); /* -exp(A_log): decays of 0.1 to 0.9 */
    for (int i = 0; i < hd; i++) norm[i] += 1.0f;
    gdn_side sd[2];
    const size_t undo_bytes =
        st_gdn_undo_floats(&(st_gdn){.d_conv = K, .n_k_head = nk, .n_v_head = nv, .head_dim = hd}, n_rec) *
        sizeof(float);
    for (int i = 0; i < 2; i++) {
        gdn_side *s = &sd[i];
        memset(s, 0, sizeof *s);
        s->be = i ? c->dut : c->ref;
        s->g = (st_gdn){.d_conv = K,
                        .n_k_head = nk,
                        .n_v_head = nv,
                        .head_dim = hd,
                        .eps = 1e-6f,
                        .k_grouped = grouped,
                        .ba_fused = grouped};
        s->g.conv_w = put(s->be, conv_w, cd * K * 4);
        s->g.dt_bias = put(s->be, dt, (size_t)nv * 4);
        s->g.a = put(s->be, a, (size_t)nv * 4);
        s->g.norm = put(s->be, norm, (size_t)hd * 4);
        s->st.conv = put(s->be, NULL, (size_t)back * cd * 4);
        s->st.ssm = put(s->be, NULL, ns * 4);
        s->st.undo = put(s->be, NULL, undo_bytes);
        s->qkv = put(s->be, NULL, (size_t)n_max * cd * 4);
        s->z = put(s->be, NULL, (size_t)n_max * vd * 4);
        s->beta = put(s->be, NULL, (size_t)n_max * bw * 4);
        s->alpha = put(s->be, NULL, (size_t)n_max * nv * 4);
        s->out = put(s->be, NULL, (size_t)n_max * vd * 4);
    }
    /* a product of the output (ssm_out's place): reads the int8 blocks the GPU's DeltaNet wrote (F16
     * where the output is no whole number of blocks) */
    const qt_type wt = vd % 32 ? QT_F16 : QT_Q8_0;
    void *wd_, *wr_ = make_matrix(c, wt, (int64_t)vd, 64, &wd_);
    const st_weight wr = {wr_, NULL, wt, (int64_t)vd, 64, 1, qt_row_size(wt, (int64_t)vd), NULL};
    st_weight wdw = wr;
    wdw.data = wd_;
    void *yr = put(c->ref, NULL, (size_t)n_max * 64 * 4), *yd = put(c->dut, NULL, (size_t)n_max * 64 * 4);

    /* the calls: (tokens, through run_step) */
    const int calls[6][2] = {{1, 1}, {n_prompt, 0}, {1, 1}, {1, 1}, {3, 0}, {0, 0}};
    double e_out = 0, e_mm = 0, ms = 0;
    int pos = 0;
    for (int k = 0; calls[k][0]; k++) {
        const int n = calls[k][0];
        float *in[4] = {rand_host(c, (size_t)n * cd, 1.0f), rand_host(c, (size_t)n * vd, 1.0f),
                        rand_host(c, (size_t)n * bw, 1.0f), rand_host(c, (size_t)n * nv, 1.0f)};
        for (int i = 0; i < 2; i++) {
            gdn_side *s = &sd[i];
            void *dst[4] = {s->qkv, s->z, s->beta, s->alpha};
            const size_t len[4] = {(size_t)n * cd, (size_t)n * vd, (size_t)n * bw, (size_t)n * nv};
            for (int j = 0; j < 4; j++) s->be->to_device(s->be, dst[j], in[j], len[j] * 4);
            const double t0 = now_ms();
            gdn_call(s, n, pos, calls[k][1]);
            if (i) ms += now_ms() - t0;
            s->be->matmul(s->be, i ? &wdw : &wr, 0, s->out, i ? yd : yr, n);
        }
        e_out = fmax(e_out, cmp_bufs(c, sd[0].out, sd[1].out, (size_t)n * vd));
        e_mm = fmax(e_mm, cmp_bufs(c, yr, yd, (size_t)n * 64));
        for (int j = 0; j < 4; j++) st_free(in[j]);
        pos += n;
    }
    const double e_st =
        fmax(cmp_bufs(c, sd[0].st.ssm, sd[1].st.ssm, ns), cmp_bufs(c, sd[0].st.conv, sd[1].st.conv, (size_t)back * cd));
    const char *lay = grouped ? "qwen3next layout" : "qwen35moe layout";
    report(c, "gated_delta_net", fmax(e_out, e_st), 1e-8, ms,
           "%d/%d heads x %d, %s, 1+%d+1+1+3 tokens (out %.1e, state %.1e)", nk, nv, hd, lay, n_prompt, e_out, e_st);
    report(c, "gated_delta_net", e_mm, 2e-3, 0, "%d/%d heads x %d, then a %s product of its output", nk, nv, hd,
           qt_get(wt)->name);

    /* keep: the state now (saved on the host), a recorded pass of n_rec tokens in two calls, cut to keep */
    float *in[4] = {rand_host(c, (size_t)n_rec * cd, 1.0f), rand_host(c, (size_t)n_rec * vd, 1.0f),
                    rand_host(c, (size_t)n_rec * bw, 1.0f), rand_host(c, (size_t)n_rec * nv, 1.0f)};
    float *save_ssm[2], *save_conv[2];
    for (int i = 0; i < 2; i++) {
        save_ssm[i] = get(sd[i].be, sd[i].st.ssm, ns);
        save_conv[i] = get(sd[i].be, sd[i].st.conv, (size_t)back * cd);
    }
    static const int keeps[3] = {1, 3, 6};
    double e_keep = 0, e_self = 0;
    ms = 0;
    for (int kk = 0; kk < 3; kk++) {
        const int keep = keeps[kk];
        float *self[2] = {NULL, NULL}; /* the dut's state after the cut: ssm, conv */
        for (int i = 0; i < 2; i++) {
            gdn_side *s = &sd[i];
            st_backend *be = s->be;
            be->to_device(be, s->st.ssm, save_ssm[i], ns * 4);
            be->to_device(be, s->st.conv, save_conv[i], (size_t)back * cd * 4);
            void *dst[4] = {s->qkv, s->z, s->beta, s->alpha};
            const size_t len[4] = {(size_t)n_rec * cd, (size_t)n_rec * vd, (size_t)n_rec * bw, (size_t)n_rec * nv};
            for (int j = 0; j < 4; j++) be->to_device(be, dst[j], in[j], len[j] * 4);
            s->st.undo_cap = n_rec;
            s->st.undo_n = 0;
            const double t0 = now_ms();
            for (int part = 0; part < 2; part++) { /* 2 tokens, then 4: the record grows over calls */
                const int off = part ? 2 : 0, n = part ? n_rec - 2 : 2;
                be->gated_delta_net(be, &s->g, &s->st, n, pos + off, s->qkv + (size_t)off * cd, s->z + (size_t)off * vd,
                                    s->beta + (size_t)off * bw, grouped ? NULL : s->alpha + (size_t)off * nv,
                                    s->out + (size_t)off * vd);
            }
            be->gated_delta_net_keep(be, &s->g, &s->st, keep);
            if (i) ms += now_ms() - t0;
        }
        e_keep = fmax(e_keep, fmax(cmp_bufs(c, sd[0].st.ssm, sd[1].st.ssm, ns),
                                   cmp_bufs(c, sd[0].st.conv, sd[1].st.conv, (size_t)back * cd)));
        /* the dut against itself: the saved state, a pass of only the kept tokens */
        gdn_side *s = &sd[1];
        st_backend *be = s->be;
        self[0] = get(be, s->st.ssm, ns);
        self[1] = get(be, s->st.conv, (size_t)back * cd);
        be->to_device(be, s->st.ssm, save_ssm[1], ns * 4);
        be->to_device(be, s->st.conv, save_conv[1], (size_t)back * cd * 4);
        be->gated_delta_net(be, &s->g, &s->st, keep, pos, s->qkv, s->z, s->beta, grouped ? NULL : s->alpha, s->out);
        float *plain_ssm = get(be, s->st.ssm, ns), *plain_conv = get(be, s->st.conv, (size_t)back * cd);
        size_t differ = 0;
        for (size_t j = 0; j < ns; j++) differ += memcmp(&self[0][j], &plain_ssm[j], 4) != 0;
        for (size_t j = 0; j < (size_t)back * cd; j++) differ += memcmp(&self[1][j], &plain_conv[j], 4) != 0;
        e_self = fmax(e_self, (double)differ);
        st_free(self[0]), st_free(self[1]), st_free(plain_ssm), st_free(plain_conv);
    }
    report(c, "gdn_keep", e_keep, 1e-8, ms, "%d/%d heads x %d, %s, a pass of %d cut to 1, 3, %d", nk, nv, hd, lay,
           n_rec, n_rec);
    report(c, "gdn_keep", e_self, 0, 0, "%d/%d heads x %d: values differing from a pass of only the kept tokens", nk,
           nv, hd);
    for (int i = 0; i < 2; i++) st_free(save_ssm[i]), st_free(save_conv[i]);
    for (int j = 0; j < 4; j++) st_free(in[j]);
    c->ref->free(c->ref, wr_), c->dut->free(c->dut, wd_), c->ref->free(c->ref, yr), c->dut->free(c->dut, yd);
    side_free(&sd[0]);
    side_free(&sd[1]);
    st_free(conv_w), st_free(dt), st_free(a), st_free(norm);
}

/* split_halves (a gated attention's query and gate rows), then sigmoid_mul
 * of a per-value gate (rows of dim) and of a per-row one (g_dim 1, the
 * shared expert's), the first followed by a product of its result. */
static void check_gates(chk *c, int n_rows, int n_group, int w) {
    const size_t n = (size_t)n_rows * n_group * w, dim = (size_t)n_group * w;
    float *src = rand_host(c, 2 * n, 2.0f);
    void *sr = put(c->ref, src, 2 * n * 4), *sdp = put(c->dut, src, 2 * n * 4);
    void *ar = put(c->ref, NULL, n * 4), *ad = put(c->dut, NULL, n * 4);
    void *br = put(c->ref, NULL, n * 4), *bd = put(c->dut, NULL, n * 4);
    c->ref->split_halves(c->ref, sr, ar, br, n_rows, n_group, w);
    double t0 = now_ms();
    c->dut->split_halves(c->dut, sdp, ad, bd, n_rows, n_group, w);
    report(c, "split_halves", fmax(cmp_bufs(c, ar, ad, n), cmp_bufs(c, br, bd, n)), 0, now_ms() - t0,
           "%d rows of %d pairs of %d", n_rows, n_group, w);
    void *wd_, *wr_ = make_matrix(c, QT_Q4_K, (int64_t)dim, 64, &wd_);
    const st_weight wr = {wr_, NULL, QT_Q4_K, (int64_t)dim, 64, 1, qt_row_size(QT_Q4_K, (int64_t)dim), NULL};
    st_weight wdw = wr;
    wdw.data = wd_;
    void *yr = put(c->ref, NULL, (size_t)n_rows * 64 * 4), *yd = put(c->dut, NULL, (size_t)n_rows * 64 * 4);
    c->ref->sigmoid_mul(c->ref, ar, br, (int)dim, (int)dim, n_rows);
    t0 = now_ms();
    c->dut->sigmoid_mul(c->dut, ad, bd, (int)dim, (int)dim, n_rows);
    const double ms = now_ms() - t0;
    c->ref->matmul(c->ref, &wr, 0, ar, yr, n_rows);
    c->dut->matmul(c->dut, &wdw, 0, ad, yd, n_rows);
    report(c, "sigmoid_mul", cmp_bufs(c, ar, ad, n), 1e-10, ms, "%d rows of %zu, a gate per value", n_rows, dim);
    report(c, "sigmoid_mul", cmp_bufs(c, yr, yd, (size_t)n_rows * 64), 2e-3, 0,
           "%d rows of %zu, then a Q4_K product of the result", n_rows, dim);
    c->ref->sigmoid_mul(c->ref, br, sr, (int)dim, 1, n_rows); /* the first n_rows values of src as the gates */
    c->dut->sigmoid_mul(c->dut, bd, sdp, (int)dim, 1, n_rows);
    report(c, "sigmoid_mul", cmp_bufs(c, br, bd, n), 1e-10, 0, "%d rows of %zu, a gate per row", n_rows, dim);
    void *bufs[][2] = {{sr, sdp}, {ar, ad}, {br, bd}, {yr, yd}, {wr_, wd_}};
    for (int i = 0; i < 5; i++) c->ref->free(c->ref, bufs[i][0]), c->dut->free(c->dut, bufs[i][1]);
    st_free(src);
}

int backend_check_hybrid(st_backend *ref, st_backend *dut, int size, uint64_t seed, bcheck_report_fn fn, void *ctx) {
    chk c = {ref, dut, seed * 0x9e3779b97f4a7c15ull + 7, fn, ctx, 0};
    if (!dut->gated_delta_net || !dut->split_halves || !dut->sigmoid_mul) return 0; /* a backend without the family */
    check_gdn(&c, 2, 4, 64, 0, size ? 40 : 5);
    check_gdn(&c, 2, 4, 64, 1, 5);
    check_gdn(&c, 1, 3, 48, 0, 4); /* a head size short of whole warps: masked lanes, no int8 output */
    if (size) {
        check_gdn(&c, 16, 32, 128, 0, 70); /* Qwen3.5-35B-A3B's DeltaNet */
        check_gdn(&c, 16, 32, 128, 1, 9);  /* Qwen3-Next-80B's */
    }
    check_gates(&c, 1, 4, 64);
    check_gates(&c, size ? 37 : 3, 4, 64);
    if (size) check_gates(&c, 5, 16, 256); /* Qwen3.5-35B-A3B's attention: 16 heads of 256 */
    return c.fails;
}
