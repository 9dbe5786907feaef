/* Ring gather: along the two chains into the root (chains.c), each rank
 * sending its own block, then each block it receives from farther out. */
#include "ring/ring.h"

#include <string.h>

static void gather_fill(const weft__task *t, const weft__chain *ch,
                        weft__step *st, size_t bytes, char *scratch)
{
    const int q = ch->q;

    if (q == 0) {
        /* Step k brings the block of position k + 1. */
        for (int k = 0; k < ch->len; k++) {
            st[k].recv_dst = (char *)t->a.recvbuf +
                             (size_t)weft__chain_rank(t, ch, k + 1) * bytes;
            st[k].recv_len = bytes;
        }
        return;
    }
    st[0].send_buf = t->a.sendbuf;
    st[0].send_len = bytes;
    for (int k = 0; k < ch->len - q; k++) {
        st[k].recv_dst = scratch + (size_t)k * bytes;
        st[k].recv_len = bytes;
        st[k + 1].send_buf = scratch + (size_t)k * bytes;
        st[k + 1].send_len = bytes;
        st[k + 1].send_dep = k;
    }
}

int weft__ring_gather(weft__task *t)
{
    const weft__args *a = &t->a;
    const size_t bytes = a->count * weft_dtype_size(a->dtype);

    if (t->g.me == a->root) {
        char *own = (char *)a->recvbuf + (size_t)t->g.me * bytes;

        /* In place: sendbuf is the root's own block of recvbuf. */
        if ((const char *)a->sendbuf != own)
            memmove(own, a->sendbuf, bytes);
    }
    return weft__ring_chains_post(t, 1, gather_fill);
}
