/* Matrix-vector products for decode (1..8 tokens per pass over the weights),
 * every weight format, plus the activation quantizer they read.
 *
 * Quantized formats: one warp per output row; lane l takes the 32-weight
 * units l, l+32, ... of the row, decodes each to int8 (quant_cuda.cuh) once
 * and multiplies it with every token's int8 activations by dp4a; a warp sum
 * gives the row. Consecutive lanes read consecutive units, so a warp's loads
 * cover a contiguous span of the row. The kernel is memory-bound: the target
 * is the row bytes over the HBM read bandwidth (docs/cuda-kernels.md has the
 * measured fraction per format).
 *
 * Float formats read 8 weights (16 or 32 bytes) per lane per step and the f32
 * activations directly: no quantization error is added.
 *
 * Which tokens and which matrix a launch serves is a "group" (mm_impl.cuh):
 * a dense product is one group; the MoE decode path has one group per
 * (token, expert) pair with the expert id read on the device.
 */
#include "backend/cuda/mm_impl.cuh"
#include "backend/cuda/quant_cuda.cuh"

#define MMV_WARPS 4 /* rows per CTA */

int mm_is_float(qt_type t) { return t == QT_F32 || t == QT_F16 || t == QT_BF16; }

/* ---- activation quantizer: 8 threads per block of 32 values ---- */

static __global__ void mm_quantize_act_kernel(const float4 *__restrict__ x, int64_t n4, int *__restrict__ aq,
                                              float2 *__restrict__ ad) {
    const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    const float4 v = i < n4 ? x[i] : make_float4(0.f, 0.f, 0.f, 0.f);
    float amax = fmaxf(fmaxf(fabsf(v.x), fabsf(v.y)), fmaxf(fabsf(v.z), fabsf(v.w)));
#pragma unroll
    for (int o = 4; o > 0; o >>= 1) amax = fmaxf(amax, __shfl_xor_sync(ST_FULL_MASK, amax, o, 8));
    const float d = amax / 127.0f, id = amax > 0.0f ? 127.0f / amax : 0.0f;
    const int q0 = __float2int_rn(v.x * id), q1 = __float2int_rn(v.y * id);
    const int q2 = __float2int_rn(v.z * id), q3 = __float2int_rn(v.w * id);
    int sum = q0 + q1 + q2 + q3;
#pragma unroll
    for (int o = 4; o > 0; o >>= 1) sum += __shfl_xor_sync(ST_FULL_MASK, sum, o, 8);
    if (i < n4) {
        aq[i] = (q0 & 0xFF) | ((q1 & 0xFF) << 8) | ((q2 & 0xFF) << 16) | ((int)((unsigned)q3 << 24));
        if ((i & 7) == 0) ad[i >> 3] = make_float2(d, d * (float)sum);
    }
}

void mm_quantize_act(const float *x, int n_in, int n_rows, int8_t *aq, float2 *ad, cudaStream_t s) {
    const int64_t n4 = (int64_t)n_in * n_rows / 4;
    if (n4 == 0) return;
    mm_quantize_act_kernel<<<st_div_up((size_t)n4, 256), 256, 0, s>>>((const float4 *)x, n4, (int *)aq, ad);
    CUDA_LAUNCH_CHECK();
}

/* ---- group resolution, shared by both kernels ---- */

template <int NT>
struct mm_group {
    int e, n;
    int arow[NT], orow[NT];
};

template <int NT>
static __device__ __forceinline__ mm_group<NT> mm_group_get(const mm_mmv_args &p) {
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

static __device__ __forceinline__ const uint8_t *mm_matrix(const mm_mmv_args &p, int e) {
    return p.w_tab ? (const uint8_t *)p.w_tab[e] : p.w + (size_t)e * p.mat_stride;
}

/* Writes the warp's NT sums (lane 0), or zeros for an expert handled elsewhere. */
template <int NT>
static __device__ __forceinline__ void mm_store(const mm_mmv_args &p, const mm_group<NT> &g, int row, float *acc) {
#pragma unroll
    for (int t = 0; t < NT; t++) acc[t] = warp_sum(acc[t]);
    if ((threadIdx.x & 31) == 0) {
#pragma unroll
        for (int t = 0; t < NT; t++)
            if (t < g.n) p.y[(size_t)g.orow[t] * p.n_out + row] = acc[t];
    }
}

/* ---- quantized weights ---- */

template <int T, int NT>
static __global__ void __launch_bounds__(MMV_WARPS * 32) mmv_q_kernel(const mm_mmv_args p) {
    using F = mmf<T>;
    const int row = blockIdx.x * MMV_WARPS + threadIdx.y;
    if (row >= p.n_out) return; /* whole warp */
    const mm_group<NT> g = mm_group_get<NT>(p);
    float acc[NT];
#pragma unroll
    for (int t = 0; t < NT; t++) acc[t] = 0.0f;
    if (g.e >= 0) {
        const uint8_t *wrow = mm_matrix(p, g.e) + (size_t)row * p.row_bytes;
        const int n_units = p.n_in / 32;
        for (int gu = threadIdx.x; gu < n_units; gu += 32) {
            mm_unit w;
            F::unit(wrow + (size_t)(gu / F::UPB) * F::BYTES, gu % F::UPB, w);
#pragma unroll
            for (int t = 0; t < NT; t++) {
                if (t < g.n) {
                    const int4 *ap = (const int4 *)(p.aq + (size_t)g.arow[t] * p.n_in + 32 * gu);
                    const int4 a0 = ap[0], a1 = ap[1];
                    const int a[8] = {a0.x, a0.y, a0.z, a0.w, a1.x, a1.y, a1.z, a1.w};
                    acc[t] += mm_unit_dot<F>(w, a, p.ad[(size_t)g.arow[t] * n_units + gu]);
                }
            }
        }
    }
    mm_store<NT>(p, g, row, acc);
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
    for (int i = 0; i < 4; i++) o[2 * i] = __uint_as_float(u[i] << 16), o[2 * i + 1] = __uint_as_float(u[i] & 0xFFFF0000u);
}
static __device__ __forceinline__ float mm_load1(const float *w) { return *w; }
static __device__ __forceinline__ float mm_load1(const __half *w) { return __half2float(*w); }
static __device__ __forceinline__ float mm_load1(const uint16_t *w) { return __uint_as_float((uint32_t)*w << 16); }

template <typename WT, int V, int NT>
static __global__ void __launch_bounds__(MMV_WARPS * 32) mmv_f_kernel(const mm_mmv_args p) {
    const int row = blockIdx.x * MMV_WARPS + threadIdx.y;
    if (row >= p.n_out) return;
    const mm_group<NT> g = mm_group_get<NT>(p);
    float acc[NT];
#pragma unroll
    for (int t = 0; t < NT; t++) acc[t] = 0.0f;
    if (g.e >= 0) {
        const WT *wrow = (const WT *)(mm_matrix(p, g.e) + (size_t)row * p.row_bytes);
        for (int i = V * threadIdx.x; i < p.n_in; i += V * 32) {
            float w[V];
            if constexpr (V == 8) mm_load8(wrow + i, w);
            else w[0] = mm_load1(wrow + i);
#pragma unroll
            for (int t = 0; t < NT; t++) {
                if (t < g.n) {
                    const float *xp = p.x + (size_t)g.arow[t] * p.n_in + i;
                    float xv[V];
                    if constexpr (V == 8) mm_load8(xp, xv);
                    else xv[0] = *xp;
#pragma unroll
                    for (int j = 0; j < V; j++) acc[t] = fmaf(w[j], xv[j], acc[t]);
                }
            }
        }
    }
    mm_store<NT>(p, g, row, acc);
}

/* ---- launch ---- */

template <int NT>
static int mm_mmv_launch_nt(const mm_mmv_args *a, cudaStream_t s) {
    const dim3 block(32, MMV_WARPS), grid(st_div_up((size_t)a->n_out, MMV_WARPS), (unsigned)a->n_groups);
    if (mm_is_float(a->type)) {
        /* 8-wide loads need every weight row and x row start 16-byte aligned */
        const int vec = a->n_in % 8 == 0 && a->row_bytes % 16 == 0;
        if (a->type == QT_F32) {
            if (vec) mmv_f_kernel<float, 8, NT><<<grid, block, 0, s>>>(*a);
            else mmv_f_kernel<float, 1, NT><<<grid, block, 0, s>>>(*a);
        } else if (a->type == QT_F16) {
            if (vec) mmv_f_kernel<__half, 8, NT><<<grid, block, 0, s>>>(*a);
            else mmv_f_kernel<__half, 1, NT><<<grid, block, 0, s>>>(*a);
        } else {
            if (vec) mmv_f_kernel<uint16_t, 8, NT><<<grid, block, 0, s>>>(*a);
            else mmv_f_kernel<uint16_t, 1, NT><<<grid, block, 0, s>>>(*a);
        }
        CUDA_LAUNCH_CHECK();
        return 0;
    }
    switch ((int)a->type) {
#define MM_CASE(T)                                                                                           \
    case T:                                                                                                  \
        mmv_q_kernel<T, NT><<<grid, block, 0, s>>>(*a);                                                      \
        break;
        MM_QUANT_TYPES(MM_CASE)
#undef MM_CASE
    default:
        st_error_set("cuda_matmul: weight type %d has no CUDA matrix-vector kernel", (int)a->type);
        return -1;
    }
    CUDA_LAUNCH_CHECK();
    return 0;
}

int mm_mmv_launch(const mm_mmv_args *a, cudaStream_t s) {
    if (a->n_out == 0 || a->n_groups == 0) return 0;
    int nt = MM_NT_MAX;
    if (a->groups == MM_GROUPS_PAIRS) nt = 1;
    else if (a->groups == MM_GROUPS_DENSE) nt = a->n_tok;
    if (nt <= 1) return mm_mmv_launch_nt<1>(a, s);
    if (nt <= 2) return mm_mmv_launch_nt<2>(a, s);
    if (nt <= 4) return mm_mmv_launch_nt<4>(a, s);
    return mm_mmv_launch_nt<8>(a, s);
}
