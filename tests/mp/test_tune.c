/*
 * The tuning table (src/core/tune.c; API.md, "Tuning"): weft_info prints
 * the table in effect in WEFT_ALGO's form, and that text given back as
 * WEFT_ALGO makes the same table; every algorithm an operation has, forced
 * through WEFT_ALGO on the layouts where it can run, gives the right
 * results and shows in weft_info; overrides that do not parse, name what
 * does not exist or ask for what cannot run fail weft_init with
 * WEFT_ECONFIG naming WEFT_ALGO and the fault.
 */
#include <criterion/criterion.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"
#include "weft.h"

/* mp_shm's layout: the table rank 0 printed. */
#define INFO_BYTES 4096

static void run_ranks(mp_rank_fn fn, const struct mp_opts *o, void *arg)
{
    struct mp_result res;
    char buf[1024];

    cr_assert_eq(mp_run(o, fn, arg, &res), 0, "could not set up the job");
    cr_assert(mp_all_passed(&res), "%s", mp_describe(&res, buf, sizeof buf));
}

/* The "algo=" part of weft_info's text. */
static const char *algo_of(const char *info)
{
    const char *a = info != NULL ? strstr(info, "algo=") : NULL;
    return a != NULL ? a + 5 : "";
}

/* Rank 0 copies its table into mp_shm; every rank checks that its own is
 * the same. */
static int print_table(int rank, int nranks, void *arg)
{
    weft_comm *c;
    char *shared = mp_shm();
    const char *mine;
    int rc, fail = 0;

    (void)arg;
    if (mp_init(&c, rank, nranks) != WEFT_OK)
        return 1;
    mine = algo_of(weft_info(c));
    if (strlen(mine) == 0 || strncmp(mine, "all_reduce:", 11) != 0)
        fail = (mp_log("weft_info has no table: %s", weft_info(c)), 1);
    if (rank == 0)
        snprintf(shared, INFO_BYTES, "%s", mine);
    if ((rc = weft_barrier(c)) != WEFT_OK)
        fail = mp_report_rc(c, "barrier", rc);
    if (!fail && strcmp(shared, mine) != 0)
        fail = (mp_log("rank 0's table %s, this rank's %s", shared, mine), 1);
    weft_finalize(c);
    return fail;
}

static void round_trip(enum mp_layout layout, int nranks)
{
    struct mp_opts o = {.nranks = nranks, .layout = layout};
    char first[INFO_BYTES];

    unsetenv("WEFT_ALGO");
    run_ranks(print_table, &o, NULL);
    snprintf(first, sizeof first, "%s", (char *)mp_shm());
    cr_assert(strlen(first) > 0);
    setenv("WEFT_ALGO", first, 1);
    run_ranks(print_table, &o, NULL);
    unsetenv("WEFT_ALGO");
    cr_assert_str_eq(first, (char *)mp_shm(), "defaults %s, given back %s",
                     first, (char *)mp_shm());
}

Test(tune, table_round_trip_one_host)
{
    round_trip(MP_LAYOUT_ONE_HOST, 4);
}

Test(tune, table_round_trip_ring)
{
    round_trip(MP_LAYOUT_RING, 4);
}

/* Hosts of two ranks: the hierarchical rows take every size from their
 * threshold, yet turn down a call of fewer elements than ranks, so the
 * rows after them are printed too. */
Test(tune, table_round_trip_hosts_of_two)
{
    round_trip(MP_LAYOUT_PAIRS, 4);
}

/* ---- every algorithm forced ---- */

struct forced {
    const char *op;   /* all_reduce, ... */
    const char *algo; /* what WEFT_ALGO forces */
};

/* Runs op at a few counts (float32, checked) and checks that weft_info
 * names the forced algorithm first for op. */
static int run_forced(int rank, int nranks, void *arg)
{
    const struct forced *f = arg;
    static const size_t counts[] = {1, 7, 300, 4099, 70001};
    char want[64];
    weft_comm *c;
    int fail = 0;

    if (mp_init(&c, rank, nranks) != WEFT_OK)
        return 1;
    snprintf(want, sizeof want, "%s:0-=%s", f->op, f->algo);
    const char *at = strstr(weft_info(c), want);
    /* Its first row; the box, the hierarchy and halving, which may turn
     * a call down, are followed by the topology's own algorithm. */
    if (at == NULL || (at[strlen(want)] != ';' && at[strlen(want)] != ',' &&
                       at[strlen(want)] != '\0'))
        fail = (mp_log("weft_info does not say %s: %s", want, weft_info(c)), 1);
    for (size_t k = 0; k < sizeof counts / sizeof counts[0] && !fail; k++) {
        const size_t n =
            counts[k] < (size_t)nranks ? (size_t)nranks : counts[k];
        float *in = calloc(n * (size_t)nranks, sizeof *in);
        float *out = calloc(n * (size_t)nranks, sizeof *out);
        int rc = WEFT_OK;

        cr_assert(in != NULL && out != NULL);
        for (size_t i = 0; i < n * (size_t)nranks; i++)
            in[i] = (float)((rank + 1) * 1000 + (int)(i % 997));
        if (strcmp(f->op, "all_reduce") == 0) {
            rc = weft_all_reduce(c, in, out, n, WEFT_FLOAT32, WEFT_SUM);
            for (size_t i = 0; rc == WEFT_OK && i < n && !fail; i++) {
                float e = 0;
                for (int r = 0; r < nranks; r++)
                    e += (float)((r + 1) * 1000 + (int)(i % 997));
                if (out[i] != e)
                    fail = (mp_log("%s=%s count %zu: [%zu] %g, want %g", f->op,
                                   f->algo, n, i, out[i], e),
                            1);
            }
        } else if (strcmp(f->op, "all_gather") == 0) {
            rc = weft_all_gather(c, in, out, n, WEFT_FLOAT32);
            for (size_t i = 0; rc == WEFT_OK && i < n * (size_t)nranks && !fail;
                 i++) {
                float e = (float)((int)(i / n + 1) * 1000 + (int)(i % n % 997));
                if (out[i] != e)
                    fail = (mp_log("%s=%s count %zu: [%zu] %g, want %g", f->op,
                                   f->algo, n, i, out[i], e),
                            1);
            }
        } else if (strcmp(f->op, "reduce_scatter") == 0) {
            rc = weft_reduce_scatter(c, in, out, n, WEFT_FLOAT32, WEFT_SUM);
            for (size_t i = 0; rc == WEFT_OK && i < n && !fail; i++) {
                size_t g = (size_t)rank * n + i;
                float e = 0;
                for (int r = 0; r < nranks; r++)
                    e += (float)((r + 1) * 1000 + (int)(g % 997));
                if (out[i] != e)
                    fail = (mp_log("%s=%s count %zu: [%zu] %g, want %g", f->op,
                                   f->algo, n, i, out[i], e),
                            1);
            }
        } else if (strcmp(f->op, "broadcast") == 0) {
            const int root = (int)(k % (size_t)nranks);
            float *b = rank == root ? in : out;

            rc = weft_broadcast(c, b, n, WEFT_FLOAT32, root);
            for (size_t i = 0; rc == WEFT_OK && i < n && !fail; i++) {
                float e = (float)((root + 1) * 1000 + (int)(i % 997));
                if (b[i] != e)
                    fail = (mp_log("%s=%s count %zu root %d: [%zu] %g, want %g",
                                   f->op, f->algo, n, root, i, b[i], e),
                            1);
            }
        } else {
            rc = weft_barrier(c);
        }
        if (rc != WEFT_OK)
            fail = mp_report_rc(c, f->op, rc);
        free(in);
        free(out);
    }
    weft_finalize(c);
    return fail;
}

static void force(enum mp_layout layout, int nranks, const char *op,
                  const char *algo)
{
    struct forced f = {op, algo};
    struct mp_opts o = {.nranks = nranks, .layout = layout};
    char env[128];

    snprintf(env, sizeof env, "%s:%s", op, algo);
    setenv("WEFT_ALGO", env, 1);
    /* The one-copy reads need threads, off where a rank has one core. */
    setenv("WEFT_PULL_THREADS", "2", 1);
    run_ranks(run_forced, &o, &f);
    unsetenv("WEFT_PULL_THREADS");
    unsetenv("WEFT_ALGO");
}

Test(tune, all_reduce_every_algorithm_one_host)
{
    static const char *const algos[] = {"box",     "pull", "gather", "doubling",
                                        "halving", "mesh", "ring"};

    for (size_t i = 0; i < sizeof algos / sizeof algos[0]; i++)
        force(MP_LAYOUT_ONE_HOST, 4, "all_reduce", algos[i]);
}

Test(tune, every_operation_every_algorithm_one_host)
{
    static const char *const ops[] = {"all_gather", "reduce_scatter",
                                      "broadcast", "barrier"};
    static const char *const algos[] = {"box", "pull", "mesh", "ring"};

    for (size_t i = 0; i < sizeof ops / sizeof ops[0]; i++)
        for (size_t j = 0; j < sizeof algos / sizeof algos[0]; j++)
            if (strcmp(ops[i], "barrier") != 0 || strcmp(algos[j], "pull") != 0)
                force(MP_LAYOUT_ONE_HOST, 3, ops[i], algos[j]);
}

Test(tune, ring_and_gather_around_a_ring_of_hosts)
{
    force(MP_LAYOUT_RING, 4, "all_reduce", "gather");
    force(MP_LAYOUT_RING, 4, "all_reduce", "ring");
    force(MP_LAYOUT_RING, 4, "broadcast", "ring");
}

Test(tune, hierarchical_on_hosts_of_two_ranks)
{
    force(MP_LAYOUT_PAIRS, 4, "all_reduce", "hier");
    force(MP_LAYOUT_PAIRS, 4, "all_gather", "hier");
    force(MP_LAYOUT_PAIRS, 4, "reduce_scatter", "hier");
}

/* ---- overrides refused ---- */

struct refused {
    const char *algo;
    const char *says; /* what the message must hold */
};

static int expect_refused(int rank, int nranks, void *arg)
{
    const struct refused *r = arg;
    weft_comm *c = NULL;
    int rc = weft_init(&c);
    const char *msg = weft_last_error(NULL);

    (void)rank;
    (void)nranks;
    if (rc != WEFT_ECONFIG) {
        mp_log("WEFT_ALGO=%s: weft_init returned %d, want WEFT_ECONFIG",
               r->algo, rc);
        weft_finalize(c);
        return 1;
    }
    if (strstr(msg, "WEFT_ALGO") == NULL || strstr(msg, r->says) == NULL) {
        mp_log("WEFT_ALGO=%s: the message \"%s\" does not say \"%s\"", r->algo,
               msg, r->says);
        return 1;
    }
    return 0;
}

Test(tune, bad_overrides_refused)
{
    static const struct refused bad[] = {
        {"all_reduce", "expected ':'"},
        {"allreduce:ring", "unknown operation \"allreduce\""},
        {"all_reduce:ringg", "unknown algorithm \"ringg\""},
        {"all_reduce:0-4k", "expected '=' and an algorithm"},
        {"all_reduce:4k=ring", "a row is LO-HI=ALGO"},
        {"all_reduce:8k-4k=ring", "is empty"},
        {"all_reduce:0-99999999999999999999=ring", "out of range"},
        {"all_gather:halving", "halving does not implement all_gather"},
        {"barrier:hier", "hier does not implement barrier"},
        {"all_reduce:ring;all_reduce:mesh", "given twice"},
        {"broadcast:", "no rows"},
        /* Two ranks of one host: no halving (as many rounds as the
         * ring), no hierarchy (one host). */
        {"all_reduce:halving", "cannot run on this job"},
        {"all_reduce:hier", "several hosts"},
    };
    struct mp_opts o = {.nranks = 2};

    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        setenv("WEFT_ALGO", bad[i].algo, 1);
        run_ranks(expect_refused, &o, (void *)&bad[i]);
    }
    unsetenv("WEFT_ALGO");
}

Test(tune, no_box_across_hosts)
{
    struct refused r = {"all_reduce:box", "every rank on one host"};
    struct mp_opts o = {.nranks = 3, .layout = MP_LAYOUT_RING};

    setenv("WEFT_ALGO", r.algo, 1);
    run_ranks(expect_refused, &o, &r);
    unsetenv("WEFT_ALGO");
}
