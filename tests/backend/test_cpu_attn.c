/* The CPU backend's attention (attention, attention_sinks) against a
 * double-precision scalar reference over the cache values as stored (f16,
 * or int8 times the row's scale): scores scale * q.k over the visible rows
 * (causal, the sliding window), softmax with the sink as one more logit,
 * the weighted sum of the value rows.
 *
 * The shapes cover what the blocks and tiles have edges at
 * (cpu_attn_tile_avx512.c: 48 query rows of tokens x heads, rows in lanes
 * from 24 rows, keys in lanes below; tiles of 64, 32 or 16 keys on the
 * position grid by head_dim, score micro-tiles of 8 keys, output blocks of
 * 4 rows x 64 values): token counts that leave a partial block, query heads
 * per KV head of 1, 3, 4, 5, 8 and 100 (more than a block: split), head
 * dims 32, 64, 80, 128, 256; chunks at depth (pos0 > 0), windows smaller
 * and larger than a tile, sinks, both cache types, 1-3 threads; one token
 * (decode) and two; then sweeps of the chunk's position (against the
 * tiles' ends and, with a window of 100, the window's first position) and
 * of its token count. Cache rows past the last position hold NaN, so that
 * reading one shows.
 * Each token of a chunk must give the same bits when it is computed alone
 * (one-token calls: decode), which speculative decoding and chunked
 * prompts rely on (test_drafts, test_forward.py's split check).
 * Each output value must be within TOL * sum_p w_p |v_p| of the reference
 * (the rounding of the weights, relative, scales the values' magnitudes).
 * Measured worst ratio (2026-12-02, Xeon with AVX-512): 2.9e-6 on the
 * AVX-512 blocks, 5.0e-6 on the portable loops (STRATA_ISA=scalar); a mask
 * one position off gives ~1e-2 and more.
 */
#include "backend/backend.h"
#include "core/alloc.h"
#include "core/fp16.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../common/check.h"

#define TOL 2e-5

static uint64_t rng_state = 777;
static float frand(void) { /* uniform in [-1, 1) */
    rng_state = rng_state * 6364136223846793005ull + 1442695040888963407ull;
    return (float)((rng_state >> 40) * (1.0 / 16777216.0)) * 2.0f - 1.0f;
}

typedef struct {
    int hd, n_head, n_kv, n_tok, pos0, window, sinks, threads;
    st_kv_type type;
    float qmag; /* query magnitude: larger gives peakier softmax */
} attn_case;

/* The cache value as the kernels read it. */
static double kv_val(const st_kv_layer *kv, int is_v, int p, int h, int i) {
    const size_t off = ((size_t)p * kv->n_head_kv + (size_t)h) * kv->head_dim + (size_t)i;
    if (kv->type == ST_KV_F16) return st_f16_to_f32(((const uint16_t *)(is_v ? kv->v : kv->k))[off]);
    const float s = (is_v ? kv->v_scale : kv->k_scale)[(size_t)p * kv->n_head_kv + (size_t)h];
    return (double)s * (double)((const int8_t *)(is_v ? kv->v : kv->k))[off];
}

static double worst;

static void run_case(const attn_case *c) {
    const int hd = c->hd, nkv = c->n_kv, G = c->n_head / nkv, last = c->pos0 + c->n_tok - 1;
    const int n_ctx = last + 1 + 5; /* 5 rows past the last position: NaN */
    const size_t rowv = (size_t)nkv * hd, nv = (size_t)n_ctx * rowv;
    st_kv_layer kv = {.type = c->type, .n_ctx = n_ctx, .n_head_kv = nkv, .head_dim = hd};
    kv.k = st_malloc(nv * 2);
    kv.v = st_malloc(nv * 2);
    if (c->type == ST_KV_INT8) {
        kv.k_scale = st_malloc((size_t)n_ctx * nkv * sizeof(float));
        kv.v_scale = st_malloc((size_t)n_ctx * nkv * sizeof(float));
    }
    for (int p = 0; p < n_ctx; p++) {
        const int past = p > last;
        for (size_t i = 0; i < rowv; i++) {
            const size_t o = (size_t)p * rowv + i;
            if (c->type == ST_KV_F16) {
                ((uint16_t *)kv.k)[o] = past ? 0x7e00 : st_f32_to_f16(frand());
                ((uint16_t *)kv.v)[o] = past ? 0x7e00 : st_f32_to_f16(frand());
            } else {
                ((int8_t *)kv.k)[o] = (int8_t)(127 * frand());
                ((int8_t *)kv.v)[o] = (int8_t)(127 * frand());
            }
        }
        if (c->type == ST_KV_INT8)
            for (int h = 0; h < nkv; h++) {
                kv.k_scale[p * nkv + h] = past ? NAN : 0.011f + 0.009f * frand();
                kv.v_scale[p * nkv + h] = past ? NAN : 0.011f + 0.009f * frand();
            }
    }
    const size_t nq = (size_t)c->n_tok * c->n_head * hd;
    float *q = st_malloc(nq * sizeof(float)), *out = st_malloc(nq * sizeof(float)), *sinks = NULL;
    for (size_t i = 0; i < nq; i++) q[i] = c->qmag * frand();
    if (c->sinks) {
        sinks = st_malloc((size_t)c->n_head * sizeof(float));
        for (int h = 0; h < c->n_head; h++) sinks[h] = 3.0f * frand();
    }
    const float scale = 1.0f / sqrtf((float)hd);
    st_backend *be = backend_cpu_create(c->threads);
    if (sinks) be->attention_sinks(be, q, &kv, c->n_tok, c->pos0, c->n_head, scale, c->window, sinks, out);
    else be->attention(be, q, &kv, c->n_tok, c->pos0, c->n_head, scale, c->window, out);
    /* each token alone (a decode step) gives the same bits as in the chunk */
    float *one = st_malloc((size_t)c->n_head * hd * sizeof(float));
    int differ = 0;
    for (int t = 0; t < c->n_tok && c->n_tok > 1; t++) {
        const float *qt = q + (size_t)t * c->n_head * hd;
        if (sinks) be->attention_sinks(be, qt, &kv, 1, c->pos0 + t, c->n_head, scale, c->window, sinks, one);
        else be->attention(be, qt, &kv, 1, c->pos0 + t, c->n_head, scale, c->window, one);
        differ += memcmp(one, out + (size_t)t * c->n_head * hd, (size_t)c->n_head * hd * sizeof(float)) != 0;
    }
    CHECK(differ == 0, "hd %d, %d/%d heads, %d tokens at %d, window %d: %d tokens alone differ from the chunk's", hd,
          c->n_head, nkv, c->n_tok, c->pos0, c->window, differ);
    st_free(one);
    be->destroy(be);

    double *s = st_malloc((size_t)n_ctx * sizeof(double)), case_worst = 0;
    int bad = 0;
    for (int t = 0; t < c->n_tok; t++)
        for (int h = 0; h < c->n_head; h++) {
            const int pos = c->pos0 + t, hk = h / G;
            const int first = c->window > 0 && pos - c->window + 1 > 0 ? pos - c->window + 1 : 0;
            const float *qr = q + ((size_t)t * c->n_head + h) * hd;
            double mx = sinks ? sinks[h] : -INFINITY;
            for (int p = first; p <= pos; p++) {
                double d = 0;
                for (int i = 0; i < hd; i++) d += (double)qr[i] * kv_val(&kv, 0, p, hk, i);
                s[p] = (double)scale * d;
                mx = s[p] > mx ? s[p] : mx;
            }
            double sum = sinks ? exp(sinks[h] - mx) : 0;
            for (int p = first; p <= pos; p++) sum += s[p] = exp(s[p] - mx);
            for (int i = 0; i < hd; i++) {
                double ref = 0, mag = 0;
                for (int p = first; p <= pos; p++) {
                    const double v = kv_val(&kv, 1, p, hk, i);
                    ref += s[p] / sum * v;
                    mag += s[p] / sum * fabs(v);
                }
                const double got = out[((size_t)t * c->n_head + h) * hd + i];
                const double r = fabs(got - ref) / (mag > 1e-30 ? mag : 1e-30);
                if (!(r <= TOL) && bad++ < 3)
                    printf("  token %d head %d value %d: %.9g, reference %.9g (ratio %.3g)\n", t, h, i, got, ref, r);
                if (!(r <= case_worst)) case_worst = r; /* NaN too */
            }
        }
    CHECK(bad == 0,
          "hd %d, %d/%d heads, %d tokens at %d, window %d, sinks %d, %s cache, %d threads: %d values off, worst %.3g",
          hd, c->n_head, nkv, c->n_tok, c->pos0, c->window, c->sinks, c->type == ST_KV_F16 ? "f16" : "int8", c->threads,
          bad, case_worst);
    if (!(case_worst <= worst)) worst = case_worst;
    st_free(s);
    st_free(q);
    st_free(out);
    st_free(sinks);
    st_free(kv.k);
    st_free(kv.v);
    st_free(kv.k_scale);
    st_free(kv.v_scale);
}

int main(void) {
    const st_kv_type F = ST_KV_F16, I = ST_KV_INT8;
    const attn_case cases[] = {
        /* hd, heads, kv heads, tokens, pos0, window, sinks, threads, cache, qmag */
        {64, 9, 3, 37, 0, 0, 0, 2, F, 4},      /* SmolLM2's heads: 16-token blocks, 5 left */
        {64, 9, 3, 37, 0, 0, 0, 2, I, 4},      /* the same, int8 */
        {64, 9, 3, 130, 0, 0, 0, 1, F, 8},     /* tiles of 64 keys and 2 more */
        {64, 9, 3, 45, 83, 0, 0, 3, F, 8},     /* a chunk at depth */
        {128, 8, 2, 50, 100, 0, 0, 2, I, 4},   /* 4 heads per KV head: 12-token blocks; 32-key tiles */
        {256, 4, 1, 29, 3, 0, 0, 2, F, 4},     /* Gemma 3 270M's heads; 32-key tiles */
        {256, 4, 1, 40, 60, 24, 0, 2, I, 4},   /* and its sliding window */
        {64, 9, 3, 70, 30, 7, 0, 2, F, 8},     /* a window shorter than a score micro-tile */
        {64, 6, 2, 60, 150, 100, 0, 3, F, 4},  /* a window edge inside the tiles */
        {64, 16, 2, 33, 20, 0, 1, 2, F, 4},    /* gpt-oss-like: 8 heads per KV head, sinks */
        {64, 16, 2, 33, 140, 128, 1, 2, I, 4}, /* sinks with a window, int8 */
        {64, 16, 2, 9, 0, 0, 1, 1, F, 20},     /* sinks that dominate some rows */
        {80, 10, 2, 20, 5, 0, 0, 2, F, 4},     /* 5 heads per KV head (45 of 48 rows), 80 values */
        {32, 100, 1, 3, 10, 0, 0, 2, F, 4},    /* 100 heads on one KV head: split in 3 parts */
        {64, 4, 4, 97, 0, 0, 0, 2, F, 4},      /* one head per KV head: 48-token blocks */
        {64, 9, 3, 2, 200, 0, 0, 2, F, 4},     /* two tokens (drafts) */
        {64, 9, 3, 1, 200, 0, 0, 2, F, 4},     /* decode */
        {128, 8, 2, 1, 77, 16, 1, 2, I, 4},    /* decode, int8, window, sinks */
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) run_case(&cases[i]);
    /* every offset of the blocks' first positions against the 64-key tiles'
     * ends (the test for a tile that needs no mask), then every block
     * remainder against a window (its first tile's start) */
    for (int pos0 = 0; pos0 <= 64; pos0++) run_case(&(attn_case){64, 9, 3, 17, pos0, 0, 0, 2, F, 4});
    /* ... and of a window's first position (of a block's last token) against them */
    for (int pos0 = 140; pos0 <= 160; pos0++) run_case(&(attn_case){64, 9, 3, 16, pos0, 100, 0, 2, F, 4});
    for (int n = 1; n <= 20; n++) {
        run_case(&(attn_case){64, 9, 3, n, 70, 9, n % 2, 2, n % 3 ? F : I, 4});
        run_case(&(attn_case){64, 9, 3, n, 170, 100, n % 2, 2, n % 3 ? I : F, 4}); /* a window past a tile */
    }
    { /* a call with no tokens does nothing (it divided the threads by zero tasks) */
        uint16_t kc[64] = {0};
        st_kv_layer kv = {.type = F, .n_ctx = 1, .n_head_kv = 1, .head_dim = 64, .k = kc, .v = kc};
        float q[64] = {0}, out[64] = {1};
        st_backend *be = backend_cpu_create(2);
        be->attention(be, q, &kv, 0, 0, 1, 1.0f, 0, out);
        be->destroy(be);
        CHECK(out[0] == 1, "a call with no tokens wrote its output");
    }
    printf("worst |error| / sum w|v|: %.3g (bound %.1g)\n", worst, TOL);
    return check_report("test_cpu_attn");
}
