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
#include "backend/cuda/attention.cuh"
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

/* Attention over the latent row (deepseek2's absorbed form: one KV head of
 * 576 values that is also its own value row, 128 query heads on it). The
 * per-head kernel (attention.cu) reads the whole row of every position once
 * per head; here a block takes LAT_GH heads of one token and one slice of
 * its positions, so each row is read once for LAT_GH heads. Per tile of
 * LAT_TILE positions:
 *  - scores: thread (position j, half hh) dots the row of j (16-byte f16 or
 *    8-byte int8 loads) with LAT_GH / 2 queries held in shared memory;
 *  - online softmax per head: warp w takes heads 2w, 2w+1, two positions
 *    per lane; an int8 row's scale is folded into its weights;
 *  - values: thread d takes the dimension pairs d, d + 128, d + 256 of every
 *    position of the tile, LAT_GH accumulators each.
 * Output: the partials (m, l, acc[hd]) per (token, head, slice) that
 * attention.cu's combine kernel merges, in its layout. */
#define LAT_GH      CUDA_ATT_LATENT_HEADS
#define LAT_TILE    64
#define LAT_THREADS 128
#define LAT_PAIRS   3 /* dimension pairs per thread: heads up to 2 * 3 * 128 = 768 wide */

static __device__ __forceinline__ void lat_f16x8(const uint4 &w, float (&f)[8]) {
    const uint32_t u[4] = {w.x, w.y, w.z, w.w};
#pragma unroll
    for (int j = 0; j < 4; j++) {
        const float2 h = __half22float2(*(const __half2 *)&u[j]);
        f[2 * j] = h.x, f[2 * j + 1] = h.y;
    }
}

static __global__ void __launch_bounds__(LAT_THREADS)
    attn_latent_kernel(const float *q, st_kv_layer kv, int pos0, const int *dpos, int n_tok, int n_head, float scale,
                       int window, int n_split, float *part) {
    pdl_enter();                  /* first: see st_launch (common.cuh) */
    extern __shared__ float sm[]; /* qs [LAT_GH][hd], sc [LAT_GH][LAT_TILE], m, l, f [LAT_GH] */
    const int hd = kv.head_dim, split = blockIdx.x, h0 = blockIdx.y * LAT_GH, t = blockIdx.z, tid = threadIdx.x;
    float *qs = sm, *sc = qs + LAT_GH * hd, *mrow = sc + LAT_GH * LAT_TILE;
    float *lrow = mrow + LAT_GH, *frow = lrow + LAT_GH;
    int c0, c1; /* this slice's positions */
    att_slice(dpos ? *dpos : pos0, n_tok, t, window, n_split, split, LAT_TILE, &c0, &c1);
    const int n_h = min(LAT_GH, n_head - h0); /* the last block's heads past n_head: zeros, never written */
    for (int i = tid; i < LAT_GH * hd; i += LAT_THREADS)
        qs[i] = i < n_h * hd ? q[((size_t)t * n_head + h0) * hd + i] : 0.0f;
    if (tid < LAT_GH) mrow[tid] = -INFINITY, lrow[tid] = 0.0f;
    __syncthreads();
    const int i8 = kv.type == ST_KV_INT8, pairs = hd / 2, j = tid % LAT_TILE, hh = tid / LAT_TILE;
    const int warp = tid / 32, lane = tid % 32;
    constexpr int GS = LAT_GH / 2; /* heads per scoring thread */
    float acc[LAT_GH][LAT_PAIRS][2];
#pragma unroll
    for (int g = 0; g < LAT_GH; g++)
#pragma unroll
        for (int i = 0; i < LAT_PAIRS; i++) acc[g][i][0] = acc[g][i][1] = 0.0f;

    for (int p0 = c0; p0 < c1; p0 += LAT_TILE) {
        const int nt = min(LAT_TILE, c1 - p0);
        float s[GS];
#pragma unroll
        for (int g = 0; g < GS; g++) s[g] = 0.0f;
        if (j < nt) {
            const size_t p = (size_t)(p0 + j);
            for (int c = 0; c < hd / 8; c++) {
                float kf[8];
                if (!i8) {
                    lat_f16x8(((const uint4 *)((const uint16_t *)kv.k + p * hd))[c], kf);
                } else {
                    const uint2 w = ((const uint2 *)((const int8_t *)kv.k + p * hd))[c];
#pragma unroll
                    for (int b = 0; b < 4; b++)
                        kf[b] = (float)(int8_t)(w.x >> (8 * b)), kf[4 + b] = (float)(int8_t)(w.y >> (8 * b));
                }
#pragma unroll
                for (int g = 0; g < GS; g++) {
                    const float *qg = qs + (size_t)(hh * GS + g) * hd + 8 * c;
#pragma unroll
                    for (int b = 0; b < 8; b++) s[g] = fmaf(qg[b], kf[b], s[g]);
                }
            }
            const float ks = i8 ? kv.k_scale[p] : 1.0f;
#pragma unroll
            for (int g = 0; g < GS; g++) s[g] *= ks * scale;
        }
#pragma unroll
        for (int g = 0; g < GS; g++) sc[(hh * GS + g) * LAT_TILE + j] = j < nt ? s[g] : -INFINITY;
        __syncthreads();
        /* the tile's softmax, two heads per warp, two positions per lane */
#pragma unroll
        for (int gi = 0; gi < LAT_GH / 4; gi++) {
            const int g = warp * (LAT_GH / 4) + gi;
            float *sg = sc + g * LAT_TILE;
            const float a = sg[lane], b = sg[lane + 32];
            const float mo = mrow[g], mn = fmaxf(mo, warp_max(fmaxf(a, b))); /* finite: a tile holds a position */
            const float ea = lane < nt ? expf(a - mn) : 0.0f, eb = lane + 32 < nt ? expf(b - mn) : 0.0f;
            const float va = i8 && lane < nt ? kv.v_scale[p0 + lane] : 1.0f;
            const float vb = i8 && lane + 32 < nt ? kv.v_scale[p0 + lane + 32] : 1.0f;
            sg[lane] = ea * va, sg[lane + 32] = eb * vb;
            const float sum = warp_sum(ea + eb);
            if (lane == 0) {
                const float f = expf(mo - mn); /* 0 on the first tile (mo = -inf) */
                frow[g] = f, lrow[g] = lrow[g] * f + sum, mrow[g] = mn;
            }
        }
        __syncthreads();
#pragma unroll
        for (int g = 0; g < LAT_GH; g++) {
            const float f = frow[g];
#pragma unroll
            for (int i = 0; i < LAT_PAIRS; i++) acc[g][i][0] *= f, acc[g][i][1] *= f;
        }
        for (int jj = 0; jj < nt; jj++) {
            const size_t row = (size_t)(p0 + jj) * hd;
            float2 v[LAT_PAIRS];
#pragma unroll
            for (int i = 0; i < LAT_PAIRS; i++) {
                const int dp = tid + LAT_THREADS * i;
                v[i] = make_float2(0.0f, 0.0f);
                if (dp < pairs) {
                    if (!i8) {
                        v[i] = __half22float2(*(const __half2 *)((const uint16_t *)kv.v + row + 2 * dp));
                    } else {
                        const char2 c = *(const char2 *)((const int8_t *)kv.v + row + 2 * dp);
                        v[i] = make_float2((float)c.x, (float)c.y);
                    }
                }
            }
#pragma unroll
            for (int g = 0; g < LAT_GH; g++) {
                const float w = sc[g * LAT_TILE + jj];
#pragma unroll
                for (int i = 0; i < LAT_PAIRS; i++) {
                    acc[g][i][0] = fmaf(w, v[i].x, acc[g][i][0]);
                    acc[g][i][1] = fmaf(w, v[i].y, acc[g][i][1]);
                }
            }
        }
        __syncthreads(); /* sc, m, l, f are rewritten by the next tile */
    }
#pragma unroll
    for (int g = 0; g < LAT_GH; g++) {
        if (g >= n_h) break;
        float *o = part + (((size_t)t * n_head + h0 + g) * n_split + split) * (size_t)(hd + 2);
        if (tid == 0) o[0] = mrow[g], o[1] = lrow[g]; /* m = -inf for an empty slice: it weighs nothing */
#pragma unroll
        for (int i = 0; i < LAT_PAIRS; i++) {
            const int dp = tid + LAT_THREADS * i;
            if (dp < pairs) o[2 + 2 * dp] = acc[g][i][0], o[3 + 2 * dp] = acc[g][i][1];
        }
    }
}

int cuda_attn_latent_fits(int n_head, const st_kv_layer *kv) {
    return kv->n_head_kv == 1 && kv->head_dim > 256 && kv->head_dim % 8 == 0 &&
           kv->head_dim <= 2 * LAT_PAIRS * LAT_THREADS && n_head >= 1;
}

int cuda_attn_latent_tile(void) { return LAT_TILE; }

void cuda_attn_latent(const float *q, const st_kv_layer *kv, int n_tok, int pos0, const int *dpos, int n_head,
                      float scale, int window, int n_split, float *part, cudaStream_t s) {
    ST_ASSERT(cuda_attn_latent_fits(n_head, kv));
    const size_t smem = ((size_t)LAT_GH * kv->head_dim + (size_t)LAT_GH * LAT_TILE + 3 * LAT_GH) * sizeof(float);
    st_launch(attn_latent_kernel, dim3((unsigned)n_split, (unsigned)((n_head + LAT_GH - 1) / LAT_GH), (unsigned)n_tok),
              dim3(LAT_THREADS), smem, s, q, *kv, pos0, dpos, n_tok, n_head, scale, window, n_split, part);
}
