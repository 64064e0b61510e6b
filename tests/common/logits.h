/* Shared by the C tests that compare logit rows (tests/engine, tests/real,
 * tests/cuda): the top token and its margin over the runner-up, the
 * quantity every "near-tie" judgement in those tests rests on; the centred
 * NMSE of two logit rows; the one-step routing flip rule. Header-only:
 * each test is one executable. */
#ifndef STRATA_TESTS_COMMON_LOGITS_H
#define STRATA_TESTS_COMMON_LOGITS_H

#include <math.h>
#include <stdint.h>

/* The index of the largest of l[0..n) (the first on ties); *gap (if not NULL)
 * gets its lead over the second largest. n >= 2. */
static inline int32_t logits_argmax(const float *l, int n, float *gap) {
    int b = 0, s = -1;
    for (int i = 1; i < n; i++) {
        if (l[i] > l[b]) {
            s = b;
            b = i;
        } else if (s < 0 || l[i] > l[s]) s = i;
    }
    if (gap) *gap = l[b] - l[s];
    return b;
}

/* NMSE of a against ref, both centred: softmax is blind to a constant added
 * to every logit, so such a shift is no difference (the 6-layer SmolLM2 cut
 * on the GPU shows mean shifts of up to ~3 with equal spreads and rankings,
 * which an uncentred NMSE reports as 0.8). A non-finite a[i]: INFINITY.
 * *rms (if not NULL): the RMS of the centred difference. */
static inline double logits_nmse(const float *a, const float *ref, int n, double *rms) {
    double ma = 0, mr = 0, num = 0, den = 0;
    for (int i = 0; i < n; i++) ma += a[i], mr += ref[i];
    ma /= n, mr /= n;
    for (int i = 0; i < n; i++) {
        if (!isfinite(a[i])) return INFINITY;
        const double d = ((double)a[i] - ma) - ((double)ref[i] - mr);
        num += d * d;
        den += ((double)ref[i] - mr) * ((double)ref[i] - mr);
    }
    if (rms) *rms = sqrt(num / n);
    return den > 0 ? num / den : num;
}

/* Whether per-step logit NMSEs e[0..n) that exceed bound are one MoE
 * routing flip and nothing else: a single step over the bound (below 1)
 * while the median step is within a tenth of it. A near-tie between a
 * layer's k-th and (k+1)-th expert that the two sides' rounding decides
 * differently swaps one of the token's experts for that step only (seen on
 * an H200 with the gpt-oss synth, top-4 of 8: one step at 5e-2 to 8e-2
 * among steps at 2e-5 to 2e-4, unchanged with the fused or the grouped
 * expert kernels, every fusion off, and activation reuse off); a wrong
 * kernel shows at many steps. e is reordered. */
static inline int logits_one_flip(double *e, int n, double bound) {
    int over = 0;
    double worst = 0;
    for (int i = 0; i < n; i++) over += e[i] > bound, worst = e[i] > worst ? e[i] : worst;
    for (int i = 1; i < n; i++) /* insertion sort: n is a few dozen steps */
        for (int j = i; j > 0 && e[j] < e[j - 1]; j--) {
            const double t = e[j];
            e[j] = e[j - 1], e[j - 1] = t;
        }
    return n > 2 && over == 1 && worst < 1.0 && e[n / 2] <= bound / 10;
}

#endif
