/*
 * The contract as programs written against API.md alone test it (issue 10):
 * calls that do not match across ranks, relayed point to point checked as
 * direct, messages that explain their code, peers that left before a send,
 * one deadline per call however many passes it takes, and a new
 * communicator formed while a peer still holds its old one.
 *
 * The only timing these tests rely on is the deadline: a call must return
 * by its deadline plus LATE_MS; sleeps only put ranks in the order a case
 * needs (a late rank arrives seconds after the others gave up).
 */
#define _GNU_SOURCE
#include <criterion/criterion.h>
#include <criterion/parameterized.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "harness.h"
#include "weft.h"

#define JOB_DEADLINE_MS 60000
/* How far past its deadline a call may return: 5% and 50 ms. */
#define LATE_MS(deadline) ((deadline) / 20 + 50)

struct contract_shm {
    int rc[MP_MAX_RANKS][4];
    double ms[MP_MAX_RANKS][4];
    int done[MP_MAX_RANKS];
    char msg[MP_MAX_RANKS][256];
};

static struct contract_shm *shm(void)
{
    return mp_shm();
}

static void record(int rank, int slot, int rc, double ms, const weft_comm *c)
{
    shm()->rc[rank][slot] = rc;
    shm()->ms[rank][slot] = ms;
    if (rc != WEFT_OK && c != NULL)
        snprintf(shm()->msg[rank], sizeof shm()->msg[rank], "%s",
                 weft_last_error(c));
}

static void assert_passed(const struct mp_result *res, const char *what)
{
    char buf[1024];
    cr_assert(mp_all_passed(res), "%s: %s", what,
              mp_describe(res, buf, sizeof buf));
}

/* Does msg explain code rc? A mismatch must say what differed, a lost
 * peer that it closed or reset, a deadline that it passed: never a
 * consequence of the cause (issue 10, item 5). */
static int msg_explains(int rc, const char *msg)
{
    switch (rc) {
    case WEFT_EMISMATCH:
        return strstr(msg, "called") != NULL || strstr(msg, "header") != NULL ||
               strstr(msg, "message of") != NULL;
    case WEFT_EPEER:
        return strstr(msg, "closed") != NULL || strstr(msg, "reset") != NULL;
    case WEFT_ETIMEDOUT:
        /* "timed out" and " timeout ": what tools (torch's tests among
         * them) look for in a timeout's message. */
        return strstr(msg, "deadline") != NULL &&
               strstr(msg, "timed out") != NULL &&
               strstr(msg, " timeout ") != NULL;
    default:
        return 1;
    }
}

static int check_msg(const weft_comm *c, const char *what, int rc)
{
    const char *msg = weft_last_error(c);
    if (rc == WEFT_OK || msg_explains(rc, msg))
        return 0;
    mp_log("%s returned %s but weft_last_error says: %s", what,
           weft_err_name(rc), msg);
    return 1;
}

/* Runs a job whose ranks check a timing bound (mp_run_timed): only a late
 * call that the process had the time to avoid fails. */
static void run_timed(const struct mp_opts *o, mp_rank_fn fn, void *arg,
                      struct mp_result *res, const char *what)
{
    cr_assert_eq(mp_run_timed(o, fn, arg, res, what), 0);
    assert_passed(res, what);
}

static int finalize(weft_comm *c)
{
    int rc = weft_finalize(c);
    if (rc != WEFT_OK)
        mp_log("weft_finalize returned %s", weft_err_name(rc));
    return rc != WEFT_OK;
}

/* ---- item 3: mismatched broadcast roots ---- */

struct layout_case {
    int nranks;
    enum mp_layout layout;
    char topology[8]; /* WEFT_TOPOLOGY (an array: Criterion copies the
                         parameters into another process) */
};

static const char *layout_name(const struct layout_case *lc)
{
    static char buf[64];
    snprintf(buf, sizeof buf, "%d ranks, %s, topology %s", lc->nranks,
             lc->layout == MP_LAYOUT_ONE_HOST ? "one host"
             : lc->layout == MP_LAYOUT_RING   ? "hosts in a ring"
                                              : "hosts in a mesh",
             lc->topology);
    return buf;
}

#define BC_COUNT 1000

/* Rank 0 broadcasts from root 0 while every other rank names root 1; then
 * every rank broadcasts from root 0. No rank may return WEFT_OK with data
 * other than the root it named had, and the first call must not succeed
 * everywhere. */
static int root_mismatch_rank(int rank, int nranks, void *arg)
{
    (void)arg;
    weft_comm *c;
    if (mp_init(&c, rank, nranks) != WEFT_OK)
        return 1;
    int32_t *buf = mp_alloc(BC_COUNT * 4), *exp = mp_alloc(BC_COUNT * 4);
    int root = rank == 0 ? 0 : 1, fail = 0;
    for (int i = 0; i < BC_COUNT; i++)
        buf[i] = 100 * rank + i;
    for (int i = 0; i < BC_COUNT; i++)
        exp[i] = 100 * root + i;
    double t0 = mp_now_ms();
    int rc = weft_broadcast(c, buf, BC_COUNT, WEFT_INT32, root);
    record(rank, 0, rc, mp_now_ms() - t0, c);
    if (rc == WEFT_OK)
        fail |= mp_check_elems("broadcast(root named by this rank)", "buf",
                               WEFT_INT32, buf, exp, BC_COUNT);
    fail |= check_msg(c, "broadcast with mismatched roots", rc);

    /* A second broadcast, the same on every rank: a byte left over from
     * the first must never pass for its data. */
    for (int i = 0; i < BC_COUNT; i++)
        buf[i] = rank == 0 ? 7000 + i : -1;
    for (int i = 0; i < BC_COUNT; i++)
        exp[i] = 7000 + i;
    t0 = mp_now_ms();
    rc = weft_broadcast(c, buf, BC_COUNT, WEFT_INT32, 0);
    record(rank, 1, rc, mp_now_ms() - t0, c);
    if (rc == WEFT_OK)
        fail |= mp_check_elems("second broadcast(root 0)", "buf", WEFT_INT32,
                               buf, exp, BC_COUNT);
    fail |= check_msg(c, "the broadcast after the mismatch", rc);
    free(buf);
    free(exp);
    return finalize(c) || fail;
}

static void run_root_mismatch(const struct layout_case *lc)
{
    setenv("WEFT_TOPOLOGY", lc->topology, 1);
    struct mp_opts o = {
        .nranks = lc->nranks,
        .layout = lc->layout,
        .timeout_ms = 3000,
        .connect_timeout_ms = 20000,
        .deadline_ms = JOB_DEADLINE_MS,
    };
    struct mp_result res;
    cr_assert_eq(mp_run(&o, root_mismatch_rank, NULL, &res), 0);
    unsetenv("WEFT_TOPOLOGY");
    assert_passed(&res, layout_name(lc));
    int all_ok = 1;
    for (int r = 0; r < lc->nranks; r++) {
        all_ok &= shm()->rc[r][0] == WEFT_OK;
        cr_assert(
            shm()->rc[r][0] == WEFT_OK || shm()->rc[r][0] == WEFT_EMISMATCH ||
                shm()->rc[r][0] == WEFT_EPEER ||
                shm()->rc[r][0] == WEFT_ETIMEDOUT,
            "%s: rank %d's mismatched broadcast returned %s (%s)",
            layout_name(lc), r, weft_err_name(shm()->rc[r][0]), shm()->msg[r]);
    }
    cr_assert(!all_ok,
              "%s: every rank returned WEFT_OK from broadcasts with "
              "different roots",
              layout_name(lc));
    /* Rank 0 and rank 1 each named themselves root: they disagree with a
     * neighbour in any layout, so both must see it. */
    cr_assert(shm()->rc[0][0] != WEFT_OK && shm()->rc[1][0] != WEFT_OK,
              "%s: rank 0 got %s and rank 1 %s: the roots' disagreement "
              "went unnoticed",
              layout_name(lc), weft_err_name(shm()->rc[0][0]),
              weft_err_name(shm()->rc[1][0]));
}

ParameterizedTestParameters(matching, broadcast_root_mismatch)
{
    static struct layout_case cases[] = {
        {2, MP_LAYOUT_ONE_HOST, "ring"}, {3, MP_LAYOUT_ONE_HOST, "ring"},
        {4, MP_LAYOUT_ONE_HOST, "ring"}, {2, MP_LAYOUT_ONE_HOST, "mesh"},
        {3, MP_LAYOUT_ONE_HOST, "mesh"}, {4, MP_LAYOUT_ONE_HOST, "mesh"},
        {3, MP_LAYOUT_MESH, "auto"},     {4, MP_LAYOUT_MESH, "auto"},
        {4, MP_LAYOUT_RING, "auto"},     {5, MP_LAYOUT_RING, "auto"},
    };
    return cr_make_param_array(struct layout_case, cases,
                               sizeof cases / sizeof cases[0]);
}

ParameterizedTest(struct layout_case *lc, matching, broadcast_root_mismatch,
                  .timeout = 120)
{
    run_root_mismatch(lc);
}

/* ---- item 5: the message explains the code ---- */

/* Rank 0 calls all_reduce with one element more than the others (or
 * another dtype). Rank 1 comes 300 ms late, when the others have found the
 * mismatch and closed their wires: its first look at the wires finds rank
 * 0's header and the others' closes together, and whatever it returns,
 * weft_last_error must explain that code (a mismatch must say what
 * differed, never "peer 2 closed wire 0"). */
static int count_mismatch_rank(int rank, int nranks, void *arg)
{
    int variant = *(const int *)arg;
    weft_comm *c;
    if (mp_init(&c, rank, nranks) != WEFT_OK)
        return 1;
    if (rank == 1)
        mp_sleep_ms(300);
    size_t count = 64 + (rank == 0 && variant == 0 ? 1 : 0);
    weft_dtype dt = rank == 0 && variant == 1 ? WEFT_FLOAT32 : WEFT_INT32;
    int32_t buf[80] = {0};
    double t0 = mp_now_ms();
    int rc = weft_all_reduce(c, buf, buf, count, dt, WEFT_SUM);
    record(rank, 0, rc, mp_now_ms() - t0, c);
    int fail = check_msg(c, "all_reduce with mismatched arguments", rc);
    if (rc == WEFT_OK) {
        mp_log("all_reduce with mismatched %s returned WEFT_OK",
               variant == 0 ? "counts" : "dtypes");
        fail = 1;
    }
    return finalize(c) || fail;
}

Test(matching, message_explains_code, .timeout = 240)
{
    for (int run = 0; run < 16; run++) {
        int variant = run % 2;
        struct mp_opts o = {
            .nranks = 3 + run % 2,
            .timeout_ms = 3000,
            .connect_timeout_ms = 20000,
            .deadline_ms = JOB_DEADLINE_MS,
        };
        struct mp_result res;
        setenv("WEFT_TOPOLOGY", run % 4 < 2 ? "ring" : "mesh", 1);
        cr_assert_eq(mp_run(&o, count_mismatch_rank, &variant, &res), 0);
        unsetenv("WEFT_TOPOLOGY");
        assert_passed(&res, "mismatched all_reduce");
    }
}

/* ---- mid-size all_reduce among one host's ranks ----
 *
 * Recursive halving + doubling (the mid sizes where every pair of ranks
 * is wired): one rank calls with one element more, or with another dtype
 * of the same size. The ranks paired with it see WEFT_EMISMATCH at once;
 * every other rank's result depends on theirs, so none may return WEFT_OK
 * (that would be wrong data), and each says why it failed. The odd rank
 * is rank 0 (at 5 ranks, the one that folds into rank 1) or the last. */
struct halving_mismatch {
    int nranks;
    int odd_rank;
    int dtype; /* 0: the counts differ; 1: the dtypes */
};

static int halving_mismatch_rank(int rank, int nranks, void *arg)
{
    const struct halving_mismatch *hm = arg;
    const int odd = rank == hm->odd_rank;
    /* 16 KiB per rank: past the small path at 5 and 8 ranks, within
     * recursive halving + doubling. */
    size_t count = 4096 + (odd && !hm->dtype ? 1 : 0);
    weft_dtype dt = odd && hm->dtype ? WEFT_FLOAT32 : WEFT_INT32;
    int32_t *buf = calloc(4097, sizeof *buf);
    weft_comm *c;
    int fail;

    if (buf == NULL || mp_init(&c, rank, nranks) != WEFT_OK) {
        free(buf);
        return 1;
    }
    double t0 = mp_now_ms();
    int rc = weft_all_reduce(c, buf, buf, count, dt, WEFT_SUM);
    record(rank, 0, rc, mp_now_ms() - t0, c);
    fail = check_msg(c, "mid-size all_reduce with mismatched arguments", rc);
    free(buf);
    return finalize(c) || fail;
}

/* Runs a job of nranks placed as layout says, whose ranks (fn) call with
 * mismatched arguments: every rank process passes (job names it), no rank
 * returned WEFT_OK (each a mismatch, a peer's leaving or the deadline),
 * and one saw the mismatch. what names the case in the messages. */
static void run_mismatch_job(int nranks, enum mp_layout layout, mp_rank_fn fn,
                             void *arg, const char *job, const char *what)
{
    struct mp_opts o = {
        .nranks = nranks,
        .layout = layout,
        .timeout_ms = 5000,
        .connect_timeout_ms = 20000,
        .deadline_ms = JOB_DEADLINE_MS,
    };
    struct mp_result res;
    int mismatch = 0;

    cr_assert_eq(mp_run(&o, fn, arg, &res), 0);
    assert_passed(&res, job);

    for (int r = 0; r < nranks; r++) {
        int rc = shm()->rc[r][0];

        mismatch |= rc == WEFT_EMISMATCH;
        cr_assert(rc == WEFT_EMISMATCH || rc == WEFT_EPEER ||
                      rc == WEFT_ETIMEDOUT,
                  "%s: rank %d returned %s (%s)", what, r, weft_err_name(rc),
                  shm()->msg[r]);
    }
    cr_assert(mismatch, "%s: no rank returned WEFT_EMISMATCH", what);
}

Test(matching, halving_all_reduce_mismatch, .timeout = 120)
{
    static const struct halving_mismatch cases[] = {
        {5, 0, 0}, {5, 4, 1}, {8, 7, 0}, {8, 0, 1}, {6, 2, 0},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        const struct halving_mismatch *hm = &cases[i];
        char what[128];

        snprintf(what, sizeof what, "%d ranks, rank %d's %s differs",
                 hm->nranks, hm->odd_rank, hm->dtype ? "dtype" : "count");
        setenv("WEFT_TOPOLOGY", "auto", 1);
        run_mismatch_job(hm->nranks, MP_LAYOUT_ONE_HOST, halving_mismatch_rank,
                         (void *)hm, "mismatched mid-size all_reduce", what);
        unsetenv("WEFT_TOPOLOGY");
    }
}

/* ---- hierarchical all_reduce (hosts of two ranks each) ----
 *
 * The same mismatches where all_reduce runs within the hosts, across them
 * and within them again: with every rank on the hierarchical path (from
 * 0 bytes), and with only the odd rank on it (from 16388 bytes: its one
 * more element crosses it, so it runs the hierarchical phases while the
 * others run the flat algorithm). No rank may return WEFT_OK, and one must
 * see the mismatch. */
struct hier_mismatch {
    struct halving_mismatch hm;
    const char *threshold; /* the hierarchical algorithm from these bytes */
    const char *topology;
};

Test(matching, hier_all_reduce_mismatch, .timeout = 120)
{
    /* WEFT_ALGO: all_reduce's default rows (weft_info's) with the
     * hierarchical one's from the threshold; the gather after it (128 KiB
     * gathered under the mesh, 32 KiB around the ring) takes what the
     * hierarchical algorithm does not. */
    static const struct {
        struct halving_mismatch hm;
        const char *algo;
        const char *topology;
    } cases[] = {
        {{4, 0, 0}, "all_reduce:0-=hier,0-32k=gather,0-=mesh", "auto"},
        {{4, 3, 1}, "all_reduce:0-=hier,0-8k=gather,0-=ring", "ring"},
        {{6, 2, 0}, "all_reduce:0-=hier,0-21845=gather,0-=mesh", "auto"},
        {{6, 5, 1}, "all_reduce:0-=hier,0-5461=gather,0-=ring", "ring"},
        {{4, 1, 0}, "all_reduce:16388-=hier,0-32k=gather,0-=mesh", "auto"},
        {{6, 4, 0}, "all_reduce:16388-=hier,0-5461=gather,0-=ring", "ring"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        const struct halving_mismatch *hm = &cases[i].hm;
        char what[128];

        snprintf(what, sizeof what,
                 "case %zu: %d ranks in hosts of 2, rank %d's %s differs", i,
                 hm->nranks, hm->odd_rank, hm->dtype ? "dtype" : "count");
        setenv("WEFT_TOPOLOGY", cases[i].topology, 1);
        setenv("WEFT_ALGO", cases[i].algo, 1);
        run_mismatch_job(hm->nranks, MP_LAYOUT_PAIRS, halving_mismatch_rank,
                         (void *)hm, "mismatched hierarchical all_reduce",
                         what);
        unsetenv("WEFT_TOPOLOGY");
        unsetenv("WEFT_ALGO");
    }
}

/* ---- hierarchical all_gather, reduce_scatter and broadcast ----
 *
 * The same for the operations that run hierarchically by block size
 * (all_gather, reduce_scatter) or buffer size (broadcast: the ring's
 * chain where the mesh is in effect), from the threshold on (WEFT_ALGO):
 * every rank on the hierarchical path (0), or only the odd rank (16388:
 * its 4097 int32s cross it, the others' 4096 do not). */
enum { HIER_SCATTER, HIER_GATHER, HIER_BCAST };
static const char *const hier_op_names[] = {"reduce_scatter", "all_gather",
                                            "broadcast"};

struct hier_op_mismatch {
    struct hier_mismatch h;
    int op; /* HIER_* */
};

static int hier_op_mismatch_rank(int rank, int nranks, void *arg)
{
    const struct hier_op_mismatch *m = arg;
    const struct halving_mismatch *hm = &m->h.hm;
    const int odd = rank == hm->odd_rank;
    size_t count = 4096 + (odd && !hm->dtype ? 1 : 0);
    weft_dtype dt = odd && hm->dtype ? WEFT_FLOAT32 : WEFT_INT32;
    /* all_gather's recvbuf, reduce_scatter's sendbuf; the block after. */
    int32_t *all = calloc(4097 * (size_t)(nranks + 1), sizeof *all);
    int32_t *blk = all + 4097 * (size_t)nranks;
    char msg[64];
    weft_comm *c;
    int fail, rc;

    if (all == NULL || mp_init(&c, rank, nranks) != WEFT_OK) {
        free(all);
        return 1;
    }
    double t0 = mp_now_ms();
    rc = m->op == HIER_GATHER ? weft_all_gather(c, blk, all, count, dt)
         : m->op == HIER_SCATTER
             ? weft_reduce_scatter(c, all, blk, count, dt, WEFT_SUM)
             : weft_broadcast(c, blk, count, dt, 0);
    record(rank, 0, rc, mp_now_ms() - t0, c);
    snprintf(msg, sizeof msg, "%s with mismatched arguments",
             hier_op_names[m->op]);
    fail = check_msg(c, msg, rc);
    free(all);
    return finalize(c) || fail;
}

/* Runs m's case on WEFT_TOPOLOGY m->h.topology with WEFT_ALGO algo, and
 * each of vars (a NULL-ended list) set to m->h.threshold, for that run
 * only. */
static void run_hier_op_mismatch(const struct hier_op_mismatch *m,
                                 const char *algo, const char *const *vars,
                                 const char *job, const char *what)
{
    setenv("WEFT_TOPOLOGY", m->h.topology, 1);
    setenv("WEFT_ALGO", algo, 1);
    for (const char *const *v = vars; *v != NULL; v++)
        setenv(*v, m->h.threshold, 1);
    run_mismatch_job(m->h.hm.nranks, MP_LAYOUT_PAIRS, hier_op_mismatch_rank,
                     (void *)m, job, what);
    unsetenv("WEFT_TOPOLOGY");
    unsetenv("WEFT_ALGO");
    for (const char *const *v = vars; *v != NULL; v++)
        unsetenv(*v);
}

Test(matching, hier_gather_scatter_bcast_mismatch, .timeout = 240)
{
    static const struct hier_mismatch hcases[] = {
        {{4, 0, 0}, "0", "auto"},
        {{6, 5, 1}, "0", "ring"},
        {{4, 1, 0}, "16388", "auto"},
        {{6, 4, 0}, "16388", "ring"},
    };
    static const char *const none[] = {NULL};
    for (size_t i = 0; i < 3 * sizeof hcases / sizeof hcases[0]; i++) {
        const struct hier_op_mismatch m = {hcases[i / 3], (int)(i % 3)};
        const struct halving_mismatch *hm = &m.h.hm;
        const char *const t = m.h.threshold;
        char what[160], algo[128];

        /* On the ring topology broadcast is the flat chain at every size
         * (the threshold picks between it and the mesh's): the ranks that
         * meet the odd one fail, but the root, which only sends to its
         * two neighbours, may complete, its buffer untouched. */
        if (m.op == HIER_BCAST && strcmp(m.h.topology, "ring") == 0)
            continue;

        snprintf(what, sizeof what,
                 "%s, case %zu: %d ranks in hosts of 2, rank %d's %s differs",
                 hier_op_names[m.op], i / 3, hm->nranks, hm->odd_rank,
                 hm->dtype ? "dtype" : "count");
        /* (Around the ring, broadcast is the ring's chain at every size
         * anyway.) */
        snprintf(algo, sizeof algo,
                 "all_gather:%s-=hier;reduce_scatter:%s-=hier;"
                 "broadcast:%s-=ring",
                 t, t, t);
        run_hier_op_mismatch(&m, algo, none,
                             "mismatched hierarchical all_gather, "
                             "reduce_scatter or broadcast",
                             what);
    }
}

/* The same where the hierarchical all_gather and reduce_scatter (at every
 * size) move data within the hosts by one-copy reads
 * (WEFT_HIER_PULL_*_BYTES, with threads to read: WEFT_PULL_THREADS):
 * every rank reads (16384), or only the odd rank (16388), which then
 * publishes its buffers where its host's other rank sends frames. */
Test(matching, hier_gather_scatter_by_reads_mismatch, .timeout = 240)
{
    static const struct hier_mismatch hcases[] = {
        {{4, 0, 0}, "16384", "auto"},
        {{6, 5, 1}, "16384", "ring"},
        {{4, 1, 0}, "16388", "auto"},
        {{6, 4, 0}, "16388", "ring"},
    };
    static const char *const vars[] = {"WEFT_HIER_PULL_ALL_GATHER_BYTES",
                                       "WEFT_HIER_PULL_REDUCE_SCATTER_BYTES",
                                       NULL};
    setenv("WEFT_SHM", "1", 1);
    setenv("WEFT_PULL_THREADS", "2", 1);
    for (size_t i = 0; i < 2 * sizeof hcases / sizeof hcases[0]; i++) {
        const struct hier_op_mismatch m = {hcases[i / 2], (int)(i % 2)};
        const struct halving_mismatch *hm = &m.h.hm;
        char what[160];

        snprintf(what, sizeof what,
                 "%s by reads from %s bytes, case %zu: %d ranks in hosts "
                 "of 2, rank %d's %s differs",
                 hier_op_names[m.op], m.h.threshold, i / 2, hm->nranks,
                 hm->odd_rank, hm->dtype ? "dtype" : "count");
        run_hier_op_mismatch(&m, "all_gather:0-=hier;reduce_scatter:0-=hier",
                             vars,
                             "mismatched hierarchical all_gather or "
                             "reduce_scatter by reads",
                             what);
    }
    unsetenv("WEFT_SHM");
    unsetenv("WEFT_PULL_THREADS");
}

/* ---- item 4: relayed point to point is matched as direct ---- */

struct relay_case {
    weft_dtype send_dt, recv_dt;
    size_t send_count, recv_count;
    int dst; /* 2: relayed (no link from 0 to 2); 1: direct */
};

/* Rank 0 sends to dst, dst receives with other arguments. The other ranks
 * relay only while inside a weft call: each waits in a receive from rank 0
 * (which never sends) for 1.5 s, and rank 0 stays until dst is done. */
static int relay_mismatch_rank(int rank, int nranks, void *arg)
{
    const struct relay_case *rc_ = arg;
    weft_comm *c;
    if (mp_init(&c, rank, nranks) != WEFT_OK)
        return 1;
    int fail = 0, rc;
    uint8_t buf[4096];
    memset(buf, 0x5a, sizeof buf);
    double t0 = mp_now_ms();
    if (rank == 0) {
        rc = weft_send(c, buf, rc_->send_count, rc_->send_dt, rc_->dst);
        record(rank, 0, rc, mp_now_ms() - t0, c);
        while (!shm()->done[rc_->dst] && mp_now_ms() - t0 < 10000)
            mp_sleep_ms(5);
    } else if (rank == rc_->dst) {
        rc = weft_recv(c, buf, rc_->recv_count, rc_->recv_dt, 0);
        record(rank, 0, rc, mp_now_ms() - t0, c);
        fail |= check_msg(c, "recv with mismatched arguments", rc);
        shm()->done[rank] = 1;
    } else {
        /* Any result: this call only keeps the rank relaying. */
        weft_set_timeout(c, 1500);
        (void)weft_recv(c, buf, 1, WEFT_UINT8, 0);
    }
    return finalize(c) || fail;
}

static void run_relay_mismatch(const struct relay_case *rc_)
{
    struct mp_opts o = {
        .nranks = 4,
        .layout = MP_LAYOUT_RING,
        .timeout_ms = 3000,
        .connect_timeout_ms = 20000,
        .deadline_ms = JOB_DEADLINE_MS,
    };
    struct mp_result res;
    cr_assert_eq(mp_run(&o, relay_mismatch_rank, (void *)rc_, &res), 0);
    assert_passed(&res, "relayed send/recv");
    int got = shm()->rc[rc_->dst][0];
    cr_assert_eq(got, WEFT_EMISMATCH,
                 "recv of %zu %s from rank 0 (%s) met a send of %zu %s: "
                 "returned %s (%s), expected WEFT_EMISMATCH",
                 rc_->recv_count,
                 rc_->recv_dt == WEFT_INT32 ? "int32" : "other",
                 rc_->dst == 2 ? "relayed" : "direct", rc_->send_count,
                 rc_->send_dt == WEFT_INT32 ? "int32" : "other",
                 weft_err_name(got), shm()->msg[rc_->dst]);
}

Test(relay, dtype_mismatch_relayed, .timeout = 60)
{
    struct relay_case rc_ = {WEFT_INT32, WEFT_FLOAT32, 16, 16, 2};
    run_relay_mismatch(&rc_);
}

Test(relay, dtype_mismatch_direct, .timeout = 60)
{
    struct relay_case rc_ = {WEFT_INT32, WEFT_FLOAT32, 16, 16, 1};
    run_relay_mismatch(&rc_);
}

Test(relay, count_mismatch_same_bytes_relayed, .timeout = 60)
{
    /* 16 int32 against 64 uint8: the same bytes, a different call. */
    struct relay_case rc_ = {WEFT_INT32, WEFT_UINT8, 16, 64, 2};
    run_relay_mismatch(&rc_);
}

/* ---- item 6: a send to a peer that has gone ---- */

/* Rank 1 leaves (finalizing, or exiting with bytes unread so that its
 * kernel resets the connection); rank 0 sends to it later. */
static int gone_peer_rank(int rank, int nranks, void *arg)
{
    int reset = *(const int *)arg;
    weft_comm *c;
    if (mp_init(&c, rank, nranks) != WEFT_OK)
        return 1;
    uint8_t buf[1024] = {0};
    int rc = weft_barrier(c);
    if (rc != WEFT_OK)
        return mp_report_rc(c, "barrier", rc);
    if (rank == 1) {
        if (!reset)
            return finalize(c);
        /* Let rank 0's bytes arrive, read none of them, and exit without
         * finalize: the kernel resets a connection with unread bytes. */
        mp_sleep_ms(200);
        _exit(0);
    }
    if (reset) {
        rc = weft_send(c, buf, sizeof buf, WEFT_UINT8, 1);
        if (rc != WEFT_OK)
            return mp_report_rc(c, "send(1 KiB) to a live peer", rc);
    }
    mp_sleep_ms(700);
    double t0 = mp_now_ms();
    rc = weft_send(c, buf, sizeof buf, WEFT_UINT8, 1);
    record(rank, 0, rc, mp_now_ms() - t0, c);
    int fail = 0;
    if (rc != WEFT_EPEER) {
        mp_log("send to a peer that %s 700 ms earlier returned %s (%s), "
               "expected WEFT_EPEER",
               reset ? "reset its wire" : "finalized", weft_err_name(rc),
               weft_last_error(c));
        fail = 1;
    }
    fail |= check_msg(c, "send to a peer that left", rc);
    return finalize(c) || fail;
}

Test(liveness, send_to_finalized_peer, .timeout = 60)
{
    int reset = 0;
    struct mp_opts o = {
        .nranks = 2, .timeout_ms = 3000, .deadline_ms = JOB_DEADLINE_MS};
    struct mp_result res;
    cr_assert_eq(mp_run(&o, gone_peer_rank, &reset, &res), 0);
    assert_passed(&res, "send to a finalized peer");
}

Test(liveness, send_to_reset_peer, .timeout = 60)
{
    int reset = 1;
    struct mp_opts o = {
        .nranks = 2, .timeout_ms = 3000, .deadline_ms = JOB_DEADLINE_MS};
    struct mp_result res;
    cr_assert_eq(mp_run(&o, gone_peer_rank, &reset, &res), 0);
    assert_passed(&res, "send to a peer that reset its wire");
}

/* ---- item 7: one deadline per call ---- */

#define DL_MS 2000

/* Recursive doubling (4 ranks on one host, a small all_reduce): rank 0 is
 * stopped, rank 3 arrives 1500 ms late. Rank 2's first round (with rank 3)
 * ends then; its second (with rank 0) can never end, and must give up at
 * the call's deadline, not a pass's. */
static int doubling_rank(int rank, int nranks, void *arg)
{
    (void)arg;
    weft_comm *c;
    if (mp_init(&c, rank, nranks) != WEFT_OK)
        return 1;
    int32_t v[4] = {rank, rank, rank, rank};
    int rc = weft_barrier(c);
    if (rc != WEFT_OK)
        return mp_report_rc(c, "barrier", rc);
    if (rank == 0)
        mp_point(1); /* stopped here for good */
    if (rank == 3)
        mp_sleep_ms(1500);
    mp_stall_watch_start();
    double t0 = mp_now_ms();
    rc = weft_all_reduce(c, v, v, 4, WEFT_INT32, WEFT_SUM);
    double dt = mp_now_ms() - t0;
    double stall = mp_stall_watch_stop();
    record(rank, 0, rc, dt, c);
    mp_log("all_reduce with rank 0 stopped: %s after %.0f ms: %s",
           weft_err_name(rc), dt, weft_last_error(c));
    int fail = 0;
    if (rc == WEFT_OK) {
        mp_log("all_reduce succeeded without rank 0");
        fail = 1;
    }
    int late = mp_timing_verdict(dt, DL_MS + LATE_MS(DL_MS), stall);
    if (late == 1)
        mp_log("all_reduce returned %.0f ms after it started: its deadline "
               "is %d ms",
               dt, DL_MS);
    if (finalize(c) || fail)
        return 1;
    return late;
}

Test(deadline, doubling_one_deadline, .timeout = 60)
{
    static const struct mp_action stop0 = {0, 1, MP_ACT_SIGSTOP};
    setenv("WEFT_TOPOLOGY", "auto", 1);
    struct mp_opts o = {
        .nranks = 4,
        .timeout_ms = DL_MS,
        .connect_timeout_ms = 20000,
        .deadline_ms = JOB_DEADLINE_MS,
        .actions = &stop0,
        .nactions = 1,
        .linger_mask = 1u << 0,
    };
    struct mp_result res;
    run_timed(&o, doubling_rank, NULL, &res,
              "doubling all_reduce with a stopped peer");
    unsetenv("WEFT_TOPOLOGY");
}

/* A sendrecv whose direct half (32 MiB to rank 1, more than the sockets
 * hold) ends late, because rank 1 receives only after 1500 ms, and whose
 * relayed half (from rank 2, which has no link to rank 0) never comes: it
 * must end at the call's deadline, not at the direct pass's end plus a
 * deadline. Every rank stays until rank 0 is done (a rank that finalizes
 * closes the relay). */
#define BIG (32u << 20)

static int split_sendrecv_rank(int rank, int nranks, void *arg)
{
    (void)arg;
    weft_comm *c;
    if (mp_init(&c, rank, nranks) != WEFT_OK)
        return 1;
    int fail = 0, rc = weft_barrier(c);
    if (rc != WEFT_OK)
        return mp_report_rc(c, "barrier", rc);
    if (rank == 0) {
        char *sb = mp_alloc(BIG), *rb = mp_alloc(BIG);
        memset(sb, 1, BIG);
        mp_stall_watch_start();
        double t0 = mp_now_ms();
        rc = weft_sendrecv(c, sb, 1, rb, 2, BIG, WEFT_UINT8);
        double dt = mp_now_ms() - t0;
        double stall = mp_stall_watch_stop();
        free(sb);
        free(rb);
        record(rank, 0, rc, dt, c);
        mp_log("sendrecv (32 MiB direct to 1, relayed from 2): %s after "
               "%.0f ms: %s",
               weft_err_name(rc), dt, weft_last_error(c));
        if (rc != WEFT_ETIMEDOUT) {
            mp_log("expected WEFT_ETIMEDOUT: rank 2 sends nothing");
            fail = 1;
        }
        int late = mp_timing_verdict(dt, DL_MS + LATE_MS(DL_MS), stall);
        if (late == 1)
            mp_log("sendrecv returned %.0f ms after it started: its "
                   "deadline is %d ms",
                   dt, DL_MS);
        if (late != 0 && !fail)
            fail = late;
        shm()->done[0] = 1;
    } else if (rank == 1) {
        char *rb = mp_alloc(BIG);
        mp_sleep_ms(1500);
        rc = weft_recv(c, rb, BIG, WEFT_UINT8, 0);
        free(rb);
        if (rc != WEFT_OK)
            fail = mp_report_rc(c, "recv(32 MiB) from rank 0", rc);
    }
    double t0 = mp_now_ms();
    while (!shm()->done[0] && mp_now_ms() - t0 < 20000)
        mp_sleep_ms(10);
    if (finalize(c))
        return 1;
    return fail;
}

Test(deadline, relayed_and_direct_one_deadline, .timeout = 60)
{
    struct mp_opts o = {
        .nranks = 4,
        .layout = MP_LAYOUT_RING,
        .timeout_ms = DL_MS,
        .connect_timeout_ms = 20000,
        .deadline_ms = JOB_DEADLINE_MS,
    };
    struct mp_result res;
    run_timed(&o, split_sendrecv_rank, NULL, &res, "relayed + direct sendrecv");
}

/* ---- item 2: a new communicator while a peer holds its old one ---- */

#define RI_DEADLINE_MS 1000
#define RI_LATE_MS 3000

/* Three ranks; `late` sleeps RI_LATE_MS before its first all_reduce, so
 * the others time out (1 s), finalize and call weft_init again with the
 * same hostfile while the late rank still holds its first communicator
 * (and, if it is rank 0, the port the others connect to). The late rank
 * then fails, finalizes and re-inits. The new communicator must form and
 * work on every rank. */
static int reinit_rank(int rank, int nranks, void *arg)
{
    int late = *(const int *)arg;
    weft_comm *c;
    if (mp_init(&c, rank, nranks) != WEFT_OK)
        return 1;
    int32_t v[8];
    for (int i = 0; i < 8; i++)
        v[i] = rank + 1;
    if (rank == late)
        mp_sleep_ms(RI_LATE_MS);
    int rc = weft_all_reduce(c, v, v, 8, WEFT_INT32, WEFT_SUM);
    /* The others give up; the late rank may still complete with what
     * they sent before they left (then with the right sum), or fail. */
    if (rc == WEFT_OK && rank != late) {
        mp_log("the first all_reduce succeeded although rank %d was %d ms "
               "late with a %d ms deadline",
               late, RI_LATE_MS, RI_DEADLINE_MS);
        weft_finalize(c);
        return 1;
    }
    if (rc == WEFT_OK && v[0] != nranks * (nranks + 1) / 2) {
        mp_log("the late rank's all_reduce returned WEFT_OK with %d, "
               "expected %d",
               v[0], nranks * (nranks + 1) / 2);
        weft_finalize(c);
        return 1;
    }
    if (finalize(c))
        return 1;
    double t0 = mp_now_ms();
    rc = weft_init(&c);
    if (rc != WEFT_OK) {
        mp_log("weft_init again after %.0f ms: %s: %s", mp_now_ms() - t0,
               weft_err_name(rc), weft_last_error(NULL));
        return 1;
    }
    for (int i = 0; i < 8; i++)
        v[i] = rank + 1;
    rc = weft_all_reduce(c, v, v, 8, WEFT_INT32, WEFT_SUM);
    int fail = 0;
    if (rc != WEFT_OK)
        fail = mp_report_rc(c, "all_reduce on the new communicator", rc);
    else
        for (int i = 0; i < 8; i++)
            if (v[i] != nranks * (nranks + 1) / 2) {
                mp_log("all_reduce on the new communicator: element %d is "
                       "%d, expected %d",
                       i, v[i], nranks * (nranks + 1) / 2);
                fail = 1;
                break;
            }
    return finalize(c) || fail;
}

static void run_reinit(int late, int reps)
{
    for (int i = 0; i < reps; i++) {
        struct mp_opts o = {
            .nranks = 3,
            .timeout_ms = RI_DEADLINE_MS,
            .connect_timeout_ms = 30000,
            .deadline_ms = JOB_DEADLINE_MS,
        };
        struct mp_result res;
        char what[64];
        cr_assert_eq(mp_run(&o, reinit_rank, &late, &res), 0);
        snprintf(what, sizeof what, "re-init with rank %d late (run %d)", late,
                 i + 1);
        assert_passed(&res, what);
    }
}

Test(reinit, late_rank0, .timeout = 120)
{
    run_reinit(0, 3);
}

Test(reinit, late_rank1, .timeout = 120)
{
    run_reinit(1, 1);
}

Test(reinit, late_rank2, .timeout = 120)
{
    run_reinit(2, 3);
}

/* ---- settings every rank must share ----
 *
 * One rank runs with another setting that every rank must give alike.
 * Those a connection needs (WEFT_SHM: its host's peers use shared memory,
 * it would use loopback TCP; WEFT_WIRES) are compared in the connections'
 * hellos; a rank that meets the odd one fails weft_init at once with
 * WEFT_ECONFIG naming the variable and tells its peers, which fail with
 * the same message. The others (the frame, the wires' threshold, the
 * tuning table) are compared by all the ranks once connected. Either
 * way every rank fails with WEFT_ECONFIG naming the setting, within 4 s
 * (the connect deadline is 8 s; the tellers linger 1.5 s at most). */
struct settings_case {
    const char *var, *odd_value;
    int odd_rank, nranks;
    const char *all;  /* set on every rank (or NULL): NAME=VALUE */
    const char *says; /* what every rank's message names */
};

static int settings_rank(int rank, int nranks, void *arg)
{
    const struct settings_case *sc = arg;
    weft_comm *c = NULL;
    double t0;
    int rc;

    (void)nranks;
    if (sc->all != NULL)
        putenv((char *)sc->all);
    if (rank == sc->odd_rank)
        setenv(sc->var, sc->odd_value, 1);
    t0 = mp_now_ms();
    rc = weft_init(&c);
    if (rc == WEFT_OK) {
        mp_log("weft_init with %s=%s on rank %d returned WEFT_OK", sc->var,
               sc->odd_value, sc->odd_rank);
        weft_finalize(c);
        return 1;
    }
    if (rc != WEFT_ECONFIG || strstr(weft_last_error(NULL), sc->says) == NULL) {
        mp_log("weft_init: %s (%s), expected WEFT_ECONFIG naming %s",
               weft_err_name(rc), weft_last_error(NULL), sc->says);
        return 1;
    }
    if (mp_now_ms() - t0 > 4000) {
        mp_log("weft_init took %.0f ms to fail", mp_now_ms() - t0);
        return 1;
    }
    return 0;
}

Test(matching, settings_must_agree, .timeout = 240)
{
    static const struct settings_case cases[] = {
        {"WEFT_SHM", "0", 1, 2, NULL, "WEFT_SHM"},
        {"WEFT_SHM", "0", 0, 2, NULL, "WEFT_SHM"},
        {"WEFT_WIRES", "2", 1, 2, NULL, "WEFT_WIRES"},
        {"WEFT_WIRES", "2", 0, 2, NULL, "WEFT_WIRES"},
        {"WEFT_SHM", "0", 2, 3, NULL, "WEFT_SHM"},
        /* Ranks that never meet the odd one learn it from those that do. */
        {"WEFT_SHM", "0", 2, 4, NULL, "WEFT_SHM"},
        {"WEFT_WIRES", "2", 2, 4, "WEFT_SHM=0", "WEFT_WIRES"},
        {"WEFT_WIRES", "3", 3, 4, NULL, "WEFT_WIRES"},
        /* Compared once connected. */
        {"WEFT_FRAME_BYTES", "131072", 2, 4, NULL, "WEFT_FRAME_BYTES"},
        {"WEFT_MIN_WIRE_BYTES", "65536", 0, 3, "WEFT_SHM=0",
         "WEFT_MIN_WIRE_BYTES"},
        {"WEFT_HIER_PULL_ALL_GATHER_BYTES", "0", 1, 2, NULL,
         "WEFT_HIER_PULL_ALL_GATHER_BYTES"},
        {"WEFT_ALGO", "all_reduce:ring", 3, 4, NULL, "tuning tables"},
        /* A row the job cannot run (rank 1 reads no peer's memory) fails
         * every rank, naming it. */
        {"WEFT_PULL_THREADS", "0", 1, 3, "WEFT_ALGO=all_gather:pull",
         "all_gather=pull cannot run"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        struct mp_opts o = {
            .nranks = cases[i].nranks,
            .connect_timeout_ms = 8000,
            .deadline_ms = JOB_DEADLINE_MS,
        };
        struct mp_result res;
        char buf[1024];

        unsetenv("WEFT_SHM");
        cr_assert_eq(mp_run(&o, settings_rank, (void *)&cases[i], &res), 0);
        cr_assert(mp_all_passed(&res), "%s=%s on rank %d of %d: %s",
                  cases[i].var, cases[i].odd_value, cases[i].odd_rank,
                  cases[i].nranks, mp_describe(&res, buf, sizeof buf));
    }
}

/* ---- the wires to each peer (weft_peer_wires) ----
 *
 * Over TCP with 3 wires per link, every peer has 3, all up; through
 * shared memory none; this rank, a rank out of range and NULL arguments
 * are WEFT_EINVAL. (Wires lost and their counts: the multi-host fault
 * cases, tests/multihost/ring-test --mode faults.) */
static int wires_rank(int rank, int nranks, void *arg)
{
    const int shm = *(const int *)arg;
    weft_wire_info wi;
    weft_comm *c = NULL;
    int bad = 0;

    setenv("WEFT_SHM", shm ? "1" : "0", 1);
    setenv("WEFT_WIRES", "3", 1);
    if (mp_init(&c, rank, nranks) != WEFT_OK)
        return 1;
    for (int p = 0; p < nranks; p++) {
        int rc = weft_peer_wires(c, p, &wi);

        if (p == rank) {
            bad |= rc != WEFT_EINVAL;
            continue;
        }
        if (rc != WEFT_OK || wi.total != (shm ? 0 : 3) || wi.up != wi.total ||
            wi.lost != 0 || wi.back != 0) {
            mp_log("peer %d (%s): rc %d, total %d, up %d, lost %u, back %u", p,
                   shm ? "shm" : "tcp", rc, wi.total, wi.up, wi.lost, wi.back);
            bad = 1;
        }
    }
    bad |= weft_peer_wires(c, nranks, &wi) != WEFT_EINVAL;
    bad |= weft_peer_wires(c, -1, &wi) != WEFT_EINVAL;
    bad |= weft_peer_wires(c, rank ^ 1, NULL) != WEFT_EINVAL;
    bad |= weft_peer_wires(NULL, 0, &wi) != WEFT_EINVAL;
    bad |= weft_barrier(c) != WEFT_OK;
    return weft_finalize(c) != WEFT_OK || bad;
}

Test(wires, peer_wires_counts_each_peers_wires, .timeout = 60)
{
    for (int shm = 0; shm < 2; shm++) {
        struct mp_opts o = {.nranks = 3, .deadline_ms = JOB_DEADLINE_MS};
        struct mp_result res;
        char buf[1024];

        cr_assert_eq(mp_run(&o, wires_rank, &shm, &res), 0);
        cr_assert(mp_all_passed(&res), "%s: %s", shm ? "shm" : "tcp",
                  mp_describe(&res, buf, sizeof buf));
    }
}
