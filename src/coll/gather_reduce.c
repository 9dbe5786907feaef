/* The small all_reduce by gathering every input; see coll.h. */
#include "coll/coll.h"

#include "base/kernels.h"

int weft__gather_reduce(weft__ctx *c, const weft__args *a, weft__algo_fn gather)
{
    const size_t bytes = a->count * weft_dtype_size(a->dtype);
    weft__args g = *a;
    char *all;
    int rc;

    if ((rc = weft__scratch(c, bytes * (size_t)c->nranks, (void **)&all)) != 0)
        return rc;
    g.recvbuf = all;
    if ((rc = gather(c, &g)) != 0)
        return rc;
    weft__reduce_ranks(a->recvbuf, all, c->nranks, a->count, a->dtype, a->op);
    return WEFT_OK;
}
