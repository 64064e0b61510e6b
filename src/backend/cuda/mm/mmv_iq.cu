/* Matrix-vector kernel instantiations for the i-quants with lattice grids and IQ4_XS:
 * one file per format family so that the builds compile them in parallel
 * (mmv_kernel.cuh holds the kernel, mmv.cu the dispatch).
 */
#include "backend/cuda/mm/mmv_kernel.cuh"

int mmv_launch_iq(const mm_mmv_args *a, int nt, int r, cudaStream_t s) {
    switch ((int)a->type) {
    case QT_IQ2_XXS: mmv_q_launch<QT_IQ2_XXS>(a, nt, r, s); return 0;
    case QT_IQ2_XS: mmv_q_launch<QT_IQ2_XS>(a, nt, r, s); return 0;
    case QT_IQ2_S: mmv_q_launch<QT_IQ2_S>(a, nt, r, s); return 0;
    case QT_IQ3_XXS: mmv_q_launch<QT_IQ3_XXS>(a, nt, r, s); return 0;
    case QT_IQ3_S: mmv_q_launch<QT_IQ3_S>(a, nt, r, s); return 0;
    case QT_IQ1_S: mmv_q_launch<QT_IQ1_S>(a, nt, r, s); return 0;
    case QT_IQ1_M: mmv_q_launch<QT_IQ1_M>(a, nt, r, s); return 0;
    case QT_IQ4_XS: mmv_q_launch<QT_IQ4_XS>(a, nt, r, s); return 0;
    default: return 1;
    }
}
