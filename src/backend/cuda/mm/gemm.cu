/* The prompt path of the matrix products: dequantize the weights to bf16 in
 * row chunks and multiply with cuBLAS (bf16 inputs, f32 accumulation and
 * output), plus the small gather/convert/scatter kernels the MoE grouping
 * needs.
 *
 * Why bf16 and not f16: activations of some models exceed f16's range
 * (65504); bf16 has f32's exponent. Its 8-bit mantissa adds a relative error
 * near 2^-9 per operand, far below the activations' int8 error on the decode
 * path and the weights' own quantization error. F32 weights (rare for
 * matrices) go to cuBLAS as f32 without conversion; BF16 weights are used in
 * place.
 *
 * Chunking bounds the scratch (MM_WB_ELEMS bf16 values): a 151936 x 2048
 * output matrix would otherwise need 622 MB of bf16.
 */
#include "backend/cuda/mm/mm_impl.cuh"
#include "backend/cuda/mm/quant_cuda.cuh"
#include "backend/cuda/tune/tune.h"

#define MM_WB_ELEMS ((size_t)32 << 20) /* bf16 values per dequantized chunk (64 MB) */

/* ---- dequantize: one thread per 32-weight unit, 64 bytes of bf16 out ---- */

template <int T>
static __global__ void mm_dequant_kernel(const uint8_t *__restrict__ w, size_t row_bytes, int n_units, int64_t n,
                                         uint4 *__restrict__ dst) {
    using F = mmf<T>;
    const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; /* unit over all rows */
    if (i >= n) return;
    const int64_t r = i / n_units;
    const int gu = (int)(i % n_units);
    mm_unit u;
    F::unit(w + r * row_bytes + (size_t)(gu / F::UPB) * F::BYTES, gu % F::UPB, u);
    uint32_t o[16];
#pragma unroll
    for (int k = 0; k < 16; k++) {
        const __nv_bfloat162 h = __floats2bfloat162_rn(mm_unit_weight<F>(u, 2 * k), mm_unit_weight<F>(u, 2 * k + 1));
        o[k] = *(const uint32_t *)&h;
    }
#pragma unroll
    for (int k = 0; k < 4; k++) dst[4 * i + k] = make_uint4(o[4 * k], o[4 * k + 1], o[4 * k + 2], o[4 * k + 3]);
}

static __global__ void mm_f16_to_bf16_kernel(const __half *__restrict__ w, size_t row_elems, int n_in, int64_t n,
                                             __nv_bfloat16 *__restrict__ dst) {
    const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    dst[i] = __float2bfloat16_rn(__half2float(w[(i / n_in) * row_elems + i % n_in]));
}

int mm_dequant_bf16(qt_type t, const void *w, size_t row_bytes, int n_in, int64_t r0, int64_t n_rows, void *dst,
                    cudaStream_t s) {
    const uint8_t *base = (const uint8_t *)w + r0 * row_bytes;
    if (t == QT_F16) {
        const int64_t n = n_rows * n_in;
        mm_f16_to_bf16_kernel<<<st_div_up((size_t)n, 256), 256, 0, s>>>((const __half *)base, row_bytes / 2, n_in, n,
                                                                        (__nv_bfloat16 *)dst);
        CUDA_LAUNCH_CHECK();
        return 0;
    }
    const int n_units = n_in / 32;
    const int64_t n = n_rows * n_units;
    const unsigned blocks = st_div_up((size_t)n, 128);
    switch ((int)t) {
#define MM_CASE(T)                                                                                                     \
    case T: mm_dequant_kernel<T><<<blocks, 128, 0, s>>>(base, row_bytes, n_units, n, (uint4 *)dst); break;
        MM_QUANT_TYPES(MM_CASE)
#undef MM_CASE
    default: st_error_set("cuda_matmul: weight type %d cannot be dequantized on the GPU", (int)t); return -1;
    }
    CUDA_LAUNCH_CHECK();
    return 0;
}

/* ---- activations ---- */

static __global__ void mm_act_bf16_kernel(const float *__restrict__ x, const int32_t *__restrict__ idx, int n_in,
                                          int64_t n, __nv_bfloat16 *__restrict__ dst) {
    const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    const int64_t r = i / n_in, c = i % n_in;
    const int64_t src = idx ? idx[r] : r;
    dst[i] = __float2bfloat16_rn(x[src * n_in + c]);
}

void mm_act_bf16(const float *x, const int32_t *idx, int n, int n_in, void *dst, cudaStream_t s) {
    const int64_t total = (int64_t)n * n_in;
    if (total == 0) return;
    mm_act_bf16_kernel<<<st_div_up((size_t)total, 256), 256, 0, s>>>(x, idx, n_in, total, (__nv_bfloat16 *)dst);
    CUDA_LAUNCH_CHECK();
}

static __global__ void mm_scatter_kernel(const float *__restrict__ yb, const int32_t *__restrict__ idx, int n_out,
                                         int64_t n, float *__restrict__ y) {
    const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    const int64_t r = i / n_out, c = i % n_out;
    y[(int64_t)(idx ? idx[r] : r) * n_out + c] = yb[i];
}

void mm_scatter_rows(const float *yb, const int32_t *idx, int n, int n_out, float *y, cudaStream_t s) {
    const int64_t total = (int64_t)n * n_out;
    if (total == 0) return;
    mm_scatter_kernel<<<st_div_up((size_t)total, 256), 256, 0, s>>>(yb, idx, n_out, total, y);
    CUDA_LAUNCH_CHECK();
}

/* ---- cuBLAS ---- */

/* Rows per dequantized chunk for n_in columns (whole matrix if it fits);
 * `strata tune` measures these same chunks (tune.h). */
int64_t mm_chunk_rows(int64_t n_in, int64_t n_out) {
    int64_t r = (int64_t)(MM_WB_ELEMS / (size_t)n_in);
    if (r > 64) r -= r % 64; /* each chunk's output starts 256-byte aligned (what cuBLASLt's fast kernels take) */
    if (r < 1) r = 1;
    return r < n_out ? r : n_out;
}

size_t mm_gemm_scratch_bytes(qt_type t, int64_t n_in, int64_t n_out) {
    if (t == QT_F32 || t == QT_BF16) return 0;
    return (size_t)mm_chunk_rows(n_in, n_out) * (size_t)n_in * 2;
}

#if ST_GPU_HAVE_BLAS
/* A cuBLAS status: 1 if the call ran; else the device's cuBLAS is marked
 * refused (a shape or card it does not take) with one warning, and 0. */
static int blas_ran(mm_scratch *sc, cublasStatus_t st, int m, int n, int k) {
    if (st == CUBLAS_STATUS_SUCCESS) return 1;
    int dev = -1;
    (void)cudaGetDevice(&dev);
    if (!sc->blas_refused)
        ST_WARN("GPU %d: cuBLAS refused a %d x %d x %d product (status %d); Strata's own matrix-vector kernels do "
                "the prompt products on this GPU from now on (slower)",
                dev, m, n, k, (int)st);
    sc->blas_refused = 1;
    return 0;
}
#endif

int cuda_gemm_f16(int trans_a, int m, int n, int k, const void *a, int lda, const void *b, int ldb, float *c, int ldc,
                  cudaStream_t s) {
#if !ST_GPU_HAVE_BLAS
    (void)trans_a, (void)m, (void)n, (void)k, (void)a, (void)lda, (void)b, (void)ldb, (void)c, (void)ldc, (void)s;
    return 1;
#else
    mm_scratch *sc = mm_scratch_get(s, 0, 0, 0, 0, 0, 0);
    if (!sc || sc->blas_refused || !blas_ran(sc, cublasSetStream(sc->blas, s), 0, 0, 0)) return 1;
    const float one = 1.0f, zero = 0.0f;
    return blas_ran(sc,
                    cublasGemmEx(sc->blas, trans_a ? CUBLAS_OP_T : CUBLAS_OP_N, CUBLAS_OP_N, m, n, k, &one, a,
                                 CUDA_R_16F, lda, b, CUDA_R_16F, ldb, &zero, c, CUDA_R_32F, ldc, CUBLAS_COMPUTE_32F,
                                 CUBLAS_GEMM_DEFAULT),
                    m, n, k)
               ? 0
               : 1;
#endif
}

int cuda_matmul_heads(const st_weight *w, const float *x, float *y, int n_tok, cudaStream_t s) {
#if !ST_GPU_HAVE_BLAS
    (void)w, (void)x, (void)y, (void)n_tok, (void)s;
    return 1;
#else
    const int64_t H = w->n_mat, ni = w->n_in, no = w->n_out;
    if (!w->data || w->mat || w->type == QT_F32 || w->type == QT_BF16 || n_tok <= 0) return 1;
    const size_t nw = (size_t)(H * no * ni), nx = (size_t)n_tok * (size_t)(H * ni);
    if (nw > MM_HEADS_MAX_ELEMS) return 1;
    mm_scratch *sc = mm_scratch_get(s, 0, 0, nw * 2, nx * 2, 0, 0);
    if (!sc) return -1;
    if (sc->blas_refused || !blas_ran(sc, cublasSetStream(sc->blas, s), 0, 0, 0)) return 1;
    if (mm_dequant_bf16(w->type, w->data, w->row_bytes, (int)ni, 0, H * no, sc->wb, s) != 0) return -1;
    mm_act_bf16(x, NULL, n_tok * (int)H, (int)ni, sc->xb, s);
    /* matrix m, column-major: Y_m (no x n_tok, columns H * no apart) = W_m^T-stored (ni x no) op_T,
     * times X_m (ni x n_tok, columns H * ni apart) */
    const float one = 1.0f, zero = 0.0f;
    return blas_ran(sc,
                    cublasGemmStridedBatchedEx(sc->blas, CUBLAS_OP_T, CUBLAS_OP_N, (int)no, n_tok, (int)ni, &one,
                                               sc->wb, CUDA_R_16BF, (int)ni, no * ni, sc->xb, CUDA_R_16BF,
                                               (int)(H * ni), ni, &zero, y, CUDA_R_32F, (int)(H * no), no, (int)H,
                                               CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
                    (int)no, n_tok, (int)ni)
               ? 0
               : 1;
#endif
}

int mm_gemm(mm_scratch *sc, const st_weight *w, const void *wdata, const void *xb, const float *xf, int n_tok, float *y,
            cudaStream_t s) {
#if !ST_GPU_HAVE_BLAS
    /* HIP without hipBLAS (compat.h): gemm_dispatch.cu never routes here. */
    (void)sc, (void)wdata, (void)xb, (void)xf, (void)n_tok, (void)y, (void)s;
    st_error_set("cuda_matmul: this HIP build has no BLAS; no GEMM path for weight type %d", (int)w->type);
    return -1;
#else
    const int n_in = (int)w->n_in, n_out = (int)w->n_out;
    const float one = 1.0f, zero = 0.0f;
    if (sc->blas_refused) return 1;
    if (!blas_ran(sc, cublasSetStream(sc->blas, s), 0, 0, 0)) return 1;
    /* Column-major view: W rows are columns of an n_in x n_out matrix, so
     * Y^T (n_out x n_tok) = op_T(W) * X^T with X^T's columns the tokens. */
    /* Bf16 products whose shape `strata tune` measured run with its
     * cuBLASLt algorithm (tune.cu; 1: not tuned, or refused: cublasGemmEx). */
    if (w->type == QT_BF16 && cuda_tune_gemm(n_out, n_in, n_tok, n_out, wdata, xb, y, s) == 0) return 0;
    if (w->type == QT_F32 || w->type == QT_BF16) { /* the weights as they are: f32 with f32 x, bf16 with bf16 x */
        const int f32 = w->type == QT_F32;
        const cudaDataType_t dt = f32 ? CUDA_R_32F : CUDA_R_16BF;
        return blas_ran(sc,
                        cublasGemmEx(sc->blas, CUBLAS_OP_T, CUBLAS_OP_N, n_out, n_tok, n_in, &one, wdata, dt,
                                     (int)(w->row_bytes / (f32 ? 4 : 2)), f32 ? (const void *)xf : xb, dt, n_in, &zero,
                                     y, CUDA_R_32F, n_out, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
                        n_out, n_tok, n_in)
                   ? 0
                   : 1;
    }
    const int64_t chunk = mm_chunk_rows(n_in, n_out);
    for (int64_t r0 = 0; r0 < n_out; r0 += chunk) {
        const int64_t nr = r0 + chunk <= n_out ? chunk : n_out - r0;
        if (mm_dequant_bf16(w->type, wdata, w->row_bytes, n_in, r0, nr, sc->wb, s) != 0) return -1;
        if (cuda_tune_gemm(n_out, n_in, n_tok, (int)nr, sc->wb, xb, y + r0, s) == 0) continue;
        if (!blas_ran(sc, mm_chunk_gemm(sc->blas, (int)nr, n_tok, n_in, sc->wb, xb, y + r0, n_out), (int)nr, n_tok,
                      n_in))
            return 1;
    }
    return 0;
#endif
}
