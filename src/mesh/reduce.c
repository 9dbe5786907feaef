/*
 * Mesh reduce: the direct reduce-scatter (chunk p of every input to rank
 * p, reduced there in rank order), then every reduced chunk to the root:
 * each rank's links carry the buffer about twice, the root's no more
 * than any other's, where sending every input to the root would load
 * its links n-1 times.
 */
#include "mesh/mesh.h"

#include "base/kernels.h"
#include "engine/plan.h"

#include <string.h>

/* Pass 2, once every copy of this rank's chunk is in scratch: reduce
 * them, then send the result to the root (where the root takes every
 * other chunk into recvbuf). */
static int to_root(weft__task *t)
{
    const weft__args *a = &t->a;
    const int n = t->g.n, me = t->g.me, root = a->root;
    const size_t es = weft_dtype_size(a->dtype);
    const weft__region mine = weft__plan_chunk(a->count, n, me);
    const size_t slot = mine.len * es;
    char *rb = a->recvbuf;
    char *out = me == root ? rb + mine.off * es : t->scratch + (size_t)n * slot;
    weft__peer_io io[WEFT__MESH_MAX_RANKS] = {{0}};

    memcpy(t->scratch + (size_t)me * slot,
           (const char *)a->sendbuf + mine.off * es, slot);
    weft__reduce_ranks(out, t->scratch, n, mine.len, a->dtype, a->op);
    if (me == root) {
        for (int p = 0; p < n; p++) {
            weft__region ch = weft__plan_chunk(a->count, n, p);

            io[p] = (weft__peer_io){NULL, 0, rb + ch.off * es, ch.len * es};
        }
    } else {
        io[root] = (weft__peer_io){out, mine.len * es, NULL, 0};
    }
    return weft__mesh_exchange(t, io);
}

int weft__mesh_reduce(weft__task *t)
{
    const weft__args *a = &t->a;
    const int n = t->g.n, me = t->g.me;
    const size_t es = weft_dtype_size(a->dtype);
    const weft__region mine = weft__plan_chunk(a->count, n, me);
    const size_t slot = mine.len * es;
    const char *sb = a->sendbuf;
    weft__peer_io io[WEFT__MESH_MAX_RANKS] = {{0}};
    int rc;

    /* n slots of this rank's chunk for every rank's copy of it, and one
     * for the result off the root. sendbuf is only read
     * in this pass, so the root may reduce in place. */
    if ((rc = weft__scratch(t->c, slot * (size_t)(n + 1) + es,
                            (void **)&t->scratch)) != 0)
        return rc;
    for (int p = 0; p < n; p++) {
        weft__region ch = weft__plan_chunk(a->count, n, p);

        io[p] = (weft__peer_io){sb + ch.off * es, ch.len * es,
                                t->scratch + (size_t)p * slot, mine.len * es};
    }
    t->next = to_root;
    return weft__mesh_exchange(t, io);
}
