/* Argument helpers (see args.h). Values are parsed strictly: "12x", "" and
 * out-of-range numbers are usage errors, never silently truncated. */
#include "cli/args.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"

int args_is_help(const args_t *a) {
    const char *s = a->argv[a->i];
    return !strcmp(s, "--help") || !strcmp(s, "-h");
}

int args_value(args_t *a, const char *name, const char **val) {
    const char *s = a->argv[a->i];
    size_t n = strlen(name);
    if (strncmp(s, name, n) != 0) return 0;
    if (s[n] == '=' && name[1] == '-') { /* --opt=VALUE; not for short options like -o */
        *val = s + n + 1;
        a->i++;
        return 1;
    }
    if (s[n] != 0) return 0;
    if (a->i + 1 >= a->argc) {
        a->err = cli_usage_error(a->cmd, a->usage, "missing value for '%s'", name);
        return -1;
    }
    *val = a->argv[a->i + 1];
    a->i += 2;
    return 1;
}

int args_int(args_t *a, const char *opt, const char *s, long long lo, long long hi, long long *out) {
    char *end;
    errno = 0;
    long long v = strtoll(s, &end, 10);
    if (*s == 0 || *end != 0 || errno || v < lo || v > hi) {
        a->err = cli_usage_error(a->cmd, a->usage, "invalid value '%s' for %s (an integer from %lld to %lld)", s, opt,
                                 lo, hi);
        return -1;
    }
    *out = v;
    return 0;
}

int args_double(args_t *a, const char *opt, const char *s, double *out) {
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (*s == 0 || *end != 0 || errno || !isfinite(v)) {
        a->err = cli_usage_error(a->cmd, a->usage, "invalid value '%s' for %s (a number)", s, opt);
        return -1;
    }
    *out = v;
    return 0;
}

int args_unknown(args_t *a) {
    const char *s = a->argv[a->i];
    a->err = s[0] == '-' ? cli_usage_error(a->cmd, a->usage, "unknown option '%s'", s)
                         : cli_usage_error(a->cmd, a->usage, "unexpected argument '%s'", s);
    return a->err;
}
