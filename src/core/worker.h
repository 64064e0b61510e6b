/* One helper thread that runs one job at a time for its owner, who posts
 * it, does other work, then waits for it: the expert lanes hand the CPU
 * lane's products to it and queue the GPU's part of the layer meanwhile.
 * The thread spins for a while after each job (a layer comes every few
 * hundred microseconds in decode) before sleeping on a futex.
 *
 * One owner: post and wait alternate, from one thread.
 */
#ifndef STRATA_CORE_WORKER_H
#define STRATA_CORE_WORKER_H

typedef struct st_worker st_worker;

/* Starts the thread; spin_us: how long it stays awake after a job. */
st_worker *st_worker_start(int spin_us);
/* Runs fn(arg) on the thread; returns at once. The previous job must have
 * been waited for. */
void st_worker_post(st_worker *w, void (*fn)(void *arg), void *arg);
/* Returns when the posted job has finished (at once when none is). */
void st_worker_wait(st_worker *w);
/* Joins the thread (after waiting for a posted job). NULL is a no-op. */
void st_worker_stop(st_worker *w);

#endif
