/*
 * The choice of algorithm (select.c), for the public entry points.
 */
#ifndef WEFT_SELECT_H
#define WEFT_SELECT_H

#include "coll/coll.h"

/* The topology in effect on c, for weft__select: computed once, when the
 * transport is up (its wires do not change afterwards). */
int weft__topology(const weft__ctx *c);

/* The algorithm that runs operation `kind` (WEFT__OP_*) with arguments a
 * on c, whose topology is topo (weft__topology): never NULL for the
 * collective kinds. */
weft__algo_fn weft__select(const weft__ctx *c, int topo, int kind,
                           const weft__args *a);

/* 1 when consecutive all_reduces that fn runs may be run as one over
 * their inputs laid end to end (core/request.c): fn's passes hear from
 * every rank, so the call's hint (engine.h) ends agreed, and fn reduces
 * each element in an order that does not depend on where the element
 * lies or how many there are, so the batch gives every operation the bits
 * it would get alone. */
int weft__batchable(weft__algo_fn fn);

/* 1 when every pair of ranks has direct wires, the job has at most
 * WEFT__MESH_MAX_RANKS ranks (one engine lane per peer) and the topology
 * asked for is not "ring". */
int weft__direct_ok(const weft__ctx *c);

#endif
