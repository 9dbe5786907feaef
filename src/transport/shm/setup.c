/*
 * Set-up and tear-down of the shared-memory transport (shm.h): the TCP side,
 * the doorbell socket, the exchange with each peer of this host (hellos on
 * the TCP connection, the segment handed over on the socket, whether
 * one-copy reads work each way), create(), shutdown(), destroy() and the
 * ops table.
 */
#define _GNU_SOURCE
#include "transport/shm/shm.h"

#include "base/bytes.h"

#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <unistd.h>

static uint64_t random64(void)
{
    uint64_t v = 0;

    if (getrandom(&v, sizeof v, 0) != (ssize_t)sizeof v)
        v = weft__now_ns() ^ ((uint64_t)getpid() << 32);
    return v | 1; /* never 0 */
}

static size_t seg_bytes(const shm_tp *tp)
{
    return SHM_SEG_HDR + 2 * tp->ring_bytes;
}

/* ---- the messages on the TCP connection ---- */

static void setup_done(weft__xfer *x)
{
    ((shm_wire *)x->arg)->tp->setup_pending--;
}

/* Sends w->out and receives the peer's message into w->in, len bytes
 * each, on the TCP connection to the peer. */
static int exchange_post(shm_tp *tp, shm_wire *w, size_t len)
{
    int rc;

    w->sx = (weft__xfer){
        .done = setup_done, .arg = w, .buf = (char *)w->out, .len = len};
    w->rx_x = (weft__xfer){
        .done = setup_done, .arg = w, .buf = (char *)w->in, .len = len};
    if ((rc = weft__tcp_ops.post_send(tp->tcp, w->peer, 0, &w->sx)) != 0)
        return rc;
    tp->setup_pending++;
    if ((rc = weft__tcp_ops.post_recv(tp->tcp, w->peer, 0, &w->rx_x)) != 0)
        return rc;
    tp->setup_pending++;
    return WEFT_OK;
}

static void pack_hello(shm_tp *tp, shm_wire *w, const struct sockaddr_un *me,
                       socklen_t melen)
{
    uint8_t *b = w->out;
    size_t nlen = melen - offsetof(struct sockaddr_un, sun_path);

    memset(b, 0, SHM_HELLO_BYTES);
    weft__put_be32(b, SHM_MAGIC);
    weft__put_be32(b + 4, SHM_VERSION);
    weft__put_be32(b + 8, (uint32_t)tp->rank);
    weft__put_be32(b + 12, (uint32_t)w->peer);
    weft__put_be32(b + 16, (uint32_t)getpid());
    weft__put_be64(b + 24, (uint64_t)tp->ring_bytes);
    weft__put_be64(b + 32, w->nonce_out);
    weft__put_be64(b + 40, (uint64_t)(uintptr_t)&tp->probe);
    weft__put_be64(b + 48, tp->probe);
    weft__put_be32(b + 56, (uint32_t)nlen);
    memcpy(b + 60, me->sun_path, nlen);
}

static int take_hello(shm_tp *tp, shm_wire *w)
{
    const uint8_t *b = w->in;
    uint32_t nlen = weft__get_be32(b + 56);

    if (weft__get_be32(b) != SHM_MAGIC ||
        weft__get_be32(b + 4) != SHM_VERSION ||
        weft__get_be32(b + 8) != (uint32_t)w->peer ||
        weft__get_be32(b + 12) != (uint32_t)tp->rank || nlen == 0 || nlen > 64)
        return weft__fail(tp->p->sink, WEFT_ETRANSPORT,
                          "rank %d: peer %d sent a garbled shared-memory "
                          "set-up message",
                          tp->rank, w->peer);
    if (weft__get_be64(b + 24) != tp->ring_bytes)
        return weft__fail(tp->p->sink, WEFT_ECONFIG,
                          "rank %d: peer %d runs WEFT_SHM_RING_BYTES=%llu, "
                          "this rank %zu; give every rank the same",
                          tp->rank, w->peer,
                          (unsigned long long)weft__get_be64(b + 24),
                          tp->ring_bytes);
    w->pid = (pid_t)weft__get_be32(b + 16);
    w->nonce_in = weft__get_be64(b + 32);
    w->probe_addr = weft__get_be64(b + 40);
    w->probe_value = weft__get_be64(b + 48);
    memset(&w->doorbell, 0, sizeof w->doorbell);
    w->doorbell.sun_family = AF_UNIX;
    memcpy(w->doorbell.sun_path, b + 60, nlen);
    w->doorbell_len =
        (socklen_t)(offsetof(struct sockaddr_un, sun_path) + nlen);
    return WEFT_OK;
}

/* ---- segments ---- */

/* Points w's rings and flags into its mapped segment. */
static void wire_map(shm_tp *tp, shm_wire *w)
{
    shm_seg *s = w->seg;
    char *data = (char *)s + SHM_SEG_HDR;

    w->tx = &s->ring[w->side];
    w->rx = &s->ring[1 - w->side];
    w->tx_data = data + (size_t)w->side * tp->ring_bytes;
    w->rx_data = data + (size_t)(1 - w->side) * tp->ring_bytes;
    w->my_sleep = w->side == 0 ? &s->sleeping0 : &s->sleeping1;
    w->peer_sleep = w->side == 0 ? &s->sleeping1 : &s->sleeping0;
    w->my_aborted = w->side == 0 ? &s->aborted0 : &s->aborted1;
    w->peer_aborted = w->side == 0 ? &s->aborted1 : &s->aborted0;
    w->my_cpu = w->side == 0 ? &s->cpu0 : &s->cpu1;
    w->peer_cpu = w->side == 0 ? &s->cpu1 : &s->cpu0;
}

/* Closes a segment's descriptor (shm.h: why TSan must not see it). */
static void seg_fd_close(int fd)
{
    SHM_FD_UNSEEN_BEGIN();
    close(fd);
    SHM_FD_UNSEEN_END();
}

/* Maps bytes of segment fd; what names it for the message ("peer 3", "the
 * box").
 *
 * MAP_POPULATE: the pages are faulted in here, at set-up, on both sides.
 * Left to first touch, each ring's pages fault in (allocated and zeroed by
 * the writer, mapped again by the reader) during whichever calls first
 * carry the ring's head across them: measured with 2 ranks on the 2-core
 * VM, 20 calls of 8 KiB after 3 warm-ups, following the smaller sizes of a
 * sweep, took 11 us each against 2.2 us once populated. */
static int seg_map(shm_tp *tp, int fd, size_t bytes, const char *what,
                   void **out)
{
    void *m;

    SHM_FD_UNSEEN_BEGIN();
    m = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, fd,
             0);
    SHM_FD_UNSEEN_END();
    if (m == MAP_FAILED)
        return weft__fail(tp->p->sink, WEFT_ENOMEM,
                          "rank %d: cannot map %zu bytes of shared memory "
                          "for %s: %s",
                          tp->rank, bytes, what, strerror(errno));
    *out = m;
    return WEFT_OK;
}

/* A fresh anonymous segment of bytes (zero-filled), its descriptor in
 * *fd (also on a failure after memfd_create: the caller closes it). */
static int seg_memfd(shm_tp *tp, const char *name, size_t bytes,
                     const char *what, int *fd)
{
    int rc;

    if ((*fd = memfd_create(name, MFD_CLOEXEC)) < 0)
        return weft__fail(tp->p->sink, WEFT_ETRANSPORT,
                          "rank %d: memfd_create for %s: %s (set "
                          "WEFT_SHM=0 to use TCP between ranks of a host)",
                          tp->rank, what, strerror(errno));
    SHM_FD_UNSEEN_BEGIN();
    rc = ftruncate(*fd, (off_t)bytes);
    SHM_FD_UNSEEN_END();
    if (rc != 0)
        return weft__fail(tp->p->sink, WEFT_ENOMEM,
                          "rank %d: cannot size %zu bytes of shared memory "
                          "for %s: %s",
                          tp->rank, bytes, what, strerror(errno));
    return WEFT_OK;
}

static int map_fd(shm_tp *tp, shm_wire *w, int fd)
{
    char what[32];
    void *m = NULL;
    int rc;

    snprintf(what, sizeof what, "peer %d", w->peer);
    if ((rc = seg_map(tp, fd, seg_bytes(tp), what, &m)) != 0)
        return rc;
    w->seg = m;
    w->seg_bytes = seg_bytes(tp);
    wire_map(tp, w);
    return WEFT_OK;
}

/* The lower rank of a pair: a fresh anonymous segment (zero-filled). */
static int seg_create(shm_tp *tp, shm_wire *w)
{
    char what[32];
    int rc;

    snprintf(what, sizeof what, "peer %d", w->peer);
    if ((rc = seg_memfd(tp, "weft-shm", seg_bytes(tp), what, &w->seg_fd)) !=
            0 ||
        (rc = map_fd(tp, w, w->seg_fd)) != 0)
        return rc;
    w->seg->magic = SHM_MAGIC;
    w->seg->version = SHM_VERSION;
    w->seg->ring_bytes = tp->ring_bytes;
    return WEFT_OK;
}

/* ---- the box segment (shm.h) ---- */

static size_t box_seg_bytes(const shm_tp *tp)
{
    return SHM_BOX_HDR + (size_t)tp->nranks * sizeof(shm_box_area);
}

static int box_map(shm_tp *tp, int fd)
{
    void *m = NULL;
    int rc;

    if ((rc = seg_map(tp, fd, box_seg_bytes(tp), "the box", &m)) != 0)
        return rc;
    tp->box_seg = m;
    tp->box_seg_bytes = box_seg_bytes(tp);
    return WEFT_OK;
}

/* The lowest rank of the host: the box segment, handed to every peer with
 * their pair's segment (seg_send_all). */
static int box_create(shm_tp *tp)
{
    int rc;

    if ((rc = seg_memfd(tp, "weft-box", box_seg_bytes(tp), "the box",
                        &tp->box_fd)) != 0 ||
        (rc = box_map(tp, tp->box_fd)) != 0)
        return rc;
    weft__put_be32((uint8_t *)tp->box_seg, SHM_MAGIC);
    weft__put_be32((uint8_t *)tp->box_seg + 4, SHM_VERSION);
    weft__put_be32((uint8_t *)tp->box_seg + 8, (uint32_t)tp->nranks);
    return WEFT_OK;
}

/* A peer's box segment, arrived with the lowest rank's pair segment. */
static int box_take(shm_tp *tp, int fd)
{
    struct stat st;
    int rc;

    if (fstat(fd, &st) != 0 || (size_t)st.st_size != box_seg_bytes(tp))
        return weft__fail(tp->p->sink, WEFT_ETRANSPORT,
                          "rank %d: the box segment from rank %d has the "
                          "wrong size",
                          tp->rank, tp->box_leader);
    if ((rc = box_map(tp, fd)) != 0)
        return rc;
    if (weft__get_be32((uint8_t *)tp->box_seg) != SHM_MAGIC ||
        weft__get_be32((uint8_t *)tp->box_seg + 4) != SHM_VERSION ||
        weft__get_be32((uint8_t *)tp->box_seg + 8) != (uint32_t)tp->nranks)
        return weft__fail(tp->p->sink, WEFT_ETRANSPORT,
                          "rank %d: the box segment from rank %d is garbled",
                          tp->rank, tp->box_leader);
    return WEFT_OK;
}

/* Hands every created segment not yet handed over to its peer's socket.
 * Returns how many wait (a peer's queue was full), or a negative code. */
static int seg_send_all(shm_tp *tp)
{
    int waiting = 0;

    for (int i = 0; i < tp->nlocal; i++) {
        shm_wire *w = &tp->wires[i];
        uint8_t pay[SHM_FD_MSG_BYTES] = {0};
        union {
            struct cmsghdr h;
            char b[CMSG_SPACE(2 * sizeof(int))];
        } ctl;
        /* The lowest rank hands the box segment along. */
        const int nfd = tp->box_fd >= 0 ? 2 : 1;
        int fds[2] = {w->seg_fd, tp->box_fd};
        struct iovec iov = {.iov_base = pay, .iov_len = sizeof pay};
        struct msghdr m = {.msg_name = &w->doorbell,
                           .msg_namelen = w->doorbell_len,
                           .msg_iov = &iov,
                           .msg_iovlen = 1,
                           .msg_control = ctl.b,
                           .msg_controllen = CMSG_SPACE(nfd * sizeof(int))};
        struct cmsghdr *c;

        if (w->side != 0 || w->seg_fd < 0)
            continue;
        weft__put_be32(pay, SHM_MAGIC);
        weft__put_be32(pay + 4, (uint32_t)tp->rank);
        weft__put_be64(pay + 8, w->nonce_in);
        memset(&ctl, 0, sizeof ctl);
        c = CMSG_FIRSTHDR(&m);
        c->cmsg_level = SOL_SOCKET;
        c->cmsg_type = SCM_RIGHTS;
        c->cmsg_len = CMSG_LEN(nfd * sizeof(int));
        memcpy(CMSG_DATA(c), fds, nfd * sizeof(int));
        if (sendmsg(tp->sock, &m, MSG_DONTWAIT | MSG_NOSIGNAL) < 0) {
            if (errno == EAGAIN || errno == EWOULDBLOCK) {
                waiting++;
                continue;
            }
            return weft__fail(tp->p->sink, WEFT_ETRANSPORT,
                              "rank %d: cannot hand the shared segment to "
                              "peer %d: %s",
                              tp->rank, w->peer, strerror(errno));
        }
        /* The message holds the file now; the mapping stays. */
        seg_fd_close(w->seg_fd);
        w->seg_fd = -1;
    }
    if (waiting == 0 && tp->box_fd >= 0) {
        int handed = 1;

        for (int i = 0; i < tp->nlocal; i++)
            handed &= tp->wires[i].seg_fd < 0;
        if (handed) {
            seg_fd_close(tp->box_fd);
            tp->box_fd = -1;
        }
    }
    return waiting;
}

/* The higher rank of a pair: takes in the segments that arrived. A
 * datagram that does not carry a nonce this rank sent to that peer is
 * dropped, its descriptor closed. */
static int seg_take(shm_tp *tp)
{
    for (;;) {
        uint8_t pay[SHM_FD_MSG_BYTES];
        union {
            struct cmsghdr h;
            char b[CMSG_SPACE(4 * sizeof(int))];
        } ctl;
        struct iovec iov = {.iov_base = pay, .iov_len = sizeof pay};
        struct msghdr m = {.msg_iov = &iov,
                           .msg_iovlen = 1,
                           .msg_control = ctl.b,
                           .msg_controllen = sizeof ctl.b};
        ssize_t n = recvmsg(tp->sock, &m, MSG_DONTWAIT | MSG_CMSG_CLOEXEC);
        int fd = -1, fd2 = -1, extra = 0, rc;
        shm_wire *w = NULL;
        struct stat st;

        if (n < 0)
            return errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR
                       ? WEFT_OK
                       : weft__fail(tp->p->sink, WEFT_ETRANSPORT,
                                    "rank %d: shared-memory set-up: recvmsg: "
                                    "%s",
                                    tp->rank, strerror(errno));
        for (struct cmsghdr *c = CMSG_FIRSTHDR(&m); c != NULL;
             c = CMSG_NXTHDR(&m, c)) {
            if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS)
                continue;
            for (size_t k = 0; k < (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
                 k++) {
                int f;
                memcpy(&f, CMSG_DATA(c) + k * sizeof(int), sizeof f);
                if (fd < 0)
                    fd = f;
                else if (fd2 < 0)
                    fd2 = f;
                else {
                    seg_fd_close(f);
                    extra = 1;
                }
            }
        }
        if (fd < 0)
            continue; /* a wake-up, or garbage */
        if (n == SHM_FD_MSG_BYTES && !extra &&
            weft__get_be32(pay) == SHM_MAGIC) {
            uint32_t r = weft__get_be32(pay + 4);
            if (r < (uint32_t)tp->nranks && tp->local[r] != NULL &&
                tp->local[r]->side == 1 && tp->local[r]->seg == NULL &&
                weft__get_be64(pay + 8) == tp->local[r]->nonce_out &&
                /* the box segment comes from the lowest rank alone */
                (fd2 >= 0) == ((int)r == tp->box_leader))
                w = tp->local[r];
        }
        if (w == NULL || fstat(fd, &st) != 0 ||
            (size_t)st.st_size != seg_bytes(tp)) {
            weft__log(WEFT__LOG_WARN, tp->rank,
                      "shared-memory set-up: dropped a segment that no "
                      "peer of this job sent");
            seg_fd_close(fd);
            if (fd2 >= 0)
                seg_fd_close(fd2);
            continue;
        }
        if (fd2 >= 0) {
            rc = box_take(tp, fd2);
            seg_fd_close(fd2);
            if (rc != 0) {
                seg_fd_close(fd);
                return rc;
            }
        }
        rc = map_fd(tp, w, fd);
        seg_fd_close(fd);
        if (rc != 0)
            return rc;
        if (w->seg->magic != SHM_MAGIC || w->seg->version != SHM_VERSION ||
            w->seg->ring_bytes != tp->ring_bytes)
            return weft__fail(tp->p->sink, WEFT_ETRANSPORT,
                              "rank %d: the shared segment from peer %d is "
                              "garbled",
                              tp->rank, w->peer);
    }
}

static int segs_missing(const shm_tp *tp)
{
    int n = 0;

    for (int i = 0; i < tp->nlocal; i++)
        if (tp->wires[i].seg == NULL)
            n++;
    return n + (tp->box_leader >= 0 && tp->box_seg == NULL);
}

/* Runs the TCP side (and, in the segment phase, hands over and takes in
 * segments) until every set-up message has come and gone and, with segs,
 * every segment is mapped; or the deadline. */
static int setup_wait(shm_tp *tp, int segs, const char *phase)
{
    uint64_t deadline = tp->p->deadline_ms;

    for (;;) {
        struct pollfd pfd[1 + WEFT__FAR_FDS];
        int rc = tp->fo->poll(tp->far, 1), sending = 0, tmo, n = 1;
        uint64_t now;

        if (rc < 0)
            return rc; /* the TCP side recorded why */
        if (segs) {
            if ((sending = seg_send_all(tp)) < 0)
                return sending;
            if ((rc = seg_take(tp)) != 0)
                return rc;
        }
        if (tp->setup_pending == 0 &&
            (!segs || (sending == 0 && segs_missing(tp) == 0)))
            return WEFT_OK;
        now = weft__now_ms();
        if (now >= deadline)
            return weft__fail(
                tp->p->sink, WEFT_ETIMEDOUT,
                "rank %d: shared-memory set-up with the ranks of this host "
                "(%s) did not finish by the connect deadline "
                "(WEFT_CONNECT_TIMEOUT_MS); every rank of a host must run "
                "with the same WEFT_SHM",
                tp->rank, phase);
        tmo = deadline - now > 1000 ? 1000 : (int)(deadline - now);
        if (sending > 0 && tmo > 1)
            tmo = 1; /* a peer's socket queue was full: try again soon */
        pfd[0] = (struct pollfd){.fd = tp->sock, .events = POLLIN};
        rc = tp->fo->sleep_prep(tp->far, pfd, 1 + WEFT__FAR_FDS, &n, &tmo);
        if (rc < 0)
            return rc;
        if (rc > 0)
            continue; /* it moved: look again */
        if ((rc = poll(pfd, (nfds_t)n, tmo)) < 0 && errno != EINTR)
            return weft__fail(tp->p->sink, WEFT_ETRANSPORT, "rank %d: poll: %s",
                              tp->rank, strerror(errno));
        if (rc > 0)
            tp->fo->woke(tp->far, pfd + 1, n - 1);
    }
}

/* Whether this process can read peer w's memory (process_vm_readv, which
 * the kernel allows only where this process could trace the peer). */
static int probe_read(const shm_wire *w)
{
    uint64_t v = 0;
    struct iovec l = {.iov_base = &v, .iov_len = sizeof v};
    struct iovec r = {.iov_base = (void *)(uintptr_t)w->probe_addr,
                      .iov_len = sizeof v};

    return process_vm_readv(w->pid, &l, 1, &r, 1, 0) == (ssize_t)sizeof v &&
           v == w->probe_value;
}

/* Says (WEFT_LOG=info) why this rank cannot read the memory of peer, and
 * of `more` other local peers: where Yama's ptrace_scope is 1 (Ubuntu's
 * default) the kernel refuses siblings. err is the first probe's errno. */
static void say_unreadable(const shm_tp *tp, int peer, int more, int err)
{
    char scope[16] = "", others[48] = "";
    FILE *f = fopen("/proc/sys/kernel/yama/ptrace_scope", "re");

    if (f != NULL) {
        if (fgets(scope, sizeof scope, f) == NULL)
            scope[0] = '\0';
        scope[strcspn(scope, "\n")] = '\0';
        fclose(f);
    }
    if (more > 0)
        snprintf(others, sizeof others, " (nor of %d more local peer%s)", more,
                 more > 1 ? "s" : "");
    weft__log(WEFT__LOG_INFO, tp->rank,
              "cannot read the memory of peer %d%s (process_vm_readv: "
              "%s%s%s%s): large frames go through the shared-memory ring "
              "(two copies), and the one-copy collectives are off",
              peer, others, err != 0 ? strerror(err) : "other bytes than sent",
              scope[0] ? "; kernel.yama.ptrace_scope is " : "", scope,
              scope[0] && strcmp(scope, "0") != 0
                  ? ", which refuses it without CAP_SYS_PTRACE"
                  : "");
}

static int exchange(shm_tp *tp)
{
    struct sockaddr_un me;
    socklen_t melen = sizeof me;
    int rc, unreadable = 0, first = -1, first_err = 0;

    /* The doorbell socket, its name picked by the kernel (autobind: five
     * hex digits in the abstract namespace). */
    tp->sock = socket(AF_UNIX, SOCK_DGRAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (tp->sock < 0)
        return weft__fail(tp->p->sink, WEFT_ETRANSPORT,
                          "rank %d: shared memory: socket(AF_UNIX): %s",
                          tp->rank, strerror(errno));
    me.sun_family = AF_UNIX;
    if (bind(tp->sock, (struct sockaddr *)&me, sizeof(sa_family_t)) != 0 ||
        getsockname(tp->sock, (struct sockaddr *)&me, &melen) != 0 ||
        melen <= offsetof(struct sockaddr_un, sun_path) ||
        melen > offsetof(struct sockaddr_un, sun_path) + 64)
        return weft__fail(tp->p->sink, WEFT_ETRANSPORT,
                          "rank %d: shared memory: cannot bind a Unix "
                          "socket: %s",
                          tp->rank, strerror(errno));
    for (int i = 0; i < tp->nlocal; i++) {
        shm_wire *w = &tp->wires[i];
        w->nonce_out = random64();
        pack_hello(tp, w, &me, melen);
        if ((rc = exchange_post(tp, w, SHM_HELLO_BYTES)) != 0)
            return rc;
    }
    if ((rc = setup_wait(tp, 0, "hello")) != 0)
        return rc;
    if (tp->box_leader == tp->rank && (rc = box_create(tp)) != 0)
        return rc;
    for (int i = 0; i < tp->nlocal; i++) {
        shm_wire *w = &tp->wires[i];
        if ((rc = take_hello(tp, w)) != 0)
            return rc;
        if (w->side == 0 && (rc = seg_create(tp, w)) != 0)
            return rc;
    }
    if ((rc = setup_wait(tp, 1, "segments")) != 0)
        return rc;
    /* Say whether this process can read the peer's memory; the peer sends
     * one-copy records only then. */
    for (int i = 0; i < tp->nlocal; i++) {
        shm_wire *w = &tp->wires[i];
        errno = 0;
        w->can_read_peer = probe_read(w);
        if (!w->can_read_peer && unreadable++ == 0) {
            first = w->peer;
            first_err = errno;
        }
        memset(w->out, 0, SHM_DONE_BYTES);
        weft__put_be32(w->out, SHM_MAGIC);
        weft__put_be32(w->out + 4, (uint32_t)tp->rank);
        weft__put_be32(w->out + 8, (uint32_t)w->can_read_peer);
        if ((rc = exchange_post(tp, w, SHM_DONE_BYTES)) != 0)
            return rc;
    }
    if (unreadable > 0)
        say_unreadable(tp, first, unreadable - 1, first_err);
    if ((rc = setup_wait(tp, 0, "done")) != 0)
        return rc;
    for (int i = 0; i < tp->nlocal; i++) {
        shm_wire *w = &tp->wires[i];
        if (weft__get_be32(w->in) != SHM_MAGIC ||
            weft__get_be32(w->in + 4) != (uint32_t)w->peer)
            return weft__fail(tp->p->sink, WEFT_ETRANSPORT,
                              "rank %d: peer %d sent a garbled "
                              "shared-memory set-up message",
                              tp->rank, w->peer);
        w->peer_reads_me = weft__get_be32(w->in + 8) != 0;
        weft__log(WEFT__LOG_DEBUG, tp->rank,
                  "shared memory with peer %d: one-copy reads %s from it, "
                  "%s to it",
                  w->peer, w->can_read_peer ? "on" : "off",
                  w->peer_reads_me ? "on" : "off");
    }
    return WEFT_OK;
}

/* ---- create, shutdown, destroy ---- */

static void shm_cable_wires(weft__tp *t, int p, weft_wire_info *out)
{
    shm_tp *tp = (shm_tp *)t;

    memset(out, 0, sizeof *out);
    if (p < 0 || p >= tp->nranks || p == tp->rank || tp->local[p] != NULL)
        return;
    tp->fo->ops->cable_wires(tp->far, p, out);
}

static int shm_nwires(weft__tp *t, int p)
{
    shm_tp *tp = (shm_tp *)t;

    if (p < 0 || p >= tp->nranks || p == tp->rank)
        return 0;
    if (tp->local[p] != NULL)
        return 1;
    return tp->fo->ops->nwires(tp->far, p);
}

/* Hands back the buffers of one-copy records: a peer that reads one after
 * this sees the flag and fails rather than trust what it read. */
static void mark_aborted(shm_tp *tp)
{
    /* The box's last ended call first: a peer that sees the flag then
     * knows which of this rank's messages were whole. */
    if (tp->box_seg != NULL)
        atomic_store(&shm_box_area_of(tp, tp->rank)->done, tp->box_done);
    for (int i = 0; i < tp->nlocal; i++)
        if (tp->wires[i].seg != NULL)
            atomic_store(tp->wires[i].my_aborted, 1);
}

static void shm_shutdown(weft__tp *t)
{
    shm_tp *tp = (shm_tp *)t;

    if (tp == NULL)
        return;
    tp->shut = 1;
    mark_aborted(tp);
    for (int i = 0; i < tp->nlocal; i++) {
        shm_wire *w = &tp->wires[i];
        w->sq_head = w->sq_tail = NULL;
        w->wq_head = w->wq_tail = NULL;
        w->rq_head = w->rq_tail = NULL;
    }
    tp->done_head = tp->done_tail = NULL;
    if (tp->far != NULL)
        tp->fo->ops->shutdown(tp->far);
}

static void shm_destroy(weft__tp *t)
{
    shm_tp *tp = (shm_tp *)t;

    if (tp == NULL)
        return;
    mark_aborted(tp);
    for (int i = 0; tp->wires != NULL && i < tp->nlocal; i++) {
        shm_wire *w = &tp->wires[i];
        if (w->seg != NULL && munmap(w->seg, w->seg_bytes) != 0)
            weft__log(WEFT__LOG_WARN, tp->rank, "munmap: %s", strerror(errno));
        if (w->seg_fd >= 0)
            seg_fd_close(w->seg_fd);
    }
    if (tp->box_seg != NULL && munmap(tp->box_seg, tp->box_seg_bytes) != 0)
        weft__log(WEFT__LOG_WARN, tp->rank, "munmap: %s", strerror(errno));
    if (tp->box_fd >= 0)
        seg_fd_close(tp->box_fd);
    if (tp->sock >= 0)
        close(tp->sock);
    /* Closing the TCP side tells the peers this rank has left. */
    if (tp->far != NULL)
        tp->fo->ops->destroy(tp->far);
    free(tp->wires);
    free(tp->local);
    free(tp);
}

/* The peers of this host, each with its side of the pair. */
static int plan(shm_tp *tp)
{
    const weft__config *cfg = tp->p->cfg;
    int me = cfg->rank_host[tp->rank], n = 0;
    long ncpu = sysconf(_SC_NPROCESSORS_ONLN);

    tp->local = calloc((size_t)tp->nranks, sizeof *tp->local);
    tp->wires = calloc((size_t)tp->nranks, sizeof *tp->wires);
    if (tp->local == NULL || tp->wires == NULL)
        return WEFT_ENOMEM;
    for (int p = 0; p < tp->nranks; p++) {
        shm_wire *w;
        if (p == tp->rank || cfg->rank_host[p] != me)
            continue;
        w = &tp->wires[n++];
        w->tp = tp;
        w->peer = p;
        w->side = p < tp->rank ? 1 : 0;
        w->seg_fd = -1;
        tp->local[p] = w;
    }
    tp->nlocal = n;
    /* The box: every rank of the job on this host; the lowest makes it. */
    tp->box_leader =
        n >= 1 && n + 1 == tp->nranks && tp->nranks <= SHM_BOX_MAX_RANKS ? 0
                                                                         : -1;
    /* Relays run on the TCP side while this rank is inside progress(). */
    tp->tcp_data = n + 1 < tp->nranks;
    tp->oversubscribed = ncpu > 0 && n + 1 > ncpu;
    return WEFT_OK;
}

static int shm_create(const weft__tp_params *p, weft__tp **out)
{
    shm_tp *tp = calloc(1, sizeof *tp);
    int rc;

    *out = NULL;
    if (tp == NULL)
        return WEFT_ENOMEM;
    tp->p = p;
    tp->rank = p->rank;
    tp->nranks = p->nranks;
    tp->sock = -1;
    tp->box_fd = -1;
    tp->box_leader = -1;
    tp->ring_bytes = p->cfg->shm_ring_bytes;
    tp->cma_bytes = p->cfg->shm_cma_bytes;
    weft__spin_init(&tp->spin, p->cfg);
    tp->probe = random64();
    /* Other hosts: every wire of plain TCP or ibverbs, and one TCP
     * connection to each peer of this host (set-up and liveness only). */
    tp->fo = &weft__tcp_far;
#ifdef WEFT_HAVE_IBVERBS
    if (strcmp(p->cfg->transport, "ibverbs") == 0)
        tp->fo = &weft__ib_far;
#endif
    tp->tcp_p = *p;
    tp->tcp_p.local_wires = 1;
    if ((rc = plan(tp)) == 0 &&
        (rc = tp->fo->ops->create(&tp->tcp_p, &tp->far)) == 0)
        tp->tcp = tp->fo->tcp(tp->far);
    if (rc != 0 || (rc = exchange(tp)) != 0) {
        shm_destroy((weft__tp *)tp);
        return rc;
    }
    tp->tcp_ends = weft__tcp_ends(tp->tcp);
    weft__log(WEFT__LOG_DEBUG, tp->rank,
              "shared memory with %d rank(s) of this host, rings of %zu "
              "bytes",
              tp->nlocal, tp->ring_bytes);
    *out = (weft__tp *)tp;
    return WEFT_OK;
}

static const weft__tp_relay_ops shm_relay = {
    .offered = 1,
    .send = weft__shm_relay_send,
    .recv = weft__shm_relay_recv,
};

static const weft__tp_box_ops shm_box = {
    .offered = 1,
    .bytes = weft__shm_box_bytes,
    .put = weft__shm_box_put,
    .announce = weft__shm_box_announce,
    .get = weft__shm_box_get,
    .done = weft__shm_box_done,
    .watch = weft__shm_box_watch,
};

static const weft__tp_read_ops shm_read = {
    .offered = 1,
    .can_read = weft__shm_can_read,
    .peer_read = weft__shm_peer_read,
};

const weft__tp_ops weft__shm_ops = {
    .name = "shm",
    .create = shm_create,
    .destroy = shm_destroy,
    .nwires = shm_nwires,
    .cable_wires = shm_cable_wires,
    .post_send = weft__shm_post_send,
    .post_recv = weft__shm_post_recv,
    .progress = weft__shm_progress,
    .wake = weft__shm_wake,
    .shutdown = shm_shutdown,
    .relay = &shm_relay,
    .box = &shm_box,
    .read = &shm_read,
};
