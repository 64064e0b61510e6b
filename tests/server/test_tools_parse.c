/* Unit test of the tool-call parser (src/server/srv_tools.h) on recorded
 * model outputs: SmolLM2-135M's answers from `strata serve` (forced calls,
 * one with the outer brace dropped), and outputs in the Qwen2.5/Qwen3
 * `<tool_call>` and Llama 3 JSON formats as those models write them, plus
 * texts that must NOT be calls (unknown function, prose, a JSON answer). */
#include <stdio.h>
#include <string.h>

#include "server/srv_tools.h"

static int g_fail;

static void check(const char *what, const char *text, int want_calls, const char *want_name0, const char *want_args0,
                  const char *want_content) {
    json_t *tools = json_loads("[{\"type\":\"function\",\"function\":{\"name\":\"get_weather\",\"parameters\":{}}},"
                               "{\"type\":\"function\",\"function\":{\"name\":\"add\"}}]",
                               0, NULL);
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

int main(void) {
    /* recorded from SmolLM2-135M-Instruct Q4_1 (tool_choice get_weather; the server wrote the opening) */
    check("smollm2 forced, closed", "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": \n{\"city\": \"Paris\"}}\n",
          1, "get_weather", "{\"city\":\"Paris\"}", "");
    check("smollm2 forced, outer brace dropped",
          "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": \n{\"type\":\"object\",\"properties\":{\"city\":"
          "{\"type\":\"string\"}},\"required\":[\"city\"]}\n",
          1, "get_weather", "{\"type\":\"object\",\"properties\":{\"city\":{\"type\":\"string\"}},\"required\":[\"city\"]}",
          "");
    check("smollm2 required, wrong name (a city)",
          "<tool_call>\n{\"name\": \"Paris\", \"arguments\": {\"type\":\"object\"}}\n", 0, NULL, NULL, NULL);
    check("smollm2 cut by max_tokens inside the arguments",
          "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": \n{\"city\": \"Paris\", \"temperature\": 25, \"temp", 0,
          NULL, NULL, NULL);
    /* Qwen2.5 / Qwen3 format: text, then one or more tagged calls */
    check("qwen two calls after text",
          "Let me check.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Oslo\"}}\n</tool_call>\n"
          "<tool_call>\n{\"name\": \"add\", \"arguments\": {\"a\": 1, \"b\": 2}}\n</tool_call>",
          2, "get_weather", "{\"city\":\"Oslo\"}", "Let me check.");
    check("qwen3 after think", "<think>\nneed weather\n</think>\n\n<tool_call>\n{\"name\": \"add\", \"arguments\": "
          "{\"a\": 2, \"b\": 3}}\n</tool_call>", 1, "add", "{\"a\":2,\"b\":3}", "<think>\nneed weather\n</think>");
    check("arguments as a JSON string",
          "<tool_call>{\"name\": \"add\", \"arguments\": \"{\\\"a\\\": 5}\"}</tool_call>", 1, "add", "{\"a\":5}", "");
    /* Llama 3.x JSON */
    check("llama3 parameters", "{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Rome\"}}", 1, "get_weather",
          "{\"city\":\"Rome\"}", "");
    check("llama3 python_tag", "<|python_tag|>{\"type\": \"function\", \"name\": \"add\", \"parameters\": {\"a\": 1}}", 1,
          "add", "{\"a\":1}", "");
    check("generic fenced array", "```json\n[{\"name\": \"add\", \"arguments\": {}}, {\"name\": \"get_weather\", "
          "\"arguments\": {\"city\": \"Lima\"}}]\n```", 2, "add", "{}", "");
    /* not calls */
    check("prose", "The weather in Paris is sunny.", 0, NULL, NULL, NULL);
    check("json answer that is not a call", "{\"answer\": 42}", 0, NULL, NULL, NULL);
    check("unknown function", "{\"name\": \"rm_rf\", \"parameters\": {}}", 0, NULL, NULL, NULL);
    check("array with a non-call", "[{\"name\": \"add\", \"arguments\": {}}, {\"x\": 1}]", 0, NULL, NULL, NULL);
    check("arguments not an object", "<tool_call>{\"name\": \"add\", \"arguments\": [1]}</tool_call>", 0, NULL, NULL,
          NULL);
    /* families from template text */
    const char *qwen = "{%- if tools %}<tools>{{ tool | tojson }}</tools><tool_call>{% endif %}";
    const char *llama = "{{- '\"parameters\": dictionary' }}{%- if message.role == 'ipython' %}{% endif %}{{ tools }}";
    int fam_ok = tools_family_of(qwen, strlen(qwen)) == TOOLS_TAGGED && tools_family_of(llama, strlen(llama)) == TOOLS_LLAMA3 &&
                 tools_template_handles(qwen, strlen(qwen)) && !tools_template_handles("{{ messages }}", 14);
    printf("%s: template families (qwen tagged, llama3 json, tools handled or not)\n", fam_ok ? "ok" : "FAIL");
    g_fail += !fam_ok;
    printf("%s: %d failure(s)\n", g_fail ? "FAIL" : "PASS", g_fail);
    return g_fail != 0;
}
