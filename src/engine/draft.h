/* Drafts for speculative decoding (draft.c): guesses of the next tokens that
 * one batched forward pass then verifies (engine_generate). */
#ifndef STRATA_ENGINE_DRAFT_H
#define STRATA_ENGINE_DRAFT_H

#include <stdint.h>

/* Prompt lookup: the longest suffix of hist[0..n) of DRAFT_NGRAM_MAX down
 * to DRAFT_NGRAM_MIN tokens that occurred earlier in hist, at its most
 * recent earlier occurrence: up to k of the tokens that followed it there,
 * into out. Returns how many (0: no such n-gram). Text that repeats what
 * the context holds (code being edited, quotes, lists) drafts well. */
#define DRAFT_NGRAM_MAX 4
#define DRAFT_NGRAM_MIN 2
int draft_lookup(const int32_t *hist, int n, int k, int32_t *out);

#endif
