/* The backend op interface: the forward pass (model/) is written once against
 * this table of function pointers, and each backend (cpu/, cuda/) fills it.
 * No #ifdef in the hot path: the backend is chosen at run time.
 *
 * Memory ownership: activation buffers come from be->alloc and live on the
 * backend's device; weights are st_weight views whose data pointers the
 * engine places (mmap'd host memory for the CPU; device copies for a GPU).
 * Expert tensors keep one pointer per expert, so that the engine can place
 * each (layer, expert) separately (GPU cache slot, pinned RAM, mmap) without
 * the forward pass knowing where it lives.
 */
#ifndef STRATA_BACKEND_BACKEND_H
#define STRATA_BACKEND_BACKEND_H

#include <stddef.h>
#include <stdint.h>

#include "quant/blocks.h"

/* A weight matrix (or stack of them): n_mat matrices of n_out rows x n_in
 * columns, rows contiguous (GGUF's ne0 = n_in, ne1 = n_out, ne2 = n_mat). */
typedef struct {
    const void *data; /* first matrix; NULL if the model lacks the tensor */
    const void **mat; /* per-matrix pointers (n_mat of them) when placed apart; NULL = contiguous */
    qt_type type;
    int64_t n_in;      /* columns (ne0) */
    int64_t n_out;     /* rows (ne1) */
    int64_t n_mat;     /* experts (ne2), 1 for dense */
    size_t row_bytes;  /* qt_row_size(type, n_in) */
    const float *bias; /* (n_mat x n_out) f32 added to matrix m's products, this backend's memory,
                          or NULL: every matmul form adds row mat of it (ST_MAT_ALL: each
                          matrix its own), moe_experts adds an expert's row by expert id,
                          not by where the matrix is placed (gpt-oss) */
} st_weight;

static inline const void *st_weight_mat(const st_weight *w, int64_t m) {
    return w->mat ? w->mat[m] : (const uint8_t *)w->data + (size_t)m * (size_t)w->n_out * w->row_bytes;
}

/* matmul's mat for every matrix of a stack at once (see matmul). */
#define ST_MAT_ALL (-1)

typedef enum { ST_KV_F16 = 0, ST_KV_INT8 = 1 } st_kv_type;

/* One layer's KV cache as the attention kernels see it. Row r (a position)
 * holds n_head_kv * head_dim values; int8 rows carry one f32 scale per head. */
typedef struct {
    st_kv_type type;
    int n_ctx; /* positions */
    int n_head_kv, head_dim;
    void *k, *v;              /* [n_ctx][n_head_kv*head_dim] f16 or int8 */
    float *k_scale, *v_scale; /* [n_ctx][n_head_kv], int8 only */
    /* A recurrent layer (gated DeltaNet, qwen3next / qwen35moe) keeps no rows
     * but a fixed-size state per sequence, f32, in place of k and v (NULL for
     * attention layers); it holds the history of positions 0..pos-1 after a
     * step ending at pos, and a step at position 0 starts from zeros. */
    float *conv; /* [d_conv-1][conv_dim]: the last inputs of the short convolution */
    float *ssm;  /* [n_v_head][head_v][head_k]: per head S, row j (value) over keys */
    /* Speculative decoding's undo record of a recurrent layer: while undo_cap
     * > 0 (a verify pass of drafted tokens), gated_delta_net saves the state
     * before the first token it is given (ssm, then conv) and, per token, what
     * the recurrence read (the input row, the convolved q|k|v row, decay and
     * beta), so that gated_delta_net_keep can leave the state as if only the
     * first tokens had been fed. Backend memory, (undo_cap) tokens. */
    float *undo;
    int undo_cap, undo_n; /* tokens it can hold (0: not recording), tokens recorded */
} st_kv_layer;

/* SWIGLU_OAI: gpt-oss's clamped SwiGLU, g' = min(g, 7), u' = clamp(u, -7, 7),
 * out = g' * sigmoid(1.702 g') * (u' + 1). */
typedef enum { ST_ACT_SILU = 0, ST_ACT_GELU = 1, ST_ACT_SWIGLU_OAI = 2 } st_act;
#define ST_OAI_ALPHA 1.702f
#define ST_OAI_LIMIT 7.0f

/* Rotary embedding of one layer: base theta, position scale, the pair
 * layout (neox: pairs (i, i+d/2); else adjacent pairs (2i, 2i+1)), and
 * optional per-pair frequency divisors (head_dim/2 values in the backend's
 * memory, or NULL): pair i turns by pos * freq_scale * theta^(-2i/d) / div[i]. */
typedef struct {
    float theta, freq_scale;
    int neox;
    const float *freq_div;
    int n_rot; /* rotate only the first n_rot values of each head (partial rotary: the
                  frequencies then use n_rot for d); 0 = all of them */
} st_rope;

/* One gated DeltaNet layer's constants (qwen3next, qwen35moe): sizes, and its
 * small per-layer tensors (f32, this backend's memory). */
typedef struct {
    int d_conv;             /* width of the causal convolution */
    int n_k_head, n_v_head; /* value head j reads key/query head j % n_k_head (qwen35moe), or
                               j / (n_v_head / n_k_head) when k_grouped (qwen3next) */
    int head_dim;           /* key = value head size */
    float eps;              /* of the L2 norms of q and k and of the output RMS norm */
    int k_grouped;          /* the value heads of one key head are adjacent (see n_v_head) */
    int ba_fused;           /* beta and alpha come as one [n_tok][2*n_v_head] product grouped per key
                               head: (beta of its n_v/n_k value heads, then their alpha); else two */
    const float *conv_w;    /* [conv_dim][d_conv], conv_dim = 2*n_k_head*hd + n_v_head*hd */
    const float *dt_bias;   /* (n_v_head) */
    const float *a;         /* (n_v_head) -exp(A_log): the decay rate per head */
    const float *norm;      /* (head_dim) RMS norm weight of each head's output */
} st_gdn;

/* f32 values of a DeltaNet layer's undo record (st_kv_layer undo) for n_tok
 * tokens: the state (n_v S matrices, then d_conv-1 convolution inputs), then
 * per token its input row, its convolved row (conv_dim each), decay and beta
 * per value head. */
static inline size_t st_gdn_undo_floats(const st_gdn *g, int n_tok) {
    const size_t cd = (size_t)(2 * g->n_k_head + g->n_v_head) * g->head_dim;
    return (size_t)g->n_v_head * g->head_dim * g->head_dim + (size_t)(g->d_conv - 1) * cd +
           (size_t)n_tok * (2 * cd + 2 * (size_t)g->n_v_head);
}

/* How a MoE layer turns its router logits into the top-k experts and their
 * weights. p = softmax(logits) (qwen3moe) or sigmoid(logits) (glm4moe); the
 * choice ranks p + bias (the expert score-correction bias, exp_probs_b, of
 * glm4moe and DeepSeek V3: it steers the choice only); the weights are the
 * chosen experts' p, divided by their sum when norm_topk, times scale (the
 * routed scaling factor). Softmax, no bias, scale 1 is qwen3moe's routing. */
typedef enum { ST_GATE_SOFTMAX = 0, ST_GATE_SIGMOID = 1 } st_gate_fn;
typedef struct {
    st_gate_fn fn;
    int norm_topk;     /* renormalise the chosen weights to sum 1 */
    const float *bias; /* (n_expert) added to p for the choice only, this backend's memory; or NULL */
    float scale;       /* multiplies the weights; 1 = none */
    /* group-limited choice (DeepSeek V3): the experts are n_group groups of
     * n_expert / n_group; a group's score is the sum of its two best ranked
     * scores (p + bias); only the experts of the n_group_used best groups
     * are candidates for the top-k. 0 = no groups. */
    int n_group, n_group_used;
} st_moe_gating;
/* What a backend's routing computes (st_backend.moe_gatings). */
enum {
    ST_GATINGS_SOFTMAX = 1, /* softmax, no bias, scale 1: qwen3moe's routing */
    ST_GATINGS_ALL = 2,     /* every st_moe_gating */
    ST_GATINGS_OAI = 4,     /* moe_experts adds the weights' biases and computes ST_ACT_SWIGLU_OAI (gpt-oss) */
};

/* A backend's own alternative implementations of some ops, chosen per
 * backend (st_backend.variant) so that a comparison (backend_check) runs
 * each against the reference. */
typedef enum {
    ST_VARIANT_ATTN = 0,     /* attention kernels: 0 per query head, 1 GQA, 2 GQA and tensor cores for prompts */
    ST_VARIANT_MOE_PATH = 1, /* MoE: 0 the default, 1 a per-expert loop (a cross-check), 2 the grouped products only */
    ST_VARIANT_FUSE = 2,     /* bits of the fused ops run fused (0: each as its composition, backend_compose.h) */
    ST_VARIANT_NO_BLAS = 3,  /* 1: the GEMM library counts as refused, as after a failed call (its fallback runs) */
    ST_VARIANT_PRECISE = 4,  /* 1: matrix products take f32 activations (the CPU's STRATA_PRECISE=1) */
    ST_VARIANT_GRAPHS = 5,   /* 0: every step runs live, none recorded (a layer split's steps wait on the host) */
} st_variant;

typedef struct st_backend st_backend;

struct st_backend {
    const char *name;
    void *ctx;

    void *(*alloc)(st_backend *be, size_t bytes); /* activation buffer on the device */
    void (*free)(st_backend *be, void *p);
    void (*destroy)(st_backend *be);

    /* out[i, :] = dequant(w row ids[i]) for i < n (embedding lookup). */
    void (*get_rows)(st_backend *be, const st_weight *w, const int32_t *ids, int n, float *out);
    /* y[t, 0:n_out] = W[mat] x[t, 0:n_in] for t < n_tok. mat = ST_MAT_ALL: every
     * matrix of the stack, each row holding one input per matrix: y[t][m] = W[m] x[t][m],
     * x [n_tok][n_mat][n_in], y [n_tok][n_mat][n_out] (multi-head latent attention's
     * per-head products with attn_k_b / attn_v_b, every head in one call). */
    void (*matmul)(st_backend *be, const st_weight *w, int64_t mat, const float *x, float *y, int n_tok);
    /* Fused forms of the ops here, each equal to the composition its comment
     * gives (backend_compose.h composes them from this table's ops, which is
     * what the CPU backend runs); the forward pass calls them where it means
     * them, and a GPU backend runs each decode-sized one as one kernel.
     * Products of one input: y[i][t] = W_i[0] x[t] for i < n (q, k and v;
     * gate and up); the y[i] lie apart from x and from each other. */
    void (*matmul_multi)(st_backend *be, int n, const st_weight *const *w, const float *x, float *const *y, int n_tok);
    /* A block's output joining the residual stream, and the next block's
     * norm: y = W[0] x, res += y, h = rmsnorm(res) * nw (rows of w->n_out),
     * then, when wn is given, yn = Wn[0] h (the MoE router reads the FFN
     * norm's output). Composed: matmul, rmsnorm with y as its residual,
     * matmul. res apart from x and y; h apart from res; yn from h and res. */
    void (*matmul_res_norm)(st_backend *be, const st_weight *w, const float *x, float *y, float *res, const float *nw,
                            float eps, float *h, const st_weight *wn, float *yn, int n_tok);
    /* y[r] = x[r] / rms(x[r]) * w, rows of dim values; in place allowed.
     * With res (n_rows rows too): first x[r] += res[r] (the residual add
     * before a norm, one pass instead of two); x is written then. */
    void (*rmsnorm)(st_backend *be, float *x, const float *res, const float *w, float *y, int dim, int n_rows,
                    float eps);
    /* The attention inputs of n_tok tokens at positions pos0..: per-head
     * RMSNorm of q and k when qn, kn (head_dim weights each) are given, the
     * rotary embedding of both, then k and v into the cache.
     * q [n_tok][n_head][hd]; k, v [n_tok][kv->n_head_kv][hd]; hd = kv->head_dim. */
    void (*qkv_prep)(st_backend *be, float *q, float *k, const float *v, const float *qn, const float *kn, float eps,
                     int n_tok, int n_head, const st_rope *rope, st_kv_layer *kv, int pos0);
    /* Causal attention of q [n_tok][n_head][head_dim] (positions pos0..) over the
     * cache positions 0..pos0+t (the last `window` of them if window > 0). */
    void (*attention)(st_backend *be, const float *q, const st_kv_layer *kv, int n_tok, int pos0, int n_head,
                      float scale, int window, float *out);
    /* Optional (NULL: the backend has none; engine_backend_supports refuses
     * gpt-oss). attention with a sink per head: the softmax's denominator
     * also counts exp(sinks[h]) (n_head logits, this backend's memory), a
     * position that absorbs attention and gives no value (gpt-oss). */
    void (*attention_sinks)(st_backend *be, const float *q, const st_kv_layer *kv, int n_tok, int pos0, int n_head,
                            float scale, int window, const float *sinks, float *out);
    /* Optional (NULL: none, as on the CPU). qkv_prep and attention (with
     * sinks when given, else NULL) for n sequences of one token each in one
     * call, where a batched decode step would call them per sequence: row
     * i of q, k, v and out is sequence i's token at position pos[i] of its
     * own cache kv[i][il] (kv[i]: sequence i's layers; one shape and type).
     * attention_seqs returns 1, having done nothing, where it has no such
     * form (the caller runs attention per sequence), else 0. */
    void (*qkv_prep_seqs)(st_backend *be, float *q, float *k, const float *v, const float *qn, const float *kn,
                          float eps, int n, int n_head, const st_rope *rope, st_kv_layer *const *kv, int il,
                          const int *pos);
    int (*attention_seqs)(st_backend *be, const float *q, st_kv_layer *const *kv, int il, int n, const int *pos,
                          int n_head, float scale, int window, const float *sinks, float *out);
    /* out = act(g) * u, elementwise over n values. */
    void (*act_mul)(st_backend *be, st_act act, const float *g, const float *u, float *out, int64_t n);
    /* x[r] += b for each of n_rows rows of dim values (b has dim values; bias or residual with n_rows=1). */
    void (*add)(st_backend *be, float *x, const float *b, int64_t dim, int n_rows);
    void (*scale)(st_backend *be, float *x, float s, int64_t n);
    /* Gated DeltaNet of n_tok tokens of one sequence from position pos0 (0:
     * the state starts from zeros), its state in st (conv, ssm). Per token,
     * with qkv [n_tok][conv_dim] the input projection (q | k | v), z
     * [n_tok][n_v*hd] the output gate, beta, alpha [n_tok][n_v] (or beta the
     * fused product, alpha NULL: g->ba_fused):
     *   c = silu(causal conv of qkv with the last d_conv-1 inputs); q, k, v = c
     *   q = l2norm(q) / sqrt(hd), k = l2norm(k); b = sigmoid(beta);
     *   decay = exp(softplus(alpha + dt_bias) * a)
     *   per value head: S = decay S; S += b (v - S k) k^T; o = S q
     *   out = rmsnorm(o per head) * norm * silu(z)       -> [n_tok][n_v*hd] */
    void (*gated_delta_net)(st_backend *be, const st_gdn *g, st_kv_layer *st, int n_tok, int pos0, const float *qkv,
                            const float *z, const float *beta, const float *alpha, float *out);
    /* After a recorded pass (st_kv_layer undo): the state as if only the
     * first n_keep of the undo_n recorded tokens had been fed (the saved
     * state, then the recurrence of those tokens replayed from the record: the
     * same arithmetic, so the same bits); recording stops. g: the sizes only
     * (its weights are not read). NULL where the backend has no DeltaNet. */
    void (*gated_delta_net_keep)(st_backend *be, const st_gdn *g, st_kv_layer *st, int n_keep);
    /* Rows of n_group pairs of w-value halves, src [n_rows][n_group][2][w], split
     * into a and b [n_rows][n_group][w] (a gated attention's query and gate). */
    void (*split_halves)(st_backend *be, const float *src, float *a, float *b, int n_rows, int n_group, int w);
    /* x[r][i] *= sigmoid(g[r][i]) (g_dim = dim), or sigmoid(g[r]) (g_dim = 1), n_rows rows of dim. */
    void (*sigmoid_mul)(st_backend *be, float *x, const float *g, int dim, int g_dim, int n_rows);
    /* dst[r][0:width] = src[r][0:width] for r < n_rows, rows dst_stride and src_stride floats apart
     * (a strided view copied: the heads of multi-head latent attention gathered
     * for their per-head products, and scattered back). Optional: NULL where a
     * backend lacks it; the engine then refuses the families that need it. */
    void (*copy_2d)(st_backend *be, float *dst, int64_t dst_stride, const float *src, int64_t src_stride, int64_t width,
                    int n_rows);
    /* Mixture-of-experts FFN for n_tok tokens: route with the router logits
     * as gt says (st_moe_gating: softmax or sigmoid, bias, top-k, optional
     * renormalisation, scale), then
     * out[t] = sum_j w_tj * down_e(act(gate_e h[t]) * up_e h[t]). */
    void (*moe_ffn)(st_backend *be, const float *h, const float *router_logits, int n_tok, int n_expert, int k,
                    const st_moe_gating *gt, st_act act, const st_weight *gate, const st_weight *up,
                    const st_weight *down, float *out);
    /* The MoE block's seam: moe_ffn is moe_route then moe_experts with every
     * expert here (emap NULL); a backend may fuse them (the GPU's decode
     * kernels). The engine calls the two halves itself when experts live in
     * several places (engine/moe_lanes.c).
     * Routing alone: sel, wsel [n_tok][k] (this backend's memory) = the top-k
     * experts of each token (by p, or p + bias; ties to the lower id) and
     * their weights (st_moe_gating); id -1 (weight 0) where NaN logits left
     * nothing to choose. */
    void (*moe_route)(st_backend *be, const float *router_logits, int n_tok, int n_expert, int k,
                      const st_moe_gating *gt, int32_t *sel, float *wsel);
    /* The routings it computes (ST_GATINGS_* bits); the engine refuses a
     * model whose routing is not among them (engine_backend_supports). */
    unsigned moe_gatings;
    /* The experts of given pairs: out[t] = sum_j wsel[t,j] * down_m(act(gate_m h[t]) * up_m h[t]),
     * m = emap[sel[t,j]], over the pairs whose m >= 0 (and sel >= 0); the others
     * contribute nothing (a token with none gets zeros). emap (n_expert values, this
     * backend's memory) says which of gate/up/down's n_mat matrices holds an
     * expert here (a cache slot) or -1 (computed elsewhere); NULL: m = sel. */
    void (*moe_experts)(st_backend *be, const float *h, int n_tok, int n_expert, int k, const int32_t *sel,
                        const float *wsel, const int32_t *emap, st_act act, const st_weight *gate, const st_weight *up,
                        const st_weight *down, float *out);
    /* Run one forward step: body(arg, pos0) queues this backend's ops for
     * n_tok tokens from position pos0. The CPU just calls it. The GPU records
     * a one-token step as a CUDA graph once and replays it while the
     * arg_size bytes at arg (the buffers and cache the step uses) stay the
     * same (and the body is the same); its ops read pos0 from the device
     * inside a step, so a replay at the next position needs no new
     * recording. arg_size 0: never recorded (a step that alternates with
     * the decoder's, such as the MTP block's, would record anew each time). */
    void (*run_step)(st_backend *be, int n_tok, int pos0, void (*body)(void *arg, int pos0), void *arg,
                     size_t arg_size);
    /* Optional (NULL: run_step): a step of n sequences of one token each,
     * sequence i at position pos[i]; body(arg, pos[0]) queues its ops. The
     * GPU records it as a CUDA graph once and replays it while the key_size
     * bytes at key (the step's shape and every row's cache) stay the same,
     * its batched ops (qkv_prep_seqs, attention_seqs) reading the positions
     * from the device; a step whose ops take a position from the host is
     * run as it comes. */
    void (*run_step_rows)(st_backend *be, int n, const int *pos, void (*body)(void *arg, int pos0), void *arg,
                          const void *key, size_t key_size);
    /* Optional (NULL: none): one-token steps recorded in segments around the
     * host's work in the middle (the expert lanes read each layer's routing),
     * so that the ops between two host waits launch as one graph. */
    const struct st_step_segments *segments;
    /* The k largest of x[0..n) (the backend's memory) and their indices, in
     * order (larger first, equal values by the lower index), into the host
     * arrays vals and ids: a sampler's candidates without copying all of x
     * to the host (the GPU's; NULL on the CPU, where x is host memory).
     * 0, or -1 with st_error when k or n is beyond what it takes. */
    int (*top_k)(st_backend *be, const float *x, int n, int k, int32_t *ids, float *vals);
    int top_k_max; /* the largest k top_k takes */
    /* Optional (NULL: none, as on the CPU). The draw of a sampler that is
     * only a temperature, over every id of x[0..n) (the backend's memory),
     * without copying x to the host: p[i] = exp((x[i] - max x) * inv_t), the
     * first i whose running sum of p passes u * sum(p) (engine/sampler.c's
     * draw_all; a draw within float rounding of a boundary between two ids
     * may take the neighbour). 0 with *tok; 1 when x holds a NaN or no
     * finite mass (the caller draws on the host, over the logits). */
    int (*draw)(st_backend *be, const float *x, int n, float inv_t, double u, int32_t *tok);
    /* Copy between host and device (identity memcpy on the CPU backend). */
    void (*to_host)(st_backend *be, void *dst, const void *src, size_t bytes);
    void (*to_device)(st_backend *be, void *dst, const void *src, size_t bytes);
    /* Optional (NULL: use to_device). A copy to the device queued behind the
     * ops before it, returning at once where the device can read src by
     * itself (host_register'ed memory): src must stay unchanged until the next
     * to_host, which waits for it. */
    void (*upload)(st_backend *be, void *dst, const void *src, size_t bytes);
    /* Optional (NULL: upload each). n uploads as one: the device reads the
     * n ranges src[i] (host_register'ed memory, as for upload) into dst[i]
     * itself, in one launch queued behind the ops before it; returns at once.
     * For many small copies, where each upload's call would cost more than
     * its bytes (the expert lanes send a layer's experts this way). */
    void (*upload_many)(st_backend *be, int n, void *const *dst, const void *const *src, const size_t *bytes);
    /* Optional (NULL: nothing to do). Make n bytes of host memory at p
     * (read-only use) copyable by the device without staging (pinned, or
     * page-locked in place); 0, or -1 with st_error when the system refuses. */
    int (*host_register)(st_backend *be, const void *p, size_t bytes);
    /* Undo host_register(p, ...) (before the memory is unmapped). */
    void (*host_unregister)(st_backend *be, const void *p);
    /* Optional (NULL: host memory, no device budget). Free and total bytes of the device's memory. */
    void (*mem_info)(st_backend *be, size_t *free_bytes, size_t *total_bytes);
    /* Optional (NULL: none). Sets this backend's variant `kind` to value
     * (value < 0: only asks) and returns the one before, or -1 when the
     * backend has no such choice. */
    int (*variant)(st_backend *be, st_variant kind, int value);
};

/* A step in segments (st_backend.segments). The caller drives it:
 *   begin(pos0, record)  the step's position goes to the device (its ops read
 *                        it there, as in run_step's graphs); record: the
 *                        ops from here on are recorded, not run;
 *   cut(&g)              the ops recorded since begin or resume become
 *                        graph *g, which runs now; 0, or -1 when they cannot
 *                        be recorded (an op needed the host: they did not run);
 *                        in a live step (begin without record), *g = NULL and
 *                        it marks where a recording would end;
 *   run(g)               a recorded segment runs (the step replayed: its ops
 *                        were not called this time);
 *   resume(record)       after cut or run, ops ran live (the host's part);
 *                        from here on they are recorded again (record) or
 *                        not called (replay);
 *   end()                the step is over;
 *   key(pos0)            what a recording depends on besides the caller's
 *                        arguments (scratch memory, attention variant): it
 *                        replays only under an equal key; UINT64_MAX after a
 *                        live step whose would-be segments met an op that
 *                        cannot be recorded (never record then);
 *   drop(g)              frees a recorded segment. */
typedef struct st_step_segments {
    void (*begin)(st_backend *be, int pos0, int record);
    int (*cut)(st_backend *be, void **g);
    void (*run)(st_backend *be, void *g);
    void (*resume)(st_backend *be, int record);
    void (*end)(st_backend *be);
    uint64_t (*key)(st_backend *be, int pos0);
    void (*drop)(st_backend *be, void *g);
} st_step_segments;

/* The CPU backend (backend/cpu): n_threads 0 = all cores. */
st_backend *backend_cpu_create(int n_threads);
/* How long its idle threads spin before sleeping (st_pool_set_spin_us): the
 * CPU expert lane, idle between layers for about as long as the device's
 * part of one, keeps them spinning so that each layer does not pay a wake-up. */
void backend_cpu_set_spin_us(st_backend *cpu, int us);

#endif
