/* `strata device`: the GPUs this binary sees and whether it can use them.
 *
 *   --list-devices   index, name, architecture, VRAM total/free, SMs, and
 *                    whether this build has code for the card
 *   --selftest       for one GPU (--gpu N, default 0): the engine's memory
 *                    plan of a model (-m FILE, --max-context N) against free
 *                    VRAM (FITS, FITS with experts in host RAM, or DOES NOT
 *                    FIT),
 *                    host<->device bandwidth over pinned memory, and every
 *                    backend op run once on tiny shapes against the CPU
 *                    backend (pass/fail per op, NMSE and its bound)
 *
 * Exit code 0 when everything asked for is fine, 1 when a card is refused,
 * the model does not fit or an op fails; a build without a GPU backend says
 * so and exits 1.
 */
#include <stdio.h>
#include <string.h>

#include "cli/args.h"
#include "cli/cli.h"
#include "core/log.h"

#ifdef STRATA_HAVE_GPU
#include "backend/backend_check.h"
#include "backend/cuda/backend_cuda.h"
#include "backend/cuda/device.h"
#include "engine/engine.h"
#include "engine/engine_offload.h"
#include "engine/engine_place.h"
#include "engine/kv_cache.h"
#include "model/model.h"
#endif

#define USAGE "strata device --list-devices | --selftest [--gpu N] [-m FILE] [--max-context N] [--ram-budget GiB]"

static double g_ram_budget; /* --ram-budget: the plan's host tiers (GiB, 0: no limit) */

#ifdef STRATA_HAVE_GPU
static double gib(size_t b) { return (double)b / (1024.0 * 1024.0 * 1024.0); }

static int list_devices(void) {
    int n = gpu_device_count();
    printf("build: code for %s\n", gpu_build_archs());
    if (n == 0) {
        printf("no GPU found (no driver, or no device visible)\n");
        return 0;
    }
    printf("%-3s %-34s %-8s %10s %10s %5s %5s  %s\n", "gpu", "name", "arch", "VRAM GiB", "free GiB", "SMs", "warp",
           "code in this build");
    for (int i = 0; i < n; i++) {
        gpu_device_info d;
        if (gpu_device_info_get(i, &d) != 0) {
            printf("%-3d (cannot be queried: %s)\n", i, st_error_get());
            continue;
        }
        printf("%-3d %-34.34s %-8s %10.1f %10.1f %5d %5d  %s\n", i, d.name, d.arch, gib(d.vram_total), gib(d.vram_free),
               d.n_sm, d.warp_size, gpu_code_name(d.code));
    }
    return 0;
}

static void print_plan_line(void *ctx, const char *text) {
    (void)ctx;
    printf("  %s\n", text);
}

/* The engine's own memory plan (engine_offload.h) against this GPU's free
 * memory less the default reserve: every weight on the GPU, or a MoE
 * model's experts partly in host RAM, or it does not fit. */
static int memory_plan(const char *path, int max_ctx, const gpu_device_info *d) {
    model *m = model_load(path);
    if (!m) {
        fprintf(stderr, "strata device: %s\n", st_error_get());
        return 1;
    }
    const model_hparams *hp = &m->hp;
    const int n_ctx = max_ctx > 0 ? max_ctx : (hp->n_ctx_train < 4096 ? hp->n_ctx_train : 4096);
    engine_params ep = engine_defaults();
    ep.ram_budget = g_ram_budget;
    const size_t dense = engine_weight_bytes(m, NULL);
    const size_t budget = engine_device_budget(&ep, d->vram_free);
    printf("memory plan for %s (context %d, f16 KV) on GPU %d: %.3f GiB free, less the 512 MiB reserve:\n", path, n_ctx,
           d->index, gib(d->vram_free));
    int rc = 0;
    if (hp->n_expert) {
        expert_plan_in in;
        expert_plan plan;
        if (engine_plan_memory(&ep, m, n_ctx, 512, budget, &in, &plan) != 0) {
            printf("  DOES NOT FIT: %s\n", st_error_get());
            rc = 1;
        } else {
            expert_plan_describe(&plan, &in, print_plan_line, NULL);
            printf("  %s\n", plan.all_resident ? "FITS" : "FITS with experts in host RAM");
            expert_plan_free(&plan);
        }
    } else {
        const size_t kv = kv_cache_bytes(hp, n_ctx, ST_KV_F16), scratch = engine_scratch_bytes(hp, 512);
        const size_t total = dense + kv + scratch;
        printf("  weights %.3f GiB + KV %.3f GiB + scratch %.3f GiB = %.3f GiB of %.3f GiB: %s\n", gib(dense), gib(kv),
               gib(scratch), gib(total), gib(budget), total <= budget ? "FITS" : "DOES NOT FIT");
        rc = total <= budget ? 0 : 1;
    }
    model_free(m);
    return rc;
}

static void print_check(void *ctx, const bcheck_result *r) {
    (void)ctx;
    printf("  %-4s %-10s nmse %.2e (bound %.0e)  %s\n", r->pass ? "pass" : "FAIL", r->op, r->nmse, r->bound, r->what);
}

static int selftest(int dev, const char *model_path, int max_ctx) {
    if (gpu_device_check(dev) != 0) {
        fprintf(stderr, "strata device: %s\n", st_error_get());
        return 1;
    }
    gpu_device_info d;
    gpu_device_info_get(dev, &d);
    printf("GPU %d: %s, %s, %d SMs, %.1f GiB (%.1f free); build has code for %s (%s)\n", dev, d.name, d.arch, d.n_sm,
           gib(d.vram_total), gib(d.vram_free), gpu_build_archs(), gpu_code_name(d.code));
    int rc = 0;
    if (model_path) rc |= memory_plan(model_path, max_ctx, &d);
    double h2d = 0, d2h = 0;
    if (gpu_measure_bandwidth(dev, (size_t)256 << 20, 8, &h2d, &d2h) != 0) {
        fprintf(stderr, "strata device: %s\n", st_error_get());
        return 1;
    }
    /* PCIe 5.0 x16 carries 63 GB/s per direction at most: more means the timing is wrong */
    const double link_max = 63.0;
    int sane = h2d > 0.1 && d2h > 0.1 && h2d < link_max && d2h < link_max;
    printf("pinned copies of 256 MiB (median of 8): host->device %.1f GB/s, device->host %.1f GB/s (%s: below the "
           "PCIe 5.0 x16 maximum of %.0f GB/s)\n",
           h2d, d2h, sane ? "sane" : "NOT SANE", link_max);
    if (!sane) rc = 1;
    st_backend *cpu = backend_cpu_create(0), *gpu = backend_cuda_create(dev);
    if (!gpu) {
        fprintf(stderr, "strata device: %s\n", st_error_get());
        cpu->destroy(cpu);
        return 1;
    }
    printf("ops on tiny shapes against the CPU backend:\n");
    int fails = backend_check_ops(cpu, gpu, 0, 1, print_check, NULL);
    printf("selftest: %s (%d op check%s failed)\n", fails ? "FAILED" : "all ops pass", fails, fails == 1 ? "" : "s");
    gpu->destroy(gpu);
    cpu->destroy(cpu);
    return rc | (fails != 0);
}
#endif

int cmd_device(int argc, char **argv) {
    args_t a = {"device", USAGE, argc, argv, 1, 0};
    int list = 0, self = 0, dev = 0;
    long long n, max_ctx = 0;
    const char *model_path = NULL, *v;
    for (; a.i < argc;) {
        int r;
        if (args_is_help(&a)) {
            printf("usage: %s\n", USAGE);
            return 0;
        }
        if (!strcmp(argv[a.i], "--list-devices")) {
            list = 1;
            a.i++;
        } else if (!strcmp(argv[a.i], "--selftest")) {
            self = 1;
            a.i++;
        } else if ((r = args_value(&a, "--gpu", &v))) {
            if (r < 0 || args_int(&a, "--gpu", v, 0, 255, &n)) return 2;
            dev = (int)n;
        } else if ((r = args_value(&a, "-m", &v)) || (r = args_value(&a, "--model", &v))) {
            if (r < 0) return 2;
            model_path = v;
        } else if ((r = args_value(&a, "--max-context", &v))) {
            if (r < 0 || args_int(&a, "--max-context", v, 1, 1 << 24, &max_ctx)) return 2;
        } else if ((r = args_value(&a, "--ram-budget", &v))) {
            if (r < 0 || args_double(&a, "--ram-budget", v, &g_ram_budget)) return 2;
            if (!(g_ram_budget > 0 && g_ram_budget < 1 << 20))
                return cli_usage_error("device", USAGE, "invalid value '%s' for --ram-budget (GiB, above 0)", v);
        } else {
            return args_unknown(&a);
        }
    }
    if (!list && !self) return cli_usage_error("device", USAGE, "say --list-devices or --selftest");
#ifdef STRATA_HAVE_GPU
    int rc = 0;
    if (list) rc |= list_devices();
    if (self) rc |= selftest(dev, model_path, (int)max_ctx);
    return rc;
#else
    (void)dev;
    (void)model_path;
    fprintf(stderr, "strata device: this build has no GPU backend (configure with -DSTRATA_CUDA=ON)\n");
    return 1;
#endif
}
