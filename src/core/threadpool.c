/* Thread pool (see threadpool.h): one job at a time, published through a
 * generation counter, tasks claimed from one atomic word.
 *
 * The claim word packs (task count, next task) of the current job: a
 * fetch-add takes the next task together with the count it belongs to, so a
 * thread holding the old word's view can never mistake another job's tasks.
 * A thread reads the job's function and context only after it took a task
 * below the count (an unfinished task of that job), and the caller rewrites
 * them only once every task has finished (the done counter reaches the
 * count). So a worker that wakes late, after the tasks ran out or once a
 * newer job is out, at worst takes a task of the newer job, which is right;
 * and the caller waits for the tasks, not for the workers: a worker the OS
 * has descheduled (more threads than free cores) no longer holds up every
 * call until it runs again, as it did when every worker had to acknowledge
 * every job.
 *
 * Handshake, per st_pool_run() (per chunk of at most CLAIM_MAX_TASKS tasks):
 *   caller: write fn, ctx, base; done = 0; claim = (n, 0) (release);
 *           gen++, wake sleepers; take tasks itself; wait until done == n.
 *   worker: wait until gen changes (spin, then futex); take tasks while the
 *           one it gets is below the count; then done += the tasks it ran
 *           (release).
 *
 * Sleeping on both sides uses the Dekker pattern on sequentially consistent
 * atomics: the sleeper announces itself, then re-checks the condition; the
 * waker changes the condition, then looks for sleepers. One of the two always
 * sees the other, so no wake-up is lost, and nobody pays for a futex syscall
 * when nobody sleeps.
 */
#include "core/threadpool.h"

#include "core/alloc.h"
#include "core/log.h"
#include "core/timer.h"

#include <limits.h>
#include <linux/futex.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

#define CACHE_LINE 64

/* A chunk's task count fits the word's upper half, and the lower half (the
 * next task) cannot wrap: it passes the count by at most one per thread. */
#define CLAIM_MAX_TASKS ((int64_t)1 << 31)
static uint64_t claim_word(int64_t n) { return (uint64_t)n << 32; }

struct st_pool {
    int n_threads;           /* caller included */
    pthread_t *threads;      /* (n_threads - 1) workers */
    _Atomic int64_t spin_ns; /* read by idle workers while the owner may change it */

    /* The job; plain fields, published by the release on claim, read only
     * by a thread that holds an unfinished task of it. */
    st_pool_fn fn;
    void *ctx;
    int64_t base; /* task index of the chunk's first task */

    /* Each hot atomic on its own cache line, so that workers polling gen do
     * not slow down the fetch-adds on claim and done. */
    _Alignas(CACHE_LINE) _Atomic uint32_t gen; /* futex word the workers sleep on */
    _Atomic int n_sleeping;                    /* workers inside (or about to enter) futex wait */
    _Atomic int quit;
    _Alignas(CACHE_LINE) _Atomic uint64_t claim; /* task count << 32 | next task */
    _Alignas(CACHE_LINE) _Atomic uint32_t done;  /* tasks finished; futex word of the caller */
    _Atomic int caller_sleeping;
    _Atomic int busy; /* catches concurrent or nested st_pool_run */
};

typedef struct {
    st_pool *pool;
    int index;
} worker_arg;

static void futex_wait(_Atomic uint32_t *addr, uint32_t expected) {
    /* Returns at once if *addr != expected; spurious wake-ups are handled by the callers' loops. */
    syscall(SYS_futex, (uint32_t *)addr, FUTEX_WAIT_PRIVATE, expected, NULL, NULL, 0);
}

static void futex_wake(_Atomic uint32_t *addr, int n) {
    syscall(SYS_futex, (uint32_t *)addr, FUTEX_WAKE_PRIVATE, n, NULL, NULL, 0);
}

static inline void cpu_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    __asm__ __volatile__("yield");
#endif
}

int st_cpu_quota_limit(int n, long quota, long period) {
    if (quota <= 0 || period <= 0) return n;      /* no quota ("max", -1) */
    const long q = (quota + period - 1) / period; /* a quota of 1.5 cores lets 2 threads run */
    return q < n ? (int)q : n;
}

/* The CFS quota of this process's cgroup: v2 "cpu.max" ("QUOTA PERIOD" or "max PERIOD"), else
 * v1 cpu.cfs_quota_us / cpu.cfs_period_us; 0 when none is set or none is readable. */
static void cgroup_quota(long *quota, long *period) {
    *quota = *period = 0;
    FILE *f = fopen("/sys/fs/cgroup/cpu.max", "r");
    if (f) {
        char q[32] = "";
        if (fscanf(f, "%31s %ld", q, period) == 2 && strcmp(q, "max")) *quota = strtol(q, NULL, 10);
        fclose(f);
        return;
    }
    if ((f = fopen("/sys/fs/cgroup/cpu/cpu.cfs_quota_us", "r"))) {
        if (fscanf(f, "%ld", quota) != 1) *quota = 0;
        fclose(f);
    }
    if ((f = fopen("/sys/fs/cgroup/cpu/cpu.cfs_period_us", "r"))) {
        if (fscanf(f, "%ld", period) != 1) *period = 0;
        fclose(f);
    }
}

int st_cpu_count(void) {
    cpu_set_t set; /* the cores this process may run on (taskset, cpusets), not all online ones */
    long n = sched_getaffinity(0, sizeof set, &set) == 0 ? CPU_COUNT(&set) : sysconf(_SC_NPROCESSORS_ONLN);
    if (n < 1) n = 1;
    long quota, period;
    cgroup_quota(&quota, &period);
    return st_cpu_quota_limit((int)n, quota, period);
}

/* Takes and runs tasks of the current job until none is left. */
static void run_tasks(st_pool *pool, int thread) {
    uint32_t ran = 0, n = 0;
    for (;;) {
        /* acquire: the job's fields, written before the release that published the word */
        const uint64_t w = atomic_fetch_add_explicit(&pool->claim, 1, memory_order_acquire);
        n = (uint32_t)(w >> 32);
        if ((uint32_t)w >= n) break;
        pool->fn(pool->ctx, pool->base + (uint32_t)w, thread);
        ran++;
    }
    /* All of them in one job: the next one is published only once done reaches this count.
     * seq_cst: the release of the results, then the sleeper check (Dekker, see above). */
    if (ran && atomic_fetch_add(&pool->done, ran) + ran == n && thread != 0 && atomic_load(&pool->caller_sleeping))
        futex_wake(&pool->done, 1);
}

/* Waits until gen differs from seen; returns the new value. */
static uint32_t wait_generation(st_pool *pool, uint32_t seen) {
    uint32_t g;
    int64_t deadline = 0;
    for (unsigned spins = 0;; spins++) {
        g = atomic_load_explicit(&pool->gen, memory_order_acquire);
        if (g != seen) return g;
        cpu_relax();
        if ((spins & 63) == 63) {
            /* reading the clock every 64 pauses keeps its cost out of the latency */
            int64_t now = st_now_ns();
            if (!deadline) deadline = now + atomic_load_explicit(&pool->spin_ns, memory_order_relaxed);
            else if (now >= deadline) break;
        }
    }
    atomic_fetch_add(&pool->n_sleeping, 1);
    while ((g = atomic_load(&pool->gen)) == seen) futex_wait(&pool->gen, seen);
    atomic_fetch_sub(&pool->n_sleeping, 1);
    return g;
}

static void *worker_main(void *p) {
    worker_arg arg = *(worker_arg *)p;
    st_free(p);
    st_pool *pool = arg.pool;
    uint32_t seen = 0; /* gen starts at 0 and is bumped once per job */
    for (;;) {
        seen = wait_generation(pool, seen);
        if (atomic_load_explicit(&pool->quit, memory_order_acquire)) break;
        run_tasks(pool, arg.index);
    }
    return NULL;
}

st_pool *st_pool_init(int n_threads) {
    if (n_threads <= 0) n_threads = st_cpu_count();
    st_pool *pool = st_calloc(1, sizeof *pool);
    pool->n_threads = n_threads;
    atomic_init(&pool->spin_ns, 50 * 1000);
    atomic_init(&pool->gen, 0);
    atomic_init(&pool->n_sleeping, 0);
    atomic_init(&pool->quit, 0);
    atomic_init(&pool->claim, claim_word(0));
    atomic_init(&pool->done, 0);
    atomic_init(&pool->caller_sleeping, 0);
    atomic_init(&pool->busy, 0);
    pool->threads = st_calloc(n_threads > 1 ? (size_t)(n_threads - 1) : 1, sizeof(pthread_t));
    for (int i = 1; i < n_threads; i++) {
        worker_arg *arg = st_malloc(sizeof *arg);
        arg->pool = pool;
        arg->index = i;
        int rc = pthread_create(&pool->threads[i - 1], NULL, worker_main, arg);
        ST_ASSERT(rc == 0); /* failing to start a handful of threads is not recoverable */
        char name[32];      /* the kernel keeps 15 characters */
        snprintf(name, sizeof name, "strata-pool-%d", i % 1000);
        name[15] = 0;
        pthread_setname_np(pool->threads[i - 1], name);
    }
    return pool;
}

void st_pool_free(st_pool *pool) {
    if (!pool) return;
    ST_ASSERT(atomic_load(&pool->busy) == 0);
    atomic_store(&pool->quit, 1);
    atomic_fetch_add(&pool->gen, 1);
    futex_wake(&pool->gen, INT_MAX);
    for (int i = 1; i < pool->n_threads; i++) pthread_join(pool->threads[i - 1], NULL);
    st_free(pool->threads);
    st_free(pool);
}

int st_pool_n_threads(const st_pool *pool) { return pool ? pool->n_threads : 1; }

void st_pool_set_spin_us(st_pool *pool, int us) {
    if (pool) atomic_store_explicit(&pool->spin_ns, (int64_t)(us < 0 ? 0 : us) * 1000, memory_order_relaxed);
}

void st_pool_run(st_pool *pool, int64_t n_tasks, st_pool_fn fn, void *ctx) {
    if (n_tasks <= 0) return;
    if (!pool || pool->n_threads == 1 || n_tasks == 1) {
        /* waking workers for a single task would only add latency */
        for (int64_t i = 0; i < n_tasks; i++) fn(ctx, i, 0);
        return;
    }
    ST_ASSERT(atomic_exchange(&pool->busy, 1) == 0);
    pool->fn = fn;
    pool->ctx = ctx;
    for (int64_t base = 0; base < n_tasks; base += CLAIM_MAX_TASKS) {
        const int64_t n = n_tasks - base < CLAIM_MAX_TASKS ? n_tasks - base : CLAIM_MAX_TASKS;
        pool->base = base; /* the previous chunk's tasks have all finished: nobody reads it */
        atomic_store_explicit(&pool->done, 0, memory_order_relaxed);
        atomic_store_explicit(&pool->claim, claim_word(n), memory_order_release);
        atomic_fetch_add(&pool->gen, 1); /* seq_cst: wakes the workers, then the sleeper check below */
        if (atomic_load(&pool->n_sleeping) > 0) futex_wake(&pool->gen, INT_MAX);

        run_tasks(pool, 0);

        /* Wait for the tasks other threads took: spin first (they are usually
         * finishing them), then sleep. */
        int64_t deadline = 0;
        uint32_t d;
        for (unsigned spins = 0; (d = atomic_load_explicit(&pool->done, memory_order_acquire)) != (uint32_t)n;
             spins++) {
            cpu_relax();
            if ((spins & 63) == 63) {
                int64_t now = st_now_ns();
                if (!deadline) deadline = now + atomic_load_explicit(&pool->spin_ns, memory_order_relaxed);
                else if (now >= deadline) {
                    atomic_store(&pool->caller_sleeping, 1);
                    while ((d = atomic_load(&pool->done)) != (uint32_t)n) futex_wait(&pool->done, d);
                    atomic_store(&pool->caller_sleeping, 0);
                    break;
                }
            }
        }
    }
    atomic_store_explicit(&pool->busy, 0, memory_order_release);
}
