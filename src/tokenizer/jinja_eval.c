/* Jinja evaluator: runs the syntax tree against a context, with Jinja's
 * scoping (a for-loop body gets a fresh scope each iteration, so `set` inside
 * a loop does not leak out -- which is why templates use namespace(); if-blocks
 * share their enclosing scope; a macro sees its arguments and the context),
 * Python's operator semantics, and the render entry points of jinja.h. */
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "core/alloc.h"
#include "core/log.h"
#include "tokenizer/jinja_internal.h"

/* ---- scopes ---- */
static jframe *frame_new(jctx *c, jframe *parent) {
    jframe *f = jx_alloc(c, sizeof *f);
    memset(f, 0, sizeof *f);
    f->parent = parent;
    return f;
}

static void frame_set(jctx *c, jframe *f, const char *name, jv *v) {
    for (size_t i = 0; i < f->n; i++)
        if (!strcmp(f->names[i], name)) {
            f->vals[i] = v;
            return;
        }
    if (f->n == f->cap) {
        size_t cap = f->cap ? f->cap * 2 : 8;
        const char **nn = jx_alloc(c, cap * sizeof *nn);
        jv **nv = jx_alloc(c, cap * sizeof *nv);
        if (f->n) {
            memcpy(nn, f->names, f->n * sizeof *nn);
            memcpy(nv, f->vals, f->n * sizeof *nv);
        }
        f->names = nn;
        f->vals = nv;
        f->cap = cap;
    }
    f->names[f->n] = name;
    f->vals[f->n++] = v;
}

jv *jx_lookup(jctx *c, const char *name) {
    for (jframe *f = c->frame; f; f = f->parent)
        for (size_t i = f->n; i-- > 0;)
            if (!strcmp(f->names[i], name)) return f->vals[i];
    if (jx_is_builtin(name)) return jv_func(c, JF_BUILTIN, name, NULL, NULL);
    return NULL;
}

/* ---- access ---- */
jv *jx_getattr(jctx *c, jv *obj, const char *name) {
    switch (obj->t) {
    case JV_UNDEF: jx_fail(c, "cannot read attribute '%s' of an undefined value", name);
    case JV_DICT: {
        /* Jinja tries Python's getattr first: d.items is the method even if "items" is a key */
        if (!obj->is_ns && jx_is_method(obj, name)) return jv_func(c, JF_METHOD, name, obj, NULL);
        jv *v = jv_dict_get(obj, name, strlen(name));
        return v ? v : JV_UNDEFINED;
    }
    case JV_STR:
        if (jx_is_method(obj, name)) return jv_func(c, JF_METHOD, name, obj, NULL);
        return JV_UNDEFINED;
    case JV_LOOP: {
        int64_t i = obj->u.loop.i, n = obj->u.loop.n;
        if (!strcmp(name, "index0")) return jv_int(c, i);
        if (!strcmp(name, "index")) return jv_int(c, i + 1);
        if (!strcmp(name, "revindex0")) return jv_int(c, n - i - 1);
        if (!strcmp(name, "revindex")) return jv_int(c, n - i);
        if (!strcmp(name, "first")) return jv_bool(i == 0);
        if (!strcmp(name, "last")) return jv_bool(i + 1 == n);
        if (!strcmp(name, "length")) return jv_int(c, n);
        if (!strcmp(name, "depth")) return jv_int(c, 1);
        if (!strcmp(name, "depth0")) return jv_int(c, 0);
        if (!strcmp(name, "previtem")) return i > 0 ? obj->u.loop.items->u.list.v[i - 1] : JV_UNDEFINED;
        if (!strcmp(name, "nextitem")) return i + 1 < n ? obj->u.loop.items->u.list.v[i + 1] : JV_UNDEFINED;
        return JV_UNDEFINED;
    }
    default: return JV_UNDEFINED;
    }
}

static int64_t as_index(jctx *c, const jv *k) {
    if (k->t == JV_INT) return k->u.i;
    if (k->t == JV_BOOL) return k->u.b;
    jx_fail(c, "indices must be integers, not %s", jv_type_name(k));
}

jv *jx_getitem(jctx *c, jv *obj, jv *key) {
    switch (obj->t) {
    case JV_UNDEF: jx_fail(c, "cannot subscript an undefined value");
    case JV_DICT: {
        jv *v = jv_dict_getv(obj, key);
        if (v) return v;
        if (key->t == JV_STR) return jx_getattr(c, obj, key->u.str.s);
        return JV_UNDEFINED;
    }
    case JV_LIST: {
        if (key->t == JV_STR) return JV_UNDEFINED;
        int64_t i = as_index(c, key), n = (int64_t)obj->u.list.n;
        if (i < 0) i += n;
        return i >= 0 && i < n ? obj->u.list.v[i] : JV_UNDEFINED;
    }
    case JV_STR: {
        if (key->t == JV_STR) return jx_getattr(c, obj, key->u.str.s);
        int64_t i = as_index(c, key), n = (int64_t)ju_len(obj->u.str.s, obj->u.str.len);
        if (i < 0) i += n;
        if (i < 0 || i >= n) return JV_UNDEFINED;
        size_t a = ju_offset(obj->u.str.s, obj->u.str.len, (size_t)i);
        size_t b = ju_offset(obj->u.str.s, obj->u.str.len, (size_t)i + 1);
        return jv_strn(c, obj->u.str.s + a, b - a);
    }
    default: return JV_UNDEFINED;
    }
}

/* Python's slice index rules (PySlice_AdjustIndices) */
static jv *slice(jctx *c, jv *obj, jv *vs, jv *ve, jv *vst) {
    int64_t step = vst->t == JV_NONE || vst->t == JV_UNDEF ? 1 : as_index(c, vst);
    if (step == 0) jx_fail(c, "slice step cannot be zero");
    int is_str = obj->t == JV_STR;
    if (!is_str && obj->t != JV_LIST) jx_fail(c, "cannot slice a %s", jv_type_name(obj));
    int64_t n = is_str ? (int64_t)ju_len(obj->u.str.s, obj->u.str.len) : (int64_t)obj->u.list.n;
    int64_t lo = step < 0 ? -1 : 0, hi = step < 0 ? n - 1 : n;
    int64_t s, e;
    if (vs->t == JV_NONE || vs->t == JV_UNDEF) s = step < 0 ? hi : lo;
    else {
        s = as_index(c, vs);
        if (s < 0) s = s + n < lo ? lo : s + n;
        else if (s > hi) s = hi;
    }
    if (ve->t == JV_NONE || ve->t == JV_UNDEF) e = step < 0 ? lo : hi;
    else {
        e = as_index(c, ve);
        if (e < 0) e = e + n < lo ? lo : e + n;
        else if (e > hi) e = hi;
    }
    int64_t cnt = 0;
    if (step > 0 && s < e) cnt = (e - s + step - 1) / step;
    if (step < 0 && s > e) cnt = (s - e + (-step) - 1) / (-step);
    if (!is_str) {
        jv *l = jv_list(c, (size_t)cnt);
        for (int64_t k = 0; k < cnt; k++) l->u.list.v[k] = obj->u.list.v[s + k * step];
        return l;
    }
    /* code point offsets, then copy the chosen ones */
    size_t *off = jx_alloc(c, ((size_t)n + 1) * sizeof *off);
    const char *p = obj->u.str.s;
    size_t len = obj->u.str.len, pos = 0;
    for (int64_t k = 0; k <= n; k++) {
        off[k] = pos;
        if (pos < len) {
            pos++;
            while (pos < len && ((unsigned char)p[pos] & 0xC0) == 0x80) pos++;
        }
    }
    jbuf b = {0};
    for (int64_t k = 0; k < cnt; k++) {
        int64_t i = s + k * step;
        jb_put(c, &b, p + off[i], off[i + 1] - off[i]);
    }
    return jv_strn(c, b.s ? b.s : "", b.len);
}

/* ---- operators ---- */
static int is_num(const jv *v) { return v->t == JV_INT || v->t == JV_FLOAT || v->t == JV_BOOL; }
static double num(const jv *v) { return v->t == JV_FLOAT ? v->u.f : v->t == JV_INT ? (double)v->u.i : v->u.b; }
static int64_t ival(const jv *v) { return v->t == JV_INT ? v->u.i : v->u.b; }

_Noreturn static void bad_operands(jctx *c, const char *op, const jv *a, const jv *b) {
    if (a->t == JV_UNDEF || b->t == JV_UNDEF) jx_fail(c, "'%s' on an undefined value", op);
    jx_fail(c, "unsupported operand type(s) for %s: '%s' and '%s'", op, jv_type_name(a), jv_type_name(b));
}

static jv *repeat(jctx *c, const jv *seq, int64_t times) {
    if (times < 0) times = 0;
    size_t unit = seq->t == JV_STR ? seq->u.str.len : seq->u.list.n;
    if (unit && (uint64_t)times > c->lim.max_memory / unit) jx_fail(c, "repetition too large");
    if (seq->t == JV_STR) {
        jbuf b = {0};
        for (int64_t k = 0; k < times; k++) jb_put(c, &b, seq->u.str.s, unit);
        return jv_strn(c, b.s ? b.s : "", b.len);
    }
    jv *l = jv_list(c, unit * (size_t)times);
    for (int64_t k = 0; k < times; k++)
        if (unit) memcpy(l->u.list.v + k * unit, seq->u.list.v, unit * sizeof(jv *));
    return l;
}

static jv *binop(jctx *c, const char *op, jv *a, jv *b) {
    if (!strcmp(op, "~")) {
        jv *x = jv_to_str(c, a), *y = jv_to_str(c, b);
        jbuf o = {0};
        jb_put(c, &o, x->u.str.s, x->u.str.len);
        jb_put(c, &o, y->u.str.s, y->u.str.len);
        return jv_strn(c, o.s ? o.s : "", o.len);
    }
    int ints = (a->t == JV_INT || a->t == JV_BOOL) && (b->t == JV_INT || b->t == JV_BOOL);
    int nums = is_num(a) && is_num(b);
    int64_t r;
    switch (op[0]) {
    case '+':
        if (ints) {
            if (__builtin_add_overflow(ival(a), ival(b), &r)) jx_fail(c, "integer overflow");
            return jv_int(c, r);
        }
        if (nums) return jv_float(c, num(a) + num(b));
        if (a->t == JV_STR && b->t == JV_STR) {
            jbuf o = {0};
            jb_put(c, &o, a->u.str.s, a->u.str.len);
            jb_put(c, &o, b->u.str.s, b->u.str.len);
            return jv_strn(c, o.s ? o.s : "", o.len);
        }
        if (a->t == JV_LIST && b->t == JV_LIST) {
            jv *l = jv_list(c, a->u.list.n + b->u.list.n);
            if (a->u.list.n) memcpy(l->u.list.v, a->u.list.v, a->u.list.n * sizeof(jv *));
            if (b->u.list.n) memcpy(l->u.list.v + a->u.list.n, b->u.list.v, b->u.list.n * sizeof(jv *));
            return l;
        }
        break;
    case '-':
        if (ints) {
            if (__builtin_sub_overflow(ival(a), ival(b), &r)) jx_fail(c, "integer overflow");
            return jv_int(c, r);
        }
        if (nums) return jv_float(c, num(a) - num(b));
        break;
    case '*':
        if (op[1] == '*') {
            if (ints && ival(b) >= 0) {
                int64_t x = 1, base = ival(a);
                for (int64_t k = 0; k < ival(b); k++)
                    if (__builtin_mul_overflow(x, base, &x)) jx_fail(c, "integer overflow");
                return jv_int(c, x);
            }
            if (nums) return jv_float(c, pow(num(a), num(b)));
            break;
        }
        if (ints) {
            if (__builtin_mul_overflow(ival(a), ival(b), &r)) jx_fail(c, "integer overflow");
            return jv_int(c, r);
        }
        if (nums) return jv_float(c, num(a) * num(b));
        if ((a->t == JV_STR || a->t == JV_LIST) && (b->t == JV_INT || b->t == JV_BOOL)) return repeat(c, a, ival(b));
        if ((b->t == JV_STR || b->t == JV_LIST) && (a->t == JV_INT || a->t == JV_BOOL)) return repeat(c, b, ival(a));
        break;
    case '/':
        if (!nums) break;
        if (num(b) == 0) jx_fail(c, "division by zero");
        if (op[1] == '/') {
            if (ints) {
                int64_t x = ival(a), y = ival(b);
                if (x == INT64_MIN && y == -1) jx_fail(c, "integer overflow");
                int64_t q = x / y;
                if ((x % y != 0) && ((x < 0) != (y < 0))) q--;
                return jv_int(c, q);
            }
            return jv_float(c, floor(num(a) / num(b)));
        }
        return jv_float(c, num(a) / num(b));
    case '%':
        if (!nums) break;
        if (num(b) == 0) jx_fail(c, "modulo by zero");
        if (ints) {
            int64_t x = ival(a), y = ival(b);
            if (y == -1) return jv_int(c, 0);
            int64_t m = x % y;
            if (m != 0 && ((m < 0) != (y < 0))) m += y;
            return jv_int(c, m);
        } else {
            double m = fmod(num(a), num(b));
            if (m != 0 && ((m < 0) != (num(b) < 0))) m += num(b);
            return jv_float(c, m);
        }
    }
    bad_operands(c, op, a, b);
}

static int contains(jctx *c, jv *item, jv *seq) {
    switch (seq->t) {
    case JV_STR:
        if (item->t != JV_STR) jx_fail(c, "'in <string>' requires string as left operand, not %s", jv_type_name(item));
        if (!item->u.str.len) return 1;
        return memmem(seq->u.str.s, seq->u.str.len, item->u.str.s, item->u.str.len) != NULL; /* linear */
    case JV_LIST:
        for (size_t i = 0; i < seq->u.list.n; i++)
            if (jv_equal(item, seq->u.list.v[i])) return 1;
        return 0;
    case JV_DICT: return jv_dict_getv(seq, item) != NULL;
    case JV_UNDEF: return 0;
    default: jx_fail(c, "argument of type '%s' is not iterable", jv_type_name(seq));
    }
}

static int order(jctx *c, const char *op, jv *a, jv *b) {
    int r;
    if (is_num(a) && is_num(b)) {
        double x = num(a), y = num(b);
        r = x < y ? -1 : x > y ? 1 : 0;
        if (a->t != JV_FLOAT && b->t != JV_FLOAT) r = ival(a) < ival(b) ? -1 : ival(a) > ival(b);
    } else if (a->t == JV_STR && b->t == JV_STR) {
        size_t n = a->u.str.len < b->u.str.len ? a->u.str.len : b->u.str.len;
        r = memcmp(a->u.str.s, b->u.str.s, n);
        if (!r) r = (a->u.str.len > b->u.str.len) - (a->u.str.len < b->u.str.len);
    } else {
        jx_fail(c, "'%s' not supported between instances of '%s' and '%s'", op, jv_type_name(a), jv_type_name(b));
    }
    if (!strcmp(op, "<")) return r < 0;
    if (!strcmp(op, ">")) return r > 0;
    if (!strcmp(op, "<=")) return r <= 0;
    return r >= 0;
}

static int compare(jctx *c, const char *op, jv *a, jv *b) {
    if (!strcmp(op, "==")) return jv_equal(a, b);
    if (!strcmp(op, "!=")) return !jv_equal(a, b);
    if (!strcmp(op, "in")) return contains(c, a, b);
    if (!strcmp(op, "not in")) return !contains(c, a, b);
    return order(c, op, a, b);
}

/* ---- calls ---- */
static jv *call_macro(jctx *c, jv *fn, jv **args, const char **kw, size_t n) {
    const jnode *m = fn->u.fn.macro;
    if (++c->depth > c->lim.max_depth) jx_fail(c, "macro calls nested deeper than %d", c->lim.max_depth);
    jframe *saved = c->frame;
    jbuf *saved_out = c->out;
    c->frame = frame_new(c, c->root);
    size_t pos = 0;
    for (size_t i = 0; i < n; i++) {
        if (kw && kw[i]) continue;
        if (pos >= m->n) jx_fail(c, "macro '%s' takes %zu arguments", m->name, m->n);
        frame_set(c, c->frame, m->kw[pos++], args[i]);
    }
    for (size_t p = 0; p < m->n; p++) {
        jv *v = NULL;
        for (size_t i = 0; i < n; i++)
            if (kw && kw[i] && !strcmp(kw[i], m->kw[p])) v = args[i];
        if (v) frame_set(c, c->frame, m->kw[p], v);
        else if (p >= pos) frame_set(c, c->frame, m->kw[p], m->args[p] ? jx_eval(c, m->args[p]) : JV_UNDEFINED);
    }
    frame_set(c, c->frame, m->name, fn); /* recursion by name */
    jbuf out = {0};
    c->out = &out;
    jx_exec(c, m->b);
    c->loop_ctl = 0;
    c->out = saved_out;
    c->frame = saved;
    c->depth--;
    return jv_strn(c, out.s ? out.s : "", out.len);
}

jv *jx_call(jctx *c, jv *fn, jv **args, const char **kw, size_t n, int line) {
    c->line = line;
    if (fn->t == JV_UNDEF) jx_fail(c, "call of an undefined value");
    if (fn->t != JV_FUNC) jx_fail(c, "'%s' object is not callable", jv_type_name(fn));
    switch (fn->u.fn.kind) {
    case JF_BUILTIN: return jx_builtin(c, fn->u.fn.name, args, kw, n);
    case JF_METHOD: return jx_method(c, fn->u.fn.self, fn->u.fn.name, args, kw, n);
    case JF_MACRO: return call_macro(c, fn, args, kw, n);
    }
    return JV_NONEV;
}

static jv **eval_args(jctx *c, const jnode *e) {
    jv **v = e->n ? jx_alloc(c, e->n * sizeof *v) : NULL;
    for (size_t i = 0; i < e->n; i++) v[i] = jx_eval(c, e->args[i]);
    return v;
}

/* ---- expressions ---- */
jv *jx_eval(jctx *c, const jnode *e) {
    c->line = e->line;
    switch (e->k) {
    case N_LIT: return e->lit;
    case N_NAME: {
        jv *v = jx_lookup(c, e->name);
        return v ? v : JV_UNDEFINED;
    }
    case N_LIST:
    case N_TUPLE: {
        jv *l = jv_list(c, e->n);
        for (size_t i = 0; i < e->n; i++) l->u.list.v[i] = jx_eval(c, e->args[i]);
        l->is_tuple = e->k == N_TUPLE;
        return l;
    }
    case N_DICT: {
        jv *d = jv_dict(c);
        for (size_t i = 0; i + 1 < e->n; i += 2) {
            jv *k = jx_eval(c, e->args[i]);
            jv_dict_set(c, d, k, jx_eval(c, e->args[i + 1]));
        }
        return d;
    }
    case N_ATTR: {
        jv *o = jx_eval(c, e->a);
        c->line = e->line;
        if (o->t == JV_UNDEF && e->a->k == N_NAME) jx_fail(c, "'%s' is undefined", e->a->name);
        return jx_getattr(c, o, e->op);
    }
    case N_ITEM: {
        jv *o = jx_eval(c, e->a);
        c->line = e->line;
        if (o->t == JV_UNDEF && e->a->k == N_NAME) jx_fail(c, "'%s' is undefined", e->a->name);
        if (e->b->k == N_SLICE) {
            const jnode *s = e->b;
            jv *a = s->a ? jx_eval(c, s->a) : JV_NONEV, *b = s->b ? jx_eval(c, s->b) : JV_NONEV;
            jv *st = s->c ? jx_eval(c, s->c) : JV_NONEV;
            c->line = e->line;
            if (o->t == JV_UNDEF) jx_fail(c, "cannot slice an undefined value");
            return slice(c, o, a, b, st);
        }
        jv *k = jx_eval(c, e->b);
        c->line = e->line;
        return jx_getitem(c, o, k);
    }
    case N_CALL: {
        jv *fn = jx_eval(c, e->a);
        if (fn->t == JV_UNDEF && e->a->k == N_NAME) {
            c->line = e->line;
            jx_fail(c, "'%s' is undefined", e->a->name);
        }
        jv **args = eval_args(c, e);
        return jx_call(c, fn, args, e->kw, e->n, e->line);
    }
    case N_FILTER: {
        jv *v = jx_eval(c, e->a);
        jv **args = eval_args(c, e);
        c->line = e->line;
        return jx_filter(c, e->name, v, args, e->kw, e->n);
    }
    case N_TEST: {
        jv *v = jx_eval(c, e->a);
        jv **args = eval_args(c, e);
        c->line = e->line;
        return jv_bool(jx_test(c, e->name, v, args, e->n) ^ e->negate);
    }
    case N_NEG:
    case N_POS: {
        jv *v = jx_eval(c, e->a);
        c->line = e->line;
        if (e->k == N_POS && is_num(v)) return v;
        if (v->t == JV_INT || v->t == JV_BOOL) {
            if (ival(v) == INT64_MIN) jx_fail(c, "integer overflow");
            return jv_int(c, -ival(v));
        }
        if (v->t == JV_FLOAT) return jv_float(c, -v->u.f);
        jx_fail(c, "bad operand type for unary %c: '%s'", e->k == N_NEG ? '-' : '+', jv_type_name(v));
    }
    case N_NOT: return jv_bool(!jv_truthy(jx_eval(c, e->a)));
    case N_AND: {
        jv *a = jx_eval(c, e->a);
        return jv_truthy(a) ? jx_eval(c, e->b) : a;
    }
    case N_OR: {
        jv *a = jx_eval(c, e->a);
        return jv_truthy(a) ? a : jx_eval(c, e->b);
    }
    case N_BIN: {
        jv *a = jx_eval(c, e->a), *b = jx_eval(c, e->b);
        c->line = e->line;
        return binop(c, e->op, a, b);
    }
    case N_CMP: {
        jv *a = jx_eval(c, e->a);
        for (size_t i = 0; i < e->n; i++) {
            jv *b = jx_eval(c, e->args[i]);
            c->line = e->line;
            if (!compare(c, e->kw[i], a, b)) return &jv_false_v;
            a = b;
        }
        return &jv_true_v;
    }
    case N_COND:
        if (jv_truthy(jx_eval(c, e->b))) return jx_eval(c, e->a);
        return e->c ? jx_eval(c, e->c) : JV_UNDEFINED;
    default: jx_fail(c, "not an expression");
    }
}

/* ---- statements ---- */

/* The items a for-loop walks: a list's elements, a dict's keys, a string's characters. */
static jv *iter_items(jctx *c, jv *v) {
    switch (v->t) {
    case JV_LIST: return v;
    case JV_UNDEF: return jv_list(c, 0);
    case JV_DICT: {
        if (v->is_ns) break;
        jv *l = jv_list(c, v->u.dict.n);
        for (size_t i = 0; i < v->u.dict.n; i++) l->u.list.v[i] = v->u.dict.k[i];
        return l;
    }
    case JV_STR: {
        size_t n = ju_len(v->u.str.s, v->u.str.len), pos = 0;
        jv *l = jv_list(c, n);
        for (size_t i = 0; i < n; i++) {
            size_t adv;
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

static void bind_targets(jctx *c, const jnode *s, jv *item) {
    if (s->n_names == 1) {
        frame_set(c, c->frame, s->names[0], item);
        return;
    }
    if (item->t != JV_LIST || item->u.list.n != s->n_names)
        jx_fail(c, "cannot unpack %s into %zu names", jv_type_name(item), s->n_names);
    for (size_t k = 0; k < s->n_names; k++) frame_set(c, c->frame, s->names[k], item->u.list.v[k]);
}

static void step(jctx *c) {
    if (++c->steps > c->lim.max_steps)
        jx_fail(c, "more than %llu loop iterations", (unsigned long long)c->lim.max_steps);
}

static void exec_for(jctx *c, const jnode *s) {
    jv *items = iter_items(c, jx_eval(c, s->a));
    jframe *outer = c->frame;
    /* one scope for the whole loop, emptied at each iteration: Jinja's body
     * scope is fresh per iteration, and nothing can keep a reference to it */
    jframe *f = frame_new(c, outer);
    size_t n = items->u.list.n;
    if (s->d) { /* `for x in xs if cond`: filter first, loop.length counts what is left */
        jv *kept = jv_list(c, n);
        size_t m = 0;
        c->frame = f;
        for (size_t i = 0; i < n; i++) {
            step(c);
            f->n = 0;
            bind_targets(c, s, items->u.list.v[i]);
            if (jv_truthy(jx_eval(c, s->d))) kept->u.list.v[m++] = items->u.list.v[i];
        }
        kept->u.list.n = m;
        items = kept;
        n = m;
    }
    jv *loop = jx_alloc(c, sizeof *loop);
    memset(loop, 0, sizeof *loop);
    loop->t = JV_LOOP;
    loop->u.loop.n = (int64_t)n;
    loop->u.loop.items = items;
    c->frame = f;
    for (size_t i = 0; i < n; i++) {
        step(c);
        f->n = 0;
        loop->u.loop.i = (int64_t)i;
        frame_set(c, f, "loop", loop);
        bind_targets(c, s, items->u.list.v[i]);
        jx_exec(c, s->b);
        int ctl = c->loop_ctl;
        c->loop_ctl = 0;
        if (ctl == 1) break;
    }
    c->frame = outer;
    if (!n && s->c) jx_exec(c, s->c);
}

void jx_exec(jctx *c, const jnode *s) {
    c->line = s->line;
    switch (s->k) {
    case S_BODY:
        for (size_t i = 0; i < s->n && !c->loop_ctl; i++) jx_exec(c, s->args[i]);
        return;
    case S_TEXT: jb_put(c, c->out, s->text, s->text_len); return;
    case S_OUT: jv_write_str(c, c->out, jx_eval(c, s->a)); return;
    case S_IF:
        if (jv_truthy(jx_eval(c, s->a))) jx_exec(c, s->b);
        else if (s->c) jx_exec(c, s->c);
        return;
    case S_FOR: exec_for(c, s); return;
    case S_SET: {
        jv *v = jx_eval(c, s->a);
        c->line = s->line;
        if (s->op) {
            jv *ns = jx_lookup(c, s->names[0]);
            if (!ns || ns->t != JV_DICT || !ns->is_ns)
                jx_fail(c, "cannot assign attribute '%s' on '%s': not a namespace", s->op, s->names[0]);
            jv_dict_set(c, ns, jv_str(c, s->op), v);
            return;
        }
        if (s->n_names == 1) frame_set(c, c->frame, s->names[0], v);
        else bind_targets(c, s, v);
        return;
    }
    case S_SETBLOCK: {
        jbuf out = {0}, *saved = c->out;
        c->out = &out;
        jx_exec(c, s->b);
        c->out = saved;
        frame_set(c, c->frame, s->names[0], jv_strn(c, out.s ? out.s : "", out.len));
        return;
    }
    case S_MACRO: frame_set(c, c->frame, s->name, jv_func(c, JF_MACRO, s->name, NULL, s)); return;
    case S_BREAK: c->loop_ctl = 1; return;
    case S_CONTINUE: c->loop_ctl = 2; return;
    default: jx_fail(c, "not a statement");
    }
}

/* ---- entry points ---- */
void jinja_limits_default(jinja_limits *lim) {
    lim->max_output = (size_t)16 << 20;
    lim->max_memory = (size_t)256 << 20;
    lim->max_steps = 4u << 20;
    lim->max_depth = 64;
}

jinja_tmpl *jinja_parse(const char *src, size_t len) {
    jinja_tmpl *t = st_calloc(1, sizeof *t);
    t->arena.limit = (size_t)64 << 20;
    char msg[300];
    size_t n_tok = 0;
    jtok *toks = jlex_run(&t->arena, src, len, &n_tok, msg, sizeof msg);
    if (toks) t->root = jparse_run(&t->arena, toks, n_tok, msg, sizeof msg);
    if (!toks || !t->root) {
        st_error_set("chat template syntax error: %s", msg);
        jinja_free(t);
        return NULL;
    }
    return t;
}

void jinja_free(jinja_tmpl *t) {
    if (!t) return;
    ja_free(&t->arena);
    st_free(t);
}

char *jinja_render_json_ex(const jinja_tmpl *t, const json_t *ctx, const jinja_limits *lim, size_t *out_len) {
    if (!t || !ctx || !json_is_object(ctx)) {
        st_error_set("jinja_render_json: the context must be a JSON object");
        return NULL;
    }
    jctx *c = st_calloc(1, sizeof *c);
    if (lim) c->lim = *lim;
    else jinja_limits_default(&c->lim);
    c->arena.limit = c->lim.max_memory;
    jbuf out = {0};
    char *result = NULL;
    if (setjmp(c->jmp) == 0) {
        c->root = frame_new(c, NULL);
        c->frame = c->root;
        const char *k;
        json_t *v;
        json_object_foreach((json_t *)ctx, k, v) {
            char *name = jx_alloc(c, strlen(k) + 1);
            strcpy(name, k);
            frame_set(c, c->root, name, jv_from_json(c, v, 0));
        }
        c->out = &out;
        jx_exec(c, t->root);
        result = st_malloc(out.len + 1);
        if (out.len) memcpy(result, out.s, out.len);
        result[out.len] = 0;
        if (out_len) *out_len = out.len;
    } else if (c->raised) {
        st_error_set("%s", c->err);
    } else {
        st_error_set("chat template error: %s", c->err);
    }
    ja_free(&c->arena);
    st_free(c);
    return result;
}

char *jinja_render_json(const jinja_tmpl *t, const json_t *ctx) { return jinja_render_json_ex(t, ctx, NULL, NULL); }
