/*
 * reduce, gather, scatter, all_to_all and all_to_allv (blocking and
 * non-blocking) at 1 to 5 ranks, every root, sizes from 0 to past the
 * thresholds between their algorithms, checked bit for bit against what
 * each rank computes locally; over shared memory, over TCP with the ring
 * and the mesh, and around a ring of hosts where some pairs have no wires
 * (the relay's layout). Then the contract: bad arguments are WEFT_EINVAL
 * and leave the communicator working; ranks whose calls differ never
 * return WEFT_OK, and an all_to_allv whose counts disagree is
 * WEFT_EMISMATCH on every rank.
 */
#include <criterion/criterion.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"
#include "weft.h"

/* Element counts: 0, odd ones, one past the small reduce's threshold at
 * every size of job, and one whose blocks span several frames. */
static const size_t counts[] = {0, 1, 7, 999, 3001, 20011};
#define NCOUNTS (sizeof counts / sizeof counts[0])

static const struct {
    weft_dtype dt;
    weft_redop op;
} reductions[] = {{WEFT_INT32, WEFT_SUM},    {WEFT_FLOAT32, WEFT_PROD},
                  {WEFT_FLOAT64, WEFT_MAX},  {WEFT_UINT8, WEFT_MIN},
                  {WEFT_BFLOAT16, WEFT_SUM}, {WEFT_INT64, WEFT_SUM}};
#define NREDS (sizeof reductions / sizeof reductions[0])

#define FAIL(...)                                                              \
    do {                                                                       \
        mp_log(__VA_ARGS__);                                                   \
        return 1;                                                              \
    } while (0)

/* The bytes rank `from` sends rank `to` in case k: a function of the
 * three, so a block in the wrong place shows. */
static void block_fill(void *buf, size_t nbytes, int from, int to, int k)
{
    mp_fill_bytes(buf, nbytes,
                  ((uint64_t)k << 32) ^ ((uint64_t)from << 16) ^ (uint64_t)to);
}

static int block_ok(const char *what, const void *got, size_t nbytes, int from,
                    int to, int k)
{
    char *want = malloc(nbytes + 1);
    int bad;

    block_fill(want, nbytes, from, to, k);
    bad = memcmp(got, want, nbytes) != 0;
    if (bad)
        mp_log("%s: case %d: block from %d to %d (%zu bytes) is wrong, first "
               "difference at byte %zu",
               what, k, from, to, nbytes, mp_first_diff(got, want, nbytes, 1));
    free(want);
    return !bad;
}

static int check_reduce(weft_comm *c, int me, int n, size_t count, int root,
                        int k, int inplace, int nonblocking)
{
    const weft_dtype dt = reductions[k % NREDS].dt;
    const weft_redop op = reductions[k % NREDS].op;
    const size_t es = weft_dtype_size(dt), bytes = count * es;
    char *sb = malloc(bytes + 1), *rb = NULL, *want;
    int rc;

    for (size_t i = 0; i < count; i++)
        mp_put_value(dt, sb, i, mp_small_elem(me, i));
    if (me == root)
        rb = inplace ? sb : malloc(bytes + 1);
    if (nonblocking) {
        weft_request *req;

        rc = weft_ireduce(c, sb, rb, count, dt, op, root, &req);
        if (rc == WEFT_OK) {
            rc = weft_wait(req);
            weft_request_free(req);
        }
    } else {
        rc = weft_reduce(c, sb, rb, count, dt, op, root);
    }
    if (rc != WEFT_OK)
        FAIL("reduce(%s, %s, count %zu, root %d): %s: %s", mp_op_name(op),
             mp_dtype_name(dt), count, root, weft_err_name(rc),
             weft_last_error(c));
    if (me == root) {
        want = malloc(bytes + 1);
        for (size_t i = 0; i < count; i++)
            mp_put_value(dt, want, i, mp_small_expect(op, n, i));
        rc = mp_check_elems("reduce", "recvbuf", dt, rb, want, count);
        free(want);
        if (rb != sb)
            free(rb);
    }
    free(sb);
    return rc != 0;
}

static int check_gather(weft_comm *c, int me, int n, size_t count, int root,
                        int k, int inplace, int nonblocking)
{
    const size_t bytes = count * 4;
    char *rb = me == root ? malloc(bytes * (size_t)n + 1) : NULL;
    char *sb =
        inplace && me == root ? rb + (size_t)me * bytes : malloc(bytes + 1);
    int rc, bad = 0;

    block_fill(sb, bytes, me, root, k);
    if (nonblocking) {
        weft_request *req;

        rc = weft_igather(c, sb, rb, count, WEFT_FLOAT32, root, &req);
        if (rc == WEFT_OK) {
            rc = weft_wait(req);
            weft_request_free(req);
        }
    } else {
        rc = weft_gather(c, sb, rb, count, WEFT_FLOAT32, root);
    }
    if (rc != WEFT_OK)
        FAIL("gather(count %zu, root %d): %s: %s", count, root,
             weft_err_name(rc), weft_last_error(c));
    for (int p = 0; me == root && p < n && !bad; p++)
        bad = !block_ok("gather", rb + (size_t)p * bytes, bytes, p, root, k);
    if (!(inplace && me == root))
        free(sb);
    free(rb);
    return bad;
}

static int check_scatter(weft_comm *c, int me, int n, size_t count, int root,
                         int k, int inplace, int nonblocking)
{
    const size_t bytes = count * 2;
    char *sb = me == root ? malloc(bytes * (size_t)n + 1) : NULL;
    char *rb =
        inplace && me == root ? sb + (size_t)me * bytes : malloc(bytes + 1);
    int rc, bad;

    for (int p = 0; me == root && p < n; p++)
        block_fill(sb + (size_t)p * bytes, bytes, root, p, k);
    if (nonblocking) {
        weft_request *req;

        rc = weft_iscatter(c, sb, rb, count, WEFT_FLOAT16, root, &req);
        if (rc == WEFT_OK) {
            rc = weft_wait(req);
            weft_request_free(req);
        }
    } else {
        rc = weft_scatter(c, sb, rb, count, WEFT_FLOAT16, root);
    }
    if (rc != WEFT_OK)
        FAIL("scatter(count %zu, root %d): %s: %s", count, root,
             weft_err_name(rc), weft_last_error(c));
    bad = !block_ok("scatter", rb, bytes, root, me, k);
    if (!(inplace && me == root))
        free(rb);
    free(sb);
    return bad;
}

static int check_all_to_all(weft_comm *c, int me, int n, size_t count, int k,
                            int inplace, int nonblocking)
{
    const size_t bytes = count * 8;
    char *sb = malloc(bytes * (size_t)n + 1);
    char *rb = inplace ? sb : malloc(bytes * (size_t)n + 1);
    int rc, bad = 0;

    for (int p = 0; p < n; p++)
        block_fill(sb + (size_t)p * bytes, bytes, me, p, k);
    if (nonblocking) {
        weft_request *req;

        rc = weft_iall_to_all(c, sb, rb, count, WEFT_UINT64, &req);
        if (rc == WEFT_OK) {
            rc = weft_wait(req);
            weft_request_free(req);
        }
    } else {
        rc = weft_all_to_all(c, sb, rb, count, WEFT_UINT64);
    }
    if (rc != WEFT_OK)
        FAIL("all_to_all(count %zu): %s: %s", count, weft_err_name(rc),
             weft_last_error(c));
    for (int p = 0; p < n && !bad; p++)
        bad = !block_ok("all_to_all", rb + (size_t)p * bytes, bytes, p, me, k);
    if (rb != sb)
        free(rb);
    free(sb);
    return bad;
}

/* all_to_allv's counts in case k: uneven, some zero, scaled by `scale`. */
static size_t v_count(int from, int to, int k, size_t scale)
{
    return (size_t)((from * 3 + to * 5 + k) % 4) * scale;
}

static int check_all_to_allv(weft_comm *c, int me, int n, size_t scale, int k,
                             int nonblocking)
{
    size_t sc[MP_MAX_RANKS], sd[MP_MAX_RANKS], rc_[MP_MAX_RANKS],
        rd[MP_MAX_RANKS], stot = 0, rtot = 0;
    char *sb, *rb;
    int rc, bad = 0;

    /* Blocks in reverse order of peers, a gap of 3 elements after each. */
    for (int p = n - 1; p >= 0; p--) {
        sc[p] = v_count(me, p, k, scale);
        sd[p] = stot;
        stot += sc[p] + 3;
        rc_[p] = v_count(p, me, k, scale);
        rd[p] = rtot;
        rtot += rc_[p] + 3;
    }
    sb = malloc(stot * 4 + 1);
    rb = malloc(rtot * 4 + 1);
    memset(rb, 0x5a, rtot * 4);
    for (int p = 0; p < n; p++)
        block_fill(sb + sd[p] * 4, sc[p] * 4, me, p, k);
    if (nonblocking) {
        weft_request *req;

        rc = weft_iall_to_allv(c, sb, sc, sd, rb, rc_, rd, WEFT_INT32, &req);
        if (rc == WEFT_OK) {
            rc = weft_wait(req);
            weft_request_free(req);
        }
    } else {
        rc = weft_all_to_allv(c, sb, sc, sd, rb, rc_, rd, WEFT_INT32);
    }
    if (rc != WEFT_OK) {
        free(sb);
        free(rb);
        FAIL("all_to_allv(scale %zu): %s: %s", scale, weft_err_name(rc),
             weft_last_error(c));
    }
    for (int p = 0; p < n && !bad; p++) {
        bad = !block_ok("all_to_allv", rb + rd[p] * 4, rc_[p] * 4, p, me, k);
        /* The gaps stay as they were. */
        for (size_t i = 0; i < 12 && !bad; i++)
            bad = (unsigned char)rb[(rd[p] + rc_[p]) * 4 + i] != 0x5a;
        if (bad)
            mp_log("all_to_allv: case %d: from %d, or the gap after it", k, p);
    }
    free(sb);
    free(rb);
    return bad;
}

/* Every operation at every count and root, blocking and not, some in
 * place; then several non-blocking ones of every kind in flight at once
 * with an all_reduce among them. */
static int run_cases(weft_comm *c, int me, int n)
{
    int k = 0;

    for (size_t ci = 0; ci < NCOUNTS; ci++) {
        const size_t count = counts[ci];

        for (int root = 0; root < n; root++, k++) {
            int nb = (k % 3) == 1, inplace = (k % 2) == 1;

            if (check_reduce(c, me, n, count, root, k, inplace, nb) ||
                check_gather(c, me, n, count, root, k, inplace, !nb) ||
                check_scatter(c, me, n, count, root, k, inplace, nb))
                return 1;
        }
        if (check_all_to_all(c, me, n, count, k, 0, 0) ||
            check_all_to_all(c, me, n, count, k + 1, 1, 1) ||
            check_all_to_allv(c, me, n, count, k, ci % 2))
            return 1;
    }
    {
        /* Interleaved: every kind posted before any is waited for. */
        enum { CNT = 1234 };
        const size_t b4 = CNT * 4;
        char *g = malloc(b4 * (size_t)n), *gs = malloc(b4);
        char *s = malloc(b4 * (size_t)n), *sr = malloc(b4);
        char *a = malloc(b4 * (size_t)n), *ar = malloc(b4 * (size_t)n);
        int32_t *x = malloc(b4), *xr = malloc(b4), *y = malloc(b4);
        weft_request *req[5];
        const int root = n - 1;
        int rc, bad = 0;

        for (size_t i = 0; i < CNT; i++)
            x[i] = (int32_t)(i + (size_t)me);
        block_fill(gs, b4, me, 0, 9001);
        for (int p = 0; p < n; p++) {
            block_fill(s + (size_t)p * b4, b4, root, p, 9002);
            block_fill(a + (size_t)p * b4, b4, me, p, 9003);
        }
        rc = weft_igather(c, gs, g, CNT, WEFT_INT32, 0, &req[0]);
        if (rc == WEFT_OK)
            rc = weft_iscatter(c, s, sr, CNT, WEFT_INT32, root, &req[1]);
        if (rc == WEFT_OK)
            rc = weft_iall_reduce(c, x, y, CNT, WEFT_INT32, WEFT_SUM, &req[2]);
        if (rc == WEFT_OK)
            rc = weft_iall_to_all(c, a, ar, CNT, WEFT_INT32, &req[3]);
        if (rc == WEFT_OK)
            rc = weft_ireduce(c, x, xr, CNT, WEFT_INT32, WEFT_SUM, root,
                              &req[4]);
        if (rc == WEFT_OK)
            rc = weft_wait_all(req, 5);
        if (rc != WEFT_OK)
            bad = mp_report_rc(c, "interleaved", rc);
        for (int p = 0; !bad && me == 0 && p < n; p++)
            bad = !block_ok("igather", g + (size_t)p * b4, b4, p, 0, 9001);
        if (!bad)
            bad = !block_ok("iscatter", sr, b4, root, me, 9002);
        for (int p = 0; !bad && p < n; p++)
            bad =
                !block_ok("iall_to_all", ar + (size_t)p * b4, b4, p, me, 9003);
        for (size_t i = 0; !bad && i < CNT; i++) {
            int32_t want = (int32_t)(i * (size_t)n) +
                           (int32_t)((size_t)n * (size_t)(n - 1) / 2);

            if (y[i] != want || (me == root && xr[i] != want)) {
                mp_log("interleaved reduce/all_reduce: element %zu: %d, %d, "
                       "want %d",
                       i, (int)y[i], (int)xr[i], (int)want);
                bad = 1;
            }
        }
        for (int i = 0; rc == WEFT_OK && i < 5; i++)
            weft_request_free(req[i]);
        free(g), free(gs), free(s), free(sr), free(a), free(ar);
        free(x), free(xr), free(y);
        if (bad)
            return 1;
    }
    return 0;
}

/* Bad arguments: WEFT_EINVAL, nothing sent, and a call after works. */
static int run_bad_args(weft_comm *c, int me, int n)
{
    char buf[64 * MP_MAX_RANKS] = {0}, out[64 * MP_MAX_RANKS] = {0};
    size_t z[MP_MAX_RANKS] = {0}, one[MP_MAX_RANKS];
    weft_request *req = (weft_request *)buf;

    for (int p = 0; p < MP_MAX_RANKS; p++)
        one[p] = 1;
    struct {
        const char *what;
        int rc;
    } t[] = {
        {"reduce root -1",
         weft_reduce(c, buf, out, 4, WEFT_INT32, WEFT_SUM, -1)},
        {"reduce root n", weft_reduce(c, buf, out, 4, WEFT_INT32, WEFT_SUM, n)},
        {"reduce bad op",
         weft_reduce(c, buf, out, 4, WEFT_INT32, (weft_redop)99, 0)},
        {"reduce NULL sendbuf",
         weft_reduce(c, NULL, out, 4, WEFT_INT32, WEFT_SUM, 0)},
        {"reduce NULL recvbuf on the root",
         weft_reduce(c, buf, NULL, 4, WEFT_INT32, WEFT_SUM, me)},
        {"reduce overlap on the root",
         weft_reduce(c, buf, buf + 4, 4, WEFT_INT32, WEFT_SUM, me)},
        {"gather bad dtype", weft_gather(c, buf, out, 4, (weft_dtype)77, 0)},
        {"gather NULL sendbuf", weft_gather(c, NULL, out, 4, WEFT_INT8, 0)},
        {"gather NULL recvbuf on the root",
         weft_gather(c, buf, NULL, 4, WEFT_INT8, me)},
        {"gather overlap on the root",
         weft_gather(c, buf + 1, buf, 4, WEFT_INT8, me)},
        {"gather count overflow",
         weft_gather(c, buf, out, SIZE_MAX / 2, WEFT_INT8, 0)},
        {"scatter root n", weft_scatter(c, buf, out, 4, WEFT_INT8, n)},
        {"scatter NULL recvbuf", weft_scatter(c, buf, NULL, 4, WEFT_INT8, 0)},
        {"scatter NULL sendbuf on the root",
         weft_scatter(c, NULL, out, 4, WEFT_INT8, me)},
        {"all_to_all NULL", weft_all_to_all(c, NULL, out, 4, WEFT_INT8)},
        {"all_to_all overlap", weft_all_to_all(c, buf + 1, buf, 4, WEFT_INT8)},
        {"all_to_allv NULL counts",
         weft_all_to_allv(c, buf, NULL, z, out, z, z, WEFT_INT8)},
        {"all_to_allv NULL buffer",
         weft_all_to_allv(c, NULL, one, z, out, one, z, WEFT_INT8)},
        {"all_to_allv own counts differ",
         weft_all_to_allv(c, buf, one, z, out, z, z, WEFT_INT8)},
        {"all_to_allv overlap",
         weft_all_to_allv(c, buf, one, z, buf, one, z, WEFT_INT8)},
        {"ireduce req NULL",
         weft_ireduce(c, buf, out, 4, WEFT_INT32, WEFT_SUM, 0, NULL)},
        {"igather root n", weft_igather(c, buf, out, 4, WEFT_INT8, n, &req)},
    };

    for (size_t i = 0; i < sizeof t / sizeof t[0]; i++)
        if (t[i].rc != WEFT_EINVAL)
            FAIL("%s: %s, want WEFT_EINVAL", t[i].what, weft_err_name(t[i].rc));
    if (req != NULL)
        FAIL("igather with a bad root left *req set");
    /* Still usable: the gather below must work. */
    return check_gather(c, me, n, 5, 0, 4242, 0, 0);
}

static int rooted_rank(int rank, int nranks, void *arg)
{
    weft_comm *c;
    int fail;

    (void)arg;
    if (mp_init(&c, rank, nranks) != WEFT_OK)
        return 1;
    double t0 = mp_now_ms();

    fail = run_bad_args(c, rank, nranks) || run_cases(c, rank, nranks);
    if (!fail && rank == 0)
        mp_log("every case passed in %.0f ms", mp_now_ms() - t0);
    if (weft_finalize(c) != WEFT_OK)
        fail = 1;
    return fail;
}

static void run_job_algo(int nranks, enum mp_layout layout,
                         const char *topology, const char *shm,
                         const char *algo)
{
    struct mp_opts o = {
        .nranks = nranks,
        .layout = layout,
        .timeout_ms = 30000,
        .deadline_ms = 100000,
    };
    struct mp_result res;
    char buf[1024];

    setenv("WEFT_SHM", shm, 1);
    setenv("WEFT_TOPOLOGY", topology, 1);
    /* Small frames and both ring directions at modest counts. */
    setenv("WEFT_FRAME_BYTES", "16384", 1);
    setenv("WEFT_BIDIR_MIN_BYTES", "16384", 1);
    if (algo != NULL)
        setenv("WEFT_ALGO", algo, 1);
    else
        unsetenv("WEFT_ALGO");
    cr_assert_eq(mp_run(&o, rooted_rank, NULL, &res), 0,
                 "could not set up the job");
    cr_assert(mp_all_passed(&res),
              "%d ranks, topology %s, WEFT_SHM=%s, WEFT_ALGO %s: %s", nranks,
              topology, shm, algo != NULL ? algo : "unset",
              mp_describe(&res, buf, sizeof buf));
}

static void run_job(int nranks, enum mp_layout layout, const char *topology,
                    const char *shm)
{
    run_job_algo(nranks, layout, topology, shm, NULL);
}

/* The ring's algorithms where every pair is wired, at every size. */
Test(rooted, shm_ring_algos_ranks4, .timeout = 120)
{
    run_job_algo(4, MP_LAYOUT_ONE_HOST, "auto", "1",
                 "reduce:0-=ring;gather:0-=ring;scatter:0-=ring;"
                 "all_to_all:0-=ring;all_to_allv:0-=ring");
}

/* The mesh's reduce at every size (chunks of no element where count <
 * ranks), and the gather to the root at every size. */
Test(rooted, tcp_mesh_reduce_algos_ranks5, .timeout = 120)
{
    run_job_algo(5, MP_LAYOUT_MESH, "mesh", "0", "reduce:0-=mesh");
    run_job_algo(5, MP_LAYOUT_MESH, "mesh", "0", "reduce:0-=gather");
}

Test(rooted, one_rank, .timeout = 60)
{
    run_job(1, MP_LAYOUT_ONE_HOST, "auto", "1");
}

Test(rooted, shm_ranks3, .timeout = 120)
{
    run_job(3, MP_LAYOUT_ONE_HOST, "auto", "1");
}

Test(rooted, shm_ranks5, .timeout = 120)
{
    run_job(5, MP_LAYOUT_ONE_HOST, "auto", "1");
}

Test(rooted, tcp_ring_ranks2, .timeout = 120)
{
    run_job(2, MP_LAYOUT_ONE_HOST, "ring", "0");
}

Test(rooted, tcp_ring_ranks4, .timeout = 120)
{
    run_job(4, MP_LAYOUT_ONE_HOST, "ring", "0");
}

Test(rooted, tcp_mesh_ranks4, .timeout = 120)
{
    run_job(4, MP_LAYOUT_MESH, "mesh", "0");
}

/* Hosts in a ring: pairs two apart have no wires. */
Test(rooted, relayed_ring_ranks5, .timeout = 120)
{
    run_job(5, MP_LAYOUT_RING, "auto", "0");
}

/* ---- ranks whose calls differ ---- */

enum { MM_ROOT, MM_COUNT, MM_DTYPE, MM_V };

static int mismatch_rank(int rank, int nranks, void *arg)
{
    const int kind = *(const int *)arg;
    weft_comm *c;
    char sb[4096] = {0}, rb[4096];
    size_t sc[MP_MAX_RANKS], d[MP_MAX_RANKS], rcv[MP_MAX_RANKS];
    int rc;

    if (mp_init(&c, rank, nranks) != WEFT_OK)
        return 1;
    switch (kind) {
    case MM_ROOT:
        rc = weft_gather(c, sb, rb, 16, WEFT_INT32, rank == 1 ? 1 : 0);
        break;
    case MM_COUNT:
        rc = weft_reduce(c, sb, rb, rank == 1 ? 17 : 16, WEFT_INT32, WEFT_SUM,
                         0);
        break;
    case MM_DTYPE:
        rc = weft_all_to_all(c, sb, rb, 16,
                             rank == 1 ? WEFT_UINT32 : WEFT_INT32);
        break;
    default:
        /* Rank 0 sends rank 1 one element more than rank 1 expects. */
        for (int p = 0; p < nranks; p++) {
            sc[p] = rcv[p] = 2;
            d[p] = (size_t)p * 4;
        }
        if (rank == 0)
            sc[1] = 3;
        rc = weft_all_to_allv(c, sb, sc, d, rb, rcv, d, WEFT_INT32);
        break;
    }
    weft_finalize(c);
    ((volatile int *)mp_shm())[rank] = rc;
    if (rc == WEFT_OK)
        FAIL("mismatched call %d returned WEFT_OK", kind);
    /* all_to_allv: every rank sees the same counts, so all say so. The
     * others: a rank that meets the difference says so, one whose peer
     * left on finding it may see the peer gone (the parent checks that
     * some rank said WEFT_EMISMATCH). */
    if (rc != WEFT_EMISMATCH && kind == MM_V)
        FAIL("mismatched call %d: %s, want WEFT_EMISMATCH", kind,
             weft_err_name(rc));
    return 0;
}

static void run_mismatch(int kind, int nranks, const char *topology)
{
    struct mp_opts o = {
        .nranks = nranks,
        .timeout_ms = 5000,
        .deadline_ms = 30000,
    };
    struct mp_result res;
    char buf[1024];

    setenv("WEFT_SHM", "0", 1);
    setenv("WEFT_TOPOLOGY", topology, 1);
    cr_assert_eq(mp_run(&o, mismatch_rank, &kind, &res), 0);
    cr_assert(mp_all_passed(&res), "mismatch %d, %s: %s", kind, topology,
              mp_describe(&res, buf, sizeof buf));
    int said = 0;
    for (int r = 0; r < nranks; r++)
        said |= ((volatile int *)mp_shm())[r] == WEFT_EMISMATCH;
    cr_assert(said, "mismatch %d, %s: no rank returned WEFT_EMISMATCH", kind,
              topology);
}

Test(rooted, mismatch_root_mesh, .timeout = 60)
{
    run_mismatch(MM_ROOT, 3, "mesh");
}

Test(rooted, mismatch_count_ring, .timeout = 60)
{
    run_mismatch(MM_COUNT, 3, "ring");
}

Test(rooted, mismatch_dtype_ring, .timeout = 60)
{
    run_mismatch(MM_DTYPE, 3, "ring");
}

Test(rooted, mismatch_v_counts_mesh, .timeout = 60)
{
    run_mismatch(MM_V, 3, "mesh");
}

Test(rooted, mismatch_v_counts_ring, .timeout = 60)
{
    run_mismatch(MM_V, 4, "ring");
}
