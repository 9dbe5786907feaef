/*
 * Devices and GIDs of the ibverbs transport: which device port and GID
 * each wire uses (the hostfile's device, or the one that has the link
 * end's address, or WEFT_IB_DEVICE), opening and checking the ports, each
 * device's budget checked before anything is created on it (budget.c),
 * and the resources its queue pairs share.
 */
#include "transport/ib/ib.h"

#include "transport/ib/budget.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int set_nonblock(int fd)
{
    int fl = fcntl(fd, F_GETFL);
    return fl < 0 ? -1 : fcntl(fd, F_SETFL, fl | O_NONBLOCK);
}

/* Splits "name" or "name:port" (the hostfile's "device" of a link end). */
static int parse_device(const char *spec, char *name, size_t len, int *port)
{
    const char *colon = strchr(spec, ':');
    size_t n = colon != NULL ? (size_t)(colon - spec) : strlen(spec);
    char *end;
    long p;

    if (n == 0 || n >= len)
        return -1;
    memcpy(name, spec, n);
    name[n] = '\0';
    *port = IB_PORT_DEFAULT;
    if (colon == NULL)
        return 0;
    errno = 0;
    p = strtol(colon + 1, &end, 10);
    if (errno != 0 || *end != '\0' || end == colon + 1 || p < 1 || p > 255)
        return -1;
    *port = (int)p;
    return 0;
}

static void list_devices(ib_tp *tp, char *out, size_t len)
{
    size_t n = 0;

    out[0] = '\0';
    for (int i = 0; i < tp->ndevices && n + 2 < len; i++)
        n += (size_t)snprintf(out + n, len - n, "%s%s", i ? " " : "",
                              ibv_get_device_name(tp->devlist[i]));
    if (tp->ndevices == 0)
        snprintf(out, len, "none");
}

static const char *port_state_name(enum ibv_port_state s)
{
    return ibv_port_state_str(s);
}

/* The open device port `name`:`port`, opened on first use. `what` says
 * where the name came from, for messages. */
static int dev_get(ib_tp *tp, const char *name, int port, const char *what,
                   int may_be_down, ib_dev **out)
{
    struct ibv_device *found = NULL;
    ib_dev *d;
    char names[256];
    int rc;

    for (d = tp->devs; d != NULL; d = d->next)
        if (strcmp(d->name, name) == 0 && d->port == port) {
            *out = d;
            return WEFT_OK;
        }
    for (int i = 0; i < tp->ndevices; i++)
        if (strcmp(ibv_get_device_name(tp->devlist[i]), name) == 0)
            found = tp->devlist[i];
    if (found == NULL) {
        list_devices(tp, names, sizeof names);
        return weft__fail(tp->p->sink, WEFT_ECONFIG,
                          "rank %d: RDMA device \"%s\" (%s) does not "
                          "exist on this host; devices here: %s",
                          tp->rank, name, what, names);
    }
    d = calloc(1, sizeof *d);
    if (d == NULL)
        return WEFT_ENOMEM;
    snprintf(d->name, sizeof d->name, "%s", name);
    d->port = port;
    d->next = tp->devs;
    tp->devs = d;
    d->ctx = ibv_open_device(found);
    if (d->ctx == NULL)
        return weft__fail(tp->p->sink, WEFT_ETRANSPORT,
                          "rank %d: cannot open RDMA device %s: %s", tp->rank,
                          name, strerror(errno));
    if ((rc = ibv_query_device(d->ctx, &d->attr)) != 0)
        return weft__fail(tp->p->sink, WEFT_ETRANSPORT,
                          "rank %d: ibv_query_device(%s): %s", tp->rank, name,
                          strerror(rc));
    if (port > d->attr.phys_port_cnt)
        return weft__fail(tp->p->sink, WEFT_ECONFIG,
                          "rank %d: RDMA device %s has %d port(s), not "
                          "port %d (%s)",
                          tp->rank, name, d->attr.phys_port_cnt, port, what);
    if ((rc = ibv_query_port(d->ctx, (uint8_t)port, &d->pattr)) != 0)
        return weft__fail(tp->p->sink, WEFT_ETRANSPORT,
                          "rank %d: ibv_query_port(%s, %d): %s", tp->rank, name,
                          port, strerror(rc));
    if (d->pattr.state != IBV_PORT_ACTIVE) {
        if (!may_be_down || tp->p->cfg->wire_timeout_ms <= 0)
            return weft__fail(tp->p->sink, WEFT_ETRANSPORT,
                              "rank %d: port %d of RDMA device %s is %s, "
                              "not ACTIVE",
                              tp->rank, port, name,
                              port_state_name(d->pattr.state));
        /* A link's port down as the job starts (a cable out): its wires
         * start on another link, and move to it once it is up
         * (weft__ib_exchange, failover.c). */
        d->down = 1;
        weft__log(WEFT__LOG_WARN, tp->rank,
                  "port %d of RDMA device %s is %s: its links' wires start "
                  "on the others and move to it once it is active",
                  port, name, port_state_name(d->pattr.state));
    }
    *out = d;
    return WEFT_OK;
}

/* Reads GID entry i of d's port: 1 if it exists (with its RoCE version in
 * *v2 where the library can say), 0 if the slot is empty. */
static int gid_entry(struct ibv_context *ctx, int port, int i,
                     union ibv_gid *gid, int *v2)
{
#ifdef HAVE_IBV_QUERY_GID_EX
    struct ibv_gid_entry e;

    if (ibv_query_gid_ex(ctx, (uint32_t)port, (uint32_t)i, &e, 0) != 0)
        return 0;
    *gid = e.gid;
    *v2 = e.gid_type == IBV_GID_TYPE_ROCE_V2;
    return 1;
#else
    static const uint8_t zero[16];

    /* Without the GID type, an IPv4-mapped RoCE GID is taken for v2 (rxe
     * has v2 only; v1 devices list the same address at another index). */
    if (ibv_query_gid(ctx, (uint8_t)port, i, gid) != 0 ||
        memcmp(gid->raw, zero, 16) == 0)
        return 0;
    *v2 = 1;
    return 1;
#endif
}

static int gid_is_v4(const union ibv_gid *g)
{
    static const uint8_t prefix[12] = {0, 0, 0, 0, 0,    0,
                                       0, 0, 0, 0, 0xff, 0xff};
    return memcmp(g->raw, prefix, 12) == 0;
}

/* The index of the RoCE v2 GID of d's port that is IPv4 address addr
 * (::ffff:a.b.c.d), or -1. addr NULL: the first RoCE v2 IPv4 GID. */
static int gid_find_v4(struct ibv_context *ctx, int port, int tbl_len,
                       const char *addr, union ibv_gid *out)
{
    struct in_addr in;

    if (addr != NULL && inet_pton(AF_INET, addr, &in) != 1)
        return -1;
    for (int i = 0; i < tbl_len; i++) {
        union ibv_gid g;
        int v2 = 0;

        if (!gid_entry(ctx, port, i, &g, &v2) || !v2 || !gid_is_v4(&g))
            continue;
        if (addr != NULL && memcmp(g.raw + 12, &in, 4) != 0)
            continue;
        *out = g;
        return i;
    }
    return -1;
}

/* Lists d's IPv4 RoCE v2 GIDs, for the message when none fits. */
static void list_v4_gids(const ib_dev *d, char *out, size_t len)
{
    size_t n = 0;

    out[0] = '\0';
    for (int i = 0; i < d->pattr.gid_tbl_len && n + 24 < len; i++) {
        union ibv_gid g;
        char ip[INET_ADDRSTRLEN];
        int v2 = 0;

        if (!gid_entry(d->ctx, d->port, i, &g, &v2) || !v2 || !gid_is_v4(&g))
            continue;
        inet_ntop(AF_INET, g.raw + 12, ip, sizeof ip);
        n += (size_t)snprintf(out + n, len - n, "%s%d:%s", n ? " " : "", i, ip);
    }
    if (n == 0)
        snprintf(out, len, "none");
}

/* Chooses the GID a wire sends from: on RoCE, the RoCE v2 IPv4-mapped GID
 * of the link end's address (addr NULL: the first one); on InfiniBand,
 * entry 0 (the port GID; the LID addresses it too). */
static int gid_choose(ib_tp *tp, ib_wire *w, const char *addr)
{
    ib_dev *d = w->dev;
    char have[200];

    if (d->pattr.link_layer == IBV_LINK_LAYER_INFINIBAND) {
        w->gid_index = 0;
        if (ibv_query_gid(d->ctx, (uint8_t)d->port, 0, &w->gid) != 0)
            return weft__fail(tp->p->sink, WEFT_ETRANSPORT,
                              "rank %d: cannot read GID 0 of %s port %d",
                              tp->rank, d->name, d->port);
        return WEFT_OK;
    }
    w->gid_index =
        gid_find_v4(d->ctx, d->port, d->pattr.gid_tbl_len, addr, &w->gid);
    /* A port that is down may have no GID for its address until it is up
     * (weft__ib_link_gid then). */
    if (w->gid_index >= 0 || d->down)
        return WEFT_OK;
    list_v4_gids(d, have, sizeof have);
    if (addr == NULL)
        return weft__fail(tp->p->sink, WEFT_ECONFIG,
                          "rank %d: RDMA device %s port %d has no RoCE "
                          "v2 IPv4 GID (is its netdev up with an IPv4 "
                          "address?)",
                          tp->rank, d->name, d->port);
    return weft__fail(tp->p->sink, WEFT_ECONFIG,
                      "rank %d: RDMA device %s port %d has no RoCE v2 "
                      "GID for address %s (the hostfile's address of "
                      "this link end); its IPv4 GIDs: %s",
                      tp->rank, d->name, d->port, addr, have);
}

/* Finds the device port whose GID table holds addr, for link ends that
 * name no device. */
static int dev_by_addr(ib_tp *tp, const char *addr, char *name, size_t len,
                       int *port)
{
    for (int i = 0; i < tp->ndevices; i++) {
        struct ibv_context *ctx = ibv_open_device(tp->devlist[i]);
        struct ibv_device_attr da;
        int hit = 0;

        if (ctx == NULL)
            continue;
        if (ibv_query_device(ctx, &da) == 0)
            for (int p = 1; p <= da.phys_port_cnt && !hit; p++) {
                struct ibv_port_attr pa;
                union ibv_gid g;
                if (ibv_query_port(ctx, (uint8_t)p, &pa) == 0 &&
                    gid_find_v4(ctx, p, pa.gid_tbl_len, addr, &g) >= 0) {
                    snprintf(name, len, "%s",
                             ibv_get_device_name(tp->devlist[i]));
                    *port = p;
                    hit = 1;
                }
            }
        ibv_close_device(ctx);
        if (hit)
            return WEFT_OK;
    }
    return weft__fail(tp->p->sink, WEFT_ECONFIG,
                      "rank %d: no RDMA device has a RoCE v2 GID for "
                      "address %s; name the device of this link end in "
                      "the hostfile (\"device\")",
                      tp->rank, addr);
}

/* The device and address a wire of link `link` uses on this host. */
int weft__ib_wire_device(ib_tp *tp, uint32_t link, ib_wire *w)
{
    const weft__config *cfg = tp->p->cfg;
    int me = cfg->rank_host[tp->rank];
    const weft__link_end *e = NULL;
    char name[64], what[96];
    const char *addr = NULL;
    int port = IB_PORT_DEFAULT, rc;

    if (link != WEFT__LINK_LOOPBACK) {
        const weft__link *lk = &cfg->links[link];
        e = lk->end[0].host == me ? &lk->end[0] : &lk->end[1];
        snprintf(what, sizeof what, "the hostfile's links[%u]", link);
    } else {
        /* Ranks of one host: the host's first device, unless
         * WEFT_IB_DEVICE names one. */
        for (int l = 0; l < cfg->nlinks && e == NULL; l++)
            for (int k = 0; k < 2 && e == NULL; k++)
                if (cfg->links[l].end[k].host == me)
                    e = &cfg->links[l].end[k];
        snprintf(what, sizeof what, "%s",
                 cfg->ib_device[0] ? "WEFT_IB_DEVICE"
                                   : "this host's first link end");
    }
    if (link == WEFT__LINK_LOOPBACK && cfg->ib_device[0] != '\0') {
        if (parse_device(cfg->ib_device, name, sizeof name, &port) != 0)
            return weft__fail(tp->p->sink, WEFT_ECONFIG,
                              "rank %d: WEFT_IB_DEVICE=\"%s\": expected "
                              "a device name, or name:port",
                              tp->rank, cfg->ib_device);
        /* The link end's address, if that end is on this very device. */
        if (e != NULL && e->device[0] != '\0') {
            char en[64];
            int ep;
            if (parse_device(e->device, en, sizeof en, &ep) == 0 &&
                strcmp(en, name) == 0 && ep == port)
                addr = e->addr;
        }
    } else if (e != NULL && e->device[0] != '\0') {
        if (parse_device(e->device, name, sizeof name, &port) != 0)
            return weft__fail(tp->p->sink, WEFT_ECONFIG,
                              "rank %d: device \"%s\" in %s: expected a "
                              "device name, or name:port",
                              tp->rank, e->device, what);
        addr = e->addr;
    } else if (e != NULL) {
        if ((rc = dev_by_addr(tp, e->addr, name, sizeof name, &port)) != 0)
            return rc;
        addr = e->addr;
    } else {
        /* One host and no links: the first device there is. */
        if (tp->ndevices == 0)
            return weft__fail(tp->p->sink, WEFT_ECONFIG,
                              "rank %d: no RDMA device on this host", tp->rank);
        snprintf(name, sizeof name, "%s", ibv_get_device_name(tp->devlist[0]));
        snprintf(what, sizeof what, "the first device found");
    }
    if ((rc = dev_get(tp, name, port, what, link != WEFT__LINK_LOOPBACK,
                      &w->dev)) != 0)
        return rc;
    snprintf(w->addr, sizeof w->addr, "%s", addr != NULL ? addr : "-");
    if ((rc = gid_choose(tp, w, addr)) != 0)
        return rc;
    weft__log(WEFT__LOG_DEBUG, tp->rank,
              "wire %d to peer %d: device %s port %d, GID index %d (%s)", w->w,
              w->peer, w->dev->name, w->dev->port, w->gid_index, w->addr);
    return WEFT_OK;
}

void weft__ib_link_gid(ib_link *lk)
{
    ib_dev *d = lk->dev;
    struct ibv_port_attr pa;

    if (ibv_query_port(d->ctx, (uint8_t)d->port, &pa) == 0)
        d->pattr = pa;
    if (d->pattr.link_layer == IBV_LINK_LAYER_INFINIBAND) {
        lk->gid_index =
            ibv_query_gid(d->ctx, (uint8_t)d->port, 0, &lk->gid) == 0 ? 0 : -1;
        return;
    }
    lk->gid_index = gid_find_v4(d->ctx, d->port, d->pattr.gid_tbl_len,
                                lk->addr[0] != '-' ? lk->addr : NULL, &lk->gid);
}

/* ---- budgets and shared resources ---- */

/* Checks, before anything is created, that the device can hold what this
 * rank and the other ranks of its host put on it (ib_budget.h). */
int weft__ib_dev_budget(ib_tp *tp, const ib_dev *d)
{
    const struct ibv_device_attr *a = &d->attr;
    const weft__config *cfg = tp->p->cfg;
    weft__ib_limits lim = {
        .max_qp = a->max_qp,
        .max_mr = a->max_mr,
        .max_cq = a->max_cq,
        .max_pd = a->max_pd,
        .max_cqe = a->max_cqe,
        .max_qp_wr = a->max_qp_wr,
        .max_mr_size = a->max_mr_size,
    };
    weft__ib_needs need = {
        .nqp = d->nqp,
        .sq_depth = tp->sq_depth,
        .rq_depth = tp->rq_depth,
        .ring = tp->slot_bytes * (size_t)tp->slots,
        /* Every rank of a host builds the same wires on the same devices
         * (weft__ib_wire_device() depends on the host and WEFT_IB_DEVICE only).
         */
        .local_ranks = cfg->hosts[cfg->rank_host[tp->rank]].nranks,
    };
    char msg[512];

    if (weft__ib_budget(&lim, &need, tp->rank, d->name, msg, sizeof msg) != 0)
        return weft__fail(tp->p->sink, WEFT_ECONFIG, "%s", msg);
    return WEFT_OK;
}

int weft__ib_dev_setup(ib_tp *tp, ib_dev *d)
{
    int cqe = d->nqp * (tp->sq_depth + tp->rq_depth);

    d->cq_qps = d->nqp;

    if ((d->pd = ibv_alloc_pd(d->ctx)) == NULL)
        return weft__fail(tp->p->sink, WEFT_ENOMEM,
                          "rank %d: ibv_alloc_pd on RDMA device %s: %s",
                          tp->rank, d->name, strerror(errno));
    if ((d->ch = ibv_create_comp_channel(d->ctx)) == NULL)
        return weft__fail(tp->p->sink, WEFT_ETRANSPORT,
                          "rank %d: ibv_create_comp_channel on RDMA "
                          "device %s: %s",
                          tp->rank, d->name, strerror(errno));
    if ((d->cq = ibv_create_cq(d->ctx, cqe, NULL, d->ch, 0)) == NULL)
        return weft__fail(tp->p->sink, WEFT_ENOMEM,
                          "rank %d: ibv_create_cq of %d entries on RDMA "
                          "device %s: %s",
                          tp->rank, cqe, d->name, strerror(errno));
    /* progress() polls, then sleeps in poll(): reads must not block. */
    if (set_nonblock(d->ch->fd) != 0 || set_nonblock(d->ctx->async_fd) != 0)
        return weft__fail(tp->p->sink, WEFT_ETRANSPORT,
                          "rank %d: cannot make the event fds of RDMA "
                          "device %s non-blocking: %s",
                          tp->rank, d->name, strerror(errno));
    return WEFT_OK;
}
