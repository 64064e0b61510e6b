/* Sampler tests on synthetic logits (engine/sampler.h).
 *
 * Exact checks: greedy is the argmax; a tiny temperature behaves like greedy;
 * top-k = 1 is greedy; penalties change exactly the logits of tokens inside
 * the last penalty_last_n accepted ones, by an independent re-implementation
 * of the rules (repetition divides positive / multiplies negative logits once
 * per distinct token; OpenAI's presence/frequency: l -= c*freq + (c>0)*pres).
 * Statistical checks (fixed seeds, so the run is deterministic, but the
 * bounds are what a correct sampler meets with overwhelming probability):
 * top-k / top-p / min-p never draw outside the support they should keep and
 * do draw every member of it; the empirical frequencies of 20k draws match
 * softmax(logits/T) (renormalised over the kept support) by a chi-square
 * bound, and the same draws fail that bound against a wrong distribution,
 * which shows the check has the power to notice a mistake.
 * Reproducibility: a seed gives the same sequence, other seeds differ, and
 * sampler_reset restarts the sequence and forgets the penalty history.
 * Constrained sampling (sampler_sample_checked) against masking first:
 * greedy, top-k and top-p/min-p give the same token for the same seed, and
 * plain temperature draws follow the masked softmax, masking only when the
 * first draw is refused. */
#include "engine/sampler.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../common/check.h"

/* the test's own generator (xorshift64*), independent of the sampler's */
static uint64_t g_rng = 0x243f6a8885a308d3ull;
static uint64_t rnd_u64(void) {
    g_rng ^= g_rng >> 12;
    g_rng ^= g_rng << 25;
    g_rng ^= g_rng >> 27;
    return g_rng * 2685821657736338717ull;
}
static double rnd_unit(void) { return (double)(rnd_u64() >> 11) / 9007199254740992.0; }
static float rnd_logit(float scale) { return (float)((rnd_unit() * 2 - 1) * scale); }

/* every cut off, penalties off: a plain softmax draw at temperature 1 */
static sampler_params plain(uint64_t seed) {
    sampler_params p = sampler_defaults();
    p.temp = 1.0f;
    p.top_k = 0;
    p.top_p = 1.0f;
    p.min_p = 0.0f;
    p.repeat_penalty = 1.0f;
    p.presence_penalty = p.frequency_penalty = 0.0f;
    p.penalty_last_n = 64;
    p.seed = seed;
    return p;
}

static int argmax_f(const float *x, int n) {
    int b = 0;
    for (int i = 1; i < n; i++)
        if (x[i] > x[b]) b = i;
    return b;
}

/* one draw from a copy of logits (the sampler modifies its input) */
static int draw(sampler *s, const float *logits, int n) {
    static float tmp[4096];
    if (n > 4096) return -1;
    memcpy(tmp, logits, (size_t)n * sizeof(float));
    return sampler_sample(s, tmp);
}

/* softmax(logits/T) restricted to keep[] (NULL: all), in double */
static void softmax_T(const float *l, int n, double T, const int *keep, double *out) {
    double mx = -1e300, sum = 0;
    for (int i = 0; i < n; i++)
        if ((!keep || keep[i]) && l[i] > mx) mx = l[i];
    for (int i = 0; i < n; i++) {
        out[i] = (!keep || keep[i]) ? exp((l[i] - mx) / T) : 0;
        sum += out[i];
    }
    for (int i = 0; i < n; i++) out[i] /= sum;
}

/* Pearson chi-square of counts against probabilities; bins expecting < 5
 * draws are pooled. *df gets the degrees of freedom. A bin with p = 0 and a
 * nonzero count makes the statistic infinite. */
static double chi_square(const int *cnt, const double *p, int n, int total, int *df) {
    double chi = 0, pool_e = 0;
    int pool_o = 0, bins = 0;
    for (int i = 0; i < n; i++) {
        double e = p[i] * total;
        if (p[i] == 0) {
            if (cnt[i]) return INFINITY;
            continue;
        }
        if (e < 5) {
            pool_e += e;
            pool_o += cnt[i];
            continue;
        }
        chi += (cnt[i] - e) * (cnt[i] - e) / e;
        bins++;
    }
    if (pool_e > 0) {
        chi += (pool_o - pool_e) * (pool_o - pool_e) / pool_e;
        bins++;
    }
    *df = bins - 1;
    return chi;
}

/* mean + 5 standard deviations of a chi-square with df degrees of freedom
 * (a false alarm rate around 1e-4 for the df used here) */
static double chi_bound(int df) { return df + 5.0 * sqrt(2.0 * df); }

static void test_greedy(void) {
    int bad = 0;
    for (int trial = 0; trial < 200; trial++) {
        float l[100];
        for (int i = 0; i < 100; i++) l[i] = rnd_logit(10);
        sampler_params p = sampler_defaults(); /* top-k/p/min-p set, but temp 0 ignores them */
        p.temp = 0.0f;
        sampler *s = sampler_create(&p, 100);
        if (draw(s, l, 100) != argmax_f(l, 100)) bad++;
        p.temp = -1.0f;
        sampler_free(s);
        s = sampler_create(&p, 100);
        if (draw(s, l, 100) != argmax_f(l, 100)) bad++;
        sampler_free(s);
    }
    CHECK(bad == 0, "greedy != argmax in %d of 400 cases", bad);
    printf("greedy: temp 0 and -1 give the argmax on 200 random vectors of 100 logits\n");
}

static void test_tiny_temp_and_topk1(void) {
    int bad_t = 0, bad_k = 0, used = 0;
    for (int trial = 0; trial < 200; trial++) {
        float l[64];
        for (int i = 0; i < 64; i++) l[i] = rnd_logit(5);
        int a = argmax_f(l, 64);
        float second = -1e30f;
        for (int i = 0; i < 64; i++)
            if (i != a && l[i] > second) second = l[i];
        sampler_params p = plain(trial + 1);
        p.top_k = 1; /* top-k = 1 at any temperature: the argmax */
        p.temp = 1.5f;
        sampler *s = sampler_create(&p, 64);
        for (int d = 0; d < 20; d++)
            if (draw(s, l, 64) != a) bad_k++;
        sampler_free(s);
        if (l[a] - second < 0.05f) continue; /* a near tie is a coin flip even at small T */
        used++;
        p = plain(trial + 1);
        p.temp = 1e-3f; /* gap/T >= 50: the runner-up has probability < e^-50 */
        s = sampler_create(&p, 64);
        for (int d = 0; d < 20; d++)
            if (draw(s, l, 64) != a) bad_t++;
        sampler_free(s);
    }
    CHECK(bad_k == 0, "top-k 1 drew a non-argmax %d times", bad_k);
    CHECK(bad_t == 0, "temp 1e-3 drew a non-argmax %d times", bad_t);
    CHECK(used > 100, "too few vectors with a clear maximum (%d)", used);
    printf("top-k 1 = argmax (200 vectors x 20 draws at T 1.5); temp 1e-3 = argmax (%d vectors x 20 draws)\n", used);
}

static void test_seed_and_reset(void) {
    enum { V = 50, N = 200 };
    float l[V];
    for (int i = 0; i < V; i++) l[i] = rnd_logit(1);
    int a[N], b[N], c[N], r[N];
    sampler_params p = plain(1234);
    sampler *s1 = sampler_create(&p, V), *s2 = sampler_create(&p, V);
    p.seed = 1235;
    sampler *s3 = sampler_create(&p, V);
    for (int i = 0; i < N; i++) {
        a[i] = draw(s1, l, V);
        b[i] = draw(s2, l, V);
        c[i] = draw(s3, l, V);
    }
    sampler_reset(s1);
    for (int i = 0; i < N; i++) r[i] = draw(s1, l, V);
    int same_ab = !memcmp(a, b, sizeof a), same_ac = 0, same_ar = !memcmp(a, r, sizeof a);
    for (int i = 0; i < N; i++) same_ac += a[i] == c[i];
    CHECK(same_ab, "two samplers with seed 1234 differ");
    CHECK(same_ac < N / 4, "seeds 1234 and 1235 agree on %d of %d draws", same_ac, N);
    CHECK(same_ar, "sampler_reset does not restart the seed's sequence");
    /* the sequence is not constant: the draws spread over the vocabulary */
    int seen[V] = {0}, distinct = 0;
    for (int i = 0; i < N; i++) distinct += !seen[a[i]]++;
    CHECK(distinct > 20, "only %d distinct tokens in %d draws from 50 near-uniform ones", distinct, N);
    printf("seed: same seed same %d draws; seed+1 agrees on %d of %d; reset replays; %d distinct tokens\n", N, same_ac,
           N, distinct);

    /* reset also forgets the penalty history: a penalised sampler after reset
     * draws exactly what a fresh one draws */
    p = plain(99);
    p.repeat_penalty = 3.0f;
    p.presence_penalty = 1.0f;
    sampler *pen = sampler_create(&p, V), *fresh = sampler_create(&p, V);
    for (int i = 0; i < 30; i++) sampler_accept(pen, i % 7);
    sampler_reset(pen);
    int differ = 0;
    for (int i = 0; i < N; i++) differ += draw(pen, l, V) != draw(fresh, l, V);
    CHECK(differ == 0, "after reset a penalised sampler differs from a fresh one on %d draws", differ);
    printf("reset: forgets the accepted tokens (penalties) and replays the fresh sequence\n");
    sampler_free(s1);
    sampler_free(s2);
    sampler_free(s3);
    sampler_free(pen);
    sampler_free(fresh);
}

/* draws `total` samples; returns the number of draws outside keep[] and
 * whether every kept token was drawn; fills counts */
static int sample_counts(const sampler_params *p, const float *l, int n, int total, int *cnt) {
    sampler *s = sampler_create(p, n);
    memset(cnt, 0, (size_t)n * sizeof(int));
    int bad = 0;
    for (int d = 0; d < total; d++) {
        int t = draw(s, l, n);
        if (t < 0 || t >= n) bad++;
        else cnt[t]++;
    }
    sampler_free(s);
    return bad;
}

/* support and distribution of one configuration: keep[] is the expected
 * support; the frequencies must match softmax(l/T) renormalised over it */
static void check_support(const char *what, const sampler_params *p, const float *l, int n, const int *keep,
                          int total) {
    int cnt[256];
    int oob = sample_counts(p, l, n, total, cnt);
    int outside = 0, missing = 0;
    for (int i = 0; i < n; i++) {
        if (!keep[i]) outside += cnt[i];
        else if (cnt[i] == 0) missing++;
    }
    double q[256];
    softmax_T(l, n, p->temp, keep, q);
    int df;
    double chi = chi_square(cnt, q, n, total, &df);
    CHECK(oob == 0 && outside == 0, "%s: %d draws outside the support (%d out of range)", what, outside, oob);
    CHECK(missing == 0, "%s: %d kept tokens never drawn", what, missing);
    CHECK(df < 1 || chi < chi_bound(df), "%s: chi-square %.1f > %.1f (df %d)", what, chi, chi_bound(df), df);
    int n_keep = 0;
    for (int i = 0; i < n; i++) n_keep += keep[i] != 0;
    printf("%s: %d draws, %d outside the %d kept, %d kept never drawn, chi2 %.1f (df %d, bound %.1f)\n", what, total,
           outside + oob, n_keep, missing, chi, df, df >= 1 ? chi_bound(df) : 0.0);
}

/* ids of the k largest logits, marked in keep[] (the test's own selection sort) */
static void mark_top_k(const float *l, int n, int k, int *keep) {
    memset(keep, 0, (size_t)n * sizeof(int));
    for (int j = 0; j < k; j++) {
        int b = -1;
        for (int i = 0; i < n; i++)
            if (!keep[i] && (b < 0 || l[i] > l[b])) b = i;
        keep[b] = 1;
    }
}

static void test_top_k(void) {
    enum { V = 30 };
    float l[V];
    int keep[V];
    for (int i = 0; i < V; i++) l[i] = rnd_logit(1.5f);
    const int ks[] = {2, 5, 12};
    const float ts[] = {0.7f, 1.0f, 1.6f};
    for (int a = 0; a < 3; a++) {
        sampler_params p = plain(77 + a);
        p.top_k = ks[a];
        p.temp = ts[a];
        mark_top_k(l, V, ks[a], keep);
        char what[64];
        snprintf(what, sizeof what, "top-k %d at T %.1f", ks[a], ts[a]);
        check_support(what, &p, l, V, keep, 10000);
    }
    /* k beyond the vocabulary is no cut */
    sampler_params p = plain(5);
    p.top_k = 1000;
    for (int i = 0; i < V; i++) keep[i] = 1;
    check_support("top-k 1000 > vocabulary 30", &p, l, V, keep, 10000);
}

/* the known distribution for top-p and min-p, placed at shuffled ids */
enum { KV = 8 };
static const double known_p[KV] = {0.4, 0.3, 0.2, 0.04, 0.03, 0.02, 0.007, 0.003};

static void known_logits(float *l, int *perm) {
    for (int i = 0; i < KV; i++) perm[i] = i;
    for (int i = KV - 1; i > 0; i--) { /* Fisher-Yates */
        int j = (int)(rnd_u64() % (uint64_t)(i + 1)), t = perm[i];
        perm[i] = perm[j];
        perm[j] = t;
    }
    for (int i = 0; i < KV; i++) l[perm[i]] = (float)log(known_p[i]);
}

/* the smallest set of most probable ids (under softmax(l/T)) whose mass
 * reaches top_p; *margin gets how far the cut is from flipping */
static void mark_top_p(const float *l, double T, double top_p, int *keep, double *margin) {
    double q[KV];
    softmax_T(l, KV, T, NULL, q);
    memset(keep, 0, KV * sizeof(int));
    double cum = 0;
    *margin = 1;
    for (int j = 0; j < KV; j++) {
        int b = -1;
        for (int i = 0; i < KV; i++)
            if (!keep[i] && (b < 0 || q[i] > q[b])) b = i;
        keep[b] = 1;
        double before = cum;
        cum += q[b];
        *margin = fmin(fabs(cum - top_p), fabs(before - top_p));
        if (cum >= top_p) break;
    }
}

static void test_top_p(void) {
    float l[KV];
    int perm[KV], keep[KV];
    known_logits(l, perm);
    /* at T 1 the cuts are read off known_p: 0.4 | 0.7 | 0.9 | 0.94 | 0.97 ... */
    const double tops[] = {0.35, 0.65, 0.85, 0.95, 0.8};
    const int expect_n[] = {1, 2, 3, 5, 3};
    for (int a = 0; a < 5; a++)
        for (int k = 0; k <= 6; k += 6) { /* k 0: the sort path; k 6: the top-k heap path */
            sampler_params p = plain(300 + a);
            p.top_p = (float)tops[a];
            p.top_k = k;
            double margin;
            mark_top_p(l, 1.0, tops[a], keep, &margin);
            int n_keep = 0;
            for (int i = 0; i < KV; i++) n_keep += keep[i];
            CHECK(n_keep == expect_n[a] && margin > 1e-3, "top-p %.2f oracle keeps %d (margin %g)", tops[a], n_keep,
                  margin);
            char what[64];
            snprintf(what, sizeof what, "top-p %.2f (top-k %d)", tops[a], k);
            check_support(what, &p, l, KV, keep, 10000);
        }
    /* the cut applies to the temperature-scaled distribution (sampler.c's
     * order): at T 0.5 the probabilities are 0.54, 0.30, 0.14, ... so top-p
     * 0.8 keeps two tokens where T 1 keeps three */
    sampler_params p = plain(400);
    p.temp = 0.5f;
    p.top_p = 0.8f;
    double margin;
    mark_top_p(l, 0.5, 0.8, keep, &margin);
    int n_keep = 0;
    for (int i = 0; i < KV; i++) n_keep += keep[i];
    CHECK(n_keep == 2 && margin > 1e-3, "top-p 0.8 at T 0.5: oracle keeps %d", n_keep);
    check_support("top-p 0.80 at T 0.5", &p, l, KV, keep, 10000);
}

/* the oracle's order over a large vocabulary: larger logit, then lower id */
static const float *g_sort_l;
static int by_logit_then_id(const void *a, const void *b) {
    const int x = *(const int *)a, y = *(const int *)b;
    if (g_sort_l[x] != g_sort_l[y]) return g_sort_l[x] > g_sort_l[y] ? -1 : 1;
    return x < y ? -1 : x > y;
}

/* top-p over a vocabulary of 20000 (more than 1024 candidates: sampler.c
 * finds the prefix without sorting them all, in steps of 64 and 256): 200
 * head ids spread over the vocabulary with falling logits above 19800 low
 * ones; nuclei of a few dozen to over a hundred ids. The oracle sorts
 * every id, cuts where the mass of softmax(l/T) reaches top_p, and the
 * draws must all fall inside that nucleus, reach each of its ids, and
 * follow its renormalised probabilities (chi-square). */
static void test_top_p_large(void) {
    enum { V = 20000, HEAD = 200, DRAWS = 12000 };
    static float l[V];
    static int order[V], keep[V];
    static double q[V];
    for (int i = 0; i < V; i++) l[i] = -4.0f + 0.5f * (float)rnd_unit();
    for (int j = 0; j < HEAD; j++) l[(j * 7919 + 13) % V] = 6.0f - 0.012f * (float)j;
    const double temps[] = {1.0, 0.7, 1.0};
    const double tops[] = {0.5, 0.9, 0.8};
    for (int c = 0; c < 3; c++) {
        softmax_T(l, V, temps[c], NULL, q);
        for (int i = 0; i < V; i++) order[i] = i;
        g_sort_l = l;
        qsort(order, V, sizeof(int), by_logit_then_id);
        memset(keep, 0, sizeof keep);
        double cum = 0, margin = 1;
        int n_keep = 0;
        for (int k = 0; k < V; k++) {
            const double before = cum;
            cum += q[order[k]];
            keep[order[k]] = 1;
            n_keep++;
            margin = fmin(fabs(cum - tops[c]), fabs(before - tops[c]));
            if (cum >= tops[c]) break;
        }
        CHECK(n_keep >= 2 && n_keep <= 256 && margin > 1e-4, "large top-p %.2f at T %.1f: oracle keeps %d (margin %g)",
              tops[c], temps[c], n_keep, margin);
        if (n_keep > 256) continue;
        int pos[V], cnt[256] = {0};
        double qk[256];
        for (int k = 0; k < n_keep; k++) pos[order[k]] = k, qk[k] = q[order[k]] / cum;
        sampler_params p = plain(700 + (uint64_t)c);
        p.temp = (float)temps[c];
        p.top_p = (float)tops[c];
        sampler *s = sampler_create(&p, V);
        static float tmp[V];
        int outside = 0;
        for (int d = 0; d < DRAWS; d++) {
            memcpy(tmp, l, sizeof tmp);
            const int t = sampler_sample(s, tmp);
            if (t < 0 || t >= V || !keep[t]) outside++;
            else cnt[pos[t]]++;
        }
        sampler_free(s);
        int missing = 0, df;
        for (int k = 0; k < n_keep; k++) missing += cnt[k] == 0;
        const double chi = chi_square(cnt, qk, n_keep, DRAWS - outside, &df);
        CHECK(outside == 0 && missing == 0,
              "large top-p %.2f at T %.1f: %d draws outside the nucleus of %d, %d never drawn", tops[c], temps[c],
              outside, n_keep, missing);
        CHECK(df < 1 || chi < chi_bound(df), "large top-p %.2f: chi-square %.1f > %.1f (df %d)", tops[c], chi,
              chi_bound(df), df);
        printf("top-p %.2f at T %.1f over %d ids: %d draws, nucleus of %d (tail ids in it: %s), %d outside, %d never "
               "drawn, chi2 %.1f (df %d, bound %.1f)\n",
               tops[c], temps[c], V, DRAWS, n_keep, n_keep > HEAD ? "yes" : "no", outside, missing, chi, df,
               df >= 1 ? chi_bound(df) : 0.0);
    }
}

static void test_min_p(void) {
    float l[KV];
    int perm[KV], keep[KV];
    known_logits(l, perm);
    /* thresholds min_p * 0.4: 0.15 -> 0.06 keeps three; 0.6 -> 0.24 keeps two;
     * 0.06 -> 0.024 keeps five; 0.9 -> 0.36 keeps one (each threshold away
     * from a probability, where float rounding would decide) */
    const double mins[] = {0.15, 0.6, 0.06, 0.9};
    for (int a = 0; a < 4; a++)
        for (int k = 0; k <= 6; k += 6) {
            sampler_params p = plain(500 + a);
            p.min_p = (float)mins[a];
            p.top_k = k;
            int n_keep = 0;
            for (int i = 0; i < KV; i++) {
                keep[perm[i]] = known_p[i] >= mins[a] * known_p[0] && (k == 0 || i < k);
                n_keep += keep[perm[i]];
            }
            char what[64];
            snprintf(what, sizeof what, "min-p %.2f (top-k %d, keeps %d)", mins[a], k, n_keep);
            check_support(what, &p, l, KV, keep, 10000);
        }
    /* min-p above 1 would drop every candidate: the best one must remain
     * (the CLI accepts any number for --min-p) */
    sampler_params p = plain(600);
    p.min_p = 2.0f;
    memset(keep, 0, sizeof keep);
    keep[perm[0]] = 1;
    check_support("min-p 2.00 keeps the best", &p, l, KV, keep, 2000);
}

/* The temperature-only draw over a wide vocabulary (the server's default:
 * one pass of exponentials, then a walk that skips blocks of 64 by their
 * sums): frequencies against softmax(l/T) over 3000 ids, a logit range wide
 * enough that most of the mass sits in a few blocks; then every seventh logit
 * NaN, which must never be drawn (that path falls back to the chain, which
 * leaves them out) while the rest keep the softmax of the others. */
static void test_distribution_wide(void) {
    enum { V = 3000, N = 60000 };
    static float l[V];
    static int cnt[V], keep[V];
    static double q[V];
    for (int i = 0; i < V; i++) l[i] = rnd_logit(4), keep[i] = 1;
    for (int nan = 0; nan < 2; nan++) {
        if (nan)
            for (int i = 0; i < V; i += 7) l[i] = NAN, keep[i] = 0;
        sampler_params p = plain(900 + nan);
        p.temp = 0.8f;
        const int oob = sample_counts(&p, l, V, N, cnt);
        softmax_T(l, V, 0.8, keep, q);
        int df, drawn_nan = 0;
        for (int i = 0; i < V; i++) drawn_nan += !keep[i] && cnt[i];
        const double chi = chi_square(cnt, q, V, N, &df);
        CHECK(oob == 0 && drawn_nan == 0, "%s: %d draws out of range, %d NaN ids drawn", nan ? "NaNs" : "wide", oob,
              drawn_nan);
        CHECK(chi < chi_bound(df), "%s: chi-square %.1f > %.1f (df %d)", nan ? "NaNs" : "wide", chi, chi_bound(df), df);
        printf("softmax(l/0.8) over %d ids%s: %d draws, chi2 %.1f (df %d, bound %.1f)\n", V,
               nan ? ", every 7th NaN (never drawn)" : "", N, chi, df, chi_bound(df));
    }
}

/* The exponential itself, to a precision no chi-square over many bins
 * has: two tokens, logits 0 and -x, a million draws each; the share of the
 * first within 5 standard errors (~0.25%) of 1 / (1 + e^-x). x = 0.35 puts
 * the reduced argument near the polynomial's edge (|r| ~ ln 2 / 2). */
static void test_two_token_shares(void) {
    const float xs[] = {0.35f, 1.0f, 3.0f};
    for (int a = 0; a < 3; a++) {
        const float l[2] = {0.0f, -xs[a]};
        int cnt[2];
        sampler_params p = plain(950 + a);
        const int N = 1000000, oob = sample_counts(&p, l, 2, N, cnt);
        const double want = 1.0 / (1.0 + exp(-(double)xs[a])), got = (double)cnt[0] / N;
        const double se = sqrt(want * (1 - want) / N);
        CHECK(oob == 0 && fabs(got - want) < 5 * se, "logits 0 and -%.2f: first token's share %.5f, want %.5f +- %.5f",
              xs[a], got, want, 5 * se);
        printf("logits 0 and -%.2f: %d draws, first token's share %.5f (softmax %.5f, 5 se %.5f)\n", xs[a], N, got,
               want, 5 * se);
    }
}

/* the distribution itself: frequencies against softmax(l/T), and against a
 * wrong temperature as a control that the bound can fail */
static void test_distribution(void) {
    enum { V = 20, N = 20000 };
    float l[V];
    for (int i = 0; i < V; i++) l[i] = rnd_logit(2);
    const float ts[] = {0.5f, 1.0f, 2.0f};
    for (int a = 0; a < 3; a++) {
        sampler_params p = plain(700 + a);
        p.temp = ts[a];
        int cnt[V];
        int oob = sample_counts(&p, l, V, N, cnt);
        double q[V], w[V];
        softmax_T(l, V, ts[a], NULL, q);
        softmax_T(l, V, ts[a] * 1.3, NULL, w);
        int df, df_w;
        double chi = chi_square(cnt, q, V, N, &df), chi_w = chi_square(cnt, w, V, N, &df_w);
        CHECK(oob == 0, "T %.1f: %d draws out of range", ts[a], oob);
        CHECK(chi < chi_bound(df), "T %.1f: chi-square %.1f > %.1f (df %d)", ts[a], chi, chi_bound(df), df);
        CHECK(chi_w > chi_bound(df_w), "T %.1f: control at T*1.3 passes (chi2 %.1f): the check has no power", ts[a],
              chi_w);
        printf("softmax(l/T) at T %.1f: %d draws, chi2 %.1f (df %d, bound %.1f); vs T*1.3 chi2 %.1f (fails, as it "
               "should)\n",
               ts[a], N, chi, df, chi_bound(df), chi_w);
    }
}

/* independent penalty rules: window = the last min(len, last_n) tokens */
static void penalise_ref(float *l, int n, const int *hist, int len, int last_n, float rp, float pres, float freq) {
    int c[256] = {0};
    int from = len > last_n ? len - last_n : 0;
    for (int i = from; i < len; i++) c[hist[i]]++;
    for (int t = 0; t < n; t++) {
        if (!c[t]) continue;
        l[t] = l[t] > 0 ? l[t] / rp : l[t] * rp;
        l[t] -= (float)c[t] * freq + pres;
    }
}

static void test_penalties(void) {
    /* a hand case: window of 3 over history 0 1 5 2 2 -> {5, 2, 2} */
    {
        float l[8] = {2.0f, -2.0f, 1.0f, 3.0f, -1.0f, -1.5f, 0.5f, 0.25f};
        sampler_params p = plain(1);
        p.temp = 0.0f;
        p.repeat_penalty = 2.0f;
        p.penalty_last_n = 3;
        sampler *s = sampler_create(&p, 8);
        const int hist[] = {0, 1, 5, 2, 2};
        for (int i = 0; i < 5; i++) sampler_accept(s, hist[i]);
        int t = sampler_sample(s, l);
        /* 2 (twice in the window) is divided once; 5 (negative) is doubled; 0 and 1 left the window */
        const float want[8] = {2.0f, -2.0f, 0.5f, 3.0f, -1.0f, -3.0f, 0.5f, 0.25f};
        int bad = 0;
        for (int i = 0; i < 8; i++) bad += l[i] != want[i];
        CHECK(bad == 0 && t == 3, "repeat penalty hand case: %d logits wrong (l[2] %g l[5] %g), token %d", bad, l[2],
              l[5], t);
        sampler_free(s);

        float m[8] = {2.0f, -2.0f, 1.0f, 3.0f, -1.0f, -1.5f, 0.5f, 0.25f};
        p.repeat_penalty = 1.0f;
        p.presence_penalty = 0.5f;
        p.frequency_penalty = 0.25f;
        p.penalty_last_n = 4; /* window {1, 5, 2, 2} */
        s = sampler_create(&p, 8);
        for (int i = 0; i < 5; i++) sampler_accept(s, hist[i]);
        sampler_sample(s, m);
        /* 2: 1 - 2*0.25 - 0.5 = 0; 1: -2 - 0.25 - 0.5 = -2.75; 5: -1.5 - 0.75 = -2.25 */
        const float want2[8] = {2.0f, -2.75f, 0.0f, 3.0f, -1.0f, -2.25f, 0.5f, 0.25f};
        bad = 0;
        for (int i = 0; i < 8; i++) bad += m[i] != want2[i];
        CHECK(bad == 0, "presence/frequency hand case: %d logits wrong (l[1] %g l[2] %g l[5] %g)", bad, m[1], m[2],
              m[5]);
        sampler_free(s);
        printf("penalties, hand cases: repetition /2 and *2 once per distinct token in the last 3; "
               "presence 0.5 + frequency 0.25*count in the last 4\n");
    }
    /* random cases against penalise_ref, including a window that slides
     * and a penalty that changes the argmax */
    enum { V = 16 };
    int bad = 0, flips = 0, cases = 0;
    const int lasts[] = {0, 1, 5, 64};
    for (int trial = 0; trial < 400; trial++) {
        float l[V], ref[V];
        for (int i = 0; i < V; i++) ref[i] = l[i] = rnd_logit(3);
        int hist[120], len = (int)(rnd_u64() % 120);
        for (int i = 0; i < len; i++) hist[i] = (int)(rnd_u64() % V);
        sampler_params p = plain(trial);
        p.temp = 0.0f;
        p.penalty_last_n = lasts[trial % 4];
        p.repeat_penalty = (trial / 4) % 2 ? 1.3f : 1.0f;
        p.presence_penalty = (trial / 8) % 2 ? 0.5f : 0.0f;
        p.frequency_penalty = (trial / 16) % 2 ? 0.25f : 0.0f;
        sampler *s = sampler_create(&p, V);
        for (int i = 0; i < len; i++) sampler_accept(s, hist[i]);
        int a0 = argmax_f(l, V);
        int t = sampler_sample(s, l);
        penalise_ref(ref, V, hist, len, p.penalty_last_n, p.repeat_penalty, p.presence_penalty, p.frequency_penalty);
        int wrong = 0;
        for (int i = 0; i < V; i++) wrong += fabsf(l[i] - ref[i]) > 1e-5f * (1 + fabsf(ref[i]));
        if (wrong || t != argmax_f(ref, V)) {
            if (bad++ < 5)
                printf("  case %d (last_n %d rp %g pres %g freq %g, %d tokens): %d logits differ, token %d want %d\n",
                       trial, p.penalty_last_n, p.repeat_penalty, p.presence_penalty, p.frequency_penalty, len, wrong,
                       t, argmax_f(ref, V));
        }
        flips += t != a0;
        cases++;
        sampler_free(s);
    }
    CHECK(bad == 0, "penalties differ from the reference rules in %d of %d cases", bad, cases);
    CHECK(flips > 20, "penalties changed the greedy token in only %d cases", flips);
    printf("penalties, %d random cases (window 0/1/5/64, histories up to 119 tokens) = reference rules; "
           "argmax changed in %d\n",
           cases, flips);
}

/* sampler_top_k against a plain reference (k rounds of a linear scan for
 * the best value after the previous pick: larger first, equal values by the
 * lower id), on logits with many exact ties; and sampler_sample_top on those
 * candidates draws what sampler_sample draws from the whole logits (the
 * GPU path's promise: the same token for the same logits and seed). */
static void test_candidates(void) {
    enum { N = 3000 };
    static float l[N];
    int32_t got[64], ref[64];
    float vals[64];
    int bad_order = 0, bad_draw = 0, cases = 0;
    for (int c = 0; c < 40; c++) {
        const int n = c % 4 == 0 ? 50 : N;
        int k = 1 + (c * 7) % 64;
        if (k >= n) k = n - 1; /* top-k of the whole vocabulary is no top-k (sampler_candidates: 0) */
        for (int i = 0; i < n; i++) l[i] = (float)(rnd_u64() % (c % 2 ? 16 : 1000)) * 0.25f; /* ties */
        const int h = sampler_top_k(l, n, k, got);
        int last = -1;
        for (int j = 0; j < k; j++) { /* reference: best after `last` in the order */
            int b = -1;
            for (int i = 0; i < n; i++) {
                const int after = last < 0 || l[i] < l[last] || (l[i] == l[last] && i > last);
                if (after && (b < 0 || l[i] > l[b] || (l[i] == l[b] && i < b))) b = i;
            }
            ref[j] = b;
            last = b;
        }
        if (h != k || memcmp(got, ref, (size_t)k * sizeof(int32_t))) bad_order++;
        /* the same draw from the candidates as from the whole logits */
        sampler_params p = plain(77 + (uint64_t)c);
        p.top_k = k;
        p.top_p = c % 3 ? 0.9f : 1.0f;
        p.min_p = c % 5 ? 0.05f : 0.0f;
        sampler *a = sampler_create(&p, n), *b = sampler_create(&p, n);
        for (int d = 0; d < 50; d++) {
            for (int j = 0; j < k; j++) vals[j] = l[got[j]];
            float *cp = malloc((size_t)n * sizeof(float));
            memcpy(cp, l, (size_t)n * sizeof(float));
            const int32_t ta = sampler_sample(a, cp), tb = sampler_sample_top(b, got, vals, k);
            free(cp);
            bad_draw += ta != tb;
            cases++;
        }
        sampler_free(a), sampler_free(b);
    }
    CHECK(bad_order == 0, "sampler_top_k differs from the reference order in %d of 40 cases", bad_order);
    CHECK(bad_draw == 0, "drawing from the candidates differs from drawing from all logits in %d of %d", bad_draw,
          cases);
    /* NaNs: never candidates; every logit NaN gives a token in range, no draw from nothing */
    for (int i = 0; i < 100; i++) l[i] = i % 3 ? (float)i : NAN;
    const int h = sampler_top_k(l, 100, 40, got);
    int has_nan = 0;
    for (int j = 0; j < h; j++) has_nan |= isnan(l[got[j]]);
    CHECK(h == 40 && !has_nan && got[0] == 98, "top-k with NaNs: %d candidates, NaN among them %d, first %d", h,
          has_nan, got[0]);
    for (int i = 0; i < 100; i++) l[i] = NAN;
    sampler_params q = plain(5);
    q.top_k = 40;
    sampler *sq = sampler_create(&q, 100);
    const int32_t tq = sampler_sample(sq, l);
    q.temp = 0.0f;
    sampler *sg = sampler_create(&q, 100);
    const int32_t tg = sampler_sample(sg, l);
    CHECK(tq >= 0 && tq < 100 && tg >= 0 && tg < 100, "all-NaN logits: tokens %d (top-k) and %d (greedy)", tq, tg);
    sampler_free(sq), sampler_free(sg);
    sampler_params g = plain(1);
    sampler *s = sampler_create(&g, N);
    CHECK(sampler_candidates(s, 64) == 0, "a sampler without top-k needs every logit");
    sampler_free(s);
    g.top_k = 40;
    s = sampler_create(&g, N);
    CHECK(sampler_candidates(s, 64) == 40 && sampler_candidates(s, 32) == 0, "top-k 40: candidates %d / %d",
          sampler_candidates(s, 64), sampler_candidates(s, 32));
    sampler_free(s);
    g.temp = 0.0f;
    s = sampler_create(&g, N);
    CHECK(sampler_candidates(s, 64) == 1, "greedy needs one candidate");
    sampler_free(s);
    g.temp = 1.0f, g.repeat_penalty = 1.1f;
    s = sampler_create(&g, N);
    CHECK(sampler_candidates(s, 64) == 0, "penalties need every logit");
    sampler_free(s);
}

/* ---- sampling under a constraint (sampler_sample_checked) against masking first ---- */
static const uint8_t *g_allowed;
static int g_ok_calls, g_mask_calls;
static int ok_fn(void *ctx, int32_t t) {
    (void)ctx;
    g_ok_calls++;
    return g_allowed[t];
}
static int mask_fn(void *ctx, float *l, int n) {
    (void)ctx;
    int k = 0;
    g_mask_calls++;
    for (int i = 0; i < n; i++) {
        if (g_allowed[i]) k++;
        else l[i] = -INFINITY;
    }
    return k;
}

/* The reference: every refused logit to -inf, then the ordinary sampler. */
static int masked_draw(sampler *s, const float *l, int n) {
    float tmp[256];
    memcpy(tmp, l, (size_t)n * sizeof(float));
    mask_fn(NULL, tmp, n);
    return sampler_sample(s, tmp);
}

static int checked_draw(sampler *s, const float *l, int n) {
    float tmp[256];
    memcpy(tmp, l, (size_t)n * sizeof(float));
    return sampler_sample_checked(s, tmp, ok_fn, mask_fn, NULL);
}

static void test_checked(void) {
    enum { N = 200 };
    float l[N];
    uint8_t allowed[N];
    g_allowed = allowed;
    /* greedy and top-k: the same token as masking first, for the same seed, on random cases */
    int diff_greedy = 0, diff_topk = 0, diff_topp = 0, refused = 0;
    g_mask_calls = 0;
    for (int c = 0; c < 300; c++) {
        for (int i = 0; i < N; i++) {
            l[i] = rnd_logit(8);
            allowed[i] = rnd_unit() < (c % 3 == 0 ? 0.02 : c % 3 == 1 ? 0.3 : 0.9);
        }
        allowed[(int)(rnd_unit() * N)] = 1;
        sampler_params g = plain(c), k = plain(c), t = plain(c);
        g.temp = 0;
        k.top_k = 1 + c % 20;
        t.top_p = 0.8f;
        t.min_p = 0.05f;
        sampler *a = sampler_create(&g, N), *b = sampler_create(&g, N);
        diff_greedy += checked_draw(a, l, N) != masked_draw(b, l, N);
        sampler_free(a);
        sampler_free(b);
        a = sampler_create(&k, N), b = sampler_create(&k, N);
        int x = checked_draw(a, l, N), y = masked_draw(b, l, N);
        diff_topk += x != y;
        refused += !allowed[x];
        sampler_free(a);
        sampler_free(b);
        a = sampler_create(&t, N), b = sampler_create(&t, N);
        x = checked_draw(a, l, N);
        diff_topp += x != masked_draw(b, l, N);
        refused += !allowed[x];
        sampler_free(a);
        sampler_free(b);
    }
    CHECK(diff_greedy == 0 && diff_topk == 0 && diff_topp == 0 && refused == 0,
          "greedy %d, top-k %d, top-p/min-p %d differ from masking first; %d refused tokens drawn", diff_greedy,
          diff_topk, diff_topp, refused);
    printf("checked sampling: 300 cases each of greedy, top-k and top-p+min-p give masking's token for the seed\n");
    /* plain temperature: the same distribution (chi-square against the masked softmax), while masking
     * only when the first draw is refused */
    for (int i = 0; i < N; i++) {
        l[i] = rnd_logit(3);
        allowed[i] = rnd_unit() < 0.5;
    }
    sampler_params p = plain(99);
    p.temp = 0.9f;
    sampler *s = sampler_create(&p, N);
    int cnt[N] = {0}, total = 40000, keep[N];
    g_mask_calls = 0;
    for (int d = 0; d < total; d++) cnt[checked_draw(s, l, N)]++;
    int masks = g_mask_calls;
    sampler_free(s);
    double prob[N], z = 0, all[N];
    for (int i = 0; i < N; i++) keep[i] = allowed[i];
    softmax_T(l, N, 0.9, keep, prob);
    softmax_T(l, N, 0.9, NULL, all);
    for (int i = 0; i < N; i++) z += allowed[i] ? all[i] : 0;
    int df;
    double chi = chi_square(cnt, prob, N, total, &df);
    CHECK(chi < chi_bound(df), "temperature draws: chi-square %.1f over %d df (bound %.1f)", chi, df, chi_bound(df));
    /* the mask runs exactly when the first draw is refused: about (1 - Z) of the draws */
    double want = (1 - z) * total;
    CHECK(fabs(masks - want) < 5 * sqrt(want * z) + 10, "%d masks for %.0f expected", masks, want);
    printf("checked sampling: 40k temperature draws match the masked softmax (chi-square %.1f, %d df); masked "
           "%d times (1 - Z = %.2f)\n",
           chi, df, masks, 1 - z);
}

/* ---- llama-server's samplers: logit bias, typical, DRY, the order ---- */

/* The test's own DRY, straight from the definition (O(n^2)): for each earlier
 * position j of the window h[0..n) (h[n-1] the last token), the longest
 * common suffix of h[0..j] and h[0..n), at most the tokens after the last
 * breaker; the token h[j+1] would extend it. */
static void dry_ref(float *l, int nv, const int *h, int n, const uint8_t *brk, float mult, float base, int allowed) {
    if (n <= allowed) return;
    int limit = n;
    for (int i = n - 1; i >= 0; i--)
        if (brk && brk[h[i]]) {
            limit = n - 1 - i;
            break;
        }
    if (limit < allowed) return;
    int best[256];
    for (int t = 0; t < nv; t++) best[t] = -1;
    for (int j = 0; j + 1 < n; j++) {
        int m = 0;
        while (m <= j && h[j - m] == h[n - 1 - m]) m++;
        if (m > limit) m = limit;
        if (m >= allowed && m > best[h[j + 1]]) best[h[j + 1]] = m;
    }
    for (int t = 0; t < nv; t++)
        if (best[t] >= 0 && !(brk && brk[t])) l[t] -= (float)(mult * pow(base, best[t] - allowed));
}

static void test_logit_bias(void) {
    enum { N = 60 };
    float l[N], b[N];
    int32_t ids[8];
    float vals[8];
    int diff = 0;
    for (int c = 0; c < 200; c++) {
        for (int i = 0; i < N; i++) l[i] = b[i] = rnd_logit(4);
        for (int k = 0; k < 8; k++) {
            ids[k] = (int32_t)(rnd_unit() * N);
            vals[k] = k == 0 ? -INFINITY : rnd_logit(6);
            b[ids[k]] += vals[k]; /* a token named twice gets both */
        }
        sampler_params p = plain(c);
        p.temp = 0;
        p.n_bias = 8;
        p.bias_ids = ids;
        p.bias_vals = vals;
        sampler *s = sampler_create(&p, N);
        diff += draw(s, l, N) != argmax_f(b, N);
        CHECK(sampler_candidates(s, 64) == 0, "a bias needs every logit");
        sampler_free(s);
    }
    CHECK(diff == 0, "greedy with a bias: %d of 200 not the argmax of logits + bias", diff);
    /* the distribution at T 1.3: softmax of the biased logits, the banned token never drawn */
    for (int i = 0; i < N; i++) l[i] = b[i] = rnd_logit(2);
    ids[0] = argmax_f(l, N);
    vals[0] = -INFINITY;
    ids[1] = 5;
    vals[1] = 3.0f;
    b[ids[0]] = -INFINITY;
    b[5] += 3.0f;
    sampler_params p = plain(42);
    p.temp = 1.3f;
    p.n_bias = 2;
    p.bias_ids = ids;
    p.bias_vals = vals;
    int keep[N];
    for (int i = 0; i < N; i++) keep[i] = i != ids[0];
    int cnt[256];
    sample_counts(&p, l, N, 20000, cnt);
    double q[256];
    softmax_T(b, N, 1.3, keep, q);
    int df;
    double chi = chi_square(cnt, q, N, 20000, &df);
    CHECK(cnt[ids[0]] == 0 && chi < chi_bound(df), "bias draws: banned drawn %d times, chi-square %.1f (bound %.1f)",
          cnt[ids[0]], chi, chi_bound(df));
    printf("logit bias: greedy = argmax(l + bias) on 200 cases; 20k draws follow softmax(l + bias) (chi2 %.1f, df %d), "
           "the banned token never\n",
           chi, df);
}

/* typical's kept set from the definition, in double */
static void mark_typical(const float *l, int n, double tp, int *keep) {
    double p[256], h = 0, sh[256];
    softmax_T(l, n, 1.0, NULL, p);
    for (int i = 0; i < n; i++) h -= p[i] > 0 ? p[i] * log(p[i]) : 0;
    for (int i = 0; i < n; i++) sh[i] = fabs(-log(p[i]) - h);
    memset(keep, 0, (size_t)n * sizeof(int));
    double cum = 0;
    for (int k = 0; k < n; k++) {
        int b = -1;
        for (int i = 0; i < n; i++)
            if (!keep[i] && (b < 0 || sh[i] < sh[b])) b = i;
        keep[b] = 1;
        cum += p[b];
        if (cum > tp) break;
    }
}

static void test_typical(void) {
    enum { N = 40 };
    float l[N];
    int keep[N];
    for (int c = 0; c < 3; c++) {
        for (int i = 0; i < N; i++) l[i] = rnd_logit(3);
        double tp = c == 0 ? 0.3 : c == 1 ? 0.6 : 0.9;
        mark_typical(l, N, tp, keep);
        sampler_params p = plain(100 + c);
        p.typical_p = (float)tp;
        char what[64];
        snprintf(what, sizeof what, "typical_p %.1f", tp);
        check_support(what, &p, l, N, keep, 20000);
    }
    /* typical_p 1: the same draws as without it */
    for (int i = 0; i < N; i++) l[i] = rnd_logit(3);
    for (int off = 0; off < 2; off++) { /* 1 and 0 (a zeroed field) are both off */
        sampler_params a = plain(5), b = plain(5);
        b.typical_p = off ? 0.0f : 1.0f;
        sampler *x = sampler_create(&a, N), *y = sampler_create(&b, N);
        int same = 0;
        for (int d = 0; d < 500; d++) same += draw(x, l, N) == draw(y, l, N);
        CHECK(same == 500, "typical_p %g changed %d of 500 draws", b.typical_p, 500 - same);
        sampler_free(x);
        sampler_free(y);
    }
}

static void test_dry(void) {
    enum { N = 12 };
    int diff = 0, penalised = 0;
    uint8_t brk[N] = {0};
    brk[11] = 1;
    for (int c = 0; c < 400; c++) {
        int n = 2 + (int)(rnd_unit() * 60), win = c % 2 ? 64 : 20, h[128];
        int vocab_used = c % 3 == 0 ? 3 : 8; /* few distinct tokens: long repeats */
        for (int i = 0; i < n; i++) h[i] = rnd_unit() < 0.05 ? 11 : (int)(rnd_unit() * vocab_used);
        float l[N], ref[N], orig[N];
        for (int i = 0; i < N; i++) l[i] = ref[i] = orig[i] = rnd_logit(4);
        sampler_params p = plain(c);
        p.temp = 0;
        p.dry_multiplier = 0.5f + (float)(c % 3);
        p.dry_base = c % 4 == 0 ? 1.0f : 1.75f;
        p.dry_allowed_length = c % 5;
        p.dry_penalty_last_n = win;
        p.dry_breaker = c % 2 ? brk : NULL;
        sampler *s = sampler_create(&p, N);
        for (int i = 0; i < n; i++) sampler_accept(s, h[i]);
        int w = n < win ? n : win;
        dry_ref(ref, N, h + n - w, w, p.dry_breaker, p.dry_multiplier, p.dry_base, p.dry_allowed_length);
        sampler_sample(s, l); /* greedy: DRY applied to l in place */
        for (int i = 0; i < N; i++) {
            diff += fabsf(l[i] - ref[i]) > 1e-4f * (1 + fabsf(ref[i]));
            penalised += ref[i] != orig[i];
        }
        sampler_free(s);
    }
    CHECK(diff == 0, "DRY: %d logits differ from the reference", diff);
    /* a loop a b c a b c ... : the token that would continue it is penalised, growing with the repeat */
    sampler_params p = plain(1);
    p.temp = 0;
    p.dry_multiplier = 1.0f;
    p.dry_penalty_last_n = 64;
    sampler *s = sampler_create(&p, N);
    for (int i = 0; i < 9; i++) sampler_accept(s, i % 3);
    float l[N] = {0};
    sampler_sample(s, l);
    /* the context a b c a b c a b c ends with a copy of its first 6 tokens, which a follows: a would make
     * a repeat of 6, penalised 1.75^(6 - 2) */
    float want = -(float)pow(1.75, 6 - 2);
    CHECK(fabsf(l[0] - want) < 1e-4f && l[1] == 0 && l[2] == 0, "loop: penalties %g %g %g, want %g 0 0", l[0], l[1],
          l[2], want);
    sampler_free(s);
    printf("DRY: 400 random windows (breakers, bases 1 and 1.75, allowed 0-4) equal the O(n^2) reference (%d "
           "logits penalised); a loop of 9 penalises its next token by %.2f\n",
           penalised, -want);
}

static void test_order(void) {
    enum { N = 40 };
    float l[N];
    int keep[N];
    for (int i = 0; i < N; i++) l[i] = rnd_logit(3);
    /* the default order spelled out: the same draws */
    sampler_params a = plain(9), b = plain(9);
    a.top_k = b.top_k = 20;
    a.top_p = b.top_p = 0.8f;
    a.min_p = b.min_p = 0.02f;
    a.temp = b.temp = 1.4f;
    const uint8_t def[] = {SMP_PENALTIES, SMP_DRY, SMP_TOP_K, SMP_TYPICAL, SMP_TEMP, SMP_TOP_P, SMP_MIN_P};
    memcpy(b.order, def, sizeof def);
    b.n_order = (int)sizeof def;
    sampler *x = sampler_create(&a, N), *y = sampler_create(&b, N);
    int same = 0;
    for (int d = 0; d < 500; d++) same += draw(x, l, N) == draw(y, l, N);
    CHECK(same == 500, "the default order spelled out changed %d of 500 draws", 500 - same);
    sampler_free(x);
    sampler_free(y);
    /* top_p before the temperature (llama.cpp's default): its cut is on softmax(l), then the draw at T */
    sampler_params c = plain(10);
    c.temp = 3.0f;
    c.top_p = 0.5f;
    const uint8_t tp_first[] = {SMP_TOP_P, SMP_TEMP};
    memcpy(c.order, tp_first, sizeof tp_first);
    c.n_order = 2;
    double q[N];
    softmax_T(l, N, 1.0, NULL, q);
    int idx[N];
    for (int i = 0; i < N; i++) idx[i] = i;
    for (int i = 0; i < N; i++) /* sort by logit (selection) */
        for (int j = i + 1; j < N; j++)
            if (l[idx[j]] > l[idx[i]]) {
                int t = idx[i];
                idx[i] = idx[j];
                idx[j] = t;
            }
    memset(keep, 0, sizeof keep);
    double cum = 0;
    for (int i = 0; i < N; i++) {
        keep[idx[i]] = 1;
        cum += q[idx[i]];
        if (cum >= 0.5) break;
    }
    check_support("top_p 0.5 then temperature 3", &c, l, N, keep, 20000);
    /* temperature left out of the order: the draw is at temperature 1 */
    sampler_params d = plain(11);
    d.temp = 0.2f;
    const uint8_t no_temp[] = {SMP_TOP_K};
    memcpy(d.order, no_temp, 1);
    d.n_order = 1;
    for (int i = 0; i < N; i++) keep[i] = 1;
    d.temp = 1.0f; /* check_support's reference temperature */
    sampler_params d2 = d;
    d2.temp = 0.2f;
    int cnt[256];
    sample_counts(&d2, l, N, 20000, cnt);
    softmax_T(l, N, 1.0, NULL, q);
    int df;
    double chi = chi_square(cnt, q, N, 20000, &df);
    CHECK(chi < chi_bound(df), "no temperature step: chi-square %.1f (bound %.1f)", chi, chi_bound(df));
    CHECK(sampler_kind_from_name("top_k") == SMP_TOP_K && sampler_kind_from_name("top-k") == SMP_TOP_K &&
              sampler_kind_from_name("topk") == SMP_TOP_K && sampler_kind_from_name("typ_p") == SMP_TYPICAL &&
              sampler_kind_from_name("nucleus") == SMP_TOP_P && sampler_kind_from_name("temp") == SMP_TEMP &&
              sampler_kind_from_name("xtc") == -2 && sampler_kind_from_name("infill") == -3 &&
              sampler_kind_from_name("bogus") == -1 && sampler_kind_from_name("top-_k") == -1,
          "sampler names");
    printf("order: the default spelled out is the same; top_p before temperature cuts on softmax(l); no "
           "temperature step draws at 1 (chi2 %.1f); names and aliases\n",
           chi);
}

/* the constrained sampler with the new samplers: the same token as masking first */
static void test_checked_new(void) {
    enum { N = 200 };
    float l[N];
    uint8_t allowed[N], brk[N] = {0};
    g_allowed = allowed;
    brk[3] = 1;
    int diff = 0, refused = 0;
    for (int c = 0; c < 300; c++) {
        for (int i = 0; i < N; i++) {
            l[i] = rnd_logit(8);
            allowed[i] = rnd_unit() < (c % 3 == 0 ? 0.02 : c % 3 == 1 ? 0.3 : 0.9);
        }
        allowed[(int)(rnd_unit() * N)] = 1;
        int32_t ids[3] = {(int32_t)(rnd_unit() * N), (int32_t)(rnd_unit() * N), argmax_f(l, N)};
        float vals[3] = {5, -INFINITY, -INFINITY};
        sampler_params p = plain(c);
        p.temp = c % 4 == 0 ? 0 : 0.9f;
        p.top_k = c % 5 == 0 ? 10 : 0;
        /* (typical off and no top-k would be the one-draw shortcut: the same distribution, another token
         * for the seed, which test_checked measures) */
        p.typical_p = c % 5 == 0 ? 1.0f : 0.7f;
        p.n_bias = 3;
        p.bias_ids = ids;
        p.bias_vals = vals;
        p.dry_multiplier = 0.8f;
        p.dry_penalty_last_n = 32;
        p.dry_breaker = brk;
        if (c % 7 == 0) { /* penalties after a cut */
            const uint8_t o[] = {SMP_TOP_K, SMP_PENALTIES, SMP_DRY, SMP_TEMP, SMP_TYPICAL};
            memcpy(p.order, o, sizeof o);
            p.n_order = (int)sizeof o;
            p.repeat_penalty = 1.3f;
        }
        sampler *a = sampler_create(&p, N), *b = sampler_create(&p, N);
        for (int i = 0; i < 30; i++) {
            int t = (int)(rnd_unit() * 6);
            sampler_accept(a, t);
            sampler_accept(b, t);
        }
        int x = checked_draw(a, l, N), y = masked_draw(b, l, N);
        diff += x != y;
        refused += x >= 0 && !allowed[x];
        sampler_free(a);
        sampler_free(b);
    }
    CHECK(diff == 0 && refused == 0, "with bias, typical, DRY: %d differ from masking first, %d refused drawn", diff,
          refused);
    printf("checked sampling with logit bias, typical_p, DRY and a custom order: 300 cases give masking's token\n");
}

int main(void) {
    test_greedy();
    test_tiny_temp_and_topk1();
    test_seed_and_reset();
    test_top_k();
    test_top_p();
    test_top_p_large();
    test_min_p();
    test_distribution();
    test_distribution_wide();
    test_two_token_shares();
    test_penalties();
    test_candidates();
    test_checked();
    test_logit_bias();
    test_typical();
    test_dry();
    test_order();
    test_checked_new();
    return check_report("sampler");
}
