/* Shared engine options (engine_opts.h). */
#include "cli/engine_opts.h"
#include "cli/cli.h"

#include <stdio.h>
#include <string.h>

#include "core/log.h"
#include "engine/split_local.h"

int engine_opts_parse(args_t *a, engine_params *p) {
    const char *v;
    long long n;
    int r;
    if ((r = args_value(a, "-m", &v)) || (r = args_value(a, "--model", &v))) {
        if (r > 0) p->model_path = v;
        return r;
    }
    if ((r = args_value(a, "-c", &v)) || (r = args_value(a, "--ctx", &v))) {
        if (r < 0 || args_int(a, "--ctx", v, 1, 1 << 24, &n)) return -1;
        p->n_ctx = (int)n;
        return 1;
    }
    if ((r = args_value(a, "-t", &v)) || (r = args_value(a, "--threads", &v))) {
        if (r < 0 || args_int(a, "--threads", v, 1, 1024, &n)) return -1;
        p->n_threads = (int)n;
        return 1;
    }
    if ((r = args_value(a, "--prefill", &v))) {
        if (r > 0 && !strcmp(v, "auto")) {
            p->n_ubatch = 0; /* engine_prefill_chunk */
            return 1;
        }
        if (r < 0 || args_int(a, "--prefill", v, 1, 65536, &n)) return -1;
        p->n_ubatch = (int)n;
        return 1;
    }
    if ((r = args_value(a, "--gpu", &v))) { /* run every op on this GPU (CUDA/HIP builds) */
        if (r < 0 || args_int(a, "--gpu", v, 0, 255, &n)) return -1;
        p->gpu = (int)n;
        return 1;
    }
    /* the memory plan of a MoE model on the GPU (docs/offload.md) */
    if ((r = args_value(a, "--vram-budget", &v))) {
        double d;
        if (r < 0 || args_double(a, "--vram-budget", v, &d)) return -1;
        if (!(d > 0 && d < 1 << 20)) {
            a->err = cli_usage_error(a->cmd, a->usage, "invalid value '%s' for --vram-budget (GiB, above 0)", v);
            return -1;
        }
        p->vram_budget = d;
        return 1;
    }
    if ((r = args_value(a, "--vram-reserve", &v))) {
        if (r < 0 || args_int(a, "--vram-reserve", v, 0, 1 << 20, &n)) return -1;
        p->vram_reserve_mib = (int)n;
        return 1;
    }
    if ((r = args_value(a, "--expert-cache", &v))) {
        if (r < 0) return -1;
        if (!strcmp(v, "auto")) {
            p->expert_cache = -1;
            return 1;
        }
        if (args_int(a, "--expert-cache", v, 0, 1 << 30, &n)) return -1;
        p->expert_cache = (long)n;
        return 1;
    }
    if ((r = args_value(a, "--expert-profile", &v))) {
        if (r > 0) p->expert_profile = v;
        return r;
    }
    if ((r = args_value(a, "--pcie-frac", &v))) {
        double d;
        if (r < 0 || args_double(a, "--pcie-frac", v, &d)) return -1;
        if (!(d >= 0 && d <= 1)) {
            a->err = cli_usage_error(a->cmd, a->usage, "invalid value '%s' for --pcie-frac (0 to 1)", v);
            return -1;
        }
        p->pcie_frac = d;
        return 1;
    }
    if ((r = args_value(a, "--adapt-every", &v))) {
        if (r < 0 || args_int(a, "--adapt-every", v, 0, 1 << 20, &n)) return -1;
        p->adapt_every = (int)n;
        return 1;
    }
    if ((r = args_value(a, "--ram-budget", &v))) {
        double d;
        if (r < 0 || args_double(a, "--ram-budget", v, &d)) return -1;
        if (!(d > 0 && d < 1 << 20)) {
            a->err = cli_usage_error(a->cmd, a->usage, "invalid value '%s' for --ram-budget (GiB, above 0)", v);
            return -1;
        }
        p->ram_budget = d;
        return 1;
    }
    if (!strcmp(a->argv[a->i], "--mmap-experts")) { /* the same as --pin-experts 0 */
        p->no_pin = 1;
        a->i++;
        return 1;
    }
    if ((r = args_value(a, "--pin-experts", &v))) {
        if (r < 0 || args_int(a, "--pin-experts", v, 0, 1, &n)) return -1;
        p->no_pin = !n;
        return 1;
    }
    if ((r = args_value(a, "--draft", &v))) {
        if (r < 0) return -1;
        if (strcmp(v, "ngram") && strcmp(v, "mtp") && strcmp(v, "none")) {
            a->err = cli_usage_error(a->cmd, a->usage, "invalid value '%s' for --draft (ngram, mtp or none)", v);
            return -1;
        }
        p->draft_mtp = !strcmp(v, "mtp"); /* the model's multi-token prediction block (engine_mtp.c) */
        p->draft_n = !strcmp(v, "none") ? 0 : p->draft_n > 0 ? p->draft_n : ENGINE_DRAFT_N_DEFAULT;
        return 1;
    }
    if ((r = args_value(a, "--draft-n", &v))) {
        if (r < 0 || args_int(a, "--draft-n", v, 1, 64, &n)) return -1;
        p->draft_n = (int)n; /* implies --draft ngram unless --draft mtp says */
        return 1;
    }
    if ((r = args_value(a, "--layer-split", &v))) {
        if (r < 0) return -1;
        for (const char *c = v; *c; c++)
            if ((*c < '0' || *c > '9') && *c != ',') {
                a->err = cli_usage_error(a->cmd, a->usage,
                                         "invalid value '%s' for --layer-split (layer counts per rank: N,M,...)", v);
                return -1;
            }
        p->layer_split = v; /* checked against the ranks and the layers at load (split_layer_range) */
        return 1;
    }
    if ((r = args_value(a, "--devices", &v))) {
        if (r < 0) return -1;
        int devs[SPLIT_MAX_DEVICES];
        if (split_parse_devices(v, devs, SPLIT_MAX_DEVICES) < 0) {
            a->err = cli_usage_error(a->cmd, a->usage, "%s", st_error_get());
            return -1;
        }
        p->devices = v; /* one rank per entry, layers split between them (split_local.h) */
        return 1;
    }
    if ((r = args_value(a, "--pipeline-windows", &v))) {
        if (r < 0 || args_int(a, "--pipeline-windows", v, 1, 64, &n)) return -1;
        p->pipeline_windows = (int)n; /* under a layer split (forward.h) */
        return 1;
    }
    if ((r = args_value(a, "--kv", &v))) {
        if (r < 0) return -1;
        int t = kv_type_from_name(v);
        if (t < 0) {
            a->err = cli_usage_error(a->cmd, a->usage, "invalid value '%s' for --kv (f16 or int8)", v);
            return -1;
        }
        p->kv_type = (st_kv_type)t;
        return 1;
    }
    return 0;
}
