/* strata synth writes a layer's tensors from the model's own tensor table
 * (model_tensors.c) under the hyper-parameters synth_model_hparams says the
 * loader will read from the file. This checks that claim against the
 * loader: for every family's tiny preset (and the variants the presets do
 * not cover: deepseek2 without the q bottleneck, glm4moe and deepseek2
 * without a leading dense layer), the file is written, loaded, and every
 * table condition and every shape dimension synth used must be the
 * loader's, layer by layer; and the file must hold exactly the table's
 * rows (plus the embedding, output norm and output), no tensor more, so
 * that llama.cpp's count of tensors agrees too.
 *
 * usage: test_synth_plan [DIR for the temporary files, default /tmp]
 */
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "core/log.h"
#include "model/model.h"
#include "model/synth.h"

#include "../common/check.h"

#define N_DIMS (MD_O_MLA + 1)
#define N_WHEN (MW_EXPS_BIAS + 1)

static void check_case(const char *dir, const char *arch, const char *what, synth_hparams hp) {
    char path[512];
    snprintf(path, sizeof path, "%s/strata-test-synth-plan-%d.gguf", dir, (int)getpid());
    synth_opts o;
    synth_opts_init(&o, &hp);
    if (synth_write(&o, path) != 0) {
        CHECK(0, "%s %s: synth: %s", arch, what, st_error_get());
        return;
    }
    model *m = model_load(path);
    CHECK(m != NULL, "%s %s: load: %s", arch, what, st_error_get());
    if (!m) {
        unlink(path);
        return;
    }
    model_hparams mine;
    synth_model_hparams(&hp, &mine);
    int bad_dim = 0, bad_when = 0;
    for (int d = 0; d < N_DIMS; d++)
        if (model_dim_size(&mine, (model_dim)d) != model_dim_size(&m->hp, (model_dim)d)) {
            printf("  %s %s: dimension %d: synth %lld, loader %lld\n", arch, what, d,
                   (long long)model_dim_size(&mine, (model_dim)d), (long long)model_dim_size(&m->hp, (model_dim)d));
            bad_dim++;
        }
    long rows = 0;
    for (int il = 0; il < m->hp.n_layer; il++) {
        for (int w = 0; w < N_WHEN; w++)
            if (model_has_tensor(&mine, il, (model_when)w) != model_has_tensor(&m->hp, il, (model_when)w)) {
                printf("  %s %s: layer %d condition %d: synth %d, loader %d\n", arch, what, il, w,
                       model_has_tensor(&mine, il, (model_when)w), model_has_tensor(&m->hp, il, (model_when)w));
                bad_when++;
            }
        for (int t = 0; t < MODEL_N_LAYER_TENSORS; t++)
            rows += model_has_tensor(&m->hp, il, MODEL_LAYER_TENSORS[t].when);
    }
    CHECK(!bad_dim && !bad_when, "%s %s: %d dimensions and %d layer conditions differ from the loader's", arch, what,
          bad_dim, bad_when);
    const long n_file = (long)gguf_n_tensors(m->file);
    CHECK(n_file == rows + 3, "%s %s: %ld tensors in the file, the table binds %ld + 3", arch, what, n_file, rows);
    printf("  %-9s %-22s %3ld tensors, the loader's %d layers bind every one\n", arch, what, n_file, m->hp.n_layer);
    model_free(m);
    unlink(path);
}

int main(int argc, char **argv) {
    setvbuf(stdout, NULL, _IONBF, 0);
    st_log_set_level(ST_LOG_WARN);
    const char *dir = argc > 1 ? argv[1] : "/tmp";
    const char *archs[] = {"qwen3moe", "qwen35moe", "qwen3next", "glm4moe", "deepseek2", "gpt-oss"};
    for (size_t i = 0; i < sizeof archs / sizeof archs[0]; i++) {
        synth_hparams hp;
        ST_ASSERT(synth_preset(archs[i], "tiny", &hp) == 0);
        check_case(dir, archs[i], "tiny", hp);
    }
    synth_hparams hp;
    ST_ASSERT(synth_preset("deepseek2", "tiny", &hp) == 0);
    hp.q_lora = 0; /* a plain attn_q (DeepSeek-V2-Lite) */
    check_case(dir, "deepseek2", "tiny, no q_lora", hp);
    hp.n_dense_lead = 0;
    check_case(dir, "deepseek2", "tiny, no dense layer", hp);
    ST_ASSERT(synth_preset("glm4moe", "tiny", &hp) == 0);
    hp.n_dense_lead = 0;
    check_case(dir, "glm4moe", "tiny, no dense layer", hp);
    return check_report("test_synth_plan");
}
