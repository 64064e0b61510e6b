/* AVX-512 (F/BW/VL/DQ + VNNI) dot products of the "main" weight formats.
 * Placeholder table: kernels land here next; NULL entries fall back to AVX2.
 */
#include "quant/dot_impl.h"

const qt_vec_dot_fn qt_dots_main_avx512[QT_COUNT] = {0};
