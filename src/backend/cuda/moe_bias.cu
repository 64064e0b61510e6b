/* The routed experts' biases (gpt-oss) for the MoE paths that multiply
 * pairs first and add afterwards (ops.h cuda_moe_bias_add): the grouped
 * products of prompt chunks and of the lanes' device pairs. The fused decode
 * kernels (mm/mmv_moe.cu) add them inside instead. A bias row is indexed by
 * expert id, never by the cache slot the expert's matrices occupy, so the
 * caller passes the pairs' expert ids apart from the ids the products read.
 */
#include "backend/cuda/common.cuh"
#include "backend/cuda/ops.h"

/* A thread per value; a skipped pair's row stays as the product left it (zeros). */
static __global__ void moe_bias_kernel(float *y, const float *bias, const int32_t *eid, const int32_t *live,
                                       int64_t dim, int64_t n) {
    pdl_enter(); /* first: see st_launch (common.cuh) */
    const int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
    if (i >= n) return;
    const int64_t p = i / dim, c = i - p * dim;
    const int32_t e = eid[p];
    if (e < 0 || (live && live[p] < 0)) return;
    y[i] += bias[(size_t)e * dim + c];
}

void cuda_moe_bias_add(float *y, const float *bias, const int32_t *eid, const int32_t *live, int n, int64_t dim,
                       cudaStream_t s) {
    const int64_t total = (int64_t)n * dim;
    if (!bias || total <= 0) return;
    st_launch(moe_bias_kernel, dim3(st_div_up((size_t)total, 256)), dim3(256), 0, s, y, bias, eid, live, dim, total);
}
