/*
 * Non-blocking operations (API.md, "Non-blocking operations"): every
 * operation against its blocking twin, random sequences of pending
 * operations on overlapping buffers, a pipeline, two threads, progress
 * while the caller (or a rank in between) is outside weft, and what
 * failures, weft_abort and weft_finalize do to pending requests.
 *
 * Issue 30 (suites order, callbacks, batch): point-to-point requests
 * that progress without waiting for earlier pending ones (receives
 * posted before their sends, collectives between them, overlapping
 * buffers, random mixes), over shared memory, TCP, several wires and
 * the relay; a callback that sees its own request complete; and a run
 * of small all_reduces where one rank's call differs, which fails that
 * call alone, naming only counts some rank called.
 */
#define _GNU_SOURCE
#include <criterion/criterion.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "harness.h"
#include "nb_cases.h"
#include "weft.h"

/* Low thresholds so modest counts take every path (as test_collectives)
 * on a job of nranks placed as layout says under topology. */
static void small_thresholds(int nranks, enum mp_layout layout,
                             const char *topology)
{
    const char *shm = getenv("WEFT_SHM");
    char algo[512];

    setenv("WEFT_FRAME_BYTES", "65536", 0);
    setenv("WEFT_MIN_WIRE_BYTES", "8192", 0);
    setenv("WEFT_BIDIR_MIN_BYTES", "16384", 0);
    cr_assert_eq(mp_low_algo(algo, sizeof algo, nranks, layout, topology,
                             shm == NULL || strcmp(shm, "0") != 0, 4096, NULL),
                 0);
    /* The rows fit this job's layout alone, so an outer WEFT_ALGO goes. */
    setenv("WEFT_ALGO", algo, 1);
}

typedef int (*case_fn)(weft_comm *c, void *arg);

static int case_rank(int rank, int nranks, void *arg)
{
    case_fn fn = *(case_fn *)arg;
    weft_comm *c;
    int fail, rc;

    if (mp_init(&c, rank, nranks) != WEFT_OK)
        return 1;
    fail = fn(c, (case_fn *)arg + 1);
    if ((rc = weft_finalize(c)) != WEFT_OK) {
        mp_log("weft_finalize returned %s", weft_err_name(rc));
        fail = 1;
    }
    return fail;
}

static void run_case(case_fn fn, int nranks, int wires, enum mp_layout layout,
                     const char *topology, const char *what)
{
    case_fn arg[2] = {fn, NULL};
    struct mp_opts o = {
        .nranks = nranks,
        .layout = layout,
        .wires = wires,
        .timeout_ms = 30000,
        .deadline_ms = 100000,
    };
    struct mp_result res;
    char buf[1024];

    small_thresholds(nranks, layout, topology);
    setenv("WEFT_TOPOLOGY", topology, 1);
    cr_assert_eq(mp_run(&o, case_rank, arg, &res), 0,
                 "could not set up the job");
    cr_assert(mp_all_passed(&res), "%s, %s, %d ranks, %d wires: %s", what,
              topology, nranks, wires, mp_describe(&res, buf, sizeof buf));
}

/* Runs one job of scenario fn, which must pass on every rank. */
static void run_ranks(mp_rank_fn fn, const struct mp_opts *o)
{
    struct mp_result res;
    char buf[1024];

    cr_assert_eq(mp_run(o, fn, NULL, &res), 0, "could not set up the job");
    cr_assert(mp_all_passed(&res), "%s", mp_describe(&res, buf, sizeof buf));
}

/* weft_init, then a barrier, so that every rank is up: 0, or 1 after a
 * message. */
static int init_all(weft_comm **c, int rank, int nranks)
{
    int rc;

    if (mp_init(c, rank, nranks) != WEFT_OK)
        return 1;
    if ((rc = weft_barrier(*c)) != WEFT_OK) {
        mp_report_rc(*c, "barrier", rc);
        weft_finalize(*c);
        return 1;
    }
    return 0;
}

/* ---- every operation, ranks 2-4 x wires 1-3, ring and mesh ---- */

static int every_op(weft_comm *c, void *arg)
{
    (void)arg;
    return nb_every_op(c);
}

#define EVERY_OP(n, w)                                                         \
    Test(nonblocking, every_op_ring_ranks##n##_wires##w, .timeout = 120)       \
    {                                                                          \
        run_case(every_op, n, w, MP_LAYOUT_ONE_HOST, "ring", "every_op");      \
    }                                                                          \
    Test(nonblocking, every_op_mesh_ranks##n##_wires##w, .timeout = 120)       \
    {                                                                          \
        run_case(every_op, n, w, MP_LAYOUT_ONE_HOST, "mesh", "every_op");      \
    }

EVERY_OP(2, 1)
EVERY_OP(2, 2)
EVERY_OP(2, 3)
EVERY_OP(3, 1)
EVERY_OP(3, 2)
EVERY_OP(3, 3)
EVERY_OP(4, 1)
EVERY_OP(4, 2)
EVERY_OP(4, 3)

/* Hosts in a ring of links: ranks 0 and 2 reach each other through the
 * relay, and every rank runs a progress thread from the start. */
Test(nonblocking, every_op_relayed_ring, .timeout = 120)
{
    run_case(every_op, 4, 1, MP_LAYOUT_RING, "auto", "every_op");
}

/* ---- random sequences ---- */

/* Seeds 1-12 of nb_sequence (reduces: see there). */
static int sequence_seeds(weft_comm *c, int reduces)
{
    for (uint64_t seed = 1; seed <= 12; seed++)
        if (nb_sequence(c, seed, reduces))
            return 1;
    return 0;
}

static int sequences(weft_comm *c, void *arg)
{
    (void)arg;
    return sequence_seeds(c, 0);
}

/* Mostly small all_reduces posted at once: run in batches where the
 * algorithm allows (recursive doubling, the one-exchange gather), split
 * where one reads what an earlier one writes or the op changes. */
static int reduce_sequences(weft_comm *c, void *arg)
{
    (void)arg;
    return sequence_seeds(c, 1);
}

Test(nonblocking, sequences_ring_3ranks, .timeout = 120)
{
    run_case(sequences, 3, 2, MP_LAYOUT_ONE_HOST, "ring", "sequences");
}

Test(nonblocking, sequences_mesh_4ranks, .timeout = 120)
{
    run_case(sequences, 4, 1, MP_LAYOUT_ONE_HOST, "mesh", "sequences");
}

Test(nonblocking, sequences_auto_2ranks, .timeout = 120)
{
    run_case(sequences, 2, 3, MP_LAYOUT_ONE_HOST, "auto", "sequences");
}

Test(nonblocking, reduce_sequences_auto_4ranks, .timeout = 120)
{
    run_case(reduce_sequences, 4, 1, MP_LAYOUT_ONE_HOST, "auto",
             "reduce_sequences");
}

Test(nonblocking, reduce_sequences_auto_3ranks, .timeout = 120)
{
    run_case(reduce_sequences, 3, 2, MP_LAYOUT_ONE_HOST, "auto",
             "reduce_sequences");
}

Test(nonblocking, reduce_sequences_mesh_4ranks, .timeout = 120)
{
    run_case(reduce_sequences, 4, 2, MP_LAYOUT_ONE_HOST, "mesh",
             "reduce_sequences");
}

Test(nonblocking, reduce_sequences_ring_3ranks, .timeout = 120)
{
    run_case(reduce_sequences, 3, 1, MP_LAYOUT_ONE_HOST, "ring",
             "reduce_sequences");
}

/* ---- large operations pending together ---- */

static int large(weft_comm *c, void *arg)
{
    (void)arg;
    return nb_large(c);
}

/* 64 KiB frames here (run_case): the reducer thread, on whatever the
 * host's cores, takes whole frames of every lane and wire, the short last
 * ones stay inline unless they follow one that went. */
Test(nonblocking, large_ring_3ranks_2wires, .timeout = 120)
{
    setenv("WEFT_REDUCE_THREAD", "1", 1);
    run_case(large, 3, 2, MP_LAYOUT_ONE_HOST, "ring", "large");
}

Test(nonblocking, large_ring_4ranks_reduce_inline, .timeout = 120)
{
    setenv("WEFT_REDUCE_THREAD", "0", 1);
    run_case(large, 4, 1, MP_LAYOUT_ONE_HOST, "ring", "large");
}

/* ---- a pipeline, two threads ---- */

static int pipeline(weft_comm *c, void *arg)
{
    (void)arg;
    return nb_pipeline(c);
}

Test(nonblocking, pipeline_4ranks, .timeout = 120)
{
    run_case(pipeline, 4, 2, MP_LAYOUT_ONE_HOST, "auto", "pipeline");
}

static int threads(weft_comm *c, void *arg)
{
    (void)arg;
    return nb_threads(c);
}

Test(nonblocking, threads_3ranks, .timeout = 120)
{
    run_case(threads, 3, 1, MP_LAYOUT_ONE_HOST, "auto", "threads");
}

/* ---- bad posts, callbacks ---- */

static void count_cb(weft_request *req, int result, void *arg)
{
    int *seen = arg;

    (void)req;
    seen[0]++;
    seen[1] = result;
}

static int posts(weft_comm *c, void *arg)
{
    int x = 1, seen[2] = {0, 0}, done = -1, rc;
    weft_request *r = (weft_request *)&x; /* not NULL: a post must clear it */

    (void)arg;
    if ((rc = weft_iall_reduce(c, NULL, &x, 1, WEFT_INT32, WEFT_SUM, &r)) !=
            WEFT_EINVAL ||
        r != NULL) {
        mp_log("a NULL buffer: %s, req %p", weft_err_name(rc), (void *)r);
        return 1;
    }
    if ((rc = weft_isend(c, &x, 1, WEFT_INT32, weft_size(c), &r)) !=
            WEFT_EINVAL ||
        r != NULL) {
        mp_log("a peer out of range: %s", weft_err_name(rc));
        return 1;
    }
    if (weft_iall_reduce(c, &x, &x, 1, WEFT_INT32, WEFT_SUM, NULL) !=
            WEFT_EINVAL ||
        weft_test(NULL, &done) != WEFT_EINVAL ||
        weft_wait(NULL) != WEFT_EINVAL || weft_request_free(NULL) != WEFT_OK) {
        mp_log("NULL requests are not refused");
        return 1;
    }
    /* c is still usable; count 0 completes at once. */
    if ((rc = weft_iall_gather(c, &x, &x, 0, WEFT_INT32, &r)) != WEFT_OK ||
        weft_test(r, &done) != WEFT_OK || done != 1) {
        mp_log("count 0: %s, done %d", weft_err_name(rc), done);
        return 1;
    }
    /* A callback on a complete request runs at once, exactly once; a
     * second callback is refused. */
    if (weft_request_on_complete(r, count_cb, seen) != WEFT_OK ||
        seen[0] != 1 || seen[1] != WEFT_OK ||
        weft_request_on_complete(r, count_cb, seen) != WEFT_EINVAL ||
        seen[0] != 1) {
        mp_log("callback on a complete request: ran %d times", seen[0]);
        return 1;
    }
    weft_request_free(r);
    /* A pending request's callback runs once, when it completes. */
    seen[0] = 0;
    if ((rc = weft_iall_reduce(c, &x, &x, 1, WEFT_INT32, WEFT_SUM, &r)) !=
            WEFT_OK ||
        weft_request_on_complete(r, count_cb, seen) != WEFT_OK ||
        (rc = weft_wait(r)) != WEFT_OK || weft_wait(r) != WEFT_OK ||
        weft_test(r, &done) != WEFT_OK || done != 1) {
        mp_log("all_reduce: %s", weft_err_name(rc));
        return 1;
    }
    weft_request_free(r);
    /* The callback ran before the request counted as done. */
    if (seen[0] != 1 || x != weft_size(c)) {
        mp_log("callback ran %d times; x is %d", seen[0], x);
        return 1;
    }
    return 0;
}

Test(nonblocking, posts_and_callbacks, .timeout = 60)
{
    run_case(posts, 2, 1, MP_LAYOUT_ONE_HOST, "auto", "posts");
}

/* ---- progress without the caller ---- */

/* Rank 0 posts and then stays out of weft for 1.5 s; rank 1's blocking
 * call needs rank 0's part, and completes long before rank 0 is back. */
static int caller_away(int rank, int nranks, void *arg)
{
    static float a[1 << 18], b[1 << 18];
    weft_comm *c;
    weft_request *r = NULL;
    int fail = 0, rc;

    (void)arg;
    if (init_all(&c, rank, nranks))
        return 1;
    if (!fail && rank == 0) {
        rc = weft_iall_reduce(c, a, b, 1 << 18, WEFT_FLOAT32, WEFT_SUM, &r);
        mp_sleep_ms(1500);
        if (rc == WEFT_OK)
            rc = weft_wait(r);
        if (rc != WEFT_OK)
            fail = mp_report_rc(c, "iall_reduce", rc);
        weft_request_free(r);
    } else if (!fail) {
        double t0 = mp_now_ms(), dt;

        mp_stall_watch_start();
        rc = weft_all_reduce(c, a, b, 1 << 18, WEFT_FLOAT32, WEFT_SUM);
        dt = mp_now_ms() - t0;
        if (rc != WEFT_OK)
            fail = mp_report_rc(c, "all_reduce", rc);
        else if (dt > 1000 && mp_stall_watch_stop() < dt - 1000)
            fail = (mp_log("all_reduce took %.0f ms: rank 0's part waited "
                           "for rank 0 to come back",
                           dt),
                    1);
    }
    if ((rc = weft_finalize(c)) != WEFT_OK)
        fail = 1;
    return fail;
}

Test(nonblocking, progress_while_caller_away, .timeout = 60)
{
    run_ranks(caller_away, &(struct mp_opts){.nranks = 2, .timeout_ms = 20000});
}

/* Hosts in a ring of 4: rank 0 sends to rank 2, which it has no link to,
 * while ranks 1 and 3 (the ones that forward) are outside any weft call. */
static int relay_away(int rank, int nranks, void *arg)
{
    static float m[4096];
    weft_comm *c;
    int fail = 0, rc = WEFT_OK;

    (void)arg;
    if (init_all(&c, rank, nranks))
        return 1;
    if (!fail && rank == 0) {
        for (int i = 0; i < 4096; i++)
            m[i] = (float)i;
        rc = weft_send(c, m, 4096, WEFT_FLOAT32, 2);
    } else if (!fail && rank == 2) {
        double t0 = mp_now_ms(), dt;

        mp_stall_watch_start();
        rc = weft_recv(c, m, 4096, WEFT_FLOAT32, 0);
        dt = mp_now_ms() - t0;
        for (int i = 0; rc == WEFT_OK && i < 4096 && !fail; i++)
            if (m[i] != (float)i)
                fail = (mp_log("element %d is %g", i, (double)m[i]), 1);
        if (rc == WEFT_OK && dt > 1000 && mp_stall_watch_stop() < dt - 1000)
            fail = (mp_log("the relayed message took %.0f ms: the ranks in "
                           "between forwarded it only once back in weft",
                           dt),
                    1);
    } else if (!fail) {
        mp_sleep_ms(1500);
    }
    if (rc != WEFT_OK)
        fail = mp_report_rc(c, "relayed send/recv", rc);
    if (!fail && (rc = weft_barrier(c)) != WEFT_OK)
        fail = mp_report_rc(c, "barrier", rc);
    if ((rc = weft_finalize(c)) != WEFT_OK)
        fail = 1;
    return fail;
}

Test(nonblocking, relay_while_forwarders_away, .timeout = 60)
{
    setenv("WEFT_TOPOLOGY", "auto", 1);
    run_ranks(relay_away, &(struct mp_opts){.nranks = 4,
                                            .layout = MP_LAYOUT_RING,
                                            .timeout_ms = 20000});
}

/* ---- failures, abort, finalize with requests pending ---- */

#define NPEND 5

typedef struct {
    atomic_int calls[NPEND];
    atomic_int result[NPEND];
} cb_log;

static void log_cb(weft_request *req, int result, void *arg)
{
    cb_log *l = arg;

    (void)req;
    /* Requests complete in post order: the k-th call is request k's. */
    for (int k = 0; k < NPEND; k++)
        if (atomic_load(&l->calls[k]) == 0) {
            atomic_store(&l->result[k], result);
            atomic_fetch_add(&l->calls[k], 1);
            return;
        }
}

/* Posts NPEND receives from `peer` with callbacks (which log in order). */
static int post_pending(weft_comm *c, int peer, float *buf, weft_request **reqs,
                        cb_log *l)
{
    for (int i = 0; i < NPEND; i++) {
        int rc = weft_irecv(c, buf + i * 16, 16, WEFT_FLOAT32, peer, &reqs[i]);
        if (rc != WEFT_OK)
            return mp_report_rc(c, "irecv", rc);
        weft_request_on_complete(reqs[i], log_cb, l);
    }
    return 0;
}

/* The first pending request fails with the cause, the later ones with
 * WEFT_EABORTED; each callback once, with the same result. */
static int check_failed(weft_comm *c, weft_request **reqs, const cb_log *l,
                        int first_ok1, int first_ok2)
{
    for (int i = 0; i < NPEND; i++) {
        int rc = weft_wait(reqs[i]);
        int want_ok =
            i == 0 ? rc == first_ok1 || rc == first_ok2 : rc == WEFT_EABORTED;
        if (!want_ok) {
            mp_log("request %d: %s", i, weft_err_name(rc));
            return 1;
        }
        if (atomic_load(&l->calls[i]) != 1 ||
            atomic_load(&l->result[i]) != rc) {
            mp_log("request %d: callback ran %d times with %s", i,
                   atomic_load(&l->calls[i]),
                   weft_err_name(atomic_load(&l->result[i])));
            return 1;
        }
    }
    if (c != NULL && strlen(weft_last_error(c)) == 0) {
        mp_log("weft_last_error is empty after a failure");
        return 1;
    }
    return 0;
}

/* Rank 1 leaves without a word while rank 0 has receives pending. */
static int peer_dies(int rank, int nranks, void *arg)
{
    static float buf[NPEND * 16];
    weft_request *reqs[NPEND];
    static cb_log l;
    weft_comm *c;
    int fail, rc;

    (void)arg;
    if (init_all(&c, rank, nranks))
        return 1;
    if (rank == 1) {
        mp_sleep_ms(300);
        _exit(0); /* no weft_finalize: the kernel closes the sockets */
    }
    fail = post_pending(c, 1, buf, reqs, &l);
    if (!fail)
        fail = check_failed(c, reqs, &l, WEFT_EPEER, WEFT_ETIMEDOUT);
    if (!fail && (rc = weft_barrier(c)) != WEFT_EABORTED)
        fail = (mp_log("a post after the failure: %s", weft_err_name(rc)), 1);
    for (int i = 0; i < NPEND; i++)
        weft_request_free(reqs[i]);
    weft_finalize(c);
    return fail;
}

Test(nonblocking, peer_dies_with_requests_pending, .timeout = 60)
{
    run_ranks(peer_dies, &(struct mp_opts){.nranks = 2, .timeout_ms = 10000});
}

/* A killed and a stopped peer: ranks 0-2 post ten operations of every
 * kind, each of which needs rank 3 (or comes after one that does), and
 * wait for them all; rank 3 is SIGKILLed or SIGSTOPped (arg) 200 ms into
 * them. On every survivor the request that found the failure ends with
 * the cause (WEFT_EPEER, or WEFT_ETIMEDOUT where the survivor saw only
 * silence): the first collective, or a sendrecv, which runs beside the
 * collectives (API.md, Order); the others with WEFT_EABORTED (a sendrecv
 * that needs no more of rank 3 may end well first); each
 * callback once with its request's result, and all of it within twice
 * the deadline of the post. */
#define VICTIM_REQS 10
#define VICTIM_DL_MS 1500

static int victim_post(weft_comm *c, int i, float *a, float *b,
                       weft_request **req)
{
    const int me = weft_rank(c), n = weft_size(c);

    switch (i % 5) {
    case 0:
        return weft_iall_reduce(c, a, b, 256, WEFT_FLOAT32, WEFT_SUM, req);
    case 1:
        return weft_iall_gather(c, a, b, 256, WEFT_FLOAT32, req);
    case 2:
        return weft_ibroadcast(c, a, 256, WEFT_FLOAT32, n - 1, req);
    case 3:
        return weft_ibarrier(c, req);
    default:
        return weft_isendrecv(c, a, (me + 1) % n, b, (me + n - 1) % n, 256,
                              WEFT_FLOAT32, req);
    }
}

static int victim_rank(int rank, int nranks, void *arg)
{
    static float a[VICTIM_REQS][256], b[VICTIM_REQS][256 * 4];
    /* count_cb's count and result; read once the requests completed */
    static int seen[VICTIM_REQS][2];
    weft_request *reqs[VICTIM_REQS] = {0};
    weft_comm *c;
    double t0, dt, stall;
    int fail = 0, rc = WEFT_OK, late;

    (void)arg;
    if (init_all(&c, rank, nranks))
        return 1;
    if (rank == nranks - 1) {
        mp_sleep_ms(200);
        mp_point(1); /* killed, or stopped for good, here */
        return 1;
    }
    mp_stall_watch_start();
    t0 = mp_now_ms();
    for (int i = 0; i < VICTIM_REQS && rc == WEFT_OK; i++)
        if ((rc = victim_post(c, i, a[i], b[i], &reqs[i])) == WEFT_OK)
            rc = weft_request_on_complete(reqs[i], count_cb, seen[i]);
    if (rc != WEFT_OK)
        fail = mp_report_rc(c, "post", rc);
    if (!fail)
        weft_wait_all(reqs, VICTIM_REQS);
    dt = mp_now_ms() - t0;
    stall = mp_stall_watch_stop();
    for (int i = 0, causes = 0; i < VICTIM_REQS && !fail; i++) {
        int got = weft_wait(reqs[i]);
        /* The cause: the first collective (no later one starts before it
         * ended), or a sendrecv running beside it; at least one has it. A
         * sendrecv between survivors (rank 1's), or one whose bytes left
         * before the failure, may end well before it. */
        int cause = got == WEFT_EPEER || got == WEFT_ETIMEDOUT;
        int ok = cause ? i == 0 || i % 5 == 4
                       : got == WEFT_EABORTED || (i % 5 == 4 && got == WEFT_OK);

        causes += cause;
        if (i == VICTIM_REQS - 1 && causes == 0)
            ok = 0;
        if (!ok || seen[i][0] != 1 || seen[i][1] != got)
            fail = (mp_log("request %d: %s, its callback ran %d times with "
                           "%s: %s",
                           i, weft_err_name(got), seen[i][0],
                           weft_err_name(seen[i][1]), weft_last_error(c)),
                    1);
    }
    if (!fail)
        mp_log("all %d requests done after %.0f ms: %s", VICTIM_REQS, dt,
               weft_last_error(c));
    for (int i = 0; i < VICTIM_REQS; i++)
        weft_request_free(reqs[i]);
    weft_finalize(c);
    if (fail)
        return 1;
    if ((late = mp_timing_verdict(dt, 2 * VICTIM_DL_MS, stall)) == 1)
        mp_log("the requests took %.0f ms, twice the deadline is %d ms", dt,
               2 * VICTIM_DL_MS);
    return late;
}

static void run_victim(enum mp_action_kind kind, enum mp_layout layout,
                       const char *topology)
{
    const struct mp_action act = {3, 1, kind};
    struct mp_opts o = {
        .nranks = 4,
        .layout = layout,
        .wires = 2,
        .timeout_ms = VICTIM_DL_MS,
        .deadline_ms = 30000,
        .actions = &act,
        .nactions = 1,
        .linger_mask = 1u << 3,
    };
    struct mp_result res;
    char buf[1024];

    setenv("WEFT_TOPOLOGY", topology, 1);
    cr_assert_eq(mp_run_timed(&o, victim_rank, NULL, &res, "victim"), 0,
                 "could not set up the job");
    unsetenv("WEFT_TOPOLOGY");
    cr_assert(mp_all_passed(&res), "%s", mp_describe(&res, buf, sizeof buf));
}

Test(nonblocking, killed_peer_ten_pending_mesh, .timeout = 90)
{
    run_victim(MP_ACT_SIGKILL, MP_LAYOUT_ONE_HOST, "mesh");
}

Test(nonblocking, stopped_peer_ten_pending_mesh, .timeout = 90)
{
    run_victim(MP_ACT_SIGSTOP, MP_LAYOUT_ONE_HOST, "mesh");
}

Test(nonblocking, killed_peer_ten_pending_ring, .timeout = 90)
{
    run_victim(MP_ACT_SIGKILL, MP_LAYOUT_RING, "auto");
}

Test(nonblocking, stopped_peer_ten_pending_ring, .timeout = 90)
{
    run_victim(MP_ACT_SIGSTOP, MP_LAYOUT_RING, "auto");
}

/* Consecutive all_reduces whose counts differ between the ranks (10 then
 * 20 on rank 0, 20 then 10 on rank 1) fail with WEFT_EMISMATCH whether
 * they run alone or as one batch of 30 elements: never mixed. A long
 * all_reduce in front gives both ranks the time to queue them, so that
 * the small one before them offers a batch of two. */
static int batch_mismatch(int rank, int nranks, void *arg)
{
    static float big[1 << 20], small[64];
    const size_t counts[2][2] = {{10, 20}, {20, 10}};
    const int want[4] = {WEFT_OK, WEFT_OK, WEFT_EMISMATCH, WEFT_EABORTED};
    weft_request *reqs[4] = {0};
    weft_comm *c;
    int fail = 0, rc;

    (void)arg;
    if (init_all(&c, rank, nranks))
        return 1;
    rc = weft_iall_reduce(c, big, big, 1 << 20, WEFT_FLOAT32, WEFT_SUM,
                          &reqs[0]);
    if (rc == WEFT_OK)
        rc = weft_iall_reduce(c, small, small, 4, WEFT_FLOAT32, WEFT_SUM,
                              &reqs[1]);
    if (rc == WEFT_OK)
        rc = weft_iall_reduce(c, small + 8, small + 8, counts[rank][0],
                              WEFT_FLOAT32, WEFT_SUM, &reqs[2]);
    if (rc == WEFT_OK)
        rc = weft_iall_reduce(c, small + 32, small + 32, counts[rank][1],
                              WEFT_FLOAT32, WEFT_SUM, &reqs[3]);
    if (rc != WEFT_OK)
        fail = mp_report_rc(c, "iall_reduce", rc);
    for (int i = 0; i < 4 && !fail; i++)
        if ((rc = weft_wait(reqs[i])) != want[i])
            fail =
                (mp_log("request %d: %s, expected %s: %s", i, weft_err_name(rc),
                        weft_err_name(want[i]), weft_last_error(c)),
                 1);
    if (!fail)
        mp_log("as expected: %s", weft_last_error(c));
    for (int i = 0; i < 4; i++)
        weft_request_free(reqs[i]);
    weft_finalize(c);
    return fail;
}

Test(nonblocking, batch_of_mismatched_counts, .timeout = 60)
{
    run_ranks(batch_mismatch,
              &(struct mp_opts){.nranks = 2, .timeout_ms = 10000});
}

static void *abort_soon(void *arg)
{
    mp_sleep_ms(200);
    weft_abort(arg);
    return NULL;
}

/* Rank 0's receives never get data (rank 1 waits for rank 0); another
 * thread aborts: every request ends with WEFT_EABORTED, promptly. */
static int abort_pending(int rank, int nranks, void *arg)
{
    static float buf[NPEND * 16];
    weft_request *reqs[NPEND];
    static cb_log l;
    weft_comm *c;
    pthread_t th;
    int fail = 0, rc;

    (void)arg;
    if (init_all(&c, rank, nranks))
        return 1;
    if (rank == 0) {
        double t0 = mp_now_ms();

        fail = post_pending(c, 1, buf, reqs, &l);
        pthread_create(&th, NULL, abort_soon, c);
        if (!fail)
            fail = check_failed(c, reqs, &l, WEFT_EABORTED, WEFT_EABORTED);
        pthread_join(th, NULL);
        if (!fail && mp_now_ms() - t0 > 5000)
            fail = (mp_log("the abort took %.0f ms", mp_now_ms() - t0), 1);
        for (int i = 0; i < NPEND; i++)
            weft_request_free(reqs[i]);
    } else {
        /* Sends nothing (rank 0's receives must stay unmatched) and sees
         * rank 0 go once it has finalized. */
        rc = weft_recv(c, buf, 1, WEFT_FLOAT32, 0);
        if (rc != WEFT_EPEER && rc != WEFT_ETIMEDOUT)
            fail =
                (mp_log("recv from an aborted peer: %s", weft_err_name(rc)), 1);
    }
    weft_finalize(c);
    return fail;
}

Test(nonblocking, abort_with_requests_pending, .timeout = 60)
{
    run_ranks(abort_pending,
              &(struct mp_opts){.nranks = 2, .timeout_ms = 8000});
}

/* weft_finalize with receives pending: their callbacks run with
 * WEFT_EABORTED, finalize returns promptly, and the requests are still
 * valid (tested, waited for, freed) after it. */
static int finalize_pending(int rank, int nranks, void *arg)
{
    static float buf[NPEND * 16];
    weft_request *reqs[NPEND];
    static cb_log l;
    weft_comm *c;
    int fail = 0, rc, done = 0;

    (void)arg;
    if (init_all(&c, rank, nranks))
        return 1;
    if (rank == 0) {
        double t0 = mp_now_ms();

        fail = post_pending(c, 1, buf, reqs, &l);
        mp_sleep_ms(100);
        weft_finalize(c);
        if (mp_now_ms() - t0 > 5000)
            fail = (mp_log("finalize took %.0f ms", mp_now_ms() - t0), 1);
        for (int i = 0; !fail && i < NPEND; i++) {
            if ((rc = weft_test(reqs[i], &done)) != WEFT_EABORTED ||
                done != 1) {
                mp_log("request %d after finalize: %s, done %d", i,
                       weft_err_name(rc), done);
                fail = 1;
            }
        }
        if (!fail)
            fail = check_failed(NULL, reqs, &l, WEFT_EABORTED, WEFT_EABORTED);
        for (int i = 0; i < NPEND; i++)
            weft_request_free(reqs[i]);
        return fail;
    }
    rc = weft_recv(c, buf, 1, WEFT_FLOAT32, 0); /* rank 0 leaves: EPEER */
    if (rc != WEFT_EPEER && rc != WEFT_ETIMEDOUT)
        fail = (mp_log("recv from a finalized peer: %s", weft_err_name(rc)), 1);
    weft_finalize(c);
    return fail;
}

Test(nonblocking, finalize_with_requests_pending, .timeout = 60)
{
    run_ranks(finalize_pending,
              &(struct mp_opts){.nranks = 2, .timeout_ms = 8000});
}

/* ==== Order: point-to-point requests among pending ones (issue 30) ====
 *
 * API.md, Order: point-to-point requests progress without waiting for
 * earlier pending ones (a posted receive never holds back a later send,
 * even with collectives between), messages between a pair match in post
 * order, collectives keep their order among themselves, and an operation
 * whose buffers overlap an earlier pending one's still waits for it. The
 * cases are nb_cases.c's (nbprog runs them too); here each runs over
 * shared memory, over TCP (WEFT_SHM=0), with two wires, and on hosts in
 * a ring where ranks 0 and 2 (1 and 3) reach each other through the
 * relay. Every operation has a deadline of ORDER_TIMEOUT_MS, so a
 * receive that holds back the send it needs fails, naming itself. */

#define ORDER_TIMEOUT_MS 4000

enum nb_transport {
    NB_SHM, /* ranks of one host over shared memory (WEFT_SHM=1) */
    NB_TCP, /* ranks of one host over loopback TCP (WEFT_SHM=0) */
    NB_RING /* one host per rank, in a ring of links: relayed pairs */
};
static const char *const nb_transport_names[] = {"shared memory", "TCP",
                                                 "hosts in a ring (relay)"};

static void set_transport(enum nb_transport t)
{
    setenv("WEFT_TOPOLOGY", "auto", 1);
    if (t == NB_SHM) {
        setenv("WEFT_SHM", "1", 1);
    } else {
        setenv("WEFT_SHM", "0", 1);
        setenv("WEFT_TRANSPORT", "tcp", 1);
    }
}

static struct mp_opts order_opts(int nranks, int wires, enum nb_transport t)
{
    return (struct mp_opts){
        .nranks = nranks,
        .layout = t == NB_RING ? MP_LAYOUT_RING : MP_LAYOUT_ONE_HOST,
        .wires = wires,
        .timeout_ms = ORDER_TIMEOUT_MS,
        .connect_timeout_ms = 20000,
        .deadline_ms = 60000,
    };
}

/* weft_init, a barrier, the deadline, fn, weft_finalize. */
static int order_rank(int rank, int nranks, void *arg)
{
    case_fn fn = *(case_fn *)arg;
    weft_comm *c;
    int fail, rc;

    if (init_all(&c, rank, nranks))
        return 1;
    if ((rc = weft_set_timeout(c, ORDER_TIMEOUT_MS)) != WEFT_OK)
        fail = mp_report_rc(c, "weft_set_timeout", rc);
    else
        fail = fn(c, NULL);
    if ((rc = weft_finalize(c)) != WEFT_OK) {
        mp_log("weft_finalize returned %s", weft_err_name(rc));
        fail = 1;
    }
    return fail;
}

static void run_order(case_fn fn, int nranks, int wires, enum nb_transport t,
                      const char *what)
{
    struct mp_opts o = order_opts(nranks, wires, t);
    struct mp_result res;
    char buf[1024];

    set_transport(t);
    small_thresholds(nranks, o.layout, "auto");
    cr_assert_eq(mp_run(&o, order_rank, &fn, &res), 0,
                 "could not set up the job");
    cr_assert(mp_all_passed(&res), "%s, %s, %d ranks, %d wire(s): %s", what,
              nb_transport_names[t], nranks, wires,
              mp_describe(&res, buf, sizeof buf));
}

static int irecv_first(weft_comm *c, void *arg)
{
    (void)arg;
    return nb_irecv_first(c);
}

static int ring_exchange(weft_comm *c, void *arg)
{
    (void)arg;
    return nb_ring_exchange(c);
}

static int coll_between(weft_comm *c, void *arg)
{
    (void)arg;
    return nb_coll_between(c);
}

static int hazards(weft_comm *c, void *arg)
{
    (void)arg;
    return nb_hazards(c);
}

static int random_p2p(weft_comm *c, void *arg)
{
    (void)arg;
    for (uint64_t seed = 1; seed <= 16; seed++)
        if (nb_random_p2p(c, seed))
            return 1;
    return 0;
}

static int callback_state(weft_comm *c, void *arg)
{
    (void)arg;
    return nb_callback_state(c);
}

#define ORDER_TEST(name, fn, n, w, t)                                          \
    Test(order, name, .timeout = 90)                                           \
    {                                                                          \
        run_order(fn, n, w, t, #fn);                                           \
    }

/* Receives from every peer posted before the sends to it (1 float to
 * 4 MiB, several frames and wires), bit for bit and in order. */
ORDER_TEST(irecv_first_2ranks_shm, irecv_first, 2, 1, NB_SHM)
ORDER_TEST(irecv_first_2ranks_tcp_2wires, irecv_first, 2, 2, NB_TCP)
ORDER_TEST(irecv_first_3ranks_tcp, irecv_first, 3, 1, NB_TCP)
ORDER_TEST(irecv_first_4ranks_shm, irecv_first, 4, 1, NB_SHM)
ORDER_TEST(irecv_first_4ranks_relayed_ring, irecv_first, 4, 1, NB_RING)

/* irecv left, irecv right, isend right, isend left, wait_all. */
ORDER_TEST(ring_exchange_2ranks_tcp, ring_exchange, 2, 1, NB_TCP)
ORDER_TEST(ring_exchange_3ranks_shm, ring_exchange, 3, 1, NB_SHM)
ORDER_TEST(ring_exchange_4ranks_tcp_2wires, ring_exchange, 4, 2, NB_TCP)
ORDER_TEST(ring_exchange_4ranks_relayed_ring, ring_exchange, 4, 2, NB_RING)

/* Collectives (posted, and blocking ones) between receives and sends. */
ORDER_TEST(coll_between_2ranks_shm, coll_between, 2, 1, NB_SHM)
ORDER_TEST(coll_between_3ranks_tcp_2wires, coll_between, 3, 2, NB_TCP)
ORDER_TEST(coll_between_4ranks_shm, coll_between, 4, 1, NB_SHM)
ORDER_TEST(coll_between_4ranks_relayed_ring, coll_between, 4, 1, NB_RING)

/* Overlapping buffers: the hazards still hold. */
ORDER_TEST(hazards_2ranks_shm, hazards, 2, 1, NB_SHM)
ORDER_TEST(hazards_3ranks_tcp_2wires, hazards, 3, 2, NB_TCP)
ORDER_TEST(hazards_4ranks_relayed_ring, hazards, 4, 1, NB_RING)

/* Random sequences of messages and collectives, seeds 1-16. */
ORDER_TEST(random_2ranks_shm, random_p2p, 2, 1, NB_SHM)
ORDER_TEST(random_2ranks_tcp, random_p2p, 2, 1, NB_TCP)
ORDER_TEST(random_3ranks_shm, random_p2p, 3, 1, NB_SHM)
ORDER_TEST(random_3ranks_tcp_2wires, random_p2p, 3, 2, NB_TCP)
ORDER_TEST(random_4ranks_shm, random_p2p, 4, 1, NB_SHM)
ORDER_TEST(random_4ranks_relayed_ring, random_p2p, 4, 2, NB_RING)

/* ---- a send and its receive of different sizes ----
 *
 * Rank 1 sends rank 0 one element more, or one less, than rank 0
 * receives, the receive posted before the send or after: rank 0's
 * receive ends with WEFT_EMISMATCH or a deadline (its own, or rank 1's,
 * which rank 0 sees as WEFT_EPEER; or WEFT_EABORTED behind its own send
 * that failed first), never WEFT_OK, and writes nothing past its
 * buffer. The messages the other way are right,
 * and each rank waits until the other has its results before it
 * finalizes (so nobody sees the other leave). */
struct size_mismatch {
    int recv_first;
    int delta; /* rank 1 sends count + delta */
};

#define SM_COUNT 70001

static int size_mismatch_rank(int rank, int nranks, void *arg)
{
    const struct size_mismatch *sm = arg;
    volatile int *done = mp_shm();
    const int peer = 1 - rank;
    const size_t send_count =
        SM_COUNT + (rank == 1 ? (size_t)(long)sm->delta : 0);
    float *sb = mp_alloc((SM_COUNT + 1) * sizeof(float));
    float *rb = mp_alloc(SM_COUNT * sizeof(float));
    weft_request *reqs[2] = {NULL, NULL};
    weft_comm *c;
    int fail = 0, rc = WEFT_OK;

    if (init_all(&c, rank, nranks)) {
        free(sb);
        free(rb);
        return 1;
    }
    weft_set_timeout(c, ORDER_TIMEOUT_MS);
    memset(sb, 0, (SM_COUNT + 1) * sizeof(float));
    for (int k = 0; k < 2 && rc == WEFT_OK; k++) {
        if ((k == 0) == (sm->recv_first != 0))
            rc = weft_irecv(c, rb, SM_COUNT, WEFT_FLOAT32, peer, &reqs[0]);
        else
            rc = weft_isend(c, sb, send_count, WEFT_FLOAT32, peer, &reqs[1]);
    }
    /* The second post may find the communicator failed already: rank 0
     * saw the mismatch, failed it and closed its connections (rank 1's
     * send then fails, and so does its post of the receive). That error
     * stands for the request never posted; any other is wrong. */
    if (rc != WEFT_OK && rc != WEFT_EABORTED && rc != WEFT_EPEER &&
        rc != WEFT_EMISMATCH)
        fail = mp_report_rc(c, "post", rc);
    if (!fail) {
        weft_wait_all(reqs, 2);
        int rrc = reqs[0] ? weft_wait(reqs[0]) : rc;
        int src = reqs[1] ? weft_wait(reqs[1]) : rc;
        /* WEFT_EPEER: the peer's own deadline came first, and it left;
         * WEFT_EABORTED: the send before it failed first. */
        if (rank == 0 && rrc != WEFT_EMISMATCH && rrc != WEFT_ETIMEDOUT &&
            rrc != WEFT_EPEER && rrc != WEFT_EABORTED) {
            mp_log("irecv of %d floats (posted %s the isend) met a send of "
                   "%zu: returned %s, expected WEFT_EMISMATCH or a deadline "
                   "(WEFT_ETIMEDOUT; WEFT_EPEER from a peer whose deadline "
                   "came first), never data of another size: %s",
                   SM_COUNT, sm->recv_first ? "before" : "after",
                   (size_t)SM_COUNT + (size_t)(long)sm->delta,
                   weft_err_name(rrc), weft_last_error(c));
            fail = 1;
        }
        if (!mp_canary_ok(rb, SM_COUNT * sizeof(float))) {
            mp_log("the receive of %d floats was written past its end",
                   SM_COUNT);
            fail = 1;
        }
        mp_log("receive %s, send %s: %s", weft_err_name(rrc),
               weft_err_name(src), weft_last_error(c));
    }
    done[rank] = 1;
    for (double end = mp_now_ms() + 10000; !done[peer] && mp_now_ms() < end;)
        mp_sleep_ms(2);
    for (int k = 0; k < 2; k++)
        weft_request_free(reqs[k]);
    weft_finalize(c);
    free(sb);
    free(rb);
    return fail;
}

static void run_size_mismatch(int recv_first, int delta, enum nb_transport t)
{
    struct size_mismatch sm = {recv_first, delta};
    struct mp_opts o = order_opts(2, t == NB_TCP ? 2 : 1, t);
    struct mp_result res;
    char buf[1024];

    set_transport(t);
    small_thresholds(o.nranks, o.layout, "auto");
    cr_assert_eq(mp_run(&o, size_mismatch_rank, &sm, &res), 0,
                 "could not set up the job");
    cr_assert(mp_all_passed(&res),
              "a send of %d floats, a receive of %d (posted %s it), %s: %s",
              SM_COUNT + delta, SM_COUNT, recv_first ? "before" : "after",
              nb_transport_names[t], mp_describe(&res, buf, sizeof buf));
}

Test(order, size_mismatch_shm, .timeout = 90)
{
    run_size_mismatch(1, 1, NB_SHM);
    run_size_mismatch(1, -1, NB_SHM);
    run_size_mismatch(0, 1, NB_SHM);
}

Test(order, size_mismatch_tcp, .timeout = 90)
{
    run_size_mismatch(1, 1, NB_TCP);
    run_size_mismatch(1, -1, NB_TCP);
    run_size_mismatch(0, -1, NB_TCP);
}

/* ==== Callbacks see their own request complete (issue 30) ==== */

Test(callbacks, test_inside_callback_2ranks_shm, .timeout = 60)
{
    run_order(callback_state, 2, 1, NB_SHM, "callback_state");
}

Test(callbacks, test_inside_callback_3ranks_tcp, .timeout = 60)
{
    run_order(callback_state, 3, 1, NB_TCP, "callback_state");
}

Test(callbacks, test_inside_callback_4ranks_relayed_ring, .timeout = 60)
{
    run_order(callback_state, 4, 1, NB_RING, "callback_state");
}

/* Rank 0's receives never get data; weft_abort (arg 0) or weft_finalize
 * (arg 1) completes them with WEFT_EABORTED: each callback, calling
 * weft_test on its own request, sees it done with that result. */
#define CB_PENDING 8

static int cb_aborted_rank(int rank, int nranks, void *arg)
{
    const int use_finalize = *(const int *)arg;
    const char *what = use_finalize ? "callbacks of requests weft_finalize "
                                      "aborted"
                                    : "callbacks of requests weft_abort "
                                      "aborted";
    static float buf[CB_PENDING * 16];
    static nb_cb_seen seen[CB_PENDING];
    weft_request *reqs[CB_PENDING] = {0};
    weft_comm *c;
    int fail = 0, rc;

    if (init_all(&c, rank, nranks))
        return 1;
    weft_set_timeout(c, ORDER_TIMEOUT_MS);
    if (rank != 0) {
        /* Sends nothing; sees rank 0 go. */
        rc = weft_recv(c, buf, 1, WEFT_FLOAT32, 0);
        if (rc != WEFT_EPEER && rc != WEFT_ETIMEDOUT)
            fail =
                (mp_log("recv from a rank that aborted: %s", weft_err_name(rc)),
                 1);
        weft_finalize(c);
        return fail;
    }
    nb_cb_reset(seen, CB_PENDING);
    for (int i = 0; i < CB_PENDING && !fail; i++) {
        rc = weft_irecv(c, buf + i * 16, 16, WEFT_FLOAT32, 1, &reqs[i]);
        if (rc == WEFT_OK)
            rc = weft_request_on_complete(reqs[i], nb_state_cb, &seen[i]);
        if (rc != WEFT_OK)
            fail = mp_report_rc(c, "irecv", rc);
    }
    mp_sleep_ms(100);
    if (use_finalize) {
        weft_finalize(c);
        c = NULL;
    } else {
        weft_abort(c);
    }
    weft_wait_all(reqs, CB_PENDING);
    if (!fail)
        fail = nb_cb_check(seen, CB_PENDING, WEFT_EABORTED, what, NULL);
    for (int i = 0; i < CB_PENDING; i++)
        weft_request_free(reqs[i]);
    weft_finalize(c);
    return fail;
}

static void run_cb_aborted(int use_finalize)
{
    struct mp_opts o = order_opts(2, 1, NB_SHM);
    struct mp_result res;
    char buf[1024];

    cr_assert_eq(mp_run(&o, cb_aborted_rank, &use_finalize, &res), 0,
                 "could not set up the job");
    cr_assert(mp_all_passed(&res), "%s", mp_describe(&res, buf, sizeof buf));
}

Test(callbacks, test_inside_callback_after_abort, .timeout = 60)
{
    run_cb_aborted(0);
}

Test(callbacks, test_inside_callback_during_finalize, .timeout = 60)
{
    run_cb_aborted(1);
}

/* Small integers (1 .. 3) by call, rank and element: sums stay exact. */
static float small_value(int call, int rank, size_t i)
{
    return (float)((mp_hash64((uint64_t)call * 1000003u + i) + (uint64_t)rank) %
                       3 +
                   1);
}

/* ==== A run of small all_reduces where one rank's call differs ====
 *
 * (issue 30) Behind a long all_reduce (so that every rank has the small
 * ones queued, and weft may run them as batches), each rank posts a run
 * of small iall_reduces; one rank's call at position pos differs (one
 * element more, int32 for float32, or max for sum). Over every transport:
 * the calls before pos matched on every rank and get their own results
 * (checked), the one at pos fails (WEFT_EMISMATCH; with 3 ranks a rank
 * that did not see the odd call may see its deadline, but one rank says
 * WEFT_EMISMATCH), every later one WEFT_EABORTED; and weft_last_error
 * names only counts that some rank called (never a batch's sum). */

#define BM_MAX 8
enum { BM_COUNT, BM_DTYPE, BM_OP };
static const char *const bm_kind_names[] = {"one element more",
                                            "int32 for float32", "max for sum"};

struct batch_case {
    int nranks;
    int nops;   /* 3 or BM_MAX */
    int pos;    /* which call differs */
    int kind;   /* BM_* */
    int varied; /* counts of bm_counts[1] rather than all 100 */
    enum nb_transport t;
};

static const size_t bm_counts[2][BM_MAX] = {
    {100, 100, 100, 100, 100, 100, 100, 100},
    {100, 37, 100, 5, 64, 100, 12, 100},
};

/* What the ranks tell the parent (mp_shm). */
struct bm_shared {
    int rc[MP_MAX_RANKS][BM_MAX];
    int done[MP_MAX_RANKS];
};

/* The rank whose call differs. */
static int bm_odd(const struct batch_case *bc)
{
    return bc->kind == BM_COUNT ? bc->nranks - 1 : 0;
}

/* 1 when n is a count that some rank called. */
static int bm_called(const struct batch_case *bc, unsigned long long n)
{
    const size_t *counts = bm_counts[bc->varied];

    for (int j = 0; j < bc->nops; j++)
        if (n == counts[j] ||
            (bc->kind == BM_COUNT && j == bc->pos && n == counts[j] + 1))
            return 1;
    return 0;
}

/* 0 when msg names only counts some rank called, and one of those of
 * the differing call; else 1 after a message. */
static int bm_check_msg(const struct batch_case *bc, const char *msg)
{
    const size_t want = bm_counts[bc->varied][bc->pos];
    const size_t want2 = want + (bc->kind == BM_COUNT);
    int named = 0;

    for (const char *p = msg; (p = strstr(p, "count ")) != NULL;) {
        char *end;
        unsigned long long n;

        p += 6;
        if (*p < '0' || *p > '9')
            continue;
        n = strtoull(p, &end, 10);
        p = end;
        if (!bm_called(bc, n)) {
            mp_log("weft_last_error names \"count %llu\", which no rank "
                   "called (the calls were of %zu elements, the odd one %zu): "
                   "%s",
                   n, want, want2, msg);
            return 1;
        }
        named |= n == want || n == want2;
    }
    if (!named) {
        mp_log("weft_last_error names neither \"count %zu\" nor \"count %zu\" "
               "(the calls that differ): %s",
               want, want2, msg);
        return 1;
    }
    return 0;
}

static int bm_rank(int rank, int nranks, void *arg)
{
    static float big[1 << 20];
    const struct batch_case *bc = arg;
    struct bm_shared *sh = mp_shm();
    const size_t *counts = bm_counts[bc->varied];
    const int odd = rank == bm_odd(bc);
    float *in[BM_MAX] = {0}, *out[BM_MAX] = {0};
    weft_request *reqs[BM_MAX + 1] = {0};
    weft_comm *c;
    int fail = 0, rc;

    if (init_all(&c, rank, nranks))
        return 1;
    weft_set_timeout(c, ORDER_TIMEOUT_MS);
    rc = weft_iall_reduce(c, big, big, 1 << 20, WEFT_FLOAT32, WEFT_SUM,
                          &reqs[0]);
    for (int j = 0; j < bc->nops && rc == WEFT_OK; j++) {
        const int here = odd && j == bc->pos;
        const size_t count = counts[j] + (here && bc->kind == BM_COUNT);

        in[j] = mp_alloc(count * sizeof(float));
        out[j] = mp_alloc(count * sizeof(float));
        for (size_t i = 0; i < count; i++)
            in[j][i] = small_value(j, rank, i);
        rc = weft_iall_reduce(
            c, in[j], out[j], count,
            here && bc->kind == BM_DTYPE ? WEFT_INT32 : WEFT_FLOAT32,
            here && bc->kind == BM_OP ? WEFT_MAX : WEFT_SUM, &reqs[j + 1]);
    }
    if (rc != WEFT_OK)
        fail = mp_report_rc(c, "iall_reduce", rc);
    if (!fail) {
        weft_wait_all(reqs, (size_t)bc->nops + 1);
        if ((rc = weft_wait(reqs[0])) != WEFT_OK)
            fail = mp_report_rc(c, "the long all_reduce in front", rc);
    }
    for (int j = 0; j < bc->nops && !fail; j++) {
        rc = sh->rc[rank][j] = weft_wait(reqs[j + 1]);
        int ok = j < bc->pos   ? rc == WEFT_OK
                 : j > bc->pos ? rc == WEFT_EABORTED
                 : nranks == 2 ? rc == WEFT_EMISMATCH
                               : rc == WEFT_EMISMATCH || rc == WEFT_ETIMEDOUT ||
                                     rc == WEFT_EPEER;
        if (!ok) {
            mp_log("call %d of %d (count %zu): returned %s, expected %s (the "
                   "call at %d differs: %s on rank %d): %s",
                   j, bc->nops, counts[j], weft_err_name(rc),
                   j < bc->pos   ? "WEFT_OK: it matched on every rank"
                   : j > bc->pos ? "WEFT_EABORTED: a later call"
                                 : "WEFT_EMISMATCH",
                   bc->pos, bm_kind_names[bc->kind], bm_odd(bc),
                   weft_last_error(c));
            fail = 1;
        } else if (j < bc->pos) {
            float *want = mp_alloc(counts[j] * sizeof(float));
            char what[64];

            for (size_t i = 0; i < counts[j]; i++) {
                want[i] = 0.0f;
                for (int r = 0; r < nranks; r++)
                    want[i] += small_value(j, r, i);
            }
            snprintf(what, sizeof what, "call %d of %d (count %zu)", j,
                     bc->nops, counts[j]);
            fail = mp_check_elems(what, "recvbuf", WEFT_FLOAT32, out[j], want,
                                  counts[j]) ||
                   mp_check_canary(what, "recvbuf", out[j],
                                   counts[j] * sizeof(float));
            free(want);
        } else if (j == bc->pos && rc == WEFT_EMISMATCH) {
            fail = bm_check_msg(bc, weft_last_error(c));
        }
    }
    if (!fail)
        mp_log("as expected: %s", weft_last_error(c));
    /* Leave once every rank has its results: none sees another go. */
    sh->done[rank] = 1;
    for (double end = mp_now_ms() + 10000; mp_now_ms() < end;) {
        int all = 1;
        for (int r = 0; r < nranks; r++)
            all &= ((volatile int *)sh->done)[r];
        if (all)
            break;
        mp_sleep_ms(2);
    }
    for (int j = 0; j <= bc->nops; j++)
        weft_request_free(reqs[j]);
    for (int j = 0; j < bc->nops; j++) {
        free(in[j]);
        free(out[j]);
    }
    weft_finalize(c);
    return fail;
}

static void run_batch_case(const struct batch_case *bc)
{
    struct mp_opts o = order_opts(bc->nranks, 1, bc->t);
    const struct bm_shared *sh = mp_shm();
    struct mp_result res;
    char buf[1024];
    int mismatch = 0;

    set_transport(bc->t);
    cr_assert_eq(mp_run(&o, bm_rank, (void *)bc, &res), 0,
                 "could not set up the job");
    cr_assert(mp_all_passed(&res),
              "%d iall_reduces, call %d differs on rank %d (%s), %s, %d "
              "ranks: %s",
              bc->nops, bc->pos, bm_odd(bc), bm_kind_names[bc->kind],
              nb_transport_names[bc->t], bc->nranks,
              mp_describe(&res, buf, sizeof buf));
    for (int r = 0; r < bc->nranks; r++)
        mismatch |= sh->rc[r][bc->pos] == WEFT_EMISMATCH;
    cr_assert(mismatch,
              "call %d differs (%s), %s: no rank said "
              "WEFT_EMISMATCH",
              bc->pos, bm_kind_names[bc->kind], nb_transport_names[bc->t]);
}

#define BATCH_TEST(name, n, nops, pos, kind, varied, t)                        \
    Test(batch, name, .timeout = 60)                                           \
    {                                                                          \
        static const struct batch_case bc = {n, nops, pos, kind, varied, t};   \
        run_batch_case(&bc);                                                   \
    }

/* The testers' case: 100, 100, 100 against 100, 100, 101. */
BATCH_TEST(three_last_differs_2ranks_shm, 2, 3, 2, BM_COUNT, 0, NB_SHM)
BATCH_TEST(three_last_differs_2ranks_tcp, 2, 3, 2, BM_COUNT, 0, NB_TCP)
/* Eight calls, one count differing at 0, 1, 2 or 5. */
BATCH_TEST(count_at_0_2ranks_shm, 2, BM_MAX, 0, BM_COUNT, 0, NB_SHM)
BATCH_TEST(count_at_0_2ranks_tcp, 2, BM_MAX, 0, BM_COUNT, 0, NB_TCP)
BATCH_TEST(count_at_1_2ranks_shm, 2, BM_MAX, 1, BM_COUNT, 1, NB_SHM)
BATCH_TEST(count_at_1_2ranks_tcp, 2, BM_MAX, 1, BM_COUNT, 1, NB_TCP)
BATCH_TEST(count_at_2_2ranks_shm, 2, BM_MAX, 2, BM_COUNT, 0, NB_SHM)
BATCH_TEST(count_at_2_2ranks_tcp, 2, BM_MAX, 2, BM_COUNT, 0, NB_TCP)
BATCH_TEST(count_at_5_2ranks_shm, 2, BM_MAX, 5, BM_COUNT, 1, NB_SHM)
BATCH_TEST(count_at_5_2ranks_tcp, 2, BM_MAX, 5, BM_COUNT, 1, NB_TCP)
BATCH_TEST(count_at_0_3ranks_shm, 3, BM_MAX, 0, BM_COUNT, 1, NB_SHM)
BATCH_TEST(count_at_0_3ranks_tcp, 3, BM_MAX, 0, BM_COUNT, 1, NB_TCP)
BATCH_TEST(count_at_1_3ranks_shm, 3, BM_MAX, 1, BM_COUNT, 0, NB_SHM)
BATCH_TEST(count_at_1_3ranks_tcp, 3, BM_MAX, 1, BM_COUNT, 0, NB_TCP)
BATCH_TEST(count_at_2_3ranks_shm, 3, BM_MAX, 2, BM_COUNT, 1, NB_SHM)
BATCH_TEST(count_at_2_3ranks_tcp, 3, BM_MAX, 2, BM_COUNT, 1, NB_TCP)
BATCH_TEST(count_at_5_3ranks_shm, 3, BM_MAX, 5, BM_COUNT, 0, NB_SHM)
BATCH_TEST(count_at_5_3ranks_tcp, 3, BM_MAX, 5, BM_COUNT, 0, NB_TCP)
/* Another dtype (of the same size) or op on rank 0. */
BATCH_TEST(dtype_at_3_2ranks_shm, 2, BM_MAX, 3, BM_DTYPE, 1, NB_SHM)
BATCH_TEST(dtype_at_3_2ranks_tcp, 2, BM_MAX, 3, BM_DTYPE, 1, NB_TCP)
BATCH_TEST(dtype_at_3_3ranks_shm, 3, BM_MAX, 3, BM_DTYPE, 0, NB_SHM)
BATCH_TEST(dtype_at_3_3ranks_tcp, 3, BM_MAX, 3, BM_DTYPE, 0, NB_TCP)
BATCH_TEST(op_at_5_2ranks_shm, 2, BM_MAX, 5, BM_OP, 0, NB_SHM)
BATCH_TEST(op_at_5_2ranks_tcp, 2, BM_MAX, 5, BM_OP, 0, NB_TCP)
BATCH_TEST(op_at_5_3ranks_shm, 3, BM_MAX, 5, BM_OP, 1, NB_SHM)
BATCH_TEST(op_at_5_3ranks_tcp, 3, BM_MAX, 5, BM_OP, 1, NB_TCP)
