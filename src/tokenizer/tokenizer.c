/* Tokenizer: loading from GGUF metadata, special tokens, the encode driver
 * and decoding.
 *
 * Encoding cuts the text at special-token strings first (leftmost, longest
 * match, as a trie over added tokens does), then hands each fragment between
 * them to the model: byte-level BPE (tok_bpe.c) or SentencePiece (tok_spm.c).
 * Which tokens count as special, the BOS/EOS rules and the end-of-generation
 * set follow the GGUF keys, with the defaults llama.cpp applies to files that
 * lack them, so that a file means the same thing here as there.
 */
#include <stdlib.h>
#include <string.h>

#include "../core/alloc.h"
#include "../core/log.h"
#include "tok_internal.h"

/* ---- loading ---- */

/* Fetch an array-valued key. 0 and *v, or -1 when absent or not an array of elem. */
static int get_array(const gguf_file *f, const char *key, gguf_vtype elem, gguf_value *v) {
    int64_t i = gguf_find_key(f, key);
    if (i < 0 || gguf_get_value(f, i, v) != 0) return -1;
    if (v->type != GGUF_T_ARRAY || v->elem_type != elem) return -1;
    return 0;
}

/* An id key: -1 when absent or out of range (a bad id is ignored, not fatal,
 * as llama.cpp does, because some converters write junk ids). */
static int32_t get_id(const gguf_file *f, const char *key, int32_t n_vocab) {
    uint32_t v;
    if (gguf_get_u32(f, key, &v) != 0) return -1;
    if (v >= (uint32_t)n_vocab) {
        ST_WARN("tokenizer: %s = %u is past the vocabulary (%d tokens); ignored", key, v, n_vocab);
        return -1;
    }
    return (int32_t)v;
}

/* Sort specials by first byte, then longest first, then id. qsort has no
 * context argument in C11, so the tokenizer is passed through a static. */
static const tokenizer *g_sort_tok;

static int cmp_special(const void *a, const void *b) {
    const tokenizer *t = g_sort_tok;
    int32_t ia = *(const int32_t *)a, ib = *(const int32_t *)b;
    size_t la, lb;
    const char *sa = tok_text(t, ia, &la), *sb = tok_text(t, ib, &lb);
    if ((uint8_t)sa[0] != (uint8_t)sb[0]) return (uint8_t)sa[0] < (uint8_t)sb[0] ? -1 : 1;
    if (la != lb) return la > lb ? -1 : 1;
    return ia < ib ? -1 : ia > ib;
}

static void build_specials(tokenizer *t) {
    int32_t n = 0;
    for (int32_t id = 0; id < t->n_vocab; id++) {
        uint8_t ty = t->types[id];
        if ((ty == TOK_TYPE_CONTROL || ty == TOK_TYPE_USER_DEFINED || ty == TOK_TYPE_UNKNOWN) &&
            t->text_off[id + 1] > t->text_off[id])
            n++;
    }
    t->special_ids = st_malloc((size_t)(n ? n : 1) * sizeof(int32_t));
    n = 0;
    for (int32_t id = 0; id < t->n_vocab; id++) {
        uint8_t ty = t->types[id];
        if ((ty == TOK_TYPE_CONTROL || ty == TOK_TYPE_USER_DEFINED || ty == TOK_TYPE_UNKNOWN) &&
            t->text_off[id + 1] > t->text_off[id])
            t->special_ids[n++] = id;
    }
    /* Tokenizers are loaded once per model, never concurrently in practice;
     * the static only lives for this sort. */
    g_sort_tok = t;
    qsort(t->special_ids, (size_t)n, sizeof(int32_t), cmp_special);
    g_sort_tok = NULL;
    uint32_t counts[256] = {0};
    for (int32_t k = 0; k < n; k++) counts[(uint8_t)t->text_blob[t->text_off[t->special_ids[k]]]]++;
    t->special_start[0] = 0;
    for (int c = 0; c < 256; c++) t->special_start[c + 1] = t->special_start[c] + counts[c];
}

/* End-of-turn strings that llama.cpp recognises by text when the file has no eot id. */
static const char *const k_eot_texts[] = {
    "<|eot_id|>",
    "<|im_end|>",
    "<|end|>",
    "<end_of_turn>",
    "<|endoftext|>",
    "<EOT>",
    ("<\xef\xbd\x9c"
     "end\xe2\x96\x81of\xe2\x96\x81sentence\xef\xbd\x9c>"), /* DeepSeek; parenthesised: clang -Wstring-concatenation */
};

static void add_eog(tokenizer *t, int32_t id) {
    if (id < 0) return;
    for (int i = 0; i < t->n_eog; i++)
        if (t->eog[i] == id) return;
    if (t->n_eog < TOK_MAX_EOG) t->eog[t->n_eog++] = id;
}

static void set_special_ids(tokenizer *t, const gguf_file *f) {
    int32_t n = t->n_vocab;
    t->bos = get_id(f, "tokenizer.ggml.bos_token_id", n);
    t->eos = get_id(f, "tokenizer.ggml.eos_token_id", n);
    t->eot = get_id(f, "tokenizer.ggml.eot_token_id", n);
    t->eom = get_id(f, "tokenizer.ggml.eom_token_id", n);
    t->unk = get_id(f, "tokenizer.ggml.unknown_token_id", n);
    t->pad = get_id(f, "tokenizer.ggml.padding_token_id", n);

    /* Defaults by model, then the file's own flags win. */
    t->add_bos = t->model == TOK_MODEL_SPM;
    t->add_eos = 0;
    t->add_space_prefix = t->model == TOK_MODEL_SPM;
    if (!strcmp(t->pre, "llama3") || !strcmp(t->pre, "llama-v3") || !strcmp(t->pre, "llama-bpe") ||
        !strcmp(t->pre, "falcon3"))
        t->add_bos = 1;
    int b;
    if (gguf_get_bool(f, "tokenizer.ggml.add_bos_token", &b) == 0) t->add_bos = b;
    if (gguf_get_bool(f, "tokenizer.ggml.add_eos_token", &b) == 0) t->add_eos = b;
    if (gguf_get_bool(f, "tokenizer.ggml.add_space_prefix", &b) == 0) t->add_space_prefix = b;

    /* End of generation: EOS, EOT, EOM and every end-of-turn string present as
     * a control token (a chat model may stop on either <|im_end|> or <|endoftext|>). */
    for (size_t k = 0; k < sizeof(k_eot_texts) / sizeof(k_eot_texts[0]); k++) {
        int32_t id = tok_strmap_get(&t->text_map, k_eot_texts[k], strlen(k_eot_texts[k]));
        if (id < 0 || t->types[id] != TOK_TYPE_CONTROL) continue;
        if (t->eot < 0) t->eot = id;
        add_eog(t, id);
    }
    int32_t id = tok_strmap_get(&t->text_map, "<|eom_id|>", 10);
    if (t->eom < 0 && id >= 0 && t->types[id] == TOK_TYPE_CONTROL) t->eom = id;
    add_eog(t, t->eos);
    add_eog(t, t->eot);
    add_eog(t, t->eom);
}

tokenizer *tokenizer_load(const gguf_file *f) {
    const char *s;
    uint64_t slen;
    if (gguf_get_str(f, "tokenizer.ggml.model", &s, &slen) != 0) {
        st_error_set("tokenizer_load: %s has no tokenizer.ggml.model", gguf_path(f));
        return NULL;
    }
    tok_model model;
    if (slen == 4 && !memcmp(s, "gpt2", 4)) model = TOK_MODEL_BPE;
    else if (slen == 5 && !memcmp(s, "llama", 5)) model = TOK_MODEL_SPM;
    else {
        st_error_set("tokenizer_load: %s: tokenizer model '%.*s' is not supported (gpt2, llama)", gguf_path(f),
                     (int)(slen > 64 ? 64 : slen), s);
        return NULL;
    }

    gguf_value toks;
    if (get_array(f, "tokenizer.ggml.tokens", GGUF_T_STRING, &toks) != 0 || toks.n == 0 || toks.n > INT32_MAX / 2) {
        st_error_set("tokenizer_load: %s: tokenizer.ggml.tokens is missing or not a string array", gguf_path(f));
        return NULL;
    }

    tokenizer *t = st_calloc(1, sizeof(*t));
    t->model = model;
    t->n_vocab = (int32_t)toks.n;
    const char *pre = "default";
    size_t pre_len = 7;
    if (gguf_get_str(f, "tokenizer.ggml.pre", &s, &slen) == 0) {
        pre = s;
        pre_len = (size_t)slen;
    }
    if (pre_len >= sizeof(t->pre)) pre_len = sizeof(t->pre) - 1;
    memcpy(t->pre, pre, pre_len);
    t->pre[pre_len] = '\0';

    /* Vocabulary text into one blob. */
    uint64_t total = 0;
    for (uint64_t j = 0; j < toks.n; j++) {
        if (gguf_arr_get_str(&toks, j, &s, &slen) != 0 || slen > (1u << 20)) {
            st_error_set("tokenizer_load: %s: token %llu is unreadable", gguf_path(f), (unsigned long long)j);
            tokenizer_free(t);
            return NULL;
        }
        total += slen;
    }
    t->text_blob = st_malloc(total + 1);
    t->text_off = st_malloc((toks.n + 1) * sizeof(uint64_t));
    uint64_t off = 0;
    for (uint64_t j = 0; j < toks.n; j++) {
        gguf_arr_get_str(&toks, j, &s, &slen);
        t->text_off[j] = off;
        memcpy(t->text_blob + off, s, slen);
        off += slen;
    }
    t->text_off[toks.n] = off;

    t->scores = st_calloc(toks.n, sizeof(float));
    t->types = st_malloc(toks.n);
    memset(t->types, TOK_TYPE_NORMAL, toks.n);
    gguf_value v;
    if (get_array(f, "tokenizer.ggml.scores", GGUF_T_FLOAT32, &v) == 0 && v.n == toks.n) {
        for (uint64_t j = 0; j < v.n; j++) {
            double d = 0;
            gguf_arr_get_f64(&v, j, &d);
            t->scores[j] = (float)d;
        }
    }
    if (get_array(f, "tokenizer.ggml.token_type", GGUF_T_INT32, &v) == 0 && v.n == toks.n) {
        for (uint64_t j = 0; j < v.n; j++) {
            int64_t ty = TOK_TYPE_NORMAL;
            gguf_arr_get_i64(&v, j, &ty);
            t->types[j] = (ty >= TOK_TYPE_NORMAL && ty <= TOK_TYPE_BYTE) ? (uint8_t)ty : TOK_TYPE_NORMAL;
        }
    }

    tok_strmap_init(&t->text_map, toks.n);
    for (int32_t id = 0; id < t->n_vocab; id++) {
        size_t l;
        const char *p = tok_text(t, id, &l);
        tok_strmap_put(&t->text_map, p, (uint32_t)l, id);
    }

    int rc = model == TOK_MODEL_BPE ? tok_bpe_init(t) : tok_spm_init(t);
    if (rc == 0 && model == TOK_MODEL_BPE) {
        /* merges need the piece map, built by tok_bpe_init; they are read here
         * because only this file sees the gguf handle */
        gguf_value m;
        if (get_array(f, "tokenizer.ggml.merges", GGUF_T_STRING, &m) != 0) {
            st_error_set("tokenizer_load: %s: BPE vocabulary without tokenizer.ggml.merges", gguf_path(f));
            rc = -1;
        } else {
            tok_pairmap_init(&t->merges, m.n);
            char tmp[512];
            for (uint64_t j = 0; j < m.n && rc == 0; j++) {
                if (gguf_arr_get_str(&m, j, &s, &slen) != 0) {
                    st_error_set("tokenizer_load: %s: merge %llu is unreadable", gguf_path(f), (unsigned long long)j);
                    rc = -1;
                    break;
                }
                /* "left right": split at the first space after the first
                 * character (a byte-level token never contains a plain space). */
                const char *sp = slen > 1 ? memchr(s + 1, ' ', slen - 1) : NULL;
                if (!sp || slen >= sizeof(tmp)) continue;
                size_t ll = (size_t)(sp - s), rl = (size_t)slen - ll - 1;
                int32_t l = tok_strmap_get(&t->text_map, s, ll);
                int32_t r = tok_strmap_get(&t->text_map, sp + 1, rl);
                memcpy(tmp, s, ll);
                memcpy(tmp + ll, sp + 1, rl);
                int32_t mid = tok_strmap_get(&t->text_map, tmp, ll + rl);
                if (l < 0 || r < 0 || mid < 0)
                    continue; /* a merge whose result is not in the vocabulary can never apply */
                tok_pairmap_put(&t->merges, l, r, (int32_t)j, mid);
            }
        }
    }
    if (rc != 0) {
        tokenizer_free(t);
        return NULL;
    }
    build_specials(t);
    set_special_ids(t, f);
    return t;
}

void tokenizer_free(tokenizer *t) {
    if (!t) return;
    if (t->model == TOK_MODEL_BPE) tok_bpe_free(t);
    tok_strmap_free(&t->text_map);
    st_free(t->text_blob);
    st_free(t->text_off);
    st_free(t->piece_blob);
    st_free(t->piece_off);
    st_free(t->scores);
    st_free(t->types);
    st_free(t->special_ids);
    st_free(t);
}

/* ---- accessors ---- */

tok_model tokenizer_model(const tokenizer *t) { return t->model; }
const char *tokenizer_pre(const tokenizer *t) { return t->pre; }
int32_t tokenizer_n_vocab(const tokenizer *t) { return t->n_vocab; }
int32_t tokenizer_bos(const tokenizer *t) { return t->bos; }
int32_t tokenizer_eos(const tokenizer *t) { return t->eos; }
int32_t tokenizer_eot(const tokenizer *t) { return t->eot; }
int tokenizer_add_bos(const tokenizer *t) { return t->add_bos; }

int tokenizer_is_eog(const tokenizer *t, int32_t id) {
    for (int i = 0; i < t->n_eog; i++)
        if (t->eog[i] == id) return 1;
    return 0;
}

int32_t tokenizer_find(const tokenizer *t, const char *text, size_t len) {
    return tok_strmap_get(&t->text_map, text, len);
}

const char *tokenizer_token_text(const tokenizer *t, int32_t id, size_t *len) {
    if (id < 0 || id >= t->n_vocab) return NULL;
    return tok_text(t, id, len);
}

tok_type tokenizer_token_type(const tokenizer *t, int32_t id) {
    if (id < 0 || id >= t->n_vocab) return TOK_TYPE_UNKNOWN;
    return (tok_type)t->types[id];
}

/* ---- encoding ---- */

static int encode_fragment(const tokenizer *t, const char *s, size_t n, int prev_special, tok_ids *out) {
    if (n == 0) return 0;
    if (t->model == TOK_MODEL_BPE) return tok_bpe_encode(t, s, n, out);
    return tok_spm_encode(t, s, n, t->add_space_prefix && prev_special, out);
}

int64_t tokenizer_encode(const tokenizer *t, const char *text, size_t len, int add_special, int parse_special,
                         int32_t *out_ids, int64_t max) {
    if (!tok_utf8_valid(text, len)) {
        st_error_set("tokenizer_encode: the text is not valid UTF-8");
        return -1;
    }
    tok_ids ids = {0};
    if (add_special && t->add_bos && t->bos >= 0) tok_ids_push(&ids, t->bos);

    size_t frag = 0, pos = 0;
    int prev_special = 1, rc = 0;
    while (pos < len && rc == 0) {
        uint8_t c = (uint8_t)text[pos];
        int32_t found = -1;
        size_t flen = 0;
        for (uint32_t k = t->special_start[c]; k < t->special_start[c + 1]; k++) {
            int32_t id = t->special_ids[k];
            if (!parse_special && t->types[id] != TOK_TYPE_USER_DEFINED) continue;
            size_t tl;
            const char *ts = tok_text(t, id, &tl);
            if (tl <= len - pos && memcmp(ts, text + pos, tl) == 0) {
                found = id; /* longest first inside the group */
                flen = tl;
                break;
            }
        }
        if (found < 0) {
            pos++;
            continue;
        }
        rc = encode_fragment(t, text + frag, pos - frag, prev_special, &ids);
        tok_ids_push(&ids, found);
        prev_special = 1;
        pos += flen;
        frag = pos;
    }
    if (rc == 0) rc = encode_fragment(t, text + frag, len - frag, prev_special, &ids);
    if (rc == 0 && add_special && t->add_eos && t->eos >= 0) tok_ids_push(&ids, t->eos);

    int64_t n = rc == 0 ? ids.n : -1;
    if (n > 0 && out_ids) memcpy(out_ids, ids.v, (size_t)(n < max ? n : max) * sizeof(int32_t));
    st_free(ids.v);
    return n;
}

/* ---- decoding ---- */

int64_t tokenizer_token_to_piece(const tokenizer *t, int32_t id, int render_special, char *buf, size_t cap) {
    if (id < 0 || id >= t->n_vocab) return -1;
    size_t n;
    const char *p;
    uint8_t ty = t->types[id];
    if (ty == TOK_TYPE_CONTROL || ty == TOK_TYPE_UNKNOWN || ty == TOK_TYPE_UNUSED) {
        if (!render_special) return 0;
        p = tok_text(t, id, &n);
    } else {
        p = tok_piece(t, id, &n);
    }
    if (buf && cap) memcpy(buf, p, n < cap ? n : cap);
    return (int64_t)n;
}

int64_t tokenizer_decode(const tokenizer *t, const int32_t *ids, size_t n, int render_special, char *out, size_t cap) {
    size_t len = 0;
    int strip = t->model == TOK_MODEL_SPM && t->add_space_prefix;
    for (size_t i = 0; i < n; i++) {
        int32_t id = ids[i];
        if (id < 0 || id >= t->n_vocab) {
            st_error_set("tokenizer_decode: token id %d is out of range (%d tokens)", id, t->n_vocab);
            return -1;
        }
        const char *p;
        size_t pn;
        uint8_t ty = t->types[id];
        if (ty == TOK_TYPE_CONTROL || ty == TOK_TYPE_UNKNOWN || ty == TOK_TYPE_UNUSED) {
            if (!render_special) continue;
            p = tok_text(t, id, &pn);
        } else {
            p = tok_piece(t, id, &pn);
            /* the space SentencePiece put in front of the text is not the user's */
            if (strip && pn > 0 && p[0] == ' ') {
                p++;
                pn--;
            }
            strip = 0;
        }
        if (out && len < cap) memcpy(out + len, p, pn < cap - len ? pn : cap - len);
        len += pn;
    }
    if (out && len < cap) out[len] = '\0';
    return (int64_t)len;
}
