/* Mesh gather: every rank's block straight to the root, all at once. */
#include "mesh/mesh.h"

#include <string.h>

int weft__mesh_gather(weft__task *t)
{
    const weft__args *a = &t->a;
    const int n = t->g.n, me = t->g.me, root = a->root;
    const size_t bytes = a->count * weft_dtype_size(a->dtype);
    char *rb = a->recvbuf;
    weft__peer_io io[WEFT__MESH_MAX_RANKS] = {{0}};

    if (me == root) {
        /* In place: sendbuf is the root's own block of recvbuf. */
        if ((const char *)a->sendbuf != rb + (size_t)me * bytes)
            memmove(rb + (size_t)me * bytes, a->sendbuf, bytes);
        for (int p = 0; p < n; p++)
            io[p] = (weft__peer_io){NULL, 0, rb + (size_t)p * bytes, bytes};
    } else {
        io[root] = (weft__peer_io){a->sendbuf, bytes, NULL, 0};
    }
    return weft__mesh_exchange(t, io);
}
