/* The switch table and its precedence (see switches.h).
 *
 * Environment switches are read from the environment at every call, as the
 * call sites did before the table existed, so behaviour is unchanged for a
 * user who only sets variables. Flags keep their values here: one slot per
 * source, so a config value can sit under a flag value without being lost,
 * and the start log can say which one won. */
#include "core/switches.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/log.h"

/* The environment variable that records who set an exported switch. */
#define SOURCES_VAR "STRATA_SWITCH_SOURCES"

static const st_switch_def TABLE[] = {
    /* environment switches */
    {"STRATA_LOG", ST_SW_KIND_ENV, NULL, NULL, 0, 0, "info", "info", "log level on stderr: debug | info | warn | error",
     0},
    {"STRATA_ISA", ST_SW_KIND_ENV, NULL, NULL, 0, 0, NULL,
     "auto: x86-64 the best of amx | avx512 | avx2 | scalar the CPU (and OS) run; other CPUs scalar",
     "caps the CPU kernels' instruction set (scalar | avx2 | avx512 | amx: AVX-512 plus the int8 tiles in prompt "
     "products); never raises it above the CPU's",
     0},
    {"STRATA_IQ_GRID", ST_SW_KIND_ENV, NULL, NULL, 0, 0, "auto", "auto",
     "AVX-512 i-quant dots on Intel with VBMI: auto (per format, what measured fastest), gather (grid rows "
     "gathered from memory), regs (the grid held in registers wherever a format has that kernel)",
     0},
    {"STRATA_PRECISE", ST_SW_KIND_ENV, NULL, NULL, 0, 0, "0", "0",
     "1: CPU matrix products take f32 activations instead of 8-bit (slower, closer to the reference)", 0},
    {"STRATA_CPU_EXPERT_TASKS", ST_SW_KIND_ENV, NULL, NULL, 0, 0, "auto", "auto",
     "a one-token MoE step on the CPU: 1 computes each routed expert whole in one pool task, 0 splits every "
     "expert's rows across the threads; auto: experts as tasks when there are at least two per thread",
     0},
    {"STRATA_CPU_PREFETCH", ST_SW_KIND_ENV, NULL, NULL, 0, 0, "auto", "auto",
     "bytes a CPU matrix-vector product prefetches ahead of its rows (0: none, the hardware's streams alone); auto: "
     "4096, or 0 on AMD CPUs (where the software prefetch measured slower)",
     0},
    {"STRATA_YARN_TRUNCATE", ST_SW_KIND_ENV, NULL, NULL, 0, 0, "0", "0",
     "1: YaRN's correction range rounded outwards to whole rotary pairs, as llama.cpp b11434 does (gpt-oss, "
     "transformers and OpenAI's reference do not round)",
     0},
    {"STRATA_PROFILE", ST_SW_KIND_ENV, NULL, NULL, 0, 0, "0", "0",
     "1: time every backend op (each waited for) and log the table when the engine closes", 0},
    {"STRATA_POPULATE", ST_SW_KIND_ENV, NULL, NULL, 0, 0, "1", "1",
     "0: the CPU computes from the model file's mapping as pages fault in, instead of mapping them all at start "
     "(when the pages still to read fit in the RAM available)",
     0},
    {"STRATA_SSD_IO", ST_SW_KIND_ENV, NULL, NULL, 0, 0, "auto", "auto",
     "how the SSD tier reads (--ram-budget): auto (io_uring and O_DIRECT where the system allows them), or the "
     "fallbacks forced: pread (no io_uring), buffered (no O_DIRECT), pread-buffered (neither)",
     0},
    {"STRATA_LANE_WORKER", ST_SW_KIND_ENV, NULL, NULL, 0, 0, "1", "1",
     "0: the expert lanes' CPU products start after the GPU's part of the layer is queued, on the calling thread, "
     "instead of at once on a worker thread (the CPU lane's pool then has one thread less)",
     0},
    {"STRATA_LANE_TUNE", ST_SW_KIND_ENV, NULL, NULL, 0, 0, "1", "1",
     "0: the expert lanes split a layer's uncached experts between the CPU and PCIe as the start-up rates model it, "
     "without tuning the split on the measured decode time (without --pcie-frac)",
     0},
    {"STRATA_LANE_GATHER", ST_SW_KIND_ENV, NULL, NULL, 0, 0, "1", "1",
     "0: the expert lanes send a layer's experts over PCIe as one copy each (three an expert) instead of one "
     "gathering launch in which the GPU reads them from the page-locked mapping",
     0},
    {"STRATA_CUDA_GRAPH", ST_SW_KIND_ENV, NULL, NULL, 0, 0, "1", "1",
     "0: GPU decode steps launch each kernel instead of replaying a recorded CUDA graph", 0},
    {"STRATA_CUDA_ACT_REUSE", ST_SW_KIND_ENV, NULL, NULL, 0, 0, "1", "1",
     "0: GPU products quantize their input every time instead of reusing the previous product's", 0},
    {"STRATA_CUDA_ATTN", ST_SW_KIND_ENV, NULL, NULL, 0, 0, "tc", "tc",
     "GPU attention: tc: prompts on tensor cores, decode over long caches with each K/V row read once for all query "
     "heads of its KV head, short ones a block per query head; gqa: the shared-K/V kernel for everything; head: a "
     "block per query head for everything",
     0},
    {"STRATA_CUDA_PDL", ST_SW_KIND_ENV, NULL, NULL, 0, 0, "0", "0",
     "1: on sm_90+ GPUs decode kernels launch while the previous one finishes (programmatic dependent launch; measured "
     "no faster on an H200, so off)",
     0},
    {"STRATA_CUDA_MOE_FUSED", ST_SW_KIND_ENV, NULL, NULL, 0, 0, "1", "1",
     "0: GPU decode MoE runs gate, up, act_mul, down and the weighted sum as five kernels instead of two fused ones",
     0},
    {"STRATA_CUDA_FUSE", ST_SW_KIND_ENV, NULL, NULL, 0, 0, "7", "7",
     "GPU fused ops, a sum of bits: 1 matmul_multi (products of one input: q/k/v, gate/up) in one launch per weight "
     "type or type pair (Q4_K/Q5_K with Q6_K), 2 routing inside the MoE kernel, 4 matmul_res_norm for one token (the o "
     "or down product adds into the residual as it writes it, and a float router after the norm normalises it itself); "
     "a bit off runs that op as its composition of plain ops",
     0},
    {"STRATA_CUDA_SAMPLING", ST_SW_KIND_ENV, NULL, NULL, 0, 0, "1", "1",
     "0: GPU decode copies every logit to the host and samples there, instead of taking the greedy or top-k candidates "
     "or a temperature-only draw from the GPU",
     0},
    {"STRATA_MPIRUN", ST_SW_KIND_ENV, NULL, NULL, 0, 0, "mpirun", "mpirun",
     "serve --ranks N: the launcher of the engine job and its options (e.g. mpirun --oversubscribe -H a,b), "
     "given -n N and the engine's command line",
     0},
    {"STRATA_API_KEY", ST_SW_KIND_ENV, NULL, NULL, 0, 0, NULL, "none",
     "serve: require this key (Bearer or x-api-key); same as --api-key", 1},
    /* engine and server flags (strata serve / strata launch) */
    {"--model", ST_SW_KIND_FLAG, "-m", NULL, 0, 0, NULL, "models/SmolLM2-135M-Instruct.Q4_1.gguf",
     "the GGUF model file", 0},
    {"--ctx", ST_SW_KIND_FLAG, "-c", NULL, 1, 1 << 24, NULL,
     "serve: min(the model's trained context, 4096); launch: the largest of min(trained, 8192) that fits",
     "context length of each slot, in tokens", 0},
    {"--kv", ST_SW_KIND_FLAG, NULL, NULL, 0, 0, NULL, "f16 (launch: int8 when f16 does not fit)",
     "KV cache element type: f16 | int8", 0},
    {"--threads", ST_SW_KIND_FLAG, "-t", NULL, 1, 1024, NULL, "all cores", "CPU threads of each engine", 0},
    {"--prefill", ST_SW_KIND_FLAG, NULL, NULL, 1, 65536, NULL,
     "auto: 512; up to 4096 when experts are streamed to a GPU", "prompt chunk size in tokens, or auto", 0},
    {"--gpu", ST_SW_KIND_FLAG, NULL, NULL, 0, 255, NULL, "CPU (launch: GPU 0 when a GPU build finds one)",
     "run every op on this GPU (CUDA/HIP builds)", 0},
    {"--vram-budget", ST_SW_KIND_FLAG, NULL, NULL, 0, 0, NULL, "the GPU's free memory less --vram-reserve",
     "GiB the engine may allocate on the GPU (a smaller card emulated); a MoE model's experts beyond it stay in host "
     "RAM",
     0},
    {"--vram-reserve", ST_SW_KIND_FLAG, NULL, NULL, 0, 1 << 20, "512", "512",
     "MiB of the GPU's free memory left unused when --vram-budget is not given", 0},
    {"--expert-cache", ST_SW_KIND_FLAG, NULL, NULL, 0, 0, "auto", "auto",
     "MoE experts kept on the GPU: a slot count, or auto (as many as the budget holds)", 0},
    {"--expert-profile", ST_SW_KIND_FLAG, NULL, NULL, 0, 0, NULL, "none",
     "routing counts (strata profile) that choose which experts the GPU caches", 0},
    {"--pcie-frac", ST_SW_KIND_FLAG, NULL, NULL, 0, 0, NULL, "the cost model",
     "share (0..1) of uncached experts sent over PCIe; the rest run on the CPU expert lane", 0},
    {"--adapt-every", ST_SW_KIND_FLAG, NULL, NULL, 0, 1 << 20, "1", "1 (0: the cache stays as planned)",
     "every N steps each layer's hottest uncached expert takes its coldest cached one's slot, when hotter", 0},
    {"--draft", ST_SW_KIND_FLAG, NULL, NULL, 0, 0, NULL, "none",
     "speculative decoding: ngram drafts tokens by prompt lookup, verified in one batched pass (docs/speculative.md)",
     0},
    {"--draft-n", ST_SW_KIND_FLAG, NULL, NULL, 1, 64, NULL, "8 with --draft ngram",
     "tokens drafted per step (implies --draft ngram)", 0},
    {"--ranks", ST_SW_KIND_FLAG, NULL, NULL, 1, 1024, "1", "1",
     "serve: the engine as an MPI job of N ranks, layers split across them, launched by the server with "
     "STRATA_MPIRUN and restarted whole when a rank dies (docs/multi.md)",
     0},
    {"--devices", ST_SW_KIND_FLAG, NULL, NULL, 0, 0, NULL, "none (one device)",
     "a layer split in this process: one rank per entry, cpu or a GPU index, e.g. cpu,cpu (docs/multi.md)", 0},
    {"--layer-split", ST_SW_KIND_FLAG, NULL, NULL, 0, 0, NULL, "even by bytes of weights",
     "under --devices or mpirun: layers per rank, N,M,... summing to the layer count (docs/multi.md)", 0},
    {"--pipeline-windows", ST_SW_KIND_FLAG, NULL, NULL, 1, 64, NULL, "1",
     "under a layer split: each prompt chunk read as N windows, so the ranks work at once (docs/multi.md)", 0},
    {"--pin-experts", ST_SW_KIND_FLAG, NULL, NULL, 0, 1, "1", "1",
     "0: do not page-lock the host's experts (PCIe copies then go through the driver's staging); run, chat, bench "
     "and serve also take it as --mmap-experts (no value)",
     0},
    {"--ram-budget", ST_SW_KIND_FLAG, NULL, NULL, 0, 0, NULL, "no limit",
     "GiB of host RAM for the experts the GPU does not cache; beyond it a RAM tier (the hottest) and an SSD tier read "
     "from the file with io_uring O_DIRECT",
     0},
    {"--host", ST_SW_KIND_FLAG, NULL, NULL, 0, 0, "127.0.0.1", "127.0.0.1", "address the server binds", 0},
    {"--port", ST_SW_KIND_FLAG, NULL, NULL, 0, 65535, "8080", "8080", "TCP port (0: any free port)", 0},
    {"--slots", ST_SW_KIND_FLAG, "-np", NULL, 1, 256, "1", "1", "worker slots (engines) serving at once", 0},
    {"--queue", ST_SW_KIND_FLAG, NULL, NULL, 1, 1 << 20, "64", "64", "requests that may wait for a slot", 0},
    {"--max-body", ST_SW_KIND_FLAG, NULL, NULL, 1, 1024, "8", "8", "largest request body, MB", 0},
    {"--api-key", ST_SW_KIND_FLAG, NULL, "STRATA_API_KEY", 0, 0, NULL, "none",
     "require this key on every path but /health and the web page", 1},
    {"--read-timeout", ST_SW_KIND_FLAG, NULL, NULL, 0, 86400, "30", "30",
     "seconds a request may take to arrive whole (0: no limit); then 408 and the connection closed", 0},
    {"--max-inflight", ST_SW_KIND_FLAG, NULL, NULL, 1, 1 << 20, "64", "64",
     "MB of request bodies held at once; past it new requests get 503", 0},
    {"--allowed-hosts", ST_SW_KIND_FLAG, NULL, NULL, 0, 0, NULL, "localhost and the loopback addresses (on loopback)",
     "Host header values the server answers (comma list; '*': any)", 0},
    {"--cors-origin", ST_SW_KIND_FLAG, NULL, NULL, 0, 0, NULL, "none",
     "browser origins allowed besides the server's own (comma list; '*': any)", 0},
    {"--shutdown-timeout", ST_SW_KIND_FLAG, NULL, NULL, 0, 86400, "10", "10",
     "seconds SIGTERM lets requests in flight finish before ending them", 0},
    {"--engine-timeout", ST_SW_KIND_FLAG, NULL, NULL, 0, 86400, "10", "10",
     "seconds of silence after which the engine process is killed and restarted (0: never)", 0},
    {"--reasoning-format", ST_SW_KIND_FLAG, NULL, NULL, 0, 0, "auto", "auto",
     "a thinking model's reasoning apart from its answer (auto, deepseek: the same) or in it (none)", 0},
    {"--reasoning-budget", ST_SW_KIND_FLAG, NULL, NULL, -1, 2147483647, "-1", "-1",
     "tokens a reasoning block may spend before the engine ends it, unless a request says (-1: no limit)", 0},
    {"--reasoning-budget-message", ST_SW_KIND_FLAG, NULL, NULL, 0, 0, NULL, "none",
     "text the engine writes before a reasoning block's end when the budget ends it, unless a request says", 0},
};
#define N_TABLE ((int)(sizeof TABLE / sizeof TABLE[0]))

/* Flag values by source (index st_switch_src); env switches live in the environment. */
static const char *g_flag_val[N_TABLE][4];

const st_switch_def *st_switch_table(int *n) {
    *n = N_TABLE;
    return TABLE;
}

static int find_index(const char *name) {
    if (!name) return -1;
    for (int i = 0; i < N_TABLE; i++) {
        const st_switch_def *d = &TABLE[i];
        if (!strcmp(name, d->name) || (d->short_name && !strcmp(name, d->short_name))) return i;
        if (d->kind == ST_SW_KIND_FLAG && !strcmp(name, d->name + 2)) return i; /* "ctx" for "--ctx" */
    }
    return -1;
}

const st_switch_def *st_switch_find(const char *name) {
    int i = find_index(name);
    return i < 0 ? NULL : &TABLE[i];
}

/* The source recorded for name in STRATA_SWITCH_SOURCES, or DEFAULT when none is. */
static st_switch_src recorded_source(const char *name) {
    const char *s = getenv(SOURCES_VAR);
    size_t n = strlen(name);
    while (s && *s) {
        const char *end = strchr(s, ';');
        size_t len = end ? (size_t)(end - s) : strlen(s);
        if (len > n + 1 && !strncmp(s, name, n) && s[n] == '=') {
            const char *v = s + n + 1;
            size_t vl = len - n - 1;
            if (vl == 6 && !strncmp(v, "config", 6)) return ST_SW_CONFIG;
            if (vl == 4 && !strncmp(v, "flag", 4)) return ST_SW_FLAG;
        }
        s = end ? end + 1 : NULL;
    }
    return ST_SW_DEFAULT;
}

/* Rewrite STRATA_SWITCH_SOURCES with name's entry replaced by src (removed for ENV/DEFAULT). */
static void record_source(const char *name, st_switch_src src) {
    const char *old = getenv(SOURCES_VAR);
    size_t n = strlen(name), cap = (old ? strlen(old) : 0) + n + 16;
    char *buf = malloc(cap);
    ST_ASSERT(buf);
    buf[0] = 0;
    size_t len = 0;
    for (const char *s = old; s && *s;) {
        const char *end = strchr(s, ';');
        size_t l = end ? (size_t)(end - s) : strlen(s);
        if (!(l > n && !strncmp(s, name, n) && s[n] == '=') && l > 0) {
            memcpy(buf + len, s, l);
            len += l;
            buf[len++] = ';';
            buf[len] = 0;
        }
        s = end ? end + 1 : NULL;
    }
    if (src == ST_SW_CONFIG || src == ST_SW_FLAG)
        len += (size_t)snprintf(buf + len, cap - len, "%s=%s;", name, st_switch_src_name(src));
    setenv(SOURCES_VAR, buf, 1);
    free(buf);
}

const char *st_switch_get(const char *name) {
    int i = find_index(name);
    ST_ASSERT(i >= 0); /* every switch the code reads is in the table */
    const st_switch_def *d = &TABLE[i];
    if (d->kind == ST_SW_KIND_ENV) {
        const char *v = getenv(d->name);
        return v ? v : d->def;
    }
    if (g_flag_val[i][ST_SW_FLAG]) return g_flag_val[i][ST_SW_FLAG];
    if (d->env_alias && getenv(d->env_alias)) return getenv(d->env_alias);
    if (g_flag_val[i][ST_SW_CONFIG]) return g_flag_val[i][ST_SW_CONFIG];
    return d->def;
}

st_switch_src st_switch_source(const char *name) {
    int i = find_index(name);
    ST_ASSERT(i >= 0);
    const st_switch_def *d = &TABLE[i];
    if (d->kind == ST_SW_KIND_ENV) {
        if (!getenv(d->name)) return ST_SW_DEFAULT;
        st_switch_src r = recorded_source(d->name);
        return r == ST_SW_DEFAULT ? ST_SW_ENV : r;
    }
    if (g_flag_val[i][ST_SW_FLAG]) return ST_SW_FLAG;
    if (d->env_alias && getenv(d->env_alias)) {
        st_switch_src r = recorded_source(d->env_alias);
        return r == ST_SW_DEFAULT ? ST_SW_ENV : r;
    }
    if (g_flag_val[i][ST_SW_CONFIG]) return ST_SW_CONFIG;
    return ST_SW_DEFAULT;
}

const char *st_switch_src_name(st_switch_src src) {
    switch (src) {
    case ST_SW_DEFAULT: return "default";
    case ST_SW_CONFIG: return "config";
    case ST_SW_ENV: return "env";
    case ST_SW_FLAG: return "flag";
    }
    return "?";
}

int st_switch_set(const char *name, const char *value, st_switch_src src) {
    ST_ASSERT(src == ST_SW_CONFIG || src == ST_SW_FLAG);
    int i = find_index(name);
    if (i < 0) {
        st_error_set("'%s' is not a switch (strata launch --help lists them)", name);
        return -1;
    }
    const st_switch_def *d = &TABLE[i];
    if (d->kind == ST_SW_KIND_FLAG) {
        g_flag_val[i][src] = value;
        return st_switch_source(d->name) == src;
    }
    /* an environment switch: the environment is its store */
    st_switch_src cur = st_switch_source(d->name);
    if (cur > src) return 0; /* the user's value stays */
    if (!value) {
        if (cur == src) {
            unsetenv(d->name);
            record_source(d->name, ST_SW_DEFAULT);
        }
        return 1;
    }
    setenv(d->name, value, 1);
    record_source(d->name, src);
    return 1;
}

static int differs(const char *v, const char *def) {
    if (!v) return 0;
    return !def || strcmp(v, def) != 0;
}

int st_switch_describe(char *buf, unsigned long cap) {
    int n = 0;
    size_t len = 0;
    if (cap) buf[0] = 0;
    for (int i = 0; i < N_TABLE; i++) {
        const st_switch_def *d = &TABLE[i];
        const char *v = st_switch_get(d->name);
        st_switch_src src = st_switch_source(d->name);
        if (src == ST_SW_DEFAULT || !differs(v, d->def)) continue;
        n++;
        if (len < cap)
            len += (size_t)snprintf(buf + len, cap - len, "%s=%s (set by %s)\n", d->name, d->secret ? "***" : v,
                                    st_switch_src_name(src));
    }
    return n;
}

void st_switch_log_start(const char *who) {
    char buf[4096];
    int n = st_switch_describe(buf, sizeof buf);
    if (!n) {
        ST_INFO("%s: every switch at its default", who);
        return;
    }
    for (char *line = buf, *nl; *line; line = nl + 1) {
        nl = strchr(line, '\n');
        if (!nl) break;
        *nl = 0;
        ST_INFO("%s: switch %s", who, line);
    }
}
