/* Internals of the Jinja interpreter (jinja.h), shared by its files:
 *   jinja_lex.c     source -> tokens (whitespace control, trim/lstrip blocks)
 *   jinja_parse.c   tokens -> syntax tree
 *   jinja_value.c   arena, values, str()/repr()/tojson as Python prints them
 *   jinja_eval.c    statements and expressions
 *   jinja_builtins.c filters, tests, methods and global functions
 *
 * Memory: everything a parse or a render creates lives in an arena that is
 * freed at once, so an error anywhere can unwind with longjmp and leak
 * nothing. Values are immutable once built (the sandbox HF renders in has no
 * list.append), except namespaces, which `{% set ns.x = ... %}` mutates.
 */
#ifndef STRATA_TOKENIZER_JINJA_INTERNAL_H
#define STRATA_TOKENIZER_JINJA_INTERNAL_H

#include <setjmp.h>
#include <stddef.h>
#include <stdint.h>

#include "tokenizer/jinja.h"

/* ---- arena ---- */
typedef struct jarena_chunk jarena_chunk;
typedef struct {
    jarena_chunk *head;
    size_t used;  /* bytes handed out, all chunks */
    size_t limit; /* 0 = none */
} jarena;

/* ---- values ---- */
typedef enum { JV_UNDEF, JV_NONE, JV_BOOL, JV_INT, JV_FLOAT, JV_STR, JV_LIST, JV_DICT, JV_FUNC, JV_LOOP } jv_type;
typedef enum { JF_BUILTIN, JF_METHOD, JF_MACRO } jf_kind;

typedef struct jv jv;
struct jnode;
struct jv {
    jv_type t;
    uint8_t is_ns;    /* JV_DICT: a namespace() (mutable attributes) */
    uint8_t is_tuple; /* JV_LIST: printed as a tuple */
    union {
        int b;
        int64_t i;
        double f;
        struct {
            const char *s; /* NUL-terminated too, for convenience */
            size_t len;
        } str;
        struct {
            jv **v;
            size_t n;
        } list;
        struct {
            jv **k, **v; /* keys are strings in practice; order kept */
            size_t n, cap;
        } dict;
        struct {
            jf_kind kind;
            const char *name;          /* builtin or method name */
            jv *self;                  /* JF_METHOD */
            const struct jnode *macro; /* JF_MACRO */
        } fn;
        struct { /* a for-loop's `loop`: one object per loop, updated in place as Jinja's is;
                  * its fields are computed when read, so an iteration allocates nothing */
            int64_t i, n;
            jv *items;
        } loop;
    } u;
};

/* ---- tokens ---- */
typedef enum {
    TK_TEXT,
    TK_VAR_BEGIN,
    TK_VAR_END,
    TK_BLOCK_BEGIN,
    TK_BLOCK_END,
    TK_NAME,
    TK_STR,
    TK_INT,
    TK_FLOAT,
    TK_OP,
    TK_EOF
} jtok_type;

typedef struct {
    jtok_type t;
    int line, col;
    const char *s; /* TEXT/NAME/STR/OP text (NUL-terminated, in the arena) */
    size_t len;
    int64_t i;
    double f;
} jtok;

/* ---- syntax tree ---- */
typedef enum {
    /* expressions */
    N_LIT,
    N_NAME,
    N_LIST,
    N_TUPLE,
    N_DICT,
    N_ATTR,
    N_ITEM,
    N_SLICE,
    N_CALL,
    N_FILTER,
    N_TEST,
    N_NEG,
    N_POS,
    N_NOT,
    N_AND,
    N_OR,
    N_BIN,
    N_CMP,
    N_COND,
    /* statements */
    S_BODY,
    S_TEXT,
    S_OUT,
    S_IF,
    S_FOR,
    S_SET,
    S_SETBLOCK,
    S_MACRO,
    S_BREAK,
    S_CONTINUE
} jnode_kind;

typedef struct jnode jnode;
struct jnode {
    jnode_kind k;
    int line, col;
    const char *op;   /* N_BIN/N_CMP operator; N_ATTR attribute; S_SET attribute of a namespace */
    const char *name; /* N_NAME, N_FILTER/N_TEST/N_CALL-by-name, S_SET/S_MACRO target */
    jv *lit;          /* N_LIT */
    const char *text; /* S_TEXT */
    size_t text_len;
    int negate; /* N_TEST: `is not` */
    jnode *a, *b, *c, *d;
    jnode **args;    /* list items, dict k/v pairs, call args, body statements, macro defaults */
    const char **kw; /* parallel to args for calls: keyword name or NULL; macro parameter names */
    size_t n;
    const char **names; /* S_FOR / S_SET targets (more than one = unpacking) */
    size_t n_names;
};

struct jinja_tmpl {
    jarena arena;
    jnode *root;
};

/* ---- render context ---- */
typedef struct jframe jframe;
struct jframe {
    jframe *parent;
    const char **names;
    jv **vals;
    size_t n, cap;
};

typedef struct {
    char *s;
    size_t len, cap;
} jbuf;

typedef struct {
    jarena arena;
    jinja_limits lim;
    jframe *root;   /* the context's variables */
    jframe *frame;  /* innermost scope */
    jbuf *out;      /* where output goes now (macros render into their own) */
    uint64_t steps; /* loop iterations so far */
    int depth;      /* macro/expression nesting */
    int loop_ctl;   /* 1 break, 2 continue */
    int line;       /* line being evaluated, for messages */
    int raised;     /* err holds a raise_exception() message */
    jmp_buf jmp;
    char err[512];
} jctx;

/* jinja_value.c */
void *ja_alloc(jarena *a, size_t n); /* NULL when over the limit */
void ja_free(jarena *a);
_Noreturn void jx_fail(jctx *c, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void *jx_alloc(jctx *c, size_t n); /* fails the render when over the memory limit */
extern jv jv_undef_v, jv_none_v, jv_true_v, jv_false_v;
#define JV_UNDEFINED (&jv_undef_v)
#define JV_NONEV     (&jv_none_v)
jv *jv_bool(int b);
jv *jv_int(jctx *c, int64_t i);
jv *jv_float(jctx *c, double f);
jv *jv_strn(jctx *c, const char *s, size_t n);
jv *jv_str(jctx *c, const char *s);
jv *jv_list(jctx *c, size_t n); /* n slots, filled by the caller */
jv *jv_dict(jctx *c);
void jv_dict_set(jctx *c, jv *d, jv *k, jv *v);
jv *jv_dict_get(const jv *d, const char *key, size_t len); /* NULL if absent */
jv *jv_dict_getv(const jv *d, const jv *key);
jv *jv_func(jctx *c, jf_kind kind, const char *name, jv *self, const jnode *macro);
int jv_truthy(const jv *v);
int jv_equal(const jv *a, const jv *b);
const char *jv_type_name(const jv *v);
jv *jv_from_json(jctx *c, const struct json_t *j, int depth);
void jb_put(jctx *c, jbuf *b, const char *s, size_t n);
void jb_puts(jctx *c, jbuf *b, const char *s);
void jv_write_str(jctx *c, jbuf *b, const jv *v);  /* Python str() */
void jv_write_repr(jctx *c, jbuf *b, const jv *v); /* Python repr() */
/* json.dumps(v, ensure_ascii=False, indent=indent (<0: None), sort_keys, separators=(item_sep, key_sep));
 * NULL separators: Python's defaults for the indent */
void jv_write_json(jctx *c, jbuf *b, const jv *v, int indent, int sort_keys, const char *item_sep, const char *key_sep,
                   int level);
jv *jv_to_str(jctx *c, const jv *v);
void jfmt_float(char *buf, size_t cap, double f); /* Python repr of a float */
/* UTF-8 helpers: code points in s[0..n), and the byte offset of code point k */
size_t ju_len(const char *s, size_t n);
size_t ju_offset(const char *s, size_t n, size_t k);

/* jinja_lex.c: tokens of the whole template; NULL + msg on error */
jtok *jlex_run(jarena *a, const char *src, size_t len, size_t *n_tok, char *msg, size_t msg_cap);

/* jinja_parse.c */
jnode *jparse_run(jarena *a, const jtok *toks, size_t n, char *msg, size_t msg_cap);

/* jinja_eval.c */
jv *jx_eval(jctx *c, const jnode *e);
void jx_exec(jctx *c, const jnode *s);
jv *jx_lookup(jctx *c, const char *name);
jv *jx_call(jctx *c, jv *fn, jv **args, const char **kw, size_t n, int line);
jv *jx_getattr(jctx *c, jv *obj, const char *name);
jv *jx_getitem(jctx *c, jv *obj, jv *key);

/* jinja_builtins.c */
jv *jx_filter(jctx *c, const char *name, jv *v, jv **args, const char **kw, size_t n);
int jx_test(jctx *c, const char *name, jv *v, jv **args, size_t n);
jv *jx_method(jctx *c, jv *self, const char *name, jv **args, const char **kw, size_t n);
jv *jx_builtin(jctx *c, const char *name, jv **args, const char **kw, size_t n);
int jx_is_method(const jv *obj, const char *name);
int jx_is_builtin(const char *name);
int ju_is_space(uint32_t cp);
uint32_t ju_decode(const char *s, size_t n, size_t *adv);

#endif
