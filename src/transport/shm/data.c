/*
 * The shared-memory transport's data path (shm.h says how it works):
 * records into and out of the rings, one-copy reads, a peer's leaving,
 * progress and sleeping, and the ops table's posting. Peers of other hosts
 * are the TCP side's.
 */
#define _GNU_SOURCE
#include "transport/shm/shm.h"

#include "transport/common.h"

#include <errno.h>
#include <poll.h>
#include <sched.h>
#include <stdio.h>
#include <string.h>
#include <sys/uio.h>
#include <unistd.h>

static shm_wire *local_wire(shm_tp *tp, int p, int w)
{
    if (p < 0 || p >= tp->nranks || w != 0)
        return NULL;
    return tp->local[p];
}

static size_t pad16(size_t n)
{
    return (n + 15) & ~(size_t)15;
}

/* Queues a finished frame's completion for progress() to run. */
static void complete(shm_tp *tp, weft__xfer *x)
{
    weft__xq_push(&tp->done_head, &tp->done_tail, x);
}

static void run_done(shm_tp *tp)
{
    while (tp->done_head != NULL && !tp->shut && tp->err == 0) {
        weft__xfer *x = tp->done_head;

        tp->done_head = x->tp_next;
        if (tp->done_head == NULL)
            tp->done_tail = NULL;
        x->tp_next = NULL;
        tp->events++;
        x->done(x);
    }
}

/* After this rank moved one of w's rings: where the peer sleeps, it is
 * woken (the fence orders the ring's store before the look at its flag;
 * the sleeper stores its flag, fences, then looks at the ring). */
static void poke(shm_wire *w)
{
    shm_full_fence();
    shm_wake_sleeper(w);
}

/* The consumer's side of the wake-up: after moving the ring's tail (or
 * cma_done), wakes the producer only if it said it waits for that. The
 * producer raises want, then (a full fence) looks at the ring once more;
 * the consumer moves the ring, then (a full fence, in poke) looks at want:
 * one of them sees the other. */
static void poke_producer(shm_wire *w)
{
    shm_full_fence();
    if (atomic_load_explicit(&w->rx->want, memory_order_relaxed) != 0)
        poke(w);
}

/* The producer's side: raises tx->want (a full fence) while it waits for
 * the consumer, lowers it once it waits for nothing. Returns 1 when it
 * was just raised, so the caller looks at the ring once more. */
static int set_want(shm_wire *w, int v)
{
    if (w->want == v)
        return 0;
    w->want = v;
    if (v) {
        atomic_store(&w->tx->want, 1); /* seq_cst: before the next look */
        return 1;
    }
    atomic_store_explicit(&w->tx->want, 0, memory_order_relaxed);
    return 0;
}

/* ---- sending ---- */

/* Copies len bytes into the ring at position pos (which may wrap). */
static void ring_put(shm_wire *w, uint64_t pos, const void *src, size_t len)
{
    size_t R = w->tp->ring_bytes, off = (size_t)(pos & (R - 1));
    size_t first = len < R - off ? len : R - off;

    memcpy(w->tx_data + off, src, first);
    if (first < len)
        memcpy(w->tx_data, (const char *)src + first, len - first);
}

static void put_header(shm_wire *w, uint64_t pos, uint32_t kind, uint32_t len,
                       uint64_t addr)
{
    char *h = w->tx_data + (size_t)(pos & (w->tp->ring_bytes - 1));

    memcpy(h, &kind, 4);
    memcpy(h + 4, &len, 4);
    memcpy(h + 8, &addr, 8);
}

static int use_cma(const shm_wire *w, const weft__xfer *x)
{
    return w->peer_reads_me && w->tp->cma_bytes != 0 &&
           x->len >= w->tp->cma_bytes;
}

/* Writes the queued sends into the ring as far as it has room. Returns 1
 * if the ring moved. */
static int tx_pump(shm_wire *w)
{
    shm_tp *tp = w->tp;
    uint64_t head = atomic_load_explicit(&w->tx->head, memory_order_relaxed);
    uint64_t tail = atomic_load_explicit(&w->tx->tail, memory_order_acquire);
    uint64_t h0 = head;
    size_t R = tp->ring_bytes;

    while (w->sq_head != NULL) {
        weft__xfer *x = w->sq_head;
        size_t left = x->len - w->sq_off, room = R - (size_t)(head - tail);

        if (use_cma(w, x)) {
            size_t n = left < SHM_CMA_MAX_RECORD ? left : SHM_CMA_MAX_RECORD;
            if (room < SHM_REC_HDR) {
                if (set_want(w, 1)) {
                    tail = atomic_load(&w->tx->tail);
                    continue;
                }
                break;
            }
            put_header(w, head, REC_CMA, (uint32_t)n,
                       (uint64_t)(uintptr_t)(x->buf + w->sq_off));
            head += SHM_REC_HDR;
            w->cma_posted++;
            w->sq_off += n;
            if (w->sq_off < x->len)
                continue;
            /* Complete once the peer has read every record of it. */
            x->got = (size_t)w->cma_posted;
        } else {
            /* An inline record: its header and as many bytes as fit, but
             * not a sliver when more will fit once the peer has read. */
            size_t want = left < R / 4 ? left : R / 4, n;
            if (room < SHM_REC_HDR + pad16(want)) {
                if (set_want(w, 1)) {
                    tail = atomic_load(&w->tx->tail);
                    continue;
                }
                break;
            }
            n = room - SHM_REC_HDR;
            n = n & ~(size_t)15;
            if (n > left)
                n = left;
            put_header(w, head, REC_INLINE, (uint32_t)n, 0);
            ring_put(w, head + SHM_REC_HDR, x->buf + w->sq_off, n);
            head += SHM_REC_HDR + pad16(n);
            w->sq_off += n;
            if (w->sq_off < x->len)
                continue;
            /* Frames complete in order: behind a one-copy frame still
             * being read, this one waits for the same count. */
            x->got = (size_t)w->cma_posted;
        }
        w->sq_head = x->tp_next;
        if (w->sq_head == NULL)
            w->sq_tail = NULL;
        w->sq_off = 0;
        if (w->wq_head != NULL || use_cma(w, x)) {
            /* tx_reap, after this, looks at cma_done. */
            set_want(w, 1);
            weft__xq_push(&w->wq_head, &w->wq_tail, x);
        } else {
            complete(tp, x);
        }
    }
    if (head == h0)
        return 0;
    atomic_store_explicit(&w->tx->head, head, memory_order_release);
    poke(w);
    return 1;
}

/* Completes the one-copy frames the peer has read. */
static void tx_reap(shm_wire *w)
{
    uint64_t done;

    if (w->wq_head == NULL)
        return;
    done = atomic_load(&w->tx->cma_done); /* seq_cst: after want (set_want) */
    while (w->wq_head != NULL && (uint64_t)w->wq_head->got <= done) {
        weft__xfer *x = w->wq_head;

        w->wq_head = x->tp_next;
        if (w->wq_head == NULL)
            w->wq_tail = NULL;
        x->got = x->len;
        complete(w->tp, x);
    }
}

/* ---- receiving ---- */

static void ring_get(shm_wire *w, uint64_t pos, void *dst, size_t len)
{
    size_t R = w->tp->ring_bytes, off = (size_t)(pos & (R - 1));
    size_t first = len < R - off ? len : R - off;

    memcpy(dst, w->rx_data + off, first);
    if (first < len)
        memcpy((char *)dst + first, w->rx_data, len - first);
}

static void rx_pop(shm_wire *w)
{
    weft__xfer *x = w->rq_head;

    w->rq_head = x->tp_next;
    if (w->rq_head == NULL)
        w->rq_tail = NULL;
    complete(w->tp, x);
}

/* What one read of a peer's memory found (peer_readv). */
enum {
    READ_OK,
    READ_FAILED,      /* the kernel refused: its errno in *err */
    READ_LEFT_BEFORE, /* refused, and the peer had left (it failed or
                         finalized and may have unmapped what it named):
                         its leaving, not a fault of this rank */
    READ_LEFT_DURING, /* read, but the peer left by the end of the read */
};

/* process_vm_readv of w's peer: cnt local pieces from riov, the bytes
 * read in *got. The peer's buffer is borrowed only while its operation
 * runs, and a peer marks its leaving before it hands the buffer back: so
 * what was read is trusted only where it had not left by the end of the
 * read (READ_LEFT_DURING otherwise). */
static int peer_readv(const shm_wire *w, const struct iovec *liov, int cnt,
                      const struct iovec *riov, ssize_t *got, int *err)
{
    *got = process_vm_readv(w->pid, liov, (unsigned long)cnt, riov, 1, 0);
    if (*got < 0) {
        *err = errno;
        return atomic_load(w->peer_aborted) != 0 ? READ_LEFT_BEFORE
                                                 : READ_FAILED;
    }
    return atomic_load(w->peer_aborted) != 0 ? READ_LEFT_DURING : READ_OK;
}

/* Reads n bytes of the one-copy record at addr (from its byte r_off on)
 * into the posted receives, up to SHM_MAX_IOV of them. Returns the bytes
 * read, or a negative code (recorded). */
static long cma_read(shm_wire *w, uint64_t addr, size_t n)
{
    struct iovec liov[SHM_MAX_IOV], riov;
    weft__xfer *x = w->rq_head;
    size_t want = 0;
    int cnt = 0, e = 0;
    ssize_t got;

    for (; x != NULL && cnt < SHM_MAX_IOV && want < n; x = x->tp_next) {
        size_t k = x->len - x->got;
        if (k > n - want)
            k = n - want;
        liov[cnt].iov_base = x->buf + x->got;
        liov[cnt].iov_len = k;
        want += k;
        cnt++;
    }
    riov.iov_base = (void *)(uintptr_t)(addr + w->r_off);
    riov.iov_len = want;
    switch (peer_readv(w, liov, cnt, &riov, &got, &e)) {
    case READ_LEFT_BEFORE:
    case READ_LEFT_DURING:
        weft__shm_fail(w->tp, WEFT_EPEER,
                       "rank %d: peer %d (same host) closed its side (it "
                       "failed or finalized) %s this rank read its data",
                       w->tp->rank, w->peer, got < 0 ? "before" : "while");
        return w->tp->err;
    case READ_FAILED:
        weft__shm_fail(w->tp, e == ESRCH ? WEFT_EPEER : WEFT_ETRANSPORT,
                       "rank %d: reading %zu bytes from peer %d (same host, "
                       "pid %d) failed: %s%s",
                       w->tp->rank, want, w->peer, (int)w->pid, strerror(e),
                       e == ESRCH ? " (it exited: its connection closed)" : "");
        return w->tp->err;
    default:
        return (long)got;
    }
}

int weft__shm_can_read(weft__tp *t, int peer)
{
    shm_tp *tp = (shm_tp *)t;
    const shm_wire *w = peer >= 0 && peer < tp->nranks ? tp->local[peer] : NULL;

    return w != NULL && w->seg != NULL && w->can_read_peer && w->peer_reads_me;
}

int weft__shm_peer_read(weft__tp *t, int peer, void *dst, uint64_t addr,
                        size_t len, int *err)
{
    shm_tp *tp = (shm_tp *)t;
    const shm_wire *w = tp->local[peer];
    char *d = dst;

    *err = 0;
    while (len > 0) {
        struct iovec l = {.iov_base = d, .iov_len = len};
        struct iovec r = {.iov_base = (void *)(uintptr_t)addr, .iov_len = len};
        ssize_t got;

        switch (peer_readv(w, &l, 1, &r, &got, err)) {
        case READ_LEFT_BEFORE:
        case READ_LEFT_DURING:
            return WEFT_EPEER;
        case READ_FAILED:
            return *err == ESRCH ? WEFT_EPEER : WEFT_ETRANSPORT;
        default:
            break;
        }
        if (got == 0) { /* nothing mapped there: no progress to make */
            *err = EFAULT;
            return WEFT_ETRANSPORT;
        }
        d += got;
        addr += (uint64_t)got;
        len -= (size_t)got;
    }
    return 0;
}

/* Hands what landed in the ring to the posted receives, in order. Returns
 * 1 if the ring moved, or a negative code. */
static int rx_pump(shm_wire *w)
{
    uint64_t tail = atomic_load_explicit(&w->rx->tail, memory_order_relaxed);
    uint64_t head = atomic_load_explicit(&w->rx->head, memory_order_acquire);
    uint64_t t0 = tail, cma = 0;

    while (w->rq_head != NULL && tail != head) {
        char *h = w->rx_data + (size_t)(tail & (w->tp->ring_bytes - 1));
        uint32_t kind, len;
        uint64_t addr;

        memcpy(&kind, h, 4);
        memcpy(&len, h + 4, 4);
        memcpy(&addr, h + 8, 8);
        if (kind == REC_INLINE) {
            weft__xfer *x = w->rq_head;
            size_t n = x->len - x->got;
            if (n > len - w->r_off)
                n = len - w->r_off;
            ring_get(w, tail + SHM_REC_HDR + w->r_off, x->buf + x->got, n);
            x->got += n;
            w->r_off += n;
            if (x->got == x->len)
                rx_pop(w);
            if (w->r_off == len) {
                tail += SHM_REC_HDR + pad16(len);
                w->r_off = 0;
            }
        } else if (kind == REC_CMA) {
            long got = cma_read(w, addr, len - w->r_off);
            size_t left;
            if (got < 0)
                return (int)got;
            if (got == 0) {
                weft__shm_fail(w->tp, WEFT_ETRANSPORT,
                               "rank %d: reading from peer %d (same host) "
                               "returned nothing",
                               w->tp->rank, w->peer);
                return w->tp->err;
            }
            w->r_off += (uint64_t)got;
            for (left = (size_t)got; left > 0;) {
                weft__xfer *x = w->rq_head;
                size_t k = x->len - x->got;
                if (k > left)
                    k = left;
                x->got += k;
                left -= k;
                if (x->got == x->len)
                    rx_pop(w);
            }
            if (w->r_off == len) {
                tail += SHM_REC_HDR;
                w->r_off = 0;
                cma++;
            }
        } else {
            weft__shm_fail(w->tp, WEFT_ETRANSPORT,
                           "rank %d: garbled record (kind %u) in the ring "
                           "from peer %d",
                           w->tp->rank, kind, w->peer);
            return w->tp->err;
        }
    }
    if (tail == t0)
        return 0;
    atomic_store_explicit(&w->rx->tail, tail, memory_order_release);
    if (cma != 0)
        atomic_fetch_add_explicit(&w->rx->cma_done, cma, memory_order_release);
    poke_producer(w);
    return 1;
}

/* ---- a peer's leaving ---- */

static void note_leavers(shm_tp *tp)
{
    unsigned ends = weft__tcp_ends(tp->tcp);

    if (ends == tp->tcp_ends)
        return;
    tp->tcp_ends = ends;
    for (int i = 0; i < tp->nlocal; i++) {
        shm_wire *w = &tp->wires[i];
        if (!w->dead && weft__tcp_peer_ended(tp->tcp, w->peer)) {
            w->dead = 1;
            weft__log(WEFT__LOG_DEBUG, tp->rank,
                      "peer %d (same host) closed its connection", w->peer);
        }
    }
}

/* A peer that left fails what still waits on it: a send, or a receive
 * that the ring (drained first) can no longer fill. */
static int judge_dead(shm_wire *w)
{
    const char *what = NULL;

    if (w->sq_head != NULL || w->wq_head != NULL)
        what = "sending to it";
    else if (weft__xfer_wanted(w->rq_head) &&
             atomic_load_explicit(&w->rx->head, memory_order_acquire) ==
                 atomic_load_explicit(&w->rx->tail, memory_order_relaxed))
        what = "receiving from it";
    if (what == NULL)
        return 0;
    weft__shm_fail(w->tp, WEFT_EPEER,
                   "rank %d: peer %d (same host, pid %d) closed its "
                   "connection (finalized, failed or exited) while this "
                   "rank was %s",
                   w->tp->rank, w->peer, (int)w->pid, what);
    return w->tp->err;
}

/* ---- progress ---- */

/* What a pass does with the transport to other hosts (tp->fo): nothing,
 * a pass of it, or a look at every part of it (before and after a sleep,
 * and every SHM_TCP_EVERY_NS where it carries no data). */
enum { FAR_NONE, FAR_PASS, FAR_LOOK };

/* One pass over every ring, then the completions. Never blocks. Returns
 * WEFT_OK or the transport's error. */
static int shm_pass(shm_tp *tp, int far)
{
    int rc;

    if (far != FAR_NONE) {
        rc = tp->fo->poll(tp->far, far == FAR_LOOK);
        tp->tcp_ns = weft__now_ns();
        tp->tcp_ticks = shm_ticks();
        if (rc < 0) {
            if (tp->err == 0)
                tp->err = rc; /* the TCP side recorded why */
            return rc;
        }
        if (rc > 0)
            tp->events++;
        note_leavers(tp);
    }
    /* Twice where the completions of the first posted receives (the
     * engine posts a pass's frames once their header came): what already
     * landed goes to them in this pass, not the next. */
    for (int round = 0; round < 2; round++) {
        tp->rx_posted = 0;
        for (int i = 0; i < tp->nlocal && tp->err == 0; i++) {
            shm_wire *w = &tp->wires[i];
            if (w->sq_head != NULL)
                tx_pump(w);
            tx_reap(w);
            if (w->sq_head == NULL && w->wq_head == NULL)
                set_want(w, 0);
            if (w->rq_head != NULL && (rc = rx_pump(w)) < 0)
                return rc;
            if (w->dead && (rc = judge_dead(w)) != 0)
                return rc;
        }
        run_done(tp);
        if (!tp->rx_posted || tp->err != 0)
            break;
    }
    if (tp->box_watch != 0 && weft__shm_box_moved(tp))
        tp->events++;
    if (atomic_load_explicit(&tp->woken, memory_order_relaxed) != 0 &&
        atomic_exchange(&tp->woken, 0) != 0)
        tp->events++;
    return tp->err;
}

/* Whether a pass should look at the transport to other hosts: a pass
 * of it where it carries their data (it looks at its costly parts as
 * often as they are due), else a look (a peer's close, a wake()) every
 * SHM_TCP_EVERY_NS, since a look costs system calls and a small operation
 * among ranks of one host takes about as long as one. */
static int tcp_due(shm_tp *tp)
{
    if (tp->tcp_data)
        return FAR_PASS;
    /* The clock costs about as much as a pass: read it every 16th. */
    return (++tp->passes & 15) == 0 &&
                   weft__now_ns() - tp->tcp_ns >= SHM_TCP_EVERY_NS
               ? FAR_LOOK
               : FAR_NONE;
}

static int spin_pass(void *arg)
{
    shm_tp *tp = arg;
    return shm_pass(tp, tcp_due(tp));
}

static void set_sleeping(shm_tp *tp, uint32_t v)
{
    for (int i = 0; i < tp->nlocal; i++)
        atomic_store(tp->wires[i].my_sleep, v);
}

static void drain_doorbell(shm_tp *tp)
{
    char buf[64];

    while (recv(tp->sock, buf, sizeof buf, MSG_DONTWAIT) >= 0)
        ;
}

/* Sleeps until a peer moves a ring, the TCP side has news, a wake() or
 * the deadline. */
static int shm_block(shm_tp *tp, uint64_t deadline_ms)
{
    unsigned ev = tp->events;
    struct pollfd pfd[1 + WEFT__FAR_FDS];
    uint64_t now;
    int tmo, n = 1, prc;
    int rc;

    weft__shm_box_flush(tp);
    set_sleeping(tp, 1);
    atomic_store(&tp->asleep, 1);
    /* A peer that moved a ring before it could see the flag: look once
     * more (the flag's store and this look are ordered by the fence in
     * atomic_store). */
    rc = shm_pass(tp, FAR_LOOK);
    if (rc != 0 || tp->events != ev)
        goto out;
    now = weft__now_ms();
    if (now >= deadline_ms)
        goto out;
    tmo = deadline_ms - now > 60000 ? 60000 : (int)(deadline_ms - now);
    if (tp->box_room && tmo > SHM_BOX_ROOM_MS)
        tmo = SHM_BOX_ROOM_MS;
    pfd[0] = (struct pollfd){.fd = tp->sock, .events = POLLIN};
    prc = tp->fo->sleep_prep(tp->far, pfd, 1 + WEFT__FAR_FDS, &n, &tmo);
    if (prc != 0) {
        if (prc > 0)
            tp->events++; /* it moved: no sleep */
        else if (tp->err == 0)
            tp->err = prc; /* it recorded why */
        rc = tp->err;
        goto out;
    }
    if ((prc = poll(pfd, (nfds_t)n, tmo)) < 0 && errno != EINTR) {
        weft__shm_fail(tp, WEFT_ETRANSPORT, "rank %d: poll: %s", tp->rank,
                       strerror(errno));
        rc = tp->err;
        goto out;
    }
    if (prc > 0)
        tp->fo->woke(tp->far, pfd + 1, n - 1);
    if (pfd[0].revents != 0)
        drain_doorbell(tp);
out:
    atomic_store(&tp->asleep, 0);
    set_sleeping(tp, 0);
    return rc;
}

/* Says which core this rank spins on (to the peers whose segments are
 * mapped, where that changed) and whether one of them last spun there. */
static int peer_on_my_core(shm_tp *tp)
{
    int cpu = sched_getcpu();
    uint32_t me = cpu < 0 ? 0 : (uint32_t)cpu + 1;
    int shared = 0;

    if (me == 0)
        return 1; /* unknown: yield, as before this was known */
    for (int i = 0; i < tp->nlocal; i++) {
        shm_wire *w = &tp->wires[i];

        if (w->seg == NULL)
            continue;
        if (me != tp->cpu_pub)
            atomic_store_explicit(w->my_cpu, me, memory_order_relaxed);
        if (atomic_load_explicit(w->peer_cpu, memory_order_relaxed) == me)
            shared = 1;
    }
    tp->cpu_pub = me;
    return shared;
}

int weft__shm_progress(weft__tp *t, uint64_t deadline_ms)
{
    shm_tp *tp = (shm_tp *)t;
    unsigned ev = tp->events;
    int rc;

    if (tp->err != 0)
        return tp->err;
    if (tp->shut)
        return WEFT_EABORTED;
    if ((rc = shm_pass(tp, tcp_due(tp))) != 0)
        return rc;
    if (tp->events != ev)
        return WEFT_OK;
    uint64_t spin_ns = weft__spin_len(&tp->spin, deadline_ms);
    if (spin_ns != 0) {
        uint64_t t0 = weft__now_ns();
        for (unsigned i = 1;; i++) {
            if ((rc = spin_pass(tp)) != 0)
                return rc;
            if (tp->events != ev)
                return WEFT_OK;
            if ((i & 63) == 0) {
                uint64_t spun = weft__now_ns() - t0;

                if (spun >= spin_ns)
                    break;
                weft__shm_box_flush(tp);
                /* A peer on this core cannot run while this rank spins
                 * (SHM_YIELD_NS says when that was seen). */
                if (spun >= SHM_YIELD_NS && peer_on_my_core(tp))
                    sched_yield();
            }
            if (tp->oversubscribed)
                sched_yield();
        }
    }
    uint64_t slept = weft__now_ns();
    for (;;) {
        if (weft__now_ms() >= deadline_ms)
            return WEFT_ETIMEDOUT;
        if ((rc = shm_block(tp, deadline_ms)) != 0)
            return rc;
        if ((rc = shm_pass(tp, FAR_LOOK)) != 0)
            return rc;
        if (tp->events != ev) {
            weft__spin_slept(&tp->spin, weft__now_ns() - slept);
            return WEFT_OK;
        }
    }
}

void weft__shm_wake(weft__tp *t)
{
    shm_tp *tp = (shm_tp *)t;

    /* A spinning progress() sees the flag; a sleeping one (it raises
     * asleep, then looks at woken once more, as poke() and the rings do)
     * needs the far transport's wake-up (its TCP side's descriptor made
     * readable). */
    atomic_store(&tp->woken, 1);
    if (atomic_load(&tp->asleep) != 0)
        tp->fo->ops->wake(tp->far);
}

/* ---- posting ---- */

/* Where a post goes: *out is the wire to peer p of this host, or NULL for
 * a peer of another host (the TCP side's). Returns the post's failure
 * where this transport has failed or has no such wire. */
static int post_wire(shm_tp *tp, int p, int wi, shm_wire **out)
{
    *out = NULL;
    if (p < 0 || p >= tp->nranks || tp->local[p] == NULL)
        return WEFT_OK;
    if (tp->err != 0)
        return tp->err;
    if (tp->shut)
        return WEFT_EABORTED;
    if ((*out = local_wire(tp, p, wi)) == NULL)
        return weft__tp_no_wire(tp->p->sink, tp->rank, p, wi);
    return WEFT_OK;
}

int weft__shm_post_send(weft__tp *t, int p, int wi, weft__xfer *x)
{
    shm_tp *tp = (shm_tp *)t;
    shm_wire *w;
    int rc;

    if ((rc = post_wire(tp, p, wi, &w)) != 0)
        return rc;
    if (w == NULL)
        return tp->fo->ops->post_send(tp->far, p, wi, x);
    /* A send to a peer that has left must fail rather than vanish into
     * the ring. A peer that finalized or failed says so in the segment;
     * one that died only closed its TCP connection, which the kernel is
     * asked about where neither progress() nor an earlier send asked
     * lately (SHM_HUP_EVERY_TICKS). (Asked on every send once progress()
     * had not looked for 20 us, the poll() took 0.1 us of a 0.47 us 8-byte
     * all_reduce on the 2-core VM, since progress() looks only every 16th
     * pass.) */
    if (!w->dead &&
        atomic_load_explicit(w->peer_aborted, memory_order_relaxed) != 0)
        w->dead = 1;
    if (!w->dead) {
        uint64_t now = shm_ticks();

        /* A counter read on another core may lag: a difference that wraps
         * is large, and only makes the look happen. */
        if (now - tp->tcp_ticks >= SHM_HUP_EVERY_TICKS &&
            now - w->hup_ticks >= SHM_HUP_EVERY_TICKS) {
            w->hup_ticks = now;
            w->dead = weft__tcp_peer_hup(tp->tcp, p);
        }
    }
    if (w->dead) {
        weft__shm_fail(tp, WEFT_EPEER,
                       "rank %d: peer %d (same host, pid %d) closed its "
                       "connection (finalized, failed or exited) before "
                       "this rank sent to it",
                       tp->rank, p, (int)w->pid);
        return tp->err;
    }
    x->got = 0;
    weft__xq_push(&w->sq_head, &w->sq_tail, x);
    /* Copied by the next progress(), with whatever else is posted before
     * it (an operation's header and data): one publication of the ring's
     * head and one look at the peer's flag (a full fence) for them all. */
    return WEFT_OK;
}

int weft__shm_post_recv(weft__tp *t, int p, int wi, weft__xfer *x)
{
    shm_tp *tp = (shm_tp *)t;
    shm_wire *w;
    int rc;

    if ((rc = post_wire(tp, p, wi, &w)) != 0)
        return rc;
    if (w == NULL)
        return tp->fo->ops->post_recv(tp->far, p, wi, x);
    x->got = 0;
    weft__xq_push(&w->rq_head, &w->rq_tail, x);
    /* What already landed is handed over by progress(), for every
     * receive posted before it at once (in the same pass where a
     * completion posted it). */
    tp->rx_posted = 1;
    return WEFT_OK;
}

int weft__shm_relay_send(weft__tp *t, int peer, weft__xfer *x)
{
    shm_tp *tp = (shm_tp *)t;

    return tp->fo->ops->relay->send(tp->far, peer, x);
}

int weft__shm_relay_recv(weft__tp *t, int peer, weft__xfer *x)
{
    shm_tp *tp = (shm_tp *)t;

    return tp->fo->ops->relay->recv(tp->far, peer, x);
}
