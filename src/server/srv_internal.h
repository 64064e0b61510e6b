/* Internals shared by the HTTP front end's files: the server state, growing
 * byte buffers, errors in each API's shape, strict JSON field readers, and
 * the job that carries one generation between a connection and a slot. */
#ifndef STRATA_SERVER_SRV_INTERNAL_H
#define STRATA_SERVER_SRV_INTERNAL_H

#include <jansson.h>
#include <microhttpd.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include "server/server.h"
#include "server/srv_proto.h"
#include "tokenizer/chat.h"
#include "tokenizer/tokenizer.h"

/* ---- server state ---- */
typedef enum { API_OPENAI, API_ANTHROPIC, API_N } srv_api; /* the shapes of errors (SRV_APIS) */

/* Texts longer than this are tokenized one at a time (srv_tokenize). */
#define SRV_BIG_TEXT ((size_t)256 << 10)

/* HTTP statuses counted for /metrics (the last bucket is "other"). */
#define SRV_N_STATUS 15
extern const int SRV_STATUS_CODES[SRV_N_STATUS];

/* What the front end knows of a slot (srv_slots.c). */
typedef struct {
    int processing;
    int n_prompt;     /* tokens of its current or last request's prompt */
    int n_decoded;    /* tokens its last finished request generated */
    int n_cached;     /* tokens its KV cache held when its last request ended */
    char id_task[64]; /* the id of its current or last request */
} srv_slot_info;

typedef struct {
    server_params p;
    srv_sched *sched;
    tokenizer *tok; /* the front end's own copy: counting, chat prompts, /tokenize */
    gguf_file *gf;  /* kept open for the server's life: its chat template renders every prompt */
    int tmpl_tools; /* the template renders `tools` itself (else a system message describes them) */
    int tmpl_calls; /* the template writes earlier calls itself (DeepSeek's: tools_template_calls) */
    int tools_fam;  /* tools_family (srv_tools.h): how this model writes a call */
    int reason;     /* reason_kind (srv_reason.h): how this model marks its reasoning */
    int tmpl_think; /* the template writes <think>: the model may open a reasoning block itself */
    int pooling;    /* the GGUF's <arch>.pooling_type (llama.cpp's: 1 mean, 2 cls, 3 last, 4 rank); 0 none */
    int harmony;    /* the template speaks harmony (gpt-oss): forced calls open its way, and the engine
                       writes the control tokens that mark its messages */
    chat_format fmt;
    const char *eot;      /* end-of-turn text of the chat format (a stop string) */
    char model_name[256]; /* the file name without .gguf: what /v1/models lists */
    int n_ctx;
    int n_embd;                  /* the model's width: an embedding's length */
    size_t max_piece;            /* bytes of text the longest token stands for (control tokens included) */
    size_t prompt_max_bytes;     /* n_ctx * max_piece: a longer text cannot fit the context, never tokenized */
    pthread_mutex_t big_text_mu; /* one tokenization of a text over SRV_BIG_TEXT bytes at a time */
    long started;                /* unix time */
    atomic_int ready;            /* set once sched and n_ctx are: until then every path answers 503 */
    pthread_mutex_t slots_mu;    /* slot_info, slots_restarts */
    srv_slot_info *slot_info;    /* (p.n_slots) */
    uint64_t slots_restarts;     /* engine restarts already applied to slot_info (a restart empties the caches) */
    atomic_int stopping;         /* requests still in flight are ended now */
    atomic_int draining;         /* SIGTERM: no new requests; those in flight may end (--shutdown-timeout) */
    atomic_int active;           /* requests from their headers to their end */
    int loopback;                /* bound to a loopback address: the Host check's default names apply */
    atomic_size_t inflight;      /* bytes of request bodies held now (--max-inflight) */
    atomic_uint_fast64_t by_status[SRV_N_STATUS];
    atomic_uint_fast64_t id_counter;
    struct read_guard *guard;           /* the read deadline's watchdog (srv_http.c), NULL when --read-timeout is 0 */
    atomic_uint_fast64_t read_timeouts; /* requests cut off by the read deadline */
} srv_ctx;

/* ---- errors ---- */
typedef struct {
    int status;
    char msg[512];
    char param[128];
    const char *code; /* OpenAI's error.code; NULL -> null */
} srv_err;

/* How each API answers an error: one row per srv_api (srv_util.c), as job_api is for answers. */
typedef struct {
    json_t *(*error_json)(const srv_err *e); /* the body: {"error":{...}} or {"type":"error","error":{...}} */
    int overloaded_status;                   /* the status a 503 goes out with (Anthropic's SDK expects 529) */
    /* the prompt leaves no room to generate: e filled (400 context_length_exceeded), -1 */
    int (*context_exceeded)(const srv_ctx *s, int n_prompt, const char *param, srv_err *e);
} srv_api_row;
extern const srv_api_row SRV_APIS[API_N];

/* Fill e and return -1, so parsers can `return srv_fail(...)`. */
int srv_fail(srv_err *e, int status, const char *param, const char *code, const char *fmt, ...)
    __attribute__((format(printf, 5, 6)));
/* {"error":{...}} or {"type":"error","error":{...}} for e. */
json_t *srv_error_json(srv_api api, const srv_err *e);
/* A JSON string of text that may hold invalid UTF-8 (bad bytes become U+FFFD). */
json_t *srv_json_text(const char *text, size_t len);

/* ---- strict field readers: 0 absent or null, 1 read, -1 wrong type or range (e filled) ---- */
int jf_string(json_t *o, const char *key, const char **out, srv_err *e);
int jf_bool(json_t *o, const char *key, int *out, srv_err *e);
int jf_number(json_t *o, const char *key, double lo, double hi, double *out, srv_err *e);
int jf_int(json_t *o, const char *key, long long lo, long long hi, long long *out, srv_err *e);
/* Every key of o must be in `known` (NULL-terminated); else 400 naming it. */
int jf_known_keys(json_t *o, const char *const *known, srv_err *e);
/* stop: a string or an array of at most 16 strings; empty strings are dropped. */
int jf_stops(json_t *o, const char *key, const char **stops, int *n_stop, srv_err *e);

/* Message content: a string, or an array of {"type":"text","text":...}
 * blocks joined with sep; other block types get 400. *out is st_malloc'd. */
int srv_content_text(json_t *content, const char *param, const char *sep, char **out, srv_err *e);
/* Sampling and length settings common to both APIs (temperature, top_p, top_k,
 * min_p, seed, penalties, max_tokens under the given key). */
typedef struct {
    const char *max_key; /* "max_tokens" or "max_completion_tokens" */
    double temp_max;     /* 2 for OpenAI, 1 for Anthropic */
} srv_sampling_rules;
/* Reads them into sp (API defaults: temperature 1, top_p 1, no top-k/min-p,
 * a random seed) and *max_tokens (0 when absent). */
int srv_parse_sampling(srv_ctx *s, json_t *body, const srv_sampling_rules *r, sampler_params *sp, int *max_tokens,
                       srv_err *e);

/* ---- prompts ---- */
/* Tokens of text (BOS by the model's rules, control-token text recognised). */
/* A text longer than s->prompt_max_bytes is refused (400 context_length_exceeded naming param) before
 * the tokenizer sees it. */
int32_t *srv_tokenize(srv_ctx *s, const char *text, size_t len, int add_special, int parse_special, const char *param,
                      int *n, srv_err *e);
/* Render OpenAI-shaped messages with the model's chat template and tokenize
 * (srv_chat.c). A last assistant message without tool calls is continued
 * (Anthropic's prefill) instead of closed. tools: OpenAI-shaped, or NULL;
 * force: NULL, "" (tool_choice required) or the function to call, whose
 * opening is written after the generation prompt (*opening, st_malloc'd).
 * kwargs: more variables for the template (chat_template_kwargs), or NULL. */
/* reason: the reasoning is told apart (reasoning_format). *think_open (may be NULL): the prompt ends
 * inside an open think block (1; 2 in the middle of its text, reason_prefill_open), or SRV_THINK_MAY:
 * the answer starts outside one, and the model, whose template knows <think>, may open it itself
 * (reason on and no prefill). When the model may reason first (the block open, or SRV_THINK_MAY), a
 * forced call's opening is not written: *lead gets it (st_malloc'd), for the grammar to start with. */
#define SRV_THINK_MAY (-1)
int32_t *srv_chat_prompt(srv_ctx *s, json_t *messages, json_t *tools, const char *force, json_t *kwargs, int reason,
                         char **opening, char **lead, int *think_open, int *n_tok, srv_err *e);
/* reasoning_format (llama-server's): "none", "auto" or "deepseek" from body (absent: the server's
 * --reasoning-format) into *on; 400 otherwise. */
int srv_parse_reasoning_format(srv_ctx *s, json_t *body, int *on, srv_err *e);
struct srv_job;
/* Separate the answer's reasoning from its content (srv_reason.h) when on and the model marks it;
 * a forced call's opening is fed through it, so later stages see the content only. */
void srv_job_reasoning(struct srv_job *j, int on, int think_open);
/* A reasoning budget (Anthropic's thinking.budget_tokens, llama-server's reasoning_budget_tokens): a
 * reasoning block of the answer spends at most budget tokens, then the engine ends it (engine/srv_gen.c);
 * budget < 0: none. think_open: the prompt opened the block. message (llama-server's
 * reasoning_budget_message; NULL: the server's --reasoning-budget-message): text written before the end. */
void srv_job_think_budget(struct srv_job *j, int budget, int think_open, const char *message);
/* The opening of a forced call in the model's family (name: "" for any of the tools, or a function's),
 * which srv_chat_prompt writes after the generation prompt. st_malloc'd. */
char *srv_call_opening(srv_ctx *s, const char *name);
/* 400 (code) naming param unless text[0..len) compiles as a grammar (srv_grammar.h). */
int srv_grammar_check(const char *text, size_t len, const char *param, const char *code, srv_err *e);
/* The grammar of a forced call (force: "" for any of the tools, or a function's name) in the model's
 * format, continuing the opening srv_chat_prompt wrote, or starting with lead (the opening the model
 * writes itself, after its reasoning); NULL with 400 when a tool's schema cannot be enforced.
 * st_malloc'd. */
char *srv_tools_grammar(srv_ctx *s, json_t *tools, const char *force, const char *lead, srv_api api, srv_err *e);
/* tool_choice auto: once the answer writes a call's opening (`<tool_call>`), the rest is held to whole
 * calls of the tools (a grammar with a trigger). Nothing when a schema cannot be enforced or the format
 * has no opening (Llama 3). */
struct srv_job;
void srv_job_lazy_tools(struct srv_job *j, json_t *tools, srv_api api);
/* 400 unless tools is an array of valid {"type":"function","function":{name,...}}. */
int srv_check_tools(json_t *tools, srv_api api, const char *param, srv_err *e);
/* 400 (context_length_exceeded) when the prompt leaves no room to generate. */
int srv_check_context(srv_ctx *s, int n_prompt, srv_api api, const char *param, srv_err *e);
/* A fresh id "<prefix><24 hex>" and an unpredictable seed. */
void srv_make_id(srv_ctx *s, const char *prefix, char *out, size_t cap);
uint64_t srv_random_seed(srv_ctx *s);

/* ---- jobs: one generation between a connection and a slot ---- */
typedef enum { JOB_OAI_CHAT, JOB_OAI_COMPLETION, JOB_ANTHROPIC, JOB_EMBED, JOB_N_KINDS } job_kind;

struct srv_job;
/* What an API writes once its job runs: one row per kind of job (JOB_APIS in
 * srv_job.c), so that a third API is a new row and its own file, not a test
 * of the kind in every place that writes an answer. The writers are called
 * with the job's mutex held; a NULL writer is never called for that kind
 * (an embedding job neither streams nor answers through the job). */
typedef struct {
    srv_api errors;          /* the shape of its errors (srv_error_json) */
    const char *id_prefix;   /* the answer's id: "chatcmpl-", "msg_", ... */
    const char *call_prefix; /* its tool calls' ids: "call_", "toolu_" */
    void (*stream_begin)(struct srv_job *j);
    void (*stream_text)(struct srv_job *j, const char *text, size_t len);
    void (*stream_reasoning)(struct srv_job *j, const char *text, size_t len);
    void (*stream_end)(struct srv_job *j); /* the last event(s): the end, or the error of a failed job */
    void (*token)(struct srv_job *j, const srv_event *ev); /* a generated token's log probabilities (TOKEN) */
    json_t *(*response)(struct srv_job *j);                /* the whole answer of a job that does not stream */
} job_api;

typedef struct srv_job {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int refs; /* the connection's and the scheduler's */
    int cancelled, done, started;
    int failed;        /* 1: the engine failed it (500), 2: the engine process died (503), 3: shutdown (503) */
    int aborted;       /* the answer was ended early (shutdown): later events are dropped */
    int shutdown_stop; /* on_event told the engine to stop for the shutdown: its end is the cut (503) */
    srv_ctx *srv;
    job_kind kind;
    const job_api *api; /* the kind's row: how its answers are written */
    int stream, include_usage;
    int fd;     /* the client's socket, watched for a hang-up */
    int http10; /* an HTTP/1.0 request: no interim (1xx) answer may be sent */
    int probed; /* the client shut its side: a 103 was sent to tell a half-close from a hang-up */
    char id[64];
    long created;
    /* the request, owned */
    srv_request req;
    int32_t *prompt;
    const char *stops[17];
    char *stop_store[17];
    int32_t *bias_ids; /* req.sp's logit bias */
    float *bias_vals;
    char *dry_breakers[SRV_MAX_BREAKERS]; /* req's */
    int n_user_stop;                      /* stops[n_user_stop..] are the format's end of turn */
    /* results */
    json_t *tools; /* tools the answer may call (parsed at the end), or NULL */
    json_t *lp;    /* logprobs requests: token entries not yet sent (OpenAI chat shape) */
    int lp_top;    /* the alternatives the client asked for in them */
    json_t *probs; /* n_probs (llama-server's): every token's entry with ids, or NULL */
    int n_probs;
    size_t lp_offset;         /* bytes of text the sent entries cover (the legacy text_offset) */
    char *call_opening;       /* a forced call's opening, written into the prompt */
    char *think_message;      /* req.think_message (owned) */
    char *grammar;            /* the grammar the answer follows (req.grammar), or NULL */
    struct tools_stream *ts;  /* a stream with tools: calls parsed as they come (srv_tools.h) */
    struct reason_stream *rs; /* the reasoning told apart from the content (srv_reason.h), or NULL */
    sbuf reasoning;           /* the whole reasoning (non-streaming) */
    int think_open;           /* the prompt ends inside <think>: the answer starts in its reasoning */
    int think_may;            /* the answer may open <think> itself (SRV_THINK_MAY): a grammar waits for it */
    int ts_calls;             /* calls it sent, once it ended */
    int blk_n, blk_open;      /* Anthropic stream: content blocks started; 1 text / 2 tool_use / 3 thinking open */
    sbuf text;                /* the whole answer (non-streaming, or streaming with tools) */
    sbuf out;                 /* bytes ready for the client (streaming) */
    size_t out_sent;
    gen_stats st;
    float *embd; /* an embedding request's vectors (EMBED event), or NULL */
    size_t n_embd;
    char err[512];
} srv_job;

srv_job *job_new(srv_ctx *s, job_kind kind, struct MHD_Connection *c);
/* The HTTP version of the request this connection thread is handling (1 for HTTP/1.0); set by
 * the access handler (one thread per connection, so the handler and its job share the thread). */
extern _Thread_local int srv_req_http10;
/* Takes ownership of the prompt tokens; copies the stop strings. */
void job_set_prompt(srv_job *j, int32_t *prompt, int n_prompt, const char *const *stops, int n_stop);
void job_release(srv_job *j);
/* llama-server's sampling fields (srv_sampling.c): logit_bias, typical_p,
 * repeat_last_n, DRY, samplers; into j->req, the storage j's. */
int srv_parse_llama_sampling(srv_ctx *s, json_t *body, srv_job *j, srv_err *e);
/* Takes ownership of the grammar text (NULL: none). */
void job_set_grammar(srv_job *j, char *grammar);
/* Queue the job and answer the connection: streaming responses start at
 * once, others wait for the end. Returns the MHD result to hand back. */
enum MHD_Result job_run(srv_job *j, struct MHD_Connection *c);

/* Embeddings (srv_embed.c) run jobs without a response of their own: queue (0, or -1 when the queue is
 * full), then wait for the end (0; -1 when the client left or the server stops first). */
int job_submit(srv_job *j);
int job_wait(srv_job *j);

/* API-specific output, called with the job's mutex held. */
void oai_stream_begin(srv_job *j);
void oai_stream_text(srv_job *j, const char *text, size_t len);
void oai_stream_reasoning(srv_job *j, const char *text, size_t len);
void oai_stream_end(srv_job *j);
void oai_token(srv_job *j, const srv_event *ev);
json_t *oai_response(srv_job *j);
void anth_stream_begin(srv_job *j);
void anth_stream_text(srv_job *j, const char *text, size_t len);
void anth_stream_reasoning(srv_job *j, const char *text, size_t len);
void anth_stream_end(srv_job *j);
json_t *anth_response(srv_job *j);

/* The prefix of the answer's tool call ids ("call_<hex>_" / "toolu_<hex>_"). */
void srv_job_call_prefix(const srv_job *j, char *out, size_t cap);
/* Feed the forced call's opening to j->ts (made by the API's stream begin). */
void srv_job_stream_opening(srv_job *j);
/* The finished answer's tool calls (OpenAI shape) or NULL; content gets the
 * text before them (the whole answer when there are none). */
json_t *srv_job_tool_calls(srv_job *j, sbuf *content);

/* ---- request checks before routing (srv_check.c) ---- */
/* The headers that decide framing and addressing, read once, and the first syntax fault. */
typedef struct {
    const char *cl, *te, *host;
    int n_te, n_host, cl_differ;
    char bad[160]; /* the first header that breaks RFC 9110/9112 syntax, described */
} srv_headers;
void srv_headers_read(struct MHD_Connection *c, srv_headers *h);
/* What makes the request's end ambiguous or its headers invalid, or NULL; *status 400 or 501. */
const char *srv_headers_problem(const srv_headers *h, const char *version, int *status);
/* The Host names this server (--allowed-hosts, or its default); NULL (HTTP/1.0) passes. */
int srv_host_allowed(srv_ctx *s, const char *host);
/* 2: allowed by --cors-origin; 1: the server's own origin; 0: refused. */
int srv_origin_allowed(srv_ctx *s, const char *origin, const char *host);
/* The request's Origin when --cors-origin allows it (answers name it), else NULL. */
const char *srv_cors_origin(srv_ctx *s, struct MHD_Connection *c);
/* Content-Type's media type is application/json. */
int srv_is_json_type(const char *ct);
struct addrinfo;
/* 1 for an address only this machine reaches: 127.0.0.0/8, ::1, localhost. */
int srv_is_loopback(const struct addrinfo *ai, const char *host);

/* ---- responses ---- */
enum MHD_Result srv_send_json(srv_ctx *s, struct MHD_Connection *c, int status, json_t *body);
enum MHD_Result srv_send_error(srv_ctx *s, struct MHD_Connection *c, srv_api api, const srv_err *e);
enum MHD_Result srv_send_text(srv_ctx *s, struct MHD_Connection *c, int status, const char *type, char *text,
                              size_t len);
/* Queues r (and gives it up), counting its status in /metrics once MHD took it. */
enum MHD_Result srv_queue(srv_ctx *s, struct MHD_Connection *c, int status, struct MHD_Response *r);

/* ---- endpoints (body already parsed, auth checked) ---- */
enum MHD_Result oai_chat(srv_ctx *s, struct MHD_Connection *c, json_t *body);
enum MHD_Result oai_completions(srv_ctx *s, struct MHD_Connection *c, json_t *body);
enum MHD_Result anth_messages(srv_ctx *s, struct MHD_Connection *c, json_t *body);
enum MHD_Result anth_count_tokens(srv_ctx *s, struct MHD_Connection *c, json_t *body);
enum MHD_Result srv_models(srv_ctx *s, struct MHD_Connection *c, const char *id);
enum MHD_Result srv_metrics(srv_ctx *s, struct MHD_Connection *c);
/* GET /props, as llama-server names it: the model, context, slots, chat template. */
enum MHD_Result srv_props(srv_ctx *s, struct MHD_Connection *c);
enum MHD_Result srv_experts(srv_ctx *s, struct MHD_Connection *c);
/* /slots and the KV gauges (srv_slots.c) */
void srv_slots_init(srv_ctx *s);
void srv_slots_free(srv_ctx *s);
void srv_slots_event(srv_ctx *s, const srv_job *j, const srv_event *ev);
void srv_slots_kv(srv_ctx *s, const sched_metrics *m, long long *tokens, long long *capacity);
enum MHD_Result srv_slots_ep(srv_ctx *s, struct MHD_Connection *c);
enum MHD_Result srv_tokenize_ep(srv_ctx *s, struct MHD_Connection *c, json_t *body);
/* POST /v1/embeddings (OpenAI) and /embedding, /embeddings (llama-server's), srv_embed.c */
enum MHD_Result srv_embeddings_oai(srv_ctx *s, struct MHD_Connection *c, json_t *body);
enum MHD_Result srv_embeddings_llama(srv_ctx *s, struct MHD_Connection *c, json_t *body);
enum MHD_Result srv_detokenize_ep(srv_ctx *s, struct MHD_Connection *c, json_t *body);

#endif
