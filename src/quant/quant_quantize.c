/* Reference quantizers from f32, part 1: the float formats, the legacy
 * 32-weight formats (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q8_1), the Q8_K
 * activation format, MXFP4, and the qt_quantize() dispatcher.
 *
 * The legacy formats use ggml's reference method, so a file written here
 * matches one written by ggml or the gguf package byte for byte:
 *   symmetric (Q4_0, Q5_0): d = (signed value of largest magnitude) / -2^(b-1),
 *     so that element maps exactly to the most negative code, which the
 *     asymmetric code range -2^(b-1)..2^(b-1)-1 can hold; q = trunc(x/d + off + 0.5).
 *   min-max (Q4_1, Q5_1): d = (max - min) / (2^b - 1), m = min, q = trunc((x-m)/d + 0.5).
 *   Q8_0 / Q8_1: d = absmax / 127, q = round(x/d) (half away from zero).
 * The K-quants live in quant_quantize_k.c, the i-quants in quant_quantize_iq.c.
 *
 * Inputs must be finite; a block of zeros encodes to d = 0 and decodes to zeros.
 */
#include <math.h>
#include <string.h>

#include "core/fp16.h"
#include "core/log.h"
#include "quant/iq_tables.h"
#include "quant/quant.h"
#include "quant/quant_impl.h"
#include "quant/quant_quantize_util.h"

void qt_quantize(qt_type t, const float *src, void *dst, int64_t n) {
    const qt_traits *tr = qt_get(t);
    ST_ASSERT(tr != NULL && tr->quantize != NULL);
    ST_ASSERT(n >= 0 && n % tr->blck == 0);
    tr->quantize(src, dst, n);
}

/* ---- float formats ---- */

void qt_quantize_f32(const float *src, void *dst, int64_t n) { memcpy(dst, src, (size_t)n * sizeof(float)); }

void qt_quantize_f16(const float *src, void *dst, int64_t n) {
    uint16_t *y = dst;
    for (int64_t i = 0; i < n; i++) y[i] = st_f32_to_f16(src[i]);
}

void qt_quantize_bf16(const float *src, void *dst, int64_t n) {
    uint16_t *y = dst;
    for (int64_t i = 0; i < n; i++) y[i] = st_f32_to_bf16(src[i]);
}

/* ---- legacy formats ---- */

/* The element of largest magnitude, with its sign. */
static float signed_absmax(const float *x, int n) {
    float amax = 0.0f, max = 0.0f;
    for (int j = 0; j < n; j++) {
        float a = qq_absf(x[j]);
        if (a > amax) {
            amax = a;
            max = x[j];
        }
    }
    return max;
}

/* Codes of a symmetric b-bit block: q = trunc(x*id + half + 0.5) in [0, 2^b - 1].
 * The truncating conversion is safe: x*id is within [-half, half] up to rounding. */
static void quantize_sym_codes(const float *x, int n, float id, int half, uint8_t *q) {
    const int qmax = 2 * half - 1;
    for (int j = 0; j < n; j++) {
        int v = (int)(x[j] * id + ((float)half + 0.5f));
        q[j] = (uint8_t)(v > qmax ? qmax : (v < 0 ? 0 : v));
    }
}

static void quantize_minmax_codes(const float *x, int n, float min, float id, int qmax, uint8_t *q) {
    for (int j = 0; j < n; j++) {
        int v = (int)((x[j] - min) * id + 0.5f);
        q[j] = (uint8_t)(v > qmax ? qmax : (v < 0 ? 0 : v));
    }
}

/* Low nibbles hold weights 0..15, high nibbles 16..31 (legacy layout). */
static void pack_nibbles32(const uint8_t *q, uint8_t *qs) {
    for (int j = 0; j < 16; j++) qs[j] = (uint8_t)((q[j] & 0x0f) | ((q[j + 16] & 0x0f) << 4));
}

/* Bit j of the little-endian 32-bit qh is bit 4 of weight j's code. */
static void pack_qh32(const uint8_t *q, uint8_t qh[4]) {
    uint32_t h = 0;
    for (int j = 0; j < 32; j++) h |= (uint32_t)((q[j] >> 4) & 1) << j;
    for (int k = 0; k < 4; k++) qh[k] = (uint8_t)(h >> (8 * k));
}

void qt_quantize_q4_0(const float *src, void *dst, int64_t n) {
    block_q4_0 *y = dst;
    uint8_t q[QK4_0];
    for (int64_t i = 0; i < n / QK4_0; i++) {
        const float *x = src + i * QK4_0;
        const float d = signed_absmax(x, QK4_0) / -8.0f;
        const float id = d != 0.0f ? 1.0f / d : 0.0f;
        quantize_sym_codes(x, QK4_0, id, 8, q);
        y[i].d = st_f32_to_f16(d);
        pack_nibbles32(q, y[i].qs);
    }
}

void qt_quantize_q5_0(const float *src, void *dst, int64_t n) {
    block_q5_0 *y = dst;
    uint8_t q[QK5_0];
    for (int64_t i = 0; i < n / QK5_0; i++) {
        const float *x = src + i * QK5_0;
        const float d = signed_absmax(x, QK5_0) / -16.0f;
        const float id = d != 0.0f ? 1.0f / d : 0.0f;
        quantize_sym_codes(x, QK5_0, id, 16, q);
        y[i].d = st_f32_to_f16(d);
        pack_qh32(q, y[i].qh);
        pack_nibbles32(q, y[i].qs);
    }
}

static void block_minmax(const float *x, int n, float *mn, float *mx) {
    float lo = x[0], hi = x[0];
    for (int j = 1; j < n; j++) {
        if (x[j] < lo) lo = x[j];
        if (x[j] > hi) hi = x[j];
    }
    *mn = lo;
    *mx = hi;
}

void qt_quantize_q4_1(const float *src, void *dst, int64_t n) {
    block_q4_1 *y = dst;
    uint8_t q[QK4_1];
    for (int64_t i = 0; i < n / QK4_1; i++) {
        const float *x = src + i * QK4_1;
        float mn, mx;
        block_minmax(x, QK4_1, &mn, &mx);
        const float d = (mx - mn) / 15.0f;
        const float id = d != 0.0f ? 1.0f / d : 0.0f;
        quantize_minmax_codes(x, QK4_1, mn, id, 15, q);
        y[i].d = st_f32_to_f16(d);
        y[i].m = st_f32_to_f16(mn);
        pack_nibbles32(q, y[i].qs);
    }
}

void qt_quantize_q5_1(const float *src, void *dst, int64_t n) {
    block_q5_1 *y = dst;
    uint8_t q[QK5_1];
    for (int64_t i = 0; i < n / QK5_1; i++) {
        const float *x = src + i * QK5_1;
        float mn, mx;
        block_minmax(x, QK5_1, &mn, &mx);
        const float d = (mx - mn) / 31.0f;
        const float id = d != 0.0f ? 1.0f / d : 0.0f;
        quantize_minmax_codes(x, QK5_1, mn, id, 31, q);
        y[i].d = st_f32_to_f16(d);
        y[i].m = st_f32_to_f16(mn);
        pack_qh32(q, y[i].qh);
        pack_nibbles32(q, y[i].qs);
    }
}

/* Round half away from zero (C's roundf, numpy's np_roundf in the gguf
 * package), written out so the Q8 loops need no libm call. The float ->
 * int conversion is exact for |v| <= 127.5, which is all that Q8 feeds it. */
static inline int round_away(float v) {
    float a = qq_absf(v);
    int i = (int)(a + 0.5f);
    /* a + 0.5f can round up when a is just below k + 0.5 (e.g. 0.49999997):
     * correct that one case so that ties alone go away from zero. */
    if ((float)i - a > 0.5f) i--;
    return v < 0 ? -i : i;
}

/* Codes of an 8-bit absmax block; returns the sum of the codes. */
static int quantize_q8_codes(const float *x, int n, float id, int8_t *qs) {
    int sum = 0;
    for (int j = 0; j < n; j++) {
        int v = round_away(x[j] * id);
        qs[j] = (int8_t)v;
        sum += v;
    }
    return sum;
}

static float block_absmax(const float *x, int n) {
    float amax = 0.0f;
    for (int j = 0; j < n; j++) {
        float a = qq_absf(x[j]);
        amax = a > amax ? a : amax;
    }
    return amax;
}

void qt_quantize_q8_0(const float *src, void *dst, int64_t n) {
    block_q8_0 *y = dst;
    for (int64_t i = 0; i < n / QK8_0; i++) {
        const float *x = src + i * QK8_0;
        const float d = block_absmax(x, QK8_0) / 127.0f;
        const float id = d != 0.0f ? 1.0f / d : 0.0f;
        quantize_q8_codes(x, QK8_0, id, y[i].qs);
        y[i].d = st_f32_to_f16(d);
    }
}

/* Q8_1 also stores s = d * sum(q) (with the unrounded d, as ggml does) so that
 * a dot with Q4_1/Q5_1 adds the min term with one multiply. */
void qt_quantize_q8_1(const float *src, void *dst, int64_t n) {
    block_q8_1 *y = dst;
    for (int64_t i = 0; i < n / QK8_1; i++) {
        const float *x = src + i * QK8_1;
        const float d = block_absmax(x, QK8_1) / 127.0f;
        const float id = d != 0.0f ? 1.0f / d : 0.0f;
        int sum = quantize_q8_codes(x, QK8_1, id, y[i].qs);
        y[i].d = st_f32_to_f16(d);
        y[i].s = st_f32_to_f16((float)sum * d);
    }
}

/* Q8_K (activations of the K-quant dots), ggml's method: the element of
 * largest magnitude maps to -127 exactly (d = max / -127, an f32 scale),
 * and bsums hold the sums of each 16 codes. */
void qt_quantize_q8_k(const float *src, void *dst, int64_t n) {
    block_q8_K *y = dst;
    for (int64_t i = 0; i < n / QK_K; i++) {
        const float *x = src + i * QK_K;
        const float max = signed_absmax(x, QK_K);
        if (max == 0.0f) {
            memset(&y[i], 0, sizeof(y[i]));
            continue;
        }
        const float iscale = -127.0f / max;
        for (int j = 0; j < QK_K; j++) y[i].qs[j] = (int8_t)qq_round_clamp(iscale * x[j], -127, 127);
        for (int g = 0; g < QK_K / 16; g++) {
            int s = 0;
            for (int j = 0; j < 16; j++) s += y[i].qs[16 * g + j];
            y[i].bsums[g] = (int16_t)s;
        }
        y[i].d = 1.0f / iscale;
    }
}

/* ---- MXFP4 ---- */

/* Nearest doubled E2M1 code for v (already divided by the scale); ties go
 * to the code listed first, like the gguf package's argmin. */
static int mxfp4_code(float v) {
    int best = 0;
    float berr = qq_absf(v - (float)kvalues_mxfp4[0]);
    for (int k = 1; k < 16; k++) {
        float e = qq_absf(v - (float)kvalues_mxfp4[k]);
        if (e < berr) {
            berr = e;
            best = k;
        }
    }
    return best;
}

static float mxfp4_encode(const float *x, int e, uint8_t *codes) {
    const float d = qt_e8m0_to_f32_half((uint8_t)e), id = 1.0f / d;
    float err = 0.0f;
    for (int j = 0; j < QK_MXFP4; j++) {
        codes[j] = (uint8_t)mxfp4_code(x[j] * id);
        float r = x[j] - d * (float)kvalues_mxfp4[codes[j]];
        err += r * r;
    }
    return err;
}

/* MXFP4: the OCP/ggml exponent e = floor(log2(absmax)) - 2 + 127 puts the
 * block maximum in the top binade of E2M1 (up to 6 * 2^(e-127)), clipping
 * values above 1.5 * 2^floor(log2 absmax). We also try e + 1 (no clipping,
 * coarser steps) and keep whichever gives the lower squared error; codes are
 * nearest-value per element. */
void qt_quantize_mxfp4(const float *src, void *dst, int64_t n) {
    block_mxfp4 *y = dst;
    uint8_t c0[QK_MXFP4], c1[QK_MXFP4];
    for (int64_t i = 0; i < n / QK_MXFP4; i++) {
        const float *x = src + i * QK_MXFP4;
        const float amax = block_absmax(x, QK_MXFP4);
        if (amax == 0.0f) {
            memset(&y[i], 0, sizeof(y[i])); /* code 0 is +0 */
            continue;
        }
        /* clamp keeps e and e + 1 in 1..254: both scales finite and nonzero */
        int e = (int)floorf(log2f(amax)) - 2 + 127;
        e = e < 1 ? 1 : (e > 253 ? 253 : e);
        float err0 = mxfp4_encode(x, e, c0);
        float err1 = mxfp4_encode(x, e + 1, c1);
        const uint8_t *c = c0;
        if (err1 < err0) {
            c = c1;
            e = e + 1;
        }
        y[i].e = (uint8_t)e;
        for (int j = 0; j < QK_MXFP4 / 2; j++) y[i].qs[j] = (uint8_t)(c[j] | (c[j + 16] << 4));
    }
}
