/*
 * Non-blocking test cases that run on any communicator: run by
 * test_nonblocking (ranks forked by the harness) and by nbprog (ranks
 * started by weftrun, which CI also runs under ThreadSanitizer). Each
 * returns 0 when it passed on this rank, else 1 after logging why.
 */
#ifndef NB_CASES_H
#define NB_CASES_H

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

#endif
