/*
 * The TCP transport as a base for others: the shared-memory and ibverbs
 * transports open their bootstrap and liveness connections through these
 * calls, then drive them from their own progress(). Only the transports'
 * files include this header; the engine sees none of it.
 */
#ifndef WEFT_TRANSPORT_TCP_BOOT_H
#define WEFT_TRANSPORT_TCP_BOOT_H

#include "transport/transport.h"

/* - weft__tcp_create_wires: as weft__tcp_ops.create; the caller picks the
 *   wires per link and the sink in p. The wires
 *   are numbered as create numbers them: per peer, the links joining the
 *   two hosts in hostfile order (or loopback), `wires` on each.
 * - weft__tcp_poll: one pass that never blocks: writes queued sends,
 *   hands read bytes to posted receives, runs ready callbacks. Returns 1 if
 *   anything happened (a completion, a wake()), 0 if not, or the
 *   transport's error (negative).
 * - weft__tcp_fd / weft__tcp_timeout: a file descriptor that becomes
 *   readable when the TCP side has work, and the longest a caller may sleep
 *   on it (ms, -1: no limit; 0: call weft__tcp_poll first), as libuv's
 *   uv_backend_fd and uv_backend_timeout. wake() makes the fd readable. */
int weft__tcp_create_wires(const weft__tp_params *p, weft__tp **out);
int weft__tcp_poll(weft__tp *tp);
/* After the TCP side failed: the peer whose closed or reset wire failed
 * it, or -1 where the failure was not a peer's leaving (or none). */
int weft__tcp_lost_peer(weft__tp *tp);
int weft__tcp_fd(weft__tp *tp);
int weft__tcp_timeout(weft__tp *tp);
/* A peer's leaving, noticed without failing anything: the count of
 * connections whose stream ended (the peer closed or reset it), which
 * changes when one more ends, and whether one of peer's has. A close only
 * fails the TCP side once a receive posted on that connection wants more
 * than arrived, or a send is posted to it. */
unsigned weft__tcp_ends(weft__tp *tp);
int weft__tcp_peer_ended(weft__tp *tp, int peer);
/* Whether wire w to peer is up now (not paused to resume, nor closing),
 * so that what is sent on it goes at once. */
int weft__tcp_wire_ready(weft__tp *tp, int peer, int w);
/* ... and, where this end dialled it, runs over its own link (not resumed
 * over another): the link carries traffic both ways again. */
int weft__tcp_wire_home(weft__tp *tp, int peer, int w);
/* Whether peer has closed or reset a connection, asking the kernel now
 * (one poll() per connection, no completion runs): for a post, which must
 * not run progress. */
int weft__tcp_peer_hup(weft__tp *tp, int peer);
/* Whether this rank waits on the TCP side for something from peer (a
 * receive wanted or a send queued on one of its data wires), or, where
 * peer is -1, for a relayed message (a relay receive posted): after the
 * TCP side failed, nothing of it can come any more. */
int weft__tcp_waits(weft__tp *tp, int peer);

#endif
