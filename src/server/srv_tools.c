/* Tool calls (srv_tools.h): find the calls a model wrote in its answer and
 * turn them into OpenAI's tool_calls shape; describe tools to models whose
 * template ignores them.
 *
 * The parser is deliberately strict about *what* is a call (the name must be
 * one of the request's functions, the arguments a JSON object) and lenient
 * about *where* (text before the first call is the answer's content; a call
 * cut off before its closing tag still counts once its JSON is whole), since
 * small models often wrap or trail their calls with stray text. */
#include <string.h>

#include "core/alloc.h"
#include "server/srv_tools.h"

static const char *find(const char *s, size_t n, const char *needle) {
    size_t m = strlen(needle);
    if (m == 0 || n < m) return NULL;
    return memmem(s, n, needle, m);
}

tools_family tools_family_of(const char *tmpl, size_t len) {
    if (!tmpl || find(tmpl, len, "<tool_call>")) return TOOLS_TAGGED;
    /* Llama 3.x: "parameters" in the instructions, ipython turns for results */
    if (find(tmpl, len, "\"parameters\"") && (find(tmpl, len, "ipython") || find(tmpl, len, "<|python_tag|>")))
        return TOOLS_LLAMA3;
    return TOOLS_TAGGED;
}

int tools_template_handles(const char *tmpl, size_t len) {
    return tmpl && find(tmpl, len, "tools") != NULL;
}

static int is_space(char c) {
    return c == ' ' || c == '\n' || c == '\t' || c == '\r';
}

/* The function named name among tools, or NULL. */
static const json_t *tool_named(const json_t *tools, const char *name) {
    size_t i;
    json_t *t;
    json_array_foreach((json_t *)tools, i, t) {
        const char *n = json_string_value(json_object_get(json_object_get(t, "function"), "name"));
        if (n && !strcmp(n, name)) return t;
    }
    return NULL;
}

/* One call object -> an OpenAI tool call appended to calls; 0, or -1 when obj is not a call. */
static int add_call(json_t *calls, const json_t *obj, const json_t *tools, const char *id_prefix) {
    if (!json_is_object(obj)) return -1;
    const json_t *fn = json_object_get(obj, "function"); /* {"type":"function","function":{...}} */
    if (json_is_object(fn)) obj = fn;
    const char *name = json_string_value(json_object_get(obj, "name"));
    if (!name || !tool_named(tools, name)) return -1;
    json_t *args = json_object_get(obj, "arguments");
    if (!args) args = json_object_get(obj, "parameters");
    char *text = NULL;
    if (!args || json_is_null(args)) text = strdup("{}");
    else if (json_is_object(args)) text = json_dumps(args, JSON_COMPACT);
    else if (json_is_string(args)) { /* arguments already a JSON string: keep it if it holds an object */
        json_t *p = json_loadb(json_string_value(args), json_string_length(args), 0, NULL);
        if (json_is_object(p)) text = json_dumps(p, JSON_COMPACT);
        json_decref(p);
    }
    if (!text) return -1;
    char id[96];
    snprintf(id, sizeof id, "%s%zu", id_prefix, json_array_size(calls));
    json_array_append_new(calls, json_pack("{s:s, s:s, s:{s:s, s:s}}", "id", id, "type", "function", "function",
                                           "name", name, "arguments", text));
    free(text);
    return 0;
}

/* Parse one JSON value at s (leading space skipped); *used = bytes consumed. */
static json_t *load_prefix(const char *s, size_t n, size_t *used) {
    size_t k = 0;
    while (k < n && is_space(s[k])) k++;
    json_error_t err;
    json_t *v = json_loadb(s + k, n - k, JSON_DISABLE_EOF_CHECK, &err);
    *used = v ? k + (size_t)err.position : 0;
    return v;
}

static json_t *parse_tagged(const char *text, size_t len, const json_t *tools, const char *id_prefix,
                            size_t *content_len) {
    static const char OPEN[] = "<tool_call>", CLOSE[] = "</tool_call>";
    const char *p = find(text, len, OPEN);
    if (!p) return NULL;
    size_t first = (size_t)(p - text);
    json_t *calls = json_array();
    while (p) {
        const char *body = p + strlen(OPEN), *end = text + len;
        size_t used = 0;
        json_t *v = load_prefix(body, (size_t)(end - body), &used);
        if (!v) { /* small models often drop the outer brace before the closing tag: add it once */
            const char *close = find(body, (size_t)(end - body), CLOSE);
            size_t n = (size_t)((close ? close : end) - body);
            char *fixed = st_malloc(n + 2);
            memcpy(fixed, body, n);
            fixed[n] = '}';
            fixed[n + 1] = 0;
            size_t u2;
            v = load_prefix(fixed, n + 1, &u2);
            st_free(fixed);
            if (v) used = n;
        }
        if (v) add_call(calls, v, tools, id_prefix);
        json_decref(v);
        const char *after = body + used;
        const char *close = find(after, (size_t)(end - after), CLOSE);
        after = close ? close + strlen(CLOSE) : end;
        p = find(after, (size_t)(end - after), OPEN);
    }
    if (json_array_size(calls) == 0) {
        json_decref(calls);
        return NULL;
    }
    *content_len = first;
    return calls;
}

/* The whole answer as one call or an array of calls (Llama 3 JSON, and the
 * generic fallback for models that answer a bare object). */
static json_t *parse_bare(const char *text, size_t len, const json_t *tools, const char *id_prefix) {
    size_t k = 0;
    while (k < len && is_space(text[k])) k++;
    static const char TAG[] = "<|python_tag|>";
    if (len - k >= strlen(TAG) && !memcmp(text + k, TAG, strlen(TAG))) k += strlen(TAG);
    while (k < len && is_space(text[k])) k++;
    if (len - k >= 3 && !memcmp(text + k, "```", 3)) { /* a fenced block: skip the fence line */
        const char *nl = memchr(text + k, '\n', len - k);
        if (!nl) return NULL;
        k = (size_t)(nl - text) + 1;
    }
    if (k >= len || (text[k] != '{' && text[k] != '[')) return NULL;
    size_t used;
    json_t *v = load_prefix(text + k, len - k, &used);
    if (!v) return NULL;
    json_t *calls = json_array();
    int bad = 0;
    if (json_is_array(v)) {
        size_t i;
        json_t *o;
        json_array_foreach(v, i, o) bad |= add_call(calls, o, tools, id_prefix) != 0;
    } else
        bad = add_call(calls, v, tools, id_prefix) != 0;
    json_decref(v);
    if (bad || json_array_size(calls) == 0) { /* any non-call in it: it is an answer, not calls */
        json_decref(calls);
        return NULL;
    }
    return calls;
}

json_t *tools_parse(const char *text, size_t len, const json_t *tools, const char *id_prefix, size_t *content_len) {
    *content_len = len;
    if (!text || !json_is_array(tools) || json_array_size(tools) == 0) return NULL;
    json_t *calls = parse_tagged(text, len, tools, id_prefix, content_len);
    if (!calls && (calls = parse_bare(text, len, tools, id_prefix))) *content_len = 0;
    if (calls)
        while (*content_len && is_space(text[*content_len - 1])) (*content_len)--;
    return calls;
}

char *tools_system_prompt(const json_t *tools) {
    static const char HEAD[] =
        "You may call one or more functions to answer the user. The functions are listed as JSON "
        "within <tools></tools> tags:\n<tools>";
    static const char TAIL[] =
        "\n</tools>\n\nTo call a function, answer with a JSON object holding its name and arguments within "
        "<tool_call></tool_call> tags:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": <args-json-object>}\n"
        "</tool_call>";
    size_t cap = sizeof HEAD + sizeof TAIL, i;
    json_t *t;
    char **parts = st_calloc(json_array_size(tools) + 1, sizeof *parts);
    json_array_foreach((json_t *)tools, i, t) {
        parts[i] = json_dumps(t, JSON_COMPACT);
        cap += (parts[i] ? strlen(parts[i]) : 0) + 1;
    }
    char *out = st_malloc(cap);
    strcpy(out, HEAD);
    json_array_foreach((json_t *)tools, i, t) {
        strcat(out, "\n");
        if (parts[i]) strcat(out, parts[i]);
        free(parts[i]);
    }
    strcat(out, TAIL);
    st_free(parts);
    return out;
}
