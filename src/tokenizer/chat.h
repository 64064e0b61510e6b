/* Chat formatting with built-in templates, chosen from the model's own
 * tokenizer.chat_template text: ChatML (Qwen, SmolLM), Gemma turns, Llama 3
 * headers. (Rendering the GGUF's Jinja template itself comes with the server.) */
#ifndef STRATA_TOKENIZER_CHAT_H
#define STRATA_TOKENIZER_CHAT_H

#include <stddef.h>

#include "gguf/gguf.h"

typedef enum { CHAT_CHATML, CHAT_GEMMA, CHAT_LLAMA3 } chat_format;

typedef struct {
    const char *role; /* "system", "user", "assistant" */
    const char *content;
} chat_msg;

/* The format matching the file's tokenizer.chat_template (ChatML if absent). */
chat_format chat_detect(const gguf_file *f);
const char *chat_format_name(chat_format fmt);
/* Render messages, ending with the opening of the assistant's turn when
 * add_generation_prompt. Returns a malloc'd string (st_free). BOS is not
 * included: the tokenizer adds it by the model's rules. */
char *chat_render(chat_format fmt, const chat_msg *msgs, size_t n, int add_generation_prompt);
/* The text that ends an assistant turn in this format (a stop string). */
const char *chat_end_of_turn(chat_format fmt);

/* Render with the file's own Jinja template (tokenizer.chat_template, see
 * jinja.h) as Hugging Face's apply_chat_template would, or with the built-in
 * format of chat_detect() when the file has none (or one this interpreter
 * cannot parse: warned once). messages: JSON array of OpenAI-style messages
 * ({role, content: string or [{type:"text", text}], tool_calls, tool_call_id,
 * reasoning_content, ...}); null-valued keys are dropped as HF does, and
 * tool-call arguments given as a JSON string become an object for templates
 * that print them with tojson. tools: array of {type:"function", function:{...}}
 * or NULL. extra: object of more template variables (enable_thinking, ...) or
 * NULL. tok gives bos_token/eos_token; a BOS the template writes first is
 * removed when tok adds BOS itself (tokenizer_add_bos), so the text is
 * encoded with add_special=1 exactly like chat_render's. Returns malloc'd
 * text (st_free), or NULL + st_error_get() when the template refuses the
 * conversation (raise_exception's message) or fails: answer 400. */
struct json_t;
struct tokenizer;
char *chat_render_template(const gguf_file *f, const struct tokenizer *tok, const struct json_t *messages,
                           const struct json_t *tools, const struct json_t *extra, int add_generation_prompt);

#endif
