/* backend_prof (backend_prof.h): a tiny synth qwen3moe model run through the
 * CPU backend plainly and through the profiling wrapper must give bit-equal
 * logits (the wrapper only forwards), and the wrapper's table must count
 * each op as often as the forward pass calls it: per layer one qkv_prep,
 * attention, moe_ffn, matmul_multi (q, k, v) and matmul_res_norm (o, the
 * residual, the FFN norm, the router), and rmsnorm once (the attention norm,
 * the last layer's add instead: one add); per token chunk one get_rows, plus
 * the output norm and product. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend_prof.h"
#include "core/alloc.h"
#include "core/log.h"
#include "engine/kv_cache.h"
#include "model/forward.h"
#include "model/synth.h"

static int count_of(const char *table, const char *op) {
    char key[32];
    snprintf(key, sizeof key, "\n%s ", op);
    const char *l = strstr(table, key);
    return l ? atoi(l + strlen(key)) : -1;
}

static void run(st_backend *be, const model *m, const int32_t *toks, int n, float *logits) {
    model_ctx *c = model_ctx_create(m, be, 8);
    kv_cache *kv = kv_cache_create(be, &m->hp, 32, ST_KV_F16);
    model_forward(c, kv->layers, toks, n, 0, logits, 0);                 /* one chunk of n */
    model_forward(c, kv->layers, toks, 1, n, logits + m->hp.n_vocab, 0); /* one decode step */
    kv_cache_free(kv);
    model_ctx_free(c);
}

int main(void) {
    synth_hparams hp;
    synth_opts o;
    ST_ASSERT(synth_preset("qwen3moe", "tiny", &hp) == 0);
    synth_opts_init(&o, &hp);
    char path[] = "/tmp/strata_prof_XXXXXX";
    int fd = mkstemp(path);
    ST_ASSERT(fd >= 0);
    ST_ASSERT(synth_write(&o, path) == 0);
    model *m = model_load(path);
    ST_ASSERT(m);
    const int nv = m->hp.n_vocab, L = m->hp.n_layer, n = 5;
    int32_t toks[5] = {1, 17, 42, 99, 7};
    float *a = st_malloc(2 * (size_t)nv * sizeof(float)), *b = st_malloc(2 * (size_t)nv * sizeof(float));

    st_backend *plain = backend_cpu_create(1);
    run(plain, m, toks, n, a);
    plain->destroy(plain);

    st_backend *prof = backend_prof_wrap(backend_cpu_create(1));
    run(prof, m, toks, n, b);
    char table[2048];
    backend_prof_report(prof, table, sizeof table);
    printf("%s", table);
    prof->destroy(prof);

    int fails = 0;
    if (memcmp(a, b, 2 * (size_t)nv * sizeof(float)) != 0) {
        printf("FAIL: logits through the wrapper differ from the plain backend's\n");
        fails++;
    } else {
        printf("ok: logits of a %d-token chunk and a decode step bit-equal with and without the wrapper\n", n);
    }
    /* two forward calls (the chunk and the step): per call L layers + the output head */
    struct {
        const char *op;
        int want;
    } want[] = {{"qkv_prep", 2 * L},        {"attention", 2 * L}, {"moe_ffn", 2 * L},
                {"rmsnorm", 2 * (L + 1)},   {"matmul", 2},        {"matmul_multi", 2 * L},
                {"matmul_res_norm", 2 * L}, {"add", 2},           {"get_rows", 2}};
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) {
        int got = count_of(table, want[i].op);
        printf("%s %s: %d calls (expected %d)\n", got == want[i].want ? "ok:" : "FAIL:", want[i].op, got, want[i].want);
        fails += got != want[i].want;
    }
    st_free(a);
    st_free(b);
    model_free(m);
    remove(path);
    printf("%s\n", fails ? "FAILED" : "passed");
    return fails != 0;
}
