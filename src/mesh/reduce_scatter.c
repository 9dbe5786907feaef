/* Mesh reduce_scatter: one exchange, a reduction in rank order. */
#include "mesh/mesh.h"

#include "base/kernels.h"

#include <string.h>

int weft__mesh_reduce_scatter(weft__ctx *c, const weft__args *a)
{
    const size_t bytes = a->count * weft_dtype_size(a->dtype);
    const char *sb = a->sendbuf;
    weft__peer_io io[WEFT__MESH_MAX_RANKS] = {{0}};
    char *parts;
    int rc;

    /* Every rank's copy of this rank's block lands in parts, in rank
     * order; sendbuf is only read, and recvbuf (which may lie inside it)
     * is written only once every send has completed. */
    if ((rc = weft__scratch(c, bytes * (size_t)c->nranks, (void **)&parts)) !=
        0)
        return rc;
    for (int p = 0; p < c->nranks; p++)
        io[p] = (weft__peer_io){sb + (size_t)p * bytes, bytes,
                                parts + (size_t)p * bytes, bytes};
    if ((rc = weft__mesh_exchange(c, a, io)) != 0)
        return rc;
    memcpy(parts + (size_t)c->rank * bytes, sb + (size_t)c->rank * bytes,
           bytes);
    weft__reduce_ranks(a->recvbuf, parts, c->nranks, a->count, a->dtype, a->op);
    return WEFT_OK;
}
