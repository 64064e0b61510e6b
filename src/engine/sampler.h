/* Sampling: greedy, temperature, top-k, top-p, min-p, and repetition /
 * presence / frequency penalties over the last penalty_last_n tokens, with a
 * seeded generator so that a seed reproduces the output. */
#ifndef STRATA_ENGINE_SAMPLER_H
#define STRATA_ENGINE_SAMPLER_H

#include <stdint.h>

typedef struct {
    float temp;            /* <= 0: greedy */
    int top_k;             /* <= 0: off */
    float top_p;           /* >= 1: off */
    float min_p;           /* <= 0: off */
    float repeat_penalty;  /* 1: off (divides positive logits, multiplies negative ones) */
    float presence_penalty, frequency_penalty; /* 0: off (OpenAI semantics) */
    int penalty_last_n;    /* window of recent tokens the penalties look at */
    uint64_t seed;
} sampler_params;

sampler_params sampler_defaults(void);

typedef struct sampler sampler;

sampler *sampler_create(const sampler_params *p, int n_vocab);
void sampler_free(sampler *s);
/* Choose the next token from logits (modified in place). */
int32_t sampler_sample(sampler *s, float *logits);
/* Sampling from candidates (a GPU computes them without copying every
 * logit to the host, backend.h top_k): how many a draw needs, 1 for greedy
 * or top_k, when they suffice, with at most max_k; 0 when the draw needs
 * every logit (penalties; no top-k; top_k above max_k). */
int sampler_candidates(const sampler *s, int max_k);
/* Choose from the k largest logits: ids and vals in order (larger first,
 * equal logits by the lower id), as sampler_sample does after its top-k,
 * so both give the same token for the same logits and state. */
int32_t sampler_sample_top(sampler *s, const int32_t *ids, const float *vals, int k);
/* The ids of the k largest of l[0..n) in that order (NaNs left out) into
 * idx; returns how many (k, or fewer when n is). */
int sampler_top_k(const float *l, int n, int k, int32_t *idx);
/* Sampling under a constraint (a grammar): the token drawn from the logits
 * with every refused token at -inf, as if mask had run first, but mask (a
 * pass over the whole vocabulary) runs only when a cheaper way cannot give
 * the same distribution: greedy takes the first allowed candidate in the
 * order of the logits; plain temperature sampling draws once and keeps the
 * token when it is allowed (exact: P(t) = p(t) + (1 - Z) p(t) / Z = p(t) / Z
 * for an allowed t, Z the allowed mass); top-k alone collects the k best
 * allowed among the best candidates. ok(ctx, t): 1 when t may come next;
 * mask(ctx, logits, n): refused tokens to -inf, returns how many are allowed.
 * Returns the token, or -1 when no token is allowed. */
typedef int (*sampler_ok_fn)(void *ctx, int32_t t);
typedef int (*sampler_mask_fn)(void *ctx, float *logits, int n);
int32_t sampler_sample_checked(sampler *s, float *logits, sampler_ok_fn ok, sampler_mask_fn mask, void *ctx);
/* Record a token as part of the context (prompt or generated) for penalties. */
void sampler_accept(sampler *s, int32_t token);
void sampler_reset(sampler *s);

#endif
