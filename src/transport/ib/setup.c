/*
 * Set-up and tear-down of the ibverbs transport: the TCP wires it
 * bootstraps over (weft__tcp_create_wires), the plan of its wires, each
 * wire's rings, registrations and queue pair, create(), shutdown() and
 * destroy() (after the last writes are acknowledged and the goodbye said),
 * and the ops table.
 */
#include "transport/ib/ib.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

/* ---- set-up ---- */

/* The links joining this rank's host and peer p's, in the order the TCP
 * transport numbers its wires: loopback for ranks of one host, else every
 * link between the two hosts in hostfile order. *path: 1 where they are
 * paths through other hosts (topo.h), not cables. */
static int peer_links(const weft__config *cfg, int me, int p, uint32_t *out,
                      int max, int *path)
{
    int hm = cfg->rank_host[me], hp = cfg->rank_host[p], n = 0;

    *path = 0;
    if (hm == hp) {
        out[0] = WEFT__LINK_LOOPBACK;
        return 1;
    }
    for (int l = 0; l < cfg->nlinks; l++) {
        const weft__link *lk = &cfg->links[l];
        if (weft__link_joins(lk, hm, hp) && n < max) {
            out[n++] = (uint32_t)l;
            *path |= lk->nvia > 0;
        }
    }
    return n;
}

/* Decides every wire: its link, device port and GID. */
static int plan(ib_tp *tp)
{
    const weft__config *cfg = tp->p->cfg;
    int W = tp->wires, rc;

    tp->peers = calloc((size_t)tp->nranks, sizeof *tp->peers);
    if (tp->peers == NULL)
        return WEFT_ENOMEM;
    for (int p = 0; p < tp->nranks; p++) {
        ib_peer *pe = &tp->peers[p];
        uint32_t links[WEFT__MAX_WIRES];
        int n = p == tp->rank || weft__ib_shm_peer(tp, p)
                    ? 0
                    : weft__tcp_ops.nwires(tp->tcp, p),
            nl, path;

        if (n == 0)
            continue;
        nl = peer_links(cfg, tp->rank, p, links, WEFT__MAX_WIRES, &path);
        if (path) {
            /* No device between: the TCP side's wires carry it. */
            pe->path = 1;
            weft__log(WEFT__LOG_INFO, tp->rank,
                      "ibverbs: no cable joins this host to peer %d's: its "
                      "%d wire(s) run over TCP, on paths through the hosts "
                      "between",
                      p, n);
            continue;
        }
        if (nl != n)
            return weft__fail(tp->p->sink, WEFT_ETRANSPORT,
                              "rank %d: %d TCP wires to peer %d but %d "
                              "links (internal error)",
                              tp->rank, n, p, nl);
        if (n * W > WEFT__MAX_WIRES)
            return weft__fail(tp->p->sink, WEFT_ECONFIG,
                              "rank %d: %d wires to peer %d, more than "
                              "%d",
                              tp->rank, n * W, p, WEFT__MAX_WIRES);
        pe->links = calloc((size_t)n, sizeof *pe->links);
        pe->w = calloc((size_t)(n * W), sizeof *pe->w);
        if (pe->links == NULL || pe->w == NULL)
            return WEFT_ENOMEM;
        pe->nlinks = n;
        pe->nwires = n * W;
        for (int i = 0; i < n; i++) {
            ib_link *lk = &pe->links[i];

            lk->tp = tp;
            lk->peer = p;
            lk->twire = i;
            lk->link = links[i];
            for (int k = 0; k < W; k++) {
                ib_wire *w = &pe->w[i * W + k];

                if (tp->devlist == NULL)
                    return weft__fail(tp->p->sink, WEFT_ECONFIG,
                                      "rank %d: no RDMA devices: "
                                      "ibv_get_device_list: %s (is an RDMA "
                                      "driver loaded, or for Soft-RoCE, "
                                      "`rdma link add` done?)",
                                      tp->rank, strerror(tp->devlist_err));

                w->tp = tp;
                w->peer = p;
                w->w = i * W + k;
                w->link = links[i];
                w->li = w->home_li = i;
                if ((rc = weft__ib_wire_device(tp, links[i], w)) != 0)
                    return rc;
                w->dev->nqp++;
                if (k == 0) {
                    lk->dev = w->dev;
                    lk->gid_index = w->gid_index;
                    lk->gid = w->gid;
                    snprintf(lk->addr, sizeof lk->addr, "%s", w->addr);
                }
            }
        }
    }
    return WEFT_OK;
}

static int reg_failed(ib_tp *tp, const ib_dev *d, size_t bytes, int err)
{
    struct rlimit rl;
    char lim[48] = "unknown";

    if (getrlimit(RLIMIT_MEMLOCK, &rl) == 0) {
        if (rl.rlim_cur == RLIM_INFINITY)
            snprintf(lim, sizeof lim, "unlimited");
        else
            snprintf(lim, sizeof lim, "%llu bytes",
                     (unsigned long long)rl.rlim_cur);
    }
    return weft__fail(tp->p->sink, WEFT_ENOMEM,
                      "rank %d: cannot register %zu bytes with RDMA "
                      "device %s: %s (locked-memory limit: %s; raise "
                      "it with ulimit -l, or lower WEFT_IB_SLOTS)",
                      tp->rank, bytes, d->name, strerror(err), lim);
}

/* A wire's queue pair on device port d, moved to INIT, with its receives
 * posted, and its rings registered there (where they are not yet: memory
 * regions of another device are the caller's to keep). Made at set-up, and
 * again by failover (failover.c) on the device of the link it moves to,
 * whose completion queue grows for it. */
int weft__ib_qp_make(ib_tp *tp, ib_wire *w, ib_dev *d)
{
    size_t ring = tp->slot_bytes * (size_t)tp->slots;
    struct ibv_qp_init_attr qia = {
        .qp_context = w,
        .send_cq = d->cq,
        .recv_cq = d->cq,
        .cap = {.max_send_wr = (uint32_t)tp->sq_depth,
                .max_recv_wr = (uint32_t)tp->rq_depth,
                .max_send_sge = 1,
                .max_recv_sge = 1},
        .qp_type = IBV_QPT_RC,
        .sq_sig_all = 0,
    };
    struct ibv_qp_attr qa = {
        .qp_state = IBV_QPS_INIT,
        .pkey_index = 0,
        .port_num = (uint8_t)d->port,
        .qp_access_flags = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE,
    };
    int rc;

    if (d->nqp_made + 1 > d->cq_qps) {
        int cqe = (d->nqp_made + 1) * (tp->sq_depth + tp->rq_depth);

        if ((rc = ibv_resize_cq(d->cq, cqe)) != 0)
            return weft__fail(tp->p->sink, WEFT_ETRANSPORT,
                              "rank %d: cannot grow the completion queue "
                              "of RDMA device %s to %d entries for wire %d "
                              "to peer %d: %s",
                              tp->rank, d->name, cqe, w->w, w->peer,
                              strerror(rc));
        d->cq_qps = d->nqp_made + 1;
    }
    if (w->smr == NULL && (w->smr = ibv_reg_mr(d->pd, w->sring, ring,
                                               IBV_ACCESS_LOCAL_WRITE)) == NULL)
        return reg_failed(tp, d, ring, errno);
    if (w->rmr == NULL &&
        (w->rmr = ibv_reg_mr(d->pd, w->rring, ring,
                             IBV_ACCESS_LOCAL_WRITE |
                                 IBV_ACCESS_REMOTE_WRITE)) == NULL)
        return reg_failed(tp, d, ring, errno);
    /* Small writes go inline (the bytes in the work request: the device
     * reads no memory for them) where the device allows it; one that
     * refuses inline data gets a queue pair without. */
    qia.cap.max_inline_data = IB_INLINE_BYTES;
    if ((w->qp = ibv_create_qp(d->pd, &qia)) == NULL) {
        qia.cap.max_inline_data = 0;
        w->qp = ibv_create_qp(d->pd, &qia);
    }
    w->max_inline = w->qp != NULL ? qia.cap.max_inline_data : 0;
    if (w->qp == NULL)
        return weft__fail(tp->p->sink, WEFT_ETRANSPORT,
                          "rank %d: ibv_create_qp on RDMA device %s for "
                          "wire %d to peer %d: %s",
                          tp->rank, d->name, w->w, w->peer, strerror(errno));
    d->nqp_made++;
    w->qpn = w->qp->qp_num;
    w->s_wr = w->c_wr = w->r_wr = 0;
    w->sig_posted = w->sig_done = 0;
    if ((rc = ibv_modify_qp(w->qp, &qa,
                            IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT |
                                IBV_QP_ACCESS_FLAGS)) != 0)
        return weft__fail(tp->p->sink, WEFT_ETRANSPORT,
                          "rank %d: queue pair of wire %d to peer %d on "
                          "%s: cannot move to INIT: %s",
                          tp->rank, w->w, w->peer, d->name, strerror(rc));
    /* Any 24-bit start will do; a different one per connection keeps a
     * stale packet of an earlier job (or queue pair) from looking
     * current. */
    w->psn = (uint32_t)((weft__now_ns() ^ ((uint64_t)(uintptr_t)w >> 4) ^
                         ((uint64_t)getpid() << 8) ^ w->epoch) &
                        0xffffff);
    if ((rc = weft__ib_post_recvs(w, tp->rq_depth)) != 0)
        return weft__fail(tp->p->sink, WEFT_ETRANSPORT,
                          "rank %d: ibv_post_recv on %s: %s", tp->rank, d->name,
                          strerror(rc));
    return WEFT_OK;
}

/* Rings (and the lengths of their slots), then the queue pair. */
static int wire_setup(ib_tp *tp, ib_wire *w)
{
    size_t ring = tp->slot_bytes * (size_t)tp->slots;
    void *p;

    if (posix_memalign(&p, 4096, ring) != 0)
        return WEFT_ENOMEM;
    w->sring = p;
    if (posix_memalign(&p, 4096, ring) != 0)
        return WEFT_ENOMEM;
    w->rring = p;
    w->r_len = calloc((size_t)tp->slots, sizeof *w->r_len);
    w->s_len = calloc((size_t)tp->slots, sizeof *w->s_len);
    w->sig = calloc((size_t)tp->slots, sizeof *w->sig);
    if (w->r_len == NULL || w->s_len == NULL || w->sig == NULL)
        return WEFT_ENOMEM;
    /* A port down: the wire's queue pair is made where it starts, on
     * another link (weft__ib_exchange). */
    if (w->dev->down)
        return WEFT_OK;
    return weft__ib_qp_make(tp, w, w->dev);
}

static void ib_cable_wires(weft__tp *t, int p, weft_wire_info *out)
{
    ib_tp *tp = (ib_tp *)t;

    memset(out, 0, sizeof *out);
    if (p < 0 || p >= tp->nranks)
        return;
    if (tp->peers[p].path) {
        weft__tcp_ops.cable_wires(tp->tcp, p, out);
        return;
    }
    /* A wire whose peer left is not counted lost: that is the peer's
     * leaving, not a link's. */
    out->total = tp->peers[p].nwires;
    out->lost = atomic_load(&tp->peers[p].lost);
    out->back = atomic_load(&tp->peers[p].back);
    out->up = out->total - (int)out->lost + (int)out->back;
}

static int ib_nwires(weft__tp *t, int p)
{
    ib_tp *tp = (ib_tp *)t;

    if (p < 0 || p >= tp->nranks)
        return 0;
    return tp->peers[p].path ? weft__tcp_ops.nwires(tp->tcp, p)
                             : tp->peers[p].nwires;
}

/* ---- tear-down ---- */

static void ib_shutdown(weft__tp *t)
{
    ib_tp *tp = (ib_tp *)t;

    if (tp == NULL)
        return;
    tp->shut = 1;
    /* The queue pairs stop touching the rings and flush what they hold;
     * the flushed completions are dropped. */
    for (int p = 0; tp->peers != NULL && p < tp->nranks; p++)
        for (int i = 0; i < tp->peers[p].nwires; i++) {
            ib_wire *w = &tp->peers[p].w[i];
            if (w->qp != NULL) {
                struct ibv_qp_attr a = {.qp_state = IBV_QPS_ERR};
                int rc = ibv_modify_qp(w->qp, &a, IBV_QP_STATE);
                if (rc != 0)
                    weft__log(WEFT__LOG_WARN, tp->rank,
                              "wire %d to peer %d: cannot move its queue "
                              "pair to the error state: %s",
                              w->w, w->peer, strerror(rc));
            }
            w->sq_head = w->sq_tail = NULL;
            w->wq_head = w->wq_tail = NULL;
            w->rq_head = w->rq_tail = NULL;
            w->dirty = 0;
            w->dirty_next = NULL;
        }
    tp->dirty = NULL;
    if (tp->tcp != NULL)
        weft__tcp_ops.shutdown(tp->tcp);
}

/* Before the goodbye: every write this rank made must be acknowledged, or
 * the peer could miss the end of what it waits for once the queue pairs are
 * gone. The frames of completed operations are acknowledged already (a
 * send frame completes only then); what may be left are credit messages
 * and the writes of frames that belonged to no operation. Bounded, since a
 * peer that is stopped never acknowledges. */
static void drain_writes(ib_tp *tp)
{
    int tmo =
        tp->p->timeout_ms < DRAIN_MAX_MS ? tp->p->timeout_ms : DRAIN_MAX_MS;
    uint64_t deadline = weft__now_ms() + (uint64_t)tmo;

    for (;;) {
        int busy = 0;

        for (int p = 0; p < tp->nranks; p++)
            for (int i = 0; i < tp->peers[p].nwires; i++) {
                ib_wire *w = &tp->peers[p].w[i];
                if (w->s_wr > 0 && !w->dead && !tp->peers[p].left)
                    busy = 1;
            }
        /* A peer lost meanwhile (the TCP side failed): nothing is judged
         * any more, and no goodbye can go. */
        if (!busy || tp->err != 0 || tp->tcp_err != 0 ||
            weft__now_ms() >= deadline)
            break;
        if (weft__ib_block(tp, deadline) != 0)
            break;
        weft__ib_cq_poll_all(tp);
    }
}

static void ib_destroy(weft__tp *t)
{
    ib_tp *tp = (ib_tp *)t;
    weft__sigpipe_state sp;
    int rc;

    if (tp == NULL)
        return;
    weft__sigpipe_block(&sp);
    /* A TCP side that failed can carry no goodbye, judged or not. */
    if (tp->ready && !tp->shut && tp->err == 0 && tp->tcp_err == 0) {
        /* Frames still queued belong to no operation: drop them, with no
         * callback, and send no more credits. */
        for (int p = 0; p < tp->nranks; p++)
            for (int i = 0; i < tp->peers[p].nwires; i++) {
                ib_wire *w = &tp->peers[p].w[i];
                w->sq_head = w->sq_tail = NULL;
                w->wq_head = w->wq_tail = NULL;
                w->rq_head = w->rq_tail = NULL;
                w->r_returned = w->r_consumed;
            }
        tp->dirty = NULL;
        drain_writes(tp);
        weft__ib_say_bye(tp);
    }
    tp->shut = 1;
    if (tp->writes > 0)
        weft__log(WEFT__LOG_DEBUG, tp->rank,
                  "ibverbs: %llu slot writes, %llu of them signalled",
                  (unsigned long long)tp->writes,
                  (unsigned long long)tp->signalled);
    /* Reverse order of creation: queue pairs, memory regions and rings,
     * then per device its CQ, completion channel, PD and context. */
    for (int p = 0; tp->peers != NULL && p < tp->nranks; p++) {
        ib_peer *pe = &tp->peers[p];
        for (int i = 0; i < pe->nwires; i++) {
            ib_wire *w = &pe->w[i];
            if (w->qp != NULL && (rc = ibv_destroy_qp(w->qp)) != 0)
                weft__log(WEFT__LOG_WARN, tp->rank,
                          "ibv_destroy_qp (wire %d to peer %d): %s", w->w,
                          w->peer, strerror(rc));
            if (w->rmr != NULL && (rc = ibv_dereg_mr(w->rmr)) != 0)
                weft__log(WEFT__LOG_WARN, tp->rank, "ibv_dereg_mr: %s",
                          strerror(rc));
            if (w->smr != NULL && (rc = ibv_dereg_mr(w->smr)) != 0)
                weft__log(WEFT__LOG_WARN, tp->rank, "ibv_dereg_mr: %s",
                          strerror(rc));
            free(w->rring);
            free(w->sring);
            free(w->r_len);
            free(w->s_len);
            free(w->sig);
        }
        for (int i = 0; i < pe->nlinks; i++) {
            free(pe->links[i].out);
            free(pe->links[i].in);
        }
        free(pe->w);
        free(pe->links);
    }
    free(tp->peers);
    /* What failover replaced, before the protection domains go. */
    weft__ib_fo_free(tp);
    while (tp->devs != NULL) {
        ib_dev *d = tp->devs;
        tp->devs = d->next;
        /* Events were acknowledged as they were read (ibv_destroy_cq waits
         * for that). */
        if (d->cq != NULL && (rc = ibv_destroy_cq(d->cq)) != 0)
            weft__log(WEFT__LOG_WARN, tp->rank, "ibv_destroy_cq (%s): %s",
                      d->name, strerror(rc));
        if (d->ch != NULL && (rc = ibv_destroy_comp_channel(d->ch)) != 0)
            weft__log(WEFT__LOG_WARN, tp->rank,
                      "ibv_destroy_comp_channel (%s): %s", d->name,
                      strerror(rc));
        if (d->pd != NULL && (rc = ibv_dealloc_pd(d->pd)) != 0)
            weft__log(WEFT__LOG_WARN, tp->rank, "ibv_dealloc_pd (%s): %s",
                      d->name, strerror(rc));
        if (d->ctx != NULL && (rc = ibv_close_device(d->ctx)) != 0)
            weft__log(WEFT__LOG_WARN, tp->rank, "ibv_close_device (%s): %s",
                      d->name, strerror(rc));
        free(d);
    }
    if (tp->devlist != NULL)
        ibv_free_device_list(tp->devlist);
    if (tp->tcp != NULL)
        weft__tcp_ops.destroy(tp->tcp);
    /* Failover's messages: the TCP side is gone, none is borrowed now. */
    while (tp->tx_msgs != NULL) {
        ib_msg *m = tp->tx_msgs;
        tp->tx_msgs = m->next;
        free(m);
    }
    while (tp->rx_head != NULL) {
        ib_msg *m = tp->rx_head;
        tp->rx_head = m->next;
        free(m);
    }
    weft__sigpipe_restore(&sp);
    free(tp);
}

static int ib_create_guarded(ib_tp *tp)
{
    uint64_t deadline;
    int rc, ndev = 0;

    /* One TCP connection per link, with its own error record (tp->boot,
     * ib.h); a failure there during set-up is this transport's. */
    tp->boot.rank = tp->rank;
    tp->boot_p = *tp->p;
    tp->boot_p.wires = 1;
    tp->boot_p.sink = &tp->boot;
    if ((rc = weft__tcp_create_wires(&tp->boot_p, &tp->tcp)) != 0)
        return weft__fail(tp->p->sink, rc, "%s", tp->boot.msg);
    /* weft_init's one deadline covers the TCP wires and this set-up
     * alike. */
    deadline = tp->p->deadline_ms;
    /* Without devices, only a job whose every peer shares this rank's
     * host (shared memory) can run: plan says so where a wire needs one. */
    tp->devlist = ibv_get_device_list(&tp->ndevices);
    if (tp->devlist == NULL) {
        tp->ndevices = 0;
        tp->devlist_err = errno;
    }
    if ((rc = plan(tp)) != 0)
        return rc;
    for (ib_dev *d = tp->devs; d != NULL; d = d->next)
        if (++ndev > MAX_DEVS)
            return weft__fail(tp->p->sink, WEFT_ECONFIG,
                              "rank %d: wires on more than %d RDMA "
                              "device ports",
                              tp->rank, MAX_DEVS);
    /* Every device's budget first: nothing is created on any of them
     * when one cannot hold its share. */
    for (ib_dev *d = tp->devs; d != NULL; d = d->next)
        if ((rc = weft__ib_dev_budget(tp, d)) != 0)
            return rc;
    for (ib_dev *d = tp->devs; d != NULL; d = d->next)
        if ((rc = weft__ib_dev_setup(tp, d)) != 0)
            return rc;
    for (int p = 0; p < tp->nranks; p++)
        for (int i = 0; i < tp->peers[p].nwires; i++)
            if ((rc = wire_setup(tp, &tp->peers[p].w[i])) != 0)
                return rc;
    if ((rc = weft__ib_exchange(tp, deadline)) != 0)
        return rc;
    tp->setup_pending = 0;
    for (int p = 0; p < tp->nranks; p++)
        if (tp->peers[p].nwires > 0) {
            weft__log(WEFT__LOG_INFO, tp->rank,
                      "ibverbs: writes of up to %u bytes go inline",
                      tp->peers[p].w[0].max_inline);
            break;
        }
    for (int p = 0; p < tp->nranks; p++)
        if (p != tp->rank && tp->peers[p].nwires == 0 &&
            !weft__ib_shm_peer(tp, p))
            tp->tcp_data = 1; /* relayed over the TCP side, or a path */
    tp->ready = 1;
    if ((rc = weft__ib_fo_start(tp)) != 0)
        return rc;
    /* Heartbeats (data.c): a silent loss is seen within two checks and the
     * queue pair's retries, which together fit in the wire timeout. */
    if (tp->p->cfg->wire_timeout_ms > 0) {
        uint64_t retries_ms = (uint64_t)4096 *
                              ((uint64_t)1 << weft__ib_qp_timeout(tp)) *
                              (IB_RETRY_CNT + 1) / 1000000u;
        uint64_t wt = (uint64_t)tp->p->cfg->wire_timeout_ms;

        tp->beat_every_ms =
            wt > retries_ms + 100 ? (int)((wt - retries_ms) / 2) : 50;
        tp->beat_ms = weft__now_ms() + (uint64_t)tp->beat_every_ms;
    }
    return WEFT_OK;
}

static int ib_create(const weft__tp_params *p, weft__tp **out)
{
    ib_tp *tp = calloc(1, sizeof *tp);
    weft__sigpipe_state sp;
    int rc, ndev = 0;

    *out = NULL;
    if (tp == NULL)
        return WEFT_ENOMEM;
    tp->p = p;
    tp->rank = p->rank;
    tp->nranks = p->nranks;
    tp->wires = p->wires;
    tp->slots = p->cfg->ib_slots;
    tp->slot_bytes = p->cfg->ib_slot_bytes;
    /* Send queue: a ring of writes plus credits (capped at credit_max);
     * receive queue: a ring of writes plus the credits a peer may have in
     * flight, with room to spare (a short one only costs an RNR retry). */
    tp->credit_max = tp->slots + 2;
    tp->sq_depth = tp->slots + tp->credit_max;
    tp->rq_depth = 2 * tp->slots + 4;
    weft__spin_init(&tp->spin, p->cfg);
    weft__sigpipe_block(&sp);
    rc = ib_create_guarded(tp);
    weft__sigpipe_restore(&sp);
    if (rc != 0) {
        if (tp->err == 0)
            tp->err = rc;
        ib_destroy((weft__tp *)tp);
        return rc;
    }
    for (ib_dev *d = tp->devs; d != NULL; d = d->next)
        ndev++;
    weft__log(WEFT__LOG_DEBUG, tp->rank,
              "ibverbs: %d device port(s), %d slots of %zu bytes per wire",
              ndev, tp->slots, tp->slot_bytes);
    *out = (weft__tp *)tp;
    return WEFT_OK;
}

static const weft__tp_relay_ops ib_relay = {
    .offered = 1,
    .send = weft__ib_relay_send,
    .recv = weft__ib_relay_recv,
};

const weft__tp_ops weft__ibverbs_ops = {
    .name = "ibverbs",
    .create = ib_create,
    .destroy = ib_destroy,
    .nwires = ib_nwires,
    .cable_wires = ib_cable_wires,
    .post_send = weft__ib_post_send,
    .post_recv = weft__ib_post_recv,
    .progress = weft__ib_progress,
    .wake = weft__ib_wake,
    .shutdown = ib_shutdown,
    .relay = &ib_relay,
    .box = &weft__tp_no_box,
    .read = &weft__tp_no_read,
};
