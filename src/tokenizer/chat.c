/* Built-in chat templates (chat.h). Each mirrors what the family's own Jinja
 * template renders for plain text messages. */
#include "tokenizer/chat.h"

#include <string.h>

#include "core/alloc.h"

typedef struct {
    char *s;
    size_t len, cap;
} sbuf;

static void put(sbuf *b, const char *s) {
    size_t n = strlen(s);
    if (b->len + n + 1 > b->cap) {
        b->cap = (b->len + n + 1) * 2;
        b->s = st_realloc(b->s, b->cap);
    }
    memcpy(b->s + b->len, s, n + 1);
    b->len += n;
}

static int has(const char *s, uint64_t len, const char *needle) {
    size_t n = strlen(needle);
    for (uint64_t i = 0; i + n <= len; i++)
        if (!memcmp(s + i, needle, n)) return 1;
    return 0;
}

chat_format chat_detect(const gguf_file *f) {
    const char *t;
    uint64_t len;
    if (gguf_get_str(f, "tokenizer.chat_template", &t, &len) != 0) {
        /* no template in the file: the family's own format */
        if (gguf_get_str(f, "general.architecture", &t, &len) == 0 && len >= 5 && !memcmp(t, "gemma", 5))
            return CHAT_GEMMA;
        return CHAT_CHATML;
    }
    if (has(t, len, "<start_of_turn>")) return CHAT_GEMMA;
    if (has(t, len, "<|start_header_id|>")) return CHAT_LLAMA3;
    return CHAT_CHATML;
}

const char *chat_format_name(chat_format fmt) {
    static const char *names[] = {"chatml", "gemma", "llama3"};
    return names[fmt];
}

const char *chat_end_of_turn(chat_format fmt) {
    static const char *eot[] = {"<|im_end|>", "<end_of_turn>", "<|eot_id|>"};
    return eot[fmt];
}

char *chat_render(chat_format fmt, const chat_msg *msgs, size_t n, int add_generation_prompt) {
    sbuf b = {0};
    put(&b, "");
    size_t i = 0;
    switch (fmt) {
    case CHAT_CHATML:
        for (; i < n; i++) {
            put(&b, "<|im_start|>");
            put(&b, msgs[i].role);
            put(&b, "\n");
            put(&b, msgs[i].content);
            put(&b, "<|im_end|>\n");
        }
        if (add_generation_prompt) put(&b, "<|im_start|>assistant\n");
        break;
    case CHAT_GEMMA: {
        /* Gemma has no system role: the system text opens the first user turn */
        const char *sys = NULL;
        if (n && !strcmp(msgs[0].role, "system")) sys = msgs[i++].content;
        for (; i < n; i++) {
            int user = strcmp(msgs[i].role, "assistant") != 0;
            put(&b, user ? "<start_of_turn>user\n" : "<start_of_turn>model\n");
            if (sys && user) {
                put(&b, sys);
                put(&b, "\n\n");
                sys = NULL;
            }
            put(&b, msgs[i].content);
            put(&b, "<end_of_turn>\n");
        }
        if (add_generation_prompt) put(&b, "<start_of_turn>model\n");
        break;
    }
    case CHAT_LLAMA3:
        for (; i < n; i++) {
            put(&b, "<|start_header_id|>");
            put(&b, msgs[i].role);
            put(&b, "<|end_header_id|>\n\n");
            put(&b, msgs[i].content);
            put(&b, "<|eot_id|>");
        }
        if (add_generation_prompt) put(&b, "<|start_header_id|>assistant<|end_header_id|>\n\n");
        break;
    }
    return b.s;
}
