/* The server's additions to the engine's step-wise generation (engine/srv_sched.h
 * srv_gen_extra_new, engine.h gen_hooks), for requests that want what plain
 * generation does not give: log probabilities of each generated token (and
 * the most likely alternatives), or an answer held to a grammar (srv_grammar.h:
 * response_format json_object / json_schema, the `grammar` field, forced tool
 * calls), where generation ends as soon as the grammar's sentence is whole.
 *
 * Grammar: the sampler asks whether a candidate may come next
 * (sampler_sample_checked: greedy tries candidates in order of their logits,
 * temperature sampling draws first and checks the one token), and only when
 * that cannot decide is the whole vocabulary masked, walking the pieces in
 * byte order so that pieces sharing a prefix share its matching. The
 * vocabulary table is built once per engine process (srv_vocab) and shared by
 * the slots; a request whose answer renders control tokens as text
 * (r->render_special: harmony's markers, DeepSeek's tool-call markers) walks a
 * second table where they have that text, so that a grammar's `<|message|>`
 * or `<｜tool▁sep｜>` is the model's one token, as llama.cpp's grammars see
 * it (and a trigger written as one is seen). End-of-generation tokens are
 * allowed exactly when the grammar's sentence is whole (never by their text).
 * max_tokens can still cut the answer short (finish "length"): the text is
 * then a prefix of a sentence.
 *
 * A grammar may wait: for a trigger (r->grammar_trigger: a tool call's
 * opening, or `</think>` when the prompt opened a reasoning block), the text
 * before it free; and, with r->grammar_think (a model that opens `<think>`
 * itself), the answer's first bytes decide: while they are a prefix of that
 * opening and of a sentence of the grammar, both ways stay open (a token is
 * allowed when either takes it); once the opening is whole the block is free
 * reasoning and the grammar holds what follows the trigger, else the grammar
 * holds the whole answer, as without the option.
 *
 * Log probabilities are the model's own distribution (log-softmax of the raw
 * logits, before temperature, penalties and truncation), as OpenAI reports.
 *
 * The reasoning budget (r->think_end set: Anthropic's thinking.budget_tokens,
 * llama-server's reasoning_budget_tokens): the tokens sampled inside a
 * reasoning block are counted from its opening text (r->think_start, or the
 * start when the prompt opened the block) to its closing text (think_close,
 * when the model ends it); when the count reaches the budget, the tokens of
 * r->think_message (if any) and r->think_end are forced, one per step
 * (every other logit to -inf), and the answer follows as the model goes on.
 * A character split over tokens at that point is finished first (up to three
 * more tokens), so that the reasoning's text stays whole UTF-8, as
 * llama.cpp's reasoning-budget sampler does. A later block gets a fresh
 * budget. The texts are compared as the tokens render with their control
 * tokens' text, so harmony's `<|channel|>analysis<|message|>` is seen. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/alloc.h"
#include "core/log.h"
#include "core/timer.h"
#include "server/srv_grammar.h"
#include "server/engine/srv_sched.h"

/* ---- the vocabulary as the grammar walks it ---- */
struct srv_vocab {
    gmatch_vocab v;
    char *text;    /* every token's output bytes: piece t is text[off[t]..off[t+1]) (control tokens: empty, or
                      their text in the table of requests that render them; end-of-generation tokens: empty) */
    uint32_t *off; /* (n_vocab + 1) */
    int32_t *ids;  /* (n) tokens with a piece, in byte order of their pieces */
    uint32_t *lcp; /* (n) */
    uint8_t *eog;  /* (n_vocab) end-of-generation tokens */
    int n_vocab;
};

static _Thread_local const srv_vocab *t_sort_vocab; /* qsort has no context argument */

static int by_piece(const void *a, const void *b) {
    const srv_vocab *v = t_sort_vocab;
    int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    uint32_t lx = v->off[x + 1] - v->off[x], ly = v->off[y + 1] - v->off[y];
    int c = memcmp(v->text + v->off[x], v->text + v->off[y], lx < ly ? lx : ly);
    return c ? c : lx < ly ? -1 : lx > ly ? 1 : x - y;
}

static srv_vocab *vocab_build(const engine *e, int special) {
    srv_vocab *v = st_calloc(1, sizeof *v);
    const int nv = e->m->hp.n_vocab;
    v->n_vocab = nv;
    v->off = st_malloc(((size_t)nv + 1) * sizeof(uint32_t));
    v->eog = st_calloc((size_t)nv, 1);
    size_t cap = (size_t)nv * 8, len = 0;
    v->text = st_malloc(cap);
    char buf[256];
    int n = 0;
    for (int i = 0; i < nv; i++) {
        v->off[i] = (uint32_t)len;
        v->eog[i] = (uint8_t)tokenizer_is_eog(e->tok, i);
        /* an end of generation is allowed by the grammar's state, never by its text */
        int64_t k = v->eog[i] || (!special && tokenizer_token_type(e->tok, i) == TOK_TYPE_CONTROL)
                        ? 0
                        : tokenizer_token_to_piece(e->tok, i, special, buf, sizeof buf);
        if (k < 0 || k > (int64_t)sizeof buf) k = 0; /* a piece over 256 bytes is never allowed: fine */
        if (len + (size_t)k > cap) {
            cap = (len + (size_t)k) * 2;
            v->text = st_realloc(v->text, cap);
        }
        memcpy(v->text + len, buf, (size_t)k);
        len += (size_t)k;
        n += k > 0;
    }
    v->off[nv] = (uint32_t)len;
    v->ids = st_malloc((size_t)(n ? n : 1) * sizeof(int32_t));
    v->lcp = st_malloc((size_t)(n ? n : 1) * sizeof(uint32_t));
    n = 0;
    for (int i = 0; i < nv; i++)
        if (v->off[i + 1] > v->off[i]) v->ids[n++] = i;
    t_sort_vocab = v;
    qsort(v->ids, (size_t)n, sizeof(int32_t), by_piece);
    for (int i = 0; i < n; i++) {
        uint32_t k = 0;
        if (i) {
            const char *a = v->text + v->off[v->ids[i - 1]], *b = v->text + v->off[v->ids[i]];
            uint32_t la = v->off[v->ids[i - 1] + 1] - v->off[v->ids[i - 1]],
                     lb = v->off[v->ids[i] + 1] - v->off[v->ids[i]];
            while (k < la && k < lb && a[k] == b[k]) k++;
        }
        v->lcp[i] = k;
    }
    v->v = (gmatch_vocab){.n = n, .ids = v->ids, .lcp = v->lcp, .text = v->text, .off = v->off};
    return v;
}

/* The table of r's answer (vocab[1] when it renders control tokens), built on first need. */
static const srv_vocab *vocab_for(const engine *e, const srv_request *r, srv_vocab **vocab) {
    srv_vocab **v = &vocab[r->render_special != 0];
    if (!*v) *v = vocab_build(e, r->render_special != 0);
    return *v;
}

uint8_t *srv_dry_breakers(const engine *e, const srv_request *r, srv_vocab **vocab) {
    if (r->n_dry_breakers == 0) return NULL;
    const srv_vocab *v = vocab_for(e, r, vocab);
    uint8_t *m = st_calloc((size_t)v->n_vocab, 1);
    for (int t = 0; t < v->n_vocab; t++) /* a breaker split over several tokens is not seen (docs/server.md) */
        for (int i = 0; i < r->n_dry_breakers && !m[t]; i++)
            m[t] = memmem(v->text + v->off[t], v->off[t + 1] - v->off[t], r->dry_breakers[i],
                          strlen(r->dry_breakers[i])) != NULL;
    return m;
}

void srv_vocab_free(srv_vocab *v) {
    if (!v) return;
    st_free(v->text);
    st_free(v->off);
    st_free(v->ids);
    st_free(v->lcp);
    st_free(v->eog);
    st_free(v);
}

/* Log-softmax of the logits at the token, and the top n alternatives. */
static float log_prob(const float *l, int nv, int32_t t, int n_top, int32_t *top_ids, float *top_lp) {
    float mx = -INFINITY;
    for (int i = 0; i < nv; i++) mx = l[i] > mx ? l[i] : mx;
    double sum = 0;
    for (int i = 0; i < nv; i++) sum += exp((double)(l[i] - mx));
    float lse = mx + (float)log(sum);
    for (int k = 0; k < n_top; k++) { /* n_top <= 20: repeated max is cheap enough */
        int best = -1;
        for (int i = 0; i < nv; i++) {
            int taken = 0;
            for (int q = 0; q < k && !taken; q++) taken = top_ids[q] == i;
            if (!taken && (best < 0 || l[i] > l[best])) best = i;
        }
        top_ids[k] = best;
        top_lp[k] = l[best] - lse;
    }
    return l[t] - lse;
}

struct srv_gen_extra {
    const srv_request *r;
    srv_event_fn fn;
    void *ctx;
    int slot, n_vocab;
    grammar *g; /* the answer's grammar, or NULL */
    gmatch *m;
    const srv_vocab *voc;
    uint8_t *allowed;  /* (n_vocab) scratch of the full mask */
    int n_tok, n_mask; /* tokens generated, full vocabulary passes */
    gmatch *m0;        /* r->grammar_think: a matcher fed nothing, the grammar's after a reasoning block */
    int deciding;      /* r->grammar_think: the answer so far is a prefix of the opening (dn bytes of it) */
    size_t dn;         /* and of a sentence when g_alive: the next token decides */
    int g_alive;
    int waiting;   /* a trigger has not been seen yet (or the grammar was dropped): nothing is constrained */
    int dropped;   /* the piece with the trigger ran on against the grammar: free to the end */
    char win[128]; /* the answer's last bytes, where the trigger is looked for */
    size_t wn;
    int64_t mask_ns;
    int32_t top_ids[20];
    float top_lp[20];
    /* the reasoning budget (r->think_end set) */
    const tokenizer *tok;
    int th;          /* TH_*: where the answer is with respect to a reasoning block */
    int budget;      /* tokens a block may spend (the request's think_budget) */
    int th_left;     /* tokens the current block may still spend */
    int32_t *forced; /* (n_forced) the tokens of r->think_message and r->think_end */
    int n_forced;
    const int32_t *fq; /* TH_FORCE: what is being forced (forced, or rest), NULL until planned */
    int nfq, th_pos;   /* its length, and the next of them to force */
    int32_t rest[64];  /* the end text's rest, when the answer already ends with its first bytes */
    int utf8_need;     /* continuation bytes the answer's last character still lacks */
    char th_win[96];   /* the answer's last bytes, where the opening and end texts are looked for */
    size_t th_wn;
    int n_think, n_cut; /* tokens spent in reasoning blocks; blocks the budget ended */
};

enum {
    TH_OUT,   /* outside a reasoning block: looking for its opening */
    TH_COUNT, /* inside: each token spends one of th_left */
    TH_WAIT,  /* the budget is spent, a character is unfinished: its tokens come first */
    TH_FORCE, /* writing the end text's tokens */
};

/* Waiting for the trigger: where in piece p[0..n) the trigger would end (the bytes after it belong to the
 * grammar), or -1 when the piece does not complete it. */
static long trigger_end(const srv_gen_extra *x, const char *p, size_t n) {
    const char *trig = x->r->grammar_trigger;
    size_t L = strlen(trig), keep = x->wn < L - 1 ? x->wn : L - 1;
    char buf[sizeof x->win + 256 + 64];
    if (n > 256) n = 256; /* pieces are at most 256 bytes (vocab_build) */
    memcpy(buf, x->win + x->wn - keep, keep);
    memcpy(buf + keep, p, n);
    const char *hit = memmem(buf, keep + n, trig, L);
    return hit ? (long)(hit - buf) + (long)L - (long)keep : -1;
}

/* Deciding: how piece p[0..n) goes on with the opening r->grammar_think: -1 it does not, 0 it is still a
 * prefix of the opening's rest, k > 0 its first k bytes complete the opening. */
static long open_take(const srv_gen_extra *x, const char *p, size_t n) {
    const char *o = x->r->grammar_think + x->dn;
    size_t L = strlen(o);
    if (n == 0) return -1;
    if (n < L) return memcmp(p, o, n) ? -1 : 0;
    return memcmp(p, o, L) ? -1 : (long)L;
}

/* Deciding: may piece p[0..n) come next on the way of a reasoning block? (the bytes after the opening are
 * reasoning, free, unless they complete the trigger too: then what follows it must start a sentence) */
static int open_allow(srv_gen_extra *x, const char *p, size_t n) {
    long k = open_take(x, p, n);
    if (k <= 0 || (size_t)k == n) return k >= 0;
    long e = trigger_end(x, p, n); /* the window holds the opening's earlier bytes */
    return e < 0 || gmatch_try(x->m0, p + e, n - (size_t)e);
}

/* The window keeps the answer's last bytes. */
static void win_push(srv_gen_extra *x, const char *p, size_t n) {
    for (size_t i = 0; i < n; i++) {
        if (x->wn == sizeof x->win) {
            memmove(x->win, x->win + sizeof x->win / 2, sizeof x->win / 2);
            x->wn = sizeof x->win / 2;
        }
        x->win[x->wn++] = p[i];
    }
}

/* May t come next? (a single token: its bytes through the matcher, undone) */
static int grammar_allow(void *arg, int32_t t) {
    srv_gen_extra *x = arg;
    const srv_vocab *v = x->voc;
    if (x->deciding) { /* the way of the grammar or that of a reasoning block */
        uint32_t a = v->off[t], b = v->off[t + 1];
        if (v->eog[t]) return x->g_alive && gmatch_accepting(x->m);
        return open_allow(x, v->text + a, b - a) || (x->g_alive && a < b && gmatch_try(x->m, v->text + a, b - a));
    }
    if (x->waiting) { /* free text, but a piece that completes the trigger must go on as the grammar says */
        if (x->dropped || v->eog[t]) return 1;
        uint32_t a = v->off[t], b = v->off[t + 1];
        long e = trigger_end(x, v->text + a, b - a);
        return e < 0 || gmatch_try(x->m, v->text + a + e, b - a - (size_t)e);
    }
    if (v->eog[t]) return gmatch_accepting(x->m);
    uint32_t a = v->off[t], b = v->off[t + 1];
    return a < b && gmatch_try(x->m, v->text + a, b - a);
}

/* Every token that may not come next to -inf; how many may. */
static int grammar_mask(void *arg, float *logits, int nv) {
    srv_gen_extra *x = arg;
    if (x->waiting) { /* only pieces that complete the trigger can be refused: ask each */
        int n = 0;
        for (int v = 0; v < nv; v++) {
            if (grammar_allow(x, v)) n++;
            else logits[v] = -INFINITY;
        }
        x->n_mask++;
        return n;
    }
    int64_t t0 = st_now_ns();
    int n = x->deciding && !x->g_alive ? (memset(x->allowed, 0, (size_t)nv), 0)
                                       : gmatch_allowed(x->m, &x->voc->v, x->allowed, nv);
    if (n >= 0 && x->deciding) /* and the pieces on the way of a reasoning block */
        for (int v = 0; v < nv; v++) {
            const srv_vocab *voc = x->voc;
            if (!x->allowed[v] && open_allow(x, voc->text + voc->off[v], voc->off[v + 1] - voc->off[v])) {
                x->allowed[v] = 1;
                n++;
            }
        }
    if (n < 0) { /* bounded: a grammar this costly ends the answer here, rather than slow every slot */
        ST_WARN("slot %d: the grammar needs more than %d steps to check the vocabulary once: the answer ends here",
                x->slot, GRAMMAR_MAX_PASS_WORK);
        return 0;
    }
    if ((!x->deciding || x->g_alive) && gmatch_accepting(x->m)) /* the sentence is whole: it may end here */
        for (int v = 0; v < nv; v++)
            if (x->voc->eog[v] && !x->allowed[v]) {
                x->allowed[v] = 1;
                n++;
            }
    for (int v = 0; v < nv; v++)
        if (!x->allowed[v]) logits[v] = -INFINITY;
    x->n_mask++;
    x->mask_ns += st_now_ns() - t0;
    return n;
}

/* ---- the reasoning budget ---- */

/* Does tag end within the window's last bytes and the piece p[0..n)? (the window holds the bytes before p) */
static int tag_in(const srv_gen_extra *x, const char *tag, const char *p, size_t n) {
    size_t L = strlen(tag), keep = x->th_wn < L - 1 ? x->th_wn : L - 1;
    char buf[sizeof x->th_win + 256];
    if (n > 256) n = 256;
    memcpy(buf, x->th_win + x->th_wn - keep, keep);
    memcpy(buf + keep, p, n);
    return memmem(buf, keep + n, tag, L) != NULL;
}

static void th_enter(srv_gen_extra *x) {
    x->th_left = x->budget;
    x->th = x->th_left > 0 ? TH_COUNT : TH_FORCE;
    x->th_pos = 0;
    if (x->th == TH_FORCE) x->n_cut++;
}

/* What forcing writes: the message and the end text; or, when the answer already ends with the end text's
 * first bytes (the model was writing an end text of several tokens, "</" "think" ">", when the budget ran
 * out), only the rest of it, so that the end is written once. Two bytes at least: a lone "<" ending the
 * reasoning ("a <") is more likely its text than the end's start. */
static void th_plan(srv_gen_extra *x) {
    const char *end = x->r->think_end;
    size_t L = strlen(end), k = L - 1 < x->th_wn ? L - 1 : x->th_wn;
    while (k && memcmp(x->th_win + x->th_wn - k, end, k)) k--;
    x->fq = x->forced;
    x->nfq = x->n_forced;
    x->th_pos = 0;
    if (k >= 2) {
        int64_t n = tokenizer_encode(x->tok, end + k, L - k, 0, 1, x->rest, 64);
        if (n > 0 && n <= 64) {
            x->fq = x->rest;
            x->nfq = (int)n;
        }
    }
}

/* A sampled token (forced ones included) moves the budget's state. */
static void th_token(srv_gen_extra *x, int32_t t) {
    const srv_request *r = x->r;
    char p[256];
    int64_t k = tokenizer_token_to_piece(x->tok, t, 1, p, sizeof p);
    size_t n = k < 0 ? 0 : k > (int64_t)sizeof p ? sizeof p : (size_t)k;
    switch (x->th) {
    case TH_OUT:
        if (tag_in(x, r->think_start, p, n)) th_enter(x);
        break;
    case TH_COUNT:
    case TH_WAIT:
        if (tag_in(x, r->think_close, p, n)) { /* the model ended it itself */
            x->th = TH_OUT;
            break;
        }
        x->n_think++;
        if (x->th == TH_COUNT) x->th_left--;
        break;
    case TH_FORCE:
        if (++x->th_pos >= x->nfq) { /* a new opening re-arms it */
            x->th = TH_OUT;
            x->fq = NULL;
        }
        break;
    }
    for (size_t i = 0; i < n; i++) { /* the answer's last character: whole or not */
        unsigned char b = (unsigned char)p[i];
        if ((b & 0xC0) == 0x80) x->utf8_need -= x->utf8_need > 0;
        else x->utf8_need = b >= 0xF0 ? 3 : b >= 0xE0 ? 2 : b >= 0xC0 ? 1 : 0;
    }
    if ((x->th == TH_COUNT || x->th == TH_WAIT) && x->th_left <= 0) {
        x->th = x->utf8_need ? TH_WAIT : TH_FORCE;
        x->th_pos = 0;
        x->n_cut += x->th == TH_FORCE;
    }
    for (size_t i = 0; i < n; i++) { /* the window keeps the answer's last bytes */
        if (x->th_wn == sizeof x->th_win) {
            memmove(x->th_win, x->th_win + sizeof x->th_win / 2, sizeof x->th_win / 2);
            x->th_wn = sizeof x->th_win / 2;
        }
        x->th_win[x->th_wn++] = p[i];
    }
    if (x->th == TH_FORCE && !x->fq) th_plan(x); /* (with this token in the window) */
}

static int th_forcing(const srv_gen_extra *x) { return x->fq && x->th == TH_FORCE && x->th_pos < x->nfq; }

/* Forcing: every logit but the forced token's to -inf. */
static void th_mask(const srv_gen_extra *x, float *logits, int nv) {
    const int32_t f = x->fq[x->th_pos];
    for (int v = 0; v < nv; v++)
        if (v != f) logits[v] = -INFINITY;
}

/* The hooks of a request with a grammar (allow + mask, sampler_sample_checked) and of one without (filter). */
static int hook_allow(void *arg, int32_t t) {
    srv_gen_extra *x = arg;
    if (th_forcing(x)) return t == x->fq[x->th_pos];
    return grammar_allow(x, t);
}

static int hook_mask(void *arg, float *logits, int nv) {
    srv_gen_extra *x = arg;
    if (!th_forcing(x)) return grammar_mask(x, logits, nv);
    th_mask(x, logits, nv);
    return 1;
}

static int hook_filter(void *arg, float *logits, int nv) {
    srv_gen_extra *x = arg;
    if (th_forcing(x)) th_mask(x, logits, nv);
    return GEN_GO;
}

/* Each sampled token: its TOKEN event (logprobs), the budget's and the grammar's state. */
static int on_token(void *arg, int32_t t, const float *raw) {
    srv_gen_extra *x = arg;
    const srv_request *r = x->r;
    int rc = GEN_GO;
    if (r->logprobs) {
        int n_top = r->top_logprobs < 20 ? r->top_logprobs : 20;
        float lp = log_prob(raw, x->n_vocab, t, n_top, x->top_ids, x->top_lp);
        srv_event ev = {.kind = SRV_EV_TOKEN,
                        .slot = x->slot,
                        .token = t,
                        .logprob = lp,
                        .n_top = n_top,
                        .top_ids = x->top_ids,
                        .top_lp = x->top_lp};
        if (x->fn(x->ctx, &ev) != 0) rc = GEN_CANCEL;
    }
    if (x->forced) th_token(x, t);
    if (x->g && x->deciding && !x->voc->eog[t]) { /* this token takes one way, or keeps both open */
        const srv_vocab *v = x->voc;
        const char *p = v->text + v->off[t];
        size_t n = v->off[t + 1] - v->off[t];
        long k = open_take(x, p, n);
        if (k == 0) { /* still a prefix of the opening */
            x->dn += n;
            if (x->g_alive) x->g_alive = gmatch_feed(x->m, p, n) == 0;
            win_push(x, p, n);
            return rc;
        }
        x->deciding = 0;
        if (k > 0) { /* a reasoning block: free until the trigger, the grammar (fed nothing) after it */
            gmatch_free(x->m);
            x->m = x->m0;
            x->m0 = NULL;
            x->waiting = 1;
        } else if (!x->g_alive) { /* neither way took it (never: grammar_allow refused it) */
            x->waiting = x->dropped = 1;
            ST_WARN("slot %d: the answer left both its grammar and the reasoning's opening: left unconstrained",
                    x->slot);
            return rc;
        } /* else the grammar holds the whole answer: below */
    }
    x->deciding = 0;          /* an end of generation decides too (as the grammar's) */
    if (x->g && x->waiting) { /* free text until the trigger; what follows it in the piece is the grammar's */
        const srv_vocab *v = x->voc;
        const char *p = v->text + v->off[t];
        size_t n = v->off[t + 1] - v->off[t];
        if (v->eog[t]) return rc == GEN_GO && !r->ignore_eos ? GEN_END : rc; /* as gen_take would without hooks */
        if (x->dropped) return rc;
        long e = trigger_end(x, p, n);
        if (e >= 0) {
            x->waiting = 0;
            x->n_tok++;
            if (gmatch_feed(x->m, p + e, n - (size_t)e) != 0) { /* grammar_allow said yes: never */
                x->waiting = x->dropped = 1;
                ST_WARN("slot %d: a tool call runs on against its grammar: left unconstrained", x->slot);
            }
            return rc;
        }
        win_push(x, p, n);
        return rc;
    }
    if (x->g) {
        const srv_vocab *v = x->voc;
        x->n_tok++;
        int end = v->eog[t] || gmatch_feed(x->m, v->text + v->off[t], v->off[t + 1] - v->off[t]) != 0 ||
                  gmatch_finished(x->m);
        if (end && rc == GEN_GO) rc = GEN_END; /* the sentence is whole (or, never, the token was refused) */
    }
    return rc;
}

srv_gen_extra *srv_gen_extra_new(const engine *e, const srv_request *r, srv_event_fn fn, void *ctx, int slot,
                                 gen_hooks *hk, srv_vocab **vocab, char *err, size_t errcap) {
    memset(hk, 0, sizeof *hk);
    if (errcap) err[0] = 0;
    if (!r->logprobs && !r->grammar && !r->think_end) return NULL;
    srv_gen_extra *x = st_calloc(1, sizeof *x);
    x->r = r;
    x->fn = fn;
    x->ctx = ctx;
    x->slot = slot;
    x->n_vocab = e->m->hp.n_vocab;
    if (r->grammar) {
        x->g = grammar_parse(r->grammar, r->grammar_len, err, errcap);
        if (!x->g) {
            st_free(x);
            return NULL;
        }
        x->voc = vocab_for(e, r, vocab);
        x->m = gmatch_new(x->g);
        x->allowed = st_malloc((size_t)x->n_vocab);
        x->waiting = r->grammar_trigger != NULL;
        if (r->grammar_think && r->grammar_trigger) { /* a model that may open a reasoning block itself */
            x->waiting = 0;
            x->deciding = x->g_alive = 1;
            x->m0 = gmatch_new(x->g);
        }
        hk->allow = grammar_allow;
        hk->filter = grammar_mask;
        hk->eog_ok = 1; /* the grammar decides when the answer may end */
    }
    if (r->think_end && r->think_start && r->think_close && r->think_budget >= 0) {
        /* the message (llama-server's reasoning_budget_message) and the end, each tokenized on its own as
         * llama.cpp does, their control tokens as such */
        const char *msg = r->think_message ? r->think_message : "";
        const size_t len = strlen(r->think_end), mlen = strlen(msg);
        int64_t n = tokenizer_encode(e->tok, r->think_end, len, 0, 1, NULL, 0);
        int64_t nm = mlen ? tokenizer_encode(e->tok, msg, mlen, 0, 1, NULL, 0) : 0;
        if (n > 0 && n <= 64 && nm >= 0 && nm <= 4096) {
            x->forced = st_malloc((size_t)(nm + n) * sizeof(int32_t));
            x->n_forced = nm ? (int)tokenizer_encode(e->tok, msg, mlen, 0, 1, x->forced, nm) : 0;
            x->n_forced += (int)tokenizer_encode(e->tok, r->think_end, len, 0, 1, x->forced + x->n_forced, n);
            x->tok = e->tok;
            x->budget = r->think_budget;
            if (r->think_open) th_enter(x); /* the prompt opened the block: the answer starts inside it */
            if (x->th == TH_FORCE) th_plan(x);
            if (r->grammar) {
                hk->allow = hook_allow;
                hk->filter = hook_mask;
            } else hk->filter = hook_filter;
        } else
            ST_WARN("slot %d: the reasoning's end text (or its message) does not tokenize into 1..64 tokens (4096): "
                    "no budget",
                    slot);
    }
    hk->token = on_token;
    hk->ctx = x;
    return x;
}

void srv_gen_extra_free(srv_gen_extra *x) {
    if (!x) return;
    if (x->g && (x->n_tok || x->n_mask)) /* (a grammar waiting for a trigger that never came: nothing to say) */
        ST_INFO("slot %d: grammar: %d tokens, %d needed the whole vocabulary checked (%.1f ms in all)", x->slot,
                x->n_tok, x->n_mask, (double)x->mask_ns / 1e6);
    if (x->forced)
        ST_INFO("slot %d: reasoning budget %d: %d tokens of reasoning, %d block(s) ended by the budget", x->slot,
                x->budget, x->n_think, x->n_cut);
    gmatch_free(x->m);
    gmatch_free(x->m0);
    grammar_free(x->g);
    st_free(x->forced);
    st_free(x->allowed);
    st_free(x);
}
