/* AVX-512 VNNI gemm kernels: the template in quant_gemm_body.h with
 * vpdpbusd / vpdpwssd on ymm (AVX512VL) as the integer core. ymm rather than
 * zmm for the same reason as the single-row Q8_0/Q4_K kernels: 512-bit work
 * has two vector ports instead of three. AVX512VL gives 32 ymm registers,
 * so tiles of 4 rows x 4 tokens (16 float accumulators). Called only after
 * cpuid/xgetbv say the CPU and OS run AVX-512 (quant_gemm.c).
 */
#define QG_VNNI 1
#define QG_R 4
#define QG_C 4
#define QG_TABLE qt_gemms_avx512
#include "quant/quant_gemm_body.h"
