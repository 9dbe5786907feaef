/*
 * The non-blocking test cases (nb_cases.h) as a plain weft program, for
 * ranks started by weftrun (CI runs it under ThreadSanitizer, which
 * Criterion cannot run under). `nbprog MODE`, MODE one of every,
 * sequence, large, pipeline, threads, order (receives posted before
 * sends, collectives between them, overlapping buffers), random (random
 * sequences of messages and collectives), callbacks (weft_test from
 * inside a callback), all. Exits 0 when every case passed on this rank.
 *
 * The modes order, random and callbacks set a deadline of
 * NBPROG_ORDER_TIMEOUT_MS per operation (weft_set_timeout), so that a
 * receive that holds back the send it needs fails, naming itself, rather
 * than waiting for weftrun's --timeout-ms; they run last in `all`.
 */
#define _GNU_SOURCE
#include <stdio.h>
#include <string.h>

#include "harness.h"
#include "nb_cases.h"
#include "weft.h"

/* Ample under ThreadSanitizer on 2 cores for what these modes move; an
 * operation that waits for something that never comes fails after it. */
#define NBPROG_ORDER_TIMEOUT_MS 10000

static int mode_is(const char *mode, const char *name)
{
    return strcmp(mode, "all") == 0 || strcmp(mode, name) == 0;
}

int main(int argc, char **argv)
{
    const char *mode = argc > 1 ? argv[1] : "all";
    int all = strcmp(mode, "all") == 0, fail = 0, rc;
    weft_comm *c;

    if ((rc = weft_init(&c)) != WEFT_OK) {
        fprintf(stderr, "nbprog: weft_init: %s: %s\n", weft_err_name(rc),
                weft_last_error(NULL));
        return 1;
    }
    if (!fail && (all || strcmp(mode, "every") == 0))
        fail = nb_every_op(c);
    for (uint64_t seed = 1;
         !fail && (all || strcmp(mode, "sequence") == 0) && seed <= 6; seed++)
        fail = nb_sequence(c, seed, (int)(seed % 2));
    if (!fail && (all || strcmp(mode, "large") == 0))
        fail = nb_large(c);
    if (!fail && (all || strcmp(mode, "pipeline") == 0))
        fail = nb_pipeline(c);
    if (!fail && (all || strcmp(mode, "threads") == 0))
        fail = nb_threads(c);
    if (!fail &&
        (mode_is(mode, "order") || mode_is(mode, "random") ||
         mode_is(mode, "callbacks")) &&
        (rc = weft_set_timeout(c, NBPROG_ORDER_TIMEOUT_MS)) != WEFT_OK)
        fail = mp_report_rc(c, "weft_set_timeout", rc);
    if (!fail && mode_is(mode, "order"))
        fail = nb_irecv_first(c) || nb_ring_exchange(c) || nb_coll_between(c) ||
               nb_hazards(c);
    for (uint64_t seed = 1; !fail && mode_is(mode, "random") && seed <= 8;
         seed++)
        fail = nb_random_p2p(c, seed);
    if (!fail && mode_is(mode, "callbacks"))
        fail = nb_callback_state(c);
    if ((rc = weft_finalize(c)) != WEFT_OK)
        fail = 1;
    if (!fail)
        printf("nbprog %s: passed\n", mode);
    return fail;
}
