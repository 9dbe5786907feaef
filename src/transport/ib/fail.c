/*
 * Failures of the ibverbs transport: the first one recorded, the TCP
 * side's news (a goodbye, a closed connection) taken in and its failure
 * kept aside until it is judged, and a wire's queue pair that failed.
 * The data path (data.c) and the completions (completions.c) both fail
 * through these; nothing here calls them.
 */
#include "transport/ib/ib.h"

#include <stdio.h>

/* Records the first failure of the transport (later ones are consequences,
 * such as flushed requests) on the communicator. */
void weft__ib_fail(ib_tp *tp, int err, const char *fmt, ...)
{
    va_list ap;

    va_start(ap, fmt);
    weft__tp_fail(tp->p->sink, &tp->err, err, fmt, ap);
    va_end(ap);
}

const char *weft__ib_link_name(const ib_wire *w, char *buf, size_t len)
{
    if (w->link == WEFT__LINK_LOOPBACK)
        snprintf(buf, len, "loopback");
    else
        snprintf(buf, len, "link %u", w->link);
    return buf;
}

/* The peer whose leaving failed the TCP side (weft__tcp_lost_peer: for a
 * relay connection, the neighbour at its other end), or -1 where the
 * failure was anything else, and tcp_wait_ms (completions.c) then judges
 * without knowing the peer. What this rank waits for on that peer's
 * queue pairs decides at once, as does what it waits for through the TCP
 * side (relayed, or over a path), which cannot come any more. */
static int tcp_lost_peer(const ib_tp *tp)
{
    int p = weft__tcp_lost_peer(tp->tcp);

    if (p < 0 || p >= tp->nranks || p == tp->rank)
        return -1;
    return p;
}

/* Takes in the TCP side's news (a goodbye, a closed connection) before a
 * failure is judged: a peer that finalized makes its queue pairs fail
 * without that being an error here. Returns the TCP side's failure, which
 * is kept aside (tcp_err, tcp_msg) rather than made this transport's own:
 * poll_once (completions.c) judges it once what landed before it has been
 * handed over. The TCP side records it in its own error record (tp->boot),
 * never on the communicator's, so an operation that still succeeds leaves
 * no failure behind it (the message reaches the communicator when it is
 * judged). */
int weft__ib_tcp_news(ib_tp *tp)
{
    int rc;

    if (tp->tcp_err != 0)
        return tp->tcp_err;
    rc = weft__tcp_poll(tp->tcp);
    if (rc < 0) {
        tp->tcp_err = rc;
        tp->tcp_err_ms = tp->tcp_move_ms = weft__now_ms();
        snprintf(tp->tcp_msg, sizeof tp->tcp_msg, "%s",
                 tp->boot.code != 0 ? tp->boot.msg : weft_strerror(rc));
        tp->tcp_lost = tcp_lost_peer(tp);
        tp->tcp_gone = -1;
        weft__log(WEFT__LOG_DEBUG, tp->rank,
                  "the TCP side failed (peer %d): %s; judged once what "
                  "landed is handed over",
                  tp->tcp_lost, tp->tcp_msg);
        return rc;
    }
    if (rc > 0)
        tp->events++;
    return 0;
}

/* Judges the TCP side's failure that weft__ib_tcp_news kept aside: from
 * now on it is this transport's, with the TCP side's message. */
int weft__ib_tcp_judge(ib_tp *tp)
{
    weft__ib_fail(tp, tp->tcp_err, "%s", tp->tcp_msg);
    return tp->err;
}

/* A wire's queue pair failed (what: the request or event, detail: why).
 * After a failure of the TCP side, or after its peer said goodbye, that is
 * expected: the wire is dead (it sends no more) and the failure is judged
 * elsewhere, once what landed on it has been handed over (completions.c:
 * tcp_wait_ms, left_check). A wire that can fail over (its peer has
 * another link) is stopped and resumed on a new queue pair over a link
 * left (failover.c), where the failure may be its link's (link: not a
 * protocol error or a refused request, which say weft or the device is
 * wrong, and fail the transport as they always did). Otherwise it fails
 * the transport. */
void weft__ib_wire_failed(ib_wire *w, int err, const char *what,
                          const char *detail)
{
    weft__ib_wire_failed_as(w, err, 1, what, detail);
}

void weft__ib_wire_failed_as(ib_wire *w, int err, int link, const char *what,
                             const char *detail)
{
    ib_tp *tp = w->tp;
    char lname[32];

    /* A wire being stopped: its queue pair's failures are the stop's. */
    if (tp->shut || tp->err != 0 || w->dead || w->fo == FO_STOPPING ||
        w->need_stop)
        return;
    if (weft__ib_tcp_news(tp) != 0 || tp->peers[w->peer].left) {
        weft__log(WEFT__LOG_DEBUG, tp->rank,
                  "wire %d to peer %d: %s failed after the peer %s: %s", w->w,
                  w->peer, what, tp->tcp_err != 0 ? "was lost" : "left",
                  detail);
        w->dead = 1;
        return;
    }
    if (link && w->fo == FO_UP && weft__ib_can_fail_over(w)) {
        snprintf(w->why, sizeof w->why, "%s: %s", what, detail);
        w->need_stop = 1;
        tp->fo_work = 1;
        return;
    }
    weft__ib_fail(
        tp, w->fo == FO_UP ? err : WEFT_EPEER,
        "rank %d: %s to/from peer %d on wire %d (%s, device %s port %d, "
        "address %s) failed%s: %s",
        tp->rank, what, w->peer, w->w,
        weft__ib_link_name(w, lname, sizeof lname), w->dev->name, w->dev->port,
        w->addr, w->fo == FO_UP ? "" : " while it was being resumed", detail);
}
