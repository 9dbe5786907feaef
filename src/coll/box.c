/* The small all_reduce, all_gather and the barrier through the box; see
 * coll.h. */
#include "coll/coll.h"

#include "base/kernels.h"

#include <assert.h>

static int reduce_boxed(weft__task *t)
{
    const weft__args *a = &t->a;

    weft__reduce_ranks(a->recvbuf, t->scratch, t->g.n, a->count, a->dtype,
                       a->op);
    return WEFT_OK;
}

int weft__box_all_reduce(weft__task *t)
{
    const weft__args *a = &t->a;
    const size_t bytes = a->count * weft_dtype_size(a->dtype);
    int rc;

    assert(t->g.n == t->c->nranks);
    if ((rc = weft__scratch(t->c, bytes * (size_t)t->g.n,
                            (void **)&t->scratch)) != 0)
        return rc;
    if ((rc = weft__box_start(t->c, t->k, a->sendbuf, bytes, t->scratch,
                              &t->pass)) != 0)
        return rc;
    t->next = reduce_boxed;
    return WEFT_OK;
}

int weft__box_all_gather(weft__task *t)
{
    const weft__args *a = &t->a;

    assert(t->g.n == t->c->nranks);
    /* Each peer's block lands in recvbuf as it comes; this rank's is
     * copied there (as the mesh's all-gather does, sendbuf may be its own
     * block of recvbuf). */
    return weft__box_start(t->c, t->k, a->sendbuf,
                           a->count * weft_dtype_size(a->dtype), a->recvbuf,
                           &t->pass);
}

int weft__box_barrier(weft__task *t)
{
    assert(t->g.n == t->c->nranks);
    return weft__box_start(t->c, t->k, NULL, 0, NULL, &t->pass);
}
