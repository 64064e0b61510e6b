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
/* Record a token as part of the context (prompt or generated) for penalties. */
void sampler_accept(sampler *s, int32_t token);
void sampler_reset(sampler *s);

#endif
