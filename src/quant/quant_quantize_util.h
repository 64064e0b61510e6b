/* Internal to the reference quantizers (quant_quantize*.c): small helpers
 * they share, kept static inline so each file stays self-contained and the
 * hot loops of the fast formats (Q4_K, Q6_K, Q8_0) inline them.
 *
 * Rounding: qq_round() rounds half to even through the float "magic number"
 * (adding 1.5 * 2^23 leaves the rounded integer in the low mantissa bits), so
 * it needs no libm call and no float->int conversion of an unbounded value.
 * Callers clamp the float first; NaN is mapped to lo by the clamp order.
 */
#ifndef STRATA_QUANT_QUANTIZE_UTIL_H
#define STRATA_QUANT_QUANTIZE_UTIL_H

#include <stdint.h>
#include <string.h>

/* Round to nearest (ties to even), valid for |v| < 2^22. */
static inline int qq_round(float v) {
    float t = v + 12582912.0f;
    int32_t i;
    memcpy(&i, &t, 4);
    return (i & 0x007fffff) - 0x00400000;
}

/* Clamp v to [lo, hi] and round. Written so that NaN lands on lo:
 * every comparison with NaN is false, so `v >= lo` fails first. */
static inline int qq_round_clamp(float v, int lo, int hi) {
    float c = v >= (float)lo ? v : (float)lo;
    c = c <= (float)hi ? c : (float)hi;
    return qq_round(c);
}

static inline float qq_absf(float v) { return v < 0 ? -v : v; }

/* Index into the ascending table vals[n] of the entry nearest to v (ties go
 * to the lower entry). n is 16 for the non-linear 4-bit formats. */
static inline int qq_nearest_sorted(const float *vals, int n, float v) {
    if (v <= vals[0]) return 0;
    if (v >= vals[n - 1]) return n - 1;
    int lo = 0, hi = n - 1; /* invariant: vals[lo] < v < vals[hi] */
    while (hi - lo > 1) {
        int mid = (lo + hi) / 2;
        if (v < vals[mid]) hi = mid;
        else lo = mid;
    }
    return (v - vals[lo] <= vals[hi] - v) ? lo : hi;
}

#endif
