/* The one list of a model's tensors after loading (model.h): every weight
 * matrix and every norm or bias vector the forward pass reads, with the
 * class that the memory plan splits on. Placement (engine_place.c), the byte
 * accounting of the plan and the check that the list covers the file
 * (tests/engine/test_lanes.c) all walk this list, so a tensor added to a
 * family is placed and counted once it is added here. */
#include "model/model.h"

void model_each_tensor(model *m, model_weight_fn wf, model_vec_fn vf, void *ctx) {
    const model_hparams *hp = &m->hp;
    const int64_t E = hp->n_embd, qw = (int64_t)hp->n_head * hp->head_dim;
    const int64_t kvw = (int64_t)hp->n_head_kv * hp->head_dim;
    wf(ctx, &m->tok_embd, MT_DENSE);
    wf(ctx, &m->output, MT_DENSE); /* tok_embd's data again when tied */
    vf(ctx, &m->output_norm, E);
    vf(ctx, &m->rope_freqs, hp->head_dim / 2);
    for (int il = 0; il < hp->n_layer; il++) {
        model_layer *l = &m->layers[il];
        st_weight *dense[] = {&l->wq, &l->wk, &l->wv, &l->wo, &l->ffn_gate, &l->ffn_up, &l->ffn_down, &l->ffn_gate_inp};
        for (size_t i = 0; i < sizeof dense / sizeof dense[0]; i++) wf(ctx, dense[i], MT_DENSE);
        wf(ctx, &l->ffn_gate_exps, MT_ROUTED);
        wf(ctx, &l->ffn_up_exps, MT_ROUTED);
        wf(ctx, &l->ffn_down_exps, MT_ROUTED);
        vf(ctx, &l->attn_norm, E);
        vf(ctx, &l->bq, qw);
        vf(ctx, &l->bk, kvw);
        vf(ctx, &l->bv, kvw);
        vf(ctx, &l->q_norm, hp->head_dim);
        vf(ctx, &l->k_norm, hp->head_dim);
        vf(ctx, &l->post_attn_norm, E);
        vf(ctx, &l->ffn_norm, E);
        vf(ctx, &l->post_ffn_norm, E);
    }
}
