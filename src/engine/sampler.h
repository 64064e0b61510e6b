/* Sampling: greedy, temperature, top-k, locally typical (typical_p), top-p,
 * min-p, repetition / presence / frequency penalties over the last
 * penalty_last_n tokens, DRY (a penalty on tokens that would extend a
 * sequence already seen), a per-token logit bias, and llama.cpp's chain
 * order when a request names one; a seeded generator so that a seed
 * reproduces the output.
 *
 * Definitions (llama.cpp's, common/sampling.cpp and src/llama-sampling.cpp):
 * - logit bias: logit[t] += bias (-inf bans t); always first.
 * - typical_p: over the candidates' softmax p with entropy H, keep those with
 *   the smallest |-log p - H| until their mass exceeds typical_p.
 * - DRY: for the last dry_penalty_last_n tokens, a token t that would extend
 *   a repetition of length L (the longest suffix of the context that also
 *   occurs earlier followed by t, not reaching back past the last sequence
 *   breaker) with L >= dry_allowed_length gets
 *   logit -= dry_multiplier * dry_base^(L - dry_allowed_length); breaker
 *   tokens themselves are never penalised.
 * - min_p: keep p >= min_p * max p, at the temperature in force at its step. */
#ifndef STRATA_ENGINE_SAMPLER_H
#define STRATA_ENGINE_SAMPLER_H

#include <stdint.h>

/* The steps of the chain (llama-server's names: penalties, dry, top_k,
 * typ_p, top_p, min_p, temperature). */
typedef enum {
    SMP_PENALTIES,
    SMP_DRY,
    SMP_TOP_K,
    SMP_TYPICAL,
    SMP_TOP_P,
    SMP_MIN_P,
    SMP_TEMP,
    SMP_N_KINDS
} sampler_kind;

#define SAMPLER_MAX_ORDER 16

typedef struct {
    float temp;                                /* <= 0: greedy */
    int top_k;                                 /* <= 0: off */
    float top_p;                               /* >= 1: off */
    float min_p;                               /* <= 0: off */
    float repeat_penalty;                      /* 1: off (divides positive logits, multiplies negative ones) */
    float presence_penalty, frequency_penalty; /* 0: off (OpenAI semantics) */
    int penalty_last_n;   /* window of recent tokens the penalties look at (0: off; at most 65535) */
    float typical_p;      /* >= 1 or <= 0: off */
    float dry_multiplier; /* 0: DRY off */
    float dry_base;       /* < 1: DRY off */
    int dry_allowed_length;
    int dry_penalty_last_n;     /* window DRY looks at (0: off) */
    const uint8_t *dry_breaker; /* (n_vocab) 1: the token holds a sequence breaker; NULL: none (copied) */
    int n_bias;                 /* logit bias entries (copied at create; a token may repeat: biases add) */
    const int32_t *bias_ids;    /* (n_bias) */
    const float *bias_vals;     /* (n_bias) -INFINITY bans */
    int n_order;                /* 0: the default order (penalties, dry, top_k, typ_p, temperature, top_p, min_p) */
    uint8_t order[SAMPLER_MAX_ORDER]; /* sampler_kind values; a step left out does not run (temperature left out:
                                         the draw is at temperature 1, but temp <= 0 is still greedy) */
    uint64_t seed;
} sampler_params;

/* The kind named by one of llama-server's sampler names (or its aliases:
 * top-k, topk, nucleus, typ, temp, ...); -1 for an unknown name, -2 for a
 * name whose step is a no-op at the defaults, which are all this server
 * takes (xtc, top_n_sigma), -3 for one it cannot run (infill, adaptive_p). */
int sampler_kind_from_name(const char *name);

sampler_params sampler_defaults(void);

typedef struct sampler sampler;

sampler *sampler_create(const sampler_params *p, int n_vocab);
void sampler_free(sampler *s);
/* Choose the next token from logits (modified in place). */
int32_t sampler_sample(sampler *s, float *logits);
/* The request's logit bias alone added to logits (n_vocab): what a draft
 * (engine_seq_draft_mtp) sees of the sampler, so that it never drafts a
 * banned token and follows a lifted one. */
void sampler_add_bias(const sampler *s, float *logits);
/* Sampling from candidates (a GPU computes them without copying every
 * logit to the host, backend.h top_k): how many a draw needs, 1 for greedy
 * or top_k, when they suffice, with at most max_k; 0 when the draw needs
 * every logit (penalties; no top-k; top_k above max_k). */
int sampler_candidates(const sampler *s, int max_k);
/* Choose from the k largest logits: ids and vals in order (larger first,
 * equal logits by the lower id), as sampler_sample does after its top-k,
 * so both give the same token for the same logits and state. */
int32_t sampler_sample_top(sampler *s, const int32_t *ids, const float *vals, int k);
/* A draw the backend makes over every logit (backend.h draw: a GPU copies
 * one token, not the vocabulary): the temperature when the chain is only a
 * temperature (no cut) with no bias, penalties or DRY, else 0. Then
 * sampler_draw_unit gives the uniform number that sampler_sample's draw
 * would have taken (the generator advances the same), and the backend's
 * token is the one sampler_sample gives for the same logits and state,
 * unless the draw falls within float rounding of a boundary between two
 * ids. */
float sampler_device_temp(const sampler *s);
double sampler_draw_unit(sampler *s);
/* The ids of the k largest of l[0..n) in that order (NaNs left out) into
 * idx; returns how many (k, or fewer when n is). */
int sampler_top_k(const float *l, int n, int k, int32_t *idx);
/* Sampling under a constraint (a grammar): the token drawn from the logits
 * with every refused token at -inf, as if mask had run first, but mask (a
 * pass over the whole vocabulary) runs only when a cheaper way cannot give
 * the same distribution: greedy takes the first allowed candidate in the
 * order of the logits (after the bias, penalties and DRY); when no step but
 * top-k cuts (no top-p, min-p, typical) and the penalties and DRY come
 * before every cut, plain temperature sampling draws once and keeps the
 * token when it is allowed (exact: P(t) = p(t) + (1 - Z) p(t) / Z = p(t) / Z
 * for an allowed t, Z the allowed mass), and top-k alone collects the k best
 * allowed among the best candidates. Anything else masks first. ok(ctx, t): 1 when t may come next;
 * mask(ctx, logits, n): refused tokens to -inf, returns how many are allowed.
 * Returns the token, or -1 when no token is allowed. */
typedef int (*sampler_ok_fn)(void *ctx, int32_t t);
typedef int (*sampler_mask_fn)(void *ctx, float *logits, int n);
int32_t sampler_sample_checked(sampler *s, float *logits, sampler_ok_fn ok, sampler_mask_fn mask, void *ctx);
/* Record a token as part of the context (prompt or generated) for penalties. */
void sampler_accept(sampler *s, int32_t token);
void sampler_reset(sampler *s);

#endif
