/* AVX2 (+FMA, F16C) dot products of the "main" weight formats; compiled with
 * -mavx2 -mfma -mf16c and only called after cpuid says so (quant_dot.c).
 *
 * The integer core is vpmaddubsw: unsigned bytes x signed bytes, adjacent
 * pairs summed to int16. Both operands must keep pair sums below 2^15:
 *   - unsigned quants (Q4_K 0..15, Q6_K 0..63, Q5 0..31) x q8 in -127..127: fine;
 *   - signed x signed (Q8_0, IQ4_NL, MXFP4, Q4_0 after -8): |x| x sign(y, x),
 *     where |x| <= 128 as an unsigned byte (so even x = -128 is exact);
 * then vpmaddwd with ones or with the sub-block scales widens to int32.
 * Offsets (Q6_K's -32, Q3_K's -4) are taken out afterwards with the Q8_K
 * bsums instead of being applied per byte.
 *
 * Layouts: see blocks.h and the scalar path (quant_dot_scalar.c), which
 * spells each index mapping out.
 */
#include <immintrin.h>

#include "quant/dot_impl.h"
#include "quant/quant_dot_common.h"
#include "quant/quant_dot_legacy.h"
#include "quant/quant_simd_bits.h"

static inline float f16(uint16_t h) { return _cvtsh_ss(h); }

/* 32 unsigned bytes x 32 signed bytes -> 8 int32 sums of 4 */
static inline __m256i dot_us(__m256i u, __m256i s) {
    return _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(1));
}

/* 32 signed x 32 signed bytes -> 8 int32 sums of 4 (the sign trick) */
static inline __m256i dot_ss(__m256i x, __m256i y) { return dot_us(_mm256_sign_epi8(x, x), _mm256_sign_epi8(y, x)); }

/* 32 bits -> 32 bytes, 0xff where the bit is set (byte i <- bit i) */
static inline __m256i bits_to_bytes(const uint8_t *p) {
    uint32_t bits;
    memcpy(&bits, p, 4);
    __m256i v = _mm256_set1_epi32((int)bits);
    const __m256i pick =
        _mm256_set_epi64x(0x0303030303030303, 0x0202020202020202, 0x0101010101010101, 0x0000000000000000);
    v = _mm256_shuffle_epi8(v, pick);
    const __m256i bit = _mm256_set1_epi64x((long long)0x8040201008040201ull);
    return _mm256_cmpeq_epi8(_mm256_and_si256(v, bit), bit);
}

/* ---- float formats ---- */

static void dot_f32(int n, float *s, const void *w, const void *a) {
    const float *x = w, *y = a;
    __m256 acc0 = _mm256_setzero_ps(), acc1 = acc0, acc2 = acc0, acc3 = acc0;
    int i = 0;
    for (; i + 32 <= n; i += 32) {
        acc0 = _mm256_fmadd_ps(_mm256_loadu_ps(x + i), _mm256_loadu_ps(y + i), acc0);
        acc1 = _mm256_fmadd_ps(_mm256_loadu_ps(x + i + 8), _mm256_loadu_ps(y + i + 8), acc1);
        acc2 = _mm256_fmadd_ps(_mm256_loadu_ps(x + i + 16), _mm256_loadu_ps(y + i + 16), acc2);
        acc3 = _mm256_fmadd_ps(_mm256_loadu_ps(x + i + 24), _mm256_loadu_ps(y + i + 24), acc3);
    }
    for (; i + 8 <= n; i += 8) acc0 = _mm256_fmadd_ps(_mm256_loadu_ps(x + i), _mm256_loadu_ps(y + i), acc0);
    float sum = qt_hsum8(_mm256_add_ps(_mm256_add_ps(acc0, acc1), _mm256_add_ps(acc2, acc3)));
    for (; i < n; i++) sum += x[i] * y[i];
    *s = sum;
}

static inline __m256 load_f16x8(const uint16_t *p) { return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p)); }

static inline __m256 load_bf16x8(const uint16_t *p) {
    __m256i v = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)p));
    return _mm256_castsi256_ps(_mm256_slli_epi32(v, 16));
}

#define DOT_HALF(name, load, scalar_cvt)                                                                               \
    static void name(int n, float *s, const void *w, const void *a) {                                                  \
        const uint16_t *x = w;                                                                                         \
        const float *y = a;                                                                                            \
        __m256 acc0 = _mm256_setzero_ps(), acc1 = acc0, acc2 = acc0, acc3 = acc0;                                      \
        int i = 0;                                                                                                     \
        for (; i + 32 <= n; i += 32) {                                                                                 \
            acc0 = _mm256_fmadd_ps(load(x + i), _mm256_loadu_ps(y + i), acc0);                                         \
            acc1 = _mm256_fmadd_ps(load(x + i + 8), _mm256_loadu_ps(y + i + 8), acc1);                                 \
            acc2 = _mm256_fmadd_ps(load(x + i + 16), _mm256_loadu_ps(y + i + 16), acc2);                               \
            acc3 = _mm256_fmadd_ps(load(x + i + 24), _mm256_loadu_ps(y + i + 24), acc3);                               \
        }                                                                                                              \
        for (; i + 8 <= n; i += 8) acc0 = _mm256_fmadd_ps(load(x + i), _mm256_loadu_ps(y + i), acc0);                  \
        float sum = qt_hsum8(_mm256_add_ps(_mm256_add_ps(acc0, acc1), _mm256_add_ps(acc2, acc3)));                     \
        for (; i < n; i++) sum += scalar_cvt(x[i]) * y[i];                                                             \
        *s = sum;                                                                                                      \
    }

DOT_HALF(dot_f16, load_f16x8, st_f16_to_f32)
DOT_HALF(dot_bf16, load_bf16x8, st_bf16_to_f32)

/* ---- 32-weight blocks x Q8_0 / Q8_1 ----
 * Per block the int32 dot (qd_*) is cheap; converting two scales per block
 * (f16 -> f32, broadcast) would cost as much and crowd the shuffle port. So
 * the scale products of 8 blocks are converted at once (one vcvtph2ps each
 * for weights and activations), kept in memory, and each block reads its
 * product with vbroadcastss from memory (a plain load). Two accumulators hide
 * the FMA latency. */

static inline __m256i load32(const void *p) { return _mm256_loadu_si256((const __m256i *)p); }

/* 16-entry int8 table looked up by nibble with vpshufb (both 128-bit lanes) */
static inline __m256i lut16(const int8_t *table) {
    return _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)table));
}

static inline __m256i qd_q4_0(const block_q4_0 *x, const block_q8_0 *y) {
    return dot_ss(_mm256_sub_epi8(qt_nibbles32(x->qs), _mm256_set1_epi8(8)), load32(y->qs));
}

/* Q4_1/Q5_1: only the d*q part; the min part m*s is summed separately */
static inline __m256i qd_q4_1(const block_q4_1 *x, const block_q8_1 *y) {
    return dot_us(qt_nibbles32(x->qs), load32(y->qs));
}

/* Q5_0: q - 16 in one step: a clear 5th bit means q4 - 16 = q4 | 0xf0 as int8 */
static inline __m256i qd_q5_0(const block_q5_0 *x, const block_q8_0 *y) {
    __m256i hi = _mm256_andnot_si256(bits_to_bytes(x->qh), _mm256_set1_epi8((char)0xf0));
    return dot_ss(_mm256_or_si256(qt_nibbles32(x->qs), hi), load32(y->qs));
}

static inline __m256i qd_q5_1(const block_q5_1 *x, const block_q8_1 *y) {
    __m256i hi = _mm256_and_si256(bits_to_bytes(x->qh), _mm256_set1_epi8(0x10));
    return dot_us(_mm256_or_si256(qt_nibbles32(x->qs), hi), load32(y->qs));
}

static inline __m256i qd_q8_0(const block_q8_0 *x, const block_q8_0 *y) { return dot_ss(load32(x->qs), load32(y->qs)); }

static inline __m256i qd_iq4_nl(const block_iq4_nl *x, const block_q8_0 *y) {
    return dot_ss(_mm256_shuffle_epi8(lut16(kvalues_iq4nl), qt_nibbles32(x->qs)), load32(y->qs));
}

static inline __m256i qd_mxfp4(const block_mxfp4 *x, const block_q8_0 *y) {
    return dot_ss(_mm256_shuffle_epi8(lut16(kvalues_mxfp4), qt_nibbles32(x->qs)), load32(y->qs));
}

QT_LEGACY_SCALES()

/* E8M0 halves of 8 blocks (see qdot_e8m0_half): (e-1) << 23, or for e < 2 the
 * subnormals 0x00200000 << e */
static inline __m256 d8_mxfp4(const block_mxfp4 *b) {
    uint8_t e[8];
    for (int k = 0; k < 8; k++) e[k] = b[k].e;
    __m256i v = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)e));
    __m256i normal = _mm256_slli_epi32(_mm256_sub_epi32(v, _mm256_set1_epi32(1)), 23);
    __m256i sub = _mm256_sllv_epi32(_mm256_set1_epi32(0x00200000), v);
    __m256i is_normal = _mm256_cmpgt_epi32(v, _mm256_set1_epi32(1));
    return _mm256_castsi256_ps(_mm256_blendv_epi8(sub, normal, is_normal));
}

#define XD1_E(b) qdot_e8m0_half((b)->e)

QT_LEGACY_DOTS()
QT_LEGACY_DOT(sum_mxfp4, block_mxfp4, block_q8_0, qd_mxfp4, d8_mxfp4, d8_q8_0, XD1_E)

static void dot_mxfp4(int n, float *s, const void *w, const void *a) { *s = sum_mxfp4(n, w, a); }

/* ---- K-quants x Q8_K ---- */

/* Formats with 16 scales (one per 16 weights): scale pair i (groups 2i, 2i+1,
 * i.e. weights 32i..32i+31) as int16, group 2i in the low 128-bit lane and
 * 2i+1 in the high one, matching maddubs output of 32 weights. lo = scales
 * 0..7 and hi = 8..15 as int16, broadcast to both lanes. */
static inline __m256i scale_pair(__m256i lo, __m256i hi, int i) {
    static const int8_t idx[4][32] = {
        {0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 2, 3, 2, 3, 2, 3, 2, 3, 2, 3, 2, 3, 2, 3, 2, 3},
        {4, 5, 4, 5, 4, 5, 4, 5, 4, 5, 4, 5, 4, 5, 4, 5, 6, 7, 6, 7, 6, 7, 6, 7, 6, 7, 6, 7, 6, 7, 6, 7},
        {8,  9,  8,  9,  8,  9,  8,  9,  8,  9,  8,  9,  8,  9,  8,  9,
         10, 11, 10, 11, 10, 11, 10, 11, 10, 11, 10, 11, 10, 11, 10, 11},
        {12, 13, 12, 13, 12, 13, 12, 13, 12, 13, 12, 13, 12, 13, 12, 13,
         14, 15, 14, 15, 14, 15, 14, 15, 14, 15, 14, 15, 14, 15, 14, 15}};
    return _mm256_shuffle_epi8(i < 4 ? lo : hi, _mm256_loadu_si256((const __m256i *)idx[i & 3]));
}

static inline __m256i bcast8_i16(__m128i v8x16) { return _mm256_broadcastsi128_si256(v8x16); }

static void dot_q2_k(int n, float *s, const void *w, const void *a) {
    const block_q2_K *x = w;
    const block_q8_K *y = a;
    __m256 acc = _mm256_setzero_ps();
    for (int ib = 0; ib < n / QK_K; ib++) {
        const float dy = y[ib].d;
        __m128i sc8 = _mm_loadu_si128((const __m128i *)x[ib].scales);
        __m128i lo4 = _mm_and_si128(sc8, _mm_set1_epi8(0x0f));
        __m128i hi4 = _mm_and_si128(_mm_srli_epi16(sc8, 4), _mm_set1_epi8(0x0f));
        /* min term: sum_g min_g * bsum_g */
        __m256i mins = _mm256_cvtepu8_epi16(hi4);
        __m256i bs = _mm256_loadu_si256((const __m256i *)y[ib].bsums);
        __m256i msum = _mm256_madd_epi16(mins, bs);
        __m256i sclo = bcast8_i16(_mm_cvtepu8_epi16(lo4));
        __m256i schi = bcast8_i16(_mm_cvtepu8_epi16(_mm_srli_si128(lo4, 8)));
        __m256i isum = _mm256_setzero_si256();
        for (int h = 0; h < 2; h++) {
            /* shifted right by 2 per k; 16-bit shifts: only bits 0..1 of each byte are read */
            __m256i qv = _mm256_loadu_si256((const __m256i *)(x[ib].qs + 32 * h));
            for (int k = 0; k < 4; k++, qv = _mm256_srli_epi16(qv, 2)) {
                __m256i q = _mm256_and_si256(qv, _mm256_set1_epi8(3));
                __m256i yv = _mm256_loadu_si256((const __m256i *)(y[ib].qs + 128 * h + 32 * k));
                __m256i p = _mm256_maddubs_epi16(q, yv);
                isum = _mm256_add_epi32(isum, _mm256_madd_epi16(p, scale_pair(sclo, schi, 4 * h + k)));
            }
        }
        acc = _mm256_fmadd_ps(_mm256_set1_ps(dy * f16(x[ib].d)), _mm256_cvtepi32_ps(isum), acc);
        acc = _mm256_fmadd_ps(_mm256_set1_ps(-dy * f16(x[ib].dmin)), _mm256_cvtepi32_ps(msum), acc);
    }
    *s = qt_hsum8(acc);
}

static void dot_q3_k(int n, float *s, const void *w, const void *a) {
    const block_q3_K *x = w;
    const block_q8_K *y = a;
    __m256 acc = _mm256_setzero_ps();
    for (int ib = 0; ib < n / QK_K; ib++) {
        int8_t sc[16];
        qdot_q3k_scales(x[ib].scales, sc);
        __m128i sc8 = _mm_loadu_si128((const __m128i *)sc);
        __m256i sc16 = _mm256_cvtepi8_epi16(sc8);
        __m256i sclo = bcast8_i16(_mm_cvtepi8_epi16(sc8));
        __m256i schi = bcast8_i16(_mm_cvtepi8_epi16(_mm_srli_si128(sc8, 8)));
        /* we dot q+4 (unsigned 0..7); the -4 comes back as -4 * sum_g sc_g * bsum_g */
        __m256i bias = _mm256_madd_epi16(sc16, _mm256_loadu_si256((const __m256i *)y[ib].bsums));
        __m256i hm = _mm256_loadu_si256((const __m256i *)x[ib].hmask);
        __m256i isum = _mm256_setzero_si256();
        /* qs shifted right by 2 per k, hmask by 1 per (h, k): 16-bit shifts pull bits
         * across bytes, but only bits 0..1 (0) of each byte are read */
        for (int h = 0; h < 2; h++) {
            __m256i qv = _mm256_loadu_si256((const __m256i *)(x[ib].qs + 32 * h));
            for (int k = 0; k < 4; k++, qv = _mm256_srli_epi16(qv, 2), hm = _mm256_srli_epi16(hm, 1)) {
                __m256i lo = _mm256_and_si256(qv, _mm256_set1_epi8(3));
                __m256i hb = _mm256_and_si256(hm, _mm256_set1_epi8(1));
                __m256i q = _mm256_or_si256(lo, _mm256_slli_epi16(hb, 2));
                __m256i yv = _mm256_loadu_si256((const __m256i *)(y[ib].qs + 128 * h + 32 * k));
                __m256i p = _mm256_maddubs_epi16(q, yv);
                isum = _mm256_add_epi32(isum, _mm256_madd_epi16(p, scale_pair(sclo, schi, 4 * h + k)));
            }
        }
        isum = _mm256_sub_epi32(isum, _mm256_slli_epi32(bias, 2));
        acc = _mm256_fmadd_ps(_mm256_set1_ps(y[ib].d * f16(x[ib].d)), _mm256_cvtepi32_ps(isum), acc);
    }
    *s = qt_hsum8(acc);
}

/* Q4_K / Q5_K (q5: the 5th bit from qh). One 32-weight sub-block per ymm
 * against contiguous activations; the sub-block's scale is broadcast from a
 * dword (scale in both int16 halves) stored once per block, a load rather
 * than a shuffle per sub-block, and the min term is one vpmaddwd of the mins
 * doubled into int16 pairs against the 16 bsums. Scales come unpacked in
 * 64-bit registers (qdot_k4_scales64): no 4-byte stores read back as 8. */
static inline __attribute__((always_inline)) void dot_k4(int n, float *s, const uint8_t *x, size_t bs,
                                                         const block_q8_K *y, const int q5) {
    __m256 acc = _mm256_setzero_ps(), accm = _mm256_setzero_ps();
    const __m256i m4 = _mm256_set1_epi8(0x0f), b4 = _mm256_set1_epi8(0x10);
    for (int ib = 0; ib < n / QK_K; ib++, x += bs, y++) {
        /* both layouts start d, dmin, scales[12]; Q5_K has qh[32] before qs */
        const uint8_t *qs = x + 16 + (q5 ? 32 : 0);
        uint64_t sc, mn;
        qdot_k4_scales64(x + 4, &sc, &mn);
        uint16_t dh[2];
        memcpy(dh, x, 4);
        const float dy = y->d;
        const __m128i mn2 = _mm_unpacklo_epi8(_mm_cvtsi64_si128((long long)mn), _mm_cvtsi64_si128((long long)mn));
        const __m256i bsums = _mm256_loadu_si256((const __m256i *)y->bsums);
        const __m256i msum = _mm256_madd_epi16(_mm256_cvtepu8_epi16(mn2), bsums);
        accm = _mm256_fmadd_ps(_mm256_set1_ps(dy * f16(dh[1])), _mm256_cvtepi32_ps(msum), accm);
        int32_t sc2[8]; /* scale j in both int16 halves of dword j */
        const __m256i s32 = _mm256_cvtepu8_epi32(_mm_cvtsi64_si128((long long)sc));
        _mm256_storeu_si256((__m256i *)sc2, _mm256_or_si256(s32, _mm256_slli_epi32(s32, 16)));
        /* Q5_K: qh bit 2c -> weights 64c.., bit 2c+1 -> 64c+32..: qh shifted right by 2
         * per c (16-bit shifts pull bits across bytes; only bits 0..1 are read) */
        __m256i hb = q5 ? _mm256_loadu_si256((const __m256i *)(x + 16)) : _mm256_setzero_si256();
        __m256i isum = _mm256_setzero_si256();
        for (int c = 0; c < 4; c++) {
            const __m256i qv = _mm256_loadu_si256((const __m256i *)(qs + 32 * c));
            __m256i lo = _mm256_and_si256(qv, m4), hi = _mm256_and_si256(_mm256_srli_epi16(qv, 4), m4);
            if (q5) {
                lo = _mm256_or_si256(lo, _mm256_and_si256(_mm256_slli_epi16(hb, 4), b4));
                hi = _mm256_or_si256(hi, _mm256_and_si256(_mm256_slli_epi16(hb, 3), b4));
                hb = _mm256_srli_epi16(hb, 2);
            }
            const __m256i p0 = _mm256_maddubs_epi16(lo, _mm256_loadu_si256((const __m256i *)(y->qs + 64 * c)));
            const __m256i p1 = _mm256_maddubs_epi16(hi, _mm256_loadu_si256((const __m256i *)(y->qs + 64 * c + 32)));
            isum = _mm256_add_epi32(isum, _mm256_madd_epi16(p0, _mm256_set1_epi32(sc2[2 * c])));
            isum = _mm256_add_epi32(isum, _mm256_madd_epi16(p1, _mm256_set1_epi32(sc2[2 * c + 1])));
        }
        acc = _mm256_fmadd_ps(_mm256_set1_ps(dy * f16(dh[0])), _mm256_cvtepi32_ps(isum), acc);
    }
    *s = qt_hsum8(acc) - qt_hsum8(accm);
}

static void dot_q4_k(int n, float *s, const void *w, const void *a) { dot_k4(n, s, w, sizeof(block_q4_K), a, 0); }

static void dot_q5_k(int n, float *s, const void *w, const void *a) { dot_k4(n, s, w, sizeof(block_q5_K), a, 1); }

static void dot_q6_k(int n, float *s, const void *w, const void *a) {
    const block_q6_K *x = w;
    const block_q8_K *y = a;
    __m256 acc = _mm256_setzero_ps();
    const __m256i m4 = _mm256_set1_epi8(0x0f), m2 = _mm256_set1_epi8(0x30);
    for (int ib = 0; ib < n / QK_K; ib++) {
        __m128i sc8 = _mm_loadu_si128((const __m128i *)x[ib].scales);
        __m256i sclo = bcast8_i16(_mm_cvtepi8_epi16(sc8));
        __m256i schi = bcast8_i16(_mm_cvtepi8_epi16(_mm_srli_si128(sc8, 8)));
        /* we dot q (unsigned 0..63); the -32 comes back as -32 * sum_g sc_g * bsum_g */
        __m256i bias = _mm256_madd_epi16(_mm256_cvtepi8_epi16(sc8), _mm256_loadu_si256((const __m256i *)y[ib].bsums));
        __m256i isum = _mm256_setzero_si256();
        for (int h = 0; h < 2; h++) {
            __m256i l0 = _mm256_loadu_si256((const __m256i *)(x[ib].ql + 64 * h));
            __m256i l1 = _mm256_loadu_si256((const __m256i *)(x[ib].ql + 64 * h + 32));
            __m256i qh = _mm256_loadu_si256((const __m256i *)(x[ib].qh + 32 * h));
            /* 32-weight slice s = 2p + k: nibble p of ql chunk k, qh bits 2s..2s+1 */
            __m256i q[4];
            q[0] = _mm256_or_si256(_mm256_and_si256(l0, m4), _mm256_and_si256(_mm256_slli_epi16(qh, 4), m2));
            q[1] = _mm256_or_si256(_mm256_and_si256(l1, m4), _mm256_and_si256(_mm256_slli_epi16(qh, 2), m2));
            q[2] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l0, 4), m4), _mm256_and_si256(qh, m2));
            q[3] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l1, 4), m4),
                                   _mm256_and_si256(_mm256_srli_epi16(qh, 2), m2));
            for (int k = 0; k < 4; k++) {
                __m256i yv = _mm256_loadu_si256((const __m256i *)(y[ib].qs + 128 * h + 32 * k));
                __m256i p = _mm256_maddubs_epi16(q[k], yv);
                isum = _mm256_add_epi32(isum, _mm256_madd_epi16(p, scale_pair(sclo, schi, 4 * h + k)));
            }
        }
        isum = _mm256_sub_epi32(isum, _mm256_slli_epi32(bias, 5));
        acc = _mm256_fmadd_ps(_mm256_set1_ps(y[ib].d * f16(x[ib].d)), _mm256_cvtepi32_ps(isum), acc);
    }
    *s = qt_hsum8(acc);
}

/* IQ4_XS: two sub-blocks (64 weights, 32 bytes of nibbles) per step. The low
 * nibbles of the 32 bytes are weights 0..15 of sub-blocks 2p and 2p+1, the high
 * nibbles their weights 16..31, so the y halves are regrouped to match (one
 * vperm2i128 each) and each 128-bit lane carries one sub-block: its scale comes
 * from scale_pair(). Scales: byte j of pdep(scales_l, 0x0f..) is the low nibble
 * of scale j, pdep(scales_h, 0x30..) puts its 2 high bits at bits 4..5. */
static void dot_iq4_xs(int n, float *s, const void *w, const void *a) {
    const block_iq4_xs *x = w;
    const block_q8_K *y = a;
    const __m256i lut = lut16(kvalues_iq4nl);
    const __m256i m4 = _mm256_set1_epi8(0x0f);
    __m256 acc = _mm256_setzero_ps();
    for (int ib = 0; ib < n / QK_K; ib++) {
        uint32_t sl;
        memcpy(&sl, x[ib].scales_l, 4);
        uint64_t ls8 = _pdep_u64(sl, 0x0f0f0f0f0f0f0f0full) | _pdep_u64(x[ib].scales_h, 0x3030303030303030ull);
        __m128i ls = _mm_sub_epi16(_mm_cvtepu8_epi16(_mm_cvtsi64_si128((long long)ls8)), _mm_set1_epi16(32));
        __m256i lsb = bcast8_i16(ls);
        __m256i isum = _mm256_setzero_si256();
        for (int p = 0; p < 4; p++) {
            __m256i q = _mm256_loadu_si256((const __m256i *)(x[ib].qs + 32 * p));
            __m256i vlo = _mm256_shuffle_epi8(lut, _mm256_and_si256(q, m4));
            __m256i vhi = _mm256_shuffle_epi8(lut, _mm256_and_si256(_mm256_srli_epi16(q, 4), m4));
            __m256i y0 = _mm256_loadu_si256((const __m256i *)(y[ib].qs + 64 * p));
            __m256i y1 = _mm256_loadu_si256((const __m256i *)(y[ib].qs + 64 * p + 32));
            __m256i ylo = _mm256_permute2x128_si256(y0, y1, 0x20);
            __m256i yhi = _mm256_permute2x128_si256(y0, y1, 0x31);
            __m256i plo = _mm256_maddubs_epi16(_mm256_sign_epi8(vlo, vlo), _mm256_sign_epi8(ylo, vlo));
            __m256i phi = _mm256_maddubs_epi16(_mm256_sign_epi8(vhi, vhi), _mm256_sign_epi8(yhi, vhi));
            __m256i sc = scale_pair(lsb, lsb, p);
            isum = _mm256_add_epi32(isum, _mm256_add_epi32(_mm256_madd_epi16(plo, sc), _mm256_madd_epi16(phi, sc)));
        }
        acc = _mm256_fmadd_ps(_mm256_set1_ps(y[ib].d * f16(x[ib].d)), _mm256_cvtepi32_ps(isum), acc);
    }
    *s = qt_hsum8(acc);
}

const qt_vec_dot_fn qt_dots_main_avx2[QT_COUNT] = {
    [QT_F32] = dot_f32,       [QT_F16] = dot_f16,     [QT_BF16] = dot_bf16, [QT_Q4_0] = dot_q4_0,
    [QT_Q4_1] = dot_q4_1,     [QT_Q5_0] = dot_q5_0,   [QT_Q5_1] = dot_q5_1, [QT_Q8_0] = dot_q8_0,
    [QT_IQ4_NL] = dot_iq4_nl, [QT_MXFP4] = dot_mxfp4, [QT_Q2_K] = dot_q2_k, [QT_Q3_K] = dot_q3_k,
    [QT_Q4_K] = dot_q4_k,     [QT_Q5_K] = dot_q5_k,   [QT_Q6_K] = dot_q6_k, [QT_IQ4_XS] = dot_iq4_xs,
};

/* ---- activation quantizers (called by qt_quantize_act when AVX2 runs) ----
 * Bit-identical to the scalar ones in quant_dot.c: the same f32 d = amax/127
 * and id = 1/d (scalar), the same products x*id, and round half away from
 * zero like roundf (vroundps only truncates or rounds to even, so the tie is
 * fixed up from the exact remainder x - trunc(x)). */

static inline float absmax_avx2(const float *x, int n) {
    const __m256 nosign = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
    __m256 m = _mm256_setzero_ps();
    for (int i = 0; i < n; i += 8) m = _mm256_max_ps(m, _mm256_and_ps(_mm256_loadu_ps(x + i), nosign));
    __m128 t = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
    t = _mm_max_ps(t, _mm_movehl_ps(t, t));
    t = _mm_max_ss(t, _mm_movehdup_ps(t));
    return _mm_cvtss_f32(t);
}

static inline __m256i round_away_epi32(__m256 v) {
    const __m256 sign = _mm256_castsi256_ps(_mm256_set1_epi32((int)0x80000000u));
    __m256 t = _mm256_round_ps(v, _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC);
    __m256 frac = _mm256_andnot_ps(sign, _mm256_sub_ps(v, t)); /* exact for |v| < 2^23 */
    __m256 up = _mm256_cmp_ps(frac, _mm256_set1_ps(0.5f), _CMP_GE_OQ);
    __m256 one = _mm256_or_ps(_mm256_and_ps(v, sign), _mm256_set1_ps(1.0f)); /* copysign(1, v) */
    return _mm256_cvtps_epi32(_mm256_add_ps(t, _mm256_and_ps(up, one)));
}

/* 32 floats * id -> 32 int8 (saturating packs keep order after the final permute) */
static inline __m256i quant32(const float *x, __m256 id, __m256 lo, __m256 hi) {
    __m256i i0 = round_away_epi32(_mm256_min_ps(_mm256_max_ps(_mm256_mul_ps(_mm256_loadu_ps(x), id), lo), hi));
    __m256i i1 = round_away_epi32(_mm256_min_ps(_mm256_max_ps(_mm256_mul_ps(_mm256_loadu_ps(x + 8), id), lo), hi));
    __m256i i2 = round_away_epi32(_mm256_min_ps(_mm256_max_ps(_mm256_mul_ps(_mm256_loadu_ps(x + 16), id), lo), hi));
    __m256i i3 = round_away_epi32(_mm256_min_ps(_mm256_max_ps(_mm256_mul_ps(_mm256_loadu_ps(x + 24), id), lo), hi));
    __m256i b = _mm256_packs_epi16(_mm256_packs_epi32(i0, i1), _mm256_packs_epi32(i2, i3));
    return _mm256_permutevar8x32_epi32(b, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
}

void qdot_quantize_q8_0_avx2(const float *x, block_q8_0 *y, int64_t nb) {
    /* no clamp needed for Q8_0 (|x*id| <= 127 + rounding): +-1e9 bounds are inert */
    const __m256 lo = _mm256_set1_ps(-1e9f), hi = _mm256_set1_ps(1e9f);
    for (int64_t ib = 0; ib < nb; ib++, x += QK8_0) {
        float d = absmax_avx2(x, QK8_0) / 127.0f;
        float id = d != 0.0f ? 1.0f / d : 0.0f;
        y[ib].d = st_f32_to_f16(d);
        _mm256_storeu_si256((__m256i *)y[ib].qs, quant32(x, _mm256_set1_ps(id), lo, hi));
    }
}

/* sum of 32 int8 as int */
static inline int sum_i8x32(__m256i q) {
    __m256i s = _mm256_madd_epi16(_mm256_maddubs_epi16(_mm256_set1_epi8(1), q), _mm256_set1_epi16(1));
    __m128i t = _mm_add_epi32(_mm256_castsi256_si128(s), _mm256_extracti128_si256(s, 1));
    t = _mm_add_epi32(t, _mm_shuffle_epi32(t, 0x4e));
    t = _mm_add_epi32(t, _mm_shuffle_epi32(t, 0xb1));
    return _mm_cvtsi128_si32(t);
}

void qdot_quantize_q8_1_avx2(const float *x, block_q8_1 *y, int64_t nb) {
    const __m256 lo = _mm256_set1_ps(-1e9f), hi = _mm256_set1_ps(1e9f);
    for (int64_t ib = 0; ib < nb; ib++, x += QK8_1) {
        float d = absmax_avx2(x, QK8_1) / 127.0f;
        float id = d != 0.0f ? 1.0f / d : 0.0f;
        __m256i q = quant32(x, _mm256_set1_ps(id), lo, hi);
        _mm256_storeu_si256((__m256i *)y[ib].qs, q);
        y[ib].d = st_f32_to_f16(d);
        y[ib].s = st_f32_to_f16(d * (float)sum_i8x32(q));
    }
}

void qdot_quantize_q8_k_avx2(const float *x, block_q8_K *y, int64_t nb) {
    const __m256 lo = _mm256_set1_ps(-127.0f), hi = _mm256_set1_ps(127.0f);
    for (int64_t ib = 0; ib < nb; ib++, x += QK_K) {
        float amax = absmax_avx2(x, QK_K);
        if (amax == 0.0f) {
            memset(&y[ib], 0, sizeof y[ib]);
            continue;
        }
        float iscale = 127.0f / amax;
        for (int c = 0; c < QK_K / 32; c++) {
            __m256i q = quant32(x + 32 * c, _mm256_set1_ps(iscale), lo, hi);
            _mm256_storeu_si256((__m256i *)(y[ib].qs + 32 * c), q);
            /* sums of each 16: psadbw on q+128 gives sums of 8, minus 8*128 each */
            __m256i s8 = _mm256_sad_epu8(_mm256_xor_si256(q, _mm256_set1_epi8((char)0x80)), _mm256_setzero_si256());
            y[ib].bsums[2 * c] = (int16_t)(_mm256_extract_epi64(s8, 0) + _mm256_extract_epi64(s8, 1) - 2048);
            y[ib].bsums[2 * c + 1] = (int16_t)(_mm256_extract_epi64(s8, 2) + _mm256_extract_epi64(s8, 3) - 2048);
        }
        y[ib].d = 1.0f / iscale;
    }
}
