/* Reference (scalar) dequantizers, part 2: the i-quants (lattice codebooks,
 * grids in iq_tables.h), IQ4_NL/IQ4_XS (non-linear levels) and MXFP4.
 *
 * As in quant_ref_k.c, every value is rounded where gguf/quants.py rounds, so
 * the results equal the gguf package's bit for bit: the per-group scale is one
 * f32 value (for example (d * (0.5 + s)) * 0.25), multiplied by the grid
 * value; a sign only negates, which is exact.
 *
 * Grid rows are packed one value per byte (element j in byte j), so a row is
 * read by shifting the 64- or 32-bit entry.
 */
#include <string.h>

#include "core/fp16.h"
#include "quant/iq_tables.h"
#include "quant/quant_impl.h"

/* Byte j of a packed grid row. */
static inline int grid_u8(uint64_t row, int j) { return (int)((row >> (8 * j)) & 0xFF); }
static inline int grid_i8(uint64_t row, int j) { return (int)(int8_t)((row >> (8 * j)) & 0xFF); }

/* Writes 8 weights: scale * grid value, negated where the sign byte has bit j. */
static inline void put8_signed(float *y, float db, uint64_t row, uint8_t signs) {
    for (int j = 0; j < 8; j++) {
        const float v = db * (float)grid_u8(row, j);
        y[j] = (signs & kmask_iq2xs[j]) ? -v : v;
    }
}

/* Per 32 weights two uint32: aux0 = 4 grid indices (one per 8 weights),
 * aux1 = 4 x 7 sign bits (expanded by ksigns_iq2xs) + a 4-bit scale on top.
 * w = (d * (0.5 + s)) * 0.25 * grid. */
void qt_dequant_iq2_xxs(const void *src, float *dst, int64_t n) {
    const block_iq2_xxs *b = src;
    for (int64_t i = 0; i < n / QK_K; i++, b++) {
        const float d = st_f16_to_f32(b->d);
        for (int ib = 0; ib < QK_K / 32; ib++, dst += 32) {
            uint32_t aux[2];
            memcpy(aux, b->qs + 4 * ib, 8);
            const float db = d * (0.5f + (float)(aux[1] >> 28)) * 0.25f;
            for (int l = 0; l < 4; l++) {
                const uint8_t idx = (uint8_t)(aux[0] >> (8 * l));
                put8_signed(dst + 8 * l, db, iq2xxs_grid[idx], ksigns_iq2xs[(aux[1] >> (7 * l)) & 127]);
            }
        }
    }
}

/* Per 8 weights one uint16: 9-bit grid index + 7 sign bits. One 4-bit scale
 * per 16 weights (scales[ib] low nibble: first 16 of the 32, high: last 16). */
void qt_dequant_iq2_xs(const void *src, float *dst, int64_t n) {
    const block_iq2_xs *b = src;
    for (int64_t i = 0; i < n / QK_K; i++, b++) {
        const float d = st_f16_to_f32(b->d);
        for (int g = 0; g < QK_K / 8; g++, dst += 8) {
            const int sb = g / 2; /* 16-weight sub-block */
            const int s = (b->scales[sb / 2] >> (4 * (sb % 2))) & 0xF;
            const float db = d * (0.5f + (float)s) * 0.25f;
            const uint16_t q = b->qs[g];
            put8_signed(dst, db, iq2xs_grid[q & 511], ksigns_iq2xs[q >> 9]);
        }
    }
}

/* qs[0..31]: low 8 bits of the 10-bit grid index per 8 weights; qs[32..63]:
 * one explicit sign byte per 8 weights; qh[ib] bits 2k..2k+1: high index
 * bits of group 4*ib + k. Scales as IQ2_XS (per 16 weights). */
void qt_dequant_iq2_s(const void *src, float *dst, int64_t n) {
    const block_iq2_s *b = src;
    for (int64_t i = 0; i < n / QK_K; i++, b++) {
        const float d = st_f16_to_f32(b->d);
        const uint8_t *signs = b->qs + QK_K / 8;
        for (int g = 0; g < QK_K / 8; g++, dst += 8) {
            const int sb = g / 2;
            const int s = (b->scales[sb / 2] >> (4 * (sb % 2))) & 0xF;
            const float db = d * (0.5f + (float)s) * 0.25f;
            const int idx = b->qs[g] | (((b->qh[g / 4] >> (2 * (g % 4))) & 3) << 8);
            put8_signed(dst, db, iq2s_grid[idx], signs[g]);
        }
    }
}

/* qs[0..63]: grid index per 4 weights; then per 32 weights a uint32 of
 * 4 x 7 sign bits + 4-bit scale. w = (d * (0.5 + s)) * 0.5 * grid. */
void qt_dequant_iq3_xxs(const void *src, float *dst, int64_t n) {
    const block_iq3_xxs *b = src;
    for (int64_t i = 0; i < n / QK_K; i++, b++) {
        const float d = st_f16_to_f32(b->d);
        const uint8_t *grid_idx = b->qs;
        const uint8_t *scale_signs = b->qs + QK_K / 4;
        for (int ib = 0; ib < QK_K / 32; ib++) {
            uint32_t aux;
            memcpy(&aux, scale_signs + 4 * ib, 4);
            const float db = d * (0.5f + (float)(aux >> 28)) * 0.5f;
            for (int l = 0; l < 4; l++, dst += 8) {
                const uint8_t signs = ksigns_iq2xs[(aux >> (7 * l)) & 127];
                const uint64_t row = (uint64_t)iq3xxs_grid[grid_idx[8 * ib + 2 * l]] |
                                     ((uint64_t)iq3xxs_grid[grid_idx[8 * ib + 2 * l + 1]] << 32);
                put8_signed(dst, db, row, signs);
            }
        }
    }
}

/* qs[k] | (bit k of qh) << 8: 9-bit grid index per 4 weights; one explicit
 * sign byte per 8 weights; 4-bit scale per 32 weights (two per byte).
 * w = d * (1 + 2s) * grid. */
void qt_dequant_iq3_s(const void *src, float *dst, int64_t n) {
    const block_iq3_s *b = src;
    for (int64_t i = 0; i < n / QK_K; i++, b++) {
        const float d = st_f16_to_f32(b->d);
        for (int ib = 0; ib < QK_K / 32; ib++) {
            const int s = (b->scales[ib / 2] >> (4 * (ib % 2))) & 0xF;
            const float db = d * (float)(1 + 2 * s);
            for (int l = 0; l < 4; l++, dst += 8) {
                const int k0 = 8 * ib + 2 * l, k1 = k0 + 1; /* the two 4-weight grid rows */
                const int i0 = b->qs[k0] | (((b->qh[k0 / 8] >> (k0 % 8)) & 1) << 8);
                const int i1 = b->qs[k1] | (((b->qh[k1 / 8] >> (k1 % 8)) & 1) << 8);
                const uint64_t row = (uint64_t)iq3s_grid[i0] | ((uint64_t)iq3s_grid[i1] << 32);
                put8_signed(dst, db, row, b->signs[4 * ib + l]);
            }
        }
    }
}

/* Per 32 weights qh[ib]: 4 x 3 high index bits, a 3-bit scale (bits 12..14)
 * and the delta sign (bit 15). w = d * (2s + 1) * (grid + delta), grid in {-1,0,1}. */
void qt_dequant_iq1_s(const void *src, float *dst, int64_t n) {
    const block_iq1_s *b = src;
    for (int64_t i = 0; i < n / QK_K; i++, b++) {
        const float d = st_f16_to_f32(b->d);
        for (int ib = 0; ib < QK_K / 32; ib++) {
            const uint16_t qh = b->qh[ib];
            const float dl = d * (float)(2 * ((qh >> 12) & 7) + 1);
            const float delta = (qh & 0x8000) ? -IQ1S_DELTA : IQ1S_DELTA;
            for (int l = 0; l < 4; l++, dst += 8) {
                const int idx = b->qs[4 * ib + l] | (((qh >> (3 * l)) & 7) << 8);
                const uint64_t row = iq1s_grid[idx];
                for (int j = 0; j < 8; j++) dst[j] = dl * ((float)grid_i8(row, j) + delta);
            }
        }
    }
}

/* No separate d: the f16 super-scale's 4 nibbles are the top nibbles of the
 * four little-endian uint16 words of scales (word 0 = lowest nibble). Each
 * word also holds four 3-bit scales, one per 16 weights. Per 8 weights a qh
 * nibble: 3 high index bits + delta sign (bit 3). */
void qt_dequant_iq1_m(const void *src, float *dst, int64_t n) {
    const block_iq1_m *b = src;
    for (int64_t i = 0; i < n / QK_K; i++, b++) {
        uint16_t sc[4];
        memcpy(sc, b->scales, 8);
        const uint16_t dbits =
            (uint16_t)((sc[0] >> 12) | ((sc[1] >> 8) & 0x00F0) | ((sc[2] >> 4) & 0x0F00) | (sc[3] & 0xF000));
        const float d = st_f16_to_f32(dbits);
        for (int g = 0; g < QK_K / 8; g++, dst += 8) {
            const int t = g / 2; /* 16-weight sub-block */
            const int s = (sc[t / 4] >> (3 * (t % 4))) & 7;
            const float dl = d * (float)(2 * s + 1);
            const int nib = (b->qh[g / 2] >> (4 * (g % 2))) & 0xF;
            const int idx = b->qs[g] | ((nib & 7) << 8);
            const float delta = (nib & 8) ? -IQ1M_DELTA : IQ1M_DELTA;
            const uint64_t row = iq1s_grid[idx];
            for (int j = 0; j < 8; j++) dst[j] = dl * ((float)grid_i8(row, j) + delta);
        }
    }
}

/* 4-bit indices into kvalues_iq4nl; low nibbles weights 0..15. */
void qt_dequant_iq4_nl(const void *src, float *dst, int64_t n) {
    const block_iq4_nl *b = src;
    for (int64_t i = 0; i < n / QK4_NL; i++, b++, dst += QK4_NL) {
        const float d = st_f16_to_f32(b->d);
        for (int j = 0; j < QK4_NL / 2; j++) {
            dst[j] = d * (float)kvalues_iq4nl[b->qs[j] & 0xF];
            dst[j + QK4_NL / 2] = d * (float)kvalues_iq4nl[b->qs[j] >> 4];
        }
    }
}

/* 8 sub-blocks of 32 weights laid out as IQ4_NL blocks; 6-bit scale minus 32:
 * low 4 bits from scales_l (two per byte), high 2 bits from scales_h bits 2ib. */
void qt_dequant_iq4_xs(const void *src, float *dst, int64_t n) {
    const block_iq4_xs *b = src;
    for (int64_t i = 0; i < n / QK_K; i++, b++) {
        const float d = st_f16_to_f32(b->d);
        for (int ib = 0; ib < QK_K / 32; ib++, dst += 32) {
            const int lo = (b->scales_l[ib / 2] >> (4 * (ib % 2))) & 0xF;
            const int hi = (b->scales_h >> (2 * ib)) & 3;
            const float dl = d * (float)((lo | (hi << 4)) - 32);
            const uint8_t *q = b->qs + 16 * ib;
            for (int j = 0; j < 16; j++) {
                dst[j] = dl * (float)kvalues_iq4nl[q[j] & 0xF];
                dst[j + 16] = dl * (float)kvalues_iq4nl[q[j] >> 4];
            }
        }
    }
}

/* E8M0 block exponent, 32 E2M1 codes (low nibbles weights 0..15). The table
 * holds doubled values, the scale is halved: w = 2^(e-128) * kvalues_mxfp4[q]. */
void qt_dequant_mxfp4(const void *src, float *dst, int64_t n) {
    const block_mxfp4 *b = src;
    for (int64_t i = 0; i < n / QK_MXFP4; i++, b++, dst += QK_MXFP4) {
        const float d = qt_e8m0_to_f32_half(b->e);
        for (int j = 0; j < QK_MXFP4 / 2; j++) {
            dst[j] = d * (float)kvalues_mxfp4[b->qs[j] & 0xF];
            dst[j + QK_MXFP4 / 2] = d * (float)kvalues_mxfp4[b->qs[j] >> 4];
        }
    }
}
