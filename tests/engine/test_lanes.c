/* The MoE seam and the expert lanes on the CPU: a synthetic qwen3moe model
 * run with its experts in several places gives the logits and greedy tokens
 * of the plain run.
 *
 * The lanes backend (engine/moe_lanes.c) only uses backend ops, so here the
 * "device" is a second CPU backend: its cached experts are copied into slot
 * slabs and addressed through the slot maps, the PCIe lane's experts are
 * copied into the staging slab, and the CPU lane computes the rest from the
 * model's host tensors. Every placement must give the plain run's logits
 * within float summation order (the lanes add their partial sums in another
 * order; bound below) and its greedy tokens, for a prompt chunk (many pairs
 * per expert) and for one-token decode steps.
 *
 * Also: the memory plan's arithmetic and its errors, a profile choosing the
 * hottest experts, the cost model with a fake slow lane on either side, the
 * lanes' pair counts adding up, and the tensor list (model_each_tensor)
 * covering every byte of the file's tensors (a tensor the list lacked would
 * be left off the device, or counted wrong by the plan).
 *
 * usage: test_lanes [DIR for the temporary model, default /tmp]
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/alloc.h"
#include "core/log.h"
#include "engine/engine.h"
#include "engine/engine_offload.h"
#include "engine/engine_place.h"
#include "engine/expert_plan.h"
#include "engine/moe_lanes.h"
#include "model/synth.h"

#include "../common/check.h"
#include "../common/lanes_run.h"
#include "../common/gpu.h"
#include "../common/logits.h"

#define N_PROMPT 12
#define N_GEN    16
#define BOUND    1e-4 /* of the largest |logit|: float summation order only */

static int g_gpu = -1; /* --gpu N: the device is that GPU */

static int g_adapt; /* --adapt-every of the next run */

/* The engine every run opens: this placement, a small context, 2 threads. */
static engine_params params(const char *path, long cache, double pcie_frac) {
    engine_params p = engine_defaults();
    p.model_path = path;
    p.gpu = g_gpu;
    p.n_ctx = 64;
    p.n_threads = 2;
    p.expert_cache = cache;
    p.pcie_frac = pcie_frac;
    p.adapt_every = g_adapt;
    return p;
}

static int run(const char *path, long cache, double pcie_frac, const char *profile, lanes_run_out *o,
               moe_lane_stats *stats) {
    engine_params p = params(path, cache, pcie_frac);
    p.expert_profile = profile;
    const int nv = lanes_run(&p, N_PROMPT, N_GEN, o);
    if (nv < 0) return -1;
    if (stats) *stats = o->stats;
    if (g_gpu < 0) CHECK((cache >= 0) == o->lanes, "cache %ld: lanes %s", cache, o->lanes ? "on" : "off");
    else
        CHECK((cache >= 0 && cache < o->n_layer * o->n_expert) == o->lanes, "cache %ld: lanes %s", cache,
              o->lanes ? "on" : "off");
    return nv;
}

/* Three sequences decoded together (engine_decode_batch: one step of 3 rows
 * per token, each sequence's prompt of its own length first): the logits of
 * every step of every sequence, [3][N_GEN][n_vocab], for the same greedy
 * continuations. */
#define N_SEQ 3
static float *run_batch(const char *path, long cache, double pcie_frac, int *nv_out) {
    engine_params p = params(path, cache, pcie_frac);
    p.n_seq = N_SEQ;
    engine *e = engine_open(&p);
    ST_ASSERT(e);
    const int nv = e->m->hp.n_vocab;
    engine_seq *seqs[N_SEQ];
    int32_t tok[N_SEQ];
    float *out = st_malloc((size_t)N_SEQ * N_GEN * nv * sizeof(float));
    for (int q = 0; q < N_SEQ; q++) {
        int32_t prompt[N_PROMPT];
        const int n = N_PROMPT - 3 * q;
        for (int i = 0; i < n; i++) prompt[i] = (int32_t)((i * 7919 + 13 + 101 * q) % nv);
        seqs[q] = engine_seq_new(e);
        ST_ASSERT(engine_seq_read_prompt(e, seqs[q], prompt, n) >= 0);
    }
    for (int t = 0; t < N_GEN; t++) {
        for (int q = 0; q < N_SEQ; q++) {
            memcpy(out + ((size_t)q * N_GEN + t) * nv, seqs[q]->logits, (size_t)nv * sizeof(float));
            int best = 0;
            for (int i = 1; i < nv; i++)
                if (seqs[q]->logits[i] > seqs[q]->logits[best]) best = i;
            tok[q] = best;
        }
        ST_ASSERT(engine_decode_batch(e, seqs, tok, N_SEQ) == 0);
    }
    for (int q = 0; q < N_SEQ; q++) engine_seq_free(e, seqs[q]);
    engine_close(e);
    *nv_out = nv;
    return out;
}

static void compare(const char *what, const lanes_run_out *ref, const lanes_run_out *got, int nv) {
    double mx = 0, diff = 0, step[N_GEN + 1] = {0};
    for (size_t i = 0; i < (size_t)(N_GEN + 1) * nv; i++) {
        mx = fmax(mx, fabs(ref->logits[i]));
        diff = fmax(diff, fabs(ref->logits[i] - got->logits[i]));
        step[i / (size_t)nv] = fmax(step[i / (size_t)nv], fabs(ref->logits[i] - got->logits[i]));
    }

    int same = 1;
    for (int t = 0; t < N_GEN; t++) same &= ref->tok[t] == got->tok[t];
    /* one step off and the rest within float order: one routing flip (a
     * near-tied expert that the other summation order decided the other
     * way; seen with the AMX kernels' rounding: one step of 17 at 3.3e-3,
     * the others 0 or 1.8e-7), tests/common/logits.h */
    for (int t = 0; t <= N_GEN; t++) step[t] /= mx > 0 ? mx : 1;
    const int flip = diff > BOUND * mx && logits_one_flip(step, N_GEN + 1, BOUND);
    CHECK(diff <= BOUND * mx || flip, "%s: logits differ by %.3g (largest |logit| %.3g)", what, diff, mx);
    CHECK(same, "%s: greedy tokens differ", what);
    printf("  %-44s max |logit diff| %.2e of %.2e%s, tokens %s\n", what, diff, mx,
           flip ? " (one step: a routing flip)" : "", same ? "equal" : "DIFFER");
}

typedef struct {
    int n;
    char text[4][512];
} plan_text;

static void collect_line(void *ctx, const char *line) {
    plan_text *t = ctx;
    if (t->n < 4) snprintf(t->text[t->n], sizeof t->text[0], "%s", line);
    t->n++;
}

static void test_plan(void) {
    const size_t G = 1ull << 30, M = 1ull << 20;
    expert_plan_in in = {.budget = 10 * G,
                         .dense = 2 * G,
                         .kv = G,
                         .scratch = G,
                         .expert = 50 * M,
                         .n_layer = 4,
                         .n_expert = 32,
                         .cache = -1};
    expert_plan p;
    /* 4 GiB + 128 x 50 MiB = 10.25 GiB: not everything fits */
    CHECK(expert_plan_make(&in, NULL, &p) == 0, "%s", st_error_get());
    const size_t staging = 32 * 50 * M;
    const long fit = (long)((10 * G - 4 * G - staging) / (50 * M));
    CHECK(!p.all_resident && p.slots == fit && fit == 90, "slots %ld, expected %ld", p.slots, fit);
    CHECK(p.staging == staging && p.used <= in.budget, "staging %zu used %zu", p.staging, p.used);
    long sum = 0;
    for (int l = 0; l < 4; l++) {
        sum += p.layer_slots[l];
        int n = 0;
        for (int e = 0; e < 32; e++) n += p.slot[l * 32 + e] >= 0;
        CHECK(n == p.layer_slots[l], "layer %d: %d experts placed, %d slots", l, n, p.layer_slots[l]);
    }
    CHECK(sum == fit, "layer slots add to %ld", sum);
    /* the plan in words, as the start log, launch --plan and device --selftest print it */
    plan_text t = {0};
    expert_plan_describe(&p, &in, collect_line, &t);
    CHECK(t.n == 2 &&
              strstr(t.text[0], "budget 10.00 GiB = dense weights 2.00 + KV 1.00 + scratch 1.00 + "
                                "streaming buffer 1.56 + expert cache 4.39 (90 of 128 experts, 70.3%") &&
              strstr(t.text[1], "38 experts (1.86 GiB) in host RAM"),
          "plan text: %d lines: %s / %s", t.n, t.text[0], t.text[1]);
    expert_plan_free(&p);
    /* a budget that holds all of it: no lanes, no staging */
    in.budget = 50 * G;
    CHECK(expert_plan_make(&in, NULL, &p) == 0 && p.all_resident && p.staging == 0 && p.slots == 128, "all resident");
    expert_plan_free(&p);
    /* too small for the dense part and the streaming buffer: an error naming the numbers */
    in.budget = 5 * G;
    CHECK(expert_plan_make(&in, NULL, &p) == -1 && strstr(st_error_get(), "cannot hold the dense part"), "%s",
          st_error_get());
    /* more slots asked for than fit */
    in.budget = 6 * G;
    in.cache = 100;
    CHECK(expert_plan_make(&in, NULL, &p) == -1 && strstr(st_error_get(), "--expert-cache 100"), "%s", st_error_get());
    /* a profile: the hottest experts over all layers, whatever their layer */
    in.budget = 50 * G;
    in.cache = 3;
    uint64_t prof[128] = {0};
    prof[2 * 32 + 7] = 50, prof[0 * 32 + 31] = 40, prof[3 * 32 + 0] = 30, prof[1 * 32 + 1] = 20;
    CHECK(expert_plan_make(&in, prof, &p) == 0, "%s", st_error_get());
    CHECK(p.slots == 3 && p.slot[71] == 0 && p.slot[31] == 0 && p.slot[96] == 0 && p.slot[33] == -1 &&
              p.layer_slots[1] == 0 && p.layer_slots[2] == 1,
          "profile placement");
    expert_plan_free(&p);
    /* a split's rank with layers 1..2 (engine/split.h): its experts alone are planned, counted and cached,
     * even where the profile's hottest are another rank's */
    in.n_dense_lead = 1, in.routed_end = 3, in.cache = 10;
    CHECK(expert_plan_make(&in, prof, &p) == 0, "%s", st_error_get());
    long other = 0;
    for (int e = 0; e < 32; e++) other += (p.slot[e] >= 0) + (p.slot[96 + e] >= 0);
    CHECK(p.slots == 10 && other == 0 && p.layer_slots[0] == 0 && p.layer_slots[3] == 0 && p.slot[71] == 0 &&
              p.slot[33] >= 0 && p.layer_slots[1] + p.layer_slots[2] == 10,
          "a rank's layers: %ld slots outside them, layer slots %d %d %d %d", other, p.layer_slots[0], p.layer_slots[1],
          p.layer_slots[2], p.layer_slots[3]);
    expert_plan_free(&p);
    in.cache = -1; /* 64 experts of the rank fit: all resident, not 128 */
    CHECK(expert_plan_make(&in, NULL, &p) == 0 && p.all_resident && p.slots == 64, "a rank's layers all resident: %ld",
          p.slots);
    expert_plan_free(&p);
}

static int n_sent(const uint8_t *to_pcie) {
    int n = 0;
    for (int i = 0; i < 8; i++) n += to_pcie[i];
    return n;
}

static void test_cost_model(void) {
    double bytes[8];
    int ntok[8];
    uint8_t to_pcie[8];
    for (int i = 0; i < 8; i++) bytes[i] = 3e6, ntok[i] = 1;
    lane_rates r = {.cpu_bw = 100e9, .cpu_flops = 1e12, .pcie_bw = 50e9, .pcie_lat = 20e-6, .pcie_frac = -1};
    /* a slow PCIe lane: everything on the CPU */
    lane_rates slow_pcie = r;
    slow_pcie.pcie_bw = 1e6;
    const double t_alone = lane_split(&slow_pcie, 8, bytes, ntok, 1e7, 1, to_pcie);
    int n = n_sent(to_pcie);
    CHECK(n == 0, "slow PCIe: %d experts sent", n);
    /* one token's arithmetic is in the CPU's rate (timed on such a step): its bytes alone */
    CHECK(fabs(t_alone - 8 * 3e6 / 100e9) < 1e-9, "8 one-token experts on the CPU: %.1f us, not %.1f", t_alone * 1e6,
          8 * 3e6 / 100e9 * 1e6);
    /* a slow CPU: everything over PCIe */
    lane_rates slow_cpu = r;
    slow_cpu.cpu_bw = 1e6;
    lane_split(&slow_cpu, 8, bytes, ntok, 1e7, 1, to_pcie);
    n = n_sent(to_pcie);
    CHECK(n == 8, "slow CPU: %d of 8 sent", n);
    /* comparable lanes (CPU 8 x 40 us, PCIe 8 x 80 us): both used, and the
     * split no slower than either alone */
    const double t = lane_split(&r, 8, bytes, ntok, 1e7, 1, to_pcie);
    n = n_sent(to_pcie);
    const double t_cpu = 8 * 3e6 / 100e9, t_pcie = 8 * (20e-6 + 3e6 / 50e9);
    CHECK(n > 0 && n < 8 && t < t_cpu && t < t_pcie, "balanced: %d sent, %.1f us vs CPU %.1f / PCIe %.1f", n, t * 1e6,
          t_cpu * 1e6, t_pcie * 1e6);
    /* many tokens make an expert compute-bound on the CPU: it goes over PCIe first */
    ntok[3] = 500;
    lane_split(&r, 8, bytes, ntok, 1e7, 1, to_pcie);
    CHECK(to_pcie[3], "the expert with 500 tokens is not sent over PCIe");
    /* a per-layer cost of using PCIe larger than what more experts would save: only the big one goes */
    lane_rates fixed = r;
    fixed.pcie_layer = 1e-3;
    lane_split(&fixed, 8, bytes, ntok, 1e7, 1, to_pcie);
    n = n_sent(to_pcie) - to_pcie[3];
    CHECK(n == 0 && to_pcie[3], "a costly PCIe lane: %d experts sent besides the big one", n);
    /* a costlier PCIe lane still: not even the big one */
    fixed.pcie_layer = 10e-3;
    lane_split(&fixed, 8, bytes, ntok, 1e7, 1, to_pcie);
    n = n_sent(to_pcie);
    CHECK(n == 0, "a very costly PCIe lane: %d of 8 sent", n);
    /* a prompt chunk: moving its 512 rows to the CPU and back costs more than the lane saves */
    lane_rates rows = r;
    rows.cpu_row = 2e-6;
    for (int i = 0; i < 8; i++) ntok[i] = 64;
    lane_split(&rows, 8, bytes, ntok, 1e7, 512, to_pcie);
    n = n_sent(to_pcie);
    CHECK(n == 8, "a 512-row chunk: %d of 8 sent over PCIe", n);
    for (int i = 0; i < 8; i++) ntok[i] = i == 3 ? 500 : 1;
    /* a fixed share */
    r.pcie_frac = 0.25;
    lane_split(&r, 8, bytes, ntok, 1e7, 1, to_pcie);
    n = n_sent(to_pcie);
    CHECK(n == 2 && to_pcie[3], "--pcie-frac 0.25: %d of 8", n);
}

/* The split's tuning (lane_tune) against lanes that run unlike the model:
 * a layer of 8 one-token misses of 3 MB, modelled at CPU 55 GB/s and PCIe
 * 55 GB/s + 20 us an expert, while the "true" lanes (both reading host
 * memory at once) run at CPU 90 and PCIe 35 GB/s + 20 us. A window's time
 * is the true time of the split the tuned rates choose, with +-1% noise.
 * After 60 windows the split's true time is within 5% of the best of the
 * nine possible splits (the modelled one is 50% slower); so with lanes the
 * other way round (CPU 35, PCIe 80); with true lanes that run as modelled,
 * the tuning stays within 5% of the best too. By then it has settled (no
 * probe window in the last 20); when the true lanes then change to another
 * of the three, it searches again and reaches the new best within 60. */
static double true_time(const uint8_t *to_pcie, double cpu_bw, double pcie_bw) {
    const int n = n_sent(to_pcie);
    const double tc = (8 - n) * 3e6 / cpu_bw, tp = n * (20e-6 + 3e6 / pcie_bw);
    return tc > tp ? tc : tp;
}

static void check_tune(double cpu_true, double pcie_true, double cpu_then, double pcie_then) {
    double bytes[8];
    int ntok[8];
    uint8_t to_pcie[8];
    for (int i = 0; i < 8; i++) bytes[i] = 3e6, ntok[i] = 1;
    const lane_rates r = {.cpu_bw = 55e9, .cpu_flops = 1e12, .pcie_bw = 55e9, .pcie_lat = 20e-6, .pcie_frac = -1};
    double best = 1e30;
    for (int n = 0; n <= 8; n++) { /* the true times of sending the first n */
        for (int i = 0; i < 8; i++) to_pcie[i] = i < n;
        const double t = true_time(to_pcie, cpu_true, pcie_true);
        if (t < best) best = t;
    }
    lane_split(&r, 8, bytes, ntok, 1e7, 1, to_pcie);
    const double untuned = true_time(to_pcie, cpu_true, pcie_true);
    lane_tune tu;
    lane_tune_init(&tu);
    uint32_t seed = 12345;
    double t = 0;
    int probes = 0; /* windows of the last 20 at another factor than the one it ends at */
    double last[20];
    for (int w = 0; w < 60; w++) {
        const lane_rates tr = lane_tune_rates(&tu, &r);
        lane_split(&tr, 8, bytes, ntok, 1e7, 1, to_pcie);
        t = true_time(to_pcie, cpu_true, pcie_true);
        if (w >= 40) last[w - 40] = tu.scale;
        seed = seed * 1664525u + 1013904223u;
        lane_tune_step(&tu, t * (0.99 + 0.02 * (double)(seed >> 8) / (double)(1u << 24)));
    }
    for (int i = 0; i < 20; i++) probes += last[i] != tu.scale;
    CHECK(tu.settled && probes == 0, "not settled after 60 windows (%d of the last 20 probed)", probes);
    const lane_rates tr = lane_tune_rates(&tu, &r);
    lane_split(&tr, 8, bytes, ntok, 1e7, 1, to_pcie);
    t = true_time(to_pcie, cpu_true, pcie_true);
    printf("  split tuning, lanes at CPU %.0f / PCIe %.0f GB/s (modelled 55 / 55): the modelled split %.0f us, tuned "
           "%.0f us (PCIe cost x%.2f, %d of 8 sent), the best %.0f us\n",
           cpu_true * 1e-9, pcie_true * 1e-9, untuned * 1e6, t * 1e6, tu.scale, n_sent(to_pcie), best * 1e6);
    CHECK(t <= best * 1.05, "tuned split %.1f us, the best %.1f us", t * 1e6, best * 1e6);
    CHECK(tu.scale >= 1 / LANE_TUNE_MAX && tu.scale <= LANE_TUNE_MAX, "scale %g out of bounds", tu.scale);
    /* the lanes change (another text, another machine load): searched again, to the new best */
    best = 1e30;
    for (int n = 0; n <= 8; n++) {
        for (int i = 0; i < 8; i++) to_pcie[i] = i < n;
        const double tn = true_time(to_pcie, cpu_then, pcie_then);
        if (tn < best) best = tn;
    }
    for (int w = 0; w < 60; w++) {
        const lane_rates tr = lane_tune_rates(&tu, &r);
        lane_split(&tr, 8, bytes, ntok, 1e7, 1, to_pcie);
        t = true_time(to_pcie, cpu_then, pcie_then);
        seed = seed * 1664525u + 1013904223u;
        lane_tune_step(&tu, t * (0.99 + 0.02 * (double)(seed >> 8) / (double)(1u << 24)));
    }
    const lane_rates tr2 = lane_tune_rates(&tu, &r);
    lane_split(&tr2, 8, bytes, ntok, 1e7, 1, to_pcie);
    t = true_time(to_pcie, cpu_then, pcie_then);
    printf("  then at CPU %.0f / PCIe %.0f GB/s: tuned %.0f us (x%.2f), the best %.0f us\n", cpu_then * 1e-9,
           pcie_then * 1e-9, t * 1e6, tu.scale, best * 1e6);
    CHECK(t <= best * 1.05, "after the change: tuned split %.1f us, the best %.1f us", t * 1e6, best * 1e6);
}

static void test_split_tune(void) {
    check_tune(90e9, 35e9, 35e9, 80e9);
    check_tune(35e9, 80e9, 55e9, 55e9);
    check_tune(55e9, 55e9, 90e9, 35e9);
}

/* The cache as a picture (the web page's heatmap): one cell per (layer,
 * expert), as many resident as there are slots, and heat where tokens went. */
static void test_cache_map(const char *path) {
    engine_params p = params(path, 12, 0);
    engine *e = engine_open(&p);
    ST_ASSERT(e);
    const int L = e->m->hp.n_layer, X = e->m->hp.n_expert;
    char cells[256];
    int nl = 0, nx = 0;
    CHECK(moe_lanes_cache_map(e->be, cells, (int)sizeof cells, &nl, &nx) == L * X && nl == L && nx == X,
          "map of %d x %d", nl, nx);
    int resident = 0, hot = 0;
    for (int i = 0; i < L * X; i++) resident += cells[i] >= '4', hot += cells[i] != '0' && cells[i] != '4';
    CHECK(resident == 12 && hot == 0, "before any token: %d resident (12 slots), %d with heat", resident, hot);
    int32_t prompt[N_PROMPT];
    for (int i = 0; i < N_PROMPT; i++) prompt[i] = (int32_t)((i * 7919 + 13) % e->m->hp.n_vocab);
    ST_ASSERT(engine_read_prompt(e, prompt, N_PROMPT) == 0);
    moe_lanes_cache_map(e->be, cells, (int)sizeof cells, &nl, &nx);
    resident = hot = 0;
    int top = 0;
    for (int i = 0; i < L * X; i++) {
        CHECK(cells[i] >= '0' && cells[i] <= '7', "cell %d is '%c'", i, cells[i]);
        resident += cells[i] >= '4', hot += cells[i] != '0' && cells[i] != '4', top += (cells[i] - '0') % 4 == 3;
    }
    CHECK(resident == 12 && hot > 0 && top >= L, "after a prompt: %d resident, %d with heat, %d at the top level",
          resident, hot, top);
    CHECK(moe_lanes_cache_map(e->be, cells, L * X - 1, &nl, &nx) == -1, "a buffer too small is refused");
    engine_close(e);
}

/* Every byte of the file's tensors is in the list, as dense or routed. */
static void test_tensor_list(const char *path) {
    engine_params p = engine_defaults();
    p.model_path = path;
    engine *e = engine_open(&p);
    CHECK(e != NULL, "%s", st_error_get());
    if (!e) return;
    size_t routed = 0, file = 0;
    const size_t dense = engine_weight_bytes(e->m, &routed);
    for (int64_t i = 0; i < gguf_n_tensors(e->m->file); i++) file += gguf_tensor_at(e->m->file, i)->size;
    CHECK(dense + routed == file, "tensor list %zu + %zu bytes, file tensors %zu", dense, routed, file);
    const model_layer *l = &e->m->layers[0];
    size_t layer_routed = 0;
    const st_weight *ws[] = {&l->ffn_gate_exps, &l->ffn_up_exps, &l->ffn_down_exps};
    for (int i = 0; i < 3; i++) layer_routed += (size_t)ws[i]->n_mat * ws[i]->n_out * ws[i]->row_bytes;
    CHECK(routed == layer_routed * (size_t)e->m->hp.n_layer, "routed %zu, expected %zu", routed,
          layer_routed * (size_t)e->m->hp.n_layer);
    engine_close(e);
}

/* --prefill auto (engine_prefill_chunk): 512 when every expert fits the
 * budget, the longest chunk whose extra scratch takes at most an eighth of
 * it when experts are streamed (capped by the context), --prefill N as given. */
static void test_prefill_chunk(const char *path) {
    model *m = model_load(path);
    CHECK(m != NULL, "%s", st_error_get());
    if (!m) return;
    engine_params p = engine_defaults();
    p.expert_cache = -1;
    const size_t roomy = (size_t)1 << 40;
    CHECK(engine_prefill_chunk(&p, m, 8192, roomy) == 512, "all resident: %d",
          engine_prefill_chunk(&p, m, 8192, roomy));
    /* a budget that holds the dense part and three quarters of the experts (a layer of them the streaming buffer) */
    expert_plan_in in;
    engine_plan_input(&p, m, 8192, 512, 0, &in);
    const size_t base = engine_scratch_bytes(&m->hp, 512);
    const size_t tight = in.dense + in.kv + base + (size_t)m->hp.n_layer * (size_t)m->hp.n_expert * in.expert * 3 / 4;
    const size_t extra4k = engine_scratch_bytes(&m->hp, 4096) - base,
                 extra2k = engine_scratch_bytes(&m->hp, 2048) - base;
    const int want = extra4k <= tight / 8 ? 4096 : extra2k <= tight / 8 ? 2048 : 1024;
    const int got = engine_prefill_chunk(&p, m, 8192, tight);
    CHECK(got == want && got > 512, "streamed: chunk %d, expected %d (budget %zu, extra scratch %zu / %zu)", got, want,
          tight, extra4k, extra2k);
    CHECK(engine_prefill_chunk(&p, m, 1024, tight) <= 1024, "the context caps the chunk");
    p.n_ubatch = 256;
    CHECK(engine_prefill_chunk(&p, m, 8192, tight) == 256, "--prefill 256 is kept");
    model_free(m);
}

/* On a GPU: every placement against the all-GPU run of the same file. The
 * CPU lane rounds activations its own way (8-bit blocks by format; the GPU:
 * int8 blocks of 32), so per step the centred logits' NMSE is held to the
 * model's bound (F32 experts: neither side rounds, float order only), and
 * greedy tokens must be equal, or first differ at a near-tie (the top-2 gap
 * below 4x the RMS logit difference of that step). One placement: */
static void gpu_case(const char *path, double bound, const lanes_run_out *ref, int nv, int total, long cache,
                     double frac, int adapt) {
    lanes_run_out got;
    moe_lane_stats s;
    g_adapt = adapt;
    const int got_nv = run(path, cache, frac, NULL, &got, &s);
    g_adapt = 0;
    if (got_nv != nv) {
        check_fail();
        return;
    }
    double worst = 0, e[N_GEN];
    int t = 0;
    for (; t < N_GEN; t++) {
        worst = fmax(worst, e[t] = logits_nmse(got.logits + (size_t)t * nv, ref->logits + (size_t)t * nv, nv, NULL));
        if (got.tok[t] != ref->tok[t]) break;
    }
    if (worst > bound) { /* where: one step or all of them */
        printf("  %s cache %ld frac %g: NMSE per step:", path, cache, frac);
        for (int i = 0; i < t + (t < N_GEN); i++) printf(" %.1e", e[i]);
        printf("\n");
    }
    const char *verdict = "tokens equal";
    if (t < N_GEN) {
        const float *r = ref->logits + (size_t)t * nv, *g = got.logits + (size_t)t * nv;
        float gap;
        logits_argmax(r, nv, &gap);
        double ss = 0;
        for (int i = 0; i < nv; i++) ss += (double)(r[i] - g[i]) * (r[i] - g[i]);
        const double rms = sqrt(ss / nv);
        CHECK(gap < 4 * rms, "%s cache %ld frac %g: token %d differs at a gap of %.3g (rms diff %.3g)", path, cache,
              frac, t, gap, rms);
        verdict = gap < 4 * rms ? "first difference at a near-tie" : "DIFFERENT";
    }
    const int flip = logits_one_flip(e, t + (t < N_GEN), bound); /* a routing flip (tests/common/logits.h) */
    CHECK(worst <= bound || flip, "%s cache %ld frac %g: NMSE %.3g over %.3g", path, cache, frac, worst, bound);
    const double pairs = (double)(s.pairs_dev + s.pairs_cpu + s.pairs_pcie);
    printf("  %s cache %ld/%d pcie-frac %g%s: NMSE <= %.2e (bound %.0e), %s; pairs %.0f%% GPU cache, %.0f%% "
           "CPU, %.0f%% PCIe\n",
           path, cache, total, frac, adapt ? ", adapt every 1" : "", worst, bound, verdict, 100 * s.pairs_dev / pairs,
           100 * s.pairs_cpu / pairs, 100 * s.pairs_pcie / pairs);
    st_free(got.logits);
}

static void gpu_model(const char *arg) {
    char path[512];
    snprintf(path, sizeof path, "%s", arg);
    double bound = 1e-2;
    char *colon = strrchr(path, ':');
    if (colon) *colon = 0, bound = atof(colon + 1);
    if (access(path, R_OK) != 0) {
        printf("  %s: absent, skipped\n", path);
        return;
    }
    lanes_run_out ref;
    const int nv = run(path, -1, -1, NULL, &ref, NULL);
    if (nv < 0) {
        check_fail();
        return;
    }
    model *m = model_load(path);
    ST_ASSERT(m);
    const int total = m->hp.n_layer * m->hp.n_expert;
    model_free(m);
    const long caches[] = {0, total / 4, total / 2, total - 1};
    const double fracs[] = {0, 0.5, 1, -1};
    for (size_t c = 0; c < 4; c++)
        for (size_t f = 0; f < 4; f++) gpu_case(path, bound, &ref, nv, total, caches[c], fracs[f], 0);
    /* the cache learning while it serves: slots change hands every step */
    gpu_case(path, bound, &ref, nv, total, total / 4, -1, 1);
    gpu_case(path, bound, &ref, nv, total, total / 2, -1, 1);
    st_free(ref.logits);
}

int main(int argc, char **argv) {
    setvbuf(stdout, NULL, _IONBF, 0); /* each line out before a crash, not lost in a buffer */
    st_log_set_level(ST_LOG_WARN);
    if (argc > 2 && !strcmp(argv[1], "--gpu")) {
        g_gpu = atoi(argv[2]);
        if (!gpu_present(g_gpu)) {
            printf("SKIPPED: no CUDA device %d\n", g_gpu);
            return 0;
        }
        for (int i = 3; i < argc; i++) gpu_model(argv[i]);
        return check_report("test_lanes --gpu");
    }
    const char *dir = argc > 1 ? argv[1] : "/tmp";
    char path[512], prof_path[512];
    snprintf(path, sizeof path, "%s/strata-test-lanes-%d.gguf", dir, (int)getpid());
    snprintf(prof_path, sizeof prof_path, "%s/strata-test-lanes-%d.prof", dir, (int)getpid());
    synth_hparams hp;
    if (lanes_tiny(path, &hp) != 0) return 1;
    test_plan();
    test_cost_model();
    test_split_tune();
    test_tensor_list(path);
    test_prefill_chunk(path);
    test_cache_map(path);

    const int total = hp.n_layer * hp.n_expert;
    lanes_run_out ref, got;
    const int nv = run(path, -1, -1, NULL, &ref, NULL);
    ST_ASSERT(nv > 0);
    struct {
        long cache;
        double frac;
        int profile;
    } cases[] = {
        {0, 0, 0},          {0, 1, 0},         {0, -1, 0},        {total / 4, 0, 0}, {total / 4, 0.5, 0},
        {total / 2, -1, 0}, {total - 1, 0, 0}, {total / 4, 0, 1}, {total / 2, 1, 1},
    };
    /* a profile: the routing counts of the plain prompt and decode, as strata profile records them */
    {
        engine_params p = params(path, 0, -1);
        engine *e = engine_open(&p);
        ST_ASSERT(e && engine_read_prompt(e, (int32_t[]){1, 2, 3}, 3) == 0);
        ST_ASSERT(engine_eval(e, ref.tok, N_GEN) == 0);
        const uint64_t *counts = moe_lanes_counts(e->be);
        uint64_t sum = 0;
        for (int i = 0; i < total; i++) sum += counts[i];
        CHECK(sum == (uint64_t)(3 + N_GEN) * hp.n_expert_used * hp.n_layer, "profile counts add to %llu",
              (unsigned long long)sum);
        ST_ASSERT(expert_profile_save(prof_path, counts, hp.n_layer, hp.n_expert) == 0);
        uint64_t *back = expert_profile_load(prof_path, hp.n_layer, hp.n_expert);
        CHECK(back && !memcmp(back, counts, (size_t)total * sizeof(uint64_t)), "profile round trip");
        st_free(back);
        engine_close(e);
    }
    CHECK(!expert_profile_load(prof_path, hp.n_layer + 1, hp.n_expert) && strstr(st_error_get(), "profile of"),
          "a profile of another shape is refused: %s", st_error_get());
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        moe_lane_stats s;
        char what[128];
        snprintf(what, sizeof what, "cache %ld of %d, pcie-frac %g%s", cases[c].cache, total, cases[c].frac,
                 cases[c].profile ? ", profile" : "");
        if (run(path, cases[c].cache, cases[c].frac, cases[c].profile ? prof_path : NULL, &got, &s) != nv) {
            check_fail();
            continue;
        }
        compare(what, &ref, &got, nv);
        const uint64_t pairs = (uint64_t)(N_PROMPT + N_GEN) * hp.n_expert_used * hp.n_layer;
        CHECK(s.pairs_dev + s.pairs_cpu + s.pairs_pcie == pairs, "%s: %llu + %llu + %llu pairs, expected %llu", what,
              (unsigned long long)s.pairs_dev, (unsigned long long)s.pairs_cpu, (unsigned long long)s.pairs_pcie,
              (unsigned long long)pairs);
        if (cases[c].cache == 0)
            CHECK(s.pairs_dev == 0, "%s: %llu cached pairs", what, (unsigned long long)s.pairs_dev);
        if (cases[c].frac == 0) CHECK(s.pairs_pcie == 0, "%s: %llu PCIe pairs", what, (unsigned long long)s.pairs_pcie);
        if (cases[c].frac == 1) CHECK(s.pairs_cpu == 0, "%s: %llu CPU pairs", what, (unsigned long long)s.pairs_cpu);
        st_free(got.logits);
    }
    /* batched decode (3 rows per step, as the server's slots): the lanes
     * against the plain engine, step by step */
    {
        int nvb;
        float *plain = run_batch(path, -1, -1, &nvb);
        const struct {
            long cache;
            double frac;
        } bc[] = {{0, 0}, {total / 4, 1}, {total / 2, 0.5}};
        for (size_t c = 0; c < sizeof bc / sizeof bc[0]; c++) {
            float *lanes = run_batch(path, bc[c].cache, bc[c].frac, &nvb);
            double mx = 0, diff = 0;
            for (size_t i = 0; i < (size_t)N_SEQ * N_GEN * nvb; i++) {
                mx = fmax(mx, fabs(plain[i]));
                diff = fmax(diff, fabs(plain[i] - lanes[i]));
            }
            CHECK(diff <= BOUND * mx, "batched, cache %ld, pcie-frac %g: logits differ by %.3g (largest %.3g)",
                  bc[c].cache, bc[c].frac, diff, mx);
            printf("  batched x%d, cache %ld, pcie-frac %-4g            max |logit diff| %.2e of %.2e\n", N_SEQ,
                   bc[c].cache, bc[c].frac, diff, mx);
            st_free(lanes);
        }
        st_free(plain);
    }
    /* the cache learning while it runs (a slot taken by a hotter expert each
     * step, or every 3): the same logits and tokens, and slots did change hands */
    const long adapt_cases[][2] = {{total / 4, 1}, {total / 4, 3}, {total / 2, 1}};
    for (size_t c = 0; c < sizeof adapt_cases / sizeof adapt_cases[0]; c++) {
        moe_lane_stats s;
        char what[128];
        g_adapt = (int)adapt_cases[c][1];
        snprintf(what, sizeof what, "cache %ld of %d, adapt every %d", adapt_cases[c][0], total, g_adapt);
        ST_ASSERT(run(path, adapt_cases[c][0], c == 2 ? 1 : 0, NULL, &got, &s) == nv);
        compare(what, &ref, &got, nv);
        CHECK(s.swaps > 0, "%s: no slot changed hands", what);
        st_free(got.logits);
    }
    g_adapt = 0;
    /* a profile that caches layer 0 whole, its hottest experts being its
     * highest ids: the layer then runs the device's own MoE over its slots,
     * which must hold expert e in slot e whatever order the profile ranked them */
    {
        uint64_t *rev = st_calloc((size_t)total, sizeof(uint64_t));
        for (int e = 0; e < hp.n_expert; e++) rev[e] = 1000 + (uint64_t)e;
        char rev_path[600];
        snprintf(rev_path, sizeof rev_path, "%s.rev", prof_path);
        ST_ASSERT(expert_profile_save(rev_path, rev, hp.n_layer, hp.n_expert) == 0);
        moe_lane_stats s;
        ST_ASSERT(run(path, hp.n_expert, 0, rev_path, &got, &s) == nv);
        compare("layer 0 cached whole by a reversed profile", &ref, &got, nv);
        st_free(got.logits);
        st_free(rev);
        unlink(rev_path);
    }
    /* the profile's experts are the hottest of this very routing (the tokens
     * are the same): they give at least the hits of any other choice */
    moe_lane_stats s0, s1;
    run(path, total / 4, 0, NULL, &got, &s0);
    st_free(got.logits);
    run(path, total / 4, 0, prof_path, &got, &s1);
    st_free(got.logits);
    CHECK(s1.pairs_dev >= s0.pairs_dev, "cache %d: %llu cached pairs with the profile, %llu without", total / 4,
          (unsigned long long)s1.pairs_dev, (unsigned long long)s0.pairs_dev);
    printf("  cache %d: %llu cached pairs without a profile, %llu with one\n", total / 4,
           (unsigned long long)s0.pairs_dev, (unsigned long long)s1.pairs_dev);
    st_free(ref.logits);
    unlink(path);
    unlink(prof_path);
    return check_report("test_lanes");
}
