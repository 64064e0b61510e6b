/* Checked, aligned allocation. Sizes that come from files or requests must be
 * validated by the caller before they reach here: running out of memory on a
 * size we chose is a bug, so these abort with a message instead of returning NULL. */
#ifndef STRATA_CORE_ALLOC_H
#define STRATA_CORE_ALLOC_H

#include <stddef.h>

void *st_malloc(size_t n);                  /* 64-byte aligned, aborts on failure */
void *st_calloc(size_t count, size_t size); /* zeroed, 64-byte aligned, overflow-checked */
void *st_malloc_pages(size_t n);            /* whole pages of its own (page-locking it locks nothing else) */
void *st_realloc(void *p, size_t n);        /* plain realloc (not aligned), aborts on failure */
char *st_strdup(const char *s);
void st_free(void *p);

/* MemAvailable and MemTotal from /proc/meminfo, bytes; 0 when unreadable. */
void st_meminfo(size_t *avail, size_t *total);

/* x rounded up to a multiple of a (a > 0) */
static inline size_t st_round_up(size_t x, size_t a) { return (x + a - 1) / a * a; }

#endif
