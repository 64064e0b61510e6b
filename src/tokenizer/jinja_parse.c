/* Jinja parser: tokens -> syntax tree, with Jinja's operator precedence
 * (lowest first): `x if c else y`, or, and, not, comparisons and `in`,
 * + -, ~, * / // %, **, unary - +, then postfix (.attr [item] (call)) and
 * filters/tests (`| f(...)`, `is [not] t`), which bind tighter than any
 * binary operator: `'a' + x | trim` is `'a' + (x | trim)`.
 * Nesting deeper than MAX_DEPTH is refused rather than recursing on. */
#include <stdio.h>
#include <string.h>

#include "tokenizer/jinja_internal.h"

enum { MAX_DEPTH = 128 };

typedef struct {
    jarena *a;
    const jtok *t;
    size_t n, i;
    int depth;
    jmp_buf jmp;
    char *msg;
    size_t msg_cap;
} parser;

_Noreturn static void perr(parser *P, const jtok *at, const char *fmt, const char *arg) {
    char what[200];
    snprintf(what, sizeof what, fmt, arg ? arg : "");
    snprintf(P->msg, P->msg_cap, "line %d, column %d: %s", at->line, at->col, what);
    longjmp(P->jmp, 1);
}

static void *palloc(parser *P, size_t n) {
    void *p = ja_alloc(P->a, n);
    if (!p) perr(P, &P->t[P->i], "%stemplate too large", "");
    memset(p, 0, n);
    return p;
}

static const jtok *cur(parser *P) { return &P->t[P->i]; }
static const jtok *adv(parser *P) { return &P->t[P->i < P->n - 1 ? P->i++ : P->i]; }
static int is_op(parser *P, const char *op) { return cur(P)->t == TK_OP && !strcmp(cur(P)->s, op); }
static int is_name(parser *P, const char *nm) { return cur(P)->t == TK_NAME && !strcmp(cur(P)->s, nm); }

static void expect_op(parser *P, const char *op) {
    if (!is_op(P, op)) perr(P, cur(P), "expected '%s'", op);
    adv(P);
}

static void expect_end(parser *P) {
    if (cur(P)->t != TK_BLOCK_END) perr(P, cur(P), "expected end of tag '%%}'%s", "");
    adv(P);
}

static const char *expect_name(parser *P) {
    if (cur(P)->t != TK_NAME) perr(P, cur(P), "expected a name%s", "");
    return adv(P)->s;
}

static jnode *mk(parser *P, jnode_kind k, const jtok *at) {
    jnode *e = palloc(P, sizeof *e);
    e->k = k;
    e->line = at->line;
    e->col = at->col;
    return e;
}

/* growable argument lists while parsing */
typedef struct {
    jnode **v;
    const char **kw;
    size_t n, cap;
} nlist;

static void nl_push(parser *P, nlist *l, jnode *e, const char *kw) {
    if (l->n == l->cap) {
        size_t cap = l->cap ? l->cap * 2 : 4;
        jnode **nv = palloc(P, cap * sizeof *nv);
        const char **nk = palloc(P, cap * sizeof *nk);
        if (l->n) {
            memcpy(nv, l->v, l->n * sizeof *nv);
            memcpy(nk, l->kw, l->n * sizeof *nk);
        }
        l->v = nv;
        l->kw = nk;
        l->cap = cap;
    }
    l->v[l->n] = e;
    l->kw[l->n++] = kw;
}

static void enter(parser *P) {
    if (++P->depth > MAX_DEPTH) perr(P, cur(P), "nesting deeper than %s levels", "128");
}

static jnode *parse_expr(parser *P, int with_cond);
static jnode *parse_tuple(parser *P, int with_cond, int explicit_parens);
static jnode *parse_unary(parser *P, int with_filter);
static jnode *parse_body(parser *P, const char *const *stop, const char **which);

static void parse_call_args(parser *P, jnode *call) {
    nlist l = {0};
    expect_op(P, "(");
    while (!is_op(P, ")")) {
        if (l.n) expect_op(P, ",");
        if (is_op(P, ")")) break;
        const char *kw = NULL;
        if (cur(P)->t == TK_NAME && P->i + 1 < P->n && P->t[P->i + 1].t == TK_OP && !strcmp(P->t[P->i + 1].s, "=")) {
            kw = adv(P)->s;
            adv(P);
        } else if (is_op(P, "*") || is_op(P, "**")) {
            perr(P, cur(P), "*args and **kwargs are not supported%s", "");
        }
        nl_push(P, &l, parse_expr(P, 1), kw);
    }
    adv(P);
    call->args = l.v;
    call->kw = l.kw;
    call->n = l.n;
}

static jnode *parse_primary(parser *P) {
    const jtok *t = cur(P);
    jnode *e;
    switch (t->t) {
    case TK_NAME: {
        static const char *const lits[] = {"true", "True", "false", "False", "none", "None"};
        for (int k = 0; k < 6; k++)
            if (!strcmp(t->s, lits[k])) {
                adv(P);
                e = mk(P, N_LIT, t);
                e->lit = k < 2 ? &jv_true_v : k < 4 ? &jv_false_v : &jv_none_v;
                return e;
            }
        adv(P);
        e = mk(P, N_NAME, t);
        e->name = t->s;
        return e;
    }
    case TK_STR: {
        /* adjacent literals concatenate */
        size_t len = 0, j = P->i;
        for (; j < P->n && P->t[j].t == TK_STR; j++) len += P->t[j].len;
        char *s = palloc(P, len + 1);
        size_t o = 0;
        for (; P->i < j; P->i++) {
            memcpy(s + o, P->t[P->i].s, P->t[P->i].len);
            o += P->t[P->i].len;
        }
        e = mk(P, N_LIT, t);
        e->lit = palloc(P, sizeof(jv));
        e->lit->t = JV_STR;
        e->lit->u.str.s = s;
        e->lit->u.str.len = len;
        return e;
    }
    case TK_INT:
    case TK_FLOAT:
        adv(P);
        e = mk(P, N_LIT, t);
        e->lit = palloc(P, sizeof(jv));
        e->lit->t = t->t == TK_INT ? JV_INT : JV_FLOAT;
        if (t->t == TK_INT) e->lit->u.i = t->i;
        else e->lit->u.f = t->f;
        return e;
    case TK_OP:
        if (!strcmp(t->s, "(")) {
            adv(P);
            e = parse_tuple(P, 1, 1);
            expect_op(P, ")");
            return e;
        }
        if (!strcmp(t->s, "[")) {
            nlist l = {0};
            adv(P);
            while (!is_op(P, "]")) {
                if (l.n) expect_op(P, ",");
                if (is_op(P, "]")) break;
                nl_push(P, &l, parse_expr(P, 1), NULL);
            }
            adv(P);
            e = mk(P, N_LIST, t);
            e->args = l.v;
            e->n = l.n;
            return e;
        }
        if (!strcmp(t->s, "{")) {
            nlist l = {0};
            adv(P);
            while (!is_op(P, "}")) {
                if (l.n) expect_op(P, ",");
                if (is_op(P, "}")) break;
                nl_push(P, &l, parse_expr(P, 1), NULL);
                expect_op(P, ":");
                nl_push(P, &l, parse_expr(P, 1), NULL);
            }
            adv(P);
            e = mk(P, N_DICT, t);
            e->args = l.v;
            e->n = l.n;
            return e;
        }
        perr(P, t, "unexpected '%s'", t->s);
    default: perr(P, t, "unexpected %s", t->t == TK_EOF ? "end of template" : "end of tag");
    }
}

static jnode *parse_subscript(parser *P) {
    const jtok *t = cur(P);
    jnode *parts[3] = {0};
    int is_slice = 0;
    for (int k = 0; k < 3; k++) {
        if (!is_op(P, ":") && !is_op(P, "]")) parts[k] = parse_expr(P, 1);
        if (k < 2 && is_op(P, ":")) {
            adv(P);
            is_slice = 1;
        } else {
            break;
        }
    }
    if (!is_slice) {
        if (!parts[0]) perr(P, t, "expected a subscript%s", "");
        return parts[0];
    }
    jnode *s = mk(P, N_SLICE, t);
    s->a = parts[0];
    s->b = parts[1];
    s->c = parts[2];
    return s;
}

static jnode *parse_postfix(parser *P, jnode *e) {
    for (;;) {
        const jtok *t = cur(P);
        if (is_op(P, ".")) {
            adv(P);
            if (cur(P)->t == TK_INT) {
                jnode *lit = mk(P, N_LIT, cur(P));
                lit->lit = palloc(P, sizeof(jv));
                lit->lit->t = JV_INT;
                lit->lit->u.i = adv(P)->i;
                jnode *x = mk(P, N_ITEM, t);
                x->a = e;
                x->b = lit;
                e = x;
                continue;
            }
            jnode *x = mk(P, N_ATTR, t);
            x->a = e;
            x->op = expect_name(P);
            e = x;
        } else if (is_op(P, "[")) {
            adv(P);
            jnode *x = mk(P, N_ITEM, t);
            x->a = e;
            x->b = parse_subscript(P);
            expect_op(P, "]");
            e = x;
        } else if (is_op(P, "(")) {
            jnode *x = mk(P, N_CALL, t);
            x->a = e;
            parse_call_args(P, x);
            e = x;
        } else {
            return e;
        }
    }
}

static jnode *parse_filter_expr(parser *P, jnode *e) {
    for (;;) {
        const jtok *t = cur(P);
        if (is_op(P, "|")) {
            adv(P);
            jnode *f = mk(P, N_FILTER, t);
            f->a = e;
            f->name = expect_name(P);
            if (is_op(P, "(")) parse_call_args(P, f);
            e = f;
        } else if (is_name(P, "is")) {
            adv(P);
            jnode *f = mk(P, N_TEST, t);
            f->a = e;
            if (is_name(P, "not")) {
                adv(P);
                f->negate = 1;
            }
            f->name = expect_name(P);
            const jtok *n = cur(P);
            if (is_op(P, "(")) {
                parse_call_args(P, f);
            } else if ((n->t == TK_NAME || n->t == TK_STR || n->t == TK_INT || n->t == TK_FLOAT || is_op(P, "[") ||
                        is_op(P, "{")) &&
                       !is_name(P, "else") && !is_name(P, "or") && !is_name(P, "and")) {
                if (is_name(P, "is")) perr(P, n, "unexpected 'is'%s", "");
                f->args = palloc(P, sizeof(jnode *));
                f->kw = palloc(P, sizeof(char *));
                f->args[0] = parse_postfix(P, parse_primary(P));
                f->n = 1;
            }
            e = f;
        } else if (is_op(P, "(")) {
            jnode *x = mk(P, N_CALL, t);
            x->a = e;
            parse_call_args(P, x);
            e = x;
        } else {
            return e;
        }
    }
}

static jnode *parse_unary(parser *P, int with_filter) {
    enter(P);
    const jtok *t = cur(P);
    jnode *e;
    if (is_op(P, "-") || is_op(P, "+")) {
        adv(P);
        e = mk(P, t->s[0] == '-' ? N_NEG : N_POS, t);
        e->a = parse_unary(P, 0);
    } else {
        e = parse_primary(P);
    }
    e = parse_postfix(P, e);
    if (with_filter) e = parse_filter_expr(P, e);
    P->depth--;
    return e;
}

static jnode *bin(parser *P, const jtok *t, const char *op, jnode *l, jnode *r) {
    jnode *e = mk(P, N_BIN, t);
    e->op = op;
    e->a = l;
    e->b = r;
    return e;
}

static jnode *parse_pow(parser *P) {
    jnode *e = parse_unary(P, 1);
    while (is_op(P, "**")) {
        const jtok *t = adv(P);
        e = bin(P, t, "**", e, parse_unary(P, 1));
    }
    return e;
}

static jnode *parse_math2(parser *P) {
    jnode *e = parse_pow(P);
    while (is_op(P, "*") || is_op(P, "/") || is_op(P, "//") || is_op(P, "%")) {
        const jtok *t = adv(P);
        e = bin(P, t, t->s, e, parse_pow(P));
    }
    return e;
}

static jnode *parse_concat(parser *P) {
    jnode *e = parse_math2(P);
    while (is_op(P, "~")) {
        const jtok *t = adv(P);
        e = bin(P, t, "~", e, parse_math2(P));
    }
    return e;
}

static jnode *parse_math1(parser *P) {
    jnode *e = parse_concat(P);
    while (is_op(P, "+") || is_op(P, "-")) {
        const jtok *t = adv(P);
        e = bin(P, t, t->s, e, parse_concat(P));
    }
    return e;
}

static jnode *parse_compare(parser *P) {
    const jtok *t0 = cur(P);
    jnode *first = parse_math1(P);
    nlist l = {0};
    for (;;) {
        const char *op = NULL;
        static const char *const ops[] = {"==", "!=", "<", ">", "<=", ">="};
        for (int k = 0; k < 6; k++)
            if (is_op(P, ops[k])) op = ops[k];
        if (op) {
            adv(P);
        } else if (is_name(P, "in")) {
            adv(P);
            op = "in";
        } else if (is_name(P, "not") && P->i + 1 < P->n && P->t[P->i + 1].t == TK_NAME &&
                   !strcmp(P->t[P->i + 1].s, "in")) {
            adv(P);
            adv(P);
            op = "not in";
        } else {
            break;
        }
        nl_push(P, &l, parse_math1(P), op);
    }
    if (!l.n) return first;
    jnode *e = mk(P, N_CMP, t0);
    e->a = first;
    e->args = l.v;
    e->kw = l.kw;
    e->n = l.n;
    return e;
}

static jnode *parse_not(parser *P) {
    if (is_name(P, "not")) {
        const jtok *t = adv(P);
        enter(P);
        jnode *e = mk(P, N_NOT, t);
        e->a = parse_not(P);
        P->depth--;
        return e;
    }
    return parse_compare(P);
}

static jnode *parse_and(parser *P) {
    jnode *e = parse_not(P);
    while (is_name(P, "and")) {
        const jtok *t = adv(P);
        jnode *x = mk(P, N_AND, t);
        x->a = e;
        x->b = parse_not(P);
        e = x;
    }
    return e;
}

static jnode *parse_or(parser *P) {
    jnode *e = parse_and(P);
    while (is_name(P, "or")) {
        const jtok *t = adv(P);
        jnode *x = mk(P, N_OR, t);
        x->a = e;
        x->b = parse_and(P);
        e = x;
    }
    return e;
}

static jnode *parse_expr(parser *P, int with_cond) {
    enter(P);
    jnode *e = parse_or(P);
    while (with_cond && is_name(P, "if")) {
        const jtok *t = adv(P);
        jnode *x = mk(P, N_COND, t);
        x->a = e;
        x->b = parse_or(P);
        if (is_name(P, "else")) {
            adv(P);
            x->c = parse_expr(P, 1);
        }
        e = x;
    }
    P->depth--;
    return e;
}

/* a, b, c (a tuple) or a single expression */
static jnode *parse_tuple(parser *P, int with_cond, int explicit_parens) {
    const jtok *t = cur(P);
    if (explicit_parens && is_op(P, ")")) {
        jnode *e = mk(P, N_TUPLE, t);
        return e;
    }
    jnode *first = parse_expr(P, with_cond);
    if (!is_op(P, ",")) return first;
    nlist l = {0};
    nl_push(P, &l, first, NULL);
    while (is_op(P, ",")) {
        adv(P);
        if (cur(P)->t == TK_VAR_END || cur(P)->t == TK_BLOCK_END || is_op(P, ")") || is_name(P, "if")) break;
        nl_push(P, &l, parse_expr(P, with_cond), NULL);
    }
    jnode *e = mk(P, N_TUPLE, t);
    e->args = l.v;
    e->n = l.n;
    return e;
}

static void parse_targets(parser *P, jnode *s) {
    nlist l = {0};
    do {
        if (l.n) adv(P);
        const jtok *t = cur(P);
        nl_push(P, &l, NULL, expect_name(P));
        (void)t;
    } while (is_op(P, ","));
    s->names = l.kw;
    s->n_names = l.n;
}

static jnode *parse_if_rest(parser *P, const jtok *t) {
    static const char *const stop[] = {"elif", "else", "endif", NULL};
    jnode *s = mk(P, S_IF, t);
    s->a = parse_expr(P, 1);
    expect_end(P);
    const char *which;
    s->b = parse_body(P, stop, &which);
    if (!strcmp(which, "elif")) {
        s->c = parse_if_rest(P, &P->t[P->i - 1]);
    } else if (!strcmp(which, "else")) {
        static const char *const stop2[] = {"endif", NULL};
        expect_end(P);
        s->c = parse_body(P, stop2, &which);
        expect_end(P);
    } else {
        expect_end(P);
    }
    return s;
}

static jnode *parse_statement(parser *P) {
    const jtok *t = cur(P);
    const char *kw = expect_name(P);
    const char *which;
    enter(P);
    jnode *s = NULL;
    if (!strcmp(kw, "if")) {
        s = parse_if_rest(P, t);
    } else if (!strcmp(kw, "for")) {
        static const char *const stop[] = {"else", "endfor", NULL}, *const stop2[] = {"endfor", NULL};
        s = mk(P, S_FOR, t);
        parse_targets(P, s);
        if (!is_name(P, "in")) perr(P, cur(P), "expected 'in'%s", "");
        adv(P);
        s->a = parse_tuple(P, 0, 0);
        if (is_name(P, "if")) {
            adv(P);
            s->d = parse_expr(P, 1);
        }
        if (is_name(P, "recursive")) perr(P, cur(P), "recursive loops are not supported%s", "");
        expect_end(P);
        s->b = parse_body(P, stop, &which);
        if (!strcmp(which, "else")) {
            expect_end(P);
            s->c = parse_body(P, stop2, &which);
        }
        expect_end(P);
    } else if (!strcmp(kw, "set")) {
        s = mk(P, S_SET, t);
        parse_targets(P, s);
        if (s->n_names == 1 && is_op(P, ".")) {
            adv(P);
            s->op = expect_name(P);
        }
        if (is_op(P, "=")) {
            adv(P);
            s->a = parse_tuple(P, 1, 0);
            expect_end(P);
        } else {
            static const char *const stop[] = {"endset", NULL};
            if (s->n_names != 1 || s->op) perr(P, cur(P), "expected '='%s", "");
            s->k = S_SETBLOCK;
            expect_end(P);
            s->b = parse_body(P, stop, &which);
            expect_end(P);
        }
    } else if (!strcmp(kw, "macro")) {
        static const char *const stop[] = {"endmacro", NULL};
        s = mk(P, S_MACRO, t);
        s->name = expect_name(P);
        nlist l = {0};
        expect_op(P, "(");
        while (!is_op(P, ")")) {
            if (l.n) expect_op(P, ",");
            if (is_op(P, ")")) break;
            const char *pn = expect_name(P);
            jnode *def = NULL;
            if (is_op(P, "=")) {
                adv(P);
                def = parse_expr(P, 1);
            }
            nl_push(P, &l, def, pn);
        }
        adv(P);
        s->args = l.v;
        s->kw = l.kw;
        s->n = l.n;
        expect_end(P);
        s->b = parse_body(P, stop, &which);
        if (cur(P)->t == TK_NAME) adv(P); /* {% endmacro name %} */
        expect_end(P);
    } else if (!strcmp(kw, "break") || !strcmp(kw, "continue")) {
        s = mk(P, kw[0] == 'b' ? S_BREAK : S_CONTINUE, t);
        expect_end(P);
    } else if (!strcmp(kw, "generation")) {
        /* HF's assistant-mask extension: renders its body unchanged */
        static const char *const stop[] = {"endgeneration", NULL};
        expect_end(P);
        s = parse_body(P, stop, &which);
        expect_end(P);
    } else {
        perr(P, t, "unknown or unsupported tag '%s'", kw);
    }
    P->depth--;
    return s;
}

static jnode *parse_body(parser *P, const char *const *stop, const char **which) {
    nlist l = {0};
    const jtok *start = cur(P);
    for (;;) {
        const jtok *t = cur(P);
        if (t->t == TK_EOF) {
            if (stop) {
                size_t k = 0;
                while (stop[k + 1]) k++;
                perr(P, t, "unexpected end of template, expected '%s'", stop[k]);
            }
            break;
        }
        if (t->t == TK_TEXT) {
            jnode *s = mk(P, S_TEXT, t);
            s->text = t->s;
            s->text_len = t->len;
            nl_push(P, &l, s, NULL);
            adv(P);
        } else if (t->t == TK_VAR_BEGIN) {
            adv(P);
            jnode *s = mk(P, S_OUT, t);
            s->a = parse_tuple(P, 1, 0);
            if (cur(P)->t != TK_VAR_END) perr(P, cur(P), "expected end of tag '}}'%s", "");
            adv(P);
            nl_push(P, &l, s, NULL);
        } else if (t->t == TK_BLOCK_BEGIN) {
            adv(P);
            const jtok *nm = cur(P);
            int found = 0;
            for (size_t k = 0; stop && stop[k]; k++)
                if (nm->t == TK_NAME && !strcmp(nm->s, stop[k])) {
                    *which = stop[k];
                    adv(P);
                    found = 1;
                }
            if (found) break;
            if (nm->t == TK_NAME && (!strncmp(nm->s, "end", 3) || !strcmp(nm->s, "elif") || !strcmp(nm->s, "else")))
                perr(P, nm, "unexpected '%s'", nm->s);
            nl_push(P, &l, parse_statement(P), NULL);
        } else {
            perr(P, t, "unexpected token%s", "");
        }
    }
    jnode *b = mk(P, S_BODY, start);
    b->args = l.v;
    b->n = l.n;
    return b;
}

jnode *jparse_run(jarena *a, const jtok *toks, size_t n, char *msg, size_t msg_cap) {
    parser P = {.a = a, .t = toks, .n = n, .msg = msg, .msg_cap = msg_cap};
    if (setjmp(P.jmp)) return NULL;
    return parse_body(&P, NULL, NULL);
}
