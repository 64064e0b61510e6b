/* A persistent pool of worker threads with a parallel-for.
 *
 * Decode calls a parallel-for hundreds of times per token (one per matrix
 * product), so what matters is the latency of one dispatch, not throughput of
 * a queue. The pool therefore has no queue: st_pool_run() publishes one job
 * (function, context, task count), bumps a generation counter, and every
 * thread, the caller included, claims task indices from one atomic word
 * until they run out; the call returns when every task has finished, without
 * waiting for workers that took none (one the OS has descheduled does not
 * hold up the call). Idle workers spin for a short while (a few tens of
 * microseconds, st_pool_set_spin_us) before sleeping on a futex, so that back
 * to back calls cost a few microseconds and an idle process costs no CPU.
 *
 * One caller at a time: st_pool_run() must not be called concurrently on the
 * same pool, nor from inside one of its tasks (checked, aborts).
 */
#ifndef STRATA_CORE_THREADPOOL_H
#define STRATA_CORE_THREADPOOL_H

#include <stdint.h>

typedef struct st_pool st_pool;

/* Runs task `task` (0 <= task < n_tasks) on thread `thread` (0 = the caller,
 * 1..n_threads-1 = workers); thread lets tasks index per-thread scratch. */
typedef void (*st_pool_fn)(void *ctx, int64_t task, int thread);

/* A pool of n_threads threads in all, the caller counted: n_threads - 1 are
 * started. n_threads <= 0 means the number of online cores. Never NULL. */
st_pool *st_pool_init(int n_threads);
/* Stops and joins the workers. NULL is a no-op. */
void st_pool_free(st_pool *pool);

/* Threads in the pool, the caller counted; 1 for a NULL pool. */
int st_pool_n_threads(const st_pool *pool);

/* Calls fn(ctx, i, thread) once for every i in [0, n_tasks) and returns when
 * all calls have returned. Tasks are handed out in increasing order from an
 * atomic counter; which thread runs which task is not fixed. A NULL pool runs
 * every task on the calling thread (thread index 0). */
void st_pool_run(st_pool *pool, int64_t n_tasks, st_pool_fn fn, void *ctx);

/* How long an idle worker (and the caller waiting for stragglers) spins before
 * sleeping. Longer: lower latency for bursty callers, more CPU burnt while
 * idle. Default 50 us. */
void st_pool_set_spin_us(st_pool *pool, int us);

/* The cores this process can use (at least 1): those of its CPU affinity
 * mask, and no more than its cgroup's CPU quota allows (a container started
 * with --cpus=2 on a 16-core host: 2). The default thread count. */
int st_cpu_count(void);
/* n cores, limited by a CFS quota of `quota` per `period` (rounded up);
 * quota or period <= 0: no limit. */
int st_cpu_quota_limit(int n, long quota, long period);

#endif
