/* Placement of a model's weights on a device backend (engine_place.c): the
 * engine owns where weights live; the forward pass and the backends only see
 * st_weight views and vector pointers. */
#ifndef STRATA_ENGINE_ENGINE_PLACE_H
#define STRATA_ENGINE_ENGINE_PLACE_H

#include "model/model.h"

typedef struct engine_placed engine_placed;

/* Copy every weight and norm/bias vector of m (model_each_tensor's list),
 * the routed experts only when `routed`, and with `mtp` the multi-token
 * prediction block whole (model_each_mtp_tensor: --draft mtp), to be's
 * memory and point m's tensors at the copies (what was copied then only
 * runs on be). Aborts on device errors (the backend's own checks); returns
 * the record of the copies. */
engine_placed *engine_place_model(model *m, st_backend *be, int routed, int mtp);
/* Bytes of m's weights but the routed experts (norms and biases as f32), and
 * of the routed experts in *routed: what engine_place_model would copy. */
size_t engine_weight_bytes(model *m, size_t *routed);
/* Bytes of the multi-token prediction block that engine_place_model(.., 1)
 * adds (what it shares with the model, its head or embedding, not again);
 * 0 without one. */
size_t engine_mtp_bytes(model *m);
/* Free the copies (before the backend is destroyed). */
void engine_place_free(engine_placed *pl);

#endif
