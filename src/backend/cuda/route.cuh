/* MoE routing of one token by one warp: softmax over the router logits,
 * then k rounds of warp argmax (ties to the lower id, as on the CPU),
 * optional renormalisation. Used by the routing kernel (ops_elem.cu) and by
 * the fused decode MoE kernel (mmv_moe.cu), whose blocks each route their
 * token instead of waiting for a routing kernel.
 */
#ifndef STRATA_BACKEND_CUDA_ROUTE_CUH
#define STRATA_BACKEND_CUDA_ROUTE_CUH

#include "backend/cuda/common.cuh"

/* One whole warp: l, the token's n_expert logits; p: n_expert floats of
 * shared memory for this warp; sel, w: the k choices in order of decreasing
 * probability, written by lane 0 (visible to the warp on return). */
static __device__ void route_warp(const float *l, int n_expert, int k, int norm_topk, float *p, int32_t *sel,
                                  float *w) {
    const int lane = threadIdx.x % ST_WARP;
    float mx = -INFINITY;
    for (int e = lane; e < n_expert; e += ST_WARP) mx = fmaxf(mx, l[e]);
    mx = warp_max(mx);
    float sum = 0.0f;
    for (int e = lane; e < n_expert; e += ST_WARP) {
        p[e] = expf(l[e] - mx);
        sum += p[e];
    }
    sum = warp_sum(sum);
    __syncwarp();
    for (int e = lane; e < n_expert; e += ST_WARP) p[e] /= sum;
    __syncwarp();
    float wsum = 0.0f;
    for (int j = 0; j < k; j++) {
        float bv = -1.0f;
        int bi = -1;
        for (int e = lane; e < n_expert; e += ST_WARP)
            if (p[e] >= 0 && (bi < 0 || p[e] > bv)) {
                bv = p[e];
                bi = e;
            }
        for (int o = ST_WARP / 2; o > 0; o >>= 1) {
            const float ov = __shfl_xor_sync(ST_FULL_MASK, bv, o);
            const int oi = __shfl_xor_sync(ST_FULL_MASK, bi, o);
            if (oi >= 0 && (bi < 0 || ov > bv || (ov == bv && oi < bi))) {
                bv = ov;
                bi = oi;
            }
        }
        if (lane == 0) {
            sel[j] = bi;
            w[j] = bv;
            p[bi] = -1.0f;
        }
        wsum += bv;
        __syncwarp();
    }
    if (norm_topk && lane == 0)
        for (int j = 0; j < k; j++) w[j] /= wsum;
    __syncwarp();
}

#endif
