/* `strata run` (continue a prompt, streaming to stdout) and `strata chat`
 * (an interactive chat in the model's chat format). Both print the speed line
 * on stderr after each answer. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"
#include "cli/engine_opts.h"
#include "core/alloc.h"
#include "core/log.h"
#include "tokenizer/chat.h"

#define RUN_USAGE                                                                                                      \
    "strata run " ENGINE_OPTS_USAGE                                                                                    \
    " -p TEXT [-n N] [--temp T] [--top-k K] [--top-p P] [--min-p P] [--seed S] [--stop TEXT]..."
#define CHAT_USAGE "strata chat " ENGINE_OPTS_USAGE " [-n N] [--temp T] [--seed S] [--system TEXT]"

typedef struct {
    engine_params ep;
    sampler_params sp;
    gen_params gp;
    const char *prompt, *system;
    const char *stops[16];
} run_opts;

/* Sampling and generation options shared by run and chat; 1 consumed, -1 error, 0 not ours. */
static int parse_gen_opt(args_t *a, run_opts *o) {
    const char *v;
    double d;
    long long n;
    int r;
    if ((r = args_value(a, "-n", &v)) || (r = args_value(a, "--max-tokens", &v))) {
        if (r < 0 || args_int(a, "-n", v, 1, 1 << 24, &n)) return -1;
        o->gp.max_tokens = (int)n;
        return 1;
    }
    if ((r = args_value(a, "--temp", &v))) {
        if (r < 0 || args_double(a, "--temp", v, &d)) return -1;
        o->sp.temp = (float)d;
        return 1;
    }
    if ((r = args_value(a, "--top-k", &v))) {
        if (r < 0 || args_int(a, "--top-k", v, 0, 1 << 24, &n)) return -1;
        o->sp.top_k = (int)n;
        return 1;
    }
    if ((r = args_value(a, "--top-p", &v))) {
        if (r < 0 || args_double(a, "--top-p", v, &d)) return -1;
        o->sp.top_p = (float)d;
        return 1;
    }
    if ((r = args_value(a, "--min-p", &v))) {
        if (r < 0 || args_double(a, "--min-p", v, &d)) return -1;
        o->sp.min_p = (float)d;
        return 1;
    }
    if ((r = args_value(a, "--repeat-penalty", &v))) {
        if (r < 0 || args_double(a, "--repeat-penalty", v, &d)) return -1;
        o->sp.repeat_penalty = (float)d;
        return 1;
    }
    if ((r = args_value(a, "--seed", &v))) {
        if (r < 0 || args_int(a, "--seed", v, 0, (1ll << 62), &n)) return -1;
        o->sp.seed = (uint64_t)n;
        return 1;
    }
    if ((r = args_value(a, "--stop", &v))) {
        if (r < 0) return -1;
        if (o->gp.n_stop == 16) {
            a->err = cli_usage_error(a->cmd, a->usage, "at most 16 --stop strings");
            return -1;
        }
        o->stops[o->gp.n_stop++] = v;
        o->gp.stop = o->stops;
        return 1;
    }
    return (r = engine_opts_parse(a, &o->ep)) != 0 ? r : 0;
}

/* Parse argv; returns -1 to go on, else the exit code (help or usage error). */
static int parse(args_t *a, run_opts *o, int chat) {
    o->ep = engine_defaults();
    o->ep.model_path = STRATA_DEFAULT_MODEL;
    o->sp = sampler_defaults();
    while (a->i < a->argc) {
        if (args_is_help(a)) {
            printf("usage: %s\n", a->usage);
            printf(chat ? "\nAn interactive chat in the model's chat format; an empty line or EOF ends it.\n"
                        : "\nStreams the continuation of TEXT to stdout; the speed line goes to stderr.\n");
            printf("Default model: %s. --temp 0 is greedy.\n", STRATA_DEFAULT_MODEL);
            return 0;
        }
        int r = parse_gen_opt(a, o);
        if (r > 0) continue;
        if (r < 0) return a->err;
        const char *v;
        if (!chat && (r = args_value(a, "-p", &v))) {
            if (r < 0) return a->err;
            o->prompt = v;
        } else if (chat && (r = args_value(a, "--system", &v))) {
            if (r < 0) return a->err;
            o->system = v;
        } else return args_unknown(a);
    }
    if (!chat && !o->prompt) return cli_usage_error(a->cmd, a->usage, "missing -p TEXT");
    /* refused here, not by the engine: a model that adds BOS would otherwise
     * accept "" (one token) and run while others refuse it */
    if (!chat && !o->prompt[0]) return cli_usage_error(a->cmd, a->usage, "the prompt is empty (-p \"\")");
    return -1;
}

static int write_out(void *ctx, const char *text, size_t len) {
    (void)ctx;
    fwrite(text, 1, len, stdout);
    fflush(stdout);
    return 0;
}

/* The assistant's answer, streamed to stdout and kept for the next turn's history. */
typedef struct {
    char *buf;
    size_t len, cap;
} answer;

static int collect(void *ctx, const char *t, size_t len) {
    answer *a = ctx;
    if (a->len + len + 1 > a->cap) {
        a->cap = (a->len + len + 1) * 2;
        a->buf = st_realloc(a->buf, a->cap);
    }
    memcpy(a->buf + a->len, t, len);
    a->len += len;
    a->buf[a->len] = 0;
    return write_out(NULL, t, len);
}

static int32_t *tokenize(engine *e, const char *text, int add_special, int parse_special, int *n) {
    size_t len = strlen(text);
    int64_t need = tokenizer_encode(e->tok, text, len, add_special, parse_special, NULL, 0);
    if (need < 0) return NULL;
    int32_t *ids = st_malloc((size_t)(need + 1) * sizeof(int32_t));
    tokenizer_encode(e->tok, text, len, add_special, parse_special, ids, need);
    *n = (int)need;
    return ids;
}

static engine *open_engine(const char *cmd, const engine_params *ep) {
    engine *e = engine_open(ep);
    if (!e) fprintf(stderr, "strata %s: %s\n", cmd, st_error_get());
    return e;
}

int cmd_run(int argc, char **argv) {
    args_t a = {.cmd = "run", .usage = RUN_USAGE, .argc = argc, .argv = argv, .i = 1};
    run_opts o = {0};
    int rc = parse(&a, &o, 0);
    if (rc >= 0) return rc;
    engine *e = open_engine("run", &o.ep);
    if (!e) return 1;
    int n;
    int32_t *ids = tokenize(e, o.prompt, 1, 0, &n);
    if (!ids) {
        fprintf(stderr, "strata run: %s\n", st_error_get());
        engine_close(e);
        return 1;
    }
    sampler *s = sampler_create(&o.sp, e->m->hp.n_vocab);
    gen_stats st;
    fputs(o.prompt, stdout);
    o.gp.draft_n = o.ep.draft_n;
    o.gp.draft_mtp = o.ep.draft_mtp;
    rc = engine_generate(e, s, ids, n, &o.gp, write_out, NULL, &st);
    printf("\n");
    if (rc != 0) fprintf(stderr, "strata run: %s\n", st_error_get());
    else {
        char line[512];
        gen_stats_format(&st, line, sizeof line);
        fprintf(stderr, "%s\n", line);
    }
    sampler_free(s);
    st_free(ids);
    engine_close(e);
    return rc ? 1 : 0;
}

int cmd_chat(int argc, char **argv) {
    args_t a = {.cmd = "chat", .usage = CHAT_USAGE, .argc = argc, .argv = argv, .i = 1};
    run_opts o = {0};
    int rc = parse(&a, &o, 1);
    if (rc >= 0) return rc;
    engine *e = open_engine("chat", &o.ep);
    if (!e) return 1;
    chat_format fmt = chat_detect(e->m->file);
    const char *eot = chat_end_of_turn(fmt);
    o.stops[o.gp.n_stop++] = eot;
    o.gp.stop = o.stops;
    sampler *s = sampler_create(&o.sp, e->m->hp.n_vocab);
    size_t cap = 16, n_msg = 0;
    chat_msg *msgs = st_malloc(cap * sizeof(chat_msg));
    if (o.system) msgs[n_msg++] = (chat_msg){"system", st_strdup(o.system)};
    fprintf(stderr, "strata chat: %s (%s format); an empty line ends the chat\n", o.ep.model_path,
            chat_format_name(fmt));
    char line[8192];
    rc = 0; /* a turn that fails (e.g. the history outgrows the context) ends the chat with exit 1 */
    for (;;) {
        fprintf(stdout, "> ");
        fflush(stdout);
        if (!fgets(line, sizeof line, stdin)) break;
        line[strcspn(line, "\n")] = 0;
        if (!line[0]) break;
        if (n_msg + 2 > cap) msgs = st_realloc(msgs, (cap *= 2) * sizeof(chat_msg));
        msgs[n_msg++] = (chat_msg){"user", st_strdup(line)};
        char *text = chat_render(fmt, msgs, n_msg, 1);
        int n;
        int32_t *ids = tokenize(e, text, 1, 1, &n);
        st_free(text);
        if (!ids) {
            fprintf(stderr, "strata chat: %s\n", st_error_get());
            rc = -1;
            break;
        }
        answer ans = {st_malloc(1024), 0, 1024};
        ans.buf[0] = 0;
        gen_stats st;
        o.gp.draft_n = o.ep.draft_n;
        o.gp.draft_mtp = o.ep.draft_mtp;
        rc = engine_generate(e, s, ids, n, &o.gp, collect, &ans, &st);
        st_free(ids);
        printf("\n");
        if (rc != 0) {
            fprintf(stderr, "strata chat: %s\n", st_error_get());
            st_free(ans.buf);
            break;
        }
        msgs[n_msg++] = (chat_msg){"assistant", ans.buf};
        char sl[512];
        gen_stats_format(&st, sl, sizeof sl);
        fprintf(stderr, "%s\n", sl);
    }
    for (size_t i = 0; i < n_msg; i++) st_free((void *)msgs[i].content);
    st_free(msgs);
    sampler_free(s);
    engine_close(e);
    return rc ? 1 : 0;
}
