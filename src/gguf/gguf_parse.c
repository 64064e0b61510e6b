/* Bounds-checked parsing of GGUF metadata values, shared by the reader and
 * the writer's check of pre-encoded values.
 *
 * Every length or count read from the file is compared with the bytes left
 * BEFORE it is used to advance or to allocate: an array that claims 2^60
 * elements fails here because even the smallest element type could not fit,
 * so no allocation is ever sized by an unchecked number. Nesting of arrays is
 * capped (GGUF_MAX_NEST) so a file cannot drive the recursion deep.
 */
#include "gguf/gguf_internal.h"

#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>

#include "core/alloc.h"
#include "core/log.h"

size_t gguf_scalar_size(uint32_t type) {
    switch (type) {
    case GGUF_T_UINT8:
    case GGUF_T_INT8:
    case GGUF_T_BOOL: return 1;
    case GGUF_T_UINT16:
    case GGUF_T_INT16: return 2;
    case GGUF_T_UINT32:
    case GGUF_T_INT32:
    case GGUF_T_FLOAT32: return 4;
    case GGUF_T_UINT64:
    case GGUF_T_INT64:
    case GGUF_T_FLOAT64: return 8;
    default: return 0;
    }
}

const char *gguf_type_name(uint32_t type) {
    static const char *names[GGUF_T_COUNT] = {"uint8", "int8",   "uint16", "int16",  "uint32", "int32",  "float32",
                                              "bool",  "string", "array",  "uint64", "int64",  "float64"};
    return type < GGUF_T_COUNT ? names[type] : "unknown";
}

void gguf_err(const gguf_cur *c, uint64_t at, const char *fmt, ...) {
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    if (c->key) st_error_set("%s: %s, in key '%.80s' (at byte %" PRIu64 ")", c->name, msg, c->key, at);
    else st_error_set("%s: %s (at byte %" PRIu64 ")", c->name, msg, at);
}

int gguf_cur_need(gguf_cur *c, uint64_t n, const char *what) {
    if (n <= c->size - c->pos) return 0;
    gguf_err(c, c->pos, "truncated: %s needs %" PRIu64 " bytes, only %zu left", what, n, c->size - c->pos);
    return -1;
}

/* Appends n zeroed slots to the pool; returns the first slot's index. */
static uint64_t pool_reserve(gguf_u64vec *p, uint64_t n) {
    uint64_t at = p->n;
    if (p->n + n > p->cap) {
        size_t cap = p->cap ? p->cap : 64;
        while (cap < p->n + n) cap *= 2;
        p->v = st_realloc(p->v, cap * sizeof *p->v);
        p->cap = cap;
    }
    memset(p->v + at, 0, n * sizeof *p->v);
    p->n += n;
    return at;
}

static int parse_array(gguf_cur *c, int depth, uint64_t *idx) {
    uint64_t at = c->pos;
    if (depth >= GGUF_MAX_NEST) {
        gguf_err(c, at, "arrays nested deeper than %d levels", GGUF_MAX_NEST);
        return -1;
    }
    if (gguf_cur_need(c, 12, "array header (element type and length)") < 0) return -1;
    uint32_t et = gguf_rd_u32(c->base + c->pos);
    uint64_t n = gguf_rd_u64(c->base + c->pos + 4);
    if (et >= GGUF_T_COUNT) {
        gguf_err(c, at, "unknown value type %u for array elements", et);
        return -1;
    }
    c->pos += 12;
    size_t left = c->size - c->pos;
    size_t esz = gguf_scalar_size(et);
    /* smallest possible element: a scalar's size, an empty string's length
     * prefix, an empty array's header */
    uint64_t min = esz ? esz : (et == GGUF_T_STRING ? 8 : 12);
    if (n > left / min) {
        gguf_err(c, at, "array length %" PRIu64 " of %s exceeds what the %zu bytes left can hold", n,
                 gguf_type_name(et), left);
        return -1;
    }
    if (esz) {
        if (et == GGUF_T_BOOL) {
            for (uint64_t j = 0; j < n; j++) {
                if (c->base[c->pos + j] > 1) {
                    gguf_err(c, c->pos + j, "bool value %u in array is not 0 or 1", c->base[c->pos + j]);
                    return -1;
                }
            }
        }
        c->pos += n * esz;
        return 0;
    }
    /* strings or arrays: record each element's offset so access is O(1) */
    int build = c->pool && idx && n > 0;
    uint64_t p = build ? pool_reserve(c->pool, et == GGUF_T_ARRAY ? 2 * n : n) : 0;
    size_t first = c->pos;
    for (uint64_t j = 0; j < n; j++) {
        if (build) c->pool->v[p + j] = c->pos - first;
        uint64_t sub = UINT64_MAX;
        if (gguf_parse_value(c, et, depth + 1, build ? &sub : NULL) < 0) return -1;
        if (build && et == GGUF_T_ARRAY && sub != UINT64_MAX) c->pool->v[p + n + j] = sub - p;
    }
    if (build) *idx = p;
    return 0;
}

int gguf_parse_value(gguf_cur *c, uint32_t type, int depth, uint64_t *idx) {
    if (idx) *idx = UINT64_MAX;
    uint64_t at = c->pos;
    size_t sz = gguf_scalar_size(type);
    if (sz) {
        if (gguf_cur_need(c, sz, gguf_type_name(type)) < 0) return -1;
        if (type == GGUF_T_BOOL && c->base[c->pos] > 1) {
            gguf_err(c, at, "bool value %u is not 0 or 1", c->base[c->pos]);
            return -1;
        }
        c->pos += sz;
        return 0;
    }
    if (type == GGUF_T_STRING) {
        if (gguf_cur_need(c, 8, "string length") < 0) return -1;
        uint64_t len = gguf_rd_u64(c->base + c->pos);
        size_t left = c->size - c->pos - 8;
        if (len > left) {
            gguf_err(c, at, "string length %" PRIu64 " exceeds the %zu bytes left", len, left);
            return -1;
        }
        c->pos += 8 + len;
        return 0;
    }
    if (type == GGUF_T_ARRAY) return parse_array(c, depth, idx);
    gguf_err(c, at, "unknown value type %u", type);
    return -1;
}

uint64_t gguf_value_size(uint32_t type, const uint8_t *p, int depth) {
    size_t sz = gguf_scalar_size(type);
    if (sz) return sz;
    if (type == GGUF_T_STRING) return 8 + gguf_rd_u64(p);
    ST_ASSERT(type == GGUF_T_ARRAY && depth <= 2 * GGUF_MAX_NEST); /* parse_value bounded the nesting */
    uint32_t et = gguf_rd_u32(p);
    uint64_t n = gguf_rd_u64(p + 4);
    size_t esz = gguf_scalar_size(et);
    if (esz) return 12 + n * esz;
    uint64_t off = 12;
    for (uint64_t j = 0; j < n; j++) off += gguf_value_size(et, p + off, depth + 1);
    return off;
}

int gguf_utf8_valid(const uint8_t *s, size_t n) {
    size_t i = 0;
    while (i < n) {
        uint8_t b = s[i];
        if (b < 0x80) {
            i++;
            continue;
        }
        size_t len;
        uint32_t cp, min;
        if ((b & 0xE0) == 0xC0) len = 2, cp = b & 0x1F, min = 0x80;
        else if ((b & 0xF0) == 0xE0) len = 3, cp = b & 0x0F, min = 0x800;
        else if ((b & 0xF8) == 0xF0) len = 4, cp = b & 0x07, min = 0x10000;
        else return 0;
        if (n - i < len) return 0;
        for (size_t k = 1; k < len; k++) {
            if ((s[i + k] & 0xC0) != 0x80) return 0;
            cp = (cp << 6) | (s[i + k] & 0x3F);
        }
        /* overlong forms, UTF-16 surrogates and values past Unicode are not UTF-8 */
        if (cp < min || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return 0;
        i += len;
    }
    return 1;
}
