/* JSON Schema to grammar (srv_grammar.h): each schema node becomes a rule
 * `<name>-<n>`, written into one growing text together with the shared rules
 * of JSON (json-ws, json-string, ...), which are appended once at the end.
 *
 * Objects list their properties in the schema's order. With p0..pn-1 and
 * some optional, the commas are placed by two chains of rules:
 *     F(i) ::= kv(i) A(i+1)            (p_i required: it is the first one written)
 *     F(i) ::= kv(i) A(i+1) | F(i+1)   (p_i optional: it is the first, or it is left out)
 *     A(i) ::= "," kv(i) A(i+1)        (required, after the first)
 *     A(i) ::= ("," kv(i))? A(i+1)     (optional, after the first)
 * which is linear in the number of properties.
 *
 * The converter refuses what it cannot enforce rather than generate text
 * that a validator would reject: an unknown keyword, a numeric bound, a
 * pattern or format, oneOf whose branches overlap, a required name that is
 * not among the properties. Every refusal names the keyword and the path. */
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "core/alloc.h"
#include "server/srv_grammar.h"

#define SCHEMA_MAX_DEPTH 64

struct gschema {
    char *s;
    size_t len, cap;
    int over;           /* the text passed GRAMMAR_MAX_TEXT: nothing more is written */
    const json_t *root; /* of the schema being added: where $refs point */
    const char *name;   /* its rule prefix */
    int n;              /* rules made under that prefix */
    json_t *refs;       /* "$ref" text -> rule number, per schema */
    char *err;
    size_t errcap;
    int failed;
};

static void put(gschema *c, const char *t, size_t n) {
    if (c->over) return;
    if (c->len + n + 1 > GRAMMAR_MAX_TEXT + 1) {
        c->over = 1;
        return;
    }
    if (c->len + n + 1 > c->cap) {
        c->cap = (c->len + n + 1) * 2;
        c->s = st_realloc(c->s, c->cap);
    }
    memcpy(c->s + c->len, t, n);
    c->len += n;
    c->s[c->len] = 0;
}

static void puts_(gschema *c, const char *t) { put(c, t, strlen(t)); }

static void putf(gschema *c, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void putf(gschema *c, const char *fmt, ...) {
    char buf[512];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    put(c, buf, n < 0 ? 0 : (size_t)n < sizeof buf ? (size_t)n : sizeof buf - 1);
}

void gschema_put(gschema *c, const char *text) { puts_(c, text); }

void gschema_put_literal(gschema *c, const char *s, size_t n) {
    put(c, "\"", 1);
    for (size_t i = 0; i < n; i++) {
        unsigned char ch = (unsigned char)s[i];
        char buf[8];
        if (ch == '"' || ch == '\\') {
            buf[0] = '\\';
            buf[1] = (char)ch;
            put(c, buf, 2);
        } else if (ch < 0x20 || ch == 0x7F) {
            snprintf(buf, sizeof buf, "\\x%02X", ch);
            put(c, buf, 4);
        } else put(c, (const char *)&s[i], 1);
    }
    put(c, "\"", 1);
}

static int sfail(gschema *c, const char *path, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static int sfail(gschema *c, const char *path, const char *fmt, ...) {
    if (c->failed) return -1;
    c->failed = 1;
    va_list ap;
    va_start(ap, fmt);
    int k = vsnprintf(c->err, c->errcap, fmt, ap);
    va_end(ap);
    if (k >= 0 && (size_t)k < c->errcap)
        snprintf(c->err + k, c->errcap - (size_t)k, " (at %s)", *path ? path : "the top of the schema");
    return -1;
}

gschema *gschema_new(void) {
    gschema *c = st_calloc(1, sizeof *c);
    puts_(c, "");
    return c;
}

void gschema_free(gschema *c) {
    if (!c) return;
    st_free(c->s);
    json_decref(c->refs);
    st_free(c);
}

/* ---- types ---- */
enum {
    T_OBJ = 1,
    T_ARR = 2,
    T_STR = 4,
    T_NUM = 8 /* not integral */,
    T_INT = 16,
    T_BOOL = 32,
    T_NULL = 64,
    T_ALL = 127
};

static int type_bit(const char *t) {
    static const struct {
        const char *n;
        int b;
    } T[] = {{"object", T_OBJ},  {"array", T_ARR},    {"string", T_STR}, {"number", T_NUM | T_INT},
             {"integer", T_INT}, {"boolean", T_BOOL}, {"null", T_NULL}};
    for (size_t i = 0; i < sizeof T / sizeof T[0]; i++)
        if (!strcmp(t, T[i].n)) return T[i].b;
    return 0;
}

static int value_bit(const json_t *v) {
    switch (json_typeof(v)) {
    case JSON_OBJECT: return T_OBJ;
    case JSON_ARRAY: return T_ARR;
    case JSON_STRING: return T_STR;
    case JSON_INTEGER: return T_INT;
    case JSON_REAL: {
        double d = json_real_value(v);
        return d == (double)(long long)d ? T_INT : T_NUM;
    }
    case JSON_TRUE:
    case JSON_FALSE: return T_BOOL;
    default: return T_NULL;
    }
}

static const char *const ANNOTATIONS[] = {"title", "description", "default",    "examples", "$schema",
                                          "$id",   "$comment",    "deprecated", "readOnly", "writeOnly",
                                          "$defs", "definitions", NULL};
static const char *const KNOWN[] = {"type",      "properties", "required", "additionalProperties",
                                    "items",     "minItems",   "maxItems", "minLength",
                                    "maxLength", "enum",       "const",    "anyOf",
                                    "oneOf",     "allOf",      "$ref",     NULL};

static int in_list(const char *k, const char *const *l) {
    for (; *l; l++)
        if (!strcmp(k, *l)) return 1;
    return 0;
}

static int conv(gschema *c, const json_t *s, const char *path, int depth);

static void sub_path(char *out, size_t cap, const char *path, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static void sub_path(char *out, size_t cap, const char *path, const char *fmt, ...) {
    int k = snprintf(out, cap, "%s%s", path, *path ? "." : "");
    va_list ap;
    va_start(ap, fmt);
    if (k >= 0 && (size_t)k < cap) vsnprintf(out + k, cap - (size_t)k, fmt, ap);
    va_end(ap);
}

/* A non-negative integer keyword, at most GRAMMAR_MAX_REPEAT: the value, -1 absent, -2 error. */
static long count_kw(gschema *c, const json_t *s, const char *kw, const char *path) {
    json_t *v = json_object_get(s, kw);
    if (!v) return -1;
    if (!json_is_integer(v) || json_integer_value(v) < 0)
        return sfail(c, path, "'%s' must be a non-negative integer", kw), -2;
    if (json_integer_value(v) > GRAMMAR_MAX_REPEAT)
        return sfail(c, path, "'%s' above %d cannot be enforced by this server", kw, GRAMMAR_MAX_REPEAT), -2;
    return (long)json_integer_value(v);
}

/* A rule number for the expression that follows: "<name>-<n> ::= ". */
static int rule_begin(gschema *c) {
    int n = c->n++;
    putf(c, "%s-%d ::= ", c->name, n);
    return n;
}

/* {m,n} text of a repetition ("" when exactly once is meant by the caller). */
static void put_repeat(gschema *c, long mn, long mx) {
    if (mn <= 0 && mx < 0) puts_(c, "*");
    else if (mx < 0) putf(c, "{%ld,}", mn);
    else putf(c, "{%ld,%ld}", mn < 0 ? 0 : mn, mx);
}

static int conv_object(gschema *c, const json_t *s, const char *path, int depth) {
    json_t *props = json_object_get(s, "properties"), *req = json_object_get(s, "required");
    json_t *addl = json_object_get(s, "additionalProperties");
    char p2[512];
    if (props && !json_is_object(props)) return sfail(c, path, "'properties' must be an object");
    if (req && !json_is_array(req)) return sfail(c, path, "'required' must be an array of names");
    if (addl && !json_is_boolean(addl) && !json_is_object(addl))
        return sfail(c, path, "'additionalProperties' must be a boolean or a schema");
    size_t i;
    json_t *r;
    json_array_foreach(req, i, r) {
        if (!json_is_string(r)) return sfail(c, path, "'required' must be an array of names");
        if (!json_object_get(props, json_string_value(r)))
            return sfail(c, path,
                         "'required' names '%s', which is not among the 'properties' (this server "
                         "generates only listed properties)",
                         json_string_value(r));
    }
    if (!props || json_object_size(props) == 0) {
        if (addl && json_is_false(addl)) {
            int n = rule_begin(c);
            puts_(c, "\"{\" json-ws \"}\"\n");
            return n;
        }
        if (json_is_object(addl) && json_object_size(addl)) { /* members of one schema */
            sub_path(p2, sizeof p2, path, "additionalProperties");
            int v = conv(c, addl, p2, depth + 1);
            if (v < 0) return -1;
            int n = rule_begin(c);
            putf(c,
                 "\"{\" json-ws ( json-string json-ws \":\" json-ws %s-%d json-ws ( \",\" json-ws json-string "
                 "json-ws \":\" json-ws %s-%d json-ws )* )? \"}\"\n",
                 c->name, v, c->name, v);
            return n;
        }
        int n = rule_begin(c);
        puts_(c, "json-object\n");
        return n;
    }
    size_t np = json_object_size(props);
    int *kv = st_malloc(np * sizeof(int));
    uint8_t *required = st_calloc(np, 1);
    const char *key;
    json_t *sub;
    i = 0;
    int rc = 0;
    json_object_foreach(props, key, sub) {
        sub_path(p2, sizeof p2, path, "properties.%s", key);
        int v = conv(c, sub, p2, depth + 1);
        if (v < 0) {
            rc = -1;
            break;
        }
        size_t k;
        json_array_foreach(req, k, r) if (!strcmp(json_string_value(r), key)) required[i] = 1;
        kv[i] = rule_begin(c); /* kv ::= "\"key\"" ws ":" ws value ws */
        json_t *ks = json_string(key);
        char *kt = json_dumps(ks, JSON_ENCODE_ANY);
        json_decref(ks);
        gschema_put_literal(c, kt, strlen(kt));
        free(kt);
        putf(c, " json-ws \":\" json-ws %s-%d json-ws\n", c->name, v);
        i++;
    }
    int n = -1;
    if (rc == 0) {
        /* A(i) and F(i) for i = np .. 0, numbered from base */
        int baseA = c->n;
        c->n += (int)np + 1;
        int baseF = c->n;
        c->n += (int)np + 1;
        putf(c, "%s-%d ::= \"\"\n%s-%d ::= \"\"\n", c->name, baseA + (int)np, c->name, baseF + (int)np);
        for (size_t q = np; q-- > 0;) {
            if (required[q])
                putf(c, "%s-%d ::= \",\" json-ws %s-%d %s-%d\n%s-%d ::= %s-%d %s-%d\n", c->name, baseA + (int)q,
                     c->name, kv[q], c->name, baseA + (int)q + 1, c->name, baseF + (int)q, c->name, kv[q], c->name,
                     baseA + (int)q + 1);
            else
                putf(c, "%s-%d ::= ( \",\" json-ws %s-%d )? %s-%d\n%s-%d ::= %s-%d %s-%d | %s-%d\n", c->name,
                     baseA + (int)q, c->name, kv[q], c->name, baseA + (int)q + 1, c->name, baseF + (int)q, c->name,
                     kv[q], c->name, baseA + (int)q + 1, c->name, baseF + (int)q + 1);
        }
        n = rule_begin(c);
        putf(c, "\"{\" json-ws %s-%d \"}\"\n", c->name, baseF);
    }
    st_free(kv);
    st_free(required);
    return n;
}

static int conv_array(gschema *c, const json_t *s, const char *path, int depth) {
    json_t *items = json_object_get(s, "items");
    long mn = count_kw(c, s, "minItems", path), mx = count_kw(c, s, "maxItems", path);
    if (mn == -2 || mx == -2) return -1;
    if (mx >= 0 && mn > mx) return sfail(c, path, "'minItems' is above 'maxItems'");
    int v;
    char p2[512];
    if (items && !json_is_object(items) && !json_is_boolean(items))
        return sfail(c, path, "'items' as a list (tuples) is not supported: give one schema");
    if (items && json_is_false(items)) {
        if (mn > 0) return sfail(c, path, "'items' false with 'minItems' above 0 allows nothing");
        v = -1;
    } else if (items && json_is_object(items)) {
        sub_path(p2, sizeof p2, path, "items");
        if ((v = conv(c, items, p2, depth + 1)) < 0) return -1;
    } else v = -1;
    int n = rule_begin(c);
    if (items && json_is_false(items)) {
        puts_(c, "\"[\" json-ws \"]\"\n");
        return n;
    }
    char item[64];
    if (v >= 0) snprintf(item, sizeof item, "%s-%d", c->name, v);
    else snprintf(item, sizeof item, "json-value");
    if (mx == 0) {
        puts_(c, "\"[\" json-ws \"]\"\n");
        return n;
    }
    /* "[" ws ( item ws ( "," ws item ws ){min-1, max-1} )? "]"; optional only when min is 0 */
    putf(c, "\"[\" json-ws ( %s json-ws ( \",\" json-ws %s json-ws )", item, item);
    put_repeat(c, mn > 0 ? mn - 1 : 0, mx < 0 ? -1 : mx - 1);
    puts_(c, mn > 0 ? " ) \"]\"\n" : " )? \"]\"\n");
    return n;
}

static int conv_string(gschema *c, const json_t *s, const char *path) {
    long mn = count_kw(c, s, "minLength", path), mx = count_kw(c, s, "maxLength", path);
    if (mn == -2 || mx == -2) return -1;
    if (mx >= 0 && mn > mx) return sfail(c, path, "'minLength' is above 'maxLength'");
    int n = rule_begin(c);
    if (mn <= 0 && mx < 0) {
        puts_(c, "json-string\n");
        return n;
    }
    puts_(c, "\"\\\"\" json-char");
    put_repeat(c, mn, mx);
    puts_(c, " \"\\\"\"\n");
    return n;
}

/* One type's expression for schema s (its keywords of other types do not apply). */
static int conv_type(gschema *c, const json_t *s, int bit, const char *path, int depth) {
    switch (bit) {
    case T_OBJ: return conv_object(c, s, path, depth);
    case T_ARR: return conv_array(c, s, path, depth);
    case T_STR: return conv_string(c, s, path);
    default: break;
    }
    int n = rule_begin(c);
    puts_(c, bit == (T_NUM | T_INT) ? "json-number\n"
             : bit == T_INT         ? "json-integer\n"
             : bit == T_BOOL        ? "( \"true\" | \"false\" )\n"
                                    : "\"null\"\n");
    return n;
}

/* enum / const values as a prefix tree of literals: a rule per branching point, so that the values
 * open at once are their distinct next bytes (at most 256), not one parse stack per value, which a
 * long enum (time zones, countries) would need beyond GRAMMAR_MAX_STACKS. */
typedef struct {
    char *s;
    size_t n;
} lit;

static int lit_cmp(const void *a, const void *b) {
    const lit *x = a, *y = b;
    int c = memcmp(x->s, y->s, x->n < y->n ? x->n : y->n);
    return c ? c : (x->n > y->n) - (x->n < y->n);
}

/* The rule for v[lo..hi) (sorted, sharing their first d bytes, at least two or one longer than d). */
static int trie_rule(gschema *c, const lit *v, int lo, int hi, size_t d) {
    struct alt {
        const char *s;
        size_t n;
        int child; /* -1: the literal ends the value */
    } *alts = st_malloc((size_t)(hi - lo) * sizeof *alts);
    int na = 0, has_end = 0;
    int i = lo;
    if (v[i].n == d) { /* a value ends here (sorted first) */
        has_end = 1;
        i++;
    }
    while (i < hi) {
        int j = i + 1;
        while (j < hi && v[j].s[d] == v[i].s[d]) j++;
        size_t L = d + 1; /* the group's common prefix: that of its first and last (sorted) */
        while (L < v[i].n && L < v[j - 1].n && v[i].s[L] == v[j - 1].s[L]) L++;
        int child = -1;
        if (j - i > 1 || v[i].n > L) child = trie_rule(c, v, i, j, L);
        alts[na++] = (struct alt){v[i].s + d, L - d, child};
        i = j;
    }
    int n = rule_begin(c);
    for (int k = 0; k < na; k++) {
        if (k) puts_(c, " | ");
        gschema_put_literal(c, alts[k].s, alts[k].n);
        if (alts[k].child >= 0) putf(c, " %s-%d", c->name, alts[k].child);
    }
    puts_(c, has_end ? (na ? " | \"\"\n" : "\"\"\n") : "\n");
    st_free(alts);
    return n;
}

/* The literal values of enum / const (those of the allowed types). */
static int conv_values(gschema *c, const json_t *vals, int types, const char *kw, const char *path) {
    size_t nv = json_array_size(vals), i;
    lit *v = st_malloc((nv ? nv : 1) * sizeof *v);
    int n = 0;
    json_t *x;
    json_array_foreach(vals, i, x) {
        if (!(value_bit(x) & types)) continue;
        char *t = json_dumps(x, JSON_ENCODE_ANY | JSON_COMPACT);
        v[n++] = (lit){t, strlen(t)};
    }
    if (!n) {
        st_free(v);
        return sfail(c, path, "'%s' has no value of the schema's type", kw);
    }
    qsort(v, (size_t)n, sizeof *v, lit_cmp);
    int m = 0; /* equal values once */
    for (int k = 0; k < n; k++) {
        if (m && !lit_cmp(&v[m - 1], &v[k])) free(v[k].s);
        else v[m++] = v[k];
    }
    int r = trie_rule(c, v, 0, m, 0);
    for (int k = 0; k < m; k++) free(v[k].s);
    st_free(v);
    return r;
}

/* The type bits a schema's values can have (for oneOf): T_ALL when unknown. */
static int schema_types(gschema *c, const json_t *s, int depth) {
    if (!json_is_object(s) || depth > SCHEMA_MAX_DEPTH) return T_ALL;
    json_t *t = json_object_get(s, "type"), *v;
    if (json_is_string(t)) return type_bit(json_string_value(t));
    int bits = 0;
    size_t i;
    if (json_is_array(t)) {
        json_array_foreach(t, i, v) bits |= json_is_string(v) ? type_bit(json_string_value(v)) : 0;
        return bits;
    }
    if ((v = json_object_get(s, "const"))) return value_bit(v);
    if (json_is_array(v = json_object_get(s, "enum"))) {
        json_t *e;
        json_array_foreach(v, i, e) bits |= value_bit(e);
        return bits;
    }
    if (json_is_array(v = json_object_get(s, "anyOf")) || json_is_array(v = json_object_get(s, "oneOf"))) {
        json_t *e;
        json_array_foreach(v, i, e) bits |= schema_types(c, e, depth + 1);
        return bits;
    }
    (void)c;
    return T_ALL;
}

static const json_t *resolve_ref(gschema *c, const char *ref) {
    if (!strcmp(ref, "#")) return c->root;
    static const char *const pre[] = {"#/$defs/", "#/definitions/"};
    for (int k = 0; k < 2; k++) {
        size_t L = strlen(pre[k]);
        if (!strncmp(ref, pre[k], L) && !strchr(ref + L, '/') && !strchr(ref + L, '~'))
            return json_object_get(json_object_get(c->root, k ? "definitions" : "$defs"), ref + L);
    }
    return NULL;
}

static int conv(gschema *c, const json_t *s, const char *path, int depth) {
    if (c->failed) return -1;
    if (c->over) return sfail(c, path, "the schema makes a grammar over %zu bytes", GRAMMAR_MAX_TEXT);
    if (depth > SCHEMA_MAX_DEPTH) return sfail(c, path, "the schema is nested deeper than %d", SCHEMA_MAX_DEPTH);
    if (json_is_true(s) || (json_is_object(s) && json_object_size(s) == 0)) { /* anything */
        int n = rule_begin(c);
        puts_(c, "json-value\n");
        return n;
    }
    if (!json_is_object(s)) return sfail(c, path, "a schema must be an object or true");
    const char *key;
    json_t *v;
    int n_valid = 0; /* validation keywords besides type */
    json_object_foreach((json_t *)s, key, v) {
        if (in_list(key, ANNOTATIONS)) continue;
        if (!in_list(key, KNOWN))
            return sfail(c, path,
                         "the JSON Schema keyword '%s' is not supported by this server's constrained "
                         "decoding",
                         key);
        if (strcmp(key, "type")) n_valid++;
    }
    char p2[512];
    json_t *ref = json_object_get(s, "$ref");
    json_t *comb = NULL;
    const char *comb_kw = NULL;
    static const char *const COMBS[] = {"anyOf", "oneOf", "allOf", "enum", "const", "$ref"};
    for (int k = 0; k < 6; k++)
        if (json_object_get(s, COMBS[k])) {
            if (comb_kw) return sfail(c, path, "'%s' together with '%s' is not supported", comb_kw, COMBS[k]);
            comb_kw = COMBS[k];
            comb = json_object_get(s, COMBS[k]);
        }
    json_t *type = json_object_get(s, "type");
    int types = 0;
    if (type) {
        size_t i;
        json_t *t;
        if (json_is_string(type)) types = type_bit(json_string_value(type));
        else if (json_is_array(type) && json_array_size(type)) {
            json_array_foreach(type, i, t) {
                int b = json_is_string(t) ? type_bit(json_string_value(t)) : 0;
                if (!b) return sfail(c, path, "'type' must name JSON Schema types");
                types |= b;
            }
        }
        if (!types)
            return sfail(c, path,
                         "'type' must be one of object, array, string, number, integer, boolean, "
                         "null, or a list of them");
    }
    if (comb_kw) {
        int enum_like = !strcmp(comb_kw, "enum") || !strcmp(comb_kw, "const");
        if (n_valid > 1 || (type && !enum_like))
            return sfail(c, path, "'%s' beside other validation keywords is not supported: put them inside it",
                         comb_kw);
        if (!strcmp(comb_kw, "const")) {
            json_t *one = json_pack("[O]", comb);
            int n = conv_values(c, one, types ? types : T_ALL, "const", path);
            json_decref(one);
            return n;
        }
        if (!strcmp(comb_kw, "enum")) {
            if (!json_is_array(comb) || !json_array_size(comb))
                return sfail(c, path, "'enum' must be a non-empty array");
            return conv_values(c, comb, types ? types : T_ALL, "enum", path);
        }
        if (ref) {
            if (!json_is_string(ref)) return sfail(c, path, "'$ref' must be a string");
            const char *rs = json_string_value(ref);
            json_t *done = json_object_get(c->refs, rs);
            if (done) {
                int n = rule_begin(c);
                putf(c, "%s-%d\n", c->name, (int)json_integer_value(done));
                return n;
            }
            const json_t *target = resolve_ref(c, rs);
            if (!target)
                return sfail(c, path,
                             "'$ref' '%s' is not supported: only #, #/$defs/NAME and #/definitions/NAME of "
                             "the same schema",
                             rs);
            int n = c->n++; /* reserved first, so that a recursive reference finds it */
            json_object_set_new(c->refs, rs, json_integer(n));
            sub_path(p2, sizeof p2, path, "$ref");
            int t = conv(c, target, p2, depth + 1);
            if (t < 0) return -1;
            putf(c, "%s-%d ::= %s-%d\n", c->name, n, c->name, t);
            return n;
        }
        if (!json_is_array(comb) || !json_array_size(comb))
            return sfail(c, path, "'%s' must be a non-empty array of schemas", comb_kw);
        if (!strcmp(comb_kw, "allOf")) {
            if (json_array_size(comb) != 1) return sfail(c, path, "'allOf' with more than one schema is not supported");
            sub_path(p2, sizeof p2, path, "allOf.0");
            return conv(c, json_array_get(comb, 0), p2, depth + 1);
        }
        size_t nb = json_array_size(comb), i;
        json_t *b;
        if (!strcmp(comb_kw, "oneOf")) { /* exactly one branch may match: they must not overlap */
            int seen = 0;
            json_array_foreach(comb, i, b) {
                int t = schema_types(c, b, depth + 1);
                if (t & seen)
                    return sfail(c, path,
                                 "'oneOf' whose branches can match the same value is not supported "
                                 "(branch %zu overlaps an earlier one; use anyOf)",
                                 i);
                seen |= t;
            }
        }
        int *sub = st_malloc(nb * sizeof(int));
        json_array_foreach(comb, i, b) {
            sub_path(p2, sizeof p2, path, "%s.%zu", comb_kw, i);
            if ((sub[i] = conv(c, b, p2, depth + 1)) < 0) {
                st_free(sub);
                return -1;
            }
        }
        int n = rule_begin(c);
        for (i = 0; i < nb; i++) putf(c, "%s%s-%d", i ? " | " : "", c->name, sub[i]);
        puts_(c, "\n");
        st_free(sub);
        return n;
    }
    if (!types) { /* no type: the keywords say which, else any value */
        if (json_object_get(s, "properties") || json_object_get(s, "required") ||
            json_object_get(s, "additionalProperties"))
            types = T_OBJ;
        else if (json_object_get(s, "items") || json_object_get(s, "minItems") || json_object_get(s, "maxItems"))
            types = T_ARR;
        else if (json_object_get(s, "minLength") || json_object_get(s, "maxLength")) types = T_STR;
        else {
            int n = rule_begin(c);
            puts_(c, "json-value\n");
            return n;
        }
    }
    static const int ORDER[] = {T_OBJ, T_ARR, T_STR, T_NUM | T_INT, T_INT, T_BOOL, T_NULL};
    int sub[7], k = 0;
    for (int q = 0; q < 7; q++) {
        int bit = ORDER[q];
        if ((types & bit) != bit || (bit == T_INT && (types & T_NUM))) continue;
        if ((sub[k] = conv_type(c, s, bit, path, depth)) < 0) return -1;
        k++;
    }
    if (k == 1) return sub[0];
    int n = rule_begin(c);
    for (int q = 0; q < k; q++) putf(c, "%s%s-%d", q ? " | " : "", c->name, sub[q]);
    puts_(c, "\n");
    return n;
}

int gschema_add(gschema *c, const json_t *schema, const char *name, char *err, size_t errcap) {
    char pre[72];
    snprintf(pre, sizeof pre, "%s-s", name);
    c->root = schema;
    c->name = pre;
    c->n = 0;
    c->err = err;
    c->errcap = errcap;
    c->failed = 0;
    json_decref(c->refs);
    c->refs = json_object();
    int n = conv(c, schema, "", 0);
    if (n >= 0 && c->over) n = sfail(c, "", "the schema makes a grammar over %zu bytes", GRAMMAR_MAX_TEXT);
    if (n < 0) return -1;
    putf(c, "%s ::= %s-%d\n", name, pre, n);
    c->name = NULL;
    return 0;
}

#define JSON_RULES                                                                                                     \
    "json-ws ::= ( \" \" | \"\\n\" [ \\t]{0,20} )?\n"                                                                  \
    "json-value ::= json-object | json-array | json-string | json-number | \"true\" | \"false\" | \"null\"\n"          \
    "json-object ::= \"{\" json-ws ( json-member ( \",\" json-ws json-member )* )? \"}\"\n"                            \
    "json-member ::= json-string json-ws \":\" json-ws json-value json-ws\n"                                           \
    "json-array ::= \"[\" json-ws ( json-value json-ws ( \",\" json-ws json-value json-ws )* )? \"]\"\n"               \
    "json-string ::= \"\\\"\" json-char* \"\\\"\"\n"                                                                   \
    "json-char ::= [^\"\\\\\\x00-\\x1F] | \"\\\\\" [\"\\\\/bfnrt]\n"                                                   \
    "json-number ::= json-integer ( \".\" [0-9]{1,16} )? ( [eE] [-+]? [0-9]{1,2} )?\n"                                 \
    "json-integer ::= \"-\"? ( \"0\" | [1-9] [0-9]{0,15} )\n"

char *gschema_finish(gschema *c, size_t *len) {
    puts_(c, JSON_RULES);
    char *s = c->s;
    *len = c->over ? GRAMMAR_MAX_TEXT + 1 : c->len;
    c->s = NULL;
    gschema_free(c);
    return s;
}

char *grammar_from_schema(const json_t *schema, size_t *len, char *err, size_t errcap) {
    gschema *c = gschema_new();
    if (gschema_add(c, schema, "schema", err, errcap) < 0) {
        gschema_free(c);
        return NULL;
    }
    gschema_put(c, "root ::= schema\n");
    return gschema_finish(c, len);
}

const char *grammar_json_object(void) { return "root ::= json-object\n" JSON_RULES; }

char *grammar_literal(const char *s, size_t n) {
    gschema *l = gschema_new();
    gschema_put_literal(l, s, n);
    char *r = l->s;
    l->s = NULL;
    gschema_free(l);
    return r;
}
