/*
 * Completions of the ibverbs transport, and its progress(): every work
 * completion checked, the devices' events, the TCP side's failure judged
 * once what landed is handed over (fail.c keeps it aside), and the wait
 * (spin, then sleep in poll()).
 */
#include "transport/ib/ib.h"

#include "transport/common.h"

#include <arpa/inet.h>
#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <string.h>

/* ---- completions ---- */

static const char *wr_kind_name(int kind)
{
    switch (kind) {
    case WR_DATA:
        return "RDMA write";
    case WR_CREDIT:
        return "credit message";
    case WR_BEAT:
        return "heartbeat";
    default:
        return "receive";
    }
}

/* After the TCP side failed and everything on the CQ was handed over
 * (poll_once): 0 when the failure is to be judged now, else how long at
 * most to wait before asking again (ms).
 *
 * With the lost peer known, what this rank still waits for from it
 * decides. Whatever it wrote before it completed an operation has landed
 * and been handed over by now, so a receive still posted on one of its
 * wires can never be filled, and a frame not yet written to it can never
 * be delivered: judged at once. A frame written to it but not yet
 * acknowledged may have arrived, and the peer may have completed its
 * operation on it before it died: its device acknowledged the write
 * before the peer's process even saw it land, so the acknowledgement is
 * normally here long before the close. But the two travel apart (the
 * acknowledgement through the RDMA device's deferred work, the close
 * through the socket), and a guest whose virtual CPUs the host holds back
 * can let the close overtake it: TCP_ACK_GRACE_MS covers that. Waiting
 * for the write to fail instead takes its retries (IB_RETRY_CNT + 1 QP
 * timeouts, about a second). A wire whose queue pair failed since
 * completes nothing more either.
 *
 * What this rank waits for from the other peers does not count as long as
 * it moves: an operation that they finish with the landed data succeeds.
 * But the TCP side reports only its first failure, so a peer that goes
 * after it (a survivor that failed on the loss and exited) is seen going
 * only where this rank asks the kernel about its connection (others_gone:
 * a peer it waits for, such as a hierarchical collective's leader of
 * another host, which the lost peer's ranks do not talk to); that peer
 * then counts as the lost one does. What it waits for through the TCP
 * side itself (a relayed message, frames of a peer over a path) cannot
 * come at all and is judged at once. Otherwise, once nothing has moved (no
 * completion, no post) for TCP_QUIET_MS, the failure is judged whatever
 * this rank waits for. That is also the whole rule where the lost peer is
 * not known. */
static int tcp_wait_ms(ib_tp *tp)
{
    uint64_t now = weft__now_ms();
    uint64_t end = tp->tcp_move_ms + TCP_QUIET_MS;
    uint64_t ack_end = tp->tcp_err_ms + TCP_ACK_GRACE_MS;

    if (now >= end)
        return 0;
    /* What comes through the failed TCP side (relayed, or over a path)
     * cannot come any more. */
    if (weft__tcp_waits(tp->tcp, -1))
        return 0;
    for (int p = 0; p < tp->nranks; p++)
        if (tp->peers[p].path && weft__tcp_waits(tp->tcp, p))
            return 0;
    for (int p = 0; tp->tcp_lost >= 0 && p < tp->nranks; p++) {
        const ib_peer *pe = &tp->peers[p];

        for (int i = 0; i < pe->nwires; i++) {
            const ib_wire *w = &pe->w[i];
            int busy =
                w->rq_head != NULL || w->sq_head != NULL || w->wq_head != NULL;

            if (w->dead && busy)
                return 0;
            if (p != tp->tcp_lost && p != tp->tcp_gone)
                continue;
            if (weft__xfer_wanted(w->rq_head) || w->sq_head != NULL)
                return 0;
            if (w->wq_head != NULL) {
                if (now >= ack_end)
                    return 0;
                if (ack_end < end)
                    end = ack_end;
            }
        }
    }
    return (int)(end - now);
}

/* After the TCP side failed (it takes no more news): a peer other than
 * the lost one that this rank waits for (a receive wanted, a frame not
 * yet written) and whose connection has ended since, asked of the kernel;
 * else -1. Asked before the completion queues are polled, so that what
 * that peer wrote before it left is handed over before it counts. */
static int others_gone(ib_tp *tp)
{
    for (int p = 0; tp->tcp_lost >= 0 && p < tp->nranks; p++) {
        const ib_peer *pe = &tp->peers[p];
        int waits = 0;

        if (p == tp->tcp_lost)
            continue;
        for (int i = 0; i < pe->nwires && !waits; i++)
            waits =
                weft__xfer_wanted(pe->w[i].rq_head) || pe->w[i].sq_head != NULL;
        if (waits && weft__tcp_peer_hup(tp->tcp, p))
            return p;
    }
    return -1;
}

/* Whether a failed completion's status may be its link's: no answer
 * (the retries ran out, a response timed out), or the flush of what was
 * queued behind such a failure, or a fatal error of the queue pair, or a
 * request of a queue pair the device moved to its error state (rxe
 * fails a write posted as its port goes down so: LOC_QP_OP_ERR). A
 * request the peer refused (REM_INV_REQ_ERR, REM_ACCESS_ERR, ...) or a
 * local protection or length error says that weft or the device is wrong:
 * failing over would hide it. */
static int link_status(enum ibv_wc_status st)
{
    return st == IBV_WC_RETRY_EXC_ERR || st == IBV_WC_WR_FLUSH_ERR ||
           st == IBV_WC_RESP_TIMEOUT_ERR || st == IBV_WC_FATAL_ERR ||
           st == IBV_WC_LOC_QP_OP_ERR;
}

static void wc_failed(ib_wire *w, int kind, const struct ibv_wc *wc)
{
    char detail[160];

    snprintf(detail, sizeof detail, "%s (status %d, vendor error 0x%x)",
             ibv_wc_status_str(wc->status), (int)wc->status, wc->vendor_err);
    weft__ib_wire_failed_as(w, WEFT_ETRANSPORT, link_status(wc->status),
                            wr_kind_name(kind), detail);
}

static void wc_recv(ib_wire *w, const struct ibv_wc *wc)
{
    ib_tp *tp = w->tp;
    uint32_t imm = ntohl(wc->imm_data);
    char detail[96];
    int rc;

    /* A wire being stopped (failover.c) posts no more on its queue pair. */
    if (!tp->shut && w->fo != FO_STOPPING &&
        (rc = weft__ib_post_recvs(w, 1)) != 0) {
        weft__ib_wire_failed(w, WEFT_ETRANSPORT, "ibv_post_recv", strerror(rc));
        return;
    }
    if (wc->opcode == IBV_WC_RECV_RDMA_WITH_IMM) {
        /* A slot landed: the writes of a wire land in order, so it is the
         * next slot of the ring. */
        if (imm == 0 || imm > tp->slot_bytes ||
            w->r_landed - w->r_consumed >= (uint64_t)tp->slots) {
            snprintf(detail, sizeof detail,
                     "a slot of %u bytes arrived with %llu unread "
                     "(protocol error)",
                     imm, (unsigned long long)(w->r_landed - w->r_consumed));
            weft__ib_wire_failed_as(w, WEFT_ETRANSPORT, 0, "receive", detail);
            return;
        }
        w->r_len[w->r_landed % (uint64_t)tp->slots] = imm;
        w->r_landed++;
    } else if (wc->opcode == IBV_WC_RECV && (wc->wc_flags & IBV_WC_WITH_IMM)) {
        /* Credits: the peer's count of consumed slots, modulo 2^32. */
        uint64_t c = w->s_credit + (uint32_t)(imm - (uint32_t)w->s_credit);
        if (c > w->s_posted) {
            weft__ib_wire_failed_as(
                w, WEFT_ETRANSPORT, 0, "receive",
                "credits for slots never written (protocol error)");
            return;
        }
        w->s_credit = c;
    } else {
        snprintf(detail, sizeof detail,
                 "unexpected completion opcode %d (protocol error)",
                 (int)wc->opcode);
        weft__ib_wire_failed_as(w, WEFT_ETRANSPORT, 0, "receive", detail);
        return;
    }
    tp->events++;
    weft__ib_wire_kick(w);
}

static void wc_handle(ib_tp *tp, const ib_dev *d, const struct ibv_wc *wc)
{
    ib_wire *w = (ib_wire *)(uintptr_t)(wc->wr_id & ~(uint64_t)WR_KIND_MASK);
    int kind = (int)(wc->wr_id & WR_KIND_MASK);
    uint64_t covered = 1;

    /* A queue pair that failover retired (failover.c): what it still
     * reports is not counted (the peer resends from the count this end
     * gave when it stopped). */
    if (wc->qp_num != w->qpn || d != w->dev)
        return;
    switch (kind) {
    case WR_DATA:
        /* A signalled write: it and the unsignalled ones before it. */
        if (wc->status == IBV_WC_SUCCESS && w->sig_done < w->sig_posted)
            covered = w->sig[w->sig_done++ % (uint64_t)tp->slots] - w->s_done;
        w->s_wr -= (int)covered;
        break;
    case WR_CREDIT:
        w->s_wr--;
        w->c_wr--;
        break;
    case WR_BEAT:
        w->s_wr--;
        break;
    default:
        w->r_wr--;
        break;
    }
    if (tp->shut)
        return;
    if (wc->status != IBV_WC_SUCCESS) {
        wc_failed(w, kind, wc);
        return;
    }
    if (kind == WR_RECV) {
        wc_recv(w, wc);
        return;
    }
    w->s_acked++;
    if (kind == WR_BEAT)
        return;
    if (kind == WR_DATA)
        w->s_done += covered;
    /* A free slot or send request: queued sends or credits may go. */
    tp->events++;
    weft__ib_wire_kick(w);
}

void weft__ib_cq_poll_all(ib_tp *tp)
{
    for (ib_dev *d = tp->devs; d != NULL; d = d->next) {
        struct ibv_wc wc[CQ_BATCH];
        int n;

        if (d->cq == NULL)
            continue;
        do {
            n = ibv_poll_cq(d->cq, CQ_BATCH, wc);
            for (int i = 0; i < n; i++)
                wc_handle(tp, d, &wc[i]);
        } while (n == CQ_BATCH);
        if (n < 0 && !tp->shut)
            weft__ib_fail(tp, WEFT_ETRANSPORT,
                          "rank %d: ibv_poll_cq on RDMA device %s failed",
                          tp->rank, d->name);
    }
}

static void cq_events(ib_dev *d)
{
    struct ibv_cq *cq;
    void *ctx;

    /* The channel's fd is non-blocking: this takes what is there. */
    while (ibv_get_cq_event(d->ch, &cq, &ctx) == 0) {
        ibv_ack_cq_events(cq, 1);
        d->armed = 0;
    }
}

static void async_events(ib_tp *tp, ib_dev *d)
{
    struct ibv_async_event ae;

    while (ibv_get_async_event(d->ctx, &ae) == 0) {
        const char *what = ibv_event_type_str(ae.event_type);

        switch (ae.event_type) {
        case IBV_EVENT_QP_FATAL:
        case IBV_EVENT_QP_REQ_ERR:
        case IBV_EVENT_QP_ACCESS_ERR: {
            ib_wire *w = ae.element.qp->qp_context;
            /* Not of a queue pair that failover retired. */
            if (w->qp == ae.element.qp)
                weft__ib_wire_failed(w, WEFT_ETRANSPORT, "queue pair", what);
            break;
        }
        case IBV_EVENT_PORT_ACTIVE:
            if (ae.element.port_num == d->port && d->down) {
                /* Its links may be picked again, and the wires that left
                 * them move back (failover.c). */
                d->down = 0;
                for (int p = 0; p < tp->nranks; p++)
                    for (int li = 0; li < tp->peers[p].nlinks; li++)
                        if (tp->peers[p].links[li].dev == d) {
                            tp->peers[p].lost_links &= ~((uint64_t)1 << li);
                            /* Down as the job started: its GID now. */
                            if (tp->peers[p].links[li].gid_index < 0)
                                weft__ib_link_gid(&tp->peers[p].links[li]);
                        }
                tp->fo_work = 1; /* wires may move back (failover.c) */
                weft__log(WEFT__LOG_WARN, tp->rank,
                          "RDMA device %s port %d is active again", d->name,
                          d->port);
            }
            break;
        case IBV_EVENT_PORT_ERR:
            /* A port of the device that this context does not use. */
            if (ae.element.port_num != d->port)
                break;
            /* Its link is lost: every wire on it fails, and moves to
             * another link where its peer has one (failover.c); where it
             * cannot, that fails the transport. */
            d->down = 1;
            for (int p = 0; p < tp->nranks && !tp->shut; p++)
                for (int i = 0; i < tp->peers[p].nwires; i++)
                    if (tp->peers[p].w[i].dev == d &&
                        tp->peers[p].w[i].fo == FO_UP)
                        weft__ib_wire_failed(
                            &tp->peers[p].w[i], WEFT_ETRANSPORT, "traffic",
                            "its port went down (IBV_EVENT_PORT_ERR: a "
                            "cable pulled, an interface down, or the "
                            "device reset)");
            /* ... and those resuming on it, or with no link left. */
            if (!tp->shut && tp->err == 0)
                weft__ib_fo_port_down(tp, d);
            break;
        case IBV_EVENT_CQ_ERR:
        case IBV_EVENT_DEVICE_FATAL:
            if (!tp->shut)
                weft__ib_fail(tp, WEFT_ETRANSPORT,
                              "rank %d: RDMA device %s port %d: %s (a cable "
                              "pulled, or the device reset)",
                              tp->rank, d->name, d->port, what);
            break;
        default:
            weft__log(WEFT__LOG_INFO, tp->rank, "RDMA device %s: event %s",
                      d->name, what);
            break;
        }
        ibv_ack_async_event(&ae);
    }
}

/* A peer that said goodbye sent everything it was going to before (its
 * writes were acknowledged, so their completions are here already), and
 * said per wire how many of this rank's slot writes had landed: a receive
 * that what has landed cannot fill, a send not yet written, or one that
 * the goodbye of its link does not cover, can never complete. */
static void left_check(ib_tp *tp)
{
    char lname[32];

    weft__ib_cq_poll_all(tp);
    weft__ib_process_dirty(tp);
    for (int p = 0; p < tp->nranks && tp->err == 0; p++) {
        ib_peer *pe = &tp->peers[p];
        if (!pe->left)
            continue;
        for (int i = 0; i < pe->nwires && tp->err == 0; i++) {
            ib_wire *w = &pe->w[i];
            int unsent = w->sq_head != NULL || (w->bye && w->wq_head != NULL);
            if ((weft__xfer_wanted(w->rq_head) &&
                 w->r_consumed == w->r_landed) ||
                unsent)
                weft__ib_fail(
                    tp, WEFT_EPEER,
                    "rank %d: peer %d finalized while this rank still "
                    "had frames to %s it on wire %d (%s, device %s)",
                    tp->rank, p, unsent ? "send to" : "receive from", w->w,
                    weft__ib_link_name(w, lname, sizeof lname), w->dev->name);
        }
    }
}

/* While spinning, the TCP side (a peer's close, a wake(), failover's
 * messages) is looked at this often: a look costs system calls (an
 * epoll_wait at least), as much as a small message takes. */
#define IB_TCP_EVERY_NS 20000

/* Whether a pass should look at the TCP side: always before a sleep and
 * after one (tcp), where it carries relayed messages, while setting up or
 * failing over, and once it failed (no system call then); else every
 * IB_TCP_EVERY_NS since the last such look, the clock read every 16th
 * pass. */
static int tcp_due(ib_tp *tp, int tcp)
{
    uint64_t now;

    if (tcp || tp->tcp_data || !tp->ready || tp->fo_work || tp->tcp_err != 0 ||
        tp->nleft > 0)
        return 1;
    if ((++tp->passes & 15) != 0 ||
        (now = weft__now_ns()) - tp->tcp_ns < IB_TCP_EVERY_NS)
        return 0;
    tp->tcp_ns = now;
    return 1;
}

/* One pass that never blocks: completions, wires, the TCP side (where
 * tcp, or where due). */
static int poll_once(ib_tp *tp, int tcp)
{
    unsigned ev = tp->events;

    weft__ib_cq_poll_all(tp);
    weft__ib_process_dirty(tp);
    if (tp->err != 0)
        return tp->err;
    if (tp->tcp_err != 0 && tp->tcp_gone < 0)
        tp->tcp_gone = others_gone(tp);
    if (tcp_due(tp, tcp) && weft__ib_tcp_news(tp) != 0) {
        /* A peer's connection closed. What it wrote before it completed
         * an operation was acknowledged before that completion, so its
         * completions are on the CQ by now, even where the poll above just
         * missed them: look once more, and hand over everything before
         * judging, so that an operation it finishes still succeeds (as
         * over TCP, where bytes sent before a close arrive before it). The
         * caller looks at its operation after each pass that moved
         * anything, and calls again if it still waits; a pass that moved
         * nothing judges the failure once this rank waits for something
         * from the lost peer that cannot come (tcp_wait_ms; weft__ib_block
         * sleeps no longer than it says). */
        weft__ib_cq_poll_all(tp);
        weft__ib_process_dirty(tp);
        if (tp->err != 0)
            return tp->err;
        if (tp->events != ev) {
            tp->tcp_move_ms = weft__now_ms();
            return WEFT_OK;
        }
        return tcp_wait_ms(tp) != 0 ? WEFT_OK : weft__ib_tcp_judge(tp);
    }
    if (tp->nleft > 0)
        left_check(tp);
    if (tp->fo_work && tp->err == 0)
        weft__ib_fo_run(tp);
    weft__ib_beat(tp);
    return tp->err;
}

/* Before a sleep: arms the completion queues and passes once more;
 * returns 1 where that pass moved anything (do not sleep), or appends the
 * descriptors to sleep on to pfd (at most max; *n counts them: the TCP
 * side's, then each device's completion channel and async events), lowers
 * *tmo (ms) to the longest this transport may sleep and returns 0; or the
 * transport's error. */
static int sleep_prep(ib_tp *tp, struct pollfd *pfd, int max, int *n, int *tmo)
{
    unsigned ev = tp->events;
    uint64_t now;
    int tt, rc;

    for (ib_dev *d = tp->devs; d != NULL; d = d->next) {
        if (d->cq == NULL || d->armed)
            continue;
        if ((rc = ibv_req_notify_cq(d->cq, 0)) != 0) {
            weft__ib_fail(tp, WEFT_ETRANSPORT,
                          "rank %d: ibv_req_notify_cq on RDMA device %s: %s",
                          tp->rank, d->name, strerror(rc));
            return tp->err;
        }
        d->armed = 1;
    }
    /* Completions that arrived between the last poll and the arming raise
     * no event: look once more before sleeping. */
    if ((rc = poll_once(tp, 1)) != 0)
        return rc;
    if (tp->events != ev)
        return 1;
    now = weft__now_ms();
    tt = weft__tcp_timeout(tp->tcp);
    if (tt >= 0 && tt < *tmo)
        *tmo = tt;
    if (tp->tcp_err != 0 && (tt = tcp_wait_ms(tp)) < *tmo)
        *tmo = tt;
    if (tp->fo_work && (tt = weft__ib_fo_wait_ms(tp)) < *tmo)
        *tmo = tt;
    if (tp->beat_every_ms > 0 && tp->ready)
        *tmo = tp->beat_ms <= now                   ? 0
               : tp->beat_ms - now < (uint64_t)*tmo ? (int)(tp->beat_ms - now)
                                                    : *tmo;
    if (*n + 1 > max) {
        weft__ib_fail(tp, WEFT_ETRANSPORT,
                      "rank %d: too many descriptors to sleep on", tp->rank);
        return tp->err;
    }
    pfd[(*n)++] =
        (struct pollfd){.fd = weft__tcp_fd(tp->tcp), .events = POLLIN};
    for (ib_dev *d = tp->devs; d != NULL && *n + 2 <= max; d = d->next) {
        if (d->cq == NULL)
            continue;
        pfd[(*n)++] = (struct pollfd){.fd = d->ch->fd, .events = POLLIN};
        pfd[(*n)++] = (struct pollfd){.fd = d->ctx->async_fd, .events = POLLIN};
    }
    return 0;
}

/* After the poll() on what sleep_prep gave: the devices' events. */
static void woke(ib_tp *tp, const struct pollfd *pfd, int n)
{
    for (int i = 0; i < n; i++) {
        if (pfd[i].revents == 0)
            continue;
        for (ib_dev *d = tp->devs; d != NULL; d = d->next) {
            if (d->cq == NULL)
                continue;
            if (pfd[i].fd == d->ch->fd)
                cq_events(d);
            else if (pfd[i].fd == d->ctx->async_fd)
                async_events(tp, d);
            else
                continue;
            break;
        }
    }
}

/* Sleeps until a completion, a TCP event, a wake() or the deadline. */
int weft__ib_block(ib_tp *tp, uint64_t deadline_ms)
{
    struct pollfd pfd[1 + 2 * MAX_DEVS];
    int n = 0, tmo = 60000, rc;
    uint64_t now;

    if ((rc = sleep_prep(tp, pfd, 1 + 2 * MAX_DEVS, &n, &tmo)) != 0)
        return rc < 0 ? rc : WEFT_OK;
    now = weft__now_ms();
    if (now >= deadline_ms)
        return WEFT_OK;
    if (deadline_ms - now < (uint64_t)tmo)
        tmo = (int)(deadline_ms - now);
    rc = poll(pfd, (nfds_t)n, tmo);
    if (rc < 0 && errno != EINTR) {
        weft__ib_fail(tp, WEFT_ETRANSPORT, "rank %d: poll: %s", tp->rank,
                      strerror(errno));
        return tp->err;
    }
    if (rc > 0)
        woke(tp, pfd, n);
    return tp->err;
}

/* poll_once, as weft__tp_spin calls it. */
static int spin_pass(void *arg)
{
    return poll_once(arg, 0);
}

/* One pass, unless this transport failed or was shut down: 1 where
 * something happened, 0 where not, or the error. progress() starts with
 * it, and shared memory runs it as its far transport's poll. */
static int pass(ib_tp *tp, int look)
{
    unsigned ev = tp->events;
    int rc;

    if (tp->err != 0)
        return tp->err;
    if (tp->shut)
        return WEFT_EABORTED;
    if ((rc = poll_once(tp, look)) != 0)
        return rc;
    return tp->events != ev;
}

int weft__ib_progress(weft__tp *t, uint64_t deadline_ms)
{
    ib_tp *tp = (ib_tp *)t;
    unsigned ev;
    int rc;

    if ((rc = pass(tp, 0)) != 0)
        return rc < 0 ? rc : WEFT_OK;
    ev = tp->events;
    /* With a core to spare, poll a little before sleeping: a completion
     * channel wake-up costs more than a short message takes. */
    rc = weft__tp_spin(weft__spin_len(&tp->spin, deadline_ms), spin_pass, tp,
                       &tp->events, ev);
    if (rc != 0)
        return rc < 0 ? rc : WEFT_OK;
    uint64_t slept = weft__now_ns();
    for (;;) {
        if (weft__now_ms() >= deadline_ms)
            return WEFT_ETIMEDOUT;
        if ((rc = weft__ib_block(tp, deadline_ms)) != 0)
            return rc;
        if ((rc = poll_once(tp, 1)) != 0)
            return rc;
        if (tp->events != ev) {
            weft__spin_slept(&tp->spin, weft__now_ns() - slept);
            return WEFT_OK;
        }
    }
}

void weft__ib_wake(weft__tp *t)
{
    /* The TCP transport's wake-up makes weft__tcp_fd() readable, which
     * weft__ib_block() sleeps on. */
    weft__tcp_ops.wake(((ib_tp *)t)->tcp);
}

/* ---- as what carries shared memory's traffic to other hosts ---- */

static weft__tp *far_tcp(weft__tp *t)
{
    return ((ib_tp *)t)->tcp;
}

static int far_poll(weft__tp *t, int look)
{
    return pass((ib_tp *)t, look);
}

static int far_sleep_prep(weft__tp *t, struct pollfd *pfd, int max, int *n,
                          int *tmo)
{
    return sleep_prep((ib_tp *)t, pfd, max, n, tmo);
}

static void far_woke(weft__tp *t, const struct pollfd *pfd, int n)
{
    woke((ib_tp *)t, pfd, n);
}

const weft__tp_far weft__ib_far = {
    .ops = &weft__ibverbs_ops,
    .tcp = far_tcp,
    .poll = far_poll,
    .sleep_prep = far_sleep_prep,
    .woke = far_woke,
};
