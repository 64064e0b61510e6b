/* Vectorized gated activations of the CPU backend (cpu_backend.c, act_task),
 * picked when qt_cpu_isa() reports AVX-512. out may alias g or u. */
#ifndef STRATA_BACKEND_CPU_ACT_H
#define STRATA_BACKEND_CPU_ACT_H

#include <stdint.h>

/* out[i] = silu(g[i]) * u[i] for i < n. */
void cpu_silu_mul_avx512(const float *g, const float *u, float *out, int64_t n);
/* out[i] = gelu(g[i]) * u[i] (the tanh form) for i < n. */
void cpu_gelu_mul_avx512(const float *g, const float *u, float *out, int64_t n);

#endif
