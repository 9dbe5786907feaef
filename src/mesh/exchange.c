/* The mesh's one exchange with every peer; see mesh.h. */
#include "mesh/mesh.h"

/* The single-step exchange's steps: io[p]. */
static void io_step(const weft__task *t, const void *arg, int p, int s,
                    weft__peer_io *io)
{
    (void)t;
    (void)s;
    *io = ((const weft__peer_io *)arg)[p];
}

int weft__mesh_exchange(weft__task *t, const weft__peer_io *io)
{
    return weft__mesh_exchange_steps(t, 1, io_step, io);
}

int weft__mesh_exchange_steps(weft__task *t, int nsteps,
                              weft__mesh_step_fn step, const void *arg)
{
    const weft__group *g = &t->g;
    weft__op op;

    weft__op_init(&op, t->a.dtype, t->a.op);
    /* Every peer, whether or not this rank exchanges data with it: the
     * root of a broadcast, say, depends on the call. */
    op.check = WEFT__CHECK_ALL;
    for (int p = 0; p < g->n; p++) {
        weft__lane *ln = &op.lanes[op.nlanes];
        weft__peer_io io;
        weft__step *st;
        size_t sends = 0, recvs = 0;

        if (p == g->me)
            continue;
        for (int s = 0; s < nsteps; s++) {
            step(t, arg, p, s, &io);
            sends += io.send_len;
            recvs += io.recv_len;
        }
        if (sends == 0 && recvs == 0)
            continue;
        st = weft__op_steps(&op, op.nlanes, nsteps);
        ln->send_peer = sends > 0 ? weft__group_rank(g, p) : -1;
        ln->recv_peer = recvs > 0 ? weft__group_rank(g, p) : -1;
        for (int s = 0; st != NULL && s < nsteps; s++) {
            step(t, arg, p, s, &io);
            st[s].send_buf = io.send;
            st[s].send_len = io.send_len;
            st[s].recv_dst = io.recv;
            st[s].recv_len = io.recv_len;
        }
        op.nlanes++;
    }
    return weft__task_pass(t, &op, NULL);
}
