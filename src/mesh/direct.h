/*
 * Direct algorithms, for ranks joined pairwise: point to point, and the
 * small operations where one exchange with every peer beats n-1 ring steps.
 * Arguments are already validated by the caller.
 */
#ifndef WEFT_DIRECT_H
#define WEFT_DIRECT_H

#include "core/engine.h"

/* Point to point over direct wires: sends count elements of sendbuf to
 * dst and at the same time receives count elements from src into recvbuf;
 * dst or src -1 leaves that half out (a plain send or recv). name labels
 * the operation in messages. */
int weft__sendrecv(weft__ctx *c, const char *name, const void *sendbuf,
                   int dst, void *recvbuf, int src, size_t count, weft_dtype dt);

/* 1 when small operations may exchange directly: every pair of ranks has
 * direct wires, the job is small enough for one lane per peer (at most
 * WEFT__MESH_MAX_RANKS ranks), and the topology is not "ring". */
int weft__direct_ok(const weft__ctx *c);

/* 1 when the topology in effect is the mesh (weft__hostfile_mesh) and
 * weft__direct_ok holds: then large operations use the mesh algorithms
 * too, else the ring ones. */
int weft__mesh_ok(const weft__ctx *c);

/* Small all_reduce: one exchange of every rank's input with every peer and
 * a local reduction in rank order 0..n-1; where the mesh is not in effect
 * (one host's ranks, say) and the job size is a power of two, recursive
 * doubling instead. Both give bitwise identical results on every rank. */
int weft__direct_all_reduce(weft__ctx *c, const void *sendbuf,
                            void *recvbuf, size_t count, weft_dtype dt,
                            weft_redop redop);

/* A barrier by one exchange of a byte with every peer. */
int weft__direct_barrier(weft__ctx *c);

#endif
