/* chat_render_template (chat.h): the GGUF's own chat template rendered by
 * the Jinja interpreter, with the inputs shaped the way Hugging Face shapes
 * them before rendering, and the built-in formats (chat.c) as the fallback.
 *
 * A template is parsed once per distinct text and kept (a server renders the
 * same model's template on every request); the cache holds a few entries
 * under a mutex, and parse failures are remembered too so the warning about
 * falling back is printed once. */
#include <jansson.h>
#include <pthread.h>
#include <string.h>

#include "core/alloc.h"
#include "core/log.h"
#include "tokenizer/chat.h"
#include "tokenizer/jinja.h"
#include "tokenizer/tokenizer.h"

enum { CACHE_N = 4 };

typedef struct {
    char *src; /* the template text, NUL-terminated copy */
    size_t len;
    jinja_tmpl *t; /* NULL: the text did not parse */
    int wants_object_args;
} cache_entry;

static cache_entry g_cache[CACHE_N];
static int g_next;
static pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER;

static int contains(const char *s, size_t n, const char *needle) {
    size_t m = strlen(needle);
    for (size_t i = 0; i + m <= n; i++)
        if (!memcmp(s + i, needle, m)) return 1;
    return 0;
}

/* The parsed template for this text (parsing it the first time), or NULL. */
static const cache_entry *template_for(const char *src, size_t len) {
    pthread_mutex_lock(&g_lock);
    for (int i = 0; i < CACHE_N; i++)
        if (g_cache[i].src && g_cache[i].len == len && !memcmp(g_cache[i].src, src, len)) {
            pthread_mutex_unlock(&g_lock);
            return &g_cache[i];
        }
    cache_entry *e = &g_cache[g_next];
    g_next = (g_next + 1) % CACHE_N;
    /* an evicted entry may still be in use by another thread's render: entries
     * are only replaced after CACHE_N other templates, which a server with one
     * model never reaches; keep the old parse alive rather than race on it */
    e->src = st_malloc(len + 1);
    memcpy(e->src, src, len);
    e->src[len] = 0;
    e->len = len;
    e->t = jinja_parse(src, len);
    if (!e->t) ST_WARN("chat template: %s; using the built-in chat format instead", st_error_get());
    /* Templates that print arguments with tojson or walk their items expect
     * an object (HF's convention: Llama 3.x, Qwen3.5's `arguments|items`,
     * GLM-4.6's `(arguments or {}).items()`, GLM-4.5's `is mapping`); those
     * that concatenate them (DeepSeek) expect the string. */
    static const char *const OBJECT_USES[] = {"arguments | tojson", "arguments|tojson",  "arguments | items",
                                              "arguments|items",    "arguments.items()", "arguments is mapping",
                                              "arguments or {}"};
    e->wants_object_args = 0;
    for (size_t i = 0; i < sizeof OBJECT_USES / sizeof OBJECT_USES[0]; i++)
        e->wants_object_args |= contains(src, len, OBJECT_USES[i]);
    pthread_mutex_unlock(&g_lock);
    return e;
}

/* A copy of the messages as HF passes them: no null-valued keys, and for
 * templates that want them, tool-call arguments parsed from their JSON string. */
static json_t *shape_messages(const json_t *messages, int object_args) {
    json_t *out = json_array();
    size_t i;
    json_t *m;
    json_array_foreach(messages, i, m) {
        if (!json_is_object(m)) {
            json_array_append(out, m);
            continue;
        }
        json_t *c = json_object();
        const char *k;
        json_t *v;
        json_object_foreach(m, k, v) if (!json_is_null(v)) json_object_set_new(c, k, json_deep_copy(v));
        json_t *calls = json_object_get(c, "tool_calls");
        size_t j;
        json_t *call;
        if (object_args && json_is_array(calls)) json_array_foreach(calls, j, call) {
                json_t *fn = json_object_get(call, "function");
                json_t *args = json_object_get(fn, "arguments");
                if (!json_is_string(args)) continue;
                json_t *parsed = json_loadb(json_string_value(args), json_string_length(args), 0, NULL);
                if (json_is_object(parsed)) json_object_set_new(fn, "arguments", parsed);
                else json_decref(parsed);
            }
        json_array_append_new(out, c);
    }
    return out;
}

static json_t *token_text(const tokenizer *tok, int32_t id) {
    size_t len = 0;
    const char *s = tok && id >= 0 ? tokenizer_token_text(tok, id, &len) : NULL;
    return s ? json_stringn(s, len) : json_string("");
}

/* The built-in format: plain text of each message (text parts joined). */
static char *render_builtin(const gguf_file *f, const json_t *messages, int add_generation_prompt) {
    size_t n = json_array_size(messages);
    chat_msg *msgs = st_calloc(n ? n : 1, sizeof *msgs);
    char **owned = st_calloc(n ? n : 1, sizeof *owned);
    for (size_t i = 0; i < n; i++) {
        json_t *m = json_array_get(messages, i), *content = json_object_get(m, "content");
        const char *role = json_string_value(json_object_get(m, "role"));
        msgs[i].role = role ? role : "user";
        if (json_is_string(content)) {
            msgs[i].content = json_string_value(content);
            continue;
        }
        size_t total = 1, j;
        json_t *part;
        json_array_foreach(content, j, part) total += json_string_length(json_object_get(part, "text"));
        owned[i] = st_malloc(total);
        owned[i][0] = 0;
        json_array_foreach(content, j, part) {
            const char *t = json_string_value(json_object_get(part, "text"));
            if (t) strcat(owned[i], t);
        }
        msgs[i].content = owned[i];
    }
    char *text = chat_render(chat_detect(f), msgs, n, add_generation_prompt);
    for (size_t i = 0; i < n; i++) st_free(owned[i]);
    st_free(owned);
    st_free(msgs);
    return text;
}

char *chat_render_template(const gguf_file *f, const tokenizer *tok, const json_t *messages, const json_t *tools,
                           const json_t *extra, int add_generation_prompt) {
    if (!json_is_array(messages)) {
        st_error_set("chat_render_template: messages must be an array");
        return NULL;
    }
    const char *src;
    uint64_t len;
    const cache_entry *e = NULL;
    if (gguf_get_str(f, "tokenizer.chat_template", &src, &len) == 0) e = template_for(src, (size_t)len);
    if (!e || !e->t) return render_builtin(f, messages, add_generation_prompt);

    json_t *ctx = json_object();
    if (json_is_object(extra)) json_object_update(ctx, (json_t *)extra);
    json_object_set_new(ctx, "messages", shape_messages(messages, e->wants_object_args));
    json_object_set_new(ctx, "tools", tools && !json_is_null(tools) ? json_deep_copy(tools) : json_null());
    json_object_set_new(ctx, "documents", json_null());
    json_object_set_new(ctx, "add_generation_prompt", json_boolean(add_generation_prompt));
    json_t *bos = token_text(tok, tok ? tokenizer_bos(tok) : -1);
    json_object_set_new(ctx, "bos_token", bos);
    json_object_set_new(ctx, "eos_token", token_text(tok, tok ? tokenizer_eos(tok) : -1));

    size_t out_len = 0;
    char *text = jinja_render_json_ex(e->t, ctx, NULL, &out_len);
    /* the tokenizer adds BOS itself where the model wants one: drop the template's */
    size_t bl = json_string_length(bos);
    if (text && tok && tokenizer_add_bos(tok) && bl && out_len >= bl && !memcmp(text, json_string_value(bos), bl))
        memmove(text, text + bl, out_len - bl + 1);
    json_decref(ctx);
    return text;
}
