/* The hierarchical all_reduce; see hier.h.
 *
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

#include "engine/plan.h"
#include "mesh/mesh.h"
#include "ring/ring.h"

/* Phase 3: this rank's chunk is reduced over the job. */
static int hier_gather(weft__task *t)
{
    return weft__mesh_chunks_gather(t);
}

/* Phase 2: this rank's chunk, reduced over the host, all_reduced with the
 * same chunk of every other host, in place. */
static int hier_cross(weft__task *t)
{
    const weft__config *cfg = t->c->cfg;
    const int local = cfg->hier_local, nhosts = cfg->nhosts;
    const weft__group across = {nhosts, t->c->rank / local, t->c->rank % local,
                                local};
    const size_t es = weft_dtype_size(t->a.dtype);
    const weft__region mine = weft__plan_chunk(t->a.count, t->g.n, t->g.me);
    char *chunk = (char *)t->a.recvbuf + mine.off * es;
    weft__args xa = t->a;
    int rc;

    weft__mesh_chunks_reduce(t);
    xa.sendbuf = chunk;
    xa.recvbuf = chunk;
    xa.count = mine.len;
    rc = weft__task_sub_in(t, &across, &xa,
                           cfg->mesh && nhosts <= WEFT__MESH_MAX_RANKS
                               ? weft__mesh_all_reduce
                               : weft__ring_all_reduce);
    if (rc == WEFT_OK)
        t->next = hier_gather;
    return rc;
}

int weft__hier_all_reduce(weft__task *t)
{
    const int local = t->c->cfg->hier_local, rank = t->c->rank;

    /* Phase 1 among this host's ranks. */
    t->g = (weft__group){local, rank % local, rank - rank % local, 1};
    t->next = hier_cross;
    return weft__mesh_chunks_scatter(t);
}
