/*
 * Non-blocking test cases that run on any communicator: run by
 * test_nonblocking (ranks forked by the harness) and by nbprog (ranks
 * started by weftrun, which CI also runs under ThreadSanitizer). Each
 * returns 0 when it passed on this rank, else 1 after logging why.
 */
#ifndef NB_CASES_H
#define NB_CASES_H

#include <stdatomic.h>
#include <stdint.h>

#include "weft.h"

/* Every operation posted non-blocking, against the same operation run
 * blocking, bit for bit, at a few counts. */
int nb_every_op(weft_comm *c);

/* A random sequence (seeded) of up to 64 operations on one pool of memory
 * whose buffers overlap (in place; one's output another's input), posted
 * at once and waited with weft_wait_all, against the same sequence run
 * blocking; then sends whose buffer is rewritten right after their wait.
 * With reduces, mostly small all_reduces, a third of them reading the
 * previous one's output (what weft runs in batches, and what splits
 * them). */
int nb_sequence(weft_comm *c, uint64_t seed, int reduces);

/* Large all_reduces and a reduce_scatter (whole frames, handed to the
 * reducer thread by default, and short last ones) posted together, each
 * reading or writing what an earlier one writes or reads, against the
 * same operations run blocking, bit for bit. */
int nb_large(weft_comm *c);

/* A pipeline: rank r receives micro-batches from r-1, computes, sends to
 * r+1, with the next receive posted while it computes; the last rank
 * checks what arrives. */
int nb_pipeline(weft_comm *c);

/* One thread posts while a second waits for and frees the requests (some
 * freed while pending, some with callbacks), results checked. */
int nb_threads(weft_comm *c);

/* ---- Order (API.md, "Non-blocking operations", the Order bullet) ----
 *
 * Point-to-point requests progress without waiting for earlier pending
 * ones: a posted receive never holds back a later send, not even with
 * collectives posted between them, and a blocking collective completes
 * while a receive is pending. Messages between a pair match in post
 * order. An operation whose buffers overlap an earlier pending one's
 * still waits for it. None of these cases sets a deadline: the caller
 * does (weft_set_timeout), so that one that hangs fails with
 * WEFT_ETIMEDOUT, naming the request. Every rank must run the same
 * cases in the same order (they post collectives); any number of ranks
 * from 2. Each ends with a barrier, so that no rank leaves while a
 * message relayed through it is on its way. */

/* Every rank posts receives from every other rank first, then the
 * sends to it (then, a second round, receive and send interleaved
 * message by message): six messages each way per pair, of 1 to 2^20 + 3
 * floats, two of them of the same size; each checked bit for bit
 * against what its sender put in it, so a message matched out of order
 * shows. */
int nb_irecv_first(weft_comm *c);

/* A ring exchange: each rank posts irecv from its left, irecv from its
 * right, isend to its right, isend to its left, then waits for the four
 * (1 float, 4096, 2^19 + 3). */
int nb_ring_exchange(weft_comm *c);

/* Collectives posted or called between point-to-point posts (receive
 * from the left, send to the right): irecv, iall_reduce, isend; isend,
 * ibarrier, irecv; irecv, blocking all_reduce, isend; irecv, blocking
 * send; several collectives of every kind between; every result
 * checked. */
int nb_coll_between(weft_comm *c);

/* Overlapping buffers between pending operations: a send of X then a
 * receive into X sends the old X; a receive into X then a send of X
 * forwards what arrived; an all_reduce writing X then a send of X; a
 * send of X then an all_reduce writing X; a receive into X then an
 * all_reduce reading X (or writing it); an all_reduce reading X then a
 * receive into X; two receives into X (the later one's data stays).
 * Each posted so that it cannot deadlock under the contract; results
 * computed locally and compared bit for bit (at 5 and 70001 floats). The
 * cases whose sends (or a collective) come first run before those whose
 * receives do. */
int nb_hazards(weft_comm *c);

/* A random sequence (from seed, the same plan on every rank) of messages
 * between random pairs of ranks (uint8, int32, float32 or float64, 1
 * element to 300000) and collectives (all_reduce, all_gather,
 * reduce_scatter, broadcast, barrier; a quarter of them called
 * blocking), on buffers of their own. Each rank posts its part in an
 * order of its own (its rng): sends to a peer, and receives from it,
 * keep the plan's order, collectives keep theirs, anything else goes.
 * Waited for with weft_wait_all, one weft_wait at a time in a random
 * order, or by polling weft_test; every buffer checked against what the
 * plan says. */
int nb_random_p2p(weft_comm *c, uint64_t seed);

/* ---- Callbacks (API.md: a request is complete, with its result, before
 * its callback runs) ---- */

/* What a callback (nb_state_cb, its arg a nb_cb_seen) saw: how often it
 * ran, its result argument, and what weft_test said of its own request
 * from inside it. */
typedef struct {
    atomic_int calls;
    atomic_int result;
    atomic_int test_rc;
    atomic_int test_done;
} nb_cb_seen;

/* Clears n records. */
void nb_cb_reset(nb_cb_seen *seen, int n);
/* A callback that calls weft_test on its own request and records it. */
void nb_state_cb(weft_request *req, int result, void *arg);
/* 0 when each of the n records ran once, with result `want` (any result
 * when want is 1), and weft_test said done with that same result; else 1
 * after a line per wrong record (up to 5) and one saying how many were
 * right. what names the case; group(i) names how record i's callback ran
 * (NULL: none). */
int nb_cb_check(const nb_cb_seen *seen, int n, int want, const char *what,
                const char *(*group)(int i));

/* Forty callbacks, each calling weft_test on its own request: run by the
 * progress thread, by the thread waiting in weft_wait, by a second thread
 * waiting in weft_wait_all, at once when registered after completion, and
 * on isend/irecv requests. */
int nb_callback_state(weft_comm *c);

#endif
