/*
 * The TCP transport's sending thread (WEFT_SEND_THREAD; tcp.h says which
 * batches it takes). It writes each connection's batches in order with
 * non-blocking send()s; where a socket is full it moves on to the other
 * connections' batches and sleeps in poll() only when every batch it
 * holds waits for room (or it holds none), woken by room, by a batch
 * handed over, or by its stop. What it wrote goes back through a list
 * under a lock, and the transport's async wakes progress(), which runs the
 * completions: the thread never runs weft code but send() and poll().
 *
 * It reads the frames' buffers only while their operation is in flight:
 * an operation that fails shuts the transport down before its call
 * returns (weft__pass_end), and shutdown stops and joins this thread
 * before anything else.
 */
#define _GNU_SOURCE
#include "transport/tcp/tcp.h"

#include <errno.h>
#include <signal.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <unistd.h>

/* The batch whose `next` field ptr points to. */
#define wreq_of(ptr) ((wreq *)(void *)((char *)(ptr)-offsetof(wreq, next)))

/* sendmsg(2); under ThreadSanitizer the system call itself. TSan reads
 * the frames' bytes at sendmsg's interceptor, and what orders those reads
 * before this rank's later writes to the same bytes is the peers (a byte
 * comes back only after it left, through other processes), which it
 * cannot see: it reported a race between this thread's send of a frame
 * and a later receive into it. libuv's own writes, not instrumented, are
 * not seen at all. Every other access of this thread stays checked. */
static ssize_t tx_sendmsg(int fd, const struct msghdr *m, int flags)
{
#ifdef __SANITIZE_THREAD__ /* transport/common.h */
    return syscall(SYS_sendmsg, fd, m, flags);
#else
    return sendmsg(fd, m, flags);
#endif
}

/* Writes what w's socket takes now: 1 once all of w has left, 0 where
 * the socket is full, or libuv's code (a negative errno) of a failure. */
static int tx_write(wreq *w)
{
    while (w->at < w->nb) {
        struct msghdr m;
        size_t sent;
        ssize_t r;

        memset(&m, 0, sizeof m);
        /* uv_buf_t is laid out as struct iovec on Unix (data.c). */
        m.msg_iov = (struct iovec *)(uintptr_t)(w->bufs + w->at);
        m.msg_iovlen = (size_t)(w->nb - w->at);
        r = tx_sendmsg(w->fd, &m, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (r < 0) {
            if (errno == EINTR)
                continue;
            return errno == EAGAIN || errno == EWOULDBLOCK ? 0 : -errno;
        }
        sent = (size_t)r;
        while (w->at < w->nb && sent >= w->bufs[w->at].len) {
            sent -= w->bufs[w->at].len;
            w->at++;
        }
        if (sent > 0) {
            w->bufs[w->at].base += sent;
            w->bufs[w->at].len -= sent;
        }
    }
    return 1;
}

/* Whether pf[1..n) already waits on fd: an earlier batch of that socket
 * is still to be written, so this one must wait behind it. */
static int waits_on(const struct pollfd *pf, int n, int fd)
{
    for (int i = 1; i < n; i++)
        if (pf[i].fd == fd)
            return 1;
    return 0;
}

static void *tx_main(void *arg)
{
    tcp_tp *tp = arg;
    tcp_tx *t = tp->tx;
    wreq *q = NULL, **qt = &q; /* held, oldest first */

    for (;;) {
        wreq *back = NULL, **bt = &back;
        int nback = 0, np = 1, stop, full = 0;

        pthread_mutex_lock(&t->mu);
        if (t->in_head != NULL) {
            *qt = t->in_head;
            qt = &t->in_tail->next;
            t->in_head = t->in_tail = NULL;
        }
        stop = t->stop;
        pthread_mutex_unlock(&t->mu);
        if (stop)
            break;
        t->pf[0] = (struct pollfd){.fd = t->efd, .events = POLLIN};
        for (wreq **pp = &q; *pp != NULL;) {
            wreq *w = *pp;
            int rc;

            if (waits_on(t->pf, np, w->fd)) {
                pp = &w->next;
                continue;
            }
            if ((rc = tx_write(w)) == 0) {
                if (np == t->nfds) {
                    /* Not watched, so a later batch of its socket would
                     * not wait behind it: none is tried this turn, and
                     * the next comes soon. */
                    full = 1;
                    break;
                }
                t->pf[np++] = (struct pollfd){.fd = w->fd, .events = POLLOUT};
                pp = &w->next;
                continue;
            }
            w->status = rc < 0 ? rc : 0;
            *pp = w->next;
            w->next = NULL;
            *bt = w;
            bt = &w->next;
            nback++;
        }
        /* The tail, after removals anywhere in q. */
        qt = &q;
        while (*qt != NULL)
            qt = &(*qt)->next;
        if (nback > 0) {
            pthread_mutex_lock(&t->mu);
            if (t->done_head == NULL)
                t->done_head = back;
            else
                t->done_tail->next = back;
            t->done_tail = wreq_of(bt);
            atomic_fetch_add_explicit(&t->ndone, nback, memory_order_release);
            pthread_mutex_unlock(&t->mu);
            uv_async_send(&tp->async);
        }
        /* News (efd), or room in a full socket; never a busy loop. */
        if (poll(t->pf, (nfds_t)np, full ? 1 : -1) < 0 && errno != EINTR)
            usleep(1000);
        if (t->pf[0].revents != 0) {
            uint64_t v;
            ssize_t r = read(t->efd, &v, sizeof v);
            (void)r;
        }
    }
    /* Stopped: what it held goes back for weft__tcp_tx_stop to free. */
    pthread_mutex_lock(&t->mu);
    if (q != NULL) {
        *qt = t->in_head;
        if (t->in_head == NULL)
            t->in_tail = wreq_of(qt);
        t->in_head = q;
    }
    pthread_mutex_unlock(&t->mu);
    return NULL;
}

static void tx_free(tcp_tx *t)
{
    if (t->efd >= 0)
        close(t->efd);
    pthread_mutex_destroy(&t->mu);
    free(t->pf);
    free(t);
}

static int tx_start(tcp_tp *tp)
{
    tcp_tx *t;
    sigset_t all, old;
    int n = 1, rc;

    if (tp->tx_failed || tp->shut)
        return -1;
    for (int p = 0; p < tp->nranks; p++)
        n += tp->peers[p].nslots;
    if ((t = calloc(1, sizeof *t)) == NULL ||
        (t->pf = calloc((size_t)n, sizeof *t->pf)) == NULL) {
        free(t);
        tp->tx_failed = 1;
        return -1;
    }
    t->nfds = n;
    t->efd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    pthread_mutex_init(&t->mu, NULL);
    atomic_init(&t->ndone, 0);
    if (t->efd < 0) {
        weft__log(WEFT__LOG_WARN, tp->rank,
                  "no sending thread (eventfd: %s): sends stay on progress()",
                  strerror(errno));
        tx_free(t);
        tp->tx_failed = 1;
        return -1;
    }
    tp->tx = t;
    /* Signals stay with the application's threads. */
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &old);
    rc = pthread_create(&t->th, NULL, tx_main, tp);
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    if (rc != 0) {
        weft__log(WEFT__LOG_WARN, tp->rank,
                  "no sending thread (%s): sends stay on progress()",
                  strerror(rc));
        tp->tx = NULL;
        tx_free(t);
        tp->tx_failed = 1;
        return -1;
    }
    weft__log(WEFT__LOG_DEBUG, tp->rank,
              "sending thread started (batches of %zu bytes and more)",
              tp->cfg->send_thread_min_bytes);
    return 0;
}

int weft__tcp_tx_hand(tcp_tp *tp, conn *k, wreq *w)
{
    uv_os_fd_t fd;
    uint64_t one = 1;
    tcp_tx *t;
    ssize_t r;

    /* One path whether or not k has batches with the thread: while it
     * has, the thread runs and k's socket stays open (until shutdown). */
    if ((tp->tx == NULL && tx_start(tp) != 0) ||
        uv_fileno((const uv_handle_t *)&k->h, &fd) != 0)
        return -1;
    t = tp->tx;
    w->k = k;
    w->fd = fd;
    w->at = 0;
    w->status = 0;
    w->next = NULL;
    k->tx_batches++;
    pthread_mutex_lock(&t->mu);
    if (t->in_head == NULL)
        t->in_head = w;
    else
        t->in_tail->next = w;
    t->in_tail = w;
    pthread_mutex_unlock(&t->mu);
    r = write(t->efd, &one, sizeof one);
    (void)r; /* a full counter still wakes the thread */
    return 0;
}

wreq *weft__tcp_tx_take(tcp_tp *tp)
{
    tcp_tx *t = tp->tx;
    wreq *w;

    if (t == NULL || atomic_load_explicit(&t->ndone, memory_order_acquire) == 0)
        return NULL;
    pthread_mutex_lock(&t->mu);
    w = t->done_head;
    t->done_head = t->done_tail = NULL;
    atomic_store_explicit(&t->ndone, 0, memory_order_relaxed);
    pthread_mutex_unlock(&t->mu);
    /* The counts first: a completion may fail the call, and shutdown
     * then closes and frees the connections. */
    for (wreq *y = w; y != NULL; y = y->next)
        y->k->tx_batches--;
    return w;
}

/* Hands a list of batches back to the free list, uncompleted. */
static void recycle(tcp_tp *tp, wreq *w)
{
    while (w != NULL) {
        wreq *next = w->next;

        w->next = tp->free_wreqs;
        tp->free_wreqs = w;
        w = next;
    }
}

void weft__tcp_tx_stop(tcp_tp *tp)
{
    tcp_tx *t = tp->tx;
    uint64_t one = 1;
    ssize_t r;

    tp->tx_failed = 1; /* never again on this transport */
    if (t == NULL)
        return;
    pthread_mutex_lock(&t->mu);
    t->stop = 1;
    pthread_mutex_unlock(&t->mu);
    r = write(t->efd, &one, sizeof one);
    (void)r;
    pthread_join(t->th, NULL);
    recycle(tp, t->in_head);
    recycle(tp, t->done_head);
    tp->tx = NULL;
    tx_free(t);
}
