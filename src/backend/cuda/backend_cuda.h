/* The GPU backend's public entry point (C): fills the st_backend op table
 * (backend/backend.h) with CUDA (or HIP) kernels on one device. Only built
 * with STRATA_CUDA / STRATA_HIP; callers test STRATA_HAVE_GPU at start-up.
 *
 * Every pointer the ops take is device memory: activations from be->alloc,
 * and weights and norm vectors the engine has placed there (be->alloc +
 * be->to_device). Ops are queued on the backend's stream; to_host waits.
 */
#ifndef STRATA_BACKEND_CUDA_BACKEND_CUDA_H
#define STRATA_BACKEND_CUDA_BACKEND_CUDA_H

#include "backend/backend.h"

#ifdef __cplusplus
extern "C" {
#endif

/* NULL with st_error (one line naming the card, its architecture and the
 * build's list) if the device is missing or this build cannot run on it. */
st_backend *backend_cuda_create(int device);
/* The decode fusions of this backend (STRATA_CUDA_FUSE's bits; checks run
 * each path): launches what is held first. Returns the old bits, or -1 for
 * a backend that is not the CUDA backend itself (a wrapper). */
int backend_cuda_set_fuse(st_backend *be, int bits);
/* MoE path for every CUDA backend of the process: 0 the default (decode in
 * the fused kernels of mmv_moe.h where they fit, else the grouped products),
 * 1 the per-expert loop (a cross-check for tests), 2 the grouped products
 * only. Returns the old one. */
int backend_cuda_set_moe_path(int path);
/* Attention kernels for every CUDA backend of the process (STRATA_CUDA_ATTN):
 * 0 one block per query head (default, "split"), 1 the query heads of a KV
 * head together ("gqa"), 2 that and tensor cores for prompt chunks ("tc");
 * 1 and 2 are not yet checked on a GPU (docs/cuda.md); -1 back to the
 * switch. Returns the old one. */
int backend_cuda_set_attn_kernel(int mode);

#ifdef __cplusplus
}
#endif

#endif
