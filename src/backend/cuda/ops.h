/* Launchers of the GPU backend's kernels (internal to backend/cuda). Every
 * pointer is device memory and every launcher enqueues on stream s without
 * synchronising; each launch is checked (by st_launch, or CUDA_LAUNCH_CHECK
 * after a <<<>>> launch). The semantics are those of the op table in
 * backend/backend.h, whose reference is the CPU backend
 * (backend/cpu/cpu_backend.c).
 */
#ifndef STRATA_BACKEND_CUDA_OPS_H
#define STRATA_BACKEND_CUDA_OPS_H

#include "backend/cuda/common.cuh"

/* A growable device buffer; growing frees the old one (cudaFree waits for the device). */
typedef struct {
    void *p;
    size_t bytes;
} cuda_scratch;
void *cuda_scratch_reserve(cuda_scratch *sc, size_t bytes);
void cuda_scratch_free(cuda_scratch *sc);

extern "C" int cuda_get_rows_supported(qt_type t);
void cuda_get_rows(const st_weight *w, const int32_t *ids, int n, float *out, cudaStream_t s);

/* rmsnorm and act_mul may also write their output as the int8 blocks the
 * matrix-vector products read (aq [rows][dim], ad [rows][dim/32], from
 * cuda_mm_act_scratch), so that the next product skips its quantization;
 * aq NULL: only the f32 output. */
void cuda_rmsnorm(float *x, const float *res, const float *w, float *y, int dim, int n_rows, float eps, int8_t *aq,
                  float2 *ad, cudaStream_t s);
/* qkv_prep (backend.h) in one kernel; the position is *dpos when dpos is
 * given (a recorded decode step), else pos0. */
void cuda_qkv_prep(float *q, float *k, const float *v, const float *qn, const float *kn, float eps, int n_tok,
                   int n_head, const st_rope *rope, st_kv_layer *kv, int pos0, const int *dpos, cudaStream_t s);
/* The same for n sequences of one token each (backend.h qkv_prep_seqs);
 * dpos: the positions read on the device (a recorded step), or NULL. */
void cuda_qkv_prep_seqs(float *q, float *k, const float *v, const float *qn, const float *kn, float eps, int n,
                        int n_head, const st_rope *rope, st_kv_layer *const *kv, int il, const int *pos,
                        const int *dpos, cudaStream_t s);
void cuda_act_mul(st_act act, const float *g, const float *u, float *out, int64_t n, int8_t *aq, float2 *ad,
                  cudaStream_t s);
void cuda_add(float *x, const float *b, int64_t dim, int n_rows, cudaStream_t s);
/* upload_many (backend.h): the device copies n ranges, src[i] page-locked
 * host memory that it reads at the host's address, into dst[i]. */
void cuda_gather_copy(int n, void *const *dst, const void *const *src, const size_t *bytes, cudaStream_t s);
void cuda_scale(float *x, float sc, int64_t n, cudaStream_t s);

/* Causal attention (backend.h); scratch holds the split partial results.
 * With dpos (a recorded decode step) the position is read on the device and
 * the launch is sized for a span of dspan positions (0: the whole cache).
 * The slices follow the position read on the device, so the result is right
 * at every position whatever the span; the span only chooses the kernel and
 * the number of slices. A recorded step for positions below
 * CUDA_ATT_SHORT_SPAN passes that as dspan (backend_cuda.cu records one step
 * for positions below it and another for the rest). */
#define CUDA_ATT_SHORT_SPAN 1280
/* aq, ad (or NULL): the output also written as the int8 blocks the next
 * product reads (head sizes that are multiples of 32; decode-sized calls:
 * the prompt kernel on tensor cores is not used then). mode: the kernels
 * the backend chose (STRATA_CUDA_ATTN, per backend): one block per query
 * head; the query heads of a KV head together (GQA) past the short span; or
 * that and tensor cores for prompt chunks (the default). */
enum { CUDA_ATT_HEAD = 0, CUDA_ATT_GQA = 1, CUDA_ATT_TC = 2 };
/* attention of n sequences of one token each (backend.h attention_seqs): row
 * i of q and out at position pos[i] of kv[i][il], slices of the per-head
 * kernel for all of them in one launch (each CUDA_SEQ_ROWS), one combine.
 * 1 (nothing done) for a latent row or a span past CUDA_ATT_SHORT_SPAN. */
int cuda_attention_seqs(const float *q, st_kv_layer *const *kv, int il, int n, const int *pos, const int *dpos,
                        int n_head, float scale, int window, const float *sinks, float *out, int8_t *aq, float2 *ad,
                        cuda_scratch *scratch, int n_sm, cudaStream_t s);
void cuda_attention(const float *q, const st_kv_layer *kv, int n_tok, int pos0, const int *dpos, int dspan, int n_head,
                    float scale, int window, float *out, int8_t *aq, float2 *ad, cuda_scratch *scratch, int n_sm,
                    int cc_major, int mode, cudaStream_t s);
/* The same with a sink per head (gpt-oss; backend.h attention_sinks):
 * sinks (n_head logits, device memory, or NULL: none) count in each
 * head's softmax denominator and give no value. */
void cuda_attention_sinks(const float *q, const st_kv_layer *kv, int n_tok, int pos0, const int *dpos, int dspan,
                          int n_head, float scale, int window, const float *sinks, float *out, int8_t *aq, float2 *ad,
                          cuda_scratch *scratch, int n_sm, int cc_major, int mode, cudaStream_t s);
/* The prompt kernel on tensor cores (attention_tc.cu): 0 when launched, 1
 * when it does not apply (head size other than 64/128, compute capability
 * below 8, HIP). */
int cuda_attention_tc(const float *q, const st_kv_layer *kv, int n_tok, int pos0, int n_head, float scale, int window,
                      float *out, int cc_major, cudaStream_t s);
int cuda_attention_tc_sinks(const float *q, const st_kv_layer *kv, int n_tok, int pos0, int n_head, float scale,
                            int window, const float *sinks, float *out, int cc_major, cudaStream_t s);

/* Decode over a long cache on tensor cores (attention_tc.cu): a token's
 * query heads of a KV head as the rows of the products, the slice partials
 * of cuda_attention (part [n_tok][n_head][n_split][2 + hd]) for its combine
 * kernel, slices of whole tiles of CUDA_ATT_TCD_TILE positions. fits: head
 * sizes 64 and 128, up to 16 query heads per KV head, sm_80 and later, not
 * on HIP. */
#define CUDA_ATT_TCD_TILE 64
int cuda_attn_tc_decode_fits(const st_kv_layer *kv, int G, int cc_major);
void cuda_attn_tc_decode(const float *q, const st_kv_layer *kv, int n_tok, int pos0, const int *dpos, int n_head,
                         float scale, int window, int n_split, float *part, cudaStream_t s);

/* The k largest of x[0..n) with their indices (topk.cu; larger first, ties
 * to the lower index, NaNs never chosen; index -1 past the values there
 * are, NaNs left out), at *out in scratch: k floats, then k int32 ids.
 * 0, or -1 with st_error (k above CUDA_TOPK_MAX, or n above 524288). */
#define CUDA_TOPK_MAX 64
size_t cuda_top_k_scratch_bytes(void); /* the most scratch cuda_top_k asks for */
/* backend.h's draw (draw.cu): the token (or -1: NaN, no finite mass) in device memory. */
size_t cuda_draw_scratch_bytes(int n);
int32_t *cuda_draw(const float *x, int n, float inv_t, double u, cuda_scratch *scratch, cudaStream_t s);
int cuda_top_k(const float *x, int n, int k, cuda_scratch *scratch, const void **out, cudaStream_t s);

/* MoE routing on the device as gt says (backend.h's st_moe_gating: softmax
 * or sigmoid, selection bias in device memory, groups, renormalisation,
 * scale; route.cuh), top-k with ties to the lower id. sel/wsel:
 * [n_tok][k]; xrow (optional): [n_tok][k], the token of each pair. */
void cuda_moe_route(const float *logits, int n_tok, int n_expert, int k, const st_moe_gating *gt, int32_t *sel,
                    float *wsel, int32_t *xrow, cudaStream_t s);
/* dst[r][0:width] = src[r][0:width], rows dst_stride and src_stride floats
 * apart (backend.h's copy_2d: multi-head latent attention's head slices; mla.cu). */
void cuda_copy_2d(float *dst, int64_t dst_stride, const float *src, int64_t src_stride, int64_t width, int n_rows,
                  cudaStream_t s);
/* Attention over a latent row (mla.cu: one KV head wider than 256 that the
 * query heads share, deepseek2's 576): the slice partials of cuda_attention
 * (part [n_tok][n_head][n_split][2 + hd]) for its combine kernel, slices of
 * whole tiles of cuda_attn_latent_tile() positions. */
#define CUDA_ATT_LATENT_HEADS 8 /* query heads per block */
int cuda_attn_latent_fits(int n_head, const st_kv_layer *kv);
int cuda_attn_latent_tile(void);
void cuda_attn_latent(const float *q, const st_kv_layer *kv, int n_tok, int pos0, const int *dpos, int n_head,
                      float scale, int window, int n_split, float *part, cudaStream_t s);
/* A prompt chunk's causal attention over a latent row as two GEMMs on
 * tensor cores (mla_prompt.cu), no window: out [n_tok][n_head][hd] in full.
 * 0 done; 1 not taken (no BLAS or cuBLAS refused, a span too long for its
 * tiles): the caller runs the latent kernel. */
int cuda_attn_latent_gemm(const float *q, const st_kv_layer *kv, int n_tok, int pos0, int n_head, float scale,
                          float *out, cuda_scratch *scratch, cudaStream_t s);
/* ids[p] = p % n_mat for p < n (mla.cu): matmul's ST_MAT_ALL pairs. */
void cuda_heads_ids(int32_t *ids, int n, int n_mat, cudaStream_t s);
/* out[tok[i]] += tw[i] * y[i] for i < n (rows of dim); the token list and
 * weights are device arrays. */
void cuda_scatter_add(float *out, const float *y, const int32_t *tok, const float *tw, int n, int64_t dim,
                      cudaStream_t s);
/* The pairs' matrices where they live: ids[p] = emap[sel[p]] (an expert's
 * cache slot, or -1: computed elsewhere), or sel[p] with emap NULL; xrow
 * (optional) [n_tok*k]: the token of each pair. */
void cuda_moe_remap(const int32_t *sel, const int32_t *emap, int32_t *ids, int32_t *xrow, int n_tok, int k,
                    cudaStream_t s);
/* out[t] = sum_j wsel[t*k+j] * y[t*k+j] (rows of dim). */
void cuda_moe_combine(float *out, const float *y, const float *wsel, int n_tok, int k, int64_t dim, cudaStream_t s);
/* The experts' biases (gpt-oss, st_weight.bias) on the pairs' product rows
 * (moe_bias.cu): y[p] += bias[eid[p]] (rows of dim, bias [n_expert][dim]) for
 * each of the n pairs whose eid[p] >= 0 and, with live given, live[p] >= 0
 * (a pair computed elsewhere keeps its zeros); eid, live: device arrays. */
void cuda_moe_bias_add(float *y, const float *bias, const int32_t *eid, const int32_t *live, int n, int64_t dim,
                       cudaStream_t s);
/* dst[i] = src[tok[i]] (rows of dim). */
void cuda_gather_rows(float *dst, const float *src, const int32_t *tok, int n, int64_t dim, cudaStream_t s);

#endif
