/*
 * Communicators made with weft_init_config, each rank a thread of this
 * process: what a framework that starts its own processes and carries
 * addresses in its own store (torch's c10d Store) does, with threads
 * standing in for its processes. Shared by test_config (Criterion) and
 * configprog (a plain program, for ThreadSanitizer, which Criterion cannot
 * run under).
 */
#ifndef WEFT_TESTS_CONFIG_CASES_H
#define WEFT_TESTS_CONFIG_CASES_H

#include <stddef.h>

#include "weft.h"

#define CFG_MAX_JOBS 4
#define CFG_MAX_RANKS 8

/* How the ranks of a job learn each other's addresses. */
enum cfg_boot {
    CFG_BOOT_ADDRS = 0, /* weft_config.addrs, from the ranks' listeners */
    CFG_BOOT_TEXT,      /* weft_config.hostfile_text (JSON, one host) made
                           from the listeners' ports, listener handed over */
};

struct cfg_jobs {
    int njobs, nranks; /* njobs jobs of nranks ranks, all at once */
    enum cfg_boot boot;
    int rounds;           /* each rank makes and frees its communicator this
                             many times (a new init after finalize) */
    int late_rank;        /* this rank of every job starts late_ms late */
    int late_ms;          /* (0: nobody late) */
    int timeout_ms;       /* weft_config.timeout_ms */
    const char *topology; /* weft_config.topology, NULL: "auto" */
};

/* Runs the jobs: every rank opens a listener, publishes its address,
 * waits for every address of its job, makes its communicator, checks
 * all_reduce, all_gather, broadcast, a ring of send/recv and a batch of
 * iall_reduce against values computed here, and frees it. Job j uses its
 * own token, so a wire that reached another job's rank would fail its
 * handshake. 0 when every rank of every job passed; else why (the first
 * failure) in why. Every wait is bounded: a job that cannot form fails
 * with the connect deadline (10 s), never hangs. */
int cfg_run_jobs(const struct cfg_jobs *j, char *why, size_t whylen);

#endif
