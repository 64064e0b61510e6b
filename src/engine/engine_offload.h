/* Placing a MoE model's experts at engine start (engine_offload.c): the
 * memory plan, and the expert lanes when not every expert fits the device. */
#ifndef STRATA_ENGINE_ENGINE_OFFLOAD_H
#define STRATA_ENGINE_ENGINE_OFFLOAD_H

#include <stdint.h>

#include "engine/engine.h"
#include "engine/engine_place.h"
#include "engine/expert_plan.h"

/* Plans m's memory on *be (a device backend; the CPU backend with
 * p->expert_cache >= 0 for tests) for n_ctx positions per sequence and
 * chunks of n_ubatch rows, logs the plan, places the weights (*placed) and,
 * when experts stay in host RAM, replaces *be with the lanes backend that
 * owns it (and a CPU lane of p->n_threads threads). 0: every weight on the
 * device; 1: lanes; -1 with st_error (the budget cannot hold the dense part,
 * a bad profile): nothing placed, *be unchanged. */
int engine_offload(const engine_params *p, model *m, int n_ctx, int *n_ubatch, st_backend **be,
                   struct engine_placed **placed);

/* The plan engine_offload makes, for strata launch --plan and strata device
 * --selftest to print the same: the plan's input for m at n_ctx positions
 * per sequence (p->n_seq sequences, p->kv_type), chunks of n_ubatch rows and
 * a device budget in bytes; then the plan itself, with p->expert_cache and
 * p->expert_profile (0, or -1 with st_error: the dense part does not fit, a
 * bad profile, a model without routed experts). */
void engine_plan_input(const engine_params *p, model *m, int n_ctx, int n_ubatch, size_t budget, expert_plan_in *in);
int engine_plan_memory(const engine_params *p, model *m, int n_ctx, int n_ubatch, size_t budget, expert_plan_in *in,
                       expert_plan *out);
/* The prompt chunk (rows per forward step) for m at n_ctx positions on a
 * device with budget bytes: p->n_ubatch when given (--prefill N); else 512,
 * or, when the plan streams experts (not all resident), the largest of
 * 4096, 2048 and 1024 (at most n_ctx) whose scratch beyond 512 rows takes at
 * most an eighth of the budget. A chunk moves each chosen expert of a layer
 * over PCIe once, so longer chunks move fewer bytes per token (H200, every
 * expert in RAM: 10,118 tok/s with 4096-row chunks, 3,587 with 512). */
int engine_prefill_chunk(const engine_params *p, model *m, int n_ctx, size_t budget);
/* The budget on a device with free_bytes free: --vram-budget, else the free
 * memory less --vram-reserve (default 512 MiB). */
size_t engine_device_budget(const engine_params *p, size_t free_bytes);
/* Device memory besides weights and KV for chunks of n_ubatch rows (an
 * estimate on the safe side). */
size_t engine_scratch_bytes(const model_hparams *hp, int n_ubatch);

/* Expert profiles (strata profile): text, a header line, "L X", then L lines
 * of X routing counts. load: NULL with st_error when missing, malformed or
 * of another shape. */
uint64_t *expert_profile_load(const char *path, int n_layer, int n_expert);
int expert_profile_save(const char *path, const uint64_t *counts, int n_layer, int n_expert);

#endif
