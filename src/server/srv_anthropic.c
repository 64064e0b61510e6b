/* Anthropic API: POST /v1/messages (one message, or the SSE events
 * message_start, content_block_start, content_block_delta..., content_block_stop,
 * message_delta, message_stop) and POST /v1/messages/count_tokens.
 *
 * Parameter policy as for OpenAI (srv_openai.c): known and honoured, known
 * and ignored (metadata, service_tier), known but not given yet (tools,
 * thinking: 400 "unsupported"), unknown (400, as Anthropic answers extra inputs).
 * Usage follows Anthropic's accounting: input_tokens counts the prompt tokens
 * read, cache_read_input_tokens those reused from the slot's cache; their
 * sum is what count_tokens returns. */
#include <string.h>

#include "core/alloc.h"
#include "server/srv_internal.h"

/* temperature, top_p and top_k are gone from the newest API but older clients send them */
static const char *const MESSAGE_KEYS[] = {
    "model", "messages", "max_tokens", "system", "stop_sequences", "stream", "temperature", "top_p", "top_k",
    "metadata", "tools", "tool_choice", "thinking", "service_tier", "cache_control", "container", "diagnostics",
    "inference_geo", "output_config", "speed", "user_profile_id", "workspace_id",
    /* extensions */
    "min_p", "seed", "repeat_penalty", NULL};
static const char *const COUNT_KEYS[] = {"model", "messages", "system", "tools", "tool_choice", "thinking",
                                         "cache_control", "output_config", "speed", "user_profile_id",
                                         "workspace_id", NULL};

/* Known fields with no effect here (caching hints, routing, ids): type-checked, ignored. */
static const struct {
    const char *key;
    json_type type;
} IGNORED[] = {
    {"metadata", JSON_OBJECT}, {"service_tier", JSON_STRING}, {"cache_control", JSON_OBJECT},
    {"diagnostics", JSON_OBJECT}, {"inference_geo", JSON_STRING}, {"speed", JSON_STRING},
    {"user_profile_id", JSON_STRING}, {"workspace_id", JSON_STRING}, {"container", JSON_NULL},
};

static int unsupported(srv_err *e, const char *key, const char *why) {
    return srv_fail(e, 400, key, "unsupported_parameter", "%s: not supported by this server yet (%s)", key, why);
}

static int check_common(json_t *body, srv_err *e) {
    const char *s;
    if (jf_string(body, "model", &s, e) < 0) return -1;
    json_t *v = json_object_get(body, "tools");
    if (v && !json_is_null(v)) {
        if (!json_is_array(v)) return srv_fail(e, 400, "tools", "invalid_type", "tools: must be an array");
        if (json_array_size(v)) return unsupported(e, "tools", "no tool use");
    }
    v = json_object_get(body, "tool_choice");
    if (v && !json_is_null(v)) {
        json_t *t = json_object_get(v, "type");
        if (!json_is_object(v) || !json_is_string(t))
            return srv_fail(e, 400, "tool_choice", "invalid_type", "tool_choice: must be an object with a 'type'");
        if (strcmp(json_string_value(t), "none") && strcmp(json_string_value(t), "auto"))
            return unsupported(e, "tool_choice", "no tool use");
    }
    v = json_object_get(body, "thinking");
    if (v && !json_is_null(v)) {
        json_t *t = json_object_get(v, "type");
        if (!json_is_object(v) || !json_is_string(t))
            return srv_fail(e, 400, "thinking", "invalid_type", "thinking: must be an object with a 'type'");
        if (strcmp(json_string_value(t), "disabled")) return unsupported(e, "thinking", "no extended thinking");
    }
    v = json_object_get(body, "output_config");
    if (v && !json_is_null(v)) {
        if (!json_is_object(v)) return srv_fail(e, 400, "output_config", "invalid_type", "output_config: must be an object");
        json_t *f = json_object_get(v, "format");
        if (f && !json_is_null(f)) return unsupported(e, "output_config.format", "no structured outputs");
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

static void free_msgs(chat_msg *msgs, size_t n) {
    for (size_t i = 0; i < n; i++) st_free((void *)msgs[i].content);
    st_free(msgs);
}

/* system + messages -> chat_msg; roles user and assistant only. */
static chat_msg *parse_messages(json_t *body, size_t *n_out, srv_err *e) {
    json_t *arr = json_object_get(body, "messages"), *sys = json_object_get(body, "system");
    if (!arr) {
        srv_fail(e, 400, "messages", "missing_required_parameter", "messages: Field required");
        return NULL;
    }
    if (!json_is_array(arr) || json_array_size(arr) == 0) {
        srv_fail(e, 400, "messages", "invalid_value", "messages: must be a non-empty array");
        return NULL;
    }
    size_t n = json_array_size(arr), k = 0, i;
    chat_msg *msgs = st_calloc(n + 1, sizeof *msgs);
    if (sys && !json_is_null(sys)) {
        char *text;
        if (srv_content_text(sys, "system", "\n", &text, e) < 0) goto fail;
        msgs[k++] = (chat_msg){"system", text};
    }
    json_t *m;
    char param[64], cparam[80];
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
        snprintf(cparam, sizeof cparam, "%s.content", param);
        char *text;
        if (srv_content_text(content, cparam, "", &text, e) < 0) goto fail;
        msgs[k++] = (chat_msg){r, text};
    }
    *n_out = k;
    return msgs;
fail:
    free_msgs(msgs, k);
    return NULL;
}

enum MHD_Result anth_count_tokens(srv_ctx *s, struct MHD_Connection *c, json_t *body) {
    srv_err e;
    size_t n_msg;
    chat_msg *msgs = NULL;
    if (jf_known_keys(body, COUNT_KEYS, &e) < 0 || check_common(body, &e) < 0 ||
        !(msgs = parse_messages(body, &n_msg, &e)))
        return srv_send_error(s, c, API_ANTHROPIC, &e);
    int n;
    int32_t *ids = srv_chat_tokens(s, msgs, n_msg, &n, &e);
    free_msgs(msgs, n_msg);
    if (!ids) return srv_send_error(s, c, API_ANTHROPIC, &e);
    st_free(ids);
    return srv_send_json(s, c, 200, json_pack("{s:i}", "input_tokens", n));
}

enum MHD_Result anth_messages(srv_ctx *s, struct MHD_Connection *c, json_t *body) {
    srv_err e;
    srv_job *j = job_new(s, JOB_ANTHROPIC, c);
    size_t n_msg = 0;
    chat_msg *msgs = NULL;
    const char *stops[17];
    int n_stop = 0;
    srv_sampling_rules rules = {"max_tokens", 1.0};
    if (jf_known_keys(body, MESSAGE_KEYS, &e) < 0 || check_common(body, &e) < 0 ||
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
    if (!(msgs = parse_messages(body, &n_msg, &e))) goto fail;
    int n;
    int32_t *ids = srv_chat_tokens(s, msgs, n_msg, &n, &e);
    free_msgs(msgs, n_msg);
    if (!ids) goto fail;
    if (srv_check_context(s, n, API_ANTHROPIC, "messages", &e) < 0) {
        st_free(ids);
        goto fail;
    }
    j->n_user_stop = n_stop;
    stops[n_stop++] = s->eot;
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

void anth_stream_begin(srv_job *j) {
    put_event(j, "message_start",
              json_pack("{s:s, s:{s:s, s:s, s:s, s:s, s:[], s:n, s:n, s:{s:i, s:i}}}", "type", "message_start",
                        "message", "id", j->id, "type", "message", "role", "assistant", "model", j->srv->model_name,
                        "content", "stop_reason", "stop_sequence", "usage", "input_tokens", j->req.n_prompt,
                        "output_tokens", 0));
    put_event(j, "content_block_start",
              json_pack("{s:s, s:i, s:{s:s, s:s}}", "type", "content_block_start", "index", 0, "content_block",
                        "type", "text", "text", ""));
}

void anth_stream_text(srv_job *j, const char *text, size_t len) {
    put_event(j, "content_block_delta",
              json_pack("{s:s, s:i, s:{s:s, s:o}}", "type", "content_block_delta", "index", 0, "delta", "type",
                        "text_delta", "text", srv_json_text(text, len)));
}

void anth_stream_end(srv_job *j) {
    if (j->failed) {
        srv_err e;
        srv_fail(&e, 500, NULL, NULL, "%s", j->err);
        put_event(j, "error", srv_error_json(API_ANTHROPIC, &e));
        return;
    }
    put_event(j, "content_block_stop", json_pack("{s:s, s:i}", "type", "content_block_stop", "index", 0));
    put_event(j, "message_delta",
              json_pack("{s:s, s:{s:s, s:o}, s:o}", "type", "message_delta", "delta", "stop_reason", stop_reason(j),
                        "stop_sequence", stop_sequence(j), "usage", usage(j)));
    put_event(j, "message_stop", json_pack("{s:s}", "type", "message_stop"));
}

json_t *anth_response(srv_job *j) {
    json_t *text = srv_json_text(j->text.s ? j->text.s : "", j->text.len);
    return json_pack("{s:s, s:s, s:s, s:s, s:[{s:s, s:o}], s:s, s:o, s:o}", "id", j->id, "type", "message", "role",
                     "assistant", "model", j->srv->model_name, "content", "type", "text", "text", text, "stop_reason",
                     stop_reason(j), "stop_sequence", stop_sequence(j), "usage", usage(j));
}
