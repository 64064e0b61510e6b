/* SentencePiece BPE (tokenizer.ggml.model = "llama": Llama 1/2, Gemma).
 *
 * Spaces are spelled U+2581 ("▁") in the vocabulary, so the text is first
 * rewritten that way (with one in front when the model adds a space prefix).
 * Encoding starts from one symbol per UTF-8 character and repeatedly joins
 * the adjacent pair whose concatenation is the vocabulary piece with the
 * highest score (leftmost on ties), the rule SentencePiece's BPE model uses.
 * Only normal pieces take part: control tokens must not appear from plain
 * text. A character left with no piece of its own falls back to its UTF-8
 * bytes as <0xXX> tokens.
 *
 * Symbols are contiguous in the rewritten text, so a candidate pair is just a
 * substring: looking it up needs no copy.
 */
#include <string.h>

#include "../core/alloc.h"
#include "../core/log.h"
#include "tok_internal.h"

static int hexval(char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    return -1;
}

int tok_spm_init(tokenizer *t) {
    for (int b = 0; b < 256; b++) t->byte_tok[b] = -1;
    /* Pieces never grow: "▁" (3 bytes) becomes ' ', "<0xXX>" (6) one byte. */
    t->piece_blob = st_malloc(t->text_off[t->n_vocab] + 1);
    t->piece_off = st_malloc(((size_t)t->n_vocab + 1) * sizeof(uint64_t));
    uint64_t off = 0;
    for (int32_t id = 0; id < t->n_vocab; id++) {
        size_t n;
        const char *s = tok_text(t, id, &n);
        t->piece_off[id] = off;
        if (t->types[id] == TOK_TYPE_BYTE && n == 6 && !memcmp(s, "<0x", 3) && s[5] == '>' && hexval(s[3]) >= 0 &&
            hexval(s[4]) >= 0) {
            int b = hexval(s[3]) * 16 + hexval(s[4]);
            t->piece_blob[off++] = (char)b;
            if (t->byte_tok[b] < 0) t->byte_tok[b] = id;
            continue;
        }
        if (t->types[id] == TOK_TYPE_CONTROL) {
            memcpy(t->piece_blob + off, s, n);
            off += n;
            continue;
        }
        for (size_t i = 0; i < n;) {
            if (i + 3 <= n && !memcmp(s + i, "\xe2\x96\x81", 3)) {
                t->piece_blob[off++] = ' ';
                i += 3;
            } else {
                t->piece_blob[off++] = s[i++];
            }
        }
    }
    t->piece_off[t->n_vocab] = off;
    return 0;
}

typedef struct {
    uint32_t start, len;
    int32_t prev, next;
} spm_sym;

typedef struct {
    float score;
    int32_t left, right;
    uint32_t size;
} spm_cand;

static int cand_better(const spm_cand *a, const spm_cand *b) {
    return a->score > b->score || (a->score == b->score && a->left < b->left);
}

typedef struct {
    spm_cand *v;
    size_t n, cap;
} spm_heap;

static void heap_push(spm_heap *h, spm_cand c) {
    if (h->n == h->cap) {
        h->cap = h->cap ? 2 * h->cap : 64;
        h->v = st_realloc(h->v, h->cap * sizeof(spm_cand));
    }
    size_t i = h->n++;
    while (i > 0) {
        size_t p = (i - 1) / 2;
        if (!cand_better(&c, &h->v[p])) break;
        h->v[i] = h->v[p];
        i = p;
    }
    h->v[i] = c;
}

static spm_cand heap_pop(spm_heap *h) {
    spm_cand top = h->v[0], last = h->v[--h->n];
    size_t i = 0;
    for (;;) {
        size_t l = 2 * i + 1, r = l + 1, m = i;
        const spm_cand *best = &last;
        if (l < h->n && cand_better(&h->v[l], best)) {
            m = l;
            best = &h->v[l];
        }
        if (r < h->n && cand_better(&h->v[r], best)) m = r;
        if (m == i) break;
        h->v[i] = h->v[m];
        i = m;
    }
    if (h->n > 0) h->v[i] = last;
    return top;
}

static void try_pair(const tokenizer *t, const char *text, const spm_sym *sym, int32_t l, int32_t r, spm_heap *h) {
    if (l < 0 || r < 0) return;
    uint32_t size = sym[l].len + sym[r].len;
    int32_t id = tok_strmap_get(&t->text_map, text + sym[l].start, size);
    if (id < 0 || t->types[id] != TOK_TYPE_NORMAL) return;
    spm_cand c = {t->scores[id], l, r, size};
    heap_push(h, c);
}

int tok_spm_encode(const tokenizer *t, const char *s, size_t n, int space_prefix, tok_ids *out) {
    /* rewrite: ' ' -> U+2581, optional leading one */
    size_t spaces = 0;
    for (size_t i = 0; i < n; i++) spaces += s[i] == ' ';
    size_t tn = (space_prefix ? 3 : 0) + n + 2 * spaces; /* ' ' (1 byte) -> U+2581 (3) */
    char *text = st_malloc(tn + 1);
    size_t o = 0;
    if (space_prefix) {
        memcpy(text, "\xe2\x96\x81", 3);
        o = 3;
    }
    for (size_t i = 0; i < n; i++) {
        if (s[i] == ' ') {
            memcpy(text + o, "\xe2\x96\x81", 3);
            o += 3;
        } else {
            text[o++] = s[i];
        }
    }
    ST_ASSERT(o == tn);

    spm_sym *sym = st_malloc((tn ? tn : 1) * sizeof(spm_sym));
    int32_t ns = 0;
    for (size_t i = 0; i < tn;) {
        int l = tok_utf8_char((const uint8_t *)text + i, tn - i);
        ST_ASSERT(l > 0); /* the encoder validated the text */
        sym[ns].start = (uint32_t)i;
        sym[ns].len = (uint32_t)l;
        sym[ns].prev = ns - 1;
        sym[ns].next = i + (size_t)l < tn ? ns + 1 : -1;
        ns++;
        i += (size_t)l;
    }

    spm_heap h = {0};
    for (int32_t i = 0; i + 1 < ns; i++) try_pair(t, text, sym, i, i + 1, &h);
    while (h.n > 0) {
        spm_cand c = heap_pop(&h);
        spm_sym *L = &sym[c.left], *R = &sym[c.right];
        /* stale: a side was merged away (len 0) or grew since this pair was queued */
        if (L->len == 0 || R->len == 0 || L->next != c.right || L->len + R->len != c.size) continue;
        L->len += R->len;
        R->len = 0;
        L->next = R->next;
        if (R->next >= 0) sym[R->next].prev = c.left;
        try_pair(t, text, sym, L->prev, c.left, &h);
        try_pair(t, text, sym, c.left, L->next, &h);
    }

    for (int32_t i = ns ? 0 : -1; i >= 0; i = sym[i].next) {
        int32_t id = tok_strmap_get(&t->text_map, text + sym[i].start, sym[i].len);
        if (id >= 0 && (t->types[id] == TOK_TYPE_NORMAL || t->types[id] == TOK_TYPE_USER_DEFINED)) {
            tok_ids_push(out, id);
            continue;
        }
        for (uint32_t k = 0; k < sym[i].len; k++) {
            int32_t b = t->byte_tok[(uint8_t)text[sym[i].start + k]];
            if (b >= 0) tok_ids_push(out, b);
            else if (t->unk >= 0) tok_ids_push(out, t->unk);
        }
    }
    st_free(h.v);
    st_free(sym);
    st_free(text);
    return 0;
}
