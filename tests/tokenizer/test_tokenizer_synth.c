/* Tokenizer rules on tiny vocabularies written with the GGUF writer, so they
 * run without the real models.
 *
 * Byte-level BPE: the 256 byte tokens plus merges "1 2" and "12 3", under
 * every supported pre-tokenizer. Those whose regexes put each digit in a word
 * of its own (qwen2: \p{N}; smollm: \p{N} first) must give "123" as three
 * tokens, the others (\p{N}+ or \p{N}{1,3}) as one, as the models'
 * tokenizer.json regexes say. Every one must compile, round-trip a
 * multilingual string and find a control token.
 * SentencePiece: the space prefix and its removal on decode, score order,
 * byte fallback for a character with no piece.
 * Bad metadata: no vocabulary, an unknown model or pre-tokenizer.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/log.h"
#include "gguf/gguf.h"
#include "tokenizer/tokenizer.h"

#include "../common/check.h"

/* GPT-2's spelling of byte b as UTF-8 (bytes_to_unicode). */
static void byte_spelling(int b, char *out) {
    int printable = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255);
    unsigned cp = (unsigned)b;
    if (!printable) {
        int k = 0;
        for (int i = 0; i < b; i++)
            if (!((i >= 33 && i <= 126) || (i >= 161 && i <= 172) || (i >= 174 && i <= 255))) k++;
        cp = 256u + (unsigned)k;
    }
    if (cp < 0x80) {
        out[0] = (char)cp;
        out[1] = 0;
    } else {
        out[0] = (char)(0xC0 | (cp >> 6));
        out[1] = (char)(0x80 | (cp & 0x3F));
        out[2] = 0;
    }
}

static char g_path[64];

/* Write w to a temporary file and load a tokenizer from it (NULL on error). */
static tokenizer *load_written(gguf_writer *w) {
    strcpy(g_path, "/tmp/strata-tok-XXXXXX");
    int fd = mkstemp(g_path);
    if (fd < 0) return NULL;
    close(fd);
    tokenizer *t = NULL;
    if (gguf_writer_write(w, g_path, NULL, NULL) == 0) {
        gguf_file *f = gguf_open(g_path);
        if (f) {
            t = tokenizer_load(f);
            gguf_close(f);
        }
    }
    gguf_writer_free(w);
    unlink(g_path);
    return t;
}

static tokenizer *bpe_vocab(const char *pre) {
    static char spell[256][3];
    const char *toks[260];
    int32_t types[260];
    for (int b = 0; b < 256; b++) {
        byte_spelling(b, spell[b]);
        toks[b] = spell[b];
        types[b] = TOK_TYPE_NORMAL;
    }
    toks[256] = "12";
    toks[257] = "123";
    toks[258] = "<|im_end|>";
    toks[259] = "<|endoftext|>";
    types[256] = types[257] = TOK_TYPE_NORMAL;
    types[258] = types[259] = TOK_TYPE_CONTROL;
    const char *merges[] = {"1 2", "12 3"};
    gguf_writer *w = gguf_writer_new();
    gguf_w_str(w, "tokenizer.ggml.model", "gpt2");
    if (pre) gguf_w_str(w, "tokenizer.ggml.pre", pre);
    gguf_w_arr_str(w, "tokenizer.ggml.tokens", toks, 260);
    gguf_w_arr(w, "tokenizer.ggml.token_type", GGUF_T_INT32, types, 260);
    gguf_w_arr_str(w, "tokenizer.ggml.merges", merges, 2);
    gguf_w_u32(w, "tokenizer.ggml.eos_token_id", 258);
    return load_written(w);
}

static void check_bpe(void) {
    static const struct {
        const char *pre;
        int digits_alone;
    } pres[] = {{"gpt-2", 0},       {"llama-bpe", 0}, {"qwen2", 1},   {"smollm", 1},
                {"deepseek-v3", 0}, {"gpt-4o", 0},    {"default", 0}, {NULL, 0}};
    const char *text = "Hello, world! 123 日本語 مرحبا 😀\n\n  x";
    for (size_t k = 0; k < sizeof(pres) / sizeof(pres[0]); k++) {
        const char *name = pres[k].pre ? pres[k].pre : "(absent)";
        tokenizer *t = bpe_vocab(pres[k].pre);
        CHECK(t != NULL, "pre %s: %s", name, st_error_get());
        if (!t) continue;
        int32_t ids[256];
        int64_t n = tokenizer_encode(t, "123", 3, 0, 0, ids, 256);
        CHECK(n == (pres[k].digits_alone ? 3 : 1), "pre %s: \"123\" gave %lld ids", name, (long long)n);
        n = tokenizer_encode(t, text, strlen(text), 0, 0, ids, 256);
        char buf[256];
        int64_t dl = tokenizer_decode(t, ids, (size_t)n, 1, buf, sizeof buf);
        CHECK(dl == (int64_t)strlen(text) && !memcmp(buf, text, (size_t)dl), "pre %s: round trip", name);
        n = tokenizer_encode(t, "a<|im_end|>b", 12, 0, 1, ids, 256);
        CHECK(n == 3 && ids[1] == 258, "pre %s: control token parsed (%lld ids)", name, (long long)n);
        CHECK(tokenizer_is_eog(t, 258) && tokenizer_is_eog(t, 259) && !tokenizer_is_eog(t, 256),
              "pre %s: end-of-generation set", name);
        tokenizer_free(t);
    }
    tokenizer *t = bpe_vocab("no-such-pre");
    CHECK(t == NULL && strstr(st_error_get(), "no-such-pre"), "unknown pre-tokenizer: %s", st_error_get());
    tokenizer_free(t);
}

static void check_spm(void) {
    /* ids: 0 <unk>, 1 <s>, 2 </s>, 3..258 <0x00>..<0xFF>, then pieces */
    static char bytes[256][8];
    const char *toks[266];
    float scores[266];
    int32_t types[266];
    toks[0] = "<unk>";
    toks[1] = "<s>";
    toks[2] = "</s>";
    types[0] = TOK_TYPE_UNKNOWN;
    types[1] = types[2] = TOK_TYPE_CONTROL;
    scores[0] = scores[1] = scores[2] = 0;
    for (int b = 0; b < 256; b++) {
        snprintf(bytes[b], sizeof bytes[b], "<0x%02X>", b);
        toks[3 + b] = bytes[b];
        types[3 + b] = TOK_TYPE_BYTE;
        scores[3 + b] = 0;
    }
    const char *pieces[] = {"\xe2\x96\x81",
                            "a",
                            "b",
                            "c",
                            ("\xe2\x96\x81"
                             "a"),
                            "ab",
                            "bc"};
    /* "bc" outscores "ab": "abc" must become a + bc; "▁a" outscores "ab" */
    const float ps[] = {-1, -2, -3, -4, -5, -7, -6};
    for (int i = 0; i < 7; i++) {
        toks[259 + i] = pieces[i];
        scores[259 + i] = ps[i];
        types[259 + i] = TOK_TYPE_NORMAL;
    }
    gguf_writer *w = gguf_writer_new();
    gguf_w_str(w, "tokenizer.ggml.model", "llama");
    gguf_w_arr_str(w, "tokenizer.ggml.tokens", toks, 266);
    gguf_w_arr(w, "tokenizer.ggml.scores", GGUF_T_FLOAT32, scores, 266);
    gguf_w_arr(w, "tokenizer.ggml.token_type", GGUF_T_INT32, types, 266);
    gguf_w_u32(w, "tokenizer.ggml.bos_token_id", 1);
    gguf_w_u32(w, "tokenizer.ggml.eos_token_id", 2);
    tokenizer *t = load_written(w);
    CHECK(t != NULL, "spm load: %s", st_error_get());
    if (!t) return;
    int32_t ids[64];
    /* defaults with no flags in the file: BOS added, space prefix added */
    int64_t n = tokenizer_encode(t, "abc", 3, 1, 0, ids, 64);
    CHECK(n == 3 && ids[0] == 1 && ids[1] == 263 && ids[2] == 265, "\"abc\" -> <s> ▁a bc? got %lld ids", (long long)n);
    /* the higher score wins: "bc" (-6) before "ab" (-7); 'x' has no piece */
    n = tokenizer_encode(t, "xabc", 4, 0, 0, ids, 64);
    CHECK(n == 4 && ids[0] == 259 && ids[1] == 3 + 'x' && ids[2] == 260 && ids[3] == 265,
          "\"xabc\" -> ▁ <0x78> a bc? got %lld ids", (long long)n);
    n = tokenizer_encode(t, "bc", 2, 0, 0, ids, 64);
    CHECK(n == 2 && ids[0] == 259 && ids[1] == 265, "\"bc\" -> ▁ bc? got %lld ids", (long long)n);
    n = tokenizer_encode(t, "\xc3\xa9", 2, 0, 0, ids, 64);
    CHECK(n == 3 && ids[0] == 259 && ids[1] == 3 + 0xC3 && ids[2] == 3 + 0xA9, "\"é\" -> ▁ <0xC3> <0xA9>? got %lld ids",
          (long long)n);
    char buf[64];
    n = tokenizer_encode(t, "ab c\xc3\xa9", 6, 1, 0, ids, 64);
    int64_t dl = tokenizer_decode(t, ids, (size_t)n, 0, buf, sizeof buf);
    CHECK(dl == 6 && !memcmp(buf, "ab c\xc3\xa9", 6), "decode drops the prefix space: '%.*s'", (int)(dl > 0 ? dl : 0),
          buf);
    tokenizer_free(t);
}

static void check_bad(void) {
    gguf_writer *w = gguf_writer_new();
    gguf_w_str(w, "tokenizer.ggml.model", "gpt2");
    tokenizer *t = load_written(w);
    CHECK(t == NULL && strstr(st_error_get(), "tokens"), "no vocabulary: %s", st_error_get());
    w = gguf_writer_new();
    gguf_w_str(w, "tokenizer.ggml.model", "bert");
    const char *one[] = {"a"};
    gguf_w_arr_str(w, "tokenizer.ggml.tokens", one, 1);
    t = load_written(w);
    CHECK(t == NULL && strstr(st_error_get(), "bert"), "unknown model: %s", st_error_get());
}

int main(void) {
    check_bpe();
    check_spm();
    check_bad();
    printf("tokenizer synthetic: 7 BPE pre-tokenizers + default, SentencePiece rules, bad metadata\n");
    return check_report("tokenizer_synth");
}
