/* `strata tune`: measure cuBLASLt's algorithms for the engine's prompt-size
 * products on one GPU and write the table the engine reads at start
 * (backend/cuda/tune.h, docs/cuda.md "Tuned GEMM algorithms").
 *
 *   --gpu N     the card to measure (default 0); the table is keyed by its
 *               architecture and the cuBLASLt version
 *   -m FILE     the products of this model: every distinct (n_out, n_in) of
 *               its non-expert weight matrices; without it a built-in list of
 *               common shapes
 *   -o PATH     where to write (default $XDG_CACHE_HOME/strata/tune-smXY.tsv,
 *               else ~/.cache/strata/tune-smXY.tsv: the path the engine reads)
 *   -n LIST     prompt chunk token counts (default 512,128: the engine's
 *               default chunk and a shorter one)
 *   --algos N   heuristic candidates per shape (default 8)
 *   --reps N    timed batches per candidate, median kept (default 7)
 *
 * An existing table at the path for the same architecture and cuBLASLt
 * version keeps its other shapes (so tuning a second model adds to it); one
 * for another key is replaced, which is said.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/args.h"
#include "cli/cli.h"
#include "core/log.h"
#include "gguf/gguf.h"
#include "quant/blocks.h"

#ifdef STRATA_HAVE_GPU
#include "backend/cuda/device.h"
#include "backend/cuda/tune/tune.h"
#endif

#define USAGE    "strata tune [--gpu N] [-m FILE] [-o PATH] [-n LIST] [--algos N] [--reps N]"
#define MAX_TOKS 16

/* (n_out, n_in) of common models when no -m is given: Qwen3-30B-A3B's
 * attention (2048 wide, 32 x 128 query heads, 4 x 128 KV), Llama-3-8B's
 * (4096, 1024 KV, 14336 FFN), SmolLM2-135M's (576, 192 KV, 1536 FFN). */
static const int BUILTIN[][2] = {
    {4096, 2048},  {512, 2048}, {2048, 4096}, {4096, 4096}, {1024, 4096}, {14336, 4096},
    {4096, 14336}, {576, 576},  {192, 576},   {1536, 576},  {576, 1536},
};

/* Distinct (n_out, n_in) of the model's dense weight matrices into *out
 * (pairs); their count, or -1 with a message. */
static int model_shapes(const char *path, int **out) {
    gguf_file *f = gguf_open(path);
    if (!f) {
        fprintf(stderr, "strata tune: %s\n", st_error_get());
        return -1;
    }
    const int tied = gguf_find_tensor(f, "output.weight") == NULL; /* the embedding is then the output matrix */
    const int64_t nt = gguf_n_tensors(f);
    int *s = malloc((size_t)(nt + 1) * 2 * sizeof(int)), n = 0;
    if (!s) {
        gguf_close(f);
        fprintf(stderr, "strata tune: out of memory\n");
        return -1;
    }
    for (int64_t i = 0; i < nt; i++) {
        const gguf_tensor *t = gguf_tensor_at(f, i);
        /* 2-D only: expert tensors are 3-D; norms and biases 1-D */
        if (t->n_dims != 2 || (!strcmp(t->name, "token_embd.weight") && !tied)) continue;
        if (t->type == QT_F32) continue; /* F32 matrices go through f32 cuBLAS, not the bf16 product tuned here */
        if (t->ne[0] > 1 << 30 || t->ne[1] > 1 << 30) continue;
        const int n_out = (int)t->ne[1], n_in = (int)t->ne[0];
        int seen = 0;
        for (int k = 0; k < n && !seen; k++) seen = s[2 * k] == n_out && s[2 * k + 1] == n_in;
        if (!seen) s[2 * n] = n_out, s[2 * n + 1] = n_in, n++;
    }
    gguf_close(f);
    *out = s;
    return n;
}

/* "512,128" -> toks; count or -1 (usage error printed). */
static int parse_toks(args_t *a, const char *v, int *toks) {
    int n = 0;
    char buf[256];
    snprintf(buf, sizeof buf, "%s", v);
    for (char *save = NULL, *p = strtok_r(buf, ",", &save); p; p = strtok_r(NULL, ",", &save)) {
        long long x;
        if (n == MAX_TOKS) {
            cli_usage_error("tune", USAGE, "-n takes at most %d token counts", MAX_TOKS);
            return -1;
        }
        if (args_int(a, "-n", p, 1, 65536, &x)) return -1;
        toks[n++] = (int)x;
    }
    if (n == 0) {
        cli_usage_error("tune", USAGE, "-n needs token counts, e.g. 512,128");
        return -1;
    }
    return n;
}

#ifdef STRATA_HAVE_GPU
static int tune_main(int dev, const char *model_path, const char *out_path, const int *toks, int n_toks, int algos,
                     int reps) {
    if (gpu_device_check(dev) != 0) {
        fprintf(stderr, "strata tune: %s\n", st_error_get());
        return 1;
    }
    int arch = 0;
    uint64_t ver = 0;
    char name[256];
    if (cuda_tune_device_key(dev, &arch, &ver, name, sizeof name) != 0) {
        fprintf(stderr, "strata tune: %s\n", st_error_get());
        return 1;
    }
    char def[4096];
    if (!out_path) {
        if (tune_table_default_path(arch, def, sizeof def) != 0) {
            fprintf(stderr, "strata tune: %s\n", st_error_get());
            return 1;
        }
        out_path = def;
    }
    int *shapes = NULL, n_shapes;
    if (model_path) {
        if ((n_shapes = model_shapes(model_path, &shapes)) < 0) return 1;
        if (n_shapes == 0) {
            fprintf(stderr, "strata tune: %s has no dense bf16-path weight matrices to tune\n", model_path);
            free(shapes);
            return 1;
        }
    } else {
        n_shapes = (int)(sizeof BUILTIN / sizeof BUILTIN[0]);
        shapes = malloc(sizeof BUILTIN);
        memcpy(shapes, BUILTIN, sizeof BUILTIN);
    }

    tune_table t;
    const int had = tune_table_load(&t, out_path);
    char why[1024];
    if (had == 0 && tune_table_check(&t, out_path, dev, arch, ver, why, sizeof why) == 0) {
        printf("adding to %s (%d shapes there are kept unless measured again)\n", out_path, t.n);
        snprintf(t.gpu, sizeof t.gpu, "%.127s", name);
    } else {
        if (had == 0)
            printf("replacing %s: it was measured for sm_%d / cuBLASLt %llu\n", out_path, t.arch,
                   (unsigned long long)t.lt_version);
        else if (had < 0) printf("replacing %s: %s\n", out_path, st_error_get());
        tune_table_free(&t);
        tune_table_init(&t, arch, ver, name);
    }
    printf("GPU %d '%s', sm_%d, cuBLASLt %llu: %d shapes x %d token counts (%s), bf16 x bf16 -> f32\n", dev, name, arch,
           (unsigned long long)ver, n_shapes, n_toks, model_path ? model_path : "built-in list");
    printf("%7s x %6s x %4s\n", "n_out", "n_in", "n_tok");
    cuda_tune_params p = {dev, shapes, n_shapes, toks, n_toks, algos, reps, 0, stdout};
    int rc = cuda_tune_run(&p, &t);
    free(shapes);
    if (rc != 0) {
        fprintf(stderr, "strata tune: %s\n", st_error_get());
        tune_table_free(&t);
        return 1;
    }
    if (tune_table_write(&t, out_path) != 0) {
        fprintf(stderr, "strata tune: %s\n", st_error_get());
        tune_table_free(&t);
        return 1;
    }
    int n_lt = 0;
    for (int i = 0; i < t.n; i++) n_lt += t.e[i].path == TUNE_PATH_LT;
    printf("wrote %s: %d shapes, %d through cuBLASLt\n", out_path, t.n, n_lt);
    tune_table_free(&t);
    return 0;
}
#endif

int cmd_tune(int argc, char **argv) {
    args_t a = {"tune", USAGE, argc, argv, 1, 0};
    long long dev = 0, algos = 8, reps = 7;
    const char *model_path = NULL, *out_path = NULL, *v;
    int toks[MAX_TOKS] = {512, 128}, n_toks = 2;
    for (; a.i < argc;) {
        int r;
        if (args_is_help(&a)) {
            printf("usage: %s\n"
                   "  measure cuBLASLt's algorithms for the prompt-size products on one GPU and write the table\n"
                   "  the engine reads for that card's architecture (default ~/.cache/strata/tune-smXY.tsv)\n",
                   USAGE);
            return 0;
        }
        if ((r = args_value(&a, "--gpu", &v))) {
            if (r < 0 || args_int(&a, "--gpu", v, 0, 255, &dev)) return 2;
        } else if ((r = args_value(&a, "-m", &v)) || (r = args_value(&a, "--model", &v))) {
            if (r < 0) return 2;
            model_path = v;
        } else if ((r = args_value(&a, "-o", &v))) {
            if (r < 0) return 2;
            out_path = v;
        } else if ((r = args_value(&a, "-n", &v))) {
            if (r < 0 || (n_toks = parse_toks(&a, v, toks)) < 0) return 2;
        } else if ((r = args_value(&a, "--algos", &v))) {
            if (r < 0 || args_int(&a, "--algos", v, 1, 32, &algos)) return 2;
        } else if ((r = args_value(&a, "--reps", &v))) {
            if (r < 0 || args_int(&a, "--reps", v, 1, 64, &reps)) return 2;
        } else {
            return args_unknown(&a);
        }
    }
#ifdef STRATA_HAVE_GPU
    return tune_main((int)dev, model_path, out_path, toks, n_toks, (int)algos, (int)reps);
#else
    (void)model_path, (void)out_path, (void)model_shapes, (void)BUILTIN;
    fprintf(stderr, "strata tune: this build has no GPU backend (configure with -DSTRATA_CUDA=ON)\n");
    return 1;
#endif
}
