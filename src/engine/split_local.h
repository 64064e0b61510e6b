/* A layer split inside one process (`--devices LIST`, docs/multi.md): rank
 * r runs a contiguous range of layers on device r of the list, each rank an
 * engine of its own on a thread of its own, with its own backend, memory,
 * KV caches and choices; rank 0 is the caller's engine (the tokens, the
 * output head, the scheduler). The commands and the residual stream's ring
 * are the MPI split's (split.h), over in-process queues. */
#ifndef STRATA_ENGINE_SPLIT_LOCAL_H
#define STRATA_ENGINE_SPLIT_LOCAL_H

#include "engine/engine.h"
#include "engine/split.h"

typedef struct split_local split_local;

/* "1,0", "cpu,cpu", "0,cpu": device r of rank r (-1 the CPU) into devs
 * (max entries). The count, or -1 with st_error naming the problem. */
int split_parse_devices(const char *spec, int *devs, int max);

/* Threads of each CPU rank when -t is not given: the cores split evenly
 * among the n_cpu CPU ranks (at least one each). */
int split_rank_threads(int n_cpu);

/* Rank 0 (engine_open): starts ranks 1..n-1, each opening p's model on
 * devs[r] with its share of the layers, and waits until each has opened.
 * *net0: rank 0's transport. NULL when one failed (st_error names the rank
 * and why; the others are stopped; *net0 is left as it was). */
split_local *split_local_start(const engine_params *p, const int *devs, int n, split_net **net0);

/* A follower, its engine open on backend be: tells rank 0 (nothing over MPI). */
void split_local_ready(split_net *net, st_backend *be);

/* Rank r's backend (0 is rank 0's own), for a choice made on one rank from
 * outside (a variant forced on one device, tests); NULL when r is out of range. */
st_backend *split_local_backend(const split_local *l, int r);

/* Rank 0's engine closing: stop the followers, wait for them, free. */
void split_local_stop(split_local *l);

#endif
