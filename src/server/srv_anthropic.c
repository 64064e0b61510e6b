/* Anthropic API: POST /v1/messages (one message, or the SSE events
 * message_start, content_block_start, content_block_delta..., content_block_stop,
 * message_delta, message_stop) and POST /v1/messages/count_tokens.
 *
 * Parameter policy as for OpenAI (srv_openai.c): known and honoured, known
 * and ignored (metadata, service_tier), known but not given yet (400
 * "unsupported"), unknown (400, as Anthropic answers extra inputs). A thinking
 * model's reasoning comes back as `thinking` blocks (srv_reason.h), as
 * llama-server gives them: with an empty signature.
 * Usage follows Anthropic's accounting: input_tokens counts the prompt tokens
 * read, cache_read_input_tokens those reused from the slot's cache; their
 * sum is what count_tokens returns. */
#include <string.h>

#include "core/alloc.h"
#include "server/srv_grammar.h"
#include "server/srv_internal.h"
#include "server/srv_tools.h"

/* temperature, top_p and top_k are gone from the newest API but older clients send them */
static const char *const MESSAGE_KEYS[] = {"model", "messages", "max_tokens", "system", "stop_sequences", "stream",
                                           "temperature", "top_p", "top_k", "metadata", "tools", "tool_choice",
                                           "thinking", "service_tier", "cache_control", "container", "diagnostics",
                                           "inference_geo", "output_config", "speed", "user_profile_id", "workspace_id",
                                           /* extensions */
                                           "min_p", "seed", "repeat_penalty", NULL};
static const char *const COUNT_KEYS[] = {"model",       "messages",        "system",        "tools",
                                         "tool_choice", "thinking",        "cache_control", "output_config",
                                         "speed",       "user_profile_id", "workspace_id",  NULL};

/* Known fields with no effect here (caching hints, routing, ids): type-checked, ignored. */
static const struct {
    const char *key;
    json_type type;
} IGNORED[] = {
    {"metadata", JSON_OBJECT},        {"service_tier", JSON_STRING},  {"cache_control", JSON_OBJECT},
    {"diagnostics", JSON_OBJECT},     {"inference_geo", JSON_STRING}, {"speed", JSON_STRING},
    {"user_profile_id", JSON_STRING}, {"workspace_id", JSON_STRING},  {"container", JSON_NULL},
};

static int unsupported(srv_err *e, const char *key, const char *why) {
    return srv_fail(e, 400, key, "unsupported_parameter", "%s: not supported by this server yet (%s)", key, why);
}

/* tools (Anthropic: name, description, input_schema) -> OpenAI shape in *tools
 * (NULL when none or tool_choice none); tool_choice any/tool -> *force. */
static int parse_tools(json_t *body, json_t **tools, const char **force, srv_err *e) {
    *tools = NULL;
    *force = NULL;
    json_t *v = json_object_get(body, "tools");
    if (v && !json_is_null(v)) {
        if (!json_is_array(v)) return srv_fail(e, 400, "tools", "invalid_type", "tools: must be an array");
        json_t *out = json_array(), *t;
        size_t i;
        json_array_foreach(v, i, t) {
            const char *type = json_string_value(json_object_get(t, "type"));
            json_t *name = json_object_get(t, "name"), *desc = json_object_get(t, "description");
            json_t *schema = json_object_get(t, "input_schema");
            if (!json_is_object(t) || (type && strcmp(type, "custom"))) {
                json_decref(out);
                return unsupported(e, "tools", "only client tools with an input_schema");
            }
            if (!json_is_string(name) || !json_is_object(schema) || (desc && !json_is_string(desc))) {
                json_decref(out);
                return srv_fail(e, 400, "tools", "invalid_type",
                                "tools.%zu: must have a string 'name' and an object 'input_schema'", i);
            }
            json_t *fn = json_pack("{s:O, s:O}", "name", name, "parameters", schema);
            if (desc) json_object_set(fn, "description", desc);
            json_array_append_new(out, json_pack("{s:s, s:o}", "type", "function", "function", fn));
        }
        if (srv_check_tools(out, API_ANTHROPIC, "tools", e) < 0) {
            json_decref(out);
            return -1;
        }
        if (json_array_size(out)) *tools = out;
        else json_decref(out);
    }
    v = json_object_get(body, "tool_choice");
    if (v && !json_is_null(v)) {
        json_t *t = json_object_get(v, "type");
        if (!json_is_object(v) || !json_is_string(t))
            return srv_fail(e, 400, "tool_choice", "invalid_type", "tool_choice: must be an object with a 'type'");
        const char *type = json_string_value(t), *name = json_string_value(json_object_get(v, "name"));
        if (!strcmp(type, "none")) {
            json_decref(*tools);
            *tools = NULL;
        } else if (!strcmp(type, "any")) *force = "";
        else if (!strcmp(type, "tool") && name) *force = name;
        else if (!strcmp(type, "tool"))
            return srv_fail(e, 400, "tool_choice", "invalid_value", "tool_choice: type 'tool' needs the tool's 'name'");
        else if (strcmp(type, "auto"))
            return srv_fail(e, 400, "tool_choice", "invalid_value",
                            "tool_choice.type: must be auto, any, tool or none");
        if (*force && !*tools) return srv_fail(e, 400, "tool_choice", "invalid_value", "tool_choice: requires tools");
        if (*force && **force) {
            int found = 0;
            size_t i;
            json_t *x;
            json_array_foreach(*tools, i, x) found |=
                !strcmp(json_string_value(json_object_get(json_object_get(x, "function"), "name")), name);
            if (!found) {
                json_decref(*tools);
                *tools = NULL;
                return srv_fail(e, 400, "tool_choice", "invalid_value", "tool_choice.name: '%s' is not in tools", name);
            }
        }
    }
    return 0;
}

/* What Anthropic's API requires of every request under /v1/messages before it
 * looks further: the anthropic-version header (the official SDKs always send
 * it) and a model. */
static int check_required(struct MHD_Connection *c, json_t *body, srv_err *e) {
    const char *v = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "anthropic-version");
    if (!v || !*v)
        return srv_fail(e, 400, "anthropic-version", "missing_required_header",
                        "anthropic-version: header is required");
    const char *s;
    int rc = jf_string(body, "model", &s, e);
    if (rc < 0) return -1;
    if (rc == 0) return srv_fail(e, 400, "model", "missing_required_parameter", "model: Field required");
    return 0;
}

static int check_common(json_t *body, srv_err *e) {
    json_t *v;
    v = json_object_get(body, "thinking");
    if (v && !json_is_null(v)) {
        json_t *t = json_object_get(v, "type");
        if (!json_is_object(v) || !json_is_string(t))
            return srv_fail(e, 400, "thinking", "invalid_type", "thinking: must be an object with a 'type'");
        const char *ty = json_string_value(t);
        if (!strcmp(ty, "enabled")) { /* Anthropic's rule: a budget of at least 1024 tokens, below max_tokens */
            static const char *const keys[] = {"type", "budget_tokens", "display", NULL};
            long long budget = 0, max = 0;
            int rc = jf_int(v, "budget_tokens", 1024, INT32_MAX, &budget, e);
            if (rc < 0 || jf_known_keys(v, keys, e) < 0) return -1;
            if (!rc)
                return srv_fail(e, 400, "thinking.budget_tokens", "missing_required_parameter",
                                "thinking.enabled.budget_tokens: Field required");
            if (jf_int(body, "max_tokens", 1, INT32_MAX, &max, e) > 0 && budget >= max)
                return srv_fail(e, 400, "thinking.budget_tokens", "invalid_value",
                                "`max_tokens` must be greater than `thinking.budget_tokens`");
        } else if (strcmp(ty, "disabled") && strcmp(ty, "adaptive"))
            return srv_fail(e, 400, "thinking.type", "invalid_value",
                            "thinking.type: must be 'enabled', 'adaptive' or 'disabled'");
    }
    v = json_object_get(body, "output_config");
    if (v && !json_is_null(v)) {
        if (!json_is_object(v))
            return srv_fail(e, 400, "output_config", "invalid_type", "output_config: must be an object");
        json_t *f = json_object_get(v, "format");
        if (f && !json_is_null(f)) { /* structured outputs: enforced by a grammar (anth_messages) */
            const char *t = json_string_value(json_object_get(f, "type"));
            if (!json_is_object(f) || !t || strcmp(t, "json_schema"))
                return srv_fail(e, 400, "output_config.format", "invalid_value",
                                "output_config.format: must be {\"type\": \"json_schema\", \"schema\": {...}}");
            if (!json_is_object(json_object_get(f, "schema")))
                return srv_fail(e, 400, "output_config.format.schema", "invalid_value",
                                "output_config.format.schema: must be an object (a JSON Schema)");
        }
    }
    for (size_t i = 0; i < sizeof IGNORED / sizeof IGNORED[0]; i++) {
        v = json_object_get(body, IGNORED[i].key);
        if (!v || json_is_null(v) || IGNORED[i].type == JSON_NULL) continue;
        if (json_typeof(v) != IGNORED[i].type)
            return srv_fail(e, 400, IGNORED[i].key, "invalid_type", "%s: must be %s", IGNORED[i].key,
                            IGNORED[i].type == JSON_STRING ? "a string" : "an object");
    }
    return 0;
}

/* A tool_result's content: a string or text blocks (absent: empty). */
static int result_text(json_t *blk, const char *param, char **out, srv_err *e) {
    json_t *c = json_object_get(blk, "content");
    if (!c || json_is_null(c)) {
        *out = st_strdup("");
        return 0;
    }
    return srv_content_text(c, param, "", out, e);
}

/* One message's content blocks appended to out in OpenAI's shape: user text
 * and tool_result blocks (each its own "tool" message, before the text), or
 * assistant text and tool_use blocks (tool_calls). */
static int convert_blocks(json_t *out, const char *role, json_t *content, const char *param, srv_err *e) {
    sbuf text = {0}, thinking = {0};
    sbuf_put(&text, "", 0);
    json_t *calls = json_array(), *blk;
    size_t i;
    char bp[128];
    int rc = 0;
    json_array_foreach(content, i, blk) {
        snprintf(bp, sizeof bp, "%s.%zu", param, i);
        const char *type = json_string_value(json_object_get(blk, "type"));
        if (!json_is_object(blk) || !type) {
            rc = srv_fail(e, 400, bp, "invalid_type", "%s: must be an object with a string 'type'", bp);
            break;
        }
        if (!strcmp(type, "text")) {
            json_t *t = json_object_get(blk, "text");
            if (!json_is_string(t)) {
                rc = srv_fail(e, 400, bp, "invalid_type", "%s.text: must be a string", bp);
                break;
            }
            sbuf_put(&text, json_string_value(t), json_string_length(t));
        } else if (!strcmp(type, "thinking") && !strcmp(role, "assistant")) {
            /* an earlier answer's reasoning, sent back: templates that show it read reasoning_content */
            json_t *t = json_object_get(blk, "thinking"), *sig = json_object_get(blk, "signature");
            if (!json_is_string(t) || (sig && !json_is_null(sig) && !json_is_string(sig))) {
                rc = srv_fail(e, 400, bp, "invalid_type", "%s: a thinking block needs a string thinking", bp);
                break;
            }
            sbuf_put(&thinking, json_string_value(t), json_string_length(t));
        } else if (!strcmp(type, "redacted_thinking") && !strcmp(role, "assistant")) {
            if (!json_is_string(json_object_get(blk, "data"))) {
                rc = srv_fail(e, 400, bp, "invalid_type", "%s.data: must be a string", bp);
                break;
            }
        } else if (!strcmp(type, "tool_use") && !strcmp(role, "assistant")) {
            json_t *id = json_object_get(blk, "id"), *name = json_object_get(blk, "name"),
                   *in = json_object_get(blk, "input");
            if (!json_is_string(id) || !json_is_string(name) || !json_is_object(in)) {
                rc = srv_fail(e, 400, bp, "invalid_type", "%s: tool_use needs a string id and name and an object input",
                              bp);
                break;
            }
            char *args = json_dumps(in, JSON_COMPACT);
            json_array_append_new(calls, json_pack("{s:O, s:s, s:{s:O, s:s}}", "id", id, "type", "function", "function",
                                                   "name", name, "arguments", args));
            free(args);
        } else if (!strcmp(type, "tool_result") && !strcmp(role, "user")) {
            json_t *id = json_object_get(blk, "tool_use_id");
            char *rt;
            if (!json_is_string(id)) {
                rc = srv_fail(e, 400, bp, "invalid_type", "%s.tool_use_id: must be a string", bp);
                break;
            }
            if (result_text(blk, bp, &rt, e) < 0) {
                rc = -1;
                break;
            }
            json_array_append_new(out, json_pack("{s:s, s:O, s:s}", "role", "tool", "tool_call_id", id, "content", rt));
            st_free(rt);
        } else {
            rc = srv_fail(e, 400, bp, "unsupported_content",
                          "%s: content of type '%s' is not supported in a %s message", bp, type, role);
            break;
        }
    }
    if (rc == 0 && (text.len || json_array_size(calls) || !json_array_size(content) || strcmp(role, "user"))) {
        json_t *m = json_pack("{s:s, s:s}", "role", role, "content", text.s);
        if (json_array_size(calls)) json_object_set(m, "tool_calls", calls);
        if (thinking.len) json_object_set_new(m, "reasoning_content", json_stringn_nocheck(thinking.s, thinking.len));
        json_array_append_new(out, m);
    }
    json_decref(calls);
    sbuf_free(&text);
    sbuf_free(&thinking);
    return rc;
}

/* system + messages -> OpenAI-shaped messages for the template. */
static json_t *parse_messages(json_t *body, srv_err *e) {
    json_t *arr = json_object_get(body, "messages"), *sys = json_object_get(body, "system");
    if (!arr) {
        srv_fail(e, 400, "messages", "missing_required_parameter", "messages: Field required");
        return NULL;
    }
    if (!json_is_array(arr) || json_array_size(arr) == 0) {
        srv_fail(e, 400, "messages", "invalid_value", "messages: must be a non-empty array");
        return NULL;
    }
    json_t *out = json_array(), *m;
    size_t i;
    if (sys && !json_is_null(sys)) {
        char *text;
        if (srv_content_text(sys, "system", "\n", &text, e) < 0) goto fail;
        json_array_append_new(out, json_pack("{s:s, s:s}", "role", "system", "content", text));
        st_free(text);
    }
    char param[64];
    json_array_foreach(arr, i, m) {
        snprintf(param, sizeof param, "messages.%zu", i);
        json_t *role = json_object_get(m, "role"), *content = json_object_get(m, "content");
        if (!json_is_object(m) || !json_is_string(role)) {
            srv_fail(e, 400, param, "invalid_type", "%s: must be an object with a string 'role'", param);
            goto fail;
        }
        const char *r = json_string_value(role);
        if (strcmp(r, "user") && strcmp(r, "assistant")) {
            srv_fail(e, 400, param, "invalid_value", "%s.role: '%s' is not one of 'user', 'assistant'", param, r);
            goto fail;
        }
        if (!content) {
            srv_fail(e, 400, param, "missing_required_parameter", "%s.content: Field required", param);
            goto fail;
        }
        char cparam[80];
        snprintf(cparam, sizeof cparam, "%s.content", param);
        if (json_is_string(content)) json_array_append_new(out, json_pack("{s:s, s:O}", "role", r, "content", content));
        else if (!json_is_array(content)) {
            srv_fail(e, 400, cparam, "invalid_type", "%s: must be a string or an array of content blocks", cparam);
            goto fail;
        } else if (convert_blocks(out, r, content, cparam, e) < 0) goto fail;
    }
    return out;
fail:
    json_decref(out);
    return NULL;
}

/* The prompt of a messages / count_tokens request (tools included). */
static int32_t *request_prompt(srv_ctx *s, json_t *body, srv_job *j, int *n, srv_err *e) {
    json_t *tools = NULL, *msgs = NULL, *kwargs = NULL;
    const char *force = NULL;
    char *opening = NULL, *lead = NULL;
    int think_open = 0;
    if (parse_tools(body, &tools, &force, e) < 0 || !(msgs = parse_messages(body, e))) {
        json_decref(tools);
        return NULL;
    }
    /* thinking on or off reaches a template that reads enable_thinking (Qwen3's), as llama-server passes it */
    const char *tt = json_string_value(json_object_get(json_object_get(body, "thinking"), "type"));
    if (tt) kwargs = json_pack("{s:b}", "enable_thinking", strcmp(tt, "disabled") != 0);
    int32_t *ids = srv_chat_prompt(s, msgs, tools, force, kwargs, s->p.reasoning, &opening, &lead, &think_open, n, e);
    json_decref(kwargs);
    json_decref(msgs);
    char *g = NULL;
    if (j && ids && (opening || lead) && !(g = srv_tools_grammar(s, tools, force, lead, API_ANTHROPIC, e))) {
        st_free(ids);
        ids = NULL;
    }
    st_free(lead);
    if (j && ids) {
        j->tools = tools;
        j->call_opening = opening;
        job_set_grammar(j, g); /* a forced call: its input follows the tool's input_schema */
        if (tools && !force) srv_job_lazy_tools(j, tools, API_ANTHROPIC); /* auto: a call it starts is whole */
        srv_job_reasoning(j, s->p.reasoning, think_open);                 /* thinking blocks apart from the text */
        long long budget = s->p.reasoning_budget; /* budget_tokens (checked by check_common), else --reasoning-budget */
        if (tt && !strcmp(tt, "enabled"))
            jf_int(json_object_get(body, "thinking"), "budget_tokens", 1024, INT32_MAX, &budget, e);
        srv_job_think_budget(j, (int)budget, think_open, NULL); /* --reasoning-budget-message */
    } else {
        json_decref(tools);
        st_free(opening);
    }
    return ids;
}

enum MHD_Result anth_count_tokens(srv_ctx *s, struct MHD_Connection *c, json_t *body) {
    srv_err e;
    int n;
    int32_t *ids = NULL;
    if (check_required(c, body, &e) < 0 || jf_known_keys(body, COUNT_KEYS, &e) < 0 || check_common(body, &e) < 0 ||
        !(ids = request_prompt(s, body, NULL, &n, &e)))
        return srv_send_error(s, c, API_ANTHROPIC, &e);
    st_free(ids);
    return srv_send_json(s, c, 200, json_pack("{s:i}", "input_tokens", n));
}

enum MHD_Result anth_messages(srv_ctx *s, struct MHD_Connection *c, json_t *body) {
    srv_err e;
    srv_job *j = job_new(s, JOB_ANTHROPIC, c);
    const char *stops[17];
    int n_stop = 0;
    srv_sampling_rules rules = {"max_tokens", 1.0};
    if (check_required(c, body, &e) < 0 || jf_known_keys(body, MESSAGE_KEYS, &e) < 0 || check_common(body, &e) < 0 ||
        jf_bool(body, "stream", &j->stream, &e) < 0 ||
        srv_parse_sampling(s, body, &rules, &j->req.sp, &j->req.max_tokens, &e) < 0 ||
        jf_stops(body, "stop_sequences", stops, &n_stop, &e) < 0)
        goto fail;
    if (json_is_string(json_object_get(body, "stop_sequences"))) {
        srv_fail(&e, 400, "stop_sequences", "invalid_type", "stop_sequences: must be an array of strings");
        goto fail;
    }
    if (j->req.max_tokens == 0) {
        srv_fail(&e, 400, "max_tokens", "missing_required_parameter", "max_tokens: Field required");
        goto fail;
    }
    int n;
    int32_t *ids = request_prompt(s, body, j, &n, &e);
    if (!ids) goto fail;
    if (srv_check_context(s, n, API_ANTHROPIC, "messages", &e) < 0) {
        st_free(ids);
        goto fail;
    }
    json_t *fmt = json_object_get(json_object_get(body, "output_config"), "format");
    if (json_is_object(fmt)) { /* structured outputs: the answer is JSON valid against the schema */
        char err[512], *g;
        size_t glen = 0;
        if (j->tools) {
            st_free(ids);
            srv_fail(&e, 400, "output_config.format", "unsupported_parameter",
                     "output_config.format: not supported together with tools by this server");
            goto fail;
        }
        if (!(g = grammar_from_schema(json_object_get(fmt, "schema"), &glen, err, sizeof err))) {
            st_free(ids);
            srv_fail(&e, 400, "output_config.format.schema", "unsupported_parameter", "output_config.format.schema: %s",
                     err);
            goto fail;
        }
        if (srv_grammar_check(g, glen, "output_config.format.schema", "unsupported_parameter", &e) < 0) {
            st_free(g);
            st_free(ids);
            goto fail;
        }
        job_set_grammar(j, g);
    }
    j->n_user_stop = n_stop;
    stops[n_stop++] = s->eot;
    if (j->call_opening && !j->grammar && s->tools_fam != TOOLS_LLAMA3 && n_stop < 17) stops[n_stop++] = "</tool_call>";
    job_set_prompt(j, ids, n, stops, n_stop);
    return job_run(j, c);
fail:
    job_release(j);
    return srv_send_error(s, c, API_ANTHROPIC, &e);
}

/* ---- output (called with the job's mutex held) ---- */

static void put_event(srv_job *j, const char *name, json_t *data) {
    char *txt = json_dumps(data, JSON_COMPACT);
    json_decref(data);
    sbuf_printf(&j->out, "event: %s\ndata: %s\n\n", name, txt);
    free(txt);
}

static const char *stop_reason(const srv_job *j) {
    if (j->ts) { /* streamed: the calls sent, unless cut short */
        if (j->ts_calls && strcmp(j->st.finish, "length")) return "tool_use";
    } else if (j->tools && !j->failed) { /* an answer with tool calls stops for them (called at the end only) */
        sbuf c = {0};
        json_t *calls = srv_job_tool_calls((srv_job *)j, &c);
        sbuf_free(&c);
        json_decref(calls);
        if (calls) return "tool_use";
    }
    if (!strcmp(j->st.finish, "length")) return "max_tokens";
    if (j->st.stop_index >= 0 && j->st.stop_index < j->n_user_stop) return "stop_sequence";
    return "end_turn";
}

static json_t *stop_sequence(const srv_job *j) {
    return !strcmp(stop_reason(j), "stop_sequence") ? json_string(j->stops[j->st.stop_index]) : json_null();
}

static json_t *usage(const srv_job *j) {
    return json_pack("{s:i, s:i, s:i, s:i}", "input_tokens", j->st.n_read, "output_tokens", j->st.n_gen,
                     "cache_read_input_tokens", j->st.n_reused, "cache_creation_input_tokens", 0);
}

/* Streamed answers with tools: a text block while text comes, a tool_use block
 * per call with its input in input_json_delta fragments. */
static void block_close(srv_job *j) {
    if (!j->blk_open) return;
    if (j->blk_open == 3) /* a thinking block ends with its signature: none here, as llama-server sends it */
        put_event(j, "content_block_delta",
                  json_pack("{s:s, s:i, s:{s:s, s:s}}", "type", "content_block_delta", "index", j->blk_n, "delta",
                            "type", "signature_delta", "signature", ""));
    put_event(j, "content_block_stop", json_pack("{s:s, s:i}", "type", "content_block_stop", "index", j->blk_n));
    j->blk_n++;
    j->blk_open = 0;
}

static void ts_content(void *ctx, const char *t, size_t n) {
    srv_job *j = ctx;
    if (j->blk_open != 1) {
        block_close(j);
        put_event(j, "content_block_start",
                  json_pack("{s:s, s:i, s:{s:s, s:s}}", "type", "content_block_start", "index", j->blk_n,
                            "content_block", "type", "text", "text", ""));
        j->blk_open = 1;
    }
    put_event(j, "content_block_delta",
              json_pack("{s:s, s:i, s:{s:s, s:o}}", "type", "content_block_delta", "index", j->blk_n, "delta", "type",
                        "text_delta", "text", srv_json_text(t, n)));
}

static void ts_begin(void *ctx, int i, const char *id, const char *name) {
    srv_job *j = ctx;
    (void)i;
    block_close(j);
    put_event(j, "content_block_start",
              json_pack("{s:s, s:i, s:{s:s, s:s, s:s, s:{}}}", "type", "content_block_start", "index", j->blk_n,
                        "content_block", "type", "tool_use", "id", id, "name", name, "input"));
    j->blk_open = 2;
}

static void ts_args(void *ctx, int i, const char *t, size_t n) {
    srv_job *j = ctx;
    (void)i;
    put_event(j, "content_block_delta",
              json_pack("{s:s, s:i, s:{s:s, s:o}}", "type", "content_block_delta", "index", j->blk_n, "delta", "type",
                        "input_json_delta", "partial_json", srv_json_text(t, n)));
}

static void ts_end(void *ctx, int i) {
    (void)i;
    block_close(ctx);
}

void anth_stream_reasoning(srv_job *j, const char *text, size_t len) {
    if (j->blk_open != 3) {
        block_close(j);
        put_event(j, "content_block_start",
                  json_pack("{s:s, s:i, s:{s:s, s:s, s:s}}", "type", "content_block_start", "index", j->blk_n,
                            "content_block", "type", "thinking", "thinking", "", "signature", ""));
        j->blk_open = 3;
    }
    put_event(j, "content_block_delta",
              json_pack("{s:s, s:i, s:{s:s, s:o}}", "type", "content_block_delta", "index", j->blk_n, "delta", "type",
                        "thinking_delta", "thinking", srv_json_text(text, len)));
}

void anth_stream_begin(srv_job *j) {
    put_event(j, "message_start",
              json_pack("{s:s, s:{s:s, s:s, s:s, s:s, s:[], s:n, s:n, s:{s:i, s:i}}}", "type", "message_start",
                        "message", "id", j->id, "type", "message", "role", "assistant", "model", j->srv->model_name,
                        "content", "stop_reason", "stop_sequence", "usage", "input_tokens", j->req.n_prompt,
                        "output_tokens", 0));
    if (j->tools) { /* blocks as the text and the calls come (tools_stream) */
        static const tools_stream_cb cb = {ts_content, ts_begin, ts_args, ts_end};
        char prefix[96];
        srv_job_call_prefix(j, prefix, sizeof prefix);
        j->ts = tools_stream_new(j->tools, (tools_family)j->srv->tools_fam, prefix, &cb, j);
        srv_job_stream_opening(j);
        return;
    }
    if (j->rs) return; /* blocks as the thinking and the text come */
    put_event(j, "content_block_start",
              json_pack("{s:s, s:i, s:{s:s, s:s}}", "type", "content_block_start", "index", 0, "content_block", "type",
                        "text", "text", ""));
}

void anth_stream_text(srv_job *j, const char *text, size_t len) {
    if (j->rs) {
        ts_content(j, text, len); /* a text block opened after the thinking one */
        return;
    }
    put_event(j, "content_block_delta",
              json_pack("{s:s, s:i, s:{s:s, s:o}}", "type", "content_block_delta", "index", 0, "delta", "type",
                        "text_delta", "text", srv_json_text(text, len)));
}

/* The content blocks of an answer with tools: text (if any), then one
 * tool_use block per call with input parsed from the arguments. */
static json_t *tool_blocks(srv_job *j) {
    sbuf content = {0};
    json_t *calls = srv_job_tool_calls(j, &content), *blocks = json_array(), *call;
    if (content.len || !calls)
        json_array_append_new(blocks, json_pack("{s:s, s:o}", "type", "text", "text",
                                                srv_json_text(content.s ? content.s : "", content.len)));
    size_t i;
    json_array_foreach(calls, i, call) {
        json_t *fn = json_object_get(call, "function");
        json_t *in = json_loads(json_string_value(json_object_get(fn, "arguments")), 0, NULL);
        json_array_append_new(blocks,
                              json_pack("{s:s, s:O, s:O, s:o}", "type", "tool_use", "id", json_object_get(call, "id"),
                                        "name", json_object_get(fn, "name"), "input", in ? in : json_object()));
    }
    json_decref(calls);
    sbuf_free(&content);
    return blocks;
}

void anth_stream_end(srv_job *j) {
    if (j->failed) {
        srv_err e;
        srv_fail(&e, j->failed >= 2 ? 503 : 500, NULL, NULL, "%s", j->err); /* 503: overloaded_error */
        put_event(j, "error", srv_error_json(API_ANTHROPIC, &e));
        return;
    }
    if (j->ts || j->rs) {
        if (j->ts) j->ts_calls = tools_stream_end(j->ts);
        if (!j->blk_n && !j->blk_open) ts_content(j, "", 0); /* an empty answer still has its text block */
        block_close(j);
    } else put_event(j, "content_block_stop", json_pack("{s:s, s:i}", "type", "content_block_stop", "index", 0));
    put_event(j, "message_delta",
              json_pack("{s:s, s:{s:s, s:o}, s:o}", "type", "message_delta", "delta", "stop_reason", stop_reason(j),
                        "stop_sequence", stop_sequence(j), "usage", usage(j)));
    put_event(j, "message_stop", json_pack("{s:s}", "type", "message_stop"));
}

json_t *anth_response(srv_job *j) {
    json_t *blocks;
    if (j->tools) blocks = tool_blocks(j);
    else
        blocks =
            json_pack("[{s:s, s:o}]", "type", "text", "text", srv_json_text(j->text.s ? j->text.s : "", j->text.len));
    json_t *first = json_array_get(blocks, 0);
    if (j->reasoning.len && !strcmp(json_string_value(json_object_get(first, "type")), "text") &&
        !json_string_length(json_object_get(first, "text")))
        json_array_remove(blocks, 0); /* all of it was thinking: no empty text block (as the stream sends) */
    if (j->reasoning.len)             /* the thinking block first, as Anthropic's extended thinking answers */
        json_array_insert_new(blocks, 0,
                              json_pack("{s:s, s:o, s:s}", "type", "thinking", "thinking",
                                        srv_json_text(j->reasoning.s, j->reasoning.len), "signature", ""));
    return json_pack("{s:s, s:s, s:s, s:s, s:o, s:s, s:o, s:o}", "id", j->id, "type", "message", "role", "assistant",
                     "model", j->srv->model_name, "content", blocks, "stop_reason", stop_reason(j), "stop_sequence",
                     stop_sequence(j), "usage", usage(j));
}
