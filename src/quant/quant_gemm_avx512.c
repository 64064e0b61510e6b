/* AVX-512 VNNI gemm kernels: the template in quant_gemm_body.h with
 * vpdpbusd as the integer core. The main tile (qg_micro512) is 4 rows x 4
 * token pairs in zmm: one vpdpbusd takes a row's unit against two tokens, and
 * 512-bit VNNI/convert/FMA issue on two ports as 256-bit FMA-class work does,
 * so each instruction does twice the work (measured x1.3 on the kernels over
 * a 4 x 4 ymm tile). Blocks of 16 rows take the row-interleaved path
 * (qg_run16) instead, except Q4_K/Q5_K (integer scales in the zmm tile) and
 * Q6_K; leftover rows and Q6_K use ymm (32 registers with AVX512VL). Called only after cpuid/xgetbv say the CPU and OS
 * run AVX-512 (quant_gemm.c).
 */
#define QG_VNNI  1
#define QG_R     4
#define QG_C     4
#define QG_TABLE qt_gemms_avx512
#include "quant/quant_gemm_body.h"
