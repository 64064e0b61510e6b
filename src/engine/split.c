/* The layer split's process-wide state, its choice of ranges and its
 * commands (split.h). Everything MPI is behind the split_net table that
 * split_mpi.c fills (built with STRATA_MPI only); here there are no MPI calls
 * and, outside a multi-rank job, nothing happens at all. */
#include "engine/split.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/alloc.h"
#include "core/log.h"
#include "engine/engine.h"

static split_net mpi_net = {.rank = 0, .size = 1};
static int joined; /* MPI_Init was called */

#ifdef STRATA_HAVE_MPI
int split_net_mpi(int *argc, char ***argv, split_net *net);
#endif

/* The job's size as the launcher tells it (Open MPI, then the PMI names of
 * MPICH and Slurm), before MPI_Init: a plain run never starts MPI. */
int split_launched_size(void) {
    const char *names[] = {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_SIZE"};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        const char *v = getenv(names[i]);
        if (v && atoi(v) > 0) return atoi(v);
    }
    return 1;
}

int split_launched_rank(void) {
    const char *names[] = {"OMPI_COMM_WORLD_RANK", "PMI_RANK", "PMIX_RANK"};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        const char *v = getenv(names[i]);
        if (v) return atoi(v);
    }
    return 0;
}

int split_start(int *argc, char ***argv) {
    const int n = split_launched_size();
    if (n <= 1) return 0;
#ifdef STRATA_HAVE_MPI
    if (split_net_mpi(argc, argv, &mpi_net) != 0) {
        fprintf(stderr, "strata: MPI_Init failed in a job of %d ranks\n", n);
        exit(1);
    }
    joined = 1;
    atexit(split_finish);
    if (mpi_net.rank > 0 && !freopen("/dev/null", "w", stdout)) {
        fprintf(stderr, "strata: rank %d: cannot quiet stdout\n", mpi_net.rank);
        exit(1);
    }
    return mpi_net.rank;
#else
    (void)argc;
    (void)argv;
    fprintf(stderr,
            "strata: started as one of %d ranks, but this build has no MPI (configure with -DSTRATA_MPI=ON "
            "and libopenmpi-dev installed)\n",
            n);
    exit(2);
#endif
}

int split_rank(void) { return mpi_net.rank; }
int split_size(void) { return mpi_net.size; }
split_net *split_process_net(void) { return mpi_net.size > 1 ? &mpi_net : NULL; }

void split_finish(void) {
    if (!joined) return;
    split_send_stop(&mpi_net);
    joined = 0;
    mpi_net.finish();
}

void split_share(char **buf, uint32_t *n) {
    split_net *net = &mpi_net;
    if (net->size <= 1) return;
    int32_t len = net->rank == 0 ? (int32_t)*n : 0;
    net->bcast(net, &len, 1);
    const size_t words = ((size_t)len + 3) / 4;
    int32_t *w = st_calloc(words ? words : 1, sizeof(int32_t));
    if (net->rank == 0) memcpy(w, *buf, (size_t)len);
    net->bcast(net, w, words);
    if (net->rank != 0) {
        *buf = st_malloc((size_t)len + 1);
        memcpy(*buf, w, (size_t)len);
        *n = (uint32_t)len;
    }
    st_free(w);
}

/* Bytes of layer il's weights (the experts all of them: a rank holds them all). */
static double layer_bytes(const model *m, int il) {
    double b = 0;
    for (int t = 0; t < MODEL_N_LAYER_TENSORS; t++) {
        const model_layer_tensor *lt = &MODEL_LAYER_TENSORS[t];
        if (lt->vec || !model_has_tensor(&m->hp, il, lt->when)) continue;
        const st_weight *w = (const st_weight *)((const char *)&m->layers[il] + lt->offset);
        b += (double)w->row_bytes * (double)w->n_out * (double)(w->n_mat > 0 ? w->n_mat : 1);
    }
    return b;
}

int split_layer_range(const model *m, const char *spec, int n_ranks, int rank, int *il0, int *il1) {
    const int nl = m->hp.n_layer;
    if (n_ranks < 1 || rank < 0 || rank >= n_ranks) {
        st_error_set("split_layer_range: rank %d of %d", rank, n_ranks);
        return -1;
    }
    if (n_ranks > nl) {
        st_error_set("%d ranks for %d layers: each rank needs at least one layer", n_ranks, nl);
        return -1;
    }
    int *start = st_calloc((size_t)n_ranks + 1, sizeof(int)); /* rank r: [start[r], start[r+1]) */
    start[n_ranks] = nl;
    if (spec && *spec) {
        const char *p = spec;
        int r = 0, sum = 0;
        while (*p) {
            char *end;
            long v = strtol(p, &end, 10);
            if (end == p || v < 1 || v > nl || (*end && *end != ',') || r >= n_ranks) {
                st_error_set("--layer-split %s: want %d layer counts (each >= 1) separated by commas, summing to %d",
                             spec, n_ranks, nl);
                st_free(start);
                return -1;
            }
            start[r++] = sum;
            sum += (int)v;
            p = *end ? end + 1 : end;
        }
        if (r != n_ranks || sum != nl) {
            st_error_set("--layer-split %s: %d counts summing to %d, but the job has %d ranks and the model %d layers",
                         spec, r, sum, n_ranks, nl);
            st_free(start);
            return -1;
        }
    } else {
        /* even by bytes: boundary b goes where the running sum (rank 0's output
         * matrix first) comes closest to b/n of the total, one layer at least each */
        double *cum = st_malloc(((size_t)nl + 1) * sizeof(double));
        cum[0] = (double)m->output.row_bytes * (double)m->output.n_out;
        for (int il = 0; il < nl; il++) cum[il + 1] = cum[il] + layer_bytes(m, il);
        for (int b = 1; b < n_ranks; b++) {
            const double target = cum[nl] * b / n_ranks;
            int best = start[b - 1] + 1;
            for (int i = best; i <= nl - (n_ranks - b); i++)
                if (fabs(cum[i] - target) < fabs(cum[best] - target)) best = i;
            start[b] = best;
        }
        st_free(cum);
    }
    *il0 = start[rank];
    *il1 = start[rank + 1];
    st_free(start);
    return 0;
}

size_t split_rank_bytes(const model *m, int il0, int il1) {
    double b = 0;
    for (int il = il0; il < il1; il++) b += layer_bytes(m, il);
    if (il0 == 0) {
        b += (double)m->tok_embd.row_bytes * (double)m->tok_embd.n_out;
        if (m->output.data != m->tok_embd.data) b += (double)m->output.row_bytes * (double)m->output.n_out;
    }
    return (size_t)b;
}

int split_supported(const model_hparams *hp, int n_ranks, int ram_budget) {
    if (ram_budget) {
        st_error_set("a layer split across %d ranks does not take --ram-budget (the SSD tier) so far", n_ranks);
        return -1;
    }
    if (hp->full_attn_interval) {
        st_error_set("a layer split keeps attention caches only: architecture '%s' has a recurrent state",
                     model_arch_name(hp->arch));
        return -1;
    }
    return 0;
}

/* Rank 0 alone commands, until stop. */
static int commands(const split_net *net) { return net && net->size > 1 && net->rank == 0 && !net->stopped; }

void split_send_forward(split_net *net, int id, int pos, int n, int all) {
    if (!commands(net)) return;
    int32_t hdr[4] = {SPLIT_FORWARD, 1, all != 0, 0}, body[3] = {id, pos, n};
    net->bcast(net, hdr, 4);
    net->bcast(net, body, 3);
}

void split_send_batch(split_net *net, int n_seq, const int *ids, const int *pos, const int *n_tok, int skip, int all) {
    if (!commands(net)) return;
    int32_t hdr[4] = {SPLIT_BATCH, n_seq, (n_tok != NULL) | (all ? 2 : 0), skip};
    int32_t *body = st_malloc((size_t)n_seq * 3 * sizeof(int32_t));
    for (int s = 0; s < n_seq; s++) {
        body[3 * s] = ids[s];
        body[3 * s + 1] = pos[s];
        body[3 * s + 2] = n_tok ? n_tok[s] : 1;
    }
    net->bcast(net, hdr, 4);
    net->bcast(net, body, (size_t)n_seq * 3);
    st_free(body);
}

void split_send_free(split_net *net, int id) {
    if (!commands(net)) return;
    int32_t hdr[4] = {SPLIT_FREE, id, 0, 0};
    net->bcast(net, hdr, 4);
}

void split_send_stop(split_net *net) {
    if (!commands(net)) return;
    int32_t hdr[4] = {SPLIT_STOP, 0, 0, 0};
    net->bcast(net, hdr, 4);
    net->stopped = 1;
}

void split_send_x(void *ctx, const float *x, size_t n) {
    split_net *net = ctx;
    net->send(net, (net->rank + 1) % net->size, x, n);
}

void split_recv_x(void *ctx, float *x, size_t n) {
    split_net *net = ctx;
    net->recv(net, (net->rank + net->size - 1) % net->size, x, n);
}

/* A follower's caches, one per sequence id rank 0 has used. */
typedef struct {
    int id;
    kv_cache *kv;
} fseq;

static kv_cache *follower_cache(engine *e, fseq **seqs, int *n, int id) {
    for (int i = 0; i < *n; i++)
        if ((*seqs)[i].id == id) return (*seqs)[i].kv;
    *seqs = st_realloc(*seqs, (size_t)(*n + 1) * sizeof **seqs);
    (*seqs)[*n].id = id;
    (*seqs)[*n].kv = kv_cache_create_range(e->be, &e->m->hp, e->n_ctx, e->kv_type, e->il0, e->il1);
    return (*seqs)[(*n)++].kv;
}

int split_follow(engine *e) {
    split_net *net = e->net;
    fseq *seqs = NULL;
    int n_seqs = 0, rc = 0, cap = 0;
    st_kv_layer **kvs = NULL;
    int32_t *body = NULL;
    int *pos = NULL, *ntok = NULL;
    for (;;) {
        int32_t hdr[4];
        net->bcast(net, hdr, 4);
        if (hdr[0] == SPLIT_STOP) break;
        if (hdr[0] == SPLIT_FREE) {
            for (int i = 0; i < n_seqs; i++)
                if (seqs[i].id == hdr[1]) {
                    kv_cache_free(seqs[i].kv);
                    seqs[i] = seqs[--n_seqs];
                    break;
                }
            continue;
        }
        const int n_seq = hdr[1];
        if ((hdr[0] != SPLIT_FORWARD && hdr[0] != SPLIT_BATCH) || n_seq < 1 || n_seq > 1 << 20) {
            st_error_set("rank %d: a command it does not know (%d, %d sequences)", net->rank, hdr[0], n_seq);
            rc = -1;
            break;
        }
        if (n_seq > cap) {
            cap = n_seq;
            kvs = st_realloc(kvs, (size_t)cap * sizeof *kvs);
            body = st_realloc(body, (size_t)cap * 3 * sizeof *body);
            pos = st_realloc(pos, (size_t)cap * sizeof *pos);
            ntok = st_realloc(ntok, (size_t)cap * sizeof *ntok);
        }
        net->bcast(net, body, (size_t)n_seq * 3);
        for (int s = 0; s < n_seq; s++) {
            kvs[s] = follower_cache(e, &seqs, &n_seqs, body[3 * s])->layers;
            pos[s] = body[3 * s + 1];
            ntok[s] = body[3 * s + 2];
        }
        if (hdr[0] == SPLIT_FORWARD) model_forward(e->mc, kvs[0], NULL, ntok[0], pos[0], NULL, hdr[2] & 1);
        else
            model_forward_batch(e->mc, kvs, NULL, pos, hdr[2] & 1 ? ntok : NULL, n_seq, hdr[3], hdr[2] >> 1 & 1, NULL,
                                NULL);
    }
    for (int i = 0; i < n_seqs; i++) kv_cache_free(seqs[i].kv);
    st_free(seqs);
    st_free(kvs);
    st_free(body);
    st_free(pos);
    st_free(ntok);
    return rc;
}
