/* Non-blocking test cases; see nb_cases.h. */
#define _GNU_SOURCE
#include "nb_cases.h"

#include <pthread.h>
#include <stdarg.h>
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

/* ==== Order: point-to-point requests among pending ones ==== */

#define LEFT_OF(me, n) (((me) + (n)-1) % (n))
#define RIGHT_OF(me, n) (((me) + 1) % (n))
#define ORDER_RULE                                                             \
    "API.md, Order: point-to-point requests progress without waiting for "     \
    "earlier pending ones; a posted receive never holds back a later send"

/* Requests of one step of a case, each with a name for messages. */
#define NB_MAXPOSTS 96
typedef struct {
    int n;
    weft_request *req[NB_MAXPOSTS];
    char what[NB_MAXPOSTS][112];
} nb_posts;

/* The next request slot, named by fmt. */
static weft_request **post_slot(nb_posts *p, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
static weft_request **post_slot(nb_posts *p, const char *fmt, ...)
{
    va_list ap;

    if (p->n >= NB_MAXPOSTS) {
        mp_log("nb_posts: more than %d posts", NB_MAXPOSTS);
        abort();
    }
    va_start(ap, fmt);
    vsnprintf(p->what[p->n], sizeof p->what[0], fmt, ap);
    va_end(ap);
    p->req[p->n] = NULL;
    return &p->req[p->n++];
}

/* 0 when the last post (rc) succeeded; else 1 after a message. */
static int post_ok(weft_comm *c, const char *label, const nb_posts *p, int rc)
{
    if (rc == WEFT_OK)
        return 0;
    mp_log("%s: posting %s returned %s (%d): %s", label, p->what[p->n - 1],
           weft_err_name(rc), rc, weft_last_error(c));
    return 1;
}

/* Waits for every request (weft_wait_all); 0 when each ended WEFT_OK,
 * else 1 after naming the first that failed and how the others ended. */
static int posts_wait(weft_comm *c, const char *label, nb_posts *p,
                      const char *rule)
{
    int rc = weft_wait_all(p->req, (size_t)p->n), first = -1, nok = 0;

    if (rc == WEFT_OK)
        return 0;
    /* The first that failed with a cause of its own, else the first. */
    for (int i = 0; i < p->n; i++) {
        int r = weft_wait(p->req[i]);

        nok += r == WEFT_OK;
        if (r != WEFT_OK &&
            (first < 0 ||
             (r != WEFT_EABORTED && weft_wait(p->req[first]) == WEFT_EABORTED)))
            first = i;
    }
    rc = weft_wait(p->req[first]);
    mp_log("%s: %s returned %s (%d)%s: %s [%d of %d requests WEFT_OK; %s]",
           label, p->what[first], weft_err_name(rc), rc,
           rc == WEFT_ETIMEDOUT ? " (its deadline passed: it waited for "
                                  "something that never came)"
                                : "",
           weft_last_error(c), nok, p->n, rule);
    return 1;
}

static void posts_free(nb_posts *p)
{
    for (int i = 0; i < p->n; i++)
        weft_request_free(p->req[i]);
    p->n = 0;
}

/* The barrier that ends a case: a rank enters it once its own receives
 * have completed, so nobody leaves it (and perhaps finalizes) while a
 * message relayed through it is still on its way. */
static int end_barrier(weft_comm *c, const char *label)
{
    int rc = weft_barrier(c);

    if (rc == WEFT_OK)
        return 0;
    mp_log("%s: the barrier at its end returned %s (%d): %s", label,
           weft_err_name(rc), rc, weft_last_error(c));
    return 1;
}

/* What message k from src to dst holds (a seed for mp_fill_bytes). */
static uint64_t msg_seed(int src, int dst, uint64_t k)
{
    return mp_hash64(((uint64_t)src << 48) ^ ((uint64_t)dst << 32) ^ k ^
                     0x6d7367ull);
}

/* 0 when nbytes of got are what mp_fill_bytes(seed) writes (and the
 * canary after them is intact), else 1 after a message naming it. */
static int check_msg(const char *label, const char *which, const void *got,
                     size_t nbytes, uint64_t seed)
{
    unsigned char *want = mp_alloc(nbytes);
    int fail;

    mp_fill_bytes(want, nbytes, seed);
    fail = mp_check_elems(label, which, WEFT_UINT8, got, want, nbytes) ||
           mp_check_canary(label, which, got, nbytes);
    free(want);
    return fail;
}

/* Small integers (-2 .. 2) as float32: sums over ranks stay exact. */
static float small_val(uint64_t seed, int rank, size_t i)
{
    return (float)((int)((mp_hash64(seed + i) + (uint64_t)rank) % 5) - 2);
}

static void fill_small(float *b, size_t n, uint64_t seed, int rank)
{
    for (size_t i = 0; i < n; i++)
        b[i] = small_val(seed, rank, i);
}

/* 0 when b holds the sum over ranks of fill_small(seed, r, off + i). */
static int check_small_sum(const char *label, const char *which, const float *b,
                           size_t n, uint64_t seed, int nranks, size_t off)
{
    float *want = mp_alloc(n * sizeof *want);
    int fail;

    for (size_t i = 0; i < n; i++) {
        float v = 0.0f;
        for (int r = 0; r < nranks; r++)
            v += small_val(seed, r, off + i);
        want[i] = v;
    }
    fail = mp_check_elems(label, which, WEFT_FLOAT32, b, want, n) ||
           mp_check_canary(label, which, b, n * sizeof *b);
    free(want);
    return fail;
}

/* 0 when b holds fill_small(seed, rank) for n elements. */
static int check_small(const char *label, const char *which, const float *b,
                       size_t n, uint64_t seed, int rank)
{
    float *want = mp_alloc(n * sizeof *want);
    int fail;

    fill_small(want, n, seed, rank);
    fail = mp_check_elems(label, which, WEFT_FLOAT32, b, want, n);
    free(want);
    return fail;
}

/* ---- receives posted before sends, every pair ---- */

static const size_t pair_counts[] = {1, 1000, 1000, 70001, (1u << 20) + 3, 7};
#define NPAIR NELEMS(pair_counts)

int nb_irecv_first(weft_comm *c)
{
    const int me = weft_rank(c), n = weft_size(c);
    int fail = 0;

    for (int round = 0; round < 2 && !fail; round++) {
        float *sb[MP_MAX_RANKS][NPAIR] = {{0}},
              *rb[MP_MAX_RANKS][NPAIR] = {{0}};
        nb_posts p;
        char label[96];

        snprintf(label, sizeof label, "irecv_first (round %d: %s)", round,
                 round == 0 ? "every irecv, then every isend"
                            : "irecv then isend, message by message");
        p.n = 0;
        for (int d = 1; d < n; d++) {
            int peer = (me + d) % n;
            for (size_t k = 0; k < NPAIR; k++) {
                size_t nbytes = pair_counts[k] * sizeof(float);
                sb[peer][k] = mp_alloc(nbytes);
                rb[peer][k] = mp_alloc(nbytes);
                mp_fill_bytes(sb[peer][k], nbytes,
                              msg_seed(me, peer, round * NPAIR + k));
            }
        }
        /* Round 0: every receive before any send; round 1: per message. */
        for (int pass = 0; pass < (round == 0 ? 2 : 1) && !fail; pass++)
            for (int d = 1; d < n && !fail; d++) {
                int peer = (me + d) % n;
                for (size_t k = 0; k < NPAIR && !fail; k++) {
                    int rc;
                    if (round == 1 || pass == 0) {
                        rc = weft_irecv(
                            c, rb[peer][k], pair_counts[k], WEFT_FLOAT32, peer,
                            post_slot(&p, "irecv #%zu from rank %d (count %zu)",
                                      k, peer, pair_counts[k]));
                        fail = post_ok(c, label, &p, rc);
                    }
                    if (!fail && (round == 1 || pass == 1)) {
                        rc = weft_isend(
                            c, sb[peer][k], pair_counts[k], WEFT_FLOAT32, peer,
                            post_slot(&p, "isend #%zu to rank %d (count %zu)",
                                      k, peer, pair_counts[k]));
                        fail = post_ok(c, label, &p, rc);
                    }
                }
            }
        if (!fail)
            fail = posts_wait(c, label, &p, ORDER_RULE);
        for (int d = 1; d < n && !fail; d++) {
            int peer = (me + d) % n;
            for (size_t k = 0; k < NPAIR && !fail; k++) {
                char which[160];
                snprintf(which, sizeof which,
                         "message #%zu from rank %d (count %zu; a wrong one "
                         "may be another message, matched out of order)",
                         k, peer, pair_counts[k]);
                fail = check_msg(label, which, rb[peer][k],
                                 pair_counts[k] * sizeof(float),
                                 msg_seed(peer, me, round * NPAIR + k));
            }
        }
        posts_free(&p);
        for (int r = 0; r < n; r++)
            for (size_t k = 0; k < NPAIR; k++) {
                free(sb[r][k]);
                free(rb[r][k]);
            }
    }
    return fail || end_barrier(c, "irecv_first");
}

/* ---- ring exchange ---- */

int nb_ring_exchange(weft_comm *c)
{
    static const size_t counts[] = {1, 4096, (1u << 19) + 3};
    const int me = weft_rank(c), n = weft_size(c);
    const int left = LEFT_OF(me, n), right = RIGHT_OF(me, n);
    int fail = 0;

    for (size_t ci = 0; ci < NELEMS(counts) && !fail; ci++) {
        const size_t count = counts[ci], nbytes = count * sizeof(float);
        float *rl = mp_alloc(nbytes), *rr = mp_alloc(nbytes);
        float *sr = mp_alloc(nbytes), *sl = mp_alloc(nbytes);
        nb_posts p = {.n = 0};
        char label[96];
        int rc;

        snprintf(label, sizeof label,
                 "ring_exchange (count %zu: irecv left, irecv right, isend "
                 "right, isend left)",
                 count);
        mp_fill_bytes(sr, nbytes, msg_seed(me, right, 100 + ci));
        mp_fill_bytes(sl, nbytes, msg_seed(me, left, 200 + ci));
        rc = weft_irecv(c, rl, count, WEFT_FLOAT32, left,
                        post_slot(&p, "irecv from the left (rank %d)", left));
        fail = post_ok(c, label, &p, rc);
        if (!fail) {
            rc = weft_irecv(
                c, rr, count, WEFT_FLOAT32, right,
                post_slot(&p, "irecv from the right (rank %d)", right));
            fail = post_ok(c, label, &p, rc);
        }
        if (!fail) {
            rc = weft_isend(
                c, sr, count, WEFT_FLOAT32, right,
                post_slot(&p, "isend to the right (rank %d)", right));
            fail = post_ok(c, label, &p, rc);
        }
        if (!fail) {
            rc = weft_isend(c, sl, count, WEFT_FLOAT32, left,
                            post_slot(&p, "isend to the left (rank %d)", left));
            fail = post_ok(c, label, &p, rc);
        }
        if (!fail)
            fail = posts_wait(c, label, &p, ORDER_RULE);
        if (!fail)
            fail = check_msg(label, "the message from the left", rl, nbytes,
                             msg_seed(left, me, 100 + ci)) ||
                   check_msg(label, "the message from the right", rr, nbytes,
                             msg_seed(right, me, 200 + ci));
        posts_free(&p);
        free(rl);
        free(rr);
        free(sr);
        free(sl);
    }
    return fail || end_barrier(c, "ring_exchange");
}

/* ---- collectives between point-to-point posts ---- */

/* One step of a script: point to point goes to the ring neighbours
 * (receive from the left, send to the right). */
enum {
    S_IRECV, /* irecv from the left */
    S_ISEND, /* isend to the right */
    S_IAR,   /* iall_reduce, sum */
    S_IAG,   /* iall_gather */
    S_IBC,   /* ibroadcast */
    S_IBAR,  /* ibarrier */
    S_AR,    /* weft_all_reduce, blocking */
    S_SEND,  /* weft_send to the right, blocking */
    S_END
};
static const char *const step_names[] = {
    "irecv",      "isend",    "iall_reduce",           "iall_gather",
    "ibroadcast", "ibarrier", "all_reduce (blocking)", "send (blocking)"};

#define MAXSTEPS 8
typedef struct {
    int steps[MAXSTEPS]; /* ended by S_END */
    size_t p2p_count;
} nb_script;

static const nb_script scripts[] = {
    {{S_IRECV, S_IAR, S_ISEND, S_END}, 3000},
    {{S_IRECV, S_IAR, S_ISEND, S_END}, (1u << 19) + 3},
    {{S_ISEND, S_IBAR, S_IRECV, S_END}, 3000},
    {{S_ISEND, S_IAR, S_IRECV, S_END}, (1u << 19) + 3},
    {{S_IRECV, S_AR, S_ISEND, S_END}, 3000},
    {{S_IRECV, S_SEND, S_END}, 3000},
    {{S_IRECV, S_SEND, S_END}, (1u << 19) + 3},
    {{S_IRECV, S_IAR, S_IAG, S_IBAR, S_IBC, S_ISEND, S_END}, 5000},
    {{S_IAR, S_IRECV, S_IAR, S_ISEND, S_END}, 70001},
    {{S_IRECV, S_AR, S_IRECV, S_IBAR, S_ISEND, S_ISEND, S_END}, 1000},
    {{S_IRECV, S_IRECV, S_IAG, S_ISEND, S_IBC, S_ISEND, S_END}, 70001},
};

#define COLL_COUNT 1000

typedef struct {
    void *buf, *out; /* out: the collective's output, if not buf */
    size_t nbytes;   /* of buf */
    uint64_t seed;
    int m; /* the p2p message number of this direction */
} step_bufs;

static int run_script(weft_comm *c, int si)
{
    const nb_script *sc = &scripts[si];
    const int me = weft_rank(c), n = weft_size(c);
    const int left = LEFT_OF(me, n), right = RIGHT_OF(me, n);
    const size_t pc = sc->p2p_count, pbytes = pc * sizeof(float);
    step_bufs b[MAXSTEPS];
    nb_posts p = {.n = 0};
    char label[200];
    int len = 0, fail = 0, nsend = 0, nrecv = 0, rc;

    len += snprintf(label, sizeof label, "coll_between script %d (", si);
    for (int i = 0; i < MAXSTEPS && sc->steps[i] != S_END; i++)
        len += snprintf(label + len, sizeof label - (size_t)len, "%s%s",
                        i ? ", " : "", step_names[sc->steps[i]]);
    snprintf(label + len, sizeof label - (size_t)len,
             "; messages of %zu floats)", pc);
    memset(b, 0, sizeof b);
    for (int i = 0; i < MAXSTEPS && sc->steps[i] != S_END && !fail; i++) {
        const int k = sc->steps[i];
        const uint64_t seed = mp_hash64(((uint64_t)si << 8) + (uint64_t)i);
        weft_request **slot;

        b[i].seed = seed;
        switch (k) {
        case S_IRECV:
            b[i].m = nrecv++;
            b[i].nbytes = pbytes;
            b[i].buf = mp_alloc(pbytes);
            slot = post_slot(&p, "step %d: irecv #%d from the left (rank %d)",
                             i, b[i].m, left);
            fail =
                post_ok(c, label, &p,
                        weft_irecv(c, b[i].buf, pc, WEFT_FLOAT32, left, slot));
            break;
        case S_ISEND:
        case S_SEND:
            b[i].m = nsend++;
            b[i].nbytes = pbytes;
            b[i].buf = mp_alloc(pbytes);
            mp_fill_bytes(b[i].buf, pbytes,
                          msg_seed(me, right, (uint64_t)si * 64 + b[i].m));
            if (k == S_SEND) {
                rc = weft_send(c, b[i].buf, pc, WEFT_FLOAT32, right);
                if (rc != WEFT_OK) {
                    mp_log("%s: step %d: send #%d to the right (rank %d), "
                           "blocking, with a receive pending, returned %s "
                           "(%d): %s [%s]",
                           label, i, b[i].m, right, weft_err_name(rc), rc,
                           weft_last_error(c), ORDER_RULE);
                    fail = 1;
                }
                break;
            }
            slot = post_slot(&p, "step %d: isend #%d to the right (rank %d)", i,
                             b[i].m, right);
            fail =
                post_ok(c, label, &p,
                        weft_isend(c, b[i].buf, pc, WEFT_FLOAT32, right, slot));
            break;
        case S_IAR:
        case S_AR:
            b[i].nbytes = COLL_COUNT * sizeof(float);
            b[i].buf = mp_alloc(b[i].nbytes);
            b[i].out = mp_alloc(b[i].nbytes);
            fill_small(b[i].buf, COLL_COUNT, seed, me);
            if (k == S_AR) {
                rc = weft_all_reduce(c, b[i].buf, b[i].out, COLL_COUNT,
                                     WEFT_FLOAT32, WEFT_SUM);
                if (rc != WEFT_OK) {
                    mp_log("%s: step %d: all_reduce (blocking, count %d), "
                           "with a receive pending whose send the peer "
                           "posts after its own all_reduce, returned %s "
                           "(%d): %s [%s]",
                           label, i, COLL_COUNT, weft_err_name(rc), rc,
                           weft_last_error(c),
                           "API.md, Order: collectives do not wait for "
                           "earlier point-to-point requests");
                    fail = 1;
                }
                break;
            }
            slot =
                post_slot(&p, "step %d: iall_reduce (count %d)", i, COLL_COUNT);
            fail = post_ok(c, label, &p,
                           weft_iall_reduce(c, b[i].buf, b[i].out, COLL_COUNT,
                                            WEFT_FLOAT32, WEFT_SUM, slot));
            break;
        case S_IAG:
            b[i].nbytes = COLL_COUNT * sizeof(float);
            b[i].buf = mp_alloc(b[i].nbytes);
            b[i].out = mp_alloc(b[i].nbytes * (size_t)n);
            fill_small(b[i].buf, COLL_COUNT, seed, me);
            slot =
                post_slot(&p, "step %d: iall_gather (count %d)", i, COLL_COUNT);
            fail = post_ok(c, label, &p,
                           weft_iall_gather(c, b[i].buf, b[i].out, COLL_COUNT,
                                            WEFT_FLOAT32, slot));
            break;
        case S_IBC:
            b[i].nbytes = COLL_COUNT * sizeof(float);
            b[i].buf = mp_alloc(b[i].nbytes);
            if (me == (si + i) % n)
                fill_small(b[i].buf, COLL_COUNT, seed, me);
            slot = post_slot(&p, "step %d: ibroadcast (count %d, root %d)", i,
                             COLL_COUNT, (si + i) % n);
            fail = post_ok(c, label, &p,
                           weft_ibroadcast(c, b[i].buf, COLL_COUNT,
                                           WEFT_FLOAT32, (si + i) % n, slot));
            break;
        default: /* S_IBAR */
            slot = post_slot(&p, "step %d: ibarrier", i);
            fail = post_ok(c, label, &p, weft_ibarrier(c, slot));
            break;
        }
    }
    if (!fail)
        fail = posts_wait(c, label, &p, ORDER_RULE);
    for (int i = 0; i < MAXSTEPS && sc->steps[i] != S_END && !fail; i++) {
        char which[96];

        snprintf(which, sizeof which, "step %d (%s)", i,
                 step_names[sc->steps[i]]);
        switch (sc->steps[i]) {
        case S_IRECV:
            fail = check_msg(label, which, b[i].buf, b[i].nbytes,
                             msg_seed(left, me, (uint64_t)si * 64 + b[i].m));
            break;
        case S_IAR:
        case S_AR:
            fail = check_small_sum(label, which, b[i].out, COLL_COUNT,
                                   b[i].seed, n, 0);
            break;
        case S_IAG:
            for (int r = 0; r < n && !fail; r++)
                fail = check_small(label, which,
                                   (float *)b[i].out + (size_t)r * COLL_COUNT,
                                   COLL_COUNT, b[i].seed, r);
            break;
        case S_IBC:
            fail = check_small(label, which, b[i].buf, COLL_COUNT, b[i].seed,
                               (si + i) % n);
            break;
        default:
            break;
        }
    }
    posts_free(&p);
    for (int i = 0; i < MAXSTEPS; i++) {
        free(b[i].buf);
        free(b[i].out);
    }
    return fail;
}

int nb_coll_between(weft_comm *c)
{
    for (int si = 0; si < (int)NELEMS(scripts); si++)
        if (run_script(c, si))
            return 1;
    return end_barrier(c, "coll_between");
}

/* ---- hazards between pending operations ---- */

#define HAZARD_RULE                                                            \
    "API.md, Order: an operation sees the results of every earlier one "       \
    "whose buffers overlap its own"

/* The buffers of one hazard case: X is the one shared. */
typedef struct {
    weft_comm *c;
    int me, n, left, right;
    size_t count, nbytes;
    float *x, *y, *o, *a, *s, *s2;
    nb_posts p;
    char label[160];
} hz;

static void hz_init(hz *h, weft_comm *c, size_t count, const char *name)
{
    memset(h, 0, sizeof *h);
    h->c = c;
    h->me = weft_rank(c);
    h->n = weft_size(c);
    h->left = LEFT_OF(h->me, h->n);
    h->right = RIGHT_OF(h->me, h->n);
    h->count = count;
    h->nbytes = count * sizeof(float);
    h->x = mp_alloc(h->nbytes);
    h->y = mp_alloc(h->nbytes);
    h->o = mp_alloc(h->nbytes);
    h->a = mp_alloc(h->nbytes);
    h->s = mp_alloc(h->nbytes);
    h->s2 = mp_alloc(h->nbytes);
    snprintf(h->label, sizeof h->label, "hazards: %s (count %zu)", name, count);
}

static void hz_done(hz *h)
{
    posts_free(&h->p);
    free(h->x);
    free(h->y);
    free(h->o);
    free(h->a);
    free(h->s);
    free(h->s2);
}

/* The posts of a hazard case; each returns 0 or 1 after a message. */
static int hz_irecv(hz *h, float *buf, int peer, const char *bufname)
{
    int rc = weft_irecv(
        h->c, buf, h->count, WEFT_FLOAT32, peer,
        post_slot(&h->p, "irecv into %s from rank %d", bufname, peer));
    return post_ok(h->c, h->label, &h->p, rc);
}

static int hz_isend(hz *h, const float *buf, int peer, const char *bufname)
{
    int rc =
        weft_isend(h->c, buf, h->count, WEFT_FLOAT32, peer,
                   post_slot(&h->p, "isend of %s to rank %d", bufname, peer));
    return post_ok(h->c, h->label, &h->p, rc);
}

static int hz_iar(hz *h, const float *in, float *out, const char *names)
{
    int rc = weft_iall_reduce(h->c, in, out, h->count, WEFT_FLOAT32, WEFT_SUM,
                              post_slot(&h->p, "iall_reduce(%s)", names));
    return post_ok(h->c, h->label, &h->p, rc);
}

static int hz_wait(hz *h)
{
    return posts_wait(h->c, h->label, &h->p, HAZARD_RULE);
}

/* Seeds of the buffers' contents, by case and buffer. */
#define HZ_SEED(cs, buf) (mp_hash64((uint64_t)(cs)*16 + (buf)))
enum { HB_X, HB_A, HB_S, HB_S2, HB_Z };

/* Pairs (2i, 2i+1), roles swapped in the second round: "a" sends X then
 * receives into X (the old X must leave), "b" receives into Y and sends
 * Z. A rank left without a partner (odd n) sits out. */
static int hz_send_then_recv(weft_comm *c, size_t count, int round)
{
    hz h;
    int fail = 0;

    hz_init(&h, c, count, "isend of X, then irecv into X (write after read)");
    const int partner = h.me ^ 1, is_a = (h.me & 1) == round;
    if (partner < h.n) {
        const uint64_t sx = HZ_SEED(10 + round, HB_X);
        const uint64_t sz = HZ_SEED(10 + round, HB_Z);
        if (is_a) {
            fill_small(h.x, count, sx, h.me);
            fail = hz_isend(&h, h.x, partner, "X") ||
                   hz_irecv(&h, h.x, partner, "X") || hz_wait(&h) ||
                   check_small(h.label, "X (what the partner sent)", h.x, count,
                               sz, partner);
        } else {
            fill_small(h.s, count, sz, h.me);
            fail = hz_irecv(&h, h.y, partner, "Y") ||
                   hz_isend(&h, h.s, partner, "Z") || hz_wait(&h) ||
                   check_small(h.label,
                               "Y (the partner's X as it was at its isend)",
                               h.y, count, sx, partner);
        }
    }
    hz_done(&h);
    return fail;
}

/* Rank 0 sends X to rank 1 and receives it back from the last rank; each
 * other rank receives into X and sends X on: what it forwards is what
 * arrived (read after write). */
static int hz_forward(weft_comm *c, size_t count)
{
    hz h;
    int fail;
    const uint64_t sx = HZ_SEED(20, HB_X);

    hz_init(&h, c, count, "irecv into X, then isend of X (a chain)");
    if (h.me == 0) {
        fill_small(h.x, count, sx, 0);
        fail = hz_isend(&h, h.x, 1, "X") || hz_irecv(&h, h.y, h.n - 1, "Y") ||
               hz_wait(&h) ||
               check_small(h.label, "Y (X back round the chain)", h.y, count,
                           sx, 0);
    } else {
        fail = hz_irecv(&h, h.x, h.me - 1, "X") ||
               hz_isend(&h, h.x, (h.me + 1) % h.n, "X") || hz_wait(&h) ||
               check_small(h.label, "X (forwarded)", h.x, count, sx, 0);
    }
    hz_done(&h);
    return fail;
}

/* iall_reduce(A -> X), isend(X -> right), irecv(Y <- left): the send
 * carries the sum (read after write). */
static int hz_reduce_then_send(weft_comm *c, size_t count)
{
    hz h;
    int fail;
    const uint64_t sa = HZ_SEED(30, HB_A);

    hz_init(&h, c, count,
            "iall_reduce(A -> X), isend of X right, irecv into Y from left");
    fill_small(h.a, count, sa, h.me);
    fail = hz_iar(&h, h.a, h.x, "A -> X") || hz_isend(&h, h.x, h.right, "X") ||
           hz_irecv(&h, h.y, h.left, "Y") || hz_wait(&h) ||
           check_small_sum(h.label, "X", h.x, count, sa, h.n, 0) ||
           check_small_sum(h.label, "Y (the left's X, the sum)", h.y, count, sa,
                           h.n, 0);
    hz_done(&h);
    return fail;
}

/* isend(X -> right), iall_reduce(A -> X), irecv(Y <- left): the send
 * carries the old X (write after read). */
static int hz_send_then_reduce(weft_comm *c, size_t count)
{
    hz h;
    int fail;
    const uint64_t sa = HZ_SEED(40, HB_A), sx = HZ_SEED(40, HB_X);

    hz_init(&h, c, count,
            "isend of X right, iall_reduce(A -> X), irecv into Y from left");
    fill_small(h.a, count, sa, h.me);
    fill_small(h.x, count, sx, h.me);
    fail = hz_isend(&h, h.x, h.right, "X") || hz_iar(&h, h.a, h.x, "A -> X") ||
           hz_irecv(&h, h.y, h.left, "Y") || hz_wait(&h) ||
           check_small_sum(h.label, "X", h.x, count, sa, h.n, 0) ||
           check_small(h.label, "Y (the left's X before its iall_reduce)", h.y,
                       count, sx, h.left);
    hz_done(&h);
    return fail;
}

/* irecv(X <- left), isend(S -> right), iall_reduce(X -> O or in place):
 * the all_reduce reads what arrived (read after write). The send is
 * posted before the all_reduce: the all_reduce waits for the receive, and
 * a send the left posted after its own all_reduce could be held behind
 * that all_reduce's bytes on the wire (docs/reference.md, "Not in this
 * version"). */
static int hz_recv_then_reduce(weft_comm *c, size_t count, int inplace)
{
    hz h;
    int fail;
    const uint64_t ss = HZ_SEED(50 + inplace, HB_S);

    hz_init(&h, c, count,
            inplace ? "irecv into X from left, isend of S right, "
                      "iall_reduce(X in place)"
                    : "irecv into X from left, isend of S right, "
                      "iall_reduce(X -> O)");
    fill_small(h.s, count, ss, h.me);
    fail = hz_irecv(&h, h.x, h.left, "X") || hz_isend(&h, h.s, h.right, "S") ||
           hz_iar(&h, h.x, inplace ? h.x : h.o,
                  inplace ? "X in place" : "X -> O") ||
           hz_wait(&h);
    if (!fail && !inplace)
        fail =
            check_small(h.label, "X (what the left sent)", h.x, count, ss,
                        h.left) ||
            check_small_sum(h.label, "O (the sum of what every rank received)",
                            h.o, count, ss, h.n, 0);
    if (!fail && inplace)
        fail =
            check_small_sum(h.label, "X (the sum of what every rank received)",
                            h.x, count, ss, h.n, 0);
    hz_done(&h);
    return fail;
}

/* iall_reduce(X -> O), irecv(X <- left), isend(S -> right): the
 * all_reduce reads the old X (write after read). */
static int hz_reduce_then_recv(weft_comm *c, size_t count)
{
    hz h;
    int fail;
    const uint64_t sx = HZ_SEED(60, HB_X), ss = HZ_SEED(60, HB_S);

    hz_init(&h, c, count,
            "iall_reduce(X -> O), irecv into X from left, isend of S right");
    fill_small(h.x, count, sx, h.me);
    fill_small(h.s, count, ss, h.me);
    fail =
        hz_iar(&h, h.x, h.o, "X -> O") || hz_irecv(&h, h.x, h.left, "X") ||
        hz_isend(&h, h.s, h.right, "S") || hz_wait(&h) ||
        check_small_sum(h.label, "O (the sum of the old X)", h.o, count, sx,
                        h.n, 0) ||
        check_small(h.label, "X (what the left sent)", h.x, count, ss, h.left);
    hz_done(&h);
    return fail;
}

/* irecv(X <- left), isend(S -> right), iall_reduce(A -> X): the
 * all_reduce's result stays (write after write). The send before the
 * all_reduce, as in hz_recv_then_reduce. */
static int hz_recv_then_reduce_into(weft_comm *c, size_t count)
{
    hz h;
    int fail;
    const uint64_t sa = HZ_SEED(70, HB_A), ss = HZ_SEED(70, HB_S);

    hz_init(&h, c, count,
            "irecv into X from left, isend of S right, iall_reduce(A -> X)");
    fill_small(h.a, count, sa, h.me);
    fill_small(h.s, count, ss, h.me);
    fail = hz_irecv(&h, h.x, h.left, "X") || hz_isend(&h, h.s, h.right, "S") ||
           hz_iar(&h, h.a, h.x, "A -> X") || hz_wait(&h) ||
           check_small_sum(h.label, "X (the all_reduce, written last)", h.x,
                           count, sa, h.n, 0);
    hz_done(&h);
    return fail;
}

/* irecv(X <- left), irecv(X <- right), isend(S -> right), isend(S2 ->
 * left): X ends with the second receive's data (write after write). */
static int hz_two_recvs(weft_comm *c, size_t count)
{
    hz h;
    int fail;
    const uint64_t ss = HZ_SEED(80, HB_S), ss2 = HZ_SEED(80, HB_S2);

    hz_init(&h, c, count,
            "irecv into X from left, irecv into X from right, isend right, "
            "isend left");
    fill_small(h.s, count, ss, h.me);
    fill_small(h.s2, count, ss2, h.me);
    fail =
        hz_irecv(&h, h.x, h.left, "X") || hz_irecv(&h, h.x, h.right, "X") ||
        hz_isend(&h, h.s, h.right, "S") || hz_isend(&h, h.s2, h.left, "S2") ||
        hz_wait(&h) ||
        check_small(h.label, "X (the second receive's message, written last)",
                    h.x, count, ss2, h.right);
    hz_done(&h);
    return fail;
}

int nb_hazards(weft_comm *c)
{
    static const size_t counts[] = {5, 70001};

    for (size_t ci = 0; ci < NELEMS(counts); ci++) {
        const size_t count = counts[ci];
        /* Sends first (or a collective), then the receives first. */
        if (hz_send_then_recv(c, count, 0) || hz_send_then_recv(c, count, 1) ||
            hz_forward(c, count) || hz_reduce_then_send(c, count) ||
            hz_send_then_reduce(c, count))
            return 1;
    }
    for (size_t ci = 0; ci < NELEMS(counts); ci++) {
        const size_t count = counts[ci];
        if (hz_recv_then_reduce(c, count, 0) ||
            hz_recv_then_reduce(c, count, 1) || hz_reduce_then_recv(c, count) ||
            hz_recv_then_reduce_into(c, count) || hz_two_recvs(c, count))
            return 1;
    }
    return end_barrier(c, "hazards");
}

/* ---- random sequences of messages and collectives ---- */

enum { RK_MSG, RK_AR, RK_AG, RK_RS, RK_BC, RK_BAR };
static const char *const rk_names[] = {"message",    "all_reduce",
                                       "all_gather", "reduce_scatter",
                                       "broadcast",  "barrier"};

#define RAND_MAXITEMS 48

typedef struct {
    int kind;
    int src, dst; /* RK_MSG */
    int root;     /* RK_BC */
    int blocking; /* collectives: called blocking */
    weft_dtype dt;
    size_t count;
} rand_item;

/* One local operation: plan item `item`, as sender or receiver (RK_MSG). */
typedef struct {
    int item;
    int send;
    void *buf, *out;
    size_t nbytes;
    weft_request *req;
} rand_local;

static void rand_plan(rand_item *it, int nitems, int n, uint64_t *s)
{
    static const weft_dtype dts[] = {WEFT_UINT8, WEFT_INT32, WEFT_FLOAT32,
                                     WEFT_FLOAT64};

    for (int i = 0; i < nitems; i++) {
        rand_item *x = &it[i];
        uint64_t r = rnd(s) % 10;

        memset(x, 0, sizeof *x);
        if (rnd(s) % 5 != 0) {
            x->kind = RK_MSG;
            x->src = (int)(rnd(s) % (uint64_t)n);
            x->dst = (x->src + 1 + (int)(rnd(s) % (uint64_t)(n - 1))) % n;
            x->dt = dts[rnd(s) % NELEMS(dts)];
            x->count = r < 7   ? 1 + rnd(s) % 300
                       : r < 9 ? 1 + rnd(s) % 20000
                               : 1 + rnd(s) % 300000;
        } else {
            x->kind = RK_AR + (int)(rnd(s) % 5);
            x->dt = WEFT_FLOAT32;
            x->count = 1 + rnd(s) % 1500;
            x->root = (int)(rnd(s) % (uint64_t)n);
            x->blocking = rnd(s) % 4 == 0;
        }
    }
}

/* This rank's operations in the order it posts them: a random merge of
 * its queues (sends to each peer, receives from each peer, collectives),
 * each queue in plan order. Returns how many. */
static int rand_order(const rand_item *it, int nitems, int me, int n,
                      uint64_t *s, rand_local *out)
{
    int q[2 * MP_MAX_RANKS + 1][RAND_MAXITEMS], qn[2 * MP_MAX_RANKS + 1];
    int qh[2 * MP_MAX_RANKS + 1], nq = 2 * n + 1, total = 0, k = 0;

    memset(qn, 0, sizeof qn);
    memset(qh, 0, sizeof qh);
    for (int i = 0; i < nitems; i++) {
        if (it[i].kind != RK_MSG)
            q[2 * n][qn[2 * n]++] = i;
        else if (it[i].src == me)
            q[it[i].dst][qn[it[i].dst]++] = i;
        else if (it[i].dst == me)
            q[n + it[i].src][qn[n + it[i].src]++] = i;
    }
    for (int j = 0; j < nq; j++)
        total += qn[j];
    while (k < total) {
        int j = (int)(rnd(s) % (uint64_t)nq);
        if (qh[j] == qn[j])
            continue;
        memset(&out[k], 0, sizeof out[k]);
        out[k].item = q[j][qh[j]++];
        out[k].send = j < n;
        k++;
    }
    return total;
}

static uint64_t rand_seed(uint64_t seed, int item)
{
    return mp_hash64(seed * 1000003u + (uint64_t)item);
}

static void rand_describe(const rand_item *x, const rand_local *l, int me,
                          char *buf, size_t len)
{
    if (x->kind == RK_MSG)
        snprintf(buf, len, "%s of item %d (%zu %s %s rank %d)",
                 l->send ? "isend" : "irecv", l->item, x->count,
                 mp_dtype_name(x->dt), l->send ? "to" : "from",
                 l->send ? x->dst : x->src);
    else
        snprintf(buf, len, "%s%s of item %d (count %zu%s)",
                 x->blocking ? "" : "i", rk_names[x->kind], l->item, x->count,
                 x->kind == RK_BC
                     ? (x->root == me ? ", root: this rank" : ", another root")
                     : "");
}

/* Sets up l's buffers and posts it (or calls it, blocking). */
static int rand_post(weft_comm *c, const rand_item *x, rand_local *l,
                     uint64_t seed)
{
    const int me = weft_rank(c), n = weft_size(c);
    const uint64_t is = rand_seed(seed, l->item);
    const size_t es = weft_dtype_size(x->dt), cnt = x->count;
    weft_request **req = x->blocking ? NULL : &l->req;

    l->nbytes = cnt * es;
    switch (x->kind) {
    case RK_MSG:
        l->buf = mp_alloc(l->nbytes);
        if (l->send) {
            mp_fill_bytes(l->buf, l->nbytes, is);
            return weft_isend(c, l->buf, cnt, x->dt, x->dst, &l->req);
        }
        return weft_irecv(c, l->buf, cnt, x->dt, x->src, &l->req);
    case RK_AR:
        l->buf = mp_alloc(l->nbytes);
        l->out = mp_alloc(l->nbytes);
        fill_small(l->buf, cnt, is, me);
        return req ? weft_iall_reduce(c, l->buf, l->out, cnt, x->dt, WEFT_SUM,
                                      req)
                   : weft_all_reduce(c, l->buf, l->out, cnt, x->dt, WEFT_SUM);
    case RK_AG:
        l->buf = mp_alloc(l->nbytes);
        l->out = mp_alloc(l->nbytes * (size_t)n);
        fill_small(l->buf, cnt, is, me);
        return req ? weft_iall_gather(c, l->buf, l->out, cnt, x->dt, req)
                   : weft_all_gather(c, l->buf, l->out, cnt, x->dt);
    case RK_RS:
        l->buf = mp_alloc(l->nbytes * (size_t)n);
        l->out = mp_alloc(l->nbytes);
        fill_small(l->buf, cnt * (size_t)n, is, me);
        return req ? weft_ireduce_scatter(c, l->buf, l->out, cnt, x->dt,
                                          WEFT_SUM, req)
                   : weft_reduce_scatter(c, l->buf, l->out, cnt, x->dt,
                                         WEFT_SUM);
    case RK_BC:
        l->buf = mp_alloc(l->nbytes);
        if (me == x->root)
            fill_small(l->buf, cnt, is, me);
        return req ? weft_ibroadcast(c, l->buf, cnt, x->dt, x->root, req)
                   : weft_broadcast(c, l->buf, cnt, x->dt, x->root);
    default:
        return req ? weft_ibarrier(c, req) : weft_barrier(c);
    }
}

static int rand_check(weft_comm *c, const rand_item *x, const rand_local *l,
                      uint64_t seed, const char *label, const char *which)
{
    const int me = weft_rank(c), n = weft_size(c);
    const uint64_t is = rand_seed(seed, l->item);
    const size_t cnt = x->count;
    int fail = 0;

    switch (x->kind) {
    case RK_MSG:
        return l->send ? 0 : check_msg(label, which, l->buf, l->nbytes, is);
    case RK_AR:
        return check_small_sum(label, which, l->out, cnt, is, n, 0);
    case RK_AG:
        for (int r = 0; r < n && !fail; r++)
            fail = check_small(label, which, (float *)l->out + (size_t)r * cnt,
                               cnt, is, r);
        return fail;
    case RK_RS:
        return check_small_sum(label, which, l->out, cnt, is, n,
                               (size_t)me * cnt);
    case RK_BC:
        return check_small(label, which, l->buf, cnt, is, x->root);
    default:
        return 0;
    }
}

/* Waits for this rank's requests: 0 weft_wait_all, 1 weft_wait one at a
 * time in a random order, 2 polling weft_test (bounded: every request
 * has a deadline, but the loop has one of its own too). */
static void rand_wait(rand_local *l, int nl, int style, uint64_t *s)
{
    weft_request *reqs[2 * RAND_MAXITEMS];
    int m = 0;

    for (int i = 0; i < nl; i++)
        if (l[i].req != NULL)
            reqs[m++] = l[i].req;
    if (style == 0) {
        weft_wait_all(reqs, (size_t)m);
    } else if (style == 1) {
        for (int i = m - 1; i > 0; i--) {
            int j = (int)(rnd(s) % (uint64_t)(i + 1));
            weft_request *t = reqs[i];
            reqs[i] = reqs[j];
            reqs[j] = t;
        }
        for (int i = 0; i < m; i++)
            weft_wait(reqs[i]);
    } else {
        double end = mp_now_ms() + 120000;
        int left = m;
        while (left > 0 && mp_now_ms() < end) {
            left = 0;
            for (int i = 0; i < m; i++) {
                int done = 0;
                weft_test(reqs[i], &done);
                left += !done;
            }
        }
        weft_wait_all(reqs, (size_t)m);
    }
}

int nb_random_p2p(weft_comm *c, uint64_t seed)
{
    static const char *const styles[] = {
        "weft_wait_all", "weft_wait in a random order", "polling weft_test"};
    const int me = weft_rank(c), n = weft_size(c);
    uint64_t s = mp_hash64(seed ^ 0x72616e64ull), ls;
    rand_item it[RAND_MAXITEMS];
    rand_local l[2 * RAND_MAXITEMS];
    const int nitems = 6 + (int)(rnd(&s) % (RAND_MAXITEMS - 6));
    int nl, fail = 0, rc = WEFT_OK, style;
    char label[96], which[128];

    rand_plan(it, nitems, n, &s);
    ls = mp_hash64(s ^ ((uint64_t)me << 32));
    nl = rand_order(it, nitems, me, n, &ls, l);
    style = (int)(rnd(&ls) % 3);
    snprintf(label, sizeof label, "random seed %llu (%d items, %s)",
             (unsigned long long)seed, nitems, styles[style]);
    for (int i = 0; i < nl && !fail; i++) {
        const rand_item *x = &it[l[i].item];
        rc = rand_post(c, x, &l[i], seed);
        if (rc != WEFT_OK) {
            rand_describe(x, &l[i], me, which, sizeof which);
            int npend = 0;
            for (int j = 0; j < i; j++)
                npend += l[j].req != NULL;
            mp_log("%s: this rank's operation %d of %d, %s, %s (%d of this "
                   "rank's requests posted before it) returned %s (%d): %s "
                   "[%s]",
                   label, i, nl, which,
                   x->blocking ? "called blocking" : "posted", npend,
                   weft_err_name(rc), rc, weft_last_error(c), ORDER_RULE);
            fail = 1;
        }
    }
    if (!fail) {
        int first = -1, nok = 0, npend = 0;
        rand_wait(l, nl, style, &ls);
        for (int i = 0; i < nl; i++) {
            if (l[i].req == NULL)
                continue;
            npend++;
            rc = weft_wait(l[i].req);
            nok += rc == WEFT_OK;
            if (rc != WEFT_OK &&
                (first < 0 || (rc != WEFT_EABORTED &&
                               weft_wait(l[first].req) == WEFT_EABORTED)))
                first = i;
        }
        if (first >= 0) {
            rc = weft_wait(l[first].req);
            rand_describe(&it[l[first].item], &l[first], me, which,
                          sizeof which);
            mp_log("%s: this rank's operation %d of %d, %s, returned %s "
                   "(%d): %s [%d of %d requests WEFT_OK; %s]",
                   label, first, nl, which, weft_err_name(rc), rc,
                   weft_last_error(c), nok, npend, ORDER_RULE);
            fail = 1;
        }
    }
    for (int i = 0; i < nl && !fail; i++) {
        rand_describe(&it[l[i].item], &l[i], me, which, sizeof which);
        fail = rand_check(c, &it[l[i].item], &l[i], seed, label, which);
    }
    for (int i = 0; i < nl; i++) {
        weft_request_free(l[i].req);
        free(l[i].buf);
        free(l[i].out);
    }
    return fail || end_barrier(c, label);
}

/* ==== Callbacks see their request complete ==== */

void nb_cb_reset(nb_cb_seen *seen, int n)
{
    for (int i = 0; i < n; i++) {
        atomic_init(&seen[i].calls, 0);
        atomic_init(&seen[i].result, 12345);
        atomic_init(&seen[i].test_rc, 12345);
        atomic_init(&seen[i].test_done, -1);
    }
}

void nb_state_cb(weft_request *req, int result, void *arg)
{
    nb_cb_seen *seen = arg;
    int done = -1, rc = weft_test(req, &done);

    atomic_store(&seen->test_rc, rc);
    atomic_store(&seen->test_done, done);
    atomic_store(&seen->result, result);
    atomic_fetch_add(&seen->calls, 1);
}

static const char *rc_name(int rc)
{
    return rc == 12345 ? "(not set)" : weft_err_name(rc);
}

int nb_cb_check(const nb_cb_seen *seen, int n, int want, const char *what,
                const char *(*group)(int i))
{
    int good = 0, logged = 0;

    for (int i = 0; i < n; i++) {
        const int calls = atomic_load(&seen[i].calls);
        const int result = atomic_load(&seen[i].result);
        const int test_rc = atomic_load(&seen[i].test_rc);
        const int done = atomic_load(&seen[i].test_done);

        if (calls == 1 && done == 1 && test_rc == result &&
            (want == 1 || result == want)) {
            good++;
            continue;
        }
        if (logged++ < 5)
            mp_log("%s: callback %d%s%s%s: ran %d time(s), its result "
                   "argument %s%s%s%s; weft_test on its own request from "
                   "inside it said done %d and returned %s (expected done 1 "
                   "and the callback's result)",
                   what, i, group ? " (" : "", group ? group(i) : "",
                   group ? ")" : "", calls, rc_name(result),
                   want != 1 ? " (expected " : "",
                   want != 1 ? weft_err_name(want) : "", want != 1 ? ")" : "",
                   done, rc_name(test_rc));
    }
    if (good == n)
        return 0;
    mp_log("%s: %d of %d callbacks saw their own request complete, with the "
           "callback's result (API.md: a request is complete, with its "
           "result, before its callback runs)",
           what, good, n);
    return 1;
}

#define CB_GROUP 8
#define CB_GROUPS 5
#define CB_N (CB_GROUP * CB_GROUPS)
#define CB_COUNT 32

static const char *cb_group(int i)
{
    static const char *const names[CB_GROUPS] = {
        "iall_reduce, run by the progress thread while the caller sleeps",
        "iall_reduce, waited for at once by the caller (weft_wait)",
        "iall_reduce, waited for by a second thread (weft_wait_all)",
        "iall_reduce, registered after weft_wait: runs at once",
        "isend to the right / irecv from the left, waited with weft_wait_all",
    };
    return names[i / CB_GROUP];
}

typedef struct {
    weft_request **reqs;
    int n, rc;
} cb_waiter;

static void *cb_wait_main(void *arg)
{
    cb_waiter *w = arg;

    w->rc = weft_wait_all(w->reqs, (size_t)w->n);
    return NULL;
}

int nb_callback_state(weft_comm *c)
{
    const int me = weft_rank(c), n = weft_size(c);
    const int left = LEFT_OF(me, n), right = RIGHT_OF(me, n);
    static nb_cb_seen seen[CB_N];
    weft_request *reqs[CB_N] = {0};
    float *in = mp_alloc(CB_N * CB_COUNT * sizeof(float));
    float *out = mp_alloc(CB_N * CB_COUNT * sizeof(float));
    const char *what = "callback_state";
    int fail = 0, rc = WEFT_OK;

    nb_cb_reset(seen, CB_N);
    for (int i = 0; i < CB_N * CB_COUNT; i++)
        in[i] = (float)(me + i % 97);
    for (int g = 0; g < CB_GROUPS && !fail; g++) {
        const int i0 = g * CB_GROUP;
        cb_waiter w = {reqs + i0, CB_GROUP, WEFT_OK};
        pthread_t th;

        for (int j = 0; j < CB_GROUP && rc == WEFT_OK; j++) {
            const int i = i0 + j;
            float *ib = in + (size_t)i * CB_COUNT,
                  *ob = out + (size_t)i * CB_COUNT;

            if (g == 4)
                rc = j % 2 == 0 ? weft_isend(c, ib, CB_COUNT, WEFT_FLOAT32,
                                             right, &reqs[i])
                                : weft_irecv(c, ob, CB_COUNT, WEFT_FLOAT32,
                                             left, &reqs[i]);
            else
                rc = weft_iall_reduce(c, ib, ob, CB_COUNT, WEFT_FLOAT32,
                                      WEFT_SUM, &reqs[i]);
            if (rc != WEFT_OK)
                break;
            if (g == 3 && (rc = weft_wait(reqs[i])) != WEFT_OK)
                break;
            rc = weft_request_on_complete(reqs[i], nb_state_cb, &seen[i]);
            if (rc == WEFT_OK && g == 1)
                rc = weft_wait(reqs[i]);
        }
        if (rc != WEFT_OK) {
            fail = mp_report_rc(c, cb_group(i0), rc);
            break;
        }
        if (g == 0) {
            /* Nobody waits: the progress thread completes them. */
            double end = mp_now_ms() + 10000;
            int ran;
            do {
                ran = 0;
                for (int j = 0; j < CB_GROUP; j++)
                    ran += atomic_load(&seen[i0 + j].calls) > 0;
                if (ran < CB_GROUP)
                    mp_sleep_ms(1);
            } while (ran < CB_GROUP && mp_now_ms() < end);
        }
        if (g == 2) {
            if (pthread_create(&th, NULL, cb_wait_main, &w) != 0) {
                mp_log("%s: pthread_create failed", what);
                fail = 1;
                break;
            }
            pthread_join(th, NULL);
            rc = w.rc;
        } else {
            rc = weft_wait_all(reqs + i0, CB_GROUP);
        }
        if (rc != WEFT_OK)
            fail = mp_report_rc(c, cb_group(i0), rc);
    }
    if (!fail)
        fail = nb_cb_check(seen, CB_N, WEFT_OK, what, cb_group);
    for (int i = 0; i < CB_N && !fail; i++) {
        if ((rc = weft_wait(reqs[i])) != atomic_load(&seen[i].result)) {
            mp_log("%s: request %d (%s): weft_wait returned %s, its callback "
                   "got %s",
                   what, i, cb_group(i), weft_err_name(rc),
                   rc_name(atomic_load(&seen[i].result)));
            fail = 1;
        }
    }
    /* The all_reduces' data, and the messages from the left. */
    for (int i = 0; i < CB_N && !fail; i++) {
        const float *ob = out + (size_t)i * CB_COUNT;
        if (i / CB_GROUP == 4 && i % 2 == 0)
            continue;
        for (int k = 0; k < CB_COUNT && !fail; k++) {
            int e = (i * CB_COUNT + k) % 97;
            float want = i / CB_GROUP == 4
                             ? (float)(left + ((i - 1) * CB_COUNT + k) % 97)
                             : (float)(n * e + n * (n - 1) / 2);
            if (ob[k] != want) {
                mp_log("%s: request %d (%s): element %d is %g, expected %g",
                       what, i, cb_group(i), k, (double)ob[k], (double)want);
                fail = 1;
            }
        }
    }
    for (int i = 0; i < CB_N; i++)
        weft_request_free(reqs[i]);
    free(in);
    free(out);
    return fail || end_barrier(c, what);
}
