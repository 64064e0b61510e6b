/* The one header both sides of the server include: the HTTP front end (the
 * files of src/server/, the parent) and the engine process (src/server/engine/,
 * the child). It holds what crosses between them: the scheduler's face
 * (srv_request in, srv_event out, sched_ops behind sched_*), and the wire
 * protocol between the parent (srv_proc.c) and the child
 * (engine/srv_engine_main.c). Nothing here knows HTTP or JSON.
 *
 * Why a child: a crash, an abort or the OOM killer in the engine must not
 * take the HTTP server down with it (DESIGN.md "The server outlives the
 * engine"). The parent spawns `/proc/self/exe engine --fd 3` with one end of
 * a socketpair as fd 3; the child runs the in-process scheduler
 * (engine/srv_sched.c: queue, slots, routing) and turns its events into frames. When
 * the socket reaches end of file the parent reaps the child, answers every
 * request in flight with 503, and the next request spawns a new child.
 *
 * Frames. Both ends are the same binary on the same machine, so integers and
 * floats travel in native byte order:
 *
 *     u32 len    payload bytes after this 16-byte header (<= PROTO_MAX_PAYLOAD)
 *     u32 type   PROTO_*
 *     u64 id     the request id (0 for CONFIG, READY, FAIL)
 *     payload    fields in order; str = u32 length + bytes (no NUL)
 *
 * parent -> child
 *   CONFIG   str model_path, i32 n_ctx, kv_type, n_threads, n_ubatch, gpu, n_slots, max_queue,
 *            u64 model size, i64 mtime_ns, u64 head_hash (the front end's model_ident)
 *            (first frame; the child loads the model on a thread, still reading the socket; a file
 *            that is not the front end's, before or after loading, is a FAIL)
 *   REQUEST  f32 temp, i32 top_k, f32 top_p, min_p, repeat_penalty, presence_penalty,
 *            frequency_penalty, i32 penalty_last_n, u64 seed, i32 max_tokens,
 *            u32 n_prompt, i32 token[n_prompt], u32 n_stop, str stop[n_stop], i32 logprobs,
 *            top_logprobs, str grammar (GBNF text, empty: none; compiled in the child), str trigger
 *            (the grammar starts after it; empty: at once), str think (the answer may open a reasoning
 *            block with it, then the grammar waits for the trigger; empty: no), i32 ignore_eos, no_cache, pin_slot,
 *            render_special, embed, str think_start, think_close, think_end (empty: no reasoning budget),
 *            think_message (empty: none), i32 think_budget, think_open
 *            (sent only after READY; the parent holds requests that come earlier)
 *   CANCEL   (no payload) the client went away: stop at the next token
 * child -> parent
 *   READY    i32 n_ctx, i32 n_slots           the engines are open
 *   FAIL     str message                      they could not be opened; the child exits 1
 *   START    i32 slot                         a slot took the request
 *   TEXT     i32 slot, bytes                  text (the rest of the payload, whole UTF-8 characters)
 *   DONE     i32 slot, n_prompt, n_reused, n_read, f64 prompt_ms, i32 n_gen, f64 gen_ms,
 *            i32 drafts_accepted, drafts_total, str finish, i32 stop_index
 *   ERROR    i32 slot, str message            the engine refused or failed the request
 *   EMBED    i32 slot, u32 n, f32[n]         an embedding request's vectors
 *   HEARTBEAT (no payload)                    every 250 ms from the start: the parent kills a child
 *                                             silent for --engine-timeout (stopped, hung)
 *
 * Every REQUEST gets exactly one DONE or ERROR unless the child dies first; a
 * CANCEL for an id that already ended is ignored. End of file on either side
 * means the other side is gone: the child exits at once, the parent reaps it.
 */
#ifndef STRATA_SERVER_SRV_PROTO_H
#define STRATA_SERVER_SRV_PROTO_H

#include <stddef.h>
#include <stdint.h>

#include "engine/engine.h"
#include "engine/sampler.h"

/* ---- growing byte buffer (srv_face.c) ---- */
typedef struct {
    char *s;
    size_t len, cap;
} sbuf;

void sbuf_put(sbuf *b, const char *s, size_t n);
void sbuf_puts(sbuf *b, const char *s);
void sbuf_printf(sbuf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void sbuf_free(sbuf *b);

/* ---- the scheduler's face: requests in, events out ---- */
typedef struct {
    const int32_t *prompt; /* (n_prompt) token ids, BOS included */
    int n_prompt;
    sampler_params sp;
    int max_tokens;          /* <= 0: until the context is full */
    const char *const *stop; /* (n_stop) stop strings, withheld from the text */
    int n_stop;
    int logprobs;        /* report each generated token's log probability (TOKEN events) */
    int top_logprobs;    /* and the n (<= 20) most likely alternatives */
    const char *grammar; /* GBNF text (srv_grammar.h) the answer must follow, or NULL */
    size_t grammar_len;
    const char *grammar_trigger; /* the grammar holds only what follows this text, once the answer has it
                                    (a tool call's opening, tool_choice auto); NULL: all of the answer */
    const char *grammar_think;   /* with grammar_trigger ("</think>"): the answer may open with this text
                                    ("<think>": a model that opens its reasoning itself); if it does, the
                                    grammar waits for the trigger, else it holds all of the answer */
    int ignore_eos;              /* end-of-generation tokens do not end it (llama-server's ignore_eos) */
    int no_cache;                /* read the whole prompt, reusing nothing of the slot's cache (cache_prompt: false) */
    const char *const *dry_breakers; /* (n_dry_breakers) DRY's sequence breakers: a token whose piece holds one
                                        is a breaker (sp.dry_breaker is made from them when the slot starts) */
    int n_dry_breakers;
    int pin_slot;            /* 1 + the slot it must run in (it waits for that one), 0: any (llama-server's id_slot) */
    int render_special;      /* control tokens are written as their text (harmony's <|channel|>, ...) */
    int embed;               /* 0: generate; 1 + engine_pool: the prompt's final hidden states, pooled (an EMBED event
                                then DONE; nothing is generated) */
    const char *think_start; /* a reasoning block's opening ("<think>"); with think_end: the reasoning budget */
    const char *think_close; /* what ends it when the model writes it ("</think>"; harmony's "<|end|>") */
    const char *think_end;   /* what the engine writes to end it once it has spent think_budget tokens
                                ("</think>"; harmony's end and the final message's opening); NULL: no budget */
    const char *think_message; /* written before think_end when the budget ends a block (llama-server's
                                  reasoning_budget_message); NULL: none */
    int think_budget;          /* tokens a reasoning block may spend (>= 0, 0: it is ended at once) */
    int think_open;            /* the prompt opened a block: the answer starts inside it */
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
    double prompt_s, gen_s;                 /* summed over requests */
    double last_prompt_tps, last_gen_tps;   /* of the last finished request */
    uint64_t drafts_accepted, drafts_total; /* speculative decoding: drafted tokens accepted, drafted */
    const char *engine_state;               /* "ok", "loading" (first start), "restarting" (after the engine stopped) */
    int engine_pid;                         /* the process running the engines (this one when in-process) */
    uint64_t engine_restarts;               /* engine processes started after the first */
    int lanes;                              /* a MoE model's experts live in several places: */
    uint64_t pairs_dev, pairs_cpu, pairs_pcie; /* (token, expert) pairs by lane (moe_lanes.h), the engine's
                                                  totals as of its last finished request */
    uint64_t bytes_ssd;                        /* bytes the SSD tier read from the model file, the same way */
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
    uint64_t head_hash; /* FNV-1a of the first MiB (the GGUF header and metadata) */
} model_ident;
/* The identity of the file at path now; -1 with st_error when it cannot be read. */
int model_ident_of(const char *path, model_ident *id);

/* What the front end asks of its engine process (sched_create_supervised). */
typedef struct {
    int heartbeat_timeout_s; /* a child that sends nothing this long is killed; 0: never */
    model_ident model;       /* a child finding another file there refuses to serve it */
    int once;                /* the engine cannot restart: it joined an MPI job as its rank 0 (docs/multi.md), and
                                the job's other ranks cannot take a new one; when it ends, the server stops */
    int ranks;               /* > 1: the engine is an MPI job of this many ranks the server launches itself
                                (serve --ranks, STRATA_MPIRUN); a rank that dies ends the job, which restarts whole */
} sched_supervision;

/* The scheduler has two roles behind one face: the engine's thread in this
 * process (sched_create, engine/srv_sched.c), or the proxy of an engine process
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

/* The scheduler in a child process (the wire below; the child runs sched_create of
 * engine/srv_sched.h), spawned now and waited for; if it dies, the requests in
 * flight end with an ERROR event with engine_down set and the next sched_submit
 * (or sched_wake) starts a new one. */
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

/* ---- the wire ---- */
#define PROTO_MAX_PAYLOAD ((uint32_t)256 << 20) /* a 16M-token context of prompt ids fits */
#define PROTO_CHILD_FD    3                     /* the socket's number in the child */

enum {
    PROTO_CONFIG = 1,
    PROTO_REQUEST,
    PROTO_CANCEL,
    PROTO_READY = 16,
    PROTO_FAIL,
    PROTO_START,
    PROTO_TEXT,
    PROTO_DONE,
    PROTO_ERROR,
    PROTO_TOKEN, /* i32 slot, i32 token, f32 logprob, u32 n_top, (i32 id, f32 logprob) x n_top */
    PROTO_HEARTBEAT,
    PROTO_EMBED, /* i32 slot, u32 n, f32 x n: an embedding request's vectors (before its DONE) */
};

typedef struct {
    uint32_t type;
    uint64_t id;
    uint8_t *payload; /* (len) owned, reused across proto_recv calls */
    uint32_t len, cap;
} proto_frame;

/* Send one frame (header + payload) whole. 0, or -1 when the peer is gone
 * (EPIPE and the like; SIGPIPE is never raised). Callers serialise senders. */
int proto_send(int fd, uint32_t type, uint64_t id, const void *payload, size_t len);
/* Receive one frame into f. 1 read, 0 end of file at a frame boundary, -1 a
 * broken or oversized frame, or a read error. */
int proto_recv(int fd, proto_frame *f);
void proto_frame_free(proto_frame *f);

/* Payload writers (append to b) and a bounds-checked reader. */
void proto_put_u32(sbuf *b, uint32_t v);
void proto_put_i32(sbuf *b, int32_t v);
void proto_put_u64(sbuf *b, uint64_t v);
void proto_put_f32(sbuf *b, float v);
void proto_put_f64(sbuf *b, double v);
void proto_put_str(sbuf *b, const char *s, size_t len);

typedef struct {
    const uint8_t *p;
    size_t left;
    int bad; /* set when a read ran past the end: every later read gives 0 */
} proto_cur;

uint32_t proto_get_u32(proto_cur *c);
int32_t proto_get_i32(proto_cur *c);
uint64_t proto_get_u64(proto_cur *c);
float proto_get_f32(proto_cur *c);
double proto_get_f64(proto_cur *c);
/* A string as pointer + length into the payload (not NUL-terminated). */
const char *proto_get_str(proto_cur *c, uint32_t *len);

/* Request and config encoding, shared by both ends so the field order lives in one place. */
void proto_put_request(sbuf *b, const srv_request *r);
/* A finished request's stats (PROTO_DONE); get: finish is one of the static
 * names "stop", "length", "error" ("stop" for anything else). */
void proto_put_stats(sbuf *b, const gen_stats *st);
void proto_get_stats(proto_cur *c, gen_stats *st);
/* Decodes into r with st_malloc'd prompt and stop strings (free with
 * proto_request_free). -1 on a malformed payload. */
int proto_get_request(proto_cur *c, srv_request *r);
void proto_request_free(srv_request *r);
void proto_put_config(sbuf *b, const engine_params *ep, int n_slots, int max_queue, const model_ident *id);
/* ep->model_path is st_malloc'd. -1 on a malformed payload. */
int proto_get_config(proto_cur *c, engine_params *ep, int *n_slots, int *max_queue, model_ident *id);
/* NULL when now is the file `want` describes, else why not (a static string, naming the file by
 * its base name only). */
/* The file name of path without its directories (what a client may be told of a path). */
const char *proto_base_name(const char *path);
const char *model_ident_mismatch(const char *path, const model_ident *want, const model_ident *now);

/* The child's entry point, server_engine_main, is in server.h (main.c calls it). */

#endif
