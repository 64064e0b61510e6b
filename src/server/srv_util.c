/* Front-end helpers (srv_internal.h): errors in each API's shape,
 * strict JSON field readers, prompt building, ids and seeds. */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>

#include "core/alloc.h"
#include "core/log.h"
#include "server/srv_internal.h"

/* ---- errors ---- */

int srv_fail(srv_err *e, int status, const char *param, const char *code, const char *fmt, ...) {
    e->status = status;
    e->code = code;
    snprintf(e->param, sizeof e->param, "%s", param ? param : "");
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(e->msg, sizeof e->msg, fmt, ap);
    va_end(ap);
    return -1;
}

static const char *anthropic_type(int status) {
    switch (status) {
    case 400: return "invalid_request_error";
    case 401: return "authentication_error";
    case 403: return "permission_error";
    case 404: return "not_found_error";
    case 413: return "request_too_large";
    case 429: return "rate_limit_error";
    case 503: return "overloaded_error"; /* sent as 529, Anthropic's status for it (srv_http.c) */
    default: return status < 500 ? "invalid_request_error" : "api_error";
    }
}

static json_t *anthropic_error(const srv_err *e) {
    return json_pack("{s:s, s:{s:s, s:o}}", "type", "error", "error", "type", anthropic_type(e->status), "message",
                     srv_json_text(e->msg, strlen(e->msg)));
}

static json_t *openai_error(const srv_err *e) {
    const char *type = e->status == 401   ? "authentication_error" /* 404: invalid_request_error, as OpenAI's */
                       : e->status == 429 ? "rate_limit_error"
                       : e->status >= 500 && e->status != 501 ? "server_error" /* 501: the client's coding */
                                                              : "invalid_request_error";
    return json_pack("{s:{s:o, s:s, s:o, s:o}}", "error", "message", srv_json_text(e->msg, strlen(e->msg)), "type",
                     type, "param", e->param[0] ? srv_json_text(e->param, strlen(e->param)) : json_null(), "code",
                     e->code ? json_string(e->code) : json_null());
}

static int openai_too_long(const srv_ctx *s, int n_prompt, const char *param, srv_err *e) {
    return srv_fail(e, 400, param, "context_length_exceeded",
                    "This model's maximum context length is %d tokens. However, your %s resulted in %d "
                    "tokens, which leaves no room to generate.",
                    s->n_ctx, param, n_prompt);
}

static int anthropic_too_long(const srv_ctx *s, int n_prompt, const char *param, srv_err *e) {
    return srv_fail(e, 400, param, "context_length_exceeded", "prompt is too long: %d tokens > %d maximum", n_prompt,
                    s->n_ctx - 1);
}

const srv_api_row SRV_APIS[API_N] = {
    [API_OPENAI] = {openai_error, 503, openai_too_long},
    [API_ANTHROPIC] = {anthropic_error, 529, anthropic_too_long},
};

json_t *srv_error_json(srv_api api, const srv_err *e) { return SRV_APIS[api].error_json(e); }

json_t *srv_json_text(const char *text, size_t len) {
    json_t *j = json_stringn(text, len);
    if (j) return j;
    /* invalid UTF-8 (or a NUL): replace every byte that is not part of a valid
     * character, so the text still reaches the client */
    sbuf b = {0};
    sbuf_put(&b, "", 0);
    for (size_t i = 0; i < len;) {
        size_t n = 1;
        unsigned char c = (unsigned char)text[i];
        if (c >= 0xf0) n = 4;
        else if (c >= 0xe0) n = 3;
        else if (c >= 0xc0) n = 2;
        if (c && i + n <= len && tok_utf8_valid(text + i, n)) {
            sbuf_put(&b, text + i, n);
            i += n;
        } else {
            sbuf_puts(&b, "\xef\xbf\xbd");
            i++;
        }
    }
    j = json_stringn(b.s, b.len);
    sbuf_free(&b);
    return j;
}

/* ---- field readers ---- */

static const char *jtype(const json_t *v) {
    switch (json_typeof(v)) {
    case JSON_OBJECT: return "an object";
    case JSON_ARRAY: return "an array";
    case JSON_STRING: return "a string";
    case JSON_INTEGER: return "an integer";
    case JSON_REAL: return "a number";
    case JSON_TRUE:
    case JSON_FALSE: return "a boolean";
    default: return "null";
    }
}

int jf_string(json_t *o, const char *key, const char **out, srv_err *e) {
    json_t *v = json_object_get(o, key);
    if (!v || json_is_null(v)) return 0;
    if (!json_is_string(v))
        return srv_fail(e, 400, key, "invalid_type", "'%s' must be a string, not %s", key, jtype(v));
    *out = json_string_value(v);
    return 1;
}

int jf_bool(json_t *o, const char *key, int *out, srv_err *e) {
    json_t *v = json_object_get(o, key);
    if (!v || json_is_null(v)) return 0;
    if (!json_is_boolean(v))
        return srv_fail(e, 400, key, "invalid_type", "'%s' must be a boolean, not %s", key, jtype(v));
    *out = json_is_true(v);
    return 1;
}

int jf_number(json_t *o, const char *key, double lo, double hi, double *out, srv_err *e) {
    json_t *v = json_object_get(o, key);
    if (!v || json_is_null(v)) return 0;
    if (!json_is_number(v))
        return srv_fail(e, 400, key, "invalid_type", "'%s' must be a number, not %s", key, jtype(v));
    double d = json_number_value(v);
    if (!(d >= lo && d <= hi))
        return srv_fail(e, 400, key, "invalid_value", "'%s' is %g, outside [%g, %g]", key, d, lo, hi);
    *out = d;
    return 1;
}

int jf_int(json_t *o, const char *key, long long lo, long long hi, long long *out, srv_err *e) {
    json_t *v = json_object_get(o, key);
    if (!v || json_is_null(v)) return 0;
    long long n;
    if (json_is_integer(v)) {
        n = json_integer_value(v);
    } else if (json_is_real(v) && json_real_value(v) == floor(json_real_value(v))) { /* 16.0 is an integer too */
        const double d = json_real_value(v);            /* range first: a cast of 1e19 to long long is undefined */
        if (!(d >= (double)lo && d < (double)hi + 1.0)) /* hi + 1: LLONG_MAX rounds up to 2^63 */
            return srv_fail(e, 400, key, "invalid_value", "'%s' is %g, outside [%lld, %lld]", key, d, lo, hi);
        n = (long long)d;
    } else {
        return srv_fail(e, 400, key, "invalid_type", "'%s' must be an integer, not %s", key, jtype(v));
    }
    if (n < lo || n > hi)
        return srv_fail(e, 400, key, "invalid_value", "'%s' is %lld, outside [%lld, %lld]", key, n, lo, hi);
    *out = n;
    return 1;
}

int jf_known_keys(json_t *o, const char *const *known, srv_err *e) {
    const char *key;
    json_t *v;
    json_object_foreach(o, key, v) {
        int ok = 0;
        for (const char *const *k = known; *k && !ok; k++) ok = !strcmp(*k, key);
        if (!ok) return srv_fail(e, 400, key, "unknown_parameter", "Unrecognized request argument supplied: %s", key);
    }
    return 0;
}

int jf_stops(json_t *o, const char *key, const char **stops, int *n_stop, srv_err *e) {
    json_t *v = json_object_get(o, key);
    *n_stop = 0;
    if (!v || json_is_null(v)) return 0;
    if (json_is_string(v)) {
        if (json_string_length(v)) stops[(*n_stop)++] = json_string_value(v);
        return 1;
    }
    if (!json_is_array(v))
        return srv_fail(e, 400, key, "invalid_type", "'%s' must be a string or an array of strings, not %s", key,
                        jtype(v));
    if (json_array_size(v) > 16)
        return srv_fail(e, 400, key, "invalid_value", "'%s' has %zu entries, at most 16 are allowed", key,
                        json_array_size(v));
    size_t i;
    json_t *s;
    json_array_foreach(v, i, s) {
        if (!json_is_string(s))
            return srv_fail(e, 400, key, "invalid_type", "'%s[%zu]' must be a string, not %s", key, i, jtype(s));
        if (json_string_length(s)) stops[(*n_stop)++] = json_string_value(s);
    }
    return 1;
}

/* ---- prompts ---- */

int32_t *srv_tokenize(srv_ctx *s, const char *text, size_t len, int add_special, int parse_special, const char *param,
                      int *n, srv_err *e) {
    /* Decided before any tokenizer work: no token covers more than max_piece bytes of text, so a
     * longer text has more tokens than the context holds. An 8 MB word cost seconds of CPU and
     * ~40 bytes of BPE scratch per byte before this check. */
    if (len > s->prompt_max_bytes) {
        srv_fail(e, 400, param, "context_length_exceeded",
                 "the %s text is %zu bytes: more than the %d-token context can hold (at most %zu bytes, %zu per "
                 "token at most for this model), so it was not tokenized",
                 param ? param : "prompt", len, s->n_ctx, s->prompt_max_bytes, s->max_piece);
        return NULL;
    }
    /* one pass: a token covers at least one byte, and BOS, EOS and a space prefix per fragment add a few */
    int64_t cap = 2 * (int64_t)len + 8;
    int32_t *ids = st_malloc((size_t)cap * sizeof(int32_t));
    /* BPE needs ~40 bytes of scratch per byte of a word: big texts (a long context allows MBs) are
     * tokenized one at a time, so that many at once cost one core and one scratch, not all of them */
    const int big = len > SRV_BIG_TEXT;
    if (big) pthread_mutex_lock(&s->big_text_mu);
    int64_t need = tokenizer_encode(s->tok, text, len, add_special, parse_special, ids, cap);
    if (big) pthread_mutex_unlock(&s->big_text_mu);
    if (need < 0) {
        st_free(ids);
        srv_fail(e, 400, param, "invalid_value", "the text cannot be tokenized: %s", st_error_get());
        return NULL;
    }
    if (need > cap) { /* cannot happen by the bound above; stay correct anyway */
        ids = st_realloc(ids, (size_t)need * sizeof(int32_t));
        tokenizer_encode(s->tok, text, len, add_special, parse_special, ids, need);
    }
    *n = (int)need;
    return ids;
}

int srv_check_context(srv_ctx *s, int n_prompt, srv_api api, const char *param, srv_err *e) {
    if (n_prompt <= 0) /* e.g. a lone empty assistant message (prefill) of a model without BOS */
        return srv_fail(e, 400, param, "invalid_value",
                        "'%s' renders to an empty prompt (0 tokens): nothing to continue", param);
    if (n_prompt < s->n_ctx) return 0;
    return SRV_APIS[api].context_exceeded(s, n_prompt, param, e);
}

static uint64_t mix64(uint64_t z) {
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

uint64_t srv_random_seed(srv_ctx *s) {
    uint64_t r;
    if (getrandom(&r, sizeof r, GRND_NONBLOCK) == (ssize_t)sizeof r) return r;
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return mix64((uint64_t)ts.tv_nsec ^ ((uint64_t)ts.tv_sec << 32) ^ atomic_fetch_add(&s->id_counter, 1));
}

void srv_make_id(srv_ctx *s, const char *prefix, char *out, size_t cap) {
    uint64_t a = srv_random_seed(s), b = mix64(a ^ atomic_fetch_add(&s->id_counter, 1));
    snprintf(out, cap, "%s%016llx%08llx", prefix, (unsigned long long)a, (unsigned long long)(b & 0xffffffffu));
}

int srv_content_text(json_t *content, const char *param, const char *sep, char **out, srv_err *e) {
    if (json_is_string(content)) {
        *out = st_strdup(json_string_value(content));
        return 0;
    }
    if (!json_is_array(content))
        return srv_fail(e, 400, param, "invalid_type", "'%s' must be a string or an array of content blocks, not %s",
                        param, jtype(content));
    sbuf b = {0};
    sbuf_put(&b, "", 0);
    size_t i;
    json_t *blk;
    json_array_foreach(content, i, blk) {
        json_t *type = json_object_get(blk, "type"), *text = json_object_get(blk, "text");
        if (!json_is_object(blk) || !json_is_string(type)) {
            sbuf_free(&b);
            return srv_fail(e, 400, param, "invalid_type", "'%s[%zu]' must be an object with a string 'type'", param,
                            i);
        }
        if (strcmp(json_string_value(type), "text") != 0) {
            sbuf_free(&b);
            return srv_fail(e, 400, param, "unsupported_content", "'%s[%zu]': content of type '%s' is not supported",
                            param, i, json_string_value(type));
        }
        if (!json_is_string(text)) {
            sbuf_free(&b);
            return srv_fail(e, 400, param, "invalid_type", "'%s[%zu].text' must be a string", param, i);
        }
        if (i) sbuf_puts(&b, sep);
        sbuf_put(&b, json_string_value(text), json_string_length(text));
    }
    *out = b.s;
    return 0;
}

int srv_parse_sampling(srv_ctx *s, json_t *body, const srv_sampling_rules *r, sampler_params *sp, int *max_tokens,
                       srv_err *e) {
    *sp = sampler_defaults();
    sp->temp = 1.0f;
    sp->top_p = 1.0f;
    sp->top_k = 0;
    sp->min_p = 0.0f;
    sp->seed = srv_random_seed(s);
    double d;
    long long n;
    int rc;
    if ((rc = jf_number(body, "temperature", 0, r->temp_max, &d, e)) < 0) return -1;
    if (rc) sp->temp = (float)d;
    if ((rc = jf_number(body, "top_p", 0, 1, &d, e)) < 0) return -1;
    if (rc) sp->top_p = (float)d;
    if ((rc = jf_number(body, "min_p", 0, 1, &d, e)) < 0) return -1;
    if (rc) sp->min_p = (float)d;
    if ((rc = jf_number(body, "presence_penalty", -2, 2, &d, e)) < 0) return -1;
    if (rc) sp->presence_penalty = (float)d;
    if ((rc = jf_number(body, "frequency_penalty", -2, 2, &d, e)) < 0) return -1;
    if (rc) sp->frequency_penalty = (float)d;
    if ((rc = jf_number(body, "repeat_penalty", 0.01, 100, &d, e)) < 0) return -1;
    if (rc) sp->repeat_penalty = (float)d;
    if ((rc = jf_int(body, "top_k", 0, tokenizer_n_vocab(s->tok), &n, e)) < 0) return -1;
    if (rc) sp->top_k = (int)n;
    if ((rc = jf_int(body, "seed", INT64_MIN, INT64_MAX, &n, e)) < 0) return -1;
    if (rc) sp->seed = (uint64_t)n;
    *max_tokens = 0;
    if ((rc = jf_int(body, r->max_key, 1, 1 << 30, &n, e)) < 0) return -1;
    if (rc) *max_tokens = (int)n;
    /* OpenAI's chat API has the older name too; the smaller limit wins */
    if (!strcmp(r->max_key, "max_completion_tokens")) {
        if ((rc = jf_int(body, "max_tokens", 1, 1 << 30, &n, e)) < 0) return -1;
        if (rc && (*max_tokens == 0 || n < *max_tokens)) *max_tokens = (int)n;
    }
    return 0;
}
