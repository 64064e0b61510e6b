/* The one list of a model's tensors (model.h): a layer's tensors as a
 * table, each with its GGUF name, its field, its shape in hyper-parameters,
 * the families that have it, and the class that the memory plan splits on.
 * The loader binds the rows a family has (model_load.c); model_each_tensor
 * walks the same rows for placement (engine_place.c) and the plan's byte
 * count; model_active_bytes_per_token too; `strata synth` writes the same
 * rows (synth.c), in this order, which is llama.cpp's for qwen3moe and the
 * hybrids (their synthetic files stay as they were before the table wrote
 * them). tests/engine/test_lanes.c checks that the list covers every byte
 * of a file's tensors. */
#include <stddef.h>

#include "model/model.h"

#define W(name, field, in, out, mat, when, cls)                                                                        \
    { name, offsetof(model_layer, field), 0, in, out, mat, when, cls }
#define V(name, field, n, when)                                                                                        \
    { name, offsetof(model_layer, field), 1, n, MD_ONE, MD_ONE, when, MT_DENSE }
#define V2(name, field, in, out, when)                                                                                 \
    { name, offsetof(model_layer, field), 1, in, out, MD_ONE, when, MT_DENSE }
/* the bias of the weight at field (st_weight.bias), after the weight's row: every product of the
 * weight adds it (backend.h), and a routed weight's travels with its experts */
#define WB(name, field, in, out, when)                                                                                 \
    { name, offsetof(model_layer, field), 2, in, out, MD_ONE, when, MT_DENSE }

const model_layer_tensor MODEL_LAYER_TENSORS[] = {
    V("attn_norm.weight", attn_norm, MD_EMBD, MW_ALWAYS),
    /* the pre-FFN norm of the hybrids, glm4moe and gpt-oss (here: their files have it second) */
    V("post_attention_norm.weight", ffn_norm, MD_EMBD, MW_FFN_NORM_POST),
    W("attn_q.weight", wq, MD_EMBD, MD_Q, MD_ONE, MW_ATTN_PLAIN, MT_DENSE),
    W("attn_q.weight", wq, MD_EMBD, MD_QG, MD_ONE, MW_ATTN_GATED, MT_DENSE),
    W("attn_k.weight", wk, MD_EMBD, MD_KV, MD_ONE, MW_ATTN, MT_DENSE),
    W("attn_v.weight", wv, MD_EMBD, MD_KV, MD_ONE, MW_ATTN, MT_DENSE),
    W("attn_output.weight", wo, MD_Q, MD_EMBD, MD_ONE, MW_ATTN, MT_DENSE),
    WB("attn_q.bias", wq, MD_Q, MD_ONE, MW_QKV_BIAS),
    WB("attn_k.bias", wk, MD_KV, MD_ONE, MW_QKV_BIAS),
    WB("attn_v.bias", wv, MD_KV, MD_ONE, MW_QKV_BIAS),
    V("attn_q_norm.weight", q_norm, MD_HEAD, MW_QK_NORM),
    V("attn_k_norm.weight", k_norm, MD_HEAD, MW_QK_NORM),
    V("post_attention_norm.weight", post_attn_norm, MD_EMBD, MW_POST_NORMS),
    V("post_ffw_norm.weight", post_ffn_norm, MD_EMBD, MW_POST_NORMS),
    V("ffn_norm.weight", ffn_norm, MD_EMBD, MW_FFN_NORM),
    W("attn_qkv.weight", ssm_qkv, MD_EMBD, MD_CONV, MD_ONE, MW_RECR, MT_DENSE),
    W("attn_gate.weight", ssm_z, MD_EMBD, MD_VALUE, MD_ONE, MW_RECR, MT_DENSE),
    V2("ssm_conv1d.weight", ssm_conv, MD_CONV_K, MD_CONV, MW_RECR),
    V("ssm_dt.bias", ssm_dt, MD_VHEADS, MW_RECR),
    V("ssm_a", ssm_a, MD_VHEADS, MW_RECR),
    W("ssm_beta.weight", ssm_beta, MD_EMBD, MD_VHEADS, MD_ONE, MW_RECR_BA_SPLIT, MT_DENSE),
    W("ssm_alpha.weight", ssm_alpha, MD_EMBD, MD_VHEADS, MD_ONE, MW_RECR_BA_SPLIT, MT_DENSE),
    W("ssm_ba.weight", ssm_ba, MD_EMBD, MD_BA, MD_ONE, MW_RECR_BA_FUSED, MT_DENSE),
    V("ssm_norm.weight", ssm_norm, MD_SSM_HEAD, MW_RECR),
    W("ssm_out.weight", ssm_out, MD_VALUE, MD_EMBD, MD_ONE, MW_RECR, MT_DENSE),
    W("ffn_gate_inp.weight", ffn_gate_inp, MD_EMBD, MD_EXPERT, MD_ONE, MW_MOE, MT_DENSE),
    W("ffn_gate_exps.weight", ffn_gate_exps, MD_EMBD, MD_FF_EXP, MD_EXPERT, MW_MOE, MT_ROUTED),
    W("ffn_up_exps.weight", ffn_up_exps, MD_EMBD, MD_FF_EXP, MD_EXPERT, MW_MOE, MT_ROUTED),
    W("ffn_down_exps.weight", ffn_down_exps, MD_FF_EXP, MD_EMBD, MD_EXPERT, MW_MOE, MT_ROUTED),
    V("exp_probs_b.bias", exp_probs_b, MD_EXPERT, MW_EXP_BIAS),
    V("attn_sinks.weight", attn_sinks, MD_HEADS, MW_SINKS),
    WB("attn_output.bias", wo, MD_EMBD, MD_ONE, MW_SINKS),
    WB("ffn_gate_inp.bias", ffn_gate_inp, MD_EXPERT, MD_ONE, MW_EXPS_BIAS),
    WB("ffn_gate_exps.bias", ffn_gate_exps, MD_FF_EXP, MD_EXPERT, MW_EXPS_BIAS),
    WB("ffn_up_exps.bias", ffn_up_exps, MD_FF_EXP, MD_EXPERT, MW_EXPS_BIAS),
    WB("ffn_down_exps.bias", ffn_down_exps, MD_EMBD, MD_EXPERT, MW_EXPS_BIAS),
    W("ffn_gate.weight", ffn_gate, MD_EMBD, MD_FF, MD_ONE, MW_DENSE_FFN, MT_DENSE),
    W("ffn_up.weight", ffn_up, MD_EMBD, MD_FF, MD_ONE, MW_DENSE_FFN, MT_DENSE),
    W("ffn_down.weight", ffn_down, MD_FF, MD_EMBD, MD_ONE, MW_DENSE_FFN, MT_DENSE),
    W("ffn_gate_inp_shexp.weight", ffn_gate_inp_shexp, MD_EMBD, MD_ONE, MD_ONE, MW_SHEXP_GATE, MT_DENSE),
    W("ffn_gate_shexp.weight", ffn_gate_shexp, MD_EMBD, MD_FF_SHEXP, MD_ONE, MW_SHEXP, MT_DENSE),
    W("ffn_up_shexp.weight", ffn_up_shexp, MD_EMBD, MD_FF_SHEXP, MD_ONE, MW_SHEXP, MT_DENSE),
    W("ffn_down_shexp.weight", ffn_down_shexp, MD_FF_SHEXP, MD_EMBD, MD_ONE, MW_SHEXP, MT_DENSE),
    /* deepseek2's multi-head latent attention (b11434's layout: attn_kv_b split into k_b and v_b) */
    W("attn_q_a.weight", wq_a, MD_EMBD, MD_QLORA, MD_ONE, MW_MLA_QLORA, MT_DENSE),
    V("attn_q_a_norm.weight", q_a_norm, MD_QLORA, MW_MLA_QLORA),
    W("attn_q_b.weight", wq_b, MD_QLORA, MD_Q_MLA, MD_ONE, MW_MLA_QLORA, MT_DENSE),
    W("attn_q.weight", wq_b, MD_EMBD, MD_Q_MLA, MD_ONE, MW_MLA_QPLAIN, MT_DENSE),
    W("attn_kv_a_mqa.weight", wkv_a, MD_EMBD, MD_KV_A, MD_ONE, MW_MLA, MT_DENSE),
    V("attn_kv_a_norm.weight", kv_a_norm, MD_KVLORA, MW_MLA),
    W("attn_k_b.weight", wk_b, MD_NOPE, MD_KVLORA, MD_HEADS, MW_MLA, MT_DENSE),
    W("attn_v_b.weight", wv_b, MD_KVLORA, MD_V_MLA, MD_HEADS, MW_MLA, MT_DENSE),
    W("attn_output.weight", wo, MD_O_MLA, MD_EMBD, MD_ONE, MW_MLA, MT_DENSE),
};
const int MODEL_N_LAYER_TENSORS = (int)(sizeof MODEL_LAYER_TENSORS / sizeof MODEL_LAYER_TENSORS[0]);

int64_t model_dim_size(const model_hparams *hp, model_dim d) {
    switch (d) {
    case MD_ONE: return 1;
    case MD_EMBD: return hp->n_embd;
    case MD_Q: return (int64_t)hp->n_head * hp->head_dim;
    case MD_KV: return (int64_t)hp->n_head_kv * hp->head_dim;
    case MD_HEAD: return hp->head_dim;
    case MD_FF: return hp->n_ff;
    case MD_FF_EXP: return hp->n_ff_exp;
    case MD_EXPERT: return hp->n_expert;
    case MD_QG: return 2 * (int64_t)hp->n_head * hp->head_dim;
    case MD_FF_SHEXP: return hp->n_ff_shexp;
    case MD_CONV: return (int64_t)(2 * hp->ssm_n_k_head + hp->ssm_n_v_head) * hp->ssm_head_dim;
    case MD_CONV_K: return hp->ssm_d_conv;
    case MD_VALUE: return (int64_t)hp->ssm_n_v_head * hp->ssm_head_dim;
    case MD_VHEADS: return hp->ssm_n_v_head;
    case MD_BA: return 2 * (int64_t)hp->ssm_n_v_head;
    case MD_SSM_HEAD: return hp->ssm_head_dim;
    case MD_Q_MLA: return (int64_t)hp->n_head * hp->head_dim_mla;
    case MD_QLORA: return hp->q_lora;
    case MD_KV_A: return (int64_t)hp->kv_lora + hp->n_rot;
    case MD_KVLORA: return hp->kv_lora;
    case MD_NOPE: return hp->head_dim_mla - hp->n_rot;
    case MD_V_MLA: return hp->v_head_mla;
    case MD_HEADS: return hp->n_head;
    case MD_O_MLA: return (int64_t)hp->n_head * hp->v_head_mla;
    }
    return 0;
}

int model_has_tensor(const model_hparams *hp, int il, model_when w) {
    const int hybrid = hp->full_attn_interval > 0, recr = model_layer_recurrent(hp, il), mla = model_layer_mla(hp);
    switch (w) {
    case MW_ALWAYS: return 1;
    case MW_QKV_BIAS: return hp->qkv_bias;
    case MW_QK_NORM: return hp->qk_norm && !recr;
    case MW_POST_NORMS: return hp->post_norms;
    case MW_MOE: return model_layer_moe(hp, il);
    case MW_DENSE_FFN: return !model_layer_moe(hp, il);
    case MW_EXP_BIAS: return model_layer_moe(hp, il) && hp->exp_bias;
    case MW_ATTN: return !recr && !mla;
    case MW_ATTN_PLAIN: return !hybrid && !mla;
    case MW_ATTN_GATED: return hybrid && !recr;
    case MW_FFN_NORM: return !hp->ffn_norm_post;
    case MW_FFN_NORM_POST: return hp->ffn_norm_post;
    case MW_SHEXP: return hp->n_ff_shexp > 0 && model_layer_moe(hp, il);
    case MW_SHEXP_GATE: return hp->n_ff_shexp > 0 && hp->shexp_gated && model_layer_moe(hp, il);
    case MW_RECR: return recr;
    case MW_RECR_BA_SPLIT: return recr && !hp->ba_fused;
    case MW_RECR_BA_FUSED: return recr && hp->ba_fused;
    case MW_MLA: return mla;
    case MW_MLA_QLORA: return mla && hp->q_lora > 0;
    case MW_MLA_QPLAIN: return mla && hp->q_lora == 0;
    case MW_SINKS: return hp->attn_sinks && !recr;
    case MW_EXPS_BIAS: return hp->exps_bias && model_layer_moe(hp, il);
    }
    return 0;
}

/* One layer's rows of the table: weights, vectors and biases. */
static void each_layer_tensor(model *m, int il, model_weight_fn wf, model_vec_fn vf, void *ctx) {
    const model_hparams *hp = &m->hp;
    for (int t = 0; t < MODEL_N_LAYER_TENSORS; t++) {
        const model_layer_tensor *lt = &MODEL_LAYER_TENSORS[t];
        if (!model_has_tensor(hp, il, lt->when)) continue;
        char *field = (char *)&m->layers[il] + lt->offset;
        const int64_t n = model_dim_size(hp, lt->in) * model_dim_size(hp, lt->out);
        if (lt->vec == 2) vf(ctx, &((st_weight *)field)->bias, n);
        else if (lt->vec) vf(ctx, (const float **)field, n);
        else wf(ctx, (st_weight *)field, lt->cls);
    }
}

void model_each_mtp_tensor(model *m, model_weight_fn wf, model_vec_fn vf, void *ctx) {
    model_mtp *mt = m->mtp;
    if (!mt) return;
    const int64_t E = m->hp.n_embd;
    wf(ctx, &mt->eh_proj, MT_DENSE);
    wf(ctx, &mt->head, MT_DENSE);  /* the model's output's data when shared */
    wf(ctx, &mt->embed, MT_DENSE); /* the model's tok_embd's data when shared */
    vf(ctx, &mt->enorm, E);
    vf(ctx, &mt->hnorm, E);
    vf(ctx, &mt->head_norm, E); /* the output norm when shared */
    each_layer_tensor(m, m->hp.n_layer, wf, vf, ctx);
}

void model_each_tensor(model *m, model_weight_fn wf, model_vec_fn vf, void *ctx) {
    const model_hparams *hp = &m->hp;
    wf(ctx, &m->tok_embd, MT_DENSE);
    wf(ctx, &m->output, MT_DENSE); /* tok_embd's data again when tied */
    vf(ctx, &m->output_norm, hp->n_embd);
    vf(ctx, &m->rope_freqs, (hp->n_rot > 0 ? hp->n_rot : hp->head_dim) / 2); /* one divisor per rotated pair */
    for (int il = 0; il < hp->n_layer; il++) each_layer_tensor(m, il, wf, vf, ctx);
}
