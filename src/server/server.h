/* The HTTP server: OpenAI- and Anthropic-compatible APIs over the engine's
 * worker slots (srv_proto.h), on libmicrohttpd with one thread per connection.
 *
 * Endpoints: POST /v1/chat/completions, /v1/completions, /v1/messages,
 * /v1/messages/count_tokens, /tokenize, /detokenize; GET /v1/models, /health,
 * /metrics (Prometheus text). docs/server.md lists the parameters and the
 * error policy. */
#ifndef STRATA_SERVER_SERVER_H
#define STRATA_SERVER_SERVER_H

#include "engine/engine.h"

typedef struct {
    engine_params ep; /* every slot opens its own engine with these */
    const char *host; /* "127.0.0.1" by default; an address with ':' is IPv6 */
    int port;         /* 0: any free port (the log names it) */
    int n_slots;
    int max_queue;             /* requests waiting for a slot before 503 */
    const char *api_key;       /* NULL: no authentication */
    size_t max_body;           /* bytes; a bigger body gets 413 */
    int read_timeout_s;        /* a request not read whole this long after its request line is cut off; 0: never */
    size_t max_inflight;       /* bytes of request bodies held at once; a request past it gets 503 */
    const char *allowed_hosts; /* comma-separated names the Host header may give ("*": any); NULL: the default */
    const char *cors_origin;   /* comma-separated web origins allowed cross-site ("*": any); NULL: none */
    int shutdown_timeout_s;    /* SIGTERM: requests in flight get this long to end before they are cut short */
    int engine_timeout_s;      /* an engine process silent this long is killed (its requests get 503); 0: never */
    int reasoning;             /* --reasoning-format: 1 auto (reasoning apart from the answer), 0 none */
    int reasoning_budget;      /* --reasoning-budget: tokens a reasoning block may spend when a request does not
                                  say (llama-server's); -1: no limit */
    const char *reasoning_budget_message; /* --reasoning-budget-message: text the engine writes before a block's
                                             end when the budget ends it, when a request does not say; NULL: none */
    int ranks; /* > 1: the engine runs as an MPI job of this many ranks (--ranks, docs/multi.md) */
} server_params;

#define SRV_BUDGET_MESSAGE_MAX 4096 /* bytes of a reasoning_budget_message (the request's or the flag's) */

server_params server_defaults(void);
/* Serve until SIGINT or SIGTERM. 0 after a clean stop, -1 with st_error_get()
 * when the model or the socket cannot be opened. */
int server_run(const server_params *p);
/* The engine process the server spawns (`strata engine --fd N`, hidden;
 * srv_proto.h). Not for users: it speaks the server's protocol on fd N. */
int server_engine_main(int argc, char **argv);

#endif
