/* The start-up check's decision (backend/cuda/device_arch.c) with fake
 * cards: plain C, built into this test in every build, so CI checks it
 * without a GPU (there is no AMD GPU here at all).
 *
 *  - no arguments: AMD cards against the eight-target HIP list (each listed
 *    card accepted, wave64 gfx906 included; an RDNA3 or CDNA card the list
 *    lacks refused in one line naming card, architecture and list, exactly;
 *    feature flags after ':' ignored; a 16-lane wave or too little shared
 *    memory refused), and the CUDA rules unchanged (sm_90 on "90,86",
 *    "86-real" refused on 9.0, PTX of "80" on 9.0, "90a" only on 9.0,
 *    a wave64 card refused).
 *  - --list LIST ARCH...: what scripts/check-hip.sh runs with the list read
 *    out of the compiled device.cu (its STRATA_GPU_ARCHS string) and the
 *    architectures read out of its offload bundle: a card of every bundled
 *    architecture must be accepted by that list, and a card of one that is
 *    not bundled refused with that list in the message. So the list the
 *    binary reports and the code it carries agree.
 */
#include <stdio.h>
#include <string.h>

#include "backend/cuda/device_arch.h"

#include "../common/check.h"

static gpu_card_props amd(const char *name, const char *arch, int wave) {
    gpu_card_props c = {0, name, arch, 0, 0, wave, 64 * 1024};
    return c;
}

static gpu_card_props nv(const char *name, int maj, int min) {
    gpu_card_props c = {0, name, NULL, maj, min, 32, 48 * 1024};
    return c;
}

static void expect(int hip, const char *list, gpu_card_props c, const char *want) {
    char msg[512];
    int rc = gpu_arch_verdict(hip, list, &c, msg, sizeof msg);
    if (!want) {
        CHECK(rc == 0, "%s '%s' with list %s refused: %s", c.arch_raw ? c.arch_raw : "cuda", c.name, list, msg);
    } else {
        CHECK(rc == -1 && !strcmp(msg, want), "%s '%s' list %s: rc %d, message\n  got  %s\n  want %s",
              c.arch_raw ? c.arch_raw : "cuda", c.name, list, rc, msg, want);
    }
}

static const char *LIST8 = "gfx906,gfx1030,gfx1031,gfx1100,gfx1101,gfx1151,gfx1200,gfx1201";

static void fixed_cases(void) {
    expect(1, LIST8, amd("AMD Radeon VII", "gfx906:sramecc+:xnack-", 64), NULL);
    expect(1, LIST8, amd("AMD Radeon RX 6800 XT", "gfx1030", 32), NULL);
    expect(1, LIST8, amd("AMD Radeon RX 6700 XT", "gfx1031", 32), NULL);
    expect(1, LIST8, amd("AMD Radeon RX 7900 XTX", "gfx1100", 32), NULL);
    expect(1, LIST8, amd("AMD Radeon RX 7800 XT", "gfx1101", 32), NULL);
    expect(1, LIST8, amd("AMD Radeon 8060S", "gfx1151", 32), NULL);
    expect(1, LIST8, amd("AMD Radeon RX 9060 XT", "gfx1200", 32), NULL);
    expect(1, LIST8, amd("AMD Radeon AI PRO R9700", "gfx1201", 32), NULL);
    expect(1, LIST8, amd("AMD Radeon RX 7600", "gfx1102", 32),
           "GPU 0 'AMD Radeon RX 7600' is gfx1102; this build has code only for "
           "gfx906,gfx1030,gfx1031,gfx1100,gfx1101,gfx1151,gfx1200,gfx1201: rebuild with "
           "-DCMAKE_HIP_ARCHITECTURES including it");
    expect(1, LIST8, amd("AMD Instinct MI210", "gfx90a:sramecc+:xnack-", 64),
           "GPU 0 'AMD Instinct MI210' is gfx90a; this build has code only for "
           "gfx906,gfx1030,gfx1031,gfx1100,gfx1101,gfx1151,gfx1200,gfx1201: rebuild with "
           "-DCMAKE_HIP_ARCHITECTURES including it");
    /* a prefix or a longer name of a listed one is not it */
    expect(1, "gfx1100", amd("AMD Radeon RX 7900 GRE", "gfx110", 32),
           "GPU 0 'AMD Radeon RX 7900 GRE' is gfx110; this build has code only for gfx1100: rebuild with "
           "-DCMAKE_HIP_ARCHITECTURES including it");
    expect(1, "gfx110", amd("AMD Radeon RX 7900 XTX", "gfx1100", 32),
           "GPU 0 'AMD Radeon RX 7900 XTX' is gfx1100; this build has code only for gfx110: rebuild with "
           "-DCMAKE_HIP_ARCHITECTURES including it");
    expect(1, LIST8, amd("odd card", "gfx1100", 16),
           "GPU 0 'odd card' (gfx1100) runs 16-lane waves; Strata's kernels need waves of 32 or 64 lanes");
    gpu_card_props small = amd("small card", "gfx1030", 32);
    small.smem_per_block = 32 * 1024;
    expect(1, LIST8, small,
           "GPU 0 'small card' (gfx1030) has 32 KiB of shared memory per block; Strata's kernels "
           "need 48 KiB");

    /* CUDA: the rules device.cu had before the move. */
    expect(0, "90,86", nv("NVIDIA H200", 9, 0), NULL);
    expect(0, "86-real", nv("NVIDIA GeForce RTX 4090", 8, 9), NULL);
    expect(0, "80", nv("NVIDIA H200", 9, 0), NULL);
    gpu_card_props h = nv("NVIDIA H200", 9, 0);
    CHECK(gpu_arch_code(0, "80", &h) == GPU_CODE_PTX, "PTX of 80 on 9.0");
    CHECK(gpu_arch_code(0, "90,86", &h) == GPU_CODE_NATIVE, "sm_90 on 9.0");
    CHECK(gpu_arch_code(0, "90a", &h) == GPU_CODE_NATIVE, "90a on 9.0");
    gpu_card_props b = nv("NVIDIA B200", 10, 0);
    CHECK(gpu_arch_code(0, "90a", &b) == GPU_CODE_NONE, "90a on 10.0");
    expect(0, "86-real", nv("NVIDIA H200", 9, 0),
           "GPU 0 'NVIDIA H200' is sm_90; this build has code only for 86-real: rebuild with "
           "-DCMAKE_CUDA_ARCHITECTURES including it");
    gpu_card_props w = nv("wave64 card", 9, 0);
    w.warp_size = 64;
    expect(0, "90", w,
           "GPU 0 'wave64 card' (sm_90) runs 64-lane waves; Strata's kernels need 32-lane warps (wave32 targets "
           "only, e.g. RDNA)");
}

int main(int argc, char **argv) {
    if (argc >= 3 && !strcmp(argv[1], "--list")) {
        const char *list = argv[2];
        printf("build list (from the object): %s\n", list);
        int n = 0;
        for (int i = 3; i < argc; i++, n++) {
            const char *a = argv[i];
            char msg[512];
            gpu_card_props c = amd("fake card", a, !strncmp(a, "gfx9", 4) ? 64 : 32);
            int rc = gpu_arch_verdict(1, list, &c, msg, sizeof msg);
            CHECK(rc == 0, "bundled %s refused by the list: %s", a, msg);
            printf("  %-8s (wave%d) bundled, accepted\n", a, c.warp_size);
        }
        CHECK(n > 0, "no bundled architectures given");
        /* Neither of these is in check-hip.sh's list. */
        const char *absent[] = {"gfx1102", "gfx90a"};
        for (int i = 0; i < 2; i++) {
            char msg[512], want[512];
            gpu_card_props c = amd("fake card", absent[i], 32);
            int rc = gpu_arch_verdict(1, list, &c, msg, sizeof msg);
            snprintf(want, sizeof want,
                     "GPU 0 'fake card' is %s; this build has code only for %s: rebuild with "
                     "-DCMAKE_HIP_ARCHITECTURES including it",
                     absent[i], list);
            CHECK(rc == -1 && !strcmp(msg, want), "%s: got '%s'", absent[i], msg);
            printf("  %-8s not bundled, refused: %s\n", absent[i], msg);
        }
        return check_report("gpu_arch (bundle vs list)");
    }
    fixed_cases();
    return check_report("gpu_arch");
}
