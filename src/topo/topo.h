/*
 * The job as the hostfile and the environment describe it: hosts, cables,
 * ranks, ports, the transport and topology asked for, and the tunables.
 * What the transports and everything above them are configured by; it
 * knows nothing of communicators or operations.
 */
#ifndef WEFT_TOPO_H
#define WEFT_TOPO_H

#include "base/base.h"

#define WEFT__TOKEN_BYTES 16
#define WEFT__MAX_WIRES 64 /* wires to one peer, all links together */
#define WEFT__MAX_RANKS 4096
/* Most ranks a mesh job may have: one engine lane per peer. */
#define WEFT__MESH_MAX_RANKS 17
#define WEFT__DEFAULT_PORT 32323
#define WEFT__DEFAULT_TIMEOUT_MS 300000
#define WEFT__DEFAULT_CONNECT_TIMEOUT_MS 60000
/* A wire that carries nothing back for this long is lost: TCP aborts a
 * connection whose sent bytes or keepalive probes (one a second while it
 * is idle) go unanswered that long (TCP_USER_TIMEOUT). */
#define WEFT__DEFAULT_WIRE_TIMEOUT_MS 2000
#define WEFT__DEFAULT_FRAME_BYTES (256 * 1024)
#define WEFT__DEFAULT_SOCKBUF_BYTES (4 << 20)
#define WEFT__DEFAULT_SPIN_US 50
/* The ibverbs transport's registered staging per queue pair: this many
 * slots of this many bytes each way (WEFT_IB_SLOTS, WEFT_IB_SLOT_BYTES). */
#define WEFT__DEFAULT_IB_SLOTS 16
#define WEFT__DEFAULT_IB_SLOT_BYTES (256 * 1024)
/* Shared memory between ranks of one host (WEFT_SHM, WEFT_SHM_RING_BYTES,
 * WEFT_SHM_CMA_BYTES): a ring of this many bytes each way per pair, and
 * frames from this size read by the receiver straight from the sender's
 * memory (process_vm_readv) instead of copied through the ring. */
#define WEFT__DEFAULT_SHM_RING_BYTES (256 * 1024)
#define WEFT__DEFAULT_SHM_CMA_BYTES (64 * 1024)
/* The hierarchical all_reduce (hosts of several ranks) by the same reads
 * within each host, its phase across the hosts on this rank's share in
 * between (from WEFT_HIER_PULL_ALL_REDUCE_BYTES per rank; coll/hier.c), and
 * the hierarchical all_gather and reduce_scatter likewise (a rank's
 * block; WEFT_HIER_PULL_ALL_GATHER_BYTES,
 * WEFT_HIER_PULL_REDUCE_SCATTER_BYTES). On the 16-core host (reads /
 * frames within the hosts, medians of 5-7 rounds; docs/performance.md):
 * - 2 hosts of 2 and of 4 ranks in network namespaces joined by a veth
 *   "cable", 10 Gbit/s or unshaped (tests/multihost/ring-test --mode hier
 *   --reads): all_reduce 0.67-0.99x at 256 KiB, 1.04-1.43x at 1 MiB,
 *   1.23-1.62x at 4 MiB; all_gather 0.86-1.04x at 256 KiB, 1.04-1.35x
 *   from 1 MiB; reduce_scatter 0.93-1.54x at 256 KiB, 1.19-2.10x from
 *   1 MiB;
 * - 2 "hosts" of 2 and 4 ranks in one namespace, joined over loopback:
 *   all_reduce 0.87-0.95x at 1 MiB, 1.02-1.04x at
 *   2 MiB, 1.30-1.56x from 4 MiB; all_gather 0.91-1.08x at 1 MiB,
 *   1.07-1.5x from 2 MiB; reduce_scatter 0.86-0.90x at 512 KiB,
 *   1.15-1.21x at 1 MiB, 1.66-1.98x from 2 MiB.
 * The thresholds are where both gain. */
#define WEFT__HIER_PULL_ALL_REDUCE_BYTES (2 * 1024 * 1024)
#define WEFT__HIER_PULL_ALL_GATHER_BYTES (2 * 1024 * 1024)
#define WEFT__HIER_PULL_REDUCE_SCATTER_BYTES (1024 * 1024)
#define WEFT__PULL_MAX_THREADS 8
/* Under the mesh, an all_reduce of up to MESH_SMALL_ALL_REDUCE_BYTES
 * gathered (count * size * nranks) exchanges the inputs once, against the
 * direct reduce-scatter + all-gather (the tuning table's default,
 * core/tune.c), and the mesh's broadcast switches from small to large
 * there: measured at 128 KiB gathered (4 ranks x 32 KiB) on both a 2-core
 * and a 16-core machine. From BIDIR_MIN_BYTES (WEFT_BIDIR_MIN_BYTES), ring
 * operations run both ring directions at once, each on half of the data;
 * below, the second direction's extra frames cost more than it adds
 * (bench/thresholds). */
#define WEFT__MESH_SMALL_ALL_REDUCE_BYTES (128 * 1024)
#define WEFT__BIDIR_MIN_BYTES (2 * 1024 * 1024)
/* Ranks all of one host, through shared memory: an all_reduce of up to
 * the box's bytes (count * size), an all_gather of blocks that small, a
 * broadcast of that many bytes, a reduce_scatter whose whole input is
 * that small, and the barrier go through the box (a slot per rank and
 * call, engine.h), whose messages hold BOX_MAX_BYTES after the call's
 * header. Each rank reads every other's message, so by default the size
 * is BOX_READ_BYTES / nranks, within BOX_MIN_BYTES .. BOX_MAX_BYTES: 2048
 * up to 8 ranks, 1024 at 16 (WEFT_ALGO overrides it, up to BOX_MAX_BYTES).
 * On the 16-core host (docs/performance.md, "The box") the box at those
 * sizes took
 * 0.2-0.9x the frames' time from 256 B at 2 to 16 ranks (all_reduce,
 * all_gather, reduce_scatter, broadcast), where 192 had been the default;
 * at 16 ranks a 2 KiB all_reduce took longer in the box than on frames. */
#define WEFT__BOX_MIN_BYTES 192
#define WEFT__BOX_MAX_BYTES 2048
#define WEFT__BOX_READ_BYTES (16 * 1024)
/* Below this many bytes per wire a transfer uses fewer wires: the cost of
 * one more frame (a syscall or work request on each side) is then larger
 * than what the extra wire adds. The default; WEFT_MIN_WIRE_BYTES sets it,
 * and bench/thresholds measures it. */
#define WEFT__MIN_WIRE_BYTES (256 * 1024)
/* Received frames of at least this many bytes that are reduced on arrival
 * go to the engine's reducer thread, so that the thread driving the
 * transport goes back to the sockets at once (WEFT_REDUCE_THREAD=0 keeps
 * every reduction inline, =1 uses the thread whatever the cores;
 * WEFT_REDUCE_THREAD_MIN_BYTES sets the size). Below it, handing a frame
 * over costs more than its reduction. Unset, the thread is used where the
 * host has at least REDUCE_THREAD_CORES cores per rank on it. Recursive
 * halving never uses it (coll/halving.c). */
#define WEFT__REDUCE_THREAD_CORES 2
/* TCP's sending thread (WEFT_SEND_THREAD): a batch of frames of at least
 * WEFT_SEND_THREAD_MIN_BYTES for one connection, of a pass that sends at
 * least WEFT_SEND_THREAD_PASS_BYTES in all, is written by a thread of the
 * transport's own while progress() reads and reduces: plain sockets that
 * send on a second thread moved 1.1-1.7x more at 4 and 8 ranks on the
 * 16-core host (bench/tcp-bound stream -T). Unset, on where the host has
 * REDUCE_THREAD_CORES cores per rank (as the reducer). Below the pass size
 * the hand-over costs more than it overlaps: 2 and 4 ranks, 128 KiB to 1
 * MiB, 1.05-1.4x more without it; a ring's passes
 * from 1 MiB up gain (4 ranks, 2-8 MiB: 1.05-1.2x). Where the host has
 * fewer than SEND_THREAD_CORES cores per rank, one for each busy thread
 * (progress, reducer, sender), the three share them, and the pass size is
 * SHARED_PASS_BYTES: 8 ranks on that host over loopback, all_reduce from
 * 512 KiB to 8 MiB moved 1.1-1.3x more without the thread, 32-64 MiB
 * 0.98-1.19x as much with it (medians of 3-5 rounds). */
#define WEFT__SEND_THREAD_MIN_BYTES (64 * 1024)
#define WEFT__SEND_THREAD_PASS_BYTES (1024 * 1024)
#define WEFT__SEND_THREAD_CORES 3
#define WEFT__SEND_THREAD_SHARED_PASS_BYTES (16 * 1024 * 1024)
#define WEFT__REDUCE_THREAD_MIN_BYTES (64 * 1024)
/* And only in a pass that reduces at least this many bytes in all
 * (WEFT_REDUCE_THREAD_PASS_BYTES): 0 (every pass) but where every rank is
 * on one host with shared memory and WEFT_REDUCE_THREAD is unset (=1 asks
 * for the thread in every pass). There the receiving thread copies the
 * frames itself, so the thread overlaps less, and its hand-off cost more
 * than it saved below a few MiB (16-core host, 2 ranks, the ring at 128
 * KiB-512 KiB: 2.3-3.8 GB/s busbw with the thread, 3.9-6.1 without; no
 * difference from 2 MiB). */
#define WEFT__REDUCE_THREAD_SHM_PASS_BYTES (2 * 1024 * 1024)
/* The same over loopback TCP (every rank on one host, shared memory off):
 * 2 ranks, whose ring reduces half the call in one pass, moved 1.4-1.5x
 * more at 128-512 KiB without the thread, the same from 1 MiB; larger
 * rank counts run recursive halving there,
 * which never uses it. */
#define WEFT__REDUCE_THREAD_LOOPBACK_PASS_BYTES (1024 * 1024)

/* One end of a cable: a host (by index) and its address there. */
typedef struct {
    int host;
    char addr[64];
    char device[64]; /* RDMA device name, "" if none */
} weft__link_end;

/* The most hosts a path between two hosts goes through (below). */
#define WEFT__MAX_VIA 6

/* A link is one cable between two hosts; or, in a communicator shrunk or
 * split from a ring of hosts whose hosts left form a chain (no cable
 * joins two hosts next in rank order), a path (nvia > 0) through the
 * hosts between: via[] from end[0]'s side, and the cable of each step,
 * hop[0] from end[0]'s host to via[0], ..., hop[nvia] from via[nvia-1]
 * to end[1]'s. Only the TCP transport runs wires over a path: each is a
 * connection carried on by the first rank of each host between
 * (transport/tcp/splice.c); its ends' addresses are "". */
typedef struct {
    weft__link_end end[2];
    int nvia;
    int via[WEFT__MAX_VIA];
    int hop[WEFT__MAX_VIA + 1];
} weft__link;

typedef struct {
    char name[128];
    char ssh[256];
    int nranks;
    int first_rank;
    int *ports; /* nranks entries: the port each local rank listens on */
    /* Where its ranks reach each other: "" for 127.0.0.1; weft_config.addrs
     * sets the ranks' own ip, since their listeners are bound there. */
    char local_addr[64];
} weft__host;

/* Everything weft_init learns from the environment and the hostfile. */
typedef struct weft__config {
    int rank;
    int nranks;
    int timeout_ms;
    int connect_timeout_ms;
    int wire_timeout_ms;   /* a silent wire is lost after this; 0: kernel's */
    int wires;             /* connections per peer per link */
    size_t frame_bytes;    /* pipeline frame size */
    int sockbuf_bytes;     /* SO_SNDBUF/SO_RCVBUF, 0: the kernel's autotuning */
    int spin_us;           /* poll this long before sleeping in a wait */
    size_t min_wire_bytes; /* plan.h */
    size_t mesh_small_all_reduce_bytes; /* the mesh's broadcast switch */
    size_t bidir_min_bytes;
    size_t box_bytes;  /* small calls through the box up to this; 0: off */
    int hier_local;    /* weft__hier_local(): ranks per host, or 0 */
    int spare_cores;   /* 1: this host has 2 cores per rank on it */
    int own_core;      /* 1: ... at least 1 */
    int reduce_thread; /* 1: large reduced frames go to the reducer thread */
    size_t reduce_thread_min_bytes;  /* ... from this many bytes on */
    size_t reduce_thread_pass_bytes; /* ... in passes that reduce this many */
    int send_thread; /* 1: large batches of TCP sends leave from a thread */
    size_t send_thread_min_bytes;  /* ... from this many bytes on */
    size_t send_thread_pass_bytes; /* ... in passes that send this many */
    char transport[16];            /* "tcp" or "ibverbs" */
    int ib_slots;                  /* ibverbs: staging slots per queue pair */
    size_t ib_slot_bytes;          /* ibverbs: bytes per slot */
    char ib_device[64];            /* ibverbs: WEFT_IB_DEVICE, "" if unset */
    int shm;               /* tcp: ranks of one host use shared memory */
    size_t shm_ring_bytes; /* shm: bytes of each direction's ring */
    size_t shm_cma_bytes;  /* shm: frames this big go by one copy (0: never) */
    size_t hier_pull_all_reduce_bytes; /* ... within hosts of a hier one */
    size_t hier_pull_all_gather_bytes; /* ... of a hier all_gather (block) */
    size_t hier_pull_reduce_scatter_bytes; /* ... reduce_scatter (block) */
    int pull_threads;                      /* their threads per rank (0: off) */
    char topology[16]; /* "ring", "mesh" or "auto", as asked */
    int mesh;          /* 1: the topology in effect is the mesh */
    uint8_t token[WEFT__TOKEN_BYTES];
    char hostfile[1024];
    int nhosts;
    weft__host *hosts;
    int nlinks;
    weft__link *links;
    int *rank_host; /* nranks entries: host index of each rank */
} weft__config;

/* 1 when link lk (a cable, or a path through other hosts) joins hosts ha
 * and hb (either way round). */
static inline int weft__link_joins(const weft__link *lk, int ha, int hb)
{
    return (lk->end[0].host == ha && lk->end[1].host == hb) ||
           (lk->end[0].host == hb && lk->end[1].host == ha);
}

/* The address of host h's end of link lk (h is one of its ends). */
static inline const char *weft__link_addr(const weft__link *lk, int h)
{
    return lk->end[lk->end[0].host == h ? 0 : 1].addr;
}

/* 1 when lk is a cable that joins hosts ha and hb. */
static inline int weft__cable_joins(const weft__link *lk, int ha, int hb)
{
    return lk->nvia == 0 && weft__link_joins(lk, ha, hb);
}

/* Reads the configuration: from uc's set fields (weft_init_config) and,
 * for the rest or where uc is NULL (weft_init), the environment. On failure
 * fills errmsg (what is wrong and what to set) and returns WEFT_ECONFIG or
 * WEFT_ENOMEM. */
int weft__config_load(weft__config *cfg, const weft_config *uc, char *errmsg,
                      size_t errlen);
void weft__config_free(weft__config *cfg);
/* The number L of ranks on each host where the hierarchical algorithms
 * can run on cfg's job (as loaded), else 0. They run where there are at
 * least two hosts, every host runs the same L >= 2 (and at most
 * WEFT__MESH_MAX_RANKS) ranks, host h's being ranks h*L .. h*L+L-1, the
 * transport is TCP (so a host's ranks are wired to each other, over
 * shared memory or loopback), and a cable joins each host to the next
 * around the hosts' ring (0-1, ..., H-1 - 0), so that local rank i of
 * every host has wires to local rank i of its neighbours (and to all of
 * them where the mesh is in effect). A pure function of cfg. */
int weft__hier_local(const weft__config *cfg);

/* The port rank r listens on. */
int weft__config_rank_port(const weft__config *cfg, int r);

/* The configuration of a communicator made of some of old's ranks
 * (weft_comm_shrink, weft_comm_split): members[i] (n entries) is the old
 * rank that becomes rank i, this process being rank; ports[i] is where
 * member i listens (NULL: the port it had in old). Hosts keep their
 * names, addresses and cables; a host left with no member goes, with its
 * cables. The members of one host must follow one another
 * (WEFT_ENOTSUP, errmsg says why). WEFT_OK (free *out with
 * weft__config_free), or WEFT_ENOMEM; on failure *out holds nothing. */
int weft__config_subset(const weft__config *old, const int *members, int n,
                        int rank, const int *ports, weft__config *out,
                        char *errmsg, size_t errlen);

#endif
