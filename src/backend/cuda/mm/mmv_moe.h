/* The decode MoE FFN in two matrix-vector kernels (mmv_moe.cu), for up to
 * MM_MOE_DEVICE_MAX (token, expert) pairs, all on the device (recordable):
 *
 *   glu:  h[p] = act(G[e_p] x[t_p]) * (U[e_p] x[t_p])   gate and up in one
 *         pass (and the routing, when given the logits), h written as the
 *         int8 blocks of 32 the next product reads;
 *   down: out[t] = sum_j w[t,j] * D[e_tj] h[t*k+j]         the k experts of a
 *         token and the weighted sum in one pass (no per-pair output).
 *
 * Three kernels fewer per layer than gate, up, act_mul, down and combine;
 * and the down product's short rows (an expert's 768 inputs are 24 units of
 * 32, fewer than a warp's lanes) are spread over the lanes across the k
 * experts instead of leaving lanes idle.
 */
#ifndef STRATA_BACKEND_CUDA_MMV_MOE_H
#define STRATA_BACKEND_CUDA_MMV_MOE_H

#include <stdint.h>

#include "backend/backend.h"
#include "backend/cuda/compat.h"
#include "backend/cuda/mm/mm.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Whether the fused kernels take these experts: quantized gate/up of one
 * type, contiguous on the device (w->data), and an intermediate width that
 * is a multiple of 32 and the down matrices' input. */
int cuda_moe_decode_fits(const st_weight *gate, const st_weight *up, const st_weight *down);

/* Most experts the first kernel routes over itself (its shared probabilities). */
#define ROUTE_MAX_EXPERT 512

/* The routing the glu kernel does itself, from the router logits ([n_tok][n_expert],
 * n_expert <= ROUTE_MAX_EXPERT; every st_moe_gating, its bias in device memory: route.cuh). */
typedef struct {
    const float *logits;
    int n_expert;
    st_moe_gating gt;
} cuda_moe_route_in;

/* ids, wsel: [n_tok][k]: with route, written by the first kernel (its
 * routing); without, given (a negative id: a pair handled elsewhere,
 * contributes nothing); x [n_tok][n_in] f32, read quantized from the
 * products' scratch (cuda_mm_act_scratch), which holds it already when
 * act_ready (else it is quantized there first); hq / hd: scratch for
 * n_tok * k rows of the intermediate width (int8, and one float2 per 32);
 * out: [n_tok][down->n_out] f32. 0, or -1 with st_error (the scratch would
 * have to grow in a capture). */
int cuda_moe_decode(const st_weight *gate, const st_weight *up, const st_weight *down, const cuda_moe_route_in *route,
                    int32_t *ids, float *wsel, int n_tok, int k, st_act act, const float *x, int act_ready, int8_t *hq,
                    float2 *hd, float *out, cudaStream_t s);
/* The same where ids are cache slots: eid [n_tok][k] (device) holds the
 * pairs' expert ids, which index the experts' biases (st_weight.bias,
 * gpt-oss); NULL: ids are expert ids. The biases of gate and up are added
 * before act (ST_ACT_SWIGLU_OAI clamps the biased values), down's to the
 * product. */
int cuda_moe_decode_eid(const st_weight *gate, const st_weight *up, const st_weight *down,
                        const cuda_moe_route_in *route, int32_t *ids, const int32_t *eid, float *wsel, int n_tok, int k,
                        st_act act, const float *x, int act_ready, int8_t *hq, float2 *hd, float *out, cudaStream_t s);

#ifdef __cplusplus
}
#endif

#endif
