/* The host's read bandwidth, the roofline of CPU decode (cpu_bw.c). */
#ifndef STRATA_BACKEND_CPU_CPU_BW_H
#define STRATA_BACKEND_CPU_CPU_BW_H

#include <stddef.h>
#include <stdint.h>

#include "core/threadpool.h"

/* GB/s (1e9 bytes) at which pool's threads read buf (bytes, faulted in):
 * each thread sums its 1 MiB chunks with SSE2 loads (plain 64-bit loads
 * elsewhere), the best of `passes` passes with and `passes` without
 * software prefetch 4 KiB ahead (the matvec's own prefetch), so that no
 * product can look faster than the memory. */
double cpu_read_bandwidth(st_pool *pool, const uint8_t *buf, size_t bytes, int passes);
/* A buffer of bytes filled from every thread of pool (so its pages are
 * spread as the weights' would be), for cpu_read_bandwidth; st_free it. */
uint8_t *cpu_bw_buffer(st_pool *pool, size_t bytes);

#endif
