/* The mesh's one exchange with every peer; see mesh.h. */
#include "mesh/mesh.h"

int weft__mesh_exchange(weft__task *t, const weft__peer_io *io)
{
    const weft__group *g = &t->g;
    weft__op op;

    weft__op_init(&op, t->a.dtype, t->a.op);
    /* Every peer, whether or not this rank exchanges data with it: the
     * root of a broadcast, say, depends on the call. */
    op.check = WEFT__CHECK_ALL;
    for (int p = 0; p < g->n; p++) {
        weft__lane *ln = &op.lanes[op.nlanes];
        weft__step *st;

        if (p == g->me || (io[p].send_len == 0 && io[p].recv_len == 0))
            continue;
        st = weft__op_steps(&op, op.nlanes, 1);
        ln->send_peer = io[p].send_len > 0 ? weft__group_rank(g, p) : -1;
        ln->recv_peer = io[p].recv_len > 0 ? weft__group_rank(g, p) : -1;
        if (st != NULL) {
            st[0].send_buf = io[p].send;
            st[0].send_len = io[p].send_len;
            st[0].recv_dst = io[p].recv;
            st[0].recv_len = io[p].recv_len;
        }
        op.nlanes++;
    }
    return weft__task_pass(t, &op, NULL);
}
