/* Synthetic qwen3moe files (and the hybrid qwen35moe / qwen3next, glm4moe,
 * deepseek2, gpt-oss): presets, the per-class type plan, metadata, and the
 * tensor data generator that gguf_writer_write pulls one tensor at a time.
 * Which tensors a layer has, and their shapes, are the model's own tensor
 * table's (model_tensors.c): a family's tensors are listed once, there.
 *
 * Weights are N(0, 0.02^2) (norm weights 1 + N(0, 0.02^2)), quantized with the
 * reference quantizers. On big presets quantizing every one of 30 billion
 * weights would take an hour on one core, so tensors above POOL_MIN weights
 * are assembled from a pool: a few thousand chunks of 256 Gaussian weights
 * are quantized once per type, and each chunk of a big tensor is a copy of a
 * pool chunk chosen at random. Every block is then a genuine quantization of
 * Gaussian data, just not an independent one; the file writes at disk speed.
 * --exact turns the pool off.
 */
#include "model/synth.h"

#include <math.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "core/alloc.h"
#include "core/fp16.h"
#include "core/log.h"
#include "core/timer.h"
#include "gguf/gguf.h"
#include "model/arch_deepseek2_names.h"
#include "model/arch_glm4moe_names.h"
#include "model/arch_gpt_oss_names.h"
#include "model/arch_hybrid_names.h"
#include "model/arch_qwen3moe_names.h"
#include "model/model.h"
#include "model/synth_internal.h"
#include "quant/quant.h"

#define WEIGHT_STD  0.02f
#define POOL_MIN    (1 << 22) /* tensors with more weights than this come from the pool */
#define POOL_CHUNKS 4096      /* chunks per pool (a power of two: index by mask) */
#define ZIPF_MEAN   16.0f     /* m: the hidden state's shared component, in noise stds */
#define ZIPF_CAP    0.95      /* most often any one expert may be picked */

/* ---- presets ---- */

/* clang-format off */
static const synth_hparams PRESETS[] = {
    /* Small enough for unit tests, with every row width a multiple of 256 so
     * K-quant types are valid everywhere. */
    {.preset = "tiny", .arch = "qwen3moe", .n_layer = 2, .n_embd = 256, .n_head = 4, .n_head_kv = 2, .head_dim = 64, .n_expert = 8,
     .n_expert_used = 2, .n_ff_exp = 256, .n_ff = 512, .n_vocab = 512, .n_ctx = 4096, .rope_theta = 1e6f,
     .rms_eps = 1e-6f},
    /* Qwen/Qwen3-30B-A3B config.json */
    {.preset = "qwen3-30b-a3b", .arch = "qwen3moe", .n_layer = 48, .n_embd = 2048, .n_head = 32, .n_head_kv = 4, .head_dim = 128,
     .n_expert = 128, .n_expert_used = 8, .n_ff_exp = 768, .n_ff = 6144, .n_vocab = 151936, .n_ctx = 40960,
     .rope_theta = 1e6f, .rms_eps = 1e-6f},
    /* Qwen/Qwen3-235B-A22B config.json */
    {.preset = "qwen3-235b-a22b", .arch = "qwen3moe", .n_layer = 94, .n_embd = 4096, .n_head = 64, .n_head_kv = 4, .head_dim = 128,
     .n_expert = 128, .n_expert_used = 8, .n_ff_exp = 1536, .n_ff = 12288, .n_vocab = 151936, .n_ctx = 40960,
     .rope_theta = 1e6f, .rms_eps = 1e-6f},
    /* The 2-core benchmark of issue 16 (~1.5 GiB): 24 layers of 1024, 64 experts of 512 top-8;
     * attention and vocab as Qwen3-0.6B (16/8 heads of 128, vocab 151936) */
    {.preset = "moe-1.5g", .arch = "qwen3moe", .n_layer = 24, .n_embd = 1024, .n_head = 16, .n_head_kv = 8, .head_dim = 128,
     .n_expert = 64, .n_expert_used = 8, .n_ff_exp = 512, .n_ff = 3072, .n_vocab = 151936, .n_ctx = 40960,
     .rope_theta = 1e6f, .rms_eps = 1e-6f},
    /* The hybrids. tiny: 3 DeltaNet layers then a gated attention layer,
     * 16 of 64 head values rotated, 2 key and 4 value DeltaNet heads of 64 */
    {.preset = "tiny", .arch = "qwen35moe", .n_layer = 4, .n_embd = 256, .n_head = 4, .n_head_kv = 2,
     .head_dim = 64, .n_expert = 8, .n_expert_used = 2, .n_ff_exp = 256, .n_ff = 512, .n_vocab = 512,
     .n_ctx = 4096, .rope_theta = 1e7f, .rms_eps = 1e-6f, .full_attn_interval = 4, .n_rot = 16,
     .rope_sections = {3, 3, 2, 0}, .ssm_d_conv = 4, .ssm_n_k_head = 2, .ssm_n_v_head = 4, .ssm_head_dim = 64,
     .n_ff_shexp = 256},
    {.preset = "tiny", .arch = "qwen3next", .n_layer = 4, .n_embd = 256, .n_head = 4, .n_head_kv = 2,
     .head_dim = 64, .n_expert = 8, .n_expert_used = 2, .n_ff_exp = 256, .n_ff = 512, .n_vocab = 512,
     .n_ctx = 4096, .rope_theta = 1e7f, .rms_eps = 1e-6f, .full_attn_interval = 4, .n_rot = 16,
     .ssm_d_conv = 4, .ssm_n_k_head = 2, .ssm_n_v_head = 4, .ssm_head_dim = 64, .n_ff_shexp = 256},
    /* Qwen3.5-35B-A3B (40 layers: llama.cpp's LLM_TYPE_35B_A3B): 256 experts top-8 + a shared
     * one, rotary 25% of 256 with base 1e7 and M-RoPE sections [11, 11, 10], vocab 248320 */
    {.preset = "qwen3.5-35b-a3b", .arch = "qwen35moe", .n_layer = 40, .n_embd = 2048, .n_head = 16,
     .n_head_kv = 2, .head_dim = 256, .n_expert = 256, .n_expert_used = 8, .n_ff_exp = 512, .n_ff = 512,
     .n_vocab = 248320, .n_ctx = 262144, .rope_theta = 1e7f, .rms_eps = 1e-6f, .full_attn_interval = 4,
     .n_rot = 64, .rope_sections = {11, 11, 10, 0}, .ssm_d_conv = 4, .ssm_n_k_head = 16, .ssm_n_v_head = 32,
     .ssm_head_dim = 128, .n_ff_shexp = 512},
    /* Qwen/Qwen3-Next-80B-A3B config.json: 512 experts top-10 + a shared one */
    {.preset = "qwen3-next-80b-a3b", .arch = "qwen3next", .n_layer = 48, .n_embd = 2048, .n_head = 16,
     .n_head_kv = 2, .head_dim = 256, .n_expert = 512, .n_expert_used = 10, .n_ff_exp = 512, .n_ff = 5120,
     .n_vocab = 151936, .n_ctx = 262144, .rope_theta = 1e7f, .rms_eps = 1e-6f, .full_attn_interval = 4,
     .n_rot = 64, .ssm_d_conv = 4, .ssm_n_k_head = 16, .ssm_n_v_head = 32, .ssm_head_dim = 128,
     .n_ff_shexp = 512},
    /* glm4moe. tiny: a dense layer then two MoE layers (sigmoid routing, a
     * selection bias, GLM-4.5's scale 2.5), q width 512 over d_model 256,
     * half of each head rotated, one shared expert */
    {.preset = "tiny", .arch = "glm4moe", .n_layer = 3, .n_embd = 256, .n_head = 8, .n_head_kv = 2,
     .head_dim = 64, .n_expert = 8, .n_expert_used = 2, .n_ff_exp = 256, .n_ff = 512, .n_vocab = 512,
     .n_ctx = 4096, .rope_theta = 1e6f, .rms_eps = 1e-5f, .n_rot = 32, .n_dense_lead = 1, .n_shared = 1,
     .expert_scale = 2.5f},
    /* GLM-4.5-Air (zai-org/GLM-4.5-Air; llama.cpp's LLM_TYPE_106B_A12B is 46 layers): 1 dense + 45 MoE
     * layers, d_model 4096, 96 q / 8 kv heads of 128 (64 rotated), dense ffn 10944, 128 experts top-8 of
     * 1408 + 1 shared, sigmoid routing with a bias, scale 1, vocab 151552, rope base 1e6. Its MTP layer
     * (nextn) is left out. */
    {.preset = "glm-4.5-air", .arch = "glm4moe", .n_layer = 46, .n_embd = 4096, .n_head = 96, .n_head_kv = 8,
     .head_dim = 128, .n_expert = 128, .n_expert_used = 8, .n_ff_exp = 1408, .n_ff = 10944, .n_vocab = 151552,
     .n_ctx = 131072, .rope_theta = 1e6f, .rms_eps = 1e-5f, .n_rot = 64, .n_dense_lead = 1, .n_shared = 1,
     .expert_scale = 1.0f},
    /* deepseek2. tiny: a dense layer then two MoE layers; latent attention
     * with q_lora 256, kv_lora 256, heads of 64 nope + 32 rope dims and 64
     * values; 8 experts in 2 groups (1 kept), top-2, sigmoid with a bias,
     * scale 2.5, a shared expert; YaRN x4 from 256 positions, mscale_all_dim 1 */
    {.preset = "tiny", .arch = DEEPSEEK2_ARCH, .n_layer = 3, .n_embd = 256, .n_head = 4, .n_head_kv = 1,
     .head_dim = 96, .n_expert = 8, .n_expert_used = 2, .n_ff_exp = 256, .n_ff = 512, .n_vocab = 512,
     .n_ctx = 4096, .rope_theta = 10000.0f, .rms_eps = 1e-6f, .n_rot = 32, .n_dense_lead = 1, .n_shared = 1,
     .expert_scale = 2.5f, .q_lora = 256, .kv_lora = 256, .v_head_dim = 64, .n_group = 2, .n_group_used = 1,
     .yarn_factor = 4.0f, .yarn_mscale_all_dim = 1.0f, .yarn_orig_ctx = 256},
    /* deepseek-ai/DeepSeek-V3 config.json (671B-A37B; R1 has the same shapes): 61 layers, the first 3
     * dense (ffn 18432), 256 experts of 2048 top-8 in 8 groups (4 kept) + 1 shared, sigmoid with a bias,
     * scale 2.5, normalised; 128 heads, q_lora 1536, kv_lora 512, 128 nope + 64 rope, values 128;
     * YaRN x40 from 4096, mscale_all_dim 1; vocab 129280. Its MTP layer is left out. */
    {.preset = "deepseek-v3", .arch = DEEPSEEK2_ARCH, .n_layer = 61, .n_embd = 7168, .n_head = 128,
     .n_head_kv = 1, .head_dim = 192, .n_expert = 256, .n_expert_used = 8, .n_ff_exp = 2048, .n_ff = 18432,
     .n_vocab = 129280, .n_ctx = 163840, .rope_theta = 10000.0f, .rms_eps = 1e-6f, .n_rot = 64,
     .n_dense_lead = 3, .n_shared = 1, .expert_scale = 2.5f, .q_lora = 1536, .kv_lora = 512, .v_head_dim = 128,
     .n_group = 8, .n_group_used = 4, .yarn_factor = 40.0f, .yarn_mscale_all_dim = 1.0f, .yarn_orig_ctx = 4096},
    /* gpt-oss. tiny: 4 layers (sliding window 8 on layers 0 and 2), 8 heads of 64 over d_model 256,
     * top-4 of 8 experts of 256, YaRN as published (factor 32 over 4096, base 150000) */
    {.preset = "tiny", .arch = "gpt-oss", .n_layer = 4, .n_embd = 256, .n_head = 8, .n_head_kv = 2,
     .head_dim = 64, .n_expert = 8, .n_expert_used = 4, .n_ff_exp = 256, .n_ff = 256, .n_vocab = 512,
     .n_ctx = 4096, .rope_theta = 150000.0f, .rms_eps = 1e-5f, .n_swa = 8, .yarn_orig_ctx = 4096,
     .yarn_factor = 32.0f},
    /* openai/gpt-oss-20b config.json: 24 layers, d_model 2880, 64 q / 8 kv heads of 64, 32 experts
     * top-4 of 2880, sliding window 128 on every other layer, YaRN factor 32 over 4096, base
     * 150000, vocab 201088 (o200k_harmony), context 131072 */
    {.preset = "gpt-oss-20b", .arch = "gpt-oss", .n_layer = 24, .n_embd = 2880, .n_head = 64, .n_head_kv = 8,
     .head_dim = 64, .n_expert = 32, .n_expert_used = 4, .n_ff_exp = 2880, .n_ff = 2880, .n_vocab = 201088,
     .n_ctx = 131072, .rope_theta = 150000.0f, .rms_eps = 1e-5f, .n_swa = 128, .yarn_orig_ctx = 4096,
     .yarn_factor = 32.0f},
    /* openai/gpt-oss-120b config.json: as the 20b with 36 layers and 128 experts */
    {.preset = "gpt-oss-120b", .arch = "gpt-oss", .n_layer = 36, .n_embd = 2880, .n_head = 64, .n_head_kv = 8,
     .head_dim = 64, .n_expert = 128, .n_expert_used = 4, .n_ff_exp = 2880, .n_ff = 2880, .n_vocab = 201088,
     .n_ctx = 131072, .rope_theta = 150000.0f, .rms_eps = 1e-5f, .n_swa = 128, .yarn_orig_ctx = 4096,
     .yarn_factor = 32.0f},
};
/* clang-format on */
#define N_PRESETS (sizeof PRESETS / sizeof PRESETS[0])

const char *synth_preset_list(void) {
    return "tiny|qwen3-30b-a3b|qwen3-235b-a22b|moe-1.5g (qwen3moe), tiny|qwen3.5-35b-a3b (qwen35moe), "
           "tiny|qwen3-next-80b-a3b (qwen3next), tiny|glm-4.5-air (glm4moe), tiny|deepseek-v3 (deepseek2), "
           "tiny|gpt-oss-20b|gpt-oss-120b (gpt-oss)";
}

int synth_preset(const char *arch, const char *preset, synth_hparams *hp) {
    int known = 0;
    for (size_t i = 0; i < N_PRESETS; i++) {
        if (strcmp(arch, PRESETS[i].arch) != 0) continue;
        known = 1;
        if (!strcmp(preset, PRESETS[i].preset)) {
            *hp = PRESETS[i];
            return 0;
        }
    }
    if (!known)
        st_error_set("unknown architecture '%s' (known: qwen3moe, qwen35moe, qwen3next, glm4moe, deepseek2, gpt-oss)",
                     arch);
    else st_error_set("unknown preset '%s' for %s (known: %s)", preset, arch, synth_preset_list());
    return -1;
}

int synth_has_mtp(const synth_hparams *h) {
    return h->full_attn_interval > 0 || !strcmp(h->arch, DEEPSEEK2_ARCH) || !strcmp(h->arch, GLM4MOE_ARCH);
}

void synth_opts_init(synth_opts *o, const synth_hparams *hp) {
    memset(o, 0, sizeof *o);
    o->hp = *hp;
    o->type_default = -1;
    for (int c = 0; c < SYN_CLASS_COUNT; c++) o->class_type[c] = -1;
    o->seed = 1;
    o->attn_out_scale = 1.0f;
}

/* ---- classes ---- */

static const char *const CLASS_NAMES[SYN_CLASS_COUNT] = {
    "token_embd",
    "output_norm",
    "output",
    "attn_norm",
    "attn_q",
    "attn_k",
    "attn_v",
    "attn_output",
    "attn_q_norm",
    "attn_k_norm",
    "ffn_norm",
    "ffn_gate_inp",
    "ffn_gate_exps",
    "ffn_up_exps",
    "ffn_down_exps",
    "post_attention_norm",
    "attn_qkv",
    "attn_gate",
    "ssm_beta",
    "ssm_alpha",
    "ssm_ba",
    "ssm_conv1d",
    "ssm_dt",
    "ssm_a",
    "ssm_norm",
    "ssm_out",
    "ffn_gate_inp_shexp",
    "ffn_gate_shexp",
    "ffn_up_shexp",
    "ffn_down_shexp",
    "attn_q.bias",
    "attn_k.bias",
    "attn_v.bias",
    "exp_probs_b.bias",
    "ffn_gate",
    "ffn_up",
    "ffn_down",
    "attn_q_a",
    "attn_q_a_norm",
    "attn_q_b",
    "attn_kv_a_mqa",
    "attn_kv_a_norm",
    "attn_k_b",
    "attn_v_b",
    "attn_output.bias",
    "attn_sinks",
    "ffn_gate_inp.bias",
    "ffn_gate_exps.bias",
    "ffn_up_exps.bias",
    "ffn_down_exps.bias",
    "nextn.eh_proj",
    "nextn.enorm",
    "nextn.hnorm",
    "nextn.shared_head_norm",
};

/* Each class's GGUF name: the whole name of the three global tensors, the
 * part after "blk.N." of the others. */
static const char *const CLASS_TENSOR[SYN_CLASS_COUNT] = {
    [SYN_TOKEN_EMBD] = QWEN3MOE_T_TOKEN_EMBD,
    [SYN_OUTPUT_NORM] = QWEN3MOE_T_OUTPUT_NORM,
    [SYN_OUTPUT] = QWEN3MOE_T_OUTPUT,
    [SYN_ATTN_NORM] = QWEN3MOE_T_ATTN_NORM,
    [SYN_ATTN_Q] = QWEN3MOE_T_ATTN_Q,
    [SYN_ATTN_K] = QWEN3MOE_T_ATTN_K,
    [SYN_ATTN_V] = QWEN3MOE_T_ATTN_V,
    [SYN_ATTN_OUT] = QWEN3MOE_T_ATTN_OUT,
    [SYN_ATTN_Q_NORM] = QWEN3MOE_T_ATTN_Q_NORM,
    [SYN_ATTN_K_NORM] = QWEN3MOE_T_ATTN_K_NORM,
    [SYN_FFN_NORM] = QWEN3MOE_T_FFN_NORM,
    [SYN_FFN_GATE_INP] = QWEN3MOE_T_FFN_GATE_INP,
    [SYN_FFN_GATE_EXPS] = QWEN3MOE_T_FFN_GATE_EXPS,
    [SYN_FFN_UP_EXPS] = QWEN3MOE_T_FFN_UP_EXPS,
    [SYN_FFN_DOWN_EXPS] = QWEN3MOE_T_FFN_DOWN_EXPS,
    [SYN_POST_ATTN_NORM] = HYBRID_T_POST_ATTN_NORM,
    [SYN_ATTN_QKV] = HYBRID_T_ATTN_QKV,
    [SYN_ATTN_GATE] = HYBRID_T_ATTN_GATE,
    [SYN_SSM_BETA] = HYBRID_T_SSM_BETA,
    [SYN_SSM_ALPHA] = HYBRID_T_SSM_ALPHA,
    [SYN_SSM_BA] = HYBRID_T_SSM_BA,
    [SYN_SSM_CONV1D] = HYBRID_T_SSM_CONV1D,
    [SYN_SSM_DT] = HYBRID_T_SSM_DT,
    [SYN_SSM_A] = HYBRID_T_SSM_A,
    [SYN_SSM_NORM] = HYBRID_T_SSM_NORM,
    [SYN_SSM_OUT] = HYBRID_T_SSM_OUT,
    [SYN_FFN_GATE_INP_SHEXP] = HYBRID_T_FFN_GATE_INP_SHEXP,
    [SYN_FFN_GATE_SHEXP] = HYBRID_T_FFN_GATE_SHEXP,
    [SYN_FFN_UP_SHEXP] = HYBRID_T_FFN_UP_SHEXP,
    [SYN_FFN_DOWN_SHEXP] = HYBRID_T_FFN_DOWN_SHEXP,
    [SYN_ATTN_Q_BIAS] = GLM4MOE_T_ATTN_Q_BIAS,
    [SYN_ATTN_K_BIAS] = GLM4MOE_T_ATTN_K_BIAS,
    [SYN_ATTN_V_BIAS] = GLM4MOE_T_ATTN_V_BIAS,
    [SYN_EXP_PROBS_B] = GLM4MOE_T_EXP_PROBS_B,
    [SYN_FFN_GATE] = GLM4MOE_T_FFN_GATE,
    [SYN_FFN_UP] = GLM4MOE_T_FFN_UP,
    [SYN_FFN_DOWN] = GLM4MOE_T_FFN_DOWN,
    [SYN_ATTN_Q_A] = DEEPSEEK2_T_ATTN_Q_A,
    [SYN_ATTN_Q_A_NORM] = DEEPSEEK2_T_ATTN_Q_A_NORM,
    [SYN_ATTN_Q_B] = DEEPSEEK2_T_ATTN_Q_B,
    [SYN_ATTN_KV_A_MQA] = DEEPSEEK2_T_ATTN_KV_A_MQA,
    [SYN_ATTN_KV_A_NORM] = DEEPSEEK2_T_ATTN_KV_A_NORM,
    [SYN_ATTN_K_B] = DEEPSEEK2_T_ATTN_K_B,
    [SYN_ATTN_V_B] = DEEPSEEK2_T_ATTN_V_B,
    [SYN_ATTN_OUT_BIAS] = GPT_OSS_T_ATTN_OUT_BIAS,
    [SYN_ATTN_SINKS] = GPT_OSS_T_ATTN_SINKS,
    [SYN_FFN_GATE_INP_BIAS] = GPT_OSS_T_GATE_INP_BIAS,
    [SYN_FFN_GATE_EXPS_BIAS] = GPT_OSS_T_GATE_EXPS_BIAS,
    [SYN_FFN_UP_EXPS_BIAS] = GPT_OSS_T_UP_EXPS_BIAS,
    [SYN_FFN_DOWN_EXPS_BIAS] = GPT_OSS_T_DOWN_EXPS_BIAS,
    [SYN_NEXTN_EH_PROJ] = HYBRID_T_NEXTN_EH_PROJ,
    [SYN_NEXTN_ENORM] = HYBRID_T_NEXTN_ENORM,
    [SYN_NEXTN_HNORM] = HYBRID_T_NEXTN_HNORM,
    [SYN_NEXTN_SHARED_HEAD_NORM] = HYBRID_T_NEXTN_SHARED_HEAD_NORM,
};

const char *synth_class_name(synth_class c) { return (unsigned)c < SYN_CLASS_COUNT ? CLASS_NAMES[c] : NULL; }

int synth_class_from_name(const char *name) {
    for (int c = 0; c < SYN_CLASS_COUNT; c++)
        if (!strcmp(name, CLASS_NAMES[c])) return c;
    char list[2048];
    size_t n = 0;
    for (int c = 0; c < SYN_CLASS_COUNT && n < sizeof list; c++) /* snprintf counts what did not fit: stop there */
        n += (size_t)snprintf(list + n, sizeof list - n, "%s%s", c ? " " : "", CLASS_NAMES[c]);
    st_error_set("unknown tensor class '%s' (known: %s)", name, list);
    return -1;
}

static int class_is_vector(synth_class c) {
    return c == SYN_OUTPUT_NORM || c == SYN_ATTN_NORM || c == SYN_ATTN_Q_NORM || c == SYN_ATTN_K_NORM ||
           c == SYN_FFN_NORM || c == SYN_POST_ATTN_NORM || c == SYN_SSM_NORM || c == SYN_ATTN_Q_A_NORM ||
           c == SYN_ATTN_KV_A_NORM || c == SYN_NEXTN_ENORM || c == SYN_NEXTN_HNORM || c == SYN_NEXTN_SHARED_HEAD_NORM;
}

/* The DeltaNet's small tensors and glm4moe's biases: f32 in every file, each with its own values. */
static int class_is_ssm_param(synth_class c) {
    return c == SYN_SSM_CONV1D || c == SYN_SSM_DT || c == SYN_SSM_A || c == SYN_FFN_GATE_INP_SHEXP ||
           c == SYN_ATTN_Q_BIAS || c == SYN_ATTN_K_BIAS || c == SYN_ATTN_V_BIAS || c == SYN_EXP_PROBS_B ||
           c == SYN_ATTN_OUT_BIAS || c == SYN_ATTN_SINKS || c == SYN_FFN_GATE_INP_BIAS || c == SYN_FFN_GATE_EXPS_BIAS ||
           c == SYN_FFN_UP_EXPS_BIAS || c == SYN_FFN_DOWN_EXPS_BIAS; /* gpt-oss's */
}

int synth_class_type(const synth_opts *o, synth_class c) {
    if (o->class_type[c] >= 0) return o->class_type[c];
    /* norms and the router stay F32, as llama.cpp's quantizer leaves them */
    if (class_is_vector(c) || class_is_ssm_param(c) || c == SYN_FFN_GATE_INP) return QT_F32;
    if (o->type_default >= 0) return o->type_default;
    /* gpt-oss as published: MXFP4 experts, 8-bit elsewhere (its rows of 2880 take no K-quant) */
    if (!strcmp(o->hp.arch, GPT_OSS_ARCH))
        return c == SYN_FFN_GATE_EXPS || c == SYN_FFN_UP_EXPS || c == SYN_FFN_DOWN_EXPS ? QT_MXFP4 : QT_Q8_0;
    /* Q4_K_M's choice: more bits where errors hurt most */
    if (c == SYN_ATTN_V || c == SYN_FFN_DOWN_EXPS || c == SYN_OUTPUT || c == SYN_FFN_DOWN_SHEXP || c == SYN_FFN_DOWN)
        return QT_Q6_K;
    /* the DeltaNet's gates are a few rows each: 8 bits cost nothing */
    if (c == SYN_SSM_BETA || c == SYN_SSM_ALPHA || c == SYN_SSM_BA) return QT_Q8_0;
    return QT_Q4_K;
}

void synth_tensor_class(const char *name, char *out, size_t n) {
    if (n == 0) return;
    const char *s = name;
    if (!strncmp(s, "blk.", 4)) {
        const char *p = s + 4;
        while (*p >= '0' && *p <= '9') p++;
        if (p > s + 4 && *p == '.') s = p + 1;
    }
    size_t len = strlen(s);
    if (len > 7 && !strcmp(s + len - 7, ".weight")) len -= 7;
    if (len >= n) len = n - 1;
    memcpy(out, s, len);
    out[len] = 0;
}

/* ---- the tensor plan ---- */

typedef struct {
    char name[64];
    synth_class cls;
    int layer; /* -1 for global tensors */
    int n_dims;
    int64_t ne[3];
    int type;
    uint64_t bytes;
} syn_tensor;

typedef struct {
    int type;
    int chunk_w; /* weights per chunk */
    size_t chunk_bytes;
    uint8_t *data; /* POOL_CHUNKS chunks */
} syn_pool;

typedef struct {
    const synth_opts *o;
    syn_tensor *t;
    int n;
    float *u;     /* [n_embd] zipf direction, or NULL */
    double *beta; /* [n_expert] zipf biases by popularity rank, in noise stds */
    syn_pool pools[8];
    int n_pools;
    float *row; /* scratch row of floats */
    uint64_t bytes_total, bytes_done;
    double t0, t_last;
} syn_ctx;

/* A row width that is not a whole number of blocks falls back to a 32-weight
 * type of similar precision, or F16. */
static int fallback_type(int type, int64_t width) {
    const qt_traits *tr = qt_get((qt_type)type);
    if (width % tr->blck == 0) return type;
    int alt;
    switch (type) {
    case QT_Q6_K:
    case QT_Q8_K: alt = QT_Q8_0; break;
    case QT_Q5_K: alt = QT_Q5_0; break;
    case QT_IQ4_XS: alt = QT_IQ4_NL; break;
    default: alt = QT_Q4_0; break;
    }
    return width % qt_get((qt_type)alt)->blck == 0 ? alt : QT_F16;
}

/* The model's hyper-parameters as model_load.c reads them from the metadata
 * that write_hparams writes: what the tensor table's conditions and shapes
 * name. tests/model/test_synth_plan.c checks them against the loader's. */
void synth_model_hparams(const synth_hparams *h, model_hparams *m) {
    memset(m, 0, sizeof *m);
    m->arch = (model_arch)model_arch_from_name(h->arch, strlen(h->arch));
    m->n_layer = h->n_layer;
    m->n_embd = h->n_embd;
    m->n_head = h->n_head;
    m->n_head_kv = h->n_head_kv;
    m->head_dim = h->head_dim;
    m->n_ff = h->n_ff;
    m->n_vocab = h->n_vocab;
    m->n_expert = h->n_expert;
    m->n_expert_used = h->n_expert_used;
    m->n_ff_exp = h->n_ff_exp;
    switch (m->arch) {
    case ARCH_QWEN3MOE: m->qk_norm = 1; break;
    case ARCH_QWEN3NEXT:
    case ARCH_QWEN35MOE: /* gated attention with q/k norms, DeltaNet layers, a gated shared expert */
        m->qk_norm = 1;
        m->full_attn_interval = h->full_attn_interval;
        m->n_rot = h->n_rot;
        m->ssm_d_conv = h->ssm_d_conv;
        m->ssm_n_k_head = h->ssm_n_k_head;
        m->ssm_n_v_head = h->ssm_n_v_head;
        m->ssm_head_dim = h->ssm_head_dim;
        m->ba_fused = m->arch == ARCH_QWEN3NEXT;
        m->n_ff_shexp = h->n_ff_shexp;
        m->shexp_gated = 1;
        m->ffn_norm_post = 1;
        m->n_nextn = h->n_nextn;
        break;
    case ARCH_GLM4MOE: /* synth writes the q/k/v biases and no q/k norms (GLM-4.5-Air's) */
        m->qkv_bias = 1;
        m->n_rot = h->n_rot;
        m->n_dense_lead = h->n_dense_lead;
        m->n_ff_shexp = h->n_shared * h->n_ff_exp;
        m->ffn_norm_post = 1;
        m->exp_bias = 1;
        m->n_nextn = h->n_nextn;
        break;
    case ARCH_DEEPSEEK2: /* the cache row is the KV head; the query/key heads are synth's head_dim */
        m->head_dim = h->kv_lora + h->n_rot;
        m->n_rot = h->n_rot;
        m->n_dense_lead = h->n_dense_lead;
        m->n_ff_shexp = h->n_shared * h->n_ff_exp;
        m->exp_bias = 1;
        m->q_lora = h->q_lora;
        m->kv_lora = h->kv_lora;
        m->head_dim_mla = h->head_dim;
        m->v_head_mla = h->v_head_dim;
        m->n_nextn = h->n_nextn;
        break;
    case ARCH_GPT_OSS:
        m->qkv_bias = 1;
        m->attn_sinks = 1;
        m->exps_bias = 1;
        m->ffn_norm_post = 1;
        m->n_rot = h->head_dim; /* no rope.dimension_count: all of the head */
        break;
    default: break;
    }
}

static void plan_add(syn_ctx *c, synth_class cls, int layer, int n_dims, int64_t ne0, int64_t ne1, int64_t ne2) {
    syn_tensor *t = &c->t[c->n++];
    if (layer < 0) snprintf(t->name, sizeof t->name, "%s", CLASS_TENSOR[cls]);
    else snprintf(t->name, sizeof t->name, "blk.%d.%s", layer, CLASS_TENSOR[cls]);
    t->cls = cls;
    t->layer = layer;
    t->n_dims = n_dims;
    t->ne[0] = ne0;
    t->ne[1] = ne1;
    t->ne[2] = ne2;
    int want = synth_class_type(c->o, cls);
    t->type = fallback_type(want, ne0);
    if (t->type != want)
        fprintf(stderr, "synth: note: %s has rows of %lld weights, not a multiple of %s's block: using %s\n", t->name,
                (long long)ne0, qt_get((qt_type)want)->name, qt_get((qt_type)t->type)->name);
    t->bytes = (uint64_t)qt_row_size((qt_type)t->type, ne0) * (uint64_t)(ne1 * ne2);
    c->bytes_total += t->bytes;
}

/* The class of a row of the model's tensor table, by its GGUF name (two rows
 * may share one: attn_q.weight is plain, gated or MLA's by family). */
static synth_class row_class(const char *name) {
    for (int cl = SYN_ATTN_NORM; cl < SYN_CLASS_COUNT; cl++)
        if (!strcmp(CLASS_TENSOR[cl], name)) return (synth_class)cl;
    st_error_set("synth: the tensor table's %s has no synth class", name);
    return SYN_CLASS_COUNT;
}

/* The file's tensors: the embedding, every layer's rows of the model's
 * tensor table (model_tensors.c) that the family has, with the table's
 * shapes, in its order, then the output norm and matrix. A row's type is
 * its class's (synth_class_type). */
static int plan_build(syn_ctx *c) {
    const synth_hparams *h = &c->o->hp;
    model_hparams mh;
    synth_model_hparams(h, &mh);
    const int n_blk = h->n_layer + (h->n_nextn ? 1 : 0);
    c->t = st_calloc((size_t)7 + (size_t)MODEL_N_LAYER_TENSORS * (size_t)n_blk, sizeof *c->t);
    plan_add(c, SYN_TOKEN_EMBD, -1, 2, h->n_embd, h->n_vocab, 1);
    for (int il = 0; il < n_blk; il++) /* the MTP block (il = n_layer): an attention layer's rows */
        for (int r = 0; r < MODEL_N_LAYER_TENSORS; r++) {
            const model_layer_tensor *lt = &MODEL_LAYER_TENSORS[r];
            if (!model_has_tensor(&mh, il, lt->when)) continue;
            const synth_class cls = row_class(lt->name);
            if (cls == SYN_CLASS_COUNT) return -1;
            /* as llama.cpp's shapes: a vector is one dimension, a matrix two, the experts' stacks three */
            const int n_dims = lt->mat != MD_ONE ? 3 : lt->out != MD_ONE ? 2 : 1;
            plan_add(c, cls, il, n_dims, model_dim_size(&mh, lt->in), model_dim_size(&mh, lt->out),
                     model_dim_size(&mh, lt->mat));
        }
    if (h->n_nextn) { /* the MTP block's own: no embed_tokens or shared_head_head (the model's are shared) */
        plan_add(c, SYN_NEXTN_EH_PROJ, h->n_layer, 2, 2 * (int64_t)h->n_embd, h->n_embd, 1);
        plan_add(c, SYN_NEXTN_ENORM, h->n_layer, 1, h->n_embd, 1, 1);
        plan_add(c, SYN_NEXTN_HNORM, h->n_layer, 1, h->n_embd, 1, 1);
        plan_add(c, SYN_NEXTN_SHARED_HEAD_NORM, h->n_layer, 1, h->n_embd, 1, 1);
    }
    plan_add(c, SYN_OUTPUT_NORM, -1, 1, h->n_embd, 1, 1);
    plan_add(c, SYN_OUTPUT, -1, 2, h->n_embd, h->n_vocab, 1);
    return 0;
}

/* ---- data ---- */

/* Convert n floats to type t into dst (whole blocks). */
static void encode(int t, const float *x, void *dst, int64_t n) {
    if (t == QT_F32) memcpy(dst, x, (size_t)n * sizeof(float));
    else qt_quantize((qt_type)t, x, dst, n);
}

static syn_pool *pool_get(syn_ctx *c, int type, int chunk_w) {
    for (int i = 0; i < c->n_pools; i++)
        if (c->pools[i].type == type && c->pools[i].chunk_w == chunk_w) return &c->pools[i];
    ST_ASSERT(c->n_pools < (int)(sizeof c->pools / sizeof c->pools[0]));
    syn_pool *p = &c->pools[c->n_pools++];
    p->type = type;
    p->chunk_w = chunk_w;
    p->chunk_bytes = qt_row_size((qt_type)type, chunk_w);
    p->data = st_malloc(p->chunk_bytes * POOL_CHUNKS);
    syn_rng r;
    syn_rng_init(&r, c->o->seed, 0x9001 + (uint64_t)type * 1000 + (uint64_t)chunk_w);
    float *x = st_malloc((size_t)chunk_w * sizeof *x);
    for (int k = 0; k < POOL_CHUNKS; k++) {
        for (int j = 0; j < chunk_w; j++) x[j] = WEIGHT_STD * syn_normal(&r);
        encode(type, x, p->data + (size_t)k * p->chunk_bytes, chunk_w);
    }
    st_free(x);
    return p;
}

static int use_pool(const syn_ctx *c, const syn_tensor *t) {
    if (c->o->exact) return 0;
    int64_t n = t->ne[0] * t->ne[1] * t->ne[2];
    if (n <= POOL_MIN) return 0;
    /* these carry structure the pool would lose */
    if (t->cls == SYN_FFN_GATE_INP || class_is_vector(t->cls) || class_is_ssm_param(t->cls)) return 0;
    if (t->cls == SYN_ATTN_OUT && c->o->attn_out_scale != 1.0f) return 0; /* the pool is at one scale */
    if (t->cls == SYN_TOKEN_EMBD && c->u) return 0;
    return 1;
}

/* Fill one row of floats for tensor t (row index in ne1*ne2 order). */
static void gen_row(syn_ctx *c, const syn_tensor *t, int64_t row, syn_rng *r, const int *perm) {
    int64_t w = t->ne[0];
    float *x = c->row;
    if (class_is_vector(t->cls)) {
        for (int64_t j = 0; j < w; j++) x[j] = 1.0f + WEIGHT_STD * syn_normal(r);
        return;
    }
    switch (t->cls) {    /* the DeltaNet's parameters, at the scale real checkpoints have them */
    case SYN_SSM_CONV1D: /* a short filter per channel */
        for (int64_t j = 0; j < w; j++) x[j] = 0.3f * syn_normal(r);
        return;
    case SYN_SSM_DT:
        for (int64_t j = 0; j < w; j++) x[j] = 0.5f * syn_normal(r);
        return;
    case SYN_SSM_A: /* -exp(A_log), A_log uniform in [-2, 1.5): heads that forget fast and slowly */
        for (int64_t j = 0; j < w; j++) x[j] = -expf(-2.0f + 3.5f * (float)syn_uniform(r));
        return;
    case SYN_FFN_GATE_INP_SHEXP:
        for (int64_t j = 0; j < w; j++) x[j] = syn_normal(r) / sqrtf((float)w);
        return;
    case SYN_ATTN_Q_BIAS:
    case SYN_ATTN_K_BIAS:
    case SYN_ATTN_V_BIAS:
        for (int64_t j = 0; j < w; j++) x[j] = WEIGHT_STD * syn_normal(r);
        return;
    case SYN_EXP_PROBS_B: /* sigmoid scores differ by a few hundredths: a bias that moves some choices */
        for (int64_t j = 0; j < w; j++) x[j] = (c->u ? 0.0f : 0.02f) * syn_normal(r);
        return;
    case SYN_ATTN_OUT_BIAS:
        for (int64_t j = 0; j < w; j++) x[j] = WEIGHT_STD * syn_normal(r);
        return;
    case SYN_ATTN_SINKS: /* logits of the order of the scores: each sink takes a real share */
        for (int64_t j = 0; j < w; j++) x[j] = syn_normal(r);
        return;
    case SYN_FFN_GATE_INP_BIAS: /* moves some choices; none under --zipf, whose router it would skew */
        for (int64_t j = 0; j < w; j++) x[j] = (c->u ? 0.0f : 0.1f) * syn_normal(r);
        return;
    case SYN_FFN_GATE_EXPS_BIAS:
    case SYN_FFN_UP_EXPS_BIAS: /* wide enough that some values pass the +-7 clamp */
        for (int64_t j = 0; j < w; j++) x[j] = 3.0f * syn_normal(r);
        return;
    case SYN_FFN_DOWN_EXPS_BIAS:
        for (int64_t j = 0; j < w; j++) x[j] = WEIGHT_STD * syn_normal(r);
        return;
    default: break;
    }
    /* Random q and k attend nearly uniformly, so attention adds about the
     * same vector (the values' running mean) to every position; layer by
     * layer the hidden states converge and a chunk's tokens choose the
     * same experts (moe-1.5g, a 512-token chunk: 58 of 64 experts in layer
     * 0, 14-25 from layer 5 on). A smaller attn_output keeps the tokens
     * apart as a trained model's are (0.1: 58-64 of 64 in every layer). */
    const float sd = t->cls == SYN_ATTN_OUT ? WEIGHT_STD * c->o->attn_out_scale : WEIGHT_STD;
    for (int64_t j = 0; j < w; j++) x[j] = sd * syn_normal(r);
    if (!c->u) return;
    if (t->cls == SYN_TOKEN_EMBD) {
        /* every token carries m noise-stds of the shared direction */
        for (int64_t j = 0; j < w; j++) x[j] += ZIPF_MEAN * WEIGHT_STD * c->u[j];
    } else if (t->cls == SYN_FFN_GATE_INP) {
        /* row = g (orthogonal to u) + a*u with a*m = beta * |g| */
        double dot = 0, nn = 0;
        for (int64_t j = 0; j < w; j++) dot += (double)x[j] * c->u[j];
        for (int64_t j = 0; j < w; j++) {
            x[j] -= (float)dot * c->u[j];
            nn += (double)x[j] * x[j];
        }
        double a = c->beta[perm[row]] * sqrt(nn) / ZIPF_MEAN;
        for (int64_t j = 0; j < w; j++) x[j] += (float)a * c->u[j];
    }
}

static void progress(syn_ctx *c, int final) {
    if (!c->o->progress || c->bytes_total < (1u << 28)) return; /* small files finish at once */
    double now = st_now_s();
    if (!final && now - c->t_last < 1.0) return;
    c->t_last = now;
    double dt = now - c->t0 > 1e-9 ? now - c->t0 : 1e-9;
    fprintf(stderr, "%ssynth: %.2f / %.2f GB, %.0f MB/s%s", isatty(2) ? "\r" : "", c->bytes_done / 1e9,
            c->bytes_total / 1e9, c->bytes_done / dt / 1e6, (final || !isatty(2)) ? "\n" : "");
    fflush(stderr);
}

static int fill(void *vctx, int64_t i, void *buf, size_t size) {
    syn_ctx *c = vctx;
    ST_ASSERT(i >= 0 && i < c->n);
    const syn_tensor *t = &c->t[i];
    ST_ASSERT(size == t->bytes);
    syn_rng r;
    syn_rng_init(&r, c->o->seed, (uint64_t)i + 1);
    int64_t rows = t->ne[1] * t->ne[2];
    size_t row_bytes = qt_row_size((qt_type)t->type, t->ne[0]);
    uint8_t *dst = buf;
    if (use_pool(c, t)) {
        int chunk_w = t->ne[0] % 256 == 0 ? 256 : qt_get((qt_type)t->type)->blck;
        syn_pool *p = pool_get(c, t->type, chunk_w);
        size_t n_chunks = (size_t)(rows * (t->ne[0] / chunk_w));
        for (size_t k = 0; k < n_chunks; k++) {
            uint64_t pick = syn_next(&r) & (POOL_CHUNKS - 1);
            memcpy(dst + k * p->chunk_bytes, p->data + pick * p->chunk_bytes, p->chunk_bytes);
        }
    } else {
        /* routers: each layer ranks its experts differently */
        int *perm = NULL;
        if (t->cls == SYN_FFN_GATE_INP && c->u) {
            perm = st_malloc((size_t)rows * sizeof *perm);
            for (int e = 0; e < rows; e++) perm[e] = e;
            syn_rng pr;
            syn_rng_init(&pr, c->o->seed, 0x7000000 + (uint64_t)t->layer);
            for (int e = (int)rows - 1; e > 0; e--) {
                int j = (int)(syn_next(&pr) % (uint64_t)(e + 1));
                int tmp = perm[e];
                perm[e] = perm[j];
                perm[j] = tmp;
            }
        }
        for (int64_t row = 0; row < rows; row++) {
            gen_row(c, t, row, &r, perm);
            encode(t->type, c->row, dst + (size_t)row * row_bytes, t->ne[0]);
        }
        st_free(perm);
    }
    c->bytes_done += size;
    progress(c, 0);
    return 0;
}

/* ---- metadata and the write ---- */

static void write_hparams(gguf_writer *w, const synth_hparams *h) {
    char key[96];
#define KV_U32(k, v) (snprintf(key, sizeof key, "%s.%s", h->arch, k), gguf_w_u32(w, key, (uint32_t)(v)))
#define KV_F32(k, v) (snprintf(key, sizeof key, "%s.%s", h->arch, k), gguf_w_f32(w, key, (v)))
    KV_U32(QWEN3MOE_KV_BLOCK_COUNT, h->n_layer + h->n_nextn);
    KV_U32(QWEN3MOE_KV_CONTEXT_LENGTH, h->n_ctx);
    KV_U32(QWEN3MOE_KV_EMBEDDING_LENGTH, h->n_embd);
    KV_U32(QWEN3MOE_KV_FEED_FORWARD_LENGTH, h->n_ff);
    KV_U32(QWEN3MOE_KV_HEAD_COUNT, h->n_head);
    KV_U32(QWEN3MOE_KV_HEAD_COUNT_KV, h->n_head_kv);
    if (strcmp(h->arch, DEEPSEEK2_ARCH) != 0) { /* deepseek2 writes its MLA lengths below */
        KV_U32(QWEN3MOE_KV_KEY_LENGTH, h->head_dim);
        KV_U32(QWEN3MOE_KV_VALUE_LENGTH, h->head_dim);
    }
    KV_F32(QWEN3MOE_KV_ROPE_FREQ_BASE, h->rope_theta);
    KV_F32(QWEN3MOE_KV_RMS_EPS, h->rms_eps);
    KV_U32(QWEN3MOE_KV_EXPERT_COUNT, h->n_expert);
    KV_U32(QWEN3MOE_KV_EXPERT_USED_COUNT, h->n_expert_used);
    KV_U32(QWEN3MOE_KV_EXPERT_FF_LENGTH, h->n_ff_exp);
    if (h->full_attn_interval) {
        KV_U32(HYBRID_KV_FULL_ATTN_INTERVAL, h->full_attn_interval);
        KV_U32(HYBRID_KV_ROPE_DIMS, h->n_rot);
        KV_U32(HYBRID_KV_SSM_CONV_KERNEL, h->ssm_d_conv);
        KV_U32(HYBRID_KV_SSM_INNER_SIZE, h->ssm_n_v_head * h->ssm_head_dim);
        KV_U32(HYBRID_KV_SSM_STATE_SIZE, h->ssm_head_dim);
        KV_U32(HYBRID_KV_SSM_TIME_STEP_RANK, h->ssm_n_v_head);
        KV_U32(HYBRID_KV_SSM_GROUP_COUNT, h->ssm_n_k_head);
        KV_U32(HYBRID_KV_SHEXP_FF_LENGTH, h->n_ff_shexp);
        if (h->n_nextn) KV_U32(HYBRID_KV_NEXTN, h->n_nextn);
        if (!strcmp(h->arch, "qwen35moe")) { /* its loader requires the M-RoPE sections */
            int32_t sec[4] = {h->rope_sections[0], h->rope_sections[1], h->rope_sections[2], h->rope_sections[3]};
            snprintf(key, sizeof key, "%s.%s", h->arch, HYBRID_KV_ROPE_SECTIONS);
            gguf_w_arr(w, key, GGUF_T_INT32, sec, 4);
        }
    }
    if (!strcmp(h->arch, GLM4MOE_ARCH)) {
        KV_U32(GLM4MOE_KV_ROPE_DIMS, h->n_rot);
        KV_U32(GLM4MOE_KV_LEADING_DENSE, h->n_dense_lead);
        KV_U32(GLM4MOE_KV_EXPERT_SHARED, h->n_shared);
        KV_F32(GLM4MOE_KV_EXPERT_SCALE, h->expert_scale);
        snprintf(key, sizeof key, "%s.%s", h->arch, GLM4MOE_KV_EXPERT_NORM);
        gguf_w_bool(w, key, 1); /* norm_topk_prob: true in GLM-4.5's configs */
        KV_U32(GLM4MOE_KV_EXPERT_GATING_FUNC, 2);
        KV_U32(GLM4MOE_KV_NEXTN, h->n_nextn);
    }
    if (!strcmp(h->arch, DEEPSEEK2_ARCH)) {
        /* the MLA form of llama.cpp's converter: one KV head whose key is the
         * cache row (kv_lora + rope) and whose value is the latent */
        KV_U32(QWEN3MOE_KV_KEY_LENGTH, h->kv_lora + h->n_rot);
        KV_U32(QWEN3MOE_KV_VALUE_LENGTH, h->kv_lora);
        KV_U32(DEEPSEEK2_KV_KEY_LENGTH_MLA, h->head_dim);
        KV_U32(DEEPSEEK2_KV_VALUE_LENGTH_MLA, h->v_head_dim);
        if (h->q_lora > 0) KV_U32(DEEPSEEK2_KV_Q_LORA, h->q_lora);
        KV_U32(DEEPSEEK2_KV_KV_LORA, h->kv_lora);
        KV_U32(GLM4MOE_KV_ROPE_DIMS, h->n_rot);
        KV_U32(GLM4MOE_KV_LEADING_DENSE, h->n_dense_lead);
        KV_U32(GLM4MOE_KV_EXPERT_SHARED, h->n_shared);
        KV_F32(GLM4MOE_KV_EXPERT_SCALE, h->expert_scale);
        snprintf(key, sizeof key, "%s.%s", h->arch, GLM4MOE_KV_EXPERT_NORM);
        gguf_w_bool(w, key, 1); /* norm_topk_prob: true in V3's config */
        KV_U32(GLM4MOE_KV_EXPERT_GATING_FUNC, 2);
        if (h->n_group > 1) {
            KV_U32(DEEPSEEK2_KV_GROUP_COUNT, h->n_group);
            KV_U32(DEEPSEEK2_KV_GROUP_USED, h->n_group_used);
        }
        if (h->yarn_factor > 0) {
            snprintf(key, sizeof key, "%s.%s", h->arch, DEEPSEEK2_KV_ROPE_SCALING);
            gguf_w_str(w, key, "yarn");
            KV_F32(DEEPSEEK2_KV_ROPE_FACTOR, h->yarn_factor);
            KV_U32(DEEPSEEK2_KV_ROPE_ORIG_CTX, h->yarn_orig_ctx);
            KV_F32(DEEPSEEK2_KV_YARN_LOG_MUL, 0.1f * h->yarn_mscale_all_dim); /* as the converter writes it */
        }
        KV_U32(GLM4MOE_KV_NEXTN, h->n_nextn);
    }
    if (!strcmp(h->arch, GPT_OSS_ARCH)) {
        KV_U32(GPT_OSS_KV_SLIDING_WINDOW, h->n_swa);
        snprintf(key, sizeof key, "%s.%s", h->arch, GPT_OSS_KV_ROPE_SCALING);
        gguf_w_str(w, key, "yarn");
        KV_F32(GPT_OSS_KV_ROPE_FACTOR, h->yarn_factor);
        KV_U32(GPT_OSS_KV_ROPE_ORIG_CTX, h->yarn_orig_ctx);
    }
#undef KV_U32
#undef KV_F32
}

static int check_opts(const synth_opts *o) {
    const synth_hparams *h = &o->hp;
    if (h->n_layer < 1 || h->n_embd < 1 || h->n_head < 1 || h->n_head_kv < 1 || h->n_head % h->n_head_kv ||
        h->head_dim < 2 || h->n_expert < 1 || h->n_expert_used < 1 || h->n_expert_used > h->n_expert ||
        h->n_ff_exp < 1 || h->n_ctx < 1 || !h->arch ||
        (h->full_attn_interval && (h->n_rot < 2 || h->n_rot > h->head_dim || h->ssm_d_conv < 1 || h->ssm_n_k_head < 1 ||
                                   h->ssm_n_v_head % h->ssm_n_k_head || h->ssm_head_dim < 1 || h->n_ff_shexp < 1)) ||
        (!strcmp(h->arch, GLM4MOE_ARCH) &&
         (h->n_rot < 2 || h->n_rot > h->head_dim || h->n_rot % 2 || h->n_dense_lead < 0 || h->n_shared < 0 ||
          (h->n_dense_lead > 0 && h->n_ff < 1))) ||
        (!strcmp(h->arch, DEEPSEEK2_ARCH) &&
         (h->n_rot < 2 || h->n_rot % 2 || h->n_rot >= h->head_dim || h->kv_lora < 1 || h->q_lora < 0 ||
          h->v_head_dim < 1 || h->n_head_kv != 1 || h->n_dense_lead < 0 || h->n_shared < 1 ||
          (h->n_dense_lead > 0 && h->n_ff < 1) || h->n_group < 0 ||
          (h->n_group > 1 && (h->n_expert % h->n_group || h->n_group_used < 1 || h->n_group_used >= h->n_group ||
                              h->n_expert_used > h->n_group_used * (h->n_expert / h->n_group))))) ||
        (!strcmp(h->arch, GPT_OSS_ARCH) && (h->n_swa < 1 || h->yarn_factor < 1.0f || h->yarn_orig_ctx < 1)) ||
        h->n_nextn < 0 || h->n_nextn > 1 || (h->n_nextn && !synth_has_mtp(h))) {
        st_error_set("synth: inconsistent hyper-parameters (layers %d, embd %d, heads %d/%d, experts %d used %d)",
                     h->n_layer, h->n_embd, h->n_head, h->n_head_kv, h->n_expert, h->n_expert_used);
        return -1;
    }
    if (o->zipf_s < 0 || !isfinite(o->zipf_s)) {
        st_error_set("synth: zipf exponent must be >= 0, got %g", o->zipf_s);
        return -1;
    }
    if (o->zipf_s > 0 && h->n_expert * ZIPF_CAP < h->n_expert_used) {
        st_error_set("synth: --zipf needs more experts than used per token");
        return -1;
    }
    for (int cl = 0; cl < SYN_CLASS_COUNT; cl++) {
        int t = synth_class_type(o, (synth_class)cl);
        const qt_traits *tr = qt_get((qt_type)t);
        if (!tr || (t != QT_F32 && !tr->quantize)) {
            st_error_set("synth: type %s for class %s has no quantizer", tr ? tr->name : "?", CLASS_NAMES[cl]);
            return -1;
        }
        if (class_is_vector((synth_class)cl) && t != QT_F32 && t != QT_F16 && t != QT_BF16) {
            st_error_set("synth: norm class %s must be F32, F16 or BF16, not %s", CLASS_NAMES[cl], tr->name);
            return -1;
        }
    }
    return 0;
}

static void zipf_setup(syn_ctx *c) {
    const synth_hparams *h = &c->o->hp;
    int n = h->n_expert;
    double *t = st_malloc((size_t)n * sizeof *t);
    c->beta = st_malloc((size_t)n * sizeof *c->beta);
    synth_zipf_targets(n, h->n_expert_used, c->o->zipf_s, ZIPF_CAP, t);
    double err = synth_zipf_solve(n, h->n_expert_used, t, c->beta);
    if (err > 0.02) fprintf(stderr, "synth: note: zipf solve left a %.1f%% error\n", 100 * err);
    st_free(t);
    /* the shared direction: a random unit vector */
    c->u = st_malloc((size_t)h->n_embd * sizeof *c->u);
    syn_rng r;
    syn_rng_init(&r, c->o->seed, 0x5EED);
    double nn = 0;
    for (int j = 0; j < h->n_embd; j++) {
        c->u[j] = syn_normal(&r);
        nn += (double)c->u[j] * c->u[j];
    }
    for (int j = 0; j < h->n_embd; j++) c->u[j] = (float)(c->u[j] / sqrt(nn));
}

/* general.file_type (llama.cpp's llama_ftype numbers) for what the file
 * mostly holds: the default mix is Q4_K_M's (15); one type everywhere maps
 * to its MOSTLY_ value; -1 where none fits (the key is then left out rather
 * than wrong: readers fall back to describing the tensors). Overridden
 * classes keep the mix's or the type's name, as llama.cpp's own
 * quantizer does with --tensor-type. */
static int synth_file_type(const synth_opts *o) {
    if (o->type_default < 0) return !strcmp(o->hp.arch, GPT_OSS_ARCH) ? 38 : 15; /* MOSTLY_MXFP4_MOE, MOSTLY_Q4_K_M */
    switch (o->type_default) {
    case QT_F32: return 0;
    case QT_F16: return 1;
    case QT_Q4_0: return 2;
    case QT_Q4_1: return 3;
    case QT_Q8_0: return 7;
    case QT_Q5_0: return 8;
    case QT_Q5_1: return 9;
    case QT_Q2_K: return 10;
    case QT_Q3_K: return 12; /* MOSTLY_Q3_K_M */
    case QT_Q4_K: return 14; /* MOSTLY_Q4_K_S: Q4_K everywhere */
    case QT_Q5_K: return 16; /* MOSTLY_Q5_K_S */
    case QT_Q6_K: return 18;
    case QT_IQ2_XXS: return 19;
    case QT_IQ2_XS: return 20;
    case QT_IQ3_XXS: return 23;
    case QT_IQ1_S: return 24;
    case QT_IQ4_NL: return 25;
    case QT_IQ3_S: return 26;
    case QT_IQ2_S: return 28;
    case QT_IQ4_XS: return 30;
    case QT_IQ1_M: return 31;
    case QT_BF16: return 32;
    case QT_MXFP4: return 38; /* MOSTLY_MXFP4_MOE */
    default: return -1;
    }
}

int synth_write(const synth_opts *o, const char *path) {
    if (check_opts(o) != 0) return -1;
    const synth_hparams *h = &o->hp;
    syn_ctx c = {.o = o};
    if (plan_build(&c) != 0) {
        st_free(c.t);
        return -1;
    }
    if (o->zipf_s > 0) zipf_setup(&c);
    int64_t max_w = h->n_embd;
    for (int i = 0; i < c.n; i++)
        if (c.t[i].ne[0] > max_w) max_w = c.t[i].ne[0];
    c.row = st_malloc((size_t)max_w * sizeof(float));

    gguf_writer *w = gguf_writer_new();
    gguf_w_str(w, "general.architecture", h->arch);
    char name[96];
    snprintf(name, sizeof name, "strata-synth %s", h->preset ? h->preset : "custom");
    gguf_w_str(w, "general.name", name);
    gguf_w_u32(w, "general.quantization_version", 2);
    const int ftype = synth_file_type(o);
    if (ftype >= 0) gguf_w_u32(w, "general.file_type", (uint32_t)ftype);
    write_hparams(w, h);
    int rc = synth_vocab_write(w, h->n_vocab);
    /* provenance, and what a router test needs to rebuild the hidden-state model */
    gguf_w_str(w, "strata.synth.preset", h->preset ? h->preset : "custom");
    gguf_w_u64(w, "strata.synth.seed", o->seed);
    gguf_w_f32(w, "strata.synth.zipf_s", (float)o->zipf_s);
    if (o->attn_out_scale != 1.0f) gguf_w_f32(w, "strata.synth.attn_out_scale", o->attn_out_scale);
    if (c.u) {
        gguf_w_f32(w, "strata.synth.router_dir_mean", ZIPF_MEAN);
        gguf_w_arr(w, "strata.synth.router_dir", GGUF_T_FLOAT32, c.u, (uint64_t)h->n_embd);
    }
    for (int i = 0; i < c.n; i++) gguf_w_tensor(w, c.t[i].name, c.t[i].type, c.t[i].n_dims, c.t[i].ne);

    if (rc == 0) {
        c.t0 = c.t_last = st_now_s();
        rc = gguf_writer_write(w, path, fill, &c);
        if (rc == 0) progress(&c, 1);
    }
    gguf_writer_free(w);
    for (int i = 0; i < c.n_pools; i++) st_free(c.pools[i].data);
    st_free(c.row);
    st_free(c.u);
    st_free(c.beta);
    st_free(c.t);
    return rc;
}
