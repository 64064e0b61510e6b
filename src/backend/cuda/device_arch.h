/* The start-up check's decision, apart from the device: given a card's
 * properties (as the runtime reports them) and the build's architecture
 * list, is there code for it, and if not, the one line that refuses it.
 * Plain C with no GPU toolkit, so that a CPU-only test can feed it fake
 * cards (tests/cuda/test_gpu_arch.c): there is no AMD GPU to test on.
 * device.cu calls it with the real properties and STRATA_GPU_ARCHS.
 */
#ifndef STRATA_BACKEND_CUDA_DEVICE_ARCH_H
#define STRATA_BACKEND_CUDA_DEVICE_ARCH_H

#include <stddef.h>

#include "backend/cuda/device.h"

#ifdef __cplusplus
extern "C" {
#endif

/* What the check looks at, as the runtime gives it. */
typedef struct {
    int index;
    const char *name;       /* "AMD Radeon RX 7900 XTX", "NVIDIA H200" */
    const char *arch_raw;   /* HIP: gcnArchName ("gfx90a:sramecc+:xnack-"); CUDA: unused */
    int cc_major, cc_minor; /* CUDA compute capability */
    int warp_size;          /* HIP: 32 or 64 */
    size_t smem_per_block;  /* bytes of shared memory (LDS) a block may use without opting in */
} gpu_card_props;

/* The smallest per-block shared memory the kernels are written for: the
 * dynamic sizes are kept below CUDA's default 48 KiB (attention, the F32
 * router's split, mmv_f_split_kernel's 47 KiB bound); every AMD target
 * built (gfx906, RDNA2-4) has 64 KiB of LDS per workgroup. */
#define GPU_SMEM_NEEDED (48u * 1024u)

/* The card's architecture name as the build's list spells it: HIP "gfx1100"
 * (feature flags after ':' dropped), CUDA "sm_90". */
void gpu_arch_name(int hip, const gpu_card_props *c, char *out, size_t n);
/* What the build list (comma-separated: HIP "gfx906,gfx1100"; CUDA "90,86-real",
 * CMake's entries) holds for the card. */
gpu_code_kind gpu_arch_code(int hip, const char *list, const gpu_card_props *c);
/* 0 when the card can be used (the probe launch still follows), else -1 and
 * msg holds the one-line refusal naming card, architecture and list. */
int gpu_arch_verdict(int hip, const char *list, const gpu_card_props *c, char *msg, size_t n);

#ifdef __cplusplus
}
#endif

#endif
