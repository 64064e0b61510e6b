/* deepseek2 (DeepSeek V3) in the engine and the CPU backend's routing:
 *   - moe_route's group-limited choice on hand examples: the group with the
 *     best sum of its two best biased scores wins over the group holding the
 *     single best expert; the weights are the unbiased sigmoids, renormalised,
 *     times the scale; one group kept of two, and two of four;
 *   - the synth tiny preset (a dense layer, two MoE layers, latent attention)
 *     loads with its hyper-parameters as written; its cache holds one row of
 *     kv_lora + rope values per position and layer (the compressed cache);
 *     a batched decode step of two sequences gives each its own single-step
 *     logits; the tensor list covers every byte of the file;
 *   - the routed experts through the expert lanes (4 cached experts, misses
 *     on the CPU lane or over "PCIe") give the plain logits: the group rule
 *     travels through the seam;
 *   - the CPU backend's matmul over a whole stack (ST_MAT_ALL: every head's
 *     product in one call) equals one call per matrix, bit for bit;
 *   - a backend without copy_2d (as the CUDA one was) is refused at load
 *     with a message naming the family and the backend; so is one whose
 *     routing is softmax only.
 *
 * usage: test_deepseek2 [DIR for the temporary model, default /tmp]
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/alloc.h"
#include "core/log.h"
#include "engine/engine.h"
#include "engine/engine_place.h"
#include "engine/moe_lanes.h"
#include "model/synth.h"
#include "quant/quant.h"

#include "../common/check.h"
#include "../common/family.h"

#define N   12
#define TOL 1e-4 /* max |a - b| of logits of std ~1: float summation order only */

static double sigm(double x) { return 1.0 / (1.0 + exp(-x)); }

static void check_route(void) {
    st_backend *be = backend_cpu_create(1);
    /* two groups of four. Group 0: logits 1, 1, -3, -3 (top-2 sum of sigmoids
     * 1.46); group 1: 3, -3, -3, -3 (0.95 + 0.05 = 1.00) holds the single best
     * expert (4), but group 0 wins: experts 0 and 1 */
    const float lg[8] = {1, 1, -3, -3, 3, -3, -3, -3};
    int32_t sel[4];
    float w[4];
    st_moe_gating gt = {ST_GATE_SIGMOID, 1, NULL, 2.5f, 2, 1};
    be->moe_route(be, lg, 1, 8, 2, &gt, sel, w);
    CHECK(sel[0] == 0 && sel[1] == 1, "groups: chose %d, %d, expected 0, 1", sel[0], sel[1]);
    CHECK(fabs(w[0] - 1.25) < 1e-6 && fabs(w[1] - 1.25) < 1e-6, "group weights %g %g, expected 1.25", w[0], w[1]);
    /* without groups the best two overall: 4, then 0 */
    gt.n_group = gt.n_group_used = 0;
    be->moe_route(be, lg, 1, 8, 2, &gt, sel, w);
    CHECK(sel[0] == 4 && sel[1] == 0, "no groups: chose %d, %d, expected 4, 0", sel[0], sel[1]);
    /* a bias lifts group 1's second expert (5): 0.05 + 0.6 -> group 1 sums 1.6 and wins; the
     * weights stay the unbiased sigmoids (renormalised, scaled) */
    const float bias[8] = {0, 0, 0, 0, 0, 0.6f, 0, 0};
    gt = (st_moe_gating){ST_GATE_SIGMOID, 1, bias, 2.5f, 2, 1};
    be->moe_route(be, lg, 1, 8, 2, &gt, sel, w);
    const double s3 = sigm(3), sm3 = sigm(-3);
    CHECK(sel[0] == 4 && sel[1] == 5, "biased groups: chose %d, %d, expected 4, 5", sel[0], sel[1]);
    CHECK(fabs(w[0] - 2.5 * s3 / (s3 + sm3)) < 1e-6 && fabs(w[1] - 2.5 * sm3 / (s3 + sm3)) < 1e-6,
          "biased group weights %g %g", w[0], w[1]);
    /* four groups of two, two kept, top-3: group sums 0: 1.46 (experts 0, 1), 1: 0.10, 2: 1.00, 3:
     * 0.10; groups 0 and 2 -> experts 4, 0, 1 */
    gt = (st_moe_gating){ST_GATE_SIGMOID, 0, NULL, 1.0f, 4, 2};
    be->moe_route(be, lg, 1, 8, 3, &gt, sel, w);
    CHECK(sel[0] == 4 && sel[1] == 0 && sel[2] == 1 && fabs(w[0] - s3) < 1e-6, "4 groups, 2 kept: chose %d %d %d",
          sel[0], sel[1], sel[2]);
    be->destroy(be);
}

/* matmul(ST_MAT_ALL) against a call per matrix on packed rows (copy_2d):
 * the same products, so the same bits. Q8_0 and F32, 3 tokens, 5 matrices. */
static void check_matmul_all(void) {
    st_backend *be = backend_cpu_create(2);
    enum { H = 5, NI = 64, NO = 24, T = 3 };
    static const qt_type types[] = {QT_Q8_0, QT_F32};
    for (int ti = 0; ti < 2; ti++) {
        const qt_type t = types[ti];
        const size_t rb = qt_row_size(t, NI);
        uint8_t *wq = st_malloc(rb * H * NO);
        float row[NI], x[T * H * NI], y[T * H * NO], xs[T * NI], ys[T * NO], want[T * H * NO];
        for (int r = 0; r < H * NO; r++) {
            for (int i = 0; i < NI; i++) row[i] = sinf(0.37f * (float)(r * NI + i));
            qt_quantize(t, row, wq + (size_t)r * rb, NI);
        }
        for (int i = 0; i < T * H * NI; i++) x[i] = cosf(0.11f * (float)i);
        const st_weight w = {wq, NULL, t, NI, NO, H, rb, NULL};
        be->matmul(be, &w, ST_MAT_ALL, x, y, T);
        for (int m = 0; m < H; m++) {
            be->copy_2d(be, xs, NI, x + m * NI, H * NI, NI, T);
            be->matmul(be, &w, m, xs, ys, T);
            be->copy_2d(be, want + m * NO, H * NO, ys, NO, NO, T);
        }
        CHECK(memcmp(y, want, sizeof y) == 0, "%s: matmul over the stack differs from a call per matrix",
              qt_get(t)->name);
        st_free(wq);
    }
    be->destroy(be);
}

static void check_model(const char *dir) {
    char path[512];
    snprintf(path, sizeof path, "%s/strata-test-deepseek2-%d.gguf", dir, (int)getpid());
    engine_params p = family_tiny("deepseek2", 8, path); /* Q8_0 */
    engine *e = engine_open(&p);
    CHECK(e != NULL, "deepseek2: %s", st_error_get());
    if (!e) return;
    const model_hparams *h = &e->m->hp;
    /* mscale = 1 + 0.1 * 1 * ln 4; scale = mscale^2 / sqrt(96) */
    const double ms = 1.0 + 0.1 * log(4.0);
    CHECK(h->n_dense_lead == 1 && h->gate_fn == ST_GATE_SIGMOID && h->n_rot == 32 && h->kv_lora == 256 &&
              h->q_lora == 256 && h->head_dim == 288 && h->head_dim_mla == 96 && h->v_head_mla == 64 &&
              h->n_head_kv == 1 && h->n_group == 2 && h->n_group_used == 1 && h->exp_bias && h->norm_topk &&
              h->expert_scale == 2.5f && h->yarn_orig_ctx == 256 && h->rope_freq_scale == 1.0f &&
              fabs(h->attn_scale - ms * ms / sqrt(96.0)) < 1e-6,
          "deepseek2 hyper-parameters as written (attention scale %g)", h->attn_scale);
    /* YaRN x4 from 256 positions as divisors: the correction range of 32
     * rotated dims is pairs [0, 7) rounded out (0.42 -> 0, 6.44 -> 7): pair
     * 0 keeps its frequency, pairs 7.. are divided by the factor, pair 3 by
     * the linear mix in between (3/7 interpolated: 1 / (3/7 / 4 + 4/7)) */
    const float *dv = e->m->rope_freqs;
    CHECK(dv && dv[0] == 1.0f && fabsf(dv[7] - 4.0f) < 1e-6f && fabsf(dv[15] - 4.0f) < 1e-6f &&
              fabs(dv[3] - 1.0 / (3.0 / 7.0 / 4.0 + 4.0 / 7.0)) < 1e-6,
          "YaRN divisors %g %g %g %g", dv ? dv[0] : -1, dv ? dv[3] : -1, dv ? dv[7] : -1, dv ? dv[15] : -1);
    /* the compressed cache: one row of kv_lora + rope values per layer and position, f16 */
    CHECK(kv_cache_bytes(h, 64, ST_KV_F16) == (size_t)3 * 64 * 288 * 2, "cache %zu bytes for 64 positions",
          kv_cache_bytes(h, 64, ST_KV_F16));
    const int nv = h->n_vocab;
    float *want = st_malloc((size_t)nv * sizeof(float));
    int32_t a[N + 1], b[N + 1];
    family_prompts(nv, N, a, b);
    family_check_batched(e, a, b, N, want, TOL);
    size_t dense, routed;
    const size_t file = family_file_bytes(e, &dense, &routed);
    /* the tensor rows cover the file, plus YaRN's divisors made at load (n_rot / 2 floats) */
    CHECK(dense + routed == file + (size_t)h->n_rot / 2 * sizeof(float),
          "tensor list %zu + %zu bytes, file tensors %zu", dense, routed, file);
    /* a backend without copy_2d (the CUDA one's before mla.cu) is refused, naming both; so is softmax-only
     * routing */
    st_backend no_mla = *e->be, softmax_only = *e->be;
    no_mla.copy_2d = NULL;
    no_mla.name = softmax_only.name = "cuda";
    softmax_only.moe_gatings = ST_GATINGS_SOFTMAX;
    CHECK(engine_backend_supports(e->m, e->be) == 0, "the CPU backend runs deepseek2");
    CHECK(engine_backend_supports(e->m, &no_mla) == -1 && strstr(st_error_get(), "deepseek2") &&
              strstr(st_error_get(), "cuda backend"),
          "refusal without copy_2d: %s", st_error_get());
    CHECK(engine_backend_supports(e->m, &softmax_only) == -1 && strstr(st_error_get(), "deepseek2"),
          "refusal of softmax-only routing: %s", st_error_get());
    /* the same prompt with the experts split between a 4-slot cache and the CPU lane */
    family_fresh(e, a, N, want);
    engine_close(e);
    family_check_lanes(p, a, N, want, nv, 4, TOL);
    st_free(want);
    unlink(path);
}

int main(int argc, char **argv) {
    setvbuf(stdout, NULL, _IONBF, 0);
    st_log_set_level(ST_LOG_WARN);
    setenv("STRATA_PRECISE", "1", 1);
    check_route();
    check_matmul_all();
    check_model(argc > 1 ? argv[1] : "/tmp");
    return check_report("test_deepseek2");
}
