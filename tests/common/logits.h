/* Shared by the C tests that compare logit rows (tests/engine, tests/real,
 * tests/cuda): the top token and its margin over the runner-up, the
 * quantity every "near-tie" judgement in those tests rests on. Header-only:
 * each test is one executable. */
#ifndef STRATA_TESTS_COMMON_LOGITS_H
#define STRATA_TESTS_COMMON_LOGITS_H

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

#endif
