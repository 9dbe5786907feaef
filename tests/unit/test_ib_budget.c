/* The ibverbs transport's device budget (src/transport/ib/budget.c): what
 * the ranks of a host put on one device port, against its limits. */
#include "transport/ib/budget.h"
#include "weft.h"

#include <criterion/criterion.h>
#include <string.h>

/* Limits of a small device: every check below sits just on the edge. */
static const weft__ib_limits small = {
    .max_qp = 12,
    .max_mr = 24,
    .max_cq = 4,
    .max_pd = 4,
    .max_cqe = 600,
    .max_qp_wr = 100,
    .max_mr_size = 1 << 20,
};

/* One rank: 3 wires, queues of 40 and 60, a 1 MiB ring. */
static weft__ib_needs one_rank(void)
{
    weft__ib_needs n = {.nqp = 3,
                        .sq_depth = 40,
                        .rq_depth = 60,
                        .ring = 1 << 20,
                        .local_ranks = 1};
    return n;
}

static char msg[512];

static int check(weft__ib_needs n)
{
    memset(msg, 0, sizeof msg);
    return weft__ib_budget(&small, &n, 2, "mlx5_1", msg, sizeof msg);
}

Test(ib_budget, fits_on_the_edge)
{
    weft__ib_needs n = one_rank();

    n.local_ranks = 4; /* 12 QPs, 24 MRs, 4 CQs and PDs: all at the limit */
    cr_assert_eq(check(n), WEFT_OK, "%s", msg);
    cr_assert_str_empty(msg);
}

Test(ib_budget, queue_pairs_summed_over_the_host)
{
    weft__ib_needs n = one_rank();

    n.nqp = 4; /* 4 ranks x 4 wires = 16 > 12 */
    n.local_ranks = 4;
    cr_assert_eq(check(n), WEFT_ECONFIG);
    cr_assert(strstr(msg, "rank 2: RDMA device mlx5_1") != NULL, "%s", msg);
    cr_assert(strstr(msg, "the 4 ranks of this host need 16 queue pairs") !=
                  NULL,
              "%s", msg);
    cr_assert(strstr(msg, "(max_qp)") != NULL, "%s", msg);
    cr_assert(strstr(msg, "fewer ranks per host") != NULL, "%s", msg);

    /* The same rank alone on its host fits. */
    n.local_ranks = 1;
    cr_assert_eq(check(n), WEFT_OK, "%s", msg);
}

Test(ib_budget, one_rank_alone_says_this_rank)
{
    weft__ib_needs n = one_rank();

    n.nqp = 13;
    cr_assert_eq(check(n), WEFT_ECONFIG);
    cr_assert(strstr(msg, "this rank needs 13 queue pairs") != NULL, "%s", msg);
    cr_assert(strstr(msg, "ranks per host") == NULL, "%s", msg);
}

Test(ib_budget, memory_regions)
{
    weft__ib_limits lim = small;
    weft__ib_needs n = one_rank();

    lim.max_mr = 11; /* 2 ranks x 3 wires x 2 rings = 12 */
    n.local_ranks = 2;
    cr_assert_eq(weft__ib_budget(&lim, &n, 0, "rxe0", msg, sizeof msg),
                 WEFT_ECONFIG);
    cr_assert(strstr(msg, "12 memory regions") != NULL, "%s", msg);
    cr_assert(strstr(msg, "(max_mr)") != NULL, "%s", msg);
}

Test(ib_budget, completion_queues_and_protection_domains)
{
    weft__ib_needs n = one_rank();

    n.nqp = 2;
    n.local_ranks = 5; /* 10 QPs fit, 5 CQs do not */
    cr_assert_eq(check(n), WEFT_ECONFIG);
    cr_assert(strstr(msg, "5 completion queues") != NULL, "%s", msg);
    cr_assert(strstr(msg, "max_cq, max_pd") != NULL, "%s", msg);
}

Test(ib_budget, completion_queue_entries_are_per_rank)
{
    weft__ib_needs n = one_rank();

    /* 3 x (40 + 60) = 300 per rank: 4 ranks do not add up against it. */
    n.local_ranks = 4;
    cr_assert_eq(check(n), WEFT_OK, "%s", msg);
    n.local_ranks = 1;
    n.rq_depth = 100;
    n.sq_depth = 100; /* 3 x 200 = 600: fits */
    cr_assert_eq(check(n), WEFT_OK, "%s", msg);
    n.nqp = 4; /* 4 x 200 = 800 > 600 (and 4 QPs fit) */
    cr_assert_eq(check(n), WEFT_ECONFIG);
    cr_assert(strstr(msg, "completion queue of 800 entries") != NULL, "%s",
              msg);
    cr_assert(strstr(msg, "WEFT_IB_SLOTS") != NULL, "%s", msg);
}

Test(ib_budget, queue_depth)
{
    weft__ib_needs n = one_rank();

    n.sq_depth = 101;
    n.rq_depth = 50;
    cr_assert_eq(check(n), WEFT_ECONFIG);
    cr_assert(strstr(msg, "101 work requests per queue pair") != NULL, "%s",
              msg);
    cr_assert(strstr(msg, "(max_qp_wr)") != NULL, "%s", msg);
}

Test(ib_budget, ring_size)
{
    weft__ib_needs n = one_rank();

    n.ring = (1 << 20) + 1;
    cr_assert_eq(check(n), WEFT_ECONFIG);
    cr_assert(strstr(msg, "a ring of 1048577 bytes") != NULL, "%s", msg);
    cr_assert(strstr(msg, "WEFT_IB_SLOT_BYTES") != NULL, "%s", msg);
}
