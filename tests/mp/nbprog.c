/*
 * The non-blocking test cases (nb_cases.h) as a plain weft program, for
 * ranks started by weftrun (CI runs it under ThreadSanitizer, which
 * Criterion cannot run under). `nbprog MODE`, MODE one of every,
 * sequence, large, pipeline, threads, all. Exits 0 when every case passed on
 * this rank.
 */
#define _GNU_SOURCE
#include <stdio.h>
#include <string.h>

#include "harness.h"
#include "nb_cases.h"
#include "weft.h"

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
    if ((rc = weft_finalize(c)) != WEFT_OK)
        fail = 1;
    if (!fail)
        printf("nbprog %s: passed\n", mode);
    return fail;
}
