/* Internal to quant/: byte loads and the sign expansion that the AVX2 and
 * AVX-512 i-quant dot products share. Include only from files built with
 * BMI2 (every *_avx2.c and *_avx512*.c file, cmake/isa.cmake). */
#ifndef STRATA_QUANT_DOT_IQ_BITS_H
#define STRATA_QUANT_DOT_IQ_BITS_H

#include <immintrin.h>
#include <stdint.h>
#include <string.h>

static inline uint32_t load_u32(const void *p) {
    uint32_t v;
    memcpy(&v, p, 4);
    return v;
}

static inline uint64_t load_u64(const void *p) {
    uint64_t v;
    memcpy(&v, p, 8);
    return v;
}

/* Eight 7-bit sign indices (bits 0..55) -> 64 sign bits, byte l = ksigns_iq2xs[index l]
 * (the parity rule): two sub-blocks at once. */
static inline uint64_t ksigns8(uint64_t packed) {
    uint64_t x = _pdep_u64(packed, 0x7f7f7f7f7f7f7f7fULL);
    uint64_t p = x ^ (x >> 4);
    p ^= p >> 2;
    p ^= p >> 1;
    return x | ((p & 0x0101010101010101ULL) << 7);
}

#endif
