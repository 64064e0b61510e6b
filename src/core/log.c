/* Logging to stderr and the thread-local error message (see log.h). */
#include "core/log.h"
#include "core/switches.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static st_log_level g_level = ST_LOG_INFO;
static int g_level_from_env = 0;
static _Thread_local char g_error[1024];

static void level_from_env(void) {
    if (g_level_from_env) return;
    g_level_from_env = 1;
    const char *s = st_switch_get("STRATA_LOG");
    if (!s) return;
    if (!strcmp(s, "debug")) g_level = ST_LOG_DEBUG;
    else if (!strcmp(s, "info")) g_level = ST_LOG_INFO;
    else if (!strcmp(s, "warn")) g_level = ST_LOG_WARN;
    else if (!strcmp(s, "error")) g_level = ST_LOG_ERROR;
}

void st_log_set_level(st_log_level level) {
    g_level_from_env = 1; /* an explicit call wins over the environment */
    g_level = level;
}

void st_log(st_log_level level, const char *fmt, ...) {
    level_from_env();
    if (level < g_level) return;
    static const char *tag[] = {"debug", "info", "warn", "error"};
    char buf[2048];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    /* one fprintf per line so that lines from threads do not interleave */
    fprintf(stderr, "strata %s: %s\n", tag[level], buf);
}

void st_error_set(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(g_error, sizeof g_error, fmt, ap);
    va_end(ap);
}

const char *st_error_get(void) { return g_error[0] ? g_error : "unknown error"; }

void st_error_clear(void) { g_error[0] = 0; }

void st_assert_fail(const char *expr, const char *file, int line) {
    fprintf(stderr, "strata: assertion failed: %s (%s:%d)\n", expr, file, line);
    fflush(stderr);
    abort();
}
