/* Matrix-vector launches of two weight types at once (mmv_q2_kernel): the
 * q and k products of one type with v of another, as the K-quant mixes lay
 * out attention (Q4_K_M and Q5_K_M keep attn_v in Q6_K). Only these pairs
 * are instantiated; other mixes launch once per type.
 */
#include "backend/cuda/mm/mmv_kernel.cuh"

/* The pairs (type of the first jobs, type of the rest): X(A, B) each. */
#define MMV_PAIRS(X) X(QT_Q4_K, QT_Q6_K) X(QT_Q5_K, QT_Q6_K)

int mmv_pair_supported(qt_type a, qt_type b) {
#define PAIR_IS(A, B)                                                                                                  \
    if (a == A && b == B) return 1;
    MMV_PAIRS(PAIR_IS)
#undef PAIR_IS
    return 0;
}

int mmv_launch_pair(const mm_mmv_args *a, int nt, int r, cudaStream_t s) {
#define PAIR_GO(A, B)                                                                                                  \
    if (a->type == A && a->type2 == B) {                                                                               \
        mmv_q_launch<A, B>(a, nt, r, s);                                                                               \
        return 0;                                                                                                      \
    }
    MMV_PAIRS(PAIR_GO)
#undef PAIR_GO
    return 1;
}
