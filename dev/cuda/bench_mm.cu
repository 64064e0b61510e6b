/* Benchmark of the shipped matrix products (src/backend/cuda, through the
 * public cuda_matmul) for every weight format: decode GB/s against the read
 * ceiling, and the decode-vs-GEMM crossover in tokens.
 *
 * Decode: one 16384 x 4096 matrix per format (rows of 4096 weights), rotated
 * over copies worth >= 1 GiB so that every launch reads HBM; the time covers
 * the whole cuda_matmul call (activation quantization + product). GB/s =
 * weight bytes / time.
 * Crossover: Q4_K and Q6_K 6144 x 2048 (qwen3 experts x 8) and 4096 x 4096
 * at 1..512 tokens on both paths, forced (cuda_mm_force_path).
 *
 * Build (device, after the CMake build): see dev/cuda/run_device.sh.
 */
#include "lab_common.cuh"

#include "backend/cuda/mm/mm.h"
extern "C" {
#include "quant/quant.h"
}

static double time_matmul(st_weight *ws, int rot, const float *x, float *y, int n_tok, int reps) {
    return lab_time_ms(reps, [&](int i) {
        if (cuda_matmul(&ws[i % rot], 0, x, y, n_tok, 0) != 0) {
            fprintf(stderr, "cuda_matmul failed\n");
            exit(1);
        }
    });
}

int main(int argc, char **argv) {
    const double bw = lab_read_bw_gbs();
    printf("read ceiling %.0f GB/s\n", bw);
    const qt_type types[] = {QT_F32,    QT_F16,   QT_BF16,    QT_Q4_0,  QT_Q4_1,  QT_Q5_0,   QT_Q5_1,   QT_Q8_0,
                             QT_Q2_K,   QT_Q3_K,  QT_Q4_K,    QT_Q5_K,  QT_Q6_K,  QT_IQ4_NL, QT_IQ4_XS, QT_IQ2_XXS,
                             QT_IQ2_XS, QT_IQ2_S, QT_IQ3_XXS, QT_IQ3_S, QT_IQ1_S, QT_IQ1_M,  QT_MXFP4};
    const int n_in = 4096, n_out = 16384;
    float *x, *y;
    LAB_CHECK(cudaMalloc(&x, sizeof(float) * n_in * 512));
    LAB_CHECK(cudaMalloc(&y, sizeof(float) * n_out * 512));
    {
        std::vector<float> hx((size_t)n_in * 512);
        for (auto &v : hx) v = lab_gauss();
        LAB_CHECK(cudaMemcpy(x, hx.data(), hx.size() * 4, cudaMemcpyHostToDevice));
    }
    printf("\ndecode, %d x %d, whole cuda_matmul call\n", n_out, n_in);
    printf("%-8s %6s %7s %8s %8s %8s %8s %8s %9s %9s\n", "format", "bpw", "MB", "us R=1", "us R=2", "us R=4", "us auto",
           "GB/s", "%ceiling", "us(8tok)");
    for (qt_type t : types) {
        if (argc > 1 && strcmp(argv[1], "--quick") == 0 && t != QT_Q4_K && t != QT_Q6_K) continue;
        const size_t rb = qt_row_size(t, n_in), mb = rb * n_out;
        const int rot = (int)std::max<size_t>(2, ((size_t)1 << 30) / mb + 1);
        uint8_t *w;
        LAB_CHECK(cudaMalloc(&w, mb * rot));
        std::vector<uint8_t> h(mb);
        for (auto &c : h) c = (uint8_t)lab_rand();
        if (t == QT_F32 || t == QT_F16 || t == QT_BF16) { /* finite values */
            std::vector<float> f((size_t)n_in * n_out);
            for (auto &v : f) v = 0.05f * lab_gauss();
            qt_quantize(t, f.data(), h.data(), (int64_t)f.size());
        }
        for (int k = 0; k < rot; k++) LAB_CHECK(cudaMemcpy(w + k * mb, h.data(), mb, cudaMemcpyHostToDevice));
        std::vector<st_weight> ws(rot);
        for (int k = 0; k < rot; k++) ws[k] = st_weight{w + k * mb, NULL, t, n_in, n_out, 1, rb};
        double msr[3];
        for (int k = 0; k < 3; k++) {
            cuda_mm_force_rows(1 << k);
            msr[k] = time_matmul(ws.data(), rot, x, y, 1, 100);
        }
        cuda_mm_force_rows(0);
        const double ms1 = time_matmul(ws.data(), rot, x, y, 1, 100);
        const double ms8 = time_matmul(ws.data(), rot, x, y, 8, 50);
        const double gbs = (double)mb / (ms1 * 1e-3) / 1e9;
        printf("%-8s %6.2f %7.1f %8.1f %8.1f %8.1f %8.1f %8.0f %8.1f%% %9.1f\n", qt_get(t)->name, 8.0 * rb / n_in,
               mb / 1e6, msr[0] * 1e3, msr[1] * 1e3, msr[2] * 1e3, ms1 * 1e3, gbs, 100 * gbs / bw, ms8 * 1e3);
        cudaFree(w);
    }

    /* MoE decode as the model runs it: 128 experts in one tensor, 8 pairs
     * (one token, top-8) with fresh random experts per call, gate 768x2048
     * and down 2048x768 Q4_K; also the Q6_K down of Q4_K_M files. */
    printf("\nMoE decode: 8 of 128 experts per call (cuda_moe_matmul, device path)\n");
    printf("%-8s %-10s %8s %8s %8s %9s\n", "format", "shape", "R", "us", "GB/s", "%ceiling");
    {
        const int n_exp = 128, n_calls = 64;
        int32_t *ids;
        LAB_CHECK(cudaMalloc(&ids, sizeof(int32_t) * 8 * n_calls));
        std::vector<int32_t> hid(8 * n_calls);
        for (auto &v : hid) v = (int32_t)(lab_rand() % n_exp);
        LAB_CHECK(cudaMemcpy(ids, hid.data(), hid.size() * 4, cudaMemcpyHostToDevice));
        struct me {
            qt_type t;
            int n_out, n_in;
        } mes[] = {{QT_Q4_K, 768, 2048}, {QT_Q4_K, 2048, 768}, {QT_Q6_K, 2048, 768}, {QT_Q6_K, 768, 2048}};
        for (const me &m : mes) {
            const size_t rb = qt_row_size(m.t, m.n_in), mb = rb * m.n_out * n_exp;
            uint8_t *w;
            LAB_CHECK(cudaMalloc(&w, mb));
            std::vector<uint8_t> h(mb);
            for (auto &c : h) c = (uint8_t)lab_rand();
            LAB_CHECK(cudaMemcpy(w, h.data(), mb, cudaMemcpyHostToDevice));
            st_weight sw = {w, NULL, m.t, m.n_in, m.n_out, n_exp, rb, NULL};
            for (int rr = 0; rr <= 4; rr = rr ? rr * 2 : 1) {
                cuda_mm_force_rows(rr);
                const double ms = lab_time_ms(n_calls, [&](int i) {
                    if (cuda_moe_matmul(&sw, NULL, ids + 8 * (i % n_calls), NULL, 8, x, 1, y, 0) != 0) exit(1);
                });
                const double gbs = 8.0 * rb * m.n_out / (ms * 1e-3) / 1e9;
                printf("%-8s %4dx%-5d %8s %8.1f %8.0f %8.1f%%\n", qt_get(m.t)->name, m.n_out, m.n_in,
                       rr ? (rr == 1   ? "1"
                             : rr == 2 ? "2"
                                       : "4")
                          : "auto",
                       ms * 1e3, gbs, 100 * gbs / bw);
            }
            cuda_mm_force_rows(0);
            cudaFree(w);
        }
        cudaFree(ids);
    }

    printf("\ncrossover: time per call (us) by path and tokens\n");
    const int toks[] = {1, 2, 4, 8, 16, 32, 512};
    struct shp {
        qt_type t;
        int n_out, n_in;
    } shps[] = {{QT_Q4_K, 6144, 2048}, {QT_Q6_K, 4096, 4096}};
    for (const shp &s : shps) {
        const size_t rb = qt_row_size(s.t, s.n_in), mb = rb * s.n_out;
        const int rot = (int)std::max<size_t>(2, ((size_t)1 << 30) / mb + 1);
        uint8_t *w;
        LAB_CHECK(cudaMalloc(&w, mb * rot));
        std::vector<uint8_t> h(mb);
        for (auto &c : h) c = (uint8_t)lab_rand();
        for (int k = 0; k < rot; k++) LAB_CHECK(cudaMemcpy(w + k * mb, h.data(), mb, cudaMemcpyHostToDevice));
        std::vector<st_weight> ws(rot);
        for (int k = 0; k < rot; k++) ws[k] = st_weight{w + k * mb, NULL, s.t, s.n_in, s.n_out, 1, rb};
        printf("%s %dx%d\n  %-6s %10s %10s %12s\n", qt_get(s.t)->name, s.n_out, s.n_in, "tok", "mmv us", "gemm us",
               "gemm TFLOP/s");
        for (int nt : toks) {
            cuda_mm_force_path(1);
            const double a = nt <= 64 ? time_matmul(ws.data(), rot, x, y, nt, 20) : NAN;
            cuda_mm_force_path(2);
            const double g = time_matmul(ws.data(), rot, x, y, nt, 20);
            cuda_mm_force_path(0);
            printf("  %-6d %10.1f %10.1f %12.1f\n", nt, a * 1e3, g * 1e3,
                   2.0 * s.n_out * s.n_in * nt / (g * 1e-3) / 1e12);
        }
        cudaFree(w);
    }
    cuda_mm_release();
    return 0;
}
