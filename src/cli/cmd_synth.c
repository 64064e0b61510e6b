/* `strata synth`: write a GGUF of an architecture preset with random but valid
 * weights (model/synth.h does the work). This file only turns arguments into
 * synth_opts: the preset first, then every override on top of it, so the
 * order of flags on the command line does not matter. */
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

#include "cli/args.h"
#include "cli/cli.h"
#include "core/log.h"
#include "core/timer.h"
#include "model/synth.h"
#include "quant/quant.h"

static const char USAGE[] =
    "strata synth [--arch qwen3moe|qwen35moe|qwen3next|glm4moe|deepseek2|gpt-oss] --preset P -o FILE [--type-default "
    "TYPE] "
    "[--type CLASS=TYPE ...] [--zipf S] [--attn-out-scale F] [--seed N] [--ctx N] [--layers N] [--experts N] "
    "[--experts-used K] "
    "[--expert-ff N] [--mtp] [--exact] [--quiet]";

static void help(void) {
    printf("usage: %s\n\n", USAGE);
    printf("Writes a GGUF with random but valid weights, loadable by llama.cpp and strata.\n\n"
           "  --arch A            architecture: qwen3moe (the default), the DeltaNet hybrids qwen35moe, qwen3next,\n"
           "                      glm4moe (GLM-4.5: sigmoid-routed experts, a leading dense layer),\n"
           "                      deepseek2 (DeepSeek V3: latent attention, group-limited routing)\n"
           "                      or gpt-oss (attention sinks, biased MXFP4 experts, a clamped SwiGLU)\n"
           "  --preset P          shapes: %s\n"
           "  -o FILE             output path\n"
           "  --type-default T    type of every weight matrix (default: a Q4_K_M-like mix:\n"
           "                      Q4_K, with Q6_K for attn_v, ffn_down_exps and output)\n"
           "  --type CLASS=T      type of one class, e.g. ffn_down_exps=Q8_0 (repeatable);\n"
           "                      norms and ffn_gate_inp default to F32\n"
           "  --zipf S            skew the router: expert popularity ~ rank^-S (default 0: uniform)\n"
           "  --attn-out-scale F  attn_output weights times F (default 1); 0.1 keeps a prompt chunk's\n"
           "                      routing spread over the experts as a trained model's is (random\n"
           "                      attention otherwise makes deeper layers' tokens choose alike)\n"
           "  --seed N            random seed (default 1); same seed, same file\n"
           "  --ctx N             context_length to record (default: the preset's)\n"
           "  --layers N, --experts N, --experts-used K, --expert-ff N   change the preset's shape\n"
           "                      (a row width that is not a whole number of blocks of the\n"
           "                      chosen type falls back to a 32-weight type, with a note)\n"
           "  --mtp               qwen35moe, qwen3next, deepseek2, glm4moe: add the multi-token prediction\n"
           "                      block (nextn tensors) after the layers, as llama.cpp's converter writes\n"
           "                      it (--draft mtp)\n"
           "  --exact             quantize every tensor from fresh Gaussians (slow on big presets)\n"
           "  --quiet             no progress line\n",
           synth_preset_list());
}

/* "CLASS=TYPE" -> o->class_type; usage errors name the bad part. */
static int parse_type_override(args_t *a, const char *s, synth_opts *o) {
    const char *eq = strchr(s, '=');
    if (!eq || eq == s || !eq[1]) {
        a->err = cli_usage_error(a->cmd, a->usage, "invalid --type '%s' (expected CLASS=TYPE)", s);
        return -1;
    }
    char cls[64];
    size_t n = (size_t)(eq - s) < sizeof cls - 1 ? (size_t)(eq - s) : sizeof cls - 1;
    memcpy(cls, s, n);
    cls[n] = 0;
    int c = synth_class_from_name(cls);
    if (c < 0) {
        a->err = cli_usage_error(a->cmd, a->usage, "%s", st_error_get());
        return -1;
    }
    int t = qt_from_name(eq + 1);
    if (t < 0) {
        a->err = cli_usage_error(a->cmd, a->usage, "unknown type '%s' in --type %s", eq + 1, s);
        return -1;
    }
    o->class_type[c] = t;
    return 0;
}

int cmd_synth(int argc, char **argv) {
    args_t a = {.cmd = "synth", .usage = USAGE, .argc = argc, .argv = argv, .i = 1};
    const char *arch = "qwen3moe", *preset = NULL, *out = NULL, *tdef = NULL, *v;
    const char *types[64];
    int n_types = 0, exact = 0, quiet = 0, mtp = 0;
    long long seed = 1, ctx = 0, layers = 0, experts = 0, used = 0, eff = 0;
    double zipf = 0, attn_scale = 1;
    while (a.i < argc) {
        int r; /* 1: matched with a value, -1: matched but the value is missing (error printed) */
#define OPT(name, var) ((r = args_value(&a, name, &var)) != 0)
        if (args_is_help(&a)) {
            help();
            return 0;
        }
        if (OPT("--arch", arch) || OPT("--preset", preset) || OPT("-o", out) || OPT("--output", out) ||
            OPT("--type-default", tdef)) {
        } else if (OPT("--type", v)) {
            if (r > 0 && n_types == (int)(sizeof types / sizeof types[0]))
                return cli_usage_error(a.cmd, USAGE, "too many --type options");
            if (r > 0) types[n_types++] = v;
        } else if (OPT("--zipf", v)) {
            if (r > 0 && args_double(&a, "--zipf", v, &zipf) == 0 && zipf < 0)
                a.err = cli_usage_error(a.cmd, USAGE, "invalid value '%s' for --zipf (must be >= 0)", v);
        } else if (OPT("--attn-out-scale", v)) {
            if (r > 0 && args_double(&a, "--attn-out-scale", v, &attn_scale) == 0 && !(attn_scale > 0))
                a.err = cli_usage_error(a.cmd, USAGE, "invalid value '%s' for --attn-out-scale (must be > 0)", v);
        } else if (OPT("--seed", v)) {
            if (r > 0) args_int(&a, "--seed", v, 0, (long long)9e18, &seed);
        } else if (OPT("--ctx", v)) {
            if (r > 0) args_int(&a, "--ctx", v, 1, 1 << 30, &ctx);
        } else if (OPT("--layers", v)) {
            if (r > 0) args_int(&a, "--layers", v, 1, 4096, &layers);
        } else if (OPT("--experts", v)) {
            if (r > 0) args_int(&a, "--experts", v, 1, 4096, &experts);
        } else if (OPT("--experts-used", v)) {
            if (r > 0) args_int(&a, "--experts-used", v, 1, 4096, &used);
        } else if (OPT("--expert-ff", v)) {
            if (r > 0) args_int(&a, "--expert-ff", v, 1, 1 << 20, &eff);
        } else if (!strcmp(argv[a.i], "--mtp")) {
            mtp = 1;
            a.i++;
        } else if (!strcmp(argv[a.i], "--exact")) {
            exact = 1;
            a.i++;
        } else if (!strcmp(argv[a.i], "--quiet") || !strcmp(argv[a.i], "-q")) {
            quiet = 1;
            a.i++;
        } else {
            return args_unknown(&a);
        }
#undef OPT
        if (a.err) return a.err;
    }
    if (!preset) return cli_usage_error(a.cmd, USAGE, "missing --preset");
    if (!out) return cli_usage_error(a.cmd, USAGE, "missing -o FILE");

    synth_hparams hp;
    if (synth_preset(arch, preset, &hp) != 0) return cli_usage_error(a.cmd, USAGE, "%s", st_error_get());
    if (ctx) hp.n_ctx = (int)ctx;
    if (layers) hp.n_layer = (int)layers;
    if (experts) hp.n_expert = (int)experts;
    if (used) hp.n_expert_used = (int)used;
    if (eff) hp.n_ff_exp = (int)eff;
    /* a cut to fewer layers than the dense lead keeps one MoE layer (deepseek-v3 has 3 dense ones) */
    if (layers && hp.n_dense_lead >= hp.n_layer) hp.n_dense_lead = hp.n_layer - 1;
    if (mtp && !synth_has_mtp(&hp))
        return cli_usage_error(
            a.cmd, USAGE, "--mtp: only qwen35moe, qwen3next, deepseek2 and glm4moe have the block (not %s)", hp.arch);
    hp.n_nextn = mtp;
    if (hp.n_expert_used > hp.n_expert)
        return cli_usage_error(a.cmd, USAGE, "--experts-used %d exceeds the %d experts", hp.n_expert_used, hp.n_expert);
    synth_opts o;
    synth_opts_init(&o, &hp);
    o.seed = (uint64_t)seed;
    o.zipf_s = zipf;
    o.attn_out_scale = (float)attn_scale;
    o.exact = exact;
    o.progress = !quiet;
    if (tdef) {
        o.type_default = qt_from_name(tdef);
        if (o.type_default < 0) return cli_usage_error(a.cmd, USAGE, "unknown type '%s' for --type-default", tdef);
    }
    for (int i = 0; i < n_types; i++)
        if (parse_type_override(&a, types[i], &o) != 0) return a.err;

    double t0 = st_now_s();
    if (synth_write(&o, out) != 0) {
        fprintf(stderr, "strata synth: %s\n", st_error_get());
        return 1;
    }
    struct stat st;
    double mb = stat(out, &st) == 0 ? (double)st.st_size / 1e6 : 0;
    if (!quiet)
        fprintf(stderr, "strata synth: wrote %s (%s, %d layers, %d experts top-%d, %.1f MB) in %.1f s\n", out,
                hp.preset, hp.n_layer, hp.n_expert, hp.n_expert_used, mb, st_now_s() - t0);
    return 0;
}
