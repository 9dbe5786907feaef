/* Recursive doubling all_reduce; see coll.h.
 *
 * Both partners of a round compute lower OP upper, the same operands in the
 * same order, so every rank ends with the same bits. log2(n) dependent
 * exchanges of one message each, against one exchange of n-1 messages:
 * measured faster when ranks share one host's cores, so the selection table
 * uses it there; across the hosts of a mesh, one exchange costs one network
 * latency instead of log2(n). */
#include "coll/coll.h"

#include "base/kernels.h"

#include <string.h>

int weft__doubling_all_reduce(weft__ctx *c, const weft__args *a)
{
    const size_t bytes = a->count * weft_dtype_size(a->dtype);
    char *peer_part;
    int rc;

    if ((rc = weft__scratch(c, bytes, (void **)&peer_part)) != 0)
        return rc;
    if (a->recvbuf != a->sendbuf)
        memcpy(a->recvbuf, a->sendbuf, bytes);
    for (int bit = 1; bit < c->nranks; bit <<= 1) {
        int partner = c->rank ^ bit;
        weft__op op;
        weft__step *st;

        weft__op_init(&op, a->dtype, a->op);
        op.nlanes = 1;
        st = weft__op_steps(&op, 0, 1);
        op.lanes[0].send_peer = partner;
        op.lanes[0].recv_peer = partner;
        if (st != NULL) {
            st[0].send_buf = a->recvbuf;
            st[0].send_len = bytes;
            st[0].recv_dst = peer_part;
            st[0].recv_len = bytes;
        }
        if ((rc = weft__op_run(c, &op)) != 0)
            return rc;
        if (c->rank < partner)
            weft__reduce(a->recvbuf, peer_part, a->count, a->dtype, a->op);
        else
            weft__reduce3(a->recvbuf, peer_part, a->recvbuf, a->count, a->dtype,
                          a->op);
    }
    return WEFT_OK;
}
