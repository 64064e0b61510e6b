/* Tool calls in a model's text: the parser that turns a generated answer into
 * OpenAI-shaped tool_calls, and the forced-call opening that tool_choice
 * "required" / a named function writes at the start of the answer.
 *
 * Kept apart from srv_internal.h (no HTTP types) so that tests/server can
 * unit-test the parser on recorded model outputs. */
#ifndef STRATA_SERVER_SRV_TOOLS_H
#define STRATA_SERVER_SRV_TOOLS_H

#include <jansson.h>
#include <stddef.h>

/* How the model writes a call, chosen from its chat template's text:
 * TOOLS_TAGGED  `<tool_call>\n{"name": ..., "arguments": {...}}\n</tool_call>`
 *               (Qwen2.5, Qwen3, Qwen3-Next, Hermes; also what the server asks of
 *               templates that do not mention tools at all, SmolLM2's among them)
 * TOOLS_LLAMA3  a bare `{"name": ..., "parameters": {...}}` (Llama 3.1-3.3's
 *               JSON tool calling; `<|python_tag|>` before it is skipped)
 * TOOLS_XML     `<tool_call>\n<function=NAME>\n<parameter=KEY>\nVALUE\n</parameter>\n
 *               </function>\n</tool_call>` (Qwen3.5, Qwen3-Coder)
 * TOOLS_GLM     `<tool_call>NAME\n<arg_key>KEY</arg_key>\n<arg_value>VALUE</arg_value>\n
 *               </tool_call>` (GLM-4.5, GLM-4.6)
 * In those two a value is text: a string where the function's schema
 * types the key as one, else JSON when it reads as JSON (numbers, booleans,
 * objects, as the templates write them), else the text as a string.
 * TOOLS_DEEPSEEK    `<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>NAME\n```json\n
 *                   {ARGS}\n```<｜tool▁call▁end｜>` (more calls, each after a newline), then
 *                   `<｜tool▁calls▁end｜>` (DeepSeek V3, R1)
 * TOOLS_DEEPSEEK31  `<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>NAME<｜tool▁sep｜>{ARGS}<｜tool▁call▁end｜>`
 *                   (more calls), then `<｜tool▁calls▁end｜>` (DeepSeek V3.1)
 * DeepSeek's markers (｜ is U+FF5C, ▁ U+2581) are one token each in its
 * vocabulary, control tokens in llama.cpp's conversions: the engine writes
 * them as text for these families when tools are offered. */
typedef enum { TOOLS_TAGGED, TOOLS_LLAMA3, TOOLS_XML, TOOLS_GLM, TOOLS_DEEPSEEK, TOOLS_DEEPSEEK31 } tools_family;

#define TOOLS_DS_CALLS_BEGIN "<｜tool▁calls▁begin｜>"
#define TOOLS_DS_CALL_BEGIN  "<｜tool▁call▁begin｜>"
#define TOOLS_DS_SEP         "<｜tool▁sep｜>"
#define TOOLS_DS_CALL_END    "<｜tool▁call▁end｜>"
#define TOOLS_DS_CALLS_END   "<｜tool▁calls▁end｜>"

tools_family tools_family_of(const char *tmpl, size_t len);
/* 1 for the markup families (TOOLS_XML, TOOLS_GLM). */
static inline int tools_markup(tools_family fam) { return fam == TOOLS_XML || fam == TOOLS_GLM; }
/* 1 for DeepSeek's two shapes. */
static inline int tools_deepseek(tools_family fam) { return fam == TOOLS_DEEPSEEK || fam == TOOLS_DEEPSEEK31; }
/* 1 when a property's schema types it as a string (alone, or beside null):
 * its markup value is then text, not JSON (the parser and the grammar). */
int tools_typed_string(const json_t *prop);
/* 1 when the template renders `tools` itself (else the server describes them
 * in a system message). */
int tools_template_handles(const char *tmpl, size_t len);
/* 1 when the template writes earlier calls (an assistant message's `tool_calls`) itself: the history
 * then reaches it as it is (else the server writes calls and results into the messages' text). */
int tools_template_calls(const char *tmpl, size_t len);

/* Parse tool calls out of text. tools: the request's OpenAI-shaped tools (a
 * call naming a function not among them is not a call). Returns a new array
 * of {id, type:"function", function:{name, arguments (a JSON string)}} or
 * NULL when the text holds none; *content_len gets the length of the text
 * before the first call (the answer's content, trailing space trimmed).
 *
 * Recognised, in this order: `<tool_call>` blocks (one or more, each JSON or
 * either markup above, whatever the family; a missing closing tag at the end
 * is tolerated: a stop or max_tokens may cut it) or DeepSeek blocks (either
 * shape, whatever the family; `<｜tool▁call▁begin｜>` may be left out, a
 * call's JSON counts once whole), whichever opens first (the other when
 * those hold no call), then
 * the whole text (after optional `<|python_tag|>` and a ```json fence) as one
 * JSON object {"name", "parameters"|"arguments"} or an array of them.
 * id_prefix: ids are "<id_prefix><n>" so they are unique per response. */
json_t *tools_parse(const char *text, size_t len, const json_t *tools, const char *id_prefix, size_t *content_len);

/* The system-message text that describes tools to a model whose template
 * ignores them (st_malloc'd): the tools as JSON, and how to call them: in
 * DeepSeek's shape for its families, else the TOOLS_TAGGED format. */
char *tools_system_prompt(const json_t *tools, tools_family fam);

/* Tool calls as they are generated (streaming): text is fed as it comes and
 * the callbacks get the answer's content, then each call's start (index, id,
 * name) as soon as its name is read, its arguments in fragments as they
 * arrive (the model's own JSON text), and its end; a markup call (TOOLS_XML,
 * TOOLS_GLM) goes out whole once its closing tag is read, its arguments as
 * one JSON fragment. What cannot be told
 * apart yet (a possible `<tool_call>` tag or DeepSeek marker at the end of
 * the text, a bare JSON answer that may be a call) is held back; what never takes the expected
 * shape (arguments before the name, an unknown function) is held to the end
 * and decided there by tools_parse, as a whole answer is. */
typedef struct {
    void (*content)(void *ctx, const char *text, size_t len);
    void (*call_begin)(void *ctx, int index, const char *id, const char *name);
    void (*call_args)(void *ctx, int index, const char *text, size_t len);
    void (*call_end)(void *ctx, int index);
} tools_stream_cb;
typedef struct tools_stream tools_stream;

tools_stream *tools_stream_new(const json_t *tools, tools_family fam, const char *id_prefix, const tools_stream_cb *cb,
                               void *ctx);
void tools_stream_feed(tools_stream *ts, const char *text, size_t len);
/* The text has ended: what was held back goes out. Returns how many calls were sent. */
int tools_stream_end(tools_stream *ts);
void tools_stream_free(tools_stream *ts);

#endif
