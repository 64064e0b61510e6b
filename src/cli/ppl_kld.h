/* The logits file of llama.cpp's `llama-perplexity --kl-divergence-base`, and
 * the KL-divergence statistics its `--kl-divergence` mode prints, for
 * `strata perplexity`. The format (all little-endian, no padding):
 *
 *   "_logits_"                      8 bytes
 *   n_ctx, n_vocab, n_chunk         int32 each
 *   tokens                          int32[n_chunk * n_ctx], the text's tokens
 *                                   (BOS first when the model adds one; the
 *                                   per-chunk BOS substitution is not stored)
 *   per chunk, per scored position  n_ctx - 1 - n_ctx/2 rows of nv uint16,
 *   (n_ctx/2 .. n_ctx-2)            nv = 2*((n_vocab+1)/2) + 4:
 *       float scale, float min_lp   (the first 4 uint16)
 *       uint16 q[n_vocab]           log p_i = scale * q_i + min_lp
 *       uint16 0                    when n_vocab is odd
 *
 * Row i predicts token i+1 of the chunk. min_lp is the log-probability of the
 * smallest logit, floored at 16 below the largest; q is 0 for logits at or
 * below that floor; scale = (max - floor) / 65535. */
#ifndef STRATA_CLI_PPL_KLD_H
#define STRATA_CLI_PPL_KLD_H

#include <stdint.h>
#include <stdio.h>

/* uint16 per stored row: two floats, the vocabulary, an even count. */
static inline int64_t kld_row_u16(int n_vocab) { return 2 * (((int64_t)n_vocab + 1) / 2) + 4; }
/* Scored positions per chunk (n_ctx/2 .. n_ctx-2). */
static inline int kld_rows_per_chunk(int n_ctx) { return n_ctx - 1 - n_ctx / 2; }

typedef struct {
    FILE *f;
    const char *path;
    int32_t n_ctx, n_vocab, n_chunk;
    int32_t *tokens; /* (n_chunk * n_ctx) when reading, NULL when writing */
    uint16_t *row;   /* (rows per chunk * kld_row_u16) scratch */
} kld_file;

/* Write the header and the tokens; 0, or -1 with st_error set. */
int kld_create(kld_file *k, const char *path, int n_ctx, int n_vocab, int n_chunk, const int32_t *tokens);
/* Append one chunk: logits (rows, n_vocab) of positions n_ctx/2 .. n_ctx-2. */
int kld_write_chunk(kld_file *k, const float *logits);
/* Open a base file: the magic, a sane header, a size that is exactly what the
 * header implies (so a truncated or padded file is refused before any
 * compute), and tokens below n_vocab. 0, or -1 with st_error set. */
int kld_open(kld_file *k, const char *path);
/* Read the next chunk's rows into k->row. */
int kld_read_chunk(kld_file *k);
/* Close and free; for a file being written, the close status (0 or -1). */
int kld_close(kld_file *k);

/* The sums llama.cpp's --kl-divergence accumulates, plus every position's
 * KLD and delta-p for the quantiles. */
typedef struct {
    double sum_nll, sum_nll2, sum_nll_base, sum_nll_base2, sum_nll_nll_base;
    double sum_kld, sum_kld2, sum_p_diff, sum_p_diff2, sum_p_diff4;
    float max_p_diff;
    int64_t n_same_top, count, cap;
    float *kld_values, *p_diff_values; /* (cap) */
} kld_stats;

void kld_stats_init(kld_stats *s, int64_t cap);
void kld_stats_free(kld_stats *s);
/* One chunk: logits (rows, n_vocab) of this run against the base rows k->row;
 * next[i] is the token that row i predicts. */
void kld_stats_chunk(kld_stats *s, const float *logits, const kld_file *k, const int32_t *next);
/* The column header and one line per chunk, as llama.cpp prints them. */
void kld_print_header(FILE *out);
void kld_print_chunk(FILE *out, const kld_stats *s, int64_t chunk);
/* The closing sections (perplexity, KL divergence, token probability);
 * nothing under 100 positions, as llama.cpp. */
void kld_print_summary(FILE *out, kld_stats *s);

#endif
