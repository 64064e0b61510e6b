/* `strata launch`: look at the machine, make a plan, serve with it.
 *
 * The plan picks the device (the GPU with the most free VRAM when this build
 * has a GPU backend and finds one, else the CPU; with --devices, a layer
 * split over those, each rank's layers, weights and KV printed), the model (the default real
 * model unless -m names one), the context and the KV type that fit the memory
 * there (weights + KV cache per slot + scratch against MemAvailable or free
 * VRAM), prints it, and without --plan starts `strata serve` with it.
 *
 * Every value comes from the switch table (core/switches.h): a flag on the
 * command line or a STRATA_* variable the user set is never overridden by the
 * --config file or by the plan; the plan only fills what nobody set, and the
 * start log names each non-default value and who set it.
 *
 * --config FILE is one JSON object whose keys are switch names: flags with or
 * without their dashes ("ctx", "--ctx", "model", "-m") and STRATA_* variables;
 * values are strings, whole numbers or booleans (true = "1"). docs/launch.md. */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"
#include "cli/engine_opts.h"
#include "core/alloc.h"
#include "core/log.h"
#include "core/switches.h"
#include "core/threadpool.h"
#include "engine/engine.h"
#include "engine/engine_offload.h"
#include "engine/kv_cache.h"
#include "engine/split.h"
#include "engine/split_local.h"
#include "model/model.h"
#include "quant/quant.h"

#ifdef STRATA_HAVE_GPU
#include "backend/cuda/device.h"
#endif

#define LAUNCH_USAGE "strata launch [--plan] [--config FILE] " ENGINE_OPTS_USAGE " [serve options: strata serve --help]"

/* The plan aims for this much context when nobody set --ctx (and the model was trained for it). */
#define PLAN_CTX_TARGET 8192
#define PLAN_CTX_MIN    512
/* Only this fraction of free memory is planned for: the OS, the HTTP side and allocator slack keep the rest. */
#define PLAN_MEM_FRAC 0.90

static double gib(size_t b) { return (double)b / (1024.0 * 1024.0 * 1024.0); }

/* Validate a value for a flag entry the way serve's parser will, so a bad
 * value is refused here with the place it came from. */
static int check_value(const st_switch_def *d, const char *v, const char *where) {
    if (!strcmp(d->name, "--kv") && kv_type_from_name(v) < 0) {
        fprintf(stderr, "strata launch: %s: invalid value '%s' for --kv (f16 or int8)\n", where, v);
        return -1;
    }
    if (!strcmp(d->name, "--prefill") && !strcmp(v, "auto")) return 0;
    if (d->lo || d->hi) {
        char *end;
        long long n = strtoll(v, &end, 10);
        if (!*v || *end || n < d->lo || n > d->hi) {
            fprintf(stderr, "strata launch: %s: invalid value '%s' for %s (a whole number in [%lld, %lld])\n", where, v,
                    d->name, d->lo, d->hi);
            return -1;
        }
    }
    return 0;
}

/* Apply the config file: every key a switch, set with source "config" unless
 * a user's value outranks it (then a note says so). Returns the parsed root
 * (its strings are the values now in the table) or NULL after printing the error. */
static json_t *apply_config(const char *path) {
    json_error_t jerr;
    json_t *root = json_load_file(path, JSON_REJECT_DUPLICATES, &jerr);
    if (!root) {
        if (jerr.line < 1) /* the file could not be read: jansson's text says why */
            fprintf(stderr, "strata launch: config %s: %s\n", path, jerr.text);
        else
            fprintf(stderr, "strata launch: config %s: %s (line %d, column %d)\n", path, jerr.text, jerr.line,
                    jerr.column);
        return NULL;
    }
    if (!json_is_object(root)) {
        fprintf(stderr, "strata launch: config %s: the file must hold one JSON object of switches\n", path);
        json_decref(root);
        return NULL;
    }
    const char *key;
    json_t *val;
    json_object_foreach(root, key, val) {
        const st_switch_def *d = st_switch_find(key);
        if (!d) {
            fprintf(stderr,
                    "strata launch: config %s: unknown key '%s' (keys are switch names: strata launch --help)\n", path,
                    key);
            json_decref(root);
            return NULL;
        }
        char num[32];
        const char *v;
        if (json_is_string(val)) v = json_string_value(val);
        else if (json_is_integer(val)) {
            snprintf(num, sizeof num, "%lld", (long long)json_integer_value(val));
            v = strdup(num); /* lives as long as the process, like the table's other values */
            ST_ASSERT(v);
        } else if (json_is_boolean(val)) v = json_is_true(val) ? "1" : "0";
        else {
            fprintf(stderr, "strata launch: config %s: '%s' must be a string, a whole number or a boolean\n", path,
                    key);
            json_decref(root);
            return NULL;
        }
        char where[600];
        snprintf(where, sizeof where, "config %s, key '%s'", path, key);
        if (check_value(d, v, where) != 0) {
            json_decref(root);
            return NULL;
        }
        if (st_switch_set(d->name, v, ST_SW_CONFIG) == 0)
            printf("note: config's %s=%s is not used: %s was set by %s\n", d->name, d->secret ? "***" : v, d->name,
                   st_switch_src_name(st_switch_source(d->name)));
    }
    return root;
}

typedef struct {
    int gpu;          /* -1: CPU */
    int offload;      /* a MoE model on a GPU too small for all of it: experts in host RAM */
    char device[400]; /* in words */
    size_t budget;    /* bytes the plan may use on that device */
    char budget_note[200];
} device_pick;

/* need_weights: every weight; need_min: what must be on a GPU at the least
 * (a MoE model: its dense part and one layer of experts; else every weight).
 * cpu: the CPU without looking for a GPU (a split of CPU ranks). */
static void pick_device(device_pick *p, size_t need_weights, size_t need_min, const engine_params *ep, int cpu) {
    size_t avail, total;
    st_meminfo(&avail, &total);
    long cores = st_cpu_count();
    p->gpu = -1;
    p->offload = 0;
    p->budget = (size_t)((double)avail * PLAN_MEM_FRAC);
    snprintf(p->device, sizeof p->device, "CPU (%ld cores, %s kernels)", cores, qt_isa_name(qt_cpu_isa()));
    snprintf(p->budget_note, sizeof p->budget_note, "RAM available %.2f GiB of %.2f GiB (/proc/meminfo)", gib(avail),
             gib(total));
    if (cpu) return;
#ifdef STRATA_HAVE_GPU
    const char *want = st_switch_get("--gpu");
    int n = gpu_device_count(), best = -1;
    size_t best_free = 0;
    gpu_device_info d, bd;
    memset(&bd, 0, sizeof bd);
    for (int i = 0; i < n; i++) {
        if (want && atoi(want) != i) continue;
        if (gpu_device_info_get(i, &d) != 0 || d.code == GPU_CODE_NONE) continue;
        if (best < 0 || d.vram_free > best_free) best = i, best_free = d.vram_free, bd = d;
    }
    /* the engine's own budget rule (--vram-budget, else free less --vram-reserve) when experts stay in RAM */
    const size_t off_budget = best >= 0 ? engine_device_budget(ep, best_free) : 0;
    const double room = ep->vram_budget > 0 ? (double)off_budget : (double)best_free * PLAN_MEM_FRAC;
    const int fits = best >= 0 && (double)need_weights < room;
    if (best >= 0 && (fits || want || (need_min < need_weights && need_min < off_budget))) {
        p->gpu = best;
        p->offload = !fits && need_min < need_weights;
        p->budget = p->offload || ep->vram_budget > 0 ? off_budget : (size_t)((double)best_free * PLAN_MEM_FRAC);
        snprintf(p->device, sizeof p->device, "GPU %d: %.200s (%s, %d SMs)", best, bd.name, bd.arch, bd.n_sm);
        snprintf(p->budget_note, sizeof p->budget_note, "VRAM free %.2f GiB of %.2f GiB%s", gib(bd.vram_free),
                 gib(bd.vram_total),
                 ep->vram_budget > 0 ? ", --vram-budget"
                 : !p->offload       ? ""
                                     : ", less --vram-reserve");
    } else if (n > 0 && best < 0)
        printf("note: %d GPU%s found, none this build can run on (strata device --list-devices)\n", n,
               n == 1 ? "" : "s");
    else if (best >= 0 && need_min < need_weights)
        printf("note: even the dense part and one layer of experts (%.2f GiB of the %.2f GiB of weights) do not fit "
               "GPU %d's %.2f GiB%s: planning for the CPU\n",
               gib(need_min), gib(need_weights), best, gib(off_budget),
               ep->vram_budget > 0 ? " of --vram-budget" : " (free VRAM less --vram-reserve)");
    else if (best >= 0)
        printf("note: the weights (%.2f GiB) do not fit GPU %d's free VRAM: planning for the CPU\n", gib(need_weights),
               best);
    else printf("note: this build has a GPU backend but found no GPU\n");
#else
    (void)need_weights, (void)need_min, (void)ep;
    strncat(p->device, "; this build has no GPU backend", sizeof p->device - strlen(p->device) - 1);
#endif
}

/* A slot's KV bytes at context c, with the MTP block's attention layer when it drafts. */
static size_t plan_kv_bytes(const model_hparams *hp, int c, st_kv_type k, int mtp) {
    return kv_cache_bytes(hp, c, k) + (mtp ? kv_cache_mtp_bytes(hp, c, k) : 0);
}

static int get_int(const char *name, int fallback) {
    const char *v = st_switch_get(name);
    return v ? atoi(v) : fallback;
}

static void print_plan_line(void *ctx, const char *text) {
    (void)ctx;
    printf("            %s\n", text);
}

/* Who set a flag, for the plan lines: "(flag)", "(config)", or the plan's reason. */
static const char *src_word(const char *name, const char *planned) {
    st_switch_src s = st_switch_source(name);
    return s == ST_SW_DEFAULT ? planned : st_switch_src_name(s);
}

/* The split's lines: each rank's device, layers, weights and KV (every range checked before). */
static void print_split(const model *m, const char *devices, const int *devs, int n_ranks, int n_ctx, st_kv_type kv,
                        int slots) {
    const char *spec = st_switch_get("--layer-split"), *win = st_switch_get("--pipeline-windows");
    const char *thr = st_switch_get("--threads");
    printf("  split     %d ranks in this process (--devices %s, %s), layers %s (%s)\n", n_ranks, devices,
           st_switch_src_name(st_switch_source("--devices")), spec ? spec : "even by bytes of weights",
           spec ? st_switch_src_name(st_switch_source("--layer-split")) : "default");
    for (int r = 0; r < n_ranks; r++) {
        int il0, il1;
        ST_ASSERT(split_layer_range(m, spec, n_ranks, r, &il0, &il1) == 0);
        char dev[16];
        snprintf(dev, sizeof dev, devs[r] < 0 ? "cpu" : "GPU %d", devs[r]);
        printf("            rank %d  %-6s layers %d..%d%s: weights %.3f GiB, KV %.3f GiB\n", r, dev, il0, il1 - 1,
               il0 == 0 ? " (embedding, output head)" : "", gib(split_rank_bytes(m, il0, il1)),
               gib(kv_cache_range_bytes(&m->hp, n_ctx, kv, il0, il1) * (size_t)slots));
    }
    if (thr)
        printf("            threads: %s per CPU rank (%s)\n", thr, st_switch_src_name(st_switch_source("--threads")));
    else
        printf("            threads: %d per CPU rank (the %d cores split evenly)\n", split_rank_threads(n_ranks),
               st_cpu_count());
    printf("            pipelined windows: %s per prompt chunk (%s)\n", win ? win : "1",
           win ? st_switch_src_name(st_switch_source("--pipeline-windows")) : "default");
}

int cmd_launch(int argc, char **argv) {
    args_t a = {.cmd = "launch", .usage = LAUNCH_USAGE, .argc = argc, .argv = argv, .i = 1};
    const char *config = NULL;
    int plan_only = 0, n_table;
    const st_switch_def *table = st_switch_table(&n_table);
    while (a.i < a.argc) {
        if (args_is_help(&a)) {
            printf("usage: %s\n\n", LAUNCH_USAGE);
            printf("Plans device, context, KV type and memory from what this machine has, prints the plan,\n"
                   "and (without --plan) serves with it. --config FILE: a JSON object of switches.\n"
                   "A value you set (flag or environment) is never overridden: flag > env > config > default.\n\n"
                   "switches:\n");
            for (int i = 0; i < n_table; i++)
                printf("  %-16s %-5s %s\n  %-16s       default: %s\n", table[i].name,
                       table[i].short_name ? table[i].short_name : "", table[i].effect, "", table[i].def_note);
            printf("\nSee docs/launch.md.\n");
            return 0;
        }
        const char *v;
        int r;
        if (!strcmp(a.argv[a.i], "--plan")) {
            plan_only = 1;
            a.i++;
            continue;
        }
        if ((r = args_value(&a, "--config", &v))) {
            if (r < 0) return a.err;
            config = v;
            continue;
        }
        int hit = 0;
        for (int i = 0; i < n_table && !hit; i++) {
            const st_switch_def *d = &table[i];
            if (d->kind != ST_SW_KIND_FLAG) continue;
            if (!(r = args_value(&a, d->name, &v)) && !(d->short_name && (r = args_value(&a, d->short_name, &v))))
                continue;
            if (r < 0) return a.err;
            if (check_value(d, v, "command line") != 0) return 2;
            st_switch_set(d->name, v, ST_SW_FLAG);
            hit = 1;
        }
        if (!hit) return args_unknown(&a);
    }
    json_t *cfg = NULL;
    if (config && !(cfg = apply_config(config))) return 2;

    /* the model: what it needs is known before any device is picked */
    const char *path = st_switch_get("--model");
    if (!path) path = STRATA_DEFAULT_MODEL;
    model *m = model_load(path);
    if (!m) {
        fprintf(stderr, "strata launch: %s\n", st_error_get());
        json_decref(cfg);
        return 1;
    }
    const model_hparams *hp = &m->hp;
    size_t weights = 0;
    for (int64_t i = 0; i < gguf_n_tensors(m->file); i++) weights += gguf_tensor_at(m->file, i)->size;
    int slots = get_int("--slots", 1), chunk = get_int("--prefill", 512); /* "auto": 0, decided below */
    if (chunk > 512 || chunk <= 0) chunk = 512;
    size_t scratch = engine_scratch_bytes(hp, chunk);
    /* the switches the engine's memory plan reads */
    engine_params ep = engine_defaults();
    const char *sv;
    if ((sv = st_switch_get("--vram-budget"))) ep.vram_budget = atof(sv);
    if ((sv = st_switch_get("--ram-budget"))) ep.ram_budget = atof(sv);
    ep.vram_reserve_mib = get_int("--vram-reserve", 512);
    if ((sv = st_switch_get("--expert-cache")) && strcmp(sv, "auto")) ep.expert_cache = atol(sv);
    ep.expert_profile = st_switch_get("--expert-profile");
    ep.n_seq = slots; /* as the server's scheduler opens it (slot 0 is the engine's own sequence) */
    /* --draft mtp: the block's weights and its cache layer are the engine's too (engine_plan_input) */
    ep.draft_mtp = (sv = st_switch_get("--draft")) && !strcmp(sv, "mtp") && m->mtp;
    /* a MoE model needs on the GPU at the least its dense part and one layer of experts (the streaming buffer) */
    expert_plan_in pin;
    engine_plan_input(&ep, m, 1, chunk, 0, &pin);
    const size_t dense = hp->n_expert ? pin.dense + (size_t)hp->n_expert * pin.expert : weights;

    /* --devices: a layer split in this process; what it cannot run is refused here, as the engine would */
    const char *devices = st_switch_get("--devices");
    int devs[SPLIT_MAX_DEVICES], n_ranks = 1;
    if (devices) {
        int gpu = st_switch_get("--gpu") != NULL;
        n_ranks = split_parse_devices(devices, devs, SPLIT_MAX_DEVICES);
        for (int r = 0; r < n_ranks; r++) gpu |= devs[r] >= 0;
        int il0, il1;
        if (gpu) /* each card's budget and placement: not planned yet */
            st_error_set("launch --plan plans CPU ranks only so far (serve and run take GPU ranks)");
        if (n_ranks < 0 || gpu || split_supported(hp, n_ranks, ep.ram_budget > 0) != 0 ||
            split_layer_range(m, st_switch_get("--layer-split"), n_ranks, 0, &il0, &il1) != 0) {
            if (n_ranks < 0) fprintf(stderr, "strata launch: %s\n", st_error_get()); /* it names the list */
            else fprintf(stderr, "strata launch: --devices %s: %s\n", devices, st_error_get());
            model_free(m);
            json_decref(cfg);
            return 2;
        }
        scratch *= (size_t)n_ranks; /* each rank's engine has its own */
    }

    device_pick dev;
    pick_device(&dev, weights, dense + scratch, &ep, devices != NULL);
    const size_t on_device = dev.offload ? dense : weights; /* the expert cache takes what the KV leaves */

    /* context and KV type: the user's values stand; the plan fills the rest,
     * the largest context (up to the target) that fits, f16 before int8 */
    const char *ctx_set = st_switch_get("--ctx"), *kv_set = st_switch_get("--kv");
    int ctx_target = hp->n_ctx_train < PLAN_CTX_TARGET ? hp->n_ctx_train : PLAN_CTX_TARGET;
    int n_ctx = ctx_set ? atoi(ctx_set) : ctx_target;
    st_kv_type kv = kv_set ? (st_kv_type)kv_type_from_name(kv_set) : ST_KV_F16;
    size_t avail_kv = dev.budget > on_device + scratch ? dev.budget - on_device - scratch : 0;
    int fits = 0;
    int c_min = ctx_target < PLAN_CTX_MIN ? ctx_target : PLAN_CTX_MIN;
    for (int c = n_ctx; !fits && c >= (ctx_set ? n_ctx : c_min); c /= 2) {
        for (int t = 0; t < 2 && !fits; t++) {
            st_kv_type k = kv_set ? kv : (t == 0 ? ST_KV_F16 : ST_KV_INT8);
            if (plan_kv_bytes(hp, c, k, ep.draft_mtp) * (size_t)slots <= avail_kv) fits = 1, n_ctx = c, kv = k;
        }
        if (ctx_set) break;
    }
    if (!fits && !ctx_set) n_ctx = c_min;
    size_t kv_bytes = plan_kv_bytes(hp, n_ctx, kv, ep.draft_mtp) * (size_t)slots;
    size_t total = on_device + kv_bytes + scratch;
    /* experts beyond VRAM: the engine's own plan at this context, printed as it will run */
    expert_plan xplan = {0};
    expert_plan_in xin;
    int xrc = 0;
    if (dev.offload) {
        ep.kv_type = kv;
        ep.n_ubatch = get_int("--prefill", 0); /* serve's chunk: --prefill N, else as the engine picks it */
        chunk = engine_prefill_chunk(&ep, m, n_ctx, dev.budget);
        xrc = engine_plan_memory(&ep, m, n_ctx, chunk, dev.budget, &xin, &xplan);
        if (xrc == 0) total = xplan.used;
    }
    char gpu_txt[16];
    snprintf(gpu_txt, sizeof gpu_txt, "%d", dev.gpu);

    printf("strata launch plan:\n");
    printf("  device    %s\n", dev.device);
    printf("  model     %s (%s, %d layers, trained context %d%s)\n", path, model_arch_name(hp->arch), hp->n_layer,
           hp->n_ctx_train, hp->n_expert ? ", MoE" : "");
    printf("  weights   %.3f GiB (%zu bytes)\n", gib(weights), weights);
    const size_t state = kv_cache_state_bytes(hp); /* hybrids: a fixed recurrent state per slot */
    char state_txt[64] = "";
    if (state) snprintf(state_txt, sizeof state_txt, " + %zu bytes of recurrent state", state);
    printf("  KV cache  %s, %zu bytes per token of context%s, x %d context x %d slot%s = %.3f GiB (%zu bytes)\n",
           kv == ST_KV_F16 ? "f16" : "int8", plan_kv_bytes(hp, 1, kv, ep.draft_mtp) - state, state_txt, n_ctx, slots,
           slots == 1 ? "" : "s", gib(kv_bytes), kv_bytes);
    printf("  context   %d (%s)\n", n_ctx,
           src_word("--ctx", "planned: the largest up to min(trained, 8192) that fits"));
    printf("  kv type   %s (%s)\n", kv == ST_KV_F16 ? "f16" : "int8", src_word("--kv", "planned"));
    if (dev.offload) scratch = engine_scratch_bytes(hp, chunk);
    char ranks_txt[32] = "";
    if (n_ranks > 1) snprintf(ranks_txt, sizeof ranks_txt, ", one each for %d ranks", n_ranks);
    printf("  scratch   %.3f GiB (prompt chunks of %d tokens%s, %s)\n", gib(scratch), chunk, ranks_txt,
           src_word("--prefill", chunk > 512 ? "planned: experts are streamed, a longer chunk streams each once for "
                                               "more tokens"
                                             : "planned"));
    if (dev.offload && xrc == 0) {
        printf("  experts   more than the GPU holds: an expert cache on it, the rest in host RAM\n");
        expert_plan_describe(&xplan, &xin, print_plan_line, NULL);
    } else if (dev.offload) {
        printf("  experts   %s\n", st_error_get());
    }
    expert_plan_free(&xplan);
    if (devices) print_split(m, devices, devs, n_ranks, n_ctx, kv, slots);
    printf("  memory    %.3f GiB planned of %.3f GiB usable; %s -> %s\n", gib(total), gib(dev.budget), dev.budget_note,
           total <= dev.budget && xrc == 0 ? "FITS" : "DOES NOT FIT");
    if (total > dev.budget)
        printf("note: %s; the values you set are kept (weights are mapped from the file, so the CPU may still run)\n",
               ctx_set || kv_set ? "your --ctx/--kv do not fit" : "even the smallest plan does not fit");
    char sw[4096];
    int n_sw = st_switch_describe(sw, sizeof sw);
    printf("  switches  %s\n", n_sw ? "(non-default, and who set them)" : "all at their defaults");
    for (char *line = sw, *nl; n_sw && (nl = strchr(line, '\n')); line = nl + 1) {
        *nl = 0;
        printf("            %s\n", line);
    }

    /* the serve command line: every flag the table holds a value for */
    char ctx_txt[16];
    snprintf(ctx_txt, sizeof ctx_txt, "%d", n_ctx);
    const char *sargv[160]; /* "serve", 4 planned flags and every table flag, each with its value, and NULL */
    ST_ASSERT(2 * n_table + 12 <= (int)(sizeof sargv / sizeof sargv[0]));
    int sargc = 0;
    sargv[sargc++] = "serve";
    sargv[sargc++] = "-m", sargv[sargc++] = path;
    sargv[sargc++] = "--ctx", sargv[sargc++] = ctx_txt;
    sargv[sargc++] = "--kv", sargv[sargc++] = kv == ST_KV_F16 ? "f16" : "int8";
    if (dev.gpu >= 0) sargv[sargc++] = "--gpu", sargv[sargc++] = gpu_txt;
    char budget_txt[32];
    if (dev.offload && !st_switch_get("--vram-budget")) { /* the engine then plans with the budget printed here */
        snprintf(budget_txt, sizeof budget_txt, "%.3f", (double)dev.budget / (double)(1ull << 30));
        sargv[sargc++] = "--vram-budget", sargv[sargc++] = budget_txt;
    }
    for (int i = 0; i < n_table; i++) {
        const st_switch_def *d = &table[i];
        if (d->kind != ST_SW_KIND_FLAG || !strcmp(d->name, "--model") || !strcmp(d->name, "--ctx") ||
            !strcmp(d->name, "--kv") || !strcmp(d->name, "--gpu"))
            continue;
        const char *v = st_switch_get(d->name);
        if (!v || (d->env_alias && st_switch_source(d->name) == ST_SW_ENV)) continue; /* serve reads the env itself */
        sargv[sargc++] = d->name, sargv[sargc++] = v;
    }
    printf("  command   strata");
    for (int i = 0; i < sargc; i++) printf(" %s", i > 0 && !strcmp(sargv[i - 1], "--api-key") ? "***" : sargv[i]);
    printf("\n");
    fflush(stdout);
    model_free(m);
    if (plan_only) {
        json_decref(cfg);
        return 0;
    }
    st_switch_log_start("launch");
    sargv[sargc] = NULL;
    int rc = cmd_serve(sargc, (char **)sargv);
    json_decref(cfg);
    return rc;
}
