/* The expert lanes (moe_lanes.c): a backend that wraps a device backend and
 * runs each MoE layer's experts where the placement table puts them.
 *
 * Every op but moe_ffn goes to the device backend unchanged. moe_ffn splits
 * the layer at the seam (backend.h): routing on the device; the pairs whose
 * expert sits in the device's expert cache computed there; each uncached
 * expert either computed by the CPU expert lane on its host copy (the hidden
 * rows go down, the lane's output comes up) or copied over PCIe into a
 * staging buffer and computed on the device, as the cost model chooses
 * (expert_plan.h). The device's kernels run while the CPU lane works; the
 * outputs are summed on the device.
 *
 * The device may itself be the CPU backend (tests: two CPU backends, one
 * playing the GPU), since the lanes only use backend ops.
 */
#ifndef STRATA_ENGINE_MOE_LANES_H
#define STRATA_ENGINE_MOE_LANES_H

#include <stdint.h>

#include "engine/expert_plan.h"
#include "model/model.h"

typedef struct {
    uint64_t pairs_dev;  /* (token, expert) pairs computed from the device's expert cache */
    uint64_t pairs_cpu;  /* by the CPU lane */
    uint64_t pairs_pcie; /* on the device after the expert was sent over PCIe */
    uint64_t bytes_pcie; /* expert bytes sent */
    uint64_t bytes_cpu;  /* expert bytes the CPU lane read (one read per expert and call) */
    uint64_t layers;     /* MoE layer calls */
    uint64_t experts;    /* distinct experts the tokens of each call chose, summed over the calls */
    uint64_t swaps;      /* cache slots given to a hotter expert (moe_lanes_set_adapt) */
    /* where the host's time in the calls that left the device went (ns):
     * waiting for the routing (the device's work up to it included), the CPU
     * lane's products, handing its output back (a copy that waits for the
     * device's queued lane work), and the whole calls; between the routing
     * and the CPU lane: queueing the device's pairs and the PCIe lane
     * (ns_queue), of which copying the hidden rows to the host (ns_hx) */
    uint64_t ns_route, ns_cpu, ns_join, ns_call, ns_queue, ns_hx;
    uint64_t bytes_ssd; /* bytes the SSD tier read from the file (moe_lanes_set_store) */
    uint64_t ns_ssd;    /* wall time of its read batches (bytes_ssd / ns_ssd: its read rate) */
} moe_lane_stats;

/* Wraps dev: copies the cached experts of m (its host weights, which stay
 * in place for the CPU lane) into slots allocated on dev per plan, and takes
 * cpu (the CPU lane's backend) and dev: destroying the result destroys both.
 * n_rows: the most token rows one call gets (the forward pass's chunk).
 * pinned: host memory dev->host_register'ed for it (unregistered when the
 * result is destroyed), or NULL. */
st_backend *moe_lanes_wrap(st_backend *dev, st_backend *cpu, const model *m, const expert_plan *plan,
                           const lane_rates *rates, int n_rows, const void *pinned);
/* The CPU lane's products on a worker thread from the moment a layer's
 * routing is read, while the calling thread queues the device's part
 * (STRATA_LANE_WORKER; not with a store). The CPU backend's pool should
 * leave a core to each of the two threads. */
void moe_lanes_use_worker(st_backend *be);
/* The cache learns: every `every` steps (a step: a call of the first
 * routed layer), in each layer whose experts are partly cached, the hottest
 * uncached expert takes the slot of the coldest cached one when it is
 * hotter by half. Heat is each expert's routing count, decayed by 0.98 per
 * step. The copy is queued behind the step's work (the slot's old expert
 * is read by what is already queued, then overwritten), and the slot maps
 * change on the host and, by a queued copy, on the device. every 0: off. */
void moe_lanes_set_adapt(st_backend *be, int every);
/* Host tiers (expert_store.h): the lanes read every uncached expert's host
 * copy through the store (RAM arena, or a read from the file into its
 * staging, a layer's misses in one batch submitted before the device's
 * cached pairs are queued) instead of the model's mapping. The lanes own
 * the store from here on (closed with them). */
struct expert_store;
void moe_lanes_set_store(st_backend *be, struct expert_store *store);
/* acc += now - then, counter by counter (what happened between two reads). */
void moe_lane_stats_add(moe_lane_stats *acc, const moe_lane_stats *now, const moe_lane_stats *then);
/* The factor the split's tuning puts on the PCIe lane's modelled cost now
 * (lane_tune; 1 until it has measured); 0 when it does not tune (a fixed
 * --pcie-frac, the CPU as the device, STRATA_LANE_TUNE=0) or be is not the
 * lanes backend. */
double moe_lanes_pcie_scale(const st_backend *be);
/* The counters so far; NULL when be is not the lanes backend. */
const moe_lane_stats *moe_lanes_stats(const st_backend *be);
/* (n_layer * n_expert) routing counts so far of the layers not wholly
 * cached (those route on the host): with --expert-cache 0, every layer's,
 * which is what strata profile records. NULL when be is not the lanes backend. */
const uint64_t *moe_lanes_counts(const st_backend *be);
/* The cache as a layer x expert picture: n_layer * n_expert characters,
 * row by row, each '0' + heat level (0-3: the expert's decayed routing
 * count over its layer's hottest, above 0.05, 0.2, 0.5) + 4 when the
 * device's cache holds it. Layers wholly cached route on the device and
 * keep heat 0. Returns the count written, or -1 (not the lanes backend, or
 * more than cap). */
int moe_lanes_cache_map(const st_backend *be, char *cells, int cap, int *n_layer, int *n_expert);

#endif
