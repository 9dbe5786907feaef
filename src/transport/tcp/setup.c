/*
 * TCP transport on libuv.
 *
 * Each wire is one TCP connection. The higher rank of a pair connects to the
 * lower one's port, once per wire, and opens with a hello that carries the
 * job token, both ranks, the link and the wire index; the acceptor places
 * the connection by those fields (never by arrival order) and answers. A
 * connection whose hello is wrong, garbage, or missing after a while is
 * logged and closed; the job goes on.
 *
 * Receives land directly in the buffer of the oldest posted frame of the
 * wire (libuv's alloc callback hands out exactly the bytes that frame still
 * needs), so a stream never spills one operation's bytes into another's
 * buffer. Bytes that arrive before their receive is posted wait in a
 * read-ahead buffer.
 *
 * Liveness: every wire reads from the moment it is up, so a peer's close
 * (or reset) is noticed whenever this rank runs progress(), not only while
 * it waits to receive. What the peer sent before it closed is still handed
 * to the receives that want it; the close counts (WEFT_EPEER) once a
 * receive wants more than arrived, or a send is posted to that peer. A
 * send to a wire with no receive posted on it first looks for news on
 * every wire (one non-blocking turn of the loop), so a send to a peer that
 * left long ago fails instead of vanishing into the kernel's buffer.
 *
 * Set-up: a connection that breaks before both ends are up is tried again
 * until the connect deadline: the other end may be the peer's previous
 * communicator, still alive and holding the port, which rejects it (its
 * slots are taken) or lets it sit in its backlog (the answer is awaited
 * HANDSHAKE_MS, then the connection is tried again). A communicator that
 * failed stops listening at once, so the peer's new one is refused until
 * the process binds the port anew.
 *
 * Everything runs on the calling thread inside progress(); there is no
 * background thread. weft_abort() reaches a blocked progress() through a
 * uv_async_t.
 */
#include "transport/transport.h"

#include "base/bytes.h"

#include <arpa/inet.h>
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sched.h>
#include <sys/socket.h>
#include <time.h>
#include <uv.h>

#define HELLO_MAGIC 0x54464557u /* "WEFT" */
#define REPLY_MAGIC 0x4b4f4657u /* "WFOK" */
#define HELLO_VERSION 2u
#define HELLO_BYTES 40
#define REPLY_BYTES 8
#define ACK_MAGIC 0x4b414657u /* "WFAK" */
#define ACK_BYTES 4
#define LINK_RELAY 0xfffffffeu /* the relay connection to a neighbour */
#define RELAY_MAGIC 0x4c524657u /* "WFRL" */
#define RELAY_HDR 24
#define RELAY_CHUNK (256 * 1024)
#define HANDSHAKE_MS 5000
#define RX_CAP (256 * 1024) /* read-ahead per connection */
#define RX_DIRECT_MIN (64 * 1024) /* receives this big are read in place */
#define RETRY_MS 25

typedef struct tcp_tp tcp_tp;

/* A connection's set-up: the dialling side connects, sends its hello and
 * waits for the answer (REPLY_WAIT), then acknowledges it and is up; the
 * listening side waits for the hello, claims the slot it names, answers,
 * and is up once the acknowledgement arrives (ACK_WAIT). Only a connection
 * that breaks before it is up on its side is tried again (or its slot
 * freed): once up, a close is the peer leaving, as on any wire. */
enum {
    CONN_HELLO_WAIT,
    CONN_CONNECTING,
    CONN_REPLY_WAIT,
    CONN_ACK_WAIT,
    CONN_UP
};

typedef struct conn {
    uv_tcp_t h;
    tcp_tp *tp;
    int state;
    int peer;
    int wire;
    int reading;
    int closing;
    uint64_t deadline_ms; /* handshake deadline (hello or answer) */
    uint8_t hbuf[HELLO_BYTES];
    size_t hgot;
    uint8_t out[HELLO_BYTES]; /* hello or reply being written */
    uv_write_t hreq;
    uv_write_t areq; /* the acknowledgement (dialling side) */
    uint8_t ack[ACK_BYTES];
    uv_connect_t creq;
    weft__xfer *rq_head; /* posted receives, oldest first */
    weft__xfer *rq_tail;
    weft__xfer *sq_head; /* posted sends not yet handed to libuv */
    weft__xfer *sq_tail;
    int dirty;               /* in tp->dirty: has queued sends */
    struct conn *dirty_next;
    /* Bytes read ahead of the posted receives: a wire keeps reading once
     * started (restarting a read costs epoll_ctl calls on every frame),
     * and small frames arrive several to a read. */
    char *rxb;
    size_t rx_lo, rx_hi; /* unread bytes are rxb[rx_lo, rx_hi) */
    int rx_direct;       /* the current read lands in the head receive */
    int rx_end;          /* the stream ended: 0, UV_EOF or an error */
    int rx_dirty;        /* in tp->rx_dirty: read-ahead to hand out */
    struct conn *rx_next;
    /* A relay connection reads chunks: a header, then its bytes. */
    uint8_t rhdr[RELAY_HDR];
    size_t rhgot;
    char *rdata;
    size_t rdlen, rdgot;
    struct conn *next; /* in tp->pending while the handshake runs */
    char name[96];     /* "127.0.0.1:port" of the other end, for logs */
} conn;

/* One wire slot of a peer: which link it runs on and, once up, its
 * connection. */
typedef struct {
    uint32_t link; /* link index in the hostfile, or WEFT__LINK_LOOPBACK */
    uint32_t lwire; /* wire index on that link */
    int outgoing;   /* we connect (we are the higher rank) */
    char addr[64];  /* where to connect (outgoing only) */
    int port;
    uint64_t next_try_ms;
    int relay; /* the relay connection, not a data wire */
    conn *trying; /* outgoing: the connection in set-up, if any */
    conn *c;
} slot;

typedef struct {
    int nwires; /* data wires: s[0 .. nwires) */
    int nslots; /* plus the relay connection, if any */
    slot *s;
} peer;

/* One write of a batch of frames; they complete together, in order. */
typedef struct wreq {
    uv_write_t req;
    weft__xfer *first;
    int n;
    struct wreq *next;
} wreq;

/* A relayed chunk: header fields and its bytes (owned). */
typedef struct rchunk {
    int dir; /* passing through: the direction it goes on in */
    uint32_t src, dst, len;
    uint64_t total;
    char *data;
    struct rchunk *next;
} rchunk;

/* The write of one relayed chunk: its header, and its bytes when they are
 * owned (a forwarded chunk) rather than the sender's buffer. */
typedef struct rwreq {
    uv_write_t req;
    uint8_t hdr[RELAY_HDR];
    char *owned;
    weft__xfer *x; /* the send it belongs to, or NULL when forwarded */
} rwreq;

/* Frames per write: enough to batch a pump's worth of posts. */
#define BATCH_MAX 64

struct tcp_tp {
    uv_loop_t loop;
    uv_tcp_t listener;
    uv_timer_t timer;     /* deadline of progress() */
    uv_timer_t housekeep; /* connect retries and handshake deadlines */
    uv_async_t async;
    const weft__config *cfg;
    weft__errsink *sink; /* where failures are recorded */
    int rank;
    int nranks;
    int probe;  /* a send went to a wire with no receive posted */
    int lost_peer; /* the peer whose close or reset failed us, or -1 */
    peer *peers;
    conn *pending;
    int nopen;    /* connections not yet closed */
    int err;      /* first transport error, WEFT_OK if none */
    int shut;     /* shutdown() ran: completions are dropped */
    int handles;  /* loop-level handles initialised */
    wreq *free_wreqs;
    conn *dirty;     /* connections with queued sends */
    conn *rx_dirty;  /* connections with read-ahead for posted receives */
    /* Relaying (see relay_send): the connections to the left (0) and right
     * (1) neighbours, chunks that arrived for this rank before their
     * receive was posted, and the posted relay receives, oldest first. */
    slot *relay[2];
    struct rchunk *rpending;
    /* Chunks passing through, to write once uv_run has returned (writes
     * from inside it would escape the SIGPIPE guard), oldest first. */
    struct rchunk *fwd_head, *fwd_tail;
    weft__xfer *rrecv;
    int relay_ready; /* posted receives may match pending chunks */
    unsigned events; /* completions and wake-ups, for spinning */
    int uv_writes;   /* libuv write requests whose callback has not run */
    uint64_t spin_ns; /* poll this long before sleeping (0: never) */
};

/* ---- loop helpers ---- */

/* SIGPIPE. libuv writes with plain write(), which raises SIGPIPE when the
 * peer has gone, and that would kill the process. The transport's own
 * writes use send(MSG_NOSIGNAL); libuv writes only inside uv_write() and,
 * for requests still queued, inside uv_run(). Those two run under the
 * SIGPIPE guard (weft__sigpipe_block), uv_run only while a request is
 * queued, so a small operation pays no signal-mask system calls. */
static void tcp_run(tcp_tp *tp, uv_run_mode mode)
{
    weft__sigpipe_state sp;

    if (tp->uv_writes == 0) {
        uv_run(&tp->loop, mode);
        return;
    }
    weft__sigpipe_block(&sp);
    uv_run(&tp->loop, mode);
    weft__sigpipe_restore(&sp);
}

/* uv_write under the guard; every callback of such a request starts with
 * write_done(). */
static int tcp_write(tcp_tp *tp, uv_write_t *req, uv_stream_t *s,
                     const uv_buf_t *bufs, unsigned int n, uv_write_cb cb)
{
    weft__sigpipe_state sp;
    int rc;

    weft__sigpipe_block(&sp);
    rc = uv_write(req, s, bufs, n, cb);
    weft__sigpipe_restore(&sp);
    if (rc == 0)
        tp->uv_writes++;
    return rc;
}

static void write_done(tcp_tp *tp)
{
    tp->uv_writes--;
}

/* A plain send of what the socket takes now, with no signal: the bytes
 * sent, 0 when it would block, or a negative libuv error. Only where
 * libuv has nothing queued on the stream, or the order would break. */
static ssize_t try_send(conn *k, const uv_buf_t *bufs, int n)
{
    struct msghdr m;
    uv_os_fd_t fd;
    ssize_t r;

    if (uv_stream_get_write_queue_size((uv_stream_t *)&k->h) != 0)
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

static void tcp_fail(tcp_tp *tp, int err, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

static void tcp_fail(tcp_tp *tp, int err, const char *fmt, ...)
{
    va_list ap;

    va_start(ap, fmt);
    weft__tp_fail(tp->sink, &tp->err, err, fmt, ap);
    va_end(ap);
}

/* A connection's error as weft's code: a peer that closed or reset it is
 * WEFT_EPEER, whichever call noticed; anything else is the transport's. */
static int conn_err_code(int uverr)
{
    switch (uverr) {
    case UV_EOF:
    case UV_EPIPE:
    case UV_ECONNRESET:
    case UV_ECONNABORTED:
    case UV_ENOTCONN:
        return WEFT_EPEER;
    default:
        return WEFT_ETRANSPORT;
    }
}

static void conn_close_cb(uv_handle_t *h)
{
    conn *k = (conn *)h;
    k->tp->nopen--;
    free(k->rxb);
    free(k->rdata);
    free(k);
}

static void conn_close(conn *k)
{
    if (k->closing)
        return;
    k->closing = 1;
    uv_close((uv_handle_t *)&k->h, conn_close_cb);
}

static conn *conn_new(tcp_tp *tp)
{
    conn *k = calloc(1, sizeof *k);

    if (k == NULL)
        return NULL;
    k->tp = tp;
    k->peer = -1;
    k->wire = -1;
    if (uv_tcp_init(&tp->loop, &k->h) != 0) {
        free(k);
        return NULL;
    }
    k->h.data = k;
    tp->nopen++;
    return k;
}

static void pending_remove(tcp_tp *tp, conn *k)
{
    for (conn **pp = &tp->pending; *pp != NULL; pp = &(*pp)->next) {
        if (*pp == k) {
            *pp = k->next;
            k->next = NULL;
            return;
        }
    }
}

static void tune_socket(conn *k)
{
    int sz = k->tp->cfg->sockbuf_bytes;

    uv_tcp_nodelay(&k->h, 1);
    /* A refusal (a capped system) only costs speed, so it is not an
     * error. 0 leaves the buffers to the kernel's autotuning. */
    if (sz > 0) {
        uv_send_buffer_size((uv_handle_t *)&k->h, &sz);
        sz = k->tp->cfg->sockbuf_bytes;
        uv_recv_buffer_size((uv_handle_t *)&k->h, &sz);
    }
}

/* ---- the data path ---- */

static void slot_lost(conn *k, const char *why);
static void data_alloc_cb(uv_handle_t *h, size_t suggested, uv_buf_t *buf);
static void data_read_cb(uv_stream_t *s, ssize_t nread, const uv_buf_t *buf);

static void rx_fail(conn *k)
{
    tcp_tp *tp = k->tp;

    if (tp->err == 0)
        tp->lost_peer = k->peer;
    if (k->rx_end == UV_EOF)
        tcp_fail(tp, WEFT_EPEER,
                 "rank %d: peer %d closed wire %d (%s) while this rank was "
                 "receiving",
                 tp->rank, k->peer, k->wire, k->name);
    else
        tcp_fail(tp, conn_err_code(k->rx_end),
                 "rank %d: receive from peer %d on wire %d (%s) failed: %s",
                 tp->rank, k->peer, k->wire, k->name, uv_strerror(k->rx_end));
}

/* A send to a peer whose end of the wire has closed (or reset): it can
 * never be received. */
static void tx_closed(conn *k)
{
    tcp_tp *tp = k->tp;

    if (tp->err == 0)
        tp->lost_peer = k->peer;
    tcp_fail(tp, WEFT_EPEER,
             "rank %d: peer %d %s wire %d (%s) before this rank sent to it",
             tp->rank, k->peer, k->rx_end == UV_EOF ? "closed" : "reset",
             k->wire, k->name);
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
    if (k->rq_head != NULL && k->rx_lo == k->rx_hi && k->rx_end != 0)
        rx_fail(k);
    /* Reading stopped on a full read-ahead: there is room again. */
    if (!k->reading && k->rx_end == 0 && k->rx_hi < RX_CAP && !k->closing &&
        tp->err == 0) {
        int rc = uv_read_start((uv_stream_t *)&k->h, data_alloc_cb,
                               data_read_cb);
        if (rc != 0)
            tcp_fail(tp, WEFT_ETRANSPORT,
                     "rank %d: cannot read from peer %d wire %d: %s",
                     tp->rank, k->peer, k->wire, uv_strerror(rc));
        else
            k->reading = 1;
    }
}

static void data_alloc_cb(uv_handle_t *h, size_t suggested, uv_buf_t *buf)
{
    conn *k = h->data;
    weft__xfer *x = k->rq_head;

    (void)suggested;
    if (k->rxb == NULL && (k->rxb = malloc(RX_CAP)) == NULL) {
        /* libuv then reports UV_ENOBUFS to data_read_cb. */
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
        weft__xfer *y = x->tp_next;
        for (; y != NULL && y->len < RX_DIRECT_MIN; y = y->tp_next)
            want += y->len;
        if (y != NULL && k->rx_hi - k->rx_lo < want &&
            want - (k->rx_hi - k->rx_lo) < buf->len)
            buf->len = want - (k->rx_hi - k->rx_lo);
    }
}

static void data_read_cb(uv_stream_t *s, ssize_t nread, const uv_buf_t *buf)
{
    conn *k = s->data;
    tcp_tp *tp = k->tp;

    (void)buf;
    if (nread > 0) {
        tp->events++;
        if (k->rx_direct) {
            weft__xfer *x = k->rq_head;
            x->got += (size_t)nread;
            if (x->got == x->len)
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
        tcp_fail(tp, WEFT_ENOMEM,
                 "rank %d: no memory for the read-ahead of wire %d to peer "
                 "%d",
                 tp->rank, k->wire, k->peer);
        return;
    }
    /* Noted, not yet a failure: the bytes the peer sent before it left
     * are handed over first (rx_drain), and the close counts once a
     * receive wants more or a send is posted to it. */
    k->rx_end = (int)nread;
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

static void data_write_cb(uv_write_t *req, int status)
{
    wreq *w = (wreq *)req;
    conn *k = req->handle->data;
    tcp_tp *tp = k->tp;

    write_done(tp);
    if (tp->shut || status < 0) {
        w->next = tp->free_wreqs;
        tp->free_wreqs = w;
    }
    if (tp->shut)
        return;
    if (status < 0) {
        tcp_fail(tp, conn_err_code(status),
                 "rank %d: send to peer %d on wire %d (%s) failed: %s",
                 tp->rank, k->peer, k->wire, k->name, uv_strerror(status));
        return;
    }
    complete_batch(tp, w);
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
        if (x == NULL || k->closing)
            continue;
        if (k->rx_end != 0) {
            tx_closed(k);
            return;
        }
        r = tp->free_wreqs;
        if (r != NULL)
            tp->free_wreqs = r->next;
        else if ((r = malloc(sizeof *r)) == NULL) {
            tcp_fail(tp, WEFT_ENOMEM, "rank %d: out of memory", tp->rank);
            return;
        }
        r->first = x;
        for (weft__xfer *y = x; y != NULL && n < BATCH_MAX; y = y->tp_next)
            bufs[n++] = uv_buf_init(y->buf, (unsigned int)y->len);
        r->n = n;
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
            rc = tcp_write(tp, &r->req, (uv_stream_t *)&k->h, bufs + skip,
                           (unsigned int)(n - skip), data_write_cb);
        }
        if (rc != 0) {
            r->next = tp->free_wreqs;
            tp->free_wreqs = r;
            tcp_fail(tp, conn_err_code(rc),
                     "rank %d: send to peer %d on wire %d (%s) failed: %s",
                     tp->rank, k->peer, k->wire, k->name, uv_strerror(rc));
            return;
        }
    }
}

static conn *wire_conn(tcp_tp *tp, int p, int w)
{
    if (p < 0 || p >= tp->nranks || w < 0 || w >= tp->peers[p].nwires)
        return NULL;
    return tp->peers[p].s[w].c;
}

/* Appends x to a connection's queue of frames (sends or receives). */
/* The connection a frame is posted on, or the error that refuses it. */
static int post_target(tcp_tp *tp, int p, int w, conn **out)
{
    conn *k = wire_conn(tp, p, w);

    if (tp->err != 0)
        return tp->err;
    if (k == NULL || k->closing)
        return weft__fail(tp->sink, WEFT_ETRANSPORT,
                          "rank %d: no wire %d to peer %d", tp->rank, w, p);
    *out = k;
    return WEFT_OK;
}

static int tcp_post_send(weft__tp *t, int p, int w, weft__xfer *x)
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

static int tcp_post_recv(weft__tp *t, int p, int w, weft__xfer *x)
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
    if (!k->reading && k->rx_end == 0) {
        rc = uv_read_start((uv_stream_t *)&k->h, data_alloc_cb, data_read_cb);
        if (rc != 0) {
            tcp_fail(tp, WEFT_ETRANSPORT,
                     "rank %d: cannot read from peer %d wire %d: %s",
                     tp->rank, p, w, uv_strerror(rc));
            return tp->err;
        }
        k->reading = 1;
    }
    return WEFT_OK;
}

/* ---- handshake ---- */

static void housekeep_cb(uv_timer_t *t);
static void conn_up(conn *k);

static void housekeep_start(tcp_tp *tp)
{
    if (!uv_is_active((uv_handle_t *)&tp->housekeep) && !tp->shut)
        uv_timer_start(&tp->housekeep, housekeep_cb, RETRY_MS, RETRY_MS);
}

/* An outgoing connection in set-up broke (why): it is closed and tried
 * again after RETRY_MS, until the connect deadline. */
static void retry_later(conn *k, const char *why)
{
    tcp_tp *tp = k->tp;
    slot *s = &tp->peers[k->peer].s[k->wire];

    weft__log(WEFT__LOG_DEBUG, tp->rank,
              "wire %d to peer %d (%s): %s; trying again", k->wire, k->peer,
              k->name, why);
    s->trying = NULL; /* k: only a connection in set-up is tried again */
    s->next_try_ms = weft__now_ms() + RETRY_MS;
    conn_close(k);
    housekeep_start(tp);
}

/* An accepted connection lost before it was up (the peer gave the attempt
 * up): the slot it claimed is free again, for the peer's next attempt. */
static void slot_lost(conn *k, const char *why)
{
    tcp_tp *tp = k->tp;
    slot *s = &tp->peers[k->peer].s[k->wire];

    weft__log(WEFT__LOG_DEBUG, tp->rank,
              "wire %d from peer %d (%s) went away during set-up: %s",
              k->wire, k->peer, k->name, why);
    if (s->c == k)
        s->c = NULL;
    conn_close(k);
}

static int token_equal(const uint8_t *a, const uint8_t *b)
{
    uint8_t d = 0;
    for (int i = 0; i < WEFT__TOKEN_BYTES; i++)
        d |= (uint8_t)(a[i] ^ b[i]);
    return d == 0;
}

/* Hello layout (network byte order): magic, version, from rank, to rank,
 * link, wire on link, then the 16-byte token. */
static void hello_pack(tcp_tp *tp, uint8_t *out, int to, const slot *s)
{
    weft__put_be32(out, HELLO_MAGIC);
    weft__put_be32(out + 4, HELLO_VERSION);
    weft__put_be32(out + 8, (uint32_t)tp->rank);
    weft__put_be32(out + 12, (uint32_t)to);
    weft__put_be32(out + 16, s->link);
    weft__put_be32(out + 20, s->lwire);
    memcpy(out + 24, tp->cfg->token, WEFT__TOKEN_BYTES);
}

static void reject(conn *k, const char *why)
{
    tcp_tp *tp = k->tp;

    weft__log(WEFT__LOG_WARN, tp->rank,
              "rejected a connection from %s: %s (the job goes on)", k->name,
              why);
    pending_remove(tp, k);
    conn_close(k);
}

static void hs_alloc_cb(uv_handle_t *h, size_t suggested, uv_buf_t *buf)
{
    conn *k = h->data;
    size_t want = k->state == CONN_HELLO_WAIT  ? HELLO_BYTES
                  : k->state == CONN_ACK_WAIT ? ACK_BYTES
                                              : REPLY_BYTES;

    (void)suggested;
    /* Exactly the handshake: bytes after it belong to the data path. */
    buf->base = (char *)k->hbuf + k->hgot;
    buf->len = want - k->hgot;
}

static void reply_write_cb(uv_write_t *req, int status)
{
    conn *k = req->data;
    tcp_tp *tp = k->tp;

    write_done(tp);
    if (k->closing || tp->shut)
        return;
    if (status < 0 && k->state == CONN_ACK_WAIT)
        /* The peer gave the attempt up: it tries again. */
        slot_lost(k, uv_strerror(status));
}

/* An accepted connection's hello is complete: check and place it. */
static void hello_done(conn *k)
{
    tcp_tp *tp = k->tp;
    uint32_t from = weft__get_be32(k->hbuf + 8);
    uint32_t to = weft__get_be32(k->hbuf + 12);
    uint32_t link = weft__get_be32(k->hbuf + 16);
    uint32_t lwire = weft__get_be32(k->hbuf + 20);
    uv_buf_t b;
    slot *s = NULL;

    if (weft__get_be32(k->hbuf) != HELLO_MAGIC)
        return reject(k, "not a weft hello (bad magic)");
    if (weft__get_be32(k->hbuf + 4) != HELLO_VERSION)
        return reject(k, "unsupported protocol version");
    if (!token_equal(k->hbuf + 24, tp->cfg->token))
        return reject(k, "wrong job token (WEFT_JOB_TOKEN)");
    if (to != (uint32_t)tp->rank || from >= (uint32_t)tp->nranks ||
        from <= (uint32_t)tp->rank)
        return reject(k, "hello names ranks that do not connect here");
    for (int w = 0; w < tp->peers[from].nslots; w++) {
        slot *c = &tp->peers[from].s[w];
        if (!c->outgoing && c->link == link && c->lwire == lwire)
            s = c;
    }
    if (s == NULL)
        return reject(k, "hello names a link or wire this rank does not have");
    if (s->c != NULL)
        return reject(k, "hello names a wire that is already connected");
    pending_remove(tp, k);
    k->peer = (int)from;
    k->wire = (int)(s - tp->peers[from].s);
    s->c = k;
    /* Read on: the acknowledgement comes next, HANDSHAKE_MS at most. */
    k->state = CONN_ACK_WAIT;
    k->hgot = 0;
    k->deadline_ms = weft__now_ms() + HANDSHAKE_MS;
    tune_socket(k);
    weft__put_be32(k->out, REPLY_MAGIC);
    weft__put_be32(k->out + 4, (uint32_t)tp->rank);
    b = uv_buf_init((char *)k->out, REPLY_BYTES);
    k->hreq.data = k;
    if (tcp_write(tp, &k->hreq, (uv_stream_t *)&k->h, &b, 1,
                  reply_write_cb) != 0)
        slot_lost(k, "cannot answer its hello");
}

static void ack_write_cb(uv_write_t *req, int status)
{
    conn *k = req->data;

    /* A failure shows on the wire's reads (the peer closed or reset). */
    (void)status;
    write_done(k->tp);
}

static void hs_read_cb(uv_stream_t *st, ssize_t nread, const uv_buf_t *buf)
{
    conn *k = st->data;
    tcp_tp *tp = k->tp;
    uv_buf_t b;

    (void)buf;
    if (nread == 0)
        return;
    if (nread < 0) {
        if (k->state == CONN_HELLO_WAIT)
            return reject(k, nread == UV_EOF ? "closed before its hello"
                                             : uv_strerror((int)nread));
        if (k->state == CONN_ACK_WAIT)
            return slot_lost(k, nread == UV_EOF
                                    ? "closed before it acknowledged"
                                    : uv_strerror((int)nread));
        /* Closed or reset before it answered: the listener may be the
         * peer's previous communicator, which rejects us or is going
         * away. Its next one will answer. */
        retry_later(k, nread == UV_EOF ? "closed before it answered"
                                       : uv_strerror((int)nread));
        return;
    }
    k->hgot += (size_t)nread;
    if (k->state == CONN_HELLO_WAIT) {
        /* Reject garbage as soon as its first word shows it. */
        if (k->hgot >= 4 && weft__get_be32(k->hbuf) != HELLO_MAGIC)
            return reject(k, "not a weft hello (bad magic)");
        if (k->hgot == HELLO_BYTES)
            hello_done(k);
        return;
    }
    if (k->state == CONN_ACK_WAIT) {
        if (k->hgot < ACK_BYTES)
            return;
        uv_read_stop(st);
        if (weft__get_be32(k->hbuf) != ACK_MAGIC)
            return slot_lost(k, "not a weft acknowledgement");
        k->state = CONN_UP;
        conn_up(k);
        return;
    }
    if (k->hgot == REPLY_BYTES) {
        uv_read_stop(st);
        if (weft__get_be32(k->hbuf) != REPLY_MAGIC ||
            weft__get_be32(k->hbuf + 4) != (uint32_t)k->peer) {
            tcp_fail(tp, WEFT_EAUTH,
                     "rank %d: %s answered wire %d's hello wrongly: not rank "
                     "%d of this job",
                     tp->rank, k->name, k->wire, k->peer);
            return;
        }
        /* Up on this side from here: the acknowledgement goes before any
         * data, and a close from now on is the peer leaving. */
        weft__put_be32(k->ack, ACK_MAGIC);
        b = uv_buf_init((char *)k->ack, ACK_BYTES);
        k->areq.data = k;
        if (tcp_write(tp, &k->areq, st, &b, 1, ack_write_cb) != 0) {
            retry_later(k, "cannot acknowledge the answer");
            return;
        }
        k->state = CONN_UP;
        tp->peers[k->peer].s[k->wire].c = k;
        tp->peers[k->peer].s[k->wire].trying = NULL;
        conn_up(k);
    }
}

static void on_connection(uv_stream_t *server, int status)
{
    tcp_tp *tp = server->data;
    struct sockaddr_storage ss;
    int len = sizeof ss;
    conn *k;

    if (status < 0 || tp->shut)
        return;
    k = conn_new(tp);
    if (k == NULL)
        return;
    if (uv_accept(server, (uv_stream_t *)&k->h) != 0) {
        conn_close(k);
        return;
    }
    strcpy(k->name, "?");
    if (uv_tcp_getpeername(&k->h, (struct sockaddr *)&ss, &len) == 0 &&
        ss.ss_family == AF_INET) {
        struct sockaddr_in *sin = (struct sockaddr_in *)&ss;
        char ip[INET_ADDRSTRLEN];
        uv_ip4_name(sin, ip, sizeof ip);
        snprintf(k->name, sizeof k->name, "%s:%d", ip, ntohs(sin->sin_port));
    }
    k->state = CONN_HELLO_WAIT;
    k->deadline_ms = weft__now_ms() + HANDSHAKE_MS;
    k->next = tp->pending;
    tp->pending = k;
    uv_read_start((uv_stream_t *)&k->h, hs_alloc_cb, hs_read_cb);
    housekeep_start(tp);
}

static void hello_write_cb(uv_write_t *req, int status)
{
    conn *k = req->data;

    write_done(k->tp);
    if (status < 0 && !k->closing && !k->tp->shut &&
        k->state == CONN_REPLY_WAIT)
        retry_later(k, uv_strerror(status));
}

static void connect_cb(uv_connect_t *req, int status)
{
    conn *k = req->data;
    tcp_tp *tp = k->tp;
    slot *s = &tp->peers[k->peer].s[k->wire];
    uv_buf_t b;

    if (k->closing || tp->shut)
        return;
    if (status < 0) {
        /* The peer may not listen yet: try again until the deadline. */
        retry_later(k, uv_strerror(status));
        return;
    }
    tune_socket(k);
    hello_pack(tp, k->out, k->peer, s);
    b = uv_buf_init((char *)k->out, HELLO_BYTES);
    k->hreq.data = k;
    k->state = CONN_REPLY_WAIT;
    k->deadline_ms = weft__now_ms() + HANDSHAKE_MS;
    if (tcp_write(tp, &k->hreq, (uv_stream_t *)&k->h, &b, 1,
                  hello_write_cb) != 0 ||
        uv_read_start((uv_stream_t *)&k->h, hs_alloc_cb, hs_read_cb) != 0)
        retry_later(k, "cannot send the hello");
}

static void start_connect(tcp_tp *tp, int p, int w)
{
    slot *s = &tp->peers[p].s[w];
    struct sockaddr_in sa;
    conn *k;

    if (uv_ip4_addr(s->addr, s->port, &sa) != 0) {
        tcp_fail(tp, WEFT_ECONFIG, "rank %d: bad address %s for peer %d",
                 tp->rank, s->addr, p);
        return;
    }
    k = conn_new(tp);
    if (k == NULL) {
        tcp_fail(tp, WEFT_ENOMEM, "rank %d: out of memory", tp->rank);
        return;
    }
    k->peer = p;
    k->wire = w;
    k->state = CONN_CONNECTING;
    snprintf(k->name, sizeof k->name, "%s:%d", s->addr, s->port);
    k->creq.data = k;
    s->trying = k;
    if (uv_tcp_connect(&k->creq, &k->h, (struct sockaddr *)&sa, connect_cb) !=
        0)
        retry_later(k, "cannot start connecting");
}

static void housekeep_cb(uv_timer_t *t)
{
    tcp_tp *tp = t->data;
    uint64_t now = weft__now_ms();
    conn *k, *next;
    int busy = 0;

    if (tp->shut) {
        uv_timer_stop(t);
        return;
    }

    for (k = tp->pending; k != NULL; k = next) {
        next = k->next;
        if (now >= k->deadline_ms)
            reject(k, "no hello within the handshake deadline");
    }
    for (int p = 0; p < tp->nranks; p++) {
        for (int w = 0; w < tp->peers[p].nslots; w++) {
            slot *s = &tp->peers[p].s[w];
            if (!s->outgoing && s->c != NULL && s->c->state == CONN_ACK_WAIT) {
                busy = 1;
                if (now >= s->c->deadline_ms)
                    slot_lost(s->c, "no acknowledgement of the answer");
                continue;
            }
            if (!s->outgoing || s->c != NULL)
                continue;
            busy = 1;
            /* A listener that holds the hello without answering (the
             * peer's previous communicator, with the connection in its
             * backlog) is given HANDSHAKE_MS. */
            if (s->trying != NULL && s->trying->state == CONN_REPLY_WAIT &&
                now >= s->trying->deadline_ms)
                retry_later(s->trying, "no answer to its hello");
            if (s->trying == NULL && now >= s->next_try_ms && tp->err == 0)
                start_connect(tp, p, w);
        }
    }
    if (!busy && tp->pending == NULL)
        uv_timer_stop(t);
}

/* ---- relaying ----
 *
 * Ranks whose hosts share no cable exchange point-to-point messages through
 * the ranks between them on the ring. Each rank keeps one connection to
 * each ring neighbour for this alone (data wires carry only their own
 * operations' bytes, in order), and reads it whenever it runs progress():
 * a chunk for this rank is handed to the posted relay receive from its
 * source (or kept until one is posted); any other chunk goes on, unchanged,
 * in the direction it was travelling. A message is cut into chunks of
 * RELAY_CHUNK bytes, each with a header (magic, source, destination, chunk
 * length, message length); chunks from one source follow one path, so
 * they arrive in order. Relaying progresses while the ranks in between are
 * inside weft calls, like any MPI without a progress thread.
 */

static int relay_dir(const conn *k)
{
    tcp_tp *tp = k->tp;
    return tp->relay[1] != NULL && tp->relay[1]->c == k ? 1 : 0;
}

static void relay_write_cb(uv_write_t *req, int status)
{
    rwreq *w = (rwreq *)req;
    conn *k = req->handle->data;
    tcp_tp *tp = k->tp;
    weft__xfer *x = w->x;

    write_done(tp);
    free(w->owned);
    free(w);
    if (tp->shut)
        return;
    if (status < 0) {
        if (x != NULL)
            tcp_fail(tp, WEFT_EPEER,
                     "rank %d: relaying to rank %d through neighbour %d "
                     "failed: %s",
                     tp->rank, x->peer, k->peer, uv_strerror(status));
        else
            weft__log(WEFT__LOG_WARN, tp->rank,
                      "a chunk relayed through neighbour %d was lost: %s",
                      k->peer, uv_strerror(status));
        return;
    }
    if (x != NULL && --x->got == 0) {
        tp->events++;
        x->done(x);
    }
}

/* Writes one chunk on the relay connection in direction dir. */
static int relay_write(tcp_tp *tp, int dir, uint32_t src, uint32_t dst,
                       const char *data, uint32_t len, uint64_t total,
                       char *owned, weft__xfer *x)
{
    slot *s = tp->relay[dir];
    conn *k = s != NULL ? s->c : NULL;
    rwreq *w;
    uv_buf_t b[2];
    int rc;

    if (k == NULL || k->closing || k->rx_end != 0) {
        free(owned);
        return WEFT_EPEER;
    }
    w = calloc(1, sizeof *w);
    if (w == NULL) {
        free(owned);
        return WEFT_ENOMEM;
    }
    weft__put_be32(w->hdr, RELAY_MAGIC);
    weft__put_be32(w->hdr + 4, src);
    weft__put_be32(w->hdr + 8, dst);
    weft__put_be32(w->hdr + 12, len);
    weft__put_be64(w->hdr + 16, total);
    w->owned = owned;
    w->x = x;
    b[0] = uv_buf_init((char *)w->hdr, RELAY_HDR);
    b[1] = uv_buf_init((char *)data, len);
    rc = tcp_write(tp, &w->req, (uv_stream_t *)&k->h, b, 2, relay_write_cb);
    if (rc != 0) {
        free(w->owned);
        free(w);
        return WEFT_EPEER;
    }
    return WEFT_OK;
}

/* Hands chunk c (for this rank) to the first posted receive from its
 * source; returns 1 if it was taken (and freed). */
static int relay_deliver(tcp_tp *tp, rchunk *c)
{
    weft__xfer **pp = &tp->rrecv, *x;

    while (*pp != NULL && (*pp)->peer != (int)c->src)
        pp = (weft__xfer **)&(*pp)->tp_next;
    x = *pp;
    if (x == NULL)
        return 0;
    if (c->total != x->len || x->got + c->len > x->len) {
        tcp_fail(tp, WEFT_EMISMATCH,
                 "rank %d: recv of %zu bytes from rank %u met a message of "
                 "%llu bytes",
                 tp->rank, x->len, c->src, (unsigned long long)c->total);
        free(c->data);
        free(c);
        return 1;
    }
    memcpy(x->buf + x->got, c->data, c->len);
    x->got += c->len;
    free(c->data);
    free(c);
    if (x->got == x->len) {
        *pp = x->tp_next;
        x->tp_next = NULL;
        tp->events++;
        x->done(x);
    }
    return 1;
}

/* Writes the chunks passing through (relay_chunk), in order. */
static void relay_forward(tcp_tp *tp)
{
    while (tp->fwd_head != NULL) {
        rchunk *c = tp->fwd_head;
        int rc;

        tp->fwd_head = c->next;
        if (tp->fwd_head == NULL)
            tp->fwd_tail = NULL;
        rc = relay_write(tp, c->dir, c->src, c->dst, c->data, c->len,
                         c->total, c->data, NULL);
        if (rc != 0)
            weft__log(WEFT__LOG_WARN, tp->rank,
                      "cannot relay a chunk from rank %u to rank %u: %s",
                      c->src, c->dst, weft_err_name(rc));
        free(c);
    }
}

/* Matches chunks kept for later against the posted receives. */
static void relay_drain(tcp_tp *tp)
{
    rchunk **pp = &tp->rpending;

    tp->relay_ready = 0;
    while (*pp != NULL && tp->err == 0) {
        rchunk *c = *pp;
        *pp = c->next;
        if (!relay_deliver(tp, c)) {
            /* Not taken: put it back where it was. */
            c->next = *pp;
            *pp = c;
            pp = &c->next;
        }
    }
}

static void relay_chunk(conn *k, rchunk *c)
{
    tcp_tp *tp = k->tp;
    rchunk **pp;

    if (c->dst != (uint32_t)tp->rank) {
        /* Passing through: on in the direction it was going, written by
         * relay_forward once this turn of the loop is over. */
        c->dir = 1 - relay_dir(k);
        c->next = NULL;
        if (tp->fwd_tail != NULL)
            tp->fwd_tail->next = c;
        else
            tp->fwd_head = c;
        tp->fwd_tail = c;
        tp->events++;
        return;
    }
    if (relay_deliver(tp, c))
        return;
    for (pp = &tp->rpending; *pp != NULL; pp = &(*pp)->next)
        ;
    c->next = NULL;
    *pp = c;
}

static void relay_alloc_cb(uv_handle_t *h, size_t suggested, uv_buf_t *buf)
{
    conn *k = h->data;

    (void)suggested;
    if (k->rhgot < RELAY_HDR) {
        buf->base = (char *)k->rhdr + k->rhgot;
        buf->len = RELAY_HDR - k->rhgot;
    } else {
        buf->base = k->rdata + k->rdgot;
        buf->len = k->rdlen - k->rdgot;
    }
}

static void relay_read_cb(uv_stream_t *st, ssize_t nread, const uv_buf_t *buf)
{
    conn *k = st->data;
    tcp_tp *tp = k->tp;

    (void)buf;
    if (nread == 0)
        return;
    if (nread < 0) {
        uv_read_stop(st);
        k->rx_end = (int)nread;
        if (tp->rrecv != NULL)
            tcp_fail(tp, WEFT_EPEER,
                     "rank %d: neighbour %d closed the relay connection "
                     "while a relayed message was awaited",
                     tp->rank, k->peer);
        return;
    }
    tp->events++;
    if (k->rhgot < RELAY_HDR) {
        uint32_t len;
        k->rhgot += (size_t)nread;
        if (k->rhgot < RELAY_HDR)
            return;
        len = weft__get_be32(k->rhdr + 12);
        if (weft__get_be32(k->rhdr) != RELAY_MAGIC || len == 0 ||
            len > RELAY_CHUNK) {
            uv_read_stop(st);
            k->rx_end = UV_EPROTO;
            tcp_fail(tp, WEFT_ETRANSPORT,
                     "rank %d: garbled relay chunk from neighbour %d",
                     tp->rank, k->peer);
            return;
        }
        k->rdlen = len;
        k->rdgot = 0;
        k->rdata = malloc(len);
        if (k->rdata == NULL) {
            uv_read_stop(st);
            tcp_fail(tp, WEFT_ENOMEM, "rank %d: out of memory", tp->rank);
        }
        return;
    }
    k->rdgot += (size_t)nread;
    if (k->rdgot == k->rdlen) {
        rchunk *c = calloc(1, sizeof *c);
        if (c == NULL) {
            tcp_fail(tp, WEFT_ENOMEM, "rank %d: out of memory", tp->rank);
            return;
        }
        c->src = weft__get_be32(k->rhdr + 4);
        c->dst = weft__get_be32(k->rhdr + 8);
        c->len = (uint32_t)k->rdlen;
        c->total = weft__get_be64(k->rhdr + 16);
        c->data = k->rdata;
        k->rdata = NULL;
        k->rhgot = 0;
        relay_chunk(k, c);
    }
}

/* A connection came up: it reads from now on, for good (a data wire
 * into its read-ahead while no receive is posted), so that the peer's
 * close is seen at once. */
static void conn_up(conn *k)
{
    tcp_tp *tp = k->tp;
    int relay = tp->peers[k->peer].s[k->wire].relay;
    int rc;

    if (relay)
        rc = uv_read_start((uv_stream_t *)&k->h, relay_alloc_cb,
                           relay_read_cb);
    else
        rc = uv_read_start((uv_stream_t *)&k->h, data_alloc_cb, data_read_cb);
    if (rc != 0) {
        tcp_fail(tp, WEFT_ETRANSPORT,
                 "rank %d: cannot read the %s connection to %d: %s",
                 tp->rank, relay ? "relay" : "data", k->peer, uv_strerror(rc));
        return;
    }
    k->reading = !relay;
}

static int tcp_relay_send(weft__tp *t, int to, weft__xfer *x)
{
    tcp_tp *tp = (tcp_tp *)t;
    int n = tp->nranks;
    int right_hops = (to - tp->rank + n) % n;
    int dir = right_hops <= n - right_hops ? 1 : 0;
    size_t nchunks = (x->len + RELAY_CHUNK - 1) / RELAY_CHUNK;

    if (tp->err != 0)
        return tp->err;
    if (tp->relay[0] == NULL)
        return weft__fail(tp->sink, WEFT_ENOTSUP,
                          "rank %d: no wires to rank %d, and no relay",
                          tp->rank, to);
    x->peer = to;
    x->got = nchunks; /* writes still to complete */
    for (size_t i = 0; i < nchunks; i++) {
        size_t off = i * RELAY_CHUNK;
        size_t len = x->len - off < RELAY_CHUNK ? x->len - off : RELAY_CHUNK;
        int rc = relay_write(tp, dir, (uint32_t)tp->rank, (uint32_t)to,
                             x->buf + off, (uint32_t)len, x->len, NULL, x);
        if (rc != 0) {
            tcp_fail(tp, rc,
                     "rank %d: cannot relay to rank %d: the relay connection "
                     "to neighbour %d is down",
                     tp->rank, to, tp->relay[dir]->c ? tp->relay[dir]->c->peer
                                                       : -1);
            return tp->err;
        }
    }
    return WEFT_OK;
}

static int tcp_relay_recv(weft__tp *t, int from, weft__xfer *x)
{
    tcp_tp *tp = (tcp_tp *)t;
    weft__xfer **pp = &tp->rrecv;

    if (tp->err != 0)
        return tp->err;
    if (tp->relay[0] == NULL)
        return weft__fail(tp->sink, WEFT_ENOTSUP,
                          "rank %d: no wires to rank %d, and no relay",
                          tp->rank, from);
    x->peer = from;
    x->got = 0;
    x->tp_next = NULL;
    while (*pp != NULL)
        pp = (weft__xfer **)&(*pp)->tp_next;
    *pp = x;
    /* Chunks may be waiting already: progress() hands them over. */
    tp->relay_ready = 1;
    return WEFT_OK;
}

/* ---- set-up and tear-down ---- */

static void timer_cb(uv_timer_t *t)
{
    (void)t; /* waking uv_run is all it is for */
}

static void async_cb(uv_async_t *a)
{
    ((tcp_tp *)a->data)->events++;
}

static int all_up(tcp_tp *tp)
{
    for (int p = 0; p < tp->nranks; p++)
        for (int w = 0; w < tp->peers[p].nslots; w++) {
            conn *k = tp->peers[p].s[w].c;
            if (k == NULL || k->state != CONN_UP)
                return 0;
        }
    return 1;
}

/* Decides the wires to every peer from the hostfile: ranks on one host
 * talk over loopback; ranks on different hosts over every link joining
 * their hosts, `wires` connections on each, ordered by link index so both
 * ends agree. */
static int hosts_linked(const weft__config *cfg, int ha, int hb)
{
    if (ha == hb)
        return 1;
    for (int l = 0; l < cfg->nlinks; l++) {
        const weft__link *lk = &cfg->links[l];
        if (weft__link_joins(lk, ha, hb))
            return 1;
    }
    return 0;
}

/* A job relays when some pair of ranks has no wires of its own: then each
 * rank keeps one more connection to each ring neighbour, for relayed
 * point-to-point traffic only. Every rank decides the same from the
 * hostfile. */
static int job_relays(const weft__config *cfg)
{
    if (cfg->nranks < 3)
        return 0;
    for (int a = 0; a < cfg->nhosts; a++)
        for (int b = a + 1; b < cfg->nhosts; b++)
            if (!hosts_linked(cfg, a, b))
                return 1;
    return 0;
}

static int plan_slots(tcp_tp *tp, int W)
{
    const weft__config *cfg = tp->cfg;
    int relays = job_relays(cfg);
    int right = (tp->rank + 1) % tp->nranks;
    int left = (tp->rank + tp->nranks - 1) % tp->nranks;

    tp->peers = calloc((size_t)tp->nranks, sizeof *tp->peers);
    if (tp->peers == NULL)
        return WEFT_ENOMEM;
    for (int p = 0; p < tp->nranks; p++) {
        int hp = cfg->rank_host[p], hm = cfg->rank_host[tp->rank], n = 0;
        int lo = p < tp->rank ? p : tp->rank; /* the rank that listens */

        if (p == tp->rank)
            continue;
        if (hp == hm)
            n = W;
        else
            for (int l = 0; l < cfg->nlinks; l++) {
                const weft__link *lk = &cfg->links[l];
                if (weft__link_joins(lk, hp, hm))
                    n += W;
            }
        if (n == 0)
            continue;
        if (n > WEFT__MAX_WIRES)
            return weft__fail(tp->sink, WEFT_ECONFIG,
                              "rank %d: %d wires to peer %d, more than %d",
                              tp->rank, n, p, WEFT__MAX_WIRES);
        tp->peers[p].s = calloc((size_t)n + 1, sizeof(slot));
        if (tp->peers[p].s == NULL)
            return WEFT_ENOMEM;
        tp->peers[p].nwires = n;
        tp->peers[p].nslots = n;
        n = 0;
        if (hp == hm) {
            for (int w = 0; w < W; w++, n++) {
                slot *s = &tp->peers[p].s[n];
                s->link = WEFT__LINK_LOOPBACK;
                s->lwire = (uint32_t)w;
                strcpy(s->addr, "127.0.0.1");
            }
        } else {
            for (int l = 0; l < cfg->nlinks; l++) {
                const weft__link *lk = &cfg->links[l];
                int lo_end;
                if (!weft__link_joins(lk, hp, hm))
                    continue;
                lo_end = lk->end[0].host == cfg->rank_host[lo] ? 0 : 1;
                for (int w = 0; w < W; w++, n++) {
                    slot *s = &tp->peers[p].s[n];
                    s->link = (uint32_t)l;
                    s->lwire = (uint32_t)w;
                    snprintf(s->addr, sizeof s->addr, "%s",
                             lk->end[lo_end].addr);
                }
            }
        }
        if (relays && (p == left || p == right)) {
            /* The relay connection runs on the neighbour's first wire's
             * path (link and address). */
            slot *s = &tp->peers[p].s[n];
            *s = tp->peers[p].s[0];
            s->link = LINK_RELAY;
            s->lwire = 0;
            s->relay = 1;
            tp->relay[p == right ? 1 : 0] = s;
            tp->peers[p].nslots = ++n;
        }
        for (int w = 0; w < n; w++) {
            slot *s = &tp->peers[p].s[w];
            s->outgoing = tp->rank > p;
            s->port = weft__config_rank_port(cfg, lo);
        }
    }
    return WEFT_OK;
}

/* Closes connections only (shutdown) or every handle (destroy). */
static void walk_close_conns(uv_handle_t *h, void *arg)
{
    tcp_tp *tp = arg;
    if (!uv_is_closing(h) && h->type == UV_TCP &&
        h != (uv_handle_t *)&tp->listener)
        conn_close(h->data);
}

static void walk_close_all(uv_handle_t *h, void *arg)
{
    walk_close_conns(h, arg);
    if (!uv_is_closing(h))
        uv_close(h, NULL);
}

/* Frees a list of relayed chunks and their bytes. */
static void rchunks_free(rchunk **head)
{
    while (*head != NULL) {
        rchunk *c = *head;
        *head = c->next;
        free(c->data);
        free(c);
    }
}

static void tcp_shutdown(weft__tp *t)
{
    tcp_tp *tp = (tcp_tp *)t;

    if (tp == NULL)
        return;
    tp->shut = 1;
    /* No more connect retries: the slots are emptied below, and a retry
     * would open new connections while we wait for these to close. */
    uv_timer_stop(&tp->housekeep);
    /* A failed communicator takes no more connections: the peer's next
     * communicator must not meet this one (it is refused and tries again
     * until this process binds the port anew). */
    if (tp->handles && !uv_is_closing((uv_handle_t *)&tp->listener))
        uv_close((uv_handle_t *)&tp->listener, NULL);
    for (int p = 0; p < tp->nranks && tp->peers != NULL; p++)
        for (int w = 0; w < tp->peers[p].nslots; w++) {
            conn *k = tp->peers[p].s[w].c;
            if (k != NULL) {
                k->rq_head = k->rq_tail = NULL;
                k->sq_head = k->sq_tail = NULL;
                conn_close(k);
            }
            tp->peers[p].s[w].c = NULL;
        }
    for (conn *k = tp->pending; k != NULL; k = k->next)
        conn_close(k);
    tp->pending = NULL;
    tp->dirty = NULL;
    tp->rx_dirty = NULL;
    tp->rrecv = NULL;
    rchunks_free(&tp->rpending);
    rchunks_free(&tp->fwd_head);
    tp->fwd_tail = NULL;
    /* Connections still connecting are not in any list: close them too. */
    uv_walk(&tp->loop, walk_close_conns, tp);
    /* Close callbacks (and cancelled writes) run in the next iteration; the
     * bound only guards against a bug turning this into a spin. */
    for (int i = 0; tp->nopen > 0 && i < 1000; i++)
        tcp_run(tp, UV_RUN_NOWAIT);
    if (tp->nopen > 0)
        weft__log(WEFT__LOG_ERROR, tp->rank,
                  "%d connections did not close at shutdown", tp->nopen);
}

static void tcp_destroy(weft__tp *t)
{
    tcp_tp *tp = (tcp_tp *)t;
    weft__sigpipe_state sp;

    if (tp == NULL)
        return;
    if (tp->handles) {
        weft__sigpipe_block(&sp);
        tcp_shutdown(t);
        uv_walk(&tp->loop, walk_close_all, tp);
        tcp_run(tp, UV_RUN_DEFAULT);
        if (uv_loop_close(&tp->loop) != 0)
            weft__log(WEFT__LOG_WARN, tp->rank,
                      "libuv loop still busy at close");
        weft__sigpipe_restore(&sp);
    }
    for (int p = 0; tp->peers != NULL && p < tp->nranks; p++)
        free(tp->peers[p].s);
    free(tp->peers);
    while (tp->free_wreqs != NULL) {
        wreq *w = tp->free_wreqs;
        tp->free_wreqs = w->next;
        free(w);
    }
    free(tp);
}

static int tcp_create_guarded(const weft__tp_params *p, weft__tp **out);

int weft__tcp_create_wires(const weft__tp_params *p, weft__tp **out)
{
    weft__sigpipe_state sp;
    int rc;

    weft__sigpipe_block(&sp);
    rc = tcp_create_guarded(p, out);
    weft__sigpipe_restore(&sp);
    return rc;
}

static int tcp_create_guarded(const weft__tp_params *par, weft__tp **out)
{
    const weft__config *cfg = par->cfg;
    weft__errsink *sink = par->sink;
    tcp_tp *tp = calloc(1, sizeof *tp);
    struct sockaddr_in sa;
    uint64_t deadline;
    int rc, port;

    *out = NULL;
    if (tp == NULL)
        return WEFT_ENOMEM;
    tp->cfg = cfg;
    tp->sink = sink;
    tp->lost_peer = -1;
    tp->rank = par->rank;
    tp->nranks = par->nranks;
    if ((rc = plan_slots(tp, par->wires)) != 0)
        goto fail;
    if (uv_loop_init(&tp->loop) != 0) {
        rc = weft__fail(sink, WEFT_ETRANSPORT, "cannot create a libuv loop");
        goto fail;
    }
    uv_timer_init(&tp->loop, &tp->timer);
    uv_timer_init(&tp->loop, &tp->housekeep);
    tp->housekeep.data = tp;
    uv_async_init(&tp->loop, &tp->async, async_cb);
    tp->async.data = tp;
    tp->spin_ns = (uint64_t)cfg->spin_us * 1000u;
    uv_tcp_init(&tp->loop, &tp->listener);
    tp->listener.data = tp;
    tp->handles = 1;

    if (tp->nranks > 1) {
        /* One host: loopback only, nothing reachable from outside. */
        port = weft__config_rank_port(cfg, tp->rank);
        uv_ip4_addr(cfg->nhosts == 1 ? "127.0.0.1" : "0.0.0.0", port, &sa);
        rc = uv_tcp_bind(&tp->listener, (struct sockaddr *)&sa, 0);
        if (rc == 0)
            rc = uv_listen((uv_stream_t *)&tp->listener, 128, on_connection);
        if (rc != 0) {
            rc = weft__fail(sink, WEFT_ETRANSPORT,
                            "rank %d: cannot listen on port %d: %s (is "
                            "another job using it? set \"port\" or "
                            "\"ports\" in %s)",
                            tp->rank, port, uv_strerror(rc),
                            cfg->hostfile[0] ? cfg->hostfile
                                             : "the hostfile");
            goto fail;
        }
    }
    /* weft_init's one deadline, whatever else set-up takes after this. */
    deadline = par->deadline_ms;
    uv_timer_start(&tp->housekeep, housekeep_cb, 0, RETRY_MS);
    while (!all_up(tp)) {
        if (tp->err != 0) {
            rc = tp->err;
            goto fail;
        }
        if (weft__now_ms() >= deadline) {
            char missing[256] = "";
            size_t len = 0;
            for (int p = 0; p < tp->nranks && len < sizeof missing - 16; p++)
                for (int w = 0; w < tp->peers[p].nslots; w++)
                    if (tp->peers[p].s[w].c == NULL ||
                        tp->peers[p].s[w].c->state != CONN_UP) {
                        len += (size_t)snprintf(missing + len,
                                                sizeof missing - len, " %d", p);
                        break;
                    }
            rc = weft__fail(sink, WEFT_ETIMEDOUT,
                            "rank %d: peers%s not connected within "
                            "WEFT_CONNECT_TIMEOUT_MS=%d ms",
                            tp->rank, missing, cfg->connect_timeout_ms);
            goto fail;
        }
        uv_timer_start(&tp->timer, timer_cb, deadline - weft__now_ms(), 0);
        tcp_run(tp, UV_RUN_ONCE);
    }
    uv_timer_stop(&tp->timer);
    *out = (weft__tp *)tp;
    return WEFT_OK;

fail:
    tcp_destroy((weft__tp *)tp);
    return rc;
}

static int tcp_nwires(weft__tp *t, int p)
{
    tcp_tp *tp = (tcp_tp *)t;
    return p >= 0 && p < tp->nranks ? tp->peers[p].nwires : 0;
}

/* What posts left for progress() to do: queued sends to write, read-ahead
 * for posted receives, relayed chunks for posted relay receives. */
static void tcp_handoff(tcp_tp *tp)
{
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
        relay_drain(tp);
    if (!tp->shut)
        relay_forward(tp);
}

static int tcp_progress(weft__tp *t, uint64_t deadline_ms)
{
    tcp_tp *tp = (tcp_tp *)t;
    unsigned ev = tp->events;
    uint64_t now;

    if (tp->probe) {
        /* A send waits to go to a wire nothing reads from: see first
         * whether its peer has closed (tcp_post_send). What this turn of
         * the loop completes counts as progress like any other (ev is not
         * taken again): the caller may be done now, and must look before
         * this call sleeps. */
        tp->probe = 0;
        tcp_run(tp, UV_RUN_NOWAIT);
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
    if (tp->spin_ns > 0) {
        uint64_t t0 = weft__now_ns();
        do {
            tcp_run(tp, UV_RUN_NOWAIT);
            if (tp->err != 0)
                return tp->err;
            if (tp->events != ev)
                return WEFT_OK;
            /* Oversubscribed, the peer we wait for may need this core. */
            sched_yield();
        } while (weft__now_ns() - t0 < tp->spin_ns);
    }
    now = weft__now_ms();
    if (now >= deadline_ms)
        return WEFT_ETIMEDOUT;
    uv_timer_start(&tp->timer, timer_cb, deadline_ms - now, 0);
    tcp_run(tp, UV_RUN_ONCE);
    if (tp->err != 0)
        return tp->err;
    return WEFT_OK;
}

static void tcp_wake(weft__tp *t)
{
    uv_async_send(&((tcp_tp *)t)->async);
}

/* ---- for transports built on this one (transport.h) ---- */

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
        tcp_run(tp, UV_RUN_NOWAIT);
    if (tp->err != 0)
        return tp->err;
    return tp->events != ev ? 1 : 0;
}

int weft__tcp_lost_peer(weft__tp *t)
{
    tcp_tp *tp = (tcp_tp *)t;
    return tp->err != 0 ? tp->lost_peer : -1;
}

int weft__tcp_fd(weft__tp *t)
{
    return uv_backend_fd(&((tcp_tp *)t)->loop);
}

int weft__tcp_timeout(weft__tp *t)
{
    return uv_backend_timeout(&((tcp_tp *)t)->loop);
}

const weft__tp_ops weft__tcp_ops = {
    .name = "tcp",
    .create = weft__tcp_create_wires,
    .destroy = tcp_destroy,
    .nwires = tcp_nwires,
    .post_send = tcp_post_send,
    .post_recv = tcp_post_recv,
    .progress = tcp_progress,
    .wake = tcp_wake,
    .shutdown = tcp_shutdown,
    .relay_send = tcp_relay_send,
    .relay_recv = tcp_relay_recv,
};
