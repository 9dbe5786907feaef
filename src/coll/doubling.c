/* Recursive doubling all_reduce; see coll.h.
 *
 * Both partners of a round compute lower OP upper, the same operands in the
 * same order, so every rank ends with the same bits. log2(n) dependent
 * exchanges of one message each, against one exchange of n-1 messages:
 * measured faster when ranks share one host's cores, so the selection table
 * uses it there; across the hosts of a mesh, one exchange costs one network
 * latency instead of log2(n). t->round is the round's bit, t->scratch the
 * partner's partial result. */
#include "coll/coll.h"

#include "base/kernels.h"

#include <string.h>

/* Swaps the partial result with the partner of round t->round. */
static int swap(weft__task *t)
{
    const weft__args *a = &t->a;
    const size_t bytes = a->count * weft_dtype_size(a->dtype);
    weft__op op;
    weft__step *st;

    weft__op_init(&op, a->dtype, a->op);
    op.nlanes = 1;
    st = weft__op_steps(&op, 0, 1);
    op.lanes[0].send_peer = weft__group_rank(&t->g, t->g.me ^ t->round);
    op.lanes[0].recv_peer = weft__group_rank(&t->g, t->g.me ^ t->round);
    if (st != NULL) {
        st[0].send_buf = a->recvbuf;
        st[0].send_len = bytes;
        st[0].recv_dst = t->scratch;
        st[0].recv_len = bytes;
    }
    return weft__task_pass(t, &op, NULL);
}

static int combine(weft__task *t)
{
    const weft__args *a = &t->a;

    if (t->g.me < (t->g.me ^ t->round))
        weft__reduce(a->recvbuf, t->scratch, a->count, a->dtype, a->op);
    else
        weft__reduce3(a->recvbuf, t->scratch, a->recvbuf, a->count, a->dtype,
                      a->op);
    t->round <<= 1;
    if (t->round >= t->g.n)
        return WEFT_OK;
    t->next = combine;
    return swap(t);
}

int weft__doubling_all_reduce(weft__task *t)
{
    const weft__args *a = &t->a;
    const size_t bytes = a->count * weft_dtype_size(a->dtype);
    int rc;

    if ((rc = weft__scratch(t->c, bytes, (void **)&t->scratch)) != 0)
        return rc;
    if (a->recvbuf != a->sendbuf)
        memcpy(a->recvbuf, a->sendbuf, bytes);
    t->round = 1;
    t->next = combine;
    return swap(t);
}
