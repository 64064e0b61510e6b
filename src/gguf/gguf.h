/* GGUF reader and writer.
 *
 * The reader maps the file read-only and validates everything before use:
 * every count, length and offset is checked against the file size, so a
 * truncated, corrupt or hostile file gets an error naming the file and what is
 * wrong (st_error_get()), never a crash or a read past the end. Versions 2 and
 * 3 are read; every metadata type, arrays of arrays included.
 *
 * The writer builds a file in memory-light fashion (metadata and tensor infos
 * first, then data streamed), for `strata synth` and the tests.
 */
#ifndef STRATA_GGUF_GGUF_H
#define STRATA_GGUF_GGUF_H

#include <stddef.h>
#include <stdint.h>

typedef enum {
    GGUF_T_UINT8 = 0,
    GGUF_T_INT8 = 1,
    GGUF_T_UINT16 = 2,
    GGUF_T_INT16 = 3,
    GGUF_T_UINT32 = 4,
    GGUF_T_INT32 = 5,
    GGUF_T_FLOAT32 = 6,
    GGUF_T_BOOL = 7,
    GGUF_T_STRING = 8,
    GGUF_T_ARRAY = 9,
    GGUF_T_UINT64 = 10,
    GGUF_T_INT64 = 11,
    GGUF_T_FLOAT64 = 12,
    GGUF_T_COUNT
} gguf_vtype;

#define GGUF_MAX_DIMS          4
#define GGUF_DEFAULT_ALIGNMENT 32

typedef struct gguf_file gguf_file;

typedef struct {
    const char *name;          /* NUL-terminated copy */
    int n_dims;                /* 1..GGUF_MAX_DIMS */
    int64_t ne[GGUF_MAX_DIMS]; /* ne[0] is the contiguous (row) dimension; unused dims = 1 */
    int type;                  /* qt_type id (quant/blocks.h) */
    uint64_t offset;           /* from the start of the data section */
    uint64_t size;             /* bytes */
    const void *data;          /* into the mapping */
} gguf_tensor;

/* Open and validate. NULL on error with st_error_get() naming path and the problem. */
gguf_file *gguf_open(const char *path);
/* Same, over a caller-owned buffer (fuzzing, tests); the buffer must outlive the handle. */
gguf_file *gguf_open_buffer(const void *buf, size_t size, const char *name);
void gguf_close(gguf_file *f);
/* Maps every page of an mmap'd file in at once, so that computing from the
 * mapping does not fault page by page (4 KiB, or 64 KiB with the kernel's
 * fault-around: a 30B MoE's first tokens on 16 threads spent over half of
 * their expert time in faults). Pages not yet in memory are read from the
 * file; when they exceed max_read bytes nothing is done and 1 is returned
 * (a file larger than the RAM left would evict itself). 0: done; -1: the
 * kernel cannot (MADV_POPULATE_READ needs Linux 5.14), with st_error_get(). */
int gguf_populate(const gguf_file *f, size_t max_read, size_t *to_read);

uint32_t gguf_version(const gguf_file *f);
size_t gguf_alignment(const gguf_file *f);
const char *gguf_path(const gguf_file *f);
size_t gguf_file_size(const gguf_file *f);
/* File offset of the data section: tensor t's bytes start at gguf_data_offset(f) + t->offset
 * (for direct reads from the file, e.g. SSD-resident experts). */
uint64_t gguf_data_offset(const gguf_file *f);

/* ---- metadata ---- */
int64_t gguf_n_kv(const gguf_file *f);
int64_t gguf_find_key(const gguf_file *f, const char *key); /* index or -1 */
const char *gguf_key(const gguf_file *f, int64_t i);
gguf_vtype gguf_kv_type(const gguf_file *f, int64_t i);

/* Typed getters by key: return 0 and fill *out, or -1 (absent or wrong type).
 * Integer getters accept any integer type whose value fits. */
int gguf_get_u32(const gguf_file *f, const char *key, uint32_t *out);
int gguf_get_i64(const gguf_file *f, const char *key, int64_t *out);
int gguf_get_f32(const gguf_file *f, const char *key, float *out);
int gguf_get_bool(const gguf_file *f, const char *key, int *out);
/* Strings point into the mapping and are NOT NUL-terminated: use the length. */
int gguf_get_str(const gguf_file *f, const char *key, const char **s, uint64_t *len);

/* A metadata value, for generic walks (strata info) and arrays. */
typedef struct {
    gguf_vtype type;
    gguf_vtype elem_type;     /* for arrays */
    uint64_t n;               /* array length (1 for scalars) */
    const uint8_t *raw;       /* start of the value's bytes in the mapping: a scalar's bytes; a
                               * string's uint64 length then its bytes; an array's first element
                               * (past the element type and count) */
    const uint64_t *elem_off; /* set by the reader for arrays of strings or arrays: index that
                               * makes element access O(1); NULL means elements are walked */
} gguf_value;

int gguf_get_value(const gguf_file *f, int64_t i, gguf_value *out);
/* Array element access for flat arrays of scalars or strings. */
int gguf_arr_get_i64(const gguf_value *v, uint64_t j, int64_t *out);
int gguf_arr_get_f64(const gguf_value *v, uint64_t j, double *out);
int gguf_arr_get_str(const gguf_value *v, uint64_t j, const char **s, uint64_t *len);
/* For arrays of arrays: element j as a value of its own. */
int gguf_arr_get_value(const gguf_value *v, uint64_t j, gguf_value *out);

/* ---- tensors ---- */
int64_t gguf_n_tensors(const gguf_file *f);
const gguf_tensor *gguf_tensor_at(const gguf_file *f, int64_t i);
const gguf_tensor *gguf_find_tensor(const gguf_file *f, const char *name); /* NULL if absent */

/* ---- writer ---- */
typedef struct gguf_writer gguf_writer;

gguf_writer *gguf_writer_new(void);
void gguf_writer_free(gguf_writer *w);
void gguf_writer_set_alignment(gguf_writer *w, uint32_t alignment); /* also writes general.alignment */
void gguf_w_u32(gguf_writer *w, const char *key, uint32_t v);
void gguf_w_i32(gguf_writer *w, const char *key, int32_t v);
void gguf_w_u64(gguf_writer *w, const char *key, uint64_t v);
void gguf_w_f32(gguf_writer *w, const char *key, float v);
void gguf_w_bool(gguf_writer *w, const char *key, int v);
void gguf_w_str(gguf_writer *w, const char *key, const char *v);
/* Array of scalars: elem_type any scalar type, data packed as in the file (little endian). */
void gguf_w_arr(gguf_writer *w, const char *key, gguf_vtype elem_type, const void *data, uint64_t n);
void gguf_w_arr_str(gguf_writer *w, const char *key, const char *const *v, uint64_t n);
/* Generic: a pre-encoded value (type tag excluded) for arrays of arrays and tests. */
void gguf_w_raw(gguf_writer *w, const char *key, gguf_vtype type, const void *bytes, size_t n);

/* Declare a tensor; its data is supplied later in the same order by gguf_writer_write's callback. */
void gguf_w_tensor(gguf_writer *w, const char *name, int type, int n_dims, const int64_t *ne);

/* Fills buf (size bytes) with tensor i's data. Return 0, or -1 to abort. */
typedef int (*gguf_fill_fn)(void *ctx, int64_t i, void *buf, size_t size);
/* Write the file; tensors' data produced one at a time by fill. 0 or -1 with st_error_get(). */
int gguf_writer_write(gguf_writer *w, const char *path, gguf_fill_fn fill, void *ctx);

#endif
