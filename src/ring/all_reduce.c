/*
 * Ring all_reduce, large counts: reduce-scatter then all-gather around the
 * ring, 2n-2 pipelined steps (step k's frames leave as the frames of step
 * k-1 they depend on arrive). Small counts go through weft__gather_reduce
 * (the selection table decides).
 */
#include "ring/ring.h"

#include "engine/plan.h"

static void all_reduce_fill(const weft__task *t, const weft__ring_lane *rl,
                            weft__lane *lane, weft__step *st)
{
    const weft__args *a = &t->a;
    const int n = t->g.n;
    const size_t es = weft_dtype_size(a->dtype);
    const char *sb = a->sendbuf;
    char *rb = a->recvbuf;

    (void)lane;
    for (int k = 0; k < 2 * n - 2; k++) {
        int rs = k < n - 1, j = k - (n - 1);
        /* Reduce-scatter: send chunk v-k, receive v-k-1 and reduce it.
         * All-gather: send chunk v+1-j, receive chunk v-j as is. */
        weft__region sc = weft__plan_chunk(
            rl->m, n, weft__ring_mod(rs ? rl->v - k : rl->v + 1 - j, n));
        weft__region rcv = weft__plan_chunk(
            rl->m, n, weft__ring_mod(rs ? rl->v - k - 1 : rl->v - j, n));
        size_t so = (rl->off + sc.off) * es, ro = (rl->off + rcv.off) * es;

        st[k].send_buf = (k == 0 ? sb : rb) + so;
        st[k].send_len = sc.len * es;
        st[k].send_dep = k - 1;
        st[k].recv_dst = rb + ro;
        st[k].recv_a = rs ? sb + ro : NULL;
        st[k].recv_len = rcv.len * es;
    }
}

int weft__ring_all_reduce(weft__task *t)
{
    return weft__ring_post(t, t->a.count * weft_dtype_size(t->a.dtype),
                           2 * t->g.n - 2, all_reduce_fill);
}
