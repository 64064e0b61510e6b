/* The GEMM tuning table (backend/cuda/tune_table.c) without a GPU: it is
 * plain C, built into this test in every build, so CI checks it.
 *
 *  - round trip: a table written and read back is the same, field by field
 *    (every algorithm word, both paths, the card's name, missing folders made);
 *  - the key: a table for another architecture or another cuBLASLt version
 *    is ignored with exactly one log line saying why (stderr captured);
 *    the matching one is taken with one INFO line; an absent one silently;
 *  - damage: each kind of malformed line is refused, naming the file and the
 *    line and what is wrong with it;
 *  - the default path follows XDG_CACHE_HOME, then HOME.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "backend/cuda/tune/tune_table.h"
#include "core/log.h"

#include "../common/check.h"

static char g_dir[256];

static tune_table sample(int arch, uint64_t ver) {
    tune_table t;
    tune_table_init(&t, arch, ver, "NVIDIA Test Card 9000");
    tune_entry e;
    memset(&e, 0, sizeof e);
    e.n_out = 4096, e.n_in = 2048, e.n_tok = 512, e.path = TUNE_PATH_LT;
    e.lt_us = 123.25, e.gemmex_us = 150.5, e.workspace = 1048576;
    for (int w = 0; w < TUNE_ALGO_WORDS; w++) e.algo[w] = 0x0123456789abcdefull * (uint64_t)(w + 1);
    e.algo[7] = ~0ull;
    tune_table_put(&t, &e);
    e.n_out = 512, e.n_tok = 128, e.path = TUNE_PATH_GEMMEX, e.lt_us = 9.75, e.gemmex_us = 8.5, e.workspace = 0;
    memset(e.algo, 0, sizeof e.algo);
    tune_table_put(&t, &e);
    e.n_out = 151936, e.n_in = 2048, e.n_tok = 1, e.path = TUNE_PATH_LT, e.lt_us = 4000.0, e.gemmex_us = 4100.0;
    e.algo[0] = 1, e.workspace = 33554432;
    tune_table_put(&t, &e);
    return t;
}

static void write_text(const char *path, const char *text) {
    FILE *f = fopen(path, "w");
    if (!f) {
        perror(path);
        exit(1);
    }
    fputs(text, f);
    fclose(f);
}

/* ---- stderr capture: the log lines a call writes ---- */

static int g_saved_fd = -1;
static char g_cap_path[300];

static void capture_begin(void) {
    fflush(stderr);
    g_saved_fd = dup(2);
    snprintf(g_cap_path, sizeof g_cap_path, "%s/stderr.txt", g_dir);
    if (!freopen(g_cap_path, "w", stderr)) exit(1);
}

/* The captured text (static buffer) and its number of lines. */
static const char *capture_end(int *lines) {
    static char buf[8192];
    fflush(stderr);
    dup2(g_saved_fd, 2);
    close(g_saved_fd);
    FILE *f = fopen(g_cap_path, "r");
    size_t n = f ? fread(buf, 1, sizeof buf - 1, f) : 0;
    if (f) fclose(f);
    buf[n] = '\0';
    *lines = 0;
    for (size_t i = 0; i < n; i++) *lines += buf[i] == '\n';
    return buf;
}

static void test_round_trip(void) {
    tune_table t = sample(90, 130100), r;
    char path[300];
    snprintf(path, sizeof path, "%s/a/b/tune-sm90.tsv", g_dir); /* a/b do not exist yet */
    CHECK(tune_table_write(&t, path) == 0, "write: %s", st_error_get());
    CHECK(tune_table_load(&r, path) == 0, "load: %s", st_error_get());
    CHECK(r.arch == 90 && r.lt_version == 130100, "key read back as %d / %llu", r.arch,
          (unsigned long long)r.lt_version);
    CHECK(!strcmp(r.gpu, "NVIDIA Test Card 9000"), "gpu name read back as '%s'", r.gpu);
    CHECK(r.n == t.n, "%d entries read back of %d", r.n, t.n);
    for (int i = 0; i < t.n && i < r.n; i++) {
        const tune_entry *a = &t.e[i], *b = tune_table_find(&r, a->n_out, a->n_in, a->n_tok);
        CHECK(b != NULL, "entry %d x %d x %d lost", a->n_out, a->n_in, a->n_tok);
        if (!b) continue;
        CHECK(b->path == a->path && b->lt_us == a->lt_us && b->gemmex_us == a->gemmex_us &&
                  b->workspace == a->workspace && !memcmp(b->algo, a->algo, sizeof a->algo),
              "entry %d x %d x %d differs after the round trip", a->n_out, a->n_in, a->n_tok);
    }
    CHECK(tune_table_find(&r, 4096, 2048, 511) == NULL, "a shape never written is found");
    /* writing over an existing table, and a name with a tab in it */
    snprintf(t.gpu, sizeof t.gpu, "odd\tname");
    CHECK(tune_table_write(&t, path) == 0, "rewrite: %s", st_error_get());
    tune_table_free(&r);
    CHECK(tune_table_load(&r, path) == 0 && !strcmp(r.gpu, "odd name"), "name with a tab: '%s' (%s)", r.gpu,
          st_error_get());
    tune_table_free(&r);
    tune_table_free(&t);
}

static void test_key(void) {
    char path[300], why[1024];
    snprintf(path, sizeof path, "%s/key.tsv", g_dir);
    tune_table t = sample(86, 130000), r;
    CHECK(tune_table_write(&t, path) == 0, "write: %s", st_error_get());

    /* the check itself: exact messages */
    CHECK(tune_table_check(&t, path, 0, 86, 130000, why, sizeof why) == 0, "a matching key is refused: %s", why);
    CHECK(tune_table_check(&t, path, 0, 90, 130000, why, sizeof why) != 0, "another architecture is taken");
    char want[1024];
    snprintf(want, sizeof want,
             "tune table %s is for sm_86 / cuBLASLt 130000, GPU 0 is sm_90 / cuBLASLt 130000: ignored; run strata "
             "tune --gpu 0",
             path);
    CHECK(!strcmp(why, want), "arch message:\n  got  %s\n  want %s", why, want);
    CHECK(tune_table_check(&t, path, 1, 86, 130100, why, sizeof why) != 0, "another cuBLASLt version is taken");
    snprintf(want, sizeof want,
             "tune table %s is for sm_86 / cuBLASLt 130000, GPU 1 is sm_86 / cuBLASLt 130100: ignored; run strata "
             "tune --gpu 1",
             path);
    CHECK(!strcmp(why, want), "version message:\n  got  %s\n  want %s", why, want);

    /* as the engine loads it: one line when ignored, naming why */
    int lines;
    const char *txt;
    capture_begin();
    int rc = tune_table_load_for(&r, path, 0, 90, 130000);
    txt = capture_end(&lines);
    CHECK(rc == 0 && r.n == 0, "a table for sm_86 was taken on sm_90 (rc %d, %d entries)", rc, r.n);
    CHECK(lines == 1 && strstr(txt, "is for sm_86 / cuBLASLt 130000, GPU 0 is sm_90") && strstr(txt, "ignored"),
          "wrong architecture: %d log lines:\n%s", lines, txt);

    capture_begin();
    rc = tune_table_load_for(&r, path, 2, 86, 130001);
    txt = capture_end(&lines);
    CHECK(rc == 0 && r.n == 0, "a table for cuBLASLt 130000 was taken with 130001");
    CHECK(lines == 1 && strstr(txt, "sm_86 / cuBLASLt 130000, GPU 2 is sm_86 / cuBLASLt 130001: ignored"),
          "wrong version: %d log lines:\n%s", lines, txt);

    capture_begin();
    rc = tune_table_load_for(&r, path, 0, 86, 130000);
    txt = capture_end(&lines);
    CHECK(rc == 1 && r.n == 3, "the matching table was not taken (rc %d, %d entries)", rc, r.n);
    CHECK(lines == 1 && strstr(txt, "3 shapes, 2 through cuBLASLt"), "match: %d log lines:\n%s", lines, txt);
    tune_table_free(&r);

    snprintf(path, sizeof path, "%s/absent.tsv", g_dir);
    capture_begin();
    rc = tune_table_load_for(&r, path, 0, 86, 130000);
    txt = capture_end(&lines);
    CHECK(rc == 0 && lines == 0, "an absent table: rc %d, %d log lines:\n%s", rc, lines, txt);
    CHECK(tune_table_load(&r, path) == 1, "an absent file is not reported as absent");

    /* a damaged table at start: one line too, naming the line */
    snprintf(path, sizeof path, "%s/damaged.tsv", g_dir);
    write_text(path, "strata-tune v1\tarch=sm_90\tcublaslt=130000\tgpu=x\n1\t2\n");
    capture_begin();
    rc = tune_table_load_for(&r, path, 0, 90, 130000);
    txt = capture_end(&lines);
    CHECK(rc == 0 && lines == 1 && strstr(txt, "damaged.tsv:2:") && strstr(txt, "ignored"),
          "damaged table at start: rc %d, %d log lines:\n%s", rc, lines, txt);
    tune_table_free(&t);
}

/* Each malformed text must fail with an error holding every one of want[]. */
static void bad(const char *what, const char *text, const char *w1, const char *w2) {
    tune_table t;
    const int rc = tune_table_parse(&t, text, "t.tsv");
    const char *err = st_error_get();
    CHECK(rc != 0, "%s: accepted", what);
    CHECK(rc != 0 && strstr(err, w1) && (!w2 || strstr(err, w2)), "%s: error '%s' lacks '%s'%s%s", what, err, w1,
          w2 ? " / " : "", w2 ? w2 : "");
    CHECK(t.n == 0 && t.e == NULL, "%s: entries left after a refusal", what);
}

#define HDR "strata-tune v1\tarch=sm_90\tcublaslt=130100\tgpu=G\n"
#define W8                                                                                                             \
    "\t0000000000000001\t0000000000000002\t0000000000000003\t0000000000000004\t0000000000000005"                       \
    "\t0000000000000006\t0000000000000007\t0000000000000008"
#define GOOD "4096\t2048\t512\tlt\t10.5\t12.25\t0" W8 "\n"

static void test_malformed(void) {
    tune_table t;
    CHECK(tune_table_parse(&t, HDR "# comment\n\n" GOOD, "t.tsv") == 0 && t.n == 1 && t.e[0].algo[7] == 8,
          "a good table is refused: %s", st_error_get());
    tune_table_free(&t);
    CHECK(tune_table_parse(&t, HDR GOOD, "t.tsv") == 0 && t.n == 1, "no comment: %s", st_error_get());
    tune_table_free(&t);
    /* CRLF line ends and no final newline are taken */
    CHECK(tune_table_parse(&t,
                           "strata-tune v1\tarch=sm_90\tcublaslt=130100\tgpu=G\r\n"
                           "4096\t2048\t512\tlt\t10.5\t12.25\t0" W8,
                           "t.tsv") == 0 &&
              t.n == 1,
          "CRLF / no final newline: %s", st_error_get());
    tune_table_free(&t);

    bad("empty file", "", "t.tsv", "empty");
    bad("not a table", "hello\n", "t.tsv:1:", "not a Strata tune table");
    bad("other format version", "strata-tune v2\tarch=sm_90\tcublaslt=1\tgpu=G\n",
        "t.tsv:1:", "not a Strata tune table");
    bad("header without version", "strata-tune v1\tarch=sm_90\tgpu=G\n", "t.tsv:1:", "cublaslt=VERSION");
    bad("header with bad arch", "strata-tune v1\tarch=90\tcublaslt=1\tgpu=G\n", "t.tsv:1:", "arch=sm_NN");
    bad("too few fields", HDR GOOD "4096\t2048\t512\n", "t.tsv:3:", "found 3");
    bad("too many fields", HDR "4096\t2048\t512\tlt\t10.5\t12.25\t0" W8 "\textra\n", "t.tsv:2:", "more than 15");
    bad("bad number", HDR "# c\n40x6\t2048\t512\tlt\t10.5\t12.25\t0" W8 "\n", "t.tsv:3:", "n_out '40x6'");
    bad("zero tokens", HDR "4096\t2048\t0\tlt\t10.5\t12.25\t0" W8 "\n", "t.tsv:2:", "n_tok '0'");
    bad("bad path", HDR "4096\t2048\t512\tfast\t10.5\t12.25\t0" W8 "\n", "t.tsv:2:", "path 'fast'");
    bad("bad time", HDR "4096\t2048\t512\tlt\tnan\t12.25\t0" W8 "\n", "t.tsv:2:", "lt_us 'nan'");
    bad("negative time", HDR "4096\t2048\t512\tlt\t1\t-2\t0" W8 "\n", "t.tsv:2:", "gemmex_us '-2'");
    bad("bad workspace", HDR "4096\t2048\t512\tlt\t1\t2\t-1" W8 "\n", "t.tsv:2:", "workspace '-1'");
    bad("short algorithm word", HDR "4096\t2048\t512\tlt\t1\t2\t0\t1\t2\t3\t4\t5\t6\t7\t8\n",
        "t.tsv:2:", "algorithm word 0 '1'");
    bad("non-hex algorithm word",
        HDR "4096\t2048\t512\tlt\t1\t2\t0\t0000000000000001\t000000000000000g\t0000000000000003\t0000000000000004"
            "\t0000000000000005\t0000000000000006\t0000000000000007\t0000000000000008\n",
        "t.tsv:2:", "algorithm word 1");
    bad("duplicate shape", HDR GOOD "# again\n" GOOD, "t.tsv:4:", "listed twice");
    bad("spaces instead of tabs", HDR "4096 2048 512 lt 10.5 12.25 0 1 2 3 4 5 6 7 8\n", "t.tsv:2:", "found 1");
}

static void test_default_path(void) {
    char buf[512];
    const char *xdg = getenv("XDG_CACHE_HOME"), *home = getenv("HOME");
    char *sx = xdg ? strdup(xdg) : NULL, *sh = home ? strdup(home) : NULL;
    setenv("XDG_CACHE_HOME", "/tmp/xdg", 1);
    CHECK(tune_table_default_path(90, buf, sizeof buf) == 0 && !strcmp(buf, "/tmp/xdg/strata/tune-sm90.tsv"),
          "XDG path '%s'", buf);
    unsetenv("XDG_CACHE_HOME");
    setenv("HOME", "/home/u", 1);
    CHECK(tune_table_default_path(120, buf, sizeof buf) == 0 && !strcmp(buf, "/home/u/.cache/strata/tune-sm120.tsv"),
          "HOME path '%s'", buf);
    unsetenv("HOME");
    CHECK(tune_table_default_path(90, buf, sizeof buf) != 0, "a path without XDG_CACHE_HOME or HOME");
    if (sx) setenv("XDG_CACHE_HOME", sx, 1);
    if (sh) setenv("HOME", sh, 1);
    free(sx), free(sh);
}

int main(void) {
    snprintf(g_dir, sizeof g_dir, "/tmp/strata-tune-test.XXXXXX");
    if (!mkdtemp(g_dir)) {
        perror("mkdtemp");
        return 1;
    }
    st_log_set_level(ST_LOG_INFO); /* STRATA_LOG in the environment would change the line counts */
    test_round_trip();
    test_key();
    test_malformed();
    test_default_path();
    char cmd[400];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", g_dir);
    if (system(cmd) != 0) printf("(could not remove %s)\n", g_dir);
    return check_report("tune_table");
}
