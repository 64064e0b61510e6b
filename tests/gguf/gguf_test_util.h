/* Helpers for the GGUF tests: a byte builder that writes GGUF structures by
 * hand (independently of the writer under test), file helpers, and CHECK.
 *
 * Every encoding here follows the GGUF spec directly (little-endian, uint64
 * lengths, uint32 type tags), so the reader is tested against bytes that the
 * code under test did not produce.
 */
#ifndef STRATA_TESTS_GGUF_UTIL_H
#define STRATA_TESTS_GGUF_UTIL_H

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int g_fail = 0, g_checks = 0;

#define CHECK(c)                                                                                                       \
    do {                                                                                                               \
        g_checks++;                                                                                                    \
        if (!(c)) {                                                                                                    \
            fprintf(stderr, "FAIL %s:%d: %s\n", __FILE__, __LINE__, #c);                                               \
            g_fail++;                                                                                                  \
        }                                                                                                              \
    } while (0)

typedef struct {
    uint8_t *p;
    size_t n, cap;
} bb;

static inline void bb_put(bb *b, const void *d, size_t n) {
    if (b->n + n > b->cap) {
        b->cap = (b->n + n) * 2 + 64;
        b->p = realloc(b->p, b->cap);
        if (!b->p) abort();
    }
    if (n) memcpy(b->p + b->n, d, n);
    b->n += n;
}
static inline void bb_u8(bb *b, uint8_t v) { bb_put(b, &v, 1); }
static inline void bb_u32(bb *b, uint32_t v) { bb_put(b, &v, 4); }
static inline void bb_u64(bb *b, uint64_t v) { bb_put(b, &v, 8); }
static inline void bb_strn(bb *b, const char *s, size_t n) {
    bb_u64(b, n);
    bb_put(b, s, n);
}
static inline void bb_str(bb *b, const char *s) { bb_strn(b, s, strlen(s)); }
static inline void bb_free(bb *b) {
    free(b->p);
    memset(b, 0, sizeof *b);
}

/* GGUF header: magic, version, n_tensors, n_kv */
static inline void bb_header(bb *b, uint32_t version, uint64_t n_tensors, uint64_t n_kv) {
    bb_put(b, "GGUF", 4);
    bb_u32(b, version);
    bb_u64(b, n_tensors);
    bb_u64(b, n_kv);
}
/* key + type tag; the caller appends the value */
static inline void bb_key(bb *b, const char *key, uint32_t type) {
    bb_str(b, key);
    bb_u32(b, type);
}
static inline void bb_kv_u32(bb *b, const char *key, uint32_t v) {
    bb_key(b, key, 4);
    bb_u32(b, v);
}
static inline void bb_kv_str(bb *b, const char *key, const char *v) {
    bb_key(b, key, 8);
    bb_str(b, v);
}

static inline void bb_tinfo(bb *b, const char *name, uint32_t n_dims, const uint64_t *ne, uint32_t type,
                            uint64_t offset) {
    bb_str(b, name);
    bb_u32(b, n_dims);
    for (uint32_t d = 0; d < n_dims; d++) bb_u64(b, ne[d]);
    bb_u32(b, type);
    bb_u64(b, offset);
}
static inline void bb_pad(bb *b, size_t align) {
    while (b->n % align) bb_u8(b, 0);
}
static inline void bb_fill(bb *b, size_t n, uint8_t seed) {
    for (size_t i = 0; i < n; i++) bb_u8(b, (uint8_t)(seed + i * 7));
}

static inline int write_file(const char *path, const void *p, size_t n) {
    FILE *fp = fopen(path, "wb");
    if (!fp) return -1;
    size_t w = fwrite(p, 1, n, fp);
    return fclose(fp) == 0 && w == n ? 0 : -1;
}

static inline uint8_t *read_file(const char *path, size_t *n) {
    FILE *fp = fopen(path, "rb");
    if (!fp) return NULL;
    fseek(fp, 0, SEEK_END);
    long sz = ftell(fp);
    fseek(fp, 0, SEEK_SET);
    uint8_t *p = malloc(sz > 0 ? (size_t)sz : 1);
    if (fread(p, 1, (size_t)sz, fp) != (size_t)sz) {
        free(p);
        fclose(fp);
        return NULL;
    }
    fclose(fp);
    *n = (size_t)sz;
    return p;
}

#endif
