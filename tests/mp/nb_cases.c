/* Non-blocking test cases; see nb_cases.h. */
#define _GNU_SOURCE
#include "nb_cases.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"

#define NELEMS(a) (sizeof(a) / sizeof((a)[0]))

static int fail_rc(weft_comm *c, const char *what, int rc)
{
    return mp_report_rc(c, what, rc);
}

/* Small integers as float32: sums stay exact, but the bits still say
 * whether the same operation ran on the same data. */
static void fill_f32(float *b, size_t n, uint64_t seed)
{
    for (size_t i = 0; i < n; i++)
        b[i] = (float)((int)(mp_hash64(seed ^ i) % 201) - 100) / 4.0f;
}

/* ---- every operation ---- */

enum { OP_AR, OP_AG, OP_RS, OP_BC, OP_SR, OP_P2P, OP_BAR, OP_N };
static const char *op_names[] = {"all_reduce", "all_gather", "reduce_scatter",
                                 "broadcast",  "sendrecv",   "send/recv",
                                 "barrier"};

/* Runs op k on (in, out) blocking (req NULL) or posts it. */
static int run_op(weft_comm *c, int k, float *in, float *out, size_t count,
                  weft_request **req)
{
    const int me = weft_rank(c), n = weft_size(c);
    const int right = (me + 1) % n, left = (me + n - 1) % n;

    switch (k) {
    case OP_AR:
        return req ? weft_iall_reduce(c, in, out, count, WEFT_FLOAT32, WEFT_SUM,
                                      req)
                   : weft_all_reduce(c, in, out, count, WEFT_FLOAT32, WEFT_SUM);
    case OP_AG:
        return req ? weft_iall_gather(c, in, out, count, WEFT_FLOAT32, req)
                   : weft_all_gather(c, in, out, count, WEFT_FLOAT32);
    case OP_RS:
        return req ? weft_ireduce_scatter(c, in, out, count, WEFT_FLOAT32,
                                          WEFT_MAX, req)
                   : weft_reduce_scatter(c, in, out, count, WEFT_FLOAT32,
                                         WEFT_MAX);
    case OP_BC:
        memcpy(out, in, count * sizeof *in);
        return req ? weft_ibroadcast(c, out, count, WEFT_FLOAT32, n - 1, req)
                   : weft_broadcast(c, out, count, WEFT_FLOAT32, n - 1);
    case OP_SR:
        return req ? weft_isendrecv(c, in, right, out, left, count,
                                    WEFT_FLOAT32, req)
                   : weft_sendrecv(c, in, right, out, left, count,
                                   WEFT_FLOAT32);
    case OP_P2P:
        /* Rank 0 sends to the last rank. */
        if (me == 0)
            return req ? weft_isend(c, in, count, WEFT_FLOAT32, n - 1, req)
                       : weft_send(c, in, count, WEFT_FLOAT32, n - 1);
        if (me == n - 1)
            return req ? weft_irecv(c, out, count, WEFT_FLOAT32, 0, req)
                       : weft_recv(c, out, count, WEFT_FLOAT32, 0);
        if (req)
            *req = NULL;
        return WEFT_OK;
    default:
        return req ? weft_ibarrier(c, req) : weft_barrier(c);
    }
}

int nb_every_op(weft_comm *c)
{
    static const size_t counts[] = {1, 1000, 70001};
    const int me = weft_rank(c), n = weft_size(c);

    for (size_t ci = 0; ci < NELEMS(counts); ci++)
        for (int k = 0; k < OP_N; k++) {
            size_t count = counts[ci], outn = count * (size_t)n;
            float *in = mp_alloc(outn * sizeof *in);
            float *ob = mp_alloc(outn * sizeof *ob);
            float *on = mp_alloc(outn * sizeof *on);
            weft_request *req = NULL;
            char what[96];
            int rc, fail = 0;

            snprintf(what, sizeof what, "i%s(count %zu)", op_names[k], count);
            fill_f32(in, outn, mp_hash64((uint64_t)me * 7919 + count + k));
            memset(ob, 0, outn * sizeof *ob);
            memset(on, 0, outn * sizeof *on);
            if ((rc = run_op(c, k, in, ob, count, NULL)) != WEFT_OK)
                fail = fail_rc(c, op_names[k], rc);
            else if ((rc = run_op(c, k, in, on, count, &req)) != WEFT_OK)
                fail = fail_rc(c, what, rc);
            else if (req != NULL && (rc = weft_wait(req)) != WEFT_OK)
                fail = fail_rc(c, what, rc);
            else if (memcmp(ob, on, outn * sizeof *ob) != 0) {
                size_t i = mp_first_diff(ob, on, outn, sizeof *ob);
                mp_log("%s: element %zu is %g, blocking gave %g", what, i,
                       (double)on[i], (double)ob[i]);
                fail = 1;
            } else if (!mp_canary_ok(on, outn * sizeof *on)) {
                mp_log("%s: wrote past the end of its buffer", what);
                fail = 1;
            }
            weft_request_free(req);
            free(in);
            free(ob);
            free(on);
            if (fail)
                return 1;
        }
    return 0;
}

/* ---- random sequences ---- */

#define POOL 65536 /* floats */
#define MAXOPS 64

typedef struct {
    int k;
    weft_redop op;
    size_t count;
    size_t in, out; /* offsets in the pool */
} seq_op;

static uint64_t rnd(uint64_t *s)
{
    *s = mp_hash64(*s + 0x9e3779b97f4a7c15ull);
    return *s;
}

/* Lays out op o: buffers anywhere in the pool, overlapping other
 * operations' at will; within the operation, in place or disjoint as the
 * API allows. With reduces, mostly small all_reduces, most of them sums,
 * a third reading what the one before wrote (prev: NULL for the first):
 * what weft may run in batches, with the hazards that split them. */
static void seq_layout(seq_op *o, const seq_op *prev, int reduces, int n,
                       int me, uint64_t *s)
{
    size_t span;

    o->k = (int)(rnd(s) % 6); /* no barrier: it moves nothing */
    o->op = (weft_redop)(rnd(s) % 4);
    o->count = 1 + rnd(s) % (rnd(s) % 4 == 0 ? 4000 : 60);
    if (reduces) {
        o->k = rnd(s) % 8 == 0 ? o->k : OP_AR;
        o->op = rnd(s) % 4 == 0 ? o->op : WEFT_SUM;
        o->count = 1 + rnd(s) % (rnd(s) % 8 == 0 ? 3000 : 300);
    }
    span = o->count * (size_t)n;
    o->in = rnd(s) % (POOL - 2 * span);
    if (reduces && prev != NULL && rnd(s) % 3 == 0 &&
        prev->out + 2 * span < POOL)
        o->in = prev->out;
    switch (rnd(s) % 3) {
    case 0: /* in place */
        o->out = o->in;
        if (o->k == OP_AG)
            o->in = o->out + (size_t)me * o->count;
        if (o->k == OP_RS)
            o->out = o->in + (size_t)me * o->count;
        if (o->k == OP_SR || o->k == OP_P2P)
            o->out = o->in + o->count; /* must be disjoint */
        break;
    case 1: /* the output right after the input */
        o->out = o->in + span;
        break;
    default: /* anywhere else, clear of the input */
        o->out = rnd(s) % (POOL - span);
        if (o->out < o->in + span && o->in < o->out + span)
            o->out = o->in + span;
        break;
    }
}

static int seq_post(weft_comm *c, const seq_op *o, float *pool,
                    weft_request **req)
{
    float *in = pool + o->in, *out = pool + o->out;
    const int me = weft_rank(c), n = weft_size(c);

    switch (o->k) {
    case OP_AR:
        return req ? weft_iall_reduce(c, in, out, o->count, WEFT_FLOAT32, o->op,
                                      req)
                   : weft_all_reduce(c, in, out, o->count, WEFT_FLOAT32, o->op);
    case OP_RS:
        return req ? weft_ireduce_scatter(c, in, out, o->count, WEFT_FLOAT32,
                                          o->op, req)
                   : weft_reduce_scatter(c, in, out, o->count, WEFT_FLOAT32,
                                         o->op);
    case OP_BC:
        return req ? weft_ibroadcast(c, in, o->count, WEFT_FLOAT32,
                                     (int)(o->count % (size_t)n), req)
                   : weft_broadcast(c, in, o->count, WEFT_FLOAT32,
                                    (int)(o->count % (size_t)n));
    case OP_P2P:
        if (me == 0 || me == n - 1) {
            int peer = me == 0 ? n - 1 : 0;
            return req ? weft_isendrecv(c, in, peer, out, peer, o->count,
                                        WEFT_FLOAT32, req)
                       : weft_sendrecv(c, in, peer, out, peer, o->count,
                                       WEFT_FLOAT32);
        }
        if (req)
            *req = NULL;
        return WEFT_OK;
    default:
        return run_op(c, o->k, in, out, o->count, req);
    }
}

int nb_sequence(weft_comm *c, uint64_t seed, int reduces)
{
    const int me = weft_rank(c), n = weft_size(c);
    uint64_t s = seed;
    int nops = 1 + (int)(rnd(&s) % MAXOPS), fail = 0, rc;
    seq_op ops[MAXOPS];
    weft_request *reqs[MAXOPS] = {0};
    float *pb = mp_alloc(POOL * sizeof(float));
    float *pn = mp_alloc(POOL * sizeof(float));
    char what[96];

    for (int i = 0; i < nops; i++)
        seq_layout(&ops[i], i > 0 ? &ops[i - 1] : NULL, reduces, n, me, &s);
    fill_f32(pb, POOL, seed ^ (uint64_t)me);
    memcpy(pn, pb, POOL * sizeof(float));
    for (int i = 0; i < nops && !fail; i++)
        if ((rc = seq_post(c, &ops[i], pb, NULL)) != WEFT_OK) {
            snprintf(what, sizeof what, "seed %llu%s, blocking op %d (%s)",
                     (unsigned long long)seed, reduces ? " (reduces)" : "", i,
                     op_names[ops[i].k]);
            fail = fail_rc(c, what, rc);
        }
    for (int i = 0; i < nops && !fail; i++)
        if ((rc = seq_post(c, &ops[i], pn, &reqs[i])) != WEFT_OK) {
            snprintf(what, sizeof what, "seed %llu%s, post %d (%s)",
                     (unsigned long long)seed, reduces ? " (reduces)" : "", i,
                     op_names[ops[i].k]);
            fail = fail_rc(c, what, rc);
        }
    if (!fail && (rc = weft_wait_all(reqs, (size_t)nops)) != WEFT_OK) {
        snprintf(what, sizeof what, "seed %llu: weft_wait_all of %d",
                 (unsigned long long)seed, nops);
        fail = fail_rc(c, what, rc);
    }
    if (!fail && memcmp(pb, pn, POOL * sizeof(float)) != 0) {
        size_t i = mp_first_diff(pb, pn, POOL, sizeof(float));
        mp_log("seed %llu%s, %d operations: pool element %zu is %g after "
               "the non-blocking run, %g after the blocking one",
               (unsigned long long)seed, reduces ? " (reduces)" : "", nops, i,
               (double)pn[i], (double)pb[i]);
        fail = 1;
    }
    for (int i = 0; i < nops; i++)
        weft_request_free(reqs[i]);
    /* A send buffer rewritten right after its wait: what arrives is what
     * the buffer held at the post. */
    for (int j = 0; j < 8 && !fail && n >= 2; j++) {
        float v = (float)(j + 1);
        weft_request *r = NULL;

        if (me == 0) {
            for (int i = 0; i < 1000; i++)
                pn[i] = v;
            rc = weft_isend(c, pn, 1000, WEFT_FLOAT32, 1, &r);
            if (rc == WEFT_OK)
                rc = weft_wait(r);
            for (int i = 0; i < 1000; i++)
                pn[i] = -1.0f;
        } else if (me == 1) {
            rc = weft_irecv(c, pb, 1000, WEFT_FLOAT32, 0, &r);
            if (rc == WEFT_OK)
                rc = weft_wait(r);
            for (int i = 0; rc == WEFT_OK && i < 1000 && !fail; i++)
                if (pb[i] != v) {
                    mp_log("send %d: element %d is %g, sent %g", j, i,
                           (double)pb[i], (double)v);
                    fail = 1;
                }
        } else {
            rc = WEFT_OK;
        }
        weft_request_free(r);
        if (rc != WEFT_OK)
            fail = fail_rc(c, "isend/irecv, buffer rewritten after wait", rc);
    }
    free(pb);
    free(pn);
    return fail;
}

/* ---- large operations pending together ---- */

int nb_large(weft_comm *c)
{
    /* Whole frames (handed to the reducer thread by default) and short
     * last ones, at counts that split unevenly over ranks, lanes and
     * wires. */
    static const size_t counts[] = {(1u << 19) + 3, 3u * (1u << 16) + 7};
    const int me = weft_rank(c), n = weft_size(c);
    int fail = 0;

    for (size_t ci = 0; ci < NELEMS(counts) && !fail; ci++) {
        const size_t count = counts[ci], outn = count * (size_t)n;
        const size_t pool = outn + 2 * count;
        float *pb = mp_alloc(pool * sizeof(float));
        float *pn = mp_alloc(pool * sizeof(float));
        weft_request *reqs[4] = {0};
        char what[96];
        int rc = WEFT_OK;

        fill_f32(pb, pool, 0x1a7e ^ (uint64_t)me ^ count);
        memcpy(pn, pb, pool * sizeof(float));
        /* Run blocking on pb, then posted all at once on pn: an
         * all_reduce out of place, one in place on its output (it reads
         * what the first writes), a reduce_scatter of the whole input,
         * and an all_reduce in place on the input the reduce_scatter
         * reads. */
        for (int pass = 0; pass < 2 && rc == WEFT_OK; pass++) {
            float *p = pass == 0 ? pb : pn;
            float *in = p, *o1 = p + outn, *o3 = p + outn + count;
            weft_request **r = pass == 0 ? NULL : reqs;

            rc = run_op(c, OP_AR, in, o1, count, r ? &r[0] : NULL);
            if (rc == WEFT_OK)
                rc = run_op(c, OP_AR, o1, o1, count, r ? &r[1] : NULL);
            if (rc == WEFT_OK)
                rc = run_op(c, OP_RS, in, o3, count, r ? &r[2] : NULL);
            if (rc == WEFT_OK)
                rc = run_op(c, OP_AR, in, in, count, r ? &r[3] : NULL);
        }
        if (rc == WEFT_OK)
            rc = weft_wait_all(reqs, 4);
        snprintf(what, sizeof what, "large operations (count %zu)", count);
        if (rc != WEFT_OK)
            fail = fail_rc(c, what, rc);
        else if (memcmp(pb, pn, pool * sizeof(float)) != 0) {
            size_t i = mp_first_diff(pb, pn, pool, sizeof(float));
            mp_log("%s: element %zu is %g posted, %g blocking", what, i,
                   (double)pn[i], (double)pb[i]);
            fail = 1;
        }
        for (int i = 0; i < 4; i++)
            weft_request_free(reqs[i]);
        free(pb);
        free(pn);
    }
    return fail;
}

/* ---- a pipeline ---- */

#define MB 16
#define MBLEN 4096

/* The stage's computation: what rank r does to a micro-batch. */
static void stage(float *x, size_t n, int r)
{
    for (size_t i = 0; i < n; i++)
        x[i] = x[i] * 0.5f + (float)r;
}

int nb_pipeline(weft_comm *c)
{
    const int me = weft_rank(c), n = weft_size(c);
    float *buf[2] = {mp_alloc(MBLEN * sizeof(float)),
                     mp_alloc(MBLEN * sizeof(float))};
    float *out[2] = {mp_alloc(MBLEN * sizeof(float)),
                     mp_alloc(MBLEN * sizeof(float))};
    weft_request *rx[2] = {NULL, NULL}, *tx[2] = {NULL, NULL};
    int fail = 0, rc = WEFT_OK;

    if (me > 0)
        rc = weft_irecv(c, buf[0], MBLEN, WEFT_FLOAT32, me - 1, &rx[0]);
    for (int m = 0; m < MB && rc == WEFT_OK && !fail; m++) {
        int s = m % 2;

        if (me == 0) {
            for (size_t i = 0; i < MBLEN; i++)
                buf[s][i] = (float)(m * 8 + (int)(i % 8));
        } else {
            if ((rc = weft_wait(rx[s])) != WEFT_OK)
                break;
            weft_request_free(rx[s]);
            rx[s] = NULL;
            /* The next receive goes out before this batch's compute. */
            if (m + 1 < MB &&
                (rc = weft_irecv(c, buf[1 - s], MBLEN, WEFT_FLOAT32, me - 1,
                                 &rx[1 - s])) != WEFT_OK)
                break;
        }
        /* The send that used out[s] two batches ago must be done. */
        if (tx[s] != NULL) {
            if ((rc = weft_wait(tx[s])) != WEFT_OK)
                break;
            weft_request_free(tx[s]);
            tx[s] = NULL;
        }
        memcpy(out[s], buf[s], MBLEN * sizeof(float));
        stage(out[s], MBLEN, me);
        if (me < n - 1) {
            rc = weft_isend(c, out[s], MBLEN, WEFT_FLOAT32, me + 1, &tx[s]);
        } else {
            for (size_t i = 0; i < MBLEN && !fail; i++) {
                float want = (float)(m * 8 + (int)(i % 8));
                for (int r = 0; r < n; r++)
                    want = want * 0.5f + (float)r;
                if (out[s][i] != want) {
                    mp_log("pipeline: batch %d element %zu is %g, not %g", m, i,
                           (double)out[s][i], (double)want);
                    fail = 1;
                }
            }
        }
    }
    for (int s = 0; s < 2; s++) {
        int r1 = tx[s] != NULL ? weft_wait(tx[s]) : WEFT_OK;
        if (rc == WEFT_OK)
            rc = r1;
        weft_request_free(tx[s]);
        weft_request_free(rx[s]);
    }
    if (rc != WEFT_OK)
        fail = fail_rc(c, "pipeline", rc);
    for (int s = 0; s < 2; s++) {
        free(buf[s]);
        free(out[s]);
    }
    return fail;
}

/* ---- two threads ---- */

#define TH_OPS 200
#define TH_COUNT 64

typedef struct {
    weft_comm *c;
    float *in, *out;            /* TH_OPS * TH_COUNT each */
    weft_request *reqs[TH_OPS]; /* handed over under mu */
    int kept[TH_OPS];           /* 1: the waiter checks it */
    int posted;                 /* under mu */
    pthread_mutex_t mu;
    pthread_cond_t cv;
    atomic_int callbacks;
    int fail;
} th_ctx;

static void th_callback(weft_request *req, int result, void *arg)
{
    th_ctx *t = arg;

    (void)req;
    if (result != WEFT_OK)
        t->fail = 1;
    atomic_fetch_add(&t->callbacks, 1);
}

static void *th_waiter(void *arg)
{
    th_ctx *t = arg;
    const int n = weft_size(t->c);

    for (int i = 0; i < TH_OPS; i++) {
        weft_request *r;
        int rc;

        pthread_mutex_lock(&t->mu);
        while (t->posted <= i)
            pthread_cond_wait(&t->cv, &t->mu);
        r = t->reqs[i];
        pthread_mutex_unlock(&t->mu);
        if (r == NULL)
            continue; /* freed by the poster while pending */
        if ((rc = weft_wait(r)) != WEFT_OK) {
            mp_log("threads: op %d: %s", i, weft_err_name(rc));
            t->fail = 1;
        }
        for (int k = 0; rc == WEFT_OK && k < TH_COUNT; k++) {
            float want = 0.0f;
            for (int p = 0; p < n; p++)
                want += (float)(p + i + k);
            if (t->out[(size_t)i * TH_COUNT + (size_t)k] != want) {
                mp_log("threads: op %d element %d is %g, not %g", i, k,
                       (double)t->out[(size_t)i * TH_COUNT + (size_t)k],
                       (double)want);
                t->fail = 1;
                break;
            }
        }
        weft_request_free(r);
    }
    return NULL;
}

int nb_threads(weft_comm *c)
{
    const int me = weft_rank(c);
    th_ctx t;
    pthread_t th;
    int rc = WEFT_OK, expect_cb = 0;

    memset(&t, 0, sizeof t);
    t.c = c;
    t.in = mp_alloc(TH_OPS * TH_COUNT * sizeof(float));
    t.out = mp_alloc(TH_OPS * TH_COUNT * sizeof(float));
    pthread_mutex_init(&t.mu, NULL);
    pthread_cond_init(&t.cv, NULL);
    atomic_init(&t.callbacks, 0);
    for (int i = 0; i < TH_OPS; i++)
        for (int k = 0; k < TH_COUNT; k++)
            t.in[(size_t)i * TH_COUNT + (size_t)k] = (float)(me + i + k);
    pthread_create(&th, NULL, th_waiter, &t);
    for (int i = 0; i < TH_OPS; i++) {
        weft_request *r = NULL;

        rc = weft_iall_reduce(c, t.in + (size_t)i * TH_COUNT,
                              t.out + (size_t)i * TH_COUNT, TH_COUNT,
                              WEFT_FLOAT32, WEFT_SUM, &r);
        if (rc != WEFT_OK) {
            mp_log("threads: post %d: %s", i, weft_err_name(rc));
            t.fail = 1;
        }
        if (r != NULL && i % 3 == 0) {
            weft_request_on_complete(r, th_callback, &t);
            expect_cb++;
        }
        if (r != NULL && i % 7 == 0) {
            /* Freed while (probably) pending: it still completes. */
            weft_request_free(r);
            r = NULL;
        }
        pthread_mutex_lock(&t.mu);
        t.reqs[i] = r;
        t.posted = i + 1;
        pthread_cond_signal(&t.cv);
        pthread_mutex_unlock(&t.mu);
    }
    pthread_join(th, NULL);
    /* Every operation completed (the last one waited for came after the
     * freed ones), and so did every callback. */
    if ((rc = weft_barrier(c)) != WEFT_OK)
        t.fail = fail_rc(c, "threads: barrier", rc);
    if (atomic_load(&t.callbacks) != expect_cb) {
        mp_log("threads: %d callbacks ran, %d were registered",
               atomic_load(&t.callbacks), expect_cb);
        t.fail = 1;
    }
    pthread_mutex_destroy(&t.mu);
    pthread_cond_destroy(&t.cv);
    free(t.in);
    free(t.out);
    return t.fail;
}
