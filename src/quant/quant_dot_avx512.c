/* AVX-512 (F/BW/VL/DQ + VNNI) dot products of the "main" weight formats;
 * compiled with those flags and only called after cpuid/xgetbv say the CPU
 * and OS run them (quant_dot.c). Formats without an entry here fall back to
 * the AVX2 kernels.
 *
 * Integer cores:
 *   - vpdpbusd (VNNI): unsigned x signed bytes, 4 products summed into int32
 *     with no int16 saturation step. Signed weights: |x| and sign(y, x) (Q8_0,
 *     ymm has vpsignb), or an unsigned table offset by +128 whose extra
 *     128*sum(y) is removed with the Q8_K bsums (IQ4_XS).
 *   - vpmaddubsw + vpdpwssd: for K-quants whose sub-block scales multiply
 *     int16 pair sums; the scale lands in the same instruction as the
 *     accumulation.
 * zmm where it measured faster (Q6_K, IQ4_XS, floats); ymm + VNNI where zmm
 * lost (Q8_0, Q4_K, Q5_K: 512-bit work has two vector ports instead of three,
 * and their per-block scale shuffles and 256-bit inserts crowd port 5).
 * Layouts: see blocks.h and quant_dot_scalar.c.
 */
#include <immintrin.h>

#include "quant/dot_impl.h"
#include "quant/quant_dot_common.h"

static inline float f16(uint16_t h) { return _cvtsh_ss(h); }

static inline __m512i load64(const void *p) { return _mm512_loadu_si512(p); }
static inline __m256i load32(const void *p) { return _mm256_loadu_si256((const __m256i *)p); }

/* two 32-byte pieces -> one zmm [lo | hi] */
static inline __m512i join256(__m256i lo, __m256i hi) {
    return _mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1);
}

/* ---- float formats ---- */

static void dot_f32(int n, float *s, const void *w, const void *a) {
    const float *x = w, *y = a;
    __m512 acc0 = _mm512_setzero_ps(), acc1 = acc0, acc2 = acc0, acc3 = acc0;
    int i = 0;
    for (; i + 64 <= n; i += 64) {
        acc0 = _mm512_fmadd_ps(_mm512_loadu_ps(x + i), _mm512_loadu_ps(y + i), acc0);
        acc1 = _mm512_fmadd_ps(_mm512_loadu_ps(x + i + 16), _mm512_loadu_ps(y + i + 16), acc1);
        acc2 = _mm512_fmadd_ps(_mm512_loadu_ps(x + i + 32), _mm512_loadu_ps(y + i + 32), acc2);
        acc3 = _mm512_fmadd_ps(_mm512_loadu_ps(x + i + 48), _mm512_loadu_ps(y + i + 48), acc3);
    }
    for (; i + 16 <= n; i += 16)
        acc0 = _mm512_fmadd_ps(_mm512_loadu_ps(x + i), _mm512_loadu_ps(y + i), acc0);
    if (i < n) { /* masked tail: no scalar loop, no read past the row */
        __mmask16 m = (__mmask16)((1u << (n - i)) - 1);
        acc1 = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(m, x + i), _mm512_maskz_loadu_ps(m, y + i), acc1);
    }
    *s = _mm512_reduce_add_ps(_mm512_add_ps(_mm512_add_ps(acc0, acc1), _mm512_add_ps(acc2, acc3)));
}

static inline __m512 cvt_f16x16(__m256i h) { return _mm512_cvtph_ps(h); }
static inline __m512 cvt_bf16x16(__m256i h) {
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}

#define DOT_HALF(name, cvt)                                                                       \
    static void name(int n, float *s, const void *w, const void *a) {                           \
        const uint16_t *x = w;                                                                   \
        const float *y = a;                                                                      \
        __m512 acc0 = _mm512_setzero_ps(), acc1 = acc0, acc2 = acc0, acc3 = acc0;                \
        int i = 0;                                                                               \
        for (; i + 64 <= n; i += 64) {                                                           \
            acc0 = _mm512_fmadd_ps(cvt(load32(x + i)), _mm512_loadu_ps(y + i), acc0);            \
            acc1 = _mm512_fmadd_ps(cvt(load32(x + i + 16)), _mm512_loadu_ps(y + i + 16), acc1);  \
            acc2 = _mm512_fmadd_ps(cvt(load32(x + i + 32)), _mm512_loadu_ps(y + i + 32), acc2);  \
            acc3 = _mm512_fmadd_ps(cvt(load32(x + i + 48)), _mm512_loadu_ps(y + i + 48), acc3);  \
        }                                                                                        \
        for (; i + 16 <= n; i += 16)                                                             \
            acc0 = _mm512_fmadd_ps(cvt(load32(x + i)), _mm512_loadu_ps(y + i), acc0);            \
        if (i < n) {                                                                             \
            __mmask16 m = (__mmask16)((1u << (n - i)) - 1);                                      \
            __m256i h = _mm256_maskz_loadu_epi16(m, x + i);                                      \
            acc1 = _mm512_fmadd_ps(cvt(h), _mm512_maskz_loadu_ps(m, y + i), acc1);              \
        }                                                                                        \
        *s = _mm512_reduce_add_ps(_mm512_add_ps(_mm512_add_ps(acc0, acc1), _mm512_add_ps(acc2, acc3))); \
    }

DOT_HALF(dot_f16, cvt_f16x16)
DOT_HALF(dot_bf16, cvt_bf16x16)

/* ---- Q8_0 x Q8_0 in ymm ----
 * Two blocks per zmm measured slower here (the per-block scale vectors and
 * 256-bit inserts crowd port 5, and zmm work has two vector ports, ymm three),
 * so this stays 256-bit and gains from VNNI only: vpsignb + vpdpbusd replace
 * vpsignb + vpmaddubsw + vpmaddwd. */

static inline float hsum256(__m256 v) {
    __m128 t = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    t = _mm_add_ps(t, _mm_movehl_ps(t, t));
    t = _mm_add_ss(t, _mm_movehdup_ps(t));
    return _mm_cvtss_f32(t);
}

/* the f16 d of 8 consecutive Q8_0 blocks as 8 floats (one vcvtph2ps) */
static inline __m256 d8_q8_0(const block_q8_0 *b) {
    uint16_t h[8];
    for (int k = 0; k < 8; k++) h[k] = b[k].d;
    return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)h));
}

static inline __m256i qd_q8_0(const block_q8_0 *x, const block_q8_0 *y) {
    __m256i xv = load32(x->qs), yv = load32(y->qs);
    return _mm256_dpbusd_epi32(_mm256_setzero_si256(), _mm256_sign_epi8(xv, xv), _mm256_sign_epi8(yv, xv));
}

/* as the AVX2 path: scale products of 8 blocks converted at once and read back
 * with vbroadcastss from memory (no shuffle-port work per block) */
static void dot_q8_0(int n, float *s, const void *w, const void *a) {
    const block_q8_0 *x = w;
    const block_q8_0 *y = a;
    const int nb = n / QK8_0;
    __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
    int ib = 0;
    for (; ib + 8 <= nb; ib += 8) {
        float dd[8] __attribute__((aligned(32)));
        _mm256_store_ps(dd, _mm256_mul_ps(d8_q8_0(x + ib), d8_q8_0(y + ib)));
        for (int k = 0; k < 8; k += 2) {
            acc0 = _mm256_fmadd_ps(_mm256_broadcast_ss(dd + k), _mm256_cvtepi32_ps(qd_q8_0(&x[ib + k], &y[ib + k])), acc0);
            acc1 = _mm256_fmadd_ps(_mm256_broadcast_ss(dd + k + 1),
                                   _mm256_cvtepi32_ps(qd_q8_0(&x[ib + k + 1], &y[ib + k + 1])), acc1);
        }
    }
    for (; ib < nb; ib++)
        acc0 = _mm256_fmadd_ps(_mm256_set1_ps(f16(x[ib].d) * f16(y[ib].d)), _mm256_cvtepi32_ps(qd_q8_0(&x[ib], &y[ib])),
                               acc0);
    *s = hsum256(_mm256_add_ps(acc0, acc1));
}

/* ---- K-quants x Q8_K ---- */

/* int16 scale vector, 8 lanes per scale: groups g..g+3 (Q6_K's 16-weight groups) */
static inline __m512i perm_scales4(__m512i sc16, int g) {
    __m512i idx = _mm512_inserti64x4(
        _mm512_castsi256_si512(_mm256_set_m128i(_mm_set1_epi16((short)(g + 1)), _mm_set1_epi16((short)g))),
        _mm256_set_m128i(_mm_set1_epi16((short)(g + 3)), _mm_set1_epi16((short)(g + 2))), 1);
    return _mm512_permutexvar_epi16(idx, sc16);
}

/* min term of Q4_K/Q5_K: sum_j mn_j * (bsum_2j + bsum_2j+1), as 4 int32 */
static inline __m128i k4_min_sums(const uint8_t mn[8], const int16_t *bsums) {
    __m256i bs = load32(bsums);
    __m128i bs2 = _mm_hadd_epi16(_mm256_castsi256_si128(bs), _mm256_extracti128_si256(bs, 1));
    __m128i mn16 = _mm_cvtepu8_epi16(_mm_loadl_epi64((const __m128i *)mn));
    return _mm_madd_epi16(mn16, bs2);
}

static inline float hsum128(__m128 t) {
    t = _mm_add_ps(t, _mm_movehl_ps(t, t));
    t = _mm_add_ss(t, _mm_movehdup_ps(t));
    return _mm_cvtss_f32(t);
}

/* Q4_K / Q5_K in ymm (zmm measured slower, as for Q8_0): vpdpwssd applies the
 * sub-block scale and accumulates in one instruction. */
static inline __m256i scale_one(__m256i sc16x8, int j) {
    __m256i idx = _mm256_set1_epi16((short)((2 * j + 1) << 8 | (2 * j)));
    return _mm256_shuffle_epi8(sc16x8, idx);
}

static void dot_q4_k(int n, float *s, const void *w, const void *a) {
    const block_q4_K *x = w;
    const block_q8_K *y = a;
    __m256 acc = _mm256_setzero_ps();
    __m128 accm = _mm_setzero_ps();
    const __m256i m4 = _mm256_set1_epi8(0x0f);
    for (int ib = 0; ib < n / QK_K; ib++) {
        uint8_t sc[8], mn[8];
        qdot_k4_scales(x[ib].scales, sc, mn);
        const float dy = y[ib].d;
        accm = _mm_fmadd_ps(_mm_set1_ps(-dy * f16(x[ib].dmin)), _mm_cvtepi32_ps(k4_min_sums(mn, y[ib].bsums)),
                            accm);
        __m256i sc16 = _mm256_broadcastsi128_si256(_mm_cvtepu8_epi16(_mm_loadl_epi64((const __m128i *)sc)));
        __m256i isum = _mm256_setzero_si256();
        for (int c = 0; c < 4; c++) {
            __m256i qv = load32(x[ib].qs + 32 * c);
            __m256i lo = _mm256_and_si256(qv, m4);
            __m256i hi = _mm256_and_si256(_mm256_srli_epi16(qv, 4), m4);
            __m256i p0 = _mm256_maddubs_epi16(lo, load32(y[ib].qs + 64 * c));
            __m256i p1 = _mm256_maddubs_epi16(hi, load32(y[ib].qs + 64 * c + 32));
            isum = _mm256_dpwssd_epi32(isum, p0, scale_one(sc16, 2 * c));
            isum = _mm256_dpwssd_epi32(isum, p1, scale_one(sc16, 2 * c + 1));
        }
        acc = _mm256_fmadd_ps(_mm256_set1_ps(dy * f16(x[ib].d)), _mm256_cvtepi32_ps(isum), acc);
    }
    *s = hsum256(acc) + hsum128(accm);
}

static void dot_q5_k(int n, float *s, const void *w, const void *a) {
    const block_q5_K *x = w;
    const block_q8_K *y = a;
    __m256 acc = _mm256_setzero_ps();
    __m128 accm = _mm_setzero_ps();
    const __m256i m4 = _mm256_set1_epi8(0x0f), b4 = _mm256_set1_epi8(0x10);
    for (int ib = 0; ib < n / QK_K; ib++) {
        uint8_t sc[8], mn[8];
        qdot_k4_scales(x[ib].scales, sc, mn);
        const float dy = y[ib].d;
        accm = _mm_fmadd_ps(_mm_set1_ps(-dy * f16(x[ib].dmin)), _mm_cvtepi32_ps(k4_min_sums(mn, y[ib].bsums)),
                            accm);
        __m256i sc16 = _mm256_broadcastsi128_si256(_mm_cvtepu8_epi16(_mm_loadl_epi64((const __m128i *)sc)));
        /* qh bit 2c -> weights 64c.., bit 2c+1 -> 64c+32..: qh shifted right by 2
         * per c (16-bit shifts pull bits across bytes; only bits 0..1 are read) */
        __m256i hb = load32(x[ib].qh);
        __m256i isum = _mm256_setzero_si256();
        for (int c = 0; c < 4; c++) {
            __m256i qv = load32(x[ib].qs + 32 * c);
            __m256i lo = _mm256_or_si256(_mm256_and_si256(qv, m4), _mm256_and_si256(_mm256_slli_epi16(hb, 4), b4));
            __m256i hi = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(qv, 4), m4),
                                         _mm256_and_si256(_mm256_slli_epi16(hb, 3), b4));
            hb = _mm256_srli_epi16(hb, 2);
            __m256i p0 = _mm256_maddubs_epi16(lo, load32(y[ib].qs + 64 * c));
            __m256i p1 = _mm256_maddubs_epi16(hi, load32(y[ib].qs + 64 * c + 32));
            isum = _mm256_dpwssd_epi32(isum, p0, scale_one(sc16, 2 * c));
            isum = _mm256_dpwssd_epi32(isum, p1, scale_one(sc16, 2 * c + 1));
        }
        acc = _mm256_fmadd_ps(_mm256_set1_ps(dy * f16(x[ib].d)), _mm256_cvtepi32_ps(isum), acc);
    }
    *s = hsum256(acc) + hsum128(accm);
}

static void dot_q6_k(int n, float *s, const void *w, const void *a) {
    const block_q6_K *x = w;
    const block_q8_K *y = a;
    __m512 acc = _mm512_setzero_ps();
    const __m512i m4 = _mm512_set1_epi8(0x0f), m2 = _mm512_set1_epi8(0x30);
    for (int ib = 0; ib < n / QK_K; ib++) {
        __m128i sc8 = _mm_loadu_si128((const __m128i *)x[ib].scales);
        __m256i sc16y = _mm256_cvtepi8_epi16(sc8);
        __m512i sc16 = _mm512_castsi256_si512(sc16y);
        /* we dot q (unsigned 0..63); the -32 comes back as -32 * sum_g sc_g * bsum_g */
        __m256i bias = _mm256_madd_epi16(sc16y, load32(y[ib].bsums));
        __m512i isum = _mm512_zextsi256_si512(_mm256_slli_epi32(bias, 5));
        isum = _mm512_sub_epi32(_mm512_setzero_si512(), isum);
        for (int hf = 0; hf < 2; hf++) {
            /* ql chunk k (32 bytes) holds weights 32k+l (low nibble) and 64+32k+l (high);
             * qh bits 2s..2s+1 of byte l hold the top of weight 32s+l */
            __m512i ql = load64(x[ib].ql + 64 * hf);
            __m256i qh = load32(x[ib].qh + 32 * hf);
            __m512i h = join256(qh, _mm256_srli_epi16(qh, 2));
            __m512i z0 = _mm512_or_si512(_mm512_and_si512(ql, m4), _mm512_and_si512(_mm512_slli_epi16(h, 4), m2));
            __m512i z1 = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(ql, 4), m4), _mm512_and_si512(h, m2));
            __m512i p0 = _mm512_maddubs_epi16(z0, load64(y[ib].qs + 128 * hf));
            __m512i p1 = _mm512_maddubs_epi16(z1, load64(y[ib].qs + 128 * hf + 64));
            isum = _mm512_dpwssd_epi32(isum, p0, perm_scales4(sc16, 8 * hf));
            isum = _mm512_dpwssd_epi32(isum, p1, perm_scales4(sc16, 8 * hf + 4));
        }
        acc = _mm512_fmadd_ps(_mm512_set1_ps(y[ib].d * f16(x[ib].d)), _mm512_cvtepi32_ps(isum), acc);
    }
    *s = _mm512_reduce_add_ps(acc);
}

/* IQ4_XS: the table offset by +128 makes the weights unsigned for vpdpbusd;
 * the extra 128 * sum(y) per sub-block is removed with the bsums. Scales:
 * byte j of pdep(scales_l, 0x0f..) is the low nibble of scale j, and
 * pdep(scales_h, 0x30..) puts its 2 high bits at bits 4..5. */
static void dot_iq4_xs(int n, float *s, const void *w, const void *a) {
    const block_iq4_xs *x = w;
    const block_q8_K *y = a;
    int8_t lut_u[16];
    for (int i = 0; i < 16; i++) lut_u[i] = (int8_t)(kvalues_iq4nl[i] + 128);
    const __m512i lut = _mm512_broadcast_i32x4(_mm_loadu_si128((const __m128i *)lut_u));
    const __m512i m4 = _mm512_set1_epi8(0x0f);
    const __m512i idx_lo = _mm512_set_epi32(3, 3, 3, 3, 2, 2, 2, 2, 1, 1, 1, 1, 0, 0, 0, 0);
    const __m512i idx_hi = _mm512_add_epi32(idx_lo, _mm512_set1_epi32(4));
    __m512 acc = _mm512_setzero_ps();
    for (int ib = 0; ib < n / QK_K; ib++) {
        uint32_t sl;
        memcpy(&sl, x[ib].scales_l, 4);
        uint64_t ls8 = _pdep_u64(sl, 0x0f0f0f0f0f0f0f0full) | _pdep_u64(x[ib].scales_h, 0x3030303030303030ull);
        __m128i ls = _mm_sub_epi16(_mm_cvtepu8_epi16(_mm_cvtsi64_si128((long long)ls8)), _mm_set1_epi16(32));
        /* correction: 128 * sum_j ls_j * (bsum_2j + bsum_2j+1) */
        __m256i ls_dup = _mm256_cvtepu8_epi16(_mm_unpacklo_epi8(_mm_cvtsi64_si128((long long)ls8),
                                                                _mm_cvtsi64_si128((long long)ls8)));
        ls_dup = _mm256_sub_epi16(ls_dup, _mm256_set1_epi16(32));
        __m256i corr = _mm256_madd_epi16(ls_dup, load32(y[ib].bsums));
        __m512i isum = _mm512_sub_epi32(_mm512_setzero_si512(), _mm512_zextsi256_si512(_mm256_slli_epi32(corr, 7)));
        __m512i ls32 = _mm512_castsi256_si512(_mm256_cvtepi16_epi32(ls));
        for (int h = 0; h < 2; h++) {
            /* 64 bytes = sub-blocks 4h..4h+3 (16 bytes each: low nibbles weights 0..15,
             * high 16..31); the y halves are regrouped to match */
            __m512i q = load64(x[ib].qs + 64 * h);
            __m512i ulo = _mm512_shuffle_epi8(lut, _mm512_and_si512(q, m4));
            __m512i uhi = _mm512_shuffle_epi8(lut, _mm512_and_si512(_mm512_srli_epi16(q, 4), m4));
            __m512i y0 = load64(y[ib].qs + 128 * h), y1 = load64(y[ib].qs + 128 * h + 64);
            __m512i ylo = _mm512_shuffle_i64x2(y0, y1, _MM_SHUFFLE(2, 0, 2, 0));
            __m512i yhi = _mm512_shuffle_i64x2(y0, y1, _MM_SHUFFLE(3, 1, 3, 1));
            __m512i p = _mm512_dpbusd_epi32(_mm512_setzero_si512(), ulo, ylo);
            p = _mm512_dpbusd_epi32(p, uhi, yhi);
            __m512i lsv = _mm512_permutexvar_epi32(h ? idx_hi : idx_lo, ls32);
            isum = _mm512_add_epi32(isum, _mm512_mullo_epi32(p, lsv));
        }
        acc = _mm512_fmadd_ps(_mm512_set1_ps(y[ib].d * f16(x[ib].d)), _mm512_cvtepi32_ps(isum), acc);
    }
    *s = _mm512_reduce_add_ps(acc);
}

const qt_vec_dot_fn qt_dots_main_avx512[QT_COUNT] = {
    [QT_F32] = dot_f32,   [QT_F16] = dot_f16,   [QT_BF16] = dot_bf16,   [QT_Q8_0] = dot_q8_0,
    [QT_Q4_K] = dot_q4_k, [QT_Q5_K] = dot_q5_k, [QT_Q6_K] = dot_q6_k,   [QT_IQ4_XS] = dot_iq4_xs,
};
