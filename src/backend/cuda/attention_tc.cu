/* Prompt attention on tensor cores (flash-attention style), for head sizes
 * 64, 128 and 256 on sm_80 and later: the default for prompt chunks of 16
 * tokens or more (checked against the CPU by the op checks; measured in
 * docs/benchmarks.md). Decode's kernel below takes 64 and 128.
 *
 * A block takes 64 query rows of one KV head: row r is token r / G, query
 * head r % G of the G heads that read this KV head, so each K/V tile loaded
 * into shared memory serves every query head of the group and 64 / G tokens.
 * Each of the 4 warps owns 16 rows. K/V tiles of 64 keys (32 for 256-wide
 * heads, whose Q fragments come from shared memory: tc_cfg) travel in two
 * stages: f16 rows by cp.async, the next tile's copies in flight while this
 * one is multiplied (int8 rows through registers, widened to f16 times their
 * scales, without that overlap). Per tile:
 *   S = Q K^T      mma m16n8k16 (f16 in, f32 out): Q as A fragments held in
 *                  registers for the whole kernel, K's B fragments by
 *                  ldmatrix from the [key][dim] rows, two 16-dim chunks a load;
 *   mask           causal per row (key <= its position), sliding window;
 *                  skipped for a tile every row of the warp sees whole;
 *   online softmax per row in f32 (running max m, sum l), the quad of lanes
 *                  that share a row reduce with two shuffles; in base 2, the
 *                  scale and log2 e folded into Q when it is converted;
 *   O += P V       P re-packed from the S accumulators as A fragments (the
 *                  C layout of two adjacent 8-key tiles is the A layout of
 *                  one 16-key chunk), V's B fragments by ldmatrix .trans from
 *                  the same [key][dim] rows (each word two adjacent keys).
 * A sink (gpt-oss) joins only at the end: out = O / (l + exp(sink - m)),
 * scaled by exp(m - max(m, sink)) above and below so that nothing overflows.
 * The first version loaded each tile through registers and stored V
 * transposed value by value, then multiplied: on an H200, a 512-token chunk
 * at 3584 over GLM-4.5-Air's 96/8 heads of 128 took 1.63 ms, now 0.61 (157
 * TFLOP/s, 16% of the f16 peak; gpt-oss's 64/8 of 64: 0.38 -> 0.27 ms).
 *
 * Decode over a long cache (attn_tcd_kernel, the default past
 * CUDA_ATT_SHORT_SPAN): the same products for one token, its G <= 16 query
 * heads of a KV head as the 16 rows; a block takes one slice of positions
 * (attention.cuh's att_slice) and its 4 warps 16 keys each of every tile of
 * 64, copied with cp.async into the warp's own shared rows (no registers
 * held while the bytes travel; keys past the slice are zero-filled); each
 * warp keeps its own running max, sum and O, the block merges the four, and
 * writes the slice's partial (m, l, O) for attention.cu's combine. Scalar
 * kernels did 1024 FMAs a position with a shared-memory read for every 4,
 * and were bound by issue, not memory: 30 us a layer for 33.5 MB of K and V
 * at 16K positions on an H200 (1.1 TB/s, 4 warps a scheduler eligible 42%
 * of cycles). An int8 cache: K's values enter the product as they are (exact
 * in f16) and its row scales multiply the scores; V's rows are copied to
 * the upper half of their shared rows and widened in place to f16 values
 * times their scales. (Folding V's scales into the f16 weights P instead,
 * the first version, put p * s below f16's normal range at long spans: p ~
 * 1/16K, s ~ max|v| / 127.)
 *
 * Fragment layouts (PTX ISA, mma.m16n8k16, g = lane / 4, c = lane % 4):
 *   A 16x16: a0 (g, 2c..2c+1), a1 (g+8, 2c..), a2 (g, 2c+8..), a3 (g+8, 2c+8..)
 *   B 16x8:  b0 (k 2c..2c+1, n g), b1 (k 2c+8.., n g)
 *   C 16x8:  c0 c1 (g, 2c, 2c+1), c2 c3 (g+8, 2c, 2c+1)
 */
#include "backend/cuda/attention.cuh"
#include "backend/cuda/common.cuh"
#include "backend/cuda/ops.h"

#if !defined(STRATA_HIP) /* mma.sync is PTX: the whole kernel is CUDA only */
#include "backend/cuda/mm/mma.cuh"

#define TC_ROWS    64 /* query rows per block (4 warps x 16) */
#define TC_PAD     8  /* halves of padding per shared row (bank spread) */
#define TC_MAX_DEV 16

static __device__ __forceinline__ uint32_t pack_h2(float lo, float hi) {
    const __half2 h = __floats2half2_rn(lo, hi);
    return *(const uint32_t *)&h;
}

/* One tile's online-softmax step for a thread's two rows (mma C layout:
 * sc[j][e] is row e >> 1 of key tile j; masked scores are -inf), given
 * each row's max over the thread's own scores (tmax): the quad of lanes that
 * share a row reduce, the running max m and sum l move on, O is rescaled,
 * and sc becomes the weights exp(s - m) (0 where masked). E2: scores, m and
 * the weights in base 2 (the scale times log2 e folded into Q beforehand:
 * exp2 is one instruction, exp a few). */
template <bool E2> static __device__ __forceinline__ float tc_exp(float x) { return E2 ? exp2f(x) : expf(x); }
template <int NJ, int ND, bool E2 = false>
static __device__ __forceinline__ void tc_softmax_step(float (&sc)[NJ][4], float (&tmax)[2], float (&m)[2],
                                                       float (&l)[2], float (&o)[ND][4]) {
    float alpha[2], rs[2] = {0.0f, 0.0f};
#pragma unroll
    for (int ri = 0; ri < 2; ri++) {
        tmax[ri] = fmaxf(tmax[ri], __shfl_xor_sync(ST_FULL_MASK, tmax[ri], 1));
        tmax[ri] = fmaxf(tmax[ri], __shfl_xor_sync(ST_FULL_MASK, tmax[ri], 2));
        const float mn = fmaxf(m[ri], tmax[ri]);
        alpha[ri] = m[ri] == -INFINITY ? 0.0f : tc_exp<E2>(m[ri] - mn); /* O and l are 0 while m is -inf */
        m[ri] = mn;
    }
#pragma unroll
    for (int j = 0; j < NJ; j++) {
#pragma unroll
        for (int e = 0; e < 4; e++) {
            sc[j][e] = sc[j][e] == -INFINITY ? 0.0f : tc_exp<E2>(sc[j][e] - m[e >> 1]);
            rs[e >> 1] += sc[j][e];
        }
    }
#pragma unroll
    for (int ri = 0; ri < 2; ri++) {
        rs[ri] += __shfl_xor_sync(ST_FULL_MASK, rs[ri], 1);
        rs[ri] += __shfl_xor_sync(ST_FULL_MASK, rs[ri], 2);
        l[ri] = l[ri] * alpha[ri] + rs[ri];
    }
#pragma unroll
    for (int nd = 0; nd < ND; nd++) {
        o[nd][0] *= alpha[0], o[nd][1] *= alpha[0];
        o[nd][2] *= alpha[1], o[nd][3] *= alpha[1];
    }
}

/* Per head size: keys per tile, and whether Q's fragments live in shared
 * memory instead of registers. 256-wide heads (Gemma 3, the full-attention
 * layers of Qwen3-Next and Qwen3.5) hold O in 128 registers a thread; Q's
 * 64 more would leave no room, so Q is read by ldmatrix from shared memory
 * at every tile, and tiles are 32 keys (S's accumulators and the stages'
 * shared memory halved). */
template <int HD> struct tc_cfg {
    static constexpr int KEYS = HD > 128 ? 32 : 64;
    static constexpr bool QS = HD > 128;
};

/* The prompt kernel's shared memory: Q's rows (256-wide heads), then K and V
 * tiles of KEYS rows, each [key][dim] with TC_PAD halves of padding (rows 16
 * bytes apart modulo 128: ldmatrix's eight row reads of a matrix hit
 * distinct banks), two stages. */
template <int HD> static constexpr size_t tc_smem() {
    return ((tc_cfg<HD>::QS ? (size_t)TC_ROWS : 0) + (size_t)2 * 2 * tc_cfg<HD>::KEYS) * (HD + TC_PAD) * sizeof(__half);
}

/* One K/V tile into a stage: f16 rows by cp.async (nothing held in
 * registers while the bytes travel, so the tile after this one loads while
 * this one is multiplied); int8 rows through registers, widened to f16 times
 * their scales. Keys past p_last are zeros (masked; 0 * garbage may be NaN). */
template <int HD>
static __device__ __forceinline__ void tc_load_tile(__half *ks, __half *vs, const st_kv_layer &kv, int hkv, int k0,
                                                    int p_last) {
    constexpr int RS = HD + TC_PAD, CPR = HD / 8; /* 8-value chunks a row */
    const size_t krow = (size_t)kv.n_head_kv * HD;
    for (int i = threadIdx.x; i < tc_cfg<HD>::KEYS * CPR; i += 128) {
        const int kk = i / CPR, d = (i % CPR) * 8, p = k0 + kk, in = p <= p_last;
        const size_t idx = (size_t)(in ? p : k0) * krow + (size_t)hkv * HD + d;
        __half *kd = ks + kk * RS + d, *vd = vs + kk * RS + d;
        if (kv.type == ST_KV_F16) {
            mq_cp16n(kd, (const __half *)kv.k + idx, in ? 16u : 0u);
            mq_cp16n(vd, (const __half *)kv.v + idx, in ? 16u : 0u);
            continue;
        }
        __align__(16) __half kh[8], vh[8];
        if (in) {
            const size_t si = (size_t)p * kv.n_head_kv + hkv;
            const float sk = kv.k_scale[si], sv = kv.v_scale[si];
            const uint2 kq = *(const uint2 *)((const int8_t *)kv.k + idx);
            const uint2 vq = *(const uint2 *)((const int8_t *)kv.v + idx);
#pragma unroll
            for (int j = 0; j < 4; j++) {
                kh[j] = __float2half_rn(sk * (float)(int8_t)(kq.x >> (8 * j)));
                kh[4 + j] = __float2half_rn(sk * (float)(int8_t)(kq.y >> (8 * j)));
                vh[j] = __float2half_rn(sv * (float)(int8_t)(vq.x >> (8 * j)));
                vh[4 + j] = __float2half_rn(sv * (float)(int8_t)(vq.y >> (8 * j)));
            }
        } else {
#pragma unroll
            for (int j = 0; j < 8; j++) kh[j] = vh[j] = __float2half_rn(0.0f);
        }
        *(uint4 *)kd = *(const uint4 *)kh;
        *(uint4 *)vd = *(const uint4 *)vh;
    }
}

template <int HD, int MINB>
static __global__ void __launch_bounds__(128, MINB)
    attn_tc_kernel(const float *q, st_kv_layer kv, int pos0, int n_tok, int n_head, float scale, int window,
                   const float *sinks, float *out) {
    constexpr int RS = HD + TC_PAD, KEYS = tc_cfg<HD>::KEYS;
    constexpr bool QS = tc_cfg<HD>::QS;
    extern __shared__ __align__(16) unsigned char tsm[];
    __half *const sq = (__half *)tsm;                 /* Q's rows [TC_ROWS][RS] (QS) */
    __half *const ks0 = sq + (QS ? TC_ROWS * RS : 0); /* stage s at + s * KEYS * RS */
    __half *const vs0 = ks0 + 2 * KEYS * RS;
    const int G = n_head / kv.n_head_kv, hkv = blockIdx.y, n_rows = n_tok * G;
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, c = lane % 4;
    const int row0 = blockIdx.x * TC_ROWS, wrow = row0 + warp * 16;

    /* the block's key range: from the first visible key of its first token to its last token's position */
    const int t_first = row0 / G, t_last = (min(row0 + TC_ROWS, n_rows) - 1) / G;
    const int p_last = pos0 + t_last;
    const int k_lo = window > 0 ? max(0, pos0 + t_first - window + 1) : 0;
    const int n_tiles = (p_last - k_lo) / KEYS + 1;
    tc_load_tile<HD>(ks0, vs0, kv, hkv, k_lo, p_last); /* the first tile travels while Q is read */
    mq_commit();

    /* this thread's two rows (g, g+8 of the warp's 16): token, position, head */
    int rr[2], pos[2];
    for (int i = 0; i < 2; i++) {
        rr[i] = wrow + g + 8 * i;
        pos[i] = rr[i] < n_rows ? pos0 + rr[i] / G : -1;
    }
    /* Q fragments: HD/16 chunks of 4 words (rows past the last are zeros),
     * in registers; or (QS) Q's rows as f16 in shared memory, 8 values a store.
     * Q comes times the scale and log2 e: the scores are the softmax's base-2
     * exponents as they leave the product. */
    const float qs = scale * 1.44269504f;
    uint32_t qa[QS ? 1 : HD / 16][4];
    if constexpr (QS) {
        for (int i = threadIdx.x; i < TC_ROWS * HD / 8; i += 128) {
            const int rl = i / (HD / 8), d = (i % (HD / 8)) * 8, r = row0 + rl;
            __align__(16) __half h[8];
            const float *qr = q + ((size_t)(r / G) * n_head + (size_t)hkv * G + r % G) * HD + d;
#pragma unroll
            for (int j = 0; j < 8; j++) h[j] = __float2half_rn(r < n_rows ? qr[j] * qs : 0.0f);
            *(uint4 *)(sq + rl * RS + d) = *(const uint4 *)h;
        }
    } else {
#pragma unroll
        for (int kc = 0; kc < HD / 16; kc++) {
#pragma unroll
            for (int j = 0; j < 4; j++) {
                const int ri = j & 1, col = kc * 16 + 2 * c + (j >> 1) * 8;
                float x0 = 0.0f, x1 = 0.0f;
                if (pos[ri] >= 0) {
                    const int r = rr[ri];
                    const float *qr = q + ((size_t)(r / G) * n_head + (size_t)hkv * G + r % G) * HD;
                    x0 = qr[col] * qs;
                    x1 = qr[col + 1] * qs;
                }
                qa[kc][j] = pack_h2(x0, x1);
            }
        }
    }
    /* this warp's A fragments from shared memory (QS): rows warp*16.., by ldmatrix */
    const __half *const qw = sq + (warp * 16 + (lane & 7) + ((lane >> 3) & 1) * 8) * RS + (lane >> 4) * 8;

    float o[HD / 8][4];
#pragma unroll
    for (int nd = 0; nd < HD / 8; nd++) o[nd][0] = o[nd][1] = o[nd][2] = o[nd][3] = 0.0f;
    float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};

    for (int t = 0; t < n_tiles; t++) {
        const int k0 = k_lo + t * KEYS;
        const __half *ks = ks0 + (t & 1) * KEYS * RS, *vs = vs0 + (t & 1) * KEYS * RS;
        if (t + 1 < n_tiles) { /* the next tile into the other stage (read last in tile t - 1) */
            tc_load_tile<HD>(ks0 + ((t + 1) & 1) * KEYS * RS, vs0 + ((t + 1) & 1) * KEYS * RS, kv, hkv, k0 + KEYS,
                             p_last);
            mq_commit();
            mq_wait<1>();
        } else {
            mq_wait<0>();
        }
        __syncthreads(); /* tile t is in shared memory for every warp */

        /* S = Q K^T for this warp's 16 rows x KEYS keys: tiles of 8 keys, the
         * B fragments of two 16-dim chunks per ldmatrix */
        float sc[KEYS / 8][4];
#pragma unroll
        for (int j = 0; j < KEYS / 8; j++) sc[j][0] = sc[j][1] = sc[j][2] = sc[j][3] = 0.0f;
#pragma unroll
        for (int kc2 = 0; kc2 < HD / 32; kc2++) {
            uint32_t a0[4], a1[4];
            if constexpr (QS) {
                mq_ldsm4(a0, qw + kc2 * 32);
                mq_ldsm4(a1, qw + kc2 * 32 + 16);
            }
#pragma unroll
            for (int j = 0; j < KEYS / 8; j++) {
                uint32_t b[4];
                mq_ldsm4(b, ks + (j * 8 + (lane & 7)) * RS + kc2 * 32 + (lane >> 3) * 8);
                if constexpr (QS) {
                    mma16816(sc[j], a0, b[0], b[1]);
                    mma16816(sc[j], a1, b[2], b[3]);
                } else {
                    mma16816(sc[j], qa[2 * kc2], b[0], b[1]);
                    mma16816(sc[j], qa[2 * kc2 + 1], b[2], b[3]);
                }
            }
        }
        /* mask, and each row's max over the tile: a tile every row of the
         * warp sees whole (below the causal edge, inside the window) needs no
         * per-key test (the test is warp-uniform) */
        float tmax[2] = {-INFINITY, -INFINITY};
        const int wlast = min(wrow + 15, n_rows - 1), p_lo = pos0 + wrow / G, p_hi = pos0 + wlast / G;
        const bool whole = wrow + 15 < n_rows && k0 + KEYS - 1 <= p_lo && (window <= 0 || k0 > p_hi - window);
#pragma unroll
        for (int j = 0; j < KEYS / 8; j++) {
#pragma unroll
            for (int e = 0; e < 4; e++) {
                const int ri = e >> 1, key = k0 + j * 8 + 2 * c + (e & 1);
                if (!whole) {
                    const bool ok = pos[ri] >= 0 && key <= pos[ri] && (window <= 0 || key > pos[ri] - window);
                    sc[j][e] = ok ? sc[j][e] : -INFINITY;
                }
                tmax[ri] = fmaxf(tmax[ri], sc[j][e]);
            }
        }
        tc_softmax_step<KEYS / 8, HD / 8, true>(sc, tmax, m, l, o);
        /* O += P V: chunks of 16 keys; P's A fragment from S tiles 2kk, 2kk+1;
         * V's B fragments transposed by ldmatrix, two 8-value tiles per load */
#pragma unroll
        for (int kk = 0; kk < KEYS / 16; kk++) {
            const uint32_t pa[4] = {pack_h2(sc[2 * kk][0], sc[2 * kk][1]), pack_h2(sc[2 * kk][2], sc[2 * kk][3]),
                                    pack_h2(sc[2 * kk + 1][0], sc[2 * kk + 1][1]),
                                    pack_h2(sc[2 * kk + 1][2], sc[2 * kk + 1][3])};
#pragma unroll
            for (int nd2 = 0; nd2 < HD / 16; nd2++) {
                uint32_t b[4];
                mq_ldsm4<1>(b, vs + (kk * 16 + (lane & 7) + ((lane >> 3) & 1) * 8) * RS + nd2 * 16 + (lane >> 4) * 8);
                mma16816(o[2 * nd2], pa, b[0], b[1]);
                mma16816(o[2 * nd2 + 1], pa, b[2], b[3]);
            }
        }
        __syncthreads(); /* every warp is done with this stage before tile t + 2 loads into it */
    }
    /* out = O / l for the thread's two rows */
#pragma unroll
    for (int ri = 0; ri < 2; ri++) {
        if (pos[ri] < 0) continue;
        const int r = rr[ri];
        float *orow = out + ((size_t)(r / G) * n_head + (size_t)hkv * G + r % G) * HD;
        float inv = l[ri] > 0.0f ? 1.0f / l[ri] : 0.0f;
        if (sinks) { /* the sink's share of the denominator (its logit in base 2, as m) */
            const float sk = sinks[hkv * G + r % G] * 1.44269504f, mx = fmaxf(m[ri], sk), f = exp2f(m[ri] - mx);
            inv = f / (l[ri] * f + exp2f(sk - mx));
        }
#pragma unroll
        for (int nd = 0; nd < HD / 8; nd++) {
            orow[nd * 8 + 2 * c] = o[nd][2 * ri] * inv;
            orow[nd * 8 + 2 * c + 1] = o[nd][2 * ri + 1] * inv;
        }
    }
}

#define TCD_WARPS 4
#define TCD_WK    (CUDA_ATT_TCD_TILE / TCD_WARPS) /* keys per warp per tile: one 16-key chunk of P V */
static_assert(TCD_WK == 16, "a warp's keys are one k-chunk of the P V product");

/* Values d, d + 1 of one key row in shared memory as an f16 pair (a K
 * fragment word): f16 rows as they are, int8 rows as integers (exact in
 * f16; the row's scale multiplies the scores); or value d of two f16 key
 * rows (a V fragment word: keys in k order). */
static __device__ __forceinline__ uint32_t tcd_pair(const unsigned char *row, int d, int i8) {
    if (!i8) return *(const uint32_t *)(row + 2 * d);
    const char2 v = *(const char2 *)(row + d);
    return pack_h2((float)v.x, (float)v.y);
}
static __device__ __forceinline__ uint32_t tcd_pair2(const unsigned char *r0, const unsigned char *r1, int d) {
    const uint32_t lo = *(const uint16_t *)(r0 + 2 * d), hi = *(const uint16_t *)(r1 + 2 * d);
    return lo | hi << 16;
}

/* part: [n_tok][n_head][n_split][2 + HD] (attention.cu's layout). Shared:
 * per warp K [16][RS] then V [16][RS] bytes, RS = 2 HD + 16; after the
 * keys, the warps' (m, l, O) rows [4][16][2 + HD] floats in the same bytes. */
template <int HD>
static __global__ void __launch_bounds__(TCD_WARPS * 32, 4)
    attn_tcd_kernel(const float *q, st_kv_layer kv, int pos0, const int *dpos, int n_tok, int n_head, float scale,
                    int window, int n_split, float *part) {
    pdl_enter(); /* first: see st_launch (common.cuh) */
    constexpr int RS = 2 * HD + 16;
    extern __shared__ __align__(16) unsigned char tsm[];
    const int split = blockIdx.x, hkv = blockIdx.y, t = blockIdx.z;
    const int G = n_head / kv.n_head_kv, warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, c = lane % 4;
    int c0, c1;
    att_slice(dpos ? *dpos : pos0, n_tok, t, window, n_split, split, CUDA_ATT_TCD_TILE, &c0, &c1);
    float *const pb = part + (((size_t)t * n_head + (size_t)hkv * G) * n_split + split) * (size_t)(HD + 2);
    const size_t hstride = (size_t)n_split * (HD + 2); /* between the heads' partials */
    if (c0 >= c1) { /* an empty slice (a recorded step sized for the whole cache): m = -inf weighs nothing */
        if ((int)threadIdx.x < G) pb[threadIdx.x * hstride] = -INFINITY, pb[threadIdx.x * hstride + 1] = 0.0f;
        return;
    }
    const int i8 = kv.type == ST_KV_INT8, esz = i8 ? 1 : 2, cpr = HD * esz / 16;       /* 16-byte copies a row */
    const size_t row = (size_t)kv.n_head_kv * HD * esz, hoff = (size_t)hkv * HD * esz; /* bytes */
    const int vup = i8 ? HD : 0; /* an int8 V row lands in the upper half of its f16 row, widened after */
    unsigned char *ks = tsm + (size_t)warp * 2 * TCD_WK * RS, *vs = ks + TCD_WK * RS;

    /* Q fragments: rows g and g + 8 are query heads (zeros past G) */
    uint32_t qa[HD / 16][4];
#pragma unroll
    for (int kc = 0; kc < HD / 16; kc++) {
#pragma unroll
        for (int j = 0; j < 4; j++) {
            const int h = g + 8 * (j & 1), col = kc * 16 + 2 * c + (j >> 1) * 8;
            const float *qr = q + ((size_t)t * n_head + (size_t)hkv * G + h) * HD;
            qa[kc][j] = h < G ? pack_h2(qr[col], qr[col + 1]) : 0u;
        }
    }
    float o[HD / 8][4];
#pragma unroll
    for (int nd = 0; nd < HD / 8; nd++) o[nd][0] = o[nd][1] = o[nd][2] = o[nd][3] = 0.0f;
    float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};

    for (int p0 = c0; p0 < c1; p0 += CUDA_ATT_TCD_TILE) {
        const int kb = p0 + warp * TCD_WK, nk = min(TCD_WK, c1 - kb); /* this warp's keys */
        if (nk <= 0) break;                                           /* warp-uniform */
        for (int i = lane; i < TCD_WK * cpr; i += 32) {
            const int kk = i / cpr, off = (i % cpr) * 16;
            const size_t src = (size_t)(kb + (kk < nk ? kk : 0)) * row + hoff + off;
            const unsigned n = kk < nk ? 16u : 0u; /* keys past the slice: zeros (0 * garbage may be NaN) */
            mq_cp16n(ks + kk * RS + off, (const char *)kv.k + src, n);
            mq_cp16n(vs + kk * RS + vup + off, (const char *)kv.v + src, n);
        }
        mq_commit();
        mq_wait<0>();
        __syncwarp();
        if (i8) { /* V to f16 times each row's scale: every lane reads its chunks, then all write */
            constexpr int NC = TCD_WK * HD / 16 / 32; /* 16-value chunks a lane */
            uint4 raw[NC];
            float sv[NC];
#pragma unroll
            for (int u = 0; u < NC; u++) {
                const int i = lane + 32 * u, kk = i / (HD / 16);
                raw[u] = *(const uint4 *)(vs + kk * RS + HD + (i % (HD / 16)) * 16);
                sv[u] = kk < nk ? kv.v_scale[(size_t)(kb + kk) * kv.n_head_kv + hkv] : 0.0f;
            }
            __syncwarp();
#pragma unroll
            for (int u = 0; u < NC; u++) {
                const int i = lane + 32 * u, kk = i / (HD / 16);
                const int8_t *b = (const int8_t *)&raw[u];
                uint32_t h[8];
#pragma unroll
                for (int j = 0; j < 8; j++) h[j] = pack_h2(sv[u] * (float)b[2 * j], sv[u] * (float)b[2 * j + 1]);
                uint4 *dst = (uint4 *)(vs + kk * RS + (i % (HD / 16)) * 32);
                dst[0] = make_uint4(h[0], h[1], h[2], h[3]);
                dst[1] = make_uint4(h[4], h[5], h[6], h[7]);
            }
            __syncwarp();
        }
        /* S = Q K^T: 16 rows x 16 keys, two tiles of 8 keys */
        float sc[2][4];
#pragma unroll
        for (int j = 0; j < 2; j++) {
            sc[j][0] = sc[j][1] = sc[j][2] = sc[j][3] = 0.0f;
            const unsigned char *kr = ks + (j * 8 + g) * RS;
#pragma unroll
            for (int kc = 0; kc < HD / 16; kc++)
                mma16816(sc[j], qa[kc], tcd_pair(kr, kc * 16 + 2 * c, i8), tcd_pair(kr, kc * 16 + 2 * c + 8, i8));
        }
        /* scale (int8: times each key's K scale), mask, each row's max */
        float tmax[2] = {-INFINITY, -INFINITY};
#pragma unroll
        for (int j = 0; j < 2; j++) {
#pragma unroll
            for (int e = 0; e < 4; e++) {
                const int kk = j * 8 + 2 * c + (e & 1);
                float f = scale;
                if (i8 && kk < nk) f *= kv.k_scale[(size_t)(kb + kk) * kv.n_head_kv + hkv];
                sc[j][e] = kk < nk ? sc[j][e] * f : -INFINITY;
                tmax[e >> 1] = fmaxf(tmax[e >> 1], sc[j][e]);
            }
        }
        tc_softmax_step(sc, tmax, m, l, o);
        /* O += P V over the 16 keys */
        const uint32_t pa[4] = {pack_h2(sc[0][0], sc[0][1]), pack_h2(sc[0][2], sc[0][3]), pack_h2(sc[1][0], sc[1][1]),
                                pack_h2(sc[1][2], sc[1][3])};
        const unsigned char *v0 = vs + 2 * c * RS, *v1 = v0 + RS, *v8 = v0 + 8 * RS, *v9 = v8 + RS;
#pragma unroll
        for (int nd = 0; nd < HD / 8; nd++)
            mma16816(o[nd], pa, tcd_pair2(v0, v1, nd * 8 + g), tcd_pair2(v8, v9, nd * 8 + g));
        __syncwarp(); /* the next tile's copies overwrite these rows */
    }
    /* merge the warps: each writes its rows' (m, l, O), then the block combines them per (head, value) */
    __syncthreads(); /* every warp is done with its key rows */
    float *wm = (float *)tsm;
    constexpr int WR = HD + 2; /* floats a row */
#pragma unroll
    for (int ri = 0; ri < 2; ri++) {
        float *r = wm + ((size_t)warp * 16 + g + 8 * ri) * WR;
        if (c == 0) r[0] = m[ri], r[1] = l[ri];
#pragma unroll
        for (int nd = 0; nd < HD / 8; nd++) {
            r[2 + nd * 8 + 2 * c] = o[nd][2 * ri];
            r[2 + nd * 8 + 2 * c + 1] = o[nd][2 * ri + 1];
        }
    }
    __syncthreads();
    for (int i = threadIdx.x; i < G * (HD + 2); i += TCD_WARPS * 32) {
        const int h = i / (HD + 2), d = i % (HD + 2);
        float M = -INFINITY;
#pragma unroll
        for (int w = 0; w < TCD_WARPS; w++) M = fmaxf(M, wm[((size_t)w * 16 + h) * WR]);
        float v = 0.0f;
#pragma unroll
        for (int w = 0; w < TCD_WARPS; w++) {
            const float *r = wm + ((size_t)w * 16 + h) * WR;
            const float f = r[0] == -INFINITY ? 0.0f : expf(r[0] - M); /* a warp with no keys weighs nothing */
            v += d == 0 ? 0.0f : f * r[d];
        }
        pb[h * hstride + d] = d == 0 ? M : v;
    }
}

#endif /* !STRATA_HIP */

int cuda_attn_tc_decode_fits(const st_kv_layer *kv, int G, int cc_major) {
#if defined(STRATA_HIP)
    (void)kv, (void)G, (void)cc_major;
    return 0;
#else
    return cc_major >= 8 && G >= 1 && G <= 16 && (kv->head_dim == 64 || kv->head_dim == 128);
#endif
}

void cuda_attn_tc_decode(const float *q, const st_kv_layer *kv, int n_tok, int pos0, const int *dpos, int n_head,
                         float scale, int window, int n_split, float *part, cudaStream_t s) {
#if defined(STRATA_HIP)
    (void)q, (void)kv, (void)n_tok, (void)pos0, (void)dpos, (void)n_head, (void)scale, (void)window, (void)n_split,
        (void)part, (void)s;
    ST_ASSERT(0 && "cuda_attn_tc_decode_fits says no on HIP");
#else
    const dim3 grid((unsigned)n_split, (unsigned)kv->n_head_kv, (unsigned)n_tok), block(TCD_WARPS * 32);
    const size_t smem = (size_t)TCD_WARPS * 2 * TCD_WK * (2 * kv->head_dim + 16);
    if (kv->head_dim == 64)
        st_launch(attn_tcd_kernel<64>, grid, block, smem, s, q, *kv, pos0, dpos, n_tok, n_head, scale, window, n_split,
                  part);
    else
        st_launch(attn_tcd_kernel<128>, grid, block, smem, s, q, *kv, pos0, dpos, n_tok, n_head, scale, window, n_split,
                  part);
#endif
}

int cuda_attention_tc_sinks(const float *q, const st_kv_layer *kv, int n_tok, int pos0, int n_head, float scale,
                            int window, const float *sinks, float *out, int cc_major, cudaStream_t s) {
#if defined(STRATA_HIP)
    (void)q, (void)kv, (void)n_tok, (void)pos0, (void)n_head, (void)scale, (void)window, (void)sinks, (void)out,
        (void)cc_major, (void)s;
    return 1;
#else
    const int hd = kv->head_dim;
    if (cc_major < 8 || (hd != 64 && hd != 128 && hd != 256)) return 1;
    const int rows = n_tok * (n_head / kv->n_head_kv);
    const dim3 grid(st_div_up((size_t)rows, TC_ROWS), (unsigned)kv->n_head_kv);
    /* 64-wide heads: 4 blocks an SM (128 registers; 0.27 against 0.42 ms with 3 blocks at 168, a 512-token
     * chunk at 3584 of 64/8 heads on an H200); 128-wide: 3 (168 registers; 2 at 221: 0.61 against 0.71 ms);
     * 256-wide: 2 (99 KiB of shared memory each) */
    static int ready[TC_MAX_DEV]; /* shared memory past 48 KiB, allowed once per device */
    int dev = 0;
    CUDA_CHECK(cudaGetDevice(&dev));
    if (dev >= TC_MAX_DEV || !ready[dev]) {
        CUDA_CHECK(cudaFuncSetAttribute(attn_tc_kernel<128, 3>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                        (int)tc_smem<128>()));
        CUDA_CHECK(cudaFuncSetAttribute(attn_tc_kernel<256, 2>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                        (int)tc_smem<256>()));
        if (dev < TC_MAX_DEV) ready[dev] = 1;
    }
    if (hd == 64)
        attn_tc_kernel<64, 4><<<grid, 128, tc_smem<64>(), s>>>(q, *kv, pos0, n_tok, n_head, scale, window, sinks, out);
    else if (hd == 128)
        attn_tc_kernel<128, 3>
            <<<grid, 128, tc_smem<128>(), s>>>(q, *kv, pos0, n_tok, n_head, scale, window, sinks, out);
    else
        attn_tc_kernel<256, 2>
            <<<grid, 128, tc_smem<256>(), s>>>(q, *kv, pos0, n_tok, n_head, scale, window, sinks, out);
    CUDA_LAUNCH_CHECK();
    return 0;
#endif
}

int cuda_attention_tc(const float *q, const st_kv_layer *kv, int n_tok, int pos0, int n_head, float scale, int window,
                      float *out, int cc_major, cudaStream_t s) {
    return cuda_attention_tc_sinks(q, kv, n_tok, pos0, n_head, scale, window, NULL, out, cc_major, s);
}
