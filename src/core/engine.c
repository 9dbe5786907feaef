/*
 * The pipeline engine; see engine.h.
 *
 * State is kept per lane and per wire: a send cursor (step, offset in the
 * wire's region) and a receive cursor, each with a FIFO of frames in flight.
 * Frames on one wire complete in order, so the receive side's "done" point
 * is a single (step, end offset) pair per wire, and a send frame that
 * depends on received bytes checks exactly the wires whose regions overlap
 * it. Every cursor advances only within its own wire's region, so no frame
 * is ever posted past the end of a region and no wire waits for a frame
 * its peer will not send.
 */
#include "core/engine.h"

#include "core/kernels.h"
#include "core/plan.h"
#include "transport/transport.h"

#include <assert.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define HDR_MAGIC 0x57464f50u /* "WFOP" */
#define HDR_BYTES 16
#define FIFO_CAP 8 /* > max(SEND_DEPTH, RECV_DEPTH) */

struct wstate;

typedef struct frame {
    weft__xfer x; /* first: the transport hands this back */
    struct wstate *ws;
    int step;
    int hdr; /* a channel header, not data */
    size_t a; /* offset in the step's buffer */
    size_t len;
    int slot; /* staging slot of a reduced frame, -1 if none */
} frame;

typedef struct wstate {
    struct run *run;
    int lane;
    int w;
    /* send side */
    int s_step;
    size_t s_off;
    int s_hdr;
    int s_head, s_count;
    frame s_fr[FIFO_CAP];
    uint8_t s_hdrbuf[HDR_BYTES];
    /* receive side */
    int r_step;
    size_t r_off;
    int r_hdr;
    int r_head, r_count;
    int r_slot;
    int d_step; /* last step with a completed frame, -1 if none */
    size_t d_end; /* end offset in that step's buffer of the done frames */
    frame r_fr[FIFO_CAP];
    uint8_t r_hdrbuf[HDR_BYTES];
} wstate;

struct weft__engine {
    size_t frame_bytes;
    int maxw;
    /* staging: [lane][wire][slot], frame_bytes each, allocated on demand */
    char **stage;
};

typedef struct run {
    struct weft_comm *c;
    const weft__op *op;
    size_t frame;
    int err;
    int sw[WEFT__MAX_LANES]; /* wires to the lane's send peer */
    int rw[WEFT__MAX_LANES]; /* wires to the lane's receive peer */
    uint32_t sseq[WEFT__MAX_LANES];
    uint32_t rseq[WEFT__MAX_LANES];
    uint64_t stotal[WEFT__MAX_LANES];
    uint64_t rtotal[WEFT__MAX_LANES];
    wstate *ws[WEFT__MAX_LANES]; /* max(sw, rw) entries per lane */
} run;

static void pump_lane(run *r, int lane);

/* Wire w's region of a step of len bytes over nw wires; len 0 or an unused
 * wire gives an empty region. */
static weft__region step_region(const run *r, size_t len, int nw, int w)
{
    weft__region reg = {0, 0};
    int used;

    if (len == 0 || nw <= 0)
        return reg;
    used = weft__plan_wires(len, nw, r->c->cfg.min_wire_bytes);
    if (w >= used)
        return reg;
    return weft__plan_region(len, used, r->op->esize, w);
}

static int engine_fail(run *r, int err, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

static int engine_fail(run *r, int err, const char *fmt, ...)
{
    char msg[WEFT__ERRMSG_LEN];
    va_list ap;

    if (r->err != 0)
        return r->err;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    r->err = err;
    weft__set_error(r->c, err, "%s", msg);
    return err;
}

static char *stage_slot(run *r, int lane, int w, int slot)
{
    struct weft__engine *e = r->c->eng;
    size_t i = ((size_t)lane * (size_t)e->maxw + (size_t)w) *
                   WEFT__RECV_DEPTH +
               (size_t)slot;

    if (e->stage[i] == NULL)
        e->stage[i] = malloc(e->frame_bytes);
    return e->stage[i];
}

static void hdr_pack(uint8_t *b, const run *r, int lane, uint32_t seq,
                     uint64_t total)
{
    uint32_t v[4];

    v[0] = HDR_MAGIC;
    v[1] = (uint32_t)r->op->kind | (uint32_t)r->op->dtype << 8 |
           (uint32_t)r->op->redop << 16 |
           (uint32_t)r->op->lanes[lane].tag << 24;
    v[2] = seq;
    v[3] = (uint32_t)(total ^ (total >> 32));
    memcpy(b, v, sizeof v);
}

/* ---- completions ---- */

static void send_done(weft__xfer *x)
{
    frame *f = (frame *)x;
    wstate *ws = f->ws;

    assert(&ws->s_fr[ws->s_head] == f);
    ws->s_head = (ws->s_head + 1) % FIFO_CAP;
    ws->s_count--;
    pump_lane(ws->run, ws->lane);
}

static void recv_done(weft__xfer *x)
{
    frame *f = (frame *)x;
    wstate *ws = f->ws;
    run *r = ws->run;
    const weft__step *st = &r->op->lanes[ws->lane].steps[f->step];

    assert(&ws->r_fr[ws->r_head] == f);
    ws->r_head = (ws->r_head + 1) % FIFO_CAP;
    ws->r_count--;
    if (f->hdr) {
        uint8_t want[HDR_BYTES];
        hdr_pack(want, r, ws->lane, r->rseq[ws->lane], r->rtotal[ws->lane]);
        if (memcmp(want, ws->r_hdrbuf, HDR_BYTES) != 0) {
            engine_fail(r, WEFT_EMISMATCH,
                        "rank %d: %s: peer %d on wire %d called a different "
                        "operation, dtype, op, count or sequence (header "
                        "mismatch)",
                        r->c->rank, r->op->name,
                        r->op->lanes[ws->lane].recv_peer, ws->w);
            return;
        }
    } else {
        if (f->slot >= 0)
            weft__reduce3(st->recv_dst + f->a, st->recv_a + f->a,
                          stage_slot(r, ws->lane, ws->w, f->slot),
                          f->len / r->op->esize, r->op->dtype, r->op->redop);
        ws->d_step = f->step;
        ws->d_end = f->a + f->len;
    }
    pump_lane(r, ws->lane);
}

/* ---- posting ---- */

/* Have bytes [a, b) of receive step k of the lane arrived on every wire
 * whose region overlaps them? */
static int recv_ready(run *r, int lane, int k, size_t a, size_t b)
{
    const weft__step *st = &r->op->lanes[lane].steps[k];

    for (int w = 0; w < r->rw[lane]; w++) {
        weft__region reg = step_region(r, st->recv_len, r->rw[lane], w);
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
    const weft__lane *ln = &r->op->lanes[ws->lane];
    frame *f;
    int rc;

    if (is_send)
        f = &ws->s_fr[(ws->s_head + ws->s_count) % FIFO_CAP];
    else
        f = &ws->r_fr[(ws->r_head + ws->r_count) % FIFO_CAP];
    memset(f, 0, sizeof *f);
    f->ws = ws;
    f->step = step;
    f->hdr = hdr;
    f->a = a;
    f->len = len;
    f->slot = slot;
    f->x.done = is_send ? send_done : recv_done;
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
    const weft__lane *ln = &r->op->lanes[lane];

    while (r->err == 0 && ws->s_count < WEFT__SEND_DEPTH &&
           ws->s_step < ln->nsteps) {
        const weft__step *st = &ln->steps[ws->s_step];
        weft__region reg = step_region(r, st->send_len, r->sw[lane], ws->w);
        size_t flen, a;

        if (ws->s_off >= reg.len) {
            ws->s_step++;
            ws->s_off = 0;
            continue;
        }
        if (!ws->s_hdr) {
            hdr_pack(ws->s_hdrbuf, r, lane, r->sseq[lane], r->stotal[lane]);
            ws->s_hdr = 1;
            post(r, ws, 1, ws->s_step, 1, (char *)ws->s_hdrbuf, 0, HDR_BYTES,
                 -1);
            continue;
        }
        flen = weft__plan_frame_len(reg.len, r->frame, ws->s_off / r->frame);
        a = reg.off + ws->s_off;
        if (st->send_dep >= 0 && !recv_ready(r, lane, st->send_dep, a, a + flen))
            break;
        if (post(r, ws, 1, ws->s_step, 0, (char *)st->send_buf + a, a, flen,
                 -1) != 0)
            break;
        ws->s_off += flen;
    }
}

static void pump_recv(run *r, int lane, wstate *ws)
{
    const weft__lane *ln = &r->op->lanes[lane];

    while (r->err == 0 && ws->r_count < WEFT__RECV_DEPTH &&
           ws->r_step < ln->nsteps) {
        const weft__step *st = &ln->steps[ws->r_step];
        weft__region reg = step_region(r, st->recv_len, r->rw[lane], ws->w);
        size_t flen, a;
        int slot = -1;
        char *buf;

        if (ws->r_off >= reg.len) {
            ws->r_step++;
            ws->r_off = 0;
            continue;
        }
        if (!ws->r_hdr) {
            ws->r_hdr = 1;
            post(r, ws, 0, ws->r_step, 1, (char *)ws->r_hdrbuf, 0, HDR_BYTES,
                 -1);
            continue;
        }
        flen = weft__plan_frame_len(reg.len, r->frame, ws->r_off / r->frame);
        a = reg.off + ws->r_off;
        if (st->recv_a != NULL) {
            slot = ws->r_slot;
            ws->r_slot = (ws->r_slot + 1) % WEFT__RECV_DEPTH;
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
        ws->r_off += flen;
    }
}

static void pump_lane(run *r, int lane)
{
    int n = r->sw[lane] > r->rw[lane] ? r->sw[lane] : r->rw[lane];

    for (int w = 0; w < n && r->err == 0; w++) {
        if (w < r->rw[lane])
            pump_recv(r, lane, &r->ws[lane][w]);
        if (w < r->sw[lane])
            pump_send(r, lane, &r->ws[lane][w]);
    }
}

static int lane_done(const run *r, int lane)
{
    const weft__lane *ln = &r->op->lanes[lane];
    int n = r->sw[lane] > r->rw[lane] ? r->sw[lane] : r->rw[lane];

    for (int w = 0; w < n; w++) {
        const wstate *ws = &r->ws[lane][w];
        if (w < r->sw[lane] && (ws->s_step < ln->nsteps || ws->s_count > 0))
            return 0;
        if (w < r->rw[lane] && (ws->r_step < ln->nsteps || ws->r_count > 0))
            return 0;
    }
    return 1;
}

/* Names what the operation was still waiting for, for a timeout message. */
static void describe_wait(const void *arg, char *out, size_t outlen)
{
    const run *r = arg;

    snprintf(out, outlen, "nothing");
    for (int l = 0; l < r->op->nlanes; l++) {
        const weft__lane *ln = &r->op->lanes[l];
        for (int w = 0; w < r->rw[l]; w++) {
            const wstate *ws = &r->ws[l][w];
            if (ws->r_count > 0 || ws->r_step < ln->nsteps) {
                int step = ws->r_count > 0 ? ws->r_fr[ws->r_head].step
                                           : ws->r_step;
                snprintf(out, outlen,
                         "data from peer %d on wire %d (step %d of %d)",
                         ln->recv_peer, w, step + 1, ln->nsteps);
                return;
            }
        }
        for (int w = 0; w < r->sw[l]; w++) {
            const wstate *ws = &r->ws[l][w];
            if (ws->s_count > 0 || ws->s_step < ln->nsteps) {
                int step = ws->s_count > 0 ? ws->s_fr[ws->s_head].step
                                           : ws->s_step;
                snprintf(out, outlen,
                         "peer %d to take data on wire %d (step %d of %d)",
                         ln->send_peer, w, step + 1, ln->nsteps);
                return;
            }
        }
    }
}

/* One wait of an operation, shared by every loop that waits on the
 * transport: an abort, the deadline or a failed wire ends the wait with
 * its error, which is stored in *err unless *err already holds one (a
 * completion may have failed meanwhile, and the first cause wins); the
 * timeout message names what the operation waited for (describe). The
 * deadline is checked here too, not only by the transport: a transport
 * whose progress() keeps returning early (events that move nothing this
 * operation waits for) must not keep a caller past it. */
static void wait_once(struct weft_comm *c, const char *name,
                      uint64_t deadline,
                      void (*describe)(const void *, char *, size_t),
                      const void *arg, int *err)
{
    char what[160];
    int rc;

    if (atomic_load(&c->aborted)) {
        if (*err == 0)
            *err = weft__set_error(c, WEFT_EABORTED,
                                   "rank %d: %s aborted by weft_abort()",
                                   c->rank, name);
        return;
    }
    rc = weft__now_ms() >= deadline ? WEFT_ETIMEDOUT
                                    : c->tpo->progress(c->tp, deadline);
    if (rc == 0 || *err != 0)
        return;
    if (rc == WEFT_ETIMEDOUT) {
        describe(arg, what, sizeof what);
        weft__set_error(c, rc,
                        "rank %d: %s passed its deadline of %d ms "
                        "(weft_set_timeout or WEFT_TIMEOUT_MS) waiting for "
                        "%s",
                        c->rank, name, c->timeout_ms, what);
    }
    *err = rc;
}

/* After a failed operation: drop every frame in flight (none may touch the
 * caller's buffers once we return) and fail the communicator. */
static void op_failed(struct weft_comm *c, int err)
{
    c->tpo->shutdown(c->tp);
    c->failed = err;
}

static int engine_ensure(struct weft_comm *c)
{
    struct weft__engine *e = c->eng;
    int maxw = 1;

    for (int p = 0; p < c->nranks; p++) {
        int n = c->tpo->nwires(c->tp, p);
        if (n > maxw)
            maxw = n;
    }
    if (e != NULL)
        return WEFT_OK;
    e = calloc(1, sizeof *e);
    if (e == NULL)
        return WEFT_ENOMEM;
    e->frame_bytes = c->cfg.frame_bytes;
    e->maxw = maxw;
    e->stage = calloc((size_t)WEFT__MAX_LANES * (size_t)maxw *
                          WEFT__RECV_DEPTH,
                      sizeof *e->stage);
    if (e->stage == NULL) {
        free(e);
        return WEFT_ENOMEM;
    }
    c->eng = e;
    return WEFT_OK;
}

void weft__engine_free(struct weft_comm *c)
{
    struct weft__engine *e = c->eng;

    if (e == NULL)
        return;
    for (size_t i = 0;
         i < (size_t)WEFT__MAX_LANES * (size_t)e->maxw * WEFT__RECV_DEPTH; i++)
        free(e->stage[i]);
    free(e->stage);
    free(e);
    c->eng = NULL;
}

int weft__engine_run(struct weft_comm *c, const weft__op *op)
{
    run r;
    uint64_t deadline;
    int rc, all_done;

    memset(&r, 0, sizeof r);
    r.c = c;
    r.op = op;
    r.frame = c->cfg.frame_bytes;
    if ((rc = engine_ensure(c)) != 0)
        return rc;
    for (int l = 0; l < op->nlanes; l++) {
        const weft__lane *ln = &op->lanes[l];

        r.sw[l] = ln->send_peer >= 0 ? c->tpo->nwires(c->tp, ln->send_peer)
                                     : 0;
        r.rw[l] = ln->recv_peer >= 0 ? c->tpo->nwires(c->tp, ln->recv_peer)
                                     : 0;
        if ((ln->send_peer >= 0 && r.sw[l] == 0) ||
            (ln->recv_peer >= 0 && r.rw[l] == 0)) {
            /* Found before anything moved: the communicator stays usable. */
            snprintf(c->errmsg, sizeof c->errmsg,
                     "rank %d: %s needs a direct link to peer %d, and this "
                     "job has none",
                     c->rank, op->name,
                     r.sw[l] == 0 ? ln->send_peer : ln->recv_peer);
            return WEFT_ENOTSUP;
        }
    }
    for (int l = 0; l < op->nlanes; l++) {
        const weft__lane *ln = &op->lanes[l];
        int n;

        n = r.sw[l] > r.rw[l] ? r.sw[l] : r.rw[l];
        r.ws[l] = calloc((size_t)(n > 0 ? n : 1), sizeof(wstate));
        if (r.ws[l] == NULL) {
            rc = WEFT_ENOMEM;
            goto out;
        }
        for (int w = 0; w < n; w++) {
            r.ws[l][w].run = &r;
            r.ws[l][w].lane = l;
            r.ws[l][w].w = w;
            r.ws[l][w].d_step = -1;
        }
        for (int k = 0; k < ln->nsteps; k++) {
            r.stotal[l] += ln->steps[k].send_len;
            r.rtotal[l] += ln->steps[k].recv_len;
        }
        if (ln->send_peer >= 0)
            r.sseq[l] = c->send_seq[ln->send_peer]++;
        if (ln->recv_peer >= 0)
            r.rseq[l] = c->recv_seq[ln->recv_peer]++;
    }

    deadline = weft__now_ms() + (uint64_t)c->timeout_ms;
    for (int l = 0; l < op->nlanes; l++)
        pump_lane(&r, l);
    for (;;) {
        all_done = 1;
        for (int l = 0; l < op->nlanes && all_done; l++)
            all_done = lane_done(&r, l);
        if (r.err != 0 || all_done)
            break;
        wait_once(c, op->name, deadline, describe_wait, &r, &r.err);
    }
    rc = r.err;
out:
    if (rc != 0)
        op_failed(c, rc);
    for (int l = 0; l < op->nlanes; l++)
        free(r.ws[l]);
    return rc;
}

static void op_free_steps(weft__op *op)
{
    for (int l = 0; l < op->nlanes; l++)
        free(op->lanes[l].steps);
}

void weft__op_init(weft__op *op, int kind, const char *name, weft_dtype dt,
                   weft_redop redop)
{
    memset(op, 0, sizeof *op);
    op->kind = kind;
    op->name = name;
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

int weft__op_run(struct weft_comm *c, weft__op *op)
{
    int rc = WEFT_OK;

    for (int l = 0; l < op->nlanes; l++)
        if (op->lanes[l].steps == NULL)
            rc = weft__set_error(c, WEFT_ENOMEM, "rank %d: %s: out of memory", c->rank, op->name);
    if (rc == WEFT_OK)
        rc = weft__engine_run(c, op);
    op_free_steps(op);
    return rc;
}

/* ---- relayed point to point ---- */

typedef struct {
    weft__xfer x; /* first: the transport hands this back */
    int done;
} relay_xfer;

typedef struct {
    const relay_xfer *rx;
    int dst, src;
} relay_wait;

static void describe_relay(const void *arg, char *out, size_t outlen)
{
    const relay_wait *w = arg;

    snprintf(out, outlen, "a message relayed %s rank %d",
             w->rx->done ? "to" : "from", w->rx->done ? w->dst : w->src);
}

static void relay_done(weft__xfer *x)
{
    ((relay_xfer *)x)->done = 1;
}

int weft__engine_relay(struct weft_comm *c, const char *name,
                       const void *sendbuf, int dst, void *recvbuf, int src,
                       size_t nbytes, weft__op *direct)
{
    relay_xfer sx, rx;
    uint64_t deadline;
    int rc = WEFT_OK;

    memset(&sx, 0, sizeof sx);
    memset(&rx, 0, sizeof rx);
    sx.done = dst < 0;
    rx.done = src < 0;
    if (c->tpo->relay_send == NULL || c->tpo->relay_recv == NULL) {
        snprintf(c->errmsg, sizeof c->errmsg,
                 "rank %d: %s: no wires to rank %d, and the %s transport "
                 "cannot relay",
                 c->rank, name, dst >= 0 ? dst : src, c->tpo->name);
        rc = WEFT_ENOTSUP;
        goto free_op;
    }
    sx.x.done = rx.x.done = relay_done;
    sx.x.buf = (char *)sendbuf;
    sx.x.len = nbytes;
    rx.x.buf = recvbuf;
    rx.x.len = nbytes;
    if (dst >= 0)
        rc = c->tpo->relay_send(c->tp, dst, &sx.x);
    if (rc == 0 && src >= 0)
        rc = c->tpo->relay_recv(c->tp, src, &rx.x);
    /* The half that has wires of its own runs meanwhile; the transport
     * relays while it progresses. */
    if (rc == 0 && direct != NULL)
        rc = weft__engine_run(c, direct);
    deadline = weft__now_ms() + (uint64_t)c->timeout_ms;
    {
        relay_wait w = {&rx, dst, src};
        while (rc == 0 && !(sx.done && rx.done))
            wait_once(c, name, deadline, describe_relay, &w, &rc);
    }
    if (rc != 0)
        op_failed(c, rc);
free_op:
    if (direct != NULL)
        op_free_steps(direct);
    return rc;
}
