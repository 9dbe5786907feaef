/* Mesh scatter: block p from the root straight to rank p, all at once. */
#include "mesh/mesh.h"

#include <string.h>

int weft__mesh_scatter(weft__task *t)
{
    const weft__args *a = &t->a;
    const int n = t->g.n, me = t->g.me, root = a->root;
    const size_t bytes = a->count * weft_dtype_size(a->dtype);
    const char *sb = a->sendbuf;
    weft__peer_io io[WEFT__MESH_MAX_RANKS] = {{0}};

    if (me == root) {
        /* In place: recvbuf is the root's own block of sendbuf. */
        if ((char *)a->recvbuf != sb + (size_t)me * bytes)
            memmove(a->recvbuf, sb + (size_t)me * bytes, bytes);
        for (int p = 0; p < n; p++)
            io[p] = (weft__peer_io){sb + (size_t)p * bytes, bytes, NULL, 0};
    } else {
        io[root] = (weft__peer_io){NULL, 0, a->recvbuf, bytes};
    }
    return weft__mesh_exchange(t, io);
}
