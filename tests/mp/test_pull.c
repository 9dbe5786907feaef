/*
 * The all_reduce by one-copy reads (WEFT_ALGO's "pull", from 4 MiB by
 * default where the host has 2 cores per rank): where every rank is on
 * one host and can read the others' memory, each rank reads its share of
 * every input from its peers and reduces it, then reads the other shares
 * from their owners, on WEFT_PULL_THREADS threads. As a user sees it:
 * the same results as any other path, in every dtype and op, in place and
 * not, around the sizes where its parts split; the same bits on every
 * rank, those of a left-to-right sum over the ranks; calls that differ are
 * WEFT_EMISMATCH; a peer that dies is WEFT_EPEER on the others, promptly;
 * weft_abort ends it; posted calls on one buffer run in order; its threads
 * start with its first call (that is how this test knows the path ran) and
 * are gone after weft_finalize; where a rank's memory cannot be read, no
 * rank takes this path and results are still right. Where hosts run
 * several ranks, the hierarchical all_reduce reads within each host the
 * same way (its phases across the hosts over TCP): right results, its
 * threads, and a peer killed mid-loop; so do the hierarchical all_gather
 * and reduce_scatter (every shape of buffers, the threads they add, a
 * peer killed mid-loop).
 *
 * The thresholds are lowered here, through WEFT_ALGO (the 2-core CI
 * machine has one core per rank, where the path is off unless
 * WEFT_PULL_THREADS asks for it).
 */
#define _GNU_SOURCE
#include <criterion/criterion.h>
#include <errno.h>
#include <linux/capability.h>
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "harness.h"
#include "weft.h"

#define TIMEOUT_MS 30000
#define PROMPT_MS 10000
#define THREADS 3
/* The path from 4 KiB per rank, so small counts take it too. */
#define PULL_FROM "4096"

struct pull_shm {
    int rc[MP_MAX_RANKS];
    char msg[MP_MAX_RANKS][256];
    int threads_added[MP_MAX_RANKS];
    int threads_left[MP_MAX_RANKS];
    uint64_t digest[MP_MAX_RANKS];
};

static struct pull_shm *shm(void)
{
    return mp_shm();
}

/* The ranks' hostfile: one host, or hosts of two ranks (hier_env). */
static enum mp_layout layout = MP_LAYOUT_ONE_HOST;

/* What WEFT_ALGO asks for besides all_reduce's rows (set_algo). */
enum {
    ALGO_ALL_REDUCE, /* the all_reduce only */
    ALGO_EVERY_OP,   /* all_gather, reduce_scatter and broadcast too: on
                        one host by the reads, on hosts of several ranks
                        (all_gather, reduce_scatter) hierarchically */
    ALGO_DEFAULTS,   /* none: the defaults */
};
static int algo_ops = ALGO_ALL_REDUCE;

/* Sets WEFT_ALGO for a job of nranks (2 to 4 on one host, 4 or 6 on hosts
 * of two): the default rows (weft_info's, src/core/tune.c) but on one host
 * the reads from PULL_FROM bytes per rank (the default's 4 MiB for
 * all_reduce and all_gather, 1 MiB for reduce_scatter, 32 MiB for
 * broadcast), so that small counts take them too, and on hosts of two
 * ranks the hierarchical all_reduce at every size (count >= ranks; the
 * default's gather of up to 128 KiB gathered below that), and with
 * ALGO_EVERY_OP its all_gather and reduce_scatter too. */
static void set_algo(int nranks)
{
    /* all_reduce's rows past the box (one host) or past the hierarchical
     * row (hosts of two), as the defaults have them. */
    static const char *const one_host[] = {
        [2] = "0-16k=doubling,0-16k=gather",
        [3] = "0-10922=gather",
        [4] = "0-16k=doubling,0-8k=gather,0-8m=halving",
    };
    char algo[512];

    if (algo_ops == ALGO_DEFAULTS) {
        unsetenv("WEFT_ALGO");
        return;
    }
    if (layout == MP_LAYOUT_PAIRS) {
        cr_assert(nranks == 4 || nranks == 6);
        snprintf(algo, sizeof algo, "all_reduce:0-=hier,0-%s=gather,0-=mesh%s",
                 nranks == 4 ? "32k" : "21845",
                 algo_ops == ALGO_EVERY_OP
                     ? ";all_gather:0-=hier;reduce_scatter:0-=hier"
                     : "");
    } else {
        cr_assert(nranks >= 2 && nranks <= 4);
        snprintf(algo, sizeof algo,
                 "all_reduce:0-2k=box," PULL_FROM "-=pull,%s,0-=ring",
                 one_host[nranks]);
        if (algo_ops == ALGO_EVERY_OP)
            snprintf(algo + strlen(algo), sizeof algo - strlen(algo),
                     ";all_gather:0-2k=box," PULL_FROM "-=pull"
                     ";reduce_scatter:0-%d=box," PULL_FROM "-=pull"
                     ";broadcast:0-2k=box," PULL_FROM "-=pull",
                     2048 / nranks);
    }
    setenv("WEFT_ALGO", algo, 1);
}

/* Hosts of two ranks each, whose all_reduce runs hierarchically at every
 * size (count >= ranks; set_algo) with no TCP sending thread
 * (threads_rank counts threads). */
static void hier_env(void)
{
    layout = MP_LAYOUT_PAIRS;
    setenv("WEFT_HIER_PULL_ALL_REDUCE_BYTES", PULL_FROM, 1);
    setenv("WEFT_SEND_THREAD", "0", 1);
}

static void run_job_env(int nranks, mp_rank_fn fn, void *arg,
                        const char *threads, const char *what)
{
    struct mp_opts o = {
        .nranks = nranks, .timeout_ms = TIMEOUT_MS, .layout = layout};
    struct mp_result res;
    char buf[1024];

    setenv("WEFT_SHM", "1", 1);
    set_algo(nranks);
    setenv("WEFT_PULL_THREADS", threads, 1);
    /* No reducer thread on the frames' path either: threads_rank counts
     * threads. */
    setenv("WEFT_REDUCE_THREAD", "0", 1);
    cr_assert_eq(mp_run(&o, fn, arg, &res), 0);
    unsetenv("WEFT_ALGO");
    unsetenv("WEFT_PULL_THREADS");
    unsetenv("WEFT_REDUCE_THREAD");
    cr_assert(mp_all_passed(&res), "%s: %s", what,
              mp_describe(&res, buf, sizeof buf));
}

static void run_job(int nranks, mp_rank_fn fn, void *arg, const char *what)
{
    run_job_env(nranks, fn, arg, "3", what);
}

/* ---- results ---- */

static const weft_dtype dtypes[] = {WEFT_INT8,    WEFT_UINT8,   WEFT_INT32,
                                    WEFT_UINT32,  WEFT_INT64,   WEFT_UINT64,
                                    WEFT_FLOAT32, WEFT_FLOAT64, WEFT_BFLOAT16};
static const weft_redop ops[] = {WEFT_SUM, WEFT_PROD, WEFT_MIN, WEFT_MAX};

/* Every dtype and op, in place and not, at the threshold (shares of a few
 * hundred bytes) and at counts whose shares span several parts of both
 * phases, none a multiple of the ranks. */
static int results_rank(int rank, int nranks, void *arg)
{
    weft_comm *c;
    int fail = 0;

    (void)arg;
    if (mp_init(&c, rank, nranks) != WEFT_OK)
        return 1;
    for (size_t d = 0; d < sizeof dtypes / sizeof dtypes[0] && !fail; d++) {
        const size_t es = weft_dtype_size(dtypes[d]);
        const size_t counts[] = {4096 / es, 4096 / es + 1, (3 << 20) / es + 7};

        for (size_t o = 0; o < sizeof ops / sizeof ops[0] && !fail; o++)
            for (size_t k = 0; k < sizeof counts / sizeof counts[0] && !fail;
                 k++)
                fail = mp_small_all_reduce(c, dtypes[d], ops[o], counts[k],
                                           (int)((k + o) & 1), rank, nranks);
    }
    return weft_finalize(c) != WEFT_OK || fail;
}

Test(pull, results_in_every_dtype_and_op, .timeout = 300)
{
    for (int n = 2; n <= 4; n++)
        run_job(n, results_rank, NULL, "pull results");
}

/* Float32 inputs that no order of addition sums alike: every rank must
 * end with the bits of ((x0 + x1) + x2) + ... in rank order. */
static int bits_rank(int rank, int nranks, void *arg)
{
    const size_t n = (5 << 20) / sizeof(float) + 3;
    float *v = mp_alloc(n * sizeof *v);
    float *want = mp_alloc(n * sizeof *want);
    weft_comm *c;
    int rc, fail = 0;

    (void)arg;
    if (mp_init(&c, rank, nranks) != WEFT_OK)
        return 1;
    for (size_t i = 0; i < n; i++) {
        for (int r = 0; r < nranks; r++) {
            uint64_t h = mp_hash64((uint64_t)r << 40 ^ i);
            float x = (float)((double)(h >> 11) / (double)(1ull << 53) *
                              (h & 1 ? 1e4 : 1e-3));
            if (r == rank)
                v[i] = x;
            want[i] = r == 0 ? x : want[i] + x;
        }
    }
    rc = weft_all_reduce(c, v, v, n, WEFT_FLOAT32, WEFT_SUM);
    if (rc != WEFT_OK)
        fail = mp_report_rc(c, "all_reduce", rc);
    else {
        size_t at = mp_first_diff(v, want, n, sizeof *v);
        if (at < n) {
            mp_log("element %zu is %.9g where rank order gives %.9g", at,
                   (double)v[at], (double)want[at]);
            fail = 1;
        }
        shm()->digest[rank] = mp_fnv1a(v, n * sizeof *v);
    }
    free(v);
    free(want);
    return weft_finalize(c) != WEFT_OK || fail;
}

Test(pull, every_rank_ends_with_the_same_bits, .timeout = 120)
{
    run_job(3, bits_rank, NULL, "same bits");
    for (int r = 1; r < 3; r++)
        cr_assert_eq(shm()->digest[r], shm()->digest[0],
                     "rank %d's result differs from rank 0's", r);
}

/* ---- its threads ---- */

/* The threads a large all_reduce adds (its pool: THREADS - 1 helpers),
 * and those left after weft_finalize; then a second communicator in the
 * same process does it again. *arg: 0, every rank readable; 1, rank 0
 * not, and no rank takes the path; 2, rank 0 not in hosts of two ranks,
 * and only the ranks of the other hosts take it. */
static int threads_rank(int rank, int nranks, void *arg)
{
    const int refused = *(const int *)arg;
    const int expect =
        refused == 0 || (refused == 2 && rank >= 2) ? THREADS - 1 : 0;
    const size_t n = (1 << 20) + 5;
    float *v = mp_alloc(n * sizeof *v);
    int before, after_small, fail = 0;

    if (refused) {
        struct __user_cap_header_struct h = {.version =
                                                 _LINUX_CAPABILITY_VERSION_3};
        struct __user_cap_data_struct d[2];

        /* Not dumpable, without CAP_SYS_PTRACE: no peer can read this
         * rank (test_shm's one_copy_refused_goes_through_the_ring). */
        if (rank == 0 && (syscall(SYS_capget, &h, d) != 0 ||
                          (d[CAP_TO_INDEX(CAP_SYS_PTRACE)].effective &=
                           ~CAP_TO_MASK(CAP_SYS_PTRACE),
                           d[CAP_TO_INDEX(CAP_SYS_PTRACE)].permitted &=
                           ~CAP_TO_MASK(CAP_SYS_PTRACE),
                           syscall(SYS_capset, &h, d) != 0) ||
                          prctl(PR_SET_DUMPABLE, 0, 0, 0, 0) != 0)) {
            mp_log("cannot drop CAP_SYS_PTRACE");
            return 1;
        }
    }
    before = mp_threads();
    for (int round = 0; round < 2 && !fail; round++) {
        weft_comm *c;
        float small[2] = {1, 2};
        int rc;

        if (mp_init(&c, rank, nranks) != WEFT_OK)
            return 1;
        if ((rc = weft_all_reduce(c, small, small, 2, WEFT_FLOAT32,
                                  WEFT_SUM)) != WEFT_OK)
            return mp_report_rc(c, "small all_reduce", rc);
        after_small = mp_threads();
        for (size_t i = 0; i < n; i++)
            v[i] = (float)(rank + (int)(i % 1000));
        if ((rc = weft_all_reduce(c, v, v, n, WEFT_FLOAT32, WEFT_SUM)) !=
            WEFT_OK)
            return mp_report_rc(c, "all_reduce", rc);
        for (size_t i = 0; i < n; i++)
            if (v[i] !=
                (float)(nranks * (nranks - 1) / 2 + nranks * (int)(i % 1000))) {
                mp_log("element %zu is %g", i, (double)v[i]);
                fail = 1;
                break;
            }
        shm()->threads_added[rank] = mp_threads() - after_small;
        if (weft_finalize(c) != WEFT_OK)
            fail = 1;
        shm()->threads_left[rank] = mp_threads_settle(before, 1000) - before;
        if (shm()->threads_added[rank] != expect ||
            shm()->threads_left[rank] != 0) {
            mp_log("round %d: the large all_reduce added %d threads (%d "
                   "expected), %d more than before weft_init after "
                   "weft_finalize",
                   round, shm()->threads_added[rank], expect,
                   shm()->threads_left[rank]);
            fail = 1;
        }
    }
    free(v);
    return fail;
}

Test(pull, its_threads_start_with_it_and_leave_at_finalize, .timeout = 120)
{
    static const int readable = 0;

    run_job(2, threads_rank, (void *)&readable, "threads, 2 ranks");
    run_job(3, threads_rank, (void *)&readable, "threads, 3 ranks");
}

Test(pull, where_a_rank_cannot_be_read_no_rank_takes_it, .timeout = 120)
{
    static const int refused = 1;

    /* The defaults: WEFT_ALGO cannot ask for reads that not every rank
     * can make, and the large call (4 MiB and more) is where the default
     * rows would read. */
    algo_ops = ALGO_DEFAULTS;
    run_job(3, threads_rank, (void *)&refused, "rank 0 unreadable");
}

Test(pull, results_on_the_callers_thread_alone, .timeout = 300)
{
    /* WEFT_PULL_THREADS=1: no helper, every part on the caller's thread. */
    run_job_env(3, results_rank, NULL, "1", "pull results, 1 thread");
}

/* ---- calls that differ ---- */

enum { MIS_COUNT, MIS_OP, MIS_BELOW, MIS_CHOICE };

/* Rank 0's call differs from the others': one element more, another op,
 * or a count below the threshold (the others' above it). No rank may
 * return WEFT_OK; one that sees the difference says WEFT_EMISMATCH and
 * what differed, and a peer that it left before they met may see it gone
 * (WEFT_EPEER), as on every path where headers travel in frames. Or the
 * calls would be the same but rank 0 has the path off (its WEFT_ALGO
 * without the reads' row): every rank's weft_init fails, WEFT_ECONFIG
 * naming the tables. */
static int mismatch_rank(int rank, int nranks, void *arg)
{
    const int kind = *(const int *)arg;
    size_t n = (1 << 18) + 1;
    weft_redop op = WEFT_SUM;
    float *v;
    weft_comm *c;
    int rc;

    if (rank == 0) {
        if (kind == MIS_COUNT)
            n++;
        else if (kind == MIS_OP)
            op = WEFT_MAX;
        else if (kind == MIS_BELOW)
            n = 100;
        else /* 3 ranks: set_algo's rows but the reads' */
            setenv("WEFT_ALGO", "all_reduce:0-2k=box,0-10922=gather,0-=ring",
                   1);
    }
    v = mp_alloc(n * sizeof *v);
    for (size_t i = 0; i < n; i++)
        v[i] = 1;
    if ((rc = mp_init(&c, rank, nranks)) != WEFT_OK) {
        /* Tables that differ are found as the communicator is made. */
        shm()->rc[rank] = rc;
        snprintf(shm()->msg[rank], sizeof shm()->msg[rank], "%s",
                 weft_last_error(NULL));
        free(v);
        return 0;
    }
    rc = weft_all_reduce(c, v, v, n, WEFT_FLOAT32, op);
    shm()->rc[rank] = rc;
    snprintf(shm()->msg[rank], sizeof shm()->msg[rank], "%s",
             rc == WEFT_OK ? "" : weft_last_error(c));
    free(v);
    return weft_finalize(c) != WEFT_OK;
}

Test(pull, calls_that_differ_are_emismatch, .timeout = 120)
{
    static const int kinds[] = {MIS_COUNT, MIS_OP, MIS_BELOW, MIS_CHOICE};

    for (size_t i = 0; i < sizeof kinds / sizeof kinds[0]; i++) {
        const char *says = "called";
        int saw = 0;

        run_job(3, mismatch_rank, (void *)&kinds[i], "mismatch");
        for (int r = 0; r < 3 && kinds[i] == MIS_CHOICE; r++)
            cr_assert(shm()->rc[r] == WEFT_ECONFIG &&
                          strstr(shm()->msg[r], "tuning tables") != NULL,
                      "rank %d: %s (%s), expected WEFT_ECONFIG naming the "
                      "tuning tables",
                      r, weft_err_name(shm()->rc[r]), shm()->msg[r]);
        if (kinds[i] == MIS_CHOICE)
            continue;
        for (int r = 0; r < 3; r++) {
            const int rc = shm()->rc[r];

            cr_assert(rc == WEFT_EMISMATCH || rc == WEFT_EPEER,
                      "case %d: rank %d returned %s (%s)", kinds[i], r,
                      weft_err_name(rc), shm()->msg[r]);
            if (rc == WEFT_EMISMATCH) {
                cr_assert(strstr(shm()->msg[r], says) != NULL,
                          "case %d: rank %d's message does not say what "
                          "differed: %s",
                          kinds[i], r, shm()->msg[r]);
                saw++;
            }
        }
        cr_assert(saw > 0, "case %d: no rank saw WEFT_EMISMATCH", kinds[i]);
    }
}

/* ---- a peer that dies, weft_abort ---- */

struct killer {
    weft_comm *c;
    int ms;
    int abort; /* weft_abort, else SIGKILL this process */
};

static void *act_later(void *arg)
{
    const struct killer *k = arg;

    mp_sleep_ms(k->ms);
    if (k->abort)
        weft_abort(k->c);
    else
        kill(getpid(), SIGKILL);
    return NULL;
}

#define LOOP_COUNT ((2 << 20) + 1)
/* The reduce_scatter's and all_gather's blocks in gone_rank (2 MiB). */
#define LOOP_BLOCK ((1 << 19) + 1)

/* What gone_rank loops on. */
enum { GONE_ALL_REDUCE, GONE_REDUCE_SCATTER, GONE_ALL_GATHER };
static int gone_op = GONE_ALL_REDUCE;

/* One call of gone_rank's loop, number it, its result checked at every
 * 4099th element (and the last) of what it returns. */
static int gone_call(weft_comm *c, float *v, float *w, int rank, int nranks,
                     int it, int *fail)
{
    const size_t all = LOOP_BLOCK * (size_t)nranks;
    const float sum = (float)(nranks * (nranks - 1) / 2 + nranks * it);
    int rc;

    switch (gone_op) {
    case GONE_REDUCE_SCATTER:
        for (size_t i = 0; i < all; i += 4099)
            v[i] = (float)(rank + it);
        for (int r = 0; r < nranks; r++)
            v[LOOP_BLOCK * (size_t)(r + 1) - 1] = (float)(rank + it);
        rc = weft_reduce_scatter(c, v, w, LOOP_BLOCK, WEFT_FLOAT32, WEFT_SUM);
        for (size_t i = 0; rc == WEFT_OK && i < LOOP_BLOCK; i++)
            if (((size_t)rank * LOOP_BLOCK + i) % 4099 == 0 ||
                i == LOOP_BLOCK - 1) {
                if (w[i] != sum) {
                    mp_log("call %d: element %zu is %g", it, i, (double)w[i]);
                    *fail = 1;
                    break;
                }
            }
        return rc;
    case GONE_ALL_GATHER:
        for (size_t i = 0; i < LOOP_BLOCK; i += 4099)
            v[i] = (float)(rank + it);
        v[LOOP_BLOCK - 1] = (float)(rank + it);
        rc = weft_all_gather(c, v, w, LOOP_BLOCK, WEFT_FLOAT32);
        for (int r = 0; rc == WEFT_OK && r < nranks && !*fail; r++)
            for (size_t i = 0; i < LOOP_BLOCK; i++)
                if ((i % 4099 == 0 || i == LOOP_BLOCK - 1) &&
                    w[(size_t)r * LOOP_BLOCK + i] != (float)(r + it)) {
                    mp_log("call %d: block %d element %zu is %g", it, r, i,
                           (double)w[(size_t)r * LOOP_BLOCK + i]);
                    *fail = 1;
                    break;
                }
        return rc;
    default:
        for (size_t i = 0; i < LOOP_COUNT; i += 4099)
            v[i] = (float)(rank + it);
        v[LOOP_COUNT - 1] = (float)(rank + it);
        rc = weft_all_reduce(c, v, v, LOOP_COUNT, WEFT_FLOAT32, WEFT_SUM);
        for (size_t i = 0; rc == WEFT_OK && i < LOOP_COUNT; i += 4099)
            if (v[i] != sum) {
                mp_log("call %d: element %zu is %g", it, i, (double)v[i]);
                *fail = 1;
                break;
            }
        return rc;
    }
}

/* Every rank runs all_reduces of 8 MiB in a loop, each result checked;
 * 400 ms in, the last rank is killed (or rank 0 aborts its communicator):
 * every other rank's call fails, with WEFT_EPEER (a dead peer) or
 * WEFT_EABORTED (the aborted rank), within PROMPT_MS, and no call before
 * returned wrong data. */
static int gone_rank(int rank, int nranks, void *arg)
{
    const int abort = *(const int *)arg;
    const int actor = abort ? 0 : nranks - 1;
    const size_t all = LOOP_BLOCK * (size_t)nranks;
    float *v = mp_alloc((all > LOOP_COUNT ? all : LOOP_COUNT) * sizeof *v);
    float *w = mp_alloc(all * sizeof *w);
    struct killer k;
    pthread_t th;
    weft_comm *c;
    double t0 = 0;
    int rc = WEFT_OK, fail = 0, it;

    if (mp_init(&c, rank, nranks) != WEFT_OK)
        return 1;
    k = (struct killer){c, 400, abort};
    if (rank == actor && pthread_create(&th, NULL, act_later, &k) != 0)
        return 1;
    for (it = 0; it < 100000 && rc == WEFT_OK && !fail; it++) {
        t0 = mp_now_ms();
        rc = gone_call(c, v, w, rank, nranks, it, &fail);
    }
    if (rank == actor && abort)
        pthread_join(th, NULL);
    if (!fail) {
        const int want = rank == actor ? WEFT_EABORTED : WEFT_EPEER;
        const double dt = mp_now_ms() - t0;

        if (rc != want || dt > PROMPT_MS) {
            mp_log("call %d: %s after %.0f ms (%s), expected %s", it,
                   weft_err_name(rc), dt, weft_last_error(c),
                   weft_err_name(want));
            fail = 1;
        }
    }
    free(v);
    free(w);
    return weft_finalize(c) != WEFT_OK || fail;
}

static void run_gone(int abort, int nranks)
{
    struct mp_opts o = {
        .nranks = nranks, .timeout_ms = TIMEOUT_MS, .layout = layout};
    struct mp_result res;
    char buf[1024];

    setenv("WEFT_SHM", "1", 1);
    set_algo(nranks);
    setenv("WEFT_PULL_THREADS", "3", 1);
    cr_assert_eq(mp_run(&o, gone_rank, &abort, &res), 0);
    unsetenv("WEFT_ALGO");
    unsetenv("WEFT_PULL_THREADS");
    for (int r = 0; r < nranks; r++) {
        const struct mp_rank_result *rr = &res.rank[r];
        const int killed = !abort && r == nranks - 1;

        cr_assert(killed ? rr->signaled && rr->signo == SIGKILL
                         : rr->exited && rr->exit_code == 0,
                  "%s: %s", abort ? "abort" : "a peer killed",
                  mp_describe(&res, buf, sizeof buf));
    }
}

Test(pull, a_peer_killed_mid_loop_is_epeer, .timeout = 120)
{
    run_gone(0, 3);
}

Test(pull, weft_abort_ends_it_and_the_peers_see_it, .timeout = 120)
{
    run_gone(1, 3);
}

/* ---- hosts of several ranks ---- */

/* 2 hosts of 2 ranks and 3 of 2: every dtype's sum and max, in place and
 * not, then the threads as on one host (the large call starts them). */
static int hier_results_rank(int rank, int nranks, void *arg)
{
    static const weft_dtype some[] = {WEFT_INT32, WEFT_FLOAT32, WEFT_BFLOAT16,
                                      WEFT_FLOAT64};
    weft_comm *c;
    int fail = 0;

    (void)arg;
    if (mp_init(&c, rank, nranks) != WEFT_OK)
        return 1;
    for (size_t d = 0; d < sizeof some / sizeof some[0] && !fail; d++) {
        const size_t es = weft_dtype_size(some[d]);
        const size_t counts[] = {4096 / es, (1 << 20) / es + 7};

        for (size_t k = 0; k < sizeof counts / sizeof counts[0] && !fail; k++)
            for (int o = 0; o < 2 && !fail; o++)
                fail = mp_small_all_reduce(c, some[d], o ? WEFT_MAX : WEFT_SUM,
                                           counts[k], (int)((k + o + d) & 1),
                                           rank, nranks);
    }
    return weft_finalize(c) != WEFT_OK || fail;
}

Test(pull, hosts_of_several_ranks_read_within_their_host, .timeout = 300)
{
    static const int readable = 0;

    hier_env();
    run_job(4, hier_results_rank, NULL, "results, 2 hosts of 2 ranks");
    run_job(6, hier_results_rank, NULL, "results, 3 hosts of 2 ranks");
    run_job(4, threads_rank, (void *)&readable, "threads, 2 hosts of 2");
}

/* Rank 0 unreadable: its host's ranks take the frames' path within the
 * host, the other host's the reads; the phase across the hosts is the
 * same either way (the same chunks), so results are right everywhere. */
Test(pull, hosts_of_several_ranks_one_unreadable, .timeout = 120)
{
    static const int refused = 2;

    hier_env();
    run_job(4, threads_rank, (void *)&refused, "rank 0 unreadable, 2 hosts");
}

Test(pull, hosts_of_several_ranks_a_peer_killed_is_epeer, .timeout = 120)
{
    hier_env();
    run_gone(0, 4);
}

/* The same in a loop of reduce_scatters, then of all_gathers, read within
 * the hosts. */
Test(pull, hosts_of_several_ranks_gather_scatter_peer_killed, .timeout = 120)
{
    hier_env();
    algo_ops = ALGO_EVERY_OP;
    setenv("WEFT_HIER_PULL_ALL_GATHER_BYTES", PULL_FROM, 1);
    setenv("WEFT_HIER_PULL_REDUCE_SCATTER_BYTES", PULL_FROM, 1);
    gone_op = GONE_REDUCE_SCATTER;
    run_gone(0, 4);
    gone_op = GONE_ALL_GATHER;
    run_gone(0, 4);
}

/* ---- posted calls ---- */

/* Three all_reduces of one buffer posted at once (with a small one in
 * between), run by the progress thread: each sees the one before. */
static int posted_rank(int rank, int nranks, void *arg)
{
    const size_t n = (1 << 20) + 9;
    float *v = mp_alloc(n * sizeof *v);
    int32_t s[2] = {rank, 1};
    weft_request *req[4];
    weft_comm *c;
    int rc, fail = 0;
    float want;

    (void)arg;
    if (mp_init(&c, rank, nranks) != WEFT_OK)
        return 1;
    for (size_t i = 0; i < n; i++)
        v[i] = 1;
    if ((rc = weft_iall_reduce(c, v, v, n, WEFT_FLOAT32, WEFT_SUM, &req[0])) !=
            WEFT_OK ||
        (rc = weft_iall_reduce(c, s, s, 2, WEFT_INT32, WEFT_SUM, &req[1])) !=
            WEFT_OK ||
        (rc = weft_iall_reduce(c, v, v, n, WEFT_FLOAT32, WEFT_SUM, &req[2])) !=
            WEFT_OK ||
        (rc = weft_iall_reduce(c, v, v, n, WEFT_FLOAT32, WEFT_MAX, &req[3])) !=
            WEFT_OK)
        return mp_report_rc(c, "iall_reduce", rc);
    if ((rc = weft_wait_all(req, 4)) != WEFT_OK)
        return mp_report_rc(c, "wait_all", rc);
    for (int i = 0; i < 4; i++)
        weft_request_free(req[i]);
    want = (float)(nranks * nranks);
    for (size_t i = 0; i < n; i++)
        if (v[i] != want) {
            mp_log("element %zu is %g, expected %g", i, (double)v[i],
                   (double)want);
            fail = 1;
            break;
        }
    if (s[0] != nranks * (nranks - 1) / 2 || s[1] != nranks) {
        mp_log("the small all_reduce gave %d %d", (int)s[0], (int)s[1]);
        fail = 1;
    }
    free(v);
    return weft_finalize(c) != WEFT_OK || fail;
}

Test(pull, posted_calls_on_one_buffer_run_in_order, .timeout = 120)
{
    run_job(3, posted_rank, NULL, "posted");
}

/* ---- reduce_scatter, all_gather, broadcast ---- */

/* Ranks that differ in how they place their buffers: rank 1's
 * reduce_scatter is in place (its result lands on block 0 of its input,
 * which rank 0 reads meanwhile), the others' not; rank 0's all_gather
 * input is its own block of recvbuf, the others' a buffer of their own;
 * a broadcast from the last rank. Every result checked. */
static int shapes_rank(int rank, int nranks, void *arg)
{
    const size_t n = (1 << 19) + 3; /* per rank: 2 MiB of int32 */
    int32_t *in = mp_alloc(n * (size_t)nranks * sizeof *in);
    int32_t *out = mp_alloc(n * (size_t)nranks * sizeof *out);
    weft_comm *c;
    int rc, fail = 0, base = 0;

    if (mp_init(&c, rank, nranks) != WEFT_OK)
        return 1;
    if (arg != NULL) {
        float small[2] = {1, 2};

        /* The threads the calls add, after any a small call starts. */
        if ((rc = weft_all_reduce(c, small, small, 2, WEFT_FLOAT32,
                                  WEFT_SUM)) != WEFT_OK)
            return mp_report_rc(c, "small all_reduce", rc);
        base = mp_threads();
    }
    for (int round = 0; round < 3 && !fail; round++) {
        /* Rank 2's reduce_scatter is in place the usual way (on its own
         * block of its input, which no peer reads). */
        int32_t *rs_out = rank == 1   ? in
                          : rank == 2 ? in + (size_t)rank * n
                                      : out;
        int32_t *ag_in = rank == 0 ? out + (size_t)rank * n : in;
        const int root = nranks - 1;

        for (size_t i = 0; i < n * (size_t)nranks; i++)
            in[i] = (int32_t)(i * 7 + (size_t)rank + (size_t)round);
        rc = weft_reduce_scatter(c, in, rs_out, n, WEFT_INT32, WEFT_SUM);
        if (rc != WEFT_OK)
            fail = mp_report_rc(c, "reduce_scatter", rc);
        for (size_t i = 0; !fail && i < n; i++) {
            size_t at = (size_t)rank * n + i;
            int32_t want = (int32_t)((at * 7 + (size_t)round) * (size_t)nranks +
                                     (size_t)(nranks * (nranks - 1) / 2));
            if (rs_out[i] != want) {
                mp_log("round %d: reduce_scatter element %zu is %d, not %d",
                       round, i, (int)rs_out[i], (int)want);
                fail = 1;
            }
        }
        for (size_t i = 0; !fail && i < n; i++)
            ag_in[i] = (int32_t)(rank * 1000003 + (int)i + round);
        if (!fail &&
            (rc = weft_all_gather(c, ag_in, out, n, WEFT_INT32)) != WEFT_OK)
            fail = mp_report_rc(c, "all_gather", rc);
        for (int r = 0; !fail && r < nranks; r++)
            for (size_t i = 0; i < n; i++)
                if (out[(size_t)r * n + i] !=
                    (int32_t)(r * 1000003 + (int)i + round)) {
                    mp_log("round %d: all_gather block %d element %zu is %d",
                           round, r, i, (int)out[(size_t)r * n + i]);
                    fail = 1;
                    break;
                }
        for (size_t i = 0; !fail && i < n; i++)
            out[i] = rank == root ? (int32_t)(i ^ (size_t)round) : -1;
        if (!fail &&
            (rc = weft_broadcast(c, out, n, WEFT_INT32, root)) != WEFT_OK)
            fail = mp_report_rc(c, "broadcast", rc);
        for (size_t i = 0; !fail && i < n; i++)
            if (out[i] != (int32_t)(i ^ (size_t)round)) {
                mp_log("round %d: broadcast element %zu is %d", round, i,
                       (int)out[i]);
                fail = 1;
            }
    }
    if (arg != NULL && !fail && mp_threads() - base != *(const int *)arg) {
        mp_log("the calls added %d threads, %d expected", mp_threads() - base,
               *(const int *)arg);
        fail = 1;
    }
    free(in);
    free(out);
    return weft_finalize(c) != WEFT_OK || fail;
}

Test(pull, reduce_scatter_all_gather_broadcast_whatever_the_buffers,
     .timeout = 120)
{
    algo_ops = ALGO_EVERY_OP;
    run_job(3, shapes_rank, NULL, "shapes, 3 ranks");
    run_job(4, shapes_rank, NULL, "shapes, 4 ranks");
}

/* The hierarchical all_gather and reduce_scatter with their phases
 * within the hosts by reads, one of them, both or neither (then the
 * frames: no thread is added, which shows that the threads counted are
 * the reads'), over every shape of buffers that shapes_rank tries (a
 * reduce_scatter into a block of its input that a peer of its host
 * reads, and one into its own block; an all_gather in place). */
Test(pull, hosts_of_several_ranks_gather_and_scatter_by_reads, .timeout = 300)
{
    static const int helpers = THREADS - 1, none = 0;
    static const struct {
        const char *ag, *rs;
        int ranks;
        const int *threads;
        const char *what;
    } cases[] = {
        {PULL_FROM, "0", 4, &helpers, "all_gather by reads, 2 hosts of 2"},
        {"0", PULL_FROM, 4, &helpers, "reduce_scatter by reads, 2 hosts of 2"},
        {PULL_FROM, PULL_FROM, 6, &helpers, "both by reads, 3 hosts of 2"},
        {"0", "0", 4, &none, "both by frames, 2 hosts of 2"},
    };

    hier_env();
    algo_ops = ALGO_EVERY_OP;
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        setenv("WEFT_HIER_PULL_ALL_GATHER_BYTES", cases[i].ag, 1);
        setenv("WEFT_HIER_PULL_REDUCE_SCATTER_BYTES", cases[i].rs, 1);
        run_job(cases[i].ranks, shapes_rank, (void *)cases[i].threads,
                cases[i].what);
    }
}

/* A broadcast whose ranks name different roots: no rank returns WEFT_OK
 * (the root's buffer would be read by ranks that think they are not the
 * root, and written by one that thinks it is). */
static int roots_rank(int rank, int nranks, void *arg)
{
    const size_t n = 1 << 20;
    int32_t *v = mp_alloc(n * sizeof *v);
    weft_comm *c;
    int rc;

    (void)arg;
    for (size_t i = 0; i < n; i++)
        v[i] = rank;
    if (mp_init(&c, rank, nranks) != WEFT_OK)
        return 1;
    rc = weft_broadcast(c, v, n, WEFT_INT32, rank == 0 ? 1 : 0);
    shm()->rc[rank] = rc;
    snprintf(shm()->msg[rank], sizeof shm()->msg[rank], "%s",
             rc == WEFT_OK ? "" : weft_last_error(c));
    free(v);
    return weft_finalize(c) != WEFT_OK;
}

Test(pull, a_broadcast_from_different_roots_is_emismatch, .timeout = 120)
{
    int saw = 0;

    algo_ops = ALGO_EVERY_OP;
    run_job(3, roots_rank, NULL, "roots");
    for (int r = 0; r < 3; r++) {
        cr_assert(shm()->rc[r] == WEFT_EMISMATCH || shm()->rc[r] == WEFT_EPEER,
                  "rank %d returned %s (%s)", r, weft_err_name(shm()->rc[r]),
                  shm()->msg[r]);
        saw += shm()->rc[r] == WEFT_EMISMATCH &&
               strstr(shm()->msg[r], "root") != NULL;
    }
    cr_assert(saw > 0, "no rank saw the roots differ");
}

/* ---- the deadline ---- */

/* A deadline of 5 ms for an all_reduce of 64 MiB (tens of ms here): it
 * passes during the call, wherever the call is then (reading, reducing or
 * waiting for a peer), and every rank's call fails promptly, with
 * WEFT_ETIMEDOUT where its own deadline passed first and WEFT_EPEER where
 * a peer's failure came first; none returns WEFT_OK. */
static int deadline_rank(int rank, int nranks, void *arg)
{
    const size_t n = (64u << 20) / sizeof(float);
    float *v = mp_alloc(n * sizeof *v);
    weft_comm *c;
    double t0, dt;
    int rc;

    (void)arg;
    for (size_t i = 0; i < n; i++)
        v[i] = (float)rank;
    if (mp_init(&c, rank, nranks) != WEFT_OK)
        return 1;
    if ((rc = weft_barrier(c)) != WEFT_OK)
        return mp_report_rc(c, "barrier", rc);
    weft_set_timeout(c, 5);
    t0 = mp_now_ms();
    rc = weft_all_reduce(c, v, v, n, WEFT_FLOAT32, WEFT_SUM);
    dt = mp_now_ms() - t0;
    shm()->rc[rank] = rc;
    snprintf(shm()->msg[rank], sizeof shm()->msg[rank], "%.0f ms: %s", dt,
             rc == WEFT_OK ? "" : weft_last_error(c));
    free(v);
    return weft_finalize(c) != WEFT_OK;
}

Test(pull, a_deadline_that_passes_mid_call_fails_every_rank, .timeout = 120)
{
    int timed_out = 0;

    run_job(3, deadline_rank, NULL, "deadline");
    for (int r = 0; r < 3; r++) {
        cr_assert(shm()->rc[r] == WEFT_ETIMEDOUT || shm()->rc[r] == WEFT_EPEER,
                  "rank %d returned %s (%s)", r, weft_err_name(shm()->rc[r]),
                  shm()->msg[r]);
        timed_out += shm()->rc[r] == WEFT_ETIMEDOUT;
        cr_log_info("rank %d: %s, %s", r, weft_err_name(shm()->rc[r]),
                    shm()->msg[r]);
    }
    cr_assert(timed_out > 0, "no rank saw its deadline pass: %s; %s; %s",
              shm()->msg[0], shm()->msg[1], shm()->msg[2]);
}
