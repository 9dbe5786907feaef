/*
 * The communicator: the public entry points, argument checks, and the
 * failed/aborted state machine of API.md's failure semantics.
 */
#include "base/kernels.h"
#include "core/internal.h"
#include "core/select.h"
#include "transport/transport.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Why the last weft_init() on this thread failed (weft_last_error(NULL)). */
static _Thread_local char init_errmsg[WEFT__ERRMSG_LEN];

const char *weft_last_error(const weft_comm *c)
{
    if (c == NULL)
        return init_errmsg;
    return c->x.fail.code != 0 ? c->x.fail.msg : c->x.errmsg;
}

static const weft__tp_ops *pick_transport(const char *name)
{
    if (strcmp(name, "tcp") == 0)
        return &weft__tcp_ops;
#ifdef WEFT_HAVE_IBVERBS
    if (strcmp(name, "ibverbs") == 0)
        return &weft__ibverbs_ops;
#endif
    return NULL;
}

int weft_init(weft_comm **out)
{
    weft_comm *c;
    int rc;

    init_errmsg[0] = '\0';
    if (out == NULL) {
        snprintf(init_errmsg, sizeof init_errmsg, "weft_init: out is NULL");
        return WEFT_EINVAL;
    }
    *out = NULL;
    c = calloc(1, sizeof *c);
    if (c == NULL)
        return WEFT_ENOMEM;
    rc = weft__config_load(&c->cfg, init_errmsg, sizeof init_errmsg);
    if (rc != 0)
        goto fail;
    c->x.cfg = &c->cfg;
    c->x.rank = c->cfg.rank;
    c->x.nranks = c->cfg.nranks;
    c->x.timeout_ms = c->cfg.timeout_ms;
    c->x.fail.rank = c->x.rank;
    /* One deadline for the whole set-up, whatever layers it takes (the
     * ibverbs transport's exchange runs over the TCP one's wires). */
    atomic_init(&c->x.aborted, 0);
    c->x.tpo = pick_transport(c->cfg.transport);
    if (c->x.tpo == NULL) {
        snprintf(init_errmsg, sizeof init_errmsg,
                 "transport \"%s\" is not available in this build of weft "
                 "(the ibverbs transport is built only where configure "
                 "finds libibverbs-dev); use WEFT_TRANSPORT=tcp",
                 c->cfg.transport);
        rc = WEFT_ENOTSUP;
        goto fail;
    }
    c->x.send_seq = calloc((size_t)c->x.nranks, sizeof *c->x.send_seq);
    c->x.recv_seq = calloc((size_t)c->x.nranks, sizeof *c->x.recv_seq);
    if (c->x.send_seq == NULL || c->x.recv_seq == NULL) {
        rc = WEFT_ENOMEM;
        goto fail;
    }
    if (c->x.nranks > 1) {
        c->tpp = calloc(1, sizeof *c->tpp);
        if (c->tpp == NULL) {
            rc = WEFT_ENOMEM;
            goto fail;
        }
        *c->tpp = (weft__tp_params){
            .cfg = &c->cfg,
            .rank = c->x.rank,
            .nranks = c->x.nranks,
            .wires = c->cfg.wires,
            .timeout_ms = c->x.timeout_ms,
            .deadline_ms = weft__now_ms() + (uint64_t)c->cfg.connect_timeout_ms,
            .sink = &c->x.fail,
        };
        rc = c->x.tpo->create(c->tpp, &c->x.tp);
        if (rc != 0) {
            snprintf(init_errmsg, sizeof init_errmsg, "%s",
                     c->x.fail.code != 0 ? c->x.fail.msg : c->x.errmsg);
            goto fail;
        }
    }
    weft__log(WEFT__LOG_DEBUG, c->x.rank, "initialised: %d ranks over %s",
              c->x.nranks, c->x.tpo->name);
    *out = c;
    return WEFT_OK;

fail:
    if (rc == WEFT_ENOMEM && init_errmsg[0] == '\0')
        snprintf(init_errmsg, sizeof init_errmsg, "out of memory in weft_init");
    weft__log(WEFT__LOG_ERROR, c->cfg.nranks > 0 ? c->cfg.rank : -1,
              "weft_init: %s: %s", weft_err_name(rc), init_errmsg);
    weft__config_free(&c->cfg);
    free(c->tpp);
    free(c->x.send_seq);
    free(c->x.recv_seq);
    free(c);
    return rc;
}

int weft_finalize(weft_comm *c)
{
    if (c == NULL)
        return WEFT_OK;
    if (c->x.tp != NULL)
        c->x.tpo->destroy(c->x.tp);
    weft__engine_free(&c->x);
    weft__config_free(&c->cfg);
    free(c->tpp);
    free(c->x.send_seq);
    free(c->x.recv_seq);
    free(c->x.scratch);
    free(c);
    return WEFT_OK;
}

int weft_rank(const weft_comm *c)
{
    return c == NULL ? WEFT_EINVAL : c->x.rank;
}

int weft_size(const weft_comm *c)
{
    return c == NULL ? WEFT_EINVAL : c->x.nranks;
}

int weft_set_timeout(weft_comm *c, int timeout_ms)
{
    if (c == NULL)
        return WEFT_EINVAL;
    if (timeout_ms <= 0)
        return weft__note(&c->x, WEFT_EINVAL,
                          "weft_set_timeout: timeout_ms must be > 0, got %d",
                          timeout_ms);
    c->x.timeout_ms = timeout_ms;
    if (c->tpp != NULL)
        c->tpp->timeout_ms = timeout_ms;
    return WEFT_OK;
}

int weft_abort(weft_comm *c)
{
    if (c == NULL)
        return WEFT_EINVAL;
    atomic_store(&c->x.aborted, 1);
    if (c->x.tp != NULL)
        c->x.tpo->wake(c->x.tp);
    return WEFT_OK;
}

/* ---- argument checks ---- */

/* A bad argument: reported, nothing sent, the communicator stays usable. */
#define inval(c, ...) weft__note(&(c)->x, WEFT_EINVAL, __VA_ARGS__)

/* Checks shared by every operation. mult is how many count-sized blocks
 * the largest buffer holds. */
static int check(weft_comm *c, const char *name, size_t count, weft_dtype dtype,
                 size_t mult)
{
    size_t es;

    if (c->x.fail.code != 0 || atomic_load(&c->x.aborted)) {
        weft__set_error(&c->x, WEFT_EABORTED,
                        "rank %d: communicator aborted by weft_abort()",
                        c->x.rank);
        return WEFT_EABORTED;
    }
    if (!weft__dtype_valid((int)dtype))
        return inval(c, "%s: unknown dtype %d", name, (int)dtype);
    es = weft_dtype_size(dtype);
    if (count > SIZE_MAX / es / mult || count * es * mult > (SIZE_MAX >> 2))
        return inval(c, "%s: count %zu overflows the address space", name,
                     count);
    return WEFT_OK;
}

#define CHECK_COMM(c)                                                          \
    do {                                                                       \
        if ((c) == NULL)                                                       \
            return WEFT_EINVAL;                                                \
    } while (0)

/* Starts a call that moves data: its one deadline, and what every rank's
 * call must agree on, which the engine's headers carry. Collectives are
 * numbered per communicator (every rank calls them in the same order);
 * point-to-point calls are numbered per pair by the engine. */
static void call_begin(weft_comm *c, weft__call *k, int kind, const char *name,
                       weft_dtype dtype, int redop, int root, size_t count)
{
    k->deadline_ms = weft__now_ms() + (uint64_t)c->x.timeout_ms;
    k->name = name;
    k->kind = kind;
    k->dtype = (int)dtype;
    k->redop = redop;
    k->root = root;
    k->count = count;
    k->seq = kind == WEFT__OP_P2P ? 0 : ++c->coll_seq;
    k->passes = 0;
}

/* Runs a call: posts its task with `post` and waits for it. */
static int run(weft_comm *c, weft__call *k, const weft__args *a,
               weft__algo_fn post)
{
    weft__task t;
    int rc;

    weft__task_init(&t, &c->x, k, a);
    if ((rc = post(&t)) == WEFT_OK)
        rc = weft__task_wait(&t);
    return rc;
}

/* Runs a validated collective with count > 0 on a job of two ranks or
 * more: the call begins, and the selection table's algorithm runs it. */
static int collective(weft_comm *c, int kind, const char *name,
                      const weft__args *a, int redop)
{
    weft__call k;

    call_begin(c, &k, kind, name, a->dtype, redop,
               kind == WEFT__OP_BROADCAST ? a->root : -1, a->count);
    return run(c, &k, a, weft__select(&c->x, kind, a));
}

int weft_all_reduce(weft_comm *c, const void *sendbuf, void *recvbuf,
                    size_t count, weft_dtype dtype, weft_redop op)
{
    weft__args a = {sendbuf, recvbuf, count, dtype, op, -1, -1, -1};
    int rc;

    CHECK_COMM(c);
    if ((rc = check(c, "all_reduce", count, dtype, 1)) != 0)
        return rc;
    if (!weft__op_valid((int)op))
        return inval(c, "all_reduce: unknown op %d", (int)op);
    if (count > 0 && (sendbuf == NULL || recvbuf == NULL))
        return inval(c, "all_reduce: NULL buffer with count %zu", count);
    if (count == 0)
        return WEFT_OK;
    if (c->x.nranks == 1) {
        memmove(recvbuf, sendbuf, count * weft_dtype_size(dtype));
        return WEFT_OK;
    }
    return collective(c, WEFT__OP_ALL_REDUCE, "all_reduce", &a, (int)op);
}

int weft_all_gather(weft_comm *c, const void *sendbuf, void *recvbuf,
                    size_t count, weft_dtype dtype)
{
    weft__args a = {sendbuf, recvbuf, count, dtype, WEFT_SUM, -1, -1, -1};
    int rc;

    CHECK_COMM(c);
    if ((rc = check(c, "all_gather", count, dtype, (size_t)c->x.nranks)) != 0)
        return rc;
    if (count > 0 && (sendbuf == NULL || recvbuf == NULL))
        return inval(c, "all_gather: NULL buffer with count %zu", count);
    if (count == 0)
        return WEFT_OK;
    if (c->x.nranks == 1) {
        memmove(recvbuf, sendbuf, count * weft_dtype_size(dtype));
        return WEFT_OK;
    }
    return collective(c, WEFT__OP_ALL_GATHER, "all_gather", &a, -1);
}

int weft_reduce_scatter(weft_comm *c, const void *sendbuf, void *recvbuf,
                        size_t recvcount, weft_dtype dtype, weft_redop op)
{
    weft__args a = {sendbuf, recvbuf, recvcount, dtype, op, -1, -1, -1};
    int rc;

    CHECK_COMM(c);
    if ((rc = check(c, "reduce_scatter", recvcount, dtype,
                    (size_t)c->x.nranks)) != 0)
        return rc;
    if (!weft__op_valid((int)op))
        return inval(c, "reduce_scatter: unknown op %d", (int)op);
    if (recvcount > 0 && (sendbuf == NULL || recvbuf == NULL))
        return inval(c, "reduce_scatter: NULL buffer with count %zu",
                     recvcount);
    if (recvcount == 0)
        return WEFT_OK;
    if (c->x.nranks == 1) {
        memmove(recvbuf, sendbuf, recvcount * weft_dtype_size(dtype));
        return WEFT_OK;
    }
    return collective(c, WEFT__OP_REDUCE_SCATTER, "reduce_scatter", &a,
                      (int)op);
}

int weft_broadcast(weft_comm *c, void *buf, size_t count, weft_dtype dtype,
                   int root)
{
    weft__args a = {buf, buf, count, dtype, WEFT_SUM, root, -1, -1};
    int rc;

    CHECK_COMM(c);
    if ((rc = check(c, "broadcast", count, dtype, 1)) != 0)
        return rc;
    if (root < 0 || root >= c->x.nranks)
        return inval(c, "broadcast: root %d out of range [0, %d)", root,
                     c->x.nranks);
    if (count > 0 && buf == NULL)
        return inval(c, "broadcast: NULL buffer with count %zu", count);
    if (count == 0 || c->x.nranks == 1)
        return WEFT_OK;
    return collective(c, WEFT__OP_BROADCAST, "broadcast", &a, -1);
}

/* Runs a validated point-to-point call with count > 0. */
static int sendrecv(weft_comm *c, const char *name, const void *sendbuf,
                    int dst, void *recvbuf, int src, size_t count,
                    weft_dtype dtype)
{
    weft__args a = {sendbuf, recvbuf, count, dtype, WEFT_SUM, -1, dst, src};
    weft__call k;

    call_begin(c, &k, WEFT__OP_P2P, name, dtype, -1, -1, count);
    return run(c, &k, &a, weft__sendrecv_post);
}

static int p2p(weft_comm *c, const char *name, void *buf, size_t count,
               weft_dtype dtype, int peer, int is_send)
{
    int rc;

    CHECK_COMM(c);
    if ((rc = check(c, name, count, dtype, 1)) != 0)
        return rc;
    if (peer < 0 || peer >= c->x.nranks)
        return inval(c, "%s: peer %d out of range [0, %d)", name, peer,
                     c->x.nranks);
    if (peer == c->x.rank)
        return inval(c,
                     "%s: peer %d is this rank (a blocking send to "
                     "oneself cannot complete)",
                     name, peer);
    if (count > 0 && buf == NULL)
        return inval(c, "%s: NULL buffer with count %zu", name, count);
    if (count == 0)
        return WEFT_OK;
    return sendrecv(c, name, buf, is_send ? peer : -1, buf, is_send ? -1 : peer,
                    count, dtype);
}

int weft_send(weft_comm *c, const void *buf, size_t count, weft_dtype dtype,
              int peer)
{
    return p2p(c, "send", (void *)(uintptr_t)buf, count, dtype, peer, 1);
}

int weft_recv(weft_comm *c, void *buf, size_t count, weft_dtype dtype, int peer)
{
    return p2p(c, "recv", buf, count, dtype, peer, 0);
}

int weft_sendrecv(weft_comm *c, const void *sendbuf, int dst, void *recvbuf,
                  int src, size_t count, weft_dtype dtype)
{
    int rc;

    CHECK_COMM(c);
    if ((rc = check(c, "sendrecv", count, dtype, 1)) != 0)
        return rc;
    if (dst < 0 || dst >= c->x.nranks || src < 0 || src >= c->x.nranks)
        return inval(c, "sendrecv: peer %d out of range [0, %d)",
                     dst < 0 || dst >= c->x.nranks ? dst : src, c->x.nranks);
    if (dst == c->x.rank || src == c->x.rank)
        return inval(c, "sendrecv: a peer is this rank (%d)", c->x.rank);
    if (count > 0 && (sendbuf == NULL || recvbuf == NULL))
        return inval(c, "sendrecv: NULL buffer with count %zu", count);
    if (count == 0)
        return WEFT_OK;
    return sendrecv(c, "sendrecv", sendbuf, dst, recvbuf, src, count, dtype);
}

int weft_barrier(weft_comm *c)
{
    int rc;

    CHECK_COMM(c);
    if ((rc = check(c, "barrier", 1, WEFT_UINT8, 1)) != 0)
        return rc;
    if (c->x.nranks == 1)
        return WEFT_OK;
    {
        weft__args a = {NULL, NULL, 1, WEFT_UINT8, WEFT_SUM, -1, -1, -1};
        return collective(c, WEFT__OP_BARRIER, "barrier", &a, -1);
    }
}
