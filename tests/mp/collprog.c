/*
 * The collective test cases (coll_cases.h) as a plain weft program, for
 * ranks started by weftrun: across network namespaces
 * (tests/multihost/ring-test) and in the RDMA guest. Exits 0 when every
 * case passed on this rank.
 *
 * The barrier case counts arrivals in memory that the ranks share: the
 * file MP_SHM_FILE names (so all ranks run on one machine), which the
 * caller creates empty.
 */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>

#include "coll_cases.h"
#include "harness.h"
#include "weft.h"

int main(void)
{
    struct coll_ctx x = {0};
    int rc, fail;

    if (getenv("MP_SHM_FILE") == NULL) {
        fprintf(stderr, "collprog: set MP_SHM_FILE to a file every rank "
                        "can map (it counts barrier arrivals)\n");
        return 2;
    }
    if ((rc = weft_init(&x.c)) != WEFT_OK) {
        fprintf(stderr, "collprog: weft_init: %s: %s\n", weft_err_name(rc),
                weft_last_error(NULL));
        return 1;
    }
    x.rank = weft_rank(x.c);
    x.nranks = weft_size(x.c);
    double t0 = mp_now_ms();
    fail = coll_run_cases(&x);
    if (!fail)
        printf("%lu cases passed in %.0f ms\n", x.ncases, mp_now_ms() - t0);
    rc = weft_finalize(x.c);
    if (rc != WEFT_OK) {
        fprintf(stderr, "collprog: weft_finalize: %s\n", weft_err_name(rc));
        fail = 1;
    }
    return fail;
}
