/* Test helpers for the quant tests: a deterministic random source and a filler
 * of random but VALID weight blocks for every format.
 *
 * "Valid" means: quant and index bytes fully random (every lattice index and
 * sign pattern is legal in these formats), but every scale field a finite,
 * moderate, normal value, so the dot products are compared on numbers a real
 * file holds rather than on inf/NaN/subnormal scales.
 *   - f16 scale fields (d, dmin, m): +-[0.5, 2) * 2^k, k in [-8, -3]
 *   - MXFP4's E8M0 exponent: 2^(e-127) within 2^-7 .. 2^7
 *   - IQ1_M's f16 super-scale, spread over the top nibbles of its 4 scale words
 *   - F32/F16/BF16 weights: Gaussian values
 * Header-only (static functions) so each test executable takes what it uses.
 */
#ifndef STRATA_TESTS_QT_TESTUTIL_H
#define STRATA_TESTS_QT_TESTUTIL_H

#include <math.h>
#include <stdint.h>
#include <string.h>

#include "core/fp16.h"
#include "quant/quant.h"

typedef struct {
    uint64_t s;
} qtt_rng;

static inline uint64_t qtt_next(qtt_rng *r) {
    /* xorshift64* */
    r->s ^= r->s >> 12;
    r->s ^= r->s << 25;
    r->s ^= r->s >> 27;
    return r->s * 0x2545f4914f6cdd1dULL;
}

/* uniform in [0, 1) */
static inline double qtt_uniform(qtt_rng *r) { return (double)(qtt_next(r) >> 11) * (1.0 / 9007199254740992.0); }

static inline float qtt_gauss(qtt_rng *r) {
    double u1 = qtt_uniform(r), u2 = qtt_uniform(r);
    if (u1 < 1e-300) u1 = 1e-300;
    return (float)(sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2));
}

/* A finite, normal, moderate f16 of random sign. */
static inline uint16_t qtt_scale_f16(qtt_rng *r) {
    float m = 0.5f + 1.5f * (float)qtt_uniform(r);
    int k = -8 + (int)(qtt_next(r) % 6);
    float v = ldexpf(m, k);
    return st_f32_to_f16((qtt_next(r) & 1) ? -v : v);
}

static inline void qtt_put16(void *p, uint16_t v) { memcpy(p, &v, 2); }

/* Fill nb blocks of type t at dst with random valid contents. */
static inline void qtt_fill_blocks(qt_type t, void *dst, int64_t nb, qtt_rng *r) {
    const qt_traits *tr = qt_get(t);
    const size_t bs = (size_t)tr->type_size;
    uint8_t *p = dst;
    if (t == QT_F32 || t == QT_F16 || t == QT_BF16) {
        for (int64_t i = 0; i < nb; i++) {
            float v = qtt_gauss(r);
            if (t == QT_F32) memcpy(p + 4 * i, &v, 4);
            else qtt_put16(p + 2 * i, t == QT_F16 ? st_f32_to_f16(v) : st_f32_to_bf16(v));
        }
        return;
    }
    for (size_t i = 0; i < (size_t)nb * bs; i++) p[i] = (uint8_t)(qtt_next(r) >> 56);
    for (int64_t ib = 0; ib < nb; ib++, p += bs) {
        switch (t) {
        case QT_Q4_1:
        case QT_Q5_1:
            qtt_put16(p + 2, qtt_scale_f16(r)); /* m, then d below */
            qtt_put16(p, qtt_scale_f16(r));
            break;
        case QT_Q4_K:
        case QT_Q5_K:
            qtt_put16(p + 2, qtt_scale_f16(r)); /* dmin */
            qtt_put16(p, qtt_scale_f16(r));
            break;
        case QT_Q2_K:
            qtt_put16(p + offsetof(block_q2_K, d), qtt_scale_f16(r));
            qtt_put16(p + offsetof(block_q2_K, dmin), qtt_scale_f16(r));
            break;
        case QT_Q3_K: qtt_put16(p + offsetof(block_q3_K, d), qtt_scale_f16(r)); break;
        case QT_Q6_K: qtt_put16(p + offsetof(block_q6_K, d), qtt_scale_f16(r)); break;
        case QT_MXFP4: p[0] = (uint8_t)(120 + qtt_next(r) % 15); break;
        case QT_IQ1_M: {
            /* the f16 super-scale's 4 nibbles sit in bits 12..15 of the 4 scale words */
            uint16_t d = qtt_scale_f16(r), sc[4];
            memcpy(sc, p + offsetof(block_iq1_m, scales), 8);
            for (int k = 0; k < 4; k++) sc[k] = (uint16_t)((sc[k] & 0x0fff) | (((d >> (4 * k)) & 0xf) << 12));
            memcpy(p + offsetof(block_iq1_m, scales), sc, 8);
            break;
        }
        case QT_Q8_K: {
            float d = ldexpf(1.0f, -7);
            memcpy(p, &d, 4);
            break;
        }
        default:
            /* every other block format starts with its f16 super-scale d */
            qtt_put16(p, qtt_scale_f16(r));
            break;
        }
    }
}

#endif
