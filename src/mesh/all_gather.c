/* Mesh all_gather: one exchange; see mesh.h. */
#include "mesh/mesh.h"

#include <string.h>

int weft__mesh_all_gather(weft__task *t)
{
    const weft__args *a = &t->a;
    const size_t bytes = a->count * weft_dtype_size(a->dtype);
    char *rb = a->recvbuf, *own = rb + (size_t)t->g.me * bytes;
    weft__peer_io io[WEFT__MESH_MAX_RANKS] = {{0}};

    if ((const char *)a->sendbuf != own)
        memmove(own, a->sendbuf, bytes);
    for (int p = 0; p < t->g.n; p++)
        io[p] = (weft__peer_io){own, bytes, rb + (size_t)p * bytes, bytes};
    return weft__mesh_exchange(t, io);
}
