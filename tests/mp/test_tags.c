/*
 * Tagged point to point and receives from any source (weft_isend_tag,
 * weft_irecv_tag, WEFT_ANY_SOURCE, weft_request_source): messages of
 * other tags ahead on a wire, tags interleaved over sizes from 0 to a few
 * MiB, any-source receives from several senders at once and beside
 * specific ones, tag 0 unchanged, bad arguments, a message larger than
 * its receive, and a sender that dies. Over shared memory, TCP with
 * several wires, and a ring of hosts where some pairs are relayed.
 */
#define _GNU_SOURCE
#include <criterion/criterion.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "harness.h"
#include "weft.h"

#define NELEMS(a) (sizeof(a) / sizeof((a)[0]))

static uint64_t msg_seed(int from, int to, int tag, int i)
{
    return mp_hash64(((uint64_t)from << 48) ^ ((uint64_t)to << 40) ^
                     ((uint64_t)tag << 16) ^ (uint64_t)i ^ 0x7a9);
}

static int fail_rc(weft_comm *c, const char *what, int rc)
{
    return rc == WEFT_OK ? 0 : mp_report_rc(c, what, rc);
}

/* Checks a received message against what `from` filled it with. */
static int check_msg(const char *what, const unsigned char *buf, size_t nb,
                     int from, int to, int tag, int i)
{
    unsigned char *exp = mp_alloc(nb);
    int bad;

    mp_fill_bytes(exp, nb, msg_seed(from, to, tag, i));
    bad = mp_check_elems(what, "received", WEFT_UINT8, buf, exp, nb) ||
          mp_check_canary(what, "recvbuf", buf, nb);
    free(exp);
    return bad;
}

/* ---- tags out of order, and many tags interleaved ---- */

/* The k-th message from one rank to the other: its tag and size. Sizes
 * from 0 to a few MiB, around frames and wires; tags 1..4 interleaved. */
static const size_t il_sizes[] = {0,     1,     100,   4095,    4097,
                                  65536, 65539, 12345, 1 << 20, (3 << 20) + 7,
                                  8,     300000};
#define IL_N ((int)NELEMS(il_sizes))
static int il_tag(int k)
{
    return 1 + (k * 7) % 4;
}

/* Ranks a and b each send IL_N messages of interleaved tags to the other,
 * then a tag-0 weft_send; each posts its receives tag by tag, the tags in
 * descending order (so the first receive's message is behind messages
 * of other tags on every wire), then weft_recv. */
static int interleave_pair(weft_comm *c, int me, int peer)
{
    weft_request *sreq[IL_N] = {NULL}, *rreq[IL_N] = {NULL};
    unsigned char *sbuf[IL_N], *rbuf[IL_N];
    int fail = 0, rc;
    char what[128];

    for (int k = 0; k < IL_N; k++) {
        sbuf[k] = mp_alloc(il_sizes[k]);
        rbuf[k] = mp_alloc(il_sizes[k]);
        mp_fill_bytes(sbuf[k], il_sizes[k], msg_seed(me, peer, il_tag(k), k));
    }
    for (int k = 0; k < IL_N && !fail; k++) {
        snprintf(what, sizeof what, "isend_tag(%zu bytes, tag %d) to %d",
                 il_sizes[k], il_tag(k), peer);
        fail = fail_rc(c, what,
                       weft_isend_tag(c, sbuf[k], il_sizes[k], WEFT_UINT8, peer,
                                      il_tag(k), &sreq[k]));
    }
    for (int tag = 4; tag >= 1 && !fail; tag--)
        for (int k = 0; k < IL_N && !fail; k++) {
            if (il_tag(k) != tag)
                continue;
            snprintf(what, sizeof what, "irecv_tag(%zu bytes, tag %d) from %d",
                     il_sizes[k], tag, peer);
            fail = fail_rc(c, what,
                           weft_irecv_tag(c, rbuf[k], il_sizes[k], WEFT_UINT8,
                                          peer, tag, &rreq[k]));
        }
    if (!fail) {
        uint64_t v = 0x51ed0000u + (uint64_t)me, got = 0;

        /* Tag 0 (weft_send/weft_recv) beside the tagged ones. */
        rc = me < peer ? weft_send(c, &v, 1, WEFT_UINT64, peer)
                       : weft_recv(c, &got, 1, WEFT_UINT64, peer);
        if (rc == WEFT_OK)
            rc = me < peer ? weft_recv(c, &got, 1, WEFT_UINT64, peer)
                           : weft_send(c, &v, 1, WEFT_UINT64, peer);
        fail = fail_rc(c, "tag 0 send/recv", rc);
        if (!fail && got != 0x51ed0000u + (uint64_t)peer) {
            mp_log("tag 0 message: got %llx", (unsigned long long)got);
            fail = 1;
        }
        fail |= fail_rc(c, "wait_all(sends)", weft_wait_all(sreq, IL_N));
        fail |= fail_rc(c, "wait_all(receives)", weft_wait_all(rreq, IL_N));
    }
    for (int k = 0; k < IL_N; k++) {
        if (!fail) {
            snprintf(what, sizeof what,
                     "message %d (tag %d, %zu bytes) from %d", k, il_tag(k),
                     il_sizes[k], peer);
            fail =
                check_msg(what, rbuf[k], il_sizes[k], peer, me, il_tag(k), k);
            if (!fail && il_sizes[k] > 0 &&
                weft_request_source(rreq[k]) != peer) {
                mp_log("%s: source %d", what, weft_request_source(rreq[k]));
                fail = 1;
            }
            if (!fail && weft_request_source(sreq[k]) != -1) {
                mp_log("a send's source is %d, not -1",
                       weft_request_source(sreq[k]));
                fail = 1;
            }
        }
        weft_request_free(rreq[k]);
        weft_request_free(sreq[k]);
        free(sbuf[k]);
        free(rbuf[k]);
    }
    return fail;
}

/* Rank 0 and rank `far` (relayed in a ring of 4 hosts) exchange
 * interleaved tags; the others idle. */
static int interleave_rank(int rank, int nranks, void *arg)
{
    int far = nranks >= 4 ? 2 : 1;
    weft_comm *c;
    int fail = 0, rc;

    (void)arg;
    if (mp_init(&c, rank, nranks) != WEFT_OK)
        return 1;
    if (rank == 0 || rank == far)
        fail = interleave_pair(c, rank, rank == 0 ? far : 0);
    if (!fail)
        fail = fail_rc(c, "barrier", weft_barrier(c));
    rc = weft_finalize(c);
    return fail || rc != WEFT_OK;
}

/* ---- any source ---- */

#define ANY_PER 3 /* messages from each sender */

/* Every rank but 0 sends ANY_PER messages of tag 7 to rank 0, the first
 * word naming sender and number; rank 0 posts all its any-source
 * receives at once, then checks that each message came exactly once,
 * with weft_request_source naming its sender. Then one any-source
 * receive (tag 5) and one from rank nranks-1 (tag 5) pending together:
 * the any-source one must take rank 1's message (rank nranks-1 sends
 * only once it completed) and the specific one rank nranks-1's. */
static int any_rank(int rank, int nranks, void *arg)
{
    const size_t count = (size_t)(uintptr_t)arg; /* uint32 elements */
    const int nmsg = (nranks - 1) * ANY_PER, last = nranks - 1;
    weft_comm *c;
    int fail = 0, rc;
    char what[128];

    if (mp_init(&c, rank, nranks) != WEFT_OK)
        return 1;
    if (rank == 0) {
        weft_request **req = calloc((size_t)nmsg, sizeof *req);
        uint32_t **buf = calloc((size_t)nmsg, sizeof *buf);
        int seen[MP_MAX_RANKS][ANY_PER] = {{0}};

        for (int i = 0; i < nmsg && !fail; i++) {
            buf[i] = mp_alloc(count * 4);
            fail = fail_rc(c, "irecv_tag(ANY_SOURCE, tag 7)",
                           weft_irecv_tag(c, buf[i], count, WEFT_UINT32,
                                          WEFT_ANY_SOURCE, 7, &req[i]));
        }
        if (!fail)
            fail = fail_rc(c, "wait_all(any-source receives)",
                           weft_wait_all(req, (size_t)nmsg));
        for (int i = 0; i < nmsg && !fail; i++) {
            int src = weft_request_source(req[i]);
            int from = (int)buf[i][0] >> 8, k = (int)buf[i][0] & 0xff;

            if (src < 1 || src >= nranks || from != src || k >= ANY_PER ||
                seen[src][k]++) {
                mp_log("any-source receive %d: source %d, message says "
                       "rank %d #%d (or seen twice)",
                       i, src, from, k);
                fail = 1;
                break;
            }
            snprintf(what, sizeof what, "message %d from rank %d", k, src);
            fail = check_msg(what, (unsigned char *)(buf[i] + 1), count * 4 - 4,
                             src, 0, 7, k);
        }
        for (int i = 0; i < nmsg; i++) {
            weft_request_free(req[i]);
            free(buf[i]);
        }
        free(req);
        free(buf);
    } else {
        uint32_t *buf = mp_alloc(count * 4);

        for (int k = 0; k < ANY_PER && !fail; k++) {
            buf[0] = (uint32_t)(rank << 8 | k);
            mp_fill_bytes(buf + 1, count * 4 - 4, msg_seed(rank, 0, 7, k));
            snprintf(what, sizeof what, "isend_tag(tag 7) #%d", k);
            weft_request *r;
            fail = fail_rc(
                c, what, weft_isend_tag(c, buf, count, WEFT_UINT32, 0, 7, &r));
            if (!fail)
                fail = fail_rc(c, what, weft_wait(r));
            weft_request_free(r);
        }
        free(buf);
    }
    /* Mixed: an any-source and a specific receive of one tag. */
    if (!fail && rank == 0) {
        uint64_t a = 0, b = 0, go = 1;
        weft_request *ra, *rb;

        fail = fail_rc(
            c, "irecv_tag(ANY, 5)",
            weft_irecv_tag(c, &a, 1, WEFT_UINT64, WEFT_ANY_SOURCE, 5, &ra));
        if (!fail)
            fail = fail_rc(c, "irecv_tag(last, 5)",
                           weft_irecv_tag(c, &b, 1, WEFT_UINT64, last, 5, &rb));
        if (!fail) {
            fail = fail_rc(c, "wait(any)", weft_wait(ra));
            if (!fail && (a != 1001 || weft_request_source(ra) != 1)) {
                mp_log("any-source: %llu from %d", (unsigned long long)a,
                       weft_request_source(ra));
                fail = 1;
            }
            if (!fail)
                fail = fail_rc(c, "send go",
                               weft_send(c, &go, 1, WEFT_UINT64, last));
            if (!fail)
                fail = fail_rc(c, "wait(specific)", weft_wait(rb));
            if (!fail && (b != 1000u + (uint64_t)last ||
                          weft_request_source(rb) != last)) {
                mp_log("specific: %llu from %d", (unsigned long long)b,
                       weft_request_source(rb));
                fail = 1;
            }
            weft_request_free(rb);
        }
        weft_request_free(ra);
    } else if (!fail && (rank == 1 || rank == last)) {
        uint64_t v = 1000u + (uint64_t)rank, go = 0;

        if (rank == last && rank != 1)
            fail = fail_rc(c, "recv go", weft_recv(c, &go, 1, WEFT_UINT64, 0));
        if (!fail && rank == 1) {
            weft_request *r;

            fail = fail_rc(c, "isend_tag(5)",
                           weft_isend_tag(c, &v, 1, WEFT_UINT64, 0, 5, &r));
            if (!fail)
                fail = fail_rc(c, "wait(isend_tag(5))", weft_wait(r));
            weft_request_free(r);
        }
        if (!fail && rank == last && rank != 1) {
            weft_request *r;

            fail = fail_rc(c, "isend_tag(5)",
                           weft_isend_tag(c, &v, 1, WEFT_UINT64, 0, 5, &r));
            if (!fail)
                fail = fail_rc(c, "wait(isend_tag(5))", weft_wait(r));
            weft_request_free(r);
        }
    }
    if (!fail)
        fail = fail_rc(c, "barrier", weft_barrier(c));
    rc = weft_finalize(c);
    return fail || rc != WEFT_OK;
}

/* ---- bad arguments, a message too large, a dead sender ---- */

static int expect(weft_comm *c, const char *what, int rc, int want)
{
    if (rc == want)
        return 0;
    mp_log("%s: %s, expected %s (%s)", what, weft_err_name(rc),
           weft_err_name(want), weft_last_error(c));
    return 1;
}

/* Bad arguments post nothing and leave the communicator usable; then a
 * message larger than its receive fails that receive with
 * WEFT_EMISMATCH, nothing written past its buffer. */
static int args_rank(int rank, int nranks, void *arg)
{
    weft_comm *c;
    weft_request *r = (weft_request *)&r;
    uint32_t x[4] = {0};
    int fail = 0, peer = 1 - rank;

    (void)arg;
    if (mp_init(&c, rank, nranks) != WEFT_OK)
        return 1;
    fail |=
        expect(c, "negative tag",
               weft_isend_tag(c, x, 1, WEFT_UINT32, peer, -1, &r), WEFT_EINVAL);
    fail |= r != NULL;
    fail |=
        expect(c, "irecv negative tag",
               weft_irecv_tag(c, x, 1, WEFT_UINT32, WEFT_ANY_SOURCE, -3, &r),
               WEFT_EINVAL);
    fail |= expect(c, "isend to ANY_SOURCE",
                   weft_isend_tag(c, x, 1, WEFT_UINT32, WEFT_ANY_SOURCE, 1, &r),
                   WEFT_EINVAL);
    fail |= expect(c, "peer out of range",
                   weft_irecv_tag(c, x, 1, WEFT_UINT32, nranks, 1, &r),
                   WEFT_EINVAL);
    fail |= expect(c, "NULL buffer",
                   weft_irecv_tag(c, NULL, 1, WEFT_UINT32, peer, 1, &r),
                   WEFT_EINVAL);
    fail |= expect(c, "NULL req",
                   weft_irecv_tag(c, x, 1, WEFT_UINT32, peer, 1, NULL),
                   WEFT_EINVAL);
    fail |= weft_request_source(NULL) != -1;
    /* Count 0 completes at once, from nobody. */
    fail |= expect(c, "count 0",
                   weft_irecv_tag(c, x, 0, WEFT_UINT32, WEFT_ANY_SOURCE, 1, &r),
                   WEFT_OK);
    if (r != NULL) {
        fail |= expect(c, "wait(count 0)", weft_wait(r), WEFT_OK);
        fail |= weft_request_source(r) != -1;
        weft_request_free(r);
    }
    /* Still usable: a tagged exchange, the receive pending first. */
    if (!fail && rank == 1) {
        uint32_t go = 1;

        fail |= expect(c, "irecv_tag(9)",
                       weft_irecv_tag(c, x, 2, WEFT_UINT32, 0, 9, &r), WEFT_OK);
        if (!fail) {
            fail |= weft_request_source(r) != -1 && weft_request_source(r) != 0;
            fail |= expect(c, "send go", weft_send(c, &go, 1, WEFT_UINT32, 0),
                           WEFT_OK);
            fail |= expect(c, "wait(irecv_tag(9))", weft_wait(r), WEFT_OK);
            fail |= x[0] != 9 || x[1] != 10 || weft_request_source(r) != 0;
            weft_request_free(r);
        }
    } else if (!fail) {
        uint32_t v[2] = {9, 10};

        fail |=
            expect(c, "recv go", weft_recv(c, x, 1, WEFT_UINT32, 1), WEFT_OK);
        fail |= expect(c, "isend_tag(9)",
                       weft_isend_tag(c, v, 2, WEFT_UINT32, 1, 9, &r), WEFT_OK);
        if (r != NULL) {
            fail |= expect(c, "wait(isend_tag(9))", weft_wait(r), WEFT_OK);
            weft_request_free(r);
        }
    }
    /* Too large: 4 elements sent to a receive of 2. */
    if (!fail && rank == 0) {
        uint32_t v[4] = {1, 2, 3, 4};

        if (weft_isend_tag(c, v, 4, WEFT_UINT32, 1, 3, &r) == WEFT_OK) {
            weft_wait(r); /* OK, or the peer failed first */
            weft_request_free(r);
        }
    } else if (!fail) {
        uint32_t *buf = mp_alloc(8);

        fail |=
            expect(c, "irecv_tag(2 elements, tag 3)",
                   weft_irecv_tag(c, buf, 2, WEFT_UINT32, 0, 3, &r), WEFT_OK);
        if (r != NULL) {
            fail |= expect(c, "wait(message too large)", weft_wait(r),
                           WEFT_EMISMATCH);
            fail |= weft_request_source(r) != -1;
            weft_request_free(r);
        }
        fail |= mp_check_canary("message too large", "recvbuf", buf, 8);
        free(buf);
    }
    weft_finalize(c);
    return fail;
}

/* Rank 1 leaves (without weft_finalize) while rank 0 waits for a tagged
 * message from it and for one from any source: they fail, one with
 * WEFT_EPEER, the rest with WEFT_EPEER or WEFT_EABORTED. */
static int dead_rank(int rank, int nranks, void *arg)
{
    weft_comm *c;
    weft_request *r[2] = {NULL, NULL};
    uint32_t x[2];
    int fail = 0, peer = 0;

    (void)arg;
    if (mp_init(&c, rank, nranks) != WEFT_OK)
        return 1;
    if (rank == 1) {
        fail = fail_rc(c, "barrier", weft_barrier(c));
        _exit(fail);
    }
    fail |=
        expect(c, "irecv_tag(1, tag 4)",
               weft_irecv_tag(c, &x[0], 1, WEFT_UINT32, 1, 4, &r[0]), WEFT_OK);
    fail |= expect(
        c, "irecv_tag(ANY, tag 4)",
        weft_irecv_tag(c, &x[1], 1, WEFT_UINT32, WEFT_ANY_SOURCE, 5, &r[1]),
        WEFT_OK);
    if (!fail)
        fail |= expect(c, "barrier", weft_barrier(c), WEFT_OK);
    for (int i = 0; i < 2 && !fail; i++) {
        int rc = weft_wait(r[i]);

        peer |= rc == WEFT_EPEER;
        if (rc != WEFT_EPEER && rc != WEFT_EABORTED) {
            mp_log("receive %d from a dead rank: %s", i, weft_err_name(rc));
            fail = 1;
        }
    }
    if (!fail && !peer) {
        mp_log("no receive failed with WEFT_EPEER: %s", weft_last_error(c));
        fail = 1;
    }
    weft_request_free(r[0]);
    weft_request_free(r[1]);
    weft_finalize(c);
    return fail;
}

/* Peers that a finished any-source receive was also listening to (its
 * probe read ranks 2..'s streams too, or their relayed messages; rank 1's
 * message ended it) finalize and leave, having sent nothing more: rank
 * 0's later receive from rank 1 must not fail for them (the probe's reads,
 * still posted, are wanted by nobody). */
static int early_leaver_rank(int rank, int nranks, void *arg)
{
    weft_comm *c = NULL;
    weft_request *q = NULL;
    int32_t v = -1, go = 1;
    int rc;

    (void)arg;
    if (nranks < 3 || mp_init(&c, rank, nranks) != WEFT_OK)
        return 1;
    if (rank == 0) {
        rc = weft_irecv_tag(c, &v, 1, WEFT_INT32, WEFT_ANY_SOURCE, 5, &q);
        if (rc == WEFT_OK)
            rc = weft_wait(q);
        if (rc != WEFT_OK || weft_request_source(q) != 1 || v != 1) {
            mp_log("any source: %s, source %d, value %d", weft_strerror(rc),
                   weft_request_source(q), v);
            return 1;
        }
        weft_request_free(q);
        /* Ranks 2.. may go now, one after the other (each answers
         * first: a rank that left forwards no relayed message); rank 1
         * sends once they have. */
        rc = WEFT_OK;
        for (int p = 2; p < nranks && rc == WEFT_OK; p++)
            if ((rc = weft_send(c, &go, 1, WEFT_INT32, p)) == WEFT_OK)
                rc = weft_recv(c, &go, 1, WEFT_INT32, p);
        if (rc == WEFT_OK)
            rc = weft_recv(c, &v, 1, WEFT_INT32, 1);
        if (rc != WEFT_OK || v != 11) {
            mp_log("receive from rank 1 after rank 2 left: %s (%d)",
                   weft_last_error(c), v);
            return 1;
        }
    } else if (rank == 1) {
        v = 1;
        rc = weft_isend_tag(c, &v, 1, WEFT_INT32, 0, 5, &q);
        if (rc == WEFT_OK)
            rc = weft_wait(q);
        weft_request_free(q);
        mp_sleep_ms(500); /* rank 2 has left by then */
        v = 11;
        if (rc == WEFT_OK)
            rc = weft_send(c, &v, 1, WEFT_INT32, 0);
        if (rc != WEFT_OK) {
            mp_log("rank 1: %s", weft_last_error(c));
            return 1;
        }
    } else if ((rc = weft_recv(c, &go, 1, WEFT_INT32, 0)) != WEFT_OK ||
               (rc = weft_send(c, &go, 1, WEFT_INT32, 0)) != WEFT_OK) {
        mp_log("rank 2: %s", weft_last_error(c));
        return 1;
    }
    weft_finalize(c);
    return 0;
}

/* ---- jobs ---- */

enum mode { SHM, TCP, RING };

static void run_job(mp_rank_fn fn, void *arg, int nranks, enum mode m,
                    int timeout_ms)
{
    struct mp_opts o = {
        .nranks = nranks,
        .wires = m == TCP ? 2 : 1,
        .layout = m == RING ? MP_LAYOUT_RING : MP_LAYOUT_ONE_HOST,
        .timeout_ms = timeout_ms,
        .deadline_ms = 60000,
    };
    struct mp_result res;
    char buf[1024];

    /* Messages over 8 KiB split over the wires. */
    setenv("WEFT_MIN_WIRE_BYTES", "8192", 1);
    setenv("WEFT_TRANSPORT", "tcp", 1);
    setenv("WEFT_SHM", m == SHM ? "1" : "0", 1);
    cr_assert_eq(mp_run(&o, fn, arg, &res), 0, "could not set up the job");
    cr_assert(mp_all_passed(&res), "%d ranks: %s", nranks,
              mp_describe(&res, buf, sizeof buf));
}

#define SMALL ((void *)(uintptr_t)33)
#define LARGE ((void *)(uintptr_t)(300000 + 1))

Test(tags, interleaved_shm, .timeout = 60)
{
    run_job(interleave_rank, NULL, 2, SHM, 20000);
}
Test(tags, interleaved_tcp_2wires, .timeout = 60)
{
    run_job(interleave_rank, NULL, 2, TCP, 20000);
}
Test(tags, interleaved_relayed, .timeout = 60)
{
    run_job(interleave_rank, NULL, 4, RING, 20000);
}
Test(tags, any_source_shm, .timeout = 60)
{
    run_job(any_rank, SMALL, 4, SHM, 20000);
}
Test(tags, any_source_tcp_2wires_large, .timeout = 60)
{
    run_job(any_rank, LARGE, 3, TCP, 20000);
}
Test(tags, any_source_relayed, .timeout = 60)
{
    run_job(any_rank, SMALL, 4, RING, 20000);
}
Test(tags, bad_args_and_too_large_shm, .timeout = 60)
{
    run_job(args_rank, NULL, 2, SHM, 10000);
}
Test(tags, bad_args_and_too_large_tcp, .timeout = 60)
{
    run_job(args_rank, NULL, 2, TCP, 10000);
}
Test(tags, dead_sender_tcp, .timeout = 60)
{
    run_job(dead_rank, NULL, 2, TCP, 10000);
}
Test(tags, peer_leaves_after_any_source_shm, .timeout = 60)
{
    run_job(early_leaver_rank, NULL, 3, SHM, 10000);
}
Test(tags, peer_leaves_after_any_source_tcp, .timeout = 60)
{
    run_job(early_leaver_rank, NULL, 3, TCP, 10000);
}
Test(tags, peer_leaves_after_any_source_relayed, .timeout = 60)
{
    run_job(early_leaver_rank, NULL, 4, RING, 10000);
}
Test(tags, dead_sender_shm, .timeout = 60)
{
    run_job(dead_rank, NULL, 2, SHM, 10000);
}
