/* Synthetic models: GGUF files with random but valid weights.
 *
 * `strata synth` writes a file of an architecture preset (today qwen3moe:
 * tiny, qwen3-30b-a3b, qwen3-235b-a22b) with llama.cpp's exact metadata keys,
 * tensor names and shapes, a byte-level BPE tokenizer that llama.cpp accepts,
 * and weights quantized per tensor class (a Q4_K_M-like mix by default). Such
 * files let the engine, its tests and its benchmarks run at real sizes without
 * downloading a real checkpoint.
 *
 * The router can be skewed (zipf_s > 0) so that expert popularity follows a
 * Zipf law, which is what makes an expert cache worth having; docs/synth.md
 * explains the construction. Output is deterministic for a given seed, and
 * tensor data is streamed one tensor at a time (never the whole file in RAM).
 */
#ifndef STRATA_MODEL_SYNTH_H
#define STRATA_MODEL_SYNTH_H

#include <stddef.h>
#include <stdint.h>

#include "model/model.h"

/* Hyper-parameters of a synthetic model (qwen3moe, or the hybrid qwen35moe /
 * qwen3next when full_attn_interval > 0). */
typedef struct {
    const char *preset; /* preset name it came from */
    const char *arch;   /* general.architecture: "qwen3moe", "qwen35moe", "qwen3next" */
    int n_layer;
    int n_embd; /* d_model */
    int n_head, n_head_kv, head_dim;
    int n_expert, n_expert_used;
    int n_ff_exp; /* width of one expert's FFN */
    int n_ff;     /* the dense-equivalent FFN width the HF config states (metadata only) */
    int n_vocab;
    int n_ctx;
    float rope_theta, rms_eps;
    /* hybrids: DeltaNet layers, a gated attention layer every full_attn_interval-th */
    int full_attn_interval; /* 0: not hybrid */
    int n_rot;              /* rotated values per attention head */
    int rope_sections[4];   /* qwen35moe's M-RoPE sections (metadata) */
    int ssm_d_conv, ssm_n_k_head, ssm_n_v_head, ssm_head_dim;
    int n_ff_shexp; /* shared expert width (the hybrids) */
    /* glm4moe: the first n_dense_lead layers have a dense FFN of n_ff; the
     * others sigmoid-routed experts with a selection bias, scaled by
     * expert_scale, plus n_shared ungated shared experts of n_ff_exp each;
     * q/k/v biases; n_rot rotated values per head */
    int n_dense_lead, n_shared;
    float expert_scale;
    /* deepseek2 (also n_dense_lead, n_shared, expert_scale, n_rot): head_dim
     * is the query/key head (nope + n_rot); multi-head latent attention of
     * ranks q_lora (0: a plain attn_q) and kv_lora, value heads of
     * v_head_dim; experts in n_group groups of which n_group_used are kept;
     * YaRN rope (yarn_factor 0: none) */
    int q_lora, kv_lora, v_head_dim, n_group, n_group_used;
    float yarn_factor, yarn_mscale_all_dim;
    int yarn_orig_ctx;
    /* gpt-oss: a sliding window of n_swa on every other layer (YaRN by yarn_factor over
     * yarn_orig_ctx positions, as above), sinks, q/k/v/o biases, a router bias and per-expert biases */
    int n_swa;
    /* synth_has_mtp's families: 1 writes a multi-token prediction block after the layers (block_count
     * n_layer + 1, nextn_predict_layers 1, blk.{n_layer}.*: the family's attention layer with experts,
     * and nextn.eh_proj, enorm, hnorm and shared_head_norm, as llama.cpp's converter writes Qwen3.5's,
     * DeepSeek V3's and GLM-4.5's MTP layer); 0: none */
    int n_nextn;
} synth_hparams;

/* The tensor classes (--type's names), one per GGUF tensor name; which of
 * them a layer has, and in what order, is the model's tensor table's. */
typedef enum {
    SYN_TOKEN_EMBD,
    SYN_OUTPUT_NORM,
    SYN_OUTPUT,
    SYN_ATTN_NORM,
    SYN_ATTN_Q,
    SYN_ATTN_K,
    SYN_ATTN_V,
    SYN_ATTN_OUT,
    SYN_ATTN_Q_NORM,
    SYN_ATTN_K_NORM,
    SYN_FFN_NORM,
    SYN_FFN_GATE_INP,
    SYN_FFN_GATE_EXPS,
    SYN_FFN_UP_EXPS,
    SYN_FFN_DOWN_EXPS,
    /* the hybrids' (qwen35moe, qwen3next) */
    SYN_POST_ATTN_NORM,
    SYN_ATTN_QKV,
    SYN_ATTN_GATE,
    SYN_SSM_BETA,
    SYN_SSM_ALPHA,
    SYN_SSM_BA,
    SYN_SSM_CONV1D,
    SYN_SSM_DT,
    SYN_SSM_A,
    SYN_SSM_NORM,
    SYN_SSM_OUT,
    SYN_FFN_GATE_INP_SHEXP,
    SYN_FFN_GATE_SHEXP,
    SYN_FFN_UP_SHEXP,
    SYN_FFN_DOWN_SHEXP,
    /* glm4moe's */
    SYN_ATTN_Q_BIAS,
    SYN_ATTN_K_BIAS,
    SYN_ATTN_V_BIAS,
    SYN_EXP_PROBS_B,
    SYN_FFN_GATE,
    SYN_FFN_UP,
    SYN_FFN_DOWN,
    /* deepseek2's */
    SYN_ATTN_Q_A,
    SYN_ATTN_Q_A_NORM,
    SYN_ATTN_Q_B,
    SYN_ATTN_KV_A_MQA,
    SYN_ATTN_KV_A_NORM,
    SYN_ATTN_K_B,
    SYN_ATTN_V_B,
    /* gpt-oss's */
    SYN_ATTN_OUT_BIAS,
    SYN_ATTN_SINKS,
    SYN_FFN_GATE_INP_BIAS,
    SYN_FFN_GATE_EXPS_BIAS,
    SYN_FFN_UP_EXPS_BIAS,
    SYN_FFN_DOWN_EXPS_BIAS,
    /* the multi-token prediction block's own (n_nextn) */
    SYN_NEXTN_EH_PROJ,
    SYN_NEXTN_ENORM,
    SYN_NEXTN_HNORM,
    SYN_NEXTN_SHARED_HEAD_NORM,
    SYN_CLASS_COUNT
} synth_class;

typedef struct {
    synth_hparams hp;
    int type_default;                /* qt_type for every weight matrix not overridden; -1: the Q4_K_M-like mix */
    int class_type[SYN_CLASS_COUNT]; /* qt_type per class, -1: not overridden */
    double zipf_s;                   /* > 0: Zipf-skewed router; 0: plain Gaussian router */
    float attn_out_scale;            /* attn_output weights times this (1: as every matrix); see synth.c */
    uint64_t seed;
    int exact;    /* quantize every tensor from Gaussians (slow on big presets) */
    int progress; /* progress line on stderr */
} synth_opts;

/* "tiny|qwen3-30b-a3b|..." for usage lines: every preset of every architecture. */
const char *synth_preset_list(void);
/* Fill *hp for arch/preset; -1 with st_error_set naming the bad value. */
int synth_preset(const char *arch, const char *preset, synth_hparams *hp);
/* Whether h's family has a multi-token prediction block (n_nextn): the
 * hybrids, deepseek2 and glm4moe. */
int synth_has_mtp(const synth_hparams *h);
/* Defaults: no overrides, mix types, seed 1, no zipf, attn_out_scale 1. */
void synth_opts_init(synth_opts *o, const synth_hparams *hp);

/* Class name as used by --type and strata info ("ffn_down_exps"); NULL if out of range. */
const char *synth_class_name(synth_class c);
/* Class by name, or -1 with st_error_set listing the valid names. */
int synth_class_from_name(const char *name);
/* The type a class gets under o (after fallbacks for row widths are NOT applied). */
int synth_class_type(const synth_opts *o, synth_class c);

/* The hyper-parameters model_load reads from the file synth writes for h:
 * the ones the tensor table's conditions and shapes name (model.h). */
void synth_model_hparams(const synth_hparams *h, model_hparams *out);

/* Write the file. 0, or -1 with st_error_get(). */
int synth_write(const synth_opts *o, const char *path);

/* A tensor's class for reporting: its name without "blk.N." and without the
 * ".weight" suffix ("blk.7.ffn_down_exps.weight" -> "ffn_down_exps"). Writes a
 * NUL-terminated string into out (truncated to n). */
void synth_tensor_class(const char *name, char *out, size_t n);

/* ---- Zipf router (synth_zipf.c), exposed for tests ---- */

/* Target selection probability per popularity rank (0-based) for n experts,
 * top-k, exponent s: t[r] = min(cap, c * (r+1)^-s) with c such that sum t = k. */
void synth_zipf_targets(int n, int k, double s, double cap, double *t);
/* Biases beta[n] (in units of the logit noise std) such that the top-k of
 * beta + N(0, I) picks expert r with probability t[r]. Returns the largest
 * relative error left after the solve. */
double synth_zipf_solve(int n, int k, const double *t, double *beta);

#endif
