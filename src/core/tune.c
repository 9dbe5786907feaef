/* The tuning table; see tune.h. */
#include "core/tune.h"

#include "coll/hier.h"
#include "engine/plan.h"
#include "mesh/mesh.h"
#include "ring/ring.h"
#include "transport/transport.h"

#include <ctype.h>
#include <limits.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define NOLIMIT SIZE_MAX

static const char *const algo_names[WEFT__ALGO_COUNT] = {
    [WEFT__ALGO_BOX] = "box",           [WEFT__ALGO_HIER] = "hier",
    [WEFT__ALGO_PULL] = "pull",         [WEFT__ALGO_GATHER] = "gather",
    [WEFT__ALGO_DOUBLING] = "doubling", [WEFT__ALGO_HALVING] = "halving",
    [WEFT__ALGO_MESH] = "mesh",         [WEFT__ALGO_RING] = "ring",
};

/* The operations the table covers, in the order it prints them. */
static const struct {
    int op;
    const char *name;
} ops[] = {
    {WEFT__OP_ALL_REDUCE, "all_reduce"},
    {WEFT__OP_ALL_GATHER, "all_gather"},
    {WEFT__OP_REDUCE_SCATTER, "reduce_scatter"},
    {WEFT__OP_BROADCAST, "broadcast"},
    {WEFT__OP_BARRIER, "barrier"},
    {WEFT__OP_REDUCE, "reduce"},
    {WEFT__OP_GATHER, "gather"},
    {WEFT__OP_SCATTER, "scatter"},
    {WEFT__OP_ALL_TO_ALL, "all_to_all"},
    {WEFT__OP_ALL_TO_ALLV, "all_to_allv"},
};
#define NOPS (sizeof ops / sizeof ops[0])

const char *weft__algo_name(int a)
{
    return a > 0 && a < WEFT__ALGO_COUNT ? algo_names[a] : "?";
}

/* ---- the topology class ---- */

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
        return WEFT__ON_RING;
    return c->cfg->mesh ? WEFT__ON_MESH : WEFT__ON_DIRECT;
}

/* ---- what each algorithm can run ---- */

static int pow2(int n)
{
    return (n & (n - 1)) == 0;
}

/* Whether algorithm a implements operation op at all. */
static int implements(int a, int op)
{
    /* The rooted collectives and the all-to-alls: the mesh's and the
     * ring's, and the small reduce's gather to the root. */
    if (op >= WEFT__OP_REDUCE)
        return a == WEFT__ALGO_MESH || a == WEFT__ALGO_RING ||
               (a == WEFT__ALGO_GATHER && op == WEFT__OP_REDUCE);
    switch (a) {
    case WEFT__ALGO_BOX:
    case WEFT__ALGO_MESH:
    case WEFT__ALGO_RING:
        return 1;
    case WEFT__ALGO_HIER:
        return op != WEFT__OP_BARRIER && op != WEFT__OP_BROADCAST;
    case WEFT__ALGO_PULL:
        return op != WEFT__OP_BARRIER;
    default: /* gather, doubling, halving */
        return op == WEFT__OP_ALL_REDUCE;
    }
}

/* Why algorithm a cannot run on a job like this (env, cfg), or NULL
 * where it can (for some calls at least). */
static const char *cannot(int a, const weft__config *cfg,
                          const weft__tune_env *env)
{
    const int n = cfg->nranks;

    switch (a) {
    case WEFT__ALGO_BOX:
        return env->box == 0 ? "it needs every rank on one host, over "
                               "shared memory"
                             : NULL;
    case WEFT__ALGO_HIER:
        return cfg->hier_local < 2
                   ? "it needs several hosts of as many ranks each, joined "
                     "in a ring, over TCP"
                   : NULL;
    case WEFT__ALGO_PULL:
        return !env->pull ? "it needs every rank on one host, each able "
                            "to read the others' memory"
                          : NULL;
    case WEFT__ALGO_DOUBLING:
        if (env->on == WEFT__ON_RING)
            return "it needs direct wires between every pair of ranks";
        return !pow2(n) ? "it needs a power-of-two number of ranks" : NULL;
    case WEFT__ALGO_HALVING:
        if (env->on == WEFT__ON_RING)
            return "it needs direct wires between every pair of ranks";
        return weft__plan_halving_rounds(n) >= 2 * (n - 1)
                   ? "it takes as many rounds as the ring below 4 ranks"
                   : NULL;
    case WEFT__ALGO_MESH:
        return env->on == WEFT__ON_RING
                   ? "it needs direct wires between every pair of ranks "
                     "(and at most 17 ranks)"
                   : NULL;
    default:
        return NULL;
    }
}

/* Whether algorithm a can run this call (what its rows' ranges do not
 * say: the box's room, an element per rank where the algorithm needs
 * one). */
static int can_run(int a, const weft__ctx *c, int on, int kind,
                   const weft__args *a_)
{
    const size_t bytes = a_->count * weft_dtype_size(a_->dtype);
    const size_t n = (size_t)c->nranks;

    switch (a) {
    case WEFT__ALGO_BOX:
        return c->box != 0 &&
               (kind == WEFT__OP_REDUCE_SCATTER ? bytes * n : bytes) <= c->box;
    case WEFT__ALGO_HIER:
        /* An element per rank: every chunk of every phase holds one, so
         * every pass moves data and compares the ranks' calls. */
        return c->cfg->hier_local >= 2 &&
               (kind != WEFT__OP_ALL_REDUCE || a_->count >= n);
    case WEFT__ALGO_PULL:
        return c->pull && on != WEFT__ON_RING;
    case WEFT__ALGO_DOUBLING:
        return on != WEFT__ON_RING && pow2(c->nranks);
    case WEFT__ALGO_HALVING:
        /* Fewer rounds than the ring has steps (from 4 ranks), and an
         * element per rank, so that every round that pairs two ranks
         * moves data and compares their calls. */
        return on != WEFT__ON_RING &&
               weft__plan_halving_rounds(c->nranks) < 2 * (c->nranks - 1) &&
               a_->count >= n;
    case WEFT__ALGO_MESH:
        return on != WEFT__ON_RING;
    default:
        return 1;
    }
}

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

static int ring_gather_reduce_root(weft__task *t)
{
    return weft__gather_reduce_root(t, weft__ring_gather);
}

static int mesh_gather_reduce_root(weft__task *t)
{
    return weft__gather_reduce_root(t, weft__mesh_gather);
}

/* The function that runs operation kind by algorithm a. */
static weft__algo_fn algo_fn(int a, int kind, int on)
{
    static const weft__algo_fn box[] = {
        [WEFT__OP_ALL_REDUCE] = weft__box_all_reduce,
        [WEFT__OP_ALL_GATHER] = weft__box_all_gather,
        [WEFT__OP_REDUCE_SCATTER] = weft__box_reduce_scatter,
        [WEFT__OP_BROADCAST] = weft__box_broadcast,
        [WEFT__OP_BARRIER] = weft__box_barrier};
    static const weft__algo_fn hier[] = {
        [WEFT__OP_ALL_REDUCE] = weft__hier_all_reduce,
        [WEFT__OP_ALL_GATHER] = weft__hier_all_gather,
        [WEFT__OP_REDUCE_SCATTER] = weft__hier_reduce_scatter};
    static const weft__algo_fn pull[] = {
        [WEFT__OP_ALL_REDUCE] = weft__pull_all_reduce,
        [WEFT__OP_ALL_GATHER] = weft__pull_all_gather,
        [WEFT__OP_REDUCE_SCATTER] = weft__pull_reduce_scatter,
        [WEFT__OP_BROADCAST] = weft__pull_broadcast};
    static const weft__algo_fn mesh[] = {
        [WEFT__OP_ALL_REDUCE] = weft__mesh_all_reduce,
        [WEFT__OP_ALL_GATHER] = weft__mesh_all_gather,
        [WEFT__OP_REDUCE_SCATTER] = weft__mesh_reduce_scatter,
        [WEFT__OP_BROADCAST] = weft__mesh_broadcast,
        [WEFT__OP_BARRIER] = mesh_barrier,
        [WEFT__OP_REDUCE] = weft__mesh_reduce,
        [WEFT__OP_GATHER] = weft__mesh_gather,
        [WEFT__OP_SCATTER] = weft__mesh_scatter,
        [WEFT__OP_ALL_TO_ALL] = weft__mesh_all_to_all,
        [WEFT__OP_ALL_TO_ALLV] = weft__mesh_all_to_allv};
    static const weft__algo_fn ring[] = {
        [WEFT__OP_ALL_REDUCE] = weft__ring_all_reduce,
        [WEFT__OP_ALL_GATHER] = weft__ring_all_gather,
        [WEFT__OP_REDUCE_SCATTER] = weft__ring_reduce_scatter,
        [WEFT__OP_BROADCAST] = weft__ring_broadcast,
        [WEFT__OP_BARRIER] = ring_barrier,
        [WEFT__OP_REDUCE] = weft__ring_reduce,
        [WEFT__OP_GATHER] = weft__ring_gather,
        [WEFT__OP_SCATTER] = weft__ring_scatter,
        [WEFT__OP_ALL_TO_ALL] = weft__ring_all_to_all,
        [WEFT__OP_ALL_TO_ALLV] = weft__ring_all_to_allv};

    if (kind < WEFT__OP_ALL_REDUCE || kind >= WEFT__OP_COUNT ||
        kind == WEFT__OP_P2P || !implements(a, kind))
        return NULL;
    switch (a) {
    case WEFT__ALGO_BOX:
        return box[kind];
    case WEFT__ALGO_HIER:
        return hier[kind];
    case WEFT__ALGO_PULL:
        return pull[kind];
    case WEFT__ALGO_GATHER:
        if (kind == WEFT__OP_REDUCE)
            return on == WEFT__ON_RING ? ring_gather_reduce_root
                                       : mesh_gather_reduce_root;
        return on == WEFT__ON_RING ? ring_gather_reduce : mesh_gather_reduce;
    case WEFT__ALGO_DOUBLING:
        return weft__doubling_all_reduce;
    case WEFT__ALGO_HALVING:
        return weft__halving_all_reduce;
    case WEFT__ALGO_MESH:
        return mesh[kind];
    default:
        return ring[kind];
    }
}

/* The algorithm past every row: the topology's own. */
static int base_algo(int kind, int on)
{
    if (kind == WEFT__OP_BARRIER)
        return on == WEFT__ON_RING ? WEFT__ALGO_RING : WEFT__ALGO_MESH;
    return on == WEFT__ON_MESH ? WEFT__ALGO_MESH : WEFT__ALGO_RING;
}

/* ---- the defaults ---- */

/* The all_reduce by one-copy reads (coll/pull.c; WEFT_ALGO's "pull"), by
 * default from PULL_ALL_REDUCE_BYTES per rank (count * size; WEFT_ALGO
 * overrides it): where every rank is on this host and each
 * can read the others' memory, each rank reads its share of every peer's
 * input and reduces it, then reads every other share from its owner,
 * with WEFT_PULL_THREADS threads. Unset, the threads are the host's cores
 * per rank on it (at most PULL_MAX_THREADS, and at most the cores this
 * process may run on), and the algorithm is off below 2 cores per rank,
 * where one thread loses to the ring (16-core host, 8 and 16 ranks:
 * 2.2-3.2 GB/s against 2.5-4.5). From 4 MiB it beats the ring at 2, 4
 * and 8 ranks of the 16-core host (at 1 MiB they are even); see
 * docs/performance.md. */
#define WEFT__PULL_ALL_REDUCE_BYTES (4 * 1024 * 1024)
/* The same reads for all_gather (a rank's block), reduce_scatter (a
 * rank's block) and broadcast (the buffer), by default from these sizes
 * (WEFT_ALGO overrides them). On the
 * 16-core host (2, 4, 8 ranks; docs/performance.md) the all_gather led
 * the frames from blocks of 4-8 MiB (below, frames were as fast or
 * faster: their one-copy reads move the same bytes), the reduce_scatter
 * from blocks of 1 MiB (its reductions gain from the threads), the
 * broadcast at 64 MiB but not always at 16 (every rank reads the root's
 * buffer at once; the frames' chain was faster below at 4 and 8 ranks):
 * from 32 MiB. */
#define WEFT__PULL_ALL_GATHER_BYTES (4 * 1024 * 1024)
#define WEFT__PULL_REDUCE_SCATTER_BYTES (1024 * 1024)
#define WEFT__PULL_BROADCAST_BYTES (32 * 1024 * 1024)
/* Default thresholds between algorithms, measured with bench/thresholds:
 * where the default rows switch (WEFT_ALGO overrides them).
 * - Up to SMALL_ALL_REDUCE_BYTES gathered (count * size * nranks),
 *   all_reduce gathers every input and reduces locally in rank order: one
 *   exchange with every peer where all are directly connected, else n-1
 *   ring steps, instead of the 2n-2 steps of reduce-scatter + all-gather.
 * - Under the mesh, MESH_SMALL_ALL_REDUCE_BYTES (topo.h) plays that part.
 * - Among ranks that are all wired to each other without the mesh (one
 *   host's ranks, topology auto), SMALL_ALL_REDUCE_BYTES applies where n
 *   is not a power of two; where it is, recursive doubling (log2(n)
 *   rounds, each moving the whole vector) runs up to
 *   DOUBLING_ALL_REDUCE_BYTES per rank (count * size, not gathered:
 *   measured at 32 KiB per rank at 2, 4 and 8 ranks alike).
 * - Past those, up to HALVING_ALL_REDUCE_BYTES per rank where n is a
 *   power of two, HALVING_FOLD_ALL_REDUCE_BYTES where not (the fold sends
 *   the whole vector to a neighbour and back, which costs at large
 *   sizes), the same ranks run recursive halving + doubling (2 log2(n)
 *   rounds, +2 where n is not a power of two) instead of the ring's 2n-2
 *   steps, from 4 ranks on. See docs/performance.md, "The mid-size
 *   cliff". */
#define WEFT__SMALL_ALL_REDUCE_BYTES (32 * 1024)
#define WEFT__DOUBLING_ALL_REDUCE_BYTES (32 * 1024)
/* From this many ranks, all of one host and through shared memory,
 * doubling's log2(n) rounds of the whole vector lose to halving earlier:
 * at 16 ranks on the 16-core host, 16 KiB per rank took 35-51 us by
 * doubling and 26-29 by halving, 32 KiB 55-62 against 36-40, and the two
 * tie at 4-8 KiB (docs/performance.md, "Recursive doubling"). */
#define WEFT__DOUBLING_WIDE_RANKS 16
#define WEFT__DOUBLING_WIDE_ALL_REDUCE_BYTES (4 * 1024)
/* Below that many ranks, all of one host and through shared memory, the
 * switch is at 16 KiB: on the 16-core host (3 alternating rounds of 400
 * calls, 61ba9cf) 32 KiB per rank took 29.7-33.0 us by doubling and
 * 23.6-25.5 by halving at 8 ranks, 18.9 against 17.1-17.3 at 4; at 16 KiB
 * the two were within 10% (docs/performance.md, "Recursive doubling"). */
#define WEFT__DOUBLING_SHM_ALL_REDUCE_BYTES (16 * 1024)
#define WEFT__HALVING_ALL_REDUCE_BYTES (128 * 1024)
/* The same where every rank of the job is on one host: there the ring's
 * 2n-2 steps lose to halving's 2 log2(n) rounds up to several MiB through
 * shared memory and up to 1 MiB over loopback TCP (16-core host, 8 ranks,
 * 512 KiB: 0.5-1.0 GB/s busbw by the ring, 2.7-4.5 by halving through
 * shared memory, 1.5-2.0 over TCP; docs/performance.md, "Recursive
 * halving + doubling: the mid-size cliff"). */
#define WEFT__HALVING_SHM_ALL_REDUCE_BYTES (8 * 1024 * 1024)
#define WEFT__HALVING_LOOPBACK_ALL_REDUCE_BYTES (1024 * 1024)
#define WEFT__HALVING_FOLD_ALL_REDUCE_BYTES (64 * 1024)
/* Where hosts run several ranks each (weft__hier_local), all_reduce from
 * HIER_ALL_REDUCE_BYTES per rank (count * size) runs hierarchically:
 * a reduce-scatter among each host's ranks, an all_reduce of each chunk
 * among the ranks that hold it (one per host) over the cables, and an
 * all-gather within each host, so each byte crosses a cable once per host
 * instead of once per rank. The default; WEFT_ALGO overrides it (rows
 * without "hier" keep the flat algorithms at every size). */
#define WEFT__HIER_ALL_REDUCE_BYTES (64 * 1024)
/* (The defaults: where the hierarchical path wins on 2 hosts x 2 ranks
 * and a cable shaped to 5 Gbit/s, docs/performance.md.) The same hosts:
 * all_gather and reduce_scatter from this many bytes per
 * rank's block (count * size) run hierarchically, all_gather across the
 * hosts then within each host, reduce_scatter the mirror (coll/hier.h).
 * The defaults; WEFT_ALGO overrides them. */
#define WEFT__HIER_ALL_GATHER_BYTES (256 * 1024)
#define WEFT__HIER_REDUCE_SCATTER_BYTES (256 * 1024)
/* The same hosts with the mesh in effect: broadcast of this many bytes
 * (count * size) and more runs the ring's chain instead of the mesh's
 * scatter + all-gather. A host's ranks are consecutive on the ring, so
 * each byte crosses each cable once, where the mesh's all-gather sends
 * every rank's chunk to every rank of every other host (L times). The
 * default; WEFT_ALGO overrides it. */
#define WEFT__HIER_BROADCAST_BYTES (64 * 1024)

static void add(weft__tune *t, int op, size_t lo, size_t hi, int algo)
{
    if (t->nrows < WEFT__TUNE_MAX_ROWS && lo <= hi)
        t->rows[t->nrows++] = (weft__tune_row){op, lo, hi, algo};
}

/* The rows of the measured thresholds above for cfg's job and env, in
 * the order they are tried. */
static void defaults(weft__tune *t, const weft__config *cfg,
                     const weft__tune_env *env)
{
    const int on = env->on, n = cfg->nranks;
    const size_t nr = (size_t)n;
    const int hier = cfg->hier_local >= 2;
    const int pull = env->pull && on != WEFT__ON_RING;
    /* Every peer of this job is a rank of this host: halving's fewer,
     * larger rounds beat the ring up to several MiB through shared memory
     * and up to 1 MiB over loopback TCP. Across hosts the defaults stay
     * the ones measured over cables. */
    const int one_host = cfg->nhosts == 1 && strcmp(cfg->transport, "tcp") == 0;
    const size_t halving = one_host && cfg->shm
                               ? WEFT__HALVING_SHM_ALL_REDUCE_BYTES
                           : one_host ? WEFT__HALVING_LOOPBACK_ALL_REDUCE_BYTES
                                      : WEFT__HALVING_ALL_REDUCE_BYTES;
    const size_t doubling =
        one_host && cfg->shm && n >= WEFT__DOUBLING_WIDE_RANKS
            ? WEFT__DOUBLING_WIDE_ALL_REDUCE_BYTES
        : one_host && cfg->shm ? WEFT__DOUBLING_SHM_ALL_REDUCE_BYTES
                               : WEFT__DOUBLING_ALL_REDUCE_BYTES;
    /* Bytes per rank whose gathered size (times n) is within x. */
#define PER_RANK(x) ((x) / nr)

    /* all_reduce: the box; hierarchical where hosts run several ranks
     * each; one-copy reads among one host's ranks; small: every input
     * gathered and reduced locally (one exchange where every pair is
     * wired, recursive doubling among a power of two of one host's
     * ranks), mid sizes there recursive halving + doubling, else the
     * mesh's or the ring's reduce-scatter + all-gather. */
    if (env->box != 0)
        add(t, WEFT__OP_ALL_REDUCE, 0, cfg->box_bytes, WEFT__ALGO_BOX);
    if (hier)
        add(t, WEFT__OP_ALL_REDUCE, WEFT__HIER_ALL_REDUCE_BYTES, NOLIMIT,
            WEFT__ALGO_HIER);
    if (pull && WEFT__PULL_ALL_REDUCE_BYTES != 0)
        add(t, WEFT__OP_ALL_REDUCE, WEFT__PULL_ALL_REDUCE_BYTES, NOLIMIT,
            WEFT__ALGO_PULL);
    if (on == WEFT__ON_MESH)
        add(t, WEFT__OP_ALL_REDUCE, 0,
            PER_RANK(WEFT__MESH_SMALL_ALL_REDUCE_BYTES), WEFT__ALGO_GATHER);
    if (on == WEFT__ON_DIRECT) {
        if (pow2(n))
            add(t, WEFT__OP_ALL_REDUCE, 0, doubling, WEFT__ALGO_DOUBLING);
        add(t, WEFT__OP_ALL_REDUCE, 0, PER_RANK(WEFT__SMALL_ALL_REDUCE_BYTES),
            WEFT__ALGO_GATHER);
        if (cannot(WEFT__ALGO_HALVING, cfg, env) == NULL)
            add(t, WEFT__OP_ALL_REDUCE, 0,
                pow2(n) ? halving : WEFT__HALVING_FOLD_ALL_REDUCE_BYTES,
                WEFT__ALGO_HALVING);
    }
    if (on == WEFT__ON_RING)
        add(t, WEFT__OP_ALL_REDUCE, 0, PER_RANK(WEFT__SMALL_ALL_REDUCE_BYTES),
            WEFT__ALGO_GATHER);
    /* all_gather and reduce_scatter (a rank's block): the box (a
     * reduce_scatter's whole input), hierarchical, one-copy reads. */
    if (env->box != 0) {
        add(t, WEFT__OP_ALL_GATHER, 0, cfg->box_bytes, WEFT__ALGO_BOX);
        add(t, WEFT__OP_REDUCE_SCATTER, 0, PER_RANK(cfg->box_bytes),
            WEFT__ALGO_BOX);
    }
    if (hier) {
        add(t, WEFT__OP_ALL_GATHER, WEFT__HIER_ALL_GATHER_BYTES, NOLIMIT,
            WEFT__ALGO_HIER);
        add(t, WEFT__OP_REDUCE_SCATTER, WEFT__HIER_REDUCE_SCATTER_BYTES,
            NOLIMIT, WEFT__ALGO_HIER);
    }
    if (pull && WEFT__PULL_ALL_GATHER_BYTES != 0)
        add(t, WEFT__OP_ALL_GATHER, WEFT__PULL_ALL_GATHER_BYTES, NOLIMIT,
            WEFT__ALGO_PULL);
    if (pull && WEFT__PULL_REDUCE_SCATTER_BYTES != 0)
        add(t, WEFT__OP_REDUCE_SCATTER, WEFT__PULL_REDUCE_SCATTER_BYTES,
            NOLIMIT, WEFT__ALGO_PULL);
    /* broadcast: the box; where hosts run several ranks each under the
     * mesh, large, the ring's chain (each byte crosses each cable once:
     * a host's ranks are consecutive on the ring); one-copy reads. */
    if (env->box != 0)
        add(t, WEFT__OP_BROADCAST, 0, cfg->box_bytes, WEFT__ALGO_BOX);
    if (hier && on == WEFT__ON_MESH)
        add(t, WEFT__OP_BROADCAST, WEFT__HIER_BROADCAST_BYTES, NOLIMIT,
            WEFT__ALGO_RING);
    if (pull && WEFT__PULL_BROADCAST_BYTES != 0)
        add(t, WEFT__OP_BROADCAST, WEFT__PULL_BROADCAST_BYTES, NOLIMIT,
            WEFT__ALGO_PULL);
    if (env->box != 0)
        add(t, WEFT__OP_BARRIER, 0, NOLIMIT, WEFT__ALGO_BOX);
    /* reduce: small, every input to the root and reduced there (the
     * threshold of the small all_reduce's, whose gather it is); larger,
     * the mesh's reduce-scatter + gather where every pair is wired, else
     * the ring's chain. gather, scatter and the all-to-alls: where every
     * pair is wired, every peer at once (the mesh's), even without the
     * mesh in effect; else along the ring. */
    add(t, WEFT__OP_REDUCE, 0, PER_RANK(WEFT__SMALL_ALL_REDUCE_BYTES),
        WEFT__ALGO_GATHER);
    if (on == WEFT__ON_DIRECT) {
        add(t, WEFT__OP_REDUCE, 0, NOLIMIT, WEFT__ALGO_MESH);
        add(t, WEFT__OP_GATHER, 0, NOLIMIT, WEFT__ALGO_MESH);
        add(t, WEFT__OP_SCATTER, 0, NOLIMIT, WEFT__ALGO_MESH);
        add(t, WEFT__OP_ALL_TO_ALL, 0, NOLIMIT, WEFT__ALGO_MESH);
        add(t, WEFT__OP_ALL_TO_ALLV, 0, NOLIMIT, WEFT__ALGO_MESH);
    }
#undef PER_RANK
}

/* ---- WEFT_ALGO ---- */

static int fail(char *errmsg, size_t errlen, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

static int fail(char *errmsg, size_t errlen, const char *fmt, ...)
{
    va_list ap;
    int n = snprintf(errmsg, errlen, "WEFT_ALGO: ");

    va_start(ap, fmt);
    if (n >= 0 && (size_t)n < errlen)
        vsnprintf(errmsg + n, errlen - (size_t)n, fmt, ap);
    va_end(ap);
    return WEFT_ECONFIG;
}

/* A size: digits with an optional k, m or g (binary), into *out; *s moves
 * past it. -1 where there are no digits or it overflows. */
static int parse_size(const char **s, size_t *out)
{
    const char *p = *s;
    unsigned long long v = 0;
    unsigned shift = 0;

    if (!isdigit((unsigned char)*p))
        return -1;
    for (; isdigit((unsigned char)*p); p++) {
        if (v > (ULLONG_MAX - 9) / 10)
            return -1;
        v = v * 10 + (unsigned)(*p - '0');
    }
    switch (*p) {
    case 'k':
    case 'K':
        shift = 10;
        break;
    case 'm':
    case 'M':
        shift = 20;
        break;
    case 'g':
    case 'G':
        shift = 30;
        break;
    default:
        break;
    }
    if (shift != 0) {
        p++;
        if (v > (SIZE_MAX >> shift))
            return -1;
        v <<= shift;
    }
    if (v >= SIZE_MAX)
        return -1;
    *out = (size_t)v;
    *s = p;
    return 0;
}

/* The name at *s up to one of the characters of `end` (or the string's
 * end), matched against names[0..n): its index, or -1. */
static int match_name(const char **s, const char *end, const char *const *names,
                      size_t n, char *got, size_t gotlen)
{
    size_t len = strcspn(*s, end);

    snprintf(got, gotlen, "%.*s", (int)(len < 40 ? len : 40), *s);
    for (size_t i = 0; i < n; i++)
        if (names[i] != NULL && strlen(names[i]) == len &&
            strncmp(names[i], *s, len) == 0) {
            *s += len;
            return (int)i;
        }
    return -1;
}

/* Applies the override text s to t (whose rows are the defaults). */
static int apply(weft__tune *t, const weft__config *cfg,
                 const weft__tune_env *env, const char *s, char *errmsg,
                 size_t errlen)
{
    const char *op_names[NOPS];
    weft__tune_row mine[WEFT__TUNE_MAX_ROWS];
    int nmine = 0;

    for (size_t i = 0; i < NOPS; i++)
        op_names[i] = ops[i].name;
    while (*s != '\0') {
        char got[48];
        int oi, op, first = nmine;

        if (*s == ';') {
            s++;
            continue;
        }
        if ((oi = match_name(&s, ":;", op_names, NOPS, got, sizeof got)) < 0)
            return fail(errmsg, errlen,
                        "unknown operation \"%s\" (all_reduce, all_gather, "
                        "reduce_scatter, broadcast, barrier, reduce, gather, "
                        "scatter, all_to_all, all_to_allv)",
                        got);
        op = ops[oi].op;
        if (*s++ != ':')
            return fail(errmsg, errlen,
                        "%s: expected ':' and its rows (e.g. "
                        "%s:0-64k=mesh,64k-=ring)",
                        ops[oi].name, ops[oi].name);
        if (t->set & (1u << op))
            return fail(errmsg, errlen, "%s is given twice", ops[oi].name);
        t->set |= 1u << op;
        while (*s != '\0' && *s != ';') {
            size_t lo = 0, hi = NOLIMIT;
            const char *why;
            int a;

            if (isdigit((unsigned char)*s)) {
                if (parse_size(&s, &lo) != 0 || *s++ != '-')
                    return fail(errmsg, errlen,
                                "%s: a row is LO-HI=ALGO (sizes in bytes, "
                                "k, m or g; HI left out: no limit)",
                                ops[oi].name);
                if (isdigit((unsigned char)*s) && parse_size(&s, &hi) != 0)
                    return fail(errmsg, errlen, "%s: a size out of range",
                                ops[oi].name);
                if (*s++ != '=')
                    return fail(errmsg, errlen,
                                "%s: expected '=' and an algorithm after a "
                                "size range",
                                ops[oi].name);
                if (hi < lo)
                    return fail(errmsg, errlen,
                                "%s: the range %zu-%zu is empty", ops[oi].name,
                                lo, hi);
            }
            if ((a = match_name(&s, ",;", algo_names, WEFT__ALGO_COUNT, got,
                                sizeof got)) < 0)
                return fail(errmsg, errlen,
                            "%s: unknown algorithm \"%s\" (box, hier, pull, "
                            "gather, doubling, halving, mesh, ring)",
                            ops[oi].name, got);
            if (!implements(a, op))
                return fail(errmsg, errlen, "%s=%s: %s does not implement %s",
                            ops[oi].name, algo_names[a], algo_names[a],
                            ops[oi].name);
            if (!env->any && (why = cannot(a, cfg, env)) != NULL)
                return fail(errmsg, errlen, "%s=%s cannot run on this job: %s",
                            ops[oi].name, algo_names[a], why);
            if (nmine == WEFT__TUNE_MAX_ROWS)
                return fail(errmsg, errlen, "more than %d rows",
                            WEFT__TUNE_MAX_ROWS);
            mine[nmine++] = (weft__tune_row){op, lo, hi, a};
            if (*s == ',')
                s++;
        }
        if (nmine == first)
            return fail(errmsg, errlen, "%s: no rows", ops[oi].name);
    }
    /* The named operations' rows are the override's, in its order. */
    {
        int k = 0;

        for (int i = 0; i < t->nrows; i++)
            if (!(t->set & (1u << t->rows[i].op)))
                t->rows[k++] = t->rows[i];
        t->nrows = k;
        for (int i = 0; i < nmine; i++) {
            if (t->nrows == WEFT__TUNE_MAX_ROWS)
                return fail(errmsg, errlen, "more than %d rows",
                            WEFT__TUNE_MAX_ROWS);
            t->rows[t->nrows++] = mine[i];
        }
    }
    return WEFT_OK;
}

int weft__tune_build(weft__tune *t, const weft__config *cfg,
                     const weft__tune_env *env, const char *algo, char *errmsg,
                     size_t errlen)
{
    memset(t, 0, sizeof *t);
    t->on = env->on;
    defaults(t, cfg, env);
    if (algo == NULL || *algo == '\0')
        return WEFT_OK;
    return apply(t, cfg, env, algo, errmsg, errlen);
}

int weft__tune_init(weft__tune *t, const weft__ctx *c, char *errmsg,
                    size_t errlen)
{
    return weft__tune_init_from(t, c, getenv("WEFT_ALGO"), errmsg, errlen);
}

int weft__tune_init_from(weft__tune *t, const weft__ctx *c, const char *algo,
                         char *errmsg, size_t errlen)
{
    weft__tune_env env = {WEFT__ON_RING, c->box, c->pull, 0};

    if (c->tp != NULL)
        env.on = weft__topology(c);
    else
        /* One rank: nothing can fail to run, as nothing runs. */
        env = (weft__tune_env){WEFT__ON_MESH, 0, 0, 1};
    return weft__tune_build(t, c->cfg, &env, algo, errmsg, errlen);
}

weft__algo_fn weft__tune_pick(const weft__tune *t, const weft__ctx *c, int kind,
                              const weft__args *a, int *batch)
{
    const size_t bytes = a->count * weft_dtype_size(a->dtype);
    int algo = base_algo(kind, t->on);

    for (int i = 0; i < t->nrows; i++) {
        const weft__tune_row *r = &t->rows[i];

        if (r->op == kind && bytes >= r->lo && bytes <= r->hi &&
            can_run(r->algo, c, t->on, kind, a)) {
            algo = r->algo;
            break;
        }
    }
    /* Recursive doubling: each rank hears from every other through
     * log2(n) rounds, element by element in the same order. The
     * one-exchange gather: every rank hears every other directly and
     * reduces in rank order. (The ring's gather passes each rank's header
     * to its neighbour only.) */
    *batch = kind == WEFT__OP_ALL_REDUCE &&
             (algo == WEFT__ALGO_DOUBLING ||
              (algo == WEFT__ALGO_GATHER && t->on != WEFT__ON_RING));
    return algo_fn(algo, kind, t->on);
}

/* ---- printing ---- */

static int put_size(char *out, size_t len, size_t v)
{
    if (v != 0 && v % (1u << 30) == 0)
        return snprintf(out, len, "%zug", v >> 30);
    if (v != 0 && v % (1u << 20) == 0)
        return snprintf(out, len, "%zum", v >> 20);
    if (v != 0 && v % (1u << 10) == 0)
        return snprintf(out, len, "%zuk", v >> 10);
    return snprintf(out, len, "%zu", v);
}

size_t weft__tune_print(const weft__tune *t, char *out, size_t len)
{
    size_t at = 0;
    char b[32];

#define PUT(...)                                                               \
    do {                                                                       \
        int n_ = snprintf(at < len ? out + at : NULL, at < len ? len - at : 0, \
                          __VA_ARGS__);                                        \
        if (n_ > 0)                                                            \
            at += (size_t)n_;                                                  \
    } while (0)
    for (size_t i = 0; i < NOPS; i++) {
        const int op = ops[i].op;

        int closed = 0; /* a row already takes every size */

        PUT("%s%s:", i ? ";" : "", ops[i].name);
        for (int k = 0; k < t->nrows && !closed; k++) {
            const weft__tune_row *r = &t->rows[k];

            if (r->op != op)
                continue;
            /* Past a row that takes every size, and every call, nothing
             * runs (the box, the hierarchy and halving may turn a call
             * down: the rows after them decide then). */
            closed = r->lo == 0 && r->hi == NOLIMIT &&
                     r->algo != WEFT__ALGO_BOX && r->algo != WEFT__ALGO_HIER &&
                     r->algo != WEFT__ALGO_HALVING;
            put_size(b, sizeof b, r->lo);
            PUT("%s-", b);
            if (r->hi != NOLIMIT) {
                put_size(b, sizeof b, r->hi);
                PUT("%s", b);
            }
            PUT("=%s%s", algo_names[r->algo], closed ? "" : ",");
        }
        /* The topology's own algorithm past every row. */
        if (!closed)
            PUT("0-=%s", algo_names[base_algo(op, t->on)]);
    }
#undef PUT
    return at;
}
