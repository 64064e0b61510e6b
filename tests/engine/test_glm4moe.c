/* glm4moe (GLM-4.5) in the engine and the CPU backend's routing:
 *   - moe_route with sigmoid gating, a selection bias and a scale, on a hand
 *     example: the bias changes the choice but not the weights, which are
 *     the chosen sigmoids renormalised, times the scale;
 *   - a synthetic tiny model (a dense first layer, then MoE layers) runs:
 *     a batched decode step of two sequences gives each its own single-step
 *     logits, and the tensor list covers every byte of the file's tensors;
 *   - the routed experts through the expert lanes (a CPU backend playing the
 *     GPU with 4 cached experts, engine/moe_lanes.c; the plan gives the dense
 *     first layer no slots) give the plain logits, with the routing rule
 *     carried through the seam;
 *   - a backend whose routing is softmax only (as the CUDA one was) is
 *     refused with a message naming the family and the backend.
 *
 * usage: test_glm4moe [DIR for the temporary model, default /tmp]
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

#include "../common/check.h"
#include "../common/family.h"

#define N   12
#define TOL 1e-4 /* max |a - b| of logits of std ~1: float summation order only */

static double sigm(double x) { return 1.0 / (1.0 + exp(-x)); }

static void check_route(void) {
    st_backend *be = backend_cpu_create(1);
    /* sigmoids 0.5, 0.73, 0.88, 0.27; the bias lifts expert 0 above expert 1 */
    const float logits[4] = {0.0f, 1.0f, 2.0f, -1.0f}, bias[4] = {0.3f, 0.0f, 0.0f, 0.0f};
    int32_t sel[2];
    float w[2];
    st_moe_gating gt = {ST_GATE_SIGMOID, 1, bias, 2.5f, 0, 0};
    be->moe_route(be, logits, 1, 4, 2, &gt, sel, w);
    const double s0 = sigm(0), s2 = sigm(2);
    CHECK(sel[0] == 2 && sel[1] == 0, "sigmoid + bias: chose %d, %d, expected 2, 0", sel[0], sel[1]);
    CHECK(fabs(w[0] - 2.5 * s2 / (s0 + s2)) < 1e-6 && fabs(w[1] - 2.5 * s0 / (s0 + s2)) < 1e-6,
          "sigmoid weights %g %g, expected %g %g", w[0], w[1], 2.5 * s2 / (s0 + s2), 2.5 * s0 / (s0 + s2));
    gt.bias = NULL; /* without it: experts 2 and 1 */
    gt.norm_topk = 0;
    gt.scale = 1.0f;
    be->moe_route(be, logits, 1, 4, 2, &gt, sel, w);
    CHECK(sel[0] == 2 && sel[1] == 1 && fabs(w[0] - s2) < 1e-6 && fabs(w[1] - sigm(1)) < 1e-6,
          "sigmoid, no bias, no renormalisation: %d %d %g %g", sel[0], sel[1], w[0], w[1]);
    be->destroy(be);
}

static void check_model(const char *dir) {
    char path[512];
    snprintf(path, sizeof path, "%s/strata-test-glm4moe-%d.gguf", dir, (int)getpid());
    engine_params p = family_tiny("glm4moe", 8, path); /* Q8_0 */
    engine *e = engine_open(&p);
    CHECK(e != NULL, "glm4moe: %s", st_error_get());
    if (!e) return;
    CHECK(e->m->hp.n_dense_lead == 1 && e->m->hp.gate_fn == ST_GATE_SIGMOID && e->m->hp.n_rot == 32 &&
              e->m->hp.qkv_bias && !e->m->hp.qk_norm && e->m->hp.expert_scale == 2.5f,
          "glm4moe hyper-parameters as written");
    const int nv = e->m->hp.n_vocab;
    float *want = st_malloc((size_t)nv * sizeof(float));
    int32_t a[N + 1], b[N + 1];
    family_prompts(nv, N, a, b);
    family_check_batched(e, a, b, N, want, TOL);
    size_t dense, routed;
    const size_t file = family_file_bytes(e, &dense, &routed);
    CHECK(dense + routed == file, "tensor list %zu + %zu bytes, file tensors %zu", dense, routed, file);
    /* softmax-only routing (the CUDA backend's before route.cuh took every rule) is refused, naming both */
    st_backend softmax_only = *e->be;
    softmax_only.moe_gatings = ST_GATINGS_SOFTMAX;
    softmax_only.name = "cuda";
    CHECK(engine_backend_supports(e->m, e->be) == 0, "the CPU backend routes glm4moe");
    CHECK(engine_backend_supports(e->m, &softmax_only) == -1 && strstr(st_error_get(), "glm4moe") &&
              strstr(st_error_get(), "cuda backend"),
          "refusal: %s", st_error_get());
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
    check_model(argc > 1 ? argv[1] : "/tmp");
    return check_report("test_glm4moe");
}
