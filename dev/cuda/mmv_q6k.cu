/* Kernel lab: Q6_K matrix-vector product (decode, one token): the output
 * head and attention V/down matrices of the target model are Q6_K.
 *
 * Roofline, before measuring: 210 bytes per 256 weights (6.56 bits); floor =
 * weight bytes / HBM read bandwidth (lab_read_bw_gbs). The qwen3-30b-a3b
 * output head (151936 x 2048 Q6_K = 255 MB) should take ~60 us at 4.2 TB/s.
 * Prediction: Q6_K blocks are only 2-byte aligned (210 = 2 x 105), so the
 * generic unit kernel (v1) reads each 32-bit word as two 16-bit loads:
 * 32 load instructions per 32 weights (26 bytes), each warp-wide load spread
 * over ~840 bytes. L1 throughput, not HBM, should bind: expect v1 well below
 * the Q4_K kernel (maybe 50-60% of the ceiling). Loading aligned words and
 * funnel-shifting (v2) needs 9 loads per 32 bytes instead of 16; sharing the
 * ql bytes of units u and u+2 in one lane (v3) halves them again.
 *
 * Versions:
 *   v1  generic: lane per 32-weight unit (quant_cuda.cuh, 16-bit loads)
 *   v2  v1 with aligned 32-bit loads + funnel shifts
 *   v3  lane per units u and u+2 (same ql bytes, other nibble), aligned loads
 *   v4  v3 with a half-warp per row
 *
 * Build and run (device): nvcc -std=c++17 -O3 -arch=sm_90 -I src dev/cuda/mmv_q6k.cu -o mmv_q6k && ./mmv_q6k
 */
#include "lab_common.cuh"

#include "backend/cuda/mm/quant_cuda.cuh"

/* ---- CPU reference: Q6_K dequantization (format in src/quant/blocks.h) ---- */
static void ref_dequant_row(const uint8_t *row, int n, double *out) {
    for (int b = 0; b < n / 256; b++) {
        const block_q6_K *k = (const block_q6_K *)(row + 210 * b);
        const double d = lab_f16_to_f32(k->d);
        for (int e = 0; e < 256; e++) {
            const int h = e / 128, r = e % 128;
            const int lo = (k->ql[64 * h + r % 64] >> (4 * (r / 64))) & 0xF;
            const int hi = (k->qh[32 * h + r % 32] >> (2 * (r / 32))) & 3;
            out[256 * b + e] = d * k->scales[e / 16] * ((lo | (hi << 4)) - 32);
        }
    }
}

struct args {
    const uint8_t *w;
    size_t row_bytes;
    int n_in, n_out;
    const int8_t *aq;
    const float2 *ad;
    float *y;
};

/* 32 bytes at a 2-aligned p as 8 words: 9 aligned loads (8 when p is 4-aligned),
 * each touching only words that hold wanted bytes. */
static __device__ __forceinline__ void ld8f(const uint8_t *p, uint32_t o[8]) {
    const uint32_t *b = (const uint32_t *)((uintptr_t)p & ~(uintptr_t)3);
    const int sh = (int)((uintptr_t)p & 2) * 8;
    uint32_t w[9];
#pragma unroll
    for (int i = 0; i < 8; i++) w[i] = b[i];
    w[8] = sh ? b[8] : 0;
#pragma unroll
    for (int i = 0; i < 8; i++) o[i] = __funnelshift_r(w[i], w[i + 1], sh);
}

static __device__ __forceinline__ int q6_signed(uint32_t x) {
    const uint32_t y = x ^ 0x20202020u, s = y & 0x20202020u;
    return (int)(y | (s << 1) | (s << 2));
}

/* ---- v1: generic units ---- */
static __global__ void __launch_bounds__(128) k_v1(const args p) {
    const int row = blockIdx.x * 4 + threadIdx.y;
    if (row >= p.n_out) return;
    const uint8_t *wrow = p.w + (size_t)row * p.row_bytes;
    float acc = 0;
    for (int gu = threadIdx.x; gu < p.n_in / 32; gu += 32) {
        mm_unit w;
        mmf<QT_Q6_K>::unit(wrow + (gu / 8) * 210, gu % 8, w);
        const int4 a0 = ((const int4 *)(p.aq + 32 * gu))[0], a1 = ((const int4 *)(p.aq + 32 * gu))[1];
        const int a[8] = {a0.x, a0.y, a0.z, a0.w, a1.x, a1.y, a1.z, a1.w};
        acc += mm_unit_dot<mmf<QT_Q6_K>>(w, a, p.ad[gu]);
    }
    acc = warp_sum_lab(acc);
    if (threadIdx.x == 0) p.y[row] = acc;
}

/* ---- v2: one unit, aligned loads ---- */
static __device__ __forceinline__ float unit_dot_v2(const uint8_t *b, int u, const int8_t *aq, float2 ds) {
    const int h = u >> 2, c = u & 3;
    uint32_t ql[8], qh[8];
    ld8f(b + 64 * h + 32 * (c & 1), ql);
    ld8f(b + 128 + 32 * h, qh);
    const int4 a0 = ((const int4 *)aq)[0], a1 = ((const int4 *)aq)[1];
    const int a[8] = {a0.x, a0.y, a0.z, a0.w, a1.x, a1.y, a1.z, a1.w};
    const int ns = 4 * (c >> 1);
    int s0 = 0, s1 = 0;
#pragma unroll
    for (int i = 0; i < 8; i++) {
        const int q = q6_signed(((ql[i] >> ns) & 0x0F0F0F0Fu) | (((qh[i] >> (2 * c)) & 0x03030303u) << 4));
        if (i < 4) s0 = __dp4a(q, a[i], s0);
        else s1 = __dp4a(q, a[i], s1);
    }
    const int8_t *sc = (const int8_t *)(b + 192);
    return mm_f16(ld_u16(b + 208)) * ((float)(sc[2 * u] * s0) + (float)(sc[2 * u + 1] * s1)) * ds.x;
}

static __global__ void __launch_bounds__(128) k_v2(const args p) {
    const int row = blockIdx.x * 4 + threadIdx.y;
    if (row >= p.n_out) return;
    const uint8_t *wrow = p.w + (size_t)row * p.row_bytes;
    float acc = 0;
    for (int gu = threadIdx.x; gu < p.n_in / 32; gu += 32)
        acc += unit_dot_v2(wrow + (gu / 8) * 210, gu % 8, p.aq + 32 * gu, p.ad[gu]);
    acc = warp_sum_lab(acc);
    if (threadIdx.x == 0) p.y[row] = acc;
}

/* ---- v3/v4: units u0 = 4h + c0 and u0 + 2 in one lane ---- */
static __device__ __forceinline__ float pair_dot(const uint8_t *b, int j, const int8_t *aq, const float2 *ad) {
    const int h = j >> 1, c0 = j & 1, u0 = 4 * h + c0;
    uint32_t ql[8], qh[8];
    ld8f(b + 64 * h + 32 * c0, ql);
    ld8f(b + 128 + 32 * h, qh);
    const int4 *ap0 = (const int4 *)(aq + 32 * u0), *ap1 = (const int4 *)(aq + 32 * (u0 + 2));
    const int4 a0 = ap0[0], a1 = ap0[1], a2 = ap1[0], a3 = ap1[1];
    const int al[8] = {a0.x, a0.y, a0.z, a0.w, a1.x, a1.y, a1.z, a1.w};
    const int ah[8] = {a2.x, a2.y, a2.z, a2.w, a3.x, a3.y, a3.z, a3.w};
    int s[4] = {0, 0, 0, 0};
#pragma unroll
    for (int i = 0; i < 8; i++) {
        const int q0 = q6_signed((ql[i] & 0x0F0F0F0Fu) | (((qh[i] >> (2 * c0)) & 0x03030303u) << 4));
        const int q1 = q6_signed(((ql[i] >> 4) & 0x0F0F0F0Fu) | (((qh[i] >> (2 * c0 + 4)) & 0x03030303u) << 4));
        s[i >> 2] = __dp4a(q0, al[i], s[i >> 2]);
        s[2 + (i >> 2)] = __dp4a(q1, ah[i], s[2 + (i >> 2)]);
    }
    const int8_t *sc = (const int8_t *)(b + 192);
    const float2 d0 = ad[u0], d1 = ad[u0 + 2];
    return mm_f16(ld_u16(b + 208)) * (((float)(sc[2 * u0] * s[0]) + (float)(sc[2 * u0 + 1] * s[1])) * d0.x +
                                      ((float)(sc[2 * u0 + 4] * s[2]) + (float)(sc[2 * u0 + 5] * s[3])) * d1.x);
}

template <int LPR> static __global__ void __launch_bounds__(128) k_v3(const args p) {
    const int row = (blockIdx.x * 4 + threadIdx.y) * (32 / LPR) + threadIdx.x / LPR;
    const int lane = threadIdx.x % LPR;
    float acc = 0;
    if (row < p.n_out) {
        const uint8_t *wrow = p.w + (size_t)row * p.row_bytes;
        for (int gp = lane; gp < p.n_in / 64; gp += LPR)
            acc += pair_dot(wrow + (gp / 4) * 210, gp % 4, p.aq + 256 * (gp / 4), p.ad + 8 * (gp / 4));
    }
#pragma unroll
    for (int o = LPR / 2; o > 0; o >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, o);
    if (lane == 0 && row < p.n_out) p.y[row] = acc;
}

static void launch(int v, const args &a) {
    const dim3 blk(32, 4);
    switch (v) {
    case 1: k_v1<<<(a.n_out + 3) / 4, blk>>>(a); break;
    case 2: k_v2<<<(a.n_out + 3) / 4, blk>>>(a); break;
    case 3: k_v3<32><<<(a.n_out + 3) / 4, blk>>>(a); break;
    case 4: k_v3<16><<<(a.n_out + 7) / 8, blk>>>(a); break;
    }
}

int main() {
    const double bw = lab_read_bw_gbs();
    printf("Q6_K matrix-vector lab. Read-bandwidth ceiling (4 GiB streaming read): %.0f GB/s\n", bw);
    struct shape {
        int n_out, n_in;
        const char *what;
    } shapes[] = {
        {151936, 2048, "output head (qwen3 vocab)"},
        {4096, 4096, "square 4096"},
        {16384, 768, "8 experts down as one matrix"},
        {512, 2048, "K/V projection"},
    };
    printf("%-32s %5s %8s %9s %9s %7s %10s\n", "shape", "ver", "us", "GB/s", "%ceiling", "rot", "nmse");
    for (const shape &s : shapes) {
        const size_t rb = (size_t)s.n_in / 256 * 210, mb = rb * s.n_out;
        const int rot = (int)std::max<size_t>(2, std::min<size_t>(64, ((size_t)1 << 30) / mb + 1));
        std::vector<uint8_t> h(mb);
        for (auto &c : h) c = (uint8_t)lab_rand();
        for (size_t b = 0; b < mb / 210; b++) {
            uint16_t d = lab_f32_to_f16(1e-3f + 9e-3f * lab_unit());
            memcpy(&h[210 * b + 208], &d, 2);
        }
        std::vector<float> x(s.n_in);
        for (auto &v : x) v = lab_gauss();
        const lab_act act = lab_quantize(x);
        std::vector<double> ref(s.n_out), row(s.n_in);
        for (int r = 0; r < s.n_out; r++) {
            ref_dequant_row(&h[(size_t)r * rb], s.n_in, row.data());
            double acc = 0;
            for (int i = 0; i < s.n_in; i++) acc += row[i] * act.xq[i];
            ref[r] = acc;
        }
        uint8_t *dw;
        int8_t *daq;
        float2 *dad;
        float *dy;
        LAB_CHECK(cudaMalloc(&dw, mb * rot));
        for (int k = 0; k < rot; k++) LAB_CHECK(cudaMemcpy(dw + k * mb, h.data(), mb, cudaMemcpyHostToDevice));
        LAB_CHECK(cudaMalloc(&daq, s.n_in));
        LAB_CHECK(cudaMalloc(&dad, s.n_in / 32 * sizeof(float2)));
        LAB_CHECK(cudaMalloc(&dy, s.n_out * sizeof(float)));
        LAB_CHECK(cudaMemcpy(daq, act.q.data(), s.n_in, cudaMemcpyHostToDevice));
        LAB_CHECK(cudaMemcpy(dad, act.ds.data(), s.n_in / 32 * sizeof(float2), cudaMemcpyHostToDevice));
        for (int v = 1; v <= 4; v++) {
            args a = {dw, rb, s.n_in, s.n_out, daq, dad, dy};
            LAB_CHECK(cudaMemset(dy, 0xFF, s.n_out * sizeof(float)));
            launch(v, a);
            LAB_CHECK(cudaDeviceSynchronize());
            std::vector<float> y(s.n_out);
            LAB_CHECK(cudaMemcpy(y.data(), dy, s.n_out * sizeof(float), cudaMemcpyDeviceToHost));
            const double e = lab_nmse(y, ref);
            const double ms = lab_time_ms(100, [&](int i) {
                args b = a;
                b.w = dw + (size_t)(i % rot) * mb;
                launch(v, b);
            });
            const double gbs = (double)mb / (ms * 1e-3) / 1e9;
            printf("%-32s %5d %8.2f %9.0f %8.1f%% %7d %10.2e%s\n", s.what, v, ms * 1e3, gbs, 100 * gbs / bw, rot, e,
                   e < 1e-9 ? "" : "  WRONG");
        }
        cudaFree(dw), cudaFree(daq), cudaFree(dad), cudaFree(dy);
    }
    return 0;
}
