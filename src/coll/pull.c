/*
 * The all_reduce by one-copy reads; see coll.h.
 *
 * Three exchanges of headers (frames, so calls that differ fail as on any
 * other path) around two phases that move the data without frames:
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
 * Phases 2 and 4 run on the pool's threads, parts of up to a few hundred
 * KiB each. A read that fails, or finds its peer gone (the transport
 * says so where the peer left before the read ended, so a buffer handed
 * back is never used), fails the call; so do the deadline and weft_abort,
 * looked at before each part. Each share is reduced on one rank and
 * copied to the others: every rank ends with the same bits.
 */
#include "coll/coll.h"

#include "base/kernels.h"
#include "engine/pool.h"
#include "mesh/mesh.h"

#include <stdatomic.h>
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

typedef struct pull_job {
    weft__task *t;
    int n, me;
    size_t esize;
    size_t chunk;  /* phase 2: elements per input per part */
    size_t lo, hi; /* this rank's share, in elements */
    /* phase 4: bytes per part; the parts of peer p are first[p] ..
     * first[p + 1] - 1 */
    size_t copy;
    int first[WEFT__MESH_MAX_RANKS + 1];
    /* The first failure of a part (the others stop at their next part). */
    atomic_int err;
    int err_peer, err_errno;
    const char *err_what;
} pull_job;

/* The first element of rank p's share. */
static size_t share_at(size_t count, int n, int p)
{
    return (size_t)((unsigned __int128)count * (unsigned)p / (unsigned)n);
}

static const uint64_t *addrs(const weft__task *t)
{
    return t->c->pull_addr;
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

static void read_part(pull_job *j, int p, void *dst, uint64_t addr, size_t len,
                      const char *what)
{
    int e = 0;
    int rc = weft__peer_read(j->t->c, p, dst, addr, len, &e);

    if (rc != 0)
        part_fail(j, rc, p, e, what);
}

/* Phase 2, part i: elements [lo + i * chunk, ...) of every rank's input,
 * reduced in rank order into recvbuf. */
static void reduce_part(void *arg, int i, void *scratch)
{
    pull_job *j = arg;
    const weft__args *a = &j->t->a;
    const size_t off = j->lo + (size_t)i * j->chunk;
    const size_t m = j->hi - off < j->chunk ? j->hi - off : j->chunk;
    const size_t bytes = m * j->esize;
    char *tmp = scratch;

    if (!part_go(j))
        return;
    for (int p = 0; p < j->n; p++) {
        char *in = tmp + (size_t)p * bytes;

        if (p == j->me)
            memcpy(in, (const char *)a->sendbuf + off * j->esize, bytes);
        else
            read_part(j, p, in, addrs(j->t)[2 * p] + off * j->esize, bytes,
                      "input");
    }
    if (atomic_load_explicit(&j->err, memory_order_relaxed) == 0)
        weft__reduce_ranks((char *)a->recvbuf + off * j->esize, tmp, j->n, m,
                           a->dtype, a->op);
}

/* Phase 4, part i: a piece of one peer's share, from its recvbuf. */
static void copy_part(void *arg, int i, void *scratch)
{
    pull_job *j = arg;
    const weft__args *a = &j->t->a;
    size_t lo, hi, at;
    int p = 0;

    (void)scratch;
    if (!part_go(j))
        return;
    while (i >= j->first[p + 1])
        p++;
    lo = share_at(a->count, j->n, p) * j->esize;
    hi = share_at(a->count, j->n, p + 1) * j->esize;
    at = lo + (size_t)(i - j->first[p]) * j->copy;
    read_part(j, p, (char *)a->recvbuf + at, addrs(j->t)[2 * p + 1] + at,
              hi - at < j->copy ? hi - at : j->copy, "result");
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
    j->lo = share_at(t->a.count, j->n, j->me);
    j->hi = share_at(t->a.count, j->n, j->me + 1);
    atomic_init(&j->err, 0);
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
                               "while it read and reduced its peers' data "
                               "(one-copy reads, shared memory)",
                               c->rank, name, j->t->k->timeout_ms);
    case WEFT_EABORTED:
        return weft__call_fail(c, err, "rank %d: %s: communicator aborted",
                               c->rank, name);
    case WEFT_EPEER:
        return weft__call_fail(c, err,
                               "rank %d: %s: peer %d (same host) left "
                               "(failed, finalized or died) while this rank "
                               "read its %s",
                               c->rank, name, j->err_peer, j->err_what);
    default:
        return weft__call_fail(c, err,
                               "rank %d: %s: reading peer %d's %s (same "
                               "host) failed: %s",
                               c->rank, name, j->err_peer, j->err_what,
                               strerror(j->err_errno));
    }
}

static int pull_barrier(weft__task *s)
{
    return weft__barrier(s, weft__mesh_all_gather);
}

/* Phase 4, then the last barrier. */
static int copy_shares(weft__task *t)
{
    weft__args none = {0};
    pull_job j;
    int parts = 0;

    job_init(&j, t);
    j.copy = part_size((t->a.count - (j.hi - j.lo)) * j.esize, t->c,
                       PULL_COPY_MIN, PULL_COPY_MAX);
    for (int p = 0; p < j.n; p++) {
        size_t bytes =
            (share_at(t->a.count, j.n, p + 1) - share_at(t->a.count, j.n, p)) *
            j.esize;

        j.first[p] = parts;
        if (p != j.me)
            parts += (int)((bytes + j.copy - 1) / j.copy);
    }
    j.first[j.n] = parts;
    weft__pool_run(t->c->pool, parts, copy_part, &j);
    if (atomic_load(&j.err) != 0)
        return job_fail(&j);
    return weft__task_sub(t, &none, pull_barrier);
}

/* Phase 2, then the first barrier. */
static int reduce_share(weft__task *t)
{
    weft__args none = {0};
    pull_job j;
    size_t parts;
    int rc;

    job_init(&j, t);
    j.chunk = part_size((j.hi - j.lo) * j.esize, t->c, PULL_CHUNK_MIN,
                        PULL_TMP_BYTES / (size_t)j.n < PULL_CHUNK_MAX
                            ? PULL_TMP_BYTES / (size_t)j.n
                            : PULL_CHUNK_MAX) /
              j.esize;
    if (j.chunk == 0)
        j.chunk = 1;
    parts = (j.hi - j.lo + j.chunk - 1) / j.chunk;
    weft__pool_run(t->c->pool, (int)parts, reduce_part, &j);
    if (atomic_load(&j.err) != 0)
        return job_fail(&j);
    if ((rc = weft__task_sub(t, &none, pull_barrier)) != 0)
        return rc;
    t->next = copy_shares;
    return WEFT_OK;
}

int weft__pull_all_reduce(weft__task *t)
{
    weft__ctx *c = t->c;
    const weft__args *a = &t->a;
    uint64_t *ad = c->pull_addr + 2 * (size_t)t->g.me;
    weft__args g = {0};
    int rc;

    /* Before anything moved: an error leaves c usable. */
    if (weft__ctx_pool(c) == NULL ||
        weft__pool_reserve(c->pool, PULL_TMP_BYTES) != 0)
        return weft__note(c, WEFT_ENOMEM,
                          "rank %d: %s: out of memory for its threads", c->rank,
                          t->k->name);
    ad[0] = (uint64_t)(uintptr_t)a->sendbuf;
    ad[1] = (uint64_t)(uintptr_t)a->recvbuf;
    g.sendbuf = ad;
    g.recvbuf = c->pull_addr;
    g.count = 2 * sizeof(uint64_t);
    g.dtype = WEFT_UINT8;
    if ((rc = weft__task_sub(t, &g, weft__mesh_all_gather)) != 0)
        return rc;
    t->next = reduce_share;
    return WEFT_OK;
}
