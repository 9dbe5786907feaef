/* bench/tcp-bound: what plain TCP sockets over loopback can do on this host,
 * with no library in the way, as the bound weft's figures are read against.
 *
 *   tcp-bound lat [-n RANKS] [-i ITERS] [-r ROUNDS] [-s]
 *       8-byte latency of the two shapes an 8-byte all_reduce can take:
 *       "ring": n-1 dependent steps, each rank sending one message to the
 *       next rank and receiving one from the previous (weft's ring small
 *       all_reduce, a gather around the ring); "exchange": each rank sends
 *       one message to every other rank, then receives one from each (weft's
 *       mesh small all_reduce). Rounds alternate the two; the medians and
 *       their ratio are printed. Blocking reads by default (the reader
 *       sleeps in the kernel, as weft does after WEFT_SPIN_US); -s spins on
 *       non-blocking reads instead.
 *   tcp-bound stream [-n RANKS] [-b BYTES] [-i ITERS] [-r ROUNDS] [-s] [-R]
 *                    [-T] [-w WIRES]
 *       each rank streams BYTES to the next rank of a ring while receiving
 *       BYTES from the previous one, at once (non-blocking sockets, poll):
 *       the bytes per second each rank moves each way (-s: spinning on
 *       non-blocking calls, yielding the core between tries, instead of
 *       sleeping in poll()). A ring all_reduce
 *       moves 2(n-1)/n of its buffer each way per rank and reduces too, so
 *       its busbw cannot exceed this figure on the same host. -R: also
 *       adds (float32) the first half of the received bytes into a buffer
 *       of the rank's as they come, the reductions of a ring all_reduce's
 *       reduce-scatter, so that the figure bounds a ring all_reduce with
 *       its arithmetic (a rank per core has no other core for it). -T:
 *       a second thread of each rank sends while the first receives (and
 *       reduces, with -R), as where a library's I/O is split over two
 *       threads; without it one thread does both, as weft's progress does.
 *       -w: WIRES connections to each neighbour (default 1), each carrying
 *       its own contiguous part of the BYTES, as weft's WEFT_WIRES splits
 *       a frame's chunks; one thread, or two with -T, serves them all.
 *
 * Every rank is a process (fork); connections are TCP over 127.0.0.1 with
 * TCP_NODELAY and the socket buffers weft asks for. Writes to stdout only
 * from rank 0. Exits non-zero if anything fails. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define MAXR 64

static int nranks = 4, iters = 2000, rounds = 5, spin, reduce, two_threads;
static int nwires = 1; /* -w: connections to each neighbour (stream) */
static long long bytes = 16LL << 20, chunk = 256 << 10;
static int sockbuf = 4 << 20;

static void die(const char *what)
{
    fprintf(stderr, "tcp-bound: %s: %s\n", what, strerror(errno));
    exit(1);
}

static double now_s(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

static void tune(int fd)
{
    int one = 1, buf = sockbuf;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &buf, sizeof buf);
    setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &buf, sizeof buf);
}

/* Listening sockets made before fork, so every rank knows every port. */
static int lfd[MAXR];
static struct sockaddr_in laddr[MAXR];

static void listen_all(void)
{
    for (int r = 0; r < nranks; r++) {
        socklen_t len = sizeof laddr[r];
        if ((lfd[r] = socket(AF_INET, SOCK_STREAM, 0)) < 0)
            die("socket");
        memset(&laddr[r], 0, sizeof laddr[r]);
        laddr[r].sin_family = AF_INET;
        laddr[r].sin_addr.s_addr = htonl(INADDR_LOOPBACK);
        if (bind(lfd[r], (struct sockaddr *)&laddr[r], sizeof laddr[r]) != 0 ||
            listen(lfd[r], SOMAXCONN) != 0 ||
            getsockname(lfd[r], (struct sockaddr *)&laddr[r], &len) != 0)
            die("bind/listen");
    }
}

/* fd[p * nwires + k]: this rank's k-th connection to rank p (lat: one
 * each); the lower rank connects and sends its rank number and k first. */
static void connect_all(int me, int fd[], int wires)
{
    for (int p = me + 1; p < nranks; p++)
        for (int k = 0; k < wires; k++) {
            int s = socket(AF_INET, SOCK_STREAM, 0), hello[2] = {me, k};
            if (s < 0)
                die("socket");
            tune(s);
            while (connect(s, (struct sockaddr *)&laddr[p], sizeof laddr[p]) !=
                   0)
                if (errno != EINTR)
                    die("connect");
            if (write(s, hello, sizeof hello) != sizeof hello)
                die("write");
            fd[p * wires + k] = s;
        }
    for (int n = 0; n < me * wires; n++) {
        int s = accept(lfd[me], NULL, NULL), hello[2];
        if (s < 0)
            die("accept");
        tune(s);
        if (read(s, hello, sizeof hello) != sizeof hello || hello[0] < 0 ||
            hello[0] >= me || hello[1] < 0 || hello[1] >= wires)
            die("handshake");
        fd[hello[0] * wires + hello[1]] = s;
    }
    for (int r = 0; r < nranks; r++)
        close(lfd[r]);
}

static void put_all(int fd, const void *buf, size_t len)
{
    const char *b = buf;
    while (len > 0) {
        ssize_t n = send(fd, b, len, MSG_NOSIGNAL);
        if (n < 0) {
            if (errno == EINTR || errno == EAGAIN)
                continue;
            die("send");
        }
        b += n;
        len -= (size_t)n;
    }
}

static void get_all(int fd, void *buf, size_t len)
{
    char *b = buf;
    while (len > 0) {
        ssize_t n = recv(fd, b, len, spin ? MSG_DONTWAIT : 0);
        if (n < 0) {
            if (errno == EINTR || errno == EAGAIN)
                continue;
            die("recv");
        }
        if (n == 0) {
            fprintf(stderr, "tcp-bound: peer closed\n");
            exit(1);
        }
        b += n;
        len -= (size_t)n;
    }
}

/* fd[p * stride]: the connection to rank p it uses. */
static void exchange_once(int me, const int fd[], int stride, uint64_t *v)
{
    uint64_t in;
    for (int p = 0; p < nranks; p++)
        if (p != me)
            put_all(fd[p * stride], v, 8);
    for (int p = 0; p < nranks; p++)
        if (p != me) {
            get_all(fd[p * stride], &in, 8);
            *v += in;
        }
}

static void ring_once(int me, int fd[], uint64_t *v)
{
    int next = (me + 1) % nranks, prev = (me + nranks - 1) % nranks;
    uint64_t carry = *v, in;
    for (int s = 0; s < nranks - 1; s++) {
        put_all(fd[next], &carry, 8);
        get_all(fd[prev], &in, 8);
        *v += in;
        carry = in;
    }
}

static int cmp_d(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double median(double *v, int n)
{
    qsort(v, (size_t)n, sizeof *v, cmp_d);
    return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

static int rank_lat(int me)
{
    int fd[MAXR];
    uint64_t v = (uint64_t)me + 1;
    double ring[64], exch[64];

    connect_all(me, fd, 1);
    for (int r = 0; r < rounds; r++) {
        for (int shape = 0; shape < 2; shape++) {
            double t0;
            for (int w = 0; w < iters / 10 + 1; w++) /* warm-up */
                shape ? exchange_once(me, fd, 1, &v) : ring_once(me, fd, &v);
            exchange_once(me, fd, 1, &v); /* start together */
            t0 = now_s();
            for (int i = 0; i < iters; i++)
                shape ? exchange_once(me, fd, 1, &v) : ring_once(me, fd, &v);
            (shape ? exch : ring)[r] = (now_s() - t0) / iters * 1e6;
        }
        if (me == 0)
            printf("round %d: ring %.1f us, exchange %.1f us\n", r + 1, ring[r],
                   exch[r]);
    }
    if (me == 0) {
        double mr = median(ring, rounds), me_ = median(exch, rounds);
        printf("ranks %d, %s reads, %d iterations, median of %d rounds:\n"
               "  ring (n-1 steps)        %8.1f us\n"
               "  exchange (n-1 messages) %8.1f us\n"
               "  exchange / ring         %8.2f\n",
               nranks, spin ? "spinning" : "blocking", iters, rounds, mr, me_,
               me_ / mr);
    }
    return 0;
}

#define MAXW 8 /* -w's most */

/* The part of the stream wire k carries: [wire_lo(k), wire_lo(k + 1)). */
static long long wire_lo(int k)
{
    return bytes / nwires * k + (k < nwires ? 0 : bytes % nwires);
}

/* -R: acc[i] += the received float i, for the floats of the first half
 * of wire k's part that arrived whole since the last call (*done of them
 * already added): half the bytes in all, as a ring's reduce-scatter. */
static void reduce_arrived(float *acc, const char *rbuf, int k, long long got,
                           long long *done)
{
    long long lo = wire_lo(k), half = (wire_lo(k + 1) - lo) / 2;
    long long upto = (got < half ? got : half) / 4;

    for (long long i = *done; i < upto; i++) {
        float f;
        memcpy(&f, rbuf + lo + i * 4, sizeof f);
        acc[lo / 4 + i] += f;
    }
    if (upto > *done)
        *done = upto;
}

/* Streams `bytes` to out[] while taking `bytes` from in[], wire k its
 * own part; out == NULL (or in == NULL): that half is someone else's
 * (-T). */
static void stream_once(const int *out, const int *in, const char *sbuf,
                        char *rbuf, float *acc)
{
    long long sent[MAXW], got[MAXW], reduced[MAXW];
    struct pollfd pf[2 * MAXW];
    int left = 0;

    for (int k = 0; k < nwires; k++) {
        long long len = wire_lo(k + 1) - wire_lo(k);
        sent[k] = out == NULL ? len : 0;
        got[k] = in == NULL ? len : 0;
        reduced[k] = 0;
        left += (sent[k] < len) + (got[k] < len);
    }
    while (left > 0) {
        int n = 0;
        for (int k = 0; k < nwires; k++) {
            long long len = wire_lo(k + 1) - wire_lo(k);
            if (sent[k] < len)
                pf[n++] = (struct pollfd){.fd = out[k], .events = POLLOUT};
            if (got[k] < len)
                pf[n++] = (struct pollfd){.fd = in[k], .events = POLLIN};
        }
        /* Spinning: try every socket again at once, giving the core away
         * in between (the peer may need it); else sleep in poll(). */
        if (spin)
            sched_yield();
        else if (poll(pf, (nfds_t)n, 10000) <= 0)
            die("poll");
        for (int k = 0; k < nwires; k++) {
            long long lo = wire_lo(k), len = wire_lo(k + 1) - lo;
            if (sent[k] < len) {
                long long want = len - sent[k] < chunk ? len - sent[k] : chunk;
                ssize_t x = send(out[k], sbuf + lo + sent[k], (size_t)want,
                                 MSG_NOSIGNAL | MSG_DONTWAIT);
                if (x > 0) {
                    sent[k] += x;
                    left -= sent[k] == len;
                } else if (x < 0 && errno != EAGAIN && errno != EINTR)
                    die("send");
            }
            if (got[k] < len) {
                long long want = len - got[k] < chunk ? len - got[k] : chunk;
                ssize_t x =
                    recv(in[k], rbuf + lo + got[k], (size_t)want, MSG_DONTWAIT);
                if (x > 0) {
                    got[k] += x;
                    left -= got[k] == len;
                    if (acc != NULL)
                        reduce_arrived(acc, rbuf, k, got[k], &reduced[k]);
                } else if (x == 0) {
                    fprintf(stderr, "tcp-bound: peer closed\n");
                    exit(1);
                } else if (errno != EAGAIN && errno != EINTR)
                    die("recv");
            }
        }
    }
}

/* -T: the sending half on a thread of its own. */
struct sender {
    const int *out;
    const char *sbuf;
};

static void *send_all(void *arg)
{
    const struct sender *sd = arg;

    stream_once(sd->out, NULL, sd->sbuf, NULL, NULL);
    return NULL;
}

static void stream_once_split(const int *out, const int *in, const char *sbuf,
                              char *rbuf, float *acc)
{
    struct sender sd = {out, sbuf};
    pthread_t th;

    if ((errno = pthread_create(&th, NULL, send_all, &sd)) != 0)
        die("pthread_create");
    stream_once(NULL, in, NULL, rbuf, acc);
    pthread_join(th, NULL);
}

static int rank_stream(int me)
{
    int fd[MAXR * MAXW], next = (me + 1) % nranks,
                         prev = (me + nranks - 1) % nranks;
    char *sbuf = malloc((size_t)bytes), *rbuf = malloc((size_t)bytes);
    float *acc = reduce ? calloc((size_t)bytes / 4 + 1, sizeof *acc) : NULL;
    double gbs[64];
    uint64_t v = 0;

    if (sbuf == NULL || rbuf == NULL || (reduce && acc == NULL))
        die("malloc");
    memset(sbuf, 1, (size_t)bytes);
    memset(rbuf, 0, (size_t)bytes);
    connect_all(me, fd, nwires);
    for (int r = 0; r < rounds; r++) {
        const int *out = fd + next * nwires, *in = fd + prev * nwires;
        double t0;
        void (*once)(const int *, const int *, const char *, char *, float *) =
            two_threads ? stream_once_split : stream_once;

        once(out, in, sbuf, rbuf, acc);    /* warm-up */
        exchange_once(me, fd, nwires, &v); /* start together */
        t0 = now_s();
        for (int i = 0; i < iters; i++)
            once(out, in, sbuf, rbuf, acc);
        gbs[r] = (double)bytes * iters / (now_s() - t0) / 1e9;
        if (me == 0)
            printf("round %d: %.2f GB/s each way per rank\n", r + 1, gbs[r]);
    }
    if (me == 0)
        printf("ranks %d, %lld bytes, %d iterations, median of %d rounds: "
               "%.2f GB/s each way per rank%s%s%s\n",
               nranks, bytes, iters, rounds, median(gbs, rounds),
               reduce ? " (half reduced)" : "",
               two_threads ? " (sending on a second thread)" : "",
               nwires > 1 ? " (several connections per neighbour)" : "");
    free(acc);
    free(sbuf);
    free(rbuf);
    return 0;
}

static long long parse_size(const char *s)
{
    char *end;
    long long v = strtoll(s, &end, 10);
    if (*end == 'K' || *end == 'k')
        v <<= 10, end++;
    else if (*end == 'M' || *end == 'm')
        v <<= 20, end++;
    else if (*end == 'G' || *end == 'g')
        v <<= 30, end++;
    if (*end != '\0' || v <= 0) {
        fprintf(stderr, "tcp-bound: bad size '%s'\n", s);
        exit(2);
    }
    return v;
}

int main(int argc, char **argv)
{
    int stream, opt, status = 0;
    pid_t pid[MAXR];

    if (argc < 2 ||
        (strcmp(argv[1], "lat") != 0 && strcmp(argv[1], "stream") != 0)) {
        fprintf(stderr, "usage: tcp-bound lat|stream [-n RANKS] [-i ITERS] "
                        "[-r ROUNDS] [-b BYTES] [-s] [-R] [-T] [-w WIRES]\n");
        return 2;
    }
    stream = strcmp(argv[1], "stream") == 0;
    if (stream)
        iters = 10;
    optind = 2;
    while ((opt = getopt(argc, argv, "n:i:r:b:c:B:sRTw:")) != -1) {
        switch (opt) {
        case 'n':
            nranks = atoi(optarg);
            break;
        case 'i':
            iters = atoi(optarg);
            break;
        case 'r':
            rounds = atoi(optarg);
            break;
        case 'b':
            bytes = parse_size(optarg);
            break;
        case 'c':
            chunk = parse_size(optarg);
            break;
        case 'B':
            sockbuf = (int)parse_size(optarg);
            break;
        case 's':
            spin = 1;
            break;
        case 'R':
            reduce = 1;
            break;
        case 'T':
            two_threads = 1;
            break;
        case 'w':
            nwires = atoi(optarg);
            break;
        default:
            return 2;
        }
    }
    if (nranks < 2 || nranks > MAXR || iters < 1 || rounds < 1 || rounds > 64 ||
        nwires < 1 || nwires > MAXW) {
        fprintf(stderr,
                "tcp-bound: want 2 <= RANKS <= %d, ITERS >= 1, "
                "1 <= ROUNDS <= 64, 1 <= WIRES <= %d\n",
                MAXR, MAXW);
        return 2;
    }
    setvbuf(stdout, NULL, _IOLBF, 0);
    listen_all();
    for (int r = 0; r < nranks; r++) {
        if ((pid[r] = fork()) < 0)
            die("fork");
        if (pid[r] == 0) {
            alarm(600); /* never hang: SIGALRM ends a stuck rank */
            exit(stream ? rank_stream(r) : rank_lat(r));
        }
    }
    for (int r = 0; r < nranks; r++) {
        int st;
        if (waitpid(pid[r], &st, 0) < 0 || !WIFEXITED(st) ||
            WEXITSTATUS(st) != 0) {
            status = 1;
            for (int q = 0; q < nranks; q++)
                kill(pid[q], SIGKILL);
        }
    }
    if (status != 0)
        fprintf(stderr, "tcp-bound: a rank failed\n");
    return status;
}
