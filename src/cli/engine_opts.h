/* Options shared by the subcommands that run a model (run, chat, perplexity,
 * bench): one parser, so every one spells and checks them the same way. */
#ifndef STRATA_CLI_ENGINE_OPTS_H
#define STRATA_CLI_ENGINE_OPTS_H

#include "cli/args.h"
#include "engine/engine.h"

/* The model `run` and `chat` use when -m is not given (fetched by setup.sh). */
#define STRATA_DEFAULT_MODEL "models/SmolLM2-135M-Instruct.Q4_1.gguf"

#define ENGINE_OPTS_USAGE                                                                                              \
    "[-m FILE] [-c|--ctx N] [--kv f16|int8] [-t|--threads N] [--prefill N] [--gpu N] [--vram-budget GiB] "             \
    "[--vram-reserve MiB] [--expert-cache N|auto] [--expert-profile FILE] [--pcie-frac F] [--pin-experts 0|1] "        \
    "[--mmap-experts] "                                                                                                \
    "[--ram-budget GiB] [--adapt-every N] "                                                                            \
    "[--draft ngram|mtp|none] [--draft-n N] [--devices cpu,cpu,...] [--layer-split N,M,...] [--pipeline-windows N]"

/* tokens drafted per step by --draft ngram or mtp unless --draft-n says (docs/speculative.md) */
#define ENGINE_DRAFT_N_DEFAULT 8

/* If argv[a->i] is one of the engine options, consume it into p and return 1;
 * a bad value prints the usage error and returns -1; otherwise 0. */
int engine_opts_parse(args_t *a, engine_params *p);

#endif
