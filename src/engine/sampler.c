/* Sampler (see sampler.h). The default order is llama.cpp's usual one with
 * the temperature before the cuts (OpenAI's reading of top_p): logit bias,
 * penalties, DRY, then top-k, typical, temperature-scaled softmax, top-p and
 * min-p cuts, then a draw. A request may name another order (llama-server's
 * `samplers`). Candidates are sorted only when a cut needs the order, and
 * probabilities are computed once per temperature: a cut keeps them as they
 * are (the draw scales by the mass left), as the one-pass sampler did, so a
 * seed gives the same tokens as before for the default order. */
#include "engine/sampler.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/alloc.h"

typedef struct {
    float v;
    int32_t id;
} cand;

struct sampler {
    sampler_params p;
    int n_vocab;
    uint64_t rng;
    int32_t *recent; /* ring of the last penalty_last_n tokens */
    int n_recent, head;
    int32_t *dry_ring; /* ring of the last dry_penalty_last_n tokens (DRY on) */
    int dry_n, dry_head, dry_cap;
    int32_t *dry_rev, *dry_z; /* (dry_cap) the window from its end, its Z-array */
    int32_t *dry_len;         /* (n_vocab) the repeat a token would extend, -1: none */
    int32_t *dry_hit;         /* (dry_cap) tokens with dry_len set */
    int n_dry_hit;
    uint8_t *breaker; /* (n_vocab) copy of dry_breaker, or NULL */
    float *bias;      /* (n_vocab) summed logit bias, or NULL */
    int32_t *idx;     /* candidate ids scratch (n_vocab) */
    float *prob;      /* candidate probabilities scratch */
    float *val;       /* candidate logits scratch */
    cand *tmp;        /* (n_vocab) sort scratch */
    uint16_t *count;  /* per-token count within the window (n_vocab) */
    uint8_t order[SAMPLER_MAX_ORDER];
    int n_order;
    int mods_first; /* penalties and DRY come before every cut: they run on the whole vocabulary first */
    /* the chain's state over the candidates idx/val[0..nc) */
    int nc, sorted, have_p, cut_since_p;
    float t;
};

static const uint8_t DEFAULT_ORDER[] = {SMP_PENALTIES, SMP_DRY, SMP_TOP_K, SMP_TYPICAL, SMP_TEMP, SMP_TOP_P, SMP_MIN_P};

int sampler_kind_from_name(const char *name) {
    static const struct {
        const char *name; /* without '_' and '-' */
        int kind;
    } NAMES[] = {{"penalties", SMP_PENALTIES},
                 {"dry", SMP_DRY},
                 {"topk", SMP_TOP_K},
                 {"typp", SMP_TYPICAL},
                 {"typ", SMP_TYPICAL},
                 {"topp", SMP_TOP_P},
                 {"nucleus", SMP_TOP_P},
                 {"minp", SMP_MIN_P},
                 {"temperature", SMP_TEMP},
                 {"temp", SMP_TEMP},
                 {"xtc", -2},
                 {"topnsigma", -2},
                 {"infill", -3},
                 {"adaptivep", -3}};
    char k[32];
    size_t n = 0;
    for (const char *c = name; *c; c++) {
        if (*c == '_' || *c == '-') continue;
        if (n + 1 >= sizeof k) return -1;
        k[n++] = *c;
    }
    k[n] = 0;
    /* llama.cpp's aliases are the name, its kebab-case and its run-together spelling: not "top-_k" */
    if (strchr(name, '_') && strchr(name, '-')) return -1;
    for (size_t i = 0; i < sizeof NAMES / sizeof NAMES[0]; i++)
        if (!strcmp(k, NAMES[i].name)) return NAMES[i].kind;
    return -1;
}

sampler_params sampler_defaults(void) {
    sampler_params p = {0};
    p.temp = 0.8f;
    p.top_k = 40;
    p.top_p = 0.95f;
    p.min_p = 0.05f;
    p.repeat_penalty = 1.0f;
    p.penalty_last_n = 64;
    p.typical_p = 1.0f;
    p.dry_base = 1.75f; /* llama.cpp's defaults; the multiplier 0 keeps DRY off */
    p.dry_allowed_length = 2;
    p.seed = 0x5eed;
    return p;
}

/* splitmix64: small, seedable, good enough for sampling */
static uint64_t next_u64(uint64_t *s) {
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static double next_unit(uint64_t *s) { return (double)(next_u64(s) >> 11) * (1.0 / 9007199254740992.0); }

static int dry_on(const sampler_params *p) {
    return p->dry_multiplier != 0.0f && p->dry_base >= 1.0f && p->dry_penalty_last_n > 0;
}
static int pen_on(const sampler_params *p) {
    return p->penalty_last_n > 0 &&
           (p->repeat_penalty != 1.0f || p->presence_penalty != 0.0f || p->frequency_penalty != 0.0f);
}
/* A step that removes candidates (with its setting, it does something). */
static int is_cut(const sampler *s, int kind) {
    const sampler_params *p = &s->p;
    switch (kind) {
    case SMP_TOP_K: return p->top_k > 0 && p->top_k < s->n_vocab;
    case SMP_TYPICAL: return p->typical_p > 0.0f && p->typical_p < 1.0f;
    case SMP_TOP_P: return p->top_p < 1.0f;
    case SMP_MIN_P: return p->min_p > 0.0f;
    default: return 0;
    }
}
static int first_cut(const sampler *s) {
    for (int i = 0; i < s->n_order; i++)
        if (is_cut(s, s->order[i])) return s->order[i];
    return -1;
}

sampler *sampler_create(const sampler_params *p, int n_vocab) {
    sampler *s = st_calloc(1, sizeof *s);
    s->p = *p;
    if (s->p.penalty_last_n < 0) s->p.penalty_last_n = 0;
    if (s->p.penalty_last_n > UINT16_MAX) s->p.penalty_last_n = UINT16_MAX; /* counts are 16-bit */
    s->n_vocab = n_vocab;
    s->rng = p->seed;
    s->recent = st_calloc((size_t)(s->p.penalty_last_n + 1), sizeof(int32_t));
    s->idx = st_malloc((size_t)n_vocab * sizeof(int32_t));
    s->prob = st_malloc((size_t)n_vocab * sizeof(float));
    s->val = st_malloc((size_t)n_vocab * sizeof(float));
    s->tmp = st_malloc((size_t)n_vocab * (sizeof(cand) + 1)); /* typical: scores, positions, marks */
    s->count = st_calloc((size_t)n_vocab, sizeof(uint16_t));
    if (dry_on(&s->p)) {
        s->dry_cap = s->p.dry_penalty_last_n;
        s->dry_ring = st_malloc((size_t)s->dry_cap * sizeof(int32_t));
        s->dry_rev = st_malloc((size_t)s->dry_cap * sizeof(int32_t));
        s->dry_z = st_malloc((size_t)s->dry_cap * sizeof(int32_t));
        s->dry_hit = st_malloc((size_t)s->dry_cap * sizeof(int32_t));
        s->dry_len = st_malloc((size_t)n_vocab * sizeof(int32_t));
        for (int i = 0; i < n_vocab; i++) s->dry_len[i] = -1;
        if (p->dry_breaker) {
            s->breaker = st_malloc((size_t)n_vocab);
            memcpy(s->breaker, p->dry_breaker, (size_t)n_vocab);
        }
    }
    s->p.dry_breaker = NULL;
    if (p->n_bias > 0) {
        s->bias = st_calloc((size_t)n_vocab, sizeof(float));
        for (int i = 0; i < p->n_bias; i++)
            if (p->bias_ids[i] >= 0 && p->bias_ids[i] < n_vocab) s->bias[p->bias_ids[i]] += p->bias_vals[i];
    }
    s->p.bias_ids = NULL;
    s->p.bias_vals = NULL;
    if (p->n_order > 0) {
        s->n_order = p->n_order < SAMPLER_MAX_ORDER ? p->n_order : SAMPLER_MAX_ORDER;
        memcpy(s->order, p->order, (size_t)s->n_order);
    } else {
        s->n_order = (int)sizeof DEFAULT_ORDER;
        memcpy(s->order, DEFAULT_ORDER, sizeof DEFAULT_ORDER);
    }
    s->mods_first = 1;
    int cut_seen = 0;
    for (int i = 0; i < s->n_order; i++) {
        int k = s->order[i];
        if (k == SMP_TOP_K || k == SMP_TYPICAL || k == SMP_TOP_P || k == SMP_MIN_P) cut_seen = 1;
        else if ((k == SMP_PENALTIES || k == SMP_DRY) && cut_seen) s->mods_first = 0;
    }
    return s;
}

void sampler_free(sampler *s) {
    if (!s) return;
    st_free(s->recent);
    st_free(s->dry_ring);
    st_free(s->dry_rev);
    st_free(s->dry_z);
    st_free(s->dry_hit);
    st_free(s->dry_len);
    st_free(s->breaker);
    st_free(s->bias);
    st_free(s->idx);
    st_free(s->prob);
    st_free(s->val);
    st_free(s->tmp);
    st_free(s->count);
    st_free(s);
}

void sampler_reset(sampler *s) {
    s->n_recent = s->head = 0;
    s->dry_n = s->dry_head = 0;
    memset(s->count, 0, (size_t)s->n_vocab * sizeof(uint16_t));
    s->rng = s->p.seed;
}

void sampler_accept(sampler *s, int32_t token) {
    if (token < 0 || token >= s->n_vocab) return;
    if (s->dry_cap) {
        s->dry_ring[s->dry_head] = token;
        s->dry_head = (s->dry_head + 1) % s->dry_cap;
        if (s->dry_n < s->dry_cap) s->dry_n++;
    }
    int n = s->p.penalty_last_n;
    if (n == 0) return;
    if (s->n_recent == n) s->count[s->recent[s->head]]--; /* the oldest leaves the window */
    else s->n_recent++;
    s->recent[s->head] = token;
    s->head = (s->head + 1) % n;
    if (s->count[token] < UINT16_MAX) s->count[token]++;
}

/* The penalties of one token seen c > 0 times in the window. */
static float penalised(const sampler_params *p, float l, int c) {
    if (p->repeat_penalty != 1.0f) l = l > 0 ? l / p->repeat_penalty : l * p->repeat_penalty;
    return l - ((float)c * p->frequency_penalty + p->presence_penalty);
}

static void apply_penalties(sampler *s, float *logits) {
    const sampler_params *p = &s->p;
    if (!pen_on(p)) return;
    /* each distinct token once: its count is zeroed once used (a token seen
     * twice in the window is then skipped), and recounted from the ring below */
    for (int i = 0; i < s->n_recent; i++) {
        int32_t t = s->recent[i];
        int c = s->count[t];
        if (c == 0) continue;
        logits[t] = penalised(p, logits[t], c);
        s->count[t] = 0;
    }
    for (int i = 0; i < s->n_recent; i++) {
        int32_t t = s->recent[i];
        if (s->count[t] < UINT16_MAX) s->count[t]++;
    }
}

/* DRY's repeat lengths (sampler.h) into dry_len for the tokens in dry_hit.
 * The window read from its end, rev[0] the last token; Z[k] is the longest
 * common prefix of rev and rev[k..]: the token ending k places back ends a
 * copy of the context's last Z[k] tokens, so the token after it (rev[k-1])
 * would extend that copy. O(window). */
static void dry_lengths(sampler *s) {
    const sampler_params *p = &s->p;
    for (int i = 0; i < s->n_dry_hit; i++) s->dry_len[s->dry_hit[i]] = -1;
    s->n_dry_hit = 0;
    const int n = s->dry_n;
    if (n <= p->dry_allowed_length) return;
    int32_t *r = s->dry_rev, *z = s->dry_z;
    for (int i = 0; i < n; i++) r[i] = s->dry_ring[((s->dry_head - 1 - i) % s->dry_cap + s->dry_cap) % s->dry_cap];
    int limit = n; /* a repeat does not reach back past the last breaker */
    if (s->breaker)
        for (int i = 0; i < n; i++)
            if (s->breaker[r[i]]) {
                limit = i;
                break;
            }
    if (limit < p->dry_allowed_length) return;
    z[0] = n;
    for (int k = 1, l = 0, rt = 0; k < n; k++) { /* [l, rt): the rightmost match window found so far */
        int m = 0;
        if (k < rt) m = z[k - l] < rt - k ? z[k - l] : rt - k;
        while (k + m < n && r[m] == r[k + m]) m++;
        z[k] = m;
        if (k + m > rt) {
            l = k;
            rt = k + m;
        }
    }
    for (int k = 1; k < n; k++) {
        int len = z[k] < limit ? z[k] : limit;
        if (len < p->dry_allowed_length) continue;
        int32_t t = r[k - 1];
        if (s->dry_len[t] < 0) s->dry_hit[s->n_dry_hit++] = t;
        if (len > s->dry_len[t]) s->dry_len[t] = len;
    }
}

static float dry_penalty(const sampler *s, int len) {
    const sampler_params *p = &s->p;
    int e = len - p->dry_allowed_length;
    if (p->dry_base > 1.000001f) { /* the power stays a finite float */
        int emax = (int)(88.7228391f / logf(p->dry_base));
        if (e > emax) e = emax;
    }
    return (float)((double)p->dry_multiplier * pow((double)p->dry_base, (double)e));
}

static void apply_dry(sampler *s, float *logits) {
    if (!s->dry_cap) return;
    dry_lengths(s);
    for (int i = 0; i < s->n_dry_hit; i++) {
        int32_t t = s->dry_hit[i];
        if (!s->breaker || !s->breaker[t]) logits[t] -= dry_penalty(s, s->dry_len[t]);
    }
}

void sampler_add_bias(const sampler *s, float *logits) {
    if (s->bias)
        for (int i = 0; i < s->n_vocab; i++)
            if (s->bias[i] != 0.0f) logits[i] += s->bias[i];
}

/* Logit bias, then the penalties and DRY in their order, on the whole
 * vocabulary: when they come before every cut, or for a greedy draw (all),
 * whose argmax they change wherever they stand. */
static void prelude(sampler *s, float *logits, int all) {
    if (s->bias)
        for (int i = 0; i < s->n_vocab; i++)
            if (s->bias[i] != 0.0f) logits[i] += s->bias[i];
    if (!all && !s->mods_first) return;
    int pen = 0, dry = 0;
    for (int i = 0; i < s->n_order; i++) {
        if (s->order[i] == SMP_PENALTIES && !pen) {
            apply_penalties(s, logits);
            pen = 1;
        } else if (s->order[i] == SMP_DRY && !dry) {
            apply_dry(s, logits);
            dry = 1;
        }
    }
}

/* The first largest logit; NaNs are passed over (0 when every one is NaN). */
static int32_t argmax(const float *x, int n) {
    int32_t b = 0;
    while (b < n - 1 && x[b] != x[b]) b++;
    float m = x[b]; /* in a register: reading x[b] again each step waited on the last step's choice */
    for (int i = b + 1; i < n; i++)
        if (x[i] > m) m = x[i], b = i;
    return b;
}

/* The candidate order: larger logit first, equal logits by the lower id. */
static int before(const float *l, int32_t a, int32_t b) { return l[a] > l[b] || (l[a] == l[b] && a < b); }

static _Thread_local const float *t_sort_logits; /* qsort has no context argument */
static int by_logit_desc(const void *a, const void *b) {
    const int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    return before(t_sort_logits, x, y) ? -1 : before(t_sort_logits, y, x) ? 1 : 0;
}

static int cand_desc(const void *a, const void *b) {
    const cand *x = a, *y = b;
    if (x->v != y->v) return x->v > y->v ? -1 : 1;
    return x->id < y->id ? -1 : x->id > y->id;
}

/* The k first of positions 0..n-1 in an order (before(ctx, a, b): a comes
 * first; positions whose value in nan_of is NaN left out, when given) into
 * out, unsorted: a heap whose root is the last of them, O(n log k). Inline,
 * so that each caller's order is compiled in. Returns how many. */
static inline __attribute__((always_inline)) int heap_first(int n, int k, int32_t *out,
                                                            int (*before_fn)(const void *, int32_t, int32_t),
                                                            const void *ctx, const float *nan_of) {
    int h = 0;
    if (k > n) k = n;
    for (int i = 0; i < n; i++) {
        if (nan_of && nan_of[i] != nan_of[i]) continue; /* NaN: never a candidate */
        if (h == k && !before_fn(ctx, i, out[0])) continue;
        int j;
        if (h < k) { /* sift up */
            j = h++;
            while (j > 0 && before_fn(ctx, out[(j - 1) / 2], i)) {
                out[j] = out[(j - 1) / 2];
                j = (j - 1) / 2;
            }
        } else { /* replace the root, sift down */
            j = 0;
            for (;;) {
                int c = 2 * j + 1;
                if (c >= h) break;
                if (c + 1 < h && before_fn(ctx, out[c], out[c + 1])) c++;
                if (!before_fn(ctx, i, out[c])) break;
                out[j] = out[c];
                j = c;
            }
        }
        out[j] = i;
    }
    return h;
}

static int logit_before(const void *l, int32_t a, int32_t b) { return before(l, a, b); }

/* The k largest logits' ids (heap_first), then a sort of those k. */
int sampler_top_k(const float *l, int n, int k, int32_t *idx) {
    const int h = heap_first(n, k, idx, logit_before, l, l);
    t_sort_logits = l;
    qsort(idx, (size_t)h, sizeof(int32_t), by_logit_desc);
    return h;
}

int sampler_candidates(const sampler *s, int max_k) {
    const sampler_params *p = &s->p;
    if (pen_on(p) || dry_on(p) || s->bias) return 0;
    if (p->temp <= 0.0f) return 1;
    if (first_cut(s) != SMP_TOP_K) return 0;
    return p->top_k <= max_k ? p->top_k : 0;
}

/* ---- the chain over the candidates idx/val[0..nc) ---- */

static void sort_cands(sampler *s) {
    if (s->sorted) return;
    for (int i = 0; i < s->nc; i++) s->tmp[i] = (cand){s->val[i], s->idx[i]};
    qsort(s->tmp, (size_t)s->nc, sizeof(cand), cand_desc);
    for (int i = 0; i < s->nc; i++) {
        s->val[i] = s->tmp[i].v;
        s->idx[i] = s->tmp[i].id;
    }
    s->sorted = 1;
    s->have_p = 0;
}

/* ---- the softmax over many candidates, four lanes at a time ----
 * The server's default draws from the whole vocabulary (OpenAI's top_k 0,
 * top_p 1): 152k candidates for Qwen3, whose softmax with libm's expf and a
 * double sum took 1.2 ms a token on the CPU, more than a GPU's decode step.
 * GCC's vector types (SSE on any x86-64, NEON on arm64) and lane sums that
 * need no reassociation of one chain keep it a few passes at memory speed. */
typedef float v4f __attribute__((vector_size(16)));
typedef int32_t v4i __attribute__((vector_size(16)));

static inline __attribute__((always_inline)) v4f load4(const float *p) {
    v4f v;
    memcpy(&v, p, sizeof v);
    return v;
}

/* e^x for x <= 0 (a candidate's logit less the largest, scaled): Cody-Waite
 * reduction by ln 2 and Cephes' degree-6 polynomial, relative error ~2e-7;
 * below -87.3 (e^x < 1.2e-38) clamped there. */
static inline __attribute__((always_inline)) v4f exp4(v4f x) {
    const v4f lo = {-87.3f, -87.3f, -87.3f, -87.3f};
    const v4i below = (v4i)(x < lo);
    x = (v4f)(((v4i)x & ~below) | ((v4i)lo & below));
    const float magic = 12582912.0f; /* 1.5 x 2^23: adding it rounds to an integer in the low bits */
    const v4f t = x * 1.44269504f + magic, n = t - magic;
    const v4i ni = (v4i)t - (v4i)(v4f){magic, magic, magic, magic};
    const v4f r = x - n * 0.693359375f - n * -2.12194440e-4f;
    v4f p = r * 1.9875691500e-4f + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    p = p * r * r + r + 1.0f;
    return p * (v4f)((ni + 127) << 23);
}

static inline __attribute__((always_inline)) float hmax4(v4f v) {
    float m = v[0];
    for (int j = 1; j < 4; j++) m = v[j] > m ? v[j] : m;
    return m;
}

static inline __attribute__((always_inline)) double hsum4(v4f v) {
    double t = 0;
    for (int j = 0; j < 4; j++) t += v[j];
    return t;
}

static inline __attribute__((always_inline)) v4f max4(v4f a, v4f b) {
    const v4i gt = (v4i)(b > a);
    return (v4f)(((v4i)b & gt) | ((v4i)a & ~gt));
}

/* The largest of v[0..n); *nan: whether one is NaN (none among the chain's
 * candidates: sample_rest leaves them out). Four accumulators: one would
 * wait for its own compare and blend. */
static float max_of(const float *v, int n, int *nan) {
    int i = 0;
    float m = v[0];
    v4i bad = {0};
    if (n >= 16) {
        v4f a = load4(v), b = load4(v + 4), c = load4(v + 8), d = load4(v + 12);
        bad = (v4i)(a != a) | (v4i)(b != b) | (v4i)(c != c) | (v4i)(d != d);
        for (i = 16; i + 16 <= n; i += 16) {
            const v4f e = load4(v + i), f = load4(v + i + 4), g = load4(v + i + 8), h = load4(v + i + 12);
            bad |= (v4i)(e != e) | (v4i)(f != f) | (v4i)(g != g) | (v4i)(h != h);
            a = max4(a, e), b = max4(b, f), c = max4(c, g), d = max4(d, h);
        }
        m = hmax4(max4(max4(a, b), max4(c, d)));
    }
    int any = bad[0] | bad[1] | bad[2] | bad[3];
    for (; i < n; i++) {
        any |= v[i] != v[i];
        m = v[i] > m ? v[i] : m;
    }
    *nan = any != 0;
    return m;
}

/* Lane sums, each over every fourth value (two accumulators), then added:
 * not the one chain's rounding, which nothing depends on (a draw scales by
 * the mass it finds). */
static double sum_of(const float *p, int n) {
    v4f a = {0}, b = {0};
    int i = 0;
    for (; i + 8 <= n; i += 8) a += load4(p + i), b += load4(p + i + 4);
    double t = hsum4(a + b);
    for (; i < n; i++) t += p[i];
    return t;
}

/* p[i] = e^((v[i] - maxl) inv_t); returns their sum. */
static double exp_of(const float *v, float *p, int n, float maxl, float inv_t) {
    v4f a = {0}, b = {0};
    int i = 0;
    for (; i + 8 <= n; i += 8) {
        const v4f e = exp4((load4(v + i) - maxl) * inv_t), f = exp4((load4(v + i + 4) - maxl) * inv_t);
        memcpy(p + i, &e, sizeof e);
        memcpy(p + i + 4, &f, sizeof f);
        a += e, b += f;
    }
    double t = hsum4(a + b);
    for (; i < n; i += 4) { /* the tail through the same arithmetic */
        float in[4] = {0};
        const int m = n - i < 4 ? n - i : 4;
        memcpy(in, v + i, (size_t)m * sizeof(float));
        const v4f e = exp4((load4(in) - maxl) * inv_t);
        for (int j = 0; j < m; j++) p[i + j] = e[j], t += e[j];
    }
    return t;
}

/* The first i whose running sum of p[0..i] passes r (n - 1 if none does):
 * whole blocks of 64 skipped by their sums, then one value at a time. */
static int walk_to(const float *p, int n, double r) {
    double cum = 0;
    int i = 0;
    for (; i + 64 <= n; i += 64) {
        const double b = sum_of(p + i, 64);
        if (cum + b > r) break;
        cum += b;
    }
    for (; i < n; i++) {
        cum += p[i];
        if (r < cum) return i;
    }
    return n - 1;
}

static void scale_by(float *p, int n, float f) {
    int i = 0;
    for (; i + 4 <= n; i += 4) {
        const v4f v = load4(p + i) * f;
        memcpy(p + i, &v, sizeof v);
    }
    for (; i < n; i++) p[i] *= f;
}

/* The softmax at the temperature in force; normalised again when a cut
 * since left a part of the mass and the step needs a distribution. */
static void need_p(sampler *s, int normalised) {
    if (!s->have_p) {
        int nan;
        const double sum = exp_of(s->val, s->prob, s->nc, max_of(s->val, s->nc, &nan), 1.0f / s->t);
        scale_by(s->prob, s->nc, (float)(1.0 / sum));
        s->have_p = 1;
        s->cut_since_p = 0;
    } else if (normalised && s->cut_since_p) {
        scale_by(s->prob, s->nc, (float)(1.0 / sum_of(s->prob, s->nc)));
        s->cut_since_p = 0;
    }
}

static void keep_first(sampler *s, int n) {
    if (n < s->nc) {
        s->nc = n;
        s->cut_since_p = 1;
    }
}

static _Thread_local const float *t_shift; /* typical's scores, for qsort */
static int by_shift(const void *a, const void *b) {
    const int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    if (t_shift[x] != t_shift[y]) return t_shift[x] < t_shift[y] ? -1 : 1;
    return x < y ? -1 : x > y;
}

static void step_typical(sampler *s) {
    need_p(s, 1);
    double h = 0;
    for (int i = 0; i < s->nc; i++)
        if (s->prob[i] > 0) h -= (double)s->prob[i] * log((double)s->prob[i]);
    /* tmp as scratch: shift scores in .v, positions to sort in a second half */
    float *shift = (float *)s->tmp;
    int32_t *pos = (int32_t *)s->tmp + s->nc;
    for (int i = 0; i < s->nc; i++) {
        shift[i] = s->prob[i] > 0 ? (float)fabs(-log((double)s->prob[i]) - h) : INFINITY;
        pos[i] = i;
    }
    t_shift = shift;
    qsort(pos, (size_t)s->nc, sizeof(int32_t), by_shift);
    double cum = 0;
    int keep = s->nc;
    for (int i = 0; i < s->nc; i++) {
        cum += s->prob[pos[i]];
        if (cum > s->p.typical_p) {
            keep = i + 1;
            break;
        }
    }
    if (keep == s->nc) return;
    /* the kept ones, back in their previous order (a sorted list stays sorted) */
    uint8_t *mark = (uint8_t *)(pos + s->nc);
    memset(mark, 0, (size_t)s->nc);
    for (int i = 0; i < keep; i++) mark[pos[i]] = 1;
    int w = 0;
    for (int i = 0; i < s->nc; i++)
        if (mark[i]) {
            s->idx[w] = s->idx[i];
            s->val[w] = s->val[i];
            s->prob[w++] = s->prob[i];
        }
    s->nc = w;
    s->cut_since_p = 1;
}

static void step_min_p(sampler *s) {
    need_p(s, 0);
    float best = 0;
    for (int i = 0; i < s->nc; i++) best = fmaxf(best, s->prob[i]);
    /* min_p above 1 would drop every candidate: the best one always stays */
    float thr = s->p.min_p < 1.0f ? s->p.min_p * best : best;
    int w = 0;
    for (int i = 0; i < s->nc; i++)
        if (s->prob[i] >= thr) {
            s->idx[w] = s->idx[i];
            s->val[w] = s->val[i];
            s->prob[w++] = s->prob[i];
        }
    keep_first(s, w);
}

/* Penalties or DRY after a cut: on the candidates left. */
static void step_mod(sampler *s, int kind) {
    const sampler_params *p = &s->p;
    if (kind == SMP_PENALTIES) {
        if (!pen_on(p)) return;
        for (int i = 0; i < s->nc; i++)
            if (s->count[s->idx[i]]) s->val[i] = penalised(p, s->val[i], s->count[s->idx[i]]);
    } else {
        if (!s->dry_cap) return;
        dry_lengths(s);
        for (int i = 0; i < s->nc; i++) {
            int32_t t = s->idx[i];
            if (s->dry_len[t] >= 0 && (!s->breaker || !s->breaker[t])) s->val[i] -= dry_penalty(s, s->dry_len[t]);
        }
    }
    s->sorted = 0;
    s->have_p = 0;
}

/* top_p over many unsorted candidates without sorting them all: the first
 * kk of the candidate order (larger logit, then lower id; a heap over
 * positions, then a sort of those), kk growing until their mass at the
 * temperature in force reaches top_p. The same prefix and the same cut as
 * sorting every candidate; the probabilities are normalised by a sum taken
 * in the candidates' own order (a sort first summed them sorted: the last
 * bits of the scale may differ). The kept ones become the candidates, in
 * order. 0 when the prefix would pass a quarter of them (the caller sorts). */
static _Thread_local const sampler *t_pos_s; /* qsort has no context argument */
static int pos_before(const void *ctx, int32_t a, int32_t b) {
    const sampler *s = ctx;
    return s->val[a] > s->val[b] || (s->val[a] == s->val[b] && s->idx[a] < s->idx[b]);
}
static int by_pos(const void *a, const void *b) {
    const int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    return pos_before(t_pos_s, x, y) ? -1 : pos_before(t_pos_s, y, x) ? 1 : 0;
}
static int top_p_prefix(sampler *s, double top_p) {
    const int n = s->nc;
    need_p(s, 1);
    int32_t *pos = (int32_t *)s->tmp; /* kk positions, then the kept ones' ids, logits, probabilities */
    for (int kk = 64; kk <= n / 4; kk *= 4) {
        const int h = heap_first(n, kk, pos, pos_before, s, NULL); /* the kk first in the order */
        t_pos_s = s;
        qsort(pos, (size_t)h, sizeof(int32_t), by_pos);
        double cum = 0;
        for (int k = 0; k < h; k++) {
            cum += s->prob[pos[k]];
            if (cum >= top_p) {
                int32_t *ids = pos + kk;
                float *vals = (float *)(ids + kk), *probs = vals + kk;
                for (int q = 0; q <= k; q++)
                    ids[q] = s->idx[pos[q]], vals[q] = s->val[pos[q]], probs[q] = s->prob[pos[q]];
                memcpy(s->idx, ids, (size_t)(k + 1) * sizeof(int32_t));
                memcpy(s->val, vals, (size_t)(k + 1) * sizeof(float));
                memcpy(s->prob, probs, (size_t)(k + 1) * sizeof(float));
                s->sorted = 1;
                s->nc = k + 1;
                s->cut_since_p = 1;
                return 1;
            }
        }
    }
    return 0;
}

/* Every step in order over the candidates set up by the caller, then the draw. */
static int32_t run_chain(sampler *s) {
    const sampler_params *p = &s->p;
    s->t = 1.0f;
    s->have_p = 0;
    for (int i = 0; i < s->n_order && s->nc > 1; i++) {
        switch (s->order[i]) {
        case SMP_PENALTIES:
        case SMP_DRY:
            if (!s->mods_first) step_mod(s, s->order[i]);
            break;
        case SMP_TOP_K:
            if (p->top_k > 0 && p->top_k < s->nc) {
                sort_cands(s);
                keep_first(s, p->top_k);
            }
            break;
        case SMP_TYPICAL:
            if (is_cut(s, SMP_TYPICAL)) step_typical(s);
            break;
        case SMP_TEMP:
            s->t = p->temp;
            s->have_p = 0;
            break;
        case SMP_TOP_P:
            if (p->top_p < 1.0f) { /* smallest prefix (sorted) whose mass reaches top_p */
                if (!s->sorted && s->nc > 1024 && top_p_prefix(s, p->top_p)) break;
                sort_cands(s);
                need_p(s, 1);
                double cum = 0;
                for (int k = 0; k < s->nc; k++) {
                    cum += s->prob[k];
                    if (cum >= p->top_p) {
                        keep_first(s, k + 1);
                        break;
                    }
                }
            }
            break;
        case SMP_MIN_P:
            if (p->min_p > 0.0f) step_min_p(s);
            break;
        }
    }
    need_p(s, 0);
    return s->idx[walk_to(s->prob, s->nc, next_unit(&s->rng) * sum_of(s->prob, s->nc))];
}

/* The temperature the chain would apply (1 when the order has none), or 0
 * when a step of the chain would do more than scale: a cut, or a penalty
 * left for the chain (not applied in the prelude). */
static float only_temperature(const sampler *s) {
    const sampler_params *p = &s->p;
    if (!s->mods_first && (pen_on(p) || dry_on(p))) return 0;
    float t = 1.0f;
    for (int i = 0; i < s->n_order; i++) {
        if (is_cut(s, s->order[i])) return 0;
        if (s->order[i] == SMP_TEMP) t = p->temp;
    }
    return t;
}

/* The draw over every id when the chain is only a temperature (the
 * server's default, OpenAI's top_k 0 and top_p 1): one pass for the
 * largest logit, one for the exponentials and their sum, a walk to the draw;
 * none of the chain's copies, sorts or normalisation. The same distribution
 * as run_chain over the same candidates. -1 when the chain does more than
 * that, or a logit is NaN (run_chain's path leaves those out). */
static int32_t draw_all(sampler *s, const float *logits) {
    const float t = only_temperature(s);
    if (t <= 0) return -1;
    const int n = s->n_vocab;
    int nan;
    const float m = max_of(logits, n, &nan);
    if (nan) return -1;
    const double sum = exp_of(logits, s->prob, n, m, 1.0f / t);
    return walk_to(s->prob, n, next_unit(&s->rng) * sum);
}

float sampler_device_temp(const sampler *s) {
    const sampler_params *p = &s->p;
    if (p->temp <= 0.0f || pen_on(p) || dry_on(p) || s->bias) return 0;
    return only_temperature(s);
}

double sampler_draw_unit(sampler *s) { return next_unit(&s->rng); }

/* Candidates that are already the top-k of the logits, in order. */
static int32_t chain_from(sampler *s, const int32_t *ids, const float *vals, int k) {
    if (ids != s->idx) memcpy(s->idx, ids, (size_t)k * sizeof(int32_t));
    memcpy(s->val, vals, (size_t)k * sizeof(float));
    s->nc = k;
    s->sorted = 1;
    return run_chain(s);
}

int32_t sampler_sample_top(sampler *s, const int32_t *ids, const float *vals, int k) {
    if (s->p.temp <= 0.0f) return ids[0]; /* a draw even from one candidate: the generator advances as on the host */
    return chain_from(s, ids, vals, k);
}

/* Everything after the prelude. */
static int32_t sample_rest(sampler *s, float *logits) {
    int n = s->n_vocab;
    if (s->p.temp <= 0.0f) return argmax(logits, n);
    /* candidates: the top_k best (sorted) when top-k is the first cut, else all ids (sorted when a step needs it) */
    if (first_cut(s) == SMP_TOP_K && s->mods_first) {
        int nc = sampler_top_k(logits, n, s->p.top_k, s->idx);
        if (nc == 0) return argmax(logits, n); /* every logit NaN: nothing to draw from */
        for (int i = 0; i < nc; i++) s->val[i] = logits[s->idx[i]];
        return chain_from(s, s->idx, s->val, nc);
    }
    const int32_t d = draw_all(s, logits);
    if (d >= 0) return d;
    int w = 0;
    int32_t *idx = s->idx;
    float *val = s->val;
    for (int i = 0; i < n; i++) { /* every id but a NaN's, without a branch */
        idx[w] = i;
        val[w] = logits[i];
        w += logits[i] == logits[i];
    }
    if (w == 0) return argmax(logits, n);
    s->nc = w;
    s->sorted = 0;
    return run_chain(s);
}

int32_t sampler_sample(sampler *s, float *logits) {
    prelude(s, logits, s->p.temp <= 0.0f);
    return sample_rest(s, logits);
}

#define CHECK_FIRST 32 /* candidates tried in order before a greedy draw masks the vocabulary */

int32_t sampler_sample_checked(sampler *s, float *logits, sampler_ok_fn ok, sampler_mask_fn mask, void *ctx) {
    const sampler_params *p = &s->p;
    const int n = s->n_vocab;
    prelude(s, logits, p->temp <= 0.0f);
    if (p->temp <= 0.0f) { /* the masked argmax is the first allowed token in the candidate order */
        int nc = sampler_top_k(logits, n, CHECK_FIRST, s->idx);
        for (int i = 0; i < nc; i++)
            if (ok(ctx, s->idx[i])) return s->idx[i];
        if (nc == n || mask(ctx, logits, n) == 0) return -1;
        return argmax(logits, n);
    }
    /* the shortcuts hold when nothing but top-k cuts and the penalties ran already (mods_first):
     * masking commutes with the temperature, and top-k of the masked logits is the k best allowed */
    const int no_cut = p->top_p >= 1.0f && p->min_p <= 0.0f && !is_cut(s, SMP_TYPICAL) && s->mods_first;
    if (no_cut && (p->top_k <= 0 || p->top_k >= n)) { /* one draw, kept when allowed (see sampler.h) */
        int32_t t = draw_all(s, logits);
        if (t < 0) { /* a NaN among the logits, or a chain that is more than a temperature */
            for (int i = 0; i < n; i++) {
                s->idx[i] = i;
                s->val[i] = logits[i];
            }
            s->nc = n;
            s->sorted = 0;
            t = run_chain(s);
        }
        if (ok(ctx, t)) return t;
    } else if (no_cut && p->top_k <= 64) { /* top-k of the masked logits: the k best allowed, in order */
        int want = p->top_k, k = want * 4 > 64 ? want * 4 : 64;
        int nc = sampler_top_k(logits, n, k < n ? k : n, s->idx), w = 0;
        for (int i = 0; i < nc && w < want; i++)
            if (ok(ctx, s->idx[i])) s->idx[w++] = s->idx[i];
        if (w == want || (nc == n && w > 0)) {
            for (int i = 0; i < w; i++) s->val[i] = logits[s->idx[i]];
            return chain_from(s, s->idx, s->val, w);
        }
        if (nc == n) return -1;
    }
    if (mask(ctx, logits, n) == 0) return -1;
    return sample_rest(s, logits);
}
