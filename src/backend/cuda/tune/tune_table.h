/* The GEMM tuning table that `strata tune` writes and the CUDA backend reads
 * (tune.cu): for each dense product shape, which cuBLASLt algorithm to run
 * and what it and cublasGemmEx measured. Plain C with no GPU toolkit, so the
 * writer, the parser and the architecture / version check are tested on
 * machines without a GPU (tests/cuda/test_tune_table.c).
 *
 * A cuBLASLt algorithm (cublasLtMatmulAlgo_t) is 8 opaque 64-bit words that
 * only the same cuBLASLt version on the same architecture understands; so
 * a table names both in its header and is ignored elsewhere, in one line
 * that says why (tune_table_check).
 *
 * File format (text, tab-separated; '#' lines and blank lines are comments):
 *
 *   strata-tune v1<TAB>arch=sm_90<TAB>cublaslt=130100<TAB>gpu=NVIDIA H200
 *   n_out n_in n_tok path lt_us gemmex_us workspace w0 .. w7      (one line per shape)
 *
 * n_out x n_in is the weight matrix, n_tok the prompt chunk's token count;
 * path is "lt" (run the stored algorithm) or "gemmex" (cublasGemmEx was as
 * fast: keep it); the times are the medians in microseconds of the whole
 * product; workspace is the bytes the algorithm needs; w0..w7 the algorithm
 * words in hex.
 */
#ifndef STRATA_BACKEND_CUDA_TUNE_TABLE_H
#define STRATA_BACKEND_CUDA_TUNE_TABLE_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define TUNE_ALGO_WORDS 8 /* sizeof(cublasLtMatmulAlgo_t) / 8 */

typedef enum { TUNE_PATH_GEMMEX = 0, TUNE_PATH_LT = 1 } tune_path;

typedef struct {
    int n_out, n_in, n_tok;         /* the product: W [n_out][n_in] times n_tok tokens */
    tune_path path;                 /* the faster of the two */
    double lt_us, gemmex_us;        /* medians of the best cuBLASLt algorithm and of cublasGemmEx */
    uint64_t workspace;             /* bytes the algorithm needs */
    uint64_t algo[TUNE_ALGO_WORDS]; /* the cublasLtMatmulAlgo_t, word by word */
} tune_entry;

typedef struct {
    int arch;            /* compute capability as major*10+minor: 90 for sm_90, 120 for sm_120 */
    uint64_t lt_version; /* cublasLtGetVersion() of the run that measured it */
    char gpu[128];       /* the card's name (informative: not part of the key) */
    int n, cap;
    tune_entry *e; /* (n) distinct (n_out, n_in, n_tok) */
} tune_table;

/* An empty table for this key. */
void tune_table_init(tune_table *t, int arch, uint64_t lt_version, const char *gpu);
void tune_table_free(tune_table *t);
/* Add e, replacing an entry of the same shape. */
void tune_table_put(tune_table *t, const tune_entry *e);
/* The entry for this shape, or NULL. */
const tune_entry *tune_table_find(const tune_table *t, int n_out, int n_in, int n_tok);

/* Parse a table from text (name for messages: a path). 0, or -1 with
 * st_error naming the line ("NAME:LINE: ...") and what is wrong with it;
 * *t is then empty. */
int tune_table_parse(tune_table *t, const char *text, const char *name);
/* Read and parse the file at path. 0; 1 when there is no such file (not an
 * error: nothing was tuned); -1 with st_error. */
int tune_table_load(tune_table *t, const char *path);
/* Write the table to path (missing parent folders are made; the file is
 * replaced whole through a temporary name). 0 or -1 with st_error. */
int tune_table_write(const tune_table *t, const char *path);

/* 0 when the table was measured on this architecture and cuBLASLt version;
 * else -1 with the one line that says why it is ignored in why, e.g.
 * "tune table P is for sm_86 / cuBLASLt 130000, GPU 0 is sm_90 / cuBLASLt
 * 130100: ignored; run strata tune --gpu 0". */
int tune_table_check(const tune_table *t, const char *path, int dev, int arch, uint64_t lt_version, char *why,
                     size_t why_size);

/* The table at path for GPU dev (arch, lt_version), as the engine takes it:
 * 1 with *t filled when it applies (one INFO line names it); 0 when there is
 * none (no line beyond DEBUG) or it is ignored: damaged, or for another
 * architecture or cuBLASLt version, said in exactly one WARN line; *t is
 * then empty. */
int tune_table_load_for(tune_table *t, const char *path, int dev, int arch, uint64_t lt_version);

/* "sm_90" for 90, "sm_120" for 120. */
void tune_arch_name(int arch, char *buf, size_t size);
/* The table's default place for an architecture: $XDG_CACHE_HOME/strata/
 * tune-sm90.tsv, else ~/.cache/strata/tune-sm90.tsv. 0, or -1 with st_error
 * when neither variable is set (or the path is too long). */
int tune_table_default_path(int arch, char *buf, size_t size);

#ifdef __cplusplus
}
#endif

#endif
