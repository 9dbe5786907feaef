/*
 * Multi-process test harness: runs N weft ranks as forked children of a
 * Criterion test, on 127.0.0.1, and reports how each of them ended.
 *
 * mp_run() picks N free TCP ports, writes a JSON hostfile into a fresh
 * mkdtemp() directory, forks N children and waits for them under an overall
 * deadline. Child i gets WEFT_RANK=i, WEFT_SIZE=N, WEFT_HOSTFILE, a
 * WEFT_JOB_TOKEN of 32 hex digits shared by the job, WEFT_WIRES and (when
 * asked) WEFT_TIMEOUT_MS / WEFT_CONNECT_TIMEOUT_MS, then runs the scenario
 * function and _exit()s with its return value (0 = pass). On the deadline
 * every child still running is SIGKILLed and named on stderr. The temporary
 * directory is removed before mp_run() returns.
 *
 * Children must not use Criterion assertions: a scenario reports a failure
 * with mp_log() (which names the rank) and returns non-zero. Every scenario
 * must call weft_finalize() on every path where weft_init() succeeded,
 * unless the test deliberately exits without it.
 *
 * The test binary that links harness.c gets a main() that runs Criterion
 * with --jobs 1 by default (ranks of two tests must not share the two cores,
 * and the free ports picked by one test must not be taken by another);
 * `--jobs N` on the command line still overrides it.
 */
#ifndef WEFT_TESTS_MP_HARNESS_H
#define WEFT_TESTS_MP_HARNESS_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "weft.h"

#define MP_MAX_RANKS 16
/* Bytes of the MAP_SHARED area that mp_shm() returns (zeroed by mp_run). */
#define MP_SHM_BYTES 65536
/* Default overall deadline of one mp_run(), in milliseconds. */
#define MP_DEFAULT_DEADLINE_MS 60000

/* A scenario: runs in child `rank` of `nranks`; 0 means pass. */
typedef int (*mp_rank_fn)(int rank, int nranks, void *arg);

/* What the parent does to a rank when it reaches a point (mp_point()). */
enum mp_action_kind {
    MP_ACT_NONE = 0, /* just record that the point was reached */
    MP_ACT_SIGSTOP,  /* stop it; it stays stopped until the end of the job */
    MP_ACT_SIGKILL,  /* kill it while it waits in mp_point() */
};

struct mp_action {
    int rank;
    int point;
    enum mp_action_kind kind;
};

/* What hooks see of a job. pids is NULL in before_fork. */
struct mp_job {
    int nranks;
    const int *ports;       /* nranks ports of the hostfile */
    const char *hostfile;   /* path of the hostfile */
    const char *hostfile_b; /* second hostfile, or NULL */
    const int *ports_b;     /* its ports, or NULL */
    const char *token;      /* WEFT_JOB_TOKEN of the job */
    const pid_t *pids;      /* the ranks' pids (after_fork only) */
};

/* How the hostfile places the ranks (all on this machine either way). */
enum mp_layout {
    MP_LAYOUT_ONE_HOST = 0, /* one host; ranks talk over loopback */
    /* One host per rank, linked in a ring (host i to host i+1) by loopback
     * addresses 127.0.<link+1>.1 and .2: from 4 ranks on, some pairs have
     * no link and reach each other through the relay. */
    MP_LAYOUT_RING,
    MP_LAYOUT_MESH, /* one host per rank, a link between every pair */
    /* Hosts of two ranks each (nranks even), a link between every pair of
     * hosts (127.0.<link+1>.1 and .2): where the hierarchical algorithms
     * run. */
    MP_LAYOUT_PAIRS,
};

struct mp_opts {
    int nranks;             /* 1..MP_MAX_RANKS */
    enum mp_layout layout;  /* of the hostfile (not hostfile_b) */
    int wires;              /* WEFT_WIRES; 0 means 1 */
    int timeout_ms;         /* WEFT_TIMEOUT_MS; 0 leaves it unset */
    int connect_timeout_ms; /* WEFT_CONNECT_TIMEOUT_MS; 0 leaves it unset */
    int deadline_ms;        /* whole job; 0 means MP_DEFAULT_DEADLINE_MS */
    /* > 0: also write a second hostfile for this many ranks with fresh
     * ports, exported to the ranks as WEFT_TEST_HOSTFILE_B. */
    int hostfile_b_ranks;
    /* Actions the parent takes when a rank reaches a point. */
    const struct mp_action *actions;
    int nactions;
    /* Ranks (bit r for rank r) that may still be running (stopped, blocked)
     * once every other rank has ended: they are SIGKILLed then and this is
     * not a failure (their result says lingered). */
    unsigned linger_mask;
    /* Called in the parent after the hostfile is written and before the
     * ranks are forked, and right after they are all forked. */
    void (*before_fork)(const struct mp_job *job, void *hook_arg);
    void (*after_fork)(const struct mp_job *job, void *hook_arg);
    void *hook_arg;
};

struct mp_rank_result {
    pid_t pid;
    int exited; /* it called _exit/exit: exit_code is valid */
    int exit_code;
    int signaled; /* it died of a signal: signo is valid */
    int signo;
    int deadline;   /* still running at the deadline: SIGKILLed by mp_run */
    int lingered;   /* a linger_mask rank SIGKILLed once the others ended */
    int by_action;  /* SIGKILLed by an MP_ACT_SIGKILL action */
    int last_point; /* last point it reached, -1 if none */
};

struct mp_result {
    int nranks;
    int deadline_hit;  /* some rank did not finish before the deadline */
    double elapsed_ms; /* from the first fork to the last rank's end */
    struct mp_rank_result rank[MP_MAX_RANKS];
};

/* Runs one job. Returns 0 when the job ran (look at *res for how each rank
 * ended), -1 when it could not be set up (a message is on stderr). */
int mp_run(const struct mp_opts *opts, mp_rank_fn fn, void *arg,
           struct mp_result *res);

/* 1 when every rank exited with status 0 or was, as the test asked,
 * SIGKILLed by the harness (a linger_mask rank once the others ended) or by
 * an MP_ACT_SIGKILL action; 0 otherwise (a deadline kill always fails). */
int mp_all_passed(const struct mp_result *res);

/* One line per rank saying how it ended, for an assertion message. */
const char *mp_describe(const struct mp_result *res, char *buf, size_t len);

/* ---- For scenario code (in the children) ---- */

/* Tells the parent that this rank reached `point` and waits until the parent
 * has taken the action configured for it (if that is SIGSTOP, until the
 * rank is continued; if SIGKILL, forever). */
void mp_point(int point);

/* A MAP_SHARED area of MP_SHM_BYTES shared by the parent and all ranks of
 * the current job (zeroed at the start of each mp_run); valid in the parent
 * after mp_run returns too. */
void *mp_shm(void);

/* CLOCK_MONOTONIC in milliseconds. */
double mp_now_ms(void);

/* Scheduling stalls: a timing bound on a call holds only while the
 * process runs. mp_stall_watch_start() starts a thread that wakes every
 * 5 ms and keeps the longest gap between its wake-ups; mp_stall_watch_stop()
 * stops it and returns that gap in milliseconds (how long this process was
 * kept from running, at least). A test that finds a call late by less than
 * the stall says so and runs again, instead of failing by bad luck. */
void mp_stall_watch_start(void);
double mp_stall_watch_stop(void);
/* The exit status of a rank that found its timing spoiled by a stall. */
#define MP_EXIT_STALLED 77

/* A rank's verdict on a call that took dt ms against bound_ms: 0 in time,
 * MP_EXIT_STALLED late by no more than the process was kept from running
 * (stall_ms, mp_stall_watch_stop; this is logged), 1 late. */
int mp_timing_verdict(double dt, double bound_ms, double stall_ms);

/* mp_run for a job whose ranks check a timing bound: a job in which a rank
 * exited MP_EXIT_STALLED runs again, three times at most, so only a late
 * call that the process had the time to avoid fails. Returns mp_run's
 * result for the last run (res describes it); what names the job in the
 * log. */
int mp_run_timed(const struct mp_opts *o, mp_rank_fn fn, void *arg,
                 struct mp_result *res, const char *what);

/* Sleeps for ms milliseconds (restarting after signals). */
void mp_sleep_ms(int ms);

/* How many threads this process has now (/proc/self/task), or -1. */
int mp_threads(void);

/* The same once it is at most want, or after ms milliseconds: a thread
 * that pthread_join has returned for stays in /proc/self/task until the
 * kernel has released it, a moment later (joining wakes on the thread's
 * tid being cleared, which comes first). */
int mp_threads_settle(int want, int ms);

/* Prints "[rank R] ..." to stderr (R is this child's rank, or "parent"). */
void mp_log(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* weft_init() with a message on failure; also checks that weft_rank() and
 * weft_size() are rank and nranks. Returns the weft code (WEFT_OK or the
 * error; a rank/size mismatch finalizes and returns WEFT_ECONFIG). */
int mp_init(weft_comm **out, int rank, int nranks);

/* Names for messages. */
const char *mp_dtype_name(weft_dtype dtype);
const char *mp_op_name(weft_redop op);

/* ---- Data for checks ---- */

/* Bytes after each mp_alloc() buffer that must never be written. */
#define MP_CANARY_BYTES 64
#define MP_CANARY 0xA5
/* What mp_alloc() fills a buffer with, so stale data shows. */
#define MP_GARBAGE 0xCD

/* A 64-bit mixing function (splitmix64 finaliser). */
uint64_t mp_hash64(uint64_t x);
/* FNV-1a over nbytes. */
uint64_t mp_fnv1a(const void *buf, size_t nbytes);
/* Fills nbytes with a deterministic pseudo-random function of seed. */
void mp_fill_bytes(void *buf, size_t nbytes, uint64_t seed);
/* malloc(nbytes + MP_CANARY_BYTES): payload MP_GARBAGE, canary MP_CANARY.
 * Never NULL (aborts on allocation failure); free() it. */
void *mp_alloc(size_t nbytes);
/* 1 when the MP_CANARY_BYTES after buf[nbytes] are untouched. */
int mp_canary_ok(const void *buf, size_t nbytes);
/* Element i of buf as dtype: mp_put_value stores v (which must be exactly
 * representable: tests use small integers), mp_get_value reads it back (for
 * messages). Both support every dtype except WEFT_FLOAT16, which reads 0 and
 * stores nothing. */
void mp_put_value(weft_dtype dtype, void *buf, size_t i, double v);
double mp_get_value(weft_dtype dtype, const void *buf, size_t i);
/* Index of the first of count elements of esize bytes where a and b
 * differ, or count when they are equal. */
size_t mp_first_diff(const void *a, const void *b, size_t count, size_t esize);

/* Failure reports for scenarios; each prints one line naming the rank and
 * returns 1 (so `return mp_report_rc(...)` fails the scenario). `what`
 * names the operation, dtype and count, e.g. "all_reduce(sum, int32,
 * count=7, in place)". */
int mp_report_rc(const weft_comm *c, const char *what, int rc);
/* 0 when count elements of got and exp are equal, else prints the first
 * wrong index with both values and returns 1. */
int mp_check_elems(const char *what, const char *which, weft_dtype dtype,
                   const void *got, const void *exp, size_t count);
/* 0 when the canary after an mp_alloc(nbytes) buffer is intact. */
int mp_check_canary(const char *what, const char *which, const void *buf,
                    size_t nbytes);

/* The small-integer model of a reduction: rank r's element i is 1, 2 or
 * 3 (pseudo-random in i, so a block moved by any offset shows), so every
 * dtype holds op over up to 4 ranks exactly; mp_small_expect is op over
 * ranks 0..n-1. mp_small_all_reduce runs one all_reduce of it, n elements
 * of dt, in place or not, with canaries on both sides of recvbuf, and
 * checks it: 0, or 1 with a line saying what was wrong. */
double mp_small_elem(int r, size_t i);
double mp_small_expect(weft_redop op, int n, size_t i);
int mp_small_all_reduce(weft_comm *c, weft_dtype dt, weft_redop op, size_t n,
                        int inplace, int rank, int nranks);

/* WEFT_ALGO's all_reduce rows for the low thresholds under which
 * test_collectives' and test_nonblocking's modest counts take every path:
 * the default rows (weft_info's; src/core/tune.c) of a job of nranks (2
 * to 8) under WEFT_TOPOLOGY topology, but the one-exchange gather only up
 * to `gathered` bytes in all (count * size * nranks; 4096 where the mesh
 * is in effect) and recursive doubling only up to 1 KiB per rank. The
 * layouts: one host (shm: shared memory on, so the box takes its small
 * calls first), hosts of two ranks (MP_LAYOUT_PAIRS, the mesh in effect
 * unless topology is "ring"), and a ring of 4 or more hosts of one rank
 * (MP_LAYOUT_RING, topology "auto": the ring in effect). `first`, where
 * not NULL, goes into the rows after the box's: rows that force another
 * algorithm, such as "0-=hier". Writes "all_reduce:..." into out (len
 * bytes); 0, or -1 where the job is none of those. */
int mp_low_algo(char *out, size_t len, int nranks, enum mp_layout layout,
                const char *topology, int shm, size_t gathered,
                const char *first);

/* Removes every WEFT_* variable and the launcher variables weft_init also
 * reads (OMPI_COMM_WORLD_*, PMI_*, SLURM_*, RANK, WORLD_SIZE, ...). */
void mp_clear_env(void);

/* Picks n distinct free TCP ports on 127.0.0.1. Returns 0 or -1. */
int mp_free_ports(int *ports, int n);

/* Writes a hostfile for n ranks on localhost with these ports. */
int mp_write_hostfile(const char *path, const int *ports, int n);
/* The same with the ranks placed as layout says. */
int mp_write_hostfile_layout(const char *path, const int *ports, int n,
                             enum mp_layout layout);

#endif /* WEFT_TESTS_MP_HARNESS_H */
