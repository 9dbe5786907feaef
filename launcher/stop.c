/*
 * How a job ends: weftrun's exit status, the messages that name the rank
 * that failed and how it ended, stopping the other ranks, and the signals
 * weftrun itself receives (SIGINT, SIGTERM, SIGHUP).
 *
 * The first cause of failure wins: the first rank to fail (or the first
 * signal weftrun gets) sets the exit status and is named; the ranks then
 * stopped because of it are not reported as failures of their own. A
 * rank's exit code 1..125 becomes weftrun's, any other code 1, and a rank
 * killed by signal S, or weftrun told to stop by S, gives 128+S. Ranks
 * are stopped by process group with SIGTERM (or the signal weftrun got),
 * then SIGKILL after --grace-ms, all from stop_timer's callback, never from
 * an exit callback (see stop_ranks). A second signal to weftrun while the
 * ranks are being stopped sends SIGKILL at once.
 */
#define _GNU_SOURCE

#include "weftrun.h"

#include <errno.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

static const int stop_forwarded_signals[3] = {SIGINT, SIGTERM, SIGHUP};

static const char *stop_signal_name(int signum)
{
    static char buf[32];
    const char *abbrev = sigabbrev_np(signum);

    if (abbrev == NULL)
        snprintf(buf, sizeof(buf), "signal %d", signum);
    else
        snprintf(buf, sizeof(buf), "SIG%s", abbrev);
    return buf;
}

static const char *stop_plural(long n)
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

static void stop_kill_now(struct job *job)
{
    job->phase = STOP_KILL_NOW;
    uv_timer_start(&job->stop_timer, stop_timer_cb, 0, 0);
}

/* "host NAME, " for messages about a rank of a --hostfile job. */
static const char *stop_host_label(const struct rank *r)
{
    static char buf[200];

    if (r->host == NULL)
        return "";
    snprintf(buf, sizeof buf, "host %s, ", r->host);
    return buf;
}

void stop_exit_cb(uv_process_t *proc, int64_t exit_status, int term_signal)
{
    struct rank *r = proc->data;
    struct job *job = r->job;

    r->exited = 1;
    job->nrunning--;
    if ((exit_status != 0 || term_signal != 0) && job->phase == STOP_NONE) {
        /* The first rank to fail is the cause; the ones stopped because of
         * it are not reported. */
        if (term_signal != 0) {
            msg("rank %d (%spid %d) was killed by signal %d (%s)", r->index,
                stop_host_label(r), r->pid, term_signal,
                stop_signal_name(term_signal));
            stop_set_exit(job, 128 + term_signal);
        } else {
            msg("rank %d (%spid %d) exited with code %d", r->index,
                stop_host_label(r), r->pid, (int)exit_status);
            stop_set_exit(job, exit_status >= 1 && exit_status <= 125
                                   ? (int)exit_status
                                   : 1);
        }
        stop_ranks(job, SIGTERM);
    } else if ((exit_status != 0 && term_signal == 0) ||
               (term_signal != 0 && job->phase == STOP_SEND)) {
        /* Failed on its own: reaped before weftrun signalled anyone, or
         * ended with an exit code (weftrun's signals end ranks by signal).
         * It may well be the root cause: a rank that dies can be reaped
         * after the peers that saw it die, and libuv reports a batch of
         * exits in no particular order. */
        if (term_signal != 0)
            msg("rank %d (%spid %d) was also killed by signal %d (%s)",
                r->index, stop_host_label(r), r->pid, term_signal,
                stop_signal_name(term_signal));
        else
            msg("rank %d (%spid %d) also exited with code %d", r->index,
                stop_host_label(r), r->pid, (int)exit_status);
    }
    out_check_done(job);
}

static void stop_signal_cb(uv_signal_t *h, int signum)
{
    struct job *job = h->data;

    job->nsignals++;
    if (job->nrunning == 0 && !job->spawning) {
        /* Only output is left to copy: stop waiting for it. */
        stop_set_exit(job, 128 + signum);
        out_drain_all(job);
        return;
    }
    if (job->phase == STOP_NONE) {
        msg("received %s; forwarding it to %d running rank%s",
            stop_signal_name(signum), job->nrunning,
            stop_plural(job->nrunning));
        stop_set_exit(job, 128 + signum);
        stop_ranks(job, signum);
    } else if (job->phase != STOP_KILL_NOW) {
        msg("received %s while stopping the ranks; sending SIGKILL to %d "
            "running rank%s",
            stop_signal_name(signum), job->nrunning,
            stop_plural(job->nrunning));
        stop_kill_now(job);
    }
}

void stop_init(struct job *job)
{
    uv_timer_init(&job->loop, &job->stop_timer);
    job->stop_timer.data = job;
    /* Timers and signal handlers never keep the loop alive by themselves:
     * it runs while a rank runs or a pipe is open. */
    uv_unref((uv_handle_t *)&job->stop_timer);
    for (int i = 0; i < 3; i++) {
        int signum = stop_forwarded_signals[i];
        struct sigaction old;
        int rc;

        uv_signal_init(&job->loop, &job->sigs[i]);
        job->sigs[i].data = job;
        uv_unref((uv_handle_t *)&job->sigs[i]);
        /* A signal ignored when weftrun started (nohup, a background job of
         * a non-interactive shell) stays ignored. */
        if (sigaction(signum, NULL, &old) == 0 && old.sa_handler == SIG_IGN)
            continue;
        rc = uv_signal_start(&job->sigs[i], stop_signal_cb, signum);
        if (rc != 0)
            msg("warning: cannot handle %s: %s", stop_signal_name(signum),
                uv_strerror(rc));
    }
}

void stop_prepare_signals(void)
{
    sigset_t set;

    /* weftrun reports a closed stdout itself (EPIPE); the ranks get the
     * default SIGPIPE back, since libuv resets dispositions in children. */
    signal(SIGPIPE, SIG_IGN);
    sigemptyset(&set);
    for (int i = 0; i < 3; i++)
        sigaddset(&set, stop_forwarded_signals[i]);
    sigaddset(&set, SIGCHLD);
    sigprocmask(SIG_UNBLOCK, &set, NULL);
}
