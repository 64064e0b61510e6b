/* Sampler (see sampler.h). The order is llama.cpp's usual one: penalties,
 * then top-k, then temperature-scaled softmax, then top-p and min-p cuts,
 * then a draw. Candidates are sorted only when a cut needs the order. */
#include "engine/sampler.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/alloc.h"

struct sampler {
    sampler_params p;
    int n_vocab;
    uint64_t rng;
    int32_t *recent; /* ring of the last penalty_last_n tokens */
    int n_recent, head;
    int32_t *idx;    /* candidate ids scratch (n_vocab) */
    float *prob;     /* candidate probabilities scratch */
    float *val;      /* candidate logits scratch */
    uint16_t *count; /* per-token count within the window (n_vocab) */
};

sampler_params sampler_defaults(void) {
    sampler_params p = {0};
    p.temp = 0.8f;
    p.top_k = 40;
    p.top_p = 0.95f;
    p.min_p = 0.05f;
    p.repeat_penalty = 1.0f;
    p.penalty_last_n = 64;
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

sampler *sampler_create(const sampler_params *p, int n_vocab) {
    sampler *s = st_calloc(1, sizeof *s);
    s->p = *p;
    if (s->p.penalty_last_n < 0) s->p.penalty_last_n = 0;
    s->n_vocab = n_vocab;
    s->rng = p->seed;
    s->recent = st_calloc((size_t)(s->p.penalty_last_n + 1), sizeof(int32_t));
    s->idx = st_malloc((size_t)n_vocab * sizeof(int32_t));
    s->prob = st_malloc((size_t)n_vocab * sizeof(float));
    s->val = st_malloc((size_t)n_vocab * sizeof(float));
    s->count = st_calloc((size_t)n_vocab, sizeof(uint16_t));
    return s;
}

void sampler_free(sampler *s) {
    if (!s) return;
    st_free(s->recent);
    st_free(s->idx);
    st_free(s->prob);
    st_free(s->val);
    st_free(s->count);
    st_free(s);
}

void sampler_reset(sampler *s) {
    s->n_recent = s->head = 0;
    memset(s->count, 0, (size_t)s->n_vocab * sizeof(uint16_t));
    s->rng = s->p.seed;
}

void sampler_accept(sampler *s, int32_t token) {
    int n = s->p.penalty_last_n;
    if (n == 0 || token < 0 || token >= s->n_vocab) return;
    if (s->n_recent == n) s->count[s->recent[s->head]]--; /* the oldest leaves the window */
    else s->n_recent++;
    s->recent[s->head] = token;
    s->head = (s->head + 1) % n;
    if (s->count[token] < UINT16_MAX) s->count[token]++;
}

static void apply_penalties(sampler *s, float *logits) {
    const sampler_params *p = &s->p;
    if (p->repeat_penalty == 1.0f && p->presence_penalty == 0.0f && p->frequency_penalty == 0.0f) return;
    /* each distinct token once: its count is zeroed once used (a token seen
     * twice in the window is then skipped), and recounted from the ring below */
    for (int i = 0; i < s->n_recent; i++) {
        int32_t t = s->recent[i];
        int c = s->count[t];
        if (c == 0) continue;
        float *l = &logits[t];
        if (p->repeat_penalty != 1.0f) *l = *l > 0 ? *l / p->repeat_penalty : *l * p->repeat_penalty;
        *l -= (float)c * p->frequency_penalty + p->presence_penalty;
        s->count[t] = 0;
    }
    for (int i = 0; i < s->n_recent; i++) {
        int32_t t = s->recent[i];
        if (s->count[t] < UINT16_MAX) s->count[t]++;
    }
}

/* The first largest logit; NaNs are passed over (0 when every one is NaN). */
static int32_t argmax(const float *x, int n) {
    int32_t b = 0;
    while (b < n - 1 && x[b] != x[b]) b++;
    for (int i = b + 1; i < n; i++)
        if (x[i] > x[b]) b = i;
    return b;
}

/* The candidate order: larger logit first, equal logits by the lower id. */
static int before(const float *l, int32_t a, int32_t b) { return l[a] > l[b] || (l[a] == l[b] && a < b); }

static _Thread_local const float *t_sort_logits; /* qsort has no context argument */
static int by_logit_desc(const void *a, const void *b) {
    const int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    return before(t_sort_logits, x, y) ? -1 : before(t_sort_logits, y, x) ? 1 : 0;
}

/* A min-heap of size k (its root the last in the order) over the
 * vocabulary, O(n log k), then a sort of those k. */
int sampler_top_k(const float *l, int n, int k, int32_t *idx) {
    int h = 0;
    if (k > n) k = n;
    for (int i = 0; i < n; i++) {
        if (l[i] != l[i]) continue; /* NaN: never a candidate */
        if (h == k && !before(l, i, idx[0])) continue;
        int j;
        if (h < k) { /* sift up */
            j = h++;
            while (j > 0 && before(l, idx[(j - 1) / 2], i)) {
                idx[j] = idx[(j - 1) / 2];
                j = (j - 1) / 2;
            }
        } else { /* replace the root, sift down */
            j = 0;
            for (;;) {
                int c = 2 * j + 1;
                if (c >= h) break;
                if (c + 1 < h && before(l, idx[c], idx[c + 1])) c++;
                if (!before(l, i, idx[c])) break;
                idx[j] = idx[c];
                j = c;
            }
        }
        idx[j] = i;
    }
    t_sort_logits = l;
    qsort(idx, (size_t)h, sizeof(int32_t), by_logit_desc);
    return h;
}

int sampler_candidates(const sampler *s, int max_k) {
    const sampler_params *p = &s->p;
    if (p->repeat_penalty != 1.0f || p->presence_penalty != 0.0f || p->frequency_penalty != 0.0f) return 0;
    if (p->temp <= 0.0f) return 1;
    return p->top_k > 0 && p->top_k <= max_k && p->top_k < s->n_vocab ? p->top_k : 0;
}

/* Temperature softmax over the nc candidates s->idx[i] with logits lv[i]
 * (in order when top-p is on), the top-p and min-p cuts, then the draw. */
static int32_t draw(sampler *s, const float *lv, int nc) {
    const sampler_params *p = &s->p;
    float maxl = lv[0];
    for (int i = 1; i < nc; i++) maxl = fmaxf(maxl, lv[i]);
    double sum = 0;
    for (int i = 0; i < nc; i++) {
        s->prob[i] = expf((lv[i] - maxl) / p->temp);
        sum += s->prob[i];
    }
    for (int i = 0; i < nc; i++) s->prob[i] = (float)(s->prob[i] / sum);
    if (p->top_p < 1.0f) { /* smallest prefix (sorted) whose mass reaches top_p */
        double cum = 0;
        for (int i = 0; i < nc; i++) {
            cum += s->prob[i];
            if (cum >= p->top_p) {
                nc = i + 1;
                break;
            }
        }
    }
    if (p->min_p > 0.0f) { /* drop candidates below min_p times the best one */
        float best = 0;
        for (int i = 0; i < nc; i++) best = fmaxf(best, s->prob[i]);
        /* min_p above 1 would drop every candidate: the best one always stays */
        float thr = p->min_p < 1.0f ? p->min_p * best : best;
        int w = 0;
        for (int i = 0; i < nc; i++)
            if (s->prob[i] >= thr) {
                s->idx[w] = s->idx[i];
                s->prob[w++] = s->prob[i];
            }
        nc = w;
    }
    double mass = 0;
    for (int i = 0; i < nc; i++) mass += s->prob[i];
    double r = next_unit(&s->rng) * mass, cum = 0;
    for (int i = 0; i < nc; i++) {
        cum += s->prob[i];
        if (r < cum) return s->idx[i];
    }
    return s->idx[nc - 1];
}

int32_t sampler_sample_top(sampler *s, const int32_t *ids, const float *vals, int k) {
    if (s->p.temp <= 0.0f) return ids[0]; /* a draw even from one candidate: the generator advances as on the host */
    memcpy(s->idx, ids, (size_t)k * sizeof(int32_t));
    memcpy(s->val, vals, (size_t)k * sizeof(float));
    return draw(s, s->val, k);
}

/* Everything after the penalties. */
static int32_t sample_rest(sampler *s, float *logits) {
    const sampler_params *p = &s->p;
    int n = s->n_vocab;
    if (p->temp <= 0.0f) return argmax(logits, n);

    /* candidates: the top_k best (sorted), or all ids (sorted only if top-p needs the order) */
    int nc = n;
    if (p->top_k > 0 && p->top_k < n) {
        nc = sampler_top_k(logits, n, p->top_k, s->idx);
        if (nc == 0) return argmax(logits, n); /* every logit NaN: nothing to draw from */
    } else {
        for (int i = 0; i < n; i++) s->idx[i] = i;
        if (p->top_p < 1.0f) {
            t_sort_logits = logits;
            qsort(s->idx, (size_t)n, sizeof(int32_t), by_logit_desc);
        }
    }
    for (int i = 0; i < nc; i++) s->val[i] = logits[s->idx[i]];
    return draw(s, s->val, nc);
}

int32_t sampler_sample(sampler *s, float *logits) {
    apply_penalties(s, logits);
    return sample_rest(s, logits);
}

#define CHECK_FIRST 32 /* candidates tried in order before a greedy draw masks the vocabulary */

int32_t sampler_sample_checked(sampler *s, float *logits, sampler_ok_fn ok, sampler_mask_fn mask, void *ctx) {
    apply_penalties(s, logits);
    const sampler_params *p = &s->p;
    const int n = s->n_vocab;
    if (p->temp <= 0.0f) { /* the masked argmax is the first allowed token in the candidate order */
        int nc = sampler_top_k(logits, n, CHECK_FIRST, s->idx);
        for (int i = 0; i < nc; i++)
            if (ok(ctx, s->idx[i])) return s->idx[i];
        if (nc == n || mask(ctx, logits, n) == 0) return -1;
        return argmax(logits, n);
    }
    const int no_cut = p->top_p >= 1.0f && p->min_p <= 0.0f;
    if (no_cut && (p->top_k <= 0 || p->top_k >= n)) { /* one draw, kept when allowed (see sampler.h) */
        for (int i = 0; i < n; i++) s->idx[i] = i;
        memcpy(s->val, logits, (size_t)n * sizeof(float));
        int32_t t = draw(s, s->val, n);
        if (ok(ctx, t)) return t;
    } else if (no_cut && p->top_k <= 64) { /* top-k of the masked logits: the k best allowed, in order */
        int want = p->top_k, k = want * 4 > 64 ? want * 4 : 64;
        int nc = sampler_top_k(logits, n, k < n ? k : n, s->idx), w = 0;
        for (int i = 0; i < nc && w < want; i++)
            if (ok(ctx, s->idx[i])) s->idx[w++] = s->idx[i];
        if (w == want || (nc == n && w > 0)) {
            for (int i = 0; i < w; i++) s->val[i] = logits[s->idx[i]];
            return draw(s, s->val, w);
        }
        if (nc == n) return -1;
    }
    if (mask(ctx, logits, n) == 0) return -1;
    return sample_rest(s, logits);
}
