/*
 * Requests: every operation on a communicator, blocking or not, runs as a
 * task (engine/task.h) driven by one thread at a time; who drives, the
 * order, the batches and the completions are the scheduler's (sched.c).
 * Here: the scheduling state's set-up, posting (weft__submit), finalize and
 * the request API (weft_test, weft_wait, ...).
 *
 * Lifetime: the scheduling state (weft__sched) is shared by the
 * communicator and its requests and freed with the last of them, so a
 * request stays valid after weft_finalize until weft_request_free.
 */
#include "core/sched.h"

#include "core/tune.h"
#include "transport/transport.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* ---- shared state ---- */

static void sched_destroy(weft__sched *s)
{
    free(s->busy);
    free(s->ps);
    pthread_cond_destroy(&s->cv);
    pthread_mutex_destroy(&s->mu);
    free(s);
}

/* A condition whose timed waits run on CLOCK_MONOTONIC (progress_main's
 * naps). */
static int cond_init_monotonic(pthread_cond_t *cv)
{
    pthread_condattr_t a;
    int rc;

    if (pthread_condattr_init(&a) != 0)
        return -1;
    rc = pthread_condattr_setclock(&a, CLOCK_MONOTONIC) != 0 ||
         pthread_cond_init(cv, &a) != 0;
    pthread_condattr_destroy(&a);
    return rc ? -1 : 0;
}

int weft__sched_init(weft_comm *c)
{
    weft__sched *s = calloc(1, sizeof *s);

    if (s == NULL)
        return WEFT_ENOMEM;
    if (pthread_mutex_init(&s->mu, NULL) != 0) {
        free(s);
        return WEFT_ENOMEM;
    }
    if (cond_init_monotonic(&s->cv) != 0) {
        pthread_mutex_destroy(&s->mu);
        free(s);
        return WEFT_ENOMEM;
    }
    s->busy = malloc(2 * (size_t)c->x.nranks + 1);
    s->ps_cap = 2 * (size_t)c->x.nranks + 2;
    s->ps = malloc(s->ps_cap * sizeof *s->ps);
    if (s->busy == NULL || s->ps == NULL) {
        sched_destroy(s);
        return WEFT_ENOMEM;
    }
    s->refs = 1;
    s->c = c;
    if (c->cfg.spare_cores && c->cfg.spin_us > 0)
        s->spin_ns = (uint64_t)c->cfg.spin_us * 1000u;
    atomic_init(&s->kicks, 0);
    atomic_init(&s->has_thread, 0);
    c->s = s;
    return WEFT_OK;
}

/* ---- posting ---- */

/* The bytes an all_to_allv reaches from a buffer (its checks passed). */
static size_t v_extent(const size_t *counts, const size_t *displs, int n,
                       size_t es)
{
    size_t end = 0;

    for (int p = 0; p < n; p++)
        if (counts[p] > 0 && (displs[p] + counts[p]) * es > end)
            end = (displs[p] + counts[p]) * es;
    return end;
}

/* What r reads and writes, for the hazards between pending requests. */
static void req_ranges(const weft_comm *c, weft_request *r)
{
    const weft__args *a = &r->d.a;
    const size_t b = a->count * weft_dtype_size(a->dtype);
    const size_t nb = b * (size_t)c->x.nranks;
    size_t rd = b, wr = b;
    const void *rp = a->sendbuf, *wp = a->recvbuf;

    switch (r->d.kind) {
    case WEFT__OP_ALL_GATHER:
        wr = nb;
        break;
    case WEFT__OP_REDUCE_SCATTER:
        rd = nb;
        break;
    case WEFT__OP_BROADCAST: /* the root reads it, the others write it */
        rp = wp = a->recvbuf;
        break;
    case WEFT__OP_P2P:
        if (a->dst < 0)
            rp = NULL;
        if (a->src < 0)
            wp = NULL;
        break;
    case WEFT__OP_BARRIER:
        rp = wp = NULL;
        break;
    case WEFT__OP_GATHER: /* recvbuf: the root's only (else NULL) */
        wr = nb;
        break;
    case WEFT__OP_SCATTER: /* sendbuf: the root's only (else NULL) */
        rd = nb;
        break;
    case WEFT__OP_ALL_TO_ALL:
        rd = wr = nb;
        break;
    case WEFT__OP_ALL_TO_ALLV: /* count 0: the extents of the counts */
        r->rd_lo = (uintptr_t)rp;
        r->rd_hi = r->rd_lo + v_extent(a->sendcounts, a->sdispls, c->x.nranks,
                                       weft_dtype_size(a->dtype));
        r->wr_lo = (uintptr_t)wp;
        r->wr_hi = r->wr_lo + v_extent(a->recvcounts, a->rdispls, c->x.nranks,
                                       weft_dtype_size(a->dtype));
        return;
    default:
        break;
    }
    if (b == 0 || rp == NULL)
        rd = 0;
    if (b == 0 || wp == NULL)
        wr = 0;
    r->rd_lo = (uintptr_t)rp;
    r->rd_hi = r->rd_lo + rd;
    r->wr_lo = (uintptr_t)wp;
    r->wr_hi = r->wr_lo + wr;
}

/* Appends r to the queue and makes sure someone runs it (s->mu held). */
static void enqueue(weft__sched *s, weft_comm *c, weft_request *r, int wake)
{
    r->order = ++s->posted;
    r->state = R_QUEUED;
    req_ranges(c, r);
    r->prev = s->tail;
    if (s->tail != NULL)
        s->tail->next = r;
    else
        s->head = r;
    s->tail = r;
    atomic_fetch_add_explicit(&s->kicks, 1, memory_order_release);
    /* The driver sleeps in the transport while operations run: a request
     * that may start beside them wakes it (a collective behind another
     * waits for that one's end anyway). */
    if (s->driving && c->x.tp != NULL &&
        (r->d.kind == WEFT__OP_P2P || s->ncoll == 0))
        c->x.tpo->wake(c->x.tp);
    if (r->d.kind != WEFT__OP_P2P)
        s->ncoll++;
    if (wake || !s->napping)
        pthread_cond_broadcast(&s->cv);
}

int weft__submit(weft_comm *c, const weft__opdesc *d, weft_request **req)
{
    weft__sched *s = c->s;
    uint64_t seq = d->kind == WEFT__OP_P2P ? 0 : ++c->coll_seq;
    weft_request *r;
    int rc;

    if (req == NULL) {
        weft__call k;
        weft__task t;
        weft_request mine;

        if (!atomic_load(&s->has_thread))
            /* Nothing pending, nobody else drives: run here. */
            return weft__sched_run_op(c, d, c->x.timeout_ms, seq, &k, &t);
        pthread_mutex_lock(&s->mu);
        if (s->head == NULL && !s->driving) {
            s->driving = 1;
            pthread_mutex_unlock(&s->mu);
            rc = weft__sched_run_op(c, d, c->x.timeout_ms, seq, &k, &t);
            pthread_mutex_lock(&s->mu);
            s->driving = 0;
            pthread_cond_broadcast(&s->cv);
            pthread_mutex_unlock(&s->mu);
            return rc;
        }
        /* Behind pending requests: queued like them, then waited for. */
        memset(&mine, 0, sizeof mine);
        mine.s = s;
        mine.d = *d;
        mine.timeout_ms = c->x.timeout_ms;
        mine.seq = seq;
        mine.waiting = 1;
        enqueue(s, c, &mine, 1); /* this thread waits: no nap first */
        while (mine.state != R_DONE)
            pthread_cond_wait(&s->cv, &s->mu);
        pthread_mutex_unlock(&s->mu);
        return mine.result;
    }
    *req = NULL;
    if ((r = calloc(1, sizeof *r)) == NULL)
        return weft__note(&c->x, WEFT_ENOMEM,
                          "rank %d: %s: no memory for a request", c->x.rank,
                          d->name);
    r->s = s;
    r->d = *d;
    r->timeout_ms = c->x.timeout_ms;
    r->seq = seq;
    pthread_mutex_lock(&s->mu);
    if ((rc = weft__sched_thread_start(s)) != WEFT_OK) {
        pthread_mutex_unlock(&s->mu);
        free(r);
        if (seq != 0)
            c->coll_seq--; /* posted nothing */
        return weft__note(&c->x, rc,
                          "rank %d: %s: cannot start the progress thread",
                          c->x.rank, d->name);
    }
    s->refs++;
    enqueue(s, c, r, 0);
    pthread_mutex_unlock(&s->mu);
    *req = r;
    return WEFT_OK;
}

int weft__request_done(weft_comm *c, int rc, weft_request **req)
{
    weft__sched *s = c->s;
    weft_request *r = calloc(1, sizeof *r);

    *req = NULL;
    if (r == NULL)
        return weft__note(&c->x, WEFT_ENOMEM,
                          "rank %d: no memory for a request", c->x.rank);
    r->s = s;
    r->state = R_DONE;
    atomic_init(&r->done, 1);
    r->result = rc;
    r->source = -1;
    pthread_mutex_lock(&s->mu);
    s->refs++;
    r->order = ++s->posted;
    pthread_mutex_unlock(&s->mu);
    *req = r;
    return WEFT_OK;
}

/* ---- finalize and abort ---- */

void weft__sched_wake(weft_comm *c)
{
    if (c->x.tp != NULL)
        c->x.tpo->wake(c->x.tp);
}

void weft__sched_fini(weft_comm *c)
{
    weft__sched *s = c->s;
    int destroy;

    if (s == NULL)
        return;
    pthread_mutex_lock(&s->mu);
    s->stop = 1;
    atomic_fetch_add_explicit(&s->kicks, 1, memory_order_release);
    if (s->head != NULL)
        /* Pending requests end now, with WEFT_EABORTED. */
        atomic_store(&c->x.aborted, 1);
    if (s->driving)
        weft__sched_wake(c);
    pthread_cond_broadcast(&s->cv);
    pthread_mutex_unlock(&s->mu);
    if (atomic_load(&s->has_thread))
        pthread_join(s->thread, NULL);
    pthread_mutex_lock(&s->mu);
    /* A thread in weft_wait may be running the queue (drive_for); it
     * ends promptly now that the communicator is aborted. */
    while (s->driving)
        pthread_cond_wait(&s->cv, &s->mu);
    /* Never run (no thread could start): they end here. */
    weft__sched_fail_queued(s);
    s->c = NULL;
    destroy = weft__sched_unref(s);
    pthread_mutex_unlock(&s->mu);
    c->s = NULL;
    if (destroy)
        sched_destroy(s);
}

/* ---- the request API ---- */

int weft_test(weft_request *req, int *done)
{
    int rc = WEFT_OK;

    if (req == NULL || done == NULL)
        return WEFT_EINVAL;
    pthread_mutex_lock(&req->s->mu);
    /* Complete, with its result, from before its callback runs. */
    *done = req->state >= R_COMPLETING;
    if (*done)
        rc = req->result;
    else if (req->s->napping && !req->s->driving)
        /* Polled for, not waited for: no nap first. */
        pthread_cond_broadcast(&req->s->cv);
    pthread_mutex_unlock(&req->s->mu);
    return rc;
}

/* A thread about to wait for req runs the queue itself, up to req, where
 * nobody drives it (s->mu held): a post followed at once by a wait (every
 * synchronous call through torch) then costs no hand-off to the progress
 * thread and back, two wake-ups that cost more than a small operation.
 * The progress thread takes over what is left once this one stops. */
static void drive_for(weft__sched *s, weft_request *req)
{
    if (req->state >= R_COMPLETING || s->driving || s->stop || s->c == NULL ||
        s->head == NULL)
        return;
    s->driving = 1;
    weft__sched_drive(s, s->c, req);
    s->driving = 0;
    /* Nobody else waits for the driver role unless work is left (the
     * progress thread, a blocking call queued) or finalize waits; a
     * broadcast for nothing would wake the progress thread per call. */
    if (s->head != NULL || s->stop)
        pthread_cond_broadcast(&s->cv);
}

int weft_wait(weft_request *req)
{
    weft__sched *s;
    int rc;

    if (req == NULL)
        return WEFT_EINVAL;
    s = req->s;
    if (!atomic_load_explicit(&req->done, memory_order_acquire)) {
        pthread_mutex_lock(&s->mu);
        drive_for(s, req);
        pthread_mutex_unlock(&s->mu);
    }
    if (!atomic_load_explicit(&req->done, memory_order_acquire))
        weft__sched_idle_spin(s, &req->done, 0);
    pthread_mutex_lock(&s->mu);
    req->waiting++;
    while (req->state != R_DONE)
        pthread_cond_wait(&s->cv, &s->mu);
    req->waiting--;
    rc = req->result;
    pthread_mutex_unlock(&s->mu);
    return rc;
}

int weft_wait_all(weft_request *const *reqs, size_t n)
{
    int rc = WEFT_OK;

    if (reqs == NULL && n > 0)
        return WEFT_EINVAL;
    /* Requests of one communicator mostly complete in post order: the
     * last posted of each communicator's first, then the rest (most of
     * them done by then: no more wake-ups). */
    for (size_t i = 0; i < n; i++) {
        int last = reqs[i] != NULL;

        for (size_t j = 0; last && j < n; j++)
            if (j != i && reqs[j] != NULL && reqs[j]->s == reqs[i]->s &&
                (reqs[j]->order > reqs[i]->order ||
                 (reqs[j]->order == reqs[i]->order && j > i)))
                last = 0;
        if (last)
            weft_wait(reqs[i]);
    }
    for (size_t i = 0; i < n; i++) {
        int r = reqs[i] != NULL ? weft_wait(reqs[i]) : WEFT_OK;
        if (rc == WEFT_OK)
            rc = r;
    }
    return rc;
}

int weft_request_free(weft_request *req)
{
    weft__sched *s;
    int destroy = 0;

    if (req == NULL)
        return WEFT_OK;
    s = req->s;
    pthread_mutex_lock(&s->mu);
    if (req->state != R_DONE) {
        req->freed = 1; /* the completing thread frees it */
        pthread_mutex_unlock(&s->mu);
        return WEFT_OK;
    }
    destroy = weft__sched_unref(s);
    pthread_mutex_unlock(&s->mu);
    free(req);
    if (destroy)
        sched_destroy(s);
    return WEFT_OK;
}

int weft_request_on_complete(weft_request *req, weft_callback cb, void *arg)
{
    int result;

    if (req == NULL || cb == NULL)
        return WEFT_EINVAL;
    pthread_mutex_lock(&req->s->mu);
    if (req->cb != NULL) {
        pthread_mutex_unlock(&req->s->mu);
        return WEFT_EINVAL;
    }
    req->cb = cb;
    req->cb_arg = arg;
    if (req->state < R_COMPLETING) {
        pthread_mutex_unlock(&req->s->mu);
        return WEFT_OK;
    }
    /* Complete already (or its callbacks are being run without this
     * one): it runs here, now. */
    result = req->result;
    pthread_mutex_unlock(&req->s->mu);
    cb(req, result, arg);
    return WEFT_OK;
}

int weft_request_source(const weft_request *req)
{
    if (req == NULL || !atomic_load_explicit(&req->done, memory_order_acquire))
        return -1;
    return req->source;
}
