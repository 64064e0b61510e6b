/* Unit test of the tool-call parser (src/server/srv_tools.h) on recorded
 * model outputs: SmolLM2-135M's answers from `strata serve` (forced calls,
 * one with the outer brace dropped), and outputs in the Qwen2.5/Qwen3
 * `<tool_call>`, Llama 3 JSON, Qwen3.5/Qwen3-Coder `<function=...>`,
 * GLM-4.5 `<arg_key>` and DeepSeek V3/R1/V3.1 `<｜tool▁calls▁begin｜>`
 * formats as their templates write calls, plus texts that must NOT be calls
 * (unknown function, prose, a JSON answer, a markup call cut short or
 * malformed); the streaming parser against the whole-text one; the call
 * grammars of the markup and DeepSeek families. */
#include <stdio.h>
#include <string.h>

#include "core/alloc.h"
#include "server/srv_grammar.h"
#include "server/srv_internal.h"
#include "server/srv_tools.h"

static int g_fail;

/* get_weather (city required) and write_file type their keys (markup values follow the types); add has no
 * schema */
static const char TOOLS[] =
    "[{\"type\":\"function\",\"function\":{\"name\":\"get_weather\",\"parameters\":{\"type\":\"object\","
    "\"properties\":{\"city\":{\"type\":\"string\"},\"days\":{\"type\":\"integer\"},"
    "\"unit\":{\"type\":\"string\",\"enum\":[\"c\",\"f\"]}},\"required\":[\"city\"]}}},"
    "{\"type\":\"function\",\"function\":{\"name\":\"add\"}},"
    "{\"type\":\"function\",\"function\":{\"name\":\"write_file\",\"parameters\":{\"type\":\"object\","
    "\"properties\":{\"path\":{\"type\":\"string\"},\"content\":{\"type\":[\"string\",\"null\"]},"
    "\"opts\":{\"type\":\"object\"}}}}}]";

static void check(const char *what, const char *text, int want_calls, const char *want_name0, const char *want_args0,
                  const char *want_content) {
    json_t *tools = json_loads(TOOLS, 0, NULL);
    size_t clen = 0;
    json_t *calls = tools_parse(text, strlen(text), tools, "call_x_", &clen);
    int n = calls ? (int)json_array_size(calls) : 0;
    int ok = n == want_calls;
    const char *name = NULL, *args = NULL, *id = NULL;
    if (ok && n) {
        json_t *fn = json_object_get(json_array_get(calls, 0), "function");
        name = json_string_value(json_object_get(fn, "name"));
        args = json_string_value(json_object_get(fn, "arguments"));
        id = json_string_value(json_object_get(json_array_get(calls, 0), "id"));
        ok = name && !strcmp(name, want_name0) && args && !strcmp(args, want_args0) && id && !strcmp(id, "call_x_0");
    }
    if (ok && want_content) ok = clen == strlen(want_content) && !memcmp(text, want_content, clen);
    if (ok && !n) ok = clen == strlen(text); /* no call: the whole text is the answer */
    printf("%s: %s: %d call(s) (want %d)%s%s%s%s\n", ok ? "ok" : "FAIL", what, n, want_calls, name ? ", " : "",
           name ? name : "", args ? " " : "", args ? args : "");
    g_fail += !ok;
    json_decref(calls);
    json_decref(tools);
}

/* ---- the streaming parser: the same answers fed in pieces ---- */
typedef struct {
    char content[4096];
    char args[4][1024];
    char names[4][80];
    char ids[4][96];
    int n_begin, n_end, n_frag, order_ok;
} stream_out;

static void s_content(void *ctx, const char *t, size_t n) {
    stream_out *o = ctx;
    strncat(o->content, t, n);
    o->order_ok &= o->n_begin == 0; /* content only before the first call */
}
static void s_begin(void *ctx, int i, const char *id, const char *name) {
    stream_out *o = ctx;
    o->order_ok &= i == o->n_begin && o->n_end == i;
    snprintf(o->names[i & 3], sizeof o->names[0], "%s", name);
    snprintf(o->ids[i & 3], sizeof o->ids[0], "%s", id);
    o->n_begin++;
}
static void s_args(void *ctx, int i, const char *t, size_t n) {
    stream_out *o = ctx;
    o->order_ok &= i == o->n_begin - 1 && o->n_end == i;
    strncat(o->args[i & 3], t, n);
    o->n_frag++;
}
static void s_end(void *ctx, int i) {
    stream_out *o = ctx;
    o->order_ok &= i == o->n_end;
    o->n_end++;
}

/* Feed text in pieces of `step` bytes; the calls must be tools_parse's (names, ids, arguments equal as JSON)
 * and the content its content (the whole text when there is no call). */
static void check_stream(const char *what, const char *text, tools_family fam, size_t step, int min_frags) {
    json_t *tools = json_loads(TOOLS, 0, NULL);
    static const tools_stream_cb cb = {s_content, s_begin, s_args, s_end};
    stream_out o = {.order_ok = 1};
    tools_stream *ts = tools_stream_new(tools, fam, "call_x_", &cb, &o);
    size_t len = strlen(text);
    for (size_t i = 0; i < len; i += step) tools_stream_feed(ts, text + i, len - i < step ? len - i : step);
    int n = tools_stream_end(ts);
    tools_stream_free(ts);
    size_t clen = 0;
    json_t *calls = tools_parse(text, len, tools, "call_x_", &clen);
    int want = calls ? (int)json_array_size(calls) : 0;
    int ok = n == want && o.n_begin == n && o.n_end == n && o.order_ok && o.n_frag >= min_frags;
    for (int i = 0; ok && i < n && i < 4; i++) {
        json_t *c = json_array_get(calls, (size_t)i), *fn = json_object_get(c, "function");
        json_t *a = json_loads(o.args[i], 0, NULL),
               *b = json_loads(json_string_value(json_object_get(fn, "arguments")), 0, NULL);
        ok = a && json_equal(a, b) && !strcmp(o.names[i], json_string_value(json_object_get(fn, "name"))) &&
             !strcmp(o.ids[i], json_string_value(json_object_get(c, "id")));
        json_decref(a);
        json_decref(b);
    }
    if (ok) ok = strlen(o.content) == (n ? clen : len) && !memcmp(o.content, text, strlen(o.content));
    printf("%s: stream (%zu-byte pieces): %s: %d call(s) (want %d), %d fragments, content '%.30s'\n",
           ok ? "ok" : "FAIL", step, what, n, want, o.n_frag, o.content);
    g_fail += !ok;
    json_decref(calls);
    json_decref(tools);
}

/* ---- the markup and DeepSeek families' grammars (srv_tools_grammar): what they let through, and that it
 * parses ---- */

/* 1 when text is a whole sentence of grammar g (and nothing need follow it) */
static int g_whole(const grammar *g, const char *text) {
    gmatch *m = gmatch_new(g);
    int ok = gmatch_feed(m, text, strlen(text)) == 0 && gmatch_accepting(m);
    gmatch_free(m);
    return ok;
}

/* The grammar of a call in family fam (force as srv_tools_grammar takes it: NULL auto, "" any, or a name);
 * checks it takes text (or refuses it), and that opening + text parses to want_args (JSON) of name. */
static void check_markup_grammar(const char *what, tools_family fam, const char *force, const char *text,
                                 const char *opening, int want, const char *name, const char *want_args) {
    json_t *tools = json_loads(TOOLS, 0, NULL);
    srv_ctx *s = st_calloc(1, sizeof *s);
    s->tools_fam = (int)fam;
    srv_err e;
    char *gt = srv_tools_grammar(s, tools, force, NULL, API_OPENAI, &e);
    char err[256] = "";
    grammar *g = gt ? grammar_parse(gt, strlen(gt), err, sizeof err) : NULL;
    int took = g && g_whole(g, text), ok = g && took == want;
    if (ok && want && name) { /* what the grammar lets through is the call the parser reads */
        char all[2048];
        snprintf(all, sizeof all, "%s%s", opening, text);
        size_t clen = 0;
        json_t *calls = tools_parse(all, strlen(all), tools, "c", &clen);
        json_t *fn = json_object_get(json_array_get(calls, 0), "function");
        json_t *a = json_loads(json_string_value(json_object_get(fn, "arguments")), 0, NULL),
               *b = json_loads(want_args, 0, NULL);
        ok = calls && !strcmp(json_string_value(json_object_get(fn, "name")), name) && json_equal(a, b);
        json_decref(a);
        json_decref(b);
        json_decref(calls);
    }
    printf("%s: grammar %s: %s (want %s)%s%s\n", ok ? "ok" : "FAIL", what, took ? "taken" : "refused",
           want ? "taken" : "refused", err[0] ? ", " : "", err);
    g_fail += !ok;
    grammar_free(g);
    st_free(gt);
    st_free(s);
    json_decref(tools);
}

/* DeepSeek's markers (srv_tools.h) */
#define DS_B   TOOLS_DS_CALLS_BEGIN
#define DS_CB  TOOLS_DS_CALL_BEGIN
#define DS_SEP TOOLS_DS_SEP
#define DS_CE  TOOLS_DS_CALL_END
#define DS_E   TOOLS_DS_CALLS_END
#define DS_EOS "<｜end▁of▁sentence｜>"

/* A DeepSeek family's call grammar with the opening the server writes (srv_call_opening; auto: the model's
 * own block opening, the trigger). */
static void check_ds_grammar(const char *what, tools_family fam, const char *force, const char *text, int want,
                             const char *name, const char *want_args) {
    srv_ctx *s = st_calloc(1, sizeof *s);
    s->tools_fam = (int)fam;
    char *opening = force ? srv_call_opening(s, force) : st_strdup(DS_B);
    check_markup_grammar(what, fam, force, text, opening, want, name, want_args);
    st_free(opening);
    st_free(s);
}

int main(void) {
    /* recorded from SmolLM2-135M-Instruct Q4_1 (tool_choice get_weather; the server wrote the opening) */
    check("smollm2 forced, closed",
          "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": \n{\"city\": \"Paris\"}}\n", 1, "get_weather",
          "{\"city\":\"Paris\"}", "");
    check("smollm2 forced, outer brace dropped",
          "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": \n{\"type\":\"object\",\"properties\":{\"city\":"
          "{\"type\":\"string\"}},\"required\":[\"city\"]}\n",
          1, "get_weather",
          "{\"type\":\"object\",\"properties\":{\"city\":{\"type\":\"string\"}},\"required\":[\"city\"]}", "");
    check("smollm2 required, wrong name (a city)",
          "<tool_call>\n{\"name\": \"Paris\", \"arguments\": {\"type\":\"object\"}}\n", 0, NULL, NULL, NULL);
    check("smollm2 cut by max_tokens inside the arguments",
          "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": \n{\"city\": \"Paris\", \"temperature\": 25, \"temp",
          0, NULL, NULL, NULL);
    /* Qwen2.5 / Qwen3 format: text, then one or more tagged calls */
    check("qwen two calls after text",
          "Let me check.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Oslo\"}}\n</tool_call>\n"
          "<tool_call>\n{\"name\": \"add\", \"arguments\": {\"a\": 1, \"b\": 2}}\n</tool_call>",
          2, "get_weather", "{\"city\":\"Oslo\"}", "Let me check.");
    check("qwen3 after think",
          "<think>\nneed weather\n</think>\n\n<tool_call>\n{\"name\": \"add\", \"arguments\": "
          "{\"a\": 2, \"b\": 3}}\n</tool_call>",
          1, "add", "{\"a\":2,\"b\":3}", "<think>\nneed weather\n</think>");
    check("arguments as a JSON string", "<tool_call>{\"name\": \"add\", \"arguments\": \"{\\\"a\\\": 5}\"}</tool_call>",
          1, "add", "{\"a\":5}", "");
    /* Llama 3.x JSON */
    check("llama3 parameters", "{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Rome\"}}", 1, "get_weather",
          "{\"city\":\"Rome\"}", "");
    check("llama3 python_tag", "<|python_tag|>{\"type\": \"function\", \"name\": \"add\", \"parameters\": {\"a\": 1}}",
          1, "add", "{\"a\":1}", "");
    check("generic fenced array",
          "```json\n[{\"name\": \"add\", \"arguments\": {}}, {\"name\": \"get_weather\", "
          "\"arguments\": {\"city\": \"Lima\"}}]\n```",
          2, "add", "{}", "");
    /* not calls */
    check("prose", "The weather in Paris is sunny.", 0, NULL, NULL, NULL);
    check("json answer that is not a call", "{\"answer\": 42}", 0, NULL, NULL, NULL);
    check("unknown function", "{\"name\": \"rm_rf\", \"parameters\": {}}", 0, NULL, NULL, NULL);
    check("array with a non-call", "[{\"name\": \"add\", \"arguments\": {}}, {\"x\": 1}]", 0, NULL, NULL, NULL);
    check("arguments not an object", "<tool_call>{\"name\": \"add\", \"arguments\": [1]}</tool_call>", 0, NULL, NULL,
          NULL);
    /* Qwen3.5 / Qwen3-Coder markup: values typed by the schema, the template's newlines around them dropped */
    check("xml after text",
          "I'll check the weather.\n\n<tool_call>\n<function=get_weather>\n<parameter=city>\nSan Francisco\n"
          "</parameter>\n<parameter=days>\n3\n</parameter>\n</function>\n</tool_call>",
          1, "get_weather", "{\"city\":\"San Francisco\",\"days\":3}", "I'll check the weather.");
    check("xml string typed key that reads as a number",
          "<tool_call>\n<function=get_weather>\n<parameter=city>\n42\n</parameter>\n<parameter=days>\n7\n"
          "</parameter>\n</function>\n</tool_call>",
          1, "get_weather", "{\"city\":\"42\",\"days\":7}", "");
    check("xml code with < and a trailing newline, an object value",
          "<tool_call>\n<function=write_file>\n<parameter=path>\nsrc/a.py\n</parameter>\n<parameter=content>\n"
          "def f():\n    return 1 < 2\n\n</parameter>\n<parameter=opts>\n{\"mode\": \"w\"}\n</parameter>\n</function>\n"
          "</tool_call>",
          1, "write_file",
          "{\"path\":\"src/a.py\",\"content\":\"def f():\\n    return 1 < 2\\n\",\"opts\":{\"mode\":\"w\"}}", "");
    check("xml untyped keys: JSON when it reads as JSON, else text",
          "<think>\nadd them\n</think>\n\n<tool_call>\n<function=add>\n<parameter=a>\n1\n</parameter>\n"
          "<parameter=note>\nhello world\n</parameter>\n</function>\n</tool_call>\n<tool_call>\n<function=add>\n"
          "</function>\n</tool_call>",
          2, "add", "{\"a\":1,\"note\":\"hello world\"}", "<think>\nadd them\n</think>");
    check("xml value holding the closing tag",
          "<tool_call>\n<function=write_file>\n<parameter=path>\na.txt\n</parameter>\n<parameter=content>\n"
          "</tool_call> is a tag\n</parameter>\n</function>\n</tool_call>",
          1, "write_file", "{\"path\":\"a.txt\",\"content\":\"</tool_call> is a tag\"}", "");
    check("xml unknown function",
          "<tool_call>\n<function=rm_rf>\n<parameter=path>\n/\n</parameter>\n</function>\n</tool_call>", 0, NULL, NULL,
          NULL);
    check("xml cut before </function>", "<tool_call>\n<function=get_weather>\n<parameter=city>\nPar", 0, NULL, NULL,
          NULL);
    check("xml stray text inside the function",
          "<tool_call>\n<function=add>\nI think a is 1\n</function>\n</tool_call>", 0, NULL, NULL, NULL);
    /* GLM-4.5 markup */
    check("glm after text",
          "Let me look.\n<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>Beijing</arg_value>\n"
          "<arg_key>days</arg_key>\n<arg_value>2</arg_value>\n</tool_call>",
          1, "get_weather", "{\"city\":\"Beijing\",\"days\":2}", "Let me look.");
    check("glm no arguments, then one with JSON values",
          "<tool_call>add\n</tool_call>\n<tool_call>add\n<arg_key>xs</arg_key>\n<arg_value>[1, 2]</arg_value>\n"
          "</tool_call>",
          2, "add", "{}", "");
    check("glm cut at the stop </tool_call> (a forced call)",
          "<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>Oslo</arg_value>\n", 1, "get_weather",
          "{\"city\":\"Oslo\"}", "");
    check("glm key without a value", "<tool_call>add\n<arg_key>a</arg_key>\n</tool_call>", 0, NULL, NULL, NULL);
    check("glm unknown function", "<tool_call>rm_rf\n<arg_key>path</arg_key><arg_value>/</arg_value></tool_call>", 0,
          NULL, NULL, NULL);
    /* DeepSeek V3 / R1: `function<｜tool▁sep｜>NAME` and fenced JSON, a newline between calls */
    check("deepseek v3 after text",
          "I'll look it up.\n\n" DS_B DS_CB "function" DS_SEP
          "get_weather\n```json\n{\"city\": \"Paris\", \"days\": 3}\n"
          "```" DS_CE DS_E DS_EOS,
          1, "get_weather", "{\"city\":\"Paris\",\"days\":3}", "I'll look it up.");
    check("deepseek v3 two calls",
          DS_B DS_CB "function" DS_SEP "get_weather\n```json\n{\"city\": \"Oslo\"}\n```" DS_CE "\n" DS_CB
                     "function" DS_SEP "add\n```json\n{\"a\": 1, \"b\": 2}\n```" DS_CE DS_E,
          2, "get_weather", "{\"city\":\"Oslo\"}", "");
    check("deepseek r1 after think",
          "<think>\nThe user wants the weather.\n</think>\n\n" DS_B DS_CB "function" DS_SEP
          "get_weather\n```json\n{\"city\": \"Lima\"}\n```" DS_CE DS_E,
          1, "get_weather", "{\"city\":\"Lima\"}", "<think>\nThe user wants the weather.\n</think>");
    /* DeepSeek V3.1: `NAME<｜tool▁sep｜>` and the bare JSON, calls chained */
    check("deepseek v3.1 after text",
          "Checking.\n" DS_B DS_CB "get_weather" DS_SEP "{\"city\": \"Rome\", \"unit\": \"c\"}" DS_CE DS_E DS_EOS, 1,
          "get_weather", "{\"city\":\"Rome\",\"unit\":\"c\"}", "Checking.");
    check("deepseek v3.1 two calls, the second without <｜tool▁call▁begin｜>",
          DS_B DS_CB "add" DS_SEP "{\"a\": 1}" DS_CE "add" DS_SEP "{}" DS_CE DS_E, 2, "add", "{\"a\":1}", "");
    check("deepseek shapes mixed in one block (a model drifting)",
          DS_B DS_CB "add" DS_SEP "{\"a\": 2}" DS_CE DS_CB "function" DS_SEP "get_weather\n```json\n{\"city\": "
                     "\"Bern\"}\n```" DS_CE DS_E,
          2, "add", "{\"a\":2}", "");
    check("deepseek v3.1 a string holding the markers",
          DS_B DS_CB "write_file" DS_SEP "{\"path\": \"a.txt\", \"content\": \"" DS_CE DS_E " and }\"}" DS_CE DS_E, 1,
          "write_file", "{\"path\":\"a.txt\",\"content\":\"" DS_CE DS_E " and }\"}", "");
    check("deepseek unknown function, then a call",
          "Two steps. " DS_B DS_CB "rm_rf" DS_SEP "{\"path\": \"/\"}" DS_CE DS_CB "add" DS_SEP "{\"a\": 3}" DS_CE DS_E,
          1, "add", "{\"a\":3}", "Two steps.");
    check("deepseek v3 cut after its JSON (max_tokens)",
          DS_B DS_CB "function" DS_SEP "get_weather\n```json\n{\"city\": \"Kyiv\"}\n``", 1, "get_weather",
          "{\"city\":\"Kyiv\"}", "");
    check("deepseek v3.1 cut after its JSON", DS_B DS_CB "add" DS_SEP "{\"a\": 4}", 1, "add", "{\"a\":4}", "");
    /* not calls */
    check("deepseek unknown function", "Sure. " DS_B DS_CB "rm_rf" DS_SEP "{\"path\": \"/\"}" DS_CE DS_E, 0, NULL, NULL,
          NULL);
    check("deepseek cut inside the JSON", DS_B DS_CB "get_weather" DS_SEP "{\"city\": \"Par", 0, NULL, NULL, NULL);
    check("deepseek v3 cut in the name", DS_B DS_CB "function" DS_SEP "get_wea", 0, NULL, NULL, NULL);
    check("deepseek arguments not an object", DS_B DS_CB "add" DS_SEP "[1, 2]" DS_CE DS_E, 0, NULL, NULL, NULL);
    check("deepseek markers in prose", "Write " DS_B " to open calls, then " DS_CE ".", 0, NULL, NULL, NULL);
    check("a tagged call before a deepseek block: the first kind wins",
          "<tool_call>\n{\"name\": \"add\", \"arguments\": {\"a\": 5}}\n</tool_call>" DS_B DS_CB "get_weather" DS_SEP
          "{\"city\": \"Oslo\"}" DS_CE DS_E,
          1, "add", "{\"a\":5}", "");
    /* the streaming parser against tools_parse, fed a byte at a time and in bigger pieces */
    static const struct {
        const char *what, *text;
        tools_family fam;
        int frags; /* at least, a byte at a time */
    } streams[] = {
        {"forced, opening included",
         "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n"
         "</tool_call>",
         TOOLS_TAGGED, 10},
        {"text then two calls",
         "Let me check.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": "
         "\"Oslo\"}}\n</tool_call>\n<tool_call>\n{\"name\": \"add\", \"arguments\": {\"a\": 1, \"b\": [2, \"}\"]}}\n"
         "</tool_call>",
         TOOLS_TAGGED, 10},
        {"prose", "The weather in Paris is <sunny> today.", TOOLS_TAGGED, 0},
        {"a tag cut off at the end", "Some text <tool_c", TOOLS_TAGGED, 0},
        {"an unknown function", "<tool_call>\n{\"name\": \"rm_rf\", \"arguments\": {}}\n</tool_call>", TOOLS_TAGGED, 0},
        {"arguments before the name", "<tool_call>{\"arguments\": {\"a\": 1}, \"name\": \"add\"}</tool_call>",
         TOOLS_TAGGED, 1},
        {"a bare JSON call", "{\"name\": \"add\", \"arguments\": {\"a\": 2}}", TOOLS_TAGGED, 1},
        {"a JSON answer", "{\"answer\": 42}", TOOLS_TAGGED, 0},
        {"llama3", "{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Rome\"}}", TOOLS_LLAMA3, 10},
        {"llama3 python_tag", "<|python_tag|>{\"name\": \"add\", \"parameters\": {\"a\": 1}}", TOOLS_LLAMA3, 5},
        {"llama3 prose", "It is sunny in Rome.", TOOLS_LLAMA3, 0},
        {"xml text then two calls",
         "Checking.\n\n<tool_call>\n<function=get_weather>\n<parameter=city>\nOslo\n</parameter>\n</function>\n"
         "</tool_call>\n<tool_call>\n<function=write_file>\n<parameter=path>\na.txt\n</parameter>\n"
         "<parameter=content>\n</tool_call> is a tag\n</parameter>\n</function>\n</tool_call>",
         TOOLS_XML, 2},
        {"xml prose with tags", "Use <b>bold</b> and <tool_c", TOOLS_XML, 0},
        {"xml unknown function then a call",
         "<tool_call>\n<function=rm_rf>\n</function>\n</tool_call>\n<tool_call>\n<function=add>\n</function>\n"
         "</tool_call>",
         TOOLS_XML, 0},
        {"xml cut short", "<tool_call>\n<function=add>\n<parameter=a>\n1\n</param", TOOLS_XML, 0},
        {"glm after think",
         "<think>weather first</think>\n<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>Rome</arg_value>"
         "\n</tool_call><tool_call>add\n</tool_call>",
         TOOLS_GLM, 2},
        {"glm forced, cut at its stop", "<tool_call>add\n<arg_key>a</arg_key>\n<arg_value>5</arg_value>\n", TOOLS_GLM,
         1},
        {"deepseek v3 text then two calls",
         "Let me check.\n" DS_B DS_CB "function" DS_SEP "get_weather\n```json\n{\"city\": \"Oslo\"}\n```" DS_CE
         "\n" DS_CB "function" DS_SEP "add\n```json\n{\"a\": 1, \"b\": [2, \"}\"]}\n```" DS_CE DS_E DS_EOS,
         TOOLS_DEEPSEEK, 10},
        {"deepseek v3.1 text then two calls",
         "Checking." DS_B DS_CB "get_weather" DS_SEP "{\"city\": \"Rome\"}" DS_CE DS_CB "add" DS_SEP
         "{\"a\": 1}" DS_CE DS_E,
         TOOLS_DEEPSEEK31, 10},
        {"deepseek v3.1 in a v3 server, a call without its <｜tool▁call▁begin｜>",
         DS_B DS_CB "add" DS_SEP "{\"a\": 1}" DS_CE "add" DS_SEP "{}" DS_CE DS_E, TOOLS_DEEPSEEK, 4},
        {"deepseek a string holding the markers",
         DS_B DS_CB "write_file" DS_SEP "{\"path\": \"a.txt\", \"content\": \"" DS_CE DS_E "\"}" DS_CE DS_E,
         TOOLS_DEEPSEEK31, 10},
        {"deepseek an unknown function, then a call",
         "Two steps. " DS_B DS_CB "rm_rf" DS_SEP "{\"path\": \"/\"}" DS_CE DS_CB "add" DS_SEP "{\"a\": 3}" DS_CE DS_E,
         TOOLS_DEEPSEEK31, 0},
        {"deepseek a call, then an unknown function, then a call",
         DS_B DS_CB "add" DS_SEP "{\"a\": 1}" DS_CE DS_CB "rm_rf" DS_SEP "{}" DS_CE DS_CB "function" DS_SEP
                    "get_weather\n```json\n{\"city\": \"Oslo\"}\n```" DS_CE DS_E,
         TOOLS_DEEPSEEK31, 4},
        {"deepseek only an unknown function", "Sure. " DS_B DS_CB "rm_rf" DS_SEP "{}" DS_CE DS_E, TOOLS_DEEPSEEK, 0},
        {"deepseek cut after its JSON", "Hm. " DS_B DS_CB "function" DS_SEP "add\n```json\n{\"a\": 4}\n`",
         TOOLS_DEEPSEEK, 4},
        {"deepseek cut in the name", DS_B DS_CB "function" DS_SEP "get_wea", TOOLS_DEEPSEEK, 0},
        {"deepseek markers in prose, a marker cut at the end", "Write " DS_B " to open calls. " DS_CB "<｜tool",
         TOOLS_DEEPSEEK31, 0},
        {"deepseek an empty block, then a tagged call",
         "Hi " DS_B DS_E "\n<tool_call>\n{\"name\": \"add\", \"arguments\": {}}\n</tool_call>", TOOLS_DEEPSEEK31, 0},
        {"deepseek a block after a second one's text",
         DS_B DS_CB "add" DS_SEP "{\"a\": 1}" DS_CE DS_E "\nand then " DS_B DS_CB "add" DS_SEP "{\"a\": 2}" DS_CE DS_E,
         TOOLS_DEEPSEEK31, 6},
    };
    /* 1-3 bytes: DeepSeek's markers (3-byte characters) split anywhere */
    static const size_t steps[] = {1, 2, 3, 7, 10000};
    for (size_t i = 0; i < sizeof streams / sizeof streams[0]; i++)
        for (size_t k = 0; k < sizeof steps / sizeof steps[0]; k++)
            check_stream(streams[i].what, streams[i].text, streams[i].fam, steps[k], k ? 0 : streams[i].frags);
    /* the markup grammars: forced (named, any) and auto, both families */
    const char *xo = "<tool_call>\n<function=get_weather>\n", *go = "<tool_call>get_weather\n";
    check_markup_grammar("xml named", TOOLS_XML, "get_weather",
                         "<parameter=city>\nSan Francisco\n</parameter>\n<parameter=days>\n3\n</parameter>\n"
                         "</function>\n</tool_call>",
                         xo, 1, "get_weather", "{\"city\": \"San Francisco\", \"days\": 3}");
    check_markup_grammar("xml named, optional key left out", TOOLS_XML, "get_weather",
                         "<parameter=city>\n<b>42</b>\n</parameter>\n</function>\n</tool_call>", xo, 1, "get_weather",
                         "{\"city\": \"<b>42</b>\"}");
    check_markup_grammar("xml named, an enum's string", TOOLS_XML, "get_weather",
                         "<parameter=city>\nRome\n</parameter>\n<parameter=unit>\nf\n</parameter>\n</function>\n"
                         "</tool_call>",
                         xo, 1, "get_weather", "{\"city\": \"Rome\", \"unit\": \"f\"}");
    check_markup_grammar("xml named, a string outside the enum", TOOLS_XML, "get_weather",
                         "<parameter=city>\nRome\n</parameter>\n<parameter=unit>\nk\n</parameter>\n</function>\n"
                         "</tool_call>",
                         xo, 0, NULL, NULL);
    check_markup_grammar("xml named, required key missing", TOOLS_XML, "get_weather",
                         "<parameter=days>\n3\n</parameter>\n</function>\n</tool_call>", xo, 0, NULL, NULL);
    check_markup_grammar("xml named, an integer that is not one", TOOLS_XML, "get_weather",
                         "<parameter=city>\nRome\n</parameter>\n<parameter=days>\nthree\n</parameter>\n</function>\n"
                         "</tool_call>",
                         xo, 0, NULL, NULL);
    check_markup_grammar("xml named, a value holding its closing tag", TOOLS_XML, "get_weather",
                         "<parameter=city>\nRo</parameter>me\n</parameter>\n</function>\n</tool_call>", xo, 0, NULL,
                         NULL);
    check_markup_grammar("xml any tool", TOOLS_XML, "",
                         "write_file>\n<parameter=path>\na.py\n</parameter>\n<parameter=content>\nx = '<'\n"
                         "</parameter>\n<parameter=opts>\n{\"mode\": \"w\"}\n</parameter>\n</function>\n</tool_call>",
                         "<tool_call>\n<function=", 1, "write_file",
                         "{\"path\": \"a.py\", \"content\": \"x = '<'\", \"opts\": {\"mode\": \"w\"}}");
    check_markup_grammar("xml auto, two calls (a tool without a schema takes any keys)", TOOLS_XML, NULL,
                         "\n<function=add>\n<parameter=a>\n1\n</parameter>\n</function>\n</tool_call>\n<tool_call>\n"
                         "<function=get_weather>\n<parameter=city>\nOslo\n</parameter>\n</function>\n</tool_call>",
                         "<tool_call>", 1, "add", "{\"a\": 1}");
    check_markup_grammar("xml auto, an unknown function", TOOLS_XML, NULL,
                         "\n<function=rm_rf>\n</function>\n</tool_call>", "<tool_call>", 0, NULL, NULL);
    check_markup_grammar("glm named", TOOLS_GLM, "get_weather",
                         "<arg_key>city</arg_key>\n<arg_value>Beijing</arg_value>\n<arg_key>days</arg_key>\n"
                         "<arg_value>2</arg_value>\n</tool_call>",
                         go, 1, "get_weather", "{\"city\": \"Beijing\", \"days\": 2}");
    check_markup_grammar("glm named, a string typed key written as JSON stays text", TOOLS_GLM, "get_weather",
                         "<arg_key>city</arg_key>\n<arg_value>\"Oslo\"</arg_value>\n</tool_call>", go, 1, "get_weather",
                         "{\"city\": \"\\\"Oslo\\\"\"}");
    check_markup_grammar("glm named, keys out of order", TOOLS_GLM, "get_weather",
                         "<arg_key>days</arg_key>\n<arg_value>2</arg_value>\n<arg_key>city</arg_key>\n"
                         "<arg_value>Oslo</arg_value>\n</tool_call>",
                         go, 0, NULL, NULL);
    check_markup_grammar("glm any tool", TOOLS_GLM, "", "add\n</tool_call>", "<tool_call>", 1, "add", "{}");
    check_markup_grammar("glm auto", TOOLS_GLM, NULL,
                         "get_weather\n<arg_key>city</arg_key>\n<arg_value>Lima</arg_value>\n</tool_call>",
                         "<tool_call>", 1, "get_weather", "{\"city\": \"Lima\"}");
    /* the DeepSeek grammars, each after the opening the server writes */
    check_ds_grammar("deepseek v3 named", TOOLS_DEEPSEEK, "get_weather",
                     "{\"city\": \"Rome\", \"days\": 2}\n```" DS_CE DS_E, 1, "get_weather",
                     "{\"city\": \"Rome\", \"days\": 2}");
    check_ds_grammar("deepseek v3 named, required key missing", TOOLS_DEEPSEEK, "get_weather",
                     "{\"days\": 2}\n```" DS_CE DS_E, 0, NULL, NULL);
    check_ds_grammar("deepseek v3 named, the fence left out", TOOLS_DEEPSEEK, "get_weather",
                     "{\"city\": \"Rome\"}" DS_CE DS_E, 0, NULL, NULL);
    check_ds_grammar("deepseek v3 named, a second call", TOOLS_DEEPSEEK, "get_weather",
                     "{\"city\": \"Rome\"}\n```" DS_CE "\n" DS_CB "function" DS_SEP "add\n```json\n{}\n```" DS_CE DS_E,
                     0, NULL, NULL);
    check_ds_grammar("deepseek v3 any tool", TOOLS_DEEPSEEK, "", "add\n```json\n{}\n```" DS_CE DS_E, 1, "add", "{}");
    check_ds_grammar("deepseek v3 auto, two calls", TOOLS_DEEPSEEK, NULL,
                     DS_CB "function" DS_SEP "get_weather\n```json\n{\"city\": \"Oslo\"}\n```" DS_CE "\n" DS_CB
                           "function" DS_SEP "add\n```json\n{}\n```" DS_CE DS_E,
                     1, "get_weather", "{\"city\": \"Oslo\"}");
    check_ds_grammar("deepseek v3 auto, the v3.1 shape", TOOLS_DEEPSEEK, NULL, DS_CB "add" DS_SEP "{}" DS_CE DS_E, 0,
                     NULL, NULL);
    check_ds_grammar("deepseek v3.1 named", TOOLS_DEEPSEEK31, "get_weather",
                     "{\"city\": \"Oslo\", \"unit\": \"f\"}" DS_CE DS_E, 1, "get_weather",
                     "{\"city\": \"Oslo\", \"unit\": \"f\"}");
    check_ds_grammar("deepseek v3.1 named, a string outside the enum", TOOLS_DEEPSEEK31, "get_weather",
                     "{\"city\": \"Oslo\", \"unit\": \"k\"}" DS_CE DS_E, 0, NULL, NULL);
    check_ds_grammar("deepseek v3.1 any tool", TOOLS_DEEPSEEK31, "",
                     "write_file" DS_SEP "{\"path\": \"a.py\", \"opts\": {\"mode\": \"w\"}}" DS_CE DS_E, 1,
                     "write_file", "{\"path\": \"a.py\", \"opts\": {\"mode\": \"w\"}}");
    check_ds_grammar("deepseek v3.1 any tool, an unknown one", TOOLS_DEEPSEEK31, "", "rm_rf" DS_SEP "{}" DS_CE DS_E, 0,
                     NULL, NULL);
    check_ds_grammar("deepseek v3.1 auto, two calls", TOOLS_DEEPSEEK31, NULL,
                     DS_CB "add" DS_SEP "{}" DS_CE DS_CB "get_weather" DS_SEP "{\"city\": \"Lima\"}" DS_CE DS_E, 1,
                     "add", "{}");
    check_ds_grammar("deepseek v3.1 auto, arguments for a tool that takes none", TOOLS_DEEPSEEK31, NULL,
                     DS_CB "add" DS_SEP "{\"a\": 1}" DS_CE DS_E, 0, NULL, NULL);
    check_ds_grammar("deepseek v3.1 auto, the block not ended", TOOLS_DEEPSEEK31, NULL, DS_CB "add" DS_SEP "{}" DS_CE,
                     0, NULL, NULL);
    /* families from template text */
    const char *qwen = "{%- if tools %}<tools>{{ tool | tojson }}</tools><tool_call>{% endif %}";
    const char *llama = "{{- '\"parameters\": dictionary' }}{%- if message.role == 'ipython' %}{% endif %}{{ tools }}";
    const char *xml = "{{- '\\n<tool_call>\\n<function=' + tool_call.name + '>\\n' }}"
                      "{{- '<parameter=' + args_name + '>\\n' }}";
    const char *glm =
        "<tool_call>{function-name}\n<arg_key>{arg-key-1}</arg_key>\n<arg_value>{arg-value-1}</arg_value>";
    /* from tests/data/jinja/templates/deepseek_v3.jinja and deepseek_v31.jinja */
    const char *ds3 = "{%- if message['role'] == 'assistant' and 'tool_calls' in message %}{{'<｜Assistant｜>"
                      "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>' + tool['type'] + '<｜tool▁sep｜>' + "
                      "tool['function']['name'] + '\\n' + '```json' + '\\n' + tool['function']['arguments']}}";
    const char *ds31 = "{%- if message['role'] == 'assistant' and message['tool_calls'] is defined %}"
                       "{{'<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>'+ tool['function']['name'] + '<｜tool▁sep｜>' + "
                       "tool['function']['arguments'] + '<｜tool▁call▁end｜>'}}";
    int fam_ok = tools_family_of(qwen, strlen(qwen)) == TOOLS_TAGGED &&
                 tools_family_of(xml, strlen(xml)) == TOOLS_XML && tools_family_of(glm, strlen(glm)) == TOOLS_GLM &&
                 tools_markup(TOOLS_XML) && tools_markup(TOOLS_GLM) && !tools_markup(TOOLS_TAGGED) &&
                 tools_family_of(llama, strlen(llama)) == TOOLS_LLAMA3 && tools_template_handles(qwen, strlen(qwen)) &&
                 !tools_template_handles("{{ messages }}", 14);
    /* DeepSeek's templates write calls but not the tools: the server describes them, in DeepSeek's shape */
    fam_ok &= tools_family_of(ds3, strlen(ds3)) == TOOLS_DEEPSEEK &&
              tools_family_of(ds31, strlen(ds31)) == TOOLS_DEEPSEEK31 && tools_deepseek(TOOLS_DEEPSEEK) &&
              tools_deepseek(TOOLS_DEEPSEEK31) && !tools_deepseek(TOOLS_TAGGED) && !tools_markup(TOOLS_DEEPSEEK) &&
              !tools_template_handles(ds3, strlen(ds3)) && !tools_template_handles(ds31, strlen(ds31)) &&
              tools_template_calls(ds3, strlen(ds3)) && tools_template_calls(ds31, strlen(ds31)) &&
              !tools_template_calls("{{ messages }}", 14);
    printf("%s: template families (qwen tagged, llama3 json, qwen3.5 xml, glm, deepseek v3 and v3.1; tools and "
           "calls handled or not)\n",
           fam_ok ? "ok" : "FAIL");
    g_fail += !fam_ok;
    /* the tools described in the family's own shape */
    json_t *tools = json_loads(TOOLS, 0, NULL);
    char *p_tag = tools_system_prompt(tools, TOOLS_TAGGED), *p_v3 = tools_system_prompt(tools, TOOLS_DEEPSEEK),
         *p_v31 = tools_system_prompt(tools, TOOLS_DEEPSEEK31);
    fam_ok = strstr(p_tag, "<tool_call>\n{\"name\"") && !strstr(p_tag, DS_B) && strstr(p_tag, "\"get_weather\"") &&
             strstr(p_v3, DS_B DS_CB "function" DS_SEP "<function-name>\n```json\n") && !strstr(p_v3, "<tool_call>") &&
             strstr(p_v3, "\"write_file\"") &&
             strstr(p_v31, DS_B DS_CB "<function-name>" DS_SEP "<args-json-object>" DS_CE);
    printf("%s: the system prompt describing the tools: tagged, deepseek v3, deepseek v3.1\n", fam_ok ? "ok" : "FAIL");
    g_fail += !fam_ok;
    st_free(p_tag);
    st_free(p_v3);
    st_free(p_v31);
    json_decref(tools);
    printf("%s: %d failure(s)\n", g_fail ? "FAIL" : "PASS", g_fail);
    return g_fail != 0;
}
