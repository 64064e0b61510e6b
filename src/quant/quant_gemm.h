/* Multi-token CPU products of quantized weights: a tile of weight rows times
 * a few quantized activation rows, for the prompt path (cpu_matmul with two
 * or more tokens).
 *
 * Why: the single-row dot (qt_vec_dot) decodes every weight block (nibble
 * unpack, scale decode) each time it is called, so a prompt of T tokens
 * decoded each block T times and prompt processing was bound by decode work.
 * A gemm kernel decodes each block of a few rows ONCE into int8 and float
 * scales held in L1, then multiplies them with the blocks of up to
 * QT_GEMM_MAX_TOK tokens in register tiles (AVX-512: 16 interleaved rows x
 * up to 16 tokens):
 * decode work is amortized over the tokens, activation preparation (scale
 * conversion, unsigned copy) over the rows. Design: quant_gemm_body.h.
 *
 * Results equal the single-row dot's up to float rounding: the integer sums
 * of each block are exact in both (offsets included); the kernels here scale
 * per 32-weight unit in float (scale products rounded differently) and sum
 * blocks in another order. tests/quant/test_gemm.c bounds the difference at 1e-6 of
 * sum|w_i * a_i| (the normalisation test_dot.c uses).
 *
 * Formats (x86 with AVX2 or AVX-512 VNNI): Q4_0, Q4_1, Q5_0, Q5_1, Q8_0,
 * IQ4_NL, Q4_K, Q5_K, Q6_K, IQ4_XS. The rest (and the scalar ISA) have no
 * gemm kernel: qt_gemm() returns NULL and callers use qt_vec_dot per pair
 * (qt_gemm_by_dot does exactly that).
 */
#ifndef STRATA_QUANT_QUANT_GEMM_H
#define STRATA_QUANT_QUANT_GEMM_H

#include <stddef.h>

#include "quant/quant.h"

/* Most activation rows one call takes (the kernels keep that many tokens'
 * prepared chunks on the stack: up to ~150 KiB per call). */
#define QT_GEMM_MAX_TOK 64

/* The AMX kernels take up to this many (qt_gemm_max_tok): each weight
 * block decoded once for 256 tokens rather than 64 (the tokens' chunk, 320
 * KiB on the stack, stays in L2). */
#define QT_GEMM_AMX_MAX_TOK 256

/* y[c*ldy + r] = dot(weight row r, activation row c) for r < nr, c < nc.
 * n: weights per row (whole blocks of the format, and of its vec_dot_type);
 * w: first weight row, rows w_stride bytes apart; act[c]: activation row c,
 * quantized in the format's vec_dot_type (qt_quantize_act); nr >= 1 any,
 * 1 <= nc <= qt_gemm_max_tok(isa). */
typedef void (*qt_gemm_fn)(int n, int nr, int nc, const void *w, size_t w_stride, const void *const *act, float *y,
                           size_t ldy);

/* The gemm kernel of weight type t on the given ISA path (clamped to what
 * the CPU runs, as qt_vec_dot); NULL if t has none there. */
qt_gemm_fn qt_gemm(qt_type t, qt_isa isa);
/* Most activation rows one call of qt_gemm(t, isa)'s kernels takes. */
int qt_gemm_max_tok(qt_isa isa);

/* Small batches: at most this many activation rows per call. */
#define QT_GEMM_SMALL_MAX_TOK 8

/* The small-batch kernel of weight type t on the given ISA path (clamped to
 * what the CPU runs), or NULL: qt_gemm_fn's arguments with 1 <= nc <=
 * QT_GEMM_SMALL_MAX_TOK. Each weight block is decoded once and dotted with
 * every token in registers, in the arithmetic of qt_vec_dot(t, isa): every
 * output equals that dot's on the same (row, token) pair BIT FOR BIT, so the
 * caller may mix the two freely (quant_gemm_small_avx512.c says how).
 * AVX-512 VNNI: Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, IQ4_NL; none elsewhere. */
qt_gemm_fn qt_gemm_small(qt_type t, qt_isa isa);

/* Token counts for which cpu_matmul_q uses the small-batch kernel of type t
 * rather than the gemm (measured crossover, quant_gemm.c): 2..this, 0 if none. */
int qt_gemm_small_max_tok(qt_type t, qt_isa isa);

/* Multiply-adds per second that one core's int8 unit does on the path the
 * gemm kernels take for isa: vpmaddubsw + vpmaddwd on AVX2, vpdpbusd (the
 * faster of ymm and zmm) on AVX-512, tdpbssd on tiles of the kernels' shape
 * on AMX; independent instructions for about `seconds`. A prompt's weight
 * products can go no faster than weights x tokens over this (times the
 * threads): the prompt roofline `strata bench` prints. 0 for the scalar
 * ISA and for one this CPU cannot run. */
double qt_int8_rate(qt_isa isa, double seconds);

/* The generic fallback with qt_gemm_fn's arguments: one dot call per (row,
 * token) pair with `dot` (a qt_vec_dot of the weight type). */
void qt_gemm_by_dot(qt_vec_dot_fn dot, int n, int nr, int nc, const void *w, size_t w_stride, const void *const *act,
                    float *y, size_t ldy);

#endif
