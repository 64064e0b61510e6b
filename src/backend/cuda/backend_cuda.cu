/* The GPU backend's op table (backend_cuda.h): one device, one stream, the
 * kernels of ops_elem.cu / attention.cu / getrows.cu / deltanet.cu, and the matrix
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
 * (the ST_VARIANT_MOE_PATH variant) because it shares no code with the first.
 *
 * Decode steps are CUDA graphs (run_step): a one-token step is recorded once
 * and replayed while its buffers stay the same (and no scratch has grown:
 * cuda_mem_generation). Inside a step the position is read from d_pos, so
 * the recorded kernels serve every position. A decode step launches ~20
 * kernels per layer; replaying them as one graph removes the host launch
 * cost of each, which at these sizes is as long as the kernels themselves.
 * STRATA_CUDA_GRAPH=0 turns it off (for comparison).
 *
 * A batched step of 2 to 8 sequences, one token each (run_step_rows), is
 * recorded the same way, its own graph beside the one-token one: the rows'
 * positions are copied to d_rows before each launch and read there by the
 * batched rotary and attention (cuda_seq_rows.dpos); the caller's key holds
 * every row's cache, so another set of sequences records again. A step
 * with an op that takes its position from the host (a sequence past the
 * short span, a latent or recurrent layer) is not recorded (rows_bad).
 *
 * Activation reuse: consecutive products of one input (q, k, v; an expert's
 * gate and up) quantize it once. act_* remembers the input the quantized
 * scratch holds; every op that writes device memory forgets it (act_forget)
 * unless it is a product whose output lies apart from that input.
 *
 * Fused ops (backend.h; STRATA_CUDA_FUSE or the ST_VARIANT_FUSE variant, bits
 * below, turn each into its composition, backend_compose.h):
 *  - matmul_multi, products of one input (q, k and v; gate and up): the
 *    decode-sized quantized ones in one launch per weight type, or one for
 *    two types that share a launch (cuda_matmul_jobs: v in Q6_K with q and k
 *    in Q4_K or Q5_K);
 *  - matmul_res_norm, a block's output product, the residual add, the next
 *    norm (and the router): for one token, the product adds its output into
 *    the residual as it writes it, and a float product after the norm (the
 *    MoE router) normalises the residual itself in every block
 *    (cuda_matmul_norm): no add and no norm kernel;
 *  - the MoE routes inside its first kernel (mmv_moe.h) instead of a
 *    routing kernel before it (moe_ffn).
 * Decode attention writes its output as the int8 input of the product after
 * it (no quantization kernel there).
 */
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "backend/cuda/backend_cuda.h"
#include "backend/cuda/common.cuh"
#include "backend/cuda/deltanet.h"
#include "backend/cuda/device.h"
#include "backend/cuda/mm/mm.h"
#include "backend/cuda/mm/mmv_moe.h"
#include "backend/cuda/tune/tune.h"
#include "backend/cuda/ops.h"

extern "C" {
#include "backend/backend_compose.h"
#include "core/alloc.h"
#include "core/switches.h"
#include "quant/quant.h"
}

/* The fusions, each its own bit of STRATA_CUDA_FUSE (default all) so that
 * each can be measured alone; a bit off runs that op as its composition. */
#define FUSE_JOBS  1 /* matmul_multi: products of one input in one launch */
#define FUSE_ROUTE 2 /* routing in the MoE kernel */
#define FUSE_NORM  4 /* matmul_res_norm: the residual add in the product, the norm in the float product after it */
#define FUSE_ALL   7

typedef struct {
    int dev, n_sm, cc_major;
    cudaStream_t s;
    /* decode graphs */
    int graphs;                 /* 1: record and replay one-token steps */
    int *d_pos;                 /* the step's position, on the device */
    const int *step_pos;        /* d_pos while a step runs under run_step's graph mode, else NULL */
    int step_short;             /* that step is for positions below CUDA_ATT_SHORT_SPAN (attention sized for them) */
    int capturing, capture_bad; /* recording; an op met that cannot be recorded */
    int seg_probe;        /* a live segmented step, between a begin or resume and a cut (what a recording would hold) */
    int seg_unrecordable; /* ... met an op that cannot be recorded: seg_key says so */
    cudaGraphExec_t exec;
    void *key; /* the step arguments the graph was recorded with */
    size_t key_size;
    void (*key_body)(void *, int); /* and its body: the decoder's step, or the MTP block's (forward.c) */
    unsigned long long key_gen;
    int key_short; /* the step_short the graph was recorded with */
    /* batched steps (run_step_rows) */
    int *d_rows;               /* the rows' positions, on the device */
    const int *step_rows;      /* d_rows while such a step runs in graph mode, else NULL */
    cudaGraphExec_t rows_exec; /* the last recorded batched step */
    void *rows_key;            /* the caller's key it was recorded with */
    size_t rows_key_size;
    unsigned long long rows_gen;
    unsigned long long rows_bad; /* bit n: a step of n rows met an op that cannot be recorded */
    /* activation reuse */
    const float *act_x;
    int64_t act_n; /* values of x it holds (rows x n_in; blocks of 32 never cross rows) */
    int act_valid;
    int act_reuse; /* 0: never reuse (STRATA_CUDA_ACT_REUSE=0) */
    int moe_fused; /* decode MoE in the two fused kernels (STRATA_CUDA_MOE_FUSED, default 1) */
    /* this backend's choices, read once at creation (so two cards may differ) and changed only by be->variant */
    int fuse;           /* FUSE_* bits (STRATA_CUDA_FUSE, default FUSE_ALL) */
    int attn_mode;      /* CUDA_ATT_* (STRATA_CUDA_ATTN: head, gqa, tc; default tc) */
    int moe_path;       /* 0 fused decode / grouped, 1 the per-expert loop, 2 grouped only */
    cuda_scratch att;   /* attention slice partials */
    cuda_scratch moe;   /* routing results, token lists, expert activations */
    cuda_scratch topk;  /* top-k candidates */
    cuda_scratch gdn;   /* the DeltaNet's per-token rows (deltanet.cu) */
    cuda_scratch heads; /* matmul's ST_MAT_ALL: pair ids, per-matrix rows */
    void *pin;          /* pinned host staging (routing read-back, get_rows fallback) */
    size_t pin_bytes;
} cuda_ctx;

static cuda_ctx *CTX(st_backend *be) { return (cuda_ctx *)be->ctx; }

static int g_live_backends; /* CUDA backends of the process not yet destroyed */

static void act_forget(cuda_ctx *c) { c->act_valid = 0; }

/* What every op but the products does first: forget the quantized input (the op may write it). */
static void op_begin(cuda_ctx *c) { act_forget(c); }

/* A path that needs the host in the middle (a synchronisation) cannot be
 * recorded: mark the recording bad, so that run_step drops it; the step's
 * result comes from its unrecorded first pass. Returns 1 when so. */
static int cannot_record(cuda_ctx *c) {
    if (!c->capturing) {
        if (c->seg_probe) c->seg_unrecordable = 1; /* a live step's part that a recording would hold */
        return 0;
    }
    c->capture_bad = 1;
    return 1;
}

/* An op that takes its position from the host, inside a batched step in
 * graph mode (whose replays must not see the recorded position): as
 * cannot_record. Outside a recording it runs, with the host's position. */
static int host_pos(cuda_ctx *c) { return c->step_rows && cannot_record(c); }

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

/* A recorded step may hold p, and the step's key (the caller's argument
 * bytes) may come back unchanged with other buffers behind it (a sequence
 * freed and a new one whose cache array lands at the same host address):
 * every free counts as moved memory, so the next step records again. */
static void cu_free(st_backend *be, void *p) {
    (void)be;
    if (p) CUDA_CHECK(cudaFree(p));
    cuda_mem_grew();
}

static void cu_to_host(st_backend *be, void *dst, const void *src, size_t bytes) {
    cuda_ctx *c = CTX(be);
    CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, c->s));
    CUDA_CHECK(cudaStreamSynchronize(c->s));
}

static void cu_to_device(st_backend *be, void *dst, const void *src, size_t bytes) {
    cuda_ctx *c = CTX(be);
    op_begin(c);
    CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, c->s));
    CUDA_CHECK(cudaStreamSynchronize(c->s)); /* the caller may reuse src at once */
}

static void cu_upload(st_backend *be, void *dst, const void *src, size_t bytes) {
    cuda_ctx *c = CTX(be);
    op_begin(c);
    CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, c->s));
}

#if !ST_GPU_IS_HIP
static void cu_upload_many(st_backend *be, int n, void *const *dst, const void *const *src, const size_t *bytes) {
    cuda_ctx *c = CTX(be);
    op_begin(c);
    cuda_gather_copy(n, dst, src, bytes, c->s);
}
#endif

/* Page-locks the pages that hold [p, p + bytes) in place (the GGUF's mmap):
 * read-only where the device allows it (a file mapped without write
 * access), else plain. */
static int cu_host_register(st_backend *be, const void *p, size_t bytes) {
    (void)be;
    const uintptr_t page = (uintptr_t)sysconf(_SC_PAGESIZE), a = (uintptr_t)p & ~(page - 1),
                    b = ((uintptr_t)p + bytes + page - 1) & ~(page - 1);
    cudaError_t err = cudaErrorNotSupported;
#ifdef cudaHostRegisterReadOnly
    err = cudaHostRegister((void *)a, b - a,
                           cudaHostRegisterPortable | cudaHostRegisterMapped | cudaHostRegisterReadOnly);
#endif
    if (err != cudaSuccess) {
        (void)cudaGetLastError();
        err = cudaHostRegister((void *)a, b - a, cudaHostRegisterPortable | cudaHostRegisterMapped);
    }
    if (err != cudaSuccess) {
        (void)cudaGetLastError();
        st_error_set("cudaHostRegister of %.1f MiB: %s", (double)(b - a) / (1 << 20), cudaGetErrorString(err));
        return -1;
    }
    return 0;
}

static void cu_mem_info(st_backend *be, size_t *free_bytes, size_t *total_bytes) {
    CUDA_CHECK(cudaSetDevice(CTX(be)->dev));
    CUDA_CHECK(cudaMemGetInfo(free_bytes, total_bytes));
}

static void cu_host_unregister(st_backend *be, const void *p) {
    (void)be;
    const uintptr_t page = (uintptr_t)sysconf(_SC_PAGESIZE);
    CUDA_CHECK(cudaHostUnregister((void *)((uintptr_t)p & ~(page - 1))));
}

static void cu_get_rows(st_backend *be, const st_weight *w, const int32_t *ids, int n, float *out) {
    cuda_ctx *c = CTX(be);
    op_begin(c);
    if (n <= 0) return;
    if (cuda_get_rows_supported(w->type)) {
        cuda_get_rows(w, ids, n, out, c->s);
        return;
    }
    /* formats without a device decoder here: exact, slow path through the reference dequantizer */
    if (cannot_record(c)) return;
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

/* Whether the quantized scratch holds x as n_rows rows of n_in. */
static int act_ready(const cuda_ctx *c, const float *x, int64_t n_in, int n_rows) {
    return c->act_reuse && c->act_valid && c->act_x == x && c->act_n == n_in * n_rows;
}

static void act_hold(cuda_ctx *c, const float *x, int64_t n) { c->act_x = x, c->act_n = n, c->act_valid = 1; }

/* Scratch for a producer op to quantize its output of n values into (n a
 * multiple of 32), or NULL: reuse off, or n not a multiple of 32. */
static int8_t *act_target(cuda_ctx *c, int64_t n, float2 **ad) {
    int8_t *aq = NULL;
    if (!c->act_reuse || n % 32 != 0 || n > INT32_MAX) return NULL;
    if (cuda_mm_act_scratch(n, 1, &aq, ad, c->s) != 0) return NULL;
    return aq;
}

/* After a product of x (n_rows of n_in) into y (y_bytes): the scratch holds
 * x quantized when the product quantized it (matrix-vector path, quantized
 * weights), unless y overlaps x; a float product leaves it as it was. */
static void act_after(cuda_ctx *c, const st_weight *w, const float *x, int n_rows, const float *y, size_t y_bytes,
                      int quantized) {
    const uint8_t *ya = (const uint8_t *)y, *yb = ya + y_bytes;
    if (quantized) {
        act_hold(c, x, w->n_in * n_rows);
    } else if (c->act_valid) {
        const uint8_t *xa = (const uint8_t *)c->act_x, *xb = xa + (size_t)c->act_n * 4;
        if (ya < xb && xa < yb) c->act_valid = 0;
    }
}

static int quantizes(const st_weight *w, int n_tok) {
    return w->type != QT_F32 && w->type != QT_F16 && w->type != QT_BF16 && n_tok <= MM_MMV_MAX_TOK;
}

static void matmul_tracked(cuda_ctx *c, const st_weight *w, int64_t mat, const float *x, float *y, int n_tok) {
    const int q = quantizes(w, n_tok);
    int rc = cuda_matmul(w, mat, x, y, n_tok, q && act_ready(c, x, w->n_in, n_tok), c->s);
    ST_ASSERT(rc == 0);                        /* types were checked at model load: a failure here is a bug */
    if (n_tok > MM_MMV_MAX_TOK) act_forget(c); /* the GEMM path leaves the scratch as it was: forget, to be plain */
    else act_after(c, w, x, n_tok, y, (size_t)n_tok * w->n_out * 4, q);
}

/* matmul with ST_MAT_ALL (multi-head latent attention's per-head products):
 * the (token, matrix) rows as the pairs of one grouped product
 * (cuda_moe_matmul, pair p takes matrix p % n_mat and row p of x): decode
 * sizes in calls of MM_MOE_DEVICE_MAX pairs (the matrix-vector kernel, any
 * format, recordable); prompts as one strided batched GEMM of the stack
 * dequantized to bf16 (cuda_matmul_heads), or where cuBLAS is refused or
 * absent: quantized matrices in one grouped call, float matrices one
 * product per matrix over its rows gathered by copy_2d. */
#define HEADS_DEVICE_CALLS 16 /* most matrix-vector calls of the first form: 8 tokens of 128 heads */
static void stack_products(cuda_ctx *c, const st_weight *w, const float *x, float *y, int n_tok) {
    const int64_t H = w->n_mat, ni = w->n_in, no = w->n_out;
    const int n = n_tok * (int)H, isf = w->type == QT_F32 || w->type == QT_F16 || w->type == QT_BF16;
    /* a prompt: one strided batched GEMM over every matrix when the library takes it */
    if (n > HEADS_DEVICE_CALLS * MM_MOE_DEVICE_MAX) {
        const int rc = cuda_matmul_heads(w, x, y, n_tok, c->s);
        ST_ASSERT(rc >= 0); /* types were checked at model load */
        if (rc == 0) return;
    }
    if (n <= HEADS_DEVICE_CALLS * MM_MOE_DEVICE_MAX || !isf) {
        int32_t *ids = (int32_t *)cuda_scratch_reserve(&c->heads, (size_t)n * sizeof(int32_t));
        cuda_heads_ids(ids, n, (int)H, c->s);
        const int step = n <= HEADS_DEVICE_CALLS * MM_MOE_DEVICE_MAX ? MM_MOE_DEVICE_MAX : n;
        for (int p0 = 0; p0 < n; p0 += step) {
            const int np = n - p0 < step ? n - p0 : step;
            const int rc = cuda_moe_matmul(w, NULL, ids + p0, NULL, np, x + (size_t)p0 * ni, np, y + (size_t)p0 * no, 0,
                                           NULL, c->s);
            ST_ASSERT(rc == 0); /* types were checked at model load */
        }
    } else {
        float *xs = (float *)cuda_scratch_reserve(&c->heads, (size_t)n_tok * (size_t)(ni + no) * sizeof(float));
        float *ys = xs + (size_t)n_tok * ni;
        for (int64_t m = 0; m < H; m++) {
            cuda_copy_2d(xs, ni, x + m * ni, H * ni, ni, n_tok, c->s);
            act_forget(c);
            matmul_tracked(c, w, m, xs, ys, n_tok);
            cuda_copy_2d(y + m * no, H * no, ys, no, no, n_tok, c->s);
        }
    }
}

/* The stack's products without its bias (the pairs' products do not add
 * it), then the bias once: [n_mat][n_out] per token, as y's rows. */
static void matmul_all(cuda_ctx *c, const st_weight *w, const float *x, float *y, int n_tok) {
    op_begin(c);
    st_weight plain = *w;
    plain.bias = NULL;
    stack_products(c, &plain, x, y, n_tok);
    if (w->bias) cuda_add(y, w->bias, w->n_mat * w->n_out, n_tok, c->s);
    act_forget(c);
}

static void cu_matmul(st_backend *be, const st_weight *w, int64_t mat, const float *x, float *y, int n_tok) {
    if (n_tok <= 0) return;
    if (mat == ST_MAT_ALL) {
        matmul_all(CTX(be), w, x, y, n_tok);
        return;
    }
    matmul_tracked(CTX(be), w, mat, x, y, n_tok);
}

/* Whether a product takes a cuda_matmul_jobs launch: decode-sized, of
 * quantized, contiguous weights. */
static int jobs_fit(const st_weight *w, int n_tok) { return cuda_matmul_jobs_fit(w, n_tok) && w->data && !w->mat; }

/* n products of x (jobs_fit, one n_in) in cuda_matmul_jobs launches: those
 * of one weight type together, and with them those of a second type that
 * cuda_matmul_jobs_pair takes in one launch. y_add: the residual a single
 * product also adds its output into, or NULL. */
static void jobs_launch(cuda_ctx *c, const st_weight *const *w, float *const *y, float *y_add, int n, const float *x,
                        int n_tok) {
    ST_ASSERT(n <= CUDA_MM_MAX_JOBS && (!y_add || n == 1));
    int done[CUDA_MM_MAX_JOBS] = {0};
    for (int i = 0; i < n; i++) {
        if (done[i]) continue;
        cuda_mm_job jobs[CUDA_MM_MAX_JOBS];
        int k = 0;
        qt_type t2 = w[i]->type; /* a second type that shares the launch, if any */
        for (int j = i + 1; j < n && t2 == w[i]->type; j++)
            if (!done[j] && cuda_matmul_jobs_pair(w[i]->type, w[j]->type)) t2 = w[j]->type;
        for (int j = i; j < n; j++)
            if (!done[j] && (w[j]->type == w[i]->type || w[j]->type == t2)) {
                jobs[k].w = w[j], jobs[k].mat = 0, jobs[k].y = y[j], jobs[k].y_add = y_add;
                k++;
                done[j] = 1;
            }
        const int rc = cuda_matmul_jobs(jobs, k, x, n_tok, act_ready(c, x, w[i]->n_in, n_tok), c->s);
        ST_ASSERT(rc == 0);                 /* jobs_fit checked the types and shapes */
        act_hold(c, x, w[i]->n_in * n_tok); /* it quantized x (outputs lie apart from it) */
    }
}

/* Products of one input (backend.h): runs of up to CUDA_MM_MAX_JOBS that
 * jobs_fit take one launch each (per type, or type pair); the others run
 * alone, in order, reusing x's quantized form. */
static void cu_matmul_multi(st_backend *be, int n, const st_weight *const *w, const float *x, float *const *y,
                            int n_tok) {
    cuda_ctx *c = CTX(be);
    if (!(c->fuse & FUSE_JOBS)) {
        backend_compose_matmul_multi(be, n, w, x, y, n_tok);
        return;
    }
    if (n_tok <= 0) return;
    for (int i = 0; i < n;) {
        int m = 0;
        while (i + m < n && m < CUDA_MM_MAX_JOBS && jobs_fit(w[i + m], n_tok) && w[i + m]->n_in == w[i]->n_in) m++;
        if (m) {
            jobs_launch(c, w + i, y + i, NULL, m, x, n_tok);
            i += m;
        } else {
            matmul_tracked(c, w[i], 0, x, y[i], n_tok);
            i++;
        }
    }
}

/* Decode-sized rows are quantized as they are written, for the product that
 * follows (q/k/v, the router or the experts, the output head). */
static void norm_launch(cuda_ctx *c, float *x, const float *res, const float *w, float *y, int dim, int n_rows,
                        float eps) {
    float2 *ad = NULL;
    int8_t *aq = n_rows <= MM_MMV_MAX_TOK ? act_target(c, (int64_t)dim * n_rows, &ad) : NULL;
    cuda_rmsnorm(x, res, w, y, dim, n_rows, eps, aq, ad, c->s);
    if (aq) act_hold(c, y, (int64_t)dim * n_rows);
}

/* A block's output, the residual add, the next norm and the router
 * (backend.h): one token's product adds its output into res as it writes
 * it; a float router then normalises res itself (cuda_matmul_norm), else
 * the norm runs alone and the router after it. Other sizes: the
 * composition (which is also what the fused kernels compute). */
static void cu_matmul_res_norm(st_backend *be, const st_weight *w, const float *x, float *y, float *res,
                               const float *nw, float eps, float *h, const st_weight *wn, float *yn, int n_tok) {
    cuda_ctx *c = CTX(be);
    if (!(c->fuse & FUSE_NORM) || n_tok != 1 || !jobs_fit(w, 1)) {
        backend_compose_matmul_res_norm(be, w, x, y, res, nw, eps, h, wn, yn, n_tok);
        return;
    }
    const int dim = (int)w->n_out;
    jobs_launch(c, &w, &y, res, 1, x, 1);
    act_forget(c); /* what follows writes h */
    if (wn && wn->n_in == dim) {
        float2 *ad = NULL;
        int8_t *aq = act_target(c, dim, &ad);
        if (cuda_matmul_norm(wn, res, nw, eps, h, aq, ad, yn, c->s) == 0) {
            if (aq) act_hold(c, h, dim); /* the router wrote h's int8 blocks, as the norm would have */
            return;
        }
    }
    norm_launch(c, res, NULL, nw, h, dim, 1, eps);
    if (wn) matmul_tracked(c, wn, 0, h, yn, 1);
}

static void cu_rmsnorm(st_backend *be, float *x, const float *res, const float *w, float *y, int dim, int n_rows,
                       float eps) {
    cuda_ctx *c = CTX(be);
    op_begin(c);
    norm_launch(c, x, res, w, y, dim, n_rows, eps);
}

/* Several sequences' decode attention in one launch (the per-head kernel;
 * not when the GQA kernel is forced for a comparison). */
static int cu_attention_seqs(st_backend *be, const float *q, st_kv_layer *const *kv, int il, int n, const int *pos,
                             int n_head, float scale, int window, const float *sinks, float *out) {
    cuda_ctx *c = CTX(be);
    op_begin(c);
    if (c->attn_mode == CUDA_ATT_GQA || c->step_pos) return 1;
    const int64_t w = (int64_t)n * n_head * kv[0][il].head_dim;
    float2 *ad = NULL;
    int8_t *aq = n <= MM_MMV_MAX_TOK && kv[0][il].head_dim % 32 == 0 ? act_target(c, w, &ad) : NULL;
    if (cuda_attention_seqs(q, kv, il, n, pos, c->step_rows, n_head, scale, window, sinks, out, aq, ad, &c->att,
                            c->n_sm, c->s))
        return 1;
    if (aq) act_hold(c, out, w);
    return 0;
}

static void cu_attention(st_backend *be, const float *q, const st_kv_layer *kv, int n_tok, int pos0, int n_head,
                         float scale, int window, float *out) {
    cuda_ctx *c = CTX(be);
    op_begin(c);
    if (host_pos(c)) return;
    /* decode-sized: the output also quantized for the product after it */
    float2 *ad = NULL;
    int8_t *aq = n_tok <= MM_MMV_MAX_TOK && kv->head_dim % 32 == 0
                     ? act_target(c, (int64_t)n_tok * n_head * kv->head_dim, &ad)
                     : NULL;
    cuda_attention(q, kv, n_tok, pos0, c->step_pos, c->step_short ? CUDA_ATT_SHORT_SPAN : 0, n_head, scale, window, out,
                   aq, ad, &c->att, c->n_sm, c->cc_major, c->attn_mode, c->s);
    if (aq) act_hold(c, out, (int64_t)n_tok * n_head * kv->head_dim);
}

/* gpt-oss: attention with a sink logit per head (the same kernels; see attention.cu). */
static void cu_attention_sinks(st_backend *be, const float *q, const st_kv_layer *kv, int n_tok, int pos0, int n_head,
                               float scale, int window, const float *sinks, float *out) {
    cuda_ctx *c = CTX(be);
    op_begin(c);
    if (host_pos(c)) return;
    float2 *ad = NULL;
    int8_t *aq = n_tok <= MM_MMV_MAX_TOK && kv->head_dim % 32 == 0
                     ? act_target(c, (int64_t)n_tok * n_head * kv->head_dim, &ad)
                     : NULL;
    cuda_attention_sinks(q, kv, n_tok, pos0, c->step_pos, c->step_short ? CUDA_ATT_SHORT_SPAN : 0, n_head, scale,
                         window, sinks, out, aq, ad, &c->att, c->n_sm, c->cc_major, c->attn_mode, c->s);
    if (aq) act_hold(c, out, (int64_t)n_tok * n_head * kv->head_dim);
}

/* The output quantized as it is written, for the down product. */
static void cu_act_mul(st_backend *be, st_act act, const float *g, const float *u, float *out, int64_t n) {
    cuda_ctx *c = CTX(be);
    op_begin(c);
    float2 *ad = NULL;
    int8_t *aq = act_target(c, n, &ad);
    cuda_act_mul(act, g, u, out, n, aq, ad, c->s);
    if (aq) act_hold(c, out, n);
}

static void cu_add(st_backend *be, float *x, const float *b, int64_t dim, int n_rows) {
    op_begin(CTX(be));
    cuda_add(x, b, dim, n_rows, CTX(be)->s);
}

static void cu_scale(st_backend *be, float *x, float s, int64_t n) {
    op_begin(CTX(be));
    cuda_scale(x, s, n, CTX(be)->s);
}

static void cu_qkv_prep_seqs(st_backend *be, float *q, float *k, const float *v, const float *qn, const float *kn,
                             float eps, int n, int n_head, const st_rope *rope, st_kv_layer *const *kv, int il,
                             const int *pos) {
    cuda_ctx *c = CTX(be);
    op_begin(c);
    cuda_qkv_prep_seqs(q, k, v, qn, kn, eps, n, n_head, rope, kv, il, pos, c->step_rows, c->s);
}

static void cu_qkv_prep(st_backend *be, float *q, float *k, const float *v, const float *qn, const float *kn, float eps,
                        int n_tok, int n_head, const st_rope *rope, st_kv_layer *kv, int pos0) {
    cuda_ctx *c = CTX(be);
    op_begin(c);
    if (host_pos(c)) return;
    cuda_qkv_prep(q, k, v, qn, kn, eps, n_tok, n_head, rope, kv, pos0, c->step_pos, c->s);
}

/* The hybrid family's ops (deltanet.cu). A DeltaNet call of a decode step
 * reads its position on the device (a recorded step may be at position 0,
 * which starts from a zero state); one that records the undo record keeps
 * its count on the host, so it is never recorded (verify passes are
 * several tokens anyway). Decode-sized outputs are also written as the
 * int8 input of the product that follows (ssm_out, attn_output). */
static void cu_gated_delta_net(st_backend *be, const st_gdn *g, st_kv_layer *st, int n_tok, int pos0, const float *qkv,
                               const float *z, const float *beta, const float *alpha, float *out) {
    cuda_ctx *c = CTX(be);
    op_begin(c);
    if (n_tok <= 0 || (st->undo_cap > 0 && cannot_record(c)) || host_pos(c)) return;
    float *scr = (float *)cuda_scratch_reserve(&c->gdn, cuda_gdn_scratch_floats(g, n_tok) * sizeof(float));
    const int64_t n = (int64_t)n_tok * g->n_v_head * g->head_dim;
    float2 *ad = NULL;
    int8_t *aq = n_tok <= MM_MMV_MAX_TOK && g->head_dim % 32 == 0 ? act_target(c, n, &ad) : NULL;
    cuda_gated_delta_net(g, st, n_tok, pos0, c->step_pos, qkv, z, beta, alpha, out, scr, aq, ad, c->s);
    if (aq) act_hold(c, out, n);
}

static void cu_gated_delta_net_keep(st_backend *be, const st_gdn *g, st_kv_layer *st, int n_keep) {
    op_begin(CTX(be));
    cuda_gated_delta_net_keep(g, st, n_keep, CTX(be)->s);
}

static void cu_split_halves(st_backend *be, const float *src, float *a, float *b, int n_rows, int n_group, int w) {
    op_begin(CTX(be));
    cuda_split_halves(src, a, b, n_rows, n_group, w, CTX(be)->s);
}

static void cu_sigmoid_mul(st_backend *be, float *x, const float *g, int dim, int g_dim, int n_rows) {
    cuda_ctx *c = CTX(be);
    op_begin(c);
    float2 *ad = NULL;
    int8_t *aq =
        n_rows <= MM_MMV_MAX_TOK && g_dim == dim && dim % 32 == 0 ? act_target(c, (int64_t)n_rows * dim, &ad) : NULL;
    cuda_sigmoid_mul(x, g, dim, g_dim, n_rows, aq, ad, c->s);
    if (aq) act_hold(c, x, (int64_t)n_rows * dim);
}

static void cu_copy_2d(st_backend *be, float *dst, int64_t dst_stride, const float *src, int64_t src_stride,
                       int64_t width, int n_rows) {
    op_begin(CTX(be));
    cuda_copy_2d(dst, dst_stride, src, src_stride, width, n_rows, CTX(be)->s);
}

static size_t align256(size_t b) { return (b + 255) & ~(size_t)255; }

static void moe_ffn_loop(cuda_ctx *c, const float *h, const float *logits, int n_tok, int n_expert, int k,
                         const st_moe_gating *gt, st_act act, const st_weight *gate, const st_weight *up,
                         const st_weight *down, float *out) {
    const int64_t E = gate->n_in, F = gate->n_out;
    const size_t nk = (size_t)n_tok * k;
    act_forget(c);
    if (n_tok <= 0 || cannot_record(c)) return;
    /* device arena: sel, wsel, per-expert token lists and weights, then hx [n][E], g/u [n][F], y [n][E] */
    size_t o_sel = 0, o_w = align256(nk * 4), o_tok = o_w + align256(nk * 4), o_tw = o_tok + align256(nk * 4);
    size_t o_hx = o_tw + align256(nk * 4), o_g = o_hx + align256((size_t)n_tok * E * 4);
    size_t o_u = o_g + align256((size_t)n_tok * F * 4), o_y = o_u + align256((size_t)n_tok * F * 4);
    size_t total = o_y + align256((size_t)n_tok * E * 4);
    uint8_t *a = (uint8_t *)cuda_scratch_reserve(&c->moe, total);
    int32_t *sel = (int32_t *)(a + o_sel), *tok = (int32_t *)(a + o_tok);
    float *wsel = (float *)(a + o_w), *tw = (float *)(a + o_tw);
    float *hx = (float *)(a + o_hx), *ge = (float *)(a + o_g), *ue = (float *)(a + o_u), *ye = (float *)(a + o_y);

    cuda_moe_route(logits, n_tok, n_expert, k, gt, sel, wsel, NULL, c->s);
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
        act_forget(c);
        matmul_tracked(c, gate, e, hx, ge, n); /* each adds expert e's bias row (gpt-oss) */
        matmul_tracked(c, up, e, hx, ue, n);
        cuda_act_mul(act, ge, ue, ge, (int64_t)n * F, NULL, NULL, c->s);
        act_forget(c);
        matmul_tracked(c, down, e, ge, ye, n);
        cuda_scatter_add(out, ye, tok + off[e], tw + off[e], n, E, c->s);
    }
}

/* The grouped products over nk = n_tok*k pairs: pair p multiplies matrix
 * ids[p] (negative: a pair computed elsewhere, zeros) by input row xrow[p];
 * out[t] = the weighted sum of its pairs' outputs; eid[p]: the pair's expert
 * id, for the experts' biases (gpt-oss; ids may be cache slots). ge/ue [nk][F] and ye
 * [nk][E] are the caller's scratch. 0, or -1 with st_error when the grouped
 * products lack the format (e.g. F32 experts beyond decode sizes). */
static int experts_grouped(cuda_ctx *c, const float *h, int n_tok, int k, const int32_t *ids, const int32_t *eid,
                           const int32_t *xrow, const float *wsel, st_act act, const st_weight *gate,
                           const st_weight *up, const st_weight *down, float *ge, float *ue, float *ye, float *out) {
    const int64_t E = gate->n_in, F = gate->n_out;
    const int nk = n_tok * k;
    /* gate and up read h quantized once (by the router product when that is quantized) */
    const int qg = quantizes(gate, MM_MMV_MAX_TOK) && c->act_reuse;
    int gq = 0; /* whether the gate product left h quantized (not so on tensor cores) */
    int ok =
        cuda_moe_matmul(gate, NULL, ids, xrow, nk, h, n_tok, ge, qg && act_ready(c, h, E, n_tok), &gq, c->s) == 0 &&
        cuda_moe_matmul(up, NULL, ids, xrow, nk, h, n_tok, ue, qg && gq, NULL, c->s) == 0;
    act_forget(c);
    if (!ok) return -1;
    cuda_moe_bias_add(ge, gate->bias, eid, ids, nk, F, c->s); /* nothing without biases */
    cuda_moe_bias_add(ue, up->bias, eid, ids, nk, F, c->s);
    /* ge quantized as it is written, for the down products; only the
     * matrix-vector path (decode-sized pair counts) reads int8 input */
    float2 *ad = NULL;
    int8_t *aq =
        nk <= MM_MOE_DEVICE_MAX && quantizes(down, MM_MMV_MAX_TOK) ? act_target(c, (int64_t)nk * F, &ad) : NULL;
    cuda_act_mul(act, ge, ue, ge, (int64_t)nk * F, aq, ad, c->s);
    if (cuda_moe_matmul(down, NULL, ids, NULL, nk, ge, nk, ye, aq != NULL, NULL, c->s) != 0) return -1;
    cuda_moe_bias_add(ye, down->bias, eid, ids, nk, E, c->s);
    cuda_moe_combine(out, ye, wsel, n_tok, k, E, c->s);
    return 0;
}

/* Grouped path: pairs p = t*k + j, expert sel[p], input row t. */
static void moe_grouped(cuda_ctx *c, const float *h, const float *logits, int n_tok, int n_expert, int k,
                        const st_moe_gating *gt, st_act act, const st_weight *gate, const st_weight *up,
                        const st_weight *down, float *out) {
    const int64_t E = gate->n_in, F = gate->n_out;
    const int nk = n_tok * k;
    size_t o_w = align256((size_t)nk * 4), o_x = o_w + align256((size_t)nk * 4);
    size_t o_g = o_x + align256((size_t)nk * 4), o_u = o_g + align256((size_t)nk * F * 4);
    size_t o_y = o_u + align256((size_t)nk * F * 4), total = o_y + align256((size_t)nk * E * 4);
    uint8_t *a = (uint8_t *)cuda_scratch_reserve(&c->moe, total);
    int32_t *sel = (int32_t *)a, *xrow = (int32_t *)(a + o_x);
    float *wsel = (float *)(a + o_w), *ge = (float *)(a + o_g), *ue = (float *)(a + o_u), *ye = (float *)(a + o_y);
    /* prompt chunks are never recorded (run_step records one-token steps);
     * a capture reaching here would meet the host-grouped fallback */
    if (nk > MM_MOE_DEVICE_MAX && cannot_record(c)) return;
    cuda_moe_route(logits, n_tok, n_expert, k, gt, sel, wsel, xrow, c->s);
    /* A format the grouped products lack: the per-expert loop, which
     * recomputes everything, so no partial result is used. Said once per process. */
    if (experts_grouped(c, h, n_tok, k, sel, sel, xrow, wsel, act, gate, up, down, ge, ue, ye, out) != 0) {
        static int warned;
        if (!warned++) ST_WARN("MoE grouped products: %s; using the per-expert loop", st_error_get());
        moe_ffn_loop(c, h, logits, n_tok, n_expert, k, gt, act, gate, up, down, out);
    }
}

/* The decode MoE in two fused kernels (mmv_moe.h); the first routes
 * itself for one token unless FUSE_ROUTE is off (or there are too many experts). 0, or -1
 * when the scratch could not grow (recording, or out of memory). */
static int moe_decode(cuda_ctx *c, const float *h, const float *logits, int n_tok, int n_expert, int k,
                      const st_moe_gating *gt, st_act act, const st_weight *gate, const st_weight *up,
                      const st_weight *down, float *out) {
    const int64_t E = gate->n_in, F = gate->n_out;
    const int nk = n_tok * k;
    const size_t o_wf = align256((size_t)nk * 4), o_hq = o_wf + align256((size_t)nk * 4);
    const size_t o_hd = o_hq + align256((size_t)nk * F), total_f = o_hd + align256((size_t)nk * F / 32 * 8);
    uint8_t *af = (uint8_t *)cuda_scratch_reserve(&c->moe, total_f);
    int32_t *self = (int32_t *)af;
    float *wself = (float *)(af + o_wf);
    const cuda_moe_route_in route = {logits, n_expert, *gt};
    /* one token only: its glu blocks run in one wave, so the routing they
     * repeat costs one block's time; several tokens' blocks take several
     * waves, each paying it again (4 tokens on an H200: the step 4% faster
     * with the routing kernel before, 8 tokens 7%) */
    const int own_route = (c->fuse & FUSE_ROUTE) && n_expert <= ROUTE_MAX_EXPERT && n_tok == 1;
    if (!own_route) cuda_moe_route(logits, n_tok, n_expert, k, gt, self, wself, NULL, c->s);
    const int ready = act_ready(c, h, E, n_tok);
    act_forget(c);
    if (cuda_moe_decode(gate, up, down, own_route ? &route : NULL, self, wself, n_tok, k, act, h, ready,
                        (int8_t *)(af + o_hq), (float2 *)(af + o_hd), out, c->s) != 0)
        return -1;
    act_hold(c, h, E * n_tok); /* the products' scratch holds h quantized */
    return 0;
}

static void cu_moe_ffn(st_backend *be, const float *h, const float *logits, int n_tok, int n_expert, int k,
                       const st_moe_gating *gt, st_act act, const st_weight *gate, const st_weight *up,
                       const st_weight *down, float *out) {
    cuda_ctx *c = CTX(be);
    if (n_tok <= 0) return;
    if (c->moe_path == 1) {
        moe_ffn_loop(c, h, logits, n_tok, n_expert, k, gt, act, gate, up, down, out);
        return;
    }
    if (n_tok * k <= MM_MOE_DEVICE_MAX && c->moe_path == 0 && c->moe_fused && cuda_moe_decode_fits(gate, up, down)) {
        if (moe_decode(c, h, logits, n_tok, n_expert, k, gt, act, gate, up, down, out) == 0) return;
        if (cannot_record(c)) return; /* this pass's result comes from the unrecorded one */
    }
    moe_grouped(c, h, logits, n_tok, n_expert, k, gt, act, gate, up, down, out);
}

static void cu_moe_route(st_backend *be, const float *logits, int n_tok, int n_expert, int k, const st_moe_gating *gt,
                         int32_t *sel, float *wsel) {
    cuda_ctx *c = CTX(be);
    /* writes only sel and wsel: the quantized h of the router product stays valid for the experts */
    cuda_moe_route(logits, n_tok, n_expert, k, gt, sel, wsel, NULL, c->s);
}

/* The seam's expert half (backend.h): the pairs' cache slots from emap on
 * the device (so a recorded step keeps serving when the slot table changes),
 * then the fused decode kernels where they fit, else the grouped products. */
static void cu_moe_experts(st_backend *be, const float *h, int n_tok, int n_expert, int k, const int32_t *sel,
                           const float *wsel, const int32_t *emap, st_act act, const st_weight *gate,
                           const st_weight *up, const st_weight *down, float *out) {
    (void)n_expert;
    cuda_ctx *c = CTX(be);
    if (n_tok <= 0) return;
    const int64_t E = gate->n_in, F = gate->n_out;
    const int nk = n_tok * k;
    const int fused = nk <= MM_MOE_DEVICE_MAX && c->moe_fused && cuda_moe_decode_fits(gate, up, down);
    /* arena: ids, xrow, then the fused kernels' int8 h (+ scales) or the grouped products' ge/ue/ye */
    const size_t o_x = align256((size_t)nk * 4), o_b = o_x + align256((size_t)nk * 4);
    const size_t o_hd = o_b + align256((size_t)nk * F), o_u = o_b + align256((size_t)nk * F * 4);
    const size_t o_y = o_u + align256((size_t)nk * F * 4);
    const size_t total = fused ? o_hd + align256((size_t)nk * F / 32 * 8) : o_y + align256((size_t)nk * E * 4);
    uint8_t *a = (uint8_t *)cuda_scratch_reserve(&c->moe, total);
    int32_t *ids = (int32_t *)a, *xrow = (int32_t *)(a + o_x);
    cuda_moe_remap(sel, emap, ids, xrow, n_tok, k, c->s);
    if (fused) {
        const int ready = act_ready(c, h, E, n_tok);
        act_forget(c);
        if (cuda_moe_decode_eid(gate, up, down, NULL, ids, sel, (float *)wsel, n_tok, k, act, h, ready,
                                (int8_t *)(a + o_b), (float2 *)(a + o_hd), out, c->s) == 0) {
            act_hold(c, h, E * n_tok); /* the products' scratch holds h quantized */
            return;
        }
        if (cannot_record(c)) return;
        a = (uint8_t *)cuda_scratch_reserve(&c->moe, o_y + align256((size_t)nk * E * 4));
        ids = (int32_t *)a, xrow = (int32_t *)(a + o_x);
        cuda_moe_remap(sel, emap, ids, xrow, n_tok, k, c->s);
    }
    if (experts_grouped(c, h, n_tok, k, ids, sel, xrow, wsel, act, gate, up, down, (float *)(a + o_b),
                        (float *)(a + o_u), (float *)(a + o_y), out) != 0) {
        st_log(ST_LOG_ERROR, "moe_experts: %s", st_error_get());
        ST_ASSERT(!"the grouped expert products take this format"); /* the engine's start check runs them */
    }
}

static int cu_top_k(st_backend *be, const float *x, int n, int k, int32_t *ids, float *vals) {
    cuda_ctx *c = CTX(be);
    op_begin(c);
    const void *out = NULL;
    if (cuda_top_k(x, n, k, &c->topk, &out, c->s) != 0) return -1;
    uint8_t *h = (uint8_t *)pin_reserve(c, (size_t)k * 8);
    CUDA_CHECK(cudaMemcpyAsync(h, out, (size_t)k * 8, cudaMemcpyDeviceToHost, c->s));
    CUDA_CHECK(cudaStreamSynchronize(c->s));
    memcpy(vals, h, (size_t)k * 4);
    memcpy(ids, h + (size_t)k * 4, (size_t)k * 4);
    return 0;
}

static int cu_draw(st_backend *be, const float *x, int n, float inv_t, double u, int32_t *tok) {
    cuda_ctx *c = CTX(be);
    op_begin(c);
    const int32_t *d = cuda_draw(x, n, inv_t, u, &c->topk, c->s);
    int32_t *h = (int32_t *)pin_reserve(c, sizeof(int32_t));
    CUDA_CHECK(cudaMemcpyAsync(h, d, sizeof(int32_t), cudaMemcpyDeviceToHost, c->s));
    CUDA_CHECK(cudaStreamSynchronize(c->s));
    *tok = *h;
    return *tok >= 0 ? 0 : 1;
}

static void rows_drop(cuda_ctx *c) {
    if (c->rows_exec) CUDA_CHECK(cudaGraphExecDestroy(c->rows_exec));
    c->rows_exec = NULL;
    st_free(c->rows_key);
    c->rows_key = NULL;
    c->rows_key_size = 0;
}

/* The one-token step's recording (a batched one stays: its own key). */
static void step_drop(cuda_ctx *c) {
    if (c->exec) CUDA_CHECK(cudaGraphExecDestroy(c->exec));
    c->exec = NULL;
    st_free(c->key);
    c->key = NULL;
    c->key_size = 0;
}

/* Both recordings, and what was learnt of batched steps (a variant
 * changed: ops that declined a recording may not now; or the backend goes). */
static void graph_drop(cuda_ctx *c) {
    step_drop(c);
    rows_drop(c);
    c->rows_bad = 0;
}

/* One pass of the step's ops, unrecorded, in graph mode (position from d_pos). */
static void step_pass(cuda_ctx *c, void (*body)(void *, int), void *arg, int pos0) {
    c->step_pos = c->d_pos;
    act_forget(c);
    body(arg, pos0);
    c->step_pos = NULL;
}

/* A step's passes (step_pass, rows_pass). */
typedef void (*step_pass_fn)(cuda_ctx *c, void (*body)(void *, int), void *arg, int pos0);

/* The recording both kinds of step share: one pass unrecorded (the step's
 * result; every scratch sized), then one under a capture. The instantiated
 * graph, or NULL with *err (a CUDA error, or cudaSuccess) and c->capture_bad
 * (an op needed the host) saying why; neither: a scratch grew while
 * recording (*gen: the generation the recording was made under). */
static cudaGraphExec_t record_step(cuda_ctx *c, step_pass_fn pass, void (*body)(void *, int), void *arg, int pos0,
                                   unsigned long long *gen, cudaError_t *err) {
    pass(c, body, arg, pos0);
    *gen = cuda_mem_generation(c->dev);
    CUDA_CHECK(cudaStreamBeginCapture(c->s, cudaStreamCaptureModeThreadLocal));
    c->capturing = 1;
    c->capture_bad = 0;
    pass(c, body, arg, pos0);
    c->capturing = 0;
    cudaGraph_t g = NULL;
    cudaGraphExec_t exec = NULL;
    *err = cudaStreamEndCapture(c->s, &g);
    if (*err == cudaSuccess && !c->capture_bad && *gen == cuda_mem_generation(c->dev)) {
        *err = cudaGraphInstantiate(&exec, g, 0);
        if (*err != cudaSuccess) exec = NULL;
    }
    if (g) CUDA_CHECK(cudaGraphDestroy(g));
    if (!exec) (void)cudaGetLastError();
    return exec;
}

static void cu_run_step(st_backend *be, int n_tok, int pos0, void (*body)(void *, int), void *arg, size_t size) {
    cuda_ctx *c = CTX(be);
    op_begin(c);
    if (n_tok != 1 || !c->graphs || !size) { /* size 0: the caller asks for no recording (backend.h) */
        body(arg, pos0);
        return;
    }
    /* from pageable memory: staged before the call returns, so p may go */
    int p = pos0;
    CUDA_CHECK(cudaMemcpyAsync(c->d_pos, &p, sizeof(int), cudaMemcpyHostToDevice, c->s));
    /* positions below CUDA_ATT_SHORT_SPAN get a step recorded with attention
     * sized for them (the per-head kernel is faster there); crossing it
     * records the step again, once, for the rest of the cache */
    c->step_short = pos0 + 1 < CUDA_ATT_SHORT_SPAN;
    if (c->exec && c->key_body == body && c->key_size == size && !memcmp(c->key, arg, size) &&
        c->key_gen == cuda_mem_generation(c->dev) && c->key_short == c->step_short) {
        CUDA_CHECK(cudaGraphLaunch(c->exec, c->s));
        return;
    }
    /* New arguments (or moved scratch): run the step unrecorded, which also
     * sizes every scratch buffer for it, then record it for the next ones. */
    step_drop(c);
    unsigned long long gen;
    cudaError_t err;
    c->exec = record_step(c, step_pass, body, arg, pos0, &gen, &err);
    if (!c->exec) {
        ST_WARN("decode steps run without a CUDA graph: %s", err != cudaSuccess ? cudaGetErrorString(err)
                                                             : c->capture_bad   ? "an op needs the host mid-step"
                                                                                : "scratch grew while recording");
        c->graphs = 0;
        return;
    }
    c->key = st_malloc(size);
    memcpy(c->key, arg, size);
    c->key_size = size;
    c->key_body = body;
    c->key_gen = gen;
    c->key_short = c->step_short;
}

/* One pass of a batched step's ops, unrecorded or recorded, in graph mode
 * (the rows' positions from d_rows). */
static void rows_pass(cuda_ctx *c, void (*body)(void *, int), void *arg, int pos0) {
    c->step_rows = c->d_rows;
    act_forget(c);
    body(arg, pos0);
    c->step_rows = NULL;
    act_forget(c);
}

static void cu_run_step_rows(st_backend *be, int n, const int *pos, void (*body)(void *, int), void *arg,
                             const void *key, size_t key_size) {
    cuda_ctx *c = CTX(be);
    op_begin(c);
    /* up to MM_MMV_MAX_TOK rows: every product a matrix-vector kernel (past
     * it the GEMM library would be recorded, which no run has checked) */
    int rec = c->graphs && n > 1 && n <= MM_MMV_MAX_TOK && !(c->rows_bad >> n & 1);
    for (int i = 0; i < n && rec; i++) rec = pos[i] + 1 < CUDA_ATT_SHORT_SPAN; /* the span the attention is sized for */
    if (!rec) {
        body(arg, pos[0]);
        return;
    }
    /* from pageable memory: staged before the call returns, so pos may go */
    CUDA_CHECK(cudaMemcpyAsync(c->d_rows, pos, (size_t)n * sizeof(int), cudaMemcpyHostToDevice, c->s));
    if (c->rows_exec && c->rows_key_size == key_size && !memcmp(c->rows_key, key, key_size) &&
        c->rows_gen == cuda_mem_generation(c->dev)) {
        CUDA_CHECK(cudaGraphLaunch(c->rows_exec, c->s));
        return;
    }
    /* as run_step: the step unrecorded (its result, and every scratch
     * sized), then recorded for the next ones */
    rows_drop(c);
    unsigned long long gen;
    cudaError_t err;
    c->rows_exec = record_step(c, rows_pass, body, arg, pos[0], &gen, &err);
    if (!c->rows_exec) {
        if (err != cudaSuccess || c->capture_bad) { /* not a grown scratch, which the next step records again */
            c->rows_bad |= 1ull << n;
            st_log(ST_LOG_INFO, "batched steps of %d sequences run without a CUDA graph: %s", n,
                   err != cudaSuccess ? cudaGetErrorString(err) : "an op needs the host mid-step");
        }
        return;
    }
    c->rows_key = st_malloc(key_size);
    memcpy(c->rows_key, key, key_size);
    c->rows_key_size = key_size;
    c->rows_gen = gen;
}

/* Steps in segments (st_step_segments): the expert lanes' decode. */
static void seg_begin(st_backend *be, int pos0, int record) {
    cuda_ctx *c = CTX(be);
    op_begin(c);
    int p = pos0; /* from pageable memory: staged before the call returns */
    CUDA_CHECK(cudaMemcpyAsync(c->d_pos, &p, sizeof(int), cudaMemcpyHostToDevice, c->s));
    c->step_short = pos0 + 1 < CUDA_ATT_SHORT_SPAN;
    c->step_pos = c->d_pos;
    c->seg_unrecordable = 0;
    if (record) {
        CUDA_CHECK(cudaStreamBeginCapture(c->s, cudaStreamCaptureModeThreadLocal));
        c->capturing = 1;
        c->capture_bad = 0;
    } else {
        c->seg_probe = 1;
    }
}

static int seg_cut(st_backend *be, void **g) {
    cuda_ctx *c = CTX(be);
    *g = NULL;
    act_forget(c);
    c->seg_probe = 0;
    if (!c->capturing) return 0; /* a live step: the ops ran */
    c->capturing = 0;
    cudaGraph_t graph = NULL;
    cudaGraphExec_t exec = NULL;
    cudaError_t err = cudaStreamEndCapture(c->s, &graph);
    if (err == cudaSuccess && !c->capture_bad) err = cudaGraphInstantiate(&exec, graph, 0);
    if (graph) CUDA_CHECK(cudaGraphDestroy(graph));
    if (err != cudaSuccess || c->capture_bad || !exec) {
        (void)cudaGetLastError();
        st_error_set("a decode segment cannot be recorded: %s",
                     err != cudaSuccess ? cudaGetErrorString(err) : "an op needs the host mid-step");
        return -1;
    }
    CUDA_CHECK(cudaGraphLaunch(exec, c->s));
    *g = (void *)exec;
    return 0;
}

static void seg_run(st_backend *be, void *g) {
    cuda_ctx *c = CTX(be);
    CUDA_CHECK(cudaGraphLaunch((cudaGraphExec_t)g, c->s));
    act_forget(c); /* the host did not see what the segment left in scratch */
    c->seg_probe = 0;
}

static void seg_resume(st_backend *be, int record) {
    cuda_ctx *c = CTX(be);
    op_begin(c);
    if (record) {
        CUDA_CHECK(cudaStreamBeginCapture(c->s, cudaStreamCaptureModeThreadLocal));
        c->capturing = 1;
        c->capture_bad = 0;
    } else {
        c->seg_probe = 1;
    }
}

static void seg_end(st_backend *be) {
    cuda_ctx *c = CTX(be);
    act_forget(c);
    c->step_pos = NULL;
    c->seg_probe = 0;
}

/* UINT64_MAX: the last live segmented step met an op that cannot be recorded */
static uint64_t seg_key(st_backend *be, int pos0) {
    if (CTX(be)->seg_unrecordable) return UINT64_MAX;
    return (uint64_t)cuda_mem_generation(CTX(be)->dev) << 1 | (uint64_t)(pos0 + 1 < CUDA_ATT_SHORT_SPAN);
}

static void seg_drop(st_backend *be, void *g) {
    (void)be;
    if (g) CUDA_CHECK(cudaGraphExecDestroy((cudaGraphExec_t)g));
}

static const st_step_segments cu_segments = {seg_begin, seg_cut, seg_run, seg_resume, seg_end, seg_key, seg_drop};

static void cu_destroy(st_backend *be) {
    cuda_ctx *c = CTX(be);
    CUDA_CHECK(cudaSetDevice(c->dev));
    CUDA_CHECK(cudaStreamSynchronize(c->s));
    graph_drop(c);
    cuda_scratch_free(&c->att);
    cuda_scratch_free(&c->moe);
    cuda_scratch_free(&c->topk);
    cuda_scratch_free(&c->gdn);
    cuda_scratch_free(&c->heads);
    if (c->pin) CUDA_CHECK(cudaFreeHost(c->pin));
    CUDA_CHECK(cudaFree(c->d_pos));
    CUDA_CHECK(cudaFree(c->d_rows));
    CUDA_CHECK(cudaStreamDestroy(c->s));
    /* The products' scratch, cuBLAS and cuBLASLt state are per device but
     * shared by every backend of the process (and held by their recorded
     * graphs): freed only with the last backend. */
    if (__atomic_sub_fetch(&g_live_backends, 1, __ATOMIC_ACQ_REL) == 0) {
        cuda_mm_release();
        cuda_tune_release();
    }
    st_free(c);
    st_free(be);
}

/* The variants (backend.h st_variant) of this backend; a recorded decode
 * step holds the old choice, so it is recorded again. */
static int cu_variant(st_backend *be, st_variant kind, int value) {
    cuda_ctx *c = CTX(be);
    int *v = kind == ST_VARIANT_ATTN       ? &c->attn_mode
             : kind == ST_VARIANT_MOE_PATH ? &c->moe_path
             : kind == ST_VARIANT_FUSE     ? &c->fuse
                                           : NULL;
    if (kind == ST_VARIANT_GRAPHS) { /* off: run_step calls the body, and no segments are offered */
        const int old = c->graphs;
        if (value >= 0) {
            graph_drop(c);
            c->graphs = value != 0;
            be->segments = c->graphs ? &cu_segments : NULL;
        }
        return old;
    }
    if (kind == ST_VARIANT_NO_BLAS) {
        CUDA_CHECK(cudaSetDevice(c->dev)); /* the GEMM library's state is per device */
        const int old = cuda_mm_set_blas_refused(1);
        cuda_mm_set_blas_refused(value < 0 ? old : value);
        return old;
    }
    if (!v) return -1;
    const int old = *v;
    if (value >= 0) {
        *v = kind == ST_VARIANT_FUSE ? value & FUSE_ALL : value;
        graph_drop(c);
    }
    return old;
}

extern "C" st_backend *backend_cuda_create(int device) {
    if (gpu_device_check(device) != 0) return NULL;
    __atomic_add_fetch(&g_live_backends, 1, __ATOMIC_ACQ_REL);
    CUDA_CHECK(cudaSetDevice(device));
    cuda_tune_load(); /* this card's tuning table (or one line why not), at start rather than mid-request */
    cuda_ctx *c = (cuda_ctx *)st_calloc(1, sizeof *c);
    c->dev = device;
    cudaDeviceProp p;
    CUDA_CHECK(cudaGetDeviceProperties(&p, device));
    c->n_sm = p.multiProcessorCount;
    c->cc_major = p.major;
    CUDA_CHECK(cudaStreamCreate(&c->s));
    cuda_pdl_probe(c->s);
    CUDA_CHECK(cudaMalloc(&c->d_pos, sizeof(int)));
    CUDA_CHECK(cudaMalloc(&c->d_rows, CUDA_SEQ_ROWS * sizeof(int)));
    /* the top-k scratch at its largest now, so that its first use does not
     * count as growth (which would record the decode graph again) */
    (void)cuda_scratch_reserve(&c->topk, cuda_top_k_scratch_bytes());
    const char *g = st_switch_get("STRATA_CUDA_GRAPH");
    c->graphs = !(g && !strcmp(g, "0"));
    const char *r = st_switch_get("STRATA_CUDA_ACT_REUSE");
    c->act_reuse = !(r && !strcmp(r, "0"));
    const char *mf = st_switch_get("STRATA_CUDA_MOE_FUSED");
    c->moe_fused = !(mf && !strcmp(mf, "0"));
    const char *fu = st_switch_get("STRATA_CUDA_FUSE");
    c->fuse = fu && *fu ? (int)strtol(fu, NULL, 0) & FUSE_ALL : FUSE_ALL;
    const char *at = st_switch_get("STRATA_CUDA_ATTN");
    c->attn_mode = at && !strcmp(at, "head") ? CUDA_ATT_HEAD : at && !strcmp(at, "gqa") ? CUDA_ATT_GQA : CUDA_ATT_TC;
    st_backend *be = (st_backend *)st_calloc(1, sizeof *be);
    be->name = "cuda";
    be->ctx = c;
    be->alloc = cu_alloc;
    be->free = cu_free;
    be->destroy = cu_destroy;
    be->get_rows = cu_get_rows;
    be->matmul = cu_matmul;
    be->matmul_multi = cu_matmul_multi;
    be->matmul_res_norm = cu_matmul_res_norm;
    be->rmsnorm = cu_rmsnorm;
    be->qkv_prep = cu_qkv_prep;
    be->qkv_prep_seqs = cu_qkv_prep_seqs;
    be->attention_seqs = cu_attention_seqs;
    be->run_step = cu_run_step;
    be->run_step_rows = cu_run_step_rows;
    if (c->graphs) be->segments = &cu_segments;
    be->attention = cu_attention;
    be->act_mul = cu_act_mul;
    be->add = cu_add;
    be->scale = cu_scale;
    be->gated_delta_net = cu_gated_delta_net;
    be->gated_delta_net_keep = cu_gated_delta_net_keep;
    be->split_halves = cu_split_halves;
    be->sigmoid_mul = cu_sigmoid_mul;
    be->copy_2d = cu_copy_2d;
    be->moe_ffn = cu_moe_ffn;
    be->moe_route = cu_moe_route;
    be->moe_experts = cu_moe_experts;
    be->attention_sinks = cu_attention_sinks;
    /* every st_moe_gating (route.cuh), the experts' biases and the clamped SwiGLU (gpt-oss) */
    be->moe_gatings = ST_GATINGS_SOFTMAX | ST_GATINGS_ALL | ST_GATINGS_OAI;
    const char *sm = st_switch_get("STRATA_CUDA_SAMPLING");
    if (!(sm && !strcmp(sm, "0"))) be->top_k = cu_top_k, be->top_k_max = CUDA_TOPK_MAX, be->draw = cu_draw;
    be->to_host = cu_to_host;
    be->to_device = cu_to_device;
    be->upload = cu_upload;
#if !ST_GPU_IS_HIP
    /* the device reads page-locked host memory at the host's address (upload_many's kernel) */
    int host_ptr = 0;
    CUDA_CHECK(cudaDeviceGetAttribute(&host_ptr, cudaDevAttrCanUseHostPointerForRegisteredMem, device));
    if (host_ptr) be->upload_many = cu_upload_many;
#endif
    be->host_register = cu_host_register;
    be->host_unregister = cu_host_unregister;
    be->mem_info = cu_mem_info;
    be->variant = cu_variant;
    static const char *const attn_names[] = {"per head", "GQA", "GQA + tensor cores"};
    ST_INFO("GPU %d (%s, sm_%d%d, %d SMs, %.1f GiB): attention %s, MoE %s, fusions 0x%x, decode graphs %s, "
            "sampling %s, PDL %s",
            device, p.name, p.major, p.minor, c->n_sm, (double)p.totalGlobalMem / (1024.0 * 1024 * 1024),
            attn_names[c->attn_mode], c->moe_fused ? "fused decode" : "unfused", c->fuse, c->graphs ? "on" : "off",
            be->top_k ? "on the device" : "on the host", cuda_pdl_on() ? "on" : "off");
    return be;
}
