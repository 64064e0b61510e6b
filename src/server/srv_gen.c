/* The server's additions to the engine's step-wise generation (srv_sched.h
 * srv_gen_extra_new, engine.h gen_hooks), for requests that want what plain
 * generation does not give: log probabilities of each generated token (and
 * the most likely alternatives), or JSON mode (response_format
 * {"type":"json_object"}), where sampling is constrained so that the answer
 * is always a prefix of a valid JSON object and generation ends as soon as
 * the object is complete.
 *
 * JSON constraint: a pushdown recogniser of JSON text (jfsm below) is fed the
 * bytes of each candidate token; tokens it rejects get logit -inf before the
 * sampler runs. Every vocabulary piece is decoded once per request. Runs of
 * whitespace outside strings are capped (16 bytes) so a model cannot pad
 * forever; the object nests at most JFSM_DEPTH deep. max_tokens can still
 * cut the object short (finish "length"): the text is then incomplete JSON.
 *
 * Log probabilities are the model's own distribution (log-softmax of the raw
 * logits, before temperature, penalties and truncation), as OpenAI reports. */
#include <math.h>
#include <string.h>

#include "core/alloc.h"
#include "core/log.h"
#include "core/timer.h"
#include "server/srv_sched.h"

/* ---- a JSON prefix recogniser ---- */
#define JFSM_DEPTH 64
#define JFSM_MAX_WS 16

enum {
    J_VALUE, J_ARR_FIRST, J_OBJ_FIRST, J_OBJ_KEY, J_COLON, J_AFTER, J_STR, J_ESC, J_HEX,
    J_NUM_MINUS, J_NUM_ZERO, J_NUM_INT, J_NUM_DOT, J_NUM_FRAC, J_NUM_E, J_NUM_ESIGN, J_NUM_EXP, J_LIT, J_DONE
};

typedef struct {
    uint8_t stack[JFSM_DEPTH]; /* '{' or '[' */
    int depth, state, hex, ws, lit_pos, key;
    const char *lit;
} jfsm;

static int jfsm_ws(char c) {
    return c == ' ' || c == '\n' || c == '\t' || c == '\r';
}

static int jfsm_digit(char c) {
    return c >= '0' && c <= '9';
}

static void jfsm_value_done(jfsm *m) {
    m->state = m->depth == 0 ? J_DONE : J_AFTER;
}

/* Start a value with c (state VALUE or ARR_FIRST). 0, or -1 when c cannot start one. */
static int jfsm_begin_value(jfsm *m, char c) {
    if (m->depth == 0 && c != '{') return -1; /* json_object: the top level is an object */
    switch (c) {
    case '{':
    case '[':
        if (m->depth == JFSM_DEPTH) return -1;
        m->stack[m->depth++] = (uint8_t)c;
        m->state = c == '{' ? J_OBJ_FIRST : J_ARR_FIRST;
        return 0;
    case '"': m->state = J_STR; m->key = 0; return 0;
    case '-': m->state = J_NUM_MINUS; return 0;
    case '0': m->state = J_NUM_ZERO; return 0;
    case 't': m->lit = "true"; break;
    case 'f': m->lit = "false"; break;
    case 'n': m->lit = "null"; break;
    default:
        if (c >= '1' && c <= '9') {
            m->state = J_NUM_INT;
            return 0;
        }
        return -1;
    }
    m->state = J_LIT;
    m->lit_pos = 1;
    return 0;
}

static int jfsm_close(jfsm *m, char c) {
    if (m->depth == 0 || m->stack[m->depth - 1] != (c == '}' ? '{' : '[')) return -1;
    m->depth--;
    jfsm_value_done(m);
    return 0;
}

static int jfsm_char(jfsm *m, char c) {
    int s = m->state;
    if (s <= J_AFTER) { /* between tokens: whitespace is allowed, but not without end */
        if (jfsm_ws(c)) return ++m->ws > JFSM_MAX_WS ? -1 : 0;
        m->ws = 0;
    }
    switch (s) {
    case J_VALUE:
        return jfsm_begin_value(m, c);
    case J_ARR_FIRST:
        return c == ']' ? jfsm_close(m, c) : jfsm_begin_value(m, c);
    case J_OBJ_FIRST:
    case J_OBJ_KEY:
        if (c == '}' && s == J_OBJ_FIRST) return jfsm_close(m, c);
        if (c != '"') return -1;
        m->state = J_STR;
        m->key = 1;
        return 0;
    case J_COLON:
        if (c != ':') return -1;
        m->state = J_VALUE;
        return 0;
    case J_AFTER:
        if (c == '}' || c == ']') return jfsm_close(m, c);
        if (c != ',') return -1;
        m->state = m->stack[m->depth - 1] == '{' ? J_OBJ_KEY : J_VALUE;
        return 0;
    case J_STR:
        if (c == '"') {
            if (m->key) m->state = J_COLON;
            else jfsm_value_done(m);
        } else if (c == '\\') m->state = J_ESC;
        else if ((unsigned char)c < 0x20) return -1;
        return 0;
    case J_ESC:
        if (c == 'u') {
            m->state = J_HEX;
            m->hex = 0;
            return 0;
        }
        if (!strchr("\"\\/bfnrt", c) || !c) return -1;
        m->state = J_STR;
        return 0;
    case J_HEX:
        if (!(jfsm_digit(c) || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F'))) return -1;
        if (++m->hex == 4) m->state = J_STR;
        return 0;
    case J_LIT:
        if (c != m->lit[m->lit_pos]) return -1;
        if (!m->lit[++m->lit_pos]) jfsm_value_done(m);
        return 0;
    case J_DONE:
        return -1;
    default: /* numbers */
        break;
    }
    switch (s) {
    case J_NUM_MINUS:
        if (c == '0') m->state = J_NUM_ZERO;
        else if (jfsm_digit(c)) m->state = J_NUM_INT;
        else return -1;
        return 0;
    case J_NUM_INT:
        if (jfsm_digit(c)) return 0;
        /* fall through */
    case J_NUM_ZERO:
        if (c == '.') m->state = J_NUM_DOT;
        else if (c == 'e' || c == 'E') m->state = J_NUM_E;
        else break;
        return 0;
    case J_NUM_DOT:
        if (!jfsm_digit(c)) return -1;
        m->state = J_NUM_FRAC;
        return 0;
    case J_NUM_FRAC:
        if (jfsm_digit(c)) return 0;
        if (c == 'e' || c == 'E') {
            m->state = J_NUM_E;
            return 0;
        }
        break;
    case J_NUM_E:
        if (c == '+' || c == '-') m->state = J_NUM_ESIGN;
        else if (jfsm_digit(c)) m->state = J_NUM_EXP;
        else return -1;
        return 0;
    case J_NUM_ESIGN:
        if (!jfsm_digit(c)) return -1;
        m->state = J_NUM_EXP;
        return 0;
    case J_NUM_EXP:
        if (jfsm_digit(c)) return 0;
        break;
    }
    /* a complete number ends at c, which then belongs to what follows */
    jfsm_value_done(m);
    return jfsm_char(m, c);
}

static int jfsm_feed(jfsm *m, const char *s, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (jfsm_char(m, s[i]) != 0) return -1;
    return 0;
}

int srv_json_prefix_ok(const char *s, size_t n, int *complete) {
    jfsm m = {.state = J_VALUE};
    int rc = jfsm_feed(&m, s, n);
    if (complete) *complete = rc == 0 && m.state == J_DONE;
    return rc;
}

/* ---- the loop ---- */

/* Every token's output bytes, decoded once: piece i is text[off[i]..off[i+1]). */
typedef struct {
    char *text;
    uint32_t *off;
} piece_table;

static void pieces_build(piece_table *pt, const tokenizer *tok, int n_vocab) {
    pt->off = st_malloc(((size_t)n_vocab + 1) * sizeof(uint32_t));
    size_t cap = (size_t)n_vocab * 8, len = 0;
    pt->text = st_malloc(cap);
    char buf[256];
    for (int i = 0; i < n_vocab; i++) {
        pt->off[i] = (uint32_t)len;
        int64_t n = tokenizer_token_type(tok, i) == TOK_TYPE_CONTROL ? 0 : tokenizer_token_to_piece(tok, i, 0, buf, sizeof buf);
        if (n < 0 || n > (int64_t)sizeof buf) n = 0; /* longer pieces are never JSON-allowed: fine */
        if (len + (size_t)n > cap) {
            cap = (len + (size_t)n) * 2;
            pt->text = st_realloc(pt->text, cap);
        }
        memcpy(pt->text + len, buf, (size_t)n);
        len += (size_t)n;
    }
    pt->off[n_vocab] = (uint32_t)len;
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
    piece_table pt;     /* json_mode */
    jfsm js;
    int32_t top_ids[20];
    float top_lp[20];
};

/* JSON mode: only tokens that keep the text a JSON prefix. */
static int json_filter(void *arg, float *logits, int nv) {
    srv_gen_extra *x = arg;
    int any = 0;
    for (int v = 0; v < nv; v++) {
        jfsm m2 = x->js;
        uint32_t a = x->pt.off[v], b = x->pt.off[v + 1];
        if (a == b || jfsm_feed(&m2, x->pt.text + a, b - a) != 0) logits[v] = -INFINITY;
        else any = 1;
    }
    /* none allowed cannot happen with a byte-complete vocabulary; end rather than emit junk */
    return any ? GEN_GO : GEN_END;
}

/* Each sampled token: its TOKEN event (logprobs), the JSON state (json_mode). */
static int on_token(void *arg, int32_t t, const float *raw) {
    srv_gen_extra *x = arg;
    const srv_request *r = x->r;
    int rc = GEN_GO;
    if (r->logprobs) {
        int n_top = r->top_logprobs < 20 ? r->top_logprobs : 20;
        float lp = log_prob(raw, x->n_vocab, t, n_top, x->top_ids, x->top_lp);
        srv_event ev = {.kind = SRV_EV_TOKEN, .slot = x->slot, .token = t, .logprob = lp, .n_top = n_top,
                        .top_ids = x->top_ids, .top_lp = x->top_lp};
        if (x->fn(x->ctx, &ev) != 0) rc = GEN_CANCEL;
    }
    if (r->json_mode) {
        jfsm_feed(&x->js, x->pt.text + x->pt.off[t], x->pt.off[t + 1] - x->pt.off[t]);
        if (x->js.state == J_DONE && rc == GEN_GO) rc = GEN_END; /* the object is complete: done */
    }
    return rc;
}

srv_gen_extra *srv_gen_extra_new(const engine *e, const srv_request *r, srv_event_fn fn, void *ctx, int slot,
                                 gen_hooks *hk) {
    memset(hk, 0, sizeof *hk);
    if (!r->logprobs && !r->json_mode) return NULL;
    srv_gen_extra *x = st_calloc(1, sizeof *x);
    x->r = r;
    x->fn = fn;
    x->ctx = ctx;
    x->slot = slot;
    x->n_vocab = e->m->hp.n_vocab;
    x->js.state = J_VALUE;
    if (r->json_mode) {
        pieces_build(&x->pt, e->tok, x->n_vocab);
        hk->filter = json_filter;
        hk->eog_ok = 1; /* end-of-turn pieces are empty, so the filter masks them: the object's end ends it */
    }
    hk->token = on_token;
    hk->ctx = x;
    return x;
}

void srv_gen_extra_free(srv_gen_extra *x) {
    if (!x) return;
    st_free(x->pt.text);
    st_free(x->pt.off);
    st_free(x);
}
