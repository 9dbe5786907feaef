/*
 * What the transports share besides the ops table (transport.h): the
 * pieces of code that are the same in each of them, written once here
 * (common.c). Only the transports' own files include this.
 */
#ifndef WEFT_TRANSPORT_COMMON_H
#define WEFT_TRANSPORT_COMMON_H

#include "base/base.h"

#include <stdint.h>

/* The failure of a post_*() on a wire the transport does not have (no
 * such peer or wire, or one that is closing): WEFT_ETRANSPORT, recorded on
 * sink. */
int weft__tp_no_wire(weft__errsink *sink, int rank, int peer, int wire);

/* The spin of a progress() that found nothing to do, before it sleeps:
 * for up to spin_ns (0: not at all), yields the core (oversubscribed, the
 * peer waited for may need it), then runs pass(arg), one pass of the
 * transport that never blocks and returns WEFT_OK or the transport's
 * error, until *events (the transport's count of completions and
 * wake-ups) is no longer ev. Returns 1 once something happened, 0 when
 * spin_ns passed with nothing, or the error of the pass (negative). */
int weft__tp_spin(uint64_t spin_ns, int (*pass)(void *arg), void *arg,
                  const unsigned *events, unsigned ev);

#endif
