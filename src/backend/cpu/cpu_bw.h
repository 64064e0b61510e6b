/* The CPU's two rooflines (cpu_bw.c): the host's read bandwidth, which bounds
 * decode, and the cores' int8 multiply-add rate, which bounds prompts. */
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
/* Multiply-adds per second of pool's threads together on the int8 unit the
 * gemm kernels use on this CPU (qt_int8_rate on qt_cpu_isa(), every thread
 * at once, each for about 50 ms); 0 where the kernels have no SIMD path. */
double cpu_int8_rate(st_pool *pool);

#endif
