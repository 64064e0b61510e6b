/* deepseek2's multi-head latent attention layer, for forward.c (internal to
 * model/): its extra activation buffers and the attention block. */
#ifndef STRATA_MODEL_FORWARD_MLA_H
#define STRATA_MODEL_FORWARD_MLA_H

#include "model/model.h"

typedef struct mla_bufs mla_bufs;

mla_bufs *mla_bufs_create(const model *m, st_backend *be, int n_ubatch);
void mla_bufs_free(mla_bufs *b, st_backend *be);

/* One MLA layer for rows stacked as forward.c's attention_block has them
 * (sequence s: n_tok[s] rows, or one each when NULL, from position pos0[s],
 * its cache kv[s][il]). h = attn_norm(x) [rows][n_embd]; q and att are
 * [rows][n_head][head_dim] and krow [rows][head_dim] scratch (head_dim =
 * kv_lora + n_rot, the cache row). Returns the heads' values [rows][n_head *
 * v_head] (b's memory) for the output projection, which the caller joins to
 * the residual stream (forward.c's block_out). */
const float *mla_attention(const model *m, st_backend *be, mla_bufs *b, int il, const float *h, float *q, float *krow,
                           float *att, st_kv_layer *const *kv, const int *pos0, const int *n_tok, int n_seq, int rows);

#endif
