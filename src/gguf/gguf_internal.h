/* GGUF internals shared by the reader, the value accessors and the writer.
 *
 * The parser works on a cursor (base, size, pos) over bytes that may be
 * hostile: every read goes through cur_need(), which checks the remaining
 * bytes first, so nothing here reads past the end. The same value parser
 * checks the pre-encoded values the writer is handed (gguf_w_raw).
 *
 * Variable-size array elements (strings, arrays) get an offset index built
 * during parsing, so element j of a 150k-entry vocabulary is O(1), not a walk.
 * Index layout, in one uint64 pool per file, for an array of n elements whose
 * block starts at pool[p]:
 *   pool[p + j]      byte offset of element j from the array's first element
 *   pool[p + n + j]  (arrays of arrays only) distance from p to element j's
 *                    own block, or 0 when element j has fixed-size elements
 */
#ifndef STRATA_GGUF_INTERNAL_H
#define STRATA_GGUF_INTERNAL_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "gguf/gguf.h"

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "the GGUF reader assumes a little-endian host"
#endif

#define GGUF_MAGIC            "GGUF"
#define GGUF_MAX_NEST         8  /* array nesting levels accepted (arrays of arrays of ...) */
#define GGUF_HEADER_BYTES     24 /* magic, version, n_tensors, n_kv */
#define GGUF_MIN_KV_BYTES     14 /* key len (8) + 1-byte key + type (4) + 1-byte value */
#define GGUF_MIN_TENSOR_BYTES 33 /* name len (8) + 1-byte name + n_dims (4) + ne (8) + type (4) + offset (8) */

/* A growable uint64 vector (the index pool). */
typedef struct {
    uint64_t *v;
    size_t n, cap;
} gguf_u64vec;

/* One metadata entry. key is NUL-terminated (a copy); raw points into the file. */
typedef struct {
    const char *key;
    uint64_t key_len;
    uint64_t key_off; /* into the name arena while parsing */
    uint64_t at;      /* byte position of the entry, for messages */
    gguf_vtype type;
    gguf_vtype elem_type;
    uint64_t n;
    const uint8_t *raw; /* as gguf_value.raw */
    uint64_t idx;       /* start of the index block in the pool, or UINT64_MAX */
} gguf_kv;

typedef struct {
    gguf_tensor t;
    uint64_t name_off; /* into the name arena while parsing */
    uint64_t name_len;
    uint64_t at;
} gguf_tinfo;

struct gguf_file {
    char *path;
    const uint8_t *base;
    size_t size;
    int mapped; /* base is an mmap of size bytes */
    uint32_t version;
    size_t alignment;
    uint64_t data_off; /* file offset of the data section */
    int64_t n_kv;
    gguf_kv *kv; /* (n_kv) */
    int64_t n_tensors;
    gguf_tinfo *ti;   /* (n_tensors) */
    char *names;      /* keys and tensor names, each NUL-terminated */
    gguf_u64vec pool; /* array indexes */
    int64_t *kv_hash; /* open addressing, kv index or -1; (kv_mask + 1) */
    uint64_t kv_mask;
    int64_t *t_hash; /* same for tensor names; (t_mask + 1) */
    uint64_t t_mask;
};

/* A cursor over untrusted bytes. name and key only feed error messages. */
typedef struct {
    const uint8_t *base;
    size_t size;
    size_t pos;
    const char *name;  /* file name for messages */
    const char *key;   /* key being parsed (NUL-terminated) or NULL */
    gguf_u64vec *pool; /* where array indexes go; NULL: build none */
} gguf_cur;

static inline uint64_t gguf_rd_u64(const uint8_t *p) {
    uint64_t v;
    memcpy(&v, p, 8);
    return v;
}
static inline uint32_t gguf_rd_u32(const uint8_t *p) {
    uint32_t v;
    memcpy(&v, p, 4);
    return v;
}

/* Size in bytes of a fixed-size scalar type; 0 for string, array and unknown ids. */
size_t gguf_scalar_size(uint32_t type);
const char *gguf_type_name(uint32_t type);

/* Sets the error "NAME: <msg> (at byte AT)" (plus ", in key 'K'" when parsing a value). */
void gguf_err(const gguf_cur *c, uint64_t at, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

/* Checks that n more bytes exist at the cursor; error naming `what` if not. */
int gguf_cur_need(gguf_cur *c, uint64_t n, const char *what);

/* Parses and validates one value of `type` at the cursor, advancing past it.
 * depth = array nesting level of the value (0 for a top-level value). When
 * c->pool is set and the value is an array of strings or arrays, its index
 * block is appended and *idx set to its start (else *idx = UINT64_MAX).
 * 0 or -1 with the error set. */
int gguf_parse_value(gguf_cur *c, uint32_t type, int depth, uint64_t *idx);

/* Bytes of a value that already passed gguf_parse_value (so no bounds checks). */
uint64_t gguf_value_size(uint32_t type, const uint8_t *p, int depth);

/* Strict UTF-8 (no overlongs, surrogates or code points past U+10FFFF). */
int gguf_utf8_valid(const uint8_t *s, size_t n);

/* Tensor type facts: block size and bytes per block; 0 when the type is unknown. */
int gguf_qt_info(uint32_t type, int *blck, int *type_size, const char **name);

/* Size of a tensor in bytes, or -1 with a message in msg (ne product or
 * size overflow, block size). ne[0..n_dims) already checked positive. */
int gguf_tensor_bytes(int type, int n_dims, const int64_t *ne, uint64_t *size, char *msg, size_t msg_n);

/* 64-bit FNV-1a: keys and names index into an open-addressing table. */
static inline uint64_t gguf_hash(const char *s, size_t n) {
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < n; i++) h = (h ^ (uint8_t)s[i]) * 1099511628211ull;
    return h;
}

#endif
