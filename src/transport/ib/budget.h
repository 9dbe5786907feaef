/*
 * What the ibverbs transport asks of one RDMA device port, checked against
 * the device's limits before anything is created on it: a pure function, so
 * that it is tested without a device.
 *
 * Every rank of a host builds the same wires (one queue pair per wire, two
 * memory regions per queue pair, one protection domain and one completion
 * queue per device it uses), so the ranks of a host that share a device need
 * local_ranks times what one rank needs of it; the per-queue-pair and
 * per-completion-queue limits are one rank's own.
 */
#ifndef WEFT_IB_BUDGET_H
#define WEFT_IB_BUDGET_H

#include <stddef.h>
#include <stdint.h>

/* The limits of struct ibv_device_attr that the transport depends on. */
typedef struct {
    int max_qp, max_mr, max_cq, max_pd, max_cqe, max_qp_wr;
    uint64_t max_mr_size;
} weft__ib_limits;

/* One rank's needs on one device port. */
typedef struct {
    int nqp;         /* queue pairs: one per wire on this device */
    int sq_depth;    /* work requests per send queue */
    int rq_depth;    /* work requests per receive queue */
    size_t ring;     /* bytes of each registered ring (slots * slot bytes) */
    int local_ranks; /* ranks of this host that use the device too (>= 1) */
} weft__ib_needs;

/* WEFT_OK (0) when the device holds local_ranks ranks' needs; else
 * WEFT_ECONFIG with a message naming the device, the limit, the figures and
 * what to change, written to msg. */
int weft__ib_budget(const weft__ib_limits *lim, const weft__ib_needs *need,
                    int rank, const char *dev, char *msg, size_t msglen);

#endif
