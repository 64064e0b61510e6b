/* GPU device management, callable from C (the CLI's `strata device`, the
 * engine's start-up): list the cards, say whether this build has code for
 * each, and refuse at start a card it has none for, in one line naming the
 * card, its architecture and the build's list (the DESIGN contract "start
 * fails fast or not at all").
 *
 * Absent driver or zero cards is not an error: gpu_device_count() returns 0.
 */
#ifndef STRATA_BACKEND_CUDA_DEVICE_H
#define STRATA_BACKEND_CUDA_DEVICE_H

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef enum {
    GPU_CODE_NONE = 0,   /* no machine code and no PTX this card can run */
    GPU_CODE_NATIVE = 1, /* machine code for this card's architecture (or a compatible minor) */
    GPU_CODE_PTX = 2,    /* only PTX, compiled by the driver at first use (slow start, no arch-specific code) */
} gpu_code_kind;

typedef struct {
    int index;
    char name[256];
    char arch[32]; /* "sm_90", "gfx1100" */
    int cc_major, cc_minor;
    size_t vram_total, vram_free;
    int n_sm;
    int warp_size;
    int pci_bus;
    gpu_code_kind code; /* what this build holds for the card */
} gpu_device_info;

/* Number of usable devices; 0 if there is no driver or no card. */
int gpu_device_count(void);
/* Fill *out for device dev; -1 with st_error if it cannot be queried. */
int gpu_device_info_get(int dev, gpu_device_info *out);
/* The architectures this build has code for, as given to CMake ("90,86"). */
const char *gpu_build_archs(void);
/* 0 if dev exists, has 32-lane warps (HIP: waves of 32 or 64 lanes), at
 * least 48 KiB of shared memory per block, and this build can run on it (a probe
 * kernel is launched, so a missing image is found here and not mid-request);
 * else -1 with a one-line st_error naming the card, its architecture and the
 * build's list. Leaves dev as the current device. */
int gpu_device_check(int dev);
/* "native", "PTX (JIT)", "none" */
const char *gpu_code_name(gpu_code_kind k);

/* Host<->device copy bandwidth over pinned memory, GB/s, timed with device
 * events (median of reps copies of bytes). -1 with st_error on failure. */
int gpu_measure_bandwidth(int dev, size_t bytes, int reps, double *h2d_gbps, double *d2h_gbps);

#ifdef __cplusplus
}
#endif

#endif
