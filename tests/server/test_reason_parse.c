/* Unit test of the reasoning parser (src/server/srv_reason.h): `<think>`
 * answers (Qwen3, DeepSeek R1 shapes, a block the prompt opened, one never
 * closed, answers with no reasoning that must stay byte for byte) and harmony
 * answers (gpt-oss: analysis then final, a preamble, tool calls with the
 * recipient in the channel or the role header, a call nobody offered, text
 * that is no harmony at all). Every answer is fed whole, a byte at a time
 * and 7 bytes at a time; each must give exactly the expected reasoning and
 * content, so reasoning leaking into the content (or back) fails. Harmony
 * calls are then parsed by tools_parse into the expected call. */
#include <stdio.h>
#include <string.h>

#include "server/srv_reason.h"
#include "server/srv_tools.h"

static int g_fail;

typedef struct {
    char reasoning[2048], content[2048];
} out_t;

static void o_reasoning(void *ctx, const char *t, size_t n) { strncat(((out_t *)ctx)->reasoning, t, n); }
static void o_content(void *ctx, const char *t, size_t n) { strncat(((out_t *)ctx)->content, t, n); }

static void run(reason_kind k, int open, int calls, const char *text, size_t step, out_t *o) {
    static const reason_cb cb = {o_reasoning, o_content};
    memset(o, 0, sizeof *o);
    reason_stream *rs = reason_stream_new(k, open, calls, &cb, o);
    size_t n = strlen(text);
    for (size_t i = 0; i < n; i += step) reason_stream_feed(rs, text + i, n - i < step ? n - i : step);
    reason_stream_end(rs);
    reason_stream_free(rs);
}

static void check(const char *what, reason_kind k, int open, int calls, const char *text, const char *want_r,
                  const char *want_c) {
    static const size_t steps[] = {(size_t)1 << 20, 1, 7};
    for (int s = 0; s < 3; s++) {
        out_t o;
        run(k, open, calls, text, steps[s], &o);
        int ok = !strcmp(o.reasoning, want_r) && !strcmp(o.content, want_c);
        if (!ok || s == 0)
            printf("%s: %s (%s): reasoning [%s] content [%s]\n", ok ? "ok" : "FAIL", what,
                   s == 0   ? "whole"
                   : s == 1 ? "bytes"
                            : "7 bytes",
                   o.reasoning, o.content);
        g_fail += !ok;
    }
}

/* A harmony answer with calls: its content must parse into exactly this call. */
static void check_call(const char *what, const char *text, const char *want_r, const char *want_name,
                       const char *want_args) {
    json_t *tools = json_loads("[{\"type\":\"function\",\"function\":{\"name\":\"get_weather\",\"parameters\":{}}},"
                               "{\"type\":\"function\",\"function\":{\"name\":\"add\"}}]",
                               0, NULL);
    out_t o;
    run(REASON_HARMONY, 0, 1, text, 3, &o);
    size_t clen = 0;
    json_t *calls = tools_parse(o.content, strlen(o.content), tools, "call_x_", &clen);
    json_t *fn = json_object_get(json_array_get(calls, 0), "function");
    const char *name = json_string_value(json_object_get(fn, "name"));
    const char *args = json_string_value(json_object_get(fn, "arguments"));
    int ok = !strcmp(o.reasoning, want_r) && calls && json_array_size(calls) == 1 && name && !strcmp(name, want_name) &&
             args && !strcmp(args, want_args) && clen == 0;
    printf("%s: %s: reasoning [%s] call %s %s\n", ok ? "ok" : "FAIL", what, o.reasoning, name ? name : "-",
           args ? args : "-");
    g_fail += !ok;
    json_decref(calls);
    json_decref(tools);
}

int main(void) {
    /* think tags */
    check("qwen3 think then answer", REASON_THINK, 0, 0,
          "<think>\nThe user greets me.\n</think>\n\nHello! How can I help?", "The user greets me.",
          "Hello! How can I help?");
    check("deepseek r1, block opened by the prompt", REASON_THINK, 1, 0,
          "Okay, 2+2 is 4.\n</think>\n\nThe answer is 4.", "Okay, 2+2 is 4.", "The answer is 4.");
    check("space before <think>", REASON_THINK, 0, 0, "\n <think>a < b</think>b", "a < b", "b");
    check("never closed (cut by max_tokens)", REASON_THINK, 0, 0, "<think>\nstill thinking  \n", "still thinking", "");
    check("open, never closed", REASON_THINK, 1, 0, "  partial </thi", "partial </thi", "");
    check("continuing a prefill's reasoning", REASON_THINK, 2, 0, " more.</think>Done", " more.", "Done");
    check("no reasoning: byte for byte", REASON_THINK, 0, 0, "  Hello <think> is a tag.\n", "",
          "  Hello <think> is a tag.\n");
    check("no reasoning, starts like the tag", REASON_THINK, 0, 0, "<thin ice>", "", "<thin ice>");
    check("a lone '<'", REASON_THINK, 0, 0, "<", "", "<");
    check("empty think (enable_thinking false writes it)", REASON_THINK, 0, 0, "<think>\n\n</think>\n\nHi", "", "Hi");
    check("tool call after think", REASON_THINK, 0, 0,
          "<think>need weather</think>\n<tool_call>\n{\"name\": \"add\"}\n</tool_call>", "need weather",
          "<tool_call>\n{\"name\": \"add\"}\n</tool_call>");
    check("off: everything is content", REASON_OFF, 0, 0, "<think>x</think>y", "", "<think>x</think>y");
    /* harmony */
    check("harmony analysis then final", REASON_HARMONY, 0, 0,
          "<|channel|>analysis<|message|>User says hi. Respond.<|end|><|start|>assistant<|channel|>final<|message|>"
          "Hello there!",
          "User says hi. Respond.", "Hello there!");
    check("harmony final ended by <|return|>", REASON_HARMONY, 0, 0, "<|channel|>final<|message|>Just this.<|return|>",
          "", "Just this.");
    check("harmony stray commentary and a preamble", REASON_HARMONY, 0, 0,
          "<|channel|>commentary<|message|>Checking. <|end|><|start|>assistant<|channel|>analysis<|message|>x<|end|>"
          "<|start|>assistant<|channel|>final<|message|>Done.",
          "x", "Checking. Done.");
    check("harmony call nobody offered is dropped", REASON_HARMONY, 0, 0,
          "<|channel|>analysis<|message|>Use the tool.<|end|><|start|>assistant<|channel|>commentary "
          "to=functions.get_weather <|constrain|>json<|message|>{\"city\":\"Oslo\"}<|call|>",
          "Use the tool.", "");
    check("harmony built-in tool dropped", REASON_HARMONY, 0, 1,
          "<|channel|>analysis to=browser.search code<|message|>{\"query\":\"x\"}<|call|>", "", "");
    check("not harmony at all", REASON_HARMONY, 0, 0, "Hello world <|end|>", "", "Hello world <|end|>");
    /* found by fuzz_reason: a header that only looks like one is content however it is cut */
    check("no header before <|message|>", REASON_HARMONY, 0, 1, "<|channel|ncs>en|>cnn<|message|>{\"a\":1}<|chan|>", "",
          "<|channel|ncs>en|>cnn<|message|>{\"a\":1}<|chan|>");
    check("a marker's start after a header's start", REASON_HARMONY, 0, 0,
          "<|channel|>analysis<|message|>x<|end|><|<|message|>y<|end|><", "x", "y");
    check("nothing at all", REASON_HARMONY, 0, 0, "", "", "");
    check("nothing at all (think)", REASON_THINK, 1, 0, "", "", "");
    check("cut inside a header", REASON_HARMONY, 0, 0, "<|channel|>analysis<|message|>a<|end|><|start|>assis", "a", "");
    check_call("harmony call, recipient in the channel",
               "<|channel|>analysis<|message|>Need the weather.<|end|><|start|>assistant<|channel|>commentary "
               "to=functions.get_weather <|constrain|>json<|message|>{\"city\":\"Paris\"}<|call|>",
               "Need the weather.", "get_weather", "{\"city\":\"Paris\"}");
    check_call("harmony call, recipient in the role header",
               "<|channel|>analysis<|message|>Add them.<|end|><|start|>assistant to=functions.add<|channel|>commentary "
               "json<|message|>{\"a\": 1, \"b\": 2}<|call|>",
               "Add them.", "add", "{\"a\":1,\"b\":2}");
    check_call("harmony forced call (the opening in the prompt, no <|call|>: EOG)",
               "<|channel|>commentary to=functions.add <|constrain|>json<|message|>{\"a\": 3}", "", "add", "{\"a\":3}");
    /* what a prompt tells */
    int ok = reason_prompt_open("<|im_start|>assistant\n<think>\n", 30) &&
             !reason_prompt_open("<|im_start|>assistant\n<think>\n\n</think>\n\n", 41) &&
             reason_kind_of("{{ '<|channel|>' }}", 19) == REASON_HARMONY && reason_kind_of(NULL, 0) == REASON_THINK;
    /* a prefill (the answer's given start) after the prompt */
    ok = ok && reason_prefill_open(1, "Let me see", 10) == 2 && reason_prefill_open(1, "", 0) == 1 &&
         reason_prefill_open(1, "x</think> y", 11) == 0 && reason_prefill_open(0, " <think>\nhm", 11) == 2 &&
         reason_prefill_open(0, "<think>", 7) == 1 && reason_prefill_open(0, "Hi <think>", 10) == 0 &&
         reason_prefill_open(0, "<think>a</think>", 16) == 0;
    printf("%s: prompt ends inside <think>; template kinds; prefills\n", ok ? "ok" : "FAIL");
    g_fail += !ok;
    printf("%s\n", g_fail ? "FAILED" : "all passed");
    return g_fail != 0;
}
