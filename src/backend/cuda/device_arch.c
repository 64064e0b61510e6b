/* The start-up check's decision from a card's properties and the build's
 * architecture list (device_arch.h). Moved out of device.cu, unchanged for
 * CUDA, so that it is plain C and testable without a GPU.
 *
 * CUDA: CMake's entries "NN" put both machine code (sm_NN) and PTX
 * (compute_NN) into the binary, "NN-real" only the first, "NN-virtual"
 * only the second. Machine code runs on the same major version with an
 * equal or newer minor ("86" on an 8.9 card), "NNa" only on exactly NN;
 * PTX runs on any newer card after the driver compiles it.
 *
 * HIP: a code object runs only on its exact gfx target (no PTX, no minor
 * compatibility), so the card's name must be in the list. Waves of 32 and
 * of 64 lanes are both accepted (compat.h: the kernels' 32-lane logical
 * warps, two per wave64 wave).
 */
#include "backend/cuda/device_arch.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void gpu_arch_name(int hip, const gpu_card_props *c, char *out, size_t n) {
    if (hip) {
        snprintf(out, n, "%s", c->arch_raw ? c->arch_raw : "");
        char *colon = strchr(out, ':');
        if (colon) *colon = 0;
    } else {
        snprintf(out, n, "sm_%d%d", c->cc_major, c->cc_minor);
    }
}

static gpu_code_kind code_hip(const char *list, const char *arch) {
    size_t n = strlen(arch);
    const char *s = list;
    while (*s) {
        size_t len = strcspn(s, ",");
        if (n > 0 && len == n && !strncmp(s, arch, n)) return GPU_CODE_NATIVE;
        s += len + (s[len] == ',');
    }
    return GPU_CODE_NONE;
}

static gpu_code_kind code_cuda(const char *list, int dev) {
    gpu_code_kind best = GPU_CODE_NONE;
    const char *s = list;
    while (*s) {
        size_t len = strcspn(s, ",");
        char ent[32];
        snprintf(ent, sizeof ent, "%.*s", (int)(len < sizeof ent - 1 ? len : sizeof ent - 1), s);
        s += len + (s[len] == ',');
        if (!strcmp(ent, "native") || !strncmp(ent, "all", 3)) return GPU_CODE_NATIVE; /* the probe decides */
        char *end;
        long nn = strtol(ent, &end, 10);
        if (end == ent) continue;
        int exact = *end == 'a', family = *end == 'f';
        int real = !strstr(end, "-virtual"), virt = !strstr(end, "-real") && !exact && !family;
        if (real && nn / 10 == dev / 10 && (exact ? nn == dev : nn <= dev)) return GPU_CODE_NATIVE;
        if (virt && nn <= dev) best = GPU_CODE_PTX;
    }
    return best;
}

gpu_code_kind gpu_arch_code(int hip, const char *list, const gpu_card_props *c) {
    if (hip) {
        char arch[64];
        gpu_arch_name(1, c, arch, sizeof arch);
        return code_hip(list, arch);
    }
    return code_cuda(list, c->cc_major * 10 + c->cc_minor);
}

int gpu_arch_verdict(int hip, const char *list, const gpu_card_props *c, char *msg, size_t n) {
    char arch[64];
    gpu_arch_name(hip, c, arch, sizeof arch);
    if (hip ? c->warp_size != 32 && c->warp_size != 64 : c->warp_size != 32) {
        if (hip)
            snprintf(msg, n, "GPU %d '%s' (%s) runs %d-lane waves; Strata's kernels need waves of 32 or 64 lanes",
                     c->index, c->name, arch, c->warp_size);
        else
            snprintf(msg, n,
                     "GPU %d '%s' (%s) runs %d-lane waves; Strata's kernels need 32-lane warps (wave32 targets "
                     "only, e.g. RDNA)",
                     c->index, c->name, arch, c->warp_size);
        return -1;
    }
    if (gpu_arch_code(hip, list, c) == GPU_CODE_NONE) {
        snprintf(msg, n, "GPU %d '%s' is %s; this build has code only for %s: rebuild with %s including it", c->index,
                 c->name, arch, list, hip ? "-DCMAKE_HIP_ARCHITECTURES" : "-DCMAKE_CUDA_ARCHITECTURES");
        return -1;
    }
    if (c->smem_per_block < GPU_SMEM_NEEDED) {
        snprintf(msg, n, "GPU %d '%s' (%s) has %zu KiB of shared memory per block; Strata's kernels need %u KiB",
                 c->index, c->name, arch, c->smem_per_block / 1024, GPU_SMEM_NEEDED / 1024);
        return -1;
    }
    if (n) msg[0] = 0;
    return 0;
}
