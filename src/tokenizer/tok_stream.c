/* Streaming detokenizer: ids in one at a time, whole UTF-8 characters out.
 *
 * A token can stop in the middle of a character (byte-level BPE splits rare
 * characters into byte tokens; SentencePiece falls back to <0xXX>). Sending
 * such bytes to a client as they come would put broken text on the wire, so
 * the trailing bytes of an unfinished character are held back until the next
 * token completes them. Bytes that can never become a character (a stray
 * continuation byte, a sequence broken by the next token) become U+FFFD, one
 * per maximal broken sequence, as decoders that replace errors do.
 */
#include <string.h>

#include "../core/alloc.h"
#include "../core/log.h"
#include "tok_internal.h"

struct tok_stream {
    const tokenizer *t;
    int render_special;
    int strip;       /* SentencePiece space prefix: drop the first text's leading space */
    uint8_t held[4]; /* bytes of an unfinished character */
    size_t n_held;
    char *buf; /* held bytes + the new piece, rewritten in place */
    size_t cap;
};

tok_stream *tok_stream_new(const tokenizer *t, int render_special) {
    tok_stream *s = st_calloc(1, sizeof(*s));
    s->t = t;
    s->render_special = render_special;
    tok_stream_reset(s);
    return s;
}

void tok_stream_free(tok_stream *s) {
    if (!s) return;
    st_free(s->buf);
    st_free(s);
}

void tok_stream_reset(tok_stream *s) {
    s->n_held = 0;
    s->strip = s->t->model == TOK_MODEL_SPM && s->t->add_space_prefix;
}

static void reserve(tok_stream *s, size_t n) {
    if (n > s->cap) {
        s->cap = n < 64 ? 64 : 2 * n;
        s->buf = st_realloc(s->buf, s->cap);
    }
}

int tok_stream_push(tok_stream *s, int32_t id, const char **out, size_t *len) {
    *out = "";
    *len = 0;
    const tokenizer *t = s->t;
    int64_t pl = tokenizer_token_to_piece(t, id, s->render_special, NULL, 0);
    if (pl < 0) {
        st_error_set("tok_stream_push: token id %d is out of range (%d tokens)", id, t->n_vocab);
        return -1;
    }
    uint8_t ty = t->types[id];
    int is_text = !(ty == TOK_TYPE_CONTROL || ty == TOK_TYPE_UNKNOWN || ty == TOK_TYPE_UNUSED);
    /* Worst case every input byte becomes a 3-byte U+FFFD. */
    size_t in_n = s->n_held + (size_t)pl;
    reserve(s, 4 * in_n + 4);
    char *in = s->buf + 3 * in_n + 4; /* input staged past the output's worst case */
    memcpy(in, s->held, s->n_held);
    tokenizer_token_to_piece(t, id, s->render_special, in + s->n_held, (size_t)pl);
    if (is_text && s->strip && pl > 0 && in[s->n_held] == ' ') {
        memmove(in + s->n_held, in + s->n_held + 1, (size_t)pl - 1);
        in_n--;
    }
    if (is_text) s->strip = 0;
    s->n_held = 0;

    const uint8_t *p = (const uint8_t *)in;
    size_t i = 0, o = 0;
    while (i < in_n) {
        int c = tok_utf8_char(p + i, in_n - i);
        if (c > 0) {
            memmove(s->buf + o, p + i, (size_t)c);
            o += (size_t)c;
            i += (size_t)c;
        } else if (c < 0) {
            /* unfinished: keep for the next token */
            memcpy(s->held, p + i, in_n - i);
            s->n_held = in_n - i;
            break;
        } else {
            /* broken: the longest prefix that was still a valid start is one error */
            size_t k = 1;
            while (k < 4 && i + k < in_n && tok_utf8_char(p + i, k + 1) < 0) k++;
            memcpy(s->buf + o, "\xef\xbf\xbd", 3);
            o += 3;
            i += k;
        }
    }
    *out = s->buf;
    *len = o;
    return 0;
}

void tok_stream_flush(tok_stream *s, const char **out, size_t *len) {
    *out = "";
    *len = 0;
    if (s->n_held == 0) return;
    reserve(s, 4);
    memcpy(s->buf, "\xef\xbf\xbd", 3);
    s->n_held = 0;
    *out = s->buf;
    *len = 3;
}
