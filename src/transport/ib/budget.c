/* Device budgets of the ibverbs transport; see budget.h. */
#include "transport/ib/budget.h"

#include "weft.h"

#include <stdio.h>

/* "this rank needs" or "the 3 ranks of this host need", for messages. */
static void who(char *out, size_t len, int local)
{
    if (local > 1)
        snprintf(out, len, "the %d ranks of this host need", local);
    else
        snprintf(out, len, "this rank needs");
}

int weft__ib_budget(const weft__ib_limits *lim, const weft__ib_needs *need,
                    int rank, const char *dev, char *msg, size_t msglen)
{
    const int local = need->local_ranks > 0 ? need->local_ranks : 1;
    const long qps = (long)local * need->nqp;
    const long cqe = (long)need->nqp * (need->sq_depth + need->rq_depth);
    const int depth =
        need->sq_depth > need->rq_depth ? need->sq_depth : need->rq_depth;
    const char *fewer = local > 1 ? " or fewer ranks per host" : "";
    char w[48];

    who(w, sizeof w, local);
    if (qps > lim->max_qp) {
        snprintf(msg, msglen,
                 "rank %d: RDMA device %s: %s %ld queue pairs on it (%d per "
                 "rank, one per wire) but the device allows %d (max_qp); use "
                 "fewer wires%s",
                 rank, dev, w, qps, need->nqp, lim->max_qp, fewer);
        return WEFT_ECONFIG;
    }
    if (2 * qps > lim->max_mr) {
        snprintf(msg, msglen,
                 "rank %d: RDMA device %s: %s %ld memory regions on it (two "
                 "per wire) but the device allows %d (max_mr); use fewer "
                 "wires%s",
                 rank, dev, w, 2 * qps, lim->max_mr, fewer);
        return WEFT_ECONFIG;
    }
    if (local > lim->max_cq || local > lim->max_pd) {
        snprintf(msg, msglen,
                 "rank %d: RDMA device %s: %s %d completion queues and "
                 "protection domains on it (one each per rank) but the "
                 "device allows %d and %d (max_cq, max_pd); run fewer ranks "
                 "per host",
                 rank, dev, w, local, lim->max_cq, lim->max_pd);
        return WEFT_ECONFIG;
    }
    if (cqe > lim->max_cqe) {
        snprintf(msg, msglen,
                 "rank %d: RDMA device %s: this rank needs a completion "
                 "queue of %ld entries but the device allows %d (max_cqe); "
                 "lower WEFT_IB_SLOTS or use fewer wires",
                 rank, dev, cqe, lim->max_cqe);
        return WEFT_ECONFIG;
    }
    if (depth > lim->max_qp_wr) {
        snprintf(msg, msglen,
                 "rank %d: RDMA device %s: this rank needs %d work requests "
                 "per queue pair but the device allows %d (max_qp_wr); lower "
                 "WEFT_IB_SLOTS",
                 rank, dev, depth, lim->max_qp_wr);
        return WEFT_ECONFIG;
    }
    if ((uint64_t)need->ring > lim->max_mr_size) {
        snprintf(msg, msglen,
                 "rank %d: RDMA device %s: a ring of %zu bytes is larger "
                 "than the device registers (%llu, max_mr_size); lower "
                 "WEFT_IB_SLOTS or WEFT_IB_SLOT_BYTES",
                 rank, dev, need->ring, (unsigned long long)lim->max_mr_size);
        return WEFT_ECONFIG;
    }
    return WEFT_OK;
}
