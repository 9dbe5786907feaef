/*
 * Point to point: the engine layer's send/recv between any two ranks. A
 * peer with direct wires is one engine lane; one without is reached
 * through the transport's relay, both halves of a sendrecv in one pass
 * under the call's one deadline.
 */
#include "engine/task.h"

#include "transport/transport.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

int weft__sendrecv_post(weft__task *t)
{
    weft__ctx *c = t->c;
    const weft__args *a = &t->a;
    int dst = a->dst, src = a->src;
    /* A peer with no wires to this rank is reached through the relay; the
     * halves with wires run as one lane of the engine. */
    int relay_dst = dst >= 0 && c->tpo->nwires(c->tp, dst) == 0;
    int relay_src = src >= 0 && c->tpo->nwires(c->tp, src) == 0;
    int ddst = relay_dst ? -1 : dst, dsrc = relay_src ? -1 : src;
    weft__relay relay = {a->sendbuf, relay_dst ? dst : -1,
                         a->recvbuf, relay_src ? src : -1,
                         0,          t->k->tag};
    const void *sendbuf = a->sendbuf;
    weft__op op;

    weft__op_init(&op, a->dtype, WEFT_SUM);
    relay.nbytes = a->count * op.esize;
    /* In place, or buffers that overlap: bytes may arrive (a peer sends
     * when it likes) before this rank's own have all left, so these leave
     * from a copy made now, once every earlier operation has ended (API:
     * an operation sees their results). */
    if (dst >= 0 && src >= 0 &&
        (uintptr_t)a->sendbuf < (uintptr_t)a->recvbuf + relay.nbytes &&
        (uintptr_t)a->recvbuf < (uintptr_t)a->sendbuf + relay.nbytes) {
        void *copy = malloc(relay.nbytes);

        /* Not the context's scratch: a collective may run beside. */
        if (copy == NULL)
            return weft__note(c, WEFT_ENOMEM,
                              "rank %d: %s: cannot allocate %zu bytes for a "
                              "copy of the data to send",
                              c->rank, t->k->name, relay.nbytes);
        t->owned = copy;
        memcpy(copy, a->sendbuf, relay.nbytes);
        sendbuf = copy;
        relay.sendbuf = copy;
    }
    if (ddst >= 0 || dsrc >= 0) {
        weft__step *st = weft__op_steps(&op, 0, 1);

        op.nlanes = 1;
        op.lanes[0].tag = t->k->tag; /* the messages' (match.c) */
        op.lanes[0].send_peer = ddst;
        op.lanes[0].recv_peer = dsrc;
        if (st != NULL) {
            if (ddst >= 0) {
                st[0].send_buf = sendbuf;
                st[0].send_len = relay.nbytes;
            }
            if (dsrc >= 0) {
                st[0].recv_dst = a->recvbuf;
                st[0].recv_len = relay.nbytes;
            }
        }
    }
    return weft__task_pass(t, &op, relay_dst || relay_src ? &relay : NULL);
}
