/*
 * The transport ops table. A transport moves frames on wires and reports
 * completions; it never knows what a collective is.
 *
 * Contract for every implementation:
 * - Frames posted on one wire in one direction complete in the order they
 *   were posted. A posted receive of len bytes completes once exactly len
 *   bytes of that wire's stream have landed in its buffer.
 * - A completion callback runs only from inside progress(), on the thread
 *   that called it, never from post_*().
 * - When post_*() fails, the completion callback will never be called.
 * - The buffer of a posted frame is borrowed until its completion, or until
 *   shutdown() returns, after which no frame references any buffer.
 * - Errors (a peer that closes, a failed completion) are recorded in the
 *   error record the transport was given (the first cause wins) and
 *   returned by progress().
 * - No call raises SIGPIPE or any other signal in the process (a peer
 *   that vanished is an error like any other).
 */
#ifndef WEFT_TRANSPORT_H
#define WEFT_TRANSPORT_H

#include "base/base.h"
#include "topo/topo.h"

#include <stddef.h>
#include <stdint.h>

typedef struct weft__tp weft__tp;

/* The most bytes one box message (below) holds, in any transport: the
 * engine's 24-byte header and 2048 bytes of data (WEFT__BOX_MAX_BYTES). */
#define WEFT__BOX_MSG_MAX (24 + 2048)

/* The link index of the wires between ranks of one host (loopback), in
 * every transport's handshake and wire numbering. */
#define WEFT__LINK_LOOPBACK 0xffffffffu

/* A posted frame. The engine owns it; the transport keeps a pointer to it
 * until its completion callback has run. */
typedef struct weft__xfer {
    void (*done)(struct weft__xfer *x);
    void *arg;
    /* 1: a send of a pass that moves much (WEFT_SEND_THREAD_PASS_BYTES),
     * which the transport may hand to a thread of its own (TCP's sending
     * thread); 0: leave it at once, as small calls want. */
    int bulk;
    /* Private to the transport while posted. */
    void *tp_next;
    char *buf;
    size_t len;
    size_t got;
    int peer; /* relay only: the other end */
    /* A receive's hint: the bytes its poster expects to post right behind
     * it on the wire (0: unknown), so that a transport that reads ahead
     * can stop before a large frame it would rather read in place. */
    size_t next_len;
    /* A receive's: NULL, or whether anyone still waits for it. The engine
     * keeps a read of a stream's next header posted after whoever wanted
     * it went away (a probe of an any-source receive that another peer's
     * message ended): a peer that leaves fails a receive only where it
     * is wanted (weft__xfer_wanted). Asked on the progress thread. */
    int (*wanted)(const struct weft__xfer *x);
} weft__xfer;

/* Whether receive x is waited for: a peer that left fails it only then. */
static inline int weft__xfer_wanted(const weft__xfer *x)
{
    return x != NULL && (x->wanted == NULL || x->wanted(x));
}

/* Appends x to a transport's FIFO of posted frames (linked by tp_next). */
static inline void weft__xq_push(weft__xfer **head, weft__xfer **tail,
                                 weft__xfer *x)
{
    x->tp_next = NULL;
    if (*tail != NULL)
        (*tail)->tp_next = x;
    else
        *head = x;
    *tail = x;
}

/* What a transport is given to open its wires: the job (hostfile and
 * environment), who this rank is, where its failures are recorded, and when
 * set-up must be over. It never sees the communicator. */
typedef struct weft__tp_params {
    const weft__config *cfg;
    int rank;
    int nranks;
    int wires;            /* connections per peer on each link */
    int timeout_ms;       /* the per-call deadline, for waits of its own */
    uint64_t deadline_ms; /* set-up ends by then (weft__now_ms clock) */
    weft__errsink *sink;  /* failures, first cause first */
    /* A socket already listening at this rank's port (weft_init_config's
     * listener), or -1: bind the port. The transport listens on a copy
     * (dup) and leaves this one to the caller. */
    int listen_fd;
    /* Connections per peer of this rank's host (loopback), or 0: wires.
     * The shared-memory transport keeps one, for set-up and liveness. */
    int local_wires;
} weft__tp_params;

/* The optional parts of a transport: each is a table of its own, which
 * a transport that lacks the part replaces with the shared stub
 * (weft__tp_no_relay, weft__tp_no_box, weft__tp_no_read), so that no
 * table and no entry is ever NULL. The stubs' entries answer "not here"
 * (0 bytes, no peer reached, WEFT_ENOTSUP, nothing done), and their
 * offered is 0, where a transport's own table says 1: the engine reads
 * it where it decides about the whole job before asking any peer. */

/* Point to point with a rank that has no wires to this one: the message
 * goes around the ring, each rank in between forwarding it while it is
 * inside progress(). len bytes of x->buf to (or from) peer; x->done runs
 * once all of it has left (or arrived). Where the transport cannot relay
 * (the stub), such peers are WEFT_ENOTSUP before anything moves. */
typedef struct weft__tp_relay_ops {
    int offered;
    int (*send)(weft__tp *tp, int peer, weft__xfer *x);
    int (*recv)(weft__tp *tp, int peer, weft__xfer *x);
} weft__tp_relay_ops;

/* What the box's put and get (below) answer, where not an error. */
typedef enum weft__box_put_result {
    /* Published. */
    WEFT__BOX_PUBLISHED = 0,
    /* A peer has not yet started call seq - depth + 1 (its slot is still
     * to be read): nothing published; call again once progress()
     * returned. */
    WEFT__BOX_NO_ROOM = 1,
} weft__box_put_result;

typedef enum weft__box_get_result {
    /* The peer has not written its message yet. */
    WEFT__BOX_NOT_YET = 0,
    /* Up to cap bytes of the message copied to out, its length in *len. */
    WEFT__BOX_READY = 1,
    /* The message is there (as for WEFT__BOX_READY) but its peer left by
     * its own hand without ending the call: it failed in it. The message
     * may be looked at, as a header that differs explains the failure;
     * its data must not be used. (A peer that died without a word gets
     * WEFT__BOX_READY, its message being whole.) */
    WEFT__BOX_LEFT_MID = 2,
    /* The peer left without writing its message. */
    WEFT__BOX_LEFT_BEFORE = 3,
    /* The peer announced call seq on frames: its header in out, its
     * length in *len. */
    WEFT__BOX_FRAMES = 4,
} weft__box_get_result;

/* The box: a slot per rank and collective call, for the few bytes of a
 * call among ranks of one host, without frames. Where the transport has
 * none (the stub), the engine never starts a call in it.
 * - bytes: the most bytes one message to peer can hold, 0 where the box
 *   does not reach peer (another host).
 * - put: publishes len bytes of msg as this rank's message for
 *   collective call number seq (> 0, consecutive calls' numbers
 *   increasing) to every peer the box reaches. A weft__box_put_result,
 *   or the transport's error (a peer that left that far behind).
 * - announce: this rank runs call seq on frames; len <= 56 bytes of hdr,
 *   its header, are what a peer whose call seq went to the box finds
 *   instead of a message (WEFT__BOX_FRAMES). Never waits.
 * - get: peer's message for call seq: a weft__box_get_result, or the
 *   transport's error. WEFT__BOX_LEFT_MID, WEFT__BOX_LEFT_BEFORE and
 *   WEFT__BOX_FRAMES fail nothing: the caller says why its call failed,
 *   having looked at every peer.
 * - done: this rank ended collective call seq (and every earlier one),
 *   however it ran; said to the peers when this rank leaves.
 * - watch: while seq != 0, progress() returns (something may have
 *   progressed) once a peer wrote a message or a note, or left, where
 *   before it waited for frames only. */
typedef struct weft__tp_box_ops {
    int offered;
    size_t (*bytes)(weft__tp *tp, int peer);
    int (*put)(weft__tp *tp, uint64_t seq, const void *msg, size_t len);
    void (*announce)(weft__tp *tp, uint64_t seq, const void *hdr, size_t len);
    int (*get)(weft__tp *tp, int peer, uint64_t seq, void *out, size_t cap,
               size_t *len);
    void (*done)(weft__tp *tp, uint64_t seq);
    void (*watch)(weft__tp *tp, uint64_t seq);
} weft__tp_box_ops;

/* One-copy reads of a peer's memory (ranks of one host). Where the
 * transport has none (the stub), the engine never reads.
 * - can_read: 1 where peer_read reaches peer and peer can read this
 *   rank's memory likewise, else 0.
 * - peer_read: copies len bytes at addr in peer's memory to dst. 0;
 *   WEFT_EPEER where the peer left (failed, finalized or died) before
 *   the read ended, so what was read must not be used (a peer hands its
 *   buffers back only after it marked its leaving); or WEFT_ETRANSPORT
 *   where the kernel refused (its errno in *err). Records and fails
 *   nothing, and is safe from any thread while the transport is up. */
typedef struct weft__tp_read_ops {
    int offered;
    int (*can_read)(weft__tp *tp, int peer);
    int (*peer_read)(weft__tp *tp, int peer, void *dst, uint64_t addr,
                     size_t len, int *err);
} weft__tp_read_ops;

/* Ports kept for failed communicators (common.c). A communicator that
 * fails stops taking connections, but its listening socket stays open
 * (weft__port_keep: the process-wide table owns it) until the process
 * binds that port again (weft__port_take: a shrink's agreement, a new
 * communicator, which take the socket over with whatever connections
 * wait in its backlog) or finalizes the failed one (weft__port_drop,
 * which closes it if still kept by owner). So a rank's port answers
 * from weft_init to weft_finalize, through a failure and a shrink, and
 * a port that refuses a connection is a rank whose process is gone (or
 * that finalized): shrink's agreement leaves such a rank out at once.
 * weft__port_take(port, any): the kept socket at port (bound to every
 * address where any, else to loopback), or -1 (a kept one bound
 * otherwise is closed). */
void weft__port_keep(int port, int fd, const void *owner);
int weft__port_take(int port, int any);
void weft__port_drop(const void *owner);
/* A rank that dials another's port only to see that it answers opens with
 * this word and closes (shrink's agreement); listeners close it quietly. */
#define WEFT__PROBE_MAGIC 0x50574657u /* "WFWP" */

/* The stubs (stub.c). */
extern const weft__tp_relay_ops weft__tp_no_relay;
extern const weft__tp_box_ops weft__tp_no_box;
extern const weft__tp_read_ops weft__tp_no_read;

/* Every entry is required, and every optional part's table is set (its
 * stub where the transport lacks it). */
typedef struct weft__tp_ops {
    const char *name;
    /* Opens every wire of the job (listens, connects, handshakes with the
     * job token). Blocks until all wires are up or p->deadline_ms passes
     * (WEFT_ETIMEDOUT). On failure nothing is left open and p->sink says
     * why. p and what it points to outlive the transport. */
    int (*create)(const weft__tp_params *p, weft__tp **out);
    /* Closes every wire and frees the transport; no callback runs after it
     * returns. A NULL tp is a no-op. */
    void (*destroy)(weft__tp *tp);
    /* Wires to peer (0 if the peer is not directly connected). */
    int (*nwires)(weft__tp *tp, int peer);
    /* The wires over cables to peer (none for one reached through shared
     * memory or a relay): how many, how many carry traffic, how many were
     * lost and came back (weft_peer_wires). Any thread. */
    void (*cable_wires)(weft__tp *tp, int peer, weft_wire_info *out);
    int (*post_send)(weft__tp *tp, int peer, int wire, weft__xfer *x);
    int (*post_recv)(weft__tp *tp, int peer, int wire, weft__xfer *x);
    /* Runs completions until at least one event happened, the deadline
     * (weft__now_ms() clock) passed (WEFT_ETIMEDOUT) or a wire failed (its
     * error). Returns WEFT_OK if something may have progressed. */
    int (*progress)(weft__tp *tp, uint64_t deadline_ms);
    /* Makes a progress() blocked in another thread return soon. Safe from
     * any thread. */
    void (*wake)(weft__tp *tp);
    /* Closes every wire after a failure: pending frames are dropped and no
     * completion runs afterwards. The transport stays allocated. */
    void (*shutdown)(weft__tp *tp);
    const weft__tp_relay_ops *relay;
    const weft__tp_box_ops *box;
    const weft__tp_read_ops *read;
} weft__tp_ops;

extern const weft__tp_ops weft__tcp_ops;

/* Shared memory between ranks of one host, with the TCP transport for
 * everything else (shm/shm.h). */
extern const weft__tp_ops weft__shm_ops;

#ifdef WEFT_HAVE_IBVERBS
extern const weft__tp_ops weft__ibverbs_ops;
#endif

#endif
