/* llama-server's sampling fields on the OpenAI paths (docs/server.md):
 * logit_bias (OpenAI's object of token id -> bias, and llama-server's array
 * of [id or text, bias] pairs, with false to ban), typical_p, repeat_last_n,
 * DRY (dry_multiplier, dry_base, dry_allowed_length, dry_penalty_last_n,
 * dry_sequence_breakers) and samplers (the order of the chain). Read
 * strictly, as every honoured field: a wrong type or value is 400 naming it,
 * where llama-server skips a malformed entry and runs on. The definitions
 * are engine/sampler.h's; the storage they point at is the job's. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/alloc.h"
#include "server/srv_internal.h"

#define MAX_BIAS 4096 /* token biases in one request, texts counted by their tokens */

/* One bias value: a number, or false (a ban). */
static int bias_value(json_t *v, const char *where, float *out, srv_err *e) {
    if (json_is_false(v)) {
        *out = -INFINITY;
        return 0;
    }
    if (!json_is_number(v) || !isfinite(json_number_value(v)))
        return srv_fail(e, 400, "logit_bias", "invalid_type", "'logit_bias' %s: the bias must be a number or false",
                        where);
    *out = (float)json_number_value(v);
    return 0;
}

static int bias_add(srv_ctx *s, srv_job *j, int *cap, long long tok, float b, srv_err *e) {
    if (tok < 0 || tok >= tokenizer_n_vocab(s->tok))
        return srv_fail(e, 400, "logit_bias", "invalid_value",
                        "'logit_bias': token %lld is not in the vocabulary (0 to %d)", tok,
                        tokenizer_n_vocab(s->tok) - 1);
    if (j->req.sp.n_bias == MAX_BIAS)
        return srv_fail(e, 400, "logit_bias", "invalid_value", "'logit_bias' sets more than %d tokens", MAX_BIAS);
    if (j->req.sp.n_bias == *cap) {
        *cap = *cap ? *cap * 2 : 16;
        j->bias_ids = st_realloc(j->bias_ids, (size_t)*cap * sizeof(int32_t));
        j->bias_vals = st_realloc(j->bias_vals, (size_t)*cap * sizeof(float));
    }
    j->bias_ids[j->req.sp.n_bias] = (int32_t)tok;
    j->bias_vals[j->req.sp.n_bias++] = b;
    return 0;
}

/* A text's tokens (as llama-server: without special tokens) each get the bias. */
static int bias_text(srv_ctx *s, srv_job *j, int *cap, const char *text, float b, srv_err *e) {
    int n = 0;
    int32_t *ids = srv_tokenize(s, text, strlen(text), 0, 0, "logit_bias", &n, e);
    if (!ids) return -1;
    for (int i = 0; i < n; i++)
        if (bias_add(s, j, cap, ids[i], b, e) < 0) {
            st_free(ids);
            return -1;
        }
    st_free(ids);
    return 0;
}

/* A key of OpenAI's object: a token id in decimal, or (llama-server) a text. */
static int bias_key(srv_ctx *s, srv_job *j, int *cap, const char *k, float b, srv_err *e) {
    char *end;
    long long v = strtoll(k, &end, 10); /* out of range: LLONG_MIN/MAX, refused as not in the vocabulary */
    if (*k && !*end) return bias_add(s, j, cap, v, b, e);
    return bias_text(s, j, cap, k, b, e);
}

static int parse_bias(srv_ctx *s, json_t *body, srv_job *j, srv_err *e) {
    json_t *v = json_object_get(body, "logit_bias");
    int cap = 0;
    if (!v || json_is_null(v)) return 0;
    if (json_is_object(v)) {
        const char *k;
        json_t *x;
        json_object_foreach(v, k, x) {
            float b;
            char where[96];
            snprintf(where, sizeof where, "key '%.60s'", k);
            if (bias_value(x, where, &b, e) < 0 || bias_key(s, j, &cap, k, b, e) < 0) return -1;
        }
    } else if (json_is_array(v)) {
        size_t i;
        json_t *x;
        json_array_foreach(v, i, x) {
            char where[64];
            snprintf(where, sizeof where, "entry %zu", i);
            float b;
            if (!json_is_array(x) || json_array_size(x) != 2)
                return srv_fail(e, 400, "logit_bias", "invalid_type",
                                "'logit_bias' entry %zu must be a pair [token id or text, bias]", i);
            json_t *t = json_array_get(x, 0);
            if (bias_value(json_array_get(x, 1), where, &b, e) < 0) return -1;
            if (json_is_integer(t)) {
                if (bias_add(s, j, &cap, (long long)json_integer_value(t), b, e) < 0) return -1;
            } else if (json_is_string(t)) {
                if (bias_text(s, j, &cap, json_string_value(t), b, e) < 0) return -1;
            } else
                return srv_fail(e, 400, "logit_bias", "invalid_type",
                                "'logit_bias' entry %zu: the first element must be a token id or a text", i);
        }
    } else
        return srv_fail(e, 400, "logit_bias", "invalid_type",
                        "'logit_bias' must be an object (token id -> bias) or an array of [token, bias] pairs");
    j->req.sp.bias_ids = j->bias_ids;
    j->req.sp.bias_vals = j->bias_vals;
    return 0;
}

/* llama-server's one-letter spelling of a sampler (its command line's --sampling-seq), or NULL. */
static const char *name_of_letter(char c) {
    static const char LETTERS[] = "dkypsmtxiea";
    static const char *const NAMES[] = {"dry",         "top_k", "typ_p",  "top_p",     "top_n_sigma", "min_p",
                                        "temperature", "xtc",   "infill", "penalties", "adaptive_p"};
    const char *at = c ? strchr(LETTERS, c) : NULL;
    return at ? NAMES[at - LETTERS] : NULL;
}

/* samplers: an array of llama-server's names, or a string of their letters. */
static int parse_order(json_t *body, sampler_params *sp, srv_err *e) {
    json_t *v = json_object_get(body, "samplers");
    if (!v || json_is_null(v)) return 0;
    const int letters = json_is_string(v);
    if (!json_is_array(v) && !letters)
        return srv_fail(e, 400, "samplers", "invalid_type",
                        "'samplers' must be an array of sampler names or a string of their letters");
    size_t i, count = letters ? json_string_length(v) : json_array_size(v);
    char bad[256] = "";
    size_t nb = 0;
    int n = 0;
    for (i = 0; i < count; i++) {
        const char *name;
        char one[2] = {0};
        if (letters) {
            one[0] = json_string_value(v)[i];
            name = name_of_letter(one[0]);
            if (!name) name = one; /* unknown: named as itself below */
        } else {
            json_t *x = json_array_get(v, i);
            if (!json_is_string(x))
                return srv_fail(e, 400, "samplers", "invalid_type", "'samplers[%zu]' must be a string", i);
            name = json_string_value(x);
        }
        int k = name == one ? -1 : sampler_kind_from_name(name);
        if (k == -3)
            return srv_fail(e, 400, "samplers", "unsupported_parameter",
                            "'samplers': '%.40s' is not supported by this server", name);
        if (k == -1) { /* all the unknown names in one message */
            nb += (size_t)snprintf(bad + nb, sizeof bad - nb, "%s'%.40s'", nb ? ", " : "", name);
            if (nb >= sizeof bad) nb = sizeof bad - 1;
            continue;
        }
        if (k < 0) continue; /* xtc, top_n_sigma: no-ops at the only settings taken */
        if (n == SAMPLER_MAX_ORDER)
            return srv_fail(e, 400, "samplers", "invalid_value", "'samplers' names more than %d steps",
                            SAMPLER_MAX_ORDER);
        sp->order[n++] = (uint8_t)k;
    }
    if (nb)
        return srv_fail(e, 400, "samplers", "invalid_value",
                        "'samplers': unknown sampler name(s) %s; known: penalties, dry, top_k, typ_p, top_p, min_p, "
                        "temperature, xtc, top_n_sigma (letters: e, d, k, y, p, m, t, x, s)",
                        bad);
    if (n == 0) { /* llama-server would then run only the draw: here every step of the list is left out */
        sp->order[0] = SMP_N_KINDS; /* a step that does nothing: the order is this, not the default */
        n = 1;
    }
    sp->n_order = n;
    return 0;
}

static int parse_breakers(json_t *body, srv_job *j, srv_err *e) {
    json_t *v = json_object_get(body, "dry_sequence_breakers");
    if (!v || json_is_null(v)) {
        static const char *const DEF[] = {"\n", ":", "\"", "*"}; /* llama.cpp's defaults */
        for (int i = 0; i < 4; i++) j->dry_breakers[i] = st_strdup(DEF[i]);
        j->req.n_dry_breakers = 4;
    } else {
        if (!json_is_array(v))
            return srv_fail(e, 400, "dry_sequence_breakers", "invalid_type",
                            "'dry_sequence_breakers' must be an array of strings");
        if (json_array_size(v) > SRV_MAX_BREAKERS)
            return srv_fail(e, 400, "dry_sequence_breakers", "invalid_value",
                            "'dry_sequence_breakers' holds more than %d strings", SRV_MAX_BREAKERS);
        size_t i;
        json_t *x;
        json_array_foreach(v, i, x) {
            if (!json_is_string(x) || json_string_length(x) == 0 || json_string_length(x) > 40)
                return srv_fail(e, 400, "dry_sequence_breakers", "invalid_value",
                                "'dry_sequence_breakers[%zu]' must be a string of 1 to 40 bytes", i);
            j->dry_breakers[i] = st_strdup(json_string_value(x));
            j->req.n_dry_breakers = (int)i + 1;
        }
    }
    j->req.dry_breakers = (const char *const *)j->dry_breakers;
    return 0;
}

int srv_parse_llama_sampling(srv_ctx *s, json_t *body, srv_job *j, srv_err *e) {
    sampler_params *sp = &j->req.sp;
    const int n_ctx = s->n_ctx;
    double d;
    long long n;
    int rc;
    if ((rc = jf_number(body, "typical_p", 0, 1, &d, e)) < 0) return -1;
    if (rc) sp->typical_p = d <= 0 ? 1.0f : (float)d; /* llama-server: 1 and 0 both mean off */
    if ((rc = jf_int(body, "repeat_last_n", -1, 1 << 30, &n, e)) < 0) return -1;
    if (rc) sp->penalty_last_n = n < 0 ? n_ctx : (int)n;
    if ((rc = jf_number(body, "dry_multiplier", 0, 1e6, &d, e)) < 0) return -1;
    if (rc) sp->dry_multiplier = (float)d;
    if ((rc = jf_number(body, "dry_base", 1, 1e6, &d, e)) < 0) return -1;
    if (rc) sp->dry_base = (float)d;
    if ((rc = jf_int(body, "dry_allowed_length", 0, 1 << 20, &n, e)) < 0) return -1;
    if (rc) sp->dry_allowed_length = (int)n;
    sp->dry_penalty_last_n = n_ctx; /* llama-server's default: -1, the context */
    if ((rc = jf_int(body, "dry_penalty_last_n", -1, 1 << 30, &n, e)) < 0) return -1;
    if (rc) sp->dry_penalty_last_n = n < 0 ? n_ctx : (int)n;
    if (sp->dry_penalty_last_n > n_ctx) sp->dry_penalty_last_n = n_ctx;
    if (parse_order(body, sp, e) < 0 || parse_bias(s, body, j, e) < 0) return -1;
    if (sp->dry_multiplier == 0.0f) {
        sp->dry_penalty_last_n = 0;
        json_t *v = json_object_get(body, "dry_sequence_breakers");
        if (v && !json_is_null(v) && !json_is_array(v))
            return srv_fail(e, 400, "dry_sequence_breakers", "invalid_type",
                            "'dry_sequence_breakers' must be an array of strings");
        return 0;
    }
    return parse_breakers(body, j, e);
}
