/* The decode MoE kernels of mmv_moe.h, over every quantized format through
 * the unit decoders of quant_cuda.cuh (as the matrix-vector kernels).
 *
 * glu: a block is 32 consecutive output rows of one pair (two rows per warp,
 * gate and up units decoded against the same loaded activation unit; 512
 * threads, so that two blocks fit a multiprocessor and a top-8 step's 192
 * blocks run in one wave); the block's 32 values are one quantization block
 * of h, written by warp 0. With the router logits given, warp 0 of every
 * block first routes the block's token (route.cuh): no routing kernel.
 * down: a warp per (token, output row); its lanes take the (expert j, unit)
 * combinations of the row in turn, each weighted by w[t,j], then one warp
 * sum gives the token's output: the combine is done in the product.
 * Expert biases (gpt-oss, st_weight.bias, by expert id): glu adds its rows'
 * gate and up biases before the activation; down adds sum_j w[t,j] bd[e_j]
 * after the warp sum.
 */
#include "backend/cuda/mm/mmv_moe.h"

#include <string.h>

#include "backend/cuda/mm/mm_impl.cuh"
#include "backend/cuda/mm/quant_cuda.cuh"
#include "backend/cuda/route.cuh"

#define GLU_ROWS   32 /* rows per glu block: one quantization block of h */
#define GLU_RPW    2 /* rows per glu warp: 512-thread blocks, two per multiprocessor (one of 1024 left a second wave) */
#define DOWN_WARPS 4 /* warps (rows) per down block */

struct moe_dec_args {
    const uint8_t *g, *u, *d;   /* expert 0 of gate, up, down */
    size_t gu_stride, d_stride; /* bytes between experts */
    size_t gu_row, d_row;       /* row bytes */
    int n_in, n_ff, n_out;      /* x width, intermediate width, output width */
    const float *logits;        /* router logits [n_tok][n_expert]: glu routes (ids, wsel written); NULL: given */
    int n_expert;
    st_moe_gating gt; /* the routing rule (route.cuh) */
    int32_t *ids;
    float *wsel;
    int k, act;
    const float *bg, *bu, *bd; /* expert biases [n_expert][rows] or NULL */
    const int32_t *eid;        /* the pairs' expert ids when ids are cache slots; NULL: ids are expert ids */
    const int8_t *xq;
    const float2 *xd;
    int8_t *hq;
    float2 *hd;
    float *out;
};

/* GEN false: the plain routing rule and no expert biases (moe_dec_glu
 * picks it when both hold): the instance without the other rules' code. */
template <int T, bool GEN>
static __global__ void __launch_bounds__(GLU_ROWS / GLU_RPW * 32) moe_glu_kernel(const moe_dec_args p) {
    pdl_enter(); /* first: see st_launch (common.cuh) */
    using F = mmf<T>;
    __shared__ float vals[GLU_ROWS];
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, pair = blockIdx.y;
    const int row = blockIdx.x * GLU_ROWS + warp * GLU_RPW, t = pair / p.k;
    const int n_units = p.n_in / 32;
    int e;
    if (p.logits) { /* every block routes its token (route.cuh): no routing kernel before this one */
        __shared__ float probs[ROUTE_MAX_EXPERT], scores[ROUTE_MAX_EXPERT], rw[ROUTE_MAX_EXPERT], red[ST_WARP];
        __shared__ int32_t rsel[ROUTE_MAX_EXPERT];
        route_block<GEN>(p.logits + (size_t)t * p.n_expert, p.n_expert, p.k, p.gt, probs, scores, red, rsel, rw);
        const int j = pair - t * p.k;
        e = rsel[j];
        if (blockIdx.x == 0 && threadIdx.x == 0) { /* for the down kernel */
            p.ids[pair] = e;
            p.wsel[pair] = rw[j];
        }
    } else {
        e = p.ids[pair];
    }
    float g[GLU_RPW], u[GLU_RPW];
#pragma unroll
    for (int r = 0; r < GLU_RPW; r++) g[r] = u[r] = 0.0f;
    if (e >= 0) {
        const uint8_t *wg = p.g + (size_t)e * p.gu_stride + (size_t)row * p.gu_row;
        const uint8_t *wu = p.u + (size_t)e * p.gu_stride + (size_t)row * p.gu_row;
        const int8_t *xr = p.xq + (size_t)t * p.n_in;
        for (int gu = lane; gu < n_units; gu += 32) {
            int a[8];
            ld_unit(xr, gu, a);
            const float2 ds = p.xd[(size_t)t * n_units + gu];
            const size_t off = (size_t)(gu / F::UPB) * F::BYTES;
#pragma unroll
            for (int r = 0; r < GLU_RPW; r++) {
                mm_unit w;
                F::unit(wg + (size_t)r * p.gu_row + off, gu % F::UPB, w);
                g[r] += mm_unit_dot<F>(w, a, ds);
                F::unit(wu + (size_t)r * p.gu_row + off, gu % F::UPB, w);
                u[r] += mm_unit_dot<F>(w, a, ds);
            }
        }
#pragma unroll
        for (int r = 0; r < GLU_RPW; r++) g[r] = warp_sum(g[r]), u[r] = warp_sum(u[r]);
    }
    if (lane == 0) {
        const int be = !GEN || e < 0 ? -1 : p.eid ? p.eid[pair] : e; /* the bias row: by expert id */
#pragma unroll
        for (int r = 0; r < GLU_RPW; r++) {
            if (be >= 0 && p.bg) g[r] += p.bg[(size_t)be * p.n_ff + row + r];
            if (be >= 0 && p.bu) u[r] += p.bu[(size_t)be * p.n_ff + row + r];
            vals[warp * GLU_RPW + r] = st_glu_value(p.act, g[r], u[r]); /* 0: a pair handled elsewhere */
        }
    }
    __syncthreads();
    if (warp == 0) /* the block's 32 values are one quantization block of h */
        quant_block_store(vals[lane], (size_t)pair * p.n_ff + (size_t)blockIdx.x * GLU_ROWS + lane, p.hq, p.hd);
}

/* DOWN_SLOTS (expert, unit) combinations per lane per pass, every slot's
 * loads issued before any is used: the slots hold no branch (a slot past
 * the row or of a skipped pair reads a valid unit and weighs 0), so the
 * compiler can hoist all of them; a loop with a `continue` per skipped pair
 * left each slot waiting for the one before. */
#define DOWN_SLOTS 8
template <int T> static __global__ void __launch_bounds__(DOWN_WARPS * 32, 4) moe_down_kernel(const moe_dec_args p) {
    pdl_enter(); /* first: see st_launch (common.cuh) */
    using F = mmf<T>;
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, t = blockIdx.y;
    const int row = blockIdx.x * DOWN_WARPS + warp;
    if (row >= p.n_out) return; /* whole warp */
    const int n_units = p.n_ff / 32, combos = p.k * n_units;
    float acc = 0.0f;
    for (int c0 = 0; c0 < combos; c0 += 32 * DOWN_SLOTS) {
#pragma unroll
        for (int i = 0; i < DOWN_SLOTS; i++) {
            const int c = c0 + lane + 32 * i, cc = c < combos ? c : combos - 1;
            const int j = cc / n_units, gu = cc - j * n_units, pair = t * p.k + j, e = p.ids[pair];
            const float wt = c < combos && e >= 0 ? p.wsel[pair] : 0.0f;
            const uint8_t *wr = p.d + (size_t)(e < 0 ? 0 : e) * p.d_stride + (size_t)row * p.d_row;
            int a[8];
            ld_unit(p.hq + (size_t)pair * p.n_ff, gu, a);
            mm_unit w;
            F::unit(wr + (size_t)(gu / F::UPB) * F::BYTES, gu % F::UPB, w);
            const float dot = mm_unit_dot<F>(w, a, p.hd[(size_t)pair * n_units + gu]);
            /* a skipped pair's unit is only a valid address: its bytes may
             * decode to Inf or NaN (an unfilled staging slot), and 0 * NaN is
             * NaN. Tested on wt, which holds the skip already: a second
             * predicate per slot took Q5_K/Q6_K past 128 registers (16 bytes
             * spilled, the Q6_K kernel 24% slower on the H200 under ncu). */
            acc = fmaf(wt, wt != 0.0f ? dot : 0.0f, acc);
        }
    }
    acc = warp_sum(acc);
    if (lane == 0 && p.bd) /* the weighted sum of the pairs' down biases */
        for (int j = 0; j < p.k; j++) {
            const int pair = t * p.k + j, e = p.ids[pair];
            if (e >= 0) acc += p.wsel[pair] * p.bd[(size_t)(p.eid ? p.eid[pair] : e) * p.n_out + row];
        }
    if (lane == 0) p.out[(size_t)t * p.n_out + row] = acc;
}

static int moe_dec_down(const moe_dec_args &a, qt_type td, int n_tok, cudaStream_t s) {
    const dim3 grid(st_div_up((size_t)a.n_out, DOWN_WARPS), (unsigned)n_tok);
    switch ((int)td) {
#define DOWN_CASE(T)                                                                                                   \
    case T: st_launch(moe_down_kernel<T>, grid, dim3(DOWN_WARPS * 32), 0, s, a); return 0;
        MM_QUANT_TYPES(DOWN_CASE)
#undef DOWN_CASE
    default: return 1;
    }
}

static int moe_dec_glu(const moe_dec_args &a, qt_type tg, int n_pairs, cudaStream_t s) {
    const dim3 grid((unsigned)(a.n_ff / GLU_ROWS), (unsigned)n_pairs);
    const bool plain = (!a.logits || route_plain(a.gt)) && !a.bg && !a.bu;
    switch ((int)tg) {
#define GLU_CASE(T)                                                                                                    \
    case T:                                                                                                            \
        if (plain) st_launch(moe_glu_kernel<T, false>, dim3(grid), dim3(GLU_ROWS / GLU_RPW * 32), 0, s, a);            \
        else st_launch(moe_glu_kernel<T, true>, dim3(grid), dim3(GLU_ROWS / GLU_RPW * 32), 0, s, a);                   \
        return 0;
        MM_QUANT_TYPES(GLU_CASE)
#undef GLU_CASE
    default: return 1;
    }
}
static int quantized(qt_type t) { return cuda_mm_supports(t) && !mm_is_float(t); }

int cuda_moe_decode_fits(const st_weight *gate, const st_weight *up, const st_weight *down) {
    return quantized(gate->type) && quantized(down->type) && gate->type == up->type && gate->data && up->data &&
           down->data && !gate->mat && !up->mat && !down->mat && gate->n_in == up->n_in && gate->n_out == up->n_out &&
           gate->n_out == down->n_in && gate->n_out % GLU_ROWS == 0 && gate->n_in % 32 == 0 &&
           gate->row_bytes == up->row_bytes;
}

int cuda_moe_decode_eid(const st_weight *gate, const st_weight *up, const st_weight *down,
                        const cuda_moe_route_in *route, int32_t *ids, const int32_t *eid, float *wsel, int n_tok, int k,
                        st_act act, const float *x, int act_ready, int8_t *hq, float2 *hd, float *out, cudaStream_t s) {
    ST_ASSERT(cuda_moe_decode_fits(gate, up, down) && n_tok * k <= MM_MOE_DEVICE_MAX);
    ST_ASSERT(!route ||
              (route->n_expert <= ROUTE_MAX_EXPERT && k <= route->n_expert && route->gt.n_group <= ROUTE_MAX_GROUP));
    if (n_tok <= 0) return 0;
    int8_t *xq = NULL;
    float2 *xd = NULL;
    if (cuda_mm_act_scratch(gate->n_in, n_tok, &xq, &xd, s) != 0) return -1;
    if (!act_ready) mm_quantize_act(x, (int)gate->n_in, n_tok, xq, xd, s);
    moe_dec_args a;
    a.g = (const uint8_t *)gate->data, a.u = (const uint8_t *)up->data, a.d = (const uint8_t *)down->data;
    a.gu_stride = (size_t)gate->n_out * gate->row_bytes, a.d_stride = (size_t)down->n_out * down->row_bytes;
    a.gu_row = gate->row_bytes, a.d_row = down->row_bytes;
    a.n_in = (int)gate->n_in, a.n_ff = (int)gate->n_out, a.n_out = (int)down->n_out;
    a.logits = route ? route->logits : NULL;
    a.n_expert = route ? route->n_expert : 0;
    if (route) a.gt = route->gt;
    else memset(&a.gt, 0, sizeof a.gt);
    a.ids = ids, a.wsel = wsel, a.k = k, a.act = (int)act;
    a.bg = gate->bias, a.bu = up->bias, a.bd = down->bias, a.eid = eid;
    a.xq = xq, a.xd = xd, a.hq = hq, a.hd = hd, a.out = out;
    int rc = moe_dec_glu(a, gate->type, n_tok * k, s);
    rc |= moe_dec_down(a, down->type, n_tok, s);
    ST_ASSERT(rc == 0); /* cuda_moe_decode_fits said yes */
    return 0;
}

int cuda_moe_decode(const st_weight *gate, const st_weight *up, const st_weight *down, const cuda_moe_route_in *route,
                    int32_t *ids, float *wsel, int n_tok, int k, st_act act, const float *x, int act_ready, int8_t *hq,
                    float2 *hd, float *out, cudaStream_t s) {
    return cuda_moe_decode_eid(gate, up, down, route, ids, NULL, wsel, n_tok, k, act, x, act_ready, hq, hd, out, s);
}
