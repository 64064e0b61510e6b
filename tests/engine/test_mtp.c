/* Speculative decoding with drafts from the model's multi-token prediction
 * block (--draft mtp, engine_mtp.c) on tiny synthetic qwen35moe, qwen3next,
 * deepseek2 and glm4moe files written with the block (synth --mtp), f32 activations
 * (STRATA_PRECISE=1), so that a batched product rounds as a one-token one.
 * Checked:
 *   - whole generations with MTP drafts give the plain decoder's tokens, for
 *     three prompts, greedy and sampled with a seed, with a logit bias that
 *     lifts four tokens above the rest (so that the random block's guesses,
 *     which see the same bias, are sometimes right): drafts accepted and
 *     rejected (both counted, each > 0); greedy without the bias too;
 *   - the block's cache stays consistent with the rejections: after a
 *     drafted generation (and after a next prompt that extends it, the chat
 *     case), the block's K/V rows of every position and its logits at the
 *     last one are byte-equal to those of a fresh sequence fed the same
 *     tokens as a prompt;
 *   - three sequences drafting in shared batched steps (engine_step_drafts,
 *     gen_verify each: the server's way), one's prompt read as a step's
 *     chunk beside the others' drafts: their plain tokens, and block caches
 *     equal to fresh sequences';
 *   - after an evaluation that keeps no hidden state (the top-k decode step)
 *     the sequence drafts nothing (rather than from a stale row);
 *   - with the routed experts apart (--expert-cache: the expert lanes, here
 *     on two CPU backends, the seam the GPU uses), the block placed whole
 *     on the "device" and its MoE passed through: the lanes' plain tokens
 *     with drafts, some accepted;
 *   - the main model ignores the block: the plain tokens of an engine opened
 *     without --draft mtp are the same; a file without the block loads and
 *     runs, and --draft mtp on it is refused with a message; so is --draft
 *     mtp with a layer split (--devices cpu,cpu);
 *   - the memory plan (engine_plan_input) with --draft mtp grows by the
 *     block's own weights (the bytes of the file's blk.{n_layer}.* tensors:
 *     the head and embedding it shares with the model are not counted
 *     again), its cache layer for each sequence and its input rows.
 * The block's arithmetic is checked against NumPy in tests/ref/test_mtp.py.
 *
 * usage: test_mtp [DIR for the temporary models, default /tmp]
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/alloc.h"
#include "core/log.h"
#include "engine/engine.h"
#include "engine/engine_offload.h"
#include "engine/engine_place.h"
#include "engine/kv_cache.h"
#include "gguf/gguf.h"
#include "model/synth.h"

#include "../common/check.h"
#include "../common/gen_run.h"

#define N_GEN 32 /* tokens generated per run */

/* With lift, the sampler's logit bias lifts four tokens far above the rest (as tests/engine/test_drafts.c):
 * the text is a sequence over them, and the drafts, which add the same bias, pick among them too. */
static int n_lift = 4, lift0 = 40; /* how many of them, from which id: check_model's */
static sampler *new_sampler(engine *e, float temp, int lift) {
    const int32_t lifted[4] = {lift0, lift0 + 1, lift0 + 2, lift0 + 3};
    static const float by[4] = {8, 8, 8, 8};
    sampler_params sp = sampler_defaults();
    sp.temp = temp;
    sp.seed = 7;
    sp.n_bias = lift ? n_lift : 0;
    sp.bias_ids = lifted;
    sp.bias_vals = by;
    return sampler_create(&sp, e->m->hp.n_vocab);
}

/* N_GEN tokens after prompt on a fresh sequence, plain (mtp 0) or with MTP drafts of up to 6 tokens;
 * returns the sequence (the caller frees it), tokens in out, stats in st. */
static engine_seq *generate(engine *e, const int32_t *prompt, int n_prompt, float temp, int lift, int mtp, int32_t *out,
                            gen_stats *st) {
    engine_seq *s = gen_read_new(e, prompt, n_prompt);
    sampler *smp = new_sampler(e, temp, lift);
    gen_tokens c = {out, 0, N_GEN};
    const gen_hooks hk = {.token = gen_tokens_on_token, .ctx = &c};
    const gen_params gp = {.max_tokens = N_GEN, .ignore_eos = 1, .draft_n = mtp ? 6 : 0, .draft_mtp = mtp};
    gen_state *g = gen_begin(e, s, smp, prompt, n_prompt, &gp, &hk, gen_ignore_text, NULL);
    gen_run_to_end(e, s, g, mtp ? 6 : 0);
    gen_end(g, st);
    ST_ASSERT(c.n == N_GEN);
    sampler_free(smp);
    return s;
}

/* The block's cache rows and its logits at the last position of a, against a fresh sequence fed a's tokens. */
static void check_consistent(engine *e, const char *what, engine_seq *a) {
    const model_hparams *hp = &e->m->hp;
    const int n = a->n_past, nv = hp->n_vocab;
    float *la = st_malloc((size_t)nv * sizeof(float)), *lb = st_malloc((size_t)nv * sizeof(float));
    engine_seq *b = gen_read_new(e, a->hist, n);
    ST_ASSERT(engine_seq_mtp_logits(e, a, n - 1, 1, la) == 0);
    ST_ASSERT(engine_seq_mtp_logits(e, b, n - 1, 1, lb) == 0);
    const st_kv_layer *x = &a->kv->layers[hp->n_layer], *y = &b->kv->layers[hp->n_layer];
    const size_t row = (size_t)hp->n_head_kv * hp->head_dim * 2; /* f16 */
    int bad = -1;
    for (int p = 0; p < n && bad < 0; p++)
        if (memcmp((const char *)x->k + p * row, (const char *)y->k + p * row, row) ||
            memcmp((const char *)x->v + p * row, (const char *)y->v + p * row, row))
            bad = p;
    CHECK(bad < 0, "%s: the MTP block's cache row of position %d differs from a fresh sequence's (%d positions)", what,
          bad, n);
    CHECK(!memcmp(la, lb, (size_t)nv * sizeof(float)), "%s: the MTP block's logits at position %d differ", what, n - 1);
    engine_seq_free(e, b);
    st_free(la);
    st_free(lb);
}

/* Three sequences drafting in shared batched steps, as the server's scheduler runs its slots
 * (engine_step_drafts, gen_verify each), the third one's prompt read as the chunk of the first step:
 * each gives its plain tokens (want[i]) and keeps a block cache equal to a fresh sequence's. */
#define N_SEQ 3
static void check_batched(engine *e, const char *arch, int32_t prompts[N_SEQ][20], int32_t want[N_SEQ][N_GEN], int *acc,
                          int *rej) {
    engine_seq *seq[N_SEQ];
    sampler *smp[N_SEQ];
    gen_state *g[N_SEQ] = {0};
    int32_t got[N_SEQ][N_GEN], next[N_SEQ], toks[N_SEQ * 7];
    gen_tokens c[N_SEQ];
    int live[N_SEQ], ntok[N_SEQ];
    const gen_params gp = {.max_tokens = N_GEN, .ignore_eos = 1, .draft_mtp = 1};
    for (int i = 0; i < N_SEQ; i++) {
        seq[i] = i < N_SEQ - 1 ? gen_read_new(e, prompts[i], 20) : engine_seq_new(e);
        smp[i] = new_sampler(e, 0.0f, 1);
        c[i] = (gen_tokens){got[i], 0, N_GEN};
    }
    for (int i = 0; i < N_SEQ; i++) {
        const gen_hooks hk = {.token = gen_tokens_on_token, .ctx = &c[i]};
        if (i == N_SEQ - 1) { /* its prompt but the last token: the chunk of a step in which the others draft */
            int rows = 0;
            for (int k = 0; k < N_SEQ - 1; k++) {
                ntok[k] = gen_draft(g[k], next[k], 6, toks + rows);
                rows += ntok[k];
            }
            const float *logits;
            const engine_chunk ch = {seq[i], prompts[i], 19};
            ST_ASSERT(engine_step_drafts(e, &ch, 1, seq, toks, ntok, N_SEQ - 1, &logits) == 0);
            for (int k = 0, r = 0; k < N_SEQ - 1; r += ntok[k], k++)
                live[k] = gen_verify(g[k], &next[k], toks + r, ntok[k], logits + (size_t)r * e->m->hp.n_vocab) == 0;
            ST_ASSERT(engine_seq_eval(e, seq[i], &prompts[i][19], 1) == 0);
        }
        g[i] = gen_begin(e, seq[i], smp[i], prompts[i], 20, &gp, &hk, gen_ignore_text, NULL);
        live[i] = gen_next(g[i], &next[i]) == 0;
    }
    gen_drafted_steps(e, seq, g, next, live, N_SEQ, 6, toks, ntok);
    for (int i = 0; i < N_SEQ; i++) {
        gen_stats st;
        gen_end(g[i], &st);
        *acc += st.drafts_accepted;
        *rej += st.drafts_total - st.drafts_accepted;
        CHECK(c[i].n == N_GEN && !memcmp(got[i], want[i], sizeof got[i]),
              "%s: sequence %d of a drafted batch: other tokens than its plain run", arch, i);
        char what[64];
        snprintf(what, sizeof what, "%s batched, sequence %d", arch, i);
        check_consistent(e, what, seq[i]);
        sampler_free(smp[i]);
        engine_seq_free(e, seq[i]);
    }
}

static engine *open_engine(const char *path, int mtp, int expert_cache) {
    engine_params p = engine_defaults();
    p.model_path = path;
    p.n_ctx = 256;
    p.n_threads = 2;
    p.draft_mtp = mtp;
    p.expert_cache = expert_cache;
    return engine_open(&p);
}

static void check_model(const char *arch, const char *dir) {
    /* the lifted tokens: a random block guesses some of the greedy ones right with these (with 4 from id
     * 40, none of deepseek2's greedy drafts was taken, so the accepting path went unchecked there) */
    const int hybrid = strstr(arch, "qwen") != NULL;
    n_lift = hybrid ? 4 : 2;
    lift0 = hybrid ? 40 : 60;
    char path[512], bare[512];
    snprintf(path, sizeof path, "%s/strata-test-mtp-%s-%d.gguf", dir, arch, (int)getpid());
    snprintf(bare, sizeof bare, "%s/strata-test-mtp-bare-%s-%d.gguf", dir, arch, (int)getpid());
    synth_hparams hp;
    ST_ASSERT(synth_preset(arch, "tiny", &hp) == 0);
    synth_opts o;
    synth_opts_init(&o, &hp);
    ST_ASSERT(synth_write(&o, bare) == 0);
    o.hp.n_nextn = 1;
    ST_ASSERT(synth_write(&o, path) == 0);

    /* a file without the block: runs plain, refuses --draft mtp */
    engine *e = open_engine(bare, 1, -1);
    CHECK(!e && strstr(st_error_get(), "no usable multi-token prediction block"),
          "%s: --draft mtp on a file without "
          "the block: %s",
          arch, e ? "opened" : st_error_get());
    if (e) engine_close(e);
    { /* a layer split (two CPU ranks): refused, before the plan or any placement */
        engine_params p = engine_defaults();
        p.model_path = path;
        p.n_ctx = 256;
        p.n_threads = 2;
        p.draft_mtp = 1;
        p.devices = "cpu,cpu";
        engine *es = engine_open(&p);
        CHECK(!es && strstr(st_error_get(), "not a layer split"), "%s: --draft mtp with a layer split: %s", arch,
              es ? "opened" : st_error_get());
        if (es) engine_close(es);
    }
    { /* the memory plan with --draft mtp: the block's own weights (not the head or embedding it shares),
       * its cache layer per sequence, its input rows; nothing without it */
        model *m = model_load(path);
        ST_ASSERT(m && m->mtp);
        engine_params p = engine_defaults();
        p.n_seq = 3;
        expert_plan_in a, b;
        engine_plan_input(&p, m, 256, 64, (size_t)1 << 30, &a);
        p.draft_mtp = 1;
        engine_plan_input(&p, m, 256, 64, (size_t)1 << 30, &b);
        const size_t blk = engine_mtp_bytes(m), hp_e = (size_t)m->hp.n_embd,
                     layer = kv_cache_range_bytes(&m->hp, 256, p.kv_type, m->hp.n_layer, m->hp.n_layer + 1);
        /* the block's own tensors as the file has them: blk.{n_layer}.* (its head and embedding are the model's) */
        size_t own = 0;
        char pre[32];
        snprintf(pre, sizeof pre, "blk.%d.", m->hp.n_layer);
        for (int64_t i = 0; i < gguf_n_tensors(m->file); i++) {
            const gguf_tensor *t = gguf_tensor_at(m->file, i);
            if (!strncmp(t->name, pre, strlen(pre))) own += t->size;
        }
        CHECK(blk == own && b.dense - a.dense == blk && b.kv - a.kv == 3 * layer &&
                  b.scratch - a.scratch == 64 * 2 * hp_e * 4,
              "%s: the plan with --draft mtp: dense +%zu (block %zu, its tensors in the file %zu), kv +%zu (3 x %zu), "
              "scratch +%zu",
              arch, b.dense - a.dense, blk, own, b.kv - a.kv, layer, b.scratch - a.scratch);
        model_free(m);
    }
    int32_t prompts[3][20], plain[N_GEN], drafted[N_GEN], plain0[N_GEN];
    for (int i = 0; i < 20; i++) {
        prompts[0][i] = 30 + 7 * (i % 6);    /* a phrase of 6 tokens, repeated */
        prompts[1][i] = (i * 37 + 11) % 500; /* no repetition */
        prompts[2][i] = 40 + (i * i) % 4;    /* the lifted tokens */
    }
    gen_stats st0, st1;
    e = open_engine(bare, 0, -1);
    CHECK(e != NULL, "%s: the file without the block: %s", arch, e ? "" : st_error_get());
    if (e) {
        engine_seq_free(e, generate(e, prompts[0], 20, 0.0f, 1, 0, plain, &st0));
        engine_close(e);
    }

    engine *e0 = open_engine(path, 0, -1);
    e = open_engine(path, 1, -1);
    CHECK(e && e0, "%s: %s", arch, st_error_get());
    if (!e || !e0) return;
    CHECK(e->m->mtp && e->kv->n_layer == e->m->hp.n_layer + 1, "%s: the block and its cache layer", arch);
    const float temps[2] = {0.0f, 0.8f};
    for (int k = 0; k < 2; k++) {
        int acc = 0, rej = 0;
        for (int q = 0; q < 3; q++) {
            engine_seq_free(e, generate(e, prompts[q], 20 - 4 * q, temps[k], 1, 0, plain, &st0));
            if (q == 0) {
                engine_seq_free(e0, generate(e0, prompts[q], 20 - 4 * q, temps[k], 1, 0, plain0, &st0));
                CHECK(!memcmp(plain0, plain, sizeof plain), "%s temp %.1f: the block changed the plain tokens", arch,
                      temps[k]);
            }
            engine_seq *s = generate(e, prompts[q], 20 - 4 * q, temps[k], 1, 1, drafted, &st1);
            int first = -1;
            for (int i = 0; i < N_GEN && first < 0; i++)
                if (plain[i] != drafted[i]) first = i;
            CHECK(first < 0, "%s temp %.1f prompt %d: MTP drafts changed token %d", arch, temps[k], q, first);
            acc += st1.drafts_accepted;
            rej += st1.drafts_total - st1.drafts_accepted;
            char what[96];
            snprintf(what, sizeof what, "%s temp %.1f prompt %d", arch, temps[k], q);
            check_consistent(e, what, s);
            if (q == 0 && k == 0) { /* a next prompt that extends the history (a chat's next turn) */
                int32_t *next = st_malloc((size_t)(s->n_past + 5) * sizeof(int32_t));
                memcpy(next, s->hist, (size_t)s->n_past * sizeof(int32_t));
                for (int i = 0; i < 5; i++) next[s->n_past + i] = 100 + i;
                const int n_next = s->n_past + 5;
                CHECK(engine_seq_read_prompt(e, s, next, n_next) == n_next - 5, "%s: the history reused", arch);
                strcat(what, ", extended");
                check_consistent(e, what, s);
                st_free(next);
            }
            engine_seq_free(e, s);
        }
        CHECK(acc > 0 && rej > 0, "%s temp %.1f: %d drafted tokens accepted, %d rejected", arch, temps[k], acc, rej);
        printf("%s temp %.1f, 3 prompts: the plain tokens with MTP drafts; %d drafted tokens accepted, %d "
               "rejected\n",
               arch, temps[k], acc, rej);
    }
    /* a path that keeps no hidden state (the top-k decode step): the sequence drafts nothing after it */
    engine_seq *u = gen_read_new(e, prompts[0], 20);
    int32_t ids[4], d[4];
    float vals[4];
    CHECK(engine_seq_draft_mtp(e, u, 50, 4, NULL, d) == 4, "%s: drafts after a prompt", arch);
    ST_ASSERT(engine_seq_eval_top_k(e, u, 50, 4, ids, vals) >= 0);
    CHECK(engine_seq_draft_mtp(e, u, 51, 4, NULL, d) == 0, "%s: drafts from a hidden state that was not kept", arch);
    engine_seq_free(e, u);
    /* three sequences drafting in shared steps (the server's way), one's prompt read in a step */
    {
        int32_t want[N_SEQ][N_GEN];
        int acc = 0, rej = 0;
        for (int q = 0; q < N_SEQ; q++) engine_seq_free(e, generate(e, prompts[q], 20, 0.0f, 1, 0, want[q], &st0));
        check_batched(e, arch, prompts, want, &acc, &rej);
        CHECK(acc > 0 && rej > 0, "%s batched: %d drafted tokens accepted, %d rejected", arch, acc, rej);
        printf("%s: %d sequences drafting in shared steps, their plain tokens; %d drafted tokens accepted, %d "
               "rejected\n",
               arch, N_SEQ, acc, rej);
    }
    /* greedy without the bias: the random block seldom guesses right, the tokens are the same */
    engine_seq_free(e, generate(e, prompts[1], 20, 0.0f, 0, 0, plain, &st0));
    engine_seq *s = generate(e, prompts[1], 20, 0.0f, 0, 1, drafted, &st1);
    CHECK(!memcmp(plain, drafted, sizeof plain), "%s greedy, no bias: MTP drafts changed the tokens", arch);
    check_consistent(e, "no bias", s);
    printf("%s greedy without a bias: the plain tokens; %d of %d drafted tokens accepted\n", arch, st1.drafts_accepted,
           st1.drafts_total);
    engine_seq_free(e, s);
    engine_close(e);
    engine_close(e0);
    /* the experts apart, a quarter of them cached: the block's MoE is not the lanes' */
    e = open_engine(path, 1, hp.n_layer * hp.n_expert / 4);
    CHECK(e && e->lanes, "%s: --draft mtp with the expert lanes: %s", arch, e ? "no lanes" : st_error_get());
    if (e) {
        engine_seq_free(e, generate(e, prompts[0], 20, 0.0f, 1, 0, plain, &st0));
        s = generate(e, prompts[0], 20, 0.0f, 1, 1, drafted, &st1);
        CHECK(!memcmp(plain, drafted, sizeof plain) && st1.drafts_accepted > 0,
              "%s, expert lanes: MTP drafts changed the tokens, or none was accepted (%d of %d)", arch,
              st1.drafts_accepted, st1.drafts_total);
        check_consistent(e, "expert lanes", s);
        printf("%s with the expert lanes: the plain tokens with MTP drafts; %d of %d drafted tokens accepted\n", arch,
               st1.drafts_accepted, st1.drafts_total);
        engine_seq_free(e, s);
        engine_close(e);
    }
    unlink(path);
    unlink(bare);
}

int main(int argc, char **argv) {
    setvbuf(stdout, NULL, _IONBF, 0);
    st_log_set_level(ST_LOG_WARN);
    setenv("STRATA_PRECISE", "1", 1);
    const char *dir = argc > 1 ? argv[1] : "/tmp";
    check_model("qwen35moe", dir);
    check_model("qwen3next", dir);
    check_model("deepseek2", dir);
    check_model("glm4moe", dir);
    return check_report("test_mtp");
}
