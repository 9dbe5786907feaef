/*
 * Ring algorithms: which bytes go to which neighbour at each step.
 *
 * Each algorithm fills lanes of steps for the engine. Large operations run
 * two lanes at once, one around the ring in each direction, each on half of
 * the data, so both directions of every link carry load. A lane in the
 * reverse direction is the forward algorithm on "virtual" ranks
 * v = (n - rank) % n, whose right neighbour is the real left one.
 *
 * Chunks are whole elements, cut by weft__plan_chunk.
 */
#include "ring/ring.h"

#include "core/engine.h"
#include "core/kernels.h"
#include "core/plan.h"

#include <stdlib.h>
#include <string.h>

static int mod(int a, int n)
{
    return ((a % n) + n) % n;
}

/* Real rank of virtual rank v in direction d. */
static int real_rank(int v, int n, int d)
{
    return d == 0 ? v : mod(n - v, n);
}

static int lanes_for(const weft__ctx *c, size_t nbytes)
{
    return c->nranks >= 3 && nbytes >= c->cfg->bidir_min_bytes ? 2 : 1;
}

/* Sets the neighbours of lane d: direction 0 sends right, 1 sends left. */
static void lane_peers(const weft__ctx *c, weft__lane *ln, int d)
{
    int right = (c->rank + 1) % c->nranks;
    int left = (c->rank + c->nranks - 1) % c->nranks;

    ln->send_peer = d == 0 ? right : left;
    ln->recv_peer = d == 0 ? left : right;
    ln->tag = d;
}

/* Small all_reduce: every rank gathers every input (n-1 steps instead of
 * 2n-2) and reduces them locally in rank order 0, 1, ..., n-1, the same
 * order on every rank, so the results are bitwise identical. */
static int all_reduce_small(weft__ctx *c, const void *sendbuf,
                            void *recvbuf, size_t count, weft_dtype dt,
                            weft_redop redop)
{
    const size_t bytes = count * weft_dtype_size(dt);
    char *all;
    int rc;

    if ((rc = weft__scratch(c, bytes * (size_t)c->nranks, (void **)&all)) != 0)
        return rc;
    rc = weft__ring_all_gather(c, sendbuf, all, count, dt, WEFT__OP_ALL_REDUCE,
                               "all_reduce");
    if (rc != 0)
        return rc;
    weft__reduce_ranks(recvbuf, all, c->nranks, count, dt, redop);
    return WEFT_OK;
}

int weft__ring_all_reduce(weft__ctx *c, const void *sendbuf,
                          void *recvbuf, size_t count, weft_dtype dt,
                          weft_redop redop)
{
    const int n = c->nranks;
    const size_t es = weft_dtype_size(dt);
    const char *sb = sendbuf;
    char *rb = recvbuf;
    weft__op op;
    size_t lane_off = 0;

    if (count * es * (size_t)n <= c->cfg->small_all_reduce_bytes)
        return all_reduce_small(c, sendbuf, recvbuf, count, dt, redop);
    weft__op_init(&op, WEFT__OP_ALL_REDUCE, "all_reduce", dt, redop);
    op.check = WEFT__CHECK_RING;
    op.nlanes = lanes_for(c, count * es);
    for (int d = 0; d < op.nlanes; d++) {
        /* Lane d reduces elements [lane_off, lane_off + m). */
        size_t m = op.nlanes == 1 ? count : weft__plan_chunk(count, 2, d).len;
        int v = d == 0 ? c->rank : mod(n - c->rank, n);
        weft__step *st = weft__op_steps(&op, d, 2 * n - 2);

        lane_peers(c, &op.lanes[d], d);
        if (st == NULL)
            continue;
        for (int k = 0; k < 2 * n - 2; k++) {
            int rs = k < n - 1, j = k - (n - 1);
            /* Reduce-scatter: send chunk v-k, receive v-k-1 and reduce it.
             * All-gather: send chunk v+1-j, receive chunk v-j as is. */
            weft__region sc =
                weft__plan_chunk(m, n, mod(rs ? v - k : v + 1 - j, n));
            weft__region rcv =
                weft__plan_chunk(m, n, mod(rs ? v - k - 1 : v - j, n));
            size_t so = (lane_off + sc.off) * es,
                   ro = (lane_off + rcv.off) * es;

            st[k].send_buf = (k == 0 ? sb : rb) + so;
            st[k].send_len = sc.len * es;
            st[k].send_dep = k - 1;
            st[k].recv_dst = rb + ro;
            st[k].recv_a = rs ? sb + ro : NULL;
            st[k].recv_len = rcv.len * es;
        }
        lane_off += m;
    }
    return weft__op_run(c, &op);
}

int weft__ring_all_gather(weft__ctx *c, const void *sendbuf,
                          void *recvbuf, size_t count, weft_dtype dt, int kind,
                          const char *name)
{
    const int n = c->nranks;
    const size_t es = weft_dtype_size(dt), bytes = count * es;
    char *rb = recvbuf;
    weft__op op;
    size_t lane_off = 0;

    /* Every send reads recvbuf, so the rank's own block goes there first
     * (memmove: in the in-place forms the two may overlap). */
    if ((const char *)sendbuf != rb + (size_t)c->rank * bytes)
        memmove(rb + (size_t)c->rank * bytes, sendbuf, bytes);
    weft__op_init(&op, kind, name, dt, WEFT_SUM);
    op.check = WEFT__CHECK_RING;
    op.nlanes = lanes_for(c, bytes * (size_t)n);
    for (int d = 0; d < op.nlanes; d++) {
        /* Lane d moves elements [lane_off, lane_off + m) of every block. */
        size_t m = op.nlanes == 1 ? count : weft__plan_chunk(count, 2, d).len;
        int v = d == 0 ? c->rank : mod(n - c->rank, n);
        weft__step *st = weft__op_steps(&op, d, n - 1);

        lane_peers(c, &op.lanes[d], d);
        if (st == NULL)
            continue;
        for (int k = 0; k < n - 1; k++) {
            int sblk = real_rank(mod(v - k, n), n, d);
            int rblk = real_rank(mod(v - k - 1, n), n, d);

            st[k].send_buf = rb + (size_t)sblk * bytes + lane_off * es;
            st[k].send_len = m * es;
            st[k].send_dep = k - 1;
            st[k].recv_dst = rb + (size_t)rblk * bytes + lane_off * es;
            st[k].recv_len = m * es;
        }
        lane_off += m;
    }
    return weft__op_run(c, &op);
}

int weft__ring_reduce_scatter(weft__ctx *c, const void *sendbuf,
                              void *recvbuf, size_t recvcount, weft_dtype dt,
                              weft_redop redop)
{
    const int n = c->nranks;
    const size_t es = weft_dtype_size(dt), bytes = recvcount * es;
    const char *sb = sendbuf;
    char *scratch;
    weft__op op;
    size_t lane_off = 0;
    int rc;

    /* Partial sums of other ranks' blocks live in scratch: sendbuf is the
     * caller's and stays untouched. A recvbuf inside sendbuf other than at
     * this rank's own block (recvbuf == sendbuf, say) could be written while
     * sendbuf is still being sent: then the result lands in scratch (at the
     * own block, which no other step uses) and is copied at the end. */
    const char *rb = recvbuf;
    int via_scratch = rb != sb + (size_t)c->rank * bytes &&
                      rb < sb + bytes * (size_t)n && rb + bytes > sb;
    if ((rc = weft__scratch(c, bytes * (size_t)n, (void **)&scratch)) != 0)
        return rc;
    weft__op_init(&op, WEFT__OP_REDUCE_SCATTER, "reduce_scatter", dt, redop);
    op.check = WEFT__CHECK_RING;
    op.nlanes = lanes_for(c, bytes * (size_t)n);
    for (int d = 0; d < op.nlanes; d++) {
        size_t m =
            op.nlanes == 1 ? recvcount : weft__plan_chunk(recvcount, 2, d).len;
        int v = d == 0 ? c->rank : mod(n - c->rank, n);
        weft__step *st = weft__op_steps(&op, d, n - 1);

        lane_peers(c, &op.lanes[d], d);
        if (st == NULL)
            continue;
        for (int k = 0; k < n - 1; k++) {
            /* Send block v-k-1, receive block v-k-2 and reduce: after n-1
             * steps this rank holds its own block v, complete. */
            int sblk = real_rank(mod(v - k - 1, n), n, d);
            int rblk = real_rank(mod(v - k - 2, n), n, d);
            size_t so = (size_t)sblk * bytes + lane_off * es;
            size_t ro = (size_t)rblk * bytes + lane_off * es;
            int last = k == n - 2;

            st[k].send_buf = (k == 0 ? sb : scratch) + so;
            st[k].send_len = m * es;
            st[k].send_dep = k - 1;
            st[k].recv_dst = last && !via_scratch
                                 ? (char *)recvbuf + lane_off * es
                                 : scratch + ro;
            st[k].recv_a = sb + ro;
            st[k].recv_len = m * es;
        }
        lane_off += m;
    }
    rc = weft__op_run(c, &op);
    if (rc == WEFT_OK && via_scratch)
        memmove(recvbuf, scratch + (size_t)c->rank * bytes, bytes);
    return rc;
}

int weft__ring_broadcast(weft__ctx *c, void *buf, size_t count,
                         weft_dtype dt, int root)
{
    const int n = c->nranks;
    const size_t es = weft_dtype_size(dt);
    char *b = buf;
    weft__op op;
    size_t lane_off = 0;

    /* A pipelined chain from the root; with two lanes, one chain each way
     * around the ring, each carrying half of the buffer. */
    weft__op_init(&op, WEFT__OP_BROADCAST, "broadcast", dt, WEFT_SUM);
    op.check = WEFT__CHECK_RING;
    op.nlanes = lanes_for(c, count * es);
    for (int d = 0; d < op.nlanes; d++) {
        size_t m = op.nlanes == 1 ? count : weft__plan_chunk(count, 2, d).len;
        int pos = d == 0 ? mod(c->rank - root, n) : mod(root - c->rank, n);
        weft__step *st = weft__op_steps(&op, d, 1);
        weft__lane *ln = &op.lanes[d];

        lane_peers(c, ln, d);
        if (pos == 0)
            ln->recv_peer = -1;
        if (pos == n - 1)
            ln->send_peer = -1;
        if (st == NULL)
            continue;
        if (ln->send_peer >= 0) {
            st[0].send_buf = b + lane_off * es;
            st[0].send_len = m * es;
            st[0].send_dep = pos == 0 ? -1 : 0;
        } else {
            st[0].send_dep = -1;
        }
        if (ln->recv_peer >= 0) {
            st[0].recv_dst = b + lane_off * es;
            st[0].recv_len = m * es;
        }
        lane_off += m;
    }
    return weft__op_run(c, &op);
}

int weft__ring_barrier(weft__ctx *c)
{
    uint8_t *flags;
    int rc;

    /* An all-gather of one byte per rank: no rank leaves before it has
     * heard, through the ring, from every other. */
    if ((rc = weft__scratch(c, (size_t)c->nranks, (void **)&flags)) != 0)
        return rc;
    flags[c->rank] = 1;
    return weft__ring_all_gather(c, flags + c->rank, flags, 1, WEFT_UINT8,
                                 WEFT__OP_BARRIER, "barrier");
}
