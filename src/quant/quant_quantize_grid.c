/* Float forms of the i-quant grids and the nearest-row search used by the
 * i-quant quantizers (see quant_quantize_grid.h for the method).
 *
 * The tables are built once per process under pthread_once from the packed
 * rows of iq_tables.h (byte j of a row = value j), so the quantizers can be
 * called from any thread.
 */
#include <pthread.h>

#include "core/log.h"
#include "quant/iq_tables.h"
#include "quant/quant_quantize_grid.h"
#include "quant/quant_quantize_util.h"

/* storage: sizes are the grids' row counts times their widths */
static float val_iq2xxs[256 * 8], val_iq2xs[512 * 8], val_iq2s[1024 * 8];
static float val_iq3xxs[256 * 4], val_iq3s[512 * 4], val_iq1s[2048 * 8];
static float norm_iq2xxs[256], norm_iq2xs[512], norm_iq2s[1024];
static float norm_iq3xxs[256], norm_iq3s[512], norm_iq1s[2048];
static int16_t pat_iq2xxs[6561], pat_iq2xs[6561], pat_iq2s[6561]; /* 3^8 */
static int16_t pat_iq3xxs[4096], pat_iq3s[4096];                  /* 8^4 */
static int16_t pat_iq1s[6561];

static qq_grid grids[QQ_GRID_COUNT];
static pthread_once_t grids_once = PTHREAD_ONCE_INIT;

/* Fill one grid from its packed rows: rows64 (8 bytes) or rows32 (4 bytes). */
static void build(qq_grid *g, int N, int G, const uint64_t *rows64, const uint32_t *rows32, int is_signed,
                  const float *lev, int L, float *val, float *norm, int16_t *pat, int npat) {
    g->G = G;
    g->N = N;
    g->L = L;
    for (int l = 0; l < L; l++) g->lev[l] = lev[l];
    for (int p = 0; p < npat; p++) pat[p] = -1;
    for (int k = 0; k < N; k++) {
        const uint64_t row = rows64 ? rows64[k] : (uint64_t)rows32[k];
        int code = 0, mul = 1;
        float nn = 0.0f;
        for (int j = 0; j < G; j++) {
            const uint8_t b = (uint8_t)(row >> (8 * j));
            const float v = is_signed ? (float)(int8_t)b : (float)b;
            int li = -1;
            for (int l = 0; l < L; l++)
                if (lev[l] == v) li = l;
            ST_ASSERT(li >= 0); /* every grid value is one of the levels */
            val[k * G + j] = v;
            nn += v * v;
            code += li * mul;
            mul *= L;
        }
        norm[k] = nn;
        ST_ASSERT(code < npat && pat[code] == -1); /* rows are distinct */
        pat[code] = (int16_t)k;
    }
    g->val = val;
    g->norm = norm;
    g->pat = pat;
}

static void build_all(void) {
    static const float lev2[3] = {8, 25, 43};
    static const float lev3xxs[8] = {4, 12, 20, 28, 36, 44, 52, 62};
    static const float lev3s[8] = {1, 3, 5, 7, 9, 11, 13, 15};
    static const float lev1[3] = {-1, 0, 1};
    build(&grids[QQ_GRID_IQ2XXS], 256, 8, iq2xxs_grid, NULL, 0, lev2, 3, val_iq2xxs, norm_iq2xxs, pat_iq2xxs, 6561);
    build(&grids[QQ_GRID_IQ2XS], 512, 8, iq2xs_grid, NULL, 0, lev2, 3, val_iq2xs, norm_iq2xs, pat_iq2xs, 6561);
    build(&grids[QQ_GRID_IQ2S], 1024, 8, iq2s_grid, NULL, 0, lev2, 3, val_iq2s, norm_iq2s, pat_iq2s, 6561);
    build(&grids[QQ_GRID_IQ3XXS], 256, 4, NULL, iq3xxs_grid, 0, lev3xxs, 8, val_iq3xxs, norm_iq3xxs, pat_iq3xxs, 4096);
    build(&grids[QQ_GRID_IQ3S], 512, 4, NULL, iq3s_grid, 0, lev3s, 8, val_iq3s, norm_iq3s, pat_iq3s, 4096);
    build(&grids[QQ_GRID_IQ1S], 2048, 8, iq1s_grid, NULL, 1, lev1, 3, val_iq1s, norm_iq1s, pat_iq1s, 6561);
}

const qq_grid *qq_grid_get(qq_grid_id id) {
    ST_ASSERT(id >= 0 && id < QQ_GRID_COUNT);
    pthread_once(&grids_once, build_all);
    return &grids[id];
}

int qq_grid_best(const qq_grid *g, const float *t) {
    /* the per-element nearest lattice point; a grid row is then optimal */
    int code = 0, mul = 1;
    for (int j = 0; j < g->G; j++) {
        code += qq_nearest_sorted(g->lev, g->L, t[j]) * mul;
        mul *= g->L;
    }
    if (g->pat[code] >= 0) return g->pat[code];

    int best = 0;
    float best_score = 0.0f;
    if (g->G == 8) {
        for (int k = 0; k < g->N; k++) {
            const float *v = g->val + 8 * k;
            float dot = t[0] * v[0] + t[1] * v[1] + t[2] * v[2] + t[3] * v[3] + t[4] * v[4] + t[5] * v[5] +
                        t[6] * v[6] + t[7] * v[7];
            float score = g->norm[k] - 2.0f * dot;
            if (k == 0 || score < best_score) {
                best_score = score;
                best = k;
            }
        }
    } else {
        for (int k = 0; k < g->N; k++) {
            const float *v = g->val + 4 * k;
            float dot = t[0] * v[0] + t[1] * v[1] + t[2] * v[2] + t[3] * v[3];
            float score = g->norm[k] - 2.0f * dot;
            if (k == 0 || score < best_score) {
                best_score = score;
                best = k;
            }
        }
    }
    return best;
}
