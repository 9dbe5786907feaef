/*
 * The pool: helper threads that, with the calling thread, run the parts
 * of one job at a time (the one-copy all_reduce's reads and reductions,
 * coll/pull.c). A part is bounded work on memory (it never waits for a
 * peer), so the caller waits for every part without a deadline of its own.
 *
 * Each thread that runs parts has a scratch buffer of its own, grown
 * before a job by weft__pool_reserve; fn gets the running thread's.
 */
#ifndef WEFT_ENGINE_POOL_H
#define WEFT_ENGINE_POOL_H

#include <stddef.h>

typedef struct weft__pool weft__pool;

/* One part of a job: part (0 <= part < nparts) of arg, on a thread whose
 * scratch buffer is scratch (the bytes last reserved). */
typedef void (*weft__pool_fn)(void *arg, int part, void *scratch);

/* A pool of nthreads threads in all, the caller's included (nthreads - 1
 * helpers, started here). Fewer helpers where threads cannot be started
 * (weft__pool_threads says how many run); NULL only when out of memory. */
weft__pool *weft__pool_create(int nthreads);

/* Stops and joins the helpers and frees the pool. NULL is a no-op. */
void weft__pool_destroy(weft__pool *p);

/* The threads that run a job's parts, the caller's included. */
int weft__pool_threads(const weft__pool *p);

/* Grows every thread's scratch buffer to at least bytes: 0, or -1 when
 * out of memory (the buffers keep their old size). */
int weft__pool_reserve(weft__pool *p, size_t bytes);

/* Runs fn on every part of 0..nparts-1, each once, on the caller and the
 * helpers, and returns once every part has run. Not reentrant: one job
 * at a time, from one thread at a time. */
void weft__pool_run(weft__pool *p, int nparts, weft__pool_fn fn, void *arg);

#endif
