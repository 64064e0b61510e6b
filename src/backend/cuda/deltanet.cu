/* The hybrid Qwen family's ops on the GPU (deltanet.h): the gated DeltaNet
 * of the linear-attention layers (qwen3next, qwen35moe), its undo record
 * for drafts, and the gated attention layers' split_halves and sigmoid_mul.
 * The reference is backend/cpu/cpu_hybrid.c, pass for pass:
 *
 *   conv    one block per (token, head-sized segment of q | k | v): the
 *           causal convolution over [window | chunk], SiLU, and for q and k
 *           the L2 norm (a block sum); one more block per token computes
 *           decay and beta of every value head;
 *   window  one thread per channel: the last d_conv-1 inputs kept (for
 *           one token, conv does it: its thread is the channel's only
 *           reader, so a decode step has one kernel less);
 *   scan    the delta rule. Row jv of a head's state S (over the keys)
 *           evolves alone: decay, sk = row.k, row += beta (v[jv] - sk) k,
 *           o[jv] = row.q. So a warp holds GDN_ROWS rows in registers (lane
 *           l: keys l, l+32, ...) and walks the tokens in order, the next
 *           two tokens' q, k, v loaded while the current one computes; the
 *           state is read and written once per call, not per token;
 *   norm    one warp per (token, value head): RMS norm times the weight,
 *           times silu(z), also written as the next product's int8 input.
 *
 * Cost of the prompt path against the chunked (WY) form: this is the
 * per-token recurrence, so a chunk of n tokens is n dependent steps of two
 * warp reductions each, all heads and rows in parallel; its time grows
 * with n at a fixed cost per step (dev/cuda/bench_gdn.cu measures it), not
 * with the work, which is small (4 hd^2 flops per value head and token):
 * 0.85 us per token and layer at 512 tokens on a loaded H200, 13 ms of the
 * 68 ms that a 512-token prompt of the Qwen3.5-35B-A3B synth took.
 * The chunked form does the same work as matrix products over chunks of
 * 64 tokens on tensor cores, with a handful of dependent steps per chunk
 * instead of 64; it pays where this scan's serial steps are a visible part
 * of a prompt chunk's time.
 *
 * Decode steps are recorded in CUDA graphs: the position comes from the
 * device (dpos) so that position 0 (zero state) is decided there, and no
 * kernel allocates or waits on the host. The undo record (st_kv_layer
 * undo) is written by the same kernels: conv writes its convolved rows
 * and gates straight into the record's rows, scan saves the state it
 * starts from, window the window it replaces; keep runs scan again over
 * the kept rows from the saved state, the same arithmetic on the same
 * inputs, so the same bits as a pass that had been given only them.
 */
#include "backend/cuda/deltanet.h"

#define CONV_THREADS 128
#define GDN_WARPS    4
#define GDN_ROWS     4 /* state rows per warp */
#define NORM_WARPS   4

static __device__ __forceinline__ float gdn_silu(float x) { return x / (1.0f + expf(-x)); }
static __device__ __forceinline__ float gdn_sigmoid(float x) { return 1.0f / (1.0f + expf(-x)); }
static __device__ __forceinline__ float gdn_softplus(float x) { return x > 20.0f ? x : log1pf(expf(x)); }

static __device__ __forceinline__ int gdn_pos(int pos0, const int *dpos) { return dpos ? *dpos : pos0; }

/* conv: block (t, seg). seg < 2nk+nv: the hd channels of one q, k or v
 * head; seg = 2nk+nv: token t's decay and beta per value head. c, gb: rows
 * c_stride, gb_stride floats apart (the scratch, or the undo record's rows,
 * which also get the input row in rec_in). shift (one token only): the
 * window moves on here too, the one it replaces into snap_win (or NULL),
 * as gdn_window_kernel does. */
static __global__ void __launch_bounds__(CONV_THREADS)
    gdn_conv_kernel(const float *qkv, const float *conv, st_gdn g, const float *beta, const float *alpha, float *c,
                    size_t c_stride, float *gb, size_t gb_stride, float *rec_in, size_t rec_stride, int shift,
                    float *snap_win, int pos0, const int *dpos) {
    pdl_enter(); /* first: see st_launch (common.cuh) */
    __shared__ float red[ST_WARP];
    const int t = blockIdx.x, seg = blockIdx.y, tid = threadIdx.x;
    const int nk = g.n_k_head, nv = g.n_v_head, hd = g.head_dim, K = g.d_conv, back = K - 1;
    const int cd = (2 * nk + nv) * hd;
    if (seg == 2 * nk + nv) { /* the gates */
        const int r = nv / nk;
        for (int h = tid; h < nv; h += CONV_THREADS) {
            float b, a;
            if (g.ba_fused) { /* per key head: its r betas, then its r alphas */
                const float *ba = beta + (size_t)t * 2 * nv + (size_t)(h / r) * 2 * r;
                b = ba[h % r], a = ba[r + h % r];
            } else {
                b = beta[(size_t)t * nv + h], a = alpha[(size_t)t * nv + h];
            }
            gb[(size_t)t * gb_stride + 2 * h] = expf(gdn_softplus(a + g.dt_bias[h]) * g.a[h]);
            gb[(size_t)t * gb_stride + 2 * h + 1] = gdn_sigmoid(b);
        }
        return;
    }
    const int fresh = gdn_pos(pos0, dpos) == 0;
    constexpr int NV = CUDA_GDN_MAX_HD / CONV_THREADS;
    float val[NV];
    float ss = 0.0f;
#pragma unroll
    for (int m = 0; m < NV; m++) {
        const int j = tid + m * CONV_THREADS;
        val[m] = 0.0f;
        if (j >= hd) continue;
        const int ch = seg * hd + j;
        const float *w = g.conv_w + (size_t)ch * K;
        float s = 0.0f;
        for (int i = 0; i < K; i++) { /* input i of token t's window: [window | chunk] at t + i */
            const int p = t + i;
            const float x = p < back ? (fresh ? 0.0f : conv[(size_t)p * cd + ch]) : qkv[(size_t)(p - back) * cd + ch];
            s += w[i] * x;
        }
        val[m] = gdn_silu(s);
        ss += val[m] * val[m];
        if (rec_in) rec_in[(size_t)t * rec_stride + ch] = qkv[(size_t)t * cd + ch];
        if (shift) { /* t = 0: window inputs 1..back-1, then this token's */
            float *wc = (float *)conv;
            for (int i = 0; i < back; i++) {
                if (snap_win) snap_win[(size_t)i * cd + ch] = fresh ? 0.0f : wc[(size_t)i * cd + ch];
                wc[(size_t)i * cd + ch] = i + 1 < back ? (fresh ? 0.0f : wc[(size_t)(i + 1) * cd + ch]) : qkv[ch];
            }
        }
    }
    float f = 1.0f;
    if (seg < 2 * nk) { /* q (scaled by 1/sqrt(hd)) and k: L2 norms */
        ss = block_sum(ss, red);
        f = (seg < nk ? 1.0f / sqrtf((float)hd) : 1.0f) / sqrtf(ss + g.eps);
    }
#pragma unroll
    for (int m = 0; m < NV; m++) {
        const int j = tid + m * CONV_THREADS;
        if (j < hd) c[(size_t)t * c_stride + (size_t)seg * hd + j] = val[m] * f;
    }
}

/* window: per channel, the last d_conv-1 inputs of [window | chunk]; the
 * window it replaces goes to snap_win (or NULL). Each thread reads its
 * channel's window whole before writing it, so the shift needs no order. */
static __global__ void gdn_window_kernel(float *conv, const float *qkv, float *snap_win, int n_tok, int cd, int back,
                                         int pos0, const int *dpos) {
    pdl_enter();
    const int ch = blockIdx.x * blockDim.x + threadIdx.x;
    if (ch >= cd) return;
    const int fresh = gdn_pos(pos0, dpos) == 0;
    float old[CUDA_GDN_MAX_CONV - 1];
#pragma unroll
    for (int i = 0; i < CUDA_GDN_MAX_CONV - 1; i++) {
        if (i >= back) break;
        old[i] = fresh ? 0.0f : conv[(size_t)i * cd + ch];
        if (snap_win) snap_win[(size_t)i * cd + ch] = old[i];
    }
#pragma unroll
    for (int i = 0; i < CUDA_GDN_MAX_CONV - 1; i++) {
        if (i >= back) break;
        const int p = n_tok + i;
        conv[(size_t)i * cd + ch] = p < back ? old[p] : qkv[(size_t)(p - back) * cd + ch];
    }
}

/* keep's window: the last d_conv-1 inputs of [saved window | kept tokens' inputs (record rows)]. */
static __global__ void gdn_keep_window_kernel(float *conv, const float *win, const float *rec, size_t row, int n_keep,
                                              int cd, int back) {
    pdl_enter();
    const int ch = blockIdx.x * blockDim.x + threadIdx.x;
    if (ch >= cd) return;
    for (int i = 0; i < back; i++) {
        const int p = n_keep + i;
        conv[(size_t)i * cd + ch] = p < back ? win[(size_t)p * cd + ch] : rec[(size_t)(p - back) * row + ch];
    }
}

/* One token's inputs of the scan, as a warp holds them. */
template <int NPL> struct scan_in { float q[NPL], k[NPL], v[GDN_ROWS], decay, beta; };

template <int NPL>
static __device__ __forceinline__ void scan_load(scan_in<NPL> &in, const float *ct, const float *gt, int qo, int ko,
                                                 int vo, int row0, int h, int hd, int lane) {
#pragma unroll
    for (int i = 0; i < NPL; i++) {
        const int col = lane + 32 * i;
        in.q[i] = col < hd ? ct[qo + col] : 0.0f;
        in.k[i] = col < hd ? ct[ko + col] : 0.0f;
    }
#pragma unroll
    for (int r = 0; r < GDN_ROWS; r++) in.v[r] = row0 + r < hd ? ct[vo + row0 + r] : 0.0f;
    in.decay = gt[2 * h];
    in.beta = gt[2 * h + 1];
}

/* scan: block (value head h, slice of GDN_WARPS * GDN_ROWS state rows).
 * S comes from s_in (zeros at position 0) and goes to s_out; snap (or
 * NULL) gets the S it started from. o [n_tok][nv][hd], or NULL (keep's
 * replay, which wants only the state). NPL: keys per lane
 * (hd <= 32 * NPL). */
template <int NPL>
static __global__ void __launch_bounds__(GDN_WARPS * 32)
    gdn_scan_kernel(const float *s_in, float *s_out, float *snap, const float *c, size_t c_stride, const float *gb,
                    size_t gb_stride, float *o, int n_tok, int nk, int nv, int hd, int k_grouped, int pos0,
                    const int *dpos) {
    pdl_enter();
    const int h = blockIdx.x, lane = threadIdx.x % 32, w = threadIdx.x / 32;
    const int row0 = (blockIdx.y * GDN_WARPS + w) * GDN_ROWS;
    if (row0 >= hd) return; /* whole warp, and no block barrier below */
    const int fresh = gdn_pos(pos0, dpos) == 0;
    const int kh = k_grouped ? h / (nv / nk) : h % nk; /* the key head value head h reads */
    const size_t hs = (size_t)h * hd * hd;
    float S[GDN_ROWS][NPL];
#pragma unroll
    for (int r = 0; r < GDN_ROWS; r++)
#pragma unroll
        for (int i = 0; i < NPL; i++) {
            const int row = row0 + r, col = lane + 32 * i;
            const int in = row < hd && col < hd;
            S[r][i] = in && !fresh ? s_in[hs + (size_t)row * hd + col] : 0.0f;
            if (in && snap) snap[hs + (size_t)row * hd + col] = S[r][i];
        }
    const int qo = kh * hd, ko = (nk + kh) * hd, vo = (2 * nk + h) * hd;
    /* the inputs of tokens t+1 and t+2 are loaded while token t computes:
     * one token's work is shorter than a load's trip to L2 */
    scan_in<NPL> cur, nx1, nx2;
    if (n_tok > 0) scan_load<NPL>(cur, c, gb, qo, ko, vo, row0, h, hd, lane);
    if (n_tok > 1) scan_load<NPL>(nx1, c + c_stride, gb + gb_stride, qo, ko, vo, row0, h, hd, lane);
    for (int t = 0; t < n_tok; t++) {
        if (t + 2 < n_tok)
            scan_load<NPL>(nx2, c + (size_t)(t + 2) * c_stride, gb + (size_t)(t + 2) * gb_stride, qo, ko, vo, row0, h,
                           hd, lane);
        float sk[GDN_ROWS], oq[GDN_ROWS];
#pragma unroll
        for (int r = 0; r < GDN_ROWS; r++) {
            sk[r] = 0.0f;
#pragma unroll
            for (int i = 0; i < NPL; i++) {
                S[r][i] *= cur.decay;
                sk[r] += S[r][i] * cur.k[i];
            }
        }
#pragma unroll
        for (int off = ST_WARP / 2; off > 0; off >>= 1) /* the rows' sums interleaved: independent chains */
#pragma unroll
            for (int r = 0; r < GDN_ROWS; r++) sk[r] += __shfl_xor_sync(ST_FULL_MASK, sk[r], off);
#pragma unroll
        for (int r = 0; r < GDN_ROWS; r++) {
            const float d = cur.beta * (cur.v[r] - sk[r]);
            oq[r] = 0.0f;
#pragma unroll
            for (int i = 0; i < NPL; i++) {
                S[r][i] += d * cur.k[i];
                oq[r] += S[r][i] * cur.q[i];
            }
        }
#pragma unroll
        for (int off = ST_WARP / 2; off > 0; off >>= 1)
#pragma unroll
            for (int r = 0; r < GDN_ROWS; r++) oq[r] += __shfl_xor_sync(ST_FULL_MASK, oq[r], off);
        if (o && lane == 0) {
            float *ot = o + ((size_t)t * nv + h) * hd;
#pragma unroll
            for (int r = 0; r < GDN_ROWS; r++)
                if (row0 + r < hd) ot[row0 + r] = oq[r];
        }
        if (t + 1 < n_tok) cur = nx1;
        if (t + 2 < n_tok) nx1 = nx2;
    }
#pragma unroll
    for (int r = 0; r < GDN_ROWS; r++)
#pragma unroll
        for (int i = 0; i < NPL; i++) {
            const int row = row0 + r, col = lane + 32 * i;
            if (row < hd && col < hd) s_out[hs + (size_t)row * hd + col] = S[r][i];
        }
}

/* norm: one warp per (token, value head) row of hd: rms norm, the weight,
 * silu(z); with aq (hd a multiple of 32) also the int8 blocks. */
template <int NPL>
static __global__ void __launch_bounds__(NORM_WARPS * 32)
    gdn_norm_kernel(const float *o, const float *z, const float *norm, float *out, int n_rows, int hd, float eps,
                    int8_t *aq, float2 *ad) {
    pdl_enter();
    const int r = blockIdx.x * NORM_WARPS + threadIdx.x / 32, lane = threadIdx.x % 32;
    if (r >= n_rows) return; /* whole warp */
    const size_t base = (size_t)r * hd;
    float v[NPL], ss = 0.0f;
#pragma unroll
    for (int i = 0; i < NPL; i++) {
        const int col = lane + 32 * i;
        v[i] = col < hd ? o[base + col] : 0.0f;
        ss += v[i] * v[i];
    }
    ss = warp_sum(ss);
    const float f = 1.0f / sqrtf(ss / hd + eps);
#pragma unroll
    for (int i = 0; i < NPL; i++) {
        const int col = lane + 32 * i;
        if (col >= hd) continue; /* whole warps when aq is given */
        const float y = v[i] * f * norm[col] * gdn_silu(z[base + col]);
        out[base + col] = y;
        if (aq) quant_block_store(y, base + col, aq, ad);
    }
}

static __global__ void split_halves_kernel(const float *src, float *a, float *b, size_t n, int w) {
    pdl_enter();
    const size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    const size_t rg = i / w, j = i % w;
    a[i] = src[rg * 2 * w + j];
    b[i] = src[rg * 2 * w + w + j];
}

/* With aq: n and dim multiples of 32, so each warp holds one whole block or none. */
static __global__ void sigmoid_mul_kernel(float *x, const float *g, int dim, int g_dim, size_t n, int8_t *aq,
                                          float2 *ad) {
    pdl_enter();
    const size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    const float gv = g_dim == 1 ? g[i / dim] : g[i];
    const float y = x[i] * gdn_sigmoid(gv);
    x[i] = y;
    if (aq) quant_block_store(y, i, aq, ad);
}

size_t cuda_gdn_scratch_floats(const st_gdn *g, int n_tok) {
    const size_t cd = (size_t)(2 * g->n_k_head + g->n_v_head) * g->head_dim, vd = (size_t)g->n_v_head * g->head_dim;
    return (size_t)(n_tok > 1 ? n_tok : 1) * (cd + 2 * (size_t)g->n_v_head + vd);
}

/* The scan for the state's head size. */
static void scan_launch(const st_gdn *g, const float *s_in, float *s_out, float *snap, const float *c, size_t c_stride,
                        const float *gb, size_t gb_stride, float *o, int n_tok, int pos0, const int *dpos,
                        cudaStream_t s) {
    const int hd = g->head_dim;
    const dim3 grid(g->n_v_head, st_div_up(hd, GDN_WARPS * GDN_ROWS)), block(GDN_WARPS * 32);
#define SCAN(NPL)                                                                                                      \
    st_launch(gdn_scan_kernel<NPL>, grid, block, 0, s, s_in, s_out, snap, c, c_stride, gb, gb_stride, o, n_tok,        \
              g->n_k_head, g->n_v_head, hd, g->k_grouped, pos0, dpos)
    if (hd <= 32) SCAN(1);
    else if (hd <= 64) SCAN(2);
    else if (hd <= 128) SCAN(4);
    else SCAN(8);
#undef SCAN
}

void cuda_gated_delta_net(const st_gdn *g, st_kv_layer *st, int n_tok, int pos0, const int *dpos, const float *qkv,
                          const float *z, const float *beta, const float *alpha, float *out, float *scratch, int8_t *aq,
                          float2 *ad, cudaStream_t s) {
    const int hd = g->head_dim, nk = g->n_k_head, nv = g->n_v_head, back = g->d_conv - 1;
    ST_ASSERT(n_tok > 0 && nv % nk == 0 && st->conv && st->ssm && hd <= CUDA_GDN_MAX_HD && g->d_conv >= 1 &&
              g->d_conv <= CUDA_GDN_MAX_CONV && (!aq || hd % 32 == 0));
    const size_t cd = (size_t)(2 * nk + nv) * hd;
    float *c = scratch, *gb = c + (size_t)n_tok * cd, *o = gb + (size_t)n_tok * 2 * nv;
    size_t c_stride = cd, gb_stride = 2 * (size_t)nv;
    float *snap = NULL, *snap_win = NULL, *rec_in = NULL;
    if (st->undo_cap > 0) { /* a verify pass: record how to undo it (cuda_gated_delta_net_keep) */
        ST_ASSERT(st->undo && st->undo_n + n_tok <= st->undo_cap);
        const size_t ns = (size_t)nv * hd * hd, row = 2 * cd + 2 * (size_t)nv;
        if (st->undo_n == 0) snap = st->undo, snap_win = st->undo + ns; /* the state before the pass */
        rec_in = st->undo + ns + (size_t)back * cd + (size_t)st->undo_n * row;
        c = rec_in + cd, gb = rec_in + 2 * cd, c_stride = gb_stride = row;
        st->undo_n += n_tok;
    }
    const int shift = n_tok == 1;
    st_launch(gdn_conv_kernel, dim3(n_tok, 2 * nk + nv + 1), dim3(CONV_THREADS), 0, s, qkv, (const float *)st->conv, *g,
              beta, alpha, c, c_stride, gb, gb_stride, rec_in, c_stride, shift, snap_win, pos0, dpos);
    if (back > 0 && !shift)
        st_launch(gdn_window_kernel, dim3(st_div_up(cd, 256)), dim3(256), 0, s, st->conv, qkv, snap_win, n_tok, (int)cd,
                  back, pos0, dpos);
    scan_launch(g, st->ssm, st->ssm, snap, c, c_stride, gb, gb_stride, o, n_tok, pos0, dpos, s);
    const int n_rows = n_tok * nv;
    const dim3 ng(st_div_up(n_rows, NORM_WARPS)), nb(NORM_WARPS * 32);
    if (hd <= 32)
        st_launch(gdn_norm_kernel<1>, ng, nb, 0, s, (const float *)o, z, g->norm, out, n_rows, hd, g->eps, aq, ad);
    else if (hd <= 64)
        st_launch(gdn_norm_kernel<2>, ng, nb, 0, s, (const float *)o, z, g->norm, out, n_rows, hd, g->eps, aq, ad);
    else if (hd <= 128)
        st_launch(gdn_norm_kernel<4>, ng, nb, 0, s, (const float *)o, z, g->norm, out, n_rows, hd, g->eps, aq, ad);
    else st_launch(gdn_norm_kernel<8>, ng, nb, 0, s, (const float *)o, z, g->norm, out, n_rows, hd, g->eps, aq, ad);
}

void cuda_gated_delta_net_keep(const st_gdn *g, st_kv_layer *st, int n_keep, cudaStream_t s) {
    ST_ASSERT(st->undo_cap > 0 && n_keep >= 0 && n_keep <= st->undo_n);
    if (n_keep < st->undo_n) {
        const int hd = g->head_dim, nv = g->n_v_head, back = g->d_conv - 1;
        const size_t cd = (size_t)(2 * g->n_k_head + nv) * hd, ns = (size_t)nv * hd * hd;
        const size_t row = 2 * cd + 2 * (size_t)nv;
        const float *win = st->undo + ns, *rec = win + (size_t)back * cd;
        /* the saved S, then the kept tokens' delta rule from their recorded rows (position != 0: from the saved S) */
        scan_launch(g, st->undo, st->ssm, NULL, rec + cd, row, rec + 2 * cd, row, NULL, n_keep, 1, NULL, s);
        if (back > 0)
            st_launch(gdn_keep_window_kernel, dim3(st_div_up(cd, 256)), dim3(256), 0, s, st->conv, win, rec, row,
                      n_keep, (int)cd, back);
    }
    st->undo_cap = 0;
    st->undo_n = 0;
}

void cuda_split_halves(const float *src, float *a, float *b, int n_rows, int n_group, int w, cudaStream_t s) {
    const size_t n = (size_t)n_rows * n_group * w;
    if (!n) return;
    st_launch(split_halves_kernel, dim3(st_div_up(n, 256)), dim3(256), 0, s, src, a, b, n, w);
}

void cuda_sigmoid_mul(float *x, const float *g, int dim, int g_dim, int n_rows, int8_t *aq, float2 *ad,
                      cudaStream_t s) {
    const size_t n = (size_t)n_rows * dim;
    ST_ASSERT(g_dim == 1 || g_dim == dim);
    ST_ASSERT(!aq || (g_dim == dim && dim % 32 == 0));
    if (!n) return;
    st_launch(sigmoid_mul_kernel, dim3(st_div_up(n, 256)), dim3(256), 0, s, x, g, dim, g_dim, n, aq, ad);
}
