/* The one list of a model's tensors (model.h): a layer's tensors as a
 * table, each with its GGUF name, its field, its shape in hyper-parameters,
 * the families that have it, and the class that the memory plan splits on.
 * The loader binds the rows a family has (model_load.c); model_each_tensor
 * walks the same rows for placement (engine_place.c) and the plan's byte
 * count; model_active_bytes_per_token too. tests/engine/test_lanes.c checks
 * that the list covers every byte of a file's tensors. */
#include <stddef.h>

#include "model/model.h"

#define W(name, field, in, out, mat, when, cls) {name, offsetof(model_layer, field), 0, in, out, mat, when, cls}
#define V(name, field, n, when) {name, offsetof(model_layer, field), 1, n, MD_ONE, MD_ONE, when, MT_DENSE}

const model_layer_tensor MODEL_LAYER_TENSORS[] = {
    V("attn_norm.weight", attn_norm, MD_EMBD, MW_ALWAYS),
    W("attn_q.weight", wq, MD_EMBD, MD_Q, MD_ONE, MW_ALWAYS, MT_DENSE),
    W("attn_k.weight", wk, MD_EMBD, MD_KV, MD_ONE, MW_ALWAYS, MT_DENSE),
    W("attn_v.weight", wv, MD_EMBD, MD_KV, MD_ONE, MW_ALWAYS, MT_DENSE),
    W("attn_output.weight", wo, MD_Q, MD_EMBD, MD_ONE, MW_ALWAYS, MT_DENSE),
    V("attn_q.bias", bq, MD_Q, MW_QKV_BIAS),
    V("attn_k.bias", bk, MD_KV, MW_QKV_BIAS),
    V("attn_v.bias", bv, MD_KV, MW_QKV_BIAS),
    V("attn_q_norm.weight", q_norm, MD_HEAD, MW_QK_NORM),
    V("attn_k_norm.weight", k_norm, MD_HEAD, MW_QK_NORM),
    V("post_attention_norm.weight", post_attn_norm, MD_EMBD, MW_POST_NORMS),
    V("post_ffw_norm.weight", post_ffn_norm, MD_EMBD, MW_POST_NORMS),
    V("ffn_norm.weight", ffn_norm, MD_EMBD, MW_ALWAYS),
    W("ffn_gate_inp.weight", ffn_gate_inp, MD_EMBD, MD_EXPERT, MD_ONE, MW_MOE, MT_DENSE),
    W("ffn_gate_exps.weight", ffn_gate_exps, MD_EMBD, MD_FF_EXP, MD_EXPERT, MW_MOE, MT_ROUTED),
    W("ffn_up_exps.weight", ffn_up_exps, MD_EMBD, MD_FF_EXP, MD_EXPERT, MW_MOE, MT_ROUTED),
    W("ffn_down_exps.weight", ffn_down_exps, MD_FF_EXP, MD_EMBD, MD_EXPERT, MW_MOE, MT_ROUTED),
    W("ffn_gate.weight", ffn_gate, MD_EMBD, MD_FF, MD_ONE, MW_DENSE_FFN, MT_DENSE),
    W("ffn_up.weight", ffn_up, MD_EMBD, MD_FF, MD_ONE, MW_DENSE_FFN, MT_DENSE),
    W("ffn_down.weight", ffn_down, MD_FF, MD_EMBD, MD_ONE, MW_DENSE_FFN, MT_DENSE),
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
    }
    return 0;
}

int model_has_tensor(const model_hparams *hp, model_when w) {
    switch (w) {
    case MW_ALWAYS: return 1;
    case MW_QKV_BIAS: return hp->qkv_bias;
    case MW_QK_NORM: return hp->qk_norm;
    case MW_POST_NORMS: return hp->post_norms;
    case MW_MOE: return hp->n_expert > 0;
    case MW_DENSE_FFN: return hp->n_expert == 0;
    }
    return 0;
}

void model_each_tensor(model *m, model_weight_fn wf, model_vec_fn vf, void *ctx) {
    const model_hparams *hp = &m->hp;
    wf(ctx, &m->tok_embd, MT_DENSE);
    wf(ctx, &m->output, MT_DENSE); /* tok_embd's data again when tied */
    vf(ctx, &m->output_norm, hp->n_embd);
    vf(ctx, &m->rope_freqs, hp->head_dim / 2);
    for (int il = 0; il < hp->n_layer; il++)
        for (int t = 0; t < MODEL_N_LAYER_TENSORS; t++) {
            const model_layer_tensor *lt = &MODEL_LAYER_TENSORS[t];
            if (!model_has_tensor(hp, lt->when)) continue;
            char *field = (char *)&m->layers[il] + lt->offset;
            if (lt->vec) vf(ctx, (const float **)field, model_dim_size(hp, lt->in));
            else wf(ctx, (st_weight *)field, lt->cls);
        }
}
