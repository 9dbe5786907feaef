/* Direct algorithms; see direct.h. */
#include "mesh/direct.h"

#include "core/engine.h"
#include "core/kernels.h"
#include "mesh/mesh.h"
#include "transport/transport.h"

#include <string.h>

int weft__sendrecv(weft__ctx *c, const char *name, const void *sendbuf,
                   int dst, void *recvbuf, int src, size_t count, weft_dtype dt)
{
    /* A peer with no wires to this rank is reached through the relay; the
     * halves with wires run as one lane of the engine. */
    int relay_dst = dst >= 0 && c->tpo->nwires(c->tp, dst) == 0;
    int relay_src = src >= 0 && c->tpo->nwires(c->tp, src) == 0;
    int ddst = relay_dst ? -1 : dst, dsrc = relay_src ? -1 : src;
    weft__op op;

    weft__op_init(&op, WEFT__OP_P2P, name, dt, WEFT_SUM);
    if (ddst >= 0 || dsrc >= 0) {
        weft__step *st = weft__op_steps(&op, 0, 1);

        op.nlanes = 1;
        op.lanes[0].send_peer = ddst;
        op.lanes[0].recv_peer = dsrc;
        if (st != NULL) {
            if (ddst >= 0) {
                st[0].send_buf = sendbuf;
                st[0].send_len = count * op.esize;
            }
            if (dsrc >= 0) {
                st[0].recv_dst = recvbuf;
                st[0].recv_len = count * op.esize;
            }
        }
    }
    /* Without steps op_run reports WEFT_ENOMEM (and frees nothing else). */
    if ((!relay_dst && !relay_src) ||
        (op.nlanes > 0 && op.lanes[0].steps == NULL))
        return weft__op_run(c, &op);
    return weft__engine_relay(c, name, sendbuf, relay_dst ? dst : -1, recvbuf,
                              relay_src ? src : -1, count * op.esize,
                              op.nlanes > 0 ? &op : NULL);
}

int weft__direct_ok(const weft__ctx *c)
{
    if (c->nranks > WEFT__MESH_MAX_RANKS ||
        strcmp(c->cfg->topology, "ring") == 0)
        return 0;
    for (int p = 0; p < c->nranks; p++)
        if (p != c->rank && c->tpo->nwires(c->tp, p) == 0)
            return 0;
    return 1;
}

int weft__mesh_ok(const weft__ctx *c)
{
    return c->cfg->mesh && weft__direct_ok(c);
}

/* Recursive doubling for a power-of-two job: in round k each rank swaps
 * its partial result with rank ^ 2^k, and both compute lower OP upper, the
 * same operands in the same order, so every rank ends with the same bits.
 * log2(n) dependent exchanges of one message each, against one exchange of
 * n-1 messages: measured faster when ranks share one host's cores, so it is
 * used there (the ring topology with every pair joined); across the hosts
 * of a mesh, one exchange costs one network latency instead of log2(n). */
static int all_reduce_doubling(weft__ctx *c, const void *sendbuf,
                               void *recvbuf, size_t count, weft_dtype dt,
                               weft_redop redop)
{
    const size_t bytes = count * weft_dtype_size(dt);
    char *peer_part;
    int rc;

    if ((rc = weft__scratch(c, bytes, (void **)&peer_part)) != 0)
        return rc;
    if (recvbuf != sendbuf)
        memcpy(recvbuf, sendbuf, bytes);
    for (int bit = 1; bit < c->nranks; bit <<= 1) {
        int partner = c->rank ^ bit;
        weft__op op;
        weft__step *st;

        weft__op_init(&op, WEFT__OP_ALL_REDUCE, "all_reduce", dt, redop);
        op.nlanes = 1;
        st = weft__op_steps(&op, 0, 1);
        op.lanes[0].send_peer = partner;
        op.lanes[0].recv_peer = partner;
        if (st != NULL) {
            st[0].send_buf = recvbuf;
            st[0].send_len = bytes;
            st[0].recv_dst = peer_part;
            st[0].recv_len = bytes;
        }
        if ((rc = weft__op_run(c, &op)) != 0)
            return rc;
        if (c->rank < partner)
            weft__reduce(recvbuf, peer_part, count, dt, redop);
        else
            weft__reduce3(recvbuf, peer_part, recvbuf, count, dt, redop);
    }
    return WEFT_OK;
}

int weft__direct_all_reduce(weft__ctx *c, const void *sendbuf,
                            void *recvbuf, size_t count, weft_dtype dt,
                            weft_redop redop)
{
    const size_t bytes = count * weft_dtype_size(dt);
    char *all;
    int rc;

    if (!c->cfg->mesh && (c->nranks & (c->nranks - 1)) == 0)
        return all_reduce_doubling(c, sendbuf, recvbuf, count, dt, redop);

    if ((rc = weft__scratch(c, bytes * (size_t)c->nranks, (void **)&all)) != 0)
        return rc;
    rc = weft__mesh_all_gather(c, sendbuf, all, count, dt, WEFT__OP_ALL_REDUCE,
                               "all_reduce");
    if (rc != 0)
        return rc;
    weft__reduce_ranks(recvbuf, all, c->nranks, count, dt, redop);
    return WEFT_OK;
}

int weft__direct_barrier(weft__ctx *c)
{
    char *flags;
    int rc;

    if ((rc = weft__scratch(c, (size_t)c->nranks, (void **)&flags)) != 0)
        return rc;
    flags[c->rank] = 1;
    return weft__mesh_all_gather(c, flags + c->rank, flags, 1, WEFT_UINT8,
                                 WEFT__OP_BARRIER, "barrier");
}
