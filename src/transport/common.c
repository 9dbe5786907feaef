/* Code that is the same in every transport; see common.h. */
#include "transport/common.h"
#include "transport/transport.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <pthread.h>
#include <sched.h>
#include <sys/socket.h>
#include <unistd.h>

/* ---- ports kept for failed communicators (transport.h) ---- */

#define KEPT_MAX 64
static struct {
    int port, fd;
    const void *owner;
} kept[KEPT_MAX];
static int nkept;
static pthread_mutex_t kept_mu = PTHREAD_MUTEX_INITIALIZER;

/* Entry i leaves the table (under kept_mu); its socket is closed where
 * close_it, else returned. */
static int kept_remove(int i, int close_it)
{
    int fd = kept[i].fd;

    kept[i] = kept[--nkept];
    if (close_it) {
        close(fd);
        fd = -1;
    }
    return fd;
}

void weft__port_keep(int port, int fd, const void *owner)
{
    pthread_mutex_lock(&kept_mu);
    /* A port kept already (a communicator that failed before, never
     * finalized) gives way: the newest holds it. */
    for (int i = 0; i < nkept; i++)
        if (kept[i].port == port) {
            kept_remove(i, 1);
            break;
        }
    if (nkept < KEPT_MAX)
        kept[nkept++] = (typeof(kept[0])){port, fd, owner};
    else
        close(fd); /* then the port refuses, as before */
    pthread_mutex_unlock(&kept_mu);
}

int weft__port_take(int port, int any)
{
    int fd = -1;

    pthread_mutex_lock(&kept_mu);
    for (int i = 0; i < nkept; i++)
        if (kept[i].port == port) {
            struct sockaddr_in sa;
            socklen_t len = sizeof sa;

            fd = kept_remove(i, 0);
            if (getsockname(fd, (struct sockaddr *)&sa, &len) != 0 ||
                sa.sin_family != AF_INET ||
                (sa.sin_addr.s_addr == htonl(INADDR_ANY)) != (any != 0)) {
                close(fd); /* bound elsewhere: the caller binds anew */
                fd = -1;
            }
            break;
        }
    pthread_mutex_unlock(&kept_mu);
    return fd;
}

void weft__port_drop(const void *owner)
{
    pthread_mutex_lock(&kept_mu);
    for (int i = 0; i < nkept; i++)
        if (kept[i].owner == owner) {
            kept_remove(i, 1);
            break;
        }
    pthread_mutex_unlock(&kept_mu);
}

int weft__tp_no_wire(weft__errsink *sink, int rank, int peer, int wire)
{
    return weft__fail(sink, WEFT_ETRANSPORT, "rank %d: no wire %d to peer %d",
                      rank, wire, peer);
}

void weft__spin_init(weft__spin *s, const weft__config *cfg)
{
    s->cur_ns = s->base_ns = (uint64_t)cfg->spin_us * 1000u;
    s->max_ns = cfg->own_core ? s->base_ns * WEFT__SPIN_GROWTH : s->base_ns;
}

void weft__spin_slept(weft__spin *s, uint64_t slept_ns)
{
    if (weft__on_progress_thread)
        return;
    if (slept_ns <= s->cur_ns) {
        s->cur_ns = s->cur_ns * 2 < s->max_ns ? s->cur_ns * 2 : s->max_ns;
    } else if (slept_ns / 4 > s->cur_ns) {
        s->cur_ns = s->cur_ns / 2 > s->base_ns ? s->cur_ns / 2 : s->base_ns;
    }
}

int weft__tp_spin(uint64_t spin_ns, int (*pass)(void *arg), void *arg,
                  const unsigned *events, unsigned ev)
{
    uint64_t t0;
    int rc;

    if (spin_ns == 0)
        return 0;
    t0 = weft__now_ns();
    for (;;) {
        /* Look first: a yield costs a system call, and a short message
         * has often arrived by now. */
        if ((rc = pass(arg)) != 0)
            return rc;
        if (*events != ev)
            return 1;
        if (weft__now_ns() - t0 >= spin_ns)
            return 0;
        /* Oversubscribed, the peer we wait for may need this core. */
        sched_yield();
    }
}
