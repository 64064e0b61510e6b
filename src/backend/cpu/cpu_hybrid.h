/* CPU kernels of the hybrid Qwen family's ops (backend.h: gated_delta_net,
 * split_halves, sigmoid_mul); cpu_backend.c puts them in the op table. */
#ifndef STRATA_BACKEND_CPU_HYBRID_H
#define STRATA_BACKEND_CPU_HYBRID_H

#include "backend/backend.h"
#include "backend/cpu/cpu_ops.h"
#include "core/threadpool.h"

void cpu_gated_delta_net(st_pool *pool, cpu_scratch *scr, const st_gdn *g, st_kv_layer *st, int n_tok, int pos0,
                         const float *qkv, const float *z, const float *beta, const float *alpha, float *out);
void cpu_gated_delta_net_keep(st_pool *pool, cpu_scratch *scr, const st_gdn *g, st_kv_layer *st, int n_keep);
void cpu_split_halves(const float *src, float *a, float *b, int n_rows, int n_group, int w);
void cpu_sigmoid_mul(float *x, const float *g, int dim, int g_dim, int n_rows);

#endif
