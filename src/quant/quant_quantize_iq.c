/* Reference quantizers from f32, part 3: the lattice i-quants whose grids
 * hold magnitudes with signs stored apart: IQ2_XXS, IQ2_XS, IQ2_S (groups of
 * 8 from {8, 25, 43}), IQ3_XXS and IQ3_S (groups of 4 from 8 levels).
 *
 * Method (ours; a plain search, not ggml's importance-weighted one):
 *  1. Signs come from the weights. IQ2_XXS, IQ2_XS and IQ3_XXS store 7 sign
 *     bits per 8 weights, the 8th being implied by even parity: when the count
 *     of negative weights is odd we flip the sign of the smallest-magnitude
 *     weight; its target magnitude becomes -|x| (so the search prefers the
 *     smallest level for it). IQ2_S and IQ3_S store all 8 signs.
 *  2. Per sub-block (16 or 32 weights, one 4-bit scale), ~28 candidate
 *     scales (from the largest magnitude and from the RMS, see best_scale):
 *     for each, every group gets its exact best grid row
 *     (quant_quantize_grid.h), then the scale is refit by least squares; two
 *     more refit rounds from the best. The lowest error wins.
 *  3. The f16 super-scale d maps the largest sub-block scale to the top 4-bit
 *     code times 1, 0.9, 0.8 or 0.65 (lowest total error wins); each
 *     sub-block tries its rounded code and both neighbours, choosing rows
 *     again at each *decoded* scale, and keeps the best.
 * The brute-force row search makes these slow (roughly 0.1-1 M weights/s).
 */
#include <math.h>
#include <string.h>

#include "core/fp16.h"
#include "quant/quant_impl.h"
#include "quant/quant_quantize_grid.h"
#include "quant/quant_quantize_util.h"

typedef struct {
    qq_grid_id grid;
    int sub;      /* weights per sub-block scale */
    float sa, sb; /* decoded sub-block scale = d * (sa + sb * ls) */
    int even;     /* 7 stored sign bits per 8 weights, even parity */
} mag_fmt;

#define MAX_GROUPS (QK_K / 4)

/* Signs of 8 weights (bit j = weight j negative) and target magnitudes a.
 * With `even`, an odd count of negatives flips the smallest |x|'s sign. */
static uint8_t group_signs(const float *x, float *a, int even) {
    uint8_t mask = 0;
    int nneg = 0, imin = 0;
    for (int j = 0; j < 8; j++) {
        a[j] = qq_absf(x[j]);
        if (x[j] < 0.0f) {
            mask |= (uint8_t)(1u << j);
            nneg++;
        }
        if (a[j] < a[imin]) imin = j;
    }
    if (even && (nneg & 1)) {
        mask ^= (uint8_t)(1u << imin);
        a[imin] = -a[imin];
    }
    return mask;
}

typedef struct {
    float err;  /* squared error at the given scale */
    float efit; /* squared error at the refit scale (same rows) */
    float sfit; /* least-squares scale for these rows (<= 0: none) */
} fit_result;

/* Best rows for n magnitudes at scale s; rows[] gets one index per group. */
static fit_result rows_at(const qq_grid *g, const float *a, int n, float s, int *rows) {
    float sav = 0.0f, svv = 0.0f, saa = 0.0f, t[8];
    const float is = 1.0f / s;
    for (int gi = 0; gi < n / g->G; gi++) {
        const float *ag = a + gi * g->G;
        for (int j = 0; j < g->G; j++) t[j] = ag[j] * is;
        const int r = qq_grid_best(g, t);
        rows[gi] = r;
        const float *v = g->val + r * g->G;
        for (int j = 0; j < g->G; j++) {
            sav += ag[j] * v[j];
            saa += ag[j] * ag[j];
        }
        svv += g->norm[r];
    }
    fit_result f;
    f.err = saa - 2.0f * s * sav + s * s * svv;
    f.sfit = sav / svv;
    f.efit = f.sfit > 0.0f ? saa - sav * sav / svv : saa;
    return f;
}

/* Best float scale of one sub-block (0 if it is all zeros). Candidates:
 * the largest magnitude at f * gmax (f = 0.55 .. 1.20) or exactly at each
 * level (so that rows of equal values, e.g. a constant row, are reachable),
 * and the RMS at c * gmax / 4 (c = 1 .. 3.5), which lets an outlier clip
 * instead of crushing the rest of the sub-block into the lowest level. */
static float best_scale(const qq_grid *g, const float *a, int n) {
    int rows[MAX_GROUPS];
    float amax = 0.0f, ss = 0.0f;
    for (int j = 0; j < n; j++) {
        amax = qq_absf(a[j]) > amax ? qq_absf(a[j]) : amax;
        ss += a[j] * a[j];
    }
    if (amax == 0.0f) return 0.0f;
    const float gmax = g->lev[g->L - 1], rms = sqrtf(ss / (float)n);
    float cand[14 + 8 + 6];
    int nc = 0;
    for (int k = 0; k <= 13; k++) cand[nc++] = amax / (gmax * (0.55f + 0.05f * (float)k));
    for (int l = 0; l < g->L; l++) cand[nc++] = amax / g->lev[l];
    for (int k = 0; k < 6; k++) cand[nc++] = 4.0f * rms / (gmax * (1.0f + 0.5f * (float)k));
    float best_s = amax / gmax, best_e = INFINITY;
    for (int k = 0; k < nc; k++) {
        fit_result f = rows_at(g, a, n, cand[k], rows);
        if (f.sfit > 0.0f && f.efit < best_e) {
            best_e = f.efit;
            best_s = f.sfit;
        }
    }
    for (int it = 0; it < 2; it++) {
        fit_result f = rows_at(g, a, n, best_s, rows);
        if (!(f.sfit > 0.0f) || f.efit >= best_e) break;
        best_e = f.efit;
        best_s = f.sfit;
    }
    return best_s;
}

/* One super-block: f16 scale, sign bytes (one per 8 weights), grid rows (one
 * per group), 4-bit sub-block scale codes. */
static void quantize_mag_block(const mag_fmt *fm, const float *x, uint16_t *dh, uint8_t *signs, int *rows, int *ls) {
    const qq_grid *g = qq_grid_get(fm->grid);
    float a[QK_K], s[QK_K / 16];
    const int nsub = QK_K / fm->sub, gps = fm->sub / g->G; /* groups per sub-block */
    for (int k = 0; k < QK_K / 8; k++) signs[k] = group_signs(x + 8 * k, a + 8 * k, fm->even);
    float smax = 0.0f;
    for (int j = 0; j < nsub; j++) {
        s[j] = best_scale(g, a + j * fm->sub, fm->sub);
        smax = s[j] > smax ? s[j] : smax;
    }
    if (smax == 0.0f) { /* all zeros: d = 0, and any rows decode to 0 */
        *dh = 0;
        memset(rows, 0, sizeof(int) * (size_t)(QK_K / g->G));
        memset(ls, 0, sizeof(int) * (size_t)nsub);
        return;
    }
    /* Super-scale: the largest sub-block scale at the top code, or a little
     * below (its sub-block then clips, and the 4-bit codes of the others get
     * finer), whichever gives the lower total error. */
    static const float dfac[4] = {1.0f, 0.9f, 0.8f, 0.65f};
    float best_total = INFINITY;
    int trial[MAX_GROUPS], trows[QK_K / 4], tls[QK_K / 16];
    for (int c = 0; c < 4; c++) {
        const uint16_t th = st_f32_to_f16(smax * dfac[c] / (fm->sa + fm->sb * 15.0f));
        const float d = st_f16_to_f32(th);
        if (d == 0.0f) continue;
        float total = 0.0f;
        for (int j = 0; j < nsub; j++) {
            const int l0 = qq_round_clamp((s[j] / d - fm->sa) / fm->sb, 0, 15);
            float best_e = INFINITY;
            for (int l = l0 - 1; l <= l0 + 1; l++) {
                if (l < 0 || l > 15) continue;
                fit_result f = rows_at(g, a + j * fm->sub, fm->sub, d * (fm->sa + fm->sb * (float)l), trial);
                if (!(f.err >= best_e)) { /* also takes the first candidate if errors are NaN */
                    best_e = f.err;
                    tls[j] = l;
                    memcpy(trows + j * gps, trial, sizeof(int) * (size_t)gps);
                }
            }
            total += best_e;
        }
        if (c == 0 || total < best_total) {
            best_total = total;
            *dh = th;
            memcpy(rows, trows, sizeof(int) * (size_t)(QK_K / g->G));
            memcpy(ls, tls, sizeof(int) * (size_t)nsub);
        }
    }
}

/* ---- IQ2_XXS: per 32 weights, 4 grid bytes + 4 x 7 sign bits + 4-bit scale; db = d*(0.5+ls)/4 ---- */
void qt_quantize_iq2_xxs(const float *src, void *dst, int64_t n) {
    static const mag_fmt fm = {QQ_GRID_IQ2XXS, 32, 0.125f, 0.25f, 1};
    block_iq2_xxs *y = dst;
    uint8_t signs[QK_K / 8];
    int rows[QK_K / 8], ls[QK_K / 32];
    for (int64_t i = 0; i < n / QK_K; i++) {
        quantize_mag_block(&fm, src + i * QK_K, &y[i].d, signs, rows, ls);
        for (int ib = 0; ib < QK_K / 32; ib++) {
            uint8_t q[8];
            uint32_t aux = (uint32_t)ls[ib] << 28;
            for (int l = 0; l < 4; l++) {
                q[l] = (uint8_t)rows[4 * ib + l];
                aux |= (uint32_t)(signs[4 * ib + l] & 127) << (7 * l);
            }
            for (int k = 0; k < 4; k++) q[4 + k] = (uint8_t)(aux >> (8 * k));
            memcpy(&y[i].qs[4 * ib], q, 8); /* little-endian uint16 pairs, as the file stores them */
        }
    }
}

/* ---- IQ2_XS: per 8 weights a uint16 (9-bit row | 7 sign bits << 9); 4-bit scale per 16 ---- */
void qt_quantize_iq2_xs(const float *src, void *dst, int64_t n) {
    static const mag_fmt fm = {QQ_GRID_IQ2XS, 16, 0.125f, 0.25f, 1};
    block_iq2_xs *y = dst;
    uint8_t signs[QK_K / 8];
    int rows[QK_K / 8], ls[QK_K / 16];
    for (int64_t i = 0; i < n / QK_K; i++) {
        quantize_mag_block(&fm, src + i * QK_K, &y[i].d, signs, rows, ls);
        for (int k = 0; k < QK_K / 8; k++) y[i].qs[k] = (uint16_t)(rows[k] | ((signs[k] & 127) << 9));
        for (int ib = 0; ib < QK_K / 32; ib++) y[i].scales[ib] = (uint8_t)(ls[2 * ib] | (ls[2 * ib + 1] << 4));
    }
}

/* ---- IQ2_S: 10-bit rows (low 8 in qs, high 2 in qh), full sign bytes, 4-bit scale per 16 ---- */
void qt_quantize_iq2_s(const float *src, void *dst, int64_t n) {
    static const mag_fmt fm = {QQ_GRID_IQ2S, 16, 0.125f, 0.25f, 0};
    block_iq2_s *y = dst;
    uint8_t signs[QK_K / 8];
    int rows[QK_K / 8], ls[QK_K / 16];
    for (int64_t i = 0; i < n / QK_K; i++) {
        quantize_mag_block(&fm, src + i * QK_K, &y[i].d, signs, rows, ls);
        memset(y[i].qh, 0, sizeof(y[i].qh));
        for (int k = 0; k < QK_K / 8; k++) {
            y[i].qs[k] = (uint8_t)(rows[k] & 255);
            y[i].qs[QK_K / 8 + k] = signs[k];
            y[i].qh[k / 4] |= (uint8_t)((rows[k] >> 8) << (2 * (k % 4)));
        }
        for (int ib = 0; ib < QK_K / 32; ib++) y[i].scales[ib] = (uint8_t)(ls[2 * ib] | (ls[2 * ib + 1] << 4));
    }
}

/* ---- IQ3_XXS: 64 grid bytes (groups of 4), then per 32 weights 4 x 7 sign bits + 4-bit scale; db = d*(0.5+ls)/2 ----
 */
void qt_quantize_iq3_xxs(const float *src, void *dst, int64_t n) {
    static const mag_fmt fm = {QQ_GRID_IQ3XXS, 32, 0.25f, 0.5f, 1};
    block_iq3_xxs *y = dst;
    uint8_t signs[QK_K / 8];
    int rows[QK_K / 4], ls[QK_K / 32];
    for (int64_t i = 0; i < n / QK_K; i++) {
        quantize_mag_block(&fm, src + i * QK_K, &y[i].d, signs, rows, ls);
        for (int k = 0; k < QK_K / 4; k++) y[i].qs[k] = (uint8_t)rows[k];
        for (int ib = 0; ib < QK_K / 32; ib++) {
            uint32_t aux = (uint32_t)ls[ib] << 28;
            for (int l = 0; l < 4; l++) aux |= (uint32_t)(signs[4 * ib + l] & 127) << (7 * l);
            for (int k = 0; k < 4; k++) y[i].qs[QK_K / 4 + 4 * ib + k] = (uint8_t)(aux >> (8 * k));
        }
    }
}

/* ---- IQ3_S: 9-bit rows of 4 (low 8 in qs, bit 8 in qh), full signs, 4-bit scale per 32; db = d*(1+2ls) ---- */
void qt_quantize_iq3_s(const float *src, void *dst, int64_t n) {
    static const mag_fmt fm = {QQ_GRID_IQ3S, 32, 1.0f, 2.0f, 0};
    block_iq3_s *y = dst;
    uint8_t signs[QK_K / 8];
    int rows[QK_K / 4], ls[QK_K / 32];
    for (int64_t i = 0; i < n / QK_K; i++) {
        quantize_mag_block(&fm, src + i * QK_K, &y[i].d, signs, rows, ls);
        memset(y[i].qh, 0, sizeof(y[i].qh));
        memset(y[i].scales, 0, sizeof(y[i].scales));
        for (int k = 0; k < QK_K / 4; k++) {
            y[i].qs[k] = (uint8_t)(rows[k] & 255);
            y[i].qh[k / 8] |= (uint8_t)((rows[k] >> 8) << (k % 8));
        }
        memcpy(y[i].signs, signs, sizeof(y[i].signs));
        for (int ib = 0; ib < QK_K / 32; ib++) y[i].scales[ib / 2] |= (uint8_t)(ls[ib] << (4 * (ib % 2)));
    }
}
