/*
 * Connections carried on through this rank's host: the wires of a ring's
 * step between two hosts that no cable joins (a shrink left the ring of
 * hosts a chain; topo.h, weft__link.nvia).
 *
 * The dialling rank connects to the first rank of the first host between
 * and sends a splice request (tcp.h: the steps left, each a rank and the
 * cable to reach it by). That rank checks the request (the job's token,
 * steps that exist in its communicator), connects to the next step,
 * passes the rest of the request on where steps are left (the last host
 * between answers SPLICE_OK once it reached the peer, and the dialling
 * rank sends its hello only then), and from then on copies bytes both
 * ways, unchanged, on a thread of its
 * own, so that the wire moves whatever this rank is doing (computing,
 * waiting in another call, finalizing). The handshake, the data and the
 * failover run end to end as over a cable.
 *
 * Ends: one side's close (FIN) is passed on once its bytes are written
 * (shutdown of the other side's sending half), so a peer that leaves is
 * seen as leaving; a failure of either side (a reset, a link's timeout, a
 * connect refused) resets both, which the ends take for a lost link. A
 * rank that finalizes waits until both ends of every connection it
 * carries have closed them, or until nothing moved on any for the wire
 * timeout (2 s where none is set): its peers may finish later than it.
 */
#include "transport/tcp/tcp.h"

#include "base/bytes.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#define SP_BUF (256 * 1024) /* bytes in flight each way, per connection */
#define SP_CONNECT_MS 3000  /* the next step's connect */

typedef struct sp_pair {
    int fd[2];    /* 0: the connection that came, 1: the next step's */
    char *buf[2]; /* buf[d]: read from fd[d], to write to fd[1 - d] */
    size_t lo[2], hi[2];
    int eof[2];  /* fd[d] ended */
    int shut[2]; /* ... and that end was passed on */
    int connecting;
    int answer; /* the last host between: answers once connected */
    uint64_t deadline_ms;
    struct sp_pair *next;
} sp_pair;

typedef struct tcp_splice {
    pthread_t th;
    pthread_mutex_t mu;
    int efd;
    int stop;    /* under mu */
    sp_pair *in; /* handed over, under mu */
    int rank;    /* for logs */
    int idle_ms; /* stopping: give up after this long without a byte */
    int wt;      /* the wire timeout, for the sockets */
} tcp_splice;

/* The address of host h's end of cable c. */
static const char *end_addr(const weft__config *cfg, int c, int h)
{
    return weft__link_addr(&cfg->links[c], h);
}

/* Path l from this rank's host to peer p's: the hosts between, in that
 * order (hosts[0 .. n)), and the cable of each step (cab[0 .. n]). n, or
 * -1 where l is no path between the two hosts. */
static int path_steps(const tcp_tp *tp, int p, uint32_t l, int *hosts, int *cab)
{
    const weft__config *cfg = tp->cfg;
    const int hm = cfg->rank_host[tp->rank], hp = cfg->rank_host[p];
    const weft__link *lk;
    int n, fwd;

    if (l >= (uint32_t)cfg->nlinks)
        return -1;
    lk = &cfg->links[l];
    if (lk->nvia <= 0 || lk->nvia > WEFT__MAX_VIA ||
        !weft__link_joins(lk, hm, hp))
        return -1;
    n = lk->nvia;
    fwd = lk->end[0].host == hm;
    for (int i = 0; i < n; i++)
        hosts[i] = fwd ? lk->via[i] : lk->via[n - 1 - i];
    for (int i = 0; i <= n; i++)
        cab[i] = fwd ? lk->hop[i] : lk->hop[n - i];
    return n;
}

int weft__tcp_path_first(const tcp_tp *tp, int p, uint32_t l, char *addr,
                         size_t addrlen, int *port)
{
    const weft__config *cfg = tp->cfg;
    int hosts[WEFT__MAX_VIA], cab[WEFT__MAX_VIA + 1];

    if (path_steps(tp, p, l, hosts, cab) < 0)
        return -1;
    snprintf(addr, addrlen, "%s", end_addr(cfg, cab[0], hosts[0]));
    *port = weft__config_rank_port(cfg, cfg->hosts[hosts[0]].first_rank);
    return 0;
}

int weft__tcp_splice_request(const tcp_tp *tp, int p, uint32_t l, uint8_t *out)
{
    const weft__config *cfg = tp->cfg;
    int hosts[WEFT__MAX_VIA], cab[WEFT__MAX_VIA + 1];
    const int n = path_steps(tp, p, l, hosts, cab);

    if (n < 0)
        return -1;
    memset(out, 0, SPLICE_BYTES);
    weft__put_be32(out, SPLICE_MAGIC);
    weft__put_be32(out + 4, (uint32_t)n); /* steps after the first */
    memcpy(out + 8, cfg->token, WEFT__TOKEN_BYTES);
    for (int i = 1; i <= n; i++) {
        int r = i < n ? cfg->hosts[hosts[i]].first_rank : p;
        weft__put_be32(out + 24 + 8 * (i - 1), (uint32_t)r);
        weft__put_be32(out + 28 + 8 * (i - 1), (uint32_t)cab[i]);
    }
    return 0;
}

static void sock_tune(int fd, int wt)
{
    int one = 1;

    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    /* As the wires' own ends (handshake.c, tune_socket): a silent link
     * on either side ends the connection within the wire timeout. */
    if (wt > 0) {
        unsigned ut = weft__tcp_user_timeout(wt);
        setsockopt(fd, SOL_SOCKET, SO_KEEPALIVE, &one, sizeof one);
        setsockopt(fd, IPPROTO_TCP, TCP_KEEPIDLE, &one, sizeof one);
        setsockopt(fd, IPPROTO_TCP, TCP_KEEPINTVL, &one, sizeof one);
        setsockopt(fd, IPPROTO_TCP, TCP_USER_TIMEOUT, &ut, sizeof ut);
    }
}

/* Closes both sides: with a reset where the pair failed (the ends take
 * it for a lost link), else plainly. */
static void pair_free(sp_pair *sp, int reset)
{
    for (int d = 0; d < 2; d++) {
        if (sp->fd[d] >= 0) {
            if (reset) {
                struct linger lg = {1, 0};
                setsockopt(sp->fd[d], SOL_SOCKET, SO_LINGER, &lg, sizeof lg);
            }
            close(sp->fd[d]);
        }
        free(sp->buf[d]);
    }
    free(sp);
}

/* Moves what it can both ways. Returns 1 when the pair is done (both
 * ends passed on), -1 when it failed, else 0; *moved when bytes moved. */
static int pair_step(sp_pair *sp, short rev0, short rev1, int *moved)
{
    const short rev[2] = {rev0, rev1};

    if (sp->connecting) {
        int err = 0;
        socklen_t len = sizeof err;

        if (!(rev1 & (POLLOUT | POLLERR | POLLHUP)))
            return weft__now_ms() >= sp->deadline_ms ? -1 : 0;
        if (getsockopt(sp->fd[1], SOL_SOCKET, SO_ERROR, &err, &len) != 0 ||
            err != 0)
            return -1;
        sp->connecting = 0;
        if (sp->answer) {
            weft__put_be32((uint8_t *)sp->buf[1], SPLICE_OK);
            sp->hi[1] = SPLICE_OK_BYTES;
        }
    }
    for (int d = 0; d < 2; d++) {
        if (!sp->eof[d] && (rev[d] & (POLLIN | POLLHUP | POLLERR))) {
            ssize_t r;

            if (sp->lo[d] == sp->hi[d])
                sp->lo[d] = sp->hi[d] = 0;
            else if (sp->hi[d] == SP_BUF && sp->lo[d] > 0) {
                memmove(sp->buf[d], sp->buf[d] + sp->lo[d],
                        sp->hi[d] - sp->lo[d]);
                sp->hi[d] -= sp->lo[d];
                sp->lo[d] = 0;
            }
            if (sp->hi[d] < SP_BUF) {
                r = read(sp->fd[d], sp->buf[d] + sp->hi[d], SP_BUF - sp->hi[d]);
                if (r > 0) {
                    sp->hi[d] += (size_t)r;
                    *moved = 1;
                } else if (r == 0)
                    sp->eof[d] = 1;
                else if (errno != EAGAIN && errno != EINTR)
                    return -1;
            }
        }
        if (sp->lo[d] < sp->hi[d]) {
            ssize_t w = send(sp->fd[1 - d], sp->buf[d] + sp->lo[d],
                             sp->hi[d] - sp->lo[d], MSG_NOSIGNAL);
            if (w > 0) {
                sp->lo[d] += (size_t)w;
                *moved = 1;
            } else if (w < 0 && errno != EAGAIN && errno != EINTR)
                return -1;
        }
        if (sp->eof[d] && sp->lo[d] == sp->hi[d] && !sp->shut[d]) {
            shutdown(sp->fd[1 - d], SHUT_WR);
            sp->shut[d] = 1;
        }
    }
    return sp->shut[0] && sp->shut[1] ? 1 : 0;
}

static void *splice_main(void *arg)
{
    tcp_splice *t = arg;
    sp_pair *pairs = NULL;
    struct pollfd *pf = NULL;
    size_t cap = 0;
    uint64_t moved_ms = weft__now_ms();

    for (;;) {
        int stopping, n = 0, i;

        pthread_mutex_lock(&t->mu);
        while (t->in != NULL) {
            sp_pair *sp = t->in;
            t->in = sp->next;
            sp->next = pairs;
            pairs = sp;
        }
        stopping = t->stop;
        pthread_mutex_unlock(&t->mu);
        for (sp_pair *sp = pairs; sp != NULL; sp = sp->next)
            n++;
        if (stopping &&
            (n == 0 || weft__now_ms() - moved_ms >= (uint64_t)t->idle_ms))
            break;
        if ((size_t)(1 + 2 * n) > cap) {
            struct pollfd *g = realloc(pf, sizeof *pf * (size_t)(1 + 2 * n));
            if (g == NULL) {
                poll(NULL, 0, 10); /* no room now: try again */
                continue;
            }
            pf = g;
            cap = (size_t)(1 + 2 * n);
        }
        pf[0] = (struct pollfd){.fd = t->efd, .events = POLLIN};
        i = 1;
        for (sp_pair *sp = pairs; sp != NULL; sp = sp->next, i += 2) {
            short e0 = 0, e1 = 0;

            if (sp->connecting)
                e1 = POLLOUT;
            else {
                if (!sp->eof[0] && sp->hi[0] - sp->lo[0] < SP_BUF)
                    e0 |= POLLIN;
                if (!sp->eof[1] && sp->hi[1] - sp->lo[1] < SP_BUF)
                    e1 |= POLLIN;
                if (sp->lo[0] < sp->hi[0])
                    e1 |= POLLOUT;
                if (sp->lo[1] < sp->hi[1])
                    e0 |= POLLOUT;
            }
            pf[i] = (struct pollfd){.fd = sp->fd[0], .events = e0};
            pf[i + 1] = (struct pollfd){.fd = sp->fd[1], .events = e1};
        }
        /* A connect's deadline, and a stop's idle bound, are looked at
         * every 100 ms. */
        if (poll(pf, (nfds_t)(1 + 2 * n), 100) < 0 && errno != EINTR)
            break;
        if (pf[0].revents & POLLIN) {
            uint64_t v;
            if (read(t->efd, &v, sizeof v) < 0) {
                /* nothing to do: it is read again next time */
            }
        }
        i = 1;
        for (sp_pair **pp = &pairs; *pp != NULL; i += 2) {
            sp_pair *sp = *pp;
            int moved = 0;
            int st = pair_step(sp, pf[i].revents, pf[i + 1].revents, &moved);

            if (moved)
                moved_ms = weft__now_ms();
            if (st != 0) {
                if (st < 0)
                    weft__log(WEFT__LOG_INFO, t->rank,
                              "a connection carried on for two other ranks "
                              "ended: %s",
                              sp->connecting ? "its next step did not answer"
                                             : "a side failed");
                *pp = sp->next;
                pair_free(sp, st < 0);
            } else
                pp = &sp->next;
        }
    }
    if (pairs != NULL)
        weft__log(WEFT__LOG_WARN, t->rank,
                  "finalize: closed connections carried on for other ranks "
                  "after %d ms without a byte on them",
                  t->idle_ms);
    while (pairs != NULL) {
        sp_pair *sp = pairs;
        pairs = sp->next;
        pair_free(sp, 1);
    }
    free(pf);
    return NULL;
}

static void reject(conn *k, const char *why)
{
    weft__log(WEFT__LOG_WARN, k->tp->rank,
              "rejected a connection from %s to carry on: %s (the job goes "
              "on)",
              k->name, why);
    weft__tcp_conn_close(k);
}

/* The thread, started at the first connection carried on. */
static tcp_splice *splice_get(tcp_tp *tp)
{
    tcp_splice *t;

    if (tp->splice != NULL)
        return tp->splice;
    if ((t = calloc(1, sizeof *t)) == NULL)
        return NULL;
    t->rank = tp->rank;
    t->wt = tp->cfg->wire_timeout_ms;
    t->idle_ms = t->wt > 0 ? t->wt : 2000;
    t->efd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    if (t->efd < 0 || pthread_mutex_init(&t->mu, NULL) != 0) {
        if (t->efd >= 0)
            close(t->efd);
        free(t);
        return NULL;
    }
    if (pthread_create(&t->th, NULL, splice_main, t) != 0) {
        pthread_mutex_destroy(&t->mu);
        close(t->efd);
        free(t);
        return NULL;
    }
    tp->splice = t;
    return t;
}

void weft__tcp_splice_take(conn *k)
{
    tcp_tp *tp = k->tp;
    const weft__config *cfg = tp->cfg;
    const uint8_t *q = k->hbuf;
    const uint32_t n = weft__get_be32(q + 4);
    const uint32_t r = weft__get_be32(q + 24), c = weft__get_be32(q + 28);
    const int hm = cfg->rank_host[tp->rank];
    uint8_t diff = 0;
    struct sockaddr_in sa;
    tcp_splice *t;
    sp_pair *sp;
    uv_os_fd_t fd;
    size_t at = 0;

    for (int i = 0; i < WEFT__TOKEN_BYTES; i++)
        diff |= (uint8_t)(q[8 + i] ^ cfg->token[i]);
    if (diff != 0)
        return reject(k, "wrong job token (WEFT_JOB_TOKEN)");
    if (n < 1 || n > WEFT__MAX_VIA + 1 || r >= (uint32_t)cfg->nranks ||
        c >= (uint32_t)cfg->nlinks || (int)r == tp->rank ||
        !weft__cable_joins(&cfg->links[c], hm, cfg->rank_host[r]))
        return reject(k, "its next step is no rank over a cable from here");
    memset(&sa, 0, sizeof sa);
    if (uv_ip4_addr(end_addr(cfg, (int)c, cfg->rank_host[r]),
                    weft__config_rank_port(cfg, (int)r), &sa) != 0)
        return reject(k, "bad address");
    if ((t = splice_get(tp)) == NULL || (sp = calloc(1, sizeof *sp)) == NULL)
        return reject(k, "out of memory");
    sp->fd[0] = sp->fd[1] = -1;
    sp->buf[0] = malloc(SP_BUF);
    sp->buf[1] = malloc(SP_BUF);
    if (sp->buf[0] == NULL || sp->buf[1] == NULL ||
        uv_fileno((uv_handle_t *)&k->h, &fd) != 0 ||
        (sp->fd[0] = fcntl(fd, F_DUPFD_CLOEXEC, 0)) < 0 ||
        (sp->fd[1] = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC,
                            0)) < 0) {
        pair_free(sp, 1);
        return reject(k, "out of memory or sockets");
    }
    sock_tune(sp->fd[0], t->wt);
    sock_tune(sp->fd[1], t->wt);
    if (connect(sp->fd[1], (struct sockaddr *)&sa, sizeof sa) != 0 &&
        errno != EINPROGRESS) {
        pair_free(sp, 1);
        return reject(k, "cannot connect to its next step");
    }
    sp->connecting = 1;
    sp->answer = n == 1;
    sp->deadline_ms = weft__now_ms() + SP_CONNECT_MS;
    /* What goes on first: the rest of the request where steps are left,
     * then whatever of the hello came with it. */
    if (n > 1) {
        uint8_t *o = (uint8_t *)sp->buf[0];
        memset(o, 0, SPLICE_BYTES);
        weft__put_be32(o, SPLICE_MAGIC);
        weft__put_be32(o + 4, n - 1);
        memcpy(o + 8, q + 8, WEFT__TOKEN_BYTES);
        memcpy(o + 24, q + 32, 8 * (size_t)(n - 1));
        at = SPLICE_BYTES;
    }
    memcpy(sp->buf[0] + at, q + SPLICE_BYTES, k->hgot - SPLICE_BYTES);
    sp->hi[0] = at + k->hgot - SPLICE_BYTES;
    weft__log(WEFT__LOG_DEBUG, tp->rank,
              "carrying a connection from %s on to rank %u", k->name,
              (unsigned)r);
    /* libuv lets go of its descriptor (and its poller's watch); the copy
     * stays open, with the thread. */
    uv_read_stop((uv_stream_t *)&k->h);
    weft__tcp_conn_close(k);
    pthread_mutex_lock(&t->mu);
    sp->next = t->in;
    t->in = sp;
    pthread_mutex_unlock(&t->mu);
    {
        uint64_t one = 1;
        if (write(t->efd, &one, sizeof one) < 0) {
            /* the thread looks again within 100 ms */
        }
    }
}

void weft__tcp_splice_stop(tcp_tp *tp)
{
    tcp_splice *t = tp->splice;
    uint64_t one = 1;

    if (t == NULL)
        return;
    pthread_mutex_lock(&t->mu);
    t->stop = 1;
    pthread_mutex_unlock(&t->mu);
    if (write(t->efd, &one, sizeof one) < 0) {
        /* the thread looks again within 100 ms */
    }
    pthread_join(t->th, NULL);
    /* Handed over after the thread's last look: none (this thread hands
     * them over, and it is here). */
    while (t->in != NULL) {
        sp_pair *sp = t->in;
        t->in = sp->next;
        pair_free(sp, 1);
    }
    pthread_mutex_destroy(&t->mu);
    close(t->efd);
    free(t);
    tp->splice = NULL;
}
