/*
 * Hierarchical collectives, for jobs whose hosts run several ranks each
 * (topo.h, weft__hier_local): the ranks of a host work together over
 * their intra-host wires (shared memory, or loopback), and the cables
 * carry each byte once per host instead of once per rank. Signatures as
 * task.h's weft__algo_fn; the selection table (core/tune.c) runs them
 * only where cfg->hier_local is L >= 2.
 */
#ifndef WEFT_HIER_H
#define WEFT_HIER_H

#include "coll/coll.h"

/* All_reduce in three phases of one call, with L ranks on each of H
 * hosts, local rank i = rank % L on host h = rank / L:
 * 1. within the host, a direct reduce-scatter: local rank i ends with
 *    chunk i (weft__plan_chunk of count over L) reduced over the host's
 *    ranks in local-rank order;
 * 2. across the hosts, the H ranks of local index i all_reduce chunk i in
 *    place (the mesh's all_reduce where the mesh is in effect, else the
 *    ring's, around the hosts), the L groups at once on the cables;
 * 3. within the host, a direct all-gather of the L chunks.
 * Each element is reduced on one rank in each phase and copied to the
 * others, so every rank ends with the same bits. Needs count >= nranks.
 * From cfg->hier_pull_all_reduce_bytes, where this rank can read its
 * host's ranks (c->pull_host), phases 1 and 3 are one-copy reads
 * (coll/pull.c, weft__pull_share_*) with the same chunks. */
int weft__hier_all_reduce(weft__task *t);

/* All_gather (block r of recvbuf is rank r's) in three phases:
 * 1. within the host, a direct all_gather of the host's L blocks;
 * 2. across the hosts, the H ranks of local index i all_gather their
 *    blocks (the mesh's or the ring's, as above), into scratch;
 * 3. within the host, every rank sends the H-1 blocks of the other hosts
 *    it got to every other rank of the host, and theirs land at their
 *    places in recvbuf (one direct exchange, a step a host).
 * Each block crosses the cables once per host. From
 * cfg->hier_pull_all_gather_bytes (a block), where this rank can read its
 * host's ranks, phase 1 publishes recvbuf (this rank's block in place)
 * to the host, and phase 3 is a barrier within the host and one-copy
 * reads of the other host ranks' columns from their recvbufs. */
int weft__hier_all_gather(weft__task *t);

/* Reduce_scatter (rank r gets block r, reduced), the mirror:
 * 1. within the host, a direct exchange: local rank i receives every
 *    host rank's copy of block h*L + i of every host h and reduces them
 *    in local-rank order;
 * 2. across the hosts, the H ranks of local index i reduce_scatter those
 *    H reduced blocks (the mesh's or the ring's), rank h*L + i ending
 *    with block h*L + i.
 * Each element of the result is reduced on one rank. From
 * cfg->hier_pull_reduce_scatter_bytes (a block), where this rank can read
 * its host's ranks, phase 1 is one-copy reads of its column of every host
 * rank's sendbuf, and a barrier within the host ends the call. */
int weft__hier_reduce_scatter(weft__task *t);

#endif
