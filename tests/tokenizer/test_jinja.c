/* Jinja interpreter against Python's jinja2.
 *
 * 1. Every case of tests/data/jinja/cases.json (tools/make_jinja_fixtures.py:
 *    the chat templates of SmolLM2, Qwen2.5, Qwen3, Llama 3.2/3.3, Gemma 3,
 *    DeepSeek-V3/V3.1 over a set of conversations, plus single features)
 *    is rendered and compared byte for byte with jinja2's output, or must fail
 *    where jinja2 failed (with raise_exception's exact message). A table shows
 *    each template family.
 * 2. Syntax errors name the line and column (positions counted by hand here).
 * 3. Hostile templates -- deep nesting, huge loops, output and memory bombs,
 *    runaway macro recursion -- are refused quickly with a clear message.
 * 4. chat_render_template (chat.h) on GGUF files: SmolLM2's own template,
 *    Gemma 3 270M (no template: the built-in Gemma format must equal what the
 *    Gemma 3 template renders), and written GGUFs carrying the Llama 3.3 and
 *    GLM-4.6 templates with OpenAI-style string arguments (turned into the
 *    object HF templates expect). Real models are skipped when models/ lacks them.
 *
 * Usage: test_jinja <tests/data/jinja> [models dir]
 */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "core/alloc.h"
#include "core/log.h"
#include "gguf/gguf.h"
#include "tokenizer/chat.h"
#include "tokenizer/jinja.h"
#include "tokenizer/tokenizer.h"

static int failures;

static char *read_file(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *s = malloc((size_t)n + 1);
    *len = fread(s, 1, (size_t)n, f);
    s[*len] = 0;
    fclose(f);
    return s;
}

/* Time bounds (a hostile template must be refused or rendered quickly) are
 * for optimised builds; sanitizer builds run 10-50x slower, so there they
 * only check the result. */
#if defined(__SANITIZE_ADDRESS__)
#define TIME_BOUNDS 0
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define TIME_BOUNDS 0
#endif
#endif
#ifndef TIME_BOUNDS
#define TIME_BOUNDS 1
#endif

static double now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

/* first differing byte, for the failure report */
static void show_diff(const char *want, const char *got) {
    size_t i = 0;
    while (want[i] && want[i] == got[i]) i++;
    size_t from = i > 40 ? i - 40 : 0;
    printf("    first difference at byte %zu\n    want: \"", i);
    for (size_t k = from; want[k] && k < i + 40; k++) putchar(want[k] == '\n' ? '|' : want[k]);
    printf("\"\n    got:  \"");
    for (size_t k = from; got[k] && k < i + 40; k++) putchar(got[k] == '\n' ? '|' : got[k]);
    printf("\"\n");
}

typedef struct {
    char family[32];
    int n, pass;
    size_t bytes;
    double ms;
} fam_row;

static void run_fixtures(const char *dir) {
    char path[1024];
    snprintf(path, sizeof path, "%s/cases.json", dir);
    json_error_t jerr;
    json_t *root = json_load_file(path, 0, &jerr);
    if (!root) {
        printf("FAIL cannot read %s: %s\n", path, jerr.text);
        failures++;
        return;
    }
    json_t *cases = json_object_get(root, "cases");
    fam_row rows[32];
    int n_rows = 0;
    size_t i;
    json_t *cs;
    json_array_foreach(cases, i, cs) {
        const char *name = json_string_value(json_object_get(cs, "name"));
        const char *stem = json_string_value(json_object_get(cs, "template"));
        char *src;
        size_t len;
        if (stem) {
            snprintf(path, sizeof path, "%s/templates/%s.jinja", dir, stem);
            src = read_file(path, &len);
            if (!src) {
                printf("FAIL %s: cannot read %s\n", name, path);
                failures++;
                continue;
            }
        } else {
            json_t *s = json_object_get(cs, "source");
            len = json_string_length(s);
            src = malloc(len + 1);
            memcpy(src, json_string_value(s), len + 1);
        }
        char fam[32];
        snprintf(fam, sizeof fam, "%s", name);
        char *slash = strchr(fam, '/');
        if (slash) *slash = 0;
        int r = 0;
        while (r < n_rows && strcmp(rows[r].family, fam)) r++;
        if (r == n_rows && n_rows < 32) {
            memset(&rows[r], 0, sizeof rows[r]);
            snprintf(rows[r].family, sizeof rows[r].family, "%s", fam);
            n_rows++;
        }
        rows[r].n++;

        double t0 = now_ms();
        jinja_tmpl *t = jinja_parse(src, len);
        char *out = NULL;
        size_t out_len = 0;
        if (t) out = jinja_render_json_ex(t, json_object_get(cs, "context"), NULL, &out_len);
        rows[r].ms += now_ms() - t0;
        json_t *expect = json_object_get(cs, "expect"), *err = json_object_get(cs, "error");
        int ok = 0;
        if (!t) {
            printf("FAIL %s: parse error: %s\n", name, st_error_get());
        } else if (expect) {
            const char *want = json_string_value(expect);
            size_t want_len = json_string_length(expect);
            ok = out && out_len == want_len && !memcmp(out, want, want_len);
            if (!ok) {
                printf("FAIL %s: %s\n", name, out ? "output differs" : st_error_get());
                if (out) show_diff(want, out);
            }
            rows[r].bytes += out_len;
        } else if (json_is_string(err)) {
            ok = !out && !strcmp(st_error_get(), json_string_value(err));
            if (!ok)
                printf("FAIL %s: want error \"%s\", got %s\n", name, json_string_value(err),
                       out ? "output" : st_error_get());
        } else {
            ok = !out;
            if (!ok) printf("FAIL %s: jinja2 failed here but we rendered \"%.80s\"\n", name, out);
            else if (!strstr(name, "feature/")) printf("  ok %-44s refused as jinja2 does: %s\n", name, st_error_get());
        }
        rows[r].pass += ok;
        failures += !ok;
        st_free(out);
        jinja_free(t);
        free(src);
    }
    printf("\n%-14s %6s %6s %10s %9s\n", "template", "cases", "equal", "out bytes", "ms total");
    for (int r = 0; r < n_rows; r++)
        printf("%-14s %6d %6d %10zu %9.2f\n", rows[r].family, rows[r].n, rows[r].pass, rows[r].bytes, rows[r].ms);
    printf("\n");
    json_decref(root);
}

/* ---- syntax errors ---- */
static void expect_syntax_error(const char *src, const char *where, const char *what) {
    jinja_tmpl *t = jinja_parse(src, strlen(src));
    int ok = !t && strstr(st_error_get(), where) && (!what || strstr(st_error_get(), what));
    printf("%s syntax error names \"%s\": %s\n", ok ? "  ok" : "FAIL", where, t ? "(parsed!)" : st_error_get());
    failures += !ok;
    jinja_free(t);
}

static void syntax_errors(void) {
    expect_syntax_error("{% if x %}\n  {{ x + }}\n{% endif %}", "line 2, column 10", "unexpected");
    expect_syntax_error("a\nb\n{% for m in messages %}{{ m }}", "line 3", "endfor");
    expect_syntax_error("{{ 'abc }}", "line 1, column 4", "unterminated");
    expect_syntax_error("x\n   {% frobnicate %}", "line 2, column 7", "frobnicate");
    expect_syntax_error("{% if a %}{% endfor %}", "line 1, column 14", "endfor");
    expect_syntax_error("{{ a }\n}", "line 1, column 1", "unclosed");
    expect_syntax_error("{# never closed", "line 1, column 1", "comment");
    expect_syntax_error("{{ f(a, }}", "line 1, column 5", "unclosed '('");
}

/* ---- hostile input ---- */
static void expect_refused(const char *label, const char *src, const jinja_limits *lim, const char *what) {
    double t0 = now_ms();
    jinja_tmpl *t = jinja_parse(src, strlen(src));
    char *out = NULL;
    json_t *ctx = json_object();
    if (t) out = jinja_render_json_ex(t, ctx, lim, NULL);
    double ms = now_ms() - t0;
    int ok = !out && strstr(st_error_get(), what) && (!TIME_BOUNDS || ms < 5000);
    printf("%s %-26s refused in %7.1f ms: %s\n", ok ? "  ok" : "FAIL", label, ms, out ? "(rendered!)" : st_error_get());
    failures += !ok;
    st_free(out);
    jinja_free(t);
    json_decref(ctx);
}

/* must render, and quickly: the operations hostile input could make quadratic */
static void expect_fast(const char *label, const char *src, const char *want) {
    double t0 = now_ms();
    jinja_tmpl *t = jinja_parse(src, strlen(src));
    json_t *ctx = json_object();
    char *out = t ? jinja_render_json(t, ctx) : NULL;
    double ms = now_ms() - t0;
    int ok = out && !strcmp(out, want) && (!TIME_BOUNDS || ms < 2000);
    printf("%s %-26s rendered in %7.1f ms: %.60s\n", ok ? "  ok" : "FAIL", label, ms, out ? out : st_error_get());
    failures += !ok;
    st_free(out);
    jinja_free(t);
    json_decref(ctx);
}

static char *repeat3(const char *a, const char *mid, const char *b, int n) {
    size_t la = strlen(a), lm = strlen(mid), lb = strlen(b);
    char *s = malloc(n * (la + lb) + lm + 1), *p = s;
    for (int i = 0; i < n; i++, p += la) memcpy(p, a, la);
    memcpy(p, mid, lm);
    p += lm;
    for (int i = 0; i < n; i++, p += lb) memcpy(p, b, lb);
    *p = 0;
    return s;
}

static void hostile(void) {
    jinja_limits lim;
    jinja_limits_default(&lim);
    char *s = repeat3("(", "1", ")", 100000);
    char *deep = malloc(strlen(s) + 8);
    sprintf(deep, "{{ %s }}", s);
    expect_refused("100k nested parentheses", deep, NULL, "nesting deeper");
    free(s);
    free(deep);
    s = repeat3("{% if 1 %}", "x", "{% endif %}", 5000);
    expect_refused("5000 nested ifs", s, NULL, "nesting deeper");
    free(s);
    s = repeat3("[", "", "]", 50000);
    deep = malloc(strlen(s) + 8);
    sprintf(deep, "{{ %s }}", s);
    expect_refused("50k nested lists", deep, NULL, "nesting deeper");
    free(s);
    free(deep);
    expect_refused("range(10^12)", "{% for i in range(1000000000000) %}x{% endfor %}", NULL, "iteration limit");
    expect_refused("nested 5000x5000 loop",
                   "{% for a in range(5000) %}{% for b in range(5000) %}{% endfor %}{% endfor %}", NULL,
                   "loop iterations");
    jinja_limits small = lim;
    small.max_output = 1 << 20;
    expect_refused("output bomb (1 MiB limit)", "{% for i in range(100000) %}{{ 'x' * 100 }}{% endfor %}", &small,
                   "output would exceed");
    small = lim;
    small.max_memory = 32 << 20;
    expect_refused("doubling string (32 MiB)",
                   "{% set ns = namespace(s='x') %}{% for i in range(60) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}",
                   &small, "memory");
    expect_refused("'x' * 10^15", "{{ 'x' * 1000000000000000 }}", NULL, "repetition too large");
    expect_refused("runaway macro recursion", "{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}", NULL,
                   "nested deeper");
    expect_refused(
        "value nested 100k deep",
        "{% set ns = namespace(x=1) %}{% for i in range(100000) %}{% set ns.x = [ns.x] %}{% endfor %}{{ ns.x }}", NULL,
        "nested deeper");
    expect_refused("tojson of it",
                   "{% set ns = namespace(x=1) %}{% for i in range(100000) %}{% set ns.x = {'a': ns.x} %}{% endfor "
                   "%}{{ ns.x | tojson }}",
                   NULL, "nesting deeper");
    expect_fast("sort 1M reversed ints",
                "{% set l = range(1000000, 0, -1) | sort %}{{ l[0] }} {{ l[-1] }} {{ l | length }}",
                "1 1000000 1000000");
    expect_fast("sort 1M, reverse=true", "{{ (range(1000000) | sort(reverse=true))[:3] }}", "[999999, 999998, 999997]");
    expect_fast("4 MB search, miss",
                "{% set s = 'ab' * 2000000 %}{{ s.find('abb') }} {{ 'aab' in s }} {{ s.count('ba') }}",
                "-1 False 1999999");
    expect_fast("4 MB replace and split",
                "{% set s = 'ab' * 2000000 %}{{ s.replace('ba', '') | length }} {{ s.split('b') | length }}",
                "2 2000001"); /* values from Python */
    expect_refused("unique of 100k distinct", "{{ range(100000) | unique | list | length }}", NULL, "comparisons");
    expect_refused("raise_exception", "{{ raise_exception('Only user and assistant roles are supported!') }}", NULL,
                   "Only user and assistant roles are supported!");
}

/* ---- chat_render_template on GGUF files ---- */
static json_t *g_cases;

static json_t *find_case(const char *name) {
    size_t i;
    json_t *cs;
    json_array_foreach(json_object_get(g_cases, "cases"), i,
                       cs) if (!strcmp(json_string_value(json_object_get(cs, "name")), name)) return cs;
    return NULL;
}

/* render the case's conversation through chat_render_template and compare with
 * its jinja2 output less `drop_prefix` */
static void check_file(const char *label, const gguf_file *f, const tokenizer *tok, const char *case_name,
                       const json_t *messages, const char *drop_prefix) {
    json_t *cs = find_case(case_name);
    if (!cs) {
        printf("FAIL %s: fixture %s missing\n", label, case_name);
        failures++;
        return;
    }
    json_t *ctx = json_object_get(cs, "context");
    if (!messages) messages = json_object_get(ctx, "messages");
    char *out = chat_render_template(f, tok, messages, json_object_get(ctx, "tools"), NULL,
                                     json_is_true(json_object_get(ctx, "add_generation_prompt")));
    const char *want = json_string_value(json_object_get(cs, "expect"));
    size_t dl = strlen(drop_prefix);
    int ok = out && want && !strncmp(want, drop_prefix, dl) && !strcmp(out, want + dl);
    printf("%s %-40s %s (%zu bytes)\n", ok ? "  ok" : "FAIL", label, case_name, out ? strlen(out) : 0);
    if (!ok && out && want) show_diff(want + dl, out);
    if (!out) printf("    error: %s\n", st_error_get());
    failures += !ok;
    st_free(out);
}

/* A written GGUF carrying template `stem`, its tool_call_dict_args case fed as an OpenAI client sends it
 * (the arguments a JSON string, content null): the render must equal the case's (arguments as the object
 * HF templates expect). drop_prefix: the BOS the template writes that the tokenizer would add instead. */
static void string_args(const char *data_dir, const char *stem, const char *drop_prefix) {
    char path[1024], label[96], name[96];
    size_t len;
    snprintf(path, sizeof path, "%s/templates/%s.jinja", data_dir, stem);
    char *tmpl = read_file(path, &len);
    gguf_writer *w = gguf_writer_new();
    gguf_w_str(w, "general.architecture", "llama");
    gguf_w_str(w, "tokenizer.chat_template", tmpl ? tmpl : "");
    snprintf(path, sizeof path, "/tmp/strata_test_jinja_%d.gguf", (int)getpid());
    int wrote = tmpl && gguf_writer_write(w, path, NULL, NULL) == 0;
    gguf_writer_free(w);
    gguf_file *f = wrote ? gguf_open(path) : NULL;
    snprintf(name, sizeof name, "%s/tool_call_dict_args/gen", stem);
    json_t *cs = f ? find_case(name) : NULL;
    if (cs) {
        json_t *msgs = json_deep_copy(json_object_get(json_object_get(cs, "context"), "messages"));
        json_t *fn =
            json_object_get(json_array_get(json_object_get(json_array_get(msgs, 2), "tool_calls"), 0), "function");
        char *js = json_dumps(json_object_get(fn, "arguments"), JSON_COMPACT);
        json_object_set_new(fn, "arguments", json_string(js));
        free(js);
        json_object_set_new(json_array_get(msgs, 2), "content", json_null());
        snprintf(label, sizeof label, "written GGUF, %s, string args", stem);
        check_file(label, f, NULL, name, msgs, drop_prefix);
        json_decref(msgs);
    } else {
        printf("FAIL %s: cannot write a GGUF, or no fixture %s: %s\n", stem, name, st_error_get());
        failures++;
    }
    gguf_close(f);
    remove(path);
    free(tmpl);
}

static void chat_files(const char *data_dir, const char *models) {
    char path[1024];
    snprintf(path, sizeof path, "%s/cases.json", data_dir);
    g_cases = json_load_file(path, 0, NULL);
    if (!g_cases) return;
    if (models) {
        snprintf(path, sizeof path, "%s/SmolLM2-135M-Instruct.Q4_1.gguf", models);
        gguf_file *f = gguf_open(path);
        tokenizer *tok = f ? tokenizer_load(f) : NULL;
        if (tok) {
            check_file("SmolLM2 GGUF, own template", f, tok, "smollm2/multi_turn/gen", NULL, "");
            check_file("SmolLM2 GGUF, own template", f, tok, "smollm2/user_only/gen", NULL, "");
        } else {
            printf("SKIP SmolLM2 GGUF (not in %s)\n", models);
        }
        tokenizer_free(tok);
        gguf_close(f);
        snprintf(path, sizeof path, "%s/gemma-3-270m-q4_k_m.gguf", models);
        f = gguf_open(path);
        tok = f ? tokenizer_load(f) : NULL;
        if (tok) {
            /* no template in this file: the built-in format must match the Gemma 3 template (its BOS dropped) */
            check_file("Gemma 3 GGUF, built-in = template", f, tok, "gemma3/multi_turn/gen", NULL, "<bos>");
            check_file("Gemma 3 GGUF, built-in = template", f, tok, "gemma3/sys_user/gen", NULL, "<bos>");
        } else {
            printf("SKIP Gemma 3 GGUF (not in %s)\n", models);
        }
        tokenizer_free(tok);
        gguf_close(f);
    }
    /* written GGUFs with no tokenizer (bos_token empty), fed tool calls as OpenAI clients send them */
    string_args(data_dir, "llama33", "<|begin_of_text|>");
    string_args(data_dir, "glm46", ""); /* iterates arguments.items(): an object, or it fails */
    json_decref(g_cases);
}

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: %s <tests/data/jinja>\n", argv[0]);
        return 2;
    }
    run_fixtures(argv[1]);
    syntax_errors();
    hostile();
    printf("\n");
    chat_files(argv[1], argc > 2 ? argv[2] : NULL);
    printf("\n%s (%d failure%s)\n", failures ? "FAILED" : "all passed", failures, failures == 1 ? "" : "s");
    return failures ? 1 : 0;
}
