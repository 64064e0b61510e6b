/* Every op of the CUDA backend against the CPU backend on random inputs
 * (backend_check.c: fresh inputs per check, outputs poisoned with NaN, NMSE
 * against a bound per op), at test sizes: long contexts split across many
 * slices, prompt chunks, GQA and MQA, f16 and int8 KV caches, every matmul
 * format, MoE on both of its paths; then a second seed on tiny shapes. Also: a device index past the
 * last one is refused with a message naming it. Argument "mla": only the
 * glm4moe / deepseek2 checks (backend_check_mla_ops).
 * No GPU: prints SKIPPED and exits 0.
 */
#include <stdio.h>
#include <string.h>

#include "backend/backend_check.h"
#include "backend/cuda/backend_cuda.h"
#include "backend/cuda/device.h"
#include "core/log.h"

static int n_checks;

static void show(void *ctx, const bcheck_result *r) {
    (void)ctx;
    n_checks++;
    printf("%-4s %-10s nmse %.2e (bound %.0e) %7.2f ms  %s\n", r->pass ? "ok" : "FAIL", r->op, r->nmse, r->bound, r->ms,
           r->what);
}

int main(int argc, char **argv) {
    setvbuf(stdout, NULL, _IOLBF,
            0); /* each check's line as it is made: a run cut short by a timeout still shows them */
    int n = gpu_device_count();
    if (n == 0) {
        printf("SKIPPED: no CUDA device\n");
        return 0;
    }
    int fails = 0;
    const int only_mla = argc > 1 && !strcmp(argv[1], "mla");     /* only the glm4moe / deepseek2 checks */
    const int only_layer = argc > 1 && !strcmp(argv[1], "layer"); /* only the decode-layer checks */
    const int only_attn = argc > 1 && !strcmp(argv[1], "attn");   /* only the attention checks */
    const int only_oai = argc > 1 && !strcmp(argv[1], "oai");     /* only the gpt-oss checks */
    if (backend_cuda_create(n) != NULL || !strstr(st_error_get(), "does not exist")) {
        printf("FAIL: GPU %d (one past the last) was not refused: '%s'\n", n, st_error_get());
        fails++;
    } else {
        printf("ok   GPU %d refused: %s\n", n, st_error_get());
    }
    st_backend *cpu = backend_cpu_create(0), *gpu = backend_cuda_create(0);
    if (!gpu) {
        printf("FAIL: %s\n", st_error_get());
        return 1;
    }
    /* seed 1 at test sizes, seed 2 again on the self-test's tiny shapes */
    for (uint64_t seed = 1; seed <= 2; seed++) {
        printf("-- seed %llu, %s shapes\n", (unsigned long long)seed, seed == 1 ? "test" : "tiny");
        fails += only_mla     ? backend_check_mla_ops(cpu, gpu, seed == 1, seed, show, NULL)
                 : only_layer ? backend_check_layer_ops(cpu, gpu, seed == 1, seed, show, NULL)
                 : only_attn  ? backend_check_attn_ops(cpu, gpu, seed == 1, seed, show, NULL)
                 : only_oai   ? backend_check_oai_ops(cpu, gpu, seed == 1, seed, show, NULL)
                              : backend_check_ops(cpu, gpu, seed == 1, seed, show, NULL);
    }
    gpu->destroy(gpu);
    cpu->destroy(cpu);
    printf("%d checks, %d failed\n", n_checks + 1, fails);
    return fails ? 1 : 0;
}
