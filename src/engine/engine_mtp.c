/* Drafts from the model's multi-token prediction block (engine.h
 * engine_seq_draft_mtp; --draft mtp; docs/speculative.md).
 *
 * Qwen3.5's MTP head (model.h model_mtp) is one more decoder block that,
 * at position p, reads the token of p and the final hidden state of p - 1
 * and guesses the token of p + 1. Its attention has cache rows of its own
 * (kv->layers[n_layer]), one per position, so it must have read every
 * position of the sequence before it guesses: each evaluation of the main
 * model keeps its rows' final hidden states (model_ctx_capture_hidden, into
 * s->mtp_hbuf), and the block reads them lazily, when the next draft is
 * asked for, a chunk at a time. That also keeps its cache consistent with
 * rejected drafts without any undo: a rejection truncates the sequence,
 * which lowers h_pos and mtp_pos (engine.c seq_mtp_clamp), and the rows
 * past them are written again before anything reads them (attention at p
 * reads the rows up to p only).
 *
 * A draft of k tokens is then k one-row steps of the block with the head
 * product: the pending token t at n_past with the hidden state of
 * n_past - 1, then each guess with the block's own output (after its head
 * norm) as the next h, as llama.cpp chains it. The guess is the greedy
 * token of the block's logits plus the request's logit bias. */
#include <string.h>

#include "core/log.h"
#include "engine/engine.h"

/* The block's cache rows brought up to position `to` (rows [mtp_pos, to) read). 0, or -1 when the hidden
 * states of the positions before them are not kept (an evaluation that does not record them). */
static int catch_up(engine *e, engine_seq *s, int to) {
    const size_t E = (size_t)e->m->hp.n_embd;
    if (to > s->n_past || s->h_pos < to - 1) return -1;
    while (s->mtp_pos < to) {
        const int p = s->mtp_pos, n = to - p < e->n_ubatch ? to - p : e->n_ubatch;
        /* row p reads the hidden state of p - 1: mtp_hbuf's row p (its row 0 is zeros, for position 0) */
        model_forward_mtp(e->mc, s->kv->layers, s->hist + p, s->mtp_hbuf + (size_t)p * E, n, p, NULL, NULL);
        s->mtp_pos = p + n;
    }
    return 0;
}

static int32_t argmax(const float *x, int n) {
    int32_t best = 0;
    for (int i = 1; i < n; i++)
        if (x[i] > x[best]) best = i; /* a tie: the lower id */
    return best;
}

int engine_seq_draft_mtp(engine *e, engine_seq *s, int32_t t, int k, const sampler *bias, int32_t *out) {
    const int base = s->n_past, nv = e->m->hp.n_vocab;
    /* the first step reads the hidden state of base - 1: kept only if every evaluation up to base kept its own */
    if (!e->mtp || k <= 0 || base + k > e->n_ctx || s->h_pos < base || catch_up(e, s, base) != 0) return 0;
    const float *h = s->mtp_hbuf + (size_t)base * e->m->hp.n_embd; /* position base - 1's */
    int32_t tok = t;
    for (int i = 0; i < k; i++) {
        /* writes the block's row base + i, past mtp_pos: the next catch_up writes it again */
        model_forward_mtp(e->mc, s->kv->layers, &tok, h, 1, base + i, e->mtp_h, e->mtp_logits);
        if (bias) sampler_add_bias(bias, e->mtp_logits);
        tok = argmax(e->mtp_logits, nv);
        out[i] = tok;
        h = e->mtp_h;
    }
    return k;
}

int engine_seq_mtp_logits(engine *e, engine_seq *s, int pos0, int n, float *logits) {
    const size_t E = (size_t)e->m->hp.n_embd, nv = (size_t)e->m->hp.n_vocab;
    if (!e->mtp || pos0 < 0 || n <= 0 || pos0 + n > s->n_past || s->h_pos < pos0 + n - 1) {
        st_error_set("the MTP block's logits of positions %d..%d: the sequence keeps hidden states of %d of its %d",
                     pos0, pos0 + n - 1, s->h_pos, s->n_past);
        return -1;
    }
    if (s->mtp_pos > pos0) s->mtp_pos = pos0;
    if (catch_up(e, s, pos0) != 0) return -1;
    for (int done = 0; done < n;) {
        const int p = pos0 + done, m = n - done < e->n_ubatch ? n - done : e->n_ubatch;
        model_forward_mtp(e->mc, s->kv->layers, s->hist + p, s->mtp_hbuf + (size_t)p * E, m, p, NULL,
                          logits + (size_t)done * nv);
        s->mtp_pos = p + m;
        done += m;
    }
    return 0;
}
