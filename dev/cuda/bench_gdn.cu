/* Benchmark of the shipped gated DeltaNet (src/backend/cuda/deltanet.cu,
 * through cuda_gated_delta_net) at Qwen3.5-35B-A3B's shapes: 16 key and 32
 * value heads of 128, a convolution of 4, f32 state (2 MiB per layer).
 *
 * Decode (one token): the call reads and writes its layer's state once;
 * the bytes it must move are 2 x state + window + the token's rows, so its
 * floor is those bytes over the read ceiling. Layers rotate over 40 states
 * (80 MiB, past the 50 MB L2) so that every call reads HBM.
 * Prompt (n tokens): the scan walks the tokens in order, so its time is
 * n dependent steps; printed per token, beside the decode call.
 *
 * Build (device, after the CMake build of libstrata.a in build-gpu):
 *   nvcc -std=c++17 -O3 -arch=sm_90 -Isrc dev/cuda/bench_gdn.cu build-gpu/src/libstrata.a \
 *        -lcublas -lcublasLt -lpthread -lm -o /tmp/bench_gdn
 */
#include "lab_common.cuh"

#include "backend/cuda/deltanet.h"

static float *dev_rand(size_t n, float sd) {
    std::vector<float> h(n);
    for (auto &v : h) v = sd * lab_gauss();
    float *d;
    LAB_CHECK(cudaMalloc(&d, n * 4));
    LAB_CHECK(cudaMemcpy(d, h.data(), n * 4, cudaMemcpyHostToDevice));
    return d;
}

int main(void) {
    const double bw = lab_read_bw_gbs();
    printf("read ceiling %.0f GB/s\n", bw);
    const int nk = 16, nv = 32, hd = 128, K = 4, n_layer = 40, n_max = 512;
    const size_t cd = (size_t)(2 * nk + nv) * hd, vd = (size_t)nv * hd, ns = vd * hd;
    st_gdn g = {};
    g.d_conv = K, g.n_k_head = nk, g.n_v_head = nv, g.head_dim = hd, g.eps = 1e-6f;
    g.conv_w = dev_rand(cd * K, 0.5f), g.dt_bias = dev_rand(nv, 1.0f), g.norm = dev_rand(hd, 1.0f);
    {
        std::vector<float> a(nv);
        for (auto &v : a) v = -(0.2f + 2.0f * lab_unit());
        float *d;
        LAB_CHECK(cudaMalloc(&d, nv * 4));
        LAB_CHECK(cudaMemcpy(d, a.data(), nv * 4, cudaMemcpyHostToDevice));
        g.a = d;
    }
    std::vector<st_kv_layer> st(n_layer);
    for (auto &l : st) {
        memset(&l, 0, sizeof l);
        l.conv = dev_rand((size_t)(K - 1) * cd, 0.1f);
        l.ssm = dev_rand(ns, 0.01f);
    }
    float *qkv = dev_rand((size_t)n_max * cd, 1.0f), *z = dev_rand((size_t)n_max * vd, 1.0f);
    float *beta = dev_rand((size_t)n_max * nv, 1.0f), *alpha = dev_rand((size_t)n_max * nv, 1.0f);
    float *out, *scratch;
    LAB_CHECK(cudaMalloc(&out, (size_t)n_max * vd * 4));
    LAB_CHECK(cudaMalloc(&scratch, cuda_gdn_scratch_floats(&g, n_max) * 4));
    const double state_mb = ns * 4 / 1e6;
    printf("state %.2f MB per layer; %d layers rotated\n", state_mb, n_layer);
    printf("%6s %10s %12s %10s %10s\n", "tokens", "us/call", "us/token", "GB/s", "%ceiling");
    const int toks[] = {1, 2, 8, 64, 512};
    for (int n : toks) {
        const double ms = lab_time_ms(n >= 64 ? 10 : 200, [&](int i) {
            cuda_gated_delta_net(&g, &st[i % n_layer], n, 7, NULL, qkv, z, beta, alpha, out, scratch, NULL, NULL, 0);
        });
        /* what a call must move: the state in and out, the window, the token rows in and out */
        const double bytes = 2.0 * ns * 4 + 2.0 * (K - 1) * cd * 4 + (double)n * (cd + 2 * vd + 2 * nv) * 4;
        const double gbs = bytes / (ms * 1e-3) / 1e9;
        printf("%6d %10.1f %12.2f %10.0f %9.0f%%\n", n, ms * 1e3, ms * 1e3 / n, gbs, 100.0 * gbs / bw);
    }
    LAB_CHECK(cudaDeviceSynchronize());
    return 0;
}
