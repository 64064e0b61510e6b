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

#include <stdint.h>

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

/* Crossover token counts measured with the gemm and dot kernels of each path
 * on one Zen 5 core (64 rows x 2048 weights in cache, 2..12 tokens, ratio of
 * times; the first count where the gemm won, rounded up where it was within
 * 5%). AVX-512's gemm tiles are wider and its dots faster (Q4_K/Q5_K/IQ4_XS
 * dots in zmm), so it needs more tokens. */
static const unsigned char min_tok_avx512[QT_COUNT] = {
    [QT_Q4_0] = 4, [QT_Q4_1] = 4, [QT_Q5_0] = 3, [QT_Q5_1] = 3, [QT_Q8_0] = 5,
    [QT_IQ4_NL] = 4, [QT_Q4_K] = 6, [QT_Q5_K] = 6, [QT_Q6_K] = 6, [QT_IQ4_XS] = 10,
};
static const unsigned char min_tok_avx2[QT_COUNT] = {
    [QT_Q4_0] = 2, [QT_Q4_1] = 3, [QT_Q5_0] = 2, [QT_Q5_1] = 3, [QT_Q8_0] = 3,
    [QT_IQ4_NL] = 3, [QT_Q4_K] = 3, [QT_Q5_K] = 3, [QT_Q6_K] = 2, [QT_IQ4_XS] = 5,
};

int qt_gemm_min_tok(qt_type t, qt_isa isa) {
    if (!qt_gemm(t, isa)) return INT32_MAX;
    while ((int)isa > 0 && !qt_isa_supported(isa)) isa = (qt_isa)((int)isa - 1);
    const int m = isa == QT_ISA_AVX512 ? min_tok_avx512[t] : min_tok_avx2[t];
    return m >= 2 ? m : 2; /* a kernel missing from the table: the old rule */
}

void qt_gemm_by_dot(qt_vec_dot_fn dot, int n, int nr, int nc, const void *w, size_t w_stride,
                    const void *const *act, float *y, size_t ldy) {
    const unsigned char *wr = w;
    for (int r = 0; r < nr; r++, wr += w_stride)
        for (int c = 0; c < nc; c++) dot(n, &y[(size_t)c * ldy + (size_t)r], wr, act[c]);
}
