/* MoE routing of one token by one block: softmax over the router logits,
 * then each expert's rank among them (a higher probability first, ties to
 * the lower id, as on the CPU); the k of rank below k are the choices;
 * optional renormalisation. Used by the routing kernel (ops_elem.cu) and by
 * the fused decode MoE kernel (mmv_moe.cu), whose blocks each route their
 * token instead of waiting for a routing kernel.
 *
 * Ranks instead of k rounds of a warp argmax: every thread finds its
 * experts' ranks at once (reads of shared memory that all lanes share), so
 * the choice costs one pass over the probabilities instead of k dependent
 * rounds of shuffles. Measured on an H200 (128 experts, top 8, a 1-block
 * kernel in a CUDA graph): 2.5 us against 4.9 us for the warp rounds.
 */
#ifndef STRATA_BACKEND_CUDA_ROUTE_CUH
#define STRATA_BACKEND_CUDA_ROUTE_CUH

#include "backend/cuda/common.cuh"

/* Every thread of a one-dimensional block calls it (it synchronises the
 * block). l: the token's n_expert logits; p: n_expert floats of shared
 * memory; red: ST_WARP floats of shared memory; sel, w: k entries of shared
 * memory, the choices in order of decreasing probability, visible to the
 * block on return. A NaN probability is never chosen; a place no expert
 * takes (fewer than k numbers) is left as id -1, weight 0. */
static __device__ void route_block(const float *l, int n_expert, int k, int norm_topk, float *p, float *red,
                                   int32_t *sel, float *w) {
    const int tid = threadIdx.x, nth = blockDim.x;
    float mx = -INFINITY;
    for (int e = tid; e < n_expert; e += nth) mx = fmaxf(mx, p[e] = l[e]);
    mx = block_max(mx, red);
    float sum = 0.0f;
    for (int e = tid; e < n_expert; e += nth) sum += p[e] = expf(p[e] - mx);
    sum = block_sum(sum, red); /* synchronises: every p[e] is written */
    if (tid < k) sel[tid] = -1, w[tid] = 0.0f;
    for (int e = tid; e < n_expert; e += nth) {
        const float pr = p[e] / sum;
        p[e] = pr >= 0.0f ? pr : -1.0f; /* NaN: below every probability */
    }
    __syncthreads();
    for (int e = tid; e < n_expert; e += nth) {
        const float pr = p[e];
        if (pr < 0.0f) continue;
        int r = 0;
        for (int f = 0; f < n_expert; f++) {
            const float q = p[f];
            r += q > pr || (q == pr && f < e);
        }
        if (r < k) sel[r] = e, w[r] = pr;
    }
    __syncthreads();
    if (norm_topk) {
        float ws = 0.0f;
        for (int j = 0; j < k; j++) ws += w[j];
        __syncthreads(); /* every thread has read w */
        if (tid < k && ws > 0.0f) w[tid] /= ws;
        __syncthreads();
    }
}

#endif
