/* Dispatcher of the gemm kernels (quant_gemm.h): per-ISA tables filled by
 * quant_gemm_avx2.c and quant_gemm_avx512.c, and the generic fallback.
 *
 * Unlike qt_vec_dot, a format without a kernel on the asked ISA does NOT fall
 * back to the lower ISA's kernel: the AVX-512 table covers every format the
 * AVX2 table does, and the scalar ISA has none, so "NULL" always means "use
 * the dot product" (a scalar request must stay scalar for the tests that
 * compare paths).
 */
#include "quant/quant_gemm.h"
#include "quant/quant_gemm_impl.h"

qt_gemm_fn qt_gemm(qt_type t, qt_isa isa) {
    if ((int)t < 0 || t >= QT_COUNT) return NULL;
    /* a path the CPU cannot run is never handed out, whatever was asked */
    while ((int)isa > 0 && !qt_isa_supported(isa)) isa = (qt_isa)((int)isa - 1);
    switch (isa) {
    case QT_ISA_AVX512: return qt_gemms_avx512[t];
    case QT_ISA_AVX2: return qt_gemms_avx2[t];
    default: return NULL;
    }
}

qt_gemm_fn qt_gemm_small(qt_type t, qt_isa isa) {
    if ((int)t < 0 || t >= QT_COUNT) return NULL;
    while ((int)isa > 0 && !qt_isa_supported(isa)) isa = (qt_isa)((int)isa - 1);
    return isa == QT_ISA_AVX512 ? qt_gemms_small_avx512[t] : NULL;
}

/* Up to how many tokens the small-batch kernel beats the gemm: measured with
 * `test_gemm --small-speed` (one core of the 2-core Xeon, 64 rows in L2, 576
 * and 4096 weights; docs/cpu-kernels.md). It wins clearly at 2-6 tokens on
 * every format and ties at 8 (within +-10%, either way by row length), except
 * Q5_0, where the gemm wins at 8 by 20-30%. At a tie the small kernel is
 * kept: its results are the dot's, whatever the batch. */
int qt_gemm_small_max_tok(qt_type t, qt_isa isa) {
    if (!qt_gemm_small(t, isa)) return 0;
    return t == QT_Q5_0 ? 6 : QT_GEMM_SMALL_MAX_TOK;
}

void qt_gemm_by_dot(qt_vec_dot_fn dot, int n, int nr, int nc, const void *w, size_t w_stride, const void *const *act,
                    float *y, size_t ldy) {
    const unsigned char *wr = w;
    for (int r = 0; r < nr; r++, wr += w_stride)
        for (int c = 0; c < nc; c++) dot(n, &y[(size_t)c * ldy + (size_t)r], wr, act[c]);
}
