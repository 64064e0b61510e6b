/* Grouped MoE product of prompt chunks on tensor cores, grouped on the
 * device (no host synchronisation): y[p] = W[ids[p]] x[xrow[p]] for every
 * (token, expert) pair p, quantized expert weights, sm_80 and later. The
 * launchers of gemm_dispatch.cu call it past MM_MOE_DEVICE_MAX pairs; it
 * declines (returns 1) where it does not apply and the host-grouped path runs.
 *
 * Two launches per product:
 *  1. mq_prep_kernel, whose block 0 groups the pairs (2.) while the other
 *     blocks convert x rows to f16 times a power of two per row, so that the
 *     row's largest value is in [2^13, 2^14) (f16 has bf16's precision x 8
 *     but not its range; the power of two is undone exactly on the output).
 *  2. mq_group (block 0): per-expert counts, their offsets, the pairs
 *     sorted by expert (stable: each of 32 warps walks its own segment of the
 *     pairs in order, __match_any_sync ranks equal experts within 32 pairs),
 *     and a tile table (expert, first sorted pair, count) with
 *     ceil(count / MQ_TM) tiles per expert. Pairs with a negative (or out of
 *     range) expert or x row form one more bucket whose tiles write zeros.
 *  3. mq_kernel<T> (the second launch): a block per (tile, MQ_TN output
 *     rows). The grid is sized by an upper bound of the tile count,
 *     min(n_pairs, ceil(n_pairs / MQ_TM) + n_mat + 1), known on the host;
 *     blocks past the real count (in device memory) return at once.
 *
 * The product block (4 warps, each 32 rows x all 64 tokens, so that every
 * warp, and with it every tensor unit of the SM, has work at any count):
 *  - raw weight bytes of MQ_TN rows x SK weights (one K-quant super-block,
 *    or 4-8 small blocks) go to shared memory with 16-byte cp.async, two
 *    stages deep; each row's span is copied from its 16-byte aligned start,
 *    so the bytes keep their address mod 16 and the unit decoders of
 *    quant_cuda.cuh (which assume that alignment) read them from shared
 *    memory unchanged; the last chunk of a span reads only up to its end;
 *  - the gathered activation rows (f16) of the stage's SK columns follow in
 *    their own cp.async group, issued before the next raw stage so that
 *    they can be waited for alone;
 *  - 64 columns at a time, each thread decodes 2 units (32 weights each) to
 *    f16 (w = d*q + m with the 0x6400 magic: two byte permutes make
 *    1024 + 128 + q exactly, one HSUB2 and one HFMA2 per two weights), into a
 *    128 x 64 tile, then the warps run mma.m16n8k16 (f16 in, f32 out) on it
 *    with ldmatrix fragments; 8-token column groups past the tile's count
 *    are skipped, so a 33-token tile costs 5 of 8 column groups;
 *  - shared tiles are XOR-swizzled in 16-byte chunks (chunk ^ row % 8) so
 *    that ldmatrix and the decoders' 16-byte stores are conflict-free.
 * Shared memory: 2 x 128 x RAWB (raw stages, RAWB an odd multiple of 16
 * bytes, 80..240) + 64 x SK x 2 (activations) + 128 x 64 x 2 (decoded
 * weights) + 0.75 KB: 69-109 KB, two blocks per SM on sm_90 (228 KB).
 * Where the device's per-block limit is smaller (sm_86/89: 99 KB, which
 * Q5_0, Q5_1, Q5_K and Q6_K exceed), the path declines for that format.
 * Rows the stage width does not divide decline too, but MXFP4's of a
 * multiple of 192 (gpt-oss: 2880), which take 192-weight stages (mq_fits_alt).
 *
 * Roofline, Qwen3-30B-A3B prompt chunk of 512 tokens (top-8 of 128 experts:
 * 4096 pairs, ~32 per expert), one layer: gate and up 768 x 2048 Q4_K,
 * down 2048 x 768 Q6_K. Weights of all 128 experts: 2 x 113 + 165 MB =
 * ~390 MB read once (~87 us at 4.5 TB/s); work 3 x 4096 x 768 x 2048 x 2 =
 * 38.7 GFLOP (~0.1 ms at the ~400 dense f16 TFLOP/s mma.sync reaches on an
 * H200). Expected cost: shared-memory traffic (decoded tiles written once,
 * read once; activation tiles read by all four warps), 0.23 bytes per
 * multiply-add at 32 tokens a tile (0.16 at 64), i.e. ~130 us per layer
 * for the three products (+ a few us for the small launches), against ~1.5
 * ms for the host-grouped path it replaces. Measured end to end on an H200
 * (docs/benchmarks.md): pp512 of the 30B-A3B synth 4.6k -> 13.5k tok/s.
 */
#include "backend/cuda/mm/mm_impl.cuh"
#include "backend/cuda/mm/quant_cuda.cuh"

#if !defined(STRATA_HIP) /* mma.sync, ldmatrix, cp.async are PTX: CUDA only */
#include "backend/cuda/mm/mma.cuh"

#define MQ_TM      64  /* tokens (pairs) per tile */
#define MQ_TN      128 /* output rows per block */
#define MQ_HK      64  /* weight columns decoded per phase */
#define MQ_THREADS 128 /* 4 warps */
#define MQ_SEG     32  /* segments (warps) of the grouping block */
#define MQ_GT      (MQ_SEG * 32)
#define MQ_MAX_DEV 16
/* Weights are decoded times 2^MQ_WLOG2 (undone with the activations' power
 * of two on the output): f16's subnormal range then starts at 2.4e-7 instead
 * of 6.1e-5, so small scales keep their bits; |w| up to 256 stays finite. */
#define MQ_WLOG2 8

/* ---- per-format geometry ---- */

/* SKX: weights per stage other than the format's own (0: its own): rows
 * whose width the own stage does not divide. MXFP4 at gpt-oss's 2880 (not a
 * multiple of 256 or 128) takes stages of 192 (6 blocks of 32, 15 of them). */
#define MQ_SK_ALT 192
template <int T, int SKX = 0> struct mq_cfg {
    using F = mmf<T>;
    /* weights per raw stage: a super-block, or 8 small blocks unless that
     * exceeds 224 bytes (Q8_0: 4 blocks) */
    static constexpr int SK = SKX ? SKX : (F::QK == 256 || F::BYTES * 8 <= 224) ? 256 : 128;
    static constexpr int SB = SK / F::QK * F::BYTES; /* raw bytes of a row per stage */
    static constexpr int R16 = (SB + 15) / 16 + 1;   /* 16-byte chunks covering any alignment */
    static constexpr int RAWB = 16 * (R16 | 1);      /* row stride: odd multiple of 16 (banks) */
    static constexpr int NCH = RAWB / 16;
    static constexpr size_t SMEM =
        (size_t)2 * MQ_TN * RAWB + (size_t)MQ_TM * SK * 2 + (size_t)MQ_TN * MQ_HK * 2 + (size_t)MQ_TM * 12;
};

/* Decoded unit -> 32 f16 weights in order (16 words). */
template <class F> static __device__ __forceinline__ void mq_unit_f16(const mm_unit &u, uint32_t (&o)[16]) {
    const __half2 k1152 = __float2half2_rn(1152.0f);
#pragma unroll
    for (int i = 0; i < 8; i++) {
        const float d = (F::SCALE16 ? u.d[i >> 2] : u.d[0]) * (float)(1 << MQ_WLOG2);
        const uint32_t b = (uint32_t)u.q[i] ^ 0x80808080u; /* q + 128 per byte */
        const uint32_t lo = __byte_perm(b, 0x64646464u, 0x4140), hi = __byte_perm(b, 0x64646464u, 0x4342);
        __half2 hl = __hsub2(*(const __half2 *)&lo, k1152), hh = __hsub2(*(const __half2 *)&hi, k1152);
        const __half2 d2 = __float2half2_rn(d);
        if constexpr (F::MIN == 0) {
            hl = __hmul2(hl, d2), hh = __hmul2(hh, d2);
        } else {
            const float m0 = F::MIN == 1 ? u.m[0] : F::MIN == 2 ? u.m[i >> 2] : u.m[i >> 1];
            const float m = m0 * (float)(1 << MQ_WLOG2);
            const __half2 m2 = __float2half2_rn(m);
            hl = __hfma2(hl, d2, m2), hh = __hfma2(hh, d2, m2);
        }
        o[2 * i] = *(const uint32_t *)&hl;
        o[2 * i + 1] = *(const uint32_t *)&hh;
    }
}

/* ---- 1. activations to f16 with a power of two per row ---- */

/* One warp converts one row. */
static __device__ __forceinline__ void mq_act_row(const float *__restrict__ x, int n_in, int row,
                                                  __half *__restrict__ xh, float *__restrict__ inv) {
    const int lane = threadIdx.x % 32;
    const float4 *xr = (const float4 *)(x + (size_t)row * n_in);
    float amax = 0.0f;
    for (int i = lane; i < n_in / 4; i += 32) {
        const float4 v = xr[i];
        amax = fmaxf(amax, fmaxf(fmaxf(fabsf(v.x), fabsf(v.y)), fmaxf(fabsf(v.z), fabsf(v.w))));
    }
    amax = warp_max(amax);
    int ex = 0, e = 0;
    if (amax > 0.0f && amax <= 3.0e38f) { /* inf and NaN keep the scale 1 (and propagate) */
        (void)frexpf(amax, &ex);          /* amax < 2^ex */
        e = min(max(14 - ex, -110), 110);
    }
    const float sc = ldexpf(1.0f, e);
    uint2 *dst = (uint2 *)(xh + (size_t)row * n_in);
    for (int i = lane; i < n_in / 4; i += 32) {
        const float4 v = xr[i];
        const __half2 a = __floats2half2_rn(v.x * sc, v.y * sc), b = __floats2half2_rn(v.z * sc, v.w * sc);
        dst[i] = make_uint2(*(const uint32_t *)&a, *(const uint32_t *)&b);
    }
    if (lane == 0) inv[row] = ldexpf(1.0f, -e - MQ_WLOG2); /* also undoes the weights' 2^MQ_WLOG2 */
}

/* ---- 2. grouping ---- */

/* Buckets of pairs p, p+32, .. (MQ_RB rounds of a warp; -1 from p_hi on),
 * all loads issued before any is used. */
#define MQ_RB 4
static __device__ __forceinline__ void mq_buckets(int (&bk)[MQ_RB], const int32_t *ids, const int32_t *xrow, int x_off,
                                                  int p, int p_hi, int n_mat, int n_x) {
    int e[MQ_RB], r[MQ_RB];
#pragma unroll
    for (int u = 0; u < MQ_RB; u++) {
        const int q = p + 32 * u;
        e[u] = q < p_hi ? ids[q] : -1;
        r[u] = q < p_hi ? (xrow ? xrow[q] : x_off + q) : -1;
    }
#pragma unroll
    for (int u = 0; u < MQ_RB; u++) {
        const int q = p + 32 * u;
        bk[u] = q >= p_hi ? -1 : e[u] >= 0 && e[u] < n_mat && r[u] >= 0 && r[u] < n_x ? e[u] : n_mat;
    }
}

/* Exclusive block-wide prefix sums of two values per thread (MQ_GT threads). */
static __device__ __forceinline__ void mq_scan2(int a, int b, int &ea, int &eb, int (*ws)[MQ_SEG]) {
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    int ia = a, ib = b;
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
        const int ta = __shfl_up_sync(0xffffffffu, ia, o), tb = __shfl_up_sync(0xffffffffu, ib, o);
        if (lane >= o) ia += ta, ib += tb;
    }
    if (lane == 31) ws[0][warp] = ia, ws[1][warp] = ib;
    __syncthreads();
    if (warp == 0) {
        int va = ws[0][lane], vb = ws[1][lane];
#pragma unroll
        for (int o = 1; o < 32; o <<= 1) {
            const int ta = __shfl_up_sync(0xffffffffu, va, o), tb = __shfl_up_sync(0xffffffffu, vb, o);
            if (lane >= o) va += ta, vb += tb;
        }
        ws[0][lane] = va - ws[0][lane], ws[1][lane] = vb - ws[1][lane]; /* exclusive warp offsets */
    }
    __syncthreads();
    ea = ws[0][warp] + ia - a;
    eb = ws[1][warp] + ib - b;
}

/* rec layout (int32): [0] tile count, [4 ..) tiles as int4 (expert or -1,
 * first sorted index, count, 0) x max_tiles, then the sorted pairs. */
static __device__ __forceinline__ void mq_group(const int32_t *__restrict__ ids, const int32_t *__restrict__ xrow,
                                                int x_off, int n_pairs, int n_mat, int n_x, int max_tiles,
                                                int32_t *__restrict__ rec) {
    extern __shared__ uint16_t hist[]; /* [MQ_SEG][nb]: per segment counts, then running offsets */
    __shared__ int s_off[MM_MOE_MMA_MAX_MAT + 1];
    __shared__ int ws[2][MQ_SEG];
    const int nb = n_mat + 1, tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
    int4 *tiles = (int4 *)(rec + 4);
    int32_t *sorted = rec + 4 + 4 * (size_t)max_tiles;
    for (int i = tid; i < MQ_SEG * nb; i += MQ_GT) hist[i] = 0;
    __syncthreads();

    const int seg = (n_pairs + MQ_SEG - 1) / MQ_SEG, p_lo = warp * seg, p_hi = min(n_pairs, p_lo + seg);
    uint16_t *h = hist + warp * nb;
    for (int p0 = p_lo; p0 < p_hi; p0 += 32 * MQ_RB) {
        int bk[MQ_RB];
        mq_buckets(bk, ids, xrow, x_off, p0 + lane, p_hi, n_mat, n_x);
#pragma unroll
        for (int u = 0; u < MQ_RB; u++) {
            const unsigned peers = __match_any_sync(0xffffffffu, bk[u]);
            if (bk[u] >= 0 && lane == __ffs(peers) - 1) h[bk[u]] = (uint16_t)(h[bk[u]] + __popc(peers));
            __syncwarp(); /* the next round's leader of this bucket may be another lane */
        }
    }
    __syncthreads();

    int cnt = 0;
    if (tid < nb)
        for (int w = 0; w < MQ_SEG; w++) { /* counts -> offsets within the bucket, segment by segment */
            const int v = hist[w * nb + tid];
            hist[w * nb + tid] = (uint16_t)cnt;
            cnt += v;
        }
    const int ntile = (cnt + MQ_TM - 1) / MQ_TM;
    int off = 0, toff = 0;
    mq_scan2(cnt, ntile, off, toff, ws);
    if (tid < nb) s_off[tid] = off;
    __syncthreads();

    for (int p0 = p_lo; p0 < p_hi; p0 += 32 * MQ_RB) {
        int bk[MQ_RB];
        mq_buckets(bk, ids, xrow, x_off, p0 + lane, p_hi, n_mat, n_x);
#pragma unroll
        for (int u = 0; u < MQ_RB; u++) {
            const int b = bk[u];
            const unsigned peers = __match_any_sync(0xffffffffu, b);
            const int base = b >= 0 ? h[b] : 0;
            __syncwarp();
            if (b >= 0) {
                sorted[s_off[b] + base + __popc(peers & ((1u << lane) - 1))] = p0 + 32 * u + lane;
                if (lane == __ffs(peers) - 1) h[b] = (uint16_t)(base + __popc(peers));
            }
            __syncwarp();
        }
    }
    if (tid < nb)
        for (int j = 0; j < ntile; j++)
            tiles[toff + j] = make_int4(tid < n_mat ? tid : -1, off + j * MQ_TM, min(MQ_TM, cnt - j * MQ_TM), 0);
    if (tid == nb - 1) rec[0] = toff + ntile;
}

/* Block 0 groups the pairs; blocks 1.. convert 32 rows of x each (the
 * grouping, bound by memory latency, hides behind the conversion). */
struct mq_prep_args {
    const int32_t *ids, *xrow;
    int x_off, n_pairs, n_mat, n_x, max_tiles;
    int32_t *rec;
    const float *x; /* converted to f16 by the blocks past the first (none for later chunks) */
    int n_in;
    __half *xh;
    float *xinv;
};

static __global__ void __launch_bounds__(MQ_GT, 1) mq_prep_kernel(const mq_prep_args a) {
    if (blockIdx.x == 0) {
        mq_group(a.ids, a.xrow, a.x_off, a.n_pairs, a.n_mat, a.n_x, a.max_tiles, a.rec);
        return;
    }
    const int row = (blockIdx.x - 1) * MQ_SEG + threadIdx.x / 32;
    if (row < a.n_x) mq_act_row(a.x, a.n_in, row, a.xh, a.xinv);
}

/* ---- 3. the product ---- */

struct mq_args {
    const uint8_t *w;         /* expert 0 (contiguous experts) */
    size_t mat_stride;        /* bytes between experts at w */
    const void *const *w_tab; /* device table expert -> matrix, or NULL */
    size_t row_bytes;
    int n_in, n_out;
    const __half *xh;    /* [n_x][n_in] f16, scaled per row */
    const float *xinv;   /* [n_x] the scale's inverse */
    const int32_t *xrow; /* or NULL: row x_off + p */
    int x_off;
    const int32_t *rec; /* mq_group's output */
    int max_tiles;
    float *y; /* [n_pairs][n_out] */
};

template <int T, int SKX = 0> static __global__ void __launch_bounds__(MQ_THREADS, 2) mq_kernel(const mq_args a) {
    using F = mmf<T>;
    using C = mq_cfg<T, SKX>;
    constexpr int SK = C::SK, RAWB = C::RAWB, NCH = C::NCH;
    extern __shared__ __align__(16) uint8_t smem[];
    uint8_t *raw = smem;                                     /* [2][TN][RAWB] */
    __half *xs = (__half *)(smem + 2 * MQ_TN * RAWB);        /* [TM][SK], chunks swizzled */
    __half *wh = xs + MQ_TM * SK;                            /* [TN][HK], chunks swizzled */
    int *tp = (int *)(wh + MQ_TN * MQ_HK), *tx = tp + MQ_TM; /* pair and x row per token */
    float *tinv = (float *)(tx + MQ_TM);

    if ((int)blockIdx.x >= a.rec[0]) return; /* past the real tile count */
    const int4 tile = ((const int4 *)(a.rec + 4))[blockIdx.x];
    const int e = tile.x, cnt = tile.z;
    const int32_t *sorted = a.rec + 4 + 4 * (size_t)a.max_tiles;
    const int n0 = blockIdx.y * MQ_TN, tid = threadIdx.x;
    if (tid < cnt) {
        const int p = sorted[tile.y + tid];
        tp[tid] = p;
        if (e >= 0) {
            const int r = a.xrow ? a.xrow[p] : a.x_off + p;
            tx[tid] = r;
            tinv[tid] = a.xinv[r];
        }
    }
    __syncthreads();
    if (e < 0) { /* pairs handled elsewhere: zeros */
        for (int i = tid; i < cnt * MQ_TN; i += MQ_THREADS) {
            const int t = i / MQ_TN, r = n0 + i % MQ_TN;
            if (r < a.n_out) a.y[(size_t)tp[t] * a.n_out + r] = 0.0f;
        }
        return;
    }
    const uint8_t *wm = a.w_tab ? (const uint8_t *)a.w_tab[e] : a.w + (size_t)e * a.mat_stride;
    const int n_st = a.n_in / SK;

    /* raw bytes of stage s: each row's span from its 16-byte aligned start */
    auto issue_raw = [&](int s) {
        uint8_t *dst = raw + (s & 1) * MQ_TN * RAWB;
        for (int i = tid; i < MQ_TN * NCH; i += MQ_THREADS) {
            const int r = i / NCH, ch = i % NCH;
            if (n0 + r >= a.n_out) continue;
            const uintptr_t src = (uintptr_t)(wm + (size_t)(n0 + r) * a.row_bytes + (size_t)s * C::SB);
            const uintptr_t lo = src & ~(uintptr_t)15, c0 = lo + 16 * (uintptr_t)ch, end = src + C::SB;
            if (c0 < end) /* from the aligned word before the span's start; nothing past its end */
                mq_cp16n(dst + r * RAWB + 16 * ch, (const void *)c0, end - c0 < 16 ? (unsigned)(end - c0) : 16u);
        }
    };
    /* activation columns [s*SK, (s+1)*SK) of the tile's tokens */
    auto issue_x = [&](int s) {
        for (int i = tid; i < cnt * (SK / 8); i += MQ_THREADS) {
            const int t = i / (SK / 8), ch = i % (SK / 8);
            mq_cp16(xs + t * SK + ((ch ^ (t & 7)) << 3), a.xh + (size_t)tx[t] * a.n_in + (size_t)s * SK + ch * 8);
        }
    };

    /* warp w: rows 32w..32w+31 (2 x m16) of every token (8 x n8): all four
     * warps, hence all four tensor units of the SM, work for any count */
    const int warp = tid / 32, lane = tid % 32;
    const int nt_act = (cnt + 7) / 8; /* 8-token groups with tokens */
    float acc[2][8][4];
#pragma unroll
    for (int i = 0; i < 2; i++)
#pragma unroll
        for (int j = 0; j < 8; j++) acc[i][j][0] = acc[i][j][1] = acc[i][j][2] = acc[i][j][3] = 0.0f;

    issue_raw(0);
    mq_commit();
    for (int s = 0; s < n_st; s++) {
        issue_x(s); /* the previous stage's products are done with xs (barrier below) */
        mq_commit();
        if (s + 1 < n_st) issue_raw(s + 1); /* its buffer was last decoded in stage s-1 */
        mq_commit();
        mq_wait<2>(); /* raw stage s is here (x of s and raw s+1 may still fly) */
        __syncthreads();
        const uint8_t *rs = raw + (s & 1) * MQ_TN * RAWB;
#pragma unroll 1
        for (int q = 0; q < SK / MQ_HK; q++) {
            /* decode: 128 rows x 2 units, a warp takes 32 rows of one unit */
#pragma unroll
            for (int it = 0; it < 2; it++) {
                const int r = tid, j = it, uq = q * (MQ_HK / 32) + j;
                if (n0 + r >= a.n_out) continue;
                const uintptr_t src = (uintptr_t)(wm + (size_t)(n0 + r) * a.row_bytes + (size_t)s * C::SB);
                const uint8_t *blk = rs + r * RAWB + (src & 15) + (uq / F::UPB) * F::BYTES;
                mm_unit u;
                F::unit(blk, uq % F::UPB, u);
                uint32_t o[16];
                mq_unit_f16<F>(u, o);
#pragma unroll
                for (int c = 0; c < 4; c++)
                    *(uint4 *)(wh + r * MQ_HK + (((4 * j + c) ^ (r & 7)) << 3)) =
                        make_uint4(o[4 * c], o[4 * c + 1], o[4 * c + 2], o[4 * c + 3]);
            }
            if (q == 0) mq_wait<1>(); /* this stage's activations */
            __syncthreads();
#pragma unroll
            for (int kk = 0; kk < MQ_HK; kk += 16) {
                uint32_t af[2][4], bf[8][2];
#pragma unroll
                for (int i = 0; i < 2; i++) {
                    const int row = warp * 32 + i * 16 + (lane & 7) + ((lane >> 3) & 1) * 8;
                    const int kc = (kk >> 3) + (lane >> 4);
                    mq_ldsm4(af[i], wh + row * MQ_HK + ((kc ^ (row & 7)) << 3));
                }
#pragma unroll
                for (int jj = 0; jj < 4; jj++) {
                    if (2 * jj >= nt_act) break;
                    const int t = jj * 16 + (lane & 7) + ((lane >> 4) << 3);
                    const int kc = ((q * MQ_HK + kk) >> 3) + ((lane >> 3) & 1);
                    uint32_t r4[4];
                    mq_ldsm4(r4, xs + t * SK + ((kc ^ (t & 7)) << 3));
                    bf[2 * jj][0] = r4[0], bf[2 * jj][1] = r4[1];
                    bf[2 * jj + 1][0] = r4[2], bf[2 * jj + 1][1] = r4[3];
                }
#pragma unroll
                for (int j = 0; j < 8; j++) {
                    if (j >= nt_act) break;
#pragma unroll
                    for (int i = 0; i < 2; i++) mma16816(acc[i][j], af[i], bf[j][0], bf[j][1]);
                }
            }
            __syncthreads(); /* wh (and, after the last phase, xs and this raw stage) free */
        }
    }

    /* rows g, g+8 of each 16; tokens 2c, 2c+1 of each 8 */
    const int g = lane / 4, c = lane % 4;
#pragma unroll
    for (int j = 0; j < 8; j++) {
        if (j >= nt_act) break;
        float *yr[2];
        float sc[2];
#pragma unroll
        for (int k = 0; k < 2; k++) { /* this thread's two tokens of the group (NULL: past the count) */
            const int t = j * 8 + 2 * c + k;
            yr[k] = t < cnt ? a.y + (size_t)tp[t] * a.n_out : NULL;
            sc[k] = t < cnt ? tinv[t] : 0.0f;
        }
#pragma unroll
        for (int i = 0; i < 2; i++)
#pragma unroll
            for (int h = 0; h < 2; h++) {
                const int row = n0 + warp * 32 + i * 16 + g + 8 * h;
                if (row >= a.n_out) continue;
#pragma unroll
                for (int k = 0; k < 2; k++)
                    if (yr[k]) yr[k][row] = acc[i][j][2 * h + k] * sc[k];
            }
    }
}

/* ---- host side ---- */

/* Type T's kernel, which mq_fits said the shape and card take. */
template <int T, int SKX = 0> static void mq_launch(const mq_args &a, int dev, dim3 grid, cudaStream_t s) {
    using C = mq_cfg<T, SKX>;
    static int ready[MQ_MAX_DEV]; /* the shared-memory attribute, set once per device */
    if (!ready[dev]) {
        CUDA_CHECK(cudaFuncSetAttribute(mq_kernel<T, SKX>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)C::SMEM));
        CUDA_CHECK(cudaFuncSetAttribute(mq_kernel<T, SKX>, cudaFuncAttributePreferredSharedMemoryCarveout,
                                        (int)cudaSharedmemCarveoutMaxShared));
        ready[dev] = 1;
    }
    mq_kernel<T, SKX><<<grid, MQ_THREADS, C::SMEM, s>>>(a);
    CUDA_LAUNCH_CHECK();
}

/* Whether type t can take the path for rows of n_in on a device with this
 * much opt-in shared memory per block. */
static int mq_fits(qt_type t, int n_in, int smem_optin) {
    switch ((int)t) {
#define MQ_CASE(T)                                                                                                     \
    case T: return n_in % mq_cfg<T>::SK == 0 && (size_t)smem_optin >= mq_cfg<T>::SMEM;
        MM_QUANT_TYPES(MQ_CASE)
#undef MQ_CASE
    default: return 0;
    }
}

/* MXFP4 rows that its own 256-weight stages do not divide but MQ_SK_ALT does (gpt-oss's 2880). */
static int mq_fits_alt(qt_type t, int n_in, int smem_optin) {
    using C = mq_cfg<QT_MXFP4, MQ_SK_ALT>;
    return t == QT_MXFP4 && n_in % C::SK == 0 && (size_t)smem_optin >= C::SMEM;
}

/* Most tiles np pairs over n_mat experts (+ the zeros bucket) can make:
 * each holds at least one pair, and each bucket adds at most one partial. */
static int mq_max_tiles(int np, int n_mat) {
    const int b = (np + MQ_TM - 1) / MQ_TM + n_mat + 1;
    return np < b ? np : b;
}

int mm_moe_mma(const st_weight *w, const void *const *d_mat, const int32_t *d_ids, const int32_t *d_xrow, int n_pairs,
               const float *x, int n_x, float *y, cudaStream_t s) {
    static int cc[MQ_MAX_DEV], optin[MQ_MAX_DEV]; /* per device: compute capability major, shared memory */
    int dev = 0;
    CUDA_CHECK(cudaGetDevice(&dev));
    if (dev < 0 || dev >= MQ_MAX_DEV || w->n_mat > MM_MOE_MMA_MAX_MAT || n_pairs <= 0 || n_x <= 0) return 1;
    if (!cc[dev]) {
        CUDA_CHECK(cudaDeviceGetAttribute(&cc[dev], cudaDevAttrComputeCapabilityMajor, dev));
        CUDA_CHECK(cudaDeviceGetAttribute(&optin[dev], cudaDevAttrMaxSharedMemoryPerBlockOptin, dev));
    }
    const int n_in = (int)w->n_in, n_out = (int)w->n_out, n_mat = (int)w->n_mat;
    const int alt = cc[dev] >= 8 && !mq_fits(w->type, n_in, optin[dev]) && mq_fits_alt(w->type, n_in, optin[dev]);
    if (cc[dev] < 8 || !(alt || mq_fits(w->type, n_in, optin[dev])) || (n_out + MQ_TN - 1) / MQ_TN > 65535) return 1;

    /* scratch: f16 x in xb; in rec the per-row scales, then per chunk the
     * tile count, the tiles and the sorted pairs */
    const int chunk = n_pairs < MM_MOE_MMA_MAX_PAIRS ? n_pairs : MM_MOE_MMA_MAX_PAIRS;
    const size_t x_ints = ((size_t)n_x + 3) & ~(size_t)3; /* the scales, padded so that the tiles are int4-aligned */
    const size_t rec_ints = x_ints + 4 + 4 * (size_t)mq_max_tiles(chunk, n_mat) + (size_t)chunk;
    mm_scratch *sc = mm_scratch_get(s, 0, 0, 0, (size_t)n_x * n_in * 2, 0, rec_ints * 4);
    if (!sc) return -1;
    __half *xh = (__half *)sc->xb;
    float *xinv = (float *)sc->rec;
    int32_t *rec = sc->rec + x_ints;

    mq_args a;
    a.w = (const uint8_t *)w->data;
    a.mat_stride = (size_t)n_out * w->row_bytes;
    a.w_tab = d_mat;
    a.row_bytes = w->row_bytes;
    a.n_in = n_in, a.n_out = n_out;
    a.xh = xh, a.xinv = xinv, a.rec = rec;
    for (int p0 = 0; p0 < n_pairs; p0 += chunk) {
        const int np = n_pairs - p0 < chunk ? n_pairs - p0 : chunk;
        const int mt = mq_max_tiles(np, n_mat);
        const size_t gsm = (size_t)MQ_SEG * (n_mat + 1) * sizeof(uint16_t);
        const mq_prep_args pa = {d_ids + p0, d_xrow ? d_xrow + p0 : NULL, p0, np, n_mat, n_x, mt, rec, x, n_in, xh,
                                 xinv};
        const unsigned conv = p0 == 0 ? st_div_up((size_t)n_x, MQ_SEG) : 0; /* x is converted once */
        mq_prep_kernel<<<1 + conv, MQ_GT, gsm, s>>>(pa);
        CUDA_LAUNCH_CHECK();
        a.xrow = d_xrow ? d_xrow + p0 : NULL;
        a.x_off = p0;
        a.max_tiles = mt;
        a.y = y + (size_t)p0 * n_out;
        const dim3 grid((unsigned)mt, (unsigned)((n_out + MQ_TN - 1) / MQ_TN));
        if (alt) {
            mq_launch<QT_MXFP4, MQ_SK_ALT>(a, dev, grid, s);
            continue;
        }
        switch ((int)w->type) {
#define MQ_CASE(T)                                                                                                     \
    case T: mq_launch<T>(a, dev, grid, s); break;
            MM_QUANT_TYPES(MQ_CASE)
#undef MQ_CASE
        default: ST_ASSERT(!"a type mq_fits took has a kernel");
        }
    }
    return 0;
}

#else /* STRATA_HIP: no tensor-core path; the host-grouped one runs */

int mm_moe_mma(const st_weight *w, const void *const *d_mat, const int32_t *d_ids, const int32_t *d_xrow, int n_pairs,
               const float *x, int n_x, float *y, cudaStream_t s) {
    (void)w, (void)d_mat, (void)d_ids, (void)d_xrow, (void)n_pairs, (void)x, (void)n_x, (void)y, (void)s;
    return 1;
}

#endif
