/* The layer split between threads of one process (split_local.h): each rank
 * a thread with an engine of its own on its own device, the transport a
 * pair of message queues per rank (commands from rank 0, the residual stream
 * from the rank before), copied in and out so that no rank reads another's
 * buffers. The same commands and ring as over MPI (split.c). */
#include "engine/split_local.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/alloc.h"
#include "core/log.h"
#include "core/threadpool.h"

typedef struct msg {
    struct msg *next;
    size_t bytes;
    char data[];
} msg;

typedef struct {
    msg *head, *tail;
} queue;

typedef struct {
    split_net net;
    split_local *l;
    engine_params p;
    pthread_t th;
    int started;
    queue cmd, x;   /* what this rank receives: rank 0's commands, the stream from the rank before */
    int state;      /* 0 opening, 1 following, -1 failed (err) */
    st_backend *be; /* this rank's, once following */
    char err[512];
} rank_slot;

struct split_local {
    pthread_mutex_t mu;
    pthread_cond_t cv; /* any queue or state changed */
    int n;
    rank_slot *r; /* [n]; rank 0 is the caller's */
};

static void push(split_local *l, queue *q, const void *data, size_t bytes) {
    msg *m = st_malloc(sizeof *m + bytes);
    m->next = NULL;
    m->bytes = bytes;
    memcpy(m->data, data, bytes);
    pthread_mutex_lock(&l->mu);
    if (q->tail) q->tail->next = m;
    else q->head = m;
    q->tail = m;
    pthread_cond_broadcast(&l->cv);
    pthread_mutex_unlock(&l->mu);
}

static void pop(split_local *l, queue *q, void *data, size_t bytes, int rank) {
    pthread_mutex_lock(&l->mu);
    while (!q->head) pthread_cond_wait(&l->cv, &l->mu);
    msg *m = q->head;
    q->head = m->next;
    if (!q->head) q->tail = NULL;
    pthread_mutex_unlock(&l->mu);
    /* the two sides make the same calls in the same order: a size that differs is a bug here */
    if (m->bytes != bytes) {
        st_log(ST_LOG_ERROR, "in-process split, rank %d: a message of %zu bytes where %zu were due", rank, m->bytes,
               bytes);
        abort();
    }
    memcpy(data, m->data, bytes);
    st_free(m);
}

static void local_send(split_net *net, int to, const float *x, size_t n) {
    split_local *l = net->ctx;
    push(l, &l->r[to].x, x, n * sizeof(float));
}

static void local_recv(split_net *net, int from, float *x, size_t n) {
    (void)from; /* the ring: always the rank before */
    split_local *l = net->ctx;
    pop(l, &l->r[net->rank].x, x, n * sizeof(float), net->rank);
}

static void local_bcast(split_net *net, int32_t *v, size_t n) {
    split_local *l = net->ctx;
    if (net->rank == 0)
        for (int r = 1; r < l->n; r++) push(l, &l->r[r].cmd, v, n * sizeof(int32_t));
    else pop(l, &l->r[net->rank].cmd, v, n * sizeof(int32_t), net->rank);
}

static void local_finish(void) {}

void split_local_ready(split_net *net, st_backend *be) {
    if (!net || net->send != local_send) return; /* MPI ranks start together under mpirun */
    split_local *l = net->ctx;
    pthread_mutex_lock(&l->mu);
    l->r[net->rank].be = be;
    l->r[net->rank].state = 1;
    pthread_cond_broadcast(&l->cv);
    pthread_mutex_unlock(&l->mu);
}

/* A follower's thread: its engine (engine_open follows rank 0 until stop,
 * then returns NULL); one that never reported ready failed to open. */
static void *rank_main(void *arg) {
    rank_slot *s = arg;
    (void)engine_open(&s->p);
    pthread_mutex_lock(&s->l->mu);
    if (s->state == 0) {
        s->state = -1;
        snprintf(s->err, sizeof s->err, "%s", st_error_get());
    }
    pthread_cond_broadcast(&s->l->cv);
    pthread_mutex_unlock(&s->l->mu);
    return NULL;
}

st_backend *split_local_backend(const split_local *l, int r) { return l && r >= 0 && r < l->n ? l->r[r].be : NULL; }

int split_rank_threads(int n_cpu) { return n_cpu > 0 && st_cpu_count() / n_cpu > 0 ? st_cpu_count() / n_cpu : 1; }

split_local *split_local_start(const engine_params *p, const int *devs, int n, split_net **net0) {
    split_local *l = st_calloc(1, sizeof *l);
    pthread_mutex_init(&l->mu, NULL);
    pthread_cond_init(&l->cv, NULL);
    l->n = n;
    l->r = st_calloc((size_t)n, sizeof *l->r);
    for (int r = 0; r < n; r++) {
        rank_slot *s = &l->r[r];
        s->net = (split_net){r, n, 0, local_send, local_recv, local_bcast, local_finish, l};
        s->l = l;
        s->p = *p;
        s->p.devices = NULL;
        s->p.gpu = devs[r];
        s->p.split_net = &s->net;
    }
    l->r[0].state = 1;
    /* the followers open one after the other: each maps the file and binds its own layers */
    int failed = 0;
    for (int r = 1; r < n && !failed; r++) {
        rank_slot *s = &l->r[r];
        if (pthread_create(&s->th, NULL, rank_main, s) != 0) {
            st_error_set("in-process split: cannot start the thread of rank %d", r);
            failed = 1;
            break;
        }
        s->started = 1;
        pthread_mutex_lock(&l->mu);
        while (s->state == 0) pthread_cond_wait(&l->cv, &l->mu);
        pthread_mutex_unlock(&l->mu);
        if (s->state < 0) {
            char dev[16];
            snprintf(dev, sizeof dev, devs[r] < 0 ? "cpu" : "GPU %d", devs[r]);
            st_error_set("rank %d of the split (%s): %s", r, dev, s->err);
            failed = 1;
        }
    }
    if (failed) {
        split_local_stop(l);
        return NULL;
    }
    *net0 = &l->r[0].net; /* only now: a failed start leaves the caller's untouched (it frees l) */
    return l;
}

void split_local_stop(split_local *l) {
    if (!l) return;
    split_send_stop(&l->r[0].net); /* the ready followers leave their loop (a second stop is nothing) */
    for (int r = 1; r < l->n; r++)
        if (l->r[r].started) pthread_join(l->r[r].th, NULL);
    for (int r = 0; r < l->n; r++) {
        queue *qs[2] = {&l->r[r].cmd, &l->r[r].x};
        for (int i = 0; i < 2; i++)
            for (msg *m = qs[i]->head, *next; m; m = next) next = m->next, st_free(m);
    }
    pthread_cond_destroy(&l->cv);
    pthread_mutex_destroy(&l->mu);
    st_free(l->r);
    st_free(l);
}

int split_parse_devices(const char *spec, int *devs, int max) {
    int n = 0;
    const char *p = spec;
    while (p && *p) {
        if (n == max) {
            st_error_set("--devices %s: more than %d entries", spec, max);
            return -1;
        }
        const char *end = strchr(p, ',');
        const size_t len = end ? (size_t)(end - p) : strlen(p);
        char *num_end;
        const long v = strtol(p, &num_end, 10);
        if (len == 3 && !strncmp(p, "cpu", 3)) devs[n++] = -1;
        else if (num_end == p + len && len > 0 && v >= 0 && v <= 255) devs[n++] = (int)v;
        else {
            st_error_set("--devices %s: want a comma-separated list of 'cpu' and GPU indices (e.g. 1,0 or cpu,cpu)",
                         spec);
            return -1;
        }
        p = end ? end + 1 : p + len;
    }
    if (n < 1) {
        st_error_set("--devices: an empty list");
        return -1;
    }
    return n;
}
