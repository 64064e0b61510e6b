/* deepseek2 on the CPU (cpu_mla.h). Multi-head latent attention itself is
 * composed by the forward pass from ops every backend has (matmul on one
 * matrix of a stack, rmsnorm, qkv_prep and attention over a one-head cache)
 * plus copy_2d here, which moves a head's slice of every row into a packed
 * matrix and back, and matmul's ST_MAT_ALL form (every head's product in
 * one call), done here one matrix at a time. The group rule follows DeepSeek-V3's gate (and llama.cpp
 * b11434's build_moe_ffn): a group scores the sum of its two best biased
 * scores; the experts of the other groups cannot be chosen.
 */
#include "backend/cpu/cpu_mla.h"

#include <math.h>
#include <string.h>

#include "core/alloc.h"
#include "core/log.h"

void cpu_copy_2d(st_backend *be, float *dst, int64_t dst_stride, const float *src, int64_t src_stride, int64_t width,
                 int n_rows) {
    (void)be;
    for (int r = 0; r < n_rows; r++)
        memcpy(dst + (size_t)r * (size_t)dst_stride, src + (size_t)r * (size_t)src_stride,
               (size_t)width * sizeof(float));
}

void cpu_matmul_all(st_backend *be, const st_weight *w, const float *x, float *y, int n_tok) {
    const int64_t H = w->n_mat, ni = w->n_in, no = w->n_out;
    float *xs = st_malloc((size_t)n_tok * (size_t)ni * sizeof(float));
    float *ys = st_malloc((size_t)n_tok * (size_t)no * sizeof(float));
    for (int64_t m = 0; m < H; m++) {
        cpu_copy_2d(be, xs, ni, x + m * ni, H * ni, ni, n_tok);
        be->matmul(be, w, m, xs, ys, n_tok);
        cpu_copy_2d(be, y + m * no, H * no, ys, no, no, n_tok);
    }
    st_free(xs);
    st_free(ys);
}

void cpu_route_groups(float *s, int n_expert, int n_group, int n_used) {
    enum { MAX_GROUPS = 64 };
    ST_ASSERT(n_group > 1 && n_group <= MAX_GROUPS && n_expert % n_group == 0 && n_used >= 1 && n_used < n_group);
    const int per = n_expert / n_group;
    float score[MAX_GROUPS];
    int keep[MAX_GROUPS];
    for (int g = 0; g < n_group; g++) {
        /* the two best of the group; a NaN or -inf score counts as absent */
        float a = -INFINITY, b = -INFINITY;
        for (int e = g * per; e < (g + 1) * per; e++) {
            const float v = s[e];
            if (!(v > -INFINITY)) continue;
            if (v > a) b = a, a = v;
            else if (v > b) b = v;
        }
        score[g] = per > 1 ? a + b : a;
        keep[g] = 0;
    }
    for (int j = 0; j < n_used; j++) { /* the best groups, ties to the lower id */
        int best = -1;
        for (int g = 0; g < n_group; g++)
            if (!keep[g] && (best < 0 || score[g] > score[best])) best = g; /* scores are never NaN */
        keep[best] = 1;
    }
    for (int g = 0; g < n_group; g++)
        if (!keep[g])
            for (int e = g * per; e < (g + 1) * per; e++) s[e] = -INFINITY;
}
