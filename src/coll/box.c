/* The small all_reduce, all_gather and the barrier through the box; see
 * coll.h. */
#include "coll/coll.h"

#include "base/kernels.h"

#include <assert.h>
#include <string.h>

/* Starts a box pass that gathers every rank's len bytes of data into
 * scratch (rank order), then runs next. */
static int box_gather(weft__task *t, const void *data, size_t len,
                      weft__task_fn next)
{
    int rc;

    assert(t->g.n == t->c->nranks);
    if ((rc = weft__scratch(t->c, len * (size_t)t->g.n,
                            (void **)&t->scratch)) != 0)
        return rc;
    if ((rc = weft__box_start(t->c, t->k, data, len, t->scratch, &t->pass)) !=
        0)
        return rc;
    t->next = next;
    return WEFT_OK;
}

static int reduce_boxed(weft__task *t)
{
    const weft__args *a = &t->a;

    weft__reduce_ranks(a->recvbuf, t->scratch, t->g.n, a->count, a->dtype,
                       a->op);
    return WEFT_OK;
}

int weft__box_all_reduce(weft__task *t)
{
    return box_gather(t, t->a.sendbuf, t->a.count * weft_dtype_size(t->a.dtype),
                      reduce_boxed);
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

/* Once every rank's buffer is in scratch: the root's, into this rank's. */
static int take_root(weft__task *t)
{
    const weft__args *a = &t->a;
    const size_t bytes = a->count * weft_dtype_size(a->dtype);

    if (t->g.me != a->root)
        memcpy(a->recvbuf, t->scratch + (size_t)a->root * bytes, bytes);
    return WEFT_OK;
}

int weft__box_broadcast(weft__task *t)
{
    /* Every rank publishes its buffer (the same length, so that every
     * header compares whole, the root among them); only the root's is
     * used. */
    return box_gather(t, t->a.recvbuf, t->a.count * weft_dtype_size(t->a.dtype),
                      take_root);
}

/* Once every rank's whole input is in scratch: this rank's block of each,
 * reduced in rank order. */
static int reduce_own_block(weft__task *t)
{
    const weft__args *a = &t->a;
    const size_t bytes = a->count * weft_dtype_size(a->dtype);
    const size_t input = bytes * (size_t)t->g.n;
    const char *mine = t->scratch + (size_t)t->g.me * bytes;

    memcpy(a->recvbuf, mine, bytes);
    for (int r = 1; r < t->g.n; r++)
        weft__reduce3(a->recvbuf, a->recvbuf, mine + (size_t)r * input,
                      a->count, a->dtype, a->op);
    return WEFT_OK;
}

int weft__box_reduce_scatter(weft__task *t)
{
    return box_gather(t, t->a.sendbuf,
                      t->a.count * weft_dtype_size(t->a.dtype) * (size_t)t->g.n,
                      reduce_own_block);
}

int weft__box_barrier(weft__task *t)
{
    assert(t->g.n == t->c->nranks);
    return weft__box_start(t->c, t->k, NULL, 0, NULL, &t->pass);
}
