/* e^x on 16 floats with AVX-512F, for the files compiled for AVX-512
 * (cmake/isa.cmake): the attention's softmax and the CPU's activations. */
#ifndef STRATA_BACKEND_CPU_EXP_AVX512_H
#define STRATA_BACKEND_CPU_EXP_AVX512_H

#include <immintrin.h>

/* e^x, 16 at a time (x <= 88: the shifted scores are <= 0; larger x
 * overflows to +inf as expf does): x = n ln2 + r with
 * |r| <= ln2/2, e^r by its Taylor series to r^7 (truncation below 1e-8
 * relative, under a float ulp), times 2^n by vscalefps, which also takes
 * very negative x to 0 without overflowing the exponent. */
static inline __m512 exp_avx512(__m512 x) {
    x = _mm512_max_ps(x, _mm512_set1_ps(-104.0f)); /* e^-104 is below float's smallest: -inf gives 0, not NaN */
    const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                          _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693145751953125f), x); /* ln2 in two parts: exact n*hi */
    r = _mm512_fnmadd_ps(n, _mm512_set1_ps(1.428606820309417e-06f), r);
    __m512 p = _mm512_set1_ps(1.0f / 5040);
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 720));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 120));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 24));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 6));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(0.5f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
    return _mm512_scalef_ps(p, n);
}

#endif
