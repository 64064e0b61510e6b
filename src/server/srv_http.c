/* The HTTP front end (server.h): libmicrohttpd with one thread per
 * connection, so a handler may block while its request waits for a slot.
 *
 * Every request is answered, whatever it holds: the body is collected up to
 * max_body bytes (more is read and dropped, then 413, so that a client still
 * sending gets the answer instead of a reset), parsed by jansson (strict:
 * invalid UTF-8, NUL escapes, duplicate keys and nesting deeper than its
 * limit are 400), and errors take the shape of the API the path belongs to.
 *
 * A request must be read whole within --read-timeout seconds of its
 * connection opening or the previous request on it ending (the read deadline
 * below), so a client trickling its body cannot hold a connection thread for
 * ever. */
#include <ctype.h>
#include <netdb.h>
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "core/alloc.h"
#include "core/log.h"
#include "engine/split.h"
#include "server/srv_internal.h"
#include "server/srv_reason.h"
#include "server/srv_tools.h"
#include "server/srv_web.h"

/* Connections MHD serves at once; past CONN_SOFT a new connection closes the oldest one that holds
 * no request being answered (CONN_LIMIT - CONN_SOFT stay free for clients that send a whole request). */
#define CONN_LIMIT 256u
#define CONN_SOFT  192
/* The request line and headers must come within this (or --read-timeout, if shorter). */
#define HEADER_TIMEOUT_MS 10000
/* A declared or received body beyond this is not read to its end: 413 at once, then close. */
#define DRAIN_CAP ((uint64_t)256 << 20)

const int SRV_STATUS_CODES[SRV_N_STATUS] = {200, 204, 400, 401, 403, 404, 405, 413, 415, 429, 500, 501, 503, 529, 0};

typedef struct {
    sbuf body;
    uint64_t received;
    size_t reserved; /* bytes of the --max-inflight budget this request holds */
    int too_big, over_budget, answered;
} conn_state;

/* ---- the budget of request bytes in flight (--max-inflight) ----
 * Every request holds its body's bytes (the declared Content-Length up front,
 * or what arrives) from its headers until it is answered; past the budget a
 * request gets 503 instead of memory. */
static int budget_take(srv_ctx *s, size_t n) {
    size_t cur = atomic_load(&s->inflight);
    do {
        if (cur + n > s->p.max_inflight) return -1;
    } while (!atomic_compare_exchange_weak(&s->inflight, &cur, cur + n));
    return 0;
}

static void budget_give(srv_ctx *s, size_t n) { atomic_fetch_sub(&s->inflight, n); }

/* ---- the read deadline ----
 * libmicrohttpd has only an inactivity timeout, which a client sending one
 * byte a second never trips, and no callback per byte read. So each
 * connection is armed with a deadline when it is accepted and again when a
 * request ends (keep-alive: the next one may start), and disarmed once a
 * request's body is complete (generating and sending may take as long as they
 * take). A watchdog thread shuts down the socket of a connection still armed
 * at its deadline: the connection thread reads end of file and MHD ends the
 * request. The deadline is therefore counted from no later than the
 * request's first byte, and an idle keep-alive connection is closed after
 * the same time.
 *
 * The 408: MHD_queue_response refuses a response while a body is being
 * received (it accepts one only in the headers-processed and
 * request-received states; 0.9.75 and 1.0.x alike), and the access handler
 * is not called at all while a client sends nothing. So for a request cut
 * off after its request line came in, the watchdog itself writes a short
 * 408 in the request's API error shape to the socket (non-blocking; MHD
 * writes nothing while it receives), then shuts it down; it is logged and
 * counted (strata_http_read_timeouts_total). A connection that never sent a
 * request line is only closed.
 *
 * shutdown() and not close(): the socket stays MHD's to close. MHD closes it
 * only after the CLOSED connection notification, which disarms under the
 * same lock, so the watchdog never touches a socket number that MHD has
 * closed and the kernel may have reused. */
typedef struct conn_guard {
    int fd;
    int64_t deadline_ms; /* CLOCK_MONOTONIC */
    int64_t armed_ms;    /* when it was armed: it waits for a request since then */
    int armed;
    int in_request; /* a request line is in: a cut-off is a request's, answered 408, logged and counted */
    srv_api api;    /* the request's API (its error shape), from the request line */
    struct conn_guard *prev, *next;
} conn_guard;

typedef struct read_guard {
    pthread_mutex_t mu;
    pthread_cond_t cv; /* on CLOCK_MONOTONIC */
    conn_guard *head;
    int64_t timeout_ms;
    int n_conns; /* connections open (armed or not) */
    uint64_t evicted;
    int stop;
    pthread_t thread;
    srv_ctx *srv;
    sbuf resp[API_N]; /* the 408 answer per API (srv_api), raw HTTP */
} read_guard;

static int64_t now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static void guard_unlink_locked(read_guard *g, conn_guard *cg) {
    if (!cg->armed) return;
    if (cg->prev) cg->prev->next = cg->next;
    else g->head = cg->next;
    if (cg->next) cg->next->prev = cg->prev;
    cg->prev = cg->next = NULL;
    cg->armed = 0;
}

/* (Re)start the connection's deadline: it is waiting for a request. */
static void guard_arm(read_guard *g, conn_guard *cg) {
    pthread_mutex_lock(&g->mu);
    guard_unlink_locked(g, cg);
    cg->armed_ms = now_ms();
    cg->deadline_ms = cg->armed_ms + (g->timeout_ms < HEADER_TIMEOUT_MS ? g->timeout_ms : HEADER_TIMEOUT_MS);
    cg->in_request = 0;
    cg->next = g->head;
    if (g->head) g->head->prev = cg;
    g->head = cg;
    cg->armed = 1;
    pthread_cond_signal(&g->cv); /* the watchdog may be asleep on an empty list */
    pthread_mutex_unlock(&g->mu);
}

/* The headers are in: the body may take the rest of --read-timeout. */
static void guard_headers_done(read_guard *g, conn_guard *cg) {
    pthread_mutex_lock(&g->mu);
    if (cg->armed) cg->deadline_ms = cg->armed_ms + g->timeout_ms;
    pthread_mutex_unlock(&g->mu);
}

/* A connection more, and room kept: past CONN_SOFT the oldest connection waiting for a request is
 * closed, first one that has not sent a request line (idle or half-open), else one still sending
 * its request; a connection whose request is being answered is never picked. So a flood of
 * half-open connections cannot fill the CONN_LIMIT slots and lock new clients out. */
static void guard_count_in(read_guard *g, const conn_guard *fresh) {
    pthread_mutex_lock(&g->mu);
    if (++g->n_conns > CONN_SOFT) {
        conn_guard *old = NULL;
        for (conn_guard *cg = g->head; cg; cg = cg->next)
            if (cg != fresh && (!old || (old->in_request && !cg->in_request) ||
                                (old->in_request == cg->in_request && cg->armed_ms <= old->armed_ms)))
                old = cg;
        if (old) {
            shutdown(old->fd, SHUT_RDWR);
            guard_unlink_locked(g, old);
            if (g->evicted++ % 100 == 0)
                ST_INFO("http: %d connections open: closing the oldest that holds no request being answered "
                        "(%llu so far)",
                        g->n_conns, (unsigned long long)g->evicted + 1);
        }
    }
    pthread_mutex_unlock(&g->mu);
}

static void guard_count_out(read_guard *g) {
    pthread_mutex_lock(&g->mu);
    g->n_conns--;
    pthread_mutex_unlock(&g->mu);
}

static void guard_disarm(read_guard *g, conn_guard *cg) {
    pthread_mutex_lock(&g->mu);
    guard_unlink_locked(g, cg);
    pthread_mutex_unlock(&g->mu);
}

static void *guard_main(void *arg) {
    read_guard *g = arg;
    pthread_mutex_lock(&g->mu);
    while (!g->stop) {
        int64_t now = now_ms(), next = INT64_MAX;
        for (conn_guard *cg = g->head, *nx; cg; cg = nx) {
            nx = cg->next;
            if (cg->deadline_ms > now) {
                if (cg->deadline_ms < next) next = cg->deadline_ms;
                continue;
            }
            /* a request cut off gets its 408 in its API's error shape, written straight to the
             * socket (MHD writes nothing while it receives a body); never blocking this thread */
            if (cg->in_request)
                (void)!send(cg->fd, g->resp[cg->api].s, g->resp[cg->api].len, MSG_DONTWAIT | MSG_NOSIGNAL);
            shutdown(cg->fd, SHUT_RDWR);
            guard_unlink_locked(g, cg);
            if (cg->in_request) {
                atomic_fetch_add(&g->srv->read_timeouts, 1);
                ST_INFO("http: closed a connection whose request was not read whole within %lld s (--read-timeout)",
                        (long long)(g->timeout_ms / 1000));
            } else
                ST_DEBUG("http: closed a connection that sent no request line for %lld s",
                         (long long)(g->timeout_ms / 1000));
        }
        if (next == INT64_MAX) {
            pthread_cond_wait(&g->cv, &g->mu);
            continue;
        }
        struct timespec ts = {.tv_sec = (time_t)(next / 1000), .tv_nsec = (long)(next % 1000) * 1000000L};
        pthread_cond_timedwait(&g->cv, &g->mu, &ts);
    }
    pthread_mutex_unlock(&g->mu);
    return NULL;
}

static read_guard *guard_start(srv_ctx *s, int timeout_s) {
    read_guard *g = st_calloc(1, sizeof *g);
    g->srv = s;
    g->timeout_ms = (int64_t)timeout_s * 1000;
    for (int api = 0; api < API_N; api++) { /* the 408 answer of each API, made once */
        srv_err e = {.status = 408, .code = "request_timeout"};
        snprintf(e.msg, sizeof e.msg, "the request was not received whole within %d s (--read-timeout)", timeout_s);
        json_t *j = srv_error_json((srv_api)api, &e);
        char *body = json_dumps(j, JSON_COMPACT);
        json_decref(j);
        ST_ASSERT(body);
        sbuf_printf(&g->resp[api],
                    "HTTP/1.1 408 Request Timeout\r\nContent-Type: application/json\r\nContent-Length: %zu\r\n"
                    "Connection: close\r\n\r\n%s",
                    strlen(body), body);
        free(body);
    }
    pthread_mutex_init(&g->mu, NULL);
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&g->cv, &ca);
    pthread_condattr_destroy(&ca);
    if (pthread_create(&g->thread, NULL, guard_main, g) != 0) {
        pthread_cond_destroy(&g->cv);
        pthread_mutex_destroy(&g->mu);
        sbuf_free(&g->resp[0]), sbuf_free(&g->resp[1]);
        st_free(g);
        st_error_set("cannot start the read-timeout thread");
        return NULL;
    }
    return g;
}

/* After MHD_stop_daemon: every connection is closed, so none is armed. */
static void guard_stop(read_guard *g) {
    if (!g) return;
    pthread_mutex_lock(&g->mu);
    g->stop = 1;
    pthread_cond_signal(&g->cv);
    pthread_mutex_unlock(&g->mu);
    pthread_join(g->thread, NULL);
    ST_ASSERT(!g->head);
    pthread_cond_destroy(&g->cv);
    pthread_mutex_destroy(&g->mu);
    sbuf_free(&g->resp[0]), sbuf_free(&g->resp[1]);
    st_free(g);
}

static conn_guard *guard_of(struct MHD_Connection *c) {
    const union MHD_ConnectionInfo *ci = MHD_get_connection_info(c, MHD_CONNECTION_INFO_SOCKET_CONTEXT);
    return ci ? ci->socket_context : NULL;
}

/* MHD's connection notifications: accepted (before its thread starts) and
 * closed (before MHD closes the socket). */
static void on_connection(void *cls, struct MHD_Connection *c, void **socket_context,
                          enum MHD_ConnectionNotificationCode code) {
    srv_ctx *s = cls;
    if (!s->guard) return;
    if (code == MHD_CONNECTION_NOTIFY_STARTED) {
        const union MHD_ConnectionInfo *ci = MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_FD);
        if (!ci) return;
        conn_guard *cg = st_calloc(1, sizeof *cg);
        cg->fd = ci->connect_fd;
        *socket_context = cg;
        guard_arm(s->guard, cg);
        guard_count_in(s->guard, cg);
    } else if (*socket_context) {
        conn_guard *cg = *socket_context;
        guard_disarm(s->guard, cg);
        guard_count_out(s->guard);
        st_free(cg);
        *socket_context = NULL;
    }
}

/* The length of an absolute-form target's scheme and authority ("http://host:port" of
 * "http://host:port/v1/models?x", as a proxy sends it; RFC 9112 3.2.2); 0 for an origin-form target.
 * Taken from the raw target, before any %-decoding (a decoded %2F must not end the authority). */
static size_t authority_len(const char *t) {
    const size_t n = !strncasecmp(t, "http://", 7) ? 7 : !strncasecmp(t, "https://", 8) ? 8 : 0;
    return n ? n + strcspn(t + n, "/?") : 0;
}

static srv_api api_of(const char *url) { return !strncmp(url, "/v1/messages", 12) ? API_ANTHROPIC : API_OPENAI; }

/* MHD's URL decoding (of the path, split from its query; also of query keys and values, which
 * Strata does not read), in place, and two more things: an absolute-form target loses its scheme and
 * authority first (served as its path), and %00 is left as it is (a NUL would cut the path short:
 * "/v1/models%00x" answered as /v1/models, where a proxy filtering paths saw another). */
static size_t unescape_url(void *cls, struct MHD_Connection *c, char *str) {
    (void)cls, (void)c;
    const size_t a = authority_len(str);
    if (a && str[a] == '/') memmove(str, str + a, strlen(str + a) + 1);
    else if (a) strcpy(str, "/"); /* "http://host": the root; only shorter, as the contract wants */
    char *w = str;
    for (const char *r = str; *r;) {
        if (r[0] == '%' && isxdigit((unsigned char)r[1]) && isxdigit((unsigned char)r[2]) &&
            !(r[1] == '0' && r[2] == '0')) {
            const char h[3] = {r[1], r[2], 0};
            *w++ = (char)strtol(h, NULL, 16);
            r += 3;
        } else {
            *w++ = *r++;
        }
    }
    *w = 0;
    return (size_t)(w - str);
}

/* MHD's URI log callback: a request line is in. Its result is the request's
 * first *con_cls, which stays NULL (on_request makes the state). */
static void *on_request_line(void *cls, const char *uri, struct MHD_Connection *c) {
    srv_ctx *s = cls;
    conn_guard *cg = s->guard ? guard_of(c) : NULL;
    if (cg) {
        pthread_mutex_lock(&s->guard->mu);
        cg->in_request = 1;
        cg->api = uri ? api_of(uri + authority_len(uri)) : API_OPENAI; /* raw: "?x=/v1/messages" is no path */
        pthread_mutex_unlock(&s->guard->mu);
    }
    return NULL;
}

server_params server_defaults(void) {
    server_params p = {0};
    p.ep = engine_defaults();
    p.host = "127.0.0.1";
    p.port = 8080;
    p.n_slots = 1;
    p.max_queue = 64;
    p.max_body = 8u << 20;
    p.read_timeout_s = 30;
    p.max_inflight = (size_t)64 << 20;
    p.shutdown_timeout_s = 10;
    p.engine_timeout_s = 10;
    p.reasoning = 1;
    p.reasoning_budget = -1;
    return p;
}

/* A client's own request id is echoed when it is a plain token, else one is made. */
static void add_request_id(srv_ctx *s, struct MHD_Connection *c, struct MHD_Response *r) {
    const char *given = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "X-Request-Id");
    int plain = given && *given && strlen(given) <= 128;
    for (const char *p = given; plain && *p; p++)
        plain = (*p >= '0' && *p <= '9') || (*p >= 'a' && *p <= 'z') || (*p >= 'A' && *p <= 'Z') || strchr("-_.:", *p);
    char id[48];
    if (!plain) srv_make_id(s, "req_", id, sizeof id);
    MHD_add_response_header(r, "X-Request-Id", plain ? given : id);
}

enum MHD_Result srv_queue(srv_ctx *s, struct MHD_Connection *c, int status, struct MHD_Response *r) {
    add_request_id(s, c, r);
    if (status == 503 || status == 529) MHD_add_response_header(r, "Retry-After", "1"); /* overloaded, loading */
    const char *origin = srv_cors_origin(s, c);
    if (origin) {
        MHD_add_response_header(r, "Access-Control-Allow-Origin", origin);
        MHD_add_response_header(r, "Vary", "Origin");
    }
    enum MHD_Result ok = MHD_queue_response(c, (unsigned)status, r);
    MHD_destroy_response(r);
    if (ok == MHD_YES) { /* not an answer MHD refused to send (while a body comes in, say) */
        int i = 0;
        while (i < SRV_N_STATUS - 1 && SRV_STATUS_CODES[i] != status) i++;
        atomic_fetch_add(&s->by_status[i], 1);
    }
    return ok;
}

/* allow: the Allow header of a 405 (or NULL); close: the connection ends after this answer. */
static enum MHD_Result send_text(srv_ctx *s, struct MHD_Connection *c, int status, const char *type, char *text,
                                 size_t len, const char *allow, int close) {
    struct MHD_Response *r = MHD_create_response_from_buffer(len, text, MHD_RESPMEM_MUST_FREE);
    MHD_add_response_header(r, "Content-Type", type);
    if (allow) MHD_add_response_header(r, "Allow", allow);
    if (close) MHD_add_response_header(r, "Connection", "close");
    return srv_queue(s, c, status, r);
}

enum MHD_Result srv_send_text(srv_ctx *s, struct MHD_Connection *c, int status, const char *type, char *text,
                              size_t len) {
    return send_text(s, c, status, type, text, len, NULL, 0);
}

/* body: given up. */
static enum MHD_Result send_json(srv_ctx *s, struct MHD_Connection *c, int status, json_t *body, const char *allow,
                                 int close) {
    ST_ASSERT(body); /* every body we build is valid: a NULL here is a bug */
    char *txt = json_dumps(body, JSON_COMPACT);
    json_decref(body);
    return send_text(s, c, status, "application/json", txt, strlen(txt), allow, close);
}

enum MHD_Result srv_send_json(srv_ctx *s, struct MHD_Connection *c, int status, json_t *body) {
    return send_json(s, c, status, body, NULL, 0);
}

static enum MHD_Result send_error_ex(srv_ctx *s, struct MHD_Connection *c, srv_api api, const srv_err *e,
                                     const char *allow, int close) {
    const int status = e->status == 503 ? SRV_APIS[api].overloaded_status : e->status;
    if (status >= 500) ST_WARN("answered %d: %s", status, e->msg);
    return send_json(s, c, status, srv_error_json(api, e), allow, close);
}

enum MHD_Result srv_send_error(srv_ctx *s, struct MHD_Connection *c, srv_api api, const srv_err *e) {
    return send_error_ex(s, c, api, e, NULL, 0);
}

/* An error in the path's API shape, with send_text's allow and close. */
static enum MHD_Result send_fail_ex(srv_ctx *s, struct MHD_Connection *c, srv_api api, int status, const char *code,
                                    const char *msg, const char *allow, int close) {
    srv_err e;
    srv_fail(&e, status, NULL, code, "%s", msg);
    return send_error_ex(s, c, api, &e, allow, close);
}

static enum MHD_Result send_fail(srv_ctx *s, struct MHD_Connection *c, srv_api api, int status, const char *code,
                                 const char *msg) {
    return send_fail_ex(s, c, api, status, code, msg, NULL, 0);
}

static enum MHD_Result send_405(srv_ctx *s, struct MHD_Connection *c, srv_api api, int post) {
    return send_fail_ex(s, c, api, 405, "method_not_allowed", post ? "this path takes POST" : "this path takes GET",
                        post ? "POST" : "GET, HEAD", 0);
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

static const char *budget_msg(srv_ctx *s) {
    static _Thread_local char msg[200];
    snprintf(msg, sizeof msg, "the server holds %zu MB of requests in flight (--max-inflight); retry shortly",
             s->p.max_inflight >> 20);
    return msg;
}

typedef enum MHD_Result (*body_handler)(srv_ctx *, struct MHD_Connection *, json_t *);

static const struct {
    const char *path;
    body_handler fn;
} POST_ROUTES[] = {
    {"/v1/chat/completions", oai_chat},     {"/v1/completions", oai_completions},
    {"/v1/messages", anth_messages},        {"/v1/messages/count_tokens", anth_count_tokens},
    {"/tokenize", srv_tokenize_ep},         {"/detokenize", srv_detokenize_ep},
    {"/v1/embeddings", srv_embeddings_oai}, {"/embedding", srv_embeddings_llama},
    {"/embeddings", srv_embeddings_llama},
};
#define N_POST (sizeof POST_ROUTES / sizeof POST_ROUTES[0])

static enum MHD_Result route(srv_ctx *s, struct MHD_Connection *c, const char *url, const char *method, srv_api api,
                             conn_state *cs) {
    if (cs->too_big) {
        char msg[128];
        snprintf(msg, sizeof msg, "the request body is larger than %zu bytes", s->p.max_body);
        return send_fail(s, c, api, 413, "request_too_large", msg);
    }
    if (cs->over_budget) return send_fail(s, c, api, 503, "overloaded", budget_msg(s));
    const char *acrm = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Access-Control-Request-Method");
    if (!strcmp(method, "OPTIONS") && acrm && srv_cors_origin(s, c)) { /* a CORS preflight, per --cors-origin */
        struct MHD_Response *r = MHD_create_response_from_buffer(0, (void *)"", MHD_RESPMEM_PERSISTENT);
        const char *acrh = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Access-Control-Request-Headers");
        MHD_add_response_header(r, "Access-Control-Allow-Methods", "GET, HEAD, POST, OPTIONS");
        if (acrh) MHD_add_response_header(r, "Access-Control-Allow-Headers", acrh);
        MHD_add_response_header(r, "Access-Control-Max-Age", "600");
        return srv_queue(s, c, 204, r);
    }
    int get = !strcmp(method, "GET") || !strcmp(method, "HEAD"), post = !strcmp(method, "POST");
    const srv_web_asset *page = get ? srv_web_find(url) : NULL; /* the page loads while the model does */
    if (page) return srv_web_send(s, c, page);
    if (!atomic_load(&s->ready)) { /* the socket is bound before the engines load, to fail fast */
        if (!strcmp(url, "/health")) return srv_send_json(s, c, 503, json_pack("{s:s}", "status", "loading"));
        return send_fail(s, c, api, 503, "loading", "the model is still loading; retry shortly");
    }
    if (!strcmp(url, "/health")) {
        if (!get) return send_405(s, c, api, 0);
        sched_wake(s->sched); /* a probe counts as the next request: a stopped engine restarts */
        sched_metrics m;
        sched_metrics_get(s->sched, &m);
        return srv_send_json(s, c, strcmp(m.engine_state, "ok") ? 503 : 200,
                             json_pack("{s:s, s:i, s:i, s:i, s:I}", "status", m.engine_state, "slots_idle",
                                       m.n_slots - m.busy, "slots_processing", m.busy, "engine_pid", m.engine_pid,
                                       "engine_restarts", (json_int_t)m.engine_restarts));
    }
    if (!authorized(s, c))
        return send_fail(s, c, api, 401, "invalid_api_key",
                         "missing or wrong API key (Authorization: Bearer KEY or x-api-key: KEY)");
    if (!strcmp(url, "/metrics/gpu")) /* the web monitor's GPU numbers (NVML, srv_web.c) */
        return get ? srv_web_gpu_metrics(s, c) : send_405(s, c, api, 0);
    for (size_t i = 0; i < N_POST; i++) {
        if (strcmp(url, POST_ROUTES[i].path)) continue;
        if (!post) return send_405(s, c, api, 1);
        /* a web page can POST text/plain anywhere without asking (no CORS preflight): only JSON is read */
        const char *ct = MHD_lookup_connection_value(c, MHD_HEADER_KIND, MHD_HTTP_HEADER_CONTENT_TYPE);
        if (!srv_is_json_type(ct)) {
            char msg[200];
            snprintf(msg, sizeof msg, "the body must be sent with Content-Type: application/json%s%.60s%s",
                     ct ? " (not '" : " (none was given)", ct ? ct : "", ct ? "')" : "");
            return send_fail(s, c, api, 415, "unsupported_media_type", msg);
        }
        srv_err e;
        json_t *body = parse_body(cs, &e);
        if (!body) return srv_send_error(s, c, api, &e);
        enum MHD_Result r = POST_ROUTES[i].fn(s, c, body);
        json_decref(body);
        return r;
    }
    int models = !strcmp(url, "/v1/models"), model = !strncmp(url, "/v1/models/", 11);
    if (models || model || !strcmp(url, "/metrics") || !strcmp(url, "/props") || !strcmp(url, "/experts") ||
        !strcmp(url, "/slots")) {
        if (!get) return send_405(s, c, api, 0);
        if (!strcmp(url, "/props")) return srv_props(s, c);
        if (!strcmp(url, "/slots")) return srv_slots_ep(s, c);
        if (!strcmp(url, "/experts")) return srv_experts(s, c);
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
    srv_ctx *s = cls;
    conn_state *cs = *con_cls;
    srv_api api = api_of(url);
    srv_req_http10 = version && !strcmp(version, MHD_HTTP_VERSION_1_0);
    if (!cs) { /* headers only so far */
        cs = st_calloc(1, sizeof *cs);
        *con_cls = cs;
        atomic_fetch_add(&s->active, 1); /* until on_completed: what a shutdown waits for */
        conn_guard *cg = s->guard ? guard_of(c) : NULL;
        if (cg) guard_headers_done(s->guard, cg);
        if (atomic_load(&s->draining)) { /* a kept-alive connection's next request during shutdown */
            cs->answered = 1;
            return send_fail_ex(s, c, api, 503, "shutting_down", "the server is shutting down", NULL, 1);
        }
        srv_headers f; /* the headers read once, for the checks below */
        srv_headers_read(c, &f);
        int status;
        const char *bad = srv_headers_problem(&f, version, &status);
        if (bad) { /* answered now, and the connection closed: where its body ends is not agreed */
            cs->answered = 1;
            return send_fail_ex(s, c, api, status,
                                status == 501               ? "unsupported_transfer_encoding"
                                : f.bad[0] || f.n_host != 1 ? "invalid_header"
                                                            : "invalid_framing",
                                bad, NULL, 1);
        }
        if (!srv_host_allowed(s, f.host)) {
            cs->answered = 1;
            char msg[400];
            snprintf(msg, sizeof msg, "the Host '%.100s' is not a name of this server (--allowed-hosts)", f.host);
            return send_fail_ex(s, c, api, 403, "host_not_allowed", msg, NULL, 1);
        }
        const char *origin = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Origin");
        if (origin && !srv_origin_allowed(s, origin, f.host)) {
            cs->answered = 1;
            char msg[400];
            snprintf(msg, sizeof msg, "requests from the web origin '%.100s' are not allowed (--cors-origin)", origin);
            return send_fail_ex(s, c, api, 403, "origin_not_allowed", msg, NULL, 1);
        }
        const char *expect = MHD_lookup_connection_value(c, MHD_HEADER_KIND, MHD_HTTP_HEADER_EXPECT);
        const uint64_t declared = f.cl ? strtoull(f.cl, NULL, 10) : 0;
        /* a client that waits for 100-continue hears the 413 before it uploads the body */
        if (declared > DRAIN_CAP || (declared > s->p.max_body && expect && !strcasecmp(expect, "100-continue"))) {
            cs->too_big = cs->answered = 1;
            return send_fail(s, c, api, 413, "request_too_large",
                             declared > DRAIN_CAP ? "the request body is far too large"
                                                  : "the declared request body is larger than --max-body");
        }
        /* the declared body's bytes are held from now on; a body beyond the limit is dropped as it comes */
        const size_t hold = declared <= s->p.max_body ? (size_t)declared : 0;
        if (hold && budget_take(s, hold) != 0) {
            cs->answered = 1;
            return send_fail_ex(s, c, api, 503, "overloaded", budget_msg(s), NULL, 1);
        }
        cs->reserved = hold;
        return MHD_YES;
    }
    if (*upload_size) {
        if (!cs->answered) {
            const uint64_t after = cs->received + *upload_size;
            if (!cs->too_big && !cs->over_budget && after > cs->reserved && after <= s->p.max_body) {
                /* more than declared (a chunked body): hold the rest too, or drop the body for a 503 */
                if (budget_take(s, (size_t)(after - cs->reserved)) == 0) cs->reserved = (size_t)after;
                else {
                    cs->over_budget = 1;
                    sbuf_free(&cs->body);
                }
            }
            if (!cs->too_big && !cs->over_budget && after <= s->p.max_body) sbuf_put(&cs->body, upload, *upload_size);
            else if (!cs->too_big && after > s->p.max_body) {
                cs->too_big = 1; /* drop what we have; keep reading so the client hears the 413 */
                sbuf_free(&cs->body);
            }
            cs->received += *upload_size;
        }
        *upload_size = 0;
        if (cs->received > DRAIN_CAP && !cs->answered) {
            /* a chunked body past the cap: MHD queues no answer while a body comes in, so the
             * connection is closed without one (a declared length this large got its 413 up front) */
            ST_INFO("http: a request body passed %llu MiB without end; connection closed",
                    (unsigned long long)(DRAIN_CAP >> 20));
            return MHD_NO;
        }
        return MHD_YES;
    }
    if (cs->answered) return MHD_YES;
    cs->answered = 1;
    conn_guard *cg = s->guard ? guard_of(c) : NULL;
    if (cg) guard_disarm(s->guard, cg); /* read whole: generating and sending may take as long as they take */
    return route(s, c, url, method, api, cs);
}

static void on_completed(void *cls, struct MHD_Connection *c, void **con_cls, enum MHD_RequestTerminationCode toe) {
    (void)toe;
    srv_ctx *s = cls;
    conn_guard *cg = s->guard ? guard_of(c) : NULL;
    if (cg) guard_arm(s->guard, cg); /* the connection may carry another request */
    conn_state *cs = *con_cls;
    if (!cs) return;
    atomic_fetch_sub(&s->active, 1);
    budget_give(s, cs->reserved);
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

static int open_front(srv_ctx *s, model_ident *id) {
    gguf_file *f = gguf_open(s->p.ep.model_path);
    if (!f) return -1;
    /* what the engine process must find at the same path (it refuses another file) */
    if (model_ident_of(s->p.ep.model_path, id) != 0) {
        gguf_close(f);
        return -1;
    }
    s->tok = tokenizer_load(f);
    s->fmt = chat_detect(f);
    s->gf = f; /* its chat template renders every prompt (chat_render_template) */
    if (!s->tok) return -1;
    const char *tmpl = NULL;
    uint64_t tlen = 0;
    if (gguf_get_str(f, "tokenizer.chat_template", &tmpl, &tlen) != 0) tmpl = NULL;
    s->tmpl_tools = tools_template_handles(tmpl, (size_t)tlen);
    s->tools_fam = (int)tools_family_of(tmpl, (size_t)tlen);
    /* DeepSeek's templates ignore `tools` but write earlier calls themselves (another template that only
     * names tool_calls, to refuse them say, keeps the plain history) */
    s->tmpl_calls = tools_deepseek((tools_family)s->tools_fam) && tools_template_calls(tmpl, (size_t)tlen);
    s->reason = (int)reason_kind_of(tmpl, (size_t)tlen);
    s->harmony = s->reason == REASON_HARMONY;
    /* a template that knows think blocks (Qwen3's, DeepSeek R1's and QwQ's write or strip them) is a model
     * that may open one itself */
    s->tmpl_think = tmpl && (memmem(tmpl, (size_t)tlen, "<think>", 7) || memmem(tmpl, (size_t)tlen, "</think>", 8));
    const char *arch = NULL;
    uint64_t alen = 0;
    uint32_t pool = 0;
    if (gguf_get_str(f, "general.architecture", &arch, &alen) == 0 && alen < 64) {
        char key[96];
        snprintf(key, sizeof key, "%.*s.pooling_type", (int)alen, arch);
        if (gguf_get_u32(f, key, &pool) != 0) pool = 0; /* absent: a decoder without a pooling type */
        uint32_t w = 0;
        snprintf(key, sizeof key, "%.*s.embedding_length", (int)alen, arch);
        if (gguf_get_u32(f, key, &w) == 0) s->n_embd = (int)w; /* the engine checks the same key at load */
    }
    s->pooling = (int)pool;
    s->eot = chat_end_of_turn(s->fmt);
    /* the most text one token can stand for: its piece, or its own text for control tokens (larger
     * of the two, so the prompt bound below never refuses a text that fits) */
    s->max_piece = 1;
    for (int32_t id = 0; id < tokenizer_n_vocab(s->tok); id++) {
        size_t tl = 0;
        tokenizer_token_text(s->tok, id, &tl);
        int64_t pl = tokenizer_token_to_piece(s->tok, id, 1, NULL, 0);
        size_t m = pl > (int64_t)tl ? (size_t)pl : tl;
        if (m > s->max_piece) s->max_piece = m;
    }
    model_name(s->p.ep.model_path, s->model_name, sizeof s->model_name);
    return 0;
}

/* SIGTERM / SIGINT: stop accepting (the listening socket is shut, so new clients are refused, not
 * left waiting), give the requests in flight --shutdown-timeout seconds to end, then end the rest:
 * `stopping` makes a stream send its API's error event and end, and a waiting request answer 503.
 * A second signal ends the wait at once. */
static void drain(srv_ctx *s, struct MHD_Daemon *d, const sigset_t *sigs, int sig, MHD_socket *listen_fd) {
    atomic_store(&s->draining, 1);
    *listen_fd = MHD_quiesce_daemon(d);
    if (*listen_fd != MHD_INVALID_SOCKET) shutdown(*listen_fd, SHUT_RDWR);
    int n = atomic_load(&s->active);
    ST_INFO("serve: signal %d: stopping; %d request%s in flight get up to %d s to end (--shutdown-timeout)", sig, n,
            n == 1 ? "" : "s", s->p.shutdown_timeout_s);
    const int64_t end = now_ms() + (int64_t)s->p.shutdown_timeout_s * 1000;
    while (atomic_load(&s->active) > 0 && now_ms() < end) {
        const struct timespec step = {0, 50 * 1000000L};
        if (sigtimedwait(sigs, NULL, &step) > 0) {
            ST_INFO("serve: a second signal: stopping now");
            break;
        }
    }
    if ((n = atomic_load(&s->active)) > 0)
        ST_INFO("serve: %d request%s still in flight: ending %s", n, n == 1 ? "" : "s", n == 1 ? "it" : "them");
    atomic_store(&s->stopping, 1);
    /* MHD_stop_daemon shuts every connection's socket at once: first let the connection threads,
     * which see `stopping` within a wait step, write their last event or their 503 */
    const int64_t last = now_ms() + 2000;
    while (atomic_load(&s->active) > 0 && now_ms() < last) {
        const struct timespec step = {0, 20 * 1000000L};
        nanosleep(&step, NULL);
    }
}

int server_run(const server_params *p) {
    srv_ctx *s = st_calloc(1, sizeof *s);
    s->p = *p;
    if (s->p.max_inflight < s->p.max_body) s->p.max_inflight = s->p.max_body; /* one whole body always fits */
    pthread_mutex_init(&s->big_text_mu, NULL);
    srv_slots_init(s);
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
    MHD_socket listen_fd = MHD_INVALID_SOCKET;
    struct addrinfo *ai = NULL;
    sched_supervision sv = {
        .heartbeat_timeout_s = p->engine_timeout_s, .once = split_launched_size() > 1, .ranks = p->ranks};
    if (open_front(s, &sv.model) != 0) goto done;
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM, .ai_flags = AI_PASSIVE};
    char port[16];
    snprintf(port, sizeof port, "%d", p->port);
    int gai = getaddrinfo(p->host, port, &hints, &ai);
    if (gai != 0) {
        st_error_set("cannot use host '%s': %s", p->host, gai_strerror(gai));
        goto done;
    }
    s->loopback = srv_is_loopback(ai, p->host);
    if (p->read_timeout_s > 0 && !(s->guard = guard_start(s, p->read_timeout_s))) goto done;
    unsigned flags = MHD_USE_THREAD_PER_CONNECTION | MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_POLL | MHD_USE_ITC |
                     MHD_USE_ERROR_LOG | (ai->ai_family == AF_INET6 ? MHD_USE_IPv6 : 0);
    d = MHD_start_daemon(flags, (uint16_t)p->port, NULL, NULL, on_request, s, MHD_OPTION_SOCK_ADDR, ai->ai_addr,
                         MHD_OPTION_NOTIFY_COMPLETED, on_completed, s, MHD_OPTION_NOTIFY_CONNECTION, on_connection, s,
                         MHD_OPTION_URI_LOG_CALLBACK, on_request_line, s, MHD_OPTION_UNESCAPE_CALLBACK, unescape_url, s,
                         MHD_OPTION_CONNECTION_LIMIT, CONN_LIMIT, MHD_OPTION_CONNECTION_TIMEOUT, 120u,
                         MHD_OPTION_EXTERNAL_LOGGER, mhd_log, s, MHD_OPTION_END);
    if (!d) {
        st_error_set("cannot listen on %s port %d (in use, or not an address of this machine?)", p->host, p->port);
        goto done;
    }
    s->sched = sched_create_supervised(&p->ep, p->n_slots, p->max_queue, &sv); /* the engine runs in a child */
    if (!s->sched) goto done;
    s->n_ctx = sched_n_ctx(s->sched);
    s->prompt_max_bytes = (size_t)s->n_ctx * s->max_piece;
    atomic_store(&s->ready, 1);
    const union MHD_DaemonInfo *di = MHD_get_daemon_info(d, MHD_DAEMON_INFO_BIND_PORT);
    int bound = di ? di->port : p->port;
    ST_INFO("serve: listening on http://%s%s%s:%d (model %s, %d slot%s, context %d, %s chat format%s)",
            ai->ai_family == AF_INET6 ? "[" : "", p->host, ai->ai_family == AF_INET6 ? "]" : "", bound, s->model_name,
            p->n_slots, p->n_slots == 1 ? "" : "s", s->n_ctx, chat_format_name(s->fmt),
            p->api_key ? ", API key required" : "");
    int sig = 0;
    sigwait(&sigs, &sig);
    drain(s, d, &sigs, sig, &listen_fd);
    rc = 0;
done:
    atomic_store(&s->stopping, 1);
    if (d) MHD_stop_daemon(d);                             /* waits for the connection threads, which see `stopping` */
    if (listen_fd != MHD_INVALID_SOCKET) close(listen_fd); /* quiesced: ours to close, after the stop */
    guard_stop(s->guard);
    if (ai) freeaddrinfo(ai);
    sched_free(s->sched);
    tokenizer_free(s->tok);
    if (s->gf) gguf_close(s->gf);
    pthread_mutex_destroy(&s->big_text_mu);
    srv_slots_free(s);
    st_free(s);
    return rc;
}
