/* Matrix-vector kernel instantiations for the 32-weight block formats (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, IQ4_NL, MXFP4):
 * one file per format family so that the builds compile them in parallel
 * (mmv_kernel.cuh holds the kernel, mmv.cu the dispatch).
 */
#include "backend/cuda/mm/mmv_kernel.cuh"

int mmv_launch_legacy(const mm_mmv_args *a, int nt, int r, cudaStream_t s) {
    switch ((int)a->type) {
    case QT_Q4_0: mmv_q_launch<QT_Q4_0>(a, nt, r, s); return 0;
    case QT_Q4_1: mmv_q_launch<QT_Q4_1>(a, nt, r, s); return 0;
    case QT_Q5_0: mmv_q_launch<QT_Q5_0>(a, nt, r, s); return 0;
    case QT_Q5_1: mmv_q_launch<QT_Q5_1>(a, nt, r, s); return 0;
    case QT_Q8_0: mmv_q_launch<QT_Q8_0>(a, nt, r, s); return 0;
    case QT_IQ4_NL: mmv_q_launch<QT_IQ4_NL>(a, nt, r, s); return 0;
    case QT_MXFP4: mmv_q_launch<QT_MXFP4>(a, nt, r, s); return 0;
    default: return 1;
    }
}
