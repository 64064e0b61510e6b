/* What the attention kernels that split a token's span into slices share
 * (attention.cu, attention_tc.cu, mla.cu): which positions a slice covers.
 * Their partial results and the combine are attention.cu's. */
#ifndef STRATA_BACKEND_CUDA_ATTENTION_CUH
#define STRATA_BACKEND_CUDA_ATTENTION_CUH

#include "backend/cuda/common.cuh"

/* The positions [c0, c1) that slice `split` of n_split covers for token t of
 * a chunk at pos0: the slices split the chunk's longest span (its last
 * token's) evenly in whole tiles; each token sees up to its own position, the
 * last `window` of them with a window. */
static __device__ __forceinline__ void att_slice(int pos0, int n_tok, int t, int window, int n_split, int split,
                                                 int tile, int *c0, int *c1) {
    int span = pos0 + n_tok;
    if (window > 0 && span > window) span = window;
    const int chunk = ((span + n_split - 1) / n_split + tile - 1) / tile * tile;
    const int pos = pos0 + t;
    const int first = (window > 0 && pos - window + 1 > 0) ? pos - window + 1 : 0;
    *c0 = first + split * chunk;
    *c1 = min(*c0 + chunk, pos + 1);
}

#endif
