/* The engine process's own interface (what runs in the child, engine/): the
 * in-process role of the scheduler and the generation hooks it gives each
 * request. Only the files of engine/ and the scheduler's tests include it;
 * the front end sees the scheduler through srv_proto.h alone.
 *
 * The scheduler: a queue of requests and N slots on one engine, advanced
 * together by one engine thread (continuous batching). A request goes in as
 * plain data (srv_request: prompt tokens, sampling and stop settings),
 * events come out (START, TEXT, DONE or ERROR), and it knows nothing of HTTP
 * or JSON, which is what lets it run in the supervised child (srv_proto.h).
 *
 * Slots share the model, its backend (one CPU thread pool) and activations;
 * each has its own sequence (KV cache, token history). Each iteration of the
 * engine thread: admit queued requests into free slots, then ONE batched
 * step (engine_step, model_forward_batch) holding one token of every slot
 * that is generating plus the next chunk of the prompt of one slot that is
 * reading its prompt (as many tokens as the step has rows left, n_ubatch in
 * all; the prompt's last token is that slot's first decode row instead),
 * then sample each slot with fresh logits. The weights are read once
 * per step for all of them, and a long prompt is read a chunk per step while
 * the running streams keep flowing. A slot whose client went away (an event
 * answered nonzero) is freed at once.
 *
 * Routing: a queued request goes to the free slot whose cached tokens share
 * the longest prefix with its prompt, as long as that prefix is at least half
 * of the prompt; otherwise to the least recently used free slot (an empty one
 * first), so that a new conversation does not evict another one only because
 * both start with the same few template tokens.
 */
#ifndef STRATA_SERVER_ENGINE_SRV_SCHED_H
#define STRATA_SERVER_ENGINE_SRV_SCHED_H

#include "server/srv_proto.h"

/* Open the engine with n_slots sequences and start its thread in this process. NULL with
 * st_error_get(). */
srv_sched *sched_create(const engine_params *ep, int n_slots, int max_queue);

/* A request's additions to generation (engine/srv_gen.c): hk gets the hooks for its
 * log probabilities (TOKEN events to fn with slot), its grammar and its
 * reasoning budget. NULL (hk cleared) when it has none, or when the grammar does not compile (err
 * then says why). vocab: the caller's two vocabulary tables the grammar walks (vocab[0] for answers
 * without control tokens' text, vocab[1] for those that render them), each built on first need and kept
 * by the caller for the engine's life (srv_vocab_free). */
typedef struct srv_gen_extra srv_gen_extra;
typedef struct srv_vocab srv_vocab;
srv_gen_extra *srv_gen_extra_new(const engine *e, const srv_request *r, srv_event_fn fn, void *ctx, int slot,
                                 gen_hooks *hk, srv_vocab **vocab, char *err, size_t errcap);
void srv_gen_extra_free(srv_gen_extra *x);
void srv_vocab_free(srv_vocab *v);
/* DRY's breaker tokens: 1 for each token whose piece holds one of the
 * request's sequence breakers (st_malloc'd, n_vocab; NULL when it has none). */
uint8_t *srv_dry_breakers(const engine *e, const srv_request *r, srv_vocab **vocab);

#endif
