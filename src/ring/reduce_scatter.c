/* Ring reduce_scatter: n-1 pipelined steps of partial sums; see below for
 * where they live. */
#include "ring/ring.h"

#include <string.h>

static void reduce_scatter_fill(const weft__task *t, const weft__ring_lane *rl,
                                weft__lane *lane, weft__step *st)
{
    const weft__args *a = &t->a;
    const int n = t->g.n;
    const size_t es = weft_dtype_size(a->dtype), bytes = a->count * es;
    const char *sb = a->sendbuf;

    (void)lane;
    for (int k = 0; k < n - 1; k++) {
        /* Send block v-k-1, receive block v-k-2 and reduce: after n-1
         * steps this rank holds its own block v, complete. */
        int sblk = weft__ring_real(weft__ring_mod(rl->v - k - 1, n), n, rl->d);
        int rblk = weft__ring_real(weft__ring_mod(rl->v - k - 2, n), n, rl->d);
        size_t so = (size_t)sblk * bytes + rl->off * es;
        size_t ro = (size_t)rblk * bytes + rl->off * es;
        int last = k == n - 2;

        st[k].send_buf = (k == 0 ? sb : t->scratch) + so;
        st[k].send_len = rl->m * es;
        st[k].send_dep = k - 1;
        st[k].recv_dst = last && !t->via_scratch
                             ? (char *)a->recvbuf + rl->off * es
                             : t->scratch + ro;
        st[k].recv_a = sb + ro;
        st[k].recv_len = rl->m * es;
    }
}

static int copy_result(weft__task *t)
{
    const size_t bytes = t->a.count * weft_dtype_size(t->a.dtype);

    memmove(t->a.recvbuf, t->scratch + (size_t)t->g.me * bytes, bytes);
    return WEFT_OK;
}

int weft__ring_reduce_scatter(weft__task *t)
{
    const int n = t->g.n;
    const size_t bytes = t->a.count * weft_dtype_size(t->a.dtype);
    const char *sb = t->a.sendbuf, *rb = t->a.recvbuf;
    int rc;

    /* Partial sums of other ranks' blocks live in scratch: sendbuf is the
     * caller's and stays untouched. A recvbuf inside sendbuf other than at
     * this rank's own block (recvbuf == sendbuf, say) could be written
     * while sendbuf is still being sent: then the result lands in scratch
     * (at the own block, which no other step uses) and is copied at the
     * end. */
    t->via_scratch = rb != sb + (size_t)t->g.me * bytes &&
                     rb < sb + bytes * (size_t)n && rb + bytes > sb;
    if ((rc = weft__scratch(t->c, bytes * (size_t)n, (void **)&t->scratch)) !=
        0)
        return rc;
    if (t->via_scratch)
        t->next = copy_result;
    return weft__ring_post(t, bytes * (size_t)n, n - 1, reduce_scatter_fill);
}
