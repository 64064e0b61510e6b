/* The public matrix products (mm.h): argument checks, the choice between the
 * matrix-vector kernels (mmv.cu) and the bf16 GEMM path (gemm.cu), the MoE
 * grouping, and the per-device scratch.
 *
 * Path choice: up to MM_MMV_MAX_TOK tokens the product is bound by reading
 * the weights once, which the matrix-vector kernel does at near HBM speed;
 * past that, dequantizing once and letting the tensor cores run is cheaper
 * than re-reading the weights per 8 tokens (docs/cuda-kernels.md has the
 * measured crossover).
 */
#include <stdlib.h>
#include <string.h>

#include "backend/cuda/mm/mm_impl.cuh"
#include "backend/cuda/ops.h"

extern "C" {
#include "quant/quant.h"
}

#define MM_MAX_DEVICES 16
/* MoE prompt path: an expert with at least this many tokens goes through the
 * GEMM path, fewer through the matrix-vector kernel in groups of 8. */
#define MM_MOE_GEMM_MIN 32

static mm_scratch g_scratch[MM_MAX_DEVICES];
static int g_force_path[MM_MAX_DEVICES]; /* per device, as the scratch: two cards may differ */

static int cur_dev(void) {
    int dev = 0;
    CUDA_CHECK(cudaGetDevice(&dev));
    ST_ASSERT(dev >= 0 && dev < MM_MAX_DEVICES);
    return dev;
}

int cuda_mm_force_path(int mode) {
    const int dev = cur_dev(), old = g_force_path[dev];
    g_force_path[dev] = mode;
    return old;
}

/* The current device's forced path (cuda_mm_force_path). */
static int force_path(void) { return g_force_path[cur_dev()]; }

int cuda_mm_supports(qt_type t) {
    switch ((int)t) {
    case QT_F32:
    case QT_F16:
    case QT_BF16:
#define MM_CASE(T) case T:
        MM_QUANT_TYPES(MM_CASE)
#undef MM_CASE
        return 1;
    default: return 0;
    }
}

/* Grows one buffer to at least `need` bytes (25% headroom, 1 MiB granules). */
static int mm_grow(void **p, size_t *have, size_t need, int capturing) {
    if (need <= *have) return 0;
    if (capturing) {
        st_error_set(
            "cuda_matmul: scratch must grow to %zu bytes while a graph is captured; call cuda_mm_reserve first", need);
        return -1;
    }
    const size_t sz = ((need + need / 4) | ((1u << 20) - 1)) + 1;
    cuda_mem_grew();
    if (*p) CUDA_CHECK(cudaFree(*p)); /* cudaFree waits for the device: no kernel still reads it */
    *p = NULL;
    *have = 0;
    if (cudaMalloc(p, sz) != cudaSuccess) {
        (void)cudaGetLastError();
        st_error_set("cuda_matmul: out of device memory for %zu bytes of scratch", sz);
        return -1;
    }
    *have = sz;
    return 0;
}

mm_scratch *mm_scratch_get(cudaStream_t s, size_t aq, size_t ad, size_t wb, size_t xb, size_t yb, size_t rec) {
    int dev = 0;
    CUDA_CHECK(cudaGetDevice(&dev));
    if (dev < 0 || dev >= MM_MAX_DEVICES) {
        st_error_set("cuda_matmul: device %d beyond the %d supported", dev, MM_MAX_DEVICES);
        return NULL;
    }
    mm_scratch *sc = &g_scratch[dev];
    cudaStreamCaptureStatus cs = cudaStreamCaptureStatusNone;
    CUDA_CHECK(cudaStreamIsCapturing(s, &cs));
    const int cap = cs != cudaStreamCaptureStatusNone;
#if ST_GPU_HAVE_BLAS /* a HIP build without hipBLAS has no handle (compat.h) */
    if (!sc->blas && !sc->blas_refused) {
        if (cap) {
            st_error_set("cuda_matmul: first use on a device while a graph is captured; call cuda_mm_reserve first");
            return NULL;
        }
        const cublasStatus_t st = cublasCreate(&sc->blas);
        if (st != CUBLAS_STATUS_SUCCESS) { /* e.g. a card this cuBLAS has no code for */
            ST_WARN("GPU %d: cuBLAS does not start (status %d); Strata's own matrix-vector kernels do the prompt "
                    "products on this GPU (slower)",
                    dev, (int)st);
            sc->blas = NULL;
            sc->blas_refused = 1;
        }
    }
#endif
    if (mm_grow((void **)&sc->aq, &sc->aq_bytes, aq, cap) || mm_grow((void **)&sc->ad, &sc->ad_bytes, ad, cap) ||
        mm_grow(&sc->wb, &sc->wb_bytes, wb, cap) || mm_grow(&sc->xb, &sc->xb_bytes, xb, cap) ||
        mm_grow((void **)&sc->yb, &sc->yb_bytes, yb, cap) || mm_grow((void **)&sc->rec, &sc->rec_bytes, rec, cap))
        return NULL;
    return sc;
}

int cuda_mm_act_scratch(int64_t n_in, int n_rows, int8_t **aq, float2 **ad, cudaStream_t s) {
    const size_t nq = (size_t)n_in * (size_t)n_rows;
    mm_scratch *sc = mm_scratch_get(s, nq, nq / 32 * sizeof(float2), 0, 0, 0, 0);
    if (!sc) return -1;
    *aq = sc->aq;
    *ad = sc->ad;
    return 0;
}

int cuda_mm_reserve(int64_t n_in, int n_rows) {
    const size_t nq = (size_t)n_in * (size_t)n_rows;
    return mm_scratch_get(0, nq, nq / 32 * sizeof(float2), 0, 0, 0, (size_t)n_rows * MM_REC * 4) ? 0 : -1;
}

void cuda_mm_release(void) {
    int cur = 0;
    if (cudaGetDevice(&cur) != cudaSuccess) return;
    for (int d = 0; d < MM_MAX_DEVICES; d++) {
        mm_scratch *sc = &g_scratch[d];
        if (!sc->blas && !sc->aq && !sc->wb && !sc->xb && !sc->yb && !sc->rec && !sc->ad) continue;
        CUDA_CHECK(cudaSetDevice(d));
        /* (void): hipFree is nodiscard; a failed free at release changes nothing */
        (void)cudaFree(sc->aq), (void)cudaFree(sc->ad), (void)cudaFree(sc->wb);
        (void)cudaFree(sc->xb), (void)cudaFree(sc->yb), (void)cudaFree(sc->rec);
#if ST_GPU_HAVE_BLAS
        if (sc->blas) cublasDestroy(sc->blas);
#endif
        memset(sc, 0, sizeof(*sc));
    }
    CUDA_CHECK(cudaSetDevice(cur));
}

/* Shape and type checks shared by both entry points. */
static int mm_check_weight(const char *fn, const st_weight *w) {
    if (!w) {
        st_error_set("%s: no weight", fn);
        return -1;
    }
    const qt_traits *tr = qt_get(w->type);
    if (!tr || !cuda_mm_supports(w->type)) {
        st_error_set("%s: weight type %s has no CUDA matrix product", fn, tr ? tr->name : "(unknown)");
        return -1;
    }
    if (w->n_in <= 0 || w->n_out <= 0 || w->n_in % tr->blck != 0 || w->n_in > INT32_MAX || w->n_out > INT32_MAX) {
        st_error_set("%s: bad shape %lld x %lld for %s (n_in must be a multiple of %d)", fn, (long long)w->n_out,
                     (long long)w->n_in, tr->name, tr->blck);
        return -1;
    }
    if (w->row_bytes != qt_row_size(w->type, w->n_in)) {
        st_error_set("%s: row_bytes %zu, expected %zu", fn, w->row_bytes, qt_row_size(w->type, w->n_in));
        return -1;
    }
    if (!mm_is_float(w->type) && w->n_in % 32 != 0) {
        st_error_set("%s: n_in %lld is not a multiple of 32", fn, (long long)w->n_in);
        return -1;
    }
    return 0;
}

/* Whether the current device's cuBLAS refused a call or the card (gemm.cu). */
static int mm_blas_refused(void) {
    int dev = 0;
    return cudaGetDevice(&dev) == cudaSuccess && dev >= 0 && dev < MM_MAX_DEVICES && g_scratch[dev].blas_refused;
}

int cuda_mm_set_blas_refused(int refused) {
    int dev = 0;
    CUDA_CHECK(cudaGetDevice(&dev));
    ST_ASSERT(dev >= 0 && dev < MM_MAX_DEVICES);
    const int old = g_scratch[dev].blas_refused;
    g_scratch[dev].blas_refused = refused;
    return old;
}

static int mm_use_gemm(int n_tok) {
    if (!ST_GPU_HAVE_BLAS || mm_blas_refused()) return 0; /* HIP without hipBLAS, or refused: own kernels only */
    if (force_path() == 1) return 0;
    if (force_path() == 2) return 1;
    return n_tok > MM_MMV_MAX_TOK;
}

/* Matrix mat's row of w's bias (backend.h: every product of a matrix adds
 * its row), or NULL. */
static const float *mm_bias(const st_weight *w, int64_t mat) {
    return w->bias ? w->bias + (size_t)mat * (size_t)w->n_out : NULL;
}

/* A dense matrix-vector launch of matrix mat of w for tokens [t0, t0 + n)
 * of x into y (plus the matrix's bias), reading x's int8 form from sc
 * (quantized weights). */
static mm_mmv_args mm_dense_args(const st_weight *w, int64_t mat, const mm_scratch *sc, const float *x, float *y,
                                 int t0, int n) {
    mm_mmv_args a;
    memset(&a, 0, sizeof(a));
    const int isf = mm_is_float(w->type);
    a.type = w->type;
    a.w = (const uint8_t *)st_weight_mat(w, mat);
    a.row_bytes = w->row_bytes;
    a.n_in = (int)w->n_in, a.n_out = (int)w->n_out;
    a.b = mm_bias(w, mat);
    a.aq = isf ? NULL : sc->aq + (size_t)t0 * a.n_in;
    a.ad = isf ? NULL : sc->ad + (size_t)t0 * (a.n_in / 32);
    a.x = x + (size_t)t0 * a.n_in;
    a.y = y + (size_t)t0 * a.n_out;
    a.groups = MM_GROUPS_DENSE;
    a.n_tok = n;
    a.n_groups = 1;
    return a;
}

int cuda_matmul_jobs_fit(const st_weight *w, int n_tok) {
    return w && cuda_mm_supports(w->type) && !mm_is_float(w->type) && n_tok >= 1 && n_tok <= MM_NT_MAX &&
           !mm_use_gemm(n_tok);
}

int cuda_matmul_jobs_pair(qt_type a, qt_type b) { return mmv_pair_supported(a, b) || mmv_pair_supported(b, a); }

int cuda_matmul_jobs(const cuda_mm_job *jobs, int n_jobs, const float *x, int n_tok, int act_ready, cudaStream_t s) {
    if (n_jobs < 1 || n_jobs > CUDA_MM_MAX_JOBS || !x) {
        st_error_set("cuda_matmul_jobs: bad arguments (%d jobs)", n_jobs);
        return -1;
    }
    /* one type ta, or ta and tb as mmv_pair_supported orders them: ta's jobs first */
    qt_type ta = jobs[0].w->type, tb = ta;
    for (int i = 1; i < n_jobs; i++) {
        const qt_type t = jobs[i].w->type;
        if (t != ta && tb == ta) tb = t;
        if (t != ta && t != tb) {
            st_error_set("cuda_matmul_jobs: more than two weight types in one launch");
            return -1;
        }
    }
    if (tb != ta && !mmv_pair_supported(ta, tb)) {
        if (!mmv_pair_supported(tb, ta)) {
            st_error_set("cuda_matmul_jobs: weight types %d and %d do not share a launch", (int)ta, (int)tb);
            return -1;
        }
        const qt_type t = ta;
        ta = tb, tb = t;
    }
    const cuda_mm_job *ord[CUDA_MM_MAX_JOBS];
    int n_a = 0;
    for (int i = 0; i < n_jobs; i++)
        if (jobs[i].w->type == ta) ord[n_a++] = &jobs[i];
    for (int i = 0, k = n_a; i < n_jobs; i++)
        if (jobs[i].w->type != ta) ord[k++] = &jobs[i];
    const st_weight *w0 = ord[0]->w;
    if (!cuda_matmul_jobs_fit(w0, n_tok)) { /* the same for every job: quantized types, one n_tok */
        st_error_set("cuda_matmul_jobs: %d tokens of this type do not take the matrix-vector path", n_tok);
        return -1;
    }
    for (int i = 0; i < n_jobs; i++) {
        const st_weight *w = ord[i]->w;
        if (mm_check_weight("cuda_matmul_jobs", w) != 0) return -1;
        if (w->n_in != w0->n_in || ord[i]->mat < 0 || ord[i]->mat >= w->n_mat || (!w->data && !w->mat) || !ord[i]->y ||
            ((uintptr_t)st_weight_mat(w, ord[i]->mat) | (uintptr_t)ord[i]->y) % 16 != 0) {
            st_error_set("cuda_matmul_jobs: job %d does not fit one decode launch", i);
            return -1;
        }
    }
    const int n_in = (int)w0->n_in;
    const size_t nq = (size_t)n_tok * n_in;
    mm_scratch *sc = mm_scratch_get(s, nq, nq / 32 * sizeof(float2), 0, 0, 0, 0);
    if (!sc) return -1;
    if (!act_ready) mm_quantize_act(x, n_in, n_tok, sc->aq, sc->ad, s);
    mm_mmv_args a = mm_dense_args(w0, ord[0]->mat, sc, x, ord[0]->y, 0, n_tok);
    a.y_add = ord[0]->y_add;
    a.n_more = n_jobs - 1;
    a.t2 = tb != ta ? n_a - 1 : a.n_more;
    a.type2 = tb;
    for (int i = 1; i < n_jobs; i++) {
        a.more[i - 1].w = (const uint8_t *)st_weight_mat(ord[i]->w, ord[i]->mat);
        a.more[i - 1].y = ord[i]->y;
        a.more[i - 1].y_add = ord[i]->y_add;
        a.more[i - 1].b = mm_bias(ord[i]->w, ord[i]->mat);
        a.more[i - 1].row_bytes = ord[i]->w->row_bytes;
        a.more[i - 1].n_out = (int)ord[i]->w->n_out;
    }
    return mm_mmv_launch(&a, s);
}

int cuda_matmul(const st_weight *w, int64_t mat, const float *x, float *y, int n_tok, int act_ready, cudaStream_t s) {
    if (mm_check_weight("cuda_matmul", w) != 0) return -1;
    if (mat < 0 || mat >= w->n_mat || n_tok < 0 || (!w->data && !w->mat) || !x || !y) {
        st_error_set("cuda_matmul: bad arguments (mat %lld of %lld, n_tok %d)", (long long)mat, (long long)w->n_mat,
                     n_tok);
        return -1;
    }
    const void *wd = st_weight_mat(w, mat);
    if (((uintptr_t)wd | (uintptr_t)x | (uintptr_t)y) % 16 != 0) {
        st_error_set("cuda_matmul: weights, x and y must be 16-byte aligned");
        return -1;
    }
    if (n_tok == 0) return 0;
    const int n_in = (int)w->n_in, n_out = (int)w->n_out;
    const int isf = mm_is_float(w->type);

    if (mm_use_gemm(n_tok)) {
        const size_t xb = w->type == QT_F32 ? 0 : (size_t)n_tok * n_in * 2;
        mm_scratch *sc = mm_scratch_get(s, 0, 0, mm_gemm_scratch_bytes(w->type, n_in, n_out), xb, 0, 0);
        if (!sc) return -1;
        if (xb) mm_act_bf16(x, NULL, n_tok, n_in, sc->xb, s);
        const int rc = mm_gemm(sc, w, wd, sc->xb, x, n_tok, y, s);
        if (rc == 0 && w->bias) cuda_add(y, mm_bias(w, mat), n_out, n_tok, s);
        if (rc != 1) return rc;
        act_ready = 0; /* cuBLAS refused (said once): the matrix-vector kernels below, from scratch */
    }

    const size_t nq = (size_t)n_tok * n_in;
    mm_scratch *sc =
        isf ? mm_scratch_get(s, 0, 0, 0, 0, 0, 0) : mm_scratch_get(s, nq, nq / 32 * sizeof(float2), 0, 0, 0, 0);
    if (!sc) return -1;
    if (!isf && !act_ready) mm_quantize_act(x, n_in, n_tok, sc->aq, sc->ad, s);
    for (int t0 = 0; t0 < n_tok; t0 += MM_NT_MAX) {
        const mm_mmv_args a = mm_dense_args(w, mat, sc, x, y, t0, n_tok - t0 < MM_NT_MAX ? n_tok - t0 : MM_NT_MAX);
        if (mm_mmv_launch(&a, s) != 0) return -1;
    }
    return 0;
}

/* ---- MoE ---- */

/* Host grouping of the prompt path: the ids come to the host once. */
static int mm_moe_grouped(const st_weight *w, const void *const *d_mat, const int32_t *d_ids, const int32_t *d_xrow,
                          int n_pairs, const float *x, int n_x, float *y, cudaStream_t s, mm_scratch *sc,
                          const mm_mmv_args *base) {
    const int n_mat = (int)w->n_mat, n_in = (int)w->n_in, n_out = (int)w->n_out;
    int32_t *ids = (int32_t *)malloc((size_t)n_pairs * 4 * 2);
    int32_t *xrow = ids + n_pairs;
    int *cnt = (int *)calloc((size_t)n_mat + 1, sizeof(int));
    const void **tab = d_mat ? (const void **)malloc((size_t)n_mat * sizeof(void *)) : NULL;
    int rc = -1;
    int32_t *host = NULL;
    if (!ids || !cnt || (d_mat && !tab)) {
        st_error_set("cuda_moe_matmul: out of host memory");
        goto done;
    }
    CUDA_CHECK(cudaMemcpyAsync(ids, d_ids, (size_t)n_pairs * 4, cudaMemcpyDeviceToHost, s));
    if (d_xrow) CUDA_CHECK(cudaMemcpyAsync(xrow, d_xrow, (size_t)n_pairs * 4, cudaMemcpyDeviceToHost, s));
    if (tab) CUDA_CHECK(cudaMemcpyAsync(tab, d_mat, (size_t)n_mat * sizeof(void *), cudaMemcpyDeviceToHost, s));
    CUDA_CHECK(cudaStreamSynchronize(s));
    for (int p = 0; p < n_pairs; p++) {
        if (!d_xrow) xrow[p] = p;
        if (ids[p] >= n_mat || xrow[p] < 0 || xrow[p] >= n_x) {
            st_error_set("cuda_moe_matmul: pair %d has expert %d of %d, x row %d of %d", p, ids[p], n_mat, xrow[p],
                         n_x);
            goto done;
        }
        cnt[ids[p] < 0 ? n_mat : ids[p]]++; /* slot n_mat: pairs handled elsewhere (zeros) */
    }
    {
        /* Layout of the uploaded ints: records of up to 8 pairs for the
         * matrix-vector experts, then per GEMM expert its x rows and its pairs. */
        const int use_gemm_any = force_path() != 1 && ST_GPU_HAVE_BLAS && !sc->blas_refused;
        size_t n_rec = 0, n_list = 0, max_gemm = 0;
        for (int e = 0; e <= n_mat; e++) {
            if (e < n_mat && use_gemm_any && (cnt[e] >= MM_MOE_GEMM_MIN || force_path() == 2) && cnt[e] > 0) {
                n_list += 2 * (size_t)cnt[e];
                if ((size_t)cnt[e] > max_gemm) max_gemm = (size_t)cnt[e];
            } else {
                n_rec += ((size_t)cnt[e] + MM_NT_MAX - 1) / MM_NT_MAX;
            }
        }
        const size_t n_ints = n_rec * MM_REC + n_list;
        host = (int32_t *)calloc(n_ints + 1, 4);
        if (!host) {
            st_error_set("cuda_moe_matmul: out of host memory");
            goto done;
        }
        const size_t wb = max_gemm ? mm_gemm_scratch_bytes(w->type, n_in, n_out) : 0;
        mm_scratch *sc2 = mm_scratch_get(s, 0, 0, wb, max_gemm * n_in * 2, max_gemm * n_out * 4, n_ints * 4);
        if (!sc2) goto done;
        sc = sc2;
        /* fill: for each expert, walk its pairs in order */
        size_t ri = 0, li = n_rec * MM_REC;
        struct gemm_job {
            int e, n;
            size_t xoff, poff;
        };
        struct gemm_job *jobs = (struct gemm_job *)malloc(sizeof(struct gemm_job) * ((size_t)n_mat + 1));
        int n_jobs = 0;
        if (!jobs) {
            st_error_set("cuda_moe_matmul: out of host memory");
            goto done;
        }
        for (int e = 0; e <= n_mat; e++) {
            if (cnt[e] == 0) continue;
            const int eid = e < n_mat ? e : -1;
            if (e < n_mat && use_gemm_any && (cnt[e] >= MM_MOE_GEMM_MIN || force_path() == 2)) {
                jobs[n_jobs].e = e, jobs[n_jobs].n = cnt[e], jobs[n_jobs].xoff = li, jobs[n_jobs].poff = li + cnt[e];
                size_t k = 0;
                for (int p = 0; p < n_pairs; p++)
                    if (ids[p] == e) host[li + k] = xrow[p], host[li + cnt[e] + k] = p, k++;
                li += 2 * (size_t)cnt[e];
                n_jobs++;
                continue;
            }
            int32_t *r = NULL;
            for (int p = 0; p < n_pairs; p++) {
                if ((ids[p] < 0 ? -1 : ids[p]) != eid) continue;
                if (!r || r[1] == MM_NT_MAX) {
                    r = host + ri * MM_REC;
                    r[0] = eid, r[1] = 0;
                    ri++;
                }
                r[2 + r[1]] = xrow[p];
                r[2 + MM_NT_MAX + r[1]] = p;
                r[1]++;
            }
        }
        CUDA_CHECK(cudaMemcpyAsync(sc->rec, host, n_ints * 4, cudaMemcpyHostToDevice, s));
        CUDA_CHECK(cudaStreamSynchronize(s)); /* host buffer is freed below */
        rc = 0;
        if (n_rec) {
            mm_mmv_args a = *base;
            a.groups = MM_GROUPS_REC;
            a.rec = sc->rec;
            a.n_groups = (int)n_rec;
            a.aq = sc->aq, a.ad = sc->ad;
            rc = mm_mmv_launch(&a, s);
        }
        for (int j = 0; j < n_jobs && rc == 0; j++) {
            const void *wd = tab ? tab[jobs[j].e] : (const uint8_t *)w->data + (size_t)jobs[j].e * n_out * w->row_bytes;
            if (w->type != QT_F32) mm_act_bf16(x, sc->rec + jobs[j].xoff, jobs[j].n, n_in, sc->xb, s);
            rc = mm_gemm(sc, w, wd, sc->xb, x, jobs[j].n, sc->yb, s);
            if (rc == 1) { /* cuBLAS refused (said once): the caller's fallback redoes the whole product */
                st_error_set("cuda_moe_matmul: cuBLAS refused the product");
                rc = -1;
            }
            if (rc == 0) mm_scatter_rows(sc->yb, sc->rec + jobs[j].poff, jobs[j].n, n_out, y, s);
            /* F32 experts with gathered rows would need a gathered f32 x: not
             * supported on this path (F32 expert matrices do not occur). */
        }
        free(jobs);
        if (rc == 0) CUDA_CHECK(cudaStreamSynchronize(s)); /* keep the order simple for the next caller */
    }
done:
    free(ids);
    free(cnt);
    free(tab);
    free(host);
    return rc;
}

int cuda_moe_matmul(const st_weight *w, const void *const *d_mat, const int32_t *d_ids, const int32_t *d_xrow,
                    int n_pairs, const float *x, int n_x, float *y, int act_ready, int *x_quantized, cudaStream_t s) {
    if (x_quantized) *x_quantized = 0;
    if (mm_check_weight("cuda_moe_matmul", w) != 0) return -1;
    if (n_pairs < 0 || n_x < 0 || !d_ids || !x || !y || (!d_mat && !w->data) || w->n_mat < 1) {
        st_error_set("cuda_moe_matmul: bad arguments (%d pairs, %d x rows)", n_pairs, n_x);
        return -1;
    }
    if (n_pairs == 0) return 0;
    if (w->type == QT_F32 && n_pairs > MM_MOE_DEVICE_MAX && force_path() != 1 && ST_GPU_HAVE_BLAS) {
        st_error_set("cuda_moe_matmul: F32 expert matrices are supported for up to %d pairs", MM_MOE_DEVICE_MAX);
        return -1;
    }
    const int n_in = (int)w->n_in, n_out = (int)w->n_out;
    const int isf = mm_is_float(w->type);
    if (!isf && force_path() == 0 && n_pairs > MM_MOE_DEVICE_MAX) {
        /* tensor cores: they read x as f16, leaving the int8 scratch as it was */
        const int rc = mm_moe_mma(w, d_mat, d_ids, d_xrow, n_pairs, x, n_x, y, s);
        if (rc != 1) return rc;
    }
    const size_t nq = isf ? 0 : (size_t)n_x * n_in;
    mm_scratch *sc = mm_scratch_get(s, nq, nq / 32 * sizeof(float2), 0, 0, 0, 0);
    if (!sc) return -1;
    if (!isf && !act_ready) mm_quantize_act(x, n_in, n_x, sc->aq, sc->ad, s);
    if (x_quantized) *x_quantized = !isf;

    mm_mmv_args a;
    memset(&a, 0, sizeof(a));
    a.type = w->type;
    a.w = (const uint8_t *)w->data;
    a.mat_stride = (size_t)n_out * w->row_bytes;
    a.w_tab = d_mat;
    a.row_bytes = w->row_bytes;
    a.n_in = n_in, a.n_out = n_out;
    a.aq = sc->aq, a.ad = sc->ad, a.x = x, a.y = y;

    const int device_path = force_path() == 1 ? n_pairs <= 65535 : n_pairs <= MM_MOE_DEVICE_MAX && force_path() != 2;
    if (device_path) {
        a.groups = MM_GROUPS_PAIRS;
        a.ids = d_ids, a.xrow = d_xrow;
        a.n_groups = n_pairs;
        return mm_mmv_launch(&a, s);
    }
    return mm_moe_grouped(w, d_mat, d_ids, d_xrow, n_pairs, x, n_x, y, s, sc, &a);
}
