/* Matrix-vector kernel instantiations for F32, F16 and BF16 weights (read
 * as floats, f32 activations: no quantization error is added). 8-wide loads
 * need every weight row and x row to start 16-byte aligned; otherwise the
 * one-element kernel runs.
 */
#include <string.h>

#include "backend/cuda/mm/mmv_kernel.cuh"

template <typename WT, int V, int NT> static void mmv_f_launch_nt(const mm_mmv_args *a, int r, cudaStream_t s) {
    const dim3 block(32, MMV_WARPS);
    if constexpr (NT <= 2) {
        if (r >= 4) {
            st_launch(mmv_f_kernel<WT, V, NT, 4>, mmv_grid<NT, 4>(a), block, 0, s, *a);
            return;
        }
        if (r == 2) {
            st_launch(mmv_f_kernel<WT, V, NT, 2>, mmv_grid<NT, 2>(a), block, 0, s, *a);
            return;
        }
    }
    st_launch(mmv_f_kernel<WT, V, NT, 1>, mmv_grid<NT, 1>(a), block, 0, s, *a);
}

template <typename WT, int NT> static void mmv_f_split_go(const mm_mmv_args *a, cudaStream_t s) {
    st_launch(mmv_f_split_kernel<WT, NT>, dim3((unsigned)a->n_out, (unsigned)a->n_groups), dim3(32, MMV_WARPS), 0, s,
              *a);
}

/* Few rows in all (up to 1024: fewer than 8 warps per multiprocessor of a
 * large card at a warp per row): the split kernel. */
template <typename WT> static int mmv_f_split(const mm_mmv_args *a, int nt, cudaStream_t s) {
    if ((int64_t)a->n_out * a->n_groups > 1024) return 1;
    mm_nt_dispatch(nt, [&](auto NT) { mmv_f_split_go<WT, decltype(NT)::value>(a, s); });
    return 0;
}

template <typename WT, int V> static void mmv_f_launch(const mm_mmv_args *a, int nt, int r, cudaStream_t s) {
    if (V == 8 && mmv_f_split<WT>(a, nt, s) == 0) return;
    mm_nt_dispatch(nt, [&](auto NT) { mmv_f_launch_nt<WT, V, decltype(NT)::value>(a, r, s); });
}

int mmv_launch_float(const mm_mmv_args *a, int nt, int r, cudaStream_t s) {
    const int vec = a->n_in % 8 == 0 && a->row_bytes % 16 == 0;
    switch ((int)a->type) {
    case QT_F32: vec ? mmv_f_launch<float, 8>(a, nt, r, s) : mmv_f_launch<float, 1>(a, nt, r, s); return 0;
    case QT_F16: vec ? mmv_f_launch<__half, 8>(a, nt, r, s) : mmv_f_launch<__half, 1>(a, nt, r, s); return 0;
    case QT_BF16: vec ? mmv_f_launch<uint16_t, 8>(a, nt, r, s) : mmv_f_launch<uint16_t, 1>(a, nt, r, s); return 0;
    default: return 1;
    }
}

int cuda_matmul_norm(const st_weight *w, const float *x, const float *nw, float eps, float *h, int8_t *aq, float2 *ad,
                     float *y, cudaStream_t s) {
    const size_t smem = (size_t)w->n_in * sizeof(float);
    if (w->type != QT_F32 || !w->data || w->mat || w->n_in % 32 != 0 || w->row_bytes % 16 != 0 || w->n_out > 1024 ||
        smem > 47 * 1024 || (uintptr_t)w->data % 16 != 0) /* 1 KB left for the kernel's static shared memory */
        return 1;
    mm_mmv_args a;
    memset(&a, 0, sizeof(a));
    a.type = w->type;
    a.w = (const uint8_t *)w->data;
    a.row_bytes = w->row_bytes;
    a.n_in = (int)w->n_in, a.n_out = (int)w->n_out;
    a.y = y;
    a.b = w->bias;
    a.nx = x, a.nw = nw, a.neps = eps, a.ny = h, a.naq = aq, a.nad = ad;
    a.groups = MM_GROUPS_DENSE;
    a.n_tok = 1, a.n_groups = 1;
    st_launch(mmv_f_split_kernel<float, 1, true>, dim3((unsigned)a.n_out), dim3(32, MMV_WARPS), smem, s, a);
    return 0;
}
