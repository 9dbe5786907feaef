/* What the ring's algorithms share: lanes, directions, virtual ranks. */
#include "ring/ring.h"

#include "engine/plan.h"

int weft__ring_mod(int a, int n)
{
    return ((a % n) + n) % n;
}

int weft__ring_real(int v, int n, int d)
{
    return d == 0 ? v : weft__ring_mod(n - v, n);
}

int weft__ring_post(weft__task *t, size_t nbytes, int nsteps,
                    weft__ring_fill_fn fill)
{
    const weft__ctx *c = t->c;
    const weft__args *a = &t->a;
    const weft__group *g = &t->g;
    const int n = g->n, me = g->me;
    weft__op op;
    size_t off = 0;

    weft__op_init(&op, a->dtype, a->op);
    op.check = WEFT__CHECK_RING;
    op.nlanes = n >= 3 && nbytes >= c->cfg->bidir_min_bytes ? 2 : 1;
    for (int d = 0; d < op.nlanes; d++) {
        weft__lane *lane = &op.lanes[d];
        weft__step *st = weft__op_steps(&op, d, nsteps);
        weft__ring_lane rl = {
            .d = d,
            .v = d == 0 ? me : weft__ring_mod(n - me, n),
            .m = op.nlanes == 1 ? a->count
                                : weft__plan_chunk(a->count, 2, d).len,
            .off = off,
        };

        /* Direction 0 sends right and receives from the left; 1 the
         * other way round. */
        lane->send_peer = weft__group_rank(g, (me + (d == 0 ? 1 : n - 1)) % n);
        lane->recv_peer = weft__group_rank(g, (me + (d == 0 ? n - 1 : 1)) % n);
        lane->tag = d;
        if (st != NULL)
            fill(t, &rl, lane, st);
        off += rl.m;
    }
    return weft__task_pass(t, &op, NULL);
}
