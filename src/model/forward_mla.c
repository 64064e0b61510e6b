/* Multi-head latent attention (DeepSeek-V2 paper, section 2.1), in the
 * absorbed form for prompts and decode alike:
 *   c_q = norm(W_qa h) (or h: V2-Lite), q = W_qb c_q, per head q = [q_nope | q_pe]
 *   [c_kv | k_pe] = W_kva h,  c_kv = norm(c_kv)
 *   cache row    = [rope(k_pe) | c_kv]                  (one row per position, n_rot + kv_lora)
 *   query, head  = [rope(q_pe) | W_kb[head] q_nope]     (q_nope moved into the latent space)
 *   a[head]      = softmax(scale * query . rows) . rows (one-head attention over the cache)
 *   out[head]    = W_vb[head] a[head][n_rot:]           (the latent part, back to values)
 *   o            = W_o out
 * which equals attention over the decompressed keys [W_kb^T c_kv | k_pe] and
 * values W_vb c_kv (the naive form tests/ref/ref_deepseek2.py computes). The
 * cache keeps n_rot + kv_lora values per position (576 for V3) instead of
 * n_head * (192 + 128); its row is also its value row (kv_cache.c), so the
 * backend's plain qkv_prep and attention over one KV head do the work. The
 * weighted sum also carries the rope part, which is dropped: n_rot of
 * n_rot + kv_lora values of extra work, against a separate kernel.
 * Per-head products: every head's slice of every row packed by one copy_2d,
 * multiplied by its matrix of W_kb / W_vb in one matmul over the whole stack
 * (ST_MAT_ALL), and put back by one copy_2d: a handful of ops per layer
 * instead of a few per head (128 heads: a GPU step of ~1000 launches per
 * layer before).
 * YaRN: the frequencies as per-pair divisors of the plain rope, computed at
 * load (model_load.c's yarn_divisors, which gpt-oss shares); its magnitude
 * factor cancels in the rope and is the attention scale's mscale^2.
 */
#include "model/forward_mla.h"

#include <math.h>

#include "core/alloc.h"
#include "core/log.h"

struct mla_bufs {
    float *qa;  /* [B][q_lora] */
    float *qf;  /* [B][n_head * head_dim_mla] */
    float *kva; /* [B][kv_lora + n_rot] */
    float *hp;  /* [B][n_head][max(nope, kv_lora)] every head's packed product (input or output) */
    float *vo;  /* [B][n_head * v_head_mla] */
    float *div; /* [n_rot / 2] YaRN frequency divisors (backend memory), or NULL */
};

static float *balloc(st_backend *be, size_t n) { return be->alloc(be, n * sizeof(float)); }

mla_bufs *mla_bufs_create(const model *m, st_backend *be, int n_ubatch) {
    const model_hparams *hp = &m->hp;
    mla_bufs *b = st_calloc(1, sizeof *b);
    const size_t B = (size_t)n_ubatch, nope = (size_t)(hp->head_dim_mla - hp->n_rot);
    const size_t w = (size_t)hp->kv_lora > nope ? (size_t)hp->kv_lora : nope;
    if (hp->q_lora) b->qa = balloc(be, B * (size_t)hp->q_lora);
    b->qf = balloc(be, B * (size_t)hp->n_head * (size_t)hp->head_dim_mla);
    b->kva = balloc(be, B * (size_t)(hp->kv_lora + hp->n_rot));
    b->hp = balloc(be, B * (size_t)hp->n_head * w);
    b->vo = balloc(be, B * (size_t)hp->n_head * (size_t)hp->v_head_mla);
    if (m->rope_freqs) { /* YaRN's divisors (model_load.c), in the backend's memory */
        b->div = balloc(be, (size_t)(hp->n_rot / 2));
        be->to_device(be, b->div, m->rope_freqs, (size_t)(hp->n_rot / 2) * sizeof(float));
    }
    return b;
}

void mla_bufs_free(mla_bufs *b, st_backend *be) {
    if (!b) return;
    float *p[] = {b->qa, b->qf, b->kva, b->hp, b->vo, b->div};
    for (size_t i = 0; i < sizeof p / sizeof p[0]; i++)
        if (p[i]) be->free(be, p[i]);
    st_free(b);
}

const float *mla_attention(const model *m, st_backend *be, mla_bufs *b, int il, const float *h, float *q, float *krow,
                           float *att, st_kv_layer *const *kv, const int *pos0, const int *n_tok, int n_seq, int rows) {
    const model_hparams *hp = &m->hp;
    const model_layer *l = &m->layers[il];
    const int R = hp->n_rot, C = hp->kv_lora, D = hp->head_dim_mla, N = D - R;
    /* HD = R + C: the cache row, and each query head */
    const int H = hp->n_head, HD = hp->head_dim;

    if (hp->q_lora) {
        be->matmul(be, &l->wq_a, 0, h, b->qa, rows);
        be->rmsnorm(be, b->qa, NULL, l->q_a_norm, b->qa, hp->q_lora, rows, hp->rms_eps);
        be->matmul(be, &l->wq_b, 0, b->qa, b->qf, rows);
    } else {
        be->matmul(be, &l->wq_b, 0, h, b->qf, rows); /* the plain attn_q, bound to the same field */
    }
    be->matmul(be, &l->wkv_a, 0, h, b->kva, rows);
    /* the cache row: rope key first (st_rope turns a head's first values), then the latent */
    be->copy_2d(be, krow, HD, b->kva + C, C + R, R, rows);
    be->copy_2d(be, b->hp, C, b->kva, C + R, C, rows);
    be->rmsnorm(be, b->hp, NULL, l->kv_a_norm, b->hp, C, rows, hp->rms_eps);
    be->copy_2d(be, krow + R, HD, b->hp, C, C, rows);
    /* each head's query (rows x heads of D: one row per (token, head)): q_pe, then
     * q_nope packed in att (free until the attention) and through W_kb[head] into
     * the latent space */
    const int rh = rows * H;
    be->copy_2d(be, q, HD, b->qf + N, D, R, rh);
    be->copy_2d(be, att, N, b->qf, D, N, rh);
    be->matmul(be, &l->wk_b, ST_MAT_ALL, att, b->hp, rows);
    be->copy_2d(be, q + R, HD, b->hp, C, C, rh);
    /* adjacent pairs (llama.cpp's NORM rope); YaRN, if any, is in the divisors */
    const st_rope rope = {hp->rope_theta, 1.0f, 0, b->div, R};
    for (int s = 0, r = 0; s < n_seq; s++) {
        const int n = n_tok ? n_tok[s] : 1;
        float *qs = q + (size_t)r * H * HD, *ks = krow + (size_t)r * HD;
        /* the row is its own value row: k and v are the same array here and in the cache */
        be->qkv_prep(be, qs, ks, ks, NULL, NULL, hp->rms_eps, n, H, &rope, &kv[s][il], pos0[s]);
        be->attention(be, qs, &kv[s][il], n, pos0[s], H, hp->attn_scale, 0, att + (size_t)r * H * HD);
        r += n;
    }
    /* each head's latent output through W_vb[head] to its values (vo is [rows][H][V]) */
    be->copy_2d(be, b->hp, C, att + R, HD, C, rh);
    be->matmul(be, &l->wv_b, ST_MAT_ALL, b->hp, b->vo, rows);
    return b->vo;
}
