/* OpenAI API: POST /v1/chat/completions and /v1/completions, requests to
 * jobs and jobs to responses (one JSON object, or SSE chunks ending in
 * `data: [DONE]`).
 *
 * Parameter policy (docs/server.md): every parameter of OpenAI's API is known.
 * Those we honour are read strictly (wrong type or range -> 400 naming it);
 * those that do not change the output (user, metadata, store, ...) are type-
 * checked and ignored; those that would change it in a way we cannot give
 * yet (n > 1, audio, ...) get 400
 * with code "unsupported_parameter" rather than a silently different answer;
 * a name OpenAI does not have gets 400, as OpenAI itself answers. */
#include <string.h>

#include "core/alloc.h"
#include "server/srv_grammar.h"
#include "server/srv_internal.h"
#include "server/srv_tools.h"

#define LLAMA_SAMPLING_KEYS                                                                                            \
    "typical_p", "repeat_last_n", "dry_multiplier", "dry_base", "dry_allowed_length", "dry_penalty_last_n",            \
        "dry_sequence_breakers", "samplers", "id_slot", "n_probs", "chat_template_kwargs", "n_keep"

static const char *const CHAT_KEYS[] = {
    "model", "messages", "stream", "stream_options", "temperature", "top_p", "max_tokens", "max_completion_tokens",
    "stop", "seed", "presence_penalty", "frequency_penalty", "n", "logprobs", "top_logprobs", "tools", "tool_choice",
    "functions", "function_call", "response_format", "logit_bias", "parallel_tool_calls", "user", "metadata", "store",
    "service_tier", "modalities", "audio", "prediction", "reasoning_effort", "web_search_options", "prompt_cache_key",
    "safety_identifier", "verbosity", "moderation", "prompt_cache_options", "prompt_cache_retention",
    /* extensions (llama.cpp spells them the same) */
    "top_k", "min_p", "repeat_penalty", "n_predict", "ignore_eos", "cache_prompt", "grammar", "reasoning_format",
    "reasoning_budget_tokens", "thinking_budget_tokens", "reasoning_budget_message", LLAMA_SAMPLING_KEYS, NULL};

static const char *const COMPLETION_KEYS[] = {"model",
                                              "prompt",
                                              "stream",
                                              "stream_options",
                                              "temperature",
                                              "top_p",
                                              "max_tokens",
                                              "stop",
                                              "seed",
                                              "presence_penalty",
                                              "frequency_penalty",
                                              "n",
                                              "logprobs",
                                              "echo",
                                              "best_of",
                                              "logit_bias",
                                              "suffix",
                                              "user",
                                              "top_k",
                                              "min_p",
                                              "repeat_penalty",
                                              "n_predict",
                                              "ignore_eos",
                                              "cache_prompt",
                                              "grammar",
                                              LLAMA_SAMPLING_KEYS,
                                              NULL};

/* Known parameters with no effect on the output: checked for type (JSON_NULL:
 * any type), ignored. */
static const struct {
    const char *key;
    json_type type;
} IGNORED[] = {
    {"user", JSON_STRING},
    {"metadata", JSON_OBJECT},
    {"store", JSON_TRUE},
    {"service_tier", JSON_STRING},
    {"parallel_tool_calls", JSON_TRUE},
    {"reasoning_effort", JSON_STRING},
    {"prompt_cache_key", JSON_STRING},
    {"safety_identifier", JSON_STRING},
    {"verbosity", JSON_STRING},
    {"model", JSON_STRING},
    {"prompt_cache_options", JSON_OBJECT},
    {"prompt_cache_retention", JSON_STRING},
    {"moderation", JSON_NULL},
};

static int check_ignored(json_t *body, srv_err *e) {
    for (size_t i = 0; i < sizeof IGNORED / sizeof IGNORED[0]; i++) {
        json_t *v = json_object_get(body, IGNORED[i].key);
        if (!v || json_is_null(v) || IGNORED[i].type == JSON_NULL) continue;
        int ok = IGNORED[i].type == JSON_TRUE ? json_is_boolean(v) : json_typeof(v) == IGNORED[i].type;
        if (!ok) {
            const char *want = IGNORED[i].type == JSON_STRING   ? "a string"
                               : IGNORED[i].type == JSON_OBJECT ? "an object"
                                                                : "a boolean";
            return srv_fail(e, 400, IGNORED[i].key, "invalid_type", "'%s' must be %s", IGNORED[i].key, want);
        }
    }
    return 0;
}

static int unsupported(srv_err *e, const char *key, const char *why) {
    return srv_fail(e, 400, key, "unsupported_parameter", "'%s' is not supported by this server yet: %s", key, why);
}

/* Parameters we know but cannot honour yet: 400 unless set to their no-op value. */
static int check_unsupported(json_t *body, int chat, srv_err *e) {
    long long n;
    int b, rc;
    const char *s;
    if ((rc = jf_int(body, "n", 1, 128, &n, e)) < 0) return -1;
    if (rc && n != 1) return unsupported(e, "n", "only one choice per request (n=1)");
    if ((rc = jf_int(body, "best_of", 1, 128, &n, e)) < 0) return -1;
    if (rc && n != 1) return unsupported(e, "best_of", "only best_of=1");
    if (chat) {
        if ((rc = jf_int(body, "top_logprobs", 0, 20, &n, e)) < 0) return -1;
        if ((rc = jf_bool(body, "logprobs", &b, e)) < 0) return -1;
        json_t *tl = json_object_get(body, "top_logprobs");
        if (tl && !json_is_null(tl) && !(rc && b))
            return srv_fail(e, 400, "top_logprobs", "invalid_value", "'top_logprobs' requires 'logprobs' to be true");
    } else {
        if ((rc = jf_int(body, "logprobs", 0, 5, &n, e)) < 0) return -1;
        if ((rc = jf_bool(body, "echo", &b, e)) < 0) return -1;
        if (rc && b) return unsupported(e, "echo", "the prompt is not echoed");
        if ((rc = jf_string(body, "suffix", &s, e)) < 0) return -1;
        if (rc && *s) return unsupported(e, "suffix", "no fill-in-the-middle");
    }
    json_t *v = json_object_get(body, "functions"); /* the deprecated spelling of tools */
    if (v && !json_is_null(v)) {
        if (!json_is_array(v)) return srv_fail(e, 400, "functions", "invalid_type", "'functions' must be an array");
        if (json_array_size(v)) return unsupported(e, "functions", "use 'tools'");
    }
    v = json_object_get(body, "function_call");
    if (v && !json_is_null(v)) {
        if (!json_is_string(v) && !json_is_object(v))
            return srv_fail(e, 400, "function_call", "invalid_type", "'function_call' must be a string or an object");
        if (!json_is_string(v) || (strcmp(json_string_value(v), "none") && strcmp(json_string_value(v), "auto")))
            return unsupported(e, "function_call", "use 'tools' and 'tool_choice'");
    }
    v = json_object_get(body, "response_format");
    if (v && !json_is_null(v)) {
        json_t *t = json_object_get(v, "type");
        if (!json_is_object(v) || !json_is_string(t))
            return srv_fail(e, 400, "response_format", "invalid_type",
                            "'response_format' must be an object with a 'type'");
        const char *type = json_string_value(t);
        if (!strcmp(type, "json_schema")) { /* the schema is enforced in finish_request (grammar_from_schema) */
            static const char *const keys[] = {"type", "json_schema", NULL};
            static const char *const schema_keys[] = {"name", "description", "schema", "strict", NULL};
            json_t *js = json_object_get(v, "json_schema");
            const char *name = NULL, *desc = NULL;
            int strict = 0, rc;
            if (jf_known_keys(v, keys, e) < 0) return -1;
            if (!js || json_is_null(js))
                return srv_fail(e, 400, "response_format.json_schema", "missing_required_parameter",
                                "'response_format.json_schema' is required when the type is json_schema");
            if (!json_is_object(js))
                return srv_fail(e, 400, "response_format.json_schema", "invalid_type",
                                "'response_format.json_schema' must be an object");
            if (jf_known_keys(js, schema_keys, e) < 0 || (rc = jf_string(js, "name", &name, e)) < 0 ||
                jf_string(js, "description", &desc, e) < 0 || jf_bool(js, "strict", &strict, e) < 0)
                return -1;
            if (!rc)
                return srv_fail(e, 400, "response_format.json_schema.name", "missing_required_parameter",
                                "'response_format.json_schema.name' is required");
            size_t n = strlen(name);
            if (n == 0 || n > 64 ||
                strspn(name, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-") != n)
                return srv_fail(e, 400, "response_format.json_schema.name", "invalid_value",
                                "'response_format.json_schema.name' must be 1 to 64 of a-z, A-Z, 0-9, _ and -");
            json_t *schema = json_object_get(js, "schema");
            if (schema && !json_is_null(schema) && !json_is_object(schema))
                return srv_fail(e, 400, "response_format.json_schema.schema", "invalid_type",
                                "'response_format.json_schema.schema' must be an object (a JSON Schema)");
        } else if (strcmp(type, "text") && strcmp(type, "json_object"))
            return srv_fail(e, 400, "response_format.type", "invalid_value",
                            "'response_format.type' must be text, json_object or json_schema");
    }
    v = json_object_get(body, "modalities");
    if (v && !json_is_null(v)) {
        if (!json_is_array(v)) return srv_fail(e, 400, "modalities", "invalid_type", "'modalities' must be an array");
        size_t i;
        json_t *m;
        json_array_foreach(v, i, m) if (!json_is_string(m) || strcmp(json_string_value(m), "text")) return unsupported(
            e, "modalities", "text only");
    }
    static const char *const absent[] = {"audio", "prediction", "web_search_options"};
    for (int i = 0; i < 3; i++) {
        v = json_object_get(body, absent[i]);
        if (v && !json_is_null(v)) return unsupported(e, absent[i], "text generation only");
    }
    return check_ignored(body, e);
}

/* stream, stream_options.include_usage */
static int parse_stream(json_t *body, srv_job *j, srv_err *e) {
    if (jf_bool(body, "stream", &j->stream, e) < 0) return -1;
    json_t *so = json_object_get(body, "stream_options");
    if (so && !json_is_null(so)) {
        if (!json_is_object(so))
            return srv_fail(e, 400, "stream_options", "invalid_type", "'stream_options' must be an object");
        if (!j->stream)
            return srv_fail(e, 400, "stream_options", "invalid_value",
                            "'stream_options' is only allowed when 'stream' is true");
        static const char *const keys[] = {"include_usage", "include_obfuscation", NULL};
        if (jf_known_keys(so, keys, e) < 0) return -1;
        if (jf_bool(so, "include_usage", &j->include_usage, e) < 0) return -1;
    }
    return 0;
}

/* One assistant tool_calls entry, checked and normalised to {id, type, function:{name, arguments}}. */
static json_t *check_call(json_t *call, const char *param, srv_err *e) {
    json_t *fn = json_object_get(call, "function");
    const char *id = json_string_value(json_object_get(call, "id"));
    const char *type = json_string_value(json_object_get(call, "type"));
    const char *name = json_string_value(json_object_get(fn, "name"));
    json_t *args = json_object_get(fn, "arguments");
    if (!json_is_object(call) || !id || (type && strcmp(type, "function")) || !name ||
        !(json_is_string(args) || json_is_object(args))) {
        srv_fail(e, 400, param, "invalid_type",
                 "'%s' must be {\"id\": string, \"type\": \"function\", \"function\": {\"name\": string, "
                 "\"arguments\": string}}",
                 param);
        return NULL;
    }
    json_t *a = json_is_string(args) ? json_incref(args) : json_string_nocheck("");
    if (json_is_object(args)) { /* tolerated: an object, as some clients send */
        char *t = json_dumps(args, JSON_COMPACT);
        json_string_set(a, t);
        free(t);
    }
    return json_pack("{s:s, s:s, s:{s:s, s:o}}", "id", id, "type", "function", "function", "name", name, "arguments",
                     a);
}

/* messages -> OpenAI-shaped JSON for the template: system/developer/user/
 * assistant (with tool_calls)/tool messages, text content as one string. */
static json_t *parse_messages(json_t *body, srv_err *e) {
    json_t *arr = json_object_get(body, "messages");
    if (!arr) {
        srv_fail(e, 400, "messages", "missing_required_parameter", "Missing required parameter: 'messages'");
        return NULL;
    }
    if (!json_is_array(arr) || json_array_size(arr) == 0) {
        srv_fail(e, 400, "messages", "invalid_value", "'messages' must be a non-empty array");
        return NULL;
    }
    json_t *out = json_array(), *m;
    size_t i;
    char param[64], cparam[128];
    json_array_foreach(arr, i, m) {
        snprintf(param, sizeof param, "messages[%zu]", i);
        json_t *role = json_object_get(m, "role"), *content = json_object_get(m, "content");
        if (!json_is_object(m) || !json_is_string(role)) {
            srv_fail(e, 400, param, "invalid_type", "'%s' must be an object with a string 'role'", param);
            goto fail;
        }
        const char *r = json_string_value(role);
        if (!strcmp(r, "developer")) r = "system";
        if (strcmp(r, "system") && strcmp(r, "user") && strcmp(r, "assistant") && strcmp(r, "tool")) {
            srv_fail(e, 400, param, strcmp(r, "function") ? "invalid_value" : "unsupported_parameter",
                     "'%s.role' is '%s'; this server takes system, developer, user, assistant and tool messages", param,
                     r);
            goto fail;
        }
        json_t *o = json_pack("{s:s}", "role", r);
        json_array_append_new(out, o);
        json_t *calls = json_object_get(m, "tool_calls");
        if (calls && !json_is_null(calls)) {
            if (strcmp(r, "assistant") || !json_is_array(calls)) {
                srv_fail(e, 400, param, "invalid_value", "'%s.tool_calls' must be an array in an assistant message",
                         param);
                goto fail;
            }
            json_t *list = json_array(), *call;
            json_object_set_new(o, "tool_calls", list);
            size_t k;
            json_array_foreach(calls, k, call) {
                snprintf(cparam, sizeof cparam, "%s.tool_calls[%zu]", param, k);
                json_t *c = check_call(call, cparam, e);
                if (!c) goto fail;
                json_array_append_new(list, c);
            }
            if (!json_array_size(list)) json_object_del(o, "tool_calls");
        }
        if (!strcmp(r, "tool")) {
            json_t *id = json_object_get(m, "tool_call_id");
            if (!json_is_string(id)) {
                srv_fail(e, 400, param, "missing_required_parameter", "'%s.tool_call_id' must be a string", param);
                goto fail;
            }
            json_object_set(o, "tool_call_id", id);
        }
        json_t *rc = json_object_get(m, "reasoning_content"); /* llama-server's: an earlier answer's reasoning */
        if (rc && !json_is_null(rc)) {
            if (strcmp(r, "assistant") || !json_is_string(rc)) {
                srv_fail(e, 400, param, "invalid_value",
                         "'%s.reasoning_content' must be a string in an assistant "
                         "message",
                         param);
                goto fail;
            }
            json_object_set(o, "reasoning_content", rc);
        }
        json_t *name = json_object_get(m, "name");
        if (name && !json_is_null(name)) {
            if (!json_is_string(name)) {
                srv_fail(e, 400, param, "invalid_type", "'%s.name' must be a string", param);
                goto fail;
            }
            json_object_set(o, "name", name);
        }
        char *text;
        if (!content || json_is_null(content)) {
            if (strcmp(r, "assistant")) {
                srv_fail(e, 400, param, "missing_required_parameter", "'%s.content' is required", param);
                goto fail;
            }
            if (json_object_get(o, "tool_calls")) continue; /* content null beside calls, as clients send */
            text = st_strdup("");
        } else {
            snprintf(cparam, sizeof cparam, "%s.content", param);
            if (srv_content_text(content, cparam, "\n", &text, e) < 0) goto fail;
        }
        json_object_set_new(o, "content", json_string_nocheck(text));
        st_free(text);
    }
    return out;
fail:
    json_decref(out);
    return NULL;
}

/* tools + tool_choice. *tools: the tools the answer may call (NULL for none
 * or tool_choice "none"); *force: NULL, "" (required) or a function name
 * (pointing into body). */
static int parse_tools(json_t *body, json_t **tools, const char **force, srv_err *e) {
    *tools = NULL;
    *force = NULL;
    json_t *t = json_object_get(body, "tools"), *tc = json_object_get(body, "tool_choice");
    if (t && !json_is_null(t)) {
        if (!json_is_array(t)) return srv_fail(e, 400, "tools", "invalid_type", "'tools' must be an array");
        if (srv_check_tools(t, API_OPENAI, "tools", e) < 0) return -1;
        if (json_array_size(t)) *tools = t;
    }
    if (!tc || json_is_null(tc)) return 0;
    if (json_is_string(tc)) {
        const char *v = json_string_value(tc);
        if (!strcmp(v, "none")) *tools = NULL;
        else if (!strcmp(v, "required")) *force = "";
        else if (strcmp(v, "auto"))
            return srv_fail(e, 400, "tool_choice", "invalid_value",
                            "'tool_choice' must be 'none', 'auto', 'required' or a function");
    } else if (json_is_object(tc)) {
        const char *type = json_string_value(json_object_get(tc, "type"));
        const char *name = json_string_value(json_object_get(json_object_get(tc, "function"), "name"));
        if (type && (!strcmp(type, "allowed_tools") || !strcmp(type, "custom"))) /* valid in OpenAI's API */
            return srv_fail(e, 400, "tool_choice", "unsupported_parameter",
                            "'tool_choice' of type '%s' is not supported by this server: use 'none', 'auto', "
                            "'required' or a function",
                            type);
        if (!type || strcmp(type, "function") || !name)
            return srv_fail(e, 400, "tool_choice", "invalid_value",
                            "'tool_choice' must be {\"type\": \"function\", \"function\": {\"name\": ...}}");
        *force = name;
    } else return srv_fail(e, 400, "tool_choice", "invalid_type", "'tool_choice' must be a string or an object");
    if (*force && !*tools) return srv_fail(e, 400, "tool_choice", "invalid_value", "'tool_choice' requires 'tools'");
    if (*force && **force) {
        size_t i;
        json_t *x;
        int found = 0;
        json_array_foreach(*tools, i, x) found |=
            !strcmp(json_string_value(json_object_get(json_object_get(x, "function"), "name")), *force);
        if (!found)
            return srv_fail(e, 400, "tool_choice", "invalid_value", "'tool_choice' names '%s', which is not in 'tools'",
                            *force);
    }
    return 0;
}

/* The grammar the answer must follow: llama-server's `grammar` (GBNF text), or
 * response_format json_object / json_schema (chat). Forced tool calls set
 * theirs before (oai_chat); a grammar beside tools is refused. */
static int answer_grammar(json_t *body, srv_job *j, int chat, srv_err *e) {
    json_t *rf = json_object_get(body, "response_format"), *gr = json_object_get(body, "grammar");
    const char *rft =
        chat && json_is_string(json_object_get(rf, "type")) ? json_string_value(json_object_get(rf, "type")) : "text";
    int want_json = !strcmp(rft, "json_object") || !strcmp(rft, "json_schema");
    if (gr && !json_is_null(gr) && !json_is_string(gr))
        return srv_fail(e, 400, "grammar", "invalid_type", "'grammar' must be a string (GBNF)");
    int want_gbnf = json_is_string(gr) && json_string_length(gr) > 0;
    if ((want_json || want_gbnf) && j->tools)
        return srv_fail(e, 400, want_gbnf ? "grammar" : "response_format", "invalid_value",
                        "'%s' cannot be combined with 'tools'", want_gbnf ? "grammar" : "response_format");
    if (want_json && want_gbnf)
        return srv_fail(e, 400, "grammar", "invalid_value", "'grammar' cannot be combined with 'response_format' %s",
                        rft);
    char *text = NULL;
    size_t len = 0;
    if (want_gbnf) {
        if (srv_grammar_check(json_string_value(gr), json_string_length(gr), "grammar", "invalid_value", e) < 0)
            return -1;
        text = st_strdup(json_string_value(gr));
    } else if (want_json) {
        json_t *schema = json_object_get(json_object_get(rf, "json_schema"), "schema");
        if (!strcmp(rft, "json_object") || !schema || json_is_null(schema)) text = st_strdup(grammar_json_object());
        else {
            char err[512];
            if (!(text = grammar_from_schema(schema, &len, err, sizeof err)))
                return srv_fail(e, 400, "response_format.json_schema.schema", "unsupported_parameter",
                                "'response_format.json_schema.schema': %s", err);
            if (srv_grammar_check(text, len, "response_format.json_schema.schema", "unsupported_parameter", e) < 0) {
                st_free(text);
                return -1;
            }
        }
    }
    if (text) job_set_grammar(j, text);
    return 0;
}

/* Common tail of both endpoints: sampling, stops, context check, run. */
static enum MHD_Result finish_request(srv_ctx *s, struct MHD_Connection *c, json_t *body, srv_job *j, int32_t *ids,
                                      int n, const char *max_key, int chat) {
    srv_err e;
    srv_sampling_rules rules = {max_key, 2.0};
    const char *stops[17];
    int n_stop = 0;
    if (srv_parse_sampling(s, body, &rules, &j->req.sp, &j->req.max_tokens, &e) < 0 ||
        srv_parse_llama_sampling(s, body, j, &e) < 0 || jf_stops(body, "stop", stops, &n_stop, &e) < 0 ||
        srv_check_context(s, n, API_OPENAI, chat ? "messages" : "prompt", &e) < 0) {
        st_free(ids);
        job_release(j);
        return srv_send_error(s, c, API_OPENAI, &e);
    }
    /* llama-server's names: n_predict (-1: until the context is full; with
     * max_tokens the smaller limit wins), ignore_eos, cache_prompt */
    long long np = 0;
    int rc = jf_int(body, "n_predict", -1, 1 << 30, &np, &e), no_limit = 0;
    if (rc > 0 && np == 0) rc = srv_fail(&e, 400, "n_predict", "invalid_value", "'n_predict' must be -1 or at least 1");
    int cache_prompt = 1;
    if (rc < 0 || jf_bool(body, "ignore_eos", &j->req.ignore_eos, &e) < 0 ||
        jf_bool(body, "cache_prompt", &cache_prompt, &e) < 0) {
        st_free(ids);
        job_release(j);
        return srv_send_error(s, c, API_OPENAI, &e);
    }
    j->req.no_cache = !cache_prompt;
    long long id_slot = -1, n_keep;
    /* n_keep: the prompt tokens llama-server keeps when it shifts a full context; there is no shift here
     * (a full context ends the answer, finish "length"), so it changes nothing: range-checked, ignored */
    if (jf_int(body, "n_keep", -1, INT32_MAX, &n_keep, &e) < 0 ||
        jf_int(body, "id_slot", -1, INT32_MAX, &id_slot, &e) < 0 ||
        (id_slot >= s->p.n_slots && srv_fail(&e, 400, "id_slot", "invalid_value",
                                             "'id_slot' %lld is not a slot: this server has %d (0 to %d; -1: any)",
                                             id_slot, s->p.n_slots, s->p.n_slots - 1) < 0)) {
        st_free(ids);
        job_release(j);
        return srv_send_error(s, c, API_OPENAI, &e);
    }
    j->req.pin_slot = (int)id_slot + 1;
    if (rc > 0 && np > 0 && (j->req.max_tokens == 0 || np < j->req.max_tokens)) j->req.max_tokens = (int)np;
    no_limit = rc > 0 && np < 0 && j->req.max_tokens == 0;
    if (!chat && j->req.max_tokens == 0 && !no_limit) j->req.max_tokens = 16; /* the legacy API's default */
    long long nlp = 0;
    int blp = 0;
    if (chat && jf_bool(body, "logprobs", &blp, &e) > 0 && blp) {
        j->req.logprobs = 1;
        if (jf_int(body, "top_logprobs", 0, 20, &nlp, &e) > 0) j->req.top_logprobs = (int)nlp;
    } else if (!chat && jf_int(body, "logprobs", 0, 5, &nlp, &e) > 0) {
        j->req.logprobs = 1;
        j->req.top_logprobs = (int)nlp;
    }
    if (j->req.logprobs) j->lp = json_array();
    j->lp_top = j->req.top_logprobs;
    long long n_probs = 0; /* llama-server's: the top alternatives of every token, beside the API's logprobs */
    if (jf_int(body, "n_probs", 0, 20, &n_probs, &e) < 0) {
        st_free(ids);
        job_release(j);
        return srv_send_error(s, c, API_OPENAI, &e);
    }
    if (n_probs > 0) {
        j->req.logprobs = 1;
        if (n_probs > j->req.top_logprobs) j->req.top_logprobs = (int)n_probs;
        j->n_probs = (int)n_probs;
        j->probs = json_array();
    }
    if (answer_grammar(body, j, chat, &e) < 0) {
        st_free(ids);
        job_release(j);
        return srv_send_error(s, c, API_OPENAI, &e);
    }
    j->n_user_stop = n_stop;
    if (chat) stops[n_stop++] = s->eot;
    if (chat && j->call_opening && !j->grammar && s->tools_fam != TOOLS_LLAMA3 && n_stop < 17)
        stops[n_stop++] = "</tool_call>";
    job_set_prompt(j, ids, n, stops, n_stop);
    return job_run(j, c);
}

enum MHD_Result oai_chat(srv_ctx *s, struct MHD_Connection *c, json_t *body) {
    srv_err e;
    srv_job *j = job_new(s, JOB_OAI_CHAT, c);
    json_t *msgs = NULL, *tools = NULL;
    const char *force = NULL;
    int reason = 0, think_open = 0;
    if (jf_known_keys(body, CHAT_KEYS, &e) < 0 || check_unsupported(body, 1, &e) < 0 || parse_stream(body, j, &e) < 0 ||
        parse_tools(body, &tools, &force, &e) < 0 || srv_parse_reasoning_format(s, body, &reason, &e) < 0 ||
        !(msgs = parse_messages(body, &e))) {
        job_release(j);
        return srv_send_error(s, c, API_OPENAI, &e);
    }
    if (tools) j->tools = json_deep_copy(tools);
    int n;
    /* llama-server's chat_template_kwargs: more variables for the model's template (enable_thinking, ...);
     * the ones the server sets itself (messages, tools, add_generation_prompt, bos_token, ...) win */
    json_t *kwargs = json_object_get(body, "chat_template_kwargs");
    if (kwargs && !json_is_null(kwargs) && !json_is_object(kwargs)) {
        json_decref(msgs);
        srv_fail(&e, 400, "chat_template_kwargs", "invalid_type", "'chat_template_kwargs' must be an object");
        job_release(j);
        return srv_send_error(s, c, API_OPENAI, &e);
    }
    /* OpenAI's reasoning_effort reaches the template as llama-server passes it: a variable (gpt-oss's
     * "Reasoning: low"), or "none": no thinking (enable_thinking false) */
    const char *effort = json_string_value(json_object_get(body, "reasoning_effort"));
    json_t *kw = json_is_object(kwargs) ? json_copy(kwargs) : NULL;
    if (effort && *effort) {
        if (!kw) kw = json_object();
        if (!strcmp(effort, "none")) {
            json_object_del(kw, "reasoning_effort");
            json_object_set_new(kw, "enable_thinking", json_false());
        } else json_object_set_new(kw, "reasoning_effort", json_string(effort));
    }
    char *lead = NULL; /* a forced call's opening the model writes after its reasoning */
    int32_t *ids = srv_chat_prompt(s, msgs, tools, force, kw, reason, &j->call_opening, &lead, &think_open, &n, &e);
    json_decref(kw);
    json_decref(msgs);
    char *g = NULL;
    if (ids && (j->call_opening || lead) && !(g = srv_tools_grammar(s, tools, force, lead, API_OPENAI, &e))) {
        st_free(ids);
        ids = NULL;
    }
    st_free(lead);
    job_set_grammar(j, g); /* a forced call: its arguments follow the function's schema */
    if (ids && tools && !force) srv_job_lazy_tools(j, tools, API_OPENAI); /* auto: a call it starts is whole */
    if (!ids) {
        job_release(j);
        return srv_send_error(s, c, API_OPENAI, &e);
    }
    srv_job_reasoning(j, reason, think_open); /* reasoning_content apart from the content */
    /* llama-server's reasoning budget: reasoning_budget_tokens (or thinking_budget_tokens), -1 for none */
    long long budget = -1;
    if (jf_int(body, "reasoning_budget_tokens", -1, INT32_MAX, &budget, &e) < 0 ||
        (budget == -1 && jf_int(body, "thinking_budget_tokens", -1, INT32_MAX, &budget, &e) < 0)) {
        st_free(ids);
        job_release(j);
        return srv_send_error(s, c, API_OPENAI, &e);
    }
    /* and llama-server's reasoning_budget_message: text written before the end (absent: the server's) */
    const char *msg = NULL;
    if (jf_string(body, "reasoning_budget_message", &msg, &e) < 0 ||
        (msg && strlen(msg) > SRV_BUDGET_MESSAGE_MAX &&
         srv_fail(&e, 400, "reasoning_budget_message", "invalid_value",
                  "'reasoning_budget_message' is longer than %d bytes", SRV_BUDGET_MESSAGE_MAX) < 0)) {
        st_free(ids);
        job_release(j);
        return srv_send_error(s, c, API_OPENAI, &e);
    }
    srv_job_think_budget(j, budget == -1 ? s->p.reasoning_budget : (int)budget, think_open, msg); /* -1: the server's */
    return finish_request(s, c, body, j, ids, n, "max_completion_tokens", 1);
}

/* prompt: a string, an array of one string, or an array of token ids. */
static int32_t *completion_prompt(srv_ctx *s, json_t *body, int *n, srv_err *e) {
    json_t *p = json_object_get(body, "prompt");
    if (!p) {
        srv_fail(e, 400, "prompt", "missing_required_parameter", "Missing required parameter: 'prompt'");
        return NULL;
    }
    if (json_is_array(p) && json_array_size(p) == 1 &&
        (json_is_string(json_array_get(p, 0)) || json_is_array(json_array_get(p, 0))))
        p = json_array_get(p, 0); /* one prompt in a list: ["text"] or [[ids]] */
    if (json_is_array(p) && json_array_size(p) == 0) {
        srv_fail(e, 400, "prompt", "invalid_value", "'prompt' is empty");
        return NULL;
    }
    int32_t *ids = NULL;
    if (json_is_string(p)) ids = srv_tokenize(s, json_string_value(p), json_string_length(p), 1, 1, "prompt", n, e);
    else if (json_is_array(p) && json_is_integer(json_array_get(p, 0))) { /* not empty: refused above */
        size_t len = json_array_size(p), i;
        if (len > (size_t)s->n_ctx) {
            srv_check_context(s, (int)(len < (1u << 30) ? len : 1u << 30), API_OPENAI, "prompt", e);
            return NULL;
        }
        ids = st_malloc(len * sizeof(int32_t));
        json_t *t;
        json_array_foreach(p, i, t) {
            json_int_t v = json_is_integer(t) ? json_integer_value(t) : -1;
            if (v < 0 || v >= tokenizer_n_vocab(s->tok)) {
                srv_fail(e, 400, "prompt", "invalid_value", "'prompt[%zu]' is not a token id of this model", i);
                st_free(ids);
                return NULL;
            }
            ids[i] = (int32_t)v;
        }
        *n = (int)len;
    } else if (json_is_array(p)) {
        srv_fail(e, 400, "prompt", "unsupported_parameter",
                 "'prompt' must be a string or an array of token ids, or one of them in an array (one prompt per "
                 "request)");
        return NULL;
    } else {
        srv_fail(e, 400, "prompt", "invalid_type", "'prompt' must be a string or an array");
        return NULL;
    }
    if (ids && *n == 0) {
        srv_fail(e, 400, "prompt", "invalid_value", "'prompt' is empty");
        st_free(ids);
        return NULL;
    }
    return ids;
}

enum MHD_Result oai_completions(srv_ctx *s, struct MHD_Connection *c, json_t *body) {
    srv_err e;
    srv_job *j = job_new(s, JOB_OAI_COMPLETION, c);
    int n = 0;
    int32_t *ids = NULL;
    if (jf_known_keys(body, COMPLETION_KEYS, &e) < 0 || check_unsupported(body, 0, &e) < 0 ||
        parse_stream(body, j, &e) < 0 || !(ids = completion_prompt(s, body, &n, &e))) {
        job_release(j);
        return srv_send_error(s, c, API_OPENAI, &e);
    }
    return finish_request(s, c, body, j, ids, n, "max_tokens", 0);
}

/* ---- output (called with the job's mutex held) ---- */

/* A token's text (its bytes, lossy UTF-8 as a JSON string) and bytes array. */
static json_t *token_entry(srv_job *j, int32_t id, float lp) {
    char buf[256];
    int64_t n = tokenizer_token_to_piece(j->srv->tok, id, 0, buf, sizeof buf);
    if (n < 0) n = 0;
    if (n > (int64_t)sizeof buf) n = sizeof buf;
    json_t *bytes = json_array();
    for (int64_t i = 0; i < n; i++) json_array_append_new(bytes, json_integer((unsigned char)buf[i]));
    return json_pack("{s:o, s:f, s:o}", "token", srv_json_text(buf, (size_t)n), "logprob", (double)lp, "bytes", bytes);
}

void oai_token(srv_job *j, const srv_event *ev) {
    if (j->lp) { /* the client's logprobs, with its own number of alternatives */
        json_t *e = token_entry(j, ev->token, ev->logprob), *top = json_array();
        for (int k = 0; k < ev->n_top && k < j->lp_top; k++)
            json_array_append_new(top, token_entry(j, ev->top_ids[k], ev->top_lp[k]));
        json_object_set_new(e, "top_logprobs", top);
        json_array_append_new(j->lp, e);
    }
    if (j->probs) { /* n_probs: llama-server's entries carry the ids */
        json_t *e = token_entry(j, ev->token, ev->logprob), *top = json_array();
        json_object_set_new(e, "id", json_integer(ev->token));
        for (int k = 0; k < ev->n_top && k < j->n_probs; k++) {
            json_t *t = token_entry(j, ev->top_ids[k], ev->top_lp[k]);
            json_object_set_new(t, "id", json_integer(ev->top_ids[k]));
            json_array_append_new(top, t);
        }
        json_object_set_new(e, "top_logprobs", top);
        json_array_append_new(j->probs, e);
    }
}

/* The logprobs object for entries (taken), in the chat or the legacy shape. */
static json_t *logprobs_json(srv_job *j, json_t *entries, size_t text_offset) {
    if (j->kind == JOB_OAI_CHAT) return json_pack("{s:o, s:n}", "content", entries, "refusal");
    json_t *toks = json_array(), *lps = json_array(), *tops = json_array(), *offs = json_array(), *e;
    size_t i, off = text_offset;
    json_array_foreach(entries, i, e) {
        json_array_append(toks, json_object_get(e, "token"));
        json_array_append(lps, json_object_get(e, "logprob"));
        json_t *t = json_object(), *x;
        size_t k;
        json_array_foreach(json_object_get(e, "top_logprobs"), k, x)
            json_object_set(t, json_string_value(json_object_get(x, "token")), json_object_get(x, "logprob"));
        json_array_append_new(tops, t);
        json_array_append_new(offs, json_integer((json_int_t)off));
        off += json_array_size(json_object_get(e, "bytes"));
    }
    json_decref(entries);
    return json_pack("{s:o, s:o, s:o, s:o}", "tokens", toks, "token_logprobs", lps, "top_logprobs", tops, "text_offset",
                     offs);
}

/* The entries not yet sent, as a logprobs object (null when not asked). */
static json_t *take_logprobs(srv_job *j) {
    if (!j->lp) return json_null();
    json_t *e = j->lp;
    j->lp = json_array();
    size_t off = j->lp_offset;
    size_t i;
    json_t *x;
    json_array_foreach(e, i, x) j->lp_offset += json_array_size(json_object_get(x, "bytes"));
    return logprobs_json(j, e, off);
}

static const char *finish_reason(const srv_job *j) { return !strcmp(j->st.finish, "length") ? "length" : "stop"; }

static json_t *usage(const srv_job *j) {
    return json_pack("{s:i, s:i, s:i, s:{s:i}}", "prompt_tokens", j->st.n_prompt, "completion_tokens", j->st.n_gen,
                     "total_tokens", j->st.n_prompt + j->st.n_gen, "prompt_tokens_details", "cached_tokens",
                     j->st.n_reused);
}

/* llama-server's timings of a finished request (its clients read them): the
 * prompt's tokens evaluated (the reused ones are cache_n) and the generated ones. */
static json_t *timings(const srv_job *j) {
    const gen_stats *st = &j->st;
    return json_pack("{s:i, s:i, s:f, s:f, s:f, s:i, s:f, s:f, s:f}", "cache_n", st->n_reused, "prompt_n", st->n_read,
                     "prompt_ms", st->prompt_ms, "prompt_per_token_ms", st->n_read ? st->prompt_ms / st->n_read : 0.0,
                     "prompt_per_second", st->prompt_ms > 0 ? 1e3 * st->n_read / st->prompt_ms : 0.0, "predicted_n",
                     st->n_gen, "predicted_ms", st->gen_ms, "predicted_per_token_ms",
                     st->n_gen ? st->gen_ms / st->n_gen : 0.0, "predicted_per_second",
                     st->gen_ms > 0 ? 1e3 * st->n_gen / st->gen_ms : 0.0);
}

/* One SSE chunk with one choice (text or delta) or, when choice is NULL, the usage chunk. */
static void put_chunk(srv_job *j, json_t *choice, json_t *use) {
    int chat = j->kind == JOB_OAI_CHAT;
    json_t *o = json_pack("{s:s, s:s, s:I, s:s, s:s}", "id", j->id, "object",
                          chat ? "chat.completion.chunk" : "text_completion", "created", (json_int_t)j->created,
                          "model", j->srv->model_name, "system_fingerprint", "strata");
    json_object_set_new(o, "choices", choice ? json_pack("[o]", choice) : json_array());
    if (choice && j->probs && json_array_size(j->probs)) { /* n_probs: the entries of the tokens since the last chunk */
        json_object_set_new(o, "completion_probabilities", j->probs);
        j->probs = json_array();
    }
    if (j->include_usage) json_object_set_new(o, "usage", use ? use : json_null());
    char *txt = json_dumps(o, JSON_COMPACT);
    json_decref(o);
    sbuf_puts(&j->out, "data: ");
    sbuf_puts(&j->out, txt);
    sbuf_puts(&j->out, "\n\n");
    free(txt);
}

static json_t *choice(srv_job *j, json_t *text, const char *finish) {
    json_t *fin = finish ? json_string(finish) : json_null();
    json_t *lp = j->lp && json_array_size(j->lp) ? take_logprobs(j) : json_null();
    if (j->kind == JOB_OAI_CHAT)
        return json_pack("{s:i, s:o, s:o, s:o}", "index", 0, "delta", text, "logprobs", lp, "finish_reason", fin);
    return json_pack("{s:i, s:o, s:o, s:o}", "index", 0, "text", text, "logprobs", lp, "finish_reason", fin);
}

/* Streamed answers with tools (tools_stream): content as it comes, each call
 * as a tool_calls delta with index, id, type and name, then its arguments in
 * fragments, as OpenAI streams them. */
static void ts_content(void *ctx, const char *t, size_t n) {
    srv_job *j = ctx;
    put_chunk(j, choice(j, json_pack("{s:o}", "content", srv_json_text(t, n)), NULL), NULL);
}

static void ts_begin(void *ctx, int i, const char *id, const char *name) {
    srv_job *j = ctx;
    put_chunk(j,
              choice(j,
                     json_pack("{s:[{s:i, s:s, s:s, s:{s:s, s:s}}]}", "tool_calls", "index", i, "id", id, "type",
                               "function", "function", "name", name, "arguments", ""),
                     NULL),
              NULL);
}

static void ts_args(void *ctx, int i, const char *t, size_t n) {
    srv_job *j = ctx;
    put_chunk(j,
              choice(j,
                     json_pack("{s:[{s:i, s:{s:o}}]}", "tool_calls", "index", i, "function", "arguments",
                               srv_json_text(t, n)),
                     NULL),
              NULL);
}

static void ts_end(void *ctx, int i) {
    (void)ctx;
    (void)i;
}

void oai_stream_begin(srv_job *j) {
    if (j->kind == JOB_OAI_CHAT)
        put_chunk(j, choice(j, json_pack("{s:s, s:s}", "role", "assistant", "content", ""), NULL), NULL);
    if (j->kind == JOB_OAI_CHAT && j->tools) {
        static const tools_stream_cb cb = {ts_content, ts_begin, ts_args, ts_end};
        char prefix[96];
        srv_job_call_prefix(j, prefix, sizeof prefix);
        j->ts = tools_stream_new(j->tools, (tools_family)j->srv->tools_fam, prefix, &cb, j);
        srv_job_stream_opening(j);
    }
}

void oai_stream_text(srv_job *j, const char *text, size_t len) {
    json_t *t = srv_json_text(text, len);
    put_chunk(j, choice(j, j->kind == JOB_OAI_CHAT ? json_pack("{s:o}", "content", t) : t, NULL), NULL);
}

void oai_stream_reasoning(srv_job *j, const char *text, size_t len) {
    put_chunk(j, choice(j, json_pack("{s:o}", "reasoning_content", srv_json_text(text, len)), NULL), NULL);
}

void oai_stream_end(srv_job *j) {
    if (j->failed) {
        srv_err e;
        if (j->failed == 2) srv_fail(&e, 503, NULL, "engine_stopped", "%s", j->err); /* the engine process died */
        else if (j->failed == 3) srv_fail(&e, 503, NULL, "shutting_down", "%s", j->err);
        else srv_fail(&e, 500, NULL, "engine_error", "%s", j->err);
        json_t *o = srv_error_json(API_OPENAI, &e);
        char *txt = json_dumps(o, JSON_COMPACT);
        json_decref(o);
        sbuf_printf(&j->out, "data: %s\n\n", txt);
        free(txt);
    } else {
        if (j->ts) {
            j->ts_calls = tools_stream_end(j->ts);
            put_chunk(j,
                      choice(j, json_object(),
                             j->ts_calls && strcmp(j->st.finish, "length") ? "tool_calls" : finish_reason(j)),
                      NULL);
        } else
            put_chunk(j, choice(j, j->kind == JOB_OAI_CHAT ? json_object() : json_string(""), finish_reason(j)), NULL);
        if (j->include_usage) put_chunk(j, NULL, usage(j));
    }
    sbuf_puts(&j->out, "data: [DONE]\n\n");
}

/* llama-server's n_probs: every generated token with its top alternatives, in its native shape. */
static json_t *with_probs(srv_job *j, json_t *resp) {
    if (j->probs) {
        json_object_set_new(resp, "completion_probabilities", j->probs);
        j->probs = NULL;
    }
    return resp;
}

json_t *oai_response(srv_job *j) {
    json_t *ch;
    if (j->kind == JOB_OAI_CHAT && j->tools) {
        sbuf content = {0};
        json_t *calls = srv_job_tool_calls(j, &content);
        json_t *msg = json_pack(
            "{s:s, s:o, s:n}", "role", "assistant", "content",
            content.len || !calls ? srv_json_text(content.s ? content.s : "", content.len) : json_null(), "refusal");
        if (calls) json_object_set_new(msg, "tool_calls", calls);
        if (j->reasoning.len)
            json_object_set_new(msg, "reasoning_content", srv_json_text(j->reasoning.s, j->reasoning.len));
        ch = json_pack("{s:i, s:o, s:o, s:s}", "index", 0, "message", msg, "logprobs", take_logprobs(j),
                       "finish_reason", calls ? "tool_calls" : finish_reason(j));
        sbuf_free(&content);
        return with_probs(j, json_pack("{s:s, s:s, s:I, s:s, s:s, s:[o], s:o, s:o}", "id", j->id, "object",
                                       "chat.completion", "created", (json_int_t)j->created, "model",
                                       j->srv->model_name, "system_fingerprint", "strata", "choices", ch, "usage",
                                       usage(j), "timings", timings(j)));
    }
    json_t *text = srv_json_text(j->text.s ? j->text.s : "", j->text.len);
    json_t *lp = take_logprobs(j);
    if (j->kind == JOB_OAI_CHAT) {
        ch = json_pack("{s:i, s:{s:s, s:o, s:n}, s:o, s:s}", "index", 0, "message", "role", "assistant", "content",
                       text, "refusal", "logprobs", lp, "finish_reason", finish_reason(j));
        if (j->reasoning.len) /* llama-server's field for a thinking model's reasoning */
            json_object_set_new(json_object_get(ch, "message"), "reasoning_content",
                                srv_json_text(j->reasoning.s, j->reasoning.len));
    } else
        ch = json_pack("{s:i, s:o, s:o, s:s}", "index", 0, "text", text, "logprobs", lp, "finish_reason",
                       finish_reason(j));
    return with_probs(j, json_pack("{s:s, s:s, s:I, s:s, s:s, s:[o], s:o, s:o}", "id", j->id, "object",
                                   j->kind == JOB_OAI_CHAT ? "chat.completion" : "text_completion", "created",
                                   (json_int_t)j->created, "model", j->srv->model_name, "system_fingerprint", "strata",
                                   "choices", ch, "usage", usage(j), "timings", timings(j)));
}
