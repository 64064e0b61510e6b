/* What every .cu file of the GPU backend includes: the toolkit through
 * compat.h (CUDA or HIP), the Strata C headers with C linkage, and the two
 * checks of the third error tier (core/log.h): CUDA_CHECK around every
 * runtime call and CUDA_LAUNCH_CHECK after every kernel launch. A failed
 * device call is not recoverable in the middle of a forward pass, so both
 * print the call, the error string and file:line, then abort.
 */
#ifndef STRATA_BACKEND_CUDA_COMMON_CUH
#define STRATA_BACKEND_CUDA_COMMON_CUH

#include <stdio.h>
#include <stdlib.h>

#include "backend/cuda/compat.h"

/* C11's _Noreturn (core/log.h) is no C++ keyword: spell it as the attribute. */
#ifndef _Noreturn
#define _Noreturn __attribute__((noreturn))
#endif
extern "C" {
#include "backend/backend.h"
#include "core/log.h"
}

#define CUDA_CHECK(call)                                                                                               \
    do {                                                                                                               \
        cudaError_t err_ = (call);                                                                                     \
        if (err_ != cudaSuccess) {                                                                                     \
            fprintf(stderr, "CUDA error %s: %s at %s:%d\n", #call, cudaGetErrorString(err_), __FILE__, __LINE__);      \
            abort();                                                                                                   \
        }                                                                                                              \
    } while (0)

/* After a launch: configuration errors (no kernel image, too many threads,
 * too much shared memory) surface here, not at the next synchronisation. */
#define CUDA_LAUNCH_CHECK() CUDA_CHECK(cudaGetLastError())

#define CUBLAS_CHECK(call)                                                                                             \
    do {                                                                                                               \
        cublasStatus_t st_ = (call);                                                                                   \
        if (st_ != CUBLAS_STATUS_SUCCESS) {                                                                            \
            fprintf(stderr, "cuBLAS error %d in %s at %s:%d\n", (int)st_, #call, __FILE__, __LINE__);                  \
            abort();                                                                                                   \
        }                                                                                                              \
    } while (0)

/* Device scratch of the backend grows on demand (ops.h cuda_scratch, the
 * matrix products' per-device scratch); a recorded CUDA graph holds the old
 * addresses, so every growth bumps its device's count (cuda_mem_grew: the
 * current device's) and a graph recorded under another count of its device
 * is recorded again (backend_cuda.cu). */
unsigned long long cuda_mem_generation(int dev);
void cuda_mem_grew(void);

static inline unsigned st_div_up(size_t a, size_t b) { return (unsigned)((a + b - 1) / b); }

/* Sum over the 32 lanes of a warp; every lane gets the total. */
static __device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
    for (int o = ST_WARP / 2; o > 0; o >>= 1) v += __shfl_xor_sync(ST_FULL_MASK, v, o);
    return v;
}

static __device__ __forceinline__ float warp_max(float v) {
#pragma unroll
    for (int o = ST_WARP / 2; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(ST_FULL_MASK, v, o));
    return v;
}

/* Sum and max over a block (x and y dimensions; whole warps); every thread
 * gets the result. red: ST_WARP floats of shared memory (reusable right
 * after the call). */
template <typename Op> static __device__ __forceinline__ float block_reduce(float v, float *red, Op op, float id) {
    const int tid = threadIdx.y * blockDim.x + threadIdx.x, nth = blockDim.x * blockDim.y;
    const int lane = tid % ST_WARP, w = tid / ST_WARP, nw = (nth + ST_WARP - 1) / ST_WARP;
#pragma unroll
    for (int o = ST_WARP / 2; o > 0; o >>= 1) v = op(v, __shfl_xor_sync(ST_FULL_MASK, v, o));
    __syncthreads(); /* red may still be read by a previous call */
    if (lane == 0) red[w] = v;
    __syncthreads();
    v = lane < nw ? red[lane] : id;
#pragma unroll
    for (int o = ST_WARP / 2; o > 0; o >>= 1) v = op(v, __shfl_xor_sync(ST_FULL_MASK, v, o));
    return v;
}
struct op_add {
    __device__ float operator()(float a, float b) const { return a + b; }
};
struct op_max {
    __device__ float operator()(float a, float b) const { return fmaxf(a, b); }
};
static __device__ __forceinline__ float block_sum(float v, float *red) { return block_reduce(v, red, op_add(), 0.0f); }
static __device__ __forceinline__ float block_max(float v, float *red) {
    return block_reduce(v, red, op_max(), -INFINITY);
}

/* RMSNorm's scale from the sum of squares ss of n values: a float root,
 * a few float ulps from the CPU's double one and cheaper on the decode
 * step's critical path (rmsnorm_kernel, qkv_prep's head norms, the norm
 * the router product makes itself). */
static __device__ __forceinline__ float rms_scale(float ss, int n, float eps) { return rsqrtf(ss / n + eps); }

/* The int8 KV cache's rows (qkv_prep): per (position, KV head)
 * the scale d = amax / 127, each value round(v * (1 / d)); read back as d * q. */
static __device__ __forceinline__ float kv_q8_inv(float amax, float *d) {
    *d = amax / 127.0f;
    return *d > 0 ? 1.0f / *d : 0.0f;
}
static __device__ __forceinline__ int8_t kv_q8(float v, float id) { return (int8_t)__float2int_rn(__fmul_rn(v, id)); }

/* The int8 blocks of 32 the matrix-vector products read (mm_quantize_act's
 * formula: d = amax / 127, q = round(v * 127 / amax), and (d, d * sum q) per
 * block), written by a producer op as it writes v: a whole warp holds one
 * block of 32 consecutive values (lane = position in the block). */
static __device__ __forceinline__ void quant_block_store(float v, size_t i, int8_t *aq, float2 *ad) {
    const float amax = warp_max(fabsf(v));
    const float d = amax / 127.0f, id = amax > 0.0f ? 127.0f / amax : 0.0f;
    const int qv = __float2int_rn(v * id);
    aq[i] = (int8_t)qv;
    const int sum = (int)warp_sum((float)qv); /* |sum| <= 32 * 127: exact in float */
    if ((threadIdx.x & 31) == 0) ad[i / 32] = make_float2(d, d * (float)sum);
}

/* The 32 int8 values of unit gu (32 values) of a quantized activation row. */
static __device__ __forceinline__ void ld_unit(const int8_t *row, int gu, int a[8]) {
    const int4 *ap = (const int4 *)(row + 32 * (size_t)gu);
    const int4 a0 = ap[0], a1 = ap[1];
    a[0] = a0.x, a[1] = a0.y, a[2] = a0.z, a[3] = a0.w, a[4] = a1.x, a[5] = a1.y, a[6] = a1.z, a[7] = a1.w;
}

/* Programmatic dependent launch (sm_90+, CUDA only): a kernel launched by
 * st_launch may start while the kernel before it on the stream still runs,
 * so consecutive decode kernels overlap launch and ramp-up with the tail of
 * the previous one (inside a CUDA graph too). Every kernel st_launch starts
 * calls pdl_enter() first: it lets the next kernel launch at once, then
 * waits until every earlier kernel has finished and its writes are visible,
 * so nothing is read early. Launched without the attribute (the default,
 * other cards, HIP) the wait returns at once. Opt-in (STRATA_CUDA_PDL=1):
 * on an H200 it measured no faster (30B-A3B synth tg128 268 vs 273 tok/s
 * without; decode at 16K 141 with vs 192 tok/s in an earlier run without). */
static __device__ __forceinline__ void pdl_enter() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900 && !defined(STRATA_HIP)
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
    asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

/* Whether launches on the current device use the attribute (sm_90+ and
 * STRATA_CUDA_PDL=1); decided once per device (ops_elem.cu). */
int cuda_pdl_on(void);
/* Try it once on the current device at start; off there, with one warning, if it fails. */
void cuda_pdl_probe(cudaStream_t s);

#if !defined(STRATA_HIP)
/* A launch configuration with the programmatic-serialization attribute (at: its storage). */
static inline cudaLaunchConfig_t pdl_config(dim3 grid, dim3 block, size_t smem, cudaStream_t s,
                                            cudaLaunchAttribute *at) {
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = grid, cfg.blockDim = block, cfg.dynamicSmemBytes = smem, cfg.stream = s;
    at->id = cudaLaunchAttributeProgrammaticStreamSerialization;
    at->val.programmaticStreamSerializationAllowed = 1;
    cfg.attrs = at, cfg.numAttrs = 1;
    return cfg;
}
#endif

template <typename... K, typename... A>
static void st_launch(void (*kern)(K...), dim3 grid, dim3 block, size_t smem, cudaStream_t s, A... args) {
#if !defined(STRATA_HIP)
    if (cuda_pdl_on()) {
        cudaLaunchAttribute at;
        const cudaLaunchConfig_t cfg = pdl_config(grid, block, smem, s, &at);
        CUDA_CHECK(cudaLaunchKernelEx(&cfg, kern, args...));
        return;
    }
#endif
    kern<<<grid, block, smem, s>>>(args...);
    CUDA_LAUNCH_CHECK();
}

/* The rows of a decode step of several sequences, one token each, handed
 * to a kernel by value (__grid_constant__: read where they are, no copy):
 * row t's cache arrays and position, so that one launch serves every
 * sequence of the step (qkv_prep, attention). cuda_one_seq: the kernel's
 * own kv and position hold for all its rows (one sequence). */
#define CUDA_SEQ_ROWS 32
struct cuda_one_seq {
    __device__ bool at(int, st_kv_layer *, int *) const { return false; }
};
struct cuda_seq_rows {
    void *k[CUDA_SEQ_ROWS], *v[CUDA_SEQ_ROWS];
    float *ks[CUDA_SEQ_ROWS], *vs[CUDA_SEQ_ROWS];
    int pos[CUDA_SEQ_ROWS];
    const int *dpos; /* the rows' positions on the device (a recorded step), or NULL: pos */
    __device__ bool at(int t, st_kv_layer *kv, int *pos0) const {
        kv->k = k[t], kv->v = v[t], kv->k_scale = ks[t], kv->v_scale = vs[t];
        *pos0 = dpos ? dpos[t] : pos[t];
        return true;
    }
};
/* Rows [r0, r0 + n) (n <= CUDA_SEQ_ROWS) of the sequences' layer il; with
 * dpos (device), the kernels read the positions from dpos[r0..) instead. */
static inline cuda_seq_rows cuda_seq_rows_of(st_kv_layer *const *kv, int il, const int *pos, const int *dpos, int r0,
                                             int n) {
    cuda_seq_rows r = {};
    for (int i = 0; i < n; i++) {
        const st_kv_layer *l = &kv[r0 + i][il];
        r.k[i] = l->k, r.v[i] = l->v, r.ks[i] = l->k_scale, r.vs[i] = l->v_scale, r.pos[i] = pos[r0 + i];
    }
    r.dpos = dpos ? dpos + r0 : NULL;
    return r;
}

/* act(x) of st_act, as the CPU backend computes it: SiLU x / (1 + e^-x);
 * GELU in its tanh form. */
static __device__ __forceinline__ float st_act_value(int act, float x) {
    if (act == ST_ACT_SILU) return x / (1.0f + expf(-x));
    return 0.5f * x * (1.0f + tanhf(0.7978845608028654f * (x + 0.044715f * x * x * x)));
}

/* act(g) * u of st_act; gpt-oss's clamped SwiGLU (ST_ACT_SWIGLU_OAI) takes
 * both halves: g' = min(g, 7), u' = clamp(u, -7, 7), g' sigmoid(1.702 g') (u' + 1). */
static __device__ __forceinline__ float st_glu_value(int act, float g, float u) {
    if (act == ST_ACT_SWIGLU_OAI) {
        const float gc = fminf(g, ST_OAI_LIMIT), uc = fminf(fmaxf(u, -ST_OAI_LIMIT), ST_OAI_LIMIT);
        return gc / (1.0f + expf(-ST_OAI_ALPHA * gc)) * (uc + 1.0f);
    }
    return st_act_value(act, g) * u;
}

#endif
