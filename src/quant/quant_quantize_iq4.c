/* Reference quantizers from f32, part 5: the non-linear 4-bit formats IQ4_NL
 * (32 weights, f16 scale) and IQ4_XS (256 weights, f16 super-scale and eight
 * 6-bit signed sub-scales). A weight decodes to scale * kvalues_iq4nl[code].
 *
 * Method (ours, in the spirit of ggml's): per 32 weights, candidate scales map
 * the largest-magnitude weight to a level near either end of the table
 * (-127 + k or 113 + k, k = -7..7); each candidate assigns the nearest level
 * per weight, then the scale is refit by least squares, and the best fit wins
 * (error = sum x^2 - (sum x*v)^2 / sum v^2). The final codes are the nearest
 * levels at the *decoded* scale (f16 for IQ4_NL; f16 d times the 6-bit code
 * for IQ4_XS, where each sub-block also tries the neighbouring codes).
 */
#include <math.h>
#include <string.h>

#include "core/fp16.h"
#include "quant/iq_tables.h"
#include "quant/quant_impl.h"
#include "quant/quant_quantize_util.h"

/* kvalues_iq4nl as floats (ascending), built per call on the stack so the
 * quantizers keep no shared state. */
static void kv_init(float *kv_f) {
    for (int k = 0; k < 16; k++) kv_f[k] = (float)kvalues_iq4nl[k];
}

/* Codes of 32 weights at scale d; returns the squared error. */
static float codes_at(const float *kv_f, const float *x, float d, uint8_t *q) {
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    float err = 0.0f;
    for (int j = 0; j < 32; j++) {
        q[j] = (uint8_t)qq_nearest_sorted(kv_f, 16, x[j] * id);
        const float r = x[j] - d * kv_f[q[j]];
        err += r * r;
    }
    return err;
}

/* Best float scale of 32 weights (0 for all zeros). */
static float best_scale_nl(const float *kv_f, const float *x) {
    float amax = 0.0f, max = 0.0f;
    for (int j = 0; j < 32; j++) {
        if (qq_absf(x[j]) > amax) {
            amax = qq_absf(x[j]);
            max = x[j];
        }
    }
    if (amax == 0.0f) return 0.0f;
    float best_s = max / kv_f[0], best_score = -1.0f;
    for (int end = 0; end < 2; end++) {
        for (int k = -7; k <= 7; k++) {
            const float lvl = (end == 0 ? kv_f[0] : kv_f[15]) + (float)k;
            const float id = lvl / max;
            float sxv = 0.0f, svv = 0.0f;
            for (int j = 0; j < 32; j++) {
                const float v = kv_f[qq_nearest_sorted(kv_f, 16, x[j] * id)];
                sxv += x[j] * v;
                svv += v * v;
            }
            if (svv == 0.0f) continue;
            const float score = sxv * sxv / svv; /* error = sum x^2 - score */
            if (score > best_score) {
                best_score = score;
                best_s = sxv / svv;
            }
        }
    }
    return best_s;
}

void qt_quantize_iq4_nl(const float *src, void *dst, int64_t n) {
    block_iq4_nl *y = dst;
    uint8_t q[32];
    float kv_f[16];
    kv_init(kv_f);
    for (int64_t i = 0; i < n / QK4_NL; i++) {
        const float *x = src + i * QK4_NL;
        y[i].d = st_f32_to_f16(best_scale_nl(kv_f, x));
        codes_at(kv_f, x, st_f16_to_f32(y[i].d), q);
        for (int j = 0; j < 16; j++) y[i].qs[j] = (uint8_t)(q[j] | (q[j + 16] << 4));
    }
}

void qt_quantize_iq4_xs(const float *src, void *dst, int64_t n) {
    block_iq4_xs *y = dst;
    uint8_t q[32], tq[32];
    float s[8];
    float kv_f[16];
    kv_init(kv_f);
    for (int64_t i = 0; i < n / QK_K; i++) {
        const float *x = src + i * QK_K;
        float amax = 0.0f, max = 0.0f;
        for (int ib = 0; ib < 8; ib++) {
            s[ib] = best_scale_nl(kv_f, x + 32 * ib);
            if (qq_absf(s[ib]) > amax) {
                amax = qq_absf(s[ib]);
                max = s[ib];
            }
        }
        /* the sub-scale of largest magnitude gets code -32 (the extra negative one) */
        y[i].d = st_f32_to_f16(max / -32.0f);
        const float d = st_f16_to_f32(y[i].d);
        const float id = d != 0.0f ? 1.0f / d : 0.0f;
        y[i].scales_h = 0;
        memset(y[i].scales_l, 0, sizeof(y[i].scales_l));
        for (int ib = 0; ib < 8; ib++) {
            const int l0 = qq_round_clamp(s[ib] * id, -32, 31);
            int lbest = l0;
            float best_e = INFINITY;
            for (int l = l0 - 1; l <= l0 + 1; l++) {
                if (l < -32 || l > 31) continue;
                const float e = codes_at(kv_f, x + 32 * ib, d * (float)l, tq);
                if (!(e >= best_e)) { /* first candidate always taken */
                    best_e = e;
                    lbest = l;
                    memcpy(q, tq, 32);
                }
            }
            const int u = lbest + 32;
            y[i].scales_l[ib / 2] |= (uint8_t)((u & 0xf) << (4 * (ib % 2)));
            y[i].scales_h |= (uint16_t)(((u >> 4) & 3) << (2 * ib));
            for (int j = 0; j < 16; j++) y[i].qs[16 * ib + j] = (uint8_t)(q[j] | (q[j + 16] << 4));
        }
    }
}
