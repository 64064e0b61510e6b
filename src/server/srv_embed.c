/* Embeddings: POST /v1/embeddings (OpenAI's shape) and /embedding,
 * /embeddings (llama-server's).
 *
 * An embedding is the model's final hidden state (after the output norm, the
 * vector the output matrix would turn into logits) of the input's tokens,
 * pooled. The engine process computes it like a prompt (engine_seq_embed,
 * in a slot, engine/srv_sched.c), so a crash there is the supervisor's as for any
 * request. Pooling is the model's own (`<arch>.pooling_type` in the GGUF:
 * mean, cls = the first token, last); a decoder model without one, which
 * llama-server serves only per token (its /v1/embeddings refuses pooling
 * `none`), is pooled by the mean over the input's tokens here. Pooled
 * vectors are normalized to unit length (llama-server's default,
 * `embd_normalize` 2; /embedding takes its other values).
 *
 * Every input is its own request, queued as generations are; at most
 * --slots of them wait at once, so a long list neither fills the queue nor
 * holds more than the slots' worth of work. Bounds, checked before anything
 * runs (a 400 naming the limit, never an out-of-memory): EMBED_MAX_INPUTS
 * inputs, each within the context, EMBED_MAX_TOKENS tokens in all, and
 * EMBED_MAX_FLOATS numbers in the answer. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/alloc.h"
#include "core/log.h"
#include "server/srv_internal.h"

#define EMBED_MAX_INPUTS 2048       /* OpenAI's own limit */
#define EMBED_MAX_TOKENS 300000     /* OpenAI's own limit per request */
#define EMBED_MAX_FLOATS (1u << 21) /* numbers in one answer: 8 MB of floats, ~25 MB of JSON text */

static const char *const OAI_KEYS[] = {"input", "model", "encoding_format", "dimensions", "user", NULL};
static const char *const LLAMA_KEYS[] = {"input",          "content", "model", "encoding_format",
                                         "embd_normalize", "pooling", NULL};

typedef struct {
    int n;           /* inputs */
    int32_t **ids;   /* (n) each input's tokens, st_malloc'd */
    int *n_ids;      /* (n) */
    long long total; /* tokens in all */
} inputs;

static void inputs_free(inputs *in) {
    for (int i = 0; i < in->n; i++) st_free(in->ids[i]);
    st_free(in->ids);
    st_free(in->n_ids);
}

/* One input: a string (tokenized with the model's BOS rules) or an array of token ids. */
static int read_one(srv_ctx *s, json_t *v, const char *param, int32_t **ids, int *n, srv_err *e) {
    if (json_is_string(v)) {
        if (!json_string_length(v)) return srv_fail(e, 400, param, "invalid_value", "'%s' is empty", param);
        *ids = srv_tokenize(s, json_string_value(v), json_string_length(v), 1, 1, param, n, e);
        return *ids ? 0 : -1;
    }
    if (!json_is_array(v) || !json_array_size(v))
        return srv_fail(e, 400, param, json_is_array(v) ? "invalid_value" : "invalid_type",
                        "'%s' must be a non-empty string or a non-empty array of token ids", param);
    size_t len = json_array_size(v), i;
    if (len >= (size_t)s->n_ctx)
        return srv_fail(e, 400, param, "context_length_exceeded",
                        "'%s' has %zu tokens; this model's context holds "
                        "%d (at most %d for one input)",
                        param, len, s->n_ctx, s->n_ctx - 1);
    int32_t *out = st_malloc(len * sizeof(int32_t));
    json_t *t;
    json_array_foreach(v, i, t) {
        json_int_t id = json_is_integer(t) ? json_integer_value(t) : -1;
        if (id < 0 || id >= tokenizer_n_vocab(s->tok)) {
            st_free(out);
            return srv_fail(e, 400, param, "invalid_value", "'%s[%zu]' is not a token id of this model", param, i);
        }
        out[i] = (int32_t)id;
    }
    *ids = out;
    *n = (int)len;
    return 0;
}

/* input: a string, an array of token ids, or an array of strings and token arrays. */
static int read_inputs(srv_ctx *s, json_t *input, const char *key, inputs *in, srv_err *e) {
    memset(in, 0, sizeof *in);
    if (!input) return srv_fail(e, 400, key, "missing_required_parameter", "Missing required parameter: '%s'", key);
    int many = json_is_array(input) && json_array_size(input) && !json_is_integer(json_array_get(input, 0));
    size_t n = many ? json_array_size(input) : 1;
    if (json_is_array(input) && !json_array_size(input))
        return srv_fail(e, 400, key, "invalid_value", "'%s' must not be empty", key);
    if (n > EMBED_MAX_INPUTS)
        return srv_fail(e, 400, key, "invalid_value", "'%s' has %zu inputs; at most %d per request", key, n,
                        EMBED_MAX_INPUTS);
    in->ids = st_calloc(n, sizeof *in->ids);
    in->n_ids = st_calloc(n, sizeof *in->n_ids);
    char param[64];
    for (size_t i = 0; i < n; i++) {
        if (many) snprintf(param, sizeof param, "%s[%zu]", key, i);
        else snprintf(param, sizeof param, "%s", key);
        if (read_one(s, many ? json_array_get(input, i) : input, param, &in->ids[i], &in->n_ids[i], e) < 0) {
            in->n = (int)i;
            inputs_free(in);
            return -1;
        }
        in->n = (int)i + 1;
        if (in->n_ids[i] >= s->n_ctx) {
            srv_fail(e, 400, param, "context_length_exceeded",
                     "'%s' has %d tokens; this model's context holds %d "
                     "(at most %d for one input)",
                     param, in->n_ids[i], s->n_ctx, s->n_ctx - 1);
            inputs_free(in);
            return -1;
        }
        in->total += in->n_ids[i];
        if (in->total > EMBED_MAX_TOKENS) {
            srv_fail(e, 400, key, "invalid_value",
                     "'%s' holds more than %d tokens in all: at most that many per "
                     "request",
                     key, EMBED_MAX_TOKENS);
            inputs_free(in);
            return -1;
        }
    }
    return 0;
}

/* llama-server's embd_normalize (common_embd_normalize): -1 none, 0 max absolute scaled to int16,
 * 1 taxicab, 2 euclidean, p > 2 the p-norm. */
static void normalize(float *v, size_t n, int how) {
    double sum = 0;
    if (how < 0) return;
    if (how == 0) {
        for (size_t i = 0; i < n; i++) sum = fabs(v[i]) > sum ? fabs(v[i]) : sum;
        sum /= 32760.0;
    } else if (how == 2) {
        for (size_t i = 0; i < n; i++) sum += (double)v[i] * v[i];
        sum = sqrt(sum);
    } else {
        for (size_t i = 0; i < n; i++) sum += pow(fabs(v[i]), how);
        sum = pow(sum, 1.0 / how);
    }
    const double k = sum > 0 ? 1.0 / sum : 0.0;
    for (size_t i = 0; i < n; i++) v[i] = (float)(v[i] * k);
}

static const char B64[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

/* The floats' bytes (little-endian float32, as OpenAI's base64 embeddings and numpy's frombuffer read
 * them) as base64 text. */
static void put_base64(sbuf *b, const float *v, size_t n) {
    const unsigned char *p = (const unsigned char *)v;
    size_t len = n * sizeof(float), i;
    char q[4];
    for (i = 0; i + 3 <= len; i += 3) {
        uint32_t x = (uint32_t)p[i] << 16 | (uint32_t)p[i + 1] << 8 | p[i + 2];
        q[0] = B64[x >> 18], q[1] = B64[(x >> 12) & 63], q[2] = B64[(x >> 6) & 63], q[3] = B64[x & 63];
        sbuf_put(b, q, 4);
    }
    if (i < len) {
        uint32_t x = (uint32_t)p[i] << 16 | (i + 1 < len ? (uint32_t)p[i + 1] << 8 : 0);
        q[0] = B64[x >> 18], q[1] = B64[(x >> 12) & 63];
        q[2] = i + 1 < len ? B64[(x >> 6) & 63] : '=';
        q[3] = '=';
        sbuf_put(b, q, 4);
    }
}

/* A JSON array of the floats: written by hand, since a jansson value per number costs ~40 bytes. A value
 * that is not finite (no finite model writes one) becomes 0: JSON has no NaN. */
static void put_floats(sbuf *b, const float *v, size_t n) {
    sbuf_puts(b, "[");
    for (size_t i = 0; i < n; i++) sbuf_printf(b, "%s%.9g", i ? "," : "", isfinite(v[i]) ? (double)v[i] : 0.0);
    sbuf_puts(b, "]");
}

/* Run every input (at most --slots queued at once); out[i] gets job i (done), or an error is set. */
static int run_inputs(srv_ctx *s, struct MHD_Connection *c, const inputs *in, int pool, srv_job **jobs, srv_err *e) {
    int sent = 0, rc = 0;
    for (int i = 0; i < in->n && rc == 0; i++) {
        while (sent < in->n && sent - i < s->p.n_slots) {
            srv_job *j = jobs[sent] = job_new(s, JOB_EMBED, c);
            job_set_prompt(j, in->ids[sent], in->n_ids[sent], NULL, 0);
            in->ids[sent] = NULL; /* the job's now */
            j->req.embed = 1 + pool;
            j->req.max_tokens = 1;
            j->req.sp = sampler_defaults();
            if (job_submit(j) != 0) {
                rc = srv_fail(e, 503, NULL, "overloaded",
                              "all %d slots are busy and %d requests are queued; "
                              "retry later",
                              s->p.n_slots, s->p.max_queue);
                break;
            }
            sent++;
        }
        if (rc) break;
        srv_job *j = jobs[i];
        if (job_wait(j) != 0) {
            rc = atomic_load(&s->stopping) ? srv_fail(e, 503, NULL, "shutting_down", "the server is shutting down")
                                           : -2; /* the client left */
            break;
        }
        if (j->failed) {
            if (j->failed == 2) rc = srv_fail(e, 503, NULL, "engine_stopped", "%s", j->err);
            else rc = srv_fail(e, 500, NULL, "engine_error", "%s", j->err);
        } else if (!j->embd)
            rc = srv_fail(e, 500, NULL, "engine_error", "the engine sent no embedding for input %d", i);
    }
    for (int i = 0; i < in->n; i++) /* a job still queued or running stops at once (its reference is the scheduler's) */
        if (jobs[i]) {
            pthread_mutex_lock(&jobs[i]->mu);
            if (!jobs[i]->done) jobs[i]->cancelled = 1;
            pthread_mutex_unlock(&jobs[i]->mu);
        }
    return rc;
}

/* The pooling this model and request ask for (engine_pool), or -1 with a 400. */
static int model_pool(srv_ctx *s, const char *want, srv_err *e) {
    if (want) {
        if (!strcmp(want, "none")) return ENGINE_POOL_NONE;
        if (!strcmp(want, "mean")) return ENGINE_POOL_MEAN;
        if (!strcmp(want, "cls") || !strcmp(want, "first")) return ENGINE_POOL_FIRST;
        if (!strcmp(want, "last")) return ENGINE_POOL_LAST;
        return srv_fail(e, 400, "pooling", "invalid_value", "'pooling' must be none, mean, cls, first or last");
    }
    switch (s->pooling) {
    case 2: return ENGINE_POOL_FIRST;
    case 3: return ENGINE_POOL_LAST;
    case 4:
        return srv_fail(e, 400, NULL, "unsupported_model",
                        "this model is a reranker (pooling_type rank in its GGUF): "
                        "it gives scores, not embeddings");
    default: return ENGINE_POOL_MEAN; /* the model's mean, or a decoder without a pooling type: see above */
    }
}

/* Both endpoints: read, bound, run; the answer in the API's shape. */
static enum MHD_Result embeddings(srv_ctx *s, struct MHD_Connection *c, json_t *body, int oai) {
    srv_err e;
    const char *fmt = "float", *model = NULL, *user = NULL, *pooling = NULL;
    long long dims = 0, norm = 2;
    json_t *input = json_object_get(body, "input");
    const char *key = "input";
    if (!oai && !input && json_object_get(body, "content")) input = json_object_get(body, "content"), key = "content";
    inputs in = {0};
    int pool = 0, rc;
    if (jf_known_keys(body, oai ? OAI_KEYS : LLAMA_KEYS, &e) < 0 || jf_string(body, "encoding_format", &fmt, &e) < 0 ||
        jf_string(body, "model", &model, &e) < 0 || jf_string(body, "user", &user, &e) < 0 ||
        (!oai && jf_string(body, "pooling", &pooling, &e) < 0) ||
        (rc = jf_int(body, "embd_normalize", -1, 64, &norm, &e)) < 0 ||
        jf_int(body, "dimensions", 1, 1 << 20, &dims, &e) < 0)
        return srv_send_error(s, c, API_OPENAI, &e);
    if (strcmp(fmt, "float") && strcmp(fmt, "base64")) {
        srv_fail(&e, 400, "encoding_format", "invalid_value", "'encoding_format' must be float or base64");
        return srv_send_error(s, c, API_OPENAI, &e);
    }
    const int d = s->n_embd;
    if (dims && dims != d) { /* OpenAI's shortened embeddings are for models trained for them */
        srv_fail(&e, 400, "dimensions", "unsupported_parameter", "'dimensions' can only be %d, this model's width", d);
        return srv_send_error(s, c, API_OPENAI, &e);
    }
    if ((pool = model_pool(s, pooling, &e)) < 0)
        return srv_send_error(s, c, API_OPENAI, &e); /* never NONE on OpenAI's */
    if (read_inputs(s, input, key, &in, &e) < 0) return srv_send_error(s, c, API_OPENAI, &e);
    unsigned long long floats =
        pool == ENGINE_POOL_NONE ? (unsigned long long)in.total * d : (unsigned long long)in.n * d;
    if (floats > EMBED_MAX_FLOATS) {
        srv_fail(&e, 400, key, "invalid_value",
                 "the answer would hold %llu numbers (%d inputs%s of %d): at most %u "
                 "per request",
                 floats, in.n, pool == ENGINE_POOL_NONE ? "' tokens" : "", d, EMBED_MAX_FLOATS);
        inputs_free(&in);
        return srv_send_error(s, c, API_OPENAI, &e);
    }
    srv_job **jobs = st_calloc((size_t)in.n, sizeof *jobs);
    rc = run_inputs(s, c, &in, pool, jobs, &e);
    enum MHD_Result r;
    if (rc == -2) r = MHD_NO; /* the client left: nobody reads an answer */
    else if (rc < 0) r = srv_send_error(s, c, API_OPENAI, &e);
    else {
        sbuf b = {0};
        if (oai) {
            json_t *name = json_string(model ? model : s->model_name);
            char *nm = json_dumps(name, JSON_ENCODE_ANY);
            json_decref(name);
            sbuf_printf(&b,
                        "{\"object\":\"list\",\"model\":%s,\"usage\":{\"prompt_tokens\":%lld,\"total_tokens\":%lld},"
                        "\"data\":[",
                        nm, in.total, in.total);
            free(nm);
        } else sbuf_puts(&b, "[");
        for (int i = 0; i < in.n; i++) {
            srv_job *j = jobs[i];
            size_t rows = pool == ENGINE_POOL_NONE ? j->n_embd / d : 1;
            if (pool != ENGINE_POOL_NONE) normalize(j->embd, (size_t)d, oai ? 2 : (int)norm);
            if (oai) {
                sbuf_printf(&b, "%s{\"object\":\"embedding\",\"index\":%d,\"embedding\":", i ? "," : "", i);
                if (!strcmp(fmt, "base64")) {
                    sbuf_puts(&b, "\"");
                    put_base64(&b, j->embd, (size_t)d);
                    sbuf_puts(&b, "\"");
                } else put_floats(&b, j->embd, (size_t)d);
                sbuf_puts(&b, "}");
            } else { /* llama-server's: one row when pooled, one per token when not */
                sbuf_printf(&b, "%s{\"index\":%d,\"embedding\":[", i ? "," : "", i);
                for (size_t k = 0; k < rows; k++) {
                    if (k) sbuf_puts(&b, ",");
                    put_floats(&b, j->embd + k * d, (size_t)d);
                }
                sbuf_puts(&b, "]}");
            }
        }
        sbuf_puts(&b, oai ? "]}" : "]");
        char *txt = malloc(b.len + 1); /* MHD frees the buffer with free(): a malloc'd copy */
        ST_ASSERT(txt);
        memcpy(txt, b.s, b.len + 1);
        r = srv_send_text(s, c, 200, "application/json", txt, b.len);
        sbuf_free(&b);
    }
    for (int i = 0; i < in.n; i++)
        if (jobs[i]) job_release(jobs[i]);
    st_free(jobs);
    inputs_free(&in);
    return r;
}

enum MHD_Result srv_embeddings_oai(srv_ctx *s, struct MHD_Connection *c, json_t *body) {
    return embeddings(s, c, body, 1);
}

enum MHD_Result srv_embeddings_llama(srv_ctx *s, struct MHD_Connection *c, json_t *body) {
    return embeddings(s, c, body, 0);
}
