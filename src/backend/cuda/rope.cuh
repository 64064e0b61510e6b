/* Rotary embedding helpers shared by the rope and qkv_prep kernels
 * (ops_elem.cu) and the decode attention that prepares its own q and k
 * (attention.cu).
 */
#ifndef STRATA_BACKEND_CUDA_ROPE_CUH
#define STRATA_BACKEND_CUDA_ROPE_CUH

#include "backend/cuda/common.cuh"

/* Rotary pair p of a head of hd values: its two places (p and p + hd/2 when
 * neox, 2p and 2p + 1 otherwise). */
static __device__ __forceinline__ int2 rope_places(int p, int hd, int neox) {
    return neox ? make_int2(p, p + hd / 2) : make_int2(2 * p, 2 * p + 1);
}

/* Cosine and sine of pair p at position pos. The angle is formed in double
 * as on the CPU: at positions of tens of thousands a float angle would
 * drift visibly. It is then reduced to [-pi, pi] in double and turned in
 * float (a few float ulps from the CPU's double sincos rounded to float):
 * double pow and sincos were most of the decode step's qkv_prep kernel.
 * freq_div: per-pair divisors, or NULL. */
static __device__ __forceinline__ void rope_cs(int pos, int p, int hd, float theta, float freq_scale,
                                               const float *freq_div, float *c, float *sn) {
    const double two_pi = 6.283185307179586476925;
    double a = (double)pos * freq_scale * exp2(-2.0 * p / hd * log2((double)theta));
    if (freq_div) a /= freq_div[p];
    sincosf((float)(a - two_pi * rint(a / two_pi)), sn, c);
}

#endif
