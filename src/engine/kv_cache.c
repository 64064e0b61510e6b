/* KV cache allocation (see kv_cache.h). int8 halves the bytes attention reads
 * per position, which is what long-context decode is bound by. A hybrid
 * family's DeltaNet layers keep a fixed-size f32 state instead of rows; an
 * MLA layer (deepseek2) one array of rows that serves as both K and V. */
#include "engine/kv_cache.h"

#include <string.h>

#include "core/alloc.h"
#include "core/log.h"

static size_t row_elems(const model_hparams *hp) { return (size_t)hp->n_head_kv * hp->head_dim; }

/* f32 values of a DeltaNet layer's state: the convolution's last inputs, then S per value head */
static size_t conv_elems(const model_hparams *hp) {
    return (size_t)(hp->ssm_d_conv - 1) * (size_t)(2 * hp->ssm_n_k_head + hp->ssm_n_v_head) * hp->ssm_head_dim;
}
static size_t ssm_elems(const model_hparams *hp) {
    return (size_t)hp->ssm_n_v_head * hp->ssm_head_dim * hp->ssm_head_dim;
}

size_t kv_cache_bytes(const model_hparams *hp, int n_ctx, st_kv_type type) {
    return kv_cache_range_bytes(hp, n_ctx, type, 0, hp->n_layer);
}

size_t kv_cache_range_bytes(const model_hparams *hp, int n_ctx, st_kv_type type, int il0, int il1) {
    size_t per = type == ST_KV_F16 ? row_elems(hp) * 2 : row_elems(hp) + (size_t)hp->n_head_kv * sizeof(float);
    size_t b = 0;
    for (int il = il0; il < il1; il++)
        b += model_layer_recurrent(hp, il) ? (conv_elems(hp) + ssm_elems(hp)) * sizeof(float)
                                           : (model_layer_mla(hp) ? 1 : 2) * per * (size_t)n_ctx;
    return b;
}

size_t kv_cache_state_bytes(const model_hparams *hp) {
    size_t b = 0;
    for (int il = 0; il < hp->n_layer; il++)
        if (model_layer_recurrent(hp, il)) b += (conv_elems(hp) + ssm_elems(hp)) * sizeof(float);
    return b;
}

/* An attention layer's rows (l's type and n_ctx set): K and V, or for
 * multi-head latent attention one array that serves as both (a row is the
 * rope key and the normalised latent, which is also what the values are
 * read from in the absorbed form), with int8's scales. */
static void alloc_rows(st_backend *be, const model_hparams *hp, st_kv_layer *l) {
    const size_t elem = l->type == ST_KV_F16 ? 2 : 1, n_ctx = (size_t)l->n_ctx;
    l->k = be->alloc(be, row_elems(hp) * elem * n_ctx);
    if (model_layer_mla(hp)) {
        l->v = l->k;
        if (l->type == ST_KV_INT8) l->k_scale = l->v_scale = be->alloc(be, sizeof(float) * n_ctx);
        return;
    }
    l->v = be->alloc(be, row_elems(hp) * elem * n_ctx);
    if (l->type == ST_KV_INT8) {
        l->k_scale = be->alloc(be, (size_t)hp->n_head_kv * sizeof(float) * n_ctx);
        l->v_scale = be->alloc(be, (size_t)hp->n_head_kv * sizeof(float) * n_ctx);
    }
}

kv_cache *kv_cache_create(st_backend *be, const model_hparams *hp, int n_ctx, st_kv_type type) {
    return kv_cache_create_range(be, hp, n_ctx, type, 0, hp->n_layer);
}

kv_cache *kv_cache_create_range(st_backend *be, const model_hparams *hp, int n_ctx, st_kv_type type, int il0, int il1) {
    kv_cache *kv = st_calloc(1, sizeof *kv);
    kv->be = be;
    kv->type = type;
    kv->n_layer = hp->n_layer;
    kv->n_ctx = n_ctx;
    kv->layers = st_calloc((size_t)hp->n_layer, sizeof(st_kv_layer));
    kv->spec_pos = -1;
    kv->gdn = (st_gdn){.d_conv = hp->ssm_d_conv,
                       .n_k_head = hp->ssm_n_k_head,
                       .n_v_head = hp->ssm_n_v_head,
                       .head_dim = hp->ssm_head_dim,
                       .k_grouped = hp->ba_fused}; /* as forward.c's recurrent_block sets them */
    for (int il = 0; il < hp->n_layer; il++) {
        st_kv_layer *l = &kv->layers[il];
        l->type = type;
        l->n_ctx = n_ctx;
        l->n_head_kv = hp->n_head_kv;
        l->head_dim = hp->head_dim;
        if (il < il0 || il >= il1) continue; /* another process's layer */
        if (model_layer_recurrent(hp, il)) {
            /* zeroed by the first step of a sequence (position 0) */
            l->conv = be->alloc(be, conv_elems(hp) * sizeof(float) + 1); /* d_conv 1: no inputs kept */
            l->ssm = be->alloc(be, ssm_elems(hp) * sizeof(float));
            kv->conv_bytes = conv_elems(hp) * sizeof(float);
            kv->ssm_bytes = ssm_elems(hp) * sizeof(float);
            kv->recurrent = 1;
            continue;
        }
        alloc_rows(be, hp, l);
    }
    return kv;
}

size_t kv_cache_mtp_bytes(const model_hparams *hp, int n_ctx, st_kv_type type) {
    return kv_cache_range_bytes(hp, n_ctx, type, hp->n_layer, hp->n_layer + 1);
}

void kv_cache_add_mtp_layer(kv_cache *kv, const model_hparams *hp) {
    ST_ASSERT(kv->n_layer == hp->n_layer);
    kv->layers = st_realloc(kv->layers, (size_t)(kv->n_layer + 1) * sizeof(st_kv_layer));
    st_kv_layer *l = &kv->layers[kv->n_layer++];
    memset(l, 0, sizeof *l);
    l->type = kv->type;
    l->n_ctx = kv->n_ctx;
    l->n_head_kv = hp->n_head_kv;
    l->head_dim = hp->head_dim;
    alloc_rows(kv->be, hp, l);
}

void kv_cache_free(kv_cache *kv) {
    if (!kv) return;
    for (int il = 0; il < kv->n_layer; il++) {
        st_kv_layer *l = &kv->layers[il];
        void *p[] = {l->k,       l->v != l->k ? l->v : NULL,
                     l->k_scale, l->v_scale != l->k_scale ? l->v_scale : NULL,
                     l->conv,    l->ssm,
                     l->undo};
        for (int i = 0; i < 7; i++)
            if (p[i]) kv->be->free(kv->be, p[i]);
    }
    st_free(kv->layers);
    st_free(kv->ck_tok);
    st_free(kv->ck_state);
    st_free(kv);
}

/* Copy every recurrent layer's state to (save) or from the checkpoint. */
static void ck_copy(kv_cache *kv, int save) {
    st_backend *be = kv->be;
    size_t off = 0;
    for (int il = 0; il < kv->n_layer; il++) {
        st_kv_layer *l = &kv->layers[il];
        if (!l->ssm) continue;
        void *parts[2] = {l->conv, l->ssm};
        const size_t bytes[2] = {kv->conv_bytes, kv->ssm_bytes};
        for (int i = 0; i < 2; i++) {
            if (save) be->to_host(be, (char *)kv->ck_state + off, parts[i], bytes[i]);
            else be->to_device(be, parts[i], (char *)kv->ck_state + off, bytes[i]);
            off += bytes[i];
        }
    }
}

void kv_cache_checkpoint(kv_cache *kv, const int32_t *tokens, int pos) {
    if (!kv->recurrent || pos <= 0) return;
    if (!kv->ck_state) {
        size_t n = 0;
        for (int il = 0; il < kv->n_layer; il++)
            if (kv->layers[il].ssm) n += kv->conv_bytes + kv->ssm_bytes;
        kv->ck_state = st_malloc(n);
        kv->ck_tok = st_malloc((size_t)kv->n_ctx * sizeof(int32_t));
    }
    ck_copy(kv, 1);
    memcpy(kv->ck_tok, tokens, (size_t)pos * sizeof(int32_t));
    kv->ck_pos = pos;
}

int kv_cache_restore(kv_cache *kv, const int32_t *toks, int n, int max_pos) {
    const int p = kv->ck_pos;
    if (!kv->recurrent || p <= 0 || p > max_pos || p > n || memcmp(kv->ck_tok, toks, (size_t)p * sizeof(int32_t)))
        return 0;
    ck_copy(kv, 0);
    return p;
}

void kv_cache_spec_begin(kv_cache *kv, int pos, int n) {
    if (!kv->recurrent) return;
    ST_ASSERT(kv->spec_pos < 0 && n > 0 && pos >= 0);
    const int grow = n > kv->undo_alloc;
    if (grow) kv->undo_alloc = n;
    for (int il = 0; il < kv->n_layer; il++) {
        st_kv_layer *l = &kv->layers[il];
        if (!l->ssm) continue;
        if (grow) {
            if (l->undo) kv->be->free(kv->be, l->undo);
            l->undo = kv->be->alloc(kv->be, st_gdn_undo_floats(&kv->gdn, n) * sizeof(float));
        }
        l->undo_cap = n;
        l->undo_n = 0;
    }
    kv->spec_pos = pos;
}

void kv_cache_spec_keep(kv_cache *kv, int n_keep) {
    if (!kv->recurrent) return;
    ST_ASSERT(kv->spec_pos >= 0);
    for (int il = 0; il < kv->n_layer; il++) {
        st_kv_layer *l = &kv->layers[il];
        if (l->ssm) kv->be->gated_delta_net_keep(kv->be, &kv->gdn, l, n_keep);
    }
    kv->spec_pos = -1;
}

int kv_type_from_name(const char *s) {
    if (!strcmp(s, "f16")) return ST_KV_F16;
    if (!strcmp(s, "int8")) return ST_KV_INT8;
    return -1;
}
