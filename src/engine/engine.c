/*
 * The pipeline engine's passes, pumping and waiting; see engine.h, and
 * pass.h for the files it shares its state with.
 *
 * State is kept per lane and per wire: a send cursor (step, frame of the
 * wire's region) and a receive cursor, each with a FIFO of frames in flight.
 * Frames on one wire complete in order, so the receive side's "done" point
 * is a single (step, end offset) pair per wire, and a send frame that
 * depends on received bytes checks exactly the wires whose regions overlap
 * it. Every cursor advances only within its own wire's region, so no frame
 * is ever posted past the end of a region and no wire waits for a frame
 * its peer will not send.
 */
#include "engine/pass.h"

#include "base/bytes.h"
#include "base/kernels.h"
#include "engine/plan.h"
#include "engine/pool.h"

#include <assert.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* How many wire states lane l has: one per wire it sends or receives on. */
static int lane_wires(const run *r, int l)
{
    return r->sw[l] > r->rw[l] ? r->sw[l] : r->rw[l];
}

/* Frees a pass's memory, the engine's spare included. */
static void pass_destroy(weft__pass *r)
{
    if (r != NULL)
        free(r->wsmem);
    free(r);
}

/* Wire w's region of len bytes over nw wires; len 0 or an unused wire
 * gives an empty region. */
weft__region weft__wire_region(const weft__ctx *c, size_t len, size_t esize,
                               int nw, int w)
{
    weft__region reg = {0, 0};
    int used;

    if (len == 0 || nw <= 0)
        return reg;
    used = weft__plan_wires(len, nw, c->cfg->min_wire_bytes);
    if (w >= used)
        return reg;
    return weft__plan_region(len, used, esize, w);
}

/* The same for a step of r, in its elements. */
weft__region weft__step_region(const run *r, size_t len, int nw, int w)
{
    return weft__wire_region(r->c, len, r->op.esize, nw, w);
}

/* Records a failure on the communicator's one error record and makes it
 * the result of the pass (*result) unless it has one: whatever that
 * record holds, the first cause. */
int weft__fail_into(weft__ctx *c, int *result, int err, const char *fmt, ...)
{
    va_list ap;

    va_start(ap, fmt);
    err = weft__vfail(&c->fail, err, fmt, ap);
    va_end(ap);
    if (*result == 0)
        *result = err;
    return *result;
}

static char *stage_slot(run *r, int lane, int w, int slot)
{
    struct weft__engine *e = r->c->eng;
    size_t i = ((size_t)lane * (size_t)e->maxw + (size_t)w) * STAGE_SLOTS +
               (size_t)slot;

    if (e->stage[i] == NULL)
        e->stage[i] = malloc(e->frame_bytes);
    return e->stage[i];
}

/* ---- the reducer thread ----
 *
 * A reduced frame that arrives is reduced inline by the thread that runs
 * the transport, unless the configuration hands frames of its size to the
 * reducer (reducer.h): then the driver goes back to the sockets at once,
 * and the frame is done (its bytes may leave in a later step, its staging
 * slot is posted again) only once the reducer has finished it and the
 * driver has taken it back (reap). A wire's frames are done in its order:
 * while any of its frames is with the reducer, the frames that arrive
 * after it on that wire follow it there, the ones with nothing to reduce
 * as empty jobs. */

static void reducer_wake(void *arg)
{
    weft__ctx *c = arg;

    c->tpo->wake(c->tp);
}

/* Does frame f, just received on ws, go to the reducer? */
static int reduce_later(run *r, const wstate *ws, const frame *f)
{
    struct weft__engine *e = r->c->eng;
    const weft__config *cfg = r->c->cfg;

    if (ws->r_reducing > 0)
        return 1;
    if (f->slot < 0 || r->op.inline_reduce || !cfg->reduce_thread ||
        f->len < cfg->reduce_thread_min_bytes || e->reducer_failed)
        return 0;
    /* Without the thread the frame is reduced inline, as before: slower,
     * never wrong, so this is no failure of the call. */
    if (e->reducer == NULL &&
        weft__reducer_create(reducer_wake, r->c, &e->reducer) != WEFT_OK)
        e->reducer_failed = 1;
    return e->reducer != NULL;
}

/* Hands frame f of step st, received on ws, to the reducer. */
static void reduce_post(run *r, wstate *ws, const frame *f,
                        const weft__step *st)
{
    rframe *rf = &ws->rj[(ws->j_head + ws->r_reducing) % FIFO_CAP];

    memset(rf, 0, sizeof *rf);
    rf->ws = ws;
    rf->step = f->step;
    rf->end = f->a + f->len;
    if (f->slot >= 0) {
        rf->job.dst = st->recv_dst + f->a;
        rf->job.a = st->recv_a + f->a;
        rf->job.b = stage_slot(r, ws->lane, ws->w, f->slot);
        rf->job.count = f->len / r->op.esize;
        rf->job.dtype = r->op.dtype;
        rf->job.op = r->op.redop;
    }
    ws->r_reducing++;
    weft__reducer_post(r->c->eng->reducer, &rf->job);
}

/* Takes back the frames the reducer has finished: each is done on its
 * wire, and its lane posts what that allows. Returns 1 if any came. */
int weft__reap(run *r)
{
    weft__rjob *j = weft__reducer_take(r->c->eng->reducer), *next;
    char touched[WEFT__MAX_LANES] = {0};
    int any = j != NULL;

    for (; j != NULL; j = next) {
        rframe *rf = container_of(j, rframe, job);
        wstate *ws = rf->ws;

        next = j->next;
        assert(ws->r_reducing > 0 && &ws->rj[ws->j_head] == rf);
        /* Only the collective reduces: every job is its pass's. */
        assert(ws->run == r || r->k->kind == WEFT__OP_P2P);
        r = ws->run;
        ws->j_head = (ws->j_head + 1) % FIFO_CAP;
        ws->r_reducing--;
        ws->d_step = rf->step;
        ws->d_end = rf->end;
        touched[ws->lane] = 1;
    }
    for (int l = 0; any && l < r->op.nlanes && r->err == 0; l++)
        if (touched[l])
            weft__pump_lane(r, l);
    return any;
}

/* ---- completions ---- */

static void send_done(weft__xfer *x)
{
    frame *f = container_of(x, frame, x);
    wstate *ws = f->ws;

    assert(&ws->s_fr[ws->s_head] == f);
    ws->s_head = (ws->s_head + 1) % FIFO_CAP;
    ws->s_count--;
    weft__pump_lane(ws->run, ws->lane);
}

static void recv_done(weft__xfer *x)
{
    frame *f = container_of(x, frame, x);
    wstate *ws = f->ws;
    run *r = ws->run;
    const weft__step *st = &r->op.lanes[ws->lane].steps[f->step];

    assert(&ws->r_fr[ws->r_head] == f);
    ws->r_head = (ws->r_head + 1) % FIFO_CAP;
    ws->r_count--;
    assert(!f->hdr);
    if (reduce_later(r, ws, f)) {
        reduce_post(r, ws, f, st);
        /* Its slot stays taken: nothing more can be posted for it yet. */
        weft__reap(r);
        return;
    } else {
        if (f->slot >= 0)
            weft__reduce3(st->recv_dst + f->a, st->recv_a + f->a,
                          stage_slot(r, ws->lane, ws->w, f->slot),
                          f->len / r->op.esize, r->op.dtype, r->op.redop);
        ws->d_step = f->step;
        ws->d_end = f->a + f->len;
    }
    weft__pump_lane(r, ws->lane);
}

/* ---- posting ---- */

/* Have bytes [a, b) of receive step k of the lane arrived on every wire
 * whose region overlaps them? */
static int recv_ready(run *r, int lane, int k, size_t a, size_t b)
{
    const weft__step *st = &r->op.lanes[lane].steps[k];

    for (int w = 0; w < r->rw[lane]; w++) {
        weft__region reg = weft__step_region(r, st->recv_len, r->rw[lane], w);
        size_t lo = a > reg.off ? a : reg.off;
        size_t hi = b < reg.off + reg.len ? b : reg.off + reg.len;
        const wstate *ws = &r->ws[lane][w];

        if (lo >= hi)
            continue;
        if (ws->d_step > k)
            continue;
        if (ws->d_step < k || ws->d_end < hi)
            return 0;
    }
    return 1;
}

static int post(run *r, wstate *ws, int is_send, int step, int hdr, char *buf,
                size_t a, size_t len, int slot)
{
    const weft__lane *ln = &r->op.lanes[ws->lane];
    frame *f;
    int rc;

    if (is_send)
        f = &ws->s_fr[(ws->s_head + ws->s_count) % FIFO_CAP];
    else
        f = &ws->r_fr[(ws->r_head + ws->r_count) % FIFO_CAP];
    f->x = (weft__xfer){0};
    f->ws = ws;
    f->step = step;
    f->hdr = hdr;
    f->a = a;
    f->len = len;
    f->slot = slot;
    f->x.done = is_send ? send_done : recv_done;
    f->x.bulk = is_send && r->bulk;
    f->x.buf = buf;
    f->x.len = len;
    if (is_send) {
        rc = r->c->tpo->post_send(r->c->tp, ln->send_peer, ws->w, &f->x);
        if (rc == 0)
            ws->s_count++;
    } else {
        rc = r->c->tpo->post_recv(r->c->tp, ln->recv_peer, ws->w, &f->x);
        if (rc == 0)
            ws->r_count++;
    }
    if (rc != 0 && r->err == 0)
        r->err = rc;
    return rc;
}

static void pump_send(run *r, int lane, wstate *ws)
{
    const weft__lane *ln = &r->op.lanes[lane];

    while (r->err == 0 && ws->s_count < WEFT__SEND_DEPTH &&
           ws->s_step < ln->nsteps) {
        const weft__step *st = &ln->steps[ws->s_step];
        weft__region reg =
            weft__step_region(r, st->send_len, r->sw[lane], ws->w);
        size_t flen, a;

        /* The planner's frames of this wire's own region, and no more:
         * a wire never posts past its region, nor waits for a frame its
         * peer (which computes the same plan) will not send. */
        if (ws->s_frame >= weft__plan_frames(reg.len, r->frame)) {
            ws->s_step++;
            ws->s_frame = 0;
            continue;
        }
        flen = weft__plan_frame_len(reg.len, r->frame, ws->s_frame);
        a = reg.off + ws->s_frame * r->frame;
        assert(flen > 0 && a + flen <= reg.off + reg.len);
        if (!ws->s_hdr) {
            ophdr h = weft__lane_hdr(r, lane, 1);

            /* The stream is this pass's from its header to its last
             * frame ("sharing wires"). */
            if (!weft__tx_take(r, ws))
                break;
            weft__hdr_encode(ws->s_hdrbuf, &h);
            ws->s_hdr = 1;
            if (flen <= HDR_DATA_BYTES &&
                (st->send_dep < 0 ||
                 recv_ready(r, lane, st->send_dep, a, a + flen))) {
                /* The stream carries the same bytes either way. */
                memcpy(ws->s_hdrbuf + HDR_BYTES, st->send_buf + a, flen);
                if (post(r, ws, 1, ws->s_step, 1, (char *)ws->s_hdrbuf, a,
                         HDR_BYTES + flen, -1) != 0)
                    break;
                ws->s_frame++;
                continue;
            }
            post(r, ws, 1, ws->s_step, 1, (char *)ws->s_hdrbuf, 0, HDR_BYTES,
                 -1);
            continue;
        }
        if (st->send_dep >= 0 &&
            !recv_ready(r, lane, st->send_dep, a, a + flen))
            break;
        if (post(r, ws, 1, ws->s_step, 0, (char *)st->send_buf + a, a, flen,
                 -1) != 0)
            break;
        ws->s_frame++;
    }
    if (ws->s_hdr && ws->s_step >= ln->nsteps && r->err == 0)
        weft__tx_done(r, ws);
}

static void pump_recv(run *r, int lane, wstate *ws)
{
    const weft__lane *ln = &r->op.lanes[lane];

    /* A message read early lands whole (unexp_land): no frames. */
    while (r->err == 0 && ws->r_count + ws->r_reducing < r->rdepth &&
           ws->r_step < ln->nsteps && ws->r_unexp == NULL) {
        const weft__step *st = &ln->steps[ws->r_step];
        weft__region reg =
            weft__step_region(r, st->recv_len, r->rw[lane], ws->w);
        size_t flen, a;
        int slot = -1;
        char *buf;

        if (ws->r_frame >= weft__plan_frames(reg.len, r->frame)) {
            ws->r_step++;
            ws->r_frame = 0;
            continue;
        }
        flen = weft__plan_frame_len(reg.len, r->frame, ws->r_frame);
        a = reg.off + ws->r_frame * r->frame;
        assert(flen > 0 && a + flen <= reg.off + reg.len);
        if (!ws->r_hdr) {
            /* The wire's reader hands the header over ("sharing
             * wires"), at once where it came already. */
            if (ws->r_asked || !weft__rx_ask(r, ws))
                break;
            continue;
        }
        if (st->recv_a != NULL) {
            slot = ws->r_slot;
            ws->r_slot = (ws->r_slot + 1) % r->rdepth;
            buf = stage_slot(r, lane, ws->w, slot);
            if (buf == NULL) {
                engine_fail(r, WEFT_ENOMEM, "rank %d: no memory for staging",
                            r->c->rank);
                break;
            }
        } else {
            buf = st->recv_dst + a;
        }
        if (post(r, ws, 0, ws->r_step, 0, buf, a, flen, slot) != 0)
            break;
        ws->r_frame++;
    }
    if (ws->r_owns && ws->r_step >= ln->nsteps && r->err == 0) {
        ws->r_owns = 0;
        weft__rx_release(r->c, ln->recv_peer, ws->w);
    }
}

void weft__pump_lane(run *r, int lane)
{
    int n = lane_wires(r, lane);

    for (int w = 0; w < n && r->err == 0; w++) {
        if (w < r->rw[lane])
            pump_recv(r, lane, &r->ws[lane][w]);
        if (w < r->sw[lane])
            pump_send(r, lane, &r->ws[lane][w]);
    }
}

static int lane_done(const run *r, int lane)
{
    const weft__lane *ln = &r->op.lanes[lane];
    int n = lane_wires(r, lane);

    for (int w = 0; w < n; w++) {
        const wstate *ws = &r->ws[lane][w];
        if (w < r->sw[lane] && (ws->s_step < ln->nsteps || ws->s_count > 0))
            return 0;
        if (w < r->rw[lane] &&
            (ws->r_step < ln->nsteps || ws->r_count > 0 || ws->r_reducing > 0))
            return 0;
    }
    return 1;
}

int weft__engine_ensure(weft__ctx *c)
{
    struct weft__engine *e = c->eng;
    int maxw = 1;

    if (e != NULL)
        return WEFT_OK;
    for (int p = 0; p < c->nranks; p++) {
        int n = c->tpo->nwires(c->tp, p);
        if (n > maxw)
            maxw = n;
    }
    e = calloc(1, sizeof *e);
    if (e == NULL)
        return WEFT_ENOMEM;
    e->frame_bytes = c->cfg->frame_bytes;
    e->maxw = maxw;
    e->stage = calloc((size_t)WEFT__MAX_LANES * (size_t)maxw * STAGE_SLOTS,
                      sizeof *e->stage);
    if (e->stage == NULL || weft__wires_init(c, e) != 0) {
        free(e->stage);
        free(e);
        return WEFT_ENOMEM;
    }
    c->eng = e;
    return WEFT_OK;
}

void weft__engine_free(weft__ctx *c)
{
    struct weft__engine *e = c->eng;

    weft__pool_destroy(c->pool);
    c->pool = NULL;
    free(c->pull_tmp);
    c->pull_tmp = NULL;
    c->pull_tmp_bytes = 0;
    if (e == NULL)
        return;
    weft__reducer_destroy(e->reducer);
    weft__wires_reset(c);
    weft__match_free(c);
    free(e->rx);
    free(e->tx);
    for (size_t i = 0;
         i < (size_t)WEFT__MAX_LANES * (size_t)e->maxw * STAGE_SLOTS; i++)
        free(e->stage[i]);
    free(e->stage);
    pass_destroy(e->spare);
    free(e);
    c->eng = NULL;
}

/* ---- passes ---- */

static void op_free_steps(weft__op *op)
{
    for (int l = 0; l < op->nlanes; l++)
        free(op->lanes[l].steps);
}

void weft__op_init(weft__op *op, weft_dtype dt, weft_redop redop)
{
    memset(op, 0, sizeof *op);
    op->dtype = dt;
    op->redop = redop;
    op->esize = weft_dtype_size(dt);
}

weft__step *weft__op_steps(weft__op *op, int lane, int nsteps)
{
    weft__step *st = calloc((size_t)(nsteps > 0 ? nsteps : 1), sizeof *st);

    op->lanes[lane].steps = st;
    op->lanes[lane].nsteps = nsteps;
    for (int k = 0; st != NULL && k < nsteps; k++)
        st[k].send_dep = -1;
    return st;
}

/* A pass that cannot start: op's steps are freed; before anything of its
 * call moved, c stays usable (the error is only noted); later, the call
 * is broken half way and c fails. */
int weft__start_error(weft__ctx *c, weft__call *k, weft__op *op, int err,
                      const char *fmt, ...)
    __attribute__((format(printf, 5, 6)));

int weft__start_error(weft__ctx *c, weft__call *k, weft__op *op, int err,
                      const char *fmt, ...)
{
    va_list ap;

    op_free_steps(op);
    va_start(ap, fmt);
    if (k->passes == 0)
        vsnprintf(c->errmsg, sizeof c->errmsg, fmt, ap);
    else {
        weft__vfail(&c->fail, err, fmt, ap);
        c->tpo->shutdown(c->tp);
    }
    va_end(ap);
    return err;
}

/* Frees the pass's own memory; the engine keeps one for the next pass. */
static void pass_free(weft__ctx *c, weft__pass *r)
{
    op_free_steps(&r->op);
    if (c->eng != NULL && c->eng->spare == NULL)
        c->eng->spare = r;
    else
        pass_destroy(r);
}

/* Points each lane of r at its wires' states, zeroed but for what each
 * is (r->wsmem grows where the pass needs more than the last one). */
static int pass_wires(run *r)
{
    size_t need = 0, at = 0;

    for (int l = 0; l < r->op.nlanes; l++)
        need += (size_t)lane_wires(r, l);
    if (need > r->wscap) {
        wstate *m = malloc(need * sizeof *m);

        if (m == NULL)
            return WEFT_ENOMEM;
        free(r->wsmem);
        r->wsmem = m;
        r->wscap = need;
    }
    for (int l = 0; l < r->op.nlanes; l++) {
        int n = lane_wires(r, l);

        r->ws[l] = r->wsmem + at;
        at += (size_t)n;
        for (int w = 0; w < n; w++) {
            wstate *ws = &r->ws[l][w];

            memset(ws, 0, offsetof(wstate, s_fr));
            ws->run = r;
            ws->lane = l;
            ws->w = w;
            ws->d_step = -1;
        }
    }
    return WEFT_OK;
}

/* The bytes op's steps reduce on arrival, all lanes together. */
static size_t pass_reduces(const weft__op *op)
{
    size_t n = 0;

    for (int l = 0; l < op->nlanes; l++)
        for (int s = 0; s < op->lanes[l].nsteps; s++)
            if (op->lanes[l].steps[s].recv_a != NULL)
                n += op->lanes[l].steps[s].recv_len;
    return n;
}

/* The bytes a pass sends, over all its lanes. */
static size_t pass_sends(const weft__op *op)
{
    size_t n = 0;

    for (int l = 0; l < op->nlanes; l++)
        for (int s = 0; s < op->lanes[l].nsteps; s++)
            n += op->lanes[l].steps[s].send_len;
    return n;
}

int weft__pass_start(weft__ctx *c, weft__call *k, weft__op *op,
                     const weft__relay *relay, weft__pass **out)
{
    int sw[WEFT__MAX_LANES], rw[WEFT__MAX_LANES], rc;
    run *r;

    *out = NULL;
    for (int l = 0; l < op->nlanes; l++)
        if (op->lanes[l].steps == NULL)
            return weft__start_error(c, k, op, WEFT_ENOMEM,
                                     "rank %d: %s: out of memory", c->rank,
                                     k->name);
    if ((rc = weft__engine_ensure(c)) != 0)
        return weft__start_error(c, k, op, rc,
                                 "rank %d: %s: no memory for the engine",
                                 c->rank, k->name);
    if (relay != NULL && !c->tpo->relay->offered)
        return weft__start_error(c, k, op, WEFT_ENOTSUP,
                                 "rank %d: %s: no wires to rank %d, and the %s "
                                 "transport cannot relay",
                                 c->rank, k->name,
                                 relay->dst >= 0 ? relay->dst : relay->src,
                                 c->tpo->name);
    /* Every lane's peers have wires, found before anything moved. */
    for (int l = 0; l < op->nlanes; l++) {
        const weft__lane *ln = &op->lanes[l];

        sw[l] = ln->send_peer >= 0 ? c->tpo->nwires(c->tp, ln->send_peer) : 0;
        rw[l] = ln->recv_peer >= 0 ? c->tpo->nwires(c->tp, ln->recv_peer) : 0;
        if ((ln->send_peer >= 0 && sw[l] == 0) ||
            (ln->recv_peer >= 0 && rw[l] == 0))
            return weft__start_error(
                c, k, op, WEFT_ENOTSUP,
                "rank %d: %s needs a direct link to peer %d, "
                "and this job has none",
                c->rank, k->name,
                sw[l] == 0 && ln->send_peer >= 0 ? ln->send_peer
                                                 : ln->recv_peer);
    }
    if ((r = c->eng->spare) != NULL) {
        c->eng->spare = NULL;
        memset(r, 0, offsetof(run, op));
    } else if ((r = calloc(1, sizeof *r)) == NULL)
        return weft__start_error(c, k, op, WEFT_ENOMEM,
                                 "rank %d: %s: out of memory", c->rank,
                                 k->name);
    r->c = c;
    r->k = k;
    /* The op's own fields and its lanes, not the unused ones. */
    memcpy(&r->op, op,
           offsetof(weft__op, lanes) +
               (size_t)op->nlanes * sizeof op->lanes[0]);
    op->nlanes = 0; /* the steps are the pass's now */
    op = &r->op;
    r->frame = c->cfg->frame_bytes;
    /* Counted only where the thread could take the pass's frames. */
    if (c->cfg->reduce_thread && !op->inline_reduce &&
        pass_reduces(op) < c->cfg->reduce_thread_pass_bytes)
        op->inline_reduce = 1;
    /* With the reducer, a frame holds its slot while it waits to be
     * reduced: more slots keep the sockets read meanwhile. */
    r->rdepth = c->cfg->reduce_thread && !op->inline_reduce
                    ? WEFT__RECV_DEPTH_REDUCER
                    : WEFT__RECV_DEPTH;
    r->bulk =
        c->cfg->send_thread && pass_sends(op) >= c->cfg->send_thread_pass_bytes;
    r->pass = k->passes++;
    r->rdst = relay != NULL ? relay->dst : -1;
    r->rsrc = relay != NULL ? relay->src : -1;
    if (relay != NULL)
        memset(&r->rl_sh, 0, sizeof *r - offsetof(run, rl_sh));
    r->rl_sh.done = r->rl_sx.done = r->rdst < 0;
    r->rl_rh.done = r->rl_rx.done = r->rsrc < 0;
    for (int l = 0; l < op->nlanes; l++) {
        r->sw[l] = sw[l];
        r->rw[l] = rw[l];
    }
    if (pass_wires(r) != WEFT_OK)
        engine_fail(r, WEFT_ENOMEM, "rank %d: %s: out of memory", c->rank,
                    k->name);
    for (int l = 0; l < op->nlanes && r->err == 0; l++) {
        const weft__lane *ln = &op->lanes[l];

        r->stotal[l] = r->rtotal[l] = 0;
        for (int s = 0; s < ln->nsteps; s++) {
            r->stotal[l] += ln->steps[s].send_len;
            r->rtotal[l] += ln->steps[s].recv_len;
        }
        /* Collectives are matched by the call's number; point-to-point
         * messages by their tag (the lane's), and those of tag 0 also by
         * their number between the pair, each way (a message of another
         * tag may come between them: match.c). */
        r->sseq[l] = r->rseq[l] = k->seq;
        if (k->kind == WEFT__OP_P2P) {
            r->sseq[l] = r->rseq[l] = 0;
            if (ln->send_peer >= 0 && ln->tag == 0)
                r->sseq[l] = c->send_seq[ln->send_peer]++;
            if (ln->recv_peer >= 0 && ln->tag == 0)
                r->rseq[l] = c->recv_seq[ln->recv_peer]++;
        }
    }
    if (r->err == 0 && r->pass == 0 && c->box != 0 && k->kind != WEFT__OP_P2P)
        weft__box_announce(r);
    if (r->err == 0) {
        /* The relayed halves first, then the lanes: a check channel never
         * shares a direction of a wire with a lane, and a check sent to a
         * peer the lanes receive from then finds that wire read (no look
         * for a close before it, tcp/data.c). */
        if (relay != NULL)
            weft__post_relay(r, relay);
        weft__plan_checks(r);
        for (int l = 0; l < op->nlanes && r->err == 0; l++)
            weft__pump_lane(r, l);
        weft__post_checks(r);
    }
    *out = r;
    return WEFT_OK;
}

int weft__pass_test(const weft__pass *r)
{
    if (r->err != 0)
        return r->err;
    if (r->box)
        return r->box_put && r->box_left == 0 ? WEFT_OK : WEFT__PENDING;
    if (r->probe)
        return r->probe_src >= 0 ? WEFT_OK : WEFT__PENDING;
    if (!weft__check_done(r) || !weft__relay_done_all(r))
        return WEFT__PENDING;
    for (int l = 0; l < r->op.nlanes; l++)
        if (!lane_done(r, l))
            return WEFT__PENDING;
    return WEFT_OK;
}

void weft__pass_end(weft__pass *r, int rc)
{
    weft__ctx *c = r->c;

    if (rc == WEFT_OK)
        rc = weft__pass_test(r);
    if (r->box)
        c->tpo->box->watch(c->tp, 0);
    if (r->probe)
        weft__probe_leave(r);
#ifndef NDEBUG
    /* The design's invariant: an operation that ends has no frame in
     * flight on any wire (a failed one is shut down below instead). */
    for (int l = 0; rc == 0 && l < r->op.nlanes; l++)
        for (int w = 0; w < lane_wires(r, l); w++)
            assert(r->ws[l][w].s_count == 0 && r->ws[l][w].r_count == 0 &&
                   r->ws[l][w].r_reducing == 0);
#endif
    if (rc != WEFT_OK) {
        if (rc == WEFT__PENDING)
            rc = WEFT_EABORTED;
        /* The reducer may still be writing the caller's buffer, or about
         * to: it stops before the call returns. */
        if (c->eng != NULL)
            weft__reducer_cancel(c->eng->reducer);
        /* Drop every frame in flight (none may touch the caller's buffers
         * once we return) and fail the communicator. */
        weft__call_fail(c, rc, "rank %d: %s failed: %s", c->rank, r->k->name,
                        weft_strerror(rc));
        /* Nothing is in flight now: every stream starts afresh (no
         * later operation runs on c but to fail at once). */
        weft__wires_reset(c);
    }
    pass_free(c, r);
}
