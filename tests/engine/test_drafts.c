/* Speculative decoding on the hybrid family (qwen35moe, qwen3next): a verify
 * pass of drafted tokens advances every DeltaNet layer's state over all of
 * them, and the rejected ones must be taken back out (engine_seq_truncate,
 * kv_cache_spec_keep: the state saved before the pass, the kept tokens'
 * recurrence replayed). Tiny synthetic models, f32 activations
 * (STRATA_PRECISE=1), so that a batched product rounds as a one-token one.
 * Checked:
 *   - for every cut of a 6-token verify pass (1 to 6 tokens kept), each
 *     recurrent layer's convolution window and state equal, byte for byte,
 *     those of a sequence that was fed only the kept tokens one at a time,
 *     and the next token's logits are that sequence's;
 *   - a verify pass that nothing cuts back is kept whole when the sequence
 *     moves on (the next logits equal the plain sequence's);
 *   - whole generations (gen_next_drafted against gen_next) give the same
 *     tokens, greedy and sampled with a seed, with a logit bias that makes
 *     the text repeat itself so that drafts are partly accepted and partly
 *     rejected (both counted, each > 0);
 *   - so do three sequences drafting in the same batched steps
 *     (engine_step_drafts, gen_verify per sequence: the server's way).
 *
 * usage: test_drafts [DIR for the temporary models, default /tmp]
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/alloc.h"
#include "core/log.h"
#include "engine/engine.h"
#include "engine/kv_cache.h"
#include "model/synth.h"

#include "../common/check.h"
#include "../common/gen_run.h"

#define N_GEN 48 /* tokens generated per run */

static double maxdiff(const float *a, const float *b, int n) {
    double m = 0;
    for (int i = 0; i < n; i++) m = fmax(m, fabs((double)a[i] - b[i]));
    return m;
}

/* 1 when every recurrent layer of a and b holds the same bytes (the CPU backend: host memory). */
static int same_state(const kv_cache *a, const kv_cache *b) {
    for (int il = 0; il < a->n_layer; il++) {
        const st_kv_layer *x = &a->layers[il], *y = &b->layers[il];
        if (!x->ssm) continue;
        if (memcmp(x->conv, y->conv, a->conv_bytes) || memcmp(x->ssm, y->ssm, a->ssm_bytes)) return 0;
    }
    return 1;
}

/* Every cut of a verify pass against the sequence fed only the kept tokens. */
static void check_cuts(engine *e, const char *arch, const int32_t *prompt, int n_prompt) {
    const int nv = e->m->hp.n_vocab, n = 6;
    const int32_t toks[6] = {11, 12, 13, 14, 15, 16}, next = 21;
    float *all = st_malloc((size_t)n * nv * sizeof(float)), *want = st_malloc((size_t)nv * sizeof(float));
    for (int keep = 1; keep <= n; keep++) {
        engine_seq *a = gen_read_new(e, prompt, n_prompt), *b = gen_read_new(e, prompt, n_prompt);
        const int base = a->n_past;
        ST_ASSERT(engine_seq_eval_all(e, a, toks, n, all) == 0);
        engine_seq_truncate(a, base + keep);
        for (int i = 0; i < keep; i++) ST_ASSERT(engine_seq_eval(e, b, &toks[i], 1) == 0);
        CHECK(a->n_past == b->n_past, "%s: cut to %d: n_past %d, want %d", arch, keep, a->n_past, b->n_past);
        CHECK(same_state(a->kv, b->kv), "%s: cut to %d of %d: the recurrent state differs from the plain one", arch,
              keep, n);
        /* the pass's own logits at the kept positions: the plain decoder's last ones */
        const double dl = maxdiff(all + (size_t)(keep - 1) * nv, b->logits, nv);
        CHECK(dl == 0, "%s: cut to %d: the pass's logits differ by %g", arch, keep, dl);
        ST_ASSERT(engine_seq_eval(e, a, &next, 1) == 0);
        ST_ASSERT(engine_seq_eval(e, b, &next, 1) == 0);
        const double d = maxdiff(a->logits, b->logits, nv);
        CHECK(d == 0, "%s: cut to %d: the next logits differ by %g", arch, keep, d);
        engine_seq_free(e, a);
        engine_seq_free(e, b);
    }
    /* a pass left uncut: the next evaluation keeps it whole */
    engine_seq *a = gen_read_new(e, prompt, n_prompt), *b = gen_read_new(e, prompt, n_prompt);
    ST_ASSERT(engine_seq_eval_all(e, a, toks, n, all) == 0);
    ST_ASSERT(engine_seq_eval(e, a, &next, 1) == 0);
    ST_ASSERT(engine_seq_eval(e, b, toks, n) == 0);
    ST_ASSERT(engine_seq_eval(e, b, &next, 1) == 0);
    memcpy(want, b->logits, (size_t)nv * sizeof(float));
    CHECK(maxdiff(a->logits, want, nv) == 0 && same_state(a->kv, b->kv), "%s: an uncut pass is not kept whole", arch);
    engine_seq_free(e, a);
    engine_seq_free(e, b);
    st_free(all);
    st_free(want);
}

/* A random model seldom repeats itself, and prompt lookup drafts only what
 * repeats. The sampler's logit bias (the same in both runs: part of
 * sampling) lifts four tokens far above the rest, so the text is a sequence
 * over those four that the model's logits pick, the same pairs come back,
 * and their drafts are sometimes right and sometimes wrong. */
static sampler *new_sampler(engine *e, float temp) {
    static const int32_t lifted[4] = {40, 41, 42, 43};
    static const float lift[4] = {8, 8, 8, 8};
    sampler_params sp = sampler_defaults();
    sp.temp = temp;
    sp.seed = 7;
    sp.n_bias = 4;
    sp.bias_ids = lifted;
    sp.bias_vals = lift;
    return sampler_create(&sp, e->m->hp.n_vocab);
}

/* N_GEN tokens after prompt on a fresh sequence, as engine_generate decodes
 * (draft_n 0: one token per step); returns how many, stats in st. */
static int generate(engine *e, const int32_t *prompt, int n_prompt, float temp, int draft_n, int32_t *out,
                    gen_stats *st) {
    engine_seq *s = gen_read_new(e, prompt, n_prompt);
    sampler *smp = new_sampler(e, temp);
    gen_tokens c = {out, 0, N_GEN};
    const gen_hooks hk = {.token = gen_tokens_on_token, .ctx = &c};
    const gen_params gp = {.max_tokens = N_GEN, .ignore_eos = 1};
    gen_state *g = gen_begin(e, s, smp, prompt, n_prompt, &gp, &hk, gen_ignore_text, NULL);
    gen_run_to_end(e, s, g, draft_n);
    gen_end(g, st);
    sampler_free(smp);
    engine_seq_free(e, s);
    return c.n;
}

/* Three sequences drafting in the same steps, as the server's scheduler
 * runs its slots (gen_draft, one engine_step_drafts, gen_verify each):
 * each must give its plain tokens (want[i]); drafted counts in acc, rej. */
#define N_SEQ 3
static void check_batched(engine *e, const char *arch, int32_t prompts[N_SEQ][18], float temp,
                          int32_t want[N_SEQ][N_GEN], int *acc, int *rej) {
    engine_seq *seq[N_SEQ];
    sampler *smp[N_SEQ];
    gen_state *g[N_SEQ];
    int32_t got[N_SEQ][N_GEN], next[N_SEQ], toks[N_SEQ * 9];
    gen_tokens c[N_SEQ];
    int live[N_SEQ], ntok[N_SEQ];
    const gen_params gp = {.max_tokens = N_GEN, .ignore_eos = 1};
    for (int i = 0; i < N_SEQ; i++) {
        seq[i] = gen_read_new(e, prompts[i], 18);
        smp[i] = new_sampler(e, temp);
        c[i] = (gen_tokens){got[i], 0, N_GEN};
        const gen_hooks hk = {.token = gen_tokens_on_token, .ctx = &c[i]};
        g[i] = gen_begin(e, seq[i], smp[i], prompts[i], 18, &gp, &hk, gen_ignore_text, NULL);
        live[i] = gen_next(g[i], &next[i]) == 0;
    }
    gen_drafted_steps(e, seq, g, next, live, N_SEQ, 8, toks, ntok);
    for (int i = 0; i < N_SEQ; i++) {
        gen_stats st;
        gen_end(g[i], &st);
        *acc += st.drafts_accepted;
        *rej += st.drafts_total - st.drafts_accepted;
        CHECK(c[i].n == N_GEN && !memcmp(got[i], want[i], sizeof got[i]),
              "%s temp %.1f: sequence %d of a drafted batch: other tokens than its plain run", arch, temp, i);
        sampler_free(smp[i]);
        engine_seq_free(e, seq[i]);
    }
}

static void check_model(const char *arch, const char *dir) {
    char path[512];
    snprintf(path, sizeof path, "%s/strata-test-drafts-%s-%d.gguf", dir, arch, (int)getpid());
    synth_hparams hp;
    ST_ASSERT(synth_preset(arch, "tiny", &hp) == 0);
    synth_opts o;
    synth_opts_init(&o, &hp);
    ST_ASSERT(synth_write(&o, path) == 0);
    engine_params p = engine_defaults();
    p.model_path = path;
    p.n_ctx = 256;
    p.n_threads = 2;
    engine *e = engine_open(&p);
    CHECK(e != NULL, "%s: %s", arch, st_error_get());
    if (!e) return;
    CHECK(e->kv->recurrent && engine_drafts_ok(e), "%s: a recurrent cache that can roll back", arch);
    int32_t prompt[160];
    for (int i = 0; i < 18; i++) /* a phrase of 6 tokens, 3 times */
        prompt[i] = 30 + 7 * (i % 6);
    check_cuts(e, arch, prompt, 18);

    int32_t plain[N_GEN], drafted[N_GEN];
    gen_stats st0, st1;
    const float temps[2] = {0.0f, 0.8f}; /* greedy, and sampled with a seed */
    for (int k = 0; k < 2; k++) {
        const int n0 = generate(e, prompt, 18, temps[k], 0, plain, &st0);
        const int n1 = generate(e, prompt, 18, temps[k], 8, drafted, &st1);
        int first = -1; /* the first position where they differ */
        for (int i = 0; i < n0 && i < n1 && first < 0; i++)
            if (plain[i] != drafted[i]) first = i;
        CHECK(n0 == N_GEN && n1 == n0 && first < 0, "%s temp %.1f: %d and %d tokens, first difference at %d", arch,
              temps[k], n0, n1, first);
        CHECK(st0.drafts_total == 0, "%s: drafts without drafting", arch);
        const int acc = st1.drafts_accepted, rej = st1.drafts_total - st1.drafts_accepted;
        CHECK(acc > 0 && rej > 0, "%s temp %.1f: %d drafted tokens accepted, %d rejected", arch, temps[k], acc, rej);
        printf("%s temp %.1f: %d tokens, the plain ones with drafts; %d drafted tokens accepted, "
               "%d rejected\n",
               arch, temps[k], n1, acc, rej);
    }
    /* three sequences (the phrase shifted) drafting in shared steps */
    int32_t prompts[N_SEQ][18], want[N_SEQ][N_GEN];
    for (int k = 0; k < 2; k++) {
        for (int q = 0; q < N_SEQ; q++) {
            for (int i = 0; i < 18; i++) prompts[q][i] = 30 + 7 * (i % 6) + q;
            ST_ASSERT(generate(e, prompts[q], 18, temps[k], 0, want[q], &st0) == N_GEN);
        }
        int acc = 0, rej = 0;
        check_batched(e, arch, prompts, temps[k], want, &acc, &rej);
        CHECK(acc > 0 && rej > 0, "%s temp %.1f batched: %d accepted, %d rejected", arch, temps[k], acc, rej);
        printf("%s temp %.1f: %d sequences drafting in shared steps, their plain tokens; %d drafted "
               "tokens accepted, %d rejected\n",
               arch, temps[k], N_SEQ, acc, rej);
    }
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
    return check_report("test_drafts");
}
