/* Reference quantizers from f32, part 4: IQ1_S and IQ1_M, about 1.6-1.75 bits
 * per weight. A group of 8 weights decodes to dl * (g + delta): g a row of
 * iq1s_grid (values -1, 0, +1, signs included), delta = +-IQ1S_DELTA, dl =
 * d * (2*ls + 1) with a 3-bit ls.
 *   IQ1_S: one ls and one delta sign per 32 weights; d is f16.
 *   IQ1_M: one ls per 16 weights, one delta sign per 8; d is f16 spread over
 *          the top nibbles of the four 16-bit scale words.
 *
 * Method (ours): like the other i-quants (quant_quantize_iq.c). For a given
 * dl and delta the best row of a group is the grid row nearest to x/dl - delta
 * (exact, quant_quantize_grid.h). Per scale unit, candidate dl = amax * f
 * (f = 0.3 .. 1.0) and rms * c (c = 0.6 .. 1.4), each with the delta chosen per unit (IQ1_S) or per group
 * (IQ1_M), then two least-squares refits of dl; the super-scale d maps the
 * largest dl to ls = 7 times 1, 0.9, 0.8 or 0.65 (lowest total error wins),
 * and each unit tries its rounded ls and both
 * neighbours at the decoded scale. Slow (brute force over 2048 rows on a
 * lookup miss): on the order of 0.1 M weights/s.
 */
#include <math.h>
#include <string.h>

#include "core/fp16.h"
#include "quant/iq_tables.h"
#include "quant/quant_impl.h"
#include "quant/quant_quantize_grid.h"
#include "quant/quant_quantize_util.h"

typedef struct {
    float err, efit, sfit; /* error at dl, error at the refit scale, refit scale */
} fit1;

/* Best rows for n weights (groups of 8) at scale dl. dsign = +1 or -1 fixes
 * delta for all groups; dsign = 0 picks it per group. neg[gi] = 1 where the
 * group's delta is negative. */
static fit1 rows_at1(const qq_grid *g, const float *x, int n, float dl, int dsign, int *rows, uint8_t *neg) {
    float sxh = 0.0f, shh = 0.0f, sxx = 0.0f, t[8];
    const float idl = 1.0f / dl;
    for (int gi = 0; gi < n / 8; gi++) {
        const float *xg = x + 8 * gi;
        float gxx = 0.0f;
        for (int j = 0; j < 8; j++) gxx += xg[j] * xg[j];
        float best_e = 0.0f, best_xh = 0.0f, best_hh = 0.0f;
        int best_r = 0, best_neg = 0;
        for (int s = 0; s < 2; s++) {
            const int isneg = dsign != 0 ? dsign < 0 : s;
            if (dsign != 0 && s == 1) break;
            const float delta = isneg ? -IQ1S_DELTA : IQ1S_DELTA;
            for (int j = 0; j < 8; j++) t[j] = xg[j] * idl - delta;
            const int r = qq_grid_best(g, t);
            const float *v = g->val + 8 * r;
            float xh = 0.0f, hh = 0.0f;
            for (int j = 0; j < 8; j++) {
                const float h = v[j] + delta;
                xh += xg[j] * h;
                hh += h * h;
            }
            const float e = gxx - 2.0f * dl * xh + dl * dl * hh;
            if (s == 0 || e < best_e) {
                best_e = e;
                best_r = r;
                best_neg = isneg;
                best_xh = xh;
                best_hh = hh;
            }
        }
        rows[gi] = best_r;
        neg[gi] = (uint8_t)best_neg;
        sxh += best_xh;
        shh += best_hh;
        sxx += gxx;
    }
    fit1 f;
    f.err = sxx - 2.0f * dl * sxh + dl * dl * shh;
    f.sfit = sxh / shh; /* shh >= n * delta^2 > 0 */
    f.efit = f.sfit > 0.0f ? sxx - sxh * sxh / shh : sxx;
    return f;
}

/* Evaluate a unit at dl with the delta policy of the format: IQ1_S tries both
 * fixed signs for the whole unit, IQ1_M chooses per group. */
static fit1 unit_at(const qq_grid *g, const float *x, int n, float dl, int per_group, int *rows, uint8_t *neg) {
    if (per_group) return rows_at1(g, x, n, dl, 0, rows, neg);
    int r2[4];
    uint8_t n2[4];
    fit1 a = rows_at1(g, x, n, dl, +1, rows, neg);
    fit1 b = rows_at1(g, x, n, dl, -1, r2, n2);
    if (b.err < a.err) {
        memcpy(rows, r2, sizeof(int) * (size_t)(n / 8));
        memcpy(neg, n2, (size_t)(n / 8));
        return b;
    }
    return a;
}

/* Best float dl of one unit of n weights (0 if all zeros). */
static float best_dl(const qq_grid *g, const float *x, int n, int per_group) {
    int rows[4];
    uint8_t neg[4];
    float amax = 0.0f, ss = 0.0f;
    for (int j = 0; j < n; j++) {
        amax = qq_absf(x[j]) > amax ? qq_absf(x[j]) : amax;
        ss += x[j] * x[j];
    }
    if (amax == 0.0f) return 0.0f;
    /* candidates from the largest magnitude, and from the RMS (so an outlier
     * can clip instead of zeroing the rest of the unit) */
    const float rms = sqrtf(ss / (float)n);
    float cand[8 + 5];
    int nc = 0;
    for (int k = 0; k <= 7; k++) cand[nc++] = amax * (0.3f + 0.1f * (float)k);
    for (int k = 0; k < 5; k++) cand[nc++] = rms * (0.6f + 0.2f * (float)k);
    float best_s = amax, best_e = INFINITY;
    for (int k = 0; k < nc; k++) {
        fit1 f = unit_at(g, x, n, cand[k], per_group, rows, neg);
        if (f.sfit > 0.0f && f.efit < best_e) {
            best_e = f.efit;
            best_s = f.sfit;
        }
    }
    for (int it = 0; it < 2; it++) {
        fit1 f = unit_at(g, x, n, best_s, per_group, rows, neg);
        if (!(f.sfit > 0.0f) || f.efit >= best_e) break;
        best_e = f.efit;
        best_s = f.sfit;
    }
    return best_s;
}

/* One super-block of `unit`-weight scale units: f16 d bits, rows (one per 8
 * weights), delta signs (per group), 3-bit ls per unit. */
static void quantize_iq1_block(const float *x, int unit, int per_group, uint16_t *dh, int *rows, uint8_t *neg,
                               int *ls) {
    const qq_grid *g = qq_grid_get(QQ_GRID_IQ1S);
    const int nunit = QK_K / unit, gpu = unit / 8;
    float s[QK_K / 16], smax = 0.0f;
    for (int j = 0; j < nunit; j++) {
        s[j] = best_dl(g, x + j * unit, unit, per_group);
        smax = s[j] > smax ? s[j] : smax;
    }
    if (smax == 0.0f) { /* all zeros: d = 0 decodes every row to 0 */
        *dh = 0;
        memset(rows, 0, sizeof(int) * (QK_K / 8));
        memset(neg, 0, QK_K / 8);
        memset(ls, 0, sizeof(int) * (size_t)nunit);
        return;
    }
    /* the largest dl at ls = 7, or a little below (that unit clips, the others
     * get finer 3-bit steps): lowest total error wins */
    static const float dfac[4] = {1.0f, 0.9f, 0.8f, 0.65f};
    float best_total = INFINITY;
    int tr[4], trows[QK_K / 8], tls[QK_K / 16];
    uint8_t tn[4], tneg[QK_K / 8];
    for (int c = 0; c < 4; c++) {
        const uint16_t th = st_f32_to_f16(smax * dfac[c] / 15.0f);
        const float d = st_f16_to_f32(th);
        if (d == 0.0f) continue;
        float total = 0.0f;
        for (int j = 0; j < nunit; j++) {
            const int l0 = qq_round_clamp((s[j] / d - 1.0f) * 0.5f, 0, 7);
            float best_e = INFINITY;
            for (int l = l0 - 1; l <= l0 + 1; l++) {
                if (l < 0 || l > 7) continue;
                fit1 f = unit_at(g, x + j * unit, unit, d * (float)(2 * l + 1), per_group, tr, tn);
                if (!(f.err >= best_e)) { /* also takes the first candidate if errors are NaN */
                    best_e = f.err;
                    tls[j] = l;
                    memcpy(trows + j * gpu, tr, sizeof(int) * (size_t)gpu);
                    memcpy(tneg + j * gpu, tn, (size_t)gpu);
                }
            }
            total += best_e;
        }
        if (c == 0 || total < best_total) {
            best_total = total;
            *dh = th;
            memcpy(rows, trows, sizeof(trows));
            memcpy(neg, tneg, sizeof(tneg));
            memcpy(ls, tls, sizeof(int) * (size_t)nunit);
        }
    }
}

/* ---- IQ1_S: qs = low 8 row bits; qh per 32 = 4 x 3 high row bits | ls << 12 | delta sign << 15 ---- */
void qt_quantize_iq1_s(const float *src, void *dst, int64_t n) {
    block_iq1_s *y = dst;
    int rows[QK_K / 8], ls[QK_K / 32];
    uint8_t neg[QK_K / 8];
    for (int64_t i = 0; i < n / QK_K; i++) {
        quantize_iq1_block(src + i * QK_K, 32, 0, &y[i].d, rows, neg, ls);
        for (int ib = 0; ib < QK_K / 32; ib++) {
            uint16_t h = (uint16_t)((ls[ib] << 12) | (neg[4 * ib] ? 0x8000 : 0));
            for (int l = 0; l < 4; l++) {
                y[i].qs[4 * ib + l] = (uint8_t)(rows[4 * ib + l] & 255);
                h |= (uint16_t)(((rows[4 * ib + l] >> 8) & 7) << (3 * l));
            }
            y[i].qh[ib] = h;
        }
    }
}

/* ---- IQ1_M: qh nibble per 8 weights = 3 high row bits | delta sign << 3;
 *      scale word k: ls of weights 32k+0..15, +16..31, 32k+32..47, +48..63 at
 *      bits 0, 3, 6, 9, and nibble k of the f16 d at bits 12..15 ---- */
void qt_quantize_iq1_m(const float *src, void *dst, int64_t n) {
    block_iq1_m *y = dst;
    int rows[QK_K / 8], ls[QK_K / 16];
    uint8_t neg[QK_K / 8];
    uint16_t dh;
    for (int64_t i = 0; i < n / QK_K; i++) {
        quantize_iq1_block(src + i * QK_K, 16, 1, &dh, rows, neg, ls);
        memset(y[i].qh, 0, sizeof(y[i].qh));
        for (int k = 0; k < QK_K / 8; k++) {
            y[i].qs[k] = (uint8_t)(rows[k] & 255);
            const int nib = ((rows[k] >> 8) & 7) | (neg[k] ? 8 : 0);
            y[i].qh[k / 2] |= (uint8_t)(nib << (4 * (k % 2)));
        }
        for (int w = 0; w < 4; w++) {
            uint16_t sc = (uint16_t)(ls[4 * w] | (ls[4 * w + 1] << 3) | (ls[4 * w + 2] << 6) | (ls[4 * w + 3] << 9));
            sc |= (uint16_t)(((dh >> (4 * w)) & 0xf) << 12);
            y[i].scales[2 * w] = (uint8_t)(sc & 0xff);
            y[i].scales[2 * w + 1] = (uint8_t)(sc >> 8);
        }
    }
}
