/*
 * The channels of a pass besides its lanes' wires: check channels (a
 * collective's header exchanged with a peer it moves no data to or from)
 * and relayed point to point.
 */
#include "engine/pass.h"

#include <stdint.h>
#include <string.h>

static void check_send_done(weft__xfer *x)
{
    container_of(x, check, sx)->sent = 1;
}

int weft__check_done(const run *r)
{
    for (int i = 0; i < r->nchecks; i++) {
        const check *k = &r->checks[i];
        if ((k->send && !k->sent) || (k->recv && !k->got))
            return 0;
    }
    return 1;
}

/* The check channels of a collective pass: with every peer it moves data
 * to or from, and every peer of its op's check set (its ring neighbours,
 * or every peer), headers go both ways; a check channel carries the ones
 * that no lane carries. Point-to-point passes have none: a send must not
 * wait for its receiver. */
void weft__plan_checks(run *r)
{
    const weft__ctx *c = r->c;
    const weft__op *op = &r->op;
    int cand[2 * WEFT__MAX_LANES + WEFT__MESH_MAX_RANKS + 2], ncand = 0;
    const weft__group g =
        op->group.n > 0 ? op->group : (weft__group){c->nranks, c->rank, 0, 1};

    if (r->k->kind == WEFT__OP_P2P)
        return;
    for (int l = 0; l < op->nlanes; l++) {
        cand[ncand++] = op->lanes[l].send_peer;
        cand[ncand++] = op->lanes[l].recv_peer;
    }
    if (op->check == WEFT__CHECK_RING) {
        cand[ncand++] = weft__group_rank(&g, (g.me + 1) % g.n);
        cand[ncand++] = weft__group_rank(&g, (g.me + g.n - 1) % g.n);
    } else if (op->check == WEFT__CHECK_ALL && g.n <= WEFT__MESH_MAX_RANKS) {
        for (int p = 0; p < g.n; p++)
            if (p != g.me)
                cand[ncand++] = weft__group_rank(&g, p);
    }
    for (int i = 0; i < ncand; i++) {
        int p = cand[i], dup = 0, sends = 0, recvs = 0;
        check *k;

        for (int j = 0; j < i; j++)
            dup |= cand[j] == p;
        if (p < 0 || p == c->rank || dup || c->tpo->nwires(c->tp, p) == 0)
            continue;
        for (int l = 0; l < op->nlanes; l++) {
            sends |= op->lanes[l].send_peer == p;
            recvs |= op->lanes[l].recv_peer == p;
        }
        if (sends && recvs)
            continue;
        k = &r->checks[r->nchecks++];
        memset(k, 0, sizeof *k);
        k->run = r;
        k->peer = p;
        k->send = !sends;
        k->recv = !recvs;
    }
}

/* Posts a check channel's header on wire 0 (its stream is free). */
void weft__check_send(check *k)
{
    run *r = k->run;
    weft__ctx *c = r->c;
    int rc;

    if (r->err != 0)
        return;
    k->sx.done = check_send_done;
    k->sx.buf = (char *)k->sbuf;
    k->sx.len = HDR_BYTES;
    if ((rc = c->tpo->post_send(c->tp, k->peer, 0, &k->sx)) != 0)
        engine_fail(r, rc, "rank %d: %s: cannot post to peer %d: %s", c->rank,
                    r->k->name, k->peer, weft_strerror(rc));
}

void weft__post_checks(run *r)
{
    for (int i = 0; i < r->nchecks && r->err == 0; i++) {
        check *k = &r->checks[i];

        if (k->recv)
            weft__rx_ask_check(k);
        if (k->send && r->err == 0) {
            ophdr h = weft__hdr_make(r->k, r->pass, TAG_CHECK, r->k->seq, 0);

            weft__hdr_encode(k->sbuf, &h);
            weft__tx_check(k);
        }
    }
}

/* ---- relayed point to point ----
 *
 * A message to a rank with no wires to this one goes around the ring
 * through the transport's relay, as two relayed messages: its header (the
 * same as a wire's, with the pair's message number and the length), then
 * its bytes. The receiver checks the header before it takes a byte, so a
 * relayed send and receive are matched exactly as direct ones are. The
 * halves with wires of their own run meanwhile as the pass's lanes. */

static void relay_done(weft__xfer *x)
{
    container_of(x, relay_xfer, x)->done = 1;
}

static int relay_post(run *r, int is_send, int peer, relay_xfer *rx, void *buf,
                      size_t len, void (*done)(weft__xfer *))
{
    weft__ctx *c = r->c;

    rx->x.done = done;
    rx->x.buf = buf;
    rx->x.len = len;
    return is_send ? c->tpo->relay->send(c->tp, peer, &rx->x)
                   : c->tpo->relay->recv(c->tp, peer, &rx->x);
}

void weft__post_relay(run *r, const weft__relay *rl)
{
    weft__ctx *c = r->c;
    int rc = 0;

    if (rl->dst >= 0) {
        ophdr h = weft__hdr_make(r->k, 0, (uint32_t)rl->tag,
                                 rl->tag == 0 ? c->send_seq[rl->dst]++ : 0,
                                 rl->nbytes);
        weft__hdr_encode(r->rl_shdr, &h);
        rc = relay_post(r, 1, rl->dst, &r->rl_sh, r->rl_shdr, HDR_BYTES,
                        relay_done);
        if (rc == 0)
            rc = relay_post(r, 1, rl->dst, &r->rl_sx,
                            (void *)(uintptr_t)rl->sendbuf, rl->nbytes,
                            relay_done);
    }
    if (rc == 0 && rl->src >= 0) {
        /* The source's relayed messages are read by match.c, which hands
         * this pass the first of its tag. */
        r->rl_want = weft__hdr_make(r->k, 0, (uint32_t)rl->tag,
                                    rl->tag == 0 ? c->recv_seq[rl->src]++ : 0,
                                    rl->nbytes);
        r->rl_tag = (uint32_t)rl->tag;
        r->rl_buf = rl->recvbuf;
        rc = weft__relay_take(r);
    }
    if (rc != 0 && r->err == 0)
        r->err = rc;
}

/* The relayed header that match.c handed r came (or was read early):
 * checked against r's. 0 where it matched. */
int weft__relay_hdr_got(run *r, const uint8_t *hdr)
{
    memcpy(r->rl_rhdr, hdr, HDR_BYTES);
    r->rl_rh.done = 1;
    return weft__hdr_check(r, r->rl_rhdr, &r->rl_want, r->rsrc, -1);
}

/* Posts the relayed receive of r's bytes (after their header) into its
 * buffer. */
int weft__relay_recv_data(run *r)
{
    return relay_post(r, 0, r->rsrc, &r->rl_rx, r->rl_buf, r->rl_want.total,
                      relay_done);
}

int weft__relay_done_all(const run *r)
{
    return r->rl_sh.done && r->rl_sx.done && r->rl_rh.done && r->rl_rx.done;
}
