/* The forward pass of every supported family, against the backend interface.
 * A model_ctx owns the activation buffers (on the backend's device) for up
 * to n_ubatch tokens; longer inputs are processed in chunks of that size. */
#ifndef STRATA_MODEL_FORWARD_H
#define STRATA_MODEL_FORWARD_H

#include "model/model.h"

typedef struct model_ctx model_ctx;

model_ctx *model_ctx_create(const model *m, st_backend *be, int n_ubatch);
void model_ctx_free(model_ctx *c);

/* Run n_tok tokens at positions pos0.. through the model, appending their K/V
 * to kv[0..n_layer-1]. logits (host memory) receives n_vocab floats for the
 * last token, or for every token ([n_tok][n_vocab]) when all_logits. */
void model_forward(model_ctx *c, st_kv_layer *kv, const int32_t *tokens, int n_tok, int pos0, float *logits,
                   int all_logits);

#endif
