/* Prompt-lookup drafts (draft.h). */
#include "engine/draft.h"

#include <string.h>

int draft_lookup(const int32_t *hist, int n, int k, int32_t *out) {
    for (int g = DRAFT_NGRAM_MAX; g >= DRAFT_NGRAM_MIN; g--) {
        if (n < g + 1) continue;
        const int32_t *suffix = hist + n - g;
        /* the most recent earlier start i (i + g <= n - 1: a token follows it) */
        for (int i = n - g - 1; i >= 0; i--) {
            if (hist[i] != suffix[0] || memcmp(hist + i, suffix, (size_t)g * sizeof(int32_t)) != 0) continue;
            int m = 0;
            while (m < k && i + g + m < n) {
                out[m] = hist[i + g + m];
                m++;
            }
            return m;
        }
    }
    return 0;
}
