/* A model's layers split across processes (docs/multi.md): one process per
 * rank of an MPI job (`mpirun -n N strata ...`), rank r running a contiguous
 * range of layers on the CPU. Rank 0 embeds the tokens, applies the output
 * head and runs the scheduler and every front end; the residual stream goes
 * round a ring, rank to rank with MPI_Send/MPI_Recv, and back to rank 0
 * (model_split in forward.h). The other ranks follow rank 0: before each
 * forward call rank 0 broadcasts a small command (which sequences, at which
 * positions, how many tokens each; or a sequence's end; or stop) and they
 * make the same forward call on their own layers and KV caches.
 *
 * Each rank holds the KV cache of its layers only and binds only its layers'
 * tensors (model_keep_layers): the GGUF is mapped, so the rest is never read.
 * The MPI code (split_mpi.c) is compiled only with STRATA_MPI; without it, or
 * outside mpirun, there is one process and nothing here does anything. */
#ifndef STRATA_ENGINE_SPLIT_H
#define STRATA_ENGINE_SPLIT_H

#include <stddef.h>
#include <stdint.h>

#include "model/model.h"

/* The transport: blocking, whole buffers, rank 0 the root. Over MPI
 * (split_mpi.c: one process per rank) or between threads of one process
 * (split_local.c: one engine per device, `--devices`). An engine holds its
 * rank's (engine.net). */
typedef struct split_net split_net;
enum { SPLIT_MAX_DEVICES = 64 }; /* ranks of an in-process split */
struct split_net {
    int rank, size;
    int stopped; /* rank 0 sent stop */
    void (*send)(split_net *net, int to, const float *x, size_t n);
    void (*recv)(split_net *net, int from, float *x, size_t n);
    void (*bcast)(split_net *net, int32_t *v, size_t n);
    void (*finish)(void);
    void *ctx;
};

/* The process's MPI transport when this process is a rank of a job of
 * several, else NULL. */
split_net *split_process_net(void);

/* main(): join the MPI job when started by mpirun with more than one rank
 * (MPI_Init), else nothing. Returns this process's rank (0 alone). A rank
 * other than 0 gets stdout sent to /dev/null: rank 0 speaks for the job. */
int split_start(int *argc, char ***argv);
/* The rank the launcher gave this process (0 outside a job), before split_start. */
int split_launched_rank(void);
int split_launched_size(void); /* the job's size as the launcher gave it, 1 outside one */
int split_rank(void);
int split_size(void); /* 1 outside a multi-rank job */
/* Rank 0: tell the followers to stop (if an engine never did), then leave the job. */
void split_finish(void);

/* Rank 0's n bytes at *buf to every rank: rank 0 passes them, the others
 * get a new buffer (st_free) and its length. Before any engine is open (the
 * server's engine job shares its configuration frame this way). */
void split_share(char **buf, uint32_t *n);

/* Layers [*il0, *il1) of rank `rank` of n_ranks: by spec, "N,M,..." layer
 * counts one per rank summing to the layer count, or NULL/"" for an even
 * split of the weights' bytes (rank 0's share counts the output matrix it
 * applies). 0, or -1 with st_error naming the problem. */
int split_layer_range(const model *m, const char *spec, int n_ranks, int rank, int *il0, int *il1);

/* Bytes of the weights a rank of layers [il0, il1) binds (rank 0 the
 * embedding and output matrix too; every expert of its layers). */
size_t split_rank_bytes(const model *m, int il0, int il1);

/* What a split can run so far: 0, or -1 with st_error naming what is not
 * built (ram_budget: the SSD tier; a recurrent family). The engine refuses
 * with it, and `strata launch` plans with it. */
int split_supported(const model_hparams *hp, int n_ranks, int ram_budget);

/* Commands, rank 0 to the followers, before each forward call (engine.c);
 * nothing without a split (net NULL) or on a follower. */
enum { SPLIT_STOP = 0, SPLIT_FORWARD = 1, SPLIT_BATCH = 2, SPLIT_FREE = 3 };
/* model_forward of n tokens of sequence id from pos (model_forward_top_k is one token,
 * model_forward_hidden one chunk of n); all: rank 0 wants every window's rows
 * back (all logits, or the hidden states), not only the last one's (forward.h). */
void split_send_forward(split_net *net, int id, int pos, int n, int all);
/* model_forward_batch: n_seq sequences, n_tok NULL for one token each, all: every row's logits. */
void split_send_batch(split_net *net, int n_seq, const int *ids, const int *pos, const int *n_tok, int skip, int all);
/* Sequence id is gone: its followers' caches are freed. */
void split_send_free(split_net *net, int id);
void split_send_stop(split_net *net);

/* model_split's hops (forward.h; ctx: the split_net): the residual stream to
 * the next rank and from the previous one, round the ring (the last rank's
 * next is rank 0). */
void split_send_x(void *ctx, const float *x, size_t n);
void split_recv_x(void *ctx, float *x, size_t n);

struct engine;
/* A follower's life after engine_open: apply rank 0's commands (e->net)
 * until stop. 0, or -1 on a bad command. */
int split_follow(struct engine *e);

#endif
