/*
 * The communicator: what the public entry points keep per communicator
 * besides what the engine and the algorithms see of it (weft__ctx,
 * engine.h), and the requests that carry its operations (request.c, their
 * scheduler sched.c). Only the core includes this.
 */
#ifndef WEFT_INTERNAL_H
#define WEFT_INTERNAL_H

#include "coll/coll.h"
#include "core/tune.h"
#include "topo/topo.h"

#include <pthread.h>

struct weft__tp_params;
struct weft__sched;

struct weft_comm {
    weft__config cfg;            /* from the environment and the hostfile */
    weft__ctx x;                 /* what the engine and the algorithms see */
    uint64_t coll_seq;           /* collectives posted on this communicator */
    struct weft__tp_params *tpp; /* what the transport was created with */
    struct weft__sched *s;       /* its requests and progress thread */
    int relays;      /* some peer has no wires: this rank may forward */
    weft__tune tune; /* which algorithm runs each collective (tune.h) */
    char *info;      /* weft_info's text, made on its first call */
    /* An operation has returned the failure's code (every later one
     * returns WEFT_EABORTED); 0 while a failure found between operations
     * (a relay's) has not been reported yet. */
    atomic_int reported;
    /* Batches of small all_reduces (sched.c), touched by the thread
     * that drives: how many operations the next one takes, as the ranks
     * agreed in the last batchable call (0: not agreed), and the buffer
     * that holds a batch's inputs end to end. */
    uint32_t batch_next;
    char *batch_buf;
    size_t batch_bytes;
    /* Per rank: its rank in the communicator weft_init made, which this
     * one was shrunk or split from (weft_comm_origin_rank), and its
     * process id (compared where two ranks share a host: shrink.c). */
    int *origin;
    int32_t *pids;
    unsigned splits; /* weft_comm_split calls on this communicator */
    int derived;     /* made by weft_comm_shrink or weft_comm_split */
};

/* The socket of l, which is freed (-1 for NULL): the caller closes it. */
int weft__listener_take(weft_listener *l);
/* The local port fd is bound to, or -1. */
int weft__fd_port(int fd);

/* An operation as its entry point checked it: what runs it and what every
 * rank's call must agree on. */
typedef struct weft__opdesc {
    int kind; /* WEFT__OP_* */
    const char *name;
    int redop;    /* -1 where the call has none */
    weft__args a; /* a.root: -1 where the call has none */
    weft__algo_fn post;
    int batch; /* consecutive calls may run as one (tune.h) */
    int tag;   /* point to point: the messages' tag (weft_isend_tag) */
} weft__opdesc;

/* ---- comm.c ---- */

/* Sets up c's context for the configuration in c->cfg: the fields of
 * c->x, the per-rank arrays (origin: the identity), the requests. */
int weft__comm_ctx_init(weft_comm *c, int timeout_ms);

/* Connects c (its context set up) to its peers, listening on a copy of
 * listen_fd where it is >= 0, and agrees on the settings, by deadline_ms.
 * On failure init's thread-local message (weft_last_error(NULL)) says
 * why; free c with weft__comm_discard. */
int weft__comm_start(weft_comm *c, int listen_fd, uint64_t deadline_ms);

/* Frees c and everything it holds (weft_finalize). NULL is a no-op. */
void weft__comm_discard(weft_comm *c);

/* ---- settings.c ---- */

/* Compares the settings every rank must give alike (and the tuning table)
 * across c's ranks, by the connect deadline: WEFT_OK where all agree and
 * none failed on its own; else the same WEFT_ECONFIG on every rank,
 * errmsg naming the setting or the rank's own error (own_rc non-zero:
 * this rank's, in errmsg on entry), or the error that stopped the
 * comparison. */
int weft__settings_agree(weft_comm *c, int own_rc, uint64_t deadline_ms,
                         char *errmsg, size_t errlen);

/* ---- request.c, sched.c ---- */

/* Sets up c's requests (the progress thread starts when first needed). */
int weft__sched_init(weft_comm *c);

/* Starts the progress thread now (relaying ranks: see sched.c). */
int weft__sched_relays(weft_comm *c);

/* Runs d on c in post order: with req NULL, as a blocking call (returns
 * its result); else posts it and returns WEFT_OK with *req set. */
int weft__submit(weft_comm *c, const weft__opdesc *d, weft_request **req);

/* A request that is complete at once with result rc (an operation that
 * moves nothing: count 0, one rank). */
int weft__request_done(weft_comm *c, int rc, weft_request **req);

/* Aborts every pending request (their callbacks run), stops the progress
 * thread and detaches the requests from c, which may then be freed. */
void weft__sched_fini(weft_comm *c);

/* Wakes whatever runs c's operations (weft_abort). */
void weft__sched_wake(weft_comm *c);

#endif
