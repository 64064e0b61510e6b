/* Jinja builtins the chat templates use: filters (`x | trim`), tests
 * (`x is string`), methods of strings and dicts (`s.strip()`, `d.items()`)
 * and the globals HF provides (raise_exception, namespace, range, dict,
 * strftime_now). Each follows what Python/Jinja does, including its corner
 * cases where templates rely on them (split() on runs of whitespace, strip()
 * of Unicode spaces, default() only for undefined values). Case mapping is
 * ASCII-only: the templates apply it to role names and keywords. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "tokenizer/jinja_internal.h"

/* ---- arguments ---- */

/* The pos-th positional argument or the keyword `name`; NULL if absent. */
static jv *arg(jv **args, const char **kw, size_t n, size_t pos, const char *name) {
    size_t p = 0;
    for (size_t i = 0; i < n; i++) {
        if (kw && kw[i]) {
            if (name && !strcmp(kw[i], name)) return args[i];
        } else if (p++ == pos) {
            return args[i];
        }
    }
    return NULL;
}

static size_t n_pos(const char **kw, size_t n) {
    size_t p = 0;
    for (size_t i = 0; i < n; i++) p += !(kw && kw[i]);
    return p;
}

static const jv *need_str(jctx *c, const jv *v, const char *what) {
    if (!v || v->t != JV_STR) jx_fail(c, "%s expects a string, got %s", what, v ? jv_type_name(v) : "nothing");
    return v;
}

static int64_t need_int(jctx *c, const jv *v, const char *what) {
    if (v && v->t == JV_INT) return v->u.i;
    if (v && v->t == JV_BOOL) return v->u.b;
    jx_fail(c, "%s expects an integer, got %s", what, v ? jv_type_name(v) : "nothing");
}

/* ---- Unicode whitespace and case ---- */
int ju_is_space(uint32_t cp) {
    return (cp >= 9 && cp <= 13) || (cp >= 0x1c && cp <= 0x20) || cp == 0x85 || cp == 0xa0 || cp == 0x1680 ||
           (cp >= 0x2000 && cp <= 0x200a) || cp == 0x2028 || cp == 0x2029 || cp == 0x202f || cp == 0x205f ||
           cp == 0x3000;
}

static int in_chars(uint32_t cp, const jv *chars) {
    if (!chars) return ju_is_space(cp);
    for (size_t i = 0; i < chars->u.str.len;) {
        size_t adv;
        if (ju_decode(chars->u.str.s + i, chars->u.str.len - i, &adv) == cp) return 1;
        i += adv;
    }
    return 0;
}

/* strip on the left (which & 1) and/or the right (which & 2) */
static jv *strip(jctx *c, const jv *s, const jv *chars, int which) {
    const char *p = s->u.str.s;
    size_t a = 0, b = s->u.str.len, adv;
    if (which & 1)
        while (a < b && in_chars(ju_decode(p + a, b - a, &adv), chars)) a += adv;
    if (which & 2)
        while (b > a) {
            size_t k = b - 1;
            while (k > a && ((unsigned char)p[k] & 0xC0) == 0x80) k--;
            if (!in_chars(ju_decode(p + k, b - k, &adv), chars)) break;
            b = k;
        }
    return jv_strn(c, p + a, b - a);
}

static char up(char ch) { return ch >= 'a' && ch <= 'z' ? (char)(ch - 32) : ch; }
static char lo(char ch) { return ch >= 'A' && ch <= 'Z' ? (char)(ch + 32) : ch; }
static int is_letter(char ch) {
    return (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || (unsigned char)ch >= 0x80;
}

/* mode 0 upper, 1 lower, 2 capitalize, 3 str.title(), 4 Jinja's title filter */
static jv *recase(jctx *c, const jv *s, int mode) {
    jv *r = jv_strn(c, s->u.str.s, s->u.str.len);
    char *p = (char *)r->u.str.s;
    int start = 1;
    for (size_t i = 0; i < r->u.str.len; i++) {
        char ch = p[i];
        switch (mode) {
        case 0: p[i] = up(ch); break;
        case 1: p[i] = lo(ch); break;
        case 2: p[i] = i == 0 ? up(ch) : lo(ch); break;
        case 3:
            p[i] = start ? up(ch) : lo(ch);
            start = !is_letter(ch);
            break;
        default:
            p[i] = start ? up(ch) : lo(ch);
            start = ch == ' ' || ch == '\t' || ch == '\n' || ch == '\r' || ch == '\f' || ch == '\v' || ch == '-' ||
                    ch == '(' || ch == '{' || ch == '[' || ch == '<';
        }
    }
    return r;
}

static jv *list_push(jctx *c, jv *l, size_t *cap, jv *v) {
    if (l->u.list.n == *cap) {
        size_t nc = *cap ? *cap * 2 : 8;
        jv **nv = jx_alloc(c, nc * sizeof *nv);
        if (l->u.list.n) memcpy(nv, l->u.list.v, l->u.list.n * sizeof *nv);
        l->u.list.v = nv;
        *cap = nc;
    }
    l->u.list.v[l->u.list.n++] = v;
    return l;
}

/* Substring search in linear time (glibc's memmem is two-way), so long
 * hostile strings cannot make a search quadratic. */
static const char *find_sub(const char *h, size_t n, const char *needle, size_t m) {
    if (!m) return h;
    return memmem(h, n, needle, m);
}

static jv *split(jctx *c, const jv *s, const jv *sep, int64_t maxsplit) {
    jv *l = jv_list(c, 0);
    size_t cap = 0;
    const char *p = s->u.str.s;
    size_t n = s->u.str.len, i = 0, adv;
    if (!sep || sep->t == JV_NONE) {
        for (;;) {
            while (i < n && ju_is_space(ju_decode(p + i, n - i, &adv))) i += adv;
            if (i >= n) break;
            if (maxsplit >= 0 && (int64_t)l->u.list.n == maxsplit) {
                size_t e = n;
                while (e > i) { /* the rest, right-stripped */
                    size_t k = e - 1;
                    while (k > i && ((unsigned char)p[k] & 0xC0) == 0x80) k--;
                    if (!ju_is_space(ju_decode(p + k, e - k, &adv))) break;
                    e = k;
                }
                list_push(c, l, &cap, jv_strn(c, p + i, e - i));
                break;
            }
            size_t j = i;
            while (j < n && !ju_is_space(ju_decode(p + j, n - j, &adv))) j += adv;
            list_push(c, l, &cap, jv_strn(c, p + i, j - i));
            i = j;
        }
        return l;
    }
    need_str(c, sep, "split");
    if (!sep->u.str.len) jx_fail(c, "split: empty separator");
    size_t m = sep->u.str.len, start = 0;
    const char *hit;
    while ((maxsplit < 0 || (int64_t)l->u.list.n < maxsplit) &&
           (hit = find_sub(p + start, n - start, sep->u.str.s, m))) {
        list_push(c, l, &cap, jv_strn(c, p + start, (size_t)(hit - (p + start))));
        start = (size_t)(hit - p) + m;
    }
    list_push(c, l, &cap, jv_strn(c, p + start, n - start));
    return l;
}

static jv *replace(jctx *c, const jv *s, const jv *old, const jv *new, int64_t count) {
    need_str(c, old, "replace");
    new = need_str(c, new, "replace");
    jbuf b = {0};
    size_t n = s->u.str.len, m = old->u.str.len, i = 0;
    int64_t done = 0;
    if (!m) { /* Python inserts the replacement between characters */
        size_t adv;
        for (;;) {
            if (count < 0 || done < count) {
                jb_put(c, &b, new->u.str.s, new->u.str.len);
                done++;
            }
            if (i >= n) break;
            ju_decode(s->u.str.s + i, n - i, &adv);
            jb_put(c, &b, s->u.str.s + i, adv);
            i += adv;
        }
        return jv_strn(c, b.s ? b.s : "", b.len);
    }
    const char *hit;
    while ((count < 0 || done < count) && (hit = find_sub(s->u.str.s + i, n - i, old->u.str.s, m))) {
        size_t at = (size_t)(hit - s->u.str.s);
        jb_put(c, &b, s->u.str.s + i, at - i);
        jb_put(c, &b, new->u.str.s, new->u.str.len);
        i = at + m;
        done++;
    }
    jb_put(c, &b, s->u.str.s + i, n - i);
    return jv_strn(c, b.s ? b.s : "", b.len);
}

static int starts_or_ends(jctx *c, const jv *s, const jv *x, int ends) {
    if (x && x->t == JV_LIST) {
        for (size_t i = 0; i < x->u.list.n; i++)
            if (starts_or_ends(c, s, x->u.list.v[i], ends)) return 1;
        return 0;
    }
    need_str(c, x, ends ? "endswith" : "startswith");
    size_t n = s->u.str.len, m = x->u.str.len;
    if (m > n) return 0;
    return !memcmp(s->u.str.s + (ends ? n - m : 0), x->u.str.s, m);
}

static jv *join(jctx *c, const jv *seq, const jv *sep, const char *attr);
static jv *to_list(jctx *c, jv *v);

/* ---- methods ---- */
static const char *const str_methods[] = {"strip",      "lstrip", "rstrip", "split",   "startswith",
                                          "endswith",   "upper",  "lower",  "replace", "title",
                                          "capitalize", "find",   "count",  "join",    NULL};
static const char *const dict_methods[] = {"items", "keys", "values", "get", NULL};

int jx_is_method(const jv *obj, const char *name) {
    const char *const *m = obj->t == JV_STR ? str_methods : obj->t == JV_DICT && !obj->is_ns ? dict_methods : NULL;
    for (; m && *m; m++)
        if (!strcmp(*m, name)) return 1;
    return 0;
}

static jv *dict_items(jctx *c, const jv *d) {
    jv *l = jv_list(c, d->u.dict.n);
    for (size_t i = 0; i < d->u.dict.n; i++) {
        jv *t = jv_list(c, 2);
        t->is_tuple = 1;
        t->u.list.v[0] = d->u.dict.k[i];
        t->u.list.v[1] = d->u.dict.v[i];
        l->u.list.v[i] = t;
    }
    return l;
}

jv *jx_method(jctx *c, jv *self, const char *name, jv **args, const char **kw, size_t n) {
    jv *a0 = arg(args, kw, n, 0, NULL), *a1 = arg(args, kw, n, 1, NULL);
    if (self->t == JV_DICT) {
        if (!strcmp(name, "items")) return dict_items(c, self);
        if (!strcmp(name, "keys") || !strcmp(name, "values")) {
            jv *l = jv_list(c, self->u.dict.n);
            for (size_t i = 0; i < self->u.dict.n; i++)
                l->u.list.v[i] = name[0] == 'k' ? self->u.dict.k[i] : self->u.dict.v[i];
            return l;
        }
        if (!strcmp(name, "get")) {
            if (!a0) jx_fail(c, "get expected at least 1 argument");
            jv *v = jv_dict_getv(self, a0);
            return v ? v : a1 ? a1 : JV_NONEV;
        }
    }
    if (self->t == JV_STR) {
        if (!strcmp(name, "strip") || !strcmp(name, "lstrip") || !strcmp(name, "rstrip")) {
            const jv *chars = a0 && a0->t != JV_NONE ? need_str(c, a0, name) : NULL;
            return strip(c, self, chars, name[0] == 's' ? 3 : name[0] == 'l' ? 1 : 2);
        }
        if (!strcmp(name, "split")) {
            jv *sep = arg(args, kw, n, 0, "sep"), *mx = arg(args, kw, n, 1, "maxsplit");
            return split(c, self, sep, mx ? need_int(c, mx, "split") : -1);
        }
        if (!strcmp(name, "startswith")) return jv_bool(starts_or_ends(c, self, a0, 0));
        if (!strcmp(name, "endswith")) return jv_bool(starts_or_ends(c, self, a0, 1));
        if (!strcmp(name, "upper")) return recase(c, self, 0);
        if (!strcmp(name, "lower")) return recase(c, self, 1);
        if (!strcmp(name, "capitalize")) return recase(c, self, 2);
        if (!strcmp(name, "title")) return recase(c, self, 3);
        if (!strcmp(name, "replace")) {
            jv *cnt = arg(args, kw, n, 2, "count");
            return replace(c, self, a0, a1, cnt ? need_int(c, cnt, "replace") : -1);
        }
        if (!strcmp(name, "find") || !strcmp(name, "count")) {
            need_str(c, a0, name);
            const char *h = self->u.str.s, *hit;
            size_t n_h = self->u.str.len, m = a0->u.str.len, i = 0;
            if (name[0] == 'f') {
                hit = find_sub(h, n_h, a0->u.str.s, m);
                return jv_int(c, hit ? (int64_t)ju_len(h, (size_t)(hit - h)) : -1);
            }
            if (!m) return jv_int(c, (int64_t)ju_len(h, n_h) + 1);
            int64_t hits = 0;
            while ((hit = find_sub(h + i, n_h - i, a0->u.str.s, m))) {
                hits++;
                i = (size_t)(hit - h) + m;
            }
            return jv_int(c, hits);
        }
        if (!strcmp(name, "join")) {
            if (!a0) jx_fail(c, "join expected 1 argument");
            return join(c, to_list(c, a0), self, NULL);
        }
    }
    jx_fail(c, "'%s' object has no method '%s'", jv_type_name(self), name);
}

/* ---- globals ---- */
static const char *const builtins[] = {"raise_exception", "namespace", "range", "dict", "strftime_now", NULL};

int jx_is_builtin(const char *name) {
    for (const char *const *b = builtins; *b; b++)
        if (!strcmp(*b, name)) return 1;
    return 0;
}

jv *jx_builtin(jctx *c, const char *name, jv **args, const char **kw, size_t n) {
    if (!strcmp(name, "raise_exception")) {
        jv *m = jv_to_str(c, n ? args[0] : JV_UNDEFINED);
        snprintf(c->err, sizeof c->err, "%s", m->u.str.s);
        c->raised = 1;
        longjmp(c->jmp, 1);
    }
    if (!strcmp(name, "namespace") || !strcmp(name, "dict")) {
        jv *d = jv_dict(c);
        d->is_ns = name[0] == 'n';
        for (size_t i = 0; i < n; i++) {
            if (kw && kw[i]) {
                jv_dict_set(c, d, jv_str(c, kw[i]), args[i]);
            } else if (args[i]->t == JV_DICT) {
                for (size_t k = 0; k < args[i]->u.dict.n; k++)
                    jv_dict_set(c, d, args[i]->u.dict.k[k], args[i]->u.dict.v[k]);
            } else {
                jx_fail(c, "%s() takes keyword arguments or a dict", name);
            }
        }
        return d;
    }
    if (!strcmp(name, "range")) {
        size_t np = n_pos(kw, n);
        if (np < 1 || np > 3) jx_fail(c, "range expected 1 to 3 arguments");
        int64_t start = 0, stop, stp = 1;
        if (np == 1) stop = need_int(c, args[0], "range");
        else {
            start = need_int(c, args[0], "range");
            stop = need_int(c, args[1], "range");
            if (np == 3) stp = need_int(c, args[2], "range");
        }
        if (!stp) jx_fail(c, "range() arg 3 must not be zero");
        double cnt_d =
            stp > 0 ? ((double)stop - (double)start) / (double)stp : ((double)start - (double)stop) / (double)-stp;
        uint64_t cnt = cnt_d <= 0 ? 0 : (uint64_t)(cnt_d + 0.999999999);
        if (cnt > c->lim.max_steps || c->steps + cnt > c->lim.max_steps)
            jx_fail(c, "range of %llu items is past the iteration limit", (unsigned long long)cnt);
        c->steps += cnt;
        jv *l = jv_list(c, (size_t)cnt), *ints = cnt ? jx_alloc(c, (size_t)cnt * sizeof *ints) : NULL;
        for (uint64_t k = 0; k < cnt; k++) {
            ints[k] = (jv){.t = JV_INT, .u.i = start + (int64_t)k * stp};
            l->u.list.v[k] = &ints[k];
        }
        return l;
    }
    if (!strcmp(name, "strftime_now")) {
        const jv *f = need_str(c, n ? args[0] : NULL, "strftime_now");
        char buf[256];
        time_t now = time(NULL);
        struct tm tmv;
        localtime_r(&now, &tmv);
        size_t len = strftime(buf, sizeof buf, f->u.str.s, &tmv);
        return jv_strn(c, buf, len);
    }
    jx_fail(c, "unknown function '%s'", name);
}

/* ---- tests ---- */
int jx_test(jctx *c, const char *name, jv *v, jv **args, size_t n) {
    jv *a = n ? args[0] : NULL;
    if (!strcmp(name, "defined")) return v->t != JV_UNDEF;
    if (!strcmp(name, "undefined")) return v->t == JV_UNDEF;
    if (!strcmp(name, "none")) return v->t == JV_NONE;
    if (!strcmp(name, "string")) return v->t == JV_STR;
    if (!strcmp(name, "number")) return v->t == JV_INT || v->t == JV_FLOAT || v->t == JV_BOOL;
    if (!strcmp(name, "integer")) return v->t == JV_INT;
    if (!strcmp(name, "float")) return v->t == JV_FLOAT;
    if (!strcmp(name, "boolean")) return v->t == JV_BOOL;
    if (!strcmp(name, "true")) return v->t == JV_BOOL && v->u.b;
    if (!strcmp(name, "false")) return v->t == JV_BOOL && !v->u.b;
    if (!strcmp(name, "mapping")) return v->t == JV_DICT && !v->is_ns;
    if (!strcmp(name, "iterable") || !strcmp(name, "sequence"))
        return v->t == JV_STR || v->t == JV_LIST || (v->t == JV_DICT && !v->is_ns) || v->t == JV_UNDEF;
    if (!strcmp(name, "callable")) return v->t == JV_FUNC;
    if (!strcmp(name, "lower") || !strcmp(name, "upper")) {
        if (v->t != JV_STR) return 0;
        int cased = 0;
        for (size_t i = 0; i < v->u.str.len; i++) {
            char ch = v->u.str.s[i];
            if (up(ch) != lo(ch)) {
                cased = 1;
                if (ch != (name[0] == 'l' ? lo(ch) : up(ch))) return 0;
            }
        }
        return cased;
    }
    if (!strcmp(name, "odd") || !strcmp(name, "even")) {
        int64_t x = need_int(c, v, name);
        return (x % 2 != 0) == (name[0] == 'o');
    }
    if (!strcmp(name, "divisibleby")) {
        int64_t d = need_int(c, a, name);
        if (!d) jx_fail(c, "divisibleby 0");
        return need_int(c, v, name) % d == 0;
    }
    if (!a) jx_fail(c, "test '%s' needs an argument (or is unknown)", name);
    if (!strcmp(name, "equalto") || !strcmp(name, "eq") || !strcmp(name, "==")) return jv_equal(v, a);
    if (!strcmp(name, "ne") || !strcmp(name, "!=")) return !jv_equal(v, a);
    if (!strcmp(name, "sameas"))
        return v == a ||
               (v->t == a->t && (v->t == JV_NONE || v->t == JV_UNDEF || (v->t == JV_BOOL && v->u.b == a->u.b)));
    if (!strcmp(name, "in")) {
        if (a->t == JV_STR && v->t == JV_STR)
            return find_sub(a->u.str.s, a->u.str.len, v->u.str.s, v->u.str.len) != NULL;
        if (a->t == JV_LIST) {
            for (size_t i = 0; i < a->u.list.n; i++)
                if (jv_equal(v, a->u.list.v[i])) return 1;
            return 0;
        }
        if (a->t == JV_DICT) return jv_dict_getv(a, v) != NULL;
        jx_fail(c, "'in' test on a %s", jv_type_name(a));
    }
    static const char *const ords[][2] = {{"lt", "<"},  {"le", "<="},      {"gt", ">"},
                                          {"ge", ">="}, {"lessthan", "<"}, {"greaterthan", ">"}};
    for (size_t k = 0; k < sizeof ords / sizeof *ords; k++)
        if (!strcmp(name, ords[k][0]) || !strcmp(name, ords[k][1])) {
            int is_n = (v->t == JV_INT || v->t == JV_FLOAT) && (a->t == JV_INT || a->t == JV_FLOAT);
            if (is_n) {
                double x = v->t == JV_INT ? (double)v->u.i : v->u.f, y = a->t == JV_INT ? (double)a->u.i : a->u.f;
                const char *o = ords[k][1];
                return o[0] == '<' ? (o[1] ? x <= y : x < y) : (o[1] ? x >= y : x > y);
            }
            jx_fail(c, "test '%s' needs numbers", name);
        }
    jx_fail(c, "unknown test '%s'", name);
}

/* ---- filters ---- */
static jv *to_list(jctx *c, jv *v) {
    switch (v->t) {
    case JV_LIST: return v;
    case JV_UNDEF: return jv_list(c, 0);
    case JV_DICT:
        if (!v->is_ns) return jx_method(c, v, "keys", NULL, NULL, 0);
        break;
    case JV_STR: {
        size_t n = ju_len(v->u.str.s, v->u.str.len), pos = 0, adv;
        jv *l = jv_list(c, n);
        for (size_t i = 0; i < n; i++) {
            ju_decode(v->u.str.s + pos, v->u.str.len - pos, &adv);
            l->u.list.v[i] = jv_strn(c, v->u.str.s + pos, adv);
            pos += adv;
        }
        return l;
    }
    default: break;
    }
    jx_fail(c, "'%s' object is not iterable", jv_type_name(v));
}

/* attribute lookup as Jinja's filters do it: "a.b" walks, digits index */
static jv *attr_path(jctx *c, jv *v, const jv *path) {
    const char *p = need_str(c, path, "attribute")->u.str.s;
    while (*p) {
        const char *dot = strchr(p, '.');
        size_t len = dot ? (size_t)(dot - p) : strlen(p);
        int digits = len > 0;
        for (size_t i = 0; i < len; i++) digits &= p[i] >= '0' && p[i] <= '9';
        if (v->t == JV_UNDEF) return v;
        v = digits ? jx_getitem(c, v, jv_int(c, strtoll(p, NULL, 10))) : jx_getitem(c, v, jv_strn(c, p, len));
        p += len + (dot != NULL);
    }
    return v;
}

static jv *join(jctx *c, const jv *seq, const jv *sep, const char *attr) {
    jbuf b = {0};
    for (size_t i = 0; i < seq->u.list.n; i++) {
        if (i && sep) jb_put(c, &b, sep->u.str.s, sep->u.str.len);
        jv *x = seq->u.list.v[i];
        if (attr) x = attr_path(c, x, jv_str(c, attr));
        jv_write_str(c, &b, x);
    }
    return jv_strn(c, b.s ? b.s : "", b.len);
}

static int sort_cmp(jctx *c, jv *a, jv *b, int case_sensitive) {
    if (a->t == JV_STR && b->t == JV_STR && !case_sensitive) {
        size_t n = a->u.str.len < b->u.str.len ? a->u.str.len : b->u.str.len;
        for (size_t i = 0; i < n; i++) {
            char x = lo(a->u.str.s[i]), y = lo(b->u.str.s[i]);
            if (x != y) return (unsigned char)x < (unsigned char)y ? -1 : 1;
        }
        return (a->u.str.len > b->u.str.len) - (a->u.str.len < b->u.str.len);
    }
    int is_n = (a->t == JV_INT || a->t == JV_FLOAT || a->t == JV_BOOL) &&
               (b->t == JV_INT || b->t == JV_FLOAT || b->t == JV_BOOL);
    if (is_n) {
        double x = a->t == JV_FLOAT ? a->u.f : a->t == JV_INT ? (double)a->u.i : a->u.b;
        double y = b->t == JV_FLOAT ? b->u.f : b->t == JV_INT ? (double)b->u.i : b->u.b;
        return x < y ? -1 : x > y;
    }
    if (a->t == JV_STR && b->t == JV_STR) {
        size_t n = a->u.str.len < b->u.str.len ? a->u.str.len : b->u.str.len;
        int r = memcmp(a->u.str.s, b->u.str.s, n);
        return r ? r : (a->u.str.len > b->u.str.len) - (a->u.str.len < b->u.str.len);
    }
    jx_fail(c, "cannot order %s and %s", jv_type_name(a), jv_type_name(b));
}

static jv *select_items(jctx *c, jv *v, jv **args, const char **kw, size_t n, int by_attr, int keep) {
    jv *seq = to_list(c, v), *out = jv_list(c, 0);
    size_t cap = 0, first = by_attr ? 1 : 0;
    jv *attr = by_attr ? arg(args, kw, n, 0, NULL) : NULL;
    jv *test = arg(args, kw, n, first, NULL);
    size_t np = n_pos(kw, n);
    for (size_t i = 0; i < seq->u.list.n; i++) {
        jv *x = seq->u.list.v[i], *probe = attr ? attr_path(c, x, attr) : x;
        int ok;
        if (!test) ok = jv_truthy(probe);
        else
            ok = jx_test(c, need_str(c, test, "select")->u.str.s, probe, np > first + 1 ? args + first + 1 : NULL,
                         np > first + 1 ? np - first - 1 : 0);
        if (ok == keep) list_push(c, out, &cap, x);
    }
    return out;
}

jv *jx_filter(jctx *c, const char *name, jv *v, jv **args, const char **kw, size_t n) {
    jv *a0 = arg(args, kw, n, 0, NULL);
    if (!strcmp(name, "default") || !strcmp(name, "d")) {
        jv *dflt = arg(args, kw, n, 0, "default_value"), *boolean = arg(args, kw, n, 1, "boolean");
        if (v->t == JV_UNDEF || (boolean && jv_truthy(boolean) && !jv_truthy(v))) return dflt ? dflt : jv_str(c, "");
        return v;
    }
    if (!strcmp(name, "length") || !strcmp(name, "count")) {
        if (v->t == JV_STR) return jv_int(c, (int64_t)ju_len(v->u.str.s, v->u.str.len));
        if (v->t == JV_LIST) return jv_int(c, (int64_t)v->u.list.n);
        if (v->t == JV_DICT && !v->is_ns) return jv_int(c, (int64_t)v->u.dict.n);
        if (v->t == JV_UNDEF) return jv_int(c, 0);
        jx_fail(c, "object of type '%s' has no len()", jv_type_name(v));
    }
    if (!strcmp(name, "tojson")) {
        jv *ind = arg(args, kw, n, 1, "indent"), *sk = arg(args, kw, n, 3, "sort_keys");
        jv *sep = arg(args, kw, n, 2, "separators"), *ea = arg(args, kw, n, 0, "ensure_ascii");
        if (ea && jv_truthy(ea)) jx_fail(c, "tojson: ensure_ascii=True is not supported");
        const char *isep = NULL, *ksep = NULL;
        if (sep && sep->t == JV_LIST && sep->u.list.n == 2) {
            isep = need_str(c, sep->u.list.v[0], "tojson separators")->u.str.s;
            ksep = need_str(c, sep->u.list.v[1], "tojson separators")->u.str.s;
        }
        int indent = ind && ind->t != JV_NONE ? (int)need_int(c, ind, "tojson indent") : -1;
        if (indent > 64) indent = 64;
        jbuf b = {0};
        jv_write_json(c, &b, v, indent, sk && jv_truthy(sk), isep, ksep, 0);
        return jv_strn(c, b.s ? b.s : "", b.len);
    }
    if (!strcmp(name, "string")) return jv_to_str(c, v);
    if (!strcmp(name, "safe")) return v;
    if (!strcmp(name, "list")) return to_list(c, v);
    if (!strcmp(name, "items")) {
        if (v->t == JV_UNDEF) return jv_list(c, 0);
        if (v->t != JV_DICT || v->is_ns) jx_fail(c, "items: expected a mapping, got %s", jv_type_name(v));
        return dict_items(c, v);
    }
    if (!strcmp(name, "first") || !strcmp(name, "last")) {
        jv *l = to_list(c, v);
        if (!l->u.list.n) return JV_UNDEFINED;
        return l->u.list.v[name[0] == 'f' ? 0 : l->u.list.n - 1];
    }
    if (!strcmp(name, "join")) {
        jv *sep = arg(args, kw, n, 0, "d"), *attr = arg(args, kw, n, 1, "attribute");
        return join(c, to_list(c, v), sep ? jv_to_str(c, sep) : NULL, attr ? need_str(c, attr, "join")->u.str.s : NULL);
    }
    if (!strcmp(name, "map")) {
        jv *seq = to_list(c, v), *attr = arg(args, kw, n, 99, "attribute"), *dflt = arg(args, kw, n, 99, "default");
        jv *out = jv_list(c, seq->u.list.n);
        for (size_t i = 0; i < seq->u.list.n; i++) {
            jv *x = seq->u.list.v[i];
            if (attr) {
                x = attr_path(c, x, attr);
                if (x->t == JV_UNDEF && dflt) x = dflt;
            } else {
                size_t np = n_pos(kw, n);
                x = jx_filter(c, need_str(c, a0, "map")->u.str.s, x, args + 1, kw ? kw + 1 : NULL, np ? n - 1 : 0);
            }
            out->u.list.v[i] = x;
        }
        return out;
    }
    if (!strcmp(name, "selectattr")) return select_items(c, v, args, kw, n, 1, 1);
    if (!strcmp(name, "rejectattr")) return select_items(c, v, args, kw, n, 1, 0);
    if (!strcmp(name, "select")) return select_items(c, v, args, kw, n, 0, 1);
    if (!strcmp(name, "reject")) return select_items(c, v, args, kw, n, 0, 0);
    if (!strcmp(name, "unique")) {
        jv *seq = to_list(c, v), *out = jv_list(c, 0);
        size_t cap = 0;
        for (size_t i = 0; i < seq->u.list.n; i++) {
            int seen = 0;
            c->steps += out->u.list.n; /* quadratic: the comparisons count against the iteration limit */
            if (c->steps > c->lim.max_steps)
                jx_fail(c, "unique: more than %llu comparisons", (unsigned long long)c->lim.max_steps);
            for (size_t k = 0; k < out->u.list.n && !seen; k++) seen = jv_equal(out->u.list.v[k], seq->u.list.v[i]);
            if (!seen) list_push(c, out, &cap, seq->u.list.v[i]);
        }
        return out;
    }
    if (!strcmp(name, "reverse")) {
        if (v->t == JV_STR) {
            jv *l = to_list(c, v);
            jbuf b = {0};
            for (size_t i = l->u.list.n; i-- > 0;) jb_put(c, &b, l->u.list.v[i]->u.str.s, l->u.list.v[i]->u.str.len);
            return jv_strn(c, b.s ? b.s : "", b.len);
        }
        jv *seq = to_list(c, v), *out = jv_list(c, seq->u.list.n);
        for (size_t i = 0; i < seq->u.list.n; i++) out->u.list.v[i] = seq->u.list.v[seq->u.list.n - 1 - i];
        return out;
    }
    if (!strcmp(name, "sort")) {
        jv *rev = arg(args, kw, n, 0, "reverse"), *cs = arg(args, kw, n, 1, "case_sensitive");
        jv *attr = arg(args, kw, n, 2, "attribute");
        jv *seq = to_list(c, v), *out = jv_list(c, seq->u.list.n);
        if (seq->u.list.n) memcpy(out->u.list.v, seq->u.list.v, seq->u.list.n * sizeof(jv *));
        /* bottom-up merge sort: stable like Python's, O(n log n) for any list */
        size_t len = out->u.list.n;
        jv **src = out->u.list.v, **tmp = len ? jx_alloc(c, len * sizeof *tmp) : NULL;
        jv **key = len ? jx_alloc(c, len * sizeof *key) : NULL, **ktmp = len ? jx_alloc(c, len * sizeof *ktmp) : NULL;
        for (size_t i = 0; i < len; i++) key[i] = attr ? attr_path(c, src[i], attr) : src[i];
        int desc = rev && jv_truthy(rev), cs_on = cs && jv_truthy(cs);
        for (size_t w = 1; w < len; w *= 2) {
            for (size_t lo0 = 0; lo0 < len; lo0 += 2 * w) {
                size_t mid = lo0 + w < len ? lo0 + w : len, hi = lo0 + 2 * w < len ? lo0 + 2 * w : len;
                size_t i = lo0, j = mid, o = lo0;
                while (i < mid && j < hi) {
                    int r = sort_cmp(c, key[j], key[i], cs_on);
                    int take_right = desc ? r > 0 : r < 0;
                    tmp[o] = take_right ? src[j] : src[i];
                    ktmp[o++] = take_right ? key[j++] : key[i++];
                }
                while (i < mid) tmp[o] = src[i], ktmp[o++] = key[i++];
                while (j < hi) tmp[o] = src[j], ktmp[o++] = key[j++];
            }
            jv **t1 = src;
            src = tmp;
            tmp = t1;
            t1 = key;
            key = ktmp;
            ktmp = t1;
        }
        out->u.list.v = src;
        return out;
    }
    if (!strcmp(name, "int")) {
        jv *dflt = arg(args, kw, n, 0, "default");
        if (v->t == JV_INT) return v;
        if (v->t == JV_BOOL) return jv_int(c, v->u.b);
        if (v->t == JV_FLOAT && v->u.f > -9.2e18 && v->u.f < 9.2e18) return jv_int(c, (int64_t)v->u.f);
        if (v->t == JV_STR) {
            char *end;
            const char *s = strip(c, v, NULL, 3)->u.str.s;
            long long x = strtoll(s, &end, 10);
            if (*s && !*end) return jv_int(c, x);
            double f = strtod(s, &end);
            if (*s && !*end && f > -9.2e18 && f < 9.2e18) return jv_int(c, (int64_t)f);
        }
        return dflt ? dflt : jv_int(c, 0);
    }
    if (!strcmp(name, "float")) {
        jv *dflt = arg(args, kw, n, 0, "default");
        if (v->t == JV_FLOAT) return v;
        if (v->t == JV_INT || v->t == JV_BOOL) return jv_float(c, v->t == JV_INT ? (double)v->u.i : v->u.b);
        if (v->t == JV_STR) {
            char *end;
            const char *s = strip(c, v, NULL, 3)->u.str.s;
            double f = strtod(s, &end);
            if (*s && !*end) return jv_float(c, f);
        }
        return dflt ? dflt : jv_float(c, 0.0);
    }
    if (!strcmp(name, "abs")) {
        if (v->t == JV_INT) return v->u.i < 0 ? jv_int(c, -v->u.i) : v;
        if (v->t == JV_FLOAT) return v->u.f < 0 ? jv_float(c, -v->u.f) : v;
        jx_fail(c, "abs of a %s", jv_type_name(v));
    }
    if (!strcmp(name, "min") || !strcmp(name, "max") || !strcmp(name, "sum")) {
        jv *seq = to_list(c, v);
        if (name[1] == 'u') {
            int64_t si = 0;
            double sf = 0;
            int is_f = 0;
            for (size_t i = 0; i < seq->u.list.n; i++) {
                jv *x = seq->u.list.v[i];
                if (x->t == JV_FLOAT) is_f = 1, sf += x->u.f;
                else si += need_int(c, x, "sum");
            }
            return is_f ? jv_float(c, sf + (double)si) : jv_int(c, si);
        }
        if (!seq->u.list.n) return JV_UNDEFINED;
        jv *best = seq->u.list.v[0];
        for (size_t i = 1; i < seq->u.list.n; i++) {
            int r = sort_cmp(c, seq->u.list.v[i], best, 0);
            if (name[1] == 'i' ? r < 0 : r > 0) best = seq->u.list.v[i];
        }
        return best;
    }
    /* string filters */
    jv *s = jv_to_str(c, v);
    if (!strcmp(name, "trim")) {
        jv *chars = arg(args, kw, n, 0, "chars");
        return strip(c, s, chars && chars->t != JV_NONE ? need_str(c, chars, "trim") : NULL, 3);
    }
    if (!strcmp(name, "upper")) return recase(c, s, 0);
    if (!strcmp(name, "lower")) return recase(c, s, 1);
    if (!strcmp(name, "capitalize")) return recase(c, s, 2);
    if (!strcmp(name, "title")) return recase(c, s, 4);
    if (!strcmp(name, "replace")) {
        jv *cnt = arg(args, kw, n, 2, "count");
        return replace(c, s, jv_to_str(c, a0 ? a0 : JV_UNDEFINED),
                       jv_to_str(c, arg(args, kw, n, 1, NULL) ? arg(args, kw, n, 1, NULL) : JV_UNDEFINED),
                       cnt && cnt->t != JV_NONE ? need_int(c, cnt, "replace") : -1);
    }
    if (!strcmp(name, "escape") || !strcmp(name, "e")) {
        jbuf b = {0};
        for (size_t i = 0; i < s->u.str.len; i++) {
            char ch = s->u.str.s[i];
            const char *r = ch == '&'    ? "&amp;"
                            : ch == '<'  ? "&lt;"
                            : ch == '>'  ? "&gt;"
                            : ch == '"'  ? "&#34;"
                            : ch == '\'' ? "&#39;"
                                         : NULL;
            if (r) jb_puts(c, &b, r);
            else jb_put(c, &b, &ch, 1);
        }
        return jv_strn(c, b.s ? b.s : "", b.len);
    }
    if (!strcmp(name, "indent")) {
        jv *w = arg(args, kw, n, 0, "width"), *first = arg(args, kw, n, 1, "first"),
           *blank = arg(args, kw, n, 2, "blank");
        jv *pad = w && w->t == JV_STR ? w : NULL;
        int64_t width = w && !pad ? need_int(c, w, "indent") : 4;
        if (width < 0 || width > 1024) jx_fail(c, "indent: width out of range");
        jbuf b = {0};
        const char *p = s->u.str.s;
        size_t len = s->u.str.len, i = 0;
        int line_no = 0;
        while (i <= len) {
            const char *nl = memchr(p + i, '\n', len - i);
            size_t e = nl ? (size_t)(nl - p) : len;
            int empty = e == i;
            if ((line_no > 0 || (first && jv_truthy(first))) && (!empty || (blank && jv_truthy(blank)))) {
                if (pad) jb_put(c, &b, pad->u.str.s, pad->u.str.len);
                else
                    for (int64_t k = 0; k < width; k++) jb_put(c, &b, " ", 1);
            }
            jb_put(c, &b, p + i, e - i);
            if (!nl) break;
            jb_put(c, &b, "\n", 1);
            i = e + 1;
            line_no++;
        }
        return jv_strn(c, b.s ? b.s : "", b.len);
    }
    jx_fail(c, "unknown filter '%s'", name);
}
