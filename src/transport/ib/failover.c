/*
 * Failover of the ibverbs transport: a wire whose queue pair fails (an
 * error completion, the retry timeout, its port going down) while its
 * peer has other wires goes on over a new queue pair on a link left, with
 * exactly the bytes it would have carried. The engine never learns of it:
 * the wire keeps its place in every plan.
 *
 * A wire is a stream of slots each way (data.c). Each end stops its side:
 * its queue pair goes to the error state (nothing more lands), the
 * completions still on the CQ are counted, and the queue pair is retired
 * (its later completions are told apart by number and device, and
 * ignored: wc_handle). What this end says at its stop is the count of the
 * peer's slots that landed here and the count it consumed. The peer's
 * slots from that count on are all still in its send ring (a slot is
 * reused only once its receiver consumed it), so the peer writes them
 * again, from the same ring positions, on the new queue pair: nothing is
 * lost, and nothing counts twice (a slot this end counted is never written
 * again; one it did not count is written again into the same place, with
 * the same bytes). Send frames complete once the peer's count covers them.
 *
 * The messages go on the TCP wires that the transport bootstraps over
 * (one per link, which the TCP transport itself resumes on another link
 * when its own is lost), on one whose link is up, as fixed-size messages
 * beside the goodbye (exchange.c: ctl_done). The higher rank of the pair
 * leads, as TCP's dialling side does:
 *   lower rank, on noticing:  S  (its queue pair of epoch e failed)
 *   higher rank, on noticing or on S:  F  (its counts, the link it picked,
 *      its new queue pair)
 *   lower rank, on F: stops if it had not, makes its new queue pair on
 *      that link, connects it:  C  (its counts, its new queue pair)
 *   higher rank, on C: connects, resumes (writes again from the lower
 *      rank's count):  A
 *   lower rank, on A: resumes (from the higher rank's count).
 * An end that cannot connect its new queue pair on the link picked (rxe
 * resolves the peer's address as it connects, and a link just come back
 * may not answer yet) says so instead of C or A:  N  (the epoch, the
 * link); both ends then retire the new queue pairs, take that link as
 * lost for a wire timeout, and the higher rank picks again (F).
 * Each end writes only once the other's queue pair is connected, so no
 * write meets a queue pair that is not ready. Messages carry the epoch
 * (queue pairs the wire retired), and one that arrives ahead of its turn
 * (the two ends may use different TCP wires) waits.
 *
 * Links: a link whose wire was lost, or whose port went down, is not
 * picked while another is there. A port that comes back up
 * (IBV_EVENT_PORT_ACTIVE) makes its links candidates again, as does, for
 * a link lost with its port up (silently), its TCP wire running on it
 * again a wire timeout after the loss; the higher rank moves each wire
 * that left one back to it the same way (a move: the F message says so,
 * and nothing counts as lost), once that link's TCP wire runs on it. A
 * port that goes down under wires resuming on it sends them elsewhere
 * (weft__ib_fo_port_down). The last wire
 * to a peer lost, or a wire not resumed within twice WEFT_WIRE_TIMEOUT_MS
 * and a second, is WEFT_EPEER naming the wires and why.
 */
#include "transport/ib/ib.h"

#include "base/bytes.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { M_S = 'S', M_F = 'F', M_C = 'C', M_A = 'A', M_N = 'N' };
enum { KEEP = 0, DONE = 1 };

static uint64_t resume_limit_ms(const ib_tp *tp)
{
    return 2 * (uint64_t)tp->p->cfg->wire_timeout_ms + 1000;
}

/* The largest QP timeout (4.096 us * 2^t per try) whose IB_RETRY_CNT + 1
 * tries fit in WEFT_WIRE_TIMEOUT_MS, never below IB_QP_TIMEOUT: a silent
 * link is then noticed within the wire timeout by a wire that has a write
 * outstanding (2000 ms: 15, 7 tries of 134 ms, 0.94 s). */
uint8_t weft__ib_qp_timeout(const ib_tp *tp)
{
    uint64_t budget_ns = (uint64_t)tp->p->cfg->wire_timeout_ms * 1000000u;
    uint8_t t = IB_QP_TIMEOUT;

    if (tp->p->cfg->wire_timeout_ms <= 0)
        return t;
    while (t < 30 &&
           (uint64_t)4096 * ((uint64_t)1 << (t + 1)) * (IB_RETRY_CNT + 1) <=
               budget_ns)
        t++;
    return t;
}

int weft__ib_can_fail_over(const ib_wire *w)
{
    const ib_tp *tp = w->tp;

    return tp->ready && tp->p->cfg->wire_timeout_ms > 0 &&
           w->link != WEFT__LINK_LOOPBACK && tp->peers[w->peer].nwires >= 2;
}

static int link_ok(const ib_peer *pe, int li)
{
    return !pe->links[li].dev->down && !((pe->lost_links >> li) & 1) &&
           pe->links[li].gid_index >= 0;
}

/* A link to pick for a wire that leaves its link: the one it was made on
 * where that is up and lost no wire, else the next one that is; else its
 * own again where its port is up (a queue pair that failed on a link that
 * still works, with several wires on it); else one that refused a new
 * queue pair lately and whose port is up (tried again, within the resume
 * limit); else -1. */
static int pick_link(const ib_tp *tp, const ib_wire *w)
{
    const ib_peer *pe = &tp->peers[w->peer];

    if (link_ok(pe, w->home_li))
        return w->home_li;
    for (int pass = 0; pass < 2; pass++)
        for (int k = 1; k <= pe->nlinks; k++) {
            int li = (w->li + k) % pe->nlinks;

            if (pe->links[li].dev->down)
                continue;
            int refused = (pe->refused_links >> li) & 1;

            if (pass == 0
                    ? refused || (li != w->li && ((pe->lost_links >> li) & 1))
                    : !refused)
                continue;
            return li;
        }
    return -1;
}

/* Whether w runs away from its own link, now up, and this end leads its
 * move back (the higher rank). */
static int wants_home(const ib_tp *tp, const ib_wire *w)
{
    return tp->rank > w->peer && w->fo == FO_UP && !w->need_stop &&
           w->li != w->home_li && link_ok(&tp->peers[w->peer], w->home_li);
}

/* Whether link li carries traffic both ways again, as its TCP wire shows
 * (back on its own link: the TCP side tries it once a second), before a
 * wire moves back to it: rxe resolves the peer's address as a queue pair
 * connects, and waits for it (seconds) where the far end does not answer
 * yet. */
static int home_answers(ib_tp *tp, const ib_peer *pe, int li)
{
    return weft__tcp_wire_home(tp->tcp, pe->links[li].peer,
                               pe->links[li].twire);
}

/* Fails the transport: the last wire to w's peer is lost. */
static void all_lost(ib_tp *tp, ib_wire *w)
{
    ib_peer *pe = &tp->peers[w->peer];
    char list[WEFT__ERRMSG_LEN / 2];
    size_t n = 0;

    list[0] = '\0';
    for (int i = 0; i < pe->nwires && n + 2 < sizeof list; i++) {
        const ib_wire *v = &pe->w[i];
        if (v->fo == FO_UP && !v->need_stop)
            continue;
        int k =
            snprintf(list + n, sizeof list - n, "%swire %d (link %u, %s): %s",
                     n ? "; " : "", v->w, v->link, v->dev->name, v->why);
        if (k < 0)
            break;
        n += (size_t)k < sizeof list - n ? (size_t)k : sizeof list - n - 1;
    }
    weft__ib_fail(tp, WEFT_EPEER,
                  "rank %d: every wire to peer %d is lost (no link left to "
                  "resume on): %s",
                  tp->rank, w->peer, list);
}

static void msg_sent(weft__xfer *x)
{
    ((ib_msg *)x)->busy = 0;
}

/* The TCP wire to send a peer's messages on: one that is up (not waiting
 * to resume: its link lost) on a link whose port is up and that never
 * lost a wire (a TCP connection that lived through an outage may still
 * wait for its retransmission timer), else on a link whose port is up and
 * lost no wire, else one that is up; else that of a link a wire to the
 * peer works on now, else one whose link has lost no wire and whose port
 * is up, else the first. */
static ib_link *ctl_link(ib_tp *tp, ib_peer *pe)
{
    for (int pass = 0; pass < 3; pass++)
        for (int li = 0; li < pe->nlinks; li++)
            if ((pass == 2 || (link_ok(pe, li) &&
                               (pass == 1 || !((pe->ever_lost >> li) & 1)))) &&
                weft__tcp_wire_ready(tp->tcp, pe->links[li].peer,
                                     pe->links[li].twire))
                return &pe->links[li];
    for (int i = 0; i < pe->nwires; i++) {
        const ib_wire *v = &pe->w[i];
        if (v->fo == FO_UP && !v->need_stop && link_ok(pe, v->li))
            return &pe->links[v->li];
    }
    for (int li = 0; li < pe->nlinks; li++)
        if (link_ok(pe, li))
            return &pe->links[li];
    return &pe->links[0];
}

static int send_msg(ib_tp *tp, ib_wire *w, int type, uint32_t epoch)
{
    ib_peer *pe = &tp->peers[w->peer];
    ib_msg *m;
    int rc;

    for (m = tp->tx_msgs; m != NULL && m->busy; m = m->next)
        ;
    if (m == NULL) {
        if ((m = calloc(1, sizeof *m)) == NULL) {
            weft__ib_fail(tp, WEFT_ENOMEM, "rank %d: out of memory", tp->rank);
            return tp->err;
        }
        m->tp = tp;
        m->next = tp->tx_msgs;
        tp->tx_msgs = m;
    }
    memset(m->b, 0, sizeof m->b);
    m->b[0] = (uint8_t)type;
    m->b[1] = (uint8_t)w->moving;
    weft__put_be32(m->b + 4, (uint32_t)w->w);
    weft__put_be32(m->b + 8, epoch);
    weft__put_be32(m->b + 12, w->rep_landed);
    weft__put_be32(m->b + 16, w->rep_consumed);
    weft__put_be32(m->b + 20, (uint32_t)w->li);
    if (type == M_F || type == M_C)
        weft__ib_pack_qp(w, m->b + 24);
    m->busy = 1;
    rc = weft__ib_tcp_frame(tp, ctl_link(tp, pe), 0, &m->x, m->b,
                            IB_CTL_BYTES(tp->wires), msg_sent);
    if (rc != 0) {
        m->busy = 0;
        if (tp->err == 0)
            weft__ib_fail(tp, rc,
                          "rank %d: cannot send the resume of wire %d to "
                          "peer %d on its TCP wires",
                          tp->rank, w->w, w->peer);
    }
    return tp->err;
}

static int retire(ib_tp *tp, struct ibv_qp *qp, struct ibv_mr *smr,
                  struct ibv_mr *rmr)
{
    ib_retired *r = calloc(1, sizeof *r);

    if (r == NULL) {
        weft__ib_fail(tp, WEFT_ENOMEM, "rank %d: out of memory", tp->rank);
        return tp->err;
    }
    r->qp = qp;
    r->smr = smr;
    r->rmr = rmr;
    r->next = tp->retired;
    tp->retired = r;
    return WEFT_OK;
}

/* Retires w's queue pair (its later completions are told apart and
 * ignored): the wire starts its next epoch with none. */
static int retire_qp(ib_tp *tp, ib_wire *w)
{
    if (w->qp != NULL && retire(tp, w->qp, NULL, NULL) != 0)
        return tp->err;
    w->qp = NULL;
    w->qpn = 0;
    w->s_wr = w->c_wr = w->r_wr = 0;
    w->sig_posted = w->sig_done = 0;
    w->epoch++;
    return WEFT_OK;
}

/* Stops this end of a wire: nothing more lands, what landed is counted,
 * and its queue pair is retired. */
static int stop(ib_tp *tp, ib_wire *w)
{
    ib_peer *pe = &tp->peers[w->peer];
    struct ibv_qp_attr a = {.qp_state = IBV_QPS_ERR};
    char lname[32];
    int rc;

    w->need_stop = 0;
    w->fo = FO_STOPPING;
    if (w->qp != NULL && (rc = ibv_modify_qp(w->qp, &a, IBV_QP_STATE)) != 0)
        weft__log(WEFT__LOG_WARN, tp->rank,
                  "wire %d to peer %d: cannot move its queue pair to the "
                  "error state: %s",
                  w->w, w->peer, strerror(rc));
    /* Completions already made count (a slot that landed); the flushed
     * ones are the stop's (weft__ib_wire_failed ignores them). */
    weft__ib_cq_poll_all(tp);
    if (tp->err != 0)
        return tp->err;
    w->rep_landed = (uint32_t)w->r_landed;
    w->rep_consumed = (uint32_t)w->r_consumed;
    if (retire_qp(tp, w) != 0)
        return tp->err;
    w->fo_ms = weft__now_ms();
    if (w->moving) {
        weft__log(WEFT__LOG_WARN, tp->rank,
                  "wire %d to peer %d (%s, device %s port %d): its own link "
                  "is up again; moving it back (%llu of the peer's slots "
                  "landed here)",
                  w->w, w->peer, weft__ib_link_name(w, lname, sizeof lname),
                  w->dev->name, w->dev->port, (unsigned long long)w->r_landed);
        return WEFT_OK;
    }
    pe->lost_links |= (uint64_t)1 << w->li;
    pe->ever_lost |= (uint64_t)1 << w->li;
    pe->links[w->li].lost_ms = weft__now_ms();
    atomic_fetch_add(&pe->lost, 1);
    weft__log(WEFT__LOG_WARN, tp->rank,
              "wire %d to peer %d (%s, device %s port %d, address %s) lost: "
              "%s; resuming it over the links left (%llu of the peer's "
              "slots landed here)",
              w->w, w->peer, weft__ib_link_name(w, lname, sizeof lname),
              w->dev->name, w->dev->port, w->addr, w->why,
              (unsigned long long)w->r_landed);
    return WEFT_OK;
}

/* Makes w's new queue pair on link li of its peer (INIT, receives
 * posted), registering its rings on that link's device where it is
 * another. */
static int move_to(ib_tp *tp, ib_wire *w, int li)
{
    ib_link *lk = &tp->peers[w->peer].links[li];
    int rc;

    if (lk->dev != w->dev) {
        if (retire(tp, NULL, w->smr, w->rmr) != 0)
            return tp->err;
        w->smr = w->rmr = NULL;
    }
    w->dev = lk->dev;
    w->gid_index = lk->gid_index;
    w->gid = lk->gid;
    snprintf(w->addr, sizeof w->addr, "%s", lk->addr);
    w->link = lk->link;
    w->li = li;
    if ((rc = weft__ib_qp_make(tp, w, w->dev)) != 0 && tp->err == 0)
        tp->err = rc; /* recorded on the sink by weft__ib_qp_make */
    return tp->err;
}

/* Connects w's new queue pair to the peer's: 0, 1 where the link picked
 * refused it (the wire goes on elsewhere, or tries it again, within the
 * resume limit: refused), or the transport's failure. The port event of a
 * link come back may reach this end after the peer picked it. */
static int connect_to(ib_tp *tp, ib_wire *w, const uint8_t *e)
{
    const ib_peer *pe = &tp->peers[w->peer];
    char why[WEFT__ERRMSG_LEN];

    /* A link that refused another wire's queue pair lately is not tried
     * again (each try may wait a second) while another link is up. */
    if ((pe->refused_links >> w->li) & 1)
        for (int li = 0; li < pe->nlinks; li++)
            if (li != w->li && link_ok(pe, li)) {
                weft__log(WEFT__LOG_WARN, tp->rank,
                          "wire %d to peer %d: link %d refused another "
                          "wire's queue pair lately; trying another link",
                          w->w, w->peer, w->li);
                return 1;
            }
    if (weft__ib_wire_connect(tp, w, e, why, sizeof why) == 0 || tp->err != 0)
        return tp->err;
    weft__log(WEFT__LOG_WARN, tp->rank, "%s; trying another link", why);
    return 1;
}

/* The higher rank's offer of link li: its new queue pair there (F). */
static int offer(ib_tp *tp, ib_wire *w, int li)
{
    if (move_to(tp, w, li) != 0)
        return tp->err;
    w->fo = FO_WAIT_C;
    return send_msg(tp, w, M_F, w->epoch - 1);
}

/* The new queue pair of w (epoch E) could not be connected on its link,
 * at one end or the other: it is retired, the link is taken as lost for a
 * wire timeout (fo_run takes it back then), and the higher rank picks
 * again. */
static int refused(ib_tp *tp, ib_wire *w)
{
    ib_peer *pe = &tp->peers[w->peer];
    int li;

    if (retire_qp(tp, w) != 0)
        return tp->err;
    pe->lost_links |= (uint64_t)1 << w->li;
    pe->refused_links |= (uint64_t)1 << w->li;
    pe->refused_ms = weft__now_ms();
    snprintf(w->why, sizeof w->why, "link %d refused its new queue pair",
             w->li);
    if (tp->rank < w->peer) {
        w->fo = FO_STOPPED;
        return WEFT_OK;
    }
    if ((li = pick_link(tp, w)) < 0) {
        all_lost(tp, w);
        return tp->err;
    }
    return offer(tp, w, li);
}

/* After a stop: the higher rank picks the link and makes its queue pair
 * there (F); the lower rank says it stopped (S, where it noticed first)
 * and waits for the higher rank's pick. Either fails where no link is
 * left. */
static int stop_and_go(ib_tp *tp, ib_wire *w, int noticed)
{
    int li;

    if (stop(tp, w) != 0)
        return tp->err;
    if ((li = pick_link(tp, w)) < 0) {
        all_lost(tp, w);
        return tp->err;
    }
    if (tp->rank < w->peer) {
        w->fo = FO_STOPPED;
        return noticed ? send_msg(tp, w, M_S, w->epoch - 1) : WEFT_OK;
    }
    return offer(tp, w, li);
}

/* Goes on from the peer's counts: the slots it did not count are written
 * again (tx_flush), the frames it did are complete (tx_done). */
static int resume(ib_tp *tp, ib_wire *w)
{
    ib_peer *pe = &tp->peers[w->peer];
    uint32_t behind = (uint32_t)w->s_posted - w->peer_landed;
    uint64_t landed, credit;
    char lname[32];

    landed = w->s_posted - behind;
    credit = w->s_credit + (uint32_t)(w->peer_consumed - (uint32_t)w->s_credit);
    if (behind > (uint32_t)tp->slots || landed < w->s_done || credit > landed) {
        weft__ib_fail(tp, WEFT_ETRANSPORT,
                      "rank %d: peer %d's counts for wire %d (landed %u, "
                      "consumed %u) do not fit what this rank wrote "
                      "(%llu slots, %llu acknowledged; protocol error)",
                      tp->rank, w->peer, w->w, w->peer_landed, w->peer_consumed,
                      (unsigned long long)w->s_posted,
                      (unsigned long long)w->s_done);
        return tp->err;
    }
    w->replay_end = w->s_posted;
    w->s_posted = landed;
    w->s_done = landed;
    w->s_credit = credit;
    w->r_returned =
        w->r_consumed - (uint32_t)((uint32_t)w->r_consumed - w->rep_consumed);
    w->fo = FO_UP;
    /* Its link works (again). */
    pe->lost_links &= ~((uint64_t)1 << w->li);
    if (!w->moving)
        atomic_fetch_add(&pe->back, 1);
    weft__log(WEFT__LOG_WARN, tp->rank,
              "wire %d to peer %d %s on %s (device %s port %d, address "
              "%s) after %llu ms: %llu slots written again",
              w->w, w->peer,
              !w->moving            ? "resumed"
              : w->li == w->home_li ? "moved back"
                                    : "moved",
              weft__ib_link_name(w, lname, sizeof lname), w->dev->name,
              w->dev->port, w->addr,
              (unsigned long long)(weft__now_ms() - w->fo_ms),
              (unsigned long long)(w->replay_end - landed));
    w->moving = 0;
    weft__ib_wire_kick(w);
    return WEFT_OK;
}

/* Acts on a received message where its turn has come: DONE (acted on, or
 * stale), else KEEP. */
static int apply(ib_tp *tp, ib_msg *m)
{
    ib_wire *w = &tp->peers[m->peer].w[weft__get_be32(m->b + 4)];
    uint32_t e = weft__get_be32(m->b + 8), E = w->epoch;
    uint32_t li = weft__get_be32(m->b + 20);
    int hi = tp->rank > m->peer, type = m->b[0], rc = 0;

    if ((type != M_N && hi != (type == M_S || type == M_C)) ||
        li >= (uint32_t)tp->peers[m->peer].nlinks) {
        weft__ib_fail(tp, WEFT_ETRANSPORT,
                      "rank %d: peer %d sent a resume message '%c' for wire "
                      "%d that does not fit (protocol error)",
                      tp->rank, m->peer, type, w->w);
        return DONE;
    }
    switch (type) {
    case M_S:
        if (e == E && w->fo == FO_UP && !w->need_stop) {
            snprintf(w->why, sizeof w->why, "peer %d lost it", w->peer);
            stop_and_go(tp, w, 0);
            return DONE;
        }
        return e > E ? KEEP : DONE;
    case M_F:
        if (e == E && w->fo == FO_UP) {
            /* The peer moves it back to its own link, or lost it. */
            w->moving = m->b[1] != 0 && !w->need_stop;
            if (!w->need_stop)
                snprintf(w->why, sizeof w->why, "peer %d lost it", w->peer);
            if (stop(tp, w) != 0)
                return DONE;
            w->fo = FO_STOPPED;
            E = w->epoch;
        }
        if (e + 1 == E && w->fo == FO_STOPPED) {
            w->peer_landed = weft__get_be32(m->b + 12);
            w->peer_consumed = weft__get_be32(m->b + 16);
            if (move_to(tp, w, (int)li) != 0 ||
                (rc = connect_to(tp, w, m->b + 24)) < 0 || rc > 0) {
                if (rc > 0 && send_msg(tp, w, M_N, e) == 0)
                    refused(tp, w);
                return DONE;
            }
            w->fo = FO_WAIT_A;
            send_msg(tp, w, M_C, e);
            return DONE;
        }
        return e >= E ? KEEP : DONE;
    case M_C:
        if (e + 1 == E && w->fo == FO_WAIT_C) {
            w->peer_landed = weft__get_be32(m->b + 12);
            w->peer_consumed = weft__get_be32(m->b + 16);
            if ((rc = connect_to(tp, w, m->b + 24)) != 0) {
                if (rc > 0 && send_msg(tp, w, M_N, e) == 0)
                    refused(tp, w);
                return DONE;
            }
            if (resume(tp, w) != 0)
                return DONE;
            send_msg(tp, w, M_A, e);
            return DONE;
        }
        return e + 1 > E ? KEEP : DONE;
    case M_N:
        /* The peer could not connect on the link picked: the higher rank
         * waits for C, the lower for A. */
        if (e + 1 == E && w->fo == (hi ? FO_WAIT_C : FO_WAIT_A)) {
            weft__log(WEFT__LOG_WARN, tp->rank,
                      "wire %d to peer %d: the peer could not connect its "
                      "new queue pair on link %d; trying another link",
                      w->w, m->peer, w->li);
            refused(tp, w);
            return DONE;
        }
        return e + 1 > E || (e + 1 == E && w->fo != FO_UP) ? KEEP : DONE;
    default: /* M_A */
        if (e + 1 == E && w->fo == FO_WAIT_A) {
            resume(tp, w);
            return DONE;
        }
        return e + 1 > E || (e + 1 == E && w->fo != FO_UP) ? KEEP : DONE;
    }
}

/* A message from a peer on a TCP wire (exchange.c: ctl_done), kept until
 * its turn (weft__ib_fo_run). 0, or the failure (a garbled message). */
int weft__ib_fo_message(ib_tp *tp, int peer, const uint8_t *b)
{
    ib_msg *m;

    if ((b[0] != M_S && b[0] != M_F && b[0] != M_C && b[0] != M_A &&
         b[0] != M_N) ||
        weft__get_be32(b + 4) >= (uint32_t)tp->peers[peer].nwires) {
        weft__ib_fail(tp, WEFT_ETRANSPORT,
                      "rank %d: peer %d sent garbage on its TCP wires",
                      tp->rank, peer);
        return tp->err;
    }
    if ((m = calloc(1, sizeof *m)) == NULL) {
        weft__ib_fail(tp, WEFT_ENOMEM, "rank %d: out of memory", tp->rank);
        return tp->err;
    }
    m->peer = peer;
    memcpy(m->b, b, IB_FO_BYTES);
    if (tp->rx_tail != NULL)
        tp->rx_tail->next = m;
    else
        tp->rx_head = m;
    tp->rx_tail = m;
    tp->fo_work = 1;
    return WEFT_OK;
}

/* A port went down (completions.c): a wire in the middle of its resume
 * is not left waiting for the resume limit. Where no link to its peer is
 * left, that is the peer lost (WEFT_EPEER) now; where its new queue pair
 * is on that port, it goes elsewhere as from a refusal (N), the higher
 * rank waiting for C or the lower for A (a stopped lower rank waits for
 * the higher rank's pick). */
void weft__ib_fo_port_down(ib_tp *tp, const ib_dev *d)
{
    for (int p = 0; p < tp->nranks && tp->err == 0 && !tp->shut; p++)
        for (int i = 0; i < tp->peers[p].nwires && tp->err == 0; i++) {
            ib_wire *w = &tp->peers[p].w[i];
            int hi = tp->rank > p;

            if (w->fo == FO_UP || w->fo == FO_STOPPING)
                continue;
            if (pick_link(tp, w) < 0) {
                all_lost(tp, w);
                return;
            }
            if (w->dev == d && w->fo == (hi ? FO_WAIT_C : FO_WAIT_A) &&
                send_msg(tp, w, M_N, w->epoch - 1) == 0) {
                weft__log(WEFT__LOG_WARN, tp->rank,
                          "wire %d to peer %d: the port of link %d went "
                          "down while it resumed there; trying another "
                          "link",
                          w->w, p, w->li);
                refused(tp, w);
            }
        }
}

int weft__ib_fo_start(ib_tp *tp)
{
    for (int p = 0; p < tp->nranks && tp->err == 0; p++) {
        ib_peer *pe = &tp->peers[p];
        char list[WEFT__ERRMSG_LEN / 2];
        size_t n = 0;
        int up = 0, down = 0;

        list[0] = '\0';
        for (int li = 0; li < pe->nlinks; li++) {
            const ib_link *lk = &pe->links[li];

            if (!pe->w[li * tp->wires].init_down) {
                up++;
                continue;
            }
            down++;
            if (n + 2 < sizeof list)
                n +=
                    (size_t)snprintf(list + n, sizeof list - n,
                                     "%slink %u (%s)", n ? ", " : "", lk->link,
                                     lk->dev->down ? "this end's port is down"
                                                   : "the peer's port is down");
        }
        if (down == 0)
            continue;
        if (up == 0)
            return weft__fail(tp->p->sink, WEFT_ETRANSPORT,
                              "rank %d: no link to peer %d is up as the job "
                              "starts: %s",
                              tp->rank, p, list);
        for (int i = 0; i < pe->nwires && tp->err == 0; i++) {
            ib_wire *w = &pe->w[i];
            const ib_link *lk = &pe->links[w->li];

            if (!w->init_down)
                continue;
            snprintf(w->why, sizeof w->why,
                     "its link's port was down as the job started (%s)",
                     lk->dev->down ? "this end's" : "the peer's");
            stop_and_go(tp, w, 1);
        }
    }
    tp->fo_work = 1;
    return tp->err;
}

/* Stops the wires that failed, acts on the messages whose turn has come,
 * and fails a wire not resumed in time. Inside progress(). */
void weft__ib_fo_run(ib_tp *tp)
{
    uint64_t now = weft__now_ms(), limit = resume_limit_ms(tp);
    int moved = 1, busy = 0, acted = 0;

    /* A link that refused a new queue pair may be picked again after a
     * wire timeout (wires move back to it); so may one that lost a wire
     * with its port up (a link that dropped everything silently) once its
     * TCP wire runs on it again, a wire timeout after the loss at least
     * (that TCP wire notices a dead link within it). */
    for (int p = 0; p < tp->nranks; p++) {
        ib_peer *pe = &tp->peers[p];
        if (pe->refused_links != 0 &&
            now - pe->refused_ms >= (uint64_t)tp->p->cfg->wire_timeout_ms) {
            pe->lost_links &= ~pe->refused_links;
            pe->refused_links = 0;
        }
        for (int li = 0; li < pe->nlinks; li++) {
            ib_link *lk = &pe->links[li];

            /* A port down as the job started may have had no GID for the
             * link's address; it may once the port is up. */
            if (lk->gid_index < 0 && !lk->dev->down)
                weft__ib_link_gid(lk);
            if (((pe->lost_links & ~pe->refused_links) >> li) & 1 &&
                !pe->links[li].dev->down &&
                now - pe->links[li].lost_ms >=
                    (uint64_t)tp->p->cfg->wire_timeout_ms &&
                home_answers(tp, pe, li))
                pe->lost_links &= ~((uint64_t)1 << li);
        }
    }
    while (moved && tp->err == 0 && !tp->shut) {
        moved = 0;
        for (int p = 0; p < tp->nranks && tp->err == 0; p++)
            for (int i = 0; i < tp->peers[p].nwires && tp->err == 0; i++) {
                ib_wire *w = &tp->peers[p].w[i];
                if (w->need_stop && w->fo == FO_UP) {
                    stop_and_go(tp, w, 1);
                    moved = 1;
                } else if (wants_home(tp, w) &&
                           home_answers(tp, &tp->peers[p], w->home_li)) {
                    /* Its own link is back (the higher rank leads). */
                    w->moving = 1;
                    snprintf(w->why, sizeof w->why,
                             "moving back to its own link");
                    stop_and_go(tp, w, 0);
                    moved = 1;
                }
            }
        for (ib_msg **pm = &tp->rx_head; *pm != NULL && tp->err == 0;) {
            ib_msg *m = *pm;
            if (apply(tp, m) == KEEP) {
                pm = &m->next;
                continue;
            }
            *pm = m->next;
            free(m);
            moved = 1;
        }
        tp->rx_tail = NULL;
        for (ib_msg *m = tp->rx_head; m != NULL; m = m->next)
            tp->rx_tail = m;
        acted |= moved;
    }
    if (tp->err != 0 || tp->shut)
        return;
    now = weft__now_ms();
    for (int p = 0; p < tp->nranks; p++)
        for (int i = 0; i < tp->peers[p].nwires; i++) {
            ib_wire *w = &tp->peers[p].w[i];
            if (w->fo == FO_UP && !w->need_stop) {
                busy |= wants_home(tp, w); /* until its link answers */
                continue;
            }
            busy = 1;
            if (w->fo != FO_UP && now - w->fo_ms > limit) {
                weft__ib_fail(tp, WEFT_EPEER,
                              "rank %d: wire %d to peer %d lost its link "
                              "(%s) and was not resumed within %llu ms",
                              tp->rank, w->w, p, w->why,
                              (unsigned long long)limit);
                return;
            }
        }
    for (int p = 0; p < tp->nranks; p++) {
        busy |= tp->peers[p].refused_links != 0 || /* come back */
                tp->peers[p].lost_links != 0;
        for (int li = 0; li < tp->peers[p].nlinks; li++)
            busy |= tp->peers[p].links[li].gid_index < 0; /* no GID yet */
    }
    tp->fo_work = busy || tp->rx_head != NULL;
    if (acted) {
        tp->events++;
        weft__ib_process_dirty(tp);
    }
}

/* How long progress() may sleep while a wire resumes (ms): until its
 * limit, and never long, as its messages come on the TCP side. */
int weft__ib_fo_wait_ms(const ib_tp *tp)
{
    uint64_t now = weft__now_ms(), limit = resume_limit_ms(tp);
    int ms = 100;

    for (int p = 0; p < tp->nranks; p++)
        for (int i = 0; i < tp->peers[p].nwires; i++) {
            const ib_wire *w = &tp->peers[p].w[i];
            if (w->fo == FO_UP)
                continue;
            if (now >= w->fo_ms + limit)
                return 0;
            if (w->fo_ms + limit - now < (uint64_t)ms)
                ms = (int)(w->fo_ms + limit - now);
        }
    return ms;
}

/* What failover replaced, destroyed (destroy, before the protection
 * domains). */
void weft__ib_fo_free(ib_tp *tp)
{
    int rc;

    while (tp->retired != NULL) {
        ib_retired *r = tp->retired;
        tp->retired = r->next;
        if (r->qp != NULL && (rc = ibv_destroy_qp(r->qp)) != 0)
            weft__log(WEFT__LOG_WARN, tp->rank, "ibv_destroy_qp: %s",
                      strerror(rc));
        if (r->rmr != NULL && (rc = ibv_dereg_mr(r->rmr)) != 0)
            weft__log(WEFT__LOG_WARN, tp->rank, "ibv_dereg_mr: %s",
                      strerror(rc));
        if (r->smr != NULL && (rc = ibv_dereg_mr(r->smr)) != 0)
            weft__log(WEFT__LOG_WARN, tp->rank, "ibv_dereg_mr: %s",
                      strerror(rc));
        free(r);
    }
}
