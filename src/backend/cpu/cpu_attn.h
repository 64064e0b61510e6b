/* Vectorized inner loops of the CPU attention (cpu_backend.c, attn_task)
 * over an f16 cache, for one KV head and the G query heads that share it.
 * The cache rows of this head are k + p*row and v + p*row (f16 values, row =
 * n_head_kv * hd); hd must be a multiple of 16. The caller picks them when
 * qt_cpu_isa() reports AVX-512.
 */
#ifndef STRATA_BACKEND_CPU_ATTN_H
#define STRATA_BACKEND_CPU_ATTN_H

#include <stddef.h>
#include <stdint.h>

/* sc[g*nc + p] = scale * (q_g . k_p) for g < G, p0 <= p <= p1; q_g = q + g*hd. */
void cpu_attn_scores_f16_avx512(const float *q, int G, int hd, const uint16_t *k, size_t row, int p0, int p1,
                                float scale, float *sc, size_t nc);
/* acc[g*hd + i] = sum over p0 <= p <= p1 of w[g*nc + p] * v_p[i] (acc overwritten). */
void cpu_attn_values_f16_avx512(const float *w, size_t nc, int G, int hd, const uint16_t *v, size_t row, int p0, int p1,
                                float *acc);
/* s[0..n) = softmax of s with one more logit `sink` that has no value
 * (-INFINITY: none), in place; e^x by a polynomial within a float ulp of expf. */
void cpu_attn_softmax_avx512(float *s, int n, float sink);

#endif
