/* MoE routing of one token by one block (backend.h's st_moe_gating):
 * p = softmax or sigmoid of the router logits; the choice ranks the score
 * s = p (+ the selection bias), optionally only among the experts of the
 * n_group_used best groups (a group scores the sum of its two best s); the
 * weights are the chosen p, renormalised (norm_topk), times scale. Ties go
 * to the lower id, as on the CPU (cpu_backend.c's route_tokens,
 * cpu_mla.c's cpu_route_groups). Used by the routing kernel (ops_elem.cu)
 * and by the fused decode MoE kernel (mmv_moe.cu), whose blocks each route
 * their token instead of waiting for a routing kernel.
 *
 * Ranks instead of k rounds of a warp argmax: every thread finds its
 * experts' ranks at once (reads of shared memory that all lanes share), so
 * the choice costs one pass over the scores instead of k dependent rounds
 * of shuffles. Measured on an H200 (128 experts, top 8, a 1-block kernel in
 * a CUDA graph): 2.5 us against 4.9 us for the warp rounds. The groups add
 * two passes of n_group threads (8 groups of 32 for DeepSeek V3).
 */
#ifndef STRATA_BACKEND_CUDA_ROUTE_CUH
#define STRATA_BACKEND_CUDA_ROUTE_CUH

#include "backend/cuda/common.cuh"

#define ROUTE_MAX_GROUP 64 /* as the CPU's cpu_route_groups (model_load refuses more) */

/* f16's smallest normal: the CPU (after llama.cpp) clamps the weights' sum at it before dividing */
#define ROUTE_MIN_SUM 6.103515625e-5f

/* Whether gt is the plain rule: softmax, no selection bias, no groups,
 * scale 1 (qwen3moe's, gpt-oss's); route_block<false> routes by it alone,
 * ranking p itself, without the other rules' code. */
static inline bool route_plain(const st_moe_gating &gt) {
    return gt.fn != ST_GATE_SIGMOID && !gt.bias && gt.n_group <= 1 && gt.scale == 1.0f;
}

/* Every thread of a one-dimensional block calls it (it synchronises the
 * block). l: the token's n_expert logits; p, s: n_expert floats of shared
 * memory each (probabilities, scores); red: ST_WARP floats of shared memory;
 * sel, w: k entries of shared memory, the choices in order of decreasing
 * score, visible to the block on return. A NaN (or -inf) score is never
 * chosen; a place no expert takes (fewer than k candidates) is left as id
 * -1, weight 0. gt.bias: device memory. */
template <bool GEN = true>
static __device__ void route_block(const float *l, int n_expert, int k, const st_moe_gating &gt, float *p, float *s,
                                   float *red, int32_t *sel, float *w) {
    if constexpr (!GEN) s = p;
    __shared__ float gsc[ROUTE_MAX_GROUP];
    __shared__ int gkeep[ROUTE_MAX_GROUP];
    const int tid = threadIdx.x, nth = blockDim.x;
    if (GEN && gt.fn == ST_GATE_SIGMOID) {
        for (int e = tid; e < n_expert; e += nth) p[e] = 1.0f / (1.0f + expf(-l[e]));
    } else {
        float mx = -INFINITY;
        for (int e = tid; e < n_expert; e += nth) mx = fmaxf(mx, p[e] = l[e]);
        mx = block_max(mx, red);
        float sum = 0.0f;
        for (int e = tid; e < n_expert; e += nth) sum += p[e] = expf(p[e] - mx);
        sum = block_sum(sum, red);
        for (int e = tid; e < n_expert; e += nth) p[e] /= sum; /* each thread its own experts: no barrier */
    }
    if constexpr (GEN)
        for (int e = tid; e < n_expert; e += nth) {
            const float v = gt.bias ? p[e] + gt.bias[e] : p[e];
            s[e] = v > -INFINITY ? v : -INFINITY; /* NaN: never chosen */
        }
    if (tid < k) sel[tid] = -1, w[tid] = 0.0f;
    __syncthreads();
    if (GEN && gt.n_group > 1) { /* group-limited: the experts outside the kept groups cannot be chosen */
        const int ng = gt.n_group, per = n_expert / ng;
        for (int g = tid; g < ng; g += nth) {
            float a = -INFINITY, b = -INFINITY; /* the group's two best */
            for (int e = g * per; e < (g + 1) * per; e++) {
                const float v = s[e];
                if (v > a) b = a, a = v;
                else if (v > b) b = v;
            }
            gsc[g] = per > 1 ? a + b : a; /* never NaN: s holds none */
        }
        __syncthreads();
        for (int g = tid; g < ng; g += nth) {
            int r = 0;
            for (int h = 0; h < ng; h++) r += gsc[h] > gsc[g] || (gsc[h] == gsc[g] && h < g);
            gkeep[g] = r < gt.n_group_used;
        }
        __syncthreads();
        for (int e = tid; e < n_expert; e += nth)
            if (!gkeep[e / per]) s[e] = -INFINITY;
        __syncthreads();
    }
    for (int e = tid; e < n_expert; e += nth) {
        const float v = s[e];
        if (!(v > -INFINITY)) continue;
        int r = 0;
        for (int f = 0; f < n_expert; f++) {
            const float q = s[f];
            r += q > v || (q == v && f < e);
        }
        if (r < k) sel[r] = e, w[r] = p[e];
    }
    __syncthreads();
    if (gt.norm_topk || (GEN && gt.scale != 1.0f)) {
        float ws = 0.0f;
        for (int j = 0; j < k; j++) ws += w[j];
        __syncthreads(); /* every thread has read w */
        if (tid < k) {
            float v = w[tid];
            if (gt.norm_topk) v /= fmaxf(ws, ROUTE_MIN_SUM);
            w[tid] = GEN ? v * gt.scale : v;
        }
        __syncthreads();
    }
}

#endif
