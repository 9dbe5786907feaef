/*
 * weftrun's command line: the options, what each accepts, the help text.
 *
 * weftrun reads its options by hand rather than with getopt_long, because
 * it must stop at PROGRAM (whose own options are not weftrun's) and accept
 * mpirun's spellings (-np 4, -np4, -xVAR) beside its own. Every value is
 * checked here, before anything is started, so that a mistyped option is a
 * usage error (exit 2) and never a job that fails half-way.
 */
#define _GNU_SOURCE

#include "weftrun.h"

#include "weft.h" /* WEFT_VERSION_* for --version */

#include <limits.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <sys/stat.h>

#include "base/parse.h"

#define WEFTRUN_DEFAULT_GRACE_MS 3000

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
    OPT_PRINT_CONFIG,
    OPT_KEEP_GOING,
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
} args_table[] = {
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
    {"--print-config", OPT_PRINT_CONFIG, ARG_NONE},
    {"--keep-going", OPT_KEEP_GOING, ARG_NONE},
    {"-h", OPT_HELP, ARG_NONE},
    {"--help", OPT_HELP, ARG_NONE},
    {"--version", OPT_VERSION, ARG_NONE},
};

#define ARGS_NTABLE (sizeof(args_table) / sizeof(args_table[0]))

static void args_usage(FILE *f)
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
        "  --print-config     rank 0 prints, from weft_init, the settings and\n"
        "                     the tuning table in effect (weft_info)\n"
        "  --keep-going       a rank that fails does not stop the others;\n"
        "                     weftrun waits for all, names every failed rank\n"
        "                     and exits non-zero\n"
        "  --wires W          connections per peer on each link "
        "(WEFT_WIRES)\n"
        "  --transport T      tcp | ibverbs (WEFT_TRANSPORT)\n"
        "  --topology T       ring | mesh | auto (WEFT_TOPOLOGY)\n"
        "  --timeout-ms MS    default per-operation deadline of the ranks\n"
        "                     (WEFT_TIMEOUT_MS)\n"
        "  --grace-ms MS      time between SIGTERM and SIGKILL when stopping\n"
        "                     ranks (default 3000)\n"
        "  -x VAR[=VALUE]     set VAR for the ranks; without VALUE, forward\n"
        "                     weftrun's own VAR (repeatable); of the\n"
        "                     variables weftrun sets, only MASTER_ADDR and\n"
        "                     MASTER_PORT can be given this way\n"
        "  -h, --help         print this help and exit\n"
        "  --version          print the version and exit\n"
        "\n"
        "Exit status: 0 when every rank exited 0; the failed rank's code\n"
        "(1..125) or 128+signal when a rank failed; 128+signal when weftrun\n"
        "was stopped by a signal; 127 when PROGRAM could not be started;\n"
        "2 for a usage error; 1 otherwise.\n",
        f);
}

__attribute__((format(printf, 1, 2))) static void args_error(const char *fmt,
                                                             ...)
{
    va_list ap;

    fputs("weftrun: ", stderr);
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fputs("\n\n", stderr);
    args_usage(stderr);
}

static int args_is_digits(const char *s)
{
    if (*s == '\0')
        return 0;
    for (; *s != '\0'; s++)
        if (*s < '0' || *s > '9')
            return 0;
    return 1;
}

/* An option's number in [lo, hi]: digits only, so that what strtol would
 * also take ("+4", " 4", "-0") is refused as a value, not read as one. */
static int args_int(const char *s, long lo, long hi, int *out)
{
    long v;

    if (!args_is_digits(s) || weft__parse_long(s, lo, hi, &v) != 0)
        return -1;
    *out = (int)v;
    return 0;
}

static int args_valid_env_name(const char *s, size_t n)
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
static int args_find(const char *arg, const char **val)
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
    for (size_t i = 0; i < ARGS_NTABLE; i++)
        if (strlen(args_table[i].name) == n &&
            strncmp(args_table[i].name, arg, n) == 0)
            return (int)i;
    if (eq != NULL)
        return -1;
    /* Short forms with the value attached: -np4, -n4, -xVAR[=VALUE]. */
    if (strncmp(arg, "-np", 3) == 0 && args_is_digits(arg + 3)) {
        *val = arg + 3;
        return 1;
    }
    if (strncmp(arg, "-n", 2) == 0 && args_is_digits(arg + 2)) {
        *val = arg + 2;
        return 0;
    }
    if (strncmp(arg, "-x", 2) == 0 && arg[2] != '\0') {
        *val = arg + 2;
        for (size_t i = 0; i < ARGS_NTABLE; i++)
            if (args_table[i].id == OPT_X)
                return (int)i;
    }
    return -1;
}

/* Whether paths a and b name one file: the same string, or the same file
 * under two names (hosts.json and ./hosts.json). stat() opens nothing, so
 * it cannot block on a FIFO. */
static int args_same_file(const char *a, const char *b)
{
    struct stat sa, sb;

    if (strcmp(a, b) == 0)
        return 1;
    return stat(a, &sa) == 0 && stat(b, &sb) == 0 && sa.st_dev == sb.st_dev &&
           sa.st_ino == sb.st_ino;
}

/* Finds the value of option k, given as argv[*i] (arg): attached (*val
 * already set by args_find), or the next argument, which *i then steps
 * over. Returns 0, or EXIT_USAGE after a message. */
static int args_value(int argc, char **argv, int *i, int k, const char **val)
{
    const char *arg = argv[*i];

    if (args_table[k].has_arg == ARG_OPTIONAL) {
        /* "--check -x V" or "--check -- PROG" give no FILE; a file
         * named "-f" can still be given as --check=-f or --check ./-f.
         */
        if (*val == NULL && *i + 1 < argc && argv[*i + 1][0] != '-')
            *val = argv[++*i];
    } else if (args_table[k].has_arg == ARG_REQUIRED && *val == NULL) {
        if (*i + 1 >= argc) {
            args_error("option '%s' needs a value", arg);
            return EXIT_USAGE;
        }
        *val = argv[++*i];
    } else if (args_table[k].has_arg == ARG_NONE && *val != NULL) {
        args_error("option '%s' takes no value", args_table[k].name);
        return EXIT_USAGE;
    }
    return 0;
}

#define ARGS_STR_(x) #x
#define ARGS_STR(x) ARGS_STR_(x)

/* The options with a number: its range, where it goes, and what the usage
 * error says before "not 'VALUE'". */
static const struct {
    enum opt_id id;
    long lo, hi;
    size_t offset; /* of its int in struct opts */
    const char *expected;
} args_numbers[] = {
    {OPT_N, 1, WEFTRUN_MAX_RANKS, offsetof(struct opts, nranks),
     "-n: the number of ranks must be an integer from 1 to " ARGS_STR(
         WEFTRUN_MAX_RANKS)},
    {OPT_WIRES, 1, INT_MAX, offsetof(struct opts, wires),
     "--wires: expected a positive integer"},
    {OPT_TIMEOUT, 1, INT_MAX, offsetof(struct opts, timeout_ms),
     "--timeout-ms: expected a positive integer (milliseconds)"},
    {OPT_GRACE, 0, INT_MAX, offsetof(struct opts, grace_ms),
     "--grace-ms: expected a non-negative integer (milliseconds)"},
};

/* Records the number val of option id, if id is one of args_numbers.
 * Returns 1 when it is not, 0 when recorded, or EXIT_USAGE after a
 * message. */
static int args_number(struct opts *o, enum opt_id id, const char *val)
{
    for (size_t i = 0; i < sizeof args_numbers / sizeof args_numbers[0]; i++) {
        if (args_numbers[i].id != id)
            continue;
        if (args_int(val, args_numbers[i].lo, args_numbers[i].hi,
                     (int *)((char *)o + args_numbers[i].offset)) != 0) {
            args_error("%s, not '%s'", args_numbers[i].expected, val);
            return EXIT_USAGE;
        }
        return 0;
    }
    return 1;
}

/* Records option id with its value val (NULL for none). Returns -1 to go
 * on, or an exit status to exit with at once: 0 or 1 after --help or
 * --version (1 when stdout cannot be written), EXIT_USAGE after a
 * message. */
static int args_apply(struct opts *o, enum opt_id id, const char *val)
{
    int rc = args_number(o, id, val);

    if (rc != 1)
        return rc == 0 ? -1 : rc;
    switch (id) {
    case OPT_N:
    case OPT_WIRES:
    case OPT_TIMEOUT:
    case OPT_GRACE:
        break; /* args_number's */
    case OPT_TRANSPORT:
        if (strcmp(val, "tcp") != 0 && strcmp(val, "ibverbs") != 0) {
            args_error("--transport: expected tcp or ibverbs, not '%s'", val);
            return EXIT_USAGE;
        }
        o->transport = val;
        break;
    case OPT_TOPOLOGY:
        if (strcmp(val, "ring") != 0 && strcmp(val, "mesh") != 0 &&
            strcmp(val, "auto") != 0) {
            args_error("--topology: expected ring, mesh or auto, not "
                       "'%s'",
                       val);
            return EXIT_USAGE;
        }
        o->topology = val;
        break;
    case OPT_X:
        if (!args_valid_env_name(val, env_name_len(val))) {
            args_error("-x: expected VAR or VAR=VALUE with VAR a valid "
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
            args_error("--check: expected a hostfile, not an empty "
                       "name");
            return EXIT_USAGE;
        }
        o->check = 1;
        if (val != NULL)
            o->check_file = val;
        break;
    case OPT_PRINT_CONFIG:
        o->print_config = 1;
        break;
    case OPT_KEEP_GOING:
        o->keep_going = 1;
        break;
    case OPT_HELP:
        args_usage(stdout);
        return fflush(stdout) == 0 ? 0 : 1;
    case OPT_VERSION:
        printf("weftrun (weft) %d.%d.%d\n", WEFT_VERSION_MAJOR,
               WEFT_VERSION_MINOR, WEFT_VERSION_PATCH);
        return fflush(stdout) == 0 ? 0 : 1;
    }
    return -1;
}

/* The checks of the options together, once all are read; argv[i] is the
 * first argument after them (PROGRAM), if i < argc. Returns 0 or
 * EXIT_USAGE after a message. */
static int args_check(int argc, char **argv, int i, struct opts *o)
{
    if (o->check_file != NULL) {
        if (o->hostfile == NULL) {
            o->hostfile = o->check_file;
        } else if (!args_same_file(o->check_file, o->hostfile)) {
            args_error("--check %s and --hostfile %s name different files; "
                       "give the hostfile once",
                       o->check_file, o->hostfile);
            return EXIT_USAGE;
        }
    }
    if ((o->launch_cmd != NULL || o->check) && o->hostfile == NULL) {
        args_error("%s needs --hostfile FILE%s",
                   o->check ? "--check" : "--launch-cmd",
                   o->check ? " (or --check FILE)" : "");
        return EXIT_USAGE;
    }
    if (o->check)
        return 0; /* no program: nothing is started */
    if (o->nranks == 0 && o->hostfile == NULL) {
        args_error("-n N or --hostfile FILE is required");
        return EXIT_USAGE;
    }
    if (i >= argc) {
        args_error("no PROGRAM given");
        return EXIT_USAGE;
    }
    o->prog_argv = &argv[i];
    return 0;
}

int args_parse(int argc, char **argv, struct opts *o)
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
        int k, rc;

        if (strcmp(arg, "--") == 0) {
            i++;
            break;
        }
        if (arg[0] != '-' || arg[1] == '\0')
            break; /* PROGRAM */
        k = args_find(arg, &val);
        if (k < 0) {
            args_error("unknown option '%s'", arg);
            return EXIT_USAGE;
        }
        if (args_value(argc, argv, &i, k, &val) != 0)
            return EXIT_USAGE;
        i++;
        rc = args_apply(o, args_table[k].id, val);
        if (rc >= 0) {
            /* After --help or --version nothing is checked or run, whatever
             * came before: main would otherwise go on with a --check. */
            o->check = 0;
            return rc;
        }
    }
    return args_check(argc, argv, i, o);
}
