/*
 * The operations' entry points, blocking and non-blocking: argument
 * checks (a bad argument is reported before anything moves and leaves the
 * communicator usable), the choice of algorithm (tune.c), then the
 * operation is handed to the requests (request.c), which run every
 * operation of a communicator in post order.
 */
#include "base/kernels.h"
#include "core/internal.h"
#include "core/tune.h"

#include <stdint.h>
#include <string.h>

/* What a check returns for an operation that is complete already (count
 * 0, or a job of one rank): nothing to run. */
#define DONE_NOW 1

/* A bad argument: reported, nothing sent, the communicator stays usable. */
#define inval(c, ...) weft__note(&(c)->x, WEFT_EINVAL, __VA_ARGS__)

/* Checks shared by every operation. mult is how many count-sized blocks
 * the largest buffer holds. */
static int check(weft_comm *c, const char *name, size_t count, weft_dtype dtype,
                 size_t mult)
{
    size_t es;
    int code = atomic_load(&c->x.fail.code);

    if (code != 0 && !atomic_exchange(&c->reported, 1))
        /* Found between operations (by the progress thread): this is the
         * first operation to hear of it. */
        return code;
    if (code != 0 || atomic_load(&c->x.aborted)) {
        weft__set_error(&c->x, WEFT_EABORTED,
                        "rank %d: communicator aborted by weft_abort()",
                        c->x.rank);
        return WEFT_EABORTED;
    }
    if (!weft__dtype_valid((int)dtype))
        return inval(c, "%s: unknown dtype %d", name, (int)dtype);
    es = weft_dtype_size(dtype);
    if (count > SIZE_MAX / es / mult || count * es * mult > (SIZE_MAX >> 2))
        return inval(c, "%s: count %zu overflows the address space", name,
                     count);
    return WEFT_OK;
}

/* A collective with count > 0 on two ranks or more: its algorithm. */
static int collective(weft_comm *c, weft__opdesc *d, int kind, const char *name,
                      int redop)
{
    d->kind = kind;
    d->name = name;
    d->redop = redop;
    d->post = weft__tune_pick(&c->tune, &c->x, kind, &d->a, &d->batch);
    return WEFT_OK;
}

/* An operation that returns its result: post and wait. */
static int blocking(weft_comm *c, int rc, const weft__opdesc *d)
{
    if (rc != WEFT_OK)
        return rc == DONE_NOW ? WEFT_OK : rc;
    return weft__submit(c, d, NULL);
}

/* A post: *req is a request on WEFT_OK, NULL on an error (nothing
 * posted). */
static int post(weft_comm *c, int rc, const weft__opdesc *d, weft_request **req)
{
    if (rc < 0)
        return rc;
    if (rc == DONE_NOW)
        return weft__request_done(c, WEFT_OK, req);
    return weft__submit(c, d, req);
}

/* Every entry point checks c (and, posting, req: NULL on every error)
 * first. */
#define CHECK_COMM(c)                                                          \
    do {                                                                       \
        if ((c) == NULL)                                                       \
            return WEFT_EINVAL;                                                \
    } while (0)
#define CHECK_REQ(c, req, name)                                                \
    do {                                                                       \
        if ((req) != NULL)                                                     \
            *(req) = NULL;                                                     \
        CHECK_COMM(c);                                                         \
        if ((req) == NULL)                                                     \
            return inval(c, "%s: req is NULL", name);                          \
    } while (0)

/* ---- the operations, checked ---- */

/* Whether sendbuf and recvbuf (blocks of `block` bytes) overlap other
 * than in an in-place form (weft.h): all_reduce only as one buffer;
 * all_gather with sendbuf at recvbuf's first block or this rank's;
 * reduce_scatter with recvbuf at sendbuf's first block or this rank's.
 * Any other overlap would have received bytes overwrite ones still to be
 * sent (wrong results, silently). */
static int bad_overlap(const weft_comm *c, int kind, const void *sendbuf,
                       const void *recvbuf, size_t block)
{
    const uintptr_t s = (uintptr_t)sendbuf, r = (uintptr_t)recvbuf;
    const size_t n = (size_t)c->x.nranks, me = (size_t)c->x.rank;
    const size_t sb = kind == WEFT__OP_REDUCE_SCATTER ? block * n : block;
    const size_t rb = kind == WEFT__OP_ALL_GATHER ? block * n : block;

    if (s + sb <= r || r + rb <= s || s == r)
        return 0;
    if (kind == WEFT__OP_ALL_GATHER && s == r + me * block)
        return 0;
    if (kind == WEFT__OP_REDUCE_SCATTER && r == s + me * block)
        return 0;
    return 1;
}

/* all_reduce (has_op, one block), all_gather and reduce_scatter (mult
 * blocks of count elements in the larger buffer; reduce_scatter has_op). */
static int two_buffers(weft_comm *c, const char *name, int kind,
                       const char *kind_name, const void *sendbuf,
                       void *recvbuf, size_t count, weft_dtype dtype,
                       size_t mult, int has_op, weft_redop op, weft__opdesc *d)
{
    int rc;

    if ((rc = check(c, name, count, dtype, mult)) != 0)
        return rc;
    if (has_op && !weft__op_valid((int)op))
        return inval(c, "%s: unknown op %d", name, (int)op);
    if (count > 0 && (sendbuf == NULL || recvbuf == NULL))
        return inval(c, "%s: NULL buffer with count %zu", name, count);
    if (count == 0)
        return DONE_NOW;
    if (bad_overlap(c, kind, sendbuf, recvbuf, count * weft_dtype_size(dtype)))
        return inval(c,
                     "%s: sendbuf and recvbuf overlap, and not in an in-place "
                     "form (the same buffer%s)",
                     name,
                     kind == WEFT__OP_ALL_GATHER
                         ? ", or sendbuf at this rank's block of recvbuf"
                     : kind == WEFT__OP_REDUCE_SCATTER
                         ? ", or recvbuf at this rank's block of sendbuf"
                         : "");
    if (c->x.nranks == 1) {
        memmove(recvbuf, sendbuf, count * weft_dtype_size(dtype));
        return DONE_NOW;
    }
    d->a = (weft__args){.sendbuf = sendbuf,
                        .recvbuf = recvbuf,
                        .count = count,
                        .dtype = dtype,
                        .op = has_op ? op : WEFT_SUM,
                        .root = -1,
                        .dst = -1,
                        .src = -1};
    return collective(c, d, kind, kind_name, has_op ? (int)op : -1);
}

static int all_reduce(weft_comm *c, const char *name, const void *sendbuf,
                      void *recvbuf, size_t count, weft_dtype dtype,
                      weft_redop op, weft__opdesc *d)
{
    return two_buffers(c, name, WEFT__OP_ALL_REDUCE, "all_reduce", sendbuf,
                       recvbuf, count, dtype, 1, 1, op, d);
}

static int all_gather(weft_comm *c, const char *name, const void *sendbuf,
                      void *recvbuf, size_t count, weft_dtype dtype,
                      weft__opdesc *d)
{
    return two_buffers(c, name, WEFT__OP_ALL_GATHER, "all_gather", sendbuf,
                       recvbuf, count, dtype, (size_t)c->x.nranks, 0, WEFT_SUM,
                       d);
}

static int reduce_scatter(weft_comm *c, const char *name, const void *sendbuf,
                          void *recvbuf, size_t recvcount, weft_dtype dtype,
                          weft_redop op, weft__opdesc *d)
{
    return two_buffers(c, name, WEFT__OP_REDUCE_SCATTER, "reduce_scatter",
                       sendbuf, recvbuf, recvcount, dtype, (size_t)c->x.nranks,
                       1, op, d);
}

static int broadcast(weft_comm *c, const char *name, void *buf, size_t count,
                     weft_dtype dtype, int root, weft__opdesc *d)
{
    int rc;

    if ((rc = check(c, name, count, dtype, 1)) != 0)
        return rc;
    if (root < 0 || root >= c->x.nranks)
        return inval(c, "%s: root %d out of range [0, %d)", name, root,
                     c->x.nranks);
    if (count > 0 && buf == NULL)
        return inval(c, "%s: NULL buffer with count %zu", name, count);
    if (count == 0 || c->x.nranks == 1)
        return DONE_NOW;
    d->a = (weft__args){.sendbuf = buf,
                        .recvbuf = buf,
                        .count = count,
                        .dtype = dtype,
                        .op = WEFT_SUM,
                        .root = root,
                        .dst = -1,
                        .src = -1};
    return collective(c, d, WEFT__OP_BROADCAST, "broadcast", -1);
}

static int barrier(weft_comm *c, const char *name, weft__opdesc *d)
{
    int rc;

    if ((rc = check(c, name, 1, WEFT_UINT8, 1)) != 0)
        return rc;
    if (c->x.nranks == 1)
        return DONE_NOW;
    d->a = (weft__args){.sendbuf = NULL,
                        .recvbuf = NULL,
                        .count = 1,
                        .dtype = WEFT_UINT8,
                        .op = WEFT_SUM,
                        .root = -1,
                        .dst = -1,
                        .src = -1};
    return collective(c, d, WEFT__OP_BARRIER, "barrier", -1);
}

/* Which halves a point-to-point call has. */
enum { SEND = 1, RECV = 2 };

/* send (SEND: dst), recv (RECV: src) and sendrecv (both). */
static int sendrecv(weft_comm *c, const char *name, int halves,
                    const void *sendbuf, int dst, void *recvbuf, int src,
                    size_t count, weft_dtype dtype, weft__opdesc *d)
{
    const int n = c->x.nranks, me = c->x.rank;
    int rc;

    if ((rc = check(c, name, count, dtype, 1)) != 0)
        return rc;
    if ((halves & SEND) && (dst < 0 || dst >= n))
        return inval(c, "%s: peer %d out of range [0, %d)", name, dst, n);
    if ((halves & RECV) && (src < 0 || src >= n))
        return inval(c, "%s: peer %d out of range [0, %d)", name, src, n);
    if (((halves & SEND) && dst == me) || ((halves & RECV) && src == me))
        return inval(c,
                     "%s: peer %d is this rank (a send to oneself cannot "
                     "complete)",
                     name, me);
    if (!(halves & SEND))
        dst = -1;
    if (!(halves & RECV))
        src = -1;
    if (count > 0 &&
        ((dst >= 0 && sendbuf == NULL) || (src >= 0 && recvbuf == NULL)))
        return inval(c, "%s: NULL buffer with count %zu", name, count);
    if (count == 0)
        return DONE_NOW;
    d->kind = WEFT__OP_P2P;
    d->name = name;
    d->redop = -1;
    d->a = (weft__args){.sendbuf = sendbuf,
                        .recvbuf = recvbuf,
                        .count = count,
                        .dtype = dtype,
                        .op = WEFT_SUM,
                        .root = -1,
                        .dst = dst,
                        .src = src};
    d->post = weft__sendrecv_post;
    d->tag = 0;
    return WEFT_OK;
}

/* ---- blocking ---- */

int weft_all_reduce(weft_comm *c, const void *sendbuf, void *recvbuf,
                    size_t count, weft_dtype dtype, weft_redop op)
{
    weft__opdesc d;

    CHECK_COMM(c);
    return blocking(
        c, all_reduce(c, "all_reduce", sendbuf, recvbuf, count, dtype, op, &d),
        &d);
}

int weft_all_gather(weft_comm *c, const void *sendbuf, void *recvbuf,
                    size_t count, weft_dtype dtype)
{
    weft__opdesc d;

    CHECK_COMM(c);
    return blocking(
        c, all_gather(c, "all_gather", sendbuf, recvbuf, count, dtype, &d), &d);
}

int weft_reduce_scatter(weft_comm *c, const void *sendbuf, void *recvbuf,
                        size_t recvcount, weft_dtype dtype, weft_redop op)
{
    weft__opdesc d;

    CHECK_COMM(c);
    return blocking(c,
                    reduce_scatter(c, "reduce_scatter", sendbuf, recvbuf,
                                   recvcount, dtype, op, &d),
                    &d);
}

int weft_broadcast(weft_comm *c, void *buf, size_t count, weft_dtype dtype,
                   int root)
{
    weft__opdesc d;

    CHECK_COMM(c);
    return blocking(c, broadcast(c, "broadcast", buf, count, dtype, root, &d),
                    &d);
}

int weft_send(weft_comm *c, const void *buf, size_t count, weft_dtype dtype,
              int peer)
{
    weft__opdesc d;

    CHECK_COMM(c);
    return blocking(
        c, sendrecv(c, "send", SEND, buf, peer, NULL, -1, count, dtype, &d),
        &d);
}

int weft_recv(weft_comm *c, void *buf, size_t count, weft_dtype dtype, int peer)
{
    weft__opdesc d;

    CHECK_COMM(c);
    return blocking(
        c, sendrecv(c, "recv", RECV, NULL, -1, buf, peer, count, dtype, &d),
        &d);
}

int weft_sendrecv(weft_comm *c, const void *sendbuf, int dst, void *recvbuf,
                  int src, size_t count, weft_dtype dtype)
{
    weft__opdesc d;

    CHECK_COMM(c);
    return blocking(c,
                    sendrecv(c, "sendrecv", SEND | RECV, sendbuf, dst, recvbuf,
                             src, count, dtype, &d),
                    &d);
}

int weft_barrier(weft_comm *c)
{
    weft__opdesc d;

    CHECK_COMM(c);
    return blocking(c, barrier(c, "barrier", &d), &d);
}

/* ---- non-blocking ---- */

int weft_iall_reduce(weft_comm *c, const void *sendbuf, void *recvbuf,
                     size_t count, weft_dtype dtype, weft_redop op,
                     weft_request **req)
{
    weft__opdesc d;

    CHECK_REQ(c, req, "iall_reduce");
    return post(
        c, all_reduce(c, "iall_reduce", sendbuf, recvbuf, count, dtype, op, &d),
        &d, req);
}

int weft_iall_gather(weft_comm *c, const void *sendbuf, void *recvbuf,
                     size_t count, weft_dtype dtype, weft_request **req)
{
    weft__opdesc d;

    CHECK_REQ(c, req, "iall_gather");
    return post(
        c, all_gather(c, "iall_gather", sendbuf, recvbuf, count, dtype, &d), &d,
        req);
}

int weft_ireduce_scatter(weft_comm *c, const void *sendbuf, void *recvbuf,
                         size_t recvcount, weft_dtype dtype, weft_redop op,
                         weft_request **req)
{
    weft__opdesc d;

    CHECK_REQ(c, req, "ireduce_scatter");
    return post(c,
                reduce_scatter(c, "ireduce_scatter", sendbuf, recvbuf,
                               recvcount, dtype, op, &d),
                &d, req);
}

int weft_ibroadcast(weft_comm *c, void *buf, size_t count, weft_dtype dtype,
                    int root, weft_request **req)
{
    weft__opdesc d;

    CHECK_REQ(c, req, "ibroadcast");
    return post(c, broadcast(c, "ibroadcast", buf, count, dtype, root, &d), &d,
                req);
}

int weft_isend(weft_comm *c, const void *buf, size_t count, weft_dtype dtype,
               int peer, weft_request **req)
{
    weft__opdesc d;

    CHECK_REQ(c, req, "isend");
    return post(
        c, sendrecv(c, "isend", SEND, buf, peer, NULL, -1, count, dtype, &d),
        &d, req);
}

int weft_irecv(weft_comm *c, void *buf, size_t count, weft_dtype dtype,
               int peer, weft_request **req)
{
    weft__opdesc d;

    CHECK_REQ(c, req, "irecv");
    return post(
        c, sendrecv(c, "irecv", RECV, NULL, -1, buf, peer, count, dtype, &d),
        &d, req);
}

int weft_isendrecv(weft_comm *c, const void *sendbuf, int dst, void *recvbuf,
                   int src, size_t count, weft_dtype dtype, weft_request **req)
{
    weft__opdesc d;

    CHECK_REQ(c, req, "isendrecv");
    return post(c,
                sendrecv(c, "isendrecv", SEND | RECV, sendbuf, dst, recvbuf,
                         src, count, dtype, &d),
                &d, req);
}

int weft_ibarrier(weft_comm *c, weft_request **req)
{
    weft__opdesc d;

    CHECK_REQ(c, req, "ibarrier");
    return post(c, barrier(c, "ibarrier", &d), &d, req);
}

/* ---- the rooted collectives and the all-to-alls ---- */

/* Whether [a, a + alen) and [b, b + blen) share a byte. */
static int spans_overlap(const void *a, size_t alen, const void *b, size_t blen)
{
    const uintptr_t x = (uintptr_t)a, y = (uintptr_t)b;

    return alen > 0 && blen > 0 && x < y + blen && y < x + alen;
}

/* reduce, gather and scatter: the checks they share. big is the buffer
 * of n blocks on the root (gather's recvbuf, scatter's sendbuf; NULL for
 * reduce), small the rank's own block; on the root they may overlap only
 * as one buffer (reduce) or with small at the root's block of big. */
static int rooted(weft_comm *c, const char *name, int kind,
                  const char *kind_name, const void *sendbuf, void *recvbuf,
                  size_t count, weft_dtype dtype, int has_op, weft_redop op,
                  int root, weft__opdesc *d)
{
    const int n = c->x.nranks, me = c->x.rank;
    const size_t mult = kind == WEFT__OP_REDUCE ? 1 : (size_t)n;
    /* What a rank needs: every rank its own block (reduce and gather
     * send it, scatter receives it), the root the other buffer. */
    const int own_is_send = kind != WEFT__OP_SCATTER;
    const void *own = own_is_send ? sendbuf : recvbuf;
    const void *other = own_is_send ? (const void *)recvbuf : sendbuf;
    size_t bytes;
    int rc;

    if ((rc = check(c, name, count, dtype, mult)) != 0)
        return rc;
    if (has_op && !weft__op_valid((int)op))
        return inval(c, "%s: unknown op %d", name, (int)op);
    if (root < 0 || root >= n)
        return inval(c, "%s: root %d out of range [0, %d)", name, root, n);
    if (count > 0 && own == NULL)
        return inval(c, "%s: NULL %s with count %zu", name,
                     own_is_send ? "sendbuf" : "recvbuf", count);
    if (count > 0 && me == root && other == NULL)
        return inval(c, "%s: NULL %s on the root with count %zu", name,
                     own_is_send ? "recvbuf" : "sendbuf", count);
    if (count == 0)
        return DONE_NOW;
    bytes = count * weft_dtype_size(dtype);
    if (me == root && spans_overlap(own, bytes, other, bytes * mult) &&
        !(kind == WEFT__OP_REDUCE && own == other) &&
        !(kind != WEFT__OP_REDUCE &&
          (const char *)own == (const char *)other + (size_t)me * bytes))
        return inval(c,
                     "%s: sendbuf and recvbuf overlap, and not in the "
                     "in-place form (%s)",
                     name,
                     kind == WEFT__OP_REDUCE ? "the same buffer"
                     : kind == WEFT__OP_GATHER
                         ? "sendbuf at the root's block of recvbuf"
                         : "recvbuf at the root's block of sendbuf");
    if (n == 1) {
        memmove(recvbuf, sendbuf, bytes);
        return DONE_NOW;
    }
    /* The buffers a rank does not use are not the operation's: no
     * hazard with pending operations on them, none touched. */
    if (me != root) {
        if (own_is_send)
            recvbuf = NULL;
        else
            sendbuf = NULL;
    }
    d->a = (weft__args){.sendbuf = sendbuf,
                        .recvbuf = recvbuf,
                        .count = count,
                        .dtype = dtype,
                        .op = has_op ? op : WEFT_SUM,
                        .root = root,
                        .dst = -1,
                        .src = -1};
    return collective(c, d, kind, kind_name, has_op ? (int)op : -1);
}

static int all_to_all(weft_comm *c, const char *name, const void *sendbuf,
                      void *recvbuf, size_t count, weft_dtype dtype,
                      weft__opdesc *d)
{
    const size_t n = (size_t)c->x.nranks;
    size_t nbytes;
    int rc;

    if ((rc = check(c, name, count, dtype, n)) != 0)
        return rc;
    if (count > 0 && (sendbuf == NULL || recvbuf == NULL))
        return inval(c, "%s: NULL buffer with count %zu", name, count);
    if (count == 0)
        return DONE_NOW;
    nbytes = count * weft_dtype_size(dtype) * n;
    if (sendbuf != recvbuf && spans_overlap(sendbuf, nbytes, recvbuf, nbytes))
        return inval(c,
                     "%s: sendbuf and recvbuf overlap, and not in the "
                     "in-place form (the same buffer)",
                     name);
    if (n == 1) {
        memmove(recvbuf, sendbuf, nbytes);
        return DONE_NOW;
    }
    d->a = (weft__args){.sendbuf = sendbuf,
                        .recvbuf = recvbuf,
                        .count = count,
                        .dtype = dtype,
                        .op = WEFT_SUM,
                        .root = -1,
                        .dst = -1,
                        .src = -1};
    return collective(c, d, WEFT__OP_ALL_TO_ALL, "all_to_all", -1);
}

/* The bytes from buf that counts and displs reach (0: none), or
 * SIZE_MAX where they overflow. */
static size_t v_extent(const size_t *counts, const size_t *displs, int n,
                       size_t es)
{
    size_t end = 0;

    for (int p = 0; p < n; p++) {
        if (counts[p] == 0)
            continue;
        if (displs[p] > SIZE_MAX / es / 2 || counts[p] > SIZE_MAX / es / 2 ||
            (displs[p] + counts[p]) * es > (SIZE_MAX >> 2))
            return SIZE_MAX;
        if ((displs[p] + counts[p]) * es > end)
            end = (displs[p] + counts[p]) * es;
    }
    return end;
}

static int all_to_allv(weft_comm *c, const char *name, const void *sendbuf,
                       const size_t *sendcounts, const size_t *sdispls,
                       void *recvbuf, const size_t *recvcounts,
                       const size_t *rdispls, weft_dtype dtype, weft__opdesc *d)
{
    const int n = c->x.nranks, me = c->x.rank;
    size_t es, sext, rext;
    int rc;

    if ((rc = check(c, name, 0, dtype, 1)) != 0)
        return rc;
    if (sendcounts == NULL || sdispls == NULL || recvcounts == NULL ||
        rdispls == NULL)
        return inval(c, "%s: NULL counts or displacements", name);
    es = weft_dtype_size(dtype);
    sext = v_extent(sendcounts, sdispls, n, es);
    rext = v_extent(recvcounts, rdispls, n, es);
    if (sext == SIZE_MAX || rext == SIZE_MAX)
        return inval(c,
                     "%s: counts and displacements overflow the address "
                     "space",
                     name);
    if ((sext > 0 && sendbuf == NULL) || (rext > 0 && recvbuf == NULL))
        return inval(c, "%s: NULL buffer with counts > 0", name);
    if (sendcounts[me] != recvcounts[me])
        return inval(c,
                     "%s: this rank sends %zu elements to itself but "
                     "receives %zu from itself",
                     name, sendcounts[me], recvcounts[me]);
    if (spans_overlap(sendbuf, sext, recvbuf, rext))
        return inval(c,
                     "%s: sendbuf and recvbuf overlap (all_to_allv has no "
                     "in-place form)",
                     name);
    if (n == 1) {
        if (sendcounts[0] > 0)
            memcpy((char *)recvbuf + rdispls[0] * es,
                   (const char *)sendbuf + sdispls[0] * es, sendcounts[0] * es);
        return DONE_NOW;
    }
    /* Whatever this rank's counts, its peers' may not be zero: the call
     * always runs, so that a pair whose counts differ fails on both ends.
     * Its count (what the headers compare) is 0 on every rank. */
    d->a = (weft__args){.sendbuf = sendbuf,
                        .recvbuf = recvbuf,
                        .count = 0,
                        .dtype = dtype,
                        .op = WEFT_SUM,
                        .root = -1,
                        .dst = -1,
                        .src = -1};
    d->a.sendcounts = sendcounts;
    d->a.sdispls = sdispls;
    d->a.recvcounts = recvcounts;
    d->a.rdispls = rdispls;
    return collective(c, d, WEFT__OP_ALL_TO_ALLV, "all_to_allv", -1);
}

int weft_reduce(weft_comm *c, const void *sendbuf, void *recvbuf, size_t count,
                weft_dtype dtype, weft_redop op, int root)
{
    weft__opdesc d;

    CHECK_COMM(c);
    return blocking(c,
                    rooted(c, "reduce", WEFT__OP_REDUCE, "reduce", sendbuf,
                           recvbuf, count, dtype, 1, op, root, &d),
                    &d);
}

int weft_gather(weft_comm *c, const void *sendbuf, void *recvbuf, size_t count,
                weft_dtype dtype, int root)
{
    weft__opdesc d;

    CHECK_COMM(c);
    return blocking(c,
                    rooted(c, "gather", WEFT__OP_GATHER, "gather", sendbuf,
                           recvbuf, count, dtype, 0, WEFT_SUM, root, &d),
                    &d);
}

int weft_scatter(weft_comm *c, const void *sendbuf, void *recvbuf, size_t count,
                 weft_dtype dtype, int root)
{
    weft__opdesc d;

    CHECK_COMM(c);
    return blocking(c,
                    rooted(c, "scatter", WEFT__OP_SCATTER, "scatter", sendbuf,
                           recvbuf, count, dtype, 0, WEFT_SUM, root, &d),
                    &d);
}

int weft_all_to_all(weft_comm *c, const void *sendbuf, void *recvbuf,
                    size_t count, weft_dtype dtype)
{
    weft__opdesc d;

    CHECK_COMM(c);
    return blocking(
        c, all_to_all(c, "all_to_all", sendbuf, recvbuf, count, dtype, &d), &d);
}

int weft_all_to_allv(weft_comm *c, const void *sendbuf,
                     const size_t *sendcounts, const size_t *sdispls,
                     void *recvbuf, const size_t *recvcounts,
                     const size_t *rdispls, weft_dtype dtype)
{
    weft__opdesc d;

    CHECK_COMM(c);
    return blocking(c,
                    all_to_allv(c, "all_to_allv", sendbuf, sendcounts, sdispls,
                                recvbuf, recvcounts, rdispls, dtype, &d),
                    &d);
}

int weft_ireduce(weft_comm *c, const void *sendbuf, void *recvbuf, size_t count,
                 weft_dtype dtype, weft_redop op, int root, weft_request **req)
{
    weft__opdesc d;

    CHECK_REQ(c, req, "ireduce");
    return post(c,
                rooted(c, "ireduce", WEFT__OP_REDUCE, "reduce", sendbuf,
                       recvbuf, count, dtype, 1, op, root, &d),
                &d, req);
}

int weft_igather(weft_comm *c, const void *sendbuf, void *recvbuf, size_t count,
                 weft_dtype dtype, int root, weft_request **req)
{
    weft__opdesc d;

    CHECK_REQ(c, req, "igather");
    return post(c,
                rooted(c, "igather", WEFT__OP_GATHER, "gather", sendbuf,
                       recvbuf, count, dtype, 0, WEFT_SUM, root, &d),
                &d, req);
}

int weft_iscatter(weft_comm *c, const void *sendbuf, void *recvbuf,
                  size_t count, weft_dtype dtype, int root, weft_request **req)
{
    weft__opdesc d;

    CHECK_REQ(c, req, "iscatter");
    return post(c,
                rooted(c, "iscatter", WEFT__OP_SCATTER, "scatter", sendbuf,
                       recvbuf, count, dtype, 0, WEFT_SUM, root, &d),
                &d, req);
}

int weft_iall_to_all(weft_comm *c, const void *sendbuf, void *recvbuf,
                     size_t count, weft_dtype dtype, weft_request **req)
{
    weft__opdesc d;

    CHECK_REQ(c, req, "iall_to_all");
    return post(
        c, all_to_all(c, "iall_to_all", sendbuf, recvbuf, count, dtype, &d), &d,
        req);
}

int weft_iall_to_allv(weft_comm *c, const void *sendbuf,
                      const size_t *sendcounts, const size_t *sdispls,
                      void *recvbuf, const size_t *recvcounts,
                      const size_t *rdispls, weft_dtype dtype,
                      weft_request **req)
{
    weft__opdesc d;

    CHECK_REQ(c, req, "iall_to_allv");
    return post(c,
                all_to_allv(c, "iall_to_allv", sendbuf, sendcounts, sdispls,
                            recvbuf, recvcounts, rdispls, dtype, &d),
                &d, req);
}

/* ---- tagged point to point (and receives from any source) ---- */

/* isend_tag (SEND) and irecv_tag (RECV; peer may be WEFT_ANY_SOURCE):
 * sendrecv's checks, and the tag's. */
static int tagged(weft_comm *c, const char *name, int half, const void *sendbuf,
                  void *recvbuf, size_t count, weft_dtype dtype, int peer,
                  int tag, weft__opdesc *d)
{
    const int any = half == RECV && peer == WEFT_ANY_SOURCE;
    int rc;

    if (tag < 0 && (rc = check(c, name, count, dtype, 1)) == 0)
        return inval(c, "%s: tag %d is negative", name, tag);
    if (any && c->x.nranks == 1 && (rc = check(c, name, count, dtype, 1)) == 0)
        return inval(c, "%s: WEFT_ANY_SOURCE in a job of one rank", name);
    rc = half == SEND
             ? sendrecv(c, name, SEND, sendbuf, peer, NULL, -1, count, dtype, d)
             : sendrecv(c, name, RECV, NULL, -1, recvbuf,
                        any ? (c->x.rank + 1) % c->x.nranks : peer, count,
                        dtype, d);
    if (rc != WEFT_OK)
        return rc;
    d->tag = tag;
    if (any) {
        d->a.src = WEFT__SRC_ANY;
        d->post = weft__recv_any_post;
    }
    return WEFT_OK;
}

int weft_isend_tag(weft_comm *c, const void *buf, size_t count,
                   weft_dtype dtype, int peer, int tag, weft_request **req)
{
    weft__opdesc d;

    CHECK_REQ(c, req, "isend_tag");
    return post(
        c, tagged(c, "isend_tag", SEND, buf, NULL, count, dtype, peer, tag, &d),
        &d, req);
}

int weft_irecv_tag(weft_comm *c, void *buf, size_t count, weft_dtype dtype,
                   int peer, int tag, weft_request **req)
{
    weft__opdesc d;

    CHECK_REQ(c, req, "irecv_tag");
    return post(
        c, tagged(c, "irecv_tag", RECV, NULL, buf, count, dtype, peer, tag, &d),
        &d, req);
}
