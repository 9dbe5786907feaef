/*
 * weft: collective communication over several direct links per peer.
 *
 * This is the whole public API. Every function that can fail returns an int:
 * WEFT_OK (0) on success or a negative WEFT_E* code. Calls are blocking and
 * never block past the communicator's per-operation deadline: one deadline
 * per call, from when it is called, whatever steps the call takes.
 *
 * Calls are matched across ranks. Every collective carries its kind,
 * dtype, op, count, root and its number among the communicator's
 * collectives; every point-to-point message its dtype, count and number
 * between the pair (relayed or direct alike). Ranks whose calls differ get
 * WEFT_EMISMATCH (or a deadline or peer error where they never meet), never
 * WEFT_OK with another call's data, and bytes a mismatched call left on a
 * wire never pass for a later call's.
 *
 * Buffers passed to an operation are borrowed for the duration of the call
 * only: when the call returns (successfully or not) the library holds no
 * reference to them and no transfer into or out of them is in flight.
 *
 * A communicator is not thread-safe: call its operations from one thread at
 * a time. The one exception is weft_abort(), which may be called from any
 * thread at any moment while the communicator exists.
 */
#ifndef WEFT_H
#define WEFT_H

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(__GNUC__)
#define WEFT_EXPORT __attribute__((visibility("default")))
#else
#define WEFT_EXPORT
#endif

#define WEFT_VERSION_MAJOR 0
#define WEFT_VERSION_MINOR 1
#define WEFT_VERSION_PATCH 0

/* The library's version as "MAJOR.MINOR.PATCH": the one the program runs
 * with, which may be newer than the header it was built with. */
WEFT_EXPORT const char *weft_version(void);

/* Error codes. One table (WEFT_ERRNO_MAP) drives the enum, weft_strerror()
 * and weft_err_name(). */
#define WEFT_ERRNO_MAP(XX)                                                     \
    XX(EINVAL, -1, "invalid argument")                                         \
    XX(ENOMEM, -2, "out of memory or registration failed")                     \
    XX(ECONFIG, -3, "bad hostfile, environment or configuration")              \
    XX(ETIMEDOUT, -4, "deadline passed before the operation completed")        \
    XX(EPEER, -5, "a peer closed, reset or died")                              \
    XX(EMISMATCH, -6, "ranks called different collectives or arguments")       \
    XX(EABORTED, -7, "communicator aborted or failed earlier")                 \
    XX(ETRANSPORT, -8, "transport-level failure")                              \
    XX(EAUTH, -9, "connection did not prove it belongs to this job")           \
    XX(ENOTSUP, -10, "not supported by this build or transport")

enum {
    WEFT_OK = 0,
#define WEFT__ERRNO_ENUM(name, val, text) WEFT_##name = (val),
    WEFT_ERRNO_MAP(WEFT__ERRNO_ENUM)
#undef WEFT__ERRNO_ENUM
};

typedef struct weft_comm weft_comm; /* opaque */

typedef enum {
    WEFT_INT8,
    WEFT_UINT8,
    WEFT_INT32,
    WEFT_UINT32,
    WEFT_INT64,
    WEFT_UINT64,
    WEFT_FLOAT16,
    WEFT_BFLOAT16,
    WEFT_FLOAT32,
    WEFT_FLOAT64
} weft_dtype;

typedef enum { WEFT_SUM, WEFT_PROD, WEFT_MIN, WEFT_MAX } weft_redop;

/* Static text for any code (unknown codes give "unknown error"). */
WEFT_EXPORT const char *weft_strerror(int err);
/* Short symbolic name of a code, e.g. "WEFT_EPEER". */
WEFT_EXPORT const char *weft_err_name(int err);

/* Detailed message of the last failure on c: which rank, which peer, which
 * wire, which deadline. Once c has failed it is the first cause, which
 * later consequences (peers closing their wires, say) never overwrite;
 * before that, the last bad argument. Empty string if nothing failed. The
 * text stays valid until the next call on c. With c == NULL it returns the
 * message of the last weft_init() failure in the calling thread. */
WEFT_EXPORT const char *weft_last_error(const weft_comm *c);

/* Size in bytes of one element of dtype, or 0 for an unknown dtype. */
WEFT_EXPORT size_t weft_dtype_size(weft_dtype dtype);

/* Creates a communicator from the environment: WEFT_RANK, WEFT_SIZE and
 * WEFT_HOSTFILE (as set by weftrun); else the rank and size of mpirun
 * (OMPI_COMM_WORLD_RANK/SIZE), Hydra (PMI_RANK/SIZE), Slurm
 * (SLURM_PROCID/NTASKS) or torchrun (RANK/WORLD_SIZE) with WEFT_HOSTFILE.
 * WEFT_TIMEOUT_MS sets the per-operation deadline (default 300000),
 * WEFT_CONNECT_TIMEOUT_MS how long to wait for peers (default 60000),
 * WEFT_JOB_TOKEN the job's shared secret (32 hex digits), WEFT_WIRES the
 * connections per peer and link (default 1). Blocks until every peer is
 * connected or the connect deadline passes; a peer's previous communicator
 * that still holds its port (a rank that has not yet seen the failure) is
 * waited out, not paired with. On failure *out is NULL and
 * weft_last_error(NULL) says what went wrong and what to set. */
WEFT_EXPORT int weft_init(weft_comm **out);

/* A communicator without the environment, for frameworks that start their
 * own processes and carry addresses in their own key-value store (PyTorch's
 * c10d Store, for example). */
typedef struct weft_listener weft_listener;

/* Binds a listening TCP socket on host (an IPv4 address or a name that
 * resolves to one; NULL: 127.0.0.1) at a port the system picks, and writes
 * "addr:port" into addr (addrlen bytes; 22 always suffice). Hand the string
 * to the other ranks and the listener to weft_init_config. WEFT_EINVAL for a
 * NULL out or addr, or addr too short; WEFT_ECONFIG where host does not
 * resolve; WEFT_ETRANSPORT where the socket cannot be bound.
 * weft_last_error(NULL) says which. */
WEFT_EXPORT int weft_listener_open(weft_listener **out, const char *host,
                                   char *addr, size_t addrlen);
/* Closes a listener that was not handed to weft_init_config. NULL is a
 * no-op. */
WEFT_EXPORT int weft_listener_close(weft_listener *l);

/* Zero-initialise and set what you need. A field left zero or NULL comes
 * from the environment variable weft_init reads for it (or its default);
 * a field that is set is never looked up there, and nothing is written to
 * the environment. */
typedef struct {
    int rank, size;            /* required: 0 <= rank < size */
    const char *hostfile_text; /* a hostfile in any accepted form, or NULL */
    const char *const *addrs;  /* or: size "addr:port" strings, rank order
                                  (weft_listener_open's), one link between
                                  every pair of ranks */
    weft_listener *listener;   /* this rank's (with addrs); taken over by
                                  weft_init_config, even on failure */
    const char *token;         /* 32 hex digits, or NULL: WEFT_JOB_TOKEN */
    int timeout_ms;            /* 0: WEFT_TIMEOUT_MS or the default */
    int connect_timeout_ms;    /* 0: WEFT_CONNECT_TIMEOUT_MS or default */
    int wires;                 /* 0: WEFT_WIRES or 1 */
    const char *transport;     /* NULL: WEFT_TRANSPORT or "tcp" */
    const char *topology;      /* NULL: WEFT_TOPOLOGY or "auto" */
} weft_config;

/* weft_init from *cfg instead of the environment. Neither hostfile_text
 * nor addrs: WEFT_HOSTFILE or WEFT_HOSTFILE_TEXT (for size 1, none: a job
 * of one rank needs no addresses);
 * both: WEFT_ECONFIG. With addrs, rank r is reached at addrs[r], which for
 * this rank must be its listener's address. Any number of communicators may
 * live in one process at once, made from any threads. Failures as
 * weft_init's, the message naming the weft_config field. */
WEFT_EXPORT int weft_init_config(weft_comm **out, const weft_config *cfg);

/* weft_config grows at its end in later versions. A program built against
 * this header calls weft_init_config_sized with the size of the struct it
 * knows (the macro below), and the library reads that much, taking every
 * field it does not see as zero; a program built against an older header
 * calls weft_init_config, whose struct is the first version's. */
WEFT_EXPORT int weft_init_config_sized(weft_comm **out, const weft_config *cfg,
                                       size_t size);
#define weft_init_config(out, cfg)                                             \
    weft_init_config_sized((out), (cfg), sizeof(weft_config))

/* Closes every connection and frees everything. NULL is a no-op. Returns
 * promptly even on a failed communicator. Always frees c. */
WEFT_EXPORT int weft_finalize(weft_comm *c);

/* This process's rank in c, in [0, weft_size(c)), or WEFT_EINVAL when c is
 * NULL. Never blocks; valid on a failed communicator too. */
WEFT_EXPORT int weft_rank(const weft_comm *c);
/* The number of ranks in c (>= 1), or WEFT_EINVAL when c is NULL. */
WEFT_EXPORT int weft_size(const weft_comm *c);

/* The settings c runs with and its tuning table, as text: a line of
 * "name=value" settings, then "algo=" and the table in WEFT_ALGO's form
 * (one ';'-separated entry per collective: its size ranges, in bytes of
 * each rank's buffer or block, and the algorithm of each, tried in order,
 * the last being the topology's own). Valid until weft_finalize(c); NULL
 * when c is NULL. */
WEFT_EXPORT const char *weft_info(const weft_comm *c);

/* The wires between this rank and a peer over cables (links x wires per
 * link; a peer reached through shared memory or a relay has none). */
typedef struct {
    int total;     /* wires to this peer (links x wires per link) */
    int up;        /* carrying traffic now */
    unsigned lost; /* wires lost since the communicator was made */
    unsigned back; /* wires that came back */
} weft_wire_info;

/* Fills *out for peer (a rank of c other than this one): WEFT_OK, or
 * WEFT_EINVAL for a NULL c or out, or a peer out of range or this rank.
 * Never blocks; valid on a failed communicator too. A wire is lost when
 * its connection ended with an error or went silent for
 * WEFT_WIRE_TIMEOUT_MS (WEFT_LOG=warn says which and why). */
WEFT_EXPORT int weft_peer_wires(const weft_comm *c, int peer,
                                weft_wire_info *out);

/* Communicators made of another's ranks. Both make new connections among
 * their ranks (with the same wires, shared memory, topology and settings
 * as c), and both give a communicator to be finalized as any other.
 *
 * weft_comm_shrink: the ranks of c that call it and are alive agree on
 * who they are, and each gets in *out a communicator of exactly that
 * set, in c's order, renumbered from 0. A rank that died, or that does
 * not call it before the connect deadline (WEFT_CONNECT_TIMEOUT_MS), is
 * left out (a rank whose port refuses a connection is gone: a process
 * keeps its port from weft_init to weft_finalize); a rank that dies
 * during the agreement leaves the others agreeing on one set. Where the
 * hosts left no longer form a ring of cables (a host lost from a ring of
 * 4 or more), the ring's step between two hosts no cable joins runs
 * through the hosts between (TCP; WEFT_ENOTSUP under ibverbs). May be
 * called on a failed communicator (the use it is for) or a healthy one;
 * either way c is failed afterwards (every operation WEFT_EABORTED) and
 * must still be finalized. On failure *out is NULL and
 * weft_last_error(NULL) says why (a rank of the set that died while the
 * new communicator was being made: call it again).
 *
 * weft_comm_split: collective over a healthy c (every rank calls it, in
 * the same order with the other collectives): the ranks that give one
 * color >= 0 form a communicator, ordered by key, then by rank in c;
 * color < 0 gives *out NULL. The ranks of one host must come one after
 * another in the new order (else WEFT_ENOTSUP on every rank of that
 * color). c stays usable.
 *
 * weft_comm_origin_rank: the rank that member rank of c had in the
 * communicator weft_init or weft_init_config made, which c was shrunk or
 * split from (rank itself for that one); WEFT_EINVAL out of range. */
WEFT_EXPORT int weft_comm_shrink(weft_comm *c, weft_comm **out);
WEFT_EXPORT int weft_comm_split(weft_comm *c, int color, int key,
                                weft_comm **out);
WEFT_EXPORT int weft_comm_origin_rank(const weft_comm *c, int rank);

/* Sets the deadline of each later call on c, in milliseconds (> 0; else
 * WEFT_EINVAL and the deadline is unchanged). A call's deadline starts when
 * it is called and covers all of it: every exchange, relay and retry it
 * takes. A call still running past it returns WEFT_ETIMEDOUT, and c is then
 * failed. Default: WEFT_TIMEOUT_MS, else 300000. */
WEFT_EXPORT int weft_set_timeout(weft_comm *c, int timeout_ms);

/* Aborts c: a call blocked on c returns WEFT_EABORTED promptly, and every
 * later operation returns WEFT_EABORTED. Callable from any thread while c
 * exists (not concurrently with weft_finalize on c). */
WEFT_EXPORT int weft_abort(weft_comm *c);

/* Operations, collective and point to point. All of them:
 * - block until done, WEFT_ETIMEDOUT at the deadline (weft_set_timeout);
 * - borrow their buffers only for the call;
 * - take count elements of dtype; count == 0 is legal and completes without
 *   moving data; a count whose bytes (times the number of ranks, where a
 *   buffer holds a block per rank) exceed SIZE_MAX / 4 is WEFT_EINVAL;
 * - return WEFT_EINVAL for bad arguments (NULL buffer with count > 0,
 *   unknown dtype or op, root or peer out of range) before anything moves,
 *   leaving c usable;
 * - on a failure (WEFT_ETIMEDOUT, WEFT_EPEER, WEFT_EMISMATCH,
 *   WEFT_ETRANSPORT, WEFT_ENOMEM while moving data) fail c: every later
 *   call on it returns WEFT_EABORTED at once, and weft_last_error(c) keeps
 *   the cause. weft_finalize, then weft_init, recovers.
 * Collectives must be called by every rank, in the same order, with the
 * same count, dtype, op and root (else WEFT_EMISMATCH, see the top).
 *
 * sendbuf == recvbuf is the in-place form; buffers that overlap otherwise
 * (here and in the two below, but for their in-place forms) are
 * WEFT_EINVAL. Results of weft_all_reduce are bitwise identical on every
 * rank (the same reduction order everywhere). */
WEFT_EXPORT int weft_all_reduce(weft_comm *c, const void *sendbuf,
                                void *recvbuf, size_t count, weft_dtype dtype,
                                weft_redop op);
/* recvbuf holds size*count elements; rank r's contribution lands at
 * r*count. In place: sendbuf == recvbuf + rank*count elements (as NCCL), or
 * sendbuf == recvbuf with this rank's data in the first count elements. */
WEFT_EXPORT int weft_all_gather(weft_comm *c, const void *sendbuf,
                                void *recvbuf, size_t count, weft_dtype dtype);
/* sendbuf holds size*recvcount elements; rank r receives the reduction of
 * block r. In place: recvbuf == sendbuf + rank*recvcount elements (as
 * NCCL), or recvbuf == sendbuf, the result landing in the first block. */
WEFT_EXPORT int weft_reduce_scatter(weft_comm *c, const void *sendbuf,
                                    void *recvbuf, size_t recvcount,
                                    weft_dtype dtype, weft_redop op);
/* Copies count elements of root's buf into buf on every other rank. root
 * is in [0, size); every rank must name the same one. */
WEFT_EXPORT int weft_broadcast(weft_comm *c, void *buf, size_t count,
                               weft_dtype dtype, int root);
/* Sends count elements of buf to peer (not this rank), which must call
 * weft_recv (or weft_sendrecv) with the same count and dtype; messages
 * between a pair are matched in order. Returns once the bytes have left
 * buf (not once they are received), so a send may complete before its
 * receive is posted. Between ranks whose hosts share no link, the message
 * is forwarded along the ring by the ranks between, while they are inside
 * a weft call. A peer that has closed or reset its wires is WEFT_EPEER. */
WEFT_EXPORT int weft_send(weft_comm *c, const void *buf, size_t count,
                          weft_dtype dtype, int peer);
/* Receives count elements from peer into buf; the matching weft_send must
 * give the same count and dtype (else WEFT_EMISMATCH). Bytes a peer sent
 * before it left are still received; WEFT_EPEER once it has gone and more
 * was wanted. */
WEFT_EXPORT int weft_recv(weft_comm *c, void *buf, size_t count,
                          weft_dtype dtype, int peer);
/* Sends count elements of sendbuf to peer dst while receiving count
 * elements from peer src into recvbuf, at the same time (so a ring of
 * sendrecv calls cannot deadlock, and both directions of a link carry
 * data). dst and src may be the same peer; neither may be this rank.
 * sendbuf == recvbuf (or buffers that overlap) is the in-place form: what
 * the buffer held when the operation started is sent, and the peer's
 * elements replace it. */
WEFT_EXPORT int weft_sendrecv(weft_comm *c, const void *sendbuf, int dst,
                              void *recvbuf, int src, size_t count,
                              weft_dtype dtype);
/* Returns on each rank only once every rank has called it (or fails as
 * the operations above do). */
WEFT_EXPORT int weft_barrier(weft_comm *c);

/* ---- Non-blocking operations ----
 *
 * weft_i<op> posts the operation and returns at once; the operation
 * progresses without the caller (a progress thread per communicator,
 * started at the first post), and *req tracks it. Arguments and their
 * checks are those of the blocking call. A post that returns an error
 * posted nothing and sets *req to NULL: WEFT_EINVAL for bad arguments (c
 * still usable), WEFT_EABORTED on a failed or aborted communicator.
 *
 * - Order: operations on c take effect in the order they were posted
 *   (every rank posts its collectives in the same order); a blocking call
 *   is a post and a wait. Each sees the results of every operation posted
 *   before it, whatever their buffers share.
 * - Buffers are borrowed from the post until the request completes.
 * - Deadline: each operation's (weft_set_timeout at its post) runs from
 *   when it starts, once every earlier operation on c has ended.
 * - Errors: a failure completes the failing request with its code and
 *   every later pending one with WEFT_EABORTED; weft_last_error(c) keeps
 *   the first cause, and c is failed.
 * - weft_abort completes every pending request with WEFT_EABORTED
 *   promptly; weft_finalize with requests pending aborts them (their
 *   callbacks run) and returns promptly; requests stay valid until
 *   weft_request_free, also after weft_finalize.
 * - Threads: posts on c come from one thread at a time; weft_test,
 *   weft_wait, weft_wait_all, weft_request_free and weft_abort may be
 *   called from any thread. */
typedef struct weft_request weft_request;

WEFT_EXPORT int weft_iall_reduce(weft_comm *c, const void *sendbuf,
                                 void *recvbuf, size_t count, weft_dtype dtype,
                                 weft_redop op, weft_request **req);
WEFT_EXPORT int weft_iall_gather(weft_comm *c, const void *sendbuf,
                                 void *recvbuf, size_t count, weft_dtype dtype,
                                 weft_request **req);
WEFT_EXPORT int weft_ireduce_scatter(weft_comm *c, const void *sendbuf,
                                     void *recvbuf, size_t recvcount,
                                     weft_dtype dtype, weft_redop op,
                                     weft_request **req);
WEFT_EXPORT int weft_ibroadcast(weft_comm *c, void *buf, size_t count,
                                weft_dtype dtype, int root, weft_request **req);
WEFT_EXPORT int weft_isend(weft_comm *c, const void *buf, size_t count,
                           weft_dtype dtype, int peer, weft_request **req);
WEFT_EXPORT int weft_irecv(weft_comm *c, void *buf, size_t count,
                           weft_dtype dtype, int peer, weft_request **req);
WEFT_EXPORT int weft_isendrecv(weft_comm *c, const void *sendbuf, int dst,
                               void *recvbuf, int src, size_t count,
                               weft_dtype dtype, weft_request **req);
WEFT_EXPORT int weft_ibarrier(weft_comm *c, weft_request **req);

/* Tagged point to point, and receives from any source. A receive takes
 * the first message of its tag (>= 0; a negative tag is WEFT_EINVAL)
 * from its peer, whatever other tags came before it: messages of one tag
 * between one pair match in post order, and a message of another tag
 * never matches. weft_send and weft_recv are tag 0. The count and dtype
 * must be the send's (else WEFT_EMISMATCH, nothing written past the
 * buffer). Count 0 moves nothing and completes at once. A message that
 * arrives before its receive is posted is held in memory (up to 64 MiB
 * per communicator on a peer's wires; past that the wire waits for the
 * receive). peer WEFT_ANY_SOURCE receives the first message of the tag
 * from whichever rank sends it; several such receives each take another
 * message, and a receive of the same tag posted after one waits for it
 * to complete. */
#define WEFT_ANY_SOURCE (-1)
WEFT_EXPORT int weft_isend_tag(weft_comm *c, const void *buf, size_t count,
                               weft_dtype dtype, int peer, int tag,
                               weft_request **req);
WEFT_EXPORT int weft_irecv_tag(weft_comm *c, void *buf, size_t count,
                               weft_dtype dtype, int peer, int tag,
                               weft_request **req);
/* The rank a receive's message came from, once it completed with
 * WEFT_OK and count > 0; -1 for any other request (pending, failed, a
 * send, a collective, count 0) or NULL. */
WEFT_EXPORT int weft_request_source(const weft_request *req);

/* Never blocks: *done is 0 while req is pending (returns WEFT_OK), 1 once
 * it completed (returns the operation's result). WEFT_EINVAL for a NULL
 * req or done. May be called again after completion. */
WEFT_EXPORT int weft_test(weft_request *req, int *done);
/* Blocks until req completes (at the latest at its deadline) and returns
 * its result; again after completion returns the same result. */
WEFT_EXPORT int weft_wait(weft_request *req);
/* Waits for every request of reqs (NULL entries are skipped) and returns
 * WEFT_OK or the first failure in array order. */
WEFT_EXPORT int weft_wait_all(weft_request *const *reqs, size_t n);
/* Frees req; NULL is a no-op. A pending request still completes (its
 * buffers stay borrowed until then, its callback still runs) and is freed
 * then. Valid after weft_finalize of its communicator. */
WEFT_EXPORT int weft_request_free(weft_request *req);
/* Runs cb(req, result, arg) exactly once when req completes: at once in
 * this thread if it already has, else in the thread that completes it.
 * cb must not block nor call a blocking weft function. One callback per
 * request (a second is WEFT_EINVAL). */
typedef void (*weft_callback)(weft_request *req, int result, void *arg);
WEFT_EXPORT int weft_request_on_complete(weft_request *req, weft_callback cb,
                                         void *arg);

/* ---- The rooted collectives and the all-to-alls ----
 * The same contract as the operations above: every rank calls them in the
 * same order with the same count, dtype, op and root (a rank whose call
 * differs gets WEFT_EMISMATCH, or its deadline, never another call's
 * data); one deadline per call; count 0 completes at once; buffers are
 * borrowed until completion (all_to_allv's counts and displacements
 * too). A root out of [0, size), a NULL buffer that the rank needs with
 * count > 0, counts that overflow and buffers that overlap other than in
 * the in-place forms below are WEFT_EINVAL, nothing sent. */

/* The reduction of every rank's count elements of sendbuf lands in the
 * root's recvbuf (recvbuf is ignored, and may be NULL, elsewhere). In
 * place: sendbuf == recvbuf on the root. */
WEFT_EXPORT int weft_reduce(weft_comm *c, const void *sendbuf, void *recvbuf,
                            size_t count, weft_dtype dtype, weft_redop op,
                            int root);
/* Rank r's count elements of sendbuf land at r*count of the root's
 * recvbuf (size*count elements; ignored, and may be NULL, elsewhere). In
 * place: sendbuf == recvbuf + root*count elements on the root. */
WEFT_EXPORT int weft_gather(weft_comm *c, const void *sendbuf, void *recvbuf,
                            size_t count, weft_dtype dtype, int root);
/* Block r (count elements at r*count) of the root's sendbuf (size*count
 * elements; ignored, and may be NULL, elsewhere) lands in rank r's
 * recvbuf. In place: recvbuf == sendbuf + root*count elements on the
 * root. */
WEFT_EXPORT int weft_scatter(weft_comm *c, const void *sendbuf, void *recvbuf,
                             size_t count, weft_dtype dtype, int root);
/* Block p of sendbuf (count elements at p*count) goes to rank p, and rank
 * p's block for this rank lands at p*count of recvbuf; both buffers hold
 * size*count elements. In place: sendbuf == recvbuf. */
WEFT_EXPORT int weft_all_to_all(weft_comm *c, const void *sendbuf,
                                void *recvbuf, size_t count, weft_dtype dtype);
/* sendcounts[p] elements at sdispls[p] of sendbuf go to rank p;
 * recvcounts[p] elements from rank p land at rdispls[p] of recvbuf (all
 * in elements, size entries each). Rank i's sendcounts[j] must be rank
 * j's recvcounts[i]: a pair whose counts differ fails the call with
 * WEFT_EMISMATCH on every rank (a rank's own pair differing is
 * WEFT_EINVAL). The buffers must not overlap (no in-place form). */
WEFT_EXPORT int weft_all_to_allv(weft_comm *c, const void *sendbuf,
                                 const size_t *sendcounts,
                                 const size_t *sdispls, void *recvbuf,
                                 const size_t *recvcounts,
                                 const size_t *rdispls, weft_dtype dtype);
WEFT_EXPORT int weft_ireduce(weft_comm *c, const void *sendbuf, void *recvbuf,
                             size_t count, weft_dtype dtype, weft_redop op,
                             int root, weft_request **req);
WEFT_EXPORT int weft_igather(weft_comm *c, const void *sendbuf, void *recvbuf,
                             size_t count, weft_dtype dtype, int root,
                             weft_request **req);
WEFT_EXPORT int weft_iscatter(weft_comm *c, const void *sendbuf, void *recvbuf,
                              size_t count, weft_dtype dtype, int root,
                              weft_request **req);
WEFT_EXPORT int weft_iall_to_all(weft_comm *c, const void *sendbuf,
                                 void *recvbuf, size_t count, weft_dtype dtype,
                                 weft_request **req);
WEFT_EXPORT int weft_iall_to_allv(weft_comm *c, const void *sendbuf,
                                  const size_t *sendcounts,
                                  const size_t *sdispls, void *recvbuf,
                                  const size_t *recvcounts,
                                  const size_t *rdispls, weft_dtype dtype,
                                  weft_request **req);

#ifdef __cplusplus
}
#endif
#endif /* WEFT_H */
