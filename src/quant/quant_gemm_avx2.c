/* AVX2 (+FMA, F16C, BMI2 flags) gemm kernels: the template in
 * quant_gemm_body.h with vpmaddubsw + vpmaddwd as the integer core and 16 ymm
 * registers, so tiles of 2 rows x 4 tokens (8 float accumulators, the rest
 * for decoded weights and temporaries). Called only after cpuid says AVX2
 * runs (quant_gemm.c via qt_isa_supported).
 */
#define QG_VNNI  0
#define QG_R     2
#define QG_C     4
#define QG_TABLE qt_gemms_avx2
#include "quant/quant_gemm_body.h"
