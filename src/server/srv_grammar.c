/* Grammar compiler (srv_grammar.h; the compiled form is in srv_grammar_impl.h).
 *
 * Literals become one set per byte, classes one set for their ASCII part and
 * a generated rule of UTF-8 byte sequences for the rest, groups and
 * repetitions generated rules (x* is R ::= x R | "", x? is R ::= x | "",
 * x{m,n} m copies then n-m nested optionals), as llama.cpp rewrites them.
 * Then the checks: every rule used is defined, and no rule can begin with
 * itself without reading a byte (left recursion would expand forever). */
#include "server/srv_grammar.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "core/alloc.h"
#include "server/srv_grammar_impl.h"

/* ================= parsing ================= */

typedef struct {
    gel *v;
    int n, cap;
} gseq;

typedef struct {
    gseq *alts;
    int n, cap;
    char name[80];
    int defined, line, generated;
} grule;

#define NAME_HASH 16384 /* > 2 x GRAMMAR_MAX_RULES */
#define SET_HASH  16384

typedef struct {
    const char *p, *end;
    int line;
    grule *rules;
    int n_rules, cap_rules;
    int32_t name_tab[NAME_HASH]; /* rule index + 1 by name */
    uint8_t (*sets)[32];
    int n_sets, cap_sets;
    int32_t set_tab[SET_HASH];
    long n_elems;
    int nest, failed;
    char *err;
    size_t errcap;
} gparser;

static int fail(gparser *P, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int fail(gparser *P, const char *fmt, ...) {
    if (P->failed) return -1;
    P->failed = 1;
    int k = snprintf(P->err, P->errcap, "line %d: ", P->line);
    va_list ap;
    va_start(ap, fmt);
    if (k >= 0 && (size_t)k < P->errcap) vsnprintf(P->err + k, P->errcap - (size_t)k, fmt, ap);
    va_end(ap);
    return -1;
}

static uint32_t hash_bytes(const void *p, size_t n) {
    uint32_t h = 2166136261u;
    for (size_t i = 0; i < n; i++) h = (h ^ ((const uint8_t *)p)[i]) * 16777619u;
    return h;
}

static int push_el(gparser *P, gseq *s, int kind, uint32_t arg) {
    if (++P->n_elems > GRAMMAR_MAX_ELEMS)
        return fail(P, "the grammar is too large (more than %d elements once repetitions are unrolled)",
                    GRAMMAR_MAX_ELEMS);
    if (s->n == s->cap) {
        s->cap = s->cap ? s->cap * 2 : 8;
        s->v = st_realloc(s->v, (size_t)s->cap * sizeof(gel));
    }
    s->v[s->n++] = (gel){.kind = (uint32_t)kind, .arg = arg};
    return 0;
}

static gseq *new_alt(grule *r) {
    if (r->n == r->cap) {
        r->cap = r->cap ? r->cap * 2 : 4;
        r->alts = st_realloc(r->alts, (size_t)r->cap * sizeof(gseq));
    }
    r->alts[r->n] = (gseq){0};
    return &r->alts[r->n++];
}

static int new_rule(gparser *P, const char *name, size_t len, int generated) {
    if (P->n_rules >= GRAMMAR_MAX_RULES)
        return fail(P, "the grammar is too large (more than %d rules, generated ones included)", GRAMMAR_MAX_RULES);
    if (P->n_rules == P->cap_rules) {
        P->cap_rules = P->cap_rules ? P->cap_rules * 2 : 64;
        P->rules = st_realloc(P->rules, (size_t)P->cap_rules * sizeof(grule));
    }
    grule *r = &P->rules[P->n_rules];
    memset(r, 0, sizeof *r);
    if (len >= sizeof r->name) len = sizeof r->name - 1;
    memcpy(r->name, name, len);
    r->generated = generated;
    r->line = P->line;
    return P->n_rules++;
}

/* The rule called name (made on first mention). */
static int rule_by_name(gparser *P, const char *name, size_t len) {
    uint32_t h = hash_bytes(name, len) & (NAME_HASH - 1);
    for (;;) {
        int32_t v = P->name_tab[h];
        if (!v) break;
        grule *r = &P->rules[v - 1];
        if (strlen(r->name) == len && !memcmp(r->name, name, len)) return v - 1;
        h = (h + 1) & (NAME_HASH - 1);
    }
    if (len >= sizeof P->rules[0].name) return fail(P, "a rule name is longer than 79 bytes");
    int id = new_rule(P, name, len, 0);
    if (id >= 0) P->name_tab[h] = id + 1;
    return id;
}

/* A generated rule, named after the rule being parsed for messages. */
static int gen_rule(gparser *P, int parent) {
    char nm[80];
    snprintf(nm, sizeof nm, "%.60s-%d", P->rules[parent].name, P->n_rules);
    return new_rule(P, nm, strlen(nm), 1);
}

static int intern_set(gparser *P, const uint8_t *bits) {
    uint32_t h = hash_bytes(bits, 32) & (SET_HASH - 1);
    for (;;) {
        int32_t v = P->set_tab[h];
        if (!v) break;
        if (!memcmp(P->sets[v - 1], bits, 32)) return v - 1;
        h = (h + 1) & (SET_HASH - 1);
    }
    if (P->n_sets >= SET_HASH / 2) return fail(P, "the grammar has more than %d distinct character sets", SET_HASH / 2);
    if (P->n_sets == P->cap_sets) {
        P->cap_sets = P->cap_sets ? P->cap_sets * 2 : 64;
        P->sets = st_realloc(P->sets, (size_t)P->cap_sets * 32);
    }
    memcpy(P->sets[P->n_sets], bits, 32);
    P->set_tab[h] = P->n_sets + 1;
    return P->n_sets++;
}

static int push_byte_range(gparser *P, gseq *s, uint8_t lo, uint8_t hi) {
    uint8_t bits[32] = {0};
    for (int b = lo; b <= hi; b++) bits[b >> 3] |= (uint8_t)(1 << (b & 7));
    int id = intern_set(P, bits);
    return id < 0 ? -1 : push_el(P, s, GE_SET, (uint32_t)id);
}

static void skip_space(gparser *P, int newline_ok) {
    while (P->p < P->end) {
        char c = *P->p;
        if (c == ' ' || c == '\t' || c == '\r') P->p++;
        else if (c == '#')
            while (P->p < P->end && *P->p != '\n') P->p++;
        else if (c == '\n' && newline_ok) {
            P->p++;
            P->line++;
        } else break;
    }
}

static int is_name_char(char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' || c == '_';
}

static int hexval(char c) {
    return c >= '0' && c <= '9'   ? c - '0'
           : c >= 'a' && c <= 'f' ? c - 'a' + 10
           : c >= 'A' && c <= 'F' ? c - 'A' + 10
                                  : -1;
}

/* One character of a literal or class: UTF-8 decoded, escapes resolved. -1 on error. */
static int32_t parse_char(gparser *P) {
    if (P->p >= P->end) return fail(P, "the grammar ends inside a literal or class");
    unsigned char c = (unsigned char)*P->p++;
    if (c == '\\') {
        if (P->p >= P->end) return fail(P, "the grammar ends inside an escape");
        char e = *P->p++;
        int nhex = e == 'x' ? 2 : e == 'u' ? 4 : e == 'U' ? 8 : 0;
        if (nhex) {
            uint32_t v = 0; /* unsigned: eight digits reach 0xFFFFFFFF */
            for (int i = 0; i < nhex; i++) {
                int h = P->p < P->end ? hexval(*P->p) : -1;
                if (h < 0) return fail(P, "\\%c needs %d hex digits", e, nhex);
                v = v * 16 + (uint32_t)h;
                P->p++;
            }
            if (v > 0x10FFFF) return fail(P, "\\%c%X is beyond Unicode", e, (unsigned)v);
            return (int32_t)v;
        }
        switch (e) {
        case 'n': return '\n';
        case 'r': return '\r';
        case 't': return '\t';
        case '\\':
        case '"':
        case '[':
        case ']':
        case '-':
        case '^':
        case '/':
        case '\'': return e;
        default: return fail(P, "unknown escape \\%c", e);
        }
    }
    if (c < 0x80) {
        if (c == '\n') return fail(P, "a literal or class is not closed on its line");
        return c;
    }
    int n = c >= 0xF0 && c < 0xF5 ? 3 : c >= 0xE0 ? 2 : c >= 0xC2 && c < 0xE0 ? 1 : -1;
    if (n < 0 || c >= 0xF5) return fail(P, "invalid UTF-8 in the grammar");
    int32_t v = c & (0x3F >> n);
    for (int i = 0; i < n; i++) {
        if (P->p >= P->end || ((unsigned char)*P->p & 0xC0) != 0x80) return fail(P, "invalid UTF-8 in the grammar");
        v = (v << 6) | ((unsigned char)*P->p++ & 0x3F);
    }
    return v;
}

static int utf8_encode(int32_t c, uint8_t *o) {
    if (c < 0x80) {
        o[0] = (uint8_t)c;
        return 1;
    }
    if (c < 0x800) {
        o[0] = (uint8_t)(0xC0 | (c >> 6));
        o[1] = (uint8_t)(0x80 | (c & 0x3F));
        return 2;
    }
    if (c < 0x10000) {
        o[0] = (uint8_t)(0xE0 | (c >> 12));
        o[1] = (uint8_t)(0x80 | ((c >> 6) & 0x3F));
        o[2] = (uint8_t)(0x80 | (c & 0x3F));
        return 3;
    }
    o[0] = (uint8_t)(0xF0 | (c >> 18));
    o[1] = (uint8_t)(0x80 | ((c >> 12) & 0x3F));
    o[2] = (uint8_t)(0x80 | ((c >> 6) & 0x3F));
    o[3] = (uint8_t)(0x80 | (c & 0x3F));
    return 4;
}

/* The UTF-8 byte sequences of code points lo..hi (all of one encoded
 * length after the first split) as alternatives of rule r: the split of
 * RE2's compiler, until each byte position is a plain range. */
static int utf8_ranges(gparser *P, int r, int32_t lo, int32_t hi) {
    if (lo > hi || P->failed) return P->failed ? -1 : 0;
    static const int32_t bounds[] = {0x7F, 0x7FF, 0xFFFF};
    for (int i = 0; i < 3; i++)
        if (lo <= bounds[i] && bounds[i] < hi) {
            utf8_ranges(P, r, lo, bounds[i]);
            return utf8_ranges(P, r, bounds[i] + 1, hi);
        }
    uint8_t a[4], b[4];
    int n = utf8_encode(lo, a);
    for (int i = 1; i < n; i++) {
        int32_t m = (1 << (6 * i)) - 1;
        if ((lo & ~m) != (hi & ~m)) {
            if ((lo & m) != 0) {
                utf8_ranges(P, r, lo, lo | m);
                return utf8_ranges(P, r, (lo | m) + 1, hi);
            }
            if ((hi & m) != m) {
                utf8_ranges(P, r, lo, (hi & ~m) - 1);
                return utf8_ranges(P, r, hi & ~m, hi);
            }
        }
    }
    utf8_encode(hi, b);
    gseq *s = new_alt(&P->rules[r]);
    for (int i = 0; i < n; i++)
        if (push_byte_range(P, s, a[i], b[i]) < 0) return -1;
    return 0;
}

typedef struct {
    int32_t lo, hi;
} cprange;

/* Elements for a set of code-point ranges (sorted, merged here): one byte set
 * when all are ASCII, else a reference to a rule of byte sequences. */
static int push_class(gparser *P, int cur_rule, gseq *s, cprange *rg, int n, int negate) {
    for (int i = 1; i < n; i++) /* insertion sort: classes are short */
        for (int j = i; j > 0 && rg[j].lo < rg[j - 1].lo; j--) {
            cprange t = rg[j];
            rg[j] = rg[j - 1];
            rg[j - 1] = t;
        }
    int m = 0;
    for (int i = 0; i < n; i++) {
        if (m && rg[i].lo <= rg[m - 1].hi + 1) {
            if (rg[i].hi > rg[m - 1].hi) rg[m - 1].hi = rg[i].hi;
        } else rg[m++] = rg[i];
    }
    cprange out[260];
    int k = 0;
    if (negate) {
        int32_t next = 0;
        for (int i = 0; i < m; i++) {
            if (rg[i].lo > next) out[k++] = (cprange){next, rg[i].lo - 1};
            next = rg[i].hi + 1;
        }
        if (next <= 0x10FFFF) out[k++] = (cprange){next, 0x10FFFF};
    } else {
        memcpy(out, rg, (size_t)m * sizeof *rg);
        k = m;
    }
    uint8_t bits[32] = {0};
    int ascii = 0, wide = 0;
    for (int i = 0; i < k; i++) {
        for (int32_t c = out[i].lo; c <= out[i].hi && c < 0x80; c++) {
            bits[c >> 3] |= (uint8_t)(1 << (c & 7));
            ascii = 1;
        }
        wide |= out[i].hi >= 0x80;
    }
    if (!wide) {
        if (!ascii) return fail(P, "a character class that matches nothing");
        int id = intern_set(P, bits);
        return id < 0 ? -1 : push_el(P, s, GE_SET, (uint32_t)id);
    }
    int r = gen_rule(P, cur_rule);
    if (r < 0) return -1;
    if (ascii) {
        int id = intern_set(P, bits);
        if (id < 0 || push_el(P, new_alt(&P->rules[r]), GE_SET, (uint32_t)id) < 0) return -1;
    }
    for (int i = 0; i < k; i++) {
        int32_t lo = out[i].lo < 0x80 ? 0x80 : out[i].lo, hi = out[i].hi;
        if (lo > hi) continue;
        /* surrogates are not characters: leave them out */
        if (lo <= 0xDFFF && hi >= 0xD800) {
            if (utf8_ranges(P, r, lo, 0xD7FF) < 0 || utf8_ranges(P, r, 0xE000, hi) < 0) return -1;
            if (lo > 0xD7FF && utf8_ranges(P, r, 0, -1) < 0) return -1;
        } else if (utf8_ranges(P, r, lo, hi) < 0) return -1;
    }
    return push_el(P, s, GE_REF, (uint32_t)r);
}

static int parse_alts(gparser *P, int r, int nested);

/* Copy elements [a, b) of s to the end of d (d may be s). */
static int copy_els(gparser *P, gseq *d, gseq *s, int a, int b) {
    for (int i = a; i < b; i++) {
        gel e = s->v[i]; /* s->v may move when d == s grows */
        if (push_el(P, d, (int)e.kind, e.arg) < 0) return -1;
    }
    return 0;
}

/* Postfix operators on the item at s->v[start..]: see the file comment. */
static int repeat(gparser *P, int cur_rule, gseq *s, int start, int min, int max /* -1: no bound */) {
    int n_item = s->n - start;
    gseq item = {0};
    if (copy_els(P, &item, s, start, s->n) < 0) goto err;
    P->n_elems -= n_item; /* the copy is scratch: counted again when placed */
    s->n = start;
    P->n_elems -= n_item;
    for (int i = 0; i < min; i++)
        if (copy_els(P, s, &item, 0, item.n) < 0) goto err;
    if (max < 0) { /* R ::= item R | "" */
        int R = gen_rule(P, cur_rule);
        if (R < 0) goto err;
        gseq *a = new_alt(&P->rules[R]);
        if (copy_els(P, a, &item, 0, item.n) < 0 || push_el(P, a, GE_REF, (uint32_t)R) < 0) goto err;
        new_alt(&P->rules[R]);
        if (push_el(P, s, GE_REF, (uint32_t)R) < 0) goto err;
    } else if (max > min) { /* nested optionals, innermost first */
        int inner = -1;
        for (int k = 0; k < max - min; k++) {
            int R = gen_rule(P, cur_rule);
            if (R < 0) goto err;
            gseq *a = new_alt(&P->rules[R]);
            if (copy_els(P, a, &item, 0, item.n) < 0) goto err;
            if (inner >= 0 && push_el(P, a, GE_REF, (uint32_t)inner) < 0) goto err;
            new_alt(&P->rules[R]);
            inner = R;
        }
        if (push_el(P, s, GE_REF, (uint32_t)inner) < 0) goto err;
    }
    st_free(item.v);
    return 0;
err:
    st_free(item.v);
    return -1;
}

static int parse_int(gparser *P, int *out) {
    if (P->p >= P->end || *P->p < '0' || *P->p > '9') return fail(P, "a number is expected in {m,n}");
    long v = 0;
    while (P->p < P->end && *P->p >= '0' && *P->p <= '9') {
        v = v * 10 + (*P->p++ - '0');
        if (v > GRAMMAR_MAX_REPEAT) return fail(P, "a repetition count above %d", GRAMMAR_MAX_REPEAT);
    }
    *out = (int)v;
    return 0;
}

/* A sequence of items into s, until | ) or the end of the line (top level). */
static int parse_seq(gparser *P, int r, gseq *s, int nested) {
    for (;;) {
        skip_space(P, nested);
        if (P->p >= P->end) return 0;
        char c = *P->p;
        if (c == '|' || c == ')' || c == '\n') return 0;
        int start = s->n;
        if (c == '"') {
            P->p++;
            while (P->p < P->end && *P->p != '"') {
                int32_t ch = parse_char(P);
                if (ch < 0) return -1;
                uint8_t u[4];
                int n = utf8_encode(ch, u);
                for (int i = 0; i < n; i++)
                    if (push_byte_range(P, s, u[i], u[i]) < 0) return -1;
            }
            if (P->p >= P->end) return fail(P, "a literal is not closed");
            P->p++;
        } else if (c == '[') {
            P->p++;
            int negate = P->p < P->end && *P->p == '^';
            if (negate) P->p++;
            cprange rg[256];
            int n = 0;
            while (P->p < P->end && *P->p != ']') {
                if (n == 256) return fail(P, "a character class with more than 256 items");
                int32_t lo = parse_char(P), hi = lo;
                if (lo < 0) return -1;
                if (P->p + 1 < P->end && *P->p == '-' && P->p[1] != ']') {
                    P->p++;
                    hi = parse_char(P);
                    if (hi < 0) return -1;
                    if (hi < lo) return fail(P, "a range in a class runs backwards");
                }
                rg[n++] = (cprange){lo, hi};
            }
            if (P->p >= P->end) return fail(P, "a character class is not closed");
            P->p++;
            if (!n && !negate) return fail(P, "an empty character class []");
            if (push_class(P, r, s, rg, n, negate) < 0) return -1;
        } else if (c == '.') {
            P->p++;
            cprange rg[1] = {{0, -1}}; /* nothing, negated: every character */
            if (push_class(P, r, s, rg, 0, 1) < 0) return -1;
        } else if (c == '(') {
            P->p++;
            if (++P->nest > GRAMMAR_MAX_NEST) return fail(P, "groups nested deeper than %d", GRAMMAR_MAX_NEST);
            int R = gen_rule(P, r);
            if (R < 0 || parse_alts(P, R, 1) < 0) return -1;
            skip_space(P, 1);
            if (P->p >= P->end || *P->p != ')') return fail(P, "a group is not closed with )");
            P->p++;
            P->nest--;
            if (push_el(P, s, GE_REF, (uint32_t)R) < 0) return -1;
        } else if (is_name_char(c)) {
            const char *n0 = P->p;
            while (P->p < P->end && is_name_char(*P->p)) P->p++;
            if (P->p + 2 < P->end && !memcmp(P->p, "::=", 3)) return fail(P, "a rule definition inside another rule");
            const char *q = P->p; /* `name ::=` on the next line of an unfinished rule */
            while (q < P->end && (*q == ' ' || *q == '\t')) q++;
            if (q + 2 < P->end && !memcmp(q, "::=", 3)) return fail(P, "a rule definition inside another rule");
            int R = rule_by_name(P, n0, (size_t)(P->p - n0));
            if (R < 0 || push_el(P, s, GE_REF, (uint32_t)R) < 0) return -1;
        } else return fail(P, "unexpected '%c'", c);
        /* postfix operators apply to the item just read */
        for (;;) {
            if (P->p >= P->end) break;
            char o = *P->p;
            int mn, mx;
            if (o == '*') mn = 0, mx = -1;
            else if (o == '+') mn = 1, mx = -1;
            else if (o == '?') mn = 0, mx = 1;
            else if (o == '{') {
                P->p++;
                if (parse_int(P, &mn) < 0) return -1;
                mx = mn;
                if (P->p < P->end && *P->p == ',') {
                    P->p++;
                    mx = -1;
                    if (P->p < P->end && *P->p != '}' && parse_int(P, &mx) < 0) return -1;
                }
                if (P->p >= P->end || *P->p != '}') return fail(P, "{m,n} is not closed with }");
                if (mx >= 0 && mx < mn) return fail(P, "{%d,%d}: the maximum is below the minimum", mn, mx);
            } else break;
            P->p++;
            if (s->n == start) return fail(P, "'%c' follows nothing", o);
            if (repeat(P, r, s, start, mn, mx) < 0) return -1;
        }
    }
}

static int parse_alts(gparser *P, int r, int nested) {
    for (;;) {
        gseq *s = new_alt(&P->rules[r]);
        int idx = P->rules[r].n - 1;
        gseq tmp = *s; /* rules[] may move while the sequence is parsed (new rules): work on a copy */
        int rc = parse_seq(P, r, &tmp, nested);
        P->rules[r].alts[idx] = tmp;
        if (rc < 0) return -1;
        skip_space(P, nested);
        if (P->p < P->end && *P->p == '|') {
            P->p++;
            skip_space(P, 1);
            continue;
        }
        return 0;
    }
}

/* ---- checks: undefined rules, left recursion ---- */

static int check_rules(gparser *P) {
    for (int r = 0; r < P->n_rules; r++)
        if (!P->rules[r].generated && !P->rules[r].defined) {
            P->line = P->rules[r].line;
            return fail(P, "rule '%s' is used but not defined", P->rules[r].name);
        }
    int n = P->n_rules;
    uint8_t *nullable = st_calloc((size_t)n, 1);
    for (int changed = 1; changed;) { /* fixpoint: a rule is nullable when one alternative is */
        changed = 0;
        for (int r = 0; r < n; r++) {
            if (nullable[r]) continue;
            for (int a = 0; a < P->rules[r].n && !nullable[r]; a++) {
                gseq *s = &P->rules[r].alts[a];
                int all = 1;
                for (int i = 0; i < s->n && all; i++) all = s->v[i].kind == GE_REF && nullable[s->v[i].arg];
                if (all) nullable[r] = changed = 1;
            }
        }
    }
    /* left recursion: a cycle among references that can come first (all before them nullable);
     * depth-first with an explicit stack of (rule, alternative, element) cursors */
    uint8_t *color = st_calloc((size_t)n, 1); /* 0 new, 1 on the path, 2 done */
    struct cursor {
        int r, a, i;
    } *stk = st_malloc((size_t)n * sizeof *stk);
    int rc = 0;
    for (int r0 = 0; r0 < n && !rc; r0++) {
        if (color[r0]) continue;
        int sp = 0;
        stk[sp++] = (struct cursor){r0, 0, 0};
        color[r0] = 1;
        while (sp && !rc) {
            struct cursor *f = &stk[sp - 1];
            int pushed = 0;
            while (!pushed && !rc && f->a < P->rules[f->r].n) {
                gseq *s = &P->rules[f->r].alts[f->a];
                if (f->i >= s->n || s->v[f->i].kind != GE_REF) {
                    f->a++;
                    f->i = 0;
                    continue;
                }
                int t = (int)s->v[f->i].arg;
                if (nullable[t]) f->i++;
                else {
                    f->a++;
                    f->i = 0;
                }
                if (color[t] == 1) {
                    P->line = P->rules[t].line;
                    rc = fail(P,
                              "left recursion: rule '%s' can begin with itself (by way of '%s') without reading "
                              "anything, which would never end",
                              P->rules[t].name, P->rules[f->r].name);
                } else if (!color[t]) {
                    color[t] = 1;
                    stk[sp++] = (struct cursor){t, 0, 0};
                    pushed = 1;
                }
            }
            if (!pushed && !rc) {
                color[stk[sp - 1].r] = 2;
                sp--;
            }
        }
    }
    st_free(stk);
    st_free(color);
    st_free(nullable);
    return rc;
}

static void parser_free(gparser *P) {
    for (int r = 0; r < P->n_rules; r++) {
        for (int a = 0; a < P->rules[r].n; a++) st_free(P->rules[r].alts[a].v);
        st_free(P->rules[r].alts);
    }
    st_free(P->rules);
    st_free(P->sets);
    st_free(P);
}

grammar *grammar_parse(const char *text, size_t len, char *err, size_t errcap) {
    if (errcap) err[0] = 0;
    if (len > GRAMMAR_MAX_TEXT) {
        snprintf(err, errcap, "the grammar is %zu bytes, more than %zu", len, GRAMMAR_MAX_TEXT);
        return NULL;
    }
    gparser *P = st_calloc(1, sizeof *P);
    P->p = text;
    P->end = text + len;
    P->line = 1;
    P->err = err;
    P->errcap = errcap;
    for (;;) {
        skip_space(P, 1);
        if (P->p >= P->end) break;
        const char *n0 = P->p;
        while (P->p < P->end && is_name_char(*P->p)) P->p++;
        if (P->p == n0) {
            fail(P, "a rule name is expected, not '%c'", *P->p);
            break;
        }
        int r = rule_by_name(P, n0, (size_t)(P->p - n0));
        if (r < 0) break;
        if (P->rules[r].defined) {
            fail(P, "rule '%s' is defined twice", P->rules[r].name);
            break;
        }
        P->rules[r].defined = 1;
        P->rules[r].line = P->line;
        skip_space(P, 0);
        if (P->end - P->p < 3 || memcmp(P->p, "::=", 3)) {
            fail(P, "'::=' is expected after the rule name '%s'", P->rules[r].name);
            break;
        }
        P->p += 3;
        skip_space(P, 1);
        if (parse_alts(P, r, 0) < 0) break;
        skip_space(P, 0);
        if (P->p < P->end && *P->p != '\n') {
            fail(P, "unexpected '%c'", *P->p);
            break;
        }
    }
    int root = -1;
    if (!P->failed) {
        uint32_t h = hash_bytes("root", 4) & (NAME_HASH - 1);
        for (int32_t v; (v = P->name_tab[h]); h = (h + 1) & (NAME_HASH - 1))
            if (!strcmp(P->rules[v - 1].name, "root")) root = v - 1;
        if (root < 0) fail(P, "the grammar has no 'root' rule");
    }
    if (!P->failed) check_rules(P);
    if (P->failed) {
        parser_free(P);
        return NULL;
    }
    /* flatten */
    grammar *g = st_calloc(1, sizeof *g);
    int n_el = 0, n_alt = 0;
    for (int r = 0; r < P->n_rules; r++) {
        n_alt += P->rules[r].n;
        for (int a = 0; a < P->rules[r].n; a++) n_el += P->rules[r].alts[a].n + 1;
    }
    g->el = st_malloc((size_t)(n_el ? n_el : 1) * sizeof(gel));
    g->alt = st_malloc((size_t)(n_alt ? n_alt : 1) * sizeof(uint32_t));
    g->rule_alt = st_malloc(((size_t)P->n_rules + 1) * sizeof(uint32_t));
    int e = 0, k = 0;
    for (int r = 0; r < P->n_rules; r++) {
        g->rule_alt[r] = (uint32_t)k;
        for (int a = 0; a < P->rules[r].n; a++) {
            gseq *s = &P->rules[r].alts[a];
            g->alt[k++] = (uint32_t)e;
            if (s->n) memcpy(g->el + e, s->v, (size_t)s->n * sizeof(gel));
            e += s->n;
            g->el[e++] = (gel){.kind = GE_END};
        }
    }
    g->rule_alt[P->n_rules] = (uint32_t)k;
    g->n_el = n_el;
    g->n_alt = n_alt;
    g->n_rules = P->n_rules;
    g->root = root;
    g->n_sets = P->n_sets;
    g->sets = st_malloc((size_t)(P->n_sets ? P->n_sets : 1) * 32);
    if (P->n_sets) memcpy(g->sets, P->sets, (size_t)P->n_sets * 32);
    parser_free(P);
    return g;
}

void grammar_free(grammar *g) {
    if (!g) return;
    st_free(g->el);
    st_free(g->alt);
    st_free(g->rule_alt);
    st_free(g->sets);
    st_free(g);
}
