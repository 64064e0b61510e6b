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

typedef struct {
    engine_placed *pl;
    int routed;          /* place the routed experts too */
    const float ***kept; /* the bias fields of the routed weights left in place (n_kept) */
    int n_kept;
} place_walk;

static void walk_weight(void *ctx, st_weight *w, model_tensor_class cls) {
    place_walk *pw = ctx;
    if (cls == MT_ROUTED && !pw->routed) {
        pw->kept = st_realloc(pw->kept, (size_t)(pw->n_kept + 1) * sizeof *pw->kept);
        pw->kept[pw->n_kept++] = &w->bias; /* its row comes later in the table (model_tensors.c WB) */
        return;
    }
    place_weight(pw->pl, w);
}

/* A routed weight's biases (gpt-oss) stay where its experts stay: in host
 * memory, where the CPU lane reads them; the expert lanes keep a device
 * copy of their own for the pairs computed there (moe_lanes.c). */
static void walk_vec(void *ctx, const float **v, int64_t n) {
    place_walk *pw = ctx;
    for (int i = 0; i < pw->n_kept; i++)
        if (v == pw->kept[i]) return;
    *v = place_vec(pw->pl, *v, n);
}

engine_placed *engine_place_model(model *m, st_backend *be, int routed, int mtp) {
    engine_placed *pl = st_calloc(1, sizeof *pl);
    pl->be = be;
    place_walk pw = {pl, routed, NULL, 0};
    model_each_tensor(m, walk_weight, walk_vec, &pw);
    st_free(pw.kept);
    const size_t model_bytes = pl->bytes;
    if (mtp && m->mtp) { /* the whole block, its experts too (the lanes do not serve it) */
        place_walk pm = {pl, 1, NULL, 0};
        model_each_mtp_tensor(m, walk_weight, walk_vec, &pm);
    }
    ST_INFO("placed %.1f MiB of weights in %d tensors on the %s backend%s%s", (double)pl->bytes / (1 << 20), pl->n,
            be->name, routed ? "" : " (routed experts apart)",
            pl->bytes > model_bytes ? ", the multi-token prediction block's among them" : "");
    return pl;
}

/* Byte accounting over the same list: tied output weights counted once. */
typedef struct {
    const model *m;
    size_t dense, routed;
} bytes_walk;

static void count_weight(void *ctx, st_weight *w, model_tensor_class cls) {
    bytes_walk *b = ctx;
    if (!w->data || (w == &b->m->output && w->data == b->m->tok_embd.data)) return;
    const size_t bytes = (size_t)w->n_mat * (size_t)w->n_out * w->row_bytes;
    if (cls == MT_ROUTED) b->routed += bytes;
    else b->dense += bytes;
}

static void count_vec(void *ctx, const float **v, int64_t n) {
    if (*v) ((bytes_walk *)ctx)->dense += (size_t)n * sizeof(float);
}

size_t engine_weight_bytes(model *m, size_t *routed) {
    bytes_walk b = {m, 0, 0};
    model_each_tensor(m, count_weight, count_vec, &b);
    if (routed) *routed = b.routed;
    return b.dense;
}

/* The block's tensors that are not the model's own (its head and embedding
 * may be the model's output and token embedding, its head norm the output
 * norm). */
static void count_mtp_weight(void *ctx, st_weight *w, model_tensor_class cls) {
    (void)cls;
    bytes_walk *b = ctx;
    if (!w->data || w->data == b->m->output.data || w->data == b->m->tok_embd.data) return;
    b->dense += (size_t)w->n_mat * (size_t)w->n_out * w->row_bytes;
}

static void count_mtp_vec(void *ctx, const float **v, int64_t n) {
    bytes_walk *b = ctx;
    if (*v && *v != b->m->output_norm) b->dense += (size_t)n * sizeof(float);
}

size_t engine_mtp_bytes(model *m) {
    bytes_walk b = {m, 0, 0};
    model_each_mtp_tensor(m, count_mtp_weight, count_mtp_vec, &b);
    return b.dense;
}

void engine_place_free(engine_placed *pl) {
    if (!pl) return;
    for (int i = 0; i < pl->n; i++) pl->be->free(pl->be, pl->dev[i]);
    for (int i = 0; i < pl->n_mats; i++) st_free(pl->mats[i]);
    st_free(pl->mats);
    st_free(pl->host);
    st_free(pl->dev);
    st_free(pl);
}
