/* Tool calls (srv_tools.h): find the calls a model wrote in its answer and
 * turn them into OpenAI's tool_calls shape; describe tools to models whose
 * template ignores them.
 *
 * The parser is deliberately strict about *what* is a call (the name must be
 * one of the request's functions, the arguments a JSON object) and lenient
 * about *where* (text before the first call is the answer's content; a call
 * cut off before its closing tag still counts once its JSON is whole), since
 * small models often wrap or trail their calls with stray text.
 *
 * DeepSeek's calls are read in their own markers (not converted to the
 * `<tool_call>` form first): a block that turns out to hold no call is then
 * the answer's text as the model wrote it, markers and all. */
#include <string.h>

#include "core/alloc.h"
#include "server/srv_tools.h"

static const char *find(const char *s, size_t n, const char *needle) {
    size_t m = strlen(needle);
    if (m == 0 || n < m) return NULL;
    return memmem(s, n, needle, m);
}

tools_family tools_family_of(const char *tmpl, size_t len) {
    if (!tmpl) return TOOLS_TAGGED;
    if (find(tmpl, len, "<function=") && find(tmpl, len, "<parameter=")) return TOOLS_XML; /* Qwen3.5, Qwen3-Coder */
    if (find(tmpl, len, "<arg_key>")) return TOOLS_GLM;
    /* DeepSeek: V3 and R1 write `function<｜tool▁sep｜>NAME` and the arguments in a ```json fence, V3.1
     * `NAME<｜tool▁sep｜>` and the bare arguments */
    if (find(tmpl, len, TOOLS_DS_SEP)) return find(tmpl, len, "```json") ? TOOLS_DEEPSEEK : TOOLS_DEEPSEEK31;
    if (find(tmpl, len, "<tool_call>")) return TOOLS_TAGGED;
    /* Llama 3.x: "parameters" in the instructions, ipython turns for results */
    if (find(tmpl, len, "\"parameters\"") && (find(tmpl, len, "ipython") || find(tmpl, len, "<|python_tag|>")))
        return TOOLS_LLAMA3;
    return TOOLS_TAGGED;
}

int tools_template_handles(const char *tmpl, size_t len) { return tmpl && find(tmpl, len, "tools") != NULL; }

int tools_template_calls(const char *tmpl, size_t len) { return tmpl && find(tmpl, len, "tool_calls") != NULL; }

static int is_space(char c) { return c == ' ' || c == '\n' || c == '\t' || c == '\r'; }

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
    json_array_append_new(calls, json_pack("{s:s, s:s, s:{s:s, s:s}}", "id", id, "type", "function", "function", "name",
                                           name, "arguments", text));
    free(text);
    return 0;
}

/* ---- markup calls (TOOLS_XML, TOOLS_GLM): text values typed by the schema ---- */

int tools_typed_string(const json_t *prop) {
    const json_t *t = json_object_get(prop, "type");
    if (json_is_string(t)) return !strcmp(json_string_value(t), "string");
    size_t i;
    json_t *x;
    int str = 0, other = 0;
    json_array_foreach((json_t *)t, i, x) {
        const char *v = json_string_value(x);
        if (v && !strcmp(v, "string")) str = 1;
        else if (!v || strcmp(v, "null")) other = 1;
    }
    return str && !other;
}

/* A value's text as the call's JSON: a string where the schema says so, else JSON when it reads as JSON,
 * else a string. NULL when the text is no UTF-8. */
static json_t *markup_value(const json_t *tool, const char *key, const char *v, size_t n) {
    const json_t *fn = json_object_get(tool, "function");
    if (!tools_typed_string(json_object_get(json_object_get(json_object_get(fn, "parameters"), "properties"), key))) {
        json_t *j = json_loadb(v, n, JSON_DECODE_ANY, NULL);
        if (j) return j;
    }
    return json_stringn(v, n);
}

/* Skips space, then lit: 1 and *p past it; 0 when the text differs, -1 when it ends
 * before it could (space only, or a beginning of lit); *p moves only on 1. */
static int take(const char **p, const char *end, const char *lit) {
    const char *q = *p;
    while (q < end && is_space(*q)) q++;
    const size_t L = strlen(lit), m = (size_t)(end - q);
    if (memcmp(q, lit, m < L ? m : L)) return 0;
    if (m < L) return -1;
    *p = q + L;
    return 1;
}

/* A markup call after `<tool_call>`, in s[0..n): {"name", "arguments"} when
 * it is a whole call of one of tools, *used then the bytes it took (to
 * `</function>`, or GLM's last `</arg_value>`), else NULL. *more: the text
 * ended where more of the call could follow (with a call: a GLM call that
 * may take more arguments; without one: a call not yet whole). */
static json_t *parse_markup(const char *s, size_t n, const json_t *tools, size_t *used, int *more) {
    const char *p = s, *end = s + n, *nb, *ne;
    *more = 0;
    const int xml = take(&p, end, "<function=");
    if (xml < 0) return *more = 1, NULL;
    if (xml) { /* <function=NAME> */
        nb = p;
        if (!(ne = memchr(p, '>', (size_t)(end - p)))) return *more = 1, NULL;
        p = ne + 1;
    } else { /* NAME, up to the line's end or the first tag */
        while (p < end && is_space(*p)) p++;
        for (nb = ne = p; ne < end && *ne != '\n' && *ne != '<';) ne++;
        if (ne == end) return *more = 1, NULL;
        p = ne;
        while (ne > nb && is_space(ne[-1])) ne--;
    }
    char name[128];
    if (ne == nb || (size_t)(ne - nb) >= sizeof name) return NULL;
    memcpy(name, nb, (size_t)(ne - nb));
    name[ne - nb] = 0;
    const json_t *tool = tool_named(tools, name);
    if (!tool) return NULL;
    json_t *args = json_object();
    for (;;) {
        const char *kb, *ke, *vb, *ve;
        int t;
        if (xml) { /* <parameter=KEY>\nVALUE\n</parameter>, until </function> */
            if ((t = take(&p, end, "</function>")) > 0) break;
            if (t < 0 || (t = take(&p, end, "<parameter=")) < 0) goto short_;
            if (!t) goto bad;
            if (!(ke = memchr(kb = p, '>', (size_t)(end - p)))) goto short_;
            vb = ke + 1;
            if (!(ve = find(vb, (size_t)(end - vb), "</parameter>"))) goto short_;
            p = ve + strlen("</parameter>");
            if (vb < ve && *vb == '\n') vb++; /* the template's newlines around the value */
            if (ve > vb && ve[-1] == '\n') ve--;
        } else { /* <arg_key>KEY</arg_key> <arg_value>VALUE</arg_value>, while a key follows */
            if ((t = take(&p, end, "<arg_key>")) <= 0) {
                *more = t < 0;
                break;
            }
            if (!(ke = find(kb = p, (size_t)(end - p), "</arg_key>"))) goto short_;
            p = ke + strlen("</arg_key>");
            if ((t = take(&p, end, "<arg_value>")) <= 0) {
                if (t < 0) goto short_;
                goto bad;
            }
            if (!(ve = find(vb = p, (size_t)(end - p), "</arg_value>"))) goto short_;
            p = ve + strlen("</arg_value>");
        }
        char key[128];
        if (ke == kb || (size_t)(ke - kb) >= sizeof key) goto bad;
        memcpy(key, kb, (size_t)(ke - kb));
        key[ke - kb] = 0;
        json_t *v = markup_value(tool, key, vb, (size_t)(ve - vb));
        if (!v) goto bad;
        json_object_set_new(args, key, v);
    }
    *used = (size_t)(p - s);
    return json_pack("{s:s, s:o}", "name", name, "arguments", args);
short_:
    *more = 1;
bad:
    json_decref(args);
    return NULL;
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
        const char *body = p + strlen(OPEN), *end = text + len, *b = body;
        while (b < end && is_space(*b)) b++;
        if (b < end && *b != '{') { /* markup: read in order (a value may hold the closing tag) */
            size_t used = 0;
            int more;
            json_t *v = parse_markup(body, (size_t)(end - body), tools, &used, &more);
            if (v) add_call(calls, v, tools, id_prefix);
            json_decref(v);
            const char *after = body + used, *close = find(after, (size_t)(end - after), CLOSE);
            after = close ? close + strlen(CLOSE) : end;
            p = find(after, (size_t)(end - after), OPEN);
            continue;
        }
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

/* ---- DeepSeek's calls (TOOLS_DEEPSEEK, TOOLS_DEEPSEEK31: either shape, whatever the family) ---- */

#define DS_NAME_MAX 128 /* a head whose name runs longer is no head */

/* A DeepSeek call's head in s[0..n), space first: an optional <｜tool▁call▁begin｜>, then V3's
 * `TYPE<｜tool▁sep｜>NAME\n` and an optional ```json fence line, or V3.1's `NAME<｜tool▁sep｜>` before a `{`
 * (the arguments tell the shapes apart). 1 with the name and *used the bytes to the arguments' `{`; 0 when
 * the text ends before that is known; -1 when it is no head. */
static int ds_head(const char *s, size_t n, char *name, size_t cap, size_t *used) {
    const char *p = s, *end = s + n;
    const size_t L = strlen(TOOLS_DS_SEP);
    if (take(&p, end, TOOLS_DS_CALL_BEGIN) < 0) return 0;
    while (p < end && is_space(*p)) p++;
    const char *x = p, *sep = NULL; /* the text before the separator: V3's type, V3.1's name */
    for (; p < end && !sep; p++) {
        const size_t m = (size_t)(end - p);
        if (*p == '<') {
            if (memcmp(p, TOOLS_DS_SEP, m < L ? m : L)) return -1; /* another tag */
            if (m < L) return 0;
            sep = p;
        } else if (*p == '\n' || p - x >= DS_NAME_MAX) return -1;
    }
    if (!sep) return 0;
    const char *nb = x, *ne = sep, *q = sep + L;
    while (q < end && is_space(*q)) q++;
    if (q == end) return 0;
    if (*q != '{') { /* V3: the name to the line's end, then perhaps a fence */
        nb = q;
        if (!(ne = memchr(q, '\n', (size_t)(end - q)))) return end - q < DS_NAME_MAX ? 0 : -1;
        for (q = ne + 1; q < end && is_space(*q);) q++;
        if (q < end && *q == '`') {
            const size_t m = (size_t)(end - q);
            if (memcmp(q, "```", m < 3 ? m : 3)) return -1;
            const char *nl = memchr(q, '\n', m);
            if (!nl) return m < 32 ? 0 : -1;
            for (q = nl + 1; q < end && is_space(*q);) q++;
        }
        if (q == end) return 0;
        if (*q != '{') return -1;
    }
    while (ne > nb && is_space(ne[-1])) ne--;
    if (ne == nb || (size_t)(ne - nb) >= cap) return -1;
    memcpy(name, nb, (size_t)(ne - nb));
    name[ne - nb] = 0;
    *used = (size_t)(q - s);
    return 1;
}

/* The calls of DeepSeek blocks from p (inside a block: just past <｜tool▁calls▁begin｜> or a call's
 * <｜tool▁call▁end｜>) to end, appended to calls: each call in turn to the block's end (one that is no call
 * is skipped to its <｜tool▁call▁end｜>; one cut at the end counts once its JSON is whole), then the next
 * block's. The streaming parser decides held-back text inside a block with it too. */
static void ds_calls(const char *p, const char *end, const json_t *tools, const char *id_prefix, json_t *calls) {
    while (p) {
        const char *q = p;
        if (take(&q, end, TOOLS_DS_CALLS_END) > 0) { /* the block's end: only another block may follow */
            p = find(q, (size_t)(end - q), TOOLS_DS_CALLS_BEGIN);
            if (p) p += strlen(TOOLS_DS_CALLS_BEGIN);
            continue;
        }
        char name[DS_NAME_MAX];
        size_t used = 0, u2 = 0;
        const char *after = p;
        json_t *args = ds_head(p, (size_t)(end - p), name, sizeof name, &used) == 1
                           ? load_prefix(p + used, (size_t)(end - p) - used, &u2)
                           : NULL;
        if (args) {
            json_t *call = json_pack("{s:s, s:o}", "name", name, "arguments", args);
            add_call(calls, call, tools, id_prefix);
            json_decref(call);
            after = p + used + u2;
        }
        const char *ce = find(after, (size_t)(end - after), TOOLS_DS_CALL_END);
        p = ce ? ce + strlen(TOOLS_DS_CALL_END) : NULL;
    }
}

static json_t *parse_deepseek(const char *text, size_t len, const json_t *tools, const char *id_prefix,
                              size_t *content_len) {
    const char *b = find(text, len, TOOLS_DS_CALLS_BEGIN);
    if (!b) return NULL;
    json_t *calls = json_array();
    ds_calls(b + strlen(TOOLS_DS_CALLS_BEGIN), text + len, tools, id_prefix, calls);
    if (json_array_size(calls) == 0) {
        json_decref(calls);
        return NULL;
    }
    *content_len = (size_t)(b - text);
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
    } else bad = add_call(calls, v, tools, id_prefix) != 0;
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
    /* tagged or DeepSeek blocks, whichever opens first (the other when those hold no call) */
    const char *t = find(text, len, "<tool_call>"), *d = find(text, len, TOOLS_DS_CALLS_BEGIN);
    json_t *calls;
    if (d && (!t || d < t)) {
        if (!(calls = parse_deepseek(text, len, tools, id_prefix, content_len)))
            calls = parse_tagged(text, len, tools, id_prefix, content_len);
    } else if (!(calls = parse_tagged(text, len, tools, id_prefix, content_len)))
        calls = parse_deepseek(text, len, tools, id_prefix, content_len);
    if (!calls && (calls = parse_bare(text, len, tools, id_prefix))) *content_len = 0;
    if (calls)
        while (*content_len && is_space(text[*content_len - 1])) (*content_len)--;
    return calls;
}

char *tools_system_prompt(const json_t *tools, tools_family fam) {
    static const char HEAD[] =
        "You may call one or more functions to answer the user. The functions are listed as JSON "
        "within <tools></tools> tags:\n<tools>";
    static const char TAGGED[] =
        "\n</tools>\n\nTo call a function, answer with a JSON object holding its name and arguments within "
        "<tool_call></tool_call> tags:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": <args-json-object>}\n"
        "</tool_call>";
    /* DeepSeek's own shapes, as its templates write earlier calls */
    static const char DS_V3[] =
        "\n</tools>\n\nTo call a function, answer in this format, its arguments a JSON object:\n" TOOLS_DS_CALLS_BEGIN
            TOOLS_DS_CALL_BEGIN "function" TOOLS_DS_SEP
        "<function-name>\n```json\n<args-json-object>\n```" TOOLS_DS_CALL_END TOOLS_DS_CALLS_END
        "\nFor several calls, write one " TOOLS_DS_CALL_BEGIN "..." TOOLS_DS_CALL_END
        " after another, a newline between them.";
    static const char DS_V31[] =
        "\n</tools>\n\nTo call a function, answer in this format, its arguments a JSON "
        "object:\n" TOOLS_DS_CALLS_BEGIN TOOLS_DS_CALL_BEGIN "<function-name>" TOOLS_DS_SEP
        "<args-json-object>" TOOLS_DS_CALL_END TOOLS_DS_CALLS_END "\nFor several calls, write one " TOOLS_DS_CALL_BEGIN
        "..." TOOLS_DS_CALL_END " after another, with nothing between them.";
    const char *TAIL = fam == TOOLS_DEEPSEEK ? DS_V3 : fam == TOOLS_DEEPSEEK31 ? DS_V31 : TAGGED;
    size_t cap = sizeof HEAD + strlen(TAIL) + 1, i;
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

/* ---- streaming (srv_tools.h tools_stream) ---- */

enum {
    TS_TEXT,    /* the answer's content, until a call opens */
    TS_HEAD,    /* after `<tool_call>`: the call's head */
    TS_ARGS,    /* a call's JSON arguments, sent as they come */
    TS_AFTER,   /* after calls: only another block of the same kind counts */
    TS_BLOCK,   /* a markup call, sent whole once read */
    TS_DS_HEAD, /* in a DeepSeek block: a call's head, or the block's end */
    TS_DS_NEXT, /* in a DeepSeek block, after a call's arguments: up to its <｜tool▁call▁end｜> */
    TS_OPAQUE,  /* held to the end, decided there */
};

struct tools_stream {
    const json_t *tools;
    tools_family fam;
    char prefix[96];
    tools_stream_cb cb;
    void *ctx;
    int state, n_calls;
    char *all; /* every byte fed (for the decision at the end) */
    size_t all_len, all_cap;
    size_t pos;       /* all[0..pos) is decided: sent, or dropped */
    size_t opaque_at; /* TS_OPAQUE: where the undecided text begins */
    size_t tag_at;    /* where the last call opening began (a <tool_call> tag, a DeepSeek block) */
    int content_sent; /* content went out (a bare answer can no longer be a call) */
    int ds;           /* the calls are in DeepSeek blocks (else in `<tool_call>` tags) */
    size_t sent_to;   /* content went out up to here (it is all[0..sent_to) less what was dropped) */
    /* TS_ARGS: the JSON value being read */
    int depth, in_str, esc, started;
};

tools_stream *tools_stream_new(const json_t *tools, tools_family fam, const char *id_prefix, const tools_stream_cb *cb,
                               void *ctx) {
    tools_stream *ts = st_calloc(1, sizeof *ts);
    ts->tools = tools;
    ts->fam = fam;
    snprintf(ts->prefix, sizeof ts->prefix, "%s", id_prefix);
    ts->cb = *cb;
    ts->ctx = ctx;
    return ts;
}

void tools_stream_free(tools_stream *ts) {
    if (!ts) return;
    st_free(ts->all);
    st_free(ts);
}

static const char TAG_OPEN[] = "<tool_call>", PY_TAG[] = "<|python_tag|>";

static void send_content(tools_stream *ts, size_t a, size_t b) {
    if (b > a) {
        ts->cb.content(ts->ctx, ts->all + a, b - a);
        ts->content_sent = 1;
        ts->sent_to = b;
    }
}

/* The call's head in s[0..n): `{"name": "NAME", "arguments": ` (or "parameters"), space anywhere between
 * tokens. 1 with the name and the bytes it took, 0 when more text is needed, -1 when it is not one. */
static int match_head(const char *s, size_t n, char *name, size_t cap, size_t *used) {
    size_t i = 0;
#define WS()                                                                                                           \
    while (i < n && is_space(s[i])) i++
#define NEED(lit)                                                                                                      \
    do {                                                                                                               \
        size_t L_ = strlen(lit);                                                                                       \
        for (size_t k_ = 0; k_ < L_; k_++, i++) {                                                                      \
            if (i >= n) return 0;                                                                                      \
            if (s[i] != (lit)[k_]) return -1;                                                                          \
        }                                                                                                              \
    } while (0)
    WS();
    NEED("{");
    WS();
    NEED("\"name\"");
    WS();
    NEED(":");
    WS();
    NEED("\"");
    size_t k = 0;
    for (;; i++) {
        if (i >= n) return 0;
        if (s[i] == '"') break;
        if (s[i] == '\\' || k + 1 >= cap) return -1; /* names need no escapes (srv_check_tools) */
        name[k++] = s[i];
    }
    name[k] = 0;
    i++;
    WS();
    NEED(",");
    WS();
    NEED("\"");
    size_t key = i;
    while (i < n && s[i] != '"') i++;
    if (i >= n) return i - key > 10 ? -1 : 0;
    if (!((i - key == 9 && !memcmp(s + key, "arguments", 9)) || (i - key == 10 && !memcmp(s + key, "parameters", 10))))
        return -1;
    i++;
    WS();
    NEED(":");
    WS();
    if (i >= n) return 0; /* the value's first byte decides below */
    *used = i;
    return 1;
#undef WS
#undef NEED
}

/* Length of the longest tail of s[0..n) that is a proper beginning of lit. */
static size_t partial(const char *s, size_t n, const char *lit) {
    const size_t L = strlen(lit);
    for (size_t k = n < L - 1 ? n : L - 1; k > 0; k--)
        if (!memcmp(s + n - k, lit, k)) return k;
    return 0;
}

/* How much of s[0..n) can go out as content now: all but a tail that may begin a call's opening (the tag,
 * DeepSeek's block) or trail space. */
static size_t safe_content(const char *s, size_t n) {
    size_t keep = partial(s, n, TAG_OPEN), k = partial(s, n, TOOLS_DS_CALLS_BEGIN);
    if (k > keep) keep = k;
    size_t end = n - keep;
    while (end > 0 && is_space(s[end - 1])) end--; /* space before a call is not content */
    return end;
}

/* A call's head was read (used bytes from ts->pos, naming one of the tools): announce it, its arguments next. */
static void stream_call_begin(tools_stream *ts, const char *name, size_t used) {
    char id[128];
    snprintf(id, sizeof id, "%s%d", ts->prefix, ts->n_calls);
    ts->cb.call_begin(ts->ctx, ts->n_calls, id, name);
    ts->n_calls++;
    ts->pos += used;
    ts->state = TS_ARGS;
    ts->depth = ts->in_str = ts->esc = ts->started = 0;
}

/* One parsed call (tools_parse's shape) goes out whole. */
static void send_call(tools_stream *ts, const json_t *call) {
    const json_t *fn = json_object_get(call, "function");
    const char *args = json_string_value(json_object_get(fn, "arguments"));
    char id[128];
    snprintf(id, sizeof id, "%s%d", ts->prefix, ts->n_calls);
    ts->cb.call_begin(ts->ctx, ts->n_calls, id, json_string_value(json_object_get(fn, "name")));
    ts->cb.call_args(ts->ctx, ts->n_calls, args, strlen(args));
    ts->cb.call_end(ts->ctx, ts->n_calls);
    ts->n_calls++;
}

static void step(tools_stream *ts) {
    for (;;) {
        const char *s = ts->all + ts->pos;
        size_t n = ts->all_len - ts->pos;
        switch (ts->state) {
        case TS_TEXT: {
            if (!ts->content_sent) { /* a bare JSON answer may be a call */
                size_t k = 0, L = strlen(PY_TAG);
                while (k < n && is_space(s[k])) k++;
                if (k == n) return; /* only space so far */
                const char *r = s + k;
                size_t m = n - k;
                if (ts->fam == TOOLS_LLAMA3) {
                    if (m < L && !memcmp(r, PY_TAG, m)) return; /* maybe the python tag: wait */
                    if (m >= L && !memcmp(r, PY_TAG, L)) {
                        ts->pos += k + L;
                        ts->state = TS_HEAD;
                        continue;
                    }
                    if (*r == '{') { /* Llama 3: the call's head */
                        ts->pos += k;
                        ts->state = TS_HEAD;
                        continue;
                    }
                }
                if (*r == '{' || *r == '[' || *r == '`') { /* JSON (perhaps fenced): decided at the end */
                    ts->state = TS_OPAQUE;
                    ts->opaque_at = ts->pos;
                    continue;
                }
            }
            /* the first opening of a call: the tag or DeepSeek's block */
            const char *tag = ts->fam != TOOLS_LLAMA3 ? find(s, n, TAG_OPEN) : NULL;
            const char *dsb = ts->fam != TOOLS_LLAMA3 ? find(s, n, TOOLS_DS_CALLS_BEGIN) : NULL;
            if (dsb && (!tag || dsb < tag)) tag = dsb;
            if (tag) {
                size_t end = (size_t)(tag - s);
                while (end > 0 && is_space(s[end - 1])) end--;
                send_content(ts, ts->pos, ts->pos + end);
                ts->ds = tag == dsb;
                ts->tag_at = ts->pos + (size_t)(tag - s);
                ts->pos += (size_t)(tag - s) + strlen(ts->ds ? TOOLS_DS_CALLS_BEGIN : TAG_OPEN);
                ts->state = ts->ds ? TS_DS_HEAD : TS_HEAD;
                continue;
            }
            size_t ok = ts->fam != TOOLS_LLAMA3 ? safe_content(s, n) : n;
            send_content(ts, ts->pos, ts->pos + ok);
            ts->pos += ok;
            return;
        }
        case TS_HEAD: {
            size_t k = 0;
            while (k < n && is_space(s[k])) k++;
            if (k == n) return;
            if (s[k] != '{') { /* a markup call: whole at its closing tag */
                ts->state = TS_BLOCK;
                continue;
            }
            char name[80];
            size_t used = 0;
            int r = match_head(s, n, name, sizeof name, &used);
            if (r == 0) return;
            if (r < 0 || !tool_named(ts->tools, name) || s[used] != '{') {
                ts->state = TS_OPAQUE;
                ts->opaque_at = ts->pos;
                continue;
            }
            stream_call_begin(ts, name, used);
            continue;
        }
        case TS_ARGS: {
            size_t i = 0;
            int done = 0;
            for (; i < n && !done; i++) {
                char c = s[i];
                if (ts->in_str) {
                    if (ts->esc) ts->esc = 0;
                    else if (c == '\\') ts->esc = 1;
                    else if (c == '"') ts->in_str = 0;
                } else if (c == '"') ts->in_str = 1;
                else if (c == '{' || c == '[') ts->depth++;
                else if ((c == '}' || c == ']') && --ts->depth == 0) done = 1;
            }
            if (i) ts->cb.call_args(ts->ctx, ts->n_calls - 1, s, i);
            ts->pos += i;
            if (!done) return;
            ts->cb.call_end(ts->ctx, ts->n_calls - 1);
            ts->state = ts->ds ? TS_DS_NEXT : TS_AFTER;
            continue;
        }
        case TS_AFTER: { /* after a call only further calls count (as tools_parse reads a whole answer) */
            const char *open = ts->ds ? TOOLS_DS_CALLS_BEGIN : TAG_OPEN;
            const char *tag = ts->fam != TOOLS_LLAMA3 ? find(s, n, open) : NULL;
            if (!tag) {
                size_t L = strlen(open), keep = n < L ? n : L - 1;
                ts->pos += n - keep;
                return;
            }
            ts->tag_at = ts->pos + (size_t)(tag - s);
            ts->pos += (size_t)(tag - s) + strlen(open);
            ts->state = ts->ds ? TS_DS_HEAD : TS_HEAD;
            continue;
        }
        case TS_DS_HEAD: { /* the block's end, or a call (as ds_calls reads it) */
            const char *q = s;
            int t = take(&q, s + n, TOOLS_DS_CALLS_END);
            if (t < 0) return;
            if (t > 0 && !ts->n_calls) { /* a block without calls: the end decides, as tools_parse reads it */
                ts->state = TS_OPAQUE;
                ts->opaque_at = ts->tag_at;
                continue;
            }
            if (t > 0) {
                ts->pos += (size_t)(q - s);
                ts->state = TS_AFTER;
                continue;
            }
            char name[DS_NAME_MAX];
            size_t used = 0;
            int r = ds_head(s, n, name, sizeof name, &used);
            if (r == 0) return;
            if (r < 0 || !tool_named(ts->tools, name)) { /* not a call: this and what follows decided at the end */
                ts->state = TS_OPAQUE;
                ts->opaque_at = ts->pos;
                continue;
            }
            stream_call_begin(ts, name, used);
            continue;
        }
        case TS_DS_NEXT: { /* what follows the arguments (V3's fence) to the call's end is dropped */
            const char *ce = find(s, n, TOOLS_DS_CALL_END);
            if (!ce) {
                ts->pos += n - partial(s, n, TOOLS_DS_CALL_END);
                return;
            }
            ts->pos += (size_t)(ce - s) + strlen(TOOLS_DS_CALL_END);
            ts->state = TS_DS_HEAD;
            continue;
        }
        case TS_BLOCK: {
            size_t used = 0;
            int more;
            json_t *v = parse_markup(s, n, ts->tools, &used, &more), *calls = json_array();
            if (v) add_call(calls, v, ts->tools, "");
            json_decref(v);
            if (more) { /* wait for the rest (or the end) */
                json_decref(calls);
                return;
            }
            if (json_array_size(calls) == 0) { /* not a call: decided at the end with what follows */
                ts->state = TS_OPAQUE;
                ts->opaque_at = ts->tag_at;
            } else {
                send_call(ts, json_array_get(calls, 0));
                ts->pos += used;
                ts->state = TS_AFTER;
            }
            json_decref(calls);
            continue;
        }
        default: /* TS_OPAQUE: held to the end */ return;
        }
    }
}

void tools_stream_feed(tools_stream *ts, const char *text, size_t len) {
    if (ts->all_len + len + 1 > ts->all_cap) {
        ts->all_cap = (ts->all_len + len + 1) * 2;
        ts->all = st_realloc(ts->all, ts->all_cap);
    }
    memcpy(ts->all + ts->all_len, text, len);
    ts->all_len += len;
    ts->all[ts->all_len] = 0;
    step(ts);
}

int tools_stream_end(tools_stream *ts) {
    if (ts->state == TS_ARGS) ts->cb.call_end(ts->ctx, ts->n_calls - 1); /* cut short (max_tokens) */
    else if (ts->state == TS_OPAQUE || ts->state == TS_HEAD || ts->state == TS_BLOCK || ts->state == TS_DS_HEAD) {
        /* decide the held text as a whole answer would be: calls after those sent, or content */
        size_t at = ts->n_calls == 0         ? 0
                    : ts->state == TS_OPAQUE ? ts->opaque_at
                    : ts->state == TS_BLOCK  ? ts->tag_at
                                             : ts->pos;
        size_t clen = 0;
        json_t *calls;
        if (ts->n_calls && ts->ds) { /* inside a DeepSeek block: its further calls */
            calls = json_array();
            ds_calls(ts->all + at, ts->all + ts->all_len, ts->tools, "", calls);
        } else calls = tools_parse(ts->all + at, ts->all_len - at, ts->tools, "", &clen);
        if (calls) {
            if (ts->n_calls == 0) send_content(ts, ts->sent_to, clen > ts->sent_to ? clen : ts->sent_to);
            size_t i;
            json_t *c;
            json_array_foreach(calls, i, c) send_call(ts, c);
            json_decref(calls);
        } else if (ts->n_calls == 0)
            send_content(ts, ts->sent_to, ts->all_len); /* no call after all: all of it was text */
    } else if (ts->n_calls == 0)
        send_content(ts, ts->sent_to, ts->all_len); /* a tag's beginning or space held back: it was text */
    ts->pos = ts->all_len;
    return ts->n_calls;
}
