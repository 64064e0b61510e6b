/* The GPU tests' runtime-call check: CK(call) exits with the call, the
 * error string and file:line when a CUDA (or HIP) runtime call fails. */
#ifndef STRATA_TESTS_CUDA_CK_H
#define STRATA_TESTS_CUDA_CK_H

#include <stdio.h>
#include <stdlib.h>

#include "backend/cuda/compat.h"

#define CK(call)                                                                                                       \
    do {                                                                                                               \
        cudaError_t e_ = (call);                                                                                       \
        if (e_ != cudaSuccess) {                                                                                       \
            fprintf(stderr, "%s failed: %s (%s:%d)\n", #call, cudaGetErrorString(e_), __FILE__, __LINE__);             \
            exit(1);                                                                                                   \
        }                                                                                                              \
    } while (0)

#endif
