/*
 * One rank of bench/shrink: the last rank of the job leaves (exits
 * without weft_finalize, as a killed process does), the others time
 * from the failed all_reduce that reports it to the first right
 * all_reduce on a communicator of the survivors, made by
 *   shrink: weft_comm_shrink, or
 *   reinit: weft_finalize, then weft_init_config with the survivors'
 *           hostfile (the job's, less the last rank) and the same token,
 * and rank 0 prints "MODE NRANKS MS", the slowest survivor's time.
 * Runs under weftrun --keep-going: weftrun's one-host hostfile, or a
 * --hostfile job across hosts with SHRINK_SURVIVORS naming the
 * survivors' hostfile (bench/shrink --hosts).
 *
 *   shrink-rank shrink|reinit
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "weft.h"

static double now_ms(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

/* The ports of weftrun's one-host hostfile at path (its "ports" list):
 * how many, at most max. */
static int read_ports(const char *path, int *ports, int max)
{
    static char text[1 << 16];
    FILE *f = fopen(path, "r");
    size_t len;
    char *p;
    int n = 0;

    if (f == NULL)
        return -1;
    len = fread(text, 1, sizeof text - 1, f);
    fclose(f);
    text[len] = '\0';
    if ((p = strstr(text, "\"ports\"")) == NULL || (p = strchr(p, '[')) == NULL)
        return -1;
    for (p++; n < max && *p != ']' && *p != '\0';) {
        char *end;
        long v = strtol(p, &end, 10);
        if (end == p) {
            p++;
            continue;
        }
        ports[n++] = (int)v;
        p = end;
    }
    return n;
}

/* A communicator of the survivors by a new weft_init_config: from the
 * hostfile SHRINK_SURVIVORS names (bench/shrink --hosts writes it), else
 * from weftrun's one-host hostfile less the last rank. */
static int reinit(int rank, int n, weft_comm **out)
{
    static char text[1 << 16];
    const char *surv = getenv("SHRINK_SURVIVORS");
    int ports[1024], np = 0;
    size_t at;
    weft_config cfg;

    memset(&cfg, 0, sizeof cfg);
    cfg.rank = rank;
    cfg.size = n;
    cfg.hostfile_text = text;
    if (surv != NULL) {
        FILE *f = fopen(surv, "r");
        size_t len;

        if (f == NULL) {
            fprintf(stderr, "shrink-rank: cannot read %s\n", surv);
            return -1;
        }
        len = fread(text, 1, sizeof text - 1, f);
        fclose(f);
        text[len] = '\0';
        return weft_init_config(out, &cfg);
    }
    np = read_ports(getenv("WEFT_HOSTFILE"), ports, 1024);
    if (np != n + 1) {
        fprintf(stderr, "shrink-rank: cannot read the ports of %s\n",
                getenv("WEFT_HOSTFILE"));
        return -1;
    }
    at = (size_t)snprintf(text, sizeof text,
                          "{\"hosts\": [{\"name\": \"localhost\", \"ranks\": "
                          "%d, \"ports\": [",
                          n);
    for (int i = 0; i < n; i++)
        at += (size_t)snprintf(text + at, sizeof text - at, "%s%d",
                               i ? ", " : "", ports[i]);
    snprintf(text + at, sizeof text - at, "]}]}");
    return weft_init_config(out, &cfg);
}

int main(int argc, char **argv)
{
    weft_comm *c = NULL, *s = NULL;
    int shrink = argc > 1 && strcmp(argv[1], "shrink") == 0;
    int rank, n, rc;
    float x[256];
    double t0, ms, worst;

    if (argc < 2 || (!shrink && strcmp(argv[1], "reinit") != 0)) {
        fprintf(stderr, "usage: shrink-rank shrink|reinit\n");
        return 2;
    }
    if ((rc = weft_init(&c)) != WEFT_OK) {
        fprintf(stderr, "weft_init: %s\n", weft_last_error(NULL));
        return 1;
    }
    rank = weft_rank(c);
    n = weft_size(c);
    for (int i = 0; i < 256; i++)
        x[i] = 1;
    if (weft_all_reduce(c, x, x, 256, WEFT_FLOAT32, WEFT_SUM) != WEFT_OK ||
        weft_barrier(c) != WEFT_OK)
        return 1;
    if (rank == n - 1)
        _exit(0); /* its sockets and segments just close */
    if (weft_all_reduce(c, x, x, 256, WEFT_FLOAT32, WEFT_SUM) == WEFT_OK) {
        fprintf(stderr, "rank %d: all_reduce succeeded without a rank\n", rank);
        return 1;
    }
    t0 = now_ms();
    if (shrink)
        rc = weft_comm_shrink(c, &s);
    else {
        weft_finalize(c);
        c = NULL;
        rc = reinit(rank, n - 1, &s);
    }
    if (rc != WEFT_OK) {
        fprintf(stderr, "rank %d: %s: %s\n", rank, argv[1],
                weft_last_error(NULL));
        return 1;
    }
    for (int i = 0; i < 256; i++)
        x[i] = (float)(rank + 1);
    if (weft_all_reduce(s, x, x, 256, WEFT_FLOAT32, WEFT_SUM) != WEFT_OK ||
        x[0] != (float)((n - 1) * n / 2)) {
        fprintf(stderr, "rank %d: the first all_reduce: %s (%g)\n", rank,
                weft_last_error(s), x[0]);
        return 1;
    }
    ms = now_ms() - t0;
    worst = ms;
    weft_all_reduce(s, &ms, &worst, 1, WEFT_FLOAT64, WEFT_MAX);
    if (weft_rank(s) == 0)
        printf("%s %d %.2f\n", argv[1], n, worst);
    weft_finalize(s);
    weft_finalize(c);
    return 0;
}
