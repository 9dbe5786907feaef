/*
 * Ring all_to_all and all_to_allv: one pass of two lanes, one each way
 * round the ring. Lane +1 carries each rank's blocks for the n/2 ranks
 * after it, lane -1 those for the ranks before it, so each block takes
 * the shorter way and crosses each cable of it once.
 *
 * On a lane of D distances every step moves one block to the next rank
 * that way. A rank first sends its own blocks, the farthest first (D
 * steps); then, group by group, those of the rank g before it that are
 * still on their way: group g (1 <= g < D) is what this rank received in
 * group g - 1, less the last block of it, which was this rank's own. So
 * the receive of group g, item j and the send of group g + 1, item j are
 * the same bytes of scratch, and the send leaves as they arrive
 * (send_dep), pipelined as the ring's other operations are. Blocks for
 * this rank land in recvbuf at once; only blocks passed on touch scratch.
 */
#include "ring/ring.h"

#include "coll/coll.h"

#include <stdlib.h>
#include <string.h>

/* Where the steps' bytes live: the send side's blocks (sendbuf, or its
 * copy in place), recvbuf, and scratch for the blocks passed on. */
typedef struct a2a_bufs {
    const char *send;
    char *recv;
    char *scratch;
    size_t used; /* of scratch, as the lanes are filled */
} a2a_bufs;

/* The first step of group g on a lane of d distances. */
static int group_at(int d, int g)
{
    return g * d - g * (g - 1) / 2;
}

static const char *send_at(const weft__task *t, const a2a_bufs *b, int to)
{
    const size_t es = weft_dtype_size(t->a.dtype);

    if (t->a.sendcounts == NULL)
        return b->send + (size_t)to * t->a.count * es;
    return t->a.sendcounts[to] > 0 ? b->send + t->a.sdispls[to] * es : NULL;
}

static char *recv_at(const weft__task *t, const a2a_bufs *b, int from)
{
    const size_t es = weft_dtype_size(t->a.dtype);

    if (t->a.sendcounts == NULL)
        return b->recv + (size_t)from * t->a.count * es;
    return t->a.recvcounts[from] > 0 ? b->recv + t->a.rdispls[from] * es : NULL;
}

/* The scratch bytes the lane of direction sgn over d distances needs. */
static size_t lane_scratch(const weft__task *t, int sgn, int d)
{
    const int n = t->g.n, me = t->g.me;
    size_t total = 0;

    for (int g = 0; g < d; g++) {
        int o = weft__ring_mod(me - sgn * (g + 1), n);

        for (int j = 0; j < d - 1 - g; j++)
            total += weft__all_to_all_bytes(
                t, o, weft__ring_mod(o + sgn * (d - j), n));
    }
    return total;
}

/* Fills the lane of direction sgn over d distances (d >= 1); returns
 * whether it moves anything. */
static int lane_fill(const weft__task *t, a2a_bufs *b, weft__lane *lane,
                     weft__step *st, int sgn, int d)
{
    const int n = t->g.n, me = t->g.me;
    size_t sends = 0, recvs = 0;

    for (int j = 0; j < d; j++) {
        int to = weft__ring_mod(me + sgn * (d - j), n);

        st[j].send_buf = send_at(t, b, to);
        st[j].send_len = weft__all_to_all_bytes(t, me, to);
        sends += st[j].send_len;
    }
    for (int g = 0; g < d; g++) {
        int o = weft__ring_mod(me - sgn * (g + 1), n);

        for (int j = 0; j < d - g; j++) {
            weft__step *r = &st[group_at(d, g) + j];
            int to = weft__ring_mod(o + sgn * (d - j), n);

            r->recv_len = weft__all_to_all_bytes(t, o, to);
            recvs += r->recv_len;
            if (j == d - 1 - g) { /* this rank's own */
                r->recv_dst = recv_at(t, b, o);
                continue;
            }
            r->recv_dst = r->recv_len > 0 ? b->scratch + b->used : NULL;
            b->used += r->recv_len;
            /* Passed on in the next group, as item j. */
            st[group_at(d, g + 1) + j].send_buf = r->recv_dst;
            st[group_at(d, g + 1) + j].send_len = r->recv_len;
            st[group_at(d, g + 1) + j].send_dep = group_at(d, g) + j;
            sends += r->recv_len;
        }
    }
    if (sends == 0)
        lane->send_peer = -1;
    if (recvs == 0)
        lane->recv_peer = -1;
    return sends > 0 || recvs > 0;
}

static int ring_data(weft__task *t)
{
    const int n = t->g.n, me = t->g.me;
    const int dists[2] = {n / 2, n - 1 - n / 2}, sgns[2] = {+1, -1};
    const size_t own = weft__all_to_all_bytes(t, me, me);
    a2a_bufs b = {t->a.sendbuf, t->a.recvbuf, NULL, 0};
    size_t need = 0;
    weft__op op;
    int rc;

    if (t->a.sendcounts != NULL && (rc = weft__all_to_allv_check(t)) != WEFT_OK)
        return rc;
    if (t->a.sendcounts == NULL && b.send == b.recv) {
        /* In place: a block may arrive before the one it overwrites has
         * left, so the sends leave from a copy. */
        size_t all = own * (size_t)n;

        if ((t->owned = malloc(all)) == NULL)
            return weft__note(t->c, WEFT_ENOMEM,
                              "rank %d: %s: cannot allocate %zu bytes for a "
                              "copy of the data to send",
                              t->c->rank, t->k->name, all);
        memcpy(t->owned, b.send, all);
        b.send = t->owned;
    } else if (own > 0) {
        memcpy(recv_at(t, &b, me), send_at(t, &b, me), own);
    }
    for (int i = 0; i < 2; i++)
        need += lane_scratch(t, sgns[i], dists[i]);
    if ((rc = weft__scratch(t->c, need + 1, (void **)&b.scratch)) != 0)
        return rc;
    weft__op_init(&op, t->a.dtype, t->a.op);
    op.check = WEFT__CHECK_RING;
    for (int i = 0; i < 2; i++) {
        const int d = dists[i], sgn = sgns[i];
        weft__lane *lane = &op.lanes[op.nlanes];
        weft__step *st;

        if (d == 0)
            continue;
        st = weft__op_steps(&op, op.nlanes, d * (d + 1) / 2);
        lane->send_peer = weft__group_rank(&t->g, weft__ring_mod(me + sgn, n));
        lane->recv_peer = weft__group_rank(&t->g, weft__ring_mod(me - sgn, n));
        lane->tag = i;
        if (st == NULL || lane_fill(t, &b, lane, st, sgn, d)) {
            op.nlanes++;
        } else {
            /* Nothing either way on this lane (all_to_allv's zeros). */
            free(st);
            *lane = (weft__lane){0};
        }
    }
    return weft__task_pass(t, &op, NULL);
}

int weft__ring_all_to_all(weft__task *t)
{
    return ring_data(t);
}

int weft__ring_all_to_allv(weft__task *t)
{
    return weft__all_to_allv_counts(t, weft__ring_all_gather, ring_data);
}
