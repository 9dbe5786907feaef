/*
 * The collective cases (coll_cases.h) for 2..4 ranks, 1..3 wires and each
 * topology.
 *
 * One multi-process job per (topology, ranks, wires) loops over all the
 * cases inside the ranks, so the cost of starting ranks is paid 27 times,
 * not once per case.
 */
#define _GNU_SOURCE
#include <criterion/criterion.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "coll_cases.h"
#include "harness.h"
#include "weft.h"

static int coll_rank(int rank, int nranks, void *arg)
{
    (void)arg;
    struct coll_ctx x = {.rank = rank, .nranks = nranks};
    if (mp_init(&x.c, rank, nranks) != WEFT_OK)
        return 1;
    double t0 = mp_now_ms();
    int fail = coll_run_cases(&x);
    if (!fail && rank == 0)
        mp_log("%lu cases passed in %.0f ms", x.ncases, mp_now_ms() - t0);
    int rc = weft_finalize(x.c);
    if (rc != WEFT_OK) {
        mp_log("weft_finalize returned %s", weft_err_name(rc));
        fail = 1;
    }
    return fail;
}

/* Rows that a job forces besides the low thresholds' (mp_low_algo): into
 * all_reduce's after the box's, and other operations' ("all_gather:...;
 * ..."); NULL: none. */
static const char *algo_first, *algo_more;

/* small: all_reduce's one-exchange gather up to this many bytes in all
 * (count * size * nranks) around the ring and among one host's ranks. */
static void run_job_layout(int nranks, int wires, const char *topology,
                           size_t small, enum mp_layout layout)
{
    const char *shm;
    char algo[1024];

    /* Ranks of one host use shared memory, one wire per peer whatever
     * WEFT_WIRES says; several wires are TCP's (shared memory off). */
    if (wires > 1)
        setenv("WEFT_SHM", "0", 1);
    shm = getenv("WEFT_SHM");
    /* Keep an outer setting; otherwise small frames keep the test fast. */
    setenv("WEFT_FRAME_BYTES", "65536", 0);
    /* Low thresholds, so that these modest counts run every path: several
     * wires per step, both ring directions, and all_reduce both through the
     * small (gather) path and the large one (reduce-scatter + all-gather,
     * around the ring or direct in the mesh). */
    setenv("WEFT_MIN_WIRE_BYTES", "8192", 0);
    setenv("WEFT_BIDIR_MIN_BYTES", "16384", 0);
    cr_assert_eq(mp_low_algo(algo, sizeof algo, nranks, layout, topology,
                             shm == NULL || strcmp(shm, "0") != 0, small,
                             algo_first),
                 0);
    if (algo_more != NULL)
        snprintf(algo + strlen(algo), sizeof algo - strlen(algo), ";%s",
                 algo_more);
    /* The rows fit this job's layout alone, so an outer WEFT_ALGO goes. */
    setenv("WEFT_ALGO", algo, 1);
    setenv("WEFT_TOPOLOGY", topology, 1);
    struct mp_opts o = {
        .nranks = nranks,
        .layout = layout,
        .wires = wires,
        .timeout_ms = 30000,
        .deadline_ms = 100000,
    };
    struct mp_result res;
    char buf[1024];
    cr_assert_eq(mp_run(&o, coll_rank, NULL, &res), 0,
                 "could not set up the job");
    cr_assert(mp_all_passed(&res), "%s, %d ranks, %d wires, WEFT_ALGO %s: %s",
              topology, nranks, wires, algo,
              mp_describe(&res, buf, sizeof buf));
}

static void run_job_small(int nranks, int wires, const char *topology,
                          size_t small)
{
    run_job_layout(nranks, wires, topology, small, MP_LAYOUT_ONE_HOST);
}

static void run_job(int nranks, int wires, const char *topology)
{
    run_job_small(nranks, wires, topology, 4096);
}

/* Shared memory with a ring so small that records wrap and frames go in
 * pieces, and with every frame read in one copy from the sender (or, where
 * the kernel refuses that, through the ring). */
static void run_shm_job(int nranks, const char *topology, const char *ring,
                        const char *cma)
{
    setenv("WEFT_SHM", "1", 1);
    setenv("WEFT_SHM_RING_BYTES", ring, 1);
    setenv("WEFT_SHM_CMA_BYTES", cma, 1);
    run_job(nranks, 1, topology);
}

/* Every collective that can by one-copy reads of the peers' memory
 * (coll/pull.c), whatever its size (from 1 byte; the box keeps its small
 * calls), on 2 threads per rank (the path is off by default where the
 * host has one core per rank). */
static void run_pull_job(int nranks, const char *topology)
{
    char more[256];

    /* The box's rows as by default: 2 KiB (a reduce_scatter's whole
     * input) up to 8 ranks. */
    snprintf(more, sizeof more,
             "all_gather:0-2k=box,1-=pull;reduce_scatter:0-%d=box,1-=pull;"
             "broadcast:0-2k=box,1-=pull",
             2048 / nranks);
    algo_first = "1-=pull";
    algo_more = more;
    setenv("WEFT_PULL_THREADS", "2", 1);
    run_shm_job(nranks, topology, "8192", "1");
    unsetenv("WEFT_PULL_THREADS");
    algo_first = algo_more = NULL;
}

Test(collectives, shm_one_copy_reads_mesh_ranks3, .timeout = 120)
{
    run_pull_job(3, "mesh");
}

Test(collectives, shm_one_copy_reads_auto_ranks4, .timeout = 120)
{
    run_pull_job(4, "auto");
}

#define SHM_TEST(n, topo)                                                      \
    Test(collectives, shm_tiny_ring_##topo##_ranks##n, .timeout = 120)         \
    {                                                                          \
        run_shm_job(n, #topo, "4096", "0");                                    \
    }                                                                          \
    Test(collectives, shm_one_copy_##topo##_ranks##n, .timeout = 120)          \
    {                                                                          \
        run_shm_job(n, #topo, "8192", "1");                                    \
    }

/* Hosts of two ranks each (over shared memory, or loopback with several
 * wires), linked to each other: all_reduce runs hierarchically from count
 * nranks on (its rows from 0 bytes), within the hosts and across them
 * with the mesh (auto) or the ring; all_gather and reduce_scatter from
 * blocks of `blk` bytes, and broadcast (the ring's chain across the mesh)
 * from buffers of `blk` bytes (0: every count; 4096: the counts around
 * the frame run hierarchically, the small ones flat). */
static void run_hier_job(int nranks, const char *topology, int wires,
                         const char *blk)
{
    char more[256];

    /* (Around the ring, broadcast is the ring's chain at every size.) */
    snprintf(more, sizeof more,
             "all_gather:%s-=hier;reduce_scatter:%s-=hier%s%s%s", blk, blk,
             strcmp(topology, "ring") != 0 ? ";broadcast:" : "",
             strcmp(topology, "ring") != 0 ? blk : "",
             strcmp(topology, "ring") != 0 ? "-=ring" : "");
    algo_first = "0-=hier";
    algo_more = more;
    run_job_layout(nranks, wires, topology, 4096, MP_LAYOUT_PAIRS);
    algo_first = algo_more = NULL;
}

#define HIER_TEST(n, topo, w, blk)                                             \
    Test(collectives, hier_##topo##_ranks##n##_wires##w##_from##blk,           \
         .timeout = 120)                                                       \
    {                                                                          \
        run_hier_job(n, #topo, w, #blk);                                       \
    }

HIER_TEST(4, auto, 1, 0)
HIER_TEST(4, ring, 2, 4096)
HIER_TEST(6, auto, 1, 4096)
HIER_TEST(6, ring, 1, 0)

/* The same with the wires between the hosts TCP's, every batch written by
 * its sending thread (shared memory within the hosts hands the TCP
 * transport its posts and waits on its events). */
Test(collectives, hier_auto_ranks4_wires1_send_thread, .timeout = 120)
{
    setenv("WEFT_SEND_THREAD", "1", 1);
    setenv("WEFT_SEND_THREAD_MIN_BYTES", "1", 1);
    run_hier_job(4, "auto", 1, "0");
}

SHM_TEST(3, ring)
SHM_TEST(3, mesh)
SHM_TEST(4, auto)

/* Every case under each topology: on one host every pair of ranks is
 * joined, so "mesh" runs the direct and mesh algorithms, "ring" the ring
 * ones, and "auto" the direct ones: recursive doubling (2 and 4 ranks) or
 * one exchange (3 ranks) for small all_reduces, recursive halving +
 * doubling for the mid sizes from 4 ranks, the ring for 2 and 3 ranks
 * and past the mid sizes. */
#define COLL_TEST(n, w)                                                        \
    Test(collectives, ring_ranks##n##_wires##w, .timeout = 120)                \
    {                                                                          \
        run_job(n, w, "ring");                                                 \
    }                                                                          \
    Test(collectives, mesh_ranks##n##_wires##w, .timeout = 120)                \
    {                                                                          \
        run_job(n, w, "mesh");                                                 \
    }                                                                          \
    Test(collectives, auto_ranks##n##_wires##w, .timeout = 120)                \
    {                                                                          \
        run_job(n, w, "auto");                                                 \
    }

COLL_TEST(2, 1)
COLL_TEST(2, 2)
COLL_TEST(2, 3)
COLL_TEST(3, 1)
COLL_TEST(3, 2)
COLL_TEST(3, 3)
COLL_TEST(4, 1)
COLL_TEST(4, 2)
COLL_TEST(4, 3)

/* Received frames reduced each way: inline (WEFT_REDUCE_THREAD=0), and
 * every reduced frame, down to the short last frame of a region, on the
 * reducer thread (WEFT_REDUCE_THREAD_MIN_BYTES=1), whatever the host's
 * cores. The jobs above run the default: inline where the host has fewer
 * than two cores per rank, else whole frames on the thread and short ones
 * inline unless an earlier frame of their wire is still with it. */
static void run_reducer_job(int nranks, int wires, const char *thread,
                            const char *min_bytes)
{
    setenv("WEFT_REDUCE_THREAD", thread, 1);
    setenv("WEFT_REDUCE_THREAD_MIN_BYTES", min_bytes, 1);
    run_job(nranks, wires, "ring");
}

Test(collectives, ring_reduce_inline_ranks3_wires2, .timeout = 120)
{
    run_reducer_job(3, 2, "0", "65536");
}

Test(collectives, ring_reducer_whole_frames_ranks3_wires1, .timeout = 120)
{
    run_reducer_job(3, 1, "1", "65536");
}

Test(collectives, ring_reducer_every_frame_ranks2_wires1, .timeout = 120)
{
    run_reducer_job(2, 1, "1", "1");
}

Test(collectives, ring_reducer_every_frame_ranks4_wires3, .timeout = 120)
{
    run_reducer_job(4, 3, "1", "1");
}

/* Sends written by TCP's sending thread (WEFT_SEND_THREAD=1, whatever
 * the host's cores): every batch from 1 byte on (min "1"), or batches of
 * 8 KiB and more only, so that a wire's small batches leave from
 * progress() between the thread's and must still leave in order; with
 * the reducer thread on and off. One host's ranks over loopback TCP. */
static void run_send_thread_job(int nranks, int wires, const char *topology,
                                const char *min_bytes, const char *reducer)
{
    setenv("WEFT_TRANSPORT", "tcp", 1);
    setenv("WEFT_SHM", "0", 1);
    setenv("WEFT_SEND_THREAD", "1", 1);
    setenv("WEFT_SEND_THREAD_MIN_BYTES", min_bytes, 1);
    setenv("WEFT_REDUCE_THREAD", reducer, 1);
    setenv("WEFT_REDUCE_THREAD_MIN_BYTES", "1", 1);
    run_job(nranks, wires, topology);
}

Test(collectives, send_thread_every_batch_ring_ranks3_wires2, .timeout = 120)
{
    run_send_thread_job(3, 2, "ring", "1", "1");
}

Test(collectives, send_thread_every_batch_mesh_ranks4_wires1, .timeout = 120)
{
    run_send_thread_job(4, 1, "mesh", "1", "0");
}

Test(collectives, send_thread_large_batches_auto_ranks4_wires3, .timeout = 120)
{
    run_send_thread_job(4, 3, "auto", "8192", "1");
}

/* Only the passes that send 64 KiB or more (WEFT_SEND_THREAD_PASS_BYTES)
 * hand their batches to the thread: the cases' calls of about a frame
 * leave from progress(), those of three frames from the thread, one after
 * the other on the same wires, which must keep their order. */
Test(collectives, send_thread_large_passes_ring_ranks3_wires2, .timeout = 120)
{
    setenv("WEFT_SEND_THREAD_PASS_BYTES", "65536", 1);
    run_send_thread_job(3, 2, "ring", "1", "1");
}

/* ---- short sends ----
 *
 * A send on a non-blocking socket may take fewer bytes than it was given
 * (the kernel takes what its buffer has room for). This test binary's
 * sendmsg, which libweft's reaches instead of libc's (the program's own
 * definition comes first), makes every other non-blocking sendmsg of more
 * than 4 KiB take half its bytes while short_sends is set (in the ranks
 * of the tests below only): the TCP transport's first write of a batch
 * (tcp/data.c, try_send) is then often short, libuv writes the rest at
 * once, and runs that write's callback only in the loop's next turn. A
 * later batch of the wire must still not complete before it: the engine
 * asserts that a wire's sends complete in post order (send_done), which
 * failed here, as on the 16-core host with the reducer thread, while the
 * transport sent a later batch whole while an earlier one waited for its
 * callback. */
static volatile int short_sends;

ssize_t sendmsg(int fd, const struct msghdr *m, int flags)
{
    static unsigned long calls;
    struct msghdr c;
    struct iovec v[64];
    size_t total = 0, want, acc = 0;
    size_t n = 0;

    for (size_t i = 0; i < m->msg_iovlen; i++)
        total += m->msg_iov[i].iov_len;
    if (!short_sends || !(flags & MSG_DONTWAIT) || total <= 4096 ||
        m->msg_iovlen > 64 || (calls++ & 1) == 0)
        return syscall(SYS_sendmsg, fd, m, flags);
    want = total / 2;
    for (size_t i = 0; i < m->msg_iovlen && acc < want; i++) {
        v[n] = m->msg_iov[i];
        if (acc + v[n].iov_len > want)
            v[n].iov_len = want - acc;
        acc += v[n].iov_len;
        n++;
    }
    c = *m;
    c.msg_iov = v;
    c.msg_iovlen = n;
    return syscall(SYS_sendmsg, fd, &c, flags);
}

/* Large all_reduces, each element checked. */
static int short_sends_rank(int rank, int nranks, void *arg)
{
    const size_t count = (size_t)1 << 20; /* 4 MiB of int32 */
    int32_t *buf = mp_alloc(count * sizeof *buf);
    weft_comm *c;
    int fail = 0, rc;

    (void)arg;
    short_sends = 1;
    if (mp_init(&c, rank, nranks) != WEFT_OK)
        return 1;
    for (int it = 0; it < 8 && !fail; it++) {
        for (size_t i = 0; i < count; i++)
            buf[i] =
                (int32_t)((i * 7 + (size_t)rank * 13 + (size_t)it) & 0xffff);
        rc = weft_all_reduce(c, buf, buf, count, WEFT_INT32, WEFT_SUM);
        if (rc != WEFT_OK) {
            fail = mp_report_rc(c, "all_reduce(sum, int32, 1M, in place)", rc);
            break;
        }
        for (size_t i = 0; i < count && !fail; i++) {
            int64_t want = 0;

            for (int r = 0; r < nranks; r++)
                want +=
                    (int64_t)((i * 7 + (size_t)r * 13 + (size_t)it) & 0xffff);
            if (buf[i] != (int32_t)want) {
                mp_log("iteration %d: element %zu is %d, not %lld", it, i,
                       (int)buf[i], (long long)want);
                fail = 1;
            }
        }
    }
    if (mp_check_canary("all_reduce", "buf", buf, count * sizeof *buf) != 0)
        fail = 1;
    free(buf);
    rc = weft_finalize(c);
    if (rc != WEFT_OK) {
        mp_log("weft_finalize returned %s", weft_err_name(rc));
        fail = 1;
    }
    return fail;
}

static void run_short_sends_job(int nranks, int wires, const char *thread)
{
    setenv("WEFT_FRAME_BYTES", "65536", 1);
    setenv("WEFT_TOPOLOGY", "ring", 1);
    setenv("WEFT_REDUCE_THREAD", thread, 1);
    setenv("WEFT_REDUCE_THREAD_MIN_BYTES", "1", 1);
    struct mp_opts o = {
        .nranks = nranks,
        .wires = wires,
        .timeout_ms = 30000,
        .deadline_ms = 100000,
    };
    struct mp_result res;
    char buf[1024];
    cr_assert_eq(mp_run(&o, short_sends_rank, NULL, &res), 0,
                 "could not set up the job");
    cr_assert(mp_all_passed(&res),
              "short sends, %d ranks, %d wires, "
              "WEFT_REDUCE_THREAD=%s: %s",
              nranks, wires, thread, mp_describe(&res, buf, sizeof buf));
}

Test(collectives, short_sends_reducer_ranks2_wires1, .timeout = 120)
{
    run_short_sends_job(2, 1, "1");
}

Test(collectives, short_sends_reducer_ranks4_wires3, .timeout = 120)
{
    run_short_sends_job(4, 3, "1");
}

Test(collectives, short_sends_inline_ranks3_wires3, .timeout = 120)
{
    run_short_sends_job(3, 3, "0");
}

/* The sending thread's writes are as often short: it writes the rest
 * itself, in order, before the wire's next batch. */
Test(collectives, short_sends_send_thread_ranks3_wires2, .timeout = 120)
{
    setenv("WEFT_TRANSPORT", "tcp", 1);
    setenv("WEFT_SEND_THREAD", "1", 1);
    setenv("WEFT_SEND_THREAD_MIN_BYTES", "1", 1);
    run_short_sends_job(3, 2, "1");
}

/* Recursive halving + doubling where "auto" picks it, at rank counts that
 * are not powers of two (one rank folded into its neighbour, two, three)
 * and at 8 (three rounds each way); over shared memory, and at 6 ranks
 * over TCP (two wires). The 7-rank job takes no small path, so every
 * all_reduce of at least 7 elements runs it, down to chunks of one
 * element (and 1 element falls to the ring). */
Test(collectives, auto_ranks5_wires1, .timeout = 120)
{
    run_job(5, 1, "auto");
}
Test(collectives, auto_ranks6_wires2, .timeout = 120)
{
    run_job(6, 2, "auto");
}
Test(collectives, auto_ranks7_wires1_no_small, .timeout = 120)
{
    run_job_small(7, 1, "auto", 0);
}
Test(collectives, auto_ranks8_wires1, .timeout = 120)
{
    run_job(8, 1, "auto");
}
