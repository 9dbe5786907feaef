/*
 * Matching point-to-point messages by tag and by source: the reader of
 * each relayed source's messages, and the probes of receives from any
 * source.
 *
 * Tags. Every point-to-point header carries its message's tag (the lane's
 * tag, header.c), and a receive takes the first message of its tag from
 * its peer, whatever came before it: a wire's stream hands each header
 * to the receive of its tag, or reads the message into memory where none
 * waits (wires.c, "sharing wires"). Messages of tag 0 also keep their
 * number between the pair (weft_send and weft_recv, as before tags).
 *
 * Relayed sources. A peer with no wires sends through the transport's
 * relay, which keeps whatever arrives for this rank until a receive from
 * that source is posted, and hands it over in the order of those
 * receives. So one reader per relayed source (rlq) posts the relay's
 * receives itself, a header at a time, while someone waits: a header of
 * a tag that a pass waits for is checked, and its bytes go straight to
 * that pass's buffer; any other is read into memory (rlx), to be taken by
 * the first receive of its tag. The relay holds such messages in memory
 * anyway, so they are not counted against the wires' limit.
 *
 * Any source. A receive from any source (weft__recv_any_post) runs as two
 * parts: a probe pass that moves nothing and ends once some peer's
 * message of its tag is ready to be received (read early, or its header
 * first on wire 0 with nobody taking it), then an ordinary receive from
 * that peer, which finds the message where the probe saw it. While a probe
 * waits, every peer's wire 0 (and relayed source) is read, messages of
 * other tags into memory. The scheduler runs no other receive of that tag
 * beside an any-source receive (core/sched.c), so nothing takes the
 * message between the two parts, and two any-source receives never see
 * the same one.
 */
#include "engine/pass.h"
#include "engine/task.h"

#include "base/bytes.h"

#include <stdlib.h>
#include <string.h>

/* A relayed message read before a receive of its tag asked for it. */
typedef struct rlx {
    weft__xfer x;
    struct rlq *q;
    uint8_t hdr[HDR_BYTES];
    char *buf;
    size_t len;
    int done;
    run *taker; /* the receive that took it while it still arrived */
    struct rlx *next;
} rlx;

/* The reader of one relayed source. */
typedef struct rlq {
    weft__xfer x; /* the next header's receive */
    weft__ctx *c;
    int peer;
    int reading; /* a header's receive is posted */
    uint8_t hdr[HDR_BYTES];
    run *takers; /* passes waiting for a message (linked by rl_next) */
    rlx *head, *tail;
} rlq;

static uint32_t hdr_tag(const uint8_t *hdr)
{
    return weft__get_le32(hdr + 8);
}

static rlq *rlq_of(weft__ctx *c, int peer)
{
    struct weft__engine *e = c->eng;

    if (e->rl == NULL) {
        e->rl = calloc((size_t)c->nranks, sizeof *e->rl);
        if (e->rl == NULL)
            return NULL;
        for (int p = 0; p < c->nranks; p++) {
            e->rl[p].c = c;
            e->rl[p].peer = p;
        }
    }
    return &e->rl[peer];
}

/* The oldest message of tag read early from q's source that no receive
 * took yet. */
static rlx *rlx_find(const rlq *q, uint32_t tag)
{
    for (rlx *u = q->head; u != NULL; u = u->next)
        if (u->taker == NULL && hdr_tag(u->hdr) == tag)
            return u;
    return NULL;
}

static void rlx_unlink(rlq *q, rlx *u)
{
    rlx **pp = &q->head, *prev = NULL;

    while (*pp != u) {
        prev = *pp;
        pp = &(*pp)->next;
    }
    *pp = u->next;
    if (q->tail == u)
        q->tail = prev;
    free(u->buf);
    free(u);
}

/* An early message's bytes land in the receive r that took it. */
static void rlx_land(run *r, rlx *u)
{
    if (r->err == 0) {
        if (u->len > 0)
            memcpy(r->rl_buf, u->buf, u->len);
        r->rl_rx.done = 1;
    }
    rlx_unlink(u->q, u);
}

static void rlx_done(weft__xfer *x)
{
    rlx *u = container_of(x, rlx, x);

    u->done = 1;
    if (u->taker != NULL)
        rlx_land(u->taker, u);
}

static void rl_hdr_done(weft__xfer *x);

/* Does anyone wait for what q's source sends next? */
static int rl_wanted(const rlq *q)
{
    return q->takers != NULL || q->c->eng->probes != NULL;
}

/* The transport's question about q's posted header receive (x->arg is
 * q): does anyone still wait for it? (A probe that another source's
 * message ended leaves it posted.) */
static int rl_xfer_wanted(const weft__xfer *x)
{
    return rl_wanted(x->arg);
}

/* Posts the receive of q's next header where someone waits for it. */
static void rl_kick(rlq *q)
{
    weft__ctx *c = q->c;
    int rc;

    if (q->reading || !rl_wanted(q))
        return;
    q->x = (weft__xfer){0};
    q->x.done = rl_hdr_done;
    q->x.arg = q;
    q->x.wanted = rl_xfer_wanted;
    q->x.buf = (char *)q->hdr;
    q->x.len = HDR_BYTES;
    q->reading = 1;
    if ((rc = c->tpo->relay->recv(c->tp, q->peer, &q->x)) != 0) {
        q->reading = 0;
        for (run *r = q->takers; r != NULL; r = r->rl_next)
            if (r->err == 0)
                engine_fail(r, rc,
                            "rank %d: %s: cannot receive from rank %d "
                            "through the relay: %s",
                            c->rank, r->k->name, q->peer, weft_strerror(rc));
    }
}

/* Takes the pass waiting on q for tag out of its list. */
static run *rl_take(rlq *q, uint32_t tag)
{
    for (run **pp = &q->takers; *pp != NULL; pp = &(*pp)->rl_next)
        if ((*pp)->rl_tag == tag) {
            run *r = *pp;

            *pp = r->rl_next;
            r->rl_next = NULL;
            return r;
        }
    return NULL;
}

/* Reads the message whose header q holds into memory. */
static int rl_read_early(rlq *q)
{
    weft__ctx *c = q->c;
    ophdr h;
    rlx *u;

    weft__hdr_decode(q->hdr, &h);
    if (h.magic != HDR_MAGIC || h.kind != WEFT__OP_P2P)
        return WEFT_EMISMATCH;
    if ((u = calloc(1, sizeof *u)) == NULL)
        return WEFT_ENOMEM;
    u->len = (size_t)h.total;
    if (u->len > 0 && (u->buf = malloc(u->len)) == NULL) {
        free(u);
        return WEFT_ENOMEM;
    }
    u->q = q;
    memcpy(u->hdr, q->hdr, HDR_BYTES);
    if (q->tail != NULL)
        q->tail->next = u;
    else
        q->head = u;
    q->tail = u;
    if (u->len == 0) {
        u->done = 1;
        return WEFT_OK;
    }
    u->x.done = rlx_done;
    u->x.buf = u->buf;
    u->x.len = u->len;
    return c->tpo->relay->recv(c->tp, q->peer, &u->x);
}

static void rl_hdr_done(weft__xfer *x)
{
    rlq *q = container_of(x, rlq, x);
    weft__ctx *c = q->c;
    uint32_t tag = hdr_tag(q->hdr);
    run *r = rl_take(q, tag);
    int rc;

    q->reading = 0;
    if (r != NULL) {
        if (weft__relay_hdr_got(r, q->hdr) != 0)
            return; /* the pass failed; the stream is done with */
        if ((rc = weft__relay_recv_data(r)) != 0 && r->err == 0)
            r->err = rc;
        rl_kick(q);
        return;
    }
    if ((rc = rl_read_early(q)) != 0) {
        for (run *t = q->takers; t != NULL; t = t->rl_next)
            if (t->err == 0)
                engine_fail(t, rc,
                            "rank %d: %s: a message relayed from rank %d "
                            "could not be kept: %s",
                            c->rank, t->k->name, q->peer, weft_strerror(rc));
        for (run *p = c->eng->probes; p != NULL; p = p->probe_next)
            if (p->err == 0)
                engine_fail(p, rc,
                            "rank %d: %s: a message relayed from rank %d "
                            "could not be kept: %s",
                            c->rank, p->k->name, q->peer, weft_strerror(rc));
        return;
    }
    weft__probe_claim(c, q->peer, tag);
    rl_kick(q);
}

int weft__relay_take(run *r)
{
    rlq *q = rlq_of(r->c, r->rsrc);
    rlx *u;

    if (q == NULL)
        return engine_fail(r, WEFT_ENOMEM, "rank %d: %s: out of memory",
                           r->c->rank, r->k->name);
    if ((u = rlx_find(q, r->rl_tag)) != NULL) {
        if (weft__relay_hdr_got(r, u->hdr) != 0)
            return WEFT_OK; /* r failed with the mismatch */
        if (u->done)
            rlx_land(r, u);
        else
            u->taker = r;
        return WEFT_OK;
    }
    r->rl_next = q->takers;
    q->takers = r;
    rl_kick(q);
    return WEFT_OK;
}

void weft__match_reset(weft__ctx *c)
{
    struct weft__engine *e = c->eng;

    if (e == NULL)
        return;
    e->probes = NULL;
    for (int p = 0; e->rl != NULL && p < c->nranks; p++) {
        rlq *q = &e->rl[p];
        rlx *u = q->head, *next;

        for (; u != NULL; u = next) {
            next = u->next;
            free(u->buf);
            free(u);
        }
        q->head = q->tail = NULL;
        q->takers = NULL;
        q->reading = 0;
    }
}

void weft__match_free(weft__ctx *c)
{
    if (c->eng == NULL)
        return;
    weft__match_reset(c);
    free(c->eng->rl);
    c->eng->rl = NULL;
}

/* ---- probes ---- */

/* The probe r found its message at peer. */
static void probe_found(run *r, int peer)
{
    r->probe_src = peer;
    *r->probe_out = peer;
}

int weft__probe_claim(weft__ctx *c, int peer, uint32_t tag)
{
    for (run **pp = &c->eng->probes; *pp != NULL; pp = &(*pp)->probe_next)
        if ((*pp)->probe_tag == tag) {
            run *r = *pp;

            *pp = r->probe_next;
            r->probe_next = NULL;
            probe_found(r, peer);
            return 1;
        }
    return 0;
}

void weft__probe_leave(run *r)
{
    struct weft__engine *e = r->c->eng;

    for (run **pp = &e->probes; e != NULL && *pp != NULL;
         pp = &(*pp)->probe_next)
        if (*pp == r) {
            *pp = r->probe_next;
            break;
        }
    r->probe_next = NULL;
}

/* Can peer send to this rank: wires, or the relay? */
static int reaches(const weft__ctx *c, int peer)
{
    return peer != c->rank &&
           (c->tpo->nwires(c->tp, peer) > 0 || c->tpo->relay->offered);
}

/* A message of r's tag that some peer sent already, nobody else's: its
 * peer, or -1. The peers are tried from the one after the last found,
 * so that no sender is always served last. */
static int probe_scan(run *r)
{
    weft__ctx *c = r->c;
    struct weft__engine *e = c->eng;

    for (int i = 0; i < c->nranks; i++) {
        int p = (e->probe_next_peer + i) % c->nranks;
        rlq *q;

        if (!reaches(c, p))
            continue;
        if (c->tpo->nwires(c->tp, p) > 0) {
            if (weft__rx_has_tag(c, p, r->probe_tag))
                return p;
        } else if ((q = rlq_of(c, p)) != NULL &&
                   rlx_find(q, r->probe_tag) != NULL)
            return p;
    }
    return -1;
}

int weft__probe_start(weft__ctx *c, weft__call *k, int tag, int *src,
                      weft__pass **out)
{
    struct weft__engine *e;
    run *r;
    int rc, p;

    *out = NULL;
    if ((rc = weft__engine_ensure(c)) != 0 ||
        (r = calloc(1, sizeof *r)) == NULL)
        return weft__start_error(c, k, &(weft__op){0}, WEFT_ENOMEM,
                                 "rank %d: %s: out of memory", c->rank,
                                 k->name);
    e = c->eng;
    r->c = c;
    r->k = k;
    r->probe = 1;
    r->probe_src = -1;
    r->probe_out = src;
    r->probe_tag = (uint32_t)tag;
    /* Not a pass of the call's headers: the receive after it is pass 0,
     * as its sender's. */
    r->pass = k->passes;
    r->rdst = r->rsrc = -1;
    r->rl_sh.done = r->rl_sx.done = r->rl_rh.done = r->rl_rx.done = 1;
    *out = r;
    if ((p = probe_scan(r)) >= 0) {
        probe_found(r, p);
        e->probe_next_peer = (p + 1) % c->nranks;
        return WEFT_OK;
    }
    r->probe_next = e->probes;
    e->probes = r;
    /* Every peer's stream is read while it waits (a kick may find the
     * message at once, and take r off the list). */
    for (p = 0; p < c->nranks && r->probe_src < 0; p++) {
        rlq *q;

        if (!reaches(c, p))
            continue;
        if (c->tpo->nwires(c->tp, p) > 0)
            weft__rx_kick0(c, p);
        else if ((q = rlq_of(c, p)) != NULL)
            rl_kick(q);
    }
    if (r->probe_src >= 0)
        e->probe_next_peer = (r->probe_src + 1) % c->nranks;
    return WEFT_OK;
}

/* ---- a receive from any source ---- */

/* The probe found the sender (t->a.src): its message is received as any
 * other. */
static int recv_any_found(weft__task *t)
{
    t->c->eng->probe_next_peer = (t->a.src + 1) % t->c->nranks;
    return weft__sendrecv_post(t);
}

int weft__recv_any_post(weft__task *t)
{
    t->next = recv_any_found;
    return weft__probe_start(t->c, t->k, t->k->tag, &t->a.src, &t->pass);
}
