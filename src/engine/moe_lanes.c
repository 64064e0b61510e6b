/* The expert lanes (moe_lanes.h).
 *
 * The lanes backend is a copy of the device backend's op table (the same
 * ctx, so every op it does not override is the device's own, called
 * directly) inside a larger struct that holds the placement: per layer, the
 * device slots of its cached experts (one slab per matrix, slot s at
 * s * matrix bytes) and the maps from expert id to slot, on the host and
 * on the device.
 *
 * A layer call (moe_ffn):
 *   1. the device routes; sel and wsel come to the host (k ints and floats
 *      per token: the one wait of the call);
 *   2. the uncached experts the tokens chose are split between the CPU lane
 *      and the PCIe lane (lane_split); the CPU lane's products start at
 *      once on the lanes' worker thread (the caller of the CPU backend's
 *      pool), from the hidden rows read with the routing;
 *   3. meanwhile this thread queues the device's part: the cached pairs into
 *      out, and the PCIe lane's experts uploaded into the staging slab (their
 *      own positions: staging slot = expert id) and computed there;
 *   4. the CPU lane's output, once done, is copied up and added to out.
 * One-token steps are recorded in segments (the device's st_step_segments):
 * the ops between two layers' host parts replay as one graph (l_run_step).
 */
#include "engine/moe_lanes.h"

#include <string.h>
#include <unistd.h>

#include "core/alloc.h"
#include "core/log.h"
#include "core/switches.h"
#include "core/timer.h"
#include "core/worker.h"
#include "engine/expert_store.h"

typedef struct {
    const void *host_gate; /* the layer's host gate tensor: how moe_ffn finds its layer */
    int n_slots;
    st_weight g, u, d;          /* the device slabs as weights of n_slots matrices (n_mat 0: no slots) */
    int32_t *slot;              /* (n_expert) host: slot or -1 */
    int32_t *d_slot;            /* (n_expert) the same on the device */
    size_t mat_g, mat_u, mat_d; /* bytes of one expert's matrix (types may differ between layers) */
} lane_layer;

/* The CPU lane's products of one layer call, run on the lanes' worker thread. */
typedef struct {
    st_backend *cpu;
    const float *x;
    int n_tok, n_expert, k;
    const int32_t *sel;
    const float *wsel;
    const int32_t *map;
    st_act act;
    const st_weight *gate, *up, *down;
    float *out;
    int64_t ns; /* how long it took */
} cpu_job;

static void cpu_job_run(void *p) {
    cpu_job *j = p;
    const int64_t t0 = st_now_ns();
    j->cpu->moe_experts(j->cpu, j->x, j->n_tok, j->n_expert, j->k, j->sel, j->wsel, j->map, j->act, j->gate, j->up,
                        j->down, j->out);
    j->ns = st_now_ns() - t0;
}

typedef struct {
    st_backend be;              /* first: the device's op table (its ctx too), with a few ops replaced */
    st_backend *dev_orig, *cpu; /* the device backend as created; the CPU lane */
    st_worker *worker;          /* the thread that calls the CPU lane (its pool's caller) */
    cpu_job job;
    const void *pinned; /* host_register'ed experts, or NULL */
    int gather;         /* the PCIe lane's copies of a layer as one upload_many (STRATA_LANE_GATHER) */
    void **g_dst;       /* that upload's ranges, g_n of them (room for 3 per expert) */
    const void **g_src;
    size_t *g_bytes;
    int g_n;
    const model *m;
    lane_rates rates;
    int n_layer, n_expert, k, n_rows, last;
    int first_routed; /* the first layer not wholly cached: its calls count the steps */
    int64_t E, F;
    lane_layer *layer;
    /* staging: one layer's experts, expert e's matrices at position e, sized
     * for the largest layer (zero-filled: never-sent positions decode finite) */
    uint8_t *stage_g, *stage_u, *stage_d;
    int32_t *stage_map, *d_stage_map; /* (n_expert) e where staged for this call, else -1 */
    /* per call */
    int32_t *d_route; /* device [sel nk][wsel nk], then room for the hidden rows (a call of few tokens) */
    float *d_tmp;     /* device [n_rows][E]: a lane's output before the add */
    int32_t *h_route; /* host copy of d_route; the start of the block of h_x and h_out (whole pages) */
    float *h_x;       /* host [n_rows][E]: the CPU lane's input (calls of many tokens: with few, in h_route) */
    float *h_out;     /* host [n_rows][E]: the CPU lane's output */
    int h_locked;     /* h_out host_register'ed: its copy up need not wait (upload) */
    int32_t *cpu_map; /* (n_expert) e for the CPU lane's experts, else -1 */
    int *cnt;         /* (n_expert) pairs of each expert in this call */
    int *miss;        /* (n_expert) uncached experts chosen in this call */
    double *miss_bytes;
    int *miss_tok;
    uint8_t *to_pcie;
    moe_lane_stats stats;
    uint64_t *counts; /* (n_layer * n_expert) routing counts of the layers routed on the host */
    float *heat;      /* (n_layer * n_expert) decayed routing counts: what the cache adapts to */
    int adapt_every;  /* steps between admissions, 0: never */
    uint64_t steps;
    /* the split tuned on decode windows (lane_tune; the model decides, a PCIe lane exists) */
    int tune_on, tune_n; /* tune_n: decode steps in the window under way, -1: none under way */
    int64_t tune_t0, tune_last;
    lane_tune tune;
    /* one-token steps in recorded segments (the device's st_step_segments):
     * the ops between two layers' host work replay as one graph */
    st_backend live; /* the op table as wrapped: what the host's part calls */
    int seg_mode;    /* SEG_LIVE, SEG_PROBE, SEG_RECORD or SEG_REPLAY in the step under way */
    int seg_off;     /* never (no segments, or a recording failed) */
    void **seg;      /* the recorded segments, seg_n of them (seg_cap allocated) */
    int seg_n, seg_cap, seg_i;
    void *seg_arg; /* the step arguments and device key they were recorded with */
    size_t seg_size;
    uint64_t seg_key;
    int seg_sized;       /* a live step with these arguments ran (it sized the scratch) */
    int seg_pos;         /* the position of the step under way */
    expert_store *store; /* host tiers, or NULL: the host experts are the model's mapping */
    int *tier_order;     /* (n_expert) the misses as the store reads them: the PCIe lane's first */
} lanes;

/* SEG_PROBE: the live step before a recording, telling the device where
 * its segments would end (so that it can say whether they can be recorded) */
enum { SEG_LIVE, SEG_PROBE, SEG_RECORD, SEG_REPLAY };

static lanes *LN(st_backend *be) { return (lanes *)be; }

/* The largest hidden rows that come to the host with the routing (bytes):
 * decode steps and batched steps of a few sequences. */
#define X_ALONG_MAX (64 * 1024)

#define HEAT_DECAY 0.98f /* per step: an expert's heat is its routing count, decayed */

/* A layer's n device slots of w's shape; w's biases (gpt-oss: all its
 * experts', indexed by expert id, in host memory with the experts) copied
 * to the device whole, for the pairs the device computes (its slots and the
 * PCIe lane's staging); the CPU lane reads the host ones. */
static st_weight slab(st_backend *dev, const st_weight *w, int n) {
    st_weight s = *w;
    s.mat = NULL;
    s.n_mat = n;
    s.data = n ? dev->alloc(dev, (size_t)n * (size_t)w->n_out * w->row_bytes) : NULL;
    if (w->bias) {
        const size_t bytes = (size_t)w->n_mat * (size_t)w->n_out * sizeof(float);
        float *b = dev->alloc(dev, bytes);
        dev->to_device(dev, b, w->bias, bytes);
        s.bias = b;
    }
    return s;
}

static void *mat_ptr(const st_weight *w, int64_t m) { return (void *)st_weight_mat(w, m); }

static int find_layer(lanes *L, const st_weight *gate) {
    const int guess = (L->last + 1) % L->n_layer; /* layers come in order */
    if (L->layer[guess].host_gate == gate->data) return L->last = guess;
    for (int il = 0; il < L->n_layer; il++)
        if (L->layer[il].host_gate == gate->data) return L->last = il;
    ST_ASSERT(!"moe_ffn called with experts the lanes do not know");
    return -1;
}

/* Device upload: queued (upload) where the backend has it, else waited for. */
static void put(lanes *L, void *dst, const void *src, size_t bytes) {
    st_backend *d = &L->live;
    if (d->upload) d->upload(d, dst, src, bytes);
    else d->to_device(d, dst, src, bytes);
}

/* The PCIe lane's copy of a layer's experts: gathered into one upload_many
 * (the device reads them from the page-locked mapping itself: one launch
 * instead of three copies an expert), or one upload each. */
static void put_expert(lanes *L, void *dst, const void *src, size_t bytes) {
    if (!L->gather) {
        put(L, dst, src, bytes);
        return;
    }
    ST_ASSERT(L->g_n < 3 * L->n_expert);
    L->g_dst[L->g_n] = dst, L->g_src[L->g_n] = src, L->g_bytes[L->g_n++] = bytes;
}

static void put_flush(lanes *L) {
    if (L->g_n) L->live.upload_many(&L->live, L->g_n, L->g_dst, L->g_src, L->g_bytes);
    L->g_n = 0;
}

/* One admission in layer il (moe_lanes_set_adapt): the hottest uncached
 * expert into the coldest cached one's slot, if hotter by half. */
static void adapt_layer(lanes *L, int il, const st_weight *gate, const st_weight *up, const st_weight *down) {
    lane_layer *ly = &L->layer[il];
    const float *heat = L->heat + (size_t)il * L->n_expert;
    int hot = -1, cold = -1;
    for (int e = 0; e < L->n_expert; e++) {
        if (ly->slot[e] < 0) {
            if (hot < 0 || heat[e] > heat[hot]) hot = e;
        } else if (cold < 0 || heat[e] < heat[cold]) {
            cold = e;
        }
    }
    if (hot < 0 || cold < 0 || !(heat[hot] > 1.5f * heat[cold] + 0.5f)) return;
    const int s = ly->slot[cold];
    const void *src[3] = {st_weight_mat(gate, hot), st_weight_mat(up, hot), st_weight_mat(down, hot)};
    if (L->store) expert_store_expert(L->store, il, hot, src);
    put(L, mat_ptr(&ly->g, s), src[0], ly->mat_g);
    put(L, mat_ptr(&ly->u, s), src[1], ly->mat_u);
    put(L, mat_ptr(&ly->d, s), src[2], ly->mat_d);
    ly->slot[hot] = s;
    ly->slot[cold] = -1;
    put(L, ly->d_slot, ly->slot, (size_t)L->n_expert * sizeof(int32_t));
    L->stats.swaps++;
}

/* Replayed steps: the ops forward.c calls between two layers' host work are
 * in the recorded segment, so the table it calls through does nothing while
 * the body runs; the host's part calls L->live. Every op a step may call is
 * here: a new op in backend.h changes sizeof(st_backend) and stops the build
 * below until it is added (run twice, once live and once in the graph, it
 * would compute wrong results, not fail). */
static void no_get_rows(st_backend *be, const st_weight *w, const int32_t *ids, int n, float *out) {
    (void)be, (void)w, (void)ids, (void)n, (void)out;
}
static void no_matmul(st_backend *be, const st_weight *w, int64_t mat, const float *x, float *y, int n_tok) {
    (void)be, (void)w, (void)mat, (void)x, (void)y, (void)n_tok;
}
static void no_matmul_multi(st_backend *be, int n, const st_weight *const *w, const float *x, float *const *y,
                            int n_tok) {
    (void)be, (void)n, (void)w, (void)x, (void)y, (void)n_tok;
}
static void no_matmul_res_norm(st_backend *be, const st_weight *w, const float *x, float *y, float *res,
                               const float *nw, float eps, float *h, const st_weight *wn, float *yn, int n_tok) {
    (void)be, (void)w, (void)x, (void)y, (void)res, (void)nw, (void)eps, (void)h, (void)wn, (void)yn, (void)n_tok;
}
static void no_rmsnorm(st_backend *be, float *x, const float *res, const float *w, float *y, int dim, int n_rows,
                       float eps) {
    (void)be, (void)x, (void)res, (void)w, (void)y, (void)dim, (void)n_rows, (void)eps;
}
static void no_qkv_prep(st_backend *be, float *q, float *k, const float *v, const float *qn, const float *kn, float eps,
                        int n_tok, int n_head, const st_rope *rope, st_kv_layer *kv, int pos0) {
    (void)be, (void)q, (void)k, (void)v, (void)qn, (void)kn, (void)eps, (void)n_tok, (void)n_head, (void)rope, (void)kv,
        (void)pos0;
}
static void no_attention(st_backend *be, const float *q, const st_kv_layer *kv, int n_tok, int pos0, int n_head,
                         float scale, int window, float *out) {
    (void)be, (void)q, (void)kv, (void)n_tok, (void)pos0, (void)n_head, (void)scale, (void)window, (void)out;
}
static void no_attention_sinks(st_backend *be, const float *q, const st_kv_layer *kv, int n_tok, int pos0, int n_head,
                               float scale, int window, const float *sinks, float *out) {
    (void)be, (void)q, (void)kv, (void)n_tok, (void)pos0, (void)n_head, (void)scale, (void)window, (void)sinks,
        (void)out;
}
static void no_qkv_prep_seqs(st_backend *be, float *q, float *k, const float *v, const float *qn, const float *kn,
                             float eps, int n, int n_head, const st_rope *rope, st_kv_layer *const *kv, int il,
                             const int *pos) {
    (void)be, (void)q, (void)k, (void)v, (void)qn, (void)kn, (void)eps, (void)n, (void)n_head, (void)rope, (void)kv,
        (void)il, (void)pos;
}
static int no_attention_seqs(st_backend *be, const float *q, st_kv_layer *const *kv, int il, int n, const int *pos,
                             int n_head, float scale, int window, const float *sinks, float *out) {
    (void)be, (void)q, (void)kv, (void)il, (void)n, (void)pos, (void)n_head, (void)scale, (void)window, (void)sinks,
        (void)out;
    return 0; /* "done": the replay did it */
}
static void no_act_mul(st_backend *be, st_act act, const float *g, const float *u, float *out, int64_t n) {
    (void)be, (void)act, (void)g, (void)u, (void)out, (void)n;
}
static void no_add(st_backend *be, float *x, const float *b, int64_t dim, int n_rows) {
    (void)be, (void)x, (void)b, (void)dim, (void)n_rows;
}
static void no_scale(st_backend *be, float *x, float s, int64_t n) { (void)be, (void)x, (void)s, (void)n; }
static void no_gdn(st_backend *be, const st_gdn *g, st_kv_layer *st, int n_tok, int pos0, const float *qkv,
                   const float *z, const float *beta, const float *alpha, float *out) {
    (void)be, (void)g, (void)st, (void)n_tok, (void)pos0, (void)qkv, (void)z, (void)beta, (void)alpha, (void)out;
}
static void no_split(st_backend *be, const float *src, float *a, float *b, int n_rows, int n_group, int w) {
    (void)be, (void)src, (void)a, (void)b, (void)n_rows, (void)n_group, (void)w;
}
static void no_sigmoid_mul(st_backend *be, float *x, const float *g, int dim, int g_dim, int n_rows) {
    (void)be, (void)x, (void)g, (void)dim, (void)g_dim, (void)n_rows;
}
static void no_copy_2d(st_backend *be, float *dst, int64_t dst_stride, const float *src, int64_t src_stride,
                       int64_t width, int n_rows) {
    (void)be, (void)dst, (void)dst_stride, (void)src, (void)src_stride, (void)width, (void)n_rows;
}
/* 36 function pointers, 3 other pointers (name, ctx, segments) and two ints
 * (each padded to a pointer's size on x86-64 and aarch64): update with the
 * stubs above when an op is added. gated_delta_net_keep, variant, top_k and
 * draw need none: they run between steps, never inside a recorded one
 * (run_step and run_step_rows are the wrapper's own: moe_lanes_wrap);
 * forward.c does not call upload_many (the lanes' host part does, on L->live). */
_Static_assert(sizeof(st_backend) == 41 * sizeof(void *), "st_backend changed: stub its new step ops in moe_lanes.c");

/* The table forward.c calls: stubs while a recorded step replays (on), the
 * wrapped ops otherwise. */
static void seg_stub(lanes *L, int on) {
    st_backend *b = &L->be;
    const st_backend *v = &L->live;
    b->get_rows = on ? no_get_rows : v->get_rows;
    b->matmul = on ? no_matmul : v->matmul;
    b->matmul_multi = on ? no_matmul_multi : v->matmul_multi;
    b->matmul_res_norm = on ? no_matmul_res_norm : v->matmul_res_norm;
    b->rmsnorm = on ? no_rmsnorm : v->rmsnorm;
    b->qkv_prep = on ? no_qkv_prep : v->qkv_prep;
    b->attention = on ? no_attention : v->attention;
    b->attention_sinks = on ? (v->attention_sinks ? no_attention_sinks : NULL) : v->attention_sinks;
    b->qkv_prep_seqs = on ? (v->qkv_prep_seqs ? no_qkv_prep_seqs : NULL) : v->qkv_prep_seqs;
    b->attention_seqs = on ? (v->attention_seqs ? no_attention_seqs : NULL) : v->attention_seqs;
    b->act_mul = on ? no_act_mul : v->act_mul;
    b->add = on ? no_add : v->add;
    b->scale = on ? no_scale : v->scale;
    b->gated_delta_net = on ? no_gdn : v->gated_delta_net;
    b->split_halves = on ? no_split : v->split_halves;
    b->sigmoid_mul = on ? no_sigmoid_mul : v->sigmoid_mul;
    b->copy_2d = on ? (v->copy_2d ? no_copy_2d : NULL) : v->copy_2d; /* optional ops stay absent */
}

static void seg_drop_all(lanes *L) {
    const st_step_segments *sg = L->live.segments;
    for (int i = 0; i < L->seg_n; i++) sg->drop(&L->live, L->seg[i]);
    L->seg_n = 0;
    st_free(L->seg_arg);
    L->seg_arg = NULL;
    L->seg_size = 0;
    L->seg_sized = 0;
}

/* A layer's host part starts: what the step queued before it runs now. */
static void seg_enter(lanes *L) {
    const st_step_segments *sg = L->live.segments;
    if (L->seg_mode == SEG_PROBE) {
        void *g;
        (void)sg->cut(&L->live, &g); /* live: where a segment would end */
    } else if (L->seg_mode == SEG_RECORD) {
        if (L->seg_n == L->seg_cap) {
            L->seg_cap = L->seg_cap ? 2 * L->seg_cap : 64;
            L->seg = st_realloc(L->seg, (size_t)L->seg_cap * sizeof *L->seg);
        }
        void *g;
        if (sg->cut(&L->live, &g) != 0) { /* its ops did not run: this step cannot be finished */
            st_log(ST_LOG_ERROR, "expert lanes: %s (STRATA_CUDA_GRAPH=0 runs decode unrecorded)", st_error_get());
            ST_ASSERT(!"a decode segment could not be recorded");
        }
        L->seg[L->seg_n++] = g;
    } else if (L->seg_mode == SEG_REPLAY) {
        /* the recording's scratch must still be where it was (the host's
         * parts of decode steps use scratch of one size, sized before) */
        ST_ASSERT(sg->key(&L->live, L->seg_pos) == L->seg_key && L->seg_i < L->seg_n);
        sg->run(&L->live, L->seg[L->seg_i++]);
    }
}

/* ... and ends: the ops after it are recorded again, or were. */
static void seg_leave(lanes *L) {
    if (L->seg_mode != SEG_LIVE) L->live.segments->resume(&L->live, L->seg_mode == SEG_RECORD);
}

/* A decode step begins (the first routed layer's call of one token): the
 * window of LANE_TUNE_WINDOW steps under way ends here or goes on. A prompt
 * chunk, or a gap of more than TUNE_GAP_NS between steps (no request, a
 * server's idle time), drops the window. */
#define LANE_TUNE_WINDOW 16
#define TUNE_GAP_NS      200000000
static void tune_tick(lanes *L, int n_tok) {
    const int64_t now = st_now_ns(), last = L->tune_last;
    L->tune_last = now;
    if (n_tok != 1 || now - last > TUNE_GAP_NS || L->tune_n < 0) {
        L->tune_n = n_tok == 1 ? 0 : -1;
        L->tune_t0 = now;
        return;
    }
    if (++L->tune_n < LANE_TUNE_WINDOW) return;
    lane_tune_step(&L->tune, (double)(now - L->tune_t0) * 1e-9 / LANE_TUNE_WINDOW);
    L->tune_n = 0;
    L->tune_t0 = now;
}

static void l_moe_ffn(st_backend *be, const float *h, const float *logits, int n_tok, int n_expert, int k,
                      const st_moe_gating *gt, st_act act, const st_weight *gate, const st_weight *up,
                      const st_weight *down, float *out) {
    lanes *L = LN(be);
    st_backend *d = &L->live; /* be's ops do nothing while a recorded step replays */
    if (L->m->mtp && gate == &L->m->layers[L->n_layer].ffn_gate_exps) {
        /* the multi-token prediction block's: whole on the device (engine_offload), its steps never recorded */
        L->dev_orig->moe_ffn(d, h, logits, n_tok, n_expert, k, gt, act, gate, up, down, out);
        return;
    }
    const int il = find_layer(L, gate);
    lane_layer *ly = &L->layer[il];
    ST_ASSERT(n_tok <= L->n_rows && k == L->k && n_expert == L->n_expert);
    const int nk = n_tok * k;
    const int64_t E = L->E;
    L->stats.layers++;
    if (ly->n_slots == n_expert) { /* every expert of this layer cached: the device's own MoE (recordable) */
        if (L->seg_mode != SEG_REPLAY)
            L->dev_orig->moe_ffn(d, h, logits, n_tok, n_expert, k, gt, act, &ly->g, &ly->u, &ly->d, out);
        L->stats.pairs_dev += (uint64_t)nk;
        return;
    }
    const int64_t t0 = st_now_ns();
    seg_enter(L);
    int32_t *d_sel = L->d_route;
    float *d_wsel = (float *)(L->d_route + nk);
    d->moe_route(be, logits, n_tok, n_expert, k, gt, d_sel, d_wsel);
    /* a few tokens' hidden rows come with the routing (one wait instead of
     * two; the CPU lane nearly always has pairs then) */
    const size_t x_bytes = (size_t)n_tok * E * sizeof(float), x_at = st_round_up((size_t)nk * 8, 64);
    const int x_along = d->copy_2d && x_bytes <= X_ALONG_MAX;
    if (x_along) d->copy_2d(be, (float *)((uint8_t *)L->d_route + x_at), n_tok * E, h, n_tok * E, n_tok * E, 1);
    d->to_host(be, L->h_route, L->d_route, x_along ? x_at + x_bytes : (size_t)nk * 8);
    const float *hx = x_along ? (const float *)((const uint8_t *)L->h_route + x_at) : L->h_x;
    const int64_t t1 = st_now_ns();
    L->stats.ns_route += (uint64_t)(t1 - t0);
    const int32_t *sel = L->h_route;
    const float *wsel = (const float *)(L->h_route + nk);

    /* 2. the misses, and their lanes */
    memset(L->cnt, 0, (size_t)n_expert * sizeof(int));
    for (int p = 0; p < nk; p++) {
        ST_ASSERT(sel[p] >= -1 && sel[p] < n_expert); /* -1: NaN logits routed it nowhere */
        if (sel[p] >= 0) L->cnt[sel[p]]++;
    }
    float *heat = L->heat + (size_t)il * n_expert;
    for (int e = 0; e < n_expert; e++) {
        L->counts[(size_t)il * n_expert + e] += (uint64_t)L->cnt[e];
        heat[e] = heat[e] * HEAT_DECAY + (float)L->cnt[e];
    }
    if (il == L->first_routed) {
        L->steps++;
        if (L->tune_on) tune_tick(L, n_tok);
    }
    int n_miss = 0, hits = 0;
    for (int e = 0; e < n_expert; e++) {
        L->cpu_map[e] = L->stage_map[e] = -1;
        if (!L->cnt[e]) continue;
        L->stats.experts++;
        if (ly->slot[e] >= 0) {
            hits += L->cnt[e];
            continue;
        }
        L->miss[n_miss] = e;
        L->miss_bytes[n_miss] = (double)(ly->mat_g + ly->mat_u + ly->mat_d);
        L->miss_tok[n_miss++] = L->cnt[e];
    }
    const double flops_tok = 2.0 * 3.0 * (double)E * (double)L->F;
    /* decode steps: the split as tuned on them (a prompt chunk's: as modelled) */
    const lane_rates rates = L->tune_on && n_tok == 1 ? lane_tune_rates(&L->tune, &L->rates) : L->rates;
    lane_split(&rates, n_miss, L->miss_bytes, L->miss_tok, flops_tok, n_tok, L->to_pcie);
    int cpu_pairs = 0, pcie_pairs = 0, n_sent = 0;
    for (int i = 0; i < n_miss; i++) {
        const int e = L->miss[i];
        if (L->to_pcie[i]) {
            L->stage_map[e] = e;
            pcie_pairs += L->cnt[e];
            n_sent++;
        } else {
            L->cpu_map[e] = e;
            cpu_pairs += L->cnt[e];
            L->stats.bytes_cpu += (uint64_t)L->miss_bytes[i];
        }
    }
    const int64_t thx = st_now_ns();
    if (cpu_pairs && !x_along) d->to_host(be, L->h_x, h, x_bytes);
    L->stats.ns_hx += (uint64_t)(st_now_ns() - thx);
    /* the CPU lane starts now, on the worker thread, while this one queues
     * the device's part (not with host tiers: its reads pace it, below) */
    const int on_worker = cpu_pairs && L->worker && !L->store;
    if (on_worker) {
        L->job = (cpu_job){L->cpu, hx, n_tok, n_expert, k, sel, wsel, L->cpu_map, act, gate, up, down, L->h_out, 0};
        st_worker_post(L->worker, cpu_job_run, &L->job);
    }
    /* host tiers: the misses' reads in flight while the cached pairs are
     * queued, the PCIe lane's first (its uploads wait for them) */
    const expert_store_stats tier0 = L->store ? *expert_store_stats_get(L->store) : (expert_store_stats){0};
    if (L->store) {
        int n = 0;
        for (int pass = 1; pass >= 0; pass--)
            for (int i = 0; i < n_miss; i++)
                if (L->to_pcie[i] == pass) L->tier_order[n++] = L->miss[i];
        expert_store_begin(L->store, il, L->tier_order, n_miss);
    }

    /* 3. the device's pairs: cache hits, then the experts sent over PCIe */
    int wrote = 0;
    if (hits) {
        d->moe_experts(be, h, n_tok, n_expert, k, d_sel, d_wsel, ly->d_slot, act, &ly->g, &ly->u, &ly->d, out);
        wrote = 1;
    }
    if (L->store) expert_store_wait_first(L->store, il, n_sent, &gate, &up, &down); /* the store's copies */
    if (n_sent) {
        /* the layer's own shapes and types over the staging buffers */
        st_weight sg = *gate, su = *up, sd = *down;
        sg.mat = su.mat = sd.mat = NULL;
        sg.bias = ly->g.bias, su.bias = ly->u.bias, sd.bias = ly->d.bias; /* the device's copies */
        sg.data = L->stage_g, su.data = L->stage_u, sd.data = L->stage_d;
        for (int i = 0, run = -1; i <= n_miss; i++) { /* runs of consecutive experts go as one copy */
            const int e = i < n_miss && L->to_pcie[i] ? L->miss[i] : -1;
            /* a run goes on while the next expert follows in the host copy too (the store's may not) */
            const int next = e >= 0 && run >= 0 && e == L->miss[i - 1] + 1 &&
                             st_weight_mat(gate, e) == (const uint8_t *)st_weight_mat(gate, e - 1) + ly->mat_g &&
                             st_weight_mat(up, e) == (const uint8_t *)st_weight_mat(up, e - 1) + ly->mat_u &&
                             st_weight_mat(down, e) == (const uint8_t *)st_weight_mat(down, e - 1) + ly->mat_d;
            if (run >= 0 && !next) {
                const int e0 = run, n = L->miss[i - 1] - run + 1;
                put_expert(L, mat_ptr(&sg, e0), st_weight_mat(gate, e0), (size_t)n * ly->mat_g);
                put_expert(L, mat_ptr(&su, e0), st_weight_mat(up, e0), (size_t)n * ly->mat_u);
                put_expert(L, mat_ptr(&sd, e0), st_weight_mat(down, e0), (size_t)n * ly->mat_d);
                run = -1;
            }
            if (e >= 0 && run < 0) run = e;
        }
        put_flush(L);
        put(L, L->d_stage_map, L->stage_map, (size_t)n_expert * sizeof(int32_t));
        d->moe_experts(be, h, n_tok, n_expert, k, d_sel, d_wsel, L->d_stage_map, act, &sg, &su, &sd,
                       wrote ? L->d_tmp : out);
        if (wrote) d->add(be, out, L->d_tmp, (int64_t)n_tok * E, 1);
        wrote = 1;
        L->stats.bytes_pcie += (uint64_t)n_sent * (ly->mat_g + ly->mat_u + ly->mat_d);
    }
    /* 4. the CPU lane, while the device works (its output when the worker is done) */
    L->stats.ns_queue += (uint64_t)(st_now_ns() - t1);
    if (cpu_pairs) {
        const int64_t t2 = st_now_ns();
        if (on_worker) st_worker_wait(L->worker);
        else if (L->store) /* each expert as soon as its reads are in */
            expert_store_cpu_lane(L->store, L->cpu, il, hx, n_tok, k, sel, wsel, L->cpu_map, act, E, L->h_out);
        else L->cpu->moe_experts(L->cpu, hx, n_tok, n_expert, k, sel, wsel, L->cpu_map, act, gate, up, down, L->h_out);
        const int64_t t3 = st_now_ns();
        /* page-locked: queued, and h_out is next written after the next
         * call's routing read, which waits for this copy */
        if (L->h_locked) d->upload(be, wrote ? L->d_tmp : out, L->h_out, x_bytes);
        else d->to_device(be, wrote ? L->d_tmp : out, L->h_out, x_bytes);
        if (wrote) d->add(be, out, L->d_tmp, (int64_t)n_tok * E, 1);
        L->stats.ns_cpu += on_worker ? (uint64_t)L->job.ns : (uint64_t)(t3 - t2);
        L->stats.ns_join += (uint64_t)(st_now_ns() - t3);
    }
    if (L->store) { /* the batch closed: its bytes and time */
        expert_store_wait(L->store, il, &gate, &up, &down);
        L->stats.bytes_ssd += expert_store_stats_get(L->store)->bytes - tier0.bytes;
        L->stats.ns_ssd += expert_store_stats_get(L->store)->ns - tier0.ns;
    }
    if (!wrote && !cpu_pairs) { /* every pair routed nowhere (NaN logits): zeros, as moe_experts gives them */
        memset(L->h_out, 0, x_bytes);
        d->to_device(be, out, L->h_out, x_bytes);
    }
    L->stats.pairs_dev += (uint64_t)hits;
    L->stats.pairs_cpu += (uint64_t)cpu_pairs;
    L->stats.pairs_pcie += (uint64_t)pcie_pairs;
    /* after this layer's work is queued: its cache may learn */
    if (L->adapt_every && ly->n_slots > 0 && L->steps % (uint64_t)L->adapt_every == 0)
        adapt_layer(L, il, gate, up, down);
    seg_leave(L);
    L->stats.ns_call += (uint64_t)(st_now_ns() - t0);
}

/* A one-token step: live the first time with its arguments (which sizes
 * the scratch), recorded in segments the second, replayed after that; the
 * layers' host parts run every time (l_moe_ffn: seg_enter, seg_leave).
 * Longer steps (prompt chunks) and steps never to be recorded (size 0: the
 * MTP block's) run live, the recorded step kept. */
static void l_run_step(st_backend *be, int n_tok, int pos0, void (*body)(void *, int), void *arg, size_t size) {
    lanes *L = LN(be);
    const st_step_segments *sg = L->live.segments;
    if (n_tok != 1 || !size || !sg || L->seg_off) {
        body(arg, pos0);
        return;
    }
    const uint64_t key = sg->key(&L->live, pos0);
    const int same = L->seg_arg && L->seg_size == size && !memcmp(L->seg_arg, arg, size) && L->seg_key == key;
    L->seg_pos = pos0;
    if (same && L->seg_n > 0) {
        sg->begin(&L->live, pos0, 0);
        L->seg_mode = SEG_REPLAY;
        L->seg_i = 0;
        seg_stub(L, 1);
        body(arg, pos0);
        seg_stub(L, 0);
        ST_ASSERT(L->seg_i == L->seg_n - 1);
        sg->run(&L->live, L->seg[L->seg_i++]); /* the tail: last layers, the output head */
    } else if (same && L->seg_sized) {
        sg->begin(&L->live, pos0, 1);
        L->seg_mode = SEG_RECORD;
        body(arg, pos0);
        seg_enter(L);                                        /* the tail */
        if (sg->key(&L->live, pos0) != key) seg_drop_all(L); /* scratch moved meanwhile: record again */
    } else {
        /* live, but as a recorded step will run (positions read on the
         * device, attention sized for the whole cache): the scratch it sizes
         * is what the recording needs, which must not grow while recording */
        seg_drop_all(L);
        sg->begin(&L->live, pos0, 0);
        L->seg_mode = SEG_PROBE;
        body(arg, pos0);
        seg_enter(L); /* the tail */
        L->seg_arg = st_malloc(size);
        memcpy(L->seg_arg, arg, size);
        L->seg_size = size;
        L->seg_key = sg->key(&L->live, pos0);
        L->seg_sized = 1;
        if (L->seg_key == UINT64_MAX) { /* an op there needs the host: recording would lose its work */
            ST_WARN("decode steps with experts in host RAM run unrecorded: an op needs the host mid-step");
            L->seg_off = 1;
        }
    }
    sg->end(&L->live);
    L->seg_mode = SEG_LIVE;
}

static void l_destroy(st_backend *be) {
    lanes *L = LN(be);
    if (L->live.segments) seg_drop_all(L);
    st_free(L->seg);
    for (int il = 0; il < L->n_layer; il++) {
        lane_layer *ly = &L->layer[il];
        if (ly->g.data) {
            be->free(be, (void *)ly->g.data);
            be->free(be, (void *)ly->u.data);
            be->free(be, (void *)ly->d.data);
        }
        const float *bias[3] = {ly->g.bias, ly->u.bias, ly->d.bias};
        for (int i = 0; i < 3; i++)
            if (bias[i]) be->free(be, (void *)bias[i]);
        be->free(be, ly->d_slot);
        st_free(ly->slot);
    }
    if (L->stage_g) {
        be->free(be, L->stage_g);
        be->free(be, L->stage_u);
        be->free(be, L->stage_d);
    }
    be->free(be, L->d_stage_map);
    be->free(be, L->d_route);
    be->free(be, L->d_tmp);
    st_free(L->layer);
    st_free(L->stage_map);
    if (L->h_locked) be->host_unregister(be, L->h_out);
    st_free(L->h_route);
    st_free(L->cpu_map);
    st_free(L->cnt);
    st_free(L->miss);
    st_free(L->miss_bytes);
    st_free(L->miss_tok);
    st_free(L->to_pcie);
    st_free(L->g_dst);
    st_free(L->g_src);
    st_free(L->g_bytes);
    st_free(L->counts);
    st_free(L->heat);
    st_worker_stop(L->worker);
    L->cpu->destroy(L->cpu);
    expert_store_close(L->store); /* before the device: it unregisters its page-locked memory there */
    st_free(L->tier_order);
    if (L->pinned) be->host_unregister(be, L->pinned);
    L->dev_orig->destroy(L->dev_orig);
    st_free(L);
}

st_backend *moe_lanes_wrap(st_backend *dev, st_backend *cpu, const model *m, const expert_plan *plan,
                           const lane_rates *rates, int n_rows, const void *pinned) {
    const model_hparams *hp = &m->hp;
    ST_ASSERT(hp->n_expert == plan->n_expert && hp->n_layer == plan->n_layer && n_rows > 0);
    lanes *L = st_calloc(1, sizeof *L);
    L->be = *dev;
    L->be.name = dev->name; /* the engine and tests tell backends apart by name: the device's */
    L->be.moe_ffn = l_moe_ffn;
    L->be.run_step = l_run_step;
    L->be.run_step_rows = NULL; /* a batched step's experts need the host mid-step */
    L->be.destroy = l_destroy;
    L->live = L->be;
    L->dev_orig = dev;
    L->cpu = cpu;
    L->pinned = pinned;
    const char *gs = st_switch_get("STRATA_LANE_GATHER");
    L->gather = pinned && dev->upload_many && !(gs && !strcmp(gs, "0"));
    L->g_dst = st_malloc(3 * (size_t)hp->n_expert * sizeof(void *));
    L->g_src = st_malloc(3 * (size_t)hp->n_expert * sizeof(void *));
    L->g_bytes = st_malloc(3 * (size_t)hp->n_expert * sizeof(size_t));
    L->m = m;
    L->rates = *rates;
    /* the split tuned while decoding: where the model splits and the device is not the CPU */
    const char *tune = st_switch_get("STRATA_LANE_TUNE");
    L->tune_on = rates->pcie_frac < 0 && dev->mem_info && !(tune && !strcmp(tune, "0"));
    L->tune_n = -1;
    lane_tune_init(&L->tune);
    L->n_layer = hp->n_layer;
    L->n_expert = hp->n_expert;
    L->k = hp->n_expert_used;
    L->n_rows = n_rows;
    L->last = -1;
    st_backend *be = &L->be;
    int first, end;
    model_routed_layers(m, &first, &end);
    const model_layer *l0 = &m->layers[first]; /* the first layer with experts */
    L->E = l0->ffn_gate_exps.n_in;
    L->F = l0->ffn_gate_exps.n_out;
    const int X = L->n_expert;
    size_t max_g = 0, max_u = 0, max_d = 0;
    L->layer = st_calloc((size_t)L->n_layer, sizeof *L->layer);
    for (int il = 0; il < L->n_layer; il++) {
        const model_layer *l = &m->layers[il];
        lane_layer *ly = &L->layer[il];
        ly->host_gate = l->ffn_gate_exps.data; /* NULL in a dense layer: no slots, never called */
        /* the host tensors are the GGUF's, each expert stack contiguous (runs of
         * experts go to the device as one copy) */
        ST_ASSERT(!l->ffn_gate_exps.mat && !l->ffn_up_exps.mat && !l->ffn_down_exps.mat);
        ly->mat_g = (size_t)l->ffn_gate_exps.n_out * l->ffn_gate_exps.row_bytes;
        ly->mat_u = (size_t)l->ffn_up_exps.n_out * l->ffn_up_exps.row_bytes;
        ly->mat_d = (size_t)l->ffn_down_exps.n_out * l->ffn_down_exps.row_bytes;
        if (ly->mat_g > max_g) max_g = ly->mat_g;
        if (ly->mat_u > max_u) max_u = ly->mat_u;
        if (ly->mat_d > max_d) max_d = ly->mat_d;
        ly->n_slots = plan->layer_slots[il];
        ly->slot = st_malloc((size_t)X * sizeof(int32_t));
        memcpy(ly->slot, plan->slot + (size_t)il * X, (size_t)X * sizeof(int32_t));
        ly->g = slab(be, &l->ffn_gate_exps, ly->n_slots);
        ly->u = slab(be, &l->ffn_up_exps, ly->n_slots);
        ly->d = slab(be, &l->ffn_down_exps, ly->n_slots);
        for (int e = 0; e < X; e++) {
            const int s = ly->slot[e];
            if (s < 0) continue;
            be->to_device(be, mat_ptr(&ly->g, s), st_weight_mat(&l->ffn_gate_exps, e), ly->mat_g);
            be->to_device(be, mat_ptr(&ly->u, s), st_weight_mat(&l->ffn_up_exps, e), ly->mat_u);
            be->to_device(be, mat_ptr(&ly->d, s), st_weight_mat(&l->ffn_down_exps, e), ly->mat_d);
        }
        ly->d_slot = be->alloc(be, (size_t)X * sizeof(int32_t));
        be->to_device(be, ly->d_slot, ly->slot, (size_t)X * sizeof(int32_t));
    }
    /* the PCIe lane's staging, unless no expert is ever sent (--pcie-frac 0,
     * and the CPU alone with --ram-budget: a layer of experts for nothing) */
    uint8_t **stage[3] = {&L->stage_g, &L->stage_u, &L->stage_d};
    const size_t stage_bytes[3] = {(size_t)X * max_g, (size_t)X * max_u, (size_t)X * max_d};
    if (rates->pcie_frac != 0) {
        size_t most = stage_bytes[0];
        if (stage_bytes[1] > most) most = stage_bytes[1];
        if (stage_bytes[2] > most) most = stage_bytes[2];
        void *zeros = st_calloc(1, most);
        for (int i = 0; i < 3; i++) {
            *stage[i] = be->alloc(be, stage_bytes[i]);
            be->to_device(be, *stage[i], zeros, stage_bytes[i]);
        }
        st_free(zeros);
    }
    L->stage_map = st_malloc((size_t)X * sizeof(int32_t));
    L->d_stage_map = be->alloc(be, (size_t)X * sizeof(int32_t));
    const size_t nk = (size_t)n_rows * L->k;
    const size_t rows_bytes = (size_t)n_rows * L->E * sizeof(float);
    const size_t route_bytes = st_round_up(nk * 8, 64) + (rows_bytes < X_ALONG_MAX ? rows_bytes : X_ALONG_MAX);
    L->d_route = be->alloc(be, route_bytes);
    L->d_tmp = be->alloc(be, rows_bytes);
    /* h_out on pages of its own: page-locked (for the device to read), the
     * hand-back is queued instead of waited for */
    const size_t pg = (size_t)sysconf(_SC_PAGESIZE), route_room = st_round_up(route_bytes, pg),
                 x_room = st_round_up(rows_bytes, pg);
    L->h_route = st_malloc_pages(route_room + x_room + rows_bytes);
    L->h_x = (float *)((uint8_t *)L->h_route + route_room);
    L->h_out = (float *)((uint8_t *)L->h_x + x_room);
    L->h_locked = be->upload && be->host_register && be->host_register(be, L->h_out, rows_bytes) == 0;
    if (!L->h_locked && be->host_register)
        ST_WARN("expert lanes: the CPU lane's output buffer not page-locked (its copy up waits): %s", st_error_get());
    L->cpu_map = st_malloc((size_t)X * sizeof(int32_t));
    L->cnt = st_malloc((size_t)X * sizeof(int));
    L->miss = st_malloc((size_t)X * sizeof(int));
    L->miss_bytes = st_malloc((size_t)X * sizeof(double));
    L->miss_tok = st_malloc((size_t)X * sizeof(int));
    L->to_pcie = st_malloc((size_t)X);
    L->counts = st_calloc((size_t)L->n_layer * X, sizeof(uint64_t));
    L->heat = st_calloc((size_t)L->n_layer * X, sizeof(float));
    L->first_routed = 0;
    while (L->first_routed < L->n_layer - 1 &&
           (!L->layer[L->first_routed].host_gate || L->layer[L->first_routed].n_slots == X))
        L->first_routed++;
    return be;
}

const moe_lane_stats *moe_lanes_stats(const st_backend *be) {
    return be && be->moe_ffn == l_moe_ffn ? &((const lanes *)be)->stats : NULL;
}

const uint64_t *moe_lanes_counts(const st_backend *be) {
    return be && be->moe_ffn == l_moe_ffn ? ((const lanes *)be)->counts : NULL;
}

void moe_lane_stats_add(moe_lane_stats *acc, const moe_lane_stats *now, const moe_lane_stats *then) {
    acc->pairs_dev += now->pairs_dev - then->pairs_dev;
    acc->pairs_cpu += now->pairs_cpu - then->pairs_cpu;
    acc->pairs_pcie += now->pairs_pcie - then->pairs_pcie;
    acc->bytes_pcie += now->bytes_pcie - then->bytes_pcie;
    acc->bytes_cpu += now->bytes_cpu - then->bytes_cpu;
    acc->layers += now->layers - then->layers;
    acc->experts += now->experts - then->experts;
    acc->swaps += now->swaps - then->swaps;
    acc->ns_route += now->ns_route - then->ns_route;
    acc->ns_cpu += now->ns_cpu - then->ns_cpu;
    acc->ns_join += now->ns_join - then->ns_join;
    acc->ns_call += now->ns_call - then->ns_call;
    acc->ns_queue += now->ns_queue - then->ns_queue;
    acc->ns_hx += now->ns_hx - then->ns_hx;
    acc->bytes_ssd += now->bytes_ssd - then->bytes_ssd;
    acc->ns_ssd += now->ns_ssd - then->ns_ssd;
}

int moe_lanes_cache_map(const st_backend *be, char *cells, int cap, int *n_layer, int *n_expert) {
    if (!be || be->moe_ffn != l_moe_ffn) return -1;
    const lanes *L = (const lanes *)be;
    const int X = L->n_expert, n = L->n_layer * X;
    *n_layer = L->n_layer, *n_expert = X;
    if (n > cap) return -1;
    for (int il = 0; il < L->n_layer; il++) {
        const float *heat = L->heat + (size_t)il * X;
        float mx = 0;
        for (int e = 0; e < X; e++) mx = heat[e] > mx ? heat[e] : mx;
        for (int e = 0; e < X; e++) {
            const float f = mx > 0 ? heat[e] / mx : 0;
            const int level = f > 0.5f ? 3 : f > 0.2f ? 2 : f > 0.05f ? 1 : 0;
            cells[(size_t)il * X + e] = (char)('0' + level + 4 * (L->layer[il].slot[e] >= 0));
        }
    }
    return n;
}

double moe_lanes_pcie_scale(const st_backend *be) {
    const lanes *L = be && be->moe_ffn == l_moe_ffn ? (const lanes *)be : NULL;
    return L && L->tune_on ? L->tune.scale : 0;
}

void moe_lanes_set_adapt(st_backend *be, int every) {
    if (be && be->moe_ffn == l_moe_ffn) ((lanes *)be)->adapt_every = every > 0 ? every : 0;
}

void moe_lanes_set_store(st_backend *be, expert_store *store) {
    ST_ASSERT(be && be->moe_ffn == l_moe_ffn);
    lanes *L = (lanes *)be;
    L->store = store;
    L->gather = 0; /* the store's copies: its own staging, not the page-locked mapping */
    L->tier_order = st_malloc((size_t)L->n_expert * sizeof(int));
}

void moe_lanes_use_worker(st_backend *be) {
    ST_ASSERT(be && be->moe_ffn == l_moe_ffn);
    lanes *L = (lanes *)be;
    if (!L->worker) L->worker = st_worker_start(2000);
}
