/* Weight placement for a device backend (engine_place.h): every weight
 * matrix and every norm/bias vector of the model is copied once to the
 * backend's memory (be->alloc + be->to_device), and the model's pointers are
 * switched to the copies. The forward pass then runs unchanged: it only ever
 * hands the backend pointers the backend can read.
 *
 * A tensor reached twice (tied embeddings: output = tok_embd) is copied once.
 * The host pointers stay valid in the GGUF mmap and in model->owned, which
 * model_free still frees as before; the copies are freed by
 * engine_place_free, before the backend is destroyed.
 */
#include "engine/engine_place.h"

#include "core/alloc.h"
#include "core/log.h"

struct engine_placed {
    st_backend *be;
    const void **host; /* (n) host pointer of each copy, to find repeats */
    void **dev;        /* (n) its device copy */
    int n, cap;
    const void ***mats; /* per-matrix pointer tables built here (experts placed apart) */
    int n_mats;
    size_t bytes;
};

static void *copy_once(engine_placed *pl, const void *host, size_t bytes) {
    for (int i = 0; i < pl->n; i++)
        if (pl->host[i] == host) return pl->dev[i];
    if (pl->n == pl->cap) {
        pl->cap = pl->cap ? pl->cap * 2 : 256;
        pl->host = st_realloc(pl->host, (size_t)pl->cap * sizeof *pl->host);
        pl->dev = st_realloc(pl->dev, (size_t)pl->cap * sizeof *pl->dev);
    }
    void *d = pl->be->alloc(pl->be, bytes);
    pl->be->to_device(pl->be, d, host, bytes);
    pl->host[pl->n] = host;
    pl->dev[pl->n++] = d;
    pl->bytes += bytes;
    return d;
}

static const float *place_vec(engine_placed *pl, const float *v, int64_t n) {
    return v ? copy_once(pl, v, (size_t)n * sizeof(float)) : NULL;
}

static void place_weight(engine_placed *pl, st_weight *w) {
    if (!w->data) return;
    size_t mat_bytes = (size_t)w->n_out * w->row_bytes;
    if (!w->mat) {
        w->data = copy_once(pl, w->data, mat_bytes * (size_t)w->n_mat);
        return;
    }
    /* matrices placed apart on the host: a new host table of device pointers */
    const void **tab = st_malloc((size_t)w->n_mat * sizeof *tab);
    for (int64_t m = 0; m < w->n_mat; m++) tab[m] = copy_once(pl, w->mat[m], mat_bytes);
    pl->mats = st_realloc(pl->mats, (size_t)(pl->n_mats + 1) * sizeof *pl->mats);
    pl->mats[pl->n_mats++] = tab;
    w->mat = tab;
    w->data = tab[0];
}

engine_placed *engine_place_model(model *m, st_backend *be) {
    const model_hparams *hp = &m->hp;
    engine_placed *pl = st_calloc(1, sizeof *pl);
    pl->be = be;
    int64_t E = hp->n_embd, qw = (int64_t)hp->n_head * hp->head_dim, kvw = (int64_t)hp->n_head_kv * hp->head_dim;
    place_weight(pl, &m->tok_embd);
    place_weight(pl, &m->output);
    m->output_norm = place_vec(pl, m->output_norm, E);
    m->rope_freqs = place_vec(pl, m->rope_freqs, hp->head_dim / 2);
    for (int il = 0; il < hp->n_layer; il++) {
        model_layer *l = &m->layers[il];
        l->attn_norm = place_vec(pl, l->attn_norm, E);
        st_weight *ws[] = {&l->wq, &l->wk, &l->wv, &l->wo, &l->ffn_gate, &l->ffn_up, &l->ffn_down,
                           &l->ffn_gate_inp, &l->ffn_gate_exps, &l->ffn_up_exps, &l->ffn_down_exps};
        for (size_t i = 0; i < sizeof ws / sizeof ws[0]; i++) place_weight(pl, ws[i]);
        l->bq = place_vec(pl, l->bq, qw);
        l->bk = place_vec(pl, l->bk, kvw);
        l->bv = place_vec(pl, l->bv, kvw);
        l->q_norm = place_vec(pl, l->q_norm, hp->head_dim);
        l->k_norm = place_vec(pl, l->k_norm, hp->head_dim);
        l->post_attn_norm = place_vec(pl, l->post_attn_norm, E);
        l->ffn_norm = place_vec(pl, l->ffn_norm, E);
        l->post_ffn_norm = place_vec(pl, l->post_ffn_norm, E);
    }
    ST_INFO("placed %.1f MiB of weights in %d tensors on the %s backend", (double)pl->bytes / (1 << 20), pl->n,
            be->name);
    return pl;
}

size_t engine_placed_bytes(const engine_placed *pl) { return pl ? pl->bytes : 0; }

void engine_place_free(engine_placed *pl) {
    if (!pl) return;
    for (int i = 0; i < pl->n; i++) pl->be->free(pl->be, pl->dev[i]);
    for (int i = 0; i < pl->n_mats; i++) st_free(pl->mats[i]);
    st_free(pl->mats);
    st_free(pl->host);
    st_free(pl->dev);
    st_free(pl);
}
