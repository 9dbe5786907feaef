/* Mesh broadcast; see mesh.h. */
#include "mesh/mesh.h"

#include "engine/plan.h"

/* All-gather of the chunks among everyone but the root, which has them
 * all and only sends its own. */
static int all_gather(weft__task *t)
{
    const int n = t->g.n, me = t->g.me, root = t->a.root;
    const size_t es = weft_dtype_size(t->a.dtype);
    const weft__region mine = weft__plan_chunk(t->a.count, n, me);
    char *b = t->a.recvbuf;
    weft__peer_io io[WEFT__MESH_MAX_RANKS] = {{0}};

    for (int p = 0; p < n; p++) {
        weft__region ch = weft__plan_chunk(t->a.count, n, p);
        io[p] =
            (weft__peer_io){b + mine.off * es, p == root ? 0 : mine.len * es,
                            b + ch.off * es, me == root ? 0 : ch.len * es};
    }
    return weft__mesh_exchange(t, io);
}

int weft__mesh_broadcast(weft__task *t)
{
    const int n = t->g.n, me = t->g.me, root = t->a.root;
    const size_t es = weft_dtype_size(t->a.dtype), bytes = t->a.count * es;
    const weft__region mine = weft__plan_chunk(t->a.count, n, me);
    char *b = t->a.recvbuf;
    weft__peer_io io[WEFT__MESH_MAX_RANKS] = {{0}};

    if (bytes * (size_t)n <= t->c->cfg->mesh_small_all_reduce_bytes) {
        for (int p = 0; p < n; p++)
            io[p] = (weft__peer_io){b, me == root ? bytes : 0, b,
                                    p == root ? bytes : 0};
        return weft__mesh_exchange(t, io);
    }
    /* Scatter: chunk p from the root to rank p. */
    for (int p = 0; p < n; p++) {
        weft__region ch = weft__plan_chunk(t->a.count, n, p);
        io[p] =
            (weft__peer_io){b + ch.off * es, me == root ? ch.len * es : 0,
                            b + mine.off * es, p == root ? mine.len * es : 0};
    }
    t->next = all_gather;
    return weft__mesh_exchange(t, io);
}
