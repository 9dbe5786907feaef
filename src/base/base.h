/*
 * The ground every layer of weft stands on: the one error record type,
 * logging, the clock and the SIGPIPE guard. Includes nothing of weft's but
 * the public header. Not part of the public API.
 */
#ifndef WEFT_BASE_H
#define WEFT_BASE_H

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

#define WEFT__ERRMSG_LEN 512

/* Where failures are recorded: code and text together, the first cause
 * wins and is never overwritten by its consequences (a peer that closes
 * its wires after it found a mismatch, say). A communicator has one; the
 * engine and the transports report into the one they are given. Safe from
 * several threads: the first writer claims it, and code turns non-zero
 * only once msg is complete, so a reader that sees the code may read msg. */
/* Why the calling thread's last weft_init() or weft_listener_open()
 * failed: weft_last_error(NULL) (error.c). */
extern _Thread_local char weft__init_errmsg[WEFT__ERRMSG_LEN];

typedef struct weft__errsink {
    _Atomic int code; /* 0 until the first failure */
    atomic_flag claimed;
    int rank; /* for the log line */
    char msg[WEFT__ERRMSG_LEN];
} weft__errsink;

/* Records a failure in s unless one is there already, and logs it once.
 * Returns the code s holds afterwards (the first cause's). */
int weft__fail(weft__errsink *s, int err, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
int weft__vfail(weft__errsink *s, int err, const char *fmt, va_list ap)
    __attribute__((format(printf, 3, 0)));

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

/* 1 on weft's progress thread (core/sched.c), whose waits run beside the
 * application's own threads (a framework computing while its operations
 * are pending): a transport's wait there spins WEFT_SPIN_US and no longer
 * (transport/common.h). 0 on every other thread. */
extern _Thread_local int weft__on_progress_thread;

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

#endif
