/*
 * weftrun running a real weft job (tests/mp/failprog): when one rank fails
 * mid-operation (exits, or is stopped), weftrun must stop every rank, exit
 * non-zero and name the rank that failed first and how.
 */
#include <criterion/criterion.h>

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* Runs `weftrun -n 3 --timeout-ms MS -- failprog MODE 1`; returns its exit
 * code (-1 if it did not exit normally), its stderr in err. */
static int launch_with(const char *opts, int timeout_ms, const char *mode,
                       char *err, size_t errlen, double *secs)
{
    const char *weftrun = getenv("WEFTRUN");
    const char *prog = getenv("WEFT_TEST_FAILPROG");
    char cmd[4096], errfile[] = "/tmp/weft-launch-XXXXXX";
    int fd, status;
    double t0;
    FILE *f;
    size_t n;

    cr_assert(weftrun != NULL && prog != NULL,
              "set WEFTRUN and WEFT_TEST_FAILPROG (make check does)");
    fd = mkstemp(errfile);
    cr_assert(fd >= 0);
    close(fd);
    /* timeout(1) is this test's own deadline; weftrun must end well before
     * it. --grace-ms is short so that a stopped rank is killed quickly. */
    snprintf(cmd, sizeof cmd,
             "timeout -s KILL 60 %s -n 3 %s --grace-ms 500 --timeout-ms %d -- "
             "%s %s 1 2>%s >/dev/null",
             weftrun, opts, timeout_ms, prog, mode, errfile);
    t0 = now_s();
    status = system(cmd);
    *secs = now_s() - t0;
    f = fopen(errfile, "r");
    n = f != NULL ? fread(err, 1, errlen - 1, f) : 0;
    err[n] = '\0';
    if (f != NULL)
        fclose(f);
    unlink(errfile);
    return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

static int launch(int timeout_ms, const char *mode, char *err, size_t errlen,
                  double *secs)
{
    return launch_with("", timeout_ms, mode, err, errlen, secs);
}

/* --print-config: rank 0's weft_init prints its settings and its tuning
 * table (weft_info), once; the job runs as without it. */
Test(launch, print_config, .timeout = 90)
{
    char err[16384];
    double secs;
    int code =
        launch_with("--print-config", 10000, "ok", err, sizeof err, &secs);
    const char *at = strstr(err, "[rank 0] weft: rank=0 ranks=3 ");

    cr_assert_eq(code, 0, "weftrun exited %d:\n%s", code, err);
    cr_assert_not_null(at, "no settings from rank 0:\n%s", err);
    cr_assert_not_null(strstr(err, "algo=all_reduce:"), "no table:\n%s", err);
    cr_assert_null(strstr(at + 14, "weft: rank="), "printed twice:\n%s", err);
    cr_assert_null(strstr(err, "[rank 1] weft: rank="),
                   "rank 1 printed too:\n%s", err);
}

Test(launch, all_ranks_succeed, .timeout = 90)
{
    char err[16384];
    double secs;
    int code = launch(10000, "ok", err, sizeof err, &secs);
    cr_assert_eq(code, 0, "weftrun exited %d:\n%s", code, err);
}

Test(launch, rank_exits_mid_operation, .timeout = 90)
{
    char err[16384];
    double secs;
    int code = launch(3000, "exit", err, sizeof err, &secs);

    /* Rank 1 exits 7 first; the survivors see WEFT_EPEER and exit 3, often
     * so soon that weftrun reaps them in the same batch as rank 1, in no
     * particular order. Either way weftrun exits with a failing rank's code
     * and names rank 1's exit. */
    cr_assert(code == 7 || code == 3, "weftrun exited %d:\n%s", code, err);
    cr_assert(strstr(err, "rank 1 (pid") != NULL &&
                  strstr(err, "exited with code 7") != NULL,
              "weftrun did not name rank 1 and code 7:\n%s", err);
    cr_assert(secs < 2 * 3.0 + 10, "took %.1f s", secs);
}

Test(launch, rank_stopped_mid_operation, .timeout = 90)
{
    char err[16384];
    double secs;
    int code = launch(2000, "stop", err, sizeof err, &secs);

    /* Rank 1 stops; ranks 0 and 2 time out and exit 3; weftrun stops the
     * stopped rank too (KILL after the grace period) and exits 3. */
    cr_assert_eq(code, 3, "weftrun exited %d:\n%s", code, err);
    cr_assert(strstr(err, "WEFT_ETIMEDOUT") != NULL ||
                  strstr(err, "WEFT_EPEER") != NULL,
              "no rank reported the failure:\n%s", err);
    cr_assert(strstr(err, "exited with code 3") != NULL,
              "weftrun did not name the failed rank:\n%s", err);
    cr_assert(secs >= 1.0, "ended after %.1f s, before the deadline", secs);
}

Test(launch, abort_from_second_thread, .timeout = 90)
{
    char err[16384];
    double secs;
    int code = launch(20000, "abort", err, sizeof err, &secs);

    cr_assert_eq(code, 0, "weftrun exited %d:\n%s", code, err);
    cr_assert(secs < 15, "took %.1f s: the abort did not wake the call", secs);
}
