/* Unit test of the constraint engine (src/server/srv_grammar.h): the GBNF
 * parser (syntax, errors, limits, left recursion), the matcher (texts in and
 * out of a grammar, UTF-8 classes, repetitions, the vocabulary walk against
 * a token-by-token check), and the JSON Schema converter (texts drawn at
 * random from each schema's grammar parse with jansson and have the shape
 * the schema asks; unsupported keywords are refused by name). Hostile
 * grammars must be refused or bounded quickly. */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "server/srv_grammar.h"

static int g_fail;

#define CHECK(cond, ...)                                                                                               \
    do {                                                                                                               \
        if (!(cond)) {                                                                                                 \
            printf("FAIL %s:%d: ", __FILE__, __LINE__);                                                                \
            printf(__VA_ARGS__);                                                                                       \
            printf("\n");                                                                                              \
            g_fail++;                                                                                                  \
        }                                                                                                              \
    } while (0)

static double now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

static grammar *compile(const char *text) {
    char err[512];
    grammar *g = grammar_parse(text, strlen(text), err, sizeof err);
    CHECK(g, "grammar refused: %s\n%.300s", err, text);
    return g;
}

/* 1 when the whole text is a sentence of g. */
static int matches(const grammar *g, const char *text) {
    gmatch *m = gmatch_new(g);
    int ok = gmatch_feed(m, text, strlen(text)) == 0 && gmatch_accepting(m);
    gmatch_free(m);
    return ok;
}

static void expect_error(const char *text, const char *want) {
    char err[512];
    double t0 = now_s();
    grammar *g = grammar_parse(text, strlen(text), err, sizeof err);
    double dt = now_s() - t0;
    CHECK(!g && strstr(err, want), "want an error with '%s', got %s", want, g ? "a grammar" : err);
    CHECK(dt < 1.0, "refusing took %.2f s", dt);
    grammar_free(g);
    if (!g) printf("ok: refused (%.1f ms): %s\n", dt * 1e3, err);
}

static void test_parser(void) {
    grammar *g = compile("root ::= \"a\" b* | [x-z]+ \"!\"?   # a comment\nb ::= (\"b\" | \"B\"){2}\n");
    CHECK(matches(g, "a"), "a");
    CHECK(matches(g, "abbBb"), "abbBb");
    CHECK(!matches(g, "abbb"), "abbb is three b's");
    CHECK(matches(g, "xyz!"), "xyz!");
    CHECK(!matches(g, "!"), "!");
    CHECK(!matches(g, ""), "empty");
    grammar_free(g);
    g = compile("root ::= [^\"\\\\]{2,4} \"\\x41\" \"\\u00e9\" .\n");
    CHECK(matches(g, "ab"
                     "A"
                     "\xc3\xa9"
                     "z"),
          "two chars");
    CHECK(matches(g, "\xe2\x82\xac\xf0\x9f\x98\x80"
                     "A"
                     "\xc3\xa9"
                     "\xe4\xb8\xad"),
          "multibyte in negated class and .");
    CHECK(!matches(g, "a\""
                      "A"
                      "\xc3\xa9"
                      "z"),
          "a quote is not in [^\"\\\\]");
    CHECK(!matches(g, "abcde"
                      "A"
                      "\xc3\xa9"
                      "z"),
          "five is more than {2,4}");
    CHECK(!matches(g, "ab"
                      "A"
                      "\xc3\xa9"
                      "\xed\xa0\x80"),
          "a surrogate is not a character");
    CHECK(!matches(g, "ab"
                      "A"
                      "\xc3\xa9"
                      "\xc0\x80"),
          "an overlong encoding is not a character");
    grammar_free(g);
    g = compile("root ::= [α-ω]+ [\\U0001F600-\\U0001F64F]\n");
    CHECK(matches(g, "\xce\xb1\xce\xb2\xf0\x9f\x98\x80"), "greek then emoji");
    CHECK(!matches(g, "a\xf0\x9f\x98\x80"), "latin is not greek");
    grammar_free(g);
    /* nested groups over several lines, {m,} and {m} */
    g = compile("root ::= (\n  \"[\" (item (\",\" item)*)? \"]\"\n)\nitem ::= [0-9]{1,} | \"x\"{3}\n");
    CHECK(matches(g, "[1,22,xxx]"), "list");
    CHECK(matches(g, "[]"), "empty list");
    CHECK(!matches(g, "[xx]"), "xx");
    grammar_free(g);
    expect_error("root ::= \"a\" undefined-rule\n", "used but not defined");
    expect_error("start ::= \"a\"\n", "no 'root'");
    expect_error("root ::= \"a\"\nroot ::= \"b\"\n", "defined twice");
    expect_error("root ::= \"a\n", "not closed");
    expect_error("root ::= [a-\n", "not closed");
    expect_error("root ::= (\"a\"\n", "not closed");
    expect_error("root ::= \"a\"{5,2}\n", "below the minimum");
    expect_error("root ::= \"a\"{100000}\n", "repetition count");
    expect_error("root ::= [z-a]\n", "backwards");
    expect_error("root ::= \"\\q\"\n", "unknown escape");
    /* eight hex digits past int32 (the fuzzer's find: a signed overflow before the range check) */
    expect_error("root ::= \"\\U99999999\"\n", "beyond Unicode");
    expect_error("root ::= \"\\U0011FFFF\"\n", "beyond Unicode");
    expect_error("root ::= * \"a\"\n", "unexpected '*'");
    expect_error("root ::= \"\"*\n", "follows nothing");
}

static void test_hostile(void) {
    /* left recursion, direct and through a nullable prefix, and an empty loop */
    expect_error("root ::= root \"a\" | \"b\"\n", "left recursion");
    expect_error("root ::= x y\nx ::= \"a\"? \ny ::= z\nz ::= x? root \"a\"\n", "left recursion");
    expect_error("root ::= (\"a\"?)*\n", "left recursion");
    /* deep nesting */
    char *deep = malloc(100000);
    strcpy(deep, "root ::= ");
    for (int i = 0; i < 5000; i++) strcat(deep, "(");
    strcat(deep, "\"a\"");
    for (int i = 0; i < 5000; i++) strcat(deep, ")");
    strcat(deep, "\n");
    expect_error(deep, "nested deeper");
    /* a huge grammar: text over the limit, too many rules, repetitions that unroll past the elements */
    size_t big = GRAMMAR_MAX_TEXT + 10;
    char *huge = malloc(big + 1);
    memset(huge, ' ', big);
    memcpy(huge, "root ::= \"a\"", 12);
    huge[big] = 0;
    expect_error(huge, "more than");
    free(huge);
    huge = malloc(20 * 10000 + 100);
    huge[0] = 0;
    strcat(huge, "root ::= r0\n");
    char *p = huge + strlen(huge);
    for (int i = 0; i < 10000; i++) p += sprintf(p, "r%d ::= r%d\n", i, i + 1);
    sprintf(p, "r10000 ::= \"a\"\n");
    expect_error(huge, "rules");
    expect_error("root ::= (\"abcdefghijklmnop\"{2000}) (\"abcdefghijklmnop\"{2000}) (\"abcdefghijklmnop\"{2000})\n",
                 "too large");
    expect_error(
        "root ::= [a-z]{0,1000} [a-z]{0,1000} [a-z]{0,1000} [a-z]{0,1000} [a-z]{0,1000} [a-z]{0,1000} [a-z]{0,1000} "
        "[a-z]{0,1000} [a-z]{0,1000}\n",
        "rules");
    free(huge);
    free(deep);
    /* an ambiguous grammar: stacks stay bounded (one per distinct position) and a byte costs little */
    grammar *g = compile("root ::= (\"a\" | \"a\" | \"aa\")* x\nx ::= \"a\"* \"a\"* \"a\"* \"a\"* \"b\"\n");
    if (g) {
        double t0 = now_s();
        char s[2001];
        memset(s, 'a', 2000);
        s[2000] = 0;
        gmatch *m = gmatch_new(g);
        int rc = gmatch_feed(m, s, 2000);
        int done = gmatch_feed(m, "b", 1) == 0 && gmatch_accepting(m);
        gmatch_free(m);
        double dt = now_s() - t0;
        printf("ok: ambiguous grammar, 2001 bytes in %.1f ms (fed: %d, accepted: %d)\n", dt * 1e3, rc == 0, done);
        CHECK(dt < 2.0, "the ambiguous grammar took %.2f s", dt);
        grammar_free(g);
    }
    /* a grammar whose stacks explode: refused byte by byte within the limits, never a hang */
    g = compile("root ::= \"a\" root \"b\" | \"a\" root \"c\" | \"\"\n"); /* a^k: 2^k distinct stacks */
    if (g) {
        double t0 = now_s();
        gmatch *m = gmatch_new(g);
        int n = 0;
        for (int i = 0; i < 40; i++) n += gmatch_feed(m, "a", 1) == 0;
        gmatch_free(m);
        double dt = now_s() - t0;
        printf("ok: exploding grammar: %d of 40 bytes taken in %.1f ms (then the stacks would pass %d)\n", n, dt * 1e3,
               GRAMMAR_MAX_STACKS);
        CHECK(n >= 5 && n < 12, "%d bytes taken", n);
        CHECK(dt < 2.0, "the exploding grammar took %.2f s", dt);
        grammar_free(g);
    }
}

/* A token vocabulary for the walk: each piece checked alone must agree with the walk's verdict. */
static void test_vocab_walk(void) {
    static const char *const pieces[] = {"{",  "\"",   "\":",  "a",     "ab",       "abc", "abd", "b",    "}",  " ",
                                         "  ", "\n",   "\"a",  "\"b\"", "1",        "12",  "123", "true", "tr", "null",
                                         ",",  ", \"", "\xc3", "\xa9",  "\xc3\xa9", "{\"", "\"}", "x",    "-",  "-1",
                                         "0",  "00",   "[",    "]",     "\\",       "\\n", "\\u", "e"};
    int n = (int)(sizeof pieces / sizeof pieces[0]);
    /* the vocabulary table as srv_gen builds it: sorted pieces and common prefixes */
    uint32_t *off = malloc((size_t)(n + 1) * sizeof(uint32_t));
    char text[1024];
    size_t len = 0;
    for (int i = 0; i < n; i++) {
        off[i] = (uint32_t)len;
        memcpy(text + len, pieces[i], strlen(pieces[i]));
        len += strlen(pieces[i]);
    }
    off[n] = (uint32_t)len;
    int32_t ids[64];
    uint32_t lcp[64];
    for (int i = 0; i < n; i++) ids[i] = i;
    for (int i = 1; i < n; i++) /* insertion sort by bytes */
        for (int j = i; j > 0; j--) {
            const char *a = pieces[ids[j - 1]], *b = pieces[ids[j]];
            size_t la = strlen(a), lb = strlen(b), k = la < lb ? la : lb;
            int c = memcmp(a, b, k);
            if (c < 0 || (c == 0 && la <= lb)) break;
            int32_t t = ids[j];
            ids[j] = ids[j - 1];
            ids[j - 1] = t;
        }
    for (int i = 0; i < n; i++) {
        lcp[i] = 0;
        if (!i) continue;
        const char *a = pieces[ids[i - 1]], *b = pieces[ids[i]];
        while (a[lcp[i]] && a[lcp[i]] == b[lcp[i]]) lcp[i]++;
    }
    gmatch_vocab v = {.n = n, .ids = ids, .lcp = lcp, .text = text, .off = off};
    grammar *g = compile(grammar_json_object());
    gmatch *m = gmatch_new(g);
    uint8_t allowed[64];
    const char *prefix[] = {"", "{", "\"a", "b\"", ":", " 1", "2", ",", " \"", "\xc3", "\xa9\"", ":", "[", "-"};
    int steps = 0;
    for (size_t s = 0; s < sizeof prefix / sizeof prefix[0]; s++) {
        if (gmatch_feed(m, prefix[s], strlen(prefix[s])) != 0) {
            CHECK(0, "prefix piece '%s' refused", prefix[s]);
            break;
        }
        int cnt = gmatch_allowed(m, &v, allowed, n), want = 0;
        for (int t = 0; t < n; t++) {
            int one = gmatch_try(m, pieces[t], strlen(pieces[t]));
            want += one;
            CHECK(one == allowed[t], "after step %zu, piece '%s': walk says %d, alone %d", s, pieces[t], allowed[t],
                  one);
        }
        CHECK(cnt == want, "count %d vs %d", cnt, want);
        steps++;
    }
    printf("ok: the vocabulary walk agrees with token-by-token checks over %d states\n", steps);
    gmatch_free(m);
    grammar_free(g);
    free(off);
}

/* A random sentence of g: bytes drawn among those allowed, ending when finished, or by chance once accepting. */
static int random_text(const grammar *g, unsigned *seed, char *out, int cap) {
    gmatch *m = gmatch_new(g);
    int n = 0;
    while (n < cap - 1) {
        if (gmatch_finished(m) || (gmatch_accepting(m) && rand_r(seed) % 4 == 0)) break;
        unsigned char ok[256];
        int k = 0;
        for (int b = 1; b < 256; b++) {
            char c = (char)b;
            /* prefer printable ASCII so that texts end; other bytes rarely */
            if (b >= 0x80 && rand_r(seed) % 16) continue;
            if (gmatch_try(m, &c, 1)) ok[k++] = (unsigned char)b;
        }
        if (!k) break;
        /* closing brackets and quotes more often than the rest, so texts end */
        unsigned char pick = ok[rand_r(seed) % k];
        for (int i = 0; i < k; i++)
            if ((ok[i] == '}' || ok[i] == ']' || ok[i] == '"') && rand_r(seed) % 3 == 0) pick = ok[i];
        out[n++] = (char)pick;
        gmatch_feed(m, (char *)&pick, 1);
    }
    out[n] = 0;
    int acc = gmatch_accepting(m);
    gmatch_free(m);
    return acc ? n : -1;
}

static json_t *schema_sample(const char *schema_text, unsigned seed, int n, json_t **first) {
    json_error_t je;
    json_t *schema = json_loads(schema_text, 0, &je);
    char err[512];
    size_t len;
    char *text = grammar_from_schema(schema, &len, err, sizeof err);
    CHECK(text, "schema refused: %s", err);
    json_decref(schema);
    if (!text) return NULL;
    grammar *g = compile(text);
    free(text);
    if (!g) return NULL;
    json_t *all = json_array();
    char buf[4096];
    for (int i = 0; i < n; i++) {
        int k = random_text(g, &seed, buf, sizeof buf);
        if (k < 0) continue; /* ran past the buffer: not a sentence yet */
        json_t *v = json_loads(buf, JSON_DECODE_ANY, &je);
        CHECK(v, "not JSON: %s (%s)", buf, je.text);
        if (v) json_array_append_new(all, v);
    }
    grammar_free(g);
    if (first) *first = json_array_get(all, 0);
    return all;
}

static void test_schema(void) {
    const char *weather = "{\"type\":\"object\",\"properties\":{\"city\":{\"type\":\"string\",\"maxLength\":12},"
                          "\"unit\":{\"enum\":[\"C\",\"F\"]},\"days\":{\"type\":\"integer\"},\"rain\":{\"type\":"
                          "\"boolean\"},\"tags\":{\"type\":\"array\",\"items\":{\"type\":\"string\",\"maxLength\":3},"
                          "\"minItems\":1,\"maxItems\":3},\"note\":{\"type\":[\"string\",\"null\"],\"maxLength\":5}},"
                          "\"required\":[\"city\",\"unit\"]}";
    json_t *all = schema_sample(weather, 7, 200, NULL), *v;
    size_t i;
    int bad = 0, with_opt = 0;
    json_array_foreach(all, i, v) {
        json_t *city = json_object_get(v, "city"), *unit = json_object_get(v, "unit"),
               *tags = json_object_get(v, "tags");
        json_t *days = json_object_get(v, "days"), *rain = json_object_get(v, "rain"),
               *note = json_object_get(v, "note");
        int ok = json_is_object(v) && json_is_string(city) && json_is_string(unit) &&
                 (!strcmp(json_string_value(unit), "C") || !strcmp(json_string_value(unit), "F")) &&
                 (!days || json_is_integer(days)) && (!rain || json_is_boolean(rain)) &&
                 (!tags || (json_is_array(tags) && json_array_size(tags) >= 1 && json_array_size(tags) <= 3)) &&
                 (!note || json_is_null(note) || json_is_string(note));
        const char *k;
        json_t *x;
        json_object_foreach(v, k, x) ok &= !strcmp(k, "city") || !strcmp(k, "unit") || !strcmp(k, "days") ||
                                           !strcmp(k, "rain") || !strcmp(k, "tags") || !strcmp(k, "note");
        with_opt += json_object_size(v) > 2;
        if (!ok) {
            char *t = json_dumps(v, 0);
            CHECK(0, "sample does not fit the schema: %s", t);
            free(t);
            bad++;
        }
    }
    CHECK(json_array_size(all) > 150 && with_opt > 10, "%zu samples, %d with optional properties", json_array_size(all),
          with_opt);
    printf("ok: %zu random texts of the weather schema parse and fit it (%d with optional properties)\n",
           json_array_size(all), with_opt);
    json_decref(all);

    /* anyOf, $defs recursion, const, oneOf of distinct types, additionalProperties schema */
    const char *tree =
        "{\"$defs\":{\"node\":{\"type\":\"object\",\"properties\":{\"v\":{\"const\":1},\"kids\":{"
        "\"type\":\"array\",\"items\":{\"$ref\":\"#/$defs/node\"},\"maxItems\":2}},\"required\":[\"v\"]}},"
        "\"anyOf\":[{\"$ref\":\"#/$defs/node\"},{\"oneOf\":[{\"type\":\"null\"},{\"type\":\"number\"}]},"
        "{\"type\":\"object\",\"additionalProperties\":{\"type\":\"boolean\"}}]}";
    all = schema_sample(tree, 3, 100, NULL);
    int objs = 0;
    json_array_foreach(all, i, v) objs += json_is_object(v);
    CHECK(json_array_size(all) > 50 && objs > 5, "tree samples %zu, objects %d", json_array_size(all), objs);
    printf("ok: %zu random texts of a recursive anyOf/oneOf/$defs schema parse (%d objects)\n", json_array_size(all),
           objs);
    json_decref(all);

    /* a long enum (500 values sharing prefixes, and numbers, null): every random text is one of them, and
     * the values are open at once as a prefix tree, within the parse-stack limit */
    {
        char *big = malloc(40000), *p = big;
        p += sprintf(p, "{\"enum\":[");
        for (int k = 0; k < 500; k++) p += sprintf(p, "\"Region%d/City%d\",", k % 23, k);
        p += sprintf(p, "1,12,123,null,\"Region1\"]}");
        json_t *one;
        all = schema_sample(big, 11, 300, &one);
        int in_set = 0;
        json_array_foreach(all, i, v) {
            int ok = json_is_null(v) ||
                     (json_is_integer(v) &&
                      (json_integer_value(v) == 1 || json_integer_value(v) == 12 || json_integer_value(v) == 123));
            if (json_is_string(v)) {
                int a, b;
                ok = !strcmp(json_string_value(v), "Region1") ||
                     (sscanf(json_string_value(v), "Region%d/City%d", &a, &b) == 2 && b < 500 && a == b % 23);
            }
            in_set += ok;
        }
        CHECK(json_array_size(all) == 300 && in_set == 300, "%d of %zu enum texts in the set", in_set,
              json_array_size(all));
        printf("ok: 300 random texts of a 505-value enum are all values of it\n");
        json_decref(all);
        free(big);
    }

    static const struct {
        const char *schema, *want;
    } refused[] = {
        {"{\"type\":\"string\",\"pattern\":\"^a\"}", "'pattern'"},
        {"{\"type\":\"string\",\"format\":\"date\"}", "'format'"},
        {"{\"type\":\"integer\",\"minimum\":3}", "'minimum'"},
        {"{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"number\",\"multipleOf\":2}}}", "properties.a"},
        {"{\"type\":\"object\",\"required\":[\"x\"],\"properties\":{}}", "not among the 'properties'"},
        {"{\"oneOf\":[{\"type\":\"integer\"},{\"type\":\"number\"}]}", "overlaps"},
        {"{\"allOf\":[{\"type\":\"integer\"},{\"type\":\"number\"}]}", "allOf"},
        {"{\"$ref\":\"https://example.com/s.json\"}", "'$ref'"},
        {"{\"type\":\"wizard\"}", "'type'"},
        {"{\"type\":\"array\",\"items\":[{\"type\":\"string\"}]}", "tuples"},
        {"{\"type\":\"string\",\"maxLength\":100000}", "maxLength"},
        {"{\"not\":{}}", "'not'"},
        {"{\"anyOf\":[{\"type\":\"string\"}],\"minLength\":2}", "beside"},
    };
    for (size_t k = 0; k < sizeof refused / sizeof refused[0]; k++) {
        json_t *s = json_loads(refused[k].schema, 0, NULL);
        char err[512];
        size_t len;
        char *t = grammar_from_schema(s, &len, err, sizeof err);
        CHECK(!t && strstr(err, refused[k].want), "%s: want a refusal with %s, got %s", refused[k].schema,
              refused[k].want, t ? "a grammar" : err);
        if (!t) printf("ok: refused: %s\n", err);
        free(t);
        json_decref(s);
    }
    /* a schema with very many properties makes a grammar over the limit: refused, quickly */
    json_t *props = json_object(), *big = json_pack("{s:s, s:o}", "type", "object", "properties", props);
    for (int k = 0; k < 20000; k++) {
        char nm[32];
        snprintf(nm, sizeof nm, "property_number_%d", k);
        json_object_set_new(props, nm, json_pack("{s:s}", "type", "string"));
    }
    char err[512];
    size_t len;
    double t0 = now_s();
    char *t = grammar_from_schema(big, &len, err, sizeof err);
    grammar *g = t ? grammar_parse(t, len, err, sizeof err) : NULL;
    CHECK(!g, "a 20000-property schema was taken");
    printf("ok: a 20000-property schema refused in %.1f ms: %s\n", (now_s() - t0) * 1e3, err);
    grammar_free(g);
    free(t);
    json_decref(big);
}

int main(void) {
    test_parser();
    test_hostile();
    test_vocab_walk();
    test_schema();
    printf("%s\n", g_fail ? "FAILED" : "all passed");
    return g_fail ? 1 : 0;
}
