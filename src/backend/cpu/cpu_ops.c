/* CPU matrix products (see cpu_ops.h): activation quantization, then rows
 * (and token blocks) split into pool tasks, each calling the format's dot
 * product from quant/ on the best ISA path this CPU has.
 *
 * Decode (one token) is bound by memory bandwidth: every weight byte is read
 * once, so the split only has to keep every core streaming. Tasks are
 * contiguous runs of rows (the hardware prefetchers like long runs), several
 * per thread so that a thread slowed by a neighbour does not hold the others
 * back, and multiples of 16 rows so that two tasks never write the same cache
 * line of y. Each row also prefetches the weights 4 KiB ahead (see
 * matvec_rows), which the kernels' sparse loads need to reach the bandwidth.
 *
 * A few tokens (2..qt_gemm_small_max_tok, now 4: the server's batched
 * decode step, MoE experts with few tokens) are split and prefetched like a
 * matvec, and the small-batch kernel (quant_gemm.h, qt_gemm_small) decodes
 * each weight block once for all the tokens; its results are the dot's bit
 * for bit, so a sequence's logits do not depend on how many share its step.
 *
 * Prompt chunks (many tokens) reuse each weight row across a block of tokens
 * while it is in L1, with the block's quantized activations held in L2; the
 * token block is sized so that they fit (act_block_bytes). Formats with a
 * multi-token gemm kernel (quant/quant_gemm.h) run each task's 16-64 rows
 * against up to QT_GEMM_MAX_TOK tokens per call, so each weight block is
 * decoded once per call rather than once per token; the others call the
 * single-row dot per (row, token) pair.
 */
#include "backend/cpu/cpu_ops.h"

#include "core/alloc.h"
#include "core/log.h"
#include "core/switches.h"
#include "quant/quant.h"
#include "quant/quant_gemm.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

/* Quantized activations of one token block should stay in L2 (>= 1 MiB on
 * the server parts we target, 256 KiB on old desktops: this is a middle).
 * cpu_set_act_block_bytes() changes it (tuning, and tests of the tiling). */
static size_t act_block_bytes = 256 * 1024;
/* How far ahead a matvec prefetches its weights (cpu_set_prefetch_bytes,
 * else STRATA_CPU_PREFETCH, else by vendor at first use). Measured on a
 * 16-core Xeon (docs/benchmarks.md): 4 KiB raised Q6_K, Q8_0 and IQ4_XS by
 * 10-20 points, to 70-78% of the read bandwidth; NTA hints were worse than
 * no prefetch, 16 KiB slightly worse than 4. On a Zen 4 EPYC (2 cores) the
 * hardware streams alone did better: none read Q6_K and Q8_0 at 84-87% of
 * the bandwidth against 59-69% with 4 KiB, Q4_K 70% against 60-64%. */
#define PREFETCH_UNSET ((size_t)-2)
static size_t prefetch_bytes = PREFETCH_UNSET;
static pthread_once_t prefetch_once = PTHREAD_ONCE_INIT;

static void prefetch_init(void) {
    if (prefetch_bytes != PREFETCH_UNSET) return; /* set before the first product */
    const size_t dflt = qt_cpu_is_amd() ? 0 : 4096;
    const char *v = st_switch_get("STRATA_CPU_PREFETCH");
    char *end = NULL;
    if (!v || !*v || !strcmp(v, "auto")) prefetch_bytes = dflt;
    else {
        const unsigned long long n = strtoull(v, &end, 10);
        if (*end || n > (1u << 20) || v[0] == '-') {
            st_log(ST_LOG_ERROR, "STRATA_CPU_PREFETCH=%s is not auto or a byte count up to 1 MiB; auto used", v);
            prefetch_bytes = dflt;
        } else prefetch_bytes = (size_t)n;
    }
}

static size_t prefetch(void) {
    pthread_once(&prefetch_once, prefetch_init);
    return prefetch_bytes;
}
/* Tasks per thread for a matvec: enough to even out uneven cores. */
#define TASKS_PER_THREAD 4
/* Smallest task, in weight bytes, for which a dispatch is worth it. */
#define MIN_TASK_BYTES (16 * 1024)
/* Rows per task in the batched product. */
#define MATMUL_ROW_BLOCK 16

size_t cpu_set_act_block_bytes(size_t bytes) {
    size_t old = act_block_bytes;
    if (bytes) act_block_bytes = bytes;
    return old;
}

size_t cpu_set_prefetch_bytes(size_t bytes) {
    size_t old = prefetch();
    if (bytes != (size_t)-1) prefetch_bytes = bytes;
    return old;
}

void *cpu_scratch_reserve(cpu_scratch *s, size_t bytes) {
    ST_ASSERT(s != NULL);
    if (bytes > s->cap) {
        st_free(s->buf);
        /* grow by half again so that slowly growing requests do not reallocate every call */
        size_t cap = bytes + bytes / 2;
        s->buf = st_malloc(cap);
        s->cap = cap;
    }
    return s->buf;
}

void cpu_scratch_free(cpu_scratch *s) {
    if (!s) return;
    st_free(s->buf);
    s->buf = NULL;
    s->cap = 0;
}

/* Checks that `type` has a dot product and n_cols fits both its blocks and
 * its activation blocks; returns its traits or NULL with st_error set. */
static const qt_traits *check_type(const char *fn, qt_type type, int64_t n_cols) {
    const qt_traits *tr = qt_get(type);
    if (!tr) {
        st_error_set("%s: unknown quant type %d", fn, (int)type);
        return NULL;
    }
    if (!qt_vec_dot(type, QT_ISA_SCALAR)) {
        st_error_set("%s: type %s has no CPU dot product", fn, tr->name);
        return NULL;
    }
    const qt_traits *at = qt_get(tr->vec_dot_type);
    if (!at) {
        st_error_set("%s: type %s has no activation format", fn, tr->name);
        return NULL;
    }
    if (n_cols <= 0 || n_cols % tr->blck != 0 || n_cols % at->blck != 0 || n_cols > INT32_MAX) {
        st_error_set("%s: %lld columns is not a whole number of %s blocks (%d) and %s blocks (%d)", fn,
                     (long long)n_cols, tr->name, tr->blck, at->name, at->blck);
        return NULL;
    }
    return tr;
}

size_t cpu_act_row_size(qt_type type, int64_t n_cols) {
    const qt_traits *tr = check_type("cpu_act_row_size", type, n_cols);
    return tr ? qt_row_size(tr->vec_dot_type, n_cols) : 0;
}

/* ---- activation quantization ---- */

typedef struct {
    qt_type act_type;
    int64_t n_cols;
    size_t act_row;
    const float *X;
    uint8_t *Xq;
} quant_job;

static void quant_task(void *p, int64_t t, int thread) {
    (void)thread;
    const quant_job *j = p;
    qt_quantize_act(j->act_type, j->X + t * j->n_cols, j->Xq + (size_t)t * j->act_row, j->n_cols);
}

int cpu_quantize_act(st_pool *pool, qt_type type, int64_t n_cols, int64_t n_tok, const float *X, void *Xq) {
    const qt_traits *tr = check_type("cpu_quantize_act", type, n_cols);
    if (!tr) return -1;
    quant_job j = {tr->vec_dot_type, n_cols, qt_row_size(tr->vec_dot_type, n_cols), X, Xq};
    if (n_tok == 1) quant_task(&j, 0, 0); /* a single row: no dispatch */
    else st_pool_run(pool, n_tok, quant_task, &j);
    return 0;
}

/* ---- the products ---- */

typedef struct {
    qt_vec_dot_fn dot;
    qt_gemm_fn gemm;  /* multi-token kernel, or NULL: dot per pair (also always for one token) */
    qt_gemm_fn small; /* small-batch kernel (2..qt_gemm_small_max_tok tokens), else NULL */
    const uint8_t *W;
    size_t row_stride;
    int64_t n_rows;
    int n_cols;
    const uint8_t *Xq;
    size_t act_row;
    const int32_t *x_ids;
    float *Y;
    int64_t ldy;
    int64_t n_tok;
    int gemm_max_tok;      /* tokens per gemm call */
    int64_t rows_per_task; /* row block */
    int64_t tok_per_task;  /* token block */
    int64_t n_tok_blocks;
} mm_job;

/* One token: a run of rows. */
static void matvec_rows(const mm_job *j, int64_t task) {
    int64_t r0 = task * j->rows_per_task;
    int64_t r1 = r0 + j->rows_per_task < j->n_rows ? r0 + j->rows_per_task : j->n_rows;
    const uint8_t *x = j->Xq + (j->x_ids ? (size_t)j->x_ids[0] * j->act_row : 0);
    const uint8_t *w = j->W + (size_t)r0 * j->row_stride;
    const uint8_t *end = j->W + (size_t)r1 * j->row_stride;
    const size_t pf = prefetch();
    const uint8_t *next = w; /* first byte not yet prefetched */
    for (int64_t r = r0; r < r1; r++, w += j->row_stride) {
        /* Before each row, ask for everything up to prefetch_bytes past its
         * end into L2 (prefetcht2): the hardware streamer stops at every
         * 4 KiB page and restarts slowly, and the kernels issue loads too
         * sparsely to keep enough misses in flight on their own. The first
         * row asks for its own bytes too: an expert's task is ~16 KiB, and
         * leaving its first 4 KiB to the hardware (a new stream per task)
         * cost about a fifth of the task's bytes. */
        if (pf) {
            const uint8_t *stop = w + j->row_stride + pf < end ? w + j->row_stride + pf : end;
            for (; next < stop; next += 64) __builtin_prefetch(next, 0, 1);
        }
        j->dot(j->n_cols, &j->Y[r], w, x);
    }
}

/* A few tokens (small): a run of rows as the matvec splits and prefetches
 * them, the small-batch kernel taking SMALL_RUN rows per call with every
 * token (each weight block decoded once for all of them). */
#define SMALL_RUN 16
static void small_rows(const mm_job *j, int64_t task) {
    int64_t r0 = task * j->rows_per_task;
    int64_t r1 = r0 + j->rows_per_task < j->n_rows ? r0 + j->rows_per_task : j->n_rows;
    const void *act[QT_GEMM_SMALL_MAX_TOK];
    for (int c = 0; c < j->n_tok; c++) act[c] = j->Xq + (size_t)(j->x_ids ? j->x_ids[c] : c) * j->act_row;
    const uint8_t *end = j->W + (size_t)r1 * j->row_stride, *next = j->W + (size_t)r0 * j->row_stride;
    const size_t pf = prefetch();
    for (int64_t r = r0; r < r1; r += SMALL_RUN) {
        const int nr = r1 - r < SMALL_RUN ? (int)(r1 - r) : SMALL_RUN;
        const uint8_t *w = j->W + (size_t)r * j->row_stride;
        if (pf) { /* as matvec_rows: everything up to prefetch_bytes past this run, into L2 */
            const uint8_t *stop = w + (size_t)nr * j->row_stride + pf < end ? w + (size_t)nr * j->row_stride + pf : end;
            for (; next < stop; next += 64) __builtin_prefetch(next, 0, 1);
        }
        j->small(j->n_cols, nr, (int)j->n_tok, w, j->row_stride, act, &j->Y[r], (size_t)j->ldy);
    }
}

/* Many tokens: a block of rows times a block of tokens, row-outer so that a
 * weight row is loaded once and stays in L1 across the block's tokens. */
static void matmul_tile(const mm_job *j, int64_t task) {
    int64_t rb = task / j->n_tok_blocks, tb = task % j->n_tok_blocks;
    int64_t r0 = rb * j->rows_per_task;
    int64_t r1 = r0 + j->rows_per_task < j->n_rows ? r0 + j->rows_per_task : j->n_rows;
    int64_t t0 = tb * j->tok_per_task;
    int64_t t1 = t0 + j->tok_per_task < j->n_tok ? t0 + j->tok_per_task : j->n_tok;
    if (j->gemm) {
        const uint8_t *w = j->W + (size_t)r0 * j->row_stride;
        for (int64_t t = t0; t < t1; t += j->gemm_max_tok) {
            const int nc = t1 - t < j->gemm_max_tok ? (int)(t1 - t) : j->gemm_max_tok;
            const void *act[QT_GEMM_AMX_MAX_TOK];
            for (int c = 0; c < nc; c++) {
                int64_t xi = j->x_ids ? j->x_ids[t + c] : t + c;
                act[c] = j->Xq + (size_t)xi * j->act_row;
            }
            j->gemm(j->n_cols, (int)(r1 - r0), nc, w, j->row_stride, act, &j->Y[t * j->ldy + r0], (size_t)j->ldy);
        }
        return;
    }
    for (int64_t r = r0; r < r1; r++) {
        const uint8_t *w = j->W + (size_t)r * j->row_stride;
        for (int64_t t = t0; t < t1; t++) {
            int64_t xi = j->x_ids ? j->x_ids[t] : t;
            j->dot(j->n_cols, &j->Y[t * j->ldy + r], w, j->Xq + (size_t)xi * j->act_row);
        }
    }
}

static void run_task(const mm_job *j, int64_t task) {
    if (j->n_tok == 1) matvec_rows(j, task);
    else if (j->small) small_rows(j, task);
    else matmul_tile(j, task);
}

static int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

/* Validates one product and fills its job; returns its task count (0: nothing
 * to do) or -1 with st_error set. */
static int64_t setup_job(mm_job *j, const cpu_mm *m, int n_threads) {
    const qt_traits *tr = check_type("cpu_matmul_q", m->type, m->n_cols);
    if (!tr) return -1;
    size_t min_stride = qt_row_size(m->type, m->n_cols);
    size_t row_stride = m->row_stride ? m->row_stride : min_stride;
    int64_t ldy = m->ldy ? m->ldy : m->n_rows;
    if (row_stride < min_stride) {
        st_error_set("cpu_matmul_q: row stride %zu below the row size %zu", row_stride, min_stride);
        return -1;
    }
    if (m->n_rows < 0 || m->n_tok < 0 || ldy < m->n_rows) {
        st_error_set("cpu_matmul_q: bad shape (rows %lld, tokens %lld, ldy %lld)", (long long)m->n_rows,
                     (long long)m->n_tok, (long long)ldy);
        return -1;
    }
    memset(j, 0, sizeof *j);
    if (m->n_rows == 0 || m->n_tok == 0) return 0;
    j->dot = qt_vec_dot(m->type, qt_cpu_isa());
    j->gemm = m->n_tok >= 2 ? qt_gemm(m->type, qt_cpu_isa()) : NULL;
    j->gemm_max_tok = qt_gemm_max_tok(qt_cpu_isa());
    if (m->n_tok >= 2 && m->n_tok <= qt_gemm_small_max_tok(m->type, qt_cpu_isa()))
        j->small = qt_gemm_small(m->type, qt_cpu_isa());
    j->W = m->W;
    j->row_stride = row_stride;
    j->n_rows = m->n_rows;
    j->n_cols = (int)m->n_cols;
    j->Xq = m->Xq;
    j->act_row = qt_row_size(tr->vec_dot_type, m->n_cols);
    j->x_ids = m->x_ids;
    j->Y = m->Y;
    j->ldy = ldy;
    j->n_tok = m->n_tok;

    if (m->n_tok == 1 || j->small) {
        /* Rows per task: about TASKS_PER_THREAD tasks per thread, but no task
         * under MIN_TASK_BYTES; multiples of 16 rows keep y's cache lines apart. */
        int64_t min_rows = (int64_t)(MIN_TASK_BYTES / row_stride) + 1;
        int64_t rows = ceil_div(m->n_rows, (int64_t)n_threads * TASKS_PER_THREAD);
        if (rows < min_rows) rows = min_rows;
        if (rows >= 16) rows = ceil_div(rows, 16) * 16;
        j->rows_per_task = rows;
        return ceil_div(m->n_rows, rows);
    }
    int64_t tb = (int64_t)(act_block_bytes / j->act_row);
    if (tb < 1) tb = 1;
    if (tb > m->n_tok) tb = m->n_tok;
    j->tok_per_task = tb;
    j->n_tok_blocks = ceil_div(m->n_tok, tb);
    /* A gemm call prepares its tokens once for all its rows: give it as
     * many rows as it takes tokens (64; 256 on the AMX tiles), in multiples
     * of 16 (the kernels' row block), while that still leaves at least 4
     * tasks per thread. */
    int64_t rows = MATMUL_ROW_BLOCK;
    while (j->gemm && rows < j->gemm_max_tok &&
           ceil_div(m->n_rows, 2 * rows) * j->n_tok_blocks >= 4 * (int64_t)n_threads)
        rows *= 2;
    j->rows_per_task = rows;
    return ceil_div(m->n_rows, rows) * j->n_tok_blocks;
}

static void single_task(void *p, int64_t task, int thread) {
    (void)thread;
    run_task(p, task);
}

int cpu_matmul_q(st_pool *pool, const void *W, size_t row_stride, qt_type type, int64_t n_rows, int64_t n_cols,
                 int64_t n_tok, const void *Xq, const int32_t *x_ids, float *Y, int64_t ldy) {
    cpu_mm m = {W, row_stride, type, n_rows, n_cols, n_tok, Xq, x_ids, Y, ldy};
    mm_job j;
    int64_t n_tasks = setup_job(&j, &m, st_pool_n_threads(pool));
    if (n_tasks < 0) return -1;
    st_pool_run(pool, n_tasks, single_task, &j);
    return 0;
}

/* Several products in one dispatch: task t belongs to the product whose
 * range [first[i], first[i+1]) holds it. */
#define BATCH_MAX 64
typedef struct {
    mm_job jobs[BATCH_MAX];
    int64_t first[BATCH_MAX + 1];
    int n;
} batch_job;

static void batch_task(void *p, int64_t task, int thread) {
    (void)thread;
    const batch_job *b = p;
    int lo = 0, hi = b->n - 1; /* the last i with first[i] <= task */
    while (lo < hi) {
        int mid = (lo + hi + 1) / 2;
        if (b->first[mid] <= task) lo = mid;
        else hi = mid - 1;
    }
    run_task(&b->jobs[lo], task - b->first[lo]);
}

int cpu_matmul_q_batch(st_pool *pool, const cpu_mm *mm, int n) {
    int n_threads = st_pool_n_threads(pool);
    static _Thread_local batch_job b; /* ~9 KiB: kept off the stack, one per calling thread */
    /* validate everything first, so that an error leaves every output untouched */
    for (int i = 0; i < n; i++)
        if (setup_job(&b.jobs[0], &mm[i], n_threads) < 0) return -1;
    for (int i0 = 0; i0 < n; i0 += BATCH_MAX) {
        b.n = 0;
        b.first[0] = 0;
        for (int i = i0; i < n && i < i0 + BATCH_MAX; i++) {
            int64_t t = setup_job(&b.jobs[b.n], &mm[i], n_threads);
            if (t == 0) continue; /* empty product: no tasks (and no entry, so ranges stay non-empty) */
            b.first[b.n + 1] = b.first[b.n] + t;
            b.n++;
        }
        if (b.n) st_pool_run(pool, b.first[b.n], batch_task, &b);
    }
    return 0;
}

/* The whole product on the calling thread, its rows in one run (a matvec's
 * prefetch then streams across task boundaries): for a caller whose pool
 * task is already one unit of a larger split, such as one routed expert of
 * a decode step. */
int cpu_matmul_q_here(const cpu_mm *m) {
    mm_job j;
    int64_t n_tasks = setup_job(&j, m, 1);
    if (n_tasks < 0) return -1;
    if ((j.n_tok == 1 || j.small) && n_tasks) {
        j.rows_per_task = j.n_rows;
        n_tasks = 1;
    }
    for (int64_t t = 0; t < n_tasks; t++) run_task(&j, t);
    return 0;
}

/* Quantized activations for n_tok rows of X: X itself when the activation
 * format is F32 (no copy), else a scratch buffer. NULL on bad input. */
static const void *prepare_act(st_pool *pool, cpu_scratch *scratch, qt_type type, int64_t n_cols, int64_t n_tok,
                               const float *X) {
    ST_ASSERT(scratch != NULL);
    const qt_traits *tr = qt_get(type);
    if (tr->vec_dot_type == QT_F32) return X;
    void *Xq = cpu_scratch_reserve(scratch, (size_t)n_tok * qt_row_size(tr->vec_dot_type, n_cols));
    if (cpu_quantize_act(pool, type, n_cols, n_tok, X, Xq) != 0) return NULL;
    return Xq;
}

int cpu_matvec(st_pool *pool, cpu_scratch *scratch, const void *W, size_t row_stride, qt_type type, int64_t n_rows,
               int64_t n_cols, const float *x, float *y) {
    return cpu_matmul(pool, scratch, W, row_stride, type, n_rows, n_cols, 1, x, y);
}

int cpu_matmul(st_pool *pool, cpu_scratch *scratch, const void *W, size_t row_stride, qt_type type, int64_t n_rows,
               int64_t n_cols, int64_t n_tok, const float *X, float *Y) {
    if (!check_type("cpu_matmul", type, n_cols)) return -1;
    if (n_tok <= 0) return n_tok == 0 ? 0 : (st_error_set("cpu_matmul: %lld tokens", (long long)n_tok), -1);
    const void *Xq = prepare_act(pool, scratch, type, n_cols, n_tok, X);
    if (!Xq) return -1;
    return cpu_matmul_q(pool, W, row_stride, type, n_rows, n_cols, n_tok, Xq, NULL, Y, 0);
}
