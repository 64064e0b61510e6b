/* bench_matvec: how close the CPU matrix-vector product (backend/cpu) comes
 * to the machine's memory bandwidth, the roofline of decode.
 *
 * 1. Measures read bandwidth: every thread of the pool sums its share of a
 *    1 GiB buffer (read-only streaming, no writes to compete with).
 * 2. For each quant type, fills a set of weight matrices (random valid blocks,
 *    --mib in all, default 1 GiB: several times any last-level cache, so every
 *    product streams its weights from DRAM) and times cpu_matvec rotating
 *    through them, on all threads and on one. Reports weight bytes read per
 *    second and that as a percentage of the measured bandwidth, and the
 *    kernel's rate on a matrix that stays in cache (the compute ceiling), on
 *    all threads (16 MiB, in L3) and on one (1 MiB, in L2).
 * 3. MoE decode steps as the CPU expert lane runs them (moe_bench): 8
 *    experts of qwen3-30b-a3b's shape per step, --moe gate/down type pairs;
 *    --moe-shape 2880x2880x4 for gpt-oss's (d_model x expert width x top-k).
 *
 * A benchmark, not a test: it prints numbers and checks nothing but that the
 * products ran. Every timing is the best of a few passes.
 *
 * usage: bench_matvec [--threads N] [--mib M] [--cols C] [--passes P] [--types q4_k,q6_k,...]
 *                     [--moe q4_k/q6_k,...] [--moe-shape ExFxK] [--thp 0|1] [--prefetch BYTES]
 * --thp 1 asks for transparent huge pages on the weights (madvise); the
 * default is plain 4 KiB pages, like an mmap'd GGUF file in the page cache.
 */
#include "backend/cpu/cpu_bw.h"
#include "backend/cpu/cpu_ops.h"
#include "core/alloc.h"
#include "core/log.h"
#include "core/threadpool.h"
#include "core/timer.h"
#include "quant/quant.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#define MIB   (1024.0 * 1024.0)
#define CHUNK ((size_t)1 << 20) /* 1 MiB per task in the fill loop */

/* ---- matvec ---- */

typedef struct {
    qt_type type;
    uint8_t *buf;
    int64_t n_blocks;
    int64_t blocks_per_chunk;
} fill_job;

static void fill_task(void *p, int64_t task, int thread) {
    (void)thread;
    fill_job *j = p;
    int64_t b0 = task * j->blocks_per_chunk;
    int64_t n = j->n_blocks - b0 < j->blocks_per_chunk ? j->n_blocks - b0 : j->blocks_per_chunk;
    size_t bs = (size_t)qt_get(j->type)->type_size;
    ST_ASSERT(cpu_fill_random_blocks(j->type, j->buf + (size_t)b0 * bs, n, (uint64_t)task + 1) == 0);
}

typedef struct {
    double gbs; /* weight bytes per second, best pass */
    double us;  /* microseconds per matvec, best pass */
} mv_result;

/* Rate of the dot kernel itself: one matrix of `mib` MiB that stays in cache
 * (1 MiB: L2 of one core; 16 MiB: the L3 share of all threads) multiplied
 * again and again. When the DRAM rate equals this, the product is bound by
 * compute, not by memory. */
static double hot_gbs(st_pool *pool, cpu_scratch *scratch, qt_type type, const uint8_t *W, int64_t n_cols, double mib,
                      const float *x, float *y) {
    size_t row = qt_row_size(type, n_cols);
    int64_t n_rows = (int64_t)(mib * MIB / row);
    size_t mat = row * (size_t)n_rows;
    double best = 0;
    for (int p = 0; p < 5; p++) {
        int64_t t0 = st_now_ns();
        for (int r = 0; r < 20; r++) ST_ASSERT(cpu_matvec(pool, scratch, W, row, type, n_rows, n_cols, x, y) == 0);
        double gbs = (double)mat * 20 / (double)(st_now_ns() - t0);
        if (gbs > best) best = gbs;
    }
    return best;
}

/* Times passes over n_mat matrices of n_rows x n_cols; returns the best pass. */
static mv_result time_matvec(st_pool *pool, cpu_scratch *scratch, qt_type type, const uint8_t *W, int n_mat,
                             int64_t n_rows, int64_t n_cols, const float *x, float *y, int passes) {
    size_t row = qt_row_size(type, n_cols), mat = row * (size_t)n_rows;
    /* warm-up: page tables, the scratch arena, the pool's threads */
    ST_ASSERT(cpu_matvec(pool, scratch, W, row, type, n_rows, n_cols, x, y) == 0);
    mv_result best = {0, 0};
    for (int p = 0; p < passes; p++) {
        int64_t t0 = st_now_ns();
        for (int m = 0; m < n_mat; m++)
            ST_ASSERT(cpu_matvec(pool, scratch, W + (size_t)m * mat, row, type, n_rows, n_cols, x, y) == 0);
        double ns = (double)(st_now_ns() - t0);
        double gbs = (double)mat * n_mat / ns;
        if (gbs > best.gbs) best = (mv_result){gbs, ns * 1e-3 / n_mat};
    }
    return best;
}

/* ---- MoE decode step: the CPU expert lane's calls ----
 * What the lane does per layer and token (backend cpu_moe_experts): quantize
 * the hidden state once, gate and up of the k routed experts in one batched
 * dispatch, quantize the k activations, down of the k experts in a second
 * dispatch. Experts are picked round-robin from a pool several times the
 * last-level cache, so every weight byte comes from DRAM. Small matrices
 * (2.9 MiB per expert on qwen3-30b-a3b) make task size, dispatch and the
 * start of each task's memory stream matter here, unlike the 64 MiB
 * matrices above. */
typedef struct {
    int64_t n_embd, n_ff;
    int k;
    qt_type gate_type, down_type;
} moe_shape;

static void moe_bench(st_pool *pool, const moe_shape *m, double mib, int passes, double bw) {
    const size_t rg = qt_row_size(m->gate_type, m->n_embd), rd = qt_row_size(m->down_type, m->n_ff);
    const size_t mg = rg * (size_t)m->n_ff, md = rd * (size_t)m->n_embd, per = 2 * mg + md;
    int n_exp = (int)(mib * MIB / (double)per);
    if (n_exp < m->k) n_exp = m->k;
    uint8_t *W = st_malloc(per * (size_t)n_exp);
    for (int e = 0; e < n_exp; e++) { /* gate, up: gate_type; down: down_type */
        uint8_t *p = W + (size_t)e * per;
        const int64_t gb = (int64_t)(2 * mg / (size_t)qt_get(m->gate_type)->type_size);
        const int64_t db = (int64_t)(md / (size_t)qt_get(m->down_type)->type_size);
        ST_ASSERT(cpu_fill_random_blocks(m->gate_type, p, gb, (uint64_t)e + 1) == 0);
        ST_ASSERT(cpu_fill_random_blocks(m->down_type, p + 2 * mg, db, (uint64_t)e + 7) == 0);
    }
    float *h = st_malloc(sizeof(float) * (size_t)m->n_embd);
    float *g = st_malloc(sizeof(float) * (size_t)(m->k * 2 * m->n_ff)), *u = g + m->k * m->n_ff;
    float *o = st_malloc(sizeof(float) * (size_t)(m->k * m->n_embd));
    for (int64_t i = 0; i < m->n_embd; i++) h[i] = (float)((i * 7919) % 2001 - 1000) * 1e-3f;
    void *hq = st_malloc(cpu_act_row_size(m->gate_type, m->n_embd));
    void *gq = st_malloc(cpu_act_row_size(m->down_type, m->n_ff) * (size_t)m->k);
    cpu_mm mm[128];
    ST_ASSERT(2 * m->k <= 128);
    const int steps = n_exp / m->k; /* one pass visits every expert once */
    double best = 0;
    for (int p = 0; p < passes + 1; p++) {
        int64_t t0 = st_now_ns();
        for (int st = 0; st < steps; st++) {
            ST_ASSERT(cpu_quantize_act(pool, m->gate_type, m->n_embd, 1, h, hq) == 0);
            for (int i = 0; i < m->k; i++) {
                const uint8_t *e = W + (size_t)(st * m->k + i) * per;
                mm[2 * i] = (cpu_mm){e, rg, m->gate_type, m->n_ff, m->n_embd, 1, hq, NULL, g + i * m->n_ff, 0};
                mm[2 * i + 1] = (cpu_mm){e + mg, rg, m->gate_type, m->n_ff, m->n_embd, 1, hq, NULL, u + i * m->n_ff, 0};
            }
            ST_ASSERT(cpu_matmul_q_batch(pool, mm, 2 * m->k) == 0);
            ST_ASSERT(cpu_quantize_act(pool, m->down_type, m->n_ff, m->k, g, gq) == 0);
            const size_t ra = cpu_act_row_size(m->down_type, m->n_ff);
            for (int i = 0; i < m->k; i++) {
                const uint8_t *e = W + (size_t)(st * m->k + i) * per + 2 * mg;
                mm[i] = (cpu_mm){
                    e, rd, m->down_type, m->n_embd, m->n_ff, 1, (uint8_t *)gq + (size_t)i * ra, NULL, o + i * m->n_embd,
                    0};
            }
            ST_ASSERT(cpu_matmul_q_batch(pool, mm, m->k) == 0);
        }
        double ns = (double)(st_now_ns() - t0);
        double gbs = (double)per * (double)(steps * m->k) / ns;
        if (p > 0 && gbs > best) best = gbs; /* pass 0 warms up */
    }
    printf("| %s/%s | %lld x %lld, top-%d | %d | %.1f | %.0f%% | %.1f |\n", qt_get(m->gate_type)->name,
           qt_get(m->down_type)->name, (long long)m->n_embd, (long long)m->n_ff, m->k, n_exp, best, 100 * best / bw,
           (double)per * m->k / best * 1e-3);
    st_free(W);
    st_free(h);
    st_free(g);
    st_free(o);
    st_free(hq);
    st_free(gq);
}

int main(int argc, char **argv) {
    int threads = 0, passes = 3, thp = 0;
    double mib = 1024;
    int64_t n_cols = 4096;
    const char *types = "q4_k,q6_k,q8_0,iq4_xs,iq3_xxs,iq2_xs,iq2_xxs";
    const char *moe = "q4_k/q6_k,iq2_xxs/iq2_xxs";
    int moe_e = 2048, moe_f = 768, moe_k = 8; /* qwen3-30b-a3b's experts */
    for (int i = 1; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--threads")) threads = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--mib")) mib = atof(argv[i + 1]);
        else if (!strcmp(argv[i], "--cols")) n_cols = atoll(argv[i + 1]);
        else if (!strcmp(argv[i], "--passes")) passes = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--types")) types = argv[i + 1];
        else if (!strcmp(argv[i], "--moe")) moe = argv[i + 1];
        else if (!strcmp(argv[i], "--moe-shape") && sscanf(argv[i + 1], "%dx%dx%d", &moe_e, &moe_f, &moe_k) == 3 &&
                 moe_e > 0 && moe_f > 0 && moe_k > 0)
            continue;
        else if (!strcmp(argv[i], "--thp")) thp = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--prefetch")) cpu_set_prefetch_bytes((size_t)atoll(argv[i + 1]));
        else {
            fprintf(stderr,
                    "usage: %s [--threads N] [--mib M] [--cols C] [--passes P] [--types a,b,...] [--moe g/d,...]"
                    " [--moe-shape ExFxK] [--thp 0|1] [--prefetch BYTES]\n",
                    argv[0]);
            return 2;
        }
    }
    st_pool *pool = st_pool_init(threads);
    st_pool *one = st_pool_init(1);
    int nt = st_pool_n_threads(pool);
    printf("bench_matvec: %d threads, ISA path %s, %.0f MiB of weights per type, %lld columns, best of %d passes, "
           "prefetch %zu bytes ahead%s\n",
           nt, qt_isa_name(qt_cpu_isa()), mib, (long long)n_cols, passes, cpu_set_prefetch_bytes((size_t)-1),
           thp ? ", huge pages" : "");

    /* 1. read bandwidth over 1 GiB */
    size_t bw_bytes = (size_t)1 << 30;
    uint8_t *buf = cpu_bw_buffer(pool, bw_bytes); /* pages faulted in from all threads */
    double bw_all = cpu_read_bandwidth(pool, buf, bw_bytes, passes + 2);
    double bw_one = cpu_read_bandwidth(one, buf, bw_bytes, passes);
    st_free(buf);
    printf("read bandwidth (1 GiB, SSE2 streaming sum, best with/without prefetch): %.1f GB/s on %d threads, %.1f GB/s "
           "on 1 thread\n\n",
           bw_all, nt, bw_one);

    /* 2. matvec per type */
    size_t total = (size_t)(mib * MIB);
    uint8_t *W = st_malloc(total);
    if (thp && madvise((void *)((uintptr_t)W & ~(uintptr_t)4095), total, MADV_HUGEPAGE) != 0)
        printf("(madvise MADV_HUGEPAGE failed: 4 KiB pages)\n");
    float *x = st_malloc(sizeof(float) * (size_t)n_cols);
    for (int64_t i = 0; i < n_cols; i++) x[i] = (float)((i * 7919) % 2001 - 1000) * 1e-3f;
    cpu_scratch scratch = {0};

    printf("| type | bits/w | matrices | %d threads: GB/s | %% of bw | us/matvec | 1 thread: GB/s | %% of 1-thread bw "
           "| in cache, %d threads | in L2, 1 thread |\n",
           nt, nt);
    printf("|---|---|---|---|---|---|---|---|---|---|\n");
    char list[256];
    snprintf(list, sizeof list, "%s", types);
    for (char *tok = strtok(list, ","); tok; tok = strtok(NULL, ",")) {
        int t = qt_from_name(tok);
        const qt_traits *tr = t >= 0 ? qt_get((qt_type)t) : NULL;
        if (!tr || !qt_vec_dot((qt_type)t, QT_ISA_SCALAR) || n_cols % tr->blck) {
            printf("| %s | (no dot product or bad width, skipped) |\n", tok);
            continue;
        }
        size_t row = qt_row_size((qt_type)t, n_cols);
        /* matrices of ~64 MiB (a big FFN matrix), as many as fit in the budget */
        int64_t n_rows = (int64_t)(64 * MIB / row);
        int n_mat = (int)(total / (row * (size_t)n_rows));
        if (n_mat < 1) n_mat = 1, n_rows = (int64_t)(total / row);
        float *y = st_malloc(sizeof(float) * (size_t)n_rows);
        fill_job fj = {(qt_type)t, W, n_rows * n_mat * (n_cols / tr->blck), (int64_t)(CHUNK / tr->type_size)};
        st_pool_run(pool, (fj.n_blocks + fj.blocks_per_chunk - 1) / fj.blocks_per_chunk, fill_task, &fj);

        mv_result all = time_matvec(pool, &scratch, (qt_type)t, W, n_mat, n_rows, n_cols, x, y, passes);
        mv_result single =
            time_matvec(one, &scratch, (qt_type)t, W, n_mat, n_rows, n_cols, x, y, passes > 2 ? 2 : passes);
        double hot_all = hot_gbs(pool, &scratch, (qt_type)t, W, n_cols, 16, x, y);
        double hot_one = hot_gbs(NULL, &scratch, (qt_type)t, W, n_cols, 1, x, y);
        double bits = 8.0 * tr->type_size / tr->blck;
        printf("| %s | %.2f | %d x %lld x %lld | %.1f | %.0f%% | %.0f | %.1f | %.0f%% | %.1f | %.1f |\n", tr->name,
               bits, n_mat, (long long)n_rows, (long long)n_cols, all.gbs, 100 * all.gbs / bw_all, all.us, single.gbs,
               100 * single.gbs / bw_one, hot_all, hot_one);
        fflush(stdout);
        st_free(y);
    }
    cpu_scratch_free(&scratch);
    st_free(W);

    /* 3. MoE decode steps at an expert shape (default qwen3-30b-a3b's) */
    printf("\nMoE decode step (quantize, gate+up of k experts in one dispatch, quantize, down), %d x %d "
           "experts, top-%d, %d threads, %.0f MiB of experts:\n\n",
           moe_e, moe_f, moe_k, nt, mib);
    printf("| gate,up/down | shape | experts | GB/s | %% of bw | us per step |\n|---|---|---|---|---|---|\n");
    snprintf(list, sizeof list, "%s", moe);
    for (char *tok = strtok(list, ","); tok; tok = strtok(NULL, ",")) {
        char gname[32];
        const char *slash = strchr(tok, '/');
        int gt = -1, dt = -1;
        if (slash && (size_t)(slash - tok) < sizeof gname) {
            memcpy(gname, tok, (size_t)(slash - tok));
            gname[slash - tok] = 0;
            gt = qt_from_name(gname);
            dt = qt_from_name(slash + 1);
        }
        if (gt < 0 || dt < 0 || !qt_vec_dot((qt_type)gt, QT_ISA_SCALAR) || !qt_vec_dot((qt_type)dt, QT_ISA_SCALAR)) {
            printf("| %s | (not gate/down types with a dot product, skipped) |\n", tok);
            continue;
        }
        moe_shape ms = {moe_e, moe_f, moe_k, (qt_type)gt, (qt_type)dt};
        moe_bench(pool, &ms, mib, passes, bw_all);
        fflush(stdout);
    }
    st_free(x);
    st_pool_free(pool);
    st_pool_free(one);
    return 0;
}
