/* Kernel lab: Q4_K matrix-vector product (decode, one token), the format of
 * most weights of the target model (synth qwen3-30b-a3b: Q4_K + Q6_K).
 *
 * Roofline, written before measuring. A Q4_K row of n weights is n/256
 * blocks of 144 bytes = 4.5 bits per weight; the int8 activations (n bytes +
 * 8 bytes per 32) are re-read by every row but stay in L1/L2. So the floor is
 * weight bytes / HBM read bandwidth: H200 reads ~4.0-4.5 TB/s (measured here
 * by lab_read_bw_gbs, a 4 GiB streaming read). Arithmetic is no limit: per
 * 32 weights 8 dp4a + ~30 integer ops against 18 bytes.
 *   qwen3-30b-a3b decode, one layer's routed experts: 8 x (gate+up 768x2048 +
 *   down 2048x768) Q4_K = 8 x 3 x 0.88 MB = 21 MB -> ~5 us at 4.2 TB/s.
 * Prediction: the generic unit kernel (v1, what src/ uses for every format)
 * reaches 75-85% of the read ceiling on large matrices: its 16-byte loads
 * are wide, but 2 lanes read the same 32 qs bytes (one nibble each), so L1
 * sees twice the weight bytes; v2 (one lane takes both nibbles) halves that
 * and should gain where L1 throughput, not HBM, binds (small rows, many CTAs).
 *
 * Versions:
 *   v1  generic: lane per 32-weight unit (quant_cuda.cuh), warp per row
 *   v2  lane per 64 weights (both nibbles of 32 qs bytes), warp per row
 *   v3  v2 with a half-warp per row (rows of 2048 weights = 32 pairs: no idle lanes)
 *   v4  v2 with two pairs' loads issued before either is used
 *
 * Build and run (device): nvcc -std=c++17 -O3 -arch=sm_90 -I src dev/cuda/mmv_q4k.cu -o mmv_q4k && ./mmv_q4k
 */
#include "lab_common.cuh"

#include "backend/cuda/mm/quant_cuda.cuh"

/* ---- CPU reference: Q4_K dequantization (format in src/quant/blocks.h) ---- */
static void ref_scale_min(int j, const uint8_t *q, int *sc, int *m) {
    if (j < 4) *sc = q[j] & 63, *m = q[j + 4] & 63;
    else *sc = (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4), *m = (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
}
static void ref_dequant_row(const uint8_t *row, int n, double *out) {
    for (int b = 0; b < n / 256; b++) {
        const block_q4_K *k = (const block_q4_K *)(row + 144 * b);
        const double d = lab_f16_to_f32(k->d), dmin = lab_f16_to_f32(k->dmin);
        for (int s = 0; s < 8; s++) {
            int sc, m;
            ref_scale_min(s, k->scales, &sc, &m);
            for (int l = 0; l < 32; l++)
                out[256 * b + 32 * s + l] = d * sc * ((k->qs[32 * (s / 2) + l] >> (4 * (s % 2))) & 0xF) - dmin * m;
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

/* ---- v1: generic units ---- */
static __global__ void __launch_bounds__(128) k_v1(const args p) {
    const int row = blockIdx.x * 4 + threadIdx.y;
    if (row >= p.n_out) return;
    const uint8_t *wrow = p.w + (size_t)row * p.row_bytes;
    float acc = 0;
    for (int gu = threadIdx.x; gu < p.n_in / 32; gu += 32) {
        mm_unit w;
        mmf<QT_Q4_K>::unit(wrow + (gu / 8) * 144, gu % 8, w);
        const int4 a0 = ((const int4 *)(p.aq + 32 * gu))[0], a1 = ((const int4 *)(p.aq + 32 * gu))[1];
        const int a[8] = {a0.x, a0.y, a0.z, a0.w, a1.x, a1.y, a1.z, a1.w};
        acc += mm_unit_dot<mmf<QT_Q4_K>>(w, a, p.ad[gu]);
    }
    acc = warp_sum_lab(acc);
    if (threadIdx.x == 0) p.y[row] = acc;
}

/* ---- v2..v4: a lane takes the 64 weights of one 32-byte qs chunk ---- */
static __device__ __forceinline__ float pair_dot(const uint8_t *blk, int j, const int8_t *aq, const float2 *ad) {
    const uint4 q0 = ((const uint4 *)(blk + 16 + 32 * j))[0], q1 = ((const uint4 *)(blk + 16 + 32 * j))[1];
    const uint32_t q[8] = {q0.x, q0.y, q0.z, q0.w, q1.x, q1.y, q1.z, q1.w};
    const int4 *ap = (const int4 *)aq;
    const int4 a0 = ap[0], a1 = ap[1], a2 = ap[2], a3 = ap[3];
    const int al[8] = {a0.x, a0.y, a0.z, a0.w, a1.x, a1.y, a1.z, a1.w};
    const int ah[8] = {a2.x, a2.y, a2.z, a2.w, a3.x, a3.y, a3.z, a3.w};
    int s0 = 0, s1 = 0;
#pragma unroll
    for (int i = 0; i < 8; i++) {
        s0 = __dp4a((int)(q[i] & 0x0F0F0F0Fu), al[i], s0);
        s1 = __dp4a((int)((q[i] >> 4) & 0x0F0F0F0Fu), ah[i], s1);
    }
    int sc0, m0, sc1, m1;
    scale_min_k4(2 * j, blk + 4, sc0, m0);
    scale_min_k4(2 * j + 1, blk + 4, sc1, m1);
    const float d = mm_f16(ld_u16(blk)), dmin = mm_f16(ld_u16(blk + 2));
    const float2 d0 = ad[0], d1 = ad[1];
    return d * ((float)(sc0 * s0) * d0.x + (float)(sc1 * s1) * d1.x) - dmin * ((float)m0 * d0.y + (float)m1 * d1.y);
}

template <int LPR> /* lanes per row: 32 or 16 */
static __global__ void __launch_bounds__(128) k_v2(const args p) {
    const int row = (blockIdx.x * 4 + threadIdx.y) * (32 / LPR) + threadIdx.x / LPR;
    const int lane = threadIdx.x % LPR;
    float acc = 0;
    if (row < p.n_out) {
        const uint8_t *wrow = p.w + (size_t)row * p.row_bytes;
        for (int gp = lane; gp < p.n_in / 64; gp += LPR)
            acc += pair_dot(wrow + (gp / 4) * 144, gp % 4, p.aq + 64 * gp, p.ad + 2 * gp);
    }
#pragma unroll
    for (int o = LPR / 2; o > 0; o >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, o);
    if (lane == 0 && row < p.n_out) p.y[row] = acc;
}

static __global__ void __launch_bounds__(128) k_v4(const args p) {
    const int row = blockIdx.x * 4 + threadIdx.y;
    if (row >= p.n_out) return;
    const uint8_t *wrow = p.w + (size_t)row * p.row_bytes;
    const int np = p.n_in / 64;
    float acc = 0;
    int gp = threadIdx.x;
    for (; gp + 32 < np; gp += 64) {
        const float r0 = pair_dot(wrow + (gp / 4) * 144, gp % 4, p.aq + 64 * gp, p.ad + 2 * gp);
        const int g1 = gp + 32;
        const float r1 = pair_dot(wrow + (g1 / 4) * 144, g1 % 4, p.aq + 64 * g1, p.ad + 2 * g1);
        acc += r0 + r1;
    }
    if (gp < np) acc += pair_dot(wrow + (gp / 4) * 144, gp % 4, p.aq + 64 * gp, p.ad + 2 * gp);
    acc = warp_sum_lab(acc);
    if (threadIdx.x == 0) p.y[row] = acc;
}

static void launch(int v, const args &a) {
    const dim3 blk(32, 4);
    switch (v) {
    case 1: k_v1<<<(a.n_out + 3) / 4, blk>>>(a); break;
    case 2: k_v2<32><<<(a.n_out + 3) / 4, blk>>>(a); break;
    case 3: k_v2<16><<<(a.n_out + 7) / 8, blk>>>(a); break;
    case 4: k_v4<<<(a.n_out + 3) / 4, blk>>>(a); break;
    }
}

int main(int argc, char **argv) {
    const double bw = lab_read_bw_gbs();
    printf("Q4_K matrix-vector lab. Read-bandwidth ceiling (4 GiB streaming read): %.0f GB/s\n", bw);
    struct shape {
        int n_out, n_in;
        const char *what;
    } shapes[] = {
        {6144, 2048, "8 experts gate (qwen3-30b-a3b)"},
        {16384, 768, "8 experts down as one matrix"},
        {4096, 4096, "square 4096"},
        {16384, 4096, "large 16384x4096"},
        {512, 2048, "K/V projection"},
    };
    const int n_ver = 4;
    printf("%-32s %5s %8s %9s %9s %7s %10s\n", "shape", "ver", "us", "GB/s", "%ceiling", "rot", "nmse");
    for (const shape &s : shapes) {
        const size_t rb = (size_t)s.n_in / 256 * 144, mb = rb * s.n_out;
        const int rot = (int)std::max<size_t>(2, std::min<size_t>(64, ((size_t)1 << 30) / mb + 1));
        std::vector<uint8_t> h(mb);
        for (auto &c : h) c = (uint8_t)lab_rand();
        for (size_t b = 0; b < mb / 144; b++) {
            uint16_t d = lab_f32_to_f16(1e-3f + 9e-3f * lab_unit()), m = lab_f32_to_f16(1e-3f + 9e-3f * lab_unit());
            memcpy(&h[144 * b], &d, 2), memcpy(&h[144 * b + 2], &m, 2);
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
        for (int v = 1; v <= n_ver; v++) {
            args a = {dw, rb, s.n_in, s.n_out, daq, dad, dy};
            LAB_CHECK(cudaMemset(dy, 0xFF, s.n_out * sizeof(float)));
            launch(v, a);
            LAB_CHECK(cudaDeviceSynchronize());
            std::vector<float> y(s.n_out);
            LAB_CHECK(cudaMemcpy(y.data(), dy, s.n_out * sizeof(float), cudaMemcpyDeviceToHost));
            const double e = lab_nmse(y, ref);
            const double ms = lab_time_ms(200, [&](int i) {
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
    (void)argc, (void)argv;
    return 0;
}
