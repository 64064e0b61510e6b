/* The CPU attention on AVX-512 (cpu_attn_tile_avx512.c), called by
 * cpu_backend.c's attention for every call (prompt chunks and decode) when
 * qt_cpu_isa() reports AVX-512 and head_dim is a multiple of 16.
 */
#ifndef STRATA_BACKEND_CPU_ATTN_H
#define STRATA_BACKEND_CPU_ATTN_H

#include <stddef.h>
#include <stdint.h>

#include "backend/backend.h"

/* One block of n_t consecutive query tokens x n_g query heads of KV head
 * hkv (n_t * n_g <= CPU_ATTN_ROWS), over an f16 or int8 cache with head_dim
 * a multiple of 16. Token t is at position pos + t and sees cache rows
 * max(0, pos + t - window + 1) (0 with no window) .. pos + t. Row (t, g) of
 * q and out is at t * ld + g * head_dim. A row's result does not depend on
 * the block it is in (the same bits for a token alone or in a prompt). */
#define CPU_ATTN_ROWS 48
/* Rows from which a block puts rows in lanes, else keys: bench_attn, one
 * core, SmolLM2's heads at depth 1024: keys in lanes ahead at 3-18 rows,
 * even at 24-36, rows in lanes ahead by ~20% at 48. */
#define CPU_ATTN_LANES_MIN 24
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
