/* Prompt attention over a latent row (deepseek2's absorbed form, mla.cu) as
 * two tensor-core GEMMs: all n_head query heads read the same 576-wide row,
 * so the queries of a chunk are one matrix of n_tok * n_head rows against
 * one key matrix, which is the shape cuBLAS runs near the card's f16 rate.
 * Per tile of query rows (row r: token r / n_head, head r % n_head):
 *   S = (scale Q) K^T   f16 in, f32 out, keys 0 .. the tile's last position;
 *   P = softmax(S)      per row, causal (a row's keys past its position are
 *                       written as 0), normalised, f16;
 *   O = P V             f16 in, f32 out, straight into the output rows.
 * The row is its own value row, so V is K (an int8 cache's rows are turned
 * to f16 once per call, scale folded in). The latent kernel (mla.cu) stays
 * for decode and is the fallback (no BLAS, cuBLAS refused, a window).
 *
 * Cost for a chunk of n tokens at position p0 (n_head H, row width D):
 * n H (p0 + n/2) D 4 flops on tensor cores, and per (row, key) 14 bytes of
 * scores and weights through memory (S written and read twice: once for
 * the running max and sum, once for the weights; P written and read): on
 * an H200 the memory part is the larger one. A tile is at
 * most LG_TILE_ROWS rows and LG_TILE_BYTES of scratch (about the L2 of an
 * H100/H200 at short spans, so the softmax and the second product read the
 * scores and weights from there). */
#include "backend/cuda/common.cuh"
#include "backend/cuda/mm/mm.h"
#include "backend/cuda/ops.h"

#define LG_TILE_BYTES ((size_t)64 << 20)  /* scores + weights + queries of one tile of rows */
#define LG_TILE_ROWS  8192                /* query rows of one tile at most */
#define LG_KV_BYTES   ((size_t)160 << 20) /* an int8 cache's rows as f16, at most */
#define LG_THREADS    256

/* qh = f16(q * scale), n values. */
static __global__ void lg_q_kernel(const float *q, __half *qh, size_t n, float scale) {
    pdl_enter(); /* first: see st_launch (common.cuh) */
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        qh[i] = __float2half_rn(q[i] * scale);
}

/* kh[p][d] = k[p][d] * ks[p] for rows 0..n_rows-1 of width hd: an int8 row back to f16. */
static __global__ void lg_rows_kernel(const int8_t *k, const float *ks, __half *kh, int hd, size_t n) {
    pdl_enter(); /* first: see st_launch (common.cuh) */
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        kh[i] = __float2half_rn((float)k[i] * ks[i / (size_t)hd]);
}

/* One block per row r of the tile (global row r0 + r): its keys 0..pos, pos
 * = pos0 + its token; p[r][j] = exp(s - max) / sum for j <= pos, 0 up to
 * ld (the GEMM's key extent). */
static __global__ void __launch_bounds__(LG_THREADS)
    lg_softmax_kernel(const float *sc, __half *p, int ld, int r0, int n_head, int pos0) {
    pdl_enter(); /* first: see st_launch (common.cuh) */
    __shared__ float red[ST_WARP];
    const int r = blockIdx.x, n_vis = pos0 + (r0 + r) / n_head + 1;
    const float *s = sc + (size_t)r * ld;
    __half *o = p + (size_t)r * ld;
    float mt = -INFINITY, lt = 0.0f; /* this thread's running max and sum (one pass: online softmax) */
    for (int j = threadIdx.x; j < n_vis; j += LG_THREADS) {
        const float v = s[j];
        if (v > mt) lt *= expf(mt - v), mt = v; /* exp(-inf) = 0 on the first */
        lt += expf(v - mt);
    }
    const float m = block_max(mt, red);
    const float il = 1.0f / block_sum(mt == -INFINITY ? 0.0f : lt * expf(mt - m), red); /* >= 1 / n_vis */
    for (int j = threadIdx.x; j < ld; j += LG_THREADS) o[j] = __float2half_rn(j < n_vis ? expf(s[j] - m) * il : 0.0f);
}

static void lg_launch_rows(const void *src, const float *scale, __half *dst, int hd, int n_rows, cudaStream_t s) {
    const size_t n = (size_t)n_rows * hd;
    st_launch(lg_rows_kernel, dim3(st_div_up(n, LG_THREADS * 8) < 65535 ? st_div_up(n, LG_THREADS * 8) : 65535),
              dim3(LG_THREADS), 0, s, (const int8_t *)src, scale, dst, hd, n);
}

int cuda_attn_latent_gemm(const float *q, const st_kv_layer *kv, int n_tok, int pos0, int n_head, float scale,
                          float *out, cuda_scratch *scratch, cudaStream_t s) {
    const int hd = kv->head_dim, span = pos0 + n_tok;
    if (kv->n_head_kv != 1 || hd % 8 != 0 || n_tok <= 0) return 1;
    const int i8 = kv->type == ST_KV_INT8, same = kv->v == kv->k && kv->v_scale == kv->k_scale;
    const int ld = (span + 7) / 8 * 8; /* keys of the widest row, rounded for 16-byte f16 rows */
    const size_t kv_bytes = i8 ? (size_t)(same ? 1 : 2) * span * hd * sizeof(__half) : 0;
    if (kv_bytes > LG_KV_BYTES) return 1;
    const size_t rows = (size_t)n_tok * n_head, per_row = (size_t)ld * 6 + (size_t)hd * 2;
    size_t mt = LG_TILE_BYTES / per_row;
    if (mt < 64) return 1; /* a span this long: the latent kernel, in its slices */
    if (mt > LG_TILE_ROWS) mt = LG_TILE_ROWS;
    if (mt > rows) mt = rows;
    char *base = (char *)cuda_scratch_reserve(scratch, kv_bytes + mt * per_row);
    __half *kh = (__half *)base, *vh = kh;
    if (i8) {
        lg_launch_rows(kv->k, kv->k_scale, kh, hd, span, s);
        if (!same) lg_launch_rows(kv->v, kv->v_scale, vh = kh + (size_t)span * hd, hd, span, s);
    } else {
        kh = (__half *)kv->k, vh = (__half *)kv->v;
    }
    float *sc = (float *)(base + kv_bytes);
    __half *p = (__half *)(sc + mt * ld), *qh = p + mt * ld;
    for (size_t r0 = 0; r0 < rows; r0 += mt) {
        const int nr = (int)(r0 + mt <= rows ? mt : rows - r0);
        const int keys = pos0 + (int)((r0 + nr - 1) / n_head) + 1; /* the tile's last token sees the most */
        const size_t nq = (size_t)nr * hd;
        st_launch(lg_q_kernel, dim3(st_div_up(nq, LG_THREADS * 8)), dim3(LG_THREADS), 0, s, q + r0 * hd, qh, nq, scale);
        /* S^T (keys x nr, column-major, ld) = K^T (K: hd x keys) Q (hd x nr) */
        if (cuda_gemm_f16(1, keys, nr, hd, kh, hd, qh, hd, sc, ld, s)) return 1;
        st_launch(lg_softmax_kernel, dim3((unsigned)nr), dim3(LG_THREADS), 0, s, (const float *)sc, p, ld, (int)r0,
                  n_head, pos0);
        /* O (hd x nr) = V (hd x keys) P (keys x nr): P past keys is never read */
        if (cuda_gemm_f16(0, hd, nr, keys, vh, hd, p, ld, out + r0 * hd, hd, s)) return 1;
    }
    return 0;
}
