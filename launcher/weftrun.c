/*
 * weftrun: starts the ranks of a weft job and supervises them.
 *
 * This is the single-host launcher (`weftrun -n N PROGRAM ...`). It picks N
 * free loopback ports, writes a JSON hostfile into a private temporary
 * directory, starts N copies of PROGRAM with WEFT_RANK, WEFT_SIZE,
 * WEFT_HOSTFILE, WEFT_JOB_TOKEN and friends in their environment, and copies
 * their output, line by line and prefixed with `[rank N] `, to its own stdout
 * and stderr.
 *
 * Everything after the ranks are started happens in one libuv loop: rank
 * output arrives on pipes, rank exits arrive through exit_cb (libuv reaps the
 * children on SIGCHLD), SIGINT/SIGTERM/SIGHUP sent to weftrun arrive on
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
 */
#define _GNU_SOURCE

#include "weft.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/random.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>

#include <jansson.h>
#include <uv.h>

#include "topo/hostfile.h"

#define WEFTRUN_MAX_RANKS 4096
#define WEFTRUN_DEFAULT_GRACE_MS 3000

/* After the last rank has exited, how long its output pipes may stay open.
 * They stay open only when a rank left a background process behind that
 * still holds them; weftrun then copies what is already buffered and closes
 * them rather than wait for that process. */
#define WEFTRUN_DRAIN_MS 1000
/* At most this much is read from one pipe when it is closed that way, so a
 * leftover process that keeps writing cannot keep weftrun busy. */
#define WEFTRUN_DRAIN_MAX_BYTES (1 << 20)

/* A line longer than this without a newline is cut and printed in pieces,
 * so a rank that never writes a newline cannot grow weftrun without bound. */
#define WEFTRUN_LINE_MAX 65536
#define WEFTRUN_READ_SIZE 65536
#define WEFTRUN_OUTBUF_SIZE 65536

#define EXIT_USAGE 2
#define EXIT_NOSTART 127

/* ------------------------------------------------------------------------ */
/* Messages                                                                   */

/* One message, one line, one write: stderr is unbuffered, and rank output
 * goes to fd 2 with write() directly, so the two never mix mid-line. */
__attribute__((format(printf, 1, 2))) static void msg(const char *fmt, ...)
{
    char buf[1024];
    size_t n;
    va_list ap;
    int len;

    memcpy(buf, "weftrun: ", 9);
    va_start(ap, fmt);
    len = vsnprintf(buf + 9, sizeof(buf) - 10, fmt, ap);
    va_end(ap);
    n = 9 + (len < 0 ? 0 : (size_t)len);
    if (n > sizeof(buf) - 2)
        n = sizeof(buf) - 2; /* truncated */
    buf[n++] = '\n';
    fwrite(buf, 1, n, stderr);
}

static const char *signal_name(int signum)
{
    static char buf[32];
    const char *abbrev = sigabbrev_np(signum);

    if (abbrev == NULL)
        snprintf(buf, sizeof(buf), "signal %d", signum);
    else
        snprintf(buf, sizeof(buf), "SIG%s", abbrev);
    return buf;
}

static const char *plural(long n)
{
    return n == 1 ? "" : "s";
}

/* ------------------------------------------------------------------------ */
/* Command line                                                               */

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
    const char **xvars;     /* the -x arguments, in order */
    int nxvars;
    char **prog_argv; /* PROGRAM ARGS..., NULL-terminated, points into argv */
};

enum opt_id {
    OPT_N,
    OPT_HOSTFILE,
    OPT_WIRES,
    OPT_TRANSPORT,
    OPT_TOPOLOGY,
    OPT_TIMEOUT,
    OPT_GRACE,
    OPT_X,
    OPT_LAUNCH_CMD,
    OPT_CHECK,
    OPT_HELP,
    OPT_VERSION,
};

/* Whether an option takes a value: none, one, or one that may be left out
 * (attached with '=', or the next argument unless that starts with '-'). */
enum { ARG_NONE, ARG_REQUIRED, ARG_OPTIONAL };

static const struct {
    const char *name;
    enum opt_id id;
    int has_arg;
} opt_table[] = {
    {"-n", OPT_N, ARG_REQUIRED},
    {"-np", OPT_N, ARG_REQUIRED},
    {"--np", OPT_N, ARG_REQUIRED},
    {"--hostfile", OPT_HOSTFILE, ARG_REQUIRED},
    {"--wires", OPT_WIRES, ARG_REQUIRED},
    {"--transport", OPT_TRANSPORT, ARG_REQUIRED},
    {"--topology", OPT_TOPOLOGY, ARG_REQUIRED},
    {"--timeout-ms", OPT_TIMEOUT, ARG_REQUIRED},
    {"--grace-ms", OPT_GRACE, ARG_REQUIRED},
    {"-x", OPT_X, ARG_REQUIRED},
    {"--launch-cmd", OPT_LAUNCH_CMD, ARG_REQUIRED},
    {"--check", OPT_CHECK, ARG_OPTIONAL},
    {"-h", OPT_HELP, ARG_NONE},
    {"--help", OPT_HELP, ARG_NONE},
    {"--version", OPT_VERSION, ARG_NONE},
};

static void print_usage(FILE *f)
{
    fputs(
        "Usage: weftrun -n N [options] [--] PROGRAM [ARGS...]\n"
        "       weftrun --hostfile FILE [options] [--] PROGRAM [ARGS...]\n"
        "       weftrun --check FILE [options]\n"
        "\n"
        "Starts N ranks of PROGRAM on this host, or the ranks of a hostfile\n"
        "on its hosts (over ssh or --launch-cmd), and supervises them. Each\n"
        "output line of a rank is printed prefixed with \"[rank N] \". When a\n"
        "rank fails, the others are stopped and weftrun exits non-zero.\n"
        "\n"
        "Options (before PROGRAM):\n"
        "  -n, -np N          number of ranks, 1..4096\n"
        "  --hostfile FILE    hosts and links (JSON, MLX or mpirun form)\n"
        "  --launch-cmd CMD   run commands on a host with CMD instead of ssh;\n"
        "                     {host} in CMD is replaced by the host's name\n"
        "  --check [FILE]     validate FILE (or --hostfile FILE), print the\n"
        "                     ring or mesh it would form, start nothing; an\n"
        "                     argument after --check that starts with '-'\n"
        "                     is the next option, not FILE\n"
        "  --wires W          connections per peer on each link "
        "(WEFT_WIRES)\n"
        "  --transport T      tcp | ibverbs (WEFT_TRANSPORT)\n"
        "  --topology T       ring | mesh | auto (WEFT_TOPOLOGY)\n"
        "  --timeout-ms MS    default per-operation deadline of the ranks\n"
        "                     (WEFT_TIMEOUT_MS)\n"
        "  --grace-ms MS      time between SIGTERM and SIGKILL when stopping\n"
        "                     ranks (default 3000)\n"
        "  -x VAR[=VALUE]     set VAR for the ranks; without VALUE, forward\n"
        "                     weftrun's own VAR (repeatable)\n"
        "  -h, --help         print this help and exit\n"
        "  --version          print the version and exit\n"
        "\n"
        "Exit status: 0 when every rank exited 0; the failed rank's code\n"
        "(1..125) or 128+signal when a rank failed; 128+signal when weftrun\n"
        "was stopped by a signal; 127 when PROGRAM could not be started;\n"
        "2 for a usage error; 1 otherwise.\n",
        f);
}

__attribute__((format(printf, 1, 2))) static void usage_error(const char *fmt,
                                                              ...)
{
    va_list ap;

    fputs("weftrun: ", stderr);
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fputs("\n\n", stderr);
    print_usage(stderr);
}

/* Parses a decimal integer in [min, max]; digits only (no sign, no space). */
static int parse_int(const char *s, long min, long max, int *out)
{
    char *end;
    long v;

    if (s[0] < '0' || s[0] > '9')
        return -1;
    errno = 0;
    v = strtol(s, &end, 10);
    if (errno != 0 || *end != '\0' || v < min || v > max)
        return -1;
    *out = (int)v;
    return 0;
}

static int is_digits(const char *s)
{
    if (*s == '\0')
        return 0;
    for (; *s != '\0'; s++)
        if (*s < '0' || *s > '9')
            return 0;
    return 1;
}

/* Length of the name part of "NAME" or "NAME=VALUE". */
static size_t env_name_len(const char *s)
{
    return strcspn(s, "=");
}

static int valid_env_name(const char *s, size_t n)
{
    if (n == 0 || (s[0] >= '0' && s[0] <= '9'))
        return 0;
    for (size_t i = 0; i < n; i++) {
        char c = s[i];
        if (!(c == '_' || (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') ||
              (c >= '0' && c <= '9')))
            return 0;
    }
    return 1;
}

/* Finds the option `arg` names. For a match, *val is the attached value
 * ("--wires=2", "-n4", "-xFOO=1") or NULL. Returns -1 if none matches. */
static int find_opt(const char *arg, const char **val)
{
    const char *eq = NULL;
    size_t n = strlen(arg);

    *val = NULL;
    if (strncmp(arg, "--", 2) == 0) {
        eq = strchr(arg, '=');
        if (eq != NULL) {
            n = (size_t)(eq - arg);
            *val = eq + 1;
        }
    }
    for (size_t i = 0; i < sizeof(opt_table) / sizeof(opt_table[0]); i++)
        if (strlen(opt_table[i].name) == n &&
            strncmp(opt_table[i].name, arg, n) == 0)
            return (int)i;
    if (eq != NULL)
        return -1;
    /* Short forms with the value attached: -np4, -n4, -xVAR[=VALUE]. */
    if (strncmp(arg, "-np", 3) == 0 && is_digits(arg + 3)) {
        *val = arg + 3;
        return 1;
    }
    if (strncmp(arg, "-n", 2) == 0 && is_digits(arg + 2)) {
        *val = arg + 2;
        return 0;
    }
    if (strncmp(arg, "-x", 2) == 0 && arg[2] != '\0') {
        *val = arg + 2;
        for (size_t i = 0; i < sizeof(opt_table) / sizeof(opt_table[0]); i++)
            if (opt_table[i].id == OPT_X)
                return (int)i;
    }
    return -1;
}

/* Whether paths a and b name one file: the same string, or the same file
 * under two names (hosts.json and ./hosts.json). stat() opens nothing, so
 * it cannot block on a FIFO. */
static int same_file(const char *a, const char *b)
{
    struct stat sa, sb;

    if (strcmp(a, b) == 0)
        return 1;
    return stat(a, &sa) == 0 && stat(b, &sb) == 0 && sa.st_dev == sb.st_dev &&
           sa.st_ino == sb.st_ino;
}

/* Parses the command line. Returns 0 to go on, or an exit status to exit
 * with at once (0 after --help or --version, EXIT_USAGE after a message). */
static int parse_args(int argc, char **argv, struct opts *o)
{
    int i = 1;

    memset(o, 0, sizeof(*o));
    o->grace_ms = WEFTRUN_DEFAULT_GRACE_MS;
    o->xvars = calloc((size_t)argc, sizeof(*o->xvars));
    if (o->xvars == NULL) {
        msg("out of memory");
        return 1;
    }

    while (i < argc) {
        const char *arg = argv[i];
        const char *val;
        int k;

        if (strcmp(arg, "--") == 0) {
            i++;
            break;
        }
        if (arg[0] != '-' || arg[1] == '\0')
            break; /* PROGRAM */
        k = find_opt(arg, &val);
        if (k < 0) {
            usage_error("unknown option '%s'", arg);
            return EXIT_USAGE;
        }
        if (opt_table[k].has_arg == ARG_OPTIONAL) {
            /* "--check -x V" or "--check -- PROG" give no FILE; a file
             * named "-f" can still be given as --check=-f or --check ./-f.
             */
            if (val == NULL && i + 1 < argc && argv[i + 1][0] != '-')
                val = argv[++i];
        } else if (opt_table[k].has_arg == ARG_REQUIRED && val == NULL) {
            if (i + 1 >= argc) {
                usage_error("option '%s' needs a value", arg);
                return EXIT_USAGE;
            }
            val = argv[++i];
        } else if (opt_table[k].has_arg == ARG_NONE && val != NULL) {
            usage_error("option '%s' takes no value", opt_table[k].name);
            return EXIT_USAGE;
        }
        i++;

        switch (opt_table[k].id) {
        case OPT_N:
            if (parse_int(val, 1, WEFTRUN_MAX_RANKS, &o->nranks) != 0) {
                usage_error("-n: the number of ranks must be an integer from "
                            "1 to %d, not '%s'",
                            WEFTRUN_MAX_RANKS, val);
                return EXIT_USAGE;
            }
            break;
        case OPT_WIRES:
            if (parse_int(val, 1, INT_MAX, &o->wires) != 0) {
                usage_error("--wires: expected a positive integer, not '%s'",
                            val);
                return EXIT_USAGE;
            }
            break;
        case OPT_TRANSPORT:
            if (strcmp(val, "tcp") != 0 && strcmp(val, "ibverbs") != 0) {
                usage_error("--transport: expected tcp or ibverbs, not '%s'",
                            val);
                return EXIT_USAGE;
            }
            o->transport = val;
            break;
        case OPT_TOPOLOGY:
            if (strcmp(val, "ring") != 0 && strcmp(val, "mesh") != 0 &&
                strcmp(val, "auto") != 0) {
                usage_error("--topology: expected ring, mesh or auto, not "
                            "'%s'",
                            val);
                return EXIT_USAGE;
            }
            o->topology = val;
            break;
        case OPT_TIMEOUT:
            if (parse_int(val, 1, INT_MAX, &o->timeout_ms) != 0) {
                usage_error("--timeout-ms: expected a positive integer "
                            "(milliseconds), not '%s'",
                            val);
                return EXIT_USAGE;
            }
            break;
        case OPT_GRACE:
            if (parse_int(val, 0, INT_MAX, &o->grace_ms) != 0) {
                usage_error("--grace-ms: expected a non-negative integer "
                            "(milliseconds), not '%s'",
                            val);
                return EXIT_USAGE;
            }
            break;
        case OPT_X:
            if (!valid_env_name(val, env_name_len(val))) {
                usage_error("-x: expected VAR or VAR=VALUE with VAR a valid "
                            "variable name, not '%s'",
                            val);
                return EXIT_USAGE;
            }
            o->xvars[o->nxvars++] = val;
            break;
        case OPT_HOSTFILE:
            o->hostfile = val;
            break;
        case OPT_LAUNCH_CMD:
            o->launch_cmd = val;
            break;
        case OPT_CHECK:
            if (val != NULL && *val == '\0') {
                usage_error("--check: expected a hostfile, not an empty "
                            "name");
                return EXIT_USAGE;
            }
            o->check = 1;
            if (val != NULL)
                o->check_file = val;
            break;
        case OPT_HELP:
            print_usage(stdout);
            return fflush(stdout) == 0 ? 0 : 1;
        case OPT_VERSION:
            printf("weftrun (weft) %d.%d.%d\n", WEFT_VERSION_MAJOR,
                   WEFT_VERSION_MINOR, WEFT_VERSION_PATCH);
            return fflush(stdout) == 0 ? 0 : 1;
        }
    }

    if (o->check_file != NULL) {
        if (o->hostfile == NULL) {
            o->hostfile = o->check_file;
        } else if (!same_file(o->check_file, o->hostfile)) {
            usage_error("--check %s and --hostfile %s name different files; "
                        "give the hostfile once",
                        o->check_file, o->hostfile);
            return EXIT_USAGE;
        }
    }
    if ((o->launch_cmd != NULL || o->check) && o->hostfile == NULL) {
        usage_error("%s needs --hostfile FILE%s",
                    o->check ? "--check" : "--launch-cmd",
                    o->check ? " (or --check FILE)" : "");
        return EXIT_USAGE;
    }
    if (o->check)
        return 0; /* no program: nothing is started */
    if (o->nranks == 0 && o->hostfile == NULL) {
        usage_error("-n N or --hostfile FILE is required");
        return EXIT_USAGE;
    }
    if (i >= argc) {
        usage_error("no PROGRAM given");
        return EXIT_USAGE;
    }
    o->prog_argv = &argv[i];
    return 0;
}

/* ------------------------------------------------------------------------ */
/* Job setup: file limit, token, ports, hostfile                              */

/* Each rank costs weftrun two descriptors (its stdout and stderr pipes).
 * Raises the soft limit when N needs more; the ranks inherit the raised
 * limit, which only happens for jobs of several hundred ranks. */
static int ensure_fd_limit(int nranks)
{
    struct rlimit rl;
    rlim_t need = (rlim_t)nranks * 2 + 64;

    if (getrlimit(RLIMIT_NOFILE, &rl) != 0)
        return 0; /* let the spawns fail if it really is too low */
    if (rl.rlim_cur == RLIM_INFINITY || rl.rlim_cur >= need)
        return 0;
    if (rl.rlim_max != RLIM_INFINITY && rl.rlim_max < need) {
        msg("%d ranks need about %lu open files, but the limit is %lu "
            "(ulimit -n)",
            nranks, (unsigned long)need, (unsigned long)rl.rlim_max);
        return -1;
    }
    rl.rlim_cur = need;
    if (setrlimit(RLIMIT_NOFILE, &rl) != 0) {
        msg("cannot raise the open-file limit to %lu: %s", (unsigned long)need,
            strerror(errno));
        return -1;
    }
    return 0;
}

/* 128 random bits as 32 lowercase hex digits and a NUL. */
static int make_job_token(char out[33])
{
    static const char hex[] = "0123456789abcdef";
    unsigned char bytes[16];
    size_t got = 0;

    while (got < sizeof(bytes)) {
        ssize_t n = getrandom(bytes + got, sizeof(bytes) - got, 0);
        if (n < 0) {
            if (errno == EINTR)
                continue;
            msg("cannot make the job token: getrandom: %s", strerror(errno));
            return -1;
        }
        got += (size_t)n;
    }
    for (size_t i = 0; i < sizeof(bytes); i++) {
        out[2 * i] = hex[bytes[i] >> 4];
        out[2 * i + 1] = hex[bytes[i] & 0xf];
    }
    out[32] = '\0';
    return 0;
}

/* Picks n distinct free TCP ports on 127.0.0.1: binds port 0, reads the
 * port the kernel chose, closes. A port is free when picked; nothing stops
 * another process from taking it before the rank binds it. */
static int pick_ports(int n, int *ports)
{
    for (int i = 0; i < n; i++) {
        int tries = 0;

        for (;;) {
            struct sockaddr_in sa = {
                .sin_family = AF_INET,
                .sin_port = 0,
                .sin_addr.s_addr = htonl(INADDR_LOOPBACK),
            };
            socklen_t len = sizeof(sa);
            int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
            int port, dup = 0;

            if (fd < 0) {
                msg("cannot pick a port: socket: %s", strerror(errno));
                return -1;
            }
            if (bind(fd, (struct sockaddr *)&sa, sizeof(sa)) != 0 ||
                getsockname(fd, (struct sockaddr *)&sa, &len) != 0) {
                msg("cannot pick a port on 127.0.0.1: %s", strerror(errno));
                close(fd);
                return -1;
            }
            close(fd);
            port = ntohs(sa.sin_port);
            for (int j = 0; j < i && !dup; j++)
                dup = ports[j] == port;
            if (!dup) {
                ports[i] = port;
                break;
            }
            if (++tries >= 1000) {
                msg("cannot find %d distinct free ports on 127.0.0.1", n);
                return -1;
            }
        }
    }
    return 0;
}

/* The temporary directory that holds the hostfile; removed at exit. */
struct tmpfiles {
    char *dir;  /* NULL until created */
    char *file; /* NULL until named */
};

static int tmpfiles_create(struct tmpfiles *t)
{
    const char *base = getenv("TMPDIR");
    char *tmpl = NULL;
    char *real;

    if (base == NULL || base[0] == '\0')
        base = "/tmp";
    if (asprintf(&tmpl, "%s/weftrun.XXXXXX", base) < 0) {
        msg("out of memory");
        return -1;
    }
    if (mkdtemp(tmpl) == NULL) {
        msg("cannot create a temporary directory in %s: %s", base,
            strerror(errno));
        free(tmpl);
        return -1;
    }
    /* The ranks may run elsewhere than weftrun's cwd some day; give them an
     * absolute path even when TMPDIR is relative. */
    real = realpath(tmpl, NULL);
    if (real != NULL) {
        free(tmpl);
        tmpl = real;
    }
    t->dir = tmpl;
    if (asprintf(&t->file, "%s/hostfile.json", t->dir) < 0) {
        t->file = NULL;
        msg("out of memory");
        return -1;
    }
    return 0;
}

static void tmpfiles_remove(struct tmpfiles *t)
{
    if (t->file != NULL && unlink(t->file) != 0 && errno != ENOENT)
        msg("cannot remove %s: %s", t->file, strerror(errno));
    if (t->dir != NULL && rmdir(t->dir) != 0 && errno != ENOENT)
        msg("cannot remove %s: %s", t->dir, strerror(errno));
    free(t->file);
    free(t->dir);
    t->file = NULL;
    t->dir = NULL;
}

/* {"port": p0, "hosts": [{"name": "localhost", "ranks": N,
 *  "ports": [p0, ..., pN-1]}], "links": []} */
static int write_hostfile(const char *path, int nranks, const int *ports)
{
    json_t *root = json_object();
    json_t *hosts = json_array();
    json_t *host = json_object();
    json_t *plist = json_array();
    int bad = root == NULL || hosts == NULL || host == NULL || plist == NULL;

    for (int i = 0; i < nranks && !bad; i++)
        bad |= json_array_append_new(plist, json_integer(ports[i])) != 0;
    if (!bad) {
        bad |= json_object_set_new(host, "name", json_string("localhost"));
        bad |= json_object_set_new(host, "ranks", json_integer(nranks));
        bad |= json_object_set(host, "ports", plist);
        bad |= json_array_append(hosts, host);
        bad |= json_object_set_new(root, "port", json_integer(ports[0]));
        bad |= json_object_set(root, "hosts", hosts);
        bad |= json_object_set_new(root, "links", json_array());
    }
    if (!bad && json_dump_file(root, path, JSON_INDENT(2)) != 0) {
        msg("cannot write the hostfile %s: %s", path, strerror(errno));
        bad = 1;
    } else if (bad) {
        msg("out of memory");
    }
    json_decref(plist);
    json_decref(host);
    json_decref(hosts);
    json_decref(root);
    return bad ? -1 : 0;
}

/* ------------------------------------------------------------------------ */
/* Environment of the ranks                                                   */

/* Variables weftrun sets itself for every rank; -x cannot change them. */
static const char *const fixed_vars[] = {
    "WEFT_RANK",       "WEFT_SIZE",     "WEFT_LOCAL_RANK",
    "WEFT_LOCAL_SIZE", "WEFT_HOSTFILE", "WEFT_JOB_TOKEN",
};

struct rank_env {
    char **envp;      /* NULL-terminated, every string owned */
    size_t n;         /* strings in envp */
    char *rank;       /* envp entry "WEFT_RANK=..", rewritten per rank */
    char *local_rank; /* envp entry "WEFT_LOCAL_RANK=.." */
    char *local_size; /* envp entry "WEFT_LOCAL_SIZE=.." */
};

static int env_push(struct rank_env *e, char *s)
{
    if (s == NULL)
        return -1;
    e->envp[e->n++] = s;
    return 0;
}

__attribute__((format(printf, 2, 3))) static int env_pushf(struct rank_env *e,
                                                           const char *fmt, ...)
{
    va_list ap;
    char *s;
    int rc;

    va_start(ap, fmt);
    rc = vasprintf(&s, fmt, ap);
    va_end(ap);
    return env_push(e, rc < 0 ? NULL : s);
}

static int name_in(const char *entry, const char *const *names, size_t n)
{
    size_t len = env_name_len(entry);

    for (size_t i = 0; i < n; i++)
        if (names[i] != NULL && env_name_len(names[i]) == len &&
            strncmp(names[i], entry, len) == 0)
            return 1;
    return 0;
}

static void rank_env_free(struct rank_env *e)
{
    if (e->envp == NULL)
        return;
    for (size_t i = 0; i < e->n; i++)
        free(e->envp[i]);
    free(e->envp);
    e->envp = NULL;
}

/* Builds the environment every rank gets: weftrun's own, minus what is set
 * below, then the WEFT_* variables, then the -x variables. */
static int rank_env_build(struct rank_env *e, const struct opts *o,
                          const char *hostfile, const char *token)
{
    extern char **environ;
    /* The names of everything set below, to drop from the inherited part. */
    const char **names = NULL;
    const char **xset = NULL; /* effective -x entries ("NAME" or "N=V") */
    size_t nnames = 0, nenv = 0;
    int rc = -1;

    for (char **p = environ; *p != NULL; p++)
        nenv++;
    memset(e, 0, sizeof(*e));
    names = calloc(10 + (size_t)o->nxvars, sizeof(*names));
    xset = calloc((size_t)o->nxvars + 1, sizeof(*xset));
    e->envp = calloc(nenv + 11 + (size_t)o->nxvars, sizeof(*e->envp));
    if (names == NULL || xset == NULL || e->envp == NULL) {
        msg("out of memory");
        goto out;
    }

    for (size_t i = 0; i < sizeof(fixed_vars) / sizeof(fixed_vars[0]); i++)
        names[nnames++] = fixed_vars[i];
    if (o->timeout_ms > 0)
        names[nnames++] = "WEFT_TIMEOUT_MS";
    if (o->wires > 0)
        names[nnames++] = "WEFT_WIRES";
    if (o->transport != NULL)
        names[nnames++] = "WEFT_TRANSPORT";
    if (o->topology != NULL)
        names[nnames++] = "WEFT_TOPOLOGY";

    /* Decide which -x entries take effect: not the ones weftrun sets
     * itself, and for a name given twice the last one. */
    for (int i = 0; i < o->nxvars; i++) {
        const char *x = o->xvars[i];
        size_t len = env_name_len(x);
        int later = 0;

        if (name_in(x, names, nnames)) {
            msg("warning: -x %.*s ignored: weftrun sets %.*s itself", (int)len,
                x, (int)len, x);
            continue;
        }
        for (int j = i + 1; j < o->nxvars && !later; j++)
            later = env_name_len(o->xvars[j]) == len &&
                    strncmp(o->xvars[j], x, len) == 0;
        if (later)
            continue;
        if (x[len] == '\0' && getenv(x) == NULL) {
            msg("warning: -x %s: %s is not set in weftrun's environment; not "
                "forwarded",
                x, x);
            continue;
        }
        xset[i] = x;
    }

    for (char **p = environ; *p != NULL; p++) {
        if (strchr(*p, '=') == NULL || name_in(*p, names, nnames) ||
            name_in(*p, xset, (size_t)o->nxvars))
            continue;
        if (env_push(e, strdup(*p)) != 0)
            goto oom;
    }

    /* "WEFT_RANK=" and "WEFT_LOCAL_RANK=" with room for any rank number. */
    if (env_pushf(e, "WEFT_RANK=%d", WEFTRUN_MAX_RANKS) != 0)
        goto oom;
    e->rank = e->envp[e->n - 1];
    if (env_pushf(e, "WEFT_SIZE=%d", o->nranks) != 0 ||
        env_pushf(e, "WEFT_LOCAL_RANK=%d", WEFTRUN_MAX_RANKS) != 0)
        goto oom;
    e->local_rank = e->envp[e->n - 1];
    if (env_pushf(e, "WEFT_LOCAL_SIZE=%d", WEFTRUN_MAX_RANKS) != 0)
        goto oom;
    e->local_size = e->envp[e->n - 1];
    if (env_pushf(e, "WEFT_HOSTFILE=%s", hostfile) != 0 ||
        env_pushf(e, "WEFT_JOB_TOKEN=%s", token) != 0)
        goto oom;
    if (o->timeout_ms > 0 &&
        env_pushf(e, "WEFT_TIMEOUT_MS=%d", o->timeout_ms) != 0)
        goto oom;
    if (o->wires > 0 && env_pushf(e, "WEFT_WIRES=%d", o->wires) != 0)
        goto oom;
    if (o->transport != NULL &&
        env_pushf(e, "WEFT_TRANSPORT=%s", o->transport) != 0)
        goto oom;
    if (o->topology != NULL &&
        env_pushf(e, "WEFT_TOPOLOGY=%s", o->topology) != 0)
        goto oom;
    for (int i = 0; i < o->nxvars; i++) {
        const char *x = xset[i];

        if (x == NULL)
            continue;
        if (strchr(x, '=') != NULL) {
            if (env_push(e, strdup(x)) != 0)
                goto oom;
        } else if (env_pushf(e, "%s=%s", x, getenv(x)) != 0) {
            goto oom;
        }
    }
    rc = 0;
    goto out;

oom:
    msg("out of memory");
out:
    free(names);
    free(xset);
    if (rc != 0)
        rank_env_free(e);
    return rc;
}

/* The hostfile of a --hostfile job (NULL for -n N on this host), and its
 * text, handed to ranks started over ssh as WEFT_HOSTFILE_TEXT. */
static weft__hostfile_out *g_hf;
static char *g_hf_text;

static void rank_env_set_rank(struct rank_env *e, int rank, int nranks)
{
    int local = rank, nlocal = nranks;

    if (g_hf != NULL) {
        const weft__host *h = &g_hf->hosts[g_hf->rank_host[rank]];
        local = rank - h->first_rank;
        nlocal = h->nranks;
    }
    /* The entries were made with room for WEFTRUN_MAX_RANKS. */
    sprintf(e->rank, "WEFT_RANK=%d", rank);
    sprintf(e->local_rank, "WEFT_LOCAL_RANK=%d", local);
    sprintf(e->local_size, "WEFT_LOCAL_SIZE=%d", nlocal);
}

/* ------------------------------------------------------------------------ */
/* The running job                                                            */

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
    int exited;  /* exit_cb ran */
    struct stream streams[2];
    char **argv;     /* what was spawned, if not PROGRAM ARGS (owned) */
    const char *host; /* its host's name in a --hostfile job, else NULL */
    char prefix[24]; /* "[rank N] " */
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
    int out_failed[3]; /* indexed by fd 1 and 2: output cannot be written */
    char outbuf[WEFTRUN_OUTBUF_SIZE];
    size_t outlen;
    int outfd;
};

static char read_buf[WEFTRUN_READ_SIZE];

static void job_stop(struct job *job, int signum);

/* Sets the exit status unless an earlier cause already did. */
static void job_set_exit(struct job *job, int code)
{
    if (job->exit_code < 0)
        job->exit_code = code;
}

/* Writes all of p to fd. Blocks (as any program does) while the reader of
 * weftrun's output does not keep up. */
static void out_write(struct job *job, int fd, const char *p, size_t n)
{
    while (n > 0 && !job->out_failed[fd]) {
        ssize_t w = write(fd, p, n);

        if (w >= 0) {
            p += w;
            n -= (size_t)w;
            continue;
        }
        if (errno == EINTR)
            continue;
        if (errno == EAGAIN || errno == EWOULDBLOCK) {
            struct pollfd pfd = {.fd = fd, .events = POLLOUT};
            (void)poll(&pfd, 1, -1);
            continue;
        }
        job->out_failed[fd] = 1;
        if (errno == EPIPE) {
            /* Whoever read weftrun's output is gone: stop the job, as a
             * single program writing there would be stopped by SIGPIPE. */
            if (fd == 1)
                msg("stdout was closed; stopping the ranks");
            job_set_exit(job, 128 + SIGPIPE);
            job_stop(job, SIGTERM);
        } else if (fd == 1) {
            msg("cannot write to stdout (%s); rank output to stdout is lost",
                strerror(errno));
        }
    }
}

static void out_flush(struct job *job)
{
    if (job->outlen > 0)
        out_write(job, job->outfd, job->outbuf, job->outlen);
    job->outlen = 0;
}

/* Queues one output line: the rank prefix, a, b and a newline if nl. Lines
 * are only ever written whole, so lines of different ranks cannot mix. */
static void out_line(struct job *job, struct stream *s, const char *a,
                     size_t alen, const char *b, size_t blen, int nl)
{
    struct rank *r = s->rank;
    size_t total = r->prefix_len + alen + blen + (nl ? 1 : 0);

    if (job->outfd != s->fd) {
        out_flush(job);
        job->outfd = s->fd;
    }
    if (job->outlen + total > sizeof(job->outbuf))
        out_flush(job);
    if (total > sizeof(job->outbuf)) {
        /* Too long to queue: write its pieces one after the other. Nothing
         * else runs in between, so the line stays whole. */
        out_write(job, s->fd, r->prefix, r->prefix_len);
        out_write(job, s->fd, a, alen);
        out_write(job, s->fd, b, blen);
        if (nl)
            out_write(job, s->fd, "\n", 1);
        return;
    }
    memcpy(job->outbuf + job->outlen, r->prefix, r->prefix_len);
    job->outlen += r->prefix_len;
    if (alen > 0)
        memcpy(job->outbuf + job->outlen, a, alen);
    job->outlen += alen;
    if (blen > 0)
        memcpy(job->outbuf + job->outlen, b, blen);
    job->outlen += blen;
    if (nl)
        job->outbuf[job->outlen++] = '\n';
}

/* Keeps data (no newline in it) as the start of the next line. */
static void stream_keep(struct job *job, struct stream *s, const char *data,
                        size_t n)
{
    while (n > 0) {
        size_t take;

        if (s->len == s->cap && s->cap < WEFTRUN_LINE_MAX) {
            size_t cap = s->cap == 0 ? 256 : s->cap * 2;
            char *p;

            if (cap > WEFTRUN_LINE_MAX)
                cap = WEFTRUN_LINE_MAX;
            p = realloc(s->line, cap);
            if (p != NULL) {
                s->line = p;
                s->cap = cap;
            }
        }
        if (s->len == s->cap) {
            /* At the length limit (or out of memory): print what we have
             * as a line of its own, with the new data. */
            out_line(job, s, s->line, s->len, data, n, 1);
            s->len = 0;
            return;
        }
        take = s->cap - s->len;
        if (take > n)
            take = n;
        memcpy(s->line + s->len, data, take);
        s->len += take;
        data += take;
        n -= take;
    }
}

static void stream_feed(struct stream *s, const char *data, size_t n)
{
    struct job *job = s->rank->job;

    while (n > 0) {
        const char *nl = memchr(data, '\n', n);
        size_t seg;

        if (nl == NULL) {
            stream_keep(job, s, data, n);
            break;
        }
        seg = (size_t)(nl - data);
        out_line(job, s, s->line, s->len, data, seg, 1);
        s->len = 0;
        data += seg + 1;
        n -= seg + 1;
    }
    out_flush(job);
}

/* Prints the partial last line, if any, and stops reading. */
static void stream_finish(struct stream *s)
{
    struct job *job = s->rank->job;

    if (!s->open)
        return;
    if (s->len > 0) {
        out_line(job, s, s->line, s->len, NULL, 0, 1);
        out_flush(job);
    }
    free(s->line);
    s->line = NULL;
    s->len = s->cap = 0;
    s->open = 0;
    uv_close((uv_handle_t *)&s->pipe, NULL);
    job->nopen--;
}

/* Copies what is already buffered in the pipe, without waiting for more,
 * then closes it. */
static void stream_drain_now(struct stream *s)
{
    uv_os_fd_t fd;
    size_t total = 0;

    if (!s->open)
        return;
    if (uv_fileno((uv_handle_t *)&s->pipe, &fd) == 0) {
        while (total < WEFTRUN_DRAIN_MAX_BYTES) {
            ssize_t n = read(fd, read_buf, sizeof(read_buf));

            if (n > 0) {
                stream_feed(s, read_buf, (size_t)n);
                total += (size_t)n;
            } else if (n < 0 && errno == EINTR) {
                continue;
            } else {
                break; /* EOF, EAGAIN (the pipe is non-blocking) or error */
            }
        }
    }
    stream_finish(s);
}

static void drain_timer_cb(uv_timer_t *t)
{
    struct job *job = t->data;

    for (int i = 0; i < job->opts->nranks; i++)
        for (int k = 0; k < 2; k++)
            stream_drain_now(&job->ranks[i].streams[k]);
}

/* Once every rank has exited, the job ends when the pipes reach EOF; the
 * drain timer makes sure it ends even if some process still holds them. */
static void job_check_done(struct job *job)
{
    if (job->spawning || job->nrunning > 0 || job->nopen == 0)
        return;
    if (!uv_is_active((uv_handle_t *)&job->drain_timer))
        uv_timer_start(&job->drain_timer, drain_timer_cb, WEFTRUN_DRAIN_MS, 0);
}

static void alloc_cb(uv_handle_t *h, size_t suggested, uv_buf_t *buf)
{
    (void)h;
    (void)suggested;
    /* One buffer serves every pipe: read_cb consumes it before the next
     * read. */
    *buf = uv_buf_init(read_buf, sizeof(read_buf));
}

static void read_cb(uv_stream_t *stream, ssize_t nread, const uv_buf_t *buf)
{
    struct stream *s = stream->data;

    if (nread > 0)
        stream_feed(s, buf->base, (size_t)nread);
    else if (nread < 0) /* UV_EOF, or an error, which ends it just the same */
        stream_finish(s);
}

static void signal_running(struct job *job, int signum)
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
            msg("cannot send %s to rank %d (pid %d): %s", signal_name(signum),
                r->index, r->pid, uv_strerror(rc));
    }
}

static void stop_timer_cb(uv_timer_t *t)
{
    struct job *job = t->data;

    switch (job->phase) {
    case STOP_SEND:
        signal_running(job, job->stop_signal);
        job->phase = STOP_GRACE_OVER;
        uv_timer_start(t, stop_timer_cb, (uint64_t)job->opts->grace_ms, 0);
        break;
    case STOP_GRACE_OVER:
        if (job->nrunning > 0)
            msg("%d rank%s still running %d ms after %s; sending SIGKILL",
                job->nrunning, plural(job->nrunning), job->opts->grace_ms,
                signal_name(job->stop_signal));
        /* fall through */
    case STOP_KILL_NOW:
        signal_running(job, SIGKILL);
        job->phase = STOP_KILL_NOW;
        break;
    case STOP_NONE:
        break;
    }
}

/* Stops every running rank: signum now, SIGKILL after the grace period.
 * The signals are sent from a timer callback, never from exit_cb: libuv
 * reaps all exited children before it calls their exit_cbs, so only there
 * is "not yet exited" sure to mean "pid still ours". */
static void job_stop(struct job *job, int signum)
{
    if (job->phase != STOP_NONE)
        return;
    job->phase = STOP_SEND;
    job->stop_signal = signum;
    uv_timer_start(&job->stop_timer, stop_timer_cb, 0, 0);
}

static void job_kill_now(struct job *job)
{
    job->phase = STOP_KILL_NOW;
    uv_timer_start(&job->stop_timer, stop_timer_cb, 0, 0);
}

/* "host NAME, " for messages about a rank of a --hostfile job. */
static const char *host_label(const struct rank *r)
{
    static char buf[200];

    if (r->host == NULL)
        return "";
    snprintf(buf, sizeof buf, "host %s, ", r->host);
    return buf;
}

static void exit_cb(uv_process_t *proc, int64_t exit_status, int term_signal)
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
                host_label(r), r->pid, term_signal, signal_name(term_signal));
            job_set_exit(job, 128 + term_signal);
        } else {
            msg("rank %d (%spid %d) exited with code %d", r->index,
                host_label(r), r->pid,
                (int)exit_status);
            job_set_exit(job, exit_status >= 1 && exit_status <= 125
                                  ? (int)exit_status
                                  : 1);
        }
        job_stop(job, SIGTERM);
    } else if ((exit_status != 0 && term_signal == 0) ||
               (term_signal != 0 && job->phase == STOP_SEND)) {
        /* Failed on its own: reaped before weftrun signalled anyone, or
         * ended with an exit code (weftrun's signals end ranks by signal).
         * It may well be the root cause: a rank that dies can be reaped
         * after the peers that saw it die, and libuv reports a batch of
         * exits in no particular order. */
        if (term_signal != 0)
            msg("rank %d (%spid %d) was also killed by signal %d (%s)",
                r->index, host_label(r), r->pid, term_signal, signal_name(term_signal));
        else
            msg("rank %d (%spid %d) also exited with code %d", r->index,
                host_label(r), r->pid,
                (int)exit_status);
    }
    job_check_done(job);
}

static void signal_cb(uv_signal_t *h, int signum)
{
    struct job *job = h->data;

    job->nsignals++;
    if (job->nrunning == 0 && !job->spawning) {
        /* Only output is left to copy: stop waiting for it. */
        job_set_exit(job, 128 + signum);
        drain_timer_cb(&job->drain_timer);
        return;
    }
    if (job->phase == STOP_NONE) {
        msg("received %s; forwarding it to %d running rank%s",
            signal_name(signum), job->nrunning, plural(job->nrunning));
        job_set_exit(job, 128 + signum);
        job_stop(job, signum);
    } else if (job->phase != STOP_KILL_NOW) {
        msg("received %s while stopping the ranks; sending SIGKILL to %d "
            "running rank%s",
            signal_name(signum), job->nrunning, plural(job->nrunning));
        job_kill_now(job);
    }
}

static void close_walk_cb(uv_handle_t *h, void *arg)
{
    (void)arg;
    if (!uv_is_closing(h))
        uv_close(h, NULL);
}

static int stream_start(struct stream *s)
{
    int rc = uv_read_start((uv_stream_t *)&s->pipe, alloc_cb, read_cb);

    if (rc != 0) {
        msg("cannot read the output of rank %d: %s", s->rank->index,
            uv_strerror(rc));
        return -1;
    }
    s->open = 1;
    s->rank->job->nopen++;
    return 0;
}

/* Starts rank i. Returns 0, or -1 after saying why (and setting the exit
 * status). */
static int is_local_host(const weft__host *h)
{
    char me[256];

    if (strcmp(h->ssh, "localhost") == 0 || strcmp(h->ssh, "127.0.0.1") == 0)
        return 1;
    return gethostname(me, sizeof me) == 0 && strcmp(h->ssh, me) == 0;
}

/* Appends s to *buf as one single-quoted shell word. */
static int shell_quote(char **buf, size_t *len, size_t *cap, const char *s)
{
    size_t need = *len + 4 * strlen(s) + 4;

    if (need > *cap) {
        char *nb = realloc(*buf, need * 2);
        if (nb == NULL)
            return -1;
        *buf = nb;
        *cap = need * 2;
    }
    (*buf)[(*len)++] = ' ';
    (*buf)[(*len)++] = '\'';
    for (; *s != '\0'; s++) {
        if (*s == '\'') {
            memcpy(*buf + *len, "'\\''", 4);
            *len += 4;
        } else {
            (*buf)[(*len)++] = *s;
        }
    }
    (*buf)[(*len)++] = '\'';
    (*buf)[*len] = '\0';
    return 0;
}

static void argv_free(char **argv)
{
    for (char **a = argv; a != NULL && *a != NULL; a++)
        free(*a);
    free(argv);
}

/* The command that starts rank i of a --hostfile job on its host:
 * - with --launch-cmd: its words ({host} replaced by the host's name),
 *   then PROGRAM ARGS; the rank's environment passes through it;
 * - a host that is this one: PROGRAM ARGS, as for -n;
 * - else: ssh HOST 'cd DIR && exec env VARS PROGRAM ARGS', carrying the
 *   WEFT_ variables, -x variables and the job token.
 * *out is NULL when PROGRAM ARGS are spawned as they are. */
static int remote_argv(const struct opts *o, const weft__hostfile_out *hf,
                       int i, const struct rank_env *env, char ***out)
{
    const weft__host *h = &hf->hosts[hf->rank_host[i]];
    size_t nprog = 0, n = 0;
    char **argv = NULL;

    *out = NULL;
    while (o->prog_argv[nprog] != NULL)
        nprog++;
    if (o->launch_cmd != NULL) {
        char *words = NULL, *save = NULL;
        size_t len = 0, cap = 0;
        /* {host} -> the host's name, then split on blanks. */
        for (const char *p = o->launch_cmd; *p != '\0';) {
            const char *add = p;
            size_t addlen = 1;
            if (strncmp(p, "{host}", 6) == 0) {
                add = h->name;
                addlen = strlen(h->name);
                p += 6;
            } else {
                p++;
            }
            if (len + addlen + 1 > cap) {
                char *nw = realloc(words, (len + addlen + 1) * 2);
                if (nw == NULL)
                    goto oom;
                words = nw;
                cap = (len + addlen + 1) * 2;
            }
            memcpy(words + len, add, addlen);
            len += addlen;
            words[len] = '\0';
        }
        argv = calloc(len / 2 + 2 + nprog, sizeof *argv);
        if (argv == NULL) {
            free(words);
            goto oom;
        }
        for (char *w = strtok_r(words, " \t", &save); w != NULL;
             w = strtok_r(NULL, " \t", &save))
            if ((argv[n++] = strdup(w)) == NULL) {
                free(words);
                goto oom;
            }
        free(words);
        if (n == 0) {
            msg("--launch-cmd: empty command");
            argv_free(argv);
            return -1;
        }
    } else if (is_local_host(h)) {
        return 0;
    } else {
        char cwd[4096], *cmd = NULL;
        size_t len = 0, cap = 0;

        argv = calloc(6, sizeof *argv);
        if (argv == NULL || getcwd(cwd, sizeof cwd) == NULL)
            goto oom;
        cap = 256;
        if ((cmd = malloc(cap)) == NULL)
            goto oom;
        len = (size_t)snprintf(cmd, cap, "cd");
        if (shell_quote(&cmd, &len, &cap, cwd) != 0)
            goto oom_cmd;
        if (len + 16 > cap && (cmd = realloc(cmd, cap = len + 64)) == NULL)
            goto oom;
        len += (size_t)snprintf(cmd + len, cap - len, " && exec env");
        /* The rank's own variables: weftrun's and -x ones, not the whole
         * local environment. */
        if (g_hf_text != NULL) {
            char *v = NULL;
            if (asprintf(&v, "WEFT_HOSTFILE_TEXT=%s", g_hf_text) < 0)
                goto oom_cmd;
            if (shell_quote(&cmd, &len, &cap, v) != 0) {
                free(v);
                goto oom_cmd;
            }
            free(v);
        }
        for (char **e = env->envp; *e != NULL; e++) {
            /* The remote host reads the hostfile from the text above. */
            int ours = strncmp(*e, "WEFT_", 5) == 0 &&
                       strncmp(*e, "WEFT_HOSTFILE=", 14) != 0;
            for (int x = 0; !ours && x < o->nxvars; x++)
                ours = strncmp(*e, o->xvars[x],
                               env_name_len(o->xvars[x])) == 0 &&
                       (*e)[env_name_len(o->xvars[x])] == '=';
            if (ours && shell_quote(&cmd, &len, &cap, *e) != 0)
                goto oom_cmd;
        }
        for (size_t k = 0; k < nprog; k++)
            if (shell_quote(&cmd, &len, &cap, o->prog_argv[k]) != 0)
                goto oom_cmd;
        const char *ssh = getenv("WEFTRUN_SSH");
        if ((argv[n++] = strdup(ssh != NULL && *ssh != '\0' ? ssh : "ssh")) ==
                NULL ||
            (argv[n++] = strdup("-o")) == NULL ||
            (argv[n++] = strdup("BatchMode=yes")) == NULL ||
            (argv[n++] = strdup(h->ssh)) == NULL) {
            free(cmd);
            goto oom;
        }
        argv[n++] = cmd;
        *out = argv;
        return 0;
    oom_cmd:
        free(cmd);
        goto oom;
    }
    for (size_t k = 0; k < nprog; k++)
        if ((argv[n++] = strdup(o->prog_argv[k])) == NULL)
            goto oom;
    *out = argv;
    return 0;
oom:
    msg("out of memory");
    argv_free(argv);
    return -1;
}

static int spawn_rank(struct job *job, struct rank_env *env, int i,
                      int stdin_ok)
{
    const struct opts *o = job->opts;
    struct rank *r = &job->ranks[i];
    uv_stdio_container_t stdio[3];
    uv_process_options_t po;
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
            job_set_exit(job, 1);
            return -1;
        }
        s->pipe.data = s;
    }

    /* Rank 0 reads weftrun's stdin, as under mpirun; the others read
     * /dev/null. */
    stdio[0].flags = i == 0 && stdin_ok ? UV_INHERIT_FD : UV_IGNORE;
    stdio[0].data.fd = 0;
    stdio[1].flags = UV_CREATE_PIPE | UV_WRITABLE_PIPE;
    stdio[1].data.stream = (uv_stream_t *)&r->streams[0].pipe;
    stdio[2].flags = UV_CREATE_PIPE | UV_WRITABLE_PIPE;
    stdio[2].data.stream = (uv_stream_t *)&r->streams[1].pipe;

    rank_env_set_rank(env, i, o->nranks);
    memset(&po, 0, sizeof(po));
    po.exit_cb = exit_cb;
    if (g_hf != NULL) {
        r->host = g_hf->hosts[g_hf->rank_host[i]].name;
        if (remote_argv(o, g_hf, i, env, &r->argv) != 0) {
            job_set_exit(job, 1);
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
        job_set_exit(job, EXIT_NOSTART);
        return -1;
    }
    r->started = 1;
    r->pid = r->proc.pid;
    job->nrunning++;
    for (int k = 0; k < 2; k++) {
        if (stream_start(&r->streams[k]) != 0) {
            job_set_exit(job, 1);
            return -1;
        }
    }
    return 0;
}

static const int forwarded_signals[3] = {SIGINT, SIGTERM, SIGHUP};

/* Runs the job to the end. Returns weftrun's exit status. */
static int job_run(struct job *job, const struct opts *o, struct rank_env *env)
{
    int stdin_ok = fcntl(0, F_GETFD) != -1;
    int rc;

    /* A signal that came during the setup stops the job before it starts. */
    uv_run(&job->loop, UV_RUN_NOWAIT);
    for (int i = 0; i < o->nranks && job->phase == STOP_NONE; i++) {
        if (spawn_rank(job, env, i, stdin_ok) != 0) {
            job_stop(job, SIGTERM);
            break;
        }
        /* Serve what has happened so far (a rank that failed already, a
         * signal, output), so a large job does not wait for all spawns. */
        uv_run(&job->loop, UV_RUN_NOWAIT);
        if (job->phase != STOP_NONE)
            break;
    }
    job->spawning = 0;
    job_check_done(job);

    uv_run(&job->loop, UV_RUN_DEFAULT);

    /* Close every handle (timers, signals, pipes, processes) and let the
     * close callbacks run, so the loop closes cleanly. */
    uv_walk(&job->loop, close_walk_cb, NULL);
    uv_run(&job->loop, UV_RUN_DEFAULT);
    rc = uv_loop_close(&job->loop);
    if (rc != 0) {
        msg("internal error: the event loop did not close: %s",
            uv_strerror(rc));
        job_set_exit(job, 1);
    }
    for (int i = 0; i < o->nranks; i++)
        for (int k = 0; k < 2; k++)
            free(job->ranks[i].streams[k].line);
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
    uv_timer_init(&job->loop, &job->stop_timer);
    uv_timer_init(&job->loop, &job->drain_timer);
    job->stop_timer.data = job;
    job->drain_timer.data = job;
    /* Timers and signal handlers never keep the loop alive by themselves:
     * it runs while a rank runs or a pipe is open. */
    uv_unref((uv_handle_t *)&job->stop_timer);
    uv_unref((uv_handle_t *)&job->drain_timer);
    for (int i = 0; i < 3; i++) {
        int signum = forwarded_signals[i];
        struct sigaction old;

        uv_signal_init(&job->loop, &job->sigs[i]);
        job->sigs[i].data = job;
        uv_unref((uv_handle_t *)&job->sigs[i]);
        /* A signal ignored when weftrun started (nohup, a background job of
         * a non-interactive shell) stays ignored. */
        if (sigaction(signum, NULL, &old) == 0 && old.sa_handler == SIG_IGN)
            continue;
        rc = uv_signal_start(&job->sigs[i], signal_cb, signum);
        if (rc != 0)
            msg("warning: cannot handle %s: %s", signal_name(signum),
                uv_strerror(rc));
    }
    return 0;
}

/* Closes the loop of a job that never ran. */
static void job_abandon(struct job *job)
{
    uv_walk(&job->loop, close_walk_cb, NULL);
    uv_run(&job->loop, UV_RUN_DEFAULT);
    (void)uv_loop_close(&job->loop);
}

int main(int argc, char **argv)
{
    static struct job job; /* large (output buffer); one per process */
    struct opts o;
    struct tmpfiles tmp = {NULL, NULL};
    struct rank_env env = {NULL, 0, NULL, NULL, NULL};
    char token[33];
    int *ports = NULL;
    int rc;
    sigset_t set;

    /* With fd 0, 1 or 2 closed, the first pipe or socket would take its
     * place and rank output would go there. */
    for (int fd = 0; fd <= 2; fd++)
        if (fcntl(fd, F_GETFD) == -1 && errno == EBADF &&
            open("/dev/null", fd == 0 ? O_RDONLY : O_WRONLY) != fd)
            return 1;

    rc = parse_args(argc, argv, &o);
    if (rc != 0 || (o.prog_argv == NULL && !o.check)) {
        free(o.xvars);
        return rc;
    }
    if (o.hostfile != NULL) {
        static weft__hostfile_out hf;
        char err[1024];

        /* Read once (a regular file only, so a FIFO cannot block us):
         * the text checked here is the text the ranks on other hosts get
         * in WEFT_HOSTFILE_TEXT. */
        rc = weft__hostfile_read(o.hostfile, &g_hf_text, err, sizeof err);
        if (rc == 0)
            rc = weft__hostfile_load_text(o.hostfile, g_hf_text, -1, &hf, err,
                                          sizeof err);
        if (rc != 0) {
            msg("%s", err);
            free(g_hf_text);
            free(o.xvars);
            return EXIT_USAGE;
        }
        g_hf = &hf;
        if (o.check) {
            /* Describe the job as the options would run it. */
            if (o.transport != NULL)
                snprintf(hf.transport, sizeof hf.transport, "%s",
                         o.transport);
            if (o.topology != NULL) {
                char why[512];
                if (strcmp(o.topology, "mesh") == 0 &&
                    weft__hostfile_check_mesh(&hf, o.hostfile, why,
                                              sizeof why) != 0) {
                    msg("--topology mesh: %s", why);
                    weft__hostfile_free(&hf);
                    free(g_hf_text);
                    free(o.xvars);
                    return EXIT_USAGE;
                }
                snprintf(hf.topology, sizeof hf.topology, "%s", o.topology);
            }
            rc = weft__hostfile_describe(&hf, o.wires > 0 ? o.wires : 1,
                                         stdout) == 0 &&
                         fflush(stdout) == 0
                     ? 0
                     : 1;
            weft__hostfile_free(&hf);
            free(g_hf_text);
            free(o.xvars);
            return rc;
        }
        if (o.nranks != 0 && o.nranks != hf.nranks) {
            msg("-n %d disagrees with %s, whose hosts hold %d ranks", o.nranks,
                o.hostfile, hf.nranks);
            weft__hostfile_free(&hf);
            free(g_hf_text);
            free(o.xvars);
            return EXIT_USAGE;
        }
        o.nranks = hf.nranks;
    }

    /* weftrun reports a closed stdout itself (EPIPE); the ranks get the
     * default SIGPIPE back, since libuv resets dispositions in children. */
    signal(SIGPIPE, SIG_IGN);
    sigemptyset(&set);
    for (int i = 0; i < 3; i++)
        sigaddset(&set, forwarded_signals[i]);
    sigaddset(&set, SIGCHLD);
    sigprocmask(SIG_UNBLOCK, &set, NULL);

    if (job_init(&job, &o) != 0) {
        free(o.xvars);
        return 1;
    }
    rc = 1;
    ports = calloc((size_t)o.nranks, sizeof(*ports));
    job.ranks = calloc((size_t)o.nranks, sizeof(*job.ranks));
    if (ports == NULL || job.ranks == NULL) {
        msg("out of memory");
        goto fail;
    }
    if (g_hf != NULL) {
        /* The ranks read the job's own hostfile: on other hosts it must be
         * at the same path (a shared or copied file). */
        char *abs = realpath(o.hostfile, NULL);
        if (abs == NULL) {
            msg("%s: %s", o.hostfile, strerror(errno));
            goto fail;
        }
        if (ensure_fd_limit(o.nranks) != 0 || make_job_token(token) != 0 ||
            rank_env_build(&env, &o, abs, token) != 0) {
            free(abs);
            goto fail;
        }
        free(abs);
    } else if (ensure_fd_limit(o.nranks) != 0 ||
               make_job_token(token) != 0 ||
               pick_ports(o.nranks, ports) != 0 ||
               tmpfiles_create(&tmp) != 0 ||
               write_hostfile(tmp.file, o.nranks, ports) != 0 ||
               rank_env_build(&env, &o, tmp.file, token) != 0) {
        goto fail;
    }

    rc = job_run(&job, &o, &env);
    goto out;

fail:
    job_abandon(&job);
out:
    tmpfiles_remove(&tmp);
    rank_env_free(&env);
    for (int i = 0; job.ranks != NULL && i < o.nranks; i++)
        argv_free(job.ranks[i].argv);
    if (g_hf != NULL)
        weft__hostfile_free(g_hf);
    free(g_hf_text);
    free(job.ranks);
    free(ports);
    free(o.xvars);
    return rc;
}
