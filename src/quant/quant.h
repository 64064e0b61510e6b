/* Quant formats: the type table, reference (scalar) dequantizers and
 * quantizers, and the CPU dot products of each weight format with its
 * activation format.
 *
 * Layouts are in blocks.h. Every function here works on whole blocks: n (the
 * number of weights) must be a multiple of the type's block size.
 *
 * The reference dequantizers (quant_ref.c) are the oracle: they are tested
 * against the gguf package's dequantizers, and every SIMD or GPU kernel is
 * tested against them.
 */
#ifndef STRATA_QUANT_QUANT_H
#define STRATA_QUANT_QUANT_H

#include <stddef.h>
#include <stdint.h>

#include "quant/blocks.h"

/* Dot product of n weights (one row, format of the table entry) with n
 * activations in the entry's vec_dot_type; result in *s. */
typedef void (*qt_vec_dot_fn)(int n, float *s, const void *w, const void *a);
typedef void (*qt_dequant_fn)(const void *src, float *dst, int64_t n);
typedef void (*qt_quant_fn)(const float *src, void *dst, int64_t n);

/* AMX: AVX-512 VNNI plus the int8 tiles (and the OS's leave to use them);
 * only the gemm kernels use the tiles, every other path is AVX-512's. */
typedef enum { QT_ISA_SCALAR = 0, QT_ISA_AVX2 = 1, QT_ISA_AVX512 = 2, QT_ISA_AMX = 3, QT_ISA_COUNT = 4 } qt_isa;

typedef struct {
    const char *name;      /* GGUF's name: "Q4_K", "IQ2_XXS", ... */
    int blck;              /* weights per block */
    int type_size;         /* bytes per block */
    qt_type vec_dot_type;  /* activation format of its dot product */
    qt_dequant_fn dequant; /* reference dequantizer */
    qt_quant_fn quantize;  /* reference quantizer from f32 (NULL: not a weight format here) */
} qt_traits;

/* The entry for t, or NULL if Strata does not know t (never crashes on a bad id). */
const qt_traits *qt_get(qt_type t);
/* Type by GGUF name ("q4_k" or "Q4_K"); -1 if unknown. */
int qt_from_name(const char *name);
/* Bytes of a row of n weights; n must be a multiple of the block size. */
size_t qt_row_size(qt_type t, int64_t n);

/* Reference dequantization (quant_ref.c): dispatches on the table. */
void qt_dequantize(qt_type t, const void *src, float *dst, int64_t n);
/* Reference quantization from f32 (quant_quantize.c). */
void qt_quantize(qt_type t, const float *src, void *dst, int64_t n);

/* ---- CPU dot products (quant_dot_*.c) ---- */

/* The best ISA this CPU runs (cpuid), lowered by STRATA_ISA=scalar|avx2|avx512. */
qt_isa qt_cpu_isa(void);
const char *qt_isa_name(qt_isa isa);
/* Whether this CPU can run a path of that ISA. */
int qt_isa_supported(qt_isa isa);
/* 1 on an AMD CPU (cpuid vendor): some choices measured differently there. */
int qt_cpu_is_amd(void);
/* Dot product for weight type t on the given ISA path; falls back to the next
 * lower ISA where a path has no special version. NULL if t has no dot product. */
qt_vec_dot_fn qt_vec_dot(qt_type t, qt_isa isa);
/* Quantize n activations into t's vec_dot_type (Q8_0, Q8_1, Q8_K, or F32 copy). */
void qt_quantize_act(qt_type vec_dot_type, const float *x, void *dst, int64_t n);

#endif
