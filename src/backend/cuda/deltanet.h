/* Launchers of the hybrid Qwen family's ops on the GPU (deltanet.cu): the
 * gated DeltaNet of the linear-attention layers with its undo record for
 * drafts, and the two helpers of the gated attention layers. Semantics are
 * backend.h's (gated_delta_net, gated_delta_net_keep, split_halves,
 * sigmoid_mul); the reference is backend/cpu/cpu_hybrid.c. Every pointer is
 * device memory; each launcher enqueues on s without synchronising, so a
 * one-token call can be recorded in a decode step's CUDA graph.
 */
#ifndef STRATA_BACKEND_CUDA_DELTANET_H
#define STRATA_BACKEND_CUDA_DELTANET_H

#include "backend/cuda/common.cuh"

/* Floats of scratch cuda_gated_delta_net needs for n_tok tokens. */
size_t cuda_gdn_scratch_floats(const st_gdn *g, int n_tok);
/* The largest head size (st_gdn head_dim) the kernels take. */
#define CUDA_GDN_MAX_HD   256
#define CUDA_GDN_MAX_CONV 8 /* the largest d_conv */

/* gated_delta_net: the position is *dpos when dpos is given (a recorded
 * decode step), else pos0; position 0 starts from a zero state and window.
 * While st->undo_cap > 0 the pass is recorded into st->undo (st->undo_n
 * grows by n_tok: host bookkeeping, so such a call must not be recorded in
 * a graph). aq, ad (or NULL): out also written as the int8 blocks of 32 the
 * next product reads (head_dim a multiple of 32). */
void cuda_gated_delta_net(const st_gdn *g, st_kv_layer *st, int n_tok, int pos0, const int *dpos, const float *qkv,
                          const float *z, const float *beta, const float *alpha, float *out, float *scratch, int8_t *aq,
                          float2 *ad, cudaStream_t s);
/* gated_delta_net_keep: the saved state, then the kept tokens' scan again from their recorded rows. */
void cuda_gated_delta_net_keep(const st_gdn *g, st_kv_layer *st, int n_keep, cudaStream_t s);
void cuda_split_halves(const float *src, float *a, float *b, int n_rows, int n_group, int w, cudaStream_t s);
/* aq, ad (or NULL, and only with g_dim = dim, dim a multiple of 32): x also as int8 blocks. */
void cuda_sigmoid_mul(float *x, const float *g, int dim, int g_dim, int n_rows, int8_t *aq, float2 *ad, cudaStream_t s);

#endif
