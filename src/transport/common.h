/*
 * What the transports share besides the ops table (transport.h): the
 * pieces of code that are the same in each of them, written once here
 * (common.c). Only the transports' own files include this.
 */
#ifndef WEFT_TRANSPORT_COMMON_H
#define WEFT_TRANSPORT_COMMON_H

#include "base/base.h"
#include "topo/topo.h"

#include <poll.h>
#include <stdint.h>

/* __SANITIZE_THREAD__ under ThreadSanitizer, as GCC defines it, for clang
 * too (which says so by __has_feature only). */
#if defined(__has_feature)
#if __has_feature(thread_sanitizer) && !defined(__SANITIZE_THREAD__)
#define __SANITIZE_THREAD__ 1
#endif
#endif

/* The failure of a post_*() on a wire the transport does not have (no
 * such peer or wire, or one that is closing): WEFT_ETRANSPORT, recorded on
 * sink. */
int weft__tp_no_wire(weft__errsink *sink, int rank, int peer, int wire);

/* How long a progress() that found nothing to do polls before it sleeps.
 * It starts at WEFT_SPIN_US. Where this host has a core per rank
 * (own_core), a sleep that ended within the spin's length (a longer
 * spin would have caught its event without the wake-up) doubles it, up
 * to WEFT__SPIN_GROWTH times WEFT_SPIN_US, and a sleep of more than four
 * times the length halves it, down to WEFT_SPIN_US. Else a wake-up of a
 * sleeping peer, which takes 20-50 us on an idle core of a host of many,
 * can make the next wait sleep too, and ranks that sleep in turn stay in
 * that state: 2-20 us per small call became 18-72 us for whole runs on
 * the 16-core host (docs/performance.md). Only where the thread that waits
 * is the application's (a blocking call, weft_wait): weft's progress
 * thread runs beside the application's threads, which may need its core
 * (a framework computing while its operations are pending), so its waits
 * spin WEFT_SPIN_US (weft__spin_len) and do not change the length. (16
 * ranks' DDP step on the 16-core host, 2 runs each: 0.81 and 0.88 of
 * gloo's with the spin adapted there too, 0.77 and 0.81 with this rule,
 * 0.79-0.80 with the fixed spin before either.) */
#define WEFT__SPIN_GROWTH 20u

typedef struct weft__spin {
    uint64_t cur_ns;  /* the spin's length now (0: never spin) */
    uint64_t base_ns; /* WEFT_SPIN_US */
    uint64_t max_ns;  /* base_ns, or WEFT__SPIN_GROWTH times it */
} weft__spin;

/* From the communicator's settings: WEFT_SPIN_US, and whether the host
 * has a core per rank. */
void weft__spin_init(weft__spin *s, const weft__config *cfg);

/* How long this thread's wait spins now. A spin longer than
 * WEFT_SPIN_US ends at the deadline (deadline_ms, on weft__now_ms()'s
 * clock), so that the length learned does not keep a call past it. */
static inline uint64_t weft__spin_len(const weft__spin *s, uint64_t deadline_ms)
{
    uint64_t len = weft__on_progress_thread ? s->base_ns : s->cur_ns;

    if (len > s->base_ns && deadline_ms < UINT64_MAX / 1000000u) {
        uint64_t now = weft__now_ns(), end = deadline_ms * 1000000u;

        len = now >= end ? 0 : end - now < len ? end - now : len;
    }
    return len;
}

/* After a sleep of slept_ns that ended because something happened. */
void weft__spin_slept(weft__spin *s, uint64_t slept_ns);

/* The spin of a progress() that found nothing to do, before it sleeps:
 * for up to spin_ns (0: not at all), yields the core (oversubscribed, the
 * peer waited for may need it), then runs pass(arg), one pass of the
 * transport that never blocks and returns WEFT_OK or the transport's
 * error, until *events (the transport's count of completions and
 * wake-ups) is no longer ev. Returns 1 once something happened, 0 when
 * spin_ns passed with nothing, or the error of the pass (negative). */
int weft__tp_spin(uint64_t spin_ns, int (*pass)(void *arg), void *arg,
                  const unsigned *events, unsigned ev);

/* What carries the shared-memory transport's traffic to other hosts
 * (shm.h), which reaches the ranks of its own host itself: the TCP
 * transport, or the ibverbs one. create (ops->create) is given params
 * whose local_wires is 1: the transport opens one TCP connection to each
 * peer of this host, for the shared-memory set-up and to see the peer
 * leave, and no data wires to them (posts to them never reach it).
 * - tcp: that TCP side (the transport itself, or the one it rides on).
 * - poll: one pass that never blocks: 1 where something happened (a
 *   completion, a wake()), 0 where not, or the transport's error
 *   (negative). look: 1 before and after a sleep, where every part is
 *   looked at; 0 in a spin, where costly parts are looked at only as
 *   often as they are due.
 * - sleep_prep: before a sleep in poll(): arms what must be armed and
 *   passes once more; returns 1 where that pass moved anything (do not
 *   sleep), else appends its descriptors to pfd (at most max; *n counts
 *   them), lowers *tmo (ms) to the longest it may sleep and returns 0;
 *   or the transport's error.
 * - woke: after that poll(): takes in the events of its descriptors
 *   (pfd and n as sleep_prep left them). */
#define WEFT__FAR_FDS 40
struct weft__tp;
struct weft__tp_ops;
typedef struct weft__tp_far {
    const struct weft__tp_ops *ops;
    struct weft__tp *(*tcp)(struct weft__tp *tp);
    int (*poll)(struct weft__tp *tp, int look);
    int (*sleep_prep)(struct weft__tp *tp, struct pollfd *pfd, int max, int *n,
                      int *tmo);
    void (*woke)(struct weft__tp *tp, const struct pollfd *pfd, int n);
} weft__tp_far;

extern const weft__tp_far weft__tcp_far;
#ifdef WEFT_HAVE_IBVERBS
extern const weft__tp_far weft__ib_far;
#endif

#endif
