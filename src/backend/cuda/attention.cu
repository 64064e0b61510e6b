/* Causal attention over the KV cache (backend.h's attention op).
 *
 * One kernel for decode and prompt: a block takes one (token, head) and one
 * slice of the positions that token sees, and runs an online softmax over
 * tiles of 64 positions (running max m, running sum l, unnormalised output
 * acc). A second kernel combines the slices of each (token, head):
 *   M = max m_s,  out = sum_s exp(m_s - M) acc_s / sum_s exp(m_s - M) l_s.
 * Decode has few (token, head) pairs, so long contexts are split into many
 * slices to fill the multiprocessors; a prompt chunk has enough pairs and
 * mostly runs one slice each (a straightforward tiled kernel: every pair
 * reads its own K/V rows, no sharing between the heads of a GQA group yet).
 */
#include "backend/cuda/common.cuh"
#include "backend/cuda/ops.h"

#include <string.h>

extern "C" {
#include "core/switches.h"
}

#define ATT_THREADS 128
#define ATT_TILE 64
#define ATT_MAX_HD 512
#define ATT_ACC (ATT_MAX_HD / ATT_THREADS)

static __device__ __forceinline__ float kv_load(int type, const void *base, const float *scales, size_t idx,
                                                size_t srow) {
    if (type == ST_KV_F16) return __half2float(__ushort_as_half(((const uint16_t *)base)[idx]));
    return scales[srow] * (float)((const int8_t *)base)[idx];
}

/* The positions [c0, c1) that slice `split` of n_split covers for token t of
 * a chunk at pos0: the slices split the chunk's longest span (its last
 * token's) evenly in whole tiles; each token sees up to its own position, the
 * last `window` of them with a window. */
static __device__ __forceinline__ void att_slice(int pos0, int n_tok, int t, int window, int n_split, int split,
                                                 int *c0, int *c1) {
    int span = pos0 + n_tok;
    if (window > 0 && span > window) span = window;
    const int chunk = ((span + n_split - 1) / n_split + ATT_TILE - 1) / ATT_TILE * ATT_TILE;
    const int pos = pos0 + t;
    const int first = (window > 0 && pos - window + 1 > 0) ? pos - window + 1 : 0;
    *c0 = first + split * chunk;
    *c1 = min(*c0 + chunk, pos + 1);
}

/* part: [n_tok][n_head][n_split][2 + hd]: m, l, acc[hd]. */
static __global__ void __launch_bounds__(ATT_THREADS)
    attn_split_kernel(const float *q, st_kv_layer kv, int pos0, const int *dpos, int n_tok, int n_head, float scale,
                      int window, int n_split, float *part) {
    __shared__ float qs[ATT_MAX_HD];
    __shared__ float sc[ATT_TILE];
    const int split = blockIdx.x, h = blockIdx.y, t = blockIdx.z;
    const int hd = kv.head_dim, hkv = h / (n_head / kv.n_head_kv), tid = threadIdx.x;
    const int warp = tid / ST_WARP, lane = tid % ST_WARP, n_warps = ATT_THREADS / ST_WARP;
    int c0, c1;
    att_slice(dpos ? *dpos : pos0, n_tok, t, window, n_split, split, &c0, &c1);
    const size_t row = (size_t)kv.n_head_kv * hd, hoff = (size_t)hkv * hd;

    for (int i = tid; i < hd; i += ATT_THREADS) qs[i] = q[((size_t)t * n_head + h) * hd + i];
    __syncthreads();

    float m = -INFINITY, l = 0.0f, acc[ATT_ACC];
#pragma unroll
    for (int j = 0; j < ATT_ACC; j++) acc[j] = 0.0f;

    for (int p0 = c0; p0 < c1; p0 += ATT_TILE) {
        const int nt = min(ATT_TILE, c1 - p0);
        /* scores: a warp per position, lanes across the head dimension */
        for (int j = warp; j < nt; j += n_warps) {
            const size_t p = (size_t)(p0 + j);
            float s = 0.0f;
            for (int i = lane; i < hd; i += ST_WARP)
                s += qs[i] * kv_load(kv.type, kv.k, kv.k_scale, p * row + hoff + i, p * kv.n_head_kv + hkv);
            s = warp_sum(s);
            if (lane == 0) sc[j] = s * scale;
        }
        __syncthreads();
        float tmax = -INFINITY;
        for (int j = 0; j < nt; j++) tmax = fmaxf(tmax, sc[j]);
        const float mn = fmaxf(m, tmax), f = expf(m - mn); /* f = 0 on the first tile (m = -inf) */
        __syncthreads(); /* everyone has read the raw scores */
        if (tid < nt) sc[tid] = expf(sc[tid] - mn);
        __syncthreads();
        float tsum = 0.0f;
        for (int j = 0; j < nt; j++) tsum += sc[j];
        l = l * f + tsum;
#pragma unroll
        for (int a = 0; a < ATT_ACC; a++) {
            const int d = tid + a * ATT_THREADS;
            if (d < hd) {
                float v = acc[a] * f;
                for (int j = 0; j < nt; j++) {
                    const size_t p = (size_t)(p0 + j);
                    v += sc[j] * kv_load(kv.type, kv.v, kv.v_scale, p * row + hoff + d, p * kv.n_head_kv + hkv);
                }
                acc[a] = v;
            }
        }
        m = mn;
        __syncthreads(); /* sc is rewritten by the next tile */
    }
    float *o = part + (((size_t)t * n_head + h) * n_split + split) * (size_t)(hd + 2);
    if (tid == 0) {
        o[0] = m; /* -inf for an empty slice: it weighs nothing in the combine */
        o[1] = l;
    }
#pragma unroll
    for (int a = 0; a < ATT_ACC; a++) {
        const int d = tid + a * ATT_THREADS;
        if (d < hd) o[2 + d] = acc[a];
    }
}

/* The same slices with the query heads of one KV head together (GQA): a
 * block takes one (token, KV head, slice) and all G = n_head / n_head_kv
 * query heads that read that KV head, so each K and V row is loaded once
 * for the G of them instead of G times (8x less cache traffic on a model
 * with 32 query and 4 KV heads). Scores: a warp per position, its lanes
 * across the head dimension, G dot products per loaded K row; V: a thread
 * per dimension, G accumulators each. Same partial layout as
 * attn_split_kernel, so the same combine follows. G <= ATT_GQA_MAX. */
#define ATT_GQA_MAX 8
static __global__ void __launch_bounds__(ATT_THREADS)
    attn_gqa_kernel(const float *q, st_kv_layer kv, int pos0, const int *dpos, int n_tok, int n_head, float scale,
                    int window, int n_split, float *part) {
    extern __shared__ float sm[]; /* qs [G][hd], sc [G][ATT_TILE], the running maxima mf [G], their copy mr [G] */
    const int split = blockIdx.x, hkv = blockIdx.y, t = blockIdx.z;
    const int hd = kv.head_dim, G = n_head / kv.n_head_kv, tid = threadIdx.x;
    const int warp = tid / ST_WARP, lane = tid % ST_WARP, n_warps = ATT_THREADS / ST_WARP;
    float *qs = sm, *sc = sm + (size_t)G * hd, *mf = sc + (size_t)G * ATT_TILE, *mr = mf + G;
    int c0, c1;
    att_slice(dpos ? *dpos : pos0, n_tok, t, window, n_split, split, &c0, &c1);
    const size_t row = (size_t)kv.n_head_kv * hd, hoff = (size_t)hkv * hd;

    for (int i = tid; i < G * hd; i += ATT_THREADS) qs[i] = q[((size_t)t * n_head + (size_t)hkv * G) * hd + i];
    if (tid < G) mr[tid] = -INFINITY;
    __syncthreads();

    float m[ATT_GQA_MAX], l[ATT_GQA_MAX], acc[ATT_GQA_MAX][ATT_ACC];
#pragma unroll
    for (int g = 0; g < ATT_GQA_MAX; g++) {
        m[g] = -INFINITY, l[g] = 0.0f;
#pragma unroll
        for (int a = 0; a < ATT_ACC; a++) acc[g][a] = 0.0f;
    }

    for (int p0 = c0; p0 < c1; p0 += ATT_TILE) {
        const int nt = min(ATT_TILE, c1 - p0);
        for (int j = warp; j < nt; j += n_warps) {
            const size_t p = (size_t)(p0 + j);
            float kr[ATT_MAX_HD / ST_WARP];
#pragma unroll
            for (int i = 0; i < ATT_MAX_HD / ST_WARP; i++) {
                const int d = lane + i * ST_WARP;
                kr[i] = d < hd ? kv_load(kv.type, kv.k, kv.k_scale, p * row + hoff + d, p * kv.n_head_kv + hkv) : 0.0f;
            }
            for (int g = 0; g < G; g++) {
                float s = 0.0f;
#pragma unroll
                for (int i = 0; i < ATT_MAX_HD / ST_WARP; i++) {
                    const int d = lane + i * ST_WARP;
                    if (d < hd) s += qs[g * hd + d] * kr[i];
                }
                s = warp_sum(s);
                if (lane == 0) sc[g * ATT_TILE + j] = s * scale;
            }
        }
        __syncthreads();
        if (tid < G) { /* per head: the new running max (in shared: read below with a run-time head index) */
            float tmax = mr[tid];
            for (int j = 0; j < nt; j++) tmax = fmaxf(tmax, sc[tid * ATT_TILE + j]);
            mf[tid] = mr[tid] = tmax;
        }
        __syncthreads();
        float f[ATT_GQA_MAX];
#pragma unroll
        for (int g = 0; g < ATT_GQA_MAX; g++) {
            if (g < G) {
                f[g] = expf(m[g] - mf[g]); /* 0 on the first tile (m = -inf) */
                m[g] = mf[g];
            }
        }
        for (int i = tid; i < G * nt; i += ATT_THREADS) {
            const int g = i / nt, j = i % nt;
            sc[g * ATT_TILE + j] = expf(sc[g * ATT_TILE + j] - mf[g]);
        }
        __syncthreads();
#pragma unroll
        for (int g = 0; g < ATT_GQA_MAX; g++) {
            if (g < G) {
                float tsum = 0.0f;
                for (int j = 0; j < nt; j++) tsum += sc[g * ATT_TILE + j];
                l[g] = l[g] * f[g] + tsum;
#pragma unroll
                for (int a = 0; a < ATT_ACC; a++) acc[g][a] *= f[g];
            }
        }
#pragma unroll
        for (int a = 0; a < ATT_ACC; a++) {
            const int d = tid + a * ATT_THREADS;
            if (d < hd) {
                for (int j = 0; j < nt; j++) {
                    const size_t p = (size_t)(p0 + j);
                    const float v = kv_load(kv.type, kv.v, kv.v_scale, p * row + hoff + d, p * kv.n_head_kv + hkv);
#pragma unroll
                    for (int g = 0; g < ATT_GQA_MAX; g++)
                        if (g < G) acc[g][a] += sc[g * ATT_TILE + j] * v;
                }
            }
        }
        __syncthreads(); /* sc is rewritten by the next tile */
    }
#pragma unroll
    for (int g = 0; g < ATT_GQA_MAX; g++) { /* unrolled: the arrays stay in registers */
        if (g < G) {
            float *o = part + (((size_t)t * n_head + (size_t)hkv * G + g) * n_split + split) * (size_t)(hd + 2);
            if (tid == 0) {
                o[0] = m[g]; /* -inf for an empty slice: it weighs nothing in the combine */
                o[1] = l[g];
            }
#pragma unroll
            for (int a = 0; a < ATT_ACC; a++) {
                const int d = tid + a * ATT_THREADS;
                if (d < hd) o[2 + d] = acc[g][a];
            }
        }
    }
}

/* 0 split (per query head), 1 gqa, 2 tc (gqa, and tensor cores for
 * prompts); -1: from STRATA_CUDA_ATTN at first use */
static int g_attn_mode = -1;

extern "C" int backend_cuda_set_attn_kernel(int mode) {
    const int old = g_attn_mode;
    g_attn_mode = mode;
    return old;
}

/* Prompt chunks of at least this many tokens may take the tensor-core kernel. */
#define ATT_TC_MIN_TOK 16

static __global__ void attn_combine_kernel(const float *part, int n_head, int hd, int n_split, float *out) {
    const int h = blockIdx.x, t = blockIdx.y;
    const float *pp = part + ((size_t)t * n_head + h) * n_split * (size_t)(hd + 2);
    float M = -INFINITY;
    for (int s = 0; s < n_split; s++) M = fmaxf(M, pp[(size_t)s * (hd + 2)]);
    float L = 0.0f;
    for (int s = 0; s < n_split; s++) {
        const float ms = pp[(size_t)s * (hd + 2)];
        if (ms != -INFINITY) L += expf(ms - M) * pp[(size_t)s * (hd + 2) + 1];
    }
    for (int d = threadIdx.x; d < hd; d += blockDim.x) {
        float v = 0.0f;
        for (int s = 0; s < n_split; s++) {
            const float ms = pp[(size_t)s * (hd + 2)];
            if (ms != -INFINITY) v += expf(ms - M) * pp[(size_t)s * (hd + 2) + 2 + d];
        }
        out[((size_t)t * n_head + h) * hd + d] = v / L;
    }
}

void cuda_attention(const float *q, const st_kv_layer *kv, int n_tok, int pos0, const int *dpos, int n_head,
                    float scale, int window, float *out, cuda_scratch *scratch, int n_sm, int cc_major,
                    cudaStream_t s) {
    ST_ASSERT(kv->head_dim <= ATT_MAX_HD && n_head % kv->n_head_kv == 0);
    if (n_tok <= 0) return;
    if (g_attn_mode < 0) {
        const char *v = st_switch_get("STRATA_CUDA_ATTN");
        g_attn_mode = !v ? 0 : !strcmp(v, "tc") ? 2 : !strcmp(v, "gqa") ? 1 : 0;
    }
    if (g_attn_mode == 2 && !dpos && n_tok >= ATT_TC_MIN_TOK &&
        cuda_attention_tc(q, kv, n_tok, pos0, n_head, scale, window, out, cc_major, s) == 0)
        return;
    /* the longest visible span of any token in the chunk (the last one sees
     * the most); a recorded step must fit any position: the whole cache */
    int span = dpos ? kv->n_ctx : pos0 + n_tok;
    if (window > 0 && span > window) span = window;
    /* enough slices to give the chip ~4 blocks per multiprocessor, none shorter than a tile */
    int pairs = n_tok * n_head, want = (4 * n_sm + pairs - 1) / pairs;
    int max_split = (span + ATT_TILE - 1) / ATT_TILE;
    int n_split = want < 1 ? 1 : want > max_split ? max_split : want;
    if (!dpos) { /* no slice left empty */
        const int chunk = ((span + n_split - 1) / n_split + ATT_TILE - 1) / ATT_TILE * ATT_TILE;
        n_split = (span + chunk - 1) / chunk;
    }
    size_t bytes = (size_t)pairs * n_split * (size_t)(kv->head_dim + 2) * sizeof(float);
    float *part = (float *)cuda_scratch_reserve(scratch, bytes);
    const int G = n_head / kv->n_head_kv;
    if (g_attn_mode >= 1 && G <= ATT_GQA_MAX) {
        /* the same slices as the per-head kernel, so the same partials and combine */
        const size_t smem = ((size_t)G * kv->head_dim + (size_t)G * ATT_TILE + 2 * (size_t)G) * sizeof(float);
        attn_gqa_kernel<<<dim3((unsigned)n_split, (unsigned)kv->n_head_kv, (unsigned)n_tok), ATT_THREADS, smem, s>>>(
            q, *kv, pos0, dpos, n_tok, n_head, scale, window, n_split, part);
    } else {
        attn_split_kernel<<<dim3((unsigned)n_split, (unsigned)n_head, (unsigned)n_tok), ATT_THREADS, 0, s>>>(
            q, *kv, pos0, dpos, n_tok, n_head, scale, window, n_split, part);
    }
    CUDA_LAUNCH_CHECK();
    int th = kv->head_dim >= 256 ? 256 : kv->head_dim >= 128 ? 128 : 64;
    attn_combine_kernel<<<dim3((unsigned)n_head, (unsigned)n_tok), th, 0, s>>>(part, n_head, kv->head_dim, n_split,
                                                                             out);
    CUDA_LAUNCH_CHECK();
}
