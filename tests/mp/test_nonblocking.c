/*
 * Non-blocking operations (API.md, "Non-blocking operations"): every
 * operation against its blocking twin, random sequences of pending
 * operations on overlapping buffers, a pipeline, two threads, progress
 * while the caller (or a rank in between) is outside weft, and what
 * failures, weft_abort and weft_finalize do to pending requests.
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

/* Low thresholds so modest counts take every path (as test_collectives). */
static void small_thresholds(void)
{
    setenv("WEFT_FRAME_BYTES", "65536", 0);
    setenv("WEFT_MIN_WIRE_BYTES", "8192", 0);
    setenv("WEFT_BIDIR_MIN_BYTES", "16384", 0);
    setenv("WEFT_SMALL_ALL_REDUCE_BYTES", "4096", 0);
    setenv("WEFT_DOUBLING_ALL_REDUCE_BYTES", "1024", 0);
    setenv("WEFT_MESH_SMALL_ALL_REDUCE_BYTES", "4096", 0);
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

    small_thresholds();
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
 * them. On every survivor the first request ends with the cause
 * (WEFT_EPEER, or WEFT_ETIMEDOUT where the survivor saw only silence), the
 * other nine with WEFT_EABORTED, each callback once with its request's
 * result, and all of it within twice the deadline of the post. */
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
    for (int i = 0; i < VICTIM_REQS && !fail; i++) {
        int got = weft_wait(reqs[i]);
        int ok = i == 0 ? got == WEFT_EPEER || got == WEFT_ETIMEDOUT
                        : got == WEFT_EABORTED;

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
