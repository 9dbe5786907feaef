/*
 * The communicator: what the public entry points (comm.c) keep per
 * communicator besides what the engine and the algorithms see of it
 * (weft__ctx, engine.h). Only the core includes this.
 */
#ifndef WEFT_INTERNAL_H
#define WEFT_INTERNAL_H

#include "engine/engine.h"
#include "topo/topo.h"

struct weft__tp_params;

struct weft_comm {
    weft__config cfg;            /* from the environment and the hostfile */
    weft__ctx x;                 /* what the engine and the algorithms see */
    uint64_t coll_seq;           /* collectives started on this communicator */
    struct weft__tp_params *tpp; /* what the transport was created with */
};

#endif
