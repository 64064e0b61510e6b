/* Whether CUDA device g exists (0 in a build without the GPU backend): the
 * tests that take --gpu N skip with a message without it. Header-only. */
#ifndef STRATA_TESTS_COMMON_GPU_H
#define STRATA_TESTS_COMMON_GPU_H

#ifdef STRATA_HAVE_GPU
#include "backend/cuda/device.h"
static inline int gpu_present(int g) { return gpu_device_count() > g; }
#else
static inline int gpu_present(int g) { return (void)g, 0; }
#endif

#endif
