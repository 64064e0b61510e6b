/* cuBLASLt algorithm tuning for the prompt-size products (`strata tune`) and
 * its use by the GEMM path (gemm.cu).
 *
 * Measuring: for each (n_out, n_in, n_tok) the product gemm.cu issues (bf16
 * weights in the same row chunks, bf16 activations, f32 output) is timed
 * with cublasGemmEx and with up to max_algos candidates cuBLASLt's heuristic
 * proposes; each candidate's output is checked against cublasGemmEx's
 * before it may win. The result is a tune_table (tune_table.h), keyed by the
 * card's architecture and the cuBLASLt version.
 *
 * Using: each device loads the table for ITS architecture on its first
 * prompt product (or when cuda_tune_load is called at start), from the
 * default path (tune_table_default_path); a table for another architecture
 * or cuBLASLt version is ignored in one line. Nothing is shared between
 * devices: two cards of different architectures read two tables.
 *
 * HIP builds have no cuBLASLt: cuda_tune_run says so, and the GEMM path is
 * the plain BLAS call.
 */
#ifndef STRATA_BACKEND_CUDA_TUNE_H
#define STRATA_BACKEND_CUDA_TUNE_H

#include <stdint.h>
#include <stdio.h>

#include "backend/cuda/compat.h"
#include "backend/cuda/tune/tune_table.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct {
    int dev;           /* the GPU to measure */
    const int *shapes; /* n_shapes pairs (n_out, n_in) */
    int n_shapes;
    const int *n_toks; /* token counts per shape (prompt chunk sizes) */
    int n_n_toks;
    int max_algos;  /* heuristic candidates per shape (1..32; 0: 8) */
    int reps;       /* timed samples per candidate, the median kept (0: 7) */
    int keep_lt;    /* tests: store the best cuBLASLt algorithm as path "lt" even when slower */
    FILE *progress; /* one line per shape, or NULL */
} cuda_tune_params;

/* Key of a device: architecture (major*10+minor), cuBLASLt version, name.
 * 0, or -1 with st_error (no such device; HIP: no cuBLASLt). */
int cuda_tune_device_key(int dev, int *arch, uint64_t *lt_version, char *name, size_t name_size);

/* Measure every shape x token count on p->dev and put the results into *t,
 * which must be initialised for that device's key (entries already there for
 * other shapes stay). 0, or -1 with st_error. Leaves p->dev current. */
int cuda_tune_run(const cuda_tune_params *p, tune_table *t);

/* Load the current device's table now (once per device; later calls do
 * nothing). Called lazily by the first tuned product otherwise. 0 always:
 * a missing or ignored table only means the untuned path. */
int cuda_tune_load(void);

/* Tests: make *t (copied; NULL: none) the current device's table in place of
 * whatever was loaded, and reset its refusal state. 0, or -1 with st_error. */
int cuda_tune_install(const tune_table *t);

/* cuBLASLt products the current device ran with a tuned algorithm, and
 * tuned algorithms it refused (tests). */
long cuda_tune_lt_runs(void);
long cuda_tune_lt_refusals(void);

/* Free every device's cuBLASLt handle, workspace and table. */
void cuda_tune_release(void);

/* ---- internal to gemm.cu and tune.cu ---- */

/* Rows per dequantized weight chunk of gemm.cu for this matrix. */
int64_t mm_chunk_rows(int64_t n_in, int64_t n_out);
/* Rows of its last chunk (chunk itself when they divide evenly). */
static inline int64_t mm_last_chunk_rows(int64_t n_out, int64_t chunk) { return n_out - (n_out - 1) / chunk * chunk; }

/* Rows [r0, r0+m) of the product y = W x, W [n_out][n_in] (bf16 rows at a,
 * leading dimension n_in), x bf16 [n_tok][n_in] at b, into y + r0 (f32,
 * leading dimension n_out), with the current device's tuned algorithm. 0 when
 * it ran; 1 when the shape is not in the table (or its path is gemmex, or
 * cuBLASLt refused: said once per device): the caller runs cublasGemmEx. */
int cuda_tune_gemm(int n_out, int n_in, int n_tok, int m, const void *a, const void *b, float *c, cudaStream_t s);

#ifdef __cplusplus
}
#endif

#endif
