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

#endif
