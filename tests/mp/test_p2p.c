/*
 * send/recv between every ordered pair of ranks, sizes around the frame and
 * wire boundaries, and a long run of back-to-back operations of changing
 * sizes (a receive left posted by one operation would swallow the data of
 * the next).
 */
#define _GNU_SOURCE
#include <criterion/criterion.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"
#include "weft.h"

#define NELEMS(a) (sizeof(a) / sizeof((a)[0]))

/* Bytes (WEFT_UINT8): around 4 KiB and 64 KiB, then several frames. */
static const size_t pair_sizes[] = {1,    2,     3,     100,
                                    4095, 4096,  4097,  65535,
                                    65536, (1u << 20) + 3, (4u << 20) + 5};

static uint64_t pair_seed(int from, int to, size_t nbytes, uint64_t salt)
{
    return mp_hash64(salt ^ ((uint64_t)from << 56) ^ ((uint64_t)to << 48) ^
                     nbytes);
}

/* One step: `from` sends nbytes to `to` while `to` receives them; the other
 * ranks do nothing. The callers run a barrier between steps. */
static int p2p_step(weft_comm *c, int rank, int from, int to, weft_dtype dt,
                    size_t count, uint64_t salt)
{
    size_t nb = count * weft_dtype_size(dt);
    if (rank != from && rank != to)
        return 0;
    char what[160];
    snprintf(what, sizeof what, "%s(%s, count=%zu, %d -> %d)",
             rank == from ? "send" : "recv", mp_dtype_name(dt), count, from,
             to);
    unsigned char *buf = mp_alloc(nb);
    unsigned char *exp = mp_alloc(nb);
    mp_fill_bytes(exp, nb, pair_seed(from, to, nb, salt));
    int fail = 0, rc;
    if (rank == from) {
        memcpy(buf, exp, nb);
        rc = weft_send(c, buf, count, dt, to);
        if (rc != WEFT_OK)
            fail = mp_report_rc(c, what, rc);
        else
            fail = mp_check_elems(what, "sendbuf (must be unchanged)", dt,
                                  buf, exp, count);
    } else {
        rc = weft_recv(c, buf, count, dt, from);
        if (rc != WEFT_OK)
            fail = mp_report_rc(c, what, rc);
        else
            fail = mp_check_elems(what, "received", dt, buf, exp, count) ||
                   mp_check_canary(what, "recvbuf", buf, nb);
    }
    free(buf);
    free(exp);
    return fail;
}

static int pairs_rank(int rank, int nranks, void *arg)
{
    (void)arg;
    weft_comm *c;
    if (mp_init(&c, rank, nranks) != WEFT_OK)
        return 1;
    int fail = 0;
    for (int from = 0; from < nranks && !fail; from++) {
        for (int to = 0; to < nranks && !fail; to++) {
            if (from == to)
                continue;
            for (size_t k = 0; k < NELEMS(pair_sizes) && !fail; k++) {
                fail = p2p_step(c, rank, from, to, WEFT_UINT8, pair_sizes[k],
                                0x1234);
                if (!fail) {
                    int rc = weft_barrier(c);
                    if (rc != WEFT_OK) {
                        char what[96];
                        snprintf(what, sizeof what,
                                 "barrier after %d -> %d, %zu bytes", from,
                                 to, pair_sizes[k]);
                        fail = mp_report_rc(c, what, rc);
                    }
                }
            }
        }
    }
    int rc = weft_finalize(c);
    if (rc != WEFT_OK) {
        mp_log("weft_finalize returned %s", weft_err_name(rc));
        fail = 1;
    }
    return fail;
}

/* ---- Back-to-back operations of changing sizes ---- */

#define MIXED_OPS 1000
#define MIXED_MAX_BYTES 200000

static const weft_dtype move_dtypes[] = {WEFT_UINT8, WEFT_INT32,
                                         WEFT_BFLOAT16, WEFT_FLOAT32,
                                         WEFT_FLOAT64};
static const weft_dtype sum_dtypes[] = {WEFT_INT32, WEFT_FLOAT32,
                                        WEFT_FLOAT64};

/* A small integer, so float sums are exact. */
static double mixed_value(int step, int rank, size_t i)
{
    uint64_t h = mp_hash64(((uint64_t)step << 40) ^ ((uint64_t)rank << 32) ^ i);
    return (double)((int64_t)(h % 201) - 100);
}

static int mixed_all_reduce(weft_comm *c, int rank, int nranks, int step,
                            weft_dtype dt, size_t count)
{
    size_t nb = count * weft_dtype_size(dt);
    char what[160];
    snprintf(what, sizeof what, "op %d: all_reduce(sum, %s, count=%zu)", step,
             mp_dtype_name(dt), count);
    unsigned char *buf = mp_alloc(nb), *exp = mp_alloc(nb);
    for (size_t i = 0; i < count; i++) {
        double acc = 0;
        for (int r = 0; r < nranks; r++)
            acc += mixed_value(step, r, i);
        mp_put_value(dt, exp, i, acc);
        mp_put_value(dt, buf, i, mixed_value(step, rank, i));
    }
    int fail, rc = weft_all_reduce(c, buf, buf, count, dt, WEFT_SUM);
    if (rc != WEFT_OK)
        fail = mp_report_rc(c, what, rc);
    else
        fail = mp_check_elems(what, "result", dt, buf, exp, count) ||
               mp_check_canary(what, "buf", buf, nb);
    free(buf);
    free(exp);
    return fail;
}

static int mixed_broadcast(weft_comm *c, int rank, int step, weft_dtype dt,
                           size_t count, int root)
{
    size_t nb = count * weft_dtype_size(dt);
    char what[160];
    snprintf(what, sizeof what, "op %d: broadcast(%s, count=%zu, root=%d)",
             step, mp_dtype_name(dt), count, root);
    unsigned char *buf = mp_alloc(nb), *exp = mp_alloc(nb);
    mp_fill_bytes(exp, nb, mp_hash64((uint64_t)step * 31 + 7));
    if (rank == root)
        memcpy(buf, exp, nb);
    int fail, rc = weft_broadcast(c, buf, count, dt, root);
    if (rc != WEFT_OK)
        fail = mp_report_rc(c, what, rc);
    else
        fail = mp_check_elems(what, "result", dt, buf, exp, count) ||
               mp_check_canary(what, "buf", buf, nb);
    free(buf);
    free(exp);
    return fail;
}

static int mixed_all_gather(weft_comm *c, int rank, int nranks, int step,
                            weft_dtype dt, size_t count)
{
    size_t nb = count * weft_dtype_size(dt), total = nb * (size_t)nranks;
    char what[160];
    snprintf(what, sizeof what, "op %d: all_gather(%s, count=%zu)", step,
             mp_dtype_name(dt), count);
    unsigned char *send = mp_alloc(nb), *recv = mp_alloc(total);
    unsigned char *exp = mp_alloc(total);
    for (int r = 0; r < nranks; r++)
        mp_fill_bytes(exp + (size_t)r * nb, nb,
                      mp_hash64(((uint64_t)step << 8) ^ (uint64_t)r));
    memcpy(send, exp + (size_t)rank * nb, nb);
    int fail, rc = weft_all_gather(c, send, recv, count, dt);
    if (rc != WEFT_OK)
        fail = mp_report_rc(c, what, rc);
    else
        fail = mp_check_elems(what, "result", dt, recv, exp,
                              count * (size_t)nranks) ||
               mp_check_canary(what, "recvbuf", recv, total);
    free(send);
    free(recv);
    free(exp);
    return fail;
}

static int mixed_rank(int rank, int nranks, void *arg)
{
    (void)arg;
    weft_comm *c;
    if (mp_init(&c, rank, nranks) != WEFT_OK)
        return 1;
    int fail = 0;
    double t0 = mp_now_ms();
    uint64_t counts[4] = {0};
    for (int step = 0; step < MIXED_OPS && !fail; step++) {
        /* Every rank draws the same sequence. */
        uint64_t h1 = mp_hash64(0xabcdef00ULL + (uint64_t)step);
        uint64_t h2 = mp_hash64(h1);
        size_t nbytes = (size_t)(h2 % (MIXED_MAX_BYTES + 1));
        int kind = (int)(h1 % 4);
        counts[kind]++;
        switch (kind) {
        case 0: {
            weft_dtype dt = sum_dtypes[(h1 >> 8) % NELEMS(sum_dtypes)];
            fail = mixed_all_reduce(c, rank, nranks, step, dt,
                                    nbytes / weft_dtype_size(dt));
            break;
        }
        case 1: {
            weft_dtype dt = move_dtypes[(h1 >> 8) % NELEMS(move_dtypes)];
            fail = mixed_broadcast(c, rank, step, dt,
                                   nbytes / weft_dtype_size(dt),
                                   (int)((h1 >> 16) % (uint64_t)nranks));
            break;
        }
        case 2: {
            weft_dtype dt = move_dtypes[(h1 >> 8) % NELEMS(move_dtypes)];
            int from = (int)((h1 >> 16) % (uint64_t)nranks);
            int to = (from + 1 + (int)((h1 >> 24) % (uint64_t)(nranks - 1))) %
                     nranks;
            fail = p2p_step(c, rank, from, to, dt,
                            nbytes / weft_dtype_size(dt), (uint64_t)step);
            break;
        }
        default: {
            weft_dtype dt = move_dtypes[(h1 >> 8) % NELEMS(move_dtypes)];
            /* all_gather moves nranks times as much: keep it to the cap. */
            fail = mixed_all_gather(c, rank, nranks, step, dt,
                                    nbytes / (size_t)nranks /
                                        weft_dtype_size(dt));
            break;
        }
        }
    }
    if (!fail && rank == 0)
        mp_log("%d mixed ops (%llu all_reduce, %llu broadcast, %llu "
               "send/recv, %llu all_gather) in %.0f ms",
               MIXED_OPS, (unsigned long long)counts[0],
               (unsigned long long)counts[1], (unsigned long long)counts[2],
               (unsigned long long)counts[3], mp_now_ms() - t0);
    int rc = weft_finalize(c);
    if (rc != WEFT_OK) {
        mp_log("weft_finalize returned %s", weft_err_name(rc));
        fail = 1;
    }
    return fail;
}

/* ---- sendrecv in place ----
 *
 * sendbuf == recvbuf (and buffers that overlap): a shift around the ring
 * (to the next rank, from the previous), sizes from a few bytes to several
 * frames; bytes of the peer may arrive before this rank's own have left,
 * so this rank's must not be overwritten first. Then a posted all_reduce
 * and a posted sendrecv in place on the same buffer: the sendrecv sends
 * the all_reduce's result, not what the buffer held when it was posted. */
static const size_t inplace_counts[] = {1, 25, 16385, (size_t)1 << 20};

static int32_t inplace_value(int rank, size_t i, int salt)
{
    return (int32_t)(i * 2654435761u + (size_t)rank * 40503u + (size_t)salt);
}

static int inplace_rank(int rank, int nranks, void *arg)
{
    const int next = (rank + 1) % nranks, prev = (rank + nranks - 1) % nranks;
    const size_t most = (size_t)1 << 20, shift = 250; /* overlap: 1000 B */
    int32_t *buf = mp_alloc((most + shift) * sizeof *buf);
    weft_request *req[2];
    weft_comm *c;
    int rc, fail = 0;

    (void)arg;
    if (mp_init(&c, rank, nranks) != WEFT_OK)
        return 1;
    for (size_t k = 0; k < NELEMS(inplace_counts) && !fail; k++) {
        size_t n = inplace_counts[k];

        for (int over = 0; over < 2 && !fail; over++) {
            /* over: recvbuf starts `shift` elements past sendbuf. */
            int32_t *rb = buf + (over ? shift : 0);

            for (size_t i = 0; i < n; i++)
                buf[i] = inplace_value(rank, i, (int)k);
            rc = weft_sendrecv(c, buf, next, rb, prev, n, WEFT_INT32);
            if (rc != WEFT_OK)
                return mp_report_rc(c, "sendrecv in place", rc);
            for (size_t i = 0; i < n && !fail; i++)
                if (rb[i] != inplace_value(prev, i, (int)k)) {
                    mp_log("sendrecv of %zu int32 %s: element %zu is %d, "
                           "rank %d sent %d",
                           n, over ? "into an overlapping buffer" : "in place",
                           i, rb[i], prev, inplace_value(prev, i, (int)k));
                    fail = 1;
                }
        }
    }
    /* Posted behind an all_reduce on the same buffer. */
    for (size_t i = 0; i < most && !fail; i++)
        buf[i] = inplace_value(rank, i, 99);
    if (!fail && ((rc = weft_iall_reduce(c, buf, buf, most, WEFT_INT32,
                                         WEFT_SUM, &req[0])) != WEFT_OK ||
                  (rc = weft_isendrecv(c, buf, next, buf, prev, most,
                                       WEFT_INT32, &req[1])) != WEFT_OK ||
                  (rc = weft_wait_all(req, 2)) != WEFT_OK))
        return mp_report_rc(c, "iall_reduce then isendrecv in place", rc);
    for (size_t i = 0; i < most && !fail; i++) {
        int32_t want = 0;

        for (int r = 0; r < nranks; r++)
            want =
                (int32_t)((uint32_t)want + (uint32_t)inplace_value(r, i, 99));
        if (buf[i] != want) {
            mp_log("isendrecv in place behind an iall_reduce: element %zu "
                   "is %d, the all_reduce's result is %d",
                   i, buf[i], want);
            fail = 1;
        }
    }
    if (!fail) {
        weft_request_free(req[0]);
        weft_request_free(req[1]);
    }
    free(buf);
    rc = weft_finalize(c);
    return fail || rc != WEFT_OK;
}

static void run_job(mp_rank_fn fn, int nranks, int wires)
{
    /* Split p2p transfers over the wires from 8 KiB on, so that the sizes
     * here run several wires per transfer. */
    setenv("WEFT_MIN_WIRE_BYTES", "8192", 0);
    struct mp_opts o = {
        .nranks = nranks,
        .wires = wires,
        .timeout_ms = 30000,
        .deadline_ms = 100000,
    };
    struct mp_result res;
    char buf[1024];
    cr_assert_eq(mp_run(&o, fn, NULL, &res), 0, "could not set up the job");
    cr_assert(mp_all_passed(&res), "%d ranks, %d wires: %s", nranks, wires,
              mp_describe(&res, buf, sizeof buf));
}

Test(p2p, pairs_2ranks_3wires, .timeout = 120) { run_job(pairs_rank, 2, 3); }
Test(p2p, pairs_3ranks_3wires, .timeout = 120) { run_job(pairs_rank, 3, 3); }
Test(p2p, pairs_4ranks_3wires, .timeout = 120) { run_job(pairs_rank, 4, 3); }

/* Over shared memory (rings and one-copy reads) and over TCP (several
 * wires; its sending thread on for every batch). */
Test(p2p, sendrecv_in_place_shm_3ranks, .timeout = 120)
{
    setenv("WEFT_SHM", "1", 1);
    run_job(inplace_rank, 3, 1);
}

Test(p2p, sendrecv_in_place_tcp_2ranks_2wires, .timeout = 120)
{
    setenv("WEFT_TRANSPORT", "tcp", 1);
    setenv("WEFT_SHM", "0", 1);
    run_job(inplace_rank, 2, 2);
}

Test(p2p, sendrecv_in_place_tcp_send_thread_3ranks, .timeout = 120)
{
    setenv("WEFT_TRANSPORT", "tcp", 1);
    setenv("WEFT_SHM", "0", 1);
    setenv("WEFT_SEND_THREAD", "1", 1);
    setenv("WEFT_SEND_THREAD_MIN_BYTES", "1", 1);
    run_job(inplace_rank, 3, 1);
}

Test(p2p, mixed_2ranks_1wire, .timeout = 120) { run_job(mixed_rank, 2, 1); }
Test(p2p, mixed_3ranks_3wires, .timeout = 120) { run_job(mixed_rank, 3, 3); }
Test(p2p, mixed_4ranks_2wires, .timeout = 120) { run_job(mixed_rank, 4, 2); }
