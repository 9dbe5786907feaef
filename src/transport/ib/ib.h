/*
 * RDMA transport on rdma-core's libibverbs: what the files of
 * src/transport/ib/ share (its constants, device ports, wires, links and
 * the transport itself, and what one file calls in another). Only they
 * include this header: the engine sees the transport through its ops table
 * (weft__ibverbs_ops, transport.h).
 *
 * The files: devices.c (device ports, GIDs, budgets), data.c (the rings
 * and credits, posting), fail.c (failures, the TCP side's news),
 * completions.c (completions, progress), exchange.c (what travels on the
 * TCP wires: the queue pairs' addresses, ready, goodbye), setup.c
 * (planning the wires, their resources, create, shutdown and destroy, the
 * ops table), failover.c (a wire whose queue pair fails resumed on a new
 * one over another link; its header says how); budget.c checks a
 * device's limits, a pure function (budget.h) tested on its own.
 *
 * Bootstrap and liveness ride on the TCP transport: create() opens one TCP
 * connection per link to every peer (weft__tcp_create_wires, with the job
 * token checked in its handshake), sends over it what the peer needs to
 * reach this rank's queue pairs (QP numbers, PSNs, GIDs, the address and
 * key of each receive ring), and keeps it open. A peer that dies closes it,
 * which this rank sees at once (WEFT_EPEER) even while it only waits to
 * receive; a peer that finalizes says goodbye on it first. Relayed
 * point-to-point traffic (ranks with no link between their hosts) goes
 * through the TCP transport's relay, and a ring's step between hosts that
 * no cable joins (a chain that a shrink left) over the TCP side's wires
 * on paths through the hosts between (ib_peer.path).
 *
 * Each wire is one RC queue pair, carrying both directions; wire k of link
 * l to a peer pairs with wire k of link l at the peer (numbered as the TCP
 * transport numbers its wires: the links joining the two hosts in hostfile
 * order, or loopback, `wires` on each), never by list order.
 *
 * Data path: registered staging, no registration of user memory. Each QP
 * has a send ring and a receive ring of `slots` slots of `slot_bytes`. A
 * sender copies the bytes of its posted frames, in order, into its next
 * send slot (several small frames share a slot: a wire is a byte stream)
 * and RDMA-writes the slot with immediate (its length) into the same slot
 * of the peer's receive ring (the writes of one flush in one chain, only
 * the last and one in every half ring signalled: data.c, chain_post). It needs
 * a credit for that: the peer's count of slots it has consumed, which the peer
 * returns with zero-length SEND_WITH_IMM messages every half ring, so a sender
 * never overruns its receiver. The receiver keeps zero-length receive requests
 * posted; each write's completion says a slot has landed, and its bytes are
 * copied into the posted receive frames in stream order, so that a receive of
 * len bytes completes when exactly len bytes of the wire's stream have landed,
 * as with TCP.
 *
 * A send frame completes only once the RDMA write of the slot that holds
 * its last byte has completed successfully, not when its bytes are in the
 * send ring: the local completion of an RC write means the responder
 * acknowledged it, so the bytes are in the peer's ring and the peer's
 * receive completion for them is there. Completing earlier would let a
 * rank finish an operation, and then die (a SIGKILL, an exit without
 * weft_finalize), while its last writes were still queued in its device
 * or unacknowledged: they die with the process, and a survivor would wait
 * for bytes that the dead rank had reported as sent. So each wire keeps the
 * frames whose bytes are all in the ring in a second queue, in order, each
 * marked with the count of slot writes that covers its last byte, and
 * completes them in order as that count of completed writes passes their
 * mark. This costs no throughput where it matters: the engine keeps at most
 * WEFT__SEND_DEPTH frames in flight per wire (a MiB at the default frame
 * size), far above the bandwidth-delay product of any link this runs on,
 * and the ring's slots were already held until their writes completed.
 *
 * Goodbyes: finalize waits for its writes to be acknowledged, then sends
 * on every TCP connection 'B' and, per wire of that link, the count of
 * slots that have landed from the peer. A peer whose write was landed but
 * whose acknowledgement was lost (rxe retransmits under load) learns from
 * that count that its frames arrived, rather than failing when the
 * retransmission finds the queue pair gone.
 *
 * Deaths: what a peer wrote before it completed an operation must be
 * delivered and consumed before its death counts. It closes its TCP
 * connection (by dying) only after its last writes were acknowledged
 * (above), so their completions are on the completion queue by then, but
 * the close can overtake them on the way into this process (the CQ is
 * polled first in each pass, the close is noticed after). A failure of the
 * TCP side is therefore kept aside, with its message (tcp_news), the CQ is
 * polled once more, and everything on it handed over; the failure is
 * judged only when this rank waits for something from the lost peer that
 * can no longer come: a receive that what landed cannot fill, a frame not
 * written, or a write not acknowledged within TCP_ACK_GRACE_MS of the
 * close (tcp_wait_ms says why that grace), or when nothing has moved for
 * TCP_QUIET_MS. So an operation that the landed data and the living peers
 * finish returns WEFT_OK, and the failure stands for whatever next waits
 * on the lost peer.
 *
 * Every work completion's status is checked: a failed one stops its wire,
 * which resumes on a new queue pair over another link where its peer has
 * other wires (failover.c); otherwise it fails the communicator with
 * WEFT_ETRANSPORT and ibv_wc_status_str() in the message, or WEFT_EPEER
 * where the peer has left. A wire with nothing outstanding sends
 * heartbeats (zero-length RDMA writes, data.c: weft__ib_beat), so that a
 * link that drops everything silently fails its idle wires within the wire
 * timeout too, not at their next write. progress() polls the completion
 * queues for WEFT_SPIN_US, then sleeps in poll() on the completion channels,
 * the devices' async event fds and the TCP transport's fd (which wake()
 * makes readable), never past the deadline.
 */

#ifndef WEFT_TRANSPORT_IB_H
#define WEFT_TRANSPORT_IB_H

#include "transport/common.h"
#include "transport/tcp/boot.h"
#include "transport/transport.h"

#include <infiniband/verbs.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#define IB_MAGIC 0x42494657u /* "WFIB" */
#define IB_VERSION 5u /* 5: queue pair number 0 for a port down at set-up */
#define IB_HDR_BYTES 32
#define IB_QP_BYTES 48
#define IB_BYE_BYTES(wires) (1 + 4 * (wires)) /* 'B', landed per wire */
/* A failover message (failover.c): type, wire, epoch, landed and consumed
 * slots, link, and a queue pair's entry as in the set-up message. */
#define IB_FO_BYTES (24 + IB_QP_BYTES)
/* After set-up, every message on a TCP wire has this size: the goodbye
 * or a failover message, padded. */
#define IB_CTL_BYTES(wires)                                                    \
    (IB_BYE_BYTES(wires) > IB_FO_BYTES ? IB_BYE_BYTES(wires) : IB_FO_BYTES)
_Static_assert(1 <= IB_HDR_BYTES && 4 <= IB_QP_BYTES &&
                   IB_FO_BYTES <= IB_HDR_BYTES + IB_QP_BYTES,
               "a goodbye or a failover message fits in the buffer of the "
               "set-up message");
#define CQ_BATCH 32
/* Slot writes posted in one chain (data.c: tx_flush). */
#define IB_CHAIN 16
/* Writes up to this long go inline where the device allows it (the
 * frames of a small call: headers and a few bytes of data). */
#define IB_INLINE_BYTES 256
#define IB_PORT_DEFAULT 1
/* The least QP timeout: 4.096 us * 2^14, 67 ms; rxe under TCG needs it.
 * With WEFT_WIRE_TIMEOUT_MS on, the timeout is the largest whose
 * IB_RETRY_CNT + 1 tries fit in it (weft__ib_qp_timeout), never below. */
#define IB_QP_TIMEOUT 14
/* 6, not 7: rxe takes a retry_cnt of 7 as "retry for ever" (as the spec
 * has it for rnr_retry only), so a silent link would never fail a write. */
#define IB_RETRY_CNT 6
#define IB_RNR_RETRY 7 /* 7: retry for ever; a receiver reposts promptly */
#define IB_HOP_LIMIT 64
#define BYE_WAIT_MS 1000
/* After a peer's TCP connection closed (tcp_wait_ms): how long a write to
 * it that a send frame waits on may still be acknowledged, and how long
 * nothing may move before the failure is judged whatever it waits for. */
#define TCP_ACK_GRACE_MS 250
#define TCP_QUIET_MS 1000
#define DRAIN_MAX_MS 10000
#define MAX_DEVS 16 /* device ports one rank uses */

/* What a work request was, in the low bits of its wr_id (the rest is the
 * wire, which is at least 8-byte aligned). */
enum { WR_DATA = 0, WR_CREDIT = 1, WR_RECV = 2, WR_BEAT = 3, WR_KIND_MASK = 3 };

typedef struct ib_tp ib_tp;

/* One device port, with the verbs resources every QP on it shares. */
typedef struct ib_dev {
    char name[64];
    int port;
    struct ibv_context *ctx;
    struct ibv_pd *pd;
    struct ibv_comp_channel *ch;
    struct ibv_cq *cq;
    struct ibv_device_attr attr;
    struct ibv_port_attr pattr;
    int nqp;      /* queue pairs planned on it */
    int armed;    /* the CQ is armed for one notification */
    int down;     /* its port went down (IBV_EVENT_PORT_ERR), not yet back */
    int nqp_made; /* queue pairs made on it, failover's included */
    int cq_qps;   /* queue pairs its CQ is sized for */
    struct ib_dev *next;
} ib_dev;

/* One wire: an RC queue pair and its two rings. */
typedef struct ib_wire {
    ib_tp *tp;
    int peer;
    int w;         /* wire index as the engine numbers it */
    uint32_t link; /* hostfile link index, or WEFT__LINK_LOOPBACK */
    ib_dev *dev;
    int gid_index;
    union ibv_gid gid;
    char addr[64]; /* this end's address, for messages */
    struct ibv_qp *qp;
    struct ibv_mr *smr, *rmr;
    char *sring, *rring;
    uint32_t psn;
    /* The peer's receive ring. */
    uint64_t raddr;
    uint32_t rkey;
    /* Send side: frames not yet copied out, oldest first; sq_off bytes of
     * the head are in the ring already. */
    weft__xfer *sq_head, *sq_tail;
    size_t sq_off;
    /* Frames all of whose bytes are in the ring, oldest first, waiting for
     * the write of the slot that holds their last byte; each one's mark
     * (kept in its got field) is the count of completed slot writes that
     * completes it. */
    weft__xfer *wq_head, *wq_tail;
    uint64_t s_posted; /* slots written */
    uint64_t s_done;   /* slot writes completed (the local slot is free) */
    /* Selective signalling (data.c: tx_flush): the slot writes of one
     * flush are posted as one chain in which only the last, and one in
     * every half ring, asks for a completion; that completion says that
     * every write before it completed too. sig[n % slots] is s_posted
     * after the n-th such write; sig_posted and sig_done count them. */
    uint64_t *sig;
    uint64_t sig_posted, sig_done;
    uint64_t s_credit;  /* slots the peer has consumed, as it told us */
    uint64_t s_landed;  /* slots landed at the peer, as its goodbye said */
    int bye;            /* the goodbye of this wire's link has come */
    int s_wr;           /* send requests outstanding, data and credit */
    uint64_t s_acked;   /* send requests completed well, of every kind */
    uint64_t beat_seen; /* s_acked at the last heartbeat check (data.c) */
    int c_wr;           /* credit messages outstanding */
    /* Receive side: posted frames, oldest first. */
    weft__xfer *rq_head, *rq_tail;
    uint32_t *r_len;     /* bytes landed in each slot */
    uint64_t r_landed;   /* slots landed */
    uint64_t r_consumed; /* slots copied out entirely */
    uint64_t r_returned; /* r_consumed as last told to the peer */
    size_t r_off;        /* bytes of the current slot copied out */
    int r_wr;            /* receive requests posted */
    int dirty;
    struct ib_wire *dirty_next;
    int dead; /* failed after its peer left: ignored from then on */
    /* Failover (failover.c). qpn: the current queue pair's number (0:
     * none), with dev telling completions of an earlier queue pair of the
     * wire apart (ignored). fo: FO_UP, or where the wire is in its
     * resume; epoch: queue pairs the wire has retired. */
    uint32_t qpn;
    uint32_t max_inline; /* bytes a write may carry inline (its queue pair's) */
    int fo;
    int need_stop; /* failed while up: failover.c stops it */
    int init_down; /* its link's port was down at one end as the job
                      started: it starts on another link (failover.c) */
    uint32_t epoch;
    int li;              /* the peer's link (index in ib_peer.links) it uses */
    int home_li;         /* the link it was made on */
    int moving;          /* stopped to move back to home_li: nothing was lost */
    uint32_t *s_len;     /* bytes written from each send slot */
    uint64_t replay_end; /* slots to write again up to, after a resume */
    uint64_t fo_ms;      /* when it stopped */
    uint32_t rep_landed, rep_consumed;   /* what this end said at the stop */
    uint32_t peer_landed, peer_consumed; /* what the peer said */
    char why[160];                       /* why it stopped */
} ib_wire;

enum { FO_UP = 0, FO_STOPPING, FO_STOPPED, FO_WAIT_C, FO_WAIT_A };

/* One TCP connection to a peer (one per link): the set-up messages and the
 * goodbye travel on it. */
typedef struct ib_link {
    ib_tp *tp;
    int peer;
    int twire; /* its wire index in the TCP transport */
    uint32_t link;
    weft__xfer sx, rx, bye_rx, bye_tx;
    /* Header and this end's QP entries, then the goodbye (IB_BYE_BYTES,
     * which fits in the space of the header). */
    uint8_t *out;
    uint8_t *in; /* the peer's */
    uint8_t ready_in, ready_out;
    /* This end's device port, GID and address on the link (the plan's;
     * failover moves wires onto it). */
    ib_dev *dev;
    int gid_index;
    union ibv_gid gid;
    char addr[64];
    uint64_t lost_ms; /* when a wire on it was last lost (failover.c) */
} ib_link;

typedef struct {
    int nlinks;
    ib_link *links;
    int nwires; /* nlinks * wires per link */
    ib_wire *w;
    int left;               /* the peer said goodbye */
    uint64_t lost_links;    /* links (bits by index) a wire was lost on */
    uint64_t ever_lost;     /* ... since the start, come back or not */
    uint64_t refused_links; /* links that refused a new queue pair ... */
    uint64_t refused_ms;    /* ... last at this time (failover.c) */
    atomic_uint lost, back; /* wires lost, and resumed (weft_peer_wires) */
    /* No cable joins the two hosts: a ring's step over a path through the
     * hosts between (a chain a shrink left, topo/config.c). Its wires are
     * the TCP side's over that path (no queue pair), and this transport
     * hands their frames to it. */
    int path;
} ib_peer;

/* A queue pair or memory region that failover replaced: kept until
 * destroy (a queue pair's number is not reused while it lives, so its
 * late completions are told apart). */
typedef struct ib_retired {
    struct ibv_qp *qp;
    struct ibv_mr *smr, *rmr;
    struct ib_retired *next;
} ib_retired;

/* A failover message: one being sent on a TCP wire (x, b), or one
 * received and not yet acted on (peer, b). */
typedef struct ib_msg {
    weft__xfer x;
    struct ib_tp *tp;
    int busy;
    int peer;
    uint8_t b[IB_FO_BYTES + 4 * WEFT__MAX_WIRES];
    struct ib_msg *next;
} ib_msg;

struct ib_tp {
    const weft__tp_params *p; /* what create() was given */
    weft__tp_params boot_p;   /* the same for the TCP side */
    /* The TCP side's failures land here, not on the communicator's
     * record: tcp_news keeps them aside until they are judged. */
    weft__errsink boot;
    weft__tp *tcp;
    int rank;
    int nranks;
    int wires; /* per link */
    int slots;
    size_t slot_bytes;
    int sq_depth, rq_depth, credit_max;
    ib_peer *peers;
    ib_dev *devs;
    struct ibv_device **devlist;
    int ndevices;
    int devlist_err; /* errno of ibv_get_device_list where it failed */
    int err;
    /* A failure of the TCP side (a peer's connection closed), noticed but
     * not yet judged, and its message (poll_once). */
    int tcp_err;
    char tcp_msg[WEFT__ERRMSG_LEN];
    int tcp_lost;         /* the peer it names as gone, or -1 */
    int tcp_gone;         /* another peer seen gone since (others_gone) */
    uint64_t tcp_err_ms;  /* when it was noticed (weft__now_ms) */
    uint64_t tcp_move_ms; /* when anything last moved since (or a post) */
    int shut;
    int ready;         /* create() finished: finalize drains and says goodbye */
    int nleft;         /* peers that said goodbye */
    int setup_pending; /* TCP frames of the set-up still in flight */
    unsigned events;
    /* Slot writes posted, and those that asked for a completion (said at
     * destroy, WEFT_LOG=debug). */
    uint64_t writes, signalled;
    /* The TCP side is looked at on every pass where it carries relayed
     * messages (a peer with no wires), else every IB_TCP_EVERY_NS while
     * spinning (completions.c: tcp_due): a look costs system calls. */
    int tcp_data;
    unsigned passes;
    uint64_t tcp_ns; /* the last look of a spin's (tcp_due) */
    weft__spin spin; /* WEFT_SPIN_US, adapted (transport/common.h) */
    ib_wire *dirty;
    /* Failover (failover.c): wires to stop or in their resume, messages
     * sent (reused once sent) and received (in order, until acted on). */
    int fo_work;
    /* Heartbeats (data.c: weft__ib_beat): the next check, and how often. */
    uint64_t beat_ms;
    int beat_every_ms;
    ib_retired *retired;
    ib_msg *tx_msgs;
    ib_msg *rx_head, *rx_tail;
};

/* Whether peer p is of this rank's host and reached by the shared-memory
 * transport that runs this one (weft__ib_far, transport/common.h): it has
 * no queue pairs, and its TCP connection is shared memory's. */
static inline int weft__ib_shm_peer(const ib_tp *tp, int p)
{
    const weft__config *cfg = tp->p->cfg;

    return tp->p->local_wires > 0 && p != tp->rank &&
           cfg->rank_host[p] == cfg->rank_host[tp->rank];
}

/* ---- what one file calls in another ---- */

/* fail.c: the first failure recorded, a link's name for messages, the
 * TCP side's news taken in (its failure kept aside: returned, 0 where
 * there is none) and judged, a wire whose queue pair failed. Below every
 * other file: it calls none of them. */
void weft__ib_fail(ib_tp *tp, int err, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
const char *weft__ib_link_name(const ib_wire *w, char *buf, size_t len);
int weft__ib_tcp_news(ib_tp *tp);
int weft__ib_tcp_judge(ib_tp *tp);
void weft__ib_wire_failed(ib_wire *w, int err, const char *what,
                          const char *detail);
/* The same, link 0 where the failure cannot be its link's (a protocol
 * error, a request the peer's device refused): never failed over. */
void weft__ib_wire_failed_as(ib_wire *w, int err, int link, const char *what,
                             const char *detail);

/* completions.c: completions and progress; the ops table's progress and
 * wake. */
void weft__ib_cq_poll_all(ib_tp *tp);
int weft__ib_block(ib_tp *tp, uint64_t deadline_ms);
int weft__ib_progress(weft__tp *t, uint64_t deadline_ms);
void weft__ib_wake(weft__tp *t);

/* data.c: a wire with work to do, the wires' work, receive requests; the
 * ops table's posting. */
void weft__ib_wire_kick(ib_wire *w);
void weft__ib_process_dirty(ib_tp *tp);
void weft__ib_beat(ib_tp *tp);
int weft__ib_post_recvs(ib_wire *w, int n);
int weft__ib_post_send(weft__tp *t, int p, int wi, weft__xfer *x);
int weft__ib_post_recv(weft__tp *t, int p, int wi, weft__xfer *x);
int weft__ib_relay_send(weft__tp *t, int peer, weft__xfer *x);
int weft__ib_relay_recv(weft__tp *t, int peer, weft__xfer *x);

/* devices.c: a wire's device port and GID, a device's budget and its
 * shared resources. */
int weft__ib_wire_device(ib_tp *tp, uint32_t link, ib_wire *w);
int weft__ib_dev_budget(ib_tp *tp, const ib_dev *d);
int weft__ib_dev_setup(ib_tp *tp, ib_dev *d);

/* exchange.c: the set-up exchange, and the goodbye; a queue pair's entry
 * packed and connected to (failover.c uses them too), a message of the
 * TCP side posted. */
int weft__ib_exchange(ib_tp *tp, uint64_t deadline);
int weft__ib_qp_make(ib_tp *tp, ib_wire *w, ib_dev *d);
void weft__ib_say_bye(ib_tp *tp);
void weft__ib_pack_qp(const ib_wire *w, uint8_t *e);
int weft__ib_wire_connect(ib_tp *tp, ib_wire *w, const uint8_t *e, char *why,
                          size_t why_len);
int weft__ib_tcp_frame(ib_tp *tp, ib_link *lk, int recv, weft__xfer *x,
                       void *buf, size_t len, void (*done)(weft__xfer *));

/* failover.c: a wire that failed while its peer has others, stopped and
 * resumed on a new queue pair over a link left; the messages of its
 * resume (from ctl_done, exchange.c); the queue pair timeout; the wires'
 * queue pair and rings made on a device (setup.c and failover.c). */
int weft__ib_can_fail_over(const ib_wire *w);
void weft__ib_fo_run(ib_tp *tp);
void weft__ib_fo_port_down(ib_tp *tp, const ib_dev *d);
int weft__ib_fo_message(ib_tp *tp, int peer, const uint8_t *b);
int weft__ib_fo_wait_ms(const ib_tp *tp);
uint8_t weft__ib_qp_timeout(const ib_tp *tp);
void weft__ib_fo_free(ib_tp *tp);
/* The wires whose link's port was down at one end at set-up
 * (init_down): each starts on another link, as after a loss, and moves
 * to its own once that is up. */
int weft__ib_fo_start(ib_tp *tp);
/* Reads again lk's device port and the GID of lk's address there (a port
 * that was down may have had none): lk->gid_index stays -1 until it has. */
void weft__ib_link_gid(ib_link *lk);

#endif
