/* The hybrid family's (qwen35moe, qwen3next) recurrent state in the engine:
 * a synthetic tiny model of each, run with f32 activations (STRATA_PRECISE=1)
 * so that the only differences left are the order of float sums.
 *
 * A DeltaNet layer's state describes the whole history, so prefix reuse may
 * keep it only when the new prompt extends the sequence exactly where it
 * stopped, or extends the state saved after the last prompt chunk
 * (engine_seq_reuse_prefix, kv_cache_checkpoint). Checked against a fresh
 * sequence:
 *   - a prompt extending the history reuses it, and its logits are the fresh
 *     sequence's (the state carried over is the right one);
 *   - a prompt diverging inside the history and a shorter one reuse nothing
 *     and give the fresh logits (no stale state survives);
 *   - the same prompt again (whose last token must be read again), and the
 *     next chat turn after a generated answer that the new prompt does not
 *     repeat token for token, restart from the saved state (all but the
 *     prompt's last token), with the fresh logits;
 *   - a batched decode step of two sequences (engine_decode_batch) gives each
 *     sequence's own single-step logits (each reads its own state);
 *   - the routed experts through the expert lanes (a CPU backend playing the
 *     GPU with 4 cached experts, engine/moe_lanes.c) give the plain logits;
 *   - the tensor list covers every byte of the file's tensors;
 *   - a backend without the DeltaNet op (a CUDA one named so here) is
 *     refused with a message naming the family and the backend.
 *
 * usage: test_hybrid [DIR for the temporary models, default /tmp]
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
#include "model/synth.h"

#include "../common/check.h"

#define N   20
#define TOL 1e-4 /* max |a - b| of logits of std ~1: float summation order only */

static double maxdiff(const float *a, const float *b, int n) {
    double m = 0;
    for (int i = 0; i < n; i++) m = fmax(m, fabs((double)a[i] - b[i]));
    return m;
}

/* Logits of a fresh sequence that reads prompt. */
static void fresh(engine *e, const int32_t *prompt, int n, float *out) {
    engine_seq *s = engine_seq_new(e);
    ST_ASSERT(engine_seq_read_prompt(e, s, prompt, n) == 0);
    memcpy(out, s->logits, (size_t)e->m->hp.n_vocab * sizeof(float));
    engine_seq_free(e, s);
}

static void check_model(const char *arch, const char *dir) {
    char path[512];
    snprintf(path, sizeof path, "%s/strata-test-hybrid-%s-%d.gguf", dir, arch, (int)getpid());
    synth_hparams hp;
    ST_ASSERT(synth_preset(arch, "tiny", &hp) == 0);
    synth_opts o;
    synth_opts_init(&o, &hp);
    o.type_default = 8; /* Q8_0: routing far from ties, products close to f32 */
    ST_ASSERT(synth_write(&o, path) == 0);
    engine_params p = engine_defaults();
    p.model_path = path;
    p.n_ctx = 64;
    p.n_threads = 2;
    p.n_ubatch = 8; /* prompts cross chunk boundaries */
    engine *e = engine_open(&p);
    CHECK(e != NULL, "%s: %s", arch, st_error_get());
    if (!e) return;
    CHECK(e->kv->recurrent, "%s: the cache has recurrent layers", arch);
    const int nv = e->m->hp.n_vocab;
    float *want = st_malloc((size_t)nv * sizeof(float));
    int32_t a[N + 4], b[N];
    for (int i = 0; i < N + 4; i++) a[i] = (int32_t)((i * 7919 + 13) % nv);
    memcpy(b, a, sizeof b);
    b[N / 2] = (b[N / 2] + 1) % nv; /* diverges at N/2 */

    engine_seq *s = engine_seq_new(e);
    ST_ASSERT(engine_seq_read_prompt(e, s, a, N) == 0);
    /* extends the history: reused, and the state carried over gives the fresh logits */
    int r = engine_seq_read_prompt(e, s, a, N + 4);
    fresh(e, a, N + 4, want);
    CHECK(r == N, "%s: a prompt extending the history reuses %d of %d", arch, r, N);
    CHECK(maxdiff(s->logits, want, nv) < TOL, "%s: extended prompt %.3g from fresh", arch,
          maxdiff(s->logits, want, nv));
    /* diverging inside the history, shorter: nothing reused; the same again: the
     * saved state (all but the last token); always the fresh logits */
    const struct {
        const int32_t *t;
        int n, reuse;
        const char *what;
    } cases[] = {{b, N, 0, "diverging"}, {a, N / 2, 0, "shorter"}, {a, N / 2, N / 2 - 1, "the same"}};
    for (int c = 0; c < 3; c++) {
        r = engine_seq_read_prompt(e, s, cases[c].t, cases[c].n);
        fresh(e, cases[c].t, cases[c].n, want);
        CHECK(r == cases[c].reuse, "%s: %s prompt reuses %d, expected %d", arch, cases[c].what, r, cases[c].reuse);
        CHECK(maxdiff(s->logits, want, nv) < TOL, "%s: %s prompt %.3g from fresh", arch, cases[c].what,
              maxdiff(s->logits, want, nv));
    }
    /* a chat's next turn: the answer decoded token by token, then a prompt that
     * repeats the first prompt but not the answer: restarts at the saved state */
    {
        engine_seq *t = engine_seq_new(e);
        ST_ASSERT(engine_seq_read_prompt(e, t, a, N) == 0);
        for (int32_t g = 5; g < 8; g++) ST_ASSERT(engine_seq_eval(e, t, &g, 1) == 0);
        int32_t c2[N + 4];
        memcpy(c2, a, N * sizeof(int32_t));
        for (int i = 0; i < 4; i++) c2[N + i] = 9 + i;
        r = engine_seq_read_prompt(e, t, c2, N + 4);
        fresh(e, c2, N + 4, want);
        CHECK(r == N - 1, "%s: next chat turn reuses %d, expected %d", arch, r, N - 1);
        CHECK(maxdiff(t->logits, want, nv) < TOL, "%s: next chat turn %.3g from fresh", arch,
              maxdiff(t->logits, want, nv));
        engine_seq_free(e, t);
    }
    /* two sequences decoded in one batched step, each against its own single step */
    engine_seq *s2 = engine_seq_new(e);
    ST_ASSERT(engine_seq_read_prompt(e, s2, b, N) == 0);
    engine_seq *pair[2] = {s, s2};
    const int32_t next[2] = {5, 6};
    ST_ASSERT(engine_decode_batch(e, pair, next, 2) == 0);
    for (int q = 0; q < 2; q++) {
        int32_t t[N + 1];
        memcpy(t, q ? b : a, (size_t)(q ? N : N / 2) * sizeof(int32_t));
        const int n = q ? N : N / 2;
        t[n] = next[q];
        fresh(e, t, n + 1, want);
        CHECK(maxdiff(pair[q]->logits, want, nv) < TOL, "%s: batched step, sequence %d: %.3g from fresh", arch, q,
              maxdiff(pair[q]->logits, want, nv));
    }
    engine_seq_free(e, s2);
    engine_seq_free(e, s);
    /* every tensor byte is in the list that placement and the memory plan walk */
    size_t routed = 0, file = 0;
    const size_t dense = engine_weight_bytes(e->m, &routed);
    for (int64_t i = 0; i < gguf_n_tensors(e->m->file); i++) file += gguf_tensor_at(e->m->file, i)->size;
    CHECK(dense + routed == file, "%s: tensor list %zu + %zu bytes, file tensors %zu", arch, dense, routed, file);
    /* the same prompt with the experts split between a cache and the CPU lane */
    fresh(e, a, N, want);
    p.expert_cache = 4;
    engine *el = engine_open(&p);
    CHECK(el && el->lanes, "%s: lanes engine: %s", arch, el ? "no lanes" : st_error_get());
    if (el) {
        ST_ASSERT(engine_read_prompt(el, a, N) == 0);
        CHECK(maxdiff(el->logits, want, nv) < TOL, "%s: expert lanes %.3g from plain", arch,
              maxdiff(el->logits, want, nv));
        engine_close(el);
    }
    /* a backend lacking the op is refused, with a message naming both */
    st_backend lacking = *e->be;
    lacking.gated_delta_net = NULL;
    lacking.name = "cuda";
    CHECK(engine_backend_supports(e->m, e->be) == 0, "%s: the CPU backend has the ops", arch);
    CHECK(engine_backend_supports(e->m, &lacking) == -1 && strstr(st_error_get(), arch) &&
              strstr(st_error_get(), "cuda backend lacks"),
          "%s: refusal: %s", arch, st_error_get());
    st_free(want);
    engine_close(e);
    unlink(path);
}

int main(int argc, char **argv) {
    setvbuf(stdout, NULL, _IONBF, 0);
    st_log_set_level(ST_LOG_WARN);
    setenv("STRATA_PRECISE", "1", 1);
    const char *dir = argc > 1 ? argv[1] : "/tmp";
    check_model("qwen35moe", dir);
    check_model("qwen3next", dir);
    return check_report("test_hybrid");
}
