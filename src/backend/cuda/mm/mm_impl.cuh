/* Internal to the matrix products (mmv.cu, gemm.cu, gemm_dispatch.cu): the
 * launch descriptions passed between them and the per-device scratch. The
 * public API is mm.h.
 */
#ifndef STRATA_BACKEND_CUDA_MM_IMPL_CUH
#define STRATA_BACKEND_CUDA_MM_IMPL_CUH

#include "backend/cuda/common.cuh"
#include "backend/cuda/mm/mm.h"

#define MMV_WARPS 4 /* warps per block of the matrix-vector kernels (mmv_kernel.cuh) */

/* The unit formats of quant_cuda.cuh, for the launchers' switches: X(T) per type. */
/* clang-format off */
#define MM_QUANT_TYPES(X)                                                                               \
    X(QT_Q4_0) X(QT_Q4_1) X(QT_Q5_0) X(QT_Q5_1) X(QT_Q8_0) X(QT_Q2_K) X(QT_Q3_K) X(QT_Q4_K) X(QT_Q5_K) \
    X(QT_Q6_K) X(QT_IQ2_XXS) X(QT_IQ2_XS) X(QT_IQ2_S) X(QT_IQ3_XXS) X(QT_IQ3_S) X(QT_IQ1_S)            \
    X(QT_IQ1_M) X(QT_IQ4_NL) X(QT_IQ4_XS) X(QT_MXFP4)
/* clang-format on */

/* Most tokens one matrix-vector launch serves per pass over the weights. */
#define MM_NT_MAX 8
/* A token group record: expert, count, MM_NT_MAX activation rows, MM_NT_MAX output rows. */
#define MM_REC (2 + 2 * MM_NT_MAX)

typedef enum {
    MM_GROUPS_DENSE = 0, /* one group: matrix `mat`, tokens 0..n_tok-1 */
    MM_GROUPS_PAIRS = 1, /* group p: expert ids[p], activation row xrow[p] (or p), output row p */
    MM_GROUPS_REC = 2,   /* group g: the record rec[g*MM_REC ...] */
} mm_groups;

/* One matrix-vector launch. */
struct mm_mmv_args {
    qt_type type;
    const uint8_t *w;         /* matrix 0 */
    size_t mat_stride;        /* bytes between matrices at w */
    const void *const *w_tab; /* device table expert -> matrix, or NULL */
    size_t row_bytes;
    int n_in, n_out;
    const int8_t *aq; /* quantized activations [rows][n_in] (quant formats) */
    const float2 *ad; /* their (scale, scale*sum) per 32 [rows][n_in/32] */
    const float *x;   /* f32 activations [rows][n_in] (float formats) */
    float *y;         /* [rows][n_out] */
    float *y_add;     /* or NULL: y also added into it (matrix 0; more[i].y_add for the others) */
    const float *b;   /* DENSE only, or NULL: [n_out] added to every row of y (matrix 0; more[i].b) */
    /* nx (or NULL): x = RMSNorm(nx) with weights nw, computed by every block
     * (the split float kernel, one token); the grid writes it to ny and,
     * with naq, its int8 blocks to naq / nad */
    const float *nx, *nw;
    float neps;
    float *ny;
    int8_t *naq;
    float2 *nad;
    mm_groups groups;
    int mat, n_tok;            /* DENSE */
    const int32_t *ids, *xrow; /* PAIRS */
    const int32_t *rec;        /* REC */
    int n_groups;
    /* DENSE only: more matrices of the same input in this launch
     * (cuda_matmul_jobs): blocks from more[i].blk0 on take matrix i + 1, of
     * type `type`, or of `type2` from more[t2] on */
    int n_more;
    int t2; /* more[t2..] are of type type2 (t2 == n_more: none) */
    qt_type type2;
    struct {
        const uint8_t *w;
        float *y, *y_add;
        const float *b;
        size_t row_bytes;
        int n_out;
        unsigned blk0;
    } more[CUDA_MM_MAX_JOBS - 1];
};

#if ST_GPU_HAVE_BLAS
/* One dequantized chunk's product, as gemm.cu runs it and `strata tune`
 * times it: c (m rows of the output, ld n_out) = a (m bf16 weight rows of
 * n_in) times b (n_tok bf16 activation rows of n_in), f32. */
static inline cublasStatus_t mm_chunk_gemm(cublasHandle_t h, int m, int n_tok, int n_in, const void *a, const void *b,
                                           float *c, int n_out) {
    const float one = 1.0f, zero = 0.0f;
    return cublasGemmEx(h, CUBLAS_OP_T, CUBLAS_OP_N, m, n_tok, n_in, &one, a, CUDA_R_16BF, n_in, b, CUDA_R_16BF, n_in,
                        &zero, c, CUDA_R_32F, n_out, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
}
#endif

/* Per-device scratch (gemm_dispatch.cu). */
struct mm_scratch {
    int8_t *aq;
    size_t aq_bytes; /* quantized activations */
    float2 *ad;
    size_t ad_bytes;
    void *wb;
    size_t wb_bytes; /* dequantized bf16 weight chunk */
    void *xb;
    size_t xb_bytes; /* bf16 activations (gathered for MoE) */
    float *yb;
    size_t yb_bytes; /* f32 GEMM output (MoE, before scatter) */
    int32_t *rec;
    size_t rec_bytes; /* token group records / gather lists */
    cublasHandle_t blas;
    int blas_refused; /* cuBLAS refused a call (or the card): own kernels only, said once */
};

/* The current device's scratch with each buffer at least the given size
 * (0 = not needed); NULL with st_error if it must grow during capture. */
mm_scratch *mm_scratch_get(cudaStream_t s, size_t aq, size_t ad, size_t wb, size_t xb, size_t yb, size_t rec);

/* mmv.cu */
int mm_is_float(qt_type t);
/* x [n_rows][n_in] f32 -> aq, ad (n_in a multiple of 32). */
void mm_quantize_act(const float *x, int n_in, int n_rows, int8_t *aq, float2 *ad, cudaStream_t s);
/* Launch one matrix-vector product; -1 with st_error for an unsupported type. */
int mm_mmv_launch(const mm_mmv_args *a, cudaStream_t s);

/* The per-family launchers (mmv_float.cu, mmv_legacy.cu, mmv_k.cu, mmv_iq.cu):
 * 0 if the type is theirs and launched, 1 if not theirs. nt in {1,2,4,8}, r rows per warp. */
int mmv_launch_float(const mm_mmv_args *a, int nt, int r, cudaStream_t s);
int mmv_launch_legacy(const mm_mmv_args *a, int nt, int r, cudaStream_t s);
int mmv_launch_k(const mm_mmv_args *a, int nt, int r, cudaStream_t s);
int mmv_launch_iq(const mm_mmv_args *a, int nt, int r, cudaStream_t s);
int mmv_launch_pair(const mm_mmv_args *a, int nt, int r, cudaStream_t s); /* a->t2 < a->n_more */
int mmv_pair_supported(qt_type a, qt_type b);

/* gemm.cu */
/* Rows [r0, r0+n_rows) of a weight matrix -> bf16 [n_rows][n_in] at dst. */
int mm_dequant_bf16(qt_type t, const void *w, size_t row_bytes, int n_in, int64_t r0, int64_t n_rows, void *dst,
                    cudaStream_t s);
/* x rows (idx[i] or i) f32 -> bf16 [n][n_in]. */
void mm_act_bf16(const float *x, const int32_t *idx, int n, int n_in, void *dst, cudaStream_t s);
/* y[idx[i] or i][n_out] = yb[i][n_out] for i < n. */
void mm_scatter_rows(const float *yb, const int32_t *idx, int n, int n_out, float *y, cudaStream_t s);
/* Bytes of bf16 weight scratch mm_gemm needs for this matrix (0 for F32/BF16). */
size_t mm_gemm_scratch_bytes(qt_type t, int64_t n_in, int64_t n_out);
/* y[n_tok][n_out] = W x via bf16 chunks and cuBLAS; x already bf16
 * (xb, [n_tok][n_in]) unless the weights are F32, in which case xf is used.
 * 0, -1 with st_error, or 1 when cuBLAS refused the call: then sc->blas_refused
 * is set (with one warning) and the caller uses its own kernels instead. */
int mm_gemm(mm_scratch *sc, const st_weight *w, const void *wdata, const void *xb, const float *xf, int n_tok, float *y,
            cudaStream_t s);

/* moe_mma.cu: the MoE product of prompt chunks on tensor cores, grouped on
 * the device (no host synchronisation): y[p] = W[ids[p]] x[xrow[p]] for
 * p < n_pairs, arguments as cuda_moe_matmul (zeros for negative ids). 0, -1
 * with st_error, or 1 when it does not apply (HIP, compute capability below
 * 8.0, a float type, more than MM_MOE_MMA_MAX_MAT experts, n_in not a
 * multiple of its stage of 128 or 256 weights, too little shared memory per
 * block): the caller's host-grouped path runs then. Pairs are grouped in
 * chunks of MM_MOE_MMA_MAX_PAIRS (16-bit offsets in the grouping block). */
#define MM_MOE_MMA_MAX_MAT   512
#define MM_MOE_MMA_MAX_PAIRS 65535
int mm_moe_mma(const st_weight *w, const void *const *d_mat, const int32_t *d_ids, const int32_t *d_xrow, int n_pairs,
               const float *x, int n_x, float *y, cudaStream_t s);

#endif
