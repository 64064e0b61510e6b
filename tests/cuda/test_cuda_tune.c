/* `strata tune` on GPU 0 (backend/cuda/tune.h): measure a few shapes, then
 * run the engine's matrix product (cuda_matmul, GEMM path forced) with and
 * without the table and compare.
 *
 * Shapes: a small square one, a SmolLM2-like 576-wide one, and 7000 x 5120,
 * which gemm.cu splits into two row chunks (6528 + 472 rows: the last
 * chunk has its own descriptors), at 64 and 37 tokens. Weights in
 * Q8_0 (dequantized to bf16 in chunks) and BF16 (used in place).
 *
 * Checks:
 *  - the table is written and read back with the card's key;
 *  - with the table (path forced to cuBLASLt by keep_lt) every product runs
 *    through cuBLASLt (the run counter moves) and matches the cublasGemmEx
 *    product: NMSE below 1e-8 (same bf16 inputs and f32 accumulation, only
 *    the summation order differs: ~1e-13 expected);
 *  - an algorithm cuBLASLt refuses (all bits set) falls back to cublasGemmEx:
 *    the result equals the untuned one exactly, one refusal counted, and
 *    the shape is not retried;
 *  - the engine's own loading: the table at $XDG_CACHE_HOME/strata/
 *    tune-smXY.tsv is picked up by the first product; one keyed for another
 *    architecture is ignored (products stay on cublasGemmEx).
 *
 * Without a CUDA device it prints "SKIPPED: no CUDA device" and exits 0.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "backend/cuda/compat.h"
#include "backend/cuda/mm/mm.h"
#include "backend/cuda/tune/tune.h"
#include "core/log.h"
#include "quant/quant.h"

#include "../common/check.h"
#include "ck.h"

static uint64_t g_rng = 0x2545F4914F6CDD1Dull;
static float rnd(void) {
    g_rng ^= g_rng << 13, g_rng ^= g_rng >> 7, g_rng ^= g_rng << 17;
    return (float)((g_rng >> 40) & 0xFFFFFF) / 8388608.0f - 1.0f;
}

static const int SHAPES[] = {1024, 512, 576, 576, 7000, 5120};
#define N_SHAPES 3
static const int TOKS[] = {64, 37};
#define N_TOKS 2

/* A device weight matrix of type t with random values. */
static st_weight make_weight(qt_type t, int n_out, int n_in) {
    st_weight w;
    memset(&w, 0, sizeof w);
    w.type = t, w.n_in = n_in, w.n_out = n_out, w.n_mat = 1;
    w.row_bytes = qt_row_size(t, n_in);
    float *f = malloc((size_t)n_in * sizeof(float));
    uint8_t *h = malloc(w.row_bytes * (size_t)n_out);
    for (int r = 0; r < n_out; r++) {
        for (int c = 0; c < n_in; c++) f[c] = 0.05f * rnd();
        qt_quantize(t, f, h + (size_t)r * w.row_bytes, n_in);
    }
    void *d;
    CK(cudaMalloc(&d, w.row_bytes * (size_t)n_out));
    CK(cudaMemcpy(d, h, w.row_bytes * (size_t)n_out, cudaMemcpyHostToDevice));
    w.data = d;
    free(f), free(h);
    return w;
}

/* y = W x on the GEMM path; the result on the host in out. */
static void product(const st_weight *w, const float *dx, float *dy, int n_tok, float *out) {
    const size_t n = (size_t)n_tok * w->n_out;
    CK(cudaMemset(dy, 0xFF, n * 4)); /* NaN: an unwritten value fails */
    if (cuda_matmul(w, 0, dx, dy, n_tok, 0, 0) != 0) {
        printf("FAIL cuda_matmul: %s\n", st_error_get());
        check_fail();
    }
    CK(cudaDeviceSynchronize());
    CK(cudaMemcpy(out, dy, n * 4, cudaMemcpyDeviceToHost));
}

static double nmse(const float *a, const float *ref, size_t n) {
    double d = 0, r = 0;
    for (size_t i = 0; i < n; i++) {
        const double e = (double)a[i] - ref[i];
        d += e * e, r += (double)ref[i] * ref[i];
    }
    return r > 0 ? d / r : d == 0 ? 0 : INFINITY;
}

/* Every product with and without the table t (installed), per type. */
static void check_products(const tune_table *t) {
    static const qt_type types[] = {QT_Q8_0, QT_BF16};
    for (int s = 0; s < N_SHAPES; s++) {
        const int n_out = SHAPES[2 * s], n_in = SHAPES[2 * s + 1];
        const int max_tok = 64;
        float *hx = malloc((size_t)max_tok * n_in * 4), *ref = malloc((size_t)max_tok * n_out * 4),
              *got = malloc((size_t)max_tok * n_out * 4);
        for (size_t i = 0; i < (size_t)max_tok * n_in; i++) hx[i] = rnd();
        float *dx, *dy;
        CK(cudaMalloc((void **)&dx, (size_t)max_tok * n_in * 4));
        CK(cudaMalloc((void **)&dy, (size_t)max_tok * n_out * 4));
        CK(cudaMemcpy(dx, hx, (size_t)max_tok * n_in * 4, cudaMemcpyHostToDevice));
        for (int ti = 0; ti < 2; ti++) {
            st_weight w = make_weight(types[ti], n_out, n_in);
            for (int k = 0; k < N_TOKS; k++) {
                const int n_tok = TOKS[k];
                const size_t n = (size_t)n_tok * n_out;
                cuda_tune_install(NULL);
                product(&w, dx, dy, n_tok, ref);
                CHECK(cuda_tune_lt_runs() == 0, "cuBLASLt ran without a table");
                cuda_tune_install(t);
                product(&w, dx, dy, n_tok, got);
                const long runs = cuda_tune_lt_runs();
                const double e = nmse(got, ref, n);
                const tune_entry *te = tune_table_find(t, n_out, n_in, n_tok);
                const int chunks = types[ti] == QT_BF16
                                       ? 1
                                       : (int)((n_out + mm_chunk_rows(n_in, n_out) - 1) / mm_chunk_rows(n_in, n_out));
                const int want =
                    te && te->path == TUNE_PATH_LT && (types[ti] != QT_BF16 || mm_chunk_rows(n_in, n_out) == n_out)
                        ? chunks
                        : 0;
                printf("%-5s %5d x %5d x %3d  cuBLASLt products %ld (want %d)  NMSE vs cublasGemmEx %.2e\n",
                       qt_get(types[ti])->name, n_out, n_in, n_tok, runs, want, e);
                CHECK(runs == want, "%d x %d x %d: %ld cuBLASLt products, want %d", n_out, n_in, n_tok, runs, want);
                CHECK(e < 1e-8, "%d x %d x %d: NMSE %.3e against cublasGemmEx", n_out, n_in, n_tok, e);
                CHECK(cuda_tune_lt_refusals() == 0, "a measured algorithm was refused");
            }
            CK(cudaFree((void *)w.data));
        }
        CK(cudaFree(dx));
        CK(cudaFree(dy));
        free(hx), free(ref), free(got);
    }
}

/* An algorithm cuBLASLt cannot take: the product must still be right. */
static void check_refusal(const tune_table *t) {
    tune_table bad;
    tune_table_init(&bad, t->arch, t->lt_version, t->gpu);
    tune_entry e = *tune_table_find(t, 1024, 512, 64);
    e.path = TUNE_PATH_LT;
    memset(e.algo, 0xFF, sizeof e.algo);
    tune_table_put(&bad, &e);
    st_weight w = make_weight(QT_Q8_0, 1024, 512);
    float *hx = malloc(64 * 512 * 4), *ref = malloc(64 * 1024 * 4), *got = malloc(64 * 1024 * 4);
    for (int i = 0; i < 64 * 512; i++) hx[i] = rnd();
    float *dx, *dy;
    CK(cudaMalloc((void **)&dx, 64 * 512 * 4));
    CK(cudaMalloc((void **)&dy, 64 * 1024 * 4));
    CK(cudaMemcpy(dx, hx, 64 * 512 * 4, cudaMemcpyHostToDevice));
    cuda_tune_install(NULL);
    product(&w, dx, dy, 64, ref);
    cuda_tune_install(&bad);
    printf("an algorithm of all ones (one warning expected):\n");
    product(&w, dx, dy, 64, got);
    product(&w, dx, dy, 64, got); /* not retried, not said again */
    printf("refused: %ld, cuBLASLt products %ld, results %s\n", cuda_tune_lt_refusals(), cuda_tune_lt_runs(),
           memcmp(got, ref, 64 * 1024 * 4) ? "DIFFER" : "equal");
    CHECK(cuda_tune_lt_refusals() == 1 && cuda_tune_lt_runs() == 0, "refusal: %ld refused, %ld ran",
          cuda_tune_lt_refusals(), cuda_tune_lt_runs());
    CHECK(!memcmp(got, ref, 64 * 1024 * 4), "the fallback after a refusal differs from cublasGemmEx");
    cuda_tune_install(NULL);
    /* the engine's loading from the default path, fresh state */
    char dir[] = "/tmp/strata-cuda-tune.XXXXXX", path[512];
    if (!mkdtemp(dir)) exit(1);
    setenv("XDG_CACHE_HOME", dir, 1);
    CHECK(tune_table_default_path(t->arch, path, sizeof path) == 0, "default path: %s", st_error_get());
    tune_table good;
    tune_table_init(&good, t->arch, t->lt_version, t->gpu);
    e = *tune_table_find(t, 1024, 512, 64);
    e.path = TUNE_PATH_LT;
    tune_table_put(&good, &e);
    CHECK(tune_table_write(&good, path) == 0, "write %s: %s", path, st_error_get());
    cuda_tune_release();
    printf("the table at %s, loaded by the first product:\n", path);
    product(&w, dx, dy, 64, got);
    CHECK(cuda_tune_lt_runs() == 1 && nmse(got, ref, 64 * 1024) < 1e-8, "default-path table: %ld runs, NMSE %.2e",
          cuda_tune_lt_runs(), nmse(got, ref, 64 * 1024));
    good.arch += 1; /* keyed for another architecture: ignored, one line */
    CHECK(tune_table_write(&good, path) == 0, "write %s: %s", path, st_error_get());
    cuda_tune_release();
    printf("the same table keyed sm_%d (one warning expected):\n", good.arch);
    product(&w, dx, dy, 64, got);
    CHECK(cuda_tune_lt_runs() == 0 && !memcmp(got, ref, 64 * 1024 * 4), "another architecture's table was used");
    unlink(path);
    cuda_tune_release();
    tune_table_free(&good);
    tune_table_free(&bad);
    CK(cudaFree((void *)w.data));
    CK(cudaFree(dx));
    CK(cudaFree(dy));
    free(hx), free(ref), free(got);
}

int main(void) {
    int n_dev = 0;
    if (cudaGetDeviceCount(&n_dev) != cudaSuccess || n_dev == 0) {
        printf("SKIPPED: no CUDA device\n");
        return 0;
    }
    CK(cudaSetDevice(0));
    int arch = 0;
    uint64_t ver = 0;
    char name[256];
    if (cuda_tune_device_key(0, &arch, &ver, name, sizeof name) != 0) {
        printf("SKIPPED: %s\n", st_error_get()); /* HIP: no cuBLASLt */
        return 0;
    }
    tune_table t;
    tune_table_init(&t, arch, ver, name);
    /* keep_lt: every shape takes the cuBLASLt path, so every product is compared */
    cuda_tune_params p = {0, SHAPES, N_SHAPES, TOKS, N_TOKS, 8, 3, 1, stdout};
    if (cuda_tune_run(&p, &t) != 0) {
        printf("FAIL cuda_tune_run: %s\n", st_error_get());
        return 1;
    }
    CHECK(t.n == N_SHAPES * N_TOKS, "%d entries for %d shapes", t.n, N_SHAPES * N_TOKS);
    char path[] = "/tmp/strata-tune-gpu.XXXXXX";
    const int fd = mkstemp(path);
    if (fd >= 0) close(fd);
    tune_table r;
    CHECK(tune_table_write(&t, path) == 0 && tune_table_load(&r, path) == 0 && r.n == t.n && r.arch == arch &&
              r.lt_version == ver,
          "table round trip: %s", st_error_get());
    unlink(path);
    for (int i = 0; i < t.n; i++)
        CHECK(t.e[i].path == TUNE_PATH_LT, "%d x %d x %d: no cuBLASLt candidate ran", t.e[i].n_out, t.e[i].n_in,
              t.e[i].n_tok);
    cuda_mm_force_path(2); /* GEMM for every token count */
    check_products(&r);
    check_refusal(&r);
    cuda_mm_force_path(0);
    tune_table_free(&r);
    tune_table_free(&t);
    cuda_mm_release();
    return check_report("cuda_tune");
}
