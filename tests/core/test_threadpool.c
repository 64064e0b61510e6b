/* Thread pool: every task index runs exactly once, on a valid thread index,
 * and st_pool_run() returns only after all of them ran; over many rounds
 * (which exercises the generation handshake and the spin/sleep switch), for
 * n_tasks 0, 1, a few, and a million, and for pools of 1..8 threads and a
 * NULL pool; and with six threads held to one core, where workers are
 * mostly descheduled and wake after their job's tasks ran out or while a
 * newer job runs. Prints the measured dispatch latency and the one-core time
 * per call (not asserted: the test machine is shared).
 */
#include "core/threadpool.h"

#include "core/alloc.h"
#include "core/timer.h"

#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "../common/check.h"

typedef struct {
    _Atomic int *hits;          /* (n_tasks) times each task ran */
    _Atomic int bad_thread;     /* task ran with a thread index out of range */
    _Atomic int64_t thread_use; /* bit per thread index that ran a task */
    int n_threads;
    int spin_work; /* busy loop per task, to let others catch up */
} count_ctx;

static void count_task(void *p, int64_t task, int thread) {
    count_ctx *c = p;
    if (thread < 0 || thread >= c->n_threads) atomic_store(&c->bad_thread, 1);
    else atomic_fetch_or(&c->thread_use, (int64_t)1 << thread);
    volatile int sink = 0;
    for (int i = 0; i < c->spin_work; i++) sink += i;
    (void)sink; /* clang: "set but not used" is an error under -Werror */
    atomic_fetch_add_explicit(&c->hits[task], 1, memory_order_relaxed);
}

/* Runs `rounds` jobs of n_tasks and checks each one right after it returns:
 * checking after return is what proves that run() waited for every task. */
static void check_rounds(st_pool *pool, int64_t n_tasks, int rounds, int spin_work) {
    count_ctx c;
    c.hits = st_calloc(n_tasks > 0 ? (size_t)n_tasks : 1, sizeof(_Atomic int));
    atomic_init(&c.bad_thread, 0);
    atomic_init(&c.thread_use, 0);
    c.n_threads = st_pool_n_threads(pool);
    c.spin_work = spin_work;
    for (int r = 0; r < rounds; r++) {
        for (int64_t i = 0; i < n_tasks; i++) atomic_store_explicit(&c.hits[i], 0, memory_order_relaxed);
        st_pool_run(pool, n_tasks, count_task, &c);
        int64_t wrong = 0, first = -1;
        for (int64_t i = 0; i < n_tasks; i++) {
            if (atomic_load_explicit(&c.hits[i], memory_order_relaxed) != 1) {
                if (first < 0) first = i;
                wrong++;
            }
        }
        CHECK(wrong == 0, "threads=%d n_tasks=%lld round %d: %lld tasks not run exactly once (first %lld ran %d times)",
              c.n_threads, (long long)n_tasks, r, (long long)wrong, (long long)first,
              first >= 0 ? atomic_load(&c.hits[first]) : 0);
        if (wrong) break;
    }
    CHECK(!atomic_load(&c.bad_thread), "threads=%d: a task saw a thread index out of range", c.n_threads);
    st_free(c.hits);
}

static void noop_task(void *ctx, int64_t task, int thread) { (void)ctx, (void)task, (void)thread; }

/* Median of the wall time of one st_pool_run of n_threads tiny tasks, back to back. */
static double dispatch_us(st_pool *pool, int reps) {
    double *t = st_malloc(sizeof(double) * (size_t)reps);
    for (int r = 0; r < reps; r++) {
        int64_t t0 = st_now_ns();
        st_pool_run(pool, st_pool_n_threads(pool), noop_task, NULL);
        t[r] = (double)(st_now_ns() - t0) * 1e-3;
    }
    /* insertion sort is fine for a few thousand values */
    for (int i = 1; i < reps; i++) {
        double v = t[i];
        int j = i - 1;
        while (j >= 0 && t[j] > v) t[j + 1] = t[j], j--;
        t[j + 1] = v;
    }
    double med = t[reps / 2];
    st_free(t);
    return med;
}

int main(void) {
    /* a NULL pool runs everything inline */
    check_rounds(NULL, 1000, 3, 0);
    printf("null pool: 1000 tasks x 3 rounds ran exactly once each\n");

    for (int n = 1; n <= 8; n++) {
        st_pool *pool = st_pool_init(n);
        CHECK(st_pool_n_threads(pool) == n, "n_threads %d != %d", st_pool_n_threads(pool), n);
        /* fewer rounds when threads outnumber cores: spinning workers then
         * take turns with the caller, and each round costs time slices */
        int rounds = n <= st_cpu_count() ? 2000 : 300;
        check_rounds(pool, 0, 10, 0);
        check_rounds(pool, 1, 1000, 0);
        check_rounds(pool, 3, rounds, 0);
        check_rounds(pool, 97, rounds, 50);
        check_rounds(pool, 1000000, 2, 0);
        /* spin 0: every wait ends in a futex sleep, which tests the wake-up path */
        st_pool_set_spin_us(pool, 0);
        check_rounds(pool, 7, rounds, 0);
        /* idle long enough between runs that the workers go to sleep */
        st_pool_set_spin_us(pool, 20);
        for (int r = 0; r < 20; r++) {
            struct timespec ts = {0, 200 * 1000};
            nanosleep(&ts, NULL);
            check_rounds(pool, 33, 1, 10);
        }
        st_pool_set_spin_us(pool, 50);
        printf("threads=%d: n_tasks 0/1/3/97/1e6, spin and sleep paths: every task ran exactly once\n", n);
        st_pool_free(pool);
    }

    /* the quota arithmetic of st_cpu_count */
    CHECK(st_cpu_quota_limit(16, 200000, 100000) == 2, "--cpus=2 on 16 cores");
    CHECK(st_cpu_quota_limit(16, 150000, 100000) == 2, "1.5 cores rounds up to 2 threads");
    CHECK(st_cpu_quota_limit(16, 50000, 100000) == 1, "half a core is 1 thread");
    CHECK(st_cpu_quota_limit(4, 800000, 100000) == 4, "a quota above the cores does not add any");
    CHECK(st_cpu_quota_limit(8, -1, 100000) == 8 && st_cpu_quota_limit(8, 0, 0) == 8, "no quota: all cores");
    printf("st_cpu_count: %d cores usable here (affinity mask and cgroup quota)\n", st_cpu_count());

    /* the default pool uses every core; use it to report dispatch latency */
    st_pool *pool = st_pool_init(0);
    CHECK(st_pool_n_threads(pool) == st_cpu_count(), "default pool has %d threads, %d cores", st_pool_n_threads(pool),
          st_cpu_count());
    check_rounds(pool, 4096, 50, 0);
    double us = dispatch_us(pool, 5000);
    printf("default pool: %d threads; dispatch+join of %d empty tasks, median %.2f us\n", st_pool_n_threads(pool),
           st_pool_n_threads(pool), us);
    st_pool_free(pool);

    /* six threads on one core: most calls find the workers off the core, so
     * they wake late, after the tasks ran out or during a newer call. Every
     * task still runs exactly once; and a call no longer waits for workers
     * that took no task (each used to acknowledge every call) */
    cpu_set_t all, one;
    CPU_ZERO(&one);
    CPU_SET(sched_getcpu() >= 0 ? sched_getcpu() : 0, &one);
    if (sched_getaffinity(0, sizeof all, &all) != 0 || sched_setaffinity(0, sizeof one, &one) != 0) {
        printf("6 threads on one core: SKIPPED, this system refused to set the thread's CPU affinity\n");
    } else {
        st_pool *p = st_pool_init(6); /* the workers inherit the one-core mask */
        int64_t t0 = st_now_ns();
        check_rounds(p, 8, 2000, 0);
        double us = (double)(st_now_ns() - t0) / 1e3 / 2000;
        check_rounds(p, 97, 200, 50);
        st_pool_free(p);
        CHECK(sched_setaffinity(0, sizeof all, &all) == 0, "restoring the affinity failed");
        printf("6 threads on one core: 8 and 97 tasks a call ran exactly once; %.1f us per call of 8 empty tasks\n",
               us);
    }

    /* pools can be created and freed repeatedly (threads joined, nothing leaked) */
    for (int i = 0; i < 50; i++) {
        st_pool *p = st_pool_init(3);
        check_rounds(p, 5, 1, 0);
        st_pool_free(p);
    }
    printf("50 init/run/free cycles of a 3-thread pool\n");
    st_pool_free(NULL);

    return check_report("test_threadpool");
}
