/* Request queue and slots on one engine thread (srv_sched.h). The mutex
 * guards the queue, each slot's job pointer and the metrics; everything else
 * of a slot (its sequence, sampler, generation) is the engine thread's
 * alone, and events are sent without the mutex held. */
#include "server/engine/srv_sched.h"

#include <pthread.h>
#include <stdio.h>
#include <string.h>

#include <unistd.h>

#include "core/alloc.h"
#include "core/log.h"
#include "core/timer.h"
#include "engine/moe_lanes.h"

typedef struct {
    const srv_request *req;
    srv_event_fn fn;
    void *ctx;
} pending;

/* A slot's request moves NEW -> PROMPT -> DECODE <-> SAMPLE -> FREE. */
typedef enum {
    SL_FREE,
    SL_NEW,    /* admitted; START not sent yet */
    SL_PROMPT, /* reading its prompt, a chunk per step */
    SL_DECODE, /* `next` goes into the next batched step (the prompt's last token, or the one sampled) */
    SL_SAMPLE, /* its logits are fresh: sample */
} slot_state;

typedef struct {
    int id;
    engine_seq *seq;
    pending job;        /* job.req != NULL while busy */
    uint64_t last_used; /* admission tick of its last request: LRU choice and prompt order */
    slot_state state;
    int32_t next;
    sampler *smp;
    gen_state *gen; /* from the end of the prompt to the end of the request */
    srv_gen_extra *extra;
    int64_t t0; /* admission time: the prompt's time runs from it */
    gen_stats st;
    moe_lane_stats lanes0; /* the expert lanes' counters at its start (its speed line's split: the pairs
                              of a batched step count for every slot in it) */
    int n_top;             /* SL_SAMPLE from the step's top-k candidates (top_ids/top_vals), else 0 */
    int drew;              /* SL_SAMPLE with the token the backend drew (drawn), else 0 */
    int32_t drawn;
    int32_t *top_ids; /* (top_cap) its candidates from the backend (slot_pick) */
    float *top_vals;
    int top_cap;
} slot;

/* The in-process role (srv_sched.h): the engine and its thread here. */
typedef struct {
    srv_sched base; /* first: the sched_* functions' view */
    pthread_mutex_t mu;
    pthread_cond_t cv; /* the engine thread waits here when it has nothing to do */
    engine *e;
    slot *slots;
    int n_slots, stopping, thread_started;
    pthread_t thread;
    pending *queue; /* ring of max_queue entries */
    int q_head, q_len, max_queue;
    uint64_t tick;
    sched_metrics m;
    int draft_n;     /* speculative decoding: tokens each generating slot drafts per step (engine_params.draft_n,
                        0: off) */
    sched_map map;   /* the expert cache as of the last finished request (under mu) */
    char *map_cells; /* the engine thread's buffer that moe_lanes_cache_map fills */
    int map_cap;
    /* the engine thread's own: the batched step's sequences and tokens */
    engine_seq **step_seqs;
    int32_t *step_toks; /* (n_slots * (draft_n + 1)): one token per slot, or its pending token and drafts */
    int *step_ntok;     /* (n_slots) the tokens of each slot in step_toks */
    slot **step_slots;
    model_pick *step_picks;    /* (n_slots) what the backend keeps of each slot's logits (slot_pick) */
    slot **step_readers;       /* (n_slots) the slots reading a prompt chunk in the step (pick_chunks) */
    engine_chunk *step_chunks; /* (n_slots) their chunks */
    srv_vocab *vocab[2];       /* the vocabulary tables grammars walk (srv_gen.c), built on first need */
} local_sched;

/* The free slot for a prompt (see the routing rule in srv_sched.h); -1 if none is free. */
static int choose_slot(local_sched *s, const srv_request *r) {
    int best = -1, best_lcp = 0, lru = -1;
    const int pin = r->pin_slot - 1;
    if (pin >= 0) return pin < s->n_slots && !s->slots[pin].job.req ? pin : -1;
    for (int i = 0; i < s->n_slots; i++) {
        slot *sl = &s->slots[i];
        if (sl->job.req) continue;
        if (lru < 0 || sl->last_used < s->slots[lru].last_used) lru = i;
        int lcp = engine_seq_common_prefix(sl->seq, r->prompt, r->n_prompt);
        if (lcp > best_lcp && 2 * lcp >= r->n_prompt) {
            best = i;
            best_lcp = lcp;
        }
    }
    return best >= 0 ? best : lru;
}

/* Hand queued requests, oldest first, to free slots. Caller holds mu. */
static void admit_locked(local_sched *s) {
    while (s->q_len > 0) {
        pending *p = &s->queue[s->q_head];
        int i = choose_slot(s, p->req);
        if (i < 0) return;
        slot *sl = &s->slots[i];
        sl->job = *p;
        sl->last_used = ++s->tick;
        sl->state = SL_NEW;
        s->q_head = (s->q_head + 1) % s->max_queue;
        s->q_len--;
        s->m.busy++;
    }
}

/* Outcome of a request for the metrics. */
enum { OUT_DONE, OUT_FAILED, OUT_CANCELLED };

/* End the slot's request: its terminal event is already sent. */
static void slot_release(local_sched *s, slot *sl, int outcome) {
    const gen_stats *st = &sl->st;
    srv_gen_extra_free(sl->extra);
    sampler_free(sl->smp);
    sl->extra = NULL;
    sl->smp = NULL;
    sl->gen = NULL;
    pthread_mutex_lock(&s->mu);
    sched_metrics *m = &s->m;
    if (outcome == OUT_DONE || (outcome == OUT_CANCELLED && st->n_prompt > 0)) {
        if (outcome == OUT_DONE) m->done++;
        else m->cancelled++;
        sched_metrics_add(m, st);
        sched_map_keep(&s->map, st);
    } else if (outcome == OUT_FAILED) m->failed++;
    else m->cancelled++; /* dropped before it started */
    sl->job.req = NULL;
    sl->state = SL_FREE;
    m->busy--;
    pthread_mutex_unlock(&s->mu);
}

static void slot_fail(local_sched *s, slot *sl, const char *msg, int outcome) {
    if (sl->gen) gen_end(sl->gen, &sl->st);
    srv_event ev = {.kind = SRV_EV_ERROR, .slot = sl->id, .error = msg, .n_cached = sl->seq->n_past};
    if (outcome == OUT_FAILED) ST_WARN("slot %d: %s", sl->id, msg);
    sl->job.fn(sl->job.ctx, &ev);
    slot_release(s, sl, outcome);
}

/* The generation ended (or was stopped): flush, DONE, free the slot. */
static void slot_finish(local_sched *s, slot *sl) {
    int cancelled = gen_cancelled(sl->gen);
    gen_end(sl->gen, &sl->st);
    const moe_lane_stats *ls = moe_lanes_stats(s->e->be);
    if (ls) { /* the expert lanes' pairs while it ran, prompt and decode */
        moe_lane_stats d = {0};
        moe_lane_stats_add(&d, ls, &sl->lanes0);
        sl->st.lanes = 1;
        sl->st.pairs_dev = d.pairs_dev;
        sl->st.pairs_cpu = d.pairs_cpu;
        sl->st.pairs_pcie = d.pairs_pcie;
        sl->st.bytes_ssd = d.bytes_ssd;
        sl->st.ns_ssd = d.ns_ssd;
        sl->st.total_ssd = ls->bytes_ssd;
        sl->st.total_dev = ls->pairs_dev;
        sl->st.total_cpu = ls->pairs_cpu;
        sl->st.total_pcie = ls->pairs_pcie;
        const model_hparams *hp = &s->e->m->hp;
        if (!s->map_cells) {
            s->map_cap = hp->n_layer * hp->n_expert;
            s->map_cells = st_malloc((size_t)s->map_cap);
        }
        int nl, nx;
        if (moe_lanes_cache_map(s->e->be, s->map_cells, s->map_cap, &nl, &nx) > 0)
            sl->st.expert_map = s->map_cells, sl->st.map_layers = nl, sl->st.map_experts = nx;
    }
    char line[512];
    gen_stats_format(&sl->st, line, sizeof line);
    ST_INFO("slot %d: %s, finish %s", sl->id, line, cancelled ? "cancelled" : sl->st.finish);
    srv_event ev = {.kind = SRV_EV_DONE, .slot = sl->id, .stats = &sl->st, .n_cached = sl->seq->n_past};
    sl->job.fn(sl->job.ctx, &ev);
    slot_release(s, sl, cancelled ? OUT_CANCELLED : OUT_DONE);
}

static int on_text(void *ctx, const char *text, size_t len) {
    slot *sl = ctx;
    srv_event ev = {.kind = SRV_EV_TEXT, .slot = sl->id, .text = text, .len = len};
    return sl->job.fn(sl->job.ctx, &ev);
}

/* An embedding request (r->embed): its whole prompt read now, in this slot's sequence (nothing of its
 * cache reused: every token's state is pooled), the vector sent, the slot freed. It holds the engine
 * thread for the prompt's time, as no generation does. */
static void slot_embed(local_sched *s, slot *sl) {
    const srv_request *r = sl->job.req;
    const size_t d = (size_t)s->e->m->hp.n_embd, n = r->embed == 1 + ENGINE_POOL_NONE ? d * r->n_prompt : d;
    float *v = st_malloc(n * sizeof(float));
    sl->t0 = st_now_ns();
    sl->seq->n_past = 0;
    engine_seq_reuse_prefix(sl->seq, r->prompt, r->n_prompt);
    if (engine_seq_embed(s->e, sl->seq, r->prompt, r->n_prompt, (engine_pool)(r->embed - 1), v) != 0) {
        st_free(v);
        slot_fail(s, sl, st_error_get(), OUT_FAILED);
        return;
    }
    sl->st.n_prompt = sl->st.n_read = r->n_prompt;
    sl->st.prompt_ms = (double)(st_now_ns() - sl->t0) / 1e6;
    sl->st.finish = "stop";
    srv_event ev = {.kind = SRV_EV_EMBED, .slot = sl->id, .embd = v, .n_embd = n};
    sl->job.fn(sl->job.ctx, &ev);
    st_free(v);
    char line[512];
    gen_stats_format(&sl->st, line, sizeof line); /* the speed line every request logs */
    ST_INFO("slot %d: embedding of %d tokens: %s", sl->id, r->n_prompt, line);
    srv_event done = {.kind = SRV_EV_DONE, .slot = sl->id, .stats = &sl->st, .n_cached = sl->seq->n_past};
    sl->job.fn(sl->job.ctx, &done);
    slot_release(s, sl, OUT_DONE);
}

/* A newly admitted request: START, checks, prefix reuse. */
static void slot_start(local_sched *s, slot *sl) {
    const srv_request *r = sl->job.req;
    memset(&sl->st, 0, sizeof sl->st);
    sl->st.finish = "error";
    sl->st.stop_index = -1;
    srv_event ev = {.kind = SRV_EV_START, .slot = sl->id};
    if (sl->job.fn(sl->job.ctx, &ev) != 0) {
        slot_fail(s, sl, "cancelled before it started", OUT_CANCELLED);
        return;
    }
    if (r->n_prompt <= 0 || r->n_prompt >= s->e->n_ctx) {
        char msg[128];
        snprintf(msg, sizeof msg, "the prompt has %d tokens, outside 1..%d", r->n_prompt, s->e->n_ctx - 1);
        slot_fail(s, sl, msg, OUT_FAILED);
        return;
    }
    for (int i = 0; i < r->n_prompt; i++) /* here, not in the batched step, where it would fail every slot */
        if (r->prompt[i] < 0 || r->prompt[i] >= s->e->m->hp.n_vocab) {
            char msg[128];
            snprintf(msg, sizeof msg, "token id %d is outside the vocabulary (%d)", r->prompt[i], s->e->m->hp.n_vocab);
            slot_fail(s, sl, msg, OUT_FAILED);
            return;
        }
    if (r->embed) {
        slot_embed(s, sl);
        return;
    }
    sl->t0 = st_now_ns();
    const moe_lane_stats *ls = moe_lanes_stats(s->e->be);
    if (ls) sl->lanes0 = *ls;
    if (r->no_cache) sl->seq->n_past = 0; /* cache_prompt: false: the whole prompt is read again */
    int reused = engine_seq_reuse_prefix(sl->seq, r->prompt, r->n_prompt);
    sl->st.n_prompt = r->n_prompt;
    sl->st.n_reused = reused;
    sl->st.n_read = r->n_prompt - reused;
    sl->state = SL_PROMPT;
}

/* The prompt's last token has been evaluated: the generation starts. -1 when it cannot (the slot is failed). */
static int gen_start(local_sched *s, slot *sl) {
    const srv_request *r = sl->job.req;
    sl->st.prompt_ms = (double)(st_now_ns() - sl->t0) / 1e6;
    gen_hooks hk;
    char err[512];
    sl->extra = srv_gen_extra_new(s->e, r, sl->job.fn, sl->job.ctx, sl->id, &hk, s->vocab, err, sizeof err);
    if (!sl->extra && err[0]) { /* the front end compiled the same grammar: only a bug gets here */
        char msg[600];
        snprintf(msg, sizeof msg, "the grammar does not compile: %s", err);
        slot_fail(s, sl, msg, OUT_FAILED);
        return -1;
    }
    sampler_params sp = r->sp;
    uint8_t *brk = sp.dry_multiplier != 0.0f ? srv_dry_breakers(s->e, r, s->vocab) : NULL;
    sp.dry_breaker = brk;
    sl->smp = sampler_create(&sp, s->e->m->hp.n_vocab);
    st_free(brk);
    gen_params gp = {.max_tokens = r->max_tokens,
                     .stop = r->stop,
                     .n_stop = r->n_stop,
                     .ignore_eos = r->ignore_eos,
                     .render_special = r->render_special,
                     .draft_mtp = s->e->mtp}; /* --draft mtp: the slots' drafts come from the MTP block */
    sl->gen = gen_begin(s->e, sl->seq, sl->smp, r->prompt, r->n_prompt, &gp, &hk, on_text, sl);
    return 0;
}

/* The prompt chunks of a step, into step_chunks / step_readers: the slots
 * reading a prompt, first admitted first, each taking what is left of its
 * prompt (never its last token: that one is its first decode row, in the
 * next step) up to the rows the step has left (room). Returns how many. */
static int pick_chunks(local_sched *s, int room) {
    int nr = 0;
    for (int i = 0; i < s->n_slots; i++) { /* the reading slots in admission order (insertion) */
        slot *c = &s->slots[i];
        if (c->state != SL_PROMPT) continue;
        int j = nr++;
        for (; j > 0 && s->step_readers[j - 1]->last_used > c->last_used; j--)
            s->step_readers[j] = s->step_readers[j - 1];
        s->step_readers[j] = c;
    }
    int nc = 0;
    for (int i = 0; i < nr && room > 0; i++) {
        slot *c = s->step_readers[i];
        const int left = c->job.req->n_prompt - 1 - c->seq->n_past, m = left < room ? left : room;
        if (m <= 0) continue;
        s->step_readers[nc] = c;
        s->step_chunks[nc++] = (engine_chunk){c->seq, c->job.req->prompt + c->seq->n_past, m};
        room -= m;
    }
    return nc;
}

/* After a step: a reader that has read all but its prompt's last token decodes next (that token first). */
static void chunks_done(local_sched *s, int nc) {
    for (int c = 0; c < nc; c++) {
        slot *rd = s->step_readers[c];
        if (rd->seq->n_past == rd->job.req->n_prompt - 1) {
            rd->next = rd->job.req->prompt[rd->job.req->n_prompt - 1];
            rd->state = SL_DECODE;
        }
    }
}

/* A failed step fails every slot in it. */
static void step_failed(local_sched *s, int n, int nc) {
    char msg[512];
    snprintf(msg, sizeof msg, "%s", st_error_get());
    for (int i = 0; i < n; i++) slot_fail(s, s->step_slots[i], msg, OUT_FAILED);
    for (int c = 0; c < nc; c++) slot_fail(s, s->step_readers[c], msg, OUT_FAILED);
}

/* Every generating slot's drafts as rows of one step (engine_step_drafts):
 * each puts its pending token and its drafts in (as many as the rows left
 * after one per slot allow, the first slots first), the prompt chunks take
 * the rest, and each slot then verifies its own rows (gen_verify: it samples
 * them as the plain decoder would, and its cache, attention rows or
 * recurrent state, forgets the rejected ones). A slot whose prompt's last
 * token is in the step has no generation yet: it goes in as one row and
 * samples as usual. */
static void step_drafts(local_sched *s, int n) {
    const int ub = s->e->n_ubatch;
    int rows = 0;
    for (int i = 0; i < n; i++) {
        slot *sl = s->step_slots[i];
        const int spare = ub - rows - (n - i); /* rows beyond one for each slot still to come */
        const int nd = s->draft_n < spare ? s->draft_n : spare;
        if (sl->gen && nd > 0) {
            s->step_ntok[i] = gen_draft(sl->gen, sl->next, nd, s->step_toks + rows);
        } else {
            s->step_toks[rows] = sl->next;
            s->step_ntok[i] = 1;
        }
        rows += s->step_ntok[i];
    }
    const int nc = pick_chunks(s, ub - rows);
    const float *logits;
    if (engine_step_drafts(s->e, s->step_chunks, nc, s->step_seqs, s->step_toks, s->step_ntok, n, &logits) != 0) {
        step_failed(s, n, nc);
        return;
    }
    const size_t nv = (size_t)s->e->m->hp.n_vocab;
    for (int i = 0, r = 0; i < n; r += s->step_ntok[i], i++) {
        slot *sl = s->step_slots[i];
        if (!sl->gen) { /* its prompt's last token was this row */
            if (gen_start(s, sl) == 0) sl->state = SL_SAMPLE;
            continue;
        }
        if (gen_verify(sl->gen, &sl->next, s->step_toks + r, s->step_ntok[i], logits + (size_t)r * nv) != 0)
            slot_finish(s, sl);
    }
    chunks_done(s, nc);
}

/* What the step keeps of a generating slot's logits on the backend
 * (engine_step's picks), when no hook reads every logit: the k largest when
 * its sampler needs only those (a GPU copies k pairs, not the vocabulary),
 * or the backend's own draw when the sampler is only a temperature (one
 * token copied), as engine_generate does; else nothing (rc 1: the logits
 * come whole and the host samples). */
static void slot_pick(local_sched *s, slot *sl, model_pick *p) {
    engine *e = s->e;
    *p = (model_pick){.rc = 1};
    if (!sl->gen || sl->extra) return;
    const int k = e->be->top_k ? sampler_candidates(sl->smp, e->be->top_k_max) : 0;
    const float dt = k <= 0 && e->be->draw ? sampler_device_temp(sl->smp) : 0.0f;
    if (k > 0) {
        if (k > sl->top_cap) {
            sl->top_cap = k;
            sl->top_ids = st_realloc(sl->top_ids, (size_t)k * sizeof *sl->top_ids);
            sl->top_vals = st_realloc(sl->top_vals, (size_t)k * sizeof *sl->top_vals);
        }
        *p = (model_pick){.k = k, .ids = sl->top_ids, .vals = sl->top_vals, .rc = 1};
    } else if (dt > 0.0f) {
        *p = (model_pick){.inv_t = 1.0f / dt, .u = sampler_draw_unit(sl->smp), .tok = &sl->drawn, .rc = 1};
    }
}

/* One batched step: one token of every generating slot (with drafts:
 * step_drafts) and the next prompt chunks of the slots reading one, first
 * admitted first, in the rows left (pick_chunks). A chunk never holds the
 * prompt's last token: that one goes in the next step as the slot's first
 * decode row, so that when nothing else runs it is a one-token step, as in
 * engine_read_prompt (the first logits then do not depend on how much of
 * the prompt was cached: the same request gives the same answer;
 * multi-token products round differently). */
static void step(local_sched *s) {
    int reading = 0;
    for (int i = 0; i < s->n_slots; i++) {
        slot *c = &s->slots[i];
        if (c->state != SL_PROMPT) continue;
        if (c->seq->n_past == c->job.req->n_prompt - 1) { /* all cached but the last token: nothing to read */
            c->next = c->job.req->prompt[c->seq->n_past];
            c->state = SL_DECODE;
        } else {
            reading = 1;
        }
    }
    int n = 0;
    for (int i = 0; i < s->n_slots; i++) {
        slot *sl = &s->slots[i];
        if (sl->state != SL_DECODE) continue;
        s->step_slots[n] = sl;
        s->step_seqs[n] = sl->seq;
        s->step_toks[n] = sl->next;
        n++;
    }
    if (n && s->draft_n > 0 && !(n == 1 && !reading && s->step_slots[0]->gen)) {
        step_drafts(s, n);
        return;
    }
    const int nc = pick_chunks(s, s->e->n_ubatch - n); /* none when more generating slots than rows */
    if (!n && !nc) return;
    if (n == 1 && !nc && s->draft_n > 0 && s->step_slots[0]->gen) {
        /* one slot generating and no prompt to read: it drafts, and one pass of its own verifies the draft */
        slot *sl = s->step_slots[0];
        if (gen_next_drafted(sl->gen, &sl->next, s->draft_n) != 0) slot_finish(s, sl);
        return;
    }
    for (int i = 0; i < n; i++) slot_pick(s, s->step_slots[i], &s->step_picks[i]);
    if (engine_step(s->e, s->step_chunks, nc, 0, s->step_seqs, s->step_toks, n, s->step_picks) != 0) {
        /* every token was checked at admission or when sampled: a bug, but fail the requests, not the process */
        step_failed(s, n, nc);
        return;
    }
    for (int i = 0; i < n; i++) {
        slot *sl = s->step_slots[i];
        if (!sl->gen && gen_start(s, sl) != 0) continue; /* its prompt's last token was this row */
        const model_pick *p = &s->step_picks[i];
        sl->n_top = p->rc == 0 && p->k > 0 ? p->k : 0;
        sl->drew = p->rc == 0 && p->k <= 0;
        sl->state = SL_SAMPLE;
    }
    chunks_done(s, nc);
}

/* Sample every slot with fresh logits; a finished or stopped one is freed. */
static void sample_all(local_sched *s) {
    for (int i = 0; i < s->n_slots; i++) {
        slot *sl = &s->slots[i];
        if (sl->state != SL_SAMPLE) continue;
        const int n_top = sl->n_top;
        const int drew = sl->drew;
        sl->n_top = 0, sl->drew = 0;
        if ((n_top  ? gen_next_top(sl->gen, sl->top_ids, sl->top_vals, n_top, &sl->next)
             : drew ? gen_next_drawn(sl->gen, sl->drawn, &sl->next)
                    : gen_next(sl->gen, &sl->next)) == 0)
            sl->state = SL_DECODE;
        else slot_finish(s, sl);
    }
}

/* Shutting down: every running request ends now. */
static void stop_all(local_sched *s) {
    for (int i = 0; i < s->n_slots; i++) {
        slot *sl = &s->slots[i];
        if (sl->state == SL_FREE) continue;
        if (sl->gen) slot_finish(s, sl);
        else slot_fail(s, sl, "the server is shutting down", OUT_CANCELLED);
    }
}

static void *engine_thread(void *arg) {
    local_sched *s = arg;
    for (;;) {
        pthread_mutex_lock(&s->mu);
        while (!s->stopping && !s->q_len && !s->m.busy) pthread_cond_wait(&s->cv, &s->mu);
        int stopping = s->stopping;
        if (!stopping) admit_locked(s);
        pthread_mutex_unlock(&s->mu);
        if (stopping) {
            stop_all(s);
            return NULL;
        }
        for (int i = 0; i < s->n_slots; i++)
            if (s->slots[i].state == SL_NEW) slot_start(s, &s->slots[i]);
        step(s);
        sample_all(s);
    }
}

static void local_destroy(srv_sched *b);
static const sched_ops LOCAL_OPS;

srv_sched *sched_create(const engine_params *ep, int n_slots, int max_queue) {
    ST_ASSERT(n_slots > 0 && max_queue > 0);
    engine_params p = *ep;
    p.n_seq = n_slots; /* the memory plan's KV caches: one per slot (slot 0 is the engine's own sequence) */
    engine *e = engine_open(&p);
    if (!e) return NULL;
    local_sched *s = st_calloc(1, sizeof *s);
    s->base.ops = &LOCAL_OPS;
    pthread_mutex_init(&s->mu, NULL);
    pthread_cond_init(&s->cv, NULL);
    s->e = e;
    s->draft_n = engine_drafts_ok(e) ? ep->draft_n : 0; /* a recurrent state needs the backend's rollback */
    s->slots = st_calloc((size_t)n_slots, sizeof(slot));
    s->queue = st_calloc((size_t)max_queue, sizeof(pending));
    s->max_queue = max_queue;
    s->n_slots = n_slots;
    s->step_seqs = st_calloc((size_t)n_slots, sizeof *s->step_seqs);
    s->step_toks = st_calloc((size_t)n_slots * (size_t)(s->draft_n + 1), sizeof *s->step_toks);
    s->step_ntok = st_calloc((size_t)n_slots, sizeof *s->step_ntok);
    s->step_slots = st_calloc((size_t)n_slots, sizeof *s->step_slots);
    s->step_picks = st_calloc((size_t)n_slots, sizeof *s->step_picks);
    s->step_readers = st_calloc((size_t)n_slots, sizeof *s->step_readers);
    s->step_chunks = st_calloc((size_t)n_slots, sizeof *s->step_chunks);
    for (int i = 0; i < n_slots; i++) {
        s->slots[i].id = i;
        s->slots[i].seq = i == 0 ? &e->seq : engine_seq_new(e); /* the engine's own sequence serves slot 0 */
    }
    s->m.n_slots = n_slots;
    s->m.max_queue = max_queue;
    s->m.n_ctx = e->n_ctx;
    s->m.engine_state = "ok";
    s->m.engine_pid = (int)getpid();
    if (pthread_create(&s->thread, NULL, engine_thread, s) != 0) {
        local_destroy(&s->base);
        st_error_set("could not start the engine thread");
        return NULL;
    }
    s->thread_started = 1;
    return &s->base;
}

static void local_destroy(srv_sched *b) {
    local_sched *s = (local_sched *)b;
    pthread_mutex_lock(&s->mu);
    s->stopping = 1;
    /* queued requests end now, running ones on the engine thread (stop_all) */
    while (s->q_len > 0) {
        pending p = s->queue[s->q_head];
        s->q_head = (s->q_head + 1) % s->max_queue;
        s->q_len--;
        srv_event ev = {.kind = SRV_EV_ERROR, .slot = -1, .error = "the server is shutting down"};
        p.fn(p.ctx, &ev);
    }
    pthread_cond_signal(&s->cv);
    pthread_mutex_unlock(&s->mu);
    if (s->thread_started) pthread_join(s->thread, NULL);
    for (int i = 0; i < s->n_slots; i++) {
        if (i) engine_seq_free(s->e, s->slots[i].seq);
        st_free(s->slots[i].top_ids);
        st_free(s->slots[i].top_vals);
    }
    engine_close(s->e);
    pthread_cond_destroy(&s->cv);
    pthread_mutex_destroy(&s->mu);
    st_free(s->slots);
    srv_vocab_free(s->vocab[0]);
    srv_vocab_free(s->vocab[1]);
    st_free(s->queue);
    st_free(s->step_seqs);
    st_free(s->step_toks);
    st_free(s->step_ntok);
    st_free(s->step_slots);
    st_free(s->step_picks);
    st_free(s->step_readers);
    st_free(s->step_chunks);
    st_free(s->map.cells);
    st_free(s->map_cells);
    st_free(s);
}

static int local_submit(srv_sched *b, const srv_request *req, srv_event_fn fn, void *ctx) {
    local_sched *s = (local_sched *)b;
    pthread_mutex_lock(&s->mu);
    if (s->stopping || s->q_len == s->max_queue) {
        pthread_mutex_unlock(&s->mu);
        return -1;
    }
    s->queue[(s->q_head + s->q_len) % s->max_queue] = (pending){req, fn, ctx};
    s->q_len++;
    pthread_cond_signal(&s->cv);
    pthread_mutex_unlock(&s->mu);
    return 0;
}

static void local_metrics(srv_sched *b, sched_metrics *m) {
    local_sched *s = (local_sched *)b;
    pthread_mutex_lock(&s->mu);
    *m = s->m;
    m->queued = s->q_len;
    pthread_mutex_unlock(&s->mu);
}

static int local_expert_map(srv_sched *b, char **cells, int *n_layer, int *n_expert) {
    local_sched *s = (local_sched *)b;
    pthread_mutex_lock(&s->mu);
    const int rc = sched_map_copy(&s->map, cells, n_layer, n_expert);
    pthread_mutex_unlock(&s->mu);
    return rc;
}

static int local_n_ctx(srv_sched *b) { return ((local_sched *)b)->m.n_ctx; }

static void local_wake(srv_sched *b) { (void)b; /* the engine is in this process: always up */ }

static const sched_ops LOCAL_OPS = {local_submit, local_metrics, local_expert_map,
                                    local_n_ctx,  local_wake,    local_destroy};
