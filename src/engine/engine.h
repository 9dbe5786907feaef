/*
 * The pipeline engine: runs an operation, described as lanes of steps, over
 * the wires of the transport, frame by frame, under one deadline.
 *
 * A lane sends to one peer and receives from another (either may be -1).
 * Step k of a lane sends send_len bytes from send_buf and receives recv_len
 * bytes into recv_dst. A received step either lands as is (recv_a == NULL)
 * or is reduced on arrival: recv_dst = recv_a OP incoming (recv_a may equal
 * recv_dst). A send step with send_dep = j >= 0 sends bytes that the same
 * lane's receive step j produces, and each of its frames leaves only once
 * the bytes it covers have arrived (and been reduced): that is how a ring
 * pipelines across steps. Each step is split over the peer's wires by the
 * planner (plan.h); both ends compute the same split.
 */
#ifndef WEFT_ENGINE_H
#define WEFT_ENGINE_H

#include "base/base.h"
#include "topo/topo.h"

struct weft__tp;
struct weft__tp_ops;
struct weft__engine;

/* What every engine pass of one public call shares, fixed once when the
 * call starts: its one deadline, and what ranks must agree on for their
 * calls to match (each pass's headers carry it). The call's task holds it
 * (task.h). */
typedef struct weft__call {
    uint64_t deadline_ms; /* weft__now_ms() clock */
    const char *name;     /* "all_reduce", ... for messages */
    int kind;             /* WEFT__OP_* (engine.h) */
    int dtype;
    int redop; /* -1 where the call has none */
    int root;  /* -1 where the call has none */
    uint64_t count;
    uint64_t seq;   /* collectives: the communicator's count of them */
    int passes;     /* engine passes run so far */
    int timeout_ms; /* what made the deadline, for messages */
    /* A number every header of the call carries and every received header
     * lowers to the sender's where that is smaller: once a call whose
     * passes hear from every rank (recursive doubling, a one-exchange
     * gather) has ended, every rank holds the minimum over the ranks of
     * what each set at the start. The core agrees on batches with it
     * (core/sched.c); 0 where unused. */
    uint32_t hint;
    /* What a batch of operations run as this call is made of (a digest of
     * their counts, core/sched.c), which ranks must agree on as on the
     * count; 0 for a call that is one operation. */
    uint64_t parts;
    /* Point to point: the messages' tag (>= 0; match.c), 0 otherwise. */
    int tag;
} weft__call;

/* What the engine and the algorithms see of a communicator: its job, its
 * place in it, its one error record, and the transport that moves its
 * frames. The core keeps one in each weft_comm. */
typedef struct weft__ctx {
    const weft__config *cfg;
    int rank;
    int nranks;
    int timeout_ms;
    weft__errsink fail; /* the first failure; failed once fail.code != 0 */
    atomic_int aborted;
    char errmsg[WEFT__ERRMSG_LEN]; /* last non-failing error (bad args) */
    struct weft__tp *tp;
    const struct weft__tp_ops *tpo;
    struct weft__engine *eng;
    uint32_t *send_seq; /* per peer: point-to-point sends to it */
    uint32_t *recv_seq; /* per peer: point-to-point receives from it */
    void *scratch;      /* grown on demand for algorithms that need it */
    size_t scratch_bytes;
    /* The bytes of data a box pass (below) carries per rank on c, 0 where
     * there is no box: set once the transport is up (weft__box_init). */
    size_t box;
    /* 1 where the collectives by one-copy reads may run on c (every peer
     * on this host, and readable: weft__pull_init), and the threads that
     * run its parts, started by its first call (weft__ctx_pool). */
    int pull;
    /* 1 where a hierarchical all_reduce may read the memory of this
     * host's ranks (cfg->hier_local, every one of them readable), for
     * its phases within the host (coll/hier.c). */
    int pull_host;
    struct weft__pool *pool;
    /* Its calls' buffers, per rank: what peers read, what they write to;
     * and a result's copy where it cannot go to recvbuf at once (a
     * reduce_scatter in place), grown on demand. */
    uint64_t pull_addr[2 * WEFT__MESH_MAX_RANKS];
    void *pull_tmp;
    size_t pull_tmp_bytes;
} weft__ctx;

/* Records err on c's error record (the first failure wins) and returns
 * the code the record holds. */
int weft__set_error(weft__ctx *c, int err, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* An error that does not fail c (a bad argument, found before anything
 * moved): its text becomes weft_last_error(c) unless c has failed. */
int weft__note(weft__ctx *c, int err, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* Records err on c's error record as weft__set_error does, and shuts the
 * transport down, as a pass that fails does: for an algorithm that fails
 * between passes, once something of the call moved. */
int weft__call_fail(weft__ctx *c, int err, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* Grows c->scratch to at least nbytes. */
int weft__scratch(weft__ctx *c, size_t nbytes, void **out);

/* Grows c->pull_tmp to at least nbytes (apart from c->scratch, which the
 * barriers of the same call use). */
int weft__pull_tmp(weft__ctx *c, size_t nbytes);

/* Operation kinds, carried in each channel's header so that ranks calling
 * different operations fail with WEFT_EMISMATCH instead of mixing data. */
enum {
    WEFT__OP_ALL_REDUCE = 1,
    WEFT__OP_ALL_GATHER,
    WEFT__OP_REDUCE_SCATTER,
    WEFT__OP_BROADCAST,
    WEFT__OP_P2P,
    WEFT__OP_BARRIER,
    /* The rooted collectives and the all-to-alls (ring/, mesh/, coll/). */
    WEFT__OP_REDUCE,
    WEFT__OP_GATHER,
    WEFT__OP_SCATTER,
    WEFT__OP_ALL_TO_ALL,
    WEFT__OP_ALL_TO_ALLV,
    WEFT__OP_COUNT /* one past the last kind */
};

typedef struct {
    const char *send_buf;
    size_t send_len;
    int send_dep; /* receive step these bytes come from, or -1 */
    char *recv_dst;
    const char *recv_a; /* reduce operand, NULL to land the bytes as is */
    size_t recv_len;
} weft__step;

typedef struct {
    int send_peer; /* -1: this lane sends nothing */
    int recv_peer; /* -1: this lane receives nothing */
    int tag;       /* same on both ends of a channel (ring direction) */
    int nsteps;
    weft__step *steps;
} weft__lane;

/* Two for a ring (one per direction); more for direct exchanges, one per
 * peer. */
#define WEFT__MAX_LANES 16
_Static_assert(WEFT__MAX_LANES >= WEFT__MESH_MAX_RANKS - 1,
               "a mesh needs one lane per peer");

/* Which peers a collective pass compares its call with (besides those it
 * moves data to or from, which it always does, both ways): none more, its
 * two ring neighbours, or every peer (of the op's group). Every rank of a
 * pass must name a set that does not depend on the call's arguments (root,
 * count), so that ranks whose calls differ still meet and see it. */
enum { WEFT__CHECK_LANES = 0, WEFT__CHECK_RING, WEFT__CHECK_ALL };

/* The ranks an algorithm runs among: the whole job, or a part of it (the
 * ranks of one host, or one rank of each host, for the hierarchical
 * algorithms). Member pos (0 <= pos < n) is real rank base + pos * stride;
 * this rank is member me. Algorithms number ranks, blocks and chunks by
 * member, and name real ranks only in lane peers (weft__group_rank). */
typedef struct weft__group {
    int n;
    int me;
    int base;
    int stride;
} weft__group;

/* The real rank of member pos of g, or -1 for pos -1 (no peer). */
static inline int weft__group_rank(const weft__group *g, int pos)
{
    return pos < 0 ? -1 : g->base + pos * g->stride;
}

/* What one engine pass moves: lanes of steps. What it is part of (kind,
 * name, count, root, number) is its call (weft__call), which every header
 * carries. */
typedef struct {
    int check; /* WEFT__CHECK_* */
    /* The ranks that `check` names its ring neighbours or every peer
     * among; n == 0 (as weft__op_init leaves it): the whole job. */
    weft__group group;
    weft_dtype dtype;
    weft_redop redop;
    size_t esize;
    /* 1: every received frame is reduced by the thread that receives it,
     * never handed to the reducer thread (an algorithm whose next pass
     * sends what this one reduces has nothing to overlap the hand-off
     * with). */
    int inline_reduce;
    int nlanes;
    weft__lane lanes[WEFT__MAX_LANES];
} weft__op;

/* The halves of a point-to-point pass that go through the transport's
 * relay (peers with no wires to this rank): nbytes of sendbuf to dst and
 * nbytes from src into recvbuf; -1 leaves a half out. */
typedef struct weft__relay {
    const void *sendbuf;
    int dst;
    void *recvbuf;
    int src;
    size_t nbytes;
    int tag; /* the messages' tag (point to point) */
} weft__relay;

/* An engine pass in flight (engine.c). */
typedef struct weft__pass weft__pass;

/* Returned by weft__pass_test and the task functions while an operation
 * has frames in flight (the WEFT_E* codes are negative). */
#define WEFT__PENDING 1

/* Builds an operation: op_init clears it, op_steps gives lane `lane`
 * nsteps zeroed steps (send_dep -1), or NULL when out of memory (then
 * weft__pass_start reports WEFT_ENOMEM). */
void weft__op_init(weft__op *op, weft_dtype dt, weft_redop redop);
weft__step *weft__op_steps(weft__op *op, int lane, int nsteps);

/* Starts op, and the relayed halves of relay (NULL: none), as the next
 * pass of call k: posts the first frames and returns at once, never
 * waiting. The pass takes op's steps (freed when it ends, also when it
 * cannot start). An error found before anything of the call moved (the
 * call's first pass: no direct link, no memory) leaves c usable; after
 * that it fails c. On success *out is the pass, to be tested with
 * weft__pass_test until it is no longer WEFT__PENDING, then ended. */
int weft__pass_start(weft__ctx *c, weft__call *k, weft__op *op,
                     const weft__relay *relay, weft__pass **out);

/* WEFT__PENDING while the pass has frames in flight, WEFT_OK once all
 * completed (no frame in flight on any wire), or the error that failed it.
 * Never blocks and runs no transport code: completions arrive while some
 * thread runs the transport's progress (weft__pass_wait). */
int weft__pass_test(const weft__pass *p);

/* Sleeps in the transport until something happened, the call's deadline
 * passed or weft_abort() was called; the last two (and a failed wire) fail
 * the pass, with a message naming what it waited for. */
void weft__pass_wait(weft__pass *p);

/* The same for several passes in flight at once (of one context): sleeps
 * until something happened for any, and fails those whose call's deadline
 * passed. */
void weft__passes_wait(weft__pass *const *ps, int n);

/* Frees a pass. One that failed, or is abandoned while pending, fails the
 * communicator with rc and shuts its transport down first, so that no
 * frame refers to the caller's buffers once this returns. */
void weft__pass_end(weft__pass *p, int rc);

/* The box (transport.h): where every rank of the job is on this host and
 * the transport has a box, a collective's few bytes go from each rank to
 * every other through a slot per rank and call, without frames.
 * weft__box_init sets c->box (the data bytes a box pass carries per rank,
 * after the call's header), or 0 where there is none. */
void weft__box_init(weft__ctx *c);

/* Starts a box pass of call k (c->box != 0): publishes len <= c->box
 * bytes of data with the call's header to every rank, and gathers every
 * rank's len bytes into out (nranks * len bytes, rank order, this rank's
 * copied too). Each rank's header is compared with this rank's, so ranks
 * whose calls differ fail with WEFT_EMISMATCH. Tested, waited for and
 * ended as any pass. */
int weft__box_start(weft__ctx *c, weft__call *k, const void *data, size_t len,
                    char *out, weft__pass **pass);

/* Sets c->pull: the job's configuration allows the one-copy collectives
 * (cfg->pull_threads not 0) and this rank
 * can read every peer's memory and be read by it (the transport's
 * read->can_read; every peer on this host); and c->pull_host: the same for the
 * ranks of this host where hosts run several ranks (cfg->hier_local). */
void weft__pull_init(weft__ctx *c);

/* c's pool of cfg->pull_threads threads (engine/pool.h), started on the
 * first call; NULL when out of memory. Freed by weft__engine_free. */
struct weft__pool *weft__ctx_pool(weft__ctx *c);

/* Copies len bytes at addr in peer's memory to dst (c->pull): 0, or the
 * transport's read->peer_read's failure (transport.h), recorded nowhere. Safe
 * from any thread. */
int weft__peer_read(weft__ctx *c, int peer, void *dst, uint64_t addr,
                    size_t len, int *err);

/* After collective call number seq (and every earlier one) ended on this
 * rank, whatever ran it: the box's slots of those calls may be written
 * again. */
void weft__call_end(weft__ctx *c, uint64_t seq);

/* Starts a pass that moves nothing and ends once a point-to-point
 * message of `tag` from some peer is ready to be received (read early,
 * or its header first on its stream) and nothing else will take it:
 * then *src is that peer (match.c). Tested, waited for and ended as any
 * pass. */
int weft__probe_start(weft__ctx *c, weft__call *k, int tag, int *src,
                      weft__pass **out);

/* Frees the engine's staging buffers. */
void weft__engine_free(weft__ctx *c);

/* Frames a side keeps in flight per wire; a receiving side counts the
 * frames it waits for and, where the reducer thread is on
 * (weft__config.reduce_thread), those received but not yet reduced. */
#define WEFT__SEND_DEPTH 4
#define WEFT__RECV_DEPTH 2
#define WEFT__RECV_DEPTH_REDUCER 4

#endif
