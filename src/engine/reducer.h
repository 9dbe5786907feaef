/*
 * The reducer: a thread of the engine that reduces received frames while
 * the thread that drives the transport keeps moving bytes.
 *
 * Over TCP a rank's time goes to three things that, on one thread, follow
 * each other: the kernel's copies into and out of the sockets, and the
 * reduction of each received frame. While the driver reduces, nobody reads
 * or writes its sockets, so its neighbours' writes stall on full buffers
 * and its own sends wait. Handing the reduction to a second thread lets the
 * driver go back into the transport at once; the frame counts as received
 * (its bytes may be sent on, its staging slot reposted) only once the
 * reducer has finished it and the driver has taken it back.
 *
 * Jobs run one at a time, in the order they were posted, so jobs posted for
 * one wire finish in that wire's order. The engine owns every job's memory;
 * the reducer only links it while it is queued, running or finished.
 *
 * Only engine.c includes this header.
 */
#ifndef WEFT_ENGINE_REDUCER_H
#define WEFT_ENGINE_REDUCER_H

#include "base/base.h"

#include <stddef.h>

/* One frame to reduce: dst = a OP b (count elements), or nothing at all
 * where count is 0 (a frame that only keeps its wire's order). */
typedef struct weft__rjob {
    struct weft__rjob *next; /* the reducer's, while the job is posted */
    void *dst;
    const void *a, *b;
    size_t count;
    weft_dtype dtype;
    weft_redop op;
} weft__rjob;

typedef struct weft__reducer weft__reducer;

/* Starts a reducer thread. wake(arg) is called from that thread each time
 * a job has finished (after it is in the list weft__reducer_take returns),
 * to make the driver's wait in the transport return. Returns WEFT_ENOMEM
 * when the thread or its state cannot be made. */
int weft__reducer_create(void (*wake)(void *arg), void *arg,
                         weft__reducer **out);

/* Stops and joins the thread; jobs still queued are dropped unrun. NULL is
 * a no-op. */
void weft__reducer_destroy(weft__reducer *rd);

/* Queues j behind the jobs already posted. Never blocks on a job; j must
 * stay valid until weft__reducer_take returns it or weft__reducer_cancel
 * returns. */
void weft__reducer_post(weft__reducer *rd, weft__rjob *j);

/* The jobs finished since the last call, oldest first (linked by next),
 * or NULL. Never blocks on a job; costs an atomic load when none is
 * finished. */
weft__rjob *weft__reducer_take(weft__reducer *rd);

/* Forgets every job: queued ones are dropped unrun, the running one is
 * waited for (a reduction takes bounded time, whatever the peers do), and
 * finished ones are dropped. When it returns, the reducer touches no job
 * and no buffer, and calls wake() no more until the next post. */
void weft__reducer_cancel(weft__reducer *rd);

#endif
