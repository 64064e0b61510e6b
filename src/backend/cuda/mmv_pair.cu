/* Matrix-vector launches of two weight types at once (mmv_q2_kernel): the
 * q and k products of one type with v of another, as the K-quant mixes lay
 * out attention (Q4_K_M and Q5_K_M keep attn_v in Q6_K). Only these pairs
 * are instantiated; other mixes launch once per type.
 */
#include "backend/cuda/mmv_kernel.cuh"

int mmv_pair_supported(qt_type a, qt_type b) {
    return (a == QT_Q4_K || a == QT_Q5_K) && b == QT_Q6_K;
}

int mmv_launch_pair(const mm_mmv_args *a, int nt, int r, cudaStream_t s) {
    if (a->type2 != QT_Q6_K) return 1;
    switch ((int)a->type) {
    case QT_Q4_K:
        mmv_q_launch<QT_Q4_K, QT_Q6_K>(a, nt, r, s);
        return 0;
    case QT_Q5_K:
        mmv_q_launch<QT_Q5_K, QT_Q6_K>(a, nt, r, s);
        return 0;
    default:
        return 1;
    }
}
