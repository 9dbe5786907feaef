/* The small all_reduce by gathering every input; see coll.h. */
#include "coll/coll.h"

#include "base/kernels.h"

#include <stdlib.h>

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

/* The small reduce: the inputs gathered on the root, reduced there. */
static int reduce_on_root(weft__task *t)
{
    const weft__args *a = &t->a;

    if (t->g.me == a->root)
        weft__reduce_ranks(a->recvbuf, t->owned, t->g.n, a->count, a->dtype,
                           a->op);
    return WEFT_OK;
}

int weft__gather_reduce_root(weft__task *t, weft__algo_fn gather)
{
    const weft__args *a = &t->a;
    const size_t bytes = a->count * weft_dtype_size(a->dtype);
    weft__args g = *a;
    int rc;

    g.recvbuf = NULL;
    if (t->g.me == a->root) {
        /* Not the context's scratch: the ring's gather forwards through
         * it (on the other ranks, but one rule is simpler). */
        if ((t->owned = malloc(bytes * (size_t)t->g.n)) == NULL)
            return weft__note(t->c, WEFT_ENOMEM,
                              "rank %d: %s: cannot allocate %zu bytes",
                              t->c->rank, t->k->name, bytes * (size_t)t->g.n);
        g.recvbuf = t->owned;
    }
    if ((rc = weft__task_sub(t, &g, gather)) != WEFT_OK)
        return rc;
    t->next = reduce_on_root;
    return WEFT_OK;
}
