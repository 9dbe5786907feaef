/*
 * Configuration from the environment and the hostfile.
 *
 * Every failure says what is wrong and what to set, since the person reading
 * it is usually starting a job by hand.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE /* sched_getaffinity, CPU_COUNT */
#endif
#include "base/parse.h"
#include "topo/hostfile.h"
#include "topo/params.h"
#include "topo/topo.h"

#include <ctype.h>
#include <limits.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define CFG_ERR(...) (snprintf(errmsg, errlen, __VA_ARGS__), WEFT_ECONFIG)

/* The smallest WEFT_SOCKBUF_BYTES but 0, since a buffer under the loopback
 * MSS starves TCP (1 MiB all_reduce of 4 ranks on loopback, MTU 65536, per
 * call: 31 s at 4 KiB, 10 s at 8-12 KiB, 10 ms at 16 KiB, 1.1-2.3 ms from
 * 24 KiB up); 128 KiB leaves the receive window, about half the buffer the
 * kernel doubles, two full loopback segments. */
#define SOCKBUF_MIN_BYTES (128 << 10)

/* The box's bytes for nranks (topo.h). */
static size_t box_bytes(int nranks)
{
    size_t b = WEFT__BOX_READ_BYTES / (size_t)(nranks > 0 ? nranks : 1);

    return b < WEFT__BOX_MIN_BYTES   ? WEFT__BOX_MIN_BYTES
           : b > WEFT__BOX_MAX_BYTES ? WEFT__BOX_MAX_BYTES
                                     : b;
}

/* Whether this host has `per` cores per rank it runs, counting the cores
 * this process may run on. With WEFT__REDUCE_THREAD_CORES (spare_cores)
 * the reducer thread (WEFT_REDUCE_THREAD unset) is used: it only helps
 * where it has a core of its own, and costs a little (a hand-off per
 * frame) where it has not; and the progress thread and weft_wait spin
 * before they sleep. With one (own_core) the transports' waits may spin
 * longer than WEFT_SPIN_US (transport/common.h). */
static int cores_per_rank(const weft__config *cfg, long per)
{
    int local = cfg->hosts[cfg->rank_host[cfg->rank]].nranks;
    long ncpu = sysconf(_SC_NPROCESSORS_ONLN);
    cpu_set_t set;

    if (sched_getaffinity(0, sizeof set, &set) == 0)
        ncpu = CPU_COUNT(&set);
    return ncpu >= per * (local > 0 ? local : 1);
}

/* The host's cores per rank on it: the same on every rank of the host,
 * as the one-copy all_reduce's defaults must be. */
static long host_cores_per_rank(const weft__config *cfg)
{
    int local = cfg->hosts[cfg->rank_host[cfg->rank]].nranks;

    return sysconf(_SC_NPROCESSORS_ONLN) / (local > 0 ? local : 1);
}

/* WEFT_PULL_THREADS unset: the host's cores per rank, 0 (off) below 2,
 * then no more than this process may run on, nor PULL_MAX_THREADS. */
static int auto_pull_threads(const weft__config *cfg)
{
    long per = host_cores_per_rank(cfg);
    cpu_set_t set;

    if (per < 2)
        return 0;
    if (sched_getaffinity(0, sizeof set, &set) == 0 && CPU_COUNT(&set) < per)
        per = CPU_COUNT(&set);
    if (per > WEFT__PULL_MAX_THREADS)
        per = WEFT__PULL_MAX_THREADS;
    return per > 1 ? (int)per : 1;
}

static int env_int(const char *name, long lo, long hi, long dflt, long *out,
                   char *errmsg, size_t errlen)
{
    const char *s = getenv(name);

    if (s == NULL || *s == '\0') {
        *out = dflt;
        return WEFT_OK;
    }
    if (weft__parse_long(s, lo, hi, out) != 0)
        return CFG_ERR("%s=\"%s\" is not an integer in [%ld, %ld]; set it to "
                       "one or unset it",
                       name, s, lo, hi);
    return WEFT_OK;
}

/* Numeric setting d (params.c): weft_config's field where it has one and
 * it is set (non-zero), else its variable, else its default (-1 where it
 * is computed from the job). */
static int load_num(const weft__param *d, const weft_config *uc, long *out,
                    char *errmsg, size_t errlen)
{
    int set = 0;
    int rc;

    if (uc != NULL && d->uc_off >= 0)
        memcpy(&set, (const char *)uc + d->uc_off, sizeof set);
    if (set != 0) {
        char field[48];
        size_t i;

        /* The field is the variable's name without WEFT_, in lower case. */
        for (i = 0; d->name[5 + i] != '\0' && i + 1 < sizeof field; i++)
            field[i] = (char)tolower((unsigned char)d->name[5 + i]);
        field[i] = '\0';
        if (set < d->lo || set > d->hi)
            return CFG_ERR("weft_config.%s = %d is not in [%ld, %ld] (0: %s "
                           "or the default)",
                           field, set, d->lo, d->hi, d->name);
        *out = set;
        return WEFT_OK;
    }
    if ((rc = env_int(d->name, d->lo, d->hi, d->dflt, out, errmsg, errlen)) !=
        0)
        return rc;
    if ((d->flags & WEFT__PF_POW2) && (*out & (*out - 1)) != 0)
        return CFG_ERR("%s=%ld is not a power of two", d->name, *out);
    return WEFT_OK;
}

/* Every numeric setting into cfg's fields, and as read into raw (-1:
 * unset, where the job decides: resolve_auto). */
static int load_params(weft__config *cfg, const weft_config *uc, long *raw,
                       char *errmsg, size_t errlen)
{
    for (int p = 0; p < WEFT__P_COUNT; p++) {
        const weft__param *d = &weft__params[p];
        char *at = (char *)cfg + d->off;
        int rc, i;
        size_t z;

        if (d->type != WEFT__PT_INT && d->type != WEFT__PT_SIZE)
            continue;
        if ((rc = load_num(d, uc, &raw[p], errmsg, errlen)) != 0)
            return rc;
        i = (int)raw[p];
        z = (size_t)raw[p];
        if (d->type == WEFT__PT_INT)
            memcpy(at, &i, sizeof i);
        else
            memcpy(at, &z, sizeof z);
    }
    cfg->frame_bytes &= ~(size_t)7; /* whole elements of any dtype */
    if (cfg->sockbuf_bytes != 0 && cfg->sockbuf_bytes < SOCKBUF_MIN_BYTES)
        return CFG_ERR("WEFT_SOCKBUF_BYTES=%d is below the floor of %d "
                       "bytes (smaller buffers stall TCP); set it to at "
                       "least %d, or to 0 for the kernel's autotuning",
                       cfg->sockbuf_bytes, SOCKBUF_MIN_BYTES,
                       SOCKBUF_MIN_BYTES);
    return WEFT_OK;
}

static int hexval(int ch)
{
    if (ch >= '0' && ch <= '9')
        return ch - '0';
    if (ch >= 'a' && ch <= 'f')
        return ch - 'a' + 10;
    if (ch >= 'A' && ch <= 'F')
        return ch - 'A' + 10;
    return -1;
}

/* Rank and size: weft_config's (never the environment's), else weftrun's
 * variables or another launcher's. */
static int load_rank_size(weft__config *cfg, const weft_config *uc,
                          char *errmsg, size_t errlen)
{
    static const char *const pairs[][2] = {
        {"WEFT_RANK", "WEFT_SIZE"},
        {"OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE"},
        {"PMI_RANK", "PMI_SIZE"},
        {"SLURM_PROCID", "SLURM_NTASKS"},
        {"RANK", "WORLD_SIZE"},
    };
    if (uc != NULL) {
        if (uc->size < 1 || uc->size > WEFT__MAX_RANKS)
            return CFG_ERR("weft_config.size = %d is not a job size in "
                           "[1, %d]",
                           uc->size, WEFT__MAX_RANKS);
        if (uc->rank < 0 || uc->rank >= uc->size)
            return CFG_ERR("weft_config.rank = %d is not a rank in [0, %d] "
                           "(weft_config.size = %d)",
                           uc->rank, uc->size - 1, uc->size);
        cfg->rank = uc->rank;
        cfg->nranks = uc->size;
        return WEFT_OK;
    }
    for (size_t i = 0; i < sizeof pairs / sizeof pairs[0]; i++) {
        const char *rs = getenv(pairs[i][0]);
        const char *ss = getenv(pairs[i][1]);
        long r, s;

        if (rs == NULL && ss == NULL)
            continue;
        if (rs == NULL || ss == NULL)
            return CFG_ERR("%s is set but %s is not; set both (weftrun sets "
                           "WEFT_RANK and WEFT_SIZE)",
                           rs ? pairs[i][0] : pairs[i][1],
                           rs ? pairs[i][1] : pairs[i][0]);
        if (weft__parse_long(ss, 1, WEFT__MAX_RANKS, &s) != 0)
            return CFG_ERR("%s=\"%s\" is not a job size in [1, %d]",
                           pairs[i][1], ss, WEFT__MAX_RANKS);
        if (weft__parse_long(rs, 0, s - 1, &r) != 0)
            return CFG_ERR("%s=\"%s\" is not a rank in [0, %ld] (%s=%ld)",
                           pairs[i][0], rs, s - 1, pairs[i][1], s);
        cfg->rank = (int)r;
        cfg->nranks = (int)s;
        return WEFT_OK;
    }
    return CFG_ERR("no rank and size in the environment: start the program "
                   "with weftrun, or set WEFT_RANK, WEFT_SIZE and "
                   "WEFT_HOSTFILE");
}

static int load_hostfile(weft__config *cfg, const weft_config *uc, char *errmsg,
                         size_t errlen)
{
    const char *file, *text;
    weft__hostfile_out hf;
    int rc;

    if (uc != NULL && uc->hostfile_text != NULL && uc->addrs != NULL)
        return CFG_ERR("weft_config.hostfile_text and weft_config.addrs are "
                       "both set; set one");
    if (uc != NULL && uc->hostfile_text != NULL) {
        strcpy(cfg->hostfile, "weft_config.hostfile_text");
        rc = weft__hostfile_load_text(cfg->hostfile, uc->hostfile_text,
                                      cfg->nranks, &hf, errmsg, errlen);
        if (rc != 0)
            return rc;
        goto take;
    }
    if (uc != NULL && uc->addrs != NULL) {
        strcpy(cfg->hostfile, "weft_config.addrs");
        rc = weft__hostfile_load_addrs(cfg->hostfile, uc->addrs, cfg->nranks,
                                       &hf, errmsg, errlen);
        if (rc != 0)
            return rc;
        goto take;
    }
    /* A job of one rank needs no peers and so no hostfile; one made from a
     * config does not look for one either. */
    file = uc != NULL && cfg->nranks == 1 ? NULL : getenv("WEFT_HOSTFILE");
    text = uc != NULL && cfg->nranks == 1 ? NULL : getenv("WEFT_HOSTFILE_TEXT");
    if ((file == NULL || *file == '\0') && text != NULL && *text != '\0') {
        /* The hostfile itself, as weftrun hands it to ranks it starts over
         * ssh (the file need not exist on their hosts). */
        strcpy(cfg->hostfile, "WEFT_HOSTFILE_TEXT");
        rc = weft__hostfile_load_text("WEFT_HOSTFILE_TEXT", text, cfg->nranks,
                                      &hf, errmsg, errlen);
        if (rc != 0)
            return rc;
        goto take;
    }
    if (file == NULL || *file == '\0') {
        if (cfg->nranks == 1) {
            /* A job of one rank needs no peers and so no hostfile. */
            cfg->nhosts = 1;
            cfg->hosts = calloc(1, sizeof *cfg->hosts);
            cfg->rank_host = calloc(1, sizeof *cfg->rank_host);
            if (cfg->hosts == NULL || cfg->rank_host == NULL)
                return WEFT_ENOMEM;
            strcpy(cfg->hosts[0].name, "localhost");
            strcpy(cfg->hosts[0].ssh, "localhost");
            cfg->hosts[0].nranks = 1;
            cfg->hosts[0].ports = malloc(sizeof(int));
            if (cfg->hosts[0].ports == NULL)
                return WEFT_ENOMEM;
            cfg->hosts[0].ports[0] = WEFT__DEFAULT_PORT;
            return WEFT_OK;
        }
        return CFG_ERR("WEFT_HOSTFILE is not set: set it to the job's "
                       "hostfile (weftrun sets it)");
    }
    snprintf(cfg->hostfile, sizeof cfg->hostfile, "%s", file);
    rc = weft__hostfile_load(file, cfg->nranks, &hf, errmsg, errlen);
    if (rc != 0)
        return rc;
take:
    if (hf.transport[0] != '\0')
        strcpy(cfg->transport, hf.transport);
    if (hf.topology[0] != '\0')
        strcpy(cfg->topology, hf.topology);
    /* Take the tables over; the rest is freed with hf. */
    cfg->nhosts = hf.nhosts;
    cfg->hosts = hf.hosts;
    cfg->nlinks = hf.nlinks;
    cfg->links = hf.links;
    cfg->rank_host = hf.rank_host;
    hf.hosts = NULL;
    hf.links = NULL;
    hf.rank_host = NULL;
    weft__hostfile_free(&hf);
    return WEFT_OK;
}

/* The job token, 2 * WEFT__TOKEN_BYTES hex digits in s, named name. */
static int load_token(weft__config *cfg, const char *name, const char *s,
                      char *errmsg, size_t errlen)
{
    if (strlen(s) != 2 * WEFT__TOKEN_BYTES)
        return CFG_ERR("%s must be %d hex digits (weftrun makes one); got "
                       "%zu characters",
                       name, 2 * WEFT__TOKEN_BYTES, strlen(s));
    for (int i = 0; i < WEFT__TOKEN_BYTES; i++) {
        int hi = hexval(s[2 * i]), lo = hexval(s[2 * i + 1]);
        if (hi < 0 || lo < 0)
            return CFG_ERR("%s must be %d hex digits (weftrun makes one); it "
                           "has other characters",
                           name, 2 * WEFT__TOKEN_BYTES);
        cfg->token[i] = (uint8_t)(hi << 4 | lo);
    }
    return WEFT_OK;
}

/* A string setting: weft_config's field where set, else the environment's
 * variable where set and not empty, else NULL. */
static const char *field_str(const char *field, const char *name)
{
    const char *s;

    if (field != NULL)
        return field;
    s = getenv(name);
    return s != NULL && *s != '\0' ? s : NULL;
}

/* The settings computed from the job where they are unset (raw[p] -1):
 * the helper threads and the passes they take, by the host's cores per
 * rank; the reducer's passes also by whether the job is on one host. */
static void resolve_auto(weft__config *cfg, const long *raw, int one_host)
{
    cfg->spare_cores = cores_per_rank(cfg, WEFT__REDUCE_THREAD_CORES);
    cfg->own_core = cores_per_rank(cfg, 1);
    if (raw[WEFT__P_REDUCE_THREAD] < 0)
        cfg->reduce_thread = cfg->spare_cores;
    if (raw[WEFT__P_SEND_THREAD] < 0)
        cfg->send_thread = cfg->spare_cores;
    /* WEFT_SEND_THREAD=1 asks for the thread in every pass, as
     * WEFT_REDUCE_THREAD=1 does for the reducer. */
    if (raw[WEFT__P_SEND_THREAD_PASS_BYTES] < 0)
        cfg->send_thread_pass_bytes =
            raw[WEFT__P_SEND_THREAD] == 1 ? 0
            : cores_per_rank(cfg, WEFT__SEND_THREAD_CORES)
                ? WEFT__SEND_THREAD_PASS_BYTES
                : WEFT__SEND_THREAD_SHARED_PASS_BYTES;
    if (raw[WEFT__P_REDUCE_THREAD_PASS_BYTES] < 0)
        cfg->reduce_thread_pass_bytes =
            raw[WEFT__P_REDUCE_THREAD] >= 0 ? 0
            : one_host && cfg->shm          ? WEFT__REDUCE_THREAD_SHM_PASS_BYTES
            : one_host ? WEFT__REDUCE_THREAD_LOOPBACK_PASS_BYTES
                       : 0;
    if (raw[WEFT__P_PULL_THREADS] < 0)
        cfg->pull_threads = auto_pull_threads(cfg);
}

/* The box's bytes and the mesh's switch (topo.h). */
static void sizes(weft__config *cfg)
{
    cfg->mesh_small_all_reduce_bytes = WEFT__MESH_SMALL_ALL_REDUCE_BYTES;
    cfg->box_bytes = box_bytes(cfg->nranks);
}

/* The job token: weft_config's, else WEFT_JOB_TOKEN's, else none. */
static int load_job_token(weft__config *cfg, const weft_config *uc,
                          char *errmsg, size_t errlen)
{
    const char *s;

    if (uc != NULL && uc->token != NULL)
        return load_token(cfg, "weft_config.token", uc->token, errmsg, errlen);
    if ((s = getenv("WEFT_JOB_TOKEN")) != NULL && *s != '\0')
        return load_token(cfg, "WEFT_JOB_TOKEN", s, errmsg, errlen);
    return WEFT_OK;
}

/* The transport, the RDMA device and the topology asked for, then the
 * topology in effect. */
static int load_strings(weft__config *cfg, const weft_config *uc, char *errmsg,
                        size_t errlen)
{
    weft__hostfile_out view;
    const char *s;
    int rc;

    s = field_str(uc ? uc->transport : NULL, "WEFT_TRANSPORT");
    if (s != NULL)
        snprintf(cfg->transport, sizeof cfg->transport, "%s", s);
    if (strcmp(cfg->transport, "tcp") != 0 &&
        strcmp(cfg->transport, "ibverbs") != 0)
        return CFG_ERR("unknown transport \"%s\" (%s or the hostfile's "
                       "\"transport\"): use tcp or ibverbs",
                       s != NULL ? s : cfg->transport,
                       uc && uc->transport ? "weft_config.transport"
                                           : "WEFT_TRANSPORT");
    s = getenv("WEFT_IB_DEVICE");
    if (s != NULL && *s != '\0') {
        if (strlen(s) >= sizeof cfg->ib_device)
            return CFG_ERR("WEFT_IB_DEVICE=\"%s\" is too long for an RDMA "
                           "device name (at most %zu characters)",
                           s, sizeof cfg->ib_device - 1);
        strcpy(cfg->ib_device, s);
    }
    s = field_str(uc ? uc->topology : NULL, "WEFT_TOPOLOGY");
    if (s != NULL)
        snprintf(cfg->topology, sizeof cfg->topology, "%s", s);
    if (strcmp(cfg->topology, "ring") != 0 &&
        strcmp(cfg->topology, "mesh") != 0 &&
        strcmp(cfg->topology, "auto") != 0)
        return CFG_ERR("unknown topology \"%s\" (%s or the hostfile's "
                       "\"topology\"): use ring, mesh or auto",
                       s != NULL ? s : cfg->topology,
                       uc && uc->topology ? "weft_config.topology"
                                          : "WEFT_TOPOLOGY");
    /* A mesh asked for by WEFT_TOPOLOGY needs a link between every pair
     * of hosts, as one asked for by the hostfile does. */
    memset(&view, 0, sizeof view);
    view.nranks = cfg->nranks;
    view.nhosts = cfg->nhosts;
    view.hosts = cfg->hosts;
    view.nlinks = cfg->nlinks;
    view.links = cfg->links;
    if (strcmp(cfg->topology, "mesh") == 0 &&
        (rc = weft__hostfile_check_mesh(&view, cfg->hostfile, errmsg,
                                        errlen)) != 0)
        return rc;
    cfg->mesh = weft__hostfile_mesh(&view, cfg->topology, NULL, 0);
    return WEFT_OK;
}

int weft__config_load(weft__config *cfg, const weft_config *uc, char *errmsg,
                      size_t errlen)
{
    long raw[WEFT__P_COUNT];
    int rc, one_host;

    memset(cfg, 0, sizeof *cfg);
    strcpy(cfg->transport, "tcp");
    strcpy(cfg->topology, "auto");
    if ((rc = load_rank_size(cfg, uc, errmsg, errlen)) != 0 ||
        (rc = load_params(cfg, uc, raw, errmsg, errlen)) != 0 ||
        (rc = load_job_token(cfg, uc, errmsg, errlen)) != 0 ||
        (rc = load_hostfile(cfg, uc, errmsg, errlen)) != 0 ||
        (rc = load_strings(cfg, uc, errmsg, errlen)) != 0)
        return rc;
    /* Ranks of one host talk over shared memory (under ibverbs too), or
     * over loopback under TCP. */
    one_host =
        cfg->nhosts == 1 && (cfg->shm || strcmp(cfg->transport, "tcp") == 0);
    resolve_auto(cfg, raw, one_host);
    sizes(cfg);
    cfg->hier_local = weft__hier_local(cfg);
    return WEFT_OK;
}

void weft__config_free(weft__config *cfg)
{
    /* The tables came from the hostfile loader (or have its shapes). */
    weft__hostfile_out tables;

    memset(&tables, 0, sizeof tables);
    tables.nhosts = cfg->nhosts;
    tables.hosts = cfg->hosts;
    tables.links = cfg->links;
    tables.rank_host = cfg->rank_host;
    weft__hostfile_free(&tables);
    memset(cfg, 0, sizeof *cfg);
}

int weft__config_rank_port(const weft__config *cfg, int r)
{
    const weft__host *h = &cfg->hosts[cfg->rank_host[r]];
    return h->ports[r - h->first_rank];
}

/* The cables of out joining hosts a and b, in index order: how many
 * (at most max into l). */
static int cables(const weft__config *out, int a, int b, int *l, int max)
{
    int n = 0;

    for (int i = 0; i < out->nlinks && n < max; i++)
        if (weft__cable_joins(&out->links[i], a, b))
            l[n++] = i;
    return n;
}

/* Where no cable joins two hosts next in rank order (a ring of hosts that
 * a host with no member left leaves a chain), the ring's step between them
 * runs over a path through the hosts between: the fewest steps (every rank
 * finds the same: hosts are tried in index order), and as many paths as
 * the fewest cables of any step (the k-th takes the k-th cable of each),
 * so that the pair has as many wires as over a cable and they fail over
 * as wires do. TCP runs them; under ibverbs, its TCP side does (no
 * device joins the two hosts). */
static int add_paths(weft__config *out, char *errmsg, size_t errlen)
{
    const int nh = out->nhosts;
    int *prev = malloc(sizeof *prev * (size_t)(nh > 0 ? nh : 1));
    int *queue = malloc(sizeof *queue * (size_t)(nh > 0 ? nh : 1));
    int rc = WEFT_OK;

    if (prev == NULL || queue == NULL) {
        rc = WEFT_ENOMEM;
        snprintf(errmsg, errlen, "out of memory");
    }
    for (int h = 0; rc == WEFT_OK && nh > 1 && h < nh; h++) {
        int next = (h + 1) % nh, qh = 0, qt = 0, steps[WEFT__MAX_VIA + 2];
        int ns = 0, npaths = WEFT__MAX_WIRES, l[WEFT__MAX_WIRES];

        if ((nh == 2 && h == 1) || cables(out, h, next, l, 1) > 0)
            continue;
        /* Breadth first from h over the cables. */
        for (int x = 0; x < nh; x++)
            prev[x] = -1;
        prev[h] = h;
        queue[qt++] = h;
        while (qh < qt && prev[next] < 0) {
            int x = queue[qh++];
            for (int y = 0; y < nh; y++)
                if (prev[y] < 0 && cables(out, x, y, l, 1) > 0) {
                    prev[y] = x;
                    queue[qt++] = y;
                }
        }
        if (prev[next] < 0) {
            /* The two parts: the hosts reached from h, and the others. */
            size_t at = (size_t)snprintf(
                errmsg, errlen,
                "the hosts of the ranks left are cut in two: no cable or "
                "path of cables joins");
            for (int part = 1; part >= 0; part--) {
                const char *sep = part ? " " : " to ";
                for (int x = 0; x < nh && at < errlen; x++)
                    if ((prev[x] >= 0) == part) {
                        at += (size_t)snprintf(errmsg + at, errlen - at, "%s%s",
                                               sep, out->hosts[x].name);
                        sep = ", ";
                    }
            }
            rc = WEFT_ENOTSUP;
            break;
        }
        for (int x = next; x != h; x = prev[x])
            if (ns <= WEFT__MAX_VIA + 1)
                steps[ns++] = x;
        if (ns > WEFT__MAX_VIA + 1) {
            snprintf(errmsg, errlen,
                     "the hosts of the ranks left no longer form a ring of "
                     "cables: no cable joins host %s to host %s, next in "
                     "rank order, and the path between goes through more "
                     "than 6 hosts",
                     out->hosts[h].name, out->hosts[next].name);
            rc = WEFT_ENOTSUP;
            break;
        }
        /* steps[] runs from next back to the host after h. */
        for (int i = 0, a = h; i < ns; i++) {
            int b = steps[ns - 1 - i],
                c = cables(out, a, b, l, WEFT__MAX_WIRES);
            if (c < npaths)
                npaths = c;
            a = b;
        }
        {
            weft__link *grown = realloc(
                out->links, sizeof *grown * (size_t)(out->nlinks + npaths));
            if (grown == NULL) {
                snprintf(errmsg, errlen, "out of memory");
                rc = WEFT_ENOMEM;
                break;
            }
            out->links = grown;
        }
        for (int k = 0; k < npaths; k++) {
            weft__link lk;

            memset(&lk, 0, sizeof lk);
            lk.end[0].host = h;
            lk.end[1].host = next;
            lk.nvia = ns - 1;
            for (int i = 0, a = h; i < ns; i++) {
                int b = steps[ns - 1 - i];
                cables(out, a, b, l, WEFT__MAX_WIRES);
                lk.hop[i] = l[k];
                if (i < ns - 1)
                    lk.via[i] = b;
                a = b;
            }
            out->links[out->nlinks++] = lk;
        }
    }
    free(prev);
    free(queue);
    return rc;
}

int weft__config_subset(const weft__config *old, const int *members, int n,
                        int rank, const int *ports, weft__config *out,
                        char *errmsg, size_t errlen)
{
    weft__hostfile_out view;
    int *host_new = NULL; /* old host index -> new, or -1 */
    int rc;

    memset(out, 0, sizeof *out);
    *out = *old;
    out->hosts = NULL;
    out->links = NULL;
    out->rank_host = NULL;
    out->nhosts = 0;
    out->nlinks = 0;
    out->rank = rank;
    out->nranks = n;
    host_new = malloc(sizeof *host_new * (size_t)old->nhosts);
    out->hosts = calloc((size_t)old->nhosts, sizeof *out->hosts);
    out->links =
        calloc((size_t)(old->nlinks > 0 ? old->nlinks : 1), sizeof *out->links);
    out->rank_host = calloc((size_t)n, sizeof *out->rank_host);
    if (host_new == NULL || out->hosts == NULL || out->links == NULL ||
        out->rank_host == NULL)
        goto nomem;
    for (int h = 0; h < old->nhosts; h++)
        host_new[h] = -1;
    /* Hosts in the order of their first member; a host's members must
     * follow one another (every transport numbers a host's ranks from its
     * first one). */
    for (int i = 0; i < n; i++) {
        int oh = old->rank_host[members[i]];
        weft__host *h;

        if (host_new[oh] < 0) {
            host_new[oh] = out->nhosts++;
            h = &out->hosts[host_new[oh]];
            *h = old->hosts[oh];
            h->nranks = 0;
            h->first_rank = i;
            h->ports = calloc((size_t)old->hosts[oh].nranks, sizeof(int));
            if (h->ports == NULL)
                goto nomem;
        }
        h = &out->hosts[host_new[oh]];
        if (h->first_rank + h->nranks != i) {
            snprintf(errmsg, errlen,
                     "the new communicator's ranks of host %s do not follow "
                     "one another (new rank %d comes after rank %d of "
                     "another host): order the ranks of each host together",
                     h->name, i, i - 1);
            free(host_new);
            weft__config_free(out);
            return WEFT_ENOTSUP;
        }
        h->ports[h->nranks++] =
            ports != NULL ? ports[i] : weft__config_rank_port(old, members[i]);
        out->rank_host[i] = host_new[oh];
    }
    for (int l = 0; l < old->nlinks; l++) {
        weft__link lk = old->links[l];
        int a = host_new[lk.end[0].host], b = host_new[lk.end[1].host];

        if (a < 0 || b < 0 || lk.nvia > 0)
            continue; /* paths are found anew below */
        lk.end[0].host = a;
        lk.end[1].host = b;
        out->links[out->nlinks++] = lk;
    }
    free(host_new);
    /* Ring or mesh by the cables alone (a path is no cable for a mesh). */
    memset(&view, 0, sizeof view);
    view.nranks = n;
    view.nhosts = out->nhosts;
    view.hosts = out->hosts;
    view.nlinks = out->nlinks;
    view.links = out->links;
    out->mesh = weft__hostfile_mesh(&view, out->topology, NULL, 0);
    if (!out->mesh && (rc = add_paths(out, errmsg, errlen)) != WEFT_OK) {
        weft__config_free(out);
        return rc;
    }
    sizes(out);
    out->hier_local = weft__hier_local(out);
    return WEFT_OK;
nomem:
    free(host_new);
    weft__config_free(out);
    snprintf(errmsg, errlen, "out of memory");
    return WEFT_ENOMEM;
}
