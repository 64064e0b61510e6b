/* The host tiers of a MoE model's experts (expert_store.c).
 *
 * When the experts the device does not cache are more than --ram-budget
 * allows in host RAM, the plan (expert_plan.h) splits them into a RAM tier,
 * copied at start into an arena (page-locked when the device backend can),
 * and an SSD tier, read from the GGUF file on demand. The store is that
 * split at run time: per (layer, expert) the host address of its three
 * matrices, either in the arena or in a staging buffer that the SSD tier's
 * reads fill.
 *
 * Reads go through io_uring with O_DIRECT (raw syscalls from
 * <linux/io_uring.h>, no library): the page cache is bypassed, so the file's
 * pages of the SSD tier never take RAM and the tier is what the plan says.
 * A matrix sits at any 32-byte offset of the file; the read covers the whole
 * 4 KiB blocks around it and the matrix is addressed inside. When the kernel
 * refuses io_uring (some containers) the same reads are preads; when the file
 * system refuses O_DIRECT (tmpfs) they are buffered: one warning each.
 *
 * A layer's misses are read in one batch: expert_store_begin submits them
 * all and returns; expert_store_wait collects them, so the device's cached
 * experts (and the RAM tier's) compute while the SSD works. Expert e of a
 * layer is staged at position e, so one layer's experts fit at once; the
 * staging is reused by the next layer, which is safe because the lanes read
 * the next layer's routing (a wait on the device) before they begin it.
 */
#ifndef STRATA_ENGINE_EXPERT_STORE_H
#define STRATA_ENGINE_EXPERT_STORE_H

#include <stddef.h>
#include <stdint.h>

#include "backend/backend.h"
#include "model/model.h"

typedef struct expert_store expert_store;

typedef struct {
    uint64_t bytes;    /* bytes read from the file (the whole blocks around each matrix) */
    uint64_t matrices; /* matrices read */
    uint64_t ns;       /* wall time of the read batches, submission to the last completion */
    uint64_t ram;      /* experts asked for and found in the RAM tier */
} expert_store_stats;

/* Keeps the host tiers out of the page cache through the model's mapping.
 * Touching one byte of a mapping makes the kernel read around it (up to
 * read_ahead_kb, 8 MiB on some disks), so the header's parse and a dense
 * tensor's first use pull their neighbours, the experts, into RAM. With
 * tiers, what is read from the mapping (every tensor but the routed
 * experts, and the experts the device caches: slot, n_layer * n_expert,
 * >= 0) is read ahead on purpose (MADV_WILLNEED: fewer faults, so less
 * read-around), and the other experts' pages are dropped from the page
 * cache. release: once the dense weights are placed and the device's cache
 * is filled (nothing reads the mapping's experts after that), every
 * expert's pages are dropped, what the read-around of those copies brought
 * in included. (MADV_RANDOM would stop the read-around, but here it made
 * placing 0.5 GB of dense weights take 13 s of 4 KiB faults instead of
 * 0.5 s.) 0, or -1 with st_error. */
int expert_store_advise(const model *m, const int32_t *slot, int release);

/* Host bytes of one expert in the RAM arena: its three matrices, each at a
 * 64-byte boundary, for the largest layer (what --ram-budget counts). */
size_t expert_store_expert_bytes(const model *m);
/* Host bytes of the SSD tier's staging: a slot of expert_store_expert_bytes
 * for each expert of a layer, and a spare one (expert_store_expert): host
 * RAM that --ram-budget counts beside the RAM tier's arena. */
size_t expert_store_staging_bytes(const model *m);

/* Opens m's file for direct reads and fills the RAM tier: in_ram (n_layer *
 * n_expert, 1 = RAM tier) copied into an arena read from the file. dev: the
 * device backend whose host_register page-locks the arena and the staging
 * (NULL or pin 0: left pageable; one warning when the system refuses).
 * NULL with st_error when the file cannot be opened or memory is short. */
expert_store *expert_store_open(const model *m, const uint8_t *in_ram, st_backend *dev, int pin);
void expert_store_close(expert_store *s);

/* Submits the reads of layer il's experts list[0..n) that the RAM tier does
 * not hold, and returns. */
void expert_store_begin(expert_store *s, int il, const int *list, int n);
/* Waits for the first n experts of the list only (the PCIe lane's, listed
 * first), and gives the views as expert_store_wait does. */
void expert_store_wait_first(expert_store *s, int il, int n, const st_weight **g, const st_weight **u,
                             const st_weight **d);
/* The CPU lane over the batch as its reads complete: the experts of map
 * (n_expert values, e or -1, as moe_experts takes it) computed by cpu in
 * groups, each group as soon as its matrices are in, so that the lane
 * computes while the SSD reads; out (n_tok x n_embd, host) = their sum.
 * Groups sum in another order than one call would (float rounding); with
 * every expert at hand it is one call. */
void expert_store_cpu_lane(expert_store *s, st_backend *cpu, int il, const float *x, int n_tok, int k,
                           const int32_t *sel, const float *wsel, const int32_t *map, st_act act, int64_t n_embd,
                           float *out);
/* Waits for them. *g, *u, *d: the layer's host weights (the model's shapes
 * and types, one pointer per expert) in which every expert of the batch and
 * of the RAM tier is readable until the next expert_store_begin. */
void expert_store_wait(expert_store *s, int il, const st_weight **g, const st_weight **u, const st_weight **d);
/* One expert's gate, up and down: in RAM, staged by the current batch, or
 * read now into a spare buffer that stays until the next call of this. */
void expert_store_expert(expert_store *s, int il, int e, const void *mat[3]);

const expert_store_stats *expert_store_stats_get(const expert_store *s);
/* How the reads go: "io_uring, O_DIRECT", "pread, buffered", ... */
const char *expert_store_mode(const expert_store *s);
/* The sequential read rate of the same reads (bytes/s): `bytes` of the file
 * from the first routed tensor on, in 4 MiB reads, 64 in flight (a
 * layer's reads go so), into the staging. Measures the disk, not the page cache, when O_DIRECT holds. */
double expert_store_seq_rate(expert_store *s, size_t bytes);
/* A host buffer of the store (the staging, page-locked when it could be)
 * and its size, for timing copies to the device without the file's pages. */
void *expert_store_scratch(expert_store *s, size_t *bytes);

#endif
