/* MTP drafts (--draft mtp) on the GPU: the tiny synthetic file of each
 * family with a multi-token prediction block (strata synth --mtp, F32
 * weights: neither side rounds its activations), the whole model and the
 * block placed on GPU 0, against the CPU engine and against plain decoding
 * on the GPU.
 *   - the block's logits at every position of a 20-token prompt
 *     (engine_seq_mtp_logits: the block reads the main model's hidden
 *     states, so the prompt's pass and the block's catch-up both count):
 *     NMSE of the centred logits against the CPU engine's within 1e-5
 *     (the backends sum floats in other orders; test_cuda_family's bound
 *     for F32);
 *   - greedy generations with MTP drafts (three prompts, test_mtp's) give
 *     the plain GPU generation's tokens, or first differ at a near-tie (top-2 gap below 1e-3: a
 *     verify pass's batched products and the one-token ones sum in other
 *     orders), with drafts accepted and rejected (a logit bias lifts a
 *     few tokens so that the random block guesses some right: the same
 *     ones as tests/engine/test_mtp.c, 4 from id 40 for the hybrids, 2
 *     from id 60 for the others; with 2 from 60 the qwen35moe file's
 *     drafts were all rejected, 0 of 12, with 4 from 40 one qwen3next
 *     prompt's, 0 of 12: the counts are summed over the prompts).
 * Both with the whole model on the GPU and with the routed experts apart
 * (--expert-cache: the expert lanes; the block is placed whole on the GPU,
 * its MoE passed through).
 *
 * No GPU: prints SKIPPED and exits 0.
 * usage: test_cuda_mtp [DIR for the temporary models, default /tmp]
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "backend/cuda/device.h"
#include "core/alloc.h"
#include "core/log.h"
#include "engine/engine.h"
#include "model/synth.h"
#include "quant/blocks.h"

#include "../common/check.h"
#include "../common/gen_run.h"
#include "../common/logits.h"

#define N_PROMPT 20
#define N_GEN    32

static int n_lift, lift0; /* the lifted tokens of the family under test: check_family's */
static const float LIFT[4] = {8, 8, 8, 8};

static engine *open_engine(const char *path, int gpu, int expert_cache) {
    engine_params p = engine_defaults();
    p.model_path = path;
    p.n_ctx = 256;
    p.n_threads = 2;
    p.gpu = gpu;
    p.expert_cache = expert_cache;
    p.draft_mtp = 1;
    return engine_open(&p);
}

typedef struct {
    int32_t t[N_GEN];
    float gap[N_GEN]; /* top-2 gap of the lifted tokens' biased logits */
    int n;
} collected;

static int on_token(void *ctx, int32_t t, const float *raw) {
    collected *c = ctx;
    ST_ASSERT(c->n < N_GEN);
    float best = -INFINITY, second = -INFINITY;
    for (int i = 0; i < n_lift; i++) {
        const float v = raw ? raw[lift0 + i] + LIFT[i] : 0;
        if (v > best) second = best, best = v;
        else if (v > second) second = v;
    }
    c->gap[c->n] = raw ? best - second : INFINITY;
    c->t[c->n++] = t;
    return GEN_GO;
}

static void generate(engine *e, const int32_t *prompt, int mtp, collected *c, gen_stats *st) {
    engine_seq *s = gen_read_new(e, prompt, N_PROMPT);
    sampler_params sp = sampler_defaults();
    sp.temp = 0.0f;
    const int32_t lifted[4] = {lift0, lift0 + 1, lift0 + 2, lift0 + 3};
    sp.n_bias = n_lift;
    sp.bias_ids = lifted;
    sp.bias_vals = LIFT;
    sampler *smp = sampler_create(&sp, e->m->hp.n_vocab);
    memset(c, 0, sizeof *c);
    const gen_hooks hk = {.token = on_token, .ctx = c};
    const gen_params gp = {.max_tokens = N_GEN, .ignore_eos = 1, .draft_n = mtp ? 6 : 0, .draft_mtp = mtp};
    gen_state *g = gen_begin(e, s, smp, prompt, N_PROMPT, &gp, &hk, gen_ignore_text, NULL);
    gen_run_to_end(e, s, g, mtp ? 6 : 0);
    gen_end(g, st);
    sampler_free(smp);
    engine_seq_free(e, s);
}

/* On GPU engine g (where: its placement, for the messages): the block's
 * logits against the CPU engine's, and drafted against plain generation. */
static void check_gpu(engine *cpu, engine *g, const char *arch, const char *where) {
    int32_t prompt[N_PROMPT];
    for (int i = 0; i < N_PROMPT; i++) prompt[i] = 30 + 7 * (i % 6); /* a phrase of 6 tokens, repeated */
    const int nv = cpu->m->hp.n_vocab;
    float *lc = st_malloc((size_t)N_PROMPT * nv * sizeof(float)),
          *lg = st_malloc((size_t)N_PROMPT * nv * sizeof(float));
    engine_seq *sc = gen_read_new(cpu, prompt, N_PROMPT), *sg = gen_read_new(g, prompt, N_PROMPT);
    CHECK(engine_seq_mtp_logits(cpu, sc, 0, N_PROMPT, lc) == 0 && engine_seq_mtp_logits(g, sg, 0, N_PROMPT, lg) == 0,
          "%s, %s: the block's logits: %s", arch, where, st_error_get());
    double worst = 0, rms;
    for (int i = 0; i < N_PROMPT; i++)
        worst = fmax(worst, logits_nmse(lg + (size_t)i * nv, lc + (size_t)i * nv, nv, &rms));
    printf("%s, %s: the MTP block's logits at %d positions, NMSE against the CPU at most %.2e (bound 1e-5)\n", arch,
           where, N_PROMPT, worst);
    CHECK(worst <= 1e-5, "%s, %s: the block's logits, NMSE %.3g against the CPU's", arch, where, worst);
    engine_seq_free(cpu, sc);
    engine_seq_free(g, sg);
    st_free(lc);
    st_free(lg);

    /* three prompts (test_mtp's): drafts accepted and rejected summed over them */
    int32_t prompts[3][N_PROMPT];
    for (int i = 0; i < N_PROMPT; i++) {
        prompts[0][i] = prompt[i];
        prompts[1][i] = (i * 37 + 11) % 500;      /* no repetition */
        prompts[2][i] = lift0 + (i * i) % n_lift; /* the lifted tokens */
    }
    int acc = 0, rej = 0;
    for (int q = 0; q < 3; q++) {
        collected plain, drafted;
        gen_stats st0, st1;
        generate(g, prompts[q], 0, &plain, &st0);
        generate(g, prompts[q], 1, &drafted, &st1);
        int first = -1;
        for (int i = 0; i < plain.n && i < drafted.n && first < 0; i++)
            if (plain.t[i] != drafted.t[i]) first = i;
        const int tie = first >= 0 && plain.gap[first] < 1e-3f;
        acc += st1.drafts_accepted;
        rej += st1.drafts_total - st1.drafts_accepted;
        printf("%s, %s, prompt %d: %d tokens with MTP drafts, %d plain, first difference %d%s; %d of %d drafted "
               "tokens accepted\n",
               arch, where, q, drafted.n, plain.n, first, tie ? " (a near-tie)" : "", st1.drafts_accepted,
               st1.drafts_total);
        CHECK(plain.n == N_GEN && drafted.n == N_GEN && (first < 0 || tie),
              "%s, %s, prompt %d: the drafted generation differs from the plain one at %d (gap %.3g)", arch, where, q,
              first, first >= 0 ? plain.gap[first] : 0.0);
    }
    CHECK(acc > 0 && rej > 0, "%s, %s: %d drafted tokens accepted, %d rejected", arch, where, acc, rej);
}

static void check_family(const char *arch, const char *dir) {
    char path[512];
    snprintf(path, sizeof path, "%s/strata-test-cuda-mtp-%s-%d.gguf", dir, arch, (int)getpid());
    synth_hparams hp;
    ST_ASSERT(synth_preset(arch, "tiny", &hp) == 0);
    const int hybrid = !strncmp(arch, "qwen3", 5);
    n_lift = hybrid ? 4 : 2;
    lift0 = hybrid ? 40 : 60;
    hp.n_nextn = 1;
    synth_opts o;
    synth_opts_init(&o, &hp);
    o.type_default = QT_F32;
    ST_ASSERT(synth_write(&o, path) == 0);

    engine *cpu = open_engine(path, -1, -1);
    CHECK(cpu != NULL, "%s on the CPU: %s", arch, st_error_get());
    /* the whole model on the GPU; the routed experts apart, a quarter of them cached (the expert lanes) */
    const struct {
        int cache;
        const char *where;
    } places[] = {{-1, "whole on the GPU"}, {hp.n_layer * hp.n_expert / 4, "a quarter of the experts cached"}};
    for (size_t i = 0; cpu && i < sizeof places / sizeof places[0]; i++) {
        engine *g = open_engine(path, 0, places[i].cache);
        CHECK(g && g->lanes == (places[i].cache >= 0), "%s, %s: %s", arch, places[i].where,
              g ? "the lanes not as asked" : st_error_get());
        if (g) {
            check_gpu(cpu, g, arch, places[i].where);
            engine_close(g);
        }
    }
    if (cpu) engine_close(cpu);
    unlink(path);
}

int main(int argc, char **argv) {
    setvbuf(stdout, NULL, _IONBF, 0);
    st_log_set_level(ST_LOG_WARN);
    if (gpu_device_count() == 0) {
        printf("SKIPPED: no CUDA device\n");
        return 0;
    }
    const char *dir = argc > 1 ? argv[1] : "/tmp";
    static const char *const archs[] = {"qwen35moe", "qwen3next", "deepseek2", "glm4moe"};
    for (size_t a = 0; a < sizeof archs / sizeof archs[0]; a++) check_family(archs[a], dir);
    return check_report("test_cuda_mtp");
}
