/*
 * What the requests (request.c: their set-up, posting, finalize and the
 * request API) and their scheduler (sched.c: the driver, batches,
 * completion, the progress thread) share: the scheduling state and the
 * request. Only these two include this; request.c calls into sched.c,
 * never the reverse.
 */
#ifndef WEFT_SCHED_H
#define WEFT_SCHED_H

#include "core/internal.h"

#include <stdint.h>

/* A request is queued until it starts, runs until its task ends, then
 * completes: its result is set and it counts as done for weft_test while
 * its callback runs (R_COMPLETING), and weft_wait returns once that ran
 * (R_DONE). */
enum { R_QUEUED, R_RUNNING, R_COMPLETING, R_DONE };

typedef struct weft__sched {
    pthread_mutex_t mu;
    pthread_cond_t cv;         /* completions, the driver role released, work */
    int refs;                  /* the communicator's, and each request's */
    weft_comm *c;              /* NULL once finalized */
    weft_request *head, *tail; /* pending (queued or running), post order */
    int ncoll;                 /* collectives among them */
    uint64_t posted;           /* order numbers given out */
    int driving;               /* a thread runs the engine (one at most) */
    int stop;                  /* finalize: the thread ends */
    int idle_off;              /* the transport failed: no idle polling */
    uint64_t spin_ns;          /* idle_spin's time; 0: sleep at once */
    atomic_uint kicks;         /* posts and the stop, for idle_spin */
    /* The progress thread naps (progress_main): posts need not wake it. */
    int napping;
    atomic_int has_thread;
    pthread_t thread;
    /* The driver's: requests running now (linked by act_next), and a
     * byte per peer and way for pick()'s scan. */
    weft_request *active;
    unsigned char *busy;
    weft__pass **ps; /* their passes in flight (ps_cap of them) */
    size_t ps_cap;
} weft__sched;

struct weft_request {
    weft__sched *s;
    uint64_t order; /* post order on its communicator */
    weft__opdesc d;
    int timeout_ms; /* weft_set_timeout at the post */
    uint64_t seq;   /* collectives: the communicator's count of them */
    weft__call k;
    weft__task t;
    int state;        /* R_*, under s->mu */
    atomic_uint done; /* state is R_DONE (read without the lock) */
    int result;
    int freed;   /* weft_request_free came first: freed once done */
    int waiting; /* threads in weft_wait on it */
    weft_callback cb, cb_run;
    void *cb_arg;
    weft_request *next, *prev; /* the pending queue, then a completed chain */
    /* What it reads and writes, [lo, hi) each, for the hazards between
     * pending operations (pick). */
    uintptr_t rd_lo, rd_hi, wr_lo, wr_hi;
    /* The driver's, while it runs: how many requests from this one on it
     * runs as one (a batch), what its task returned last, the next
     * running one, and the next to start. */
    uint32_t nbatch;
    uint32_t hint;
    int rc;
    weft_request *act_next, *start_next;
    /* A receive that completed with WEFT_OK: the rank its message came
     * from (weft_request_source); else -1. */
    int source;
};

/* Drops one reference (s->mu held); 1 when s is to be destroyed once the
 * lock is released. */
static inline int weft__sched_unref(weft__sched *s)
{
    return --s->refs == 0;
}

/* ---- sched.c ---- */

/* Runs d to completion on the calling thread, nothing else pending. */
int weft__sched_run_op(weft_comm *c, const weft__opdesc *d, int timeout_ms,
                       uint64_t seq, weft__call *k, weft__task *t);

/* The communicator failed and nothing runs: every queued request
 * completes with WEFT_EABORTED. */
void weft__sched_fail_queued(weft__sched *s);

/* Runs the queue until it is empty or, with `until`, until that request
 * is done (s->mu held on entry and exit; the caller set s->driving).
 * Every request that may start starts; the running ones progress
 * together, the thread sleeping in the transport while none can. */
void weft__sched_drive(weft__sched *s, weft_comm *c, const weft_request *until);

/* Starts the progress thread unless it runs (s->mu held). */
int weft__sched_thread_start(weft__sched *s);

/* Before a thread sleeps on s->cv for work (the progress thread) or for a
 * completion (weft_wait), it polls *word for a change from `seen` for
 * s->spin_ns, without the lock: waking a sleeping thread costs 10-20 us on
 * a host of many cores, more than a small operation over shared memory.
 * Only where the host has a core per thread to spare (cfg.spare_cores);
 * else the spin would take the core the other thread needs. 1 when the
 * word changed. */
int weft__sched_idle_spin(const weft__sched *s, const atomic_uint *word,
                          unsigned seen);

#endif
