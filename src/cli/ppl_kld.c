/* llama.cpp's KL-divergence base file and statistics (format in ppl_kld.h).
 *
 * The file stores log-probabilities, not logits, as 16-bit steps of 1/65535
 * of a range of at most 16 nats below the top; that is lossy, so comparing a
 * run with its own file gives a KLD of order 1e-7, not 0. The statistics
 * follow llama.cpp's definitions and float/double mix (tools/perplexity,
 * b11434) so that both programs print the same numbers for the same logits:
 *   - KLD(base || this) = sum over tokens whose base log-probability is above
 *     -16 of p_base * (log p_base - log p), per position, then averaged;
 *   - "same top" compares the first argmax of this run's logits with the
 *     first argmax of the stored base log-probabilities;
 *   - delta-p = p(next token) here minus in the base;
 *   - uncertainties are sqrt(var / (n - 1)), and 0 for 10 positions or fewer.
 * One deliberate difference: a quantized value that rounds past 65535 (only
 * possible from float rounding at the top logit) is clamped, where llama.cpp
 * would wrap it to 0. */
#include "cli/ppl_kld.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "core/alloc.h"
#include "core/log.h"

_Static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "the base file is little-endian; add byte swaps");

#define KLD_MAGIC        "_logits_"
#define KLD_HEADER_BYTES (8 + 3 * 4)

/* One row: logits of one position -> scale, min log-prob, uint16 steps. */
static void quantize_row(const float *l, int n_vocab, uint16_t *out) {
    float mx = l[0], mn = l[0];
    for (int i = 1; i < n_vocab; i++) {
        mx = fmaxf(mx, l[i]);
        mn = fminf(mn, l[i]);
    }
    mn = fmaxf(mn, mx - 16); /* everything 16 nats below the top is stored as the floor */
    double se = 0;
    for (int i = 0; i < n_vocab; i++) se += expf(l[i] - mx);
    float lse = (float)log(se);
    float min_lp = mn - mx - lse, scale = (mx - mn) / 65535.f;
    memcpy(out, &scale, sizeof scale);
    memcpy(out + 2, &min_lp, sizeof min_lp);
    uint16_t *q = out + 4;
    if (scale > 0) {
        float inv = 1 / scale;
        for (int i = 0; i < n_vocab; i++) {
            long v = l[i] > mn ? lrintf(inv * (l[i] - mn)) : 0; /* round half to even, as llama.cpp */
            q[i] = (uint16_t)(v < 0 ? 0 : v > 65535 ? 65535 : v);
        }
    } else memset(q, 0, (size_t)n_vocab * sizeof *q); /* a flat row */
    if (n_vocab & 1) q[n_vocab] = 0;
}

static int write_all(kld_file *k, const void *p, size_t n) {
    if (fwrite(p, 1, n, k->f) == n) return 0;
    st_error_set("cannot write the KL-divergence base file '%s'", k->path);
    return -1;
}

int kld_create(kld_file *k, const char *path, int n_ctx, int n_vocab, int n_chunk, const int32_t *tokens) {
    memset(k, 0, sizeof *k);
    k->path = path;
    k->n_ctx = n_ctx;
    k->n_vocab = n_vocab;
    k->n_chunk = n_chunk;
    if (!(k->f = fopen(path, "wb"))) {
        st_error_set("cannot create the KL-divergence base file '%s'", path);
        return -1;
    }
    int32_t hdr[3] = {n_ctx, n_vocab, n_chunk};
    if (write_all(k, KLD_MAGIC, 8) || write_all(k, hdr, sizeof hdr) ||
        write_all(k, tokens, (size_t)n_chunk * n_ctx * sizeof(int32_t)))
        return -1;
    k->row = st_malloc((size_t)kld_rows_per_chunk(n_ctx) * kld_row_u16(n_vocab) * sizeof(uint16_t));
    return 0;
}

int kld_write_chunk(kld_file *k, const float *logits) {
    int rows = kld_rows_per_chunk(k->n_ctx);
    int64_t nv = kld_row_u16(k->n_vocab);
    for (int r = 0; r < rows; r++) quantize_row(logits + (size_t)r * k->n_vocab, k->n_vocab, k->row + r * nv);
    return write_all(k, k->row, (size_t)rows * nv * sizeof(uint16_t));
}

int kld_open(kld_file *k, const char *path) {
    memset(k, 0, sizeof *k);
    k->path = path;
    if (!(k->f = fopen(path, "rb"))) {
        st_error_set("cannot open the KL-divergence base file '%s'", path);
        return -1;
    }
    char magic[8];
    int32_t hdr[3];
    if (fread(magic, 1, 8, k->f) != 8 || memcmp(magic, KLD_MAGIC, 8)) {
        st_error_set("'%s' is not a llama.cpp KL-divergence base file (it does not start with \"%s\")", path,
                     KLD_MAGIC);
        return -1;
    }
    if (fread(hdr, sizeof hdr, 1, k->f) != 1) {
        st_error_set("'%s' is truncated: it ends inside the header", path);
        return -1;
    }
    k->n_ctx = hdr[0];
    k->n_vocab = hdr[1];
    k->n_chunk = hdr[2];
    if (k->n_ctx < 3 || k->n_ctx > (1 << 24) || k->n_vocab < 2 || k->n_vocab > (1 << 26) || k->n_chunk < 1 ||
        k->n_chunk > (1 << 30)) {
        st_error_set("'%s' has an impossible header: ctx %d, vocab %d, %d chunks", path, k->n_ctx, k->n_vocab,
                     k->n_chunk);
        return -1;
    }
    /* The whole size from the header, in 64 bits: at most 2^30 * 2^24 * 2^27 bytes
     * would overflow, so check each product. */
    int64_t n_tok, rows, body, want;
    if (__builtin_mul_overflow((int64_t)k->n_chunk, (int64_t)k->n_ctx, &n_tok) ||
        __builtin_mul_overflow((int64_t)k->n_chunk, (int64_t)kld_rows_per_chunk(k->n_ctx), &rows) ||
        __builtin_mul_overflow(rows, kld_row_u16(k->n_vocab) * 2, &body) ||
        __builtin_add_overflow(body, KLD_HEADER_BYTES + 4 * n_tok, &want)) {
        st_error_set("'%s' has an impossible header: ctx %d, vocab %d, %d chunks", path, k->n_ctx, k->n_vocab,
                     k->n_chunk);
        return -1;
    }
    struct stat st;
    if (fstat(fileno(k->f), &st) || (int64_t)st.st_size != want) {
        st_error_set("'%s' has %lld bytes, but its header (ctx %d, vocab %d, %d chunks) implies %lld: %s", path,
                     (long long)st.st_size, k->n_ctx, k->n_vocab, k->n_chunk, (long long)want,
                     (int64_t)st.st_size < want ? "truncated" : "trailing bytes");
        return -1;
    }
    k->tokens = st_malloc((size_t)n_tok * sizeof(int32_t));
    if (fread(k->tokens, sizeof(int32_t), (size_t)n_tok, k->f) != (size_t)n_tok) {
        st_error_set("cannot read the tokens of '%s'", path);
        return -1;
    }
    for (int64_t i = 0; i < n_tok; i++)
        if (k->tokens[i] < 0 || k->tokens[i] >= k->n_vocab) {
            st_error_set("'%s': token %d at position %lld is outside its vocabulary of %d", path, k->tokens[i],
                         (long long)i, k->n_vocab);
            return -1;
        }
    k->row = st_malloc((size_t)kld_rows_per_chunk(k->n_ctx) * kld_row_u16(k->n_vocab) * sizeof(uint16_t));
    return 0;
}

int kld_read_chunk(kld_file *k) {
    size_t n = (size_t)kld_rows_per_chunk(k->n_ctx) * kld_row_u16(k->n_vocab);
    if (fread(k->row, sizeof(uint16_t), n, k->f) == n) return 0;
    st_error_set("cannot read a chunk of '%s'", k->path);
    return -1;
}

int kld_close(kld_file *k) {
    int rc = 0;
    if (k->f && fclose(k->f)) {
        st_error_set("cannot write the KL-divergence base file '%s'", k->path);
        rc = -1;
    }
    st_free(k->tokens);
    st_free(k->row);
    memset(k, 0, sizeof *k);
    return rc;
}

void kld_stats_init(kld_stats *s, int64_t cap) {
    memset(s, 0, sizeof *s);
    s->cap = cap;
    s->kld_values = st_malloc((size_t)cap * sizeof(float));
    s->p_diff_values = st_malloc((size_t)cap * sizeof(float));
}

void kld_stats_free(kld_stats *s) {
    st_free(s->kld_values);
    st_free(s->p_diff_values);
    memset(s, 0, sizeof *s);
}

/* One position. The float/double split follows llama.cpp so that the same
 * logits give the same sums to the last digits it prints. */
static void stats_row(kld_stats *s, const float *l, int n_vocab, const uint16_t *row, int tok) {
    float mx = l[0];
    int imax = 0;
    for (int i = 1; i < n_vocab; i++)
        if (l[i] > mx) {
            mx = l[i];
            imax = i;
        }
    double se = 0;
    for (int i = 0; i < n_vocab; i++) se += expf(l[i] - mx);
    float lse = (float)log(se);
    float scale, min_lp;
    memcpy(&scale, row, sizeof scale);
    memcpy(&min_lp, row + 2, sizeof min_lp);
    const uint16_t *q = row + 4;

    float nll = mx + lse - l[tok];
    float nll_base = -(scale * q[tok] + min_lp);
    s->sum_nll += nll;
    s->sum_nll2 += nll * nll;
    s->sum_nll_base += nll_base;
    s->sum_nll_base2 += nll_base * nll_base;
    s->sum_nll_nll_base += nll * nll_base;

    float log_norm = mx + lse; /* log p_i = l_i - log_norm */
    double kld = 0;
    int imax_base = 0;
    float lpb_max = 0;
    for (int i = 0; i < n_vocab; i++) {
        float lpb = scale * q[i] + min_lp;
        if (i == 0 || lpb > lpb_max) {
            lpb_max = lpb;
            imax_base = i;
        }
        if (lpb > -16.f) kld += expf(lpb) * (lpb - l[i] + log_norm);
    }
    s->sum_kld += kld;
    s->sum_kld2 += kld * kld;
    s->n_same_top += imax == imax_base;

    float p_diff = expf(-nll) - expf(-nll_base);
    double d2 = p_diff * p_diff; /* a float product, as llama.cpp */
    s->sum_p_diff += p_diff;
    s->sum_p_diff2 += d2;
    s->sum_p_diff4 += d2 * d2;
    s->max_p_diff = fmaxf(s->max_p_diff, fabsf(p_diff));
    if (s->count < s->cap) {
        s->kld_values[s->count] = (float)kld;
        s->p_diff_values[s->count] = p_diff;
    }
    s->count++;
}

void kld_stats_chunk(kld_stats *s, const float *logits, const kld_file *k, const int32_t *next) {
    int rows = kld_rows_per_chunk(k->n_ctx);
    int64_t nv = kld_row_u16(k->n_vocab);
    for (int r = 0; r < rows; r++) stats_row(s, logits + (size_t)r * k->n_vocab, k->n_vocab, k->row + r * nv, next[r]);
}

/* Mean of a sum over n, and its standard error (0 for 10 or fewer). */
static void mean_unc(double sum, double sum2, int64_t n, double *mean, double *unc) {
    *mean = *unc = 0;
    if (n < 1) return;
    *mean = sum / n;
    double var = sum2 / n - *mean * *mean;
    *unc = var > 0 && n > 10 ? sqrt(var / (n - 1)) : 0;
}

static double covariance(double sa, double sb, double sab, int64_t n) {
    if (n < 10) return 0;
    return (sab / n - (sa / n) * (sb / n)) / (n - 1);
}

void kld_print_header(FILE *out) {
    fprintf(out, "chunk             PPL               ln(PPL(Q)/PPL(base))          KL Divergence              "
                 "\xce\x94p RMS            Same top p\n");
}

/* The figures every chunk line and the summary share. */
typedef struct {
    double lp, lp_unc, lpb, lpb_unc, cov, ratio, ratio_unc, kld, kld_unc, rms, rms_unc, top, top_unc;
} kld_fig;

static kld_fig figures(const kld_stats *s) {
    kld_fig f;
    double mse, mse_unc;
    mean_unc(s->sum_nll, s->sum_nll2, s->count, &f.lp, &f.lp_unc);
    mean_unc(s->sum_nll_base, s->sum_nll_base2, s->count, &f.lpb, &f.lpb_unc);
    f.cov = covariance(s->sum_nll, s->sum_nll_base, s->sum_nll_nll_base, s->count);
    f.ratio = f.lp - f.lpb;
    f.ratio_unc = sqrt(f.lp_unc * f.lp_unc + f.lpb_unc * f.lpb_unc - 2 * f.cov);
    mean_unc(s->sum_kld, s->sum_kld2, s->count, &f.kld, &f.kld_unc);
    mean_unc(s->sum_p_diff2, s->sum_p_diff4, s->count, &mse, &mse_unc);
    f.rms = sqrt(mse);
    f.rms_unc = 0.5 / f.rms * mse_unc;
    f.top = (double)s->n_same_top / s->count;
    f.top_unc = sqrt(f.top * (1 - f.top) / (s->count - 1));
    return f;
}

void kld_print_chunk(FILE *out, const kld_stats *s, int64_t chunk) {
    kld_fig f = figures(s);
    double ppl = exp(f.lp);
    fprintf(
        out,
        "%4lld    %9.4f \xc2\xb1 %9.4f    %10.5f \xc2\xb1 %10.5f    %10.5f \xc2\xb1 %10.5f    %6.3f \xc2\xb1 %6.3f %%"
        "    %6.3f \xc2\xb1 %6.3f %%\n",
        (long long)chunk, ppl, ppl * f.lp_unc, f.ratio, f.ratio_unc, f.kld, f.kld_unc, 100 * f.rms, 100 * f.rms_unc,
        100 * f.top, 100 * f.top_unc);
}

static int cmp_float(const void *a, const void *b) {
    float x = *(const float *)a, y = *(const float *)b;
    return (x > y) - (x < y);
}

/* Linear interpolation between the two nearest sorted values, as llama.cpp. */
static float percentile(const float *v, int64_t n, float frac) {
    if (frac <= 0) return v[0];
    if (frac >= 1) return v[n - 1];
    float p = frac * (float)(n - 1);
    int64_t ip = (int64_t)p;
    p -= (float)ip;
    return (1 - p) * v[ip] + p * v[ip + 1 < n ? ip + 1 : n - 1];
}

static float median(const float *v, int64_t n) { return n % 2 ? v[n / 2] : 0.5f * (v[n / 2] + v[n / 2 - 1]); }

void kld_print_summary(FILE *out, kld_stats *s) {
    if (s->count < 100) return; /* llama.cpp prints no statistics for so few positions */
    int64_t n = s->count < s->cap ? s->count : s->cap;
    qsort(s->kld_values, (size_t)n, sizeof(float), cmp_float);
    qsort(s->p_diff_values, (size_t)n, sizeof(float), cmp_float);
    kld_fig f = figures(s);
    double ppl = exp(f.lp), pplb = exp(f.lpb), ppl_unc = ppl * f.lp_unc, pplb_unc = pplb * f.lpb_unc;
    double ratio = exp(f.ratio), pcov = ppl * pplb * f.cov;
    fprintf(out, "====== Perplexity statistics ======\n");
    fprintf(out, "Mean PPL(Q)                   : %10.6f \xc2\xb1 %10.6f\n", ppl, ppl_unc);
    fprintf(out, "Mean PPL(base)                : %10.6f \xc2\xb1 %10.6f\n", pplb, pplb_unc);
    fprintf(out, "Cor(ln(PPL(Q)), ln(PPL(base))): %6.2f%%\n", 100 * f.cov / (f.lp_unc * f.lpb_unc));
    fprintf(out, "Mean ln(PPL(Q)/PPL(base))     : %10.6f \xc2\xb1 %10.6f\n", f.ratio, f.ratio_unc);
    fprintf(out, "Mean PPL(Q)/PPL(base)         : %10.6f \xc2\xb1 %10.6f\n", ratio, ratio * f.ratio_unc);
    fprintf(out, "Mean PPL(Q)-PPL(base)         : %10.6f \xc2\xb1 %10.6f\n", ppl - pplb,
            sqrt(ppl_unc * ppl_unc + pplb_unc * pplb_unc - 2 * pcov));
    fprintf(out, "\n====== KL divergence statistics ======\n");
    fprintf(out, "Mean    KLD: %10.6f \xc2\xb1 %10.6f\n", f.kld, f.kld_unc);
    static const struct {
        const char *name;
        float frac;
    } kq[] = {{"99.9%  ", 0.999f}, {"99.0%  ", 0.99f}, {"95.0%  ", 0.95f}, {"90.0%  ", 0.9f},  {NULL, 0.5f},
              {"10.0%  ", 0.1f},   {" 5.0%  ", 0.05f}, {" 1.0%  ", 0.01f}, {" 0.1%  ", 0.001f}};
    const float *kv = s->kld_values, *pv = s->p_diff_values;
    fprintf(out, "Maximum KLD: %10.6f\n", kv[n - 1]);
    for (size_t i = 0; i < sizeof kq / sizeof kq[0]; i++)
        if (kq[i].name) fprintf(out, "%s KLD: %10.6f\n", kq[i].name, percentile(kv, n, kq[i].frac));
        else fprintf(out, "Median  KLD: %10.6f\n", median(kv, n));
    fprintf(out, "Minimum KLD: %10.6f\n", kv[0]);
    double pd, pd_unc;
    mean_unc(s->sum_p_diff, s->sum_p_diff2, s->count, &pd, &pd_unc);
    fprintf(out, "\n====== Token probability statistics ======\n");
    fprintf(out, "Mean    \xce\x94p: %6.3f \xc2\xb1 %5.3f %%\n", 100 * pd, 100 * pd_unc);
    static const struct {
        const char *name;
        float frac;
    } pq[] = {{"99.9%  ", 0.999f}, {"99.0%  ", 0.99f}, {"95.0%  ", 0.95f}, {"90.0%  ", 0.9f},
              {"75.0%  ", 0.75f},  {NULL, 0.5f},       {"25.0%  ", 0.25f}, {"10.0%  ", 0.1f},
              {" 5.0%  ", 0.05f},  {" 1.0%  ", 0.01f}, {" 0.1%  ", 0.001f}};
    fprintf(out, "Maximum \xce\x94p: %6.3f%%\n", 100.0 * pv[n - 1]);
    for (size_t i = 0; i < sizeof pq / sizeof pq[0]; i++)
        if (pq[i].name) fprintf(out, "%s \xce\x94p: %6.3f%%\n", pq[i].name, 100.0 * percentile(pv, n, pq[i].frac));
        else fprintf(out, "Median  \xce\x94p: %6.3f%%\n", 100.0 * median(pv, n));
    fprintf(out, "Minimum \xce\x94p: %6.3f%%\n", 100.0 * pv[0]);
    fprintf(out, "RMS \xce\x94p    : %6.3f \xc2\xb1 %5.3f %%\n", 100 * f.rms, 100 * f.rms_unc);
    fprintf(out, "Same top p: %6.3f \xc2\xb1 %5.3f %%\n", 100 * f.top, 100 * f.top_unc);
}
