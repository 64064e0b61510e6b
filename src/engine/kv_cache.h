/* The KV cache of one sequence: per layer, n_ctx rows of K and V in f16 or
 * int8 (one f32 scale per head and row), allocated on the backend's device.
 * A hybrid family's DeltaNet layers hold their recurrent state here instead
 * (st_kv_layer conv, ssm): it describes the whole history, not one row per
 * position, so a prefix can be reused only where the state was left, at the
 * sequence's end (engine_seq_reuse_prefix). */
#ifndef STRATA_ENGINE_KV_CACHE_H
#define STRATA_ENGINE_KV_CACHE_H

#include <stdint.h>

#include "model/model.h"

typedef struct {
    st_backend *be;
    st_kv_type type;
    int n_layer, n_ctx;
    st_kv_layer *layers;          /* (n_layer) */
    int recurrent;                /* some layers keep a recurrent state */
    size_t conv_bytes, ssm_bytes; /* of one recurrent layer's st_kv_layer conv, ssm */
    /* Recurrent caches: one saved copy of every recurrent layer's state (host
     * memory), taken after a prompt chunk, and the ck_pos tokens it describes,
     * so that a prompt sharing those tokens but not the whole history (the
     * next turn of a chat whose answer was re-tokenized, a regenerated answer)
     * restarts from there instead of from zero. */
    int ck_pos;      /* 0: none */
    int32_t *ck_tok; /* (n_ctx) */
    float *ck_state; /* every recurrent layer's conv then ssm values, in layer order */
    /* Speculative decoding: a verify pass from spec_pos (-1: none) records in
     * every recurrent layer how to undo it (st_kv_layer undo), up to undo_alloc
     * tokens, until kv_cache_spec_keep. */
    st_gdn gdn; /* the DeltaNet layers' sizes (no weights): what the undo record's layout needs */
    int spec_pos, undo_alloc;
} kv_cache;

/* Bytes a cache of n_ctx positions takes (the recurrent state included). */
size_t kv_cache_bytes(const model_hparams *hp, int n_ctx, st_kv_type type);
/* The same for layers [il0, il1) only (a layer split's rank, engine/split.h). */
size_t kv_cache_range_bytes(const model_hparams *hp, int n_ctx, st_kv_type type, int il0, int il1);
/* Of those, the recurrent layers' state: the same for any n_ctx (0 for most families). */
size_t kv_cache_state_bytes(const model_hparams *hp);
kv_cache *kv_cache_create(st_backend *be, const model_hparams *hp, int n_ctx, st_kv_type type);
/* The same with buffers for layers [il0, il1) only (a layer split's process,
 * engine/split.h): the others keep their shape fields and no memory. */
kv_cache *kv_cache_create_range(st_backend *be, const model_hparams *hp, int n_ctx, st_kv_type type, int il0, int il1);
void kv_cache_free(kv_cache *kv);
/* One more attention layer after the model's, layers[n_layer] (n_layer then
 * counts it): the rows of the multi-token prediction block (--draft mtp). */
void kv_cache_add_mtp_layer(kv_cache *kv, const model_hparams *hp);
/* Bytes that layer takes at n_ctx positions (the memory plan's share of it). */
size_t kv_cache_mtp_bytes(const model_hparams *hp, int n_ctx, st_kv_type type);
/* Save the recurrent state as that of tokens[0..pos) (a no-op without recurrent layers). */
void kv_cache_checkpoint(kv_cache *kv, const int32_t *tokens, int pos);
/* If the saved state describes a prefix of toks[0..n) of at most max_pos
 * tokens, put it back into the layers and return its length; else 0. */
int kv_cache_restore(kv_cache *kv, const int32_t *toks, int n, int max_pos);
/* Speculative decoding (a recurrent cache's rollback): the next n tokens,
 * evaluated from position pos, are a verify pass whose state can be undone
 * (memory: the state once plus a few rows per token, per recurrent layer). A
 * no-op without recurrent layers, whose rows need no undoing. */
void kv_cache_spec_begin(kv_cache *kv, int pos, int n);
/* End of that pass: the recurrent state as if only the first n_keep of its
 * tokens had been evaluated (n_keep = all of them: kept as it is). */
void kv_cache_spec_keep(kv_cache *kv, int n_keep);
/* Parse "f16" / "int8"; -1 if neither. */
int kv_type_from_name(const char *s);

#endif
