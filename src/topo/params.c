/*
 * The table of settings (params.h). To add one: a row here, its field in
 * weft__config (topo.h), then `scripts/gen-docs` for the README and
 * docs/reference.md (make check fails while they differ from the table).
 */
#include "topo/params.h"

#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#define CF(f) offsetof(weft__config, f)
#define UC(f) ((long)offsetof(weft_config, f))
#define NUM(t, f, lo, hi, d) t, CF(f), -1, lo, hi, d
#define NONE(t) t, 0, -1, 0, 0, 0

#define SAME WEFT__PF_SAME
#define USER WEFT__PF_USER
#define AUTO WEFT__PF_AUTO
#define POW2 WEFT__PF_POW2
#define INT WEFT__PT_INT
#define SIZE WEFT__PT_SIZE
#define TIB (1L << 40)

const weft__param weft__params[WEFT__P_COUNT] = {
    [WEFT__P_RANK] = {"WEFT_RANK", NONE(WEFT__PT_DOC), 0,
                      "this rank (set by `weftrun`); else "
                      "`OMPI_COMM_WORLD_RANK`, `PMI_RANK`, `SLURM_PROCID` "
                      "or `RANK`"},
    [WEFT__P_SIZE] = {"WEFT_SIZE", NONE(WEFT__PT_DOC), 0,
                      "the job's number of ranks (set by `weftrun`); else "
                      "`OMPI_COMM_WORLD_SIZE`, `PMI_SIZE`, `SLURM_NTASKS` "
                      "or `WORLD_SIZE`"},
    [WEFT__P_HOSTFILE] = {"WEFT_HOSTFILE", NONE(WEFT__PT_DOC), USER,
                          "the hostfile (set by `weftrun`, as are "
                          "`WEFT_RANK` and `WEFT_SIZE`; not needed for one "
                          "rank)"},
    [WEFT__P_HOSTFILE_TEXT] = {"WEFT_HOSTFILE_TEXT", NONE(WEFT__PT_DOC), 0,
                               "the hostfile's text, used where "
                               "`WEFT_HOSTFILE` is unset (`weftrun` sets it "
                               "for ranks it starts over ssh)"},
    [WEFT__P_JOB_TOKEN] = {"WEFT_JOB_TOKEN", NONE(WEFT__PT_DOC), 0,
                           "32 hex digits shared by the job's ranks (set by "
                           "`weftrun`); connections without it are "
                           "rejected"},
    [WEFT__P_TIMEOUT_MS] = {"WEFT_TIMEOUT_MS", INT, CF(timeout_ms),
                            UC(timeout_ms), 1, INT_MAX,
                            WEFT__DEFAULT_TIMEOUT_MS, USER,
                            "each operation's deadline, in milliseconds "
                            "(`weftrun --timeout-ms`)"},
    [WEFT__P_CONNECT_TIMEOUT_MS] = {"WEFT_CONNECT_TIMEOUT_MS", INT,
                                    CF(connect_timeout_ms),
                                    UC(connect_timeout_ms), 1, INT_MAX,
                                    WEFT__DEFAULT_CONNECT_TIMEOUT_MS, USER,
                                    "how long `weft_init` waits for its "
                                    "peers, in milliseconds"},
    [WEFT__P_WIRE_TIMEOUT_MS] = {"WEFT_WIRE_TIMEOUT_MS",
                                 NUM(INT, wire_timeout_ms, 0, INT_MAX,
                                     WEFT__DEFAULT_WIRE_TIMEOUT_MS),
                                 USER,
                                 "a wire over a cable that answers nothing "
                                 "for this many milliseconds is lost (TCP: "
                                 "noticed within it, in whole seconds "
                                 "where nothing is moving); `0`: the "
                                 "kernel's timeouts"},
    [WEFT__P_WIRES] = {"WEFT_WIRES", INT, CF(wires), UC(wires), 1, 16, 1,
                       SAME | USER,
                       "connections per peer on each link (`weftrun "
                       "--wires`)"},
    [WEFT__P_TRANSPORT] = {"WEFT_TRANSPORT", NONE(WEFT__PT_STR), SAME | USER,
                           "`tcp` (default) or `ibverbs` ([RDMA]"
                           "(docs/reference.md#rdma-ibverbs))"},
    [WEFT__P_TOPOLOGY] = {"WEFT_TOPOLOGY", NONE(WEFT__PT_STR), SAME | USER,
                          "`auto` (default), `ring` or `mesh` ([topologies]"
                          "(docs/reference.md#topologies))"},
    [WEFT__P_ALGO] = {"WEFT_ALGO", NONE(WEFT__PT_DOC), SAME | USER,
                      "which algorithm runs each collective, by size, over "
                      "the defaults ([tuning](docs/reference.md#tuning))"},
    [WEFT__P_SHM] = {"WEFT_SHM", NUM(INT, shm, 0, 1, 1), SAME | USER,
                     "`1`: ranks of one host exchange data through shared "
                     "memory, whichever transport joins the hosts; `0`: "
                     "that transport between them too (loopback TCP, or "
                     "their RDMA device)"},
    [WEFT__P_LOG] = {"WEFT_LOG", NONE(WEFT__PT_DOC), USER,
                     "`error`, `warn` (default), `info` or `debug`, to "
                     "stderr"},
    [WEFT__P_LIBRARY] = {"WEFT_LIBRARY", NONE(WEFT__PT_DOC), USER,
                         "Python: the path of the libweft the package "
                         "loads"},
    [WEFT__P_FRAME_BYTES] = {"WEFT_FRAME_BYTES",
                             NUM(SIZE, frame_bytes, 4096, 64L << 20,
                                 WEFT__DEFAULT_FRAME_BYTES),
                             SAME, "the pipeline's frame, in bytes"},
    [WEFT__P_SOCKBUF_BYTES] = {"WEFT_SOCKBUF_BYTES",
                               NUM(INT, sockbuf_bytes, 0, 1L << 30,
                                   WEFT__DEFAULT_SOCKBUF_BYTES),
                               0,
                               "TCP socket buffers, in bytes; `0` leaves "
                               "them to the kernel, else at least 131072 "
                               "(smaller ones stall TCP)"},
    [WEFT__P_SPIN_US] = {"WEFT_SPIN_US",
                         NUM(INT, spin_us, 0, 1000000, WEFT__DEFAULT_SPIN_US),
                         0,
                         "how long a wait polls before it sleeps, in "
                         "microseconds (on the caller's thread, up to 20 "
                         "times longer where each rank has a core)"},
    [WEFT__P_MIN_WIRE_BYTES] = {"WEFT_MIN_WIRE_BYTES",
                                NUM(SIZE, min_wire_bytes, 1, 1L << 30,
                                    WEFT__MIN_WIRE_BYTES),
                                SAME,
                                "a transfer takes one more wire per this "
                                "many bytes"},
    [WEFT__P_BIDIR_MIN_BYTES] = {"WEFT_BIDIR_MIN_BYTES",
                                 NUM(SIZE, bidir_min_bytes, 0, TIB,
                                     WEFT__BIDIR_MIN_BYTES),
                                 SAME,
                                 "the ring runs both ways at once from this "
                                 "many bytes"},
    [WEFT__P_SHM_RING_BYTES] = {"WEFT_SHM_RING_BYTES",
                                NUM(SIZE, shm_ring_bytes, 4096, 1L << 30,
                                    WEFT__DEFAULT_SHM_RING_BYTES),
                                SAME | POW2,
                                "shared memory: the ring each way between "
                                "two ranks, in bytes, a power of two"},
    [WEFT__P_SHM_CMA_BYTES] = {"WEFT_SHM_CMA_BYTES",
                               NUM(SIZE, shm_cma_bytes, 0, TIB,
                                   WEFT__DEFAULT_SHM_CMA_BYTES),
                               SAME,
                               "shared memory: frames from this size are "
                               "read straight from the sender's memory "
                               "(`process_vm_readv`) where the kernel "
                               "allows; `0`: always through the ring"},
    [WEFT__P_PULL_THREADS] = {"WEFT_PULL_THREADS",
                              NUM(INT, pull_threads, 0, 64, -1), AUTO,
                              "threads per rank, the caller's included, of "
                              "the one-copy reads (`WEFT_ALGO`'s `pull`); "
                              "unset: the host's cores per rank, at most 8, "
                              "off below 2; `0`: off"},
    [WEFT__P_HIER_PULL_ALL_REDUCE_BYTES] =
        {"WEFT_HIER_PULL_ALL_REDUCE_BYTES",
         NUM(SIZE, hier_pull_all_reduce_bytes, 0, TIB,
             WEFT__HIER_PULL_ALL_REDUCE_BYTES),
         SAME,
         "a hierarchical all_reduce's phases within a host are one-copy "
         "reads from this many bytes per rank (`0`: never)"},
    [WEFT__P_HIER_PULL_ALL_GATHER_BYTES] =
        {"WEFT_HIER_PULL_ALL_GATHER_BYTES",
         NUM(SIZE, hier_pull_all_gather_bytes, 0, TIB,
             WEFT__HIER_PULL_ALL_GATHER_BYTES),
         SAME, "the same for the hierarchical all_gather, by block"},
    [WEFT__P_HIER_PULL_REDUCE_SCATTER_BYTES] =
        {"WEFT_HIER_PULL_REDUCE_SCATTER_BYTES",
         NUM(SIZE, hier_pull_reduce_scatter_bytes, 0, TIB,
             WEFT__HIER_PULL_REDUCE_SCATTER_BYTES),
         SAME, "the same for the hierarchical reduce_scatter, by block"},
    [WEFT__P_REDUCE_THREAD] = {"WEFT_REDUCE_THREAD",
                               NUM(INT, reduce_thread, 0, 1, -1), AUTO,
                               "`1`: a second thread reduces received "
                               "frames while the first moves bytes; `0`: "
                               "inline; unset: on where the host has two "
                               "cores per rank"},
    [WEFT__P_REDUCE_THREAD_MIN_BYTES] = {"WEFT_REDUCE_THREAD_MIN_BYTES",
                                         NUM(SIZE, reduce_thread_min_bytes, 1,
                                             1L << 30,
                                             WEFT__REDUCE_THREAD_MIN_BYTES),
                                         0,
                                         "... for frames of this many bytes "
                                         "and more"},
    [WEFT__P_REDUCE_THREAD_PASS_BYTES] =
        {"WEFT_REDUCE_THREAD_PASS_BYTES",
         NUM(SIZE, reduce_thread_pass_bytes, 0, TIB, -1), AUTO,
         "... in passes that reduce this many bytes; unset: every pass "
         "across hosts or where `WEFT_REDUCE_THREAD=1`, else 2097152 with "
         "shared memory and 1048576 over TCP"},
    [WEFT__P_SEND_THREAD] = {"WEFT_SEND_THREAD",
                             NUM(INT, send_thread, 0, 1, -1), AUTO,
                             "`1`: over TCP, a thread of its own writes "
                             "large batches of frames; `0`: every write on "
                             "the progress thread; unset: on where the host "
                             "has two cores per rank"},
    [WEFT__P_SEND_THREAD_MIN_BYTES] = {"WEFT_SEND_THREAD_MIN_BYTES",
                                       NUM(SIZE, send_thread_min_bytes, 1,
                                           1L << 30,
                                           WEFT__SEND_THREAD_MIN_BYTES),
                                       0,
                                       "... for batches of frames of this "
                                       "many bytes and more"},
    [WEFT__P_SEND_THREAD_PASS_BYTES] =
        {"WEFT_SEND_THREAD_PASS_BYTES",
         NUM(SIZE, send_thread_pass_bytes, 0, TIB, -1), AUTO,
         "... in passes that send this many bytes; unset: 1048576 where the "
         "host has three cores per rank, 16777216 where it has two, every "
         "pass where `WEFT_SEND_THREAD=1`"},
    [WEFT__P_IB_DEVICE] = {"WEFT_IB_DEVICE", NONE(WEFT__PT_STR), 0,
                           "ibverbs: the RDMA device (`name` or "
                           "`name:port`) of this host's ranks (default: "
                           "the device of the host's first link end)"},
    [WEFT__P_IB_SLOTS] = {"WEFT_IB_SLOTS",
                          NUM(INT, ib_slots, 2, 4096, WEFT__DEFAULT_IB_SLOTS),
                          SAME,
                          "ibverbs: registered staging slots of each wire, "
                          "each way"},
    [WEFT__P_IB_SLOT_BYTES] = {"WEFT_IB_SLOT_BYTES",
                               NUM(SIZE, ib_slot_bytes, 4096, 16L << 20,
                                   WEFT__DEFAULT_IB_SLOT_BYTES),
                               SAME, "ibverbs: bytes of each staging slot"},
};

long weft__param_get(const weft__config *cfg, int p)
{
    const weft__param *d = &weft__params[p];
    const char *at = (const char *)cfg + d->off;
    int i;
    size_t z;

    if (d->type == WEFT__PT_INT) {
        memcpy(&i, at, sizeof i);
        return i;
    }
    if (d->type == WEFT__PT_SIZE) {
        memcpy(&z, at, sizeof z);
        return (long)z;
    }
    return 0;
}

/* snprintf onto *at within len, keeping the count of what it needed. */
__attribute__((format(printf, 4, 5))) static void
put(char *out, size_t len, size_t *at, const char *fmt, ...)
{
    va_list ap;
    int n;

    va_start(ap, fmt);
    n = vsnprintf(*at < len ? out + *at : NULL, *at < len ? len - *at : 0, fmt,
                  ap);
    va_end(ap);
    if (n > 0)
        *at += (size_t)n;
}

size_t weft__params_markdown(unsigned flags, char *out, size_t len)
{
    size_t at = 0;

    if (len > 0)
        out[0] = '\0';
    put(out, len, &at, "| variable | meaning |\n| --- | --- |\n");
    for (int p = 0; p < WEFT__P_COUNT; p++) {
        const weft__param *d = &weft__params[p];
        int num = d->type == WEFT__PT_INT || d->type == WEFT__PT_SIZE;

        if ((d->flags & flags) != flags)
            continue;
        put(out, len, &at, "| `%s` | %s", d->name, d->doc);
        if (num && !(d->flags & WEFT__PF_AUTO))
            put(out, len, &at, ". Default %ld", d->dflt);
        if (d->flags & WEFT__PF_SAME)
            put(out, len, &at, ". Every rank alike");
        put(out, len, &at, " |\n");
    }
    return at;
}
