/*
 * Jobs of threads, each thread a rank with a communicator of its own made
 * by weft_init_config (config_cases.h).
 */
#include "config_cases.h"

#include <errno.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define CFG_MAX_ROUNDS 4
#define STORE_WAIT_MS 10000
#define CONNECT_MS 10000

/* The key-value store stand-in: every rank's address, per round. */
struct job {
    pthread_mutex_t m;
    pthread_cond_t cv;
    char addr[CFG_MAX_ROUNDS][CFG_MAX_RANKS][32];
    int have[CFG_MAX_ROUNDS];
    char token[33];
};

struct rank_arg {
    const struct cfg_jobs *j;
    struct job *job;
    int jobi, rank;
    char why[512];
};

__attribute__((format(printf, 2, 3))) static int fail(struct rank_arg *a,
                                                      const char *fmt, ...)
{
    va_list ap;
    int n =
        snprintf(a->why, sizeof a->why, "job %d rank %d: ", a->jobi, a->rank);

    va_start(ap, fmt);
    vsnprintf(a->why + n, sizeof a->why - (size_t)n, fmt, ap);
    va_end(ap);
    return -1;
}

static void sleep_ms(int ms)
{
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR)
        ;
}

/* Publishes this rank's address and waits (bounded) for the others'. */
static int exchange(struct rank_arg *a, int round, const char *addr)
{
    struct job *job = a->job;
    struct timespec until;
    int rc = 0;

    clock_gettime(CLOCK_REALTIME, &until);
    until.tv_sec += STORE_WAIT_MS / 1000;
    pthread_mutex_lock(&job->m);
    snprintf(job->addr[round][a->rank], sizeof job->addr[round][a->rank], "%s",
             addr);
    job->have[round]++;
    pthread_cond_broadcast(&job->cv);
    while (job->have[round] < a->j->nranks && rc == 0)
        rc = pthread_cond_timedwait(&job->cv, &job->m, &until);
    pthread_mutex_unlock(&job->m);
    return rc == 0 ? 0
                   : fail(a,
                          "round %d: the store never held every "
                          "address",
                          round);
}

/* A hostfile of one host whose ranks listen at the addresses' ports. */
static char *hostfile_text(const struct job *job, int round, int n)
{
    size_t len = 128 + 8 * (size_t)n, used;
    char *s = malloc(len);

    if (s == NULL)
        return NULL;
    used = (size_t)snprintf(s, len,
                            "{\"hosts\": [{\"name\": \"here\", "
                            "\"ranks\": %d, \"ports\": [",
                            n);
    for (int r = 0; r < n; r++) {
        const char *colon = strrchr(job->addr[round][r], ':');
        used += (size_t)snprintf(s + used, len - used, "%s%s", r ? ", " : "",
                                 colon + 1);
    }
    snprintf(s + used, len - used, "]}], \"links\": []}");
    return s;
}

static double val(int jobi, int rank, size_t i)
{
    return (double)((rank + 1) * (int)(i % 1000 + 1) + 7 * jobi);
}

/* The operations, checked against values computed here. */
static int check_ops(struct rank_arg *a, weft_comm *c)
{
    int n = a->j->nranks, r = a->rank, rc;
    size_t big = 70001, ng = 513;
    double *x = malloc(big * sizeof *x);
    int32_t *g = malloc(ng * (size_t)n * sizeof *g);
    int32_t mine[513], b[64], s[64], t[64];
    float small[8][16];
    weft_request *req[8];
    int bad = 0;

    if (x == NULL || g == NULL) {
        free(x);
        free(g);
        return fail(a, "out of memory");
    }
    if (weft_rank(c) != r || weft_size(c) != n)
        bad = fail(a, "weft_rank/weft_size say %d/%d", weft_rank(c),
                   weft_size(c));
    for (size_t i = 0; i < big; i++)
        x[i] = val(a->jobi, r, i);
    if (!bad && (rc = weft_all_reduce(c, x, x, big, WEFT_FLOAT64, WEFT_SUM)))
        bad = fail(a, "all_reduce: %s", weft_last_error(c));
    for (size_t i = 0; !bad && i < big; i++) {
        double want = 0;
        for (int p = 0; p < n; p++)
            want += val(a->jobi, p, i);
        if (x[i] != want)
            bad = fail(a, "all_reduce[%zu] = %g, expected %g", i, x[i], want);
    }
    for (size_t i = 0; i < ng; i++)
        mine[i] = (int32_t)(1000 * r + (int)i + 100000 * a->jobi);
    if (!bad && weft_all_gather(c, mine, g, ng, WEFT_INT32) != 0)
        bad = fail(a, "all_gather: %s", weft_last_error(c));
    for (int p = 0; !bad && p < n; p++)
        for (size_t i = 0; i < ng; i++)
            if (g[(size_t)p * ng + i] !=
                (int32_t)(1000 * p + (int)i + 100000 * a->jobi)) {
                bad = fail(a, "all_gather: rank %d's [%zu] is %d", p, i,
                           (int)g[(size_t)p * ng + i]);
                break;
            }
    for (int i = 0; i < 64; i++) {
        b[i] = r == n - 1 ? 5 * i + a->jobi : -1;
        s[i] = 100 * r + i;
    }
    if (!bad && weft_broadcast(c, b, 64, WEFT_INT32, n - 1) != 0)
        bad = fail(a, "broadcast: %s", weft_last_error(c));
    for (int i = 0; !bad && i < 64; i++)
        if (b[i] != 5 * i + a->jobi)
            bad = fail(a, "broadcast[%d] = %d", i, (int)b[i]);
    if (!bad && n > 1 &&
        weft_sendrecv(c, s, (r + 1) % n, t, (r + n - 1) % n, 64, WEFT_INT32) !=
            0)
        bad = fail(a, "sendrecv: %s", weft_last_error(c));
    for (int i = 0; !bad && n > 1 && i < 64; i++)
        if (t[i] != 100 * ((r + n - 1) % n) + i)
            bad = fail(a, "sendrecv[%d] = %d", i, (int)t[i]);
    /* Posted back to back: small all_reduces that may run as a batch. */
    for (int k = 0; !bad && k < 8; k++) {
        for (int i = 0; i < 16; i++)
            small[k][i] = (float)(r + k + i);
        if (weft_iall_reduce(c, small[k], small[k], 16, WEFT_FLOAT32, WEFT_MAX,
                             &req[k]) != 0) {
            bad = fail(a, "iall_reduce %d: %s", k, weft_last_error(c));
            while (k-- > 0) {
                weft_wait(req[k]);
                weft_request_free(req[k]);
            }
        } else if (k == 7) {
            if (weft_wait_all(req, 8) != 0)
                bad = fail(a, "wait_all: %s", weft_last_error(c));
            for (int q = 0; q < 8; q++)
                weft_request_free(req[q]);
        }
    }
    for (int k = 0; !bad && k < 8; k++)
        for (int i = 0; i < 16; i++)
            if (small[k][i] != (float)(n - 1 + k + i)) {
                bad = fail(a, "iall_reduce %d [%d] = %g", k, i,
                           (double)small[k][i]);
                break;
            }
    free(x);
    free(g);
    return bad;
}

static int one_round(struct rank_arg *a, int round)
{
    const struct cfg_jobs *j = a->j;
    struct job *job = a->job;
    const char *addrs[CFG_MAX_RANKS];
    char addr[32], *text = NULL;
    weft_listener *l;
    weft_comm *c;
    weft_config cfg;
    int rc;

    if (j->late_ms > 0 && a->rank == j->late_rank)
        sleep_ms(j->late_ms);
    if ((rc = weft_listener_open(&l, NULL, addr, sizeof addr)) != 0)
        return fail(a, "weft_listener_open: %s: %s", weft_err_name(rc),
                    weft_last_error(NULL));
    if (exchange(a, round, addr) != 0) {
        weft_listener_close(l);
        return -1;
    }
    memset(&cfg, 0, sizeof cfg);
    cfg.rank = a->rank;
    cfg.size = j->nranks;
    cfg.listener = l;
    cfg.token = job->token;
    cfg.timeout_ms = j->timeout_ms;
    cfg.connect_timeout_ms = CONNECT_MS;
    cfg.wires = 1;
    cfg.transport = "tcp";
    cfg.topology = j->topology != NULL ? j->topology : "auto";
    for (int r = 0; r < j->nranks; r++)
        addrs[r] = job->addr[round][r];
    if (j->boot == CFG_BOOT_ADDRS) {
        cfg.addrs = addrs;
    } else if ((cfg.hostfile_text = text =
                    hostfile_text(job, round, j->nranks)) == NULL) {
        weft_listener_close(l);
        return fail(a, "out of memory");
    }
    rc = weft_init_config(&c, &cfg);
    free(text);
    if (rc != 0)
        return fail(a, "round %d: weft_init_config: %s: %s", round,
                    weft_err_name(rc), weft_last_error(NULL));
    rc = check_ops(a, c);
    weft_finalize(c);
    return rc;
}

static void *rank_main(void *arg)
{
    struct rank_arg *a = arg;

    for (int round = 0; round < a->j->rounds; round++)
        if (one_round(a, round) != 0)
            break;
    return NULL;
}

int cfg_run_jobs(const struct cfg_jobs *j, char *why, size_t whylen)
{
    struct job jobs[CFG_MAX_JOBS];
    struct rank_arg args[CFG_MAX_JOBS][CFG_MAX_RANKS];
    pthread_t th[CFG_MAX_JOBS][CFG_MAX_RANKS];
    int failed = 0;

    why[0] = '\0';
    if (j->njobs < 1 || j->njobs > CFG_MAX_JOBS || j->nranks < 1 ||
        j->nranks > CFG_MAX_RANKS || j->rounds < 1 ||
        j->rounds > CFG_MAX_ROUNDS) {
        snprintf(why, whylen, "cfg_run_jobs: bad job shape");
        return -1;
    }
    memset(jobs, 0, sizeof jobs);
    memset(args, 0, sizeof args);
    for (int k = 0; k < j->njobs; k++) {
        pthread_mutex_init(&jobs[k].m, NULL);
        pthread_cond_init(&jobs[k].cv, NULL);
        for (int i = 0; i < 32; i++)
            jobs[k].token[i] = "0123456789abcdef"[(i * 7 + k * 5 + 3) % 16];
        for (int r = 0; r < j->nranks; r++) {
            args[k][r] = (struct rank_arg){j, &jobs[k], k, r, ""};
            if (pthread_create(&th[k][r], NULL, rank_main, &args[k][r]) != 0) {
                snprintf(args[k][r].why, sizeof args[k][r].why,
                         "cannot start a thread");
                th[k][r] = 0;
            }
        }
    }
    for (int k = 0; k < j->njobs; k++)
        for (int r = 0; r < j->nranks; r++) {
            if (th[k][r] != 0)
                pthread_join(th[k][r], NULL);
            if (args[k][r].why[0] != '\0' && !failed++)
                snprintf(why, whylen, "%s", args[k][r].why);
        }
    for (int k = 0; k < j->njobs; k++) {
        pthread_mutex_destroy(&jobs[k].m);
        pthread_cond_destroy(&jobs[k].cv);
    }
    return failed ? -1 : 0;
}
