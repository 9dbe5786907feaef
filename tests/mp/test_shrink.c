/*
 * Communicators made of another's ranks (API.md, "communicators that
 * shrink"): weft_comm_shrink after a rank was SIGKILLed or SIGSTOPped, a
 * second rank (the agreement's leader among them) killed as the others
 * shrink, repeated shrinks, a shrink of a healthy communicator, and
 * weft_comm_split with several colors, keys that reorder and color < 0.
 * Every survivor checks the new communicator's size, its own rank and
 * every member's origin rank, and runs the collectives and point to point
 * on it, with results checked.
 */
#define _GNU_SOURCE
#include <criterion/criterion.h>
#include <dirent.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "harness.h"
#include "weft.h"

#define TIMEOUT_MS 1500         /* WEFT_TIMEOUT_MS: a stopped peer's wait */
#define CONNECT_TIMEOUT_MS 4000 /* also the shrink's wait for a silent rank */
#define COUNT 1000

/* A job's plan: which ranks are lost when, and how. */
struct plan {
    unsigned killed;  /* SIGKILLed right after weft_init (point 1) */
    unsigned stopped; /* SIGSTOPped there instead */
    unsigned second;  /* SIGKILLed just before calling weft_comm_shrink */
    unsigned later;   /* SIGKILLed after the first shrink (point 3) */
    int healthy;      /* nobody lost: every rank shrinks at once */
};

struct shrink_shm {
    double ms[MP_MAX_RANKS]; /* each survivor's time in weft_comm_shrink */
};

/* Runs the operations on c, whose member i was rank origin[i] of the
 * job: results checked. 0 or 1. */
static int exercise(weft_comm *c, const int *origin)
{
    int n = weft_size(c), me = weft_rank(c), rc;
    int32_t *buf = malloc(sizeof *buf * COUNT * (size_t)n);
    int32_t *all = malloc(sizeof *all * (size_t)n);
    int32_t mine = origin[me], want = 0, b;
    int bad = 0;

    if (buf == NULL || all == NULL)
        return 1;
    for (int i = 0; i < n; i++)
        want += origin[i] + 1;
    for (int i = 0; i < COUNT; i++)
        buf[i] = origin[me] + 1;
    if ((rc = weft_all_reduce(c, buf, buf, COUNT, WEFT_INT32, WEFT_SUM)) != 0)
        bad = 1, mp_log("all_reduce: %s", weft_last_error(c));
    for (int i = 0; !bad && i < COUNT; i++)
        if (buf[i] != want)
            bad = 1, mp_log("all_reduce: [%d] = %d, want %d", i, buf[i], want);
    if (!bad && (rc = weft_all_gather(c, &mine, all, 1, WEFT_INT32)) != 0)
        bad = 1, mp_log("all_gather: %s", weft_last_error(c));
    for (int i = 0; !bad && i < n; i++)
        if (all[i] != origin[i])
            bad = 1,
            mp_log("all_gather: [%d] = %d, want %d", i, all[i], origin[i]);
    b = me == n - 1 ? 12345 : -1;
    if (!bad && (rc = weft_broadcast(c, &b, 1, WEFT_INT32, n - 1)) != 0)
        bad = 1, mp_log("broadcast: %s", weft_last_error(c));
    if (!bad && b != 12345)
        bad = 1, mp_log("broadcast: got %d", b);
    if (!bad && n > 1) {
        int32_t s = origin[me], r = -1;
        rc = weft_sendrecv(c, &s, (me + 1) % n, &r, (me + n - 1) % n, 1,
                           WEFT_INT32);
        if (rc != 0 || r != origin[(me + n - 1) % n])
            bad = 1, mp_log("sendrecv: %s, got %d", weft_strerror(rc), r);
    }
    /* reduce_scatter: block i of the sum lands on member i. */
    if (!bad) {
        const int per = COUNT / n;
        int32_t *got = malloc(sizeof *got * (size_t)per), osum = want - n;

        for (int i = 0; i < per * n; i++)
            buf[i] = origin[me] + i % 3;
        rc = got == NULL ? WEFT_ENOMEM
                         : weft_reduce_scatter(c, buf, got, (size_t)per,
                                               WEFT_INT32, WEFT_SUM);
        if (rc != 0)
            bad = 1, mp_log("reduce_scatter: %s", weft_last_error(c));
        for (int j = 0; !bad && j < per; j++)
            if (got[j] != osum + n * ((me * per + j) % 3))
                bad = 1, mp_log("reduce_scatter: [%d] = %d", j, got[j]);
        free(got);
    }
    /* reduce and gather to the last member. */
    if (!bad) {
        int32_t r = origin[me], sum = -1;
        rc = weft_reduce(c, &r, &sum, 1, WEFT_INT32, WEFT_SUM, n - 1);
        if (rc == 0)
            rc = weft_gather(c, &r, all, 1, WEFT_INT32, n - 1);
        if (rc != 0)
            bad = 1, mp_log("reduce/gather: %s", weft_last_error(c));
        for (int i = 0; !bad && me == n - 1 && i < n; i++)
            if (all[i] != origin[i])
                bad = 1, mp_log("gather: [%d] = %d", i, all[i]);
        if (!bad && me == n - 1 && sum != want - n)
            bad = 1, mp_log("reduce: %d, want %d", sum, want - n);
    }
    if (!bad && (rc = weft_barrier(c)) != 0)
        bad = 1, mp_log("barrier: %s", weft_last_error(c));
    free(buf);
    free(all);
    return bad;
}

/* Checks s, made by a shrink or split, against the origin ranks it
 * should have. */
static int check_comm(weft_comm *s, const int *origin, int n, int me)
{
    if (weft_size(s) != n || weft_rank(s) != me) {
        mp_log("new communicator: rank %d of %d, want %d of %d", weft_rank(s),
               weft_size(s), me, n);
        return 1;
    }
    for (int i = 0; i < n; i++)
        if (weft_comm_origin_rank(s, i) != origin[i]) {
            mp_log("origin_rank(%d) = %d, want %d", i,
                   weft_comm_origin_rank(s, i), origin[i]);
            return 1;
        }
    if (weft_comm_origin_rank(s, n) != WEFT_EINVAL)
        return mp_log("origin_rank out of range accepted"), 1;
    return exercise(s, origin);
}

/* The ranks of nranks not in gone, in order: their count. */
static int survivors(int nranks, unsigned gone, int *out)
{
    int n = 0;

    for (int r = 0; r < nranks; r++)
        if (!(gone & (1u << r)))
            out[n++] = r;
    return n;
}

/* Waits for c to fail (a lost rank): 0 once an all_reduce failed. */
static int until_failed(weft_comm *c)
{
    int32_t x[4] = {1, 2, 3, 4};

    for (int i = 0; i < 3; i++)
        if (weft_all_reduce(c, x, x, 4, WEFT_INT32, WEFT_SUM) != 0)
            return 0;
    mp_log("the communicator did not fail");
    return 1;
}

/* Shrinks c, checks the result against the ranks left (origin ranks,
 * gone: every rank lost so far); *out gets it. */
static int shrink_checked(weft_comm *c, int nranks, unsigned gone,
                          weft_comm **out)
{
    int origin[MP_MAX_RANKS], n = survivors(nranks, gone, origin), me = -1;
    double t0 = mp_now_ms();
    int rc = weft_comm_shrink(c, out);
    struct shrink_shm *sh = mp_shm();
    int self = weft_comm_origin_rank(c, weft_rank(c));

    sh->ms[self] = mp_now_ms() - t0;
    if (rc != WEFT_OK) {
        mp_log("weft_comm_shrink: %s: %s", weft_strerror(rc),
               weft_last_error(NULL));
        return 1;
    }
    for (int i = 0; i < n; i++)
        if (origin[i] == self)
            me = i;
    if (check_comm(*out, origin, n, me) != 0)
        return 1;
    /* The old one stays failed. */
    if (weft_barrier(c) != WEFT_EABORTED)
        return mp_log("the shrunk communicator still works"), 1;
    return 0;
}

/* Sockets and shared-memory segments open in this process (libuv keeps
 * one pipe for the whole process once a loop has run: not counted). */
static int count_fds(void)
{
    DIR *d = opendir("/proc/self/fd");
    struct dirent *e;
    char path[300], target[256];
    int n = 0;

    if (d == NULL)
        return -1;
    while ((e = readdir(d)) != NULL) {
        ssize_t len;

        snprintf(path, sizeof path, "/proc/self/fd/%s", e->d_name);
        len = readlink(path, target, sizeof target - 1);
        if (len <= 0)
            continue;
        target[len] = '\0';
        if (strncmp(target, "socket:", 7) == 0 ||
            strstr(target, "memfd:") != NULL ||
            strstr(target, "/dev/shm") != NULL)
            n++;
    }
    closedir(d);
    return n;
}

/* After every communicator was finalized: no thread of weft's and no
 * descriptor left (fds: the count before weft_init). 0 or 1. */
static int nothing_left(int fds)
{
    int threads = mp_threads_settle(1, 2000), now = count_fds();

    if (threads != 1 || now != fds) {
        mp_log("left behind: %d threads (want 1), %d sockets and segments "
               "(want %d)",
               threads, now, fds);
        return 1;
    }
    return 0;
}

static int shrink_rank(int rank, int nranks, void *arg)
{
    const struct plan *p = arg;
    weft_comm *c = NULL, *s = NULL, *s2 = NULL;
    unsigned gone = p->killed | p->stopped | p->second;
    int bad = 0;

    int fds = count_fds();

    if (mp_init(&c, rank, nranks) != WEFT_OK)
        return 1;
    if ((p->killed | p->stopped) & (1u << rank))
        mp_point(1);
    if (!p->healthy)
        bad = until_failed(c);
    if (!bad && (p->second & (1u << rank)))
        mp_point(2);
    if (!bad)
        bad = shrink_checked(c, nranks, gone, &s);
    if (!bad && p->later) {
        /* A second loss, on the shrunk communicator: shrink again. */
        if (p->later & (1u << rank))
            mp_point(3);
        bad =
            until_failed(s) || shrink_checked(s, nranks, gone | p->later, &s2);
    }
    weft_finalize(s2);
    weft_finalize(s);
    weft_finalize(c);
    return bad || nothing_left(fds);
}

static void run_layout(int nranks, const struct plan *p, int shm,
                       enum mp_layout layout, const char *what)
{
    struct mp_action acts[MP_MAX_RANKS * 2];
    struct mp_opts o = {
        .nranks = nranks,
        .timeout_ms = TIMEOUT_MS,
        .connect_timeout_ms = CONNECT_TIMEOUT_MS,
        .deadline_ms = 60000,
        .actions = acts,
        .linger_mask = p->stopped,
        .layout = layout,
    };
    struct mp_result res;
    char buf[2048];
    const struct shrink_shm *sh = mp_shm();

    setenv("WEFT_SHM", shm ? "1" : "0", 1);
    for (int r = 0; r < nranks; r++) {
        if ((p->killed | p->stopped) & (1u << r))
            acts[o.nactions++] = (struct mp_action){
                r, 1,
                (p->stopped & (1u << r)) ? MP_ACT_SIGSTOP : MP_ACT_SIGKILL};
        if (p->second & (1u << r))
            acts[o.nactions++] = (struct mp_action){r, 2, MP_ACT_SIGKILL};
        if (p->later & (1u << r))
            acts[o.nactions++] = (struct mp_action){r, 3, MP_ACT_SIGKILL};
    }
    cr_assert_eq(mp_run(&o, shrink_rank, (void *)p, &res), 0);
    cr_assert(mp_all_passed(&res), "%s: %s", what,
              mp_describe(&res, buf, sizeof buf));
    for (int r = 0; r < nranks; r++)
        if (!res.rank[r].by_action && !res.rank[r].lingered)
            cr_log_info("%s: rank %d shrank in %.1f ms", what, r, sh->ms[r]);
}

static void run(int nranks, const struct plan *p, int shm, const char *what)
{
    run_layout(nranks, p, shm, MP_LAYOUT_ONE_HOST, what);
}

/* Hosts of two ranks, a cable between every two (TCP between hosts,
 * shared memory within): a host's last rank killed, then the rank beside
 * it, so that a host is lost. */
Test(shrink, hosts_pairs, .timeout = 60)
{
    struct plan p = {.killed = 1u << 3, .later = 1u << 2};
    run_layout(6, &p, 1, MP_LAYOUT_PAIRS, "3 hosts of 2, rank 3 then 2 killed");
}

/* One rank per host in a ring of 4 hosts: a host lost leaves a chain,
 * whose step from host 1 to host 3 runs through host 0; then host 3 is
 * lost too, and the two left shrink again (over their cable). */
Test(shrink, ring_host_lost, .timeout = 60)
{
    struct plan p = {.killed = 1u << 2, .later = 1u << 3};
    run_layout(4, &p, 1, MP_LAYOUT_RING, "a ring of 4 hosts, host 2 lost");
}

Test(shrink, killed_shm, .timeout = 60)
{
    struct plan p = {.killed = 1u << 2};
    run(4, &p, 1, "4 ranks, rank 2 killed, shared memory");
}

Test(shrink, killed_tcp, .timeout = 60)
{
    struct plan p = {.killed = 1u << 1};
    run(3, &p, 0, "3 ranks, rank 1 killed, TCP");
}

/* Rank 0, which would lead the agreement, is killed; and 8 ranks. */
Test(shrink, leader_killed_8, .timeout = 60)
{
    struct plan p = {.killed = 1u << 0};
    run(8, &p, 1, "8 ranks, rank 0 killed");
}

/* A stopped rank is out once the connect deadline passed. */
Test(shrink, stopped, .timeout = 60)
{
    struct plan p = {.stopped = 1u << 3};
    run(4, &p, 1, "4 ranks, rank 3 stopped");
}

/* A second rank dies as the others shrink: the leader, and another. */
Test(shrink, second_death_leader, .timeout = 60)
{
    struct plan p = {.killed = 1u << 3, .second = 1u << 0};
    run(5, &p, 1, "5 ranks, rank 3 killed, rank 0 as the others shrink");
}

Test(shrink, second_death_member, .timeout = 60)
{
    struct plan p = {.killed = 1u << 1, .second = 1u << 4};
    run(5, &p, 0, "5 ranks, rank 1 killed, rank 4 as the others shrink");
}

/* 6 -> 5 -> 4. */
Test(shrink, repeated, .timeout = 60)
{
    struct plan p = {.killed = 1u << 5, .later = 1u << 1};
    run(6, &p, 1, "6 ranks, rank 5 killed, then rank 1");
}

/* Nobody lost: the same ranks, in the same order. */
Test(shrink, healthy, .timeout = 60)
{
    struct plan p = {.healthy = 1};
    run(3, &p, 1, "3 ranks, healthy");
}

/* ---- split ---- */

/* Colors rank % 3 (rank 0: -1, no group), keys that reverse the order
 * within each color; then a split of the split, and the parent still
 * works. */
static int split_rank(int rank, int nranks, void *arg)
{
    weft_comm *c = NULL, *s = NULL, *t = NULL;
    int color = rank == 0 ? -1 : rank % 3, origin[MP_MAX_RANKS], n = 0, me = -1;
    int bad = 0, rc;

    int fds = count_fds();

    (void)arg;
    if (mp_init(&c, rank, nranks) != WEFT_OK)
        return 1;
    if ((rc = weft_comm_split(c, color, nranks - rank, &s)) != WEFT_OK) {
        mp_log("weft_comm_split: %s", weft_last_error(c));
        bad = 1;
    }
    if (!bad && color < 0 && s != NULL)
        bad = 1, mp_log("color -1 gave a communicator");
    if (!bad && color >= 0) {
        for (int r = nranks - 1; r >= 1; r--)
            if (r % 3 == color) {
                if (r == rank)
                    me = n;
                origin[n++] = r;
            }
        bad = check_comm(s, origin, n, me);
    }
    /* A split of the split: halves by new rank, in order. */
    if (!bad && s != NULL) {
        int h = weft_rank(s) < (n + 1) / 2 ? 0 : 1, o2[MP_MAX_RANKS], m = 0;
        int me2 = -1;

        if ((rc = weft_comm_split(s, h, 0, &t)) != WEFT_OK)
            bad = 1, mp_log("split of split: %s", weft_last_error(s));
        for (int i = 0; i < n; i++)
            if ((i < (n + 1) / 2 ? 0 : 1) == h) {
                if (i == weft_rank(s))
                    me2 = m;
                o2[m++] = origin[i];
            }
        if (!bad)
            bad = check_comm(t, o2, m, me2);
    }
    if (!bad) {
        int all[MP_MAX_RANKS];
        for (int i = 0; i < nranks; i++)
            all[i] = i;
        bad = exercise(c, all); /* the parent still works */
    }
    weft_finalize(t);
    weft_finalize(s);
    weft_finalize(c);
    return bad || nothing_left(fds);
}

static void run_split(int nranks, int shm, const char *what)
{
    struct mp_opts o = {
        .nranks = nranks,
        .timeout_ms = 10000,
        .connect_timeout_ms = 10000,
        .deadline_ms = 60000,
    };
    struct mp_result res;
    char buf[2048];

    setenv("WEFT_SHM", shm ? "1" : "0", 1);
    cr_assert_eq(mp_run(&o, split_rank, NULL, &res), 0);
    cr_assert(mp_all_passed(&res), "%s: %s", what,
              mp_describe(&res, buf, sizeof buf));
}

Test(split, colors_keys_shm, .timeout = 60)
{
    run_split(7, 1, "7 ranks, shared memory");
}

Test(split, colors_keys_tcp, .timeout = 60)
{
    run_split(5, 0, "5 ranks, TCP");
}
