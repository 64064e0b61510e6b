/* Chat prompts and tool calls for both APIs (srv_internal.h): OpenAI-shaped
 * messages and tools rendered with the GGUF's own chat template
 * (chat_render_template, docs/chat-templates.md), the tools request fields
 * read strictly, and a finished answer split into content and tool calls.
 *
 * Anthropic requests are converted to the OpenAI shape by srv_anthropic.c
 * first, so there is one path from a conversation to prompt tokens, and
 * count_tokens counts exactly what a message request would read.
 *
 * Tools reach the model in one of two ways: templates that render `tools`
 * themselves (Qwen, Llama 3.x, ...) get them as the template variable; for
 * templates that ignore tools the server describes them in the system
 * message, asking for the `<tool_call>` format (SmolLM2's) or for DeepSeek's
 * own (its templates write earlier calls and results themselves, so the
 * history reaches them as it is). tool_choice "required"
 * or a named function writes the opening of a call at the start of the answer
 * (after the generation prompt), so the model can only continue it; the
 * opening is put back in front of the answer before parsing. A model that
 * may reason first (a think template, the reasoning parsed) is not given the
 * opening: the call's grammar starts with it, after the reasoning. */
#include <string.h>

#include "core/alloc.h"
#include "core/log.h"
#include "server/srv_grammar.h"
#include "server/srv_internal.h"
#include "server/srv_reason.h"
#include "server/srv_tools.h"

/* OpenAI function names: [a-zA-Z0-9_-]{1,64} (so they need no escaping in a prompt). */
static int valid_name(const char *n) {
    size_t len = strlen(n);
    if (len == 0 || len > 64) return 0;
    for (size_t i = 0; i < len; i++) {
        char c = n[i];
        if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' || c == '-'))
            return 0;
    }
    return 1;
}

int srv_check_tools(json_t *tools, srv_api api, const char *param, srv_err *e) {
    size_t i;
    json_t *t;
    json_array_foreach(tools, i, t) {
        json_t *fn = json_object_get(t, "function");
        const char *type = json_string_value(json_object_get(t, "type"));
        if (api == API_OPENAI && type && !strcmp(type, "custom")) /* OpenAI's free-form tools: a valid shape */
            return srv_fail(e, 400, param, "unsupported_parameter",
                            "'%s[%zu]': tools of type 'custom' are not supported by this server: use 'function'", param,
                            i);
        if (!json_is_object(t) || !type || strcmp(type, "function") || !json_is_object(fn))
            return srv_fail(e, 400, param, api == API_OPENAI ? "invalid_type" : "invalid_value",
                            "'%s[%zu]' must be {\"type\": \"function\", \"function\": {...}}", param, i);
        const char *name = json_string_value(json_object_get(fn, "name"));
        if (!name || !valid_name(name))
            return srv_fail(e, 400, param, "invalid_value",
                            "'%s[%zu].function.name' must be 1 to 64 letters, digits, '_' or '-'", param, i);
        json_t *d = json_object_get(fn, "description"), *p = json_object_get(fn, "parameters");
        if (d && !json_is_null(d) && !json_is_string(d))
            return srv_fail(e, 400, param, "invalid_type", "'%s[%zu].function.description' must be a string", param, i);
        if (p && !json_is_null(p) && !json_is_object(p))
            return srv_fail(e, 400, param, "invalid_type", "'%s[%zu].function.parameters' must be an object", param, i);
        for (size_t k = 0; k < i; k++)
            if (!strcmp(
                    json_string_value(json_object_get(json_object_get(json_array_get(tools, k), "function"), "name")),
                    name))
                return srv_fail(e, 400, param, "invalid_value", "'%s': the function name '%s' is given twice", param,
                                name);
    }
    return 0;
}

char *srv_call_opening(srv_ctx *s, const char *name) {
    sbuf b = {0};
    if (s->harmony) { /* after the prompt's <|start|>assistant: a commentary message to the function */
        sbuf_puts(&b, "<|channel|>commentary to=functions.");
        if (*name) sbuf_printf(&b, "%s <|constrain|>json<|message|>", name);
        return b.s;
    }
    if (s->tools_fam == TOOLS_XML) {
        sbuf_puts(&b, "<tool_call>\n<function=");
        if (*name) sbuf_printf(&b, "%s>\n", name);
        return b.s;
    }
    if (s->tools_fam == TOOLS_GLM) {
        sbuf_puts(&b, "<tool_call>");
        if (*name) sbuf_printf(&b, "%s\n", name);
        return b.s;
    }
    if (tools_deepseek((tools_family)s->tools_fam)) { /* to the name (any), or to the arguments (named) */
        const int v3 = s->tools_fam == TOOLS_DEEPSEEK;
        sbuf_puts(&b, TOOLS_DS_CALLS_BEGIN TOOLS_DS_CALL_BEGIN);
        if (v3) sbuf_puts(&b, "function" TOOLS_DS_SEP);
        if (*name) sbuf_printf(&b, v3 ? "%s\n```json\n" : "%s" TOOLS_DS_SEP, name);
        return b.s;
    }
    int llama = s->tools_fam == TOOLS_LLAMA3;
    sbuf_puts(&b, llama ? "{\"name\": \"" : "<tool_call>\n{\"name\": \"");
    if (*name) sbuf_printf(&b, "%s\", \"%s\": ", name, llama ? "parameters" : "arguments");
    return b.s;
}

/* For templates that know nothing of tools: earlier calls become the
 * assistant's text in the <tool_call> format it is asked for, and tool
 * results user turns in <tool_response> tags, so the model sees them. */
static void plain_history(json_t *msgs) {
    size_t i;
    json_t *m;
    json_array_foreach(msgs, i, m) {
        const char *role = json_string_value(json_object_get(m, "role"));
        json_t *calls = json_object_get(m, "tool_calls");
        const char *content = json_string_value(json_object_get(m, "content"));
        sbuf b = {0};
        sbuf_put(&b, "", 0);
        if (!strcmp(role, "tool")) {
            sbuf_printf(&b, "<tool_response>\n%s\n</tool_response>", content ? content : "");
            json_array_set_new(msgs, i, json_pack("{s:s, s:s}", "role", "user", "content", b.s));
        } else if (json_is_array(calls)) {
            if (content && *content) sbuf_printf(&b, "%s\n", content);
            size_t k;
            json_t *c;
            json_array_foreach(calls, k, c) {
                json_t *fn = json_object_get(c, "function");
                const char *args = json_string_value(json_object_get(fn, "arguments"));
                sbuf_printf(&b, "%s<tool_call>\n{\"name\": \"%s\", \"arguments\": %s}\n</tool_call>", k ? "\n" : "",
                            json_string_value(json_object_get(fn, "name")), args && *args ? args : "{}");
            }
            json_array_set_new(msgs, i, json_pack("{s:s, s:s}", "role", "assistant", "content", b.s));
        }
        sbuf_free(&b);
    }
}

int32_t *srv_chat_prompt(srv_ctx *s, json_t *messages, json_t *tools, const char *force, json_t *kwargs, int reason,
                         char **opening, char **lead, int *think_open, int *n_tok, srv_err *e) {
    *opening = *lead = NULL;
    if (think_open) *think_open = 0;
    /* the rendered prompt holds every message's text: when that alone cannot fit the context, refuse
     * before the template copies it (a rendered 8 MB message cost ~100 MB of copies) */
    size_t text_bytes = 0, i;
    json_t *m;
    json_array_foreach(messages, i, m) text_bytes += json_string_length(json_object_get(m, "content"));
    if (text_bytes > s->prompt_max_bytes) {
        srv_fail(e, 400, "messages", "context_length_exceeded",
                 "the messages hold %zu bytes of text: more than the %d-token context can hold (at most %zu bytes, "
                 "%zu per token at most for this model), so they were not tokenized",
                 text_bytes, s->n_ctx, s->prompt_max_bytes, s->max_piece);
        return NULL;
    }
    json_t *msgs = json_copy(messages); /* shallow: elements shared, the list ours */
    size_t n = json_array_size(msgs);
    /* a last assistant message without calls is continued (Anthropic's prefill) */
    json_t *last = json_array_get(msgs, n - 1);
    const char *prefill = NULL;
    json_t *keep_last = NULL;
    if (n && !strcmp(json_string_value(json_object_get(last, "role")), "assistant") &&
        !json_object_get(last, "tool_calls") && json_is_string(json_object_get(last, "content"))) {
        keep_last = json_incref(last);
        prefill = json_string_value(json_object_get(last, "content"));
        json_array_remove(msgs, n - 1);
    }
    int have_tools = json_is_array(tools) && json_array_size(tools) > 0;
    if (!s->tmpl_tools && !s->tmpl_calls) plain_history(msgs);
    else if (!s->tmpl_tools) /* DeepSeek's templates add an assistant's content to its calls: none is "" there */
        json_array_foreach(msgs, i, m) if (json_object_get(m, "tool_calls") && !json_object_get(m, "content")) {
            json_t *c = json_copy(m);
            json_object_set_new(c, "content", json_string(""));
            json_array_set_new(msgs, i, c);
        }
    if (s->harmony) /* gpt-oss's template reads an earlier answer's reasoning as `thinking` (llama-server's mapping) */
        json_array_foreach(msgs, i, m) {
            json_t *rc = json_object_get(m, "reasoning_content");
            if (!json_is_string(rc)) continue;
            json_t *c = json_deep_copy(m);
            json_object_set(c, "thinking", rc);
            if (json_array_size(json_object_get(c, "tool_calls"))) json_object_del(c, "content"); /* one or the other */
            json_array_set_new(msgs, i, c);
        }
    if (have_tools && !s->tmpl_tools) { /* describe the tools in the system message */
        char *desc = tools_system_prompt(tools, (tools_family)s->tools_fam);
        json_t *first = json_array_get(msgs, 0);
        const char *sys = json_string_value(json_object_get(first, "content"));
        if (first && !strcmp(json_string_value(json_object_get(first, "role")), "system") && sys) {
            sbuf b = {0};
            sbuf_printf(&b, "%s\n\n%s", sys, desc);
            json_array_set_new(msgs, 0, json_pack("{s:s, s:s}", "role", "system", "content", b.s));
            sbuf_free(&b);
        } else json_array_insert_new(msgs, 0, json_pack("{s:s, s:s}", "role", "system", "content", desc));
        st_free(desc);
    }
    int32_t *ids = NULL;
    char *text = json_array_size(msgs)
                     ? chat_render_template(s->gf, s->tok, msgs, have_tools && s->tmpl_tools ? tools : NULL, kwargs, 1)
                     : st_strdup("");
    json_decref(msgs);
    if (!text) {
        srv_fail(e, 400, "messages", "invalid_value", "the model's chat template refused the conversation: %s",
                 st_error_get());
        goto out;
    }
    sbuf b = {0};
    sbuf_puts(&b, text);
    st_free(text);
    int open = reason_prompt_open(b.s, b.len); /* the generation prompt opened <think> */
    /* the model may reason before its answer: the prompt opened the block, or the template knows <think>
     * and the model opens it itself (a grammar then waits for the block to close: srv_job.c) */
    int may = reason && s->reason == REASON_THINK && !prefill && !open && s->tmpl_think;
    if (prefill) {
        open = reason_prefill_open(open, prefill, strlen(prefill)); /* the answer's start, given */
        sbuf_puts(&b, prefill);
    } else if (force && have_tools) {
        char *o = srv_call_opening(s, force);
        if (reason && s->reason == REASON_THINK && (open || may)) *lead = o; /* written after the reasoning */
        else {
            *opening = o;
            sbuf_puts(&b, o);
        }
    }
    if (think_open) *think_open = may ? SRV_THINK_MAY : *opening ? 0 : open; /* a forced opening is no reasoning */
    ids = srv_tokenize(s, b.s, b.len, 1, 1, "messages", n_tok, e);
    sbuf_free(&b);
out:
    json_decref(keep_last);
    return ids;
}

void srv_job_call_prefix(const srv_job *j, char *out, size_t cap) {
    const char *hex = strchr(j->id, '-') ? strchr(j->id, '-') + 1 : strchr(j->id, '_') ? strchr(j->id, '_') + 1 : j->id;
    snprintf(out, cap, "%s%.12s_", j->api->call_prefix, hex);
}

void srv_job_stream_opening(srv_job *j) {
    if (j->ts && j->call_opening && !j->rs) tools_stream_feed(j->ts, j->call_opening, strlen(j->call_opening));
}

json_t *srv_job_tool_calls(srv_job *j, sbuf *content) {
    sbuf all = {0};
    sbuf_put(&all, "", 0);
    if (j->call_opening) sbuf_puts(&all, j->call_opening);
    if (j->text.len) sbuf_put(&all, j->text.s, j->text.len);
    char prefix[96];
    srv_job_call_prefix(j, prefix, sizeof prefix);
    size_t clen = all.len;
    json_t *calls = tools_parse(all.s, all.len, j->tools, prefix, &clen);
    content->len = 0;
    sbuf_put(content, all.s, calls ? clen : all.len); /* no call: the whole answer, a forced opening included */
    sbuf_free(&all);
    return calls;
}

/* ---- constrained answers (srv_grammar.h) ---- */

int srv_grammar_check(const char *text, size_t len, const char *param, const char *code, srv_err *e) {
    char err[512];
    grammar *g = grammar_parse(text, len, err, sizeof err);
    if (!g) return srv_fail(e, 400, param, code, "'%s': %s", param, err);
    grammar_free(g);
    return 0;
}

/* The root rule: body, after lead (the call's opening, which the model writes itself) when there is one. */
static void put_root(gschema *c, const char *lead, const char *body) {
    gschema_put(c, "root ::= ");
    if (lead) {
        gschema_put_literal(c, lead, strlen(lead));
        gschema_put(c, " ");
    }
    gschema_put(c, body);
}

/* Tool i's schema as the request names it (param), and 0, or 400 when it describes no object. */
static int tool_params(srv_api api, size_t i, const json_t *params, char *param, size_t cap, srv_err *e) {
    if (api == API_ANTHROPIC) snprintf(param, cap, "tools.%zu.input_schema", i);
    else snprintf(param, cap, "tools[%zu].function.parameters", i);
    const char *type = json_string_value(json_object_get(params, "type"));
    if (type && strcmp(type, "object"))
        return srv_fail(e, 400, param, "invalid_value", "'%s' must describe an object (type 'object'), not '%s'", param,
                        type);
    return 0;
}

/* Tool i's arguments as rule "tool<i>" of c, from its JSON schema (none: an object taking nothing): 0, or
 * -1 with e set (forced: the request cannot be served as asked; auto: the call is left free). */
static int put_tool_schema(gschema *c, json_t *fn, size_t i, srv_api api, srv_err *e) {
    json_t *params = json_object_get(fn, "parameters"), *own = NULL;
    if (!params || json_is_null(params))
        params = own = json_pack("{s:s, s:{}, s:b}", "type", "object", "properties", "additionalProperties", 0);
    char name[32], param[96], err[512];
    snprintf(name, sizeof name, "tool%zu", i);
    int rc = tool_params(api, i, params, param, sizeof param, e);
    if (rc == 0 && (rc = gschema_add(c, params, name, err, sizeof err)) < 0)
        srv_fail(e, 400, param, "unsupported_parameter", "'%s': %s", param, err);
    json_decref(own);
    return rc < 0 ? -1 : 0;
}

/* One alternative of a "call-rest" rule: the literal text head, then rest (a rule expression). */
static void put_call_alt(sbuf *alts, size_t *n_alt, const char *head, const char *rest) {
    char *lh = grammar_literal(head, strlen(head));
    sbuf_printf(alts, "%s%s %s", (*n_alt)++ ? " | " : "", lh, rest);
    st_free(lh);
}

/* ---- markup calls' grammar (TOOLS_XML, TOOLS_GLM) ---- */

/* Rule `name`: any text without stop in it. stop's first byte must occur in it once and its bytes need no
 * escapes ("</parameter>", "</arg_value>"): the text is chunks, each a byte other than stop[0], or stop[0]
 * and a run of stop's next bytes broken by another byte (stop[0] there starts the run again), so the text
 * cannot end inside such a run either. */
static void put_text_without(gschema *c, const char *name, const char *stop) {
    const size_t m = strlen(stop);
    sbuf b = {0};
    sbuf_printf(&b, "%s ::= ( [^%c] | \"%c\" %s-1 )*\n", name, stop[0], stop[0], name);
    for (size_t k = 1; k < m; k++) {
        sbuf_printf(&b, "%s-%zu ::= [^%c%c] | \"%c\" %s-1", name, k, stop[k], stop[0], stop[0], name);
        if (k + 1 < m) sbuf_printf(&b, " | \"%c\" %s-%zu", stop[k], name, k + 1);
        sbuf_puts(&b, "\n");
    }
    gschema_put(c, b.s);
    sbuf_free(&b);
}

/* Rule `rule`: one value of a markup call, as the parser types it (tools_typed_string): free text (or the
 * enum's strings) for a key typed as a string, else JSON of the key's schema. 0, or -1 with err. */
static int put_markup_value(gschema *c, const json_t *prop, const char *rule, const char *text, char *err, size_t cap) {
    if (!tools_typed_string(prop)) return gschema_add(c, prop, rule, err, cap);
    sbuf b = {0};
    sbuf_printf(&b, "%s ::= ", rule);
    size_t i, n = 0;
    json_t *v;
    json_array_foreach(json_object_get(prop, "enum"), i, v) if (json_is_string(v)) {
        char *l = grammar_literal(json_string_value(v), json_string_length(v));
        sbuf_printf(&b, "%s%s", n++ ? " | " : "", l);
        st_free(l);
    }
    sbuf_printf(&b, "%s\n", n ? "" : text);
    gschema_put(c, b.s);
    sbuf_free(&b);
    return 0;
}

/* Rule tool<i>-call: the arguments of tool i in the markup, then the call's end. Keys in the schema's
 * order, the required ones always and the others optional; any keys with text values when the schema
 * names no properties. 0, or -1 with err. */
static int put_markup_call(gschema *c, int xml, const json_t *params, size_t i, char *err, size_t cap) {
    const char *text = xml ? "xml-text" : "glm-text";
    const json_t *props = json_object_get(params, "properties"), *req = json_object_get(params, "required");
    sbuf b = {0};
    sbuf_printf(&b, "tool%zu-call ::=", i);
    if (!json_is_object(props))
        sbuf_printf(&b,
                    xml ? " ( \"<parameter=\" markup-key \">\\n\" %s \"\\n</parameter>\\n\" )*"
                        : " ( \"<arg_key>\" markup-key \"</arg_key>\\n<arg_value>\" %s \"</arg_value>\\n\" )*",
                    text);
    const char *key;
    json_t *prop;
    size_t j = 0;
    json_object_foreach((json_t *)props, key, prop) {
        char rule[64];
        snprintf(rule, sizeof rule, "tool%zu-arg%zu", i, j++);
        if (put_markup_value(c, prop, rule, text, err, cap) < 0) {
            sbuf_free(&b);
            return -1;
        }
        int required = 0;
        size_t k;
        json_t *r;
        json_array_foreach((json_t *)req, k, r) required |= json_is_string(r) && !strcmp(json_string_value(r), key);
        sbuf open = {0};
        sbuf_printf(&open, xml ? "<parameter=%s>\n" : "<arg_key>%s</arg_key>\n<arg_value>", key);
        char *lo = grammar_literal(open.s, open.len);
        sbuf_printf(&b, " %s%s %s %s%s", required ? "" : "( ", lo, rule,
                    xml ? "\"\\n</parameter>\\n\"" : "\"</arg_value>\\n\"", required ? "" : " )?");
        st_free(lo);
        sbuf_free(&open);
    }
    sbuf_printf(&b, " %s\n", xml ? "\"</function>\\n</tool_call>\"" : "\"</tool_call>\"");
    gschema_put(c, b.s);
    sbuf_free(&b);
    return 0;
}

/* A tools grammar's text, checked as the engine will compile it (NULL and e set when it cannot). */
static char *tools_grammar_finish(gschema *c, srv_err *e) {
    size_t len;
    char *text = gschema_finish(c, &len);
    if (srv_grammar_check(text, len, "tools", "unsupported_parameter", e) < 0) {
        st_free(text);
        return NULL;
    }
    return text;
}

/* srv_tools_grammar for the markup families: the same calls, written as their templates write them. */
static char *markup_grammar(srv_ctx *s, json_t *tools, const char *force, const char *lead, srv_api api, srv_err *e) {
    const int xml = s->tools_fam == TOOLS_XML;
    gschema *c = gschema_new();
    put_text_without(c, xml ? "xml-text" : "glm-text", xml ? "</parameter>" : "</arg_value>");
    gschema_put(c, "markup-key ::= [A-Za-z0-9_.]+\n");
    sbuf alts = {0};
    sbuf_puts(&alts, "call-rest ::= ");
    size_t i, n_alt = 0;
    long named = -1;
    json_t *t;
    json_array_foreach(tools, i, t) {
        json_t *fn = json_object_get(t, "function"), *params = json_object_get(fn, "parameters");
        const char *fname = json_string_value(json_object_get(fn, "name"));
        if (force && *force && strcmp(fname, force)) continue;
        char param[96], err[512];
        int rc = tool_params(api, i, params, param, sizeof param, e);
        if (rc == 0 && (rc = put_markup_call(c, xml, params, i, err, sizeof err)) < 0)
            srv_fail(e, 400, param, "unsupported_parameter", "'%s': %s", param, err);
        if (rc < 0) {
            gschema_free(c);
            sbuf_free(&alts);
            return NULL;
        }
        char head[96], rest[32];
        snprintf(head, sizeof head, xml ? "%s>\n" : "%s\n", fname);
        snprintf(rest, sizeof rest, "tool%zu-call", i);
        put_call_alt(&alts, &n_alt, head, rest);
        if (force && *force) named = (long)i;
    }
    sbuf_puts(&alts, "\n");
    gschema_put(c, alts.s);
    sbuf_free(&alts);
    if (!force) /* after the model's own <tool_call> (the trigger): one or more whole calls */
        gschema_put(c, xml ? "root ::= xml-call ( [ \\n]* \"<tool_call>\" xml-call )*\n"
                             "xml-call ::= \"\\n<function=\" call-rest\n"
                           : "root ::= call-rest ( [ \\n]* \"<tool_call>\" call-rest )*\n");
    else if (named >= 0) { /* the opening wrote the name */ char r[48];
        snprintf(r, sizeof r, "tool%ld-call\n", named);
        put_root(c, lead, r);
    } else put_root(c, lead, "call-rest\n");
    return tools_grammar_finish(c, e);
}

/* ---- DeepSeek's calls' grammar (TOOLS_DEEPSEEK, TOOLS_DEEPSEEK31) ---- */

/* srv_tools_grammar for DeepSeek's shapes: the calls as its templates write them, the arguments JSON of
 * the tool's schema. Forced: one call, after the opening (srv_call_opening), then the block's end; auto: after
 * the model's own <｜tool▁calls▁begin｜> (the trigger), one or more calls (V3's template puts a newline
 * between them) and the block's end. */
static char *deepseek_grammar(srv_ctx *s, json_t *tools, const char *force, const char *lead, srv_api api, srv_err *e) {
    const int v3 = s->tools_fam == TOOLS_DEEPSEEK;
    gschema *c = gschema_new();
    sbuf alts = {0}; /* after the call's opening (<｜tool▁call▁begin｜>, V3's `function<｜tool▁sep｜>`) */
    sbuf_puts(&alts, "call-rest ::= ");
    size_t i, n_alt = 0;
    long named = -1;
    json_t *t;
    json_array_foreach(tools, i, t) {
        json_t *fn = json_object_get(t, "function");
        const char *fname = json_string_value(json_object_get(fn, "name"));
        if (force && *force && strcmp(fname, force)) continue;
        if (put_tool_schema(c, fn, i, api, e) < 0) {
            gschema_free(c);
            sbuf_free(&alts);
            return NULL;
        }
        char head[96], rest[48];
        snprintf(head, sizeof head, v3 ? "%s\n```json\n" : "%s" TOOLS_DS_SEP, fname);
        snprintf(rest, sizeof rest, "tool%zu call-end", i);
        put_call_alt(&alts, &n_alt, head, rest);
        if (force && *force) named = (long)i;
    }
    sbuf_puts(&alts, "\n");
    gschema_put(c, alts.s);
    sbuf_free(&alts);
    const char *const marks[3][2] = {
        {"call-open", v3 ? TOOLS_DS_CALL_BEGIN "function" TOOLS_DS_SEP : TOOLS_DS_CALL_BEGIN},
        {"call-end", v3 ? "\n```" TOOLS_DS_CALL_END : TOOLS_DS_CALL_END},
        {"calls-end", TOOLS_DS_CALLS_END}};
    for (int k = 0; k < 3; k++) {
        char *l = grammar_literal(marks[k][1], strlen(marks[k][1]));
        sbuf r = {0};
        sbuf_printf(&r, "%s ::= %s\n", marks[k][0], l);
        gschema_put(c, r.s);
        sbuf_free(&r);
        st_free(l);
    }
    if (!force) gschema_put(c, "root ::= call-open call-rest ( \"\\n\"? call-open call-rest )* calls-end\n");
    else if (named >= 0) {
        char body[64]; /* the opening wrote the name: the arguments follow */
        snprintf(body, sizeof body, "tool%ld call-end calls-end\n", named);
        put_root(c, lead, body);
    } else put_root(c, lead, "call-rest calls-end\n");
    return tools_grammar_finish(c, e);
}

char *srv_tools_grammar(srv_ctx *s, json_t *tools, const char *force, const char *lead, srv_api api, srv_err *e) {
    if (tools_markup((tools_family)s->tools_fam) && !s->harmony) return markup_grammar(s, tools, force, lead, api, e);
    if (tools_deepseek((tools_family)s->tools_fam) && !s->harmony)
        return deepseek_grammar(s, tools, force, lead, api, e);
    int llama = s->tools_fam == TOOLS_LLAMA3, lazy = !force, harmony = s->harmony;
    if (lazy && (llama || harmony)) return NULL; /* Llama 3: the whole answer is the call; harmony: not yet */
    gschema *c = gschema_new();
    size_t i, n_alt = 0;
    json_t *t;
    sbuf alts = {0}; /* after the name's opening quote: the name, the arguments key and the arguments */
    sbuf_puts(&alts, "call-rest ::= ");
    json_array_foreach(tools, i, t) {
        json_t *fn = json_object_get(t, "function");
        const char *fname = json_string_value(json_object_get(fn, "name"));
        if (force && *force && strcmp(fname, force)) continue;
        if (put_tool_schema(c, fn, i, api, e) < 0) {
            gschema_free(c);
            sbuf_free(&alts);
            return NULL;
        }
        char head[96], rest[96];
        snprintf(head, sizeof head, harmony ? "%s <|constrain|>json<|message|>" : "%s\"", fname);
        if (harmony) /* the header's rest, then the arguments as the message */
            snprintf(rest, sizeof rest, "tool%zu", i);
        else
            snprintf(rest, sizeof rest, "json-ws \",\" json-ws \"\\\"%s\\\"\" json-ws \":\" json-ws tool%zu",
                     llama ? "parameters" : "arguments", i);
        put_call_alt(&alts, &n_alt, head, rest);
    }
    sbuf_puts(&alts, "\n");
    gschema_put(c, alts.s);
    sbuf_free(&alts);
    if (lazy) /* after the model's own <tool_call> (the trigger): one or more whole calls */
        gschema_put(
            c, "root ::= call ( json-ws \"<tool_call>\" call )*\n"
               "call ::= json-ws \"{\" json-ws \"\\\"name\\\"\" json-ws \":\" json-ws \"\\\"\" call-rest json-ws \"}\" "
               "json-ws \"</tool_call>\"\n");
    else if (harmony) { /* the opening ends before the name (any) or at the message (named): the arguments end it */
        char r[160];
        size_t k;
        snprintf(r, sizeof r, "call-rest\n");
        if (*force)
            json_array_foreach(
                tools, k, t) if (!strcmp(json_string_value(json_object_get(json_object_get(t, "function"), "name")),
                                         force)) snprintf(r, sizeof r, "tool%zu\n", k);
        put_root(c, lead, r);
    } else if (!*force) /* the opening ends at the name's quote */
        put_root(c, lead, llama ? "call-rest json-ws \"}\"\n" : "call-rest json-ws \"}\" json-ws \"</tool_call>\"\n");
    else { /* the opening ends after the arguments key */ char r[160];
        snprintf(r, sizeof r, "json-ws tool%zu json-ws \"}\"%s\n", (size_t)0, "");
        size_t k;
        json_array_foreach(
            tools, k, t) if (!strcmp(json_string_value(json_object_get(json_object_get(t, "function"), "name")), force))
            snprintf(r, sizeof r, "json-ws tool%zu json-ws \"}\"%s\n", k, llama ? "" : " json-ws \"</tool_call>\"");
        put_root(c, lead, r);
    }
    return tools_grammar_finish(c, e);
}

void srv_job_lazy_tools(srv_job *j, json_t *tools, srv_api api) {
    srv_err scratch; /* a schema the engine cannot enforce leaves auto calls free, as before: no error */
    char *g = j->srv->tools_fam != TOOLS_LLAMA3 ? srv_tools_grammar(j->srv, tools, NULL, NULL, api, &scratch) : NULL;
    if (!g) return;
    job_set_grammar(j, g);
    j->req.grammar_trigger = tools_deepseek((tools_family)j->srv->tools_fam) ? TOOLS_DS_CALLS_BEGIN : "<tool_call>";
}

/* ---- reasoning (srv_reason.h) ---- */

int srv_parse_reasoning_format(srv_ctx *s, json_t *body, int *on, srv_err *e) {
    const char *v;
    *on = s->p.reasoning;
    int rc = jf_string(body, "reasoning_format", &v, e);
    if (rc <= 0) return rc;
    if (!strcmp(v, "none")) *on = 0;
    else if (!strcmp(v, "auto") || !strcmp(v, "deepseek")) *on = 1;
    else if (!strcmp(v, "deepseek-legacy")) /* llama-server's: reasoning in content too, when streaming */
        return srv_fail(
            e, 400, "reasoning_format", "unsupported_parameter",
            "'reasoning_format' deepseek-legacy is not supported by this server: use auto, deepseek or none");
    else
        return srv_fail(e, 400, "reasoning_format", "invalid_value",
                        "'reasoning_format' must be 'none', 'auto' or 'deepseek', not '%s'", v);
    return 1;
}
