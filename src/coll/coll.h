/*
 * The algorithms built on either family's all-gather (ring/, mesh/): the
 * small all_reduce (gather every input, reduce locally), the barrier; and
 * those that need every pair of ranks wired: recursive doubling, recursive
 * halving + doubling. Every algorithm has task.h's weft__algo_fn signature
 * (the tuning table, core/tune.c, picks among them).
 *
 * An algorithm posts its task (task.h): it starts the task's first pass
 * and names the part that runs once that pass completed, and returns
 * without waiting. Arguments are already validated, counts are > 0 and the
 * job has >= 2 ranks. An algorithm runs among the members of its task's
 * group (t->g, task.h: the whole job, or one phase's ranks of a
 * hierarchical call): "rank", "n", blocks, chunks and a root are members
 * and their number, and only lane peers are real ranks.
 */
#ifndef WEFT_COLL_H
#define WEFT_COLL_H

#include "engine/task.h"

/* All_reduce of inputs gathered with `gather` (an all_gather algorithm)
 * into scratch and reduced in rank order 0..n-1 on every rank, so that
 * every rank ends with the same bits: n-1 ring steps, or one exchange,
 * instead of reduce-scatter + all-gather, for small counts. */
int weft__gather_reduce(weft__task *t, weft__algo_fn gather);

/* Recursive doubling for a power-of-two job: in round k each rank swaps
 * its partial result with rank ^ 2^k, and both compute lower OP upper. */
int weft__doubling_all_reduce(weft__task *t);

/* Recursive halving + doubling (Rabenseifner's) for any number of ranks
 * that are all directly wired to each other: a reduce-scatter by recursive
 * halving, then an all-gather by recursive doubling, 2 log2(n) rounds (2
 * more where n is not a power of two), the same bytes as the ring's
 * reduce-scatter + all-gather. Each chunk is reduced on one rank and
 * copied to the others, so every rank ends with the same bits. Needs
 * count >= nranks (every chunk holds an element, so every round that pairs
 * two ranks exchanges headers). */
int weft__halving_all_reduce(weft__task *t);

/* Through the box (engine.h: every rank of the job on this host, c->box
 * != 0), the whole job: every rank publishes its input to every other and
 * reduces all of them in rank order 0..n-1, as the gather above, in one
 * slot per rank instead of frames (count * size <= c->box); the
 * all-gather of blocks that small; and the barrier, a header alone from
 * each rank to every other. */
int weft__box_all_reduce(weft__task *t);
int weft__box_all_gather(weft__task *t);
int weft__box_barrier(weft__task *t);
/* The same for a broadcast (every rank publishes its buffer, the root's
 * is taken) and a reduce_scatter (every rank publishes its whole input,
 * count * size * n <= c->box, and reduces its block of each in rank
 * order). */
int weft__box_broadcast(weft__task *t);
int weft__box_reduce_scatter(weft__task *t);

/* Through one-copy reads of the peers' memory (engine.h: c->pull, every
 * rank on this host), the whole job, on the pool's threads (coll/pull.c
 * says how): the all_reduce (each rank reads its share of every input and
 * reduces them in rank order, then reads every other share from the rank
 * that reduced it), the reduce_scatter (its block of every input), the
 * all_gather (every peer's block) and the broadcast (the root's buffer).
 * Their exchanges of headers are the mesh's all-gather, so every pair
 * must be wired. */
int weft__pull_all_reduce(weft__task *t);
/* Its phases, for an algorithm that runs them among t->g (the ranks of
 * one host: hier.c) with a step of its own on this rank's share between
 * them: _start publishes the buffers and runs next; _reduce reduces this
 * member's share (weft__plan_chunk of count over t->g.n) of every input
 * into recvbuf; _gather waits for every member's share, reads the others
 * and ends the call. */
int weft__pull_share_start(weft__task *t, weft__task_fn next);
int weft__pull_share_reduce(weft__task *t);
int weft__pull_share_gather(weft__task *t);
/* The pieces, for the hierarchical all_gather and reduce_scatter
 * (hier.c), among t->g:
 * - _publish makes src and dst the buffers that this rank's peers read,
 *   gathers every member's (a pass among t->g that compares the calls),
 *   then runs next;
 * - _reduce reduces, in member order, elements src_at + lo .. src_at + hi
 *   of every member's src into elements lo .. hi of out, and so for
 *   nblocks blocks in one go: block b from src_stride * b elements
 *   further on in src, into (hi - lo) * b further on in out;
 * - _sync is a barrier among t->g, then next;
 * - _gather_blocks reads, from every other member p, nblocks blocks of
 *   block bytes at p * block + k * stride of its dst into the same place
 *   of this rank's recvbuf, then the last barrier (no rank leaves while
 *   its buffers may still be read) ends the call.
 * A failed read, the deadline or weft_abort fails the call. */
int weft__pull_publish(weft__task *t, const void *src, const void *dst,
                       weft__task_fn next);
int weft__pull_reduce(weft__task *t, size_t lo, size_t hi, size_t src_at,
                      size_t src_stride, int nblocks, void *out);
int weft__pull_sync(weft__task *t, weft__task_fn next);
int weft__pull_gather_blocks(weft__task *t, size_t block, size_t stride,
                             int nblocks);
int weft__pull_reduce_scatter(weft__task *t);
int weft__pull_all_gather(weft__task *t);
int weft__pull_broadcast(weft__task *t);

/* A small reduce: every input gathered on the root with `gather` (a
 * gather algorithm) and reduced there in rank order 0..n-1. */
int weft__gather_reduce_root(weft__task *t, weft__algo_fn gather);

/* The all_to_allv's agreement on its counts (all_to_allv.c): every rank
 * gathers every rank's send and receive counts with `gather` (an
 * all_gather algorithm) into t->owned (n rows of 2n uint64: the sends to
 * each peer, then the receives from each), then runs next, which calls
 * weft__all_to_allv_check first: WEFT_EMISMATCH on every rank (the call
 * failed) where some rank's send count to a peer is not that peer's
 * receive count from it, since every rank sees the same counts. */
int weft__all_to_allv_counts(weft__task *t, weft__algo_fn gather,
                             weft__task_fn next);
int weft__all_to_allv_check(weft__task *t);
/* The bytes rank `from` sends to rank `to` in t's all_to_all (count
 * elements each) or all_to_allv (the gathered counts). */
size_t weft__all_to_all_bytes(const weft__task *t, int from, int to);

/* A barrier: an all_gather (with `gather`) of one byte per rank, so no
 * rank leaves before it has heard from every other. */
int weft__barrier(weft__task *t, weft__algo_fn gather);

#endif
