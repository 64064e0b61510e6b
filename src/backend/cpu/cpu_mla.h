/* CPU pieces of the deepseek2 family (backend.h): the strided copy that
 * multi-head latent attention gathers and scatters its heads with, and the
 * group-limited expert choice of DeepSeek V3's routing; cpu_backend.c puts
 * them in the op table and its routing. */
#ifndef STRATA_BACKEND_CPU_MLA_H
#define STRATA_BACKEND_CPU_MLA_H

#include <stdint.h>

#include "backend/backend.h"

/* matmul with ST_MAT_ALL (backend.h): each matrix's rows gathered, multiplied
 * by be->matmul, scattered back; the same arithmetic as one call per matrix. */
void cpu_matmul_all(st_backend *be, const st_weight *w, const float *x, float *y, int n_tok);
void cpu_copy_2d(st_backend *be, float *dst, int64_t dst_stride, const float *src, int64_t src_stride, int64_t width,
                 int n_rows);
/* Scores s[n_expert] of one token: every expert outside the n_used best of
 * n_group groups (a group's score: the sum of its two best s) set to -inf.
 * n_group at most 64 (the loader refuses more). */
void cpu_route_groups(float *s, int n_expert, int n_group, int n_used);

#endif
