/*
 * Ring algorithms, one file each: each rank talks to its two ring
 * neighbours only. Large operations run two lanes at once, one around the
 * ring each way, each on half of every block, so both directions of every
 * link carry load. A lane in the reverse direction is the forward
 * algorithm on "virtual" ranks v = (n - rank) % n, whose right neighbour
 * is the real left one. Chunks are whole elements (weft__plan_chunk).
 * Signatures as task.h's weft__algo_fn; arguments are already validated.
 */
#ifndef WEFT_RING_H
#define WEFT_RING_H

#include "engine/task.h"

int weft__ring_all_reduce(weft__task *t);
int weft__ring_all_gather(weft__task *t);
int weft__ring_reduce_scatter(weft__task *t);
int weft__ring_broadcast(weft__task *t);

/* The rooted collectives and the all-to-alls around the ring (ring/
 * reduce.c, gather.c, scatter.c, all_to_all.c):
 * - reduce: a pipelined chain that ends at the root, each rank reducing
 *   what its neighbour sent with its own input before it passes it on;
 *   two chains, one each way, on halves of the buffer, from
 *   cfg->bidir_min_bytes;
 * - gather and scatter: two chains from the root, one each way, each
 *   over the ranks on its side of the ring (the nearer half), so every
 *   block takes the shortest way and crosses each cable of it once, the
 *   farthest block first, pipelined;
 * - all_to_all and all_to_allv (once coll/all_to_allv.c has checked the
 *   counts): one pass of two lanes, one each way; each block goes the
 *   shorter way around and each rank between passes it on, so each byte
 *   crosses each cable of its shortest path once. */
int weft__ring_reduce(weft__task *t);
int weft__ring_gather(weft__task *t);
int weft__ring_scatter(weft__task *t);
int weft__ring_all_to_all(weft__task *t);
int weft__ring_all_to_allv(weft__task *t);

/* ---- shared by the ring's files (lanes.c) ---- */

/* One lane of a ring operation, as its steps are filled. */
typedef struct weft__ring_lane {
    int d;      /* direction: 0 sends right, 1 sends left */
    int v;      /* this rank's virtual rank in that direction */
    size_t m;   /* elements of each block this lane moves */
    size_t off; /* its first element in each block */
} weft__ring_lane;

/* Fills the steps st of one lane of t (whose peers are set; fill may
 * change them, as a broadcast does at the ends of its chain). */
typedef void (*weft__ring_fill_fn)(const weft__task *t,
                                   const weft__ring_lane *rl, weft__lane *lane,
                                   weft__step *st);

/* Builds a ring operation and starts it as t's pass: one lane, or two
 * (each way, each on half of the `count` elements of a block) from
 * cfg->bidir_min_bytes of `nbytes` on, with `nsteps` steps each, filled by
 * fill. */
int weft__ring_post(weft__task *t, size_t nbytes, int nsteps,
                    weft__ring_fill_fn fill);

/* This rank's place on one of the two chains of a rooted operation
 * (chains.c): side 0 holds the ranks root+1 .. root+len, side 1 root-1
 * .. root-len (the nearer half of the ring each way); q is the position
 * on it (the root: 0, on both). */
typedef struct weft__chain {
    int sgn; /* +1: side 0, -1: side 1 */
    int q;
    int len;
} weft__chain;

/* The real rank at position q of chain ch. */
int weft__chain_rank(const weft__task *t, const weft__chain *ch, int q);

/* Fills the steps of this rank's lane on chain ch: position q has
 * nsteps = len - q + 1 steps (the root len); bytes blocks; scratch holds
 * len - q blocks off the root. */
typedef void (*weft__chain_fill_fn)(const weft__task *t, const weft__chain *ch,
                                    weft__step *st, size_t bytes,
                                    char *scratch);

/* Builds and starts t's pass: a lane for each chain this rank is on (the
 * root: both, where they have ranks), data flowing toward the root
 * (inward: gather) or away from it, count elements a block. */
int weft__ring_chains_post(weft__task *t, int inward, weft__chain_fill_fn fill);

/* a mod n, in [0, n). */
int weft__ring_mod(int a, int n);
/* The real rank of virtual rank v in direction d. */
int weft__ring_real(int v, int n, int d);

#endif
