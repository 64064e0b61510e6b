/* The matrix-vector kernels (see mmv.cu for the design), as templates over
 * the weight type T, the tokens per pass NT and the rows per warp R. The
 * instantiations are spread over mmv_legacy.cu, mmv_k.cu, mmv_iq.cu,
 * mmv_float.cu and mmv_pair.cu (two types in one launch) so that they
 * compile in parallel.
 *
 * R rows per warp: every lane loads its unit's int8 activations once and
 * uses them for R rows. With R = 1 the activations (32 bytes + 8 of scales
 * per unit and token) cost L1 more traffic than the 4-bit weights they
 * multiply (18 bytes per unit), and the lab measured the kernel at under
 * half the HBM ceiling on large matrices; R > 1 divides that traffic by R.
 */
#ifndef STRATA_BACKEND_CUDA_MMV_KERNEL_CUH
#define STRATA_BACKEND_CUDA_MMV_KERNEL_CUH

#include <type_traits>

#include "backend/cuda/mm/mm_impl.cuh"
#include "backend/cuda/mm/quant_cuda.cuh"

template <int NT> struct mm_group {
    int e, n;
    int arow[NT], orow[NT];
};

template <int NT> static __device__ __forceinline__ mm_group<NT> mm_group_get(const mm_mmv_args &p) {
    mm_group<NT> g;
    const int gi = blockIdx.y;
    if (p.groups == MM_GROUPS_PAIRS) {
        g.e = p.ids[gi];
        g.n = 1;
        g.arow[0] = p.xrow ? p.xrow[gi] : gi;
        g.orow[0] = gi;
#pragma unroll
        for (int t = 1; t < NT; t++) g.arow[t] = g.orow[t] = 0;
    } else if (p.groups == MM_GROUPS_REC) {
        const int32_t *r = p.rec + (size_t)gi * MM_REC;
        g.e = r[0];
        g.n = r[1];
#pragma unroll
        for (int t = 0; t < NT; t++) {
            g.arow[t] = r[2 + t];
            g.orow[t] = r[2 + MM_NT_MAX + t];
        }
    } else {
        g.e = p.mat;
        g.n = p.n_tok;
#pragma unroll
        for (int t = 0; t < NT; t++) g.arow[t] = g.orow[t] = t;
    }
    return g;
}

/* The matrix a block works on: the launch's, or one of its more[] (jobs of
 * one input, DENSE), with the block's index within that matrix's blocks. */
struct mm_mat {
    const uint8_t *w;
    float *y, *y_add;
    const float *b;
    size_t row_bytes;
    int n_out, bx;
};

static __device__ __forceinline__ mm_mat mm_mat_of(const mm_mmv_args &p) {
    mm_mat m = {p.w, p.y, p.y_add, p.b, p.row_bytes, p.n_out, (int)blockIdx.x};
    for (int i = 0; i < p.n_more; i++)
        if (blockIdx.x >= p.more[i].blk0)
            m = {p.more[i].w,
                 p.more[i].y,
                 p.more[i].y_add,
                 p.more[i].b,
                 p.more[i].row_bytes,
                 p.more[i].n_out,
                 (int)(blockIdx.x - p.more[i].blk0)};
    return m;
}

static __device__ __forceinline__ const uint8_t *mm_matrix(const mm_mmv_args &p, const mm_mat &m, int e) {
    return p.w_tab ? (const uint8_t *)p.w_tab[e] : m.w + (size_t)e * p.mat_stride;
}

/* Writes the warp's sums (lane 0) plus the row's bias when given, or zeros
 * for an expert handled elsewhere (acc stays 0 then; pairs carry no bias);
 * adds them into y_add too when given (one lane writes each row: no race). */
template <int NT, int R>
static __device__ __forceinline__ void mm_store(const mm_mmv_args &p, const mm_mat &m, const mm_group<NT> &g, int row0,
                                                float (&acc)[R][NT]) {
#pragma unroll
    for (int r = 0; r < R; r++)
#pragma unroll
        for (int t = 0; t < NT; t++) acc[r][t] = warp_sum(acc[r][t]);
    if ((threadIdx.x & 31) == 0) {
#pragma unroll
        for (int r = 0; r < R; r++)
#pragma unroll
            for (int t = 0; t < NT; t++)
                if (t < g.n && row0 + r < m.n_out) {
                    const size_t o = (size_t)g.orow[t] * m.n_out + row0 + r;
                    const float v = m.b ? acc[r][t] + m.b[row0 + r] : acc[r][t];
                    m.y[o] = v;
                    if (m.y_add) m.y_add[o] += v;
                }
    }
}

/* ---- quantized weights ---- */

/* The 32 int8 activations of unit gu of activation row `row`. */
static __device__ __forceinline__ void mm_load_act(const mm_mmv_args &p, int row, int gu, int a[8]) {
    ld_unit(p.aq + (size_t)row * p.n_in, gu, a);
}

template <int T, int NT, int R>
static __device__ __forceinline__ void mmv_q_body(const mm_mmv_args &p, const mm_mat &m) {
    using F = mmf<T>;
    const int row0 = (m.bx * MMV_WARPS + threadIdx.y) * R;
    if (row0 >= m.n_out) return; /* whole warp */
    const mm_group<NT> g = mm_group_get<NT>(p);
    float acc[R][NT];
#pragma unroll
    for (int r = 0; r < R; r++)
#pragma unroll
        for (int t = 0; t < NT; t++) acc[r][t] = 0.0f;
    if (g.e >= 0) {
        const uint8_t *w0 = mm_matrix(p, m, g.e) + (size_t)row0 * m.row_bytes;
        const int n_units = p.n_in / 32;
        /* two units per lane in flight: with one, a warp waits a full memory
         * latency per unit, and decode launches have too few warps to hide it */
#pragma unroll 2
        for (int gu = threadIdx.x; gu < n_units; gu += 32) {
            const uint8_t *blk = w0 + (size_t)(gu / F::UPB) * F::BYTES;
            if constexpr (R == 1) {
                /* one row: decode, then each token's activations in turn
                 * (holding all 8 tokens' words at once costs ~90 registers) */
                mm_unit w;
                F::unit(blk, gu % F::UPB, w);
#pragma unroll
                for (int t = 0; t < NT; t++) {
                    if (t == 0 || t < g.n) { /* a group has a token: no branch for NT = 1 */
                        int a[8];
                        mm_load_act(p, g.arow[t], gu, a);
                        acc[0][t] += mm_unit_dot<F>(w, a, p.ad[(size_t)g.arow[t] * n_units + gu]);
                    }
                }
            } else {
                int a[NT][8];
                float2 ds[NT];
#pragma unroll
                for (int t = 0; t < NT; t++) {
                    if (t == 0 || t < g.n) {
                        mm_load_act(p, g.arow[t], gu, a[t]);
                        ds[t] = p.ad[(size_t)g.arow[t] * n_units + gu];
                    }
                }
#pragma unroll
                for (int r = 0; r < R; r++) {
                    if (row0 + r < m.n_out) {
                        mm_unit w;
                        F::unit(blk + (size_t)r * m.row_bytes, gu % F::UPB, w);
#pragma unroll
                        for (int t = 0; t < NT; t++)
                            if (t == 0 || t < g.n) acc[r][t] += mm_unit_dot<F>(w, a[t], ds[t]);
                    }
                }
            }
        }
    }
    mm_store<NT, R>(p, m, g, row0, acc);
}

template <int T, int NT, int R>
static __global__ void __launch_bounds__(MMV_WARPS * 32) mmv_q_kernel(const mm_mmv_args p) {
    pdl_enter(); /* first: see st_launch (common.cuh) */
    mmv_q_body<T, NT, R>(p, mm_mat_of(p));
}

/* Two weight types in one launch (q/k of one type and v of another): the
 * jobs from more[p.t2] on are of type T2. A block's type is uniform, so the
 * branch costs nothing but the registers of the larger body. */
template <int T, int T2, int NT, int R>
static __global__ void __launch_bounds__(MMV_WARPS * 32) mmv_q2_kernel(const mm_mmv_args p) {
    pdl_enter(); /* first: see st_launch (common.cuh) */
    const mm_mat m = mm_mat_of(p);
    if (blockIdx.x < p.more[p.t2].blk0) mmv_q_body<T, NT, R>(p, m);
    else mmv_q_body<T2, NT, R>(p, m);
}

/* ---- float weights: 8 per lane per step (V = 8) or 1 when rows are not 16-byte multiples ---- */

static __device__ __forceinline__ void mm_load8(const float *w, float *o) {
    const float4 a = ((const float4 *)w)[0], b = ((const float4 *)w)[1];
    o[0] = a.x, o[1] = a.y, o[2] = a.z, o[3] = a.w, o[4] = b.x, o[5] = b.y, o[6] = b.z, o[7] = b.w;
}
static __device__ __forceinline__ void mm_load8(const __half *w, float *o) {
    const uint4 v = *(const uint4 *)w;
    const uint32_t u[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
    for (int i = 0; i < 4; i++) {
        const float2 f = __half22float2(*(const __half2 *)&u[i]);
        o[2 * i] = f.x, o[2 * i + 1] = f.y;
    }
}
static __device__ __forceinline__ void mm_load8(const uint16_t *w, float *o) { /* bf16 bits */
    const uint4 v = *(const uint4 *)w;
    const uint32_t u[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
    for (int i = 0; i < 4; i++)
        o[2 * i] = __uint_as_float(u[i] << 16), o[2 * i + 1] = __uint_as_float(u[i] & 0xFFFF0000u);
}
static __device__ __forceinline__ float mm_load1(const float *w) { return *w; }
static __device__ __forceinline__ float mm_load1(const __half *w) { return __half2float(*w); }
static __device__ __forceinline__ float mm_load1(const uint16_t *w) { return __uint_as_float((uint32_t)*w << 16); }

template <typename WT, int V, int NT, int R>
static __global__ void __launch_bounds__(MMV_WARPS * 32) mmv_f_kernel(const mm_mmv_args p) {
    pdl_enter();                   /* first: see st_launch (common.cuh) */
    const mm_mat m = mm_mat_of(p); /* the launch's own matrix: float products take no jobs */
    const int row0 = (blockIdx.x * MMV_WARPS + threadIdx.y) * R;
    if (row0 >= p.n_out) return;
    const mm_group<NT> g = mm_group_get<NT>(p);
    float acc[R][NT];
#pragma unroll
    for (int r = 0; r < R; r++)
#pragma unroll
        for (int t = 0; t < NT; t++) acc[r][t] = 0.0f;
    if (g.e >= 0) {
        const uint8_t *w0 = mm_matrix(p, m, g.e) + (size_t)row0 * p.row_bytes;
        /* four steps' loads in flight (see mmv_q_kernel): a router product has only n_out warps */
#pragma unroll 4
        for (int i = V * threadIdx.x; i < p.n_in; i += V * 32) {
            float xv[NT][V];
#pragma unroll
            for (int t = 0; t < NT; t++) {
                if (t < g.n) {
                    const float *xp = p.x + (size_t)g.arow[t] * p.n_in + i;
                    if constexpr (V == 8) mm_load8(xp, xv[t]);
                    else xv[t][0] = *xp;
                }
            }
#pragma unroll
            for (int r = 0; r < R; r++) {
                if (row0 + r < p.n_out) {
                    const WT *wr = (const WT *)(w0 + (size_t)r * p.row_bytes);
                    float w[V];
                    if constexpr (V == 8) mm_load8(wr + i, w);
                    else w[0] = mm_load1(wr + i);
#pragma unroll
                    for (int t = 0; t < NT; t++)
                        if (t < g.n)
#pragma unroll
                            for (int j = 0; j < V; j++) acc[r][t] = fmaf(w[j], xv[t][j], acc[r][t]);
                }
            }
        }
    }
    mm_store<NT, R>(p, m, g, row0, acc);
}

/* A few rows (a router: 128 rows of 2048): one block of MMV_WARPS warps per
 * row, the row split across all of its lanes, so that every lane's loads are
 * in flight at once; a warp per row left 32 blocks, each lane waiting two
 * memory latencies in turn (5.7 us on an H200 for the router above). Needs
 * the 8-wide loads (V = 8).
 * NORM (one token): x = RMSNorm(p.nx), made by each block in shared memory
 * (p.n_in floats of dynamic shared memory) instead of by a norm kernel
 * before; the grid's warps also write it out (p.ny, and p.naq / p.nad),
 * a block of 32 values each. */
template <typename WT, int NT, bool NORM = false>
static __global__ void __launch_bounds__(MMV_WARPS * 32) mmv_f_split_kernel(const mm_mmv_args p) {
    pdl_enter(); /* first: see st_launch (common.cuh) */
    __shared__ float part[MMV_WARPS][NT];
    const int row = blockIdx.x, tid = threadIdx.y * 32 + threadIdx.x;
    const mm_group<NT> g = mm_group_get<NT>(p);
    const float *xin = p.x;
    if constexpr (NORM) {
        static_assert(NT == 1, "the norm prologue is for one token");
        extern __shared__ __align__(16) float hs[]; /* read 8 wide (mm_load8) */
        __shared__ float red[ST_WARP];
        float ss = 0.0f;
        for (int i = tid; i < p.n_in; i += 32 * MMV_WARPS) {
            const float v = p.nx[i];
            hs[i] = v;
            ss += v * v;
        }
        const float sc = rms_scale(block_sum(ss, red), p.n_in, p.neps);
        for (int i = tid; i < p.n_in; i += 32 * MMV_WARPS) hs[i] = hs[i] * sc * p.nw[i];
        __syncthreads();
        xin = hs;
    }
    float acc[NT];
#pragma unroll
    for (int t = 0; t < NT; t++) acc[t] = 0.0f;
    if (g.e >= 0) {
        const WT *wr = (const WT *)(mm_matrix(p, mm_mat_of(p), g.e) + (size_t)row * p.row_bytes);
#pragma unroll 4
        for (int i = 8 * tid; i < p.n_in; i += 8 * 32 * MMV_WARPS) {
            float w[8];
            mm_load8(wr + i, w);
#pragma unroll
            for (int t = 0; t < NT; t++) {
                if (t < g.n) {
                    float xv[8];
                    mm_load8(xin + (size_t)g.arow[t] * p.n_in + i, xv);
#pragma unroll
                    for (int j = 0; j < 8; j++) acc[t] = fmaf(w[j], xv[j], acc[t]);
                }
            }
        }
    }
#pragma unroll
    for (int t = 0; t < NT; t++) {
        const float v = warp_sum(acc[t]);
        if (threadIdx.x == 0) part[threadIdx.y][t] = v;
    }
    __syncthreads();
    if (threadIdx.y == 0 && threadIdx.x < NT && threadIdx.x < g.n) {
        float v = 0.0f;
#pragma unroll
        for (int w = 0; w < MMV_WARPS; w++) v += part[w][threadIdx.x];
        p.y[(size_t)g.orow[threadIdx.x] * p.n_out + row] = p.b ? v + p.b[row] : v;
    }
    if constexpr (NORM) { /* h out, a block of 32 per warp over the whole grid: block 0 alone took 16 rounds */
        for (int qb = blockIdx.x * MMV_WARPS + threadIdx.y; qb < p.n_in / 32; qb += gridDim.x * MMV_WARPS) {
            const int i = qb * 32 + threadIdx.x;
            p.ny[i] = xin[i];
            if (p.naq) quant_block_store(xin[i], i, p.naq, p.nad);
        }
    }
}

/* ---- launch of one type: NT and R picked by the caller (mmv.cu) ---- */

/* fn(std::integral_constant<int, NT>) for the launch's tokens per pass:
 * NT = 1, 2, 4 or 8, the least that holds nt (mm_mmv_launch rounds nt so). */
template <typename Fn> static inline void mm_nt_dispatch(int nt, Fn &&fn) {
    if (nt <= 1) fn(std::integral_constant<int, 1>());
    else if (nt <= 2) fn(std::integral_constant<int, 2>());
    else if (nt <= 4) fn(std::integral_constant<int, 4>());
    else fn(std::integral_constant<int, 8>());
}

template <int NT, int R> static inline dim3 mmv_grid(const mm_mmv_args *a) {
    return dim3(st_div_up((size_t)a->n_out, (size_t)MMV_WARPS * R), (unsigned)a->n_groups);
}

/* A launch of several matrices: the blocks of each in turn, at R rows per
 * warp; T2 != T: the jobs from more[a->t2] on are of type T2. */
template <int T, int T2, int NT, int R> static void mmv_q_go(const mm_mmv_args *a, cudaStream_t s) {
    const dim3 block(32, MMV_WARPS);
    if (!a->n_more) {
        st_launch(mmv_q_kernel<T, NT, R>, mmv_grid<NT, R>(a), block, 0, s, *a);
        return;
    }
    mm_mmv_args b = *a;
    unsigned bx = st_div_up((size_t)a->n_out, (size_t)MMV_WARPS * R);
    for (int i = 0; i < a->n_more; i++) {
        b.more[i].blk0 = bx;
        bx += st_div_up((size_t)a->more[i].n_out, (size_t)MMV_WARPS * R);
    }
    if constexpr (T2 == T) st_launch(mmv_q_kernel<T, NT, R>, dim3(bx, (unsigned)a->n_groups), block, 0, s, b);
    else st_launch(mmv_q2_kernel<T, T2, NT, R>, dim3(bx, (unsigned)a->n_groups), block, 0, s, b);
}

/* R > 1 only for NT <= 2: more would cost registers (R x NT sums, NT x 8 words). */
template <int T, int T2, int NT> static void mmv_q_launch_nt(const mm_mmv_args *a, int r, cudaStream_t s) {
    if constexpr (NT <= 2) {
        if (r >= 4) {
            mmv_q_go<T, T2, NT, 4>(a, s);
            return;
        }
        if (r == 2) {
            mmv_q_go<T, T2, NT, 2>(a, s);
            return;
        }
    }
    mmv_q_go<T, T2, NT, 1>(a, s);
}

template <int T, int T2 = T> static void mmv_q_launch(const mm_mmv_args *a, int nt, int r, cudaStream_t s) {
    mm_nt_dispatch(nt, [&](auto NT) { mmv_q_launch_nt<T, T2, decltype(NT)::value>(a, r, s); });
}

#endif
