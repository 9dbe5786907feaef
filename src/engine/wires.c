/*
 * Several passes on one wire's two byte streams (see "sharing wires"
 * below).
 */
#include "engine/pass.h"

#include "base/bytes.h"
#include "engine/plan.h"

#include <assert.h>
#include <stdlib.h>
#include <string.h>

/* ---- sharing wires ----
 *
 * Several passes may be in flight at once: point-to-point messages
 * progress beside each other and beside the one collective call that
 * runs (core/sched.c). They share each wire's two byte streams, so:
 *
 * - Sending, a lane's wire puts its header and every frame of its region
 *   on the stream before another pass's bytes go there: the first to
 *   start holds the stream (txq.owner) until its last frame is posted;
 *   the others queue, and so do check channels' headers.
 * - Receiving, the engine reads each stream's headers itself (rxq) and
 *   hands each to the pass it belongs to: point-to-point headers (kind
 *   P2P) to the receive of that peer that runs, any other to the
 *   collective's lane or check channel. The pass then reads its frames
 *   and gives the stream back once they are all posted. A collective's
 *   header that no started pass takes yet waits, unread past, until the
 *   collective starts; a point-to-point message that comes while the
 *   collective waits behind it is read into memory (unexp) and handed to
 *   its receive when that starts, so that a send posted before a
 *   collective never holds the collective back on the other side. Past
 *   UNEXP_MAX bytes held so, the stream waits instead.
 *
 * One pass per collective call runs at a time, and at most one send per
 * peer and one receive per peer and tag of point-to-point (the
 * scheduler's rules), so each stream has at most one collective taker
 * and one point-to-point taker per tag.
 *
 * Tags: a point-to-point header goes to the receive waiting on its
 * stream with the same tag (the lane's, carried in the header). One of a
 * tag that no receive waits for, met while someone waits on the stream
 * (a collective, a receive of another tag, a probe of an any-source
 * receive on wire 0: match.c), is read into memory as above, so that the
 * messages behind it move on; a receive first takes the oldest early
 * message of its tag. Each wire's stream carries the pair's messages in
 * the order they were sent, so on every wire the k-th message of a tag
 * is the same message, and a message split over several wires is taken
 * whole by one receive. */

#define UNEXP_MAX ((size_t)64 << 20)

enum { RX_IDLE, RX_READING, RX_HAVE, RX_BUSY };

/* A point-to-point message's part on one wire, read before its receive
 * started. */
typedef struct unexp {
    weft__xfer x;
    struct rxq *q;
    uint8_t hdr[HDR_BYTES];
    char *buf;
    size_t len;
    int done;
    wstate *taker; /* the receive that took it while it still arrived */
    struct unexp *next;
} unexp;

typedef struct rxq {
    weft__xfer x;
    weft__ctx *c;
    int peer, w;
    int state; /* RX_* */
    uint8_t hdr[HDR_BYTES];
    wstate *coll; /* a collective's lane waiting for its header */
    check *chk;   /* a collective's check channel waiting (wire 0) */
    wstate *p2p;  /* point-to-point receives waiting (linked by r_tnext) */
    unexp *uq_head, *uq_tail;
} rxq;

typedef struct txq {
    wstate *owner;
    txw *head, *tail;
} txq;

static rxq *rxq_of(weft__ctx *c, int peer, int w)
{
    return &c->eng->rx[(size_t)peer * (size_t)c->eng->maxw + (size_t)w];
}

static txq *txq_of(weft__ctx *c, int peer, int w)
{
    return &c->eng->tx[(size_t)peer * (size_t)c->eng->maxw + (size_t)w];
}

/* Puts w last in q's line for the stream. */
static void txq_push(txq *q, txw *w)
{
    w->next = NULL;
    if (q->tail != NULL)
        q->tail->next = w;
    else
        q->head = w;
    q->tail = w;
}

static int run_p2p(const run *r)
{
    return r->k->kind == WEFT__OP_P2P;
}

/* The tag of a point-to-point lane's messages, and of a header. */
static uint32_t ws_tag(const wstate *ws)
{
    return (uint32_t)ws->run->op.lanes[ws->lane].tag;
}

static int hdr_p2p(const uint8_t *hdr)
{
    return weft__get_le32(hdr) == HDR_MAGIC && hdr[4] == WEFT__OP_P2P;
}

static uint32_t hdr_tag(const uint8_t *hdr)
{
    return weft__get_le32(hdr + 8);
}

/* Takes the point-to-point receive of tag waiting on q out of its list. */
static wstate *p2p_take(rxq *q, uint32_t tag)
{
    for (wstate **pp = &q->p2p; *pp != NULL; pp = &(*pp)->r_tnext)
        if (ws_tag(*pp) == tag) {
            wstate *ws = *pp;

            *pp = ws->r_tnext;
            ws->r_tnext = NULL;
            return ws;
        }
    return NULL;
}

/* Does someone wait for what q's stream brings next? */
static int rx_wanted(const rxq *q)
{
    return q->coll != NULL || q->chk != NULL || q->p2p != NULL ||
           (q->w == 0 && q->c->eng->probes != NULL);
}

/* The transport's question about q's posted header read (x->arg is q):
 * does anyone still wait for it? A probe that another peer's message
 * ended leaves it posted; the peer leaving then fails nothing. */
static int rx_xfer_wanted(const weft__xfer *x)
{
    return rx_wanted(x->arg);
}

/* A lane's header came: checked against what the lane expects. */
static void rx_deliver(wstate *ws, const uint8_t *hdr)
{
    run *r = ws->run;
    ophdr want = weft__lane_hdr(r, ws->lane, 0);

    ws->r_asked = 0;
    ws->r_hdr = 1;
    memcpy(ws->r_hdrbuf, hdr, HDR_BYTES);
    weft__hdr_check(r, ws->r_hdrbuf, &want, r->op.lanes[ws->lane].recv_peer,
                    ws->w);
}

static void check_got(check *k, const uint8_t *hdr)
{
    run *r = k->run;
    ophdr want = weft__hdr_make(r->k, r->pass, TAG_CHECK, r->k->seq, 0);

    k->asked = 0;
    memcpy(k->rbuf, hdr, HDR_BYTES);
    if (weft__hdr_check(r, k->rbuf, &want, k->peer, 0) == 0)
        k->got = 1;
}

/* An early message's bytes land in the receive that took it: its wire's
 * part of the message is done. It leaves its wire's list (the oldest of
 * its tag there: one receive per peer and tag runs at a time). */
static void unexp_land(wstate *ws, unexp *u)
{
    run *r = ws->run;
    const weft__lane *ln = &r->op.lanes[ws->lane];
    weft__region reg =
        weft__step_region(r, ln->steps[0].recv_len, r->rw[ws->lane], ws->w);
    rxq *q = u->q;
    unexp **pp = &q->uq_head, *prev = NULL;

    while (*pp != u) {
        prev = *pp;
        pp = &(*pp)->next;
    }
    *pp = u->next;
    if (q->uq_tail == u)
        q->uq_tail = prev;
    ws->r_unexp = NULL;
    if (r->err == 0 && reg.len != u->len)
        engine_fail(r, WEFT_EMISMATCH,
                    "rank %d: %s: peer %d sent %zu bytes on wire %d where "
                    "this rank expected %zu",
                    r->c->rank, r->k->name, ln->recv_peer, u->len, ws->w,
                    reg.len);
    else if (r->err == 0) {
        memcpy(ln->steps[0].recv_dst + reg.off, u->buf, reg.len);
        ws->r_step = ln->nsteps;
        ws->r_frame = 0;
        ws->d_step = ln->nsteps - 1;
        ws->d_end = reg.off + reg.len;
    }
    r->c->eng->unexp_bytes -= u->len;
    free(u->buf);
    free(u);
}

static void unexp_done(weft__xfer *x)
{
    unexp *u = container_of(x, unexp, x);
    wstate *ws = u->taker;

    u->done = 1;
    if (ws != NULL) {
        unexp_land(ws, u);
        weft__pump_lane(ws->run, ws->lane);
    }
}

/* The oldest early message of tag on q, or NULL. */
static unexp *unexp_find(const rxq *q, uint32_t tag)
{
    unexp *u = q->uq_head;

    while (u != NULL && hdr_tag(u->hdr) != tag)
        u = u->next;
    return u;
}

/* A receive takes the oldest early message of its tag, once its header
 * matched (where it does not, the pass fails and the message stays, to
 * go with the transport). */
static void unexp_take(wstate *ws, unexp *u)
{
    rx_deliver(ws, u->hdr);
    if (ws->run->err != 0)
        return;
    if (u->done)
        unexp_land(ws, u);
    else {
        u->taker = ws;
        ws->r_unexp = u;
    }
}

/* Reads the point-to-point message whose header q holds into memory:
 * 0, or -1 where it may not (too much held already, no memory). */
static int unexp_read(weft__ctx *c, rxq *q)
{
    struct weft__engine *e = c->eng;
    ophdr h;
    weft__region reg;
    unexp *u;

    weft__hdr_decode(q->hdr, &h);
    if (h.dtype >= 10)
        return -1;
    reg = weft__wire_region(c, h.total, weft_dtype_size((weft_dtype)h.dtype),
                            c->tpo->nwires(c->tp, q->peer), q->w);
    if (reg.len == 0 || e->unexp_bytes + reg.len > UNEXP_MAX)
        return -1;
    if ((u = calloc(1, sizeof *u)) == NULL)
        return -1;
    if ((u->buf = malloc(reg.len)) == NULL) {
        free(u);
        return -1;
    }
    u->q = q;
    u->len = reg.len;
    memcpy(u->hdr, q->hdr, HDR_BYTES);
    u->x.done = unexp_done;
    u->x.buf = u->buf;
    u->x.len = u->len;
    if (c->tpo->post_recv(c->tp, q->peer, q->w, &u->x) != 0) {
        free(u->buf);
        free(u);
        return -1;
    }
    e->unexp_bytes += u->len;
    if (q->uq_tail != NULL)
        q->uq_tail->next = u;
    else
        q->uq_head = u;
    q->uq_tail = u;
    return 0;
}

/* The wire's reader cannot post: whoever waits on it fails. */
static void rx_fail(rxq *q, int rc)
{
    run *rs[2] = {q->coll != NULL ? q->coll->run : NULL,
                  q->chk != NULL ? q->chk->run : NULL};

    for (int i = 0; i < 2; i++)
        if (rs[i] != NULL && rs[i]->err == 0)
            engine_fail(rs[i], rc,
                        "rank %d: %s: cannot receive from peer %d: %s",
                        q->c->rank, rs[i]->k->name, q->peer, weft_strerror(rc));
    for (wstate *ws = q->p2p; ws != NULL; ws = ws->r_tnext)
        if (ws->run->err == 0)
            engine_fail(
                ws->run, rc, "rank %d: %s: cannot receive from peer %d: %s",
                q->c->rank, ws->run->k->name, q->peer, weft_strerror(rc));
}

static void rx_hdr_done(weft__xfer *x);

/* What the header q reads next is likely followed by: the first frame of
 * the one lane that waits there (0 where none or two wait: unknown). */
static size_t next_len(const rxq *q)
{
    const wstate *ws = q->coll != NULL ? q->coll : q->p2p;

    if (ws == NULL || (q->coll != NULL && (q->p2p != NULL || q->chk != NULL)) ||
        (q->p2p != NULL && q->p2p->r_tnext != NULL))
        return 0;
    for (int s = ws->r_step; s < ws->run->op.lanes[ws->lane].nsteps; s++) {
        const run *r = ws->run;
        weft__region reg = weft__step_region(
            r, r->op.lanes[ws->lane].steps[s].recv_len, r->rw[ws->lane], ws->w);

        if (reg.len > 0)
            return weft__plan_frame_len(reg.len, r->frame, 0);
    }
    return 0;
}

/* Moves q's stream on: hands a header that came to its taker, reads
 * early messages, or posts the next header's read where someone waits
 * for one. */
static void rx_kick(rxq *q)
{
    weft__ctx *c = q->c;

    for (;;) {
        wstate *ws;
        int p2p, rc;

        if (q->state == RX_READING || q->state == RX_BUSY)
            return;
        if (q->state == RX_IDLE) {
            if (!rx_wanted(q))
                return;
            q->x = (weft__xfer){0};
            q->x.done = rx_hdr_done;
            q->x.arg = q;
            q->x.wanted = rx_xfer_wanted;
            q->x.buf = (char *)q->hdr;
            q->x.len = HDR_BYTES;
            q->x.next_len = next_len(q);
            q->state = RX_READING;
            if ((rc = c->tpo->post_recv(c->tp, q->peer, q->w, &q->x)) != 0) {
                q->state = RX_IDLE;
                rx_fail(q, rc);
            }
            return;
        }
        /* RX_HAVE */
        p2p = hdr_p2p(q->hdr);
        ws = p2p ? p2p_take(q, hdr_tag(q->hdr)) : q->coll;
        if (ws != NULL) {
            if (!p2p)
                q->coll = NULL;
            q->state = RX_BUSY;
            ws->r_owns = 1;
            rx_deliver(ws, q->hdr);
            weft__pump_lane(ws->run, ws->lane);
            return;
        }
        if (!p2p && q->chk != NULL) {
            check *k = q->chk;

            q->chk = NULL;
            q->state = RX_IDLE;
            check_got(k, q->hdr);
            continue;
        }
        /* A probe that takes it leaves it for its receive, next. */
        if (p2p && q->w == 0 && weft__probe_claim(c, q->peer, hdr_tag(q->hdr)))
            return;
        if (p2p && rx_wanted(q) && unexp_read(c, q) == 0) {
            q->state = RX_IDLE;
            continue;
        }
        return; /* nobody started here takes it yet: the stream waits */
    }
}

static void rx_hdr_done(weft__xfer *x)
{
    rxq *q = container_of(x, rxq, x);

    q->state = RX_HAVE;
    rx_kick(q);
}

/* A lane's wire asks for its header; 1 where it has it already. */
int weft__rx_ask(run *r, wstate *ws)
{
    rxq *q = rxq_of(r->c, r->op.lanes[ws->lane].recv_peer, ws->w);

    ws->r_asked = 1;
    if (run_p2p(r)) {
        unexp *u = unexp_find(q, ws_tag(ws));

        if (u != NULL) {
            unexp_take(ws, u);
            return 1;
        }
        ws->r_tnext = q->p2p;
        q->p2p = ws;
    } else
        q->coll = ws;
    rx_kick(q);
    return ws->r_hdr;
}

void weft__rx_release(weft__ctx *c, int peer, int w)
{
    rxq *q = rxq_of(c, peer, w);

    q->state = RX_IDLE;
    rx_kick(q);
}

/* 1 where ws may put its bytes on its wire's stream now; else it queues
 * and is pumped again once the stream is its own. */
int weft__tx_take(run *r, wstate *ws)
{
    txq *q = txq_of(r->c, r->op.lanes[ws->lane].send_peer, ws->w);

    if (q->owner == ws)
        return 1;
    if (q->owner == NULL && q->head == NULL) {
        q->owner = ws;
        return 1;
    }
    if (!ws->s_queued) {
        ws->s_queued = 1;
        ws->s_wait = (txw){NULL, ws, NULL};
        txq_push(q, &ws->s_wait);
    }
    return 0;
}

/* The stream's owner posted its last frame: the next in line starts. */
static void tx_next(txq *q)
{
    while (q->owner == NULL && q->head != NULL) {
        txw *w = q->head;

        q->head = w->next;
        if (q->head == NULL)
            q->tail = NULL;
        if (w->k != NULL) {
            weft__check_send(w->k);
            continue;
        }
        w->ws->s_queued = 0;
        q->owner = w->ws;
        weft__pump_lane(w->ws->run, w->ws->lane);
    }
}

/* Forgets every stream's state (the transport was shut down: nothing is
 * in flight), and frees the early messages. */
void weft__wires_reset(weft__ctx *c)
{
    struct weft__engine *e = c->eng;
    size_t n;

    if (e == NULL || e->rx == NULL)
        return;
    n = (size_t)c->nranks * (size_t)e->maxw;
    for (size_t i = 0; i < n; i++) {
        rxq *q = &e->rx[i];
        unexp *u = q->uq_head, *next;

        for (; u != NULL; u = next) {
            next = u->next;
            free(u->buf);
            free(u);
        }
        q->uq_head = q->uq_tail = NULL;
        q->state = RX_IDLE;
        q->coll = q->p2p = NULL;
        q->chk = NULL;
        e->tx[i] = (txq){0};
    }
    e->unexp_bytes = 0;
    weft__match_reset(c);
}

void weft__tx_done(run *r, wstate *ws)
{
    txq *q = txq_of(r->c, r->op.lanes[ws->lane].send_peer, ws->w);

    if (q->owner == ws) {
        q->owner = NULL;
        tx_next(q);
    }
}

void weft__rx_ask_check(check *k)
{
    rxq *q = rxq_of(k->run->c, k->peer, 0);

    k->asked = 1;
    q->chk = k;
    rx_kick(q);
}

void weft__tx_check(check *k)
{
    txq *q = txq_of(k->run->c, k->peer, 0);

    if (q->owner == NULL && q->head == NULL) {
        weft__check_send(k);
        return;
    }
    /* Behind another pass's bytes on the stream. */
    k->s_wait = (txw){NULL, NULL, k};
    txq_push(q, &k->s_wait);
}

int weft__wires_init(weft__ctx *c, struct weft__engine *e)
{
    const size_t n = (size_t)c->nranks * (size_t)e->maxw;

    e->rx = calloc(n, sizeof *e->rx);
    e->tx = calloc(n, sizeof *e->tx);
    if (e->rx == NULL || e->tx == NULL) {
        free(e->rx);
        free(e->tx);
        e->rx = NULL;
        e->tx = NULL;
        return -1;
    }
    for (size_t i = 0; i < n; i++) {
        e->rx[i].c = c;
        e->rx[i].peer = (int)(i / (size_t)e->maxw);
        e->rx[i].w = (int)(i % (size_t)e->maxw);
    }
    return 0;
}

int weft__rx_has_tag(weft__ctx *c, int peer, uint32_t tag)
{
    rxq *q = rxq_of(c, peer, 0);

    if (unexp_find(q, tag) != NULL)
        return 1;
    return q->state == RX_HAVE && hdr_p2p(q->hdr) && hdr_tag(q->hdr) == tag;
}

void weft__rx_kick0(weft__ctx *c, int peer)
{
    rx_kick(rxq_of(c, peer, 0));
}
