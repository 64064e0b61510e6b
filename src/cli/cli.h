/* Subcommands of the `strata` binary. Each takes argc/argv after the
 * subcommand name, answers --help, and returns the process exit code
 * (0 ok, 1 runtime error, 2 usage error). */
#ifndef STRATA_CLI_CLI_H
#define STRATA_CLI_CLI_H

#include <stddef.h>

int cmd_info(int argc, char **argv);
int cmd_synth(int argc, char **argv);
int cmd_run(int argc, char **argv);
int cmd_chat(int argc, char **argv);
int cmd_perplexity(int argc, char **argv);
int cmd_bench(int argc, char **argv);
int cmd_profile(int argc, char **argv);
int cmd_serve(int argc, char **argv);
int cmd_device(int argc, char **argv);
int cmd_launch(int argc, char **argv);
int cmd_tune(int argc, char **argv);

/* Print "strata CMD: MSG" and the usage line; returns 2. */
int cli_usage_error(const char *cmd, const char *usage, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

/* A whole file, NUL-terminated (st_free it); NULL when it cannot be read. */
char *cli_read_file(const char *path, size_t *len);

#endif
