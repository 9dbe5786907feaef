/* Mesh all_reduce, large counts: direct reduce-scatter, then all-gather;
 * see mesh.h. Small counts go through weft__gather_reduce. */
#include "mesh/mesh.h"

#include "base/kernels.h"
#include "engine/plan.h"

#include <string.h>

int weft__mesh_all_reduce(weft__ctx *c, const weft__args *a)
{
    const int n = c->nranks;
    const size_t es = weft_dtype_size(a->dtype);
    const weft__region mine = weft__plan_chunk(a->count, n, c->rank);
    const size_t mbytes = mine.len * es;
    const char *sb = a->sendbuf;
    char *rb = a->recvbuf, *parts;
    weft__peer_io io[WEFT__MESH_MAX_RANKS] = {{0}};
    int rc;

    if ((rc = weft__scratch(c, mbytes * (size_t)n, (void **)&parts)) != 0)
        return rc;
    /* Reduce-scatter: chunk p of the input to rank p; every peer's chunk
     * of this rank into parts. In place, recvbuf is not written before
     * every chunk of sendbuf has left. */
    for (int p = 0; p < n; p++) {
        weft__region ch = weft__plan_chunk(a->count, n, p);
        io[p] = (weft__peer_io){sb + ch.off * es, ch.len * es,
                                parts + (size_t)p * mbytes, mbytes};
    }
    if ((rc = weft__mesh_exchange(c, a, io)) != 0)
        return rc;
    memcpy(parts + (size_t)c->rank * mbytes, sb + mine.off * es, mbytes);
    weft__reduce_ranks(rb + mine.off * es, parts, n, mine.len, a->dtype, a->op);
    /* All-gather: this rank's reduced chunk to every peer. */
    for (int p = 0; p < n; p++) {
        weft__region ch = weft__plan_chunk(a->count, n, p);
        io[p] = (weft__peer_io){rb + mine.off * es, mbytes, rb + ch.off * es,
                                ch.len * es};
    }
    return weft__mesh_exchange(c, a, io);
}
