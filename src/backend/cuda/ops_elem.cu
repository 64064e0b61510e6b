/* Row and elementwise ops of the GPU backend: rmsnorm, rope, kv_store,
 * act_mul, add, scale, and the MoE helpers (routing, gather, scatter-add).
 * Each matches the CPU backend's formula (cpu_backend.c) in float; where the
 * CPU sums in double (rmsnorm, routing softmax) a block tree sum in float is
 * well inside the tests' NMSE bounds.
 */
#include "backend/cuda/common.cuh"
#include "backend/cuda/ops.h"

void *cuda_scratch_reserve(cuda_scratch *sc, size_t bytes) {
    if (bytes > sc->bytes) {
        if (sc->p) CUDA_CHECK(cudaFree(sc->p));
        size_t nb = bytes + bytes / 4; /* some headroom: prompt chunks vary in length */
        CUDA_CHECK(cudaMalloc(&sc->p, nb));
        sc->bytes = nb;
    }
    return sc->p;
}

void cuda_scratch_free(cuda_scratch *sc) {
    if (sc->p) CUDA_CHECK(cudaFree(sc->p));
    sc->p = NULL;
    sc->bytes = 0;
}

/* Sum over a block of up to 1024 threads; every thread gets the total. red holds 32 floats. */
static __device__ float block_sum(float v, float *red) {
    int lane = threadIdx.x % ST_WARP, w = threadIdx.x / ST_WARP, nw = (blockDim.x + ST_WARP - 1) / ST_WARP;
    v = warp_sum(v);
    __syncthreads(); /* red may still be read by a previous call */
    if (lane == 0) red[w] = v;
    __syncthreads();
    v = lane < nw ? red[lane] : 0.0f;
    return warp_sum(v);
}

/* One block per row: sum of squares, then scale. In place is safe: each
 * thread writes only the values it read, after the block's sum is known. */
static __global__ void rmsnorm_kernel(const float *x, const float *w, float *y, int dim, float eps) {
    __shared__ float red[32];
    const float *xr = x + (size_t)blockIdx.x * dim;
    float *yr = y + (size_t)blockIdx.x * dim;
    float ss = 0;
    for (int i = threadIdx.x; i < dim; i += blockDim.x) ss += xr[i] * xr[i];
    ss = block_sum(ss, red);
    float sc = (float)(1.0 / sqrt((double)ss / dim + eps));
    for (int i = threadIdx.x; i < dim; i += blockDim.x) yr[i] = xr[i] * sc * w[i];
}

void cuda_rmsnorm(const float *x, const float *w, float *y, int dim, int n_rows, float eps, cudaStream_t s) {
    if (n_rows <= 0) return;
    int th = dim >= 1024 ? 1024 : dim >= 256 ? 256 : 64;
    rmsnorm_kernel<<<(unsigned)n_rows, th, 0, s>>>(x, w, y, dim, eps);
    CUDA_LAUNCH_CHECK();
}

/* One thread per rotated pair. The angle is formed in double as on the CPU:
 * at positions of tens of thousands a float angle would drift visibly. */
static __global__ void rope_kernel(float *x, int n_tok, int n_heads, int head_dim, int pos0, float theta,
                                   float freq_scale, int neox) {
    int half = head_dim / 2;
    int64_t idx = blockIdx.x * (int64_t)blockDim.x + threadIdx.x, total = (int64_t)n_tok * n_heads * half;
    if (idx >= total) return;
    int i = (int)(idx % half);
    int64_t th = idx / half;
    int t = (int)(th / n_heads);
    double a = (double)(pos0 + t) * freq_scale * pow((double)theta, -2.0 * i / head_dim);
    float c = (float)cos(a), sn = (float)sin(a);
    float *v = x + th * head_dim;
    int i0 = neox ? i : 2 * i, i1 = neox ? i + half : 2 * i + 1;
    float p = v[i0], q = v[i1];
    v[i0] = p * c - q * sn;
    v[i1] = p * sn + q * c;
}

void cuda_rope(float *x, int n_tok, int n_heads, int head_dim, int pos0, float theta, float freq_scale, int neox,
               cudaStream_t s) {
    int64_t total = (int64_t)n_tok * n_heads * (head_dim / 2);
    if (total <= 0) return;
    rope_kernel<<<st_div_up((size_t)total, 256), 256, 0, s>>>(x, n_tok, n_heads, head_dim, pos0, theta, freq_scale,
                                                              neox);
    CUDA_LAUNCH_CHECK();
}

static __global__ void kv_f16_kernel(uint16_t *kd, uint16_t *vd, const float *k, const float *v, int64_t n) {
    int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
    if (i >= n) return;
    kd[i] = __half_as_ushort(__float2half_rn(k[i]));
    vd[i] = __half_as_ushort(__float2half_rn(v[i]));
}

/* One warp per (token, head) row of K or V: absmax / 127 as the scale, round
 * to nearest even as lrintf does on the CPU (same float ops, same bits). */
static __global__ void kv_int8_kernel(int8_t *dst, float *scale, const float *src, int n_rows, int hd) {
    int r = blockIdx.x * (blockDim.x / ST_WARP) + threadIdx.x / ST_WARP, lane = threadIdx.x % ST_WARP;
    if (r >= n_rows) return;
    const float *s = src + (size_t)r * hd;
    float amax = 0;
    for (int i = lane; i < hd; i += ST_WARP) amax = fmaxf(amax, fabsf(s[i]));
    amax = warp_max(amax);
    float d = amax / 127.0f, id = d > 0 ? 1.0f / d : 0.0f;
    if (lane == 0) scale[r] = d;
    for (int i = lane; i < hd; i += ST_WARP) dst[(size_t)r * hd + i] = (int8_t)__float2int_rn(__fmul_rn(s[i], id));
}

void cuda_kv_store(st_kv_layer *kv, const float *k, const float *v, int n_tok, int pos0, cudaStream_t s) {
    size_t row = (size_t)kv->n_head_kv * kv->head_dim, off = (size_t)pos0 * row;
    int64_t n = (int64_t)n_tok * (int64_t)row;
    if (n <= 0) return;
    if (kv->type == ST_KV_F16) {
        kv_f16_kernel<<<st_div_up((size_t)n, 256), 256, 0, s>>>((uint16_t *)kv->k + off, (uint16_t *)kv->v + off, k,
                                                                v, n);
        CUDA_LAUNCH_CHECK();
        return;
    }
    int rows = n_tok * kv->n_head_kv;
    size_t soff = (size_t)pos0 * kv->n_head_kv;
    kv_int8_kernel<<<st_div_up((size_t)rows, 8), 256, 0, s>>>((int8_t *)kv->k + off, kv->k_scale + soff, k, rows,
                                                              kv->head_dim);
    CUDA_LAUNCH_CHECK();
    kv_int8_kernel<<<st_div_up((size_t)rows, 8), 256, 0, s>>>((int8_t *)kv->v + off, kv->v_scale + soff, v, rows,
                                                              kv->head_dim);
    CUDA_LAUNCH_CHECK();
}

static __global__ void act_mul_kernel(int act, const float *g, const float *u, float *out, int64_t n) {
    int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
    if (i >= n) return;
    float x = g[i], a;
    if (act == ST_ACT_SILU)
        a = x / (1.0f + expf(-x));
    else
        a = 0.5f * x * (1.0f + tanhf(0.7978845608028654f * (x + 0.044715f * x * x * x))); /* gelu, tanh form */
    out[i] = a * u[i];
}

void cuda_act_mul(st_act act, const float *g, const float *u, float *out, int64_t n, cudaStream_t s) {
    if (n <= 0) return;
    act_mul_kernel<<<st_div_up((size_t)n, 256), 256, 0, s>>>((int)act, g, u, out, n);
    CUDA_LAUNCH_CHECK();
}

static __global__ void add_kernel(float *x, const float *b, int64_t dim, int64_t n) {
    int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
    if (i < n) x[i] += b[i % dim];
}

void cuda_add(float *x, const float *b, int64_t dim, int n_rows, cudaStream_t s) {
    int64_t n = dim * n_rows;
    if (n <= 0) return;
    add_kernel<<<st_div_up((size_t)n, 256), 256, 0, s>>>(x, b, dim, n);
    CUDA_LAUNCH_CHECK();
}

static __global__ void scale_kernel(float *x, float sc, int64_t n) {
    int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
    if (i < n) x[i] *= sc;
}

void cuda_scale(float *x, float sc, int64_t n, cudaStream_t s) {
    if (n <= 0) return;
    scale_kernel<<<st_div_up((size_t)n, 256), 256, 0, s>>>(x, sc, n);
    CUDA_LAUNCH_CHECK();
}

/* One warp per token: softmax over the experts (held in shared memory),
 * then k rounds of warp argmax (ties to the lower id, as on the CPU). */
static __global__ void moe_route_kernel(const float *logits, int n_tok, int n_expert, int k, int norm_topk,
                                        int32_t *sel, float *wsel) {
    extern __shared__ float probs[]; /* [warps per block][n_expert] */
    int wib = threadIdx.x / ST_WARP, lane = threadIdx.x % ST_WARP;
    int t = blockIdx.x * (blockDim.x / ST_WARP) + wib;
    if (t >= n_tok) return;
    float *p = probs + (size_t)wib * n_expert;
    const float *l = logits + (size_t)t * n_expert;
    float mx = -INFINITY;
    for (int e = lane; e < n_expert; e += ST_WARP) mx = fmaxf(mx, l[e]);
    mx = warp_max(mx);
    float sum = 0;
    for (int e = lane; e < n_expert; e += ST_WARP) {
        p[e] = expf(l[e] - mx);
        sum += p[e];
    }
    sum = warp_sum(sum);
    __syncwarp();
    for (int e = lane; e < n_expert; e += ST_WARP) p[e] /= sum;
    __syncwarp();
    float wsum = 0;
    for (int j = 0; j < k; j++) {
        float bv = -1.0f;
        int bi = -1;
        for (int e = lane; e < n_expert; e += ST_WARP)
            if (p[e] >= 0 && (bi < 0 || p[e] > bv)) {
                bv = p[e];
                bi = e;
            }
        for (int o = ST_WARP / 2; o > 0; o >>= 1) {
            float ov = __shfl_xor_sync(ST_FULL_MASK, bv, o);
            int oi = __shfl_xor_sync(ST_FULL_MASK, bi, o);
            if (oi >= 0 && (bi < 0 || ov > bv || (ov == bv && oi < bi))) {
                bv = ov;
                bi = oi;
            }
        }
        if (lane == 0) {
            sel[t * k + j] = bi;
            wsel[t * k + j] = bv;
            p[bi] = -1.0f;
        }
        wsum += bv;
        __syncwarp();
    }
    if (norm_topk && lane == 0)
        for (int j = 0; j < k; j++) wsel[t * k + j] /= wsum;
}

void cuda_moe_route(const float *logits, int n_tok, int n_expert, int k, int norm_topk, int32_t *sel, float *wsel,
                    cudaStream_t s) {
    if (n_tok <= 0) return;
    int warps = 4;
    size_t smem = (size_t)warps * n_expert * sizeof(float);
    moe_route_kernel<<<st_div_up((size_t)n_tok, (size_t)warps), warps * ST_WARP, smem, s>>>(logits, n_tok, n_expert,
                                                                                           k, norm_topk, sel, wsel);
    CUDA_LAUNCH_CHECK();
}

static __global__ void gather_kernel(float *dst, const float *src, const int32_t *tok, int64_t dim, int64_t n) {
    int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
    if (i < n) dst[i] = src[(size_t)tok[i / dim] * dim + i % dim];
}

void cuda_gather_rows(float *dst, const float *src, const int32_t *tok, int n, int64_t dim, cudaStream_t s) {
    int64_t total = (int64_t)n * dim;
    if (total <= 0) return;
    gather_kernel<<<st_div_up((size_t)total, 256), 256, 0, s>>>(dst, src, tok, dim, total);
    CUDA_LAUNCH_CHECK();
}

/* Rows of one expert go to distinct tokens (a token picks an expert once),
 * so plain read-modify-write needs no atomics within one launch. */
static __global__ void scatter_add_kernel(float *out, const float *y, const int32_t *tok, const float *tw,
                                          int64_t dim, int64_t n) {
    int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
    if (i >= n) return;
    int64_t r = i / dim;
    out[(size_t)tok[r] * dim + i % dim] += tw[r] * y[i];
}

void cuda_scatter_add(float *out, const float *y, const int32_t *tok, const float *tw, int n, int64_t dim,
                      cudaStream_t s) {
    int64_t total = (int64_t)n * dim;
    if (total <= 0) return;
    scatter_add_kernel<<<st_div_up((size_t)total, 256), 256, 0, s>>>(out, y, tok, tw, dim, total);
    CUDA_LAUNCH_CHECK();
}

static __global__ void moe_xrow_kernel(int32_t *xrow, int nk, int k) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < nk) xrow[i] = i / k;
}

void cuda_moe_pair_rows(int32_t *xrow, int nk, int k, cudaStream_t s) {
    if (nk <= 0) return;
    moe_xrow_kernel<<<st_div_up((size_t)nk, 256), 256, 0, s>>>(xrow, nk, k);
    CUDA_LAUNCH_CHECK();
}

/* out[t][c] = sum_j wsel[t*k+j] * y[t*k+j][c], j in order as on the CPU. */
static __global__ void moe_combine_kernel(float *out, const float *y, const float *wsel, int k, int64_t dim,
                                          int64_t n) {
    int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
    if (i >= n) return;
    int64_t t = i / dim, c = i % dim;
    float acc = 0.0f;
    for (int j = 0; j < k; j++) acc += wsel[t * k + j] * y[(size_t)(t * k + j) * dim + c];
    out[i] = acc;
}

void cuda_moe_combine(float *out, const float *y, const float *wsel, int n_tok, int k, int64_t dim, cudaStream_t s) {
    int64_t n = (int64_t)n_tok * dim;
    if (n <= 0) return;
    moe_combine_kernel<<<st_div_up((size_t)n, 256), 256, 0, s>>>(out, y, wsel, k, dim, n);
    CUDA_LAUNCH_CHECK();
}
