/* The supervisor (srv_proto.h): the HTTP front end's side of the engine
 * process. It spawns `/proc/self/exe engine --fd 3`, keeps a table of the
 * requests in flight, and gives the front end the scheduler's interface
 * (srv_proto.h) as if the engine ran in this process.
 *
 * Threads. Connection threads submit: a request is encoded at once and sent
 * if the engine is ready, else kept in its table entry until READY. One
 * reader thread per engine process turns its frames back into events and is
 * the only thread that removes entries, so it can call the front end's
 * callbacks without holding the lock. When the socket ends it reaps the
 * child, ends every entry with an ERROR event (engine_down: 503 with the exit
 * code) and marks the engine down; the next submit (or a /health probe)
 * spawns a new one. Nothing restarts by itself, so a model that crashes at
 * load cannot make a restart loop while nobody asks.
 *
 * Locks: mu guards the state, the table and the metrics; wmu serialises
 * frames on the socket and guards which socket is live (wfd, wgen). Order
 * mu -> wmu; nothing waits for mu while holding wmu. A write never happens
 * under mu, so a slow child cannot stall /metrics or /health. */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <spawn.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "core/alloc.h"
#include "core/log.h"
#include "server/srv_proto.h"

extern char **environ;

#define STOP_GRACE_S 10 /* proc_free waits this long for the child before SIGKILL */

typedef struct {
    uint64_t id;
    srv_event_fn fn;
    void *ctx;
    sbuf frame; /* the encoded REQUEST while it waits for READY */
    int sent, started;
    int cancel_sent; /* touched by the reader thread only */
} pentry;

typedef enum { ENG_DOWN, ENG_STARTING, ENG_READY } eng_state;

/* The supervised role of the scheduler (srv_proto.h): a proxy of the engine process. */
typedef struct {
    srv_sched base; /* first: the sched_* functions' view */
    pthread_mutex_t mu;
    pthread_cond_t cv; /* state changes, readers ending */
    pthread_mutex_t wmu;
    engine_params ep;
    char *model_path;
    int n_slots, max_queue;
    eng_state state;
    int ever_ready, stopping, n_readers;
    int gen;        /* engine processes started so far */
    pid_t pid;      /* the current one, 0 when down */
    double t_spawn; /* when it was spawned (monotonic seconds) */
    int wfd, wgen;  /* the live socket and its process's gen (under wmu) */
    uint64_t next_id;
    pentry **ents; /* (n_ents) requests in flight, oldest first */
    int n_ents, cap_ents;
    sched_metrics m;
    sched_map map;                 /* the engine's expert cache as of its last finished request (under mu) */
    char why_down[512];            /* why the last process ended (proc_create's error) */
    sched_supervision sv;          /* the heartbeat deadline and the model file's identity */
    _Atomic int64_t last_frame_ms; /* when the live child last sent anything (monotonic) */
} srv_proc;

typedef struct {
    srv_proc *p;
    int fd, gen;
    pid_t pid;
} reader_arg;

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec / 1e9;
}

static int64_t now_ms(void) { return (int64_t)(now_s() * 1e3); }

/* msg with every occurrence of the model's path replaced by its file name: a client is not
 * told where files live (the engine's own errors name the path it opened). */
static void strip_path(char *msg, const char *path) {
    const size_t pl = strlen(path);
    const char *base = proto_base_name(path);
    const size_t bl = strlen(base);
    if (!pl || base == path) return;
    for (char *at; (at = strstr(msg, path));) {
        memmove(at + bl, at + pl, strlen(at + pl) + 1);
        memcpy(at, base, bl);
    }
}

/* Send a frame to process `gen` if it is still the live one; a failure means
 * it died, which its reader thread notices and reports. */
static void send_gen(srv_proc *p, int gen, uint32_t type, uint64_t id, const void *data, size_t len) {
    pthread_mutex_lock(&p->wmu);
    if (p->wgen == gen && p->wfd >= 0) (void)proto_send(p->wfd, type, id, data, len);
    pthread_mutex_unlock(&p->wmu);
}

static void *reader(void *arg);

#define JOB_CONNECT_S 60 /* an engine job's rank 0 connects within this, or the job is ended */

/* serve --ranks N: the engine as an MPI job, `$STRATA_MPIRUN -n N strata
 * engine --connect PATH` (docs/multi.md). mpirun does not pass descriptors on
 * to its ranks, so rank 0 connects to a socket listening at PATH instead of
 * inheriting one; this waits for it (holding mu: about the time MPI_Init
 * takes) while watching that mpirun lives. *pid: mpirun's; *fd: the socket.
 * 0, or -1 with st_error. */
static int launch_job(srv_proc *p, pid_t *pid, int *fd) {
    struct sockaddr_un a = {.sun_family = AF_UNIX};
    snprintf(a.sun_path, sizeof a.sun_path, "/tmp/strata-engine-%d-%d.sock", (int)getpid(), p->gen + 1);
    unlink(a.sun_path);
    int lfd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (lfd < 0 || bind(lfd, (struct sockaddr *)&a, sizeof a) != 0 || listen(lfd, 1) != 0) {
        st_error_set("could not start the engine job: socket %s: %s", a.sun_path, strerror(errno));
        if (lfd >= 0) close(lfd);
        return -1;
    }
    char exe[4096];
    ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
    exe[n > 0 ? n : 0] = 0;
    /* the launcher's words (STRATA_MPIRUN, e.g. "mpirun --oversubscribe -H a,b"), then ours */
    const char *launcher = getenv("STRATA_MPIRUN");
    char *words = st_strdup(launcher && *launcher ? launcher : "mpirun");
    char nr[16], *argv[64];
    int argc = 0;
    for (char *w = strtok(words, " "); w && argc < 56; w = strtok(NULL, " ")) argv[argc++] = w;
    snprintf(nr, sizeof nr, "%d", p->sv.ranks);
    char o_n[] = "-n", a1[] = "engine", a2[] = "--connect";
    argv[argc++] = o_n;
    argv[argc++] = nr;
    argv[argc++] = exe;
    argv[argc++] = a1;
    argv[argc++] = a2;
    argv[argc++] = a.sun_path;
    argv[argc] = NULL;
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_addopen(&fa, 0, "/dev/null", O_RDONLY, 0); /* mpirun hands its stdin to rank 0 */
    posix_spawnattr_t at;
    posix_spawnattr_init(&at);
    sigset_t none;
    sigemptyset(&none);
    posix_spawnattr_setsigmask(&at, &none);
    posix_spawnattr_setflags(&at, POSIX_SPAWN_SETSIGMASK);
    int rc = posix_spawnp(pid, argv[0], &fa, &at, argv, environ);
    posix_spawn_file_actions_destroy(&fa);
    posix_spawnattr_destroy(&at);
    if (rc != 0) {
        st_error_set("could not start the engine job: %s: %s", argv[0], strerror(rc));
        st_free(words);
        close(lfd);
        unlink(a.sun_path);
        return -1;
    }
    st_free(words);
    *fd = -1;
    for (int waited = 0; *fd < 0 && waited < JOB_CONNECT_S * 5; waited++) {
        struct pollfd pf = {lfd, POLLIN, 0};
        if (poll(&pf, 1, 200) == 1) *fd = accept4(lfd, NULL, NULL, SOCK_CLOEXEC);
        int status;
        if (*fd < 0 && waitpid(*pid, &status, WNOHANG) == *pid) {
            st_error_set("the engine job (%s) ended before its rank 0 connected (status %d)", argv[0], status);
            close(lfd);
            unlink(a.sun_path);
            return -1;
        }
    }
    close(lfd);
    unlink(a.sun_path);
    if (*fd < 0) {
        kill(*pid, SIGTERM);
        waitpid(*pid, NULL, 0);
        st_error_set("the engine job's rank 0 did not connect within %d s", JOB_CONNECT_S);
        return -1;
    }
    return 0;
}

/* Start an engine process. Caller holds mu. -1 with st_error. */
static int spawn_locked(srv_proc *p) {
    if (p->sv.once && p->gen > 0) {
        st_error_set("the engine of an MPI job cannot restart inside the job (docs/multi.md)");
        return -1;
    }
    int sv[2];
    pid_t pid;
    if (p->sv.ranks > 1) {
        if (launch_job(p, &pid, &sv[0]) != 0) return -1;
        if (p->sv.heartbeat_timeout_s > 0) { /* as below */
            struct timeval tv = {.tv_sec = p->sv.heartbeat_timeout_s};
            setsockopt(sv[0], SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
            setsockopt(sv[0], SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
        }
        atomic_store(&p->last_frame_ms, now_ms());
        goto started;
    }
    if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) != 0) {
        st_error_set("could not start the engine process: socketpair: %s", strerror(errno));
        return -1;
    }
    if (p->sv.heartbeat_timeout_s > 0) {
        /* a child that sends nothing (not even its heartbeat) for this long is stalled: the reader's
         * read times out and kills it; a write to it never blocks longer either */
        struct timeval tv = {.tv_sec = p->sv.heartbeat_timeout_s};
        setsockopt(sv[0], SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
        setsockopt(sv[0], SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
    }
    atomic_store(&p->last_frame_ms, now_ms());
    int cfd = sv[1];
    if (cfd == PROTO_CHILD_FD) { /* dup2 onto itself would keep close-on-exec */
        cfd = fcntl(sv[1], F_DUPFD_CLOEXEC, PROTO_CHILD_FD + 1);
        close(sv[1]);
    }
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_adddup2(&fa, cfd, PROTO_CHILD_FD);
    /* the front end's threads block SIGINT/SIGTERM for sigwait; the child
     * must not inherit that mask */
    posix_spawnattr_t at;
    posix_spawnattr_init(&at);
    sigset_t none;
    sigemptyset(&none);
    posix_spawnattr_setsigmask(&at, &none);
    posix_spawnattr_setflags(&at, POSIX_SPAWN_SETSIGMASK);
    char a0[] = "strata", a1[] = "engine", a2[] = "--fd", a3[16];
    snprintf(a3, sizeof a3, "%d", PROTO_CHILD_FD);
    char *argv[] = {a0, a1, a2, a3, NULL};
    int rc = cfd < 0 ? errno : posix_spawn(&pid, "/proc/self/exe", &fa, &at, argv, environ);
    posix_spawn_file_actions_destroy(&fa);
    posix_spawnattr_destroy(&at);
    if (cfd >= 0) close(cfd);
    if (rc != 0) {
        close(sv[0]);
        st_error_set("could not start the engine process: %s", strerror(rc));
        return -1;
    }
started:
    p->gen++;
    if (p->gen > 1) p->m.engine_restarts++;
    p->state = ENG_STARTING;
    p->pid = pid;
    p->t_spawn = now_s();
    pthread_mutex_lock(&p->wmu);
    p->wfd = sv[0];
    p->wgen = p->gen;
    pthread_mutex_unlock(&p->wmu);
    reader_arg *ra = st_calloc(1, sizeof *ra);
    *ra = (reader_arg){p, sv[0], p->gen, pid};
    pthread_t t;
    if (pthread_create(&t, NULL, reader, ra) != 0) {
        /* without a reader nobody would reap it: end it here */
        kill(pid, SIGKILL);
        waitpid(pid, NULL, 0);
        pthread_mutex_lock(&p->wmu);
        p->wfd = -1;
        pthread_mutex_unlock(&p->wmu);
        close(sv[0]);
        st_free(ra);
        p->state = ENG_DOWN;
        p->pid = 0;
        st_error_set("could not start the engine's reader thread");
        return -1;
    }
    pthread_detach(t);
    p->n_readers++;
    if (p->gen > 1)
        ST_INFO("engine: restarting (process %d, restart %llu)", (int)pid, (unsigned long long)p->m.engine_restarts);
    return 0;
}

static int find_locked(srv_proc *p, uint64_t id) {
    for (int i = 0; i < p->n_ents; i++)
        if (p->ents[i]->id == id) return i;
    return -1;
}

static void remove_locked(srv_proc *p, int i) {
    memmove(p->ents + i, p->ents + i + 1, (size_t)(p->n_ents - i - 1) * sizeof *p->ents);
    p->n_ents--;
}

static void free_entry(pentry *e) {
    sbuf_free(&e->frame);
    st_free(e);
}

static void on_ready(srv_proc *p, const reader_arg *ra, const proto_frame *f) {
    proto_cur c = {f->payload, f->len, 0};
    int n_ctx = proto_get_i32(&c);
    pthread_mutex_lock(&p->mu);
    p->m.n_ctx = n_ctx;
    p->state = ENG_READY;
    p->ever_ready = 1;
    double ms = (now_s() - p->t_spawn) * 1e3;
    /* the requests that came while it loaded: sent now, oldest first; only
     * this thread frees entries, so they stay valid after the unlock */
    int n = 0;
    pentry **wait = st_calloc((size_t)p->n_ents + 1, sizeof *wait);
    for (int i = 0; i < p->n_ents; i++)
        if (!p->ents[i]->sent) {
            p->ents[i]->sent = 1;
            wait[n++] = p->ents[i];
        }
    pthread_cond_broadcast(&p->cv);
    pthread_mutex_unlock(&p->mu);
    ST_INFO("engine: process %d ready in %.0f ms (context %d)%s", (int)ra->pid, ms, n_ctx,
            ra->gen > 1 ? ", restarted" : "");
    for (int i = 0; i < n; i++) {
        send_gen(p, ra->gen, PROTO_REQUEST, wait[i]->id, wait[i]->frame.s, wait[i]->frame.len);
        sbuf_free(&wait[i]->frame);
    }
    st_free(wait);
}

/* Metrics of a finished request, as the in-process scheduler counts them. Caller holds mu. */
static void count_done_locked(srv_proc *p, const pentry *e, const gen_stats *st) {
    sched_metrics *m = &p->m;
    if (!st) {
        if (e->cancel_sent) m->cancelled++;
        else m->failed++;
        return;
    }
    if (e->cancel_sent) m->cancelled++;
    else m->done++;
    sched_metrics_add(m, st);
    sched_map_keep(&p->map, st);
}

/* START, TEXT, DONE or ERROR of one request -> the front end's callback. */
static void on_event_frame(srv_proc *p, const reader_arg *ra, const proto_frame *f) {
    proto_cur c = {f->payload, f->len, 0};
    srv_event ev = {.slot = proto_get_i32(&c)};
    gen_stats st = {0};
    char err[512];
    int32_t top_ids[20];
    float top_lp[20], *embd = NULL;
    uint32_t n;
    const char *s;
    switch (f->type) {
    case PROTO_START: ev.kind = SRV_EV_START; break;
    case PROTO_TEXT:
        ev.kind = SRV_EV_TEXT;
        ev.text = (const char *)c.p;
        ev.len = c.left;
        break;
    case PROTO_TOKEN:
        ev.kind = SRV_EV_TOKEN;
        ev.token = proto_get_i32(&c);
        ev.logprob = proto_get_f32(&c);
        n = proto_get_u32(&c);
        ev.n_top = n <= 20 ? (int)n : 0;
        for (int k = 0; k < ev.n_top; k++) {
            top_ids[k] = proto_get_i32(&c);
            top_lp[k] = proto_get_f32(&c);
        }
        ev.top_ids = top_ids;
        ev.top_lp = top_lp;
        break;
    case PROTO_EMBED: /* copied out: the payload's floats need not be aligned */
        ev.kind = SRV_EV_EMBED;
        n = proto_get_u32(&c);
        if (n <= c.left / sizeof(float)) {
            embd = st_malloc((size_t)n * sizeof(float) + 1);
            memcpy(embd, c.p, (size_t)n * sizeof(float));
            ev.embd = embd;
            ev.n_embd = n;
        } else c.bad = 1;
        break;
    case PROTO_DONE:
        ev.kind = SRV_EV_DONE;
        proto_get_stats(&c, &st);
        ev.stats = &st;
        ev.n_cached = proto_get_i32(&c);
        break;
    default: /* PROTO_ERROR */
        ev.kind = SRV_EV_ERROR;
        s = proto_get_str(&c, &n);
        snprintf(err, sizeof err, "%.*s", (int)n, s);
        ev.error = err;
        ev.n_cached = proto_get_i32(&c);
        break;
    }
    if (c.bad) ST_WARN("engine: short frame of type %u for request %llu", f->type, (unsigned long long)f->id);
    int terminal = ev.kind == SRV_EV_DONE || ev.kind == SRV_EV_ERROR;
    pthread_mutex_lock(&p->mu);
    int i = find_locked(p, f->id);
    if (i < 0) { /* not ours (cannot happen) or already ended */
        pthread_mutex_unlock(&p->mu);
        st_free(embd);
        return;
    }
    pentry *e = p->ents[i];
    if (ev.kind == SRV_EV_START) e->started = 1;
    if (terminal) {
        count_done_locked(p, e, ev.kind == SRV_EV_DONE ? &st : NULL);
        remove_locked(p, i);
    }
    pthread_mutex_unlock(&p->mu);
    int stop = e->fn(e->ctx, &ev);
    st_free(embd);
    if (terminal) {
        free_entry(e);
    } else if (stop && !e->cancel_sent) {
        e->cancel_sent = 1;
        send_gen(p, ra->gen, PROTO_CANCEL, e->id, NULL, 0);
    }
}

/* Reap the child and describe how it ended: N for the message, and a log phrase. */
static int reap(pid_t pid, char *how, size_t cap) {
    int status = 0;
    while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
    }
    if (WIFSIGNALED(status)) {
        int sig = WTERMSIG(status);
        snprintf(how, cap, "was killed by signal %d (%s)", sig, strsignal(sig));
        return 128 + sig; /* the shell's convention */
    }
    int code = WIFEXITED(status) ? WEXITSTATUS(status) : 255;
    snprintf(how, cap, "exited with code %d", code);
    return code;
}

static void *reader(void *arg) {
    reader_arg *ra = arg;
    srv_proc *p = ra->p;
    sbuf cfg = {0};
    proto_put_config(&cfg, &p->ep, p->n_slots, p->max_queue, &p->sv.model);
    send_gen(p, ra->gen, PROTO_CONFIG, 0, cfg.s, cfg.len);
    sbuf_free(&cfg);
    proto_frame f = {0};
    char fail[400] = "";
    int r, stalled = 0;
    for (;;) {
        errno = 0;
        if ((r = proto_recv(ra->fd, &f)) != 1) {
            stalled = r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK);
            break;
        }
        atomic_store(&p->last_frame_ms, now_ms());
        if (f.type == PROTO_HEARTBEAT) continue;
        if (f.type == PROTO_READY) on_ready(p, ra, &f);
        else if (f.type == PROTO_FAIL) {
            proto_cur c = {f.payload, f.len, 0};
            uint32_t n;
            const char *s = proto_get_str(&c, &n);
            snprintf(fail, sizeof fail, "%.*s", (int)n, s);
            strip_path(fail, p->model_path);
        } else if ((f.type >= PROTO_START && f.type <= PROTO_TOKEN) || f.type == PROTO_EMBED) on_event_frame(p, ra, &f);
        else {
            r = -1;
            break;
        }
    }
    proto_frame_free(&f);
    if (stalled) { /* stopped (SIGSTOP), wedged, or starved: its requests would wait for ever */
        ST_WARN("engine: process %d sent nothing for %d s (--engine-timeout); killing it", (int)ra->pid,
                p->sv.heartbeat_timeout_s);
        kill(ra->pid, SIGKILL);
    } else if (r < 0) { /* a frame that makes no sense: this child cannot be trusted any more */
        ST_WARN("engine: broken frame from process %d; killing it", (int)ra->pid);
        kill(ra->pid, SIGKILL);
    }
    pthread_mutex_lock(&p->wmu);
    if (p->wgen == ra->gen) p->wfd = -1;
    pthread_mutex_unlock(&p->wmu);
    close(ra->fd);
    char how[128];
    int code = reap(ra->pid, how, sizeof how);

    pthread_mutex_lock(&p->mu);
    int stopping = p->stopping, loading = p->state == ENG_STARTING, first = !p->ever_ready;
    p->state = ENG_DOWN;
    p->pid = 0;
    int n = p->n_ents;
    pentry **ents = p->ents;
    p->ents = NULL;
    p->n_ents = p->cap_ents = 0;
    for (int i = 0; i < n; i++) count_done_locked(p, ents[i], NULL);
    char msg[512];
    if (stopping) snprintf(msg, sizeof msg, "the server is shutting down");
    else if (fail[0]) snprintf(msg, sizeof msg, "the engine could not start: %s; the next request retries", fail);
    else if (stalled)
        snprintf(msg, sizeof msg,
                 "the engine stopped responding (nothing from it for %d s, --engine-timeout) and was "
                 "killed; the next request restarts it",
                 p->sv.heartbeat_timeout_s);
    else if (p->sv.once)
        snprintf(msg, sizeof msg,
                 "the engine stopped unexpectedly (exit code %d); it ran in an MPI job, which "
                 "cannot restart it: the server is stopping",
                 code);
    else
        snprintf(msg, sizeof msg, "the engine stopped unexpectedly (exit code %d); the next request restarts it", code);
    if (fail[0]) snprintf(p->why_down, sizeof p->why_down, "%s", fail);
    else snprintf(p->why_down, sizeof p->why_down, "the engine process %s%s", how, loading ? " while loading" : "");
    pthread_cond_broadcast(&p->cv);
    pthread_mutex_unlock(&p->mu);

    if (!stopping && !(first && n == 0)) /* a failed first start is proc_create's error, not news */
        ST_WARN("engine: process %d %s%s; %d request%s in flight get the error; the next request restarts it",
                (int)ra->pid, how, loading ? " while loading" : "", n, n == 1 ? "" : "s");
    srv_event ev = {.kind = SRV_EV_ERROR, .slot = -1, .error = msg, .engine_down = !stopping};
    for (int i = 0; i < n; i++) {
        ents[i]->fn(ents[i]->ctx, &ev);
        free_entry(ents[i]);
    }
    st_free(ents);
    if (p->sv.once && !stopping) {
        /* the front end's own graceful stop (its sigwait), after which serve exits non-zero so that
         * mpirun ends the job's other ranks (docs/multi.md) */
        ST_WARN("engine: it ran as rank 0 of an MPI job and cannot restart in it; stopping the server");
        kill(getpid(), SIGTERM);
    }

    pthread_mutex_lock(&p->mu);
    p->n_readers--;
    pthread_cond_broadcast(&p->cv);
    pthread_mutex_unlock(&p->mu);
    st_free(ra);
    return NULL;
}

static void proc_free(srv_sched *b);
static const sched_ops PROC_OPS;

srv_sched *sched_create_supervised(const engine_params *ep, int n_slots, int max_queue, const sched_supervision *sv) {
    ST_ASSERT(n_slots > 0 && max_queue > 0 && ep->model_path);
    srv_proc *p = st_calloc(1, sizeof *p);
    p->base.ops = &PROC_OPS;
    pthread_mutex_init(&p->mu, NULL);
    pthread_mutex_init(&p->wmu, NULL);
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&p->cv, &ca);
    pthread_condattr_destroy(&ca);
    p->ep = *ep;
    p->sv = *sv;
    p->model_path = st_strdup(ep->model_path);
    p->ep.model_path = p->model_path;
    p->n_slots = n_slots;
    p->max_queue = max_queue;
    p->wfd = -1;
    p->m.n_slots = n_slots;
    p->m.max_queue = max_queue;
    pthread_mutex_lock(&p->mu);
    int ok = spawn_locked(p) == 0;
    while (ok && p->state == ENG_STARTING) pthread_cond_wait(&p->cv, &p->mu);
    ok = ok && p->state == ENG_READY;
    char why[512];
    snprintf(why, sizeof why, "%s", ok ? "" : p->why_down[0] ? p->why_down : st_error_get());
    pthread_mutex_unlock(&p->mu);
    if (!ok) {
        proc_free(&p->base);
        st_error_set("%s", why);
        return NULL;
    }
    return &p->base;
}

/* Stop the child (end of file on its socket; SIGKILL after a grace period)
 * and end every request in flight with an ERROR event. */
static void proc_free(srv_sched *b) {
    srv_proc *p = (srv_proc *)b;
    pthread_mutex_lock(&p->mu);
    p->stopping = 1;
    pid_t pid = p->pid;
    pthread_mutex_unlock(&p->mu);
    /* end of file on both sides: the child exits, our reader ends */
    pthread_mutex_lock(&p->wmu);
    if (p->wfd >= 0) shutdown(p->wfd, SHUT_RDWR);
    pthread_mutex_unlock(&p->wmu);
    struct timespec dl;
    clock_gettime(CLOCK_MONOTONIC, &dl);
    dl.tv_sec += STOP_GRACE_S;
    pthread_mutex_lock(&p->mu);
    while (p->n_readers > 0)
        if (pthread_cond_timedwait(&p->cv, &p->mu, &dl) == ETIMEDOUT) {
            ST_WARN("engine: process %d did not stop within %d s; killing it", (int)pid, STOP_GRACE_S);
            if (pid > 0) kill(pid, SIGKILL);
            while (p->n_readers > 0) pthread_cond_wait(&p->cv, &p->mu);
        }
    pthread_mutex_unlock(&p->mu);
    pthread_cond_destroy(&p->cv);
    pthread_mutex_destroy(&p->mu);
    pthread_mutex_destroy(&p->wmu);
    st_free(p->ents);
    st_free(p->model_path);
    st_free(p->map.cells);
    st_free(p);
}

/* sched_submit's contract (srv_proto.h); a dead engine is restarted here. */
static int proc_submit(srv_sched *b, const srv_request *req, srv_event_fn fn, void *ctx) {
    srv_proc *p = (srv_proc *)b;
    sbuf fr = {0};
    proto_put_request(&fr, req); /* encoded outside the lock: prompts can be long */
    pthread_mutex_lock(&p->mu);
    if (p->stopping || p->n_ents >= p->n_slots + p->max_queue) {
        pthread_mutex_unlock(&p->mu);
        sbuf_free(&fr);
        return -1;
    }
    if (p->state == ENG_DOWN && spawn_locked(p) != 0) {
        char msg[512];
        snprintf(msg, sizeof msg, "%s", st_error_get());
        pthread_mutex_unlock(&p->mu);
        sbuf_free(&fr);
        ST_WARN("engine: %s", msg);
        srv_event ev = {.kind = SRV_EV_ERROR, .slot = -1, .error = msg, .engine_down = 1};
        fn(ctx, &ev);
        return 0;
    }
    pentry *e = st_calloc(1, sizeof *e);
    e->id = ++p->next_id;
    e->fn = fn;
    e->ctx = ctx;
    int send_now = p->state == ENG_READY, gen = p->gen;
    if (send_now) e->sent = 1; /* fr stays ours: the entry may end (engine death) before we write */
    else {
        e->frame = fr;
        fr = (sbuf){0};
    }
    if (p->n_ents == p->cap_ents) {
        p->cap_ents = p->cap_ents ? 2 * p->cap_ents : 16;
        p->ents = st_realloc(p->ents, (size_t)p->cap_ents * sizeof *p->ents);
    }
    p->ents[p->n_ents++] = e;
    uint64_t id = e->id;
    pthread_mutex_unlock(&p->mu);
    if (send_now) send_gen(p, gen, PROTO_REQUEST, id, fr.s, fr.len);
    sbuf_free(&fr);
    return 0;
}

static void proc_metrics_get(srv_sched *b, sched_metrics *m) {
    srv_proc *p = (srv_proc *)b;
    pthread_mutex_lock(&p->mu);
    *m = p->m;
    m->busy = 0;
    for (int i = 0; i < p->n_ents; i++) m->busy += p->ents[i]->started;
    m->queued = p->n_ents - m->busy;
    m->engine_state = p->state == ENG_READY ? "ok" : p->ever_ready ? "restarting" : "loading";
    /* heartbeats come every 250 ms: a ready child silent for a second or more is not well (it is
     * killed at --engine-timeout) */
    const int64_t quiet = now_ms() - atomic_load(&p->last_frame_ms);
    if (p->state == ENG_READY && p->sv.heartbeat_timeout_s > 0 &&
        quiet > (p->sv.heartbeat_timeout_s >= 6   ? 3000
                 : p->sv.heartbeat_timeout_s >= 2 ? p->sv.heartbeat_timeout_s * 500
                                                  : 1000))
        m->engine_state = "unresponsive";
    m->engine_pid = (int)p->pid;
    pthread_mutex_unlock(&p->mu);
}

static int proc_n_ctx(srv_sched *b) {
    srv_proc *p = (srv_proc *)b;
    pthread_mutex_lock(&p->mu);
    int n = p->m.n_ctx;
    pthread_mutex_unlock(&p->mu);
    return n;
}

/* Start the engine if it is down (a health probe counts as a next request). */
static void proc_wake(srv_sched *b) {
    srv_proc *p = (srv_proc *)b;
    pthread_mutex_lock(&p->mu);
    if (p->state == ENG_DOWN && !p->stopping && spawn_locked(p) != 0) ST_WARN("engine: %s", st_error_get());
    pthread_mutex_unlock(&p->mu);
}

static int proc_expert_map(srv_sched *b, char **cells, int *n_layer, int *n_expert) {
    srv_proc *p = (srv_proc *)b;
    pthread_mutex_lock(&p->mu);
    const int rc = sched_map_copy(&p->map, cells, n_layer, n_expert);
    pthread_mutex_unlock(&p->mu);
    return rc;
}

static const sched_ops PROC_OPS = {proc_submit, proc_metrics_get, proc_expert_map, proc_n_ctx, proc_wake, proc_free};
