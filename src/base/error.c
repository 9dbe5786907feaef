/* Error codes, messages and logging. */
#include "base/base.h"

#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

_Thread_local char weft__init_errmsg[WEFT__ERRMSG_LEN];

const char *weft_strerror(int err)
{
    switch (err) {
    case WEFT_OK:
        return "success";
#define WEFT__ERR_TEXT(name, val, text)                                        \
    case WEFT_##name:                                                          \
        return text;
        WEFT_ERRNO_MAP(WEFT__ERR_TEXT)
#undef WEFT__ERR_TEXT
    default:
        return "unknown error";
    }
}

const char *weft_err_name(int err)
{
    switch (err) {
    case WEFT_OK:
        return "WEFT_OK";
#define WEFT__ERR_NAME(name, val, text)                                        \
    case WEFT_##name:                                                          \
        return "WEFT_" #name;
        WEFT_ERRNO_MAP(WEFT__ERR_NAME)
#undef WEFT__ERR_NAME
    default:
        return "WEFT_E?";
    }
}

/* Read once from WEFT_LOG; communicators made in several threads at once
 * may each read it first, and they store the same value. */
static atomic_int log_level = -1;

int weft__log_enabled(int level)
{
    int l0 = atomic_load_explicit(&log_level, memory_order_relaxed);

    if (l0 < 0) {
        const char *s = getenv("WEFT_LOG");
        int l = WEFT__LOG_WARN;
        if (s != NULL) {
            if (strcmp(s, "error") == 0)
                l = WEFT__LOG_ERROR;
            else if (strcmp(s, "info") == 0)
                l = WEFT__LOG_INFO;
            else if (strcmp(s, "debug") == 0)
                l = WEFT__LOG_DEBUG;
        }
        atomic_store_explicit(&log_level, l, memory_order_relaxed);
        l0 = l;
    }
    return level <= l0;
}

void weft__log(int level, int rank, const char *fmt, ...)
{
    static const char *names[] = {"error", "warn", "info", "debug"};
    char line[1024];
    va_list ap;
    int n;

    if (!weft__log_enabled(level))
        return;
    if (rank >= 0)
        n = snprintf(line, sizeof line, "weft[rank %d] %s: ", rank,
                     names[level]);
    else
        n = snprintf(line, sizeof line, "weft %s: ", names[level]);
    va_start(ap, fmt);
    vsnprintf(line + n, sizeof line - (size_t)n, fmt, ap);
    va_end(ap);
    /* One write per line so lines of concurrent ranks do not interleave. */
    fprintf(stderr, "%s\n", line);
}

int weft__vfail(weft__errsink *s, int err, const char *fmt, va_list ap)
{
    int code;

    if (atomic_flag_test_and_set(&s->claimed)) {
        /* The first cause is the one worth keeping; another thread may
         * still be writing it. */
        while ((code = atomic_load(&s->code)) == 0)
            sched_yield();
        return code;
    }
    vsnprintf(s->msg, sizeof s->msg, fmt, ap);
    atomic_store(&s->code, err);
    weft__log(WEFT__LOG_INFO, s->rank, "%s: %s", weft_err_name(err), s->msg);
    return err;
}

int weft__fail(weft__errsink *s, int err, const char *fmt, ...)
{
    va_list ap;
    int rc;

    va_start(ap, fmt);
    rc = weft__vfail(s, err, fmt, ap);
    va_end(ap);
    return rc;
}

uint64_t weft__now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

_Thread_local int weft__on_progress_thread;

uint64_t weft__now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

void weft__tp_fail(weft__errsink *sink, int *tp_err, int err, const char *fmt,
                   va_list ap)
{
    if (*tp_err != 0)
        return;
    *tp_err = err;
    weft__vfail(sink, err, fmt, ap);
}

void weft__sigpipe_block(weft__sigpipe_state *st)
{
    sigset_t pipe_set, pending;

    sigemptyset(&pipe_set);
    sigaddset(&pipe_set, SIGPIPE);
    sigpending(&pending);
    st->was_pending = sigismember(&pending, SIGPIPE);
    pthread_sigmask(SIG_BLOCK, &pipe_set, &st->old);
}

void weft__sigpipe_restore(weft__sigpipe_state *st)
{
    sigset_t pipe_set, pending;

    sigemptyset(&pipe_set);
    sigaddset(&pipe_set, SIGPIPE);
    if (!st->was_pending) {
        struct timespec zero = {0, 0};
        sigpending(&pending);
        if (sigismember(&pending, SIGPIPE))
            sigtimedwait(&pipe_set, NULL, &zero);
    }
    pthread_sigmask(SIG_SETMASK, &st->old, NULL);
}
