/* The HTTP front end (server.h): libmicrohttpd with one thread per
 * connection, so a handler may block while its request waits for a slot.
 *
 * Every request is answered, whatever it holds: the body is collected up to
 * max_body bytes (more is read and dropped, then 413, so that a client still
 * sending gets the answer instead of a reset), parsed by jansson (strict:
 * invalid UTF-8, NUL escapes, duplicate keys and nesting deeper than its
 * limit are 400), and errors take the shape of the API the path belongs to. */
#include <netdb.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <time.h>

#include "core/alloc.h"
#include "core/log.h"
#include "server/srv_internal.h"
#include "server/srv_tools.h"
#include "server/srv_web.h"

/* A declared or received body beyond this is not read to its end: 413 at once, then close. */
#define DRAIN_CAP ((uint64_t)256 << 20)

const int SRV_STATUS_CODES[SRV_N_STATUS] = {200, 400, 401, 404, 405, 413, 429, 500, 503, 529, 0};

typedef struct {
    sbuf body;
    uint64_t received;
    int too_big, answered;
} conn_state;

server_params server_defaults(void) {
    server_params p = {0};
    p.ep = engine_defaults();
    p.host = "127.0.0.1";
    p.port = 8080;
    p.n_slots = 1;
    p.max_queue = 64;
    p.max_body = 8u << 20;
    return p;
}

void srv_count_status(srv_ctx *s, int status) {
    int i = 0;
    while (i < SRV_N_STATUS - 1 && SRV_STATUS_CODES[i] != status) i++;
    atomic_fetch_add(&s->by_status[i], 1);
}

enum MHD_Result srv_send_text(srv_ctx *s, struct MHD_Connection *c, int status, const char *type, char *text,
                              size_t len) {
    struct MHD_Response *r = MHD_create_response_from_buffer(len, text, MHD_RESPMEM_MUST_FREE);
    MHD_add_response_header(r, "Content-Type", type);
    srv_count_status(s, status);
    enum MHD_Result ok = MHD_queue_response(c, (unsigned)status, r);
    MHD_destroy_response(r);
    return ok;
}

enum MHD_Result srv_send_json(srv_ctx *s, struct MHD_Connection *c, int status, json_t *body) {
    ST_ASSERT(body); /* every body we build is valid: a NULL here is a bug */
    char *txt = json_dumps(body, JSON_COMPACT);
    json_decref(body);
    return srv_send_text(s, c, status, "application/json", txt, strlen(txt));
}

enum MHD_Result srv_send_error(srv_ctx *s, struct MHD_Connection *c, srv_api api, const srv_err *e) {
    if (e->status >= 500) ST_WARN("answered %d: %s", e->status, e->msg);
    return srv_send_json(s, c, e->status, srv_error_json(api, e));
}

static enum MHD_Result send_fail(srv_ctx *s, struct MHD_Connection *c, srv_api api, int status, const char *code,
                                 const char *msg) {
    srv_err e;
    srv_fail(&e, status, NULL, code, "%s", msg);
    return srv_send_error(s, c, api, &e);
}

/* Constant-time comparison, so the key cannot be guessed byte by byte from timing. */
static int same_secret(const char *a, const char *b) {
    size_t la = strlen(a), lb = strlen(b);
    unsigned char d = (unsigned char)(la != lb);
    for (size_t i = 0; i < lb; i++) d |= (unsigned char)(a[i < la ? i : 0] ^ b[i]);
    return d == 0;
}

static int authorized(srv_ctx *s, struct MHD_Connection *c) {
    if (!s->p.api_key) return 1;
    const char *h = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Authorization");
    if (h && !strncasecmp(h, "Bearer ", 7) && same_secret(h + 7, s->p.api_key)) return 1;
    h = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "x-api-key");
    return h && same_secret(h, s->p.api_key);
}

/* Parse the body as a JSON object; NULL with e filled. */
static json_t *parse_body(const conn_state *cs, srv_err *e) {
    if (!cs->body.len) {
        srv_fail(e, 400, NULL, "invalid_json", "the request body is empty; a JSON object is expected");
        return NULL;
    }
    json_error_t jerr;
    json_t *root = json_loadb(cs->body.s, cs->body.len, JSON_REJECT_DUPLICATES, &jerr);
    if (!root) {
        /* jansson quotes the bytes near the error: keep them printable ASCII */
        for (char *p = jerr.text; *p; p++)
            if ((unsigned char)*p < 0x20 || (unsigned char)*p > 0x7e) *p = '?';
        srv_fail(e, 400, NULL, "invalid_json", "the body is not valid JSON (line %d, column %d): %s", jerr.line,
                 jerr.column, jerr.text);
        return NULL;
    }
    if (!json_is_object(root)) {
        json_decref(root);
        srv_fail(e, 400, NULL, "invalid_json", "the body must be a JSON object");
        return NULL;
    }
    return root;
}

typedef enum MHD_Result (*body_handler)(srv_ctx *, struct MHD_Connection *, json_t *);

static const struct {
    const char *path;
    body_handler fn;
} POST_ROUTES[] = {
    {"/v1/chat/completions", oai_chat},     {"/v1/completions", oai_completions},
    {"/v1/messages", anth_messages},        {"/v1/messages/count_tokens", anth_count_tokens},
    {"/tokenize", srv_tokenize_ep},         {"/detokenize", srv_detokenize_ep},
};
#define N_POST (sizeof POST_ROUTES / sizeof POST_ROUTES[0])

static enum MHD_Result route(srv_ctx *s, struct MHD_Connection *c, const char *url, const char *method,
                             conn_state *cs) {
    srv_api api = !strncmp(url, "/v1/messages", 12) ? API_ANTHROPIC : API_OPENAI;
    if (cs->too_big) {
        char msg[128];
        snprintf(msg, sizeof msg, "the request body is larger than %zu bytes", s->p.max_body);
        return send_fail(s, c, api, 413, "request_too_large", msg);
    }
    int get = !strcmp(method, "GET") || !strcmp(method, "HEAD"), post = !strcmp(method, "POST");
    const srv_web_asset *page = get ? srv_web_find(url) : NULL; /* the page loads while the model does */
    if (page) return srv_web_send(s, c, page);
    if (!atomic_load(&s->ready)) { /* the socket is bound before the engines load, to fail fast */
        if (!strcmp(url, "/health"))
            return srv_send_json(s, c, 503, json_pack("{s:s}", "status", "loading"));
        return send_fail(s, c, api, 503, "loading", "the model is still loading; retry shortly");
    }
    if (!strcmp(url, "/health")) {
        if (!get) return send_fail(s, c, api, 405, "method_not_allowed", "/health takes GET");
        sched_wake(s->sched); /* a probe counts as the next request: a stopped engine restarts */
        sched_metrics m;
        sched_metrics_get(s->sched, &m);
        return srv_send_json(s, c, strcmp(m.engine_state, "ok") ? 503 : 200,
                             json_pack("{s:s, s:i, s:i, s:i, s:I}", "status", m.engine_state, "slots_idle",
                                       m.n_slots - m.busy, "slots_processing", m.busy, "engine_pid", m.engine_pid,
                                       "engine_restarts", (json_int_t)m.engine_restarts));
    }
    if (!authorized(s, c))
        return send_fail(s, c, api, 401, "invalid_api_key", "missing or wrong API key (Authorization: Bearer KEY or x-api-key: KEY)");
    if (!strcmp(url, "/metrics/gpu")) /* the web monitor's GPU numbers (NVML, srv_web.c) */
        return get ? srv_web_gpu_metrics(s, c) : send_fail(s, c, api, 405, "method_not_allowed", "this path takes GET");
    for (size_t i = 0; i < N_POST; i++) {
        if (strcmp(url, POST_ROUTES[i].path)) continue;
        if (!post) return send_fail(s, c, api, 405, "method_not_allowed", "this path takes POST");
        srv_err e;
        json_t *body = parse_body(cs, &e);
        if (!body) return srv_send_error(s, c, api, &e);
        enum MHD_Result r = POST_ROUTES[i].fn(s, c, body);
        json_decref(body);
        return r;
    }
    int models = !strcmp(url, "/v1/models"), model = !strncmp(url, "/v1/models/", 11);
    if (models || model || !strcmp(url, "/metrics")) {
        if (!get) return send_fail(s, c, api, 405, "method_not_allowed", "this path takes GET");
        return models || model ? srv_models(s, c, model ? url + 11 : NULL) : srv_metrics(s, c);
    }
    char msg[300];
    snprintf(msg, sizeof msg, "no such endpoint: %s %.200s", method, url);
    srv_err e;
    srv_fail(&e, 404, NULL, "not_found", "%s", msg);
    return srv_send_error(s, c, api, &e);
}

static enum MHD_Result on_request(void *cls, struct MHD_Connection *c, const char *url, const char *method,
                                  const char *version, const char *upload, size_t *upload_size, void **con_cls) {
    (void)version;
    srv_ctx *s = cls;
    conn_state *cs = *con_cls;
    srv_api api = !strncmp(url, "/v1/messages", 12) ? API_ANTHROPIC : API_OPENAI;
    if (!cs) { /* headers only so far */
        cs = st_calloc(1, sizeof *cs);
        *con_cls = cs;
        const char *cl = MHD_lookup_connection_value(c, MHD_HEADER_KIND, MHD_HTTP_HEADER_CONTENT_LENGTH);
        if (cl && strtoull(cl, NULL, 10) > DRAIN_CAP) {
            cs->too_big = cs->answered = 1;
            return send_fail(s, c, api, 413, "request_too_large", "the request body is far too large");
        }
        return MHD_YES;
    }
    if (*upload_size) {
        if (!cs->answered) {
            if (!cs->too_big && cs->received + *upload_size <= s->p.max_body)
                sbuf_put(&cs->body, upload, *upload_size);
            else if (!cs->too_big) {
                cs->too_big = 1; /* drop what we have; keep reading so the client hears the 413 */
                sbuf_free(&cs->body);
            }
            cs->received += *upload_size;
        }
        *upload_size = 0;
        if (cs->received > DRAIN_CAP && !cs->answered) {
            cs->answered = 1;
            return send_fail(s, c, api, 413, "request_too_large", "the request body is far too large");
        }
        return MHD_YES;
    }
    if (cs->answered) return MHD_YES;
    cs->answered = 1;
    return route(s, c, url, method, cs);
}

static void on_completed(void *cls, struct MHD_Connection *c, void **con_cls, enum MHD_RequestTerminationCode toe) {
    (void)cls, (void)c, (void)toe;
    conn_state *cs = *con_cls;
    if (!cs) return;
    sbuf_free(&cs->body);
    st_free(cs);
    *con_cls = NULL;
}

static void mhd_log(void *cls, const char *fmt, va_list ap) {
    (void)cls;
    char msg[512];
    vsnprintf(msg, sizeof msg, fmt, ap);
    msg[strcspn(msg, "\n")] = 0;
    ST_DEBUG("http: %s", msg);
}

/* The file name without its directory and .gguf: the id /v1/models lists. */
static void model_name(const char *path, char *out, size_t cap) {
    const char *b = strrchr(path, '/');
    b = b ? b + 1 : path;
    size_t n = strlen(b);
    if (n > 5 && !strcmp(b + n - 5, ".gguf")) n -= 5;
    snprintf(out, cap, "%.*s", (int)n, b);
}

static int open_front(srv_ctx *s) {
    gguf_file *f = gguf_open(s->p.ep.model_path);
    if (!f) return -1;
    s->tok = tokenizer_load(f);
    s->fmt = chat_detect(f);
    s->gf = f; /* its chat template renders every prompt (chat_render_template) */
    if (!s->tok) return -1;
    const char *tmpl = NULL;
    uint64_t tlen = 0;
    if (gguf_get_str(f, "tokenizer.chat_template", &tmpl, &tlen) != 0) tmpl = NULL;
    s->tmpl_tools = tools_template_handles(tmpl, (size_t)tlen);
    s->tools_fam = (int)tools_family_of(tmpl, (size_t)tlen);
    s->eot = chat_end_of_turn(s->fmt);
    model_name(s->p.ep.model_path, s->model_name, sizeof s->model_name);
    return 0;
}

int server_run(const server_params *p) {
    srv_ctx *s = st_calloc(1, sizeof *s);
    s->p = *p;
    s->started = (long)time(NULL);
    /* SIGINT/SIGTERM go to sigwait below, not to whichever thread runs */
    sigset_t sigs;
    sigemptyset(&sigs);
    sigaddset(&sigs, SIGINT);
    sigaddset(&sigs, SIGTERM);
    pthread_sigmask(SIG_BLOCK, &sigs, NULL);
    signal(SIGPIPE, SIG_IGN);
    int rc = -1;
    struct MHD_Daemon *d = NULL;
    struct addrinfo *ai = NULL;
    if (open_front(s) != 0) goto done;
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM, .ai_flags = AI_PASSIVE};
    char port[16];
    snprintf(port, sizeof port, "%d", p->port);
    int gai = getaddrinfo(p->host, port, &hints, &ai);
    if (gai != 0) {
        st_error_set("cannot use host '%s': %s", p->host, gai_strerror(gai));
        goto done;
    }
    unsigned flags = MHD_USE_THREAD_PER_CONNECTION | MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_POLL |
                     MHD_USE_ERROR_LOG | (ai->ai_family == AF_INET6 ? MHD_USE_IPv6 : 0);
    d = MHD_start_daemon(flags, (uint16_t)p->port, NULL, NULL, on_request, s, MHD_OPTION_SOCK_ADDR, ai->ai_addr,
                         MHD_OPTION_NOTIFY_COMPLETED, on_completed, s, MHD_OPTION_CONNECTION_LIMIT, 256u,
                         MHD_OPTION_CONNECTION_TIMEOUT, 120u, MHD_OPTION_EXTERNAL_LOGGER, mhd_log, s,
                         MHD_OPTION_END);
    if (!d) {
        st_error_set("cannot listen on %s port %d (in use, or not an address of this machine?)", p->host, p->port);
        goto done;
    }
    s->sched = sched_create_supervised(&p->ep, p->n_slots, p->max_queue); /* the engine runs in a child */
    if (!s->sched) goto done;
    s->n_ctx = sched_n_ctx(s->sched);
    atomic_store(&s->ready, 1);
    const union MHD_DaemonInfo *di = MHD_get_daemon_info(d, MHD_DAEMON_INFO_BIND_PORT);
    int bound = di ? di->port : p->port;
    ST_INFO("serve: listening on http://%s%s%s:%d (model %s, %d slot%s, context %d, %s chat format%s)",
            ai->ai_family == AF_INET6 ? "[" : "", p->host, ai->ai_family == AF_INET6 ? "]" : "", bound,
            s->model_name, p->n_slots, p->n_slots == 1 ? "" : "s", s->n_ctx, chat_format_name(s->fmt),
            p->api_key ? ", API key required" : "");
    int sig = 0;
    sigwait(&sigs, &sig);
    ST_INFO("serve: signal %d, stopping", sig);
    atomic_store(&s->stopping, 1);
    rc = 0;
done:
    atomic_store(&s->stopping, 1);
    if (d) MHD_stop_daemon(d); /* waits for the connection threads, which see `stopping` */
    if (ai) freeaddrinfo(ai);
    sched_free(s->sched);
    tokenizer_free(s->tok);
    if (s->gf) gguf_close(s->gf);
    st_free(s);
    return rc;
}
