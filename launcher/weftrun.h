/*
 * What the files of weftrun share. Private to launcher/: nothing here is
 * installed, and nothing outside launcher/ includes it.
 *
 * weftrun is split by concern, one file each:
 *
 *   weftrun.c  main, and the job: the libuv loop, spawning the ranks
 *   msg.c      weftrun's messages (msg), which every other file uses
 *   args.c     the command line: options, their checks, the help text
 *   setup.c    what is settled before any rank starts: the hostfile and
 *              the host of each rank, --check, ports (the ranks' and
 *              MASTER_PORT), token, file limit
 *   env.c      the environment each rank gets (WEFT_RANK, WEFT_SIZE, ...,
 *              and torchrun's RANK, WORLD_SIZE, MASTER_ADDR, ...)
 *   output.c   rank output copied line by line, prefixed "[rank N] "
 *   stop.c     how a job ends: a rank's exit, the signals weftrun gets
 *   kill.c     stopping the ranks, and weftrun's exit status
 *   remote.c   the command that starts a rank on another host (ssh or
 *              --launch-cmd)
 *
 * weftrun has one thread, and after setup one libuv loop; no function here
 * is thread-safe, and none that runs in the loop blocks waiting for a rank.
 * Failures are reported with msg() where they are found; the functions
 * below then return -1 (or an exit status, where they say so) and the
 * caller only passes that on.
 */
#ifndef WEFTRUN_H
#define WEFTRUN_H

#include <stddef.h>
#include <stdio.h>

#include <uv.h>

#include "topo/hostfile.h"

#define WEFTRUN_MAX_RANKS 4096
#define WEFTRUN_OUTBUF_SIZE 65536

/* Exit statuses that are weftrun's own, not a rank's (see args.c's help
 * text for the whole list). */
#define EXIT_USAGE 2
#define EXIT_NOSTART 127

/* ------------------------------------------------------------------------ */
/* Messages (msg.c)                                                           */

/* Prints "weftrun: ", the message and a newline to stderr in one write, so
 * that it never mixes mid-line with rank output (written to fd 2 with
 * write()). Messages longer than about 1 KiB are cut. */
__attribute__((format(printf, 1, 2))) void msg(const char *fmt, ...);

/* ------------------------------------------------------------------------ */
/* The command line (args.c)                                                  */

/* What the command line asks for. The strings point into argv, which must
 * outlive this. */
struct opts {
    int nranks;            /* 0 when -n was not given */
    int wires;             /* 0 when --wires was not given */
    const char *transport; /* NULL when not given */
    const char *topology;  /* NULL when not given */
    int timeout_ms;        /* 0 when not given */
    int grace_ms;
    const char *hostfile;   /* NULL for -n N on this host */
    const char *launch_cmd; /* NULL: ssh, or directly for this host */
    int check;              /* --check: describe the hostfile, run nothing */
    const char *check_file; /* --check FILE: FILE, else NULL */
    int print_config;       /* --print-config: rank 0 prints weft_info */
    int keep_going;     /* --keep-going: a failed rank does not stop the rest */
    const char **xvars; /* the -x arguments, in order (owned array) */
    int nxvars;
    char **prog_argv; /* PROGRAM ARGS..., NULL-terminated, points into argv */
};

/* Parses the command line into *o. Returns 0 to go on, or an exit status
 * to exit with at once: 0 after --help or --version, EXIT_USAGE after a
 * usage message, 1 when out of memory. Whatever it returns, the caller
 * frees o->xvars. On 0, either o->check is set (and o->hostfile names the
 * file), or o->prog_argv is the program to run, or neither (after --help
 * or --version, whatever options came before them): nothing is to run. */
int args_parse(int argc, char **argv, struct opts *o);

/* ------------------------------------------------------------------------ */
/* Before the ranks start (setup.c)                                           */

/* For --hostfile: reads o->hostfile once (a regular file only, so a FIFO
 * cannot block weftrun) into *text, and validates it into *hf. Unless
 * o->check, also settles o->nranks: the hostfile's count, which -n, when
 * given, must equal. Returns 0 with *hf and *text to free (with
 * weft__hostfile_free and free), or EXIT_USAGE after a message, with
 * nothing held and *text NULL. */
int setup_hostfile(struct opts *o, weft__hostfile_out *hf, char **text);

/* For --check: prints to stdout the ring or mesh the job of *hf would form
 * under o's --transport, --topology and --wires (and records the first two
 * in *hf). Returns weftrun's exit status: 0, EXIT_USAGE when --topology
 * mesh does not fit the hostfile, 1 when stdout cannot be written. */
int setup_check(const struct opts *o, weft__hostfile_out *hf);

/* Raises the soft open-file limit where nranks ranks need more (each costs
 * weftrun two pipes). Returns 0, or -1 after a message. */
int setup_fd_limit(int nranks);

/* Writes 128 random bits to out as 32 lowercase hex digits and a NUL.
 * Returns 0, or -1 after a message. */
int setup_token(char out[33]);

/* Picks n distinct free TCP ports on 127.0.0.1 into ports[0..n-1]. They
 * are free when picked, not reserved. Returns 0, or -1 after a message. */
int setup_ports(int n, int *ports);

/* MASTER_PORT of a job on this host, whose nranks ranks listen on
 * ports[0..nranks-1]: a TCP port free on every address of this host when
 * picked (not reserved), and none of those. Returns 0 with *port set, or
 * -1 after a message. */
int setup_master_port_local(int nranks, const int *ports, int *port);

/* MASTER_PORT of a --hostfile job: derived from *hf alone (weftrun cannot
 * bind on rank 0's host), the port after the highest one the ranks of
 * rank 0's host listen on, or the next after it that no rank of the job
 * listens on; always in [1024, 65535]. Cannot fail. */
int setup_master_port_hosts(const weft__hostfile_out *hf);

/* The private temporary directory that holds the hostfile of a job on this
 * host; both fields owned, NULL until made. */
struct tmpfiles {
    char *dir;
    char *file; /* the hostfile's absolute path in dir */
};

/* Makes the directory (in $TMPDIR, else /tmp) and names the file in it,
 * into *t, which must be zeroed. Creates no file: setup_write_hostfile
 * does. Returns 0, or -1 after a message, with what was made recorded in
 * *t either way, for setup_tmpfiles_remove. */
int setup_tmpfiles_create(struct tmpfiles *t);

/* Removes the file and directory that exist, frees the names and zeroes
 * *t; a zeroed *t is fine. Failures other than "not there" are reported,
 * never returned. */
void setup_tmpfiles_remove(struct tmpfiles *t);

/* Writes the JSON hostfile of nranks ranks on localhost, rank i listening
 * on ports[i], to path. Returns 0, or -1 after a message. */
int setup_write_hostfile(const char *path, int nranks, const int *ports);

/* ------------------------------------------------------------------------ */
/* The environment of the ranks (env.c)                                       */

/* The environment every rank gets, built once: only the rank's own numbers
 * (and its host's MASTER_ADDR) are rewritten in place for each rank. */
struct rank_env {
    char **envp;      /* NULL-terminated, every string owned */
    size_t n;         /* strings in envp */
    char *rank;       /* envp entry "WEFT_RANK=..", rewritten per rank */
    char *local_rank; /* envp entry "WEFT_LOCAL_RANK=.." */
    char *local_size; /* envp entry "WEFT_LOCAL_SIZE=.." */
    /* torchrun's names for the same numbers: "RANK=..", "LOCAL_RANK=..",
     * "LOCAL_WORLD_SIZE=..". */
    char *torch_rank;
    char *torch_local_rank;
    char *torch_local_size;
    /* "MASTER_ADDR=..", with room for master_addr_size bytes; NULL where
     * -x gives MASTER_ADDR (then it is not rewritten). */
    char *master_addr;
    size_t master_addr_size;
};

/* The length of the name part of "NAME" or "NAME=VALUE". */
size_t env_name_len(const char *s);

/* Builds *e: weftrun's own environment minus what is set below, then
 * WEFT_RANK, WEFT_SIZE, WEFT_LOCAL_RANK, WEFT_LOCAL_SIZE, WEFT_HOSTFILE
 * (hostfile), WEFT_JOB_TOKEN (token) and the variables of o's options,
 * then torchrun's RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE,
 * MASTER_ADDR and MASTER_PORT (master_port), then the -x variables
 * (warning about those that cannot take effect). Returns 0 with *e to
 * free with rank_env_free, or -1 after a message with nothing held. The
 * strings are copied. */
int rank_env_build(struct rank_env *e, const struct opts *o,
                   const char *hostfile, const char *token, int master_port);

/* Sets WEFT_RANK, WEFT_LOCAL_RANK, WEFT_LOCAL_SIZE, their torchrun
 * names and MASTER_ADDR in *e for rank of nranks: the local numbers count
 * the ranks of its host in *hf, or of the whole job where hf is NULL (a
 * job on this host); MASTER_ADDR is where that host reaches rank 0's.
 * Cannot fail. */
void rank_env_set_rank(struct rank_env *e, const weft__hostfile_out *hf,
                       int rank, int nranks);

/* Whether entry, a string of a rank's environment, is carried to a rank
 * started over ssh: weftrun's WEFT_* variables (except WEFT_HOSTFILE, as
 * the remote rank reads the hostfile's text instead), the torchrun ones
 * it sets, and the -x ones. */
int rank_env_forwarded(const struct opts *o, const char *entry);

/* Frees what *e holds and zeroes envp; a zeroed *e is fine. */
void rank_env_free(struct rank_env *e);

/* ------------------------------------------------------------------------ */
/* The running job (weftrun.c), its output (output.c), its end (stop.c,      */
/* kill.c)                                                                    */

struct job;
struct rank;

/* One output pipe of a rank (its stdout or its stderr). */
struct stream {
    uv_pipe_t pipe;
    struct rank *rank;
    int fd;     /* weftrun's fd its lines go to: 1 or 2 */
    int open;   /* still being read */
    char *line; /* the partial line read so far, without newline */
    size_t len, cap;
};

struct rank {
    uv_process_t proc;
    struct job *job;
    int index;
    int pid;
    int started; /* uv_spawn succeeded */
    int exited;  /* stop_exit_cb ran */
    struct stream streams[2];
    char **argv;      /* what was spawned, if not PROGRAM ARGS (owned) */
    const char *host; /* its host's name in a --hostfile job, else NULL */
    char prefix[24];  /* "[rank N] " */
    size_t prefix_len;
};

enum stop_phase {
    STOP_NONE,       /* not stopping */
    STOP_SEND,       /* stop_timer sends stop_signal, then waits grace_ms */
    STOP_GRACE_OVER, /* stop_timer sends SIGKILL to those still running */
    STOP_KILL_NOW,   /* stop_timer sends SIGKILL at once */
};

struct job {
    uv_loop_t loop;
    const struct opts *opts;
    /* The hostfile of a --hostfile job and its text, or both NULL for a
     * job on this host; borrowed from main. */
    const weft__hostfile_out *hf;
    const char *hf_text;
    struct rank *ranks;
    int spawning; /* the ranks are still being started */
    int nrunning; /* started and not yet exited */
    int nopen;    /* output pipes still being read */
    uv_signal_t sigs[3];
    uv_timer_t stop_timer;
    uv_timer_t drain_timer;
    enum stop_phase phase;
    int stop_signal;   /* what STOP_SEND sends */
    int nsignals;      /* stop signals weftrun received */
    int exit_code;     /* -1 until a cause of failure is known */
    int nfailed;       /* --keep-going: ranks that failed on their own */
    int out_failed[3]; /* indexed by fd 1 and 2: output cannot be written */
    char outbuf[WEFTRUN_OUTBUF_SIZE];
    size_t outlen;
    int outfd;
};

/* Starts reading the pipe of s, whose rank was just spawned, and counts it
 * in job->nopen. Returns 0, or -1 after a message. */
int out_stream_start(struct stream *s);

/* Once every rank has been started and has exited, but pipes are still
 * open: starts the drain timer, after which the pipes are copied as far as
 * they hold data and closed, so that a process a rank left behind cannot
 * keep weftrun waiting. Does nothing otherwise; safe to call often. */
void out_check_done(struct job *job);

/* Copies what every open pipe already holds, without waiting for more,
 * and closes it: the job then ends as soon as its ranks have. */
void out_drain_all(struct job *job);

/* Sets up stop_timer and the handlers of SIGINT, SIGTERM and SIGHUP
 * (except those ignored when weftrun started), none of which keeps the
 * loop alive by itself. Call once the loop exists, before anything that
 * would need cleaning up, so that a signal from then on is noticed
 * instead of killing weftrun. Failing to handle a signal is a warning. */
void stop_init(struct job *job);

/* Unblocks the signals stop_init handles, and SIGCHLD, in case weftrun
 * was started with them blocked, and ignores SIGPIPE: weftrun reports a
 * closed stdout itself (the ranks get the default SIGPIPE back, as libuv
 * resets dispositions in children). */
void stop_prepare_signals(void);

/* The exit_cb of every rank's uv_process_t (whose data is its struct
 * rank): the first rank to fail is named on stderr, sets the exit status
 * and stops the others. */
void stop_exit_cb(uv_process_t *proc, int64_t exit_status, int term_signal);

/* Records code as weftrun's exit status unless an earlier cause already
 * did: the first cause of failure is the one reported. (This and the
 * four below are kill.c's.) */
void stop_set_exit(struct job *job, int code);

/* Stops every running rank: signum to its process group now, SIGKILL after
 * --grace-ms. Only the first call counts. The signals are sent from a
 * timer callback, never from here. */
void stop_ranks(struct job *job, int signum);

/* Sends SIGKILL to every running rank at once (from the timer callback),
 * whatever stop_ranks began. */
void stop_kill_now(struct job *job);

/* "SIGTERM" for SIGTERM, "signal N" for a number without a name; valid
 * until the next call. */
const char *stop_signal_name(int signum);

/* "" for 1, else "s": for "%d rank%s". */
const char *stop_plural(long n);

/* ------------------------------------------------------------------------ */
/* Starting a rank on another host (remote.c)                                 */

/* The command that starts rank i of a --hostfile job (hf, and its text
 * hf_text) on its host, with the rank's environment env:
 * - with --launch-cmd: its words ({host} replaced by the host's name),
 *   then PROGRAM ARGS; the rank's environment passes through it;
 * - a host that is this one: none, PROGRAM ARGS are spawned as they are;
 * - else: ssh HOST 'cd DIR && exec env VARS PROGRAM ARGS', carrying the
 *   hostfile's text and the variables rank_env_forwarded names.
 * Returns 0 with *out a new NULL-terminated argv (free it with
 * remote_argv_free) or NULL for "as they are"; or -1 after a message, with
 * *out NULL. */
int remote_argv(const struct opts *o, const weft__hostfile_out *hf,
                const char *hf_text, int i, const struct rank_env *env,
                char ***out);

/* Frees an argv made by remote_argv, its strings too; NULL is fine. */
void remote_argv_free(char **argv);

#endif
