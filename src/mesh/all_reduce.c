/* Mesh all_reduce, large counts: direct reduce-scatter, then all-gather;
 * see mesh.h. Small counts go through weft__gather_reduce. t->scratch
 * holds every rank's copy of this rank's chunk, in rank order. */
#include "mesh/mesh.h"

#include "base/kernels.h"
#include "engine/plan.h"

#include <string.h>

/* Reduces this rank's chunk, then sends it to every peer while theirs
 * land in recvbuf. */
static int all_gather(weft__task *t)
{
    const weft__args *a = &t->a;
    const int n = t->g.n;
    const size_t es = weft_dtype_size(a->dtype);
    const weft__region mine = weft__plan_chunk(a->count, n, t->g.me);
    const size_t mbytes = mine.len * es;
    char *rb = a->recvbuf;
    weft__peer_io io[WEFT__MESH_MAX_RANKS] = {{0}};

    memcpy(t->scratch + (size_t)t->g.me * mbytes,
           (const char *)a->sendbuf + mine.off * es, mbytes);
    weft__reduce_ranks(rb + mine.off * es, t->scratch, n, mine.len, a->dtype,
                       a->op);
    for (int p = 0; p < n; p++) {
        weft__region ch = weft__plan_chunk(a->count, n, p);
        io[p] = (weft__peer_io){rb + mine.off * es, mbytes, rb + ch.off * es,
                                ch.len * es};
    }
    return weft__mesh_exchange(t, io);
}

int weft__mesh_all_reduce(weft__task *t)
{
    const weft__args *a = &t->a;
    const int n = t->g.n;
    const size_t es = weft_dtype_size(a->dtype);
    const weft__region mine = weft__plan_chunk(a->count, n, t->g.me);
    const size_t mbytes = mine.len * es;
    const char *sb = a->sendbuf;
    weft__peer_io io[WEFT__MESH_MAX_RANKS] = {{0}};
    int rc;

    if ((rc = weft__scratch(t->c, mbytes * (size_t)n, (void **)&t->scratch)) !=
        0)
        return rc;
    /* Reduce-scatter: chunk p of the input to rank p; every peer's chunk
     * of this rank into scratch. In place, recvbuf is not written before
     * every chunk of sendbuf has left. */
    for (int p = 0; p < n; p++) {
        weft__region ch = weft__plan_chunk(a->count, n, p);
        io[p] = (weft__peer_io){sb + ch.off * es, ch.len * es,
                                t->scratch + (size_t)p * mbytes, mbytes};
    }
    t->next = all_gather;
    return weft__mesh_exchange(t, io);
}
