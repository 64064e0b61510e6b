/* Matrix-vector kernel instantiations for F32, F16 and BF16 weights (read
 * as floats, f32 activations: no quantization error is added). 8-wide loads
 * need every weight row and x row to start 16-byte aligned; otherwise the
 * one-element kernel runs.
 */
#include "backend/cuda/mmv_kernel.cuh"

template <typename WT, int V, int NT>
static void mmv_f_launch_nt(const mm_mmv_args *a, int r, cudaStream_t s) {
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

template <typename WT, int V>
static void mmv_f_launch(const mm_mmv_args *a, int nt, int r, cudaStream_t s) {
    if (nt <= 1) mmv_f_launch_nt<WT, V, 1>(a, r, s);
    else if (nt <= 2) mmv_f_launch_nt<WT, V, 2>(a, r, s);
    else if (nt <= 4) mmv_f_launch_nt<WT, V, 4>(a, r, s);
    else mmv_f_launch_nt<WT, V, 8>(a, r, s);
}

int mmv_launch_float(const mm_mmv_args *a, int nt, int r, cudaStream_t s) {
    const int vec = a->n_in % 8 == 0 && a->row_bytes % 16 == 0;
    switch ((int)a->type) {
    case QT_F32:
        vec ? mmv_f_launch<float, 8>(a, nt, r, s) : mmv_f_launch<float, 1>(a, nt, r, s);
        return 0;
    case QT_F16:
        vec ? mmv_f_launch<__half, 8>(a, nt, r, s) : mmv_f_launch<__half, 1>(a, nt, r, s);
        return 0;
    case QT_BF16:
        vec ? mmv_f_launch<uint16_t, 8>(a, nt, r, s) : mmv_f_launch<uint16_t, 1>(a, nt, r, s);
        return 0;
    default:
        return 1;
    }
}
