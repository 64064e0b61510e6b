/* Values of the Jinja interpreter: the arena they live in, their
 * construction from JSON, and how Python prints them (str, repr, json.dumps),
 * because a template's output is whatever Python would have printed. */
#include <jansson.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/alloc.h"
#include "tokenizer/jinja_internal.h"

/* ---- arena ---- */
struct jarena_chunk {
    jarena_chunk *next;
    size_t used, cap;
    _Alignas(16) unsigned char data[];
};

void *ja_alloc(jarena *a, size_t n) {
    n = (n + 15) & ~(size_t)15;
    if (a->limit && (n > a->limit || a->used > a->limit - n)) return NULL;
    jarena_chunk *h = a->head;
    if (!h || h->cap - h->used < n) {
        size_t cap = n > 65536 ? n : 65536;
        h = st_malloc(sizeof *h + cap);
        h->used = 0;
        h->cap = cap;
        /* a big block gets its own chunk behind the head, so the head's free room is kept */
        if (a->head && n > 65536) {
            h->next = a->head->next;
            a->head->next = h;
        } else {
            h->next = a->head;
            a->head = h;
        }
    }
    void *p = h->data + h->used;
    h->used += n;
    a->used += n;
    return p;
}

void ja_free(jarena *a) {
    for (jarena_chunk *h = a->head, *nx; h; h = nx) {
        nx = h->next;
        st_free(h);
    }
    a->head = NULL;
    a->used = 0;
}

_Noreturn void jx_fail(jctx *c, const char *fmt, ...) {
    char msg[400];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    snprintf(c->err, sizeof c->err, "line %d: %s", c->line, msg);
    longjmp(c->jmp, 1);
}

void *jx_alloc(jctx *c, size_t n) {
    void *p = ja_alloc(&c->arena, n);
    if (!p) jx_fail(c, "the template needs more than %zu bytes of memory", c->lim.max_memory);
    return p;
}

/* ---- construction ---- */
jv jv_undef_v = {.t = JV_UNDEF}, jv_none_v = {.t = JV_NONE};
jv jv_true_v = {.t = JV_BOOL, .u.b = 1}, jv_false_v = {.t = JV_BOOL, .u.b = 0};

jv *jv_bool(int b) { return b ? &jv_true_v : &jv_false_v; }

jv *jv_int(jctx *c, int64_t i) {
    jv *v = jx_alloc(c, sizeof *v);
    *v = (jv){.t = JV_INT, .u.i = i};
    return v;
}

jv *jv_float(jctx *c, double f) {
    jv *v = jx_alloc(c, sizeof *v);
    *v = (jv){.t = JV_FLOAT, .u.f = f};
    return v;
}

jv *jv_strn(jctx *c, const char *s, size_t n) {
    jv *v = jx_alloc(c, sizeof *v);
    char *p = jx_alloc(c, n + 1);
    if (n) memcpy(p, s, n);
    p[n] = 0;
    *v = (jv){.t = JV_STR};
    v->u.str.s = p;
    v->u.str.len = n;
    return v;
}

jv *jv_str(jctx *c, const char *s) { return jv_strn(c, s, strlen(s)); }

jv *jv_list(jctx *c, size_t n) {
    jv *v = jx_alloc(c, sizeof *v);
    *v = (jv){.t = JV_LIST};
    v->u.list.v = n ? jx_alloc(c, n * sizeof(jv *)) : NULL;
    v->u.list.n = n;
    return v;
}

jv *jv_dict(jctx *c) {
    jv *v = jx_alloc(c, sizeof *v);
    *v = (jv){.t = JV_DICT};
    return v;
}

jv *jv_dict_getv(const jv *d, const jv *key) {
    for (size_t i = 0; i < d->u.dict.n; i++)
        if (jv_equal(d->u.dict.k[i], key)) return d->u.dict.v[i];
    return NULL;
}

jv *jv_dict_get(const jv *d, const char *key, size_t len) {
    for (size_t i = 0; i < d->u.dict.n; i++) {
        const jv *k = d->u.dict.k[i];
        if (k->t == JV_STR && k->u.str.len == len && !memcmp(k->u.str.s, key, len)) return d->u.dict.v[i];
    }
    return NULL;
}

void jv_dict_set(jctx *c, jv *d, jv *k, jv *v) {
    for (size_t i = 0; i < d->u.dict.n; i++)
        if (jv_equal(d->u.dict.k[i], k)) {
            d->u.dict.v[i] = v;
            return;
        }
    if (d->u.dict.n == d->u.dict.cap) {
        size_t cap = d->u.dict.cap ? d->u.dict.cap * 2 : 8;
        jv **nk = jx_alloc(c, cap * sizeof(jv *)), **nv = jx_alloc(c, cap * sizeof(jv *));
        if (d->u.dict.n) {
            memcpy(nk, d->u.dict.k, d->u.dict.n * sizeof(jv *));
            memcpy(nv, d->u.dict.v, d->u.dict.n * sizeof(jv *));
        }
        d->u.dict.k = nk;
        d->u.dict.v = nv;
        d->u.dict.cap = cap;
    }
    d->u.dict.k[d->u.dict.n] = k;
    d->u.dict.v[d->u.dict.n++] = v;
}

jv *jv_func(jctx *c, jf_kind kind, const char *name, jv *self, const jnode *macro) {
    jv *v = jx_alloc(c, sizeof *v);
    *v = (jv){.t = JV_FUNC};
    v->u.fn.kind = kind;
    v->u.fn.name = name;
    v->u.fn.self = self;
    v->u.fn.macro = macro;
    return v;
}

jv *jv_from_json(jctx *c, const json_t *j, int depth) {
    if (depth > 200) jx_fail(c, "the context nests deeper than 200 levels");
    switch (json_typeof(j)) {
    case JSON_NULL: return JV_NONEV;
    case JSON_TRUE: return &jv_true_v;
    case JSON_FALSE: return &jv_false_v;
    case JSON_INTEGER: return jv_int(c, json_integer_value(j));
    case JSON_REAL: return jv_float(c, json_real_value(j));
    case JSON_STRING: return jv_strn(c, json_string_value(j), json_string_length(j));
    case JSON_ARRAY: {
        jv *l = jv_list(c, json_array_size(j));
        for (size_t i = 0; i < l->u.list.n; i++) l->u.list.v[i] = jv_from_json(c, json_array_get(j, i), depth + 1);
        return l;
    }
    case JSON_OBJECT: {
        jv *d = jv_dict(c);
        const char *k;
        json_t *v;
        json_object_foreach((json_t *)j, k, v) jv_dict_set(c, d, jv_str(c, k), jv_from_json(c, v, depth + 1));
        return d;
    }
    }
    return JV_NONEV;
}

/* ---- predicates ---- */
int jv_truthy(const jv *v) {
    switch (v->t) {
    case JV_UNDEF:
    case JV_NONE: return 0;
    case JV_BOOL: return v->u.b;
    case JV_INT: return v->u.i != 0;
    case JV_FLOAT: return v->u.f != 0.0;
    case JV_STR: return v->u.str.len != 0;
    case JV_LIST: return v->u.list.n != 0;
    case JV_DICT: return v->is_ns || v->u.dict.n != 0;
    case JV_FUNC:
    case JV_LOOP: return 1;
    }
    return 0;
}

static int is_num(const jv *v) { return v->t == JV_INT || v->t == JV_FLOAT || v->t == JV_BOOL; }
static double num(const jv *v) { return v->t == JV_FLOAT ? v->u.f : v->t == JV_INT ? (double)v->u.i : v->u.b; }

/* Values can nest as deep as a loop makes them ({% set ns.x = [ns.x] %}):
 * past this depth a comparison gives up and says "not equal" rather than
 * overflow the stack. */
enum { MAX_VALUE_DEPTH = 200 };

static int equal_d(const jv *a, const jv *b, int depth);

int jv_equal(const jv *a, const jv *b) { return equal_d(a, b, 0); }

static int equal_d(const jv *a, const jv *b, int depth) {
    if (a == b) return 1;
    if (depth > MAX_VALUE_DEPTH) return 0;
    if (is_num(a) && is_num(b)) {
        if (a->t != JV_FLOAT && b->t != JV_FLOAT) {
            int64_t x = a->t == JV_INT ? a->u.i : a->u.b, y = b->t == JV_INT ? b->u.i : b->u.b;
            return x == y;
        }
        return num(a) == num(b);
    }
    if (a->t != b->t) return 0;
    switch (a->t) {
    case JV_UNDEF:
    case JV_NONE: return 1;
    case JV_STR: return a->u.str.len == b->u.str.len && !memcmp(a->u.str.s, b->u.str.s, a->u.str.len);
    case JV_LIST:
        if (a->u.list.n != b->u.list.n) return 0;
        for (size_t i = 0; i < a->u.list.n; i++)
            if (!equal_d(a->u.list.v[i], b->u.list.v[i], depth + 1)) return 0;
        return 1;
    case JV_DICT:
        if (a->is_ns || b->is_ns || a->u.dict.n != b->u.dict.n) return 0;
        for (size_t i = 0; i < a->u.dict.n; i++) {
            const jv *o = jv_dict_getv(b, a->u.dict.k[i]);
            if (!o || !equal_d(a->u.dict.v[i], o, depth + 1)) return 0;
        }
        return 1;
    default: return 0;
    }
}

const char *jv_type_name(const jv *v) {
    static const char *names[] = {"undefined", "NoneType", "bool", "int",      "float",
                                  "str",       "list",     "dict", "function", "LoopContext"};
    if (v->t == JV_LIST && v->is_tuple) return "tuple";
    if (v->t == JV_DICT && v->is_ns) return "Namespace";
    return names[v->t];
}

/* ---- output buffers ---- */
void jb_put(jctx *c, jbuf *b, const char *s, size_t n) {
    if (!n) return;
    if (b->len + n > c->lim.max_output) jx_fail(c, "the output would exceed %zu bytes", c->lim.max_output);
    if (b->len + n + 1 > b->cap) {
        /* buffers live in the arena too, so an error leaks nothing; the old copy is the price */
        size_t cap = (b->len + n + 1) * 2;
        if (cap < 256) cap = 256;
        char *ns = jx_alloc(c, cap);
        if (b->len) memcpy(ns, b->s, b->len);
        b->s = ns;
        b->cap = cap;
    }
    memcpy(b->s + b->len, s, n);
    b->len += n;
    b->s[b->len] = 0;
}

void jb_puts(jctx *c, jbuf *b, const char *s) { jb_put(c, b, s, strlen(s)); }

/* ---- UTF-8 ---- */
uint32_t ju_decode(const char *s, size_t n, size_t *adv) {
    const unsigned char *u = (const unsigned char *)s;
    int len = u[0] < 0x80 ? 1 : u[0] >= 0xF0 ? 4 : u[0] >= 0xE0 ? 3 : u[0] >= 0xC0 ? 2 : 1;
    if ((size_t)len > n) len = 1;
    uint32_t cp = len == 1 ? u[0] : len == 2 ? u[0] & 0x1F : len == 3 ? u[0] & 0x0F : u[0] & 0x07;
    for (int i = 1; i < len; i++) cp = cp << 6 | (u[i] & 0x3F);
    *adv = (size_t)len;
    return cp;
}

size_t ju_len(const char *s, size_t n) {
    size_t k = 0;
    for (size_t i = 0; i < n; i++)
        if (((unsigned char)s[i] & 0xC0) != 0x80) k++;
    return k;
}

size_t ju_offset(const char *s, size_t n, size_t k) {
    size_t i = 0;
    for (; i < n && k; k--) {
        i++;
        while (i < n && ((unsigned char)s[i] & 0xC0) == 0x80) i++;
    }
    return i;
}

/* ---- printing ---- */

/* Python's repr(float): the shortest digits that read back the same, in
 * positional form for exponents -4..15 and scientific form otherwise. */
void jfmt_float(char *buf, size_t cap, double f) {
    if (isnan(f)) {
        snprintf(buf, cap, "nan");
        return;
    }
    if (isinf(f)) {
        snprintf(buf, cap, f < 0 ? "-inf" : "inf");
        return;
    }
    char e[40];
    int prec = 1;
    for (; prec <= 17; prec++) {
        snprintf(e, sizeof e, "%.*e", prec - 1, f);
        if (strtod(e, NULL) == f) break;
    }
    /* e = [-]d[.ddd]e[+-]XX: split into digits and exponent */
    char digits[24];
    size_t nd = 0;
    const char *p = e;
    int neg = 0;
    if (*p == '-') {
        neg = 1;
        p++;
    }
    for (; *p && *p != 'e'; p++)
        if (*p != '.') digits[nd++] = *p;
    int exp = atoi(p + 1);
    while (nd > 1 && digits[nd - 1] == '0') nd--;
    digits[nd] = 0;
    char *o = buf;
    size_t left = cap;
#define EMIT(...)                                                                                                      \
    do {                                                                                                               \
        int w_ = snprintf(o, left, __VA_ARGS__);                                                                       \
        if (w_ < 0 || (size_t)w_ >= left) return;                                                                      \
        o += w_;                                                                                                       \
        left -= (size_t)w_;                                                                                            \
    } while (0)
    if (neg) EMIT("-");
    if (exp >= -4 && exp < 16) {
        if (exp < 0) {
            EMIT("0.");
            for (int i = -1; i > exp; i--) EMIT("0");
            EMIT("%s", digits);
        } else {
            for (int i = 0; i <= exp; i++) EMIT("%c", (size_t)i < nd ? digits[i] : '0');
            EMIT(".");
            if ((size_t)exp + 1 < nd) EMIT("%s", digits + exp + 1);
            else EMIT("0");
        }
    } else {
        EMIT("%c", digits[0]);
        if (nd > 1) EMIT(".%s", digits + 1);
        EMIT("e%c%02d", exp < 0 ? '-' : '+', exp < 0 ? -exp : exp);
    }
#undef EMIT
}

static void write_py_str(jctx *c, jbuf *b, const char *s, size_t n) {
    int has_sq = memchr(s, '\'', n) != NULL, has_dq = memchr(s, '"', n) != NULL;
    char q = has_sq && !has_dq ? '"' : '\'';
    jb_put(c, b, &q, 1);
    size_t run = 0;
    for (size_t i = 0; i < n; i++) {
        unsigned char ch = (unsigned char)s[i];
        const char *esc = NULL;
        char tmp[8];
        if (ch == '\\') esc = "\\\\";
        else if (ch == (unsigned char)q) esc = q == '\'' ? "\\'" : "\\\"";
        else if (ch == '\n') esc = "\\n";
        else if (ch == '\r') esc = "\\r";
        else if (ch == '\t') esc = "\\t";
        else if (ch < 0x20 || ch == 0x7f) {
            snprintf(tmp, sizeof tmp, "\\x%02x", ch);
            esc = tmp;
        }
        if (esc) {
            jb_put(c, b, s + i - run, run);
            run = 0;
            jb_puts(c, b, esc);
        } else {
            run++;
        }
    }
    jb_put(c, b, s + n - run, run);
    jb_put(c, b, &q, 1);
}

static void write_repr_d(jctx *c, jbuf *b, const jv *v, int depth);

void jv_write_repr(jctx *c, jbuf *b, const jv *v) { write_repr_d(c, b, v, 0); }

static void write_repr_d(jctx *c, jbuf *b, const jv *v, int depth) {
    if (depth > MAX_VALUE_DEPTH) jx_fail(c, "cannot print a value nested deeper than %d levels", MAX_VALUE_DEPTH);
    switch (v->t) {
    case JV_STR: write_py_str(c, b, v->u.str.s, v->u.str.len); return;
    case JV_LIST: {
        jb_puts(c, b, v->is_tuple ? "(" : "[");
        for (size_t i = 0; i < v->u.list.n; i++) {
            if (i) jb_puts(c, b, ", ");
            write_repr_d(c, b, v->u.list.v[i], depth + 1);
        }
        if (v->is_tuple && v->u.list.n == 1) jb_puts(c, b, ",");
        jb_puts(c, b, v->is_tuple ? ")" : "]");
        return;
    }
    case JV_DICT: {
        if (v->is_ns) jb_puts(c, b, "<Namespace ");
        jb_puts(c, b, "{");
        for (size_t i = 0; i < v->u.dict.n; i++) {
            if (i) jb_puts(c, b, ", ");
            write_repr_d(c, b, v->u.dict.k[i], depth + 1);
            jb_puts(c, b, ": ");
            write_repr_d(c, b, v->u.dict.v[i], depth + 1);
        }
        jb_puts(c, b, v->is_ns ? "}>" : "}");
        return;
    }
    default: jv_write_str(c, b, v);
    }
}

void jv_write_str(jctx *c, jbuf *b, const jv *v) {
    char tmp[64];
    switch (v->t) {
    case JV_UNDEF: return;
    case JV_NONE: jb_puts(c, b, "None"); return;
    case JV_BOOL: jb_puts(c, b, v->u.b ? "True" : "False"); return;
    case JV_INT:
        snprintf(tmp, sizeof tmp, "%lld", (long long)v->u.i);
        jb_puts(c, b, tmp);
        return;
    case JV_FLOAT:
        jfmt_float(tmp, sizeof tmp, v->u.f);
        jb_puts(c, b, tmp);
        return;
    case JV_STR: jb_put(c, b, v->u.str.s, v->u.str.len); return;
    case JV_FUNC:
        if (v->u.fn.kind == JF_MACRO) snprintf(tmp, sizeof tmp, "<Macro '%.40s'>", v->u.fn.name);
        else snprintf(tmp, sizeof tmp, "<built-in function %.40s>", v->u.fn.name);
        jb_puts(c, b, tmp);
        return;
    case JV_LOOP:
        snprintf(tmp, sizeof tmp, "<LoopContext %lld/%lld>", (long long)v->u.loop.i + 1, (long long)v->u.loop.n);
        jb_puts(c, b, tmp);
        return;
    default: jv_write_repr(c, b, v);
    }
}

jv *jv_to_str(jctx *c, const jv *v) {
    if (v->t == JV_STR) return (jv *)v;
    jbuf b = {0};
    jv_write_str(c, &b, v);
    return jv_strn(c, b.s ? b.s : "", b.len);
}

static void write_json_str(jctx *c, jbuf *b, const char *s, size_t n) {
    jb_puts(c, b, "\"");
    size_t run = 0;
    for (size_t i = 0; i < n; i++) {
        unsigned char ch = (unsigned char)s[i];
        const char *esc = NULL;
        char tmp[8];
        switch (ch) {
        case '"': esc = "\\\""; break;
        case '\\': esc = "\\\\"; break;
        case '\n': esc = "\\n"; break;
        case '\r': esc = "\\r"; break;
        case '\t': esc = "\\t"; break;
        case '\b': esc = "\\b"; break;
        case '\f': esc = "\\f"; break;
        default:
            if (ch < 0x20) {
                snprintf(tmp, sizeof tmp, "\\u%04x", ch);
                esc = tmp;
            }
        }
        if (esc) {
            jb_put(c, b, s + i - run, run);
            run = 0;
            jb_puts(c, b, esc);
        } else {
            run++;
        }
    }
    jb_put(c, b, s + n - run, run);
    jb_puts(c, b, "\"");
}

static void json_newline(jctx *c, jbuf *b, int indent, int level) {
    jb_puts(c, b, "\n");
    for (int i = 0; i < indent * level; i++) jb_puts(c, b, " ");
}

static int cmp_keys(const void *x, const void *y) {
    const jv *a = *(jv *const *)x, *b = *(jv *const *)y;
    size_t n = a->u.str.len < b->u.str.len ? a->u.str.len : b->u.str.len;
    int r = memcmp(a->u.str.s, b->u.str.s, n);
    return r ? r : (a->u.str.len > b->u.str.len) - (a->u.str.len < b->u.str.len);
}

void jv_write_json(jctx *c, jbuf *b, const jv *v, int indent, int sort_keys, const char *item_sep, const char *key_sep,
                   int level) {
    char tmp[64];
    if (level > MAX_VALUE_DEPTH) jx_fail(c, "tojson: nesting deeper than %d levels", MAX_VALUE_DEPTH);
    if (!item_sep) item_sep = indent >= 0 ? "," : ", ";
    if (!key_sep) key_sep = ": ";
    switch (v->t) {
    case JV_NONE: jb_puts(c, b, "null"); return;
    case JV_BOOL: jb_puts(c, b, v->u.b ? "true" : "false"); return;
    case JV_INT:
        snprintf(tmp, sizeof tmp, "%lld", (long long)v->u.i);
        jb_puts(c, b, tmp);
        return;
    case JV_FLOAT:
        if (isnan(v->u.f)) jb_puts(c, b, "NaN");
        else if (isinf(v->u.f)) jb_puts(c, b, v->u.f < 0 ? "-Infinity" : "Infinity");
        else {
            jfmt_float(tmp, sizeof tmp, v->u.f);
            jb_puts(c, b, tmp);
        }
        return;
    case JV_STR: write_json_str(c, b, v->u.str.s, v->u.str.len); return;
    case JV_LIST:
        if (!v->u.list.n) {
            jb_puts(c, b, "[]");
            return;
        }
        jb_puts(c, b, "[");
        for (size_t i = 0; i < v->u.list.n; i++) {
            if (i) jb_puts(c, b, item_sep);
            if (indent >= 0) json_newline(c, b, indent, level + 1);
            jv_write_json(c, b, v->u.list.v[i], indent, sort_keys, item_sep, key_sep, level + 1);
        }
        if (indent >= 0) json_newline(c, b, indent, level);
        jb_puts(c, b, "]");
        return;
    case JV_DICT: {
        if (v->is_ns) jx_fail(c, "tojson: Object of type Namespace is not JSON serializable");
        if (!v->u.dict.n) {
            jb_puts(c, b, "{}");
            return;
        }
        size_t n = v->u.dict.n;
        size_t *order = jx_alloc(c, n * sizeof *order);
        for (size_t i = 0; i < n; i++) {
            order[i] = i;
            if (v->u.dict.k[i]->t != JV_STR) jx_fail(c, "tojson: keys must be strings");
        }
        if (sort_keys) {
            jv **keys = jx_alloc(c, n * sizeof *keys);
            memcpy(keys, v->u.dict.k, n * sizeof *keys);
            qsort(keys, n, sizeof *keys, cmp_keys);
            for (size_t i = 0; i < n; i++)
                for (size_t j = 0; j < n; j++)
                    if (v->u.dict.k[j] == keys[i]) order[i] = j;
        }
        jb_puts(c, b, "{");
        for (size_t i = 0; i < n; i++) {
            if (i) jb_puts(c, b, item_sep);
            if (indent >= 0) json_newline(c, b, indent, level + 1);
            const jv *k = v->u.dict.k[order[i]];
            write_json_str(c, b, k->u.str.s, k->u.str.len);
            jb_puts(c, b, key_sep);
            jv_write_json(c, b, v->u.dict.v[order[i]], indent, sort_keys, item_sep, key_sep, level + 1);
        }
        if (indent >= 0) json_newline(c, b, indent, level);
        jb_puts(c, b, "}");
        return;
    }
    case JV_UNDEF: jx_fail(c, "tojson: Object of type Undefined is not JSON serializable");
    case JV_FUNC:
    case JV_LOOP: jx_fail(c, "tojson: Object of type %s is not JSON serializable", jv_type_name(v));
    }
}
