/*
 * weftrun: starts the ranks of a weft job and supervises them.
 *
 * This is the single-host launcher (`weftrun -n N PROGRAM ...`). It picks N
 * free loopback ports, writes a JSON hostfile into a private temporary
 * directory, starts N copies of PROGRAM with WEFT_RANK, WEFT_SIZE,
 * WEFT_HOSTFILE, WEFT_JOB_TOKEN and friends (and torchrun's RANK,
 * WORLD_SIZE, MASTER_ADDR, ...) in their environment, and copies
 * their output, line by line and prefixed with `[rank N] `, to its own stdout
 * and stderr.
 *
 * Everything after the ranks are started happens in one libuv loop: rank
 * output arrives on pipes, rank exits arrive through stop_exit_cb (libuv reaps
 * the children on SIGCHLD), SIGINT/SIGTERM/SIGHUP sent to weftrun arrive on
 * uv_signal handles, and the grace period between SIGTERM and SIGKILL is a
 * uv_timer. Nothing ever blocks waiting for a rank, so weftrun cannot hang on
 * one; it returns when every rank has exited and its output has been copied.
 *
 * Exit status: 0 only when every rank exited 0. When a rank fails first (a
 * non-zero exit or a signal) weftrun names it on stderr, stops the others
 * (SIGTERM, then SIGKILL after --grace-ms) and exits with the rank's code
 * (1..125), 128+signal for a signal, or 1 otherwise. When weftrun itself is
 * told to stop by a signal, it forwards that signal and exits 128+signal.
 * 127 means PROGRAM could not be started, 2 a usage error.
 *
 * With --hostfile, the ranks are placed on the hostfile's hosts (numbered
 * along the ring it forms) and started through --launch-cmd, directly for
 * this host, or over ssh; --check only validates and describes the file.
 *
 * This file holds main and the running job: the loop, and spawning each
 * rank into it. The other concerns have a file each, listed in weftrun.h
 * with what they share.
 */
#define _GNU_SOURCE

#include "weftrun.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* Makes the output pipes of rank i, in the job's loop. Returns 0, or -1
 * after saying why (and setting the exit status). */
static int job_rank_init(struct job *job, int i)
{
    struct rank *r = &job->ranks[i];
    int rc;

    r->job = job;
    r->index = i;
    r->proc.data = r;
    r->prefix_len =
        (size_t)snprintf(r->prefix, sizeof(r->prefix), "[rank %d] ", i);
    for (int k = 0; k < 2; k++) {
        struct stream *s = &r->streams[k];

        s->rank = r;
        s->fd = k + 1;
        rc = uv_pipe_init(&job->loop, &s->pipe, 0);
        if (rc != 0) {
            msg("cannot start rank %d: %s", i, uv_strerror(rc));
            stop_set_exit(job, 1);
            return -1;
        }
        s->pipe.data = s;
    }
    return 0;
}

/* Starts rank i. Returns 0, or -1 after saying why (and setting the exit
 * status). */
static int job_spawn_rank(struct job *job, struct rank_env *env, int i,
                          int stdin_ok)
{
    const struct opts *o = job->opts;
    struct rank *r = &job->ranks[i];
    uv_stdio_container_t stdio[3];
    uv_process_options_t po;
    int rc;

    if (job_rank_init(job, i) != 0)
        return -1;
    /* Rank 0 reads weftrun's stdin, as under mpirun; the others read
     * /dev/null. */
    stdio[0].flags = i == 0 && stdin_ok ? UV_INHERIT_FD : UV_IGNORE;
    stdio[0].data.fd = 0;
    stdio[1].flags = UV_CREATE_PIPE | UV_WRITABLE_PIPE;
    stdio[1].data.stream = (uv_stream_t *)&r->streams[0].pipe;
    stdio[2].flags = UV_CREATE_PIPE | UV_WRITABLE_PIPE;
    stdio[2].data.stream = (uv_stream_t *)&r->streams[1].pipe;

    rank_env_set_rank(env, job->hf, i, o->nranks);
    memset(&po, 0, sizeof(po));
    po.exit_cb = stop_exit_cb;
    if (job->hf != NULL) {
        r->host = job->hf->hosts[job->hf->rank_host[i]].name;
        if (remote_argv(o, job->hf, job->hf_text, i, env, &r->argv) != 0) {
            stop_set_exit(job, 1);
            return -1;
        }
    }
    po.file = r->argv != NULL ? r->argv[0] : o->prog_argv[0];
    po.args = r->argv != NULL ? r->argv : o->prog_argv;
    po.env = env->envp;
    po.stdio_count = 3;
    po.stdio = stdio;
    /* Each rank leads a process group of its own (setsid), so that stopping
     * it stops whatever it started too, and a terminal's Ctrl-C reaches the
     * ranks once, through weftrun, not twice. */
    po.flags = UV_PROCESS_DETACHED;

    rc = uv_spawn(&job->loop, &r->proc, &po);
    if (rc != 0) {
        if (i == 0)
            msg("cannot start '%s': %s", o->prog_argv[0], uv_strerror(rc));
        else
            msg("cannot start '%s' for rank %d: %s", o->prog_argv[0], i,
                uv_strerror(rc));
        stop_set_exit(job, EXIT_NOSTART);
        return -1;
    }
    r->started = 1;
    r->pid = r->proc.pid;
    job->nrunning++;
    for (int k = 0; k < 2; k++) {
        if (out_stream_start(&r->streams[k]) != 0) {
            stop_set_exit(job, 1);
            return -1;
        }
    }
    return 0;
}

static void job_close_walk_cb(uv_handle_t *h, void *arg)
{
    (void)arg;
    if (!uv_is_closing(h))
        uv_close(h, NULL);
}

/* Runs the job to the end. Returns weftrun's exit status. */
static int job_run(struct job *job, struct rank_env *env)
{
    const struct opts *o = job->opts;
    int stdin_ok = fcntl(0, F_GETFD) != -1;
    int rc;

    /* A signal that came during the setup stops the job before it starts. */
    uv_run(&job->loop, UV_RUN_NOWAIT);
    for (int i = 0; i < o->nranks && job->phase == STOP_NONE; i++) {
        if (job_spawn_rank(job, env, i, stdin_ok) != 0) {
            stop_ranks(job, SIGTERM);
            break;
        }
        /* Serve what has happened so far (a rank that failed already, a
         * signal, output), so a large job does not wait for all spawns. */
        uv_run(&job->loop, UV_RUN_NOWAIT);
        if (job->phase != STOP_NONE)
            break;
    }
    job->spawning = 0;
    out_check_done(job);

    uv_run(&job->loop, UV_RUN_DEFAULT);

    /* Close every handle (timers, signals, pipes, processes) and let the
     * close callbacks run, so the loop closes cleanly. */
    uv_walk(&job->loop, job_close_walk_cb, NULL);
    uv_run(&job->loop, UV_RUN_DEFAULT);
    rc = uv_loop_close(&job->loop);
    if (rc != 0) {
        msg("internal error: the event loop did not close: %s",
            uv_strerror(rc));
        stop_set_exit(job, 1);
    }
    for (int i = 0; i < o->nranks; i++)
        for (int k = 0; k < 2; k++)
            free(job->ranks[i].streams[k].line);
    if (o->keep_going && job->nfailed > 0 && job->phase == STOP_NONE)
        msg("%d of %d rank%s failed (named above); the others ran to their "
            "end",
            job->nfailed, o->nranks, o->nranks == 1 ? "" : "s");
    return job->exit_code < 0 ? 0 : job->exit_code;
}

/* Sets up the loop, the timers and the signal handlers, before anything
 * that needs cleaning up exists, so that a signal from now on is noticed
 * instead of killing weftrun. */
static int job_init(struct job *job, const struct opts *o)
{
    int rc;

    memset(job, 0, sizeof(*job));
    job->opts = o;
    job->exit_code = -1;
    job->spawning = 1;
    job->outfd = 1;
    rc = uv_loop_init(&job->loop);
    if (rc != 0) {
        msg("cannot create the event loop: %s", uv_strerror(rc));
        return -1;
    }
    uv_timer_init(&job->loop, &job->drain_timer);
    job->drain_timer.data = job;
    /* Like stop_init's timer and signals, the drain timer never keeps the
     * loop alive by itself: it runs while a rank runs or a pipe is open. */
    uv_unref((uv_handle_t *)&job->drain_timer);
    stop_init(job);
    return 0;
}

/* Closes the loop of a job that never ran. */
static void job_abandon(struct job *job)
{
    uv_walk(&job->loop, job_close_walk_cb, NULL);
    uv_run(&job->loop, UV_RUN_DEFAULT);
    (void)uv_loop_close(&job->loop);
}

/* A --hostfile job: the ranks read the job's own hostfile, so on other
 * hosts it must be at the same path (a shared or copied file). Returns 0,
 * or -1 after a message. */
static int job_prepare_hosts(const struct opts *o, const weft__hostfile_out *hf,
                             struct rank_env *env)
{
    char token[33];
    char *abs = realpath(o->hostfile, NULL);
    int rc = -1;

    if (abs == NULL) {
        msg("%s: %s", o->hostfile, strerror(errno));
        return -1;
    }
    if (setup_fd_limit(o->nranks) == 0 && setup_token(token) == 0 &&
        rank_env_build(env, o, abs, token, setup_master_port_hosts(hf)) == 0)
        rc = 0;
    free(abs);
    return rc;
}

/* A job on this host: one free port per rank, in a hostfile written for
 * it into *tmp, and one more for torch (MASTER_PORT). Returns 0, or -1
 * after a message. */
static int job_prepare_local(const struct opts *o, struct tmpfiles *tmp,
                             struct rank_env *env)
{
    char token[33];
    int *ports = calloc((size_t)o->nranks, sizeof(*ports));
    int master_port, rc = -1;

    if (ports == NULL)
        msg("out of memory");
    else if (setup_fd_limit(o->nranks) == 0 && setup_token(token) == 0 &&
             setup_ports(o->nranks, ports) == 0 &&
             setup_master_port_local(o->nranks, ports, &master_port) == 0 &&
             setup_tmpfiles_create(tmp) == 0 &&
             setup_write_hostfile(tmp->file, o->nranks, ports) == 0 &&
             rank_env_build(env, o, tmp->file, token, master_port) == 0)
        rc = 0;
    free(ports);
    return rc;
}

/* Everything the ranks need before the first starts. Returns 0, or -1
 * after a message, with what was made left in job, *tmp and *env for the
 * caller to free. */
static int job_prepare(struct job *job, struct tmpfiles *tmp,
                       struct rank_env *env)
{
    const struct opts *o = job->opts;

    job->ranks = calloc((size_t)o->nranks, sizeof(*job->ranks));
    if (job->ranks == NULL) {
        msg("out of memory");
        return -1;
    }
    if (job->hf != NULL)
        return job_prepare_hosts(o, job->hf, env);
    return job_prepare_local(o, tmp, env);
}

/* With fd 0, 1 or 2 closed, the first pipe or socket would take its place
 * and rank output would go there: opens /dev/null on each that is closed.
 * Returns 0, or -1 where that fails. */
static int main_std_fds(void)
{
    for (int fd = 0; fd <= 2; fd++)
        if (fcntl(fd, F_GETFD) == -1 && errno == EBADF &&
            open("/dev/null", fd == 0 ? O_RDONLY : O_WRONLY) != fd)
            return -1;
    return 0;
}

int main(int argc, char **argv)
{
    static struct job job; /* large (output buffer); one per process */
    static weft__hostfile_out hf;
    struct opts o;
    struct tmpfiles tmp = {NULL, NULL};
    struct rank_env env = {0};
    char *hf_text = NULL;
    int rc;

    if (main_std_fds() != 0)
        return 1;
    rc = args_parse(argc, argv, &o);
    if (rc != 0 || (o.prog_argv == NULL && !o.check)) {
        free(o.xvars);
        return rc;
    }
    if (o.hostfile != NULL) {
        rc = setup_hostfile(&o, &hf, &hf_text);
        if (rc == 0 && o.check)
            rc = setup_check(&o, &hf);
        if (rc != 0 || o.check)
            goto out_hostfile;
    }

    stop_prepare_signals();
    if (job_init(&job, &o) != 0) {
        rc = 1;
        goto out_hostfile;
    }
    if (o.hostfile != NULL) {
        job.hf = &hf;
        job.hf_text = hf_text;
    }
    if (job_prepare(&job, &tmp, &env) == 0) {
        rc = job_run(&job, &env);
    } else {
        job_abandon(&job);
        rc = 1;
    }

    setup_tmpfiles_remove(&tmp);
    rank_env_free(&env);
    for (int i = 0; job.ranks != NULL && i < o.nranks; i++)
        remote_argv_free(job.ranks[i].argv);
    free(job.ranks);
out_hostfile:
    weft__hostfile_free(&hf);
    free(hf_text);
    free(o.xvars);
    return rc;
}
