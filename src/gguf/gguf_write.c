/* The GGUF writer (version 3, little-endian).
 *
 * Metadata is encoded into one growing buffer as it is declared; tensors are
 * declared with their shape and type, and their bytes are produced one tensor
 * at a time by the caller's fill callback at write time, so a file far bigger
 * than RAM can be written holding only its largest tensor.
 *
 * The declaring calls return nothing (they read like a builder); the first
 * mistake (a duplicate key, a bad shape, a malformed pre-encoded value) is
 * remembered and gguf_writer_write reports it without writing anything.
 */
#include "gguf/gguf_internal.h"

#include <errno.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "core/alloc.h"
#include "core/log.h"

typedef struct {
    char *name;
    int type, n_dims;
    int64_t ne[GGUF_MAX_DIMS];
    uint64_t size;
} w_tensor;

struct gguf_writer {
    uint8_t *buf; /* encoded key-values */
    size_t n, cap;
    char **keys; /* (n_kv) for duplicate checks */
    int64_t n_kv, keys_cap;
    w_tensor *t; /* (n_t) */
    int64_t n_t, t_cap;
    uint32_t alignment;
    char err[600]; /* first declaration error, reported by gguf_writer_write */
};

static void werr(gguf_writer *w, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void werr(gguf_writer *w, const char *fmt, ...) {
    if (w->err[0]) return; /* keep the first: later ones are often its consequences */
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(w->err, sizeof w->err, fmt, ap);
    va_end(ap);
}

static void put(gguf_writer *w, const void *p, size_t n) {
    if (w->n + n > w->cap) {
        size_t cap = w->cap ? w->cap : 4096;
        while (cap < w->n + n) cap *= 2;
        w->buf = st_realloc(w->buf, cap);
        w->cap = cap;
    }
    if (n) memcpy(w->buf + w->n, p, n); /* p may be NULL for an empty array */
    w->n += n;
}

static void put_u32(gguf_writer *w, uint32_t v) { put(w, &v, 4); }
static void put_u64(gguf_writer *w, uint64_t v) { put(w, &v, 8); }
static void put_str(gguf_writer *w, const char *s, size_t n) {
    put_u64(w, n);
    put(w, s, n);
}

gguf_writer *gguf_writer_new(void) {
    gguf_writer *w = st_calloc(1, sizeof *w);
    w->alignment = GGUF_DEFAULT_ALIGNMENT;
    return w;
}

void gguf_writer_free(gguf_writer *w) {
    if (!w) return;
    for (int64_t i = 0; i < w->n_kv; i++) st_free(w->keys[i]);
    for (int64_t i = 0; i < w->n_t; i++) st_free(w->t[i].name);
    st_free(w->keys);
    st_free(w->t);
    st_free(w->buf);
    st_free(w);
}

/* A name the reader would accept: non-empty valid UTF-8 (NUL-free by strlen). */
static int name_ok(gguf_writer *w, const char *what, const char *s) {
    if (!s || !*s) return werr(w, "empty %s", what), 0;
    if (!gguf_utf8_valid((const uint8_t *)s, strlen(s))) return werr(w, "%s '%.80s' is not valid UTF-8", what, s), 0;
    return 1;
}

/* Starts a key-value: checks the key, records it, writes key and type tag.
 * Returns 0 when the value must not be written (an error was recorded). */
static int begin_kv(gguf_writer *w, const char *key, gguf_vtype type) {
    if (!name_ok(w, "key", key)) return 0;
    for (int64_t i = 0; i < w->n_kv; i++) /* linear: writers declare tens of keys */
        if (!strcmp(w->keys[i], key)) return werr(w, "duplicate key '%.80s'", key), 0;
    if (!strcmp(key, "general.alignment") && type != GGUF_T_UINT32)
        return werr(w, "general.alignment must be uint32, not %s", gguf_type_name(type)), 0;
    if (w->n_kv == w->keys_cap) {
        w->keys_cap = w->keys_cap ? 2 * w->keys_cap : 16;
        w->keys = st_realloc(w->keys, (size_t)w->keys_cap * sizeof *w->keys);
    }
    w->keys[w->n_kv++] = st_strdup(key);
    put_str(w, key, strlen(key));
    put_u32(w, type);
    return 1;
}

void gguf_w_u32(gguf_writer *w, const char *key, uint32_t v) {
    if (!strcmp(key, "general.alignment")) {
        if (v == 0 || (v & (v - 1))) {
            werr(w, "general.alignment = %u is not a nonzero power of two", v);
            return;
        }
        w->alignment = v;
    }
    if (begin_kv(w, key, GGUF_T_UINT32)) put_u32(w, v);
}

void gguf_writer_set_alignment(gguf_writer *w, uint32_t alignment) { gguf_w_u32(w, "general.alignment", alignment); }

void gguf_w_i32(gguf_writer *w, const char *key, int32_t v) {
    if (begin_kv(w, key, GGUF_T_INT32)) put(w, &v, 4);
}

void gguf_w_u64(gguf_writer *w, const char *key, uint64_t v) {
    if (begin_kv(w, key, GGUF_T_UINT64)) put_u64(w, v);
}

void gguf_w_f32(gguf_writer *w, const char *key, float v) {
    if (begin_kv(w, key, GGUF_T_FLOAT32)) put(w, &v, 4);
}

void gguf_w_bool(gguf_writer *w, const char *key, int v) {
    uint8_t b = v != 0;
    if (begin_kv(w, key, GGUF_T_BOOL)) put(w, &b, 1);
}

void gguf_w_str(gguf_writer *w, const char *key, const char *v) {
    if (begin_kv(w, key, GGUF_T_STRING)) put_str(w, v, strlen(v));
}

void gguf_w_arr(gguf_writer *w, const char *key, gguf_vtype elem_type, const void *data, uint64_t n) {
    size_t esz = gguf_scalar_size(elem_type);
    if (!esz) {
        werr(w, "key '%.80s': gguf_w_arr takes scalar elements, not %s", key, gguf_type_name(elem_type));
        return;
    }
    if (elem_type == GGUF_T_BOOL)
        for (uint64_t j = 0; j < n; j++)
            if (((const uint8_t *)data)[j] > 1) {
                werr(w, "key '%.80s': bool element %" PRIu64 " is not 0 or 1", key, j);
                return;
            }
    if (!begin_kv(w, key, GGUF_T_ARRAY)) return;
    put_u32(w, elem_type);
    put_u64(w, n);
    put(w, data, n * esz);
}

void gguf_w_arr_str(gguf_writer *w, const char *key, const char *const *v, uint64_t n) {
    if (!begin_kv(w, key, GGUF_T_ARRAY)) return;
    put_u32(w, GGUF_T_STRING);
    put_u64(w, n);
    for (uint64_t j = 0; j < n; j++) put_str(w, v[j], strlen(v[j]));
}

void gguf_w_raw(gguf_writer *w, const char *key, gguf_vtype type, const void *bytes, size_t n) {
    /* the reader's own parser checks the value, so the writer cannot emit what the reader refuses */
    gguf_cur c = {bytes, n, 0, "gguf_w_raw", NULL, NULL};
    if (gguf_parse_value(&c, type, 0, NULL) < 0) {
        werr(w, "key '%.80s': malformed %s value: %s", key, gguf_type_name(type), st_error_get());
        return;
    }
    if (c.pos != n) {
        werr(w, "key '%.80s': the %s value is %zu bytes, %zu given", key, gguf_type_name(type), c.pos, n);
        return;
    }
    if (!strcmp(key, "general.alignment")) {
        uint32_t a = type == GGUF_T_UINT32 ? gguf_rd_u32(bytes) : 0;
        if (a == 0 || (a & (a - 1))) {
            werr(w, "general.alignment must be a uint32 power of two");
            return;
        }
        w->alignment = a;
    }
    if (begin_kv(w, key, type)) put(w, bytes, n);
}

void gguf_w_tensor(gguf_writer *w, const char *name, int type, int n_dims, const int64_t *ne) {
    if (!name_ok(w, "tensor name", name)) return;
    if (n_dims < 1 || n_dims > GGUF_MAX_DIMS) {
        werr(w, "tensor '%.80s': n_dims = %d, must be 1..%d", name, n_dims, GGUF_MAX_DIMS);
        return;
    }
    for (int64_t i = 0; i < w->n_t; i++)
        if (!strcmp(w->t[i].name, name)) {
            werr(w, "duplicate tensor name '%.80s'", name);
            return;
        }
    w_tensor t = {0};
    t.type = type;
    t.n_dims = n_dims;
    for (int d = 0; d < GGUF_MAX_DIMS; d++) t.ne[d] = d < n_dims ? ne[d] : 1;
    char msg[160];
    if (gguf_tensor_bytes(type, n_dims, t.ne, &t.size, msg, sizeof msg) < 0) {
        werr(w, "tensor '%.80s': %s", name, msg);
        return;
    }
    t.name = st_strdup(name);
    if (w->n_t == w->t_cap) {
        w->t_cap = w->t_cap ? 2 * w->t_cap : 16;
        w->t = st_realloc(w->t, (size_t)w->t_cap * sizeof *w->t);
    }
    w->t[w->n_t++] = t;
}

static uint64_t align_up(uint64_t x, uint64_t a) { return (x + a - 1) / a * a; }

static int write_all(FILE *fp, const void *p, size_t n) { return fwrite(p, 1, n, fp) == n ? 0 : -1; }

static int write_zeros(FILE *fp, uint64_t n) {
    static const uint8_t zeros[256];
    while (n) {
        size_t k = n < sizeof zeros ? (size_t)n : sizeof zeros;
        if (write_all(fp, zeros, k) < 0) return -1;
        n -= k;
    }
    return 0;
}

/* Header, metadata and tensor infos, padded to the alignment. */
static int write_head(gguf_writer *w, FILE *fp, uint64_t *pos) {
    uint32_t version = 3;
    uint64_t n_t = (uint64_t)w->n_t, n_kv = (uint64_t)w->n_kv;
    if (write_all(fp, GGUF_MAGIC, 4) || write_all(fp, &version, 4) || write_all(fp, &n_t, 8) ||
        write_all(fp, &n_kv, 8) || write_all(fp, w->buf, w->n))
        return -1;
    *pos = GGUF_HEADER_BYTES + w->n;
    uint64_t off = 0;
    for (int64_t i = 0; i < w->n_t; i++) {
        const w_tensor *t = &w->t[i];
        uint64_t len = strlen(t->name);
        uint32_t nd = (uint32_t)t->n_dims, type = (uint32_t)t->type;
        if (write_all(fp, &len, 8) || write_all(fp, t->name, len) || write_all(fp, &nd, 4) ||
            write_all(fp, t->ne, 8 * nd) || write_all(fp, &type, 4) || write_all(fp, &off, 8))
            return -1;
        *pos += 8 + len + 4 + 8 * nd + 4 + 8;
        off = align_up(off + t->size, w->alignment);
    }
    uint64_t pad = align_up(*pos, w->alignment) - *pos;
    if (write_zeros(fp, pad)) return -1;
    *pos += pad;
    return 0;
}

int gguf_writer_write(gguf_writer *w, const char *path, gguf_fill_fn fill, void *ctx) {
    if (w->err[0]) {
        st_error_set("%s: not written: %s", path, w->err);
        return -1;
    }
    FILE *fp = fopen(path, "wb");
    if (!fp) {
        st_error_set("%s: cannot create: %s", path, strerror(errno));
        return -1;
    }
    setvbuf(fp, NULL, _IOFBF, 1 << 20);
    uint64_t pos, max = 0;
    for (int64_t i = 0; i < w->n_t; i++) max = w->t[i].size > max ? w->t[i].size : max;
    uint8_t *buf = NULL;
    const char *what = "write failed";
    int rc = write_head(w, fp, &pos);
    if (rc == 0 && w->n_t) buf = st_malloc(max); /* reused for every tensor */
    for (int64_t i = 0; i < w->n_t && rc == 0; i++) {
        const w_tensor *t = &w->t[i];
        if (fill(ctx, i, buf, t->size) < 0) {
            st_error_set("%s: fill callback failed for tensor '%.80s'", path, t->name);
            what = NULL;
            rc = -1;
            break;
        }
        uint64_t pad = align_up(t->size, w->alignment) - t->size;
        rc = write_all(fp, buf, t->size) || write_zeros(fp, pad) ? -1 : 0;
    }
    st_free(buf);
    if (fclose(fp) != 0 && rc == 0) rc = -1;
    if (rc < 0) {
        if (what) st_error_set("%s: %s: %s", path, what, strerror(errno));
        unlink(path); /* never leave a half-written file that looks like a model */
    }
    return rc;
}
