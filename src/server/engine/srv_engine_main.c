/* The engine process: `strata engine --fd N`, spawned by the HTTP front end
 * (srv_proc.c), never by a user. It runs the in-process scheduler
 * (srv_sched.c) and speaks the protocol of srv_proto.h on fd N. With
 * `serve --ranks N` the front end launches it as an MPI job instead
 * (`mpirun -n N strata engine --connect PATH`, docs/multi.md): rank 0 connects
 * to the front end's socket at PATH and shares the configuration frame with
 * the other ranks, which open the engine from it and follow rank 0.
 *
 * The main thread reads frames from the start, so that end of file (the
 * server is gone, or stopping) ends this process at once even while the
 * model is still loading; the load runs on its own thread. The scheduler's
 * engine thread sends its events as frames (one writer at a time: the main
 * thread answers malformed requests itself) and reads the cancel flag the
 * main thread sets when the front end says the client left.
 * Nothing is freed on the way out: the process ends with _exit. */
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include "core/alloc.h"
#include "core/log.h"
#include "engine/split.h"
#include "server/engine/srv_sched.h"

/* One request the front end sent, alive until its terminal event. */
typedef struct creq {
    uint64_t id;
    srv_request req;
    atomic_int cancelled;
    struct creq *next;
} creq;

static struct {
    int fd;
    pthread_mutex_t wmu; /* one frame at a time on the socket */
    pthread_mutex_t mu;  /* the request list */
    creq *reqs;
    srv_sched *_Atomic sched; /* set by the loader once the engines are open */
    engine_params ep;
    int n_slots, max_queue;
    model_ident model; /* the front end's file: anything else is refused */
} E = {.fd = -1, .wmu = PTHREAD_MUTEX_INITIALIZER, .mu = PTHREAD_MUTEX_INITIALIZER};

/* Send a frame; if the front end is gone there is nobody to work for. */
static void send_frame(uint32_t type, uint64_t id, const sbuf *b) {
    pthread_mutex_lock(&E.wmu);
    int rc = proto_send(E.fd, type, id, b ? b->s : NULL, b ? b->len : 0);
    pthread_mutex_unlock(&E.wmu);
    if (rc != 0) _exit(0);
}

static void drop_req(creq *r) {
    pthread_mutex_lock(&E.mu);
    for (creq **pp = &E.reqs; *pp; pp = &(*pp)->next)
        if (*pp == r) {
            *pp = r->next;
            break;
        }
    pthread_mutex_unlock(&E.mu);
    proto_request_free(&r->req);
    st_free(r);
}

/* Scheduler events (srv_sched.h) -> frames, on the engine thread. */
static int on_event(void *ctx, const srv_event *ev) {
    creq *r = ctx;
    sbuf b = {0};
    proto_put_i32(&b, ev->slot);
    uint32_t type = 0;
    switch (ev->kind) {
    case SRV_EV_START: type = PROTO_START; break;
    case SRV_EV_TEXT:
        type = PROTO_TEXT;
        sbuf_put(&b, ev->text, ev->len);
        break;
    case SRV_EV_DONE: {
        type = PROTO_DONE;
        proto_put_stats(&b, ev->stats);
        proto_put_i32(&b, ev->n_cached);
        break;
    }
    case SRV_EV_ERROR:
        type = PROTO_ERROR;
        proto_put_str(&b, ev->error, strlen(ev->error));
        proto_put_i32(&b, ev->n_cached);
        break;
    case SRV_EV_EMBED:
        type = PROTO_EMBED;
        proto_put_u32(&b, (uint32_t)ev->n_embd);
        sbuf_put(&b, (const char *)ev->embd, ev->n_embd * sizeof(float));
        break;
    case SRV_EV_TOKEN:
        type = PROTO_TOKEN;
        proto_put_i32(&b, ev->token);
        proto_put_f32(&b, ev->logprob);
        proto_put_u32(&b, (uint32_t)ev->n_top);
        for (int i = 0; i < ev->n_top; i++) {
            proto_put_i32(&b, ev->top_ids[i]);
            proto_put_f32(&b, ev->top_lp[i]);
        }
        break;
    }
    send_frame(type, r->id, &b);
    sbuf_free(&b);
    int stop = atomic_load(&r->cancelled);
    if (ev->kind == SRV_EV_DONE || ev->kind == SRV_EV_ERROR) drop_req(r);
    return stop;
}

/* NULL when the file at the model path is the front end's, else why not. */
static const char *model_changed(void) {
    model_ident now;
    if (model_ident_of(E.ep.model_path, &now) != 0) return st_error_get();
    return model_ident_mismatch(E.ep.model_path, &E.model, &now);
}

static void *loader(void *arg) {
    (void)arg;
    /* the file is checked before the load and again after it (it may be replaced while it loads):
     * the front end tokenizes with its own copy, so other weights would answer garbage */
    const char *changed = model_changed();
    srv_sched *s = changed ? NULL : sched_create(&E.ep, E.n_slots, E.max_queue);
    if (s && (changed = model_changed())) s = NULL; /* nothing is freed: this process exits below */
    sbuf b = {0};
    if (!s) {
        const char *msg = changed ? changed : st_error_get();
        ST_WARN("engine: %s", msg);
        proto_put_str(&b, msg, strlen(msg));
        send_frame(PROTO_FAIL, 0, &b);
        _exit(1);
    }
    proto_put_i32(&b, sched_n_ctx(s));
    proto_put_i32(&b, E.n_slots);
    atomic_store(&E.sched, s);
    send_frame(PROTO_READY, 0, &b);
    sbuf_free(&b);
    return NULL;
}

static void on_request(const proto_frame *f) {
    srv_sched *s = atomic_load(&E.sched);
    proto_cur c = {f->payload, f->len, 0};
    creq *r = st_calloc(1, sizeof *r);
    r->id = f->id;
    if (!s || proto_get_request(&c, &r->req) != 0) {
        /* a front end bug, never a client's doing: say so instead of guessing */
        st_free(r);
        sbuf b = {0};
        const char *msg = s ? "malformed request frame" : "request before the engine was ready";
        proto_put_i32(&b, -1);
        proto_put_str(&b, msg, strlen(msg));
        send_frame(PROTO_ERROR, f->id, &b);
        sbuf_free(&b);
        return;
    }
    pthread_mutex_lock(&E.mu);
    r->next = E.reqs;
    E.reqs = r;
    pthread_mutex_unlock(&E.mu);
    /* the queue holds max_queue + n_slots: the front end enforces the real
     * limit, and may send a request a moment before a slot here is freed */
    if (sched_submit(s, &r->req, on_event, r) != 0) {
        srv_event ev = {.kind = SRV_EV_ERROR, .slot = -1, .error = "the engine's queue is full"};
        on_event(r, &ev);
    }
}

/* The heartbeat: the front end kills a child it has not heard from for --engine-timeout (a
 * stopped or wedged process would otherwise hold its requests for ever). Its own thread, so
 * that a long prompt chunk on the engine thread does not silence it. */
static void *heartbeat(void *arg) {
    (void)arg;
    for (;;) {
        const struct timespec step = {0, 250 * 1000000L};
        nanosleep(&step, NULL);
        send_frame(PROTO_HEARTBEAT, 0, NULL);
    }
    return NULL;
}

static void on_cancel(uint64_t id) {
    pthread_mutex_lock(&E.mu);
    for (creq *r = E.reqs; r; r = r->next)
        if (r->id == id) atomic_store(&r->cancelled, 1);
    pthread_mutex_unlock(&E.mu);
}

/* A rank other than 0 of the engine job: rank 0's configuration, then the
 * engine, which follows rank 0 until it stops (engine_open does not return). */
static int follow_job(void) {
    char *frame = NULL;
    uint32_t len = 0;
    split_share(&frame, &len);
    proto_cur c = {(const uint8_t *)frame, len, 0};
    engine_params ep;
    int n_slots, max_queue;
    model_ident id;
    if (proto_get_config(&c, &ep, &n_slots, &max_queue, &id) != 0) {
        fprintf(stderr, "strata engine: rank %d: a broken configuration from rank 0\n", split_rank());
        return 3;
    }
    ep.n_seq = n_slots;
    if (!engine_open(&ep)) fprintf(stderr, "strata engine: rank %d: %s\n", split_rank(), st_error_get());
    return 1;
}

/* The front end's socket at path (serve --ranks), or -1. */
static int connect_front(const char *path) {
    struct sockaddr_un a = {.sun_family = AF_UNIX};
    if (strlen(path) >= sizeof a.sun_path) return -1;
    memcpy(a.sun_path, path, strlen(path) + 1);
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd >= 0 && connect(fd, (struct sockaddr *)&a, sizeof a) != 0) {
        close(fd);
        fd = -1;
    }
    return fd;
}

int server_engine_main(int argc, char **argv) {
    const char *front = NULL;
    for (int i = 1; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--fd")) E.fd = atoi(argv[i + 1]);
        if (!strcmp(argv[i], "--connect")) front = argv[i + 1];
    }
    if (front && split_rank() > 0) return follow_job();
    if (front && (E.fd = connect_front(front)) < 0) {
        fprintf(stderr, "strata engine: cannot connect to the server at %s\n", front);
        return 2;
    }
    if (E.fd < 0) {
        fprintf(stderr, "strata engine: the HTTP server starts this process itself (strata serve)\n");
        return 2;
    }
    /* the front end decides when this process ends (end of file on the
     * socket); a Ctrl-C in the terminal reaches the whole process group */
    signal(SIGINT, SIG_IGN);
    signal(SIGPIPE, SIG_IGN);
    prctl(PR_SET_NAME, "strata-engine"); /* exec'd as /proc/self/exe, ps would say "exe" */
    proto_frame f = {0};
    int configured = 0;
    for (;;) {
        int r = proto_recv(E.fd, &f);
        if (r == 0) _exit(0); /* the server stopped or died */
        if (r < 0) {
            ST_WARN("engine: broken frame from the server; exiting");
            _exit(3);
        }
        if (f.type == PROTO_CONFIG && !configured) {
            proto_cur c = {f.payload, f.len, 0};
            if (proto_get_config(&c, &E.ep, &E.n_slots, &E.max_queue, &E.model) != 0) _exit(3);
            if (front) { /* the engine job's other ranks open the engine from the same frame */
                char *frame = (char *)f.payload;
                uint32_t len = f.len;
                split_share(&frame, &len);
            }
            E.max_queue += E.n_slots;
            configured = 1;
            pthread_t t;
            if (pthread_create(&t, NULL, heartbeat, NULL) != 0) _exit(3);
            pthread_detach(t);
            if (pthread_create(&t, NULL, loader, NULL) != 0) _exit(3);
            pthread_detach(t);
        } else if (f.type == PROTO_REQUEST) on_request(&f);
        else if (f.type == PROTO_CANCEL) on_cancel(f.id);
        else {
            ST_WARN("engine: unexpected frame type %u from the server; exiting", f.type);
            _exit(3);
        }
    }
}
