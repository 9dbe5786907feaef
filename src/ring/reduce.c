/* Ring reduce: a pipelined chain that ends at the root; with two lanes,
 * one chain each way around the ring, each on half of the buffer. */
#include "ring/ring.h"

static void reduce_fill(const weft__task *t, const weft__ring_lane *rl,
                        weft__lane *lane, weft__step *st)
{
    const weft__args *a = &t->a;
    const int n = t->g.n, me = t->g.me, root = a->root;
    const size_t es = weft_dtype_size(a->dtype), at = rl->off * es;
    const char *sb = a->sendbuf;
    /* The chain starts next to the root, away from it, and ends there:
     * position 0 sends its input, each next one reduces what came with
     * its own and passes it on, the root (n - 1) keeps the result. */
    int pos = rl->d == 0 ? weft__ring_mod(me - root - 1, n)
                         : weft__ring_mod(root - me - 1, n);

    if (pos == 0)
        lane->recv_peer = -1;
    if (pos == n - 1)
        lane->send_peer = -1;
    if (lane->recv_peer >= 0) {
        st[0].recv_dst = (pos == n - 1 ? (char *)a->recvbuf : t->scratch) + at;
        st[0].recv_a = sb + at;
        st[0].recv_len = rl->m * es;
    }
    if (lane->send_peer >= 0) {
        st[0].send_buf = (pos == 0 ? sb : t->scratch) + at;
        st[0].send_len = rl->m * es;
        st[0].send_dep = pos == 0 ? -1 : 0;
    }
}

int weft__ring_reduce(weft__task *t)
{
    const size_t bytes = t->a.count * weft_dtype_size(t->a.dtype);
    int rc;

    /* The partial results off the root pass through scratch: sendbuf is
     * the caller's, and the others have no recvbuf. */
    if (t->g.me != t->a.root &&
        (rc = weft__scratch(t->c, bytes, (void **)&t->scratch)) != 0)
        return rc;
    return weft__ring_post(t, bytes, 1, reduce_fill);
}
