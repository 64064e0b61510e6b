/* `strata tune`'s measurements (cuda_tune_run, tune.h): for each product
 * shape, cublasGemmEx against the candidates of cuBLASLt's heuristic, on
 * this card, with the descriptors the run time uses (tune_lt.cuh).
 *
 * The product measured is gemm.cu's: the weights in the same row chunks
 * (one chunk's worth of bf16 rows, reused for every chunk as gemm.cu reuses
 * its scratch), bf16 activations, f32 output into the whole y. Dequantizing
 * the weights costs the same on both paths and is left out.
 *
 * Timing: CUDA events around a batch of products (enough for ~0.5 ms, so the
 * event resolution does not matter), after two warm-up products; the median
 * of `reps` batches. A candidate must first reproduce cublasGemmEx's output
 * (NMSE below 1e-6 against it: the same bf16 inputs and f32 accumulation
 * differ only in summation order, ~1e-12) before its time counts.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cuda/mm/mm_impl.cuh"
#include "backend/cuda/tune/tune_lt.cuh"

#if ST_GPU_IS_HIP

int cuda_tune_run(const cuda_tune_params *p, tune_table *t) {
    (void)p, (void)t;
    st_error_set("strata tune: cuBLASLt tuning is not available in HIP builds (hipBLASLt is not supported yet)");
    return -1;
}

#else

#define TUNE_NMSE_MAX  1e-6
#define TUNE_MAX_ALGOS 32
#define TUNE_BATCH_MS  0.5f

/* Deterministic values in [-1, 1), exact in bf16. */
static __global__ void tune_fill_kernel(__nv_bfloat16 *p, size_t n, uint32_t seed) {
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        uint32_t h = (uint32_t)i * 0x9E3779B1u ^ seed;
        h ^= h >> 16, h *= 0x85EBCA6Bu, h ^= h >> 13, h *= 0xC2B2AE35u, h ^= h >> 16;
        p[i] = __float2bfloat16_rn((float)(h >> 8) * (2.0f / 16777216.0f) - 1.0f);
    }
}

/* out[0] += sum (x - ref)^2, out[1] += sum ref^2 (a NaN in x makes out[0] NaN). */
static __global__ void tune_diff_kernel(const float *x, const float *ref, size_t n, double *out) {
    double d = 0, r = 0;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        const double e = (double)x[i] - (double)ref[i];
        d += e * e;
        r += (double)ref[i] * ref[i];
    }
    for (int o = 16; o > 0; o >>= 1) d += __shfl_xor_sync(ST_FULL_MASK, d, o), r += __shfl_xor_sync(ST_FULL_MASK, r, o);
    if ((threadIdx.x & 31) == 0) atomicAdd(&out[0], d), atomicAdd(&out[1], r);
}

/* Device buffers, grown as shapes need. */
typedef struct {
    void *a, *b, *ws;
    float *c, *c_ref;
    double *diff;
    size_t a_bytes, b_bytes, c_bytes;
} tune_bufs;

static int grow(void **p, size_t *have, size_t need) {
    if (need <= *have) return 0;
    if (*p) CUDA_CHECK(cudaFree(*p));
    *p = NULL, *have = 0;
    if (cudaMalloc(p, need) != cudaSuccess) {
        (void)cudaGetLastError();
        *p = NULL;
        st_error_set("strata tune: out of device memory for %zu MiB", need >> 20);
        return -1;
    }
    *have = need;
    return 0;
}

/* One product shape's state for the measuring loops. */
typedef struct {
    int n_out, n_in, n_tok;
    int64_t chunk, last;
    cublasHandle_t blas;
    cublasLtHandle_t lt;
    cublasLtMatmulDesc_t op;
    cublasLtMatrixLayout_t la, lc, la_last, lc_last, lb;
    const cublasLtMatmulAlgo_t *algo; /* NULL: cublasGemmEx */
    tune_bufs *bf;
    cudaStream_t s;
} tune_job;

/* The whole product once into c; a library status other than success. */
static int job_run(const tune_job *j, float *c) {
    for (int64_t r0 = 0; r0 < j->n_out; r0 += j->chunk) {
        const int last = r0 + j->chunk >= j->n_out;
        const int m = (int)(last ? j->n_out - r0 : j->chunk);
        const cublasLtMatrixLayout_t la = last ? j->la_last : j->la, lc = last ? j->lc_last : j->lc;
        const int st = j->algo
                           ? (int)tune_lt_matmul(j->lt, j->op, j->algo, j->bf->a, la, j->bf->b, j->lb, c + r0, lc,
                                                 j->bf->ws, TUNE_WS_MAX, j->s)
                           : (int)mm_chunk_gemm(j->blas, m, j->n_tok, j->n_in, j->bf->a, j->bf->b, c + r0, j->n_out);
        if (st != 0) return st;
    }
    return 0;
}

static int cmp_float(const void *a, const void *b) {
    const float x = *(const float *)a, y = *(const float *)b;
    return x < y ? -1 : x > y;
}

/* Median microseconds of the whole product; -1 when the library refused. */
static double job_time(const tune_job *j, int reps) {
    cudaEvent_t e0, e1;
    CUDA_CHECK(cudaEventCreate(&e0));
    CUDA_CHECK(cudaEventCreate(&e1));
    double us = -1;
    float one_ms = 0, t[64];
    int batch = 1;
    if (reps > 64) reps = 64;
    if (job_run(j, j->bf->c) != 0) goto done; /* warm-up */
    CUDA_CHECK(cudaEventRecord(e0, j->s));
    if (job_run(j, j->bf->c) != 0) goto done;
    CUDA_CHECK(cudaEventRecord(e1, j->s));
    CUDA_CHECK(cudaEventSynchronize(e1));
    CUDA_CHECK(cudaEventElapsedTime(&one_ms, e0, e1));
    batch = one_ms > 0 ? (int)ceilf(TUNE_BATCH_MS / one_ms) : 50;
    batch = batch < 1 ? 1 : batch > 50 ? 50 : batch;
    for (int r = 0; r < reps; r++) {
        CUDA_CHECK(cudaEventRecord(e0, j->s));
        for (int k = 0; k < batch; k++)
            if (job_run(j, j->bf->c) != 0) goto done;
        CUDA_CHECK(cudaEventRecord(e1, j->s));
        CUDA_CHECK(cudaEventSynchronize(e1));
        CUDA_CHECK(cudaEventElapsedTime(&t[r], e0, e1));
        t[r] /= (float)batch;
    }
    qsort(t, (size_t)reps, sizeof t[0], cmp_float);
    us = 1000.0 * (reps % 2 ? t[reps / 2] : 0.5f * (t[reps / 2 - 1] + t[reps / 2]));
done:
    CUDA_CHECK(cudaStreamSynchronize(j->s));
    CUDA_CHECK(cudaEventDestroy(e0));
    CUDA_CHECK(cudaEventDestroy(e1));
    return us;
}

/* NMSE of the product with j->algo against the cublasGemmEx output in c_ref;
 * NaN when it did not run or left NaNs. */
static double job_nmse(const tune_job *j) {
    const size_t n = (size_t)j->n_out * j->n_tok;
    CUDA_CHECK(cudaMemsetAsync(j->bf->c, 0xFF, n * 4, j->s)); /* NaN: an unwritten value fails */
    if (job_run(j, j->bf->c) != 0) return NAN;
    CUDA_CHECK(cudaMemsetAsync(j->bf->diff, 0, 2 * sizeof(double), j->s));
    tune_diff_kernel<<<256, 256, 0, j->s>>>(j->bf->c, j->bf->c_ref, n, j->bf->diff);
    CUDA_LAUNCH_CHECK();
    double h[2];
    CUDA_CHECK(cudaMemcpyAsync(h, j->bf->diff, sizeof h, cudaMemcpyDeviceToHost, j->s));
    CUDA_CHECK(cudaStreamSynchronize(j->s));
    return h[1] > 0 ? h[0] / h[1] : h[0] == 0 ? 0 : NAN;
}

static int algo_id(const cublasLtMatmulAlgo_t *a) {
    int32_t id = -1;
    size_t wr = 0;
    return cublasLtMatmulAlgoConfigGetAttribute(a, CUBLASLT_ALGO_CONFIG_ID, &id, sizeof id, &wr) ==
                   CUBLAS_STATUS_SUCCESS
               ? id
               : -1;
}

/* Measure one shape; its entry into *t. */
static int tune_one(const cuda_tune_params *p, tune_job *j, tune_table *t) {
    tune_bufs *bf = j->bf;
    const int n_out = j->n_out, n_in = j->n_in, n_tok = j->n_tok;
    j->chunk = mm_chunk_rows(n_in, n_out);
    j->last = mm_last_chunk_rows(n_out, j->chunk);
    const size_t c_bytes = (size_t)n_out * n_tok * 4;
    if (grow(&bf->a, &bf->a_bytes, (size_t)j->chunk * n_in * 2) || grow(&bf->b, &bf->b_bytes, (size_t)n_tok * n_in * 2))
        return -1;
    if (c_bytes > bf->c_bytes) {
        size_t have = bf->c_bytes;
        if (grow((void **)&bf->c, &have, c_bytes)) return -1;
        have = bf->c_bytes;
        if (grow((void **)&bf->c_ref, &have, c_bytes)) return -1;
        bf->c_bytes = c_bytes;
    }
    tune_fill_kernel<<<512, 256, 0, j->s>>>((__nv_bfloat16 *)bf->a, (size_t)j->chunk * n_in, 0x1234u + (uint32_t)n_in);
    CUDA_LAUNCH_CHECK();
    tune_fill_kernel<<<512, 256, 0, j->s>>>((__nv_bfloat16 *)bf->b, (size_t)n_tok * n_in, 0xBEEFu + (uint32_t)n_tok);
    CUDA_LAUNCH_CHECK();

    tune_entry e;
    memset(&e, 0, sizeof e);
    e.n_out = n_out, e.n_in = n_in, e.n_tok = n_tok, e.path = TUNE_PATH_GEMMEX;
    j->algo = NULL;
    int st = job_run(j, bf->c_ref);
    CUDA_CHECK(cudaStreamSynchronize(j->s));
    if (st != 0) {
        st_error_set("strata tune: cublasGemmEx refused the %d x %d x %d product (status %d)", n_out, n_in, n_tok, st);
        return -1;
    }
    e.gemmex_us = job_time(j, p->reps);

    /* candidates for the full chunk, at the alignments the run time has */
    j->la = j->lc = j->la_last = j->lc_last = j->lb = NULL;
    cublasLtMatmulPreference_t pref = NULL;
    cublasLtMatmulHeuristicResult_t res[TUNE_MAX_ALGOS];
    int n_res = 0, n_ok = 0, best_id = -1;
    const uint64_t ws_max = TUNE_WS_MAX;
    const uint32_t ab = TUNE_AB_ALIGN, ca = tune_c_align(n_in, n_out);
    cublasStatus_t ls = tune_lt_rows((int)j->chunk, n_tok, n_in, n_out, &j->la, &j->lc);
    if (ls == CUBLAS_STATUS_SUCCESS) ls = tune_lt_rows((int)j->last, n_tok, n_in, n_out, &j->la_last, &j->lc_last);
    if (ls == CUBLAS_STATUS_SUCCESS) ls = tune_lt_b(n_tok, n_in, &j->lb);
    if (ls == CUBLAS_STATUS_SUCCESS) ls = cublasLtMatmulPreferenceCreate(&pref);
    if (ls == CUBLAS_STATUS_SUCCESS) {
        cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws_max, sizeof ws_max);
        cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &ab, sizeof ab);
        cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &ab, sizeof ab);
        cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &ca, sizeof ca);
        cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &ca, sizeof ca);
        ls = cublasLtMatmulAlgoGetHeuristic(j->lt, j->op, j->la, j->lb, j->lc, j->lc, pref, p->max_algos, res, &n_res);
    }
    if (ls != CUBLAS_STATUS_SUCCESS) n_res = 0; /* no candidates: cublasGemmEx stays */
    for (int k = 0; k < n_res; k++) {
        if (res[k].state != CUBLAS_STATUS_SUCCESS || res[k].workspaceSize > TUNE_WS_MAX) continue;
        cublasLtMatmulHeuristicResult_t chk;
        memset(&chk, 0, sizeof chk);
        if (j->last != j->chunk && /* the last chunk must take it too */
            (cublasLtMatmulAlgoCheck(j->lt, j->op, j->la_last, j->lb, j->lc_last, j->lc_last, &res[k].algo, &chk) !=
                 CUBLAS_STATUS_SUCCESS ||
             chk.workspaceSize > TUNE_WS_MAX))
            continue;
        const uint64_t need =
            j->last != j->chunk && chk.workspaceSize > res[k].workspaceSize ? chk.workspaceSize : res[k].workspaceSize;
        j->algo = &res[k].algo;
        const double nmse = job_nmse(j);
        if (!(nmse <= TUNE_NMSE_MAX)) {
            if (p->progress)
                fprintf(p->progress, "  candidate %d (algorithm %d): NMSE %.2e against cublasGemmEx, not used\n", k,
                        algo_id(&res[k].algo), nmse);
            continue;
        }
        const double us = job_time(j, p->reps);
        if (us < 0) continue;
        n_ok++;
        if (e.lt_us == 0 || us < e.lt_us) {
            e.lt_us = us;
            e.workspace = need;
            memcpy(e.algo, &res[k].algo, sizeof e.algo);
            best_id = algo_id(&res[k].algo);
        }
    }
    j->algo = NULL;
    if (pref) cublasLtMatmulPreferenceDestroy(pref);
    cublasLtMatrixLayout_t ls_all[5] = {j->la, j->lc, j->la_last, j->lc_last, j->lb};
    for (int k = 0; k < 5; k++)
        if (ls_all[k]) cublasLtMatrixLayoutDestroy(ls_all[k]);
    /* cuBLASLt only when it is measurably faster (1%: below that it is noise) */
    if (n_ok && (p->keep_lt || e.lt_us < 0.99 * e.gemmex_us)) e.path = TUNE_PATH_LT;
    if (p->progress) {
        fprintf(p->progress, "%7d x %6d x %4d  cublasGemmEx %9.1f us", n_out, n_in, n_tok, e.gemmex_us);
        if (n_ok)
            fprintf(p->progress, "  cuBLASLt %9.1f us (algorithm %d, best of %d that ran of %d)  %.2fx  -> %s\n",
                    e.lt_us, best_id, n_ok, n_res, e.gemmex_us / e.lt_us,
                    e.path == TUNE_PATH_LT ? "cuBLASLt" : "cublasGemmEx");
        else
            fprintf(p->progress, "  cuBLASLt: no candidate ran (status %d, %d proposed)  -> cublasGemmEx\n", (int)ls,
                    n_res);
        fflush(p->progress);
    }
    tune_table_put(t, &e);
    return 0;
}

int cuda_tune_run(const cuda_tune_params *p, tune_table *t) {
    int arch = 0;
    uint64_t ver = 0;
    if (cuda_tune_device_key(p->dev, &arch, &ver, NULL, 0) != 0) return -1;
    if (t->arch != arch || t->lt_version != ver) {
        st_error_set("strata tune: the table is keyed sm_%d / cuBLASLt %llu, GPU %d is sm_%d / %llu", t->arch,
                     (unsigned long long)t->lt_version, p->dev, arch, (unsigned long long)ver);
        return -1;
    }
    cuda_tune_params q = *p;
    if (q.max_algos <= 0) q.max_algos = 8;
    if (q.max_algos > TUNE_MAX_ALGOS) q.max_algos = TUNE_MAX_ALGOS;
    if (q.reps <= 0) q.reps = 7;
    CUDA_CHECK(cudaSetDevice(p->dev));
    tune_bufs bf;
    memset(&bf, 0, sizeof bf);
    tune_job j;
    memset(&j, 0, sizeof j);
    j.bf = &bf;
    int rc = -1;
    cublasStatus_t st = cublasCreate(&j.blas);
    if (st != CUBLAS_STATUS_SUCCESS) {
        j.blas = NULL;
        st_error_set("strata tune: cuBLAS does not start on GPU %d (status %d)", p->dev, (int)st);
        return -1;
    }
    if ((st = cublasLtCreate(&j.lt)) != CUBLAS_STATUS_SUCCESS || (st = tune_lt_op(&j.op)) != CUBLAS_STATUS_SUCCESS) {
        st_error_set("strata tune: cuBLASLt does not start on GPU %d (status %d)", p->dev, (int)st);
        goto done;
    }
    CUDA_CHECK(cudaStreamCreate(&j.s));
    if (cublasSetStream(j.blas, j.s) != CUBLAS_STATUS_SUCCESS) {
        st_error_set("strata tune: cublasSetStream failed");
        goto done;
    }
    if (cudaMalloc(&bf.ws, TUNE_WS_MAX) != cudaSuccess ||
        cudaMalloc((void **)&bf.diff, 2 * sizeof(double)) != cudaSuccess) {
        (void)cudaGetLastError();
        st_error_set("strata tune: out of device memory for the workspace");
        goto done;
    }
    rc = 0;
    for (int i = 0; i < q.n_shapes && rc == 0; i++)
        for (int k = 0; k < q.n_n_toks && rc == 0; k++) {
            j.n_out = q.shapes[2 * i], j.n_in = q.shapes[2 * i + 1], j.n_tok = q.n_toks[k];
            if (j.n_out <= 0 || j.n_in <= 0 || j.n_tok <= 0) {
                st_error_set("strata tune: bad shape %d x %d x %d", j.n_out, j.n_in, j.n_tok);
                rc = -1;
            } else {
                rc = tune_one(&q, &j, t);
            }
        }
done:
    if (j.s) CUDA_CHECK(cudaStreamSynchronize(j.s));
    (void)cudaFree(bf.a), (void)cudaFree(bf.b), (void)cudaFree(bf.c), (void)cudaFree(bf.c_ref);
    (void)cudaFree(bf.ws), (void)cudaFree(bf.diff);
    if (j.op) cublasLtMatmulDescDestroy(j.op);
    if (j.lt) cublasLtDestroy(j.lt);
    cublasDestroy(j.blas);
    if (j.s) CUDA_CHECK(cudaStreamDestroy(j.s));
    return rc;
}

#endif
