/* Zipf-skewed routing for synthetic MoE models.
 *
 * Model of the router input: h = m*u + eps, eps ~ N(0, I), u a fixed unit
 * direction (real residual streams carry such shared directions; synth puts
 * one into the token embeddings). Router row e is g_e + a_e*u with g_e
 * Gaussian and orthogonal to u, so logit_e = a_e*m + g_e.eps: a fixed bias
 * plus noise of std |g_e| that is nearly independent across experts. A bias
 * is needed at all because zero-mean logits cannot make any expert win more
 * than about half of the time, while Zipf with s = 1 asks for more.
 *
 * So the problem is: find biases beta (in units of the noise std) such that
 * expert r lands in the top-k of beta + N(0, I) with probability t[r]. For a
 * given beta, p_e is an exact one-dimensional integral over expert e's own
 * noise z of P(fewer than k others exceed beta_e + z), the latter a
 * Poisson-binomial tail computed by a k-state dynamic program. The update is
 * in probit space: were the k-th largest of the others a fixed threshold T,
 * p_e = Phi(beta_e - T) and beta_e += probit(t_e) - probit(p_e) would be
 * exact; T moves a little, so it converges in a few dozen steps (a logit
 * update overshoots in the Gaussian tail and diverges).
 */
#include <math.h>
#include <string.h>

#include "core/alloc.h"
#include "model/synth.h"

void synth_zipf_targets(int n, int k, double s, double cap, double *t) {
    /* Water-filling: sum_r min(cap, c r^-s) is increasing in c; bisect for k. */
    double lo = 0, hi = 1;
    for (;;) {
        double sum = 0;
        for (int r = 0; r < n; r++) sum += fmin(cap, hi * pow(r + 1, -s));
        if (sum >= k || hi > 1e30) break;
        hi *= 2;
    }
    for (int it = 0; it < 200; it++) {
        double c = 0.5 * (lo + hi), sum = 0;
        for (int r = 0; r < n; r++) sum += fmin(cap, c * pow(r + 1, -s));
        if (sum < k) lo = c;
        else hi = c;
    }
    for (int r = 0; r < n; r++) t[r] = fmin(cap, hi * pow(r + 1, -s));
}

#define NZ   80 /* quadrature points for expert e's own noise */
#define ZMAX 7.0

/* p[e] = P(e in top-k of beta + N(0, I)). */
static void topk_probs(int n, int k, const double *beta, double *p) {
    double zs[NZ], wz[NZ], wsum = 0;
    for (int i = 0; i < NZ; i++) {
        zs[i] = -ZMAX + 2 * ZMAX * (i + 0.5) / NZ;
        wz[i] = exp(-0.5 * zs[i] * zs[i]);
        wsum += wz[i];
    }
    for (int i = 0; i < NZ; i++) wz[i] /= wsum;
    double *dp = st_malloc((size_t)k * sizeof *dp);
    for (int e = 0; e < n; e++) {
        double pe = 0;
        for (int i = 0; i < NZ; i++) {
            double x = beta[e] + zs[i];
            memset(dp, 0, (size_t)k * sizeof *dp);
            dp[0] = 1;
            for (int f = 0; f < n; f++) {
                if (f == e) continue;
                double q = 0.5 * erfc((x - beta[f]) * M_SQRT1_2); /* P(f beats e) */
                for (int j = k - 1; j > 0; j--) dp[j] = dp[j] * (1 - q) + dp[j - 1] * q;
                dp[0] *= 1 - q;
            }
            double fewer = 0;
            for (int j = 0; j < k; j++) fewer += dp[j];
            pe += wz[i] * fewer;
        }
        p[e] = pe;
    }
    st_free(dp);
}

/* The normal quantile, by bisection on erfc: called n times per iteration. */
static double probit(double p) {
    p = fmin(fmax(p, 1e-12), 1 - 1e-12);
    double lo = -10, hi = 10;
    for (int i = 0; i < 64; i++) {
        double mid = 0.5 * (lo + hi);
        if (0.5 * erfc(-mid * M_SQRT1_2) < p) lo = mid;
        else hi = mid;
    }
    return 0.5 * (lo + hi);
}

double synth_zipf_solve(int n, int k, const double *t, double *beta) {
    double *p = st_malloc((size_t)n * sizeof *p);
    for (int e = 0; e < n; e++) beta[e] = probit(t[e]);
    double err = 1;
    for (int it = 0; it < 200 && err > 2e-3; it++) {
        topk_probs(n, k, beta, p);
        err = 0;
        double mean = 0;
        for (int e = 0; e < n; e++) {
            err = fmax(err, fabs(p[e] - t[e]) / t[e]);
            beta[e] += probit(t[e]) - probit(p[e]);
            mean += beta[e];
        }
        /* top-k is shift invariant: keep the biases centred */
        mean /= n;
        for (int e = 0; e < n; e++) beta[e] -= mean;
    }
    st_free(p);
    return err;
}
