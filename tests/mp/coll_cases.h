/*
 * The collective test cases: every collective, every dtype of interest,
 * counts around the frame size, in place and out of place, checked
 * against a reference that each rank computes itself, with results
 * bitwise identical across ranks. Run by test_collectives (ranks forked
 * by the harness) and by collprog (ranks started by weftrun, across
 * network namespaces or in the RDMA guest).
 */
#ifndef COLL_CASES_H
#define COLL_CASES_H

#include "weft.h"

struct coll_ctx {
    weft_comm *c;
    int rank;
    int nranks;
    unsigned long ncases;
    unsigned long nbarriers;
};

/* Runs every case on x->c; 0 when all passed, else 1 (after logging what
 * failed). Counts the cases passed in x->ncases. */
int coll_run_cases(struct coll_ctx *x);

#endif
