/* The tuned GEMM algorithms at run time (tune.h): per device, the table of
 * that card's architecture, a cuBLASLt handle, an operation descriptor and a
 * workspace; and the product gemm.cu asks for.
 *
 * Every piece of state is indexed by the device the call runs on, and a
 * device loads its own table (its architecture's default path, checked
 * against its cuBLASLt version): nothing decided for GPU 0 is applied to
 * GPU 1. The table is read on the device's first prompt product unless
 * cuda_tune_load ran earlier; never while a graph is being captured (the
 * workspace is allocated then), in which case that product simply takes the
 * untuned path.
 *
 * A refusal (cublasLtMatmulAlgoCheck or cublasLtMatmul not returning
 * success: a driver or library update, a shape beyond what was measured)
 * marks that one shape refused and the product runs through cublasGemmEx;
 * the first refusal on a device is logged, the rest are counted only.
 */
#include <string.h>

#include "backend/cuda/tune/tune_lt.cuh"

#define TUNE_MAX_DEVICES 16

#if ST_GPU_IS_HIP

int cuda_tune_device_key(int dev, int *arch, uint64_t *lt_version, char *name, size_t name_size) {
    (void)dev, (void)arch, (void)lt_version, (void)name, (void)name_size;
    st_error_set("strata tune: cuBLASLt tuning is not available in HIP builds (hipBLASLt is not supported yet)");
    return -1;
}
int cuda_tune_load(void) { return 0; }
int cuda_tune_install(const tune_table *t) {
    (void)t;
    st_error_set("cuda_tune_install: no cuBLASLt in HIP builds");
    return -1;
}
long cuda_tune_lt_runs(void) { return 0; }
long cuda_tune_lt_refusals(void) { return 0; }
void cuda_tune_release(void) {}
int cuda_tune_gemm(int n_out, int n_in, int n_tok, int m, const void *a, const void *b, float *c, cudaStream_t s) {
    (void)n_out, (void)n_in, (void)n_tok, (void)m, (void)a, (void)b, (void)c, (void)s;
    return 1;
}

#else

/* Descriptors of one tuned shape at one row count, made on first use. */
typedef struct {
    int m; /* 0: unused (a refused algorithm refuses the whole entry: tune_rt) */
    cublasLtMatrixLayout_t a, c;
} tune_rows;

typedef struct {
    cublasLtMatrixLayout_t b; /* NULL until first use */
    tune_rows rows[2];        /* the full chunk and the last, shorter one */
    int refused;
} tune_rt;

typedef struct {
    int loaded; /* the table was looked for (found or not) */
    tune_table t;
    tune_rt *rt; /* (t.n) */
    cublasLtHandle_t lt;
    cublasLtMatmulDesc_t op;
    void *ws;
    size_t ws_bytes;
    int warned; /* a refusal or a failure was logged */
    long runs, refusals;
} tune_dev;

static tune_dev g_dev[TUNE_MAX_DEVICES];

int cuda_tune_device_key(int dev, int *arch, uint64_t *lt_version, char *name, size_t name_size) {
    cudaDeviceProp p;
    if (cudaGetDeviceProperties(&p, dev) != cudaSuccess) {
        (void)cudaGetLastError();
        st_error_set("GPU %d cannot be queried", dev);
        return -1;
    }
    *arch = p.major * 10 + p.minor;
    *lt_version = (uint64_t)cublasLtGetVersion();
    if (name) snprintf(name, name_size, "%s", p.name);
    return 0;
}

static void rt_free(tune_dev *d) {
    for (int i = 0; d->rt && i < d->t.n; i++) {
        tune_rt *r = &d->rt[i];
        if (r->b) cublasLtMatrixLayoutDestroy(r->b);
        for (int k = 0; k < 2; k++)
            if (r->rows[k].m) cublasLtMatrixLayoutDestroy(r->rows[k].a), cublasLtMatrixLayoutDestroy(r->rows[k].c);
    }
    free(d->rt);
    d->rt = NULL;
    tune_table_free(&d->t);
}

/* Make *t (taken over) the device's table: handle, descriptor and workspace
 * as it needs. On failure the table is dropped with one warning. */
static int tune_dev_set(tune_dev *d, int dev, tune_table *t) {
    rt_free(d);
    d->warned = 0;
    size_t ws = 0;
    int n_lt = 0;
    for (int i = 0; i < t->n; i++)
        if (t->e[i].path == TUNE_PATH_LT) {
            n_lt++;
            if (t->e[i].workspace > ws) ws = (size_t)t->e[i].workspace;
        }
    if (n_lt == 0) { /* nothing runs through cuBLASLt: no handle needed */
        d->t = *t;
        d->rt = (tune_rt *)calloc((size_t)t->n + 1, sizeof(tune_rt));
        return 0;
    }
    if (ws > TUNE_WS_MAX) {
        ST_WARN("GPU %d: the tune table asks for %zu MiB of cuBLASLt workspace (at most %zu): ignored; run strata "
                "tune --gpu %d",
                dev, ws >> 20, TUNE_WS_MAX >> 20, dev);
        tune_table_free(t);
        return -1;
    }
    cublasStatus_t st = CUBLAS_STATUS_SUCCESS;
    if (!d->lt && (st = cublasLtCreate(&d->lt)) != CUBLAS_STATUS_SUCCESS) d->lt = NULL;
    if (st == CUBLAS_STATUS_SUCCESS && !d->op && (st = tune_lt_op(&d->op)) != CUBLAS_STATUS_SUCCESS) d->op = NULL;
    if (st != CUBLAS_STATUS_SUCCESS) {
        ST_WARN("GPU %d: cuBLASLt does not start (status %d): the tune table is not used, prompt products run "
                "through cublasGemmEx",
                dev, (int)st);
        tune_table_free(t);
        return -1;
    }
    if (ws > d->ws_bytes) {
        cuda_mem_grew(); /* a recorded graph holding the old workspace is recorded again */
        if (d->ws) CUDA_CHECK(cudaFree(d->ws));
        d->ws = NULL, d->ws_bytes = 0;
        if (cudaMalloc(&d->ws, ws) != cudaSuccess) {
            (void)cudaGetLastError();
            d->ws = NULL;
            ST_WARN("GPU %d: no device memory for %zu MiB of cuBLASLt workspace: the tune table is not used", dev,
                    ws >> 20);
            tune_table_free(t);
            return -1;
        }
        d->ws_bytes = ws;
    }
    d->t = *t;
    d->rt = (tune_rt *)calloc((size_t)t->n + 1, sizeof(tune_rt));
    if (!d->rt) {
        tune_table_free(&d->t);
        st_error_set("out of host memory");
        return -1;
    }
    return 0;
}

static int current_dev(void) {
    int dev = -1;
    if (cudaGetDevice(&dev) != cudaSuccess || dev < 0 || dev >= TUNE_MAX_DEVICES) return -1;
    return dev;
}

static void tune_load_dev(int dev) {
    tune_dev *d = &g_dev[dev];
    d->loaded = 1;
    int arch = 0;
    uint64_t ver = 0;
    if (cuda_tune_device_key(dev, &arch, &ver, NULL, 0) != 0) return;
    char path[4096];
    if (tune_table_default_path(arch, path, sizeof path) != 0) {
        ST_DEBUG("GPU %d: %s; no tune table is used", dev, st_error_get());
        return;
    }
    tune_table t;
    if (tune_table_load_for(&t, path, dev, arch, ver) == 1) (void)tune_dev_set(d, dev, &t);
}

int cuda_tune_load(void) {
    const int dev = current_dev();
    if (dev >= 0 && !g_dev[dev].loaded) tune_load_dev(dev);
    return 0;
}

int cuda_tune_install(const tune_table *t) {
    const int dev = current_dev();
    if (dev < 0) {
        st_error_set("cuda_tune_install: no current device below %d", TUNE_MAX_DEVICES);
        return -1;
    }
    tune_dev *d = &g_dev[dev];
    d->loaded = 1;
    d->runs = d->refusals = 0;
    if (!t) {
        rt_free(d);
        return 0;
    }
    tune_table c;
    tune_table_init(&c, t->arch, t->lt_version, t->gpu);
    for (int i = 0; i < t->n; i++) tune_table_put(&c, &t->e[i]);
    return tune_dev_set(d, dev, &c);
}

long cuda_tune_lt_runs(void) {
    const int dev = current_dev();
    return dev < 0 ? 0 : g_dev[dev].runs;
}

long cuda_tune_lt_refusals(void) {
    const int dev = current_dev();
    return dev < 0 ? 0 : g_dev[dev].refusals;
}

void cuda_tune_release(void) {
    int cur = 0;
    if (cudaGetDevice(&cur) != cudaSuccess) return;
    for (int dev = 0; dev < TUNE_MAX_DEVICES; dev++) {
        tune_dev *d = &g_dev[dev];
        if (!d->loaded && !d->lt && !d->ws) continue;
        CUDA_CHECK(cudaSetDevice(dev));
        rt_free(d);
        if (d->op) cublasLtMatmulDescDestroy(d->op);
        if (d->lt) cublasLtDestroy(d->lt);
        if (d->ws) (void)cudaFree(d->ws);
        memset(d, 0, sizeof *d);
    }
    CUDA_CHECK(cudaSetDevice(cur));
}

static void tune_refuse(tune_dev *d, int dev, tune_rt *r, const tune_entry *e, int m, int st) {
    r->refused = 1;
    d->refusals++;
    if (!d->warned)
        ST_WARN("GPU %d: cuBLASLt refused the tuned algorithm of the %d x %d x %d product (rows of %d, status %d); "
                "cublasGemmEx runs the products it refuses (strata tune --gpu %d measures again)",
                dev, e->n_out, e->n_in, e->n_tok, m, st, dev);
    d->warned = 1;
}

/* The descriptors of entry r at m rows, made and checked on first use; NULL
 * when m is not a row count the tuner measured, or the algorithm is refused. */
static tune_rows *tune_rows_get(tune_dev *d, int dev, tune_rt *r, const tune_entry *e, int m) {
    for (int k = 0; k < 2; k++)
        if (r->rows[k].m == m) return &r->rows[k];
    const int64_t chunk = mm_chunk_rows(e->n_in, e->n_out);
    const int64_t last = mm_last_chunk_rows(e->n_out, chunk);
    if (m != chunk && m != last) return NULL;
    cublasStatus_t st = CUBLAS_STATUS_SUCCESS;
    if (!r->b && (st = tune_lt_b(e->n_tok, e->n_in, &r->b)) != CUBLAS_STATUS_SUCCESS) r->b = NULL;
    tune_rows *w = r->rows[0].m ? &r->rows[1] : &r->rows[0];
    if (st == CUBLAS_STATUS_SUCCESS) st = tune_lt_rows(m, e->n_tok, e->n_in, e->n_out, &w->a, &w->c);
    if (st != CUBLAS_STATUS_SUCCESS) {
        tune_refuse(d, dev, r, e, m, (int)st);
        return NULL;
    }
    w->m = m;
    cublasLtMatmulHeuristicResult_t res;
    memset(&res, 0, sizeof res);
    cublasLtMatmulAlgo_t algo;
    memcpy(&algo, e->algo, sizeof algo);
    st = cublasLtMatmulAlgoCheck(d->lt, d->op, w->a, r->b, w->c, w->c, &algo, &res);
    if (st == CUBLAS_STATUS_SUCCESS && res.workspaceSize > d->ws_bytes) st = CUBLAS_STATUS_NOT_SUPPORTED;
    if (st != CUBLAS_STATUS_SUCCESS) {
        tune_refuse(d, dev, r, e, m, (int)st);
        return NULL;
    }
    return w;
}

int cuda_tune_gemm(int n_out, int n_in, int n_tok, int m, const void *a, const void *b, float *c, cudaStream_t s) {
    static_assert(sizeof(cublasLtMatmulAlgo_t) == TUNE_ALGO_WORDS * sizeof(uint64_t), "algorithm words");
    const int dev = current_dev();
    if (dev < 0) return 1;
    tune_dev *d = &g_dev[dev];
    if (!d->loaded) {
        cudaStreamCaptureStatus cs = cudaStreamCaptureStatusNone;
        if (cudaStreamIsCapturing(s, &cs) != cudaSuccess || cs != cudaStreamCaptureStatusNone) return 1;
        tune_load_dev(dev);
    }
    if (d->t.n == 0 || !d->lt) return 1;
    const tune_entry *e = tune_table_find(&d->t, n_out, n_in, n_tok);
    if (!e) return 1;
    tune_rt *r = &d->rt[e - d->t.e];
    if (e->path != TUNE_PATH_LT || r->refused) return 1;
    if ((((uintptr_t)a | (uintptr_t)b) % TUNE_AB_ALIGN) || (uintptr_t)c % tune_c_align(n_in, n_out)) return 1;
    tune_rows *w = tune_rows_get(d, dev, r, e, m);
    if (!w) return 1;
    cublasLtMatmulAlgo_t algo;
    memcpy(&algo, e->algo, sizeof algo);
    const cublasStatus_t st = tune_lt_matmul(d->lt, d->op, &algo, a, w->a, b, r->b, c, w->c, d->ws, d->ws_bytes, s);
    if (st != CUBLAS_STATUS_SUCCESS) {
        tune_refuse(d, dev, r, e, m, (int)st);
        return 1;
    }
    d->runs++;
    return 0;
}

#endif
