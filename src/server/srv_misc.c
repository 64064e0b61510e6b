/* Small endpoints: GET /v1/models (OpenAI's list, or Anthropic's when the
 * request carries anthropic-version), GET /metrics (Prometheus text format),
 * POST /tokenize and /detokenize (llama.cpp's shapes). */
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <stdlib.h>

#include "core/alloc.h"
#include "core/log.h"
#include "server/srv_internal.h"
#include "server/srv_web.h"

static json_t *model_object(srv_ctx *s, int anthropic) {
    if (anthropic) {
        char date[32];
        time_t t = (time_t)s->started;
        struct tm tm;
        gmtime_r(&t, &tm);
        strftime(date, sizeof date, "%Y-%m-%dT%H:%M:%SZ", &tm);
        return json_pack("{s:s, s:s, s:s, s:s}", "type", "model", "id", s->model_name, "display_name", s->model_name,
                         "created_at", date);
    }
    return json_pack("{s:s, s:s, s:I, s:s, s:i}", "id", s->model_name, "object", "model", "created",
                     (json_int_t)s->started, "owned_by", "strata", "context_length", s->n_ctx);
}

enum MHD_Result srv_models(srv_ctx *s, struct MHD_Connection *c, const char *id) {
    int anthropic = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "anthropic-version") != NULL;
    if (id) {
        if (strcmp(id, s->model_name)) {
            srv_err e;
            srv_fail(&e, 404, "model", "model_not_found", "The model '%.200s' does not exist; this server has '%s'", id,
                     s->model_name);
            return srv_send_error(s, c, anthropic ? API_ANTHROPIC : API_OPENAI, &e);
        }
        return srv_send_json(s, c, 200, model_object(s, anthropic));
    }
    if (anthropic)
        return srv_send_json(s, c, 200,
                             json_pack("{s:[o], s:b, s:s, s:s}", "data", model_object(s, 1), "has_more", 0, "first_id",
                                       s->model_name, "last_id", s->model_name));
    return srv_send_json(s, c, 200, json_pack("{s:s, s:[o]}", "object", "list", "data", model_object(s, 0)));
}

enum MHD_Result srv_props(srv_ctx *s, struct MHD_Connection *c) {
    sched_metrics m;
    sched_metrics_get(s->sched, &m);
    const char *tmpl = NULL;
    uint64_t len = 0;
    if (gguf_get_str(s->gf, "tokenizer.chat_template", &tmpl, &len) != 0) tmpl = NULL;
    return srv_send_json(s, c, 200,
                         json_pack("{s:s, s:i, s:i, s:{s:i}, s:o, s:s}", "model_alias", s->model_name, "n_ctx",
                                   s->n_ctx, "total_slots", m.n_slots, "default_generation_settings", "n_ctx", s->n_ctx,
                                   "chat_template", tmpl ? json_stringn(tmpl, (size_t)len) : json_null(), "build_info",
                                   "strata"));
}

/* GET /experts: the engine's expert cache as a layer x expert picture (the
 * web page draws it), as of its last finished request. Each cell of the
 * row-major string: '0' + heat level 0-3 (routing count, decayed, over the
 * layer's hottest: above 0.05, 0.2, 0.5) + 4 when the GPU's cache holds it
 * (moe_lanes_cache_map). {"offloaded": false} when every expert is on one
 * device or no request has finished. */
enum MHD_Result srv_experts(srv_ctx *s, struct MHD_Connection *c) {
    char *cells = NULL;
    int nl = 0, nx = 0;
    if (sched_expert_map(s->sched, &cells, &nl, &nx) != 0)
        return srv_send_json(s, c, 200, json_pack("{s:b}", "offloaded", 0));
    long resident = 0;
    for (long i = 0; i < (long)nl * nx; i++) resident += cells[i] >= '4';
    json_t *j = json_pack("{s:b, s:i, s:i, s:I, s:s%, s:s}", "offloaded", 1, "layers", nl, "experts", nx, "resident",
                          (json_int_t)resident, "cells", cells, (size_t)nl * nx, "cell",
                          "'0' + heat level 0-3 + 4 when cached on the GPU");
    st_free(cells);
    if (!j) return srv_send_json(s, c, 500, json_pack("{s:s}", "error", "the expert map could not be encoded"));
    return srv_send_json(s, c, 200, j);
}

static void metric(sbuf *b, const char *name, const char *type, const char *help, double v) {
    sbuf_printf(b, "# HELP strata_%s %s\n# TYPE strata_%s %s\nstrata_%s %.17g\n", name, help, name, type, name, v);
}

enum MHD_Result srv_metrics(srv_ctx *s, struct MHD_Connection *c) {
    sched_metrics m;
    sched_metrics_get(s->sched, &m);
    sbuf b = {0};
    sbuf_puts(&b, "# HELP strata_http_requests_total HTTP responses sent, by status code.\n"
                  "# TYPE strata_http_requests_total counter\n");
    for (int i = 0; i < SRV_N_STATUS; i++) {
        uint64_t n = atomic_load(&s->by_status[i]);
        if (SRV_STATUS_CODES[i])
            sbuf_printf(&b, "strata_http_requests_total{code=\"%d\"} %llu\n", SRV_STATUS_CODES[i],
                        (unsigned long long)n);
        else sbuf_printf(&b, "strata_http_requests_total{code=\"other\"} %llu\n", (unsigned long long)n);
    }
    metric(&b, "http_read_timeouts_total", "counter",
           "Requests whose connection was closed because they were not read whole within --read-timeout.",
           (double)atomic_load(&s->read_timeouts));
    sbuf_puts(&b, "# HELP strata_generations_total Generations finished, by outcome.\n"
                  "# TYPE strata_generations_total counter\n");
    sbuf_printf(&b, "strata_generations_total{outcome=\"done\"} %llu\n", (unsigned long long)m.done);
    sbuf_printf(&b, "strata_generations_total{outcome=\"failed\"} %llu\n", (unsigned long long)m.failed);
    sbuf_printf(&b, "strata_generations_total{outcome=\"cancelled\"} %llu\n", (unsigned long long)m.cancelled);
    metric(&b, "prompt_tokens_total", "counter", "Prompt tokens of finished generations.", (double)m.prompt_tokens);
    metric(&b, "prompt_tokens_reused_total", "counter", "Prompt tokens reused from a slot's cache.",
           (double)m.reused_tokens);
    metric(&b, "prompt_tokens_read_total", "counter", "Prompt tokens evaluated.", (double)m.read_tokens);
    metric(&b, "generated_tokens_total", "counter", "Tokens generated.", (double)m.gen_tokens);
    metric(&b, "draft_tokens_total", "counter", "Tokens drafted by speculative decoding (--draft).",
           (double)m.drafts_total);
    metric(&b, "draft_tokens_accepted_total", "counter", "Drafted tokens that verification kept.",
           (double)m.drafts_accepted);
    metric(&b, "prompt_seconds_total", "counter", "Time spent reading prompts.", m.prompt_s);
    metric(&b, "generation_seconds_total", "counter", "Time spent generating.", m.gen_s);
    metric(&b, "prompt_tokens_per_second", "gauge", "Prompt speed of the last finished request.", m.last_prompt_tps);
    metric(&b, "generation_tokens_per_second", "gauge", "Generation speed of the last finished request.",
           m.last_gen_tps);
    metric(&b, "queue_depth", "gauge", "Requests waiting for a slot.", m.queued);
    metric(&b, "slots_busy", "gauge", "Slots generating.", m.busy);
    metric(&b, "slots_total", "gauge", "Slots (engines).", m.n_slots);
    metric(&b, "context_tokens", "gauge", "Context length of each slot.", m.n_ctx);
    long long kv, kv_cap;
    srv_slots_kv(s, &m, &kv, &kv_cap);
    metric(&b, "kv_cache_tokens", "gauge", "Tokens held in the slots' KV caches (a generating slot: its prompt).",
           (double)kv);
    metric(&b, "kv_cache_usage_ratio", "gauge", "KV cache tokens over the slots' total context.",
           kv_cap > 0 ? (double)kv / (double)kv_cap : 0);
    if (m.lanes) {
        const double pairs = (double)(m.pairs_dev + m.pairs_cpu + m.pairs_pcie);
        sbuf_printf(&b, "# HELP strata_expert_pairs_total (token, expert) pairs the engine computed (as of the last "
                        "finished request), by where the expert ran.\n# TYPE strata_expert_pairs_total counter\n");
        sbuf_printf(&b, "strata_expert_pairs_total{lane=\"gpu_cache\"} %llu\n", (unsigned long long)m.pairs_dev);
        sbuf_printf(&b, "strata_expert_pairs_total{lane=\"cpu\"} %llu\n", (unsigned long long)m.pairs_cpu);
        sbuf_printf(&b, "strata_expert_pairs_total{lane=\"pcie\"} %llu\n", (unsigned long long)m.pairs_pcie);
        metric(&b, "expert_cache_hit_ratio", "gauge", "Share of the expert pairs served by the GPU's expert cache.",
               pairs > 0 ? (double)m.pairs_dev / pairs : 0);
        metric(&b, "ssd_read_bytes_total", "counter",
               "Bytes the SSD tier read from the model file (experts beyond --ram-budget).", (double)m.bytes_ssd);
    }
    metric(&b, "engine_restarts_total", "counter", "Engine processes started after the first (each after a death).",
           (double)m.engine_restarts);
    /* each GPU's load, VRAM, temperature and power (NVML; strata_gpu_count 0 without it). No expert cache
     * metric yet: every expert is resident (the cache comes with the expert offload) */
    srv_web_gpu_metrics_text(&b);
    /* MHD frees the buffer with free(): hand it a malloc'd copy */
    char *txt = malloc(b.len + 1);
    ST_ASSERT(txt);
    memcpy(txt, b.s, b.len + 1);
    size_t len = b.len;
    sbuf_free(&b);
    return srv_send_text(s, c, 200, "text/plain; version=0.0.4", txt, len);
}

enum MHD_Result srv_tokenize_ep(srv_ctx *s, struct MHD_Connection *c, json_t *body) {
    static const char *const keys[] = {"content", "add_special", "parse_special", "with_pieces", NULL};
    srv_err e;
    const char *text = NULL;
    int add_special = 0, parse_special = 1, pieces = 0, rc;
    if (jf_known_keys(body, keys, &e) < 0 || (rc = jf_string(body, "content", &text, &e)) < 0 ||
        jf_bool(body, "add_special", &add_special, &e) < 0 || jf_bool(body, "parse_special", &parse_special, &e) < 0 ||
        jf_bool(body, "with_pieces", &pieces, &e) < 0)
        return srv_send_error(s, c, API_OPENAI, &e);
    if (!rc) {
        srv_fail(&e, 400, "content", "missing_required_parameter", "'content' (a string) is required");
        return srv_send_error(s, c, API_OPENAI, &e);
    }
    int n;
    int32_t *ids = srv_tokenize(s, text, strlen(text), add_special, parse_special, "content", &n, &e);
    if (!ids) return srv_send_error(s, c, API_OPENAI, &e);
    json_t *arr = json_array();
    for (int i = 0; i < n; i++) {
        if (!pieces) {
            json_array_append_new(arr, json_integer(ids[i]));
            continue;
        }
        char piece[256];
        int64_t len = tokenizer_token_to_piece(s->tok, ids[i], 1, piece, sizeof piece);
        if (len > (int64_t)sizeof piece) len = sizeof piece;
        json_array_append_new(
            arr, json_pack("{s:i, s:o}", "id", ids[i], "piece", srv_json_text(piece, len > 0 ? (size_t)len : 0)));
    }
    st_free(ids);
    return srv_send_json(s, c, 200, json_pack("{s:o}", "tokens", arr));
}

enum MHD_Result srv_detokenize_ep(srv_ctx *s, struct MHD_Connection *c, json_t *body) {
    static const char *const keys[] = {"tokens", NULL};
    srv_err e;
    json_t *arr = json_object_get(body, "tokens");
    if (jf_known_keys(body, keys, &e) < 0) return srv_send_error(s, c, API_OPENAI, &e);
    if (!json_is_array(arr)) {
        srv_fail(&e, 400, "tokens", "invalid_type", "'tokens' must be an array of token ids");
        return srv_send_error(s, c, API_OPENAI, &e);
    }
    /* a streaming detokenizer keeps the text valid UTF-8 whatever the ids */
    tok_stream *ts = tok_stream_new(s->tok, 1);
    sbuf b = {0};
    sbuf_put(&b, "", 0);
    size_t i;
    json_t *t;
    json_array_foreach(arr, i, t) {
        json_int_t v = json_is_integer(t) ? json_integer_value(t) : -1;
        const char *out;
        size_t len;
        if (v < 0 || v >= tokenizer_n_vocab(s->tok) || tok_stream_push(ts, (int32_t)v, &out, &len) != 0) {
            tok_stream_free(ts);
            sbuf_free(&b);
            srv_fail(&e, 400, "tokens", "invalid_value", "'tokens[%zu]' is not a token id of this model", i);
            return srv_send_error(s, c, API_OPENAI, &e);
        }
        sbuf_put(&b, out, len);
    }
    const char *out;
    size_t len;
    tok_stream_flush(ts, &out, &len);
    sbuf_put(&b, out, len);
    tok_stream_free(ts);
    json_t *j = json_pack("{s:o}", "content", srv_json_text(b.s, b.len));
    sbuf_free(&b);
    return srv_send_json(s, c, 200, j);
}
