/*
 * The all_to_allv's agreement on its counts; see coll.h.
 *
 * A pair whose counts differ (rank i sends k elements to j, which expects
 * m != k from i) cannot be found by the data's headers alone: a half of
 * no bytes is no lane at all, and the end that expects nothing would
 * return WEFT_OK. So every rank first gathers every rank's send and
 * receive counts (2n numbers each, a small all_gather that compares the
 * calls like any other pass), and every rank checks every pair on the
 * same numbers: all fail with WEFT_EMISMATCH, or none. The ring's lanes
 * need the counts of the blocks they pass on anyway.
 */
#include "coll/coll.h"

#include <stdint.h>
#include <stdlib.h>

int weft__all_to_allv_counts(weft__task *t, weft__algo_fn gather,
                             weft__task_fn next)
{
    const int n = t->g.n;
    const size_t row = 2 * (size_t)n;
    uint64_t *all = malloc((size_t)(n + 1) * row * sizeof *all), *mine;
    weft__args g = t->a;
    int rc;

    if (all == NULL)
        return weft__note(t->c, WEFT_ENOMEM,
                          "rank %d: %s: out of memory for the counts",
                          t->c->rank, t->k->name);
    t->owned = all;
    mine = all + (size_t)n * row;
    for (int p = 0; p < n; p++) {
        mine[p] = t->a.sendcounts[p];
        mine[n + p] = t->a.recvcounts[p];
    }
    g.sendbuf = mine;
    g.recvbuf = all;
    g.count = row;
    g.dtype = WEFT_UINT64;
    g.op = WEFT_SUM;
    g.root = -1;
    if ((rc = weft__task_sub(t, &g, gather)) != WEFT_OK)
        return rc;
    t->next = next;
    return WEFT_OK;
}

int weft__all_to_allv_check(weft__task *t)
{
    const int n = t->g.n;
    const size_t row = 2 * (size_t)n;
    const uint64_t *all = t->owned;

    for (int i = 0; i < n; i++)
        for (int j = 0; j < n; j++)
            if (all[(size_t)i * row + (size_t)j] !=
                all[(size_t)j * row + (size_t)n + (size_t)i])
                return weft__call_fail(
                    t->c, WEFT_EMISMATCH,
                    "rank %d: %s: rank %d sends %llu elements to rank %d, "
                    "which expects %llu from it: every send count must be "
                    "its peer's receive count",
                    t->c->rank, t->k->name, i,
                    (unsigned long long)all[(size_t)i * row + (size_t)j], j,
                    (unsigned long long)
                        all[(size_t)j * row + (size_t)n + (size_t)i]);
    return WEFT_OK;
}

size_t weft__all_to_all_bytes(const weft__task *t, int from, int to)
{
    const size_t es = weft_dtype_size(t->a.dtype);
    const uint64_t *all = t->owned;

    if (t->a.sendcounts == NULL)
        return t->a.count * es;
    return (size_t)all[(size_t)from * 2 * (size_t)t->g.n + (size_t)to] * es;
}
