/* Recursive halving + doubling all_reduce (Rabenseifner's); see coll.h.
 *
 * Why it is here: past the small sizes, the ring's reduce-scatter +
 * all-gather runs 2(n-1) steps, and each step waits for a message that
 * the step before it on the neighbour produced. Among the ranks of one
 * host that wait is a sleep and a wake-up of a process (or, oversubscribed,
 * a turn of the scheduler), so at 8-16 ranks a mid-size all_reduce costs
 * 14-30 such waits where this costs 2 log2(n) (+2). It moves the same
 * bytes as the ring: half the vector in the first round, a quarter in the
 * next, and so on, and back.
 *
 * The schedule is a pure function (weft__plan_halving, engine/plan.c, with
 * its unit test); here each round is one engine pass of at most one lane
 * (its peer both ways), reduced on arrival where the round reduces.
 * t->round is the round in flight. A round in which this rank has no peer
 * (a rank folded into its neighbour, in the middle rounds) is a pass with
 * no lanes: it completes at once, and keeps every rank's pass numbers, which
 * the headers carry, in step. */
#include "coll/coll.h"

#include "engine/plan.h"

static int halving_round(weft__task *t)
{
    const weft__args *a = &t->a;
    const size_t es = weft_dtype_size(a->dtype);
    const weft__halving_round hr =
        weft__plan_halving(a->count, t->g.n, t->g.me, t->round);
    /* Where this rank's own elements are: its input until the first round
     * that moves them, then its result buffer (in place, the same). */
    const char *own = hr.from_input ? a->sendbuf : a->recvbuf;
    char *rb = a->recvbuf;
    weft__op op;

    weft__op_init(&op, a->dtype, a->op);
    /* The next round sends what this one reduces, so a reducer thread
     * would only add its hand-off: measured on the 16-core host over
     * shared memory, 8 ranks, 512 KiB-2 MiB, 1.5-2.7 GB/s busbw with the
     * thread against 3.4-4.5 without. */
    op.inline_reduce = 1;
    if (hr.send_peer >= 0 || hr.recv_peer >= 0) {
        weft__step *st = weft__op_steps(&op, 0, 1);

        op.nlanes = 1;
        op.lanes[0].send_peer = weft__group_rank(&t->g, hr.send_peer);
        op.lanes[0].recv_peer = weft__group_rank(&t->g, hr.recv_peer);
        if (st != NULL) {
            st[0].send_buf = own + hr.send.off * es;
            st[0].send_len = hr.send.len * es;
            st[0].recv_dst = rb + hr.recv.off * es;
            st[0].recv_a = hr.reduce ? own + hr.recv.off * es : NULL;
            st[0].recv_len = hr.recv.len * es;
        }
    }
    if (++t->round < weft__plan_halving_rounds(t->g.n))
        t->next = halving_round;
    return weft__task_pass(t, &op, NULL);
}

int weft__halving_all_reduce(weft__task *t)
{
    t->round = 0;
    return halving_round(t);
}
