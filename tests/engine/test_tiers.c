/* The host tiers of the experts on the CPU: a RAM tier and an SSD tier
 * read from the file (engine/expert_store.c) give the same logits and
 * tokens as the same placement with every host expert in the mapping.
 *
 * As test_lanes does, the "device" is a second CPU backend behind the lanes'
 * seam. A small qwen3moe synth is written into the build directory (a real
 * file system: tmpfs refuses O_DIRECT), its pages dropped from the page
 * cache, then run with --ram-budget small enough that most experts come
 * from the file. For each placement (CPU lane, PCIe lane, a cache that
 * learns, a profile) the tiered run must equal the run without a budget
 * bit for bit: the same products on the same bytes, only read another way.
 * Then mincore() on a mapping of the file says whether any SSD-tier page
 * came into the page cache (none may: the reads are O_DIRECT and nothing
 * touches the engine's mapping of those experts).
 *
 * Also: the plan's host tiers (RAM + SSD = the host experts, the arena and
 * the SSD tier's staging within the budget, on paper and for each run's
 * file, a budget below the staging refused, the hottest in RAM), the
 * store's reads byte-equal to the file, the SSD bytes in the lane stats
 * and the speed line, and bad --ram-budget values refused by the CLI.
 *
 * usage: test_tiers BUILD_DIR (the model goes there; BUILD_DIR/bin/strata is the CLI)
 */
#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include "core/alloc.h"
#include "core/log.h"
#include "engine/engine.h"
#include "engine/engine_offload.h"
#include "engine/expert_plan.h"
#include "engine/expert_store.h"
#include "engine/moe_lanes.h"
#include "model/synth.h"

#include "../common/check.h"
#include "../common/lanes_run.h"

#define N_PROMPT 12
#define N_GEN    12
#define BOUND    1e-4 /* of the largest |logit|: float summation order only (test_lanes's bound) */

typedef struct {
    long cache;
    double frac;
    int adapt;
    const char *profile;
    double ram_gib; /* 0: no budget */
} config;

static engine_params params(const char *path, const config *c) {
    engine_params p = engine_defaults();
    p.model_path = path;
    p.n_ctx = 64;
    p.n_threads = 2;
    p.expert_cache = c->cache;
    p.pcie_frac = c->frac;
    p.adapt_every = c->adapt;
    p.expert_profile = c->profile;
    p.ram_budget = c->ram_gib;
    return p;
}

static int run(const char *path, const config *c, lanes_run_out *o) {
    engine_params p = params(path, c);
    return lanes_run(&p, N_PROMPT, N_GEN, o);
}

/* Drops the file's pages from the page cache (written, so flushed first). */
static int drop_cache(const char *path) {
    const int fd = open(path, O_RDONLY);
    if (fd < 0) return -1;
    fdatasync(fd);
    const int rc = posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
    close(fd);
    return rc;
}

/* Pages of [off, off + len) of the file in the page cache, counting only
 * the pages wholly inside (a neighbour may share the edge pages). */
static long resident(const unsigned char *vec, uint64_t off, uint64_t len) {
    const uint64_t pg = (uint64_t)sysconf(_SC_PAGESIZE), a = (off + pg - 1) / pg, b = (off + len) / pg;
    long n = 0;
    for (uint64_t i = a; i < b; i++) n += vec[i] & 1;
    return n;
}

/* The file offset of matrix k (gate, up, down) of expert e of layer il. */
static uint64_t mat_off(const model *m, int il, int e, int k, uint64_t *len) {
    static const char *const names[3] = {"ffn_gate_exps", "ffn_up_exps", "ffn_down_exps"};
    char name[64];
    snprintf(name, sizeof name, "blk.%d.%s.weight", il, names[k]);
    const gguf_tensor *t = gguf_find_tensor(m->file, name);
    ST_ASSERT(t);
    *len = t->size / (uint64_t)t->ne[2];
    return gguf_data_offset(m->file) + t->offset + (uint64_t)e * *len;
}

/* The SSD tier's matrices in the file, for a placement: found before the
 * file's pages are dropped (opening the file reads ahead around its header,
 * as far as read_ahead_kb says, which may be all of a small file). */
typedef struct {
    uint64_t off[3 * 256], len[3 * 256];
    int n;
    size_t size;
} ssd_ranges;

static void ssd_ranges_of(const char *path, const config *c, ssd_ranges *r) {
    engine_params p = params(path, c);
    if (p.expert_cache < 0) p.expert_cache = 0; /* the CPU alone: the lanes without a cache (engine_offload) */
    model *m = model_load(path);
    ST_ASSERT(m);
    expert_plan_in in;
    expert_plan plan;
    ST_ASSERT(engine_plan_memory(&p, m, 64, 512, (size_t)1 << 62, &in, &plan) == 0 && plan.in_ram);
    const int X = m->hp.n_expert;
    /* the host RAM the tiers take: the RAM tier's arena and the staging the
     * SSD tier reads into (a slot per expert of a layer, and a spare) */
    const double per = (double)expert_store_expert_bytes(m), host = (double)(plan.ram_experts + X + 1) * per;
    CHECK(host <= c->ram_gib * (double)(1ull << 30),
          "RAM tier %ld + staging %d slots = %.0f bytes, beyond the "
          "budget of %.0f",
          plan.ram_experts, X + 1, host, c->ram_gib * (double)(1ull << 30));
    r->n = 0;
    r->size = gguf_file_size(m->file);
    for (int il = 0; il < m->hp.n_layer; il++)
        for (int e = 0; e < X; e++) {
            if (plan.in_ram[il * X + e] || plan.slot[il * X + e] >= 0) continue; /* RAM tier, device cache */
            for (int k = 0; k < 3; k++, r->n++) {
                ST_ASSERT(r->n < 3 * 256);
                r->off[r->n] = mat_off(m, il, e, k, &r->len[r->n]);
            }
        }
    expert_plan_free(&plan);
    model_free(m);
}

/* SSD-tier pages of the file now in the page cache (-1: mincore failed). */
static long ssd_pages_cached(const char *path, const ssd_ranges *r, long *n_pages) {
    const int fd = open(path, O_RDONLY);
    void *map = mmap(NULL, r->size, PROT_READ, MAP_SHARED, fd, 0); /* never read: mincore only */
    close(fd);
    const size_t pg = (size_t)sysconf(_SC_PAGESIZE);
    unsigned char *vec = st_malloc((size_t)(r->size + pg - 1) / pg);
    long cached = -1;
    *n_pages = 0;
    if (map != MAP_FAILED && mincore(map, r->size, vec) == 0) {
        cached = 0;
        for (int i = 0; i < r->n; i++) {
            cached += resident(vec, r->off[i], r->len[i]);
            *n_pages += (long)(r->len[i] / pg);
        }
    }
    if (map != MAP_FAILED) munmap(map, r->size);
    st_free(vec);
    return cached;
}

typedef struct {
    int n;
    char text[4][512];
} plan_text;

static void collect_line(void *ctx, const char *line) {
    plan_text *t = ctx;
    if (t->n < 4) snprintf(t->text[t->n++], sizeof t->text[0], "%s", line);
}

/* The plan's host tiers: RAM + SSD = the host experts, the arena and the
 * SSD tier's staging within the budget, the profile's hottest in RAM, no
 * tiers when the experts fit, and a budget below the staging refused. */
static void test_plan(void) {
    const size_t G = 1ull << 30, M = 1ull << 20;
    enum { L = 16, X = 32, LX = L * X };
    /* the staging as expert_store_staging_bytes makes it: a slot per expert of a layer and a spare */
    const size_t staging = (X + 1) * 51 * M;
    expert_plan_in in = {.budget = 10 * G,
                         .dense = 2 * G,
                         .kv = G,
                         .scratch = G,
                         .expert = 50 * M,
                         .n_layer = L,
                         .n_expert = X,
                         .cache = -1,
                         .host_expert = 51 * M,
                         .host_staging = staging};
    expert_plan p;
    in.ram_budget = 24 * G; /* 422 host experts x 50 MiB = 20.6 GiB: they fit, nothing changes */
    CHECK(expert_plan_make(&in, NULL, &p) == 0 && p.slots == 90 && !p.in_ram && p.ram_experts == 422 &&
              p.ssd_experts == 0,
          "host experts within the budget: no tiers (slots %ld, ram %ld, ssd %ld)", p.slots, p.ram_experts,
          p.ssd_experts);
    expert_plan_free(&p);
    in.ram_budget = 4 * G; /* (4096 - 1683 MiB of staging) / 51 MiB = 47 in RAM, 375 from the file */
    CHECK(expert_plan_make(&in, NULL, &p) == 0 && p.in_ram, "%s", st_error_get());
    long n_ram = 0, overlap = 0;
    for (int i = 0; i < LX; i++) n_ram += p.in_ram[i], overlap += p.in_ram[i] && p.slot[i] >= 0;
    CHECK(p.ram_experts == 47 && p.ssd_experts == 375 && p.ram_experts + p.ssd_experts == LX - p.slots &&
              n_ram == p.ram_experts && !overlap,
          "tiers: ram %ld (%ld marked, %ld also cached) + ssd %ld of %ld host experts", p.ram_experts, n_ram, overlap,
          p.ssd_experts, LX - p.slots);
    /* the host RAM the tiers take: the arena and the staging the SSD tier reads into */
    CHECK((size_t)p.ram_experts * in.host_expert + staging <= in.ram_budget,
          "arena %zu + staging %zu beyond the budget %zu", (size_t)p.ram_experts * in.host_expert, staging,
          in.ram_budget);
    /* in order without a profile: the uncached experts of the lowest layers first */
    int first_ok = 1;
    for (int i = 0, seen = 0; i < LX; i++)
        if (p.slot[i] < 0) first_ok &= p.in_ram[i] == (seen++ < 47);
    CHECK(first_ok, "without a profile the RAM tier is the first host experts in (layer, expert) order");
    plan_text t = {0};
    expert_plan_describe(&p, &in, collect_line, &t);
    CHECK(t.n == 2 && strstr(t.text[1], "422 host experts (20.61 GiB) beyond --ram-budget 4.00 GiB: RAM tier 47 "
                                        "(2.34 GiB arena) + SSD tier 375 (18.31 GiB read from the file on "
                                        "demand, through a 1.64 GiB staging buffer)"),
          "plan text: %s", t.text[1]);
    expert_plan_free(&p);
    /* a profile: the hottest host experts in RAM, whatever their layer */
    uint64_t prof[LX];
    for (int i = 0; i < LX; i++) prof[i] = (uint64_t)(i * 37 % LX); /* a permutation of 0..LX-1 */
    in.cache = 8;
    in.ram_budget = staging + 10 * 51 * M;
    CHECK(expert_plan_make(&in, prof, &p) == 0 && p.in_ram && p.ram_experts == 10 && p.ssd_experts == LX - 18,
          "profile tiers: ram %ld ssd %ld", p.ram_experts, p.ssd_experts);
    uint64_t coldest_ram = UINT64_MAX, hottest_ssd = 0;
    for (int i = 0; i < LX; i++) {
        if (p.slot[i] >= 0) continue;
        if (p.in_ram[i] && prof[i] < coldest_ram) coldest_ram = prof[i];
        if (!p.in_ram[i] && prof[i] > hottest_ssd) hottest_ssd = prof[i];
    }
    CHECK(coldest_ram > hottest_ssd, "the RAM tier's coldest (%llu) is hotter than the SSD tier's hottest (%llu)",
          (unsigned long long)coldest_ram, (unsigned long long)hottest_ssd);
    expert_plan_free(&p);
    /* the staging and less than one expert besides: everything from the file */
    in.ram_budget = staging + 10 * M;
    CHECK(expert_plan_make(&in, NULL, &p) == 0 && p.ram_experts == 0 && p.ssd_experts == LX - 8, "all on SSD: %ld",
          p.ssd_experts);
    expert_plan_free(&p);
    /* less than the staging: refused, naming it */
    in.ram_budget = G;
    CHECK(expert_plan_make(&in, NULL, &p) == -1 && strstr(st_error_get(), "staging buffer (1.6436 GiB"),
          "a budget below the staging: %s", st_error_get());
}

/* The store's reads are the file's bytes: every expert, from the file
 * (no RAM tier) and from the arena (all of it in RAM), by io_uring and
 * O_DIRECT and by each fallback (STRATA_SSD_IO forces them). */
static void test_store_bytes(const char *path) {
    model *m = model_load(path);
    ST_ASSERT(m);
    const int L = m->hp.n_layer, X = m->hp.n_expert;
    uint8_t *all = st_malloc((size_t)L * X);
    memset(all, 1, (size_t)L * X);
    const char *modes[] = {"auto", "pread", "buffered", "pread-buffered"};
    for (int pass = 0; pass < 2 + 3; pass++) {
        if (pass >= 2) setenv("STRATA_SSD_IO", modes[pass - 1], 1); /* before any thread: the engine's start none */
        expert_store *s = expert_store_open(m, pass == 1 ? all : NULL, NULL, 0);
        ST_ASSERT(s);
        int bad = 0, list[256];
        for (int il = 0; il < L; il++) {
            int n = 0;
            for (int e = il % 2; e < X; e += 2) list[n++] = e; /* every other expert: not one contiguous run */
            expert_store_begin(s, il, list, n);
            const st_weight *w[3];
            expert_store_wait(s, il, &w[0], &w[1], &w[2]);
            const st_weight *mw[3] = {&m->layers[il].ffn_gate_exps, &m->layers[il].ffn_up_exps,
                                      &m->layers[il].ffn_down_exps};
            for (int i = 0; i < n; i++)
                for (int k = 0; k < 3; k++)
                    bad += memcmp(st_weight_mat(w[k], list[i]), st_weight_mat(mw[k], list[i]),
                                  (size_t)mw[k]->n_out * mw[k]->row_bytes) != 0;
            const void *one[3]; /* one expert outside the batch: read at once */
            expert_store_expert(s, il, (il + 1) % 2, one);
            for (int k = 0; k < 3; k++)
                bad += memcmp(one[k], st_weight_mat(mw[k], (il + 1) % 2), (size_t)mw[k]->n_out * mw[k]->row_bytes) != 0;
        }
        const expert_store_stats *st = expert_store_stats_get(s);
        CHECK(!bad, "%s (%s): %d matrices differ from the file", pass == 1 ? "RAM tier" : "SSD tier",
              expert_store_mode(s), bad);
        if (pass == 1)
            CHECK(st->bytes == 0 && st->ram > 0, "all in RAM: %llu bytes read", (unsigned long long)st->bytes);
        else
            CHECK(st->bytes > 0 && st->matrices == (uint64_t)(L * (X / 2) * 3 + L * 3), "SSD: %llu matrices read",
                  (unsigned long long)st->matrices);
        if (pass >= 2)
            CHECK(strcmp(expert_store_mode(s), pass == 2   ? "pread, O_DIRECT"
                                               : pass == 3 ? "io_uring, buffered"
                                                           : "pread, buffered") == 0,
                  "STRATA_SSD_IO=%s: mode %s", modes[pass - 1], expert_store_mode(s));
        printf("  store (%s), %s: every matrix equal to the file's\n", expert_store_mode(s),
               pass == 1 ? "all in the RAM tier" : "all read from the file");
        expert_store_close(s);
    }
    unsetenv("STRATA_SSD_IO");
    st_free(all);
    model_free(m);
}

/* Bad --ram-budget values: a usage error naming the flag (exit status 2). */
static void test_bad_flag(const char *strata, const char *path) {
    const char *bad[] = {"0", "-1", "abc", "1e9"};
    for (size_t i = 0; i <= sizeof bad / sizeof bad[0]; i++) {
        char cmd[1200], out[1024] = {0};
        if (i < sizeof bad / sizeof bad[0])
            snprintf(cmd, sizeof cmd, "%s run -m %s -p x -n 1 --ram-budget %s 2>&1", strata, path, bad[i]);
        else snprintf(cmd, sizeof cmd, "%s run -m %s -p x -n 1 --ram-budget 2>&1", strata, path);
        FILE *f = popen(cmd, "r");
        ST_ASSERT(f);
        const size_t n = fread(out, 1, sizeof out - 1, f);
        out[n] = 0;
        const int st = pclose(f);
        CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 2 && strstr(out, "--ram-budget"),
              "--ram-budget %s: status %d, said: %s", i < sizeof bad / sizeof bad[0] ? bad[i] : "(none)",
              WIFEXITED(st) ? WEXITSTATUS(st) : -1, out);
    }
    printf("  bad --ram-budget values refused with a usage error\n");
}

int main(int argc, char **argv) {
    setvbuf(stdout, NULL, _IONBF, 0);
    st_log_set_level(ST_LOG_WARN);
    const char *dir = argc > 1 ? argv[1] : ".";
    char path[512], prof_path[512], strata[512];
    snprintf(path, sizeof path, "%s/strata-test-tiers-%d.gguf", dir, (int)getpid());
    snprintf(prof_path, sizeof prof_path, "%s/strata-test-tiers-%d.prof", dir, (int)getpid());
    snprintf(strata, sizeof strata, "%s/bin/strata", dir);
    synth_hparams hp;
    if (lanes_tiny(path, &hp) != 0) return 1;
    test_plan();
    test_store_bytes(path);
    if (access(strata, X_OK) == 0) test_bad_flag(strata, path);
    else printf("  (no %s: the CLI's flag checks not run)\n", strata);

    const int total = hp.n_layer * hp.n_expert;
    /* a RAM budget of the SSD tier's staging (a layer's 16 experts and a
     * spare) and 6 experts: 42 or more of the 48 come from the file */
    model *m = model_load(path);
    ST_ASSERT(m);
    const double per = (double)expert_store_expert_bytes(m), gib = (double)(1ull << 30);
    const double ram6 = (hp.n_expert + 1 + 6) * per / gib, ram0 = (hp.n_expert + 1.5) * per / gib;
    model_free(m);
    { /* less than the staging: the engine does not open, and says why */
        config c = {0, 0, 0, NULL, hp.n_expert * per / gib};
        engine_params p = params(path, &c);
        engine *e = engine_open(&p);
        CHECK(!e && strstr(st_error_get(), "cannot hold the SSD tier's staging buffer"),
              "RAM budget below the staging: %s", e ? "opened" : st_error_get());
        if (e) engine_close(e);
        else printf("  a RAM budget below the staging refused: %s\n", st_error_get());
    }
    /* a profile of the plain routing (strata profile's counts), for the profile case */
    {
        config c = {0, 0, 0, NULL, 0};
        engine_params p = params(path, &c);
        engine *e = engine_open(&p);
        ST_ASSERT(e && engine_read_prompt(e, (int32_t[]){1, 2, 3, 4, 5}, 5) == 0);
        ST_ASSERT(expert_profile_save(prof_path, moe_lanes_counts(e->be), hp.n_layer, hp.n_expert) == 0);
        engine_close(e);
    }
    const config cases[] = {
        {0, 0, 0, NULL, ram6},           /* every miss on the CPU lane */
        {0, 1, 0, NULL, ram6},           /* every miss over "PCIe", from the staging */
        {total / 4, 0.5, 1, NULL, ram6}, /* split, and the cache learning from SSD-tier experts */
        {total / 4, 0, 0, NULL, ram6},   /* profile below */
        {0, 0, 0, NULL, ram0},           /* the staging and half an expert: all from the file */
        {-1, -1, 0, NULL, ram6},         /* the CPU alone (no --expert-cache): the lanes come for the tiers */
    };
    int checked_cache = 0;
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        config c = cases[i];
        if (i == 3) c.profile = prof_path;
        char what[160];
        if (c.cache < 0) snprintf(what, sizeof what, "the CPU alone, RAM budget %.4f MiB", c.ram_gib * 1024);
        else
            snprintf(what, sizeof what, "cache %ld of %d, pcie-frac %g%s%s, RAM budget %.4f MiB", c.cache, total,
                     c.frac, c.adapt ? ", learning" : "", c.profile ? ", profile" : "", c.ram_gib * 1024);
        ssd_ranges ranges;
        ssd_ranges_of(path, &c, &ranges);
        const int dropped = drop_cache(path) == 0;
        lanes_run_out tier, all;
        const int nv = run(path, &c, &tier);
        if (nv < 0) {
            check_fail();
            continue;
        }
        long n_pages = 0;
        const long cached = dropped ? ssd_pages_cached(path, &ranges, &n_pages) : -1;
        config plain = c;
        plain.ram_gib = 0; /* the same placement, every host expert in the mapping */
        ST_ASSERT(run(path, &plain, &all) == nv);
        int same_tok = 1;
        double diff = 0, mx = 0;
        for (int t = 0; t < N_GEN; t++) same_tok &= tier.tok[t] == all.tok[t];
        for (size_t k = 0; k < (size_t)(N_GEN + 1) * nv; k++) {
            diff = fmax(diff, fabs(tier.logits[k] - all.logits[k]));
            mx = fmax(mx, fabs(all.logits[k]));
        }
        /* bit for bit without the CPU lane (memcmp: a NaN is unequal too, where
         * fabs would hide it); with it, the lane sums each group of experts
         * whose reads are in, another order than one call: float rounding */
        const int bits = !memcmp(tier.logits, all.logits, (size_t)(N_GEN + 1) * nv * sizeof(float));
        int finite = 1;
        for (size_t q = 0; q < (size_t)(N_GEN + 1) * nv; q++) finite &= isfinite(tier.logits[q]);
        if (c.frac == 1) CHECK(bits, "%s: logits differ (largest difference %.3g of %.3g)", what, diff, mx);
        CHECK(finite && diff <= BOUND * mx && same_tok, "%s: logits differ by %.3g of %.3g, tokens %s", what, diff, mx,
              same_tok ? "equal" : "differ");
        const moe_lane_stats *s = &tier.stats;
        CHECK(s->bytes_ssd > 0 && s->ns_ssd > 0 && all.stats.bytes_ssd == 0, "%s: %llu SSD bytes (%llu without)", what,
              (unsigned long long)s->bytes_ssd, (unsigned long long)all.stats.bytes_ssd);
        if (c.cache >= 0)
            CHECK(s->pairs_dev + s->pairs_cpu + s->pairs_pcie ==
                      all.stats.pairs_dev + all.stats.pairs_cpu + all.stats.pairs_pcie,
                  "%s: pair counts differ", what);
        else
            CHECK(tier.lanes && !all.lanes && s->pairs_dev == 0 && s->pairs_cpu > 0,
                  "%s: lanes %d with the budget (%llu CPU pairs), %d without", what, tier.lanes,
                  (unsigned long long)s->pairs_cpu, all.lanes);
        if (c.adapt) CHECK(s->swaps > 0, "%s: no slot changed hands", what);
        if (cached >= 0) {
            checked_cache++;
            CHECK(cached == 0, "%s: %ld of the SSD tier's %ld pages came into the page cache", what, cached, n_pages);
        }
        printf("  %-72s logits %s (%.1e), %.1f KB/token from the file at %.2f GB/s; SSD pages cached %ld of %ld\n",
               what,
               bits                 ? "bit-equal"
               : diff <= BOUND * mx ? "within rounding"
                                    : "DIFFER",
               diff, (double)s->bytes_ssd / (N_PROMPT + N_GEN) / 1e3, (double)s->bytes_ssd / (double)s->ns_ssd, cached,
               n_pages);
        st_free(tier.logits);
        st_free(all.logits);
    }
    if (!checked_cache) printf("  (the page cache could not be dropped or read here: mincore check not run)\n");
    /* the speed line names the SSD tier's bytes and rate */
    gen_stats gs = {.n_read = 4, .n_gen = 4, .lanes = 1, .pairs_cpu = 8, .bytes_ssd = 8000000, .ns_ssd = 4000000};
    char line[512];
    gen_stats_format(&gs, line, sizeof line);
    CHECK(strstr(line, "SSD tier 1.00 MB/token read at 2.00 GB/s") != NULL, "speed line: %s", line);
    unlink(path);
    unlink(prof_path);
    return check_report("test_tiers");
}
