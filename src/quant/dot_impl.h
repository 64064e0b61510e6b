/* Internal to quant/: the per-ISA tables of dot-product kernels.
 *
 * Two families fill them from separate files so that each stays small:
 *   "main": F32/F16/BF16, legacy Q4_0..Q8_0, K-quants, IQ4_NL/IQ4_XS, MXFP4 (quant_dot_*.c)
 *   "iq":   IQ2_XXS/IQ2_XS/IQ2_S/IQ3_XXS/IQ3_S/IQ1_S/IQ1_M (quant_dot_iq_*.c)
 * Each table is indexed by qt_type; NULL means "no kernel on this ISA", and
 * qt_vec_dot() then falls back to the next lower ISA (scalar always exists).
 */
#ifndef STRATA_QUANT_DOT_IMPL_H
#define STRATA_QUANT_DOT_IMPL_H

#include "quant/quant.h"

extern const qt_vec_dot_fn qt_dots_main_scalar[QT_COUNT];
extern const qt_vec_dot_fn qt_dots_main_avx2[QT_COUNT];
extern const qt_vec_dot_fn qt_dots_main_avx512[QT_COUNT];
extern const qt_vec_dot_fn qt_dots_iq_scalar[QT_COUNT];
extern const qt_vec_dot_fn qt_dots_iq_avx2[QT_COUNT];
extern const qt_vec_dot_fn qt_dots_iq_avx512[QT_COUNT];
/* AVX-512 i-quant kernels that load grid rows one by one rather than with
 * vpgatherqq (slow on AMD); NULL where a format has none. */
extern const qt_vec_dot_fn qt_dots_iq_avx512_loads[QT_COUNT];
/* AVX-512 i-quant kernels holding the grid in registers (quant_dot_iq_avx512vbmi.c):
 * they also need VBMI (qt_cpu_has_vbmi); NULL where a format has none. */
extern const qt_vec_dot_fn qt_dots_iq_avx512_regs[QT_COUNT];
int qt_cpu_has_vbmi(void);

#endif
