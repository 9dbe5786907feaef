/*
 * The one table that picks an algorithm from the operation, its size and
 * the topology in effect. The first row that matches wins; every rank of a
 * job computes the same choice from the same call (the thresholds come
 * from the job's configuration), so ranks always run the same algorithm.
 */
#include "core/select.h"

#include "coll/hier.h"
#include "engine/plan.h"
#include "mesh/mesh.h"
#include "ring/ring.h"
#include "transport/transport.h"

#include <string.h>

/* Where a row applies: the topology class of the communicator. */
enum {
    ON_RING = 1,   /* some pair of ranks has no direct wires, or the
                      topology asked for is "ring" */
    ON_DIRECT = 2, /* every pair is wired but the mesh is not in effect
                      (ranks of one host, topology "auto") */
    ON_MESH = 4,   /* the mesh topology is in effect and every pair wired */
};

/* Which sizes a row takes (all_reduce: count * elem * ranks, gathered). */
enum {
    ANY_SIZE,
    UPTO_BOX,          /* every rank on this host with a box (c->box), and
                          count * elem <= box_bytes and <= c->box */
    UPTO_BOX_INPUT,    /* the same with count * elem * ranks (a reduce_scatter's
                          whole input) */
    UPTO_SMALL,        /* <= small_all_reduce_bytes */
    UPTO_DOUBLING,     /* a power-of-two job, and count * elem (per rank,
                          not gathered) <= doubling_all_reduce_bytes */
    UPTO_MESH_SMALL,   /* <= mesh_small_all_reduce_bytes */
    UPTO_HALVING,      /* count * elem (per rank) <= halving_all_reduce_bytes
                          (power-of-two jobs) or halving_fold_all_reduce_bytes
                          (others); see size_fits */
    FROM_PULL,         /* every rank on this host and readable (c->pull),
                          count * elem (per rank) >= pull_all_reduce_bytes */
    FROM_PULL_GATHER,  /* the same ranks, count * elem (a rank's block) >=
                          pull_all_gather_bytes */
    FROM_PULL_SCATTER, /* ... (a rank's block) >= pull_reduce_scatter_bytes */
    FROM_PULL_BCAST,   /* ... (the buffer) >= pull_broadcast_bytes */
    FROM_HIER,         /* hosts with several ranks each (cfg->hier_local),
                          WEFT_HIER on, count * elem (per rank) >=
                          hier_all_reduce_bytes and count >= nranks */
    FROM_HIER_GATHER,  /* the same hosts, count * elem (a rank's block) >=
                          hier_all_gather_bytes */
    FROM_HIER_SCATTER, /* the same hosts, count * elem (a rank's block) >=
                          hier_reduce_scatter_bytes */
    FROM_HIER_BCAST,   /* the same hosts, count * elem >=
                          hier_broadcast_bytes */
};

static int ring_gather_reduce(weft__task *t)
{
    return weft__gather_reduce(t, weft__ring_all_gather);
}

static int mesh_gather_reduce(weft__task *t)
{
    return weft__gather_reduce(t, weft__mesh_all_gather);
}

static int ring_barrier(weft__task *t)
{
    return weft__barrier(t, weft__ring_all_gather);
}

static int mesh_barrier(weft__task *t)
{
    return weft__barrier(t, weft__mesh_all_gather);
}

static const struct algo_row {
    int kind;
    int on;
    int sizes;
    weft__algo_fn run;
} algos[] = {
    /* Large, where hosts run several ranks each: hierarchical (within
     * each host, across the hosts, within each host), whatever the
     * topology (it runs the mesh or the ring across the hosts). Small
     * all_reduce: gather every input and reduce locally, in one exchange
     * where every pair is wired (recursive doubling among one host's
     * ranks when their number is a power of two), else in n-1 ring steps.
     * Mid sizes among one host's ranks: recursive halving + doubling,
     * 2 log2(n) rounds where the ring has 2n-2 dependent steps. Large:
     * reduce-scatter + all-gather, direct or around the ring. */
    {WEFT__OP_ALL_REDUCE, ON_RING | ON_DIRECT | ON_MESH, UPTO_BOX,
     weft__box_all_reduce},
    {WEFT__OP_ALL_REDUCE, ON_RING | ON_DIRECT | ON_MESH, FROM_HIER,
     weft__hier_all_reduce},
    {WEFT__OP_ALL_REDUCE, ON_DIRECT | ON_MESH, FROM_PULL,
     weft__pull_all_reduce},
    {WEFT__OP_ALL_REDUCE, ON_MESH, UPTO_MESH_SMALL, mesh_gather_reduce},
    {WEFT__OP_ALL_REDUCE, ON_MESH, ANY_SIZE, weft__mesh_all_reduce},
    {WEFT__OP_ALL_REDUCE, ON_DIRECT, UPTO_DOUBLING, weft__doubling_all_reduce},
    {WEFT__OP_ALL_REDUCE, ON_DIRECT, UPTO_SMALL, mesh_gather_reduce},
    {WEFT__OP_ALL_REDUCE, ON_DIRECT, UPTO_HALVING, weft__halving_all_reduce},
    {WEFT__OP_ALL_REDUCE, ON_RING, UPTO_SMALL, ring_gather_reduce},
    {WEFT__OP_ALL_REDUCE, ON_RING | ON_DIRECT, ANY_SIZE, weft__ring_all_reduce},
    /* all_gather and reduce_scatter: small blocks of all_gather through
     * the box; hierarchical where hosts run several ranks each (across the
     * hosts, within each host; or the mirror), else one direct exchange or
     * around the ring. */
    {WEFT__OP_ALL_GATHER, ON_RING | ON_DIRECT | ON_MESH, UPTO_BOX,
     weft__box_all_gather},
    {WEFT__OP_ALL_GATHER, ON_RING | ON_DIRECT | ON_MESH, FROM_HIER_GATHER,
     weft__hier_all_gather},
    {WEFT__OP_ALL_GATHER, ON_DIRECT | ON_MESH, FROM_PULL_GATHER,
     weft__pull_all_gather},
    {WEFT__OP_ALL_GATHER, ON_MESH, ANY_SIZE, weft__mesh_all_gather},
    {WEFT__OP_ALL_GATHER, ON_RING | ON_DIRECT, ANY_SIZE, weft__ring_all_gather},
    {WEFT__OP_REDUCE_SCATTER, ON_RING | ON_DIRECT | ON_MESH, UPTO_BOX_INPUT,
     weft__box_reduce_scatter},
    {WEFT__OP_REDUCE_SCATTER, ON_RING | ON_DIRECT | ON_MESH, FROM_HIER_SCATTER,
     weft__hier_reduce_scatter},
    {WEFT__OP_REDUCE_SCATTER, ON_DIRECT | ON_MESH, FROM_PULL_SCATTER,
     weft__pull_reduce_scatter},
    {WEFT__OP_REDUCE_SCATTER, ON_MESH, ANY_SIZE, weft__mesh_reduce_scatter},
    {WEFT__OP_REDUCE_SCATTER, ON_RING | ON_DIRECT, ANY_SIZE,
     weft__ring_reduce_scatter},
    /* Broadcast: where hosts run several ranks each, large, the ring's
     * chain even where the mesh is in effect (each byte crosses each
     * cable once: a host's ranks are consecutive on the ring); else the
     * mesh's scatter + all-gather, or the ring's chain. */
    {WEFT__OP_BROADCAST, ON_RING | ON_DIRECT | ON_MESH, UPTO_BOX,
     weft__box_broadcast},
    {WEFT__OP_BROADCAST, ON_MESH, FROM_HIER_BCAST, weft__ring_broadcast},
    {WEFT__OP_BROADCAST, ON_DIRECT | ON_MESH, FROM_PULL_BCAST,
     weft__pull_broadcast},
    {WEFT__OP_BROADCAST, ON_MESH, ANY_SIZE, weft__mesh_broadcast},
    {WEFT__OP_BROADCAST, ON_RING | ON_DIRECT, ANY_SIZE, weft__ring_broadcast},
    {WEFT__OP_BARRIER, ON_RING | ON_DIRECT | ON_MESH, UPTO_BOX,
     weft__box_barrier},
    {WEFT__OP_BARRIER, ON_MESH | ON_DIRECT, ANY_SIZE, mesh_barrier},
    {WEFT__OP_BARRIER, ON_RING, ANY_SIZE, ring_barrier},
};

int weft__batchable(weft__algo_fn fn)
{
    /* Recursive doubling: each rank hears from every other through log2(n)
     * rounds, element by element in the same order. The one-exchange
     * gather: every rank hears every other directly and reduces in rank
     * order. (The ring's gather passes each rank's header to its neighbour
     * only.) */
    return fn == weft__doubling_all_reduce || fn == mesh_gather_reduce;
}

int weft__direct_ok(const weft__ctx *c)
{
    if (c->nranks > WEFT__MESH_MAX_RANKS ||
        strcmp(c->cfg->topology, "ring") == 0)
        return 0;
    for (int p = 0; p < c->nranks; p++)
        if (p != c->rank && c->tpo->nwires(c->tp, p) == 0)
            return 0;
    return 1;
}

int weft__topology(const weft__ctx *c)
{
    if (!weft__direct_ok(c))
        return ON_RING;
    return c->cfg->mesh ? ON_MESH : ON_DIRECT;
}

/* The one-copy reads (c->pull) from `from` bytes, 0 being off. */
static int pull_from(const weft__ctx *c, size_t bytes, size_t from)
{
    return c->pull && from != 0 && bytes >= from;
}

static int size_fits(const weft__ctx *c, int sizes, const weft__args *a)
{
    const size_t bytes = a->count * weft_dtype_size(a->dtype);
    const size_t gathered = bytes * (size_t)c->nranks;
    const int pow2 = (c->nranks & (c->nranks - 1)) == 0;

    switch (sizes) {
    case UPTO_BOX:
        return c->box != 0 && bytes <= c->cfg->box_bytes && bytes <= c->box;
    case UPTO_BOX_INPUT:
        return c->box != 0 && gathered <= c->cfg->box_bytes &&
               gathered <= c->box;
    case UPTO_SMALL:
        return gathered <= c->cfg->small_all_reduce_bytes;
    case UPTO_DOUBLING:
        /* Each of its log2(n) rounds moves the whole vector, so the size
         * where it stops paying is one of bytes per rank, not gathered. */
        return pow2 && bytes <= c->cfg->doubling_all_reduce_bytes;
    case UPTO_MESH_SMALL:
        return gathered <= c->cfg->mesh_small_all_reduce_bytes;
    case UPTO_HALVING:
        /* Fewer rounds than the ring has steps (from 4 ranks), and an
         * element per rank, so that every round that pairs two ranks
         * moves data and compares their calls. */
        return weft__plan_halving_rounds(c->nranks) < 2 * (c->nranks - 1) &&
               a->count >= (size_t)c->nranks &&
               bytes <= (pow2 ? c->cfg->halving_all_reduce_bytes
                              : c->cfg->halving_fold_all_reduce_bytes);
    case FROM_PULL:
        return pull_from(c, bytes, c->cfg->pull_all_reduce_bytes);
    case FROM_PULL_GATHER:
        return pull_from(c, bytes, c->cfg->pull_all_gather_bytes);
    case FROM_PULL_SCATTER:
        return pull_from(c, bytes, c->cfg->pull_reduce_scatter_bytes);
    case FROM_PULL_BCAST:
        return pull_from(c, bytes, c->cfg->pull_broadcast_bytes);
    case FROM_HIER:
        /* An element per rank: every chunk of every phase holds one, so
         * every pass moves data and compares the ranks' calls. */
        return c->cfg->hier && c->cfg->hier_local >= 2 &&
               bytes >= c->cfg->hier_all_reduce_bytes &&
               a->count >= (size_t)c->nranks;
    case FROM_HIER_GATHER:
        /* Every block holds an element (counts are > 0), so every pass
         * moves data with every peer it names and compares calls. */
        return c->cfg->hier && c->cfg->hier_local >= 2 &&
               bytes >= c->cfg->hier_all_gather_bytes;
    case FROM_HIER_SCATTER:
        return c->cfg->hier && c->cfg->hier_local >= 2 &&
               bytes >= c->cfg->hier_reduce_scatter_bytes;
    case FROM_HIER_BCAST:
        return c->cfg->hier && c->cfg->hier_local >= 2 &&
               bytes >= c->cfg->hier_broadcast_bytes;
    default:
        return 1;
    }
}

weft__algo_fn weft__select(const weft__ctx *c, int on, int kind,
                           const weft__args *a)
{
    for (size_t i = 0; i < sizeof algos / sizeof algos[0]; i++) {
        const struct algo_row *row = &algos[i];
        if (row->kind == kind && (row->on & on) && size_fits(c, row->sizes, a))
            return row->run;
    }
    return NULL;
}
