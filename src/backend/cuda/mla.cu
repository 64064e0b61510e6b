/* The strided copy of multi-head latent attention (backend.h's copy_2d):
 * deepseek2's forward (model/forward_mla.c) packs one head's slice of every
 * row into a matrix for its per-head product with attn_k_b / attn_v_b and
 * puts the result back, so a decode step runs it a few times per head.
 *
 * A block per (row, 256 units of 1 or 4 values): rows are short (64..576
 * values), so a decode step's copy is one or two blocks; 4 values per
 * thread when both strides, the width and the pointers allow 16-byte
 * accesses, else one.
 *
 * Also the matrix ids of matmul's ST_MAT_ALL form (backend_cuda.cu), which
 * runs every head's product as the pairs of one grouped MoE product
 * (cuda_moe_matmul: pair p = (token, head) takes matrix p % n_head).
 */
#include "backend/cuda/common.cuh"
#include "backend/cuda/ops.h"

#define COPY2D_THREADS 256

static __global__ void __launch_bounds__(COPY2D_THREADS)
    copy_2d_kernel(float *dst, int64_t dst_stride, const float *src, int64_t src_stride, int64_t width) {
    pdl_enter(); /* first: see st_launch (common.cuh) */
    const int64_t r = blockIdx.x, i = (int64_t)blockIdx.y * COPY2D_THREADS + threadIdx.x;
    if (i < width) dst[r * dst_stride + i] = src[r * src_stride + i];
}

static __global__ void __launch_bounds__(COPY2D_THREADS)
    copy_2d_vec_kernel(float4 *dst, int64_t dst_stride, const float4 *src, int64_t src_stride, int64_t width) {
    pdl_enter(); /* first: see st_launch (common.cuh) */
    const int64_t r = blockIdx.x, i = (int64_t)blockIdx.y * COPY2D_THREADS + threadIdx.x;
    if (i < width) dst[r * dst_stride + i] = src[r * src_stride + i];
}

void cuda_copy_2d(float *dst, int64_t dst_stride, const float *src, int64_t src_stride, int64_t width, int n_rows,
                  cudaStream_t s) {
    if (n_rows <= 0 || width <= 0) return;
    const int vec = width % 4 == 0 && dst_stride % 4 == 0 && src_stride % 4 == 0 && (uintptr_t)dst % 16 == 0 &&
                    (uintptr_t)src % 16 == 0;
    if (vec) {
        const int64_t w4 = width / 4;
        st_launch(copy_2d_vec_kernel, dim3((unsigned)n_rows, (unsigned)st_div_up((size_t)w4, COPY2D_THREADS)),
                  dim3(COPY2D_THREADS), 0, s, (float4 *)dst, dst_stride / 4, (const float4 *)src, src_stride / 4, w4);
    } else {
        st_launch(copy_2d_kernel, dim3((unsigned)n_rows, (unsigned)st_div_up((size_t)width, COPY2D_THREADS)),
                  dim3(COPY2D_THREADS), 0, s, dst, dst_stride, src, src_stride, width);
    }
}

/* ids[p] = p % n_mat: the matrix of row p of a packed [n_tok][n_mat] product. */
static __global__ void heads_ids_kernel(int32_t *ids, int n, int n_mat) {
    pdl_enter(); /* first: see st_launch (common.cuh) */
    const int p = blockIdx.x * blockDim.x + threadIdx.x;
    if (p < n) ids[p] = p % n_mat;
}

void cuda_heads_ids(int32_t *ids, int n, int n_mat, cudaStream_t s) {
    if (n <= 0) return;
    st_launch(heads_ids_kernel, dim3((unsigned)st_div_up((size_t)n, 256)), dim3(256), 0, s, ids, n, n_mat);
}
