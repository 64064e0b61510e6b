/* backend_check (backend_check.h) knows no backend by name: here it compares
 * two CPU backends, the reference with f32 activations in its products
 * (STRATA_PRECISE=1) and the one under test with its default 8-bit ones, on
 * the start-up self-test's tiny shapes. Every check must pass within its
 * bound, and the run must make the checks it makes for a GPU (a decode
 * layer through the fused ops, attention, MoE): a harness that silently
 * checked nothing fails here. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend_check.h"

static int n_checks, n_layer;

static void show(void *ctx, const bcheck_result *r) {
    (void)ctx;
    n_checks++;
    n_layer += !strcmp(r->op, "decode layer");
    printf("%-4s %-12s nmse %.2e (bound %.0e)  %s\n", r->pass ? "ok" : "FAIL", r->op, r->nmse, r->bound, r->what);
}

int main(void) {
    setvbuf(stdout, NULL, _IOLBF, 0);
    setenv("STRATA_PRECISE", "1", 1);
    st_backend *ref = backend_cpu_create(1); /* 1 thread: decode's qkv_prep by tokens, not heads */
    setenv("STRATA_PRECISE", "0", 1);
    st_backend *dut = backend_cpu_create(2);
    const int fails = backend_check_ops(ref, dut, 0, 7, show, NULL);
    dut->destroy(dut);
    ref->destroy(ref);
    printf("%d checks (%d decode layers), %d failed\n", n_checks, n_layer, fails);
    if (n_checks < 40 || n_layer < 3) {
        printf("FAIL: fewer checks than the self-test makes\n");
        return 1;
    }
    return fails ? 1 : 0;
}
