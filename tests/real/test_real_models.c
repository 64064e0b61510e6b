/* Real models against the transformers reference recorded from the same GGUF
 * (tests/data/ref/NAME.json, made by tools/make_hf_reference.py).
 *
 * 1. Greedy: for 5 fixed prompts (token ids from the reference tokenizer),
 *    32 greedy tokens must equal the reference's, or the first difference
 *    must be a near-tie: the reference's top-2 logit gap at that step below
 *    NEAR_TIE. At least 20 tokens must match before any difference.
 *    (Issue 3 asks for >= 20 equal tokens or a divergence at a near-tie.)
 * 2. Teacher forcing over 1000 positions of a fixed text: the top-1 token
 *    must agree with the reference at >= 99% of positions.
 * transformers runs the dequantized weights in f32. Strata's integer dot
 * products quantize activations to 8 bits (as llama.cpp does), which moves
 * logits by a few percent of their spread on these small models, enough to
 * flip near-ties. So the test runs in two modes:
 *   --precise  (STRATA_PRECISE=1: f32 activations) isolates everything else
 *              in the forward pass: >= 99% teacher-forced agreement is
 *              required there (the greedy part is skipped: too slow);
 *   default    the engine as it runs: greedy with the near-tie rule, and
 *              agreement >= --min-agree (set per model from measurement).
 */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/alloc.h"
#include "core/log.h"
#include "engine/engine.h"

#include "../common/logits.h"

#define NEAR_TIE  0.5 /* logits: a reference gap below this is a near-tie */
#define MIN_MATCH 20

static int32_t *ids_of(json_t *arr, size_t *n) {
    *n = json_array_size(arr);
    int32_t *v = st_malloc((*n + 1) * sizeof(int32_t));
    for (size_t i = 0; i < *n; i++) v[i] = (int32_t)json_integer_value(json_array_get(arr, i));
    return v;
}

int main(int argc, char **argv) {
    double min_agree = 0.99;
    int precise = 0;
    for (int i = 3; i < argc; i++) {
        if (!strcmp(argv[i], "--precise")) precise = 1;
        else if (!strcmp(argv[i], "--min-agree") && i + 1 < argc) min_agree = atof(argv[++i]);
        else argc = 0;
    }
    if (argc < 3) {
        fprintf(stderr, "usage: test_real_models MODEL.gguf REF.json [--precise] [--min-agree F]\n");
        return 2;
    }
    if (precise) setenv("STRATA_PRECISE", "1", 1);
    printf("mode: %s activations, top-1 agreement required >= %.1f%%\n", precise ? "f32 (precise)" : "8-bit",
           100 * min_agree);
    if (access(argv[1], R_OK) != 0) {
        printf("SKIPPED: %s is absent (scripts/fetch-models.sh fetches it)\n", argv[1]);
        return 0;
    }
    json_error_t jerr;
    json_t *ref = json_load_file(argv[2], 0, &jerr);
    if (!ref) {
        fprintf(stderr, "cannot read %s: %s\n", argv[2], jerr.text);
        return 1;
    }
    engine_params ep = engine_defaults();
    ep.model_path = argv[1];
    ep.n_ctx = 1100;
    engine *e = engine_open(&ep);
    if (!e) {
        fprintf(stderr, "%s\n", st_error_get());
        return 1;
    }
    int nv = e->m->hp.n_vocab, failures = 0;

    /* precise mode dequantizes every weight row on every call: its greedy
     * runs (one token per call) would take minutes, and teacher forcing
     * already compares every position, so it checks only that */
    json_t *prompts = json_object_get(ref, "prompts");
    for (size_t p = 0; !precise && p < json_array_size(prompts); p++) {
        json_t *pr = json_array_get(prompts, p);
        size_t n, ng;
        int32_t *ids = ids_of(json_object_get(pr, "ids"), &n);
        int32_t *want = ids_of(json_object_get(pr, "greedy"), &ng);
        json_t *gaps = json_object_get(pr, "gaps");
        e->n_past = 0;
        engine_eval(e, ids, (int)n);
        int match = 0, diverged = -1;
        float our_gap = 0;
        for (size_t i = 0; i < ng; i++) {
            int32_t t = logits_argmax(e->logits, nv, &our_gap);
            if (t != want[i]) {
                diverged = (int)i;
                break;
            }
            match++;
            engine_eval(e, &t, 1);
        }
        const char *verdict = "equal";
        if (diverged >= 0) {
            double ref_gap = json_real_value(json_array_get(gaps, (size_t)diverged));
            int ok = ref_gap < NEAR_TIE || match >= MIN_MATCH;
            verdict = ok ? (ref_gap < NEAR_TIE ? "near-tie" : "ok (>= 20 equal)") : "FAIL";
            printf("prompt %zu: %d/%zu equal, diverged at %d (reference gap %.3f, ours %.3f): %s\n", p, match, ng,
                   diverged, ref_gap, our_gap, verdict);
            failures += !ok;
        } else printf("prompt %zu: %d/%zu equal: %s\n", p, match, ng, verdict);
        st_free(ids);
        st_free(want);
    }

    json_t *tf = json_object_get(ref, "tf");
    size_t n_ids, n_arg;
    int32_t *ids = ids_of(json_object_get(tf, "ids"), &n_ids);
    int32_t *want = ids_of(json_object_get(tf, "argmax"), &n_arg);
    json_t *gaps = json_object_get(tf, "gaps");
    const int CH = 50;
    float *logits = st_malloc((size_t)CH * nv * sizeof(float));
    size_t agree = 0, near_ties = 0;
    for (size_t i = 0; i < n_arg; i += CH) {
        int n = (int)(n_arg - i < (size_t)CH ? n_arg - i : (size_t)CH);
        model_forward(e->mc, e->kv->layers, ids + i, n, (int)i, logits, 1);
        for (int j = 0; j < n; j++) {
            int32_t t = logits_argmax(logits + (size_t)j * nv, nv, NULL);
            if (t == want[i + j]) agree++;
            else if (json_real_value(json_array_get(gaps, i + j)) < NEAR_TIE) near_ties++;
        }
    }
    double rate = (double)agree / (double)n_arg;
    printf("teacher forcing: top-1 agrees at %zu of %zu positions (%.2f%%; %zu of the %zu differences are near-ties)\n",
           agree, n_arg, 100 * rate, near_ties, n_arg - agree);
    if (rate < min_agree) {
        printf("FAIL: agreement below %.1f%%\n", 100 * min_agree);
        failures++;
    }
    st_free(logits);
    st_free(ids);
    st_free(want);
    json_decref(ref);
    engine_close(e);
    printf("%s\n", failures ? "FAILED" : "PASSED");
    return failures != 0;
}
