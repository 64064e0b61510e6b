/* Row and elementwise ops of the GPU backend: rmsnorm, qkv_prep (norms,
 * rotary embedding, cache write), act_mul, add, scale, and the MoE helpers (routing, gather, scatter-add).
 * Each matches the CPU backend's formula (cpu_backend.c) in float; where the
 * CPU sums in double (rmsnorm, routing softmax) a block tree sum in float is
 * well inside the tests' NMSE bounds.
 */
#include "backend/cuda/common.cuh"
#include "backend/cuda/ops.h"
#include "backend/cuda/route.cuh"

extern "C" {
#include "core/switches.h"
}
#include <string.h>

#if !defined(STRATA_HIP)
#define PDL_MAX_DEVICES 64
static signed char g_pdl[PDL_MAX_DEVICES]; /* 0 unknown, 1 on, -1 off */
#endif

int cuda_pdl_on(void) {
#if defined(STRATA_HIP)
    return 0;
#else
    static int asked = -1; /* the switch, read once: off (the default) costs no runtime call per launch */
    if (asked < 0) {
        const char *v = st_switch_get("STRATA_CUDA_PDL");
        asked = v && !strcmp(v, "1");
    }
    if (!asked) return 0;
    int dev = 0;
    if (cudaGetDevice(&dev) != cudaSuccess || dev < 0 || dev >= PDL_MAX_DEVICES) return 0;
    if (!g_pdl[dev]) {
        int major = 0;
        CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev));
        g_pdl[dev] = major >= 9 ? 1 : -1;
    }
    return g_pdl[dev] > 0;
#endif
}

#if !defined(STRATA_HIP)
static __global__ void pdl_probe_kernel(int *x, int v) {
    pdl_enter();
    if (threadIdx.x == 0 && blockIdx.x == 0) *x = *x * 2 + v;
}
#endif

/* Two dependent kernels through st_launch, directly and recorded in a graph:
 * x goes 0 -> 1 -> 4, then 9 -> 20. Any error or another value turns the
 * attribute off for this device with one warning, before a request meets it. */
void cuda_pdl_probe(cudaStream_t s) {
#if !defined(STRATA_HIP)
    if (!cuda_pdl_on()) return;
    int dev = 0, got = -1, *x = NULL;
    CUDA_CHECK(cudaGetDevice(&dev));
    CUDA_CHECK(cudaMalloc(&x, sizeof(int)));
    CUDA_CHECK(cudaMemsetAsync(x, 0, sizeof(int), s));
    cudaGraph_t g = NULL;
    cudaGraphExec_t ge = NULL;
    cudaLaunchAttribute at;
    const cudaLaunchConfig_t cfg = pdl_config(dim3(1), dim3(32), 0, s, &at);
    cudaError_t e = cudaLaunchKernelEx(&cfg, pdl_probe_kernel, x, 1);
    if (e == cudaSuccess) e = cudaLaunchKernelEx(&cfg, pdl_probe_kernel, x, 2);
    if (e == cudaSuccess) e = cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal);
    if (e == cudaSuccess) {
        cudaError_t e1 = cudaLaunchKernelEx(&cfg, pdl_probe_kernel, x, 1);
        if (e1 == cudaSuccess) e1 = cudaLaunchKernelEx(&cfg, pdl_probe_kernel, x, 2);
        e = cudaStreamEndCapture(s, &g);
        if (e == cudaSuccess) e = e1;
    }
    if (e == cudaSuccess) e = cudaGraphInstantiate(&ge, g, 0);
    if (e == cudaSuccess) e = cudaGraphLaunch(ge, s);
    if (e == cudaSuccess) e = cudaMemcpyAsync(&got, x, sizeof(int), cudaMemcpyDeviceToHost, s);
    if (e == cudaSuccess) e = cudaStreamSynchronize(s);
    if (ge) (void)cudaGraphExecDestroy(ge);
    if (g) (void)cudaGraphDestroy(g);
    (void)cudaFree(x);
    if (e != cudaSuccess || got != 20) {
        (void)cudaGetLastError();
        ST_WARN("GPU %d: programmatic dependent launch does not work here (%s): kernels launch one after another", dev,
                e != cudaSuccess ? cudaGetErrorString(e) : "wrong result");
        g_pdl[dev] = -1;
    }
#else
    (void)s;
#endif
}

#define MEM_GEN_DEVICES 64
static unsigned long long g_mem_gen[MEM_GEN_DEVICES]; /* per device: growth on one card re-records no other's graph */
unsigned long long cuda_mem_generation(int dev) {
    ST_ASSERT(dev >= 0 && dev < MEM_GEN_DEVICES);
    return __atomic_load_n(&g_mem_gen[dev], __ATOMIC_ACQUIRE);
}
void cuda_mem_grew(void) {
    int dev = 0;
    CUDA_CHECK(cudaGetDevice(&dev)); /* where the memory was just allocated */
    ST_ASSERT(dev >= 0 && dev < MEM_GEN_DEVICES);
    __atomic_add_fetch(&g_mem_gen[dev], 1, __ATOMIC_ACQ_REL);
}

void *cuda_scratch_reserve(cuda_scratch *sc, size_t bytes) {
    if (bytes > sc->bytes) {
        cuda_mem_grew();
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

/* One block per row: sum of squares, then scale. In place is safe: each
 * thread writes only the values it read, after the block's sum is known.
 * With res: x += res first (written back by the thread that read it).
 * With aq: the row quantized too (dim a multiple of 32, whole warps). */
static __global__ void rmsnorm_kernel(float *x, const float *res, const float *w, float *y, int dim, float eps,
                                      int8_t *aq, float2 *ad) {
    pdl_enter(); /* first: see st_launch (common.cuh) */
    __shared__ float red[32];
    float *xr = x + (size_t)blockIdx.x * dim;
    float *yr = y + (size_t)blockIdx.x * dim;
    const float *rr = res ? res + (size_t)blockIdx.x * dim : NULL;
    float ss = 0;
    for (int i = threadIdx.x; i < dim; i += blockDim.x) {
        float v = xr[i];
        if (rr) xr[i] = v += rr[i];
        ss += v * v;
    }
    ss = block_sum(ss, red);
    const float sc = rms_scale(ss, dim, eps);
    for (int i = threadIdx.x; i < dim; i += blockDim.x) {
        const float v = xr[i] * sc * w[i];
        yr[i] = v;
        if (aq) quant_block_store(v, (size_t)blockIdx.x * dim + i, aq, ad);
    }
}

/* quant_block_store's blocks when 8 consecutive lanes hold a block's 32
 * values, 4 each (lane % 8 = quarter-row): the same formula, bit for bit
 * (amax, d = amax / 127, q = round(v * 127 / amax), (d, d * sum q)). i:
 * the index of v.x, a multiple of 4. */
static __device__ __forceinline__ void quant_quad_store(float4 v, size_t i, int8_t *aq, float2 *ad) {
    float am = fmaxf(fmaxf(fabsf(v.x), fabsf(v.y)), fmaxf(fabsf(v.z), fabsf(v.w)));
#pragma unroll
    for (int o = 4; o > 0; o >>= 1) am = fmaxf(am, __shfl_xor_sync(ST_FULL_MASK, am, o));
    const float d = am / 127.0f, id = am > 0.0f ? 127.0f / am : 0.0f;
    const int q0 = __float2int_rn(v.x * id), q1 = __float2int_rn(v.y * id), q2 = __float2int_rn(v.z * id),
              q3 = __float2int_rn(v.w * id);
    *(char4 *)(aq + i) = make_char4((signed char)q0, (signed char)q1, (signed char)q2, (signed char)q3);
    int sum = q0 + q1 + q2 + q3;
#pragma unroll
    for (int o = 4; o > 0; o >>= 1) sum += __shfl_xor_sync(ST_FULL_MASK, sum, o);
    if ((threadIdx.x & 7) == 0) ad[i / 32] = make_float2(d, d * (float)sum);
}

/* rmsnorm_kernel for rows of dim % 256 == 0 values (up to 8192): a thread
 * per 8 values, two float4 of x (at 4 * tid and dim / 2 + 4 * tid), of res
 * and of w, all asked for before the sum, so a decode row waits for one
 * load instead of one per loop round (dim / 8 threads: a 2048-wide row
 * takes 8 warps, not 32). The same products as rmsnorm_kernel, in the
 * same order; only the sum of squares adds in another order. */
static __global__ void rmsnorm8_kernel(float *x, const float *res, const float *w, float *y, int dim, float eps,
                                       int8_t *aq, float2 *ad) {
    pdl_enter(); /* first: see st_launch (common.cuh) */
    __shared__ float red[32];
    const size_t r0 = (size_t)blockIdx.x * dim, i0 = 4 * (size_t)threadIdx.x, i1 = i0 + dim / 2;
    float4 a = *(const float4 *)(x + r0 + i0), b = *(const float4 *)(x + r0 + i1);
    const float4 wa = *(const float4 *)(w + i0), wb = *(const float4 *)(w + i1);
    if (res) {
        const float4 ra = *(const float4 *)(res + r0 + i0), rb = *(const float4 *)(res + r0 + i1);
        a.x += ra.x, a.y += ra.y, a.z += ra.z, a.w += ra.w;
        b.x += rb.x, b.y += rb.y, b.z += rb.z, b.w += rb.w;
        *(float4 *)(x + r0 + i0) = a, *(float4 *)(x + r0 + i1) = b;
    }
    float ss = a.x * a.x + a.y * a.y + a.z * a.z + a.w * a.w + b.x * b.x + b.y * b.y + b.z * b.z + b.w * b.w;
    ss = block_sum(ss, red);
    const float sc = rms_scale(ss, dim, eps);
    const float4 ya = make_float4(a.x * sc * wa.x, a.y * sc * wa.y, a.z * sc * wa.z, a.w * sc * wa.w);
    const float4 yb = make_float4(b.x * sc * wb.x, b.y * sc * wb.y, b.z * sc * wb.z, b.w * sc * wb.w);
    *(float4 *)(y + r0 + i0) = ya, *(float4 *)(y + r0 + i1) = yb;
    if (aq) quant_quad_store(ya, r0 + i0, aq, ad), quant_quad_store(yb, r0 + i1, aq, ad);
}

void cuda_rmsnorm(float *x, const float *res, const float *w, float *y, int dim, int n_rows, float eps, int8_t *aq,
                  float2 *ad, cudaStream_t s) {
    if (n_rows <= 0) return;
    ST_ASSERT(!aq || dim % 32 == 0);
    const int al = ((uintptr_t)x | (uintptr_t)w | (uintptr_t)y | (uintptr_t)res) % 16 == 0; /* float4 loads */
    if (dim % 256 == 0 && dim <= 8192 && al) {
        st_launch(rmsnorm8_kernel, dim3((unsigned)n_rows), dim3((unsigned)dim / 8), 0, s, x, res, w, y, dim, eps, aq,
                  ad);
        return;
    }
    int th = dim >= 1024 ? 1024 : dim >= 256 ? 256 : 64;
    st_launch(rmsnorm_kernel, dim3((unsigned)n_rows), dim3(th), 0, s, x, res, w, y, dim, eps, aq, ad);
}

/* Rotary pair p of a head of hd values: its two places (p and p + hd/2 when
 * neox, 2p and 2p + 1 otherwise). */
static __device__ __forceinline__ int2 rope_places(int p, int hd, int neox) {
    return neox ? make_int2(p, p + hd / 2) : make_int2(2 * p, 2 * p + 1);
}

/* Cosine and sine of pair p at position pos. The angle is formed in double
 * as on the CPU: at positions of tens of thousands a float angle would
 * drift visibly. It is then reduced to [-pi, pi] in double and turned in
 * float (a few float ulps from the CPU's double sincos rounded to float):
 * double pow and sincos were most of the decode step's qkv_prep kernel.
 * freq_div: per-pair divisors, or NULL. */
static __device__ __forceinline__ void rope_cs(int pos, int p, int hd, float theta, float freq_scale,
                                               const float *freq_div, float *c, float *sn) {
    const double two_pi = 6.283185307179586476925;
    double a = (double)pos * freq_scale * exp2(-2.0 * p / hd * log2((double)theta));
    if (freq_div) a /= freq_div[p];
    sincosf((float)(a - two_pi * rint(a / two_pi)), sn, c);
}

/* qkv_prep (backend.h): one warp per head row of a token, over the q heads,
 * then the k heads, then the v heads. Lane l holds the pairs l, l + 32, ...
 * of its row in registers (a rotary pair p: values p and p + nr/2 when
 * neox, 2p and 2p + 1 otherwise, of the first nr = n_rot values; the
 * unrotated rest of the row in adjacent pairs after them), so the row is
 * read once, normalised (when the norm weights are given) and rotated
 * without a round trip through memory; k and v rows go to the cache (f16
 * rounded to nearest even; int8 with absmax / 127 per row as the scale, as
 * the CPU's lrintf: same float ops, same bits). When v is k (multi-head
 * latent attention: the row is its own value row) there are no v rows: the
 * rotated k row goes to both halves of the cache (one array when kv.v is
 * kv.k). The position comes from dpos (a recorded decode step) or pos0.
 * Formulas as in rmsnorm_kernel and rope_cs (rope_places). PP: pairs per
 * lane (hd <= 64 * PP). */
#define PREP_WARPS 4

static __device__ __forceinline__ int2 prep_places(int p, int nr, int neox) {
    const int hr = nr / 2;
    return p < hr ? rope_places(p, nr, neox) : make_int2(nr + 2 * (p - hr), nr + 2 * (p - hr) + 1);
}

/* A warp's row (its lanes' pairs v0, v1) into the cache row at base + off, f16 or int8 (scale at *scale). */
template <int PP>
static __device__ __forceinline__ void prep_store(int type, void *base, float *scale, size_t off, const float (&v0)[PP],
                                                  const float (&v1)[PP], int half, int nr, int neox, int lane) {
    if (type == ST_KV_F16) {
#pragma unroll
        for (int i = 0; i < PP; i++) {
            const int p = lane + 32 * i;
            const int2 at = prep_places(p, nr, neox);
            if (p >= half) continue;
            ((uint16_t *)base)[off + at.x] = __half_as_ushort(__float2half_rn(v0[i]));
            ((uint16_t *)base)[off + at.y] = __half_as_ushort(__float2half_rn(v1[i]));
        }
        return;
    }
    float amax = 0.0f;
#pragma unroll
    for (int i = 0; i < PP; i++) amax = fmaxf(amax, fmaxf(fabsf(v0[i]), fabsf(v1[i]))); /* 0 beyond the row */
    amax = warp_max(amax);
    float d;
    const float id = kv_q8_inv(amax, &d);
    if (lane == 0) *scale = d;
#pragma unroll
    for (int i = 0; i < PP; i++) {
        const int p = lane + 32 * i;
        const int2 at = prep_places(p, nr, neox);
        if (p >= half) continue;
        ((int8_t *)base)[off + at.x] = kv_q8(v0[i], id);
        ((int8_t *)base)[off + at.y] = kv_q8(v1[i], id);
    }
}

template <int PP, class R>
static __global__ void __launch_bounds__(PREP_WARPS * 32)
    qkv_prep_kernel(float *q, float *k, const float *v, const float *qn, const float *kn, float eps, int n_tok,
                    int n_head, st_kv_layer kv, int pos0, const int *dpos, float theta, float freq_scale, int neox,
                    const float *freq_div, int nr, const __grid_constant__ R rows) {
    pdl_enter(); /* first: see st_launch (common.cuh) */
    const int hd = kv.head_dim, half = hd / 2, hr = nr / 2, nkv = kv.n_head_kv, lane = threadIdx.x % 32;
    const int same = v == k, per_tok = n_head + (same ? 1 : 2) * nkv;
    const int r = blockIdx.x * PREP_WARPS + threadIdx.x / 32;
    if (r >= n_tok * per_tok) return; /* whole warp */
    const int t = r / per_tok, j = r % per_tok;
    const int kind = j < n_head         ? 0
                     : j < n_head + nkv ? 1
                                        : 2,
              h = kind == 0   ? j
                  : kind == 1 ? j - n_head
                              : j - n_head - nkv;
    int pos = (dpos ? *dpos : pos0) + t;
    if (rows.at(t, &kv, &pos0)) pos = pos0; /* row t: a sequence of its own */
    float *src =
        kind == 0 ? q + ((size_t)t * n_head + h) * hd : (kind == 1 ? k : (float *)v) + ((size_t)t * nkv + h) * hd;
    const float *nw = kind == 0 ? qn : kind == 1 ? kn : NULL;
    float v0[PP], v1[PP], w0[PP], w1[PP];
#pragma unroll
    for (int i = 0; i < PP; i++) {
        const int p = lane + 32 * i;
        const int2 at = prep_places(p, nr, neox);
        v0[i] = v1[i] = 0.0f, w0[i] = w1[i] = 1.0f;
        if (p < half) {
            v0[i] = src[at.x], v1[i] = src[at.y];
            if (nw) w0[i] = nw[at.x], w1[i] = nw[at.y];
        }
    }
    if (kind < 2) {
        float sc = 1.0f;
        if (nw) {
            float ss = 0.0f;
#pragma unroll
            for (int i = 0; i < PP; i++) ss += v0[i] * v0[i] + v1[i] * v1[i];
            sc = rms_scale(warp_sum(ss), hd, eps);
        }
#pragma unroll
        for (int i = 0; i < PP; i++) {
            const int p = lane + 32 * i;
            if (p >= half) continue;
            const float p0 = nw ? v0[i] * sc * w0[i] : v0[i], p1 = nw ? v1[i] * sc * w1[i] : v1[i];
            if (p < hr) { /* partial rotary: the pairs past n_rot keep their (normalised) values */
                float c, sn;
                rope_cs(pos, p, nr, theta, freq_scale, freq_div, &c, &sn);
                v0[i] = p0 * c - p1 * sn;
                v1[i] = p0 * sn + p1 * c;
            } else {
                v0[i] = p0, v1[i] = p1;
            }
        }
#pragma unroll
        for (int i = 0; i < PP; i++) { /* q and k rows are written back rotated (k for the prompt attention too) */
            const int p = lane + 32 * i;
            const int2 at = prep_places(p, nr, neox);
            if (p < half) src[at.x] = v0[i], src[at.y] = v1[i];
        }
        if (kind == 0) return;
    }
    /* k or v into the cache at pos; with v == k the k row into both (once when they are one array) */
    const size_t off = ((size_t)pos * nkv + h) * hd, srow = (size_t)pos * nkv + h;
    float *ksc = kv.k_scale ? kv.k_scale + srow : NULL, *vsc = kv.v_scale ? kv.v_scale + srow : NULL;
    if (kind == 1 || !same)
        prep_store<PP>(kv.type, kind == 1 ? kv.k : kv.v, kind == 1 ? ksc : vsc, off, v0, v1, half, nr, neox, lane);
    if (kind == 1 && same && kv.v != kv.k) prep_store<PP>(kv.type, kv.v, vsc, off, v0, v1, half, nr, neox, lane);
}

template <class R>
static void prep_launch(float *q, float *k, const float *v, const float *qn, const float *kn, float eps, int n_tok,
                        int n_head, const st_rope *rope, const st_kv_layer *kv, int pos0, const int *dpos,
                        const R &rows, cudaStream_t s) {
    const int n_rows = n_tok * (n_head + (v == k ? 1 : 2) * kv->n_head_kv);
    if (n_rows <= 0) return;
    const int hd = kv->head_dim, nr = rope->n_rot > 0 && rope->n_rot < hd ? rope->n_rot : hd;
    ST_ASSERT(hd <= 640 && hd % 2 == 0 && nr % 2 == 0); /* whole rotary pairs (model_load checks it) */
    const dim3 g((unsigned)st_div_up((size_t)n_rows, PREP_WARPS)), b(PREP_WARPS * 32);
#define PREP_L(PP)                                                                                                     \
    st_launch(qkv_prep_kernel<PP, R>, g, b, 0, s, q, k, v, qn, kn, eps, n_tok, n_head, *kv, pos0, dpos, rope->theta,   \
              rope->freq_scale, rope->neox, rope->freq_div, nr, rows)
    if (hd <= 128) PREP_L(2);
    else if (hd <= 512) PREP_L(8);
    else PREP_L(10); /* multi-head latent attention's 576 */
#undef PREP_L
}

void cuda_qkv_prep(float *q, float *k, const float *v, const float *qn, const float *kn, float eps, int n_tok,
                   int n_head, const st_rope *rope, st_kv_layer *kv, int pos0, const int *dpos, cudaStream_t s) {
    prep_launch(q, k, v, qn, kn, eps, n_tok, n_head, rope, kv, pos0, dpos, cuda_one_seq(), s);
}

void cuda_qkv_prep_seqs(float *q, float *k, const float *v, const float *qn, const float *kn, float eps, int n,
                        int n_head, const st_rope *rope, st_kv_layer *const *kv, int il, const int *pos,
                        const int *dpos, cudaStream_t s) {
    const size_t qw = (size_t)n_head * kv[0][il].head_dim, kvw = (size_t)kv[0][il].n_head_kv * kv[0][il].head_dim;
    for (int r0 = 0; r0 < n; r0 += CUDA_SEQ_ROWS) { /* a launch for every CUDA_SEQ_ROWS sequences */
        const int m = n - r0 < CUDA_SEQ_ROWS ? n - r0 : CUDA_SEQ_ROWS;
        prep_launch(q + r0 * qw, k + r0 * kvw, v == k ? k + r0 * kvw : v + r0 * kvw, qn, kn, eps, m, n_head, rope,
                    &kv[0][il], 0, NULL, cuda_seq_rows_of(kv, il, pos, dpos, r0, m), s);
    }
}

/* With aq: the output quantized too (n a multiple of 32: a warp's 32
 * values are one block, and every warp is whole). */
static __global__ void act_mul_kernel(int act, const float *g, const float *u, float *out, int64_t n, int8_t *aq,
                                      float2 *ad) {
    pdl_enter(); /* first: see st_launch (common.cuh) */
    int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
    if (i >= n) return;
    const float v = st_glu_value(act, g[i], u[i]);
    out[i] = v;
    if (aq) quant_block_store(v, (size_t)i, aq, ad);
}

void cuda_act_mul(st_act act, const float *g, const float *u, float *out, int64_t n, int8_t *aq, float2 *ad,
                  cudaStream_t s) {
    if (n <= 0) return;
    ST_ASSERT(!aq || n % 32 == 0);
    st_launch(act_mul_kernel, dim3(st_div_up((size_t)n, 256)), dim3(256), 0, s, (int)act, g, u, out, n, aq, ad);
}

static __global__ void add_kernel(float *x, const float *b, int64_t dim, int64_t n) {
    pdl_enter(); /* first: see st_launch (common.cuh) */
    int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
    if (i < n) x[i] += b[i % dim];
}

void cuda_add(float *x, const float *b, int64_t dim, int n_rows, cudaStream_t s) {
    int64_t n = dim * n_rows;
    if (n <= 0) return;
    st_launch(add_kernel, dim3(st_div_up((size_t)n, 256)), dim3(256), 0, s, x, b, dim, n);
}

static __global__ void scale_kernel(float *x, float sc, int64_t n) {
    pdl_enter(); /* first: see st_launch (common.cuh) */
    int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
    if (i < n) x[i] *= sc;
}

/* upload_many: blockIdx.y picks the range; a range's blocks stride over it
 * in 16-byte pieces where both ends allow (the expert matrices do), its
 * tail and any unaligned range a byte at a time. Each thread keeps four
 * loads in flight: the reads cross PCIe, ~1-2 us each. */
#define GATHER_MAX 32
struct gather_args {
    const uint8_t *src[GATHER_MAX];
    uint8_t *dst[GATHER_MAX];
    size_t bytes[GATHER_MAX];
};

__global__ void k_gather(const gather_args a) {
    const int i = blockIdx.y;
    const uint8_t *src = a.src[i];
    uint8_t *dst = a.dst[i];
    const size_t n = a.bytes[i], step = (size_t)gridDim.x * blockDim.x,
                 t = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    size_t done = 0;
    if ((((uintptr_t)src | (uintptr_t)dst) & 15) == 0) {
        const uint4 *s4 = (const uint4 *)src;
        uint4 *d4 = (uint4 *)dst;
        const size_t n16 = n / 16;
        size_t u = t;
        for (; u + 3 * step < n16; u += 4 * step) {
            const uint4 v0 = s4[u], v1 = s4[u + step], v2 = s4[u + 2 * step], v3 = s4[u + 3 * step];
            d4[u] = v0, d4[u + step] = v1, d4[u + 2 * step] = v2, d4[u + 3 * step] = v3;
        }
        for (; u < n16; u += step) d4[u] = s4[u];
        done = n16 * 16;
    }
    for (size_t b = done + t; b < n; b += step) dst[b] = src[b];
}

void cuda_gather_copy(int n, void *const *dst, const void *const *src, const size_t *bytes, cudaStream_t s) {
    for (int i0 = 0; i0 < n; i0 += GATHER_MAX) {
        const int m = n - i0 < GATHER_MAX ? n - i0 : GATHER_MAX;
        gather_args a;
        size_t most = 0;
        for (int j = 0; j < m; j++) {
            a.src[j] = (const uint8_t *)src[i0 + j], a.dst[j] = (uint8_t *)dst[i0 + j], a.bytes[j] = bytes[i0 + j];
            most = bytes[i0 + j] > most ? bytes[i0 + j] : most;
        }
        /* 256 threads of 4 x 16 bytes a block and pass: at most 64 blocks a range */
        const size_t per = (size_t)256 * 64;
        const unsigned bx = (unsigned)((most + per - 1) / per < 64 ? (most + per - 1) / per : 64);
        if (!bx) continue;
        k_gather<<<dim3(bx, (unsigned)m), 256, 0, s>>>(a);
        CUDA_LAUNCH_CHECK();
    }
}

void cuda_scale(float *x, float sc, int64_t n, cudaStream_t s) {
    if (n <= 0) return;
    st_launch(scale_kernel, dim3(st_div_up((size_t)n, 256)), dim3(256), 0, s, x, sc, n);
}

/* One block per token (route.cuh). */
static __global__ void moe_route_kernel(const float *logits, int n_expert, int k, st_moe_gating gt, int32_t *sel,
                                        float *wsel, int32_t *xrow) {
    pdl_enter();                     /* first: see st_launch (common.cuh) */
    extern __shared__ float probs[]; /* [n_expert] probabilities, then [n_expert] scores */
    __shared__ float red[ST_WARP];
    const int t = blockIdx.x;
    route_block(logits + (size_t)t * n_expert, n_expert, k, gt, probs, probs + n_expert, red, sel + (size_t)t * k,
                wsel + (size_t)t * k);
    if (xrow && (int)threadIdx.x < k) xrow[(size_t)t * k + threadIdx.x] = t;
}

void cuda_moe_route(const float *logits, int n_tok, int n_expert, int k, const st_moe_gating *gt, int32_t *sel,
                    float *wsel, int32_t *xrow, cudaStream_t s) {
    if (n_tok <= 0) return;
    const int th = n_expert >= 256 ? 256 : n_expert > 32 ? (n_expert + 31) / 32 * 32 : 32;
    ST_ASSERT(k <= th && gt->n_group <= ROUTE_MAX_GROUP && (gt->n_group <= 1 || n_expert % gt->n_group == 0));
    st_launch(moe_route_kernel, dim3((unsigned)n_tok), dim3(th), 2 * (size_t)n_expert * sizeof(float), s, logits,
              n_expert, k, *gt, sel, wsel, xrow);
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
static __global__ void scatter_add_kernel(float *out, const float *y, const int32_t *tok, const float *tw, int64_t dim,
                                          int64_t n) {
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

/* out[t][c] = sum_j wsel[t*k+j] * y[t*k+j][c], j in order as on the CPU. */
static __global__ void moe_combine_kernel(float *out, const float *y, const float *wsel, int k, int64_t dim,
                                          int64_t n) {
    pdl_enter(); /* first: see st_launch (common.cuh) */
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
    st_launch(moe_combine_kernel, dim3(st_div_up((size_t)n, 256)), dim3(256), 0, s, out, y, wsel, k, dim, n);
}

/* ids[p] = emap[sel[p]] (or sel[p] without a map); xrow[p] = p / k, the token of pair p. */
static __global__ void moe_remap_kernel(const int32_t *sel, const int32_t *emap, int32_t *ids, int32_t *xrow, int nk,
                                        int k) {
    const int p = blockIdx.x * blockDim.x + threadIdx.x;
    if (p >= nk) return;
    const int32_t e = sel[p];
    ids[p] = e < 0 ? -1 : emap ? emap[e] : e; /* -1: routed nowhere (NaN logits) */
    if (xrow) xrow[p] = p / k;
}

void cuda_moe_remap(const int32_t *sel, const int32_t *emap, int32_t *ids, int32_t *xrow, int n_tok, int k,
                    cudaStream_t s) {
    const int nk = n_tok * k;
    if (nk <= 0) return;
    st_launch(moe_remap_kernel, dim3(st_div_up((size_t)nk, 256)), dim3(256), 0, s, sel, emap, ids, xrow, nk, k);
}
