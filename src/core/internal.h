/*
 * Internal declarations shared by the core, the algorithms and the
 * transports. Nothing here is part of the public API.
 */
#ifndef WEFT_INTERNAL_H
#define WEFT_INTERNAL_H

/* configure's results (WEFT_HAVE_IBVERBS, ...). */
#ifdef HAVE_CONFIG_H
#include "config.h"
#endif

#include "weft.h"

#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#define WEFT__TOKEN_BYTES 16
#define WEFT__MAX_WIRES 64       /* wires to one peer, all links together */
#define WEFT__MAX_RANKS 4096
/* Most ranks a mesh job may have: one engine lane per peer. */
#define WEFT__MESH_MAX_RANKS 17
#define WEFT__DEFAULT_PORT 32323
#define WEFT__DEFAULT_TIMEOUT_MS 300000
#define WEFT__DEFAULT_CONNECT_TIMEOUT_MS 60000
#define WEFT__DEFAULT_FRAME_BYTES (256 * 1024)
#define WEFT__DEFAULT_SOCKBUF_BYTES (4 << 20)
#define WEFT__DEFAULT_SPIN_US 50
/* The ibverbs transport's registered staging per queue pair: this many
 * slots of this many bytes each way (WEFT_IB_SLOTS, WEFT_IB_SLOT_BYTES). */
#define WEFT__DEFAULT_IB_SLOTS 16
#define WEFT__DEFAULT_IB_SLOT_BYTES (256 * 1024)
#define WEFT__ERRMSG_LEN 512
/* Default thresholds, each set by an environment variable of the same
 * name with one underscore (WEFT_SMALL_ALL_REDUCE_BYTES, ...), and
 * measured with bench/thresholds.
 * - Up to SMALL_ALL_REDUCE_BYTES gathered (count * size * nranks),
 *   all_reduce gathers every input and reduces locally in rank order: one
 *   exchange with every peer where all are directly connected, else n-1
 *   ring steps, instead of the 2n-2 steps of reduce-scatter + all-gather.
 * - From BIDIR_MIN_BYTES, ring operations run both ring directions at once,
 *   each on half of the data; below, the second direction's extra frames
 *   cost more than it adds.
 * - Under the mesh, MESH_SMALL_ALL_REDUCE_BYTES plays that part (one
 *   exchange of the inputs against the direct reduce-scatter +
 *   all-gather; also the small/large switch of the mesh's broadcast):
 *   measured at 128 KiB gathered (4 ranks x 32 KiB) on both a 2-core and
 *   a 16-core machine. */
#define WEFT__SMALL_ALL_REDUCE_BYTES (32 * 1024)
#define WEFT__MESH_SMALL_ALL_REDUCE_BYTES (128 * 1024)
#define WEFT__BIDIR_MIN_BYTES (2 * 1024 * 1024)

/* One end of a cable: a host (by index) and its address there. */
typedef struct {
    int host;
    char addr[64];
    char device[64]; /* RDMA device name, "" if none */
} weft__link_end;

/* A link is one cable between two hosts. */
typedef struct {
    weft__link_end end[2];
} weft__link;

typedef struct {
    char name[128];
    char ssh[256];
    int nranks;
    int first_rank;
    int *ports; /* nranks entries: the port each local rank listens on */
} weft__host;

/* Everything weft_init learns from the environment and the hostfile. */
typedef struct weft__config {
    int rank;
    int nranks;
    int timeout_ms;
    int connect_timeout_ms;
    int wires;          /* connections per peer per link */
    size_t frame_bytes; /* pipeline frame size */
    int sockbuf_bytes;  /* SO_SNDBUF/SO_RCVBUF, 0: the kernel's autotuning */
    int spin_us;        /* poll this long before sleeping in a wait */
    size_t min_wire_bytes;        /* plan.h */
    size_t small_all_reduce_bytes; /* see the defaults above */
    size_t mesh_small_all_reduce_bytes;
    size_t bidir_min_bytes;
    char transport[16]; /* "tcp" or "ibverbs" */
    int ib_slots;         /* ibverbs: staging slots per queue pair */
    size_t ib_slot_bytes; /* ibverbs: bytes per slot */
    char ib_device[64];   /* ibverbs: WEFT_IB_DEVICE, "" if unset */
    char topology[16];  /* "ring", "mesh" or "auto", as asked */
    int mesh;           /* 1: the topology in effect is the mesh */
    uint8_t token[WEFT__TOKEN_BYTES];
    char hostfile[1024];
    int nhosts;
    weft__host *hosts;
    int nlinks;
    weft__link *links;
    int *rank_host; /* nranks entries: host index of each rank */
} weft__config;

/* Reads the configuration from the environment. On failure fills errmsg
 * (what is wrong and what to set) and returns WEFT_ECONFIG or WEFT_ENOMEM. */
int weft__config_load(weft__config *cfg, char *errmsg, size_t errlen);
void weft__config_free(weft__config *cfg);
/* The port rank r listens on. */
int weft__config_rank_port(const weft__config *cfg, int r);

struct weft__tp;
struct weft__tp_params;
struct weft__engine;

/* Where failures are recorded: code and text together, the first cause
 * wins and is never overwritten by its consequences (a peer that closes
 * its wires after it found a mismatch, say). A communicator has one; the
 * engine and the transports report into the one they are given. */
typedef struct weft__errsink {
    int code; /* 0 until the first failure */
    int rank; /* for the log line */
    char msg[WEFT__ERRMSG_LEN];
} weft__errsink;

/* Records a failure in s unless one is there already, and logs it once.
 * Returns the code s holds afterwards (the first cause's). */
int weft__fail(weft__errsink *s, int err, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
int weft__vfail(weft__errsink *s, int err, const char *fmt, va_list ap)
    __attribute__((format(printf, 3, 0)));

/* What every engine pass of the public call in progress shares, fixed once
 * when the call starts: its one deadline, and what ranks must agree on for
 * their calls to match (each pass's headers carry it). */
typedef struct weft__call {
    uint64_t deadline_ms; /* weft__now_ms() clock */
    const char *name;     /* "all_reduce", ... for messages */
    int kind;             /* WEFT__OP_* (engine.h) */
    int dtype;
    int redop;            /* -1 where the call has none */
    int root;             /* -1 where the call has none */
    uint64_t count;
    uint64_t seq;  /* collectives: the communicator's count of them */
    int passes;    /* engine passes run so far */
} weft__call;

struct weft_comm {
    weft__config cfg;
    int rank;
    int nranks;
    int timeout_ms;
    weft__errsink fail; /* the first failure; the communicator is failed
                           once fail.code != 0 */
    atomic_int aborted;
    char errmsg[WEFT__ERRMSG_LEN]; /* last non-failing error (bad args) */
    weft__call call;
    uint64_t coll_seq;  /* collectives started on this communicator */
    struct weft__tp *tp;
    const struct weft__tp_ops *tpo;
    struct weft__tp_params *tpp; /* what the transport was created with */
    struct weft__engine *eng;
    uint32_t *send_seq; /* per peer: point-to-point sends to it */
    uint32_t *recv_seq; /* per peer: point-to-point receives from it */
    void *scratch;      /* grown on demand for algorithms that need it */
    size_t scratch_bytes;
};

/* Records err on c's error record (the first failure wins) and returns
 * the code the record holds. */
int weft__set_error(struct weft_comm *c, int err, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* An error that does not fail c (a bad argument, found before anything
 * moved): its text becomes weft_last_error(c) unless c has failed. */
int weft__note(struct weft_comm *c, int err, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* Logging to stderr, prefixed with the rank. Level from WEFT_LOG
 * (error, warn, info, debug; default warn). */
enum { WEFT__LOG_ERROR, WEFT__LOG_WARN, WEFT__LOG_INFO, WEFT__LOG_DEBUG };
void weft__log(int level, int rank, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
int weft__log_enabled(int level);

/* Milliseconds on a monotonic clock. */
uint64_t weft__now_ms(void);
/* Nanoseconds on the same clock, for spin loops. */
uint64_t weft__now_ns(void);

/* A transport's first failure: where *tp_err is still 0, sets it to err
 * and records the message in sink (weft__fail); later failures, which
 * are consequences of the first, are dropped. */
void weft__tp_fail(weft__errsink *sink, int *tp_err, int err, const char *fmt,
                   va_list ap) __attribute__((format(printf, 4, 0)));

/* Writes to a socket whose peer vanished raise SIGPIPE, which would kill
 * the process; a peer that vanished must instead become WEFT_EPEER. Every
 * stretch of code that may write to a socket runs between these two calls:
 * SIGPIPE is blocked on the calling thread, and one raised meanwhile is
 * consumed (unless it was already pending before). */
typedef struct {
    sigset_t old;
    int was_pending;
} weft__sigpipe_state;
void weft__sigpipe_block(weft__sigpipe_state *st);
void weft__sigpipe_restore(weft__sigpipe_state *st);

/* Grows c->scratch to at least nbytes. */
int weft__scratch(struct weft_comm *c, size_t nbytes, void **out);

#endif
