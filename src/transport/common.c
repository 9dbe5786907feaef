/* Code that is the same in every transport; see common.h. */
#include "transport/common.h"

#include <sched.h>

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
