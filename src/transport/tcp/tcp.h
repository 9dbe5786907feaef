/*
 * TCP transport on libuv: what the files of src/transport/tcp/ share (its
 * constants, connections, wire slots and the transport itself, and what one
 * file calls in another). Only they include this header: the engine sees
 * the transport through its ops table (weft__tcp_ops), the shared-memory
 * and ibverbs transports through the weft__tcp_* calls of boot.h.
 *
 * The files: loop.c (libuv under the SIGPIPE guard, failures, closing a
 * connection), data.c (posting, reading, writing, progress), handshake.c
 * (accepting, connecting, the hello and its retries), relay.c (messages
 * relayed around the ring), setup.c (which wires, listening, set-up and
 * tear-down, the ops table), tx.c (the sending thread), resume.c
 * (failover), splice.c (connections carried on for two other ranks: the
 * wires of a path through this rank's host).
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
 * failed stops taking connections at once but keeps its socket
 * (weft__port_keep): the peer's new one waits in its backlog until this
 * process's next communicator at that port takes the socket over (and
 * answers it), or this one is finalized (which resets it: tried again).
 *
 * Everything runs on the calling thread inside progress(), but for the
 * sending thread (tx.c, WEFT_SEND_THREAD): where it runs, a batch of at
 * least WEFT_SEND_THREAD_MIN_BYTES for one connection whose first frame
 * is of a pass that sends much (weft__xfer.bulk, which the engine sets
 * from WEFT_SEND_THREAD_PASS_BYTES), and every later batch of that
 * connection while one is with the thread, is handed to it,
 * written there with send(), and handed back; its completions run inside
 * progress() as ever. A connection's batches go to libuv or to the thread,
 * never to both at once, so they leave in order. weft_abort() and the
 * sending thread reach a blocked progress() through a uv_async_t.
 */

#ifndef WEFT_TRANSPORT_TCP_H
#define WEFT_TRANSPORT_TCP_H

#include "transport/common.h"
#include "transport/tcp/boot.h"
#include "transport/transport.h"

#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <uv.h>

#define HELLO_MAGIC 0x54464557u /* "WEFT" */
#define REPLY_MAGIC 0x4b4f4657u /* "WFOK" */
#define HELLO_VERSION 5u
/* A hello and an answer end with a verdict: 0, or the code of a failure
 * of weft_init that the sender tells its peers about, and why (TELL_WHY
 * bytes, a string). A connection that was up when its sender failed is
 * told with a notice instead (magic, code, why), then closed. */
#define TELL_WHY 200
#define HELLO_BYTES (48 + 4 + TELL_WHY + 12)
#define REPLY_BYTES (16 + 4 + TELL_WHY + 8)
/* After the verdict, a hello carries flags (HELLO_RESUME: it resumes the
 * wire it names, whose connection lost its link) and the dialling side's
 * read position on that wire; an answer the listening side's. */
#define HELLO_RESUME 1u
#define HELLO_MOVE 2u /* ... to move it back to its own link */
/* The listening end of the wire it names lost that wire's link first:
 * the dialling end pauses its end and resumes it (sent over another
 * link, then closed). */
#define HELLO_NUDGE 4u
#define HELLO_FLAGS_AT (48 + 4 + TELL_WHY)
#define REPLY_POS_AT (16 + 4 + TELL_WHY)
#define NOTICE_MAGIC 0x4c494657u /* "WFIL" */
#define NOTICE_BYTES (8 + TELL_WHY)
/* A rank whose weft_init failed tells every peer it can reach for this
 * long at most (or until the connect deadline), then gives up. */
#define TELL_MS 1500
#define ACK_MAGIC 0x4b414657u /* "WFAK" */
#define ACK_BYTES 4
#define LINK_RELAY 0xfffffffeu  /* the relay connection to a neighbour */
#define RELAY_MAGIC 0x4c524657u /* "WFRL" */
#define RELAY_HDR 24
#define RELAY_CHUNK (256 * 1024)
#define HANDSHAKE_MS 5000
/* A wire over a path through other hosts (weft__link.nvia > 0) opens at
 * the first rank of the first host between with a splice request: magic, the
 * number of steps left (1 .. WEFT__MAX_VIA + 1), the job token, then each step
 * as (rank, cable): connect to that rank's port at its host's end of that
 * cable. The rank carries the connection on (splice.c), with the rest of the
 * request where steps are left; the answer, the hello and everything after pass
 * through unchanged. */
#define SPLICE_MAGIC 0x50534657u /* "WFSP" */
/* The last host between answers once it reached the peer's host (4 bytes,
 * passed back by the others), and only then does the dialling rank send
 * its hello: a path whose far steps are down never looks up. */
#define SPLICE_OK 0x4f534657u /* "WFSO" */
#define SPLICE_OK_BYTES 4
#define SPLICE_BYTES (24 + 8 * (WEFT__MAX_VIA + 1))
#define RX_CAP (256 * 1024)       /* read-ahead per connection */
#define RX_DIRECT_MIN (64 * 1024) /* receives this big are read in place */
#define RETRY_MS 25
#define BATCH_MAX 64 /* frames per write */

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
    CONN_SPLICE_WAIT, /* over a path: the splice request's answer */
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
    /* The hello's settings differ from this rank's: answered (so the
     * dialling side learns it), then the job fails (settings_differ). */
    int bad_settings;
    int telling; /* it carries this rank's failure: closed once written */
    int lost;    /* counted in its peer's lost */
    /* Failover (resume.c). A data wire to a peer with other wires is
     * resumable: the last ret_size bytes handed for writing stay in ret,
     * and tx_pos and rx_pos count the bytes handed for writing and read
     * on the wire, whatever connections carried them. One that lost its
     * link is paused (since pause_ms, by the libuv error pause_err) until
     * a new connection (resume: it is one, in set-up; resume_pos: the
     * peer's read position) takes its place, or the wire timeout ends it.
     * successor: the connection that takes over once this one closed. */
    int resumable;
    int paused;
    int pause_err;
    uint64_t pause_ms;
    uint64_t tx_pos, rx_pos;
    uint64_t rx_ms; /* when it last read anything (resume.c picks a path) */
    char *ret;
    size_t ret_size;
    int resume;     /* 1: resumes a lost wire; 2: moves one back to its link */
    int moving;     /* paused to move back to its link, not lost */
    int peer_knows; /* paused at the peer's word: no need to tell it */
    int via_link;   /* the link it runs over (-1: not known here) */
    int route;      /* dialled over a path: its link index, else -1 */
    uint8_t sreq[SPLICE_BYTES]; /* the splice request that opens it */
    uv_write_t sreqw;
    uint64_t resume_pos;
    struct conn *successor;
    char why[160];
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
    int dirty; /* in tp->dirty: has queued sends */
    struct conn *dirty_next;
    /* Batches handed to libuv (uv_write) whose callback has not run. A
     * request's bytes may all be written, the stream's write queue empty,
     * while its callback still waits for the next turn of the loop: a
     * later batch must not complete before it (data.c, try_send). */
    int uv_batches;
    int tx_batches; /* batches with the sending thread (tx.c) */
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
    uint32_t link;  /* link index in the hostfile, or WEFT__LINK_LOOPBACK */
    uint32_t lwire; /* wire index on that link */
    int outgoing;   /* we connect (we are the higher rank) */
    char addr[64];  /* where to connect (outgoing only) */
    int port;
    uint64_t next_try_ms;
    int relay;    /* the relay connection, not a data wire */
    conn *trying; /* outgoing: the connection in set-up, if any */
    conn *c;
    conn *resuming;        /* outgoing: the connection resuming c, in set-up */
    uint64_t next_move_ms; /* outgoing: when to try its own link again */
    /* Set-up (outgoing): when it was first tried, and the link it was
     * made over where its own did not answer within the wire timeout
     * while another link to the peer had a wire up (-1: its own). */
    uint64_t first_try_ms;
    int alt_link;
} slot;

typedef struct {
    int nwires; /* data wires: s[0 .. nwires) */
    int nslots; /* plus the relay connection, if any */
    slot *s;
    atomic_int lost; /* data wires whose connection ended (weft_peer_wires) */
    atomic_int back; /* ... and that were resumed on a new connection */
} peer;

/* One write of a batch of frames; they complete together, in order. */
typedef struct wreq {
    uv_write_t req;
    weft__xfer *first;
    int n;
    struct wreq *next;
    /* A batch with the sending thread: its connection and socket, what
     * is left to write (bufs[at..nb), the first shortened as it goes) and
     * how it ended (0, or libuv's code of the failure). */
    conn *k;
    int fd;
    int nb, at;
    int status;
    uv_buf_t bufs[BATCH_MAX];
} wreq;

/* The sending thread (tx.c). The progress side hands batches over (in,
 * under mu, and a write to efd); the thread writes them, each
 * connection's in order, and hands them back (done, under mu; ndone for
 * a look without the lock, and the transport's async to wake progress()). */
typedef struct tcp_tx {
    pthread_t th;
    pthread_mutex_t mu;
    int efd;  /* eventfd: batches handed over, or stop */
    int stop; /* under mu */
    wreq *in_head, *in_tail;
    wreq *done_head, *done_tail;
    _Atomic int ndone;
    int nfds;          /* room in pf: connections + 1 */
    struct pollfd *pf; /* the thread's */
} tcp_tx;

/* A relayed chunk: header fields and its bytes (owned). */
typedef struct rchunk {
    int dir; /* passing through: the direction it goes on in */
    uint32_t src, dst, len;
    uint64_t total;
    char *data;
    struct rchunk *next;
} rchunk;

struct tcp_tp {
    uv_loop_t loop;
    uv_tcp_t listener;
    uv_timer_t timer;     /* deadline of progress() */
    uv_timer_t housekeep; /* connect retries and handshake deadlines */
    uv_async_t async;
    /* The kernel's news of interfaces (resume.c: a link set down or its
     * carrier lost pauses its wires at once); fd -1 when not watching. */
    uv_poll_t linkwatch;
    int linkwatch_fd;
    const weft__config *cfg;
    weft__errsink *sink; /* where failures are recorded */
    int rank;
    int nranks;
    int probe;     /* a send went to a wire with no receive posted */
    int lost_peer; /* the peer whose close or reset failed us, or -1 */
    peer *peers;
    conn *pending;
    int nopen; /* connections not yet closed */
    int err;   /* first transport error, WEFT_OK if none */
    /* Set-up: up once create() returned. A failure before that is told
     * to the peers (telling) until tell_until: tell_code, tell_why; told
     * has a flag per peer. */
    int up;
    int telling;
    int tell_code;
    uint64_t tell_until;
    char tell_why[TELL_WHY];
    uint8_t *told;
    int shut;    /* shutdown() ran: completions are dropped */
    int handles; /* loop-level handles initialised */
    wreq *free_wreqs;
    conn *dirty;    /* connections with queued sends */
    conn *rx_dirty; /* connections with read-ahead for posted receives */
    /* Relaying (relay.c): the connections to the left (0) and right
     * (1) neighbours, chunks that arrived for this rank before their
     * receive was posted, and the posted relay receives, oldest first. */
    slot *relay[2];
    struct rchunk *rpending;
    /* Chunks passing through, to write once uv_run has returned (writes
     * from inside it would escape the SIGPIPE guard), oldest first. */
    struct rchunk *fwd_head, *fwd_tail;
    weft__xfer *rrecv;
    /* Relayed sends complete while their connection was being resumed,
     * whose completions run in progress (weft__tcp_relay_forward). */
    weft__xfer *rdone_head, *rdone_tail;
    int relay_ready; /* posted receives may match pending chunks */
    unsigned events; /* completions and wake-ups, for spinning */
    unsigned ends;   /* streams that ended (a peer closed or reset) */
    /* Settings every rank must share, carried in hellos and answers:
     * wires per link (WEFT_WIRES), and whether shared memory carries the
     * data between ranks of a host (WEFT_SHM; then loopback connections
     * are for set-up and liveness only). */
    uint32_t wires, shm;
    int uv_writes; /* libuv write requests whose callback has not run */
    tcp_tx *tx;    /* the sending thread, once started (tx.c) */
    struct tcp_splice *splice; /* connections carried on, once one is */
    int kept; /* its listening socket kept at shutdown (weft__port_keep) */
    int destroying;
    int tx_failed;   /* it could not start, or stopped: not again */
    weft__spin spin; /* poll before sleeping (transport/common.h) */
};

/* ---- what one file calls in another ---- */

/* TCP_USER_TIMEOUT for a wire timeout of wt ms (> 0). The kernel counts
 * it from its first retransmission, about the minimum RTO (200 ms) after
 * the bytes went unanswered: asked for wt itself, a stream noticed a
 * dropped link after wt + 220-260 ms (bench/failover, wt 1000 and 2000). */
static inline unsigned weft__tcp_user_timeout(int wt)
{
    return (unsigned)(wt > 500 ? wt - 250 : wt / 2 + 1);
}

/* loop.c: libuv under the SIGPIPE guard (see there), the transport's
 * first failure, the code of a failed read or write (WEFT_EPEER where the
 * peer closed or reset its end), closing a connection, the deadline
 * timer's callback. */
void weft__tcp_run(tcp_tp *tp, uv_run_mode mode);
int weft__tcp_write(tcp_tp *tp, uv_write_t *req, uv_stream_t *s,
                    const uv_buf_t *bufs, unsigned int n, uv_write_cb cb);
void weft__tcp_write_done(tcp_tp *tp);
void weft__tcp_fail(tcp_tp *tp, int err, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
int weft__tcp_err_code(int uverr);
void weft__tcp_conn_close(conn *k);
void weft__tcp_timer_cb(uv_timer_t *t);

/* data.c: a data wire's reads (from the moment it is up), the ops
 * table's posting and progress. */
void weft__tcp_data_alloc_cb(uv_handle_t *h, size_t suggested, uv_buf_t *buf);
void weft__tcp_data_read_cb(uv_stream_t *s, ssize_t nread, const uv_buf_t *buf);
int weft__tcp_post_send(weft__tp *t, int p, int w, weft__xfer *x);
int weft__tcp_post_recv(weft__tp *t, int p, int w, weft__xfer *x);
int weft__tcp_progress(weft__tp *t, uint64_t deadline_ms);
void weft__tcp_wake(weft__tp *t);

/* tx.c: the sending thread. weft__tcp_tx_hand hands w (k's batch, its
 * bufs and nb filled) over, starting the thread if it is not running;
 * 0, or -1 where it cannot run (the caller writes the batch itself).
 * weft__tcp_tx_take takes back what the thread wrote (or failed to
 * write): the batches linked by next, oldest first, their connections'
 * counts lowered, each to complete (its status as libuv's callback would
 * have it) by the caller (inside progress() only); NULL where none came
 * back. weft__tcp_tx_stop ends the thread (a batch it was writing stays
 * half-written: the communicator failed or finalized) and hands every
 * batch it held back to the free list, uncompleted (shutdown, before any
 * connection closes). */
int weft__tcp_tx_hand(tcp_tp *tp, conn *k, wreq *w);
wreq *weft__tcp_tx_take(tcp_tp *tp);
void weft__tcp_tx_stop(tcp_tp *tp);

/* handshake.c: the listener's and the housekeeping timer's callbacks. */
void weft__tcp_on_connection(uv_stream_t *server, int status);
void weft__tcp_housekeep_cb(uv_timer_t *t);
/* k's stream ended (uverr): counted in its peer's lost wires, and said
 * (WEFT_LOG=warn) where a link failed rather than the peer closing. */
void weft__tcp_wire_lost(conn *k, int uverr);

/* ---- failover (resume.c) ---- */

/* Whether libuv's uverr on a connection says its link is lost (not that
 * the peer closed or died): a resumable wire is then paused. */
int weft__tcp_link_lost(int uverr);
/* What a read's end of stream (UV_EOF) on k means: UV_EOF where the peer
 * closed its end (the connection waits for this end's close); else the
 * kernel ended it, and a write (on TCP's sending thread, or libuv's) took
 * the error first, so that reads find only the end: UV_ETIMEDOUT where
 * its retransmissions or probes went unanswered (the user timeout), else
 * UV_ECONNRESET. */
int weft__tcp_eof_cause(conn *k);
/* Pauses k (uverr: why): its posted transfers wait for a new connection
 * to take over. Returns 1 if k is paused (or was), 0 if it cannot be
 * resumed (the caller fails as before). */
int weft__tcp_pause(conn *k, int uverr);
/* k's peer closed k (a read's UV_EOF, on a wire not paused): where
 * another wire to it waits paused to resume, the peer has left (a live
 * peer closes a data wire only at its end; one it resumes or moves is
 * paused on this side first), and what that wire waits for cannot come:
 * fails the transport with WEFT_EPEER and returns 1, else 0. */
int weft__tcp_closed_while_paused(conn *k);
/* Pauses k, up and well, to move its wire to a new connection (its own
 * link is back): as weft__tcp_pause, but nothing was lost. */
int weft__tcp_pause_to_move(conn *k);
/* Keeps the bytes of a batch handed for writing on k, where it is
 * resumable. */
void weft__tcp_retain(conn *k, const uv_buf_t *bufs, int n);
/* nk, a new connection up for old's wire, takes over once old closed:
 * every posted transfer, the read-ahead and the positions move to it,
 * and the bytes the peer had not read (from peer_pos) go again first. */
void weft__tcp_takeover(conn *old, conn *nk, uint64_t peer_pos);
/* conn_close_cb's part: old closed with a successor waiting. */
void weft__tcp_resume_finish(conn *old);
/* Housekeeping: dials resumes, ends pauses past the wire timeout. Returns
 * 1 while some wire is paused. */
int weft__tcp_resume_housekeep(tcp_tp *tp, uint64_t now);
/* Sets up retention on every resumable data wire once set-up ended, and
 * the watch of interfaces that pauses a wire whose interface goes down
 * (or loses its carrier) at once, rather than at the user timeout. */
int weft__tcp_resume_init(tcp_tp *tp);
/* The link slot s of peer p runs on when nothing failed: its own, or for
 * the relay connection, the link of the neighbour's first wire, whose
 * path it takes (setup.c). */
int weft__tcp_home_link(const tcp_tp *tp, int p, const slot *s);
/* handshake.c: connects to peer p for wire w over path's link (path: w's
 * slot or another of p's; resume: to resume it); closes k and tries again
 * later; (re)starts housekeeping. */
void weft__tcp_dial(tcp_tp *tp, int p, int w, const slot *path, int resume);
void weft__tcp_retry_later(conn *k, const char *why);
/* Tells peer p, over another link, that this end (the listening one) of
 * wire w lost its link (HELLO_NUDGE): the peer dials to resume it. */
void weft__tcp_nudge(tcp_tp *tp, int p, int w);
void weft__tcp_housekeep_start(tcp_tp *tp);
/* data.c: queues k's sends and read-ahead for progress() to hand out. */
void weft__tcp_kick(conn *k);
/* Set-up failed on this rank (tp->err): starts telling the peers, until
 * deadline_ms at the latest. */
void weft__tcp_tell_start(tcp_tp *tp, uint64_t deadline_ms);
/* 1 once every peer was told, or telling's time is up. */
int weft__tcp_tell_done(const tcp_tp *tp);
/* k, up, ended (k->rx_end) before this rank's set-up ended: the job fails,
 * with the peer's notice where it sent one. */
void weft__tcp_setup_closed(conn *k);

/* splice.c: k, accepted, opened with a splice request (k->hbuf, k->hgot
 * bytes read): checked, and its socket handed to the thread that carries
 * it on (k is closed either way). Stopping waits until every connection
 * carried on was closed by its ends, or nothing moved on any for the wire
 * timeout (2 s where none is set). */
void weft__tcp_splice_take(conn *k);
void weft__tcp_splice_stop(tcp_tp *tp);
/* A wire to peer p over path link l, from this rank: where it is dialled
 * (the first step's address and port), and its splice request (written
 * to out, SPLICE_BYTES). 0, or -1 where l is no path between the two
 * hosts. */
int weft__tcp_path_first(const tcp_tp *tp, int p, uint32_t l, char *addr,
                         size_t addrlen, int *port);
int weft__tcp_splice_request(const tcp_tp *tp, int p, uint32_t l, uint8_t *out);

/* relay.c: a relay connection's reads, what progress() hands over (chunks
 * passing through, chunks kept for posted receives), and the entries of
 * the relay table (transport.h). */
void weft__tcp_relay_alloc_cb(uv_handle_t *h, size_t suggested, uv_buf_t *buf);
void weft__tcp_relay_read_cb(uv_stream_t *st, ssize_t nread,
                             const uv_buf_t *buf);
void weft__tcp_relay_forward(tcp_tp *tp);
void weft__tcp_relay_drain(tcp_tp *tp);
int weft__tcp_relay_send(weft__tp *t, int to, weft__xfer *x);
int weft__tcp_relay_recv(weft__tp *t, int from, weft__xfer *x);

#endif
