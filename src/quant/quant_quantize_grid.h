/* Internal to the i-quant quantizers (quant_quantize_iq*.c): the lattice
 * grids in float form and the search for the best grid row.
 *
 * Every i-quant grid (iq_tables.h) is a subset of a small lattice: each of
 * its G values (8 or 4) is one of L levels. For a target vector t (weights
 * divided by the scale, signs already taken out where the format stores them
 * apart), the best row minimizes sum((t_i - v_i)^2). That distance is
 * separable, so the best *lattice* point is the per-element nearest level;
 * when that point is a grid row (a table lookup over all L^G patterns) it is
 * also the best grid row. Otherwise we brute-force all N rows, scoring
 * norm_k - 2 * dot(t, v_k) (the distance up to the constant sum(t^2)).
 * Brute force is exact, and is what makes IQ quantization slow (up to
 * N*G multiply-adds per group, N = 2048 for IQ1_S/IQ1_M).
 */
#ifndef STRATA_QUANT_QUANTIZE_GRID_H
#define STRATA_QUANT_QUANTIZE_GRID_H

#include <stdint.h>

typedef struct {
    int G;              /* values per row (8 or 4) */
    int N;              /* rows */
    int L;              /* lattice levels */
    float lev[8];       /* level values, ascending */
    const float *val;   /* (N, G) row values */
    const float *norm;  /* (N) sum of squares of each row */
    const int16_t *pat; /* (L^G) row index of a level pattern, -1 if not a row */
} qq_grid;

typedef enum {
    QQ_GRID_IQ2XXS,
    QQ_GRID_IQ2XS,
    QQ_GRID_IQ2S,
    QQ_GRID_IQ3XXS,
    QQ_GRID_IQ3S,
    QQ_GRID_IQ1S,
    QQ_GRID_COUNT
} qq_grid_id;

/* The float form of a grid, built once (thread-safe) on first use. */
const qq_grid *qq_grid_get(qq_grid_id id);

/* Index of the row nearest to t[0..G). */
int qq_grid_best(const qq_grid *g, const float *t);

#endif
