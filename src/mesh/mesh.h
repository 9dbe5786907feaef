/*
 * Mesh algorithms, for jobs where every pair of ranks has direct wires
 * (weft__direct_ok): each rank exchanges with every peer at once, one lane
 * per peer, each lane striped over all the wires to that peer. Arguments
 * are already validated by the caller.
 */
#ifndef WEFT_MESH_H
#define WEFT_MESH_H

#include "core/engine.h"

/* Large all_reduce: a direct reduce-scatter (rank p receives every peer's
 * chunk p and reduces the n contributions in rank order 0..n-1), then a
 * direct all-gather of the reduced chunks. Each chunk is reduced on one
 * rank only and copied to the others, so every rank ends with the same
 * bits. */
int weft__mesh_all_reduce(weft__ctx *c, const void *sendbuf,
                          void *recvbuf, size_t count, weft_dtype dt,
                          weft_redop redop);

/* One exchange: this rank's block to every peer, every peer's block into
 * recvbuf. kind and name label the operation on the wire and in
 * messages. */
int weft__mesh_all_gather(weft__ctx *c, const void *sendbuf,
                          void *recvbuf, size_t count, weft_dtype dt, int kind,
                          const char *name);

/* Block p of sendbuf to rank p, every peer's copy of this rank's block
 * reduced in rank order. */
int weft__mesh_reduce_scatter(weft__ctx *c, const void *sendbuf,
                              void *recvbuf, size_t recvcount, weft_dtype dt,
                              weft_redop redop);

/* Small: the root sends the buffer to every peer. Large: the root sends
 * chunk p to rank p, then the ranks all-gather the chunks, so the root's
 * links carry the buffer about once instead of n-1 times. */
int weft__mesh_broadcast(weft__ctx *c, void *buf, size_t count,
                         weft_dtype dt, int root);

#endif
