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
/* Its variants (backend.h st_variant: attention kernels, MoE path, fused
 * ops, cuBLAS refused) are set per backend through be->variant. */

#ifdef __cplusplus
}
#endif

#endif
