/*
 * The communicator: made, sized, timed, aborted and freed. Its operations
 * are in ops.c, their requests in request.c.
 */
#include "core/internal.h"
#include "core/tune.h"
#include "transport/transport.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* Why the last weft_init() on this thread failed (weft_last_error(NULL)). */
#define init_errmsg weft__init_errmsg

const char *weft_last_error(const weft_comm *c)
{
    if (c == NULL)
        return init_errmsg;
    return c->x.fail.code != 0 ? c->x.fail.msg : c->x.errmsg;
}

/* TCP or ibverbs, with shared memory between this rank and the others
 * of its host where there are any (unless WEFT_SHM=0), which runs the
 * other over its own (transport/common.h: weft__tp_far). */
static const weft__tp_ops *pick_transport(const weft__config *cfg)
{
    const char *name = cfg->transport;
    const weft__tp_ops *ops = NULL;

    if (strcmp(name, "tcp") == 0)
        ops = &weft__tcp_ops;
#ifdef WEFT_HAVE_IBVERBS
    if (strcmp(name, "ibverbs") == 0)
        ops = &weft__ibverbs_ops;
#endif
    for (int r = 0; ops != NULL && cfg->shm && r < cfg->nranks; r++)
        if (r != cfg->rank && cfg->rank_host[r] == cfg->rank_host[cfg->rank])
            return &weft__shm_ops;
    return ops;
}

/* weft_info's text: the settings c runs with, then its table. */
static char *info_make(const weft_comm *c)
{
    static const char *const ons[] = {"?", "ring", "direct", "mesh"};
    const weft__config *g = &c->cfg;
    char head[768];
    size_t need, n;
    char *s;

    n = (size_t)snprintf(
        head, sizeof head,
        "rank=%d ranks=%d transport=%s%s topology=%s wires=%d "
        "timeout_ms=%d connect_timeout_ms=%d frame_bytes=%zu "
        "min_wire_bytes=%zu box_bytes=%zu pull_threads=%d "
        "reduce_thread=%d send_thread=%d spin_us=%d ranks_per_host=%d\n"
        "algo=",
        g->rank, g->nranks, g->transport,
        c->x.tp != NULL && strcmp(c->x.tpo->name, "shm") == 0 ? "+shm" : "",
        ons[c->tune.on >= 1 && c->tune.on <= 3 ? c->tune.on : 0], g->wires,
        c->x.timeout_ms, g->connect_timeout_ms, g->frame_bytes,
        g->min_wire_bytes, c->x.box, c->x.pull ? g->pull_threads : 0,
        g->reduce_thread, g->send_thread, g->spin_us, g->hier_local);
    if (n >= sizeof head)
        n = sizeof head - 1;
    need = n + weft__tune_print(&c->tune, NULL, 0) + 1;
    if ((s = malloc(need)) == NULL)
        return NULL;
    memcpy(s, head, n);
    weft__tune_print(&c->tune, s + n, need - n);
    return s;
}

/* Connects c to its peers (a job of more than one rank) over the
 * transport its configuration picks, within the connect deadline. */
static int connect_comm(weft_comm *c, int listen_fd, uint64_t deadline_ms)
{
    int rc;

    c->x.tpo = pick_transport(&c->cfg);
    if (c->x.tpo == NULL) {
        snprintf(init_errmsg, sizeof init_errmsg,
                 "transport \"%s\" is not available in this build of weft "
                 "(the ibverbs transport is built only where configure "
                 "finds libibverbs-dev); use WEFT_TRANSPORT=tcp",
                 c->cfg.transport);
        return WEFT_ENOTSUP;
    }
    if (c->x.nranks == 1)
        return WEFT_OK;
    c->tpp = calloc(1, sizeof *c->tpp);
    if (c->tpp == NULL)
        return WEFT_ENOMEM;
    *c->tpp = (weft__tp_params){
        .cfg = &c->cfg,
        .rank = c->x.rank,
        .nranks = c->x.nranks,
        .wires = c->cfg.wires,
        .timeout_ms = c->x.timeout_ms,
        /* One deadline for the whole set-up, whatever layers it takes
         * (the ibverbs transport's exchange runs over the TCP one's
         * wires, the comparison of settings after both). */
        .deadline_ms = deadline_ms,
        .sink = &c->x.fail,
        .listen_fd = listen_fd,
    };
    rc = c->x.tpo->create(c->tpp, &c->x.tp);
    c->tpp->listen_fd = -1; /* closed by the caller; the transport has its
                               own */
    if (rc != 0)
        snprintf(init_errmsg, sizeof init_errmsg, "%s",
                 c->x.fail.code != 0 ? c->x.fail.msg : c->x.errmsg);
    for (int p = 0; rc == 0 && p < c->x.nranks; p++)
        if (p != c->x.rank && c->x.tpo->nwires(c->x.tp, p) == 0)
            c->relays = 1;
    return rc;
}

/* The configuration of c, checked against the listener's socket. */
static int configure(weft_comm *c, const weft_config *uc, int listen_fd)
{
    int rc = weft__config_load(&c->cfg, uc, init_errmsg, sizeof init_errmsg);
    int port = listen_fd >= 0 ? weft__fd_port(listen_fd) : 0;

    if (rc != 0)
        return rc;
    if (listen_fd >= 0 &&
        port != weft__config_rank_port(&c->cfg, c->cfg.rank)) {
        snprintf(
            init_errmsg, sizeof init_errmsg,
            "weft_config.listener listens on port %d but %.200s gives rank "
            "%d port %d; give this rank the address "
            "weft_listener_open wrote",
            port, c->cfg.hostfile, c->cfg.rank,
            weft__config_rank_port(&c->cfg, c->cfg.rank));
        return WEFT_ECONFIG;
    }
    return weft__comm_ctx_init(c, c->cfg.timeout_ms);
}

int weft__comm_ctx_init(weft_comm *c, int timeout_ms)
{
    c->x.cfg = &c->cfg;
    c->x.rank = c->cfg.rank;
    c->x.nranks = c->cfg.nranks;
    c->x.timeout_ms = timeout_ms;
    c->x.fail.rank = c->x.rank;
    atomic_init(&c->x.aborted, 0);
    c->x.send_seq = calloc((size_t)c->x.nranks, sizeof *c->x.send_seq);
    c->x.recv_seq = calloc((size_t)c->x.nranks, sizeof *c->x.recv_seq);
    c->origin = calloc((size_t)c->x.nranks, sizeof *c->origin);
    c->pids = calloc((size_t)c->x.nranks, sizeof *c->pids);
    if (c->x.send_seq == NULL || c->x.recv_seq == NULL || c->origin == NULL ||
        c->pids == NULL || weft__sched_init(c) != 0)
        return WEFT_ENOMEM;
    for (int r = 0; r < c->x.nranks; r++)
        c->origin[r] = r;
    return WEFT_OK;
}

int weft__comm_start(weft_comm *c, int listen_fd, uint64_t deadline_ms)
{
    int rc;

    if ((rc = connect_comm(c, listen_fd, deadline_ms)) != 0)
        goto fail;
    if (c->x.tp != NULL) {
        weft__box_init(&c->x);
        weft__pull_init(&c->x);
    }
    /* A table this rank cannot run fails every rank, told as the ranks
     * compare their settings (below). */
    rc = weft__tune_init(&c->tune, &c->x, init_errmsg, sizeof init_errmsg);
    if (rc != 0 && c->derived && c->x.tp != NULL) {
        /* A communicator shrunk or split from another has a shape nobody
         * chose (hosts of unequal ranks, fewer hosts): where WEFT_ALGO's
         * table cannot run on it, it runs the defaults, the same on
         * every rank (they all have the same shape). */
        weft__log(WEFT__LOG_WARN, c->x.rank,
                  "%s; this communicator (of %d ranks, made from another) "
                  "runs the default table",
                  init_errmsg, c->x.nranks);
        init_errmsg[0] = '\0';
        rc = weft__tune_init_from(&c->tune, &c->x, NULL, init_errmsg,
                                  sizeof init_errmsg);
    }
    if (rc != 0 && c->x.tp == NULL)
        goto fail;
    if (rc == 0 && (c->info = info_make(c)) == NULL) {
        rc = WEFT_ENOMEM;
        goto fail;
    }
    if (rc == 0 && c->x.rank == 0 && getenv("WEFT_PRINT_CONFIG") != NULL)
        /* weftrun --print-config */
        fprintf(stderr, "weft: %s\n", c->info);
    /* A rank that forwards relayed messages keeps doing it between its
     * own operations. */
    if (c->relays && weft__sched_relays(c) != 0) {
        snprintf(init_errmsg, sizeof init_errmsg,
                 "cannot start the progress thread");
        rc = WEFT_ENOMEM;
        goto fail;
    }
    if (c->x.tp != NULL &&
        (rc = weft__settings_agree(c, rc, deadline_ms, init_errmsg,
                                   sizeof init_errmsg)) != 0)
        goto fail;
    if (c->x.tp == NULL)
        c->pids[0] = (int32_t)getpid();
    weft__log(WEFT__LOG_DEBUG, c->x.rank, "initialised: %d ranks over %s",
              c->x.nranks, c->x.tpo->name);
    return WEFT_OK;
fail:
    return rc;
}

void weft__comm_discard(weft_comm *c)
{
    if (c == NULL)
        return;
    weft__sched_fini(c);
    weft__engine_free(&c->x);
    if (c->x.tp != NULL)
        c->x.tpo->destroy(c->x.tp);
    weft__config_free(&c->cfg);
    free(c->tpp);
    free(c->x.send_seq);
    free(c->x.recv_seq);
    free(c->x.scratch);
    free(c->info);
    free(c->batch_buf);
    free(c->origin);
    free(c->pids);
    free(c);
}

/* weft_init (uc NULL) and weft_init_config: what = the caller's name. The
 * listener's socket, where there is one, is closed here on every path (the
 * transport listens on its own copy). */
static int init_comm(weft_comm **out, const weft_config *uc, const char *what)
{
    weft_listener *l = uc != NULL ? uc->listener : NULL;
    int listen_fd = weft__listener_take(l);
    weft_comm *c;
    int rc;

    init_errmsg[0] = '\0';
    if (out == NULL) {
        snprintf(init_errmsg, sizeof init_errmsg, "%s: out is NULL", what);
        rc = WEFT_EINVAL;
        goto out;
    }
    *out = NULL;
    c = calloc(1, sizeof *c);
    if (c == NULL) {
        rc = WEFT_ENOMEM;
        goto out;
    }
    if ((rc = configure(c, uc, listen_fd)) != 0 ||
        (rc = weft__comm_start(c, listen_fd,
                               weft__now_ms() +
                                   (uint64_t)c->cfg.connect_timeout_ms)) != 0) {
        if (rc == WEFT_ENOMEM && init_errmsg[0] == '\0')
            snprintf(init_errmsg, sizeof init_errmsg, "out of memory in %s",
                     what);
        weft__log(WEFT__LOG_ERROR, c->cfg.nranks > 0 ? c->cfg.rank : -1,
                  "%s: %s: %s", what, weft_err_name(rc), init_errmsg);
        weft__comm_discard(c);
        goto out;
    }
    *out = c;
    rc = WEFT_OK;
out:
    if (listen_fd >= 0)
        close(listen_fd);
    if (rc == WEFT_ENOMEM && init_errmsg[0] == '\0')
        snprintf(init_errmsg, sizeof init_errmsg, "out of memory in %s", what);
    return rc;
}

int weft_peer_wires(const weft_comm *c, int peer, weft_wire_info *out)
{
    if (c == NULL || out == NULL)
        return WEFT_EINVAL;
    if (peer < 0 || peer >= c->x.nranks || peer == c->x.rank)
        return WEFT_EINVAL;
    memset(out, 0, sizeof *out);
    if (c->x.tp != NULL)
        c->x.tpo->cable_wires(c->x.tp, peer, out);
    return WEFT_OK;
}

int weft_init(weft_comm **out)
{
    return init_comm(out, NULL, "weft_init");
}

/* The first version's weft_config: what programs built against 0.1's
 * weft.h pass to weft_init_config (the macro of later headers calls
 * weft_init_config_sized with their size). */
#define CONFIG_V1_SIZE (offsetof(weft_config, topology) + sizeof(const char *))

int weft_init_config_sized(weft_comm **out, const weft_config *cfg, size_t size)
{
    weft_config full;

    if (cfg == NULL || size < CONFIG_V1_SIZE) {
        if (cfg == NULL)
            snprintf(init_errmsg, sizeof init_errmsg,
                     "weft_init_config: cfg is NULL");
        else
            snprintf(init_errmsg, sizeof init_errmsg,
                     "weft_init_config: a weft_config of %zu bytes, smaller "
                     "than any version's",
                     size);
        if (out != NULL)
            *out = NULL;
        return WEFT_EINVAL;
    }
    /* Fields the caller's struct does not have are zero: their defaults. */
    memset(&full, 0, sizeof full);
    memcpy(&full, cfg, size < sizeof full ? size : sizeof full);
    return init_comm(out, &full, "weft_init_config");
}

#undef weft_init_config
int weft_init_config(weft_comm **out, const weft_config *cfg)
{
    return weft_init_config_sized(out, cfg, CONFIG_V1_SIZE);
}

const char *weft_version(void)
{
    return PACKAGE_VERSION;
}

int weft_finalize(weft_comm *c)
{
    /* The engine goes before the transport (weft__comm_discard): its
     * reducer thread, joined there, may still be waking the transport for
     * a job the driver already took (seen under TSan in CI: weft__shm_wake
     * on a transport shm_destroy had freed). No frame is posted by now, so
     * the transport holds none of its buffers. */
    weft__comm_discard(c);
    return WEFT_OK;
}

int weft_rank(const weft_comm *c)
{
    return c == NULL ? WEFT_EINVAL : c->x.rank;
}

const char *weft_info(const weft_comm *c)
{
    return c == NULL ? NULL : c->info;
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
    weft__sched_wake(c);
    return WEFT_OK;
}
