/*
 * mpi_allreduce: the MPI counterpart of `weft-bench -o all_reduce -d float
 * -r sum`, used by bench/vs-mpi to compare weft with MPI_Allreduce.
 *
 *   mpirun -np 4 ./mpi_allreduce -b 8 -e 64M -f 4 -n 10 -w 3
 *
 * -b/-e min/max bytes (K/M/G/T suffixes, 1024-based, optional B or iB),
 * -f factor, -n iterations, -w warm-up iterations. Sizes are rounded down to
 * a multiple of 4 bytes; sizes that round to 0 are skipped.
 *
 * Per size: MPI_Barrier, the warm-ups, MPI_Barrier, the timed loop
 * (MPI_Wtime); time is the slowest rank's average per operation (an
 * MPI_Allreduce MAX). Then the inputs are re-initialised with small
 * integers, one more MPI_Allreduce runs and every element is compared with
 * the exact expected sum. Rank 0 prints one row per size:
 *   size count time(us) algbw(GB/s) busbw(GB/s)
 * with algbw = size / time, busbw = algbw * 2(n-1)/n and GB = 1e9.
 *
 * Exit status: 0 when every check passed, 1 on a wrong element, 2 for bad
 * arguments.
 */
#include <errno.h>
#include <inttypes.h>
#include <limits.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <mpi.h>

static int g_rank;

static void usage_error(const char *what, const char *s)
{
    if (g_rank == 0)
        fprintf(stderr,
                "mpi_allreduce: %s: bad value '%s'\n"
                "usage: mpi_allreduce [-b MINBYTES] [-e MAXBYTES] [-f FACTOR] "
                "[-n ITERS] [-w WARMUP]\n",
                what, s);
    MPI_Finalize();
    exit(2);
}

static long parse_int(const char *s, long lo, long hi, const char *what)
{
    char *end;
    long v;

    errno = 0;
    v = strtol(s, &end, 10);
    if (errno != 0 || end == s || *end != '\0' || v < lo || v > hi)
        usage_error(what, s);
    return v;
}

/* Same grammar as weft-bench: digits, optional K/M/G/T (1024-based), then
 * optional B (or iB after a suffix). */
static uint64_t parse_nbytes(const char *s, const char *what)
{
    char *end;
    unsigned long long v;
    uint64_t mult = 1;

    if (*s < '0' || *s > '9')
        usage_error(what, s);
    errno = 0;
    v = strtoull(s, &end, 10);
    if (errno != 0)
        usage_error(what, s);
    switch (*end) {
    case 'k': case 'K': mult = UINT64_C(1) << 10; end++; break;
    case 'm': case 'M': mult = UINT64_C(1) << 20; end++; break;
    case 'g': case 'G': mult = UINT64_C(1) << 30; end++; break;
    case 't': case 'T': mult = UINT64_C(1) << 40; end++; break;
    default: break;
    }
    if (mult > 1 && (*end == 'i' || *end == 'I') &&
        (end[1] == 'B' || end[1] == 'b'))
        end += 2;
    else if (*end == 'B' || *end == 'b')
        end++;
    if (*end != '\0' || v > UINT64_MAX / mult)
        usage_error(what, s);
    return (uint64_t)v * mult;
}

/* Input of rank r at element i: a small integer in [-8, 8], so that the sum
 * over any number of ranks below 2^20 is exact in float32. */
static float input_value(int r, size_t i, unsigned salt)
{
    return (float)((int)((i * 7u + (size_t)r * 13u + salt) % 17u) - 8);
}

int main(int argc, char **argv)
{
    uint64_t min_nbytes = 32 << 20, max_nbytes = 32 << 20, factor = 2;
    int iters = 20, warmup = 5, nranks, opt;

    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &g_rank);
    MPI_Comm_size(MPI_COMM_WORLD, &nranks);

    while ((opt = getopt(argc, argv, "b:e:f:n:w:h")) != -1) {
        switch (opt) {
        case 'b': min_nbytes = parse_nbytes(optarg, "-b"); break;
        case 'e': max_nbytes = parse_nbytes(optarg, "-e"); break;
        case 'f': factor = (uint64_t)parse_int(optarg, 2, INT_MAX, "-f"); break;
        case 'n': iters = (int)parse_int(optarg, 1, INT_MAX, "-n"); break;
        case 'w': warmup = (int)parse_int(optarg, 0, INT_MAX, "-w"); break;
        default: usage_error("option", argv[optind - 1]);
        }
    }
    if (optind < argc)
        usage_error("argument", argv[optind]);
    if (min_nbytes > max_nbytes)
        usage_error("-b", "larger than -e");

    size_t max_count = (size_t)(max_nbytes / sizeof(float));
    float *sendbuf = malloc((max_count ? max_count : 1) * sizeof(float));
    float *recvbuf = malloc((max_count ? max_count : 1) * sizeof(float));
    if (!sendbuf || !recvbuf) {
        fprintf(stderr, "mpi_allreduce: rank %d: cannot allocate 2 x %zu bytes\n",
                g_rank, max_count * sizeof(float));
        MPI_Abort(MPI_COMM_WORLD, 1);
    }

    if (g_rank == 0) {
        printf("# mpi_allreduce: MPI_Allreduce float sum, %d ranks, iters %d, "
               "warmup %d\n", nranks, iters, warmup);
        printf("#   minBytes %" PRIu64 " maxBytes %" PRIu64 " step: %" PRIu64
               "(factor)\n", min_nbytes, max_nbytes, factor);
        printf("#   time: the slowest rank's average per operation; "
               "GB = 1e9 bytes\n#\n");
        printf("#%11s  %12s  %11s  %11s  %11s\n", "size", "count", "time(us)",
               "algbw(GB/s)", "busbw(GB/s)");
        fflush(stdout);
    }

    double busfactor = nranks > 1 ? 2.0 * (nranks - 1) / nranks : 0.0;
    unsigned salt = 0;
    uint64_t wrong_total = 0;
    double busbw_sum = 0.0;
    int rows = 0;

    for (uint64_t nb = min_nbytes; nb <= max_nbytes;) {
        size_t count = (size_t)(nb / sizeof(float));
        if (count > 0) {
            salt++;
            for (size_t i = 0; i < count; i++)
                sendbuf[i] = input_value(g_rank, i, salt);

            MPI_Barrier(MPI_COMM_WORLD);
            for (int it = 0; it < warmup; it++)
                MPI_Allreduce(sendbuf, recvbuf, (int)count, MPI_FLOAT, MPI_SUM,
                              MPI_COMM_WORLD);
            MPI_Barrier(MPI_COMM_WORLD);
            double t0 = MPI_Wtime();
            for (int it = 0; it < iters; it++)
                MPI_Allreduce(sendbuf, recvbuf, (int)count, MPI_FLOAT, MPI_SUM,
                              MPI_COMM_WORLD);
            double t_us = (MPI_Wtime() - t0) * 1e6 / iters;
            double t_max_us = 0.0;
            MPI_Allreduce(&t_us, &t_max_us, 1, MPI_DOUBLE, MPI_MAX,
                          MPI_COMM_WORLD);

            /* Check once: fresh inputs, poisoned output, one call. */
            salt++;
            for (size_t i = 0; i < count; i++) {
                sendbuf[i] = input_value(g_rank, i, salt);
                recvbuf[i] = -12345.0f;
            }
            MPI_Allreduce(sendbuf, recvbuf, (int)count, MPI_FLOAT, MPI_SUM,
                          MPI_COMM_WORLD);
            unsigned long long wrong = 0, wrong_sum = 0;
            for (size_t i = 0; i < count; i++) {
                float expect = 0.0f;
                for (int r = 0; r < nranks; r++)
                    expect += input_value(r, i, salt);
                if (recvbuf[i] != expect) {
                    if (wrong == 0)
                        fprintf(stderr,
                                "mpi_allreduce: rank %d: size %" PRIu64
                                ": element %zu is %g, expected %g\n",
                                g_rank, nb, i, (double)recvbuf[i],
                                (double)expect);
                    wrong++;
                }
            }
            MPI_Allreduce(&wrong, &wrong_sum, 1, MPI_UNSIGNED_LONG_LONG,
                          MPI_SUM, MPI_COMM_WORLD);
            wrong_total += wrong_sum;

            uint64_t size = (uint64_t)count * sizeof(float);
            double algbw = t_max_us > 0 ? (double)size / t_max_us / 1e3 : 0.0;
            double busbw = algbw * busfactor;
            busbw_sum += busbw;
            rows++;
            if (g_rank == 0) {
                printf("%12" PRIu64 "  %12zu  %11.2f  %11.2f  %11.2f\n", size,
                       count, t_max_us, algbw, busbw);
                fflush(stdout);
            }
        }
        if (nb > max_nbytes / factor)
            break;
        nb = nb ? nb * factor : 1;
    }

    if (g_rank == 0) {
        printf("# Avg bus bandwidth : %.3f\n", rows ? busbw_sum / rows : 0.0);
        if (wrong_total)
            printf("# Errors: %llu wrong elements\n",
                   (unsigned long long)wrong_total);
        fflush(stdout);
    }
    free(sendbuf);
    free(recvbuf);
    MPI_Finalize();
    return wrong_total ? 1 : 0;
}
