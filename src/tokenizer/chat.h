/* Chat formatting with built-in templates, chosen from the model's own
 * tokenizer.chat_template text: ChatML (Qwen, SmolLM), Gemma turns, Llama 3
 * headers. (Rendering the GGUF's Jinja template itself comes with the server.) */
#ifndef STRATA_TOKENIZER_CHAT_H
#define STRATA_TOKENIZER_CHAT_H

#include <stddef.h>

#include "gguf/gguf.h"

typedef enum { CHAT_CHATML, CHAT_GEMMA, CHAT_LLAMA3 } chat_format;

typedef struct {
    const char *role;    /* "system", "user", "assistant" */
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

#endif
