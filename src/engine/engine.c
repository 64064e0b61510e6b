/* Engine: model + tokenizer + backend + KV cache of one sequence (engine.h). */
#include "engine/engine.h"

#include <stdio.h>
#include <string.h>

#include "core/alloc.h"
#include "core/log.h"
#include "core/timer.h"
#include "engine/engine_place.h"
#ifdef STRATA_HAVE_GPU
#include "backend/cuda/backend_cuda.h"
#endif

engine_params engine_defaults(void) {
    engine_params p = {0};
    p.kv_type = ST_KV_F16;
    p.gpu = -1;
    return p;
}

engine *engine_open(const engine_params *p) {
    model *m = model_load(p->model_path);
    if (!m) return NULL;
    tokenizer *tok = tokenizer_load(m->file);
    if (!tok) {
        model_free(m);
        return NULL;
    }
    int n_ctx = p->n_ctx > 0 ? p->n_ctx : (m->hp.n_ctx_train < 4096 ? m->hp.n_ctx_train : 4096);
    if (n_ctx > m->hp.n_ctx_train) {
        st_error_set("context %d is beyond the model's trained context of %d tokens", n_ctx, m->hp.n_ctx_train);
        tokenizer_free(tok);
        model_free(m);
        return NULL;
    }
    st_backend *be = NULL;
    if (p->gpu < 0) {
        be = backend_cpu_create(p->n_threads);
    } else {
#ifdef STRATA_HAVE_GPU
        be = backend_cuda_create(p->gpu); /* NULL: one line naming the card and the build's architectures */
#else
        st_error_set("--gpu %d: this build has no GPU backend (configure with -DSTRATA_CUDA=ON)", p->gpu);
#endif
        if (!be) {
            tokenizer_free(tok);
            model_free(m);
            return NULL;
        }
    }
    engine *e = st_calloc(1, sizeof *e);
    e->m = m;
    e->tok = tok;
    e->be = be;
    if (p->gpu >= 0) e->placed = engine_place_model(m, be); /* the engine decides where weights live */
    e->mc = model_ctx_create(m, e->be, p->n_ubatch > 0 ? p->n_ubatch : 512);
    e->kv = kv_cache_create(e->be, &m->hp, n_ctx, p->kv_type);
    e->n_ctx = n_ctx;
    e->hist = st_malloc((size_t)n_ctx * sizeof(int32_t));
    e->logits = st_malloc((size_t)m->hp.n_vocab * sizeof(float));
    return e;
}

void engine_close(engine *e) {
    if (!e) return;
    kv_cache_free(e->kv);
    model_ctx_free(e->mc);
    engine_place_free(e->placed);
    e->be->destroy(e->be);
    tokenizer_free(e->tok);
    model_free(e->m);
    st_free(e->hist);
    st_free(e->logits);
    st_free(e);
}

int engine_eval(engine *e, const int32_t *toks, int n) {
    if (n <= 0) return 0;
    if (e->n_past + n > e->n_ctx) {
        st_error_set("the prompt and output need %d tokens, beyond the context of %d tokens", e->n_past + n,
                     e->n_ctx);
        return -1;
    }
    for (int i = 0; i < n; i++)
        if (toks[i] < 0 || toks[i] >= e->m->hp.n_vocab) {
            st_error_set("token id %d is outside the vocabulary (%d)", toks[i], e->m->hp.n_vocab);
            return -1;
        }
    model_forward(e->mc, e->kv->layers, toks, n, e->n_past, e->logits, 0);
    memcpy(e->hist + e->n_past, toks, (size_t)n * sizeof(int32_t));
    e->n_past += n;
    return 0;
}

int engine_reuse_prefix(engine *e, const int32_t *toks, int n) {
    int k = 0;
    while (k < e->n_past && k < n && e->hist[k] == toks[k]) k++;
    if (k == n) k = n - 1; /* the last prompt token must be evaluated to get its logits */
    if (k < 0) k = 0;
    e->n_past = k;         /* positions past k are overwritten by the next eval */
    return k;
}

int engine_read_prompt(engine *e, const int32_t *prompt, int n) {
    if (n <= 0) {
        st_error_set("the prompt is empty");
        return -1;
    }
    if (n > e->n_ctx) {
        st_error_set("the prompt has %d tokens, beyond the context of %d tokens", n, e->n_ctx);
        return -1;
    }
    int reused = engine_reuse_prefix(e, prompt, n);
    if (engine_eval(e, prompt + reused, n - 1 - reused) != 0) return -1;
    if (engine_eval(e, prompt + n - 1, 1) != 0) return -1;
    return reused;
}

/* Length of the longest suffix of s[0..n) that is a proper prefix of a stop string. */
static size_t partial_stop(const char *s, size_t n, const gen_params *gp) {
    size_t best = 0;
    for (int i = 0; i < gp->n_stop; i++) {
        size_t L = strlen(gp->stop[i]);
        for (size_t k = L > n ? n : L - 1; k > best; k--)
            if (!memcmp(s + n - k, gp->stop[i], k)) {
                best = k;
                break;
            }
    }
    return best;
}

int engine_generate(engine *e, sampler *s, const int32_t *prompt, int n_prompt, const gen_params *gp,
                    gen_text_fn fn, void *ctx, gen_stats *st) {
    memset(st, 0, sizeof *st);
    st->finish = "error";
    st->stop_index = -1;
    if (n_prompt <= 0) {
        st_error_set("the prompt is empty");
        return -1;
    }
    if (n_prompt >= e->n_ctx) {
        st_error_set("the prompt has %d tokens, beyond the context of %d tokens", n_prompt, e->n_ctx);
        return -1;
    }
    int64_t t0 = st_now_ns();
    int reused = engine_read_prompt(e, prompt, n_prompt);
    if (reused < 0) return -1;
    st->n_prompt = n_prompt;
    st->n_reused = reused;
    st->n_read = n_prompt - reused;
    st->prompt_ms = (double)(st_now_ns() - t0) / 1e6;
    sampler_reset(s);
    for (int i = 0; i < n_prompt; i++) sampler_accept(s, prompt[i]);

    tok_stream *ts = tok_stream_new(e->tok, 0);
    size_t cap = 4096, len = 0;
    char *pending = st_malloc(cap); /* text not yet released: may begin a stop string */
    int64_t t1 = st_now_ns();
    st->finish = "length";
    int max = gp->max_tokens > 0 ? gp->max_tokens : e->n_ctx;
    for (int i = 0; i < max; i++) {
        int32_t t = sampler_sample(s, e->logits);
        if (!gp->ignore_eos && tokenizer_is_eog(e->tok, t)) {
            st->finish = "stop";
            break;
        }
        sampler_accept(s, t);
        st->n_gen++;
        const char *piece;
        size_t plen;
        tok_stream_push(ts, t, &piece, &plen);
        if (len + plen + 1 > cap) {
            cap = (len + plen + 1) * 2;
            pending = st_realloc(pending, cap);
        }
        memcpy(pending + len, piece, plen);
        len += plen;
        /* a complete stop string ends generation; text before it is released */
        int stopped = 0;
        for (int k = 0; k < gp->n_stop && !stopped; k++) {
            pending[len] = 0;
            char *hit = strstr(pending, gp->stop[k]);
            if (hit) {
                len = (size_t)(hit - pending);
                stopped = 1;
                st->stop_index = k;
            }
        }
        size_t keep = stopped ? 0 : partial_stop(pending, len, gp);
        int cancel = 0;
        if (len - keep > 0) cancel = fn(ctx, pending, len - keep);
        memmove(pending, pending + len - keep, keep);
        len = keep;
        if (stopped) {
            st->finish = "stop";
            break;
        }
        if (cancel || i + 1 == max) break;
        if (e->n_past >= e->n_ctx) break; /* context full: "length" */
        if (engine_eval(e, &t, 1) != 0) break;
    }
    if (len) fn(ctx, pending, len);
    /* bytes still held back are an incomplete UTF-8 character cut off by the
     * end of generation: dropped, never sent as U+FFFD */
    tok_stream_free(ts);
    st_free(pending);
    st->gen_ms = (double)(st_now_ns() - t1) / 1e6;
    return 0;
}

void gen_stats_format(const gen_stats *st, char *buf, size_t cap) {
    double pt = st->prompt_ms > 0 ? st->n_read / (st->prompt_ms / 1e3) : 0;
    double gt = st->gen_ms > 0 ? st->n_gen / (st->gen_ms / 1e3) : 0;
    snprintf(buf, cap,
             "prompt %d tokens = %d reused + %d read in %.1f ms (%.1f tok/s), %d generated in %.1f ms (%.1f tok/s), "
             "drafts accepted %d of %d",
             st->n_prompt, st->n_reused, st->n_read, st->prompt_ms, pt, st->n_gen, st->gen_ms, gt,
             st->drafts_accepted, st->drafts_total);
}
