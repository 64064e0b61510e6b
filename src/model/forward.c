/* The decoder forward pass, written once for llama, qwen2, qwen3, qwen3moe,
 * gemma3 and the hybrid qwen3next / qwen35moe. Per layer:
 *   h = norm(x); q,k,v = W h (+b); [q,k = headnorm(q,k)]; rope(q,k);
 *   kv <- k,v; a = attention(q, kv); o = Wo a; [o = norm(o)]; x += o
 *   h = norm(x); f = ffn(h) or moe(h); [f = norm(f)]; x += f
 * then logits = Wout norm(x). The hybrids' attention layers also project a
 * gate with q (a *= sigmoid(gate)) and rotate part of each head; their other
 * layers are gated DeltaNets (recurrent_block); their FFN adds a shared
 * expert scaled by sigmoid(w.h) to the routed ones. glm4moe: partial rotary,
 * dense FFNs in the first layers, then sigmoid-routed experts (a selection
 * bias, a scale) plus an ungated shared expert. deepseek2: multi-head latent
 * attention (forward_mla.c) and group-limited routing. gpt-oss: attention sinks,
 * biased q/k/v, output and router products and experts (every bias travels
 * in its st_weight: the product adds it) and the clamped SwiGLU (st_act). Every step is a backend
 * op, so the same code drives the CPU and the GPU. Each residual add is done
 * with the norm that follows it (rmsnorm's res argument: one pass over x
 * instead of two); the last layer's by a plain add, since the output norm
 * reads only some rows. Where the fused ops of backend.h say what happens
 * (products of one input: matmul_multi; a block's output product, the
 * residual add, the next norm and the router: matmul_res_norm), they are
 * called, so that a backend may run each as one kernel.
 * The multi-token prediction block (model_forward_mtp, --draft mtp) is one
 * more attention + MoE layer of the family's, n_layer, run on its own
 * after eh_proj has joined a token's embedding and a final hidden state;
 * model_forward hands those hidden states out (model_ctx_capture_hidden).
 */
#include "model/forward.h"

#include <string.h>

#include "core/alloc.h"
#include "core/log.h"
#include "model/forward_mla.h"

struct model_ctx {
    const model *m;
    st_backend *be;
    int n_ubatch;
    /* activations on the backend, [n_ubatch][width] */
    float *x, *h, *q, *k, *v, *att, *o; /* n_embd, n_embd, q width, kv width x2, q width, n_embd */
    float *g, *u;                       /* n_ff (dense) */
    float *router;                      /* n_expert */
    /* hybrid families */
    float *qg, *gate;                /* 2 x q width (query and gate rows of attn_q), q width */
    float *sqkv, *sz, *sb, *sa, *so; /* DeltaNet: conv_dim, value_dim, 2*n_v (beta, or fused ba), n_v, value_dim */
    float *shg, *shu, *sho, *shgate; /* shared expert: n_ff_shexp x2, n_embd, 1 */
    float *logits;                   /* n_vocab, [n_ubatch] rows */
    int32_t *ids;                    /* token ids copied to the device */
    mla_bufs *mla;                   /* deepseek2's latent attention (forward_mla.c), or NULL */
    model_split split;               /* the layers this process runs (forward.h); il1 0: no split */
    float *hop;                      /* host copy of x for the ring, [n_ubatch][n_embd], split only */
    float *cat;                      /* the MTP block's [enorm(e) ; hnorm(h)] rows, [n_ubatch][2 n_embd], or NULL */
    float *hid_dst;                  /* model_forward also writes every row's final hidden state here (host), or NULL */
    void *rows_key;                  /* a batched step's key (rows_key), host */
    size_t rows_key_cap;
};

/* Whether this process embeds and applies the output head (all but a split's followers). */
static int has_ends(const model_ctx *c) { return !c->split.il1 || c->split.ends; }

static float *balloc(st_backend *be, size_t n) { return be->alloc(be, n * sizeof(float)); }

model_ctx *model_ctx_create(const model *m, st_backend *be, int n_ubatch) {
    const model_hparams *hp = &m->hp;
    model_ctx *c = st_calloc(1, sizeof *c);
    c->m = m;
    c->be = be;
    c->n_ubatch = n_ubatch;
    size_t B = (size_t)n_ubatch, qw = (size_t)hp->n_head * hp->head_dim, kvw = (size_t)hp->n_head_kv * hp->head_dim;
    c->x = balloc(be, B * hp->n_embd);
    c->h = balloc(be, B * hp->n_embd);
    c->o = balloc(be, B * hp->n_embd);
    c->q = balloc(be, B * qw);
    c->att = balloc(be, B * qw);
    c->k = balloc(be, B * kvw);
    c->v = balloc(be, B * kvw);
    if (hp->n_ff) {
        c->g = balloc(be, B * hp->n_ff);
        c->u = balloc(be, B * hp->n_ff);
    }
    if (hp->n_expert) c->router = balloc(be, B * hp->n_expert);
    if (hp->full_attn_interval) {
        const size_t vd = (size_t)model_dim_size(hp, MD_VALUE), nv = (size_t)hp->ssm_n_v_head;
        c->qg = balloc(be, B * 2 * qw);
        c->gate = balloc(be, B * qw);
        c->sqkv = balloc(be, B * (size_t)model_dim_size(hp, MD_CONV));
        c->sz = balloc(be, B * vd);
        c->sb = balloc(be, B * 2 * nv);
        c->sa = balloc(be, B * nv);
        c->so = balloc(be, B * vd);
    }
    if (hp->n_ff_shexp) {
        c->shg = balloc(be, B * hp->n_ff_shexp);
        c->shu = balloc(be, B * hp->n_ff_shexp);
        c->sho = balloc(be, B * hp->n_embd);
        c->shgate = balloc(be, B);
    }
    c->logits = balloc(be, B * hp->n_vocab);
    c->ids = be->alloc(be, B * sizeof(int32_t));
    if (model_layer_mla(hp)) c->mla = mla_bufs_create(m, be, n_ubatch);
    return c;
}

void model_ctx_free(model_ctx *c) {
    if (!c) return;
    st_backend *be = c->be;
    void *bufs[] = {c->x,    c->h,  c->o,  c->q,  c->att, c->k,   c->v,   c->g,   c->u,      c->router, c->qg,  c->gate,
                    c->sqkv, c->sz, c->sb, c->sa, c->so,  c->shg, c->shu, c->sho, c->shgate, c->logits, c->ids, c->cat};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++)
        if (bufs[i]) be->free(be, bufs[i]);
    mla_bufs_free(c->mla, be);
    st_free(c->hop);
    st_free(c->rows_key);
    st_free(c);
}

void model_ctx_set_split(model_ctx *c, const model_split *s) {
    ST_ASSERT(s && s->il0 >= 0 && s->il0 < s->il1 && s->il1 <= c->m->hp.n_layer && (s->ends == (s->il0 == 0)));
    c->split = *s;
    c->hop = st_malloc((size_t)c->n_ubatch * c->m->hp.n_embd * sizeof(float));
    if (!s->ends) { /* no head here: the logits rows (n_ubatch x n_vocab, ~100 MB on SmolLM2) go */
        c->be->free(c->be, c->logits);
        c->logits = NULL;
    }
}

/* The residual stream's rows leave for the next process (x to the host, then sent)... */
static void hop_send(model_ctx *c, int rows) {
    const size_t n = (size_t)rows * c->m->hp.n_embd;
    c->be->to_host(c->be, c->hop, c->x, n * sizeof(float));
    c->split.send(c->split.ctx, c->hop, n);
}

/* ...and arrive from the previous one into x. */
static void hop_recv(model_ctx *c, int rows) {
    const size_t n = (size_t)rows * c->m->hp.n_embd;
    c->split.recv(c->split.ctx, c->hop, n);
    c->be->to_device(c->be, c->x, c->hop, n * sizeof(float));
}

/* A block's output projection joins the residual stream: o = W a (+ W's
 * bias, post-normed where the family says), x += o, then h = ffn_norm(x)
 * and, in a MoE layer, the router's logits of h into c->router. */
static void block_out(model_ctx *c, int il, const st_weight *w, const float *a, const float *post_norm, int rows) {
    const model_hparams *hp = &c->m->hp;
    const model_layer *l = &c->m->layers[il];
    st_backend *be = c->be;
    const int moe = model_layer_moe(hp, il);
    const st_weight *wr = moe ? &l->ffn_gate_inp : NULL;
    if (!post_norm) { /* nothing between the product and the add */
        be->matmul_res_norm(be, w, a, c->o, c->x, l->ffn_norm, hp->rms_eps, c->h, wr, c->router, rows);
        return;
    }
    be->matmul(be, w, 0, a, c->o, rows);
    be->rmsnorm(be, c->o, NULL, post_norm, c->o, hp->n_embd, rows, hp->rms_eps);
    be->rmsnorm(be, c->x, c->o, l->ffn_norm, c->h, hp->n_embd, rows, hp->rms_eps);
    if (wr) be->matmul(be, wr, 0, c->h, c->router, rows);
}

/* Attention of n_seq sequences stacked in the activation rows (sequence s:
 * n_tok[s] rows (one each when n_tok is NULL), from position pos0[s],
 * per-layer cache array kv[s]); rows
 * in all: norms and the Q/K/V/O products run on all rows at once (the
 * weights are read once for every sequence); the rotary embedding, the cache
 * write and attention run per sequence on its own rows, cache and positions.
 * On entry h = norm(x); on return x += attention, h = ffn_norm(x) and, in a
 * MoE layer, the router's logits of h are in c->router. */
static void attention_block(model_ctx *c, int il, st_kv_layer *const *kv, const int *pos0, const int *n_tok, int n_seq,
                            int rows) {
    const model_hparams *hp = &c->m->hp;
    const model_layer *l = &c->m->layers[il];
    st_backend *be = c->be;
    int qw = hp->n_head * hp->head_dim, kvw = hp->n_head_kv * hp->head_dim;

    const int gated = hp->full_attn_interval > 0; /* the hybrids: a gate per query value */
    if (gated) {
        be->matmul(be, &l->wq, 0, c->h, c->qg, rows);
        be->split_halves(be, c->qg, c->q, c->gate, rows, hp->n_head, hp->head_dim);
        const st_weight *w[] = {&l->wk, &l->wv};
        float *y[] = {c->k, c->v};
        be->matmul_multi(be, 2, w, c->h, y, rows);
    } else {
        const st_weight *w[] = {&l->wq, &l->wk, &l->wv};
        float *y[] = {c->q, c->k, c->v};
        be->matmul_multi(be, 3, w, c->h, y, rows);
    }
    /* Gemma 3: five sliding-window layers with their own unscaled RoPE base, then one global;
     * gpt-oss: every other layer, rotated as the others (YaRN) */
    int swa = hp->swa_pattern && (il % hp->swa_pattern) < hp->swa_pattern - 1;
    const int own = swa && !hp->swa_rope_global;
    st_rope rope = {swa ? hp->rope_theta_swa : hp->rope_theta, own ? 1.0f : hp->rope_freq_scale, hp->rope_neox,
                    own ? NULL : c->m->rope_freqs, hp->n_rot};
    const int window = swa ? hp->n_swa : 0;
    /* several sequences of one token each (a batched decode step): one call for all where the backend has it */
    const int seqs = !n_tok && n_seq > 1 && be->qkv_prep_seqs && be->attention_seqs;
    int done = 0;
    if (seqs) {
        be->qkv_prep_seqs(be, c->q, c->k, c->v, l->q_norm, l->k_norm, hp->rms_eps, n_seq, hp->n_head, &rope, kv, il,
                          pos0);
        done = be->attention_seqs(be, c->q, kv, il, n_seq, pos0, hp->n_head, hp->attn_scale, window, l->attn_sinks,
                                  c->att) == 0;
    }
    for (int s = 0, r = 0; s < n_seq && !done; s++) {
        const int n = n_tok ? n_tok[s] : 1;
        float *q = c->q + (size_t)r * qw, *att = c->att + (size_t)r * qw;
        if (!seqs)
            be->qkv_prep(be, q, c->k + (size_t)r * kvw, c->v + (size_t)r * kvw, l->q_norm, l->k_norm, hp->rms_eps, n,
                         hp->n_head, &rope, &kv[s][il], pos0[s]);
        if (l->attn_sinks)
            be->attention_sinks(be, q, &kv[s][il], n, pos0[s], hp->n_head, hp->attn_scale, window, l->attn_sinks, att);
        else be->attention(be, q, &kv[s][il], n, pos0[s], hp->n_head, hp->attn_scale, window, att);
        r += n;
    }
    if (gated) be->sigmoid_mul(be, c->att, c->gate, qw, qw, rows);
    block_out(c, il, &l->wo, c->att, l->post_attn_norm, rows);
}

/* A hybrid family's gated DeltaNet layer, rows stacked as in attention_block:
 * the projections run on all rows at once, the recurrence per sequence on its
 * own state (kv[s][il]). On entry h = norm(x); on return as attention_block's. */
static void recurrent_block(model_ctx *c, int il, st_kv_layer *const *kv, const int *pos0, const int *n_tok, int n_seq,
                            int rows) {
    const model_hparams *hp = &c->m->hp;
    const model_layer *l = &c->m->layers[il];
    st_backend *be = c->be;
    const int cw = (int)model_dim_size(hp, MD_CONV), vd = (int)model_dim_size(hp, MD_VALUE), nv = hp->ssm_n_v_head;

    const st_weight *w[] = {&l->ssm_qkv, &l->ssm_z, hp->ba_fused ? &l->ssm_ba : &l->ssm_beta, &l->ssm_alpha};
    float *y[] = {c->sqkv, c->sz, c->sb, c->sa};
    be->matmul_multi(be, hp->ba_fused ? 3 : 4, w, c->h, y, rows);
    const st_gdn g = {.d_conv = hp->ssm_d_conv,
                      .n_k_head = hp->ssm_n_k_head,
                      .n_v_head = nv,
                      .head_dim = hp->ssm_head_dim,
                      .eps = hp->rms_eps,
                      .k_grouped = hp->ba_fused, /* qwen3next: both */
                      .ba_fused = hp->ba_fused,
                      .conv_w = l->ssm_conv,
                      .dt_bias = l->ssm_dt,
                      .a = l->ssm_a,
                      .norm = l->ssm_norm};
    const int bw = hp->ba_fused ? 2 * nv : nv;
    for (int s = 0, r = 0; s < n_seq; s++) {
        const int n = n_tok ? n_tok[s] : 1;
        be->gated_delta_net(be, &g, &kv[s][il], n, pos0[s], c->sqkv + (size_t)r * cw, c->sz + (size_t)r * vd,
                            c->sb + (size_t)r * bw, hp->ba_fused ? NULL : c->sa + (size_t)r * nv,
                            c->so + (size_t)r * vd);
        r += n;
    }
    block_out(c, il, &l->ssm_out, c->so, NULL, rows);
}

/* The FFN (dense or MoE) of n rows, whichever sequences they belong to.
 * On entry h = ffn_norm(x) (and a MoE layer's router logits in c->router);
 * on return x += ffn and, but after the last layer this process runs
 * (last - 1), h = the next layer's attn_norm(x). */
static void ffn_block(model_ctx *c, int il, int n, int last) {
    const model_hparams *hp = &c->m->hp;
    const model_layer *l = &c->m->layers[il];
    st_backend *be = c->be;

    if (model_layer_moe(hp, il)) {
        /* softmax routing (qwen), or sigmoid with a selection bias and a scale (glm4moe) */
        const st_moe_gating gt = {hp->gate_fn,      hp->norm_topk, l->exp_probs_b,
                                  hp->expert_scale, hp->n_group,   hp->n_group_used};
        be->moe_ffn(be, c->h, c->router, n, hp->n_expert, hp->n_expert_used, &gt, hp->act, &l->ffn_gate_exps,
                    &l->ffn_up_exps, &l->ffn_down_exps, c->o);
        if (l->ffn_up_shexp.data) { /* the shared expert (the hybrids': scaled by sigmoid(w.h)) joins the routed ones */
            const st_weight *w[] = {&l->ffn_gate_shexp, &l->ffn_up_shexp};
            float *y[] = {c->shg, c->shu};
            be->matmul_multi(be, 2, w, c->h, y, n);
            be->act_mul(be, hp->act, c->shg, c->shu, c->shg, (int64_t)n * hp->n_ff_shexp);
            be->matmul(be, &l->ffn_down_shexp, 0, c->shg, c->sho, n);
            if (l->ffn_gate_inp_shexp.data) {
                be->matmul(be, &l->ffn_gate_inp_shexp, 0, c->h, c->shgate, n);
                be->sigmoid_mul(be, c->sho, c->shgate, hp->n_embd, 1, n);
            }
            be->add(be, c->o, c->sho, (int64_t)n * hp->n_embd, 1);
        }
    } else {
        const st_weight *w[] = {&l->ffn_gate, &l->ffn_up};
        float *y[] = {c->g, c->u};
        be->matmul_multi(be, 2, w, c->h, y, n);
        be->act_mul(be, hp->act, c->g, c->u, c->g, (int64_t)n * hp->n_ff);
        if (!l->post_ffn_norm && il + 1 < last) { /* the down product joins x, then the next layer's norm */
            be->matmul_res_norm(be, &l->ffn_down, c->g, c->o, c->x, c->m->layers[il + 1].attn_norm, hp->rms_eps, c->h,
                                NULL, NULL, n);
            return;
        }
        be->matmul(be, &l->ffn_down, 0, c->g, c->o, n);
    }
    if (l->post_ffn_norm) be->rmsnorm(be, c->o, NULL, l->post_ffn_norm, c->o, hp->n_embd, n, hp->rms_eps);
    if (il + 1 < last) be->rmsnorm(be, c->x, c->o, c->m->layers[il + 1].attn_norm, c->h, hp->n_embd, n, hp->rms_eps);
    else be->add(be, c->x, c->o, (int64_t)n * hp->n_embd, 1);
}

/* Layer il's attention in whichever form the family has (the DeltaNet
 * layers apart): multi-head latent attention (deepseek2, forward_mla.c) or
 * attention_block's. */
static void attention_layer(model_ctx *c, int il, st_kv_layer *const *kv, const int *pos0, const int *n_tok, int n_seq,
                            int rows) {
    if (c->mla) {
        const float *vo =
            mla_attention(c->m, c->be, c->mla, il, c->h, c->q, c->k, c->att, kv, pos0, n_tok, n_seq, rows);
        block_out(c, il, &c->m->layers[il].wo, vo, NULL, rows);
    } else attention_block(c, il, kv, pos0, n_tok, n_seq, rows);
}

/* One step's ops (backend run_step): what a step touches, and nothing that
 * changes from one decode step to the next but the position. */
typedef struct {
    model_ctx *c;
    st_kv_layer *kv;
    int n, first, rows; /* tokens; logits rows [first, first+rows), rows 0: none */
    int hidden;         /* stop at the output norm: c->h holds the rows' final hidden states (embeddings) */
    int all_hidden;     /* every row through the output norm into c->h, the logits rows' product from there */
    int ret;            /* under a split: the rows come back round the ring (forward.h) */
} step_args;

/* Embedding and layers of the token ids in c->ids: n_seq sequences stacked
 * as rows (sequence s: n_tok[s] rows from position pos0[s]), rows in all.
 * Under a split, this process's layers between the ring's hops (forward.h):
 * on return x holds the last layer's output wherever the head is applied. */
static void layers(model_ctx *c, st_kv_layer *const *kv, const int *pos0, const int *n_tok, int n_seq, int rows,
                   int ret) {
    const model *m = c->m;
    const model_hparams *hp = &m->hp;
    st_backend *be = c->be;
    const int split = c->split.il1 > 0, il0 = split ? c->split.il0 : 0, il1 = split ? c->split.il1 : hp->n_layer;

    if (has_ends(c)) {
        be->get_rows(be, &m->tok_embd, c->ids, rows, c->x);
        if (hp->embd_scale != 1.0f) be->scale(be, c->x, hp->embd_scale, (int64_t)rows * hp->n_embd);
    } else {
        hop_recv(c, rows);
    }
    be->rmsnorm(be, c->x, NULL, m->layers[il0].attn_norm, c->h, hp->n_embd, rows, hp->rms_eps);
    for (int il = il0; il < il1; il++) {
        if (model_layer_recurrent(hp, il)) {
            recurrent_block(c, il, kv, pos0, n_tok, n_seq, rows);
        } else attention_layer(c, il, kv, pos0, n_tok, n_seq, rows);
        ffn_block(c, il, rows, il1);
    }
    if (!split) return;
    if (ret || !c->split.last) hop_send(c, rows);
    if (c->split.ends && ret) hop_recv(c, rows); /* back round the ring from the last process */
}

static void step_body(void *arg, int pos0) {
    const step_args *a = arg;
    model_ctx *c = a->c;
    const model *m = c->m;
    const model_hparams *hp = &m->hp;
    st_backend *be = c->be;
    st_kv_layer *kv = a->kv;

    layers(c, &kv, &pos0, &a->n, 1, a->n, a->ret);
    if (a->all_hidden && has_ends(c)) { /* the MTP block reads every row's final hidden state */
        be->rmsnorm(be, c->x, NULL, m->output_norm, c->h, hp->n_embd, a->n, hp->rms_eps);
        if (a->rows) be->matmul(be, &m->output, 0, c->h + (size_t)a->first * hp->n_embd, c->logits, a->rows);
        return;
    }
    if (!a->rows || !has_ends(c)) return; /* an intermediate prompt chunk: only its KV is needed */
    /* only the rows whose logits are wanted go through the output matrix */
    be->rmsnorm(be, c->x + (size_t)a->first * hp->n_embd, NULL, m->output_norm, c->h, hp->n_embd, a->rows, hp->rms_eps);
    if (a->hidden) return;
    be->matmul(be, &m->output, 0, c->h, c->logits, a->rows);
}

/* Rows per forward_chunk: a split's pipelined window, else n_ubatch (forward.h). */
static int window_rows(const model_ctx *c) {
    return c->split.window > 0 && c->split.window < c->n_ubatch ? c->split.window : c->n_ubatch;
}

/* One step of n tokens from pos0 whose logits rows [first, first + rows)
 * are left in c->logits (on the backend). */
static void run_chunk(model_ctx *c, st_kv_layer *kv, const int32_t *tokens, int n, int pos0, int first, int rows,
                      int hidden, float *hid, int ret) {
    st_backend *be = c->be;
    step_args a;
    memset(&a, 0, sizeof a); /* the bytes are the graph's key: no stray padding */
    a.c = c;
    a.kv = kv;
    a.n = n;
    a.first = first;
    a.rows = rows;
    a.hidden = hidden;
    a.all_hidden = hid != NULL;
    a.ret = ret;
    if (has_ends(c)) be->to_device(be, c->ids, tokens, (size_t)n * sizeof(int32_t));
    be->run_step(be, n, pos0, step_body, &a, sizeof a);
    if (hid && has_ends(c)) be->to_host(be, hid, c->h, (size_t)n * c->m->hp.n_embd * sizeof(float));
}

/* Rows [0, n) of c->logits into logits (host), or as picks say (NULL:
 * every row whole): a picked row stays on the backend; the others are copied
 * in runs of consecutive rows. */
static void logits_out(model_ctx *c, float *logits, int n, model_pick *picks) {
    st_backend *be = c->be;
    const size_t nv = (size_t)c->m->hp.n_vocab;
    for (int r = 0, run = 0; r <= n; r++) {
        int whole = r < n;
        if (r < n && picks) {
            model_pick *p = &picks[r];
            const float *x = c->logits + (size_t)r * nv;
            p->rc = 1;
            if (p->k > 0 && be->top_k) p->rc = be->top_k(be, x, (int)nv, p->k, p->ids, p->vals) != 0;
            else if (p->k <= 0 && p->inv_t > 0.0f && be->draw)
                p->rc = be->draw(be, x, (int)nv, p->inv_t, p->u, p->tok) != 0;
            whole = p->rc;
        }
        if (whole) continue;
        if (r > run)
            be->to_host(be, logits + (size_t)run * nv, c->logits + (size_t)run * nv, (r - run) * nv * sizeof(float));
        run = r + 1;
    }
}

/* picks: one per row of logits (NULL: every row whole), as logits_out. */
static void forward_chunk(model_ctx *c, st_kv_layer *kv, const int32_t *tokens, int n, int pos0, float *logits,
                          int all_logits, float *hid, int ret, model_pick *picks) {
    const int rows = !logits ? 0 : all_logits ? n : 1;
    run_chunk(c, kv, tokens, n, pos0, all_logits ? 0 : n - 1, rows, 0, hid, ret);
    if (logits && has_ends(c)) logits_out(c, logits, rows, picks);
}

/* One token at pos with one pick (model_forward_top_k, model_forward_draw). */
static int forward_pick(model_ctx *c, st_kv_layer *kv, int32_t token, int pos, model_pick *p, float *logits) {
    ST_ASSERT(pos + 1 <= kv[0].n_ctx);
    forward_chunk(c, kv, &token, 1, pos, logits, 0, NULL, 1, p);
    return p->rc;
}

int model_forward_top_k(model_ctx *c, st_kv_layer *kv, int32_t token, int pos, int k, int32_t *ids, float *vals,
                        float *logits) {
    model_pick p = {.k = k, .ids = ids, .vals = vals, .rc = 1};
    return forward_pick(c, kv, token, pos, &p, logits);
}

int model_forward_draw(model_ctx *c, st_kv_layer *kv, int32_t token, int pos, float inv_t, double u, int32_t *tok,
                       float *logits) {
    model_pick p = {.inv_t = inv_t, .u = u, .tok = tok, .rc = 1};
    return forward_pick(c, kv, token, pos, &p, logits);
}

void model_forward_hidden(model_ctx *c, st_kv_layer *kv, const int32_t *tokens, int n_tok, int pos0, float *hidden) {
    ST_ASSERT(n_tok > 0 && n_tok <= c->n_ubatch);
    ST_ASSERT(pos0 + n_tok <= kv[0].n_ctx);
    const int step = window_rows(c);
    for (int done = 0; done < n_tok; done += step) { /* windowed as a follower's model_forward with all_logits */
        const int n = n_tok - done < step ? n_tok - done : step;
        run_chunk(c, kv, tokens + done, n, pos0 + done, 0, n, 1, NULL, 1);
        c->be->to_host(c->be, hidden + (size_t)done * c->m->hp.n_embd, c->h,
                       (size_t)n * c->m->hp.n_embd * sizeof(float));
    }
}

void model_forward(model_ctx *c, st_kv_layer *kv, const int32_t *tokens, int n_tok, int pos0, float *logits,
                   int all_logits) {
    ST_ASSERT(n_tok > 0);
    ST_ASSERT(pos0 + n_tok <= kv[0].n_ctx);
    size_t nv = (size_t)c->m->hp.n_vocab;
    const int step = window_rows(c);
    for (int done = 0; done < n_tok;) {
        int n = n_tok - done < step ? n_tok - done : step;
        int last = done + n == n_tok;
        /* intermediate chunks produce no logits unless every position's are wanted (a follower wants none) */
        float *out = !logits ? NULL : all_logits ? logits + (size_t)done * nv : last ? logits : NULL;
        float *hid = c->hid_dst ? c->hid_dst + (size_t)done * c->m->hp.n_embd : NULL;
        forward_chunk(c, kv, tokens ? tokens + done : NULL, n, pos0 + done, out, all_logits, hid,
                      last || all_logits || hid, NULL);
        done += n;
    }
}

/* What a recorded batched step depends on besides its rows' positions
 * (backend run_step_rows): the context (its buffers), the step's shape and
 * every row's cache, layer by layer (a sequence freed and another made may
 * reuse the address of its layer array, not its cache). */
typedef struct {
    const model_ctx *c;
    int n, skip, hid, pad;
} rows_head;

static const void *rows_key(model_ctx *c, st_kv_layer *const *kv, int n, int skip, int hid, size_t *size) {
    const size_t row = (size_t)c->m->hp.n_layer * sizeof(st_kv_layer);
    *size = sizeof(rows_head) + (size_t)n * row;
    if (*size > c->rows_key_cap) {
        c->rows_key = st_realloc(c->rows_key, *size);
        c->rows_key_cap = *size;
    }
    const rows_head h = {c, n, skip, hid, 0};
    memcpy(c->rows_key, &h, sizeof h);
    for (int s = 0; s < n; s++) memcpy((char *)c->rows_key + sizeof h + s * row, kv[s], row);
    return c->rows_key;
}

/* A batched step (forward.h): several sequences, each its own positions. */
typedef struct {
    model_ctx *c;
    st_kv_layer *const *kv; /* (n_seq) per-sequence layer arrays */
    const int *pos;         /* (n_seq) */
    const int *n_tok;       /* (n_seq), or NULL: one token each */
    int n_seq, rows, skip;  /* logits of the last token of sequences [skip, n_seq) */
    int all;                /* ... or of every token of them */
    int hid;                /* every row's final hidden state into c->o too (model_ctx_capture_hidden) */
} batch_args;

static void batch_body(void *arg, int pos0) {
    (void)pos0; /* each sequence has its own position */
    const batch_args *a = arg;
    model_ctx *c = a->c;
    const model *m = c->m;
    const model_hparams *hp = &m->hp;
    st_backend *be = c->be;

    layers(c, a->kv, a->pos, a->n_tok, a->n_seq, a->rows, 1);
    if (!has_ends(c)) return;
    if (a->hid) be->rmsnorm(be, c->x, NULL, m->output_norm, c->o, hp->n_embd, a->rows, hp->rms_eps);
    /* each wanted sequence's last row (or all its rows), normed into consecutive rows of h, then one product */
    int r = 0, k = 0;
    for (int s = 0; s < a->n_seq; s++) {
        const int n = a->n_tok ? a->n_tok[s] : 1, w = a->all ? n : 1;
        r += n;
        if (s < a->skip) continue;
        be->rmsnorm(be, c->x + (size_t)(r - w) * hp->n_embd, NULL, m->output_norm, c->h + (size_t)k * hp->n_embd,
                    hp->n_embd, w, hp->rms_eps);
        k += w;
    }
    if (k) be->matmul(be, &m->output, 0, c->h, c->logits, k);
}

void model_forward_batch(model_ctx *c, st_kv_layer *const *kv, const int32_t *tok, const int *pos, const int *n_tok,
                         int n_seq, int skip, int all, float *logits, model_pick *picks) {
    ST_ASSERT(n_seq > 0 && skip >= 0 && skip <= n_seq && !(picks && all));
    size_t nv = (size_t)c->m->hp.n_vocab;
    int rows = 0;
    for (int s = 0; s < n_seq; s++) {
        int n = n_tok ? n_tok[s] : 1;
        ST_ASSERT(n > 0 && pos[s] >= 0 && pos[s] + n <= kv[s][0].n_ctx);
        rows += n;
    }
    if (n_tok && rows > n_seq) {
        /* a prompt chunk among them: all in one step, within the activation rows */
        ST_ASSERT(rows <= c->n_ubatch);
        batch_args a = {c, kv, pos, n_tok, n_seq, rows, skip, all, c->hid_dst != NULL};
        st_backend *be = c->be;
        if (has_ends(c)) be->to_device(be, c->ids, tok, (size_t)rows * sizeof(int32_t));
        be->run_step(be, rows, pos[0], batch_body, &a, sizeof a);
        if (a.hid && has_ends(c)) be->to_host(be, c->hid_dst, c->o, (size_t)rows * c->m->hp.n_embd * sizeof(float));
        int out_rows = 0;
        for (int s = skip; s < n_seq; s++) out_rows += all ? n_tok[s] : 1;
        if (out_rows && has_ends(c)) logits_out(c, logits, out_rows, picks);
        return;
    }
    /* one token each: steps of up to n_ubatch sequences */
    for (int done = 0; done < n_seq;) {
        int n = n_seq - done < c->n_ubatch ? n_seq - done : c->n_ubatch;
        int sk = skip > done ? (skip - done < n ? skip - done : n) : 0; /* of these, without logits */
        float *out = logits ? logits + (size_t)(done + sk - skip) * nv : NULL;
        model_pick *pk = picks ? picks + (done + sk - skip) : NULL;
        float *hid = c->hid_dst ? c->hid_dst + (size_t)done * c->m->hp.n_embd : NULL;
        if (n == 1) { /* one sequence: the single-sequence step (a CUDA graph on the GPU) */
            forward_chunk(c, kv[done], tok ? tok + done : NULL, 1, pos[done], sk ? NULL : out, 0, hid, 1,
                          sk ? NULL : pk);
        } else {
            /* several positions in one step: recorded where the backend
             * records such steps (not in a split: its ring needs the host) */
            batch_args a = {c, kv + done, pos + done, NULL, n, n, sk, 0, hid != NULL};
            st_backend *be = c->be;
            if (has_ends(c)) be->to_device(be, c->ids, tok + done, (size_t)n * sizeof(int32_t));
            if (be->run_step_rows && !c->split.il1) {
                size_t ks;
                const void *key = rows_key(c, kv + done, n, sk, hid != NULL, &ks);
                be->run_step_rows(be, n, pos + done, batch_body, &a, key, ks);
            } else {
                be->run_step(be, n, pos[done], batch_body, &a, sizeof a);
            }
            if (sk < n && has_ends(c)) logits_out(c, out, n - sk, pk);
            if (hid && has_ends(c)) be->to_host(be, hid, c->o, (size_t)n * c->m->hp.n_embd * sizeof(float));
        }
        done += n;
    }
}

void model_ctx_capture_hidden(model_ctx *c, float *dst) { c->hid_dst = dst; }

/* The MTP block's step (model_forward_mtp). */
typedef struct {
    model_ctx *c;
    st_kv_layer *kv;
    int n, head;
} mtp_args;

static void mtp_body(void *arg, int pos0) {
    const mtp_args *a = arg;
    model_ctx *c = a->c;
    const model *m = c->m;
    const model_hparams *hp = &m->hp;
    const model_mtp *mt = m->mtp;
    st_backend *be = c->be;
    const int E = hp->n_embd, n = a->n, il = hp->n_layer;
    st_kv_layer *kv = a->kv;
    /* x = eh_proj [enorm(embed(t)) ; hnorm(h)]: each norm into its half of the rows of c->cat (h is in c->h) */
    be->get_rows(be, &mt->embed, c->ids, n, c->x);
    be->rmsnorm(be, c->x, NULL, mt->enorm, c->o, E, n, hp->rms_eps);
    be->copy_2d(be, c->cat, 2 * (int64_t)E, c->o, E, E, n);
    be->rmsnorm(be, c->h, NULL, mt->hnorm, c->o, E, n, hp->rms_eps);
    be->copy_2d(be, c->cat + E, 2 * (int64_t)E, c->o, E, E, n);
    be->matmul(be, &mt->eh_proj, 0, c->cat, c->x, n);
    /* one decoder block, layer n_layer: the family's attention over its own rows of the cache, then the experts */
    be->rmsnorm(be, c->x, NULL, m->layers[il].attn_norm, c->h, E, n, hp->rms_eps);
    attention_layer(c, il, &kv, &pos0, &n, 1, n);
    ffn_block(c, il, n, il + 1);
    be->rmsnorm(be, c->x, NULL, mt->head_norm, c->h, E, n, hp->rms_eps);
    if (a->head) be->matmul(be, &mt->head, 0, c->h, c->logits, n);
}

size_t model_mtp_rows_bytes(const model_hparams *hp, int n_ubatch) {
    return (size_t)n_ubatch * 2 * (size_t)hp->n_embd * sizeof(float);
}

void model_ctx_add_mtp(model_ctx *c) {
    if (!c->cat) c->cat = c->be->alloc(c->be, model_mtp_rows_bytes(&c->m->hp, c->n_ubatch));
}

void model_forward_mtp(model_ctx *c, st_kv_layer *kv, const int32_t *toks, const float *h_in, int n, int pos0,
                       float *h_out, float *logits) {
    const model *m = c->m;
    ST_ASSERT(m->mtp && c->cat && !c->split.il1 && n > 0 && n <= c->n_ubatch && pos0 + n <= kv[0].n_ctx);
    st_backend *be = c->be;
    const size_t E = (size_t)m->hp.n_embd;
    mtp_args a;
    memset(&a, 0, sizeof a);
    a.c = c;
    a.kv = kv;
    a.n = n;
    a.head = logits != NULL;
    be->to_device(be, c->ids, toks, (size_t)n * sizeof(int32_t));
    be->to_device(be, c->h, h_in, (size_t)n * E * sizeof(float));
    /* not recorded (arg size 0): its steps alternate with the decoder's verify
     * passes and between catch-up and drafting, each a new recording */
    be->run_step(be, n, pos0, mtp_body, &a, 0);
    if (h_out) be->to_host(be, h_out, c->h, (size_t)n * E * sizeof(float));
    if (logits) be->to_host(be, logits, c->logits, (size_t)n * m->hp.n_vocab * sizeof(float));
}
