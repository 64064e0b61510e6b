/* `strata`: the one binary. Dispatches to a subcommand from a table, so every
 * subcommand is listed in `strata --help` and nothing else parses argv[1]. */
#include "cli/cli.h"
#include "core/alloc.h"
#include "engine/split.h"
#include "model/model.h"
#include "server/server.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

typedef struct {
    const char *name;
    int (*fn)(int, char **);
    const char *help;
} command;

static const command COMMANDS[] = {
    {"info", cmd_info, "print a GGUF file's metadata, tensors and bits per weight"},
    {"synth", cmd_synth, "write a GGUF with random valid weights for an architecture preset"},
    {"run", cmd_run, "continue a prompt, streaming the text (default model when -m is not given)"},
    {"chat", cmd_chat, "chat with a model in its chat format"},
    {"perplexity", cmd_perplexity, "perplexity on a text file, comparable with llama.cpp's"},
    {"bench", cmd_bench, "prompt and decode speed, GB/s of weights read"},
    {"profile", cmd_profile, "a MoE model's routing counts on a text, for --expert-profile"},
    {"serve", cmd_serve, "OpenAI- and Anthropic-compatible HTTP server (default model when -m is not given)"},
    {"launch", cmd_launch, "plan device, context, KV and memory from this machine, then serve (--plan: only print)"},
    {"device", cmd_device, "list the GPUs and self-test one (memory plan, bandwidth, every op vs the CPU)"},
    {"tune", cmd_tune, "measure cuBLASLt GEMM algorithms for a model's prompt products on this GPU"},
};
#define N_COMMANDS (sizeof COMMANDS / sizeof COMMANDS[0])

int cli_usage_error(const char *cmd, const char *usage, const char *fmt, ...) {
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    fprintf(stderr, "strata %s: %s\nusage: %s\n", cmd, msg, usage);
    return 2;
}

char *cli_read_file(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    if (n < 0) {
        fclose(f);
        return NULL;
    }
    char *buf = st_malloc((size_t)n + 1);
    size_t got = fread(buf, 1, (size_t)n, f);
    fclose(f);
    buf[got] = 0;
    *len = got;
    return buf;
}

/* The subcommands that step the engine through its sequence calls, which
 * carry the split's commands to the other ranks (engine/split.h); the rest
 * (perplexity and profile call the forward pass directly) would leave them
 * waiting. */
static int split_command(const char *name) {
    const char *ok[] = {"run", "chat", "bench", "serve", "engine"};
    for (size_t i = 0; i < sizeof ok / sizeof ok[0]; i++)
        if (!strcmp(name, ok[i])) return 1;
    return 0;
}

static void usage(FILE *out) {
    fprintf(out, "usage: strata COMMAND [ARGS]  (strata COMMAND --help for each)\n"
                 "       strata --families  (the model architectures this binary runs)\n\ncommands:\n");
    for (size_t i = 0; i < N_COMMANDS; i++) fprintf(out, "  %-12s %s\n", COMMANDS[i].name, COMMANDS[i].help);
}

int main(int argc, char **argv) {
    /* under mpirun: join the job (a layer split across ranks, engine/split.h); else nothing. `serve`
     * on rank 0 stays out of it: the HTTP front end is no rank, the engine process it spawns (and
     * supervises) joins as rank 0 in its place, so that it has a rank 0 to restart against */
    if (argc < 2 || strcmp(argv[1], "serve") || split_launched_rank() > 0) split_start(&argc, &argv);
    if (split_size() > 1 && argc >= 2 && !split_command(argv[1])) {
        fprintf(stderr,
                "strata %s: does not run under mpirun; a layer split across ranks runs run, chat, bench and "
                "serve (docs/multi.md)\n",
                argv[1]);
        return 2;
    }
    if (argc < 2) {
        usage(stderr);
        return 2;
    }
    if (!strcmp(argv[1], "--families")) {
        for (int a = 0; a < ARCH_COUNT; a++) printf("%s\n", model_arch_name((model_arch)a));
        return 0;
    }
    if (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h") || !strcmp(argv[1], "help")) {
        usage(stdout);
        return 0;
    }
    /* hidden: the engine process `strata serve` spawns for itself (docs/server.md) */
    if (!strcmp(argv[1], "engine")) return server_engine_main(argc - 1, argv + 1);
    for (size_t i = 0; i < N_COMMANDS; i++)
        if (!strcmp(argv[1], COMMANDS[i].name)) return COMMANDS[i].fn(argc - 1, argv + 1);
    fprintf(stderr, "strata: unknown command '%s'\n", argv[1]);
    usage(stderr);
    return 2;
}
