/*
 * The box: where every rank is on one host with shared memory, a small
 * all_reduce (by default up to 2048 bytes up to 8 ranks, and at most 2048
 * whatever WEFT_ALGO says), an all_gather of
 * blocks that small and the barrier go through a slot per rank and call
 * instead of frames. As a user sees it:
 * the same results as the frames give, at the box's edge too; calls that
 * differ across ranks are WEFT_EMISMATCH whether both went to the box or
 * one did not; a dead peer is WEFT_EPEER at once and a late one
 * WEFT_ETIMEDOUT at the deadline, naming what was waited for; ranks out
 * of step by many calls (broadcasts, which let ranks run ahead, and
 * non-blocking calls) never read a slot of another call.
 */
#define _GNU_SOURCE
#include <criterion/criterion.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "harness.h"
#include "weft.h"

#define TIMEOUT_MS 30000
#define PROMPT_MS 10000
/* The box's edge by default, at 2 to 8 ranks (docs/reference.md), and the most
 * a box message holds whatever WEFT_ALGO says. */
#define BOX_DEFAULT_BYTES 2048
#define BOX_MAX_BYTES 2048

struct box_shm {
    int rc[MP_MAX_RANKS];
    double ms[MP_MAX_RANKS];
    char msg[MP_MAX_RANKS][256];
    pid_t pid0;          /* rank 0's, for a peer that stops it */
    _Atomic int in_call; /* rank 0 is about to enter its call */
};

static struct box_shm *shm(void)
{
    return mp_shm();
}

static void record(int rank, int rc, double ms, const weft_comm *c)
{
    shm()->rc[rank] = rc;
    shm()->ms[rank] = ms;
    snprintf(shm()->msg[rank], sizeof shm()->msg[rank], "%s",
             rc == WEFT_OK ? "" : weft_last_error(c));
}

static void run_job(int nranks, int timeout_ms, mp_rank_fn fn, void *arg,
                    const char *what)
{
    struct mp_opts o = {.nranks = nranks, .timeout_ms = timeout_ms};
    struct mp_result res;
    char buf[1024];

    setenv("WEFT_SHM", "1", 1);
    cr_assert_eq(mp_run(&o, fn, arg, &res), 0);
    cr_assert(mp_all_passed(&res), "%s: %s", what,
              mp_describe(&res, buf, sizeof buf));
}

/* ---- results ---- */

static const weft_dtype dtypes[] = {WEFT_INT8,    WEFT_UINT8,   WEFT_INT32,
                                    WEFT_UINT32,  WEFT_INT64,   WEFT_UINT64,
                                    WEFT_FLOAT32, WEFT_FLOAT64, WEFT_BFLOAT16};
static const weft_redop ops[] = {WEFT_SUM, WEFT_PROD, WEFT_MIN, WEFT_MAX};

/* Every dtype and op, at counts up to the box's edge and one element
 * past it (frames), in place and not, with canaries around the result. */
static int results_rank(int rank, int nranks, void *arg)
{
    const size_t box_bytes = *(const size_t *)arg;
    weft_comm *c;
    int fail = 0;

    if (mp_init(&c, rank, nranks) != WEFT_OK)
        return 1;
    for (size_t d = 0; d < sizeof dtypes / sizeof dtypes[0] && !fail; d++) {
        const size_t es = weft_dtype_size(dtypes[d]);
        const size_t edge = box_bytes / es;
        const size_t counts[] = {1, 2, 3, edge - 1, edge, edge + 1};

        for (size_t o = 0; o < sizeof ops / sizeof ops[0] && !fail; o++)
            for (size_t k = 0; k < sizeof counts / sizeof counts[0] && !fail;
                 k++) {
                fail = mp_small_all_reduce(c, dtypes[d], ops[o], counts[k],
                                           (int)(k & 1), rank, nranks);
            }
    }
    /* all_gather: blocks at the box's edge and one past it, in place
     * (this rank's block of recvbuf is sendbuf) and not. */
    for (size_t d = 0; d < sizeof dtypes / sizeof dtypes[0] && !fail; d++) {
        const size_t es = weft_dtype_size(dtypes[d]);
        const size_t edge = box_bytes / es;
        const size_t counts[] = {1, edge, edge + 1};

        for (size_t k = 0; k < 2 * sizeof counts / sizeof counts[0] && !fail;
             k++) {
            const size_t n = counts[k / 2], bytes = n * es;
            const int inplace = (int)(k & 1);
            const size_t all = bytes * (size_t)nranks;
            char *send = mp_alloc(bytes);
            char *recv = mp_alloc(all + 2 * MP_CANARY_BYTES);
            char *want = mp_alloc(all);
            char *out = recv + MP_CANARY_BYTES;
            char *mine = inplace ? out + (size_t)rank * bytes : send;
            char what[128];
            int rc;

            memset(recv, MP_CANARY, all + 2 * MP_CANARY_BYTES);
            for (size_t i = 0; i < n; i++) {
                mp_put_value(dtypes[d], mine, i, mp_small_elem(rank, i));
                for (int r = 0; r < nranks; r++)
                    mp_put_value(dtypes[d], want + (size_t)r * bytes, i,
                                 mp_small_elem(r, i));
            }
            snprintf(what, sizeof what, "all_gather(%s, count=%zu%s)",
                     mp_dtype_name(dtypes[d]), n, inplace ? ", in place" : "");
            rc = weft_all_gather(c, mine, out, n, dtypes[d]);
            if (rc != WEFT_OK)
                fail = mp_report_rc(c, what, rc);
            else
                fail =
                    mp_check_elems(what, "recvbuf", dtypes[d], out, want,
                                   n * (size_t)nranks) ||
                    mp_check_canary(what, "recvbuf", out, all) ||
                    mp_check_canary(what, "the bytes before recvbuf", recv, 0);
            free(send);
            free(recv);
            free(want);
        }
    }
    if (!fail) {
        int rc = weft_barrier(c);
        if (rc != WEFT_OK)
            fail = mp_report_rc(c, "barrier", rc);
    }
    return weft_finalize(c) != WEFT_OK || fail;
}

/* WEFT_ALGO at 3 ranks: the default rows (weft_info's) but the box's only
 * up to 192 bytes (the buffer; a reduce_scatter's whole input). */
#define ALGO_BOX_192_RANKS3                                                    \
    "all_reduce:0-192=box,0-10922=gather,0-=ring;"                             \
    "all_gather:0-192=box,0-=ring;reduce_scatter:0-64=box,0-=ring;"            \
    "broadcast:0-192=box,0-=ring"

/* fn at the box's edge: the default's at 2 to 4 ranks, then the box only
 * up to 192 bytes, and the box at every size, where its edge is the
 * message's (at 2 ranks: the default rows with the box's unbounded). */
static void run_edges(mp_rank_fn fn, const char *what)
{
    static const struct {
        const char *algo; /* WEFT_ALGO */
        int nranks;
        size_t edge;
    } runs[] = {{NULL, 2, BOX_DEFAULT_BYTES},
                {NULL, 3, BOX_DEFAULT_BYTES},
                {NULL, 4, BOX_DEFAULT_BYTES},
                {ALGO_BOX_192_RANKS3, 3, 192},
                {"all_reduce:0-=box,0-16k=doubling,0-16k=gather,0-=ring;"
                 "all_gather:0-=box;reduce_scatter:0-=box;broadcast:0-=box",
                 2, BOX_MAX_BYTES}};
    char name[384];

    for (size_t i = 0; i < sizeof runs / sizeof runs[0]; i++) {
        size_t edge = runs[i].edge;

        if (runs[i].algo != NULL)
            setenv("WEFT_ALGO", runs[i].algo, 1);
        snprintf(name, sizeof name, "%s, %d ranks, WEFT_ALGO %s", what,
                 runs[i].nranks, runs[i].algo ? runs[i].algo : "unset");
        run_job(runs[i].nranks, TIMEOUT_MS, fn, &edge, name);
        unsetenv("WEFT_ALGO");
    }
}

Test(box, results_at_and_past_its_edge, .timeout = 240)
{
    run_edges(results_rank, "box results");
}

/* ---- calls that differ ---- */

enum {
    MIS_COUNT_BOX,    /* 2 against 3 elements: both in the box */
    MIS_COUNT_FRAMES, /* 2 (box) against 4096 (frames) */
    MIS_DTYPE,        /* int32 against float32, both in the box */
    MIS_KIND,         /* a barrier against an all_reduce of 1 byte */
};

struct mis_case {
    int what;
    int odd; /* the rank whose call differs */
};

static int mismatch_rank(int rank, int nranks, void *arg)
{
    const struct mis_case *mc = arg;
    const int odd = rank == mc->odd;
    int32_t *buf = calloc(4096, sizeof *buf);
    weft_comm *c;
    double t0;
    int rc;

    if (buf == NULL || mp_init(&c, rank, nranks) != WEFT_OK) {
        free(buf);
        return 1;
    }
    t0 = mp_now_ms();
    switch (mc->what) {
    case MIS_COUNT_BOX:
        rc = weft_all_reduce(c, buf, buf, odd ? 2 : 3, WEFT_INT32, WEFT_SUM);
        break;
    case MIS_COUNT_FRAMES:
        rc = weft_all_reduce(c, buf, buf, odd ? 2 : 4096, WEFT_INT32, WEFT_SUM);
        break;
    case MIS_DTYPE:
        rc = weft_all_reduce(c, buf, buf, 4, odd ? WEFT_FLOAT32 : WEFT_INT32,
                             WEFT_SUM);
        break;
    default:
        rc = odd ? weft_barrier(c)
                 : weft_all_reduce(c, buf, buf, 1, WEFT_UINT8, WEFT_MAX);
        break;
    }
    record(rank, rc, mp_now_ms() - t0, c);
    free(buf);
    return weft_finalize(c) != WEFT_OK;
}

static void run_mismatch(const struct mis_case *mc, int nranks, int all_see_it)
{
    char what[64];

    snprintf(what, sizeof what, "mismatch case %d, odd rank %d of %d", mc->what,
             mc->odd, nranks);
    run_job(nranks, 5000, mismatch_rank, (void *)mc, what);
    for (int r = 0; r < nranks; r++) {
        int rc = shm()->rc[r];

        cr_assert(
            rc == WEFT_EMISMATCH ||
                (!all_see_it && (rc == WEFT_EPEER || rc == WEFT_ETIMEDOUT)),
            "%s: rank %d returned %s (%s)", what, r, weft_err_name(rc),
            shm()->msg[r]);
        if (rc == WEFT_EMISMATCH)
            cr_assert(strstr(shm()->msg[r], "called") != NULL,
                      "%s: rank %d's message does not say what differed: %s",
                      what, r, shm()->msg[r]);
    }
    /* The odd rank's call went to the box where the others' went on
     * frames: it reads their headers there, so it must see it. */
    cr_assert_eq(shm()->rc[mc->odd], WEFT_EMISMATCH, "%s: odd rank: %s (%s)",
                 what, weft_err_name(shm()->rc[mc->odd]), shm()->msg[mc->odd]);
}

Test(box, calls_that_differ_in_the_box, .timeout = 120)
{
    /* Every rank is in the box and reads every other's header: each sees
     * the odd one (or, the odd rank, all of them). */
    const struct mis_case cases[] = {
        {MIS_COUNT_BOX, 0}, {MIS_COUNT_BOX, 2}, {MIS_DTYPE, 1}, {MIS_KIND, 2}};

    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
        run_mismatch(&cases[i], 3, 1);
}

Test(box, a_call_in_the_box_against_one_on_frames, .timeout = 120)
{
    const struct mis_case cases[] = {{MIS_COUNT_FRAMES, 0},
                                     {MIS_COUNT_FRAMES, 1}};

    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        run_mismatch(&cases[i], 2, 0);
        run_mismatch(&cases[i], 4, 0);
    }
}

/* ---- a dead peer, a late one ---- */

struct gone_case {
    int late;    /* 0: the last rank is killed; 1: it calls late */
    int barrier; /* the call: a barrier, else an all_reduce of 8 bytes */
    int box_off; /* WEFT_ALGO without the box: the same on frames */
};

#define LATE_DEADLINE_MS 1500

static int gone_rank(int rank, int nranks, void *arg)
{
    const struct gone_case *gc = arg;
    const int last = nranks - 1;
    float v[2] = {1, 2};
    weft_comm *c;
    double t0, dt;
    int rc, fail = 0;

    if (mp_init(&c, rank, nranks) != WEFT_OK)
        return 1;
    if ((rc = weft_all_reduce(c, v, v, 2, WEFT_FLOAT32, WEFT_SUM)) != WEFT_OK)
        return mp_report_rc(c, "first all_reduce", rc);
    if (rank == last) {
        if (!gc->late)
            mp_point(1); /* killed here */
        mp_sleep_ms(LATE_DEADLINE_MS * 3);
    }
    if (gc->late)
        weft_set_timeout(c, LATE_DEADLINE_MS);
    t0 = mp_now_ms();
    rc = gc->barrier ? weft_barrier(c)
                     : weft_all_reduce(c, v, v, 2, WEFT_FLOAT32, WEFT_SUM);
    dt = mp_now_ms() - t0;
    if (rank == last)
        /* The others gave up long ago: any failure. */
        fail = rc == WEFT_OK;
    else if (!gc->late && (rc != WEFT_EPEER || dt > PROMPT_MS ||
                           strstr(weft_last_error(c), "closed") == NULL))
        fail = 1;
    else if (gc->late && (rc != WEFT_ETIMEDOUT || dt < LATE_DEADLINE_MS - 10 ||
                          dt > LATE_DEADLINE_MS * 2 ||
                          strstr(weft_last_error(c), "deadline") == NULL))
        fail = 1;
    if (fail)
        mp_log("%s with rank %d %s: %s after %.0f ms (%s)",
               gc->barrier ? "barrier" : "all_reduce", last,
               gc->late ? "late" : "killed", weft_err_name(rc), dt,
               weft_last_error(c));
    record(rank, rc, dt, c);
    return weft_finalize(c) != WEFT_OK || fail;
}

static void run_gone(const struct gone_case *gc, int nranks)
{
    struct mp_action kill = {
        .rank = nranks - 1, .point = 1, .kind = MP_ACT_SIGKILL};
    struct mp_opts o = {.nranks = nranks,
                        .timeout_ms = TIMEOUT_MS,
                        .actions = gc->late ? NULL : &kill,
                        .nactions = gc->late ? 0 : 1};
    struct mp_result res;
    char buf[1024];

    setenv("WEFT_SHM", "1", 1);
    /* The all_reduce's rows without the box: the default's gather (32 KiB
     * gathered), then the ring. */
    setenv("WEFT_ALGO",
           gc->box_off ? "all_reduce:0-10922=gather,0-=ring;all_gather:ring;"
                         "reduce_scatter:ring;broadcast:ring"
                       : ALGO_BOX_192_RANKS3,
           1);
    cr_assert_eq(mp_run(&o, gone_rank, (void *)gc, &res), 0);
    unsetenv("WEFT_ALGO");
    cr_assert(mp_all_passed(&res), "%s", mp_describe(&res, buf, sizeof buf));
}

Test(box, a_dead_peer_is_epeer_at_once, .timeout = 120)
{
    const struct gone_case cases[] = {{0, 0, 0}, {0, 1, 0}};

    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
        run_gone(&cases[i], 3);
}

Test(box, a_late_peer_is_the_deadline_and_named, .timeout = 120)
{
    const struct gone_case in_box = {1, 0, 0}, on_frames = {1, 0, 1};

    run_gone(&in_box, 3);
    /* The message says what was waited for: the box names its messages
     * in shared memory, the frames a header on a wire. */
    for (int r = 0; r < 2; r++)
        cr_assert(strstr(shm()->msg[r], "shared memory") != NULL &&
                      strstr(shm()->msg[r], "peer 2") != NULL,
                  "rank %d: %s", r, shm()->msg[r]);
    run_gone(&on_frames, 3);
    for (int r = 0; r < 2; r++)
        cr_assert(strstr(shm()->msg[r], "shared memory") == NULL,
                  "all_reduce without the box, rank %d: %s", r, shm()->msg[r]);
}

/* ---- a peer killed just after its call ---- */

/* The state letter of pid's main thread (/proc/pid/stat), or '?'. */
static char proc_state(pid_t pid)
{
    char path[64], buf[512], *p;
    FILE *f;
    size_t n;

    snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
    if ((f = fopen(path, "r")) == NULL)
        return '?';
    n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = '\0';
    p = strrchr(buf, ')'); /* the name may hold anything */
    return p != NULL && p[1] == ' ' ? p[2] : '?';
}

/* Waits up to 10 s for pid's main thread to be in one of states. */
static int wait_state(pid_t pid, const char *states)
{
    for (int i = 0; i < 10000; i++) {
        if (strchr(states, proc_state(pid)) != NULL)
            return 0;
        mp_sleep_ms(1);
    }
    mp_log("pid %d never reached a state in \"%s\" (now %c)", (int)pid, states,
           proc_state(pid));
    return -1;
}

/* Rank 0 enters a barrier and sleeps in it, its message written; rank 1
 * stops it (SIGSTOP), runs its own barrier to the end (rank 0's message
 * is there), and is SIGKILLed; a child of rank 1 resumes rank 0 once
 * rank 1 is gone. Rank 0 then finds rank 1's message and a closed
 * connection: rank 1 took its part, so rank 0's barrier succeeds; its
 * next call finds the peer dead. */
static int killed_after_rank(int rank, int nranks, void *arg)
{
    weft_comm *c;
    int rc, fds[2];
    pid_t helper;

    (void)arg;
    if (mp_init(&c, rank, nranks) != WEFT_OK)
        return 1;
    if (rank == 0)
        shm()->pid0 = getpid();
    if ((rc = weft_barrier(c)) != WEFT_OK)
        return mp_report_rc(c, "first barrier", rc);
    if (rank == 0) {
        atomic_store(&shm()->in_call, 1);
        rc = weft_barrier(c);
        record(0, rc, 0, c);
        if (rc != WEFT_OK)
            return mp_report_rc(c, "barrier that rank 1 ended before it died",
                                rc);
        rc = weft_barrier(c);
        record(0, rc, 0, c);
        if (rc != WEFT_EPEER)
            return mp_report_rc(c, "barrier after rank 1 died", rc) || 1;
        return weft_finalize(c) != WEFT_OK;
    }
    while (!atomic_load(&shm()->in_call))
        mp_sleep_ms(1);
    /* Asleep in its wait: nothing before its message sleeps. */
    if (wait_state(shm()->pid0, "S") != 0 || pipe(fds) != 0)
        return 1;
    if ((helper = fork()) < 0)
        return 1;
    if (helper == 0) {
        char b;

        close(fds[1]);
        /* EOF once rank 1 (holding the write end) is gone. */
        while (read(fds[0], &b, 1) != 0)
            ;
        /* Its connections' ends have reached rank 0 by then, so
         * rank 0 may well find them before the message. */
        mp_sleep_ms(100);
        kill(shm()->pid0, SIGCONT);
        _exit(0);
    }
    close(fds[0]);
    if (kill(shm()->pid0, SIGSTOP) != 0 || wait_state(shm()->pid0, "Tt") != 0)
        return 1;
    rc = weft_barrier(c);
    record(1, rc, 0, c);
    if (rc != WEFT_OK)
        return mp_report_rc(c, "barrier with rank 0 stopped in it", rc);
    mp_point(1); /* killed here */
    return 1;
}

Test(box, a_peer_killed_after_its_call_ended_it, .timeout = 120)
{
    struct mp_action kill_1 = {.rank = 1, .point = 1, .kind = MP_ACT_SIGKILL};
    struct mp_opts o = {.nranks = 2,
                        .timeout_ms = TIMEOUT_MS,
                        .actions = &kill_1,
                        .nactions = 1};
    struct mp_result res;
    char buf[1024];

    setenv("WEFT_SHM", "1", 1);
    cr_assert_eq(mp_run(&o, killed_after_rank, NULL, &res), 0);
    cr_assert(mp_all_passed(&res), "%s: %s", mp_describe(&res, buf, sizeof buf),
              shm()->msg[0]);
}

/* ---- weft_abort while a box call waits ---- */

struct aborter {
    weft_comm *c;
    int ms;
};

static void *abort_later(void *arg)
{
    const struct aborter *a = arg;

    mp_sleep_ms(a->ms);
    weft_abort(a->c);
    return NULL;
}

/* Rank 0's call (blocking, or posted and waited for: arg) waits in the
 * box for rank 1, which comes 2 s late; a second thread aborts rank 0's
 * communicator after 300 ms: the call returns WEFT_EABORTED then, not at
 * the deadline, and rank 1's call fails too. */
static int abort_rank(int rank, int nranks, void *arg)
{
    const int nonblocking = *(const int *)arg;
    float v[2] = {1, 2};
    struct aborter a;
    pthread_t th;
    weft_comm *c;
    double t0, dt;
    int rc, fail = 0;

    if (mp_init(&c, rank, nranks) != WEFT_OK)
        return 1;
    if ((rc = weft_barrier(c)) != WEFT_OK)
        return mp_report_rc(c, "barrier", rc);
    if (rank == 1) {
        mp_sleep_ms(2000);
        rc = weft_all_reduce(c, v, v, 2, WEFT_FLOAT32, WEFT_SUM);
        if (rc == WEFT_OK) {
            mp_log("rank 1's all_reduce returned WEFT_OK after rank 0 "
                   "aborted");
            fail = 1;
        }
        return weft_finalize(c) != WEFT_OK || fail;
    }
    a = (struct aborter){c, 300};
    if (pthread_create(&th, NULL, abort_later, &a) != 0)
        return 1;
    t0 = mp_now_ms();
    if (nonblocking) {
        weft_request *req;

        rc = weft_iall_reduce(c, v, v, 2, WEFT_FLOAT32, WEFT_SUM, &req);
        if (rc == WEFT_OK) {
            rc = weft_wait(req);
            weft_request_free(req);
        }
    } else
        rc = weft_all_reduce(c, v, v, 2, WEFT_FLOAT32, WEFT_SUM);
    dt = mp_now_ms() - t0;
    pthread_join(th, NULL);
    if (rc != WEFT_EABORTED || dt > 1500) {
        mp_log("%s all_reduce aborted after 300 ms: %s after %.0f ms (%s)",
               nonblocking ? "posted" : "blocking", weft_err_name(rc), dt,
               weft_last_error(c));
        fail = 1;
    }
    return weft_finalize(c) != WEFT_OK || fail;
}

Test(box, weft_abort_ends_a_wait_in_the_box, .timeout = 120)
{
    static const int blocking = 0, nonblocking = 1;

    run_job(2, TIMEOUT_MS, abort_rank, (void *)&blocking, "abort, blocking");
    run_job(2, TIMEOUT_MS, abort_rank, (void *)&nonblocking, "abort, posted");
}

/* ---- ranks out of step ---- */

#define STEP_ROUNDS 300

/* Rounds of a box all_reduce, a broadcast of 64 KiB (frames: a rank that
 * is not its root's neighbour... any rank may leave it before the
 * others), a barrier, and two non-blocking box all_reduces left in
 * flight across the next round; each rank naps at its own moments, so
 * ranks are often several calls apart. Every result is checked. */
static int step_rank(int rank, int nranks, void *arg)
{
    const size_t bc = 16384;
    int32_t *big = mp_alloc(bc * sizeof *big);
    int64_t a[4], nb[2][3], sum = 0;
    weft_request *req[2] = {NULL, NULL};
    weft_comm *c;
    int fail = 0, rc = WEFT_OK;

    (void)arg;
    if (mp_init(&c, rank, nranks) != WEFT_OK) {
        free(big);
        return 1;
    }
    for (int r = 0; r < nranks; r++)
        sum += r;
    srand((unsigned)rank * 7919u + 1);
    for (int it = 0; it < STEP_ROUNDS && !fail; it++) {
        const int root = it % nranks;
        char what[96];

        for (int i = 0; i < 4; i++)
            a[i] = rank + it * 10 + i;
        snprintf(what, sizeof what, "round %d: all_reduce", it);
        if ((rc = weft_all_reduce(c, a, a, 4, WEFT_INT64, WEFT_SUM)) != 0)
            fail = mp_report_rc(c, what, rc);
        for (int i = 0; !fail && i < 4; i++)
            if (a[i] != sum + (int64_t)nranks * (it * 10 + i)) {
                mp_log("%s: element %d is %lld", what, i, (long long)a[i]);
                fail = 1;
            }
        for (size_t i = 0; !fail && i < bc; i++)
            big[i] = rank == root ? (int32_t)(it + i) : -1;
        snprintf(what, sizeof what, "round %d: broadcast from %d", it, root);
        if (!fail && (rc = weft_broadcast(c, big, bc, WEFT_INT32, root)) != 0)
            fail = mp_report_rc(c, what, rc);
        for (size_t i = 0; !fail && i < bc; i++)
            if (big[i] != (int32_t)(it + i)) {
                mp_log("%s: element %zu is %d", what, i, big[i]);
                fail = 1;
            }
        /* Last round's requests, then this round's. */
        for (int q = 0; !fail && q < 2 && req[q] != NULL; q++) {
            snprintf(what, sizeof what, "round %d: iall_reduce %d", it - 1, q);
            if ((rc = weft_wait(req[q])) != 0)
                fail = mp_report_rc(c, what, rc);
            for (int i = 0; !fail && i < 3; i++)
                if (nb[q][i] != sum * (q + 1) + (int64_t)nranks * (it - 1)) {
                    mp_log("%s: element %d is %lld", what, i,
                           (long long)nb[q][i]);
                    fail = 1;
                }
            weft_request_free(req[q]);
            req[q] = NULL;
        }
        for (int q = 0; !fail && q < 2; q++) {
            for (int i = 0; i < 3; i++)
                nb[q][i] = (int64_t)rank * (q + 1) + it;
            if ((rc = weft_iall_reduce(c, nb[q], nb[q], 3, WEFT_INT64, WEFT_SUM,
                                       &req[q])) != 0)
                fail = mp_report_rc(c, "iall_reduce", rc);
        }
        if (!fail && it % 7 == 3 && (rc = weft_barrier(c)) != 0)
            fail = mp_report_rc(c, "barrier", rc);
        if (rand() % 8 == 0)
            usleep((useconds_t)(rand() % 3000));
    }
    for (int q = 0; q < 2; q++) {
        if (req[q] != NULL && (rc = weft_wait(req[q])) != 0 && !fail)
            fail = mp_report_rc(c, "last iall_reduce", rc);
        weft_request_free(req[q]);
    }
    free(big);
    return weft_finalize(c) != WEFT_OK || fail;
}

/* Non-blocking all_reduces on frames that the ranks run as one batch
 * take the numbers of all of them, more than the box's depth: a box call
 * right after must not wait for a peer to show it ended them. */
static int batch_rank(int rank, int nranks, void *arg)
{
    enum { NREQ = 12, COUNT = 64 };
    float *v = mp_alloc((size_t)NREQ * COUNT * sizeof *v);
    weft_request *req[NREQ];
    weft_comm *c;
    int fail = 0, rc;

    (void)arg;
    if (mp_init(&c, rank, nranks) != WEFT_OK) {
        free(v);
        return 1;
    }
    for (int round = 0; round < 20 && !fail; round++) {
        float s[2] = {(float)rank, 1.0f};

        for (int q = 0; q < NREQ; q++) {
            for (int i = 0; i < COUNT; i++)
                v[q * COUNT + i] = (float)(rank + q + i);
            if ((rc = weft_iall_reduce(c, v + q * COUNT, v + q * COUNT, COUNT,
                                       WEFT_FLOAT32, WEFT_SUM, &req[q])) !=
                WEFT_OK) {
                fail = mp_report_rc(c, "iall_reduce", rc);
                for (int k = 0; k < q; k++) {
                    weft_wait(req[k]);
                    weft_request_free(req[k]);
                }
                break;
            }
        }
        if (fail)
            break;
        if ((rc = weft_wait_all(req, NREQ)) != WEFT_OK)
            fail = mp_report_rc(c, "wait_all", rc);
        for (int q = 0; q < NREQ; q++)
            weft_request_free(req[q]);
        for (int q = 0; !fail && q < NREQ; q++)
            for (int i = 0; i < COUNT; i++)
                if (v[q * COUNT + i] !=
                    (float)(nranks * (nranks - 1) / 2 + nranks * (q + i))) {
                    mp_log("round %d: request %d element %d is %g", round, q, i,
                           (double)v[q * COUNT + i]);
                    fail = 1;
                    break;
                }
        if (!fail &&
            (rc = weft_all_reduce(c, s, s, 2, WEFT_FLOAT32, WEFT_SUM)) != 0)
            fail = mp_report_rc(c, "all_reduce in the box", rc);
        if (!fail && (s[0] != (float)(nranks * (nranks - 1) / 2) ||
                      s[1] != (float)nranks)) {
            mp_log("round %d: box all_reduce gave %g %g", round, (double)s[0],
                   (double)s[1]);
            fail = 1;
        }
    }
    free(v);
    return weft_finalize(c) != WEFT_OK || fail;
}

Test(box, a_batch_then_the_box, .timeout = 240)
{
    run_job(2, 10000, batch_rank, NULL, "batch then box");
    run_job(4, 10000, batch_rank, NULL, "batch then box");
}

Test(box, ranks_many_calls_apart, .timeout = 240)
{
    run_job(3, TIMEOUT_MS, step_rank, NULL, "ranks out of step");
    run_job(4, TIMEOUT_MS, step_rank, NULL, "ranks out of step");
}

/* ---- broadcast and reduce_scatter ---- */

/* A broadcast from the last rank of counts up to the box's edge and one
 * past it (frames), and a reduce_scatter whose whole input (n blocks) is
 * at the edge and one block-element past it, in place and not, with
 * canaries; every dtype, sum and max. */
static int bcast_rs_rank(int rank, int nranks, void *arg)
{
    const size_t box_bytes = *(const size_t *)arg;
    const int root = nranks - 1;
    weft_comm *c;
    int fail = 0;

    if (mp_init(&c, rank, nranks) != WEFT_OK)
        return 1;
    for (size_t d = 0; d < sizeof dtypes / sizeof dtypes[0] && !fail; d++) {
        const size_t es = weft_dtype_size(dtypes[d]);
        const size_t edge = box_bytes / es, rs_edge = edge / (size_t)nranks;
        const size_t bcounts[] = {1, edge, edge + 1};
        const size_t rcounts[] = {1, rs_edge, rs_edge + 1};

        for (size_t k = 0; k < 3 && !fail; k++) {
            const size_t n = bcounts[k], bytes = n * es;
            char *buf = mp_alloc(bytes + 2 * MP_CANARY_BYTES);
            char *want = mp_alloc(bytes);
            char *out = buf + MP_CANARY_BYTES;
            char what[128];
            int rc;

            memset(buf, MP_CANARY, bytes + 2 * MP_CANARY_BYTES);
            for (size_t i = 0; i < n; i++) {
                mp_put_value(dtypes[d], out, i, mp_small_elem(rank, i));
                mp_put_value(dtypes[d], want, i, mp_small_elem(root, i));
            }
            snprintf(what, sizeof what, "broadcast(%s, count=%zu, root %d)",
                     mp_dtype_name(dtypes[d]), n, root);
            rc = weft_broadcast(c, out, n, dtypes[d], root);
            if (rc != WEFT_OK)
                fail = mp_report_rc(c, what, rc);
            else
                fail = mp_check_elems(what, "buf", dtypes[d], out, want, n) ||
                       mp_check_canary(what, "buf", out, bytes) ||
                       mp_check_canary(what, "the bytes before buf", buf, 0);
            free(buf);
            free(want);
        }
        for (size_t k = 0; k < 6 && !fail; k++) {
            const size_t n = rcounts[k / 2], bytes = n * es;
            const size_t all = bytes * (size_t)nranks;
            const int inplace = (int)(k & 1);
            const weft_redop op = k < 2 ? WEFT_SUM : WEFT_MAX;
            char *send = mp_alloc(all);
            char *recv = mp_alloc(all + 2 * MP_CANARY_BYTES);
            char *want = mp_alloc(bytes);
            char *out = recv + MP_CANARY_BYTES;
            char *in = inplace ? out : send;
            char what[128];
            int rc;

            if (n == 0) {
                free(send);
                free(recv);
                free(want);
                continue;
            }
            memset(recv, MP_CANARY, all + 2 * MP_CANARY_BYTES);
            for (size_t i = 0; i < n * (size_t)nranks; i++)
                mp_put_value(dtypes[d], in, i, mp_small_elem(rank, i));
            for (size_t i = 0; i < n; i++)
                mp_put_value(dtypes[d], want, i,
                             mp_small_expect(op, nranks, (size_t)rank * n + i));
            snprintf(what, sizeof what, "reduce_scatter(%s, %s, count=%zu%s)",
                     mp_op_name(op), mp_dtype_name(dtypes[d]), n,
                     inplace ? ", in place" : "");
            rc = weft_reduce_scatter(c, in, out, n, dtypes[d], op);
            if (rc != WEFT_OK)
                fail = mp_report_rc(c, what, rc);
            else
                fail =
                    mp_check_elems(what, "recvbuf", dtypes[d], out, want, n) ||
                    mp_check_canary(what, "recvbuf", out,
                                    inplace ? all : bytes) ||
                    mp_check_canary(what, "the bytes before recvbuf", recv, 0);
            free(send);
            free(recv);
            free(want);
        }
    }
    return weft_finalize(c) != WEFT_OK || fail;
}

Test(box, broadcast_and_reduce_scatter_at_and_past_its_edge, .timeout = 240)
{
    run_edges(bcast_rs_rank, "box broadcast, scatter");
}

/* Ranks that name different roots: every rank reads every header in the
 * box, so every rank sees it. */
static int roots_rank(int rank, int nranks, void *arg)
{
    int32_t v[4] = {rank, rank, rank, rank};
    weft_comm *c;
    int rc;

    (void)arg;
    if (mp_init(&c, rank, nranks) != WEFT_OK)
        return 1;
    rc = weft_broadcast(c, v, 4, WEFT_INT32, rank == 0 ? 1 : 0);
    record(rank, rc, 0, c);
    return weft_finalize(c) != WEFT_OK;
}

Test(box, a_broadcast_from_different_roots_is_emismatch_on_every_rank,
     .timeout = 120)
{
    run_job(3, TIMEOUT_MS, roots_rank, NULL, "roots in the box");
    for (int r = 0; r < 3; r++)
        cr_assert(shm()->rc[r] == WEFT_EMISMATCH &&
                      strstr(shm()->msg[r], "root") != NULL,
                  "rank %d: %s (%s)", r, weft_err_name(shm()->rc[r]),
                  shm()->msg[r]);
}
