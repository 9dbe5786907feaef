/* The hierarchical collectives; see hier.h.
 *
 * all_reduce:
 * The task runs among the ranks of its host (t->g is that group from the
 * start): phase 1 and 3 are its passes, phase 2 is a sub-task among the
 * ranks of its local index. Every rank runs the same passes in the same
 * order (one, then the cross all_reduce's, then one), so the pass numbers
 * that headers carry agree; every pass compares the call with the peers
 * it moves data with (and the mesh's exchanges with every member), so
 * ranks that called differently meet a rank that sees it. Scratch is
 * used by phase 1 only (t->scratch is stale once the sub-task ran: its
 * algorithm may grow the communicator's scratch). */
#include "coll/hier.h"

#include "base/kernels.h"
#include "engine/plan.h"
#include "mesh/mesh.h"
#include "ring/ring.h"

#include <string.h>

/* The ranks of this rank's local index, one per host (member h is host
 * h's), and those of its host (member i is local index i). */
static weft__group hier_across(const weft__ctx *c)
{
    const int local = c->cfg->hier_local;

    return (weft__group){c->cfg->nhosts, c->rank / local, c->rank % local,
                         local};
}

static weft__group hier_host(const weft__ctx *c)
{
    const int local = c->cfg->hier_local;

    return (weft__group){local, c->rank % local, c->rank - c->rank % local, 1};
}

/* Whether the cables' phase runs the mesh's algorithm (every pair of
 * hosts wired) or the ring's, around the hosts. */
static int hier_mesh_across(const weft__ctx *c)
{
    return c->cfg->mesh && c->cfg->nhosts <= WEFT__MESH_MAX_RANKS;
}

/* Runs xa among the ranks of this rank's local index (the mesh's
 * algorithm or the ring's, hier_mesh_across), then next. */
static int across_sub(weft__task *t, const weft__args *xa,
                      weft__algo_fn mesh, weft__algo_fn ring,
                      weft__task_fn next)
{
    const weft__group across = hier_across(t->c);
    int rc = weft__task_sub_in(t, &across, xa,
                               hier_mesh_across(t->c) ? mesh : ring);

    if (rc == WEFT_OK)
        t->next = next;
    return rc;
}

/* Phase 3: this rank's chunk is reduced over the job. */
static int hier_gather(weft__task *t)
{
    return weft__mesh_chunks_gather(t);
}

/* Phase 2: this rank's chunk, reduced over the host, all_reduced with the
 * same chunk of every other host, in place; then next. */
static int cross_chunk(weft__task *t, weft__task_fn next)
{
    const size_t es = weft_dtype_size(t->a.dtype);
    const weft__region mine = weft__plan_chunk(t->a.count, t->g.n, t->g.me);
    char *chunk = (char *)t->a.recvbuf + mine.off * es;
    weft__args xa = t->a;

    xa.sendbuf = chunk;
    xa.recvbuf = chunk;
    xa.count = mine.len;
    return across_sub(t, &xa, weft__mesh_all_reduce, weft__ring_all_reduce,
                      next);
}

static int hier_cross(weft__task *t)
{
    weft__mesh_chunks_reduce(t);
    return cross_chunk(t, hier_gather);
}

/* The same with phases 1 and 3 by one-copy reads (c->pull_host): phase
 * 2 runs on this rank's share, reduced over the host, between them. */
static int pull_cross(weft__task *t)
{
    int rc = weft__pull_share_reduce(t);

    return rc != WEFT_OK ? rc : cross_chunk(t, weft__pull_share_gather);
}

/* Whether the phases within the host are one-copy reads: this rank can
 * read its host's ranks (and so can every rank of the host) and the call
 * moves from bytes per rank (0: never). */
static int hier_pull(const weft__task *t, size_t from)
{
    return t->c->pull_host && from != 0 &&
           t->a.count * weft_dtype_size(t->a.dtype) >= from;
}

int weft__hier_all_reduce(weft__task *t)
{
    /* Phase 1 among this host's ranks. */
    t->g = hier_host(t->c);
    if (hier_pull(t, t->c->cfg->hier_pull_all_reduce_bytes))
        return weft__pull_share_start(t, pull_cross);
    t->next = hier_cross;
    return weft__mesh_chunks_scatter(t);
}

/* ---- all_gather ----
 *
 * The block of rank h*L + i sits at (h*L + i) * B in recvbuf (B bytes a
 * block). Phase 1 gathers the host's blocks (its row of recvbuf), phase
 * 2 lands the column of local index i (block h*L + i of every host h) in
 * scratch, host order, and phase 3 sends the column's blocks of the
 * other hosts to every other rank of the host, theirs landing at their
 * places (one step a host). The first pass is among the host's ranks,
 * like the flat algorithms' (the mesh's with every peer, the ring's with
 * its neighbours, one of them on the host): a rank whose count puts it on
 * another path than its host's other ranks meets one of them at once. */

/* The host that step k of phase 3 is about: every host but this one. */
static int gather_host_of(const weft__task *t, int k)
{
    const int h = t->c->rank / t->g.n;

    return k < h ? k : k + 1;
}

/* Phase 3, step k: this rank's column block of host s to member p of the
 * host, p's block of host s into its place. */
static void gather_step(const weft__task *t, const void *arg, int p, int k,
                        weft__peer_io *io)
{
    const size_t bytes = t->a.count * weft_dtype_size(t->a.dtype);
    const int s = gather_host_of(t, k);
    const size_t at = ((size_t)s * (size_t)t->g.n + (size_t)p) * bytes;

    (void)arg;
    *io = (weft__peer_io){t->scratch + (size_t)s * bytes, bytes,
                          (char *)t->a.recvbuf + at, bytes};
}

/* The column's blocks of the other hosts into their places in recvbuf. */
static int gather_place(weft__task *t)
{
    const int nhosts = t->c->cfg->nhosts, local = t->g.n;
    const size_t bytes = t->a.count * weft_dtype_size(t->a.dtype);
    char *rb = t->a.recvbuf;
    int rc;

    /* The column's algorithms take no scratch, but should one grow it,
     * realloc kept the column (it ran before): fetch it again. */
    if ((rc = weft__scratch(t->c, bytes * (size_t)nhosts,
                            (void **)&t->scratch)) != 0)
        return rc;
    for (int k = 0; k < nhosts - 1; k++) {
        const int s = gather_host_of(t, k);

        memcpy(rb + ((size_t)s * (size_t)local + (size_t)t->g.me) * bytes,
               t->scratch + (size_t)s * bytes, bytes);
    }
    return WEFT_OK;
}

static int gather_host(weft__task *t)
{
    int rc = gather_place(t);

    return rc != WEFT_OK ? rc
                         : weft__mesh_exchange_steps(t, t->c->cfg->nhosts - 1,
                                                     gather_step, NULL);
}

/* The same by one-copy reads (c->pull_host): once every rank of the host
 * placed its column (a barrier), each reads the column of every other. */
static int pull_gather_read(weft__task *t)
{
    const size_t bytes = t->a.count * weft_dtype_size(t->a.dtype);

    return weft__pull_gather_blocks(t, bytes, bytes * (size_t)t->g.n,
                                    t->c->cfg->nhosts);
}

static int pull_gather_place(weft__task *t)
{
    int rc = gather_place(t);

    return rc != WEFT_OK ? rc : weft__pull_sync(t, pull_gather_read);
}

/* Phase 2: this rank's block, now in its place, to the ranks of its local
 * index; theirs into the column; then next. */
static int gather_column(weft__task *t, weft__task_fn next)
{
    const size_t bytes = t->a.count * weft_dtype_size(t->a.dtype);
    weft__args xa = t->a;
    int rc;

    if ((rc = weft__scratch(t->c, bytes * (size_t)t->c->cfg->nhosts,
                            (void **)&t->scratch)) != 0)
        return rc;
    xa.sendbuf = (char *)t->a.recvbuf + (size_t)t->c->rank * bytes;
    xa.recvbuf = t->scratch;
    return across_sub(t, &xa, weft__mesh_all_gather, weft__ring_all_gather,
                      next);
}

static int gather_across(weft__task *t)
{
    return gather_column(t, gather_host);
}

static int pull_gather_across(weft__task *t)
{
    return gather_column(t, pull_gather_place);
}

int weft__hier_all_gather(weft__task *t)
{
    const size_t bytes = t->a.count * weft_dtype_size(t->a.dtype);
    weft__args xa = t->a;
    int rc;

    t->g = hier_host(t->c);
    if (hier_pull(t, t->c->cfg->hier_pull_all_gather_bytes)) {
        char *own = (char *)t->a.recvbuf + (size_t)t->c->rank * bytes;

        /* Phase 1 publishes this rank's block, in its place, and recvbuf
         * (a pass among the host's ranks, like the frames'). */
        if ((const char *)t->a.sendbuf != own)
            memmove(own, t->a.sendbuf, bytes);
        return weft__pull_publish(t, own, t->a.recvbuf, pull_gather_across);
    }
    /* Phase 1: the host's row of recvbuf (the mesh's all_gather reads
     * sendbuf before anything lands, so recvbuf may hold it). */
    xa.recvbuf = (char *)t->a.recvbuf + (size_t)t->g.base * bytes;
    rc = weft__task_sub_in(t, &t->g, &xa, weft__mesh_all_gather);
    if (rc == WEFT_OK)
        t->next = gather_across;
    return rc;
}

/* ---- reduce_scatter ----
 *
 * Block h*L + i of sendbuf is rank h*L + i's. Phase 1 sends member p of
 * the host its column (block h*L + p of every host h) and lands every
 * member's copy of this rank's column in scratch, member by member; they
 * are reduced in member order into the column, which lies after them in
 * scratch. Phase 2 reduce_scatters the column among the ranks of this
 * local index: member h (host h) gets block h, which is its own. The
 * column's algorithms take scratch (H * B bytes) before it: less than
 * phase 1 took, so scratch does not move, and below the column. */

/* Phase 1, step s (host s): block s*L + p of sendbuf to member p, p's
 * copy of block s*L + me into p's column in scratch. */
static void scatter_step(const weft__task *t, const void *arg, int p, int s,
                         weft__peer_io *io)
{
    const int nhosts = t->c->cfg->nhosts, local = t->g.n;
    const size_t bytes = t->a.count * weft_dtype_size(t->a.dtype);

    (void)arg;
    *io = (weft__peer_io){
        (const char *)t->a.sendbuf +
            ((size_t)s * (size_t)local + (size_t)p) * bytes,
        bytes, t->scratch + ((size_t)p * (size_t)nhosts + (size_t)s) * bytes,
        bytes};
}

static int scatter_across(weft__task *t)
{
    const int nhosts = t->c->cfg->nhosts, local = t->g.n, me = t->g.me;
    const size_t bytes = t->a.count * weft_dtype_size(t->a.dtype);
    const size_t col = bytes * (size_t)nhosts;
    char *column = t->scratch + col * (size_t)local;
    weft__args xa = t->a;

    for (int s = 0; s < nhosts; s++)
        memcpy(t->scratch + (size_t)me * col + (size_t)s * bytes,
               (const char *)t->a.sendbuf +
                   ((size_t)s * (size_t)local + (size_t)me) * bytes,
               bytes);
    weft__reduce_ranks(column, t->scratch, local, t->a.count * (size_t)nhosts,
                       t->a.dtype, t->a.op);
    xa.sendbuf = column;
    return across_sub(t, &xa, weft__mesh_reduce_scatter,
                      weft__ring_reduce_scatter, NULL);
}

/* The same with phase 1 by one-copy reads (c->pull_host): this rank reads
 * block h*L + i of every host h from every rank of its host and reduces
 * them, in local-rank order, into the column in c->pull_tmp. Phase 2
 * lands its block in recvbuf, or, where recvbuf overlaps a block of
 * sendbuf that the host's other ranks read, in a copy after the column,
 * moved into place after the last barrier (no rank reads this rank's
 * sendbuf from then on). */
static int pull_scatter_direct(const weft__task *t)
{
    const size_t bytes = t->a.count * weft_dtype_size(t->a.dtype);
    const uintptr_t s = (uintptr_t)t->a.sendbuf, r = (uintptr_t)t->a.recvbuf;
    const size_t local = (size_t)t->g.n;

    /* Or a block of this rank's column, which only it reads (before). */
    return r + bytes <= s || r >= s + bytes * (size_t)t->c->nranks ||
           (r >= s && (r - s) % bytes == 0 &&
            (r - s) / bytes % local == (size_t)t->g.me);
}

static int pull_scatter_place(weft__task *t)
{
    const size_t bytes = t->a.count * weft_dtype_size(t->a.dtype);

    memcpy(t->a.recvbuf,
           (char *)t->c->pull_tmp + bytes * (size_t)t->c->cfg->nhosts, bytes);
    return WEFT_OK;
}

static int pull_scatter_end(weft__task *t)
{
    return weft__pull_sync(t,
                           pull_scatter_direct(t) ? NULL : pull_scatter_place);
}

static int pull_scatter_across(weft__task *t)
{
    const int nhosts = t->c->cfg->nhosts;
    const size_t count = t->a.count;
    const size_t bytes = count * weft_dtype_size(t->a.dtype);
    char *column = t->c->pull_tmp;
    weft__args xa = t->a;
    int rc;

    if ((rc = weft__pull_reduce(t, 0, count, (size_t)t->g.me * count,
                                (size_t)t->g.n * count, nhosts, column)) !=
        WEFT_OK)
        return rc;
    xa.sendbuf = column;
    if (!pull_scatter_direct(t))
        xa.recvbuf = column + (size_t)nhosts * bytes;
    return across_sub(t, &xa, weft__mesh_reduce_scatter,
                      weft__ring_reduce_scatter, pull_scatter_end);
}

int weft__hier_reduce_scatter(weft__task *t)
{
    const int nhosts = t->c->cfg->nhosts;
    const size_t bytes = t->a.count * weft_dtype_size(t->a.dtype);
    int rc;

    t->g = hier_host(t->c);
    if (hier_pull(t, t->c->cfg->hier_pull_reduce_scatter_bytes)) {
        /* The column, and the copy of the result after it. */
        if ((rc = weft__pull_tmp(t->c, bytes * (size_t)(nhosts + 1))) != 0)
            return rc;
        return weft__pull_publish(t, t->a.sendbuf, t->a.recvbuf,
                                  pull_scatter_across);
    }
    /* Every member's copy of this rank's column, then the column. */
    if ((rc = weft__scratch(t->c,
                            bytes * (size_t)nhosts * (size_t)(t->g.n + 1),
                            (void **)&t->scratch)) != 0)
        return rc;
    t->next = scatter_across;
    return weft__mesh_exchange_steps(t, nhosts, scatter_step, NULL);
}
