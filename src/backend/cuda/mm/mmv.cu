/* Matrix-vector products for decode (1..8 tokens per pass over the weights),
 * every weight format, plus the activation quantizer they read.
 *
 * Quantized formats: one warp per R output rows (mmv_kernel.cuh); lane l
 * takes the 32-weight units l, l+32, ... of the rows, decodes each to int8
 * (quant_cuda.cuh) once and multiplies it with every token's int8
 * activations by dp4a; a warp sum gives each row. Consecutive lanes read consecutive units, so a warp's loads
 * cover a contiguous span of the row. The kernel is memory-bound: the target
 * is the row bytes over the HBM read bandwidth (docs/cuda-kernels.md has the
 * measured fraction per format).
 *
 * Float formats read 8 weights (16 or 32 bytes) per lane per step and the f32
 * activations directly: no quantization error is added.
 *
 * Which tokens and which matrix a launch serves is a "group" (mm_impl.cuh):
 * a dense product is one group; the MoE decode path has one group per
 * (token, expert) pair with the expert id read on the device.
 */
#include "backend/cuda/mm/mm_impl.cuh"

int mm_is_float(qt_type t) { return t == QT_F32 || t == QT_F16 || t == QT_BF16; }

/* ---- activation quantizer: 8 threads per block of 32 values ---- */

static __global__ void mm_quantize_act_kernel(const float4 *__restrict__ x, int64_t n4, int *__restrict__ aq,
                                              float2 *__restrict__ ad) {
    pdl_enter(); /* first: see st_launch (common.cuh) */
    const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    const float4 v = i < n4 ? x[i] : make_float4(0.f, 0.f, 0.f, 0.f);
    float amax = fmaxf(fmaxf(fabsf(v.x), fabsf(v.y)), fmaxf(fabsf(v.z), fabsf(v.w)));
#pragma unroll
    for (int o = 4; o > 0; o >>= 1) amax = fmaxf(amax, __shfl_xor_sync(ST_FULL_MASK, amax, o, 8));
    const float d = amax / 127.0f, id = amax > 0.0f ? 127.0f / amax : 0.0f;
    const int q0 = __float2int_rn(v.x * id), q1 = __float2int_rn(v.y * id);
    const int q2 = __float2int_rn(v.z * id), q3 = __float2int_rn(v.w * id);
    int sum = q0 + q1 + q2 + q3;
#pragma unroll
    for (int o = 4; o > 0; o >>= 1) sum += __shfl_xor_sync(ST_FULL_MASK, sum, o, 8);
    if (i < n4) {
        aq[i] = (q0 & 0xFF) | ((q1 & 0xFF) << 8) | ((q2 & 0xFF) << 16) | ((int)((unsigned)q3 << 24));
        if ((i & 7) == 0) ad[i >> 3] = make_float2(d, d * (float)sum);
    }
}

void mm_quantize_act(const float *x, int n_in, int n_rows, int8_t *aq, float2 *ad, cudaStream_t s) {
    const int64_t n4 = (int64_t)n_in * n_rows / 4;
    if (n4 == 0) return;
    st_launch(mm_quantize_act_kernel, dim3(st_div_up((size_t)n4, 256)), dim3(256), 0, s, (const float4 *)x, n4,
              (int *)aq, ad);
}

/* ---- dispatch ---- */

#define ROWS_DEVICES 64
static int g_force_rows[ROWS_DEVICES]; /* per device: two cards may differ */

int cuda_mm_force_rows(int r) {
    int dev = 0;
    CUDA_CHECK(cudaGetDevice(&dev));
    ST_ASSERT(dev >= 0 && dev < ROWS_DEVICES);
    const int old = g_force_rows[dev];
    g_force_rows[dev] = r;
    return old;
}

/* Rows per warp: R > 1 shares each activation load among R rows but leaves
 * fewer warps. Measured on an H200 (docs/cuda-kernels.md): no change for the
 * 4-bit formats, 5-12% faster for the i-quants and Q8_0 on large matrices,
 * slower for F16/BF16; so R = 1 for floats, and for quantized weights R
 * grows only when enough rows remain to fill the card. It also grows while
 * the blocks would not all be resident at once (taken as 8 blocks of 4 warps
 * per multiprocessor; the kernels' registers allow 8 to 10): a decode
 * product is one memory round trip per warp, and a second, partial wave of
 * blocks costs a second one (q, k and v of the 30B-A3B, 5120 rows: 1280
 * blocks where an H200 holds 1188, 7.9 us). */
static int mm_rows_per_warp(const mm_mmv_args *a, int nt) {
    int dev = 0, n_sm = 0;
    CUDA_CHECK(cudaGetDevice(&dev));
    if (dev < ROWS_DEVICES && g_force_rows[dev]) return g_force_rows[dev];
    if (nt > 2 || mm_is_float(a->type)) return 1;
    int64_t rows = a->n_out;
    for (int i = 0; i < a->n_more; i++) rows += a->more[i].n_out;
    rows *= a->n_groups;
    int r = rows >= 16384 ? 4 : rows >= 8192 ? 2 : 1;
    CUDA_CHECK(cudaDeviceGetAttribute(&n_sm, cudaDevAttrMultiProcessorCount, dev));
    while (r < 4 && rows > (int64_t)n_sm * 8 * MMV_WARPS * r) r *= 2;
    return r;
}

int mm_mmv_launch(const mm_mmv_args *a, cudaStream_t s) {
    if (a->n_out == 0 || a->n_groups == 0) return 0;
    int nt = MM_NT_MAX;
    if (a->groups == MM_GROUPS_PAIRS) nt = 1;
    else if (a->groups == MM_GROUPS_DENSE) nt = a->n_tok;
    nt = nt <= 1 ? 1 : nt <= 2 ? 2 : nt <= 4 ? 4 : 8;
    const int r = mm_rows_per_warp(a, nt);
    if (a->t2 < a->n_more) {
        if (mmv_launch_pair(a, nt, r, s) == 0) return 0;
        st_error_set("cuda_matmul_jobs: no launch for weight types %d and %d together", (int)a->type, (int)a->type2);
        return -1;
    }
    if (mmv_launch_float(a, nt, r, s) == 0 || mmv_launch_legacy(a, nt, r, s) == 0 || mmv_launch_k(a, nt, r, s) == 0 ||
        mmv_launch_iq(a, nt, r, s) == 0)
        return 0; /* st_launch checked the launch */
    st_error_set("cuda_matmul: weight type %d has no CUDA matrix-vector kernel", (int)a->type);
    return -1;
}
