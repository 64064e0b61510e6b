/* Small argument helpers shared by the subcommands, so that every one of them
 * answers a bad argument the same way: "strata CMD: MESSAGE" and the usage
 * line on stderr, exit code 2 (cli_usage_error in main.c). */
#ifndef STRATA_CLI_ARGS_H
#define STRATA_CLI_ARGS_H

typedef struct {
    const char *cmd;   /* subcommand name, for messages */
    const char *usage; /* its usage line */
    int argc;
    char **argv;
    int i;   /* index of the argument being looked at */
    int err; /* set to 2 once a usage error has been printed */
} args_t;

/* Whether argv[i] is --help or -h. */
int args_is_help(const args_t *a);
/* If argv[i] is `name` (then the value is the next argument) or `name=VALUE`,
 * point *val at the value, advance i past it and return 1. A missing value
 * prints a usage error, sets err and returns -1. Otherwise 0. */
int args_value(args_t *a, const char *name, const char **val);
/* Parse a whole decimal integer in [lo, hi] / a finite number; on failure
 * print "invalid value 'S' for OPT" as a usage error, set err, return -1. */
int args_int(args_t *a, const char *opt, const char *s, long long lo, long long hi, long long *out);
int args_double(args_t *a, const char *opt, const char *s, double *out);
/* The usage error for an argument nobody recognised; returns 2. */
int args_unknown(args_t *a);

#endif
