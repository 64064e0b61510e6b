/* Hash maps for the tokenizer (vocabulary text -> id, merge pair -> rank)
 * and the small growable id array the encoder writes into.
 *
 * The tables are sized to at most half full at build time, so linear probing
 * stays short; they never grow after load. Keys of the string map are not
 * copied: they point into the tokenizer's own blobs.
 */
#include <string.h>

#include "../core/alloc.h"
#include "../core/log.h"
#include "tok_internal.h"

static uint64_t table_cap(uint64_t n_keys) {
    uint64_t cap = 16;
    while (cap < 2 * n_keys + 1) cap <<= 1;
    return cap;
}

/* FNV-1a, then a final mix so that short keys spread over the high bits too. */
static uint64_t hash_bytes(const char *s, size_t n) {
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < n; i++) {
        h ^= (uint8_t)s[i];
        h *= 1099511628211ull;
    }
    h ^= h >> 29;
    h *= 0xbf58476d1ce4e5b9ull;
    h ^= h >> 32;
    return h;
}

static uint64_t hash_u64(uint64_t x) {
    x ^= x >> 30;
    x *= 0xbf58476d1ce4e5b9ull;
    x ^= x >> 27;
    x *= 0x94d049bb133111ebull;
    x ^= x >> 31;
    return x;
}

void tok_strmap_init(tok_strmap *m, uint64_t n_keys) {
    uint64_t cap = table_cap(n_keys);
    m->slots = st_malloc(cap * sizeof(*m->slots));
    for (uint64_t i = 0; i < cap; i++) m->slots[i].val = -1;
    m->mask = cap - 1;
}

void tok_strmap_free(tok_strmap *m) {
    st_free(m->slots);
    m->slots = NULL;
}

void tok_strmap_put(tok_strmap *m, const char *key, uint32_t len, int32_t val) {
    ST_ASSERT(val >= 0);
    uint64_t i = hash_bytes(key, len) & m->mask;
    for (;;) {
        tok_strmap_slot *s = &m->slots[i];
        if (s->val < 0) {
            s->key = key;
            s->len = len;
            s->val = val;
            return;
        }
        if (s->len == len && memcmp(s->key, key, len) == 0) return;
        i = (i + 1) & m->mask;
    }
}

int32_t tok_strmap_get(const tok_strmap *m, const char *key, size_t len) {
    uint64_t i = hash_bytes(key, len) & m->mask;
    for (;;) {
        const tok_strmap_slot *s = &m->slots[i];
        if (s->val < 0) return -1;
        if (s->len == len && memcmp(s->key, key, len) == 0) return s->val;
        i = (i + 1) & m->mask;
    }
}

void tok_pairmap_init(tok_pairmap *m, uint64_t n_keys) {
    uint64_t cap = table_cap(n_keys);
    m->slots = st_malloc(cap * sizeof(*m->slots));
    for (uint64_t i = 0; i < cap; i++) m->slots[i].key = UINT64_MAX;
    m->mask = cap - 1;
}

void tok_pairmap_free(tok_pairmap *m) {
    st_free(m->slots);
    m->slots = NULL;
}

void tok_pairmap_put(tok_pairmap *m, int32_t left, int32_t right, int32_t rank, int32_t merged) {
    uint64_t key = (uint64_t)(uint32_t)left << 32 | (uint32_t)right;
    uint64_t i = hash_u64(key) & m->mask;
    for (;;) {
        tok_pairmap_slot *s = &m->slots[i];
        if (s->key == UINT64_MAX) {
            s->key = key;
            s->rank = rank;
            s->merged = merged;
            return;
        }
        if (s->key == key) return; /* a repeated merge keeps its first (best) rank */
        i = (i + 1) & m->mask;
    }
}

int tok_pairmap_get(const tok_pairmap *m, int32_t left, int32_t right, int32_t *rank, int32_t *merged) {
    uint64_t key = (uint64_t)(uint32_t)left << 32 | (uint32_t)right;
    uint64_t i = hash_u64(key) & m->mask;
    for (;;) {
        const tok_pairmap_slot *s = &m->slots[i];
        if (s->key == UINT64_MAX) return -1;
        if (s->key == key) {
            *rank = s->rank;
            *merged = s->merged;
            return 0;
        }
        i = (i + 1) & m->mask;
    }
}

void tok_ids_push(tok_ids *a, int32_t id) {
    if (a->n == a->cap) {
        a->cap = a->cap ? 2 * a->cap : 64;
        a->v = st_realloc(a->v, (size_t)a->cap * sizeof(int32_t));
    }
    a->v[a->n++] = id;
}

int tok_utf8_char(const uint8_t *p, size_t avail) {
    if (avail == 0) return -1;
    uint8_t c = p[0];
    int n;
    uint8_t lo = 0x80, hi = 0xBF; /* allowed range of the second byte */
    if (c < 0x80) return 1;
    else if (c >= 0xC2 && c <= 0xDF) n = 2;
    else if (c >= 0xE0 && c <= 0xEF) {
        n = 3;
        if (c == 0xE0) lo = 0xA0; /* no overlongs */
        if (c == 0xED) hi = 0x9F; /* no surrogates */
    } else if (c >= 0xF0 && c <= 0xF4) {
        n = 4;
        if (c == 0xF0) lo = 0x90;
        if (c == 0xF4) hi = 0x8F; /* nothing past U+10FFFF */
    } else return 0;
    for (int i = 1; i < n; i++) {
        if ((size_t)i >= avail) return -(n - i);
        uint8_t b = p[i];
        if (i == 1 ? (b < lo || b > hi) : (b < 0x80 || b > 0xBF)) return 0;
    }
    return n;
}

int tok_utf8_valid(const char *buf, size_t len) {
    const uint8_t *p = (const uint8_t *)buf;
    size_t i = 0;
    while (i < len) {
        if (p[i] < 0x80) {
            i++;
            continue;
        }
        int n = tok_utf8_char(p + i, len - i);
        if (n <= 0) return 0;
        i += (size_t)n;
    }
    return 1;
}
