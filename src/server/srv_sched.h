/* The engine side of the server: a queue of requests and N slots on one
 * engine, advanced together by one engine thread (continuous batching).
 *
 * This is the narrow interface between the HTTP front end and the engine: a
 * request goes in as plain data (prompt tokens, sampling and stop settings),
 * events come out (START, TEXT, DONE or ERROR), and the scheduler knows
 * nothing of HTTP or JSON. Keeping it this small is what lets the engine run
 * in a supervised child process (srv_proto.h): sched_create_supervised gives
 * the same interface with the scheduler itself running in that child.
 *
 * Slots share the model, its backend (one CPU thread pool) and activations;
 * each has its own sequence (KV cache, token history). Each iteration of the
 * engine thread: admit queued requests into free slots, then ONE batched
 * step (engine_step, model_forward_batch) holding one token of every slot
 * that is generating plus the next chunk of the prompt of one slot that is
 * reading its prompt (as many tokens as the step has rows left, n_ubatch in
 * all; the prompt's last token is that slot's first decode row instead),
 * then sample each slot with fresh logits. The weights are read once
 * per step for all of them, and a long prompt is read a chunk per step while
 * the running streams keep flowing. A slot whose client went away (an event
 * answered nonzero) is freed at once.
 *
 * Routing: a queued request goes to the free slot whose cached tokens share
 * the longest prefix with its prompt, as long as that prefix is at least half
 * of the prompt; otherwise to the least recently used free slot (an empty one
 * first), so that a new conversation does not evict another one only because
 * both start with the same few template tokens.
 */
#ifndef STRATA_SERVER_SRV_SCHED_H
#define STRATA_SERVER_SRV_SCHED_H

#include <stddef.h>
#include <stdint.h>

#include "engine/engine.h"
#include "engine/sampler.h"

typedef struct {
    const int32_t *prompt; /* (n_prompt) token ids, BOS included */
    int n_prompt;
    sampler_params sp;
    int max_tokens;          /* <= 0: until the context is full */
    const char *const *stop; /* (n_stop) stop strings, withheld from the text */
    int n_stop;
    int logprobs;     /* report each generated token's log probability (TOKEN events) */
    int top_logprobs; /* and the n (<= 20) most likely alternatives */
    const char *grammar; /* GBNF text (srv_grammar.h) the answer must follow, or NULL */
    size_t grammar_len;
    const char *grammar_trigger; /* the grammar holds only what follows this text, once the answer has it
                                    (a tool call's opening, tool_choice auto); NULL: all of the answer */
    int ignore_eos;   /* end-of-generation tokens do not end it (llama-server's ignore_eos) */
    int no_cache;     /* read the whole prompt, reusing nothing of the slot's cache (cache_prompt: false) */
    const char *const *dry_breakers; /* (n_dry_breakers) DRY's sequence breakers: a token whose piece holds one
                                        is a breaker (sp.dry_breaker is made from them when the slot starts) */
    int n_dry_breakers;
    int pin_slot;     /* 1 + the slot it must run in (it waits for that one), 0: any (llama-server's id_slot) */
    int render_special; /* control tokens are written as their text (harmony's <|channel|>, ...) */
    int embed;        /* 0: generate; 1 + engine_pool: the prompt's final hidden states, pooled (an EMBED event
                         then DONE; nothing is generated) */
} srv_request;

#define SRV_MAX_BREAKERS 16

typedef enum {
    SRV_EV_START, /* a slot took the request; return nonzero to drop it unread */
    SRV_EV_TEXT,  /* text, whole UTF-8 characters; return nonzero to stop generating */
    SRV_EV_DONE,  /* terminal: stats filled */
    SRV_EV_ERROR, /* terminal: error names what went wrong */
    SRV_EV_TOKEN, /* a generated token's log probability (logprobs requests), before its text */
    SRV_EV_EMBED, /* an embedding request's vectors, before its DONE */
} srv_event_kind;

typedef struct {
    srv_event_kind kind;
    int slot;
    const char *text; /* TEXT */
    size_t len;
    const gen_stats *stats; /* DONE */
    const char *error;      /* ERROR */
    int engine_down;        /* ERROR: the engine process stopped (503; the next request restarts it) */
    int32_t token;          /* TOKEN: the id, its log probability and the top alternatives */
    float logprob;
    int n_top;
    const int32_t *top_ids; /* (n_top) */
    const float *top_lp;    /* (n_top) */
    int n_cached;           /* DONE, ERROR: the tokens the slot's KV cache holds now (/slots, the KV gauge) */
    const float *embd;      /* EMBED: (n_embd) floats, n_prompt rows of them for ENGINE_POOL_NONE */
    size_t n_embd;
} srv_event;

/* Called on the engine thread. Exactly one terminal event (DONE or ERROR) ends
 * every accepted request; after it the scheduler touches neither the request
 * nor ctx again, so the request must stay valid until then. */
typedef int (*srv_event_fn)(void *ctx, const srv_event *ev);

typedef struct {
    int n_slots, busy, queued, max_queue, n_ctx;
    uint64_t done, failed, cancelled; /* requests finished by outcome */
    uint64_t prompt_tokens, reused_tokens, read_tokens, gen_tokens;
    double prompt_s, gen_s;               /* summed over requests */
    double last_prompt_tps, last_gen_tps; /* of the last finished request */
    uint64_t drafts_accepted, drafts_total; /* speculative decoding: drafted tokens accepted, drafted */
    const char *engine_state;             /* "ok", "loading" (first start), "restarting" (after the engine stopped) */
    int engine_pid;                       /* the process running the engines (this one when in-process) */
    uint64_t engine_restarts;             /* engine processes started after the first */
    int lanes;                            /* a MoE model's experts live in several places: */
    uint64_t pairs_dev, pairs_cpu, pairs_pcie; /* (token, expert) pairs by lane (moe_lanes.h), the engine's
                                                  totals as of its last finished request */
    uint64_t bytes_ssd;                   /* bytes the SSD tier read from the model file, the same way */
} sched_metrics;

typedef struct srv_sched srv_sched;

/* The engine's expert cache as of its last finished request (a gen_stats
 * expert_map, copied): n_layer x n_expert cells, or none (cells NULL). */
typedef struct {
    int n_layer, n_expert;
    char *cells;
} sched_map;
/* Keep st's map, if it has one (caller holds the role's lock). */
void sched_map_keep(sched_map *m, const gen_stats *st);
/* A copy of m's cells (st_malloc'd: the caller frees) into *cells; -1 when there is none. */
int sched_map_copy(const sched_map *m, char **cells, int *n_layer, int *n_expert);

/* Which model file: the front end's tokenizer and the engine process must read the same one. */
typedef struct {
    uint64_t size;
    int64_t mtime_ns;
    uint64_t head_hash;                   /* FNV-1a of the first MiB (the GGUF header and metadata) */
} model_ident;
/* The identity of the file at path now; -1 with st_error when it cannot be read. */
int model_ident_of(const char *path, model_ident *id);

/* What the front end asks of its engine process (sched_create_supervised). */
typedef struct {
    int heartbeat_timeout_s;              /* a child that sends nothing this long is killed; 0: never */
    model_ident model;                    /* a child finding another file there refuses to serve it */
    int once; /* the engine cannot restart: it joined an MPI job as its rank 0 (docs/multi.md), and
                 the job's other ranks cannot take a new one; when it ends, the server stops */
    int ranks; /* > 1: the engine is an MPI job of this many ranks the server launches itself
                  (serve --ranks, STRATA_MPIRUN); a rank that dies ends the job, which restarts whole */
} sched_supervision;

/* The scheduler has two roles behind one face: the engine's thread in this
 * process (sched_create, srv_sched.c), or the proxy of an engine process
 * (sched_create_supervised, srv_proc.c). Each fills this table and starts
 * its struct with a srv_sched; the sched_* functions below call through it. */
typedef struct {
    int (*submit)(srv_sched *s, const srv_request *req, srv_event_fn fn, void *ctx);
    void (*metrics)(srv_sched *s, sched_metrics *m);
    int (*expert_map)(srv_sched *s, char **cells, int *n_layer, int *n_expert);
    int (*n_ctx)(srv_sched *s);
    void (*wake)(srv_sched *s);
    void (*destroy)(srv_sched *s);
} sched_ops;
struct srv_sched {
    const sched_ops *ops;
};

/* Open the engine with n_slots sequences and start its thread in this process. NULL with
 * st_error_get(). */
srv_sched *sched_create(const engine_params *ep, int n_slots, int max_queue);
/* The same in a child process (srv_proto.h), spawned now and waited for; if it
 * dies, the requests in flight end with an ERROR event with engine_down set
 * and the next sched_submit (or sched_wake) starts a new one. */
srv_sched *sched_create_supervised(const engine_params *ep, int n_slots, int max_queue, const sched_supervision *sv);
/* Start the engine process if it is down; nothing in-process. */
void sched_wake(srv_sched *s);
/* Stops the engine thread: the running requests are told to stop, queued
 * ones end with an ERROR event. */
void sched_free(srv_sched *s);
/* Queue a request. 0, or -1 when the queue is full (no event will come). */
int sched_submit(srv_sched *s, const srv_request *req, srv_event_fn fn, void *ctx);
void sched_metrics_get(srv_sched *s, sched_metrics *m);
/* The expert cache picture (sched_map_copy); -1 when the engine has no expert lanes or no request finished. */
int sched_expert_map(srv_sched *s, char **cells, int *n_layer, int *n_expert);
/* Add a finished request's token counts, times and last speeds to m (the
 * outcome counters are the caller's). */
void sched_metrics_add(sched_metrics *m, const gen_stats *st);
int sched_n_ctx(srv_sched *s);

/* A request's additions to generation (srv_gen.c): hk gets the hooks for its
 * log probabilities (TOKEN events to fn with slot) and its grammar. NULL (hk
 * cleared) when it has neither, or when the grammar does not compile (err
 * then says why). *vocab: the vocabulary table the grammar walks, built on
 * first need and kept by the caller for the engine's life (srv_vocab_free). */
typedef struct srv_gen_extra srv_gen_extra;
typedef struct srv_vocab srv_vocab;
srv_gen_extra *srv_gen_extra_new(const engine *e, const srv_request *r, srv_event_fn fn, void *ctx, int slot,
                                 gen_hooks *hk, srv_vocab **vocab, char *err, size_t errcap);
void srv_gen_extra_free(srv_gen_extra *x);
void srv_vocab_free(srv_vocab *v);
/* DRY's breaker tokens: 1 for each token whose piece holds one of the
 * request's sequence breakers (st_malloc'd, n_vocab; NULL when it has none). */
uint8_t *srv_dry_breakers(const engine *e, const srv_request *r, srv_vocab **vocab);

#endif
