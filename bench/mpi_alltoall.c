/*
 * mpi_alltoall: the MPI counterpart of `weft-bench -o all_to_all -d float`,
 * used by bench/vs-peers --op all_to_all to compare weft with MPI_Alltoall.
 *
 *   mpirun -np 4 ./mpi_alltoall -b 8 -e 64M -f 4 -n 10 -w 3
 *
 * -b/-e min/max bytes (K/M/G/T suffixes, 1024-based, optional B or iB),
 * -f factor, -n iterations, -w warm-up iterations. The size is, as in
 * weft-bench, each rank's whole send buffer: nranks blocks of count floats,
 * one per peer, rounded down to a multiple of 4 * nranks bytes; sizes that
 * round to 0 are skipped.
 *
 * Per size: MPI_Barrier, the warm-ups, MPI_Barrier, the timed loop
 * (MPI_Wtime); time is the slowest rank's average per operation (an
 * MPI_Allreduce MAX). Then the inputs are re-initialised, the output
 * poisoned, one more MPI_Alltoall runs and every element is compared with
 * what its sender wrote. Rank 0 prints one row per size:
 *   size count time(us) algbw(GB/s) busbw(GB/s)
 * with count the floats per peer, algbw = size / time,
 * busbw = algbw * (n-1)/n (as nccl-tests' alltoall) and GB = 1e9.
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
                "mpi_alltoall: %s: bad value '%s'\n"
                "usage: mpi_alltoall [-b MINBYTES] [-e MAXBYTES] [-f FACTOR] "
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
    case 'k':
    case 'K':
        mult = UINT64_C(1) << 10;
        end++;
        break;
    case 'm':
    case 'M':
        mult = UINT64_C(1) << 20;
        end++;
        break;
    case 'g':
    case 'G':
        mult = UINT64_C(1) << 30;
        end++;
        break;
    case 't':
    case 'T':
        mult = UINT64_C(1) << 40;
        end++;
        break;
    default:
        break;
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

/* Element j of rank r's send buffer: a float that names r and j (exact
 * below 2^24), so a block from the wrong sender or offset is caught. */
static float input_value(int r, size_t j, unsigned salt)
{
    return (float)((j * 7u + (size_t)r * 131u + salt) % 16777213u);
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
        case 'b':
            min_nbytes = parse_nbytes(optarg, "-b");
            break;
        case 'e':
            max_nbytes = parse_nbytes(optarg, "-e");
            break;
        case 'f':
            factor = (uint64_t)parse_int(optarg, 2, INT_MAX, "-f");
            break;
        case 'n':
            iters = (int)parse_int(optarg, 1, INT_MAX, "-n");
            break;
        case 'w':
            warmup = (int)parse_int(optarg, 0, INT_MAX, "-w");
            break;
        default:
            usage_error("option", argv[optind - 1]);
        }
    }
    if (optind < argc)
        usage_error("argument", argv[optind]);
    if (min_nbytes > max_nbytes)
        usage_error("-b", "larger than -e");

    size_t n = (size_t)nranks;
    size_t max_total = (size_t)(max_nbytes / sizeof(float) / n) * n;
    float *sendbuf = malloc((max_total ? max_total : 1) * sizeof(float));
    float *recvbuf = malloc((max_total ? max_total : 1) * sizeof(float));
    if (!sendbuf || !recvbuf) {
        fprintf(stderr,
                "mpi_alltoall: rank %d: cannot allocate 2 x %zu bytes\n",
                g_rank, max_total * sizeof(float));
        MPI_Abort(MPI_COMM_WORLD, 1);
    }

    if (g_rank == 0) {
        printf("# mpi_alltoall: MPI_Alltoall float, %d ranks, iters %d, "
               "warmup %d\n",
               nranks, iters, warmup);
        printf("#   minBytes %" PRIu64 " maxBytes %" PRIu64 " step: %" PRIu64
               "(factor)\n",
               min_nbytes, max_nbytes, factor);
        printf("#   size: each rank's whole send buffer (nranks blocks); "
               "busbw = algbw * (n-1)/n\n");
        printf("#   time: the slowest rank's average per operation; "
               "GB = 1e9 bytes\n#\n");
        printf("#%11s  %12s  %11s  %11s  %11s\n", "size", "count", "time(us)",
               "algbw(GB/s)", "busbw(GB/s)");
        fflush(stdout);
    }

    double busfactor = nranks > 1 ? (double)(nranks - 1) / nranks : 0.0;
    unsigned salt = 0;
    uint64_t wrong_total = 0;
    double busbw_sum = 0.0;
    int rows = 0;

    for (uint64_t nb = min_nbytes; nb <= max_nbytes;) {
        size_t count = (size_t)(nb / sizeof(float) / n); /* per peer */
        if (count > 0 && count <= INT_MAX) {
            size_t total = count * n;
            salt++;
            for (size_t j = 0; j < total; j++)
                sendbuf[j] = input_value(g_rank, j, salt);

            MPI_Barrier(MPI_COMM_WORLD);
            for (int it = 0; it < warmup; it++)
                MPI_Alltoall(sendbuf, (int)count, MPI_FLOAT, recvbuf,
                             (int)count, MPI_FLOAT, MPI_COMM_WORLD);
            MPI_Barrier(MPI_COMM_WORLD);
            double t0 = MPI_Wtime();
            for (int it = 0; it < iters; it++)
                MPI_Alltoall(sendbuf, (int)count, MPI_FLOAT, recvbuf,
                             (int)count, MPI_FLOAT, MPI_COMM_WORLD);
            double t_us = (MPI_Wtime() - t0) * 1e6 / iters;
            double t_max_us = 0.0;
            MPI_Allreduce(&t_us, &t_max_us, 1, MPI_DOUBLE, MPI_MAX,
                          MPI_COMM_WORLD);

            /* Check once: fresh inputs, poisoned output, one call. Block p
             * of recvbuf is rank p's block for this rank: its elements
             * g_rank * count on. */
            salt++;
            for (size_t j = 0; j < total; j++) {
                sendbuf[j] = input_value(g_rank, j, salt);
                recvbuf[j] = -12345.0f;
            }
            MPI_Alltoall(sendbuf, (int)count, MPI_FLOAT, recvbuf, (int)count,
                         MPI_FLOAT, MPI_COMM_WORLD);
            unsigned long long wrong = 0, wrong_sum = 0;
            for (size_t p = 0; p < n; p++) {
                for (size_t i = 0; i < count; i++) {
                    float expect =
                        input_value((int)p, (size_t)g_rank * count + i, salt);
                    float got = recvbuf[p * count + i];
                    if (got != expect) {
                        if (wrong == 0)
                            fprintf(stderr,
                                    "mpi_alltoall: rank %d: size %" PRIu64
                                    ": element %zu of rank %zu's block is %g, "
                                    "expected %g\n",
                                    g_rank, nb, i, p, (double)got,
                                    (double)expect);
                        wrong++;
                    }
                }
            }
            MPI_Allreduce(&wrong, &wrong_sum, 1, MPI_UNSIGNED_LONG_LONG,
                          MPI_SUM, MPI_COMM_WORLD);
            wrong_total += wrong_sum;

            uint64_t size = (uint64_t)total * sizeof(float);
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
