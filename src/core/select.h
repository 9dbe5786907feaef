/*
 * The choice of algorithm (select.c), for the public entry points.
 */
#ifndef WEFT_SELECT_H
#define WEFT_SELECT_H

#include "coll/coll.h"

/* The algorithm that runs operation `kind` (WEFT__OP_*) with arguments a
 * on c: never NULL for the collective kinds. */
weft__algo_fn weft__select(const weft__ctx *c, int kind, const weft__args *a);

/* 1 when every pair of ranks has direct wires, the job has at most
 * WEFT__MESH_MAX_RANKS ranks (one engine lane per peer) and the topology
 * asked for is not "ring". */
int weft__direct_ok(const weft__ctx *c);

#endif
