/* Tokenizer: text <-> token ids, built from a GGUF file's tokenizer.* metadata.
 *
 * Two model families cover the GGUF files we run:
 *   - byte-level BPE (`tokenizer.ggml.model` = "gpt2"): a regex pre-tokenizer
 *     chosen by `tokenizer.ggml.pre` cuts text into words, then ranked merges
 *     join bytes into tokens (GPT-2, Llama 3, Qwen 2, SmolLM, DeepSeek V3, ...);
 *   - SentencePiece BPE (`tokenizer.ggml.model` = "llama"): spaces become U+2581,
 *     pieces are joined by score, characters with no piece fall back to
 *     <0xXX> byte tokens (Llama 1/2, Gemma).
 * Control and user-defined tokens ("<|im_start|>", "<start_of_turn>", Gemma's
 * "\n" and runs of spaces) are cut out of the text first, longest match, so
 * they are never split. Control tokens are only recognised when the caller
 * asks for it (parse_special): text from a user must not forge them.
 *
 * A tokenizer is immutable after tokenizer_load and may be shared by threads.
 * It copies what it needs, so the gguf_file may be closed afterwards.
 */
#ifndef STRATA_TOKENIZER_TOKENIZER_H
#define STRATA_TOKENIZER_TOKENIZER_H

#include <stddef.h>
#include <stdint.h>

#include "../gguf/gguf.h"

typedef struct tokenizer tokenizer;

typedef enum { TOK_MODEL_BPE = 1, TOK_MODEL_SPM = 2 } tok_model;

/* Token types as GGUF stores them in tokenizer.ggml.token_type. */
typedef enum {
    TOK_TYPE_NORMAL = 1,
    TOK_TYPE_UNKNOWN = 2,
    TOK_TYPE_CONTROL = 3,
    TOK_TYPE_USER_DEFINED = 4,
    TOK_TYPE_UNUSED = 5,
    TOK_TYPE_BYTE = 6,
} tok_type;

/* Build from the file's metadata. NULL with st_error_get() naming the problem
 * (no vocabulary, an unknown model or pre-tokenizer, a bad id, ...). */
tokenizer *tokenizer_load(const gguf_file *f);
void tokenizer_free(tokenizer *t);

tok_model tokenizer_model(const tokenizer *t);
const char *tokenizer_pre(const tokenizer *t); /* pre-tokenizer name ("smollm", "default", ...) */
int32_t tokenizer_n_vocab(const tokenizer *t);

/* Text to ids. add_special: put BOS/EOS around the text where the model's
 * rules say so (tokenizer.ggml.add_bos_token / add_eos_token). parse_special:
 * recognise control-token strings in the text; user-defined tokens are
 * always recognised. Writes at most max ids and returns how many the text
 * needs (call again with a bigger buffer if that is > max), or -1 with
 * st_error_get() on invalid UTF-8 in the text. */
int64_t tokenizer_encode(const tokenizer *t, const char *text, size_t len, int add_special, int parse_special,
                         int32_t *out_ids, int64_t max);

/* The token's vocabulary string as stored (byte-level alphabet for BPE, U+2581
 * for spaces in SentencePiece). NULL for an id out of range. */
const char *tokenizer_token_text(const tokenizer *t, int32_t id, size_t *len);
tok_type tokenizer_token_type(const tokenizer *t, int32_t id);

/* The bytes a token stands for in output text. Control tokens give their
 * text when render_special, nothing otherwise. A piece may be part of a UTF-8
 * character (byte tokens, byte-level BPE). Returns the piece length and
 * copies min(len, cap) bytes; -1 for an id out of range. */
int64_t tokenizer_token_to_piece(const tokenizer *t, int32_t id, int render_special, char *buf, size_t cap);

/* Ids to text: the pieces concatenated (SentencePiece models with a space
 * prefix drop the first leading space). Returns the text length and copies
 * min(len, cap) bytes, NUL-terminated when there is room; -1 for a bad id.
 * The result can hold invalid UTF-8 when the ids do; see tok_stream. */
int64_t tokenizer_decode(const tokenizer *t, const int32_t *ids, size_t n, int render_special, char *out, size_t cap);

/* Special ids: -1 when the model has none. */
int32_t tokenizer_bos(const tokenizer *t);
int32_t tokenizer_eos(const tokenizer *t);
int32_t tokenizer_eot(const tokenizer *t); /* end of turn: <|im_end|>, <end_of_turn>, ... */
int tokenizer_add_bos(const tokenizer *t);
/* End of generation: EOS, EOT, or another end token the vocabulary has. */
int tokenizer_is_eog(const tokenizer *t, int32_t id);
/* Id of a token by exact vocabulary text, or -1. */
int32_t tokenizer_find(const tokenizer *t, const char *text, size_t len);

/* Streaming detokenizer: feed generated ids one at a time and get text that
 * is always whole UTF-8 characters. Bytes of a character that is not complete
 * yet are held back until the next token completes it; bytes that can never
 * form a character become U+FFFD. */
typedef struct tok_stream tok_stream;

tok_stream *tok_stream_new(const tokenizer *t, int render_special);
void tok_stream_free(tok_stream *s);
/* Append token id; *out points to the text now ready (valid until the next
 * call), *len its length (possibly 0). Returns 0, or -1 for a bad id. */
int tok_stream_push(tok_stream *s, int32_t id, const char **out, size_t *len);
/* End of the stream: whatever is held back, as U+FFFD for each broken sequence. */
void tok_stream_flush(tok_stream *s, const char **out, size_t *len);
void tok_stream_reset(tok_stream *s);

/* UTF-8 helpers shared with the server and tests. */
/* 1 if buf[0..len) is valid UTF-8 (no overlongs, surrogates or values past U+10FFFF). */
int tok_utf8_valid(const char *buf, size_t len);

#endif
