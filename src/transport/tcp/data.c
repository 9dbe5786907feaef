/*
 * The TCP transport's data path: posting frames, reading a wire into its
 * posted receives (or its read-ahead), writing queued sends in batches,
 * progress(), and what transports built on this one call to drive it
 * (weft__tcp_poll and the rest, boot.h).
 */
#define _GNU_SOURCE /* POLLRDHUP */
#include "transport/tcp/tcp.h"

#include "transport/common.h"

#include <errno.h>
#include <poll.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

/* A plain send of what the socket takes now, with no signal: the bytes
 * sent, 0 when it would block, or a negative libuv error. Only where no
 * earlier batch of k is with libuv, or the order would break: a batch sent
 * whole here completes at once (complete_batch), so an earlier one must
 * have completed first. libuv's write queue being empty is not enough: a
 * uv_write that wrote all its bytes at once (the socket drained between
 * the short send here and libuv's own write) runs its callback only in
 * the loop's next turn, and a pump meanwhile (a completion of another
 * wire in the same flush, a reduced frame taken back outside progress)
 * may queue more frames on k, which would otherwise complete first. */
static ssize_t try_send(conn *k, const uv_buf_t *bufs, int n)
{
    struct msghdr m;
    uv_os_fd_t fd;
    ssize_t r;

    if (k->uv_batches != 0 ||
        uv_stream_get_write_queue_size((uv_stream_t *)&k->h) != 0)
        return 0;
    if (uv_fileno((uv_handle_t *)&k->h, &fd) != 0)
        return UV_EBADF;
    memset(&m, 0, sizeof m);
    /* uv_buf_t is laid out as struct iovec on Unix (libuv's own writes
     * rely on it). */
    m.msg_iov = (struct iovec *)(uintptr_t)bufs;
    m.msg_iovlen = (size_t)n;
    do
        r = sendmsg(fd, &m, MSG_NOSIGNAL | MSG_DONTWAIT);
    while (r < 0 && errno == EINTR);
    if (r >= 0)
        return r;
    return errno == EAGAIN || errno == EWOULDBLOCK ? 0 : -errno;
}

static void rx_fail(conn *k)
{
    tcp_tp *tp = k->tp;

    if (tp->err == 0)
        tp->lost_peer = k->peer;
    if (k->rx_end == UV_EOF)
        weft__tcp_fail(
            tp, WEFT_EPEER,
            "rank %d: peer %d closed wire %d (%s) while this rank was "
            "receiving",
            tp->rank, k->peer, k->wire, k->name);
    else
        weft__tcp_fail(
            tp, weft__tcp_err_code(k->rx_end),
            "rank %d: receive from peer %d on wire %d (%s) failed: %s",
            tp->rank, k->peer, k->wire, k->name, uv_strerror(k->rx_end));
}

/* A write on k failed with libuv's uverr. Where the peer closed or reset
 * its end (a broken pipe: the write raced the end of the stream, which the
 * read side has not seen yet), the message says so, as rx_fail's does. */
static void tx_failed(conn *k, int uverr)
{
    tcp_tp *tp = k->tp;

    weft__tcp_wire_lost(k, uverr);
    if (weft__tcp_err_code(uverr) != WEFT_EPEER) {
        weft__tcp_fail(tp, weft__tcp_err_code(uverr),
                       "rank %d: send to peer %d on wire %d (%s) failed: %s",
                       tp->rank, k->peer, k->wire, k->name, uv_strerror(uverr));
        return;
    }
    if (tp->err == 0)
        tp->lost_peer = k->peer;
    weft__tcp_fail(tp, WEFT_EPEER,
                   "rank %d: peer %d closed or reset wire %d (%s) while this "
                   "rank was sending to it (%s)",
                   tp->rank, k->peer, k->wire, k->name, uv_strerror(uverr));
}

/* A send to a peer whose end of the wire has closed (or reset): it can
 * never be received. */
static void tx_closed(conn *k)
{
    tcp_tp *tp = k->tp;

    if (tp->err == 0)
        tp->lost_peer = k->peer;
    weft__tcp_fail(
        tp, WEFT_EPEER,
        "rank %d: peer %d %s wire %d (%s) before this rank sent to it",
        tp->rank, k->peer, k->rx_end == UV_EOF ? "closed" : "reset", k->wire,
        k->name);
}

/* Pops the head receive, complete, and runs its completion. */
static void rx_complete(conn *k)
{
    weft__xfer *x = k->rq_head;

    k->rq_head = x->tp_next;
    if (k->rq_head == NULL)
        k->rq_tail = NULL;
    x->tp_next = NULL;
    k->tp->events++;
    x->done(x);
}

/* Hands read-ahead bytes to the posted receives, in order. Runs only
 * inside progress() (completions may run). */
static void rx_drain(conn *k)
{
    tcp_tp *tp = k->tp;

    while (k->rq_head != NULL && k->rx_lo < k->rx_hi && tp->err == 0 &&
           !k->closing) {
        weft__xfer *x = k->rq_head;
        size_t n = x->len - x->got;
        if (n > k->rx_hi - k->rx_lo)
            n = k->rx_hi - k->rx_lo;
        memcpy(x->buf + x->got, k->rxb + k->rx_lo, n);
        x->got += n;
        k->rx_lo += n;
        if (x->got == x->len)
            rx_complete(k);
    }
    if (k->rx_lo == k->rx_hi)
        k->rx_lo = k->rx_hi = 0;
    /* A receive that the ended stream can no longer fill is a failure; an
     * end with nothing posted is not (yet): the peer may have sent all it
     * had to before it left. */
    if (weft__xfer_wanted(k->rq_head) && k->rx_lo == k->rx_hi && k->rx_end != 0)
        rx_fail(k);
    /* Reading stopped on a full read-ahead: there is room again. */
    if (!k->reading && k->rx_end == 0 && k->rx_hi < RX_CAP && !k->closing &&
        !k->paused && tp->err == 0) {
        int rc = uv_read_start((uv_stream_t *)&k->h, weft__tcp_data_alloc_cb,
                               weft__tcp_data_read_cb);
        if (rc != 0)
            weft__tcp_fail(tp, WEFT_ETRANSPORT,
                           "rank %d: cannot read from peer %d wire %d: %s",
                           tp->rank, k->peer, k->wire, uv_strerror(rc));
        else
            k->reading = 1;
    }
}

void weft__tcp_data_alloc_cb(uv_handle_t *h, size_t suggested, uv_buf_t *buf)
{
    conn *k = h->data;
    weft__xfer *x = k->rq_head;

    (void)suggested;
    if (k->rxb == NULL && (k->rxb = malloc(RX_CAP)) == NULL) {
        /* libuv then reports UV_ENOBUFS to weft__tcp_data_read_cb. */
        buf->base = NULL;
        buf->len = 0;
        return;
    }
    if (x != NULL && k->rx_lo == k->rx_hi && x->len >= RX_DIRECT_MIN) {
        /* Large frames land in place, with no copy, to their last byte. */
        k->rx_direct = 1;
        buf->base = x->buf + x->got;
        buf->len = x->len - x->got;
        return;
    }
    k->rx_direct = 0;
    if (k->rx_lo > 0 && k->rx_hi == RX_CAP) {
        memmove(k->rxb, k->rxb + k->rx_lo, k->rx_hi - k->rx_lo);
        k->rx_hi -= k->rx_lo;
        k->rx_lo = 0;
    }
    buf->base = k->rxb + k->rx_hi;
    buf->len = RX_CAP - k->rx_hi;
    if (x != NULL) {
        /* Small receives are posted: read those (a header and the small
         * frame after it, typically) in one go, but not into a large frame
         * that follows, which is better read in place. With no large frame
         * posted, the whole read-ahead is offered: a read that fills the
         * buffer exactly makes libuv read again, for nothing. */
        size_t want = x->len - x->got;
        weft__xfer *y = x->tp_next, *last = x;
        for (; y != NULL && y->len < RX_DIRECT_MIN; y = y->tp_next) {
            want += y->len;
            last = y;
        }
        /* A large frame posted, or about to be (the engine's header read
         * says what follows it): stop before it. */
        if ((y != NULL || last->next_len >= RX_DIRECT_MIN) &&
            k->rx_hi - k->rx_lo < want &&
            want - (k->rx_hi - k->rx_lo) < buf->len)
            buf->len = want - (k->rx_hi - k->rx_lo);
    }
}

void weft__tcp_data_read_cb(uv_stream_t *s, ssize_t nread, const uv_buf_t *buf)
{
    conn *k = s->data;
    tcp_tp *tp = k->tp;

    (void)buf;
    if (nread > 0) {
        tp->events++;
        k->rx_pos += (uint64_t)nread;
        k->rx_ms = uv_now(&tp->loop);
        if (k->rx_direct) {
            weft__xfer *x = k->rq_head;
            x->got += (size_t)nread;
            if (x->got == x->len && tp->err == 0)
                rx_complete(k);
        } else {
            k->rx_hi += (size_t)nread;
            rx_drain(k);
        }
        /* Full read-ahead and nothing posted: stop until a receive is
         * posted, so a peer far ahead is held back by TCP, not memory. */
        if (k->rx_hi - k->rx_lo == RX_CAP && k->rq_head == NULL &&
            !k->closing) {
            uv_read_stop(s);
            k->reading = 0;
        }
        return;
    }
    if (nread == 0)
        return; /* EAGAIN */
    uv_read_stop(s);
    k->reading = 0;
    if (nread == UV_ENOBUFS && k->rxb != NULL)
        return; /* full: a post_recv reads again once rx_drain empties it */
    if (nread == UV_ENOBUFS) {
        weft__tcp_fail(
            tp, WEFT_ENOMEM,
            "rank %d: no memory for the read-ahead of wire %d to peer "
            "%d",
            tp->rank, k->wire, k->peer);
        return;
    }
    if (nread == UV_EOF)
        nread = weft__tcp_eof_cause(k);
    /* A link lost under a wire with others to the peer: resumed. */
    if (weft__tcp_pause(k, (int)nread))
        return;
    /* Noted, not yet a failure: the bytes the peer sent before it left
     * are handed over first (rx_drain), and the close counts once a
     * receive wants more or a send is posted to it. */
    k->rx_end = (int)nread;
    tp->ends++;
    weft__tcp_wire_lost(k, (int)nread);
    if (!tp->up) {
        /* Before set-up ended nothing is owed: the peer gave up. */
        weft__tcp_setup_closed(k);
        return;
    }
    if (nread == UV_EOF && weft__tcp_closed_while_paused(k))
        return;
    rx_drain(k);
}

/* Runs the completions of a batch that has left, in order. */
static void complete_batch(tcp_tp *tp, wreq *w)
{
    weft__xfer *x = w->first;
    int n = w->n;

    w->next = tp->free_wreqs;
    tp->free_wreqs = w;
    tp->events++;
    for (int i = 0; i < n && x != NULL; i++) {
        /* done() may post again and reuse the link: read it first. */
        weft__xfer *next = x->tp_next;
        x->tp_next = NULL;
        x->done(x);
        if (tp->err != 0)
            return;
        x = next;
    }
}

/* A batch of k has left (status 0) or failed. Once the transport has
 * failed nothing more completes, as in complete_batch and rx_drain: a
 * completion that failed it (a pump posting to a peer that has closed)
 * cut its batch short, and a later batch of the same wire, written too
 * (libuv's next write, or the sending thread's, collected together),
 * would otherwise complete ahead of the frames left behind. */
static void batch_done(tcp_tp *tp, conn *k, wreq *w, int status)
{
    /* A paused wire's batch counts as sent: its bytes are kept and go
     * again on the connection that resumes the wire (resume.c). */
    if (status < 0 && !tp->shut && tp->err == 0 &&
        (k->paused || weft__tcp_pause(k, status)))
        status = 0;
    if (tp->shut || tp->err != 0 || status < 0) {
        w->next = tp->free_wreqs;
        tp->free_wreqs = w;
        if (!tp->shut && status < 0)
            tx_failed(k, status);
        return;
    }
    complete_batch(tp, w);
}

static void data_write_cb(uv_write_t *req, int status)
{
    wreq *w = (wreq *)req;
    conn *k = req->handle->data;
    tcp_tp *tp = k->tp;

    weft__tcp_write_done(tp);
    k->uv_batches--;
    batch_done(tp, k, w, status);
}

/* Runs the completions of the batches the sending thread wrote (or
 * failed), oldest first (inside progress() only). */
static void tx_collect(tcp_tp *tp)
{
    wreq *w = weft__tcp_tx_take(tp);

    while (w != NULL) {
        wreq *next = w->next;
        conn *k = w->k;

        w->next = NULL;
        batch_done(tp, k, w, w->status);
        /* A resumed wire's old connection closes once the thread let go
         * of its socket (resume.c). */
        if (k->successor != NULL && k->tx_batches == 0 && !k->closing)
            weft__tcp_conn_close(k);
        w = next;
    }
}

/* Whether k's batch of bufs[0..n), whose first frame is x, goes to the
 * sending thread (tcp.h): where it runs, none of k's batches is with
 * libuv, and an earlier one of k is with the thread, or the batch is large
 * and of a pass that moves much (x->bulk). */
static int for_thread(const tcp_tp *tp, const conn *k, const weft__xfer *x,
                      const uv_buf_t *bufs, int n)
{
    size_t bytes = 0;

    /* (A resumed wire's bytes sent again go through libuv: the thread
     * waits until they left.) */
    if (!tp->cfg->send_thread || tp->tx_failed || k->uv_batches != 0 ||
        uv_stream_get_write_queue_size((const uv_stream_t *)&k->h) != 0)
        return 0;
    if (k->tx_batches != 0)
        return 1;
    if (!x->bulk)
        return 0;
    for (int i = 0; i < n; i++)
        bytes += bufs[i].len;
    return bytes >= tp->cfg->send_thread_min_bytes;
}

/* Puts k on tp's list of connections with sends to write. */
static void mark_dirty(tcp_tp *tp, conn *k)
{
    if (!k->dirty) {
        k->dirty = 1;
        k->dirty_next = tp->dirty;
        tp->dirty = k;
    }
}

/* Hands every queued send to libuv, one write (one writev) per batch of
 * up to BATCH_MAX frames per connection: a header and its first frames, or
 * the frames of several steps, leave in one system call. */
static void tcp_flush(tcp_tp *tp)
{
    while (tp->dirty != NULL && tp->err == 0) {
        conn *k = tp->dirty;
        uv_buf_t bufs[BATCH_MAX];
        weft__xfer *x = k->sq_head;
        wreq *r;
        ssize_t sr;
        int n = 0, rc;

        tp->dirty = k->dirty_next;
        k->dirty = 0;
        k->dirty_next = NULL;
        if (x == NULL || k->closing || k->paused)
            continue;
        if (k->rx_end != 0) {
            tx_closed(k);
            return;
        }
        r = tp->free_wreqs;
        if (r != NULL)
            tp->free_wreqs = r->next;
        else if ((r = malloc(sizeof *r)) == NULL) {
            weft__tcp_fail(tp, WEFT_ENOMEM, "rank %d: out of memory", tp->rank);
            return;
        }
        r->first = x;
        for (weft__xfer *y = x; y != NULL && n < BATCH_MAX; y = y->tp_next)
            bufs[n++] = uv_buf_init(y->buf, (unsigned int)y->len);
        r->n = n;
        weft__tcp_retain(k, bufs, n);
        /* Unlink the batch; what is left stays queued for the next one. */
        {
            weft__xfer *last = x;
            for (int i = 1; i < n; i++)
                last = last->tp_next;
            k->sq_head = last->tp_next;
            last->tp_next = NULL;
            if (k->sq_head == NULL)
                k->sq_tail = NULL;
            else
                mark_dirty(tp, k);
        }
        if (for_thread(tp, k, x, bufs, n)) {
            memcpy(r->bufs, bufs, (size_t)n * sizeof *bufs);
            r->nb = n;
            if (weft__tcp_tx_hand(tp, k, r) == 0)
                continue;
        }
        /* Try a plain writev first: when the socket takes the whole batch
         * (small frames usually), no write request is made, and libuv
         * touches no epoll registration. */
        sr = try_send(k, bufs, n);
        rc = sr < 0 ? (int)sr : 0;
        if (sr >= 0) {
            size_t sent = (size_t)sr;
            int skip = 0;
            while (skip < n && sent >= bufs[skip].len) {
                sent -= bufs[skip].len;
                skip++;
            }
            if (skip == n) {
                complete_batch(tp, r);
                continue;
            }
            bufs[skip].base += sent;
            bufs[skip].len -= sent;
            rc = weft__tcp_write(tp, &r->req, (uv_stream_t *)&k->h, bufs + skip,
                                 (unsigned int)(n - skip), data_write_cb);
            if (rc == 0)
                k->uv_batches++;
        }
        if (rc != 0 && weft__tcp_pause(k, rc)) {
            complete_batch(tp, r); /* kept: it goes again (resume.c) */
            continue;
        }
        if (rc != 0) {
            r->next = tp->free_wreqs;
            tp->free_wreqs = r;
            tx_failed(k, rc);
            return;
        }
    }
}

void weft__tcp_kick(conn *k)
{
    tcp_tp *tp = k->tp;

    if (k->sq_head != NULL)
        mark_dirty(tp, k);
    if (k->rq_head != NULL && k->rx_lo < k->rx_hi && !k->rx_dirty) {
        k->rx_dirty = 1;
        k->rx_next = tp->rx_dirty;
        tp->rx_dirty = k;
    }
    tp->events++;
}

static conn *wire_conn(tcp_tp *tp, int p, int w)
{
    if (p < 0 || p >= tp->nranks || w < 0 || w >= tp->peers[p].nwires)
        return NULL;
    return tp->peers[p].s[w].c;
}

/* The connection a frame is posted on, or the error that refuses it. A
 * connection handing its wire over to a new one (resume.c: closing, with
 * a successor) takes it: what it holds moves to the new one once it has
 * closed (weft__tcp_resume_finish), as while it was paused. */
static int post_target(tcp_tp *tp, int p, int w, conn **out)
{
    conn *k = wire_conn(tp, p, w);

    if (tp->err != 0)
        return tp->err;
    if (k == NULL || (k->closing && k->successor == NULL))
        return weft__tp_no_wire(tp->sink, tp->rank, p, w);
    *out = k;
    return WEFT_OK;
}

int weft__tcp_post_send(weft__tp *t, int p, int w, weft__xfer *x)
{
    tcp_tp *tp = (tcp_tp *)t;
    conn *k = NULL;
    int rc = post_target(tp, p, w, &k);

    if (rc != 0)
        return rc;
    if (k->rx_end != 0) {
        tx_closed(k);
        return tp->err;
    }
    /* With no receive posted on the wire, nothing would reveal that the
     * peer has gone before the bytes vanish into the kernel's buffer:
     * progress() first looks for news. */
    if (k->rq_head == NULL)
        tp->probe = 1;
    /* Queued, not written: progress() writes what a pump posted at once. */
    weft__xq_push(&k->sq_head, &k->sq_tail, x);
    mark_dirty(tp, k);
    return WEFT_OK;
}

int weft__tcp_post_recv(weft__tp *t, int p, int w, weft__xfer *x)
{
    tcp_tp *tp = (tcp_tp *)t;
    conn *k = NULL;
    int rc = post_target(tp, p, w, &k);

    if (rc != 0)
        return rc;
    x->got = 0;
    weft__xq_push(&k->rq_head, &k->rq_tail, x);
    /* Read-ahead (or the stream's end) is handed out by progress(), since
     * completions never run inside a post. */
    if ((k->rx_lo < k->rx_hi || k->rx_end != 0) && !k->rx_dirty) {
        k->rx_dirty = 1;
        k->rx_next = tp->rx_dirty;
        tp->rx_dirty = k;
    }
    if (!k->reading && k->rx_end == 0 && !k->paused) {
        rc = uv_read_start((uv_stream_t *)&k->h, weft__tcp_data_alloc_cb,
                           weft__tcp_data_read_cb);
        if (rc != 0) {
            weft__tcp_fail(tp, WEFT_ETRANSPORT,
                           "rank %d: cannot read from peer %d wire %d: %s",
                           tp->rank, p, w, uv_strerror(rc));
            return tp->err;
        }
        k->reading = 1;
    }
    return WEFT_OK;
}

/* ---- progress ---- */

/* What posts left for progress() to do: queued sends to write, read-ahead
 * for posted receives, relayed chunks for posted relay receives. */
static void tcp_handoff(tcp_tp *tp)
{
    tx_collect(tp);
    tcp_flush(tp);
    while (tp->rx_dirty != NULL && tp->err == 0) {
        conn *k = tp->rx_dirty;
        tp->rx_dirty = k->rx_next;
        k->rx_dirty = 0;
        k->rx_next = NULL;
        if (!k->closing)
            rx_drain(k);
    }
    if (tp->relay_ready && tp->err == 0)
        weft__tcp_relay_drain(tp);
    if (!tp->shut)
        weft__tcp_relay_forward(tp);
}

/* One turn of the loop that never blocks (weft__tp_spin). */
static int spin_pass(void *arg)
{
    tcp_tp *tp = arg;

    weft__tcp_run(tp, UV_RUN_NOWAIT);
    tx_collect(tp);
    return tp->err;
}

int weft__tcp_progress(weft__tp *t, uint64_t deadline_ms)
{
    tcp_tp *tp = (tcp_tp *)t;
    unsigned ev = tp->events;
    uint64_t now;
    int rc;

    if (tp->probe) {
        /* A send waits to go to a wire nothing reads from: see first
         * whether its peer has closed (weft__tcp_post_send). What this turn of
         * the loop completes counts as progress like any other (ev is not
         * taken again): the caller may be done now, and must look before
         * this call sleeps. */
        tp->probe = 0;
        weft__tcp_run(tp, UV_RUN_NOWAIT);
        if (tp->err != 0)
            return tp->err;
    }
    tcp_handoff(tp);
    if (tp->err != 0)
        return tp->err;
    if (tp->events != ev)
        return WEFT_OK;
    /* With a core to spare, poll a little before sleeping: waking a
     * sleeping process costs more than a short message takes to arrive. */
    rc = weft__tp_spin(weft__spin_len(&tp->spin, deadline_ms), spin_pass, tp,
                       &tp->events, ev);
    if (rc != 0)
        return rc < 0 ? rc : WEFT_OK;
    now = weft__now_ms();
    if (now >= deadline_ms)
        return WEFT_ETIMEDOUT;
    uint64_t slept = weft__now_ns();
    uv_timer_start(&tp->timer, weft__tcp_timer_cb, deadline_ms - now, 0);
    weft__tcp_run(tp, UV_RUN_ONCE);
    tx_collect(tp);
    if (tp->err != 0)
        return tp->err;
    /* A turn that ended with nothing done (the loop's housekeeping timer)
     * says nothing about how long the spin should be. */
    if (tp->events != ev)
        weft__spin_slept(&tp->spin, weft__now_ns() - slept);
    return WEFT_OK;
}

void weft__tcp_wake(weft__tp *t)
{
    uv_async_send(&((tcp_tp *)t)->async);
}

/* ---- for transports built on this one (boot.h) ---- */

int weft__tcp_poll(weft__tp *t)
{
    tcp_tp *tp = (tcp_tp *)t;
    unsigned ev = tp->events;

    if (tp->shut)
        return tp->err != 0 ? tp->err : WEFT_EABORTED;
    tcp_handoff(tp);
    /* Also registers with epoll the reads that posts started, so that the
     * caller's poll() on weft__tcp_fd() sees them. */
    if (tp->err == 0)
        weft__tcp_run(tp, UV_RUN_NOWAIT);
    if (tp->err != 0)
        return tp->err;
    return tp->events != ev ? 1 : 0;
}

int weft__tcp_lost_peer(weft__tp *t)
{
    tcp_tp *tp = (tcp_tp *)t;
    return tp->err != 0 ? tp->lost_peer : -1;
}

unsigned weft__tcp_ends(weft__tp *t)
{
    return ((tcp_tp *)t)->ends;
}

int weft__tcp_wire_ready(weft__tp *t, int p, int w)
{
    tcp_tp *tp = (tcp_tp *)t;
    const conn *k;

    if (p < 0 || p >= tp->nranks || w < 0 || w >= tp->peers[p].nwires)
        return 0;
    k = tp->peers[p].s[w].c;
    return k != NULL && k->state == CONN_UP && !k->paused && !k->closing &&
           k->rx_end == 0;
}

int weft__tcp_wire_home(weft__tp *t, int p, int w)
{
    const tcp_tp *tp = (const tcp_tp *)t;
    const slot *s;

    if (!weft__tcp_wire_ready(t, p, w))
        return 0;
    s = &tp->peers[p].s[w];
    return s->c->via_link < 0 || s->c->via_link == (int)s->link;
}

int weft__tcp_peer_ended(weft__tp *t, int p)
{
    tcp_tp *tp = (tcp_tp *)t;

    if (p < 0 || p >= tp->nranks)
        return 0;
    for (int w = 0; w < tp->peers[p].nslots; w++) {
        const conn *k = tp->peers[p].s[w].c;
        if (k != NULL && k->rx_end != 0)
            return 1;
    }
    return 0;
}

int weft__tcp_peer_hup(weft__tp *t, int p)
{
    tcp_tp *tp = (tcp_tp *)t;

    if (weft__tcp_peer_ended(t, p))
        return 1;
    for (int w = 0; w < tp->peers[p].nslots; w++) {
        const conn *k = tp->peers[p].s[w].c;
        uv_os_fd_t fd;
        struct pollfd pf;

        if (k == NULL || k->closing ||
            uv_fileno((const uv_handle_t *)&k->h, &fd) != 0)
            continue;
        pf = (struct pollfd){.fd = fd, .events = POLLRDHUP};
        if (poll(&pf, 1, 0) == 1 &&
            (pf.revents & (POLLRDHUP | POLLHUP | POLLERR)) != 0)
            return 1;
    }
    return 0;
}

int weft__tcp_waits(weft__tp *t, int p)
{
    const tcp_tp *tp = (const tcp_tp *)t;

    if (p < 0)
        return tp->rrecv != NULL;
    if (p >= tp->nranks)
        return 0;
    for (int w = 0; w < tp->peers[p].nwires; w++) {
        const conn *k = tp->peers[p].s[w].c;

        if (k != NULL && (weft__xfer_wanted(k->rq_head) || k->sq_head != NULL))
            return 1;
    }
    return 0;
}

int weft__tcp_fd(weft__tp *t)
{
    return uv_backend_fd(&((tcp_tp *)t)->loop);
}

int weft__tcp_timeout(weft__tp *t)
{
    return uv_backend_timeout(&((tcp_tp *)t)->loop);
}

/* ---- as what carries shared memory's traffic to other hosts ---- */

static weft__tp *far_tcp(weft__tp *t)
{
    return t;
}

static int far_poll(weft__tp *t, int look)
{
    (void)look;
    return weft__tcp_poll(t);
}

static int far_sleep_prep(weft__tp *t, struct pollfd *pfd, int max, int *n,
                          int *tmo)
{
    int tt = weft__tcp_timeout(t);

    if (*n >= max)
        return WEFT_ETRANSPORT;
    if (tt >= 0 && tt < *tmo)
        *tmo = tt;
    pfd[(*n)++] = (struct pollfd){.fd = weft__tcp_fd(t), .events = POLLIN};
    return 0;
}

static void far_woke(weft__tp *t, const struct pollfd *pfd, int n)
{
    (void)t, (void)pfd, (void)n; /* the next weft__tcp_poll takes them */
}

const weft__tp_far weft__tcp_far = {
    .ops = &weft__tcp_ops,
    .tcp = far_tcp,
    .poll = far_poll,
    .sleep_prep = far_sleep_prep,
    .woke = far_woke,
};
