/* Kernel lab helpers (dev/cuda/*.cu, see dev/cuda/README.md): checks, a
 * random generator, activation quantization on the host, event timing over
 * rotating buffers (so that repeated runs read HBM, not L2), and the read
 * bandwidth ceiling every matrix-vector kernel is compared against.
 * Header-only; each lab file is one translation unit built with
 *   nvcc -std=c++17 -O3 -arch=sm_90 -I src dev/cuda/<file>.cu
 */
#ifndef STRATA_DEV_CUDA_LAB_COMMON_CUH
#define STRATA_DEV_CUDA_LAB_COMMON_CUH

#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <algorithm>
#include <vector>

#define LAB_CHECK(call)                                                                                                \
    do {                                                                                                               \
        cudaError_t e_ = (call);                                                                                       \
        if (e_ != cudaSuccess) {                                                                                       \
            fprintf(stderr, "%s: %s (%s:%d)\n", #call, cudaGetErrorString(e_), __FILE__, __LINE__);                    \
            exit(1);                                                                                                   \
        }                                                                                                              \
    } while (0)

static uint64_t lab_rng = 0x243F6A8885A308D3ull;
static inline uint32_t lab_rand(void) {
    lab_rng ^= lab_rng << 13, lab_rng ^= lab_rng >> 7, lab_rng ^= lab_rng << 17;
    return (uint32_t)(lab_rng >> 16);
}
static inline float lab_unit(void) { return (float)(lab_rand() & 0xFFFFFF) / 16777216.0f; }
static inline float lab_gauss(void) { return sqrtf(-2.0f * logf(lab_unit() + 1e-7f)) * cosf(6.2831853f * lab_unit()); }

static inline float lab_f16_to_f32(uint16_t h) {
    const uint32_t s = (uint32_t)(h & 0x8000) << 16, e = (h >> 10) & 0x1F, m = h & 0x3FF;
    uint32_t bits;
    if (e == 0) {
        float v = (float)m / 16777216.0f;
        return s ? -v : v;
    }
    bits = e == 31 ? (s | 0x7F800000u | (m << 13)) : (s | ((e + 112) << 23) | (m << 13));
    float f;
    memcpy(&f, &bits, 4);
    return f;
}
/* f16 bits of a normal positive value (truncating; only for making test data) */
static inline uint16_t lab_f32_to_f16(float f) {
    uint32_t x;
    memcpy(&x, &f, 4);
    return (uint16_t)((((x >> 23) & 0xFF) - 112) << 10 | ((x >> 13) & 0x3FF));
}

/* Activations quantized as the kernels expect: int8 per 32 with (d, d*sum). */
struct lab_act {
    std::vector<int8_t> q;
    std::vector<float2> ds;
    std::vector<double> xq; /* dequantized, for the reference */
};
static inline lab_act lab_quantize(const std::vector<float> &x) {
    lab_act a;
    const size_t n = x.size();
    a.q.resize(n), a.ds.resize(n / 32), a.xq.resize(n);
    for (size_t b = 0; b < n / 32; b++) {
        float amax = 0;
        for (int i = 0; i < 32; i++) amax = fmaxf(amax, fabsf(x[32 * b + i]));
        const float d = amax / 127.0f, id = amax > 0 ? 127.0f / amax : 0.0f;
        int sum = 0;
        for (int i = 0; i < 32; i++) {
            const int q = (int)lrintf(x[32 * b + i] * id);
            a.q[32 * b + i] = (int8_t)q, sum += q, a.xq[32 * b + i] = (double)d * q;
        }
        a.ds[b] = make_float2(d, d * (float)sum);
    }
    return a;
}

/* Median of the per-launch times (ms) of `reps` launches of fn(i), i cycling
 * over the rotation, after a warm-up pass. */
template <class Fn> static double lab_time_ms(int reps, Fn fn) {
    cudaEvent_t a, b;
    LAB_CHECK(cudaEventCreate(&a));
    LAB_CHECK(cudaEventCreate(&b));
    for (int i = 0; i < 8; i++) fn(i);
    LAB_CHECK(cudaDeviceSynchronize());
    std::vector<double> t;
    for (int r = 0; r < 7; r++) {
        LAB_CHECK(cudaEventRecord(a));
        for (int i = 0; i < reps; i++) fn(i);
        LAB_CHECK(cudaEventRecord(b));
        LAB_CHECK(cudaEventSynchronize(b));
        float ms;
        LAB_CHECK(cudaEventElapsedTime(&ms, a, b));
        t.push_back(ms / reps);
    }
    LAB_CHECK(cudaGetLastError());
    std::sort(t.begin(), t.end());
    cudaEventDestroy(a), cudaEventDestroy(b);
    return t[t.size() / 2];
}

/* Read-bandwidth ceiling: every byte of a 4 GiB buffer once per launch, 16-byte loads. */
static __global__ void lab_read_kernel(const uint4 *__restrict__ p, size_t n, uint32_t *out) {
    uint32_t acc = 0;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        const uint4 v = p[i];
        acc ^= v.x ^ v.y ^ v.z ^ v.w;
    }
    if (acc == 0x12345678u) *out = acc; /* keeps the loads */
}

static inline double lab_read_bw_gbs(void) {
    const size_t bytes = (size_t)4 << 30;
    void *buf;
    uint32_t *out;
    LAB_CHECK(cudaMalloc(&buf, bytes));
    LAB_CHECK(cudaMalloc((void **)&out, 4));
    LAB_CHECK(cudaMemset(buf, 0x5A, bytes));
    int n_sm = 0;
    LAB_CHECK(cudaDeviceGetAttribute(&n_sm, cudaDevAttrMultiProcessorCount, 0));
    const double ms =
        lab_time_ms(5, [&](int) { lab_read_kernel<<<n_sm * 8, 512>>>((const uint4 *)buf, bytes / 16, out); });
    cudaFree(buf), cudaFree(out);
    return (double)bytes / (ms * 1e-3) / 1e9;
}

static __device__ __forceinline__ float warp_sum_lab(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

static inline double lab_nmse(const std::vector<float> &y, const std::vector<double> &ref) {
    double num = 0, den = 0;
    for (size_t i = 0; i < y.size(); i++) {
        if (!std::isfinite(y[i])) return INFINITY;
        num += (y[i] - ref[i]) * (y[i] - ref[i]), den += ref[i] * ref[i];
    }
    return num / den;
}

#endif
