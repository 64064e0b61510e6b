/* The forward pass of every supported family, against the backend interface.
 * A model_ctx owns the activation buffers (on the backend's device) for up
 * to n_ubatch tokens; longer inputs are processed in chunks of that size.
 * model_forward runs one sequence; model_forward_batch one token of each of
 * several sequences (the server's continuous batching). */
#ifndef STRATA_MODEL_FORWARD_H
#define STRATA_MODEL_FORWARD_H

#include "model/model.h"

typedef struct model_ctx model_ctx;

model_ctx *model_ctx_create(const model *m, st_backend *be, int n_ubatch);
void model_ctx_free(model_ctx *c);

/* A layer split across processes (engine/split.h): this process runs layers
 * [il0, il1) of every step. The first process (ends set) embeds the tokens
 * and applies the output head; the residual stream (rows x n_embd floats,
 * host memory) goes round a ring: each process but the first receives it
 * before its layers and sends it on after them, and the first sends it after
 * its layers and receives it back from the last before the head. The other
 * processes ignore tokens and logits (they may be NULL). A range's last
 * layer ends with a plain residual add instead of the next layer's fused
 * norm, so no process reads a tensor of a layer it does not own. Called
 * once, before the first step; NULL split: the whole model (the default). */
typedef struct {
    int il0, il1;
    int ends;                                          /* embeds and applies the output head */
    int last;                                          /* the ring's last process: its next is the first */
    int window;                                        /* rows per pipelined prompt window; 0: n_ubatch */
    void (*send)(void *ctx, const float *x, size_t n); /* to the next process */
    void (*recv)(void *ctx, float *x, size_t n);       /* from the previous one */
    void *ctx;
} model_split;
void model_ctx_set_split(model_ctx *c, const model_split *s);
/* Pipelining: model_forward reads a prompt in windows of split.window rows
 * (n_ubatch without), and only the rows the first process needs come back
 * round the ring: the last window's, or every window's with all_logits or a
 * hidden-state capture. So the first process embeds window w + 1 and runs its
 * layers while the next works on window w. Every process must make the call
 * with the same n_tok and all_logits (split.h's commands carry both). */

/* Run n_tok tokens at positions pos0.. through the model, appending their K/V
 * to kv[0..n_layer-1]. logits (host memory) receives n_vocab floats for the
 * last token, or for every token ([n_tok][n_vocab]) when all_logits. */
void model_forward(model_ctx *c, st_kv_layer *kv, const int32_t *tokens, int n_tok, int pos0, float *logits,
                   int all_logits);

/* While dst (host) is set, model_forward (and model_forward_batch, rows in
 * its order) also writes every token's final hidden state (after the
 * output norm), [n_tok][n_embd], to dst: the MTP block's input (--draft
 * mtp). NULL stops it. */
void model_ctx_capture_hidden(model_ctx *c, float *dst);

/* The buffers model_forward_mtp needs (the block's input rows: n_ubatch x
 * 2 n_embd floats on c's backend), once; only an engine that drafts with
 * the block asks for them (engine_plan_input counts them then). */
void model_ctx_add_mtp(model_ctx *c);
/* The bytes model_ctx_add_mtp allocates for chunks of n_ubatch rows. */
size_t model_mtp_rows_bytes(const model_hparams *hp, int n_ubatch);

/* The multi-token prediction block (model.h model_mtp) over n (<= n_ubatch)
 * rows: row i pairs token toks[i] at position pos0 + i with h_in[i] (host,
 * [n][n_embd]: the final hidden state of the position before it), and
 * writes its K/V at pos0 + i into the block's cache layer, kv[n_layer]
 * (the row array needs n_layer + 1 layers). h_out (host, or NULL) receives
 * each row's output after the head norm (the next step's h), logits (host,
 * or NULL: no head product) each row's logits ([n][n_vocab]), a guess at the
 * token of position pos0 + i + 1. */
void model_forward_mtp(model_ctx *c, st_kv_layer *kv, const int32_t *toks, const float *h_in, int n, int pos0,
                       float *h_out, float *logits);

/* n_tok (<= n_ubatch) tokens at positions pos0.. as model_forward, stopping at the output norm:
 * hidden (host) receives every token's final hidden state, [n_tok][n_embd] (embeddings). */
void model_forward_hidden(model_ctx *c, st_kv_layer *kv, const int32_t *tokens, int n_tok, int pos0, float *hidden);

/* One token at pos; instead of every logit, the k largest with their ids
 * (backend.h top_k, on the device: a decode step copies k pairs, not the
 * vocabulary). 0; or 1 when the backend could not (no top_k, or k or the
 * vocabulary beyond it): the whole logits are in `logits` (host) then. */
int model_forward_top_k(model_ctx *c, st_kv_layer *kv, int32_t token, int pos, int k, int32_t *ids, float *vals,
                        float *logits);

/* One token at pos; instead of every logit, the draw of a temperature-only
 * sampler made by the backend (backend.h draw: inv_t, uniform u) into *tok.
 * 0; or 1 when the backend could not (no draw, a NaN logit): the whole
 * logits are in `logits` (host) then. */
int model_forward_draw(model_ctx *c, st_kv_layer *kv, int32_t token, int pos, float inv_t, double u, int32_t *tok,
                       float *logits);

/* What a step keeps of a row of logits on the backend (model_forward_batch's
 * picks): with k > 0 the k largest and their ids (backend.h top_k) into ids
 * and vals, else with inv_t > 0 the backend's draw with uniform u (backend.h
 * draw) into *tok; rc 0 then, and the row stays on the backend. rc 1 when
 * the backend could not (no such op, a NaN logit) or nothing was asked: the
 * row's logits came to the host as they would without picks. */
typedef struct {
    int k;
    float inv_t;
    double u;
    int32_t *ids; /* (k) */
    float *vals;  /* (k) */
    int32_t *tok;
    int rc; /* out */
} model_pick;

/* One step of n_seq sequences, stacked as rows so that norms, matrix
 * products and the FFN read the weights once for all of them: sequence s
 * reads n_tok[s] tokens (NULL: one each) from tok (stacked in order) at
 * positions pos[s].. and appends their K/V to its own cache kv[s][0..n_layer-1];
 * the rotary embedding, cache write and attention run per sequence. logits
 * (host) receives the last token's logits of sequences [skip, n_seq),
 * [n_seq - skip][n_vocab] (the first skip sequences are prompt chunks whose
 * logits are not needed), or with all every token's of them, in row order
 * (speculative decoding: a sequence's pending token and its drafts). One
 * token each: more sequences than n_ubatch run in several steps; with longer
 * sequences the rows must fit n_ubatch. picks (NULL: none; not with all)
 * holds one model_pick per row of logits: a row picked on the backend is
 * not copied (its place in logits is left as it was). */
void model_forward_batch(model_ctx *c, st_kv_layer *const *kv, const int32_t *tok, const int *pos, const int *n_tok,
                         int n_seq, int skip, int all, float *logits, model_pick *picks);

#endif
