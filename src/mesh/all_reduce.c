/* Mesh all_reduce, large counts: direct reduce-scatter, then all-gather;
 * see mesh.h. Small counts go through weft__gather_reduce. t->scratch
 * holds every member's copy of this member's chunk, in member order. The
 * hierarchical all_reduce (coll/hier.c) runs the three parts among the
 * ranks of a host, with the cables' all_reduce of the chunk between the
 * reduction and the all-gather. */
#include "mesh/mesh.h"

#include "base/kernels.h"
#include "engine/plan.h"

#include <string.h>

int weft__mesh_chunks_scatter(weft__task *t)
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
    /* Chunk p of the input to member p; every peer's chunk of this member
     * into scratch. In place, recvbuf is not written before every chunk
     * of sendbuf has left. */
    for (int p = 0; p < n; p++) {
        weft__region ch = weft__plan_chunk(a->count, n, p);
        io[p] = (weft__peer_io){sb + ch.off * es, ch.len * es,
                                t->scratch + (size_t)p * mbytes, mbytes};
    }
    return weft__mesh_exchange(t, io);
}

void weft__mesh_chunks_reduce(weft__task *t)
{
    const weft__args *a = &t->a;
    const int n = t->g.n;
    const size_t es = weft_dtype_size(a->dtype);
    const weft__region mine = weft__plan_chunk(a->count, n, t->g.me);
    const size_t mbytes = mine.len * es;
    char *rb = a->recvbuf;

    memcpy(t->scratch + (size_t)t->g.me * mbytes,
           (const char *)a->sendbuf + mine.off * es, mbytes);
    weft__reduce_ranks(rb + mine.off * es, t->scratch, n, mine.len, a->dtype,
                       a->op);
}

int weft__mesh_chunks_gather(weft__task *t)
{
    const weft__args *a = &t->a;
    const int n = t->g.n;
    const size_t es = weft_dtype_size(a->dtype);
    const weft__region mine = weft__plan_chunk(a->count, n, t->g.me);
    char *rb = a->recvbuf;
    weft__peer_io io[WEFT__MESH_MAX_RANKS] = {{0}};

    for (int p = 0; p < n; p++) {
        weft__region ch = weft__plan_chunk(a->count, n, p);
        io[p] = (weft__peer_io){rb + mine.off * es, mine.len * es,
                                rb + ch.off * es, ch.len * es};
    }
    return weft__mesh_exchange(t, io);
}

/* Reduces this member's chunk, then sends it to every peer while theirs
 * land in recvbuf. */
static int all_gather(weft__task *t)
{
    weft__mesh_chunks_reduce(t);
    return weft__mesh_chunks_gather(t);
}

int weft__mesh_all_reduce(weft__task *t)
{
    t->next = all_gather;
    return weft__mesh_chunks_scatter(t);
}
