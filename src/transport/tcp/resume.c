/*
 * Failover: a data wire whose link is lost while the peer has other wires
 * goes on over a new connection, with exactly the bytes it would have
 * carried.
 *
 * A wire is a byte stream each way. On a resumable wire (one of several
 * to its peer, WEFT_WIRE_TIMEOUT_MS on), each side counts the bytes it
 * handed for writing (tx_pos) and read (rx_pos), and keeps the last
 * ret_size bytes it handed for writing (ret). When the connection fails
 * in a way that says the link is gone (no answer within the wire timeout,
 * no route), the wire is paused: its posted sends and receives wait, and
 * sends already handed to the kernel count as sent. The dialling side of
 * the wire (the higher rank) connects again, to the peer's address on
 * another link where there is one, with a hello that names the wire,
 * says it resumes it, and carries its read position; the peer (which
 * pauses its side now if it had not noticed yet) answers with its own.
 * The old connection is closed, and once it is (its writes cancelled and
 * counted as sent), the new one takes its place: posted transfers,
 * read-ahead and positions move to it, and each side writes again, before
 * anything else, the bytes from the peer's read position on. Nothing is
 * lost (the kernel dropped at most what the peer did not read) and
 * nothing counts twice (the peer resumes reading where it stopped).
 *
 * The wire keeps its place in every plan (the engine never learns of
 * it): its bytes now travel over the surviving link. Once a second the
 * dialling side tries the wire's own link again (for a relay connection,
 * its neighbour's first wire's), and where it answers the wire moves
 * back the same way (a move: nothing was lost). A wire that is
 * not resumed in time (twice the wire timeout, or the timeout and 2 s,
 * the longer, and 2 s) fails, WEFT_EPEER, as does the loss of the
 * last wire to a peer, and a resume the peer refuses (it is gone).
 */
#include "transport/tcp/tcp.h"

#include "base/bytes.h"

#include <ifaddrs.h>
#include <linux/netlink.h>
#include <linux/rtnetlink.h>
#include <net/if.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

int weft__tcp_link_lost(int uverr)
{
    switch (uverr) {
    /* A reset too: once one end gave a silent connection up, the other
     * gets a reset as the link comes back. A peer that died resets its
     * connections as well; the resume then finds nobody listening, and the
     * wire fails at once (connect_cb). */
    case UV_ECONNRESET:
    case UV_ECONNABORTED:
    case UV_EPIPE:
    case UV_ETIMEDOUT:
    case UV_EHOSTUNREACH:
    case UV_ENETUNREACH:
    case UV_ENETDOWN:
    case UV_EHOSTDOWN:
        return 1;
    default:
        return 0;
    }
}

int weft__tcp_home_link(const tcp_tp *tp, int p, const slot *s)
{
    return s->relay ? (int)tp->peers[p].s[0].link : (int)s->link;
}

/* Stops k's reads, so that its read position is final: a data wire reads
 * only while a receive waits (k->reading), a relay connection always. */
static void stop_reading(conn *k)
{
    if (k->reading || k->tp->peers[k->peer].s[k->wire].relay)
        uv_read_stop((uv_stream_t *)&k->h);
    k->reading = 0;
}

int weft__tcp_eof_cause(conn *k)
{
    struct tcp_info ti;
    socklen_t len = sizeof ti;
    uv_os_fd_t fd;

    /* A peer's close leaves this end in CLOSE_WAIT; an abort in CLOSE:
     * the kernel's timeout (after retransmissions or keepalive probes
     * that went unanswered), else a reset. */
    if (uv_fileno((uv_handle_t *)&k->h, &fd) != 0 ||
        getsockopt(fd, IPPROTO_TCP, TCP_INFO, &ti, &len) != 0 ||
        ti.tcpi_state != TCP_CLOSE)
        return UV_EOF;
    return ti.tcpi_retransmits > 0 || ti.tcpi_probes > 0 || ti.tcpi_backoff > 0
               ? UV_ETIMEDOUT
               : UV_ECONNRESET;
}

/* Whether some other wire to k's peer is up and not paused. */
static int others_up(const conn *k)
{
    const tcp_tp *tp = k->tp;
    const peer *pe = &tp->peers[k->peer];

    for (int w = 0; w < pe->nwires; w++) {
        const conn *c = pe->s[w].c;

        if (w != k->wire && c != NULL && c->state == CONN_UP && !c->paused &&
            !c->closing && c->rx_end == 0)
            return 1;
    }
    return 0;
}

/* Whether some other wire to k's peer is paused, waiting to resume. */
static int some_paused(const conn *k)
{
    const peer *pe = &k->tp->peers[k->peer];

    for (int w = 0; w < pe->nslots; w++)
        if (w != k->wire && pe->s[w].c != NULL && pe->s[w].c->paused)
            return 1;
    return 0;
}

int weft__tcp_pause(conn *k, int uverr)
{
    tcp_tp *tp = k->tp;

    if (k->paused)
        return 1;
    if (!k->resumable || tp->shut || tp->err != 0 || k->closing ||
        !weft__tcp_link_lost(uverr))
        return 0;
    if (!others_up(k)) {
        /* The last wire to the peer. Where others wait paused, the peer is
         * lost, whatever waits on them; where none does (the peer closed
         * the others: it died), the wire fails as any wire does. */
        if (!some_paused(k))
            return 0;
        weft__tcp_wire_lost(k, uverr);
        tp->lost_peer = k->peer;
        weft__tcp_fail(tp, WEFT_EPEER,
                       "rank %d: every wire to peer %d lost its link (the "
                       "last, wire %d (%s): %s)",
                       tp->rank, k->peer, k->wire, k->name, uv_strerror(uverr));
        return 0;
    }
    k->paused = 1;
    k->pause_err = uverr;
    k->pause_ms = weft__now_ms();
    weft__tcp_wire_lost(k, uverr);
    stop_reading(k);
    weft__log(WEFT__LOG_WARN, tp->rank,
              "wire %d to peer %d: resuming it on a new connection over "
              "the links left",
              k->wire, k->peer);
    /* The dialling end resumes: where that is the peer, it may not have
     * noticed yet (a carrier loss reaches it up to a second later). */
    if (!tp->peers[k->peer].s[k->wire].outgoing && !k->peer_knows)
        weft__tcp_nudge(tp, k->peer, k->wire);
    weft__tcp_housekeep_start(tp);
    return 1;
}

int weft__tcp_closed_while_paused(conn *k)
{
    tcp_tp *tp = k->tp;

    if (tp->err != 0 || tp->shut || !some_paused(k))
        return 0;
    tp->lost_peer = k->peer;
    weft__tcp_fail(tp, WEFT_EPEER,
                   "rank %d: peer %d closed wire %d (%s) while another wire "
                   "to it waited to resume: the peer left",
                   tp->rank, k->peer, k->wire, k->name);
    return 1;
}

int weft__tcp_pause_to_move(conn *k)
{
    tcp_tp *tp = k->tp;

    if (k->paused || !k->resumable || tp->shut || tp->err != 0 || k->closing ||
        k->state != CONN_UP)
        return 0;
    k->paused = 1;
    k->moving = 1;
    k->pause_err = 0;
    k->pause_ms = weft__now_ms();
    stop_reading(k);
    weft__tcp_housekeep_start(tp);
    return 1;
}

void weft__tcp_retain(conn *k, const uv_buf_t *bufs, int n)
{
    if (!k->resumable)
        return;
    if (k->ret == NULL && (k->ret = malloc(k->ret_size)) == NULL) {
        /* No room to keep the bytes: the wire cannot be resumed. */
        k->resumable = 0;
        return;
    }
    for (int i = 0; i < n; i++) {
        const char *p = bufs[i].base;
        size_t len = bufs[i].len;

        /* Only the last ret_size bytes matter. */
        if (len > k->ret_size) {
            p += len - k->ret_size;
            k->tx_pos += len - k->ret_size;
            len = k->ret_size;
        }
        while (len > 0) {
            size_t at = (size_t)(k->tx_pos & (k->ret_size - 1));
            size_t m = k->ret_size - at < len ? k->ret_size - at : len;

            memcpy(k->ret + at, p, m);
            p += m;
            len -= m;
            k->tx_pos += m;
        }
    }
}

void weft__tcp_takeover(conn *old, conn *nk, uint64_t peer_pos)
{
    tcp_tp *tp = old->tp;

    if (peer_pos > old->tx_pos || old->tx_pos - peer_pos > old->ret_size ||
        (old->tx_pos - peer_pos > 0 && old->ret == NULL)) {
        weft__tcp_fail(tp, WEFT_EPEER,
                       "rank %d: wire %d to peer %d lost its link (%s) and "
                       "cannot be resumed: the peer read up to byte %llu, "
                       "this rank kept bytes %llu to %llu",
                       tp->rank, old->wire, old->peer,
                       uv_strerror(old->pause_err),
                       (unsigned long long)peer_pos,
                       (unsigned long long)(old->tx_pos > old->ret_size
                                                ? old->tx_pos - old->ret_size
                                                : 0),
                       (unsigned long long)old->tx_pos);
        weft__tcp_conn_close(nk);
        return;
    }
    nk->resume_pos = peer_pos;
    old->successor = nk;
    /* Its writes are cancelled (counted as sent: their bytes are kept),
     * then conn_close_cb hands over (weft__tcp_resume_finish). Where the
     * sending thread still holds batches of it, its socket stays open
     * until the thread handed them back (data.c, tx_collect). */
    if (old->tx_batches == 0) {
        weft__tcp_conn_close(old);
    } else {
        /* The thread may be waiting to write to a socket whose peer no
         * longer reads it (a move): a shut socket fails its writes. */
        uv_os_fd_t fd;

        if (uv_fileno((uv_handle_t *)&old->h, &fd) == 0)
            shutdown(fd, SHUT_RDWR);
    }
}

static void resend_cb(uv_write_t *req, int status)
{
    conn *k = req->handle->data;

    weft__tcp_write_done(k->tp);
    free(req->data);
    free(req);
    /* A failure shows on the new connection's reads and writes. */
    (void)status;
}

/* Removes k from tp's list at *head (linked by next_of). */
#define UNLINK(head, k, field)                                                 \
    do {                                                                       \
        for (conn **pp_ = (head); *pp_ != NULL; pp_ = &(*pp_)->field)          \
            if (*pp_ == (k)) {                                                 \
                *pp_ = (k)->field;                                             \
                break;                                                         \
            }                                                                  \
    } while (0)

/* Writes on nk the bytes old's peer had not read, before anything else. */
static int resend(conn *nk, uint64_t from)
{
    tcp_tp *tp = nk->tp;
    size_t n = (size_t)(nk->tx_pos - from), at;
    uv_write_t *req;
    uv_buf_t b;
    char *buf;

    if (n == 0)
        return 0;
    req = malloc(sizeof *req);
    buf = malloc(n);
    if (req == NULL || buf == NULL) {
        free(req);
        free(buf);
        return UV_ENOMEM;
    }
    at = (size_t)(from & (nk->ret_size - 1));
    if (at + n <= nk->ret_size) {
        memcpy(buf, nk->ret + at, n);
    } else {
        memcpy(buf, nk->ret + at, nk->ret_size - at);
        memcpy(buf + (nk->ret_size - at), nk->ret, n - (nk->ret_size - at));
    }
    req->data = buf;
    b = uv_buf_init(buf, (unsigned int)n);
    return weft__tcp_write(tp, req, (uv_stream_t *)&nk->h, &b, 1, resend_cb);
}

void weft__tcp_resume_finish(conn *old)
{
    conn *nk = old->successor;
    tcp_tp *tp = old->tp;
    slot *s = &tp->peers[old->peer].s[old->wire];
    uint64_t ms = weft__now_ms() - old->pause_ms;
    int rc;

    old->successor = NULL;
    if (tp->shut || tp->err != 0 || nk->closing)
        return;
    /* Everything the wire holds moves to the new connection. */
    nk->rq_head = old->rq_head;
    nk->rq_tail = old->rq_tail;
    nk->sq_head = old->sq_head;
    nk->sq_tail = old->sq_tail;
    old->rq_head = old->rq_tail = old->sq_head = old->sq_tail = NULL;
    free(nk->rxb);
    nk->rxb = old->rxb;
    nk->rx_lo = old->rx_lo;
    nk->rx_hi = old->rx_hi;
    old->rxb = NULL;
    nk->rx_pos = old->rx_pos;
    nk->tx_pos = old->tx_pos;
    nk->ret = old->ret;
    nk->ret_size = old->ret_size;
    old->ret = NULL;
    nk->resumable = 1;
    nk->state = CONN_UP;
    /* A relay connection's chunk in the middle of its reading. */
    memcpy(nk->rhdr, old->rhdr, sizeof nk->rhdr);
    nk->rhgot = old->rhgot;
    free(nk->rdata);
    nk->rdata = old->rdata;
    nk->rdlen = old->rdlen;
    nk->rdgot = old->rdgot;
    old->rdata = NULL;
    if (old->dirty)
        UNLINK(&tp->dirty, old, dirty_next);
    if (old->rx_dirty)
        UNLINK(&tp->rx_dirty, old, rx_next);
    old->dirty = old->rx_dirty = 0;
    s->c = nk;
    if (!old->moving)
        atomic_fetch_add(&tp->peers[nk->peer].back, 1);
    weft__log(WEFT__LOG_WARN, tp->rank,
              "%swire %d to peer %d %s on a new connection (%s) after %llu "
              "ms; %llu bytes sent again",
              s->relay ? "relay " : "", nk->wire, nk->peer,
              old->moving ? "moved back to its own link" : "resumed", nk->name,
              (unsigned long long)ms,
              (unsigned long long)(nk->tx_pos - nk->resume_pos));
    rc = resend(nk, nk->resume_pos);
    if (rc == 0 && s->relay)
        rc = uv_read_start((uv_stream_t *)&nk->h, weft__tcp_relay_alloc_cb,
                           weft__tcp_relay_read_cb);
    else if (rc == 0)
        rc = uv_read_start((uv_stream_t *)&nk->h, weft__tcp_data_alloc_cb,
                           weft__tcp_data_read_cb);
    nk->reading = rc == 0 && !s->relay;
    if (rc != 0) {
        weft__tcp_fail(tp, weft__tcp_err_code(rc),
                       "rank %d: resuming wire %d to peer %d: %s", tp->rank,
                       nk->wire, nk->peer, uv_strerror(rc));
        return;
    }
    weft__tcp_kick(nk);
}

/* Dials peer p again for wire w, whose connection is paused: to the
 * peer's address on another link where one has a wire up (the one heard
 * from last: a link that died too may not have been noticed yet), else
 * on w's. */
static void start_resume(tcp_tp *tp, int p, int w)
{
    slot *s = &tp->peers[p].s[w];
    const slot *via = s;
    uint64_t heard = 0;

    for (int u = 0; u < tp->peers[p].nwires; u++) {
        const slot *o = &tp->peers[p].s[u];

        /* A wire that runs on its own link (not one resumed elsewhere,
         * whose link may be the dead one) shows that link alive. */
        if (o->outgoing && (int)o->link != weft__tcp_home_link(tp, p, s) &&
            u != w && o->c != NULL && o->c->state == CONN_UP && !o->c->paused &&
            o->c->via_link == (int)o->link &&
            (via == s || o->c->rx_ms > heard)) {
            via = o;
            heard = o->c->rx_ms;
        }
    }
    weft__tcp_dial(tp, p, w, via, 1);
    if (s->resuming != NULL)
        s->resuming->via_link = (int)via->link;
}

int weft__tcp_resume_housekeep(tcp_tp *tp, uint64_t now)
{
    /* The side that has nothing to send notices the loss by keepalive
     * probes, which go once a second: about 2 s, whatever the wire
     * timeout below that. */
    const uint64_t wt = (uint64_t)tp->cfg->wire_timeout_ms;
    const uint64_t limit = (2 * wt > wt + 2000 ? 2 * wt : wt + 2000) + 2000;
    int busy = 0;

    for (int p = 0; p < tp->nranks && tp->err == 0; p++)
        for (int w = 0; w < tp->peers[p].nslots; w++) {
            slot *s = &tp->peers[p].s[w];
            conn *k = s->c;

            if (k != NULL && !k->paused && k->successor == NULL &&
                s->outgoing && k->resumable && k->via_link >= 0 &&
                k->via_link != weft__tcp_home_link(tp, p, s)) {
                /* Resumed over another link: try its own again, once a
                 * second; the wire moves back if it answers. */
                busy = 1;
                if (s->resuming != NULL &&
                    (s->resuming->state == CONN_CONNECTING ||
                     s->resuming->state == CONN_SPLICE_WAIT) &&
                    now >= s->resuming->deadline_ms)
                    weft__tcp_retry_later(s->resuming,
                                          "its link is still down");
                if (s->resuming == NULL && now >= s->next_move_ms) {
                    s->next_move_ms = now + 1000;
                    weft__tcp_dial(tp, p, w, s, 2);
                    if (s->resuming != NULL)
                        s->resuming->via_link = weft__tcp_home_link(tp, p, s);
                }
                continue;
            }
            if (k == NULL || !k->paused || k->successor != NULL)
                continue;
            busy = 1;
            if (now - k->pause_ms > limit) {
                tp->lost_peer = p;
                weft__tcp_fail(tp, WEFT_EPEER,
                               "rank %d: wire %d to peer %d (%s) lost its "
                               "link (%s) and was not resumed within %llu "
                               "ms",
                               tp->rank, w, p, k->name,
                               uv_strerror(k->pause_err),
                               (unsigned long long)limit);
                return busy;
            }
            if (s->resuming != NULL &&
                (s->resuming->state == CONN_REPLY_WAIT ||
                 s->resuming->state == CONN_SPLICE_WAIT ||
                 s->resuming->state == CONN_CONNECTING) &&
                now >= s->resuming->deadline_ms)
                weft__tcp_retry_later(s->resuming, "no answer");
            if (s->outgoing && s->resuming == NULL && now >= s->next_try_ms)
                start_resume(tp, p, w);
        }
    return busy;
}

/* ---- interfaces that go down ----
 *
 * A link set down, or whose carrier is lost (a cable pulled), tells the
 * kernel at once, but TCP only at its user timeout (the wire timeout).
 * The kernel's routing messages say it first: a wire whose connection
 * runs from an address of an interface that went down (IFF_UP or
 * IFF_RUNNING cleared, or the interface removed) is paused then, as if
 * its connection had failed (ENETDOWN), and resumes over the links
 * left; where none is left, the peer is lost at once. */

/* Whether k's connection runs from one of the n addresses at a. */
static int conn_from(const conn *k, const struct in_addr *a, int n)
{
    struct sockaddr_in sa;
    socklen_t len = sizeof sa;
    uv_os_fd_t fd;

    if (uv_fileno((const uv_handle_t *)&k->h, &fd) != 0 ||
        getsockname(fd, (struct sockaddr *)&sa, &len) != 0 ||
        sa.sin_family != AF_INET)
        return 0;
    for (int i = 0; i < n; i++)
        if (sa.sin_addr.s_addr == a[i].s_addr)
            return 1;
    return 0;
}

/* Interface ifindex went down: its connections' wires are paused. */
static void iface_down(tcp_tp *tp, int ifindex)
{
    struct in_addr addrs[16];
    struct ifaddrs *ifa = NULL;
    char name[IF_NAMESIZE];
    int n = 0;

    if (if_indextoname((unsigned)ifindex, name) == NULL ||
        getifaddrs(&ifa) != 0)
        return;
    for (const struct ifaddrs *i = ifa; i != NULL && n < 16; i = i->ifa_next)
        if (i->ifa_addr != NULL && i->ifa_addr->sa_family == AF_INET &&
            strcmp(i->ifa_name, name) == 0)
            addrs[n++] = ((const struct sockaddr_in *)i->ifa_addr)->sin_addr;
    freeifaddrs(ifa);
    for (int p = 0; p < tp->nranks && n > 0 && tp->err == 0 && !tp->shut; p++)
        for (int w = 0; w < tp->peers[p].nslots && tp->err == 0; w++) {
            conn *k = tp->peers[p].s[w].c;

            if (k != NULL && k->resumable && k->state == CONN_UP &&
                !k->paused && !k->closing && k->successor == NULL &&
                conn_from(k, addrs, n)) {
                weft__log(WEFT__LOG_WARN, tp->rank,
                          "wire %d to peer %d (%s): its interface %s went "
                          "down",
                          w, p, k->name, name);
                weft__tcp_pause(k, UV_ENETDOWN);
            }
        }
}

static void linkwatch_cb(uv_poll_t *h, int status, int events)
{
    tcp_tp *tp = h->data;
    union {
        struct nlmsghdr h;
        char b[8192];
    } buf;
    ssize_t n;

    (void)events;
    if (status < 0 || tp->shut)
        return;
    while ((n = recv(tp->linkwatch_fd, buf.b, sizeof buf.b, MSG_DONTWAIT)) >
           0) {
        size_t left = (size_t)n;

        for (struct nlmsghdr *m = &buf.h; NLMSG_OK(m, left);
             m = NLMSG_NEXT(m, left)) {
            const struct ifinfomsg *ifi = NLMSG_DATA(m);

            if ((m->nlmsg_type != RTM_NEWLINK &&
                 m->nlmsg_type != RTM_DELLINK) ||
                m->nlmsg_len < NLMSG_LENGTH(sizeof *ifi))
                continue;
            if (m->nlmsg_type == RTM_DELLINK || !(ifi->ifi_flags & IFF_UP) ||
                !(ifi->ifi_flags & IFF_RUNNING))
                iface_down(tp, ifi->ifi_index);
        }
    }
}

/* Watches the interfaces where some wire can resume; without the watch
 * (no netlink here), a link set down is noticed at the user timeout. */
static void linkwatch_start(tcp_tp *tp)
{
    struct sockaddr_nl sa;
    int fd;

    fd = socket(AF_NETLINK, SOCK_RAW | SOCK_NONBLOCK | SOCK_CLOEXEC,
                NETLINK_ROUTE);
    if (fd < 0)
        return;
    memset(&sa, 0, sizeof sa);
    sa.nl_family = AF_NETLINK;
    sa.nl_groups = RTMGRP_LINK;
    if (bind(fd, (struct sockaddr *)&sa, sizeof sa) != 0 ||
        uv_poll_init(&tp->loop, &tp->linkwatch, fd) != 0) {
        close(fd);
        return;
    }
    tp->linkwatch_fd = fd;
    tp->linkwatch.data = tp;
    uv_poll_start(&tp->linkwatch, UV_READABLE, linkwatch_cb);
}

int weft__tcp_resume_init(tcp_tp *tp)
{
    int any = 0;
    size_t ret =
        4 * (tp->cfg->sockbuf_bytes > 0 ? (size_t)tp->cfg->sockbuf_bytes
                                        : (size_t)4 << 20);

    /* At least four frames, a power of two: the bytes a peer may not have
     * read are at most what the kernel holds (the send buffer, which the
     * kernel sizes at twice what was asked) and what waits for it. */
    if (ret < 4 * tp->cfg->frame_bytes)
        ret = 4 * tp->cfg->frame_bytes;
    while ((ret & (ret - 1)) != 0)
        ret &= ret - 1;
    if (tp->cfg->wire_timeout_ms <= 0)
        return 0;
    for (int p = 0; p < tp->nranks; p++)
        for (int w = 0; w < tp->peers[p].nslots; w++) {
            const slot *s = &tp->peers[p].s[w];
            conn *k = s->c;

            /* Loopback (ranks of one host) has no link to lose; a data
             * wire needs another to the peer, a relay connection a data
             * wire (others_up says whether one is up when it counts). */
            if (k == NULL || s->link == WEFT__LINK_LOOPBACK ||
                (!s->relay && tp->peers[p].nwires < 2) ||
                (s->relay && tp->peers[p].nwires < 1))
                continue;
            k->resumable = 1;
            k->ret_size = ret;
            k->via_link =
                s->alt_link >= 0 ? s->alt_link : weft__tcp_home_link(tp, p, s);
            any = 1;
        }
    if (any)
        linkwatch_start(tp);
    return 0;
}
