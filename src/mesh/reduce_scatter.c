/* Mesh reduce_scatter: one exchange, a reduction in rank order. */
#include "mesh/mesh.h"

#include "base/kernels.h"

#include <string.h>

static int reduce_parts(weft__task *t)
{
    const weft__args *a = &t->a;
    const size_t bytes = a->count * weft_dtype_size(a->dtype);
    const char *sb = a->sendbuf;

    memcpy(t->scratch + (size_t)t->g.me * bytes, sb + (size_t)t->g.me * bytes,
           bytes);
    weft__reduce_ranks(a->recvbuf, t->scratch, t->g.n, a->count, a->dtype,
                       a->op);
    return WEFT_OK;
}

int weft__mesh_reduce_scatter(weft__task *t)
{
    const weft__args *a = &t->a;
    const size_t bytes = a->count * weft_dtype_size(a->dtype);
    const char *sb = a->sendbuf;
    weft__peer_io io[WEFT__MESH_MAX_RANKS] = {{0}};
    int rc;

    /* Every rank's copy of this rank's block lands in scratch, in rank
     * order; sendbuf is only read, and recvbuf (which may lie inside it)
     * is written only once every send has completed. */
    if ((rc = weft__scratch(t->c, bytes * (size_t)t->g.n,
                            (void **)&t->scratch)) != 0)
        return rc;
    for (int p = 0; p < t->g.n; p++)
        io[p] = (weft__peer_io){sb + (size_t)p * bytes, bytes,
                                t->scratch + (size_t)p * bytes, bytes};
    t->next = reduce_parts;
    return weft__mesh_exchange(t, io);
}
