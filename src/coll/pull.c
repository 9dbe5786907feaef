/*
 * Collectives by one-copy reads of the peers' memory; see coll.h.
 *
 * Exchanges of headers (frames: the mesh's all-gather, so calls that
 * differ fail as on any other path) around phases that move the data
 * without frames. The all_reduce:
 *
 *   1. every rank gathers every rank's buffer addresses;
 *   2. each rank reads its share of every peer's input (process_vm_readv,
 *      a chunk at a time into its thread's scratch) and reduces the n
 *      inputs in rank order into its own share of recvbuf;
 *   3. a barrier: every share is reduced, and no rank still reads a share
 *      of an input (where sendbuf is recvbuf, phase 4 writes over them);
 *   4. each rank reads every other share from its owner's recvbuf;
 *   5. a barrier: no rank leaves, handing its buffers back, while a peer
 *      still reads them.
 *
 * The reduce_scatter is 1, 2 (the share is this rank's block of every
 * input) and 5; the all_gather and the broadcast are 1, 4 (every peer's
 * block, or the root's buffer) and 5. Where a rank writes memory that its
 * peers read meanwhile (a reduce_scatter whose recvbuf overlaps sendbuf
 * elsewhere than its own block), it writes a copy of its own and moves it
 * into place after the barrier; an all_gather publishes its own block of
 * recvbuf (its input copied there first), which no rank writes.
 *
 * Phases 2 and 4 run on the pool's threads, parts of up to a few hundred
 * KiB each. A read that fails, or finds its peer gone (the transport
 * says so where the peer left before the read ended, so a buffer handed
 * back is never used), fails the call; so do the deadline and weft_abort,
 * looked at before each part. Each share of an all_reduce is reduced on
 * one rank and copied to the others: every rank ends with the same bits.
 */
#include "coll/coll.h"

#include "base/kernels.h"
#include "engine/plan.h"
#include "engine/pool.h"
#include "mesh/mesh.h"

#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

/* The parts: about PULL_PARTS per thread, so that threads that start
 * late or run slower still find work, each of them large enough that its
 * reads cost little more than their bytes. Phase 2 reads n chunks per
 * part into its thread's scratch: a chunk is PULL_CHUNK_MIN to
 * PULL_CHUNK_MAX bytes, and the n of them at most PULL_TMP_BYTES (inputs
 * and result stay in the core's cache). Phase 4 reads PULL_COPY_MIN to
 * PULL_COPY_MAX bytes per part. (16-core host, 2 ranks: parts of 64 and
 * 256 KiB made 16-64 MiB 7.9-10.7 GB/s where 256 KiB and 1 MiB made
 * 11-14; 1-4 MiB the other way round.) */
#define PULL_PARTS 4
#define PULL_CHUNK_MIN (64 * 1024)
#define PULL_CHUNK_MAX (256 * 1024)
#define PULL_TMP_BYTES (1024 * 1024)
#define PULL_COPY_MIN (256 * 1024)
#define PULL_COPY_MAX (1024 * 1024)

/* A rank's buffers in c->pull_addr: [2 * rank + SRC], [2 * rank + DST]. */
enum { SRC = 0, DST = 1 };

/* What phase 4 reads from one peer: nblocks blocks of bytes, block k at
 * its address src + k * stride into dst + k * stride; parts (of the
 * job's copy bytes) per block. */
typedef struct pull_seg {
    int peer;
    uint64_t src;
    char *dst;
    size_t bytes, stride;
    int nblocks, parts;
} pull_seg;

typedef struct pull_job {
    weft__task *t;
    int n, me;
    size_t esize;
    /* Phase 2: elements [lo, hi) of the result, from elements src_at +
     * lo .. of every input, into out (elements lo ..); chunk elements per
     * input per part, per_block parts per block; block b reads
     * src_stride * b elements further on in the inputs and writes
     * (hi - lo) * b further on in out. */
    size_t lo, hi, src_at, src_stride, chunk, per_block;
    char *out;
    /* Phase 4: nsegs segments in parts of copy bytes; the parts of
     * segment s are first[s] .. first[s + 1] - 1, block by block. */
    pull_seg segs[WEFT__MESH_MAX_RANKS];
    int nsegs;
    size_t copy;
    int first[WEFT__MESH_MAX_RANKS + 1];
    /* The first failure of a part (the others stop at their next part). */
    atomic_int err;
    int err_peer, err_errno;
    const char *err_what;
} pull_job;

/* The first element of member p's share of count elements (p == n: the
 * end): the chunks of weft__plan_chunk, which the hierarchical all_reduce
 * reduces across the hosts (hier.c). */
static size_t share_at(size_t count, int n, int p)
{
    return weft__plan_chunk(count, n, p).off;
}

static uint64_t addr_of(const weft__task *t, int p, int which)
{
    return t->c->pull_addr[2 * (size_t)p + (size_t)which];
}

static void part_fail(pull_job *j, int err, int peer, int e, const char *what)
{
    int none = 0;

    if (atomic_compare_exchange_strong(&j->err, &none, err)) {
        j->err_peer = peer;
        j->err_errno = e;
        j->err_what = what;
    }
}

/* Whether a part may run: nothing failed, the deadline has not passed,
 * the communicator was not aborted. */
static int part_go(pull_job *j)
{
    weft__ctx *c = j->t->c;

    if (atomic_load_explicit(&j->err, memory_order_relaxed) != 0)
        return 0;
    if (atomic_load_explicit(&c->aborted, memory_order_relaxed)) {
        part_fail(j, WEFT_EABORTED, -1, 0, NULL);
        return 0;
    }
    if (weft__now_ms() >= j->t->k->deadline_ms) {
        part_fail(j, WEFT_ETIMEDOUT, -1, 0, NULL);
        return 0;
    }
    return 1;
}

/* Reads from member p of the task's group (a real rank: the whole job,
 * or the ranks of this host in a hierarchical call). */
static void read_part(pull_job *j, int p, void *dst, uint64_t addr, size_t len,
                      const char *what)
{
    const int peer = weft__group_rank(&j->t->g, p);
    int e = 0;
    int rc = weft__peer_read(j->t->c, peer, dst, addr, len, &e);

    if (rc != 0)
        part_fail(j, rc, peer, e, what);
}

/* Phase 2, part i: elements [lo + i * chunk, ...) of every rank's input,
 * reduced in rank order into out. */
static void reduce_part(void *arg, int i, void *scratch)
{
    pull_job *j = arg;
    const weft__args *a = &j->t->a;
    const size_t b = (size_t)i / j->per_block;
    const size_t off = j->lo + (size_t)i % j->per_block * j->chunk;
    const size_t m = j->hi - off < j->chunk ? j->hi - off : j->chunk;
    const size_t bytes = m * j->esize;
    const size_t src = (j->src_at + b * j->src_stride + off) * j->esize;
    char *tmp = scratch;

    if (!part_go(j))
        return;
    for (int p = 0; p < j->n; p++) {
        char *in = tmp + (size_t)p * bytes;

        if (p == j->me)
            memcpy(in, (const char *)a->sendbuf + src, bytes);
        else
            read_part(j, p, in, addr_of(j->t, p, SRC) + src, bytes, "input");
    }
    if (atomic_load_explicit(&j->err, memory_order_relaxed) == 0)
        weft__reduce_ranks(j->out + (b * (j->hi - j->lo) + off) * j->esize, tmp,
                           j->n, m, a->dtype, a->op);
}

/* Phase 4, part i: a piece of one segment. */
static void copy_part(void *arg, int i, void *scratch)
{
    pull_job *j = arg;
    const pull_seg *sg;
    size_t at, base;
    int s = 0;

    (void)scratch;
    if (!part_go(j))
        return;
    while (i >= j->first[s + 1])
        s++;
    sg = &j->segs[s];
    i -= j->first[s];
    base = (size_t)(i / sg->parts) * sg->stride;
    at = (size_t)(i % sg->parts) * j->copy;
    read_part(j, sg->peer, sg->dst + base + at, sg->src + base + at,
              sg->bytes - at < j->copy ? sg->bytes - at : j->copy, "result");
}

/* Bytes per part for a phase that moves total bytes: PULL_PARTS parts
 * per thread, within lo..hi. */
static size_t part_size(size_t total, weft__ctx *c, size_t lo, size_t hi)
{
    size_t b =
        total / ((size_t)PULL_PARTS * (size_t)weft__pool_threads(c->pool));

    return b < lo ? lo : b > hi ? hi : b;
}

static void job_init(pull_job *j, weft__task *t)
{
    memset(j, 0, sizeof *j);
    j->t = t;
    j->n = t->g.n;
    j->me = t->g.me;
    j->esize = weft_dtype_size(t->a.dtype);
    atomic_init(&j->err, 0);
}

static void job_blocks(pull_job *j, int peer, uint64_t src, char *dst,
                       size_t bytes, size_t stride, int nblocks)
{
    if (bytes > 0 && nblocks > 0)
        j->segs[j->nsegs++] =
            (pull_seg){peer, src, dst, bytes, stride, nblocks, 0};
}

static void job_seg(pull_job *j, int peer, uint64_t src, char *dst,
                    size_t bytes)
{
    job_blocks(j, peer, src, dst, bytes, 0, 1);
}

/* The call fails with a part's failure (the transport is shut down, so
 * peers that read this rank's buffers from now on see it left). */
static int job_fail(pull_job *j)
{
    weft__ctx *c = j->t->c;
    const char *name = j->t->k->name;
    int err = atomic_load(&j->err);

    switch (err) {
    case WEFT_ETIMEDOUT:
        return weft__call_fail(c, err,
                               "rank %d: %s: its deadline (%d ms) passed "
                               "while it read its peers' data (one-copy "
                               "reads, shared memory)",
                               c->rank, name, j->t->k->timeout_ms);
    case WEFT_EABORTED:
        return weft__call_fail(c, err, "rank %d: %s: communicator aborted",
                               c->rank, name);
    case WEFT_EPEER:
        return weft__call_fail(c, err,
                               "rank %d: %s: peer %d (same host) closed "
                               "its side (it failed, finalized or died) "
                               "while this rank read its %s",
                               c->rank, name, j->err_peer, j->err_what);
    default:
        return weft__call_fail(c, err,
                               "rank %d: %s: reading peer %d's %s (same "
                               "host) failed: %s",
                               c->rank, name, j->err_peer, j->err_what,
                               strerror(j->err_errno));
    }
}

int weft__pull_reduce(weft__task *t, size_t lo, size_t hi, size_t src_at,
                      size_t src_stride, int nblocks, void *out)
{
    pull_job j;
    size_t cap;

    job_init(&j, t);
    j.lo = lo;
    j.hi = hi;
    j.src_at = src_at;
    j.src_stride = src_stride;
    j.out = out;
    if (hi <= lo || nblocks <= 0)
        return WEFT_OK;
    cap = PULL_TMP_BYTES / (size_t)j.n;
    j.chunk =
        part_size((hi - lo) * (size_t)nblocks * j.esize, t->c, PULL_CHUNK_MIN,
                  cap < PULL_CHUNK_MAX ? cap : PULL_CHUNK_MAX) /
        j.esize;
    if (j.chunk == 0)
        j.chunk = 1;
    j.per_block = (hi - lo + j.chunk - 1) / j.chunk;
    weft__pool_run(t->c->pool, (int)(j.per_block * (size_t)nblocks),
                   reduce_part, &j);
    return atomic_load(&j.err) != 0 ? job_fail(&j) : WEFT_OK;
}

/* Runs phase 4 over j's segments. */
static int run_copy(pull_job *j)
{
    weft__task *t = j->t;
    size_t total = 0;
    int parts = 0;

    for (int s = 0; s < j->nsegs; s++)
        total += j->segs[s].bytes * (size_t)j->segs[s].nblocks;
    j->copy = part_size(total, t->c, PULL_COPY_MIN, PULL_COPY_MAX);
    for (int s = 0; s < j->nsegs; s++) {
        pull_seg *sg = &j->segs[s];

        sg->parts = (int)((sg->bytes + j->copy - 1) / j->copy);
        j->first[s] = parts;
        parts += sg->parts * sg->nblocks;
    }
    j->first[j->nsegs] = parts;
    weft__pool_run(t->c->pool, parts, copy_part, j);
    return atomic_load(&j->err) != 0 ? job_fail(j) : WEFT_OK;
}

static int pull_barrier(weft__task *s)
{
    return weft__barrier(s, weft__mesh_all_gather);
}

int weft__pull_sync(weft__task *t, weft__task_fn next)
{
    weft__args none = {0};
    int rc;

    if ((rc = weft__task_sub(t, &none, pull_barrier)) != 0)
        return rc;
    t->next = next;
    return WEFT_OK;
}

/* The last barrier: no rank hands its buffers back while a peer still
 * reads them. */
static int last_barrier(weft__task *t)
{
    return weft__pull_sync(t, NULL);
}

int weft__pull_publish(weft__task *t, const void *src, const void *dst,
                       weft__task_fn next)
{
    weft__ctx *c = t->c;
    uint64_t *ad = c->pull_addr + 2 * (size_t)t->g.me;
    weft__args g = {0};
    int rc;

    /* Before anything moved: an error leaves c usable. */
    if (weft__ctx_pool(c) == NULL ||
        weft__pool_reserve(c->pool, PULL_TMP_BYTES) != 0)
        return weft__note(c, WEFT_ENOMEM,
                          "rank %d: %s: out of memory for its threads", c->rank,
                          t->k->name);
    ad[SRC] = (uint64_t)(uintptr_t)src;
    ad[DST] = (uint64_t)(uintptr_t)dst;
    g.sendbuf = ad;
    g.recvbuf = c->pull_addr;
    g.count = 2 * sizeof(uint64_t);
    g.dtype = WEFT_UINT8;
    if ((rc = weft__task_sub(t, &g, weft__mesh_all_gather)) != 0)
        return rc;
    t->next = next;
    return WEFT_OK;
}

/* ---- all_reduce ---- */

/* Phase 4, then the last barrier. */
static int ar_copy(weft__task *t)
{
    const size_t count = t->a.count;
    pull_job j;
    int rc;

    job_init(&j, t);
    for (int p = 0; p < j.n; p++) {
        const size_t at = share_at(count, j.n, p) * j.esize;

        if (p != j.me)
            job_seg(&j, p, addr_of(t, p, DST) + at, (char *)t->a.recvbuf + at,
                    share_at(count, j.n, p + 1) * j.esize - at);
    }
    if ((rc = run_copy(&j)) != WEFT_OK)
        return rc;
    return last_barrier(t);
}

int weft__pull_share_reduce(weft__task *t)
{
    const int n = t->g.n, me = t->g.me;

    return weft__pull_reduce(t, share_at(t->a.count, n, me),
                             share_at(t->a.count, n, me + 1), 0, 0, 1,
                             t->a.recvbuf);
}

int weft__pull_share_gather(weft__task *t)
{
    return weft__pull_sync(t, ar_copy);
}

/* Phase 2, then the barrier before phase 4. */
static int ar_reduce(weft__task *t)
{
    int rc = weft__pull_share_reduce(t);

    return rc != WEFT_OK ? rc : weft__pull_share_gather(t);
}

int weft__pull_share_start(weft__task *t, weft__task_fn next)
{
    return weft__pull_publish(t, t->a.sendbuf, t->a.recvbuf, next);
}

int weft__pull_all_reduce(weft__task *t)
{
    return weft__pull_share_start(t, ar_reduce);
}

/* ---- reduce_scatter ---- */

/* Whether this rank's result may go straight to recvbuf: it overlaps no
 * block of sendbuf but this rank's own (which no peer reads). */
static int rs_direct(const weft__task *t)
{
    const size_t block = t->a.count * weft_dtype_size(t->a.dtype);
    const char *s = t->a.sendbuf, *r = t->a.recvbuf;

    return r + block <= s || r >= s + block * (size_t)t->g.n ||
           r == s + (size_t)t->g.me * block;
}

/* After the last barrier: the result into recvbuf, where it went to c's
 * copy. */
static int rs_place(weft__task *t)
{
    memcpy(t->a.recvbuf, t->c->pull_tmp,
           t->a.count * weft_dtype_size(t->a.dtype));
    return WEFT_OK;
}

/* Phase 2 over this rank's block, then the last barrier. */
static int rs_reduce(weft__task *t)
{
    const int direct = rs_direct(t);
    int rc;

    if ((rc = weft__pull_reduce(
             t, 0, t->a.count, t->a.count * (size_t)t->g.me, 0, 1,
             direct ? t->a.recvbuf : t->c->pull_tmp)) != WEFT_OK)
        return rc;
    if ((rc = last_barrier(t)) != WEFT_OK)
        return rc;
    t->next = direct ? NULL : rs_place;
    return WEFT_OK;
}

int weft__pull_reduce_scatter(weft__task *t)
{
    int rc;

    if (!rs_direct(t) &&
        (rc = weft__pull_tmp(t->c, t->a.count * weft_dtype_size(t->a.dtype))) !=
            WEFT_OK)
        return rc;
    return weft__pull_publish(t, t->a.sendbuf, t->a.recvbuf, rs_reduce);
}

/* ---- all_gather ---- */

int weft__pull_gather_blocks(weft__task *t, size_t block, size_t stride,
                             int nblocks)
{
    pull_job j;
    int rc;

    job_init(&j, t);
    for (int p = 0; p < j.n; p++)
        if (p != j.me)
            job_blocks(&j, p, addr_of(t, p, DST) + (size_t)p * block,
                       (char *)t->a.recvbuf + (size_t)p * block, block, stride,
                       nblocks);
    if ((rc = run_copy(&j)) != WEFT_OK)
        return rc;
    return last_barrier(t);
}

static int ag_copy(weft__task *t)
{
    return weft__pull_gather_blocks(t, t->a.count * weft_dtype_size(t->a.dtype),
                                    0, 1);
}

int weft__pull_all_gather(weft__task *t)
{
    const size_t block = t->a.count * weft_dtype_size(t->a.dtype);
    char *own = (char *)t->a.recvbuf + (size_t)t->g.me * block;

    /* Peers read this rank's block of recvbuf, which no rank writes. */
    if ((const char *)t->a.sendbuf != own)
        memmove(own, t->a.sendbuf, block);
    return weft__pull_publish(t, own, t->a.recvbuf, ag_copy);
}

/* ---- broadcast ---- */

static int bc_copy(weft__task *t)
{
    pull_job j;
    int rc;

    job_init(&j, t);
    if (j.me != t->a.root)
        job_seg(&j, t->a.root, addr_of(t, t->a.root, DST), t->a.recvbuf,
                t->a.count * j.esize);
    if ((rc = run_copy(&j)) != WEFT_OK)
        return rc;
    return last_barrier(t);
}

int weft__pull_broadcast(weft__task *t)
{
    return weft__pull_publish(t, t->a.recvbuf, t->a.recvbuf, bc_copy);
}
