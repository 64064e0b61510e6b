/* Checked allocation (see alloc.h). 64-byte alignment suits AVX-512 loads and cache lines. */
#include "core/alloc.h"
#include "core/log.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static _Noreturn void oom(size_t n) {
    fprintf(stderr, "strata: out of memory allocating %zu bytes\n", n);
    abort();
}

void *st_malloc(size_t n) {
    void *p = NULL;
    if (posix_memalign(&p, 64, n ? n : 1) != 0) oom(n);
    return p;
}

void *st_calloc(size_t count, size_t size) {
    if (size && count > SIZE_MAX / size) oom(SIZE_MAX);
    void *p = st_malloc(count * size);
    memset(p, 0, count * size);
    return p;
}

void *st_malloc_pages(size_t n) {
    const size_t pg = (size_t)sysconf(_SC_PAGESIZE);
    if (n > SIZE_MAX - pg) oom(n);
    const size_t bytes = n ? st_round_up(n, pg) : pg;
    void *p = NULL;
    if (posix_memalign(&p, pg, bytes) != 0) oom(n);
    return p;
}

void *st_realloc(void *p, size_t n) {
    void *q = realloc(p, n ? n : 1);
    if (!q) oom(n);
    return q;
}

char *st_strdup(const char *s) {
    size_t n = strlen(s) + 1;
    char *d = st_malloc(n);
    memcpy(d, s, n);
    return d;
}

void st_free(void *p) { free(p); }

void st_meminfo(size_t *avail, size_t *total) {
    *avail = *total = 0;
    FILE *f = fopen("/proc/meminfo", "r");
    if (!f) return;
    char line[256];
    unsigned long long kb;
    while (fgets(line, sizeof line, f)) {
        if (sscanf(line, "MemAvailable: %llu kB", &kb) == 1) *avail = (size_t)kb << 10;
        else if (sscanf(line, "MemTotal: %llu kB", &kb) == 1) *total = (size_t)kb << 10;
    }
    fclose(f);
}
