/* Reference quantizers from f32, part 2: the K-quants Q2_K, Q3_K, Q4_K,
 * Q5_K and Q6_K (256-weight super-blocks).
 *
 * Method (ours, in the spirit of ggml's make_qkx / make_q3 searches, simpler):
 *  1. Per sub-block, a small grid search over candidate scales. Each candidate
 *     inverse scale (nmax + step*k) / range, k = -K..K, rounds the weights to
 *     codes; for those codes the best scale (and, for the affine formats, the
 *     best min <= 0) is the least-squares fit, and its squared error is
 *     computed in closed form from the sums. The candidate with the lowest
 *     error wins.
 *  2. The sub-block scales (and mins) are quantized to the format's 4/6/8-bit
 *     fields against an f16 super-block scale set by the largest of them.
 *  3. The codes are recomputed from the *decoded* scales (f16 super-scale
 *     times the integer sub-scale): for a fixed uniform grid, rounding to the
 *     nearest code is then optimal, and every field decodes to what was meant.
 * Errors are plain (unweighted) squared errors: the test metric is NMSE.
 * Speed: Q4_K and Q6_K use few candidates so they run at tens of millions of
 * weights per second per core (strata synth writes multi-GB files with them).
 */
#include <math.h>
#include <string.h>

#include "core/fp16.h"
#include "quant/quant_impl.h"
#include "quant/quant_quantize_util.h"

/* Affine fit x ~ s*q - m with q in 0..nmax, s >= 0, m >= 0 (the K-quant mins
 * are subtracted and stored unsigned, so the offset is clamped to <= 0).
 * Returns s; *pm gets m. ncand candidates each side of nmax, `step` apart. */
static float fit_scale_min(const float *x, int n, int nmax, int ncand, float step, float *pm) {
    float mn = x[0], mx = x[0], sx = 0.0f, sxx = 0.0f;
    for (int j = 0; j < n; j++) {
        mn = x[j] < mn ? x[j] : mn;
        mx = x[j] > mx ? x[j] : mx;
        sx += x[j];
        sxx += x[j] * x[j];
    }
    if (mn > 0.0f) mn = 0.0f;
    if (mx <= mn) { /* all weights equal mn <= 0: the min alone is exact */
        *pm = -mn;
        return 0.0f;
    }
    float best_err = INFINITY, best_s = (mx - mn) / (float)nmax, best_b = mn;
    for (int k = -ncand; k <= ncand; k++) {
        const float iscale = ((float)nmax + step * (float)k) / (mx - mn);
        int sq = 0, sqq = 0;
        float sqx = 0.0f;
        for (int j = 0; j < n; j++) {
            int q = qq_round_clamp(iscale * (x[j] - mn), 0, nmax);
            sq += q;
            sqq += q * q;
            sqx += (float)q * x[j];
        }
        if (sqq == 0) continue;
        const float D = (float)n * (float)sqq - (float)sq * (float)sq;
        float s, b;
        if (D > 0.0f) {
            s = ((float)n * sqx - (float)sq * sx) / D;
            b = ((float)sqq * sx - (float)sq * sqx) / D;
            if (b > 0.0f) { /* offset must be <= 0: refit the scale alone */
                b = 0.0f;
                s = sqx / (float)sqq;
            }
        } else { /* all codes equal: scale alone */
            b = 0.0f;
            s = sqx / (float)sqq;
        }
        if (!(s > 0.0f)) continue;
        const float err =
            sxx - 2.0f * s * sqx - 2.0f * b * sx + s * s * (float)sqq + 2.0f * s * b * (float)sq + (float)n * b * b;
        if (err < best_err) {
            best_err = err;
            best_s = s;
            best_b = b;
        }
    }
    *pm = -best_b;
    return best_s;
}

/* Symmetric fit x ~ s*q with q in nmin..nmax (nmin = -nmax-1): candidates map
 * the largest-magnitude weight near nmin (the extra negative code), s of
 * either sign. Returns s (0 for an all-zero sub-block). */
static float fit_scale_sym(const float *x, int n, int nmin, int nmax, int ncand, float step) {
    float amax = 0.0f, max = 0.0f;
    for (int j = 0; j < n; j++) {
        float a = qq_absf(x[j]);
        if (a > amax) {
            amax = a;
            max = x[j];
        }
    }
    if (amax == 0.0f) return 0.0f;
    float best_score = -1.0f, best_s = max / (float)nmin;
    for (int k = -ncand; k <= ncand; k++) {
        const float t = (float)nmin + step * (float)k;
        if (t >= 0.0f) continue;
        const float iscale = t / max;
        int sqq = 0;
        float sqx = 0.0f;
        for (int j = 0; j < n; j++) {
            int q = qq_round_clamp(iscale * x[j], nmin, nmax);
            sqq += q * q;
            sqx += (float)q * x[j];
        }
        if (sqq == 0) continue;
        /* with s = sqx/sqq the error is sum(x^2) - sqx^2/sqq: maximize the second term */
        const float score = sqx * sqx / (float)sqq;
        if (score > best_score) {
            best_score = score;
            best_s = sqx / (float)sqq;
        }
    }
    return best_s;
}

/* Quantize nonnegative values v[0..cnt) to integers 0..qmax against one f16
 * super-scale (the largest maps to qmax). Returns the f16 bits; codes in out. */
static uint16_t quantize_subscales_unsigned(const float *v, int cnt, int qmax, uint8_t *out) {
    float vmax = 0.0f;
    for (int j = 0; j < cnt; j++) vmax = v[j] > vmax ? v[j] : vmax;
    const uint16_t dh = st_f32_to_f16(vmax / (float)qmax);
    const float d = st_f16_to_f32(dh);
    const float id = d > 0.0f ? 1.0f / d : 0.0f;
    for (int j = 0; j < cnt; j++) out[j] = (uint8_t)qq_round_clamp(v[j] * id, 0, qmax);
    return dh;
}

/* Signed version: the sub-scale of largest magnitude maps to qmin (-2^(b-1)). */
static uint16_t quantize_subscales_signed(const float *v, int cnt, int qmin, int qmax, int8_t *out) {
    float amax = 0.0f, max = 0.0f;
    for (int j = 0; j < cnt; j++) {
        if (qq_absf(v[j]) > amax) {
            amax = qq_absf(v[j]);
            max = v[j];
        }
    }
    const uint16_t dh = st_f32_to_f16(max / (float)qmin);
    const float d = st_f16_to_f32(dh);
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    for (int j = 0; j < cnt; j++) out[j] = (int8_t)qq_round_clamp(v[j] * id, qmin, qmax);
    return dh;
}

/* Codes of one affine sub-block from its decoded scale and min. */
static void codes_affine(const float *x, int n, float ds, float dm, int nmax, uint8_t *q) {
    const float id = ds > 0.0f ? 1.0f / ds : 0.0f;
    for (int j = 0; j < n; j++) q[j] = (uint8_t)qq_round_clamp((x[j] + dm) * id, 0, nmax);
}

/* Codes of one symmetric sub-block, stored with the offset -nmin added. */
static void codes_sym(const float *x, int n, float ds, int nmin, int nmax, uint8_t *q) {
    const float id = ds != 0.0f ? 1.0f / ds : 0.0f;
    for (int j = 0; j < n; j++) q[j] = (uint8_t)(qq_round_clamp(x[j] * id, nmin, nmax) - nmin);
}

/* ---- Q2_K: 16 x 16 weights, w = d*sc*q - dmin*m, q 0..3, sc/m 4-bit ---- */
void qt_quantize_q2_k(const float *src, void *dst, int64_t n) {
    block_q2_K *y = dst;
    float s[16], m[16];
    uint8_t sc[16], mn[16], q[QK_K];
    for (int64_t i = 0; i < n / QK_K; i++) {
        const float *x = src + i * QK_K;
        for (int j = 0; j < 16; j++) s[j] = fit_scale_min(x + 16 * j, 16, 3, 10, 0.1f, &m[j]);
        y[i].d = quantize_subscales_unsigned(s, 16, 15, sc);
        y[i].dmin = quantize_subscales_unsigned(m, 16, 15, mn);
        const float d = st_f16_to_f32(y[i].d), dmin = st_f16_to_f32(y[i].dmin);
        for (int j = 0; j < 16; j++) {
            y[i].scales[j] = (uint8_t)(sc[j] | (mn[j] << 4));
            codes_affine(x + 16 * j, 16, d * (float)sc[j], dmin * (float)mn[j], 3, q + 16 * j);
        }
        /* weight 128h + 32s + l sits in bits 2s of qs[32h + l] */
        memset(y[i].qs, 0, sizeof(y[i].qs));
        for (int w = 0; w < QK_K; w++) y[i].qs[32 * (w / 128) + w % 32] |= (uint8_t)(q[w] << (2 * ((w % 128) / 32)));
    }
}

/* ---- Q3_K: 16 x 16 weights, w = d*sc*q, q -4..3, sc 6-bit signed ---- */
void qt_quantize_q3_k(const float *src, void *dst, int64_t n) {
    block_q3_K *y = dst;
    float s[16];
    int8_t sc[16];
    uint8_t q[QK_K];
    for (int64_t i = 0; i < n / QK_K; i++) {
        const float *x = src + i * QK_K;
        for (int j = 0; j < 16; j++) s[j] = fit_scale_sym(x + 16 * j, 16, -4, 3, 9, 0.1f);
        y[i].d = quantize_subscales_signed(s, 16, -32, 31, sc);
        const float d = st_f16_to_f32(y[i].d);
        memset(y[i].scales, 0, sizeof(y[i].scales));
        for (int j = 0; j < 16; j++) {
            const int u = sc[j] + 32; /* stored unsigned 6-bit */
            y[i].scales[j % 8] |= (uint8_t)((u & 0x0f) << (4 * (j / 8)));
            y[i].scales[8 + j % 4] |= (uint8_t)((u >> 4) << (2 * (j / 4)));
            codes_sym(x + 16 * j, 16, d * (float)sc[j], -4, 3, q + 16 * j); /* q + 4 in 0..7 */
        }
        memset(y[i].hmask, 0, sizeof(y[i].hmask));
        memset(y[i].qs, 0, sizeof(y[i].qs));
        for (int w = 0; w < QK_K; w++) {
            /* code c = q + 4: c >= 4 means q >= 0, stored as hmask bit set and low bits q;
             * c < 4 means q < 0, hmask clear (the -4 offset applies) and low bits q + 4 = c */
            const int c = q[w];
            if (c >= 4) y[i].hmask[w % 32] |= (uint8_t)(1u << (w / 32));
            y[i].qs[32 * (w / 128) + w % 32] |= (uint8_t)((c & 3) << (2 * ((w % 128) / 32)));
        }
    }
}

/* Q4_K/Q5_K: pack 8 6-bit scales and 8 6-bit mins into 12 bytes (the
 * inverse of qt_get_scale_min_k4). */
static void pack_scale_min_k4(const uint8_t *sc, const uint8_t *mn, uint8_t *q) {
    for (int j = 0; j < 4; j++) {
        q[j] = (uint8_t)(sc[j] | ((sc[j + 4] >> 4) << 6));
        q[j + 4] = (uint8_t)(mn[j] | ((mn[j + 4] >> 4) << 6));
        q[j + 8] = (uint8_t)((sc[j + 4] & 0x0f) | ((mn[j + 4] & 0x0f) << 4));
    }
}

/* Shared by Q4_K and Q5_K: sub-block fits, 6-bit scales/mins, codes 0..nmax. */
static void quantize_k4_common(const float *x, int nmax, int ncand, float step, uint16_t *dh, uint16_t *dminh,
                               uint8_t *scales, uint8_t *q) {
    float s[8], m[8];
    uint8_t sc[8], mn[8];
    for (int j = 0; j < 8; j++) s[j] = fit_scale_min(x + 32 * j, 32, nmax, ncand, step, &m[j]);
    *dh = quantize_subscales_unsigned(s, 8, 63, sc);
    *dminh = quantize_subscales_unsigned(m, 8, 63, mn);
    pack_scale_min_k4(sc, mn, scales);
    const float d = st_f16_to_f32(*dh), dmin = st_f16_to_f32(*dminh);
    for (int j = 0; j < 8; j++) codes_affine(x + 32 * j, 32, d * (float)sc[j], dmin * (float)mn[j], nmax, q + 32 * j);
}

/* ---- Q4_K: 8 x 32 weights, w = d*sc*q - dmin*m, q 0..15 ---- */
void qt_quantize_q4_k(const float *src, void *dst, int64_t n) {
    block_q4_K *y = dst;
    uint8_t q[QK_K];
    for (int64_t i = 0; i < n / QK_K; i++) {
        quantize_k4_common(src + i * QK_K, 15, 5, 0.3f, &y[i].d, &y[i].dmin, y[i].scales, q);
        /* per 64 weights: low nibbles the first sub-block, high nibbles the second */
        for (int c = 0; c < 4; c++)
            for (int l = 0; l < 32; l++) y[i].qs[32 * c + l] = (uint8_t)(q[64 * c + l] | (q[64 * c + 32 + l] << 4));
    }
}

/* ---- Q5_K: as Q4_K with q 0..31, bit 4 of sub-block j's weight l in bit j of qh[l] ---- */
void qt_quantize_q5_k(const float *src, void *dst, int64_t n) {
    block_q5_K *y = dst;
    uint8_t q[QK_K];
    for (int64_t i = 0; i < n / QK_K; i++) {
        quantize_k4_common(src + i * QK_K, 31, 4, 0.5f, &y[i].d, &y[i].dmin, y[i].scales, q);
        memset(y[i].qh, 0, sizeof(y[i].qh));
        for (int w = 0; w < QK_K; w++) y[i].qh[w % 32] |= (uint8_t)(((q[w] >> 4) & 1) << (w / 32));
        for (int c = 0; c < 4; c++)
            for (int l = 0; l < 32; l++)
                y[i].qs[32 * c + l] = (uint8_t)((q[64 * c + l] & 0x0f) | ((q[64 * c + 32 + l] & 0x0f) << 4));
    }
}

/* ---- Q6_K: 16 x 16 weights, w = d*sc*(q-32), q 0..63, sc int8 ---- */
void qt_quantize_q6_k(const float *src, void *dst, int64_t n) {
    block_q6_K *y = dst;
    float s[16];
    uint8_t q[QK_K];
    for (int64_t i = 0; i < n / QK_K; i++) {
        const float *x = src + i * QK_K;
        for (int j = 0; j < 16; j++) s[j] = fit_scale_sym(x + 16 * j, 16, -32, 31, 2, 0.5f);
        y[i].d = quantize_subscales_signed(s, 16, -128, 127, y[i].scales);
        const float d = st_f16_to_f32(y[i].d);
        for (int j = 0; j < 16; j++) codes_sym(x + 16 * j, 16, d * (float)y[i].scales[j], -32, 31, q + 16 * j);
        /* weight 128h + 32s + l: low nibble in ql[64h + 32(s%2) + l] (high half if s >= 2),
         * top 2 bits at bits 2s of qh[32h + l] */
        memset(y[i].qh, 0, sizeof(y[i].qh));
        for (int h = 0; h < 2; h++)
            for (int l = 0; l < 32; l++) {
                const uint8_t *qq = q + 128 * h + l;
                y[i].ql[64 * h + l] = (uint8_t)((qq[0] & 0x0f) | ((qq[64] & 0x0f) << 4));
                y[i].ql[64 * h + 32 + l] = (uint8_t)((qq[32] & 0x0f) | ((qq[96] & 0x0f) << 4));
                y[i].qh[32 * h + l] =
                    (uint8_t)((qq[0] >> 4) | ((qq[32] >> 4) << 2) | ((qq[64] >> 4) << 4) | ((qq[96] >> 4) << 6));
            }
    }
}
