/* The GPU backend's op table (backend_cuda.h): one device, one stream, the
 * kernels of ops_elem.cu / attention.cu / getrows.cu, and the matrix
 * products of mm.h (cuda_matmul, by the cudamm helper).
 *
 * All ops are queued on one stream in the forward pass's order, so no op
 * needs a synchronisation of its own; the copies to and from the host wait,
 * because their host buffers belong to the caller once they return.
 *
 * MoE: routing (softmax, top-k) runs on the device; the (token, slot) pairs
 * then go through cudamm's grouped products (cuda_moe_matmul: gate, up,
 * down over all pairs, no host wait in decode) and a weighted sum per token.
 * A second, simpler path loops over the experts on the host (token lists
 * read back, one matmul per expert and matrix): it is kept as a cross-check
 * (backend_cuda_set_moe_path) because it shares no code with the first.
 */
#include <string.h>

#include "backend/cuda/backend_cuda.h"
#include "backend/cuda/common.cuh"
#include "backend/cuda/device.h"
#include "backend/cuda/mm.h"
#include "backend/cuda/ops.h"

extern "C" {
#include "core/alloc.h"
#include "quant/quant.h"
}

typedef struct {
    int dev, n_sm;
    cudaStream_t s;
    cuda_scratch att;  /* attention slice partials */
    cuda_scratch moe;  /* routing results, token lists, expert activations */
    void *pin;         /* pinned host staging (routing read-back, get_rows fallback) */
    size_t pin_bytes;
} cuda_ctx;

static cuda_ctx *CTX(st_backend *be) { return (cuda_ctx *)be->ctx; }

static void *pin_reserve(cuda_ctx *c, size_t bytes) {
    if (bytes > c->pin_bytes) {
        CUDA_CHECK(cudaStreamSynchronize(c->s)); /* a queued copy may still read the old buffer */
        if (c->pin) CUDA_CHECK(cudaFreeHost(c->pin));
        CUDA_CHECK(cudaMallocHost(&c->pin, bytes));
        c->pin_bytes = bytes;
    }
    return c->pin;
}

static void *cu_alloc(st_backend *be, size_t bytes) {
    (void)be;
    void *p = NULL;
    CUDA_CHECK(cudaMalloc(&p, bytes ? bytes : 1));
    return p;
}

static void cu_free(st_backend *be, void *p) {
    (void)be;
    if (p) CUDA_CHECK(cudaFree(p));
}

static void cu_to_host(st_backend *be, void *dst, const void *src, size_t bytes) {
    cuda_ctx *c = CTX(be);
    CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, c->s));
    CUDA_CHECK(cudaStreamSynchronize(c->s));
}

static void cu_to_device(st_backend *be, void *dst, const void *src, size_t bytes) {
    cuda_ctx *c = CTX(be);
    CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, c->s));
    CUDA_CHECK(cudaStreamSynchronize(c->s)); /* the caller may reuse src at once */
}

static void cu_get_rows(st_backend *be, const st_weight *w, const int32_t *ids, int n, float *out) {
    cuda_ctx *c = CTX(be);
    if (n <= 0) return;
    if (cuda_get_rows_supported(w->type)) {
        cuda_get_rows(w, ids, n, out, c->s);
        return;
    }
    /* formats without a device decoder here: exact, slow path through the reference dequantizer */
    size_t nin = (size_t)w->n_in, need = (size_t)n * 4 + w->row_bytes + nin * 4;
    uint8_t *h = (uint8_t *)pin_reserve(c, need);
    int32_t *hid = (int32_t *)h;
    uint8_t *row = h + (size_t)n * 4;
    float *f = (float *)(row + w->row_bytes);
    CUDA_CHECK(cudaMemcpyAsync(hid, ids, (size_t)n * 4, cudaMemcpyDeviceToHost, c->s));
    CUDA_CHECK(cudaStreamSynchronize(c->s));
    for (int i = 0; i < n; i++) {
        ST_ASSERT(hid[i] >= 0 && hid[i] < w->n_out);
        CUDA_CHECK(cudaMemcpyAsync(row, (const uint8_t *)w->data + (size_t)hid[i] * w->row_bytes, w->row_bytes,
                                   cudaMemcpyDeviceToHost, c->s));
        CUDA_CHECK(cudaStreamSynchronize(c->s));
        qt_dequantize(w->type, row, f, w->n_in);
        CUDA_CHECK(cudaMemcpyAsync(out + (size_t)i * nin, f, nin * 4, cudaMemcpyHostToDevice, c->s));
        CUDA_CHECK(cudaStreamSynchronize(c->s));
    }
}

static void cu_matmul(st_backend *be, const st_weight *w, int64_t mat, const float *x, float *y, int n_tok) {
    if (n_tok <= 0) return;
    int rc = cuda_matmul(w, mat, x, y, n_tok, CTX(be)->s);
    ST_ASSERT(rc == 0); /* types were checked at model load: a failure here is a bug */
}

static void cu_rmsnorm(st_backend *be, const float *x, const float *w, float *y, int dim, int n_rows, float eps) {
    cuda_rmsnorm(x, w, y, dim, n_rows, eps, CTX(be)->s);
}

static void cu_rope(st_backend *be, float *x, int n_tok, int n_heads, int head_dim, int pos0, float theta,
                    float freq_scale, int neox) {
    cuda_rope(x, n_tok, n_heads, head_dim, pos0, theta, freq_scale, neox, CTX(be)->s);
}

static void cu_kv_store(st_backend *be, st_kv_layer *kv, const float *k, const float *v, int n_tok, int pos0) {
    cuda_kv_store(kv, k, v, n_tok, pos0, CTX(be)->s);
}

static void cu_attention(st_backend *be, const float *q, const st_kv_layer *kv, int n_tok, int pos0, int n_head,
                         float scale, int window, float *out) {
    cuda_ctx *c = CTX(be);
    cuda_attention(q, kv, n_tok, pos0, n_head, scale, window, out, &c->att, c->n_sm, c->s);
}

static void cu_act_mul(st_backend *be, st_act act, const float *g, const float *u, float *out, int64_t n) {
    cuda_act_mul(act, g, u, out, n, CTX(be)->s);
}

static void cu_add(st_backend *be, float *x, const float *b, int64_t dim, int n_rows) {
    cuda_add(x, b, dim, n_rows, CTX(be)->s);
}

static void cu_scale(st_backend *be, float *x, float s, int64_t n) { cuda_scale(x, s, n, CTX(be)->s); }

static size_t align256(size_t b) { return (b + 255) & ~(size_t)255; }

static int g_moe_loop = 0; /* 1: per-expert loop instead of the grouped products */

extern "C" int backend_cuda_set_moe_path(int loop) {
    int old = g_moe_loop;
    g_moe_loop = loop;
    return old;
}

static void moe_ffn_loop(st_backend *be, const float *h, const float *logits, int n_tok, int n_expert, int k,
                       int norm_topk, st_act act, const st_weight *gate, const st_weight *up, const st_weight *down,
                       float *out) {
    cuda_ctx *c = CTX(be);
    const int64_t E = gate->n_in, F = gate->n_out;
    const size_t nk = (size_t)n_tok * k;
    if (n_tok <= 0) return;
    /* device arena: sel, wsel, per-expert token lists and weights, then hx [n][E], g/u [n][F], y [n][E] */
    size_t o_sel = 0, o_w = align256(nk * 4), o_tok = o_w + align256(nk * 4), o_tw = o_tok + align256(nk * 4);
    size_t o_hx = o_tw + align256(nk * 4), o_g = o_hx + align256((size_t)n_tok * E * 4);
    size_t o_u = o_g + align256((size_t)n_tok * F * 4), o_y = o_u + align256((size_t)n_tok * F * 4);
    size_t total = o_y + align256((size_t)n_tok * E * 4);
    uint8_t *a = (uint8_t *)cuda_scratch_reserve(&c->moe, total);
    int32_t *sel = (int32_t *)(a + o_sel), *tok = (int32_t *)(a + o_tok);
    float *wsel = (float *)(a + o_w), *tw = (float *)(a + o_tw);
    float *hx = (float *)(a + o_hx), *ge = (float *)(a + o_g), *ue = (float *)(a + o_u), *ye = (float *)(a + o_y);

    cuda_moe_route(logits, n_tok, n_expert, k, norm_topk, sel, wsel, c->s);
    /* host side: sel, wsel read back, then a counting sort by expert into
     * token lists (tokens in order) with off[e] = first list index of e */
    uint8_t *hp = (uint8_t *)pin_reserve(c, nk * 16 + (size_t)(2 * n_expert + 1) * 4);
    int32_t *hsel = (int32_t *)hp, *htok = hsel + 2 * nk, *off = hsel + 4 * nk, *fill = off + n_expert + 1;
    float *hwsel = (float *)(hsel + nk), *htw = (float *)(hsel + 3 * nk);
    CUDA_CHECK(cudaMemcpyAsync(hsel, sel, nk * 4, cudaMemcpyDeviceToHost, c->s));
    CUDA_CHECK(cudaMemcpyAsync(hwsel, wsel, nk * 4, cudaMemcpyDeviceToHost, c->s));
    CUDA_CHECK(cudaStreamSynchronize(c->s));
    memset(off, 0, (size_t)(n_expert + 1) * 4);
    for (size_t i = 0; i < nk; i++) {
        ST_ASSERT(hsel[i] >= 0 && hsel[i] < n_expert);
        off[hsel[i] + 1]++;
    }
    for (int e = 0; e < n_expert; e++) off[e + 1] += off[e];
    memcpy(fill, off, (size_t)n_expert * 4);
    for (size_t i = 0; i < nk; i++) {
        int e = hsel[i];
        htok[fill[e]] = (int32_t)(i / (size_t)k);
        htw[fill[e]++] = hwsel[i];
    }
    CUDA_CHECK(cudaMemcpyAsync(tok, htok, nk * 4, cudaMemcpyHostToDevice, c->s));
    CUDA_CHECK(cudaMemcpyAsync(tw, htw, nk * 4, cudaMemcpyHostToDevice, c->s));
    CUDA_CHECK(cudaMemsetAsync(out, 0, (size_t)n_tok * E * 4, c->s));
    for (int e = 0; e < n_expert; e++) {
        int n = off[e + 1] - off[e];
        if (!n) continue;
        cuda_gather_rows(hx, h, tok + off[e], n, E, c->s);
        cu_matmul(be, gate, e, hx, ge, n);
        cu_matmul(be, up, e, hx, ue, n);
        cuda_act_mul(act, ge, ue, ge, (int64_t)n * F, c->s);
        cu_matmul(be, down, e, ge, ye, n);
        cuda_scatter_add(out, ye, tok + off[e], tw + off[e], n, E, c->s);
    }
}

/* Grouped path: pairs p = t*k + j, expert sel[p], input row t. */
static void cu_moe_ffn(st_backend *be, const float *h, const float *logits, int n_tok, int n_expert, int k,
                       int norm_topk, st_act act, const st_weight *gate, const st_weight *up, const st_weight *down,
                       float *out) {
    if (g_moe_loop) {
        moe_ffn_loop(be, h, logits, n_tok, n_expert, k, norm_topk, act, gate, up, down, out);
        return;
    }
    cuda_ctx *c = CTX(be);
    const int64_t E = gate->n_in, F = gate->n_out;
    const int nk = n_tok * k;
    if (n_tok <= 0) return;
    size_t o_w = align256((size_t)nk * 4), o_x = o_w + align256((size_t)nk * 4);
    size_t o_g = o_x + align256((size_t)nk * 4), o_u = o_g + align256((size_t)nk * F * 4);
    size_t o_y = o_u + align256((size_t)nk * F * 4), total = o_y + align256((size_t)nk * E * 4);
    uint8_t *a = (uint8_t *)cuda_scratch_reserve(&c->moe, total);
    int32_t *sel = (int32_t *)a, *xrow = (int32_t *)(a + o_x);
    float *wsel = (float *)(a + o_w), *ge = (float *)(a + o_g), *ue = (float *)(a + o_u), *ye = (float *)(a + o_y);
    cuda_moe_route(logits, n_tok, n_expert, k, norm_topk, sel, wsel, c->s);
    cuda_moe_pair_rows(xrow, nk, k, c->s);
    /* A format the grouped products lack (they return -1 with st_error, e.g.
     * F32 experts): the per-expert loop, which recomputes everything, so no
     * partial result is used. Said once per process. */
    int ok = cuda_moe_matmul(gate, NULL, sel, xrow, nk, h, n_tok, ge, c->s) == 0 &&
             cuda_moe_matmul(up, NULL, sel, xrow, nk, h, n_tok, ue, c->s) == 0;
    if (ok) {
        cuda_act_mul(act, ge, ue, ge, (int64_t)nk * F, c->s);
        ok = cuda_moe_matmul(down, NULL, sel, NULL, nk, ge, nk, ye, c->s) == 0;
    }
    if (!ok) {
        static int warned;
        if (!warned++) ST_WARN("MoE grouped products: %s; using the per-expert loop", st_error_get());
        moe_ffn_loop(be, h, logits, n_tok, n_expert, k, norm_topk, act, gate, up, down, out);
        return;
    }
    cuda_moe_combine(out, ye, wsel, n_tok, k, E, c->s);
}

static void cu_destroy(st_backend *be) {
    cuda_ctx *c = CTX(be);
    CUDA_CHECK(cudaSetDevice(c->dev));
    CUDA_CHECK(cudaStreamSynchronize(c->s));
    cuda_scratch_free(&c->att);
    cuda_scratch_free(&c->moe);
    if (c->pin) CUDA_CHECK(cudaFreeHost(c->pin));
    CUDA_CHECK(cudaStreamDestroy(c->s));
    cuda_mm_release();
    st_free(c);
    st_free(be);
}

extern "C" void backend_cuda_sync(st_backend *be) { CUDA_CHECK(cudaStreamSynchronize(CTX(be)->s)); }

extern "C" st_backend *backend_cuda_create(int device) {
    if (gpu_device_check(device) != 0) return NULL;
    CUDA_CHECK(cudaSetDevice(device));
    cuda_ctx *c = (cuda_ctx *)st_calloc(1, sizeof *c);
    c->dev = device;
    cudaDeviceProp p;
    CUDA_CHECK(cudaGetDeviceProperties(&p, device));
    c->n_sm = p.multiProcessorCount;
    CUDA_CHECK(cudaStreamCreate(&c->s));
    st_backend *be = (st_backend *)st_calloc(1, sizeof *be);
    be->name = "cuda";
    be->ctx = c;
    be->alloc = cu_alloc;
    be->free = cu_free;
    be->destroy = cu_destroy;
    be->get_rows = cu_get_rows;
    be->matmul = cu_matmul;
    be->rmsnorm = cu_rmsnorm;
    be->rope = cu_rope;
    be->kv_store = cu_kv_store;
    be->attention = cu_attention;
    be->act_mul = cu_act_mul;
    be->add = cu_add;
    be->scale = cu_scale;
    be->moe_ffn = cu_moe_ffn;
    be->to_host = cu_to_host;
    be->to_device = cu_to_device;
    return be;
}
