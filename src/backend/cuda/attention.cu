/* Causal attention over the KV cache (backend.h's attention op).
 *
 * One kernel for decode and prompt: a block takes one (token, head) and one
 * slice of the positions that token sees, and runs an online softmax over
 * tiles of 64 positions (running max m, running sum l, unnormalised output
 * acc). A second kernel combines the slices of each (token, head):
 *   M = max m_s,  out = sum_s exp(m_s - M) acc_s / sum_s exp(m_s - M) l_s.
 * Decode has few (token, head) pairs, so long contexts are split into many
 * slices to fill the multiprocessors; a prompt chunk has enough pairs and
 * mostly runs one slice each.
 *
 * Default kernels (STRATA_CUDA_ATTN=tc): prompt chunks of 16+ tokens on
 * tensor cores (attention_tc.cu); the rest over spans past CUDA_ATT_SHORT_SPAN
 * with the query heads of one KV head in one block (K/V read once per KV
 * head): on tensor cores (attention_tc.cu's decode kernel) where it fits,
 * else attn_gqa_kernel; over shorter spans with attn_split_kernel (a block
 * per query head: more blocks), which also takes the shapes the grouped
 * kernels do not (more than 16 heads per KV head, other head sizes).
 * STRATA_CUDA_ATTN=gqa uses the GQA kernel for every span and for prompts,
 * =head the per-head kernel for everything (comparisons); each backend reads
 * it once and passes its choice (mode), so two cards may differ.
 *
 * Sinks (gpt-oss, cuda_attention_sinks): one more logit per head with no
 * value. Only the end of each path sees them: the combine counts
 * exp(sink - M) in the denominator (M taken over the slices and the sink),
 * and the tensor-core kernel does the same with its row's m and l; the
 * slices themselves are unchanged.
 */
#include "backend/cuda/attention.cuh"
#include "backend/cuda/common.cuh"
#include "backend/cuda/ops.h"

#define ATT_THREADS 128
#define ATT_TILE    64
#define ATT_MAX_HD  640 /* multi-head latent attention's 576 (per-head kernel) */
#define ATT_ACC     (ATT_MAX_HD / ATT_THREADS)
static_assert(ATT_THREADS == 2 * ATT_TILE, "attn_split_kernel: two threads per position of a tile");

static __device__ __forceinline__ float kv_load(int type, const void *base, const float *scales, size_t idx,
                                                size_t srow) {
    if (type == ST_KV_F16) return __half2float(__ushort_as_half(((const uint16_t *)base)[idx]));
    return scales[srow] * (float)((const int8_t *)base)[idx];
}

/* Dot of 8 cached values (16 bytes of f16 / 8 of int8) with 8 query floats in shared memory. */
static __device__ __forceinline__ float att_dot8_f16(uint4 w, const float *q) {
    const uint32_t u[4] = {w.x, w.y, w.z, w.w};
    float s = 0.0f;
#pragma unroll
    for (int i = 0; i < 4; i++) {
        const float2 f = __half22float2(*(const __half2 *)&u[i]);
        s = fmaf(f.x, q[2 * i], fmaf(f.y, q[2 * i + 1], s));
    }
    return s;
}

static __device__ __forceinline__ float att_dot8_i8(uint2 w, const float *q) {
    const uint32_t u[2] = {w.x, w.y};
    float s = 0.0f;
#pragma unroll
    for (int i = 0; i < 8; i++) s = fmaf((float)(int8_t)(u[i >> 2] >> (8 * (i & 3))), q[i], s);
    return s;
}

/* part: [n_tok][n_head][n_split][2 + hd]: m, l, acc[hd]. With cuda_seq_rows
 * each row t is one token of a sequence of its own (cache and position). */
template <class R>
static __global__ void __launch_bounds__(ATT_THREADS, 8)
    attn_split_kernel(const float *q, st_kv_layer kv, int pos0, const int *dpos, int n_tok, int n_head, float scale,
                      int window, int n_split, float *part, const __grid_constant__ R rows) {
    pdl_enter(); /* first: see st_launch (common.cuh) */
    __shared__ float qs[ATT_MAX_HD];
    __shared__ float sc[ATT_TILE];
    const int split = blockIdx.x, h = blockIdx.y, t = blockIdx.z;
    const int hd = kv.head_dim, hkv = h / (n_head / kv.n_head_kv), tid = threadIdx.x;
    const int warp = tid / ST_WARP, lane = tid % ST_WARP, n_warps = ATT_THREADS / ST_WARP;
    int c0, c1;
    if (rows.at(t, &kv, &pos0)) att_slice(pos0, 1, 0, window, n_split, split, ATT_TILE, &c0, &c1);
    else att_slice(dpos ? *dpos : pos0, n_tok, t, window, n_split, split, ATT_TILE, &c0, &c1);
    const size_t row = (size_t)kv.n_head_kv * hd, hoff = (size_t)hkv * hd;

    for (int i = tid; i < hd; i += ATT_THREADS) qs[i] = q[((size_t)t * n_head + h) * hd + i];
    __syncthreads();

    float m = -INFINITY, l = 0.0f, acc[ATT_ACC];
#pragma unroll
    for (int j = 0; j < ATT_ACC; j++) acc[j] = 0.0f;

    /* scores: two threads per position (ATT_THREADS = 2 * ATT_TILE), each
     * dotting half the head with 8-value loads, all in flight at once;
     * heads not a multiple of 16 wide: a warp per position */
    const int pj = tid >> 1, hh = hd / 2, d0 = (tid & 1) * hh, wide = hd % 16 == 0;
    for (int p0 = c0; p0 < c1; p0 += ATT_TILE) {
        const int nt = min(ATT_TILE, c1 - p0);
        if (wide) {
            float s = 0.0f;
            if (pj < nt) {
                const size_t p = (size_t)(p0 + pj), at = p * row + hoff + d0;
                if (kv.type == ST_KV_F16) {
                    const uint4 *kp = (const uint4 *)((const uint16_t *)kv.k + at);
#pragma unroll 4
                    for (int i = 0; i < hh / 8; i++) s += att_dot8_f16(kp[i], qs + d0 + 8 * i);
                } else {
                    const uint2 *kp = (const uint2 *)((const int8_t *)kv.k + at);
#pragma unroll 4
                    for (int i = 0; i < hh / 8; i++) s += att_dot8_i8(kp[i], qs + d0 + 8 * i);
                    s *= kv.k_scale[p * kv.n_head_kv + hkv];
                }
            }
            s += __shfl_xor_sync(ST_FULL_MASK, s, 1);
            if (!(tid & 1) && pj < nt) sc[pj] = s * scale;
        } else {
            for (int j = warp; j < nt; j += n_warps) {
                const size_t p = (size_t)(p0 + j);
                float s = 0.0f;
                for (int i = lane; i < hd; i += ST_WARP)
                    s += qs[i] * kv_load(kv.type, kv.k, kv.k_scale, p * row + hoff + i, p * kv.n_head_kv + hkv);
                s = warp_sum(s);
                if (lane == 0) sc[j] = s * scale;
            }
        }
        __syncthreads();
        /* every warp reduces the tile's scores itself: no shared round trip */
        float tmax = -INFINITY;
        for (int j = lane; j < nt; j += ST_WARP) tmax = fmaxf(tmax, sc[j]);
        tmax = warp_max(tmax);
        const float mn = fmaxf(m, tmax), f = expf(m - mn); /* f = 0 on the first tile (m = -inf) */
        __syncthreads();                                   /* everyone has read the raw scores */
        if (tid < nt) sc[tid] = expf(sc[tid] - mn);
        __syncthreads();
        float tsum = 0.0f;
        for (int j = lane; j < nt; j += ST_WARP) tsum += sc[j];
        l = l * f + warp_sum(tsum);
        /* values: a thread per dimension, the tile's rows in flight 8 at a time */
        const size_t vs = (size_t)p0 * kv.n_head_kv + hkv;
#pragma unroll
        for (int a = 0; a < ATT_ACC; a++) {
            const int d = tid + a * ATT_THREADS;
            if (d < hd) {
                float v = acc[a] * f;
                const size_t at = (size_t)p0 * row + hoff + d;
                if (kv.type == ST_KV_F16) {
                    const uint16_t *vp = (const uint16_t *)kv.v + at;
#pragma unroll 8
                    for (int j = 0; j < nt; j++) v += sc[j] * __half2float(__ushort_as_half(vp[j * row]));
                } else {
                    const int8_t *vp = (const int8_t *)kv.v + at;
#pragma unroll 8
                    for (int j = 0; j < nt; j++) v += sc[j] * kv.v_scale[vs + j * kv.n_head_kv] * (float)vp[j * row];
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

/* The same computation with the query heads of one KV head together (GQA),
 * the decode kernel: a block takes one (token, KV head, slice) and all G =
 * n_head / n_head_kv query heads that read that KV head, so each K and V row
 * is read once for the G of them. Tiles of GQA_TILE positions:
 *  - scores: a thread per position, its whole K row read with 16-byte
 *    (f16) or 8-byte (int8) loads and dotted with the G queries (in shared
 *    memory, read as broadcasts): no shuffles per position;
 *  - softmax: per head, block max and sum (warp shuffles, then 4 warps);
 *    an int8 V scale is folded into the weights there;
 *  - V: a thread per four dimensions and a share of the tile's positions
 *    (hd / 4 * PS = 128 threads), 8 positions' loads in flight, G x 4
 *    accumulators each, the shares summed through shared memory at the end.
 * The K and V rows of a tile are asked into L2 (gqa_prefetch) before the
 * tile is needed. With both (and pairs of dimensions before), on an H200 at
 * 16K positions (30B-A3B synth, 8 heads per KV head): 31.9 -> 30.8 us a
 * layer (f16), 34.3 -> 33.0 us (int8). The kernel is bound by issue, not
 * memory (1.1 TB/s, 42% of cycles with a warp eligible): past the short
 * span the tensor-core decode kernel takes its shapes where it fits. Slices
 * are whole tiles; the partial layout and the combine are those of
 * attn_split_kernel. GM: the most heads per KV head the instance holds. */
#define GQA_TILE    128
#define GQA_THREADS 128
/* Shared floats per query head: qs [hd] then sc [GQA_SC - hd] (at least a
 * tile), reused at the end for the position shares' sums [PS][hd], PS =
 * 4 * GQA_THREADS / hd; then red [8]. */
#define GQA_SC (4 * GQA_THREADS)

/* L2 prefetch of one position's K and V rows of a head (row_bytes each);
 * nothing on HIP. */
static __device__ __forceinline__ void gqa_prefetch(const char *k, const char *v, int row_bytes) {
#if defined(__CUDA_ARCH__) && !defined(STRATA_HIP)
    for (int b = 0; b < row_bytes; b += 128) {
        asm volatile("prefetch.global.L2 [%0];" ::"l"(k + b));
        asm volatile("prefetch.global.L2 [%0];" ::"l"(v + b));
    }
#else
    (void)k, (void)v, (void)row_bytes;
#endif
}

/* The dot products of one K row (8 values per 16-byte f16 or 8-byte int8
 * load) with the G queries; the loads of a whole batch of 8 are issued
 * before any is used, so one block waits for memory HD / 64 times per tile
 * instead of once per 8 values (a few blocks must keep many loads in
 * flight: at short contexts there are few of them). */
template <int GM, int HD, typename L>
static __device__ __forceinline__ void gqa_scores(const L *kr, const float *qs, int G, float (&s)[GM]) {
    constexpr int NC = HD / 8, B = NC < 8 ? NC : 8;
#pragma unroll
    for (int c0 = 0; c0 < NC; c0 += B) {
        L w[B];
#pragma unroll
        for (int i = 0; i < B; i++) w[i] = kr[c0 + i];
#pragma unroll
        for (int i = 0; i < B; i++) {
            float kf[8];
            if constexpr (sizeof(L) == 16) { /* f16 */
                const uint32_t u[4] = {((const uint4 &)w[i]).x, ((const uint4 &)w[i]).y, ((const uint4 &)w[i]).z,
                                       ((const uint4 &)w[i]).w};
#pragma unroll
                for (int j = 0; j < 4; j++) {
                    const float2 f = __half22float2(*(const __half2 *)&u[j]);
                    kf[2 * j] = f.x, kf[2 * j + 1] = f.y;
                }
            } else { /* int8 */
#pragma unroll
                for (int j = 0; j < 4; j++) {
                    kf[j] = (float)(int8_t)(((const uint2 &)w[i]).x >> (8 * j));
                    kf[4 + j] = (float)(int8_t)(((const uint2 &)w[i]).y >> (8 * j));
                }
            }
#pragma unroll
            for (int g = 0; g < GM; g++) {
                if (g < G) {
                    const float *qg = qs + (size_t)g * HD + 8 * (c0 + i);
#pragma unroll
                    for (int j = 0; j < 8; j++) s[g] = fmaf(qg[j], kf[j], s[g]);
                }
            }
        }
    }
}

template <int GM, int HD>
static __global__ void __launch_bounds__(GQA_THREADS, GM > 8 ? 3 : 4)
    attn_gqa_kernel(const float *q, st_kv_layer kv, int pos0, const int *dpos, int n_tok, int n_head, float scale,
                    int window, int n_split, float *part) {
    pdl_enter();                  /* first: see st_launch (common.cuh) */
    extern __shared__ float sm[]; /* qs [G][hd], sc [G][GQA_SC - hd], red [2][4][G] (GQA_SC) */
    const int split = blockIdx.x, hkv = blockIdx.y, t = blockIdx.z;
    constexpr int hd = HD;
    static_assert(GQA_SC - HD >= GQA_TILE, "sc holds a tile of weights per head");
    const int G = n_head / kv.n_head_kv, tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
    float *qs = sm, *sc = qs + (size_t)G * hd, *red = qs + (size_t)G * GQA_SC;
    int c0, c1;
    att_slice(dpos ? *dpos : pos0, n_tok, t, window, n_split, split, GQA_TILE, &c0, &c1);
    if (c0 >= c1) { /* an empty slice (a recorded step sized for the whole cache): m = -inf weighs nothing */
        if (tid < G) {
            float *o = part + (((size_t)t * n_head + (size_t)hkv * G + tid) * n_split + split) * (size_t)(hd + 2);
            o[0] = -INFINITY, o[1] = 0.0f;
        }
        return;
    }
    const size_t row = (size_t)kv.n_head_kv * hd, hoff = (size_t)hkv * hd;
    const int i8 = kv.type == ST_KV_INT8, esz = i8 ? 1 : 2;
    const char *kb = (const char *)kv.k + hoff * esz, *vb = (const char *)kv.v + hoff * esz;
    if (c0 + tid < c1) gqa_prefetch(kb + (c0 + tid) * row * esz, vb + (c0 + tid) * row * esz, hd * esz);

    for (int i = tid; i < G * hd; i += GQA_THREADS) qs[i] = q[((size_t)t * n_head + (size_t)hkv * G) * hd + i];
    __syncthreads();

    /* V work split: thread = (four dimensions dq, position share ps) */
    constexpr int quads = HD / 4, PS = GQA_THREADS / quads;
    const int dq = tid % quads, ps = tid / quads;
    float m[GM], l[GM], acc[GM][4];
#pragma unroll
    for (int g = 0; g < GM; g++) {
        m[g] = -INFINITY, l[g] = 0.0f;
#pragma unroll
        for (int c = 0; c < 4; c++) acc[g][c] = 0.0f;
    }

    for (int p0 = c0; p0 < c1; p0 += GQA_TILE) {
        const int nt = min(GQA_TILE, c1 - p0);
        const size_t pn = (size_t)(p0 + GQA_TILE + tid); /* the next tile's rows, while this one runs */
        if (pn < (size_t)c1) gqa_prefetch(kb + pn * row * esz, vb + pn * row * esz, hd * esz);
        /* scores of position p0 + tid for the G heads */
        float s[GM];
#pragma unroll
        for (int g = 0; g < GM; g++) s[g] = -INFINITY;
        if (tid < nt) {
            const size_t p = (size_t)(p0 + tid);
#pragma unroll
            for (int g = 0; g < GM; g++) s[g] = 0.0f;
            if (!i8) {
                gqa_scores<GM, HD>((const uint4 *)((const uint16_t *)kv.k + p * row + hoff), qs, G, s);
            } else {
                gqa_scores<GM, HD>((const uint2 *)((const int8_t *)kv.k + p * row + hoff), qs, G, s);
                const float ks = kv.k_scale[p * kv.n_head_kv + hkv];
#pragma unroll
                for (int g = 0; g < GM; g++) s[g] *= ks;
            }
#pragma unroll
            for (int g = 0; g < GM; g++) s[g] *= scale;
        }
        /* per head: the tile's max, the new running max, the weights and their sum */
#pragma unroll
        for (int g = 0; g < GM; g++) {
            if (g < G) {
                const float wm = warp_max(s[g]);
                if (lane == 0) red[warp * G + g] = wm;
            }
        }
        __syncthreads();
        const float vs = (i8 && tid < nt) ? kv.v_scale[(size_t)(p0 + tid) * kv.n_head_kv + hkv] : 1.0f;
        float f[GM];
#pragma unroll
        for (int g = 0; g < GM; g++) {
            if (g < G) {
                float tm = red[g];
#pragma unroll
                for (int w = 1; w < GQA_THREADS / 32; w++) tm = fmaxf(tm, red[w * G + g]);
                const float mn = fmaxf(m[g], tm);
                f[g] = expf(m[g] - mn); /* 0 on the first tile (m = -inf) */
                m[g] = mn;
                const float pr = tid < nt ? expf(s[g] - mn) : 0.0f;
                sc[g * GQA_TILE + tid] = pr * vs;
                const float ws = warp_sum(pr);
                if (lane == 0) red[(GQA_THREADS / 32 + warp) * G + g] = ws;
            }
        }
        __syncthreads();
#pragma unroll
        for (int g = 0; g < GM; g++) {
            if (g < G) {
                float ts = 0.0f;
#pragma unroll
                for (int w = 0; w < GQA_THREADS / 32; w++) ts += red[(GQA_THREADS / 32 + w) * G + g];
                l[g] = l[g] * f[g] + ts;
#pragma unroll
                for (int c = 0; c < 4; c++) acc[g][c] *= f[g];
            }
        }
        /* V: this thread's four dimensions over its share of the positions */
        for (int j0 = ps; j0 < nt; j0 += 8 * PS) { /* 8 positions' loads in flight at once */
            uint2 vv[8];                           /* 4 f16 values, or 4 int8 in .x */
#pragma unroll
            for (int u = 0; u < 8; u++) {
                const int j = j0 + u * PS;
                vv[u] = make_uint2(0u, 0u);
                if (j < nt) {
                    const size_t o = (size_t)(p0 + j) * row + hoff + 4 * dq;
                    if (!i8) vv[u] = *(const uint2 *)((const uint16_t *)kv.v + o);
                    else vv[u].x = *(const uint32_t *)((const int8_t *)kv.v + o);
                }
            }
#pragma unroll
            for (int u = 0; u < 8; u++) {
                const int j = j0 + u * PS;
                if (j < nt) {
                    float vf[4];
                    if (!i8) {
                        const float2 a = __half22float2(*(const __half2 *)&vv[u].x);
                        const float2 b = __half22float2(*(const __half2 *)&vv[u].y);
                        vf[0] = a.x, vf[1] = a.y, vf[2] = b.x, vf[3] = b.y;
                    } else {
#pragma unroll
                        for (int c = 0; c < 4; c++) vf[c] = (float)(int8_t)(vv[u].x >> (8 * c));
                    }
#pragma unroll
                    for (int g = 0; g < GM; g++) {
                        if (g < G) {
                            const float w = sc[g * GQA_TILE + j];
#pragma unroll
                            for (int c = 0; c < 4; c++) acc[g][c] = fmaf(w, vf[c], acc[g][c]);
                        }
                    }
                }
            }
        }
        __syncthreads(); /* sc and red are rewritten by the next tile */
    }
    /* the position shares' sums through shared memory (qs and sc are free now): [PS][G][hd] */
    float *sum = qs;
#pragma unroll
    for (int g = 0; g < GM; g++) {
        if (g < G) {
#pragma unroll
            for (int c = 0; c < 4; c++) sum[((size_t)ps * G + g) * hd + 4 * dq + c] = acc[g][c];
        }
    }
    __syncthreads();
    for (int i = tid; i < G * hd; i += GQA_THREADS) {
        const int g = i / hd, d = i % hd;
        float v = 0.0f;
        for (int r = 0; r < PS; r++) v += sum[((size_t)r * G + g) * hd + d];
        float *o = part + (((size_t)t * n_head + (size_t)hkv * G + g) * n_split + split) * (size_t)(hd + 2);
        o[2 + d] = v;
    }
#pragma unroll
    for (int g = 0; g < GM; g++) {
        if (g < G && tid == 0) {
            float *o = part + (((size_t)t * n_head + (size_t)hkv * G + g) * n_split + split) * (size_t)(hd + 2);
            o[0] = m[g]; /* -inf for an empty slice: it weighs nothing in the combine */
            o[1] = l[g];
        }
    }
}

/* Whether the GQA kernel takes this shape: G heads per KV head up to 16,
 * head sizes whose dimension pairs divide its 128 threads (64, 128, 256). */
static int gqa_fits(int G, int hd) { return G >= 1 && G <= 16 && (hd == 64 || hd == 128 || hd == 256); }

template <int HD>
static void gqa_launch_hd(int G, dim3 grid, size_t smem, cudaStream_t s, const float *q, const st_kv_layer *kv,
                          int pos0, const int *dpos, int n_tok, int n_head, float scale, int window, int n_split,
                          float *part) {
#define GQA_L(GM)                                                                                                      \
    st_launch(attn_gqa_kernel<GM, HD>, grid, dim3(GQA_THREADS), smem, s, q, *kv, pos0, dpos, n_tok, n_head, scale,     \
              window, n_split, part)
    if (G <= 1) GQA_L(1);
    else if (G <= 2) GQA_L(2);
    else if (G <= 4) GQA_L(4);
    else if (G <= 8) GQA_L(8);
    else GQA_L(16);
#undef GQA_L
}

static void gqa_launch(int G, dim3 grid, size_t smem, cudaStream_t s, const float *q, const st_kv_layer *kv, int pos0,
                       const int *dpos, int n_tok, int n_head, float scale, int window, int n_split, float *part) {
    if (kv->head_dim == 64)
        gqa_launch_hd<64>(G, grid, smem, s, q, kv, pos0, dpos, n_tok, n_head, scale, window, n_split, part);
    else if (kv->head_dim == 128)
        gqa_launch_hd<128>(G, grid, smem, s, q, kv, pos0, dpos, n_tok, n_head, scale, window, n_split, part);
    else gqa_launch_hd<256>(G, grid, smem, s, q, kv, pos0, dpos, n_tok, n_head, scale, window, n_split, part);
}

/* Prompt chunks of at least this many tokens may take the tensor-core kernel. */
#define ATT_TC_MIN_TOK 16

/* out = sum_s exp(m_s - M) acc_s / sum_s exp(m_s - M) l_s, M = max m_s, per
 * (token, head); with aq (hd a multiple of 32: whole warps hold each block
 * of 32) also the int8 blocks the next product reads. A block takes 32
 * values of one head (one quantization block; blockIdx.z), so a decode
 * step has n_head * hd / 32 blocks, not n_head; its CMB_WARPS warps each
 * sum every CMB_WARPS-th slice (lane = value), then warp 0 adds the warps'
 * sums in a fixed order. One thread walking all n_split slices in turn was
 * a chain of dependent-latency loads: at 16K positions (128 slices, 32
 * blocks) 32-44 us a layer on an H200, as long as the attention itself.
 * The slices' m and l are read by the threads together and their weights
 * kept in shared memory (n_split floats); an empty slice (weight 0: a
 * recorded step's slices past the position) adds nothing, whatever its
 * (unwritten) values hold. */
#define CMB_WARPS 8
static __global__ void __launch_bounds__(CMB_WARPS * 32)
    attn_combine_kernel(const float *part, int n_head, int hd, int n_split, const float *sinks, float *out, int8_t *aq,
                        float2 *ad) {
    pdl_enter();                   /* first: see st_launch (common.cuh) */
    extern __shared__ float wsl[]; /* [n_split] */
    __shared__ float red[ST_WARP], sums[CMB_WARPS][32];
    const int h = blockIdx.x, t = blockIdx.y, lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    const int d = blockIdx.z * 32 + lane;
    const size_t st = (size_t)hd + 2;
    const float *pp = part + ((size_t)t * n_head + h) * n_split * st;
    float M = -INFINITY;
    for (int s = threadIdx.x; s < n_split; s += blockDim.x) M = fmaxf(M, pp[s * st]);
    M = block_max(M, red);
    const float sink = sinks ? sinks[h] : -INFINITY;
    M = fmaxf(M, sink); /* a sink above every score: the slices weigh less, none overflows */
    float L = 0.0f;
    for (int s = threadIdx.x; s < n_split; s += blockDim.x) {
        const float ms = pp[s * st], ws = ms != -INFINITY ? expf(ms - M) : 0.0f;
        wsl[s] = ws;
        L += ws * pp[s * st + 1];
    }
    L = block_sum(L, red);          /* synchronises: wsl is written */
    if (sinks) L += expf(sink - M); /* the sink's share of the softmax, with no value */
    float v = 0.0f;
    if (d < hd) {
#pragma unroll 4
        for (int s = warp; s < n_split; s += CMB_WARPS) {
            const float ws = wsl[s], x = pp[s * st + 2 + d];
            v += ws != 0.0f ? ws * x : 0.0f;
        }
    }
    sums[warp][lane] = v;
    __syncthreads();
    if (warp == 0) {
        v = 0.0f;
#pragma unroll
        for (int w = 0; w < CMB_WARPS; w++) v += sums[w][lane];
        const size_t oi = ((size_t)t * n_head + h) * hd + d;
        if (d < hd) out[oi] = v / L;
        if (aq) quant_block_store(v / L, oi, aq, ad);
    }
}

/* Slices per (token, head) block: enough to give the chip ~4 blocks per
 * multiprocessor, none shorter than a tile of the span. */
static int att_n_split(int blocks, int n_sm, int span, int tile) {
    const int want = (4 * n_sm + blocks - 1) / blocks, max_split = (span + tile - 1) / tile;
    return want < 1 ? 1 : want > max_split ? max_split : want;
}

void cuda_attention_sinks(const float *q, const st_kv_layer *kv, int n_tok, int pos0, const int *dpos, int dspan,
                          int n_head, float scale, int window, const float *sinks, float *out, int8_t *aq, float2 *ad,
                          cuda_scratch *scratch, int n_sm, int cc_major, int mode, cudaStream_t s) {
    ST_ASSERT(kv->head_dim <= ATT_MAX_HD && n_head % kv->n_head_kv == 0);
    if (n_tok <= 0) return;
    if (mode == CUDA_ATT_TC && !dpos && n_tok >= ATT_TC_MIN_TOK && !aq &&
        cuda_attention_tc_sinks(q, kv, n_tok, pos0, n_head, scale, window, sinks, out, cc_major, s) == 0)
        return;
    /* a latent row's prompt (deepseek2's 576, 128 heads on it): tensor cores through two GEMMs */
    if (mode == CUDA_ATT_TC && !dpos && n_tok >= ATT_TC_MIN_TOK && !aq && !sinks && window <= 0 &&
        cuda_attn_latent_fits(n_head, kv) &&
        cuda_attn_latent_gemm(q, kv, n_tok, pos0, n_head, scale, out, scratch, s) == 0)
        return;
    /* the longest visible span of any token in the chunk (the last one sees
     * the most); a recorded step: the span it is recorded for (the slices
     * cover any position anyway: they are cut from the position on the device) */
    int span = dpos ? (dspan > 0 && dspan < kv->n_ctx ? dspan : kv->n_ctx) : pos0 + n_tok;
    if (window > 0 && span > window) span = window;
    /* The GQA kernel reads K/V once per KV head but has n_head_kv times fewer
     * blocks: at short spans the per-head kernel's parallelism wins. Measured
     * on an H200, 30B-A3B synth (32/4 heads x 128): decode over a 640-position
     * cache 8 us per layer faster per head, over 16K 185 us slower; the
     * difference grows ~12 us per 1K positions, so they cross near 1.3K. */
    const int G = n_head / kv->n_head_kv, long_span = span > CUDA_ATT_SHORT_SPAN;
    /* past the short span, by default: the same grouping on tensor cores (attention_tc.cu) */
    const int tcd = mode == CUDA_ATT_TC && long_span && cuda_attn_tc_decode_fits(kv, G, cc_major);
    const int gqa = !tcd && gqa_fits(G, kv->head_dim) && (mode == CUDA_ATT_GQA || (mode == CUDA_ATT_TC && long_span));
    /* a latent row (deepseek2's 576, mla.cu): its own kernel for every span, but with the per-head one forced */
    const int lat = !tcd && !gqa && mode != CUDA_ATT_HEAD && cuda_attn_latent_fits(n_head, kv);
    const int tile = tcd ? CUDA_ATT_TCD_TILE : gqa ? GQA_TILE : lat ? cuda_attn_latent_tile() : ATT_TILE;
    /* blocks per token: the grouped kernels one per KV head, the latent one per CUDA_ATT_LATENT_HEADS heads */
    const int lat_blocks = (n_head + CUDA_ATT_LATENT_HEADS - 1) / CUDA_ATT_LATENT_HEADS;
    const int per_tok = tcd || gqa ? kv->n_head_kv : lat ? lat_blocks : n_head;
    int n_split = att_n_split(n_tok * per_tok, n_sm, span, tile);
    if (!dpos) { /* no slice left empty */
        const int chunk = ((span + n_split - 1) / n_split + tile - 1) / tile * tile;
        n_split = (span + chunk - 1) / chunk;
    }
    size_t bytes = (size_t)n_tok * n_head * n_split * (size_t)(kv->head_dim + 2) * sizeof(float);
    float *part = (float *)cuda_scratch_reserve(scratch, bytes);
    ST_ASSERT(!aq || kv->head_dim % 32 == 0); /* whole warps hold each block of 32 */
    if (tcd) {
        cuda_attn_tc_decode(q, kv, n_tok, pos0, dpos, n_head, scale, window, n_split, part, s);
    } else if (gqa) {
        const size_t smem = (size_t)G * (GQA_SC + 8) * sizeof(float);
        gqa_launch(G, dim3((unsigned)n_split, (unsigned)kv->n_head_kv, (unsigned)n_tok), smem, s, q, kv, pos0, dpos,
                   n_tok, n_head, scale, window, n_split, part);
    } else if (lat) {
        cuda_attn_latent(q, kv, n_tok, pos0, dpos, n_head, scale, window, n_split, part, s);
    } else {
        st_launch(attn_split_kernel<cuda_one_seq>, dim3((unsigned)n_split, (unsigned)n_head, (unsigned)n_tok),
                  dim3(ATT_THREADS), 0, s, q, *kv, pos0, dpos, n_tok, n_head, scale, window, n_split, part,
                  cuda_one_seq());
    }
    st_launch(attn_combine_kernel, dim3((unsigned)n_head, (unsigned)n_tok, (unsigned)st_div_up(kv->head_dim, 32)),
              dim3(CMB_WARPS * 32), (size_t)n_split * sizeof(float), s, (const float *)part, n_head, kv->head_dim,
              n_split, sinks, out, aq, ad);
}

int cuda_attention_seqs(const float *q, st_kv_layer *const *kv, int il, int n, const int *pos, const int *dpos,
                        int n_head, float scale, int window, const float *sinks, float *out, int8_t *aq, float2 *ad,
                        cuda_scratch *scratch, int n_sm, cudaStream_t s) {
    const st_kv_layer *k0 = &kv[0][il];
    if (k0->head_dim > ATT_MAX_HD || n_head % k0->n_head_kv || cuda_attn_latent_fits(n_head, k0)) return 1;
    /* the longest of the sequences' spans; a recorded step (dpos) is sized
     * for the short span (its slices are cut from each row's position on
     * the device, so they cover any position below it) */
    int span = dpos ? CUDA_ATT_SHORT_SPAN : 0;
    for (int i = 0; i < n && !dpos; i++) span = pos[i] + 1 > span ? pos[i] + 1 : span;
    if (window > 0 && span > window) span = window;
    /* past the short span a sequence is better served by the grouped kernels, one launch each */
    if (span > CUDA_ATT_SHORT_SPAN) return 1;
    const int n_split = att_n_split(n * n_head, n_sm, span, ATT_TILE);
    const size_t hd = (size_t)k0->head_dim, qw = (size_t)n_head * hd, pw = (size_t)n_head * n_split * (hd + 2);
    float *part = (float *)cuda_scratch_reserve(scratch, (size_t)n * pw * sizeof(float));
    ST_ASSERT(!aq || hd % 32 == 0);
    for (int r0 = 0; r0 < n; r0 += CUDA_SEQ_ROWS) { /* a launch for every CUDA_SEQ_ROWS sequences */
        const int m = n - r0 < CUDA_SEQ_ROWS ? n - r0 : CUDA_SEQ_ROWS;
        st_launch(attn_split_kernel<cuda_seq_rows>, dim3((unsigned)n_split, (unsigned)n_head, (unsigned)m),
                  dim3(ATT_THREADS), 0, s, q + r0 * qw, *k0, 0, (const int *)NULL, m, n_head, scale, window, n_split,
                  part + r0 * pw, cuda_seq_rows_of(kv, il, pos, dpos, r0, m));
    }
    st_launch(attn_combine_kernel, dim3((unsigned)n_head, (unsigned)n, (unsigned)st_div_up(k0->head_dim, 32)),
              dim3(CMB_WARPS * 32), (size_t)n_split * sizeof(float), s, (const float *)part, n_head, k0->head_dim,
              n_split, sinks, out, aq, ad);
    return 0;
}

void cuda_attention(const float *q, const st_kv_layer *kv, int n_tok, int pos0, const int *dpos, int dspan, int n_head,
                    float scale, int window, float *out, int8_t *aq, float2 *ad, cuda_scratch *scratch, int n_sm,
                    int cc_major, int mode, cudaStream_t s) {
    cuda_attention_sinks(q, kv, n_tok, pos0, dpos, dspan, n_head, scale, window, NULL, out, aq, ad, scratch, n_sm,
                         cc_major, mode, s);
}
