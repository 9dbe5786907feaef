/* Mesh all_to_all and all_to_allv: one exchange, a lane per peer, every
 * pair in flight at once. */
#include "mesh/mesh.h"

#include "coll/coll.h"

#include <stdlib.h>
#include <string.h>

int weft__mesh_all_to_all(weft__task *t)
{
    const weft__args *a = &t->a;
    const int n = t->g.n, me = t->g.me;
    const size_t bytes = a->count * weft_dtype_size(a->dtype);
    const char *sb = a->sendbuf;
    char *rb = a->recvbuf;
    weft__peer_io io[WEFT__MESH_MAX_RANKS] = {{0}};

    /* In place: a peer's block may arrive before this rank's block to it
     * has left from the same bytes, so the sends leave from a copy. */
    if (sb == rb) {
        if ((t->owned = malloc(bytes * (size_t)n)) == NULL)
            return weft__note(t->c, WEFT_ENOMEM,
                              "rank %d: %s: cannot allocate %zu bytes for a "
                              "copy of the data to send",
                              t->c->rank, t->k->name, bytes * (size_t)n);
        memcpy(t->owned, sb, bytes * (size_t)n);
        sb = t->owned;
    } else {
        memcpy(rb + (size_t)me * bytes, sb + (size_t)me * bytes, bytes);
    }
    for (int p = 0; p < n; p++)
        io[p] = (weft__peer_io){sb + (size_t)p * bytes, bytes,
                                rb + (size_t)p * bytes, bytes};
    return weft__mesh_exchange(t, io);
}

static int mesh_v_data(weft__task *t)
{
    const weft__args *a = &t->a;
    const int n = t->g.n, me = t->g.me;
    const size_t es = weft_dtype_size(a->dtype);
    const char *sb = a->sendbuf;
    char *rb = a->recvbuf;
    weft__peer_io io[WEFT__MESH_MAX_RANKS] = {{0}};
    int rc;

    if ((rc = weft__all_to_allv_check(t)) != WEFT_OK)
        return rc;
    if (a->sendcounts[me] > 0)
        memcpy(rb + a->rdispls[me] * es, sb + a->sdispls[me] * es,
               a->sendcounts[me] * es);
    /* Both ends of every pair have the same counts now, so they agree on
     * which halves exist. */
    for (int p = 0; p < n; p++)
        io[p] = (weft__peer_io){
            a->sendcounts[p] > 0 ? sb + a->sdispls[p] * es : NULL,
            a->sendcounts[p] * es,
            a->recvcounts[p] > 0 ? rb + a->rdispls[p] * es : NULL,
            a->recvcounts[p] * es};
    return weft__mesh_exchange(t, io);
}

int weft__mesh_all_to_allv(weft__task *t)
{
    return weft__all_to_allv_counts(t, weft__mesh_all_gather, mesh_v_data);
}
