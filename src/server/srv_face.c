/* What both sides of the server run (srv_proto.h): the growing byte buffer,
 * the scheduler's face that calls through its role's table (sched_ops), and
 * the bookkeeping both roles keep the same way (metrics, the expert map).
 * The front end (srv_proc.c) and the engine process (engine/) link this file;
 * neither side's own files are needed by the other. */
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "core/alloc.h"
#include "server/srv_proto.h"

/* ---- byte buffer ---- */

void sbuf_put(sbuf *b, const char *s, size_t n) {
    if (b->len + n + 1 > b->cap) {
        b->cap = (b->len + n + 1) * 2;
        if (b->cap < 256) b->cap = 256;
        b->s = st_realloc(b->s, b->cap);
    }
    if (n) memcpy(b->s + b->len, s, n); /* s may be NULL when n is 0 (an empty array's data) */
    b->len += n;
    b->s[b->len] = 0;
}

void sbuf_puts(sbuf *b, const char *s) { sbuf_put(b, s, strlen(s)); }

void sbuf_printf(sbuf *b, const char *fmt, ...) {
    char tmp[1024];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(tmp, sizeof tmp, fmt, ap);
    va_end(ap);
    if (n < 0) return;
    if ((size_t)n < sizeof tmp) {
        sbuf_put(b, tmp, (size_t)n);
        return;
    }
    char *big = st_malloc((size_t)n + 1);
    va_start(ap, fmt);
    vsnprintf(big, (size_t)n + 1, fmt, ap);
    va_end(ap);
    sbuf_put(b, big, (size_t)n);
    st_free(big);
}

void sbuf_free(sbuf *b) {
    st_free(b->s);
    *b = (sbuf){0};
}

/* ---- the role-independent bookkeeping ---- */

void sched_map_keep(sched_map *m, const gen_stats *st) {
    if (!st->expert_map || st->map_layers <= 0 || st->map_experts <= 0) return;
    const size_t n = (size_t)st->map_layers * (size_t)st->map_experts;
    if (!m->cells || (size_t)m->n_layer * (size_t)m->n_expert != n) {
        st_free(m->cells);
        m->cells = st_malloc(n);
    }
    memcpy(m->cells, st->expert_map, n);
    m->n_layer = st->map_layers;
    m->n_expert = st->map_experts;
}

int sched_map_copy(const sched_map *m, char **cells, int *n_layer, int *n_expert) {
    if (!m->cells) return -1;
    const size_t n = (size_t)m->n_layer * (size_t)m->n_expert;
    *cells = st_malloc(n);
    memcpy(*cells, m->cells, n);
    *n_layer = m->n_layer;
    *n_expert = m->n_expert;
    return 0;
}

void sched_metrics_add(sched_metrics *m, const gen_stats *st) {
    m->prompt_tokens += (uint64_t)st->n_prompt;
    m->reused_tokens += (uint64_t)st->n_reused;
    m->read_tokens += (uint64_t)st->n_read;
    m->gen_tokens += (uint64_t)st->n_gen;
    m->prompt_s += st->prompt_ms / 1e3;
    m->gen_s += st->gen_ms / 1e3;
    m->drafts_accepted += (uint64_t)st->drafts_accepted;
    m->drafts_total += (uint64_t)st->drafts_total;
    m->last_prompt_tps = st->prompt_ms > 0 ? st->n_read / (st->prompt_ms / 1e3) : 0;
    m->last_gen_tps = st->gen_ms > 0 ? st->n_gen / (st->gen_ms / 1e3) : 0;
    if (st->lanes) { /* the engine's own totals: a request's pairs overlap the other slots' in batched steps */
        m->lanes = 1;
        m->pairs_dev = st->total_dev;
        m->pairs_cpu = st->total_cpu;
        m->pairs_pcie = st->total_pcie;
        m->bytes_ssd = st->total_ssd;
    }
}

/* ---- the face both roles share ---- */

int sched_submit(srv_sched *s, const srv_request *req, srv_event_fn fn, void *ctx) {
    return s->ops->submit(s, req, fn, ctx);
}
void sched_metrics_get(srv_sched *s, sched_metrics *m) { s->ops->metrics(s, m); }
int sched_expert_map(srv_sched *s, char **cells, int *n_layer, int *n_expert) {
    return s->ops->expert_map(s, cells, n_layer, n_expert);
}
int sched_n_ctx(srv_sched *s) { return s->ops->n_ctx(s); }
void sched_wake(srv_sched *s) { s->ops->wake(s); }
void sched_free(srv_sched *s) {
    if (s) s->ops->destroy(s);
}
