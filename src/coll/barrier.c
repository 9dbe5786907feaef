/* The barrier; see coll.h. */
#include "coll/coll.h"

int weft__barrier(weft__ctx *c, weft__algo_fn gather)
{
    uint8_t *flags;
    weft__args a = {0};
    int rc;

    if ((rc = weft__scratch(c, (size_t)c->nranks, (void **)&flags)) != 0)
        return rc;
    flags[c->rank] = 1;
    a.sendbuf = flags + c->rank;
    a.recvbuf = flags;
    a.count = 1;
    a.dtype = WEFT_UINT8;
    return gather(c, &a);
}
