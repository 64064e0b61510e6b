/* The AMX path of the gemm kernels (quant_gemm.h), part of the template in
 * quant_gemm_body.h when quant_gemm_amx.c includes it with QG_AMX 1.
 *
 * One TDPBSSD multiplies 16 tokens x 16 weight rows over one 32-weight unit
 * (8,192 multiply-adds of signed bytes into int32): tile A holds the tokens'
 * quants of the unit as they are (16 rows of 32 bytes, copied once per chunk
 * from the activation rows), tile B the 16 weight rows decoded by qg_decode
 * and interleaved four bytes at a time (row r in dword lane r: the layout
 * TDPBSSD reads, built once per chunk for every token group). Signed times
 * signed: no +128 offset and no correction term, the integer sum is exact.
 * Each unit has its own scales, so the unit's 16 x 16 sums leave the tile
 * (TILESTORED to L1) and are scaled in float as qg_micro16 scales its
 * vpdpbusd sums: acc[t] += float(P) * (dw * da[t]), and the min term
 * mw * sa[t] once per unit; a token's 16 outputs are 16 consecutive floats
 * of y. So the float work per unit (a convert, a multiply and one or two
 * FMAs per token and 16 rows) is what bounds this path, not the tile unit.
 *
 * Tiles: 0 = C (16 tokens x 16 int32), 1 = A (16 x 32 bytes), 2 = B (8 x 64
 * bytes), and 3-5 the same again (two units in flight); 6 and 7 are Q6_K's
 * half-unit A and B (below). A thread loads that configuration on its first call
 * (qg_amx_config); the OS permission to use the tile state was asked for by
 * the ISA detection (quant_dot.c), which hands out QT_ISA_AMX only then. */
#ifndef STRATA_QUANT_QUANT_GEMM_AMX_H
#define STRATA_QUANT_QUANT_GEMM_AMX_H

/* Fewer tokens than this take the AVX-512 path: a padded tile multiplies
 * zeros, and below a few tokens the float work per real token is the same. */
#define QG_AMX_MIN_TOK 8
#define QG_AMX_TOKS    QT_GEMM_AMX_MAX_TOK

typedef struct {
    uint8_t palette, start_row;
    uint8_t reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
} qg_tilecfg;

static __thread int qg_amx_configured;

QG_INLINE void qg_amx_config(void) {
    if (qg_amx_configured) return;
    qg_tilecfg c;
    memset(&c, 0, sizeof c);
    c.palette = 1;
    c.colsb[0] = 64, c.rows[0] = 16; /* C: 16 tokens x 16 rows, int32 */
    c.colsb[1] = 32, c.rows[1] = 16; /* A: 16 tokens x one unit's 32 quants */
    c.colsb[2] = 64, c.rows[2] = 8;  /* B: 8 groups of 4 weights x 16 rows */
    for (int i = 3; i < 6; i++) c.colsb[i] = c.colsb[i - 3], c.rows[i] = c.rows[i - 3]; /* a second set */
    c.colsb[6] = 16, c.rows[6] = 16; /* Q6_K's A: 16 tokens x the 16 quants of half a unit */
    c.colsb[7] = 64, c.rows[7] = 4;  /* Q6_K's B: 4 groups of 4 weights x 16 rows */
    _tile_loadconfig(&c);
    qg_amx_configured = 1;
}

/* 16 rows' unit (rows[r], 32 bytes each) -> out[j] (64 bytes): lane r =
 * row r's bytes 4j..4j+3. Two 8 x 8 dword transposes side by side (rows 0-7
 * in the low 256 bits, 8-15 in the high), in-lane unpacks then one
 * two-source permute per output. */
QG_INLINE void qg_amx_interleave(const int8_t (*rows)[32], int8_t (*out)[64]) {
    __m512i z[8], t[8], u[8];
    for (int i = 0; i < 8; i++)
        z[i] = _mm512_inserti64x4(_mm512_castsi256_si512(qg_load(rows[i])), qg_load(rows[i + 8]), 1);
    for (int i = 0; i < 4; i++) {
        t[2 * i] = _mm512_unpacklo_epi32(z[2 * i], z[2 * i + 1]);     /* per 128 bits: dwords 0,1 (4,5) */
        t[2 * i + 1] = _mm512_unpackhi_epi32(z[2 * i], z[2 * i + 1]); /* dwords 2,3 (6,7) */
    }
    for (int h = 0; h < 2; h++) { /* rows 0-3 (h 0) and 4-7 (h 1) of each half */
        const __m512i *s = t + 4 * h;
        u[4 * h + 0] = _mm512_unpacklo_epi64(s[0], s[2]); /* dword 0 (4) of 4 rows */
        u[4 * h + 1] = _mm512_unpackhi_epi64(s[0], s[2]); /* dword 1 (5) */
        u[4 * h + 2] = _mm512_unpacklo_epi64(s[1], s[3]); /* dword 2 (6) */
        u[4 * h + 3] = _mm512_unpackhi_epi64(s[1], s[3]); /* dword 3 (7) */
    }
    const __m512i lo = _mm512_set_epi64(13, 12, 5, 4, 9, 8, 1, 0), hi = _mm512_set_epi64(15, 14, 7, 6, 11, 10, 3, 2);
    for (int d = 0; d < 4; d++) {
        _mm512_store_si512(out[d], _mm512_permutex2var_epi64(u[d], lo, u[4 + d]));
        _mm512_store_si512(out[d + 4], _mm512_permutex2var_epi64(u[d], hi, u[4 + d]));
    }
}

/* 16 decoded rows of one chunk, in TDPBSSD's B layout */
typedef struct {
    int8_t w[QG_CHUNK][8][64] __attribute__((aligned(64)));
    float dw[QG_CHUNK][16] __attribute__((aligned(64)));
    float mw[QG_CHUNK][16] __attribute__((aligned(64)));
} qg_amx_wblk;

/* the chunk's tokens: quants (the A tile of tokens 16g.. and unit k is
 * q[g][k], 512 contiguous bytes) and scales */
typedef struct {
    int8_t q[QG_AMX_TOKS / 16][QG_CHUNK][16][32] __attribute__((aligned(64)));
    float da[QG_CHUNK][QG_AMX_TOKS] __attribute__((aligned(64)));
    float sa[QG_CHUNK][QG_AMX_TOKS] __attribute__((aligned(64)));
} qg_amx_tblk;

/* One unit on tile set C, A, B (numbers: the intrinsics paste them into
 * the instruction): C = A . B, stored to c. */
#define QG_AMX_UNIT(C, A, B, a, b, c)                                                                                  \
    do {                                                                                                               \
        _tile_zero(C);                                                                                                 \
        _tile_loadd(A, a, 32);                                                                                         \
        _tile_loadd(B, b, 64);                                                                                         \
        _tile_dpbssd(C, A, B);                                                                                         \
        _tile_stored(C, c, 64);                                                                                        \
    } while (0)

/* The tile intrinsics are asm statements that tell the compiler nothing of
 * the memory they read and write: a barrier orders them against the C
 * code's stores (the tiles' sources) and loads (the sums). */
#define QG_AMX_FENCE() __asm__ volatile("" ::: "memory")

/* Units per round: their sums (1 KiB each) stay in L1 with the round's A
 * and B tiles; sums for a whole chunk (32 KiB) pushed the tiles out of L1
 * and took 2.4x as long per unit (measured). */
#define QG_AMX_ROUND 16

/* tokens t0..t0+nt-1 (nt <= 16) x the 16 rows of b over the chunk's cu
 * units: per round the tile products (two tile sets taking turns, so that
 * one unit's product overlaps the other's store), then their float work. */
QG_INLINE void qg_amx_micro(const int f, int cu, const qg_amx_wblk *b, const qg_amx_tblk *t, int t0, int nt, float *y,
                            size_t ldy, int first) {
    int32_t cs[QG_AMX_ROUND][16][16] __attribute__((aligned(64)));
    __m512 acc[16];
    _Pragma("GCC unroll 16") for (int c = 0; c < 16; c++) acc[c] = _mm512_setzero_ps();
    for (int k0 = 0; k0 < cu; k0 += QG_AMX_ROUND) {
        const int nk = cu - k0 < QG_AMX_ROUND ? cu - k0 : QG_AMX_ROUND;
        int k = 0;
        for (; k + 2 <= nk; k += 2) {
            QG_AMX_UNIT(0, 1, 2, t->q[t0 / 16][k0 + k], b->w[k0 + k], cs[k]);
            QG_AMX_UNIT(3, 4, 5, t->q[t0 / 16][k0 + k + 1], b->w[k0 + k + 1], cs[k + 1]);
        }
        if (k < nk) QG_AMX_UNIT(0, 1, 2, t->q[t0 / 16][k0 + k], b->w[k0 + k], cs[k]);
        QG_AMX_FENCE();
        for (k = 0; k < nk; k++) {
            const __m512 dw = _mm512_load_ps(b->dw[k0 + k]);
            const float *da = t->da[k0 + k] + t0, *sa = t->sa[k0 + k] + t0;
            _Pragma("GCC unroll 16") for (int c = 0; c < 16; c++) {
                acc[c] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_load_si512(cs[k][c])),
                                         _mm512_mul_ps(dw, _mm512_set1_ps(da[c])), acc[c]);
                if (qg_has_min(f))
                    acc[c] = _mm512_fmadd_ps(_mm512_load_ps(b->mw[k0 + k]), _mm512_set1_ps(sa[c]), acc[c]);
            }
        }
        QG_AMX_FENCE();
    }
    for (int c = 0; c < nt; c++) {
        float *o = y + (size_t)(t0 + c) * ldy;
        _mm512_storeu_ps(o, first ? acc[c] : _mm512_add_ps(_mm512_loadu_ps(o), acc[c]));
    }
}

/* nr a multiple of 16, QG_AMX_MIN_TOK <= nc <= QT_GEMM_AMX_MAX_TOK */
QG_INLINE void qg_run_amx(const int f, int n, int nr, int nc, const void *wv, size_t ws, const void *const *actv,
                          float *y, size_t ldy) {
    const uint8_t *const *act = (const uint8_t *const *)actv;
    qg_amx_tblk t; /* 320 KiB (L2): pool threads have 8 MiB stacks */
    qg_amx_wblk b;
    qg_wrow tmp;
    int8_t rows[QG_CHUNK][16][32] __attribute__((aligned(64)));
    qg_amx_config();
    const int n_units = n / 32, ncp = (nc + 15) / 16 * 16;
    for (int u0 = 0; u0 < n_units; u0 += QG_CHUNK) {
        const int cu = n_units - u0 < QG_CHUNK ? n_units - u0 : QG_CHUNK;
        const int first = u0 == 0;
        for (int c = 0; c < ncp; c++)
            for (int gi = 0; gi * 8 < cu; gi++) {
                const int g = cu - 8 * gi < 8 ? cu - 8 * gi : 8;
                if (c >= nc) { /* a padding token: zeros, computed on and not written */
                    for (int k = 0; k < g; k++) {
                        memset(t.q[c / 16][8 * gi + k][c % 16], 0, 32);
                        t.da[8 * gi + k][c] = t.sa[8 * gi + k][c] = 0.0f;
                    }
                    continue;
                }
                qg_tgrp tg;
                qg_prep(f, act[c], u0 + 8 * gi, g, &tg, NULL, 0, gi);
                for (int k = 0; k < g; k++) {
                    memcpy(t.q[c / 16][8 * gi + k][c % 16], qg_act(f, act[c], u0 + 8 * gi + k), 32);
                    t.da[8 * gi + k][c] = tg.da[k];
                    t.sa[8 * gi + k][c] = qg_has_min(f) ? tg.sa[k] : 0.0f;
                }
            }
        const uint8_t *w = wv;
        for (int r0 = 0; r0 < nr; r0 += 16, w += (size_t)16 * ws) {
            for (int r = 0; r < 16; r++) {
                for (int gi = 0; gi * 8 < cu; gi++)
                    qg_decode(f, 0, w + (size_t)r * ws, u0 + 8 * gi, cu - 8 * gi < 8 ? cu - 8 * gi : 8, &tmp, gi);
                for (int k = 0; k < cu; k++) {
                    memcpy(rows[k][r], tmp.q[k], 32);
                    b.dw[k][r] = tmp.dw[k / 8][k % 8];
                    b.mw[k][r] = qg_has_min(f) ? tmp.mw[k / 8][k % 8] : 0.0f;
                }
            }
            for (int k = 0; k < cu; k++) qg_amx_interleave(rows[k], b.w[k]);
            QG_AMX_FENCE(); /* t and b written: the tiles read them */
            for (int c = 0; c < nc; c += 16)
                qg_amx_micro(f, cu, &b, &t, c, nc - c < 16 ? nc - c : 16, y + r0, ldy, first);
        }
    }
}

/* ---- Q6_K ----
 * Q6_K's 16-weight sub-blocks each have an int8 scale, so a unit's two
 * halves are two products over K = 16: tile 6 holds the 16 tokens' quants
 * of the half (bytes 16h.. of each 32-byte row of the A block), tile 7 the
 * half's 4 dwords of the 16 interleaved rows of signed weights q - 32 (the
 * layout above), into C tiles 0 and 3; each half's sums are scaled by its
 * rows' d * sc in float. Per unit and 16 tokens: two tile products and two
 * convert-multiply-FMAs per token, for 16 rows. Fewer tokens than
 * QG_AMX_MIN_TOK: qg_run16_q6, the same integers from vpdpbusd and the same
 * float operations in the same order, so that an output's bits do not
 * depend on how its tokens were batched (test_gemm.c's batching test). */

typedef struct {
    int8_t w[QG_CHUNK][8][64] __attribute__((aligned(64))); /* unit k, dword j: lane r = row r's q - 32, bytes 4j.. */
    float dw[QG_CHUNK][2][16] __attribute__((aligned(64))); /* half h of unit k: d * sc per row */
} qg_q6_wblk;

/* 16 rows (w, stride ws) over units u0..u0+cu-1: whole super-blocks */
QG_INLINE void qg_q6_wdecode(const uint8_t *w, size_t ws, int u0, int cu, qg_q6_wblk *b) {
    int8_t rows[QG_CHUNK][16][32] __attribute__((aligned(64)));
    for (int r = 0; r < 16; r++)
        for (int s = 0; s < cu / 8; s++) {
            const block_q6_K *x = (const block_q6_K *)(w + (size_t)r * ws) + u0 / 8 + s;
            qg_q6sb o;
            qg_q6_decode(x, &o);
            for (int k = 0; k < 8; k++) {
                _mm256_store_si256((__m256i *)rows[8 * s + k][r],
                                   _mm256_sub_epi8(_mm256_load_si256((const __m256i *)o.q[k]), _mm256_set1_epi8(32)));
                b->dw[8 * s + k][0][r] = o.d * (float)x->scales[2 * k];
                b->dw[8 * s + k][1][r] = o.d * (float)x->scales[2 * k + 1];
            }
        }
    for (int k = 0; k < cu; k++) qg_amx_interleave(rows[k], b->w[k]);
}

/* Units per round of the Q6_K path: two 1 KiB sum blocks per unit, so half
 * QG_AMX_ROUND keeps the round's sums at 16 KiB of L1 as above. */
#define QG_AMX_Q6_ROUND (QG_AMX_ROUND / 2)

/* One half of a unit: C = A . B over 16 quants, stored to c. */
#define QG_AMX_HALF(C, a, b, c)                                                                                        \
    do {                                                                                                               \
        _tile_zero(C);                                                                                                 \
        _tile_loadd(6, a, 32);                                                                                         \
        _tile_loadd(7, b, 64);                                                                                         \
        _tile_dpbssd(C, 6, 7);                                                                                         \
        _tile_stored(C, c, 64);                                                                                        \
    } while (0)

/* the float work of one unit for 16 rows and one token: both halves, half 0 first */
QG_INLINE __m512 qg_q6_fma(__m512 acc, __m512i p0, __m512i p1, __m512 dw0, __m512 dw1, float da) {
    acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(p0), _mm512_mul_ps(dw0, _mm512_set1_ps(da)), acc);
    return _mm512_fmadd_ps(_mm512_cvtepi32_ps(p1), _mm512_mul_ps(dw1, _mm512_set1_ps(da)), acc);
}

/* tokens t0..t0+nt-1 (nt <= 16) x the 16 rows of b over the chunk's cu units */
QG_INLINE void qg_amx_q6_micro(int cu, const qg_q6_wblk *b, const qg_amx_tblk *t, int t0, int nt, float *y, size_t ldy,
                               int first) {
    int32_t cs[QG_AMX_Q6_ROUND][2][16][16] __attribute__((aligned(64)));
    __m512 acc[16];
    _Pragma("GCC unroll 16") for (int c = 0; c < 16; c++) acc[c] = _mm512_setzero_ps();
    for (int k0 = 0; k0 < cu; k0 += QG_AMX_Q6_ROUND) {
        const int nk = cu - k0 < QG_AMX_Q6_ROUND ? cu - k0 : QG_AMX_Q6_ROUND;
        for (int k = 0; k < nk; k++) {
            const int8_t *a = t->q[t0 / 16][k0 + k][0];
            QG_AMX_HALF(0, a, b->w[k0 + k][0], cs[k][0]);
            QG_AMX_HALF(3, a + 16, b->w[k0 + k][4], cs[k][1]);
        }
        QG_AMX_FENCE();
        for (int k = 0; k < nk; k++) {
            const __m512 dw0 = _mm512_load_ps(b->dw[k0 + k][0]), dw1 = _mm512_load_ps(b->dw[k0 + k][1]);
            const float *da = t->da[k0 + k] + t0;
            _Pragma("GCC unroll 16") for (int c = 0; c < 16; c++) acc[c] =
                qg_q6_fma(acc[c], _mm512_load_si512(cs[k][0][c]), _mm512_load_si512(cs[k][1][c]), dw0, dw1, da[c]);
        }
        QG_AMX_FENCE();
    }
    for (int c = 0; c < nt; c++) {
        float *o = y + (size_t)(t0 + c) * ldy;
        _mm512_storeu_ps(o, first ? acc[c] : _mm512_add_ps(_mm512_loadu_ps(o), acc[c]));
    }
}

/* quants of unit u of a Q8_K activation row, and its d */
QG_INLINE const int8_t *qg_q6_act(const uint8_t *act, int u, float *d) {
    const block_q8_K *y = (const block_q8_K *)act + u / 8;
    *d = y->d;
    return y->qs + 32 * (u % 8);
}

/* nr a multiple of 16, QG_AMX_MIN_TOK <= nc <= QT_GEMM_AMX_MAX_TOK */
QG_INLINE void qg_run_amx_q6(int n, int nr, int nc, const void *wv, size_t ws, const void *const *actv, float *y,
                             size_t ldy) {
    const uint8_t *const *act = (const uint8_t *const *)actv;
    qg_amx_tblk t; /* its sa is not read */
    qg_q6_wblk b;
    qg_amx_config();
    const int n_units = n / 32, ncp = (nc + 15) / 16 * 16;
    for (int u0 = 0; u0 < n_units; u0 += QG_CHUNK) {
        const int cu = n_units - u0 < QG_CHUNK ? n_units - u0 : QG_CHUNK;
        for (int c = 0; c < ncp; c++)
            for (int k = 0; k < cu; k++) {
                float d = 0.0f;
                if (c < nc) memcpy(t.q[c / 16][k][c % 16], qg_q6_act(act[c], u0 + k, &d), 32);
                else memset(t.q[c / 16][k][c % 16], 0, 32); /* a padding token: computed on, not written */
                t.da[k][c] = d;
            }
        const uint8_t *w = wv;
        for (int r0 = 0; r0 < nr; r0 += 16, w += (size_t)16 * ws) {
            qg_q6_wdecode(w, ws, u0, cu, &b);
            QG_AMX_FENCE(); /* t and b written: the tiles read them */
            for (int c = 0; c < nc; c += 16)
                qg_amx_q6_micro(cu, &b, &t, c, nc - c < 16 ? nc - c : 16, y + r0, ldy, u0 == 0);
        }
    }
}

/* The same products for nc < QG_AMX_MIN_TOK on AVX-512 VNNI: per (token,
 * unit, half) the 16 rows' sums from 4 vpdpbusd of the weights as unsigned
 * w + 128 against the token's dwords, started at -128 * the half's quant
 * sum (Q8_K's bsums are those sums): the tile's integers exactly. */
QG_INLINE void qg_run16_q6(int n, int nr, int nc, const void *wv, size_t ws, const void *const *actv, float *y,
                           size_t ldy) {
    const uint8_t *const *act = (const uint8_t *const *)actv;
    qg_q6_wblk b;
    const int n_units = n / 32;
    for (int u0 = 0; u0 < n_units; u0 += QG_CHUNK) {
        const int cu = n_units - u0 < QG_CHUNK ? n_units - u0 : QG_CHUNK;
        const uint8_t *w = wv;
        for (int r0 = 0; r0 < nr; r0 += 16, w += (size_t)16 * ws) {
            qg_q6_wdecode(w, ws, u0, cu, &b);
            for (int c = 0; c < nc; c++) {
                __m512 acc = _mm512_setzero_ps();
                for (int k = 0; k < cu; k++) {
                    float da;
                    const int8_t *a = qg_q6_act(act[c], u0 + k, &da);
                    const int16_t *bs = ((const block_q8_K *)act[c])[(u0 + k) / 8].bsums + 2 * ((u0 + k) % 8);
                    __m512i p[2];
                    for (int h = 0; h < 2; h++) {
                        p[h] = _mm512_set1_epi32(-128 * bs[h]);
                        _Pragma("GCC unroll 4") for (int j = 4 * h; j < 4 * h + 4; j++) {
                            int32_t a4;
                            memcpy(&a4, a + 4 * j, 4);
                            const __m512i wu =
                                _mm512_xor_si512(_mm512_load_si512(b.w[k][j]), _mm512_set1_epi8((char)0x80));
                            p[h] = _mm512_dpbusd_epi32(p[h], wu, _mm512_set1_epi32(a4));
                        }
                    }
                    acc = qg_q6_fma(acc, p[0], p[1], _mm512_load_ps(b.dw[k][0]), _mm512_load_ps(b.dw[k][1]), da);
                }
                float *o = y + (size_t)c * ldy + r0;
                _mm512_storeu_ps(o, u0 == 0 ? acc : _mm512_add_ps(_mm512_loadu_ps(o), acc));
            }
        }
    }
}

/* qt_int8_rate's AMX loop (quant_gemm_impl.h): tdpbssd on the kernels' tile
 * shapes (tiles 0-2 and 3-5: C, 16 x 16 int32, += A, 16 tokens x 32 quants,
 * times B), two accumulators, nothing stored until the end: 16 x 16 x 32
 * multiply-adds per instruction. */
uint64_t qt_peak_amx(int64_t iters) {
    static const int8_t zero[16 * 64] __attribute__((aligned(64)));
    int32_t sink[16 * 16] __attribute__((aligned(64)));
    qg_amx_config();
    _tile_zero(0);
    _tile_zero(3);
    _tile_loadd(1, zero, 32);
    _tile_loadd(2, zero, 64);
    _tile_loadd(4, zero, 32);
    _tile_loadd(5, zero, 64);
    for (int64_t i = 0; i < iters; i++) {
        _tile_dpbssd(0, 1, 2);
        _tile_dpbssd(3, 4, 5);
    }
    _tile_stored(0, sink, 64);
    _tile_stored(3, sink, 64);
    QG_AMX_FENCE();
    return (uint64_t)iters * 2 * 16 * 16 * 32;
}

#endif
