/* Memory plan, placement table and lane cost model (expert_plan.h). */
#include "engine/expert_plan.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/alloc.h"
#include "core/log.h"

static double gib(size_t b) { return (double)b / (double)(1ull << 30); }

/* (layer, expert) ids ordered by descending count (ties: lower layer, then lower expert) */
static const uint64_t *g_sort_counts;
static int cmp_hot(const void *a, const void *b) {
    const int32_t i = *(const int32_t *)a, j = *(const int32_t *)b;
    if (g_sort_counts[i] != g_sort_counts[j]) return g_sort_counts[i] > g_sort_counts[j] ? -1 : 1;
    return i < j ? -1 : 1;
}

int expert_plan_make(const expert_plan_in *in, const uint64_t *profile, expert_plan *out) {
    memset(out, 0, sizeof *out);
    const int L = in->n_layer, X = in->n_expert, D = in->n_dense_lead, U = in->routed_end > 0 ? in->routed_end : L;
    const long total = (long)(U - D) * X; /* the experts: none in the leading dense layers */
    if (L <= 0 || X <= 0 || D < 0 || D >= U || U > L || in->expert == 0) {
        st_error_set("memory plan: the model has no routed experts");
        return -1;
    }
    const size_t fixed = in->dense + in->kv + in->scratch;
    const size_t all = fixed + (size_t)total * in->expert;
    long slots;
    size_t staging = 0;
    if ((in->cache < 0 || in->cache >= total) && all <= in->budget) {
        slots = total;
    } else {
        if (in->cache >= total) {
            st_error_set("memory plan: --expert-cache %ld (every expert) needs %.2f GiB, beyond the budget of %.2f GiB",
                         in->cache, gib(all), gib(in->budget));
            return -1;
        }
        staging = (size_t)X * in->expert;
        if (fixed + staging > in->budget) {
            st_error_set("memory plan: the budget of %.2f GiB cannot hold the dense part: weights %.2f GiB + KV "
                         "%.2f GiB + scratch %.2f GiB + streaming buffer %.2f GiB = %.2f GiB (lower the context, "
                         "or raise --vram-budget)",
                         gib(in->budget), gib(in->dense), gib(in->kv), gib(in->scratch), gib(staging),
                         gib(fixed + staging));
            return -1;
        }
        const long fit = (long)((in->budget - fixed - staging) / in->expert);
        slots = in->cache < 0 ? fit : in->cache;
        if (slots > fit) {
            st_error_set("memory plan: --expert-cache %ld needs %.2f GiB, beyond the %.2f GiB left after the dense "
                         "part (room for %ld slots)",
                         in->cache, gib((size_t)in->cache * in->expert), gib(in->budget - fixed - staging), fit);
            return -1;
        }
        if (slots >= total) slots = total - 1; /* an expert short of all: keep the lanes (asked by size) */
    }
    out->all_resident = slots == total;
    out->slots = slots;
    out->staging = out->all_resident ? 0 : staging;
    out->used = fixed + out->staging + (size_t)slots * in->expert;
    out->n_layer = L;
    out->n_expert = X;
    out->layer_slots = st_calloc((size_t)L, sizeof(int));
    out->slot = st_malloc((size_t)L * X * sizeof(int32_t)); /* every layer's row, -1 in the dense ones */
    for (long i = 0; i < (long)L * X; i++) out->slot[i] = -1;
    if (profile) {
        int32_t *ord = st_malloc((size_t)total * sizeof(int32_t));
        for (long i = 0; i < total; i++) ord[i] = (int32_t)((long)D * X + i);
        g_sort_counts = profile;
        qsort(ord, (size_t)total, sizeof *ord, cmp_hot);
        for (long i = 0; i < slots; i++) {
            const int l = ord[i] / X;
            out->slot[ord[i]] = 0; /* chosen; numbered below */
            out->layer_slots[l]++;
        }
        st_free(ord);
        /* slots in expert-id order within a layer: a wholly cached layer is
         * then its experts in their own order (slot e = expert e), which is
         * how the device's own MoE addresses them */
        for (int l = 0; l < L; l++)
            for (int e = 0, s = 0; e < X; e++)
                if (out->slot[(long)l * X + e] >= 0) out->slot[(long)l * X + e] = s++;
    } else {
        for (int l = D; l < U; l++) {
            out->layer_slots[l] = (int)(slots / (U - D) + (l - D < slots % (U - D)));
            for (int e = 0; e < out->layer_slots[l]; e++) out->slot[(long)l * X + e] = e;
        }
    }
    if (expert_plan_host_tiers(in, profile, out) != 0) {
        expert_plan_free(out);
        return -1;
    }
    return 0;
}

int expert_plan_host_tiers(const expert_plan_in *in, const uint64_t *profile, expert_plan *out) {
    const int L = in->n_layer, X = in->n_expert, D = in->n_dense_lead, U = in->routed_end > 0 ? in->routed_end : L;
    const long total = (long)(U - D) * X, host = out->all_resident ? 0 : total - out->slots;
    st_free(out->in_ram);
    out->in_ram = NULL;
    out->ram_experts = host, out->ssd_experts = 0;
    /* the mapping's bytes when the experts fit the budget; else the arena's */
    if (!host || !in->ram_budget || (size_t)host * in->expert <= in->ram_budget) return 0;
    /* the SSD tier reads into a staging buffer of a layer's experts: host RAM as the arena is */
    if (in->host_staging > in->ram_budget) {
        st_error_set("memory plan: --ram-budget %.4f GiB cannot hold the SSD tier's staging buffer (%.4f GiB: a "
                     "layer's %d experts and a spare, %.2f MiB each); give it more, or %.4f GiB for every host "
                     "expert in RAM",
                     gib(in->ram_budget), gib(in->host_staging), X, (double)in->host_expert / (1 << 20),
                     gib((size_t)host * in->expert));
        return -1;
    }
    const size_t per = in->host_expert > in->expert ? in->host_expert : in->expert;
    const long fit = (long)((in->ram_budget - in->host_staging) / per), ram = fit < host ? fit : host;
    out->in_ram = st_calloc((size_t)L * X, 1);
    int32_t *ord = st_malloc((size_t)total * sizeof(int32_t));
    for (long i = 0; i < total; i++) ord[i] = (int32_t)((long)D * X + i);
    if (profile) {
        g_sort_counts = profile;
        qsort(ord, (size_t)total, sizeof *ord, cmp_hot);
    }
    long n = 0;
    for (long i = 0; i < total && n < ram; i++)
        if (out->slot[ord[i]] < 0) out->in_ram[ord[i]] = 1, n++;
    st_free(ord);
    out->ram_experts = n;
    out->ssd_experts = host - n;
    return 0;
}

void expert_plan_free(expert_plan *p) {
    if (!p) return;
    st_free(p->layer_slots);
    st_free(p->slot);
    st_free(p->in_ram);
    memset(p, 0, sizeof *p);
}

void expert_plan_describe(const expert_plan *p, const expert_plan_in *in, void (*line)(void *ctx, const char *text),
                          void *ctx) {
    const long total = (long)((in->routed_end > 0 ? in->routed_end : in->n_layer) - in->n_dense_lead) * in->n_expert;
    char t[512];
    snprintf(t, sizeof t,
             "budget %.2f GiB = dense weights %.2f + KV %.2f + scratch %.2f + streaming buffer %.2f + expert cache "
             "%.2f (%ld of %ld experts, %.1f%%, %.1f MiB each); %.2f GiB unused",
             gib(in->budget), gib(in->dense), gib(in->kv), gib(in->scratch), gib(p->staging),
             gib((size_t)p->slots * in->expert), p->slots, total, 100.0 * (double)p->slots / (double)total,
             (double)in->expert / (1 << 20), gib(in->budget - p->used));
    line(ctx, t);
    if (p->all_resident) return;
    if (!p->in_ram) {
        snprintf(t, sizeof t,
                 "%ld experts (%.2f GiB) in host RAM%s, computed by the CPU expert lane or streamed over PCIe",
                 total - p->slots, gib((size_t)(total - p->slots) * in->expert),
                 in->ram_budget ? " (within --ram-budget)" : "");
        line(ctx, t);
        return;
    }
    const size_t per = in->host_expert > in->expert ? in->host_expert : in->expert;
    snprintf(t, sizeof t,
             "%ld host experts (%.2f GiB) beyond --ram-budget %.2f GiB: RAM tier %ld (%.2f GiB arena) + SSD tier "
             "%ld (%.2f GiB read from the file on demand, through a %.2f GiB staging buffer)",
             total - p->slots, gib((size_t)(total - p->slots) * in->expert), gib(in->ram_budget), p->ram_experts,
             gib((size_t)p->ram_experts * per), p->ssd_experts, gib((size_t)p->ssd_experts * in->expert),
             gib(in->host_staging));
    line(ctx, t);
}

static void log_line(void *ctx, const char *text) {
    (void)ctx;
    ST_INFO("memory plan: %s", text);
}

void expert_plan_log(const expert_plan *p, const expert_plan_in *in) { expert_plan_describe(p, in, log_line, NULL); }

/* ---- cost model ---- */

/* cpu_bw is timed on one token's products, its arithmetic included: each
 * further token adds its arithmetic (counting the first twice sent one
 * token's experts over PCIe early: a fifth of the CPU's cost on the H200). */
static double cpu_cost(const lane_rates *r, double bytes, int n_tok, double flops_tok) {
    return bytes / r->cpu_bw + (double)(n_tok - 1) * flops_tok / r->cpu_flops;
}

static double pcie_cost(const lane_rates *r, double bytes) { return r->pcie_lat + bytes / r->pcie_bw; }

double lane_split(const lane_rates *r, int n, const double *bytes, const int *n_tok, double flops_tok, int n_rows,
                  uint8_t *to_pcie) {
    const double cpu_fixed = r->cpu_row * n_rows; /* the rows down and the output up, once per layer */
    /* order by CPU cost, largest first (insertion sort: n is one layer's experts) */
    int ord[1024];
    ST_ASSERT(n <= 1024);
    for (int i = 0; i < n; i++) {
        const double ci = cpu_cost(r, bytes[i], n_tok[i], flops_tok);
        int j = i;
        while (j > 0 && cpu_cost(r, bytes[ord[j - 1]], n_tok[ord[j - 1]], flops_tok) < ci) {
            ord[j] = ord[j - 1];
            j--;
        }
        ord[j] = i;
    }
    double t_cpu = 0, t_pcie = 0;
    if (r->pcie_frac >= 0) { /* a fixed share, the experts with the most work first */
        const int n_p = (int)(r->pcie_frac * n + 0.5);
        for (int i = 0; i < n; i++) {
            const int e = ord[i];
            to_pcie[e] = i < n_p;
            if (to_pcie[e]) t_pcie += pcie_cost(r, bytes[e]);
            else t_cpu += cpu_cost(r, bytes[e], n_tok[e], flops_tok);
        }
        if (n_p) t_pcie += r->pcie_layer;
        if (n_p < n) t_cpu += cpu_fixed;
        return t_cpu > t_pcie ? t_cpu : t_pcie;
    }
    double all_cpu = cpu_fixed, all_pcie = 0;
    int n_p = 0;
    t_pcie = r->pcie_layer; /* each lane's cost once it is used at all */
    t_cpu = cpu_fixed;
    for (int i = 0; i < n; i++) {
        const int e = ord[i];
        const double c = cpu_cost(r, bytes[e], n_tok[e], flops_tok), p = pcie_cost(r, bytes[e]);
        all_cpu += c;
        all_pcie += p;
        to_pcie[e] = t_pcie + p < t_cpu + c;
        if (to_pcie[e]) t_pcie += p, n_p++;
        else t_cpu += c;
    }
    if (!n) return 0;
    all_pcie += r->pcie_layer;
    const double tc = n_p < n ? t_cpu : 0, tp = n_p > 0 ? t_pcie : 0, split = tc > tp ? tc : tp;
    if (n_p > 0 && n_p < n && (all_cpu <= split || all_pcie <= split)) { /* one lane alone is no slower */
        const uint8_t one = all_pcie < all_cpu;
        for (int i = 0; i < n; i++) to_pcie[i] = one;
        return one ? all_pcie : all_cpu;
    }
    return split;
}

void lane_tune_init(lane_tune *t) {
    *t = (lane_tune){.scale = 1, .center = 1, .best_t = 0, .f = LANE_TUNE_F0, .dir = 0};
}

static double clamp_scale(double s) {
    return s < 1 / LANE_TUNE_MAX ? 1 / LANE_TUNE_MAX : s > LANE_TUNE_MAX ? LANE_TUNE_MAX : s;
}

void lane_tune_step(lane_tune *t, double window_t) {
    if (t->settled) { /* no probing while the step time stays near the settled one */
        if (fabs(window_t - t->best_t) <= t->best_t * LANE_TUNE_DRIFT) return;
        t->settled = 0; /* it moved (the cache, the text, the machine): search again from here */
        t->f = LANE_TUNE_F0;
        t->dir = 0;
    }
    if (t->dir == 0) { /* the center, measured again (the best time drifts with the cache and the text) */
        t->best_t = window_t;
        t->dir = 1;
        t->flat = 0;
    } else if (window_t < t->best_t * (1 - LANE_TUNE_EPS)) { /* better: move there, go on the same way */
        t->center = t->scale;
        t->best_t = window_t;
        t->flat = 0;
    } else if (window_t <= t->best_t * (1 + LANE_TUNE_EPS) && t->flat < LANE_TUNE_FLAT) {
        /* as good (the split of whole experts may not have changed): move there, go on */
        t->center = t->scale;
        t->flat++;
    } else if (t->dir == 1) { /* not better up: try down */
        t->dir = -1;
        t->flat = 0;
    } else if (t->f <= LANE_TUNE_F_MIN) { /* neither way at the smallest step: settled at the center */
        t->settled = 1;
        t->dir = 0;
        t->scale = t->center;
        return;
    } else { /* neither way: a smaller step, from the center measured again */
        t->f = sqrt(t->f);
        if (t->f < LANE_TUNE_F_MIN) t->f = LANE_TUNE_F_MIN;
        t->dir = 0;
    }
    const double next = t->dir == 0 ? t->center : t->center * (t->dir > 0 ? t->f : 1 / t->f);
    t->scale = clamp_scale(next);
    if (t->dir != 0 && t->scale == t->center) { /* at the bound that way: the other way, or measure the center */
        if (t->dir == 1) t->dir = -1, t->scale = clamp_scale(t->center / t->f);
        if (t->scale == t->center) t->dir = 0;
    }
}

lane_rates lane_tune_rates(const lane_tune *t, const lane_rates *r) {
    lane_rates s = *r;
    s.pcie_bw = r->pcie_bw / t->scale;
    s.pcie_lat = r->pcie_lat * t->scale;
    s.pcie_layer = r->pcie_layer * t->scale;
    return s;
}
