/* Internal to quant/: the per-ISA tables of gemm kernels (quant_gemm.h),
 * indexed by qt_type; NULL means "no gemm kernel for this type on this ISA". */
#ifndef STRATA_QUANT_QUANT_GEMM_IMPL_H
#define STRATA_QUANT_QUANT_GEMM_IMPL_H

#include "quant/quant_gemm.h"

extern const qt_gemm_fn qt_gemms_avx2[QT_COUNT];
extern const qt_gemm_fn qt_gemms_avx512[QT_COUNT];
extern const qt_gemm_fn qt_gemms_amx[QT_COUNT];          /* AVX-512's with the tile path in front */
extern const qt_gemm_fn qt_gemms_small_avx512[QT_COUNT]; /* small batches, bit-equal to the dot */

/* qt_int8_rate's loops: iters rounds of the ISA's integer core; each returns
 * the multiply-adds it did (quant_peak_avx2.c, quant_peak_avx512.c,
 * quant_gemm_amx.h) */
uint64_t qt_peak_avx2(int64_t iters);
uint64_t qt_peak_avx512(int64_t iters, int zmm);
uint64_t qt_peak_amx(int64_t iters);

#endif
