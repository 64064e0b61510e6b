/* The KV cache of one sequence: per layer, n_ctx rows of K and V in f16 or
 * int8 (one f32 scale per head and row), allocated on the backend's device.
 * A hybrid family's DeltaNet layers hold their recurrent state here instead
 * (st_kv_layer conv, ssm): it describes the whole history, not one row per
 * position, so a prefix can be reused only where the state was left, at the
 * sequence's end (engine_seq_reuse_prefix). */
#ifndef STRATA_ENGINE_KV_CACHE_H
#define STRATA_ENGINE_KV_CACHE_H

#include "model/model.h"

typedef struct {
    st_backend *be;
    st_kv_type type;
    int n_layer, n_ctx;
    st_kv_layer *layers; /* (n_layer) */
    int recurrent;       /* some layers keep a recurrent state */
} kv_cache;

/* Bytes a cache of n_ctx positions takes. */
size_t kv_cache_bytes(const model_hparams *hp, int n_ctx, st_kv_type type);
kv_cache *kv_cache_create(st_backend *be, const model_hparams *hp, int n_ctx, st_kv_type type);
void kv_cache_free(kv_cache *kv);
/* Parse "f16" / "int8"; -1 if neither. */
int kv_type_from_name(const char *s);

#endif
