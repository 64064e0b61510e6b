/* Logging and the three tiers of errors.
 *
 * 1. Bad input (a file, a request, an argument) is not a bug: the function
 *    that finds it calls st_error_set() with a message naming what is wrong
 *    and returns an error code; the caller reports st_error_get().
 * 2. A broken invariant is a bug: ST_ASSERT aborts with file:line, always on
 *    (release builds too), because a wrong answer is worse than a crash.
 * 3. Device calls are checked at every call site (CUDA_CHECK, backend/cuda).
 */
#ifndef STRATA_CORE_LOG_H
#define STRATA_CORE_LOG_H

#include <stdarg.h>

typedef enum { ST_LOG_DEBUG, ST_LOG_INFO, ST_LOG_WARN, ST_LOG_ERROR } st_log_level;

/* Messages at or above the level go to stderr. Default INFO, or STRATA_LOG=debug|info|warn|error. */
void st_log_set_level(st_log_level level);
void st_log(st_log_level level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

#define ST_DEBUG(...) st_log(ST_LOG_DEBUG, __VA_ARGS__)
#define ST_INFO(...)  st_log(ST_LOG_INFO, __VA_ARGS__)
#define ST_WARN(...)  st_log(ST_LOG_WARN, __VA_ARGS__)

/* Thread-local "last error" message for tier-1 errors. */
void st_error_set(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
const char *st_error_get(void);
void st_error_clear(void);

_Noreturn void st_assert_fail(const char *expr, const char *file, int line);
#define ST_ASSERT(x) ((x) ? (void)0 : st_assert_fail(#x, __FILE__, __LINE__))

#endif
