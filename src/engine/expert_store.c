/* The host tiers of the experts: RAM arena and SSD reads (expert_store.h).
 *
 * A read is a job: whole 4 KiB blocks of the file (O_DIRECT wants offset,
 * length and buffer aligned to the logical block; 4 KiB covers every
 * device we meet) into a 4 KiB-aligned slot, the matrix then addressed at
 * its offset inside the first block. Jobs go to an io_uring of QD entries,
 * refilled as completions come back; a short read (the file's end) is
 * completed by pread. The ring is set up with the raw syscalls: three
 * mappings (submission ring, completion ring, submission entries), tails and
 * heads shared with the kernel through acquire/release atomics.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE /* O_DIRECT */
#endif
#include "engine/expert_store.h"

#include <errno.h>
#include <fcntl.h>
#include <linux/io_uring.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "core/alloc.h"
#include "core/log.h"
#include "core/switches.h"
#include "core/timer.h"

#define BLK 4096u
#define QD  64u /* reads in flight: enough to keep an NVMe drive's queues busy */

/* A read of the model file failed mid-run (an I/O error, the file cut
 * short under us): no expert to compute with, and a wrong answer is worse
 * than stopping; the server's supervisor restarts the engine. */
static _Noreturn void read_failed(const char *what) {
    st_log(ST_LOG_ERROR, "SSD tier: %s", what);
    abort();
}

/* ---- a minimal io_uring ---- */

typedef struct {
    int fd; /* -1: none (pread) */
    unsigned *sq_head, *sq_tail, *sq_mask, *sq_array;
    unsigned *cq_head, *cq_tail, *cq_mask;
    struct io_uring_sqe *sqes;
    struct io_uring_cqe *cqes;
    void *sq_map, *cq_map;
    size_t sq_map_bytes, cq_map_bytes, sqe_bytes;
    unsigned unsubmitted; /* queued reads the kernel has not taken yet */
} uring;

static int uring_init(uring *r, unsigned entries) {
    memset(r, 0, sizeof *r);
    struct io_uring_params p;
    memset(&p, 0, sizeof p);
    r->fd = (int)syscall(__NR_io_uring_setup, entries, &p);
    if (r->fd < 0) {
        r->fd = -1;
        st_error_set("io_uring_setup: %s", strerror(errno));
        return -1;
    }
    r->sq_map_bytes = p.sq_off.array + p.sq_entries * sizeof(unsigned);
    r->cq_map_bytes = p.cq_off.cqes + p.cq_entries * sizeof(struct io_uring_cqe);
    const int single = (p.features & IORING_FEAT_SINGLE_MMAP) != 0;
    if (single && r->cq_map_bytes > r->sq_map_bytes) r->sq_map_bytes = r->cq_map_bytes;
    r->sq_map =
        mmap(NULL, r->sq_map_bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, r->fd, IORING_OFF_SQ_RING);
    r->cq_map = single ? r->sq_map
                       : mmap(NULL, r->cq_map_bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, r->fd,
                              IORING_OFF_CQ_RING);
    r->sqe_bytes = p.sq_entries * sizeof(struct io_uring_sqe);
    r->sqes = mmap(NULL, r->sqe_bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, r->fd, IORING_OFF_SQES);
    if (r->sq_map == MAP_FAILED || r->cq_map == MAP_FAILED || r->sqes == MAP_FAILED) {
        st_error_set("io_uring mmap: %s", strerror(errno));
        if (r->sqes != MAP_FAILED) munmap(r->sqes, r->sqe_bytes);
        if (r->cq_map != MAP_FAILED && r->cq_map != r->sq_map) munmap(r->cq_map, r->cq_map_bytes);
        if (r->sq_map != MAP_FAILED) munmap(r->sq_map, r->sq_map_bytes);
        close(r->fd);
        r->fd = -1;
        return -1;
    }
    /* IORING_OP_READ came with Linux 5.6; io_uring itself with 5.1, where
     * every read would fail (the probe itself came with 5.6: its absence
     * says the same) */
    struct io_uring_probe *pr = st_calloc(1, sizeof *pr + (IORING_OP_READ + 1) * sizeof(struct io_uring_probe_op));
    const int has_read = syscall(__NR_io_uring_register, r->fd, IORING_REGISTER_PROBE, pr, IORING_OP_READ + 1) >= 0 &&
                         pr->ops_len > IORING_OP_READ && (pr->ops[IORING_OP_READ].flags & IO_URING_OP_SUPPORTED);
    st_free(pr);
    if (!has_read) {
        st_error_set("io_uring without IORING_OP_READ (a kernel before 5.6)");
        munmap(r->sqes, r->sqe_bytes);
        if (r->cq_map != r->sq_map) munmap(r->cq_map, r->cq_map_bytes);
        munmap(r->sq_map, r->sq_map_bytes);
        close(r->fd);
        r->fd = -1;
        return -1;
    }
    uint8_t *sq = r->sq_map, *cq = r->cq_map;
    r->sq_head = (unsigned *)(sq + p.sq_off.head);
    r->sq_tail = (unsigned *)(sq + p.sq_off.tail);
    r->sq_mask = (unsigned *)(sq + p.sq_off.ring_mask);
    r->sq_array = (unsigned *)(sq + p.sq_off.array);
    r->cq_head = (unsigned *)(cq + p.cq_off.head);
    r->cq_tail = (unsigned *)(cq + p.cq_off.tail);
    r->cq_mask = (unsigned *)(cq + p.cq_off.ring_mask);
    r->cqes = (struct io_uring_cqe *)(cq + p.cq_off.cqes);
    return 0;
}

static void uring_free(uring *r) {
    if (r->fd < 0) return;
    munmap(r->sqes, r->sqe_bytes);
    if (r->cq_map != r->sq_map) munmap(r->cq_map, r->cq_map_bytes);
    munmap(r->sq_map, r->sq_map_bytes);
    close(r->fd);
    r->fd = -1;
}

/* Queues one read (not yet submitted to the kernel). */
static void uring_prep_read(uring *r, int fd, void *dst, unsigned len, uint64_t off, uint64_t tag) {
    const unsigned tail = *r->sq_tail, idx = tail & *r->sq_mask;
    struct io_uring_sqe *e = &r->sqes[idx];
    memset(e, 0, sizeof *e);
    e->opcode = IORING_OP_READ;
    e->fd = fd;
    e->off = off;
    e->addr = (uint64_t)(uintptr_t)dst;
    e->len = len;
    e->user_data = tag;
    r->sq_array[idx] = idx;
    __atomic_store_n(r->sq_tail, tail + 1, __ATOMIC_RELEASE);
    r->unsubmitted++;
}

/* Hands the kernel every queued read it has not taken (it may take fewer
 * than offered: the rest are offered again next time) and waits for at
 * least min_done completions. */
static int uring_enter(uring *r, unsigned min_done) {
    for (;;) {
        const long rc = syscall(__NR_io_uring_enter, r->fd, r->unsubmitted, min_done,
                                min_done ? IORING_ENTER_GETEVENTS : 0u, NULL, 0);
        if (rc >= 0) {
            r->unsubmitted -= (unsigned)rc < r->unsubmitted ? (unsigned)rc : r->unsubmitted;
            return 0;
        }
        if (errno != EINTR) return -1;
    }
}

/* The next completion, or 0 when none is waiting. */
static int uring_reap(uring *r, uint64_t *tag, int *res) {
    const unsigned head = *r->cq_head;
    if (head == __atomic_load_n(r->cq_tail, __ATOMIC_ACQUIRE)) return 0;
    const struct io_uring_cqe *c = &r->cqes[head & *r->cq_mask];
    *tag = c->user_data;
    *res = c->res;
    __atomic_store_n(r->cq_head, head + 1, __ATOMIC_RELEASE);
    return 1;
}

/* ---- the store ---- */

typedef struct {
    uint64_t off; /* block-aligned file offset */
    size_t len;   /* bytes to read (whole blocks) */
    size_t need;  /* bytes that must arrive (the rest may be past the file's end) */
    uint8_t *dst; /* block-aligned */
    int e;        /* the expert it belongs to, or -1 */
} job;

struct expert_store {
    const model *m;
    int n_layer, n_expert;
    int fd_direct, fd_buf; /* fd_direct -1: the file system refused O_DIRECT */
    uring ring;
    uint64_t (*t_off)[3]; /* (n_layer) file offset of the gate, up and down stacks */
    size_t (*t_mat)[3];   /* (n_layer) bytes of one expert's matrix in each */
    st_weight (*view)[3]; /* (n_layer) the host weights the lanes read */
    const void **ptr;     /* (n_layer * 3 * n_expert) each matrix's host address */
    uint8_t *ram;         /* (n_layer * n_expert) 1: in the arena */
    uint8_t *arena, *stage, *spare;
    size_t arena_bytes, stage_bytes, stride, span[3];
    const void *pin_arena, *pin_stage;
    st_backend *dev; /* page-locks (and unlocks) the arena and staging, or NULL */
    int pin_refused;
    /* the batch in flight */
    job *jobs;
    int n_jobs, n_sent, n_done, in_flight, layer;
    uint8_t *staged;   /* (n_expert) read by the current batch */
    uint8_t *arrived;  /* (n_expert) the batch's expert is readable (all its reads done, or in RAM) */
    int *pending;      /* (n_expert) its reads not yet done */
    int *list, n_list; /* the batch's experts, in the order given */
    float *lane_tmp;   /* the CPU lane's partial output (expert_store_cpu_lane) */
    size_t lane_tmp_n;
    int32_t *lane_map;       /* (n_expert) the group being computed */
    uint8_t *computed;       /* (n_expert) the CPU lane has computed it */
    int64_t t_begin, t_last; /* the batch's submission, its latest completion */
    expert_store_stats st;
    char mode[48];
};

static const st_weight *layer_w(const model *m, int il, int k) {
    const model_layer *l = &m->layers[il];
    return k == 0 ? &l->ffn_gate_exps : k == 1 ? &l->ffn_up_exps : &l->ffn_down_exps;
}

/* [p, p + len) of the mapping, rounded out to pages (advice) */
static void page_range(const uint8_t *p, size_t len, void **a, size_t *n) {
    const size_t pg = (size_t)sysconf(_SC_PAGESIZE);
    const uintptr_t lo = (uintptr_t)p / pg * pg, hi = st_round_up((uintptr_t)p + len, pg);
    *a = (void *)lo, *n = hi - lo;
}

/* Drops whole pages [p, p + n) of the mapping at map0 from the page cache.
 * A page still being read (the read-around of the header's first fault,
 * in flight) is skipped by the kernel: check with mincore and try again
 * for a while (reads of a few MiB finish in milliseconds). */
static void drop_pages(int fd, const uint8_t *map0, const uint8_t *p, size_t n) {
    const size_t pg = (size_t)sysconf(_SC_PAGESIZE);
    unsigned char vec[256];
    madvise((void *)p, n, MADV_DONTNEED); /* our page tables first, then the cache */
    for (int tries = 0; tries < 100; tries++) {
        posix_fadvise(fd, (off_t)(p - map0), (off_t)n, POSIX_FADV_DONTNEED);
        int left = 0;
        for (size_t off = 0; off < n && !left; off += sizeof vec * pg) {
            const size_t len = n - off < sizeof vec * pg ? n - off : sizeof vec * pg;
            if (mincore((void *)(p + off), len, vec) != 0) return;
            for (size_t i = 0; i < len / pg && !left; i++) left = vec[i] & 1;
        }
        if (!left) return;
        usleep(2000);
    }
}

int expert_store_advise(const model *m, const int32_t *slot, int release) {
    const gguf_file *f = m->file;
    const gguf_tensor *t0 = gguf_tensor_at(f, 0);
    const uint8_t *map0 = (const uint8_t *)t0->data - gguf_data_offset(f) - t0->offset;
    void *a;
    size_t n;
    const int fd = open(gguf_path(f), O_RDONLY | O_CLOEXEC); /* fadvise wants a descriptor */
    if (fd < 0) {
        st_error_set("%s: cannot open: %s", gguf_path(f), strerror(errno));
        return -1;
    }
    if (!release) {
        for (int64_t i = 0; i < gguf_n_tensors(f); i++) {
            const gguf_tensor *t = gguf_tensor_at(f, i);
            if (strstr(t->name, "_exps.")) continue; /* the routed stacks: per expert below */
            page_range(t->data, t->size, &a, &n);
            madvise(a, n, MADV_WILLNEED);
        }
    }
    const int X = m->hp.n_expert;
    for (int il = 0; il < m->hp.n_layer; il++)
        for (int k = 0; k < 3; k++) {
            const st_weight *w = layer_w(m, il, k);
            if (!w->data) continue;
            const size_t mat = (size_t)w->n_out * w->row_bytes;
            /* runs of consecutive experts to drop (pages shared by two of them go too) */
            for (int e = 0, run = -1; e <= X; e++) {
                const int cached = e < X && slot && slot[(size_t)il * X + e] >= 0;
                const int drop = e < X && (release || !cached);
                if (cached && !release) {
                    page_range(st_weight_mat(w, e), mat, &a, &n);
                    madvise(a, n, MADV_WILLNEED);
                }
                if (drop && run < 0) run = e;
                if (drop || run < 0) continue;
                /* whole pages inside the run only: an edge page may hold a neighbour in use */
                const size_t pg = (size_t)sysconf(_SC_PAGESIZE);
                const uintptr_t lo = st_round_up((uintptr_t)st_weight_mat(w, run), pg),
                                hi = ((uintptr_t)st_weight_mat(w, e - 1) + mat) / pg * pg;
                run = -1;
                if (hi > lo) drop_pages(fd, map0, (const uint8_t *)lo, hi - lo);
            }
        }
    close(fd);
    return 0;
}

/* A slot of one expert (arena or staging): each matrix of the largest layer
 * in whole blocks, plus one (it starts anywhere in its first block), so the
 * reads go straight into it. */
size_t expert_store_expert_bytes(const model *m) {
    size_t b = 0;
    for (int k = 0; k < 3; k++) {
        size_t mx = 0;
        for (int il = 0; il < m->hp.n_layer; il++) {
            const st_weight *w = layer_w(m, il, k);
            if (w->data && (size_t)w->n_out * w->row_bytes > mx) mx = (size_t)w->n_out * w->row_bytes;
        }
        b += st_round_up(mx, BLK) + BLK;
    }
    return b;
}

size_t expert_store_staging_bytes(const model *m) {
    return ((size_t)m->hp.n_expert + 1) * expert_store_expert_bytes(m);
}

/* Reads len bytes at off into dst by pread, completing a short or refused
 * read; the buffered descriptor when the offsets are not block-aligned. */
static int read_sync(expert_store *s, uint8_t *dst, uint64_t off, size_t len, size_t need) {
    size_t done = 0;
    while (done < need) {
        const int direct = s->fd_direct >= 0 && off % BLK == 0 && len % BLK == 0 && (uintptr_t)dst % BLK == 0;
        const ssize_t r = pread(direct ? s->fd_direct : s->fd_buf, dst + done, len - done, (off_t)(off + done));
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) {
            st_error_set("%s: read of %zu bytes at %llu failed: %s", gguf_path(s->m->file), len - done,
                         (unsigned long long)(off + done), r < 0 ? strerror(errno) : "end of file");
            return -1;
        }
        done += (size_t)r;
        if (done % BLK) { /* not a block multiple: the rest buffered, from here */
            off += done, dst += done, len -= done, need = need > done ? need - done : 0, done = 0;
            while (done < need) {
                const ssize_t b = pread(s->fd_buf, dst + done, need - done, (off_t)(off + done));
                if (b < 0 && errno == EINTR) continue;
                if (b <= 0) {
                    st_error_set("%s: read failed: %s", gguf_path(s->m->file), b < 0 ? strerror(errno) : "end");
                    return -1;
                }
                done += (size_t)b;
            }
            return 0;
        }
    }
    return 0;
}

static void refuse_direct(expert_store *s, const char *why) {
    ST_WARN("SSD tier: O_DIRECT refused on %s (%s): buffered reads, the page cache keeps what they read",
            gguf_path(s->m->file), why);
    close(s->fd_direct);
    s->fd_direct = -1;
    snprintf(s->mode, sizeof s->mode, "%s, buffered", s->ring.fd >= 0 ? "io_uring" : "pread");
}

/* A job is done: its expert has arrived when its three reads have. */
static void job_done(expert_store *s, const job *j) {
    s->t_last = st_now_ns();
    if (j->e >= 0 && --s->pending[j->e] == 0) s->arrived[j->e] = 1;
}

/* Feeds the ring up to QD jobs in flight; without a ring, reads them all. */
static void pump(expert_store *s) {
    if (s->ring.fd < 0) {
        for (; s->n_sent < s->n_jobs; s->n_sent++, s->n_done++) {
            const job *j = &s->jobs[s->n_sent];
            if (read_sync(s, j->dst, j->off, j->len, j->need) != 0) read_failed(st_error_get());
            job_done(s, j);
        }
        return;
    }
    unsigned n = 0;
    while (s->n_sent < s->n_jobs && s->in_flight < (int)QD) {
        const job *j = &s->jobs[s->n_sent];
        uring_prep_read(&s->ring, s->fd_direct >= 0 ? s->fd_direct : s->fd_buf, j->dst, (unsigned)j->len, j->off,
                        (uint64_t)s->n_sent);
        s->n_sent++, s->in_flight++, n++;
    }
    if ((n || s->ring.unsubmitted) && uring_enter(&s->ring, 0) != 0) read_failed(strerror(errno));
}

/* Takes one completion (waiting for it when block), refills the ring;
 * 0 when none was there and block is 0. */
static int complete_one(expert_store *s, int block) {
    ST_ASSERT(s->ring.fd >= 0); /* preads complete as they are made (pump) */
    uint64_t tag;
    int res;
    while (!uring_reap(&s->ring, &tag, &res)) {
        if (!block) return 0;
        if (uring_enter(&s->ring, 1) != 0) read_failed(strerror(errno));
    }
    s->in_flight--, s->n_done++;
    const job *j = &s->jobs[tag];
    /* EINVAL blames O_DIRECT only when a plain pread of the same blocks on
     * the O_DIRECT descriptor is refused too */
    if (res == -EINVAL && s->fd_direct >= 0 && pread(s->fd_direct, j->dst, j->len, (off_t)j->off) < 0 &&
        errno == EINVAL)
        refuse_direct(s, "the read returned EINVAL");
    if (res < 0 || (size_t)res < j->need) { /* refused, or short: pread finishes it */
        const size_t got = res > 0 ? (size_t)res : 0;
        if (read_sync(s, j->dst + got, j->off + got, j->len - got, j->need - got) != 0) read_failed(st_error_get());
    }
    job_done(s, j);
    pump(s);
    return 1;
}

/* Waits for every job of the batch. */
static void drain(expert_store *s) {
    pump(s);
    while (s->n_done < s->n_jobs) complete_one(s, 1);
}

/* The job for matrix k of expert e of layer il into the slot at dst. */
static void add_job(expert_store *s, int il, int e, int k, uint8_t *dst) {
    const uint64_t off = s->t_off[il][k] + (uint64_t)e * s->t_mat[il][k], a0 = off & ~(uint64_t)(BLK - 1);
    const size_t need = (size_t)(off - a0) + s->t_mat[il][k];
    s->jobs[s->n_jobs++] = (job){a0, st_round_up(need, BLK), need, dst, e};
}

static size_t stage_koff(const expert_store *s, int k) {
    return k == 0 ? 0 : k == 1 ? s->span[0] : s->span[0] + s->span[1];
}

static uint8_t *in_slot(const expert_store *s, uint8_t *slot, int il, int e, int k) {
    const uint64_t off = s->t_off[il][k] + (uint64_t)e * s->t_mat[il][k];
    return slot + stage_koff(s, k) + (size_t)(off % BLK);
}

static void pin(expert_store *s, const void *p, size_t bytes, const void **pinned, const char *what) {
    if (!s->dev || !s->dev->host_register || !s->dev->host_unregister || s->pin_refused || !bytes) return;
    if (s->dev->host_register(s->dev, p, bytes) == 0) {
        *pinned = p;
        return;
    }
    ST_WARN("host tiers: the %s (%.2f GiB) is not page-locked (%s): PCIe copies from it are staged, slower", what,
            (double)bytes / (1ull << 30), st_error_get());
    s->pin_refused = 1; /* one warning: the next would fail the same way */
}

/* populate: fault every page in at once (cheaper than one fault per page
 * while the reads or the device touch them) */
static void *map_anon(size_t bytes, int populate) {
    void *p = mmap(NULL, bytes ? bytes : 1, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS | (populate ? MAP_POPULATE : 0), -1, 0);
    return p == MAP_FAILED ? NULL : p;
}

expert_store *expert_store_open(const model *m, const uint8_t *in_ram, st_backend *dev, int do_pin) {
    const model_hparams *hp = &m->hp;
    const int L = hp->n_layer, X = hp->n_expert;
    const char *path = gguf_path(m->file);
    expert_store *s = st_calloc(1, sizeof *s);
    s->m = m;
    s->n_layer = L, s->n_expert = X;
    s->dev = do_pin ? dev : NULL;
    s->ring.fd = -1;
    s->fd_buf = open(path, O_RDONLY | O_CLOEXEC);
    if (s->fd_buf < 0) {
        st_error_set("%s: cannot open for the SSD tier: %s", path, strerror(errno));
        st_free(s);
        return NULL;
    }
    /* STRATA_SSD_IO forces the fallbacks (tests; a system that misbehaves with them) */
    const char *io = st_switch_get("STRATA_SSD_IO");
    const int no_uring = io && !strncmp(io, "pread", 5), no_direct = io && strstr(io, "buffered");
    s->fd_direct = no_direct ? -1 : open(path, O_RDONLY | O_CLOEXEC | O_DIRECT);
    const int direct_errno = no_direct ? EPERM : s->fd_direct < 0 ? errno : 0;
    if (no_uring) st_error_set("STRATA_SSD_IO=%s", io);
    if (no_uring || uring_init(&s->ring, QD) != 0)
        ST_WARN("SSD tier: io_uring refused (%s): the reads are preads, one at a time", st_error_get());
    snprintf(s->mode, sizeof s->mode, "%s, %s", s->ring.fd >= 0 ? "io_uring" : "pread",
             s->fd_direct >= 0 ? "O_DIRECT" : "buffered");
    if (s->fd_direct < 0)
        ST_WARN("SSD tier: O_DIRECT refused on %s (%s): buffered reads, the page cache keeps what they read", path,
                no_direct ? "STRATA_SSD_IO" : strerror(direct_errno));

    /* where each expert stack is in the file: the mapping's address less its start */
    const gguf_tensor *t0 = gguf_tensor_at(m->file, 0);
    const uint8_t *map0 = (const uint8_t *)t0->data - gguf_data_offset(m->file) - t0->offset;
    s->t_off = st_calloc((size_t)L, sizeof *s->t_off);
    s->t_mat = st_calloc((size_t)L, sizeof *s->t_mat);
    s->view = st_calloc((size_t)L, sizeof *s->view);
    s->ptr = st_calloc((size_t)L * 3 * X, sizeof *s->ptr);
    s->ram = st_calloc((size_t)L * X, 1);
    size_t max_mat[3] = {0};
    for (int il = 0; il < L; il++)
        for (int k = 0; k < 3; k++) {
            const st_weight *w = layer_w(m, il, k);
            if (!w->data) continue;
            ST_ASSERT(!w->mat); /* the GGUF's stacks, in place */
            s->t_off[il][k] = (uint64_t)((const uint8_t *)w->data - map0);
            s->t_mat[il][k] = (size_t)w->n_out * w->row_bytes;
            if (s->t_mat[il][k] > max_mat[k]) max_mat[k] = s->t_mat[il][k];
        }
    /* a matrix starts anywhere in its first block: one block more than its size */
    for (int k = 0; k < 3; k++) s->span[k] = st_round_up(max_mat[k], BLK) + BLK;
    s->stride = s->span[0] + s->span[1] + s->span[2];
    s->stage_bytes = (size_t)X * s->stride;
    long n_ram = 0;
    for (long i = 0; i < (long)L * X; i++) n_ram += in_ram && in_ram[i];
    ST_ASSERT(expert_store_expert_bytes(m) == s->stride);
    ST_ASSERT(expert_store_staging_bytes(m) == s->stage_bytes + s->stride); /* what the plan counted */
    s->arena_bytes = (size_t)n_ram * s->stride;
    s->stage = map_anon(s->stage_bytes, 1);
    s->spare = map_anon(s->stride, 0);
    s->arena = n_ram ? map_anon(s->arena_bytes, 1) : NULL;
    s->jobs = st_malloc((size_t)X * 3 * sizeof(job) > (1u << 16) ? (size_t)X * 3 * sizeof(job) : (1u << 16));
    s->staged = st_calloc((size_t)X, 1);
    s->arrived = st_calloc((size_t)X, 1);
    s->pending = st_calloc((size_t)X, sizeof(int));
    s->list = st_malloc((size_t)X * sizeof(int));
    s->lane_map = st_malloc((size_t)X * sizeof(int32_t));
    s->computed = st_calloc((size_t)X, 1);
    if (!s->stage || !s->spare || (n_ram && !s->arena)) {
        st_error_set("SSD tier: cannot map %.2f GiB of host memory for the RAM tier and staging",
                     (double)(s->arena_bytes + s->stage_bytes) / (1ull << 30));
        expert_store_close(s);
        return NULL;
    }
    pin(s, s->stage, s->stage_bytes, &s->pin_stage, "staging buffer");

    /* the views: RAM-tier experts in the arena, read straight into their
     * slots a layer at a time; the others at their staging positions */
    uint8_t *next = s->arena;
    const int64_t t0ns = st_now_ns();
    int64_t said = t0ns; /* a slow disk is named while the fill runs, every 10 s */
    for (int il = 0; il < L; il++) {
        if (st_now_ns() - said > 10 * (int64_t)1000000000 && next > s->arena) {
            said = st_now_ns();
            const double gb = (double)(next - s->arena) * 1e-9;
            ST_INFO("RAM tier: %.2f of %.2f GB read after %.0f s (%.2f GB/s; layer %d of %d)", gb,
                    (double)s->arena_bytes * 1e-9, (double)(said - t0ns) * 1e-9, gb / ((double)(said - t0ns) * 1e-9),
                    il, L);
        }
        if (!layer_w(m, il, 0)->data) continue;
        s->n_jobs = s->n_sent = s->n_done = 0;
        for (int e = 0; e < X; e++) s->pending[e] = 3;
        for (int e = 0; e < X; e++) {
            const int r = in_ram && in_ram[(size_t)il * X + e];
            uint8_t *slot = r ? next : s->stage + (size_t)e * s->stride;
            for (int k = 0; k < 3; k++) {
                s->ptr[((size_t)il * 3 + k) * X + e] = in_slot(s, slot, il, e, k);
                if (r) add_job(s, il, e, k, slot + stage_koff(s, k));
            }
            if (r) next += s->stride, s->ram[(size_t)il * X + e] = 1;
        }
        drain(s);
        for (int k = 0; k < 3; k++) {
            st_weight *v = &s->view[il][k];
            *v = *layer_w(m, il, k);
            v->mat = &s->ptr[((size_t)il * 3 + k) * X];
            v->data = v->mat[0];
        }
    }
    ST_ASSERT(!n_ram || next <= s->arena + s->arena_bytes); /* (no arena: NULL + 0 is undefined) */
    if (n_ram) {
        pin(s, s->arena, s->arena_bytes, &s->pin_arena, "RAM tier");
        ST_INFO("RAM tier: %ld experts (%.2f GiB) read in %.1f s%s", n_ram, (double)s->arena_bytes / (1ull << 30),
                (double)(st_now_ns() - t0ns) * 1e-9, s->pin_arena ? ", page-locked" : "");
    }
    memset(&s->st, 0, sizeof s->st);
    s->layer = -1;
    return s;
}

void expert_store_close(expert_store *s) {
    if (!s) return;
    if (s->pin_arena) s->dev->host_unregister(s->dev, s->pin_arena);
    if (s->pin_stage) s->dev->host_unregister(s->dev, s->pin_stage);
    uring_free(&s->ring);
    if (s->arena) munmap(s->arena, s->arena_bytes);
    if (s->stage) munmap(s->stage, s->stage_bytes);
    if (s->spare) munmap(s->spare, s->stride);
    if (s->fd_direct >= 0) close(s->fd_direct);
    close(s->fd_buf);
    st_free(s->t_off);
    st_free(s->t_mat);
    st_free(s->view);
    st_free(s->ptr);
    st_free(s->ram);
    st_free(s->jobs);
    st_free(s->staged);
    st_free(s->arrived);
    st_free(s->pending);
    st_free(s->list);
    st_free(s->lane_map);
    st_free(s->computed);
    st_free(s->lane_tmp);
    st_free(s);
}

void expert_store_begin(expert_store *s, int il, const int *list, int n) {
    ST_ASSERT(s->n_done == s->n_jobs); /* the last batch was waited for */
    memset(s->staged, 0, (size_t)s->n_expert);
    memset(s->arrived, 0, (size_t)s->n_expert);
    s->layer = il;
    s->n_jobs = s->n_sent = s->n_done = 0;
    memcpy(s->list, list, (size_t)n * sizeof(int));
    s->n_list = n;
    for (int i = 0; i < n; i++) {
        const int e = list[i];
        if (s->ram[(size_t)il * s->n_expert + e]) {
            s->st.ram++;
            s->arrived[e] = 1;
            continue;
        }
        s->staged[e] = 1;
        s->pending[e] = 3;
        for (int k = 0; k < 3; k++) add_job(s, il, e, k, s->stage + (size_t)e * s->stride + stage_koff(s, k));
    }
    s->t_begin = st_now_ns();
    pump(s);
}

void expert_store_wait_first(expert_store *s, int il, int n, const st_weight **g, const st_weight **u,
                             const st_weight **d) {
    ST_ASSERT(il == s->layer && n <= s->n_list);
    pump(s);
    for (int i = 0; i < n; i++)
        while (!s->arrived[s->list[i]]) complete_one(s, 1);
    *g = &s->view[il][0], *u = &s->view[il][1], *d = &s->view[il][2];
}

void expert_store_cpu_lane(expert_store *s, st_backend *cpu, int il, const float *x, int n_tok, int k,
                           const int32_t *sel, const float *wsel, const int32_t *map, st_act act, int64_t n_embd,
                           float *out) {
    ST_ASSERT(il == s->layer);
    const int X = s->n_expert;
    const st_weight *g = &s->view[il][0], *u = &s->view[il][1], *d = &s->view[il][2];
    const size_t n_out = (size_t)n_tok * (size_t)n_embd;
    if (s->lane_tmp_n < n_out) {
        st_free(s->lane_tmp);
        s->lane_tmp = st_malloc(n_out * sizeof(float));
        s->lane_tmp_n = n_out;
    }
    uint8_t *done = s->computed;
    memset(done, 0, (size_t)X);
    int first = 1, left = 0;
    for (int e = 0; e < X; e++) left += map[e] >= 0;
    while (left > 0) {
        /* what has arrived: all of it, then one group; else wait for one more read */
        while (s->ring.fd >= 0 && complete_one(s, 0)) {
        }
        int n = 0;
        for (int e = 0; e < X; e++) {
            const int go = map[e] >= 0 && s->arrived[e] && !done[e];
            s->lane_map[e] = go ? e : -1;
            if (go) done[e] = 1, n++;
        }
        if (!n) {
            complete_one(s, 1);
            continue;
        }
        cpu->moe_experts(cpu, x, n_tok, X, k, sel, wsel, s->lane_map, act, g, u, d, first ? out : s->lane_tmp);
        if (!first)
            for (size_t i = 0; i < n_out; i++) out[i] += s->lane_tmp[i];
        first = 0;
        left -= n;
    }
}

void expert_store_wait(expert_store *s, int il, const st_weight **g, const st_weight **u, const st_weight **d) {
    ST_ASSERT(il == s->layer);
    if (s->n_jobs) {
        drain(s);
        s->st.ns += (uint64_t)(s->t_last - s->t_begin); /* the reads, not what ran while they did */
        s->st.matrices += (uint64_t)s->n_jobs;
        for (int i = 0; i < s->n_jobs; i++) s->st.bytes += s->jobs[i].len;
    }
    *g = &s->view[il][0], *u = &s->view[il][1], *d = &s->view[il][2];
}

void expert_store_expert(expert_store *s, int il, int e, const void *mat[3]) {
    const size_t X = (size_t)s->n_expert;
    if (s->ram[il * X + e] || (s->layer == il && s->staged[e] && s->n_done == s->n_jobs)) {
        for (int k = 0; k < 3; k++) mat[k] = s->ptr[((size_t)il * 3 + k) * X + e];
        return;
    }
    for (int k = 0; k < 3; k++) {
        const uint64_t off = s->t_off[il][k] + (uint64_t)e * s->t_mat[il][k], a0 = off & ~(uint64_t)(BLK - 1);
        const size_t need = (size_t)(off - a0) + s->t_mat[il][k];
        if (read_sync(s, s->spare + stage_koff(s, k), a0, st_round_up(need, BLK), need) != 0)
            read_failed(st_error_get());
        mat[k] = in_slot(s, s->spare, il, e, k);
        s->st.bytes += st_round_up(need, BLK);
        s->st.matrices++;
    }
}

const expert_store_stats *expert_store_stats_get(const expert_store *s) { return &s->st; }

const char *expert_store_mode(const expert_store *s) { return s->mode; }

void *expert_store_scratch(expert_store *s, size_t *bytes) {
    *bytes = s->stage_bytes;
    return s->stage;
}

double expert_store_seq_rate(expert_store *s, size_t bytes) {
    ST_ASSERT(s->n_done == s->n_jobs);
    uint64_t start = 0;
    for (int il = 0; il < s->n_layer && !start; il++) start = s->t_off[il][0] & ~(uint64_t)(BLK - 1);
    const size_t file = gguf_file_size(s->m->file);
    if (start >= file) return 0;
    if (bytes > file - start) bytes = file - start;
    size_t chunk = (size_t)4 << 20;
    while (chunk > BLK && chunk * 8 > s->stage_bytes) chunk /= 2;
    size_t n_buf = s->stage_bytes / chunk; /* QD in flight, as a layer's reads go (contents unused) */
    if (n_buf > QD) n_buf = QD;
    const size_t n = bytes / chunk;
    if (!n) return 0;
    const int64_t t0 = st_now_ns();
    for (size_t done = 0; done < n;) { /* batches of the job array's size */
        s->n_jobs = s->n_sent = s->n_done = 0;
        for (; done < n && s->n_jobs < 512; done++)
            s->jobs[s->n_jobs++] =
                (job){start + done * chunk, chunk, chunk, s->stage + (size_t)s->n_jobs % n_buf * chunk, -1};
        drain(s);
    }
    const double t = (double)(st_now_ns() - t0) * 1e-9;
    s->n_jobs = s->n_sent = s->n_done = 0;
    s->layer = -1;
    return (double)(n * chunk) / t;
}
