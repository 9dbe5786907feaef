/* Mesh broadcast; see mesh.h. */
#include "mesh/mesh.h"

#include "engine/plan.h"

int weft__mesh_broadcast(weft__ctx *c, const weft__args *a)
{
    const int n = c->nranks, me = c->rank, root = a->root;
    const size_t es = weft_dtype_size(a->dtype), bytes = a->count * es;
    const weft__region mine = weft__plan_chunk(a->count, n, me);
    char *b = a->recvbuf;
    weft__peer_io io[WEFT__MESH_MAX_RANKS] = {{0}};
    int rc;

    if (bytes * (size_t)n <= c->cfg->mesh_small_all_reduce_bytes) {
        for (int p = 0; p < n; p++)
            io[p] = (weft__peer_io){b, me == root ? bytes : 0, b,
                                    p == root ? bytes : 0};
        return weft__mesh_exchange(c, a, io);
    }
    /* Scatter: chunk p from the root to rank p. */
    for (int p = 0; p < n; p++) {
        weft__region ch = weft__plan_chunk(a->count, n, p);
        io[p] =
            (weft__peer_io){b + ch.off * es, me == root ? ch.len * es : 0,
                            b + mine.off * es, p == root ? mine.len * es : 0};
    }
    if ((rc = weft__mesh_exchange(c, a, io)) != 0)
        return rc;
    /* All-gather of the chunks among everyone but the root, which has them
     * all and only sends its own. */
    for (int p = 0; p < n; p++) {
        weft__region ch = weft__plan_chunk(a->count, n, p);
        io[p] =
            (weft__peer_io){b + mine.off * es, p == root ? 0 : mine.len * es,
                            b + ch.off * es, me == root ? 0 : ch.len * es};
    }
    return weft__mesh_exchange(c, a, io);
}
