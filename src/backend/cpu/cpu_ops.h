/* CPU matrix products over quantized weights: the matrix-vector product that
 * decode spends its time in, and the batched product for prompt chunks.
 *
 * Weights are raw rows in any quant format that has a CPU dot product
 * (quant/quant.h): a pointer to the first row and a row stride, nothing
 * model-shaped, so that the MoE path can run a product over one expert's
 * slice of a stacked tensor, wherever the engine placed it. Activations are
 * quantized once per call into the format's vec_dot_type, into a
 * caller-owned scratch arena that grows on demand and is then reused (no
 * allocation in steady state). Callers that apply several matrices to the same
 * input (gate and up, or many experts) can quantize once with
 * cpu_quantize_act() and call cpu_matmul_q() directly.
 *
 * Products split the output rows (and for batches, blocks of tokens) into
 * tasks of an st_pool; a NULL pool runs on the calling thread.
 *
 * Layouts: W is n_rows rows of n_cols weights (row r at W + r*row_stride);
 * x has n_cols floats; X is (n_tok, n_cols) row-major; Y is (n_tok, n_rows)
 * row-major: Y[t][r] = sum_c W[r][c] * X[t][c].
 *
 * Errors (unknown type, no dot product for it, n_cols not a whole number of
 * blocks) set st_error and return -1; nothing is written then.
 */
#ifndef STRATA_BACKEND_CPU_OPS_H
#define STRATA_BACKEND_CPU_OPS_H

#include <stddef.h>
#include <stdint.h>

#include "core/threadpool.h"
#include "quant/blocks.h"

/* A growable scratch buffer. Zero-initialise it ({0}) before first use. */
typedef struct {
    void *buf;  /* 64-byte aligned */
    size_t cap; /* bytes */
} cpu_scratch;

/* At least `bytes` bytes of the arena (earlier contents are not kept when it grows). */
void *cpu_scratch_reserve(cpu_scratch *s, size_t bytes);
void cpu_scratch_free(cpu_scratch *s);

/* Bytes of one quantized activation row of n_cols values for weights of
 * `type` (a row of its vec_dot_type); 0 if type has no dot product or n_cols
 * does not fit its blocks (st_error set). */
size_t cpu_act_row_size(qt_type type, int64_t n_cols);

/* Quantize n_tok rows of X (n_tok, n_cols) into Xq, rows cpu_act_row_size()
 * bytes apart, in the vec_dot_type of weight `type`. Returns 0 or -1. */
int cpu_quantize_act(st_pool *pool, qt_type type, int64_t n_cols, int64_t n_tok, const float *X, void *Xq);

/* y = W x. row_stride 0 means qt_row_size(type, n_cols). Returns 0 or -1. */
int cpu_matvec(st_pool *pool, cpu_scratch *scratch, const void *W, size_t row_stride, qt_type type, int64_t n_rows,
               int64_t n_cols, const float *x, float *y);

/* Y = X W^T for n_tok tokens (the prompt path). Weight rows are tiled so that
 * each block of rows is read from memory once per block of tokens and reused
 * from cache across those tokens. Returns 0 or -1. */
int cpu_matmul(st_pool *pool, cpu_scratch *scratch, const void *W, size_t row_stride, qt_type type, int64_t n_rows,
               int64_t n_cols, int64_t n_tok, const float *X, float *Y);

/* The product on activations already quantized by cpu_quantize_act(): output
 * row i (i < n_tok) is W times quantized activation row x_ids[i] (x_ids NULL:
 * row i), written to Y + i*ldy (ldy 0 means n_rows). The gather lets an
 * expert run over just the tokens routed to it. Returns 0 or -1. */
int cpu_matmul_q(st_pool *pool, const void *W, size_t row_stride, qt_type type, int64_t n_rows, int64_t n_cols,
                 int64_t n_tok, const void *Xq, const int32_t *x_ids, float *Y, int64_t ldy);

/* One product of a batch: the arguments of cpu_matmul_q(). */
typedef struct {
    const void *W;     /* first row */
    size_t row_stride; /* bytes between rows; 0: qt_row_size(type, n_cols) */
    qt_type type;
    int64_t n_rows, n_cols;
    int64_t n_tok;        /* outputs (tokens); 0: nothing to do */
    const void *Xq;       /* quantized activations (cpu_quantize_act) */
    const int32_t *x_ids; /* activation row of each output; NULL: 0..n_tok-1 */
    float *Y;             /* (n_tok, ldy) */
    int64_t ldy;          /* 0: n_rows */
} cpu_mm;

/* Runs n products in one pool dispatch (in groups of 64): the MoE decode step,
 * where each routed expert's matrices are small and a dispatch per matrix
 * would cost as much as the product. All are validated before any runs;
 * returns 0 or -1 (nothing written). */
int cpu_matmul_q_batch(st_pool *pool, const cpu_mm *mm, int n);

/* One product of cpu_matmul_q_batch()'s kind, wholly on the calling thread
 * (for use inside a pool task). Returns 0 or -1 (nothing written). */
int cpu_matmul_q_here(const cpu_mm *m);

/* Bytes of quantized activations that one task of cpu_matmul keeps in cache
 * (the token block; default 256 KiB, about a quarter of a server core's L2).
 * Not thread-safe: set it at start. 0 only reads it. Returns the old value. */
size_t cpu_set_act_block_bytes(size_t bytes);

/* How many bytes ahead a matvec prefetches its weight rows (default 4096;
 * 0 turns prefetching off; (size_t)-1 only reads it). Not thread-safe: set it
 * at start. Returns the old value. */
size_t cpu_set_prefetch_bytes(size_t bytes);

/* Fill n_blocks blocks of `type` with random but valid contents: random quant
 * bits, and finite scales of moderate size (dequantized weights stay within a
 * few units). For tests and benchmarks that need big weight matrices fast;
 * deterministic in seed. Returns 0, or -1 for a type it cannot fill. */
int cpu_fill_random_blocks(qt_type type, void *dst, int64_t n_blocks, uint64_t seed);

#endif
