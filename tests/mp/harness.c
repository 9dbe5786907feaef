/*
 * Multi-process test harness (see harness.h).
 */
#define _GNU_SOURCE
#include "harness.h"

#include <pthread.h>
#include <stdatomic.h>
#include <time.h>

#include <arpa/inet.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <criterion/criterion.h>
#include <criterion/options.h>

extern char **environ;

/* This child's rank and its control socket to the parent (-1 in the
 * parent). */
static int g_rank = -1;
static int g_ctl_fd = -1;
static void *g_shm;

static const char *const launcher_vars[] = {
    "OMPI_COMM_WORLD_RANK",
    "OMPI_COMM_WORLD_SIZE",
    "OMPI_COMM_WORLD_LOCAL_RANK",
    "OMPI_COMM_WORLD_LOCAL_SIZE",
    "PMI_RANK",
    "PMI_SIZE",
    "PMIX_RANK",
    "PMI_FD",
    "SLURM_PROCID",
    "SLURM_NTASKS",
    "SLURM_NPROCS",
    "SLURM_LOCALID",
    "RANK",
    "WORLD_SIZE",
    "LOCAL_RANK",
    "LOCAL_WORLD_SIZE",
    "GROUP_RANK",
    "MASTER_ADDR",
    "MASTER_PORT",
};

int mp_threads(void)
{
    DIR *d = opendir("/proc/self/task");
    struct dirent *e;
    int n = 0;

    if (d == NULL)
        return -1;
    while ((e = readdir(d)) != NULL)
        if (e->d_name[0] != '.')
            n++;
    closedir(d);
    return n;
}

int mp_threads_settle(int want, int ms)
{
    double end = mp_now_ms() + ms;
    int n;

    while ((n = mp_threads()) > want && mp_now_ms() < end)
        mp_sleep_ms(1);
    return n;
}

double mp_now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

static pthread_t g_stall_thread;
static atomic_int g_stall_run;
static _Atomic double g_stall_max;

static void *stall_main(void *arg)
{
    double last = mp_now_ms();
    (void)arg;
    while (atomic_load(&g_stall_run)) {
        struct timespec ts = {0, 5 * 1000 * 1000};
        nanosleep(&ts, NULL);
        double now = mp_now_ms();
        if (now - last > atomic_load(&g_stall_max))
            atomic_store(&g_stall_max, now - last);
        last = now;
    }
    return NULL;
}

void mp_stall_watch_start(void)
{
    atomic_store(&g_stall_max, 0.0);
    atomic_store(&g_stall_run, 1);
    if (pthread_create(&g_stall_thread, NULL, stall_main, NULL) != 0)
        atomic_store(&g_stall_run, 0);
}

double mp_stall_watch_stop(void)
{
    if (atomic_exchange(&g_stall_run, 0))
        pthread_join(g_stall_thread, NULL);
    return atomic_load(&g_stall_max);
}

void mp_sleep_ms(int ms)
{
    struct timespec ts = {.tv_sec = ms / 1000,
                          .tv_nsec = (long)(ms % 1000) * 1000000L};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
    }
}

void mp_log(const char *fmt, ...)
{
    char buf[2048];
    int n;
    if (g_rank >= 0)
        n = snprintf(buf, sizeof buf, "[rank %d] ", g_rank);
    else
        n = snprintf(buf, sizeof buf, "[mp] ");
    va_list ap;
    va_start(ap, fmt);
    int m = vsnprintf(buf + n, sizeof buf - (size_t)n - 1, fmt, ap);
    va_end(ap);
    size_t len = (size_t)n + (m < 0 ? 0 : (size_t)m);
    if (len > sizeof buf - 2)
        len = sizeof buf - 2;
    buf[len++] = '\n';
    /* One write, so the lines of several ranks do not interleave. */
    ssize_t w = write(STDERR_FILENO, buf, len);
    (void)w;
}

const char *mp_dtype_name(weft_dtype dtype)
{
    switch (dtype) {
    case WEFT_INT8:
        return "int8";
    case WEFT_UINT8:
        return "uint8";
    case WEFT_INT32:
        return "int32";
    case WEFT_UINT32:
        return "uint32";
    case WEFT_INT64:
        return "int64";
    case WEFT_UINT64:
        return "uint64";
    case WEFT_FLOAT16:
        return "float16";
    case WEFT_BFLOAT16:
        return "bfloat16";
    case WEFT_FLOAT32:
        return "float32";
    case WEFT_FLOAT64:
        return "float64";
    }
    return "dtype?";
}

const char *mp_op_name(weft_redop op)
{
    switch (op) {
    case WEFT_SUM:
        return "sum";
    case WEFT_PROD:
        return "prod";
    case WEFT_MIN:
        return "min";
    case WEFT_MAX:
        return "max";
    }
    return "op?";
}

int mp_init(weft_comm **out, int rank, int nranks)
{
    weft_comm *c = NULL;
    int rc = weft_init(&c);
    if (rc != WEFT_OK) {
        mp_log("weft_init failed: %s: %s", weft_err_name(rc),
               weft_last_error(NULL));
        *out = NULL;
        return rc;
    }
    if (c == NULL) {
        mp_log("weft_init returned WEFT_OK but no communicator");
        return WEFT_ECONFIG;
    }
    if (weft_rank(c) != rank || weft_size(c) != nranks) {
        mp_log("weft_init: rank/size %d/%d, expected %d/%d", weft_rank(c),
               weft_size(c), rank, nranks);
        weft_finalize(c);
        *out = NULL;
        return WEFT_ECONFIG;
    }
    *out = c;
    return WEFT_OK;
}

uint64_t mp_hash64(uint64_t x)
{
    x += 0x9e3779b97f4a7c15ULL;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
    return x ^ (x >> 31);
}

uint64_t mp_fnv1a(const void *buf, size_t nbytes)
{
    const unsigned char *p = buf;
    uint64_t h = 0xcbf29ce484222325ULL;
    for (size_t i = 0; i < nbytes; i++) {
        h ^= p[i];
        h *= 0x100000001b3ULL;
    }
    return h;
}

void mp_fill_bytes(void *buf, size_t nbytes, uint64_t seed)
{
    unsigned char *p = buf;
    uint64_t x = mp_hash64(seed);
    for (size_t i = 0; i < nbytes; i++) {
        if ((i & 7) == 0)
            x = mp_hash64(x + i);
        p[i] = (unsigned char)(x >> (8 * (i & 7)));
    }
}

void *mp_alloc(size_t nbytes)
{
    unsigned char *p = malloc(nbytes + MP_CANARY_BYTES);
    if (!p) {
        mp_log("mp_alloc(%zu): out of memory", nbytes);
        abort();
    }
    memset(p, MP_GARBAGE, nbytes);
    memset(p + nbytes, MP_CANARY, MP_CANARY_BYTES);
    return p;
}

int mp_canary_ok(const void *buf, size_t nbytes)
{
    const unsigned char *p = (const unsigned char *)buf + nbytes;
    for (size_t i = 0; i < MP_CANARY_BYTES; i++)
        if (p[i] != MP_CANARY)
            return 0;
    return 1;
}

#define PUT_AS(type)                                                           \
    do {                                                                       \
        type x_ = (type)v;                                                     \
        memcpy((char *)buf + i * sizeof x_, &x_, sizeof x_);                   \
    } while (0)
#define GET_AS(type)                                                           \
    do {                                                                       \
        type x_;                                                               \
        memcpy(&x_, (const char *)buf + i * sizeof x_, sizeof x_);             \
        return (double)x_;                                                     \
    } while (0)

void mp_put_value(weft_dtype dtype, void *buf, size_t i, double v)
{
    switch (dtype) {
    case WEFT_INT8:
        PUT_AS(int8_t);
        break;
    case WEFT_UINT8:
        PUT_AS(uint8_t);
        break;
    case WEFT_INT32:
        PUT_AS(int32_t);
        break;
    case WEFT_UINT32:
        PUT_AS(uint32_t);
        break;
    case WEFT_INT64:
        PUT_AS(int64_t);
        break;
    case WEFT_UINT64:
        PUT_AS(uint64_t);
        break;
    case WEFT_FLOAT32:
        PUT_AS(float);
        break;
    case WEFT_FLOAT64:
        PUT_AS(double);
        break;
    case WEFT_BFLOAT16: {
        /* The top half of the float32: exact for the small integers used. */
        float f = (float)v;
        uint32_t bits;
        memcpy(&bits, &f, 4);
        uint16_t b = (uint16_t)(bits >> 16);
        memcpy((char *)buf + 2 * i, &b, 2);
        break;
    }
    case WEFT_FLOAT16:
        break;
    }
}

double mp_get_value(weft_dtype dtype, const void *buf, size_t i)
{
    switch (dtype) {
    case WEFT_INT8:
        GET_AS(int8_t);
    case WEFT_UINT8:
        GET_AS(uint8_t);
    case WEFT_INT32:
        GET_AS(int32_t);
    case WEFT_UINT32:
        GET_AS(uint32_t);
    case WEFT_INT64:
        GET_AS(int64_t);
    case WEFT_UINT64:
        GET_AS(uint64_t);
    case WEFT_FLOAT32:
        GET_AS(float);
    case WEFT_FLOAT64:
        GET_AS(double);
    case WEFT_BFLOAT16: {
        uint16_t b;
        memcpy(&b, (const char *)buf + 2 * i, 2);
        uint32_t bits = (uint32_t)b << 16;
        float f;
        memcpy(&f, &bits, 4);
        return f;
    }
    case WEFT_FLOAT16:
        break;
    }
    return 0;
}

size_t mp_first_diff(const void *a, const void *b, size_t count, size_t esize)
{
    const unsigned char *pa = a, *pb = b;
    if (memcmp(pa, pb, count * esize) == 0)
        return count;
    for (size_t i = 0; i < count; i++)
        if (memcmp(pa + i * esize, pb + i * esize, esize) != 0)
            return i;
    return count;
}

int mp_report_rc(const weft_comm *c, const char *what, int rc)
{
    mp_log("%s: returned %s (%d): %s", what, weft_err_name(rc), rc,
           weft_last_error(c));
    return 1;
}

int mp_check_elems(const char *what, const char *which, weft_dtype dtype,
                   const void *got, const void *exp, size_t count)
{
    size_t es = weft_dtype_size(dtype);
    if (es == 0 || es > 8) {
        mp_log("%s: weft_dtype_size(%s) is %zu", what, mp_dtype_name(dtype),
               es);
        return 1;
    }
    size_t i = mp_first_diff(got, exp, count, es);
    if (i == count)
        return 0;
    uint64_t g = 0, e = 0;
    memcpy(&g, (const char *)got + i * es, es);
    memcpy(&e, (const char *)exp + i * es, es);
    mp_log("%s: %s: first wrong index %zu of %zu: got 0x%0*llx (%g), "
           "expected 0x%0*llx (%g)",
           what, which, i, count, (int)(2 * es), (unsigned long long)g,
           mp_get_value(dtype, got, i), (int)(2 * es), (unsigned long long)e,
           mp_get_value(dtype, exp, i));
    return 1;
}

int mp_check_canary(const char *what, const char *which, const void *buf,
                    size_t nbytes)
{
    if (mp_canary_ok(buf, nbytes))
        return 0;
    mp_log("%s: bytes written past the end of %s (%zu bytes)", what, which,
           nbytes);
    return 1;
}

double mp_small_elem(int r, size_t i)
{
    return (double)(((uint64_t)r + mp_hash64(i) % 3) % 3 + 1);
}

double mp_small_expect(weft_redop op, int n, size_t i)
{
    double v = mp_small_elem(0, i);

    for (int r = 1; r < n; r++) {
        double e = mp_small_elem(r, i);
        v = op == WEFT_SUM    ? v + e
            : op == WEFT_PROD ? v * e
            : op == WEFT_MIN  ? (e < v ? e : v)
                              : (e > v ? e : v);
    }
    return v;
}

int mp_small_all_reduce(weft_comm *c, weft_dtype dt, weft_redop op, size_t n,
                        int inplace, int rank, int nranks)
{
    const size_t bytes = n * weft_dtype_size(dt);
    char *send = mp_alloc(bytes);
    char *recv = mp_alloc(bytes + 2 * MP_CANARY_BYTES);
    char *want = mp_alloc(bytes);
    char *out = recv + MP_CANARY_BYTES;
    char what[128];
    int rc, fail;

    memset(recv, MP_CANARY, bytes + 2 * MP_CANARY_BYTES);
    for (size_t i = 0; i < n; i++) {
        mp_put_value(dt, inplace ? out : send, i, mp_small_elem(rank, i));
        mp_put_value(dt, want, i, mp_small_expect(op, nranks, i));
    }
    snprintf(what, sizeof what, "all_reduce(%s, %s, count=%zu%s)",
             mp_op_name(op), mp_dtype_name(dt), n, inplace ? ", in place" : "");
    rc = weft_all_reduce(c, inplace ? out : send, out, n, dt, op);
    if (rc != WEFT_OK)
        fail = mp_report_rc(c, what, rc);
    else
        fail = mp_check_elems(what, "recvbuf", dt, out, want, n) ||
               mp_check_canary(what, "recvbuf", out, bytes) ||
               mp_check_canary(what, "the bytes before recvbuf", recv, 0);
    free(send);
    free(recv);
    free(want);
    return fail;
}

int mp_low_algo(char *out, size_t len, int nranks, enum mp_layout layout,
                const char *topology, int shm, size_t gathered,
                const char *first)
{
    enum { RING, DIRECT, MESH } on;
    const size_t n = (size_t)nranks;
    const int pow2 = (nranks & (nranks - 1)) == 0;
    size_t at = 0;

#define ROWS(...)                                                              \
    do {                                                                       \
        int k_ = snprintf(out + at, at < len ? len - at : 0, __VA_ARGS__);     \
        if (k_ < 0 || (size_t)k_ >= len - at)                                  \
            return -1;                                                         \
        at += (size_t)k_;                                                      \
    } while (0)
    if (nranks < 2 || nranks > 8 || len == 0)
        return -1;
    if (strcmp(topology, "ring") == 0)
        on = RING;
    else if (layout == MP_LAYOUT_ONE_HOST)
        on = strcmp(topology, "mesh") == 0 ? MESH : DIRECT;
    else if (layout == MP_LAYOUT_PAIRS)
        on = MESH;
    else if (layout == MP_LAYOUT_RING && nranks >= 4 &&
             strcmp(topology, "auto") == 0)
        on = RING;
    else
        return -1;
    ROWS("all_reduce:");
    if (layout == MP_LAYOUT_ONE_HOST && shm) {
        /* The box's default: 16 KiB / n, from 192 to 2048 bytes. */
        size_t box = 16384 / n < 192    ? 192
                     : 16384 / n > 2048 ? 2048
                                        : 16384 / n;
        ROWS("0-%zu=box,", box);
    }
    if (first != NULL)
        ROWS("%s,", first);
    if (on == MESH)
        ROWS("0-%zu=gather,0-=mesh", (size_t)4096 / n);
    else if (on == RING)
        ROWS("0-%zu=gather,0-=ring", gathered / n);
    else {
        if (pow2)
            ROWS("0-1024=doubling,");
        ROWS("0-%zu=gather,", gathered / n);
        /* Recursive halving + doubling from 4 ranks: up to 8 MiB per rank
         * over shared memory, 1 MiB over loopback TCP, 64 KiB where n is
         * not a power of two. */
        if (nranks >= 4)
            ROWS("0-%s=halving,", !pow2 ? "64k" : shm ? "8m" : "1m");
        ROWS("0-=ring");
    }
#undef ROWS
    return 0;
}

static void clear_launcher_env(void)
{
    for (size_t i = 0; i < sizeof launcher_vars / sizeof launcher_vars[0]; i++)
        unsetenv(launcher_vars[i]);
}

void mp_clear_env(void)
{
    clear_launcher_env();
    /* Collect the names first: unsetenv() changes environ under us. */
    for (;;) {
        char name[256] = "";
        for (char **e = environ; e && *e; e++) {
            if (strncmp(*e, "WEFT_", 5) == 0) {
                const char *eq = strchr(*e, '=');
                size_t len = eq ? (size_t)(eq - *e) : strlen(*e);
                if (len >= sizeof name)
                    len = sizeof name - 1;
                memcpy(name, *e, len);
                name[len] = '\0';
                break;
            }
        }
        if (name[0] == '\0')
            break;
        unsetenv(name);
    }
}

int mp_free_ports(int *ports, int n)
{
    int fds[2 * MP_MAX_RANKS];
    if (n < 0 || n > 2 * MP_MAX_RANKS)
        return -1;
    int i, rc = 0;
    /* Keep every socket bound until all are picked, so they are distinct. */
    for (i = 0; i < n; i++) {
        struct sockaddr_in sa = {.sin_family = AF_INET,
                                 .sin_port = 0,
                                 .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
        socklen_t len = sizeof sa;
        fds[i] = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
        if (fds[i] < 0 || bind(fds[i], (struct sockaddr *)&sa, sizeof sa) ||
            getsockname(fds[i], (struct sockaddr *)&sa, &len)) {
            mp_log("picking a free port: %s", strerror(errno));
            if (fds[i] >= 0)
                close(fds[i]);
            rc = -1;
            break;
        }
        ports[i] = ntohs(sa.sin_port);
    }
    while (i-- > 0)
        close(fds[i]);
    return rc;
}

int mp_write_hostfile(const char *path, const int *ports, int n)
{
    FILE *f = fopen(path, "w");
    if (!f) {
        mp_log("cannot write %s: %s", path, strerror(errno));
        return -1;
    }
    fprintf(f,
            "{\"port\": %d, \"hosts\": [{\"name\": \"localhost\", "
            "\"ranks\": %d, \"ports\": [",
            ports[0], n);
    for (int i = 0; i < n; i++)
        fprintf(f, "%s%d", i ? ", " : "", ports[i]);
    fprintf(f, "]}], \"links\": []}\n");
    if (fclose(f) != 0) {
        mp_log("cannot write %s: %s", path, strerror(errno));
        return -1;
    }
    return 0;
}

int mp_write_hostfile_layout(const char *path, const int *ports, int n,
                             enum mp_layout layout)
{
    if (layout == MP_LAYOUT_ONE_HOST)
        return mp_write_hostfile(path, ports, n);
    FILE *f = fopen(path, "w");
    if (!f) {
        mp_log("cannot write %s: %s", path, strerror(errno));
        return -1;
    }
    /* Ranks per host, and so hosts. */
    const int per = layout == MP_LAYOUT_PAIRS ? 2 : 1;
    fprintf(f, "{\"hosts\": [");
    for (int i = 0; i < n / per; i++) {
        fprintf(f, "%s{\"name\": \"h%d\", \"ranks\": %d, \"ports\": [",
                i ? ", " : "", i, per);
        for (int j = 0; j < per; j++)
            fprintf(f, "%s%d", j ? ", " : "", ports[i * per + j]);
        fprintf(f, "]}");
    }
    n /= per;
    fprintf(f, "], \"links\": [");
    int l = 0;
    for (int a = 0; a < n; a++)
        for (int b = a + 1; b < n; b++) {
            int ring = b == a + 1 || (a == 0 && b == n - 1);
            if (layout == MP_LAYOUT_RING && !ring)
                continue;
            if (layout == MP_LAYOUT_RING && n == 2 && l > 0)
                continue; /* two hosts: one cable */
            fprintf(f,
                    "%s[{\"host\": \"h%d\", \"addr\": \"127.0.%d.1\"}, "
                    "{\"host\": \"h%d\", \"addr\": \"127.0.%d.2\"}]",
                    l ? ", " : "", a, l + 1, b, l + 1);
            l++;
        }
    fprintf(f, "]}\n");
    if (fclose(f) != 0) {
        mp_log("cannot write %s: %s", path, strerror(errno));
        return -1;
    }
    return 0;
}

static void make_token(char out[33])
{
    unsigned char raw[16];
    int fd = open("/dev/urandom", O_RDONLY | O_CLOEXEC);
    ssize_t got = fd >= 0 ? read(fd, raw, sizeof raw) : -1;
    if (fd >= 0)
        close(fd);
    if (got != (ssize_t)sizeof raw) {
        uint64_t x =
            mp_hash64((uint64_t)getpid() << 32 ^ (uint64_t)(mp_now_ms() * 1e3));
        for (size_t i = 0; i < sizeof raw; i++)
            raw[i] = (unsigned char)(mp_hash64(x + i) >> 56);
    }
    for (size_t i = 0; i < sizeof raw; i++)
        snprintf(out + 2 * i, 3, "%02x", raw[i]);
}

void *mp_shm(void)
{
    if (g_shm == NULL) {
        /* Ranks that are not this process's children (started by weftrun)
         * share a file instead: MP_SHM_FILE, zeroed by whoever made it. */
        const char *file = getenv("MP_SHM_FILE");
        int fd = -1;
        if (file != NULL && *file != '\0') {
            fd = open(file, O_RDWR | O_CREAT, 0600);
            if (fd < 0 || ftruncate(fd, MP_SHM_BYTES) != 0) {
                mp_log("%s: %s", file, strerror(errno));
                abort();
            }
        }
        void *p =
            mmap(NULL, MP_SHM_BYTES, PROT_READ | PROT_WRITE,
                 fd >= 0 ? MAP_SHARED : MAP_SHARED | MAP_ANONYMOUS, fd, 0);
        if (fd >= 0)
            close(fd);
        if (p == MAP_FAILED) {
            mp_log("mmap: %s", strerror(errno));
            abort();
        }
        g_shm = p;
    }
    return g_shm;
}

void mp_point(int point)
{
    if (g_ctl_fd < 0)
        return;
    if (send(g_ctl_fd, &point, sizeof point, MSG_NOSIGNAL) !=
        (ssize_t)sizeof point) {
        mp_log("mp_point(%d): cannot tell the parent: %s", point,
               strerror(errno));
        return;
    }
    /* Wait for the parent's acknowledgement: by then its action is done. */
    for (;;) {
        char ack;
        ssize_t r = recv(g_ctl_fd, &ack, 1, 0);
        if (r == 1 || r == 0)
            return;
        if (errno != EINTR)
            return;
    }
}

static void child_setup_signals(void)
{
    static const int sigs[] = {SIGSEGV, SIGBUS,  SIGFPE, SIGILL,  SIGABRT,
                               SIGPIPE, SIGTERM, SIGINT, SIGALRM, SIGCHLD,
                               SIGUSR1, SIGUSR2, SIGHUP};
    for (size_t i = 0; i < sizeof sigs / sizeof sigs[0]; i++)
        signal(sigs[i], SIG_DFL);
    sigset_t none;
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, NULL);
}

static void set_env_int(const char *name, int value)
{
    char buf[32];
    snprintf(buf, sizeof buf, "%d", value);
    setenv(name, buf, 1);
}

struct job_state {
    int nranks;
    int ports[2 * MP_MAX_RANKS];
    char dir[256];
    char hostfile[300];
    char hostfile_b[300];
    char token[33];
    pid_t pids[MP_MAX_RANKS];
    int ctl[MP_MAX_RANKS][2]; /* [0] parent's end, [1] child's end */
    int done[MP_MAX_RANKS];
};

static _Noreturn void run_child(struct job_state *js, const struct mp_opts *o,
                                int rank, pid_t parent, mp_rank_fn fn,
                                void *arg)
{
    /* If the Criterion worker dies (its .timeout), take the ranks along. */
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != parent)
        _exit(127);
    child_setup_signals();
    for (int r = 0; r < js->nranks; r++) {
        close(js->ctl[r][0]);
        if (r != rank)
            close(js->ctl[r][1]);
    }
    g_rank = rank;
    g_ctl_fd = js->ctl[rank][1];

    clear_launcher_env();
    set_env_int("WEFT_RANK", rank);
    set_env_int("WEFT_SIZE", js->nranks);
    setenv("WEFT_HOSTFILE", js->hostfile, 1);
    setenv("WEFT_JOB_TOKEN", js->token, 1);
    set_env_int("WEFT_WIRES", o->wires > 0 ? o->wires : 1);
    if (o->timeout_ms > 0)
        set_env_int("WEFT_TIMEOUT_MS", o->timeout_ms);
    if (o->connect_timeout_ms > 0)
        set_env_int("WEFT_CONNECT_TIMEOUT_MS", o->connect_timeout_ms);
    if (o->hostfile_b_ranks > 0)
        setenv("WEFT_TEST_HOSTFILE_B", js->hostfile_b, 1);
    else
        unsetenv("WEFT_TEST_HOSTFILE_B");

    int rc = fn(rank, js->nranks, arg);
    fflush(stdout);
    fflush(stderr);
    /* Exit statuses are 8 bits: never let a failure wrap to 0. */
    _exit(rc == 0 ? 0 : (rc > 0 && rc < 256 ? rc : 1));
}

static void record_status(struct mp_rank_result *rr, int status)
{
    if (WIFEXITED(status)) {
        rr->exited = 1;
        rr->exit_code = WEXITSTATUS(status);
    } else if (WIFSIGNALED(status)) {
        rr->signaled = 1;
        rr->signo = WTERMSIG(status);
    }
}

static void reap_blocking(pid_t pid, struct mp_rank_result *rr)
{
    int status;
    pid_t w;
    while ((w = waitpid(pid, &status, 0)) < 0 && errno == EINTR) {
    }
    if (w == pid)
        record_status(rr, status);
}

static void handle_point(struct job_state *js, const struct mp_opts *o,
                         struct mp_result *res, int rank, int point)
{
    int ack = 1;
    res->rank[rank].last_point = point;
    for (int a = 0; a < o->nactions; a++) {
        const struct mp_action *act = &o->actions[a];
        if (act->rank != rank || act->point != point)
            continue;
        if (act->kind == MP_ACT_SIGSTOP) {
            kill(js->pids[rank], SIGSTOP);
        } else if (act->kind == MP_ACT_SIGKILL) {
            kill(js->pids[rank], SIGKILL);
            res->rank[rank].by_action = 1;
            ack = 0;
        }
    }
    if (ack) {
        char b = 1;
        ssize_t s = send(js->ctl[rank][0], &b, 1, MSG_NOSIGNAL | MSG_DONTWAIT);
        (void)s;
    }
}

static void poll_points(struct job_state *js, const struct mp_opts *o,
                        struct mp_result *res, int timeout_ms)
{
    struct pollfd pfd[MP_MAX_RANKS];
    int who[MP_MAX_RANKS], n = 0;
    for (int r = 0; r < js->nranks; r++) {
        if (js->ctl[r][0] >= 0) {
            pfd[n] = (struct pollfd){.fd = js->ctl[r][0], .events = POLLIN};
            who[n++] = r;
        }
    }
    if (n == 0) {
        mp_sleep_ms(timeout_ms);
        return;
    }
    if (poll(pfd, (nfds_t)n, timeout_ms) <= 0)
        return;
    for (int i = 0; i < n; i++) {
        if (!(pfd[i].revents & (POLLIN | POLLHUP | POLLERR)))
            continue;
        int r = who[i], point;
        ssize_t got = recv(pfd[i].fd, &point, sizeof point, MSG_DONTWAIT);
        if (got == (ssize_t)sizeof point) {
            handle_point(js, o, res, r, point);
        } else if (got == 0 || (got < 0 && errno != EAGAIN && errno != EINTR)) {
            close(js->ctl[r][0]);
            js->ctl[r][0] = -1;
        }
    }
}

static void remove_tmp(struct job_state *js)
{
    if (js->hostfile[0])
        unlink(js->hostfile);
    if (js->hostfile_b[0])
        unlink(js->hostfile_b);
    if (js->dir[0])
        rmdir(js->dir);
}

int mp_run(const struct mp_opts *o, mp_rank_fn fn, void *arg,
           struct mp_result *res)
{
    struct job_state js;
    memset(&js, 0, sizeof js);
    memset(res, 0, sizeof *res);
    int n = o->nranks, nb = o->hostfile_b_ranks > 0 ? o->hostfile_b_ranks : 0;
    if (n < 1 || n > MP_MAX_RANKS || nb > MP_MAX_RANKS) {
        mp_log("mp_run: bad nranks %d / hostfile_b_ranks %d", n, nb);
        return -1;
    }
    js.nranks = n;
    res->nranks = n;
    for (int r = 0; r < MP_MAX_RANKS; r++) {
        res->rank[r].last_point = -1;
        js.ctl[r][0] = js.ctl[r][1] = -1;
    }
    memset(mp_shm(), 0, MP_SHM_BYTES);

    const char *tmp = getenv("TMPDIR");
    snprintf(js.dir, sizeof js.dir, "%s/weft-mp-XXXXXX",
             tmp && *tmp ? tmp : "/tmp");
    if (!mkdtemp(js.dir)) {
        mp_log("mkdtemp %s: %s", js.dir, strerror(errno));
        js.dir[0] = '\0';
        return -1;
    }
    snprintf(js.hostfile, sizeof js.hostfile, "%s/hostfile.json", js.dir);
    if (nb)
        snprintf(js.hostfile_b, sizeof js.hostfile_b, "%s/hostfile_b.json",
                 js.dir);
    make_token(js.token);
    if (mp_free_ports(js.ports, n + nb) != 0 ||
        mp_write_hostfile_layout(js.hostfile, js.ports, n, o->layout) != 0 ||
        (nb && mp_write_hostfile(js.hostfile_b, js.ports + n, nb) != 0)) {
        remove_tmp(&js);
        return -1;
    }

    struct mp_job job = {.nranks = n,
                         .ports = js.ports,
                         .hostfile = js.hostfile,
                         .hostfile_b = nb ? js.hostfile_b : NULL,
                         .ports_b = nb ? js.ports + n : NULL,
                         .token = js.token,
                         .pids = NULL};
    if (o->before_fork)
        o->before_fork(&job, o->hook_arg);

    for (int r = 0; r < n; r++) {
        if (socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, js.ctl[r])) {
            mp_log("socketpair: %s", strerror(errno));
            for (int q = 0; q < r; q++) {
                close(js.ctl[q][0]);
                close(js.ctl[q][1]);
            }
            remove_tmp(&js);
            return -1;
        }
    }

    fflush(NULL);
    pid_t parent = getpid();
    double start = mp_now_ms();
    int deadline_ms =
        o->deadline_ms > 0 ? o->deadline_ms : MP_DEFAULT_DEADLINE_MS;
    int nforked = 0;
    for (int r = 0; r < n; r++) {
        pid_t pid = fork();
        if (pid < 0) {
            mp_log("fork: %s", strerror(errno));
            break;
        }
        if (pid == 0)
            run_child(&js, o, r, parent, fn, arg);
        js.pids[r] = pid;
        res->rank[r].pid = pid;
        nforked++;
    }
    for (int r = 0; r < n; r++) {
        close(js.ctl[r][1]);
        js.ctl[r][1] = -1;
    }
    if (nforked < n) {
        for (int r = 0; r < nforked; r++) {
            kill(js.pids[r], SIGKILL);
            reap_blocking(js.pids[r], &res->rank[r]);
            close(js.ctl[r][0]);
        }
        remove_tmp(&js);
        return -1;
    }
    job.pids = js.pids;
    if (o->after_fork)
        o->after_fork(&job, o->hook_arg);

    /* Wait for every rank that must end by itself; linger ranks are waited
     * for too, but they do not hold the job open. */
    for (;;) {
        int waiting = 0;
        for (int r = 0; r < n; r++) {
            if (js.done[r])
                continue;
            int status;
            pid_t w = waitpid(js.pids[r], &status, WNOHANG);
            if (w == js.pids[r]) {
                record_status(&res->rank[r], status);
                js.done[r] = 1;
            } else if (!(o->linger_mask & (1u << r))) {
                waiting++;
            }
        }
        if (waiting == 0)
            break;
        if (mp_now_ms() - start > deadline_ms) {
            res->deadline_hit = 1;
            for (int r = 0; r < n; r++) {
                if (js.done[r] || (o->linger_mask & (1u << r)))
                    continue;
                mp_log("deadline of %d ms: rank %d (pid %d) did not finish "
                       "(last point %d); killing it",
                       deadline_ms, r, (int)js.pids[r],
                       res->rank[r].last_point);
                kill(js.pids[r], SIGKILL);
                reap_blocking(js.pids[r], &res->rank[r]);
                res->rank[r].deadline = 1;
                js.done[r] = 1;
            }
            break;
        }
        poll_points(&js, o, res, 10);
    }
    for (int r = 0; r < n; r++) {
        if (js.done[r])
            continue;
        kill(js.pids[r], SIGKILL);
        reap_blocking(js.pids[r], &res->rank[r]);
        res->rank[r].lingered = 1;
        js.done[r] = 1;
    }
    res->elapsed_ms = mp_now_ms() - start;
    for (int r = 0; r < n; r++) {
        if (js.ctl[r][0] >= 0)
            close(js.ctl[r][0]);
    }
    remove_tmp(&js);
    return 0;
}

int mp_timing_verdict(double dt, double bound_ms, double stall_ms)
{
    if (dt <= bound_ms)
        return 0;
    if (stall_ms >= dt - bound_ms) {
        mp_log("%.0f ms against a bound of %.0f ms, but the process was "
               "stalled for %.0f ms",
               dt, bound_ms, stall_ms);
        return MP_EXIT_STALLED;
    }
    return 1;
}

int mp_run_timed(const struct mp_opts *o, mp_rank_fn fn, void *arg,
                 struct mp_result *res, const char *what)
{
    for (int attempt = 1;; attempt++) {
        int stalled = 0, rc = mp_run(o, fn, arg, res);

        if (rc != 0)
            return rc;
        for (int r = 0; r < res->nranks; r++)
            stalled |= res->rank[r].exited &&
                       res->rank[r].exit_code == MP_EXIT_STALLED;
        if (!stalled || attempt == 3)
            return 0;
        mp_log("%s: a rank was stalled by the machine; running it again", what);
    }
}

int mp_all_passed(const struct mp_result *res)
{
    if (res->nranks < 1)
        return 0;
    for (int r = 0; r < res->nranks; r++) {
        const struct mp_rank_result *rr = &res->rank[r];
        if (rr->deadline)
            return 0;
        if (rr->exited && rr->exit_code == 0)
            continue;
        if ((rr->lingered || rr->by_action) && rr->signaled &&
            rr->signo == SIGKILL)
            continue;
        return 0;
    }
    return 1;
}

const char *mp_describe(const struct mp_result *res, char *buf, size_t len)
{
    size_t off = 0;
    buf[0] = '\0';
    for (int r = 0; r < res->nranks && off < len; r++) {
        const struct mp_rank_result *rr = &res->rank[r];
        int m;
        if (rr->deadline)
            m = snprintf(buf + off, len - off,
                         "rank %d: did not finish before the deadline; ", r);
        else if (rr->exited)
            m = snprintf(buf + off, len - off, "rank %d: exit %d; ", r,
                         rr->exit_code);
        else if (rr->signaled)
            m = snprintf(buf + off, len - off, "rank %d: signal %d (%s)%s; ", r,
                         rr->signo, strsignal(rr->signo),
                         rr->lingered    ? ", lingered"
                         : rr->by_action ? ", by action"
                                         : "");
        else
            m = snprintf(buf + off, len - off, "rank %d: unknown; ", r);
        if (m < 0)
            break;
        off += (size_t)m;
    }
    if (res->nranks > 0 && off < len)
        snprintf(buf + off, len - off, "(%.0f ms)", res->elapsed_ms);
    return buf;
}

#ifndef MP_NO_MAIN
/* Criterion's own main, but with --jobs 1 unless the command line says
 * otherwise: several multi-rank jobs at once would share
 * two cores (deadline windows are part of the tests) and could take each
 * other's free ports. (collprog, a plain program, has its own main.) */
int main(int argc, char *argv[])
{
    struct criterion_test_set *tests = criterion_initialize();
    criterion_options.jobs = 1;
    int result = 0;
    if (criterion_handle_args(argc, argv, true))
        result = !criterion_run_all_tests(tests);
    criterion_finalize(tests);
    return result;
}
#endif
