/*
 * Requests: every operation on a communicator, blocking or not, runs as a
 * task (engine/task.h) driven by one thread at a time.
 *
 * Who drives: a blocking call with nothing pending runs its task on the
 * caller's thread, as it always did (no hand-off, so its latency is the
 * engine's). The first non-blocking post starts the communicator's
 * progress thread, which from then on runs every queued request while the
 * caller computes; a blocking call that finds requests pending queues
 * behind them and waits. A weft_wait that finds nobody driving runs the
 * queue itself up to its request (drive_for), as a blocking call would,
 * and leaves the rest to the thread. Where some peer is reached only
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
 *
 * Lifetime: the scheduling state (weft__sched) is shared by the
 * communicator and its requests and freed with the last of them, so a
 * request stays valid after weft_finalize until weft_request_free.
 */
#include "core/internal.h"

#include "core/tune.h"
#include "transport/transport.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* A request is queued until it starts, runs until its task ends, then
 * completes: its result is set and it counts as done for weft_test while
 * its callback runs (R_COMPLETING), and weft_wait returns once that ran
 * (R_DONE). */
enum { R_QUEUED, R_RUNNING, R_COMPLETING, R_DONE };

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

typedef struct weft__sched {
    pthread_mutex_t mu;
    pthread_cond_t cv;         /* completions, the driver role released, work */
    int refs;                  /* the communicator's, and each request's */
    weft_comm *c;              /* NULL once finalized */
    weft_request *head, *tail; /* pending (queued or running), post order */
    int ncoll;                 /* collectives among them */
    uint64_t posted;           /* order numbers given out */
    int driving;               /* a thread runs the engine (one at most) */
    int stop;                  /* finalize: the thread ends */
    int idle_off;              /* the transport failed: no idle polling */
    uint64_t spin_ns;          /* idle_spin's time; 0: sleep at once */
    atomic_uint kicks;         /* posts and the stop, for idle_spin */
    /* The progress thread naps (progress_main): posts need not wake it. */
    int napping;
    atomic_int has_thread;
    pthread_t thread;
    /* The driver's: requests running now (linked by act_next), and a
     * byte per peer and way for pick()'s scan. */
    weft_request *active;
    unsigned char *busy;
    weft__pass **ps; /* their passes in flight (at most 2 per peer + 1) */
} weft__sched;

struct weft_request {
    weft__sched *s;
    uint64_t order; /* post order on its communicator */
    weft__opdesc d;
    int timeout_ms; /* weft_set_timeout at the post */
    uint64_t seq;   /* collectives: the communicator's count of them */
    weft__call k;
    weft__task t;
    int state;        /* R_*, under s->mu */
    atomic_uint done; /* state is R_DONE (read without the lock) */
    int result;
    int freed;   /* weft_request_free came first: freed once done */
    int waiting; /* threads in weft_wait on it */
    weft_callback cb, cb_run;
    void *cb_arg;
    weft_request *next, *prev; /* the pending queue, then a completed chain */
    /* What it reads and writes, [lo, hi) each, for the hazards between
     * pending operations (pick). */
    uintptr_t rd_lo, rd_hi, wr_lo, wr_hi;
    /* The driver's, while it runs: how many requests from this one on it
     * runs as one (a batch), what its task returned last, the next
     * running one, and the next to start. */
    uint32_t nbatch;
    uint32_t hint;
    int rc;
    weft_request *act_next, *start_next;
};

/* ---- shared state ---- */

static void sched_destroy(weft__sched *s)
{
    free(s->busy);
    free(s->ps);
    pthread_cond_destroy(&s->cv);
    pthread_mutex_destroy(&s->mu);
    free(s);
}

/* Drops one reference (s->mu held); 1 when s is to be destroyed once the
 * lock is released. */
static int sched_unref(weft__sched *s)
{
    return --s->refs == 0;
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
    s->ps = malloc((2 * (size_t)c->x.nranks + 2) * sizeof *s->ps);
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

/* Before a thread sleeps on s->cv for work (the progress thread) or for a
 * completion (weft_wait), it polls *word for a change from `seen` for
 * s->spin_ns, without the lock: waking a sleeping thread costs 10-20 us on
 * a host of many cores, more than a small operation over shared memory.
 * Only where the host has a core per thread to spare (cfg.spare_cores);
 * else the spin would take the core the other thread needs. 1 when the
 * word changed. */
static int idle_spin(const weft__sched *s, const atomic_uint *word,
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

/* Runs d to completion on the calling thread, nothing else pending. */
static int run_op(weft_comm *c, const weft__opdesc *d, int timeout_ms,
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

    rc = end_op(c, &r->d, rc, &r->k, &r->t);
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
            sched_unref(s);
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

/* The communicator failed and nothing runs: every queued request
 * completes with WEFT_EABORTED. */
static void fail_queued(weft__sched *s)
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

/* Marks the requests that may start now, from the queue in post order,
 * and returns them (linked by start_next), each batch's first with its
 * length and its hint. A collective starts once every earlier one ended;
 * a point-to-point request once every earlier one between the same pair
 * the same way ended (so messages match in post order, on one stream at
 * a time); either only once no earlier pending request touches bytes it
 * touches where one of them writes. */
static weft_request *pick(weft__sched *s, weft_comm *c)
{
    const int n = c->x.nranks;
    unsigned char *sbusy = s->busy, *rbusy = s->busy + n;
    weft_request *first = NULL, **link = &first, *q = s->head;
    int coll_pending = 0;

    memset(s->busy, 0, 2 * (size_t)n);
    while (q != NULL) {
        weft_request *next = q->next;
        const int p2p = q->d.kind == WEFT__OP_P2P;
        const int dst = q->d.a.dst, src = q->d.a.src;
        int ok;

        if (p2p)
            ok = (dst < 0 || !sbusy[dst]) && (src < 0 || !rbusy[src]);
        else
            ok = !coll_pending;
        if (p2p) {
            if (dst >= 0)
                sbusy[dst] = 1;
            if (src >= 0)
                rbusy[src] = 1;
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

/* Runs the queue until it is empty or, with `until`, until that request
 * is done (s->mu held on entry and exit; the caller set s->driving).
 * Every request that may start starts; the running ones progress
 * together, the thread sleeping in the transport while none can. */
static void drive(weft__sched *s, weft_comm *c, const weft_request *until)
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
        for (r = s->active; r != NULL; r = r->act_next) {
            if (r->rc == WEFT__PENDING)
                r->rc = weft__task_progress(&r->t);
            if (r->rc != WEFT__PENDING) {
                ended = 1;
                failed |= r->rc != WEFT_OK;
            } else if ((s->ps[np] = weft__task_pass_of(&r->t)) != NULL)
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
            fail_queued(s);
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
            drive(s, c, NULL);
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
            idle_spin(s, &s->kicks, seen);
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

/* Starts the progress thread unless it runs (s->mu held). */
static int thread_start(weft__sched *s)
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
    rc = thread_start(c->s);
    pthread_mutex_unlock(&c->s->mu);
    return rc;
}

/* ---- posting ---- */

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
            return run_op(c, d, c->x.timeout_ms, seq, &k, &t);
        pthread_mutex_lock(&s->mu);
        if (s->head == NULL && !s->driving) {
            s->driving = 1;
            pthread_mutex_unlock(&s->mu);
            rc = run_op(c, d, c->x.timeout_ms, seq, &k, &t);
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
    if ((rc = thread_start(s)) != WEFT_OK) {
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
    fail_queued(s);
    s->c = NULL;
    destroy = sched_unref(s);
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
    drive(s, s->c, req);
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
        idle_spin(s, &req->done, 0);
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
    destroy = sched_unref(s);
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
