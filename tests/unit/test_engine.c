/*
 * The design's wire invariants, checked on the engine itself (not only on
 * the planner it calls): a real engine pass, posted and waited for as the
 * blocking calls do (task.h), drives a mock transport
 * that records every frame posted and completes one frame per progress()
 * call, so the engine reposts as frames complete. For W = 1..4 wires and
 * every size from 0 to several frames past W * depth * frame (and large
 * awkward sizes), one side sends and the other receives (as is, and
 * reduced on arrival through the staging slots), and the mock checks:
 *  - every data frame lies inside its wire's own region of the planner;
 *  - before a wire's first completion, the data frames posted on it are
 *    at most min(depth, frames of its own region) (the prefill);
 *  - both sides agree: the receiver's frames on each wire take exactly the
 *    bytes the sender's put there, no more and no fewer;
 *  - when the operation ends, no frame is in flight on any wire;
 *  - the bytes arrive intact (and reduced where asked).
 * The reduced receives run both inline and on the engine's reducer thread
 * (every frame handed to it), where a frame's bytes may leave, and its
 * staging slot be posted again, only once the thread has reduced it; a
 * transport that fails while the thread holds frames ends the call with
 * its error, and nothing touches the buffers after the call returned.
 */
#include <criterion/criterion.h>

#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/plan.h"
#include "engine/task.h"
#include "transport/transport.h"

#include <time.h>

#define FRAME 64
#define MAXW 4
#define QCAP 64

typedef struct {
    weft__xfer *q[QCAP];
    int head, n;
    int completed;      /* completions on this wire in this direction */
    size_t data_before; /* data frames posted before the first completion */
} mqueue;

typedef struct {
    int W;
    int is_send;     /* the side under test: sender (1) or receiver (0) */
    const char *buf; /* the user buffer: data frames point into it */
    size_t nbytes;
    size_t esize;
    size_t frame;
    mqueue s[MAXW], r[MAXW];
    /* Per wire: the byte stream the sender put on it (filled when the
     * sender runs, fed to the receiver when it runs), and how much the
     * receiver has taken. */
    char *stream[MAXW];
    size_t slen[MAXW], scap[MAXW], taken[MAXW];
    int turn;
    int progress_calls; /* calls of mock_progress */
    int reducer;        /* reduced frames go to the reducer thread */
    int fail_after;     /* > 0: progress() fails after this many receives */
    int received;       /* receives completed */
    atomic_int woken;   /* wake() ran since progress() last looked */
    int restless;       /* progress() returns at once, completing nothing */
    int deadline_ms;    /* the call's deadline from now; 0: 60 s */
    char failure[256];  /* first broken invariant, "" if none */
} mock;

static void mock_fail(mock *m, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

static void mock_fail(mock *m, const char *fmt, ...)
{
    va_list ap;

    if (m->failure[0] != '\0')
        return;
    va_start(ap, fmt);
    vsnprintf(m->failure, sizeof m->failure, fmt, ap);
    va_end(ap);
}

/* Is x a data frame (it points into the user buffer), and which region? */
static int data_frame(const mock *m, const weft__xfer *x)
{
    return m->nbytes > 0 && x->buf >= m->buf && x->buf < m->buf + m->nbytes;
}

static weft__region wire_region(const mock *m, int w)
{
    int used = weft__plan_wires(m->nbytes, m->W, 1);
    weft__region none = {0, 0};

    if (m->nbytes == 0 || w >= used)
        return none;
    return weft__plan_region(m->nbytes, used, m->esize, w);
}

static int mock_post(mock *m, int is_send, int peer, int w, weft__xfer *x)
{
    mqueue *q = is_send ? &m->s[w] : &m->r[w];

    if (peer != (m->is_send ? 1 : 0) || w < 0 || w >= m->W) {
        mock_fail(m, "posted to peer %d wire %d", peer, w);
        return WEFT_ETRANSPORT;
    }
    if (q->n == QCAP) {
        mock_fail(m, "more than %d frames in flight on wire %d", QCAP, w);
        return WEFT_ETRANSPORT;
    }
    /* Data frames of a receive that reduces land in staging, not in the
     * user buffer: their region is checked by the bytes that arrive. */
    if (data_frame(m, x)) {
        weft__region reg = wire_region(m, w);
        size_t off = (size_t)(x->buf - m->buf);
        size_t depth = is_send      ? WEFT__SEND_DEPTH
                       : m->reducer ? WEFT__RECV_DEPTH_REDUCER
                                    : WEFT__RECV_DEPTH;

        if (off < reg.off || off + x->len > reg.off + reg.len)
            mock_fail(m,
                      "n=%zu W=%d: a frame [%zu, %zu) on wire %d crosses "
                      "its region [%zu, %zu)",
                      m->nbytes, m->W, off, off + x->len, w, reg.off,
                      reg.off + reg.len);
        if (q->completed == 0 &&
            ++q->data_before > weft__plan_prefill(reg.len, m->frame, depth))
            mock_fail(m,
                      "n=%zu W=%d: wire %d prefilled %zu frames, more than "
                      "min(depth %zu, its region's %zu frames)",
                      m->nbytes, m->W, w, q->data_before, depth,
                      weft__plan_frames(reg.len, m->frame));
    }
    x->got = 0;
    q->q[(q->head + q->n++) % QCAP] = x;
    return WEFT_OK;
}

static int mock_post_send(weft__tp *t, int peer, int w, weft__xfer *x)
{
    return mock_post((mock *)t, 1, peer, w, x);
}

static int mock_post_recv(weft__tp *t, int peer, int w, weft__xfer *x)
{
    return mock_post((mock *)t, 0, peer, w, x);
}

static void stream_put(mock *m, int w, const char *b, size_t len)
{
    if (m->slen[w] + len > m->scap[w]) {
        m->scap[w] = (m->slen[w] + len) * 2 + 64;
        m->stream[w] = realloc(m->stream[w], m->scap[w]);
        cr_assert_not_null(m->stream[w]);
    }
    memcpy(m->stream[w] + m->slen[w], b, len);
    m->slen[w] += len;
}

/* Completes one frame: the oldest of the next wire (round robin) that has
 * one. A receive takes its bytes from the sender's stream of that wire. */
static int mock_progress(weft__tp *t, uint64_t deadline_ms)
{
    mock *m = (mock *)t;

    (void)deadline_ms;
    m->progress_calls++;
    if (m->restless)
        return WEFT_OK; /* an event that moves nothing of this pass */
    if (m->failure[0] != '\0')
        return WEFT_ETRANSPORT;
    if (m->fail_after > 0 && m->received >= m->fail_after)
        return WEFT_ETRANSPORT; /* a wire broke: as a peer that left */
    for (int i = 0; i < 2 * m->W; i++) {
        int k = (m->turn + i) % (2 * m->W), w = k / 2, is_send = k % 2;
        mqueue *q = is_send ? &m->s[w] : &m->r[w];
        weft__xfer *x;

        if (q->n == 0)
            continue;
        x = q->q[q->head];
        q->head = (q->head + 1) % QCAP;
        q->n--;
        q->completed++;
        if (is_send) {
            stream_put(m, w, x->buf, x->len);
        } else {
            if (m->taken[w] + x->len > m->slen[w]) {
                mock_fail(m,
                          "n=%zu W=%d: the receiver wants %zu bytes on wire "
                          "%d, the sender put only %zu there",
                          m->nbytes, m->W, m->taken[w] + x->len, w, m->slen[w]);
                return WEFT_ETRANSPORT;
            }
            memcpy(x->buf, m->stream[w] + m->taken[w], x->len);
            m->taken[w] += x->len;
            m->received++;
        }
        x->got = x->len;
        m->turn = k + 1;
        x->done(x);
        return WEFT_OK;
    }
    /* Nothing posted: the engine may wait for its reducer thread, which
     * wakes this wait when a frame is reduced. */
    for (int i = 0; m->reducer && i < 50000; i++) {
        struct timespec ts = {0, 100000};

        if (atomic_exchange(&m->woken, 0))
            return WEFT_OK;
        nanosleep(&ts, NULL);
    }
    mock_fail(m, "n=%zu W=%d: the engine waits with nothing posted", m->nbytes,
              m->W);
    return WEFT_ETRANSPORT;
}

static int mock_nwires(weft__tp *t, int peer)
{
    mock *m = (mock *)t;
    return peer == (m->is_send ? 1 : 0) ? m->W : 0;
}

static void mock_shutdown(weft__tp *t)
{
    mock *m = (mock *)t;
    for (int w = 0; w < MAXW; w++)
        m->s[w].n = m->r[w].n = 0;
}

/* Runs on the reducer thread. */
static void mock_wake(weft__tp *t)
{
    atomic_store(&((mock *)t)->woken, 1);
}

static void mock_cable_wires(weft__tp *t, int p, weft_wire_info *out)
{
    memset(out, 0, sizeof *out);
    out->total = out->up = mock_nwires(t, p);
}

static const weft__tp_ops mock_ops = {
    .name = "mock",
    .nwires = mock_nwires,
    .cable_wires = mock_cable_wires,
    .post_send = mock_post_send,
    .post_recv = mock_post_recv,
    .progress = mock_progress,
    .wake = mock_wake,
    .shutdown = mock_shutdown,
    .relay = &weft__tp_no_relay,
    .box = &weft__tp_no_box,
    .read = &weft__tp_no_read,
};

/* Runs one side: rank 0 sends n bytes of sbuf to rank 1, or rank 1
 * receives them into rbuf (reduced with rbuf's own contents if reduce). */
static int run_side(mock *m, int is_send, char *buf, size_t n, int reduce)
{
    weft__ctx c;
    weft__config cfg;
    uint32_t seq[2] = {0, 0}, rseq[2] = {0, 0};
    weft__call k;
    weft__args a = {0};
    weft__task t;
    weft__op op;
    weft__step *st;
    int rc;

    memset(&c, 0, sizeof c);
    memset(&cfg, 0, sizeof cfg);
    c.cfg = &cfg;
    c.rank = is_send ? 0 : 1;
    c.nranks = 2;
    c.timeout_ms = 60000;
    cfg.frame_bytes = m->frame;
    cfg.min_wire_bytes = 1; /* every wire, down to one element each */
    cfg.reduce_thread = m->reducer;
    cfg.reduce_thread_min_bytes = 1; /* every reduced frame */
    c.fail.rank = c.rank;
    c.send_seq = seq;
    c.recv_seq = rseq;
    c.tpo = &mock_ops;
    c.tp = (weft__tp *)m;
    k = (weft__call){.deadline_ms = weft__now_ms() +
                                    (m->deadline_ms ? m->deadline_ms : 60000),
                     .name = "test",
                     .kind = WEFT__OP_P2P,
                     .dtype = WEFT_INT32,
                     .redop = -1,
                     .root = -1,
                     .count = n / 4};
    m->is_send = is_send;
    m->buf = buf;
    m->nbytes = n;
    for (int w = 0; w < MAXW; w++) {
        memset(&m->s[w], 0, sizeof m->s[w]);
        memset(&m->r[w], 0, sizeof m->r[w]);
    }
    weft__op_init(&op, WEFT_INT32, WEFT_SUM);
    op.nlanes = 1;
    st = weft__op_steps(&op, 0, 1);
    cr_assert_not_null(st);
    if (is_send) {
        op.lanes[0].send_peer = 1;
        op.lanes[0].recv_peer = -1;
        st[0].send_buf = buf;
        st[0].send_len = n;
    } else {
        op.lanes[0].send_peer = -1;
        op.lanes[0].recv_peer = 0;
        st[0].recv_dst = buf;
        st[0].recv_a = reduce ? buf : NULL;
        st[0].recv_len = n;
    }
    /* What the blocking calls run: the pass posted, then waited for. */
    weft__task_init(&t, &c, &k, &a);
    m->progress_calls = 0;
    rc = weft__task_pass(&t, &op, NULL);
    /* Progress never waits and never runs the transport: with nothing
     * completed, the task stays pending however often it is asked (a
     * step of 0 bytes posts nothing, and is done at once). */
    for (int i = 0; rc == WEFT_OK && n > 0 && i < 3; i++)
        cr_assert_eq(weft__task_progress(&t), WEFT__PENDING,
                     "n=%zu: a task with nothing completed is not pending", n);
    cr_assert_eq(m->progress_calls, 0,
                 "weft__task_progress ran the transport's progress()");
    if (rc == WEFT_OK)
        rc = weft__task_wait(&t);
    weft__engine_free(&c);
    if (m->fail_after > 0 || m->restless)
        return rc;
    cr_assert_eq(m->failure[0], '\0', "%s", m->failure);
    cr_assert_eq(rc, WEFT_OK, "n=%zu W=%d %s: %s: %s", n, m->W,
                 is_send ? "send" : "recv", weft_err_name(rc), c.fail.msg);
    for (int w = 0; w < m->W; w++)
        cr_assert(m->s[w].n == 0 && m->r[w].n == 0,
                  "n=%zu W=%d: frames in flight on wire %d after the "
                  "operation ended",
                  n, m->W, w);
    return rc;
}

/* reduce: 0 none, 1 inline, 2 on the reducer thread. */
static void check_size(int W, size_t n, size_t frame, int reduce)
{
    mock *m = calloc(1, sizeof *m);
    int32_t *sb = malloc(n + 4), *rb = malloc(n + 4);

    cr_assert(m != NULL && sb != NULL && rb != NULL);
    m->W = W;
    m->reducer = reduce == 2;
    m->esize = 4;
    m->frame = frame;
    for (size_t i = 0; i < n / 4; i++) {
        sb[i] = (int32_t)(i * 2654435761u);
        rb[i] = reduce ? (int32_t)i : -1;
    }
    run_side(m, 1, (char *)sb, n, 0);
    run_side(m, 0, (char *)rb, n, reduce);
    for (int w = 0; w < W; w++)
        cr_assert_eq(m->taken[w], m->slen[w],
                     "n=%zu W=%d: the receiver took %zu of the %zu bytes "
                     "the sender put on wire %d",
                     n, W, m->taken[w], m->slen[w], w);
    for (size_t i = 0; i < n / 4; i++) {
        int32_t want =
            reduce ? (int32_t)((uint32_t)(i * 2654435761u) + (uint32_t)i)
                   : sb[i];
        cr_assert_eq(rb[i], want, "n=%zu W=%d: element %zu is %d, not %d", n, W,
                     i, rb[i], want);
    }
    for (int w = 0; w < MAXW; w++)
        free(m->stream[w]);
    free(m);
    free(sb);
    free(rb);
}

/* Every size from 0 to several frames past W * depth * frame. */
static void every_size_small(int reduce)
{
    for (int W = 1; W <= MAXW; W++)
        for (size_t n = 0;
             n <= (size_t)W * WEFT__SEND_DEPTH * FRAME + 3 * FRAME; n += 4)
            check_size(W, n, FRAME, reduce);
}

Test(engine, every_size_small)
{
    every_size_small(0);
}

Test(engine, every_size_small_reduced)
{
    every_size_small(1);
}

Test(engine, every_size_small_reduced_by_thread)
{
    every_size_small(2);
}

/* A wire that breaks while the reducer thread holds frames: the call
 * fails with the transport's error, and when it has returned nothing
 * writes the receive buffer any more (it is checked unchanged, then
 * freed, under the sanitizers). */
Test(engine, failure_while_reducer_busy)
{
    const size_t n = 8u << 20, frame = 256 * 1024;

    for (int after = 1; after <= 9; after += 4) {
        mock *m = calloc(1, sizeof *m);
        int32_t *sb = malloc(n), *rb = malloc(n), *copy = malloc(n);
        int rc;

        cr_assert(m != NULL && sb != NULL && rb != NULL && copy != NULL);
        m->W = 2;
        m->esize = 4;
        m->frame = frame;
        m->reducer = 1;
        for (size_t i = 0; i < n / 4; i++)
            sb[i] = rb[i] = (int32_t)i;
        run_side(m, 1, (char *)sb, n, 0);
        m->fail_after = after;
        rc = run_side(m, 0, (char *)rb, n, 1);
        cr_assert_eq(rc, WEFT_ETRANSPORT, "after %d frames: %s", after,
                     weft_err_name(rc));
        /* A reduction still running would change rb meanwhile (each
         * element doubles). */
        memcpy(copy, rb, n);
        nanosleep(&(struct timespec){0, 20 * 1000 * 1000}, NULL);
        cr_assert_eq(memcmp(copy, rb, n), 0,
                     "the receive buffer changed after the call returned");
        for (int w = 0; w < MAXW; w++)
            free(m->stream[w]);
        free(m);
        free(sb);
        free(rb);
        free(copy);
    }
}

/* A transport whose progress() keeps returning at once with nothing
 * done (events that move nothing this pass waits for): the pass still
 * ends at its deadline, checked by the engine itself (not on every wait),
 * and no later than a little after it. */
Test(engine, deadline_with_restless_transport, .timeout = 30)
{
    mock *m = calloc(1, sizeof *m);
    int32_t rb[64];
    uint64_t t0;
    int rc;

    cr_assert_not_null(m);
    m->W = 1;
    m->esize = 4;
    m->frame = FRAME;
    m->restless = 1;
    m->deadline_ms = 150;
    t0 = weft__now_ms();
    rc = run_side(m, 0, (char *)rb, sizeof rb, 0);
    cr_assert_eq(rc, WEFT_ETIMEDOUT, "%s", weft_err_name(rc));
    cr_assert(weft__now_ms() - t0 >= 150,
              "ended %llu ms in, before its "
              "deadline",
              (unsigned long long)(weft__now_ms() - t0));
    cr_assert(weft__now_ms() - t0 < 2000,
              "ended %llu ms in, its deadline "
              "was 150 ms",
              (unsigned long long)(weft__now_ms() - t0));
    cr_assert_gt(m->progress_calls, 8);
    free(m);
}

Test(engine, large_awkward_sizes)
{
    static const size_t sizes[] = {
        (1u << 20) + 8,
        (3u << 20) - 4,
        (5u << 20) + 1020,
        (16u << 20) + 4,
    };
    for (int W = 1; W <= MAXW; W++)
        for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
            check_size(W, sizes[i], 4096, 0);
            check_size(W, sizes[i], 4096 + 4, 1);
            check_size(W, sizes[i], 4096 + 4, 2);
        }
}
