/* The collective test cases; see coll_cases.h. */
#define _GNU_SOURCE
#include "coll_cases.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"

/* The library's default frame; WEFT_FRAME_BYTES overrides it (and the test
 * sets it to 64 KiB to stay fast). */
#define DEFAULT_FRAME_BYTES 262144

static const weft_dtype coll_dtypes[] = {WEFT_INT32, WEFT_FLOAT32,
                                         WEFT_BFLOAT16, WEFT_FLOAT64};
static const weft_redop coll_ops[] = {WEFT_SUM, WEFT_PROD, WEFT_MIN, WEFT_MAX};
#define NELEMS(a) (sizeof(a) / sizeof((a)[0]))

static size_t frame_bytes(void)
{
    const char *s = getenv("WEFT_FRAME_BYTES");
    if (s && *s) {
        char *end;
        unsigned long long v = strtoull(s, &end, 10);
        if (*end == '\0' && v > 0)
            return (size_t)v;
    }
    return DEFAULT_FRAME_BYTES;
}

/* ---- Values that keep every reduction exact ---- */

/* A small integer for element i of rank's input. SUM of bf16 stays in 0..3
 * per rank (at most 12 in all: exact), PROD stays within +-81 (+-16 for
 * bf16), MIN/MAX spread wider. No zeros in PROD, so no -0.0. */
static double gen_value(weft_dtype dt, weft_redop op, int rank, size_t i,
                        uint64_t seed)
{
    uint64_t h = mp_hash64(seed ^ mp_hash64(((uint64_t)rank << 48) ^ i));
    static const int prod_vals[] = {-3, -2, -1, 1, 2, 3};
    static const int prod_vals_bf16[] = {-2, -1, 1, 2};
    switch (op) {
    case WEFT_SUM:
        if (dt == WEFT_INT32)
            return (double)((int64_t)(h % 2001) - 1000);
        if (dt == WEFT_BFLOAT16)
            return (double)(h % 4);
        return (double)((int64_t)(h % 33) - 16);
    case WEFT_PROD:
        if (dt == WEFT_BFLOAT16)
            return prod_vals_bf16[h % NELEMS(prod_vals_bf16)];
        return prod_vals[h % NELEMS(prod_vals)];
    case WEFT_MIN:
    case WEFT_MAX:
        if (dt == WEFT_INT32)
            return (double)((int64_t)(h % 200001) - 100000);
        if (dt == WEFT_BFLOAT16)
            return (double)((int64_t)(h % 129) - 64);
        return (double)((int64_t)(h % 2001) - 1000);
    }
    return 0;
}

static double reduce2(weft_redop op, double a, double b)
{
    switch (op) {
    case WEFT_SUM:
        return a + b;
    case WEFT_PROD:
        return a * b;
    case WEFT_MIN:
        return a < b ? a : b;
    case WEFT_MAX:
        return a > b ? a : b;
    }
    return a;
}

/* ---- Reporting ---- */

/* All ranks' results of an all_reduce must be bitwise identical: each rank
 * hashes its own and they compare the all_gathered hashes. */
static int check_same_everywhere(const struct coll_ctx *x, const char *what,
                                 const void *buf, size_t nbytes)
{
    uint64_t h = mp_fnv1a(buf, nbytes), all[MP_MAX_RANKS];
    char w[256];
    snprintf(w, sizeof w, "%s: all_gather of the result hashes", what);
    int rc = weft_all_gather(x->c, &h, all, 1, WEFT_UINT64);
    if (rc != WEFT_OK)
        return mp_report_rc(x->c, w, rc);
    for (int r = 0; r < x->nranks; r++) {
        if (all[r] != h) {
            mp_log("%s: result differs between ranks: hash %016llx on rank "
                   "%d, %016llx here",
                   what, (unsigned long long)all[r], r, (unsigned long long)h);
            return 1;
        }
    }
    return 0;
}

/* ---- Cases ---- */

static int case_all_reduce(struct coll_ctx *x, weft_dtype dt, size_t count,
                           weft_redop op, int inplace, uint64_t seed)
{
    size_t es = weft_dtype_size(dt), nb = count * es;
    char what[160];
    snprintf(what, sizeof what, "all_reduce(%s, %s, count=%zu, %s)",
             mp_op_name(op), mp_dtype_name(dt), count,
             inplace ? "in place" : "out of place");
    unsigned char *send = mp_alloc(nb);
    unsigned char *recv = inplace ? send : mp_alloc(nb);
    unsigned char *exp = mp_alloc(nb), *orig = mp_alloc(nb);
    for (size_t i = 0; i < count; i++) {
        mp_put_value(dt, send, i, gen_value(dt, op, x->rank, i, seed));
        double acc = gen_value(dt, op, 0, i, seed);
        for (int r = 1; r < x->nranks; r++)
            acc = reduce2(op, acc, gen_value(dt, op, r, i, seed));
        mp_put_value(dt, exp, i, acc);
    }
    memcpy(orig, send, nb);
    int fail = 0;
    int rc = weft_all_reduce(x->c, send, recv, count, dt, op);
    if (rc != WEFT_OK) {
        fail = mp_report_rc(x->c, what, rc);
        goto out;
    }
    fail = mp_check_elems(what, "result", dt, recv, exp, count) ||
           mp_check_canary(what, "recvbuf", recv, nb);
    if (!fail && !inplace)
        fail = mp_check_elems(what, "sendbuf (must be unchanged)", dt, send,
                              orig, count) ||
               mp_check_canary(what, "sendbuf", send, nb);
    if (!fail)
        fail = check_same_everywhere(x, what, recv, nb);
out:
    free(send);
    if (!inplace)
        free(recv);
    free(exp);
    free(orig);
    return fail;
}

static int case_reduce_scatter(struct coll_ctx *x, weft_dtype dt, size_t count,
                               weft_redop op, int inplace, uint64_t seed)
{
    size_t es = weft_dtype_size(dt), nb = count * es;
    size_t total = count * (size_t)x->nranks;
    char what[160];
    snprintf(what, sizeof what, "reduce_scatter(%s, %s, recvcount=%zu, %s)",
             mp_op_name(op), mp_dtype_name(dt), count,
             inplace == 2 ? "in place, recvbuf == sendbuf"
             : inplace    ? "in place"
                          : "out of place");
    unsigned char *send = mp_alloc(total * es);
    /* 1: recvbuf at this rank's block of sendbuf (as NCCL); 2: recvbuf ==
     * sendbuf, the result landing in the first block. */
    unsigned char *recv = inplace == 2 ? send
                          : inplace    ? send + (size_t)x->rank * nb
                                       : mp_alloc(nb);
    unsigned char *exp = mp_alloc(nb), *orig = mp_alloc(total * es);
    for (size_t i = 0; i < total; i++)
        mp_put_value(dt, send, i, gen_value(dt, op, x->rank, i, seed));
    for (size_t j = 0; j < count; j++) {
        size_t gi = (size_t)x->rank * count + j;
        double acc = gen_value(dt, op, 0, gi, seed);
        for (int r = 1; r < x->nranks; r++)
            acc = reduce2(op, acc, gen_value(dt, op, r, gi, seed));
        mp_put_value(dt, exp, j, acc);
    }
    memcpy(orig, send, total * es);
    int fail = 0;
    int rc = weft_reduce_scatter(x->c, send, recv, count, dt, op);
    if (rc != WEFT_OK) {
        fail = mp_report_rc(x->c, what, rc);
        goto out;
    }
    fail = mp_check_elems(what, "result", dt, recv, exp, count) ||
           mp_check_canary(what, inplace ? "sendbuf" : "recvbuf",
                           inplace ? send : recv, inplace ? total * es : nb);
    if (!fail && !inplace)
        fail = mp_check_elems(what, "sendbuf (must be unchanged)", dt, send,
                              orig, total) ||
               mp_check_canary(what, "sendbuf", send, total * es);
out:
    free(send);
    if (!inplace)
        free(recv);
    free(exp);
    free(orig);
    return fail;
}

static uint64_t block_seed(uint64_t seed, int rank)
{
    return mp_hash64(seed ^ (0x51ed270b27a3b1c5ULL * (uint64_t)(rank + 1)));
}

static int case_all_gather(struct coll_ctx *x, weft_dtype dt, size_t count,
                           int inplace, uint64_t seed)
{
    size_t es = weft_dtype_size(dt), nb = count * es;
    size_t total_nb = nb * (size_t)x->nranks;
    char what[160];
    snprintf(what, sizeof what, "all_gather(%s, count=%zu, %s)",
             mp_dtype_name(dt), count,
             inplace == 2 ? "in place, sendbuf == recvbuf"
             : inplace    ? "in place"
                          : "out of place");
    unsigned char *recv = mp_alloc(total_nb);
    /* 1: sendbuf at this rank's block of recvbuf (as NCCL); 2: sendbuf ==
     * recvbuf, this rank's data in the first block. */
    unsigned char *send = inplace == 2 ? recv
                          : inplace    ? recv + (size_t)x->rank * nb
                                       : mp_alloc(nb);
    unsigned char *exp = mp_alloc(total_nb), *orig = mp_alloc(nb);
    for (int r = 0; r < x->nranks; r++)
        mp_fill_bytes(exp + (size_t)r * nb, nb, block_seed(seed, r));
    memcpy(send, exp + (size_t)x->rank * nb, nb);
    memcpy(orig, send, nb);
    int fail = 0;
    int rc = weft_all_gather(x->c, send, recv, count, dt);
    if (rc != WEFT_OK) {
        fail = mp_report_rc(x->c, what, rc);
        goto out;
    }
    fail = mp_check_elems(what, "result", dt, recv, exp, count * x->nranks) ||
           mp_check_canary(what, "recvbuf", recv, total_nb);
    if (!fail && !inplace)
        fail = mp_check_elems(what, "sendbuf (must be unchanged)", dt, send,
                              orig, count) ||
               mp_check_canary(what, "sendbuf", send, nb);
out:
    free(recv);
    if (!inplace)
        free(send);
    free(exp);
    free(orig);
    return fail;
}

static int case_broadcast(struct coll_ctx *x, weft_dtype dt, size_t count,
                          int root, uint64_t seed)
{
    size_t es = weft_dtype_size(dt), nb = count * es;
    char what[160];
    snprintf(what, sizeof what, "broadcast(%s, count=%zu, root=%d)",
             mp_dtype_name(dt), count, root);
    unsigned char *buf = mp_alloc(nb), *exp = mp_alloc(nb);
    mp_fill_bytes(exp, nb, block_seed(seed, 1000 + root));
    if (x->rank == root)
        memcpy(buf, exp, nb);
    int fail = 0;
    int rc = weft_broadcast(x->c, buf, count, dt, root);
    if (rc != WEFT_OK)
        fail = mp_report_rc(x->c, what, rc);
    else
        fail = mp_check_elems(what, "result", dt, buf, exp, count) ||
               mp_check_canary(what, "buf", buf, nb);
    free(buf);
    free(exp);
    return fail;
}

/* Every rank counts itself into shared memory before the barrier; after it,
 * all of them must have done so. */
static int case_barrier(struct coll_ctx *x)
{
    unsigned long *arrived = mp_shm();
    unsigned long k = x->nbarriers++;
    __atomic_add_fetch(arrived, 1, __ATOMIC_SEQ_CST);
    int rc = weft_barrier(x->c);
    if (rc != WEFT_OK)
        return mp_report_rc(x->c, "barrier", rc);
    unsigned long seen = __atomic_load_n(arrived, __ATOMIC_SEQ_CST);
    unsigned long need = (unsigned long)x->nranks * (k + 1);
    if (seen < need) {
        mp_log("barrier #%lu returned before every rank entered it "
               "(%lu of %lu arrivals)",
               k, seen, need);
        return 1;
    }
    return 0;
}

int coll_run_cases(struct coll_ctx *x)
{
    size_t fb = frame_bytes();
    for (size_t d = 0; d < NELEMS(coll_dtypes); d++) {
        weft_dtype dt = coll_dtypes[d];
        size_t es = weft_dtype_size(dt);
        if (es == 0) {
            mp_log("weft_dtype_size(%s) is 0", mp_dtype_name(dt));
            return 1;
        }
        size_t f = fb / es, n = (size_t)x->nranks;
        /* Around the frame, and around the rank count: recursive halving
         * + doubling needs an element per rank (n - 1 goes another way),
         * and 101n + 3 is a mid size that no power of two divides. */
        const size_t counts[] = {0,          1,     7, f - 1, f + 1,
                                 3 * f + 13, n - 1, n, n + 1, 101 * n + 3};
        for (size_t k = 0; k < NELEMS(counts); k++) {
            size_t count = counts[k];
            uint64_t seed = mp_hash64(((uint64_t)dt << 40) ^ count);
            for (size_t o = 0; o < NELEMS(coll_ops); o++) {
                for (int inplace = 0; inplace < 2; inplace++) {
                    if (case_all_reduce(x, dt, count, coll_ops[o], inplace,
                                        seed + o))
                        return 1;
                    x->ncases++;
                }
            }
            for (size_t o = 0; o < NELEMS(coll_ops); o++) {
                for (int inplace = 0; inplace < 3; inplace++) {
                    if (case_reduce_scatter(x, dt, count, coll_ops[o], inplace,
                                            seed + 7 * o + 1))
                        return 1;
                    x->ncases++;
                }
            }
            for (int inplace = 0; inplace < 3; inplace++) {
                if (case_all_gather(x, dt, count, inplace, seed + inplace))
                    return 1;
                x->ncases++;
            }
            for (int root = 0; root < x->nranks; root++) {
                if (case_broadcast(x, dt, count, root, seed))
                    return 1;
                x->ncases++;
            }
            if (case_barrier(x))
                return 1;
            x->ncases++;
        }
    }
    return 0;
}
