/*
 * Stopping the ranks, and weftrun's exit status: what both the end of a
 * job (stop.c) and a stdout nobody reads any more (output.c) do.
 *
 * The first cause of failure sets the exit status (stop_set_exit). Ranks
 * are stopped by process group with SIGTERM (or the signal weftrun got),
 * then SIGKILL after --grace-ms, all from stop_timer's callback, never
 * from an exit callback (see stop_ranks).
 */
#define _GNU_SOURCE

#include "weftrun.h"

#include <errno.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

const char *stop_signal_name(int signum)
{
    static char buf[32];
    const char *abbrev = sigabbrev_np(signum);

    if (abbrev == NULL)
        snprintf(buf, sizeof(buf), "signal %d", signum);
    else
        snprintf(buf, sizeof(buf), "SIG%s", abbrev);
    return buf;
}

const char *stop_plural(long n)
{
    return n == 1 ? "" : "s";
}

void stop_set_exit(struct job *job, int code)
{
    if (job->exit_code < 0)
        job->exit_code = code;
}

static void stop_signal_running(struct job *job, int signum)
{
    for (int i = 0; i < job->opts->nranks; i++) {
        struct rank *r = &job->ranks[i];
        int rc;

        if (!r->started || r->exited)
            continue;
        /* The whole process group: a rank that is a wrapper (a shell, a
         * launch command) goes with every process it started. */
        rc = kill(-r->pid, signum) == 0 ? 0 : uv_translate_sys_error(errno);
        if (rc == UV_ESRCH)
            rc = uv_process_kill(&r->proc, signum);
        if (rc != 0 && rc != UV_ESRCH)
            msg("cannot send %s to rank %d (pid %d): %s",
                stop_signal_name(signum), r->index, r->pid, uv_strerror(rc));
    }
}

static void stop_timer_cb(uv_timer_t *t)
{
    struct job *job = t->data;

    switch (job->phase) {
    case STOP_SEND:
        stop_signal_running(job, job->stop_signal);
        job->phase = STOP_GRACE_OVER;
        uv_timer_start(t, stop_timer_cb, (uint64_t)job->opts->grace_ms, 0);
        break;
    case STOP_GRACE_OVER:
        if (job->nrunning > 0)
            msg("%d rank%s still running %d ms after %s; sending SIGKILL",
                job->nrunning, stop_plural(job->nrunning), job->opts->grace_ms,
                stop_signal_name(job->stop_signal));
        /* fall through */
    case STOP_KILL_NOW:
        stop_signal_running(job, SIGKILL);
        job->phase = STOP_KILL_NOW;
        break;
    case STOP_NONE:
        break;
    }
}

/* Stops every running rank: signum now, SIGKILL after the grace period.
 * The signals are sent from a timer callback, never from stop_exit_cb: libuv
 * reaps all exited children before it calls their exit_cbs, so only there
 * is "not yet exited" sure to mean "pid still ours". */
void stop_ranks(struct job *job, int signum)
{
    if (job->phase != STOP_NONE)
        return;
    job->phase = STOP_SEND;
    job->stop_signal = signum;
    uv_timer_start(&job->stop_timer, stop_timer_cb, 0, 0);
}

void stop_kill_now(struct job *job)
{
    job->phase = STOP_KILL_NOW;
    uv_timer_start(&job->stop_timer, stop_timer_cb, 0, 0);
}
