/* Ring broadcast: a pipelined chain from the root; with two lanes, one
 * chain each way around the ring, each carrying half of the buffer. */
#include "ring/ring.h"

static void broadcast_fill(const weft__task *t, const weft__ring_lane *rl,
                           weft__lane *lane, weft__step *st)
{
    const weft__args *a = &t->a;
    const int n = t->g.n, me = t->g.me;
    const size_t es = weft_dtype_size(a->dtype);
    char *b = a->recvbuf;
    int pos = rl->d == 0 ? weft__ring_mod(me - a->root, n)
                         : weft__ring_mod(a->root - me, n);

    if (pos == 0)
        lane->recv_peer = -1;
    if (pos == n - 1)
        lane->send_peer = -1;
    st[0].send_dep = -1;
    if (lane->send_peer >= 0) {
        st[0].send_buf = b + rl->off * es;
        st[0].send_len = rl->m * es;
        st[0].send_dep = pos == 0 ? -1 : 0;
    }
    if (lane->recv_peer >= 0) {
        st[0].recv_dst = b + rl->off * es;
        st[0].recv_len = rl->m * es;
    }
}

int weft__ring_broadcast(weft__task *t)
{
    return weft__ring_post(t, t->a.count * weft_dtype_size(t->a.dtype), 1,
                           broadcast_fill);
}
