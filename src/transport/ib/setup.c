/*
 * RDMA transport on rdma-core's libibverbs.
 *
 * Bootstrap and liveness ride on the TCP transport: create() opens one TCP
 * connection per link to every peer (weft__tcp_create_wires, with the job
 * token checked in its handshake), sends over it what the peer needs to
 * reach this rank's queue pairs (QP numbers, PSNs, GIDs, the address and
 * key of each receive ring), and keeps it open. A peer that dies closes it,
 * which this rank sees at once (WEFT_EPEER) even while it only waits to
 * receive; a peer that finalizes says goodbye on it first. Relayed
 * point-to-point traffic (ranks with no link between their hosts) goes
 * through the TCP transport's relay.
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
 * of the peer's receive ring. It needs a credit for that: the peer's count
 * of slots it has consumed, which the peer returns with zero-length
 * SEND_WITH_IMM messages every half ring, so a sender never overruns its
 * receiver. The receiver keeps zero-length receive requests posted; each
 * write's completion says a slot has landed, and its bytes are copied into
 * the posted receive frames in stream order, so that a receive of len bytes
 * completes when exactly len bytes of the wire's stream have landed, as
 * with TCP.
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
 * Every work completion's status is checked: a failed one fails the
 * communicator with WEFT_ETRANSPORT and ibv_wc_status_str() in the message,
 * or WEFT_EPEER where the peer has left. progress() polls the completion
 * queues for WEFT_SPIN_US, then sleeps in poll() on the completion channels,
 * the devices' async event fds and the TCP transport's fd (which wake()
 * makes readable), never past the deadline.
 */
#include "transport/ib/budget.h"
#include "transport/transport.h"

#include "base/bytes.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <infiniband/verbs.h>
#include <poll.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

#define IB_MAGIC 0x42494657u /* "WFIB" */
#define IB_VERSION 2u        /* 2: the goodbye carries landed counts */
#define IB_HDR_BYTES 32
#define IB_QP_BYTES 48
#define IB_BYE_BYTES(wires) (1 + 4 * (wires)) /* 'B', landed per wire */
_Static_assert(1 <= IB_HDR_BYTES && 4 <= IB_QP_BYTES,
               "a goodbye fits in the buffer of the set-up message");
#define CQ_BATCH 32
#define IB_PORT_DEFAULT 1
#define IB_QP_TIMEOUT 14 /* 4.096 us * 2^14: 67 ms, rxe under TCG needs it */
#define IB_RETRY_CNT 7
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
enum { WR_DATA = 0, WR_CREDIT = 1, WR_RECV = 2, WR_KIND_MASK = 3 };

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
    int nqp;   /* queue pairs planned on it */
    int armed; /* the CQ is armed for one notification */
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
    uint64_t s_credit; /* slots the peer has consumed, as it told us */
    uint64_t s_landed; /* slots landed at the peer, as its goodbye said */
    int bye;           /* the goodbye of this wire's link has come */
    int s_wr;          /* send requests outstanding, data and credit */
    int c_wr;          /* credit messages outstanding */
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
} ib_wire;

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
} ib_link;

typedef struct {
    int nlinks;
    ib_link *links;
    int nwires; /* nlinks * wires per link */
    ib_wire *w;
    int left; /* the peer said goodbye */
} ib_peer;

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
    int err;
    /* A failure of the TCP side (a peer's connection closed), noticed but
     * not yet judged, and its message (poll_once). */
    int tcp_err;
    char tcp_msg[WEFT__ERRMSG_LEN];
    int tcp_lost;         /* the peer it names as gone, or -1 */
    uint64_t tcp_err_ms;  /* when it was noticed (weft__now_ms) */
    uint64_t tcp_move_ms; /* when anything last moved since (or a post) */
    int shut;
    int ready;         /* create() finished: finalize drains and says goodbye */
    int nleft;         /* peers that said goodbye */
    int setup_pending; /* TCP frames of the set-up still in flight */
    unsigned events;
    uint64_t spin_ns;
    ib_wire *dirty;
};

/* ---- errors ---- */

static void ib_fail(ib_tp *tp, int err, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* Records the first failure of the transport (later ones are consequences,
 * such as flushed requests) on the communicator. */
static void ib_fail(ib_tp *tp, int err, const char *fmt, ...)
{
    va_list ap;

    va_start(ap, fmt);
    weft__tp_fail(tp->p->sink, &tp->err, err, fmt, ap);
    va_end(ap);
}

static const char *link_name(const ib_wire *w, char *buf, size_t len)
{
    if (w->link == WEFT__LINK_LOOPBACK)
        snprintf(buf, len, "loopback");
    else
        snprintf(buf, len, "link %u", w->link);
    return buf;
}

/* ---- small helpers ---- */

static int set_nonblock(int fd)
{
    int fl = fcntl(fd, F_GETFL);
    return fl < 0 ? -1 : fcntl(fd, F_SETFL, fl | O_NONBLOCK);
}

static void wire_kick(ib_wire *w)
{
    if (!w->dirty) {
        w->dirty = 1;
        w->dirty_next = w->tp->dirty;
        w->tp->dirty = w;
    }
}

/* ---- devices and GIDs ---- */

/* Splits "name" or "name:port" (the hostfile's "device" of a link end). */
static int parse_device(const char *spec, char *name, size_t len, int *port)
{
    const char *colon = strchr(spec, ':');
    size_t n = colon != NULL ? (size_t)(colon - spec) : strlen(spec);
    char *end;
    long p;

    if (n == 0 || n >= len)
        return -1;
    memcpy(name, spec, n);
    name[n] = '\0';
    *port = IB_PORT_DEFAULT;
    if (colon == NULL)
        return 0;
    errno = 0;
    p = strtol(colon + 1, &end, 10);
    if (errno != 0 || *end != '\0' || end == colon + 1 || p < 1 || p > 255)
        return -1;
    *port = (int)p;
    return 0;
}

static void list_devices(ib_tp *tp, char *out, size_t len)
{
    size_t n = 0;

    out[0] = '\0';
    for (int i = 0; i < tp->ndevices && n + 2 < len; i++)
        n += (size_t)snprintf(out + n, len - n, "%s%s", i ? " " : "",
                              ibv_get_device_name(tp->devlist[i]));
    if (tp->ndevices == 0)
        snprintf(out, len, "none");
}

static const char *port_state_name(enum ibv_port_state s)
{
    return ibv_port_state_str(s);
}

/* The open device port `name`:`port`, opened on first use. `what` says
 * where the name came from, for messages. */
static int dev_get(ib_tp *tp, const char *name, int port, const char *what,
                   ib_dev **out)
{
    struct ibv_device *found = NULL;
    ib_dev *d;
    char names[256];
    int rc;

    for (d = tp->devs; d != NULL; d = d->next)
        if (strcmp(d->name, name) == 0 && d->port == port) {
            *out = d;
            return WEFT_OK;
        }
    for (int i = 0; i < tp->ndevices; i++)
        if (strcmp(ibv_get_device_name(tp->devlist[i]), name) == 0)
            found = tp->devlist[i];
    if (found == NULL) {
        list_devices(tp, names, sizeof names);
        return weft__fail(tp->p->sink, WEFT_ECONFIG,
                          "rank %d: RDMA device \"%s\" (%s) does not "
                          "exist on this host; devices here: %s",
                          tp->rank, name, what, names);
    }
    d = calloc(1, sizeof *d);
    if (d == NULL)
        return WEFT_ENOMEM;
    snprintf(d->name, sizeof d->name, "%s", name);
    d->port = port;
    d->next = tp->devs;
    tp->devs = d;
    d->ctx = ibv_open_device(found);
    if (d->ctx == NULL)
        return weft__fail(tp->p->sink, WEFT_ETRANSPORT,
                          "rank %d: cannot open RDMA device %s: %s", tp->rank,
                          name, strerror(errno));
    if ((rc = ibv_query_device(d->ctx, &d->attr)) != 0)
        return weft__fail(tp->p->sink, WEFT_ETRANSPORT,
                          "rank %d: ibv_query_device(%s): %s", tp->rank, name,
                          strerror(rc));
    if (port > d->attr.phys_port_cnt)
        return weft__fail(tp->p->sink, WEFT_ECONFIG,
                          "rank %d: RDMA device %s has %d port(s), not "
                          "port %d (%s)",
                          tp->rank, name, d->attr.phys_port_cnt, port, what);
    if ((rc = ibv_query_port(d->ctx, (uint8_t)port, &d->pattr)) != 0)
        return weft__fail(tp->p->sink, WEFT_ETRANSPORT,
                          "rank %d: ibv_query_port(%s, %d): %s", tp->rank, name,
                          port, strerror(rc));
    if (d->pattr.state != IBV_PORT_ACTIVE)
        return weft__fail(tp->p->sink, WEFT_ETRANSPORT,
                          "rank %d: port %d of RDMA device %s is %s, "
                          "not ACTIVE",
                          tp->rank, port, name,
                          port_state_name(d->pattr.state));
    *out = d;
    return WEFT_OK;
}

/* Reads GID entry i of d's port: 1 if it exists (with its RoCE version in
 * *v2 where the library can say), 0 if the slot is empty. */
static int gid_entry(struct ibv_context *ctx, int port, int i,
                     union ibv_gid *gid, int *v2)
{
#ifdef HAVE_IBV_QUERY_GID_EX
    struct ibv_gid_entry e;

    if (ibv_query_gid_ex(ctx, (uint32_t)port, (uint32_t)i, &e, 0) != 0)
        return 0;
    *gid = e.gid;
    *v2 = e.gid_type == IBV_GID_TYPE_ROCE_V2;
    return 1;
#else
    static const uint8_t zero[16];

    /* Without the GID type, an IPv4-mapped RoCE GID is taken for v2 (rxe
     * has v2 only; v1 devices list the same address at another index). */
    if (ibv_query_gid(ctx, (uint8_t)port, i, gid) != 0 ||
        memcmp(gid->raw, zero, 16) == 0)
        return 0;
    *v2 = 1;
    return 1;
#endif
}

static int gid_is_v4(const union ibv_gid *g)
{
    static const uint8_t prefix[12] = {0, 0, 0, 0, 0,    0,
                                       0, 0, 0, 0, 0xff, 0xff};
    return memcmp(g->raw, prefix, 12) == 0;
}

/* The index of the RoCE v2 GID of d's port that is IPv4 address addr
 * (::ffff:a.b.c.d), or -1. addr NULL: the first RoCE v2 IPv4 GID. */
static int gid_find_v4(struct ibv_context *ctx, int port, int tbl_len,
                       const char *addr, union ibv_gid *out)
{
    struct in_addr in;

    if (addr != NULL && inet_pton(AF_INET, addr, &in) != 1)
        return -1;
    for (int i = 0; i < tbl_len; i++) {
        union ibv_gid g;
        int v2 = 0;

        if (!gid_entry(ctx, port, i, &g, &v2) || !v2 || !gid_is_v4(&g))
            continue;
        if (addr != NULL && memcmp(g.raw + 12, &in, 4) != 0)
            continue;
        *out = g;
        return i;
    }
    return -1;
}

/* Lists d's IPv4 RoCE v2 GIDs, for the message when none fits. */
static void list_v4_gids(const ib_dev *d, char *out, size_t len)
{
    size_t n = 0;

    out[0] = '\0';
    for (int i = 0; i < d->pattr.gid_tbl_len && n + 24 < len; i++) {
        union ibv_gid g;
        char ip[INET_ADDRSTRLEN];
        int v2 = 0;

        if (!gid_entry(d->ctx, d->port, i, &g, &v2) || !v2 || !gid_is_v4(&g))
            continue;
        inet_ntop(AF_INET, g.raw + 12, ip, sizeof ip);
        n += (size_t)snprintf(out + n, len - n, "%s%d:%s", n ? " " : "", i, ip);
    }
    if (n == 0)
        snprintf(out, len, "none");
}

/* Chooses the GID a wire sends from: on RoCE, the RoCE v2 IPv4-mapped GID
 * of the link end's address (addr NULL: the first one); on InfiniBand,
 * entry 0 (the port GID; the LID addresses it too). */
static int gid_choose(ib_tp *tp, ib_wire *w, const char *addr)
{
    ib_dev *d = w->dev;
    char have[200];

    if (d->pattr.link_layer == IBV_LINK_LAYER_INFINIBAND) {
        w->gid_index = 0;
        if (ibv_query_gid(d->ctx, (uint8_t)d->port, 0, &w->gid) != 0)
            return weft__fail(tp->p->sink, WEFT_ETRANSPORT,
                              "rank %d: cannot read GID 0 of %s port %d",
                              tp->rank, d->name, d->port);
        return WEFT_OK;
    }
    w->gid_index =
        gid_find_v4(d->ctx, d->port, d->pattr.gid_tbl_len, addr, &w->gid);
    if (w->gid_index >= 0)
        return WEFT_OK;
    list_v4_gids(d, have, sizeof have);
    if (addr == NULL)
        return weft__fail(tp->p->sink, WEFT_ECONFIG,
                          "rank %d: RDMA device %s port %d has no RoCE "
                          "v2 IPv4 GID (is its netdev up with an IPv4 "
                          "address?)",
                          tp->rank, d->name, d->port);
    return weft__fail(tp->p->sink, WEFT_ECONFIG,
                      "rank %d: RDMA device %s port %d has no RoCE v2 "
                      "GID for address %s (the hostfile's address of "
                      "this link end); its IPv4 GIDs: %s",
                      tp->rank, d->name, d->port, addr, have);
}

/* Finds the device port whose GID table holds addr, for link ends that
 * name no device. */
static int dev_by_addr(ib_tp *tp, const char *addr, char *name, size_t len,
                       int *port)
{
    for (int i = 0; i < tp->ndevices; i++) {
        struct ibv_context *ctx = ibv_open_device(tp->devlist[i]);
        struct ibv_device_attr da;
        int hit = 0;

        if (ctx == NULL)
            continue;
        if (ibv_query_device(ctx, &da) == 0)
            for (int p = 1; p <= da.phys_port_cnt && !hit; p++) {
                struct ibv_port_attr pa;
                union ibv_gid g;
                if (ibv_query_port(ctx, (uint8_t)p, &pa) == 0 &&
                    gid_find_v4(ctx, p, pa.gid_tbl_len, addr, &g) >= 0) {
                    snprintf(name, len, "%s",
                             ibv_get_device_name(tp->devlist[i]));
                    *port = p;
                    hit = 1;
                }
            }
        ibv_close_device(ctx);
        if (hit)
            return WEFT_OK;
    }
    return weft__fail(tp->p->sink, WEFT_ECONFIG,
                      "rank %d: no RDMA device has a RoCE v2 GID for "
                      "address %s; name the device of this link end in "
                      "the hostfile (\"device\")",
                      tp->rank, addr);
}

/* The device and address a wire of link `link` uses on this host. */
static int wire_device(ib_tp *tp, uint32_t link, ib_wire *w)
{
    const weft__config *cfg = tp->p->cfg;
    int me = cfg->rank_host[tp->rank];
    const weft__link_end *e = NULL;
    char name[64], what[96];
    const char *addr = NULL;
    int port = IB_PORT_DEFAULT, rc;

    if (link != WEFT__LINK_LOOPBACK) {
        const weft__link *lk = &cfg->links[link];
        e = lk->end[0].host == me ? &lk->end[0] : &lk->end[1];
        snprintf(what, sizeof what, "the hostfile's links[%u]", link);
    } else {
        /* Ranks of one host: the host's first device, unless
         * WEFT_IB_DEVICE names one. */
        for (int l = 0; l < cfg->nlinks && e == NULL; l++)
            for (int k = 0; k < 2 && e == NULL; k++)
                if (cfg->links[l].end[k].host == me)
                    e = &cfg->links[l].end[k];
        snprintf(what, sizeof what, "%s",
                 cfg->ib_device[0] ? "WEFT_IB_DEVICE"
                                   : "this host's first link end");
    }
    if (link == WEFT__LINK_LOOPBACK && cfg->ib_device[0] != '\0') {
        if (parse_device(cfg->ib_device, name, sizeof name, &port) != 0)
            return weft__fail(tp->p->sink, WEFT_ECONFIG,
                              "rank %d: WEFT_IB_DEVICE=\"%s\": expected "
                              "a device name, or name:port",
                              tp->rank, cfg->ib_device);
        /* The link end's address, if that end is on this very device. */
        if (e != NULL && e->device[0] != '\0') {
            char en[64];
            int ep;
            if (parse_device(e->device, en, sizeof en, &ep) == 0 &&
                strcmp(en, name) == 0 && ep == port)
                addr = e->addr;
        }
    } else if (e != NULL && e->device[0] != '\0') {
        if (parse_device(e->device, name, sizeof name, &port) != 0)
            return weft__fail(tp->p->sink, WEFT_ECONFIG,
                              "rank %d: device \"%s\" in %s: expected a "
                              "device name, or name:port",
                              tp->rank, e->device, what);
        addr = e->addr;
    } else if (e != NULL) {
        if ((rc = dev_by_addr(tp, e->addr, name, sizeof name, &port)) != 0)
            return rc;
        addr = e->addr;
    } else {
        /* One host and no links: the first device there is. */
        if (tp->ndevices == 0)
            return weft__fail(tp->p->sink, WEFT_ECONFIG,
                              "rank %d: no RDMA device on this host", tp->rank);
        snprintf(name, sizeof name, "%s", ibv_get_device_name(tp->devlist[0]));
        snprintf(what, sizeof what, "the first device found");
    }
    if ((rc = dev_get(tp, name, port, what, &w->dev)) != 0)
        return rc;
    snprintf(w->addr, sizeof w->addr, "%s", addr != NULL ? addr : "-");
    if ((rc = gid_choose(tp, w, addr)) != 0)
        return rc;
    weft__log(WEFT__LOG_DEBUG, tp->rank,
              "wire %d to peer %d: device %s port %d, GID index %d (%s)", w->w,
              w->peer, w->dev->name, w->dev->port, w->gid_index, w->addr);
    return WEFT_OK;
}

/* ---- the data path ---- */

static void wire_failed(ib_wire *w, int err, const char *what,
                        const char *detail);

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

    if (due < half || tp->shut || tp->err != 0 || w->dead ||
        w->c_wr >= tp->credit_max || w->s_wr >= tp->sq_depth)
        return;
    memset(&wr, 0, sizeof wr);
    wr.wr_id = (uintptr_t)w | WR_CREDIT;
    wr.opcode = IBV_WR_SEND_WITH_IMM;
    wr.send_flags = IBV_SEND_SIGNALED;
    wr.imm_data = htonl((uint32_t)w->r_consumed);
    rc = ibv_post_send(w->qp, &wr, &bad);
    if (rc != 0) {
        wire_failed(w, WEFT_ETRANSPORT, "ibv_post_send (credit)", strerror(rc));
        return;
    }
    w->r_returned = w->r_consumed;
    w->s_wr++;
    w->c_wr++;
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

/* RDMA-writes len bytes of send slot `slot` into the same slot of the
 * peer's receive ring; the immediate carries the length. */
static int post_write(ib_wire *w, uint32_t slot, size_t len)
{
    ib_tp *tp = w->tp;
    size_t off = (size_t)slot * tp->slot_bytes;
    struct ibv_sge sge = {
        .addr = (uintptr_t)(w->sring + off),
        .length = (uint32_t)len,
        .lkey = w->smr->lkey,
    };
    struct ibv_send_wr wr, *bad = NULL;
    int rc;

    memset(&wr, 0, sizeof wr);
    wr.wr_id = (uintptr_t)w | WR_DATA;
    wr.sg_list = &sge;
    wr.num_sge = 1;
    wr.opcode = IBV_WR_RDMA_WRITE_WITH_IMM;
    wr.send_flags = IBV_SEND_SIGNALED;
    wr.imm_data = htonl((uint32_t)len);
    wr.wr.rdma.remote_addr = w->raddr + off;
    wr.wr.rdma.rkey = w->rkey;
    rc = ibv_post_send(w->qp, &wr, &bad);
    if (rc != 0) {
        wire_failed(w, WEFT_ETRANSPORT, "ibv_post_send (RDMA write)",
                    strerror(rc));
        return -1;
    }
    w->s_posted++;
    w->s_wr++;
    return 0;
}

/* Whether `count` completed slot writes have reached a frame's mark. Marks
 * live in a size_t (the frame's got field), so compare modulo its width:
 * a mark is never more than a ring of slots away from the count. */
static int slots_reached(uint64_t count, size_t mark)
{
    return (size_t)((size_t)count - mark) <= SIZE_MAX / 2;
}

/* Packs queued send frames into free slots and writes them, while the
 * peer has room (credits) and this side has free slots. A frame whose last
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

    while (w->sq_head != NULL && tp->err == 0 && !tp->shut && !w->dead) {
        uint32_t slot;
        char *dst;
        size_t fill = 0;

        if (w->s_posted - w->s_credit >= K || w->s_posted - w->s_done >= K ||
            w->s_wr >= tp->sq_depth)
            break;
        slot = (uint32_t)(w->s_posted % K);
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
        if (fill > 0 && post_write(w, slot, fill) != 0)
            return;
    }
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
static void process_dirty(ib_tp *tp)
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

static int post_recvs(ib_wire *w, int n)
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

/* ---- completions ---- */

static const char *wr_kind_name(int kind)
{
    switch (kind) {
    case WR_DATA:
        return "RDMA write";
    case WR_CREDIT:
        return "credit message";
    default:
        return "receive";
    }
}

/* The peer whose leaving failed the TCP side (weft__tcp_lost_peer), or -1;
 * -1 also where the failure was anything else (a relay connection), and
 * tcp_wait_ms then judges without knowing the peer. Only peers with wires
 * count: what a relayed peer sent went through the TCP side, which has
 * failed. */
static int tcp_lost_peer(const ib_tp *tp)
{
    int p = weft__tcp_lost_peer(tp->tcp);

    if (p < 0 || p >= tp->nranks || p == tp->rank)
        return -1;
    /* With a relayed peer in the job, relays may be in flight through the
     * failed TCP side, which the peer's wires do not show. */
    for (int q = 0; q < tp->nranks; q++)
        if (q != tp->rank && tp->peers[q].nwires == 0)
            return -1;
    return p;
}

/* Takes in the TCP side's news (a goodbye, a closed connection) before a
 * failure is judged: a peer that finalized makes its queue pairs fail
 * without that being an error here. Returns the TCP side's failure, which
 * is kept aside (tcp_err, tcp_msg) rather than made this transport's own:
 * poll_once judges it once what landed before it has been handed over.
 * The TCP side records it in its own error record (tp->boot), never on the
 * communicator's, so an operation that still succeeds leaves no failure
 * behind it (the message reaches the communicator when it is judged). */
static int tcp_news(ib_tp *tp)
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

/* Judges the TCP side's failure that tcp_news kept aside: from now on it
 * is this transport's, with the TCP side's message. */
static int tcp_judge(ib_tp *tp)
{
    ib_fail(tp, tp->tcp_err, "%s", tp->tcp_msg);
    return tp->err;
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
 * for the write to fail instead is no bound: rxe retries a write to a
 * queue pair that is gone for ever at IB_RETRY_CNT 7. A wire whose queue
 * pair failed since completes nothing more either.
 *
 * What this rank waits for from the other peers does not count as long as
 * it moves: an operation that they finish with the landed data succeeds.
 * But the TCP side reports only its first failure, so a peer that goes
 * after it (a survivor that failed on the loss and exited) is not seen
 * going: once nothing has moved (no completion, no post) for TCP_QUIET_MS,
 * the failure is judged whatever this rank waits for. That is also the
 * whole rule where the lost peer is not known. */
static int tcp_wait_ms(ib_tp *tp)
{
    uint64_t now = weft__now_ms();
    uint64_t end = tp->tcp_move_ms + TCP_QUIET_MS;
    uint64_t ack_end = tp->tcp_err_ms + TCP_ACK_GRACE_MS;

    if (now >= end)
        return 0;
    for (int p = 0; tp->tcp_lost >= 0 && p < tp->nranks; p++) {
        const ib_peer *pe = &tp->peers[p];

        for (int i = 0; i < pe->nwires; i++) {
            const ib_wire *w = &pe->w[i];
            int busy =
                w->rq_head != NULL || w->sq_head != NULL || w->wq_head != NULL;

            if (w->dead && busy)
                return 0;
            if (p != tp->tcp_lost)
                continue;
            if (w->rq_head != NULL || w->sq_head != NULL)
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

/* A wire's queue pair failed (what: the request or event, detail: why).
 * After a failure of the TCP side, or after its peer said goodbye, that is
 * expected: the wire is dead (it sends no more) and the failure is judged
 * elsewhere, once what landed on it has been handed over (tcp_wait_ms,
 * left_check). Otherwise it fails the transport. */
static void wire_failed(ib_wire *w, int err, const char *what,
                        const char *detail)
{
    ib_tp *tp = w->tp;
    char lname[32];

    if (tp->shut || tp->err != 0 || w->dead)
        return;
    if (tcp_news(tp) != 0 || tp->peers[w->peer].left) {
        weft__log(WEFT__LOG_DEBUG, tp->rank,
                  "wire %d to peer %d: %s failed after the peer %s: %s", w->w,
                  w->peer, what, tp->tcp_err != 0 ? "was lost" : "left",
                  detail);
        w->dead = 1;
        return;
    }
    ib_fail(tp, err,
            "rank %d: %s to/from peer %d on wire %d (%s, device %s port %d, "
            "address %s) failed: %s",
            tp->rank, what, w->peer, w->w, link_name(w, lname, sizeof lname),
            w->dev->name, w->dev->port, w->addr, detail);
}

static void wc_failed(ib_wire *w, int kind, const struct ibv_wc *wc)
{
    char detail[160];

    snprintf(detail, sizeof detail, "%s (status %d, vendor error 0x%x)",
             ibv_wc_status_str(wc->status), (int)wc->status, wc->vendor_err);
    wire_failed(w, WEFT_ETRANSPORT, wr_kind_name(kind), detail);
}

static void wc_recv(ib_wire *w, const struct ibv_wc *wc)
{
    ib_tp *tp = w->tp;
    uint32_t imm = ntohl(wc->imm_data);
    char detail[96];
    int rc;

    if (!tp->shut && (rc = post_recvs(w, 1)) != 0) {
        wire_failed(w, WEFT_ETRANSPORT, "ibv_post_recv", strerror(rc));
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
            wire_failed(w, WEFT_ETRANSPORT, "receive", detail);
            return;
        }
        w->r_len[w->r_landed % (uint64_t)tp->slots] = imm;
        w->r_landed++;
    } else if (wc->opcode == IBV_WC_RECV && (wc->wc_flags & IBV_WC_WITH_IMM)) {
        /* Credits: the peer's count of consumed slots, modulo 2^32. */
        uint64_t c = w->s_credit + (uint32_t)(imm - (uint32_t)w->s_credit);
        if (c > w->s_posted) {
            wire_failed(w, WEFT_ETRANSPORT, "receive",
                        "credits for slots never written (protocol error)");
            return;
        }
        w->s_credit = c;
    } else {
        snprintf(detail, sizeof detail,
                 "unexpected completion opcode %d (protocol error)",
                 (int)wc->opcode);
        wire_failed(w, WEFT_ETRANSPORT, "receive", detail);
        return;
    }
    tp->events++;
    wire_kick(w);
}

static void wc_handle(ib_tp *tp, const struct ibv_wc *wc)
{
    ib_wire *w = (ib_wire *)(uintptr_t)(wc->wr_id & ~(uint64_t)WR_KIND_MASK);
    int kind = (int)(wc->wr_id & WR_KIND_MASK);

    switch (kind) {
    case WR_DATA:
        w->s_wr--;
        break;
    case WR_CREDIT:
        w->s_wr--;
        w->c_wr--;
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
    if (kind == WR_DATA)
        w->s_done++;
    /* A free slot or send request: queued sends or credits may go. */
    tp->events++;
    wire_kick(w);
}

static void cq_poll_all(ib_tp *tp)
{
    for (ib_dev *d = tp->devs; d != NULL; d = d->next) {
        struct ibv_wc wc[CQ_BATCH];
        int n;

        if (d->cq == NULL)
            continue;
        do {
            n = ibv_poll_cq(d->cq, CQ_BATCH, wc);
            for (int i = 0; i < n; i++)
                wc_handle(tp, &wc[i]);
        } while (n == CQ_BATCH);
        if (n < 0 && !tp->shut)
            ib_fail(tp, WEFT_ETRANSPORT,
                    "rank %d: ibv_poll_cq on RDMA device %s failed", tp->rank,
                    d->name);
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
        case IBV_EVENT_QP_ACCESS_ERR:
            wire_failed((ib_wire *)ae.element.qp->qp_context, WEFT_ETRANSPORT,
                        "queue pair", what);
            break;
        case IBV_EVENT_PORT_ERR:
            /* A port of the device that this context does not use. */
            if (ae.element.port_num != d->port)
                break;
            /* fall through */
        case IBV_EVENT_CQ_ERR:
        case IBV_EVENT_DEVICE_FATAL:
            if (!tp->shut)
                ib_fail(tp, WEFT_ETRANSPORT,
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

    cq_poll_all(tp);
    process_dirty(tp);
    for (int p = 0; p < tp->nranks && tp->err == 0; p++) {
        ib_peer *pe = &tp->peers[p];
        if (!pe->left)
            continue;
        for (int i = 0; i < pe->nwires && tp->err == 0; i++) {
            ib_wire *w = &pe->w[i];
            int unsent = w->sq_head != NULL || (w->bye && w->wq_head != NULL);
            if ((w->rq_head != NULL && w->r_consumed == w->r_landed) || unsent)
                ib_fail(tp, WEFT_EPEER,
                        "rank %d: peer %d finalized while this rank still "
                        "had frames to %s it on wire %d (%s, device %s)",
                        tp->rank, p, unsent ? "send to" : "receive from", w->w,
                        link_name(w, lname, sizeof lname), w->dev->name);
        }
    }
}

/* One pass that never blocks: completions, wires, the TCP side. */
static int poll_once(ib_tp *tp)
{
    unsigned ev = tp->events;

    cq_poll_all(tp);
    process_dirty(tp);
    if (tp->err != 0)
        return tp->err;
    if (tcp_news(tp) != 0) {
        /* A peer's connection closed. What it wrote before it completed
         * an operation was acknowledged before that completion, so its
         * completions are on the CQ by now, even where the poll above just
         * missed them: look once more, and hand over everything before
         * judging, so that an operation it finishes still succeeds (as
         * over TCP, where bytes sent before a close arrive before it). The
         * caller looks at its operation after each pass that moved
         * anything, and calls again if it still waits; a pass that moved
         * nothing judges the failure once this rank waits for something
         * from the lost peer that cannot come (tcp_wait_ms; ib_block
         * sleeps no longer than it says). */
        cq_poll_all(tp);
        process_dirty(tp);
        if (tp->err != 0)
            return tp->err;
        if (tp->events != ev) {
            tp->tcp_move_ms = weft__now_ms();
            return WEFT_OK;
        }
        return tcp_wait_ms(tp) != 0 ? WEFT_OK : tcp_judge(tp);
    }
    if (tp->nleft > 0)
        left_check(tp);
    return tp->err;
}

/* Sleeps until a completion, a TCP event, a wake() or the deadline. */
static int ib_block(ib_tp *tp, uint64_t deadline_ms)
{
    unsigned ev = tp->events;
    struct pollfd pfd[1 + 2 * MAX_DEVS];
    ib_dev *owner[1 + 2 * MAX_DEVS];
    uint64_t now;
    int n = 0, tmo, tt, rc;

    for (ib_dev *d = tp->devs; d != NULL; d = d->next) {
        if (d->cq == NULL || d->armed)
            continue;
        if ((rc = ibv_req_notify_cq(d->cq, 0)) != 0) {
            ib_fail(tp, WEFT_ETRANSPORT,
                    "rank %d: ibv_req_notify_cq on RDMA device %s: %s",
                    tp->rank, d->name, strerror(rc));
            return tp->err;
        }
        d->armed = 1;
    }
    /* Completions that arrived between the last poll and the arming raise
     * no event: look once more before sleeping. */
    if ((rc = poll_once(tp)) != 0)
        return rc;
    if (tp->events != ev)
        return WEFT_OK;
    now = weft__now_ms();
    if (now >= deadline_ms)
        return WEFT_OK;
    tmo = deadline_ms - now > 60000 ? 60000 : (int)(deadline_ms - now);
    tt = weft__tcp_timeout(tp->tcp);
    if (tt >= 0 && tt < tmo)
        tmo = tt;
    if (tp->tcp_err != 0 && (tt = tcp_wait_ms(tp)) < tmo)
        tmo = tt;
    pfd[n].fd = weft__tcp_fd(tp->tcp);
    pfd[n].events = POLLIN;
    owner[n++] = NULL;
    for (ib_dev *d = tp->devs; d != NULL && n + 2 <= 1 + 2 * MAX_DEVS;
         d = d->next) {
        if (d->cq == NULL)
            continue;
        pfd[n].fd = d->ch->fd;
        pfd[n].events = POLLIN;
        owner[n++] = d;
        pfd[n].fd = d->ctx->async_fd;
        pfd[n].events = POLLIN;
        owner[n++] = d;
    }
    rc = poll(pfd, (nfds_t)n, tmo);
    if (rc < 0 && errno != EINTR) {
        ib_fail(tp, WEFT_ETRANSPORT, "rank %d: poll: %s", tp->rank,
                strerror(errno));
        return tp->err;
    }
    for (int i = 1; rc > 0 && i < n; i++) {
        if (pfd[i].revents == 0)
            continue;
        if (pfd[i].fd == owner[i]->ch->fd)
            cq_events(owner[i]);
        else
            async_events(tp, owner[i]);
    }
    return tp->err;
}

static int ib_progress(weft__tp *t, uint64_t deadline_ms)
{
    ib_tp *tp = (ib_tp *)t;
    unsigned ev = tp->events;
    int rc;

    if (tp->err != 0)
        return tp->err;
    if (tp->shut)
        return WEFT_EABORTED;
    if ((rc = poll_once(tp)) != 0)
        return rc;
    if (tp->events != ev)
        return WEFT_OK;
    /* With a core to spare, poll a little before sleeping: a completion
     * channel wake-up costs more than a short message takes. */
    if (tp->spin_ns > 0) {
        uint64_t t0 = weft__now_ns();
        do {
            sched_yield();
            if ((rc = poll_once(tp)) != 0)
                return rc;
            if (tp->events != ev)
                return WEFT_OK;
        } while (weft__now_ns() - t0 < tp->spin_ns);
    }
    for (;;) {
        if (weft__now_ms() >= deadline_ms)
            return WEFT_ETIMEDOUT;
        if ((rc = ib_block(tp, deadline_ms)) != 0)
            return rc;
        if ((rc = poll_once(tp)) != 0)
            return rc;
        if (tp->events != ev)
            return WEFT_OK;
    }
}

/* ---- posting ---- */

static int post_target(ib_tp *tp, int p, int wi, ib_wire **out)
{
    if (tp->err != 0)
        return tp->err;
    if (tp->shut)
        return WEFT_EABORTED;
    if (p < 0 || p >= tp->nranks || wi < 0 || wi >= tp->peers[p].nwires)
        return weft__fail(tp->p->sink, WEFT_ETRANSPORT,
                          "rank %d: no wire %d to peer %d", tp->rank, wi, p);
    *out = &tp->peers[p].w[wi];
    return WEFT_OK;
}

static int ib_post_send(weft__tp *t, int p, int wi, weft__xfer *x)
{
    ib_tp *tp = (ib_tp *)t;
    ib_wire *w = NULL;
    int rc = post_target(tp, p, wi, &w);

    if (rc != 0)
        return rc;
    /* A wire that died after a failure of the TCP side takes the frame:
     * that failure is judged once what landed is handed over. */
    if (tp->peers[p].left || (w->dead && tp->tcp_err == 0)) {
        ib_fail(tp, WEFT_EPEER,
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
    wire_kick(w);
    return WEFT_OK;
}

static int ib_post_recv(weft__tp *t, int p, int wi, weft__xfer *x)
{
    ib_tp *tp = (ib_tp *)t;
    ib_wire *w = NULL;
    int rc = post_target(tp, p, wi, &w);

    if (rc != 0)
        return rc;
    /* Allowed after the peer left: what it sent before may have landed
     * (left_check fails what cannot be filled). */
    x->got = 0;
    if (tp->tcp_err != 0)
        tp->tcp_move_ms = weft__now_ms();
    weft__xq_push(&w->rq_head, &w->rq_tail, x);
    wire_kick(w);
    return WEFT_OK;
}

static int ib_nwires(weft__tp *t, int p)
{
    ib_tp *tp = (ib_tp *)t;
    return p >= 0 && p < tp->nranks ? tp->peers[p].nwires : 0;
}

static void ib_wake(weft__tp *t)
{
    /* The TCP transport's wake-up makes weft__tcp_fd() readable, which
     * ib_block() sleeps on. */
    weft__tcp_ops.wake(((ib_tp *)t)->tcp);
}

/* The relay runs on the TCP side: once that has failed, nothing relayed
 * can arrive any more, so its failure is judged at once. */
static int ib_relay_send(weft__tp *t, int peer, weft__xfer *x)
{
    ib_tp *tp = (ib_tp *)t;

    if (tp->err == 0 && tp->tcp_err != 0)
        tcp_judge(tp);
    return tp->err != 0 ? tp->err : weft__tcp_ops.relay_send(tp->tcp, peer, x);
}

static int ib_relay_recv(weft__tp *t, int peer, weft__xfer *x)
{
    ib_tp *tp = (ib_tp *)t;

    if (tp->err == 0 && tp->tcp_err != 0)
        tcp_judge(tp);
    return tp->err != 0 ? tp->err : weft__tcp_ops.relay_recv(tp->tcp, peer, x);
}

static void ib_shutdown(weft__tp *t)
{
    ib_tp *tp = (ib_tp *)t;

    if (tp == NULL)
        return;
    tp->shut = 1;
    /* The queue pairs stop touching the rings and flush what they hold;
     * the flushed completions are dropped. */
    for (int p = 0; tp->peers != NULL && p < tp->nranks; p++)
        for (int i = 0; i < tp->peers[p].nwires; i++) {
            ib_wire *w = &tp->peers[p].w[i];
            if (w->qp != NULL) {
                struct ibv_qp_attr a = {.qp_state = IBV_QPS_ERR};
                int rc = ibv_modify_qp(w->qp, &a, IBV_QP_STATE);
                if (rc != 0)
                    weft__log(WEFT__LOG_WARN, tp->rank,
                              "wire %d to peer %d: cannot move its queue "
                              "pair to the error state: %s",
                              w->w, w->peer, strerror(rc));
            }
            w->sq_head = w->sq_tail = NULL;
            w->wq_head = w->wq_tail = NULL;
            w->rq_head = w->rq_tail = NULL;
            w->dirty = 0;
            w->dirty_next = NULL;
        }
    tp->dirty = NULL;
    if (tp->tcp != NULL)
        weft__tcp_ops.shutdown(tp->tcp);
}

/* ---- set-up ---- */

/* The links joining this rank's host and peer p's, in the order the TCP
 * transport numbers its wires: loopback for ranks of one host, else every
 * link between the two hosts in hostfile order. */
static int peer_links(const weft__config *cfg, int me, int p, uint32_t *out,
                      int max)
{
    int hm = cfg->rank_host[me], hp = cfg->rank_host[p], n = 0;

    if (hm == hp) {
        out[0] = WEFT__LINK_LOOPBACK;
        return 1;
    }
    for (int l = 0; l < cfg->nlinks; l++) {
        const weft__link *lk = &cfg->links[l];
        if (weft__link_joins(lk, hm, hp) && n < max)
            out[n++] = (uint32_t)l;
    }
    return n;
}

/* Decides every wire: its link, device port and GID. */
static int plan(ib_tp *tp)
{
    const weft__config *cfg = tp->p->cfg;
    int W = tp->wires, rc;

    tp->peers = calloc((size_t)tp->nranks, sizeof *tp->peers);
    if (tp->peers == NULL)
        return WEFT_ENOMEM;
    for (int p = 0; p < tp->nranks; p++) {
        ib_peer *pe = &tp->peers[p];
        uint32_t links[WEFT__MAX_WIRES];
        int n = p == tp->rank ? 0 : weft__tcp_ops.nwires(tp->tcp, p), nl;

        if (n == 0)
            continue;
        nl = peer_links(cfg, tp->rank, p, links, WEFT__MAX_WIRES);
        if (nl != n)
            return weft__fail(tp->p->sink, WEFT_ETRANSPORT,
                              "rank %d: %d TCP wires to peer %d but %d "
                              "links (internal error)",
                              tp->rank, n, p, nl);
        if (n * W > WEFT__MAX_WIRES)
            return weft__fail(tp->p->sink, WEFT_ECONFIG,
                              "rank %d: %d wires to peer %d, more than "
                              "%d",
                              tp->rank, n * W, p, WEFT__MAX_WIRES);
        pe->links = calloc((size_t)n, sizeof *pe->links);
        pe->w = calloc((size_t)(n * W), sizeof *pe->w);
        if (pe->links == NULL || pe->w == NULL)
            return WEFT_ENOMEM;
        pe->nlinks = n;
        pe->nwires = n * W;
        for (int i = 0; i < n; i++) {
            ib_link *lk = &pe->links[i];

            lk->tp = tp;
            lk->peer = p;
            lk->twire = i;
            lk->link = links[i];
            for (int k = 0; k < W; k++) {
                ib_wire *w = &pe->w[i * W + k];

                w->tp = tp;
                w->peer = p;
                w->w = i * W + k;
                w->link = links[i];
                if ((rc = wire_device(tp, links[i], w)) != 0)
                    return rc;
                w->dev->nqp++;
            }
        }
    }
    return WEFT_OK;
}

/* Checks, before anything is created, that the device can hold what this
 * rank and the other ranks of its host put on it (ib_budget.h). */
static int dev_budget(ib_tp *tp, const ib_dev *d)
{
    const struct ibv_device_attr *a = &d->attr;
    const weft__config *cfg = tp->p->cfg;
    weft__ib_limits lim = {
        .max_qp = a->max_qp,
        .max_mr = a->max_mr,
        .max_cq = a->max_cq,
        .max_pd = a->max_pd,
        .max_cqe = a->max_cqe,
        .max_qp_wr = a->max_qp_wr,
        .max_mr_size = a->max_mr_size,
    };
    weft__ib_needs need = {
        .nqp = d->nqp,
        .sq_depth = tp->sq_depth,
        .rq_depth = tp->rq_depth,
        .ring = tp->slot_bytes * (size_t)tp->slots,
        /* Every rank of a host builds the same wires on the same devices
         * (wire_device() depends on the host and WEFT_IB_DEVICE only). */
        .local_ranks = cfg->hosts[cfg->rank_host[tp->rank]].nranks,
    };
    char msg[512];

    if (weft__ib_budget(&lim, &need, tp->rank, d->name, msg, sizeof msg) != 0)
        return weft__fail(tp->p->sink, WEFT_ECONFIG, "%s", msg);
    return WEFT_OK;
}

static int dev_setup(ib_tp *tp, ib_dev *d)
{
    int cqe = d->nqp * (tp->sq_depth + tp->rq_depth);

    if ((d->pd = ibv_alloc_pd(d->ctx)) == NULL)
        return weft__fail(tp->p->sink, WEFT_ENOMEM,
                          "rank %d: ibv_alloc_pd on RDMA device %s: %s",
                          tp->rank, d->name, strerror(errno));
    if ((d->ch = ibv_create_comp_channel(d->ctx)) == NULL)
        return weft__fail(tp->p->sink, WEFT_ETRANSPORT,
                          "rank %d: ibv_create_comp_channel on RDMA "
                          "device %s: %s",
                          tp->rank, d->name, strerror(errno));
    if ((d->cq = ibv_create_cq(d->ctx, cqe, NULL, d->ch, 0)) == NULL)
        return weft__fail(tp->p->sink, WEFT_ENOMEM,
                          "rank %d: ibv_create_cq of %d entries on RDMA "
                          "device %s: %s",
                          tp->rank, cqe, d->name, strerror(errno));
    /* progress() polls, then sleeps in poll(): reads must not block. */
    if (set_nonblock(d->ch->fd) != 0 || set_nonblock(d->ctx->async_fd) != 0)
        return weft__fail(tp->p->sink, WEFT_ETRANSPORT,
                          "rank %d: cannot make the event fds of RDMA "
                          "device %s non-blocking: %s",
                          tp->rank, d->name, strerror(errno));
    return WEFT_OK;
}

static int reg_failed(ib_tp *tp, const ib_dev *d, size_t bytes, int err)
{
    struct rlimit rl;
    char lim[48] = "unknown";

    if (getrlimit(RLIMIT_MEMLOCK, &rl) == 0) {
        if (rl.rlim_cur == RLIM_INFINITY)
            snprintf(lim, sizeof lim, "unlimited");
        else
            snprintf(lim, sizeof lim, "%llu bytes",
                     (unsigned long long)rl.rlim_cur);
    }
    return weft__fail(tp->p->sink, WEFT_ENOMEM,
                      "rank %d: cannot register %zu bytes with RDMA "
                      "device %s: %s (locked-memory limit: %s; raise "
                      "it with ulimit -l, or lower WEFT_IB_SLOTS)",
                      tp->rank, bytes, d->name, strerror(err), lim);
}

/* Rings, their registrations and the queue pair, moved to INIT, with its
 * receives posted. */
static int wire_setup(ib_tp *tp, ib_wire *w)
{
    ib_dev *d = w->dev;
    size_t ring = tp->slot_bytes * (size_t)tp->slots;
    struct ibv_qp_init_attr qia = {
        .qp_context = w,
        .send_cq = d->cq,
        .recv_cq = d->cq,
        .cap = {.max_send_wr = (uint32_t)tp->sq_depth,
                .max_recv_wr = (uint32_t)tp->rq_depth,
                .max_send_sge = 1,
                .max_recv_sge = 1},
        .qp_type = IBV_QPT_RC,
        .sq_sig_all = 0,
    };
    struct ibv_qp_attr qa = {
        .qp_state = IBV_QPS_INIT,
        .pkey_index = 0,
        .port_num = (uint8_t)d->port,
        .qp_access_flags = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE,
    };
    void *p;
    int rc;

    if (posix_memalign(&p, 4096, ring) != 0)
        return WEFT_ENOMEM;
    w->sring = p;
    if (posix_memalign(&p, 4096, ring) != 0)
        return WEFT_ENOMEM;
    w->rring = p;
    w->r_len = calloc((size_t)tp->slots, sizeof *w->r_len);
    if (w->r_len == NULL)
        return WEFT_ENOMEM;
    if ((w->smr = ibv_reg_mr(d->pd, w->sring, ring, IBV_ACCESS_LOCAL_WRITE)) ==
        NULL)
        return reg_failed(tp, d, ring, errno);
    if ((w->rmr = ibv_reg_mr(d->pd, w->rring, ring,
                             IBV_ACCESS_LOCAL_WRITE |
                                 IBV_ACCESS_REMOTE_WRITE)) == NULL)
        return reg_failed(tp, d, ring, errno);
    if ((w->qp = ibv_create_qp(d->pd, &qia)) == NULL)
        return weft__fail(tp->p->sink, WEFT_ETRANSPORT,
                          "rank %d: ibv_create_qp on RDMA device %s for "
                          "wire %d to peer %d: %s",
                          tp->rank, d->name, w->w, w->peer, strerror(errno));
    if ((rc = ibv_modify_qp(w->qp, &qa,
                            IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT |
                                IBV_QP_ACCESS_FLAGS)) != 0)
        return weft__fail(tp->p->sink, WEFT_ETRANSPORT,
                          "rank %d: queue pair of wire %d to peer %d on "
                          "%s: cannot move to INIT: %s",
                          tp->rank, w->w, w->peer, d->name, strerror(rc));
    /* Any 24-bit start will do; a different one per connection keeps a
     * stale packet of an earlier job from looking current. */
    w->psn = (uint32_t)((weft__now_ns() ^ ((uint64_t)(uintptr_t)w >> 4) ^
                         ((uint64_t)getpid() << 8)) &
                        0xffffff);
    if ((rc = post_recvs(w, tp->rq_depth)) != 0)
        return weft__fail(tp->p->sink, WEFT_ETRANSPORT,
                          "rank %d: ibv_post_recv on %s: %s", tp->rank, d->name,
                          strerror(rc));
    return WEFT_OK;
}

/* What a peer needs to reach this end of a link: a header, then one entry
 * per wire (network byte order). */
static void pack_link(ib_tp *tp, ib_link *lk)
{
    ib_peer *pe = &tp->peers[lk->peer];
    uint8_t *b = lk->out;

    weft__put_be32(b, IB_MAGIC);
    weft__put_be32(b + 4, IB_VERSION);
    weft__put_be32(b + 8, (uint32_t)tp->rank);
    weft__put_be32(b + 12, (uint32_t)lk->peer);
    weft__put_be32(b + 16, lk->link);
    weft__put_be32(b + 20, (uint32_t)tp->wires);
    weft__put_be32(b + 24, (uint32_t)tp->slots);
    weft__put_be32(b + 28, (uint32_t)tp->slot_bytes);
    for (int k = 0; k < tp->wires; k++) {
        const ib_wire *w = &pe->w[lk->twire * tp->wires + k];
        uint8_t *e = b + IB_HDR_BYTES + k * IB_QP_BYTES;

        memset(e, 0, IB_QP_BYTES);
        weft__put_be32(e, w->qp->qp_num);
        weft__put_be32(e + 4, w->psn);
        weft__put_be32(e + 8, w->dev->pattr.lid);
        weft__put_be32(e + 12, (uint32_t)w->dev->pattr.active_mtu);
        memcpy(e + 16, w->gid.raw, 16);
        weft__put_be64(e + 32, (uint64_t)(uintptr_t)w->rring);
        weft__put_be32(e + 40, w->rmr->rkey);
    }
}

static int check_header(ib_tp *tp, const ib_link *lk)
{
    const uint8_t *b = lk->in;

    if (weft__get_be32(b) != IB_MAGIC || weft__get_be32(b + 4) != IB_VERSION ||
        weft__get_be32(b + 8) != (uint32_t)lk->peer ||
        weft__get_be32(b + 12) != (uint32_t)tp->rank)
        return weft__fail(tp->p->sink, WEFT_ETRANSPORT,
                          "rank %d: peer %d sent a garbled ibverbs "
                          "set-up message on TCP wire %d",
                          tp->rank, lk->peer, lk->twire);
    if (weft__get_be32(b + 16) != lk->link)
        return weft__fail(tp->p->sink, WEFT_ETRANSPORT,
                          "rank %d: peer %d's TCP wire %d runs on link "
                          "%d, this rank's on link %d (internal error)",
                          tp->rank, lk->peer, lk->twire,
                          (int)weft__get_be32(b + 16), (int)lk->link);
    if (weft__get_be32(b + 20) != (uint32_t)tp->wires ||
        weft__get_be32(b + 24) != (uint32_t)tp->slots ||
        weft__get_be32(b + 28) != (uint32_t)tp->slot_bytes)
        return weft__fail(tp->p->sink, WEFT_ECONFIG,
                          "rank %d: peer %d runs WEFT_WIRES=%u, "
                          "WEFT_IB_SLOTS=%u, WEFT_IB_SLOT_BYTES=%u, this "
                          "rank %d, %d, %zu; give every rank the same",
                          tp->rank, lk->peer, weft__get_be32(b + 20),
                          weft__get_be32(b + 24), weft__get_be32(b + 28),
                          tp->wires, tp->slots, tp->slot_bytes);
    return WEFT_OK;
}

/* Connects a wire's queue pair to the peer's (entry e): INIT -> RTR ->
 * RTS. */
static int wire_connect(ib_tp *tp, ib_wire *w, const uint8_t *e)
{
    enum ibv_mtu mtu = w->dev->pattr.active_mtu;
    struct ibv_qp_attr a;
    int rc;

    if ((enum ibv_mtu)weft__get_be32(e + 12) < mtu)
        mtu = (enum ibv_mtu)weft__get_be32(e + 12);
    w->raddr = weft__get_be64(e + 32);
    w->rkey = weft__get_be32(e + 40);
    memset(&a, 0, sizeof a);
    a.qp_state = IBV_QPS_RTR;
    a.path_mtu = mtu;
    a.dest_qp_num = weft__get_be32(e);
    a.rq_psn = weft__get_be32(e + 4);
    a.max_dest_rd_atomic = 1;
    a.min_rnr_timer = 12;
    a.ah_attr.is_global = 1;
    memcpy(a.ah_attr.grh.dgid.raw, e + 16, 16);
    a.ah_attr.grh.sgid_index = (uint8_t)w->gid_index;
    a.ah_attr.grh.hop_limit = IB_HOP_LIMIT;
    a.ah_attr.dlid = (uint16_t)weft__get_be32(e + 8);
    a.ah_attr.sl = 0;
    a.ah_attr.port_num = (uint8_t)w->dev->port;
    rc = ibv_modify_qp(w->qp, &a,
                       IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU |
                           IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
                           IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER);
    if (rc == 0) {
        memset(&a, 0, sizeof a);
        a.qp_state = IBV_QPS_RTS;
        a.timeout = IB_QP_TIMEOUT;
        a.retry_cnt = IB_RETRY_CNT;
        a.rnr_retry = IB_RNR_RETRY;
        a.sq_psn = w->psn;
        a.max_rd_atomic = 1;
        rc = ibv_modify_qp(w->qp, &a,
                           IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT |
                               IBV_QP_RNR_RETRY | IBV_QP_SQ_PSN |
                               IBV_QP_MAX_QP_RD_ATOMIC);
    }
    if (rc != 0) {
        char lname[32];
        return weft__fail(tp->p->sink, WEFT_ETRANSPORT,
                          "rank %d: cannot connect the queue pair of "
                          "wire %d to peer %d (%s, device %s port %d, "
                          "GID index %d): %s",
                          tp->rank, w->w, w->peer,
                          link_name(w, lname, sizeof lname), w->dev->name,
                          w->dev->port, w->gid_index, strerror(rc));
    }
    return WEFT_OK;
}

static void setup_done(weft__xfer *x)
{
    ((ib_link *)x->arg)->tp->setup_pending--;
}

/* The peer's goodbye on one link: it finalized after its writes were
 * acknowledged, and says per wire of the link how many of this rank's slot
 * writes had landed there. A frame those cover has arrived even where the
 * write's acknowledgement was lost on the way and its retransmission will
 * find the peer's queue pair gone (tx_done). */
static void bye_done(weft__xfer *x)
{
    ib_link *lk = x->arg;
    ib_tp *tp = lk->tp;
    ib_peer *pe = &tp->peers[lk->peer];

    tp->events++;
    if (lk->in[0] != 'B') {
        ib_fail(tp, WEFT_ETRANSPORT,
                "rank %d: peer %d sent garbage on its TCP wire %d", tp->rank,
                lk->peer, lk->twire);
        return;
    }
    for (int k = 0; k < tp->wires; k++) {
        ib_wire *w = &pe->w[lk->twire * tp->wires + k];
        /* The count modulo 2^32: at most s_posted, and at most a ring
         * below it (the peer has landed at least what it consumed, which
         * is what our credits say). It may be below s_done where a device
         * acknowledges a write before it reports the write's completion to
         * its owner. */
        uint32_t behind =
            (uint32_t)w->s_posted - weft__get_be32(lk->in + 1 + 4 * k);

        if (behind > (uint32_t)tp->slots) {
            ib_fail(tp, WEFT_ETRANSPORT,
                    "rank %d: peer %d's goodbye on TCP wire %d counts "
                    "landed slots on wire %d that do not fit what this rank "
                    "wrote (protocol error)",
                    tp->rank, lk->peer, lk->twire, w->w);
            return;
        }
        w->s_landed = w->s_posted - behind;
        w->bye = 1;
        wire_kick(w);
    }
    if (!pe->left) {
        pe->left = 1;
        tp->nleft++;
        weft__log(WEFT__LOG_DEBUG, tp->rank, "peer %d finalized", lk->peer);
    }
}

static int tcp_frame(ib_tp *tp, ib_link *lk, int recv, weft__xfer *x, void *buf,
                     size_t len, void (*done)(weft__xfer *))
{
    int rc;

    memset(x, 0, sizeof *x);
    x->done = done;
    x->arg = lk;
    x->buf = buf;
    x->len = len;
    rc = recv ? weft__tcp_ops.post_recv(tp->tcp, lk->peer, lk->twire, x)
              : weft__tcp_ops.post_send(tp->tcp, lk->peer, lk->twire, x);
    if (rc == 0 && done == setup_done)
        tp->setup_pending++;
    return rc;
}

/* Runs the TCP side until every set-up frame has completed. */
static int setup_wait(ib_tp *tp, uint64_t deadline, const char *what)
{
    while (tp->setup_pending > 0) {
        int rc = weft__tcp_ops.progress(tp->tcp, deadline);
        if (rc == WEFT_ETIMEDOUT)
            return weft__fail(tp->p->sink, WEFT_ETIMEDOUT,
                              "rank %d: ibverbs set-up (%s) with the "
                              "peers did not finish within "
                              "WEFT_CONNECT_TIMEOUT_MS=%d ms",
                              tp->rank, what, tp->p->cfg->connect_timeout_ms);
        if (rc != 0)
            return rc;
    }
    return WEFT_OK;
}

#define FOR_EACH_LINK(tp, pe, lk)                                              \
    for (ib_peer *pe = (tp)->peers; pe < (tp)->peers + (tp)->nranks; pe++)     \
        for (ib_link *lk = pe->links; lk < pe->links + pe->nlinks; lk++)

/* Exchanges the queue pairs' addresses over the TCP wires, connects them,
 * and waits until the peers have connected theirs (a write to a queue pair
 * not yet ready to receive would be dropped and retried). */
static int exchange(ib_tp *tp, uint64_t deadline)
{
    size_t body = (size_t)tp->wires * IB_QP_BYTES;
    int rc;

    FOR_EACH_LINK(tp, pe, lk)
    {
        lk->out = malloc(IB_HDR_BYTES + body);
        lk->in = malloc(IB_HDR_BYTES + body);
        if (lk->out == NULL || lk->in == NULL)
            return WEFT_ENOMEM;
        pack_link(tp, lk);
        if ((rc = tcp_frame(tp, lk, 0, &lk->sx, lk->out, IB_HDR_BYTES + body,
                            setup_done)) != 0 ||
            (rc = tcp_frame(tp, lk, 1, &lk->rx, lk->in, IB_HDR_BYTES,
                            setup_done)) != 0)
            return rc;
    }
    if ((rc = setup_wait(tp, deadline, "headers")) != 0)
        return rc;
    /* The header first: a peer with other settings must not have its
     * entries read as something else. */
    FOR_EACH_LINK(tp, pe, lk)
    {
        if ((rc = check_header(tp, lk)) != 0)
            return rc;
        if ((rc = tcp_frame(tp, lk, 1, &lk->rx, lk->in + IB_HDR_BYTES, body,
                            setup_done)) != 0)
            return rc;
    }
    if ((rc = setup_wait(tp, deadline, "queue pairs")) != 0)
        return rc;
    FOR_EACH_LINK(tp, pe, lk)
    {
        for (int k = 0; k < tp->wires; k++) {
            ib_wire *w = &pe->w[lk->twire * tp->wires + k];
            rc = wire_connect(tp, w, lk->in + IB_HDR_BYTES + k * IB_QP_BYTES);
            if (rc != 0)
                return rc;
        }
        lk->ready_out = 'R';
        if ((rc = tcp_frame(tp, lk, 0, &lk->bye_tx, &lk->ready_out, 1,
                            setup_done)) != 0 ||
            (rc = tcp_frame(tp, lk, 1, &lk->bye_rx, &lk->ready_in, 1,
                            setup_done)) != 0)
            return rc;
    }
    if ((rc = setup_wait(tp, deadline, "ready")) != 0)
        return rc;
    FOR_EACH_LINK(tp, pe, lk)
    {
        if (lk->ready_in != 'R')
            return weft__fail(tp->p->sink, WEFT_ETRANSPORT,
                              "rank %d: peer %d sent garbage instead of "
                              "ready on TCP wire %d",
                              tp->rank, lk->peer, lk->twire);
        /* From now on a receive stays posted on every TCP wire: the peer's
         * goodbye completes it, and a peer that dies without one closes the
         * connection under it (WEFT_EPEER at once). The set-up message's
         * buffer is free now. */
        if ((rc = tcp_frame(tp, lk, 1, &lk->bye_rx, lk->in,
                            IB_BYE_BYTES(tp->wires), bye_done)) != 0)
            return rc;
    }
    return WEFT_OK;
}

/* ---- tear-down ---- */

/* Before the goodbye: every write this rank made must be acknowledged, or
 * the peer could miss the end of what it waits for once the queue pairs are
 * gone. The frames of completed operations are acknowledged already (a
 * send frame completes only then); what may be left are credit messages
 * and the writes of frames that belonged to no operation. Bounded, since a
 * peer that is stopped never acknowledges. */
static void drain_writes(ib_tp *tp)
{
    int tmo =
        tp->p->timeout_ms < DRAIN_MAX_MS ? tp->p->timeout_ms : DRAIN_MAX_MS;
    uint64_t deadline = weft__now_ms() + (uint64_t)tmo;

    for (;;) {
        int busy = 0;

        for (int p = 0; p < tp->nranks; p++)
            for (int i = 0; i < tp->peers[p].nwires; i++) {
                ib_wire *w = &tp->peers[p].w[i];
                if (w->s_wr > 0 && !w->dead && !tp->peers[p].left)
                    busy = 1;
            }
        /* A peer lost meanwhile (the TCP side failed): nothing is judged
         * any more, and no goodbye can go. */
        if (!busy || tp->err != 0 || tp->tcp_err != 0 ||
            weft__now_ms() >= deadline)
            break;
        if (ib_block(tp, deadline) != 0)
            break;
        cq_poll_all(tp);
    }
}

/* Says goodbye on every TCP connection, with the count of slots landed
 * per wire of its link (bye_done). Completions still on the CQ are taken
 * first, so that the counts hold every write that landed. */
static void say_bye(ib_tp *tp)
{
    uint64_t deadline = weft__now_ms() + BYE_WAIT_MS;

    cq_poll_all(tp);
    tp->setup_pending = 0;
    FOR_EACH_LINK(tp, pe, lk)
    {
        lk->out[0] = 'B';
        for (int k = 0; k < tp->wires; k++)
            weft__put_be32(lk->out + 1 + 4 * k,
                           (uint32_t)pe->w[lk->twire * tp->wires + k].r_landed);
        if (tcp_frame(tp, lk, 0, &lk->bye_tx, lk->out, IB_BYE_BYTES(tp->wires),
                      setup_done) != 0)
            return;
    }
    while (tp->setup_pending > 0 && weft__now_ms() < deadline)
        if (weft__tcp_ops.progress(tp->tcp, deadline) < 0)
            break;
}

static void ib_destroy(weft__tp *t)
{
    ib_tp *tp = (ib_tp *)t;
    weft__sigpipe_state sp;
    int rc;

    if (tp == NULL)
        return;
    weft__sigpipe_block(&sp);
    /* A TCP side that failed can carry no goodbye, judged or not. */
    if (tp->ready && !tp->shut && tp->err == 0 && tp->tcp_err == 0) {
        /* Frames still queued belong to no operation: drop them, with no
         * callback, and send no more credits. */
        for (int p = 0; p < tp->nranks; p++)
            for (int i = 0; i < tp->peers[p].nwires; i++) {
                ib_wire *w = &tp->peers[p].w[i];
                w->sq_head = w->sq_tail = NULL;
                w->wq_head = w->wq_tail = NULL;
                w->rq_head = w->rq_tail = NULL;
                w->r_returned = w->r_consumed;
            }
        tp->dirty = NULL;
        drain_writes(tp);
        say_bye(tp);
    }
    tp->shut = 1;
    /* Reverse order of creation: queue pairs, memory regions and rings,
     * then per device its CQ, completion channel, PD and context. */
    for (int p = 0; tp->peers != NULL && p < tp->nranks; p++) {
        ib_peer *pe = &tp->peers[p];
        for (int i = 0; i < pe->nwires; i++) {
            ib_wire *w = &pe->w[i];
            if (w->qp != NULL && (rc = ibv_destroy_qp(w->qp)) != 0)
                weft__log(WEFT__LOG_WARN, tp->rank,
                          "ibv_destroy_qp (wire %d to peer %d): %s", w->w,
                          w->peer, strerror(rc));
            if (w->rmr != NULL && (rc = ibv_dereg_mr(w->rmr)) != 0)
                weft__log(WEFT__LOG_WARN, tp->rank, "ibv_dereg_mr: %s",
                          strerror(rc));
            if (w->smr != NULL && (rc = ibv_dereg_mr(w->smr)) != 0)
                weft__log(WEFT__LOG_WARN, tp->rank, "ibv_dereg_mr: %s",
                          strerror(rc));
            free(w->rring);
            free(w->sring);
            free(w->r_len);
        }
        for (int i = 0; i < pe->nlinks; i++) {
            free(pe->links[i].out);
            free(pe->links[i].in);
        }
        free(pe->w);
        free(pe->links);
    }
    free(tp->peers);
    while (tp->devs != NULL) {
        ib_dev *d = tp->devs;
        tp->devs = d->next;
        /* Events were acknowledged as they were read (ibv_destroy_cq waits
         * for that). */
        if (d->cq != NULL && (rc = ibv_destroy_cq(d->cq)) != 0)
            weft__log(WEFT__LOG_WARN, tp->rank, "ibv_destroy_cq (%s): %s",
                      d->name, strerror(rc));
        if (d->ch != NULL && (rc = ibv_destroy_comp_channel(d->ch)) != 0)
            weft__log(WEFT__LOG_WARN, tp->rank,
                      "ibv_destroy_comp_channel (%s): %s", d->name,
                      strerror(rc));
        if (d->pd != NULL && (rc = ibv_dealloc_pd(d->pd)) != 0)
            weft__log(WEFT__LOG_WARN, tp->rank, "ibv_dealloc_pd (%s): %s",
                      d->name, strerror(rc));
        if (d->ctx != NULL && (rc = ibv_close_device(d->ctx)) != 0)
            weft__log(WEFT__LOG_WARN, tp->rank, "ibv_close_device (%s): %s",
                      d->name, strerror(rc));
        free(d);
    }
    if (tp->devlist != NULL)
        ibv_free_device_list(tp->devlist);
    if (tp->tcp != NULL)
        weft__tcp_ops.destroy(tp->tcp);
    weft__sigpipe_restore(&sp);
    free(tp);
}

static int ib_create_guarded(ib_tp *tp)
{
    uint64_t deadline;
    int rc, ndev = 0;

    /* One TCP connection per link, with its own error record (above);
     * a failure there during set-up is this transport's. */
    tp->boot.rank = tp->rank;
    tp->boot_p = *tp->p;
    tp->boot_p.wires = 1;
    tp->boot_p.sink = &tp->boot;
    if ((rc = weft__tcp_create_wires(&tp->boot_p, &tp->tcp)) != 0)
        return weft__fail(tp->p->sink, rc, "%s", tp->boot.msg);
    /* weft_init's one deadline covers the TCP wires and this set-up
     * alike. */
    deadline = tp->p->deadline_ms;
    tp->devlist = ibv_get_device_list(&tp->ndevices);
    if (tp->devlist == NULL)
        return weft__fail(tp->p->sink, WEFT_ECONFIG,
                          "rank %d: no RDMA devices: "
                          "ibv_get_device_list: %s (is an RDMA driver "
                          "loaded, or for Soft-RoCE, `rdma link add` "
                          "done?)",
                          tp->rank, strerror(errno));
    if ((rc = plan(tp)) != 0)
        return rc;
    for (ib_dev *d = tp->devs; d != NULL; d = d->next)
        if (++ndev > MAX_DEVS)
            return weft__fail(tp->p->sink, WEFT_ECONFIG,
                              "rank %d: wires on more than %d RDMA "
                              "device ports",
                              tp->rank, MAX_DEVS);
    /* Every device's budget first: nothing is created on any of them
     * when one cannot hold its share. */
    for (ib_dev *d = tp->devs; d != NULL; d = d->next)
        if ((rc = dev_budget(tp, d)) != 0)
            return rc;
    for (ib_dev *d = tp->devs; d != NULL; d = d->next)
        if ((rc = dev_setup(tp, d)) != 0)
            return rc;
    for (int p = 0; p < tp->nranks; p++)
        for (int i = 0; i < tp->peers[p].nwires; i++)
            if ((rc = wire_setup(tp, &tp->peers[p].w[i])) != 0)
                return rc;
    if ((rc = exchange(tp, deadline)) != 0)
        return rc;
    tp->setup_pending = 0;
    tp->ready = 1;
    return WEFT_OK;
}

static int ib_create(const weft__tp_params *p, weft__tp **out)
{
    ib_tp *tp = calloc(1, sizeof *tp);
    weft__sigpipe_state sp;
    int rc, ndev = 0;

    *out = NULL;
    if (tp == NULL)
        return WEFT_ENOMEM;
    tp->p = p;
    tp->rank = p->rank;
    tp->nranks = p->nranks;
    tp->wires = p->wires;
    tp->slots = p->cfg->ib_slots;
    tp->slot_bytes = p->cfg->ib_slot_bytes;
    /* Send queue: a ring of writes plus credits (capped at credit_max);
     * receive queue: a ring of writes plus the credits a peer may have in
     * flight, with room to spare (a short one only costs an RNR retry). */
    tp->credit_max = tp->slots + 2;
    tp->sq_depth = tp->slots + tp->credit_max;
    tp->rq_depth = 2 * tp->slots + 4;
    tp->spin_ns = (uint64_t)p->cfg->spin_us * 1000u;
    weft__sigpipe_block(&sp);
    rc = ib_create_guarded(tp);
    weft__sigpipe_restore(&sp);
    if (rc != 0) {
        if (tp->err == 0)
            tp->err = rc;
        ib_destroy((weft__tp *)tp);
        return rc;
    }
    for (ib_dev *d = tp->devs; d != NULL; d = d->next)
        ndev++;
    weft__log(WEFT__LOG_DEBUG, tp->rank,
              "ibverbs: %d device port(s), %d slots of %zu bytes per wire",
              ndev, tp->slots, tp->slot_bytes);
    *out = (weft__tp *)tp;
    return WEFT_OK;
}

const weft__tp_ops weft__ibverbs_ops = {
    .name = "ibverbs",
    .create = ib_create,
    .destroy = ib_destroy,
    .nwires = ib_nwires,
    .post_send = ib_post_send,
    .post_recv = ib_post_recv,
    .progress = ib_progress,
    .wake = ib_wake,
    .shutdown = ib_shutdown,
    .relay_send = ib_relay_send,
    .relay_recv = ib_relay_recv,
};
