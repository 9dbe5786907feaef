/*
 * The shared-memory transport between ranks of one host, as a user sees
 * it: on by default and off with WEFT_SHM=0, a local peer that dies is
 * WEFT_EPEER at once (not at the deadline) whether this rank receives,
 * sends through a full ring or waits for a one-copy read, nothing is left
 * in /dev/shm after a crash, and where the kernel refuses cross-memory
 * reads the frames go through the ring with the same results; under
 * WEFT_TRANSPORT=ibverbs, a job of one host runs over shared memory
 * alone, needing no RDMA device.
 * (Every collective over shared memory is in test_collectives.)
 */
#define _GNU_SOURCE
#include <criterion/criterion.h>
#include <criterion/parameterized.h>
#include <dirent.h>
#include <errno.h>
#include <linux/capability.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <unistd.h>

#include "config.h"
#include "harness.h"
#include "weft.h"

#define TIMEOUT_MS 30000
/* A dead peer is noticed when its connection closes: well before the
 * deadline, whatever the load of the machine. */
#define PROMPT_MS 10000

/* Mappings of this process's shared segments (/proc/self/maps names a
 * memfd "/memfd:weft-shm (deleted)"). */
static int count_segments(void)
{
    FILE *f = fopen("/proc/self/maps", "r");
    char line[512];
    int n = 0;

    if (f == NULL)
        return -1;
    while (fgets(line, sizeof line, f) != NULL)
        if (strstr(line, "memfd:weft-shm") != NULL)
            n++;
    fclose(f);
    return n;
}

static int segments_rank(int rank, int nranks, void *arg)
{
    int expect = *(const int *)arg ? nranks - 1 : 0, fail = 0, rc;
    float v[1024];
    weft_comm *c;

    if (mp_init(&c, rank, nranks) != WEFT_OK)
        return 1;
    if (count_segments() != expect) {
        mp_log("%d shared segments mapped, expected %d", count_segments(),
               expect);
        fail = 1;
    }
    for (int i = 0; i < 1024; i++)
        v[i] = (float)(rank + i);
    rc = weft_all_reduce(c, v, v, 1024, WEFT_FLOAT32, WEFT_SUM);
    if (rc != WEFT_OK)
        fail |= mp_report_rc(c, "all_reduce", rc);
    for (int i = 0; rc == WEFT_OK && i < 1024; i++)
        if (v[i] != (float)(nranks * (nranks - 1) / 2 + nranks * i)) {
            mp_log("element %d is %g", i, (double)v[i]);
            fail = 1;
            break;
        }
    return weft_finalize(c) != WEFT_OK || fail;
}

static void run_segments(const char *shm, int on)
{
    struct mp_opts o = {.nranks = 4, .timeout_ms = TIMEOUT_MS};
    struct mp_result res;
    char buf[1024];

    if (shm != NULL)
        setenv("WEFT_SHM", shm, 1);
    cr_assert_eq(mp_run(&o, segments_rank, &on, &res), 0);
    cr_assert(mp_all_passed(&res), "%s", mp_describe(&res, buf, sizeof buf));
}

Test(shm, on_by_default)
{
    unsetenv("WEFT_SHM");
    run_segments(NULL, 1);
}

Test(shm, off_with_weft_shm_0)
{
    run_segments("0", 0);
}

/* Under ibverbs, ranks of one host talk through shared memory alone:
 * the transport opens no device (this host may have none) and weft_info
 * says so. Each checks an all_reduce of 4 MiB (one-copy reads where the
 * kernel allows them), an all_gather, a broadcast and a send/recv ring.
 * Where ibverbs is not built, weft_init is WEFT_ENOTSUP. */
static int ibverbs_rank(int rank, int nranks, void *arg)
{
    enum { N = 1 << 20, G = 1000 };
    weft_comm *c;
    int rc = mp_init(&c, rank, nranks), fail = 0, got = -1;
    float *v;
    int32_t g[8 * G], mine[G];
    const char *info;

    (void)arg;
#ifndef WEFT_HAVE_IBVERBS
    return rc != WEFT_ENOTSUP;
#endif
    if (rc != WEFT_OK)
        return 1;
    info = weft_info(c);
    if (info == NULL || strstr(info, "transport=ibverbs+shm ") == NULL) {
        mp_log("weft_info: %s", info != NULL ? info : "(null)");
        fail = 1;
    }
    if ((v = malloc(sizeof *v * N)) == NULL)
        return 1;
    for (int i = 0; i < N; i++)
        v[i] = (float)(rank + i % 13);
    rc = weft_all_reduce(c, v, v, N, WEFT_FLOAT32, WEFT_SUM);
    for (int i = 0; rc == WEFT_OK && i < N; i++)
        if (v[i] != (float)(nranks * (nranks - 1) / 2 + nranks * (i % 13))) {
            mp_log("all_reduce: element %d is %g", i, (double)v[i]);
            rc = WEFT_EINVAL;
        }
    free(v);
    for (int i = 0; rc == WEFT_OK && i < G; i++)
        mine[i] = rank * G + i;
    if (rc == WEFT_OK)
        rc = weft_all_gather(c, mine, g, G, WEFT_INT32);
    for (int i = 0; rc == WEFT_OK && i < nranks * G; i++)
        if (g[i] != i) {
            mp_log("all_gather: element %d is %d", i, (int)g[i]);
            rc = WEFT_EINVAL;
        }
    for (int i = 0; rc == WEFT_OK && i < G; i++)
        mine[i] = rank == 1 ? 7 * i : -1;
    if (rc == WEFT_OK)
        rc = weft_broadcast(c, mine, G, WEFT_INT32, 1);
    for (int i = 0; rc == WEFT_OK && i < G; i++)
        if (mine[i] != 7 * i) {
            mp_log("broadcast: element %d is %d", i, (int)mine[i]);
            rc = WEFT_EINVAL;
        }
    if (rc == WEFT_OK)
        rc = weft_sendrecv(c, &rank, (rank + 1) % nranks, &got,
                           (rank + nranks - 1) % nranks, 1, WEFT_INT32);
    if (rc == WEFT_OK && got != (rank + nranks - 1) % nranks) {
        mp_log("sendrecv: got %d", got);
        rc = WEFT_EINVAL;
    }
    if (rc != WEFT_OK)
        fail |= mp_report_rc(c, "a collective under ibverbs", rc);
    return weft_finalize(c) != WEFT_OK || fail;
}

Test(shm, ibverbs_one_host_needs_no_device, .timeout = 120)
{
    struct mp_opts o = {.nranks = 4, .timeout_ms = TIMEOUT_MS};
    struct mp_result res;
    char buf[1024];

    setenv("WEFT_TRANSPORT", "ibverbs", 1);
    setenv("WEFT_SHM", "1", 1);
    cr_assert_eq(mp_run(&o, ibverbs_rank, NULL, &res), 0);
    unsetenv("WEFT_TRANSPORT");
    cr_assert(mp_all_passed(&res), "%s", mp_describe(&res, buf, sizeof buf));
}

Test(shm, bad_setting_is_econfig)
{
    weft_comm *c = (weft_comm *)1;

    setenv("WEFT_RANK", "0", 1);
    setenv("WEFT_SIZE", "1", 1);
    setenv("WEFT_SHM_RING_BYTES", "5000", 1);
    cr_assert_eq(weft_init(&c), WEFT_ECONFIG);
    cr_assert_null(c);
    cr_assert(strstr(weft_last_error(NULL), "WEFT_SHM_RING_BYTES") != NULL,
              "%s", weft_last_error(NULL));
    setenv("WEFT_SHM_RING_BYTES", "65536", 1);
    setenv("WEFT_SHM", "2", 1);
    cr_assert_eq(weft_init(&c), WEFT_ECONFIG);
    cr_assert(strstr(weft_last_error(NULL), "WEFT_SHM") != NULL, "%s",
              weft_last_error(NULL));
}

/* ---- a local peer that dies ---- */

enum { DIE_ALL_REDUCE, DIE_SEND, DIE_SEND_SMALL, DIE_RECV };

struct die_case {
    int what;
    char cma[16]; /* WEFT_SHM_CMA_BYTES */
};

/* The last rank is killed (after a barrier, at point 1) while the others
 * run an operation that needs it. */
static int die_rank(int rank, int nranks, void *arg)
{
    const struct die_case *dc = arg;
    size_t count = 1 << 20; /* 4 MiB of floats */
    float *v = mp_alloc(count * sizeof *v);
    int victim = nranks - 1, rc, fail = 0;
    const char *what;
    weft_comm *c;
    double t0, dt;

    if (mp_init(&c, rank, nranks) != WEFT_OK)
        return 1;
    for (size_t i = 0; i < count; i++)
        v[i] = 1.0f;
    if ((rc = weft_barrier(c)) != WEFT_OK)
        return mp_report_rc(c, "barrier", rc);
    if (rank == victim)
        mp_point(1); /* killed here */
    if (dc->what == DIE_SEND_SMALL)
        /* Dead by now: the send below fits the ring, so only the post's
         * own look at the peer can tell it left. */
        mp_sleep_ms(500);
    t0 = mp_now_ms();
    if (dc->what == DIE_ALL_REDUCE) {
        what = "all_reduce";
        rc = weft_all_reduce(c, v, v, count, WEFT_FLOAT32, WEFT_SUM);
    } else if (dc->what == DIE_SEND) {
        what = "send";
        rc = weft_send(c, v, count, WEFT_FLOAT32, victim);
    } else if (dc->what == DIE_SEND_SMALL) {
        what = "send of 256 bytes";
        rc = weft_send(c, v, 64, WEFT_FLOAT32, victim);
    } else {
        what = "recv";
        rc = weft_recv(c, v, count, WEFT_FLOAT32, victim);
    }
    dt = mp_now_ms() - t0;
    if (rc != WEFT_EPEER || dt > PROMPT_MS ||
        strstr(weft_last_error(c), "closed") == NULL) {
        mp_log("%s with peer %d killed: %s after %.0f ms (%s); expected "
               "WEFT_EPEER within %d ms",
               what, victim, weft_err_name(rc), dt, weft_last_error(c),
               PROMPT_MS);
        fail = 1;
    }
    return weft_finalize(c) != WEFT_OK || fail;
}

static void run_die(const struct die_case *dc, int nranks)
{
    struct mp_action kill = {
        .rank = nranks - 1, .point = 1, .kind = MP_ACT_SIGKILL};
    struct mp_opts o = {.nranks = nranks,
                        .timeout_ms = TIMEOUT_MS,
                        .actions = &kill,
                        .nactions = 1};
    struct mp_result res;
    char buf[1024];

    setenv("WEFT_SHM", "1", 1);
    setenv("WEFT_SHM_CMA_BYTES", dc->cma, 1);
    cr_assert_eq(mp_run(&o, die_rank, (void *)dc, &res), 0);
    cr_assert(mp_all_passed(&res), "%s", mp_describe(&res, buf, sizeof buf));
}

static struct die_case die_cases[] = {
    {DIE_ALL_REDUCE, "65536"}, /* one-copy reads */
    {DIE_ALL_REDUCE, "0"},     /* through the ring */
    {DIE_SEND, "65536"},       /* waits for the peer's read */
    {DIE_SEND, "0"},           /* waits for room in the ring */
    {DIE_SEND_SMALL, "0"},     /* fits the ring: the post must see it */
    {DIE_RECV, "0"},           /* waits for bytes */
};

ParameterizedTestParameters(shm, local_peer_dies)
{
    return cr_make_param_array(struct die_case, die_cases,
                               sizeof die_cases / sizeof die_cases[0]);
}

ParameterizedTest(struct die_case *dc, shm, local_peer_dies, .timeout = 120)
{
    run_die(dc, dc->what == DIE_ALL_REDUCE ? 3 : 2);
}

/* ---- nothing left behind ---- */

/* The names in /dev/shm, as one sorted string. */
static void dev_shm_names(char *out, size_t len)
{
    DIR *d = opendir("/dev/shm");
    struct dirent *e;
    char *names[512];
    int n = 0;

    out[0] = '\0';
    if (d == NULL)
        return;
    while ((e = readdir(d)) != NULL && n < 512)
        if (strcmp(e->d_name, ".") != 0 && strcmp(e->d_name, "..") != 0)
            names[n++] = strdup(e->d_name);
    closedir(d);
    for (int i = 0; i < n; i++)
        for (int j = i + 1; j < n; j++)
            if (strcmp(names[j], names[i]) < 0) {
                char *t = names[i];
                names[i] = names[j];
                names[j] = t;
            }
    for (int i = 0; i < n; i++) {
        strncat(out, names[i], len - strlen(out) - 2);
        strncat(out, "\n", len - strlen(out) - 1);
        free(names[i]);
    }
}

/* The names of `after` (one per line) that `before` lacks, but for the
 * shared arenas of Criterion itself ("bxfi_<pid>"), which the test
 * programs that make check runs beside this one create and remove (seen
 * once in CI: another program's arena, there before and gone after). */
static void new_names(const char *before, const char *after, char *out,
                      size_t len)
{
    char line[512];

    out[0] = '\0';
    for (const char *p = after; *p != '\0';) {
        const char *nl = strchr(p, '\n');
        size_t n = nl != NULL ? (size_t)(nl - p) : strlen(p);
        const char *q = before;
        int found = 0;

        snprintf(line, sizeof line, "%.*s\n", (int)n, p);
        for (; !found && (q = strstr(q, line)) != NULL; q++)
            found = q == before || q[-1] == '\n';
        if (!found && strncmp(line, "bxfi_", 5) != 0)
            strncat(out, line, len - strlen(out) - 1);
        p += n + (nl != NULL);
    }
}

Test(shm, nothing_left_in_dev_shm_after_a_crash, .timeout = 120)
{
    static char before[16384], after[16384], added[16384];
    struct die_case dc = {DIE_ALL_REDUCE, "65536"};

    dev_shm_names(before, sizeof before);
    run_die(&dc, 3);
    dev_shm_names(after, sizeof after);
    new_names(before, after, added, sizeof added);
    cr_assert_str_eq(added, "",
                     "/dev/shm has new names:\n%sbefore:\n%safter:\n%s", added,
                     before, after);
}

/* ---- cross-memory reads refused ---- */

/* Without CAP_SYS_PTRACE, and not dumpable, a process's memory is closed
 * to process_vm_readv from every other: each rank's probe fails, and the
 * frames that would have been read in one copy go through the ring. */
static int drop_ptrace(void)
{
    struct __user_cap_header_struct h = {.version =
                                             _LINUX_CAPABILITY_VERSION_3};
    struct __user_cap_data_struct d[2];

    if (syscall(SYS_capget, &h, d) != 0)
        return -1;
    d[CAP_TO_INDEX(CAP_SYS_PTRACE)].effective &= ~CAP_TO_MASK(CAP_SYS_PTRACE);
    d[CAP_TO_INDEX(CAP_SYS_PTRACE)].permitted &= ~CAP_TO_MASK(CAP_SYS_PTRACE);
    if (syscall(SYS_capset, &h, d) != 0)
        return -1;
    return prctl(PR_SET_DUMPABLE, 0, 0, 0, 0);
}

static int refused_rank(int rank, int nranks, void *arg)
{
    size_t count = (1 << 20) + 3;
    float *v = mp_alloc(count * sizeof *v);
    int rc, fail = 0;
    weft_comm *c;

    (void)arg;
    if (drop_ptrace() != 0) {
        mp_log("cannot drop CAP_SYS_PTRACE");
        return 1;
    }
    ((volatile pid_t *)mp_shm())[rank] = getpid();
    /* WEFT_LOG=info (the test sets it): set-up says why, into a file. */
    {
        FILE *log = tmpfile();
        int saved = dup(2);
        char line[512];
        int said = 0;

        if (log == NULL || saved < 0 || dup2(fileno(log), 2) < 0) {
            mp_log("cannot send stderr to a file");
            return 1;
        }
        rc = mp_init(&c, rank, nranks);
        fflush(stderr);
        dup2(saved, 2);
        close(saved);
        rewind(log);
        while (fgets(line, sizeof line, log) != NULL)
            said |= strstr(line, "cannot read the memory of peer") != NULL &&
                    strstr(line, "Operation not permitted") != NULL;
        fclose(log);
        if (rc != WEFT_OK)
            return 1;
        if (!said) {
            mp_log("weft_init said nothing of the refused reads at "
                   "WEFT_LOG=info");
            fail = 1;
        }
    }
    /* Every rank has dropped it by now: the kernel must refuse to read the
     * next rank, so the probe at set-up failed too. */
    if ((rc = weft_barrier(c)) != WEFT_OK)
        return mp_report_rc(c, "barrier", rc);
    {
        pid_t peer = ((volatile pid_t *)mp_shm())[(rank + 1) % nranks];
        uint64_t word = 0;
        struct iovec l = {.iov_base = &word, .iov_len = sizeof word};
        struct iovec r = {.iov_base = &word, .iov_len = sizeof word};
        if (process_vm_readv(peer, &l, 1, &r, 1, 0) >= 0 || errno != EPERM) {
            mp_log("process_vm_readv of rank %d (pid %d) was not refused "
                   "(%s): the test proves nothing here",
                   (rank + 1) % nranks, (int)peer, strerror(errno));
            fail = 1;
        }
    }
    for (size_t i = 0; i < count; i++)
        v[i] = (float)(rank + (int)(i % 1000));
    rc = weft_all_reduce(c, v, v, count, WEFT_FLOAT32, WEFT_SUM);
    if (rc != WEFT_OK)
        fail |= mp_report_rc(c, "all_reduce", rc);
    for (size_t i = 0; rc == WEFT_OK && i < count; i++)
        if (v[i] !=
            (float)(nranks * (nranks - 1) / 2 + nranks * (int)(i % 1000))) {
            mp_log("element %zu is %g", i, (double)v[i]);
            fail = 1;
            break;
        }
    return weft_finalize(c) != WEFT_OK || fail;
}

Test(shm, one_copy_refused_goes_through_the_ring, .timeout = 120)
{
    struct mp_opts o = {.nranks = 3, .timeout_ms = TIMEOUT_MS};
    struct mp_result res;
    char buf[1024];

    setenv("WEFT_SHM", "1", 1);
    setenv("WEFT_SHM_CMA_BYTES", "1", 1);
    setenv("WEFT_LOG", "info", 1);
    cr_assert_eq(mp_run(&o, refused_rank, NULL, &res), 0);
    cr_assert(mp_all_passed(&res), "%s", mp_describe(&res, buf, sizeof buf));
}
