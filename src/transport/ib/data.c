/*
 * The ibverbs transport's data path: frames copied into the send ring and
 * RDMA-written to the peer's receive ring, slots copied out of the receive
 * ring into the posted receives, credits returned, send frames completed
 * once their writes are acknowledged; and posting.
 */
#include "transport/ib/ib.h"

#include "transport/common.h"

#include <arpa/inet.h>
#include <string.h>

void weft__ib_wire_kick(ib_wire *w)
{
    if (!w->dirty) {
        w->dirty = 1;
        w->dirty_next = w->tp->dirty;
        w->tp->dirty = w;
    }
}

/* Returns the peer the slots it has consumed since the last return, once
 * they are half a ring: a sender blocked on credits has a whole ring
 * outstanding, all of which this side consumes before it needs more, so
 * returning at half a ring never deadlocks. Deferred (and retried when a
 * send request completes) while the send queue is full. */
static void credit_maybe(ib_wire *w)
{
    ib_tp *tp = w->tp;
    uint64_t due = w->r_consumed - w->r_returned;
    uint64_t half = tp->slots / 2 > 0 ? (uint64_t)tp->slots / 2 : 1;
    struct ibv_send_wr wr, *bad = NULL;
    int rc;

    if (due < half || tp->shut || tp->err != 0 || w->dead || w->fo != FO_UP ||
        w->c_wr >= tp->credit_max || w->s_wr >= tp->sq_depth)
        return;
    memset(&wr, 0, sizeof wr);
    wr.wr_id = (uintptr_t)w | WR_CREDIT;
    wr.opcode = IBV_WR_SEND_WITH_IMM;
    wr.send_flags = IBV_SEND_SIGNALED;
    wr.imm_data = htonl((uint32_t)w->r_consumed);
    rc = ibv_post_send(w->qp, &wr, &bad);
    if (rc != 0) {
        weft__ib_wire_failed(w, WEFT_ETRANSPORT, "ibv_post_send (credit)",
                             strerror(rc));
        return;
    }
    w->r_returned = w->r_consumed;
    w->s_wr++;
    w->c_wr++;
}

/* Heartbeats: a wire with no send request outstanding and none completed
 * since the last check gets a zero-length RDMA write, which its peer's
 * device acknowledges (a stopped process's too). On a link that drops
 * everything silently it fails after the queue pair's retries
 * (weft__ib_qp_timeout fits them in WEFT_WIRE_TIMEOUT_MS), and the wire
 * fails over, or the transport fails, as a data write's would: an idle
 * wire notices a silent loss within the wire timeout too, not at its next
 * write. A wire whose writes complete needs none. Checks run inside
 * progress(), every beat_every_ms: a loss is seen within two checks and
 * the retries. */
void weft__ib_beat(ib_tp *tp)
{
    uint64_t now;

    if (tp->beat_every_ms <= 0 || !tp->ready || tp->shut || tp->err != 0 ||
        tp->tcp_err != 0 || (now = weft__now_ms()) < tp->beat_ms)
        return;
    tp->beat_ms = now + (uint64_t)tp->beat_every_ms;
    for (int p = 0; p < tp->nranks; p++) {
        ib_peer *pe = &tp->peers[p];

        if (pe->left)
            continue;
        for (int i = 0; i < pe->nwires; i++) {
            ib_wire *w = &pe->w[i];
            struct ibv_send_wr wr, *bad = NULL;
            int rc;

            if (w->qp == NULL || w->dead || w->bye || w->fo != FO_UP ||
                w->need_stop || w->s_wr > 0 || w->s_acked != w->beat_seen) {
                w->beat_seen = w->s_acked;
                continue;
            }
            memset(&wr, 0, sizeof wr);
            wr.wr_id = (uintptr_t)w | WR_BEAT;
            wr.opcode = IBV_WR_RDMA_WRITE;
            wr.send_flags = IBV_SEND_SIGNALED;
            wr.wr.rdma.remote_addr = w->raddr;
            wr.wr.rdma.rkey = w->rkey;
            if ((rc = ibv_post_send(w->qp, &wr, &bad)) != 0) {
                weft__ib_wire_failed(w, WEFT_ETRANSPORT,
                                     "ibv_post_send (heartbeat)", strerror(rc));
                continue;
            }
            w->s_wr++;
        }
    }
}

/* Copies landed slots into the posted receives, in stream order, and
 * completes each receive once it holds all its bytes. Runs only inside
 * progress() (completions may run). */
static void rx_drain(ib_wire *w)
{
    ib_tp *tp = w->tp;
    size_t S = tp->slot_bytes;

    while (w->rq_head != NULL && tp->err == 0 && !tp->shut) {
        weft__xfer *x = w->rq_head;

        if (x->got < x->len) {
            uint32_t slot;
            size_t n, avail;

            if (w->r_consumed == w->r_landed)
                break;
            slot = (uint32_t)(w->r_consumed % (uint64_t)tp->slots);
            avail = w->r_len[slot] - w->r_off;
            n = x->len - x->got < avail ? x->len - x->got : avail;
            memcpy(x->buf + x->got, w->rring + slot * S + w->r_off, n);
            x->got += n;
            w->r_off += n;
            if (w->r_off == w->r_len[slot]) {
                w->r_off = 0;
                w->r_consumed++;
                credit_maybe(w);
            }
        }
        if (x->got == x->len) {
            w->rq_head = x->tp_next;
            if (w->rq_head == NULL)
                w->rq_tail = NULL;
            x->tp_next = NULL;
            tp->events++;
            x->done(x);
        }
    }
}

/* The slot writes of one flush, posted together (chain_post). */
typedef struct {
    struct ibv_send_wr wr[IB_CHAIN];
    struct ibv_sge sge[IB_CHAIN];
    uint64_t at[IB_CHAIN]; /* s_posted after each write */
    int n;
} chain;

/* Posts the chain's writes with one call. Only the last asks for a
 * completion, and any that ends half a ring of writes since the last that
 * asked: a completion says every earlier write on the queue pair
 * completed too (wc_handle counts them), the last one keeps a flush from
 * leaving writes that no completion will ever cover, and the half ring
 * frees slots while the ring still has writes to go. */
static int chain_post(ib_wire *w, chain *ch)
{
    ib_tp *tp = w->tp;
    uint64_t half = tp->slots / 2 > 0 ? (uint64_t)tp->slots / 2 : 1;
    uint64_t last = w->sig_posted > 0
                        ? w->sig[(w->sig_posted - 1) % (uint64_t)tp->slots]
                        : w->s_done;
    struct ibv_send_wr *bad = NULL;
    int rc;

    if (ch->n == 0)
        return 0;
    for (int i = 0; i < ch->n; i++) {
        ch->wr[i].next = i + 1 < ch->n ? &ch->wr[i + 1] : NULL;
        if (i + 1 == ch->n || ch->at[i] - last >= half) {
            ch->wr[i].send_flags |= IBV_SEND_SIGNALED;
            w->sig[w->sig_posted++ % (uint64_t)tp->slots] = ch->at[i];
            last = ch->at[i];
            tp->signalled++;
        }
    }
    tp->writes += (uint64_t)ch->n;
    ch->n = 0;
    rc = ibv_post_send(w->qp, &ch->wr[0], &bad);
    if (rc != 0) {
        weft__ib_wire_failed(w, WEFT_ETRANSPORT, "ibv_post_send (RDMA write)",
                             strerror(rc));
        return -1;
    }
    return 0;
}

/* Adds to the chain an RDMA write of len bytes of send slot `slot` into
 * the same slot of the peer's receive ring (the immediate carries the
 * length); posts the chain once it is full. */
static int post_write(ib_wire *w, chain *ch, uint32_t slot, size_t len)
{
    ib_tp *tp = w->tp;
    size_t off = (size_t)slot * tp->slot_bytes;
    struct ibv_send_wr *wr = &ch->wr[ch->n];

    ch->sge[ch->n] = (struct ibv_sge){
        .addr = (uintptr_t)(w->sring + off),
        .length = (uint32_t)len,
        .lkey = w->smr->lkey,
    };
    memset(wr, 0, sizeof *wr);
    wr->wr_id = (uintptr_t)w | WR_DATA;
    wr->sg_list = &ch->sge[ch->n];
    wr->num_sge = 1;
    wr->opcode = IBV_WR_RDMA_WRITE_WITH_IMM;
    if (len <= w->max_inline)
        wr->send_flags = IBV_SEND_INLINE;
    wr->imm_data = htonl((uint32_t)len);
    wr->wr.rdma.remote_addr = w->raddr + off;
    wr->wr.rdma.rkey = w->rkey;
    w->s_posted++;
    w->s_wr++;
    ch->at[ch->n++] = w->s_posted;
    return ch->n == IB_CHAIN ? chain_post(w, ch) : 0;
}

/* Whether `count` completed slot writes have reached a frame's mark. Marks
 * live in a size_t (the frame's got field), so compare modulo its width:
 * a mark is never more than a ring of slots away from the count. */
static int slots_reached(uint64_t count, size_t mark)
{
    return (size_t)((size_t)count - mark) <= SIZE_MAX / 2;
}

/* Packs queued send frames into free slots and writes them, while the
 * peer has room (credits) and this side has free slots; after a resume
 * (failover.c), first writes again the slots from the peer's count on,
 * which are still in the send ring (a slot is reused only once the peer
 * has consumed it). A frame whose last
 * byte is in the ring moves to the wire's queue of frames waiting for
 * their writes (tx_done completes them), marked with the count of slot
 * writes that covers that byte: the slot being filled, counted from one. A
 * frame of no bytes takes the mark of the bytes before it, so that frames
 * still complete in order. */
static void tx_flush(ib_wire *w)
{
    ib_tp *tp = w->tp;
    uint64_t K = (uint64_t)tp->slots;
    size_t S = tp->slot_bytes;
    chain ch;

    ch.n = 0;
    while ((w->sq_head != NULL || w->s_posted < w->replay_end) &&
           tp->err == 0 && !tp->shut && !w->dead && w->fo == FO_UP) {
        uint32_t slot;
        char *dst;
        size_t fill = 0;

        if (w->s_posted - w->s_credit >= K || w->s_posted - w->s_done >= K ||
            w->s_wr >= tp->sq_depth)
            break;
        slot = (uint32_t)(w->s_posted % K);
        if (w->s_posted < w->replay_end) {
            if (post_write(w, &ch, slot, w->s_len[slot]) != 0)
                return;
            continue;
        }
        dst = w->sring + (size_t)slot * S;
        while (w->sq_head != NULL && fill < S) {
            weft__xfer *x = w->sq_head;
            size_t n = x->len - w->sq_off;

            if (n > S - fill)
                n = S - fill;
            memcpy(dst + fill, x->buf + w->sq_off, n);
            fill += n;
            w->sq_off += n;
            if (w->sq_off == x->len) {
                w->sq_head = x->tp_next;
                if (w->sq_head == NULL)
                    w->sq_tail = NULL;
                w->sq_off = 0;
                x->got = (size_t)(w->s_posted + (fill > 0));
                weft__xq_push(&w->wq_head, &w->wq_tail, x);
            }
        }
        w->s_len[slot] = (uint32_t)fill;
        if (fill > 0 && post_write(w, &ch, slot, fill) != 0)
            return;
    }
    chain_post(w, &ch);
}

/* Completes, in order, the frames whose last byte's slot write has
 * completed (or that the peer's goodbye says have landed). Runs only
 * inside progress(). */
static void tx_done(ib_wire *w)
{
    ib_tp *tp = w->tp;
    uint64_t acked = w->s_done > w->s_landed ? w->s_done : w->s_landed;

    while (w->wq_head != NULL && tp->err == 0 && !tp->shut) {
        weft__xfer *x = w->wq_head;

        if (!slots_reached(acked, x->got))
            break;
        w->wq_head = x->tp_next;
        if (w->wq_head == NULL)
            w->wq_tail = NULL;
        /* done() may post x again, which reuses its link. */
        x->tp_next = NULL;
        tp->events++;
        x->done(x);
    }
}

/* Runs the wires that have something to do: landed slots or posted
 * receives, completed writes, queued sends, credits that were deferred. */
void weft__ib_process_dirty(ib_tp *tp)
{
    while (tp->dirty != NULL && tp->err == 0 && !tp->shut) {
        ib_wire *w = tp->dirty;

        tp->dirty = w->dirty_next;
        w->dirty = 0;
        w->dirty_next = NULL;
        rx_drain(w);
        tx_flush(w);
        /* After the flush: a frame of no bytes may be complete at once. */
        tx_done(w);
        credit_maybe(w);
    }
}

int weft__ib_post_recvs(ib_wire *w, int n)
{
    for (int i = 0; i < n; i++) {
        struct ibv_recv_wr wr, *bad = NULL;
        int rc;

        memset(&wr, 0, sizeof wr);
        wr.wr_id = (uintptr_t)w | WR_RECV;
        /* No scatter list: data arrives by RDMA write, credits are
         * zero-length sends; only the immediate matters. */
        wr.num_sge = 0;
        rc = ibv_post_recv(w->qp, &wr, &bad);
        if (rc != 0)
            return rc;
        w->r_wr++;
    }
    return 0;
}

/* ---- posting ---- */

static int post_target(ib_tp *tp, int p, int wi, ib_wire **out)
{
    if (tp->err != 0)
        return tp->err;
    if (tp->shut)
        return WEFT_EABORTED;
    if (p < 0 || p >= tp->nranks || wi < 0 || wi >= tp->peers[p].nwires)
        return weft__tp_no_wire(tp->p->sink, tp->rank, p, wi);
    *out = &tp->peers[p].w[wi];
    return WEFT_OK;
}

/* A frame to or from a path peer (ib_peer.path), on the TCP side's wire
 * wi to it. */
static int path_post(ib_tp *tp, int p, int wi, weft__xfer *x, int send)
{
    /* As a relay: once the TCP side has failed nothing can arrive on it,
     * so its failure is judged at once. */
    if (tp->err == 0 && tp->tcp_err != 0)
        weft__ib_tcp_judge(tp);
    if (tp->err != 0)
        return tp->err;
    if (tp->shut)
        return WEFT_EABORTED;
    return send ? weft__tcp_ops.post_send(tp->tcp, p, wi, x)
                : weft__tcp_ops.post_recv(tp->tcp, p, wi, x);
}

int weft__ib_post_send(weft__tp *t, int p, int wi, weft__xfer *x)
{
    ib_tp *tp = (ib_tp *)t;
    ib_wire *w = NULL;
    int rc;

    if (p >= 0 && p < tp->nranks && tp->peers[p].path)
        return path_post(tp, p, wi, x, 1);
    rc = post_target(tp, p, wi, &w);

    if (rc != 0)
        return rc;
    /* A wire that died after a failure of the TCP side takes the frame:
     * that failure is judged once what landed is handed over. */
    if (tp->peers[p].left || (w->dead && tp->tcp_err == 0)) {
        weft__ib_fail(
            tp, WEFT_EPEER,
            "rank %d: cannot send to peer %d on wire %d: the peer has "
            "finalized",
            tp->rank, p, wi);
        return tp->err;
    }
    /* Queued: progress() copies it out (completions never run in a
     * post). A post counts as movement for tcp_wait_ms. */
    if (tp->tcp_err != 0)
        tp->tcp_move_ms = weft__now_ms();
    weft__xq_push(&w->sq_head, &w->sq_tail, x);
    weft__ib_wire_kick(w);
    return WEFT_OK;
}

int weft__ib_post_recv(weft__tp *t, int p, int wi, weft__xfer *x)
{
    ib_tp *tp = (ib_tp *)t;
    ib_wire *w = NULL;
    int rc;

    if (p >= 0 && p < tp->nranks && tp->peers[p].path)
        return path_post(tp, p, wi, x, 0);
    rc = post_target(tp, p, wi, &w);

    if (rc != 0)
        return rc;
    /* Allowed after the peer left: what it sent before may have landed
     * (left_check fails what cannot be filled). */
    x->got = 0;
    if (tp->tcp_err != 0)
        tp->tcp_move_ms = weft__now_ms();
    weft__xq_push(&w->rq_head, &w->rq_tail, x);
    weft__ib_wire_kick(w);
    return WEFT_OK;
}

/* The relay runs on the TCP side: once that has failed, nothing relayed
 * can arrive any more, so its failure is judged at once. */
int weft__ib_relay_send(weft__tp *t, int peer, weft__xfer *x)
{
    ib_tp *tp = (ib_tp *)t;

    if (tp->err == 0 && tp->tcp_err != 0)
        weft__ib_tcp_judge(tp);
    return tp->err != 0 ? tp->err : weft__tcp_ops.relay->send(tp->tcp, peer, x);
}

int weft__ib_relay_recv(weft__tp *t, int peer, weft__xfer *x)
{
    ib_tp *tp = (ib_tp *)t;

    if (tp->err == 0 && tp->tcp_err != 0)
        weft__ib_tcp_judge(tp);
    return tp->err != 0 ? tp->err : weft__tcp_ops.relay->recv(tp->tcp, peer, x);
}
