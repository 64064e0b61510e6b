/* MoE routing of one token by a whole block: softmax over the router
 * logits, the k largest probabilities (ties to the lower id, as on the CPU),
 * optional renormalisation. Used by the routing kernel (ops_elem.cu) and by
 * the fused decode MoE kernel (mmv_moe.cu), which routes in every block
 * instead of launching a kernel for it.
 */
#ifndef STRATA_BACKEND_CUDA_ROUTE_CUH
#define STRATA_BACKEND_CUDA_ROUTE_CUH

#include "backend/cuda/common.cuh"

/* Most experts a block routes over (its shared probabilities). */
#define ROUTE_MAX_EXPERT 512

static __device__ __forceinline__ int route_tid() { return threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z); }

/* max (is_max) or sum over the block; every thread gets it. red: 32 floats. */
static __device__ float route_reduce(float v, float *red, int is_max) {
    const int tid = route_tid(), lane = tid % ST_WARP, nw = (blockDim.x * blockDim.y * blockDim.z) / ST_WARP;
    v = is_max ? warp_max(v) : warp_sum(v);
    __syncthreads(); /* red may still be read from a previous call */
    if (lane == 0) red[tid / ST_WARP] = v;
    __syncthreads();
    const float init = is_max ? -INFINITY : 0.0f;
    v = lane < nw ? red[lane] : init;
    return is_max ? warp_max(v) : warp_sum(v);
}

/* Every thread of the block (whole warps): l, the token's n_expert logits
 * (n_expert <= ROUTE_MAX_EXPERT); probs: shared, n_expert floats; sel, w:
 * shared, k each, the choices in order of decreasing probability. */
static __device__ void route_block(const float *l, int n_expert, int k, int norm_topk, float *probs, int *sel, float *w,
                                   float *red) {
    const int tid = route_tid(), nth = blockDim.x * blockDim.y * blockDim.z;
    float mx = -INFINITY;
    for (int e = tid; e < n_expert; e += nth) mx = fmaxf(mx, l[e]);
    mx = route_reduce(mx, red, 1);
    float sum = 0.0f;
    for (int e = tid; e < n_expert; e += nth) {
        const float p = expf(l[e] - mx);
        probs[e] = p;
        sum += p;
    }
    sum = route_reduce(sum, red, 0);
    for (int e = tid; e < n_expert; e += nth) probs[e] /= sum;
    __syncthreads();
    /* an expert's rank: how many come before it (larger, or equal with a lower id) */
    for (int e = tid; e < n_expert; e += nth) {
        const float p = probs[e];
        int rank = 0;
        for (int o = 0; o < n_expert; o++) {
            const float q = probs[o];
            rank += q > p || (q == p && o < e);
        }
        if (rank < k) {
            sel[rank] = e;
            w[rank] = p;
        }
    }
    __syncthreads();
    if (tid == 0 && norm_topk) {
        float ws = 0.0f;
        for (int j = 0; j < k; j++) ws += w[j];
        for (int j = 0; j < k; j++) w[j] /= ws;
    }
    __syncthreads();
}

#endif
