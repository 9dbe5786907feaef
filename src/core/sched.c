/*
 * The requests' scheduler (request.c has the requests themselves, their
 * posting and the request API): who runs the tasks (engine/task.h) of a
 * communicator's requests, in what order and in which batches, and how they
 * complete.
 *
 * Who drives: a blocking call with nothing pending runs its task on the
 * caller's thread, as it always did (no hand-off, so its latency is the
 * engine's). The first non-blocking post starts the communicator's
 * progress thread, which from then on runs every queued request while the
 * caller computes; a blocking call that finds requests pending queues
 * behind them and waits. A weft_wait that finds nobody driving runs the
 * queue itself up to its request (drive_for, request.c), as a blocking call
 * would, and leaves the rest to the thread. Where some peer is reached only
 * through the relay, the thread starts with the communicator and keeps
 * the transport moving between operations, so that relayed messages pass
 * through this rank even while it is not inside a weft call.
 *
 * Order (API.md, "Order"): the driver starts every queued request that
 * may start (pick) and progresses all that run together. Collectives run
 * one at a time in post order, as every rank posts them. A point-to-point
 * request starts once every earlier one with the same peer the same way
 * has ended (so messages match in post order), whatever else is pending:
 * a posted receive never holds back a later send, nor a collective a
 * point-to-point request or the reverse; they share the wires as the
 * engine's "sharing wires" says. A request whose bytes overlap those of
 * an earlier pending one, where either writes, waits for it to end; so
 * every operation sees the results of the earlier ones it touches, and
 * the deadline of each starts when it starts. Scratch buffers are the
 * collectives' alone, one of which runs at a time.
 *
 * Batches: small all_reduces posted back to back are latency bound, so
 * consecutive ones run as one call over their inputs laid end to end in a
 * buffer, each result copied out in post order, where the algorithm allows
 * it (the table's batch flag, tune.h: each element's result does not depend on
 * the batch), they have one count, and no operation of the batch reads what an
 * earlier one writes. One count, so that where ranks' calls differ the batch's
 * first operation is one that differs, and fails alone (a batch of 100 and 101
 * elements that another rank ran as 100 and 100 blamed the request that
 * matched, naming a count nobody called). Every rank must run the same batches,
 * but each sees its own queue: so every batchable call carries in its headers
 * how many batchable operations this rank has queued behind it
 * (weft__call.hint), and the ranks' minimum, known to every rank when the call
 * ends, is the size of the next batch. A rank that ran the call with nothing
 * queued offers 0, so a lone or blocking all_reduce runs alone, as before; a
 * batch starts when its first operation would have started, under its deadline.
 *
 * Completion: a failure completes the failing request with its code and,
 * once the communicator has failed, every other pending one with
 * WEFT_EABORTED (those running are abandoned: their frames go with the
 * transport, shut down), in one batch: their callbacks run (outside the lock,
 * in the completing thread), then one broadcast wakes whoever waits for any of
 * them. A request nobody waits for or registered a callback on costs neither a
 * wake-up nor a call.
 */
#include "core/sched.h"

#include "core/tune.h"
#include "transport/transport.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* While posts keep coming, the progress thread naps (NAP_NS at a time,
 * up to NAPS naps after the last post) instead of sleeping until a post
 * signals it. A signal per post woke the thread, which found the poster
 * driving its own request in weft_wait and slept again: on the 2-core VM,
 * 2 ranks, dist.all_reduce of 2 floats through torch took 8.0-9.7 us
 * with a signal per post and 2.6-3.1 us without, and 40% of rank 0's
 * time was the kernel switching threads. A request nobody waits for
 * starts within a nap (plus the kernel's timer slack) of its post;
 * weft_test and a blocking call queued behind requests still signal. */
#define NAP_NS 100000L
#define NAPS 50
/* A batch takes at most this many operations, and no more bytes than
 * this gathered over the ranks (its first operation alone may). */
#define BATCH_MAX_OPS 256
#define BATCH_GATHERED_BYTES ((size_t)1 << 20)

/* ---- idle spinning ---- */

int weft__sched_idle_spin(const weft__sched *s, const atomic_uint *word,
                          unsigned seen)
{
    uint64_t end;

    if (s->spin_ns == 0)
        return 0;
    end = weft__now_ns() + s->spin_ns;
    for (unsigned i = 1;; i++) {
        if (atomic_load_explicit(word, memory_order_acquire) != seen)
            return 1;
        if ((i & 63) == 0 && weft__now_ns() >= end)
            return 0;
#if defined(__x86_64__) || defined(__i386__)
        __builtin_ia32_pause();
#endif
    }
}

/* ---- running operations (the driver, without the lock) ---- */

/* Starts d's task t of call k: its deadline starts now. hint: this
 * rank's offer for the next batch (batchable d only). WEFT__PENDING while
 * it runs, else its result (it ended, or could not start). */
static int start_op(weft_comm *c, const weft__opdesc *d, int timeout_ms,
                    uint64_t seq, uint32_t hint, uint64_t parts, weft__call *k,
                    weft__task *t)
{
    const int batchable = d->batch;
    int rc;

    if (atomic_load(&c->x.fail.code) != 0 || atomic_load(&c->x.aborted)) {
        weft__set_error(&c->x, WEFT_EABORTED,
                        "rank %d: %s: communicator aborted (weft_abort or "
                        "weft_finalize)",
                        c->x.rank, d->name);
        memset(t, 0, sizeof *t);
        return WEFT_EABORTED;
    }
    k->deadline_ms = weft__now_ms() + (uint64_t)timeout_ms;
    k->name = d->name;
    k->kind = d->kind;
    k->dtype = (int)d->a.dtype;
    k->redop = d->redop;
    k->root = d->a.root;
    k->count = d->a.count;
    k->seq = seq;
    k->passes = 0;
    k->timeout_ms = timeout_ms;
    k->hint = batchable ? hint : 0;
    k->parts = parts;
    k->tag = d->kind == WEFT__OP_P2P ? d->tag : 0;
    weft__task_init(t, &c->x, k, &d->a);
    if ((rc = d->post(t)) != WEFT_OK)
        return rc;
    return weft__task_progress(t);
}

/* After d's task ended with rc (WEFT__PENDING: it is abandoned, as the
 * communicator failed): what every operation's end does. */
static int end_op(weft_comm *c, const weft__opdesc *d, int rc, weft__call *k,
                  weft__task *t)
{
    weft__task_end(t, rc == WEFT__PENDING ? WEFT_EABORTED : rc);
    if (rc == WEFT__PENDING)
        rc = WEFT_EABORTED;
    if (rc != WEFT_OK && atomic_load(&c->x.fail.code) != 0)
        atomic_store(&c->reported, 1);
    if (d->kind == WEFT__OP_P2P)
        return rc;
    if (rc == WEFT_OK)
        weft__call_end(&c->x, k->seq);
    /* Every rank's hint, lowered to the minimum by the call's headers. */
    c->batch_next = rc == WEFT_OK && d->batch ? k->hint : 0;
    return rc;
}

int weft__sched_run_op(weft_comm *c, const weft__opdesc *d, int timeout_ms,
                       uint64_t seq, weft__call *k, weft__task *t)
{
    int rc = start_op(c, d, timeout_ms, seq, 0, 0, k, t);

    if (rc == WEFT__PENDING)
        rc = weft__task_wait(t);
    return end_op(c, d, rc, k, t);
}

/* ---- batches (see the top of this file) ---- */

/* Does q read bytes that an operation of the batch from first up to q
 * writes? */
static int reads_batch(const weft_request *first, const weft_request *q)
{
    for (const weft_request *p = first; p != q; p = p->next)
        if (q->rd_lo < p->wr_hi && p->wr_lo < q->rd_hi)
            return 1;
    return 0;
}

/* Whether a pending request p, posted before q, and q touch the same
 * bytes where one of them writes. */
static int hazard(const weft_request *p, const weft_request *q)
{
    return (p->wr_lo < q->rd_hi && q->rd_lo < p->wr_hi) ||
           (p->rd_lo < q->wr_hi && q->wr_lo < p->rd_hi) ||
           (p->wr_lo < q->wr_hi && q->wr_lo < p->wr_hi);
}

/* Whether q has a hazard with a pending point-to-point request posted
 * before it. */
static int p2p_hazard(const weft__sched *s, const weft_request *q)
{
    for (const weft_request *p = s->head; p != q; p = p->next)
        if (p->d.kind == WEFT__OP_P2P && hazard(p, q))
            return 1;
    return 0;
}

/* How many requests from r on (at most max) make a batch: consecutive
 * queued batchable all_reduces with r's algorithm, count, dtype, op and
 * timeout, within the batch's bytes, none reading what an earlier one of
 * them writes nor touching what a pending point-to-point request posted
 * before it does. Every prefix of a batch is one, and what was one stays
 * one while the queue changes, so a batch that every rank offered can
 * start on every rank. One count: the ranks' calls differ then only where
 * the first operation of the batch does, which is the request that fails
 * (API: a request whose call matched on every rank gets its bits). Fills
 * out[] where not NULL. (s->mu held.) */
static uint32_t batch_len(const weft__sched *s, const weft_comm *c,
                          const weft_request *r, uint32_t max,
                          const weft_request **out)
{
    size_t es, total = 0;
    uint32_t n = 0;

    if (r == NULL || !r->d.batch)
        return 0;
    es = weft_dtype_size(r->d.a.dtype);
    for (const weft_request *q = r; q != NULL && n < max; q = q->next) {
        const weft__args *a = &q->d.a;
        size_t bytes = a->count * es;

        if (q->state != R_QUEUED || q->d.post != r->d.post ||
            a->count != r->d.a.count || a->dtype != r->d.a.dtype ||
            a->op != r->d.a.op || q->timeout_ms != r->timeout_ms)
            break;
        if (n > 0 &&
            (total + bytes) * (size_t)c->x.nranks > BATCH_GATHERED_BYTES)
            break;
        if (reads_batch(r, q) || p2p_hazard(s, q))
            break;
        if (out != NULL)
            out[n] = q;
        total += bytes;
        n++;
    }
    return n;
}

/* The digest of a batch's counts, in order, that its headers carry
 * (weft__call.parts): ranks whose batches hold as many elements split
 * another way fail with WEFT_EMISMATCH rather than mix operations. Never
 * 0, the value of a call that is one operation. */
static uint64_t batch_parts(const weft_request *r, uint32_t n)
{
    uint64_t h = 0x9e3779b97f4a7c15ull ^ n;

    for (uint32_t i = 0; i < n; i++, r = r->next) {
        h ^= (uint64_t)r->d.a.count;
        h *= 0xff51afd7ed558ccdull;
        h ^= h >> 33;
    }
    return h != 0 ? h : 1;
}

/* Copies each request's input into buf, end to end (in), or its result
 * out of buf into its receive buffer. */
static void batch_copy(const weft_request *r, uint32_t n, size_t es, char *buf,
                       int in)
{
    for (uint32_t i = 0; i < n; i++, r = r->next) {
        size_t bytes = r->d.a.count * es;

        if (in)
            memcpy(buf, r->d.a.sendbuf, bytes);
        else
            memcpy(r->d.a.recvbuf, buf, bytes);
        buf += bytes;
    }
}

/* Starts request r, and with it the r->nbatch - 1 after it as one
 * all_reduce over their inputs end to end where it is a batch.
 * hint: this rank's offer for the next batch. */
static int start_req(weft_comm *c, weft_request *r, uint32_t hint)
{
    const uint32_t n = r->nbatch;
    weft__opdesc d = r->d;
    size_t es, total = 0;

    if (n <= 1)
        return start_op(c, &r->d, r->timeout_ms, r->seq, hint, 0, &r->k, &r->t);
    es = weft_dtype_size(d.a.dtype);
    total = d.a.count * n;
    if (total * es > c->batch_bytes) {
        char *p = realloc(c->batch_buf, total * es);

        if (p == NULL) {
            memset(&r->t, 0, sizeof r->t);
            return weft__note(&c->x, WEFT_ENOMEM,
                              "rank %d: %s: cannot allocate %zu bytes for a "
                              "batch of %u operations",
                              c->x.rank, d.name, total * es, (unsigned)n);
        }
        c->batch_buf = p;
        c->batch_bytes = total * es;
    }
    batch_copy(r, n, es, c->batch_buf, 1);
    d.a.sendbuf = c->batch_buf;
    d.a.recvbuf = c->batch_buf;
    d.a.count = total;
    /* The request's own description stays; the call runs the batch's. */
    r->k.count = total;
    return start_op(c, &d, r->timeout_ms, r->seq, hint, batch_parts(r, n),
                    &r->k, &r->t);
}

/* r's task ended with rc (or is abandoned: WEFT__PENDING): its end, and
 * a batch's results copied out. (The requests are still queued in
 * order: nobody else removes them.) */
static int end_req(weft_comm *c, weft_request *r, int rc)
{
    const uint32_t n = r->nbatch;
    weft_request *last = r;

    /* A receive's source: the peer it named, or the one an any-source
     * receive found (its task's). */
    r->source = rc == WEFT_OK && r->d.kind == WEFT__OP_P2P && r->d.a.src != -1
                    ? r->t.a.src
                    : -1;
    rc = end_op(c, &r->d, rc, &r->k, &r->t);
    r->source = rc == WEFT_OK ? r->source : -1;
    if (n > 1) {
        for (uint32_t i = 1; i < n; i++)
            last = last->next;
        if (rc == WEFT_OK) {
            batch_copy(r, n, weft_dtype_size(r->d.a.dtype), c->batch_buf, 0);
            /* The batch took the numbers of all its operations. */
            weft__call_end(&c->x, last->seq);
        }
    }
    return rc;
}

/* ---- completion (s->mu held) ---- */

/* Completes the chain `batch` (linked by next, results set): callbacks
 * run without the lock, each request done for weft_test already, then
 * the requests are done, their waiters woken once, and the ones already
 * freed by their owner are freed. */
static void complete(weft__sched *s, weft_request *batch)
{
    weft_request *q, *next;
    int calls = 0, wake = 0;

    for (q = batch; q != NULL; q = q->next) {
        q->state = R_COMPLETING;
        q->cb_run = q->cb;
        calls |= q->cb_run != NULL;
    }
    if (calls) {
        pthread_mutex_unlock(&s->mu);
        for (q = batch; q != NULL; q = q->next)
            if (q->cb_run != NULL)
                q->cb_run(q, q->result, q->cb_arg);
        pthread_mutex_lock(&s->mu);
    }
    for (q = batch; q != NULL; q = next) {
        next = q->next;
        q->next = NULL;
        q->state = R_DONE;
        atomic_store_explicit(&q->done, 1, memory_order_release);
        wake |= q->waiting > 0;
        if (q->freed) {
            /* Never the last reference: the communicator holds one
             * while its requests complete. */
            weft__sched_unref(s);
            free(q);
        }
    }
    if (wake)
        pthread_cond_broadcast(&s->cv);
}

/* Takes r out of the pending queue. */
static void unlink_req(weft__sched *s, weft_request *r)
{
    if (r->prev != NULL)
        r->prev->next = r->next;
    else
        s->head = r->next;
    if (r->next != NULL)
        r->next->prev = r->prev;
    else
        s->tail = r->prev;
    r->next = r->prev = NULL;
    if (r->d.kind != WEFT__OP_P2P)
        s->ncoll--;
}

/* The running request r (and the rest of its batch) ended with rc: they
 * leave the queue and complete (the first with rc; where it failed, the
 * others with rc, or with WEFT_EABORTED once the communicator has
 * failed). */
static void finish_req(weft__sched *s, weft_comm *c, weft_request *r, int rc)
{
    weft_request *chain = NULL, **link = &chain, *q = r;
    const uint32_t n = r->nbatch > 0 ? r->nbatch : 1;
    int failed = rc != WEFT_OK && (atomic_load(&c->x.fail.code) != 0 ||
                                   atomic_load(&c->x.aborted));

    for (uint32_t i = 0; i < n; i++) {
        weft_request *next = q->next;

        q->result = i == 0 ? rc : failed ? WEFT_EABORTED : rc;
        unlink_req(s, q);
        *link = q;
        link = &q->next;
        q = next;
    }
    complete(s, chain);
}

void weft__sched_fail_queued(weft__sched *s)
{
    weft_request *chain = s->head;

    if (chain == NULL)
        return;
    for (weft_request *q = chain; q != NULL; q = q->next)
        q->result = WEFT_EABORTED;
    s->head = s->tail = NULL;
    s->ncoll = 0;
    complete(s, chain);
}

/* ---- choosing what runs (s->mu held) ---- */

/* Whether a receive posted before q, still pending, may take a message
 * q could take: one of q's tag from the same peer, or either from any
 * source. q starts only once those ended, so that messages of one tag
 * between a pair match in post order and no message goes to two
 * receives (an any-source receive and a specific one, or two any-source
 * ones). Receives of other tags run beside it. */
static int recv_blocked(const weft__sched *s, const weft_request *q)
{
    const int src = q->d.a.src, tag = q->d.tag;

    if (src == -1)
        return 0;
    for (const weft_request *p = s->head; p != q; p = p->next)
        if (p->d.kind == WEFT__OP_P2P && p->d.a.src != -1 && p->d.tag == tag &&
            (p->d.a.src == src || src == WEFT__SRC_ANY ||
             p->d.a.src == WEFT__SRC_ANY))
            return 1;
    return 0;
}

/* Marks the requests that may start now, from the queue in post order,
 * and returns them (linked by start_next), each batch's first with its
 * length and its hint. A collective starts once every earlier one ended;
 * a point-to-point send once every earlier send to the same peer ended (so
 * messages leave in post order, on one stream at a time), a receive once
 * every earlier receive that could take its message ended (recv_blocked);
 * either only once no earlier pending request touches bytes it
 * touches where one of them writes. */
static weft_request *pick(weft__sched *s, weft_comm *c)
{
    const int n = c->x.nranks;
    unsigned char *sbusy = s->busy;
    weft_request *first = NULL, **link = &first, *q = s->head;
    int coll_pending = 0;

    memset(s->busy, 0, 2 * (size_t)n);
    while (q != NULL) {
        weft_request *next = q->next;
        const int p2p = q->d.kind == WEFT__OP_P2P;
        const int dst = q->d.a.dst;
        int ok;

        if (p2p)
            ok = (dst < 0 || !sbusy[dst]) && !recv_blocked(s, q);
        else
            ok = !coll_pending;
        if (p2p) {
            if (dst >= 0)
                sbusy[dst] = 1;
        } else
            coll_pending = 1;
        ok = ok && q->state == R_QUEUED;
        for (const weft_request *p = s->head; ok && p != q; p = p->next)
            ok = !hazard(p, q);
        if (ok) {
            q->nbatch = 1;
            q->hint = 0;
            if (!p2p && q->d.batch) {
                /* The batch the ranks agreed on (every rank has it
                 * queued: each offered no more than it had), and this
                 * rank's offer for the next. */
                const weft_request *b[BATCH_MAX_OPS];
                uint32_t m = batch_len(
                    s, c, q, c->batch_next > 1 ? c->batch_next : 1, b);

                q->nbatch = m > 0 ? m : 1;
                q->hint = batch_len(s, c, b[q->nbatch - 1]->next, BATCH_MAX_OPS,
                                    NULL);
            }
            q->start_next = NULL;
            *link = q;
            link = &q->start_next;
            next = q;
            for (uint32_t i = 0; i < q->nbatch; i++, next = next->next)
                next->state = R_RUNNING;
        }
        q = next;
    }
    return first;
}

/* ---- driving ---- */

/* Makes room in s->ps for a pass of every running request (receives of
 * different tags from one peer run beside each other, so there may be
 * more than two per peer). Without memory, the driver waits on the first
 * ps_cap: the others still progress in the same transport. */
static void grow_ps(weft__sched *s)
{
    size_t n = 0;
    weft__pass **ps;

    for (const weft_request *r = s->active; r != NULL; r = r->act_next)
        n++;
    if (n <= s->ps_cap)
        return;
    if ((ps = realloc(s->ps, 2 * n * sizeof *ps)) == NULL)
        return;
    s->ps = ps;
    s->ps_cap = 2 * n;
}

void weft__sched_drive(weft__sched *s, weft_comm *c, const weft_request *until)
{
    unsigned seen = atomic_load(&s->kicks);
    int rescan = 1;

    for (;;) {
        weft_request *start = NULL, *r, **pr;
        int ended = 0, failed = 0, np = 0;

        if (until != NULL && until->state == R_DONE)
            break;
        if (rescan || atomic_load(&s->kicks) != seen) {
            seen = atomic_load(&s->kicks);
            start = pick(s, c);
        }
        if (start == NULL && s->active == NULL)
            break;
        pthread_mutex_unlock(&s->mu);
        for (r = start; r != NULL; r = r->start_next) {
            r->rc = start_req(c, r, r->hint);
            r->act_next = s->active;
            s->active = r;
        }
        grow_ps(s);
        for (r = s->active; r != NULL; r = r->act_next) {
            if (r->rc == WEFT__PENDING)
                r->rc = weft__task_progress(&r->t);
            if (r->rc != WEFT__PENDING) {
                ended = 1;
                failed |= r->rc != WEFT_OK;
            } else if ((size_t)np < s->ps_cap &&
                       (s->ps[np] = weft__task_pass_of(&r->t)) != NULL)
                np++;
        }
        if (ended)
            for (r = s->active; r != NULL; r = r->act_next)
                if (r->rc != WEFT__PENDING)
                    r->rc = end_req(c, r, r->rc);
        if (failed &&
            (atomic_load(&c->x.fail.code) != 0 || atomic_load(&c->x.aborted)))
            /* The communicator failed: what still runs is abandoned (its
             * frames dropped with the transport) and ends with
             * WEFT_EABORTED, as the ones not started will. */
            for (r = s->active; r != NULL; r = r->act_next)
                if (r->rc == WEFT__PENDING)
                    r->rc = end_req(c, r, WEFT__PENDING);
        if (!ended && np > 0 && atomic_load(&s->kicks) == seen)
            weft__passes_wait(s->ps, np);
        else if (!ended && np == 0 && s->active != NULL) {
            /* Running with nothing in flight to wait for: cannot be (an
             * algorithm's part that neither ended nor started a pass). */
            weft__call_fail(&c->x, WEFT_EABORTED,
                            "rank %d: %s: nothing in flight", c->x.rank,
                            s->active->d.name);
            for (r = s->active; r != NULL; r = r->act_next)
                r->rc = end_req(c, r, WEFT__PENDING);
            ended = 1;
        }
        pthread_mutex_lock(&s->mu);
        rescan = ended;
        for (pr = &s->active; (r = *pr) != NULL;) {
            if (r->rc == WEFT__PENDING) {
                pr = &r->act_next;
                continue;
            }
            *pr = r->act_next;
            finish_req(s, c, r, r->rc);
        }
        if (s->active == NULL &&
            (atomic_load(&c->x.fail.code) != 0 || atomic_load(&c->x.aborted)))
            weft__sched_fail_queued(s);
    }
}

/* One nap of the progress thread (s->mu held on entry and exit): a wait
 * for s->cv of at most NAP_NS, during which a post does not signal it. */
static void nap(weft__sched *s)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    ts.tv_nsec += NAP_NS;
    if (ts.tv_nsec >= 1000000000L) {
        ts.tv_sec++;
        ts.tv_nsec -= 1000000000L;
    }
    s->napping = 1;
    pthread_cond_timedwait(&s->cv, &s->mu, &ts);
    s->napping = 0;
}

static void *progress_main(void *arg)
{
    weft__sched *s = arg;
    weft_comm *c = s->c; /* finalize joins this thread before freeing c */
    int spun = 0;        /* idle_spin ran since the last work */
    int naps = 0;        /* naps left before a sleep that posts must end */

    weft__on_progress_thread = 1;
    pthread_mutex_lock(&s->mu);
    for (;;) {
        if (s->head != NULL && !s->driving) {
            s->driving = 1;
            weft__sched_drive(s, c, NULL);
            s->driving = 0;
            spun = 0;
            naps = NAPS;
            pthread_cond_broadcast(&s->cv);
            continue;
        }
        if (s->stop)
            break;
        if (c->relays && !s->idle_off && !s->driving && c->x.tp != NULL &&
            atomic_load(&c->x.fail.code) == 0) {
            /* Nothing to run: keep the transport moving, so that relayed
             * messages pass through (a post wakes it). */
            int rc;

            s->driving = 1;
            pthread_mutex_unlock(&s->mu);
            rc = c->x.tpo->progress(c->x.tp, weft__now_ms() + 1000);
            pthread_mutex_lock(&s->mu);
            s->driving = 0;
            if (rc != WEFT_OK && rc != WEFT_ETIMEDOUT)
                s->idle_off = 1; /* recorded; the next operation says so */
            pthread_cond_broadcast(&s->cv);
            continue;
        }
        if (!spun && s->spin_ns > 0) {
            /* The next post may come at once (a loop of post and wait). */
            unsigned seen = atomic_load(&s->kicks);

            spun = 1;
            pthread_mutex_unlock(&s->mu);
            weft__sched_idle_spin(s, &s->kicks, seen);
            pthread_mutex_lock(&s->mu);
            continue;
        }
        if (naps > 0) {
            /* Posts came lately: nap, so that the next ones need not wake
             * this thread (see NAP_NS). */
            unsigned seen = atomic_load(&s->kicks);

            nap(s);
            naps = atomic_load(&s->kicks) != seen ? NAPS : naps - 1;
            continue;
        }
        pthread_cond_wait(&s->cv, &s->mu);
        naps = NAPS;
    }
    pthread_mutex_unlock(&s->mu);
    return NULL;
}

int weft__sched_thread_start(weft__sched *s)
{
    sigset_t all, old;
    int rc;

    if (atomic_load(&s->has_thread))
        return WEFT_OK;
    /* Signals go to the application's threads, never to ours. */
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &old);
    rc = pthread_create(&s->thread, NULL, progress_main, s);
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    if (rc != 0)
        return WEFT_ENOMEM;
    atomic_store(&s->has_thread, 1);
    return WEFT_OK;
}

int weft__sched_relays(weft_comm *c)
{
    int rc;

    pthread_mutex_lock(&c->s->mu);
    rc = weft__sched_thread_start(c->s);
    pthread_mutex_unlock(&c->s->mu);
    return rc;
}
