/* The engine: one model, its tokenizer, a backend, and one sequence's KV
 * cache, with prompt evaluation (prefix reuse), generation with stop strings
 * and tokens, and the speed line every front end prints the same way.
 * The server's slots (several sequences batched) build on this later. */
#ifndef STRATA_ENGINE_ENGINE_H
#define STRATA_ENGINE_ENGINE_H

#include <stdint.h>

#include "engine/kv_cache.h"
#include "engine/sampler.h"
#include "model/forward.h"
#include "model/model.h"
#include "tokenizer/tokenizer.h"

typedef struct {
    const char *model_path;
    int n_ctx;          /* 0: min(trained context, 4096) */
    st_kv_type kv_type;
    int n_threads;      /* 0: all cores */
    int n_ubatch;       /* prompt chunk size, 0: 512 */
    int gpu;            /* -1: CPU backend (default); N >= 0: every op on GPU N (builds with STRATA_CUDA/HIP) */
} engine_params;

typedef struct {
    model *m;
    tokenizer *tok;
    st_backend *be;
    model_ctx *mc;
    kv_cache *kv;
    int n_ctx;
    int n_past;         /* positions filled in the cache */
    int32_t *hist;      /* (n_ctx) the tokens at those positions */
    float *logits;      /* (n_vocab) of the last evaluated token */
    struct engine_placed *placed; /* device copies of the weights (GPU backend), else NULL */
} engine;

engine_params engine_defaults(void);
/* NULL with st_error_get() naming what is wrong (file, architecture, context). */
engine *engine_open(const engine_params *p);
void engine_close(engine *e);

/* Evaluate tokens after the cache's current content. -1 with st_error if the
 * context would overflow (nothing is evaluated then). */
int engine_eval(engine *e, const int32_t *toks, int n);
/* Drop cache positions beyond the longest common prefix of the cache and
 * toks (keeping at least one token to evaluate); returns the prefix length. */
int engine_reuse_prefix(engine *e, const int32_t *toks, int n);
/* Reuse what the cache shares with the prompt and read the rest, the last
 * token in a call of its own: batched and single-token products round
 * differently (and 8-bit activations amplify that), so this makes the first
 * sampled token's logits the same whether or not the prompt was cached.
 * Returns the reused count, or -1 with st_error. */
int engine_read_prompt(engine *e, const int32_t *prompt, int n);

typedef struct {
    int max_tokens;             /* <= 0: until the context is full */
    const char *const *stop;    /* stop strings, not included in the output */
    int n_stop;
    int ignore_eos;
} gen_params;

typedef struct {
    int n_prompt, n_reused, n_read;
    double prompt_ms;
    int n_gen;
    double gen_ms;
    int drafts_accepted, drafts_total;
    const char *finish;         /* "stop" (EOS or stop string), "length", "error" */
    int stop_index;             /* which gp->stop string ended generation; -1: none (EOS, length) */
} gen_stats;

/* Receives text as it becomes final (whole UTF-8 characters, stop strings
 * withheld). Return nonzero to stop early. */
typedef int (*gen_text_fn)(void *ctx, const char *text, size_t len);

/* Reuse what the cache shares with the prompt, read the rest, then sample up
 * to max_tokens. Returns 0, or -1 with st_error (context overflow, empty prompt). */
int engine_generate(engine *e, sampler *s, const int32_t *prompt, int n_prompt, const gen_params *gp,
                    gen_text_fn fn, void *ctx, gen_stats *st);

/* "prompt N tokens = R reused + M read in X ms (T tok/s), G generated in Y ms (U tok/s), drafts accepted A of B" */
void gen_stats_format(const gen_stats *st, char *buf, size_t cap);

#endif
