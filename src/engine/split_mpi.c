/* The layer split's transport over MPI (split.h), compiled only with
 * STRATA_MPI. Open MPI's defaults hold: errors are fatal, so a rank that
 * dies takes the job down (mpirun ends every rank) rather than leaving a
 * peer blocked in a receive; the supervisor of `strata serve --ranks` sees
 * its engine job end and answers 503 (docs/multi.md). */
#include <limits.h>
#include <mpi.h>

#include "core/log.h"
#include "engine/split.h"

static void mpi_send(split_net *net, int to, const float *x, size_t n) {
    (void)net;
    ST_ASSERT(n <= INT_MAX);
    MPI_Send(x, (int)n, MPI_FLOAT, to, 0, MPI_COMM_WORLD);
}

static void mpi_recv(split_net *net, int from, float *x, size_t n) {
    (void)net;
    ST_ASSERT(n <= INT_MAX);
    MPI_Recv(x, (int)n, MPI_FLOAT, from, 0, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
}

static void mpi_bcast(split_net *net, int32_t *v, size_t n) {
    (void)net;
    ST_ASSERT(n <= INT_MAX);
    MPI_Bcast(v, (int)n, MPI_INT32_T, 0, MPI_COMM_WORLD);
}

static void mpi_finish(void) { MPI_Finalize(); }

/* Declared here, not in split.h, so that the header needs no MPI. */
int split_net_mpi(int *argc, char ***argv, split_net *net);

int split_net_mpi(int *argc, char ***argv, split_net *net) {
    /* serialized: the server's engine process opens the engine on its loader thread and steps it
     * on its scheduler thread, one after the other */
    int got;
    if (MPI_Init_thread(argc, argv, MPI_THREAD_SERIALIZED, &got) != MPI_SUCCESS) return -1;
    if (got < MPI_THREAD_SERIALIZED)
        ST_WARN("this MPI gives thread support level %d of %d asked", got, MPI_THREAD_SERIALIZED);
    MPI_Comm_rank(MPI_COMM_WORLD, &net->rank);
    MPI_Comm_size(MPI_COMM_WORLD, &net->size);
    net->send = mpi_send;
    net->recv = mpi_recv;
    net->bcast = mpi_bcast;
    net->finish = mpi_finish;
    return 0;
}
