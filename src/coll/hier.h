/*
 * Hierarchical collectives, for jobs whose hosts run several ranks each
 * (topo.h, weft__hier_local): the ranks of a host work together over
 * their intra-host wires (shared memory, or loopback), and the cables
 * carry each byte once per host instead of once per rank. Signatures as
 * coll.h's weft__algo_fn; the selection table (core/select.c) runs them
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
 * others, so every rank ends with the same bits. Needs count >= nranks. */
int weft__hier_all_reduce(weft__task *t);

#endif
