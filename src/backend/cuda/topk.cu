/* The k largest values of a device array with their indices (backend.h's
 * top_k: sampling on the device, so that a decode step copies k candidates
 * to the host instead of the whole vocabulary's logits).
 *
 * Order: larger value first, equal values by the lower index (a total order,
 * the host sampler's). NaNs are never chosen: they are left out as the
 * values are loaded (inside the rounds they would break the order).
 *
 * Two kernels. Stage 1: TOPK_BLOCKS_MAX blocks at most, each over a slice of
 * up to TOPK_THREADS * TOPK_PER values held in registers; k rounds, each a
 * block argmax over the values after the previous round's choice in the
 * order (nothing is marked or written back). Stage 2: one block does the same
 * over the stage-1 candidates. A round costs a few shuffles and two block
 * barriers, so greedy decoding (k = 1) is one round per stage.
 */
#include "backend/cuda/common.cuh"
#include "backend/cuda/ops.h"

#define TOPK_THREADS    256
#define TOPK_PER        16 /* values per thread: slices of 4096 */
#define TOPK_BLOCKS_MAX 128
#define TOPK2_THREADS   1024
#define TOPK2_PER       8 /* stage 2 holds up to 8192 candidates */

struct topk_vi {
    float v;
    int i; /* -1: none */
};

/* a ranks before b: larger value, or equal with the lower index; none last
 * (no NaN reaches it: the loads leave them out) */
static __device__ __forceinline__ bool topk_before(topk_vi a, topk_vi b) {
    if (a.i < 0) return false;
    if (b.i < 0) return true;
    return a.v > b.v || (a.v == b.v && a.i < b.i);
}

/* k rounds over the block's values (PER per thread, index -1 where none);
 * thread 0 writes choice j to ov[j], oi[j] (-1 when fewer than k exist). */
template <int PER>
static __device__ void topk_rounds(const float (&v)[PER], const int (&id)[PER], int k, float *ov, int *oi) {
    __shared__ topk_vi red[32];
    __shared__ topk_vi chosen;
    const int lane = threadIdx.x % ST_WARP, warp = threadIdx.x / ST_WARP, nw = blockDim.x / ST_WARP;
    topk_vi last = {0.0f, -1}; /* none yet: every value is after it */
    for (int j = 0; j < k; j++) {
        topk_vi b = {0.0f, -1};
#pragma unroll
        for (int p = 0; p < PER; p++) {
            const topk_vi c = {v[p], id[p]};
            if (c.i >= 0 && (last.i < 0 || topk_before(last, c)) && topk_before(c, b)) b = c;
        }
        for (int o = ST_WARP / 2; o > 0; o >>= 1) {
            topk_vi other;
            other.v = __shfl_xor_sync(ST_FULL_MASK, b.v, o);
            other.i = __shfl_xor_sync(ST_FULL_MASK, b.i, o);
            if (topk_before(other, b)) b = other;
        }
        if (lane == 0) red[warp] = b;
        __syncthreads();
        if (warp == 0) {
            b = lane < nw ? red[lane] : topk_vi{0.0f, -1};
            for (int o = ST_WARP / 2; o > 0; o >>= 1) {
                topk_vi other;
                other.v = __shfl_xor_sync(ST_FULL_MASK, b.v, o);
                other.i = __shfl_xor_sync(ST_FULL_MASK, b.i, o);
                if (topk_before(other, b)) b = other;
            }
            if (lane == 0) {
                chosen = b;
                ov[j] = b.v;
                oi[j] = b.i;
            }
        }
        __syncthreads();
        last = chosen;
        if (last.i < 0) { /* fewer than k values: the rest stay none */
            for (int r = j + 1 + (int)threadIdx.x; r < k; r += blockDim.x) ov[r] = 0.0f, oi[r] = -1;
            return;
        }
    }
}

/* Stage 1: block b takes x[b * slice, (b + 1) * slice). */
static __global__ void __launch_bounds__(TOPK_THREADS)
    topk_stage1(const float *x, int n, int slice, int k, float *cv, int *ci) {
    pdl_enter(); /* first: see st_launch (common.cuh) */
    float v[TOPK_PER];
    int id[TOPK_PER];
    const int base = blockIdx.x * slice, end = min(n, base + slice);
#pragma unroll
    for (int p = 0; p < TOPK_PER; p++) {
        const int i = base + (int)threadIdx.x + p * TOPK_THREADS;
        const float xv = i < end ? x[i] : 0.0f;
        id[p] = i < end && xv == xv ? i : -1; /* NaN: none */
        v[p] = xv;
    }
    topk_rounds<TOPK_PER>(v, id, k, cv + (size_t)blockIdx.x * k, ci + (size_t)blockIdx.x * k);
}

/* Stage 2: the n_cand candidates of stage 1 (ids are the array's). */
static __global__ void __launch_bounds__(TOPK2_THREADS)
    topk_stage2(const float *cv, const int *ci, int n_cand, int k, float *ov, int *oi) {
    pdl_enter(); /* first: see st_launch (common.cuh) */
    float v[TOPK2_PER];
    int id[TOPK2_PER];
#pragma unroll
    for (int p = 0; p < TOPK2_PER; p++) {
        const int c = (int)threadIdx.x + p * TOPK2_THREADS;
        id[p] = c < n_cand ? ci[c] : -1;
        v[p] = c < n_cand ? cv[c] : 0.0f;
    }
    topk_rounds<TOPK2_PER>(v, id, k, ov, oi);
}

size_t cuda_top_k_scratch_bytes(void) { return ((size_t)TOPK2_THREADS * TOPK2_PER + CUDA_TOPK_MAX) * 8; }

int cuda_top_k(const float *x, int n, int k, cuda_scratch *scratch, const void **out, cudaStream_t s) {
    const int slice = TOPK_THREADS * TOPK_PER, blocks = (n + slice - 1) / slice;
    if (n <= 0 || k < 1 || k > CUDA_TOPK_MAX || blocks > TOPK_BLOCKS_MAX || blocks * k > TOPK2_THREADS * TOPK2_PER) {
        st_error_set("top-k on the GPU: k = %d of %d values (it takes k <= %d of at most %d)", k, n, CUDA_TOPK_MAX,
                     TOPK_BLOCKS_MAX * slice);
        return -1;
    }
    const size_t nc = (size_t)blocks * k;
    /* [k] result values, [k] result ids (one copy to the host), then the candidates */
    uint8_t *sc = (uint8_t *)cuda_scratch_reserve(scratch, (nc + (size_t)k) * 8);
    float *rv = (float *)sc, *cv = rv + 2 * (size_t)k;
    int *ri = (int *)(rv + k), *ci = (int *)(cv + nc);
    st_launch(topk_stage1, dim3((unsigned)blocks), dim3(TOPK_THREADS), 0, s, x, n, slice, k, cv, ci);
    st_launch(topk_stage2, dim3(1), dim3(TOPK2_THREADS), 0, s, (const float *)cv, (const int *)ci, (int)nc, k, rv, ri);
    *out = sc;
    return 0;
}
