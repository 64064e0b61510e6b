/* Dot products of IQ2_XXS, IQ2_XS, IQ3_XXS and IQ3_S with Q8_K activations,
 * the grid held in registers: the AVX-512 path plus VBMI (vpermb,
 * vpmultishiftqb), built with -mavx512vbmi (cmake/isa.cmake) and handed out
 * by quant_dot.c only where cpuid reports VBMI, on Intel, for the formats
 * where they beat the gathers (regs_wins; STRATA_IQ_GRID overrides).
 *
 * A grid row is 8 (IQ2) or 4 (IQ3) bytes drawn from 3 (IQ2) or 8 (IQ3)
 * levels, so it packs into 16 bits: the 256-row grids are 512 bytes = 8 zmm,
 * the 512-row ones 16 zmm, loaded once per call. Per block:
 *   - IQ2: vpermt2w over register pairs looks up 64 rows of 16-bit codes at a
 *     time for the block's 32 indices (one int16 lane each; index bits
 *     0..5); masked blends on bits 6, 7 (and 8) pick the pair: 4 permutes +
 *     3 blends for 256 rows, 8 + 7 for 512. A code is two bit planes per row
 *     ([level >= 1], [level >= 2] for each byte), read back as byte masks:
 *     the weights of a step are two masked moves between the level values;
 *   - IQ3: the 64 indices as bytes; the code's low and high bytes each from
 *     a 256-byte table in 4 zmm (2 vpermt2b + a blend on bit 7), unpacked
 *     into words; per step vpermt2d puts a row pair's codes in the qword of
 *     its 8 weights,
 *     vpmultishiftqb aligns each byte's 3-bit field (byte j of a qword reads
 *     bits off_j..off_j+7), and vpermb maps it to the level's value (a
 *     64-entry table repeating every 8: the bits above need no mask);
 *   - IQ2_XXS/IQ3_XXS signs: the 7-bit sign indices to bytes by
 *     vpmultishiftqb, then ksigns_iq2xs by one vpermt2b (signs32).
 * Signs, scales and accumulation are those of quant_dot_iq_avx512.c, in the
 * same lane order and the same float operations, so the results are bit for
 * bit those of the gather kernels (tests/quant/test_dot.c checks it).
 *
 * The codes and level tables are derived once, at the first call, from the
 * canonical grids in iq_tables.h (distinct byte values, sorted), and a grid
 * whose rows do not fit the code (more levels) stops at an ST_ASSERT.
 */
#include <pthread.h>

#include "core/log.h"
#include "quant/dot_impl.h"
#include "quant/iq_tables.h"
#include "quant/quant_dot_iq_avx512.h"

typedef struct {
    /* IQ2: per row, bit j of the low byte = [level of byte j >= 1], of the high byte [>= 2] */
    uint16_t c2xxs[256], c2xs[512];
    uint8_t l2xxs[3], l2xs[3]; /* the 3 levels, ascending */
    /* IQ3: per row, level numbers of bytes 0..3 at bits 3j.. of a 12-bit
     * code, kept as its low bytes (lo) and high bytes (hi) for vpermt2b */
    uint8_t lo3xxs[256], hi3xxs[256], lo3s[512], hi3s[512];
    uint8_t v3xxs[64], v3s[64]; /* vpermb: level number (low 3 bits) -> value */
    uint32_t place3[4][16];     /* vpermt2d over (w0, w1), IQ3 step k: qword j <- codes of rows 16k+2j, +1 */
    uint8_t shift3[64];         /* byte j <- bits 3j.. (j < 4), 16 + 3(j-4).. (j >= 4) */
    uint8_t ixxs[64];           /* vpermb: IQ2_XXS grid byte of group r (byte 8(r/4) + r%4) -> word lane r */
    uint8_t planes[64];         /* vpermb: IQ2 codes -> the 32 low bytes, then the 32 high bytes */
    uint8_t sgn7[32];           /* vpmultishiftqb: 7-bit sign index l of aux dword m (bits 7l..) -> byte 4m+l */
} reg_tables;

static reg_tables g_t __attribute__((aligned(64)));
static pthread_once_t g_once = PTHREAD_ONCE_INIT;

/* The sorted distinct values of n bytes (at most max of them); returns their count. */
static int levels_of(const uint8_t *b, int n, uint8_t *lv, int max) {
    int nl = 0;
    for (int i = 0; i < n; i++) {
        int j = 0;
        while (j < nl && lv[j] < b[i]) j++;
        if (j < nl && lv[j] == b[i]) continue;
        ST_ASSERT(nl < max);
        memmove(lv + j + 1, lv + j, (size_t)(nl - j));
        lv[j] = b[i];
        nl++;
    }
    return nl;
}

/* The levels of a grid of rows*per bytes (row r = bytes per*r..,
 * little-endian: element j of a row is byte j) and the level number of each byte. */
static void grid_levels(const void *grid, int rows, int per, int nlev, uint8_t *lv) {
    uint8_t all[8];
    ST_ASSERT(levels_of(grid, rows * per, all, 8) == nlev);
    memcpy(lv, all, (size_t)nlev);
}

static int level_of(const uint8_t *lv, uint8_t b) {
    int l = 0;
    while (lv[l] != b) l++;
    return l;
}

/* IQ2 (8 bytes a row, 3 levels): the two bit planes [level >= 1], [level >= 2]. */
static void build_iq2(const uint64_t *grid, int rows, uint16_t *code, uint8_t *lv) {
    grid_levels(grid, rows, 8, 3, lv);
    const uint8_t *b = (const uint8_t *)grid;
    for (int r = 0; r < rows; r++) {
        unsigned c = 0;
        for (int j = 0; j < 8; j++) {
            const int l = level_of(lv, b[8 * r + j]);
            c |= (unsigned)(l >= 1) << j | (unsigned)(l >= 2) << (8 + j);
        }
        code[r] = (uint16_t)c;
    }
}

/* IQ3 (4 bytes a row, 8 levels): 3-bit level numbers, and the vpermb value table. */
static void build_iq3(const uint32_t *grid, int rows, uint8_t *lo, uint8_t *hi, uint8_t *vtab) {
    uint8_t lv[8];
    grid_levels(grid, rows, 4, 8, lv);
    const uint8_t *b = (const uint8_t *)grid;
    for (int r = 0; r < rows; r++) {
        unsigned c = 0;
        for (int j = 0; j < 4; j++) c |= (unsigned)level_of(lv, b[4 * r + j]) << (3 * j);
        lo[r] = (uint8_t)c;
        hi[r] = (uint8_t)(c >> 8);
    }
    for (int i = 0; i < 64; i++) vtab[i] = lv[i & 7];
}

static void build_tables(void) {
    build_iq2(iq2xxs_grid, 256, g_t.c2xxs, g_t.l2xxs);
    build_iq2(iq2xs_grid, 512, g_t.c2xs, g_t.l2xs);
    build_iq3(iq3xxs_grid, 256, g_t.lo3xxs, g_t.hi3xxs, g_t.v3xxs);
    build_iq3(iq3s_grid, 512, g_t.lo3s, g_t.hi3s, g_t.v3s);
    /* unpacking (lo, hi) makes 128-bit lane k of w0 the codes of rows 16k..16k+7 and
     * of w1 rows 16k+8..: qword j of step k takes dword 4k+j of w0 (j < 4) or
     * 4k+j-4 of w1 (index + 16); its high dword is not read */
    for (int k = 0; k < 4; k++)
        for (int j = 0; j < 8; j++)
            g_t.place3[k][2 * j] = g_t.place3[k][2 * j + 1] = (uint32_t)(j < 4 ? 4 * k + j : 16 + 4 * k + j - 4);
    for (int i = 0; i < 64; i++) {
        const int j = i & 7;
        g_t.shift3[i] = (uint8_t)(j < 4 ? 3 * j : 16 + 3 * (j - 4));
    }
    /* by byte: word lane r's low byte (byte 2r) takes group r's index; high bytes 0 */
    for (int r = 0; r < 32; r++) {
        g_t.ixxs[2 * r] = (uint8_t)(8 * (r / 4) + r % 4);
        g_t.planes[r] = (uint8_t)(2 * r);
        g_t.planes[32 + r] = (uint8_t)(2 * r + 1);
        g_t.sgn7[r] = (uint8_t)(32 * ((r / 4) & 1) + 7 * (r % 4));
    }
}

static inline __m512i ld(const void *p) { return _mm512_loadu_si512(p); }

/* 32 codes from a 256-row table in 8 registers; idx: row in bits 0..7 of each int16 lane. */
static inline __m512i lookup256(const __m512i *tab, __m512i idx) {
    const __mmask32 b6 = _mm512_test_epi16_mask(idx, _mm512_set1_epi16(0x40));
    const __mmask32 b7 = _mm512_test_epi16_mask(idx, _mm512_set1_epi16(0x80));
    const __m512i r0 = _mm512_permutex2var_epi16(tab[0], idx, tab[1]);
    const __m512i r1 = _mm512_permutex2var_epi16(tab[2], idx, tab[3]);
    const __m512i r2 = _mm512_permutex2var_epi16(tab[4], idx, tab[5]);
    const __m512i r3 = _mm512_permutex2var_epi16(tab[6], idx, tab[7]);
    return _mm512_mask_blend_epi16(b7, _mm512_mask_blend_epi16(b6, r0, r1), _mm512_mask_blend_epi16(b6, r2, r3));
}

/* 64 bytes from a 256-byte table in 4 registers: vpermt2b covers 128
 * entries (index bits 0..6), a blend on bit 7 picks the half. */
static inline __m512i lookup256b(const __m512i *tab, __m512i idx, __mmask64 b7) {
    return _mm512_mask_blend_epi8(b7, _mm512_permutex2var_epi8(tab[0], idx, tab[1]),
                                  _mm512_permutex2var_epi8(tab[2], idx, tab[3]));
}

/* 64 IQ3 weight values of step k from the block's codes (w0, w1: the low and
 * high code bytes unpacked into words): vpermt2d places each row pair's codes
 * in a qword (one operation; vpermt2b measured twice its cost here),
 * multishift aligns the 3-bit fields, vpermb maps them to values. */
static inline __m512i iq3_expand(__m512i w0, __m512i w1, __m512i place, __m512i shift, __m512i vtab) {
    return _mm512_permutexvar_epi8(_mm512_multishift_epi64_epi8(shift, _mm512_permutex2var_epi32(w0, place, w1)), vtab);
}

/* IQ2's 32 codes -> pl[k] = the [level >= 1] bits of step k's 64 weights,
 * pl[4 + k] the [level >= 2] bits: byte masks for two blends per step. */
static inline void iq2_planes(__m512i codes, __m512i planes, uint64_t pl[8]) {
    _mm512_storeu_si512(pl, _mm512_permutexvar_epi8(planes, codes));
}

static inline __m512i iq2_weights(const uint64_t pl[8], int k, const __m512i v[3]) {
    return _mm512_mask_mov_epi8(_mm512_mask_blend_epi8(pl[k], v[0], v[1]), pl[4 + k], v[2]);
}

/* The 32 sign bytes of a block (group 4m+l at byte 4m+l) from its 8 aux
 * dwords (4 x 7-bit sign indices each): the fields aligned by
 * vpmultishiftqb, looked up in ksigns_iq2xs (2 zmm; vpermt2b reads 7 index
 * bits, so the bit above each field needs no mask). 3 operations where
 * ksigns32's parity rule takes ~17. */
static inline __m256i signs32(__m256i aux, __m256i sgn7, const __m512i ks[2]) {
    const __m256i ix = _mm256_multishift_epi64_epi8(sgn7, aux);
    return _mm512_castsi512_si256(_mm512_permutex2var_epi8(ks[0], _mm512_castsi256_si512(ix), ks[1]));
}

static void dot_iq2_xxs_regs(int n, float *s, const void *w, const void *a) {
    pthread_once(&g_once, build_tables);
    const block_iq2_xxs *x = w;
    const block_q8_K *y = a;
    __m512i tab[8];
    for (int t = 0; t < 8; t++) tab[t] = ld(g_t.c2xxs + 32 * t);
    const __m512i ks[2] = {_mm512_loadu_si512(ksigns_iq2xs), _mm512_loadu_si512(ksigns_iq2xs + 64)};
    const __m512i v[3] = {_mm512_set1_epi8((char)g_t.l2xxs[0]), _mm512_set1_epi8((char)g_t.l2xxs[1]),
                          _mm512_set1_epi8((char)g_t.l2xxs[2])};
    const __m512i ixxs = ld(g_t.ixxs), planes = ld(g_t.planes);
    const __m256i sgn7 = _mm256_loadu_si256((const __m256i *)g_t.sgn7);
    const __m512i odd = _mm512_setr_epi32(1, 3, 5, 7, 9, 11, 13, 15, 1, 3, 5, 7, 9, 11, 13, 15);
    __m512i pidx[4]; /* as quant_dot_iq_avx512.c: lanes 0..15 sub-block 2k's scale, 16..31 2k+1's */
    for (int k = 0; k < 4; k++)
        pidx[k] = _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_set1_epi16((short)(4 * k))),
                                     _mm256_set1_epi16((short)(4 * k + 2)), 1);
    __m512 accf = _mm512_setzero_ps();
    for (int i = 0; i < n / QK_K; i++) {
        const float d = _cvtsh_ss(x[i].d) * y[i].d;
        const __m512i qb = _mm512_loadu_si512(x[i].qs);
        const __m256i aux = _mm512_castsi512_si256(_mm512_permutexvar_epi32(odd, qb));
        const __m256i t = _mm256_srli_epi32(aux, 28);
        const __m512i sc = _mm512_castsi256_si512(_mm256_add_epi32(_mm256_add_epi32(t, t), _mm256_set1_epi32(1)));
        uint64_t sg[4], pl[8];
        _mm256_storeu_si256((__m256i *)sg, signs32(aux, sgn7, ks));
        iq2_planes(lookup256(tab, _mm512_permutexvar_epi8(ixxs, qb)), planes, pl);
        const int8_t *q8 = y[i].qs;
        __m512i acc = _mm512_setzero_si512();
#pragma GCC unroll 8
        for (int k = 0; k < 4; k++) {
            const __m512i q = load_signed(q8 + 64 * k, sg[k]);
            const __m512i p = _mm512_maddubs_epi16(iq2_weights(pl, k, v), q);
            acc = _mm512_dpwssd_epi32(acc, p, _mm512_permutexvar_epi16(pidx[k], sc));
        }
        accf = _mm512_fmadd_ps(_mm512_set1_ps(d), _mm512_cvtepi32_ps(acc), accf);
    }
    *s = 0.125f * _mm512_reduce_add_ps(accf);
}

static void dot_iq2_xs_regs(int n, float *s, const void *w, const void *a) {
    pthread_once(&g_once, build_tables);
    const block_iq2_xs *x = w;
    const block_q8_K *y = a;
    __m512i tab[16];
    for (int t = 0; t < 16; t++) tab[t] = ld(g_t.c2xs + 32 * t);
    const __m512i v[3] = {_mm512_set1_epi8((char)g_t.l2xs[0]), _mm512_set1_epi8((char)g_t.l2xs[1]),
                          _mm512_set1_epi8((char)g_t.l2xs[2])};
    const __m512i planes = ld(g_t.planes);
    const scale_perm sp = perm_per16();
    __m512i pidx[4];
    for (int k = 0; k < 4; k++) pidx[k] = perm_at(sp, k);
    __m512 accf = _mm512_setzero_ps();
    for (int i = 0; i < n / QK_K; i++) {
        const float d = _cvtsh_ss(x[i].d) * y[i].d;
        const __m512i sc = odd_scales_nib16(load_u64(x[i].scales));
        /* 32 uint16: 9-bit grid index | 7-bit sign index << 9; bit 8 picks the half */
        const __m512i idx = _mm512_loadu_si512(x[i].qs);
        const __mmask32 b8 = _mm512_test_epi16_mask(idx, _mm512_set1_epi16(0x100));
        uint64_t pl[8];
        iq2_planes(_mm512_mask_blend_epi16(b8, lookup256(tab, idx), lookup256(tab + 8, idx)), planes, pl);
        const int8_t *q8 = y[i].qs;
        __m512i acc = _mm512_setzero_si512();
#pragma GCC unroll 8
        for (int k = 0; k < 4; k++) {
            const uint64_t sg = _pext_u64(load_u64(x[i].qs + 8 * k), 0xfe00fe00fe00fe00ULL) |
                                (_pext_u64(load_u64(x[i].qs + 8 * k + 4), 0xfe00fe00fe00fe00ULL) << 28);
            const __m512i q = load_signed(q8 + 64 * k, ksigns8(sg));
            const __m512i p = _mm512_maddubs_epi16(iq2_weights(pl, k, v), q);
            acc = _mm512_dpwssd_epi32(acc, p, _mm512_permutexvar_epi16(pidx[k], sc));
        }
        accf = _mm512_fmadd_ps(_mm512_set1_ps(d), _mm512_cvtepi32_ps(acc), accf);
    }
    *s = 0.125f * _mm512_reduce_add_ps(accf);
}

static void dot_iq3_xxs_regs(int n, float *s, const void *w, const void *a) {
    pthread_once(&g_once, build_tables);
    const block_iq3_xxs *x = w;
    const block_q8_K *y = a;
    __m512i tlo[4], thi[4], place[4];
    for (int t = 0; t < 4; t++) {
        tlo[t] = ld(g_t.lo3xxs + 64 * t);
        thi[t] = ld(g_t.hi3xxs + 64 * t);
        place[t] = ld(g_t.place3[t]);
    }
    const __m512i shift = ld(g_t.shift3), vtab = ld(g_t.v3xxs);
    const __m512i ks[2] = {_mm512_loadu_si512(ksigns_iq2xs), _mm512_loadu_si512(ksigns_iq2xs + 64)};
    const __m256i sgn7 = _mm256_loadu_si256((const __m256i *)g_t.sgn7);
    const scale_perm sp = perm_per32(2, 0);
    __m512i pidx[4];
    for (int k = 0; k < 4; k++) pidx[k] = perm_at(sp, k);
    __m512 accf = _mm512_setzero_ps();
    for (int i = 0; i < n / QK_K; i++) {
        const float d = _cvtsh_ss(x[i].d) * y[i].d;
        const __m256i aux = _mm256_loadu_si256((const __m256i *)(x[i].qs + QK_K / 4));
        const __m256i t = _mm256_srli_epi32(aux, 28);
        const __m512i sc = _mm512_zextsi256_si512(_mm256_add_epi32(_mm256_add_epi32(t, t), _mm256_set1_epi32(1)));
        uint64_t sg[4];
        _mm256_storeu_si256((__m256i *)sg, signs32(aux, sgn7, ks));
        /* the 64 grid indices are the first 64 bytes */
        const __m512i idx = _mm512_loadu_si512(x[i].qs);
        const __mmask64 b7 = _mm512_movepi8_mask(idx);
        const __m512i lo = lookup256b(tlo, idx, b7), hi = lookup256b(thi, idx, b7);
        const __m512i w0 = _mm512_unpacklo_epi8(lo, hi), w1 = _mm512_unpackhi_epi8(lo, hi);
        const int8_t *q8 = y[i].qs;
        __m512i acc = _mm512_setzero_si512();
#pragma GCC unroll 8
        for (int k = 0; k < 4; k++) {
            const __m512i g = iq3_expand(w0, w1, place[k], shift, vtab);
            const __m512i q = load_signed(q8 + 64 * k, sg[k]);
            const __m512i p = _mm512_maddubs_epi16(g, q);
            acc = _mm512_dpwssd_epi32(acc, p, _mm512_permutexvar_epi16(pidx[k], sc));
        }
        accf = _mm512_fmadd_ps(_mm512_set1_ps(d), _mm512_cvtepi32_ps(acc), accf);
    }
    *s = 0.25f * _mm512_reduce_add_ps(accf);
}

static void dot_iq3_s_regs(int n, float *s, const void *w, const void *a) {
    pthread_once(&g_once, build_tables);
    const block_iq3_s *x = w;
    const block_q8_K *y = a;
    __m512i tlo[8], thi[8], place[4];
    for (int t = 0; t < 8; t++) {
        tlo[t] = ld(g_t.lo3s + 64 * t);
        thi[t] = ld(g_t.hi3s + 64 * t);
    }
    for (int k = 0; k < 4; k++) place[k] = ld(g_t.place3[k]);
    const __m512i shift = ld(g_t.shift3), vtab = ld(g_t.v3s);
    const scale_perm sp = perm_per16(); /* scales are spread per 32 below: lanes 2ib, 2ib+1 */
    __m512i pidx[4];
    for (int k = 0; k < 4; k++) pidx[k] = perm_at(sp, k);
    __m512 accf = _mm512_setzero_ps();
    for (int i = 0; i < n / QK_K; i++) {
        const float d = _cvtsh_ss(x[i].d) * y[i].d;
        const uint64_t nib = load_u32(x[i].scales);
        const uint64_t dup = _pdep_u64(nib, 0x0f0f0f0f0f0f0f0fULL);
        const __m256i s8 = _mm256_cvtepu8_epi16(
            _mm_unpacklo_epi8(_mm_cvtsi64_si128((long long)dup), _mm_cvtsi64_si128((long long)dup)));
        const __m512i sc = _mm512_zextsi256_si512(_mm256_add_epi16(_mm256_add_epi16(s8, s8), _mm256_set1_epi16(1)));
        /* 9-bit indices: low 8 bits in qs, bit i of the 64-bit qh is index i's 9th bit */
        const __m512i idx = _mm512_loadu_si512(x[i].qs);
        const __mmask64 b7 = _mm512_movepi8_mask(idx), b8 = (__mmask64)load_u64(x[i].qh);
        const __m512i lo = _mm512_mask_blend_epi8(b8, lookup256b(tlo, idx, b7), lookup256b(tlo + 4, idx, b7));
        const __m512i hi = _mm512_mask_blend_epi8(b8, lookup256b(thi, idx, b7), lookup256b(thi + 4, idx, b7));
        const __m512i w0 = _mm512_unpacklo_epi8(lo, hi), w1 = _mm512_unpackhi_epi8(lo, hi);
        const int8_t *q8 = y[i].qs;
        __m512i acc = _mm512_setzero_si512();
#pragma GCC unroll 8
        for (int k = 0; k < 4; k++) {
            const __m512i g = iq3_expand(w0, w1, place[k], shift, vtab);
            const __m512i q = load_signed(q8 + 64 * k, load_u64(x[i].signs + 8 * k));
            const __m512i p = _mm512_maddubs_epi16(g, q);
            acc = _mm512_dpwssd_epi32(acc, p, _mm512_permutexvar_epi16(pidx[k], sc));
        }
        accf = _mm512_fmadd_ps(_mm512_set1_ps(d), _mm512_cvtepi32_ps(acc), accf);
    }
    *s = _mm512_reduce_add_ps(accf);
}

/* Grid-in-registers variants (need VBMI); NULL: the format has none. */
const qt_vec_dot_fn qt_dots_iq_avx512_regs[QT_COUNT] = {
    [QT_IQ2_XXS] = dot_iq2_xxs_regs,
    [QT_IQ2_XS] = dot_iq2_xs_regs,
    [QT_IQ3_XXS] = dot_iq3_xxs_regs,
    [QT_IQ3_S] = dot_iq3_s_regs,
};
