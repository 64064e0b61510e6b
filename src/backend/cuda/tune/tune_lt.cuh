/* Internal to tune.cu and tune_run.cu: the one cuBLASLt description of
 * gemm.cu's product, so that the algorithm `strata tune` measured is run on
 * exactly the descriptors it was measured with.
 *
 * The product, column-major as cuBLAS sees it: C (m x n_tok, ld n_out, f32) =
 * A^T B with A the bf16 weight rows (n_in x m, ld n_in) and B the bf16
 * activations (n_in x n_tok, ld n_in); f32 compute and scale. m is the rows
 * of one dequantized chunk (mm_chunk_rows) or of the last, shorter one.
 *
 * Alignment: weights, activations and outputs are 16-byte aligned (mm.h);
 * a chunk's output starts r0 rows into y, a multiple of 64 rows (gemm.cu),
 * except for matrices of more than 512K columns, whose C is only as aligned
 * as the chunk's byte length allows. The heuristic is asked for algorithms
 * that work at those alignments, and the runtime checks them before each
 * call.
 */
#ifndef STRATA_BACKEND_CUDA_TUNE_LT_CUH
#define STRATA_BACKEND_CUDA_TUNE_LT_CUH

#include "backend/cuda/common.cuh"
#include "backend/cuda/tune/tune.h"

#if !ST_GPU_IS_HIP
#include <cublasLt.h>

#define TUNE_WS_MAX   ((size_t)32 << 20) /* workspace a candidate may ask for (NVIDIA's advice for Hopper) */
#define TUNE_AB_ALIGN 16u

/* Byte alignment the outputs of every chunk of this matrix keep. */
static inline unsigned tune_c_align(int n_in, int n_out) {
    const int64_t chunk = mm_chunk_rows(n_in, n_out);
    if (chunk >= n_out) return 16;
    const uint64_t bytes = (uint64_t)chunk * 4;
    const unsigned low = (unsigned)(bytes & (~bytes + 1)); /* lowest set bit */
    return low < 16 ? low : 16;
}

/* The operation: f32 compute and scale, A transposed. */
static inline cublasStatus_t tune_lt_op(cublasLtMatmulDesc_t *op) {
    cublasStatus_t st = cublasLtMatmulDescCreate(op, CUBLAS_COMPUTE_32F, CUDA_R_32F);
    if (st != CUBLAS_STATUS_SUCCESS) return st;
    const int32_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
    st = cublasLtMatmulDescSetAttribute(*op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta);
    if (st == CUBLAS_STATUS_SUCCESS)
        st = cublasLtMatmulDescSetAttribute(*op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb);
    if (st != CUBLAS_STATUS_SUCCESS) cublasLtMatmulDescDestroy(*op);
    return st;
}

/* Layouts of A and C for m rows (B depends on the token count only). */
static inline cublasStatus_t tune_lt_rows(int m, int n_tok, int n_in, int n_out, cublasLtMatrixLayout_t *a,
                                          cublasLtMatrixLayout_t *c) {
    cublasStatus_t st = cublasLtMatrixLayoutCreate(a, CUDA_R_16BF, (uint64_t)n_in, (uint64_t)m, n_in);
    if (st != CUBLAS_STATUS_SUCCESS) return st;
    st = cublasLtMatrixLayoutCreate(c, CUDA_R_32F, (uint64_t)m, (uint64_t)n_tok, n_out);
    if (st != CUBLAS_STATUS_SUCCESS) cublasLtMatrixLayoutDestroy(*a);
    return st;
}

static inline cublasStatus_t tune_lt_b(int n_tok, int n_in, cublasLtMatrixLayout_t *b) {
    return cublasLtMatrixLayoutCreate(b, CUDA_R_16BF, (uint64_t)n_in, (uint64_t)n_tok, n_in);
}

/* One chunk's product with algorithm algo (D = C: beta is 0). */
static inline cublasStatus_t tune_lt_matmul(cublasLtHandle_t h, cublasLtMatmulDesc_t op,
                                            const cublasLtMatmulAlgo_t *algo, const void *a, cublasLtMatrixLayout_t la,
                                            const void *b, cublasLtMatrixLayout_t lb, float *c,
                                            cublasLtMatrixLayout_t lc, void *ws, size_t ws_bytes, cudaStream_t s) {
    const float one = 1.0f, zero = 0.0f;
    return cublasLtMatmul(h, op, &one, a, la, b, lb, &zero, c, lc, c, lc, algo, ws, ws_bytes, s);
}
#endif

#endif
