/* The host's read bandwidth and the cores' int8 rate (cpu_bw.h). */
#include "backend/cpu/cpu_bw.h"

#include <string.h>

#include "core/alloc.h"
#include "core/timer.h"
#include "quant/quant.h"
#include "quant/quant_gemm.h"

#ifdef __SSE2__
#include <emmintrin.h>
#endif

#define CHUNK ((size_t)1 << 20) /* 1 MiB per task */

typedef struct {
    const uint8_t *buf;
    size_t bytes;
    int prefetch;
    uint64_t sums[64 * 8]; /* per thread, a cache line apart: kept so that the compiler cannot drop the reads */
} read_job;

static void read_task(void *p, int64_t task, int thread) {
    read_job *j = p;
    const uint8_t *v = j->buf + (size_t)task * CHUNK;
    const size_t left = j->bytes - (size_t)task * CHUNK, n = (left < CHUNK ? left : CHUNK) / 64;
    const uint8_t *end = v + n * 64;
    uint64_t sum;
#ifdef __SSE2__
    /* four independent accumulators: the adds never limit the loads */
    __m128i a = _mm_setzero_si128(), b = a, c = a, d = a;
    for (const uint8_t *q = v; q < end; q += 64) {
        if (j->prefetch && q + 4096 < end) __builtin_prefetch(q + 4096, 0, 1);
        a = _mm_add_epi64(a, _mm_load_si128((const __m128i *)q));
        b = _mm_add_epi64(b, _mm_load_si128((const __m128i *)(q + 16)));
        c = _mm_add_epi64(c, _mm_load_si128((const __m128i *)(q + 32)));
        d = _mm_add_epi64(d, _mm_load_si128((const __m128i *)(q + 48)));
    }
    const __m128i s = _mm_add_epi64(_mm_add_epi64(a, b), _mm_add_epi64(c, d));
    sum = (uint64_t)_mm_cvtsi128_si64(s) + (uint64_t)_mm_cvtsi128_si64(_mm_unpackhi_epi64(s, s));
#else
    uint64_t a = 0, b = 0, c = 0, d = 0;
    for (const uint8_t *q = v; q < end; q += 64) {
        if (j->prefetch && q + 4096 < end) __builtin_prefetch(q + 4096, 0, 1);
        uint64_t w[8];
        memcpy(w, q, 64);
        a += w[0] + w[4], b += w[1] + w[5], c += w[2] + w[6], d += w[3] + w[7];
    }
    sum = a + b + c + d;
#endif
    j->sums[(thread & 63) * 8] += sum;
}

static void fill_task(void *p, int64_t task, int thread) {
    (void)thread;
    read_job *j = p;
    const size_t off = (size_t)task * CHUNK;
    memset((uint8_t *)j->buf + off, (int)(task & 0xff), j->bytes - off < CHUNK ? j->bytes - off : CHUNK);
}

uint8_t *cpu_bw_buffer(st_pool *pool, size_t bytes) {
    uint8_t *buf = st_malloc(bytes);
    read_job j = {.buf = buf, .bytes = bytes};
    st_pool_run(pool, (int64_t)((bytes + CHUNK - 1) / CHUNK), fill_task, &j);
    return buf;
}

double cpu_read_bandwidth(st_pool *pool, const uint8_t *buf, size_t bytes, int passes) {
    static read_job j; /* 4 KiB of sums: not on the stack */
    memset(&j, 0, sizeof j);
    j.buf = buf;
    j.bytes = bytes;
    const int64_t chunks = (int64_t)((bytes + CHUNK - 1) / CHUNK);
    double best = 0;
    for (int p = 0; p < 2 * passes; p++) {
        j.prefetch = p & 1;
        const int64_t t0 = st_now_ns();
        st_pool_run(pool, chunks, read_task, &j);
        const double gbs = (double)bytes / (double)(st_now_ns() - t0);
        if (gbs > best) best = gbs;
    }
    return best;
}

typedef struct {
    qt_isa isa;
    double rate[256]; /* per task, so that a thread that ran two is not counted once */
} int8_job;

static void int8_task(void *p, int64_t task, int thread) {
    (void)thread;
    int8_job *j = p;
    j->rate[task] = qt_int8_rate(j->isa, 0.05);
}

double cpu_int8_rate(st_pool *pool) {
    static int8_job j; /* 2 KiB: not on the stack */
    memset(&j, 0, sizeof j);
    j.isa = qt_cpu_isa();
    int n = st_pool_n_threads(pool);
    if (n > 256) n = 256;
    st_pool_run(pool, n, int8_task, &j);
    double sum = 0;
    for (int t = 0; t < n; t++) sum += j.rate[t];
    return sum;
}
