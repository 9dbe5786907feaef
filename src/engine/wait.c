/*
 * Waiting for passes (engine.h): in the transport, under each call's
 * deadline, and what a pass still waited for when its deadline passed.
 */
#include "engine/pass.h"

#include <stdint.h>
#include <stdio.h>

/* Names what the operation was still waiting for, for a timeout message. */
static void describe_wait(const run *r, char *out, size_t outlen)
{
    snprintf(out, outlen, "nothing");
    if (r->probe) {
        snprintf(out, outlen, "a message of tag %u from any rank",
                 r->probe_tag);
        return;
    }
    if (r->box) {
        for (int p = 0; p < r->c->nranks; p++)
            if (p != r->c->rank && (r->box_got >> p & 1) == 0) {
                snprintf(out, outlen,
                         "peer %d to start the same call (its message in "
                         "shared memory)",
                         p);
                return;
            }
        if (!r->box_put)
            snprintf(out, outlen,
                     "a peer several calls behind to take this rank's "
                     "earlier messages from shared memory");
        return;
    }
    for (int i = 0; i < r->nchecks; i++) {
        const check *k = &r->checks[i];
        if (k->recv && !k->got) {
            snprintf(out, outlen,
                     "peer %d to start the same call (its header on wire 0)",
                     k->peer);
            return;
        }
    }
    for (int l = 0; l < r->op.nlanes; l++) {
        const weft__lane *ln = &r->op.lanes[l];
        for (int w = 0; w < r->rw[l]; w++) {
            const wstate *ws = &r->ws[l][w];
            if (ws->r_count > 0 || ws->r_step < ln->nsteps) {
                int step =
                    ws->r_count > 0 ? ws->r_fr[ws->r_head].step : ws->r_step;
                snprintf(out, outlen,
                         "data from peer %d on wire %d (step %d of %d)",
                         ln->recv_peer, w, step + 1, ln->nsteps);
                return;
            }
        }
        for (int w = 0; w < r->sw[l]; w++) {
            const wstate *ws = &r->ws[l][w];
            if (ws->s_count > 0 || ws->s_step < ln->nsteps) {
                int step =
                    ws->s_count > 0 ? ws->s_fr[ws->s_head].step : ws->s_step;
                snprintf(out, outlen,
                         "peer %d to take data on wire %d (step %d of %d)",
                         ln->send_peer, w, step + 1, ln->nsteps);
                return;
            }
        }
    }
    if (!r->rl_rh.done || !r->rl_rx.done)
        snprintf(out, outlen, "a message relayed from rank %d", r->rsrc);
    else if (!r->rl_sh.done || !r->rl_sx.done)
        snprintf(out, outlen, "a message relayed to rank %d to leave", r->rdst);
}

/* r's call passed its deadline: the failure, naming what r waited for. */
static int deadline_passed(run *r)
{
    char what[160];

    describe_wait(r, what, sizeof what);
    return weft__set_error(r->c, WEFT_ETIMEDOUT,
                           "rank %d: %s timed out: its deadline of %d ms "
                           "passed (the timeout is weft_set_timeout or "
                           "WEFT_TIMEOUT_MS) waiting for %s",
                           r->c->rank, r->k->name, r->k->timeout_ms, what);
}

void weft__pass_wait(weft__pass *r)
{
    weft__ctx *c = r->c;
    const char *name = r->k->name;
    uint64_t deadline = r->k->deadline_ms;
    int rc;

    if (r->err != 0 || (r->box ? weft__box_wait(r) : weft__reap(r)))
        return;
    /* The deadline is checked here too, not only by the transport: one
     * whose progress() keeps returning early (events that move nothing
     * this pass waits for) must not keep a caller past it. Every 8th wait
     * of a pass is enough for that (progress() itself returns by the
     * deadline where nothing happens); a clock read per wait took 4% of an
     * 8-byte all_reduce among ranks of one host. */
    if (atomic_load(&c->aborted))
        rc = weft__set_error(c, WEFT_EABORTED,
                             "rank %d: %s aborted by weft_abort()", c->rank,
                             name);
    else if ((rc = (++r->waits & 7) == 0 && weft__now_ms() >= deadline
                       ? WEFT_ETIMEDOUT
                       : c->tpo->progress(c->tp, deadline)) == 0) {
        if (r->box)
            weft__box_poll(r);
        else
            weft__reap(r);
        return;
    } else if (r->err != 0)
        /* A completion failed the pass meanwhile: the first cause wins. */
        return;
    else if (rc == WEFT_ETIMEDOUT)
        rc = deadline_passed(r);
    else {
        /* The transport recorded its cause; the first one stands. */
        rc = weft__set_error(c, rc, "rank %d: %s failed: %s", c->rank, name,
                             weft_strerror(rc));
    }
    r->err = rc;
}

void weft__passes_wait(weft__pass *const *ps, int n)
{
    weft__ctx *c = ps[0]->c;
    uint64_t deadline = UINT64_MAX, now;
    int rc;

    if (n == 1) {
        weft__pass_wait(ps[0]);
        return;
    }
    for (int i = 0; i < n; i++) {
        run *r = ps[i];

        if (r->err != 0 || (r->box && weft__box_wait(r)))
            return;
        if (r->k->deadline_ms < deadline)
            deadline = r->k->deadline_ms;
    }
    if (weft__reap(ps[0]))
        return;
    if (atomic_load(&c->aborted)) {
        rc = weft__set_error(c, WEFT_EABORTED,
                             "rank %d: %s aborted by weft_abort()", c->rank,
                             ps[0]->k->name);
        for (int i = 0; i < n; i++)
            ps[i]->err = rc;
        return;
    }
    now = weft__now_ms();
    rc = now >= deadline ? WEFT_ETIMEDOUT : c->tpo->progress(c->tp, deadline);
    if (rc == WEFT_OK) {
        for (int i = 0; i < n; i++)
            if (ps[i]->box)
                weft__box_poll(ps[i]);
        weft__reap(ps[0]);
        return;
    }
    for (int i = 0; i < n; i++)
        if (ps[i]->err != 0)
            return; /* a completion failed a pass meanwhile */
    if (rc == WEFT_ETIMEDOUT) {
        /* Each operation has its own deadline: those past theirs fail. */
        now = weft__now_ms();
        for (int i = 0; i < n; i++)
            if (now >= ps[i]->k->deadline_ms)
                ps[i]->err = deadline_passed(ps[i]);
        return;
    }
    rc = weft__set_error(c, rc, "rank %d: %s failed: %s", c->rank,
                         ps[0]->k->name, weft_strerror(rc));
    for (int i = 0; i < n; i++)
        ps[i]->err = rc;
}
