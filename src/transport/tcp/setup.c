/*
 * Set-up and tear-down of the TCP transport: which wires go to each peer
 * (the hostfile's links, the relay connections), listening, waiting until
 * every wire is up (weft__tcp_create_wires: the ibverbs transport opens
 * its TCP wires through it too), shutdown and destroy, and the ops table.
 */
#include "transport/tcp/tcp.h"

#include <errno.h>
#include <fcntl.h>
#include <unistd.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void async_cb(uv_async_t *a)
{
    ((tcp_tp *)a->data)->events++;
}

static int all_up(tcp_tp *tp)
{
    for (int p = 0; p < tp->nranks; p++)
        for (int w = 0; w < tp->peers[p].nslots; w++) {
            conn *k = tp->peers[p].s[w].c;
            if (k == NULL || k->state != CONN_UP)
                return 0;
        }
    return 1;
}

/* Decides the wires to every peer from the hostfile: ranks on one host
 * talk over loopback; ranks on different hosts over every link joining
 * their hosts, `wires` connections on each, ordered by link index so both
 * ends agree. */
static int hosts_linked(const weft__config *cfg, int ha, int hb)
{
    if (ha == hb)
        return 1;
    for (int l = 0; l < cfg->nlinks; l++) {
        const weft__link *lk = &cfg->links[l];
        if (weft__link_joins(lk, ha, hb))
            return 1;
    }
    return 0;
}

/* A job relays when some pair of ranks has no wires of its own: then each
 * rank keeps one more connection to each ring neighbour, for relayed
 * point-to-point traffic only. Every rank decides the same from the
 * hostfile. */
static int job_relays(const weft__config *cfg)
{
    if (cfg->nranks < 3)
        return 0;
    for (int a = 0; a < cfg->nhosts; a++)
        for (int b = a + 1; b < cfg->nhosts; b++)
            if (!hosts_linked(cfg, a, b))
                return 1;
    return 0;
}

static int plan_slots(tcp_tp *tp, int W, int W_local)
{
    const weft__config *cfg = tp->cfg;
    int relays = job_relays(cfg);
    int right = (tp->rank + 1) % tp->nranks;
    int left = (tp->rank + tp->nranks - 1) % tp->nranks;

    tp->peers = calloc((size_t)tp->nranks, sizeof *tp->peers);
    if (tp->peers == NULL)
        return WEFT_ENOMEM;
    for (int p = 0; p < tp->nranks; p++) {
        int hp = cfg->rank_host[p], hm = cfg->rank_host[tp->rank], n = 0;
        int lo = p < tp->rank ? p : tp->rank; /* the rank that listens */

        if (p == tp->rank)
            continue;
        if (hp == hm)
            n = W_local;
        else
            for (int l = 0; l < cfg->nlinks; l++) {
                const weft__link *lk = &cfg->links[l];
                if (weft__link_joins(lk, hp, hm))
                    n += W;
            }
        if (n == 0)
            continue;
        if (n > WEFT__MAX_WIRES)
            return weft__fail(tp->sink, WEFT_ECONFIG,
                              "rank %d: %d wires to peer %d, more than %d",
                              tp->rank, n, p, WEFT__MAX_WIRES);
        tp->peers[p].s = calloc((size_t)n + 1, sizeof(slot));
        if (tp->peers[p].s == NULL)
            return WEFT_ENOMEM;
        tp->peers[p].nwires = n;
        tp->peers[p].nslots = n;
        n = 0;
        if (hp == hm) {
            for (int w = 0; w < W_local; w++, n++) {
                slot *s = &tp->peers[p].s[n];
                s->link = WEFT__LINK_LOOPBACK;
                s->lwire = (uint32_t)w;
                const char *la = cfg->hosts[hm].local_addr;
                snprintf(s->addr, sizeof s->addr, "%s",
                         la[0] != '\0' ? la : "127.0.0.1");
            }
        } else {
            for (int l = 0; l < cfg->nlinks; l++) {
                const weft__link *lk = &cfg->links[l];
                int lo_end;
                if (!weft__link_joins(lk, hp, hm))
                    continue;
                lo_end = lk->end[0].host == cfg->rank_host[lo] ? 0 : 1;
                for (int w = 0; w < W; w++, n++) {
                    slot *s = &tp->peers[p].s[n];
                    s->link = (uint32_t)l;
                    s->lwire = (uint32_t)w;
                    snprintf(s->addr, sizeof s->addr, "%s",
                             lk->end[lo_end].addr);
                }
            }
        }
        if (relays && (p == left || p == right)) {
            /* The relay connection runs on the neighbour's first wire's
             * path (link and address). */
            slot *s = &tp->peers[p].s[n];
            *s = tp->peers[p].s[0];
            s->link = LINK_RELAY;
            s->lwire = 0;
            s->relay = 1;
            tp->relay[p == right ? 1 : 0] = s;
            tp->peers[p].nslots = ++n;
        }
        for (int w = 0; w < n; w++) {
            slot *s = &tp->peers[p].s[w];
            const uint32_t l = (uint32_t)weft__tcp_home_link(tp, p, s);

            s->outgoing = tp->rank > p;
            s->port = weft__config_rank_port(cfg, lo);
            s->alt_link = -1;
            /* Over a path: dialled at the first host between (splice.c). */
            if (s->outgoing && l < (uint32_t)cfg->nlinks &&
                cfg->links[l].nvia > 0 &&
                weft__tcp_path_first(tp, p, l, s->addr, sizeof s->addr,
                                     &s->port) != 0)
                return weft__fail(tp->sink, WEFT_ECONFIG,
                                  "rank %d: link %u to peer %d is no path "
                                  "between their hosts",
                                  tp->rank, (unsigned)l, p);
        }
    }
    return WEFT_OK;
}

/* Closes connections only (shutdown) or every handle (destroy). */
static void walk_close_conns(uv_handle_t *h, void *arg)
{
    tcp_tp *tp = arg;
    if (!uv_is_closing(h) && h->type == UV_TCP &&
        h != (uv_handle_t *)&tp->listener)
        weft__tcp_conn_close(h->data);
}

static void walk_close_all(uv_handle_t *h, void *arg)
{
    walk_close_conns(h, arg);
    if (!uv_is_closing(h))
        uv_close(h, NULL);
}

/* Frees a list of relayed chunks and their bytes. */
static void rchunks_free(rchunk **head)
{
    while (*head != NULL) {
        rchunk *c = *head;
        *head = c->next;
        free(c->data);
        free(c);
    }
}

static void tcp_shutdown(weft__tp *t)
{
    tcp_tp *tp = (tcp_tp *)t;

    if (tp == NULL)
        return;
    tp->shut = 1;
    /* The sending thread first: it writes to the connections closed
     * below, from buffers the caller gets back once this returns. */
    weft__tcp_tx_stop(tp);
    /* No more connect retries: the slots are emptied below, and a retry
     * would open new connections while we wait for these to close. */
    uv_timer_stop(&tp->housekeep);
    /* A failed communicator takes no more connections: the peer's next
     * communicator must not meet this one. Its socket stays open, kept
     * (transport.h): the port answers while this process lives, and
     * connections wait in its backlog for this process's next listener
     * at that port (a shrink's, a new communicator's), which takes the
     * socket over; finalizing this one closes it. */
    if (tp->handles && !uv_is_closing((uv_handle_t *)&tp->listener)) {
        uv_os_fd_t lfd;
        int kfd;

        if (tp->up && tp->nranks > 1 && !tp->kept && !tp->destroying &&
            uv_fileno((uv_handle_t *)&tp->listener, &lfd) == 0 &&
            (kfd = fcntl(lfd, F_DUPFD_CLOEXEC, 0)) >= 0) {
            weft__port_keep(weft__config_rank_port(tp->cfg, tp->rank), kfd, tp);
            tp->kept = 1;
        }
        uv_close((uv_handle_t *)&tp->listener, NULL);
    }
    for (int p = 0; p < tp->nranks && tp->peers != NULL; p++)
        for (int w = 0; w < tp->peers[p].nslots; w++) {
            conn *k = tp->peers[p].s[w].c;
            if (k != NULL) {
                k->rq_head = k->rq_tail = NULL;
                k->sq_head = k->sq_tail = NULL;
                weft__tcp_conn_close(k);
            }
            tp->peers[p].s[w].c = NULL;
        }
    for (conn *k = tp->pending; k != NULL; k = k->next)
        weft__tcp_conn_close(k);
    tp->pending = NULL;
    tp->dirty = NULL;
    tp->rx_dirty = NULL;
    tp->rrecv = NULL;
    rchunks_free(&tp->rpending);
    rchunks_free(&tp->fwd_head);
    tp->fwd_tail = NULL;
    /* Connections still connecting are not in any list: close them too. */
    uv_walk(&tp->loop, walk_close_conns, tp);
    /* Close callbacks (and cancelled writes) run in the next iteration; the
     * bound only guards against a bug turning this into a spin. */
    for (int i = 0; tp->nopen > 0 && i < 1000; i++)
        weft__tcp_run(tp, UV_RUN_NOWAIT);
    if (tp->nopen > 0)
        weft__log(WEFT__LOG_ERROR, tp->rank,
                  "%d connections did not close at shutdown", tp->nopen);
}

static void tcp_destroy(weft__tp *t)
{
    tcp_tp *tp = (tcp_tp *)t;
    weft__sigpipe_state sp;

    if (tp == NULL)
        return;
    /* Connections this rank carries on for others, until their ends are
     * done with them (splice.c). */
    weft__tcp_splice_stop(tp);
    tp->destroying = 1; /* nothing to keep: this process is done with it */
    if (tp->kept)
        weft__port_drop(tp);
    if (tp->handles) {
        weft__sigpipe_block(&sp);
        tcp_shutdown(t);
        uv_walk(&tp->loop, walk_close_all, tp);
        weft__tcp_run(tp, UV_RUN_DEFAULT);
        if (uv_loop_close(&tp->loop) != 0)
            weft__log(WEFT__LOG_WARN, tp->rank,
                      "libuv loop still busy at close");
        weft__sigpipe_restore(&sp);
    }
    if (tp->linkwatch_fd >= 0)
        close(tp->linkwatch_fd); /* its poll handle closed above */
    for (int p = 0; tp->peers != NULL && p < tp->nranks; p++)
        free(tp->peers[p].s);
    free(tp->peers);
    free(tp->told);
    while (tp->free_wreqs != NULL) {
        wreq *w = tp->free_wreqs;
        tp->free_wreqs = w->next;
        free(w);
    }
    free(tp);
}

static int tcp_create_guarded(const weft__tp_params *p, weft__tp **out);

int weft__tcp_create_wires(const weft__tp_params *p, weft__tp **out)
{
    weft__sigpipe_state sp;
    int rc;

    weft__sigpipe_block(&sp);
    rc = tcp_create_guarded(p, out);
    weft__sigpipe_restore(&sp);
    return rc;
}

static int tcp_create_guarded(const weft__tp_params *par, weft__tp **out)
{
    const weft__config *cfg = par->cfg;
    weft__errsink *sink = par->sink;
    tcp_tp *tp = calloc(1, sizeof *tp);
    struct sockaddr_in sa;
    uint64_t deadline, wake, now;
    int rc, port, kfd;

    *out = NULL;
    if (tp == NULL)
        return WEFT_ENOMEM;
    tp->cfg = cfg;
    tp->sink = sink;
    tp->lost_peer = -1;
    tp->linkwatch_fd = -1;
    tp->rank = par->rank;
    tp->nranks = par->nranks;
    tp->wires = (uint32_t)par->wires;
    tp->shm = par->local_wires > 0;
    if ((rc = plan_slots(tp, par->wires,
                         par->local_wires > 0 ? par->local_wires
                                              : par->wires)) != 0)
        goto fail;
    if (uv_loop_init(&tp->loop) != 0) {
        rc = weft__fail(sink, WEFT_ETRANSPORT, "cannot create a libuv loop");
        goto fail;
    }
    uv_timer_init(&tp->loop, &tp->timer);
    uv_timer_init(&tp->loop, &tp->housekeep);
    tp->housekeep.data = tp;
    uv_async_init(&tp->loop, &tp->async, async_cb);
    tp->async.data = tp;
    weft__spin_init(&tp->spin, cfg);
    uv_tcp_init(&tp->loop, &tp->listener);
    tp->listener.data = tp;
    tp->handles = 1;

    if (tp->nranks > 1) {
        /* One host: loopback only, nothing reachable from outside. */
        port = weft__config_rank_port(cfg, tp->rank);
        if (par->listen_fd >= 0) {
            /* Bound and listening already, at the address the caller
             * chose (peers may be queued on it). */
            int fd = fcntl(par->listen_fd, F_DUPFD_CLOEXEC, 0);
            rc = fd < 0 ? uv_translate_sys_error(errno)
                        : uv_tcp_open(&tp->listener, fd);
            if (rc != 0 && fd >= 0)
                close(fd);
        } else if ((kfd = weft__port_take(port, cfg->nhosts != 1)) >= 0) {
            /* This process's failed communicator's socket at that port,
             * with the connections waiting in its backlog. */
            rc = uv_tcp_open(&tp->listener, kfd);
            if (rc != 0)
                close(kfd);
        } else {
            uv_ip4_addr(cfg->nhosts == 1 ? "127.0.0.1" : "0.0.0.0", port, &sa);
            rc = uv_tcp_bind(&tp->listener, (struct sockaddr *)&sa, 0);
        }
        if (rc == 0)
            rc = uv_listen((uv_stream_t *)&tp->listener, 128,
                           weft__tcp_on_connection);
        if (rc != 0) {
            rc = weft__fail(sink, WEFT_ETRANSPORT,
                            "rank %d: cannot listen on port %d: %s (is "
                            "another job using it? set \"port\" or "
                            "\"ports\" in %s)",
                            tp->rank, port, uv_strerror(rc),
                            cfg->hostfile[0] ? cfg->hostfile : "the hostfile");
            goto fail;
        }
    }
    /* weft_init's one deadline, whatever else set-up takes after this. */
    deadline = par->deadline_ms;
    uv_timer_start(&tp->housekeep, weft__tcp_housekeep_cb, 0, RETRY_MS);
    while (!all_up(tp) || tp->err != 0) {
        if (tp->err != 0 && !tp->telling)
            weft__tcp_tell_start(tp, deadline);
        if (tp->err != 0 && weft__tcp_tell_done(tp)) {
            rc = tp->err;
            goto fail;
        }
        if (weft__now_ms() >= deadline) {
            char missing[256] = "";
            size_t len = 0;
            for (int p = 0; p < tp->nranks && len < sizeof missing - 16; p++)
                for (int w = 0; w < tp->peers[p].nslots; w++)
                    if (tp->peers[p].s[w].c == NULL ||
                        tp->peers[p].s[w].c->state != CONN_UP) {
                        len += (size_t)snprintf(missing + len,
                                                sizeof missing - len, " %d", p);
                        break;
                    }
            rc = weft__fail(sink, WEFT_ETIMEDOUT,
                            "rank %d: timed out: peers%s not connected "
                            "within the connect deadline of %d ms "
                            "(WEFT_CONNECT_TIMEOUT_MS or "
                            "weft_config.connect_timeout_ms)",
                            tp->rank, missing, cfg->connect_timeout_ms);
            goto fail;
        }
        /* Telling ends at tell_until, if not before. */
        wake = tp->telling && tp->tell_until < deadline ? tp->tell_until
                                                        : deadline;
        now = weft__now_ms();
        uv_timer_start(&tp->timer, weft__tcp_timer_cb,
                       wake > now ? wake - now : 0, 0);
        weft__tcp_run(tp, UV_RUN_ONCE);
    }
    uv_timer_stop(&tp->timer);
    tp->up = 1;
    weft__tcp_resume_init(tp);
    *out = (weft__tp *)tp;
    return WEFT_OK;

fail:
    tcp_destroy((weft__tp *)tp);
    return rc;
}

/* Any thread: the counts only (the connections are the loop's). */
static void tcp_cable_wires(weft__tp *t, int p, weft_wire_info *out)
{
    tcp_tp *tp = (tcp_tp *)t;

    memset(out, 0, sizeof *out);
    if (p < 0 || p >= tp->nranks)
        return;
    out->total = tp->peers[p].nwires;
    out->lost = (unsigned)atomic_load(&tp->peers[p].lost);
    out->back = (unsigned)atomic_load(&tp->peers[p].back);
    out->up = out->total - (int)out->lost + (int)out->back;
}

static int tcp_nwires(weft__tp *t, int p)
{
    tcp_tp *tp = (tcp_tp *)t;
    return p >= 0 && p < tp->nranks ? tp->peers[p].nwires : 0;
}

static const weft__tp_relay_ops tcp_relay = {
    .offered = 1,
    .send = weft__tcp_relay_send,
    .recv = weft__tcp_relay_recv,
};

const weft__tp_ops weft__tcp_ops = {
    .name = "tcp",
    .create = weft__tcp_create_wires,
    .destroy = tcp_destroy,
    .nwires = tcp_nwires,
    .cable_wires = tcp_cable_wires,
    .post_send = weft__tcp_post_send,
    .post_recv = weft__tcp_post_recv,
    .progress = weft__tcp_progress,
    .wake = weft__tcp_wake,
    .shutdown = tcp_shutdown,
    .relay = &tcp_relay,
    .box = &weft__tp_no_box,
    .read = &weft__tp_no_read,
};
