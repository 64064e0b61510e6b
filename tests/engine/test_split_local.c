/* The layer split inside one process (--devices, engine/split_local.h)
 * against the whole model on one CPU backend: every logit of every step
 * EQUAL, for one sequence (a prompt read in chunks, then greedy tokens) and
 * for a batched step of three sequences, on SmolLM2 (dense, tied output)
 * and a tiny qwen3moe synth; two ranks (even by bytes) and three (by
 * --layer-split, SmolLM2); prompts in pipelined windows (--pipeline-windows:
 * the first rank runs window w + 1 while the next runs w) against a
 * reference read in chunks of the window's size; the expert lanes per rank
 * (its own plan and cache over its own layers) against the whole model's
 * lanes with the same experts cached per layer. Each rank's products are the same kernels on the same rows,
 * so the bits must match: a wrong range, a stale hop or a lost command
 * shows as a difference. Also the refusals: a split that does not sum to
 * the layers, a device list it cannot parse, a rank that cannot open (a
 * GPU rank in a CPU build, or a split of a hybrid model), each a clear
 * error and no hang.
 *
 * usage: test_split_local SMOLLM2.gguf TMPDIR */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/alloc.h"
#include "core/log.h"
#include "engine/engine.h"
#include "engine/moe_lanes.h"
#include "engine/split_local.h"
#include "model/synth.h"

#include "../common/logits.h"
#include "../common/split_run.h"

static int fails;

static engine *open_with(const char *path, const char *devices, const char *split, int n_ubatch, int windows,
                         long cache) {
    engine_params p = {0};
    p.model_path = path;
    p.gpu = -1;
    p.expert_cache = cache; /* >= 0 on the CPU: the expert lanes, a second CPU backend playing the device */
    p.pcie_frac = -1;
    p.n_ctx = 256;
    p.n_threads = 2;
    p.n_ubatch = n_ubatch; /* the prompts read in several chunks */
    p.devices = devices;
    p.layer_split = split;
    p.pipeline_windows = windows;
    engine *e = engine_open(&p);
    if (!e) printf("  open %s (--devices %s): %s\n", path, devices ? devices : "-", st_error_get());
    return e;
}

/* windows > 1: the split reads 16-token chunks in that many pipelined
 * windows, the reference in chunks of the window's size (the same rows per
 * product, so the same bits). */
static void check_equal(const char *path, const char *devices, const char *split, int windows, long cache) {
    int devs[SPLIT_MAX_DEVICES];
    const int n_ranks = split_parse_devices(devices, devs, SPLIT_MAX_DEVICES);
    engine *a = open_with(path, NULL, NULL, 16 / windows, 0, cache < 0 ? -1 : cache * n_ranks);
    ST_ASSERT(a);
    const int nv = a->m->hp.n_vocab;
    const size_t n = (size_t)2 * N_SEQ * (N_GEN + 1) * nv;
    float *la = st_malloc(n * sizeof(float)), *lb = st_malloc(n * sizeof(float));
    split_run(a, la);
    engine_close(a);
    engine *b = open_with(path, devices, split, 16, windows, cache);
    if (!b) {
        fails++;
        st_free(la), st_free(lb);
        return;
    }
    if (cache >= 0) { /* rank 0's cache: `cache` experts of each of its layers, none of another rank's */
        char cells[4096];
        int nl = 0, nx = 0, bad = 0;
        const int n_cells = moe_lanes_cache_map(b->be, cells, (int)sizeof cells, &nl, &nx);
        for (int il = 0; il < nl && n_cells > 0; il++) {
            int held = 0;
            for (int x = 0; x < nx; x++) held += cells[il * nx + x] >= '4';
            bad += held != (il >= b->il0 && il < b->il1 ? cache : 0);
        }
        printf("%-4s rank 0's expert cache over layers %d..%d: %s\n", n_cells > 0 && !bad ? "ok" : "FAIL", b->il0,
               b->il1 - 1,
               n_cells > 0 ? (bad ? "slots outside its own layers, or missing" : "its layers only") : "no lanes");
        fails += n_cells <= 0 || bad;
    }
    split_run(b, lb);
    engine_close(b);
    size_t diff = 0, first = n;
    for (size_t i = 0; i < n; i++)
        if (memcmp(&la[i], &lb[i], sizeof(float))) diff++, first = first < i ? first : i;
    printf("%-4s %s, --devices %s%s%s, %d window(s)%s: %zu of %zu logits differ", diff ? "FAIL" : "ok", path, devices,
           split ? " --layer-split " : "", split ? split : "", windows, cache >= 0 ? ", expert lanes" : "", diff, n);
    if (diff)
        printf(" (first: %s pass, sequence %zu, step %zu: %g vs %g)", first / (n / 2) ? "batched" : "alone",
               first / ((size_t)(N_GEN + 1) * nv) % N_SEQ, first / nv % (N_GEN + 1), la[first], lb[first]);
    printf("\n");
    fails += diff != 0;
    st_free(la), st_free(lb);
}

/* engine_open must fail with an error naming `want`. */
static void check_refused(const char *path, const char *devices, const char *split, const char *want) {
    engine *e = open_with(path, devices, split, 16, 1, -1);
    const int ok = !e && strstr(st_error_get(), want);
    printf("%-4s refused: --devices %s%s%s -> \"%s\"\n", ok ? "ok" : "FAIL", devices, split ? " --layer-split " : "",
           split ? split : "", e ? "(opened)" : st_error_get());
    if (e) engine_close(e);
    fails += !ok;
}

static int make_synth(const char *arch, const char *path) {
    synth_hparams hp;
    if (synth_preset(arch, "tiny", &hp) != 0) return -1;
    synth_opts o;
    synth_opts_init(&o, &hp);
    return synth_write(&o, path);
}

int main(int argc, char **argv) {
    setvbuf(stdout, NULL, _IOLBF, 0);
    if (argc < 3) {
        fprintf(stderr, "usage: test_split_local SMOLLM2.gguf TMPDIR\n");
        return 2;
    }
    char moe[1024], hyb[1024];
    snprintf(moe, sizeof moe, "%s/split-moe-tiny.gguf", argv[2]);
    snprintf(hyb, sizeof hyb, "%s/split-hybrid-tiny.gguf", argv[2]);
    if (make_synth("qwen3moe", moe) != 0 || make_synth("qwen35moe", hyb) != 0) {
        printf("FAIL: synth: %s\n", st_error_get());
        return 1;
    }
    FILE *f = fopen(argv[1], "rb");
    if (f) {
        fclose(f);
        check_equal(argv[1], "cpu,cpu", NULL, 1, -1);
        check_equal(argv[1], "cpu,cpu,cpu", "3,20,7", 1, -1);
        check_equal(argv[1], "cpu,cpu", "15,15", 4, -1); /* pipelined windows of 4 rows */
        check_refused(argv[1], "cpu,cpu", "10,10", "summing to 20");
    } else printf("SKIPPED: %s not found (scripts/fetch-models.sh)\n", argv[1]);
    check_equal(moe, "cpu,cpu", NULL, 1, -1);
    check_equal(moe, "cpu,cpu", NULL, 2, -1);
    /* each rank's memory plan and expert lanes over its own layers: 4 of 8 experts cached per layer, as the
     * whole model's plan with 8 slots gives each of its 2 layers */
    check_equal(moe, "cpu,cpu", NULL, 1, 4);
    check_refused(moe, "cpu,x", NULL, "comma-separated list");
    check_refused(moe, "cpu,cpu,cpu", NULL, "each rank needs"); /* 2 layers */
    check_refused(moe, "cpu,3", NULL, "rank 1");
    check_refused(hyb, "cpu,cpu", NULL, "recurrent state");
    remove(moe), remove(hyb);
    printf("%d failed\n", fails);
    return fails ? 1 : 0;
}
