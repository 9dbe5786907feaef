/*
 * Point to point: the engine layer's send/recv between any two ranks. A
 * peer with direct wires is one engine lane; one without is reached
 * through the transport's relay (weft__engine_relay), both halves of a
 * sendrecv at once under the call's one deadline.
 */
#include "engine/engine.h"

#include "transport/transport.h"

int weft__sendrecv(weft__ctx *c, const void *sendbuf, int dst, void *recvbuf,
                   int src, size_t count, weft_dtype dt)
{
    /* A peer with no wires to this rank is reached through the relay; the
     * halves with wires run as one lane of the engine. */
    int relay_dst = dst >= 0 && c->tpo->nwires(c->tp, dst) == 0;
    int relay_src = src >= 0 && c->tpo->nwires(c->tp, src) == 0;
    int ddst = relay_dst ? -1 : dst, dsrc = relay_src ? -1 : src;
    weft__op op;

    weft__op_init(&op, dt, WEFT_SUM);
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
    return weft__engine_relay(c, sendbuf, relay_dst ? dst : -1, recvbuf,
                              relay_src ? src : -1, count * op.esize,
                              op.nlanes > 0 ? &op : NULL);
}
