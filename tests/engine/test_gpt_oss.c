/* gpt-oss in the engine and the CPU backend:
 *   - the clamped SwiGLU (act_mul ST_ACT_SWIGLU_OAI) on hand values on both
 *     sides of the clamps;
 *   - attention with a sink on a hand example: one key, the sink's share of
 *     the softmax taken from its value;
 *   - the routing gpt-oss uses (softmax of the chosen top-k logits) is
 *     qwen's softmax-then-renormalise: checked on a hand example;
 *   - per-expert biases through moe_experts: an expert of zero weights gives
 *     exactly act(bias_gate, bias_up) through down plus bias_down;
 *   - a synthetic tiny model (MXFP4 experts): a batched decode step of two
 *     sequences gives each its own single-step logits, the tensor list
 *     (with the biases bound into their st_weight) covers every byte of the
 *     file's tensors;
 *   - the routed experts through the expert lanes (a CPU backend playing the
 *     GPU with 4 cached experts, engine/moe_lanes.c) give the plain logits:
 *     the biases and the activation travel through the seam;
 *   - a backend without attention sinks or the biased experts is refused
 *     with a message naming the family and the backend.
 *
 * usage: test_gpt_oss [DIR for the temporary model, default /tmp]
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

static double oai(double g, double u) { /* the model card's activation, clamps written out */
    g = g > 7.0 ? 7.0 : g;
    u = u > 7.0 ? 7.0 : u < -7.0 ? -7.0 : u;
    return g / (1.0 + exp(-1.702 * g)) * (u + 1.0);
}

static void check_ops(void) {
    st_backend *be = backend_cpu_create(1);
    /* act: g above and below the clamp (it clamps above only), u on both sides */
    const float g[5] = {9.0f, -9.0f, 0.5f, 7.0f, -0.3f}, u[5] = {-9.0f, 9.0f, 0.25f, 3.0f, -7.5f};
    float out[5];
    be->act_mul(be, ST_ACT_SWIGLU_OAI, g, u, out, 5);
    for (int i = 0; i < 5; i++)
        CHECK(fabs(out[i] - oai(g[i], u[i])) < 1e-5 * (1 + fabs(oai(g[i], u[i]))), "swiglu_oai(%g, %g) = %g, want %g",
              g[i], u[i], out[i], oai(g[i], u[i]));
    /* attention with one cached position and a sink: softmax over {s, sink} */
    st_kv_layer kv = {0};
    kv.type = ST_KV_F16;
    kv.n_ctx = 4;
    kv.n_head_kv = 1;
    kv.head_dim = 2;
    kv.k = st_calloc(8, 2);
    kv.v = st_calloc(8, 2);
    const float k0[2] = {1.0f, 0.5f}, v0[2] = {2.0f, -1.0f}, q[2] = {0.5f, 1.0f}, sink[1] = {0.75f};
    { /* into the cache by qkv_prep, as the forward pass writes it: position 0 turns by nothing */
        const st_rope none = {10000.0f, 1.0f, 0, NULL, 0};
        float qs[2] = {0.0f, 0.0f}, ks[2] = {k0[0], k0[1]};
        be->qkv_prep(be, qs, ks, v0, NULL, NULL, 1e-6f, 1, 1, &none, &kv, 0);
    }
    float att[2];
    be->attention_sinks(be, q, &kv, 1, 0, 1, 1.0f, 0, sink, att);
    const double s = 0.5 * 1.0 + 1.0 * 0.5, share = exp(s) / (exp(s) + exp(0.75));
    CHECK(fabs(att[0] - 2.0 * share) < 1e-5 && fabs(att[1] + share) < 1e-5, "attention with a sink: %g %g, want %g %g",
          att[0], att[1], 2.0 * share, -share);
    be->attention(be, q, &kv, 1, 0, 1, 1.0f, 0, att);
    CHECK(fabs(att[0] - 2.0) < 1e-5 && fabs(att[1] + 1.0) < 1e-5, "attention without: %g %g", att[0], att[1]);
    st_free(kv.k);
    st_free(kv.v);
    /* routing: softmax over all, top-2, renormalised == softmax of the 2 chosen logits */
    const float logits[4] = {0.5f, 2.0f, -1.0f, 1.25f};
    int32_t sel[2];
    float w[2];
    const st_moe_gating gt = {ST_GATE_SOFTMAX, 1, NULL, 1.0f, 0, 0};
    be->moe_route(be, logits, 1, 4, 2, &gt, sel, w);
    const double w1 = 1.0 / (1.0 + exp(1.25 - 2.0));
    CHECK(sel[0] == 1 && sel[1] == 3 && fabs(w[0] - w1) < 1e-6 && fabs(w[1] - (1 - w1)) < 1e-6,
          "top-2 softmax: %d %d %g %g, want 1 3 %g %g", sel[0], sel[1], w[0], w[1], w1, 1 - w1);
    be->destroy(be);
    /* expert biases, on both product paths (f32 activations, then 8-bit): gate and up of zero
     * weights give act(bias_gate, bias_up); down of all-ones rows sums it; then bias_down */
    for (int precise = 1; precise >= 0; precise--) {
        setenv("STRATA_PRECISE", precise ? "1" : "0", 1);
        be = backend_cpu_create(1);
        enum { E = 32, F = 64, X = 2 };
        const size_t rg = qt_row_size(QT_Q8_0, E), rd = qt_row_size(QT_Q8_0, F);
        uint8_t *zeros = st_calloc((size_t)X * F * rg, 1), *ones = st_malloc((size_t)X * E * rd);
        float *one_rows = st_malloc((size_t)X * E * F * sizeof(float)), dq[F];
        for (int i = 0; i < X * E * F; i++) one_rows[i] = 1.0f;
        qt_quantize(QT_Q8_0, one_rows, ones, (int64_t)X * E * F);
        qt_dequantize(QT_Q8_0, ones, dq, F); /* 1 as Q8_0 stores it */
        float bg[X * F], bu[X * F], bd[X * E], h[E], y[E];
        for (int i = 0; i < X * F; i++) bg[i] = (float)(i % 9) - 4.5f, bu[i] = (float)(i % 19) - 9.0f;
        for (int i = 0; i < X * E; i++) bd[i] = 0.01f * (float)i;
        for (int i = 0; i < E; i++) h[i] = 1.0f;
        st_weight wg = {zeros, NULL, QT_Q8_0, E, F, X, rg, bg}, wu = wg;
        st_weight wd = {ones, NULL, QT_Q8_0, F, E, X, rd, bd};
        wu.bias = bu;
        const int32_t sel[1] = {1};
        const float wt[1] = {0.5f};
        be->moe_experts(be, h, 1, X, 1, sel, wt, NULL, ST_ACT_SWIGLU_OAI, &wg, &wu, &wd, y);
        double sum = 0, mag = 0, e = 0; /* error relative to sum |terms| (8-bit activations round each) */
        for (int f = 0; f < F; f++) {
            sum += oai(bg[F + f], bu[F + f]) * dq[f];
            mag += fabs(oai(bg[F + f], bu[F + f]));
        }
        for (int i = 0; i < E; i++) e = fmax(e, fabs(y[i] - 0.5 * (sum + bd[E + i])) / (0.5 * mag));
        CHECK(e < (precise ? 1e-6 : 1e-2), "expert biases (precise %d): %.3g relative from expert 1's", precise, e);
        st_free(zeros);
        st_free(ones);
        st_free(one_rows);
        if (precise) be->destroy(be);
    }
    setenv("STRATA_PRECISE", "1", 1);
    be->destroy(be);
}

static void check_model(const char *dir) {
    char path[512];
    snprintf(path, sizeof path, "%s/strata-test-gpt-oss-%d.gguf", dir, (int)getpid());
    engine_params p = family_tiny("gpt-oss", -1, path); /* as published: MXFP4 experts, Q8_0 elsewhere */
    engine *e = engine_open(&p);
    CHECK(e != NULL, "gpt-oss: %s", st_error_get());
    if (!e) return;
    const model_hparams *mh = &e->m->hp;
    CHECK(mh->n_swa == 8 && mh->swa_pattern == 2 && mh->attn_sinks && mh->exps_bias && mh->qkv_bias &&
              mh->act == ST_ACT_SWIGLU_OAI && e->m->rope_freqs && e->m->layers[0].ffn_down_exps.bias &&
              e->m->layers[0].ffn_down_exps.type == QT_MXFP4,
          "gpt-oss hyper-parameters and tensors as written");
    const int nv = mh->n_vocab;
    float *want = st_malloc((size_t)nv * sizeof(float));
    int32_t a[N + 1], b[N + 1];
    family_prompts(nv, N, a, b);
    family_check_batched(e, a, b, N, want, TOL);
    size_t dense, routed;
    const size_t file = family_file_bytes(e, &dense, &routed);
    /* the list also holds the YaRN divisors computed at load (rope_freqs, head_dim / 2 floats), not in the file */
    const size_t yarn = gguf_find_tensor(e->m->file, "rope_freqs.weight") ? 0 : (size_t)mh->head_dim / 2 * 4;
    CHECK(dense + routed == file + yarn, "tensor list %zu + %zu bytes, file tensors %zu + YaRN table %zu", dense,
          routed, file, yarn);
    /* no sinks, or no biased experts (a backend that lacks them): refused, naming both */
    st_backend nosinks = *e->be, nobias = *e->be;
    nosinks.attention_sinks = NULL;
    nosinks.name = "cuda";
    nobias.moe_gatings = ST_GATINGS_SOFTMAX | ST_GATINGS_ALL;
    nobias.name = "cuda";
    CHECK(engine_backend_supports(e->m, e->be) == 0, "the CPU backend runs gpt-oss");
    CHECK(engine_backend_supports(e->m, &nosinks) == -1 && strstr(st_error_get(), "gpt-oss") &&
              strstr(st_error_get(), "cuda backend"),
          "refusal without sinks: %s", st_error_get());
    CHECK(engine_backend_supports(e->m, &nobias) == -1 && strstr(st_error_get(), "gpt-oss"),
          "refusal without biased experts: %s", st_error_get());
    /* the same prompt with the experts split between a 4-slot cache and the CPU lane */
    family_fresh(e, a, N, want);
    engine_close(e);
    family_check_lanes(p, a, N, want, nv, 4, TOL);
    /* with the lanes, the routed experts' biases stay in host memory with
     * their experts (the CPU lane reads them there; the lanes copy them for
     * the device's own pairs): the file's own tensors, not placed as dense
     * vectors (placing them made the CPU lane read device memory on a GPU) */
    p.expert_cache = 4;
    engine *el = engine_open(&p);
    CHECK(el && el->lanes, "lanes engine: %s", el ? "no lanes" : st_error_get());
    if (el) {
        int host = 0, n = 0;
        static const char *const nm[3] = {"ffn_gate_exps", "ffn_up_exps", "ffn_down_exps"};
        for (int il = 0; il < el->m->hp.n_layer; il++) {
            const model_layer *l = &el->m->layers[il];
            const float *b[3] = {l->ffn_gate_exps.bias, l->ffn_up_exps.bias, l->ffn_down_exps.bias};
            for (int i = 0; i < 3; i++, n++) {
                char name[64];
                snprintf(name, sizeof name, "blk.%d.%s.bias", il, nm[i]);
                const gguf_tensor *t = gguf_find_tensor(el->m->file, name);
                host += t && b[i] == t->data;
            }
        }
        CHECK(host == n, "lanes: %d of %d expert biases left in the file's mapping", host, n);
        engine_close(el);
    }
    st_free(want);
    unlink(path);
}

int main(int argc, char **argv) {
    setvbuf(stdout, NULL, _IONBF, 0);
    st_log_set_level(ST_LOG_WARN);
    setenv("STRATA_PRECISE", "1", 1);
    check_ops();
    check_model(argc > 1 ? argv[1] : "/tmp");
    return check_report("test_gpt_oss");
}
