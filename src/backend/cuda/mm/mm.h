/* Matrix products of the CUDA backend: y = W x for every GGUF weight format.
 *
 * Two paths, chosen by the number of tokens:
 *  - decode (n_tok <= MM_MMV_MAX_TOK): matrix-vector kernels (mmv.cu). The
 *    activations are quantized on the device to int8 blocks of 32 (a scale and
 *    the scaled sum per block, like Q8_1) and each 32-weight unit of a row is
 *    decoded to int8 and multiplied with dp4a; one pass over the weights
 *    serves all tokens. F32/F16/BF16 weights are read as floats instead.
 *  - prompt (more tokens): the weights are dequantized to bf16 into a scratch
 *    buffer, in row chunks, and multiplied by cuBLAS (gemm.cu), the
 *    activations converted to bf16, f32 accumulation.
 *
 * All pointers to weights, activations and outputs are device pointers on the
 * current device, 16-byte aligned (cudaMalloc gives 256). Scratch buffers and
 * the cuBLAS handle are per device and grow on demand; growth is refused
 * while the stream is being captured, so call cuda_mm_reserve() before
 * capturing a graph. One host thread drives a given device at a time.
 *
 * Errors: bad shapes or an unknown type return -1 with st_error set (core/log.h);
 * failed CUDA calls abort (CUDA_CHECK, common.cuh).
 */
#ifndef STRATA_BACKEND_CUDA_MM_H
#define STRATA_BACKEND_CUDA_MM_H

#include <stdint.h>

#include "backend/backend.h"

/* C callers get the runtime API (cudaStream_t, or HIP's under STRATA_HIP);
 * the .cu files the whole toolkit (compat.h tells the two apart). */
#include "backend/cuda/compat.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Largest token count that takes the matrix-vector path; above it, GEMM. */
#define MM_MMV_MAX_TOK 8

/* y[t, 0:n_out] = W[mat] x[t, 0:n_in] (+ row mat of w->bias) for t < n_tok.
 * w: device data (w->data, or w->mat[mat] when the matrices are placed apart:
 *    w->mat is then a HOST array of device pointers);
 * x: [n_tok][n_in] f32, y: [n_tok][n_out] f32 (y must not alias x).
 * act_ready: the previous product on this device, on the matrix-vector path
 *    with a quantized weight, read this same x (same pointer, n_in and rows)
 *    and nothing has written x since: its quantized activations are reused.
 *    The caller tracks that (backend_cuda.cu); 0 is always correct. */
int cuda_matmul(const st_weight *w, int64_t mat, const float *x, float *y, int n_tok, int act_ready, cudaStream_t s);

/* Up to CUDA_MM_MAX_JOBS decode products of one input in one launch:
 * jobs[i].y = W_i[mat_i] x (+ its bias row) for n_tok <= MM_NT_MAX tokens, every W_i of one
 * quantized type (cuda_matmul_jobs_fit), or of two types that
 * cuda_matmul_jobs_pair takes together. act_ready as for cuda_matmul.
 * 0, or -1 with st_error. */
#define CUDA_MM_MAX_JOBS 3
typedef struct {
    const st_weight *w;
    int64_t mat;
    float *y;
    float *y_add; /* or NULL: y is also added into y_add (a residual), apart from x and every y */
} cuda_mm_job;
int cuda_matmul_jobs_fit(const st_weight *w, int n_tok);
int cuda_matmul_jobs_pair(qt_type a, qt_type b); /* in either order */
int cuda_matmul_jobs(const cuda_mm_job *jobs, int n_jobs, const float *x, int n_tok, int act_ready, cudaStream_t s);

/* y = W h (+ w->bias) for one token, h = RMSNorm(x) with weights nw (the router after
 * the FFN norm): W of few F32 rows (the split kernel: n_in a multiple of
 * 32, 16-byte aligned rows, at most 1024 rows); every
 * block normalises x itself, so no norm kernel runs before; the blocks also
 * write h and, with aq, its int8 blocks (as a norm writes them for the
 * next product), a block of 32 per warp. h apart from x. 0, or 1 when the
 * product does not take it. */
int cuda_matmul_norm(const st_weight *w, const float *x, const float *nw, float eps, float *h, int8_t *aq, float2 *ad,
                     float *y, cudaStream_t s);

/* Grouped expert product (MoE), for each pair p < n_pairs:
 *
 *     y[p, 0:n_out] = W[ids[p]] x[xrow[p], 0:n_in]
 *
 * w        shape and type of one expert matrix (n_in, n_out, type, row_bytes);
 *          w->n_mat is the number of experts (ids must be < n_mat).
 * d_mat    DEVICE array of n_mat device pointers, expert -> its matrix (for
 *          experts placed in cache slots); NULL when the experts are one
 *          contiguous device tensor at w->data (expert e at e*n_out*row_bytes).
 * d_ids    DEVICE int32 [n_pairs]: expert of each pair; a negative id (an
 *          expert handled elsewhere, e.g. by the CPU lane) writes zeros to y[p].
 * d_xrow   DEVICE int32 [n_pairs]: row of x for each pair (e.g. token t of a
 *          top-k pair t*k+j); NULL means row p.
 * x        [n_x][n_in] f32, the rows the pairs read.
 * y        [n_pairs][n_out] f32; w->bias is not added (the MoE paths add the
 *          experts' biases by expert id, which ids may not be).
 *
 * With n_pairs <= MM_MOE_DEVICE_MAX (decode) the matrix-vector kernel takes
 * every pair. With more (prompt chunks), on sm_80+ and quantized experts,
 * the pairs are grouped by expert on the device and multiplied on tensor
 * cores (moe_mma.cu); neither path synchronises with the host. Elsewhere
 * (HIP, older cards, float experts, formats whose tiles exceed the card's
 * shared memory) the ids are copied to the host once (the stream is
 * synchronised), pairs are grouped per expert, and each expert's tokens go
 * through the matrix-vector kernel in groups of 8 or, for experts with many
 * tokens, through the bf16 GEMM path. act_ready as for cuda_matmul, with
 * n_x rows of x. x_quantized (or NULL): set to 1 when the call returns with
 * x's int8 form in the products' scratch (a later product of x may pass
 * act_ready), 0 when not (float weights, the tensor-core path). */
#define MM_MOE_DEVICE_MAX 64
int cuda_moe_matmul(const st_weight *w, const void *const *d_mat, const int32_t *d_ids, const int32_t *d_xrow,
                    int n_pairs, const float *x, int n_x, float *y, int act_ready, int *x_quantized, cudaStream_t s);

/* The current device's quantized-activation scratch, at least n_rows x n_in:
 * a producer op may write its output there in the products' int8 format
 * (ops.h), then pass act_ready to the next product of that output. 0, or -1
 * with st_error (it would have to grow while a graph is captured). */
int cuda_mm_act_scratch(int64_t n_in, int n_rows, int8_t **aq, float2 **ad, cudaStream_t s);

/* Pre-size the current device's scratch for products up to n_in columns and
 * n_rows activation rows (decode graphs: call before capture). 0 or -1. */
int cuda_mm_reserve(int64_t n_in, int n_rows);

/* Free every device's scratch and cuBLAS handle (at backend destroy). */
void cuda_mm_release(void);

/* C = op(A) B on the current device's cuBLAS, column-major: A f16 (k x m,
 * read transposed, with trans_a; else m x k), B f16 k x n, C f32 m x n,
 * f32 accumulation. 0 done; 1 no BLAS in this build or cuBLAS refused on
 * this device (said once): the caller takes another path. */
int cuda_gemm_f16(int trans_a, int m, int n, int k, const void *a, int lda, const void *b, int ldb, float *c, int ldc,
                  cudaStream_t s);

/* y [n_tok][n_mat][n_out] = every matrix m of w times its slice of x
 * [n_tok][n_mat][n_in] (matmul's ST_MAT_ALL: multi-head latent attention's
 * per-head products) as one strided batched bf16 GEMM: the stack
 * dequantized to bf16 once, x to bf16. For prompts. 0 done; 1 not taken (no
 * BLAS, cuBLAS refused, f32/bf16 or gathered matrices, a stack over
 * MM_HEADS_MAX_ELEMS); -1 with st_error. */
#define MM_HEADS_MAX_ELEMS ((size_t)64 << 20)
int cuda_matmul_heads(const st_weight *w, const float *x, float *y, int n_tok, cudaStream_t s);

/* Whether type t has a CUDA matrix product (every weight format of blocks.h). */
int cuda_mm_supports(qt_type t);

/* Force a path on the current device for tests and benchmarks: 0
 * automatic, 1 matrix-vector for any n_tok (in groups of 8), 2 GEMM for any
 * n_tok. Returns the previous mode. */
int cuda_mm_force_path(int mode);

/* Treat the current device's cuBLAS as refused (1), as after a failed call,
 * or trust it again (0): tests of the fallback. Returns the previous state. */
int cuda_mm_set_blas_refused(int refused);

/* Rows per warp of the matrix-vector kernels on the current device (1, 2 or
 * 4; 0 automatic), for benchmarks. Returns the previous setting. */
int cuda_mm_force_rows(int r);

#ifdef __cplusplus
}
#endif

#endif
