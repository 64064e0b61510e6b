/* Step-wise generation (engine.h gen_state): one request on one sequence,
 * advanced a token at a time by whoever evaluates the tokens, so that the
 * CLI (engine_generate, below) and the server's scheduler (one batched
 * decode step for every slot) share the same sampling, stop-string and
 * streaming-text code.
 *
 * Text is released as it becomes final: the streaming detokenizer gives
 * whole UTF-8 characters, and the tail that could still begin a stop string
 * is held back until it either completes one (generation ends, the stop
 * string is not sent) or cannot any more. */
#include <string.h>

#include "core/alloc.h"
#include "core/log.h"
#include "core/timer.h"
#include "engine/draft.h"
#include "engine/engine.h"
#include "engine/kv_cache.h"
#include "engine/moe_lanes.h"

struct gen_state {
    engine *e;
    engine_seq *s;
    sampler *smp;
    gen_params gp;
    gen_hooks hk; /* all NULL when none */
    gen_text_fn fn;
    void *ctx;
    tok_stream *ts;
    char *pending; /* (cap) text not yet released: may begin a stop string */
    size_t len, cap;
    float *raw; /* (n_vocab) the logits before the filter, when both hooks are set */
    int max, n_gen, cancelled, finished, stop_index;
    const char *finish;
    int64_t t0;
    /* gen_next_drafted: the verified tokens and their logits, (draft_cap) rows */
    int32_t *draft_toks;
    float *draft_logits;
    int draft_cap, drafts_accepted, drafts_total;
    /* how much to draft (gen_draft): at most draft_lim tokens (0: not set yet),
     * none for the next draft_pause steps; draft_backoff: the last pause */
    int draft_lim, draft_pause, draft_backoff;
};

gen_state *gen_begin(engine *e, engine_seq *s, sampler *smp, const int32_t *prompt, int n_prompt, const gen_params *gp,
                     const gen_hooks *hooks, gen_text_fn fn, void *ctx) {
    gen_state *g = st_calloc(1, sizeof *g);
    g->e = e;
    g->s = s;
    g->smp = smp;
    g->gp = *gp;
    if (hooks) g->hk = *hooks;
    g->fn = fn;
    g->ctx = ctx;
    g->ts = tok_stream_new(e->tok, gp->render_special);
    g->cap = 4096;
    g->pending = st_malloc(g->cap);
    if (g->hk.filter && g->hk.token) g->raw = st_malloc((size_t)e->m->hp.n_vocab * sizeof(float));
    g->max = gp->max_tokens > 0 ? gp->max_tokens : e->n_ctx;
    g->finish = "length";
    g->stop_index = -1;
    sampler_reset(smp);
    for (int i = 0; i < n_prompt; i++) sampler_accept(smp, prompt[i]);
    g->t0 = st_now_ns();
    return g;
}

/* Length of the longest suffix of s[0..n) that is a proper prefix of a stop string. */
static size_t partial_stop(const char *s, size_t n, const gen_params *gp) {
    size_t best = 0;
    for (int i = 0; i < gp->n_stop; i++) {
        size_t L = strlen(gp->stop[i]);
        for (size_t k = L > n ? n : L - 1; k > best; k--)
            if (!memcmp(s + n - k, gp->stop[i], k)) {
                best = k;
                break;
            }
    }
    return best;
}

/* Append the token's text, end at a complete stop string, release what can
 * no longer begin one. Returns 1 when a stop string ended generation. */
static int push_text(gen_state *g, int32_t t) {
    const char *piece;
    size_t plen;
    tok_stream_push(g->ts, t, &piece, &plen);
    if (g->len + plen + 1 > g->cap) {
        g->cap = (g->len + plen + 1) * 2;
        g->pending = st_realloc(g->pending, g->cap);
    }
    memcpy(g->pending + g->len, piece, plen);
    g->len += plen;
    int stopped = 0;
    g->pending[g->len] = 0;
    for (int k = 0; k < g->gp.n_stop && !stopped; k++) {
        char *hit = strstr(g->pending, g->gp.stop[k]);
        if (hit) {
            g->len = (size_t)(hit - g->pending);
            stopped = 1;
            g->stop_index = k;
        }
    }
    size_t keep = stopped ? 0 : partial_stop(g->pending, g->len, &g->gp);
    if (g->len - keep > 0 && g->fn(g->ctx, g->pending, g->len - keep) != 0) g->cancelled = 1;
    memmove(g->pending, g->pending + g->len - keep, keep);
    g->len = keep;
    return stopped;
}

/* What follows the draw of tok: end of generation, the hooks, the text. */
static int gen_take(gen_state *g, int32_t tok, const float *raw, int32_t *t) {
    const int eog = !g->gp.ignore_eos && tokenizer_is_eog(g->e->tok, tok);
    if (eog && !g->hk.eog_ok) {
        g->finish = "stop";
        return 1;
    }
    sampler_accept(g->smp, tok);
    g->n_gen++;
    int hook = g->hk.token ? g->hk.token(g->hk.ctx, tok, raw) : GEN_GO;
    if (hook == GEN_CANCEL) g->cancelled = 1;
    /* an end of generation the hook ends on adds no text, as without the
     * hook (with control tokens rendered, its text would end the answer) */
    if ((eog && hook == GEN_END) || push_text(g, tok) || hook == GEN_END) {
        g->finish = "stop";
        return 1;
    }
    if (g->cancelled || g->n_gen == g->max) return 1;
    if (g->s->n_past >= g->e->n_ctx) return 1; /* context full: "length" */
    g->finished = 0;
    *t = tok;
    return 0;
}

int gen_next(gen_state *g, int32_t *t) {
    if (g->finished) return 1;
    g->finished = 1; /* until shown otherwise below */
    float *logits = g->s->logits;
    int nv = g->e->m->hp.n_vocab;
    const float *raw = logits;
    if (g->hk.filter) {
        if (g->raw) {
            memcpy(g->raw, logits, (size_t)nv * sizeof(float));
            raw = g->raw;
        }
        if (g->hk.allow) {
            int32_t tok = sampler_sample_checked(g->smp, logits, g->hk.allow, g->hk.filter, g->hk.ctx);
            if (tok < 0) { /* the constraint allows no token at all */
                g->finish = "stop";
                return 1;
            }
            return gen_take(g, tok, raw, t);
        }
        if (g->hk.filter(g->hk.ctx, logits, nv) != GEN_GO) {
            g->finish = "stop";
            return 1;
        }
    }
    return gen_take(g, sampler_sample(g->smp, logits), raw, t);
}

int gen_next_top(gen_state *g, const int32_t *ids, const float *vals, int k, int32_t *t) {
    ST_ASSERT(!g->hk.filter && !g->hk.token && k >= 1);
    if (g->finished) return 1;
    g->finished = 1;
    if (ids[0] < 0) { /* no candidate at all (every logit NaN) */
        st_error_set("the model gave no finite logit");
        g->finish = "error";
        return 1;
    }
    int n = 0; /* fewer than k real candidates: a vocabulary smaller than k */
    while (n < k && ids[n] >= 0) n++;
    return gen_take(g, sampler_sample_top(g->smp, ids, vals, n), NULL, t);
}

int gen_next_drawn(gen_state *g, int32_t tok, int32_t *t) {
    ST_ASSERT(!g->hk.filter && !g->hk.token && tok >= 0);
    if (g->finished) return 1;
    g->finished = 1;
    return gen_take(g, tok, NULL, t);
}

int gen_cancelled(const gen_state *g) { return g->cancelled; }

void gen_end(gen_state *g, gen_stats *st) {
    /* bytes still held back are either a possible stop string's beginning
     * (final now) or an incomplete UTF-8 character cut off by the end, which
     * the detokenizer never released: dropped, never sent as U+FFFD */
    if (g->len) g->fn(g->ctx, g->pending, g->len);
    st->n_gen = g->n_gen;
    st->gen_ms = (double)(st_now_ns() - g->t0) / 1e6;
    st->finish = g->finish;
    st->stop_index = g->stop_index;
    st->drafts_accepted = g->drafts_accepted;
    st->drafts_total = g->drafts_total;
    tok_stream_free(g->ts);
    st_free(g->draft_toks);
    st_free(g->draft_logits);
    st_free(g->pending);
    st_free(g->raw);
    st_free(g);
}

/* The expert lanes' pairs since `before`, into st (nothing without lanes). */
static void lanes_stats(gen_stats *st, const moe_lane_stats *ls, const moe_lane_stats *before) {
    if (!ls) return;
    moe_lane_stats d = {0};
    moe_lane_stats_add(&d, ls, before);
    st->lanes = 1;
    st->pairs_dev = d.pairs_dev;
    st->pairs_cpu = d.pairs_cpu;
    st->pairs_pcie = d.pairs_pcie;
    st->bytes_ssd = d.bytes_ssd;
    st->ns_ssd = d.ns_ssd;
}

/* A verify pass costs more the more rows it has (on a CPU nearly a token's
 * step per row for a MoE model, whose rows route to different experts), so
 * drafts that keep failing are cut back: a draft rejected whole halves the
 * next one's length and pauses drafting for 1, 2, 4 .. 16 steps (doubling
 * while they keep failing); a draft accepted whole doubles the length again,
 * up to draft_n. Which tokens are drafted changes, never which are sampled. */
static void draft_adapt(gen_state *g, int nd, int kept) {
    if (nd <= 0) return;
    if (kept == nd) {
        g->draft_lim *= 2;
        g->draft_backoff = 0;
    } else if (kept == 0) {
        g->draft_lim = g->draft_lim > 1 ? g->draft_lim / 2 : 1;
        g->draft_backoff = g->draft_backoff ? (g->draft_backoff < 16 ? 2 * g->draft_backoff : 16) : 1;
        g->draft_pause = g->draft_backoff;
    } else {
        g->draft_backoff = 0;
    }
}

/* Speculative decoding with prompt-lookup or MTP drafts (engine.h gen_next_drafted,
 * and its two halves gen_draft, gen_verify around a batched step).
 * One call evaluates the pending token t and up to draft_n drafted tokens
 * after it in one batched pass with every position's logits, then samples
 * position by position exactly as gen_next does (same sampler, same text
 * and stop handling): a drafted token is kept while it is what was sampled
 * there, and the first mismatch becomes the next pending token; the cache
 * forgets the rejected rows. So the output is the plain decoder's, token
 * for token (up to the rounding by which a batched product differs from a
 * one-token one: docs/speculative.md), and a call yields 1 to draft_n + 1
 * tokens. */
int gen_draft(gen_state *g, int32_t t, int draft_n, int32_t *toks) {
    engine *e = g->e;
    engine_seq *s = g->s;
    const int base = s->n_past;
    s->hist[base] = t; /* the draft continues the history with t appended */
    toks[0] = t;
    if (g->draft_pause > 0) {
        g->draft_pause--;
        return 1;
    }
    if (g->draft_lim <= 0 || g->draft_lim > draft_n) g->draft_lim = draft_n;
    /* no more than the context holds, nor more than the tokens still to generate after this one */
    const int room = e->n_ctx - base - 1, left = g->max - g->n_gen - 1;
    int nd = g->draft_lim < room ? g->draft_lim : room;
    if (nd > left) nd = left;
    if (nd <= 0) nd = 0;
    else if (g->gp.draft_mtp) nd = engine_seq_draft_mtp(e, s, t, nd, g->smp, toks + 1);
    else nd = draft_lookup(s->hist, base + 1, nd, toks + 1);
    return nd + 1;
}

int gen_verify(gen_state *g, int32_t *t, const int32_t *toks, int n, const float *logits) {
    engine_seq *s = g->s;
    const int nv = g->e->m->hp.n_vocab, nd = n - 1, base = s->n_past - n;
    ST_ASSERT(n >= 1 && base >= 0 && toks[0] == *t);
    g->drafts_total += nd;
    int i = 0, done = 0;
    for (;; i++) {
        memcpy(s->logits, logits + (size_t)i * nv, (size_t)nv * sizeof(float));
        s->n_past = base + 1 + i; /* as the plain decoder would stand here (its context-full check) */
        int32_t next;
        if (gen_next(g, &next) != 0) {
            done = 1;
            break;
        }
        if (i < nd && next == toks[i + 1]) continue; /* the draft was right: its row is already in */
        *t = next;                                   /* the first token the draft did not have */
        break;
    }
    const int kept = i < nd ? i : nd;
    g->drafts_accepted += kept;
    draft_adapt(g, nd, kept);
    s->n_past = base + n;
    engine_seq_truncate(s, base + 1 + kept); /* a recurrent state replays the kept part of the pass */
    return done;
}

int gen_next_drafted(gen_state *g, int32_t *t, int draft_n) {
    engine *e = g->e;
    const int nv = e->m->hp.n_vocab;
    if (g->draft_cap < draft_n + 1) {
        g->draft_cap = draft_n + 1;
        g->draft_toks = st_realloc(g->draft_toks, (size_t)g->draft_cap * sizeof(int32_t));
        g->draft_logits = st_realloc(g->draft_logits, (size_t)g->draft_cap * nv * sizeof(float));
    }
    const int n = gen_draft(g, *t, draft_n, g->draft_toks);
    if (engine_seq_eval_all(e, g->s, g->draft_toks, n, g->draft_logits) != 0) {
        g->finish = "error"; /* st_error says why */
        return 1;
    }
    return gen_verify(g, t, g->draft_toks, n, g->draft_logits);
}

int engine_generate(engine *e, sampler *s, const int32_t *prompt, int n_prompt, const gen_params *gp, gen_text_fn fn,
                    void *ctx, gen_stats *st) {
    memset(st, 0, sizeof *st);
    st->finish = "error";
    st->stop_index = -1;
    if (n_prompt <= 0) {
        st_error_set("the prompt is empty");
        return -1;
    }
    if (n_prompt >= e->n_ctx) {
        st_error_set("the prompt has %d tokens, beyond the context of %d tokens", n_prompt, e->n_ctx);
        return -1;
    }
    int64_t t0 = st_now_ns();
    int reused = engine_read_prompt(e, prompt, n_prompt);
    if (reused < 0) return -1;
    st->n_prompt = n_prompt;
    st->n_reused = reused;
    st->n_read = n_prompt - reused;
    st->prompt_ms = (double)(st_now_ns() - t0) / 1e6;
    gen_state *g = gen_begin(e, &e->seq, s, prompt, n_prompt, gp, NULL, fn, ctx);
    const moe_lane_stats *ls = moe_lanes_stats(e->be);
    const moe_lane_stats before = ls ? *ls : (moe_lane_stats){0};
    if (gp->draft_n > 0 && engine_drafts_ok(e)) {
        int32_t t;
        if (gen_next(g, &t) == 0)
            while (gen_next_drafted(g, &t, gp->draft_n) == 0) {
            }
        gen_end(g, st);
        lanes_stats(st, ls, &before);
        return 0;
    }
    /* decode steps sample from the backend's top-k candidates when the
     * sampler needs no more (on a GPU: k pairs copied, not the vocabulary) */
    const int k = e->be->top_k ? sampler_candidates(s, e->be->top_k_max) : 0;
    int32_t t, *ids = k ? st_malloc((size_t)k * sizeof(int32_t)) : NULL;
    float *vals = k ? st_malloc((size_t)k * sizeof(float)) : NULL;
    /* or the backend draws from every logit itself (a temperature-only chain: one token copied) */
    const float dt = !k && e->be->draw ? sampler_device_temp(s) : 0.0f;
    int top = 0;        /* the next draw is from ids/vals (else from the sequence's logits) */
    int32_t drawn = -1; /* or it was drawn by the backend */
    while ((top          ? gen_next_top(g, ids, vals, k, &t)
            : drawn >= 0 ? gen_next_drawn(g, drawn, &t)
                         : gen_next(g, &t)) == 0) {
        if (k) {
            const int rc = engine_seq_eval_top_k(e, &e->seq, t, k, ids, vals);
            if (rc < 0) break;
            top = rc == 0;
        } else if (dt > 0.0f) {
            const int rc = engine_seq_eval_draw(e, &e->seq, t, 1.0f / dt, sampler_draw_unit(s), &drawn);
            if (rc < 0) break;
            if (rc) drawn = -1; /* a NaN logit: the host draws over them (taking a fresh number) */
        } else if (engine_eval(e, &t, 1) != 0) {
            break;
        }
    }
    st_free(ids);
    st_free(vals);
    gen_end(g, st);
    lanes_stats(st, ls, &before);
    return 0;
}
