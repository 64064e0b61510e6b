/* `strata bench`: prompt and decode speed of a model, reported as tokens per
 * second and as GB/s of weights read per decoded token (the decode
 * roofline's numerator: dense weights + the active experts), like
 * llama-bench's pp/tg tests so the two can be compared on one file. On the
 * CPU each figure comes with its roofline, measured beside it: the read
 * bandwidth for decode, the cores' int8 multiply-add rate for prompts. */
#include <stdio.h>
#include <string.h>

#include "backend/cpu/cpu_bw.h"
#include "cli/cli.h"
#include "cli/engine_opts.h"
#include "core/alloc.h"
#include "core/log.h"
#include "core/timer.h"
#include "engine/moe_lanes.h"
#include "engine/split_local.h"
#include "quant/quant.h"

#define BENCH_USAGE "strata bench " ENGINE_OPTS_USAGE " [-p N] [-n N] [-d N] [-r REPS]"

/* Median of n values (sorts them in place; n is small). */
static int32_t random_token(uint64_t *rng, int n_vocab) {
    *rng = *rng * 6364136223846793005ull + 1442695040888963407ull;
    return (int32_t)((*rng >> 33) % (uint64_t)n_vocab);
}

static double median(double *v, int n) {
    for (int i = 1; i < n; i++)
        for (int j = i; j > 0 && v[j] < v[j - 1]; j--) {
            double x = v[j];
            v[j] = v[j - 1];
            v[j - 1] = x;
        }
    return v[n / 2];
}

int cmd_bench(int argc, char **argv) {
    args_t a = {.cmd = "bench", .usage = BENCH_USAGE, .argc = argc, .argv = argv, .i = 1};
    engine_params ep = engine_defaults();
    ep.model_path = STRATA_DEFAULT_MODEL;
    long long n_p = 512, n_g = 128, depth = 0, reps = 3;
    while (a.i < argc) {
        if (args_is_help(&a)) {
            printf("usage: %s\n\nReads a prompt of N random tokens (-p, default 512) and decodes N random tokens\n"
                   "(-n, default 128), REPS times (-r, default 3); prints the median tok/s and GB/s. With -d N\n"
                   "the decode starts after N tokens already in the cache (read once, not timed),\n"
                   "like llama-bench's depth.\n",
                   BENCH_USAGE);
            return 0;
        }
        int r = engine_opts_parse(&a, &ep);
        if (r > 0) continue;
        if (r < 0) return a.err;
        const char *v;
        if ((r = args_value(&a, "-p", &v))) {
            if (r < 0 || args_int(&a, "-p", v, 0, 1 << 20, &n_p)) return a.err;
        } else if ((r = args_value(&a, "-n", &v))) {
            if (r < 0 || args_int(&a, "-n", v, 0, 1 << 20, &n_g)) return a.err;
        } else if ((r = args_value(&a, "-d", &v))) {
            if (r < 0 || args_int(&a, "-d", v, 0, 1 << 24, &depth)) return a.err;
        } else if ((r = args_value(&a, "-r", &v))) {
            if (r < 0 || args_int(&a, "-r", v, 1, 100, &reps)) return a.err;
        } else return args_unknown(&a);
    }
    const long long n_fill = n_p > depth ? n_p : depth; /* random tokens: the prompt, or the depth */
    if (!ep.n_ctx) ep.n_ctx = (int)((n_p > depth + n_g ? n_p : depth + n_g) + 1); /* tg restarts at the depth */
    engine *e = engine_open(&ep);
    if (!e) {
        fprintf(stderr, "strata bench: %s\n", st_error_get());
        return 1;
    }
    if (n_p > e->n_ctx || depth + n_g > e->n_ctx) {
        fprintf(stderr, "strata bench: -p %lld / -d %lld + -n %lld is beyond the context of %d\n", n_p, depth, n_g,
                e->n_ctx);
        engine_close(e);
        return 1;
    }
    int nv = e->m->hp.n_vocab;
    int32_t *toks = st_malloc((size_t)(n_fill + 1) * sizeof(int32_t));
    uint64_t rng = 1234;
    double *pp = st_calloc((size_t)reps, sizeof(double)), *tg = st_calloc((size_t)reps, sizeof(double));
    /* expert lanes (a MoE model partly off the GPU): what decode moved per lane */
    const moe_lane_stats *ls = moe_lanes_stats(e->be);
    moe_lane_stats dec = {0}, pro = {0};
    double dec_s = 0;
    for (long long r = 0; r < reps; r++) {
        /* fresh random tokens for every repetition and every decode step, as
         * llama-bench does: a learning expert cache must not be measured on
         * a prompt it has seen or on one token fed back */
        for (long long i = 0; i <= n_fill; i++) toks[i] = random_token(&rng, nv);
        e->n_past = 0;
        const moe_lane_stats pre = ls ? *ls : (moe_lane_stats){0};
        int64_t t0 = st_now_ns();
        if (n_p) engine_eval(e, toks, (int)n_p);
        int64_t t1 = st_now_ns();
        if (ls) moe_lane_stats_add(&pro, ls, &pre);
        if (depth && (r == 0 || n_p)) { /* the prompt run overwrote the cache: fill it again */
            e->n_past = 0;
            engine_eval(e, toks, (int)depth);
        }
        e->n_past = (int)depth; /* decode from the depth (0: the start, like llama-bench's tg test) */
        int32_t t = toks[n_fill];
        const moe_lane_stats before = ls ? *ls : (moe_lane_stats){0};
        int64_t t2 = st_now_ns();
        for (long long i = 0; i < n_g; i++) {
            engine_eval(e, &t, 1);
            t = random_token(&rng, nv);
        }
        int64_t t3 = st_now_ns();
        if (ls) {
            moe_lane_stats_add(&dec, ls, &before);
            dec_s += (double)(t3 - t2) / 1e9;
        }
        pp[r] = n_p ? n_p / ((double)(t1 - t0) / 1e9) : 0;
        tg[r] = n_g ? n_g / ((double)(t3 - t2) / 1e9) : 0;
    }
    double bytes = model_active_bytes_per_token(e->m);
    printf("model: %s (%s, %.1f MB active weights per token)\n", ep.model_path, model_arch_name(e->m->hp.arch),
           bytes / 1e6);
    double pp_med = median(pp, (int)reps), tg_med = median(tg, (int)reps);
    int on_cpu = ep.gpu < 0; /* every rank of a split too */
    int devs[SPLIT_MAX_DEVICES];
    for (int r = 0, n = ep.devices ? split_parse_devices(ep.devices, devs, SPLIT_MAX_DEVICES) : 0; r < n; r++)
        on_cpu &= devs[r] < 0;
    /* on the CPU, each figure beside its roofline, measured now with the same threads */
    st_pool *pool = on_cpu && (n_p || n_g) ? st_pool_init(ep.n_threads) : NULL;
    const int nt = pool ? st_pool_n_threads(pool) : 0;
    if (n_p && pool) {
        const double rate = cpu_int8_rate(pool), gmacs = pp_med * model_layer_macs_per_token(e->m) / 1e9;
        printf("pp%lld: %.2f tok/s, %.1f GMAC/s in the layers' weight products", n_p, pp_med, gmacs);
        if (rate > 0)
            printf(" = %.0f%% of the %.1f GMAC/s that %d %s %s int8 units do here\n", 100 * gmacs / (rate / 1e9),
                   rate / 1e9, nt, nt == 1 ? "thread's" : "threads'", qt_isa_name(qt_cpu_isa()));
        else printf(" (no SIMD int8 path on this CPU)\n");
    } else if (n_p) printf("pp%lld: %.2f tok/s\n", n_p, pp_med);
    if (n_g && pool) {
        /* the roofline of CPU decode: what this machine's threads read per second */
        const size_t bw_bytes = (size_t)512 << 20;
        uint8_t *buf = cpu_bw_buffer(pool, bw_bytes);
        const double bw = cpu_read_bandwidth(pool, buf, bw_bytes, 2);
        printf("tg%lld%s: %.2f tok/s, %.2f GB/s of weights = %.0f%% of the %.1f GB/s that %d thread%s read here\n", n_g,
               depth ? " @ depth" : "", tg_med, tg_med * bytes / 1e9, 100 * tg_med * bytes / 1e9 / bw, bw, nt,
               nt == 1 ? "" : "s");
        st_free(buf);
    } else if (n_g) {
        printf("tg%lld%s: %.2f tok/s, %.2f GB/s of weights\n", n_g, depth ? " @ depth" : "", tg_med,
               tg_med * bytes / 1e9);
    }
    if (pool) st_pool_free(pool);
    if (ls && n_p && pro.layers) {
        const double pairs = (double)(pro.pairs_dev + pro.pairs_cpu + pro.pairs_pcie);
        printf("experts in the prompt: %.1f distinct per layer and chunk (of %d); %.1f%% of pairs from the GPU cache, "
               "%.1f%% CPU lane, %.1f%% PCIe; PCIe moved %.2f GB per prompt\n",
               (double)pro.experts / (double)pro.layers, e->m->hp.n_expert, 100 * (double)pro.pairs_dev / pairs,
               100 * (double)pro.pairs_cpu / pairs, 100 * (double)pro.pairs_pcie / pairs,
               (double)pro.bytes_pcie / (double)reps / 1e9);
    }
    if (ls && n_g) {
        const double n = (double)n_g * (double)reps, pairs = (double)(dec.pairs_dev + dec.pairs_cpu + dec.pairs_pcie);
        printf("experts in decode: %.1f%% of pairs from the GPU cache, %.1f%% CPU lane, %.1f%% PCIe; per token "
               "the CPU lane read %.1f MB (%.1f GB/s over the decode time), PCIe moved %.1f MB (%.1f GB/s); %llu "
               "cache slots changed hands\n",
               100 * (double)dec.pairs_dev / pairs, 100 * (double)dec.pairs_cpu / pairs,
               100 * (double)dec.pairs_pcie / pairs, (double)dec.bytes_cpu / n / 1e6,
               (double)dec.bytes_cpu / dec_s / 1e9, (double)dec.bytes_pcie / n / 1e6,
               (double)dec.bytes_pcie / dec_s / 1e9, (unsigned long long)dec.swaps);
        const double us = 1e-3 / n; /* ns summed over the decode -> us per token */
        printf(
            "decode time per token: %.0f us, of which in the layers the host routes %.0f us: waiting for the routing "
            "%.0f (the device's work before it included), queueing the device's pairs %.0f (the hidden rows to "
            "the host %.0f), CPU lane %.0f, handing its output back %.0f\n",
            dec_s * 1e6 / n, (double)dec.ns_call * us, (double)dec.ns_route * us, (double)dec.ns_queue * us,
            (double)dec.ns_hx * us, (double)dec.ns_cpu * us, (double)dec.ns_join * us);
        const double tune = moe_lanes_pcie_scale(e->be);
        if (tune > 0) printf("the split tuned while decoding: the PCIe lane's modelled cost x%.2f\n", tune);
        if (dec.bytes_ssd)
            printf("SSD tier in decode: %.2f MB read per token, %.2f GB/s while reading (%.2f GB/s over the decode "
                   "time); the disk's sequential rate is in the start log\n",
                   (double)dec.bytes_ssd / n / 1e6, (double)dec.bytes_ssd / (double)dec.ns_ssd,
                   (double)dec.bytes_ssd / dec_s / 1e9);
    }
    if (depth)
        printf("depth: %lld tokens in the cache before decoding (%s KV)\n", depth,
               ep.kv_type == ST_KV_INT8 ? "int8" : "f16");
    st_free(pp);
    st_free(tg);
    st_free(toks);
    engine_close(e);
    return 0;
}
