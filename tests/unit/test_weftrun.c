/*
 * Tests of the weftrun launcher. They run the built binary (path in the
 * environment variable WEFTRUN, default ./weftrun) with `sh -c` scripts as
 * the rank programs, so they need no libweft.
 *
 * No test depends on timing luck: where a test needs the ranks to be in a
 * given state (running, ignoring SIGTERM) before something happens, the
 * ranks say so through files in the test's own directory and the test waits
 * for those files. Time limits are only checked against sleeps of 60 s.
 */
#define _GNU_SOURCE

#include <criterion/criterion.h>
#include <jansson.h>

#include "../fifo.h"

#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

struct run {
    char dir[64]; /* the test's private directory */
    pid_t pid;    /* weftrun's pid while it runs */
    int status;   /* wait status */
    double secs;  /* how long weftrun ran */
    char *out;    /* its stdout */
    char *err;    /* its stderr */
    int out_fd;   /* if >= 0, weftrun's stdout instead of a file */
};

static const char *weftrun_path(void)
{
    const char *p = getenv("WEFTRUN");

    return p != NULL && p[0] != '\0' ? p : "./weftrun";
}

static double now_secs(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static char *slurp(const char *path)
{
    FILE *f = fopen(path, "rb");
    char *buf = NULL;
    size_t len = 0, cap = 0;

    if (f == NULL)
        return NULL;
    for (;;) {
        size_t n;

        if (cap - len < 4096) {
            cap = cap == 0 ? 8192 : cap * 2;
            buf = realloc(buf, cap);
            cr_assert_not_null(buf);
        }
        n = fread(buf + len, 1, cap - len - 1, f);
        len += n;
        if (n == 0)
            break;
    }
    fclose(f);
    buf[len] = '\0';
    return buf;
}

static char *path_in(const struct run *r, const char *name)
{
    char *p;

    cr_assert_geq(asprintf(&p, "%s/%s", r->dir, name), 0);
    return p;
}

static void run_init(struct run *r)
{
    memset(r, 0, sizeof(*r));
    r->out_fd = -1;
    strcpy(r->dir, "/tmp/test_weftrun.XXXXXX");
    cr_assert_not_null(mkdtemp(r->dir), "mkdtemp: %s", strerror(errno));
}

static int rm_cb(const char *path, const struct stat *st, int flag,
                 struct FTW *ftw)
{
    (void)st;
    (void)flag;
    (void)ftw;
    remove(path);
    return 0;
}

static void run_fini(struct run *r)
{
    nftw(r->dir, rm_cb, 16, FTW_DEPTH | FTW_PHYS);
    free(r->out);
    free(r->err);
}

/* Starts weftrun with args (NULL-terminated, without argv[0]); its stdout
 * and stderr go to files in r->dir, its stdin is /dev/null. */
static void run_start(struct run *r, const char *const *args)
{
    char *out = path_in(r, "weftrun.out");
    char *err = path_in(r, "weftrun.err");
    const char *argv[64];
    int n = 0;

    argv[n++] = weftrun_path();
    for (; *args != NULL; args++) {
        cr_assert_lt(n, 62);
        argv[n++] = *args;
    }
    argv[n] = NULL;

    r->secs = now_secs();
    r->pid = fork();
    cr_assert_geq(r->pid, 0, "fork: %s", strerror(errno));
    if (r->pid == 0) {
        sigset_t none;
        int fd0 = open("/dev/null", O_RDONLY);
        int fd1 = open(out, O_WRONLY | O_CREAT | O_TRUNC, 0600);
        int fd2 = open(err, O_WRONLY | O_CREAT | O_TRUNC, 0600);
        int sigs[] = {SIGINT, SIGTERM, SIGHUP, SIGPIPE, SIGQUIT, SIGCHLD};

        if (r->out_fd >= 0)
            fd1 = r->out_fd;
        if (fd0 < 0 || fd1 < 0 || fd2 < 0 || dup2(fd0, 0) < 0 ||
            dup2(fd1, 1) < 0 || dup2(fd2, 2) < 0)
            _exit(120);
        /* weftrun leaves signals alone that it finds ignored; give it the
         * defaults whatever the test runner had. */
        for (size_t i = 0; i < sizeof(sigs) / sizeof(sigs[0]); i++)
            signal(sigs[i], SIG_DFL);
        sigemptyset(&none);
        sigprocmask(SIG_SETMASK, &none, NULL);
        execv(argv[0], (char *const *)argv);
        _exit(121);
    }
    free(out);
    free(err);
}

/* Reads weftrun's stdout and stderr once it has exited. */
static void run_collect(struct run *r)
{
    char *out = path_in(r, "weftrun.out");
    char *err = path_in(r, "weftrun.err");

    r->secs = now_secs() - r->secs;
    r->out = slurp(out);
    r->err = slurp(err);
    cr_assert_not_null(r->out);
    cr_assert_not_null(r->err);
    free(out);
    free(err);
}

static void run_wait(struct run *r)
{
    pid_t p;

    do
        p = waitpid(r->pid, &r->status, 0);
    while (p < 0 && errno == EINTR);
    cr_assert_eq(p, r->pid, "waitpid: %s", strerror(errno));
    run_collect(r);
}

static void run_weftrun(struct run *r, const char *const *args)
{
    run_start(r, args);
    run_wait(r);
}

/* As run_weftrun, for a weftrun that must end by itself within limit_secs:
 * one still running then is killed and the test fails saying so, instead
 * of waiting on whatever blocks it. */
static void run_weftrun_within(struct run *r, const char *const *args,
                               double limit_secs)
{
    double t0 = now_secs();
    pid_t p;

    run_start(r, args);
    while ((p = waitpid(r->pid, &r->status, WNOHANG)) != r->pid) {
        cr_assert(p == 0 || errno == EINTR, "waitpid: %s", strerror(errno));
        if (now_secs() - t0 > limit_secs) {
            kill(r->pid, SIGKILL);
            waitpid(r->pid, &r->status, 0);
            cr_assert_fail("weftrun %s %s ... still ran after %.0f s "
                           "(killed it)",
                           args[0], args[1] ? args[1] : "", limit_secs);
        }
        usleep(10000);
    }
    run_collect(r);
}

static int exit_code(const struct run *r)
{
    cr_assert(WIFEXITED(r->status),
              "weftrun did not exit normally (status 0x%x); stderr:\n%s",
              r->status, r->err ? r->err : "");
    return WEXITSTATUS(r->status);
}

static void expect_exit(const struct run *r, int code)
{
    cr_assert_eq(exit_code(r), code,
                 "weftrun exited %d, expected %d\nstdout:\n%s\nstderr:\n%s",
                 exit_code(r), code, r->out, r->err);
}

static void expect_in(const char *hay, const char *needle, const char *what)
{
    cr_assert_not_null(strstr(hay, needle), "%s lacks \"%s\":\n%s", what,
                       needle, hay);
}

/* Waits until the file exists and is not empty (a rank wrote it). */
static void wait_for_file(const struct run *r, const char *name)
{
    char *p = path_in(r, name);
    struct stat st;
    double t0 = now_secs();

    while (stat(p, &st) != 0 || st.st_size == 0) {
        cr_assert_lt(now_secs() - t0, 20.0, "%s never appeared", p);
        usleep(10000);
    }
    free(p);
}

static long read_pid(const struct run *r, const char *name)
{
    char *p = path_in(r, name);
    char *s = slurp(p);
    long pid;

    cr_assert_not_null(s, "%s is missing", p);
    pid = strtol(s, NULL, 10);
    cr_assert_gt(pid, 1, "bad pid in %s: %s", p, s);
    free(s);
    free(p);
    return pid;
}

static void expect_gone(long pid)
{
    int rc = kill((pid_t)pid, 0);

    cr_assert(rc != 0 && errno == ESRCH, "rank process %ld is still there",
              pid);
}

/* A process that is not a rank's own (its parent died first) is reaped by
 * init, whenever init gets to it: a zombie counts as gone, and it has a few
 * seconds to become one. */
static void expect_gone_soon(long pid)
{
    double t0 = now_secs();

    for (;;) {
        char path[64], buf[256], *p;
        FILE *f;

        if (kill((pid_t)pid, 0) != 0 && errno == ESRCH)
            return;
        snprintf(path, sizeof path, "/proc/%ld/stat", pid);
        f = fopen(path, "r");
        if (f != NULL) {
            size_t n = fread(buf, 1, sizeof buf - 1, f);
            fclose(f);
            buf[n] = '\0';
            p = strrchr(buf, ')');
            if (p != NULL && p[1] == ' ' && p[2] == 'Z')
                return;
        }
        cr_assert_lt(now_secs() - t0, 5.0, "process %ld is still running", pid);
        usleep(20000);
    }
}

/* A rank script prelude: writes the rank's pid to $0/pid.$WEFT_RANK in one
 * step, so a reader never sees half a file. */
#define WRITE_PID                                                              \
    "echo $$ > \"$0/tmp.$WEFT_RANK\" && "                                      \
    "mv \"$0/tmp.$WEFT_RANK\" \"$0/pid.$WEFT_RANK\"; "

/* -------------------------------------------------------------------- */

static int is_token(const char *s)
{
    if (strlen(s) != 32)
        return 0;
    for (; *s; s++)
        if (!((*s >= '0' && *s <= '9') || (*s >= 'a' && *s <= 'f')))
            return 0;
    return 1;
}

static void check_hostfile(const char *path, int nranks)
{
    json_error_t jerr;
    json_t *root = json_load_file(path, 0, &jerr);
    json_t *hosts, *host, *ports;

    cr_assert_not_null(root, "%s: %s", path, jerr.text);
    cr_assert(json_is_object(root));
    cr_assert_eq(json_object_size(root), 3, "keys: port, hosts, links");
    hosts = json_object_get(root, "hosts");
    cr_assert(json_is_array(hosts) && json_array_size(hosts) == 1);
    host = json_array_get(hosts, 0);
    cr_assert(json_is_object(host));
    cr_assert_str_eq(json_string_value(json_object_get(host, "name")),
                     "localhost");
    cr_assert(json_is_integer(json_object_get(host, "ranks")));
    cr_assert_eq(json_integer_value(json_object_get(host, "ranks")), nranks);
    ports = json_object_get(host, "ports");
    cr_assert(json_is_array(ports));
    cr_assert_eq(json_array_size(ports), (size_t)nranks);
    for (int i = 0; i < nranks; i++) {
        json_t *p = json_array_get(ports, (size_t)i);

        cr_assert(json_is_integer(p));
        cr_assert(json_integer_value(p) > 0 && json_integer_value(p) < 65536);
        for (int j = 0; j < i; j++)
            cr_assert_neq(json_integer_value(p),
                          json_integer_value(json_array_get(ports, (size_t)j)),
                          "ports %d and %d are the same", i, j);
    }
    cr_assert(json_is_integer(json_object_get(root, "port")));
    cr_assert_eq(json_integer_value(json_object_get(root, "port")),
                 json_integer_value(json_array_get(ports, 0)));
    cr_assert(json_is_array(json_object_get(root, "links")));
    cr_assert_eq(json_array_size(json_object_get(root, "links")), 0);
    json_decref(root);
}

Test(weftrun, all_ranks_succeed, .timeout = 30)
{
    enum { N = 4 };
    struct run r;
    char token[N][64], hostfile[N][512];
    int seen[N] = {0};
    char *line, *save;

    unsetenv("WEFT_TIMEOUT_MS");
    run_init(&r);
    run_weftrun(&r, (const char *const[]){
                        "-n", "4", "--", "sh", "-c",
                        "printf 'env %s %s %s %s %s %s %s\\n' \"$WEFT_RANK\" "
                        "\"$WEFT_SIZE\" \"$WEFT_LOCAL_RANK\" "
                        "\"$WEFT_LOCAL_SIZE\" \"$WEFT_JOB_TOKEN\" "
                        "\"${WEFT_TIMEOUT_MS-none}\" \"$WEFT_HOSTFILE\"; "
                        "cp \"$WEFT_HOSTFILE\" \"$0/hf.$WEFT_RANK\"",
                        r.dir, NULL});
    expect_exit(&r, 0);
    cr_assert_str_eq(r.err, "", "stderr should be empty:\n%s", r.err);

    for (line = strtok_r(r.out, "\n", &save); line != NULL;
         line = strtok_r(NULL, "\n", &save)) {
        int pr, rank, size, lrank, lsize, n = 0;
        char tok[64], timeout[32], hf[512];

        cr_assert_eq(sscanf(line, "[rank %d] env %d %d %d %d %63s %31s %511s%n",
                            &pr, &rank, &size, &lrank, &lsize, tok, timeout, hf,
                            &n),
                     8, "bad line: %s", line);
        cr_assert_eq((size_t)n, strlen(line), "bad line: %s", line);
        cr_assert(pr >= 0 && pr < N, "bad line: %s", line);
        cr_assert_eq(rank, pr, "prefix and WEFT_RANK differ: %s", line);
        cr_assert_eq(lrank, pr, "WEFT_LOCAL_RANK: %s", line);
        cr_assert_eq(size, N, "WEFT_SIZE: %s", line);
        cr_assert_eq(lsize, N, "WEFT_LOCAL_SIZE: %s", line);
        cr_assert(is_token(tok), "WEFT_JOB_TOKEN is not 32 hex digits: %s",
                  tok);
        cr_assert_str_eq(timeout, "none", "WEFT_TIMEOUT_MS set unasked");
        cr_assert_eq(hf[0], '/', "WEFT_HOSTFILE not absolute: %s", hf);
        cr_assert_eq(seen[pr], 0, "rank %d printed twice", pr);
        seen[pr] = 1;
        strcpy(token[pr], tok);
        strcpy(hostfile[pr], hf);
    }
    for (int i = 0; i < N; i++) {
        cr_assert(seen[i], "no output from rank %d:\n%s", i, r.out);
        cr_assert_str_eq(token[i], token[0], "ranks got different tokens");
        cr_assert_str_eq(hostfile[i], hostfile[0]);
    }
    for (int i = 0; i < N; i++) {
        char name[16];
        char *copy;
        struct stat st;

        snprintf(name, sizeof(name), "hf.%d", i);
        copy = path_in(&r, name);
        check_hostfile(copy, N);
        free(copy);
        /* The hostfile and its directory are gone once weftrun exits. */
        cr_assert(stat(hostfile[i], &st) != 0 && errno == ENOENT,
                  "%s left behind", hostfile[i]);
        *strrchr(hostfile[i], '/') = '\0';
        cr_assert(stat(hostfile[i], &st) != 0 && errno == ENOENT,
                  "%s left behind", hostfile[i]);
    }
    run_fini(&r);
}

Test(weftrun, failed_rank_stops_the_others, .timeout = 30)
{
    struct run r;
    char *hf_copy, *hf;
    struct stat st;

    run_init(&r);
    /* Rank 1 fails once ranks 0 and 2 are asleep. */
    run_weftrun(&r,
                (const char *const[]){
                    "-n", "3", "sh", "-c",
                    "if [ \"$WEFT_RANK\" = 1 ]; then "
                    "  echo \"$WEFT_HOSTFILE\" > \"$0/hostfile\"; "
                    "  while [ ! -e \"$0/pid.0\" ] || [ ! -e \"$0/pid.2\" ]; "
                    "  do sleep 0.05; done; "
                    "  exit 3; "
                    "fi; " WRITE_PID "exec sleep 60",
                    r.dir, NULL});
    expect_exit(&r, 3);
    cr_assert_lt(r.secs, 20.0, "weftrun took %.1f s", r.secs);
    expect_in(r.err, "rank 1 (pid ", "stderr");
    expect_in(r.err, "exited with code 3", "stderr");
    /* The ranks stopped by weftrun are not reported as the cause. */
    cr_assert_null(strstr(r.err, "rank 0 (pid"), "%s", r.err);
    cr_assert_null(strstr(r.err, "rank 2 (pid"), "%s", r.err);
    expect_gone(read_pid(&r, "pid.0"));
    expect_gone(read_pid(&r, "pid.2"));

    hf_copy = path_in(&r, "hostfile");
    hf = slurp(hf_copy);
    cr_assert_not_null(hf);
    *strchr(hf, '\n') = '\0';
    cr_assert(stat(hf, &st) != 0 && errno == ENOENT, "%s left behind", hf);
    free(hf);
    free(hf_copy);
    run_fini(&r);
}

/* --keep-going: rank 1 exits 3 and rank 3 is killed while ranks 0 and 2
 * run on, each to its own end (they wait until both failed, then write a
 * file); weftrun names both failures, exits with the first one's status,
 * and stops nobody. */
Test(weftrun, keep_going_names_every_failure_and_stops_nobody, .timeout = 30)
{
    struct run r;
    char *p0, *p2;

    run_init(&r);
    run_weftrun(&r, (const char *const[]){
                        "-n", "4", "--keep-going", "sh", "-c",
                        "case \"$WEFT_RANK\" in "
                        "1) exit 3 ;; "
                        "3) while [ ! -e \"$0/one.gone\" ]; do sleep 0.05; "
                        "   done; kill -KILL $$ ;; "
                        "0) sleep 0.3; touch \"$0/one.gone\" ;; esac; "
                        "sleep 1; echo ran-to-end; "
                        "touch \"$0/done.$WEFT_RANK\"",
                        r.dir, NULL});
    expect_exit(&r, 3);
    expect_in(r.err, "rank 1 (pid ", "stderr");
    expect_in(r.err, "exited with code 3; the others go on", "stderr");
    expect_in(r.err, "rank 3 (pid ", "stderr");
    expect_in(r.err, "signal 9 (SIGKILL); the others go on", "stderr");
    expect_in(r.err, "2 of 4 ranks failed", "stderr");
    p0 = path_in(&r, "done.0");
    p2 = path_in(&r, "done.2");
    cr_assert_eq(access(p0, F_OK), 0, "rank 0 did not run to its end");
    cr_assert_eq(access(p2, F_OK), 0, "rank 2 did not run to its end");
    free(p0);
    free(p2);
    run_fini(&r);
}

/* --keep-going where every rank succeeds: exit 0, nothing said. */
Test(weftrun, keep_going_all_succeed, .timeout = 30)
{
    struct run r;

    run_init(&r);
    run_weftrun(&r,
                (const char *const[]){"-n", "3", "--keep-going", "true", NULL});
    expect_exit(&r, 0);
    cr_assert_null(strstr(r.err, "failed"), "%s", r.err);
    run_fini(&r);
}

Test(weftrun, children_of_a_wrapper_rank_are_stopped, .timeout = 30)
{
    struct run r;

    run_init(&r);
    /* Rank 0 is a shell that started a child (as a wrapper script would);
     * rank 1 fails once the child runs. The child must go too. */
    run_weftrun(&r,
                (const char *const[]){
                    "-n", "2", "--grace-ms", "300", "sh", "-c",
                    "if [ \"$WEFT_RANK\" = 1 ]; then "
                    "  while [ ! -e \"$0/pid.child\" ]; do sleep 0.05; done; "
                    "  exit 3; "
                    "fi; "
                    "sleep 60 & echo $! > \"$0/pid.child.tmp\"; "
                    "mv \"$0/pid.child.tmp\" \"$0/pid.child\"; wait",
                    r.dir, NULL});
    expect_exit(&r, 3);
    expect_gone_soon(read_pid(&r, "pid.child"));
    run_fini(&r);
}

Test(weftrun, rank_killed_by_signal, .timeout = 30)
{
    struct run r;

    run_init(&r);
    run_weftrun(&r, (const char *const[]){
                        "-n", "2", "sh", "-c",
                        "if [ \"$WEFT_RANK\" = 1 ]; then kill -KILL $$; fi; "
                        "exec sleep 60",
                        NULL});
    expect_exit(&r, 128 + 9);
    cr_assert_lt(r.secs, 20.0, "weftrun took %.1f s", r.secs);
    expect_in(r.err, "rank 1 (pid ", "stderr");
    expect_in(r.err, "signal 9 (SIGKILL)", "stderr");
    run_fini(&r);
}

Test(weftrun, exit_codes_above_125_become_1, .timeout = 30)
{
    struct run r;

    run_init(&r);
    run_weftrun(&r,
                (const char *const[]){"-n", "1", "sh", "-c", "exit 200", NULL});
    expect_exit(&r, 1);
    expect_in(r.err, "rank 0 (pid ", "stderr");
    expect_in(r.err, "exited with code 200", "stderr");
    run_fini(&r);
}

Test(weftrun, rank_ignoring_sigterm_is_killed_after_grace, .timeout = 30)
{
    struct run r;

    run_init(&r);
    run_weftrun(&r, (const char *const[]){
                        "-n", "2", "--grace-ms", "300", "sh", "-c",
                        "if [ \"$WEFT_RANK\" = 1 ]; then "
                        "  while [ ! -e \"$0/pid.0\" ]; do sleep 0.05; done; "
                        "  exit 5; "
                        "fi; "
                        "trap '' TERM; " WRITE_PID "exec sleep 60",
                        r.dir, NULL});
    expect_exit(&r, 5);
    cr_assert_geq(r.secs, 0.3, "no grace period (%.3f s)", r.secs);
    cr_assert_lt(r.secs, 20.0, "weftrun took %.1f s", r.secs);
    expect_in(r.err, "rank 1 (pid ", "stderr");
    expect_in(r.err, "exited with code 5", "stderr");
    expect_in(r.err, "still running 300 ms after SIGTERM; sending SIGKILL",
              "stderr");
    expect_gone(read_pid(&r, "pid.0"));
    run_fini(&r);
}

Test(weftrun, program_not_found, .timeout = 30)
{
    struct run r;

    run_init(&r);
    run_weftrun(&r, (const char *const[]){
                        "-n", "2", "/nonexistent/weftrun-test-prog", NULL});
    expect_exit(&r, 127);
    expect_in(r.err, "/nonexistent/weftrun-test-prog", "stderr");
    run_fini(&r);

    /* Looked up in PATH. */
    run_init(&r);
    run_weftrun(&r, (const char *const[]){"-n", "2", "--",
                                          "weftrun-no-such-program-xyz", NULL});
    expect_exit(&r, 127);
    expect_in(r.err, "weftrun-no-such-program-xyz", "stderr");
    run_fini(&r);
}

Test(weftrun, bad_flags_exit_2, .timeout = 30)
{
    static const char *const cases[][8] = {
        {"--bogus", "-n", "2", "true", NULL},
        {"-n", "0", "true", NULL},
        {"-n", "4097", "true", NULL},
        {"-n", "abc", "true", NULL},
        {"-n", NULL},
        {"true", NULL},
        {"-n", "2", NULL},
        {"-n", "2", "--", NULL},
        {"-n", "2", "--timeout-ms", "0", "true", NULL},
        {"-n", "2", "--timeout-ms", "-5", "true", NULL},
        {"-n", "2", "--timeout-ms", "12x", "true", NULL},
        {"-n", "2", "--wires", "0", "true", NULL},
        {"-n", "2", "--grace-ms", "-1", "true", NULL},
        {"-n", "2", "--transport", "udp", "true", NULL},
        {"-n", "2", "--topology", "star", "true", NULL},
        {"-n", "2", "-x", "=oops", "true", NULL},
        {"-n", "2", "-x", NULL},
        {"-n", "2", "--version=yes", "true", NULL},
        {"--check=", NULL},
    };

    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        struct run r;

        run_init(&r);
        run_weftrun(&r, cases[i]);
        cr_assert_eq(exit_code(&r), 2, "case %zu (%s %s ...) exited %d", i,
                     cases[i][0], cases[i][1] ? cases[i][1] : "",
                     exit_code(&r));
        expect_in(r.err, "Usage:", "stderr");
        cr_assert_str_eq(r.out, "", "usage errors print nothing on stdout");
        run_fini(&r);
    }
}

Test(weftrun, multihost_flag_errors, .timeout = 30)
{
    static const struct {
        const char *args[8];
        const char *says;
    } cases[] = {
        {{"--hostfile", "/nonexistent/hosts.json", "true", NULL},
         "/nonexistent/hosts.json"},
        {{"--launch-cmd", "ip netns exec {host}", "-n", "2", "true", NULL},
         "needs --hostfile"},
        {{"--check", NULL}, "needs --hostfile"},
    };

    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        struct run r;

        run_init(&r);
        run_weftrun(&r, cases[i].args);
        expect_exit(&r, 2);
        expect_in(r.err, cases[i].says, "stderr");
        run_fini(&r);
    }
}

Test(weftrun, help_and_version, .timeout = 30)
{
    struct run r;

    run_init(&r);
    run_weftrun(&r, (const char *const[]){"--help", NULL});
    expect_exit(&r, 0);
    expect_in(r.out, "Usage: weftrun -n N", "stdout");
    expect_in(r.out, "--grace-ms", "stdout");
    expect_in(r.out, "--check [FILE]", "stdout");
    run_fini(&r);

    run_init(&r);
    run_weftrun(&r, (const char *const[]){"-h", NULL});
    expect_exit(&r, 0);
    expect_in(r.out, "Usage:", "stdout");
    run_fini(&r);

    run_init(&r);
    run_weftrun(&r, (const char *const[]){"--version", NULL});
    expect_exit(&r, 0);
    expect_in(r.out, "weftrun", "stdout");
    run_fini(&r);
}

Test(weftrun, env_forwarding_and_options, .timeout = 30)
{
    struct run r;

    setenv("WEFTRUN_TEST_FWD", "forwarded value", 1);
    setenv("WEFTRUN_TEST_OVR", "old", 1);
    unsetenv("WEFTRUN_TEST_UNSET");
    run_init(&r);
    run_weftrun(&r,
                (const char *const[]){
                    "-np",
                    "2",
                    "-x",
                    "WEFTRUN_TEST_FWD",
                    "-x",
                    "WEFTRUN_TEST_SET=a=b c",
                    "-x",
                    "WEFTRUN_TEST_OVR=new",
                    "-x",
                    "WEFTRUN_TEST_UNSET",
                    "--timeout-ms",
                    "1234",
                    "--wires=3",
                    "--transport",
                    "tcp",
                    "--topology",
                    "ring",
                    "--",
                    "sh",
                    "-c",
                    "printf '%s|%s|%s|%s|%s|%s|%s|%s\\n' \"$WEFTRUN_TEST_FWD\" "
                    "\"$WEFTRUN_TEST_SET\" \"$WEFTRUN_TEST_OVR\" "
                    "\"${WEFTRUN_TEST_UNSET-unset}\" \"$WEFT_TIMEOUT_MS\" "
                    "\"$WEFT_WIRES\" \"$WEFT_TRANSPORT\" \"$WEFT_TOPOLOGY\"",
                    NULL});
    expect_exit(&r, 0);
    expect_in(r.out,
              "[rank 0] forwarded value|a=b c|new|unset|1234|3|tcp|ring\n",
              "stdout");
    expect_in(r.out,
              "[rank 1] forwarded value|a=b c|new|unset|1234|3|tcp|ring\n",
              "stdout");
    expect_in(r.err, "WEFTRUN_TEST_UNSET", "stderr (warning)");
    run_fini(&r);
}

Test(weftrun, sigterm_is_forwarded, .timeout = 30)
{
    struct run r;

    run_init(&r);
    run_start(&r,
              (const char *const[]){"-n", "3", "sh", "-c",
                                    WRITE_PID "exec sleep 60", r.dir, NULL});
    wait_for_file(&r, "pid.0");
    wait_for_file(&r, "pid.1");
    wait_for_file(&r, "pid.2");
    cr_assert_eq(kill(r.pid, SIGTERM), 0);
    run_wait(&r);
    expect_exit(&r, 128 + SIGTERM);
    cr_assert_lt(r.secs, 20.0, "weftrun took %.1f s", r.secs);
    expect_in(r.err, "SIGTERM", "stderr");
    for (int i = 0; i < 3; i++) {
        char name[16];

        snprintf(name, sizeof(name), "pid.%d", i);
        expect_gone(read_pid(&r, name));
    }
    run_fini(&r);
}

Test(weftrun, second_sigint_kills, .timeout = 30)
{
    struct run r;
    char *errpath;

    run_init(&r);
    /* The ranks ignore SIGINT and SIGTERM; the grace period is longer than
     * the test, so only the second SIGINT can end them. */
    run_start(&r,
              (const char *const[]){
                  "-n", "2", "--grace-ms", "600000", "sh", "-c",
                  "trap '' INT TERM; " WRITE_PID "exec sleep 60", r.dir, NULL});
    wait_for_file(&r, "pid.0");
    wait_for_file(&r, "pid.1");
    cr_assert_eq(kill(r.pid, SIGINT), 0);
    /* Signals do not queue: wait until weftrun has seen the first. */
    errpath = path_in(&r, "weftrun.err");
    for (double t0 = now_secs();;) {
        char *e = slurp(errpath);
        int seen = e != NULL && strstr(e, "received SIGINT") != NULL;

        free(e);
        if (seen)
            break;
        cr_assert_lt(now_secs() - t0, 20.0, "weftrun never saw SIGINT");
        usleep(10000);
    }
    free(errpath);
    cr_assert_eq(kill(r.pid, SIGINT), 0);
    run_wait(&r);
    expect_exit(&r, 128 + SIGINT);
    cr_assert_lt(r.secs, 20.0, "weftrun took %.1f s", r.secs);
    expect_gone(read_pid(&r, "pid.0"));
    expect_gone(read_pid(&r, "pid.1"));
    run_fini(&r);
}

Test(weftrun, partial_last_line_is_printed, .timeout = 30)
{
    struct run r;

    run_init(&r);
    run_weftrun(&r, (const char *const[]){
                        "-n", "1", "sh", "-c",
                        "printf abc; printf 'def\\n'; printf 'err tail' >&2; "
                        "printf 'no newline'",
                        NULL});
    expect_exit(&r, 0);
    cr_assert_str_eq(r.out, "[rank 0] abcdef\n[rank 0] no newline\n");
    cr_assert_str_eq(r.err, "[rank 0] err tail\n");
    run_fini(&r);
}

Test(weftrun, lines_never_interleave, .timeout = 30)
{
    enum { N = 4, LINES = 500 };
    struct run r;
    char pad[301];
    int next[N] = {0};
    char *line, *save;

    memset(pad, 'x', 300);
    pad[300] = '\0';
    run_init(&r);
    run_weftrun(&r, (const char *const[]){
                        "-n", "4", "sh", "-c",
                        "i=0; while [ $i -lt 500 ]; do "
                        "echo \"$WEFT_RANK $i $0\"; "
                        "echo \"$WEFT_RANK $i $0\" >&2; i=$((i+1)); done",
                        pad, NULL});
    expect_exit(&r, 0);
    for (int stream = 0; stream < 2; stream++) {
        memset(next, 0, sizeof(next));
        for (line = strtok_r(stream ? r.err : r.out, "\n", &save); line != NULL;
             line = strtok_r(NULL, "\n", &save)) {
            int pr, rank, i, n = 0;

            cr_assert_eq(sscanf(line, "[rank %d] %d %d %n", &pr, &rank, &i, &n),
                         3, "bad line: %.80s", line);
            cr_assert(pr >= 0 && pr < N && rank == pr, "bad line: %.80s", line);
            cr_assert_eq(i, next[pr], "rank %d: line %d came as %d", pr,
                         next[pr], i);
            cr_assert_str_eq(line + n, pad, "line cut or mixed: %.80s", line);
            next[pr]++;
        }
        for (int k = 0; k < N; k++)
            cr_assert_eq(next[k], LINES, "rank %d: %d lines", k, next[k]);
    }
    run_fini(&r);
}

Test(weftrun, closed_stdout_stops_the_job, .timeout = 30)
{
    struct run r;
    int fds[2];

    run_init(&r);
    /* weftrun's stdout is a pipe nobody reads: its first write fails with
     * EPIPE, as under `weftrun ... | head -1` once head has exited. */
    cr_assert_eq(pipe(fds), 0);
    close(fds[0]);
    r.out_fd = fds[1];
    run_start(&r, (const char *const[]){"-n", "2", "sh", "-c",
                                        WRITE_PID "exec yes", r.dir, NULL});
    close(fds[1]);
    run_wait(&r);
    expect_exit(&r, 128 + SIGPIPE);
    cr_assert_lt(r.secs, 20.0, "weftrun took %.1f s", r.secs);
    expect_in(r.err, "stdout was closed", "stderr");
    /* A rank may have been stopped before it wrote its pid. */
    for (int i = 0; i < 2; i++) {
        char name[16];
        char *p;

        snprintf(name, sizeof(name), "pid.%d", i);
        p = path_in(&r, name);
        if (access(p, F_OK) == 0)
            expect_gone(read_pid(&r, name));
        free(p);
    }
    run_fini(&r);
}

/* --check says which topology a job would run with, --topology included,
 * and refuses a mesh over a hostfile that is not one. */
Test(weftrun, check_says_the_topology, .timeout = 30)
{
    const char *fx = getenv("WEFT_FIXTURES");
    char mesh3[1024], ring4[1024];
    struct run r;

    cr_assert_not_null(fx, "set WEFT_FIXTURES (make check does)");
    snprintf(mesh3, sizeof mesh3, "%s/good-mesh3.json", fx);
    snprintf(ring4, sizeof ring4, "%s/good-ring4x2.json", fx);
    {
        const char *args[] = {"--check", "--hostfile", mesh3, NULL};
        run_init(&r);
        run_weftrun(&r, args);
        expect_exit(&r, 0);
        expect_in(r.out, "topology in effect: mesh (asked for)", "stdout");
        run_fini(&r);
    }
    {
        const char *args[] = {"--check",    "--topology", "auto",
                              "--hostfile", mesh3,        NULL};
        run_init(&r);
        run_weftrun(&r, args);
        expect_exit(&r, 0);
        expect_in(r.out,
                  "topology in effect: mesh (auto: every pair of the 3 "
                  "hosts shares a link)",
                  "stdout");
        run_fini(&r);
    }
    {
        const char *args[] = {"--check",    "--topology", "ring",
                              "--hostfile", mesh3,        NULL};
        run_init(&r);
        run_weftrun(&r, args);
        expect_exit(&r, 0);
        expect_in(r.out, "topology in effect: ring (asked for)", "stdout");
        run_fini(&r);
    }
    {
        const char *args[] = {"--check",    "--topology", "mesh",
                              "--hostfile", ring4,        NULL};
        run_init(&r);
        run_weftrun(&r, args);
        expect_exit(&r, 2);
        expect_in(r.err, "\"m1\" and \"m3\"", "stderr");
        run_fini(&r);
    }
}

/* The fixture's path, from WEFT_FIXTURES. */
static void fixture(char *buf, size_t len, const char *name)
{
    const char *fx = getenv("WEFT_FIXTURES");

    cr_assert_not_null(fx, "set WEFT_FIXTURES (make check does)");
    snprintf(buf, len, "%s/%s", fx, name);
}

/* A hostfile that is a FIFO, a directory or a device is refused at once,
 * by --check and by a job: weftrun blocked forever opening a FIFO that no
 * one writes. */
static void expect_not_regular(const char *path)
{
    const char *const forms[][5] = {
        {"--hostfile", path, "--check", NULL},
        {"--hostfile", path, "true", NULL},
    };

    for (size_t i = 0; i < sizeof forms / sizeof forms[0]; i++) {
        struct run r;

        run_init(&r);
        run_weftrun_within(&r, forms[i], 10);
        expect_exit(&r, 2);
        expect_in(r.err, path, "stderr");
        expect_in(r.err, "not a regular file", "stderr");
        run_fini(&r);
    }
}

Test(weftrun, hostfile_fifo_refused, .timeout = 30)
{
    with_fifo("hosts.json", expect_not_regular);
}

Test(weftrun, hostfile_directory_or_device_refused, .timeout = 30)
{
    char dir[1024];

    fixture(dir, sizeof dir, ".");
    expect_not_regular(dir);
    expect_not_regular("/dev/zero");
}

/* --check FILE names the hostfile itself (API.md: --check [FILE]); --check
 * without one takes --hostfile FILE, given before or after it. An argument
 * after --check that starts with '-' is the next option, not a file. */
Test(weftrun, check_takes_a_file, .timeout = 30)
{
    char mesh3[1024], same[1100], attached[1100];

    fixture(mesh3, sizeof mesh3, "good-mesh3.json");
    fixture(same, sizeof same, "../hostfiles/good-mesh3.json");
    snprintf(attached, sizeof attached, "--check=%s", mesh3);
    const char *const cases[][7] = {
        {"--check", mesh3, NULL},
        {attached, NULL},
        {"--check", "--hostfile", mesh3, NULL},
        {"--hostfile", mesh3, "--check", NULL},
        {"--check", mesh3, "--hostfile", mesh3, NULL},
        {"--hostfile", mesh3, "--check", same, NULL},
        {"--check", mesh3, "--wires", "2", NULL},
        {"--check", "--wires", "2", "--hostfile", mesh3, NULL},
        {"--wires", "2", "--hostfile", mesh3, "--check", NULL},
    };

    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        struct run r;

        run_init(&r);
        run_weftrun_within(&r, cases[i], 10);
        cr_assert_eq(
            exit_code(&r), 0, "case %zu (%s %s ...) exited %d\nstderr:\n%s", i,
            cases[i][0], cases[i][1] ? cases[i][1] : "", exit_code(&r), r.err);
        expect_in(r.out, "3 hosts, 6 ranks, 3 links", "stdout");
        if (i >= 6)
            expect_in(r.out, "2 wires on each", "stdout");
        run_fini(&r);
    }
}

/* --check A --hostfile B with different files, a --check FILE that cannot
 * be read, and --check with neither are errors that say what is wrong. */
Test(weftrun, check_file_errors, .timeout = 30)
{
    char mesh3[1024], ring4[1024];

    fixture(mesh3, sizeof mesh3, "good-mesh3.json");
    fixture(ring4, sizeof ring4, "good-ring4x2.json");
    const struct {
        const char *args[6];
        const char *says[3];
    } cases[] = {
        {{"--check", mesh3, "--hostfile", ring4, NULL},
         {"different", "good-mesh3.json", "good-ring4x2.json"}},
        {{"--hostfile", ring4, "--check", mesh3, NULL},
         {"different", "good-mesh3.json", "good-ring4x2.json"}},
        {{"--check", "/nonexistent/hosts.json", NULL},
         {"/nonexistent/hosts.json", "cannot open", NULL}},
        {{"--check", "--wires", "2", NULL}, {"needs --hostfile", NULL}},
        /* After "--" comes PROGRAM, which --check ignores: no file. */
        {{"--check", "--", mesh3, NULL}, {"needs --hostfile", NULL}},
    };

    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        struct run r;

        run_init(&r);
        run_weftrun_within(&r, cases[i].args, 10);
        expect_exit(&r, 2);
        for (size_t k = 0; k < 3 && cases[i].says[k] != NULL; k++)
            expect_in(r.err, cases[i].says[k], "stderr");
        cr_assert_str_eq(r.out, "", "case %zu printed on stdout", i);
        run_fini(&r);
    }
}

/* A --launch-cmd of no words starts no rank: weftrun says so and exits 1,
 * for an empty one (which crashed weftrun) as for one of blanks. */
Test(weftrun, launch_cmd_without_words, .timeout = 30)
{
    static const char *const cmds[] = {"", " \t "};
    char two[1024];

    fixture(two, sizeof two, "good-2hosts-3links.json");
    for (size_t i = 0; i < sizeof cmds / sizeof cmds[0]; i++) {
        struct run r;

        run_init(&r);
        run_weftrun_within(&r,
                           (const char *const[]){"--hostfile", two,
                                                 "--launch-cmd", cmds[i],
                                                 "true", NULL},
                           10);
        expect_exit(&r, 1);
        expect_in(r.err, "--launch-cmd: empty command", "stderr");
        cr_assert_str_eq(r.out, "", "case %zu printed on stdout", i);
        run_fini(&r);
    }
}

/* --help or --version after --check prints only the help or the version:
 * weftrun used to go on and describe the hostfile too, or with no file run
 * a job of no ranks. */
Test(weftrun, help_after_check_runs_nothing, .timeout = 30)
{
    char mesh3[1024];

    fixture(mesh3, sizeof mesh3, "good-mesh3.json");
    const struct {
        const char *args[6];
        const char *says;
    } cases[] = {
        {{"--check", mesh3, "--help", NULL}, "Usage:"},
        {{"--hostfile", mesh3, "--check", "--help", NULL}, "Usage:"},
        {{"--check", "--help", NULL}, "Usage:"},
        {{"--check", mesh3, "--version", NULL}, "weftrun (weft)"},
    };

    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        struct run r;

        run_init(&r);
        run_weftrun_within(&r, cases[i].args, 10);
        expect_exit(&r, 0);
        expect_in(r.out, cases[i].says, "stdout");
        cr_assert_null(strstr(r.out, "3 hosts"),
                       "case %zu described the hostfile:\n%s", i, r.out);
        cr_assert_str_eq(r.err, "", "case %zu wrote on stderr", i);
        run_fini(&r);
    }
}

/* -------------------------------------------------------------------- */
/* torchrun's variables, so that torch.distributed's env:// init runs
 * under weftrun unchanged. */

/* A rank script that prints them: "T RANK WORLD_SIZE LOCAL_RANK
 * LOCAL_WORLD_SIZE MASTER_ADDR MASTER_PORT", "unset" for one not set. */
#define TORCH_VARS                                                             \
    "printf 'T %s %s %s %s %s %s\\n' \"${RANK-unset}\" "                       \
    "\"${WORLD_SIZE-unset}\" \"${LOCAL_RANK-unset}\" "                         \
    "\"${LOCAL_WORLD_SIZE-unset}\" \"${MASTER_ADDR-unset}\" "                  \
    "\"${MASTER_PORT-unset}\""

struct torch_vars {
    int rank, world_size, local_rank, local_world_size, master_port;
    char master_addr[128];
};

/* Reads the TORCH_VARS line of each of the n ranks of r (n <= 16) from
 * weftrun's stdout into v[rank], by the line's "[rank N]" prefix. */
static void torch_vars_parse(const struct run *r, int n, struct torch_vars *v)
{
    char *out = strdup(r->out);
    char *line, *save;
    int seen[16] = {0};

    cr_assert_not_null(out);
    cr_assert_leq(n, 16);
    for (line = strtok_r(out, "\n", &save); line != NULL;
         line = strtok_r(NULL, "\n", &save)) {
        struct torch_vars t;
        int pr, len = 0;

        cr_assert_eq(sscanf(line, "[rank %d] T %d %d %d %d %127s %d%n", &pr,
                            &t.rank, &t.world_size, &t.local_rank,
                            &t.local_world_size, t.master_addr, &t.master_port,
                            &len),
                     7, "bad line (a variable unset?): %s", line);
        cr_assert_eq((size_t)len, strlen(line), "bad line: %s", line);
        cr_assert(pr >= 0 && pr < n && !seen[pr], "bad line: %s", line);
        seen[pr] = 1;
        v[pr] = t;
    }
    for (int i = 0; i < n; i++)
        cr_assert(seen[i], "no line from rank %d:\n%s", i, r->out);
    free(out);
}

/* -n 3: the numbers, MASTER_ADDR 127.0.0.1, and one MASTER_PORT in
 * [1024, 65535] that none of weft's ranks listens on; what weftrun's own
 * environment held for them does not count, and -x cannot change RANK. */
Test(weftrun, torchrun_variables, .timeout = 30)
{
    enum { N = 3 };
    struct torch_vars v[N];
    struct run r;
    json_error_t jerr;
    json_t *root, *ports;
    char *hf;

    /* Left over from another job. */
    setenv("RANK", "99", 1);
    setenv("MASTER_ADDR", "stale.example", 1);
    setenv("MASTER_PORT", "1", 1);
    run_init(&r);
    run_weftrun_within(
        &r,
        (const char *const[]){"-n", "3", "-x", "RANK=7", "--", "sh", "-c",
                              "[ \"$WEFT_RANK\" != 0 ] || "
                              "cp \"$WEFT_HOSTFILE\" \"$0/hf\"; " TORCH_VARS,
                              r.dir, NULL},
        20);
    unsetenv("RANK");
    unsetenv("MASTER_ADDR");
    unsetenv("MASTER_PORT");
    expect_exit(&r, 0);
    expect_in(r.err, "-x RANK ignored: weftrun sets RANK itself", "stderr");
    torch_vars_parse(&r, N, v);
    for (int i = 0; i < N; i++) {
        cr_assert_eq(v[i].rank, i, "rank %d: RANK=%d", i, v[i].rank);
        cr_assert_eq(v[i].world_size, N, "rank %d: WORLD_SIZE", i);
        cr_assert_eq(v[i].local_rank, i, "rank %d: LOCAL_RANK", i);
        cr_assert_eq(v[i].local_world_size, N, "rank %d: LOCAL_WORLD_SIZE", i);
        cr_assert_str_eq(v[i].master_addr, "127.0.0.1", "rank %d", i);
        cr_assert(v[i].master_port >= 1024 && v[i].master_port <= 65535,
                  "rank %d: MASTER_PORT=%d", i, v[i].master_port);
        cr_assert_eq(v[i].master_port, v[0].master_port,
                     "ranks 0 and %d got different MASTER_PORTs", i);
    }
    hf = path_in(&r, "hf");
    root = json_load_file(hf, 0, &jerr);
    cr_assert_not_null(root, "%s: %s", hf, jerr.text);
    ports = json_object_get(json_array_get(json_object_get(root, "hosts"), 0),
                            "ports");
    cr_assert_eq(json_array_size(ports), (size_t)N);
    for (size_t i = 0; i < N; i++)
        cr_assert_neq(json_integer_value(json_array_get(ports, i)),
                      v[0].master_port, "MASTER_PORT is rank %zu's port", i);
    json_decref(root);
    free(hf);
    run_fini(&r);
}

/* MASTER_ADDR and MASTER_PORT are the two that -x may give: weftrun
 * cannot know every network. */
Test(weftrun, torchrun_master_from_x, .timeout = 30)
{
    struct torch_vars v[2];
    struct run r;

    setenv("MASTER_ADDR", "rank0.example", 1);
    run_init(&r);
    run_weftrun_within(&r,
                       (const char *const[]){"-n", "2", "-x", "MASTER_ADDR",
                                             "-x", "MASTER_PORT=29500", "--",
                                             "sh", "-c", TORCH_VARS, NULL},
                       20);
    unsetenv("MASTER_ADDR");
    expect_exit(&r, 0);
    cr_assert_str_eq(r.err, "", "stderr should be empty:\n%s", r.err);
    torch_vars_parse(&r, 2, v);
    for (int i = 0; i < 2; i++) {
        cr_assert_eq(v[i].rank, i);
        cr_assert_str_eq(v[i].master_addr, "rank0.example");
        cr_assert_eq(v[i].master_port, 29500);
    }
    run_fini(&r);
}

/* With a hostfile, each host's MASTER_ADDR is where it reaches rank 0's
 * host: 127.0.0.1 there, rank 0's host's end of their first shared link,
 * or (a host not linked to it) rank 0's host's end of its first link;
 * MASTER_PORT follows the ports of rank 0's host, skipping any rank's.
 * The ranks start through --launch-cmd, or over ssh (a stand-in that runs
 * the command here with only the variables weftrun carries over, which
 * are these and not WEFT_HOSTFILE). */
Test(weftrun, torchrun_variables_hostfile, .timeout = 60)
{
    static const struct {
        const char *file;
        int ssh; /* over (fake) ssh, else --launch-cmd */
        int n, master_port;
        const char *master_addr[8];
        int local_rank[8], local_world_size[8];
    } cases[] = {
        /* m1-m2 share links 0 and 2, m4-m1 link 3; m3 has none with m1. */
        {"good-ring4x2.json",
         0,
         4,
         40001,
         {"127.0.0.1", "169.254.1.1", "169.254.1.1", "169.254.7.2"},
         {0, 0, 0, 0},
         {1, 1, 1, 1}},
        /* Two ranks a host; a's ports 32323 and 32324. */
        {"good-mesh3.json",
         1,
         6,
         32325,
         {"127.0.0.1", "127.0.0.1", "10.0.1.1", "10.0.1.1", "10.0.3.2",
          "10.0.3.2"},
         {0, 1, 0, 1, 0, 1},
         {2, 2, 2, 2, 2, 2}},
        /* node4's third rank listens on 32325; addresses are host names. */
        {"good-mpirun.txt",
         0,
         7,
         32326,
         {"127.0.0.1", "127.0.0.1", "node1", "node1", "node1", "node1",
          "node1"},
         {0, 1, 0, 0, 0, 1, 2},
         {2, 2, 1, 1, 3, 3, 3}},
    };

    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        struct torch_vars v[8];
        char file[1024];
        char *ssh = NULL;
        struct run r;
        FILE *f;

        fixture(file, sizeof file, cases[c].file);
        run_init(&r);
        if (cases[c].ssh) {
            ssh = path_in(&r, "ssh");
            f = fopen(ssh, "w");
            cr_assert_not_null(f);
            fputs("#!/bin/sh\n"
                  "while [ \"$1\" = -o ]; do shift 2; done\n"
                  "shift\n"
                  "exec env -i PATH=\"$PATH\" sh -c \"$*\"\n",
                  f);
            cr_assert_eq(fclose(f), 0);
            cr_assert_eq(chmod(ssh, 0700), 0);
            setenv("WEFTRUN_SSH", ssh, 1);
            /* The ranks read the hostfile's text, not its path. */
            run_weftrun_within(
                &r,
                (const char *const[]){"--hostfile", file, "--", "sh", "-c",
                                      "[ -z \"${WEFT_HOSTFILE+set}\" ] && "
                                      "[ -n \"$WEFT_HOSTFILE_TEXT\" ] || "
                                      "exit 9; " TORCH_VARS,
                                      NULL},
                20);
            unsetenv("WEFTRUN_SSH");
        } else {
            run_weftrun_within(
                &r,
                (const char *const[]){"--hostfile", file, "--launch-cmd", "env",
                                      "--", "sh", "-c", TORCH_VARS, NULL},
                20);
        }
        expect_exit(&r, 0);
        torch_vars_parse(&r, cases[c].n, v);
        for (int i = 0; i < cases[c].n; i++) {
            cr_assert_eq(v[i].rank, i, "%s: rank %d", cases[c].file, i);
            cr_assert_eq(v[i].world_size, cases[c].n, "%s: rank %d",
                         cases[c].file, i);
            cr_assert_eq(v[i].local_rank, cases[c].local_rank[i],
                         "%s: rank %d: LOCAL_RANK=%d", cases[c].file, i,
                         v[i].local_rank);
            cr_assert_eq(v[i].local_world_size, cases[c].local_world_size[i],
                         "%s: rank %d: LOCAL_WORLD_SIZE=%d", cases[c].file, i,
                         v[i].local_world_size);
            cr_assert_str_eq(v[i].master_addr, cases[c].master_addr[i],
                             "%s: rank %d", cases[c].file, i);
            cr_assert_eq(v[i].master_port, cases[c].master_port,
                         "%s: rank %d: MASTER_PORT=%d", cases[c].file, i,
                         v[i].master_port);
        }
        free(ssh);
        run_fini(&r);
    }
}
