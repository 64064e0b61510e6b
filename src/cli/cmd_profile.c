/* `strata profile`: how a MoE model routes a text. The routing counts per
 * (layer, expert) it writes are what --expert-profile reads to choose the
 * experts the GPU caches (docs/offload.md). The text is read in chunks of
 * --ctx tokens, each from an empty cache, as perplexity reads it; the engine
 * runs with no expert cached (--expert-cache 0), so that every layer routes
 * on the host, where the expert lanes count. On a CPU-only build the lanes
 * run with a second CPU backend in the GPU's place (slower, same counts).
 * The summary says how concentrated the routing is: the share of it that
 * the hottest 10%, 25% and 50% of the experts take, the hit rate a cache of
 * that size would have on this text. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"
#include "cli/engine_opts.h"
#include "core/alloc.h"
#include "core/log.h"
#include "core/timer.h"
#include "engine/engine_offload.h"
#include "engine/moe_lanes.h"

#define PROFILE_USAGE "strata profile " ENGINE_OPTS_USAGE " -f TEXTFILE -o OUT [--chunks N]"

static int cmp_desc(const void *a, const void *b) {
    const uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? 1 : x > y ? -1 : 0;
}

int cmd_profile(int argc, char **argv) {
    args_t a = {.cmd = "profile", .usage = PROFILE_USAGE, .argc = argc, .argv = argv, .i = 1};
    engine_params ep = engine_defaults();
    ep.model_path = STRATA_DEFAULT_MODEL;
    ep.n_ctx = 512;
    const char *path = NULL, *out = NULL;
    long long max_chunks = 0;
    while (a.i < argc) {
        if (args_is_help(&a)) {
            printf("usage: %s\n\nRouting counts per (layer, expert) of a MoE model on a text, read in chunks of\n"
                   "--ctx tokens (default 512), written to OUT for --expert-profile. Runs with no expert\n"
                   "cached, so that every layer routes on the host.\n",
                   PROFILE_USAGE);
            return 0;
        }
        int r = engine_opts_parse(&a, &ep);
        if (r > 0) continue;
        if (r < 0) return a.err;
        const char *v;
        if ((r = args_value(&a, "-f", &v))) {
            if (r < 0) return a.err;
            path = v;
        } else if ((r = args_value(&a, "-o", &v))) {
            if (r < 0) return a.err;
            out = v;
        } else if ((r = args_value(&a, "--chunks", &v))) {
            if (r < 0 || args_int(&a, "--chunks", v, 1, 1 << 30, &max_chunks)) return a.err;
        } else return args_unknown(&a);
    }
    if (!path) return cli_usage_error("profile", PROFILE_USAGE, "missing -f TEXTFILE");
    if (!out) return cli_usage_error("profile", PROFILE_USAGE, "missing -o OUT");
    /* a value the user set is never overridden: any --expert-cache but 0 is refused, "auto" too */
    int cache_set = 0;
    for (int i = 1; i < argc; i++)
        cache_set |= !strncmp(argv[i], "--expert-cache", 14) && (argv[i][14] == 0 || argv[i][14] == '=');
    if ((cache_set && ep.expert_cache != 0) || ep.expert_profile)
        return cli_usage_error(
            "profile", PROFILE_USAGE,
            "--expert-cache and --expert-profile do not apply: a profile runs with no expert cached");
    ep.expert_cache = 0;
    size_t len;
    char *text = cli_read_file(path, &len);
    if (!text) {
        fprintf(stderr, "strata profile: cannot read '%s'\n", path);
        return 1;
    }
    engine *e = engine_open(&ep);
    if (!e) {
        fprintf(stderr, "strata profile: %s\n", st_error_get());
        st_free(text);
        return 1;
    }
    const uint64_t *counts = moe_lanes_counts(e->be);
    if (!counts) {
        fprintf(stderr, "strata profile: %s is not a mixture-of-experts model\n", ep.model_path);
        st_free(text);
        engine_close(e);
        return 1;
    }
    int64_t n_tok = tokenizer_encode(e->tok, text, len, 1, 0, NULL, 0);
    int32_t *toks = n_tok > 0 ? st_malloc((size_t)n_tok * sizeof(int32_t)) : NULL;
    if (toks) tokenizer_encode(e->tok, text, len, 1, 0, toks, n_tok);
    st_free(text);
    const int n_ctx = e->n_ctx;
    int64_t n_chunks = (n_tok + n_ctx - 1) / n_ctx;
    if (max_chunks > 0 && n_chunks > max_chunks) n_chunks = max_chunks;
    if (n_chunks < 1) {
        fprintf(stderr, "strata profile: '%s' has no tokens\n", path);
        st_free(toks);
        engine_close(e);
        return 1;
    }
    const int64_t t0 = st_now_ns();
    int64_t done = 0;
    for (int64_t c = 0; c < n_chunks; c++) {
        const int64_t n = n_tok - c * n_ctx < n_ctx ? n_tok - c * n_ctx : n_ctx;
        model_forward(e->mc, e->kv->layers, toks + c * n_ctx, (int)n, 0, NULL, 0);
        done += n;
    }
    const double secs = (double)(st_now_ns() - t0) / 1e9;
    const model_hparams *hp = &e->m->hp;
    const long total = (long)hp->n_layer * hp->n_expert;
    int rc = expert_profile_save(out, counts, hp->n_layer, hp->n_expert);
    if (rc != 0) {
        fprintf(stderr, "strata profile: %s\n", st_error_get());
    } else {
        uint64_t *sorted = st_malloc((size_t)total * sizeof(uint64_t)), sum = 0;
        memcpy(sorted, counts, (size_t)total * sizeof(uint64_t));
        qsort(sorted, (size_t)total, sizeof *sorted, cmp_desc);
        for (long i = 0; i < total; i++) sum += sorted[i];
        printf("profile: %lld tokens in %lld chunks of up to %d (%.1f s), %d layers x %d experts, top-%d: %s\n",
               (long long)done, (long long)n_chunks, n_ctx, secs, hp->n_layer, hp->n_expert, hp->n_expert_used, out);
        const int pct[3] = {10, 25, 50};
        for (int k = 0; k < 3; k++) {
            const long n = total * pct[k] / 100;
            uint64_t part = 0;
            for (long i = 0; i < n; i++) part += sorted[i];
            printf("  the hottest %d%% of the experts (%ld) take %.1f%% of the routing\n", pct[k], n,
                   sum ? 100.0 * (double)part / (double)sum : 0.0);
        }
        st_free(sorted);
    }
    st_free(toks);
    engine_close(e);
    return rc == 0 ? 0 : 1;
}
