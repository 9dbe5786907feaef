/*
 * bench/overlap-rank: one rank of bench/overlap; run it under weftrun.
 *
 *   weftrun -n 4 -- bench/overlap-rank [--bytes B] [--reps R] [--batch N]
 *                                      [--batch-bytes S]
 *
 * Measures, each as the slowest rank's time per repetition, the median over
 * R repetitions (default 15), float32 sum:
 *   comm       a blocking all_reduce of B bytes (default 4 MiB);
 *   compute    a fixed loop calibrated on each rank to take about `comm`;
 *   overlap    an iall_reduce of B bytes posted, the loop, then the wait;
 *              ratio = overlap / max(comm, compute), target <= 1.2;
 *   loaded     the blocking all_reduce while a second thread of the rank
 *              runs the loop: the same load on the cores as overlap with
 *              nothing asked of weft's progress thread, so overlap / loaded
 *              is what weft adds to what the host's cores allow;
 *   blocking   N (default 64) blocking all_reduces of S bytes (4 KiB);
 *   posted     the same N posted with weft_iall_reduce, then one
 *              weft_wait_all; ratio = posted / blocking, target <= 0.5.
 * Rank 0 prints one "name value" line per figure (times in us), then
 * checks that the posted results equal the blocking ones bit for bit.
 * Exit status 0, or 1 when a weft call failed or a result differed.
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <weft.h>

static double now_us(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e6 + (double)ts.tv_nsec / 1e3;
}

static volatile double sink;

/* The computation: a dependent chain of multiply-adds, in registers, so
 * its time per iteration is fixed and it leaves memory to the transfers. */
static void compute(uint64_t iters)
{
    double x = 1.0;

    for (uint64_t i = 0; i < iters; i++)
        x = x * 1.0000001 + 1e-7;
    sink = x;
}

static void *compute_thread(void *arg)
{
    compute(*(const uint64_t *)arg);
    return NULL;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double median(double *v, int n)
{
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

static int check(int rc, const char *what)
{
    if (rc != WEFT_OK) {
        fprintf(stderr, "overlap-rank: %s: %s: %s\n", what, weft_err_name(rc),
                weft_last_error(NULL));
        exit(1);
    }
    return rc;
}

/* The slowest rank's figure. */
static double slowest(weft_comm *c, double t)
{
    check(weft_all_reduce(c, &t, &t, 1, WEFT_FLOAT64, WEFT_MAX), "max");
    return t;
}

static size_t parse_size(const char *s)
{
    char *end;
    unsigned long long v = strtoull(s, &end, 10);

    if (*end == 'K')
        v <<= 10;
    else if (*end == 'M')
        v <<= 20;
    return (size_t)v;
}

int main(int argc, char **argv)
{
    size_t bytes = 4u << 20, sbytes = 4096;
    int reps = 15, nb = 64, me, bad = 0;
    weft_comm *c;

    for (int i = 1; i + 1 < argc; i += 2) {
        if (strcmp(argv[i], "--bytes") == 0)
            bytes = parse_size(argv[i + 1]);
        else if (strcmp(argv[i], "--reps") == 0)
            reps = atoi(argv[i + 1]);
        else if (strcmp(argv[i], "--batch") == 0)
            nb = atoi(argv[i + 1]);
        else if (strcmp(argv[i], "--batch-bytes") == 0)
            sbytes = parse_size(argv[i + 1]);
        else {
            fprintf(stderr, "overlap-rank: unknown flag %s\n", argv[i]);
            return 2;
        }
    }
    if (reps < 1 || nb < 1 || bytes < 4 || sbytes < 4) {
        fprintf(stderr, "overlap-rank: bad sizes\n");
        return 2;
    }
    check(weft_init(&c), "weft_init");
    me = weft_rank(c);

    size_t n = bytes / 4, sn = sbytes / 4;
    float *in = malloc(bytes), *out = malloc(bytes);
    float *sin = malloc(sbytes * (size_t)nb), *sb = malloc(sbytes * (size_t)nb),
          *sp = malloc(sbytes * (size_t)nb);
    weft_request **reqs = calloc((size_t)nb, sizeof *reqs);
    double *comm = calloc((size_t)reps, sizeof(double)),
           *comp = calloc((size_t)reps, sizeof(double)),
           *ovl = calloc((size_t)reps, sizeof(double)),
           *ldd = calloc((size_t)reps, sizeof(double)),
           *blk = calloc((size_t)reps, sizeof(double)),
           *pst = calloc((size_t)reps, sizeof(double));

    if (!in || !out || !sin || !sb || !sp || !reqs || !comm || !comp || !ovl ||
        !ldd || !blk || !pst) {
        fprintf(stderr, "overlap-rank: out of memory\n");
        return 1;
    }
    for (size_t i = 0; i < n; i++)
        in[i] = (float)((i + (size_t)me) % 17);
    for (size_t i = 0; i < sn * (size_t)nb; i++)
        sin[i] = (float)((i * 7 + (size_t)me) % 13) * 0.25f;

    /* Warm-up: connections, scratch, the progress thread. */
    for (int i = 0; i < 3; i++) {
        weft_request *r;

        check(weft_all_reduce(c, in, out, n, WEFT_FLOAT32, WEFT_SUM), "warm");
        check(weft_iall_reduce(c, in, out, n, WEFT_FLOAT32, WEFT_SUM, &r),
              "warm");
        check(weft_wait(r), "warm");
        weft_request_free(r);
    }

    /* comm alone, then the loop calibrated to it. */
    for (int k = 0; k < reps; k++) {
        double t0;

        check(weft_barrier(c), "barrier");
        t0 = now_us();
        check(weft_all_reduce(c, in, out, n, WEFT_FLOAT32, WEFT_SUM),
              "all_reduce");
        comm[k] = slowest(c, now_us() - t0);
    }
    double comm_us = median(comm, reps), per_iter;
    {
        uint64_t probe = 1u << 22;
        double t0 = now_us();

        compute(probe);
        per_iter = (now_us() - t0) / (double)probe;
    }
    uint64_t iters = (uint64_t)(comm_us / per_iter);

    for (int k = 0; k < reps; k++) {
        weft_request *r;
        double t0;

        check(weft_barrier(c), "barrier");
        t0 = now_us();
        compute(iters);
        comp[k] = slowest(c, now_us() - t0);

        check(weft_barrier(c), "barrier");
        t0 = now_us();
        check(weft_iall_reduce(c, in, out, n, WEFT_FLOAT32, WEFT_SUM, &r),
              "iall_reduce");
        compute(iters);
        check(weft_wait(r), "wait");
        ovl[k] = slowest(c, now_us() - t0);
        weft_request_free(r);

        {
            pthread_t th;

            check(weft_barrier(c), "barrier");
            t0 = now_us();
            if (pthread_create(&th, NULL, compute_thread, &iters) != 0) {
                fprintf(stderr, "overlap-rank: pthread_create failed\n");
                return 1;
            }
            check(weft_all_reduce(c, in, out, n, WEFT_FLOAT32, WEFT_SUM),
                  "all_reduce");
            pthread_join(th, NULL);
            ldd[k] = slowest(c, now_us() - t0);
        }

        check(weft_barrier(c), "barrier");
        t0 = now_us();
        for (int i = 0; i < nb; i++)
            check(weft_all_reduce(c, sin + (size_t)i * sn, sb + (size_t)i * sn,
                                  sn, WEFT_FLOAT32, WEFT_SUM),
                  "all_reduce");
        blk[k] = slowest(c, now_us() - t0);

        check(weft_barrier(c), "barrier");
        t0 = now_us();
        for (int i = 0; i < nb; i++)
            check(weft_iall_reduce(c, sin + (size_t)i * sn, sp + (size_t)i * sn,
                                   sn, WEFT_FLOAT32, WEFT_SUM, &reqs[i]),
                  "iall_reduce");
        check(weft_wait_all(reqs, (size_t)nb), "wait_all");
        pst[k] = slowest(c, now_us() - t0);
        for (int i = 0; i < nb; i++)
            weft_request_free(reqs[i]);
        if (memcmp(sb, sp, sbytes * (size_t)nb) != 0)
            bad = 1;
    }
    double comp_us = median(comp, reps), ovl_us = median(ovl, reps);
    double ldd_us = median(ldd, reps);
    double blk_us = median(blk, reps), pst_us = median(pst, reps);
    double mx = comm_us > comp_us ? comm_us : comp_us;

    if (me == 0) {
        printf("ranks %d\n", weft_size(c));
        printf("bytes %zu\n", bytes);
        printf("comm_us %.1f\n", comm_us);
        printf("compute_us %.1f\n", comp_us);
        printf("overlap_us %.1f\n", ovl_us);
        printf("overlap_ratio %.3f\n", ovl_us / mx);
        printf("loaded_us %.1f\n", ldd_us);
        printf("overlap_vs_loaded %.3f\n", ovl_us / ldd_us);
        printf("batch %d x %zu B\n", nb, sbytes);
        printf("blocking_us %.1f\n", blk_us);
        printf("posted_us %.1f\n", pst_us);
        printf("posted_ratio %.3f\n", pst_us / blk_us);
        printf("results %s\n", bad ? "DIFFER" : "identical");
        fflush(stdout);
    }
    check(weft_finalize(c), "finalize");
    free(in);
    free(out);
    free(sin);
    free(sb);
    free(sp);
    free(reqs);
    free(comm);
    free(comp);
    free(ovl);
    free(ldd);
    free(blk);
    free(pst);
    return bad;
}
