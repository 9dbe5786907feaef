/*
 * The wire planner: a pure function that splits a transfer over wires.
 *
 * A transfer of nbytes to one peer over nwires wires is cut into nwires
 * contiguous regions aligned to the element size. Region w holds
 * ceil(len_w / frame) frames; its last frame is clamped to the end of its
 * own region. Sender and receiver compute the same plan from the same
 * arguments, so both agree on every frame without telling each other.
 */
#ifndef WEFT_PLAN_H
#define WEFT_PLAN_H

#include <stddef.h>

typedef struct {
    size_t off; /* first byte of the region in the transfer */
    size_t len; /* bytes in the region (a multiple of the element size) */
} weft__region;

/* WEFT__MIN_WIRE_BYTES, the default of min_wire_bytes below, is in
 * topo.h with the other tunables. */

/* Number of wires a transfer of nbytes uses out of nwires (>= 1): one per
 * min_wire_bytes (> 0), at most nwires. */
int weft__plan_wires(size_t nbytes, int nwires, size_t min_wire_bytes);

/* Region of wire w (0 <= w < nwires) in a transfer of nbytes split over
 * nwires wires; nbytes is a multiple of elem_size. */
weft__region weft__plan_region(size_t nbytes, int nwires, size_t elem_size,
                               int w);

/* Frames in a region of len bytes: ceil(len / frame). */
size_t weft__plan_frames(size_t len, size_t frame);

/* Length of frame f of a region of len bytes: frame, or less for the last
 * frame, which is clamped to the region's own end. */
size_t weft__plan_frame_len(size_t len, size_t frame, size_t f);

/* Frames a side posts on a wire before the first completion:
 * min(depth, frames of that wire's own region). */
size_t weft__plan_prefill(size_t region_len, size_t frame, size_t depth);

/* How a collective cuts m elements into n chunks (units are elements here,
 * not bytes): chunk i holds m/n elements, one more for the first m%n, so
 * every rank computes the same cut. */
weft__region weft__plan_chunk(size_t m, int n, int i);

/* One round of the recursive halving + doubling all_reduce (Rabenseifner's;
 * coll/halving.c) as rank `rank` of nranks runs it on count elements.
 * Units are elements.
 *
 * The job's p ranks (p the largest power of two <= nranks) run a
 * reduce-scatter by recursive halving (log2(p) rounds: in each, a rank
 * keeps half of its window of chunks, sends the other half to the rank
 * whose window it is, and reduces what that rank sends of its own half),
 * after which rank v of them holds chunk v of the count elements (cut as
 * weft__plan_chunk cuts them) complete, then an all-gather by recursive
 * doubling (log2(p) rounds, each swapping windows twice as wide as the
 * last). Where nranks is not a power of two, r = nranks - p ranks first
 * fold into a partner: of ranks 0..2r-1, each even one sends its whole
 * input to the next odd one (round 0), which reduces it and takes part in
 * the rounds above for both, and the even one gets the whole result back
 * in the last round. Each chunk is reduced on one rank only and copied to
 * the others, so every rank ends with the same bits.
 *
 * A rank's round with no peer (an even folded rank in the middle rounds)
 * moves nothing. Both ends of a pair compute the same regions: what one
 * sends the other receives. */
typedef struct {
    int send_peer;     /* -1: sends nothing this round */
    int recv_peer;     /* -1: receives nothing this round */
    weft__region send; /* the elements it sends */
    weft__region recv; /* the elements it receives (disjoint from send) */
    int reduce;        /* 1: received elements are reduced with this
                          rank's own; 0: they land as they are */
    int from_input;    /* 1: this rank's own elements (those it sends and
                          reduces with) are still only in its input: its
                          first round that moves anything; 0: they are in
                          its result buffer */
} weft__halving_round;

/* The rounds every rank of an nranks (>= 2) job runs: 2 log2(p), and 2
 * more (the fold and the return) where nranks is not a power of two. */
int weft__plan_halving_rounds(int nranks);

/* Round `round` (0 <= round < weft__plan_halving_rounds(nranks)) of rank
 * `rank` on count elements. */
weft__halving_round weft__plan_halving(size_t count, int nranks, int rank,
                                       int round);

#endif
