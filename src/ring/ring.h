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

/* a mod n, in [0, n). */
int weft__ring_mod(int a, int n);
/* The real rank of virtual rank v in direction d. */
int weft__ring_real(int v, int n, int d);

#endif
