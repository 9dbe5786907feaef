/*
 * Mesh algorithms, one file each, for jobs where every pair of ranks has
 * direct wires: each rank exchanges with every peer at once, one lane per
 * peer, each lane striped over all the wires to that peer. Signatures as
 * task.h's weft__algo_fn; arguments are already validated.
 */
#ifndef WEFT_MESH_H
#define WEFT_MESH_H

#include "engine/task.h"

/* Large all_reduce: a direct reduce-scatter (rank p receives every peer's
 * chunk p and reduces the n contributions in rank order 0..n-1), then a
 * direct all-gather of the reduced chunks. Each chunk is reduced on one
 * rank only and copied to the others, so every rank ends with the same
 * bits. */
int weft__mesh_all_reduce(weft__task *t);

/* The parts of the large all_reduce, for the hierarchical one (which runs
 * another all_reduce of this member's chunk between the second and the
 * third): chunks_scatter starts the pass that sends chunk p
 * (weft__plan_chunk of count over the members) of sendbuf to member p and
 * lands every peer's copy of this member's chunk in scratch;
 * chunks_reduce, once it completed, reduces them in member order into
 * this member's chunk of recvbuf; chunks_gather starts the pass that
 * sends that chunk to every peer while theirs land in recvbuf. */
int weft__mesh_chunks_scatter(weft__task *t);
void weft__mesh_chunks_reduce(weft__task *t);
int weft__mesh_chunks_gather(weft__task *t);

/* One exchange: this rank's block to every peer, every peer's block into
 * recvbuf. */
int weft__mesh_all_gather(weft__task *t);

/* Block p of sendbuf to rank p, every peer's copy of this rank's block
 * reduced in rank order. */
int weft__mesh_reduce_scatter(weft__task *t);

/* Small: the root sends the buffer to every peer. Large: the root sends
 * chunk p to rank p, then the ranks all-gather the chunks, so the root's
 * links carry the buffer about once instead of n-1 times. */
int weft__mesh_broadcast(weft__task *t);

/* The rooted collectives and the all-to-alls, every pair at once (mesh/
 * reduce.c, gather.c, scatter.c, all_to_all.c):
 * - reduce: the direct reduce-scatter above (member p reduces chunk p of
 *   every input in rank order), then each chunk to the root;
 * - gather: every rank's block to the root, all lanes in flight at once;
 * - scatter: block p from the root to rank p, all at once;
 * - all_to_all, all_to_allv (once coll/all_to_allv.c has checked the
 *   counts): one exchange, a lane per peer. */
int weft__mesh_reduce(weft__task *t);
int weft__mesh_gather(weft__task *t);
int weft__mesh_scatter(weft__task *t);
int weft__mesh_all_to_all(weft__task *t);
int weft__mesh_all_to_allv(weft__task *t);

/* ---- shared by the mesh's files (exchange.c) ---- */

/* What this rank sends to and receives from one peer in an exchange. A
 * half with no bytes is left out; both ends of a pair compute the same
 * lengths, so they agree on which halves exist. */
typedef struct weft__peer_io {
    const char *send;
    size_t send_len;
    char *recv;
    size_t recv_len;
} weft__peer_io;

/* Starts t's pass: one lane per peer that has something to send or
 * receive (io has nranks entries; this rank's own is ignored), comparing
 * the call with every peer. */
int weft__mesh_exchange(weft__task *t, const weft__peer_io *io);

/* Step s (0 <= s < nsteps) of what this rank exchanges with member p. */
typedef void (*weft__mesh_step_fn)(const weft__task *t, const void *arg, int p,
                                   int s, weft__peer_io *io);

/* The same with nsteps steps with each peer, as step() gives them (every
 * step of both ends' lanes the same lengths, as above; a peer with no bytes
 * either way in any step is left out): blocks that are not contiguous in
 * the buffers (the hierarchical all_gather's and reduce_scatter's phases
 * within a host) move in one pass. */
int weft__mesh_exchange_steps(weft__task *t, int nsteps,
                              weft__mesh_step_fn step, const void *arg);

#endif
