/* The barrier; see coll.h. */
#include "coll/coll.h"

int weft__barrier(weft__task *t, weft__algo_fn gather)
{
    const int n = t->g.n, me = t->g.me;
    uint8_t *flags;
    weft__args a = {0};
    int rc;

    if ((rc = weft__scratch(t->c, (size_t)n, (void **)&flags)) != 0)
        return rc;
    flags[me] = 1;
    a.sendbuf = flags + me;
    a.recvbuf = flags;
    a.count = 1;
    a.dtype = WEFT_UINT8;
    t->a = a;
    return gather(t);
}
