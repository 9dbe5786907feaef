/* The small all_reduce by gathering every input; see coll.h. */
#include "coll/coll.h"

#include "base/kernels.h"

static int reduce_gathered(weft__task *t)
{
    const weft__args *a = &t->a;

    weft__reduce_ranks(a->recvbuf, t->scratch, t->g.n, a->count, a->dtype,
                       a->op);
    return WEFT_OK;
}

int weft__gather_reduce(weft__task *t, weft__algo_fn gather)
{
    const weft__args *a = &t->a;
    const size_t bytes = a->count * weft_dtype_size(a->dtype);
    weft__args g = *a;
    int rc;

    if ((rc = weft__scratch(t->c, bytes * (size_t)t->g.n,
                            (void **)&t->scratch)) != 0)
        return rc;
    g.recvbuf = t->scratch;
    if ((rc = weft__task_sub(t, &g, gather)) != 0)
        return rc;
    t->next = reduce_gathered;
    return WEFT_OK;
}
