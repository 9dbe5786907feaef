/*
 * Communicators made of another's ranks: weft_comm_shrink, where the
 * ranks still alive agree on who they are and connect anew, and
 * weft_comm_split, where a healthy communicator's ranks form groups.
 *
 * The shrink's agreement runs over plain sockets at the ports the old
 * communicator listened on (a failed communicator has stopped listening:
 * tcp.h), with a leader, the lowest rank not known dead:
 * - every other rank connects to the leader and sends JOIN with the ranks
 *   it knows dead; the leader answers WELCOME at once;
 * - the leader waits until every rank has joined or is known dead (or
 *   the connect deadline has passed: those left are out), then sends
 *   DECIDE with the set; every member answers ACK; a member whose
 *   connection ends before its ACK is dead, and the leader decides again
 *   without it; once all answered, COMMIT.
 * A rank is known dead when its process is gone (ranks of this host:
 * their pids, exchanged as the old communicator was made), or when its
 * connection in the agreement ends before the agreement did (a rank that
 * is alive and shrinking never closes one). A member whose leader dies
 * elects the next one; ranks that joined the dead leader find the same
 * one, since they saw the same end. A rank whose host has no cable to
 * the leader's connects through a rank of a host nearer to it, which
 * carries the connection on (M_FORWARD; below, "connections carried on
 * for others"). Every member leaves with the set of
 * the COMMIT, the same on every rank. Then the new communicator is made
 * over new connections, listening at the same ports, with a job token
 * derived from the old one and the set (so that nothing of another
 * attempt or of the old communicator is taken for its own).
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE /* accept4 */
#endif
#include "base/bytes.h"
#include "core/internal.h"
#include "transport/transport.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#define MSG_MAGIC 0x7766736bu /* "wfsk" */
#define HDR_BYTES 24
/* Between tries of a leader that does not listen yet: 1 ms for the
 * first FAST_TRIES (it is usually a moment behind, still in the call that
 * failed), then RETRY_MS. */
#define RETRY_MS 20
#define FAST_TRIES 100

enum {
    M_JOIN = 1,
    M_WELCOME,
    M_DECIDE,
    M_ACK,
    M_COMMIT,
    /* To a rank on the way: carry this connection on to the rank in the
     * set. From the rank that reached it, to the one that asked, its
     * sender the rank asked for: */
    M_FORWARD,
    M_REACHED, /* connected to it */
    M_REFUSED, /* its host answered, nobody listens at its port */
    M_CLOSED,  /* its end of the connection ended */
    M_LAST = M_CLOSED
};

/* A connection this rank carries on towards another rank for a rank
 * whose host has no cable to it. */
enum { P_ASKED, P_DIAL, P_PIPE };
typedef struct {
    int in, out; /* from the rank that asked; to the next hop (-1: none) */
    int target;  /* the rank it reaches */
    int direct;  /* out is the target's own connection */
    int state;   /* P_ASKED: reading the request; P_DIAL; P_PIPE */
    size_t held; /* P_DIAL: bytes for out once connected (the request to
                    carry it on, where out is not the target's, then what
                    came from in) */
    uint8_t buf[2 * (HDR_BYTES + 1024)];
} fwd;

/* The agreement's state on one rank. */
typedef struct {
    weft_comm *c;
    int n, me;
    size_t bm_bytes;   /* bytes of a set of ranks */
    size_t msg_bytes;  /* of every message */
    uint64_t key;      /* proves a message is of this job */
    uint8_t *dead;     /* ranks known dead (one byte per rank) */
    uint8_t *nogo;     /* ranks on the way that refused to carry this one */
    int *probe;        /* a probe of each rank's port in flight, or -1 */
    uint64_t *probe_t; /* ... since */
    uint64_t probe_next;
    int probing;         /* looks in flight */
    const uint8_t *skip; /* a forwarder's: ranks the connection went by */
    uint8_t *req;        /* a request's set */
    uint64_t deadline;   /* ranks not heard from by then are out */
    int lfd;             /* listening at this rank's port */
    fwd *fw;             /* connections carried on for others */
    int nfw, cap, polled;
    unsigned turn;     /* rotates the ranks a connection goes through */
    int serve;         /* takes requests at its port while following */
    int *dist;         /* hops from each host to the leader's */
    struct pollfd *pf; /* wait_io's */
    char *errmsg;
    size_t errlen;
} agree;

/* ---- processes of this host ---- */

/* 1 where rank r of c runs on this host and its process is gone (or a
 * zombie: killed, not yet reaped by its parent). */
static int pid_gone(const weft_comm *c, int r)
{
    char path[64], buf[256];
    const char *p;
    FILE *f;
    size_t len;
    pid_t pid = c->pids[r];

    if (pid <= 0 || c->cfg.rank_host[r] != c->cfg.rank_host[c->x.rank])
        return 0;
    if (kill(pid, 0) != 0 && errno == ESRCH)
        return 1;
    snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
    if ((f = fopen(path, "r")) == NULL)
        return 0;
    len = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[len] = '\0';
    /* "pid (comm) S ...": the state follows the last ')'. */
    p = strrchr(buf, ')');
    return p != NULL && (p[2] == 'Z' || p[2] == 'X');
}

static int dial_rank(agree *a, int q, unsigned turn);

#define PROBE_MS 20
#define PROBE_GIVE_UP_MS 1000

/* Ranks of other hosts, reached by cable, whose port refuses a
 * connection: gone, or finalized (a rank's port answers from weft_init
 * to weft_finalize, through a failure and this agreement: transport.h,
 * weft__port_keep). Each is looked at every PROBE_MS; a look that
 * neither connects nor is refused within PROBE_GIVE_UP_MS (a host that
 * is gone, a cable that is down) says nothing: such ranks are out at
 * the deadline, as before. */
static void probe_ports(agree *a)
{
    const weft__config *cfg = &a->c->cfg;
    const uint64_t now = weft__now_ms();

    for (int r = 0; r < a->n; r++) {
        struct pollfd pf = {.fd = a->probe[r], .events = POLLOUT};
        int err = 0;
        socklen_t len = sizeof err;

        if (pf.fd < 0)
            continue;
        if (poll(&pf, 1, 0) == 1) {
            if (getsockopt(pf.fd, SOL_SOCKET, SO_ERROR, &err, &len) == 0 &&
                err == ECONNREFUSED && !a->dead[r]) {
                a->dead[r] = 1;
                weft__log(WEFT__LOG_INFO, a->me,
                          "weft_comm_shrink: rank %d's port refuses "
                          "connections: it is gone",
                          r);
            } else if (err == 0) {
                uint8_t m[4];
                weft__put_be32(m, WEFT__PROBE_MAGIC);
                (void)!send(pf.fd, m, sizeof m, MSG_NOSIGNAL | MSG_DONTWAIT);
            }
        } else if (now - a->probe_t[r] < PROBE_GIVE_UP_MS)
            continue;
        close(pf.fd);
        a->probe[r] = -1;
    }
    if (now >= a->probe_next) {
        a->probe_next = now + PROBE_MS;
        for (int r = 0; r < a->n; r++)
            if (r != a->me && !a->dead[r] && a->probe[r] < 0 &&
                cfg->rank_host[r] != cfg->rank_host[a->me] &&
                (a->probe[r] = dial_rank(a, r, 0)) >= 0)
                a->probe_t[r] = now;
    }
    a->probing = 0;
    for (int r = 0; r < a->n; r++)
        a->probing += a->probe[r] >= 0;
}

static void check_pids(agree *a)
{
    for (int r = 0; r < a->n; r++)
        if (r != a->me && !a->dead[r] && pid_gone(a->c, r))
            a->dead[r] = 1;
    probe_ports(a);
}

/* ---- messages ---- */

static void msg_pack(const agree *a, int type, int from, const uint8_t *set,
                     uint8_t *m)
{
    memset(m, 0, a->msg_bytes);
    weft__put_be32(m, MSG_MAGIC);
    weft__put_be32(m + 4, (uint32_t)type);
    weft__put_be32(m + 8, (uint32_t)from);
    weft__put_be32(m + 12, (uint32_t)a->n);
    weft__put_be64(m + 16, a->key);
    for (int r = 0; set != NULL && r < a->n; r++)
        if (set[r])
            m[HDR_BYTES + r / 8] |= (uint8_t)(1u << (r % 8));
}

/* The message's type, its sender in *from and its set in set (n bytes),
 * or 0 for one that is not of this agreement. */
static int msg_parse(const agree *a, const uint8_t *m, int *from, uint8_t *set)
{
    int type = (int)weft__get_be32(m + 4);

    if (weft__get_be32(m) != MSG_MAGIC ||
        weft__get_be32(m + 12) != (uint32_t)a->n ||
        weft__get_be64(m + 16) != a->key || type < M_JOIN || type > M_LAST)
        return 0;
    *from = (int)weft__get_be32(m + 8);
    if (*from < 0 || *from >= a->n || *from == a->me)
        return 0;
    for (int r = 0; set != NULL && r < a->n; r++)
        set[r] = (m[HDR_BYTES + r / 8] >> (r % 8)) & 1;
    return type;
}

/* Sends a whole message on a connection (small: the socket's buffer
 * takes it at once, or the peer is not reading, which is its failure),
 * as from rank from. */
static int msg_send_as(const agree *a, int fd, int type, int from,
                       const uint8_t *set)
{
    uint8_t m[HDR_BYTES + 1024];
    ssize_t k;

    msg_pack(a, type, from, set, m);
    k = send(fd, m, a->msg_bytes, MSG_NOSIGNAL | MSG_DONTWAIT);
    return k == (ssize_t)a->msg_bytes ? 0 : -1;
}

static int msg_send(const agree *a, int fd, int type, const uint8_t *set)
{
    return msg_send_as(a, fd, type, a->me, set);
}

/* A forwarder's word about rank r to the rank that asked. */
static void msg_status(const agree *a, int fd, int type, int r)
{
    (void)msg_send_as(a, fd, type, r, NULL);
}

/* Asks the rank at fd to carry the connection on to rank r: the message
 * names r as its sender, and its set holds the ranks the connection went
 * by (this one), which the next hops never take again (no loops where
 * ranks see different ways). */
static int msg_forward(const agree *a, int fd, int r)
{
    uint8_t one[8192];

    memset(one, 0, (size_t)a->n);
    one[a->me] = 1;
    return msg_send_as(a, fd, M_FORWARD, r, one);
}

/* A connection being read: bytes of the message that is arriving. */
typedef struct {
    int fd;
    int rank; /* once it said who it is, else -1 */
    size_t got;
    uint8_t buf[HDR_BYTES + 1024];
} link_in;

/* Reads what arrived: 1 with a whole message in l->buf (then l->got is
 * reset), 0 for not yet, -1 where the connection ended or failed. */
static int link_read(const agree *a, link_in *l)
{
    ssize_t k =
        recv(l->fd, l->buf + l->got, a->msg_bytes - l->got, MSG_DONTWAIT);

    if (k == 0)
        return -1;
    if (k < 0)
        return errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR ? 0
                                                                         : -1;
    l->got += (size_t)k;
    if (l->got < a->msg_bytes)
        return 0;
    l->got = 0;
    return 1;
}

/* How long a wait may sleep before it looks at the processes of this host
 * again (check_pids): a rank that dies as the others start to agree is
 * seen within this. */
#define PIDS_EVERY_MS 5

static int poll_ms(const agree *a, uint64_t until)
{
    uint64_t now = weft__now_ms();
    /* A look at a port in flight is answered within a round trip. */
    uint64_t cap = a->probing > 0 ? 1 : PIDS_EVERY_MS;

    if (now >= until)
        return 0;
    return until - now > cap ? (int)cap : (int)(until - now);
}

/* ---- addresses ---- */

/* The addresses at which rank q listens, as seen from this rank: its
 * host's own where it shares this one, else the ends at q's host of the
 * cables between the two hosts (none: no cable joins them). */
static int rank_addrs(const weft__config *cfg, int me, int q, char out[][64],
                      int max)
{
    int hq = cfg->rank_host[q], hm = cfg->rank_host[me], n = 0;

    if (hq == hm) {
        snprintf(out[0], 64, "%s",
                 cfg->hosts[hq].local_addr[0] ? cfg->hosts[hq].local_addr
                                              : "127.0.0.1");
        return 1;
    }
    for (int l = 0; l < cfg->nlinks && n < max; l++)
        if (weft__cable_joins(&cfg->links[l], hq, hm))
            snprintf(out[n++], 64, "%s", weft__link_addr(&cfg->links[l], hq));
    return n;
}

/* Starts connecting to addr:port: the socket, or -1. */
static int dial(const char *addr, int port)
{
    struct sockaddr_in sa;
    int fd, one = 1;

    memset(&sa, 0, sizeof sa);
    sa.sin_family = AF_INET;
    sa.sin_port = htons((uint16_t)port);
    if (inet_pton(AF_INET, addr, &sa.sin_addr) != 1)
        return -1;
    fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0)
        return -1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    if (connect(fd, (struct sockaddr *)&sa, sizeof sa) != 0 &&
        errno != EINPROGRESS) {
        close(fd);
        return -1;
    }
    return fd;
}

/* Binds and listens at port (0: one the system picks) on the address the
 * TCP transport listens on for cfg's job; the socket or -1 (errno). */
static int listen_at(const weft__config *cfg, int port)
{
    struct sockaddr_in sa;
    int fd, one = 1;

    memset(&sa, 0, sizeof sa);
    sa.sin_family = AF_INET;
    sa.sin_port = htons((uint16_t)port);
    sa.sin_addr.s_addr = htonl(cfg->nhosts == 1 ? INADDR_LOOPBACK : INADDR_ANY);
    fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0)
        return -1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (bind(fd, (struct sockaddr *)&sa, sizeof sa) != 0 ||
        listen(fd, 128) != 0) {
        int e = errno;
        close(fd);
        errno = e;
        return -1;
    }
    return fd;
}

/* ---- routes: through the ranks of the hosts between ---- */

static int hosts_linked(const weft__config *cfg, int x, int y)
{
    for (int l = 0; l < cfg->nlinks; l++)
        if (weft__cable_joins(&cfg->links[l], x, y))
            return 1;
    return 0;
}

/* Whether some rank of host h is not known dead and did not refuse to
 * carry this rank's connection on. */
static int host_alive(const agree *a, int h)
{
    const weft__config *cfg = &a->c->cfg;

    for (int r = 0; r < a->n; r++)
        if (cfg->rank_host[r] == h && !a->dead[r] && !a->nogo[r] &&
            (a->skip == NULL || !a->skip[r]))
            return 1;
    return 0;
}

/* a->dist: each host's hops by cable from host hl (INT_MAX: none),
 * through hosts with a rank that may carry connections on (one whose
 * ranks all died or refused carries nothing: the way round the other
 * side of a ring is then the way). */
static void hops_to(agree *a, int hl)
{
    const weft__config *cfg = &a->c->cfg;
    int changed = 1;

    for (int h = 0; h < cfg->nhosts; h++)
        a->dist[h] = h == hl ? 0 : INT_MAX;
    while (changed) {
        changed = 0;
        for (int l = 0; l < cfg->nlinks; l++)
            for (int e = 0; e < 2 && cfg->links[l].nvia == 0; e++) {
                int x = cfg->links[l].end[e].host;
                int y = cfg->links[l].end[1 - e].host;

                if (a->dist[x] != INT_MAX && a->dist[x] + 1 < a->dist[y] &&
                    host_alive(a, y)) {
                    a->dist[y] = a->dist[x] + 1;
                    changed = 1;
                }
            }
    }
}

/* The next hop from this rank towards rank L: L itself where this rank's
 * host is L's or has a cable to it (*direct = 1); else, turning with
 * turn, one of the ranks not known dead on the hosts that have a cable to
 * this one and are nearer to L's; -1 where there is none. */
static int next_hop(agree *a, int L, unsigned turn, int *direct)
{
    const weft__config *cfg = &a->c->cfg;
    const int hm = cfg->rank_host[a->me], hl = cfg->rank_host[L];
    int m = 0;

    *direct = 1;
    if (hm == hl || hosts_linked(cfg, hm, hl))
        return L;
    *direct = 0;
    hops_to(a, hl);
    if (a->dist[hm] == INT_MAX)
        return -1;
    for (int pass = 0; pass < 2; pass++) {
        int k = 0;

        for (int r = 0; r < a->n; r++) {
            int h = cfg->rank_host[r];

            if (r == a->me || a->dead[r] || a->nogo[r] ||
                (a->skip != NULL && a->skip[r]) || a->dist[h] >= a->dist[hm] ||
                !hosts_linked(cfg, hm, h))
                continue;
            if (pass == 1 && k == (int)(turn % (unsigned)m))
                return r;
            k++;
        }
        if ((m = k) == 0)
            return -1;
    }
    return -1;
}

/* Whether some host joined to this one by a cable has none to rank L's:
 * then its ranks may ask this one to carry their connections on (the
 * nearer way round may have lost its hosts, which this rank may not
 * know), and this rank takes connections at its port while it follows
 * L. Elsewhere it takes none: the new communicator's connections, from
 * ranks that left the agreement first, wait for it. */
static int may_forward(agree *a, int L)
{
    const weft__config *cfg = &a->c->cfg;
    const int hm = cfg->rank_host[a->me], hl = cfg->rank_host[L];

    for (int h = 0; h < cfg->nhosts; h++)
        if (h != hm && h != hl && !hosts_linked(cfg, h, hl) &&
            hosts_linked(cfg, hm, h))
            return 1;
    return 0;
}

/* Starts connecting to rank q, by the turn-th of the addresses that reach
 * it from this rank's host: the socket, or -1. */
static int dial_rank(agree *a, int q, unsigned turn)
{
    char addrs[8][64];
    int naddr = rank_addrs(&a->c->cfg, a->me, q, addrs, 8);

    if (naddr == 0)
        return -1;
    return dial(addrs[turn % (unsigned)naddr],
                weft__config_rank_port(&a->c->cfg, q));
}

/* ---- connections carried on for others ----
 * A rank whose host has no cable to the leader's sends its connection
 * through a rank on a host nearer to it (M_FORWARD, then its messages as
 * ever), and so on, hop by hop. The rank whose host reaches the leader
 * says what became of the leader's connection, as its sender: M_REACHED,
 * M_REFUSED (the leader's host answered, nobody listens: as a refused
 * connection), M_CLOSED (the leader's end ended: as the leader closing
 * it). A connection that ends without a word is a rank on the way lost:
 * the asking rank tries again by another, and never takes it for the
 * leader's death. The leader sees each connection as the asking rank's
 * own; its end is the asking rank's end. The request names the ranks the
 * connection went by, which no hop takes again: ranks that see different
 * ways (a host whose ranks refused one of them and not another) never
 * pass a connection round in a loop; one with no way on ends it, and the
 * asking rank tries another way. */

static void fwd_end(fwd *p)
{
    if (p->in >= 0)
        close(p->in);
    if (p->out >= 0)
        close(p->out);
    p->in = p->out = -1;
}

/* A connection whose first message is still to come. */
static fwd *fwd_take(agree *a, int fd)
{
    if (a->nfw == a->cap) {
        close(fd);
        return NULL;
    }
    a->fw[a->nfw] = (fwd){.in = fd, .out = -1, .state = P_ASKED};
    return &a->fw[a->nfw++];
}

/* The first message m of p->in: a request to carry it on to a rank
 * starts the next hop; anything else ends it (a JOIN to a rank that does
 * not lead). */
static void fwd_asked(agree *a, fwd *p, const uint8_t *m)
{
    int r = -1, hop;

    /* The target is the message's sender (msg_forward); its set, the
     * ranks the connection went by. */
    if (msg_parse(a, m, &r, a->req) != M_FORWARD || a->req[a->me])
        goto end;
    p->target = r;
    p->held = 0;
    p->state = P_DIAL;
    a->skip = a->req;
    hop = next_hop(a, r, a->turn, &p->direct);
    a->skip = NULL;
    if (hop >= 0)
        p->out = dial_rank(a, hop, a->turn);
    a->turn++;
    if (p->out < 0)
        goto end;
    if (!p->direct) {
        /* The request goes on first, with this rank among those passed. */
        a->req[a->me] = 1;
        msg_pack(a, M_FORWARD, r, a->req, p->buf);
        p->held = a->msg_bytes;
    }
    return;
end:
    fwd_end(p);
}

static int again(void)
{
    return errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR;
}

/* Moves what arrived on from on to to: 0, or -1 where from ended or to
 * did not take it all. */
static int fwd_move(int from, int to)
{
    uint8_t b[4096];

    for (;;) {
        ssize_t k = recv(from, b, sizeof b, MSG_DONTWAIT);

        if (k == 0 || (k < 0 && !again()))
            return -1;
        if (k < 0)
            return 0;
        if (send(to, b, (size_t)k, MSG_NOSIGNAL | MSG_DONTWAIT) != k)
            return -1;
    }
}

/* What rin (on p->in) and rout (on p->out) said. */
static void fwd_serve(agree *a, fwd *p, short rin, short rout)
{
    ssize_t k;

    switch (p->state) {
    case P_ASKED:
        k = recv(p->in, p->buf + p->held, a->msg_bytes - p->held, MSG_DONTWAIT);
        if (k == 0 || (k < 0 && !again()))
            fwd_end(p);
        else if (k > 0 && (p->held += (size_t)k) >= 4 &&
                 weft__get_be32(p->buf) != MSG_MAGIC)
            fwd_end(p); /* not the agreement's (a new communicator's) */
        else if (k > 0 && p->held == a->msg_bytes)
            fwd_asked(a, p, p->buf);
        return;
    case P_DIAL:
        if (rin) {
            k = recv(p->in, p->buf + p->held, sizeof p->buf - p->held,
                     MSG_DONTWAIT);
            if (k == 0 || (k < 0 && !again()) ||
                (k > 0 && (p->held += (size_t)k) == sizeof p->buf)) {
                fwd_end(p);
                return;
            }
        }
        if (rout) {
            int err = 0;
            socklen_t elen = sizeof err;

            if (getsockopt(p->out, SOL_SOCKET, SO_ERROR, &err, &elen) != 0 ||
                err != 0) {
                if (p->direct && err == ECONNREFUSED)
                    msg_status(a, p->in, M_REFUSED, p->target);
                fwd_end(p);
                return;
            }
            if (p->direct)
                msg_status(a, p->in, M_REACHED, p->target);
            if (p->held > 0 &&
                send(p->out, p->buf, p->held, MSG_NOSIGNAL | MSG_DONTWAIT) !=
                    (ssize_t)p->held) {
                fwd_end(p);
                return;
            }
            p->held = 0;
            p->state = P_PIPE;
        }
        return;
    default:
        if (rin && fwd_move(p->in, p->out) != 0) {
            fwd_end(p);
            return;
        }
        if (rout && fwd_move(p->out, p->in) != 0) {
            if (p->direct)
                msg_status(a, p->in, M_CLOSED, p->target);
            fwd_end(p);
        }
    }
}

/* Fills pf with what the forwarded connections wait for (pf[0]: the
 * port, where accept): the count. */
static int pump_fds(agree *a, struct pollfd *pf, int accept)
{
    int np = 0;

    for (int i = 0; i < a->nfw;)
        if (a->fw[i].in < 0)
            a->fw[i] = a->fw[--a->nfw];
        else
            i++;
    pf[np++] = (struct pollfd){.fd = accept ? a->lfd : -1, .events = POLLIN};
    for (int i = 0; i < a->nfw; i++) {
        const fwd *p = &a->fw[i];

        pf[np++] = (struct pollfd){.fd = p->in, .events = POLLIN};
        pf[np++] = (struct pollfd){
            .fd = p->state == P_ASKED ? -1 : p->out,
            .events = (short)(p->state == P_DIAL ? POLLOUT : POLLIN)};
    }
    a->polled = a->nfw;
    return np;
}

static void pump_serve(agree *a, const struct pollfd *pf)
{
    for (int i = 0; i < a->polled; i++) {
        short rin = pf[1 + 2 * i].revents, rout = pf[2 + 2 * i].revents;

        if (a->fw[i].in >= 0 && (rin || rout))
            fwd_serve(a, &a->fw[i], rin, rout);
    }
    if (pf[0].fd >= 0 && (pf[0].revents & POLLIN)) {
        int fd = accept4(a->lfd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);

        if (fd >= 0)
            fwd_take(a, fd);
    }
}

/* Waits until fd (-1: none) is ready for events, or until, carrying on
 * meanwhile the connections this rank forwards (and, with accept, taking
 * new ones at its port): fd's revents, or 0. */
static short wait_io(agree *a, int fd, short events, uint64_t until, int accept)
{
    struct pollfd *pf = a->pf;
    int np;

    pf[0] = (struct pollfd){.fd = fd, .events = events};
    np = 1 + pump_fds(a, pf + 1, accept);
    if (poll(pf, (nfds_t)np, poll_ms(a, until)) <= 0)
        return 0;
    pump_serve(a, pf + 1);
    return pf[0].revents;
}

/* Once this rank's agreement ended: carries on the connections it
 * forwards until their ranks have their answer (the leader closed its
 * ends after its COMMIT), or until; no new ones. */
static void drain(agree *a, uint64_t until)
{
    for (int i = 0; i < a->nfw; i++)
        if (a->fw[i].state != P_PIPE)
            fwd_end(&a->fw[i]);
    for (;;) {
        int live = 0;

        for (int i = 0; i < a->nfw; i++)
            live |= a->fw[i].in >= 0;
        if (!live || weft__now_ms() >= until)
            break;
        (void)wait_io(a, -1, 0, until, 0);
    }
    for (int i = 0; i < a->nfw; i++)
        fwd_end(&a->fw[i]);
    a->nfw = 0;
}

/* ---- the leader ---- */

/* The leader's part: *set (n bytes) gets the members. WEFT_OK or
 * WEFT_ENOMEM. */
static int lead(agree *a, uint8_t *set)
{
    const int n = a->n;
    link_in *in = calloc((size_t)(2 * n + 1), sizeof *in);
    uint8_t *joined = calloc((size_t)n, 1), *got = malloc((size_t)n);
    struct pollfd *pf = calloc((size_t)(2 * n + 4 + 2 * a->cap), sizeof *pf);
    int nin = 0, rc = WEFT_ENOMEM;

    if (in == NULL || joined == NULL || got == NULL || pf == NULL)
        goto out;
    for (;;) {
        int complete = 1, np = 0, base;

        check_pids(a);
        for (int r = 0; r < n; r++)
            if (r != a->me && !joined[r] && !a->dead[r])
                complete = 0;
        if (complete || weft__now_ms() >= a->deadline)
            break;
        pf[np++] = (struct pollfd){.fd = a->lfd, .events = POLLIN};
        for (int i = 0; i < nin; i++)
            pf[np++] = (struct pollfd){.fd = in[i].fd, .events = POLLIN};
        base = np;
        np += pump_fds(a, pf + base, 0);
        if (poll(pf, (nfds_t)np, poll_ms(a, a->deadline)) <= 0)
            continue;
        pump_serve(a, pf + base);
        for (int i = 0; i < base - 1; i++) {
            int k, from = -1, type;

            if (in[i].fd < 0 || pf[1 + i].revents == 0)
                continue;
            while ((k = link_read(a, &in[i])) == 1) {
                type = msg_parse(a, in[i].buf, &from, got);
                if (type == M_FORWARD && in[i].rank < 0) {
                    /* A rank on the way, asked to reach another. */
                    fwd *p = fwd_take(a, in[i].fd);

                    if (p != NULL)
                        fwd_asked(a, p, in[i].buf);
                    in[i].fd = -1;
                    break;
                }
                if (type != M_JOIN || (in[i].rank >= 0 && in[i].rank != from)) {
                    k = -1;
                    break;
                }
                if (in[i].rank < 0) {
                    /* A rank that joins again (it lost an earlier
                     * connection) replaces its old one. */
                    for (int j = 0; j < nin; j++)
                        if (j != i && in[j].rank == from && in[j].fd >= 0) {
                            close(in[j].fd);
                            in[j].fd = -1;
                            in[j].rank = -1;
                        }
                    in[i].rank = from;
                    joined[from] = 1;
                    a->dead[from] = 0;
                    if (msg_send(a, in[i].fd, M_WELCOME, NULL) != 0) {
                        k = -1;
                        break;
                    }
                }
                /* What it knows dead; never a rank that is with us. */
                for (int r = 0; r < n; r++)
                    if (got[r] && r != a->me && !joined[r])
                        a->dead[r] = 1;
            }
            if (k < 0 && in[i].fd >= 0) {
                if (in[i].rank >= 0) {
                    joined[in[i].rank] = 0;
                    a->dead[in[i].rank] = 1;
                }
                close(in[i].fd);
                in[i].fd = -1;
            }
        }
        if ((pf[0].revents & POLLIN) && nin < 2 * n) {
            int fd = accept4(a->lfd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
            if (fd >= 0)
                in[nin++] = (link_in){.fd = fd, .rank = -1};
        }
        /* Drop closed entries. */
        for (int i = 0; i < nin;)
            if (in[i].fd < 0)
                in[i] = in[--nin];
            else
                i++;
    }
    /* Those not heard from are out. Decide, until every member agreed. */
    for (;;) {
        int answered = 0, members = 0, lost = 0;
        uint64_t until = a->deadline + (uint64_t)a->c->cfg.connect_timeout_ms;

        for (int r = 0; r < n; r++)
            set[r] = r == a->me || joined[r];
        for (int i = 0; i < nin; i++) {
            if (in[i].rank < 0 || !joined[in[i].rank])
                continue;
            members++;
            if (msg_send(a, in[i].fd, M_DECIDE, set) != 0) {
                joined[in[i].rank] = 0;
                lost = 1;
            }
        }
        if (lost)
            continue;
        for (int i = 0; i < nin; i++)
            pf[i] = (struct pollfd){
                .fd = in[i].rank >= 0 && joined[in[i].rank] ? in[i].fd : -1,
                .events = POLLIN};
        while (answered < members && !lost && weft__now_ms() < until) {
            int np = nin + pump_fds(a, pf + nin, 0);

            if (poll(pf, (nfds_t)np, poll_ms(a, until)) <= 0)
                continue;
            pump_serve(a, pf + nin);
            for (int i = 0; i < nin; i++) {
                int k, from = -1;

                if (pf[i].fd < 0 || pf[i].revents == 0)
                    continue;
                while ((k = link_read(a, &in[i])) == 1) {
                    int type = msg_parse(a, in[i].buf, &from, NULL);
                    if (type == M_ACK) {
                        answered++;
                        pf[i].fd = -1;
                        break;
                    }
                    /* A late JOIN of what it knew dead: no longer asked. */
                    if (type != M_JOIN) {
                        k = -1;
                        break;
                    }
                }
                if (k < 0) {
                    joined[in[i].rank] = 0;
                    a->dead[in[i].rank] = 1;
                    lost = 1;
                }
            }
        }
        if (!lost && answered < members)
            /* Silent members past the deadline: out, and decide again. */
            for (int i = 0; i < nin; i++)
                if (pf[i].fd >= 0 && in[i].rank >= 0) {
                    joined[in[i].rank] = 0;
                    lost = 1;
                }
        if (lost)
            continue;
        break;
    }
    /* Every rank still connected learns the set: one left out (it did not
     * answer in time, a stopped process) reads, once it runs again, that
     * it is out, instead of forming a group of its own. */
    for (int i = 0; i < nin; i++)
        if (in[i].rank >= 0)
            msg_send(a, in[i].fd, M_COMMIT, set);
    rc = WEFT_OK;
out:
    for (int i = 0; in != NULL && i < nin; i++)
        close(in[i].fd);
    free(in);
    free(joined);
    free(got);
    free(pf);
    return rc;
}

/* ---- a member ---- */

enum {
    FOLLOW_DONE = 0,
    FOLLOW_LEADER_DEAD = 1,
    FOLLOW_TIMEOUT = 2,
    FOLLOW_OUT = 3,        /* the others went on without this rank */
    FOLLOW_UNREACHABLE = 4 /* no route from this rank to the leader */
};

/* A member's part with leader L: FOLLOW_DONE with *set, or the leader
 * found dead, or the deadline. Its connection goes to L where this rank's
 * host has a cable to L's, else through a rank on the way. */
static int follow(agree *a, int L, uint8_t *set)
{
    const uint64_t hard =
        a->deadline + 2 * (uint64_t)a->c->cfg.connect_timeout_ms;
    uint8_t *known = malloc((size_t)a->n);
    int attempt = 0, result = FOLLOW_TIMEOUT;
    /* What the tries showed of L by the deadline: its port taken by a
     * process that closed the connection before the agreement answered
     * (L alive, in its old communicator or already in a new one), a
     * connection made at all, a route. */
    int alive_seen = 0, connected = 0, routed = 0;

    if (known == NULL)
        return FOLLOW_TIMEOUT;
    a->serve = may_forward(a, L);
    while (weft__now_ms() < a->deadline) {
        link_in l = {.fd = -1, .rank = L};
        int welcomed = 0, decided = 0, reached = 0, k, from = -1, type, err = 0;
        int direct = 1, hop;
        socklen_t elen = sizeof err;
        short ev = 0;

        check_pids(a);
        if (a->dead[L]) {
            result = FOLLOW_LEADER_DEAD;
            break;
        }
        if (attempt++ > 0)
            (void)wait_io(a, -1, 0,
                          weft__now_ms() +
                              (attempt <= FAST_TRIES ? 1u : RETRY_MS),
                          a->serve);
        /* The first try goes by the lowest rank on the way, the next
         * ones turn through the others. */
        hop = next_hop(a, L, (unsigned)attempt - 1u, &direct);
        if (hop < 0 && memchr(a->nogo, 1, (size_t)a->n) != NULL) {
            /* Every way refused: they may not have been listening yet. */
            memset(a->nogo, 0, (size_t)a->n);
            hop = next_hop(a, L, (unsigned)attempt - 1u, &direct);
        }
        if (hop < 0 || (l.fd = dial_rank(a, hop, (unsigned)attempt - 1u)) < 0)
            continue;
        while (ev == 0 && weft__now_ms() < a->deadline)
            ev = wait_io(a, l.fd, POLLOUT, a->deadline, a->serve);
        if (!(ev & POLLOUT) ||
            getsockopt(l.fd, SOL_SOCKET, SO_ERROR, &err, &elen) != 0 ||
            err != 0 || (!direct && msg_forward(a, l.fd, L) != 0) ||
            msg_send(a, l.fd, M_JOIN, a->dead) != 0) {
            /* Refused: L's host answers, nobody listens at its port,
             * which a live rank holds from weft_init to weft_finalize
             * (weft__port_keep): L is gone. A rank on the way that
             * refuses says nothing of L. */
            if (direct && (ev & POLLOUT) && err == ECONNREFUSED) {
                routed = 1, alive_seen = 0;
                a->dead[L] = 1;
            } else if (!direct && (ev & POLLOUT) && err == ECONNREFUSED)
                a->nogo[hop] = 1;
            close(l.fd);
            continue;
        }
        if (direct)
            connected = routed = 1;
        else
            weft__log(WEFT__LOG_INFO, a->me,
                      "weft_comm_shrink: to rank %d, which leads, through "
                      "rank %d",
                      L, hop);
        memcpy(known, a->dead, (size_t)a->n);
        /* Wait for the leader; tell it of deaths seen meanwhile. */
        for (;;) {
            uint64_t until = welcomed ? hard : a->deadline;

            if (weft__now_ms() >= until) {
                k = -2;
                break;
            }
            if (wait_io(a, l.fd, POLLIN, until, a->serve) == 0) {
                check_pids(a);
                if (a->dead[L]) {
                    k = -3;
                    break;
                }
                if (memcmp(known, a->dead, (size_t)a->n) != 0 && !decided) {
                    memcpy(known, a->dead, (size_t)a->n);
                    if (msg_send(a, l.fd, M_JOIN, a->dead) != 0) {
                        k = -1;
                        break;
                    }
                }
                continue;
            }
            k = link_read(a, &l);
            if (k < 0 && !direct)
                k = -6; /* a rank on the way is lost */
            if (k < 0)
                break;
            if (k == 0)
                continue;
            type = msg_parse(a, l.buf, &from, set);
            if (from != L) {
                k = -1;
                break;
            }
            if (type == M_REACHED && !direct)
                connected = routed = reached = 1;
            else if (type == M_REFUSED && !direct) {
                k = -5;
                break;
            } else if (type == M_CLOSED && !direct) {
                k = -1; /* as L's own end */
                break;
            } else if (type == M_WELCOME)
                welcomed = 1;
            else if (type == M_DECIDE) {
                /* Every member has joined: no rank asks this one to
                 * carry a connection on any more, and what arrives at
                 * its port from now on is the new communicator's, which
                 * must wait for it (the leader commits only once this
                 * rank answered). */
                a->serve = 0;
                decided = 1;
                memcpy(known, set, (size_t)a->n);
                if (msg_send(a, l.fd, M_ACK, NULL) != 0) {
                    k = -1;
                    break;
                }
            } else if (type == M_COMMIT && !set[a->me]) {
                k = -4;
                break;
            } else if (type == M_COMMIT && decided &&
                       memcmp(known, set, (size_t)a->n) == 0) {
                k = 1;
                break;
            } else {
                k = -1;
                break;
            }
        }
        close(l.fd);
        if (k == 1) {
            result = FOLLOW_DONE;
            break;
        }
        if (k == -4) {
            result = FOLLOW_OUT;
            break;
        }
        if (k == -3 || (k == -1 && welcomed)) {
            /* Gone in the middle of the agreement: it died. */
            a->dead[L] = 1;
            result = FOLLOW_LEADER_DEAD;
            break;
        }
        if (k == -2) {
            result = FOLLOW_TIMEOUT;
            break;
        }
        if (k == -5) {
            routed = 1, alive_seen = 0;
            a->dead[L] = 1; /* refused at its port, as above */
            continue;
        }
        /* A rank on the way lost, or with no way on: try again, by
         * another. */
        if (k == -6) {
            if (!reached)
                a->nogo[hop] = 1;
            continue;
        }
        /* Closed before it welcomed us: not (yet) the leader's agreement
         * at that port (its old communicator, or a new one made without
         * this rank): try again. */
        if (!welcomed)
            alive_seen = 1;
    }
    free(known);
    /* By the deadline, L never answered: a process that holds its port
     * but never took part is alive and went on without this rank (or
     * comes too late): this rank is out; no route to L at all, and this
     * rank cannot take part. Else (refused, or a connection nobody
     * answered: a stopped process) L is out. */
    if (result == FOLLOW_TIMEOUT && alive_seen)
        result = FOLLOW_OUT;
    else if (result == FOLLOW_TIMEOUT && !connected && !routed)
        result = FOLLOW_UNREACHABLE;
    return result;
}

/* ---- the whole agreement ---- */

/* Agrees with the ranks of c alive on the set (set: n bytes). */
static int agree_run(agree *a, uint8_t *set)
{
    const uint64_t ct = (uint64_t)a->c->cfg.connect_timeout_ms;

    for (int round = 0; round <= a->n; round++) {
        int L = 0;

        while (L < a->n && a->dead[L])
            L++;
        /* A round after one that ran to the deadline (a leader that never
         * answered) gets a deadline of its own. */
        if (weft__now_ms() + RETRY_MS >= a->deadline)
            a->deadline = weft__now_ms() + ct;
        if (L == a->me)
            return lead(a, set);
        switch (follow(a, L, set)) {
        case FOLLOW_DONE:
            return WEFT_OK;
        case FOLLOW_OUT:
            snprintf(a->errmsg, a->errlen,
                     "rank %d: weft_comm_shrink: the other ranks went on "
                     "without this one (rank %d, which leads the agreement, "
                     "did not take it in by the connect deadline)",
                     a->me, L);
            return WEFT_ETIMEDOUT;
        case FOLLOW_UNREACHABLE:
            snprintf(a->errmsg, a->errlen,
                     "rank %d: weft_comm_shrink: no way from this rank's "
                     "host (%s) to rank %d's (%s), which leads the "
                     "agreement: no cable joins them, and no rank on a host "
                     "between answered by the connect deadline (the hosts "
                     "left are cut in two)",
                     a->me, a->c->cfg.hosts[a->c->cfg.rank_host[a->me]].name, L,
                     a->c->cfg.hosts[a->c->cfg.rank_host[L]].name);
            return WEFT_EPEER;
        default:
            break;
        }
        /* Dead, or not heard from by the deadline: it is out. */
        a->dead[L] = 1;
    }
    snprintf(a->errmsg, a->errlen,
             "rank %d: weft_comm_shrink: no rank led the agreement", a->me);
    return WEFT_ETIMEDOUT;
}

/* ---- making the new communicator ---- */

/* A failure of shrink or split: its text in weft_last_error(NULL) (as a
 * failed weft_init's) and, where c has not failed, weft_last_error(c). */
static int say(weft_comm *c, int rc, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static int say(weft_comm *c, int rc, const char *fmt, ...)
{
    va_list ap;

    va_start(ap, fmt);
    vsnprintf(weft__init_errmsg, sizeof weft__init_errmsg, fmt, ap);
    va_end(ap);
    weft__note(&c->x, rc, "%s", weft__init_errmsg);
    return rc;
}

/* A new communicator of c's ranks members[0..n-1] (this rank among them),
 * with ports (NULL: the old ones), listening on lfd, its token derived
 * from c's and salt. */
static int make(weft_comm *c, const int *members, int n, const int *ports,
                int lfd, uint64_t salt, const char *what, weft_comm **out)
{
    weft_comm *k = calloc(1, sizeof *k);
    int me = -1, rc;
    uint64_t h;

    for (int i = 0; i < n; i++)
        if (members[i] == c->x.rank)
            me = i;
    char why[sizeof weft__init_errmsg];

    if (k == NULL)
        return say(c, WEFT_ENOMEM, "%s: out of memory", what);
    why[0] = '\0';
    rc = weft__config_subset(&c->cfg, members, n, me, ports, &k->cfg, why,
                             sizeof why);
    if (rc != 0) {
        free(k);
        return say(c, rc, "rank %d: %s: %s", c->x.rank, what, why);
    }
    /* A token of its own: its connections prove they are of this
     * communicator, not of c or of another one made from c. */
    h = weft__fnv1a(WEFT__FNV_BASIS ^ salt, members,
                    sizeof *members * (size_t)n);
    for (int i = 0; i < WEFT__TOKEN_BYTES; i++) {
        h = weft__fnv1a(h, &i, sizeof i);
        k->cfg.token[i] ^= (uint8_t)(h >> 24);
    }
    k->derived = 1;
    if ((rc = weft__comm_ctx_init(k, c->x.timeout_ms)) == 0) {
        for (int i = 0; i < n; i++)
            k->origin[i] = c->origin[members[i]];
        rc = weft__comm_start(k, n > 1 ? lfd : -1,
                              weft__now_ms() +
                                  (uint64_t)k->cfg.connect_timeout_ms);
    }
    if (rc != 0) {
        snprintf(why, sizeof why, "%s",
                 weft__init_errmsg[0] ? weft__init_errmsg : weft_strerror(rc));
        say(c, rc, "rank %d: %s: the new communicator of %d ranks: %s",
            c->x.rank, what, n, why);
        weft__comm_discard(k);
        return rc;
    }
    *out = k;
    return WEFT_OK;
}

/* Ends every operation of c and closes its wires: c is failed from now
 * on (as weft_comm_shrink leaves it), its port free. */
static void retire(weft_comm *c)
{
    if (c->x.fail.code == 0)
        weft__set_error(&c->x, WEFT_EABORTED,
                        "rank %d: the communicator was shrunk "
                        "(weft_comm_shrink); use the new one",
                        c->x.rank);
    atomic_store(&c->x.aborted, 1);
    /* Stops the progress thread and ends what is pending, then gives c
     * requests again, which fail at once as c has failed. */
    weft__sched_fini(c);
    weft__sched_init(c);
    if (c->x.tp != NULL)
        c->x.tpo->shutdown(c->x.tp);
}

int weft_comm_shrink(weft_comm *c, weft_comm **out)
{
    agree a;
    uint8_t *set = NULL;
    int *members = NULL, n = 0, rc;
    uint64_t salt;

    if (c == NULL || out == NULL)
        return c == NULL ? WEFT_EINVAL
                         : weft__note(&c->x, WEFT_EINVAL,
                                      "weft_comm_shrink: out is NULL");
    *out = NULL;
    memset(&a, 0, sizeof a);
    a.c = c;
    a.n = c->x.nranks;
    a.me = c->x.rank;
    a.bm_bytes = ((size_t)a.n + 7) / 8;
    a.msg_bytes = HDR_BYTES + a.bm_bytes;
    a.errmsg = weft__init_errmsg;
    a.errlen = sizeof weft__init_errmsg;
    a.lfd = -1;
    if (a.bm_bytes > 1024)
        return say(c, WEFT_ENOTSUP, "weft_comm_shrink: more than 8192 ranks");
    retire(c);
    a.key = weft__fnv1a(
        weft__fnv1a(WEFT__FNV_BASIS, c->cfg.token, WEFT__TOKEN_BYTES), "shrink",
        6);
    a.deadline = weft__now_ms() + (uint64_t)c->cfg.connect_timeout_ms;
    a.dead = calloc((size_t)a.n, 1);
    a.nogo = calloc((size_t)a.n, 1);
    a.probe = malloc(sizeof *a.probe * (size_t)a.n);
    a.probe_t = calloc((size_t)a.n, sizeof *a.probe_t);
    for (int r = 0; a.probe != NULL && r < a.n; r++)
        a.probe[r] = -1;
    a.req = calloc((size_t)a.n, 1);
    a.cap = 2 * a.n + 8;
    a.fw = calloc((size_t)a.cap, sizeof *a.fw);
    a.pf = calloc((size_t)(2 + 2 * a.cap), sizeof *a.pf);
    a.dist = calloc((size_t)c->cfg.nhosts, sizeof *a.dist);
    set = calloc((size_t)a.n, 1);
    members = calloc((size_t)a.n, sizeof *members);
    rc = WEFT_ENOMEM;
    if (a.dead == NULL || a.nogo == NULL || a.probe == NULL ||
        a.probe_t == NULL || a.req == NULL || a.fw == NULL || a.pf == NULL ||
        a.dist == NULL || set == NULL || members == NULL)
        goto out;
    if (a.n > 1) {
        /* c's socket at its port, kept since c stopped listening, with
         * whatever waits in its backlog; else (a port that was not kept)
         * bound anew, which may take a moment. */
        int port = weft__config_rank_port(&c->cfg, a.me);

        a.lfd = weft__port_take(port, c->cfg.nhosts != 1);
        while (a.lfd < 0 && (a.lfd = listen_at(&c->cfg, port)) < 0 &&
               errno == EADDRINUSE && weft__now_ms() < a.deadline)
            usleep(RETRY_MS * 1000);
        if (a.lfd < 0) {
            rc = say(c, WEFT_ETRANSPORT,
                     "rank %d: weft_comm_shrink: cannot listen on port %d: %s",
                     a.me, port, strerror(errno));
            goto out;
        }
        rc = agree_run(&a, set);
        /* The ranks this one connects to the leader get their answer. */
        drain(&a, weft__now_ms() + (uint64_t)c->cfg.connect_timeout_ms);
        if (rc != 0)
            goto out;
    } else
        set[0] = 1;
    salt = 0x736872696e6bull; /* "shrink" */
    for (int r = 0; r < a.n; r++)
        if (set[r]) {
            members[n++] = r;
            salt = weft__fnv1a(salt, &r, sizeof r);
        }
    salt = weft__fnv1a(salt, &c->splits, sizeof c->splits);
    c->splits++;
    weft__log(WEFT__LOG_WARN, a.me, "weft_comm_shrink: %d of %d ranks go on", n,
              a.n);
    rc = make(c, members, n, NULL, a.lfd, salt, "weft_comm_shrink", out);
out:
    if (a.lfd >= 0)
        close(a.lfd);
    if (a.fw != NULL)
        drain(&a, 0);
    free(a.fw);
    free(a.pf);
    free(a.dist);
    free(a.req);
    free(a.dead);
    free(a.nogo);
    for (int r = 0; a.probe != NULL && r < a.n; r++)
        if (a.probe[r] >= 0)
            close(a.probe[r]);
    free(a.probe);
    free(a.probe_t);
    free(set);
    free(members);
    return rc;
}

/* ---- split ---- */

typedef struct {
    int key, rank;
} by_key;

static int by_key_cmp(const void *x, const void *y)
{
    const by_key *p = x, *q = y;

    if (p->key != q->key)
        return p->key < q->key ? -1 : 1;
    return p->rank < q->rank ? -1 : p->rank > q->rank;
}

int weft_comm_split(weft_comm *c, int color, int key, weft_comm **out)
{
    int32_t mine[3], *all = NULL;
    by_key *grp = NULL;
    int *members = NULL, *ports = NULL, n = 0, lfd = -1, rc;
    const int nr = c != NULL ? c->x.nranks : 0;
    uint64_t salt;

    if (c == NULL || out == NULL)
        return c == NULL ? WEFT_EINVAL
                         : weft__note(&c->x, WEFT_EINVAL,
                                      "weft_comm_split: out is NULL");
    *out = NULL;
    if (c->x.fail.code != 0 || atomic_load(&c->x.aborted))
        return WEFT_EABORTED;
    all = calloc((size_t)nr, sizeof mine);
    grp = calloc((size_t)nr, sizeof *grp);
    members = calloc((size_t)nr, sizeof *members);
    ports = calloc((size_t)nr, sizeof *ports);
    if (all == NULL || grp == NULL || members == NULL || ports == NULL) {
        rc = say(c, WEFT_ENOMEM, "weft_comm_split: out of memory");
        goto out;
    }
    mine[0] = color < 0 ? -1 : color;
    mine[1] = key;
    mine[2] = 0;
    if (color >= 0 && nr > 1) {
        if ((lfd = listen_at(&c->cfg, 0)) < 0 ||
            (mine[2] = weft__fd_port(lfd)) < 0) {
            rc = say(c, WEFT_ETRANSPORT,
                     "rank %d: weft_comm_split: cannot listen: %s", c->x.rank,
                     strerror(errno));
            /* The others must not wait for this rank: it takes part
             * without a group. */
            mine[0] = -1;
        }
    }
    /* Every rank learns every rank's color, key and port. */
    if ((rc = weft_all_gather(c, mine, all, 3, WEFT_INT32)) != 0)
        goto out;
    salt = weft__fnv1a(0x73706c6974ull, &c->splits,
                       sizeof c->splits); /* "split" */
    c->splits++;
    if (color < 0) {
        rc = WEFT_OK;
        goto out;
    }
    if (mine[0] < 0) {
        rc = WEFT_ETRANSPORT; /* noted above */
        goto out;
    }
    for (int r = 0; r < nr; r++)
        if (all[3 * r] == color)
            grp[n++] = (by_key){all[3 * r + 1], r};
    qsort(grp, (size_t)n, sizeof *grp, by_key_cmp);
    for (int i = 0; i < n; i++) {
        members[i] = grp[i].rank;
        ports[i] = all[3 * grp[i].rank + 2];
    }
    salt = weft__fnv1a(salt, &color, sizeof color);
    rc = make(c, members, n, ports, lfd, salt, "weft_comm_split", out);
out:
    if (lfd >= 0)
        close(lfd);
    free(all);
    free(grp);
    free(members);
    free(ports);
    return rc;
}

int weft_comm_origin_rank(const weft_comm *c, int rank)
{
    if (c == NULL || rank < 0 || rank >= c->x.nranks)
        return WEFT_EINVAL;
    return c->origin[rank];
}
