/*
 * hello_allreduce: the smallest complete weft program.
 *
 *   weftrun -n 4 -- ./hello_allreduce
 *
 * Every rank contributes x[i] = (rank + 1) * (i % 4); after the sum each rank
 * holds x[i] = (i % 4) * n(n+1)/2 (small integers, so the float sum is
 * exact). Rank 0 prints its first elements; every rank checks all of them.
 */
#include <stdio.h>
#include <stdlib.h>

#include <weft.h>

#define COUNT 1024

int main(void)
{
    weft_comm *comm = NULL;
    float *send = NULL, *recv = NULL;
    int wrong = 0, rc = 1;

    /* weftrun (or mpirun, Slurm, torchrun) sets the environment. */
    int err = weft_init(&comm);
    if (err != WEFT_OK) {
        /* With no communicator, the details are in weft_last_error(NULL). */
        fprintf(stderr, "weft_init: %s: %s\n", weft_strerror(err),
                weft_last_error(NULL));
        return 1;
    }
    int rank = weft_rank(comm), nranks = weft_size(comm);

    send = malloc(COUNT * sizeof *send);
    recv = malloc(COUNT * sizeof *recv);
    if (send == NULL || recv == NULL) {
        fprintf(stderr, "rank %d: out of memory\n", rank);
        goto out; /* the peers' next call fails with WEFT_EPEER */
    }
    for (int i = 0; i < COUNT; i++)
        send[i] = (float)((rank + 1) * (i % 4));

    /* Blocking; passing send as recv too would be the in-place form. */
    err = weft_all_reduce(comm, send, recv, COUNT, WEFT_FLOAT32, WEFT_SUM);
    if (err != WEFT_OK) {
        /* weft_last_error says which rank, peer and deadline. */
        fprintf(stderr, "rank %d: weft_all_reduce: %s: %s\n", rank,
                weft_strerror(err), weft_last_error(comm));
        goto out;
    }

    if (rank == 0)
        printf("%d ranks: x[0..4] = %g %g %g %g %g\n", nranks, recv[0],
               recv[1], recv[2], recv[3], recv[4]);
    for (int i = 0; i < COUNT; i++)
        wrong += recv[i] != (float)((i % 4) * (nranks * (nranks + 1) / 2));
    if (wrong > 0)
        fprintf(stderr, "rank %d: %d wrong elements\n", rank, wrong);
    rc = wrong > 0;

out:
    free(send);
    free(recv);
    weft_finalize(comm); /* always frees, even after a failure */
    return rc;
}
