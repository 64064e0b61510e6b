/* Per-op timing of any backend (backend_prof.h): a decorator whose op table
 * forwards each call to the wrapped backend, waits for the device, and adds
 * the wall time to that op's row. Waiting after every op removes the overlap
 * of host and device, so the times are each op's launch plus execution, not
 * what the op costs inside a pipelined or recorded step; they answer "which
 * ops dominate", not "how fast is a step". run_step calls the body directly:
 * a recorded step could not be timed op by op.
 */
#include "backend/backend_prof.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/alloc.h"
#include "core/log.h"
#include "core/timer.h"

typedef enum {
    P_GET_ROWS,
    P_MATMUL,
    P_MATMUL_MULTI,
    P_MATMUL_RES_NORM,
    P_RMSNORM,
    P_QKV_PREP,
    P_ATTENTION,
    P_ACT_MUL,
    P_ADD,
    P_SCALE,
    P_MOE_FFN,
    P_MOE_ROUTE,
    P_MOE_EXPERTS,
    P_TO_HOST,
    P_TO_DEVICE,
    P_GDN,
    P_SPLIT,
    P_SIGMUL,
    P_COPY2D,
    P_N
} prof_op;

static const char *const OP_NAMES[P_N] = {
    "get_rows",  "matmul",   "matmul_multi", "matmul_res_norm", "rmsnorm",   "qkv_prep",    "attention",
    "act_mul",   "add",      "scale",        "moe_ffn",         "moe_route", "moe_experts", "to_host",
    "to_device", "deltanet", "split_qg",     "sigmul",          "copy_2d"};

typedef struct {
    st_backend *in;
    int64_t calls[P_N];
    int64_t ns[P_N];
    int64_t t0;
    char sync_byte; /* host side of the zero-byte read used to wait for the device */
    void *dev_byte; /* a device byte to read */
} prof_ctx;

static prof_ctx *P(st_backend *be) { return (prof_ctx *)be->ctx; }

static void begin(prof_ctx *p) { p->t0 = st_now_ns(); }

/* Wait for the device: to_host waits for everything queued before it. */
static void end(prof_ctx *p, prof_op op) {
    p->in->to_host(p->in, &p->sync_byte, p->dev_byte, 1);
    p->ns[op] += st_now_ns() - p->t0;
    p->calls[op]++;
}

static void *w_alloc(st_backend *be, size_t bytes) { return P(be)->in->alloc(P(be)->in, bytes); }
static void w_free(st_backend *be, void *ptr) { P(be)->in->free(P(be)->in, ptr); }

static void w_get_rows(st_backend *be, const st_weight *w, const int32_t *ids, int n, float *out) {
    prof_ctx *p = P(be);
    begin(p);
    p->in->get_rows(p->in, w, ids, n, out);
    end(p, P_GET_ROWS);
}

static void w_matmul(st_backend *be, const st_weight *w, int64_t mat, const float *x, float *y, int n_tok) {
    prof_ctx *p = P(be);
    begin(p);
    p->in->matmul(p->in, w, mat, x, y, n_tok);
    end(p, P_MATMUL);
}

static void w_matmul_multi(st_backend *be, int n, const st_weight *const *w, const float *x, float *const *y,
                           int n_tok) {
    prof_ctx *p = P(be);
    begin(p);
    p->in->matmul_multi(p->in, n, w, x, y, n_tok);
    end(p, P_MATMUL_MULTI);
}

static void w_matmul_res_norm(st_backend *be, const st_weight *w, const float *x, float *y, float *res, const float *nw,
                              float eps, float *h, const st_weight *wn, float *yn, int n_tok) {
    prof_ctx *p = P(be);
    begin(p);
    p->in->matmul_res_norm(p->in, w, x, y, res, nw, eps, h, wn, yn, n_tok);
    end(p, P_MATMUL_RES_NORM);
}

static void w_rmsnorm(st_backend *be, float *x, const float *res, const float *w, float *y, int dim, int n_rows,
                      float eps) {
    prof_ctx *p = P(be);
    begin(p);
    p->in->rmsnorm(p->in, x, res, w, y, dim, n_rows, eps);
    end(p, P_RMSNORM);
}

static void w_qkv_prep(st_backend *be, float *q, float *k, const float *v, const float *qn, const float *kn, float eps,
                       int n_tok, int n_head, const st_rope *rope, st_kv_layer *kv, int pos0) {
    prof_ctx *p = P(be);
    begin(p);
    p->in->qkv_prep(p->in, q, k, v, qn, kn, eps, n_tok, n_head, rope, kv, pos0);
    end(p, P_QKV_PREP);
}

static void w_attention(st_backend *be, const float *q, const st_kv_layer *kv, int n_tok, int pos0, int n_head,
                        float scale, int window, float *out) {
    prof_ctx *p = P(be);
    begin(p);
    p->in->attention(p->in, q, kv, n_tok, pos0, n_head, scale, window, out);
    end(p, P_ATTENTION);
}

static void w_attention_sinks(st_backend *be, const float *q, const st_kv_layer *kv, int n_tok, int pos0, int n_head,
                              float scale, int window, const float *sinks, float *out) {
    prof_ctx *p = P(be);
    begin(p);
    p->in->attention_sinks(p->in, q, kv, n_tok, pos0, n_head, scale, window, sinks, out);
    end(p, P_ATTENTION);
}

static void w_qkv_prep_seqs(st_backend *be, float *q, float *k, const float *v, const float *qn, const float *kn,
                            float eps, int n, int n_head, const st_rope *rope, st_kv_layer *const *kv, int il,
                            const int *pos) {
    prof_ctx *p = P(be);
    begin(p);
    p->in->qkv_prep_seqs(p->in, q, k, v, qn, kn, eps, n, n_head, rope, kv, il, pos);
    end(p, P_QKV_PREP);
}

static int w_attention_seqs(st_backend *be, const float *q, st_kv_layer *const *kv, int il, int n, const int *pos,
                            int n_head, float scale, int window, const float *sinks, float *out) {
    prof_ctx *p = P(be);
    begin(p);
    const int rc = p->in->attention_seqs(p->in, q, kv, il, n, pos, n_head, scale, window, sinks, out);
    end(p, P_ATTENTION);
    return rc;
}

static void w_act_mul(st_backend *be, st_act act, const float *g, const float *u, float *out, int64_t n) {
    prof_ctx *p = P(be);
    begin(p);
    p->in->act_mul(p->in, act, g, u, out, n);
    end(p, P_ACT_MUL);
}

static void w_add(st_backend *be, float *x, const float *b, int64_t dim, int n_rows) {
    prof_ctx *p = P(be);
    begin(p);
    p->in->add(p->in, x, b, dim, n_rows);
    end(p, P_ADD);
}

static void w_scale(st_backend *be, float *x, float s, int64_t n) {
    prof_ctx *p = P(be);
    begin(p);
    p->in->scale(p->in, x, s, n);
    end(p, P_SCALE);
}

static void w_gdn(st_backend *be, const st_gdn *g, st_kv_layer *st, int n_tok, int pos0, const float *qkv,
                  const float *z, const float *beta, const float *alpha, float *out) {
    prof_ctx *p = P(be);
    begin(p);
    p->in->gated_delta_net(p->in, g, st, n_tok, pos0, qkv, z, beta, alpha, out);
    end(p, P_GDN);
}

static void w_gdn_keep(st_backend *be, const st_gdn *g, st_kv_layer *st, int n_keep) {
    prof_ctx *p = P(be);
    begin(p);
    p->in->gated_delta_net_keep(p->in, g, st, n_keep);
    end(p, P_GDN);
}

static void w_split(st_backend *be, const float *src, float *a, float *b, int n_rows, int n_group, int w) {
    prof_ctx *p = P(be);
    begin(p);
    p->in->split_halves(p->in, src, a, b, n_rows, n_group, w);
    end(p, P_SPLIT);
}

static void w_sigmul(st_backend *be, float *x, const float *g, int dim, int g_dim, int n_rows) {
    prof_ctx *p = P(be);
    begin(p);
    p->in->sigmoid_mul(p->in, x, g, dim, g_dim, n_rows);
    end(p, P_SIGMUL);
}

static void w_copy2d(st_backend *be, float *dst, int64_t ds, const float *src, int64_t ss, int64_t w, int n) {
    prof_ctx *p = P(be);
    begin(p);
    p->in->copy_2d(p->in, dst, ds, src, ss, w, n);
    end(p, P_COPY2D);
}

static void w_moe_ffn(st_backend *be, const float *h, const float *logits, int n_tok, int n_expert, int k,
                      const st_moe_gating *gt, st_act act, const st_weight *gate, const st_weight *up,
                      const st_weight *down, float *out) {
    prof_ctx *p = P(be);
    begin(p);
    p->in->moe_ffn(p->in, h, logits, n_tok, n_expert, k, gt, act, gate, up, down, out);
    end(p, P_MOE_FFN);
}

static void w_moe_route(st_backend *be, const float *logits, int n_tok, int n_expert, int k, const st_moe_gating *gt,
                        int32_t *sel, float *wsel) {
    prof_ctx *p = P(be);
    begin(p);
    p->in->moe_route(p->in, logits, n_tok, n_expert, k, gt, sel, wsel);
    end(p, P_MOE_ROUTE);
}

static void w_moe_experts(st_backend *be, const float *h, int n_tok, int n_expert, int k, const int32_t *sel,
                          const float *wsel, const int32_t *emap, st_act act, const st_weight *gate,
                          const st_weight *up, const st_weight *down, float *out) {
    prof_ctx *p = P(be);
    begin(p);
    p->in->moe_experts(p->in, h, n_tok, n_expert, k, sel, wsel, emap, act, gate, up, down, out);
    end(p, P_MOE_EXPERTS);
}

static void w_run_step(st_backend *be, int n_tok, int pos0, void (*body)(void *, int), void *arg, size_t size) {
    (void)be, (void)n_tok, (void)size;
    body(arg, pos0);
}

static void w_to_host(st_backend *be, void *dst, const void *src, size_t bytes) {
    prof_ctx *p = P(be);
    begin(p);
    p->in->to_host(p->in, dst, src, bytes);
    p->ns[P_TO_HOST] += st_now_ns() - p->t0; /* to_host waits by itself */
    p->calls[P_TO_HOST]++;
}

static void w_to_device(st_backend *be, void *dst, const void *src, size_t bytes) {
    prof_ctx *p = P(be);
    begin(p);
    p->in->to_device(p->in, dst, src, bytes);
    end(p, P_TO_DEVICE);
}

void backend_prof_report(st_backend *be, char *buf, size_t cap) {
    prof_ctx *p = P(be);
    int64_t total = 0;
    for (int i = 0; i < P_N; i++) total += p->ns[i];
    size_t o =
        (size_t)snprintf(buf, cap, "op times on %s (each op waited for; %.1f ms in all):\n%-15s %9s %10s %9s %6s\n",
                         p->in->name, total / 1e6, "op", "calls", "total ms", "mean us", "share");
    int done[P_N] = {0};
    for (int r = 0; r < P_N && o < cap; r++) { /* largest total first */
        int b = -1;
        for (int i = 0; i < P_N; i++)
            if (!done[i] && (b < 0 || p->ns[i] > p->ns[b])) b = i;
        done[b] = 1;
        if (!p->calls[b]) continue;
        o += (size_t)snprintf(buf + o, cap - o, "%-15s %9lld %10.2f %9.2f %5.1f%%\n", OP_NAMES[b],
                              (long long)p->calls[b], p->ns[b] / 1e6, p->ns[b] / 1e3 / (double)p->calls[b],
                              total ? 100.0 * (double)p->ns[b] / (double)total : 0.0);
    }
}

static void w_destroy(st_backend *be) {
    prof_ctx *p = P(be);
    char buf[2048];
    backend_prof_report(be, buf, sizeof buf);
    ST_INFO("%s", buf);
    p->in->free(p->in, p->dev_byte);
    p->in->destroy(p->in);
    st_free(p);
    st_free(be);
}

/* The optional ops, forwarded untimed (an upload is timed with the to_host that waits for it). */
static void w_upload(st_backend *be, void *dst, const void *src, size_t bytes) {
    P(be)->in->upload(P(be)->in, dst, src, bytes);
}
static void w_upload_many(st_backend *be, int n, void *const *dst, const void *const *src, const size_t *bytes) {
    P(be)->in->upload_many(P(be)->in, n, dst, src, bytes);
}
static int w_host_register(st_backend *be, const void *ptr, size_t bytes) {
    return P(be)->in->host_register(P(be)->in, ptr, bytes);
}
static void w_host_unregister(st_backend *be, const void *ptr) { P(be)->in->host_unregister(P(be)->in, ptr); }
static void w_mem_info(st_backend *be, size_t *free_bytes, size_t *total_bytes) {
    P(be)->in->mem_info(P(be)->in, free_bytes, total_bytes);
}
static int w_variant(st_backend *be, st_variant kind, int value) { return P(be)->in->variant(P(be)->in, kind, value); }

st_backend *backend_prof_wrap(st_backend *in) {
    prof_ctx *p = st_calloc(1, sizeof *p);
    p->in = in;
    p->dev_byte = in->alloc(in, 1);
    in->to_device(in, p->dev_byte, &p->sync_byte, 1);
    st_backend *be = st_calloc(1, sizeof *be);
    *be = (st_backend){
        .name = in->name, /* the engine and tests tell backends apart by name */
        .ctx = p,
        .alloc = w_alloc,
        .free = w_free,
        .destroy = w_destroy,
        .get_rows = w_get_rows,
        .matmul = w_matmul,
        .matmul_multi = w_matmul_multi,
        .matmul_res_norm = w_matmul_res_norm,
        .rmsnorm = w_rmsnorm,
        .qkv_prep = w_qkv_prep,
        .attention = w_attention,
        .attention_sinks = in->attention_sinks ? w_attention_sinks : NULL,
        .qkv_prep_seqs = in->qkv_prep_seqs ? w_qkv_prep_seqs : NULL,
        .attention_seqs = in->attention_seqs ? w_attention_seqs : NULL,
        .act_mul = w_act_mul,
        .add = w_add,
        .scale = w_scale,
        .gated_delta_net = in->gated_delta_net ? w_gdn : NULL,
        .gated_delta_net_keep = in->gated_delta_net_keep ? w_gdn_keep : NULL,
        .split_halves = in->split_halves ? w_split : NULL,
        .sigmoid_mul = in->sigmoid_mul ? w_sigmul : NULL,
        .copy_2d = in->copy_2d ? w_copy2d : NULL,
        .moe_ffn = w_moe_ffn,
        .moe_route = w_moe_route,
        .moe_experts = w_moe_experts,
        .run_step = w_run_step,
        .to_host = w_to_host,
        .to_device = w_to_device,
        .upload = in->upload ? w_upload : NULL,
        .upload_many = in->upload_many ? w_upload_many : NULL,
        .host_register = in->host_register ? w_host_register : NULL,
        .host_unregister = in->host_unregister ? w_host_unregister : NULL,
        .mem_info = in->mem_info ? w_mem_info : NULL,
        .variant = in->variant ? w_variant : NULL,
    };
    return be;
}
