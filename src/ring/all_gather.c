/* Ring all_gather: n-1 pipelined steps, each passing on the block received
 * in the step before. */
#include "ring/ring.h"

#include <string.h>

static void all_gather_fill(const weft__task *t, const weft__ring_lane *rl,
                            weft__lane *lane, weft__step *st)
{
    const weft__args *a = &t->a;
    const int n = t->g.n;
    const size_t es = weft_dtype_size(a->dtype), bytes = a->count * es;
    char *rb = a->recvbuf;

    (void)lane;
    for (int k = 0; k < n - 1; k++) {
        int sblk = weft__ring_real(weft__ring_mod(rl->v - k, n), n, rl->d);
        int rblk = weft__ring_real(weft__ring_mod(rl->v - k - 1, n), n, rl->d);

        st[k].send_buf = rb + (size_t)sblk * bytes + rl->off * es;
        st[k].send_len = rl->m * es;
        st[k].send_dep = k - 1;
        st[k].recv_dst = rb + (size_t)rblk * bytes + rl->off * es;
        st[k].recv_len = rl->m * es;
    }
}

int weft__ring_all_gather(weft__task *t)
{
    const weft__args *a = &t->a;
    const size_t bytes = a->count * weft_dtype_size(a->dtype);
    char *own = (char *)a->recvbuf + (size_t)t->g.me * bytes;

    /* Every send reads recvbuf, so the rank's own block goes there first
     * (memmove: in the in-place forms the two may overlap). */
    if ((const char *)a->sendbuf != own)
        memmove(own, a->sendbuf, bytes);
    return weft__ring_post(t, bytes * (size_t)t->g.n, t->g.n - 1,
                           all_gather_fill);
}
