/* AMX gemm kernels: the AVX-512 VNNI template (quant_gemm_avx512.c) with
 * the tile path of quant_gemm_amx.h in front of it for blocks of 16 rows
 * and at least QG_AMX_MIN_TOK tokens (Q6_K: its own tile path, two half-unit
 * products); the rest (fewer tokens, leftover rows) runs the VNNI kernels
 * compiled here again. Handed out only as
 * QT_ISA_AMX, after cpuid, xgetbv and the OS's permission (quant_dot.c).
 */
#define QG_VNNI  1
#define QG_AMX   1
#define QG_R     4
#define QG_C     4
#define QG_TABLE qt_gemms_amx
#include "quant/quant_gemm_body.h"
