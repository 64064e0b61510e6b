/* `strata serve`: the OpenAI- and Anthropic-compatible HTTP server
 * (server/server.h) on the default model unless -m names another. It binds
 * 127.0.0.1 unless --host says otherwise: a server open to the network is a
 * choice the user makes, ideally with --api-key. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"
#include "cli/engine_opts.h"
#include "core/log.h"
#include "engine/split.h"
#include "server/server.h"

#define SERVE_USAGE                                                                                                    \
    "strata serve " ENGINE_OPTS_USAGE " [--host ADDR] [--port N] [--slots N] [--queue N] [--api-key KEY] "             \
    "[--max-body MB] [--read-timeout S] [--max-inflight MB] [--allowed-hosts LIST] [--cors-origin LIST] "              \
    "[--shutdown-timeout S] [--engine-timeout S] [--reasoning-format auto|deepseek|none] [--reasoning-budget N] "      \
    "[--reasoning-budget-message TEXT] "                                                                               \
    "[--ranks N]"

int cmd_serve(int argc, char **argv) {
    args_t a = {.cmd = "serve", .usage = SERVE_USAGE, .argc = argc, .argv = argv, .i = 1};
    server_params p = server_defaults();
    p.ep.model_path = STRATA_DEFAULT_MODEL;
    p.api_key = getenv("STRATA_API_KEY");
    while (a.i < a.argc) {
        if (args_is_help(&a)) {
            printf("usage: %s\n\n", SERVE_USAGE);
            printf("Serves POST /v1/chat/completions, /v1/completions (OpenAI), /v1/messages,\n"
                   "/v1/messages/count_tokens (Anthropic), /tokenize, /detokenize and GET /v1/models,\n"
                   "/health, /metrics. --slots N sequences (default 1) share one engine, each with its\n"
                   "own KV cache of --ctx tokens, and decode together in one batched step per token;\n"
                   "--queue N requests (default 64) may wait for a free one\n"
                   "before the server answers 503. --api-key (or STRATA_API_KEY) requires\n"
                   "'Authorization: Bearer KEY' or 'x-api-key: KEY' on every path but /health.\n"
                   "A request not read whole within --read-timeout S seconds (default 30; 0: no limit)\n"
                   "of its connection opening, or of the previous request on it ending, has its\n"
                   "answer 408 and its connection closed. Request bodies held at once are capped by\n"
                   "--max-inflight MB (default 64; past it: 503). The Host header must name this\n"
                   "server (--allowed-hosts a,b; '*': any; default on a loopback address: localhost and\n"
                   "the loopback addresses), a browser's Origin must be its own or in --cors-origin\n"
                   "(default: none; '*': any), and POST bodies must be application/json.\n"
                   "SIGTERM/SIGINT: stop accepting, let requests in flight end for --shutdown-timeout S\n"
                   "(default 10), then end the rest (streams with a final error event). An engine\n"
                   "process silent for --engine-timeout S (default 10; 0: never) is killed: its requests\n"
                   "get 503 and the next request starts a new one. --reasoning-format (default auto;\n"
                   "deepseek: the same; none: off) sets whether a thinking model's reasoning comes apart\n"
                   "from its answer (reasoning_content, Anthropic thinking blocks); requests may say.\n"
                   "--reasoning-budget N (default -1: none): a reasoning block ends after N tokens (0: at\n"
                   "once) unless a request sets its own (reasoning_budget_tokens, Anthropic budget_tokens);\n"
                   "--reasoning-budget-message TEXT is written before its end (requests: reasoning_budget_message).\n"
                   "Defaults: model %s, --host 127.0.0.1 --port 8080 --max-body 8 (MB).\n"
                   "See docs/server.md.\n",
                   STRATA_DEFAULT_MODEL);
            return 0;
        }
        int r = engine_opts_parse(&a, &p.ep);
        if (r > 0) continue;
        if (r < 0) return a.err;
        const char *v;
        long long n;
        if ((r = args_value(&a, "--host", &v))) {
            if (r < 0) return a.err;
            p.host = v;
        } else if ((r = args_value(&a, "--port", &v))) {
            if (r < 0 || args_int(&a, "--port", v, 0, 65535, &n)) return a.err;
            p.port = (int)n;
        } else if ((r = args_value(&a, "--slots", &v)) || (r = args_value(&a, "-np", &v))) {
            if (r < 0 || args_int(&a, "--slots", v, 1, 256, &n)) return a.err;
            p.n_slots = (int)n;
        } else if ((r = args_value(&a, "--queue", &v))) {
            if (r < 0 || args_int(&a, "--queue", v, 1, 1 << 20, &n)) return a.err;
            p.max_queue = (int)n;
        } else if ((r = args_value(&a, "--max-body", &v))) {
            if (r < 0 || args_int(&a, "--max-body", v, 1, 1024, &n)) return a.err;
            p.max_body = (size_t)n << 20;
        } else if ((r = args_value(&a, "--read-timeout", &v))) {
            if (r < 0 || args_int(&a, "--read-timeout", v, 0, 86400, &n)) return a.err;
            p.read_timeout_s = (int)n;
        } else if ((r = args_value(&a, "--max-inflight", &v))) {
            if (r < 0 || args_int(&a, "--max-inflight", v, 1, 1 << 20, &n)) return a.err;
            p.max_inflight = (size_t)n << 20;
        } else if ((r = args_value(&a, "--allowed-hosts", &v))) {
            if (r < 0) return a.err;
            p.allowed_hosts = v;
        } else if ((r = args_value(&a, "--cors-origin", &v))) {
            if (r < 0) return a.err;
            p.cors_origin = v;
        } else if ((r = args_value(&a, "--shutdown-timeout", &v))) {
            if (r < 0 || args_int(&a, "--shutdown-timeout", v, 0, 86400, &n)) return a.err;
            p.shutdown_timeout_s = (int)n;
        } else if ((r = args_value(&a, "--ranks", &v))) {
            if (r < 0 || args_int(&a, "--ranks", v, 1, 1024, &n)) return a.err;
            p.ranks = (int)n;
        } else if ((r = args_value(&a, "--engine-timeout", &v))) {
            if (r < 0 || args_int(&a, "--engine-timeout", v, 0, 86400, &n)) return a.err;
            p.engine_timeout_s = (int)n;
        } else if ((r = args_value(&a, "--reasoning-format", &v))) {
            if (r < 0) return a.err;
            if (strcmp(v, "auto") && strcmp(v, "deepseek") && strcmp(v, "none")) {
                fprintf(stderr, "strata serve: --reasoning-format must be auto, deepseek or none, not '%s'\n", v);
                return 2;
            }
            p.reasoning = strcmp(v, "none") != 0;
        } else if ((r = args_value(&a, "--reasoning-budget", &v))) {
            if (r < 0 || args_int(&a, "--reasoning-budget", v, -1, 2147483647, &n)) return a.err;
            p.reasoning_budget = (int)n;
        } else if ((r = args_value(&a, "--reasoning-budget-message", &v))) {
            if (r < 0) return a.err;
            if (strlen(v) > SRV_BUDGET_MESSAGE_MAX) {
                fprintf(stderr, "strata serve: --reasoning-budget-message is longer than %d bytes\n",
                        SRV_BUDGET_MESSAGE_MAX);
                return 2;
            }
            p.reasoning_budget_message = v;
        } else if ((r = args_value(&a, "--api-key", &v))) {
            if (r < 0) return a.err;
            p.api_key = v;
        } else return args_unknown(&a);
    }
    if (p.api_key && !p.api_key[0]) p.api_key = NULL;
    if (split_rank() > 0) {
        /* under mpirun, a rank other than 0 serves no HTTP: it follows rank 0's engine
         * (engine_open does not return here) until that engine stops (docs/multi.md) */
        if (!engine_open(&p.ep)) fprintf(stderr, "strata serve: rank %d: %s\n", split_rank(), st_error_get());
        return 1;
    }
    if (server_run(&p) != 0) {
        fprintf(stderr, "strata serve: %s\n", st_error_get());
        return 1;
    }
    if (split_launched_size() > 1) {
        /* the front end of an MPI job: its engine, the job's rank 0, is gone; a nonzero exit is what
         * makes mpirun end the other ranks, which would otherwise wait for it (docs/multi.md) */
        fprintf(stderr, "strata serve: stopped; exiting with code 3 so that mpirun ends the job's other ranks\n");
        return 3;
    }
    return 0;
}
