/* The engine: one model, its tokenizer, a backend and model context, shared
 * by any number of sequences (engine_seq: a KV cache, token history and
 * logits each), with prompt evaluation (prefix reuse), a batched decode step
 * over several sequences, step-wise generation (gen_state: sampling, stop
 * strings, streaming text, one token at a time) and the speed line every
 * front end prints the same way. The CLI's single-sequence calls
 * (engine_eval, engine_read_prompt, engine_generate) are the same sequence
 * code applied to the engine's own sequence. */
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
    int n_ctx; /* 0: min(trained context, 4096) */
    st_kv_type kv_type;
    int n_threads; /* 0: all cores */
    int n_ubatch;  /* prompt chunk size, 0: 512 */
    int gpu;       /* -1: CPU backend (default); N >= 0: GPU N (builds with STRATA_CUDA/HIP)
                    */
    /* The memory plan of a MoE model on the GPU (expert_plan.h) */
    double vram_budget;         /* GiB the engine may allocate on the GPU; 0: its free memory less vram_reserve */
    int vram_reserve_mib;       /* left free of the GPU's free memory when vram_budget is 0 (default 512) */
    long expert_cache;          /* expert cache slots; -1: as many as fit. On the CPU backend, N >= 0 runs the
                                   lanes with a second CPU backend as the "device" (tests of the seam) */
    const char *expert_profile; /* routing counts (strata profile) that choose the cached experts, or NULL */
    double pcie_frac;           /* < 0 (default): the cost model sends each miss where it is cheapest; else this
                                   share of the misses goes over PCIe, the rest to the CPU lane */
    int n_seq;                  /* sequences whose KV caches the plan reserves (the server's slots); 0: 1 */
    int no_pin;                 /* --mmap-experts (= --pin-experts 0): the host experts stay in the plain mapping, not
                                   page-locked, and a RAM tier's arena is not page-locked either */
    double ram_budget;          /* GiB of host RAM the experts left to the host may hold (--ram-budget); beyond it
                                   an SSD tier reads them from the file (expert_store.h); 0: no limit */
    int adapt_every; /* the expert cache learns every N steps (moe_lanes_set_adapt); 1 (default): every step; 0: fixed
                      */
    int draft_n;     /* speculative decoding, tokens drafted per step (--draft ngram, --draft-n): what the CLI
                        puts in gen_params.draft_n and the server's scheduler uses; 0 (default): off */
    int draft_mtp;   /* --draft mtp: the drafts come from the model's multi-token prediction block
                        (engine_seq_draft_mtp); engine_open refuses a model without one, and any backend
                        but the CPU's */
    const char *layer_split;     /* a layer split (engine/split.h): layers per rank, "N,M,..."; NULL: even by bytes */
    const char *devices;         /* --devices "cpu,cpu", "1,0": one rank per entry in this process (split_local.h) */
    int pipeline_windows;        /* a layer split reads each prompt chunk in this many windows, pipelined (forward.h) */
    struct split_net *split_net; /* set by split_local.c for the ranks it starts; NULL otherwise */
} engine_params;

/* One sequence: its KV cache, the tokens at its filled positions and the
 * logits of its last evaluated token. The server keeps one per slot, all on
 * one engine; the single-sequence API below works on the engine's own. */
typedef struct engine_seq {
    kv_cache *kv;
    int n_past;    /* positions filled in the cache */
    int32_t *hist; /* (n_ctx) the tokens at those positions */
    float *logits; /* (n_vocab) of the last evaluated token */
    int id;        /* names it in a layer split's commands (split.h) */
    /* --draft mtp (engine_mtp.c): every position's final hidden state (after
     * the output norm) and the MTP block's cache rows, kv->layers[n_layer] */
    float *mtp_hbuf; /* (1 + n_ctx) x n_embd: a zero row, then row p + 1 holds position p's; or NULL */
    int h_pos;       /* the rows of positions [0, h_pos) are the present tokens' */
    int mtp_pos;     /* the block's cache rows of positions [0, mtp_pos) are the present tokens' */
} engine_seq;

typedef struct engine {
    model *m;
    tokenizer *tok;
    st_backend *be;
    model_ctx *mc;
    int n_ctx;
    int n_ubatch; /* tokens per forward chunk (model_ctx's activation rows) */
    st_kv_type kv_type;
    struct engine_placed *placed; /* device copies of the weights (GPU backend), else NULL */
    int lanes;                    /* be is the expert lanes backend (moe_lanes.h): experts in several places */
    int il0, il1;                 /* the layers this engine runs (all but under a layer split, split.h) */
    struct split_net *net;        /* this rank's transport under a layer split, else NULL */
    struct split_local *local;    /* rank 0 of an in-process split: the other ranks (split_local.h) */
    int mtp;                      /* --draft mtp: sequences carry the MTP block's state (engine_mtp.c) */
    float *mtp_h, *mtp_logits;    /* a draft step's output row (n_embd) and logits (n_vocab) */
    int next_seq_id;
    /* engine_step's gathered inputs and outputs, (batch_cap) sequences / tokens */
    int batch_cap, tok_cap;
    st_kv_layer **batch_kv;
    int *batch_pos, *batch_n, *batch_ids;
    model_pick *batch_picks; /* (batch_cap) engine_step's picks, a row each */
    int32_t *batch_tok;
    float *batch_logits; /* [tok_cap][n_vocab] */
    float *batch_hid;    /* [tok_cap][n_embd]: the rows' final hidden states (--draft mtp), or NULL */
    /* The engine's own sequence, by either name: `seq` for the sequence
     * functions, or its fields directly (e->n_past, e->logits, e->kv) as the
     * single-sequence callers have always used them. Same members, same order. */
    union {
        engine_seq seq;
        struct {
            kv_cache *kv;
            int n_past;
            int32_t *hist;
            float *logits;
        };
    };
} engine;

engine_params engine_defaults(void);
/* 0 when the backend has every op the model's family needs, else -1 with
 * st_error naming the family and the backend (engine_open refuses then: at
 * load, never mid-request). */
int engine_backend_supports(const model *m, const st_backend *be);
/* NULL with st_error_get() naming what is wrong (file, architecture, context). */
engine *engine_open(const engine_params *p);
void engine_close(engine *e);

/* ---- sequences ---- */
/* A new empty sequence with a KV cache of the engine's context. */
engine_seq *engine_seq_new(engine *e);
void engine_seq_free(engine *e, engine_seq *s);
/* Evaluate tokens after the sequence's current content. -1 with st_error if
 * the context would overflow or an id is outside the vocabulary (nothing is
 * evaluated then). */
int engine_seq_eval(engine *e, engine_seq *s, const int32_t *toks, int n);
/* One token, with the k largest logits and their ids (in order) instead of
 * s->logits (model_forward_top_k): 0; 1 when s->logits got them all
 * instead (the backend could not); -1 with st_error (a bad token). */
int engine_seq_eval_top_k(engine *e, engine_seq *s, int32_t tok, int k, int32_t *ids, float *vals);
/* One token, with the backend's draw of a temperature-only sampler (inv_t,
 * uniform u: sampler_device_temp, sampler_draw_unit) into *out instead of
 * s->logits (model_forward_draw): 0; 1 when s->logits got them all instead
 * (no draw on this backend, or a NaN logit); -1 with st_error. */
int engine_seq_eval_draw(engine *e, engine_seq *s, int32_t tok, float inv_t, double u, int32_t *out);
/* Evaluate toks into s with every token's logits, [n][n_vocab] into logits
 * (speculative decoding's verification); s->logits is left as it was. -1
 * with st_error as engine_seq_eval. */
int engine_seq_eval_all(engine *e, engine_seq *s, const int32_t *toks, int n, float *logits);
/* How engine_seq_embed pools the tokens' final hidden states (after the output norm). */
typedef enum { ENGINE_POOL_NONE, ENGINE_POOL_MEAN, ENGINE_POOL_FIRST, ENGINE_POOL_LAST } engine_pool;
/* Evaluate toks into s (as engine_seq_eval, a chunk of n_ubatch at a time) and write their final hidden
 * states pooled into out: NONE every token's ([n][n_embd]), MEAN their average, FIRST / LAST one token's
 * (n_embd floats). Not normalized. -1 with st_error as engine_seq_eval. */
int engine_seq_embed(engine *e, engine_seq *s, const int32_t *toks, int n, engine_pool pool, float *out);
/* Forget the positions from n_past on (drafted tokens that were rejected).
 * A recurrent state goes back only into the last engine_seq_eval_all (it
 * replays the kept part of that pass: kv_cache_spec_keep). */
void engine_seq_truncate(engine_seq *s, int n_past);
/* Up to k drafted tokens after t, the pending token of position s->n_past,
 * from the model's multi-token prediction block (engine_mtp.c; the engine
 * opened with draft_mtp): first the block reads the positions evaluated
 * since it last ran (its cache rows follow the sequence's tokens, rejected
 * drafts included: engine_seq_truncate cuts both), then it chains: t with
 * the final hidden state of position n_past - 1 gives the first guess, each
 * guess with the block's own output the next. Each guess is the block's
 * most likely token after bias's logit bias (NULL: none). Into out; returns
 * how many (0: no MTP, or an evaluation that kept no hidden states). */
int engine_seq_draft_mtp(engine *e, engine_seq *s, int32_t t, int k, const sampler *bias, int32_t *out);
/* The MTP block's logits of n positions from pos0 of s, as the drafts see
 * them ([n][n_vocab]): row i from the token at pos0 + i and the hidden state
 * of the position before it; the block's cache rows are brought up to
 * pos0 + n. For tests against a reference. -1 with st_error when the
 * sequence's hidden states do not cover them. */
int engine_seq_mtp_logits(engine *e, engine_seq *s, int pos0, int n, float *logits);
/* 1 when the engine's sequences can verify drafts: no recurrent state, or a
 * backend that can roll one back (gated_delta_net_keep). */
int engine_drafts_ok(const engine *e);
/* Drop positions beyond the longest common prefix of the sequence and toks
 * (keeping at least one token to evaluate); returns the prefix length. */
int engine_seq_reuse_prefix(engine_seq *s, const int32_t *toks, int n);
/* Length of the common prefix of the sequence's tokens and toks (no change). */
int engine_seq_common_prefix(const engine_seq *s, const int32_t *toks, int n);
/* Reuse what the sequence shares with the prompt and read the rest, the last
 * token in a call of its own: batched and single-token products round
 * differently (and 8-bit activations amplify that), so this makes the first
 * sampled token's logits the same whether or not the prompt was cached.
 * Returns the reused count, or -1 with st_error. */
int engine_seq_read_prompt(engine *e, engine_seq *s, const int32_t *prompt, int n);
/* A prompt chunk of a batched step: seq reads toks[0..n) (n >= 1). */
typedef struct {
    engine_seq *seq;
    const int32_t *toks;
    int n;
} engine_chunk;

/* One batched step: each of the n_chunks chunks (none: NULL, 0) appends its
 * prompt tokens to its sequence, and gets the logits of its last token only
 * when chunk_logits is set; seqs[i] appends tok[i], one token each, and
 * gets its logits. All in one model_forward_batch, so the weights are read
 * once for the prompt chunks and the decoding sequences together; with
 * chunks, their tokens and n must fit n_ubatch. -1 with st_error (nothing
 * evaluated) if a sequence is full or an id is outside the vocabulary.
 * picks (NULL: none) holds one model_pick per sequence of seqs: where the
 * backend picks (its rc 0: the k largest logits, or a temperature's draw,
 * made on the device) the sequence's logits are not copied, so that a step
 * of many sequences on a GPU brings back a few pairs each instead of every
 * vocabulary row; rc 1: s->logits as without. */
int engine_step(engine *e, const engine_chunk *chunks, int n_chunks, int chunk_logits, engine_seq *const *seqs,
                const int32_t *tok, int n, model_pick *picks);
/* engine_step for speculative decoding: seqs[i] appends n_tok[i] tokens (its
 * pending token, then its drafts; toks holds them stacked in order) and
 * *logits points to every one's logits, [sum n_tok][n_vocab] in that order
 * (the engine's buffer, valid until the next step); s->logits gets each
 * sequence's last. The chunks get no logits; the chunks and all rows must fit
 * n_ubatch. A recurrent sequence with drafts can be cut back into them
 * (engine_seq_truncate) until it is evaluated again. */
int engine_step_drafts(engine *e, const engine_chunk *chunks, int n_chunks, engine_seq *const *seqs,
                       const int32_t *toks, const int *n_tok, int n, const float **logits);
/* engine_step without a prompt chunk: one decode step of n sequences. */
int engine_decode_batch(engine *e, engine_seq *const *seqs, const int32_t *tok, int n);

/* The same on the engine's own sequence (e->seq). */
int engine_eval(engine *e, const int32_t *toks, int n);
int engine_read_prompt(engine *e, const int32_t *prompt, int n);

typedef struct {
    int max_tokens;          /* <= 0: until the context is full */
    const char *const *stop; /* stop strings, not included in the output */
    int n_stop;
    int ignore_eos;
    int render_special; /* control tokens are written as their text (the server's harmony parser reads them) */
    int draft_n;        /* speculative decoding (engine_generate): up to this many tokens drafted by prompt lookup
                           (draft.h) and verified in one batched pass; 0: off (and where !engine_drafts_ok) */
    int draft_mtp;      /* ... drafted by the MTP block instead (engine_seq_draft_mtp; the engine's draft_mtp) */
} gen_params;

typedef struct {
    int n_prompt, n_reused, n_read;
    double prompt_ms;
    int n_gen;
    double gen_ms;
    int drafts_accepted, drafts_total;
    int lanes;                                 /* the experts live in several places: the pair counts below are set */
    uint64_t pairs_dev, pairs_cpu, pairs_pcie; /* its (token, expert) pairs by lane (moe_lanes.h) */
    uint64_t total_dev, total_cpu, total_pcie; /* the engine's pairs by lane since it opened (the server's
                                                  /metrics: a batched step's pairs count once there) */
    uint64_t bytes_ssd, ns_ssd; /* the SSD tier's reads (bytes, wall ns of the batches) in this request */
    uint64_t total_ssd;         /* its bytes since the engine opened */
    const char *finish;         /* "stop" (EOS or stop string), "length", "error" */
    int stop_index;             /* which gp->stop string ended generation; -1: none (EOS, length) */
    const char *expert_map;     /* lanes: the engine's expert cache at the end, map_layers x map_experts cells as
                                   moe_lanes_cache_map draws them (not owned; NULL: none) */
    int map_layers, map_experts;
} gen_stats;

/* Receives text as it becomes final (whole UTF-8 characters, stop strings
 * withheld). Return nonzero to stop early. */
typedef int (*gen_text_fn)(void *ctx, const char *text, size_t len);

/* Optional per-request additions to generation (the server's JSON mode and
 * log probabilities): filter changes the logits before sampling (a grammar
 * mask); token sees each sampled token with the logits as the model gave
 * them (before filter, penalties and temperature) and returns GEN_GO, or
 * GEN_END (the answer is complete: finish "stop") or GEN_CANCEL (stop
 * now: the reader is gone). eog_ok: end-of-generation tokens are ordinary
 * tokens (the filter decides instead). */
enum { GEN_GO = 0, GEN_END = 1, GEN_CANCEL = 2 };
typedef struct {
    int (*filter)(void *ctx, float *logits, int n_vocab); /* GEN_GO, or GEN_END: no token is allowed */
    /* with allow set, filter is a mask run only when needed (sampler_sample_checked): allow(ctx, t)
     * says whether t may come next, and filter returns how many tokens it left (0: none) */
    int (*allow)(void *ctx, int32_t t);
    int (*token)(void *ctx, int32_t t, const float *raw_logits);
    void *ctx;
    int eog_ok;
} gen_hooks;

/* Generation of one request on one sequence, a token at a time, so that a
 * scheduler can advance many requests by one batched step each:
 *     g = gen_begin(e, s, ...);          after the prompt is read into s
 *     while (gen_next(g, &t) == 0)       samples from s->logits, emits text
 *         engine_seq_eval(e, s, &t, 1);  (or one engine_decode_batch for all)
 *     gen_end(g, st);                    flushes the text, fills the stats
 * engine_generate is that loop on the engine's own sequence. */
typedef struct gen_state gen_state;
/* The sampler is reset and fed the prompt; hooks may be NULL. */
gen_state *gen_begin(engine *e, engine_seq *s, sampler *smp, const int32_t *prompt, int n_prompt, const gen_params *gp,
                     const gen_hooks *hooks, gen_text_fn fn, void *ctx);
/* Sample the next token from the sequence's logits and emit its text. 0 with
 * *t: evaluate t into the sequence and call again; 1: finished (the finish
 * reason is in the stats), t is not to be evaluated. */
int gen_next(gen_state *g, int32_t *t);
/* The same from the k largest logits (ids, vals in order; engine_seq_eval_top_k)
 * instead of s->logits: for samplers that need no more (sampler_candidates)
 * and no hooks. */
int gen_next_top(gen_state *g, const int32_t *ids, const float *vals, int k, int32_t *t);
/* The same with the token the backend drew (engine_seq_eval_draw), for
 * samplers with a device draw (sampler_device_temp) and no hooks. */
int gen_next_drawn(gen_state *g, int32_t tok, int32_t *t);
/* Speculative decoding (docs/speculative.md): evaluate *t, the pending
 * token, with up to draft_n tokens drafted by prompt lookup after it, in one
 * batched pass, and sample each position as gen_next would, keeping the
 * drafted tokens that were sampled. 0: *t is the next pending token (not
 * evaluated), call again; 1: finished. A recurrent state is rolled back to
 * the kept tokens (engine_seq_truncate); engine_drafts_ok must hold. */
int gen_next_drafted(gen_state *g, int32_t *t, int draft_n);
/* The same in two halves around a batched step of several sequences
 * (engine_step_drafts): gen_draft writes the pending token t and up to
 * draft_n drafted tokens into toks (room for draft_n + 1) and returns how
 * many (1 + drafts); once the step has evaluated them, gen_verify samples
 * from their logits ([n][n_vocab]) and returns as gen_next_drafted. */
int gen_draft(gen_state *g, int32_t t, int draft_n, int32_t *toks);
int gen_verify(gen_state *g, int32_t *t, const int32_t *toks, int n, const float *logits);
/* 1 once text or token callbacks asked to stop (the reader went away). */
int gen_cancelled(const gen_state *g);
/* Send what text is still held back, fill st's generation fields (n_gen,
 * gen_ms, finish, stop_index, the draft counters; prompt fields are the
 * caller's) and free g. */
void gen_end(gen_state *g, gen_stats *st);

/* Reuse what the cache shares with the prompt, read the rest, then sample up
 * to max_tokens. Returns 0, or -1 with st_error (context overflow, empty prompt). */
int engine_generate(engine *e, sampler *s, const int32_t *prompt, int n_prompt, const gen_params *gp, gen_text_fn fn,
                    void *ctx, gen_stats *st);

/* "prompt N tokens = R reused + M read in X ms (T tok/s), G generated in Y ms (U tok/s), drafts
 * accepted A of B" */
void gen_stats_format(const gen_stats *st, char *buf, size_t cap);

#endif
