/* Byte-level BPE (GPT-2 family): the pre-tokenizer regexes and the merge loop.
 *
 * Vocabularies spell every byte as a printable code point (GPT-2's
 * bytes_to_unicode: printable Latin-1 bytes stand for themselves, the other
 * 68 bytes map to U+0100..U+0143). At load we decode each token back to the
 * raw bytes it stands for, so encoding works on the UTF-8 text directly and
 * decoding is a copy.
 *
 * Encoding: the regexes of the pre-tokenizer named by tokenizer.ggml.pre cut
 * the text into words (PCRE2 with UTF, Unicode properties and JIT); each word
 * starts as one symbol per byte, and the adjacent pair with the lowest merge
 * rank is merged until no pair is a merge. A binary heap of candidate pairs
 * keyed (rank, position) makes that O(n log n) per word; entries made stale by
 * an earlier merge are recognised on pop and skipped.
 */
#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>
#include <string.h>

#include "../core/alloc.h"
#include "../core/log.h"
#include "tok_internal.h"

/* ---- pre-tokenizer regexes (as in the models' tokenizer.json files) ---- */

#define RE_GPT2 "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+"
#define RE_LLAMA3                                                                                                      \
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}|"                                          \
    " ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"
#define RE_QWEN2                                                                                                       \
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}|"                                               \
    " ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"
#define RE_GPT4O                                                                                                       \
    "[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]*[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]+"                        \
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)?|"                                                                                   \
    "[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]+[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]*"                        \
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)?|"                                                                                   \
    "\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n/]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"

typedef struct {
    const char *names; /* '|'-separated tokenizer.ggml.pre values */
    int ignore_merges; /* a word that is a whole token is not merged (Llama 3) */
    const char *re[TOK_MAX_REGEX];
} pretok_def;

static const pretok_def k_pretoks[] = {
    {"gpt-2|gpt2|phi-2|roberta-bpe|jina-es|jina-de|jina-v1-en|jina-v2-es|jina-v2-de|jina-v2-code|"
     "gigachat|mpt|olmo|jais",
     0,
     {RE_GPT2}},
    {"llama3|llama-v3|llama-bpe|falcon3|dbrx|smaug-bpe|pixtral", 1, {RE_LLAMA3}},
    {"qwen2|stablelm2|megrez|deepseek-r1-qwen", 0, {RE_QWEN2}},
    {"smollm|starcoder|refact|command-r|codeshell|exaone|minerva-7b", 0, {"\\p{N}", RE_GPT2}},
    {"deepseek-v3",
     0,
     {"\\p{N}{1,3}", "[\\x{4E00}-\\x{9FA5}\\x{3040}-\\x{309F}\\x{30A0}-\\x{30FF}]+",
      "[!\"#$%&'()*+,\\-./:;<=>?@\\[\\\\\\]^_`{|}~][A-Za-z]+|[^\\r\\n\\p{L}\\p{P}\\p{S}]?"
      "[\\p{L}\\p{M}]+| ?[\\p{P}\\p{S}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"}},
    {"gpt-4o|llama4", 0, {RE_GPT4O}},
    /* llama.cpp's choice for files that name no pre-tokenizer */
    {"default", 0, {"[\\p{P}\\$\\+<=>\\^~\\|]+", RE_GPT2, "\\p{N}+", "[0-9][0-9][0-9]"}},
};

static int name_in(const char *name, const char *list) {
    size_t n = strlen(name);
    for (const char *p = list;;) {
        const char *bar = strchr(p, '|');
        size_t l = bar ? (size_t)(bar - p) : strlen(p);
        if (l == n && memcmp(p, name, n) == 0) return 1;
        if (!bar) return 0;
        p = bar + 1;
    }
}

/* ---- byte-level alphabet ---- */

/* The code point GPT-2 uses to spell byte b. */
static uint32_t byte_to_cp(int b) {
    if ((b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255)) return (uint32_t)b;
    int k = 0; /* rank of b among the bytes that are not printable */
    for (int i = 0; i < b; i++)
        if (!((i >= 33 && i <= 126) || (i >= 161 && i <= 172) || (i >= 174 && i <= 255))) k++;
    return 256u + (uint32_t)k;
}

/* Decode a token's byte-level spelling into raw bytes; -1 if a code point is
 * outside the alphabet (then the token is not byte-level, e.g. a control token). */
static int64_t decode_byte_level(const int16_t *cp_to_byte, const char *s, size_t n, char *out) {
    size_t i = 0, o = 0;
    while (i < n) {
        int l = tok_utf8_char((const uint8_t *)s + i, n - i);
        if (l <= 0) return -1;
        uint32_t cp;
        const uint8_t *p = (const uint8_t *)s + i;
        if (l == 1) cp = p[0];
        else if (l == 2) cp = (uint32_t)(p[0] & 0x1F) << 6 | (p[1] & 0x3F);
        else return -1; /* the alphabet ends at U+0143 */
        if (cp >= 324 || cp_to_byte[cp] < 0) return -1;
        out[o++] = (char)cp_to_byte[cp];
        i += (size_t)l;
    }
    return (int64_t)o;
}

int tok_bpe_init(tokenizer *t) {
    int16_t cp_to_byte[324];
    for (int i = 0; i < 324; i++) cp_to_byte[i] = -1;
    for (int b = 0; b < 256; b++) cp_to_byte[byte_to_cp(b)] = (int16_t)b;

    /* Pieces: decoded bytes for byte-level tokens, the text itself otherwise. */
    t->piece_blob = st_malloc(t->text_off[t->n_vocab] + 1);
    t->piece_off = st_malloc(((size_t)t->n_vocab + 1) * sizeof(uint64_t));
    uint64_t off = 0;
    for (int32_t id = 0; id < t->n_vocab; id++) {
        size_t n;
        const char *s = tok_text(t, id, &n);
        t->piece_off[id] = off;
        int64_t m = -1;
        uint8_t ty = t->types[id];
        if (ty == TOK_TYPE_NORMAL || ty == TOK_TYPE_USER_DEFINED || ty == TOK_TYPE_BYTE)
            m = decode_byte_level(cp_to_byte, s, n, t->piece_blob + off);
        if (m < 0) {
            memcpy(t->piece_blob + off, s, n);
            m = (int64_t)n;
        }
        off += (uint64_t)m;
    }
    t->piece_off[t->n_vocab] = off;

    tok_strmap_init(&t->piece_map, (uint64_t)t->n_vocab);
    for (int32_t id = 0; id < t->n_vocab; id++) {
        if (t->types[id] != TOK_TYPE_NORMAL) continue;
        size_t n;
        const char *p = tok_piece(t, id, &n);
        if (n) tok_strmap_put(&t->piece_map, p, (uint32_t)n, id);
    }
    for (int b = 0; b < 256; b++) {
        char c = (char)b;
        t->byte_tok[b] = tok_strmap_get(&t->piece_map, &c, 1);
    }

    const pretok_def *def = NULL;
    for (size_t k = 0; k < sizeof(k_pretoks) / sizeof(k_pretoks[0]); k++)
        if (name_in(t->pre, k_pretoks[k].names)) def = &k_pretoks[k];
    if (!def) {
        st_error_set("tokenizer_load: pre-tokenizer '%s' is not supported", t->pre);
        return -1;
    }
    t->ignore_merges = def->ignore_merges;
    for (int k = 0; k < TOK_MAX_REGEX && def->re[k]; k++) {
        int err;
        PCRE2_SIZE eoff;
        pcre2_code *re =
            pcre2_compile((PCRE2_SPTR)def->re[k], PCRE2_ZERO_TERMINATED, PCRE2_UTF | PCRE2_UCP, &err, &eoff, NULL);
        if (!re) {
            PCRE2_UCHAR msg[256];
            pcre2_get_error_message(err, msg, sizeof(msg));
            st_error_set("tokenizer_load: regex %d of pre-tokenizer '%s' does not compile at %zu: %s", k, t->pre,
                         (size_t)eoff, (const char *)msg);
            return -1;
        }
        /* JIT is an optimisation: without it (no JIT support) matching still works */
        pcre2_jit_compile(re, PCRE2_JIT_COMPLETE);
        t->re[t->n_re++] = re;
    }
    return 0;
}

void tok_bpe_free(tokenizer *t) {
    for (int k = 0; k < t->n_re; k++) pcre2_code_free((pcre2_code *)t->re[k]);
    t->n_re = 0;
    tok_strmap_free(&t->piece_map);
    if (t->merges.slots) tok_pairmap_free(&t->merges);
}

/* ---- splitting ---- */

typedef struct {
    size_t *v; /* (start, length) pairs */
    size_t n, cap;
} spans;

static void spans_push(spans *s, size_t start, size_t len) {
    if (s->n + 2 > s->cap) {
        s->cap = s->cap ? 2 * s->cap : 128;
        s->v = st_realloc(s->v, s->cap * sizeof(size_t));
    }
    s->v[s->n++] = start;
    s->v[s->n++] = len;
}

/* Split every span of `in` with re: matches and the gaps between them become spans of `out`. */
static int split_spans(const pcre2_code *re, const char *text, const spans *in, spans *out, pcre2_match_data *md,
                       pcre2_match_context *mc) {
    out->n = 0;
    for (size_t k = 0; k < in->n; k += 2) {
        size_t base = in->v[k], len = in->v[k + 1];
        PCRE2_SPTR subj = (PCRE2_SPTR)(text + base);
        size_t last = 0, at = 0;
        while (at < len) {
            int rc = pcre2_match(re, subj, len, at, PCRE2_NO_UTF_CHECK, md, mc);
            if (rc == PCRE2_ERROR_NOMATCH) break;
            if (rc < 0) {
                PCRE2_UCHAR msg[256];
                pcre2_get_error_message(rc, msg, sizeof(msg));
                st_error_set("tokenizer_encode: pre-tokenizer regex failed: %s", (const char *)msg);
                return -1;
            }
            PCRE2_SIZE *ov = pcre2_get_ovector_pointer(md);
            size_t ms = ov[0], me = ov[1];
            if (me == ms) { /* no pattern here matches empty; step over a character anyway */
                int l = tok_utf8_char(subj + ms, len - ms);
                at = ms + (size_t)(l > 0 ? l : 1);
                continue;
            }
            if (ms > last) spans_push(out, base + last, ms - last);
            spans_push(out, base + ms, me - ms);
            last = at = me;
        }
        if (last < len) spans_push(out, base + last, len - last);
    }
    return 0;
}

/* ---- merging ---- */

typedef struct {
    int32_t id;
    int32_t prev, next; /* -1 at the ends */
    int32_t alive;
} bpe_sym;

typedef struct {
    int32_t rank, left, right, lid, rid, merged;
} bpe_cand;

static int cand_less(const bpe_cand *a, const bpe_cand *b) {
    return a->rank < b->rank || (a->rank == b->rank && a->left < b->left);
}

static void heap_push(bpe_cand **h, size_t *n, size_t *cap, bpe_cand c) {
    if (*n == *cap) {
        *cap = *cap ? 2 * *cap : 64;
        *h = st_realloc(*h, *cap * sizeof(bpe_cand));
    }
    size_t i = (*n)++;
    while (i > 0) {
        size_t p = (i - 1) / 2;
        if (!cand_less(&c, &(*h)[p])) break;
        (*h)[i] = (*h)[p];
        i = p;
    }
    (*h)[i] = c;
}

static bpe_cand heap_pop(bpe_cand *h, size_t *n) {
    bpe_cand top = h[0], last = h[--*n];
    size_t i = 0;
    for (;;) {
        size_t l = 2 * i + 1, r = l + 1, m = i;
        const bpe_cand *best = &last;
        if (l < *n && cand_less(&h[l], best)) {
            m = l;
            best = &h[l];
        }
        if (r < *n && cand_less(&h[r], best)) m = r;
        if (m == i) break;
        h[i] = h[m];
        i = m;
    }
    if (*n > 0) h[i] = last;
    return top;
}

typedef struct {
    bpe_sym *sym;
    size_t sym_cap;
    bpe_cand *heap;
    size_t heap_n, heap_cap;
} bpe_scratch;

static void try_pair(const tokenizer *t, bpe_scratch *w, int32_t l, int32_t r) {
    if (l < 0 || r < 0 || w->sym[l].id < 0 || w->sym[r].id < 0) return;
    int32_t rank, merged;
    if (tok_pairmap_get(&t->merges, w->sym[l].id, w->sym[r].id, &rank, &merged) != 0) return;
    bpe_cand c = {rank, l, r, w->sym[l].id, w->sym[r].id, merged};
    heap_push(&w->heap, &w->heap_n, &w->heap_cap, c);
}

static void bpe_word(const tokenizer *t, const char *s, size_t n, bpe_scratch *w, tok_ids *out) {
    if (t->ignore_merges) {
        int32_t id = tok_strmap_get(&t->piece_map, s, n);
        if (id >= 0) {
            tok_ids_push(out, id);
            return;
        }
    }
    if (n > w->sym_cap) {
        w->sym_cap = n;
        w->sym = st_realloc(w->sym, n * sizeof(bpe_sym));
    }
    for (size_t i = 0; i < n; i++) {
        w->sym[i].id = t->byte_tok[(uint8_t)s[i]];
        w->sym[i].prev = (int32_t)i - 1;
        w->sym[i].next = i + 1 < n ? (int32_t)i + 1 : -1;
        w->sym[i].alive = 1;
    }
    w->heap_n = 0;
    for (size_t i = 0; i + 1 < n; i++) try_pair(t, w, (int32_t)i, (int32_t)i + 1);
    while (w->heap_n > 0) {
        bpe_cand c = heap_pop(w->heap, &w->heap_n);
        bpe_sym *L = &w->sym[c.left], *R = &w->sym[c.right];
        /* stale: one side was merged away or changed since this pair was queued */
        if (!L->alive || !R->alive || L->next != c.right || L->id != c.lid || R->id != c.rid) continue;
        L->id = c.merged;
        L->next = R->next;
        if (R->next >= 0) w->sym[R->next].prev = c.left;
        R->alive = 0;
        try_pair(t, w, L->prev, c.left);
        try_pair(t, w, c.left, L->next);
    }
    for (int32_t i = 0; i >= 0; i = w->sym[i].next) {
        if (w->sym[i].id >= 0) tok_ids_push(out, w->sym[i].id);
        else if (t->unk >= 0) tok_ids_push(out, t->unk); /* a byte the vocabulary cannot spell */
    }
}

int tok_bpe_encode(const tokenizer *t, const char *s, size_t n, tok_ids *out) {
    spans a = {0}, b = {0};
    spans_push(&a, 0, n);
    pcre2_match_data *md = pcre2_match_data_create(4, NULL);
    pcre2_match_context *mc = pcre2_match_context_create(NULL);
    pcre2_jit_stack *js = pcre2_jit_stack_create(32 * 1024, 4 * 1024 * 1024, NULL);
    pcre2_jit_stack_assign(mc, NULL, js);
    int rc = 0;
    for (int k = 0; k < t->n_re && rc == 0; k++) {
        rc = split_spans((const pcre2_code *)t->re[k], s, &a, &b, md, mc);
        spans tmp = a;
        a = b;
        b = tmp;
    }
    if (rc == 0) {
        bpe_scratch w = {0};
        for (size_t k = 0; k < a.n; k += 2) bpe_word(t, s + a.v[k], a.v[k + 1], &w, out);
        st_free(w.sym);
        st_free(w.heap);
    }
    pcre2_jit_stack_free(js);
    pcre2_match_context_free(mc);
    pcre2_match_data_free(md);
    st_free(a.v);
    st_free(b.v);
    return rc;
}
