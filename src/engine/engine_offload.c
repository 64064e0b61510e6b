/* Where a MoE model's experts go when the engine opens it on a device
 * (engine_offload.h): the memory plan from the device's budget, then
 * either every weight on the device (the plain placement) or the dense part
 * there and the expert lanes (moe_lanes.h) over a cache of slots, with the
 * lanes' bandwidths measured here, once, at start. */
#include "engine/engine_offload.h"

#include <inttypes.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "backend/backend.h"
#include "core/alloc.h"
#include "core/log.h"
#include "core/switches.h"
#include "core/timer.h"
#include "engine/expert_store.h"
#include "engine/kv_cache.h"
#include "engine/moe_lanes.h"
#include "model/forward.h"

/* ---- expert profiles: routing counts per (layer, expert) ---- */

#define PROFILE_MAGIC "strata-expert-profile 1"

uint64_t *expert_profile_load(const char *path, int n_layer, int n_expert) {
    FILE *f = fopen(path, "r");
    if (!f) {
        st_error_set("%s: cannot open the expert profile", path);
        return NULL;
    }
    char magic[64] = {0};
    int L = 0, X = 0;
    uint64_t *c = NULL;
    if (!fgets(magic, sizeof magic, f) || strncmp(magic, PROFILE_MAGIC, strlen(PROFILE_MAGIC)) != 0 ||
        fscanf(f, "%d %d", &L, &X) != 2) {
        st_error_set("%s: not an expert profile (strata profile writes them)", path);
        goto done;
    }
    if (L != n_layer || X != n_expert) {
        st_error_set("%s: a profile of %d layers x %d experts, the model has %d x %d", path, L, X, n_layer, n_expert);
        goto done;
    }
    c = st_malloc((size_t)L * X * sizeof(uint64_t));
    for (long i = 0; i < (long)L * X; i++)
        if (fscanf(f, "%" SCNu64, &c[i]) != 1) {
            st_error_set("%s: the profile ends after %ld of %ld counts", path, i, (long)L * X);
            st_free(c);
            c = NULL;
            break;
        }
done:
    fclose(f);
    return c;
}

int expert_profile_save(const char *path, const uint64_t *counts, int n_layer, int n_expert) {
    FILE *f = fopen(path, "w");
    if (!f) {
        st_error_set("%s: cannot write the expert profile", path);
        return -1;
    }
    fprintf(f, "%s\n%d %d\n", PROFILE_MAGIC, n_layer, n_expert);
    for (int l = 0; l < n_layer; l++)
        for (int e = 0; e < n_expert; e++)
            fprintf(f, "%" PRIu64 "%c", counts[(size_t)l * n_expert + e], e + 1 < n_expert ? ' ' : '\n');
    if (fclose(f) != 0) {
        st_error_set("%s: write failed", path);
        return -1;
    }
    return 0;
}

/* ---- the plan ---- */

/* Device memory besides weights and KV for chunks of n_ubatch rows: the
 * forward pass's activations, the MoE products' per-pair rows, the
 * products' quantized inputs, and a fixed part for the BLAS workspace,
 * attention partials and sampling. An estimate, on the safe side. */
size_t engine_scratch_bytes(const model_hparams *hp, int n_ubatch) {
    const size_t B = (size_t)n_ubatch, E = (size_t)hp->n_embd;
    const size_t qw = (size_t)hp->n_head * hp->head_dim, kvw = (size_t)hp->n_head_kv * hp->head_dim;
    const size_t act = B * (3 * E + 2 * qw + 2 * kvw + 2 * (size_t)hp->n_ff + (size_t)hp->n_expert + hp->n_vocab) * 4;
    const size_t pairs = B * (size_t)hp->n_expert_used, F = (size_t)hp->n_ff_exp;
    const size_t moe = pairs * (2 * F + E) * 4 + pairs * F * 2 + pairs * 16;
    size_t widest = E > F ? E : F;
    if (qw > widest) widest = qw;
    /* deepseek2's latent attention (forward_mla.c): q bottleneck, full queries, [latent | rope key],
     * every head's packed product (at most head_dim per head), values */
    const size_t mla = model_layer_mla(hp)
                           ? B *
                                 ((size_t)hp->q_lora + (size_t)hp->n_head * hp->head_dim_mla + (size_t)hp->head_dim +
                                  (size_t)hp->n_head * hp->head_dim + (size_t)hp->n_head * hp->v_head_mla) *
                                 4
                           : 0;
    return act + moe + mla + 2 * pairs * widest * 6 + ((size_t)512 << 20);
}

static double best_of(double a, double b) { return a < b ? a : b; }

/* The lanes' rates on this machine, in the shapes the lanes see them:
 * PCIe, a layer's gate tensor in one copy (bandwidth), then 8 experts sent
 * one by one as the lane sends them (the fixed cost per expert); the CPU
 * lane, one token over k experts (decode: bandwidth), then 256 tokens over
 * 32 experts, 64 tokens each (a prompt chunk: the per-token compute, from
 * what the weights' reading does not explain). With host tiers (store) the
 * experts come from the store and the copies from its staging buffer: the
 * file's pages of the SSD tier are never touched. */
static void measure_rates(st_backend *dev, st_backend *cpu, const model *m, expert_store *store, lane_rates *r) {
    const model_hparams *hp = &m->hp;
    int first, end;
    model_routed_layers(m, &first, &end);
    const model_layer *l = &m->layers[first]; /* the first layer with experts */
    const st_weight *g = &l->ffn_gate_exps, *u = &l->ffn_up_exps, *d = &l->ffn_down_exps;
    const void *big = g->data; /* the layer's gate stack, or as many bytes of the store's staging */
    if (store) {
        int list[32];
        const int n = hp->n_expert < 32 ? hp->n_expert : 32;
        for (int e = 0; e < n; e++) list[e] = e;
        expert_store_begin(store, first, list, n);
        expert_store_wait(store, first, &g, &u, &d);
        size_t cap;
        big = expert_store_scratch(store, &cap);
    }
    const size_t mg = (size_t)g->n_out * g->row_bytes, mu = (size_t)u->n_out * u->row_bytes,
                 md = (size_t)d->n_out * d->row_bytes;
    const double ebytes = (double)(mg + mu + md);
    const size_t tbytes = (size_t)g->n_mat * mg;
    uint8_t *tmp = dev->alloc(dev, tbytes > 8 * (mg + mu + md) ? tbytes : 8 * (mg + mu + md));
    char byte;
    double t = 1e30, t8 = 1e30;
    const int n8 = hp->n_expert < 8 ? hp->n_expert : 8;
    for (int i = 0; i < 2; i++) {
        int64_t t0 = st_now_ns();
        if (dev->upload) dev->upload(dev, tmp, big, tbytes);
        else dev->to_device(dev, tmp, big, tbytes);
        dev->to_host(dev, &byte, tmp, 1); /* waits for the copy */
        t = best_of(t, (double)(st_now_ns() - t0) * 1e-9);
        t0 = st_now_ns();
        for (int e = 0; e < n8; e++) {
            const struct {
                const st_weight *w;
                size_t b;
            } part[3] = {{g, mg}, {u, mu}, {d, md}};
            for (int k = 0; k < 3; k++) {
                uint8_t *dst = tmp + (size_t)e * (mg + mu + md) + (k ? mg : 0) + (k == 2 ? mu : 0);
                if (dev->upload) dev->upload(dev, dst, st_weight_mat(part[k].w, e), part[k].b);
                else dev->to_device(dev, dst, st_weight_mat(part[k].w, e), part[k].b);
            }
        }
        dev->to_host(dev, &byte, tmp, 1);
        t8 = best_of(t8, (double)(st_now_ns() - t0) * 1e-9);
    }
    dev->free(dev, tmp);
    r->pcie_bw = (double)tbytes / t;
    r->pcie_lat = t8 / n8 - ebytes / r->pcie_bw;
    if (r->pcie_lat < 5e-6) r->pcie_lat = 5e-6;

    const int k = hp->n_expert_used, E = hp->n_embd, N = 256;
    const int spread = hp->n_expert < 32 ? hp->n_expert : 32;
    float *x = st_malloc((size_t)N * E * sizeof(float)), *y = st_malloc((size_t)N * E * sizeof(float));
    int32_t *sel = st_malloc((size_t)N * k * sizeof(int32_t));
    float *w = st_malloc((size_t)N * k * sizeof(float));
    for (size_t i = 0; i < (size_t)N * E; i++) x[i] = (float)((i * 2654435761u) % 1000) * 1e-3f - 0.5f;
    for (int i = 0; i < N * k; i++) w[i] = 1.0f / (float)k;
    /* decode: one token over k experts, on N_SETS sets of experts not read
     * before (as a decode step finds them: a set read again comes from the
     * host's cache, 300 MiB on the H200's, and overstates the rate), the
     * median; before the prompt shape below reads any. The store's staging
     * holds `spread` experts, so its later sets repeat (the median skips them). */
    enum { N_SETS = 7 };
    double ts[N_SETS];
    const int avail = store ? spread : hp->n_expert;
    for (int i = 0; i < N_SETS; i++) {
        for (int j = 0; j < k; j++) sel[j] = (i * k + j) % avail;
        const int64_t t0 = st_now_ns();
        cpu->moe_experts(cpu, x, 1, hp->n_expert, k, sel, w, NULL, hp->act, g, u, d, y);
        ts[i] = (double)(st_now_ns() - t0) * 1e-9;
        for (int a = i; a > 0 && ts[a] < ts[a - 1]; a--) { /* kept sorted */
            const double tmp_t = ts[a];
            ts[a] = ts[a - 1];
            ts[a - 1] = tmp_t;
        }
    }
    const double t1 = ts[N_SETS / 2];
    double tn = 1e30;
    for (int i = 0; i < 3; i++) {
        for (int tk = 0; tk < N; tk++) /* distinct experts within a token */
            for (int j = 0; j < k; j++) sel[tk * k + j] = (tk + j * (spread / k)) % spread;
        const int64_t t0 = st_now_ns();
        cpu->moe_experts(cpu, x, N, hp->n_expert, k, sel, w, NULL, hp->act, g, u, d, y);
        tn = best_of(tn, (double)(st_now_ns() - t0) * 1e-9);
    }
    /* What a layer's CPU lane costs per token row whatever it computes: the
     * rows down, their quantization, the output up. Timed with N rows and
     * one pair: expert 0 for token 0, every other pair on an expert the map
     * says is elsewhere. */
    float *rows = dev->alloc(dev, (size_t)N * E * sizeof(float));
    int32_t *map = st_malloc((size_t)hp->n_expert * sizeof(int32_t));
    for (int e = 0; e < hp->n_expert; e++) map[e] = e ? -1 : 0;
    for (int p = 0; p < N * k; p++) sel[p] = p && hp->n_expert > 1 ? 1 + p % k % (hp->n_expert - 1) : 0;
    double tr = 1e30;
    for (int i = 0; i < 2; i++) {
        const int64_t t0 = st_now_ns();
        dev->to_host(dev, x, rows, (size_t)N * E * sizeof(float));
        cpu->moe_experts(cpu, x, N, hp->n_expert, k, sel, w, map, hp->act, g, u, d, y);
        dev->to_device(dev, rows, y, (size_t)N * E * sizeof(float));
        tr = best_of(tr, (double)(st_now_ns() - t0) * 1e-9);
    }
    dev->free(dev, rows);
    st_free(map);
    r->cpu_row = tr / N;
    r->cpu_bw = (double)k * ebytes / t1;
    /* the arithmetic beyond each expert's first token (lane_split's cost) */
    const double flops = 2.0 * 3.0 * (double)E * (double)hp->n_ff_exp * (double)(k * N - spread);
    const double t_read = (double)spread * ebytes / r->cpu_bw;
    r->cpu_flops = flops / (tn > t_read * 1.05 ? tn - t_read : t_read * 0.05);
    /* the PCIe lane's cost per layer that uses it: a second expert pass on
     * the GPU, its map's upload and the add (measured on an H200: ~40 us of
     * decode time per layer that sent an expert) */
    r->pcie_layer = 40e-6;
    st_free(x);
    st_free(y);
    st_free(sel);
    st_free(w);
}

void engine_plan_input(const engine_params *p, model *m, int n_ctx, int n_ubatch, size_t budget, expert_plan_in *in) {
    const model_hparams *hp = &m->hp;
    memset(in, 0, sizeof *in);
    in->budget = budget;
    const int mtp = p->draft_mtp && m->mtp; /* the block's weights, cache layer and input rows too */
    in->dense = engine_weight_bytes(m, NULL) + (mtp ? engine_mtp_bytes(m) : 0);
    in->n_layer = hp->n_layer;
    in->n_expert = hp->n_expert;
    model_routed_layers(m, &in->n_dense_lead, &in->routed_end); /* a split's rank: its own layers' */
    /* one expert's bytes: the largest layer's (types may differ between layers,
     * as llama.cpp's Q4_K_M gives some layers' down experts more bits) */
    for (int il = 0; hp->n_expert && il < hp->n_layer; il++) {
        const model_layer *l = &m->layers[il];
        const size_t b = (size_t)l->ffn_gate_exps.n_out * l->ffn_gate_exps.row_bytes +
                         (size_t)l->ffn_up_exps.n_out * l->ffn_up_exps.row_bytes +
                         (size_t)l->ffn_down_exps.n_out * l->ffn_down_exps.row_bytes;
        if (b > in->expert) in->expert = b;
    }
    int il0, il1; /* a split's rank holds its layers' caches only */
    model_bound_layers(m, &il0, &il1);
    in->kv = (kv_cache_range_bytes(hp, n_ctx, p->kv_type, il0, il1) +
              (mtp ? kv_cache_mtp_bytes(hp, n_ctx, p->kv_type) : 0)) *
             (size_t)(p->n_seq > 0 ? p->n_seq : 1);
    in->scratch = engine_scratch_bytes(hp, n_ubatch) + (mtp ? model_mtp_rows_bytes(hp, n_ubatch) : 0);
    in->cache = p->expert_cache;
    in->ram_budget = p->ram_budget > 0 ? (size_t)(p->ram_budget * (double)(1ull << 30)) : 0;
    in->host_expert = hp->n_expert ? expert_store_expert_bytes(m) : 0;
    in->host_staging = hp->n_expert ? expert_store_staging_bytes(m) : 0;
}

int engine_plan_memory(const engine_params *p, model *m, int n_ctx, int n_ubatch, size_t budget, expert_plan_in *in,
                       expert_plan *out) {
    engine_plan_input(p, m, n_ctx, n_ubatch, budget, in);
    uint64_t *profile = NULL;
    if (p->expert_profile && !(profile = expert_profile_load(p->expert_profile, m->hp.n_layer, m->hp.n_expert)))
        return -1;
    const int rc = expert_plan_make(in, profile, out);
    st_free(profile);
    return rc;
}

/* The plan's lines but the device budget's (the CPU alone has none). */
static void host_line(void *ctx, const char *text) {
    (void)ctx;
    if (strncmp(text, "budget ", 7) != 0) ST_INFO("memory plan: %s", text);
}

size_t engine_device_budget(const engine_params *p, size_t free_bytes) {
    if (p->vram_budget > 0) return (size_t)(p->vram_budget * (double)(1ull << 30));
    const size_t reserve = (size_t)(p->vram_reserve_mib > 0 ? p->vram_reserve_mib : 512) << 20;
    return free_bytes > reserve ? free_bytes - reserve : 0;
}

int engine_prefill_chunk(const engine_params *p, model *m, int n_ctx, size_t budget) {
    if (p->n_ubatch > 0) return p->n_ubatch;
    if (!m->hp.n_expert) return 512;
    expert_plan_in in;
    expert_plan plan;
    if (engine_plan_memory(p, m, n_ctx, 512, budget, &in, &plan) != 0) return 512;
    const int streamed = !plan.all_resident;
    expert_plan_free(&plan);
    if (!streamed) return 512;
    const size_t base = engine_scratch_bytes(&m->hp, 512);
    for (int c = 4096; c > 512; c /= 2)
        if (c <= n_ctx && engine_scratch_bytes(&m->hp, c) - base <= budget / 8) return c;
    return 512;
}

int engine_offload(const engine_params *p, model *m, int n_ctx, int *n_ubatch_io, st_backend **be,
                   struct engine_placed **placed) {
    const model_hparams *hp = &m->hp;
    st_backend *dev = *be;
    const int on_cpu = !dev->mem_info;
    size_t free_b = 0, total_b = 0;
    if (!on_cpu) dev->mem_info(dev, &free_b, &total_b);
    /* two CPU backends (the seam under test): no memory limit */
    const size_t budget = on_cpu ? (size_t)1 << 62 : engine_device_budget(p, free_b);
    if (!on_cpu && p->vram_budget > 0) {
        if (budget > free_b) {
            st_error_set("--vram-budget %.2f GiB is more than the GPU's free %.2f GiB", p->vram_budget,
                         (double)free_b / (1ull << 30));
            return -1;
        }
    }
    if (!on_cpu && p->n_ubatch <= 0) {
        *n_ubatch_io = engine_prefill_chunk(p, m, n_ctx, budget);
        if (*n_ubatch_io != 512)
            ST_INFO("prompt chunks of %d tokens (--prefill auto: experts are streamed, and a longer chunk streams "
                    "each of them once for more tokens)",
                    *n_ubatch_io);
    }
    const int n_ubatch = *n_ubatch_io;
    expert_plan_in in;
    expert_plan plan;
    /* the CPU alone with --ram-budget: the lanes (no cache) only when the
     * experts do not fit it; else the plain CPU engine, nothing placed */
    engine_params pc = *p;
    const int cpu_tiers = on_cpu && p->expert_cache < 0;
    if (cpu_tiers) pc.expert_cache = 0;
    if (engine_plan_memory(&pc, m, n_ctx, n_ubatch, budget, &in, &plan) != 0) return -1;
    if (cpu_tiers && !plan.in_ram) {
        ST_INFO("host experts: %.2f GiB, within --ram-budget %.2f GiB",
                (double)(plan.ram_experts * in.expert) / (1ull << 30), p->ram_budget);
        expert_plan_free(&plan);
        *placed = NULL;
        return 0;
    }
    if (cpu_tiers) expert_plan_describe(&plan, &in, host_line, NULL); /* no device budget to speak of */
    else expert_plan_log(&plan, &in);
    if (plan.all_resident) {
        *placed = engine_place_model(m, dev, 1, p->draft_mtp);
        expert_plan_free(&plan);
        return 0;
    }
    /* host tiers: the mapping read only where it must be (expert_store_advise) */
    if (plan.in_ram && expert_store_advise(m, plan.slot, 0) != 0) {
        expert_plan_free(&plan);
        return -1;
    }
    /* --draft mtp: the block whole on the device, its experts too (one
     * layer's; the lanes pass its MoE straight to the device) */
    *placed = engine_place_model(m, dev, 0, p->draft_mtp);
    /* The experts' host pages locked in place, so that PCIe copies run at
     * the link's speed and return at once: one range from the first routed
     * tensor to the end of the last (the dense tensors between them too; a
     * copy whose source is only partly registered is refused, and
     * neighbouring tensors share pages). */
    const void *pinned = NULL;
    expert_store *store = NULL;
    if (plan.in_ram) { /* host tiers: the arena and the file, never the mapping's expert pages */
        if (!(store = expert_store_open(m, plan.in_ram, dev, !p->no_pin))) {
            engine_place_free(*placed);
            *placed = NULL;
            expert_plan_free(&plan);
            return -1;
        }
        const double seq = expert_store_seq_rate(store, (size_t)256 << 20);
        ST_INFO("SSD tier: %ld experts read from %s on demand (%s); the disk's sequential rate by the same reads: "
                "%.2f GB/s",
                plan.ssd_experts, p->model_path, expert_store_mode(store), seq * 1e-9);
    } else if (dev->host_register && dev->host_unregister && !p->no_pin) {
        const uint8_t *lo = NULL, *hi = NULL;
        int apart = 0;
        for (int il = 0; il < hp->n_layer; il++) {
            const st_weight *ws[] = {&m->layers[il].ffn_gate_exps, &m->layers[il].ffn_up_exps,
                                     &m->layers[il].ffn_down_exps};
            for (int i = 0; i < 3; i++) {
                if (!ws[i]->data) continue; /* a dense layer (glm4moe's first) */
                const uint8_t *a = ws[i]->data, *b = a + (size_t)ws[i]->n_mat * ws[i]->n_out * ws[i]->row_bytes;
                apart |= ws[i]->mat != NULL;
                if (!lo || a < lo) lo = a;
                if (!hi || b > hi) hi = b;
            }
        }
        const int64_t t0 = st_now_ns();
        if (!apart && dev->host_register(dev, lo, (size_t)(hi - lo)) == 0) {
            pinned = lo;
            ST_INFO("host experts page-locked in place (%.2f GiB) in %.1f s", (double)(hi - lo) / (1ull << 30),
                    (double)(st_now_ns() - t0) * 1e-9);
        } else {
            ST_WARN("host experts not page-locked (%s): PCIe copies are staged, slower",
                    apart ? "experts placed apart" : st_error_get());
        }
    }
    /* the CPU lane on a worker thread while this one queues the device's
     * part (not with host tiers, nor when the "device" is the CPU): the
     * worker and this thread take two of the threads, the pool the rest, so
     * that no pool thread waits for a core in the middle of a task */
    const char *lw = st_switch_get("STRATA_LANE_WORKER");
    const int worker = !on_cpu && !store && !(lw && !strcmp(lw, "0"));
    int n_cpu = p->n_threads > 0 ? p->n_threads : (int)sysconf(_SC_NPROCESSORS_ONLN);
    if (worker && n_cpu > 2) n_cpu--;
    st_backend *cpu = backend_cpu_create(n_cpu);
    /* a layer's device part is 20-100 us: stay awake across it (not when the
     * "device" is the CPU too: its pool runs then, on the same cores) */
    if (!on_cpu) backend_cpu_set_spin_us(cpu, 2000);
    lane_rates rates = {0};
    measure_rates(dev, cpu, m, store, &rates);
    rates.pcie_frac = cpu_tiers ? 0 : p->pcie_frac; /* the CPU alone: no device to send experts to */
    ST_INFO("expert lanes: CPU %.1f GB/s and %.0f GFLOP/s on %s threads (+ %.2f us per token row of a layer), PCIe "
            "%.1f GB/s + %.0f us per expert%s",
            rates.cpu_bw * 1e-9, rates.cpu_flops * 1e-9, p->n_threads ? "the given" : "all its", rates.cpu_row * 1e6,
            rates.pcie_bw * 1e-9, rates.pcie_lat * 1e6, p->pcie_frac >= 0 ? " (--pcie-frac fixes the split)" : "");
    *be = moe_lanes_wrap(dev, cpu, m, &plan, &rates, n_ubatch, pinned);
    moe_lanes_set_adapt(*be, p->adapt_every);
    if (worker) moe_lanes_use_worker(*be);
    if (store) {
        moe_lanes_set_store(*be, store);
        expert_store_advise(m, plan.slot, 1); /* the cache is filled: its experts' pages may go */
    }
    if (p->adapt_every)
        ST_INFO("expert cache: learns every %d steps (the hottest miss of a layer takes its coldest slot)",
                p->adapt_every);
    expert_plan_free(&plan);
    return 1;
}
