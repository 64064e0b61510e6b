/* Half-precision conversions, bit-exact and header-only so that every module
 * (and the CUDA host code) shares one definition.
 *
 * f16 -> f32 is exact. f32 -> f16 rounds to nearest even, like the F16C
 * instruction and numpy's astype(float16), including subnormals, inf and NaN.
 * bf16 -> f32 is a shift; f32 -> bf16 rounds to nearest even, NaN kept quiet
 * (the convention of the gguf package).
 */
#ifndef STRATA_CORE_FP16_H
#define STRATA_CORE_FP16_H

#include <stdint.h>
#include <string.h>

static inline float st_bits_to_f32(uint32_t u) {
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static inline uint32_t st_f32_to_bits(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}

static inline float st_f16_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000) << 16;
    uint32_t exp = (h >> 10) & 0x1f;
    uint32_t man = h & 0x3ff;
    if (exp == 0x1f) return st_bits_to_f32(sign | 0x7f800000u | (man << 13)); /* inf / NaN */
    if (exp == 0) {
        /* zero or subnormal: man * 2^-24, exact in f32 */
        float v = (float)man * (1.0f / 16777216.0f);
        return sign ? -v : v;
    }
    return st_bits_to_f32(sign | ((exp + 112) << 23) | (man << 13));
}

static inline uint16_t st_f32_to_f16(float f) {
    uint32_t x = st_f32_to_bits(f);
    uint32_t sign = (x >> 16) & 0x8000;
    uint32_t exp = (x >> 23) & 0xff;
    uint32_t man = x & 0x7fffff;
    if (exp == 0xff) return (uint16_t)(sign | 0x7c00 | (man ? 0x200 | (man >> 13) : 0));
    int32_t e = (int32_t)exp - 127 + 15;
    if (e >= 0x1f) return (uint16_t)(sign | 0x7c00); /* overflow -> inf */
    if (e <= 0) {
        /* subnormal half (or zero): shift the full mantissa, round to nearest even */
        if (e < -10) return (uint16_t)sign;
        man |= 0x800000;
        uint32_t shift = (uint32_t)(14 - e);
        uint32_t h = man >> shift;
        uint32_t rem = man & ((1u << shift) - 1);
        uint32_t half = 1u << (shift - 1);
        if (rem > half || (rem == half && (h & 1))) h++;
        return (uint16_t)(sign | h);
    }
    uint32_t h = ((uint32_t)e << 10) | (man >> 13);
    uint32_t rem = man & 0x1fff;
    if (rem > 0x1000 || (rem == 0x1000 && (h & 1))) h++; /* may carry into exp: correct */
    return (uint16_t)(sign | h);
}

static inline float st_bf16_to_f32(uint16_t h) { return st_bits_to_f32((uint32_t)h << 16); }

static inline uint16_t st_f32_to_bf16(float f) {
    uint32_t x = st_f32_to_bits(f);
    if ((x & 0x7fffffff) > 0x7f800000) return (uint16_t)((x >> 16) | 64); /* quiet NaN */
    return (uint16_t)((x + (0x7fff + ((x >> 16) & 1))) >> 16);
}

#endif
