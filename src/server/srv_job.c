/* Jobs (srv_internal.h): the bridge between a connection thread and a slot
 * of the scheduler. The engine thread's events append to the job under its mutex (formatted for
 * the client when streaming); the connection thread waits on the condition
 * variable and, while it waits, watches the client's socket so that a client
 * that hangs up stops its generation and frees the slot at the next token. */
#include <poll.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>

#include "core/alloc.h"
#include "core/log.h"
#include "server/srv_internal.h"
#include "server/srv_reason.h"
#include "server/srv_tools.h"

#define WAIT_STEP_MS 50 /* how often a waiting connection looks at its socket */

_Thread_local int srv_req_http10;

/* Sent to a client that shut its side of the connection while its answer is not ready: an HTTP/1.1
 * client must accept interim 1xx answers before the final one (RFC 9110 15.2), and 103 carries
 * nothing. A client that closed its socket answers it with a reset; one that only half-closed
 * reads it and waits on. */
static const char PROBE[] = "HTTP/1.1 103 Early Hints\r\n\r\n";

/* One row per kind of job (job_api): the only place that says which API writes which answer. */
static const job_api JOB_APIS[JOB_N_KINDS] = {
    [JOB_OAI_CHAT] = {API_OPENAI, "chatcmpl-", "call_", oai_stream_begin, oai_stream_text, oai_stream_reasoning,
                      oai_stream_end, oai_token, oai_response},
    [JOB_OAI_COMPLETION] = {API_OPENAI, "cmpl-", "call_", oai_stream_begin, oai_stream_text, oai_stream_reasoning,
                            oai_stream_end, oai_token, oai_response},
    [JOB_ANTHROPIC] = {API_ANTHROPIC, "msg_", "toolu_", anth_stream_begin, anth_stream_text, anth_stream_reasoning,
                       anth_stream_end, NULL, anth_response}, /* no log probabilities in Anthropic's API */
    [JOB_EMBED] = {API_OPENAI, "embd-", "call_", NULL, NULL, NULL, NULL, NULL, NULL}, /* srv_embed.c answers */
};

srv_job *job_new(srv_ctx *s, job_kind kind, struct MHD_Connection *c) {
    srv_job *j = st_calloc(1, sizeof *j);
    pthread_mutex_init(&j->mu, NULL);
    pthread_cond_init(&j->cv, NULL);
    j->refs = 1;
    j->srv = s;
    j->kind = kind;
    j->api = &JOB_APIS[kind];
    j->created = (long)time(NULL);
    const union MHD_ConnectionInfo *ci = MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_FD);
    j->fd = ci ? ci->connect_fd : -1;
    j->http10 = srv_req_http10;
    srv_make_id(s, j->api->id_prefix, j->id, sizeof j->id);
    return j;
}

void job_set_grammar(srv_job *j, char *grammar) {
    st_free(j->grammar);
    tools_stream_free(j->ts);
    j->grammar = grammar;
    j->req.grammar = grammar;
    j->req.grammar_len = grammar ? strlen(grammar) : 0;
}

void job_set_prompt(srv_job *j, int32_t *prompt, int n_prompt, const char *const *stops, int n_stop) {
    ST_ASSERT(n_stop <= 17);
    j->prompt = prompt;
    j->req.prompt = prompt;
    j->req.n_prompt = n_prompt;
    for (int i = 0; i < n_stop; i++) {
        j->stop_store[i] = st_strdup(stops[i]);
        j->stops[i] = j->stop_store[i];
    }
    j->req.stop = j->stops;
    j->req.n_stop = n_stop;
}

void job_release(srv_job *j) {
    pthread_mutex_lock(&j->mu);
    int left = --j->refs;
    pthread_mutex_unlock(&j->mu);
    if (left) return;
    st_free(j->prompt);
    json_decref(j->tools);
    json_decref(j->lp);
    json_decref(j->probs);
    st_free(j->call_opening);
    st_free(j->think_message);
    st_free(j->grammar);
    tools_stream_free(j->ts);
    reason_stream_free(j->rs);
    sbuf_free(&j->reasoning);
    st_free(j->embd);
    for (int i = 0; i < 17; i++) st_free(j->stop_store[i]);
    st_free(j->bias_ids);
    st_free(j->bias_vals);
    for (int i = 0; i < SRV_MAX_BREAKERS; i++) st_free(j->dry_breakers[i]);
    sbuf_free(&j->text);
    sbuf_free(&j->out);
    pthread_cond_destroy(&j->cv);
    pthread_mutex_destroy(&j->mu);
    st_free(j);
}

/* 1 when the client has gone: the connection broke (a reset), or the client closed it. End of file
 * alone does not tell a close from a half-close (shutdown of its sending side after a complete
 * request, which HTTP allows and which must not cancel the request), so the first time it is seen
 * something is written: a stream's next chunk, or the 103 probe for an answer not started yet;
 * a closed socket answers that with a reset, seen at the next look (WAIT_STEP_MS later). An HTTP/1.0
 * client may be sent no 1xx: its end of file still counts as leaving. Caller holds j->mu. */
static int client_gone(srv_job *j) {
    if (j->fd < 0) return 0;
    struct pollfd p = {.fd = j->fd, .events = POLLRDHUP};
    if (poll(&p, 1, 0) <= 0) return 0;
    if (p.revents & (POLLHUP | POLLERR | POLLNVAL)) return 1;
    if (!(p.revents & POLLRDHUP)) return 0;
    if (j->http10) return 1;
    if (!j->probed) {
        j->probed = 1;
        /* a stream's headers are out and its chunks follow; an answer not begun gets the probe */
        if (!j->stream) (void)!send(j->fd, PROBE, sizeof PROBE - 1, MSG_DONTWAIT | MSG_NOSIGNAL);
    }
    return 0;
}

/* The answer's content (after the reasoning is taken out): to the tool-call parser, the stream or the
 * whole answer. */
static void job_content(void *ctx, const char *t, size_t n) {
    srv_job *j = ctx;
    if (j->ts) tools_stream_feed(j->ts, t, n); /* calls parsed as they come */
    else if (j->stream) j->api->stream_text(j, t, n);
    else sbuf_put(&j->text, t, n);
}

void srv_job_think_budget(srv_job *j, int budget, int think_open, const char *message) {
    const reason_kind kind = (reason_kind)j->srv->reason;
    if (budget < 0 || !reason_end_text(kind)) return;
    if (!message) message = j->srv->p.reasoning_budget_message;
    if (message && *message) j->req.think_message = j->think_message = st_strdup(message);
    j->req.think_start = reason_open_text(kind);
    j->req.think_close = reason_close_text(kind);
    j->req.think_end = reason_end_text(kind);
    j->req.think_budget = budget;
    j->req.think_open = think_open > 0; /* SRV_THINK_MAY: outside a block, which the model may open */
}

static void job_reasoning(void *ctx, const char *t, size_t n) {
    srv_job *j = ctx;
    if (!j->stream) sbuf_put(&j->reasoning, t, n);
    else j->api->stream_reasoning(j, t, n);
}

void srv_job_reasoning(srv_job *j, int on, int think_open) {
    srv_ctx *s = j->srv;
    /* harmony's messages are marked by control tokens, and so are DeepSeek's calls (llama.cpp's conversions
     * make its <｜...｜> tokens control tokens) */
    j->req.render_special = s->harmony || (j->tools && tools_deepseek((tools_family)s->tools_fam));
    if (!on || s->reason == REASON_OFF) return;
    static const reason_cb cb = {job_reasoning, job_content};
    j->rs = reason_stream_new((reason_kind)s->reason, think_open > 0 ? think_open : 0, j->tools != NULL, &cb, j);
    j->think_open = think_open > 0 ? think_open : 0;
    j->think_may = think_open == SRV_THINK_MAY;
}

/* --shutdown-timeout passed: a stream ends cleanly, with the API's error
 * event and its end ([DONE]), so that a client sees why instead of a cut
 * connection or an answer that looks complete. Caller holds mu. */
static void end_for_shutdown(srv_job *j) {
    j->cancelled = j->aborted = 1;
    j->failed = 3;
    snprintf(j->err, sizeof j->err,
             "the server is shutting down; the answer was cut short after %d s "
             "(--shutdown-timeout)",
             j->srv->p.shutdown_timeout_s);
    j->api->stream_end(j);
    j->done = 1;
}

/* Scheduler events (srv_proto.h), on the engine thread (or the child's frame reader). */
static int on_event(void *ctx, const srv_event *ev) {
    srv_job *j = ctx;
    srv_slots_event(j->srv, j, ev);
    pthread_mutex_lock(&j->mu);
    int stop = j->cancelled || atomic_load(&j->srv->stopping);
    if (j->aborted) { /* the answer was already ended (shutdown): nothing more goes to the client */
        int terminal = ev->kind == SRV_EV_DONE || ev->kind == SRV_EV_ERROR;
        pthread_mutex_unlock(&j->mu);
        if (terminal) job_release(j);
        return 1;
    }
    switch (ev->kind) {
    case SRV_EV_START: j->started = 1; break;
    case SRV_EV_TOKEN:
        if (j->api->token) j->api->token(j, ev);
        break;
    case SRV_EV_EMBED:
        st_free(j->embd);
        j->embd = st_malloc(ev->n_embd * sizeof(float) + 1);
        memcpy(j->embd, ev->embd, ev->n_embd * sizeof(float));
        j->n_embd = ev->n_embd;
        break;
    case SRV_EV_TEXT:
        if (j->rs) reason_stream_feed(j->rs, ev->text, ev->len); /* reasoning apart, then job_content */
        else job_content(j, ev->text, ev->len);
        break;
    case SRV_EV_DONE:
    case SRV_EV_ERROR:
        if (j->shutdown_stop) { /* the end this handler asked for at shutdown: cut short, not done */
            if (j->stream) end_for_shutdown(j);
            else j->failed = 3, j->done = 1; /* job_run answers 503, not a truncated 200 */
            break;
        }
        if (ev->kind == SRV_EV_DONE) {
            j->st = *ev->stats;
            if (j->rs) reason_stream_end(j->rs); /* what it held back is final now */
        } else {
            j->failed = ev->engine_down ? 2 : 1; /* 2: the engine process stopped, 503 */
            snprintf(j->err, sizeof j->err, "%s", ev->error);
        }
        if (j->stream) j->api->stream_end(j);
        j->done = 1;
        break;
    }
    if (j->stream || j->done) pthread_cond_broadcast(&j->cv); /* a non-streaming waiter wants the end only */
    int terminal = j->done;
    /* a stop for the shutdown, not the client: the generation's end that follows is the cut (above),
     * whichever thread sees it first (wait_step's check may not have run yet) */
    if (stop && !j->cancelled && !terminal) j->shutdown_stop = 1;
    pthread_mutex_unlock(&j->mu);
    if (terminal) job_release(j); /* the scheduler's reference */
    return stop;
}

/* Wait up to one step for news, then look at the client (a poll of one
 * socket costs about a microsecond, so every wake-up may afford it).
 * Caller holds mu. Returns 0, or -1 when the client left or the server stops. */
static int wait_step(srv_job *j) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    ts.tv_nsec += WAIT_STEP_MS * 1000000L;
    if (ts.tv_nsec >= 1000000000L) {
        ts.tv_sec++;
        ts.tv_nsec -= 1000000000L;
    }
    pthread_cond_timedwait(&j->cv, &j->mu, &ts);
    if (j->done) return 0;
    if (atomic_load(&j->srv->stopping) && j->stream) {
        end_for_shutdown(j);
        return 0;
    }
    if (client_gone(j) || atomic_load(&j->srv->stopping)) {
        j->cancelled = 1;
        return -1;
    }
    return 0;
}

static ssize_t stream_read(void *cls, uint64_t pos, char *buf, size_t max) {
    (void)pos;
    srv_job *j = cls;
    pthread_mutex_lock(&j->mu);
    for (;;) {
        if (j->out.len > j->out_sent) {
            size_t n = j->out.len - j->out_sent;
            if (n > max) n = max;
            memcpy(buf, j->out.s + j->out_sent, n);
            j->out_sent += n;
            if (j->out_sent == j->out.len) j->out.len = j->out_sent = 0;
            pthread_mutex_unlock(&j->mu);
            return (ssize_t)n;
        }
        if (j->done) {
            pthread_mutex_unlock(&j->mu);
            return MHD_CONTENT_READER_END_OF_STREAM;
        }
        if (wait_step(j) != 0) {
            pthread_mutex_unlock(&j->mu);
            return MHD_CONTENT_READER_END_WITH_ERROR;
        }
    }
}

static void stream_free(void *cls) {
    srv_job *j = cls;
    pthread_mutex_lock(&j->mu);
    j->cancelled = 1; /* if the generation still runs, nobody reads it any more */
    pthread_mutex_unlock(&j->mu);
    job_release(j);
}

int job_submit(srv_job *j) {
    j->refs++; /* the scheduler's, given back by on_event's terminal event */
    if (sched_submit(j->srv->sched, &j->req, on_event, j) == 0) return 0;
    j->refs--;
    return -1;
}

int job_wait(srv_job *j) {
    pthread_mutex_lock(&j->mu);
    int rc = 0;
    while (!j->done && rc == 0) rc = wait_step(j);
    pthread_mutex_unlock(&j->mu);
    return rc;
}

enum MHD_Result job_run(srv_job *j, struct MHD_Connection *c) {
    srv_ctx *s = j->srv;
    srv_api api = j->api->errors;
    if (j->stream) j->api->stream_begin(j);
    /* a constrained answer after reasoning the prompt opened, or that the model opens itself: the grammar
     * holds what follows </think> (the reasoning itself is free, as llama.cpp lets it be) */
    if (j->rs && (j->think_open || j->think_may) && j->grammar && !j->req.grammar_trigger) {
        j->req.grammar_trigger = reason_close_text(REASON_THINK);
        if (j->think_may) j->req.grammar_think = reason_open_text(REASON_THINK); /* if the answer opens it */
    }
    if (j->rs && j->call_opening) { /* the forced call's opening goes through the reasoning parser, once */
        reason_stream_feed(j->rs, j->call_opening, strlen(j->call_opening));
        st_free(j->call_opening);
        j->call_opening = NULL;
    }
    j->refs++; /* the scheduler's, given back by on_event's terminal event */
    if (sched_submit(s->sched, &j->req, on_event, j) != 0) {
        j->refs--;
        srv_err e;
        srv_fail(&e, 503, NULL, "overloaded", "all %d slots are busy and %d requests are queued; retry later",
                 s->p.n_slots, s->p.max_queue);
        enum MHD_Result r = srv_send_error(s, c, api, &e);
        job_release(j);
        return r;
    }
    if (j->stream) {
        struct MHD_Response *resp =
            MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 4096, stream_read, j, stream_free);
        MHD_add_response_header(resp, "Content-Type", "text/event-stream");
        MHD_add_response_header(resp, "Cache-Control", "no-cache");
        return srv_queue(s, c, 200, resp);
    }
    pthread_mutex_lock(&j->mu);
    while (!j->done)
        if (wait_step(j) != 0) break;
    int done = j->done, failed = j->failed;
    pthread_mutex_unlock(&j->mu);
    enum MHD_Result r;
    if (failed == 3 || (!done && atomic_load(&s->stopping))) { /* --shutdown-timeout passed before the answer */
        srv_err e;
        srv_fail(&e, 503, NULL, "shutting_down",
                 "the server is shutting down; the request was stopped after %d s "
                 "(--shutdown-timeout)",
                 s->p.shutdown_timeout_s);
        job_release(j);
        return srv_send_error(s, c, api, &e);
    }
    if (!done) { /* the client left: nobody reads an answer */
        job_release(j);
        return MHD_NO;
    }
    if (failed) {
        srv_err e;
        if (failed == 2) srv_fail(&e, 503, NULL, "engine_stopped", "%s", j->err);
        else srv_fail(&e, 500, NULL, "engine_error", "%s", j->err);
        r = srv_send_error(s, c, api, &e);
    } else r = srv_send_json(s, c, 200, j->api->response(j));
    job_release(j);
    return r;
}
