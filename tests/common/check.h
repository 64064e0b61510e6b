/* The C tests' one check macro. CHECK(cond, fmt, ...) counts a check and,
 * when cond is false, a failure, printing "FAIL file:line: cond: message".
 * A test ends with `return check_report("name");`, which prints how many
 * checks passed and gives the exit status. Header-only: each test is one
 * executable. */
#ifndef STRATA_TESTS_COMMON_CHECK_H
#define STRATA_TESTS_COMMON_CHECK_H

#include <stdio.h>

static int check_count, check_fails;

#define CHECK(cond, ...)                                                                                               \
    do {                                                                                                               \
        check_count++;                                                                                                 \
        if (!(cond)) {                                                                                                 \
            check_fails++;                                                                                             \
            printf("FAIL %s:%d: %s: ", __FILE__, __LINE__, #cond);                                                     \
            printf(__VA_ARGS__);                                                                                       \
            printf("\n");                                                                                              \
        }                                                                                                              \
    } while (0)

/* A failure found outside CHECK (e.g. a loop that prints its own detail). */
static inline void check_fail(void) {
    check_count++;
    check_fails++;
}

static inline int check_report(const char *name) {
    printf("%s: %d of %d checks passed%s\n", name, check_count - check_fails, check_count,
           check_fails ? ", FAILED" : "");
    return check_fails ? 1 : 0;
}

#endif
