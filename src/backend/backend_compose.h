/* The fused ops of st_backend (backend.h: matmul_multi,
 * matmul_res_norm) composed from the plain ops of the same table. The CPU
 * backend's table points at these; a GPU backend calls them where a fused
 * kernel does not take the case, or when its fusions are turned off (so that
 * backend_check compares the fused kernels with their composition). Each
 * calls through be's table, so a decorator's overrides still see every
 * plain op. */
#ifndef STRATA_BACKEND_BACKEND_COMPOSE_H
#define STRATA_BACKEND_BACKEND_COMPOSE_H

#include "backend/backend.h"

/* n matmul calls of x, in order. */
void backend_compose_matmul_multi(st_backend *be, int n, const st_weight *const *w, const float *x, float *const *y,
                                  int n_tok);
/* matmul into y, rmsnorm of res with y as its residual into h, and matmul
 * of h into yn when wn is given. */
void backend_compose_matmul_res_norm(st_backend *be, const st_weight *w, const float *x, float *y, float *res,
                                     const float *nw, float eps, float *h, const st_weight *wn, float *yn, int n_tok);

#endif
