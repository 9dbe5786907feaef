/*
 * What the ring and the mesh algorithms share: the one signature of every
 * algorithm (the selection table, core/select.c, picks among them), and
 * the algorithms built on either family's all-gather: the small all_reduce
 * (gather every input, reduce locally), recursive doubling, the barrier.
 * Each call blocks until done or failed; arguments are already validated,
 * counts are > 0 and the job has >= 2 ranks.
 */
#ifndef WEFT_COLL_H
#define WEFT_COLL_H

#include "engine/engine.h"

/* A call's arguments, as the public entry point took them. */
typedef struct weft__args {
    const void *sendbuf;
    void *recvbuf; /* broadcast: the buffer */
    size_t count;  /* reduce_scatter: the count each rank receives */
    weft_dtype dtype;
    weft_redop op;
    int root;
} weft__args;

typedef int (*weft__algo_fn)(weft__ctx *c, const weft__args *a);

/* All_reduce of inputs gathered with `gather` (an all_gather algorithm)
 * into scratch and reduced in rank order 0..n-1 on every rank, so that
 * every rank ends with the same bits: n-1 ring steps, or one exchange,
 * instead of reduce-scatter + all-gather, for small counts. */
int weft__gather_reduce(weft__ctx *c, const weft__args *a,
                        weft__algo_fn gather);

/* Recursive doubling for a power-of-two job: in round k each rank swaps
 * its partial result with rank ^ 2^k, and both compute lower OP upper. */
int weft__doubling_all_reduce(weft__ctx *c, const weft__args *a);

/* A barrier: an all_gather (with `gather`) of one byte per rank, so no
 * rank leaves before it has heard from every other. */
int weft__barrier(weft__ctx *c, weft__algo_fn gather);

#endif
