/* The draw of a temperature-only sampler over every id, on the device
 * (backend.h's draw): the server's default request (OpenAI's temperature
 * with no cut) then copies one token to the host per step, not the whole
 * vocabulary's logits (600 KB for Qwen3, and ~0.6 ms of host softmax).
 *
 * The host's draw (engine/sampler.c draw_all): p[i] = exp((x[i] - max) / t),
 * r = u * sum(p), the first i whose running sum passes r, found by skipping
 * whole blocks of 64 by their sums. The same here, in three kernels:
 *   1. each block's max over its slice of x, and whether it holds a NaN;
 *   2. a warp per block of 64 ids: the max of the stage-1 maxima, then the
 *      block's p and its sum (the p themselves are not kept);
 *   3. one block: the sum of the block sums in double, r = u * sum, a scan
 *      of the block sums to the block where the running sum passes r, then
 *      a walk through its 64 values (recomputed) in double.
 * The sums are taken in another order than the host's and device expf is
 * not the host's exp, so a draw that falls within float rounding of a
 * boundary between two ids may pick the neighbour; otherwise the token is
 * the host's for the same u. A NaN or a sum that is not finite and positive:
 * no token (the caller draws on the host over the logits, which drops NaNs).
 */
#include "backend/cuda/common.cuh"
#include "backend/cuda/ops.h"

#define DRAW_THREADS 256
#define DRAW_PER     16 /* stage 1: values per thread */
#define DRAW_SLICE   (DRAW_THREADS * DRAW_PER)
#define DRAW_BLOCK   64 /* ids per block of the walk, as the host's */

static __global__ void __launch_bounds__(DRAW_THREADS) draw_max_kernel(const float *x, int n, float *bmax, int *nan) {
    pdl_enter(); /* first: see st_launch (common.cuh) */
    __shared__ float red[ST_WARP];
    const int i0 = blockIdx.x * DRAW_SLICE;
    float m = -INFINITY;
    int bad = 0;
    for (int i = i0 + threadIdx.x; i < n && i < i0 + DRAW_SLICE; i += DRAW_THREADS) {
        const float v = x[i];
        bad |= v != v;
        m = fmaxf(m, v);
    }
    m = block_max(m, red);
    bad = __syncthreads_or(bad);
    if (threadIdx.x == 0) {
        bmax[blockIdx.x] = m;
        if (bad) *nan = 1;
    }
}

/* a warp per block of 64: p = exp((x - M) * inv_t), two per lane, their sum */
static __global__ void __launch_bounds__(DRAW_THREADS)
    draw_sums_kernel(const float *x, int n, const float *bmax, int n_bmax, float inv_t, float *bsum, int n_blk) {
    pdl_enter(); /* first: see st_launch (common.cuh) */
    __shared__ float red[ST_WARP];
    float m = -INFINITY;
    for (int i = threadIdx.x; i < n_bmax; i += DRAW_THREADS) m = fmaxf(m, bmax[i]);
    m = block_max(m, red);
    const int b = blockIdx.x * (DRAW_THREADS / ST_WARP) + threadIdx.x / ST_WARP, lane = threadIdx.x % ST_WARP;
    if (b >= n_blk) return;
    const int i = b * DRAW_BLOCK + lane;
    float s = (i < n ? expf((x[i] - m) * inv_t) : 0.0f) + (i + ST_WARP < n ? expf((x[i + ST_WARP] - m) * inv_t) : 0.0f);
    s = warp_sum(s);
    if (lane == 0) bsum[b] = s;
}

/* one block: the walk; *out = the token, or -1 (NaN, or no finite positive sum) */
#define DRAW_WALK_THREADS 1024
static __global__ void __launch_bounds__(DRAW_WALK_THREADS)
    draw_walk_kernel(const float *x, int n, const float *bmax, int n_bmax, const int *nan, const float *bsum, int n_blk,
                     float inv_t, double u, int32_t *out) {
    pdl_enter(); /* first: see st_launch (common.cuh) */
    __shared__ double part[DRAW_WALK_THREADS];
    __shared__ float red[ST_WARP];
    __shared__ int found, last;
    const int tid = threadIdx.x;
    float m = -INFINITY;
    for (int i = tid; i < n_bmax; i += DRAW_WALK_THREADS) m = fmaxf(m, bmax[i]);
    m = block_max(m, red);
    /* each thread a contiguous run of blocks: its sum, then a scan of the runs */
    const int per = (n_blk + DRAW_WALK_THREADS - 1) / DRAW_WALK_THREADS, b0 = tid * per;
    double s = 0;
    for (int b = b0; b < b0 + per && b < n_blk; b++) s += bsum[b];
    part[tid] = s;
    if (tid == 0) found = -1, last = -1;
    __syncthreads();
    for (int o = 1; o < DRAW_WALK_THREADS; o <<= 1) { /* inclusive scan (Hillis-Steele) */
        const double v = tid >= o ? part[tid - o] : 0.0;
        __syncthreads();
        part[tid] += v;
        __syncthreads();
    }
    const double total = part[DRAW_WALK_THREADS - 1];
    if (*nan || !(total > 0.0) || !isfinite(total)) {
        if (tid == 0) *out = -1;
        return;
    }
    const double r = u * total;
    const double before = tid ? part[tid - 1] : 0.0;
    /* the run where the running sum passes r, else the last one with any
     * mass; only runs with mass qualify: the scan adds in another order at
     * each place, so a run without any can still read part[tid] > before
     * (a draw of u near 1 at temperature 0.05 found one, and no token) */
    if (s > 0.0 && before <= r && r < part[tid]) found = tid;
    if (s > 0.0) atomicMax(&last, tid);
    __syncthreads();
    if (tid != 0) return;
    const int run = found >= 0 ? found : last; /* last >= 0: total > 0 */
    double cum = run ? part[run - 1] : 0.0, cb = cum;
    /* the block where the sum passes r, else the run's last one with mass;
     * blocks and ids without mass are never chosen (the fallback run can
     * start past r: rounding again) */
    int sel = -1;
    for (int b = run * per; b < run * per + per && b < n_blk; b++) {
        if (!(bsum[b] > 0.0f)) continue;
        sel = b, cb = cum;
        if (cum + bsum[b] > r) break;
        cum += bsum[b];
    }
    int32_t tok = -1;
    cum = cb;
    for (int i = sel * DRAW_BLOCK; sel >= 0 && i < n && i < (sel + 1) * DRAW_BLOCK; i++) {
        const float p = expf((x[i] - m) * inv_t);
        if (!(p > 0.0f)) continue;
        tok = i;
        cum += p;
        if (r < cum) break;
    }
    *out = tok;
}

size_t cuda_draw_scratch_bytes(int n) {
    const int n_bmax = (n + DRAW_SLICE - 1) / DRAW_SLICE, n_blk = (n + DRAW_BLOCK - 1) / DRAW_BLOCK;
    return (size_t)(n_bmax + n_blk) * sizeof(float) + 2 * sizeof(int32_t) + 64;
}

int32_t *cuda_draw(const float *x, int n, float inv_t, double u, cuda_scratch *scratch, cudaStream_t s) {
    const int n_bmax = (n + DRAW_SLICE - 1) / DRAW_SLICE, n_blk = (n + DRAW_BLOCK - 1) / DRAW_BLOCK;
    char *base = (char *)cuda_scratch_reserve(scratch, cuda_draw_scratch_bytes(n));
    int32_t *out = (int32_t *)base, *nan = out + 1;
    float *bmax = (float *)(base + 64), *bsum = bmax + n_bmax;
    CUDA_CHECK(cudaMemsetAsync(nan, 0, sizeof(int32_t), s));
    st_launch(draw_max_kernel, dim3((unsigned)n_bmax), dim3(DRAW_THREADS), 0, s, x, n, bmax, nan);
    st_launch(draw_sums_kernel, dim3(st_div_up((size_t)n_blk, DRAW_THREADS / ST_WARP)), dim3(DRAW_THREADS), 0, s, x, n,
              (const float *)bmax, n_bmax, inv_t, bsum, n_blk);
    st_launch(draw_walk_kernel, dim3(1), dim3(DRAW_WALK_THREADS), 0, s, x, n, (const float *)bmax, n_bmax,
              (const int *)nan, (const float *)bsum, n_blk, inv_t, u, out);
    return out;
}
