/* Matrix-vector kernel instantiations for the K-quants (Q2_K .. Q6_K):
 * one file per format family so that the builds compile them in parallel
 * (mmv_kernel.cuh holds the kernel, mmv.cu the dispatch).
 */
#include "backend/cuda/mm/mmv_kernel.cuh"

int mmv_launch_k(const mm_mmv_args *a, int nt, int r, cudaStream_t s) {
    switch ((int)a->type) {
    case QT_Q2_K: mmv_q_launch<QT_Q2_K>(a, nt, r, s); return 0;
    case QT_Q3_K: mmv_q_launch<QT_Q3_K>(a, nt, r, s); return 0;
    case QT_Q4_K: mmv_q_launch<QT_Q4_K>(a, nt, r, s); return 0;
    case QT_Q5_K: mmv_q_launch<QT_Q5_K>(a, nt, r, s); return 0;
    case QT_Q6_K: mmv_q_launch<QT_Q6_K>(a, nt, r, s); return 0;
    default: return 1;
    }
}
