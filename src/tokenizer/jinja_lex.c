/* Jinja lexer: template text -> tokens, with the whitespace rules of the
 * environment Hugging Face renders chat templates in:
 *   - newlines are normalised to \n and one trailing newline is dropped
 *     (keep_trailing_newline=False);
 *   - trim_blocks: the first newline after a block or comment tag is removed;
 *   - lstrip_blocks: spaces and tabs from the start of a line up to a block
 *     or comment tag are removed ({%+ turns this off for one tag);
 *   - a '-' inside a tag's delimiter strips all whitespace on that side.
 * Inside tags, brackets are balanced before an end delimiter counts, so
 * `{{ {'a': {'b': 1}} }}` lexes as Jinja does. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tokenizer/jinja_internal.h"

typedef struct {
    jarena *a;
    const char *s;
    size_t n;
    jtok *tok;
    size_t n_tok, cap;
    size_t lpos; /* position the line counter has reached */
    int line;
    size_t line_start;
    char *msg;
    size_t msg_cap;
    int failed;
} lexer;

static void where(lexer *L, size_t pos, int *line, int *col) {
    for (; L->lpos < pos; L->lpos++)
        if (L->s[L->lpos] == '\n') {
            L->line++;
            L->line_start = L->lpos + 1;
        }
    *line = L->line;
    *col = (int)(pos - L->line_start) + 1;
}

static int fail(lexer *L, size_t pos, const char *what) {
    int line, col;
    if (pos < L->lpos) { /* errors may point back at an opening delimiter: count again */
        L->lpos = 0;
        L->line = 1;
        L->line_start = 0;
    }
    where(L, pos, &line, &col);
    snprintf(L->msg, L->msg_cap, "line %d, column %d: %s", line, col, what);
    L->failed = 1;
    return -1;
}

static jtok *emit(lexer *L, jtok_type t, size_t pos, const char *s, size_t len) {
    if (L->failed) return NULL;
    if (L->n_tok == L->cap) {
        size_t cap = L->cap ? L->cap * 2 : 256;
        jtok *nt = ja_alloc(L->a, cap * sizeof *nt);
        if (!nt) {
            fail(L, pos, "template too large");
            return NULL;
        }
        if (L->n_tok) memcpy(nt, L->tok, L->n_tok * sizeof *nt);
        L->tok = nt;
        L->cap = cap;
    }
    jtok *k = &L->tok[L->n_tok++];
    memset(k, 0, sizeof *k);
    k->t = t;
    where(L, pos, &k->line, &k->col);
    if (s) {
        char *p = ja_alloc(L->a, len + 1);
        if (!p) {
            fail(L, pos, "template too large");
            return NULL;
        }
        memcpy(p, s, len);
        p[len] = 0;
        k->s = p;
        k->len = len;
    }
    return k;
}

static int is_ws(char ch) { return ch == ' ' || ch == '\t' || ch == '\n' || ch == '\r' || ch == '\f' || ch == '\v'; }
static int is_alpha(char ch) { return (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || ch == '_'; }
static int is_digit(char ch) { return ch >= '0' && ch <= '9'; }

static size_t put_utf8(char *o, uint32_t cp) {
    if (cp < 0x80) {
        o[0] = (char)cp;
        return 1;
    }
    if (cp < 0x800) {
        o[0] = (char)(0xC0 | cp >> 6);
        o[1] = (char)(0x80 | (cp & 0x3F));
        return 2;
    }
    if (cp < 0x10000) {
        o[0] = (char)(0xE0 | cp >> 12);
        o[1] = (char)(0x80 | ((cp >> 6) & 0x3F));
        o[2] = (char)(0x80 | (cp & 0x3F));
        return 3;
    }
    o[0] = (char)(0xF0 | cp >> 18);
    o[1] = (char)(0x80 | ((cp >> 12) & 0x3F));
    o[2] = (char)(0x80 | ((cp >> 6) & 0x3F));
    o[3] = (char)(0x80 | (cp & 0x3F));
    return 4;
}

static int hexval(char ch) {
    if (ch >= '0' && ch <= '9') return ch - '0';
    if (ch >= 'a' && ch <= 'f') return ch - 'a' + 10;
    if (ch >= 'A' && ch <= 'F') return ch - 'A' + 10;
    return -1;
}

/* A string literal at s[i] (the quote); Python's escapes as Jinja decodes them. */
static size_t lex_string(lexer *L, size_t i) {
    char q = L->s[i];
    size_t j = i + 1;
    while (j < L->n && L->s[j] != q) j += L->s[j] == '\\' ? 2 : 1;
    if (j >= L->n) return (size_t)fail(L, i, "unterminated string literal");
    char *out = ja_alloc(L->a, (j - i) + 1);
    if (!out) return (size_t)fail(L, i, "template too large");
    size_t o = 0;
    for (size_t k = i + 1; k < j; k++) {
        char ch = L->s[k];
        if (ch != '\\') {
            out[o++] = ch;
            continue;
        }
        char e = L->s[++k];
        int digits = 0;
        switch (e) {
        case 'n': out[o++] = '\n'; break;
        case 't': out[o++] = '\t'; break;
        case 'r': out[o++] = '\r'; break;
        case '\\': out[o++] = '\\'; break;
        case '\'': out[o++] = '\''; break;
        case '"': out[o++] = '"'; break;
        case 'a': out[o++] = '\a'; break;
        case 'b': out[o++] = '\b'; break;
        case 'f': out[o++] = '\f'; break;
        case 'v': out[o++] = '\v'; break;
        case '\n': break; /* line continuation */
        case 'x': digits = 2; break;
        case 'u': digits = 4; break;
        case 'U': digits = 8; break;
        default:
            if (e >= '0' && e <= '7') {
                uint32_t v = 0;
                int m = 0;
                while (m < 3 && k < j && L->s[k] >= '0' && L->s[k] <= '7') v = v * 8 + (uint32_t)(L->s[k++] - '0'), m++;
                k--;
                o += put_utf8(out + o, v);
            } else {
                out[o++] = '\\'; /* unknown escapes stay as written */
                out[o++] = e;
            }
        }
        if (digits) {
            uint32_t v = 0;
            for (int m = 0; m < digits; m++) {
                int h = k + 1 + (size_t)m < j ? hexval(L->s[k + 1 + m]) : -1;
                if (h < 0) return (size_t)fail(L, k - 1, "truncated \\x/\\u escape in a string literal");
                v = v * 16 + (uint32_t)h;
            }
            if (v > 0x10FFFF) return (size_t)fail(L, k - 1, "escape beyond U+10FFFF");
            k += (size_t)digits;
            o += put_utf8(out + o, v);
        }
    }
    jtok *t = emit(L, TK_STR, i, NULL, 0);
    if (!t) return (size_t)-1;
    out[o] = 0;
    t->s = out;
    t->len = o;
    return j + 1;
}

/* Tokens of one tag from i (after the opening delimiter) to its end
 * delimiter; returns the position after it and sets *strip or *plus when the
 * end delimiter carried '-' or '+'. */
static size_t lex_tag(lexer *L, size_t open, size_t i, int is_var, int *strip, int *plus) {
    int depth = 0;
    size_t brackets[64]; /* where the innermost open brackets are, for the message */
    *strip = *plus = 0;
    while (i < L->n) {
        char ch = L->s[i];
        if (is_ws(ch)) {
            i++;
            continue;
        }
        if (depth == 0) {
            const char *end = is_var ? "}}" : "%}";
            if ((ch == '-' || ch == '+') && i + 2 < L->n + 0 && !strncmp(L->s + i + 1, end, 2) &&
                (ch == '-' || !is_var)) {
                *strip = ch == '-';
                *plus = ch == '+';
                emit(L, is_var ? TK_VAR_END : TK_BLOCK_END, i, NULL, 0);
                return i + 3;
            }
            if (!strncmp(L->s + i, end, 2)) {
                emit(L, is_var ? TK_VAR_END : TK_BLOCK_END, i, NULL, 0);
                return i + 2;
            }
        }
        if (is_alpha(ch)) {
            size_t j = i;
            while (j < L->n && (is_alpha(L->s[j]) || is_digit(L->s[j]))) j++;
            emit(L, TK_NAME, i, L->s + i, j - i);
            i = j;
        } else if (is_digit(ch)) {
            size_t j = i;
            int is_f = 0;
            char buf[64];
            size_t b = 0;
            while (j < L->n && (is_digit(L->s[j]) || L->s[j] == '_')) {
                if (L->s[j] != '_' && b < 60) buf[b++] = L->s[j];
                j++;
            }
            if (j + 1 < L->n && L->s[j] == '.' && is_digit(L->s[j + 1])) {
                is_f = 1;
                buf[b++] = L->s[j++];
                while (j < L->n && (is_digit(L->s[j]) || L->s[j] == '_')) {
                    if (L->s[j] != '_' && b < 60) buf[b++] = L->s[j];
                    j++;
                }
            }
            if (j < L->n && (L->s[j] == 'e' || L->s[j] == 'E')) {
                size_t k = j + 1;
                if (k < L->n && (L->s[k] == '+' || L->s[k] == '-')) k++;
                if (k < L->n && is_digit(L->s[k])) {
                    is_f = 1;
                    while (j < k && b < 60) buf[b++] = L->s[j++];
                    while (j < L->n && is_digit(L->s[j])) {
                        if (b < 60) buf[b++] = L->s[j];
                        j++;
                    }
                }
            }
            buf[b] = 0;
            jtok *t = emit(L, is_f ? TK_FLOAT : TK_INT, i, L->s + i, j - i);
            if (!t) return (size_t)-1;
            if (is_f) {
                t->f = strtod(buf, NULL);
            } else {
                if (b > 18) return (size_t)fail(L, i, "integer literal too large");
                t->i = strtoll(buf, NULL, 10);
            }
            i = j;
        } else if (ch == '\'' || ch == '"') {
            i = lex_string(L, i);
            if (L->failed) return (size_t)-1;
        } else {
            static const char *ops2[] = {"//", "**", "==", "!=", "<=", ">="};
            size_t len = 0;
            for (size_t k = 0; k < sizeof ops2 / sizeof *ops2; k++)
                if (i + 1 < L->n && !strncmp(L->s + i, ops2[k], 2)) len = 2;
            if (!len && strchr("+-*/%~<>=.,:|()[]{}", ch) && ch) len = 1;
            if (!len) return (size_t)fail(L, i, "unexpected character in a tag");
            if (ch == '(' || ch == '[' || ch == '{') brackets[depth++ % 64] = i;
            if ((ch == ')' || ch == ']' || ch == '}') && depth > 0) {
                char o = L->s[brackets[(depth - 1) % 64]];
                if ((o == '(') != (ch == ')') || (o == '[') != (ch == ']')) {
                    char what[40];
                    snprintf(what, sizeof what, "unclosed '%c' (found '%c')", o, ch);
                    return (size_t)fail(L, brackets[(depth - 1) % 64], what);
                }
                depth--;
            }
            emit(L, TK_OP, i, L->s + i, len);
            i += len;
        }
        if (L->failed) return (size_t)-1;
    }
    if (depth > 0) {
        char what[40];
        snprintf(what, sizeof what, "unclosed '%c'", L->s[brackets[(depth - 1) % 64]]);
        return (size_t)fail(L, brackets[(depth - 1) % 64], what);
    }
    return (size_t)fail(L, open, is_var ? "unclosed '{{'" : "unclosed '{%'");
}

static int is_raw_block(const jtok *t, size_t n) {
    return n >= 3 && t[n - 3].t == TK_BLOCK_BEGIN && t[n - 2].t == TK_NAME && !strcmp(t[n - 2].s, "raw") &&
           t[n - 1].t == TK_BLOCK_END;
}

jtok *jlex_run(jarena *a, const char *src, size_t len, size_t *n_tok, char *msg, size_t msg_cap) {
    /* normalise newlines, drop one trailing newline */
    char *s = ja_alloc(a, len + 1);
    if (!s) {
        snprintf(msg, msg_cap, "template too large");
        return NULL;
    }
    size_t n = 0;
    for (size_t i = 0; i < len; i++) {
        if (src[i] == '\r') {
            s[n++] = '\n';
            if (i + 1 < len && src[i + 1] == '\n') i++;
        } else {
            s[n++] = src[i];
        }
    }
    if (n && s[n - 1] == '\n') n--;
    s[n] = 0;
    lexer L = {.a = a, .s = s, .n = n, .line = 1, .msg = msg, .msg_cap = msg_cap};
    size_t pos = 0;
    int strip_next = 0; /* the previous tag ended with '-' */
    while (pos <= n && !L.failed) {
        if (strip_next)
            while (pos < n && is_ws(s[pos])) pos++;
        strip_next = 0;
        size_t tag = pos;
        while (tag + 1 < n && !(s[tag] == '{' && (s[tag + 1] == '{' || s[tag + 1] == '%' || s[tag + 1] == '#'))) tag++;
        if (tag + 1 >= n) tag = n;
        size_t end = tag;
        if (tag < n) {
            char kind = s[tag + 1], mod = tag + 2 < n ? s[tag + 2] : 0;
            if (mod == '-') {
                while (end > pos && is_ws(s[end - 1])) end--;
            } else if ((kind == '%' || kind == '#') && mod != '+') {
                size_t l = end;
                while (l > pos && s[l - 1] != '\n') l--;
                int at_line_start = l > pos || pos == 0 || s[pos - 1] == '\n';
                int blank = 1;
                for (size_t k = l; k < end; k++)
                    if (s[k] != ' ' && s[k] != '\t') blank = 0;
                if (at_line_start && blank) end = l;
            }
        }
        if (end > pos) emit(&L, TK_TEXT, pos, s + pos, end - pos);
        if (tag >= n) break;
        char kind = s[tag + 1];
        size_t body = tag + 2 + (tag + 2 < n && (s[tag + 2] == '-' || s[tag + 2] == '+'));
        int strip = 0, plus = 0;
        if (kind == '#') {
            size_t k = body;
            while (k + 1 < n && !(s[k] == '#' && s[k + 1] == '}')) k++;
            if (k + 1 >= n) {
                fail(&L, tag, "unclosed comment");
                break;
            }
            strip = k > body && s[k - 1] == '-';
            plus = k > body && s[k - 1] == '+';
            pos = k + 2;
        } else {
            emit(&L, kind == '{' ? TK_VAR_BEGIN : TK_BLOCK_BEGIN, tag, NULL, 0);
            size_t after = lex_tag(&L, tag, body, kind == '{', &strip, &plus);
            if (L.failed) break;
            pos = after;
            if (kind == '%' && is_raw_block(L.tok, L.n_tok)) {
                /* {% raw %}: text up to {% endraw %} verbatim */
                L.n_tok -= 3;
                size_t k = pos, stop = n, resume = n;
                for (; k + 1 < n; k++) {
                    if (s[k] != '{' || s[k + 1] != '%') continue;
                    size_t m = k + 2, e = k;
                    if (m < n && (s[m] == '-' || s[m] == '+')) m++;
                    while (m < n && is_ws(s[m])) m++;
                    if (strncmp(s + m, "endraw", 6)) continue;
                    m += 6;
                    while (m < n && is_ws(s[m])) m++;
                    int st = m < n && s[m] == '-';
                    if (st || (m < n && s[m] == '+')) m++;
                    if (m + 1 >= n || s[m] != '%' || s[m + 1] != '}') continue;
                    if (s[k + 2] == '-')
                        while (e > pos && is_ws(s[e - 1])) e--;
                    stop = e;
                    resume = m + 2;
                    strip = st;
                    plus = 0;
                    break;
                }
                if (stop == n && resume == n) {
                    fail(&L, tag, "unclosed {% raw %}");
                    break;
                }
                size_t b0 = pos;
                if (strip_next) strip_next = 0;
                if (!plus && b0 < stop && s[b0] == '\n') b0++; /* trim_blocks after {% raw %} */
                if (stop > b0) emit(&L, TK_TEXT, b0, s + b0, stop - b0);
                pos = resume;
                kind = '%';
            }
        }
        if (strip) strip_next = 1;
        else if (kind != '{' && !plus && pos < n && s[pos] == '\n') pos++; /* trim_blocks */
    }
    if (L.failed) return NULL;
    emit(&L, TK_EOF, n, NULL, 0);
    if (L.failed) return NULL;
    *n_tok = L.n_tok;
    return L.tok;
}
