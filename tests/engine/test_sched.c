/* The server's scheduler (server/engine/srv_sched.c) in-process, on the real default
 * model with f32 activations (STRATA_PRECISE=1, where a batched step gives
 * each sequence the same logits as running it alone):
 *
 *   - 7 good requests on 3 slots, submitted at once: 3 start, the others wait and
 *     are admitted as earlier ones finish (different max_tokens, so they end
 *     at different steps); greedy and seeded-temperature sampling mixed.
 *     Every answer's text must equal engine_generate's on its own engine,
 *     one request at a time (the CLI's path).
 *   - one more request whose client "goes away" (its event callback returns
 *     nonzero) at its first text: it must end at once (DONE, at most 2 tokens
 *     generated), count as cancelled, and not change the others' answers.
 *   - one request with a token id outside the vocabulary ends with its own
 *     ERROR, and no other request with it.
 *   - metrics: 7 done, 1 cancelled, 1 failed, 0 busy, 0 queued at the end;
 *     the tokens generated add up.
 *
 * usage: test_sched MODEL.gguf
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/alloc.h"
#include "core/log.h"
#include "server/engine/srv_sched.h"

#define N_REQ     9
#define CANCEL_AT 7 /* the request that goes away */
#define BAD_AT    8 /* a one-token prompt outside the vocabulary: refused alone */

static const char *PROMPTS[N_REQ] = {
    "The capital of France is",
    "List three fruits:",
    "def add(a, b):\n",
    "Once upon a time",
    "The capital of France is the city of", /* shares a prefix with 0: prefix routing */
    "Water boils at",
    "A haiku about the sea:\n",
    "Tell me a long story about a dragon.",
    "",
};
static const int MAX_TOK[N_REQ] = {4, 20, 9, 16, 12, 6, 14, 40, 8};

typedef struct {
    char text[4096];
    size_t len;
    int n_text, done, failed, n_gen;
    char err[256];
} answer;

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t cv = PTHREAD_COND_INITIALIZER;
static answer ans[N_REQ];
static int n_finished;

static int on_event(void *ctx, const srv_event *ev) {
    int i = (int)(intptr_t)ctx;
    answer *a = &ans[i];
    int stop = 0;
    pthread_mutex_lock(&mu);
    switch (ev->kind) {
    case SRV_EV_TEXT:
        ST_ASSERT(a->len + ev->len < sizeof a->text);
        memcpy(a->text + a->len, ev->text, ev->len);
        a->len += ev->len;
        a->n_text++;
        stop = i == CANCEL_AT; /* the client left after its first text */
        break;
    case SRV_EV_DONE:
        a->done = 1;
        a->n_gen = ev->stats->n_gen;
        n_finished++;
        break;
    case SRV_EV_ERROR:
        a->failed = 1;
        snprintf(a->err, sizeof a->err, "%s", ev->error);
        n_finished++;
        break;
    default: break;
    }
    pthread_cond_broadcast(&cv);
    pthread_mutex_unlock(&mu);
    return stop;
}

static int collect(void *ctx, const char *text, size_t len) {
    answer *a = ctx;
    ST_ASSERT(a->len + len < sizeof a->text);
    memcpy(a->text + a->len, text, len);
    a->len += len;
    return 0;
}

static sampler_params params_of(int i) {
    sampler_params sp = sampler_defaults();
    if (i % 2 == 0) sp.temp = 0; /* greedy */
    sp.seed = 1000 + (uint64_t)i;
    return sp;
}

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: test_sched MODEL.gguf\n");
        return 2;
    }
    FILE *f = fopen(argv[1], "rb");
    if (!f) {
        printf("SKIP: %s is missing (scripts/fetch-models.sh)\n", argv[1]);
        return 0;
    }
    fclose(f);
    setenv("STRATA_PRECISE", "1", 1);
    engine_params ep = engine_defaults();
    ep.model_path = argv[1];
    ep.n_ctx = 256;

    /* references: one request at a time on an engine of its own */
    engine *e = engine_open(&ep);
    if (!e) {
        fprintf(stderr, "FAIL: %s\n", st_error_get());
        return 1;
    }
    int32_t *prompt[N_REQ];
    int n_prompt[N_REQ];
    answer ref[N_REQ];
    memset(ref, 0, sizeof ref);
    for (int i = 0; i < N_REQ; i++) {
        if (i == BAD_AT) {
            prompt[i] = st_malloc(sizeof(int32_t));
            prompt[i][0] = e->m->hp.n_vocab + 5;
            n_prompt[i] = 1;
            continue;
        }
        int64_t n = tokenizer_encode(e->tok, PROMPTS[i], strlen(PROMPTS[i]), 1, 0, NULL, 0);
        prompt[i] = st_malloc((size_t)n * sizeof(int32_t));
        tokenizer_encode(e->tok, PROMPTS[i], strlen(PROMPTS[i]), 1, 0, prompt[i], n);
        n_prompt[i] = (int)n;
        if (i == CANCEL_AT) continue;
        sampler_params sp = params_of(i);
        sampler *s = sampler_create(&sp, e->m->hp.n_vocab);
        gen_params gp = {.max_tokens = MAX_TOK[i]};
        gen_stats st;
        ST_ASSERT(engine_generate(e, s, prompt[i], n_prompt[i], &gp, collect, &ref[i], &st) == 0);
        ref[i].n_gen = st.n_gen;
        sampler_free(s);
    }
    engine_close(e);

    srv_sched *sch = sched_create(&ep, 3, 16);
    if (!sch) {
        fprintf(stderr, "FAIL: %s\n", st_error_get());
        return 1;
    }
    srv_request req[N_REQ];
    memset(req, 0, sizeof req);
    for (int i = 0; i < N_REQ; i++) {
        req[i].prompt = prompt[i];
        req[i].n_prompt = n_prompt[i];
        req[i].sp = params_of(i);
        req[i].max_tokens = MAX_TOK[i];
        ST_ASSERT(sched_submit(sch, &req[i], on_event, (void *)(intptr_t)i) == 0);
    }
    pthread_mutex_lock(&mu);
    while (n_finished < N_REQ) pthread_cond_wait(&cv, &mu);
    pthread_mutex_unlock(&mu);

    int fails = 0;
    uint64_t gen_sum = 0;
    for (int i = 0; i < N_REQ; i++) {
        answer *a = &ans[i];
        gen_sum += (uint64_t)a->n_gen;
        if (i == BAD_AT) {
            int ok = a->failed && strstr(a->err, "outside the vocabulary");
            printf("%s: request %d (token id outside the vocabulary) ended with an error: %s\n",
                   ok ? "checked" : "FAIL", i, a->failed ? a->err : "(none)");
            fails += !ok;
            continue;
        }
        if (a->failed) {
            printf("FAIL: request %d ended with an error: %s\n", i, a->err);
            fails++;
            continue;
        }
        if (i == CANCEL_AT) {
            int ok = a->done && a->n_gen <= 2;
            printf("%s: request %d (client gone at its first text) ended with %d generated of %d\n",
                   ok ? "checked" : "FAIL", i, a->n_gen, MAX_TOK[i]);
            fails += !ok;
            continue;
        }
        int ok = a->len == ref[i].len && !memcmp(a->text, ref[i].text, a->len) && a->n_gen == ref[i].n_gen;
        printf("%s: request %d (%s, max %d): %d tokens, text %s engine_generate's alone\n", ok ? "checked" : "FAIL", i,
               i % 2 ? "seeded temperature" : "greedy", MAX_TOK[i], a->n_gen, ok ? "equal to" : "DIFFERENT from");
        if (!ok) printf("  scheduler: %.*s\n  alone:     %.*s\n", (int)a->len, a->text, (int)ref[i].len, ref[i].text);
        fails += !ok;
    }
    sched_metrics m;
    for (int tries = 0;; tries++) { /* the slot is counted free just after its terminal event */
        sched_metrics_get(sch, &m);
        if (m.busy == 0 || tries == 100) break;
        usleep(10000);
    }
    int ok = m.done == N_REQ - 2 && m.cancelled == 1 && m.failed == 1 && m.busy == 0 && m.queued == 0 &&
             m.gen_tokens == gen_sum;
    printf("%s: metrics done %llu, cancelled %llu, failed %llu, busy %d, queued %d, generated %llu "
           "(sum %llu)\n",
           ok ? "checked" : "FAIL", (unsigned long long)m.done, (unsigned long long)m.cancelled,
           (unsigned long long)m.failed, m.busy, m.queued, (unsigned long long)m.gen_tokens,
           (unsigned long long)gen_sum);
    fails += !ok;
    sched_free(sch);
    for (int i = 0; i < N_REQ; i++) st_free(prompt[i]);
    printf("%s\n", fails ? "FAILED" : "OK");
    return fails ? 1 : 0;
}
