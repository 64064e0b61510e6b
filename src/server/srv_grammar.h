/* Constrained decoding: a grammar (a subset of llama.cpp's GBNF), a matcher
 * that follows it byte by byte, and a converter from JSON Schema to that
 * grammar. One engine behind every constraint the server offers:
 * response_format json_object / json_schema, llama-server's `grammar` field,
 * and forced tool calls (tool_choice required / a named function / Anthropic
 * any / tool), whose grammar wraps the model's call delimiters around the
 * arguments' schema.
 *
 * Grammar text (GBNF subset):
 *     rule    ::= name "::=" alternatives      (one per line; `#` comments)
 *     alts    ::= sequence ("|" sequence)*     (a newline may follow "|"; inside (...) anywhere)
 *     item    ::= name | "literal" | [class] | [^class] | "(" alts ")" | "."
 *                 followed by * + ? {m} {m,} {m,n}
 * Literals and classes take \n \r \t \\ \" \] \- \xHH \uHHHH \UHHHHHHHH; classes hold
 * characters and ranges (a-z) of Unicode code points; `.` is any character.
 * The start rule is `root`.
 *
 * The matcher works on bytes: classes are compiled to byte sets and, for
 * characters beyond ASCII, to the UTF-8 byte sequences of their ranges, so
 * tokens that end inside a character are followed exactly. Its state is the
 * set of parse stacks (llama.cpp's approach) kept as a tree of nodes in an
 * arena that is rolled back after each trial, so testing a token costs the
 * work of its own bytes and nothing is copied.
 *
 * Hostile grammars are bounded at compile time (text size, rules, elements,
 * nesting, repetition counts; left recursion refused, since it would expand
 * forever) and at run time (at most GRAMMAR_MAX_STACKS parse stacks and
 * GRAMMAR_MAX_EXPAND expansion steps per byte: a byte that needs more is
 * refused, which ends the answer rather than the process; a walk over the
 * vocabulary that needs more than GRAMMAR_MAX_PASS_WORK steps ends it too). */
#ifndef STRATA_SERVER_SRV_GRAMMAR_H
#define STRATA_SERVER_SRV_GRAMMAR_H

#include <jansson.h>
#include <stddef.h>
#include <stdint.h>

#define GRAMMAR_MAX_TEXT      ((size_t)256 << 10) /* bytes of grammar text */
#define GRAMMAR_MAX_RULES     8192                /* rules, generated ones (groups, repetitions) included */
#define GRAMMAR_MAX_ELEMS     65536               /* elements after repetitions are unrolled */
#define GRAMMAR_MAX_NEST      64                  /* nesting of ( ) */
#define GRAMMAR_MAX_REPEAT    2048                /* m and n of {m,n} */
#define GRAMMAR_MAX_STACKS    256                 /* parse stacks alive at once */
#define GRAMMAR_MAX_EXPAND    8192                /* expansion steps for one byte */
#define GRAMMAR_MAX_PASS_WORK 24000000            /* steps of one walk over the vocabulary (~50 ms) */

typedef struct grammar grammar;

/* Compile GBNF text. NULL with a message in err (naming the line and what
 * is wrong) on a syntax error, an undefined rule, no `root`, left recursion
 * or a limit passed. */
grammar *grammar_parse(const char *text, size_t len, char *err, size_t errcap);
void grammar_free(grammar *g);

/* ---- matching ---- */
typedef struct gmatch gmatch;

gmatch *gmatch_new(const grammar *g);
void gmatch_free(gmatch *m);
/* Advance over bytes for good. 0, or -1 when the grammar refuses them (the state is then unchanged). */
int gmatch_feed(gmatch *m, const char *s, size_t n);
/* 1 when the bytes could be fed now (the state is left as it was). */
int gmatch_try(gmatch *m, const char *s, size_t n);
/* 1 when the text so far is a whole sentence of the grammar. */
int gmatch_accepting(const gmatch *m);
/* 1 when it is whole and nothing more may follow. */
int gmatch_finished(const gmatch *m);

/* Every vocabulary piece at once: pieces sorted by their bytes, so that
 * pieces sharing a prefix share its matching, and a refused prefix skips
 * every piece that begins with it. */
typedef struct {
    int n;               /* pieces that are not empty */
    const int32_t *ids;  /* (n) token ids in byte order of their pieces */
    const uint32_t *lcp; /* (n) bytes piece i shares with piece i-1 (lcp[0] = 0) */
    const char *text;    /* piece of token t: text[off[t]..off[t+1]) */
    const uint32_t *off; /* (n_vocab + 1) */
} gmatch_vocab;
/* allowed[t] = 1 for each token whose piece may follow now (others 0; empty pieces 0). Returns how many,
 * or -1 when the walk would take more than GRAMMAR_MAX_PASS_WORK steps (a hostile grammar that keeps
 * hundreds of stacks alive over most bytes; JSON schemas take under 3 million on a 49k vocabulary). */
int gmatch_allowed(gmatch *m, const gmatch_vocab *v, uint8_t *allowed, int n_vocab);

/* ---- JSON Schema to grammar (srv_schema.c) ---- */
/* A converter collects the rules of one or more schemas into one grammar
 * text. Supported: type (one or a list) object/array/string/number/integer/
 * boolean/null, properties with required (properties not listed are never
 * generated, as with additionalProperties false; an object without
 * properties takes any members, or members of the additionalProperties
 * schema), items, minItems, maxItems, minLength, maxLength, enum, const,
 * anyOf, oneOf (only with branches that cannot match the same value), allOf
 * of one schema, $ref to #, #/$defs/NAME or #/definitions/NAME, and the
 * annotations (title, description, default, examples, $schema, $id,
 * $comment, deprecated, readOnly, writeOnly). Any other keyword would change
 * what is valid: it is refused, named, with where it is. Strings never use
 * \u escapes (the model writes the characters themselves), numbers have at
 * most 16 digits before and after the point and a two-digit exponent,
 * whitespace between tokens is one space or a newline and up to 20 spaces
 * or tabs (a model cannot pad forever), and the value starts at once: the
 * text is always JSON that jansson and Python both read. */
typedef struct gschema gschema;
gschema *gschema_new(void);
void gschema_free(gschema *c);
/* Add the rules of schema; its root rule is called name. 0, or -1 with a message in err. */
int gschema_add(gschema *c, const json_t *schema, const char *name, char *err, size_t errcap);
/* Append raw grammar text (the root rule that uses the added names; the
 * shared rules json-ws, json-value, json-string, ... may be used). */
void gschema_put(gschema *c, const char *text);
/* GBNF literal of s[0..n): "..." with quotes, backslashes and control bytes escaped. */
void gschema_put_literal(gschema *c, const char *s, size_t n);
/* The same as a new string (st_malloc'd). */
char *grammar_literal(const char *s, size_t n);
/* The whole grammar text (st_malloc'd), the shared rules appended; c is freed. */
char *gschema_finish(gschema *c, size_t *len);
/* The grammar text of one JSON value valid against schema (st_malloc'd), or NULL with err. */
char *grammar_from_schema(const json_t *schema, size_t *len, char *err, size_t errcap);
/* The grammar text of any JSON object (response_format json_object); static. */
const char *grammar_json_object(void);

#endif
