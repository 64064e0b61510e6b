/* Quant block layouts, shared by the C code and the CUDA/HIP kernels.
 *
 * Every layout is byte-for-byte the one GGUF files use (the ggml formats), and
 * type ids equal GGUF's ggml_type ids, so a tensor's bytes are read in place
 * from the mmap. Each struct's size is asserted; a change that breaks a layout
 * fails to compile. Half-precision fields are raw uint16_t bits (core/fp16.h
 * converts); nothing here depends on a compiler's half type.
 *
 * "super-block" formats (K-quants, IQ*) hold QK_K = 256 weights; the legacy
 * formats, IQ4_NL and MXFP4 hold 32.
 */
#ifndef STRATA_QUANT_BLOCKS_H
#define STRATA_QUANT_BLOCKS_H

#include <stdint.h>

#ifdef __cplusplus
#define QT_STATIC_ASSERT(c, m) static_assert(c, m)
#else
#define QT_STATIC_ASSERT(c, m) _Static_assert(c, m)
#endif

#define QK_K     256
#define QK4_0    32
#define QK4_1    32
#define QK5_0    32
#define QK5_1    32
#define QK8_0    32
#define QK8_1    32
#define QK4_NL   32
#define QK_MXFP4 32

/* GGUF / ggml type ids. Gaps are ids GGUF defines that Strata does not read. */
typedef enum {
    QT_F32 = 0,
    QT_F16 = 1,
    QT_Q4_0 = 2,
    QT_Q4_1 = 3,
    QT_Q5_0 = 6,
    QT_Q5_1 = 7,
    QT_Q8_0 = 8,
    QT_Q8_1 = 9,
    QT_Q2_K = 10,
    QT_Q3_K = 11,
    QT_Q4_K = 12,
    QT_Q5_K = 13,
    QT_Q6_K = 14,
    QT_Q8_K = 15,
    QT_IQ2_XXS = 16,
    QT_IQ2_XS = 17,
    QT_IQ3_XXS = 18,
    QT_IQ1_S = 19,
    QT_IQ4_NL = 20,
    QT_IQ3_S = 21,
    QT_IQ2_S = 22,
    QT_IQ4_XS = 23,
    QT_I8 = 24,
    QT_I16 = 25,
    QT_I32 = 26,
    QT_I64 = 27,
    QT_F64 = 28,
    QT_IQ1_M = 29,
    QT_BF16 = 30,
    QT_MXFP4 = 39,
    QT_COUNT = 40
} qt_type;

/* ---- legacy 32-weight blocks: w = d * q (+ m) ---- */
typedef struct {
    uint16_t d;            /* f16 scale */
    uint8_t qs[QK4_0 / 2]; /* 4-bit q, low nibbles = weights 0..15, high = 16..31; w = d*(q-8) */
} block_q4_0;
QT_STATIC_ASSERT(sizeof(block_q4_0) == 18, "block_q4_0");

typedef struct {
    uint16_t d, m; /* f16 scale and min; w = d*q + m */
    uint8_t qs[QK4_1 / 2];
} block_q4_1;
QT_STATIC_ASSERT(sizeof(block_q4_1) == 20, "block_q4_1");

typedef struct {
    uint16_t d;
    uint8_t qh[4];         /* 5th bit of each of the 32 weights */
    uint8_t qs[QK5_0 / 2]; /* w = d*(q-16) */
} block_q5_0;
QT_STATIC_ASSERT(sizeof(block_q5_0) == 22, "block_q5_0");

typedef struct {
    uint16_t d, m;
    uint8_t qh[4];
    uint8_t qs[QK5_1 / 2];
} block_q5_1;
QT_STATIC_ASSERT(sizeof(block_q5_1) == 24, "block_q5_1");

typedef struct {
    uint16_t d;
    int8_t qs[QK8_0];
} block_q8_0;
QT_STATIC_ASSERT(sizeof(block_q8_0) == 34, "block_q8_0");

typedef struct {
    uint16_t d; /* f16 scale */
    uint16_t s; /* f16 of d * sum(qs): lets Q4_1/Q5_1 dots add the min term at once */
    int8_t qs[QK8_1];
} block_q8_1;
QT_STATIC_ASSERT(sizeof(block_q8_1) == 36, "block_q8_1");

/* ---- K-quants: 256-weight super-blocks of 16 or 8 sub-blocks ---- */
typedef struct {
    uint8_t scales[QK_K / 16]; /* low nibble scale, high nibble min, per 16 weights */
    uint8_t qs[QK_K / 4];      /* 2-bit quants */
    uint16_t d, dmin;          /* f16 super-block scale for scales and for mins */
} block_q2_K;
QT_STATIC_ASSERT(sizeof(block_q2_K) == 84, "block_q2_K");

typedef struct {
    uint8_t hmask[QK_K / 8]; /* high bit of each quant (set = no -4 offset) */
    uint8_t qs[QK_K / 4];    /* low 2 bits */
    uint8_t scales[12];      /* 16 6-bit scales, packed */
    uint16_t d;
} block_q3_K;
QT_STATIC_ASSERT(sizeof(block_q3_K) == 110, "block_q3_K");

#define K_SCALE_SIZE 12
typedef struct {
    uint16_t d, dmin;
    uint8_t scales[K_SCALE_SIZE]; /* 8 6-bit scales and 8 6-bit mins, packed */
    uint8_t qs[QK_K / 2];
} block_q4_K;
QT_STATIC_ASSERT(sizeof(block_q4_K) == 144, "block_q4_K");

typedef struct {
    uint16_t d, dmin;
    uint8_t scales[K_SCALE_SIZE];
    uint8_t qh[QK_K / 8];
    uint8_t qs[QK_K / 2];
} block_q5_K;
QT_STATIC_ASSERT(sizeof(block_q5_K) == 176, "block_q5_K");

typedef struct {
    uint8_t ql[QK_K / 2];     /* low 4 bits */
    uint8_t qh[QK_K / 4];     /* high 2 bits */
    int8_t scales[QK_K / 16]; /* 8-bit scales per 16 weights */
    uint16_t d;
} block_q6_K;
QT_STATIC_ASSERT(sizeof(block_q6_K) == 210, "block_q6_K");

/* Activation format of the K-quant and IQ dots: f32 scale, int8 quants, and
 * the sums of each 16 quants (so that min/offset terms cost one multiply). */
typedef struct {
    float d;
    int8_t qs[QK_K];
    int16_t bsums[QK_K / 16];
} block_q8_K;
QT_STATIC_ASSERT(sizeof(block_q8_K) == 292, "block_q8_K");

/* ---- i-quants: lattice codebooks (grids in iq_tables.h) ---- */
typedef struct {
    uint16_t d;
    uint16_t qs[QK_K / 8]; /* per 32 weights: 4 grid bytes + 4x7 sign bits + 4-bit scale */
} block_iq2_xxs;
QT_STATIC_ASSERT(sizeof(block_iq2_xxs) == 66, "block_iq2_xxs");

typedef struct {
    uint16_t d;
    uint16_t qs[QK_K / 8];     /* 9-bit grid index + 7 sign bits */
    uint8_t scales[QK_K / 32]; /* two 4-bit scales per 32 weights */
} block_iq2_xs;
QT_STATIC_ASSERT(sizeof(block_iq2_xs) == 74, "block_iq2_xs");

typedef struct {
    uint16_t d;
    uint8_t qs[QK_K / 4];  /* first half: low 8 bits of grid index; second half: signs */
    uint8_t qh[QK_K / 32]; /* high 2 bits of the grid indices */
    uint8_t scales[QK_K / 32];
} block_iq2_s;
QT_STATIC_ASSERT(sizeof(block_iq2_s) == 82, "block_iq2_s");

typedef struct {
    uint16_t d;
    uint8_t qs[3 * QK_K / 8]; /* 64 grid bytes, then per 32 weights 4x7 sign bits + 4-bit scale */
} block_iq3_xxs;
QT_STATIC_ASSERT(sizeof(block_iq3_xxs) == 98, "block_iq3_xxs");

typedef struct {
    uint16_t d;
    uint8_t qs[QK_K / 4];
    uint8_t qh[QK_K / 32];
    uint8_t signs[QK_K / 8];
    uint8_t scales[QK_K / 64];
} block_iq3_s;
QT_STATIC_ASSERT(sizeof(block_iq3_s) == 110, "block_iq3_s");

typedef struct {
    uint16_t d;
    uint8_t qs[QK_K / 8];
    uint16_t qh[QK_K / 32]; /* high grid bits, 3-bit scale, delta sign */
} block_iq1_s;
QT_STATIC_ASSERT(sizeof(block_iq1_s) == 50, "block_iq1_s");

typedef struct {
    uint8_t qs[QK_K / 8];
    uint8_t qh[QK_K / 16];
    uint8_t scales[QK_K / 32]; /* 3-bit scales; the f16 super-scale is spread over their top nibbles */
} block_iq1_m;
QT_STATIC_ASSERT(sizeof(block_iq1_m) == 56, "block_iq1_m");

typedef struct {
    uint16_t d;
    uint8_t qs[QK4_NL / 2]; /* 4-bit indices into the non-linear table kvalues_iq4nl */
} block_iq4_nl;
QT_STATIC_ASSERT(sizeof(block_iq4_nl) == 18, "block_iq4_nl");

typedef struct {
    uint16_t d;
    uint16_t scales_h; /* high 2 bits of the 8 6-bit scales */
    uint8_t scales_l[QK_K / 64];
    uint8_t qs[QK_K / 2];
} block_iq4_xs;
QT_STATIC_ASSERT(sizeof(block_iq4_xs) == 136, "block_iq4_xs");

/* ---- MXFP4 (OCP microscaling): E8M0 shared exponent + 32 E2M1 values ---- */
typedef struct {
    uint8_t e;                /* E8M0 exponent */
    uint8_t qs[QK_MXFP4 / 2]; /* 4-bit E2M1 codes, low nibbles = weights 0..15 */
} block_mxfp4;
QT_STATIC_ASSERT(sizeof(block_mxfp4) == 17, "block_mxfp4");

#endif
