/* The owner's helper thread (worker.h).
 *
 * state is the futex word: IDLE -> (post) POSTED -> (thread) IDLE, or QUIT.
 * done counts finished jobs; the owner waits for it to reach the count it
 * posted, spinning (the jobs are short) and then sleeping on it.
 */
#include "core/worker.h"

#include <limits.h>
#include <linux/futex.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdint.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "core/alloc.h"
#include "core/log.h"
#include "core/timer.h"

enum { W_IDLE, W_POSTED, W_QUIT };

struct st_worker {
    pthread_t th;
    _Atomic uint32_t state;
    _Atomic uint32_t done; /* jobs finished */
    uint32_t posted;       /* jobs posted (owner only) */
    void (*fn)(void *);
    void *arg;
    int64_t spin_ns;
};

static void fwait(_Atomic uint32_t *a, uint32_t v) {
    syscall(SYS_futex, (uint32_t *)a, FUTEX_WAIT_PRIVATE, v, NULL, NULL, 0);
}
static void fwake(_Atomic uint32_t *a) {
    syscall(SYS_futex, (uint32_t *)a, FUTEX_WAKE_PRIVATE, INT_MAX, NULL, NULL, 0);
}

static inline void relax(void) {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    __asm__ __volatile__("yield");
#endif
}

/* Waits until *a != v: spins for spin_ns, then sleeps on the futex. */
static void wait_change(_Atomic uint32_t *a, uint32_t v, int64_t spin_ns) {
    int64_t deadline = 0;
    for (unsigned i = 0; atomic_load_explicit(a, memory_order_acquire) == v; i++) {
        relax();
        if ((i & 63) != 63) continue;
        const int64_t now = st_now_ns();
        if (!deadline) deadline = now + spin_ns;
        if (now > deadline) {
            while (atomic_load_explicit(a, memory_order_acquire) == v) fwait(a, v);
            return;
        }
    }
}

static void *loop(void *p) {
    st_worker *w = p;
    for (;;) {
        wait_change(&w->state, W_IDLE, w->spin_ns);
        if (atomic_load_explicit(&w->state, memory_order_acquire) == W_QUIT) return NULL;
        w->fn(w->arg);
        atomic_store_explicit(&w->state, W_IDLE, memory_order_relaxed);
        atomic_fetch_add_explicit(&w->done, 1, memory_order_release);
        fwake(&w->done);
    }
}

st_worker *st_worker_start(int spin_us) {
    st_worker *w = st_calloc(1, sizeof *w);
    atomic_init(&w->state, W_IDLE);
    atomic_init(&w->done, 0);
    w->spin_ns = (int64_t)spin_us * 1000;
    const int rc = pthread_create(&w->th, NULL, loop, w);
    ST_ASSERT(rc == 0);
    return w;
}

void st_worker_post(st_worker *w, void (*fn)(void *), void *arg) {
    ST_ASSERT(atomic_load(&w->done) == w->posted); /* the previous job was waited for */
    w->fn = fn;
    w->arg = arg;
    w->posted++;
    atomic_store_explicit(&w->state, W_POSTED, memory_order_release);
    fwake(&w->state);
}

/* The owner yields while it waits rather than spinning: the job's own pool
 * may use every core, and a pool thread descheduled in the middle of a task
 * holds up the whole job. */
void st_worker_wait(st_worker *w) {
    const int64_t deadline = st_now_ns() + w->spin_ns;
    for (uint32_t d; (d = atomic_load_explicit(&w->done, memory_order_acquire)) != w->posted;) {
        if (st_now_ns() < deadline) sched_yield();
        else fwait(&w->done, d);
    }
}

void st_worker_stop(st_worker *w) {
    if (!w) return;
    st_worker_wait(w);
    atomic_store_explicit(&w->state, W_QUIT, memory_order_release);
    fwake(&w->state);
    pthread_join(w->th, NULL);
    st_free(w);
}
