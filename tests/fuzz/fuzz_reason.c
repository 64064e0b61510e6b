/* libFuzzer target for the reasoning parser (src/server/srv_reason.c): the
 * first byte picks the format (think tags or harmony), whether the answer
 * starts inside <think> (or in the middle of its text) and whether harmony
 * calls are wanted; the second the
 * size of the pieces it is fed in; the rest is the model's text. Checked:
 * no crash or sanitizer report; pieces give exactly what the whole text
 * gives; think tags add nothing (reasoning + content never exceed the text);
 * and a text that cannot start a marker comes back as content byte for
 * byte, so an answer without reasoning is never touched. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "server/srv_reason.h"

typedef struct {
    char *r, *c;
    size_t nr, nc;
} out_t;

static void add(char **p, size_t *n, const char *t, size_t len) {
    *p = realloc(*p, *n + len + 1);
    if (!*p) abort();
    memcpy(*p + *n, t, len);
    *n += len;
}
static void o_r(void *ctx, const char *t, size_t n) {
    out_t *o = ctx;
    add(&o->r, &o->nr, t, n);
}
static void o_c(void *ctx, const char *t, size_t n) {
    out_t *o = ctx;
    add(&o->c, &o->nc, t, n);
}

static void run(reason_kind k, int open, int calls, const char *t, size_t n, size_t step, out_t *o) {
    static const reason_cb cb = {o_r, o_c};
    memset(o, 0, sizeof *o);
    reason_stream *rs = reason_stream_new(k, open, calls, &cb, o);
    for (size_t i = 0; i < n; i += step) reason_stream_feed(rs, t + i, n - i < step ? n - i : step);
    reason_stream_end(rs);
    reason_stream_free(rs);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 2) return 0;
    const reason_kind k = data[0] & 1 ? REASON_HARMONY : REASON_THINK;
    const int open = ((data[0] >> 1) & 3) % 3, calls = (data[0] >> 3) & 1; /* open 2: mid-reasoning (a prefill) */
    const size_t step = 1 + data[1] % 16;
    const char *t = (const char *)data + 2;
    const size_t n = size - 2;
    out_t whole, parts;
    run(k, open, calls, t, n, n ? n : 1, &whole);
    run(k, open, calls, t, n, step, &parts);
    if (whole.nr != parts.nr || whole.nc != parts.nc || (whole.nr && memcmp(whole.r, parts.r, whole.nr)) ||
        (whole.nc && memcmp(whole.c, parts.c, whole.nc)))
        abort();                                               /* pieces must not change the answer */
    if (k == REASON_THINK && whole.nr + whole.nc > n) abort(); /* think tags only remove */
    /* a text whose first byte starts no marker (after space, for think tags) is content, untouched */
    size_t lead = 0;
    while (lead < n && memchr(" \n\t\r", t[lead], 4)) lead++;
    int plain = k == REASON_THINK ? !open && lead < n && t[lead] != '<' : n > 0 && t[0] != '<' && t[0] != ' ';
    if (plain && (whole.nr || whole.nc != n || memcmp(whole.c, t, n))) abort();
    free(whole.r), free(whole.c), free(parts.r), free(parts.c);
    return 0;
}
