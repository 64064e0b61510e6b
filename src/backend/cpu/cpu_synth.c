/* Random but valid quantized blocks, fast (see cpu_fill_random_blocks in
 * cpu_ops.h). Benchmarks need hundreds of MiB of weights and tests need every
 * format, including those without a quantizer here; running a real quantizer
 * would take longer than the benchmark itself. Quant bits can be any value in
 * every format (grid indices span their whole grids), so only the scale
 * fields need care: random bytes there would give infinities and NaNs.
 */
#include "backend/cpu/cpu_ops.h"

#include "core/fp16.h"
#include "core/log.h"
#include "quant/quant.h"

#include <stddef.h>
#include <string.h>

static inline uint64_t rng_next(uint64_t *s) {
    /* splitmix64: one multiply-xorshift chain per 8 bytes, good enough bits */
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* uniform in [lo, hi) */
static inline float rng_uniform(uint64_t *s, float lo, float hi) {
    return lo + (hi - lo) * (float)(rng_next(s) >> 40) * (1.0f / 16777216.0f);
}

static void put_f16(uint8_t *p, float v) {
    uint16_t h = st_f32_to_f16(v);
    memcpy(p, &h, 2);
}

/* Scale of a block: positive, within a factor 4, so that a dequantized
 * weight (scale * sub-scale * quant) stays around a few units at most. */
static float block_scale(uint64_t *s, float base) { return rng_uniform(s, base, 4.0f * base); }

int cpu_fill_random_blocks(qt_type type, void *dst, int64_t n_blocks, uint64_t seed) {
    const qt_traits *tr = qt_get(type);
    if (!tr || n_blocks < 0) {
        st_error_set("cpu_fill_random_blocks: unknown type %d", (int)type);
        return -1;
    }
    uint8_t *p = dst;
    const size_t bs = (size_t)tr->type_size;
    uint64_t s = seed * 0x2545f4914f6cdd1dull + 1;

    if (type == QT_F32 || type == QT_F16 || type == QT_BF16) {
        int64_t n = n_blocks * tr->blck;
        for (int64_t i = 0; i < n; i++) {
            float v = rng_uniform(&s, -1.0f, 1.0f);
            if (type == QT_F32) memcpy(p + 4 * i, &v, 4);
            else {
                uint16_t h = type == QT_F16 ? st_f32_to_f16(v) : st_f32_to_bf16(v);
                memcpy(p + 2 * i, &h, 2);
            }
        }
        return 0;
    }

    /* Offsets of the f16 scale and min fields (-1: none) and the scale's base
     * size, from each format's largest quant times sub-scale product. */
    int off_d = 0, off_m = -1;
    float base = 1.0f / 64;
    switch (type) {
    case QT_Q4_0:
    case QT_Q5_0:
    case QT_IQ4_NL: base = 1.0f / 64; break;
    case QT_Q8_0: base = 1.0f / 512; break;
    case QT_Q4_1:
    case QT_Q5_1:
        off_m = 2;
        base = 1.0f / 64;
        break;
    case QT_Q2_K:
        off_d = offsetof(block_q2_K, d);
        off_m = offsetof(block_q2_K, dmin);
        base = 1.0f / 256;
        break;
    case QT_Q3_K:
        off_d = offsetof(block_q3_K, d);
        base = 1.0f / 1024;
        break;
    case QT_Q4_K:
    case QT_Q5_K:
        off_m = 2;
        base = 1.0f / 2048;
        break;
    case QT_Q6_K:
        off_d = offsetof(block_q6_K, d);
        base = 1.0f / 8192;
        break;
    case QT_IQ2_XXS:
    case QT_IQ2_XS:
    case QT_IQ2_S:
    case QT_IQ3_XXS:
    case QT_IQ3_S: base = 1.0f / 256; break;
    case QT_IQ1_S: base = 1.0f / 64; break;
    case QT_IQ4_XS: base = 1.0f / 4096; break;
    case QT_IQ1_M:
        off_d = -1;
        base = 1.0f / 64;
        break;
    case QT_MXFP4: off_d = -1; break;
    default: st_error_set("cpu_fill_random_blocks: cannot fill type %s", tr->name); return -1;
    }

    /* random bits everywhere, 8 bytes at a time */
    size_t total = (size_t)n_blocks * bs, i = 0;
    for (; i + 8 <= total; i += 8) {
        uint64_t r = rng_next(&s);
        memcpy(p + i, &r, 8);
    }
    if (i < total) {
        uint64_t r = rng_next(&s);
        memcpy(p + i, &r, total - i);
    }

    for (int64_t b = 0; b < n_blocks; b++) {
        uint8_t *blk = p + (size_t)b * bs;
        if (off_d >= 0) put_f16(blk + off_d, block_scale(&s, base));
        if (off_m >= 0) put_f16(blk + off_m, block_scale(&s, base));
        if (type == QT_IQ1_M) {
            /* the f16 super-scale is spread over the top nibbles of the four
             * 16-bit words of scales[] */
            uint16_t h = st_f32_to_f16(block_scale(&s, base)), w[4];
            memcpy(w, ((block_iq1_m *)blk)->scales, 8);
            for (int k = 0; k < 4; k++) w[k] = (uint16_t)((w[k] & 0x0fff) | (((h >> (4 * k)) & 0xf) << 12));
            memcpy(((block_iq1_m *)blk)->scales, w, 8);
        } else if (type == QT_MXFP4) {
            /* E8M0 exponent: 2^(e-127) around 1/16 .. 1 */
            ((block_mxfp4 *)blk)->e = (uint8_t)(119 + rng_next(&s) % 8);
        }
    }
    return 0;
}
