/*
 * The two chains of the ring's gather and scatter: the ranks on each
 * side of the root, out to half of the ring, so each block goes the
 * shorter way round and crosses each cable of it once; see ring.h.
 */
#include "ring/ring.h"

int weft__chain_rank(const weft__task *t, const weft__chain *ch, int q)
{
    return weft__group_rank(&t->g,
                            weft__ring_mod(t->a.root + ch->sgn * q, t->g.n));
}

int weft__ring_chains_post(weft__task *t, int inward, weft__chain_fill_fn fill)
{
    const int n = t->g.n, me = t->g.me, root = t->a.root;
    const int right = n / 2, left = n - 1 - right;
    const int dist = weft__ring_mod(me - root, n);
    const size_t bytes = t->a.count * weft_dtype_size(t->a.dtype);
    weft__chain chains[2];
    int nchains = 0, rc;
    weft__op op;

    if (me == root) {
        chains[nchains++] = (weft__chain){+1, 0, right};
        if (left > 0)
            chains[nchains++] = (weft__chain){-1, 0, left};
    } else if (dist <= right) {
        chains[nchains++] = (weft__chain){+1, dist, right};
    } else {
        chains[nchains++] = (weft__chain){-1, n - dist, left};
    }
    if (me != root) {
        const weft__chain *ch = &chains[0];

        /* The blocks this rank passes on, one at a time. */
        if ((rc = weft__scratch(t->c, (size_t)(ch->len - ch->q + 1) * bytes,
                                (void **)&t->scratch)) != 0)
            return rc;
    }
    weft__op_init(&op, t->a.dtype, t->a.op);
    op.check = WEFT__CHECK_RING;
    for (int i = 0; i < nchains; i++) {
        const weft__chain *ch = &chains[i];
        const int q = ch->q;
        weft__lane *lane = &op.lanes[op.nlanes];
        weft__step *st =
            weft__op_steps(&op, op.nlanes, q == 0 ? ch->len : ch->len - q + 1);
        int toward = q == 0 ? -1 : weft__chain_rank(t, ch, q - 1);
        int away = q < ch->len ? weft__chain_rank(t, ch, q + 1) : -1;

        lane->send_peer = inward ? toward : away;
        lane->recv_peer = inward ? away : toward;
        /* The ring direction the data takes: 0 toward higher ranks. */
        lane->tag = inward ? ch->sgn > 0 : ch->sgn < 0;
        if (st != NULL)
            fill(t, ch, st, bytes, t->scratch);
        op.nlanes++;
    }
    return weft__task_pass(t, &op, NULL);
}
