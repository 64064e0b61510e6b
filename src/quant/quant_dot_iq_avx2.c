/* Dot products of the i-quant weight formats (IQ2_XXS, IQ2_XS, IQ2_S,
 * IQ3_XXS, IQ3_S, IQ1_S, IQ1_M) with Q8_K activations, avx2 path.
 * Placeholder table: kernels land here next; NULL entries fall back.
 */
#include "quant/dot_impl.h"

const qt_vec_dot_fn qt_dots_iq_avx2[QT_COUNT] = {0};
