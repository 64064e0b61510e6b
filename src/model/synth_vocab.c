/* The synthetic tokenizer: a byte-level BPE vocabulary that llama.cpp's
 * "gpt2" tokenizer loads, of any size from 259 tokens up.
 *
 * Layout (ids):
 *   0..255            one token per byte, in GPT-2's byte-to-unicode form
 *                     (printable bytes stand for themselves, the others map
 *                     to U+0100.. in byte order; a space is "Ġ")
 *   256..n_vocab-4    merge-derived tokens: breadth-first, every token that
 *                     starts a word ("Ġ" or a lowercase letter, then every
 *                     merged token in creation order) is extended by each
 *                     lowercase letter; merge i is "LEFT x" and creates
 *                     token 256+i = LEFT+x. Each left part exists before it
 *                     is used, and no two tokens have the same text (their
 *                     last letter and prefix determine them), so merges and
 *                     tokens are consistent.
 *   n_vocab-3..-1     <|endoftext|>, <|im_start|>, <|im_end|> (control)
 *
 * bos = pad = <|endoftext|>, eos = <|im_end|>, no BOS added: as Qwen3 does.
 */
#include <stdio.h>
#include <string.h>

#include "core/alloc.h"
#include "core/log.h"
#include "model/synth_internal.h"

#define N_SPECIAL 3
static const char *const SPECIALS[N_SPECIAL] = {"<|endoftext|>", "<|im_start|>", "<|im_end|>"};
#define LETTERS   "abcdefghijklmnopqrstuvwxyz"
#define N_LETTERS 26

/* GGUF token types (llama.cpp's llama_token_type). */
enum { TOKEN_TYPE_NORMAL = 1, TOKEN_TYPE_CONTROL = 3 };

static const char CHAT_TEMPLATE[] =
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + "
    "'<|im_end|>' + '\\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}";

/* GPT-2's byte -> code point map: printable Latin-1 bytes keep their value,
 * the rest get 256, 257, ... in byte order. */
static void byte_to_unicode(uint32_t cp[256]) {
    int n = 0;
    for (int b = 0; b < 256; b++) {
        int printable = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255);
        cp[b] = printable ? (uint32_t)b : (uint32_t)(256 + n++);
    }
}

static int utf8_put(char *p, uint32_t c) {
    if (c < 0x80) {
        p[0] = (char)c;
        return 1;
    }
    /* every code point here is below U+0800 (at most 256 + 94) */
    p[0] = (char)(0xC0 | (c >> 6));
    p[1] = (char)(0x80 | (c & 0x3F));
    return 2;
}

int synth_vocab_write(gguf_writer *w, int n_vocab) {
    if (n_vocab < 256 + N_SPECIAL) {
        st_error_set("synth: vocabulary of %d tokens is too small (at least %d)", n_vocab, 256 + N_SPECIAL);
        return -1;
    }
    int n_merge = n_vocab - 256 - N_SPECIAL;
    uint32_t cp[256];
    byte_to_unicode(cp);

    /* Token texts live in one arena. A merged token is its left part plus one
     * letter, so its length is the left's length + 1; left parts are at most
     * a few letters long for any vocabulary that fits in 32 bits. */
    char **tok = st_malloc((size_t)n_vocab * sizeof *tok);
    char **merge = st_malloc((size_t)(n_merge > 0 ? n_merge : 1) * sizeof *merge);
    size_t cap = (size_t)n_vocab * 16 + 4096, used = 0;
    char *arena = st_malloc(cap);
    size_t mcap = (size_t)(n_merge > 0 ? n_merge : 1) * 18 + 64, mused = 0;
    char *marena = st_malloc(mcap);

    for (int b = 0; b < 256; b++) {
        tok[b] = arena + used;
        used += (size_t)utf8_put(arena + used, cp[b]);
        arena[used++] = 0;
    }
    /* Queue of left parts: "Ġ", the letters, then each merged token in turn. */
    int n_queue_seed = 1 + N_LETTERS;
    int *queue = st_malloc((size_t)(n_queue_seed + n_merge + 1) * sizeof *queue);
    int qn = 0;
    queue[qn++] = ' ';
    for (int i = 0; i < N_LETTERS; i++) queue[qn++] = LETTERS[i];
    int qi = 0, li = 0;
    for (int m = 0; m < n_merge; m++) {
        const char *left = tok[queue[qi]];
        const char *right = tok[(unsigned char)LETTERS[li]];
        size_t ll = strlen(left), rl = strlen(right);
        ST_ASSERT(used + ll + rl + 1 <= cap && mused + ll + rl + 2 <= mcap);
        int id = 256 + m;
        tok[id] = arena + used;
        memcpy(arena + used, left, ll);
        memcpy(arena + used + ll, right, rl + 1);
        used += ll + rl + 1;
        merge[m] = marena + mused;
        memcpy(marena + mused, left, ll);
        marena[mused + ll] = ' ';
        memcpy(marena + mused + ll + 1, right, rl + 1);
        mused += ll + rl + 2;
        queue[qn++] = id;
        if (++li == N_LETTERS) {
            li = 0;
            qi++;
        }
    }
    int32_t *types = st_malloc((size_t)n_vocab * sizeof *types);
    for (int i = 0; i < n_vocab; i++) types[i] = TOKEN_TYPE_NORMAL;
    for (int s = 0; s < N_SPECIAL; s++) {
        int id = n_vocab - N_SPECIAL + s;
        tok[id] = (char *)SPECIALS[s];
        types[id] = TOKEN_TYPE_CONTROL;
    }

    gguf_w_str(w, "tokenizer.ggml.model", "gpt2");
    gguf_w_str(w, "tokenizer.ggml.pre", "qwen2");
    gguf_w_arr_str(w, "tokenizer.ggml.tokens", (const char *const *)tok, (uint64_t)n_vocab);
    gguf_w_arr(w, "tokenizer.ggml.token_type", GGUF_T_INT32, types, (uint64_t)n_vocab);
    gguf_w_arr_str(w, "tokenizer.ggml.merges", (const char *const *)merge, (uint64_t)n_merge);
    gguf_w_u32(w, "tokenizer.ggml.eos_token_id", (uint32_t)(n_vocab - N_SPECIAL + 2));
    gguf_w_u32(w, "tokenizer.ggml.padding_token_id", (uint32_t)(n_vocab - N_SPECIAL));
    gguf_w_u32(w, "tokenizer.ggml.bos_token_id", (uint32_t)(n_vocab - N_SPECIAL));
    gguf_w_bool(w, "tokenizer.ggml.add_bos_token", 0);
    gguf_w_str(w, "tokenizer.chat_template", CHAT_TEMPLATE);

    st_free(types);
    st_free(queue);
    st_free(marena);
    st_free(arena);
    st_free(merge);
    st_free(tok);
    return 0;
}
