/* The fused ops by composition (backend_compose.h). They are the
 * definition the fused kernels are checked against: the same ops in the
 * same order as the forward pass called them before the fused forms
 * existed, so a backend without kernels of its own computes the same bits. */
#include "backend/backend_compose.h"

void backend_compose_matmul_multi(st_backend *be, int n, const st_weight *const *w, const float *x, float *const *y,
                                  int n_tok) {
    for (int i = 0; i < n; i++) be->matmul(be, w[i], 0, x, y[i], n_tok);
}

void backend_compose_matmul_res_norm(st_backend *be, const st_weight *w, const float *x, float *y, float *res,
                                     const float *nw, float eps, float *h, const st_weight *wn, float *yn, int n_tok) {
    be->matmul(be, w, 0, x, y, n_tok);
    be->rmsnorm(be, res, y, nw, h, (int)w->n_out, n_tok, eps); /* res += y first, in the same pass */
    if (wn) be->matmul(be, wn, 0, h, yn, n_tok);
}
