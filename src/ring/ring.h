/*
 * Ring algorithms. Each blocks until done or failed; arguments are already
 * validated by the caller, counts are > 0 and the job has >= 2 ranks.
 */
#ifndef WEFT_RING_H
#define WEFT_RING_H

#include "core/engine.h"

int weft__ring_all_reduce(weft__ctx *c, const void *sendbuf,
                          void *recvbuf, size_t count, weft_dtype dt,
                          weft_redop redop);
/* kind and name label the operation on the wire (barrier reuses it). */
int weft__ring_all_gather(weft__ctx *c, const void *sendbuf,
                          void *recvbuf, size_t count, weft_dtype dt,
                          int kind, const char *name);
int weft__ring_reduce_scatter(weft__ctx *c, const void *sendbuf,
                              void *recvbuf, size_t recvcount, weft_dtype dt,
                              weft_redop redop);
int weft__ring_broadcast(weft__ctx *c, void *buf, size_t count,
                         weft_dtype dt, int root);
int weft__ring_barrier(weft__ctx *c);

#endif
