/* Monotonic wall clock for timing. */
#ifndef STRATA_CORE_TIMER_H
#define STRATA_CORE_TIMER_H

#include <stdint.h>
#include <time.h>

static inline int64_t st_now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

static inline double st_now_s(void) { return (double)st_now_ns() * 1e-9; }

#endif
