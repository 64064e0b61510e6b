/* Thread pool (see threadpool.h): one job at a time, published through a
 * generation counter, tasks handed out by an atomic counter.
 *
 * Handshake, per st_pool_run():
 *   caller: write job fields, next = 0, pending = workers,
 *           gen++ (the release that publishes the job), wake sleepers,
 *           run tasks itself, then wait until pending == 0.
 *   worker: wait until gen changes (spin, then futex), run tasks,
 *           pending-- (the release that publishes its results).
 * Every worker takes part in every generation, even when the tasks ran out
 * before it woke: the caller cannot reuse the job fields before all workers
 * have let go of them, and waiting for the acknowledgements is what proves it.
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
#include <stdatomic.h>
#include <stdio.h>
#include <sys/syscall.h>
#include <unistd.h>

#define CACHE_LINE 64

struct st_pool {
    int n_threads;       /* caller included */
    pthread_t *threads;  /* (n_threads - 1) workers */
    _Atomic int64_t spin_ns; /* read by idle workers while the owner may change it */

    /* The job; plain fields, published by the release on gen. */
    st_pool_fn fn;
    void *ctx;
    int64_t n_tasks;

    /* Each hot atomic on its own cache line, so that workers polling gen do
     * not slow down the fetch-adds on next or the decrements on pending. */
    _Alignas(CACHE_LINE) _Atomic uint32_t gen; /* futex word the workers sleep on */
    _Atomic int n_sleeping;                    /* workers inside (or about to enter) futex wait */
    _Atomic int quit;
    _Alignas(CACHE_LINE) _Atomic int64_t next; /* next task index to hand out */
    _Alignas(CACHE_LINE) _Atomic uint32_t pending; /* workers not yet done; futex word of the caller */
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

int st_cpu_count(void) {
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    return n > 0 ? (int)n : 1;
}

static void run_tasks(st_pool *pool, int thread) {
    const int64_t n = pool->n_tasks;
    st_pool_fn fn = pool->fn;
    void *ctx = pool->ctx;
    for (;;) {
        /* relaxed: ordering of results is given by pending (workers) and by
         * the caller's own program order. */
        int64_t i = atomic_fetch_add_explicit(&pool->next, 1, memory_order_relaxed);
        if (i >= n) break;
        fn(ctx, i, thread);
    }
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
        if (atomic_fetch_sub(&pool->pending, 1) == 1 && atomic_load(&pool->caller_sleeping))
            futex_wake(&pool->pending, 1);
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
    atomic_init(&pool->next, 0);
    atomic_init(&pool->pending, 0);
    atomic_init(&pool->caller_sleeping, 0);
    atomic_init(&pool->busy, 0);
    pool->threads = st_calloc(n_threads > 1 ? (size_t)(n_threads - 1) : 1, sizeof(pthread_t));
    for (int i = 1; i < n_threads; i++) {
        worker_arg *arg = st_malloc(sizeof *arg);
        arg->pool = pool;
        arg->index = i;
        int rc = pthread_create(&pool->threads[i - 1], NULL, worker_main, arg);
        ST_ASSERT(rc == 0); /* failing to start a handful of threads is not recoverable */
        char name[32]; /* the kernel keeps 15 characters */
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
    pool->n_tasks = n_tasks;
    atomic_store_explicit(&pool->next, 0, memory_order_relaxed);
    atomic_store_explicit(&pool->pending, (uint32_t)(pool->n_threads - 1), memory_order_relaxed);
    atomic_fetch_add(&pool->gen, 1); /* seq_cst: publishes the job, then the sleeper check below */
    if (atomic_load(&pool->n_sleeping) > 0) futex_wake(&pool->gen, INT_MAX);

    run_tasks(pool, 0);

    /* Wait for the workers' acknowledgements: spin first (they are usually
     * finishing their last task), then sleep. */
    int64_t deadline = 0;
    for (unsigned spins = 0; atomic_load_explicit(&pool->pending, memory_order_acquire) != 0; spins++) {
        cpu_relax();
        if ((spins & 63) == 63) {
            int64_t now = st_now_ns();
            if (!deadline) deadline = now + atomic_load_explicit(&pool->spin_ns, memory_order_relaxed);
            else if (now >= deadline) {
                atomic_store(&pool->caller_sleeping, 1);
                uint32_t p;
                while ((p = atomic_load(&pool->pending)) != 0) futex_wait(&pool->pending, p);
                atomic_store(&pool->caller_sleeping, 0);
                break;
            }
        }
    }
    atomic_store_explicit(&pool->busy, 0, memory_order_release);
}
