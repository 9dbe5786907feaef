/* Ring reduce_scatter: n-1 pipelined steps of partial sums; see below for
 * where they live. */
#include "ring/ring.h"

#include <string.h>

typedef struct {
    const weft__args *a;
    char *scratch;
    int via_scratch;
} rs_ctx;

static void reduce_scatter_fill(weft__ctx *c, const weft__ring_lane *rl,
                                weft__lane *lane, weft__step *st, void *arg)
{
    const rs_ctx *x = arg;
    const int n = c->nranks;
    const size_t es = weft_dtype_size(x->a->dtype), bytes = x->a->count * es;
    const char *sb = x->a->sendbuf;

    (void)lane;
    for (int k = 0; k < n - 1; k++) {
        /* Send block v-k-1, receive block v-k-2 and reduce: after n-1
         * steps this rank holds its own block v, complete. */
        int sblk = weft__ring_real(weft__ring_mod(rl->v - k - 1, n), n, rl->d);
        int rblk = weft__ring_real(weft__ring_mod(rl->v - k - 2, n), n, rl->d);
        size_t so = (size_t)sblk * bytes + rl->off * es;
        size_t ro = (size_t)rblk * bytes + rl->off * es;
        int last = k == n - 2;

        st[k].send_buf = (k == 0 ? sb : x->scratch) + so;
        st[k].send_len = rl->m * es;
        st[k].send_dep = k - 1;
        st[k].recv_dst = last && !x->via_scratch
                             ? (char *)x->a->recvbuf + rl->off * es
                             : x->scratch + ro;
        st[k].recv_a = sb + ro;
        st[k].recv_len = rl->m * es;
    }
}

int weft__ring_reduce_scatter(weft__ctx *c, const weft__args *a)
{
    const int n = c->nranks;
    const size_t bytes = a->count * weft_dtype_size(a->dtype);
    const char *sb = a->sendbuf, *rb = a->recvbuf;
    rs_ctx x = {a, NULL, 0};
    int rc;

    /* Partial sums of other ranks' blocks live in scratch: sendbuf is the
     * caller's and stays untouched. A recvbuf inside sendbuf other than at
     * this rank's own block (recvbuf == sendbuf, say) could be written
     * while sendbuf is still being sent: then the result lands in scratch
     * (at the own block, which no other step uses) and is copied at the
     * end. */
    x.via_scratch = rb != sb + (size_t)c->rank * bytes &&
                    rb < sb + bytes * (size_t)n && rb + bytes > sb;
    if ((rc = weft__scratch(c, bytes * (size_t)n, (void **)&x.scratch)) != 0)
        return rc;
    rc =
        weft__ring_run(c, a, bytes * (size_t)n, n - 1, reduce_scatter_fill, &x);
    if (rc == WEFT_OK && x.via_scratch)
        memmove(a->recvbuf, x.scratch + (size_t)c->rank * bytes, bytes);
    return rc;
}
