/*
 * Shared-memory transport: ranks of one host exchange frames through
 * shared rings, everything else goes over the transport that joins the
 * hosts (TCP or ibverbs, through weft__tp_far: transport/common.h). What the
 * files of src/transport/shm/ share; only they include this header (the
 * engine sees the transport through weft__shm_ops).
 *
 * The files: setup.c (the TCP side, the segments and how they are shared,
 * create, shutdown, destroy, the ops table), data.c (the rings, posting,
 * one-copy reads, deaths, progress and sleeping), box.c (a slot per rank
 * and call for the few bytes of a collective among every rank of the
 * host), wake.c (failures, and waking the peers that sleep, for data.c
 * and box.c).
 *
 * The TCP side: create() opens the far transport for the whole job, with
 * one loopback TCP connection per peer of this host instead of `wires`
 * (under ibverbs: its TCP side's, and no queue pairs to them). Peers on
 * other hosts use it for everything, as plain TCP or ibverbs would. To a peer
 * of this host the connection carries only the set-up messages; after that it
 * stays open, so that the peer's death (or its finalize) closes it, which
 * this rank sees at once even while it only waits. Its leaving is noted,
 * not a failure: what it wrote into the ring before it left is still
 * handed to the receives that want it, and the leaving counts (WEFT_EPEER)
 * once a receive wants more than the ring holds, or a send is posted to it.
 *
 * Segments: one per pair of ranks of a host, an anonymous memfd (nothing
 * in /dev/shm, so nothing is left behind after any exit, a crash
 * included), created by the lower rank and handed to the higher one over a
 * Unix datagram socket in the abstract namespace (SCM_RIGHTS). Each rank
 * has one such socket (its name chosen by the kernel, so also nothing in
 * the file system); the datagram carries a nonce that the receiver sent to
 * that peer over its TCP connection, whose handshake proved the job token,
 * so no other process of the host can slip in a segment. The same socket
 * is the rank's doorbell (below).
 *
 * Rings: the segment holds a header and two rings of ring_bytes, one per
 * direction, each a single-producer single-consumer byte ring with head
 * (bytes written) and tail (bytes consumed) counters on their own cache
 * lines. The producer writes records: a 16-byte header (kind, length,
 * address), then for an inline record its bytes (padded to 16). A frame
 * is written as one or more inline records, as the ring has room, and
 * completes once all of its bytes are in the ring: they stay readable by
 * the consumer whatever the producer does next, a crash included. A frame
 * of at least cma_bytes, to a peer that proved it can read this process's
 * memory (process_vm_readv, tried on a probe word at set-up), is one
 * record that names its address instead: the consumer copies it straight
 * from this process into its receive buffers (one copy instead of two),
 * counts it in the ring's cma_done, and only then does the frame complete
 * here, since its buffer is read until that moment. Where the kernel
 * refuses cross-memory reads (ptrace restrictions, another user), frames
 * go through the ring.
 *
 * The consumer hands records to its posted receives in order, so a
 * receive of len bytes completes once exactly len bytes of the stream
 * have landed, as with TCP.
 *
 * Completions run only inside progress(): a post copies what it can at
 * once and queues the frame's completion if it finished.
 *
 * Sleeping: progress() polls the rings, then spins up to WEFT_SPIN_US,
 * then sleeps in poll() on its doorbell socket and the TCP side's fd. Before
 * it sleeps it raises its flag in every segment it shares and looks at the
 * rings once more; a peer that moves a ring (a producer that writes, a
 * consumer that frees room or finishes a one-copy read) looks at the flag
 * after a full fence and, if it was raised, lowers it and sends one
 * datagram to the sleeper's socket. Lost wake-ups are impossible in that
 * order (each side writes, fences, then reads the other's word).
 */

#ifndef WEFT_TRANSPORT_SHM_H
#define WEFT_TRANSPORT_SHM_H

#include "transport/common.h"
#include "transport/tcp/boot.h"
#include "transport/transport.h"

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/socket.h>
#include <sys/types.h>
#include <sys/un.h>

/* ThreadSanitizer has no interceptor for memfd_create, so it never sees a
 * segment's descriptor made: its record of that number still holds the
 * last owner's accesses (another thread's socket, which libuv closed with
 * a raw system call TSan does not see either), and the segment's
 * ftruncate, mmap and close were reported as racing with them (configprog,
 * communicators in threads of one process). Those calls are made between
 * SHM_FD_UNSEEN_BEGIN and _END, which under TSan ignore this thread's
 * accesses; a segment's descriptor is used by one thread only, and its
 * memory is shared with another process, which TSan does not see. */
#ifdef __SANITIZE_THREAD__
void AnnotateIgnoreReadsBegin(const char *file, int line);
void AnnotateIgnoreReadsEnd(const char *file, int line);
void AnnotateIgnoreWritesBegin(const char *file, int line);
void AnnotateIgnoreWritesEnd(const char *file, int line);
#define SHM_FD_UNSEEN_BEGIN()                                                  \
    (AnnotateIgnoreReadsBegin(__FILE__, __LINE__),                             \
     AnnotateIgnoreWritesBegin(__FILE__, __LINE__))
#define SHM_FD_UNSEEN_END()                                                    \
    (AnnotateIgnoreWritesEnd(__FILE__, __LINE__),                              \
     AnnotateIgnoreReadsEnd(__FILE__, __LINE__))
#else
#define SHM_FD_UNSEEN_BEGIN() ((void)0)
#define SHM_FD_UNSEEN_END() ((void)0)
#endif

/* A fence of order mo between this rank's accesses to shared memory.
 * GCC refuses fences under -fsanitize=thread, which does not model them;
 * the other side of these is another process (or another mapping of the
 * segment), which ThreadSanitizer does not see anyway, so there a locked
 * read-modify-write orders the same (as strong as any order). */
static inline void shm_fence(memory_order mo)
{
#ifdef __SANITIZE_THREAD__
    static _Atomic unsigned word;
    (void)mo;
    atomic_fetch_add_explicit(&word, 0, memory_order_seq_cst);
#else
    atomic_thread_fence(mo);
#endif
}

#define SHM_MAGIC 0x4d534657u /* "WFSM" */
#define SHM_VERSION 4u
#define SHM_HELLO_BYTES 128
#define SHM_DONE_BYTES 16
#define SHM_FD_MSG_BYTES 24
#define SHM_REC_HDR 16
#define SHM_SEG_HDR 4096 /* the segment's header page; the rings follow */
#define SHM_MAX_IOV 16
#define SHM_CMA_MAX_RECORD (1u << 30) /* bytes one one-copy record names */
/* While spinning, the TCP side (other hosts' wires, a peer's close) is
 * looked at this often. */
#define SHM_TCP_EVERY_NS 20000

/* A send's look at its peer's liveness (weft__shm_post_send) is due when
 * neither progress() nor an earlier send looked for this many ticks of
 * shm_ticks(): the time-stamp counter where there is one (a read costs a
 * tenth of the system clock's, which took 10% of an 8-byte all_reduce on
 * the 2-core VM), 20-100 us at its 1-5 GHz; else the clock's ns. */
#if defined(__x86_64__) || defined(__i386__)
#define SHM_HUP_EVERY_TICKS 100000u
static inline uint64_t shm_ticks(void)
{
    return __builtin_ia32_rdtsc();
}
#else
#define SHM_HUP_EVERY_TICKS SHM_TCP_EVERY_NS
static inline uint64_t shm_ticks(void)
{
    return weft__now_ns();
}
#endif
#define SHM_CACHE_LINE 64
/* A spin that has waited this long looks, at each look at the clock
 * (every 64 passes), whether a peer of this host last spun on this core,
 * and then yields it (weft__shm_progress). Where the scheduler puts two
 * ranks that wait for each other on one core, a spin without yields holds
 * that core until WEFT_SPIN_US ends and then sleeps: 2-core VM, 2 ranks
 * under `taskset -c 0`, 8 B all_reduce, 58 us a call. Unpinned, the
 * scheduler did that in 8 of 12 runs of one hour, and it lasted whole
 * sweeps. Yielding whatever the peer's core, a rank also gave its core to
 * its own progress thread (woken by each weft_iall_reduce), which cost
 * 9-29 us a call (weft-bench -N 1). */
#define SHM_YIELD_NS 2000

enum { REC_INLINE = 1, REC_CMA = 2 };

/* The box (box.c): where every rank of the job is on this host, one more
 * segment, made by the lowest rank and handed to each peer with their
 * pair's segment, holds an area per rank: SHM_BOX_DEPTH slots, one message
 * of up to SHM_BOX_MSG bytes each, for collective call number seq in slot
 * seq % SHM_BOX_DEPTH. A rank writes its message once (then, release, the
 * slot's seq) and reads each peer's from the peer's slot (acquire on seq):
 * a call among every rank of the host moves its few bytes with one store
 * and a load per peer, no ring, no record. A call that runs on frames
 * writes its header into the rank's note instead (a seqlock), so that a
 * peer whose call went to the box sees the difference. A slot is written
 * again (call seq + SHM_BOX_DEPTH) once every peer has started call
 * seq + 1, which its slots and note say (every call writes one of them);
 * done says it for a rank that left. */
#define SHM_BOX_DEPTH 4
#define SHM_BOX_MSG WEFT__BOX_MSG_MAX
#define SHM_BOX_MAX_RANKS 64
#define SHM_BOX_HDR SHM_CACHE_LINE
/* The longest sleep while a box call waits for a peer to start a call
 * (a note moves without a wake-up, box.c). */
#define SHM_BOX_ROOM_MS 1
typedef struct {
    _Alignas(SHM_CACHE_LINE) _Atomic uint64_t seq; /* 0: never written */
    uint32_t len;
    uint8_t msg[SHM_BOX_MSG]; /* a header fits the first cache line */
} shm_box_slot;
_Static_assert(sizeof(shm_box_slot) % SHM_CACHE_LINE == 0,
               "a box slot is whole cache lines");
#define SHM_NOTE_WORDS 7
typedef struct {
    _Alignas(SHM_CACHE_LINE) _Atomic uint64_t seq; /* 0 while written */
    _Atomic uint64_t w[SHM_NOTE_WORDS];            /* the header */
} shm_box_note;
_Static_assert(sizeof(shm_box_note) == SHM_CACHE_LINE, "a note is a line");
typedef struct {
    shm_box_slot slot[SHM_BOX_DEPTH];
    shm_box_note note;
    /* The last call the rank ended, written when it leaves (its failure,
     * its finalize) and after a call whose number its slots and note do
     * not show (a batch's). */
    _Alignas(SHM_CACHE_LINE) _Atomic uint64_t done;
} shm_box_area;

/* One direction's ring counters, each on its own cache line. */
typedef struct {
    _Alignas(SHM_CACHE_LINE) _Atomic uint64_t head; /* bytes written */
    _Alignas(SHM_CACHE_LINE) _Atomic uint64_t tail; /* bytes consumed */
    /* One-copy records the consumer has read (the producer's frames that
     * they name complete then). */
    _Alignas(SHM_CACHE_LINE) _Atomic uint64_t cma_done;
    /* The producer waits for the consumer: for room (frames queued that
     * the ring cannot take) or for one-copy reads. Only then does the
     * consumer's progress wake it; else a wake-up would be for nothing. */
    _Alignas(SHM_CACHE_LINE) _Atomic uint32_t want;
} shm_ring;

/* The segment's header: side 0 is the lower rank of the pair. */
typedef struct {
    uint32_t magic;
    uint32_t version;
    uint64_t ring_bytes;
    /* Side s sleeps and wants a datagram when the other side moves a
     * ring. */
    _Alignas(SHM_CACHE_LINE) _Atomic uint32_t sleeping0;
    _Alignas(SHM_CACHE_LINE) _Atomic uint32_t sleeping1;
    /* Side s failed or finalized: the buffers its one-copy records name
     * may have been handed back to its caller. */
    _Atomic uint32_t aborted0;
    _Atomic uint32_t aborted1;
    /* The core side s was on when it last spun long (sched_getcpu() + 1;
     * 0: not yet): a rank that spins yields only where a peer is on its
     * own core (peer_on_my_core, data.c). */
    _Alignas(SHM_CACHE_LINE) _Atomic uint32_t cpu0;
    _Alignas(SHM_CACHE_LINE) _Atomic uint32_t cpu1;
    shm_ring ring[2]; /* ring[s] carries side s's bytes to the other */
} shm_seg;
_Static_assert(sizeof(shm_seg) <= SHM_SEG_HDR, "segment header fits a page");

typedef struct shm_tp shm_tp;

/* A peer of this host, reached through one segment. */
typedef struct shm_wire {
    shm_tp *tp;
    int peer;
    int side; /* 0: this rank is the lower of the pair */
    pid_t pid;
    struct sockaddr_un doorbell; /* the peer's socket */
    socklen_t doorbell_len;
    uint64_t nonce_out; /* sent to the peer; its datagram must carry it */
    uint64_t nonce_in;  /* the peer's, carried back in this rank's datagram */
    uint64_t probe_addr, probe_value; /* the peer's probe word */
    int can_read_peer;                /* process_vm_readv of the peer works */
    int peer_reads_me; /* the peer said it can read this process */
    int seg_fd;        /* memfd until handed over and mapped, else -1 */
    shm_seg *seg;      /* mapped segment, or NULL */
    size_t seg_bytes;
    shm_ring *tx, *rx;
    char *tx_data, *rx_data;
    _Atomic uint32_t *my_sleep, *peer_sleep;
    _Atomic uint32_t *my_aborted, *peer_aborted;
    _Atomic uint32_t *my_cpu, *peer_cpu;
    uint64_t box_peer_done; /* the last call the peer ended, as last seen */
    /* Sends: frames not yet written entirely, oldest first (sq_off bytes
     * of the head written), then one-copy frames waiting for the peer's
     * read, each marked (in its got field) with the count of one-copy
     * records that completes it. */
    weft__xfer *sq_head, *sq_tail;
    size_t sq_off;
    weft__xfer *wq_head, *wq_tail;
    uint64_t cma_posted;
    int want; /* what this rank last stored in tx->want */
    /* Receives: posted frames, oldest first; r_off bytes of the record at
     * the ring's tail already handed out. */
    weft__xfer *rq_head, *rq_tail;
    uint64_t r_off;
    int dead; /* the peer left (its TCP connection ended) */
    /* When a post last asked the kernel whether the peer closed its
     * connection (weft__shm_post_send), in shm_ticks(). */
    uint64_t hup_ticks;
    /* Set-up messages on the TCP connection. */
    weft__xfer sx, rx_x;
    uint8_t out[SHM_HELLO_BYTES], in[SHM_HELLO_BYTES];
} shm_wire;

struct shm_tp {
    const weft__tp_params *p;
    weft__tp_params tcp_p; /* the same, with one loopback wire per peer */
    /* What carries the traffic to other hosts (TCP or ibverbs), and its
     * TCP side, whose one connection to each peer of this host carries the
     * set-up messages and shows the peer's leaving (the same transport
     * where far is TCP). */
    const weft__tp_far *fo;
    weft__tp *far;
    weft__tp *tcp;
    int rank;
    int nranks;
    size_t ring_bytes;
    size_t cma_bytes;
    shm_wire **local; /* per rank: its wire, or NULL (other host, self) */
    shm_wire *wires;  /* the peers of this host */
    int nlocal;
    int sock;       /* the doorbell socket */
    uint64_t probe; /* read by peers to see whether one-copy reads work */
    int err;
    int shut;
    unsigned events;
    int rx_posted;      /* a receive was posted since the rings' last pump */
    unsigned tcp_ends;  /* weft__tcp_ends when last looked at */
    weft__spin spin;    /* WEFT_SPIN_US, adapted (transport/common.h) */
    uint64_t tcp_ns;    /* when the TCP side was last polled */
    uint64_t tcp_ticks; /* the same, in shm_ticks() */
    unsigned passes;    /* tcp_due's count */
    uint32_t cpu_pub;   /* what this rank last stored in its my_cpu */
    int oversubscribed; /* more ranks on this host than cores */
    int tcp_data;       /* the TCP side carries data (other hosts, relays) */
    /* wake(): woken is raised for a spinning progress(), and the TCP
     * side's wake-up (a system call) sent only while one sleeps. */
    _Atomic int woken;
    _Atomic int asleep;
    int setup_pending;
    /* The box segment (NULL: none), its descriptor until every peer has
     * it (the lowest rank's), and who made it. */
    char *box_seg;
    size_t box_seg_bytes;
    int box_fd;
    int box_leader; /* -1: no box (a rank of the job on another host) */
    /* The box call progress() watches (0: none), and what it last saw of
     * the peers' slots and notes for it (box.c). */
    uint64_t box_watch;
    uint64_t box_sig;
    uint64_t box_done;  /* the last call this rank ended */
    uint64_t box_shown; /* the last call its slots and note name */
    int box_room;       /* a box call waits for a peer to start a call */
    int box_unflushed;  /* box stores made, sleepers not looked at since */
    /* Frames that completed, their callbacks not yet run (they run only
     * inside progress()), oldest first. */
    weft__xfer *done_head, *done_tail;
};

/* A full fence, between this rank's store to a ring (or the box) and its
 * look at the peer's word (or the other way round). */
static inline void shm_full_fence(void)
{
    shm_fence(memory_order_seq_cst);
}

/* Sends w's peer a datagram where it sleeps (its flag raised), lowering
 * the flag: the caller fenced after its stores. */
static inline void shm_wake_sleeper(shm_wire *w)
{
    if (atomic_load_explicit(w->peer_sleep, memory_order_relaxed) == 0)
        return;
    if (atomic_exchange(w->peer_sleep, 0) == 0)
        return;
    /* A full queue already holds a wake-up; a socket that is gone
     * belongs to a peer that left, which its TCP connection tells. */
    (void)sendto(w->tp->sock, "", 1, MSG_DONTWAIT | MSG_NOSIGNAL,
                 (const struct sockaddr *)&w->doorbell, w->doorbell_len);
}

/* ---- what one file calls in another ---- */

/* wake.c: the first failure recorded; the peers of this host that sleep
 * woken (a full fence first, after this rank's stores to the box). Below
 * every other file: it calls none of them. */
void weft__shm_fail(shm_tp *tp, int err, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
void weft__shm_poke_sleepers(shm_tp *tp);

/* data.c: posting, the rings' work, progress; the entries of the ops
 * table and of its relay and read tables. */
int weft__shm_post_send(weft__tp *t, int p, int w, weft__xfer *x);
int weft__shm_post_recv(weft__tp *t, int p, int w, weft__xfer *x);
int weft__shm_progress(weft__tp *t, uint64_t deadline_ms);
void weft__shm_wake(weft__tp *t);
int weft__shm_relay_send(weft__tp *t, int peer, weft__xfer *x);
int weft__shm_relay_recv(weft__tp *t, int peer, weft__xfer *x);
int weft__shm_can_read(weft__tp *t, int peer);
int weft__shm_peer_read(weft__tp *t, int peer, void *dst, uint64_t addr,
                        size_t len, int *err);

/* Rank r's area of the box segment. */
static inline shm_box_area *shm_box_area_of(const shm_tp *tp, int r)
{
    return (shm_box_area *)(void *)(tp->box_seg + SHM_BOX_HDR +
                                    (size_t)r * sizeof(shm_box_area));
}

/* box.c: the entries of the box table (transport.h), and the look
 * that shm_pass (data.c) takes while a box call is watched: 1 when a
 * peer's slot or done count changed since the last look. */
size_t weft__shm_box_bytes(weft__tp *t, int peer);
int weft__shm_box_put(weft__tp *t, uint64_t seq, const void *msg, size_t len);
void weft__shm_box_announce(weft__tp *t, uint64_t seq, const void *hdr,
                            size_t len);
int weft__shm_box_get(weft__tp *t, int peer, uint64_t seq, void *out,
                      size_t cap, size_t *len);
void weft__shm_box_done(weft__tp *t, uint64_t seq);
void weft__shm_box_watch(weft__tp *t, uint64_t seq);
int weft__shm_box_moved(shm_tp *tp);
/* Wakes the peers that sleep where this rank's box stores have not been
 * followed by a look at their flags yet (box.c: when). */
void weft__shm_box_flush(shm_tp *tp);

#endif
