/* The GGUF reader: maps a file (or takes a caller's buffer), parses the
 * header, the metadata and the tensor infos, and validates all of it before
 * the handle is returned, so the rest of Strata can trust what it reads.
 *
 * Cost is O(header) plus O(n log n) in the number of tensors (the overlap
 * check sorts by offset); the tensor data is never touched, so opening a
 * 100+ GB file reads only its first pages. Keys and tensor names go into
 * hash tables; building them is also where duplicates are found.
 *
 * Each defect has its own message, "FILE: what is wrong (at byte N)"; the
 * list is in docs/gguf.md and each is exercised by tests/gguf.
 */
#include "gguf/gguf_internal.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/alloc.h"
#include "core/log.h"

/* Growable char arena for the NUL-terminated copies of keys and names. */
typedef struct {
    char *p;
    size_t n, cap;
} arena;

static uint64_t arena_add(arena *a, const uint8_t *s, size_t len) {
    if (a->n + len + 1 > a->cap) {
        size_t cap = a->cap ? a->cap : 4096;
        while (cap < a->n + len + 1) cap *= 2;
        a->p = st_realloc(a->p, cap);
        a->cap = cap;
    }
    uint64_t at = a->n;
    memcpy(a->p + at, s, len);
    a->p[at + len] = 0;
    a->n += len + 1;
    return at;
}

/* Reads a length-prefixed name (a key or a tensor name) and checks it:
 * non-empty, inside the file, valid UTF-8, no NUL byte inside. */
static int read_name(gguf_cur *c, arena *a, const char *what, uint64_t *off, uint64_t *len) {
    uint64_t at = c->pos;
    char need_what[64];
    snprintf(need_what, sizeof need_what, "%s length", what);
    if (gguf_cur_need(c, 8, need_what) < 0) return -1;
    uint64_t n = gguf_rd_u64(c->base + c->pos);
    size_t left = c->size - c->pos - 8;
    if (n > left) {
        gguf_err(c, at, "%s length %" PRIu64 " exceeds the %zu bytes left", what, n, left);
        return -1;
    }
    const uint8_t *s = c->base + c->pos + 8;
    if (n == 0) {
        gguf_err(c, at, "empty %s", what);
        return -1;
    }
    if (!gguf_utf8_valid(s, n)) {
        gguf_err(c, at, "%s is not valid UTF-8", what);
        return -1;
    }
    if (memchr(s, 0, n)) {
        gguf_err(c, at, "%s contains a NUL byte", what);
        return -1;
    }
    *off = arena_add(a, s, n);
    *len = n;
    c->pos += 8 + n;
    return 0;
}

/* Growth for the kv and tensor arrays: their size follows what was actually
 * parsed, never the count the file claims. */
static void *grow(void *p, int64_t n, int64_t *cap, size_t elem) {
    if (n < *cap) return p;
    *cap = *cap ? *cap * 2 : 16;
    return st_realloc(p, (size_t)*cap * elem);
}

static uint64_t hash_cap(int64_t n) {
    uint64_t cap = 16;
    while (cap < (uint64_t)n * 2) cap *= 2;
    return cap;
}

static int parse_kvs(gguf_file *f, gguf_cur *c, arena *names, uint64_t n_kv) {
    int64_t cap = 0;
    for (uint64_t i = 0; i < n_kv; i++) {
        f->kv = grow(f->kv, f->n_kv, &cap, sizeof *f->kv);
        gguf_kv *kv = &f->kv[f->n_kv];
        memset(kv, 0, sizeof *kv);
        kv->at = c->pos;
        if (read_name(c, names, "key", &kv->key_off, &kv->key_len) < 0) return -1;
        c->key = names->p + kv->key_off; /* names has no growth until the next key */
        uint64_t tat = c->pos;
        if (gguf_cur_need(c, 4, "value type") < 0) return -1;
        uint32_t type = gguf_rd_u32(c->base + c->pos);
        if (type >= GGUF_T_COUNT) {
            gguf_err(c, tat, "unknown value type %u", type);
            return -1;
        }
        c->pos += 4;
        kv->type = (gguf_vtype)type;
        kv->n = 1;
        kv->elem_type = kv->type;
        kv->raw = c->base + c->pos;
        if (type == GGUF_T_ARRAY && c->size - c->pos >= 12) {
            kv->elem_type = (gguf_vtype)gguf_rd_u32(kv->raw);
            kv->n = gguf_rd_u64(kv->raw + 4);
            kv->raw += 12;
        }
        if (gguf_parse_value(c, type, 0, &kv->idx) < 0) return -1;
        c->key = NULL;
        f->n_kv++;
    }
    return 0;
}

static int read_alignment(gguf_file *f, gguf_cur *c) {
    f->alignment = GGUF_DEFAULT_ALIGNMENT;
    int64_t i = gguf_find_key(f, "general.alignment");
    if (i < 0) return 0;
    const gguf_kv *kv = &f->kv[i];
    if (kv->type != GGUF_T_UINT32) {
        gguf_err(c, kv->at, "general.alignment has type %s, must be uint32", gguf_type_name(kv->type));
        return -1;
    }
    uint32_t a = gguf_rd_u32(kv->raw);
    if (a == 0 || (a & (a - 1))) {
        gguf_err(c, kv->at, "general.alignment = %u is not a nonzero power of two", a);
        return -1;
    }
    f->alignment = a;
    return 0;
}

static int parse_tensor_infos(gguf_file *f, gguf_cur *c, arena *names, uint64_t n_tensors) {
    int64_t cap = 0;
    for (uint64_t i = 0; i < n_tensors; i++) {
        f->ti = grow(f->ti, f->n_tensors, &cap, sizeof *f->ti);
        gguf_tinfo *ti = &f->ti[f->n_tensors];
        memset(ti, 0, sizeof *ti);
        ti->at = c->pos;
        if (read_name(c, names, "tensor name", &ti->name_off, &ti->name_len) < 0) return -1;
        const char *name = names->p + ti->name_off;
        uint64_t at = c->pos;
        if (gguf_cur_need(c, 4, "tensor n_dims") < 0) return -1;
        uint32_t n_dims = gguf_rd_u32(c->base + c->pos);
        if (n_dims < 1 || n_dims > GGUF_MAX_DIMS) {
            gguf_err(c, at, "tensor '%.80s': n_dims = %u, must be 1..%d", name, n_dims, GGUF_MAX_DIMS);
            return -1;
        }
        c->pos += 4;
        if (gguf_cur_need(c, 8ull * n_dims + 12, "tensor shape, type and offset") < 0) return -1;
        ti->t.n_dims = (int)n_dims;
        for (int d = 0; d < GGUF_MAX_DIMS; d++) {
            uint64_t v = d < (int)n_dims ? gguf_rd_u64(c->base + c->pos + 8 * d) : 1;
            if (v == 0 || v > INT64_MAX) {
                gguf_err(c, c->pos + 8 * d, "tensor '%.80s': ne[%d] = %" PRId64 " is not positive", name, d,
                         (int64_t)v);
                return -1;
            }
            ti->t.ne[d] = (int64_t)v;
        }
        c->pos += 8 * n_dims;
        uint32_t type = gguf_rd_u32(c->base + c->pos);
        ti->t.type = (int)type;
        char msg[160];
        if (type > INT32_MAX || gguf_tensor_bytes((int)type, (int)n_dims, ti->t.ne, &ti->t.size, msg, sizeof msg) < 0) {
            if (type > INT32_MAX) snprintf(msg, sizeof msg, "unknown tensor type %u", type);
            gguf_err(c, at, "tensor '%.80s': %s", name, msg);
            return -1;
        }
        ti->t.offset = gguf_rd_u64(c->base + c->pos + 4);
        c->pos += 12;
        f->n_tensors++;
    }
    return 0;
}

/* Builds an open-addressing table over names; reports the first duplicate. */
static int build_hash(gguf_cur *c, int64_t n, const char *what, int64_t **table, uint64_t *mask,
                      const char *(*name_of)(const gguf_file *, int64_t, uint64_t *, uint64_t *), const gguf_file *f) {
    uint64_t cap = hash_cap(n);
    int64_t *t = st_malloc(cap * sizeof *t);
    memset(t, 0xff, cap * sizeof *t); /* all -1 */
    *table = t;
    *mask = cap - 1;
    for (int64_t i = 0; i < n; i++) {
        uint64_t len, at;
        const char *s = name_of(f, i, &len, &at);
        uint64_t h = gguf_hash(s, len) & (cap - 1);
        for (;; h = (h + 1) & (cap - 1)) {
            if (t[h] < 0) {
                t[h] = i;
                break;
            }
            uint64_t len2, at2;
            const char *s2 = name_of(f, t[h], &len2, &at2);
            if (len2 == len && !memcmp(s, s2, len)) {
                gguf_err(c, at, "duplicate %s '%.80s' (first at byte %" PRIu64 ")", what, s, at2);
                return -1;
            }
        }
    }
    return 0;
}

static const char *kv_name(const gguf_file *f, int64_t i, uint64_t *len, uint64_t *at) {
    *len = f->kv[i].key_len;
    *at = f->kv[i].at;
    return f->kv[i].key;
}

static const char *tensor_name(const gguf_file *f, int64_t i, uint64_t *len, uint64_t *at) {
    *len = f->ti[i].name_len;
    *at = f->ti[i].at;
    return f->ti[i].t.name;
}

typedef struct {
    uint64_t offset;
    int64_t i;
} by_offset;

static int cmp_offset(const void *a, const void *b) {
    uint64_t x = ((const by_offset *)a)->offset, y = ((const by_offset *)b)->offset;
    return x < y ? -1 : x > y;
}

/* Places every tensor in the data section: aligned, inside the file, and
 * (our choice, stricter than ggml) no two tensors sharing a byte. */
static int check_tensor_data(gguf_file *f, gguf_cur *c) {
    uint64_t end_info = c->pos;
    uint64_t a = f->alignment;
    if (end_info > UINT64_MAX - (a - 1)) return gguf_err(c, end_info, "data section offset overflows"), -1;
    f->data_off = (end_info + a - 1) / a * a;
    if (f->n_tensors == 0) return 0;
    if (f->data_off > f->size) {
        gguf_err(c, end_info,
                 "truncated: the data section would start at byte %" PRIu64 ", past the end of the file (%zu bytes)",
                 f->data_off, f->size);
        return -1;
    }
    uint64_t room = f->size - f->data_off;
    for (int64_t i = 0; i < f->n_tensors; i++) {
        gguf_tensor *t = &f->ti[i].t;
        uint64_t at = f->ti[i].at;
        if (t->offset % a) {
            gguf_err(c, at, "tensor '%.80s': offset %" PRIu64 " is not a multiple of the alignment %zu", t->name,
                     t->offset, f->alignment);
            return -1;
        }
        if (t->offset > room || t->size > room - t->offset) {
            gguf_err(c, at,
                     "tensor '%.80s': data (offset %" PRIu64 ", %" PRIu64 " bytes) runs past the end of "
                     "the file (%" PRIu64 " bytes of data)",
                     t->name, t->offset, t->size, room);
            return -1;
        }
        t->data = f->base + f->data_off + t->offset;
    }
    by_offset *order = st_malloc((size_t)f->n_tensors * sizeof *order);
    for (int64_t i = 0; i < f->n_tensors; i++) order[i] = (by_offset){f->ti[i].t.offset, i};
    qsort(order, (size_t)f->n_tensors, sizeof *order, cmp_offset);
    int rc = 0;
    for (int64_t k = 1; k < f->n_tensors && rc == 0; k++) {
        const gguf_tensor *p = &f->ti[order[k - 1].i].t, *q = &f->ti[order[k].i].t;
        if (p->offset + p->size > q->offset) {
            gguf_err(c, f->ti[order[k].i].at, "tensor data of '%.80s' and '%.80s' overlap", p->name, q->name);
            rc = -1;
        }
    }
    st_free(order);
    return rc;
}

static int parse_header(gguf_cur *c, uint32_t *version, uint64_t *n_tensors, uint64_t *n_kv) {
    if (c->size < 4) {
        gguf_err(c, 0, "truncated: %zu bytes, too short for the GGUF magic", c->size);
        return -1;
    }
    if (memcmp(c->base, GGUF_MAGIC, 4)) {
        const uint8_t *m = c->base;
        gguf_err(c, 0, "not a GGUF file: magic is %02x %02x %02x %02x, expected \"GGUF\"", m[0], m[1], m[2], m[3]);
        return -1;
    }
    c->pos = 4;
    if (gguf_cur_need(c, 4, "version") < 0) return -1;
    uint32_t v = gguf_rd_u32(c->base + 4);
    if (v == 1) {
        gguf_err(c, 4, "GGUF version 1 is not supported (Strata reads versions 2 and 3)");
        return -1;
    }
    if (v != 2 && v != 3) {
        if ((v & 0xffff) == 0)
            gguf_err(c, 4,
                     "unsupported GGUF version 0x%08x: the file looks big-endian; Strata reads "
                     "little-endian files only",
                     v);
        else gguf_err(c, 4, "unsupported GGUF version %u (Strata reads versions 2 and 3)", v);
        return -1;
    }
    *version = v;
    c->pos = 8;
    if (gguf_cur_need(c, 16, "tensor and key-value counts") < 0) return -1;
    *n_tensors = gguf_rd_u64(c->base + 8);
    *n_kv = gguf_rd_u64(c->base + 16);
    c->pos = GGUF_HEADER_BYTES;
    size_t left = c->size - c->pos;
    /* the counts must be possible before anything is sized by them */
    if (*n_kv > left / GGUF_MIN_KV_BYTES) {
        gguf_err(c, 16, "n_kv = %" PRIu64 " key-values cannot fit in the %zu bytes left", *n_kv, left);
        return -1;
    }
    if (*n_tensors > left / GGUF_MIN_TENSOR_BYTES) {
        gguf_err(c, 8, "n_tensors = %" PRIu64 " tensor infos cannot fit in the %zu bytes left", *n_tensors, left);
        return -1;
    }
    return 0;
}

static gguf_file *parse(gguf_file *f) {
    gguf_cur c = {f->base, f->size, 0, f->path, NULL, &f->pool};
    arena names = {0};
    uint64_t n_tensors, n_kv;
    if (parse_header(&c, &f->version, &n_tensors, &n_kv) < 0) goto fail;
    if (parse_kvs(f, &c, &names, n_kv) < 0) goto fail;
    /* a second check now that the metadata is read: each info needs 33 bytes */
    if (n_tensors > (c.size - c.pos) / GGUF_MIN_TENSOR_BYTES) {
        gguf_err(&c, 8, "n_tensors = %" PRIu64 " tensor infos cannot fit in the %zu bytes after the metadata",
                 n_tensors, c.size - c.pos);
        goto fail;
    }
    if (parse_tensor_infos(f, &c, &names, n_tensors) < 0) goto fail;
    /* the arena stopped growing: turn offsets into pointers */
    f->names = names.p;
    names.p = NULL;
    for (int64_t i = 0; i < f->n_kv; i++) f->kv[i].key = f->names + f->kv[i].key_off;
    for (int64_t i = 0; i < f->n_tensors; i++) f->ti[i].t.name = f->names + f->ti[i].name_off;
    if (build_hash(&c, f->n_kv, "key", &f->kv_hash, &f->kv_mask, kv_name, f) < 0) goto fail;
    if (build_hash(&c, f->n_tensors, "tensor name", &f->t_hash, &f->t_mask, tensor_name, f) < 0) goto fail;
    if (read_alignment(f, &c) < 0) goto fail;
    if (check_tensor_data(f, &c) < 0) goto fail;
    return f;
fail:
    st_free(names.p);
    gguf_close(f);
    return NULL;
}

gguf_file *gguf_open_buffer(const void *buf, size_t size, const char *name) {
    gguf_file *f = st_calloc(1, sizeof *f);
    f->path = st_strdup(name ? name : "<buffer>");
    f->base = buf;
    f->size = buf ? size : 0;
    return parse(f);
}

gguf_file *gguf_open(const char *path) {
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        st_error_set("%s: cannot open: %s", path, strerror(errno));
        return NULL;
    }
    struct stat st;
    if (fstat(fd, &st) < 0 || !S_ISREG(st.st_mode)) {
        st_error_set("%s: not a regular file", path);
        close(fd);
        return NULL;
    }
    gguf_file *f = st_calloc(1, sizeof *f);
    f->path = st_strdup(path);
    f->size = (size_t)st.st_size;
    if (f->size > 0) {
        void *p = mmap(NULL, f->size, PROT_READ, MAP_PRIVATE, fd, 0);
        if (p == MAP_FAILED) {
            st_error_set("%s: mmap of %zu bytes failed: %s", path, f->size, strerror(errno));
            close(fd);
            gguf_close(f);
            return NULL;
        }
        f->base = p;
        f->mapped = 1;
    }
    close(fd); /* the mapping keeps the file */
    return parse(f);
}

#ifndef MADV_POPULATE_READ
#define MADV_POPULATE_READ 22 /* Linux 5.14 */
#endif

int gguf_populate(const gguf_file *f, size_t max_read, size_t *to_read) {
    *to_read = 0;
    if (!f->mapped) return 0;
    const size_t page = (size_t)sysconf(_SC_PAGESIZE), n = (f->size + page - 1) / page;
    unsigned char *vec = st_malloc(n);
    if (mincore((void *)f->base, f->size, vec) == 0) {
        for (size_t i = 0; i < n; i++) *to_read += !(vec[i] & 1);
        *to_read *= page;
    } else {
        *to_read = f->size; /* unknown: counted as all to read */
    }
    st_free(vec);
    if (*to_read > max_read) return 1;
    if (madvise((void *)f->base, f->size, MADV_POPULATE_READ) != 0) {
        st_error_set("%s: mapping the file's pages in at once: %s", f->path, strerror(errno));
        return -1;
    }
    return 0;
}

void gguf_close(gguf_file *f) {
    if (!f) return;
    if (f->mapped) munmap((void *)f->base, f->size);
    st_free(f->path);
    st_free(f->kv);
    st_free(f->ti);
    st_free(f->names);
    st_free(f->pool.v);
    st_free(f->kv_hash);
    st_free(f->t_hash);
    st_free(f);
}
