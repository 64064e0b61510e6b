/* Models: the architectures Strata runs, their hyper-parameters read from
 * GGUF metadata, their tensors bound by llama.cpp's GGUF names, and the
 * forward pass, written once against the backend op interface.
 *
 * Families: llama (SmolLM2, Llama), qwen2, qwen3, qwen3moe, gemma3, and the
 * hybrid qwen3next / qwen35moe / qwen35 (dense) (gated DeltaNet layers, a gated attention
 * layer every full_attn_interval-th), glm4moe (GLM-4.5/4.6: sigmoid routing with a
 * selection bias, leading dense layers, a shared expert, partial rotary), deepseek2
 * (DeepSeek V2/V3/R1, Kimi K2: multi-head latent attention, group-limited routing), gpt-oss (attention
 * sinks, sliding window every other layer, YaRN, biased experts with a clamped SwiGLU). They are one
 * decoder with switches
 * (QKV bias, Q/K norms, post-norms, sliding window, MoE, activation, hybrid)
 * rather than copies of the same loop.
 */
#ifndef STRATA_MODEL_MODEL_H
#define STRATA_MODEL_MODEL_H

#include <stdint.h>

#include "backend/backend.h"
#include "gguf/gguf.h"

typedef enum {
    ARCH_LLAMA,
    ARCH_QWEN2,
    ARCH_QWEN3,
    ARCH_QWEN3MOE,
    ARCH_GEMMA3,
    ARCH_QWEN3NEXT,
    ARCH_QWEN35MOE,
    ARCH_QWEN35,
    ARCH_GLM4MOE,
    ARCH_DEEPSEEK2,
    ARCH_GPT_OSS,
    ARCH_COUNT
} model_arch;

/* GGUF general.architecture name of each family, and the reverse. */
const char *model_arch_name(model_arch a);
int model_arch_from_name(const char *name, uint64_t len); /* -1 if unsupported */

typedef struct {
    model_arch arch;
    int n_layer;
    int n_embd; /* d_model */
    int n_head, n_head_kv;
    int head_dim; /* key/query head size (= value head size for these families) */
    int n_ff;     /* dense FFN width */
    int n_vocab;
    int n_ctx_train;
    int n_expert, n_expert_used, n_ff_exp; /* MoE; n_expert = 0 for dense */
    int norm_topk;                         /* renormalise the top-k routing weights */
    float rms_eps;
    float rope_theta;      /* global layers */
    float rope_theta_swa;  /* sliding-window layers (gemma3) */
    float rope_freq_scale; /* 1/linear scaling factor, global layers */
    int rope_neox;
    int n_swa;        /* sliding window size, 0 = none */
    int swa_pattern;  /* layer il is global when (il % swa_pattern) == swa_pattern-1; 0 = all global */
    float attn_scale; /* multiplies q.k */
    float embd_scale; /* multiplies the token embedding (gemma: sqrt(n_embd)) */
    st_act act;
    int qkv_bias, qk_norm, post_norms;
    /* hybrid (qwen3next, qwen35moe): layer il is a gated attention layer when
     * (il + 1) % full_attn_interval == 0, else a gated DeltaNet; 0 = not hybrid */
    int full_attn_interval;
    int n_rot;                                    /* rotated values per head (partial rotary), = head_dim unless set */
    int ssm_d_conv;                               /* DeltaNet: convolution width */
    int ssm_n_k_head, ssm_n_v_head, ssm_head_dim; /* key/query heads, value heads, their size */
    int ba_fused;       /* qwen3next: beta and alpha in one tensor (ssm_ba), and the value heads
                           of one key head adjacent (st_gdn k_grouped); qwen35moe: key heads tiled */
    int n_ff_shexp;     /* shared expert width, 0 = none */
    int shexp_gated;    /* the shared expert's output is scaled by sigmoid(ffn_gate_inp_shexp . h) (the hybrids) */
    int n_dense_lead;   /* the first layers have a dense FFN, the others experts (glm4moe: 1); 0 = all MoE */
    int ffn_norm_post;  /* the pre-FFN norm is GGUF's post_attention_norm (the hybrids, glm4moe) */
    st_gate_fn gate_fn; /* routing: softmax (qwen) or sigmoid (glm4moe) of the router logits */
    float expert_scale; /* routed scaling factor of the expert weights, 1 = none */
    int exp_bias;       /* MoE layers have a selection bias, exp_probs_b (glm4moe, deepseek2) */
    int n_group, n_group_used; /* group-limited routing (deepseek2): experts in n_group groups, the best
                                  n_group_used kept; 0 = none */
    /* deepseek2's multi-head latent attention (kv_lora > 0): head_dim is the
     * cache row (kv_lora + n_rot) of the one KV head; q and k heads of
     * head_dim_mla (nope + n_rot), value heads of v_head_mla; q through a
     * rank-q_lora bottleneck (0: a plain attn_q). YaRN rope when yarn_orig_ctx
     * > 0 (rope_freq_scale = 1/factor), beta_fast/slow its ramp. */
    int kv_lora, q_lora, head_dim_mla, v_head_mla;
    int yarn_orig_ctx;
    float yarn_beta_fast, yarn_beta_slow;
    /* gpt-oss: per-head attention sinks and an output bias (attn_sinks); a router bias and
     * per-expert biases on gate/up/down (exps_bias); sliding-window layers rotate as the others
     * (swa_rope_global: YaRN everywhere, where gemma3 gives them their own unscaled base) */
    int attn_sinks, exps_bias, swa_rope_global;
    /* multi-token prediction blocks after the decoder's layers (<arch>.nextn_predict_layers; block_count counts
       them, n_layer does not); model.mtp binds the first, if the file has its tensors */
    int n_nextn;
} model_hparams;

/* Whether layer il's FFN is the routed experts (else a dense FFN). */
static inline int model_layer_moe(const model_hparams *hp, int il) {
    return hp->n_expert > 0 && il >= hp->n_dense_lead;
}

/* A hybrid family's DeltaNet layer (the rest are gated attention layers). */
/* A multi-head latent attention layer (deepseek2: all of them). */
static inline int model_layer_mla(const model_hparams *hp) { return hp->kv_lora > 0; }

static inline int model_layer_recurrent(const model_hparams *hp, int il) {
    /* past the decoder's layers: a nextn (MTP) block, a gated attention layer */
    return hp->full_attn_interval > 0 && il < hp->n_layer && (il + 1) % hp->full_attn_interval != 0;
}

typedef struct {
    const float *attn_norm;               /* (n_embd) */
    st_weight wq, wk, wv, wo;             /* (n_embd -> n_head*hd), (n_embd -> n_head_kv*hd) x2, (n_head*hd -> n_embd);
                                             q/k/v biases (qwen2, glm4moe, gpt-oss) and o's (gpt-oss) as their .bias */
    const float *q_norm, *k_norm;         /* (head_dim), qwen3/gemma3, or NULL */
    const float *post_attn_norm;          /* (n_embd), gemma3, or NULL */
    const float *ffn_norm;                /* (n_embd) */
    st_weight ffn_gate, ffn_up, ffn_down; /* dense: (n_embd -> n_ff) x2, (n_ff -> n_embd) */
    const float *post_ffn_norm;           /* (n_embd), gemma3, or NULL */
    st_weight ffn_gate_inp;               /* router (n_embd -> n_expert); .bias: gpt-oss's */
    st_weight ffn_gate_exps, ffn_up_exps,
        ffn_down_exps;        /* (n_expert x [n_embd -> n_ff_exp]), down (n_ff_exp -> n_embd) */
    const float *exp_probs_b; /* (n_expert) expert selection bias (glm4moe, deepseek2), or NULL */
    /* multi-head latent attention (deepseek2); nope = head_dim_mla - n_rot */
    st_weight wq_a;         /* (n_embd -> q_lora) */
    const float *q_a_norm;  /* (q_lora) */
    st_weight wq_b;         /* (q_lora -> n_head*head_dim_mla); or wq (n_embd -> the same) when q_lora = 0 */
    st_weight wkv_a;        /* (n_embd -> kv_lora + n_rot): latent, then the shared rope key */
    const float *kv_a_norm; /* (kv_lora) */
    st_weight wk_b;         /* (n_head x [nope -> kv_lora]): a head's q_nope into the latent space */
    st_weight wv_b;         /* (n_head x [kv_lora -> v_head_mla]): a head's latent output to its values */
    /* gpt-oss; the per-expert biases ((n_expert x n_ff_exp) x2, (n_expert x n_embd)) are
     * ffn_{gate,up,down}_exps.bias, so that they travel with their experts */
    const float *attn_sinks; /* (n_head) logit of each head's sink in the softmax, or NULL */
    /* hybrid families (qwen3next, qwen35moe). Gated attention layers: wq is
     * (n_embd -> n_head*2*hd), per head hd query rows then hd gate rows.
     * ffn_norm is GGUF's post_attention_norm there. */
    st_weight ffn_gate_inp_shexp;                           /* shared expert's gate (n_embd -> 1) */
    st_weight ffn_gate_shexp, ffn_up_shexp, ffn_down_shexp; /* (n_embd -> n_ff_shexp) x2, (n_ff_shexp -> n_embd) */
    /* DeltaNet layers; conv_dim = 2*n_k*hd + n_v*hd, value_dim = n_v*hd */
    st_weight ssm_qkv;             /* attn_qkv (n_embd -> conv_dim): q | k | v */
    st_weight ssm_z;               /* attn_gate (n_embd -> value_dim): the output gate z */
    st_weight ssm_beta, ssm_alpha; /* (n_embd -> n_v) each (qwen35moe) */
    st_weight ssm_ba;              /* (n_embd -> 2*n_v), grouped per key head (qwen3next) */
    const float *ssm_conv;         /* (conv_dim x d_conv) causal convolution */
    const float *ssm_dt;           /* (n_v) bias of alpha */
    const float *ssm_a;            /* (n_v) -exp(A_log) */
    const float *ssm_norm;         /* (hd) output RMS norm */
    st_weight ssm_out;             /* (value_dim -> n_embd) */
} model_layer;

/* The multi-token prediction block (Qwen3.5's MTP head, DeepSeek V3's and
 * GLM-4.5's MTP layer; GGUF blk.{n_layer}.nextn.*): from the final hidden
 * state h of position p - 1 (after the output norm) and the token t at p,
 *   x = eh_proj [enorm(embed(t)) ; hnorm(h)],
 * then one decoder block (the family's attention over the block's own KV
 * rows, shared + routed experts), head_norm and the head: the logits of
 * position p + 1, and the normed x as the next step's h. */
typedef struct {
    /* its decoder layer is m->layers[n_layer]: the family's attention layer's tensors with experts */
    st_weight eh_proj;      /* (2*n_embd -> n_embd) */
    const float *enorm;     /* (n_embd) of the token's embedding */
    const float *hnorm;     /* (n_embd) of the hidden state */
    const float *head_norm; /* (n_embd) nextn.shared_head_norm, else output_norm */
    st_weight head;         /* nextn.shared_head_head, else output */
    st_weight embed;        /* nextn.embed_tokens, else token_embd */
} model_mtp;

typedef struct model {
    model_hparams hp;
    gguf_file *file;
    st_weight tok_embd;       /* (n_vocab rows of n_embd) */
    const float *output_norm; /* (n_embd) */
    st_weight output;         /* (n_embd -> n_vocab); tok_embd when tied */
    const float *rope_freqs;  /* (n_rot/2) rotary frequency divisors (Llama 3.1+ rope_freqs.weight; YaRN's, made at
                                 load), or NULL */
    model_layer *layers;      /* (n_layer, + 1 with mtp: its block) */
    model_mtp *mtp;           /* the first nextn block, or NULL (none in the file) */
    float **owned;            /* f32 copies of non-f32 norm vectors, freed with the model */
    int n_owned;
} model;

/* Open the GGUF, check the architecture is supported and every tensor has the
 * expected shape. NULL with st_error_get() naming the problem. */
model *model_load(const char *path);
/* Unbind every tensor outside layers [il0, il1) and, without ends, the
 * embedding, output norm and output matrix (a layer split's process,
 * engine/split.h): their fields become NULL, so a stray read faults at once
 * instead of paging in another process's weights from the mapping. */
void model_keep_layers(model *m, int il0, int il1, int ends);
/* [*first, *end): the layers whose routed experts are bound (n_dense_lead
 * and n_layer for a whole MoE model; within a split's range for a rank). */
void model_routed_layers(const model *m, int *first, int *end);
/* [*first, *end): the layers bound at all (0 and n_layer unless model_keep_layers cut them). */
void model_bound_layers(const model *m, int *first, int *end);
void model_free(model *m);

/* A layer's tensors as data (model_tensors.c): the loader binds each row a
 * family has, and model_each_tensor, placement and the byte counts walk the
 * same rows, so a tensor is added in one place. Shapes name hyper-parameters. */
typedef enum {
    MD_ONE,
    MD_EMBD,
    MD_Q,
    MD_KV,
    MD_HEAD,
    MD_FF,
    MD_FF_EXP,
    MD_EXPERT,
    MD_QG,       /* gated attention's query + gate rows: 2 * n_head * head_dim */
    MD_FF_SHEXP, /* shared expert width */
    MD_CONV,     /* DeltaNet convolution channels: q | k | v */
    MD_CONV_K,   /* its width */
    MD_VALUE,    /* n_v * hd */
    MD_VHEADS,   /* n_v */
    MD_BA,       /* 2 * n_v */
    MD_SSM_HEAD, /* DeltaNet head size */
    MD_Q_MLA,    /* MLA query width: n_head * head_dim_mla */
    MD_QLORA,    /* q_lora */
    MD_KV_A,     /* kv_lora + n_rot */
    MD_KVLORA,   /* kv_lora */
    MD_NOPE,     /* head_dim_mla - n_rot */
    MD_V_MLA,    /* v_head_mla */
    MD_HEADS,    /* n_head */
    MD_O_MLA,    /* n_head * v_head_mla */
} model_dim;
/* Which layers have a row: MW_ATTN and MW_QK_NORM hold in every layer of a
 * plain family and in the attention layers of a hybrid one. */
typedef enum {
    MW_ALWAYS,
    MW_QKV_BIAS,
    MW_QK_NORM,
    MW_POST_NORMS,
    MW_MOE,           /* layers with routed experts */
    MW_DENSE_FFN,     /* layers with a dense FFN */
    MW_EXP_BIAS,      /* MoE layers of a family with a selection bias (glm4moe) */
    MW_ATTN,          /* attention layers */
    MW_ATTN_PLAIN,    /* attention layers of a non-hybrid family (wq of n_head*hd rows) */
    MW_ATTN_GATED,    /* a hybrid family's attention layers (wq with its gate rows) */
    MW_FFN_NORM,      /* the pre-FFN norm named ffn_norm.weight (most families) */
    MW_FFN_NORM_POST, /* the pre-FFN norm named post_attention_norm.weight (hybrids, glm4moe) */
    MW_SHEXP,         /* MoE layers with a shared expert */
    MW_SHEXP_GATE,    /* MoE layers whose shared expert has a sigmoid gate (the hybrids) */
    MW_RECR,          /* DeltaNet layers */
    MW_RECR_BA_SPLIT, /* DeltaNet layers with ssm_beta and ssm_alpha (qwen35moe) */
    MW_RECR_BA_FUSED, /* DeltaNet layers with ssm_ba (qwen3next) */
    MW_MLA,           /* multi-head latent attention layers (deepseek2) */
    MW_MLA_QLORA,     /* those with the q bottleneck (attn_q_a, attn_q_b) */
    MW_MLA_QPLAIN,    /* those with a plain attn_q (DeepSeek-V2-Lite) */
    MW_SINKS,         /* attention layers with sinks and an output bias (gpt-oss) */
    MW_EXPS_BIAS,     /* MoE layers with a router bias and per-expert biases (gpt-oss) */
} model_when;
typedef enum { MT_DENSE, MT_ROUTED } model_tensor_class;
typedef struct {
    const char *name;       /* GGUF name after "blk.N.", e.g. "attn_q.weight" */
    size_t offset;          /* of its field in model_layer: an st_weight, or a const float * when vec */
    int vec;                /* 1: a norm or bias vector, read as f32 (n = in*out); 2: the same, bound as
                               the bias of the st_weight at offset (its row must come after the weight's) */
    model_dim in, out, mat; /* shape: ne0 (columns), ne1 (rows), ne2 (experts); a vector has in*out values */
    model_when when;        /* the families that have it */
    model_tensor_class cls; /* MT_ROUTED: what the memory plan may leave off the device */
} model_layer_tensor;
extern const model_layer_tensor MODEL_LAYER_TENSORS[];
extern const int MODEL_N_LAYER_TENSORS;
int64_t model_dim_size(const model_hparams *hp, model_dim d);
/* Whether layer il of the family has rows of condition w. */
int model_has_tensor(const model_hparams *hp, int il, model_when w);

/* Every tensor of a loaded model, once per place that binds it (model_tensors.c):
 * weights with their class (the routed experts are what the memory plan may
 * leave off the device), and vectors with their length (a NULL vector: the
 * family lacks it). The callbacks may re-point what they are handed. */
typedef void (*model_weight_fn)(void *ctx, st_weight *w, model_tensor_class cls);
typedef void (*model_vec_fn)(void *ctx, const float **v, int64_t n);
void model_each_tensor(model *m, model_weight_fn wf, model_vec_fn vf, void *ctx);
/* The same for the multi-token prediction block (m->mtp: its own tensors,
 * then layer n_layer's rows); nothing without one. Its head, embedding and
 * head norm may be the model's own (the same data). */
void model_each_mtp_tensor(model *m, model_weight_fn wf, model_vec_fn vf, void *ctx);

/* Bytes of weights read per token (dense + active experts): the decode roofline numerator. */
double model_active_bytes_per_token(const model *m);
/* Multiply-adds of the layers' weight products per token (dense + active
 * experts; the output matrix apart, a prompt computes it for its last
 * token only): the CPU prompt roofline numerator. */
double model_layer_macs_per_token(const model *m);

#endif
