/* The server's own generation loop (srv_sched.h srv_generate), used instead
 * of engine_generate when a request wants what that loop cannot give: log
 * probabilities of each generated token (and the most likely alternatives),
 * or JSON mode (response_format {"type":"json_object"}), where sampling is
 * constrained so that the answer is always a prefix of a valid JSON object
 * and generation ends as soon as the object is complete.
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

/* Keep the end of pending that could begin a stop string. */
static size_t partial_stop(const char *p, size_t len, const srv_request *r) {
    size_t keep = 0;
    for (int k = 0; k < r->n_stop; k++) {
        size_t sl = strlen(r->stop[k]);
        for (size_t n = sl - 1 < len ? sl - 1 : len; n > keep; n--)
            if (!memcmp(p + len - n, r->stop[k], n)) {
                keep = n;
                break;
            }
    }
    return keep;
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

int srv_generate(engine *e, sampler *smp, const srv_request *r, srv_event_fn fn, void *ctx, int slot, int *stopped,
                 gen_stats *st) {
    memset(st, 0, sizeof *st);
    st->finish = "error";
    st->stop_index = -1;
    if (r->n_prompt <= 0 || r->n_prompt >= e->n_ctx) {
        st_error_set("the prompt has %d tokens, outside 1..%d", r->n_prompt, e->n_ctx - 1);
        return -1;
    }
    int64_t t0 = st_now_ns();
    int reused = engine_read_prompt(e, r->prompt, r->n_prompt);
    if (reused < 0) return -1;
    st->n_prompt = r->n_prompt;
    st->n_reused = reused;
    st->n_read = r->n_prompt - reused;
    st->prompt_ms = (double)(st_now_ns() - t0) / 1e6;
    sampler_reset(smp);
    for (int i = 0; i < r->n_prompt; i++) sampler_accept(smp, r->prompt[i]);

    int nv = e->m->hp.n_vocab;
    float *raw = r->logprobs ? st_malloc((size_t)nv * sizeof(float)) : NULL;
    piece_table pt = {0};
    jfsm js = {.state = J_VALUE};
    if (r->json_mode) pieces_build(&pt, e->tok, nv);
    tok_stream *ts = tok_stream_new(e->tok, 0);
    size_t cap = 4096, len = 0;
    char *pending = st_malloc(cap);
    int32_t top_ids[20];
    float top_lp[20];
    int64_t t1 = st_now_ns();
    st->finish = "length";
    int max = r->max_tokens > 0 ? r->max_tokens : e->n_ctx;
    for (int i = 0; i < max; i++) {
        if (raw) memcpy(raw, e->logits, (size_t)nv * sizeof(float));
        if (r->json_mode) { /* only tokens that keep the text a JSON prefix */
            int any = 0;
            for (int v = 0; v < nv; v++) {
                jfsm m2 = js;
                uint32_t a = pt.off[v], b = pt.off[v + 1];
                if (a == b || jfsm_feed(&m2, pt.text + a, b - a) != 0) e->logits[v] = -INFINITY;
                else any = 1;
            }
            if (!any) { /* cannot happen with a byte-complete vocabulary; end rather than emit junk */
                st->finish = "stop";
                break;
            }
        }
        int32_t t = sampler_sample(smp, e->logits);
        if (!r->json_mode && tokenizer_is_eog(e->tok, t)) {
            st->finish = "stop";
            break;
        }
        sampler_accept(smp, t);
        st->n_gen++;
        if (raw) {
            int n_top = r->top_logprobs < 20 ? r->top_logprobs : 20;
            float lp = log_prob(raw, nv, t, n_top, top_ids, top_lp);
            srv_event ev = {.kind = SRV_EV_TOKEN, .slot = slot, .token = t, .logprob = lp, .n_top = n_top,
                            .top_ids = top_ids, .top_lp = top_lp};
            if (fn(ctx, &ev) != 0) *stopped = 1;
        }
        if (r->json_mode) jfsm_feed(&js, pt.text + pt.off[t], pt.off[t + 1] - pt.off[t]);
        const char *piece;
        size_t plen;
        tok_stream_push(ts, t, &piece, &plen);
        if (len + plen + 1 > cap) {
            cap = (len + plen + 1) * 2;
            pending = st_realloc(pending, cap);
        }
        memcpy(pending + len, piece, plen);
        len += plen;
        int hit_stop = 0;
        for (int k = 0; k < r->n_stop && !hit_stop; k++) {
            pending[len] = 0;
            char *hit = strstr(pending, r->stop[k]);
            if (hit) {
                len = (size_t)(hit - pending);
                hit_stop = 1;
                st->stop_index = k;
            }
        }
        size_t keep = hit_stop ? 0 : partial_stop(pending, len, r);
        if (len - keep > 0) {
            srv_event ev = {.kind = SRV_EV_TEXT, .slot = slot, .text = pending, .len = len - keep};
            if (fn(ctx, &ev) != 0) *stopped = 1;
        }
        memmove(pending, pending + len - keep, keep);
        len = keep;
        if (hit_stop || (r->json_mode && js.state == J_DONE)) { /* the object is complete: done */
            st->finish = "stop";
            break;
        }
        if (*stopped || i + 1 == max || e->n_past >= e->n_ctx) break;
        if (engine_eval(e, &t, 1) != 0) break;
    }
    if (len) {
        srv_event ev = {.kind = SRV_EV_TEXT, .slot = slot, .text = pending, .len = len};
        fn(ctx, &ev);
    }
    tok_stream_free(ts);
    st_free(pending);
    st_free(raw);
    st_free(pt.text);
    st_free(pt.off);
    st->gen_ms = (double)(st_now_ns() - t1) / 1e6;
    return 0;
}
