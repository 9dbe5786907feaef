/*
 * How a job ends: the messages that name the rank that failed and how it
 * ended, and the signals weftrun itself receives (SIGINT, SIGTERM,
 * SIGHUP); kill.c records the exit status and stops the ranks.
 *
 * The first cause of failure wins: the first rank to fail (or the first
 * signal weftrun gets) sets the exit status and is named; the ranks then
 * stopped because of it are not reported as failures of their own. A
 * rank's exit code 1..125 becomes weftrun's, any other code 1, and a rank
 * killed by signal S, or weftrun told to stop by S, gives 128+S. Ranks
 * are stopped with SIGTERM (or the signal weftrun got), then SIGKILL after
 * --grace-ms (kill.c). A second signal to weftrun while the ranks are
 * being stopped sends SIGKILL at once. With --keep-going nobody is
 * stopped for a rank's failure: every rank that fails is named, the first
 * sets the exit status, and weftrun says at the end how many failed.
 */
#define _GNU_SOURCE

#include "weftrun.h"

#include <signal.h>
#include <stdint.h>
#include <stdio.h>

static const int stop_forwarded_signals[3] = {SIGINT, SIGTERM, SIGHUP};

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
    if ((exit_status != 0 || term_signal != 0) && job->phase == STOP_NONE &&
        job->opts->keep_going) {
        /* Every failure is named; the first sets the exit status; the
         * others run on. */
        job->nfailed++;
        if (term_signal != 0) {
            msg("rank %d (%spid %d) was killed by signal %d (%s); the "
                "others go on (--keep-going)",
                r->index, stop_host_label(r), r->pid, term_signal,
                stop_signal_name(term_signal));
            stop_set_exit(job, 128 + term_signal);
        } else {
            msg("rank %d (%spid %d) exited with code %d; the others go on "
                "(--keep-going)",
                r->index, stop_host_label(r), r->pid, (int)exit_status);
            stop_set_exit(job, exit_status >= 1 && exit_status <= 125
                                   ? (int)exit_status
                                   : 1);
        }
    } else if ((exit_status != 0 || term_signal != 0) &&
               job->phase == STOP_NONE) {
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

/* "rank 1 (pid 123), rank 3 (host b, pid 456)": the ranks still running,
 * so that a job stopped from outside (a timeout) says which hung. */
static const char *stop_running_list(const struct job *job)
{
    static char buf[1024];
    size_t len = 0;

    buf[0] = '\0';
    for (int i = 0; i < job->opts->nranks && len + 64 < sizeof buf; i++) {
        const struct rank *r = &job->ranks[i];

        if (!r->started || r->exited)
            continue;
        len += (size_t)snprintf(buf + len, sizeof buf - len,
                                "%srank %d (%spid %d)", len ? ", " : "",
                                r->index, stop_host_label(r), r->pid);
    }
    return buf;
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
        msg("received %s; forwarding it to %d running rank%s: %s",
            stop_signal_name(signum), job->nrunning, stop_plural(job->nrunning),
            stop_running_list(job));
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
