/*
 * What the ibverbs transport sends on its TCP wires: at set-up, what a
 * peer needs to reach this rank's queue pairs (then each wire's queue pair
 * is connected to the peer's, and both ends say they are ready); at the
 * end, the goodbye with the count of slots landed per wire.
 */
#include "transport/ib/ib.h"

#include "base/bytes.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* What a peer needs to reach a wire's queue pair (IB_QP_BYTES, network
 * byte order). */
void weft__ib_pack_qp(const ib_wire *w, uint8_t *e)
{
    memset(e, 0, IB_QP_BYTES);
    /* No queue pair (its port is down): queue pair number 0, which no RC
     * queue pair has, says so. */
    if (w->qp == NULL)
        return;
    weft__put_be32(e, w->qp->qp_num);
    weft__put_be32(e + 4, w->psn);
    weft__put_be32(e + 8, w->dev->pattr.lid);
    weft__put_be32(e + 12, (uint32_t)w->dev->pattr.active_mtu);
    memcpy(e + 16, w->gid.raw, 16);
    weft__put_be64(e + 32, (uint64_t)(uintptr_t)w->rring);
    weft__put_be32(e + 40, w->rmr->rkey);
}

/* What a peer needs to reach this end of a link: a header, then one entry
 * per wire (network byte order). */
static void pack_link(ib_tp *tp, ib_link *lk)
{
    ib_peer *pe = &tp->peers[lk->peer];
    uint8_t *b = lk->out;

    weft__put_be32(b, IB_MAGIC);
    weft__put_be32(b + 4, IB_VERSION);
    weft__put_be32(b + 8, (uint32_t)tp->rank);
    weft__put_be32(b + 12, (uint32_t)lk->peer);
    weft__put_be32(b + 16, lk->link);
    weft__put_be32(b + 20, (uint32_t)tp->wires);
    weft__put_be32(b + 24, (uint32_t)tp->slots);
    weft__put_be32(b + 28, (uint32_t)tp->slot_bytes);
    for (int k = 0; k < tp->wires; k++)
        weft__ib_pack_qp(&pe->w[lk->twire * tp->wires + k],
                         b + IB_HDR_BYTES + k * IB_QP_BYTES);
}

static int check_header(ib_tp *tp, const ib_link *lk)
{
    const uint8_t *b = lk->in;

    if (weft__get_be32(b) != IB_MAGIC || weft__get_be32(b + 4) != IB_VERSION ||
        weft__get_be32(b + 8) != (uint32_t)lk->peer ||
        weft__get_be32(b + 12) != (uint32_t)tp->rank)
        return weft__fail(tp->p->sink, WEFT_ETRANSPORT,
                          "rank %d: peer %d sent a garbled ibverbs "
                          "set-up message on TCP wire %d",
                          tp->rank, lk->peer, lk->twire);
    if (weft__get_be32(b + 16) != lk->link)
        return weft__fail(tp->p->sink, WEFT_ETRANSPORT,
                          "rank %d: peer %d's TCP wire %d runs on link "
                          "%d, this rank's on link %d (internal error)",
                          tp->rank, lk->peer, lk->twire,
                          (int)weft__get_be32(b + 16), (int)lk->link);
    if (weft__get_be32(b + 20) != (uint32_t)tp->wires ||
        weft__get_be32(b + 24) != (uint32_t)tp->slots ||
        weft__get_be32(b + 28) != (uint32_t)tp->slot_bytes)
        return weft__fail(tp->p->sink, WEFT_ECONFIG,
                          "rank %d: peer %d runs WEFT_WIRES=%u, "
                          "WEFT_IB_SLOTS=%u, WEFT_IB_SLOT_BYTES=%u, this "
                          "rank %d, %d, %zu; give every rank the same",
                          tp->rank, lk->peer, weft__get_be32(b + 20),
                          weft__get_be32(b + 24), weft__get_be32(b + 28),
                          tp->wires, tp->slots, tp->slot_bytes);
    return WEFT_OK;
}

/* Connects a wire's queue pair to the peer's (entry e): INIT -> RTR ->
 * RTS. 0, or WEFT_ETRANSPORT with why said in why (the caller fails the
 * transport, or fails over: failover.c). */
int weft__ib_wire_connect(ib_tp *tp, ib_wire *w, const uint8_t *e, char *why,
                          size_t why_len)
{
    enum ibv_mtu mtu = w->dev->pattr.active_mtu;
    struct ibv_qp_attr a;
    int rc;

    if ((enum ibv_mtu)weft__get_be32(e + 12) < mtu)
        mtu = (enum ibv_mtu)weft__get_be32(e + 12);
    w->raddr = weft__get_be64(e + 32);
    w->rkey = weft__get_be32(e + 40);
    memset(&a, 0, sizeof a);
    a.qp_state = IBV_QPS_RTR;
    a.path_mtu = mtu;
    a.dest_qp_num = weft__get_be32(e);
    a.rq_psn = weft__get_be32(e + 4);
    a.max_dest_rd_atomic = 1;
    a.min_rnr_timer = 12;
    a.ah_attr.is_global = 1;
    memcpy(a.ah_attr.grh.dgid.raw, e + 16, 16);
    a.ah_attr.grh.sgid_index = (uint8_t)w->gid_index;
    a.ah_attr.grh.hop_limit = IB_HOP_LIMIT;
    a.ah_attr.dlid = (uint16_t)weft__get_be32(e + 8);
    a.ah_attr.sl = 0;
    a.ah_attr.port_num = (uint8_t)w->dev->port;
    rc = ibv_modify_qp(w->qp, &a,
                       IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU |
                           IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
                           IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER);
    if (rc == 0) {
        memset(&a, 0, sizeof a);
        a.qp_state = IBV_QPS_RTS;
        a.timeout = weft__ib_qp_timeout(tp);
        a.retry_cnt = IB_RETRY_CNT;
        a.rnr_retry = IB_RNR_RETRY;
        a.sq_psn = w->psn;
        a.max_rd_atomic = 1;
        rc = ibv_modify_qp(w->qp, &a,
                           IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT |
                               IBV_QP_RNR_RETRY | IBV_QP_SQ_PSN |
                               IBV_QP_MAX_QP_RD_ATOMIC);
    }
    if (rc != 0) {
        char lname[32];
        snprintf(why, why_len,
                 "rank %d: cannot connect the queue pair of wire %d to peer "
                 "%d (%s, device %s port %d, GID index %d): %s",
                 tp->rank, w->w, w->peer,
                 weft__ib_link_name(w, lname, sizeof lname), w->dev->name,
                 w->dev->port, w->gid_index, strerror(rc));
        return WEFT_ETRANSPORT;
    }
    return WEFT_OK;
}

static void setup_done(weft__xfer *x)
{
    ((ib_link *)x->arg)->tp->setup_pending--;
}

static void ctl_done(weft__xfer *x);

/* A message on a TCP wire after set-up: the peer's goodbye on one link (it
 * finalized after its writes were acknowledged, and says per wire of the
 * link how many of this rank's slot writes had landed there: a frame those
 * cover has arrived even where the write's acknowledgement was lost on the
 * way and its retransmission will find the peer's queue pair gone,
 * tx_done), or a failover message (failover.c), after which the next
 * message is awaited. */
static void ctl_done(weft__xfer *x)
{
    ib_link *lk = x->arg;
    ib_tp *tp = lk->tp;
    ib_peer *pe = &tp->peers[lk->peer];

    tp->events++;
    if (lk->in[0] != 'B') {
        if (weft__ib_fo_message(tp, lk->peer, lk->in) != 0)
            return;
        if (weft__ib_tcp_frame(tp, lk, 1, &lk->bye_rx, lk->in,
                               IB_CTL_BYTES(tp->wires), ctl_done) != 0 &&
            tp->err == 0)
            weft__ib_fail(tp, WEFT_ETRANSPORT,
                          "rank %d: cannot post a receive on TCP wire %d to "
                          "peer %d",
                          tp->rank, lk->twire, lk->peer);
        return;
    }
    for (int k = 0; k < tp->wires; k++) {
        ib_wire *w = &pe->w[lk->twire * tp->wires + k];
        /* The count modulo 2^32: at most s_posted, and at most a ring
         * below it (the peer has landed at least what it consumed, which
         * is what our credits say). It may be below s_done where a device
         * acknowledges a write before it reports the write's completion to
         * its owner. */
        uint32_t behind =
            (uint32_t)w->s_posted - weft__get_be32(lk->in + 1 + 4 * k);

        if (behind > (uint32_t)tp->slots) {
            weft__ib_fail(
                tp, WEFT_ETRANSPORT,
                "rank %d: peer %d's goodbye on TCP wire %d counts "
                "landed slots on wire %d that do not fit what this rank "
                "wrote (protocol error)",
                tp->rank, lk->peer, lk->twire, w->w);
            return;
        }
        w->s_landed = w->s_posted - behind;
        w->bye = 1;
        weft__ib_wire_kick(w);
    }
    if (!pe->left) {
        pe->left = 1;
        tp->nleft++;
        weft__log(WEFT__LOG_DEBUG, tp->rank, "peer %d finalized", lk->peer);
    }
}

int weft__ib_tcp_frame(ib_tp *tp, ib_link *lk, int recv, weft__xfer *x,
                       void *buf, size_t len, void (*done)(weft__xfer *))
{
    int rc;

    memset(x, 0, sizeof *x);
    x->done = done;
    x->arg = lk;
    x->buf = buf;
    x->len = len;
    rc = recv ? weft__tcp_ops.post_recv(tp->tcp, lk->peer, lk->twire, x)
              : weft__tcp_ops.post_send(tp->tcp, lk->peer, lk->twire, x);
    if (rc == 0 && done == setup_done)
        tp->setup_pending++;
    return rc;
}

/* Runs the TCP side until every set-up frame has completed. */
static int setup_wait(ib_tp *tp, uint64_t deadline, const char *what)
{
    while (tp->setup_pending > 0) {
        int rc = weft__tcp_ops.progress(tp->tcp, deadline);
        if (rc == WEFT_ETIMEDOUT)
            return weft__fail(tp->p->sink, WEFT_ETIMEDOUT,
                              "rank %d: ibverbs set-up (%s) with the "
                              "peers did not finish within "
                              "WEFT_CONNECT_TIMEOUT_MS=%d ms",
                              tp->rank, what, tp->p->cfg->connect_timeout_ms);
        if (rc != 0)
            return rc;
    }
    return WEFT_OK;
}

#define FOR_EACH_LINK(tp, pe, lk)                                              \
    for (ib_peer *pe = (tp)->peers; pe < (tp)->peers + (tp)->nranks; pe++)     \
        for (ib_link *lk = pe->links; lk < pe->links + pe->nlinks; lk++)

/* Exchanges the queue pairs' addresses over the TCP wires, connects them,
 * and waits until the peers have connected theirs (a write to a queue pair
 * not yet ready to receive would be dropped and retried). */
int weft__ib_exchange(ib_tp *tp, uint64_t deadline)
{
    size_t body = (size_t)tp->wires * IB_QP_BYTES;
    int rc;

    FOR_EACH_LINK(tp, pe, lk)
    {
        lk->out = malloc(IB_HDR_BYTES + body);
        lk->in = malloc(IB_HDR_BYTES + body);
        if (lk->out == NULL || lk->in == NULL)
            return WEFT_ENOMEM;
        pack_link(tp, lk);
        if ((rc = weft__ib_tcp_frame(tp, lk, 0, &lk->sx, lk->out,
                                     IB_HDR_BYTES + body, setup_done)) != 0 ||
            (rc = weft__ib_tcp_frame(tp, lk, 1, &lk->rx, lk->in, IB_HDR_BYTES,
                                     setup_done)) != 0)
            return rc;
    }
    if ((rc = setup_wait(tp, deadline, "headers")) != 0)
        return rc;
    /* The header first: a peer with other settings must not have its
     * entries read as something else. */
    FOR_EACH_LINK(tp, pe, lk)
    {
        if ((rc = check_header(tp, lk)) != 0)
            return rc;
        if ((rc = weft__ib_tcp_frame(tp, lk, 1, &lk->rx, lk->in + IB_HDR_BYTES,
                                     body, setup_done)) != 0)
            return rc;
    }
    if ((rc = setup_wait(tp, deadline, "queue pairs")) != 0)
        return rc;
    FOR_EACH_LINK(tp, pe, lk)
    {
        for (int k = 0; k < tp->wires; k++) {
            ib_wire *w = &pe->w[lk->twire * tp->wires + k];
            const uint8_t *e = lk->in + IB_HDR_BYTES + k * IB_QP_BYTES;
            char why[WEFT__ERRMSG_LEN];

            /* The link's port is down at one end or the other: the wire
             * starts on another link (weft__ib_fo_start). */
            if (w->qp == NULL || weft__get_be32(e) == 0) {
                w->init_down = 1;
                continue;
            }
            rc = weft__ib_wire_connect(tp, w, e, why, sizeof why);
            if (rc != 0)
                return weft__fail(tp->p->sink, rc, "%s", why);
        }
        lk->ready_out = 'R';
        if ((rc = weft__ib_tcp_frame(tp, lk, 0, &lk->bye_tx, &lk->ready_out, 1,
                                     setup_done)) != 0 ||
            (rc = weft__ib_tcp_frame(tp, lk, 1, &lk->bye_rx, &lk->ready_in, 1,
                                     setup_done)) != 0)
            return rc;
    }
    if ((rc = setup_wait(tp, deadline, "ready")) != 0)
        return rc;
    FOR_EACH_LINK(tp, pe, lk)
    {
        if (lk->ready_in != 'R')
            return weft__fail(tp->p->sink, WEFT_ETRANSPORT,
                              "rank %d: peer %d sent garbage instead of "
                              "ready on TCP wire %d",
                              tp->rank, lk->peer, lk->twire);
        /* From now on a receive stays posted on every TCP wire: the peer's
         * goodbye completes it, and a peer that dies without one closes the
         * connection under it (WEFT_EPEER at once). The set-up message's
         * buffer is free now. */
        if ((rc = weft__ib_tcp_frame(tp, lk, 1, &lk->bye_rx, lk->in,
                                     IB_CTL_BYTES(tp->wires), ctl_done)) != 0)
            return rc;
    }
    return WEFT_OK;
}

/* Says goodbye on every TCP connection, with the count of slots landed
 * per wire of its link (ctl_done). Completions still on the CQ are taken
 * first, so that the counts hold every write that landed. */
void weft__ib_say_bye(ib_tp *tp)
{
    uint64_t deadline = weft__now_ms() + BYE_WAIT_MS;

    weft__ib_cq_poll_all(tp);
    tp->setup_pending = 0;
    FOR_EACH_LINK(tp, pe, lk)
    {
        lk->out[0] = 'B';
        for (int k = 0; k < tp->wires; k++)
            weft__put_be32(lk->out + 1 + 4 * k,
                           (uint32_t)pe->w[lk->twire * tp->wires + k].r_landed);
        if (weft__ib_tcp_frame(tp, lk, 0, &lk->bye_tx, lk->out,
                               IB_CTL_BYTES(tp->wires), setup_done) != 0)
            return;
    }
    while (tp->setup_pending > 0 && weft__now_ms() < deadline)
        if (weft__tcp_ops.progress(tp->tcp, deadline) < 0)
            break;
}
