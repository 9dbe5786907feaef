/*
 * Tasks: one public call in progress. An algorithm posts a task (starts
 * its first engine pass, or a sub-task) and says what runs next; progress
 * tests what is in flight and, once it completed, runs the next part,
 * without ever waiting. All of a task's state lives in the task, so a
 * blocking call (post, then wait) and a non-blocking one (post now,
 * progress later, from any loop) run the same code.
 */
#ifndef WEFT_TASK_H
#define WEFT_TASK_H

#include "engine/engine.h"

/* A call's arguments, as the public entry point took them. */
typedef struct weft__args {
    const void *sendbuf;
    void *recvbuf; /* broadcast: the buffer */
    size_t count;  /* reduce_scatter: the count each rank receives */
    weft_dtype dtype;
    weft_redop op;
    int root;
    int dst, src; /* point to point: the peers (-1: that half is out;
                     src WEFT__SRC_ANY: from whichever peer sends first;
                     the messages' tag is the call's, weft__call.tag) */
    /* all_to_allv: per peer, the elements sent to it and received from
     * it, and where they start in sendbuf and recvbuf (elements; borrowed
     * from the caller as the buffers are); NULL for every other call. */
    const size_t *sendcounts, *sdispls, *recvcounts, *rdispls;
} weft__args;

/* weft__args.src of a receive from any source (WEFT_ANY_SOURCE). */
#define WEFT__SRC_ANY (-2)

typedef struct weft__task weft__task;

/* One part of a task: starts what it moves (weft__task_pass or
 * weft__task_sub) and names the part that runs once that completed
 * (t->next), or finishes. Returns WEFT_OK or the error; never waits. */
typedef int (*weft__task_fn)(weft__task *t);

/* An algorithm: posts itself on t (t->c, t->k and t->a are set). The ring
 * (ring/), the mesh (mesh/) and the collectives built on them (coll/) all
 * have this signature; the tuning table (core/tune.c) picks among them. */
typedef weft__task_fn weft__algo_fn;

struct weft__task {
    weft__ctx *c;
    weft__call *k; /* its call: deadline, and what ranks match on */
    weft__args a;
    /* The ranks the algorithm runs among (engine.h): the whole job unless
     * the task is one phase of a hierarchical call. Its blocks, chunks and
     * root are numbered by member. */
    weft__group g;
    weft__task_fn next; /* once pass (or sub) completed; NULL: done */
    weft__pass *pass;   /* in flight, or NULL */
    weft__task *sub;    /* a task this one waits for, or NULL */
    /* The algorithm's own state between its parts. */
    int round;
    char *scratch;
    int via_scratch;
    /* Memory of the task's own, freed when it ends (weft__task_end): what
     * must not be the context's scratch, which the collective running
     * beside a point-to-point task uses. */
    void *owned;
};

/* Starts a task of call k with arguments a on c, among the whole job
 * (nothing posted yet). */
void weft__task_init(weft__task *t, weft__ctx *c, weft__call *k,
                     const weft__args *a);

/* Starts op as t's pass (see weft__pass_start), its checks among t's
 * group. */
int weft__task_pass(weft__task *t, weft__op *op, const weft__relay *relay);

/* Starts a sub-task of the same call on arguments a with algorithm post,
 * among t's group; t waits for it as for a pass. */
int weft__task_sub(weft__task *t, const weft__args *a, weft__task_fn post);

/* The same among the ranks of group g instead. */
int weft__task_sub_in(weft__task *t, const weft__group *g, const weft__args *a,
                      weft__task_fn post);

/* Tests what t has in flight and runs its next parts while they complete:
 * WEFT__PENDING while something is in flight, WEFT_OK once t is done, or
 * the error that ended it (nothing is in flight then). Never waits. */
int weft__task_progress(weft__task *t);

/* The innermost pass t has in flight, or NULL. */
weft__pass *weft__task_pass_of(const weft__task *t);

/* Ends t (top-level) once weft__task_progress returned rc, done or not:
 * one still in flight is abandoned, its pass ended with rc (which fails
 * the context and shuts its transport down, so no frame refers to t's
 * buffers afterwards); its sub-tasks and own memory are freed. */
void weft__task_end(weft__task *t, int rc);

/* Progresses t until it is done or failed, sleeping in the transport in
 * between (under the call's deadline): the blocking calls' loop. */
int weft__task_wait(weft__task *t);

/* Point to point (p2p.c): posts the sendrecv of t->a: count elements of
 * sendbuf to dst while count elements from src land in recvbuf. Direct
 * wires where the peer has them, the relay where not. */
int weft__sendrecv_post(weft__task *t);

/* A receive from any source (match.c): waits for the first message of
 * t->k->tag from any peer, sets t->a.src to its sender, then receives it
 * as weft__sendrecv_post does. */
int weft__recv_any_post(weft__task *t);

#endif
