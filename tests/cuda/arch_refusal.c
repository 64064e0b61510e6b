/* Built by tests/cuda/run_device.sh against a device.cu compiled for an
 * architecture list that excludes the card (e.g. -DSTRATA_GPU_ARCHS="86-real"
 * on a 9.0 card): GPU 0 must be refused at start with one line naming the
 * card, its architecture and the build's list; exit 0 when it is. With a list
 * that includes the card (PTX of an older one: "80") it must be accepted and
 * the exit code is 0 as well when argv[1] is "accept". */
#include <stdio.h>
#include <string.h>

#include "backend/cuda/device.h"
#include "core/log.h"

int main(int argc, char **argv) {
    int want_accept = argc > 1 && !strcmp(argv[1], "accept");
    gpu_device_info d;
    if (gpu_device_info_get(0, &d) != 0) {
        printf("SKIPPED: no CUDA device\n");
        return 0;
    }
    int rc = gpu_device_check(0);
    printf("build list %s, card %s (%s), predicted code: %s, check: %s%s%s\n", gpu_build_archs(), d.name, d.arch,
           gpu_code_name(d.code), rc == 0 ? "accepted" : "refused", rc == 0 ? "" : ": ", rc == 0 ? "" : st_error_get());
    return (rc == 0) == want_accept ? 0 : 1;
}
