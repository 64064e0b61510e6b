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
 * Per-head products go through copy_2d: a head's slice of every row is packed
 * into a matrix, multiplied by its matrix of W_kb / W_vb, and put back.
 * YaRN: the frequencies as per-pair divisors of the plain rope, computed at
 * load (model_load.c's yarn_divisors, which gpt-oss shares); its magnitude
 * factor cancels in the rope and is the attention scale's mscale^2.
 */
#include "model/forward_mla.h"

#include <math.h>

#include "core/alloc.h"
#include "core/log.h"

struct mla_bufs {
    float *qa;      /* [B][q_lora] */
    float *qf;      /* [B][n_head * head_dim_mla] */
    float *kva;     /* [B][kv_lora + n_rot] */
    float *t1, *t2; /* [B][max(nope, kv_lora, v_head)] a head's packed input and output */
    float *vo;      /* [B][n_head * v_head_mla] */
    float *div;     /* [n_rot / 2] YaRN frequency divisors (backend memory), or NULL */
};

static float *balloc(st_backend *be, size_t n) {
    return be->alloc(be, n * sizeof(float));
}

mla_bufs *mla_bufs_create(const model *m, st_backend *be, int n_ubatch) {
    const model_hparams *hp = &m->hp;
    mla_bufs *b = st_calloc(1, sizeof *b);
    const size_t B = (size_t)n_ubatch, nope = (size_t)(hp->head_dim_mla - hp->n_rot);
    size_t w = (size_t)hp->kv_lora;
    if (nope > w) w = nope;
    if ((size_t)hp->v_head_mla > w) w = (size_t)hp->v_head_mla;
    if (hp->q_lora) b->qa = balloc(be, B * (size_t)hp->q_lora);
    b->qf = balloc(be, B * (size_t)hp->n_head * (size_t)hp->head_dim_mla);
    b->kva = balloc(be, B * (size_t)(hp->kv_lora + hp->n_rot));
    b->t1 = balloc(be, B * w);
    b->t2 = balloc(be, B * w);
    b->vo = balloc(be, B * (size_t)hp->n_head * (size_t)hp->v_head_mla);
    if (m->rope_freqs) { /* YaRN's divisors (model_load.c), in the backend's memory */
        b->div = balloc(be, (size_t)(hp->n_rot / 2));
        be->to_device(be, b->div, m->rope_freqs, (size_t)(hp->n_rot / 2) * sizeof(float));
    }
    return b;
}

void mla_bufs_free(mla_bufs *b, st_backend *be) {
    if (!b) return;
    float *p[] = {b->qa, b->qf, b->kva, b->t1, b->t2, b->vo, b->div};
    for (size_t i = 0; i < sizeof p / sizeof p[0]; i++)
        if (p[i]) be->free(be, p[i]);
    st_free(b);
}

const float *mla_attention(const model *m, st_backend *be, mla_bufs *b, int il, const float *h, float *q,
                          float *krow, float *att, st_kv_layer *const *kv, const int *pos0, const int *n_tok,
                          int n_seq, int rows) {
    const model_hparams *hp = &m->hp;
    const model_layer *l = &m->layers[il];
    const int R = hp->n_rot, C = hp->kv_lora, D = hp->head_dim_mla, N = D - R, V = hp->v_head_mla;
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
    be->copy_2d(be, b->t1, C, b->kva, C + R, C, rows);
    be->rmsnorm(be, b->t1, NULL, l->kv_a_norm, b->t1, C, rows, hp->rms_eps);
    be->copy_2d(be, krow + R, HD, b->t1, C, C, rows);
    /* each head's query: q_pe, then q_nope through W_kb[head] into the latent space */
    for (int hd = 0; hd < H; hd++) {
        const float *qh = b->qf + (size_t)hd * D;
        be->copy_2d(be, q + (size_t)hd * HD, (int64_t)H * HD, qh + N, (int64_t)H * D, R, rows);
        be->copy_2d(be, b->t1, N, qh, (int64_t)H * D, N, rows);
        be->matmul(be, &l->wk_b, hd, b->t1, b->t2, rows);
        be->copy_2d(be, q + (size_t)hd * HD + R, (int64_t)H * HD, b->t2, C, C, rows);
    }
    /* adjacent pairs (llama.cpp's NORM rope); YaRN, if any, is in the divisors */
    const st_rope rope = {hp->rope_theta, 1.0f, 0, b->div, R};
    for (int s = 0, r = 0; s < n_seq; s++) {
        const int n = n_tok ? n_tok[s] : 1;
        float *qs = q + (size_t)r * H * HD, *ks = krow + (size_t)r * HD;
        /* the row is its own value row: k and v are the same array here and in the cache */
        be->qkv_prep(be, qs, ks, ks, NULL, NULL, hp->rms_eps, n, H, &rope, &kv[s][il], pos0[s]);
        be->attention(be, qs, &kv[s][il], n, pos0[s], H, hp->attn_scale, 0,
                      att + (size_t)r * H * HD);
        r += n;
    }
    /* each head's latent output through W_vb[head] to its values */
    for (int hd = 0; hd < H; hd++) {
        be->copy_2d(be, b->t1, C, att + (size_t)hd * HD + R, (int64_t)H * HD, C, rows);
        be->matmul(be, &l->wv_b, hd, b->t1, b->t2, rows);
        be->copy_2d(be, b->vo + (size_t)hd * V, (int64_t)H * V, b->t2, V, V, rows);
    }
    return b->vo;
}
