/*
 * A weft program for launcher tests: runs all_reduces and, in one rank,
 * fails in the middle in the way argv[1] asks ("exit": _exit(7) without
 * finalize; "stop": SIGSTOP itself; "ok": nothing). Ranks whose operation
 * fails print the error and exit 3, as a real program would.
 *
 * "loop S [COUNT [trace]]": all_reduces of COUNT floats (default 64 Ki),
 * checked, for S seconds, for the
 * multi-host fault tests: prints "ready" once connected, and on a failure
 * "FAILED <code> <ms>" (ms since the last operation that succeeded) and
 * the message, then exits 3; at the end "done <calls> <ms>", ms the
 * longest time between two calls' ends (bench/failover's stall), then
 * "wires to <peer>: total T up U lost L back B" (weft_peer_wires); with
 * "trace", rank 0 first prints "call <end> <ms>" for each call (its end,
 * CLOCK_REALTIME in ms, and its time).
 *
 * "pairs": send/recv between every ordered pair of ranks (1 B, 1000 B,
 * 1 MiB + 3 B), checked, a barrier after each; across hosts without a
 * cable between them the messages are relayed. "pairs S": the same over
 * and over for S seconds (rank 0's clock), printing "ready" first.
 *
 * "shrink V": rank V leaves and the others go on without it
 * (weft_comm_shrink), checked.
 *
 * "abort" exercises weft_abort() from a second thread (CI runs it under
 * ThreadSanitizer): the other ranks stay away from rank 0's all_reduce
 * until it was aborted, and all exit 0 when the outcome is the documented
 * one.
 */
#include <weft.h>

#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static void *abort_later(void *arg)
{
    struct timespec ts = {0, 200 * 1000 * 1000};
    nanosleep(&ts, NULL);
    weft_abort(arg);
    return NULL;
}

/* Rank 0 blocks in an all_reduce that the victim never joins, until a
 * second thread aborts it; the victim then sees the aborted rank go. */
static int abort_mode(weft_comm *c, int victim)
{
    float v = 1.0f;
    int rc;

    if (weft_rank(c) == 0) {
        pthread_t t;
        pthread_create(&t, NULL, abort_later, c);
        rc = weft_all_reduce(c, &v, &v, 1, WEFT_FLOAT32, WEFT_SUM);
        pthread_join(t, NULL);
        if (rc != WEFT_EABORTED || weft_barrier(c) != WEFT_EABORTED) {
            fprintf(stderr, "expected WEFT_EABORTED, got %s: %s\n",
                    weft_err_name(rc), weft_last_error(c));
            weft_finalize(c);
            return 1;
        }
        weft_finalize(c);
        return 0;
    }
    /* Every other rank keeps its wires open, without joining, well past
     * the abort (any operation would meet rank 0's all_reduce). */
    (void)victim;
    sleep(3);
    weft_finalize(c);
    return 0;
}

static double now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

static double wall_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

/* count floats per all_reduce; trace: rank 0 prints, at the end, when
 * each call ended (CLOCK_REALTIME, ms) and how long it took, for
 * bench/failover's throughput. */
static int loop_mode(weft_comm *c, int seconds, int N, int trace)
{
    /* Static: reachable at every exit (LeakSanitizer). */
    static float *v;
    static double *ends, *durs;
    double start = now_ms(), last = start, gap = 0;
    int n = weft_size(c), iter = 0, cap = 0;

    if ((v = malloc(sizeof *v * (size_t)N)) == NULL)
        return 1;

    printf("ready\n");
    fflush(stdout);
    for (;;) {
        /* Rank 0's clock decides when to stop, so all ranks stop together
         * (a rank that left first would look like a dead peer). */
        int go = now_ms() - start < seconds * 1000.0, rc;

        rc = weft_broadcast(c, &go, 1, WEFT_INT32, 0);
        if (rc == WEFT_OK && !go)
            break;
        for (int k = 0; k < N; k++)
            v[k] = (float)((weft_rank(c) + k + iter) % 7);
        double t0 = now_ms();
        if (rc == WEFT_OK)
            rc = weft_all_reduce(c, v, v, (size_t)N, WEFT_FLOAT32, WEFT_SUM);
        if (rc == WEFT_OK && trace && weft_rank(c) == 0) {
            if (iter >= cap) {
                cap = cap ? 2 * cap : 1024;
                ends = realloc(ends, sizeof *ends * (size_t)cap);
                durs = realloc(durs, sizeof *durs * (size_t)cap);
                if (ends == NULL || durs == NULL)
                    return 1;
            }
            ends[iter] = wall_ms();
            durs[iter] = now_ms() - t0;
        }
        if (rc != WEFT_OK) {
            printf("FAILED %s %.0f\n", weft_err_name(rc), now_ms() - last);
            printf("%s\n", weft_last_error(c));
            fflush(stdout);
            weft_finalize(c);
            return 3;
        }
        for (int k = 0; k < N; k++) {
            float want = 0;
            for (int r = 0; r < n; r++)
                want += (float)((r + k + iter) % 7);
            if (v[k] != want) {
                printf("WRONG at %d: %g, want %g\n", k, v[k], want);
                weft_finalize(c);
                return 4;
            }
        }
        if (iter > 0 && now_ms() - last > gap)
            gap = now_ms() - last;
        last = now_ms();
        iter++;
    }
    for (int i = 0; trace && weft_rank(c) == 0 && i < iter; i++)
        printf("call %.3f %.3f\n", ends[i], durs[i]);
    printf("done %d %.0f\n", iter, gap);
    if (n > 1) {
        /* The wires to the next rank, as weft_peer_wires counts them. */
        weft_wire_info wi;
        int peer = (weft_rank(c) + 1) % n;
        if (weft_peer_wires(c, peer, &wi) == WEFT_OK)
            printf("wires to %d: total %d up %d lost %u back %u\n", peer,
                   wi.total, wi.up, wi.lost, wi.back);
    }
    weft_finalize(c);
    return 0;
}

static int pairs_mode(weft_comm *c, int seconds)
{
    static const size_t sizes[] = {1, 1000, (1u << 20) + 3};
    int me = weft_rank(c), n = weft_size(c), bad = 0, go = 1, rounds = 0;
    unsigned char *buf = malloc(sizes[2]);
    double start = now_ms();

    if (buf == NULL)
        return 2;
    if (seconds > 0) {
        printf("ready\n");
        fflush(stdout);
    }
again:
    for (size_t z = 0; z < 3 && !bad; z++)
        for (int i = 0; i < n && !bad; i++)
            for (int j = 0; j < n && !bad; j++) {
                int rc = WEFT_OK;
                if (i == j)
                    continue;
                if (me == i) {
                    for (size_t k = 0; k < sizes[z]; k++)
                        buf[k] =
                            (unsigned char)(k * 7 + (size_t)i * 31 + (size_t)j);
                    rc = weft_send(c, buf, sizes[z], WEFT_UINT8, j);
                } else if (me == j) {
                    memset(buf, 0, sizes[z]);
                    rc = weft_recv(c, buf, sizes[z], WEFT_UINT8, i);
                    for (size_t k = 0; rc == WEFT_OK && k < sizes[z]; k++)
                        if (buf[k] != (unsigned char)(k * 7 + (size_t)i * 31 +
                                                      (size_t)j)) {
                            printf("WRONG %d->%d size %zu at %zu\n", i, j,
                                   sizes[z], k);
                            bad = 1;
                            break;
                        }
                }
                if (rc == WEFT_OK)
                    rc = weft_barrier(c);
                if (rc != WEFT_OK) {
                    printf("FAILED %d->%d size %zu: %s: %s\n", i, j, sizes[z],
                           weft_err_name(rc), weft_last_error(c));
                    bad = 1;
                }
            }
    rounds++;
    if (!bad && seconds > 0) {
        go = now_ms() - start < seconds * 1000.0;
        if (weft_broadcast(c, &go, 1, WEFT_INT32, 0) != WEFT_OK) {
            printf("FAILED broadcast: %s\n", weft_last_error(c));
            bad = 1;
        } else if (go)
            goto again;
    }
    free(buf);
    if (!bad && seconds > 0)
        printf("done pairs %d\n", rounds);
    else if (!bad)
        printf("done pairs\n");
    weft_finalize(c);
    return bad ? 3 : 0;
}

/* "shrinkrun V S": as "shrink V", then all_reduces (checked) on the
 * shrunk communicator for S seconds: "ran N all_reduces ...".
 *
 * "shrink V [V2]": rank V exits (no finalize, as a killed process) after
 * a barrier, and rank V2 as the others start to shrink (after its
 * all_reduce failed); the others see their all_reduce fail, shrink, and
 * check an all_reduce and a sendrecv ring on the ranks left: "shrunk
 * <rank> of <size> in <ms>" (ms from the failure to the first right
 * all_reduce), exit 0; or "FAILED ..." and exit 3. */
/* all_reduces of 256 KiB and 4 MiB on s, checked, for run_s seconds:
 * WEFT_OK or the failure (said). */
static int shrink_run(weft_comm *s, double run_s)
{
    enum { BIG = 1 << 20 };
    float *w = malloc(sizeof *w * BIG);
    int org = weft_comm_origin_rank(s, weft_rank(s)), sum = 0, calls = 0;
    int rc = w == NULL ? WEFT_ENOMEM : WEFT_OK;
    const double t0 = now_ms();

    for (int r = 0; r < weft_size(s); r++)
        sum += weft_comm_origin_rank(s, r) + 1;
    for (;;) {
        size_t n = calls % 2 ? BIG : BIG / 16;
        int32_t done = now_ms() - t0 >= run_s * 1000;

        /* Every rank stops after the same call. */
        if (rc == WEFT_OK)
            rc = weft_all_reduce(s, &done, &done, 1, WEFT_INT32, WEFT_MAX);
        if (rc != WEFT_OK || done)
            break;
        for (size_t k = 0; k < n; k++)
            w[k] = (float)((k + (size_t)calls) % 5 * (size_t)(org + 1));
        rc = weft_all_reduce(s, w, w, n, WEFT_FLOAT32, WEFT_SUM);
        for (size_t k = 0; rc == WEFT_OK && k < n; k++)
            if (w[k] != (float)((k + (size_t)calls) % 5 * (size_t)sum)) {
                printf("FAILED: all_reduce %d on the shrunk communicator: "
                       "[%zu] = %g\n",
                       calls, k, w[k]);
                rc = WEFT_EINVAL;
            }
        calls++;
    }
    if (rc != WEFT_OK && rc != WEFT_EINVAL)
        printf("FAILED: all_reduce %d on the shrunk communicator: %s\n", calls,
               weft_last_error(s));
    else if (rc == WEFT_OK)
        printf("ran %d all_reduces on the shrunk communicator, checked\n",
               calls);
    free(w);
    return rc;
}

/* The median time of rounds all_reduces of bytes on c (after one not
 * timed), as busbw in MB/s (2 (n-1)/n bytes per rank a call, the ring's
 * traffic); -1 on a failure (said). */
static double busbw(weft_comm *c, size_t bytes, int rounds)
{
    size_t n = bytes / sizeof(float);
    float *w = calloc(n, sizeof *w);
    double *t = calloc((size_t)rounds, sizeof *t), med;
    int m = weft_size(c);

    for (int i = -1; w != NULL && t != NULL && i < rounds; i++) {
        double t0 = now_ms();
        if (weft_all_reduce(c, w, w, n, WEFT_FLOAT32, WEFT_SUM) != WEFT_OK) {
            printf("FAILED: all_reduce: %s\n", weft_last_error(c));
            free(w);
            free(t);
            return -1;
        }
        if (i >= 0)
            t[i] = now_ms() - t0;
    }
    for (int i = 0; t != NULL && i < rounds; i++) /* insertion sort */
        for (int j = i; j > 0 && t[j] < t[j - 1]; j--) {
            double x = t[j];
            t[j] = t[j - 1];
            t[j - 1] = x;
        }
    med = t != NULL && w != NULL ? t[rounds / 2] : 0;
    free(w);
    free(t);
    return med > 0 ? 2.0 * (m - 1) / m * (double)bytes / (med * 1e3) : -1;
}

/* "shrinkbw V BYTES ROUNDS": all_reduce's busbw on c, then rank V leaves,
 * the others shrink, and the same on the shrunk communicator:
 * "busbw before X after Y MB/s" (rank 0). */
static int shrinkbw_mode(weft_comm *c, int victim, size_t bytes, int rounds)
{
    double before = busbw(c, bytes, rounds), after;
    int one = 1;
    weft_comm *s = NULL;

    if (before < 0 || weft_barrier(c) != WEFT_OK)
        return 3;
    if (weft_rank(c) == victim)
        _exit(0);
    if (weft_all_reduce(c, &one, &one, 1, WEFT_INT32, WEFT_SUM) == WEFT_OK) {
        printf("FAILED: all_reduce succeeded without rank %d\n", victim);
        return 3;
    }
    if (weft_comm_shrink(c, &s) != WEFT_OK) {
        printf("FAILED shrink: %s\n", weft_last_error(NULL));
        weft_finalize(c);
        return 3;
    }
    after = busbw(s, bytes, rounds);
    if (after >= 0 && weft_rank(s) == 0)
        printf("busbw before %.1f after %.1f MB/s (%d then %d ranks)\n", before,
               after, weft_size(c), weft_size(s));
    weft_finalize(s);
    weft_finalize(c);
    return after < 0 ? 3 : 0;
}

static int shrink_mode(weft_comm *c, int victim, int victim2, double run_s)
{
    int n = weft_size(c), me = weft_rank(c), rc;
    float v[4096];
    weft_comm *s = NULL;
    double t0, took;

    if (weft_barrier(c) != WEFT_OK) {
        printf("FAILED barrier: %s\n", weft_last_error(c));
        return 3;
    }
    printf("ready\n");
    fflush(stdout);
    if (me == victim)
        _exit(0);
    for (int k = 0; k < 4096; k++)
        v[k] = 1;
    t0 = now_ms();
    rc = weft_all_reduce(c, v, v, 4096, WEFT_FLOAT32, WEFT_SUM);
    if (rc == WEFT_OK) {
        printf("FAILED: all_reduce succeeded without rank %d\n", victim);
        return 3;
    }
    printf("failed as it should after %.0f ms: %s\n", now_ms() - t0,
           weft_last_error(c));
    t0 = now_ms();
    fflush(stdout);
    if (me == victim2)
        _exit(0);
    if ((rc = weft_comm_shrink(c, &s)) != WEFT_OK) {
        printf("FAILED shrink %s: %s\n", weft_err_name(rc),
               weft_last_error(NULL));
        weft_finalize(c);
        return 3;
    }
    for (int k = 0; k < 4096; k++)
        v[k] = (float)(weft_comm_origin_rank(s, weft_rank(s)) + k % 5);
    rc = weft_all_reduce(s, v, v, 4096, WEFT_FLOAT32, WEFT_SUM);
    for (int k = 0; rc == WEFT_OK && k < 4096; k++) {
        float want = 0;
        for (int r = 0; r < weft_size(s); r++)
            want += (float)(weft_comm_origin_rank(s, r) + k % 5);
        if (v[k] != want) {
            printf("FAILED: all_reduce on the shrunk communicator: [%d] = "
                   "%g, want %g\n",
                   k, v[k], want);
            rc = WEFT_EINVAL;
        }
    }
    took = now_ms() - t0;
    /* Bigger: many frames on every wire (around a ring of hosts left a
     * chain, the step between its ends runs through the hosts between). */
    if (rc == WEFT_OK) {
        enum { BIG = 1 << 20 };
        float *w = malloc(sizeof *w * BIG);
        int org = weft_comm_origin_rank(s, weft_rank(s)), sum = 0;

        for (int r = 0; r < weft_size(s); r++)
            sum += weft_comm_origin_rank(s, r);
        for (int k = 0; w != NULL && k < BIG; k++)
            w[k] = (float)((k % 7) * (org + 1));
        rc = w == NULL ? WEFT_ENOMEM
                       : weft_all_reduce(s, w, w, BIG, WEFT_FLOAT32, WEFT_SUM);
        for (int k = 0; rc == WEFT_OK && k < BIG; k++)
            if (w[k] != (float)((k % 7) * (sum + weft_size(s)))) {
                printf("FAILED: 4 MiB all_reduce on the shrunk communicator: "
                       "[%d] = %g, want %g\n",
                       k, w[k], (double)((k % 7) * (sum + weft_size(s))));
                rc = WEFT_EINVAL;
            }
        free(w);
    }
    /* A ring of send/recv (a survivor alone has no peer to send to). */
    if (rc == WEFT_OK && weft_size(s) > 1) {
        int m = weft_size(s), r = weft_rank(s), got = -1;
        int mine = weft_comm_origin_rank(s, r);
        rc = weft_sendrecv(s, &mine, (r + 1) % m, &got, (r + m - 1) % m, 1,
                           WEFT_INT32);
        if (rc == WEFT_OK && got != weft_comm_origin_rank(s, (r + m - 1) % m))
            rc = WEFT_EINVAL;
    }
    /* The ranks left, in their old order (the victim, and any rank that
     * could not take part, left out). */
    for (int r = 1; rc == WEFT_OK && r < weft_size(s); r++)
        if (weft_comm_origin_rank(s, r) <= weft_comm_origin_rank(s, r - 1))
            rc = WEFT_EINVAL;
    if (rc != WEFT_OK || weft_size(s) > n - (victim2 >= 0 ? 2 : 1) ||
        weft_comm_origin_rank(s, weft_rank(s)) != me) {
        printf("FAILED on the shrunk communicator (%d of %d): %s: %s\n",
               weft_rank(s), weft_size(s), weft_err_name(rc),
               weft_last_error(s));
        weft_finalize(s);
        weft_finalize(c);
        return 3;
    }
    printf("shrunk %d of %d in %.1f ms\n", weft_rank(s), weft_size(s), took);
    fflush(stdout);
    if (run_s > 0 && shrink_run(s, run_s) != WEFT_OK) {
        weft_finalize(s);
        weft_finalize(c);
        return 3;
    }
    weft_finalize(s);
    weft_finalize(c);
    return 0;
}

/* "leaving V ROUNDS": ROUNDS times, on the communicator of the round
 * before (first c), rank V shrinks it 300 ms after a barrier, which
 * closes its wires, while rank V+1 sends to it, message after message
 * (64 KiB to 4 MiB, by round), that it never receives: the bytes it has
 * not read make its close a reset on their wires, the others end
 * cleanly, and rank V+1's writes meet the reset. Every other rank waits
 * to receive from V. Each rank but V sees its send or receive fail, says
 * "noticed rank V leave after N ms" (from the barrier's end + 300 ms)
 * and shrinks too; every rank checks an all_reduce on the communicator
 * they form, all of them in it: "round R: shrunk <rank> of <size>". */
static int leaving_mode(weft_comm *c, int victim, int rounds)
{
    enum { BIG = 1 << 20 }; /* floats */
    float *big = calloc(BIG, sizeof *big);
    weft_comm *cur = c;
    int rc = big == NULL ? WEFT_ENOMEM : WEFT_OK;

    for (int round = 0; rc == WEFT_OK && round < rounds; round++) {
        int me = weft_rank(cur), n = weft_size(cur), got = 0, sum = 0, v;
        size_t count = (size_t)BIG >> (2 * (3 - round % 4));
        weft_comm *s = NULL;
        double t0;

        if ((rc = weft_barrier(cur)) != WEFT_OK) {
            printf("FAILED round %d: barrier: %s\n", round,
                   weft_last_error(cur));
            break;
        }
        t0 = now_ms() + 300;
        if (me == victim) {
            struct timespec ts = {0, 300 * 1000 * 1000};
            nanosleep(&ts, NULL);
        } else {
            if (me == (victim + 1) % n)
                while ((rc = weft_send(cur, big, count, WEFT_FLOAT32,
                                       victim)) == WEFT_OK &&
                       now_ms() < t0 + 10000)
                    ;
            else
                rc = weft_recv(cur, &got, 1, WEFT_INT32, victim);
            if (rc == WEFT_OK) {
                printf("FAILED round %d: rank %d left, and a send or "
                       "receive with it still succeeded\n",
                       round, victim);
                rc = WEFT_EINVAL;
                break;
            }
            printf("noticed rank %d leave after %.0f ms: %s\n", victim,
                   now_ms() - t0, weft_last_error(cur));
        }
        fflush(stdout);
        if ((rc = weft_comm_shrink(cur, &s)) != WEFT_OK) {
            printf("FAILED round %d: shrink %s: %s\n", round, weft_err_name(rc),
                   weft_last_error(NULL));
            break;
        }
        if (cur != c)
            weft_finalize(cur);
        cur = s;
        v = weft_comm_origin_rank(s, weft_rank(s)) + 1;
        rc = weft_all_reduce(s, &v, &sum, 1, WEFT_INT32, WEFT_SUM);
        if (rc == WEFT_OK && (weft_size(s) != n || sum != n * (n + 1) / 2))
            rc = WEFT_EINVAL;
        if (rc != WEFT_OK) {
            printf("FAILED round %d: on the shrunk communicator (%d of %d, "
                   "sum %d): %s\n",
                   round, weft_rank(s), weft_size(s), sum, weft_last_error(s));
            break;
        }
        printf("round %d: shrunk %d of %d\n", round, weft_rank(s),
               weft_size(s));
        fflush(stdout);
    }
    if (cur != c)
        weft_finalize(cur);
    weft_finalize(c);
    free(big);
    return rc == WEFT_OK ? 0 : 3;
}

int main(int argc, char **argv)
{
    const char *mode = argc > 1 ? argv[1] : "ok";
    int victim = argc > 2 ? atoi(argv[2]) : 1;
    float buf[1024];
    weft_comm *c;
    int rc;

    if ((rc = weft_init(&c)) != WEFT_OK) {
        fprintf(stderr, "init: %s: %s\n", weft_err_name(rc),
                weft_last_error(NULL));
        return 2;
    }
    if (strcmp(mode, "abort") == 0)
        return abort_mode(c, victim);
    if (strcmp(mode, "pairs") == 0)
        return pairs_mode(c, argc > 2 ? atoi(argv[2]) : 0);
    if (strcmp(mode, "shrink") == 0)
        return shrink_mode(c, victim, argc > 3 ? atoi(argv[3]) : -1, 0);
    if (strcmp(mode, "shrinkbw") == 0)
        return shrinkbw_mode(c, victim,
                             argc > 3 ? (size_t)atol(argv[3]) : 1u << 24,
                             argc > 4 ? atoi(argv[4]) : 5);
    if (strcmp(mode, "leaving") == 0)
        return leaving_mode(c, victim, argc > 3 ? atoi(argv[3]) : 3);
    if (strcmp(mode, "shrinkrun") == 0)
        return shrink_mode(c, victim, -1, argc > 3 ? atof(argv[3]) : 5);
    if (strcmp(mode, "loop") == 0)
        return loop_mode(c, argc > 2 ? atoi(argv[2]) : 10,
                         argc > 3 ? atoi(argv[3]) : 65536,
                         argc > 4 && strcmp(argv[4], "trace") == 0);
    for (int i = 0; i < 10; i++) {
        if (i == 5 && weft_rank(c) == victim) {
            if (strcmp(mode, "exit") == 0)
                _exit(7);
            if (strcmp(mode, "stop") == 0)
                raise(SIGSTOP);
        }
        for (int k = 0; k < 1024; k++)
            buf[k] = (float)(weft_rank(c) + k);
        rc = weft_all_reduce(c, buf, buf, 1024, WEFT_FLOAT32, WEFT_SUM);
        if (rc != WEFT_OK) {
            fprintf(stderr, "all_reduce %d: %s: %s\n", i, weft_err_name(rc),
                    weft_last_error(c));
            weft_finalize(c);
            return 3;
        }
    }
    printf("done\n");
    weft_finalize(c);
    return 0;
}
