/* The GEMM tuning table (tune_table.h): in-memory entries, the text format,
 * and the check that a table belongs to this card's architecture and this
 * cuBLASLt version. No GPU toolkit here: it builds and is tested anywhere.
 *
 * The parser is strict on purpose: a table is written by `strata tune`, so a
 * line that does not read back exactly is damage (a truncated write, a hand
 * edit gone wrong), and running a damaged algorithm descriptor is worse than
 * running none. The whole table is then refused, naming the line.
 */
#include "backend/cuda/tune/tune_table.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/alloc.h"
#include "core/log.h"

#define TUNE_MAGIC    "strata-tune v1"
#define TUNE_FIELDS   (7 + TUNE_ALGO_WORDS)
#define TUNE_MAX_FILE ((size_t)64 << 20) /* a table of every shape of every model is a few KB */

void tune_table_init(tune_table *t, int arch, uint64_t lt_version, const char *gpu) {
    memset(t, 0, sizeof *t);
    t->arch = arch;
    t->lt_version = lt_version;
    snprintf(t->gpu, sizeof t->gpu, "%s", gpu ? gpu : "");
}

void tune_table_free(tune_table *t) {
    free(t->e);
    memset(t, 0, sizeof *t);
}

const tune_entry *tune_table_find(const tune_table *t, int n_out, int n_in, int n_tok) {
    for (int i = 0; i < t->n; i++)
        if (t->e[i].n_out == n_out && t->e[i].n_in == n_in && t->e[i].n_tok == n_tok) return &t->e[i];
    return NULL;
}

void tune_table_put(tune_table *t, const tune_entry *e) {
    tune_entry *old = (tune_entry *)tune_table_find(t, e->n_out, e->n_in, e->n_tok);
    if (old) {
        *old = *e;
        return;
    }
    if (t->n == t->cap) {
        t->cap = t->cap ? 2 * t->cap : 16;
        t->e = st_realloc(t->e, (size_t)t->cap * sizeof *t->e);
    }
    t->e[t->n++] = *e;
}

void tune_arch_name(int arch, char *buf, size_t size) { snprintf(buf, size, "sm_%d", arch); }

int tune_table_default_path(int arch, char *buf, size_t size) {
    const char *xdg = getenv("XDG_CACHE_HOME"), *home = getenv("HOME");
    int n;
    if (xdg && *xdg) n = snprintf(buf, size, "%s/strata/tune-sm%d.tsv", xdg, arch);
    else if (home && *home) n = snprintf(buf, size, "%s/.cache/strata/tune-sm%d.tsv", home, arch);
    else {
        st_error_set("tune table: neither XDG_CACHE_HOME nor HOME is set: give the table's path");
        return -1;
    }
    if (n < 0 || (size_t)n >= size) {
        st_error_set("tune table: the default path is longer than %zu bytes", size);
        return -1;
    }
    return 0;
}

int tune_table_check(const tune_table *t, const char *path, int dev, int arch, uint64_t lt_version, char *why,
                     size_t why_size) {
    if (t->arch == arch && t->lt_version == lt_version) return 0;
    char ta[16], ga[16];
    tune_arch_name(t->arch, ta, sizeof ta);
    tune_arch_name(arch, ga, sizeof ga);
    snprintf(why, why_size,
             "tune table %s is for %s / cuBLASLt %" PRIu64 ", GPU %d is %s / cuBLASLt %" PRIu64
             ": ignored; run strata tune --gpu %d",
             path, ta, t->lt_version, dev, ga, lt_version, dev);
    return -1;
}

/* ---- parsing ---- */

/* Split s (modified) at tabs into at most max fields; returns the count, or
 * max + 1 when there are more. */
static int split_tabs(char *s, char **f, int max) {
    int n = 0;
    for (;;) {
        if (n == max) return max + 1;
        f[n++] = s;
        char *tab = strchr(s, '\t');
        if (!tab) return n;
        *tab = '\0';
        s = tab + 1;
    }
}

/* A whole decimal number in [lo, hi]. */
static int parse_int(const char *s, long long lo, long long hi, long long *out) {
    if (!*s || *s == ' ' || *s == '+') return -1;
    char *end;
    errno = 0;
    const long long v = strtoll(s, &end, 10);
    if (errno || *end || v < lo || v > hi) return -1;
    *out = v;
    return 0;
}

static int parse_u64(const char *s, int base, uint64_t *out) {
    if (!*s || *s == ' ' || *s == '+' || *s == '-') return -1;
    char *end;
    errno = 0;
    const unsigned long long v = strtoull(s, &end, base);
    if (errno || *end) return -1;
    *out = v;
    return 0;
}

static int parse_time(const char *s, double *out) {
    if (!*s || *s == ' ') return -1;
    char *end;
    errno = 0;
    const double v = strtod(s, &end);
    if (errno || *end || !(v >= 0.0) || v > 1e12) return -1; /* !(>=) also refuses NaN */
    *out = v;
    return 0;
}

/* The header's fields after the magic: arch=sm_NN, cublaslt=N, gpu=NAME. */
static int parse_header(tune_table *t, char *line, const char *name) {
    char *f[5];
    const int n = split_tabs(line, f, 4);
    if (strcmp(f[0], TUNE_MAGIC) != 0) {
        st_error_set("%s:1: not a Strata tune table (the first line must start with '" TUNE_MAGIC "')", name);
        return -1;
    }
    long long arch = -1;
    uint64_t ver = 0;
    int have_ver = 0;
    for (int i = 1; i < n && i < 4; i++) {
        if (!strncmp(f[i], "arch=sm_", 8)) {
            if (parse_int(f[i] + 8, 10, 999, &arch) != 0) arch = -1;
        } else if (!strncmp(f[i], "cublaslt=", 9)) {
            have_ver = parse_u64(f[i] + 9, 10, &ver) == 0;
        } else if (!strncmp(f[i], "gpu=", 4)) {
            snprintf(t->gpu, sizeof t->gpu, "%s", f[i] + 4);
        }
    }
    if (n != 4 || arch < 0 || !have_ver) {
        st_error_set("%s:1: the header must be '" TUNE_MAGIC "<TAB>arch=sm_NN<TAB>cublaslt=VERSION<TAB>gpu=NAME'",
                     name);
        return -1;
    }
    t->arch = (int)arch;
    t->lt_version = ver;
    return 0;
}

static const char *const FIELD_NAMES[7] = {"n_out", "n_in", "n_tok", "path", "lt_us", "gemmex_us", "workspace"};

static int parse_entry(tune_table *t, char *line, const char *name, int ln) {
    char *f[TUNE_FIELDS + 1];
    const int n = split_tabs(line, f, TUNE_FIELDS);
    if (n != TUNE_FIELDS) {
        st_error_set("%s:%d: expected %d tab-separated fields (n_out n_in n_tok path lt_us gemmex_us workspace and %d "
                     "algorithm words), found %s%d",
                     name, ln, TUNE_FIELDS, TUNE_ALGO_WORDS, n > TUNE_FIELDS ? "more than " : "",
                     n > TUNE_FIELDS ? TUNE_FIELDS : n);
        return -1;
    }
    tune_entry e;
    memset(&e, 0, sizeof e);
    long long v[3];
    for (int i = 0; i < 3; i++)
        if (parse_int(f[i], 1, INT32_MAX, &v[i]) != 0) {
            st_error_set("%s:%d: %s '%s' is not a whole number from 1 to %d", name, ln, FIELD_NAMES[i], f[i],
                         INT32_MAX);
            return -1;
        }
    e.n_out = (int)v[0], e.n_in = (int)v[1], e.n_tok = (int)v[2];
    if (!strcmp(f[3], "lt")) e.path = TUNE_PATH_LT;
    else if (!strcmp(f[3], "gemmex")) e.path = TUNE_PATH_GEMMEX;
    else {
        st_error_set("%s:%d: path '%s' is neither 'lt' nor 'gemmex'", name, ln, f[3]);
        return -1;
    }
    if (parse_time(f[4], &e.lt_us) != 0 || parse_time(f[5], &e.gemmex_us) != 0) {
        const int bad = parse_time(f[4], &e.lt_us) != 0 ? 4 : 5;
        st_error_set("%s:%d: %s '%s' is not a time in microseconds", name, ln, FIELD_NAMES[bad], f[bad]);
        return -1;
    }
    if (parse_u64(f[6], 10, &e.workspace) != 0) {
        st_error_set("%s:%d: workspace '%s' is not a byte count", name, ln, f[6]);
        return -1;
    }
    for (int w = 0; w < TUNE_ALGO_WORDS; w++) {
        const char *s = f[7 + w];
        if (strlen(s) != 16 || parse_u64(s, 16, &e.algo[w]) != 0) {
            st_error_set("%s:%d: algorithm word %d '%s' is not 16 hex digits", name, ln, w, s);
            return -1;
        }
    }
    if (tune_table_find(t, e.n_out, e.n_in, e.n_tok)) {
        st_error_set("%s:%d: the shape %d x %d x %d is listed twice", name, ln, e.n_out, e.n_in, e.n_tok);
        return -1;
    }
    tune_table_put(t, &e);
    return 0;
}

int tune_table_parse(tune_table *t, const char *text, const char *name) {
    tune_table_init(t, 0, 0, NULL);
    char *buf = st_strdup(text);
    char *p = buf;
    int ln = 0, have_header = 0, rc = 0;
    while (p && *p && rc == 0) {
        ln++;
        char *nl = strchr(p, '\n');
        if (nl) *nl = '\0';
        const size_t len = strlen(p);
        if (len && p[len - 1] == '\r') p[len - 1] = '\0';
        if (!have_header) {
            rc = parse_header(t, p, name);
            have_header = 1;
        } else if (*p && *p != '#') {
            rc = parse_entry(t, p, name, ln);
        }
        p = nl ? nl + 1 : NULL;
    }
    if (rc == 0 && !have_header) {
        st_error_set("%s: empty file, not a Strata tune table", name);
        rc = -1;
    }
    free(buf);
    if (rc != 0) tune_table_free(t);
    return rc;
}

int tune_table_load(tune_table *t, const char *path) {
    tune_table_init(t, 0, 0, NULL);
    FILE *fp = fopen(path, "rb");
    if (!fp) {
        if (errno == ENOENT) return 1;
        st_error_set("%s: %s", path, strerror(errno));
        return -1;
    }
    size_t cap = 4096, n = 0;
    char *buf = st_malloc(cap + 1);
    for (;;) {
        const size_t got = fread(buf + n, 1, cap - n, fp);
        n += got;
        if (n < cap) break;
        if (cap >= TUNE_MAX_FILE) {
            st_error_set("%s: larger than %zu MiB, not a tune table", path, TUNE_MAX_FILE >> 20);
            fclose(fp);
            free(buf);
            return -1;
        }
        cap *= 2;
        buf = st_realloc(buf, cap + 1);
    }
    const int err = ferror(fp);
    fclose(fp);
    if (err) {
        st_error_set("%s: read error", path);
        free(buf);
        return -1;
    }
    buf[n] = '\0';
    if (memchr(buf, '\0', n)) {
        st_error_set("%s: holds NUL bytes, not a tune table", path);
        free(buf);
        return -1;
    }
    const int rc = tune_table_parse(t, buf, path);
    free(buf);
    return rc;
}

/* ---- writing ---- */

/* mkdir -p of path's parent folder. */
static int make_parents(const char *path) {
    char *d = st_strdup(path);
    for (char *p = d + 1; *p; p++) {
        if (*p != '/') continue;
        *p = '\0';
        if (mkdir(d, 0755) != 0 && errno != EEXIST) {
            st_error_set("tune table: cannot make the folder %s: %s", d, strerror(errno));
            free(d);
            return -1;
        }
        *p = '/';
    }
    free(d);
    return 0;
}

int tune_table_write(const tune_table *t, const char *path) {
    if (make_parents(path) != 0) return -1;
    const size_t tn = strlen(path) + 32;
    char *tmp = st_malloc(tn);
    snprintf(tmp, tn, "%s.tmp.%ld", path, (long)getpid());
    FILE *fp = fopen(tmp, "w");
    if (!fp) {
        st_error_set("tune table: cannot write %s: %s", tmp, strerror(errno));
        free(tmp);
        return -1;
    }
    /* the name may not carry the format's separators */
    char gpu[sizeof t->gpu];
    snprintf(gpu, sizeof gpu, "%s", t->gpu);
    for (char *c = gpu; *c; c++)
        if (*c == '\t' || *c == '\n' || *c == '\r') *c = ' ';
    fprintf(fp, TUNE_MAGIC "\tarch=sm_%d\tcublaslt=%" PRIu64 "\tgpu=%s\n", t->arch, t->lt_version, gpu);
    fprintf(fp,
            "# written by strata tune; one line per product: W is n_out x n_in, n_tok tokens per prompt chunk\n"
            "# path: lt = cublasLtMatmul with the algorithm below, gemmex = cublasGemmEx (it was as fast)\n"
            "# times: median microseconds of the whole product; algorithm: cublasLtMatmulAlgo_t as %d words\n"
            "# n_out\tn_in\tn_tok\tpath\tlt_us\tgemmex_us\tworkspace\talgorithm\n",
            TUNE_ALGO_WORDS);
    for (int i = 0; i < t->n; i++) {
        const tune_entry *e = &t->e[i];
        fprintf(fp, "%d\t%d\t%d\t%s\t%.2f\t%.2f\t%" PRIu64, e->n_out, e->n_in, e->n_tok,
                e->path == TUNE_PATH_LT ? "lt" : "gemmex", e->lt_us, e->gemmex_us, e->workspace);
        for (int w = 0; w < TUNE_ALGO_WORDS; w++) fprintf(fp, "\t%016" PRIx64, e->algo[w]);
        fputc('\n', fp);
    }
    const int bad = ferror(fp) != 0;
    if (fclose(fp) != 0 || bad || rename(tmp, path) != 0) {
        st_error_set("tune table: cannot write %s: %s", path, strerror(errno));
        unlink(tmp);
        free(tmp);
        return -1;
    }
    free(tmp);
    return 0;
}

int tune_table_load_for(tune_table *t, const char *path, int dev, int arch, uint64_t lt_version) {
    const int rc = tune_table_load(t, path);
    if (rc == 1) {
        ST_DEBUG("GPU %d: no tune table at %s: prompt products use cublasGemmEx (strata tune --gpu %d measures)", dev,
                 path, dev);
        return 0;
    }
    if (rc != 0) {
        ST_WARN("GPU %d: %s: tune table ignored; run strata tune --gpu %d", dev, st_error_get(), dev);
        return 0;
    }
    char why[1024];
    if (tune_table_check(t, path, dev, arch, lt_version, why, sizeof why) != 0) {
        ST_WARN("%s", why);
        tune_table_free(t);
        return 0;
    }
    int n_lt = 0;
    for (int i = 0; i < t->n; i++) n_lt += t->e[i].path == TUNE_PATH_LT;
    ST_INFO("GPU %d: tune table %s (sm_%d, cuBLASLt %" PRIu64 ", measured on %s): %d shapes, %d through cuBLASLt", dev,
            path, arch, lt_version, t->gpu[0] ? t->gpu : "an unnamed card", t->n, n_lt);
    return 1;
}
