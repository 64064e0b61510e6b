/* libFuzzer target for the constraint engine (src/server/srv_grammar.h).
 *
 * An input is a grammar (or, when it starts with '{', a JSON Schema that is
 * converted first), then a NUL, then text. The grammar is compiled; if it is
 * accepted, the text is fed to a matcher byte by byte and in pieces, and a
 * small vocabulary is walked, so ASan/UBSan see every step the matcher takes
 * on hostile grammars. Promises checked (a trap when one breaks): a refusal
 * carries a message; a converted schema compiles unless a limit or a $ref
 * loop refused it; feeding bytes one at a time and all at once agree; the
 * vocabulary walk agrees with token-by-token checks.
 */
#include <jansson.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "server/srv_grammar.h"

#define REQUIRE(c)                                                                                                     \
    do {                                                                                                               \
        if (!(c)) __builtin_trap();                                                                                    \
    } while (0)

static const char *const PIECES[] = {"{", "\"", "a", "ab", "abc",  " ",    "\n",       "}",  "1",    "12", "-", ",",
                                     ":", "[",  "]", "x",  "\xc3", "\xa9", "\xc3\xa9", "\\", "true", "<",  "b"};
enum { NP = sizeof PIECES / sizeof PIECES[0] };

static void walk(const grammar *g, const uint8_t *text, size_t n) {
    gmatch *one = gmatch_new(g), *all = gmatch_new(g);
    size_t fed = 0;
    for (size_t i = 0; i < n && i < 512; i++) {
        if (gmatch_feed(one, (const char *)text + i, 1) != 0) break;
        fed++;
    }
    int whole = gmatch_try(all, (const char *)text, fed);
    REQUIRE(whole == 1);
    REQUIRE(gmatch_feed(all, (const char *)text, fed) == 0);
    REQUIRE(gmatch_accepting(one) == gmatch_accepting(all) && gmatch_finished(one) == gmatch_finished(all));
    /* the vocabulary walk against single checks, pieces sorted by bytes */
    static int32_t ids[NP];
    static uint32_t lcp[NP], off[NP + 1];
    static char buf[256];
    static int ready;
    if (!ready) {
        size_t len = 0;
        for (int i = 0; i < NP; i++) {
            off[i] = (uint32_t)len;
            memcpy(buf + len, PIECES[i], strlen(PIECES[i]));
            len += strlen(PIECES[i]);
            ids[i] = i;
        }
        off[NP] = (uint32_t)len;
        for (int i = 1; i < NP; i++)
            for (int j = i; j > 0 && strcmp(PIECES[ids[j - 1]], PIECES[ids[j]]) > 0; j--) {
                int32_t t = ids[j];
                ids[j] = ids[j - 1];
                ids[j - 1] = t;
            }
        for (int i = 1; i < NP; i++) {
            const char *a = PIECES[ids[i - 1]], *b = PIECES[ids[i]];
            while (a[lcp[i]] && a[lcp[i]] == b[lcp[i]]) lcp[i]++;
        }
        ready = 1;
    }
    gmatch_vocab v = {.n = NP, .ids = ids, .lcp = lcp, .text = buf, .off = off};
    uint8_t allowed[NP];
    gmatch_allowed(one, &v, allowed, NP);
    for (int t = 0; t < NP; t++) REQUIRE(allowed[t] == gmatch_try(one, PIECES[t], strlen(PIECES[t])));
    gmatch_free(one);
    gmatch_free(all);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    const uint8_t *nul = memchr(data, 0, size);
    size_t glen = nul ? (size_t)(nul - data) : size;
    const uint8_t *text = nul ? nul + 1 : data + size;
    size_t tlen = nul ? size - glen - 1 : 0;
    char err[512];
    char *conv = NULL;
    const char *gtext = (const char *)data;
    if (glen && data[0] == '{') { /* a JSON Schema */
        json_t *schema = json_loadb((const char *)data, glen, 0, NULL);
        if (!schema) return 0;
        size_t len = 0;
        conv = grammar_from_schema(schema, &len, err, sizeof err);
        json_decref(schema);
        if (!conv) {
            REQUIRE(err[0]);
            return 0;
        }
        gtext = conv;
        glen = len;
    }
    grammar *g = grammar_parse(gtext, glen, err, sizeof err);
    if (!g) {
        REQUIRE(err[0]);
        /* a converted schema compiles, unless it is too large or its $refs loop */
        REQUIRE(!conv || strstr(err, "large") || strstr(err, "more than") || strstr(err, "left recursion"));
    } else {
        walk(g, text, tlen);
        grammar_free(g);
    }
    free(conv);
    return 0;
}
