/* Mesh algorithms; see mesh.h. */
#include "mesh/mesh.h"

#include "core/engine.h"
#include "core/kernels.h"
#include "core/plan.h"

#include <string.h>

/* What this rank sends to and receives from one peer in an exchange. A
 * half with no bytes is left out; both ends of a pair compute the same
 * lengths, so they agree on which halves exist. */
typedef struct {
    const char *send;
    size_t send_len;
    char *recv;
    size_t recv_len;
} peer_io;

/* Runs one operation with a lane per peer that has something to send or
 * receive (io has nranks entries; this rank's own is ignored). */
static int exchange(weft__ctx *c, int kind, const char *name,
                    weft_dtype dt, weft_redop redop, const peer_io *io)
{
    weft__op op;

    weft__op_init(&op, kind, name, dt, redop);
    /* Every peer, whether or not this rank exchanges data with it: the
     * root of a broadcast, say, depends on the call. */
    op.check = WEFT__CHECK_ALL;
    for (int p = 0; p < c->nranks; p++) {
        weft__lane *ln = &op.lanes[op.nlanes];
        weft__step *st;

        if (p == c->rank || (io[p].send_len == 0 && io[p].recv_len == 0))
            continue;
        st = weft__op_steps(&op, op.nlanes, 1);
        ln->send_peer = io[p].send_len > 0 ? p : -1;
        ln->recv_peer = io[p].recv_len > 0 ? p : -1;
        if (st != NULL) {
            st[0].send_buf = io[p].send;
            st[0].send_len = io[p].send_len;
            st[0].recv_dst = io[p].recv;
            st[0].recv_len = io[p].recv_len;
        }
        op.nlanes++;
    }
    return weft__op_run(c, &op);
}

int weft__mesh_all_gather(weft__ctx *c, const void *sendbuf,
                          void *recvbuf, size_t count, weft_dtype dt, int kind,
                          const char *name)
{
    const size_t bytes = count * weft_dtype_size(dt);
    char *rb = recvbuf, *own = rb + (size_t)c->rank * bytes;
    peer_io io[WEFT__MAX_LANES + 1] = {{0}};

    if ((const char *)sendbuf != own)
        memmove(own, sendbuf, bytes);
    for (int p = 0; p < c->nranks; p++)
        io[p] = (peer_io){own, bytes, rb + (size_t)p * bytes, bytes};
    return exchange(c, kind, name, dt, WEFT_SUM, io);
}

int weft__mesh_reduce_scatter(weft__ctx *c, const void *sendbuf,
                              void *recvbuf, size_t recvcount, weft_dtype dt,
                              weft_redop redop)
{
    const size_t bytes = recvcount * weft_dtype_size(dt);
    const char *sb = sendbuf;
    peer_io io[WEFT__MAX_LANES + 1] = {{0}};
    char *parts;
    int rc;

    /* Every rank's copy of this rank's block lands in parts, in rank
     * order; sendbuf is only read, and recvbuf (which may lie inside it)
     * is written only once every send has completed. */
    if ((rc = weft__scratch(c, bytes * (size_t)c->nranks, (void **)&parts)) !=
        0)
        return rc;
    for (int p = 0; p < c->nranks; p++)
        io[p] = (peer_io){sb + (size_t)p * bytes, bytes,
                          parts + (size_t)p * bytes, bytes};
    rc = exchange(c, WEFT__OP_REDUCE_SCATTER, "reduce_scatter", dt, redop, io);
    if (rc != 0)
        return rc;
    memcpy(parts + (size_t)c->rank * bytes, sb + (size_t)c->rank * bytes,
           bytes);
    weft__reduce_ranks(recvbuf, parts, c->nranks, recvcount, dt, redop);
    return WEFT_OK;
}

int weft__mesh_all_reduce(weft__ctx *c, const void *sendbuf,
                          void *recvbuf, size_t count, weft_dtype dt,
                          weft_redop redop)
{
    const int n = c->nranks;
    const size_t es = weft_dtype_size(dt);
    const weft__region mine = weft__plan_chunk(count, n, c->rank);
    const size_t mbytes = mine.len * es;
    const char *sb = sendbuf;
    char *rb = recvbuf, *parts;
    peer_io io[WEFT__MAX_LANES + 1] = {{0}};
    int rc;

    if ((rc = weft__scratch(c, mbytes * (size_t)n, (void **)&parts)) != 0)
        return rc;
    /* Reduce-scatter: chunk p of the input to rank p; every peer's chunk
     * of this rank into parts. In place, recvbuf is not written before
     * every chunk of sendbuf has left. */
    for (int p = 0; p < n; p++) {
        weft__region ch = weft__plan_chunk(count, n, p);
        io[p] = (peer_io){sb + ch.off * es, ch.len * es,
                          parts + (size_t)p * mbytes, mbytes};
    }
    rc = exchange(c, WEFT__OP_ALL_REDUCE, "all_reduce", dt, redop, io);
    if (rc != 0)
        return rc;
    memcpy(parts + (size_t)c->rank * mbytes, sb + mine.off * es, mbytes);
    weft__reduce_ranks(rb + mine.off * es, parts, n, mine.len, dt, redop);
    /* All-gather: this rank's reduced chunk to every peer. */
    for (int p = 0; p < n; p++) {
        weft__region ch = weft__plan_chunk(count, n, p);
        io[p] = (peer_io){rb + mine.off * es, mbytes, rb + ch.off * es,
                          ch.len * es};
    }
    return exchange(c, WEFT__OP_ALL_REDUCE, "all_reduce", dt, redop, io);
}

int weft__mesh_broadcast(weft__ctx *c, void *buf, size_t count,
                         weft_dtype dt, int root)
{
    const int n = c->nranks, me = c->rank;
    const size_t es = weft_dtype_size(dt), bytes = count * es;
    char *b = buf;
    peer_io io[WEFT__MAX_LANES + 1] = {{0}};
    int rc;

    if (bytes * (size_t)n <= c->cfg->mesh_small_all_reduce_bytes) {
        for (int p = 0; p < n; p++)
            io[p] =
                (peer_io){b, me == root ? bytes : 0, b, p == root ? bytes : 0};
        return exchange(c, WEFT__OP_BROADCAST, "broadcast", dt, WEFT_SUM, io);
    }
    /* Scatter: chunk p from the root to rank p. */
    for (int p = 0; p < n; p++) {
        weft__region ch = weft__plan_chunk(count, n, p);
        weft__region mine = weft__plan_chunk(count, n, me);
        io[p] = (peer_io){b + ch.off * es, me == root ? ch.len * es : 0,
                          b + mine.off * es, p == root ? mine.len * es : 0};
    }
    rc = exchange(c, WEFT__OP_BROADCAST, "broadcast", dt, WEFT_SUM, io);
    if (rc != 0)
        return rc;
    /* All-gather of the chunks among everyone but the root, which has them
     * all and only sends its own. */
    for (int p = 0; p < n; p++) {
        weft__region ch = weft__plan_chunk(count, n, p);
        weft__region mine = weft__plan_chunk(count, n, me);
        io[p] = (peer_io){b + mine.off * es, p == root ? 0 : mine.len * es,
                          b + ch.off * es, me == root ? 0 : ch.len * es};
    }
    return exchange(c, WEFT__OP_BROADCAST, "broadcast", dt, WEFT_SUM, io);
}
