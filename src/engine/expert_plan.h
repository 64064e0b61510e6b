/* The memory plan of a device and the expert placement table (expert_plan.c).
 *
 * A MoE model's routed experts are most of its bytes. The plan splits the
 * device budget into what every token needs (dense weights, KV caches,
 * scratch) and an expert cache of slots, each holding one (layer, expert)
 * gate/up/down triple; the rest of the experts stay in host RAM, where the
 * CPU expert lane computes them or from where they are streamed over PCIe
 * (engine/moe_lanes.c). The placement table says, per (layer, expert),
 * which slot of its layer holds it on the device, or -1.
 *
 * The cost model picks, per uncached expert of a step, the lane that
 * finishes the layer soonest: the CPU lane reads the expert's bytes from RAM
 * and does the step's products on its cores; the PCIe lane copies the bytes
 * to the device, where the products are free by comparison. Both lanes run
 * at once, so the choice balances their two totals.
 */
#ifndef STRATA_ENGINE_EXPERT_PLAN_H
#define STRATA_ENGINE_EXPERT_PLAN_H

#include <stddef.h>
#include <stdint.h>

typedef struct {
    size_t budget;  /* bytes the engine may allocate on the device */
    size_t dense;   /* every weight but the routed experts */
    size_t kv;      /* the KV caches of every sequence */
    size_t scratch; /* activations and the ops' scratch (an estimate) */
    size_t expert;  /* one (layer, expert): its gate, up and down matrices */
    int n_layer, n_expert;
    int n_dense_lead; /* the first layer with experts: those before have a dense FFN (glm4moe) or belong to
                         another rank of a layer split; no experts, no slots */
    int routed_end;   /* one past the last layer with experts (0: n_layer); the rest another rank's */
    long cache;       /* expert cache slots asked for; -1: as many as fit */
    /* the host tiers (expert_store.h) */
    size_t ram_budget;   /* bytes the host experts may hold in RAM (--ram-budget); 0: no limit */
    size_t host_expert;  /* bytes of one expert in the RAM tier's arena (expert_store_expert_bytes) */
    size_t host_staging; /* host bytes of the SSD tier's staging (expert_store_staging_bytes): with
                            tiers, part of ram_budget */
} expert_plan_in;

typedef struct {
    int all_resident; /* every expert on the device: no lanes, no staging */
    long slots;       /* expert cache slots in all */
    size_t staging;   /* the streaming buffer: one layer's experts (0 when all resident) */
    size_t used;      /* dense + kv + scratch + staging + slots * expert */
    int n_layer, n_expert;
    int *layer_slots; /* (n_layer) slots of each layer */
    int32_t *slot;    /* (n_layer * n_expert) the expert's slot in its layer, or -1 */
    /* Host tiers, when the experts left to the host are more than the RAM
     * budget holds (else in_ram is NULL: every host expert in the mapping) */
    long ram_experts, ssd_experts; /* the RAM tier (an arena) and the SSD tier (read from the file) */
    uint8_t *in_ram;               /* (n_layer * n_expert) 1: the expert is in the RAM tier */
} expert_plan;

/* Makes the plan: 0, or -1 with st_error naming the numbers when the budget
 * cannot hold the dense part (with the staging buffer) or the slots asked
 * for, or the RAM budget the SSD tier's staging. profile (n_layer *
 * n_expert routing counts, or NULL) chooses the cached experts, hottest
 * first over all layers; without one, each layer gets an equal share of
 * the slots, its lowest expert ids. */
int expert_plan_make(const expert_plan_in *in, const uint64_t *profile, expert_plan *out);
/* The host tiers of a plan (expert_plan_make calls it): when the experts
 * not cached on the device take more than in->ram_budget, the SSD tier's
 * staging (in->host_staging) is taken from the budget first, then the RAM
 * tier gets as many as fit at in->host_expert bytes each, the hottest first
 * by the profile, else in (layer, expert) order; the rest are the SSD tier.
 * -1 with st_error when the budget is below the staging. */
int expert_plan_host_tiers(const expert_plan_in *in, const uint64_t *profile, expert_plan *out);
void expert_plan_free(expert_plan *p);
/* The plan in words, a line at a time (GiB): the budget's parts, and where
 * the uncached experts are. _log: each line at INFO, "memory plan: ...". */
void expert_plan_describe(const expert_plan *p, const expert_plan_in *in, void (*line)(void *ctx, const char *text),
                          void *ctx);
void expert_plan_log(const expert_plan *p, const expert_plan_in *in);

/* ---- cost model ---- */

typedef struct {
    double cpu_bw;     /* bytes/s the CPU lane reads expert weights at */
    double cpu_flops;  /* multiply-adds x 2 per second of the CPU lane's products */
    double pcie_bw;    /* bytes/s host -> device */
    double pcie_lat;   /* seconds of fixed cost per expert sent */
    double pcie_layer; /* seconds of fixed cost per layer that sends any (a second expert pass, the add) */
    double cpu_row;    /* seconds per token row of a layer that uses the CPU lane (its input down, output up) */
    double pcie_frac;  /* < 0: the model decides; else this share of the misses goes over PCIe */
} lane_rates;

/* Assigns n uncached experts of one layer of n_rows tokens to the lanes:
 * expert i has bytes[i] of weights and n_tok[i] tokens, flops_tok per token; to_pcie[i]
 * = 1 sends it over PCIe, 0 to the CPU lane. Largest first, each to the
 * lane that then finishes sooner; then the split, all on the CPU and all
 * over PCIe are compared with the PCIe lane's per-layer cost added, and the
 * cheapest is taken. Returns the modelled time of the layer's misses (the
 * later of the two lanes), in seconds. */
double lane_split(const lane_rates *r, int n, const double *bytes, const int *n_tok, double flops_tok, int n_rows,
                  uint8_t *to_pcie);

/* The split tuned on the measured decode time. The start-up rates are each
 * lane's alone; decoding, both lanes read host memory at once and share
 * its bandwidth, so the modelled split can be far from the fastest (the
 * DeepSeek V3 shape on the H200: 66.8 tok/s as modelled, 85.0 with a
 * quarter of the misses over PCIe). lane_tune scales the PCIe lane's
 * modelled cost (its rate divided by `scale`, its fixed costs times it)
 * by a pattern search in log steps: the mean step time of a window at the
 * current scale, then one step up, then one down; a better window (by more
 * than LANE_TUNE_EPS) moves there and goes on the same way, and so does an
 * as good one, up to LANE_TUNE_FLAT times (a split of whole experts changes
 * only every few steps of the scale); neither: the step shrinks, and at
 * LANE_TUNE_F_MIN the search settles (no more probe windows, which cost
 * when the split is already the best) until a window's time moves from
 * the settled one by more than LANE_TUNE_DRIFT. scale stays within
 * [1/LANE_TUNE_MAX, LANE_TUNE_MAX]. */
#define LANE_TUNE_EPS   0.02
#define LANE_TUNE_F0    1.5
#define LANE_TUNE_F_MIN 1.1
#define LANE_TUNE_MAX   16.0
#define LANE_TUNE_FLAT  3
#define LANE_TUNE_DRIFT 0.10
typedef struct {
    double scale;  /* the factor to use now */
    double center; /* the best factor so far, and its window's time */
    double best_t;
    double f;    /* the step */
    int dir;     /* what the window under way measures: 0 the center, 1 one step up, -1 one step down */
    int flat;    /* steps taken on as-good windows in a row */
    int settled; /* the search ended at center (best_t its time) */
} lane_tune;

void lane_tune_init(lane_tune *t);
/* window_t: the mean decode step time (s) measured at t->scale. */
void lane_tune_step(lane_tune *t, double window_t);
/* r with the PCIe lane's cost scaled by t->scale. */
lane_rates lane_tune_rates(const lane_tune *t, const lane_rates *r);

#endif
