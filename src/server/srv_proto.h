/* The supervised engine process: the wire protocol between the HTTP front
 * end (the parent, srv_proc.c) and the engine (a child, srv_engine_main.c),
 * and the two ends' entry points.
 *
 * Why a child: a crash, an abort or the OOM killer in the engine must not
 * take the HTTP server down with it (DESIGN.md "The server outlives the
 * engine"). The parent spawns `/proc/self/exe engine --fd 3` with one end of
 * a socketpair as fd 3; the child runs the in-process scheduler
 * (srv_sched.c: queue, slots, routing) and turns its events into frames. When
 * the socket reaches end of file the parent reaps the child, answers every
 * request in flight with 503, and the next request spawns a new child.
 *
 * Frames. Both ends are the same binary on the same machine, so integers and
 * floats travel in native byte order:
 *
 *     u32 len    payload bytes after this 16-byte header (<= PROTO_MAX_PAYLOAD)
 *     u32 type   PROTO_*
 *     u64 id     the request id (0 for CONFIG, READY, FAIL)
 *     payload    fields in order; str = u32 length + bytes (no NUL)
 *
 * parent -> child
 *   CONFIG   str model_path, i32 n_ctx, kv_type, n_threads, n_ubatch, gpu, n_slots, max_queue,
 *            u64 model size, i64 mtime_ns, u64 head_hash (the front end's model_ident)
 *            (first frame; the child loads the model on a thread, still reading the socket; a file
 *            that is not the front end's, before or after loading, is a FAIL)
 *   REQUEST  f32 temp, i32 top_k, f32 top_p, min_p, repeat_penalty, presence_penalty,
 *            frequency_penalty, i32 penalty_last_n, u64 seed, i32 max_tokens,
 *            u32 n_prompt, i32 token[n_prompt], u32 n_stop, str stop[n_stop], i32 logprobs,
 *            top_logprobs, str grammar (GBNF text, empty: none; compiled in the child), str trigger
 *            (the grammar starts after it; empty: at once), i32 ignore_eos, no_cache
 *            (sent only after READY; the parent holds requests that come earlier)
 *   CANCEL   (no payload) the client went away: stop at the next token
 * child -> parent
 *   READY    i32 n_ctx, i32 n_slots           the engines are open
 *   FAIL     str message                      they could not be opened; the child exits 1
 *   START    i32 slot                         a slot took the request
 *   TEXT     i32 slot, bytes                  text (the rest of the payload, whole UTF-8 characters)
 *   DONE     i32 slot, n_prompt, n_reused, n_read, f64 prompt_ms, i32 n_gen, f64 gen_ms,
 *            i32 drafts_accepted, drafts_total, str finish, i32 stop_index
 *   ERROR    i32 slot, str message            the engine refused or failed the request
 *   EMBED    i32 slot, u32 n, f32[n]         an embedding request's vectors
 *   HEARTBEAT (no payload)                    every 250 ms from the start: the parent kills a child
 *                                             silent for --engine-timeout (stopped, hung)
 *
 * Every REQUEST gets exactly one DONE or ERROR unless the child dies first; a
 * CANCEL for an id that already ended is ignored. End of file on either side
 * means the other side is gone: the child exits at once, the parent reaps it.
 */
#ifndef STRATA_SERVER_SRV_PROTO_H
#define STRATA_SERVER_SRV_PROTO_H

#include <stddef.h>
#include <stdint.h>

#include "server/srv_internal.h"

#define PROTO_MAX_PAYLOAD ((uint32_t)256 << 20) /* a 16M-token context of prompt ids fits */
#define PROTO_CHILD_FD 3                        /* the socket's number in the child */

enum {
    PROTO_CONFIG = 1,
    PROTO_REQUEST,
    PROTO_CANCEL,
    PROTO_READY = 16,
    PROTO_FAIL,
    PROTO_START,
    PROTO_TEXT,
    PROTO_DONE,
    PROTO_ERROR,
    PROTO_TOKEN, /* i32 slot, i32 token, f32 logprob, u32 n_top, (i32 id, f32 logprob) x n_top */
    PROTO_HEARTBEAT,
    PROTO_EMBED, /* i32 slot, u32 n, f32 x n: an embedding request's vectors (before its DONE) */
};

typedef struct {
    uint32_t type;
    uint64_t id;
    uint8_t *payload; /* (len) owned, reused across proto_recv calls */
    uint32_t len, cap;
} proto_frame;

/* Send one frame (header + payload) whole. 0, or -1 when the peer is gone
 * (EPIPE and the like; SIGPIPE is never raised). Callers serialise senders. */
int proto_send(int fd, uint32_t type, uint64_t id, const void *payload, size_t len);
/* Receive one frame into f. 1 read, 0 end of file at a frame boundary, -1 a
 * broken or oversized frame, or a read error. */
int proto_recv(int fd, proto_frame *f);
void proto_frame_free(proto_frame *f);

/* Payload writers (append to b) and a bounds-checked reader. */
void proto_put_u32(sbuf *b, uint32_t v);
void proto_put_i32(sbuf *b, int32_t v);
void proto_put_u64(sbuf *b, uint64_t v);
void proto_put_f32(sbuf *b, float v);
void proto_put_f64(sbuf *b, double v);
void proto_put_str(sbuf *b, const char *s, size_t len);

typedef struct {
    const uint8_t *p;
    size_t left;
    int bad; /* set when a read ran past the end: every later read gives 0 */
} proto_cur;

uint32_t proto_get_u32(proto_cur *c);
int32_t proto_get_i32(proto_cur *c);
uint64_t proto_get_u64(proto_cur *c);
float proto_get_f32(proto_cur *c);
double proto_get_f64(proto_cur *c);
/* A string as pointer + length into the payload (not NUL-terminated). */
const char *proto_get_str(proto_cur *c, uint32_t *len);

/* Request and config encoding, shared by both ends so the field order lives in one place. */
void proto_put_request(sbuf *b, const srv_request *r);
/* A finished request's stats (PROTO_DONE); get: finish is one of the static
 * names "stop", "length", "error" ("stop" for anything else). */
void proto_put_stats(sbuf *b, const gen_stats *st);
void proto_get_stats(proto_cur *c, gen_stats *st);
/* Decodes into r with st_malloc'd prompt and stop strings (free with
 * proto_request_free). -1 on a malformed payload. */
int proto_get_request(proto_cur *c, srv_request *r);
void proto_request_free(srv_request *r);
void proto_put_config(sbuf *b, const engine_params *ep, int n_slots, int max_queue, const model_ident *id);
/* ep->model_path is st_malloc'd. -1 on a malformed payload. */
int proto_get_config(proto_cur *c, engine_params *ep, int *n_slots, int *max_queue, model_ident *id);
/* NULL when now is the file `want` describes, else why not (a static string, naming the file by
 * its base name only). */
/* The file name of path without its directories (what a client may be told of a path). */
const char *proto_base_name(const char *path);
const char *model_ident_mismatch(const char *path, const model_ident *want, const model_ident *now);

/* ---- the parent: supervisor of the engine process (srv_proc.c) ----
 * The scheduler's supervised role, sched_create_supervised (srv_sched.h). */

/* The child's entry point, server_engine_main, is in server.h (main.c calls it). */

#endif
