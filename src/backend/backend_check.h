/* Every op of one backend against another on random inputs (the CPU backend
 * is the reference): used by `strata device --selftest` on tiny shapes and by
 * tests/cuda on larger ones. Each check draws fresh inputs, poisons the
 * outputs of the backend under test with NaN first (an unwritten value
 * fails), and compares by NMSE = sum (out - ref)^2 / sum ref^2 against a
 * bound stated per op; a NaN anywhere fails. Where the backend under test
 * has variants of an op (st_backend.variant), each is checked; the file
 * knows no backend by name.
 */
#ifndef STRATA_BACKEND_BACKEND_CHECK_H
#define STRATA_BACKEND_BACKEND_CHECK_H

#include <stdint.h>

#include "backend/backend.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct {
    const char *op; /* "rmsnorm", "attention", ... */
    char what[128]; /* shapes, types, variant */
    double nmse, bound;
    double ms; /* wall time of the op under test (with its copies), for orientation only */
    int pass;
} bcheck_result;

typedef void (*bcheck_report_fn)(void *ctx, const bcheck_result *r);

/* size 0: tiny shapes (start-up self-test, well under a second);
 * size 1: test shapes (several splits of a long context, prompt chunks,
 * more formats). Returns the number of failed checks. */
int backend_check_ops(st_backend *ref, st_backend *dut, int size, uint64_t seed, bcheck_report_fn fn, void *ctx);
/* The hybrid family's ops (backend_check_hybrid.c; backend_check_ops runs
 * them too): 0 checks when dut lacks them. */
int backend_check_hybrid(st_backend *ref, st_backend *dut, int size, uint64_t seed, bcheck_report_fn fn, void *ctx);
/* Only the checks of the glm4moe / deepseek2 ops (every routing rule,
 * copy_2d, matmul over a whole stack, partial rotary, the latent attention),
 * which backend_check_ops runs too. */
int backend_check_mla_ops(st_backend *ref, st_backend *dut, int size, uint64_t seed, bcheck_report_fn fn, void *ctx);
/* Only the decode-layer checks (fused ops, routing, experts, norms in a
 * layer's order), which backend_check_ops runs too. */
int backend_check_layer_ops(st_backend *ref, st_backend *dut, int size, uint64_t seed, bcheck_report_fn fn, void *ctx);
/* Only backend_check_ops' gpt-oss checks (sinks, the clamped SwiGLU, the experts' biases on every MoE path). */
int backend_check_oai_ops(st_backend *ref, st_backend *dut, int size, uint64_t seed, bcheck_report_fn fn, void *ctx);
/* Only backend_check_ops' attention checks (a quick run after an attention change). */
int backend_check_attn_ops(st_backend *ref, st_backend *dut, int size, uint64_t seed, bcheck_report_fn fn, void *ctx);

#ifdef __cplusplus
}
#endif

#endif
