/* Ring scatter: along the two chains out of the root (chains.c), the
 * farthest block first, each rank passing on every block but its own. */
#include "ring/ring.h"

#include <string.h>

static void scatter_fill(const weft__task *t, const weft__chain *ch,
                         weft__step *st, size_t bytes, char *scratch)
{
    const int q = ch->q;

    if (q == 0) {
        /* Step k carries the block of position len - k. */
        for (int k = 0; k < ch->len; k++) {
            st[k].send_buf =
                (const char *)t->a.sendbuf +
                (size_t)weft__chain_rank(t, ch, ch->len - k) * bytes;
            st[k].send_len = bytes;
        }
        return;
    }
    for (int k = 0; k <= ch->len - q; k++) {
        st[k].recv_len = bytes;
        if (k == ch->len - q) {
            st[k].recv_dst = t->a.recvbuf;
            break;
        }
        st[k].recv_dst = scratch + (size_t)k * bytes;
        st[k].send_buf = scratch + (size_t)k * bytes;
        st[k].send_len = bytes;
        st[k].send_dep = k;
    }
}

int weft__ring_scatter(weft__task *t)
{
    const weft__args *a = &t->a;
    const size_t bytes = a->count * weft_dtype_size(a->dtype);

    if (t->g.me == a->root) {
        const char *own = (const char *)a->sendbuf + (size_t)t->g.me * bytes;

        /* In place: recvbuf is the root's own block of sendbuf. */
        if ((char *)a->recvbuf != own)
            memmove(a->recvbuf, own, bytes);
    }
    return weft__ring_chains_post(t, 0, scatter_fill);
}
