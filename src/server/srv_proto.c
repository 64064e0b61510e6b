/* The engine process's wire protocol (srv_proto.h): whole-frame send and
 * receive on a stream socket, payload writers and a bounds-checked reader,
 * and the encodings of a request and of the engine configuration, shared by
 * both ends so that the field order is written down once. */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <unistd.h>

#include "core/alloc.h"
#include "core/log.h"
#include "server/srv_proto.h"

#define HEADER_BYTES 16

int proto_send(int fd, uint32_t type, uint64_t id, const void *payload, size_t len) {
    if (len > PROTO_MAX_PAYLOAD) return -1;
    uint8_t hdr[HEADER_BYTES];
    uint32_t len32 = (uint32_t)len;
    memcpy(hdr, &len32, 4);
    memcpy(hdr + 4, &type, 4);
    memcpy(hdr + 8, &id, 8);
    struct iovec iov[2] = {{hdr, HEADER_BYTES}, {(void *)payload, len}};
    int n_iov = len ? 2 : 1;
    struct iovec *v = iov;
    while (n_iov > 0) {
        /* sendmsg with MSG_NOSIGNAL: a dead peer is EPIPE here, never a signal */
        struct msghdr mh = {.msg_iov = v, .msg_iovlen = (size_t)n_iov};
        ssize_t w = sendmsg(fd, &mh, MSG_NOSIGNAL);
        if (w < 0) {
            if (errno == EINTR) continue;
            return -1;
        }
        size_t done = (size_t)w;
        while (n_iov > 0 && done >= v->iov_len) {
            done -= v->iov_len;
            v++;
            n_iov--;
        }
        if (n_iov > 0) {
            v->iov_base = (uint8_t *)v->iov_base + done;
            v->iov_len -= done;
        }
    }
    return 0;
}

/* Read exactly n bytes. 1 read, 0 end of file before the first byte, -1 otherwise. */
static int read_full(int fd, void *buf, size_t n) {
    size_t got = 0;
    while (got < n) {
        ssize_t r = read(fd, (uint8_t *)buf + got, n - got);
        if (r < 0 && errno == EINTR) continue;
        if (r < 0) return -1;
        if (r == 0) return got == 0 ? 0 : -1;
        got += (size_t)r;
    }
    return 1;
}

int proto_recv(int fd, proto_frame *f) {
    uint8_t hdr[HEADER_BYTES];
    int r = read_full(fd, hdr, HEADER_BYTES);
    if (r <= 0) return r;
    memcpy(&f->len, hdr, 4);
    memcpy(&f->type, hdr + 4, 4);
    memcpy(&f->id, hdr + 8, 8);
    if (f->len > PROTO_MAX_PAYLOAD) return -1;
    if (f->len > f->cap) {
        f->payload = st_realloc(f->payload, f->len);
        f->cap = f->len;
    }
    if (f->len && read_full(fd, f->payload, f->len) != 1) return -1;
    return 1;
}

void proto_frame_free(proto_frame *f) {
    st_free(f->payload);
    *f = (proto_frame){0};
}

/* ---- payload fields ---- */

void proto_put_u32(sbuf *b, uint32_t v) { sbuf_put(b, (const char *)&v, 4); }
void proto_put_i32(sbuf *b, int32_t v) { sbuf_put(b, (const char *)&v, 4); }
void proto_put_u64(sbuf *b, uint64_t v) { sbuf_put(b, (const char *)&v, 8); }
void proto_put_f32(sbuf *b, float v) { sbuf_put(b, (const char *)&v, 4); }
void proto_put_f64(sbuf *b, double v) { sbuf_put(b, (const char *)&v, 8); }

void proto_put_str(sbuf *b, const char *s, size_t len) {
    proto_put_u32(b, (uint32_t)len);
    sbuf_put(b, s, len);
}

/* Copy n bytes out of the payload, or zeros once it has run out. */
static void take(proto_cur *c, void *out, size_t n) {
    if (c->bad || c->left < n) {
        c->bad = 1;
        memset(out, 0, n);
        return;
    }
    memcpy(out, c->p, n);
    c->p += n;
    c->left -= n;
}

uint32_t proto_get_u32(proto_cur *c) {
    uint32_t v;
    take(c, &v, 4);
    return v;
}

int32_t proto_get_i32(proto_cur *c) {
    int32_t v;
    take(c, &v, 4);
    return v;
}

uint64_t proto_get_u64(proto_cur *c) {
    uint64_t v;
    take(c, &v, 8);
    return v;
}

float proto_get_f32(proto_cur *c) {
    float v;
    take(c, &v, 4);
    return v;
}

double proto_get_f64(proto_cur *c) {
    double v;
    take(c, &v, 8);
    return v;
}

const char *proto_get_str(proto_cur *c, uint32_t *len) {
    uint32_t n = proto_get_u32(c);
    if (c->bad || c->left < n) {
        c->bad = 1;
        *len = 0;
        return "";
    }
    const char *s = (const char *)c->p;
    c->p += n;
    c->left -= n;
    *len = n;
    return s;
}

static char *dup_str(const char *s, uint32_t n) {
    char *d = st_malloc((size_t)n + 1);
    memcpy(d, s, n);
    d[n] = 0;
    return d;
}

/* ---- requests ---- */

void proto_put_request(sbuf *b, const srv_request *r) {
    const sampler_params *sp = &r->sp;
    proto_put_f32(b, sp->temp);
    proto_put_i32(b, sp->top_k);
    proto_put_f32(b, sp->top_p);
    proto_put_f32(b, sp->min_p);
    proto_put_f32(b, sp->repeat_penalty);
    proto_put_f32(b, sp->presence_penalty);
    proto_put_f32(b, sp->frequency_penalty);
    proto_put_i32(b, sp->penalty_last_n);
    proto_put_u64(b, sp->seed);
    proto_put_f32(b, sp->typical_p);
    proto_put_f32(b, sp->dry_multiplier);
    proto_put_f32(b, sp->dry_base);
    proto_put_i32(b, sp->dry_allowed_length);
    proto_put_i32(b, sp->dry_penalty_last_n);
    proto_put_u32(b, (uint32_t)sp->n_bias);
    sbuf_put(b, (const char *)sp->bias_ids, (size_t)sp->n_bias * sizeof(int32_t));
    sbuf_put(b, (const char *)sp->bias_vals, (size_t)sp->n_bias * sizeof(float));
    proto_put_u32(b, (uint32_t)sp->n_order);
    sbuf_put(b, (const char *)sp->order, (size_t)sp->n_order);
    proto_put_u32(b, (uint32_t)r->n_dry_breakers);
    for (int i = 0; i < r->n_dry_breakers; i++) proto_put_str(b, r->dry_breakers[i], strlen(r->dry_breakers[i]));
    proto_put_i32(b, r->max_tokens);
    proto_put_u32(b, (uint32_t)r->n_prompt);
    sbuf_put(b, (const char *)r->prompt, (size_t)r->n_prompt * sizeof(int32_t));
    proto_put_u32(b, (uint32_t)r->n_stop);
    for (int i = 0; i < r->n_stop; i++) proto_put_str(b, r->stop[i], strlen(r->stop[i]));
    proto_put_i32(b, r->logprobs);
    proto_put_i32(b, r->top_logprobs);
    proto_put_str(b, r->grammar ? r->grammar : "", r->grammar ? r->grammar_len : 0);
    proto_put_str(b, r->grammar_trigger ? r->grammar_trigger : "", r->grammar_trigger ? strlen(r->grammar_trigger) : 0);
    proto_put_str(b, r->grammar_think ? r->grammar_think : "", r->grammar_think ? strlen(r->grammar_think) : 0);
    proto_put_i32(b, r->ignore_eos);
    proto_put_i32(b, r->no_cache);
    proto_put_i32(b, r->pin_slot);
    proto_put_i32(b, r->render_special);
    proto_put_i32(b, r->embed);
    proto_put_str(b, r->think_start ? r->think_start : "", r->think_start ? strlen(r->think_start) : 0);
    proto_put_str(b, r->think_close ? r->think_close : "", r->think_close ? strlen(r->think_close) : 0);
    proto_put_str(b, r->think_end ? r->think_end : "", r->think_end ? strlen(r->think_end) : 0);
    proto_put_str(b, r->think_message ? r->think_message : "", r->think_message ? strlen(r->think_message) : 0);
    proto_put_i32(b, r->think_budget);
    proto_put_i32(b, r->think_open);
}

int proto_get_request(proto_cur *c, srv_request *r) {
    memset(r, 0, sizeof *r);
    sampler_params *sp = &r->sp;
    sp->temp = proto_get_f32(c);
    sp->top_k = proto_get_i32(c);
    sp->top_p = proto_get_f32(c);
    sp->min_p = proto_get_f32(c);
    sp->repeat_penalty = proto_get_f32(c);
    sp->presence_penalty = proto_get_f32(c);
    sp->frequency_penalty = proto_get_f32(c);
    sp->penalty_last_n = proto_get_i32(c);
    sp->seed = proto_get_u64(c);
    sp->typical_p = proto_get_f32(c);
    sp->dry_multiplier = proto_get_f32(c);
    sp->dry_base = proto_get_f32(c);
    sp->dry_allowed_length = proto_get_i32(c);
    sp->dry_penalty_last_n = proto_get_i32(c);
    uint32_t nb = proto_get_u32(c);
    if (c->bad || nb > 4096 || nb > c->left / (2 * sizeof(int32_t))) return -1;
    if (nb) {
        int32_t *ids = st_malloc((size_t)nb * sizeof(int32_t));
        float *vals = st_malloc((size_t)nb * sizeof(float));
        take(c, ids, (size_t)nb * sizeof(int32_t));
        take(c, vals, (size_t)nb * sizeof(float));
        sp->bias_ids = ids;
        sp->bias_vals = vals;
        sp->n_bias = (int)nb;
    }
    uint32_t no = proto_get_u32(c);
    if (c->bad || no > SAMPLER_MAX_ORDER || no > c->left) {
        proto_request_free(r);
        return -1;
    }
    take(c, sp->order, no);
    sp->n_order = (int)no;
    uint32_t nbr = proto_get_u32(c);
    if (c->bad || nbr > SRV_MAX_BREAKERS) {
        proto_request_free(r);
        return -1;
    }
    const char **brk = st_calloc(nbr ? nbr : 1, sizeof(char *));
    r->dry_breakers = brk;
    for (uint32_t i = 0; i < nbr; i++) {
        uint32_t len;
        const char *s = proto_get_str(c, &len);
        if (c->bad) break;
        brk[i] = dup_str(s, len);
        r->n_dry_breakers = (int)i + 1;
    }
    r->max_tokens = proto_get_i32(c);
    uint32_t n = proto_get_u32(c);
    if (c->bad || n == 0 || n > c->left / sizeof(int32_t)) {
        proto_request_free(r);
        return -1;
    }
    int32_t *prompt = st_malloc((size_t)n * sizeof(int32_t));
    take(c, prompt, (size_t)n * sizeof(int32_t));
    r->prompt = prompt;
    r->n_prompt = (int)n;
    uint32_t n_stop = proto_get_u32(c);
    if (c->bad || n_stop > 64) {
        proto_request_free(r);
        return -1;
    }
    const char **stops = st_calloc(n_stop ? n_stop : 1, sizeof(char *));
    r->stop = stops;
    for (uint32_t i = 0; i < n_stop; i++) {
        uint32_t len;
        const char *s = proto_get_str(c, &len);
        stops[i] = dup_str(s, len);
        r->n_stop = (int)i + 1;
    }
    r->logprobs = proto_get_i32(c);
    r->top_logprobs = proto_get_i32(c);
    uint32_t glen;
    const char *gtext = proto_get_str(c, &glen);
    if (!c->bad && glen) {
        r->grammar = dup_str(gtext, glen);
        r->grammar_len = glen;
    }
    uint32_t tlen;
    const char *trig = proto_get_str(c, &tlen);
    if (!c->bad && tlen) {
        if (tlen > 64) c->bad = 1;
        else r->grammar_trigger = dup_str(trig, tlen);
    }
    const char *think = proto_get_str(c, &tlen);
    if (!c->bad && tlen) {
        if (tlen > 64 || !r->grammar_trigger) c->bad = 1;
        else r->grammar_think = dup_str(think, tlen);
    }
    r->ignore_eos = proto_get_i32(c);
    r->no_cache = proto_get_i32(c);
    r->pin_slot = proto_get_i32(c);
    r->render_special = proto_get_i32(c);
    r->embed = proto_get_i32(c);
    const char **texts[3] = {&r->think_start, &r->think_close, &r->think_end};
    for (int i = 0; i < 3; i++) { /* short marker texts, or none */
        uint32_t len;
        const char *t = proto_get_str(c, &len);
        if (!c->bad && len) {
            if (len > 64) c->bad = 1;
            else *texts[i] = dup_str(t, len);
        }
    }
    uint32_t mlen;
    const char *msg = proto_get_str(c, &mlen);
    if (!c->bad && mlen) {
        if (mlen > 4096) c->bad = 1; /* SRV_BUDGET_MESSAGE_MAX */
        else r->think_message = dup_str(msg, mlen);
    }
    r->think_budget = proto_get_i32(c);
    r->think_open = proto_get_i32(c);
    if (r->think_end && (!r->think_start || !r->think_close || r->think_budget < 0)) c->bad = 1;
    if (r->top_logprobs < 0 || r->top_logprobs > 20) c->bad = 1;
    if (c->bad) {
        proto_request_free(r);
        return -1;
    }
    return 0;
}

void proto_request_free(srv_request *r) {
    st_free((void *)r->sp.bias_ids);
    st_free((void *)r->sp.bias_vals);
    for (int i = 0; i < r->n_dry_breakers; i++) st_free((void *)r->dry_breakers[i]);
    st_free((void *)r->dry_breakers);
    st_free((void *)r->prompt);
    st_free((void *)r->grammar);
    st_free((void *)r->grammar_trigger);
    st_free((void *)r->grammar_think);
    st_free((void *)r->think_start);
    st_free((void *)r->think_close);
    st_free((void *)r->think_end);
    st_free((void *)r->think_message);
    for (int i = 0; i < r->n_stop; i++) st_free((void *)r->stop[i]);
    st_free((void *)r->stop);
    memset(r, 0, sizeof *r);
}

/* ---- a finished request's stats (the DONE frame) ---- */

void proto_put_stats(sbuf *b, const gen_stats *st) {
    proto_put_i32(b, st->n_prompt);
    proto_put_i32(b, st->n_reused);
    proto_put_i32(b, st->n_read);
    proto_put_f64(b, st->prompt_ms);
    proto_put_i32(b, st->n_gen);
    proto_put_f64(b, st->gen_ms);
    proto_put_i32(b, st->drafts_accepted);
    proto_put_i32(b, st->drafts_total);
    const char *fin = st->finish ? st->finish : "stop";
    proto_put_str(b, fin, strlen(fin));
    proto_put_i32(b, st->stop_index);
    proto_put_i32(b, st->lanes);
    const uint64_t pairs[9] = {st->pairs_dev,  st->pairs_cpu, st->pairs_pcie, st->total_dev, st->total_cpu,
                               st->total_pcie, st->bytes_ssd, st->ns_ssd,     st->total_ssd};
    for (int i = 0; i < 9; i++) proto_put_u64(b, pairs[i]);
    const int has_map = st->expert_map && st->map_layers > 0 && st->map_experts > 0;
    proto_put_i32(b, has_map ? st->map_layers : 0);
    proto_put_i32(b, has_map ? st->map_experts : 0);
    proto_put_str(b, has_map ? st->expert_map : "", has_map ? (size_t)st->map_layers * st->map_experts : 0);
}

void proto_get_stats(proto_cur *c, gen_stats *st) {
    static const char *const known[] = {"stop", "length", "error"}; /* finish: one of these static names */
    memset(st, 0, sizeof *st);
    st->n_prompt = proto_get_i32(c);
    st->n_reused = proto_get_i32(c);
    st->n_read = proto_get_i32(c);
    st->prompt_ms = proto_get_f64(c);
    st->n_gen = proto_get_i32(c);
    st->gen_ms = proto_get_f64(c);
    st->drafts_accepted = proto_get_i32(c);
    st->drafts_total = proto_get_i32(c);
    uint32_t n;
    const char *s = proto_get_str(c, &n);
    st->finish = "stop";
    for (size_t i = 0; i < sizeof known / sizeof known[0]; i++)
        if (s && strlen(known[i]) == n && !memcmp(known[i], s, n)) st->finish = known[i];
    st->stop_index = proto_get_i32(c);
    st->lanes = proto_get_i32(c);
    uint64_t *pairs[9] = {&st->pairs_dev,  &st->pairs_cpu, &st->pairs_pcie, &st->total_dev, &st->total_cpu,
                          &st->total_pcie, &st->bytes_ssd, &st->ns_ssd,     &st->total_ssd};
    for (int i = 0; i < 9; i++) *pairs[i] = proto_get_u64(c);
    const int nl = proto_get_i32(c), nx = proto_get_i32(c);
    const char *map = proto_get_str(c, &n); /* points into the frame: sched_map_keep copies it */
    /* a frame from a broken engine must not reach the JSON answer: bounded, and '0'..'7' only */
    int ok = map && nl > 0 && nx > 0 && nl <= 4096 && nx <= 4096 && (uint64_t)nl * (uint64_t)nx == n;
    for (uint32_t i = 0; ok && i < n; i++) ok = map[i] >= '0' && map[i] <= '7';
    if (ok) st->expert_map = map, st->map_layers = nl, st->map_experts = nx;
}

/* ---- configuration ---- */

void proto_put_config(sbuf *b, const engine_params *ep, int n_slots, int max_queue, const model_ident *id) {
    proto_put_str(b, ep->model_path, strlen(ep->model_path));
    proto_put_i32(b, ep->n_ctx);
    proto_put_i32(b, (int32_t)ep->kv_type);
    proto_put_i32(b, ep->n_threads);
    proto_put_i32(b, ep->n_ubatch);
    proto_put_i32(b, ep->gpu);
    proto_put_f64(b, ep->vram_budget);
    proto_put_i32(b, ep->vram_reserve_mib);
    proto_put_u64(b, (uint64_t)(int64_t)ep->expert_cache);
    proto_put_str(b, ep->expert_profile ? ep->expert_profile : "", ep->expert_profile ? strlen(ep->expert_profile) : 0);
    proto_put_f64(b, ep->pcie_frac);
    proto_put_i32(b, ep->no_pin);
    proto_put_f64(b, ep->ram_budget);
    proto_put_i32(b, ep->adapt_every);
    proto_put_i32(b, ep->draft_n);
    proto_put_i32(b, ep->draft_mtp);
    proto_put_str(b, ep->layer_split ? ep->layer_split : "", ep->layer_split ? strlen(ep->layer_split) : 0);
    proto_put_str(b, ep->devices ? ep->devices : "", ep->devices ? strlen(ep->devices) : 0);
    proto_put_i32(b, ep->pipeline_windows);
    proto_put_i32(b, n_slots);
    proto_put_i32(b, max_queue);
    proto_put_u64(b, id->size);
    proto_put_u64(b, (uint64_t)id->mtime_ns);
    proto_put_u64(b, id->head_hash);
}

int proto_get_config(proto_cur *c, engine_params *ep, int *n_slots, int *max_queue, model_ident *id) {
    *ep = engine_defaults();
    uint32_t len;
    const char *path = proto_get_str(c, &len);
    ep->n_ctx = proto_get_i32(c);
    ep->kv_type = (st_kv_type)proto_get_i32(c);
    ep->n_threads = proto_get_i32(c);
    ep->n_ubatch = proto_get_i32(c);
    ep->gpu = proto_get_i32(c);
    ep->vram_budget = proto_get_f64(c);
    ep->vram_reserve_mib = proto_get_i32(c);
    ep->expert_cache = (long)(int64_t)proto_get_u64(c);
    uint32_t plen;
    const char *prof = proto_get_str(c, &plen);
    ep->pcie_frac = proto_get_f64(c);
    ep->no_pin = proto_get_i32(c);
    ep->ram_budget = proto_get_f64(c);
    ep->adapt_every = proto_get_i32(c);
    ep->draft_n = proto_get_i32(c);
    ep->draft_mtp = proto_get_i32(c);
    uint32_t slen;
    const char *split = proto_get_str(c, &slen);
    uint32_t dlen;
    const char *devices = proto_get_str(c, &dlen);
    ep->pipeline_windows = proto_get_i32(c);
    *n_slots = proto_get_i32(c);
    *max_queue = proto_get_i32(c);
    id->size = proto_get_u64(c);
    id->mtime_ns = (int64_t)proto_get_u64(c);
    id->head_hash = proto_get_u64(c);
    if (c->bad || *n_slots <= 0 || *max_queue <= 0) return -1;
    ep->model_path = dup_str(path, len);
    ep->expert_profile = plen ? dup_str(prof, plen) : NULL;
    ep->layer_split = slen ? dup_str(split, slen) : NULL;
    ep->devices = dlen ? dup_str(devices, dlen) : NULL;
    return 0;
}

/* ---- model identity ---- */

const char *proto_base_name(const char *path) {
    const char *b = strrchr(path, '/');
    return b ? b + 1 : path;
}
#define base_name proto_base_name

#define IDENT_HEAD_BYTES ((size_t)1 << 20)

int model_ident_of(const char *path, model_ident *id) {
    *id = (model_ident){0};
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    struct stat st;
    if (fd < 0 || fstat(fd, &st) != 0) {
        st_error_set("cannot read the model file %s: %s", base_name(path), strerror(errno));
        if (fd >= 0) close(fd);
        return -1;
    }
    id->size = (uint64_t)st.st_size;
    id->mtime_ns = (int64_t)st.st_mtim.tv_sec * 1000000000 + st.st_mtim.tv_nsec;
    uint64_t h = 0xcbf29ce484222325ull; /* FNV-1a */
    uint8_t *buf = st_malloc(65536);
    size_t done = 0;
    while (done < IDENT_HEAD_BYTES) {
        ssize_t r = pread(fd, buf, 65536, (off_t)done);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) break;
        for (ssize_t i = 0; i < r; i++) h = (h ^ buf[i]) * 0x100000001b3ull;
        done += (size_t)r;
    }
    st_free(buf);
    close(fd);
    id->head_hash = h;
    return 0;
}

const char *model_ident_mismatch(const char *path, const model_ident *want, const model_ident *now) {
    static _Thread_local char why[400];
    const char *what = now->size != want->size             ? "its size changed"
                       : now->head_hash != want->head_hash ? "its header changed"
                       : now->mtime_ns != want->mtime_ns   ? "it was modified"
                                                           : NULL;
    if (!what) return NULL;
    snprintf(why, sizeof why,
             "the model file %s is not the one this server started with (%s): the front end's "
             "tokenizer and the engine would disagree; restart strata serve to serve it",
             base_name(path), what);
    return why;
}
