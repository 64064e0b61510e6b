/* Reasoning in a model's text (srv_reason.h): a state machine over the
 * answer as it streams, for `<think>` tags and for harmony messages.
 *
 * One parser serves streamed and whole answers (a whole one is fed at
 * once), so a stream's pieces always add up to the non-streamed answer. It
 * holds back only what may still turn into a marker (a prefix of `</think>`,
 * of `<|end|>`, ...) and, inside reasoning, trailing space, which is trimmed
 * when the reasoning ends. An answer that does not take the expected shape
 * (no `<think>` at its start; a harmony header that is no header) is content,
 * byte for byte, so a model that does not reason answers as before. */
#include <string.h>

#include "core/alloc.h"
#include "server/srv_reason.h"

#define HEAD_MAX 512 /* a harmony header longer than this is no header: the rest is plain content */

static const char THINK_OPEN[] = "<think>", THINK_CLOSE[] = "</think>";
static const char H_MESSAGE[] = "<|message|>", H_CHANNEL[] = "<|channel|>", H_START[] = "<|start|>";
/* what ends a harmony message's text: its end, a call's end, the answer's end, or a new message */
static const char *const H_ENDS[] = {"<|end|>", "<|call|>", "<|return|>", H_START};
#define N_H_ENDS 4

typedef enum {
    S_LEAD,    /* think: space before a possible <think> */
    S_RLEAD,   /* think: inside the block, space before its text */
    S_REASON,  /* think: inside the block */
    S_AFTER,   /* think: space after </think> */
    S_CONTENT, /* plain content to the end */
    S_HEAD,    /* harmony: a message header up to <|message|> */
    S_BODY,    /* harmony: a message's text */
} rs_state;

typedef enum { B_REASON, B_CONTENT, B_CALL, B_DROP } body_kind;

struct reason_stream {
    reason_kind kind;
    int calls;
    reason_cb cb;
    void *ctx;
    rs_state st;
    body_kind body;
    int body_lead; /* the harmony body has sent nothing yet: its leading space is dropped (reasoning) */
    char *buf;     /* (cap) text not yet decided */
    size_t len, cap;
};

static int is_space(char c) { return c == ' ' || c == '\n' || c == '\t' || c == '\r'; }

static const char *find(const char *s, size_t n, const char *needle) {
    size_t m = strlen(needle);
    if (n < m) return NULL;
    return memmem(s, n, needle, m);
}

const char *reason_open_text(reason_kind kind) {
    return kind == REASON_THINK ? THINK_OPEN : kind == REASON_HARMONY ? "<|channel|>analysis<|message|>" : NULL;
}

const char *reason_close_text(reason_kind kind) {
    return kind == REASON_THINK ? THINK_CLOSE : kind == REASON_HARMONY ? H_ENDS[0] : NULL;
}

const char *reason_end_text(reason_kind kind) {
    return kind == REASON_THINK     ? THINK_CLOSE
           : kind == REASON_HARMONY ? "<|end|><|start|>assistant<|channel|>final<|message|>"
                                    : NULL;
}

reason_kind reason_kind_of(const char *tmpl, size_t len) {
    return tmpl && find(tmpl, len, H_CHANNEL) ? REASON_HARMONY : REASON_THINK;
}

int reason_prompt_open(const char *prompt, size_t len) {
    while (len && is_space(prompt[len - 1])) len--;
    size_t m = sizeof THINK_OPEN - 1;
    return len >= m && !memcmp(prompt + len - m, THINK_OPEN, m);
}

int reason_prefill_open(int open, const char *prefill, size_t len) {
    size_t k = 0;
    if (!open) { /* a block opens only at the answer's start, as the parser reads it */
        while (k < len && is_space(prefill[k])) k++;
        if (len - k < sizeof THINK_OPEN - 1 || memcmp(prefill + k, THINK_OPEN, sizeof THINK_OPEN - 1)) return 0;
        k += sizeof THINK_OPEN - 1;
    }
    if (find(prefill + k, len - k, THINK_CLOSE)) return 0;
    return k < len ? 2 : 1; /* text after the opening: the continuation is mid-reasoning */
}

reason_stream *reason_stream_new(reason_kind kind, int in_think, int calls, const reason_cb *cb, void *ctx) {
    reason_stream *rs = st_calloc(1, sizeof *rs);
    rs->kind = kind;
    rs->calls = calls;
    rs->cb = *cb;
    rs->ctx = ctx;
    if (kind == REASON_HARMONY) rs->st = S_HEAD;
    else if (kind == REASON_THINK) rs->st = in_think == 2 ? S_REASON : in_think ? S_RLEAD : S_LEAD;
    else rs->st = S_CONTENT;
    return rs;
}

void reason_stream_free(reason_stream *rs) {
    if (!rs) return;
    st_free(rs->buf);
    st_free(rs);
}

/* Drop the first n bytes of the buffer. */
static void consume(reason_stream *rs, size_t n) {
    if (!n) return; /* (the buffer may not exist yet) */
    memmove(rs->buf, rs->buf + n, rs->len - n);
    rs->len -= n;
}

/* Length of the longest suffix of s[0..n) that is a proper prefix of marker. */
static size_t partial(const char *s, size_t n, const char *marker) {
    size_t m = strlen(marker);
    for (size_t k = m - 1 < n ? m - 1 : n; k > 0; k--)
        if (!memcmp(s + n - k, marker, k)) return k;
    return 0;
}

/* s[0..n) may still grow into something that starts with marker. */
static int may_start(const char *s, size_t n, const char *marker) {
    size_t m = strlen(marker);
    return !n || !memcmp(s, marker, n < m ? n : m);
}

/* Reasoning text out, trailing space held back unless final. Returns the bytes sent. */
static size_t put_reasoning(reason_stream *rs, const char *s, size_t n, int final) {
    size_t k = n;
    if (!final)
        while (k && is_space(s[k - 1])) k--;
    else
        while (n && is_space(s[n - 1])) k = --n;
    if (k) rs->cb.reasoning(rs->ctx, s, k);
    return k;
}

/* ---- think tags ---- */

static int step_think(reason_stream *rs, int end) {
    char *s = rs->buf;
    size_t n = rs->len, k = 0;
    switch (rs->st) {
    case S_LEAD:
        while (k < n && is_space(s[k])) k++;
        if (k + sizeof THINK_OPEN - 1 <= n && !memcmp(s + k, THINK_OPEN, sizeof THINK_OPEN - 1)) {
            consume(rs, k + sizeof THINK_OPEN - 1);
            rs->st = S_RLEAD;
            return 1;
        }
        if (!end && (k == n || may_start(s + k, n - k, THINK_OPEN))) return 0; /* not decided yet */
        rs->st = S_CONTENT;
        return 1;
    case S_RLEAD:
    case S_AFTER:
        while (k < n && is_space(s[k])) k++;
        consume(rs, k);
        if (!rs->len) return 0;
        rs->st = rs->st == S_RLEAD ? S_REASON : S_CONTENT;
        return 1;
    case S_REASON: {
        const char *close = find(s, n, THINK_CLOSE);
        if (close) {
            put_reasoning(rs, s, (size_t)(close - s), 1);
            consume(rs, (size_t)(close - s) + sizeof THINK_CLOSE - 1);
            rs->st = S_AFTER;
            return 1;
        }
        size_t hold = end ? 0 : partial(s, n, THINK_CLOSE);
        size_t sent = put_reasoning(rs, s, n - hold, end);
        if (end) sent = n;
        consume(rs, sent);
        return 0;
    }
    default: return 0;
    }
}

/* ---- harmony ---- */

/* The header (without <|message|>) decides what the message's text is. */
static void harmony_header(reason_stream *rs, const char *h, size_t n) {
    const char *to = find(h, n, "to=");
    if (to) {
        const char *r = to + 3, *e = h + n;
        static const char fn[] = "functions.";
        if (e - r > (long)sizeof fn - 1 && !memcmp(r, fn, sizeof fn - 1)) {
            const char *name = r + sizeof fn - 1, *q = name;
            while (q < e && (memchr("_-", *q, 2) || (*q >= '0' && *q <= '9') || ((*q | 32) >= 'a' && (*q | 32) <= 'z')))
                q++;
            if (q > name && rs->calls) {
                rs->cb.content(rs->ctx, "<tool_call>\n{\"name\": \"", 22);
                rs->cb.content(rs->ctx, name, (size_t)(q - name));
                rs->cb.content(rs->ctx, "\", \"arguments\": ", 16);
                rs->body = B_CALL;
                return;
            }
        }
        rs->body = B_DROP; /* a call to a tool nobody offered (or a built-in one): nothing the client asked for */
        return;
    }
    const char *ch = find(h, n, H_CHANNEL);
    const char *c = ch ? ch + sizeof H_CHANNEL - 1 : NULL;
    size_t left = c ? (size_t)(h + n - c) : 0;
    rs->body = c && left >= 8 && !memcmp(c, "analysis", 8) ? B_REASON : B_CONTENT;
}

static int step_harmony(reason_stream *rs, int end) {
    char *s = rs->buf;
    size_t n = rs->len;
    if (rs->st == S_HEAD) {
        const char *m = find(s, n, H_MESSAGE);
        /* the header, or what there is of it (not the beginning of a <|message|> still coming) */
        size_t h = m ? (size_t)(m - s) : end ? n : n - partial(s, n, H_MESSAGE);
        /* a header starts with one of these; anything else is a model not speaking harmony. A prefix of a
         * valid header is valid, so the text cut anywhere gives the same decision */
        int ok = h <= HEAD_MAX && (may_start(s, h, H_CHANNEL) || may_start(s, h, H_START) || may_start(s, h, " to=") ||
                                   may_start(s, h, "<|constrain|>"));
        if (m && ok) {
            harmony_header(rs, s, h);
            consume(rs, h + sizeof H_MESSAGE - 1);
            rs->st = S_BODY;
            rs->body_lead = 1;
            return 1;
        }
        if (ok && !end) return 0;
        if (!ok) {
            rs->st = S_CONTENT;
            return 1;
        }
        rs->len = 0; /* the answer ended inside a header: nothing of it is text */
        return 0;
    }
    /* S_BODY: up to the first end marker */
    const char *hit = NULL;
    size_t mlen = 0;
    int which = -1;
    for (int i = 0; i < N_H_ENDS; i++) {
        const char *p = find(s, n, H_ENDS[i]);
        if (p && (!hit || p < hit)) {
            hit = p;
            mlen = strlen(H_ENDS[i]);
            which = i;
        }
    }
    size_t upto = hit ? (size_t)(hit - s) : n, hold = 0;
    if (!hit && !end)
        for (int i = 0; i < N_H_ENDS; i++) {
            size_t k = partial(s, n, H_ENDS[i]);
            if (k > hold) hold = k;
        }
    size_t avail = upto - hold, sent = avail;
    if (rs->body == B_REASON) {
        size_t lead = 0;
        if (rs->body_lead)
            while (lead < avail && is_space(s[lead])) lead++;
        sent = lead + put_reasoning(rs, s + lead, avail - lead, hit || end);
        if (hit || end) sent = avail;
        if (sent > lead) rs->body_lead = 0;
    } else if (avail && rs->body != B_DROP) rs->cb.content(rs->ctx, s, avail);
    if (hit || end) {
        if (rs->body == B_CALL) rs->cb.content(rs->ctx, "}\n</tool_call>", 14);
        /* <|start|> opens the next header itself: left in place for it */
        consume(rs, upto + (hit && which != N_H_ENDS - 1 ? mlen : 0));
        rs->st = S_HEAD;
        return hit != NULL;
    }
    consume(rs, sent);
    return 0;
}

/* Advance while something can be decided. */
static void run(reason_stream *rs, int end) {
    for (;;) {
        if (rs->st == S_CONTENT) {
            if (rs->len) rs->cb.content(rs->ctx, rs->buf, rs->len);
            rs->len = 0;
            return;
        }
        int more = rs->kind == REASON_HARMONY ? step_harmony(rs, end) : step_think(rs, end);
        if (!more) {
            if (end && rs->st == S_CONTENT) continue; /* decided at the end: flush it */
            return;
        }
    }
}

void reason_stream_feed(reason_stream *rs, const char *text, size_t len) {
    if (!len) return;
    if (rs->len + len > rs->cap) {
        rs->cap = (rs->len + len) * 2;
        rs->buf = st_realloc(rs->buf, rs->cap);
    }
    memcpy(rs->buf + rs->len, text, len);
    rs->len += len;
    run(rs, 0);
}

void reason_stream_end(reason_stream *rs) {
    run(rs, 1);
    /* a header begun with <|start|> that no <|message|> followed, or a lone partial marker */
    rs->len = 0;
}
