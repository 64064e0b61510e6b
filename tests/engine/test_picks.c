/* What a batched step keeps of each sequence's logits (engine_step's picks,
 * model_forward_batch): two engines on the same file step the same
 * sequences with the same tokens, one with every row's logits copied (the
 * reference), the other with picks: the k largest (k 1 and 40), a
 * temperature's draw, and nothing (its logits whole). Also a step whose
 * prompt chunk has its own logits row (the picks shift by one) and a step of
 * one sequence alone.
 *
 * On a backend with top_k and draw (a GPU) every asked pick must be made
 * there (rc 0): the k ids in order, each value the reference's logit at that
 * id, none left out larger than the k-th; the drawn id inside the interval
 * of the reference's running sum that u * sum falls in (within float
 * rounding of the sum). Without them (the CPU) every pick falls back (rc 1)
 * and the logits come whole. A row not picked equals the reference's row.
 *
 * usage: test_picks MODEL.gguf [--gpu N]
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/alloc.h"
#include "core/log.h"
#include "engine/engine.h"

#include "../common/check.h"
#include "../common/gpu.h"
#include "../common/logits.h"

#define N_SEQ  4 /* decoding together; one more reads a prompt chunk in the first step */
#define N_STEP 6

static engine *open_engine(const char *path, int gpu) {
    engine_params p = engine_defaults();
    p.model_path = path;
    p.gpu = gpu;
    p.n_ctx = 128;
    p.n_threads = 2;
    p.n_seq = N_SEQ + 1;
    engine *e = engine_open(&p);
    if (!e) fprintf(stderr, "test_picks: %s\n", st_error_get());
    return e;
}

/* The largest |x| of a row: the scale of the comparisons' tolerance. */
static float absmax(const float *x, int n) {
    float m = 0.0f;
    for (int i = 0; i < n; i++) m = fabsf(x[i]) > m ? fabsf(x[i]) : m;
    return m;
}

/* Two rows equal within 1e-4 of the reference's largest |logit| (the GPU's
 * two engines run the same kernels; the CPU's give the same bits). */
static int same_row(const float *a, const float *ref, int n) {
    const float tol = 1e-4f * absmax(ref, n);
    for (int i = 0; i < n; i++)
        if (!(fabsf(a[i] - ref[i]) <= tol)) return 0;
    return 1;
}

/* A top-k pick against the reference row. */
static void check_top(const char *what, const model_pick *p, const float *ref, int nv) {
    const float tol = 1e-4f * absmax(ref, nv);
    int ok = 1;
    for (int i = 0; i < p->k && ok; i++) {
        ok = p->ids[i] >= 0 && p->ids[i] < nv && fabsf(p->vals[i] - ref[p->ids[i]]) <= tol &&
             (i == 0 || p->vals[i] <= p->vals[i - 1]);
        for (int j = 0; j < i && ok; j++) ok = p->ids[j] != p->ids[i];
    }
    CHECK(ok, "%s: the k = %d pick's ids or values do not match the reference row", what, p->k);
    int above = 0; /* ids left out whose logit passes the k-th */
    for (int i = 0; i < nv && ok; i++) {
        int in = 0;
        for (int j = 0; j < p->k && !in; j++) in = p->ids[j] == i;
        above += !in && ref[i] > p->vals[p->k - 1] + tol;
    }
    CHECK(above == 0, "%s: %d ids outside the k = %d pick have larger logits", what, above, p->k);
}

/* A draw against the reference row: tok's interval of the running sum of
 * exp((x - max) * inv_t) holds u * sum, within float rounding. */
static void check_draw(const char *what, const model_pick *p, const float *ref, int nv) {
    const int t = *p->tok;
    CHECK(t >= 0 && t < nv, "%s: drawn id %d", what, t);
    if (t < 0 || t >= nv) return;
    const float mx = ref[logits_argmax(ref, nv, NULL)];
    double sum = 0.0, lo = 0.0, hi = 0.0;
    for (int i = 0; i < nv; i++) {
        if (i == t) lo = sum;
        sum += exp((double)(ref[i] - mx) * p->inv_t);
        if (i == t) hi = sum;
    }
    const double at = p->u * sum, slack = 1e-5 * sum;
    CHECK(at >= lo - slack && at <= hi + slack, "%s: u * sum %.6g outside id %d's interval [%.6g, %.6g]", what, at, t,
          lo, hi);
}

int main(int argc, char **argv) {
    setvbuf(stdout, NULL, _IONBF, 0);
    st_log_set_level(ST_LOG_WARN);
    if (argc < 2) {
        fprintf(stderr, "usage: test_picks MODEL.gguf [--gpu N]\n");
        return 2;
    }
    const int gpu = argc > 3 && !strcmp(argv[2], "--gpu") ? atoi(argv[3]) : -1;
    if (gpu >= 0 && !gpu_present(gpu)) {
        printf("SKIPPED: no CUDA device %d\n", gpu);
        return 0;
    }
    engine *ref = open_engine(argv[1], gpu), *pk = open_engine(argv[1], gpu);
    if (!ref || !pk) return 1;
    const int nv = ref->m->hp.n_vocab;
    const int device = pk->be->top_k && pk->be->draw; /* the picks are made on the backend */
    printf("%s on %s: picks %s\n", argv[1], gpu < 0 ? "the CPU" : "the GPU",
           device ? "made on the backend" : "not offered (every row copied)");

    engine_seq *rs[N_SEQ + 1], *ps[N_SEQ + 1];
    int32_t prompt[48];
    for (int q = 0; q <= N_SEQ; q++) {
        const int n = q < N_SEQ ? 6 + 3 * q : 40; /* the last one reads its prompt as a chunk of the first step */
        for (int i = 0; i < n; i++) prompt[i] = (int32_t)((i * 7919 + 13 + 101 * q) % nv);
        rs[q] = engine_seq_new(ref);
        ps[q] = engine_seq_new(pk);
        if (q < N_SEQ) {
            ST_ASSERT(engine_seq_read_prompt(ref, rs[q], prompt, n) >= 0);
            ST_ASSERT(engine_seq_read_prompt(pk, ps[q], prompt, n) >= 0);
        }
    }
    int32_t chunk[40];
    for (int i = 0; i < 40; i++) chunk[i] = (int32_t)((i * 7919 + 13 + 101 * N_SEQ) % nv);

    int32_t tok[N_SEQ], ids1[1], ids40[40], drawn = -1;
    float vals1[1], vals40[40];
    for (int t = 0; t < N_STEP; t++) {
        for (int q = 0; q < N_SEQ; q++) tok[q] = logits_argmax(rs[q]->logits, nv, NULL); /* both continue greedily */
        const double u = (t + 0.5) / N_STEP;
        model_pick picks[N_SEQ] = {
            {.k = 1, .ids = ids1, .vals = vals1},
            {.k = 40, .ids = ids40, .vals = vals40},
            {.inv_t = t % 2 ? 1.0f : 1.0f / 0.7f, .u = u, .tok = &drawn},
            {0}, /* nothing asked: logits whole */
        };
        const int alone = t == N_STEP - 1; /* the last step: the first sequence alone */
        const int n = alone ? 1 : N_SEQ;
        engine_seq *rd = t == 0 ? rs[N_SEQ] : NULL, *pd = t == 0 ? ps[N_SEQ] : NULL;
        const engine_chunk rc = {rd, chunk, 40}, pc = {pd, chunk, 40};
        ST_ASSERT(engine_step(ref, rd ? &rc : NULL, rd != NULL, 1, rs, tok, n, NULL) == 0);
        ST_ASSERT(engine_step(pk, pd ? &pc : NULL, pd != NULL, 1, ps, tok, n, picks) == 0);
        char what[96];
        for (int q = 0; q < n; q++) {
            model_pick *p = &picks[q];
            const int asked = p->k > 0 || p->inv_t > 0.0f;
            snprintf(what, sizeof what, "step %d%s, sequence %d", t,
                     rd      ? " (with a chunk)"
                     : alone ? " (alone)"
                             : "",
                     q);
            CHECK(p->rc == !(device && asked), "%s: rc %d, asked %d, backend picks %d", what, p->rc, asked, device);
            if (p->rc) {
                CHECK(same_row(ps[q]->logits, rs[q]->logits, nv), "%s: the whole logits differ from the reference",
                      what);
            } else if (p->k > 0) {
                check_top(what, p, rs[q]->logits, nv);
            } else {
                check_draw(what, p, rs[q]->logits, nv);
            }
        }
        if (rd) CHECK(same_row(ps[N_SEQ]->logits, rs[N_SEQ]->logits, nv), "step 0: the chunk's logits differ");
    }
    for (int q = 0; q <= N_SEQ; q++) {
        engine_seq_free(ref, rs[q]);
        engine_seq_free(pk, ps[q]);
    }
    engine_close(ref);
    engine_close(pk);
    return check_report("test_picks");
}
