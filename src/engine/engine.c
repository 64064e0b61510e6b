/* Engine: model + tokenizer + backend shared by sequences (engine.h): opening,
 * sequences, prompt reading and the batched decode step. Generation is in
 * engine_gen.c. */
#include "engine/engine.h"

#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend_prof.h"
#include "core/alloc.h"
#include "core/log.h"
#include "core/threadpool.h"
#include "core/switches.h"
#include "core/timer.h"
#include "engine/engine_offload.h"
#include "engine/engine_place.h"
#include "engine/split.h"
#include "engine/split_local.h"
#ifdef STRATA_HAVE_GPU
#include "backend/cuda/backend_cuda.h"
#endif

engine_params engine_defaults(void) {
    engine_params p = {0};
    p.kv_type = ST_KV_F16;
    p.gpu = -1;
    p.expert_cache = -1;
    p.pcie_frac = -1;
    p.adapt_every = 1;
    return p;
}

/* engine.h's union: the named fields are the sequence's, member for member */
_Static_assert(offsetof(engine, kv) == offsetof(engine, seq.kv) &&
                   offsetof(engine, n_past) == offsetof(engine, seq.n_past) &&
                   offsetof(engine, hist) == offsetof(engine, seq.hist) &&
                   offsetof(engine, logits) == offsetof(engine, seq.logits),
               "engine's sequence fields must alias e->seq");

static void seq_init(engine *e, engine_seq *s) {
    const model *m = e->m;
    s->kv = kv_cache_create_range(e->be, &m->hp, e->n_ctx, e->kv_type, e->il0, e->il1);
    s->id = e->next_seq_id++;
    s->n_past = 0;
    s->hist = st_malloc((size_t)e->n_ctx * sizeof(int32_t));
    s->logits = st_malloc((size_t)m->hp.n_vocab * sizeof(float));
    if (e->mtp) { /* the MTP block's cache rows, and the hidden states it reads (engine_mtp.c) */
        kv_cache_add_mtp_layer(s->kv, &m->hp);
        s->mtp_hbuf = st_calloc((size_t)(e->n_ctx + 1) * m->hp.n_embd, sizeof(float));
    }
}

/* A batched step's rows of s (m of them, from s->n_past, before n_past moves): their final hidden
 * states into s's record, if the record holds every position before them. */
static void seq_keep_hidden(engine *e, engine_seq *s, const float *rows, int m) {
    if (!s->mtp_hbuf || s->h_pos != s->n_past) return;
    const size_t E = (size_t)e->m->hp.n_embd;
    memcpy(s->mtp_hbuf + (size_t)(s->n_past + 1) * E, rows, (size_t)m * E * sizeof(float));
    s->h_pos = s->n_past + m;
}

/* Positions from n_past on are forgotten: so are their hidden states and MTP rows. */
static void seq_mtp_clamp(engine_seq *s) {
    if (s->h_pos > s->n_past) s->h_pos = s->n_past;
    if (s->mtp_pos > s->n_past) s->mtp_pos = s->n_past;
}

static void seq_fini(engine *e, engine_seq *s) {
    split_send_free(e->net, s->id);
    kv_cache_free(s->kv);
    st_free(s->hist);
    st_free(s->logits);
    st_free(s->mtp_hbuf);
}

static int split_engine(engine *e, const engine_params *p);
static int split_range(model *m, const engine_params *p, const split_net *net, int *il0, int *il1);
static engine *engine_open_rank(const engine_params *p);

int engine_backend_supports(const model *m, const st_backend *be) {
    /* a hybrid family needs the DeltaNet and gate ops, which not every backend has (a wrapper may lack them) */
    if (m->hp.full_attn_interval && (!be->gated_delta_net || !be->split_halves || !be->sigmoid_mul)) {
        st_error_set("architecture '%s' needs the gated DeltaNet ops, which the %s backend lacks; run it on the CPU "
                     "(without --gpu)",
                     model_arch_name(m->hp.arch), be->name);
        return -1;
    }
    /* deepseek2's latent attention gathers heads with copy_2d, which is optional in the op table */
    if (model_layer_mla(&m->hp) && !be->copy_2d) {
        st_error_set("architecture '%s' (multi-head latent attention) is not supported by the %s backend yet; "
                     "run it on the CPU (without --gpu)",
                     model_arch_name(m->hp.arch), be->name);
        return -1;
    }
    /* glm4moe and deepseek2 route by sigmoid with a selection bias and a scale (deepseek2 by groups too):
     * not every backend's routing does */
    const model_hparams *hp = &m->hp;
    const int plain = hp->gate_fn == ST_GATE_SOFTMAX && !hp->exp_bias && hp->expert_scale == 1.0f && !hp->n_group;
    if (hp->n_expert && !(be->moe_gatings & (plain ? ST_GATINGS_SOFTMAX : ST_GATINGS_ALL))) {
        st_error_set("architecture '%s' routes its experts by %s with a selection bias, which the %s backend's "
                     "routing lacks; run it on the CPU (without --gpu)",
                     model_arch_name(m->hp.arch), m->hp.gate_fn == ST_GATE_SIGMOID ? "sigmoid" : "softmax", be->name);
        return -1;
    }
    /* gpt-oss: attention sinks, biased experts and the clamped SwiGLU (the CPU and CUDA backends have them) */
    if ((hp->attn_sinks && !be->attention_sinks) ||
        ((hp->exps_bias || hp->act == ST_ACT_SWIGLU_OAI) && !(be->moe_gatings & ST_GATINGS_OAI))) {
        st_error_set("architecture '%s' needs attention sinks, per-expert biases and the clamped SwiGLU, which "
                     "the %s backend lacks; run it on the CPU (without --gpu)",
                     model_arch_name(hp->arch), be->name);
        return -1;
    }
    return 0;
}

/* --devices LIST: rank 0's device is the list's first, and the CPU ranks
 * share the cores this process may use unless --threads says. */
engine *engine_open(const engine_params *p) {
    if (!p->devices || p->split_net) return engine_open_rank(p);
    int devs[SPLIT_MAX_DEVICES];
    const int n = split_parse_devices(p->devices, devs, SPLIT_MAX_DEVICES);
    if (n < 0) return NULL;
    if (n > 1 && split_size() > 1) {
        st_error_set("--devices %s inside an MPI job: split the layers one way (ranks or devices), not both",
                     p->devices);
        return NULL;
    }
    engine_params q = *p;
    q.gpu = devs[0];
    int n_cpu = 0;
    for (int r = 0; r < n; r++) n_cpu += devs[r] < 0;
    if (!q.n_threads && n_cpu > 1) q.n_threads = split_rank_threads(n_cpu);
    if (n == 1) q.devices = NULL;
    return engine_open_rank(&q);
}

/* The CPU computes from the file's mapping: its pages mapped in at start
 * (gguf_populate) while those still to read fit in the RAM available, less
 * a margin for the KV cache and scratch. */
static void populate_mapping(const model *m) {
    const char *sw = st_switch_get("STRATA_POPULATE");
    if (sw && !strcmp(sw, "0")) return;
    size_t avail, total, to_read;
    st_meminfo(&avail, &total);
    const size_t margin = (size_t)1 << 30, room = avail > margin ? avail - margin : 0;
    const double t0 = st_now_s();
    const int rc = gguf_populate(m->file, room, &to_read);
    const double dt = st_now_s() - t0;
    if (rc == 0) /* said when it took a while (a large file); a small one's first line stays its own */
        st_log(dt >= 0.5 ? ST_LOG_INFO : ST_LOG_DEBUG,
               "mapped the model file in at start: %.2f GiB (%.2f GiB read from the file) in %.2f s",
               (double)gguf_file_size(m->file) / (1 << 30), (double)to_read / (1 << 30), dt);
    else if (rc == 1)
        ST_INFO("the model file's pages fault in as they are read: %.2f GiB still to read, %.2f GiB of RAM available",
                (double)to_read / (1 << 30), (double)avail / (1 << 30));
    else ST_WARN("%s; pages fault in as they are read", st_error_get());
}

static engine *engine_open_rank(const engine_params *p) {
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
    /* a layer split: this rank's layers chosen and the others unbound before anything is placed */
    split_net *net = p->split_net ? p->split_net : split_process_net();
    int il0 = 0, il1 = m->hp.n_layer;
    if (net || p->devices) {
        /* --draft mtp: refused before the plan counts the block and anything is placed */
        if (p->draft_mtp) st_error_set("--draft mtp needs the model on one backend (not a layer split across devices)");
        if (p->draft_mtp || split_range(m, p, net, &il0, &il1) != 0) {
            tokenizer_free(tok);
            model_free(m);
            return NULL;
        }
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
    if (engine_backend_supports(m, be) != 0) {
        be->destroy(be);
        tokenizer_free(tok);
        model_free(m);
        return NULL;
    }
    /* STRATA_PROFILE=1: every op timed, the table logged at engine_close (backend_prof.h) */
    const char *prof = st_switch_get("STRATA_PROFILE");
    if (prof && !strcmp(prof, "1")) be = backend_prof_wrap(be);
    engine *e = st_calloc(1, sizeof *e);
    e->m = m;
    e->tok = tok;
    e->n_ubatch = p->n_ubatch > 0 ? p->n_ubatch : 512;
    /* the engine decides where weights live: on the GPU, or (MoE) by the memory plan */
    /* (the CPU alone with --ram-budget: the lanes serve the host tiers when the experts exceed it) */
    if (m->hp.n_expert && (p->gpu >= 0 || p->expert_cache >= 0 || p->ram_budget > 0)) {
        const int rc = engine_offload(p, m, n_ctx, &e->n_ubatch, &be, &e->placed);
        if (rc < 0) {
            be->destroy(be);
            tokenizer_free(tok);
            model_free(m);
            st_free(e);
            return NULL;
        }
        e->lanes = rc == 1;
    } else if (p->gpu >= 0) {
        e->placed = engine_place_model(m, be, 1, p->draft_mtp);
    }
    if (p->gpu < 0 && !e->lanes) populate_mapping(m); /* the CPU reads every weight from the mapping */
    /* --draft mtp: on one backend (a split is refused above), the block whole
     * on it (placed with the model, its experts too when the model's are in host memory) */
    if (p->draft_mtp && !m->mtp) {
        st_error_set("%s has no usable multi-token prediction block (blk.%d.nextn.* tensors): --draft mtp needs one "
                     "(--draft ngram drafts without)",
                     p->model_path, m->hp.n_layer);
        if (e->placed) engine_place_free(e->placed);
        be->destroy(be);
        tokenizer_free(tok);
        model_free(m);
        st_free(e);
        return NULL;
    }
    e->mtp = p->draft_mtp;
    if (e->mtp) {
        e->mtp_h = st_malloc((size_t)m->hp.n_embd * sizeof(float));
        e->mtp_logits = st_malloc((size_t)m->hp.n_vocab * sizeof(float));
    }
    e->be = be;
    e->mc = model_ctx_create(m, e->be, e->n_ubatch);
    if (e->mtp) model_ctx_add_mtp(e->mc);
    e->n_ctx = n_ctx;
    e->kv_type = p->kv_type;
    e->il0 = il0;
    e->il1 = il1;
    e->net = net;
    if ((e->net || p->devices) && split_engine(e, p) != 0) {
        engine_close(e);
        return NULL;
    }
    seq_init(e, &e->seq);
    if (e->net && e->net->rank > 0) {
        /* a follower: rank 0's steps until it says stop; then an MPI rank's process is
         * done, an in-process rank's thread returns (split.h, split_local.h) */
        split_local_ready(e->net, e->be);
        const int rc = split_follow(e);
        if (rc != 0) st_log(ST_LOG_ERROR, "rank %d: %s", e->net->rank, st_error_get());
        const int mpi = e->net == split_process_net();
        engine_close(e);
        if (!mpi) return NULL;
        split_finish();
        exit(rc != 0);
    }
    return e;
}

/* This rank's layers of a split (split.h), its tensors alone bound: under
 * mpirun, or in-process with --devices. Whole layers per rank on the CPU
 * backend (with the expert lanes too: a CPU playing the device), attention
 * caches only; what it does not cover is refused here, on every rank
 * alike, before anything is placed. */
static int split_range(model *m, const engine_params *p, const split_net *net, int *il0, int *il1) {
    int devs[SPLIT_MAX_DEVICES];
    const int n_ranks = net ? net->size : split_parse_devices(p->devices, devs, SPLIT_MAX_DEVICES);
    if (split_supported(&m->hp, n_ranks, p->ram_budget > 0) != 0) return -1;
    if (split_layer_range(m, p->layer_split, n_ranks, net ? net->rank : 0, il0, il1) != 0) return -1;
    model_keep_layers(m, *il0, *il1, *il0 == 0);
    return 0;
}

/* The split's ring for this rank's model context; rank 0 of an in-process
 * split starts the other ranks here, each opening its own engine. */
static int split_engine(engine *e, const engine_params *p) {
    const model *m = e->m;
    if (!e->net) {
        int devs[SPLIT_MAX_DEVICES];
        const int n = split_parse_devices(p->devices, devs, SPLIT_MAX_DEVICES);
        e->local = split_local_start(p, devs, n, &e->net);
        if (!e->local) return -1;
        split_local_ready(e->net, e->be); /* rank 0's backend into the table (its state is already 1) */
    }
    /* a GPU rank's step waits for the host at each hop (a copy out, a
     * blocking receive): nothing of it can be recorded as a graph */
    if (e->be->variant) (void)e->be->variant(e->be, ST_VARIANT_GRAPHS, 0);
    const int window = p->pipeline_windows > 1 ? (e->n_ubatch + p->pipeline_windows - 1) / p->pipeline_windows : 0;
    const model_split ms = {e->il0, e->il1,       e->il0 == 0,  e->il1 == m->hp.n_layer,
                            window, split_send_x, split_recv_x, e->net};
    model_ctx_set_split(e->mc, &ms);
    ST_INFO("rank %d of %d%s: layers %d..%d of %d%s", e->net->rank, e->net->size,
            e->local || p->split_net ? " (in-process)" : "", e->il0, e->il1 - 1, m->hp.n_layer,
            e->il0 == 0 ? ", embedding and output head" : "");
    return 0;
}

void engine_close(engine *e) {
    if (!e) return;
    if (e->seq.kv) seq_fini(e, &e->seq);
    split_send_stop(e->net); /* rank 0: the followers are done too */
    split_local_stop(e->local);
    model_ctx_free(e->mc);
    engine_place_free(e->placed);
    e->be->destroy(e->be);
    tokenizer_free(e->tok);
    model_free(e->m);
    st_free(e->batch_kv);
    st_free(e->batch_pos);
    st_free(e->batch_n);
    st_free(e->batch_ids);
    st_free(e->batch_picks);
    st_free(e->batch_tok);
    st_free(e->batch_logits);
    st_free(e->batch_hid);
    st_free(e->mtp_h);
    st_free(e->mtp_logits);
    st_free(e);
}

engine_seq *engine_seq_new(engine *e) {
    engine_seq *s = st_calloc(1, sizeof *s);
    seq_init(e, s);
    return s;
}

void engine_seq_free(engine *e, engine_seq *s) {
    if (!s) return;
    ST_ASSERT(s != &e->seq);
    seq_fini(e, s);
    st_free(s);
}

/* 0 when n more tokens fit in s and every id is in the vocabulary, else -1 with st_error. */
static int seq_check(const engine *e, const engine_seq *s, const int32_t *toks, int n) {
    if (s->n_past + n > e->n_ctx) {
        st_error_set("the prompt and output need %d tokens, beyond the context of %d tokens", s->n_past + n, e->n_ctx);
        return -1;
    }
    for (int i = 0; i < n; i++)
        if (toks[i] < 0 || toks[i] >= e->m->hp.n_vocab) {
            st_error_set("token id %d is outside the vocabulary (%d)", toks[i], e->m->hp.n_vocab);
            return -1;
        }
    return 0;
}

/* After a prompt chunk (more than one token) a recurrent cache saves its
 * state, so that a later prompt sharing this much can start from here
 * (engine_seq_reuse_prefix). */
static void seq_chunk_done(engine_seq *s, int n) {
    if (s->kv->recurrent && n > 1) kv_cache_checkpoint(s->kv, s->hist, s->n_past);
}

/* A verify pass left undecided (no engine_seq_truncate after it) is kept
 * whole before anything else touches the sequence. */
static void seq_settle(engine_seq *s) {
    if (s->kv->spec_pos >= 0) kv_cache_spec_keep(s->kv, s->n_past - s->kv->spec_pos);
}

/* Evaluate toks into s; logits: its last token's (every token's with all),
 * or NULL (a prompt chunk's KV only). all: a verify pass of drafted tokens,
 * which engine_seq_truncate may cut back: a recurrent cache records how, and
 * saves no checkpoint of a state that may be rolled back. */
static int seq_eval_to(engine *e, engine_seq *s, const int32_t *toks, int n, float *logits, int all) {
    if (n <= 0) return 0;
    if (seq_check(e, s, toks, n) != 0) return -1;
    seq_settle(s);
    if (all && n > 1) kv_cache_spec_begin(s->kv, s->n_past, n); /* the first token is always kept */
    /* --draft mtp: the rows' final hidden states, for the MTP block (while those before them are kept too) */
    float *hid = s->mtp_hbuf && s->h_pos == s->n_past ? s->mtp_hbuf + (size_t)(s->n_past + 1) * e->m->hp.n_embd : NULL;
    split_send_forward(e->net, s->id, s->n_past, n, all || hid);
    model_ctx_capture_hidden(e->mc, hid);
    model_forward(e->mc, s->kv->layers, toks, n, s->n_past, logits, all);
    model_ctx_capture_hidden(e->mc, NULL);
    memcpy(s->hist + s->n_past, toks, (size_t)n * sizeof(int32_t));
    s->n_past += n;
    if (hid) s->h_pos = s->n_past;
    if (!all) seq_chunk_done(s, n);
    return 0;
}

int engine_seq_eval(engine *e, engine_seq *s, const int32_t *toks, int n) {
    return seq_eval_to(e, s, toks, n, s->logits, 0);
}

/* The start of a one-token step that returns something other than s->logits
 * (engine_seq_eval_top_k, _draw); the caller records tok after its forward. */
static int seq_one(engine *e, engine_seq *s, int32_t *tok) {
    if (seq_check(e, s, tok, 1) != 0) return -1;
    seq_settle(s);
    split_send_forward(e->net, s->id, s->n_past, 1, 0);
    return 0;
}

int engine_seq_eval_top_k(engine *e, engine_seq *s, int32_t tok, int k, int32_t *ids, float *vals) {
    if (seq_one(e, s, &tok) != 0) return -1;
    const int rc = model_forward_top_k(e->mc, s->kv->layers, tok, s->n_past, k, ids, vals, s->logits);
    s->hist[s->n_past++] = tok;
    return rc;
}

int engine_seq_eval_draw(engine *e, engine_seq *s, int32_t tok, float inv_t, double u, int32_t *out) {
    if (seq_one(e, s, &tok) != 0) return -1;
    const int rc = model_forward_draw(e->mc, s->kv->layers, tok, s->n_past, inv_t, u, out, s->logits);
    s->hist[s->n_past++] = tok;
    return rc;
}

int engine_seq_eval_all(engine *e, engine_seq *s, const int32_t *toks, int n, float *logits) {
    return seq_eval_to(e, s, toks, n, logits, 1);
}

int engine_seq_embed(engine *e, engine_seq *s, const int32_t *toks, int n, engine_pool pool, float *out) {
    if (n <= 0) {
        st_error_set("nothing to embed");
        return -1;
    }
    if (seq_check(e, s, toks, n) != 0) return -1;
    const int d = e->m->hp.n_embd;
    float *h = pool == ENGINE_POOL_NONE ? NULL : st_malloc((size_t)e->n_ubatch * d * sizeof(float));
    double *sum = pool == ENGINE_POOL_MEAN ? st_calloc((size_t)d, sizeof(double)) : NULL;
    for (int done = 0; done < n;) {
        int m = n - done < e->n_ubatch ? n - done : e->n_ubatch;
        float *rows = h ? h : out + (size_t)done * d;       /* NONE: straight into place */
        split_send_forward(e->net, s->id, s->n_past, m, 1); /* every window's rows come back (forward.h) */
        model_forward_hidden(e->mc, s->kv->layers, toks + done, m, s->n_past, rows);
        memcpy(s->hist + s->n_past, toks + done, (size_t)m * sizeof(int32_t));
        s->n_past += m;
        seq_chunk_done(s, m);
        if (pool == ENGINE_POOL_MEAN) /* in double: a long input's sum keeps its small terms */
            for (int r = 0; r < m; r++)
                for (int j = 0; j < d; j++) sum[j] += rows[(size_t)r * d + j];
        else if (pool == ENGINE_POOL_FIRST && done == 0) memcpy(out, rows, (size_t)d * sizeof(float));
        else if (pool == ENGINE_POOL_LAST && done + m == n)
            memcpy(out, rows + (size_t)(m - 1) * d, (size_t)d * sizeof(float));
        done += m;
    }
    if (sum)
        for (int j = 0; j < d; j++) out[j] = (float)(sum[j] / n);
    st_free(sum);
    st_free(h);
    return 0;
}

void engine_seq_truncate(engine_seq *s, int n_past) {
    ST_ASSERT(n_past >= 0 && n_past <= s->n_past);
    if (n_past == s->n_past) { /* nothing to forget */
        seq_settle(s);
        return;
    }
    if (s->kv->recurrent) { /* only back into the last verify pass, whose record replays the kept part */
        ST_ASSERT(s->kv->spec_pos >= 0 && n_past >= s->kv->spec_pos);
        kv_cache_spec_keep(s->kv, n_past - s->kv->spec_pos);
    }
    s->n_past = n_past; /* the rows beyond are written again before attention reads them */
    seq_mtp_clamp(s);
}

int engine_drafts_ok(const engine *e) { return !e->seq.kv->recurrent || e->be->gated_delta_net_keep != NULL; }

static int seq_eval_nologits(engine *e, engine_seq *s, const int32_t *toks, int n) {
    return seq_eval_to(e, s, toks, n, NULL, 0);
}

int engine_seq_common_prefix(const engine_seq *s, const int32_t *toks, int n) {
    int k = 0;
    while (k < s->n_past && k < n && s->hist[k] == toks[k]) k++;
    return k;
}

int engine_seq_reuse_prefix(engine_seq *s, const int32_t *toks, int n) {
    seq_settle(s);
    int k = engine_seq_common_prefix(s, toks, n);
    if (k == n) k = n - 1; /* the last prompt token must be evaluated to get its logits */
    if (k < 0) k = 0;
    /* a recurrent state holds the whole history at n_past, not a row per
     * position: a prompt that extends that history reuses it; else the state
     * saved after the last prompt chunk, if the prompt extends that (and the
     * K/V rows before it are still those tokens', k covering it); else none */
    if (s->kv->recurrent && k != s->n_past) k = kv_cache_restore(s->kv, toks, n, k);
    s->n_past = k; /* positions past k are overwritten by the next eval */
    seq_mtp_clamp(s);
    return k;
}

int engine_seq_read_prompt(engine *e, engine_seq *s, const int32_t *prompt, int n) {
    if (n <= 0) {
        st_error_set("the prompt is empty");
        return -1;
    }
    if (n > e->n_ctx) {
        st_error_set("the prompt has %d tokens, beyond the context of %d tokens", n, e->n_ctx);
        return -1;
    }
    int reused = engine_seq_reuse_prefix(s, prompt, n);
    if (engine_seq_eval(e, s, prompt + reused, n - 1 - reused) != 0) return -1;
    if (engine_seq_eval(e, s, prompt + n - 1, 1) != 0) return -1;
    return reused;
}

/* engine_step and engine_step_drafts: the chunks' sequences read their
 * tokens (ch[c].n > 0), seqs[i] appends n_tok[i] tokens (NULL: one each),
 * stacked in toks; with n_tok its rows' logits are all kept in
 * e->batch_logits (after the chunks', when chunk_logits). picks (one token
 * each only; NULL: none) as engine_step says. */
static int step_rows(engine *e, const engine_chunk *ch, int n_ch, int chunk_logits, engine_seq *const *seqs,
                     const int32_t *toks, const int *n_tok, int n, model_pick *picks) {
    if (!n && n_ch <= 1)
        return n_ch ? (chunk_logits ? engine_seq_eval(e, ch[0].seq, ch[0].toks, ch[0].n)
                                    : seq_eval_nologits(e, ch[0].seq, ch[0].toks, ch[0].n))
                    : 0;
    int rows = 0, n_read = 0; /* the decoding sequences' rows, the chunks' */
    for (int c = 0; c < n_ch; c++) {
        if (ch[c].n < 1 || seq_check(e, ch[c].seq, ch[c].toks, ch[c].n) != 0) {
            if (ch[c].n < 1) st_error_set("a prompt chunk of the step has %d tokens", ch[c].n);
            return -1;
        }
        n_read += ch[c].n;
    }
    for (int i = 0; i < n; i++) {
        const int m = n_tok ? n_tok[i] : 1;
        if (m < 1 || seq_check(e, seqs[i], toks + rows, m) != 0) {
            if (m < 1) st_error_set("a sequence of the step has %d tokens", m);
            return -1;
        }
        rows += m;
    }
    if ((n_ch || rows > n) && n_read + rows > e->n_ubatch) { /* one token each may take several steps */
        st_error_set("prompt chunks of %d tokens and %d rows of %d sequences exceed the step's %d rows", n_read, rows,
                     n, e->n_ubatch);
        return -1;
    }
    for (int c = 0; c < n_ch; c++) seq_settle(ch[c].seq);
    for (int i = 0; i < n; i++) seq_settle(seqs[i]);
    if (!n_ch && !n_tok && n == 1 && !picks) return engine_seq_eval(e, seqs[0], toks, 1);
    size_t nv = (size_t)e->m->hp.n_vocab;
    int n_seq = n + n_ch, n_all = rows + n_read;
    /* the step's inputs and outputs, gathered: kept across calls, grown as needed */
    if (n_seq > e->batch_cap) {
        e->batch_cap = n_seq;
        e->batch_kv = st_realloc(e->batch_kv, (size_t)n_seq * sizeof *e->batch_kv);
        e->batch_pos = st_realloc(e->batch_pos, (size_t)n_seq * sizeof *e->batch_pos);
        e->batch_n = st_realloc(e->batch_n, (size_t)n_seq * sizeof *e->batch_n);
        e->batch_ids = st_realloc(e->batch_ids, (size_t)n_seq * sizeof *e->batch_ids);
        e->batch_picks = st_realloc(e->batch_picks, (size_t)n_seq * sizeof *e->batch_picks);
    }
    if (n_all > e->tok_cap) {
        e->tok_cap = n_all;
        e->batch_tok = st_realloc(e->batch_tok, (size_t)n_all * sizeof *e->batch_tok);
        e->batch_logits = st_realloc(e->batch_logits, (size_t)n_all * nv * sizeof(float));
        if (e->mtp) e->batch_hid = st_realloc(e->batch_hid, (size_t)n_all * e->m->hp.n_embd * sizeof(float));
    }
    for (int c = 0, r = 0; c < n_ch; r += ch[c].n, c++) { /* the chunks first: the logits rows of the others follow */
        e->batch_kv[c] = ch[c].seq->kv->layers;
        e->batch_pos[c] = ch[c].seq->n_past;
        e->batch_n[c] = ch[c].n;
        e->batch_ids[c] = ch[c].seq->id;
        memcpy(e->batch_tok + r, ch[c].toks, (size_t)ch[c].n * sizeof(int32_t));
    }
    for (int i = 0, k = n_ch; i < n; i++) {
        e->batch_kv[k + i] = seqs[i]->kv->layers;
        e->batch_pos[k + i] = seqs[i]->n_past;
        e->batch_n[k + i] = n_tok ? n_tok[i] : 1;
        e->batch_ids[k + i] = seqs[i]->id;
        if (e->batch_n[k + i] > 1) kv_cache_spec_begin(seqs[i]->kv, seqs[i]->n_past, e->batch_n[k + i]);
    }
    memcpy(e->batch_tok + n_read, toks, (size_t)rows * sizeof(int32_t));
    const int skip = chunk_logits ? 0 : n_ch, lead = chunk_logits ? n_ch : 0; /* the chunks' logits rows */
    model_pick *pk = NULL; /* one per row of logits: the chunks' (when they have them) pick nothing */
    if (picks) {
        pk = e->batch_picks;
        for (int c = 0; c < lead; c++) pk[c] = (model_pick){0};
        memcpy(pk + lead, picks, (size_t)n * sizeof *picks);
    }
    int *ns = n_ch || n_tok ? e->batch_n : NULL;
    split_send_batch(e->net, n_seq, e->batch_ids, e->batch_pos, ns, skip, n_tok != NULL);
    model_ctx_capture_hidden(e->mc, e->mtp ? e->batch_hid : NULL); /* --draft mtp: every row's hidden state */
    model_forward_batch(e->mc, e->batch_kv, e->batch_tok, e->batch_pos, ns, n_seq, skip, n_tok != NULL, e->batch_logits,
                        pk);
    model_ctx_capture_hidden(e->mc, NULL);
    if (e->mtp) { /* each sequence's rows into its own record, where the rows before them are kept */
        for (int i = 0, r = 0; i < n_seq; i++) {
            engine_seq *q = i < n_ch ? ch[i].seq : seqs[i - n_ch];
            const int m = e->batch_n[i];
            seq_keep_hidden(e, q, e->batch_hid + (size_t)r * e->m->hp.n_embd, m);
            r += m;
        }
    }
    const float *out = e->batch_logits;
    for (int c = 0; c < n_ch; c++) {
        engine_seq *q = ch[c].seq;
        if (chunk_logits) {
            memcpy(q->logits, out, nv * sizeof(float));
            out += nv;
        }
        memcpy(q->hist + q->n_past, ch[c].toks, (size_t)ch[c].n * sizeof(int32_t));
        q->n_past += ch[c].n;
        seq_chunk_done(q, ch[c].n);
    }
    for (int i = 0, r = 0; i < n; i++) {
        engine_seq *s = seqs[i];
        const int m = n_tok ? n_tok[i] : 1;
        if (pk) picks[i].rc = pk[lead + i].rc;
        if (!pk || picks[i].rc) memcpy(s->logits, out + (size_t)(r + m - 1) * nv, nv * sizeof(float));
        memcpy(s->hist + s->n_past, toks + r, (size_t)m * sizeof(int32_t));
        s->n_past += m;
        r += m;
    }
    return 0;
}

int engine_step(engine *e, const engine_chunk *chunks, int n_chunks, int chunk_logits, engine_seq *const *seqs,
                const int32_t *tok, int n, model_pick *picks) {
    return step_rows(e, chunks, n_chunks, chunk_logits, seqs, tok, NULL, n, picks);
}

int engine_step_drafts(engine *e, const engine_chunk *chunks, int n_chunks, engine_seq *const *seqs,
                       const int32_t *toks, const int *n_tok, int n, const float **logits) {
    const int rc = step_rows(e, chunks, n_chunks, 0, seqs, toks, n_tok, n, NULL);
    *logits = e->batch_logits;
    return rc;
}

int engine_decode_batch(engine *e, engine_seq *const *seqs, const int32_t *tok, int n) {
    return engine_step(e, NULL, 0, 0, seqs, tok, n, NULL);
}

int engine_eval(engine *e, const int32_t *toks, int n) { return engine_seq_eval(e, &e->seq, toks, n); }
int engine_read_prompt(engine *e, const int32_t *prompt, int n) {
    return engine_seq_read_prompt(e, &e->seq, prompt, n);
}

void gen_stats_format(const gen_stats *st, char *buf, size_t cap) {
    double pt = st->prompt_ms > 0 ? st->n_read / (st->prompt_ms / 1e3) : 0;
    double gt = st->gen_ms > 0 ? st->n_gen / (st->gen_ms / 1e3) : 0;
    snprintf(buf, cap,
             "prompt %d tokens = %d reused + %d read in %.1f ms (%.1f tok/s), %d generated in %.1f "
             "ms (%.1f tok/s), "
             "drafts accepted %d of %d",
             st->n_prompt, st->n_reused, st->n_read, st->prompt_ms, pt, st->n_gen, st->gen_ms, gt, st->drafts_accepted,
             st->drafts_total);
    const double pairs = (double)(st->pairs_dev + st->pairs_cpu + st->pairs_pcie);
    const size_t n = strlen(buf);
    if (st->lanes && pairs > 0 && n < cap)
        snprintf(buf + n, cap - n, ", experts %.1f%% GPU cache + %.1f%% CPU lane + %.1f%% PCIe",
                 100.0 * (double)st->pairs_dev / pairs, 100.0 * (double)st->pairs_cpu / pairs,
                 100.0 * (double)st->pairs_pcie / pairs);
    const size_t n2 = strlen(buf);
    const int toks = st->n_read + st->n_gen;
    if (st->bytes_ssd && toks > 0 && n2 < cap) /* the SSD tier: what it read per token, and how fast */
        snprintf(buf + n2, cap - n2, ", SSD tier %.2f MB/token read at %.2f GB/s", (double)st->bytes_ssd / toks / 1e6,
                 st->ns_ssd ? (double)st->bytes_ssd / (double)st->ns_ssd : 0.0);
}
