/* Vectorized inner loops of the CPU attention (cpu_backend.c, attn_task).
 * Decode: over an f16 cache, for one KV head and the G query heads that share it.
 * The cache rows of this head are k + p*row and v + p*row (f16 values, row =
 * n_head_kv * hd); hd must be a multiple of 16. The caller picks them when
 * qt_cpu_isa() reports AVX-512.
 */
#ifndef STRATA_BACKEND_CPU_ATTN_H
#define STRATA_BACKEND_CPU_ATTN_H

#include <stddef.h>
#include <stdint.h>

#include "backend/backend.h"

/* sc[g*nc + p] = scale * (q_g . k_p) for g < G, p0 <= p <= p1; q_g = q + g*hd. */
void cpu_attn_scores_f16_avx512(const float *q, int G, int hd, const uint16_t *k, size_t row, int p0, int p1,
                                float scale, float *sc, size_t nc);
/* acc[g*hd + i] = sum over p0 <= p <= p1 of w[g*nc + p] * v_p[i] (acc overwritten). */
void cpu_attn_values_f16_avx512(const float *w, size_t nc, int G, int hd, const uint16_t *v, size_t row, int p0, int p1,
                                float *acc);
/* s[0..n) = softmax of s with one more logit `sink` that has no value
 * (-INFINITY: none), in place; e^x by a polynomial within a float ulp of expf. */
void cpu_attn_softmax_avx512(float *s, int n, float sink);

/* The prompt path (cpu_attn_tile_avx512.c): one block of n_t consecutive
 * query tokens x n_g query heads of KV head hkv (n_t * n_g <= CPU_ATTN_ROWS),
 * over an f16 or int8 cache with head_dim a multiple of 16. Token t is at
 * position pos + t and sees cache rows max(0, pos + t - window + 1) (0 with
 * no window) .. pos + t. Row (t, g) of q and out is at t * ld + g * head_dim. */
#define CPU_ATTN_ROWS 48
typedef struct {
    const float *q;     /* (n_t, ld): the block's first row at q */
    float *out;         /* (n_t, ld), the same layout */
    size_t ld;          /* floats from one token's rows to the next: n_head * head_dim */
    int n_t, n_g;       /* tokens and query heads of the block */
    int pos, window;    /* the first token's position; window 0: none */
    const float *sinks; /* (n_g) sink logits (gpt-oss), or NULL */
    float scale;        /* of the scores */
    const st_kv_layer *kv;
    int hkv; /* the KV head */
} cpu_attn_block;
/* Floats of scratch cpu_attn_block_avx512 needs at this head_dim. */
size_t cpu_attn_block_scratch(int hd);
void cpu_attn_block_avx512(const cpu_attn_block *b, float *scratch);

#endif
