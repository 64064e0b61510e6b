/* GET /slots (llama-server's endpoint) and the KV cache gauges of /metrics.
 *
 * The slots live in the engine process; the front end keeps a picture of
 * them from the events it relays (srv_job.c): START names the slot a request
 * took, DONE and ERROR carry the tokens its KV cache holds afterwards
 * (srv_event n_cached). A slot that is generating is shown with its prompt
 * as its cache (what it holds once the prompt is read; the generated tokens
 * are added when it ends). After an engine restart every cache is empty.
 *
 * No switch turns the endpoint off (llama-server has --no-slots): it shows
 * token counts and request ids, never prompt text, and sits behind the API
 * key as /metrics does. */
#include <string.h>

#include "core/alloc.h"
#include "server/srv_internal.h"

void srv_slots_init(srv_ctx *s) {
    pthread_mutex_init(&s->slots_mu, NULL);
    s->slot_info = st_calloc((size_t)(s->p.n_slots > 0 ? s->p.n_slots : 1), sizeof(srv_slot_info));
}

void srv_slots_free(srv_ctx *s) {
    st_free(s->slot_info);
    s->slot_info = NULL;
    pthread_mutex_destroy(&s->slots_mu);
}

void srv_slots_event(srv_ctx *s, const srv_job *j, const srv_event *ev) {
    if (!s->slot_info || ev->slot < 0 || ev->slot >= s->p.n_slots) return;
    pthread_mutex_lock(&s->slots_mu);
    srv_slot_info *si = &s->slot_info[ev->slot];
    switch (ev->kind) {
    case SRV_EV_START:
        si->processing = 1;
        si->n_prompt = j->req.n_prompt;
        si->n_decoded = 0;
        snprintf(si->id_task, sizeof si->id_task, "%s", j->id);
        break;
    case SRV_EV_DONE:
        si->processing = 0;
        si->n_cached = ev->n_cached;
        si->n_decoded = ev->stats->n_gen;
        break;
    case SRV_EV_ERROR:
        si->processing = 0;
        si->n_cached = ev->n_cached;
        break;
    default: break;
    }
    pthread_mutex_unlock(&s->slots_mu);
}

/* Tokens held in slot i's cache as far as the front end knows. Caller holds slots_mu. */
static int cached_locked(const srv_ctx *s, int i) {
    const srv_slot_info *si = &s->slot_info[i];
    return si->processing ? si->n_prompt : si->n_cached;
}

/* An engine restart empties every cache. Caller holds slots_mu. */
static void restarts_locked(srv_ctx *s, const sched_metrics *m) {
    if (m->engine_restarts == s->slots_restarts) return;
    s->slots_restarts = m->engine_restarts;
    for (int i = 0; i < s->p.n_slots; i++)
        if (!s->slot_info[i].processing) s->slot_info[i].n_cached = 0;
}

void srv_slots_kv(srv_ctx *s, const sched_metrics *m, long long *tokens, long long *capacity) {
    *tokens = 0;
    *capacity = (long long)s->p.n_slots * m->n_ctx;
    pthread_mutex_lock(&s->slots_mu);
    restarts_locked(s, m);
    for (int i = 0; i < s->p.n_slots; i++) *tokens += cached_locked(s, i);
    pthread_mutex_unlock(&s->slots_mu);
}

enum MHD_Result srv_slots_ep(srv_ctx *s, struct MHD_Connection *c) {
    sched_metrics m;
    sched_metrics_get(s->sched, &m);
    json_t *a = json_array();
    pthread_mutex_lock(&s->slots_mu);
    restarts_locked(s, &m);
    for (int i = 0; i < s->p.n_slots; i++) {
        const srv_slot_info *si = &s->slot_info[i];
        json_array_append_new(a, json_pack("{s:i, s:s?, s:i, s:b, s:b, s:i, s:i, s:{s:i}}", "id", i, "id_task",
                                           si->id_task[0] ? si->id_task : NULL, "n_ctx", m.n_ctx, "speculative", 0,
                                           "is_processing", si->processing, "n_prompt_tokens", si->n_prompt,
                                           "n_cached_tokens", cached_locked(s, i), "next_token", "n_decoded",
                                           si->n_decoded));
    }
    pthread_mutex_unlock(&s->slots_mu);
    return srv_send_json(s, c, 200, a);
}
