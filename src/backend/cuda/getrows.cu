/* get_rows on the device: out[i, :] = dequant(row ids[i] of w), one thread
 * per output value. The formulas round exactly where the reference
 * dequantizers (quant/quant_ref_k.c) do: each product and difference is an
 * explicit _rn intrinsic, so no FMA contraction changes a bit and the result
 * equals the CPU's bit for bit. Formats without a kernel here (i-quants,
 * MXFP4) take the slow exact path in backend_cuda.cu: rows copied to the
 * host, dequantized by the reference, copied back.
 */
#include "backend/cuda/common.cuh"
#include "backend/cuda/ops.h"

static __device__ __forceinline__ float h2f(uint16_t h) { return __half2float(__ushort_as_half(h)); }
static __device__ __forceinline__ float bf2f(uint16_t h) { return __uint_as_float((uint32_t)h << 16); }
static __device__ __forceinline__ float mul(float a, float b) { return __fmul_rn(a, b); }

static __device__ __forceinline__ void scale_min_k4(int j, const uint8_t *q, int *sc, int *m) {
    if (j < 4) {
        *sc = q[j] & 63;
        *m = q[j + 4] & 63;
    } else {
        *sc = (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4);
        *m = (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
    }
}

/* Weight e of a row (row points at the row's first block). */
static __device__ float dequant_one(qt_type t, const uint8_t *row, int64_t e) {
    switch (t) {
    case QT_F32: return ((const float *)row)[e];
    case QT_F16: return h2f(((const uint16_t *)row)[e]);
    case QT_BF16: return bf2f(((const uint16_t *)row)[e]);
    case QT_Q4_0: {
        const block_q4_0 *b = (const block_q4_0 *)row + e / 32;
        int j = (int)(e % 32), q = j < 16 ? (b->qs[j] & 0xF) : (b->qs[j - 16] >> 4);
        return mul(h2f(b->d), (float)(q - 8));
    }
    case QT_Q4_1: {
        const block_q4_1 *b = (const block_q4_1 *)row + e / 32;
        int j = (int)(e % 32), q = j < 16 ? (b->qs[j] & 0xF) : (b->qs[j - 16] >> 4);
        return __fadd_rn(mul(h2f(b->d), (float)q), h2f(b->m));
    }
    case QT_Q5_0: {
        const block_q5_0 *b = (const block_q5_0 *)row + e / 32;
        int j = (int)(e % 32);
        uint32_t qh = b->qh[0] | (b->qh[1] << 8) | (b->qh[2] << 16) | ((uint32_t)b->qh[3] << 24);
        int q = (j < 16 ? (b->qs[j] & 0xF) : (b->qs[j - 16] >> 4)) | (int)(((qh >> j) & 1) << 4);
        return mul(h2f(b->d), (float)(q - 16));
    }
    case QT_Q5_1: {
        const block_q5_1 *b = (const block_q5_1 *)row + e / 32;
        int j = (int)(e % 32);
        uint32_t qh = b->qh[0] | (b->qh[1] << 8) | (b->qh[2] << 16) | ((uint32_t)b->qh[3] << 24);
        int q = (j < 16 ? (b->qs[j] & 0xF) : (b->qs[j - 16] >> 4)) | (int)(((qh >> j) & 1) << 4);
        return __fadd_rn(mul(h2f(b->d), (float)q), h2f(b->m));
    }
    case QT_Q8_0: {
        const block_q8_0 *b = (const block_q8_0 *)row + e / 32;
        return mul(h2f(b->d), (float)b->qs[e % 32]);
    }
    case QT_Q2_K: {
        const block_q2_K *b = (const block_q2_K *)row + e / QK_K;
        int i = (int)(e % QK_K), h = i / 128, k = (i % 128) / 32, l = i % 32;
        uint8_t sc = b->scales[i / 16];
        float dl = mul(h2f(b->d), (float)(sc & 0xF)), ml = mul(h2f(b->dmin), (float)(sc >> 4));
        int q = (b->qs[32 * h + l] >> (2 * k)) & 3;
        return __fsub_rn(mul(dl, (float)q), ml);
    }
    case QT_Q3_K: {
        const block_q3_K *b = (const block_q3_K *)row + e / QK_K;
        int i = (int)(e % QK_K), s = i / 16, h = i / 128, k = (i % 128) / 32, l = i % 32;
        int lo = (b->scales[s % 8] >> (4 * (s / 8))) & 0xF, hi = (b->scales[8 + s % 4] >> (2 * (s / 4))) & 3;
        float dl = mul(h2f(b->d), (float)((lo | (hi << 4)) - 32));
        int ql = (b->qs[32 * h + l] >> (2 * k)) & 3, hb = (b->hmask[l] >> (4 * h + k)) & 1;
        return mul(dl, (float)(ql - (hb ? 0 : 4)));
    }
    case QT_Q4_K: {
        const block_q4_K *b = (const block_q4_K *)row + e / QK_K;
        int i = (int)(e % QK_K), s = i / 32, l = i % 32, sc, m;
        scale_min_k4(s, b->scales, &sc, &m);
        int q = (b->qs[32 * (s / 2) + l] >> (4 * (s % 2))) & 0xF;
        return __fsub_rn(mul(mul(h2f(b->d), (float)sc), (float)q), mul(h2f(b->dmin), (float)m));
    }
    case QT_Q5_K: {
        const block_q5_K *b = (const block_q5_K *)row + e / QK_K;
        int i = (int)(e % QK_K), s = i / 32, l = i % 32, sc, m;
        scale_min_k4(s, b->scales, &sc, &m);
        int q = ((b->qs[32 * (s / 2) + l] >> (4 * (s % 2))) & 0xF) | (((b->qh[l] >> s) & 1) << 4);
        return __fsub_rn(mul(mul(h2f(b->d), (float)sc), (float)q), mul(h2f(b->dmin), (float)m));
    }
    case QT_Q6_K: {
        const block_q6_K *b = (const block_q6_K *)row + e / QK_K;
        int i = (int)(e % QK_K), h = i / 128, r = i % 128;
        int lo = (b->ql[64 * h + r % 64] >> (4 * (r / 64))) & 0xF, hi = (b->qh[32 * h + r % 32] >> (2 * (r / 32))) & 3;
        return mul(mul(h2f(b->d), (float)b->scales[i / 16]), (float)((lo | (hi << 4)) - 32));
    }
    default: return __int_as_float(0x7fc00000); /* unreachable: cuda_get_rows_supported said no */
    }
}

extern "C" int cuda_get_rows_supported(qt_type t) {
    switch (t) {
    case QT_F32:
    case QT_F16:
    case QT_BF16:
    case QT_Q4_0:
    case QT_Q4_1:
    case QT_Q5_0:
    case QT_Q5_1:
    case QT_Q8_0:
    case QT_Q2_K:
    case QT_Q3_K:
    case QT_Q4_K:
    case QT_Q5_K:
    case QT_Q6_K: return 1;
    default: return 0;
    }
}

static __global__ void get_rows_kernel(qt_type t, const uint8_t *w, size_t row_bytes, int64_t n_in, int64_t n_out,
                                       const int32_t *ids, int n, float *out) {
    for (int i = blockIdx.y; i < n; i += gridDim.y) {
        int64_t id = ids[i];
        float *o = out + (size_t)i * n_in;
        int64_t e0 = blockIdx.x * (int64_t)blockDim.x + threadIdx.x, step = (int64_t)gridDim.x * blockDim.x;
        if (id < 0 || id >= n_out) { /* the engine checks ids: a bad one here is a bug; poison the row visibly */
            for (int64_t e = e0; e < n_in; e += step) o[e] = __int_as_float(0x7fc00000);
            continue;
        }
        const uint8_t *row = w + (size_t)id * row_bytes;
        for (int64_t e = e0; e < n_in; e += step) o[e] = dequant_one(t, row, e);
    }
}

void cuda_get_rows(const st_weight *w, const int32_t *ids, int n, float *out, cudaStream_t s) {
    if (n <= 0) return;
    unsigned bx = st_div_up((size_t)w->n_in, 256);
    if (bx > 64) bx = 64;
    unsigned by = n < 65535 ? (unsigned)n : 65535;
    get_rows_kernel<<<dim3(bx, by), 256, 0, s>>>(w->type, (const uint8_t *)w->data, w->row_bytes, w->n_in, w->n_out,
                                                 ids, n, out);
    CUDA_LAUNCH_CHECK();
}
