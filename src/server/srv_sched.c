/* Request queue and worker slots (srv_sched.h). One mutex guards the queue,
 * the slot table and the metrics; a slot's engine is touched only by its own
 * worker while the slot is busy, and by the dispatcher (reading its token
 * history for routing) only while it is free. */
#include "server/srv_sched.h"

#include <pthread.h>
#include <stdio.h>
#include <string.h>

#include <unistd.h>

#include "core/alloc.h"
#include "core/log.h"
#include "server/srv_proto.h"

typedef struct {
    const srv_request *req;
    srv_event_fn fn;
    void *ctx;
} pending;

typedef struct {
    srv_sched *s;
    int id;
    engine *e;
    pthread_t thread;
    pthread_cond_t cv;
    pending job;        /* job.req != NULL while busy */
    uint64_t last_used; /* dispatch tick of its last request: LRU choice */
} slot;

struct srv_sched {
    pthread_mutex_t mu;
    slot *slots;
    int n_slots, stopping;
    pending *queue;     /* ring of max_queue entries */
    int q_head, q_len, max_queue;
    uint64_t tick;
    sched_metrics m;
    srv_proc *proc;     /* supervised: everything above is in the child, this forwards to it */
};

static int common_prefix(const engine *e, const int32_t *toks, int n) {
    int k = 0;
    while (k < e->n_past && k < n && e->hist[k] == toks[k]) k++;
    return k;
}

/* The free slot for a prompt (see the routing rule in srv_sched.h); -1 if none is free. */
static int choose_slot(srv_sched *s, const srv_request *r) {
    int best = -1, best_lcp = 0, lru = -1;
    for (int i = 0; i < s->n_slots; i++) {
        slot *sl = &s->slots[i];
        if (sl->job.req) continue;
        if (lru < 0 || sl->last_used < s->slots[lru].last_used) lru = i;
        int lcp = common_prefix(sl->e, r->prompt, r->n_prompt);
        if (lcp > best_lcp && 2 * lcp >= r->n_prompt) {
            best = i;
            best_lcp = lcp;
        }
    }
    return best >= 0 ? best : lru;
}

/* Hand queued requests, oldest first, to free slots. Caller holds mu. */
static void dispatch_locked(srv_sched *s) {
    while (s->q_len > 0) {
        pending *p = &s->queue[s->q_head];
        int i = choose_slot(s, p->req);
        if (i < 0) return;
        slot *sl = &s->slots[i];
        sl->job = *p;
        sl->last_used = ++s->tick;
        s->q_head = (s->q_head + 1) % s->max_queue;
        s->q_len--;
        s->m.busy++;
        pthread_cond_signal(&sl->cv);
    }
}

typedef struct {
    pending *job;
    int slot;
    int stopped;        /* the front end asked to stop (client gone) */
} text_ctx;

static int on_text(void *ctx, const char *text, size_t len) {
    text_ctx *t = ctx;
    srv_event ev = {.kind = SRV_EV_TEXT, .slot = t->slot, .text = text, .len = len};
    if (t->job->fn(t->job->ctx, &ev) != 0) t->stopped = 1;
    return t->stopped;
}

/* Run one request on the slot's engine; returns its outcome for the metrics:
 * 0 done, 1 failed, 2 cancelled. */
static int run_job(slot *sl, pending *job, gen_stats *st) {
    srv_event ev = {.kind = SRV_EV_START, .slot = sl->id};
    memset(st, 0, sizeof *st);
    if (job->fn(job->ctx, &ev) != 0) {
        ev = (srv_event){.kind = SRV_EV_ERROR, .slot = sl->id, .error = "cancelled before it started"};
        job->fn(job->ctx, &ev);
        return 2;
    }
    const srv_request *r = job->req;
    sampler *smp = sampler_create(&r->sp, sl->e->m->hp.n_vocab);
    gen_params gp = {.max_tokens = r->max_tokens, .stop = r->stop, .n_stop = r->n_stop};
    text_ctx tc = {job, sl->id, 0};
    int rc = r->logprobs || r->json_mode ? srv_generate(sl->e, smp, r, job->fn, job->ctx, sl->id, &tc.stopped, st)
                                         : engine_generate(sl->e, smp, r->prompt, r->n_prompt, &gp, on_text, &tc, st);
    sampler_free(smp);
    if (rc != 0) {
        ev = (srv_event){.kind = SRV_EV_ERROR, .slot = sl->id, .error = st_error_get()};
        ST_WARN("slot %d: %s", sl->id, ev.error);
        job->fn(job->ctx, &ev);
        return 1;
    }
    char line[512];
    gen_stats_format(st, line, sizeof line);
    ST_INFO("slot %d: %s, finish %s", sl->id, line, tc.stopped ? "cancelled" : st->finish);
    ev = (srv_event){.kind = SRV_EV_DONE, .slot = sl->id, .stats = st};
    job->fn(job->ctx, &ev);
    return tc.stopped ? 2 : 0;
}

static void *worker(void *arg) {
    slot *sl = arg;
    srv_sched *s = sl->s;
    pthread_mutex_lock(&s->mu);
    for (;;) {
        while (!sl->job.req && !s->stopping) pthread_cond_wait(&sl->cv, &s->mu);
        if (!sl->job.req) break;
        pending job = sl->job;
        pthread_mutex_unlock(&s->mu);
        gen_stats st;
        int outcome = run_job(sl, &job, &st);
        pthread_mutex_lock(&s->mu);
        sched_metrics *m = &s->m;
        if (outcome == 0 || (outcome == 2 && st.n_prompt > 0)) {
            if (outcome == 0) m->done++;
            else m->cancelled++;
            m->prompt_tokens += (uint64_t)st.n_prompt;
            m->reused_tokens += (uint64_t)st.n_reused;
            m->read_tokens += (uint64_t)st.n_read;
            m->gen_tokens += (uint64_t)st.n_gen;
            m->prompt_s += st.prompt_ms / 1e3;
            m->gen_s += st.gen_ms / 1e3;
            m->last_prompt_tps = st.prompt_ms > 0 ? st.n_read / (st.prompt_ms / 1e3) : 0;
            m->last_gen_tps = st.gen_ms > 0 ? st.n_gen / (st.gen_ms / 1e3) : 0;
        } else if (outcome == 1)
            m->failed++;
        else
            m->cancelled++; /* dropped before it started */
        sl->job.req = NULL;
        m->busy--;
        dispatch_locked(s);
    }
    pthread_mutex_unlock(&s->mu);
    return NULL;
}

srv_sched *sched_create(const engine_params *ep, int n_slots, int max_queue) {
    ST_ASSERT(n_slots > 0 && max_queue > 0);
    srv_sched *s = st_calloc(1, sizeof *s);
    pthread_mutex_init(&s->mu, NULL);
    s->slots = st_calloc((size_t)n_slots, sizeof(slot));
    s->queue = st_calloc((size_t)max_queue, sizeof(pending));
    s->max_queue = max_queue;
    for (int i = 0; i < n_slots; i++) {
        slot *sl = &s->slots[i];
        sl->s = s;
        sl->id = i;
        sl->e = engine_open(ep);
        if (!sl->e) {
            s->n_slots = i; /* close what was opened; the error stays set */
            char err[512];
            snprintf(err, sizeof err, "%s", st_error_get());
            sched_free(s);
            st_error_set("%s", err);
            return NULL;
        }
        pthread_cond_init(&sl->cv, NULL);
        s->n_slots = i + 1;
        if (pthread_create(&sl->thread, NULL, worker, sl) != 0) {
            pthread_cond_destroy(&sl->cv);
            engine_close(sl->e);
            s->n_slots = i;
            sched_free(s);
            st_error_set("could not start the worker thread of slot %d", i);
            return NULL;
        }
    }
    s->m.n_slots = n_slots;
    s->m.max_queue = max_queue;
    s->m.n_ctx = s->slots[0].e->n_ctx;
    s->m.engine_state = "ok";
    s->m.engine_pid = (int)getpid();
    return s;
}

srv_sched *sched_create_supervised(const engine_params *ep, int n_slots, int max_queue) {
    srv_proc *p = proc_create(ep, n_slots, max_queue);
    if (!p) return NULL;
    srv_sched *s = st_calloc(1, sizeof *s);
    s->proc = p;
    return s;
}

void sched_wake(srv_sched *s) {
    if (s->proc) proc_wake(s->proc);
}

void sched_free(srv_sched *s) {
    if (!s) return;
    if (s->proc) {
        proc_free(s->proc);
        st_free(s);
        return;
    }
    pthread_mutex_lock(&s->mu);
    s->stopping = 1;
    /* queued requests end now; running ones stop at their next event because
     * the front end, which is shutting down too, answers it with nonzero */
    while (s->q_len > 0) {
        pending p = s->queue[s->q_head];
        s->q_head = (s->q_head + 1) % s->max_queue;
        s->q_len--;
        srv_event ev = {.kind = SRV_EV_ERROR, .slot = -1, .error = "the server is shutting down"};
        p.fn(p.ctx, &ev);
    }
    for (int i = 0; i < s->n_slots; i++) pthread_cond_signal(&s->slots[i].cv);
    pthread_mutex_unlock(&s->mu);
    for (int i = 0; i < s->n_slots; i++) {
        pthread_join(s->slots[i].thread, NULL);
        pthread_cond_destroy(&s->slots[i].cv);
        engine_close(s->slots[i].e);
    }
    pthread_mutex_destroy(&s->mu);
    st_free(s->slots);
    st_free(s->queue);
    st_free(s);
}

int sched_submit(srv_sched *s, const srv_request *req, srv_event_fn fn, void *ctx) {
    if (s->proc) return proc_submit(s->proc, req, fn, ctx);
    pthread_mutex_lock(&s->mu);
    if (s->stopping || s->q_len == s->max_queue) {
        pthread_mutex_unlock(&s->mu);
        return -1;
    }
    s->queue[(s->q_head + s->q_len) % s->max_queue] = (pending){req, fn, ctx};
    s->q_len++;
    dispatch_locked(s);
    pthread_mutex_unlock(&s->mu);
    return 0;
}

void sched_metrics_get(srv_sched *s, sched_metrics *m) {
    if (s->proc) {
        proc_metrics_get(s->proc, m);
        return;
    }
    pthread_mutex_lock(&s->mu);
    *m = s->m;
    m->queued = s->q_len;
    pthread_mutex_unlock(&s->mu);
}

int sched_n_ctx(const srv_sched *s) { return s->proc ? proc_n_ctx(s->proc) : s->m.n_ctx; }
