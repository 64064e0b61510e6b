/* bench_attn: the CPU backend's attention op alone, at decode depth and over
 * a prompt chunk, so that a change to it can be timed without the rest of a
 * forward pass (whose weight reads hide it at small depths and whose noise
 * hides it on a shared machine).
 *
 * Decode: one query token at position D over L layers' caches of D+1 f16
 * rows each (default 24 layers, so the caches of a step exceed the last-level
 * cache as a real model's do between layers), each layer once per step; the
 * time per layer call is the median step over the layer count. Prompt: N query
 * tokens at positions A..A+N-1 (--at A, default 0) over one layer's cache of
 * A+N rows, the median call. --kv int8 gives int8 caches (random rows and
 * scales) instead of f16.
 *
 * Heads default to moe-1.5g's (16 query heads, 8 KV heads of 128).
 * --gpu N times the CUDA backend's attention op on GPU N instead (the caches,
 * queries and output in its memory; each call waited for), and prints the
 * prompt's rate beside the card's dense f16 tensor-core peak when known
 * (H100, H200).
 * --cpu-time 1 times with the process's CPU clock instead of the wall clock:
 * on a machine shared with other jobs, with --threads 1, that counts the
 * kernel's own work and not the time slices others took.
 * A benchmark, not a test: it prints times and checks nothing.
 *
 * usage: bench_attn [--threads N] [--depth D] [--layers L] [--prompt N] [--at A]
 *                   [--heads H] [--kv-heads K] [--head-dim HD] [--reps R] [--cpu-time 0|1]
 *                   [--kv f16|int8] [--gpu N]
 */
#include "backend/backend.h"
#include "core/alloc.h"
#include "core/fp16.h"
#include "core/timer.h"
#ifdef STRATA_HAVE_GPU
#include "backend/cuda/backend_cuda.h"
#include "backend/cuda/device.h"
#endif

#include <math.h>
#include <time.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int cmp_d(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double median(double *v, int n) {
    qsort(v, (size_t)n, sizeof *v, cmp_d);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

static int cpu_clock;

static double now_s(void) {
    if (!cpu_clock) return st_now_s();
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static uint32_t rng = 12345;
static float frand(void) { /* uniform in [-1, 1) */
    rng = rng * 1664525u + 1013904223u;
    return (float)(rng >> 8) / (float)(1u << 23) - 1.0f;
}

static int kv_int8;
static st_backend *be;
static int on_gpu;

/* host bytes into the backend's memory (a GPU's: copied; the CPU's: as they are) */
static void *to_be(void *host, size_t bytes) {
    if (!on_gpu || !host) return host;
    void *d = be->alloc(be, bytes);
    be->to_device(be, d, host, bytes);
    st_free(host);
    return d;
}

static void be_free(void *p) {
    if (on_gpu && p) be->free(be, p);
    else st_free(p);
}

/* the device's queue drained (a GPU's; the CPU's ops return done) */
static void be_wait(const float *x) {
    float v;
    if (on_gpu) be->to_host(be, &v, x, sizeof v);
}

static void fill_kv(st_kv_layer *kv, int n_ctx, int n_kv, int hd) {
    const size_t n = (size_t)n_ctx * n_kv * hd;
    *kv = (st_kv_layer){.type = kv_int8 ? ST_KV_INT8 : ST_KV_F16, .n_ctx = n_ctx, .n_head_kv = n_kv, .head_dim = hd};
    if (kv_int8) {
        int8_t *k = st_malloc(n), *v = st_malloc(n);
        float *ks = st_malloc((size_t)n_ctx * n_kv * sizeof(float)),
              *vs = st_malloc((size_t)n_ctx * n_kv * sizeof(float));
        for (size_t i = 0; i < n; i++) {
            k[i] = (int8_t)(127 * frand());
            v[i] = (int8_t)(127 * frand());
        }
        for (size_t i = 0; i < (size_t)n_ctx * n_kv; i++) ks[i] = vs[i] = 1.0f / 127;
        kv->k = to_be(k, n), kv->v = to_be(v, n);
        kv->k_scale = to_be(ks, (size_t)n_ctx * n_kv * sizeof(float));
        kv->v_scale = to_be(vs, (size_t)n_ctx * n_kv * sizeof(float));
        return;
    }
    uint16_t *k = st_malloc(n * 2), *v = st_malloc(n * 2);
    for (size_t i = 0; i < n; i++) {
        k[i] = st_f32_to_f16(frand());
        v[i] = st_f32_to_f16(frand());
    }
    kv->k = to_be(k, n * 2), kv->v = to_be(v, n * 2);
}

static void free_kv(st_kv_layer *kv) {
    be_free(kv->k);
    be_free(kv->v);
    be_free(kv->k_scale);
    be_free(kv->v_scale);
}

int main(int argc, char **argv) {
    int threads = 0, gpu = -1, depth = 1024, layers = 24, prompt = 512, at = 0, heads = 16, kv_heads = 8, hd = 128,
        reps = 9;
    for (int i = 1; i + 1 < argc; i += 2) {
        int v = atoi(argv[i + 1]);
        if (!strcmp(argv[i], "--kv") && (!strcmp(argv[i + 1], "f16") || !strcmp(argv[i + 1], "int8")))
            kv_int8 = !strcmp(argv[i + 1], "int8");
        else if (!strcmp(argv[i], "--threads")) threads = v;
        else if (!strcmp(argv[i], "--gpu")) gpu = v;
        else if (!strcmp(argv[i], "--at")) at = v;
        else if (!strcmp(argv[i], "--depth")) depth = v;
        else if (!strcmp(argv[i], "--layers")) layers = v;
        else if (!strcmp(argv[i], "--prompt")) prompt = v;
        else if (!strcmp(argv[i], "--heads")) heads = v;
        else if (!strcmp(argv[i], "--kv-heads")) kv_heads = v;
        else if (!strcmp(argv[i], "--head-dim")) hd = v;
        else if (!strcmp(argv[i], "--reps")) reps = v;
        else if (!strcmp(argv[i], "--cpu-time")) cpu_clock = v;
        else {
            fprintf(stderr, "bench_attn: unknown option %s\n", argv[i]);
            return 2;
        }
    }
    if (depth < 0 || layers < 1 || prompt < 0 || at < 0 || heads < 1 || kv_heads < 1 || heads % kv_heads || hd < 1 ||
        reps < 1) {
        fprintf(stderr, "bench_attn: bad sizes\n");
        return 2;
    }
    double peak = 0; /* dense f16 tensor-core TFLOP/s, where known */
    if (gpu >= 0) {
#ifdef STRATA_HAVE_GPU
        be = backend_cuda_create(gpu);
        on_gpu = 1;
        gpu_device_info info;
        /* H100/H200 SXM's dense f16 with f32 accumulation (NVIDIA's data sheet); other cards: not printed */
        if (gpu_device_info_get(gpu, &info) == 0 && (strstr(info.name, "H100") || strstr(info.name, "H200")))
            peak = 989.0;
#endif
        if (!be) {
            fprintf(stderr, "bench_attn: --gpu %d: no GPU backend here\n", gpu);
            return 1;
        }
    } else {
        be = backend_cpu_create(threads);
    }
    const float scale = 1.0f / sqrtf((float)hd);
    int n_q = prompt > 1 ? prompt : 1;
    const size_t nqb = (size_t)n_q * heads * hd * sizeof(float);
    float *q = st_malloc(nqb), *out = st_malloc(nqb);
    for (size_t i = 0; i < (size_t)n_q * heads * hd; i++) q[i] = frand();
    q = to_be(q, nqb), out = to_be(out, nqb);
    double *t = st_malloc((size_t)reps * sizeof(double));

    if (depth > 0) {
        st_kv_layer *kv = st_malloc((size_t)layers * sizeof *kv);
        for (int l = 0; l < layers; l++) fill_kv(&kv[l], depth + 1, kv_heads, hd);
        for (int r = -1; r < reps; r++) { /* r = -1: warm-up */
            double t0 = now_s();
            for (int l = 0; l < layers; l++) be->attention(be, q, &kv[l], 1, depth, heads, scale, 0, out);
            be_wait(out);
            if (r >= 0) t[r] = (now_s() - t0) / layers;
        }
        double s = median(t, reps);
        double bytes = 2.0 * (depth + 1) * kv_heads * hd * 2;
        printf("decode at depth %d: %.1f us per layer (%d layers), %.2f GB/s of K and V\n", depth, s * 1e6, layers,
               bytes / s * 1e-9);
        for (int l = 0; l < layers; l++) free_kv(&kv[l]);
        st_free(kv);
    }
    if (prompt > 0) {
        st_kv_layer kv;
        fill_kv(&kv, at + prompt, kv_heads, hd);
        for (int r = -1; r < reps; r++) {
            double t0 = now_s();
            be->attention(be, q, &kv, prompt, at, heads, scale, 0, out);
            be_wait(out);
            if (r >= 0) t[r] = now_s() - t0;
        }
        double s = median(t, reps);
        /* QK and PV, 2 flops per MAC; token t sees at + t + 1 keys */
        double flop = 4.0 * heads * hd * ((double)prompt * at + (double)prompt * (prompt + 1) / 2);
        printf("prompt of %d tokens at %d: %.3f ms per layer, %.1f GFLOP/s", prompt, at, s * 1e3, flop / s * 1e-9);
        if (peak > 0) printf(" (%.1f%% of the %.0f TFLOP/s f16 peak)", flop / s * 1e-10 / peak, peak);
        printf("\n");
        free_kv(&kv);
    }
    st_free(t);
    be_free(q);
    be_free(out);
    be->destroy(be);
    return 0;
}
