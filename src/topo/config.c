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
#include "topo/topo.h"

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

/* A weft_config field (set: non-zero) or, where it is left zero, the
 * environment variable name as env_int reads it. */
static int field_int(const char *field, int set, const char *name, long lo,
                     long hi, long dflt, long *out, char *errmsg, size_t errlen)
{
    if (set == 0)
        return env_int(name, lo, hi, dflt, out, errmsg, errlen);
    if (set < lo || set > hi)
        return CFG_ERR("weft_config.%s = %d is not in [%ld, %ld] (0: %s or "
                       "the default)",
                       field, set, lo, hi, name);
    *out = set;
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

int weft__config_load(weft__config *cfg, const weft_config *uc, char *errmsg,
                      size_t errlen)
{
    const char *s;
    long v, pass_bytes, thread;
    int send_forced;
    weft__hostfile_out view;
    int rc, one_host;

    memset(cfg, 0, sizeof *cfg);
    strcpy(cfg->transport, "tcp");
    strcpy(cfg->topology, "auto");
    if ((rc = load_rank_size(cfg, uc, errmsg, errlen)) != 0)
        return rc;
    if ((rc = field_int("timeout_ms", uc ? uc->timeout_ms : 0,
                        "WEFT_TIMEOUT_MS", 1, INT_MAX, WEFT__DEFAULT_TIMEOUT_MS,
                        &v, errmsg, errlen)) != 0)
        return rc;
    cfg->timeout_ms = (int)v;
    if ((rc = field_int("connect_timeout_ms", uc ? uc->connect_timeout_ms : 0,
                        "WEFT_CONNECT_TIMEOUT_MS", 1, INT_MAX,
                        WEFT__DEFAULT_CONNECT_TIMEOUT_MS, &v, errmsg,
                        errlen)) != 0)
        return rc;
    cfg->connect_timeout_ms = (int)v;
    if ((rc = field_int("wires", uc ? uc->wires : 0, "WEFT_WIRES", 1, 16, 1, &v,
                        errmsg, errlen)) != 0)
        return rc;
    cfg->wires = (int)v;
    if ((rc = env_int("WEFT_FRAME_BYTES", 4096, 64L << 20,
                      WEFT__DEFAULT_FRAME_BYTES, &v, errmsg, errlen)) != 0)
        return rc;
    cfg->frame_bytes = (size_t)v & ~(size_t)7; /* whole elements of any dtype */
    if ((rc = env_int("WEFT_SOCKBUF_BYTES", 0, 1L << 30,
                      WEFT__DEFAULT_SOCKBUF_BYTES, &v, errmsg, errlen)) != 0)
        return rc;
    if (v != 0 && v < SOCKBUF_MIN_BYTES)
        return CFG_ERR("WEFT_SOCKBUF_BYTES=%ld is below the floor of %d "
                       "bytes (smaller buffers stall TCP); set it to at "
                       "least %d, or to 0 for the kernel's autotuning",
                       v, SOCKBUF_MIN_BYTES, SOCKBUF_MIN_BYTES);
    cfg->sockbuf_bytes = (int)v;
    if ((rc = env_int("WEFT_MIN_WIRE_BYTES", 1, 1L << 30, WEFT__MIN_WIRE_BYTES,
                      &v, errmsg, errlen)) != 0)
        return rc;
    cfg->min_wire_bytes = (size_t)v;
    /* The thresholds between algorithms: the tuning table's defaults
     * (core/tune.c), which WEFT_ALGO overrides. */
    cfg->small_all_reduce_bytes = WEFT__SMALL_ALL_REDUCE_BYTES;
    cfg->mesh_small_all_reduce_bytes = WEFT__MESH_SMALL_ALL_REDUCE_BYTES;
    cfg->box_bytes = box_bytes(cfg->nranks);
    cfg->halving_fold_all_reduce_bytes = WEFT__HALVING_FOLD_ALL_REDUCE_BYTES;
    cfg->hier = 1;
    cfg->hier_all_reduce_bytes = WEFT__HIER_ALL_REDUCE_BYTES;
    cfg->hier_all_gather_bytes = WEFT__HIER_ALL_GATHER_BYTES;
    cfg->hier_reduce_scatter_bytes = WEFT__HIER_REDUCE_SCATTER_BYTES;
    cfg->hier_broadcast_bytes = WEFT__HIER_BROADCAST_BYTES;
    cfg->pull_all_reduce_bytes = WEFT__PULL_ALL_REDUCE_BYTES;
    cfg->pull_all_gather_bytes = WEFT__PULL_ALL_GATHER_BYTES;
    cfg->pull_reduce_scatter_bytes = WEFT__PULL_REDUCE_SCATTER_BYTES;
    cfg->pull_broadcast_bytes = WEFT__PULL_BROADCAST_BYTES;
    if ((rc = env_int("WEFT_BIDIR_MIN_BYTES", 0, 1L << 40,
                      WEFT__BIDIR_MIN_BYTES, &v, errmsg, errlen)) != 0)
        return rc;
    cfg->bidir_min_bytes = (size_t)v;
    if ((rc = env_int("WEFT_REDUCE_THREAD_MIN_BYTES", 1, 1L << 30,
                      WEFT__REDUCE_THREAD_MIN_BYTES, &v, errmsg, errlen)) != 0)
        return rc;
    cfg->reduce_thread_min_bytes = (size_t)v;
    /* Unset: its default depends on the transport (below). */
    if ((rc = env_int("WEFT_REDUCE_THREAD_PASS_BYTES", 0, 1L << 40, -1, &v,
                      errmsg, errlen)) != 0)
        return rc;
    pass_bytes = v;

    rc = WEFT_OK;
    if (uc != NULL && uc->token != NULL)
        rc = load_token(cfg, "weft_config.token", uc->token, errmsg, errlen);
    else if ((s = getenv("WEFT_JOB_TOKEN")) != NULL && *s != '\0')
        rc = load_token(cfg, "WEFT_JOB_TOKEN", s, errmsg, errlen);
    if (rc != 0)
        return rc;

    if ((rc = load_hostfile(cfg, uc, errmsg, errlen)) != 0)
        return rc;
    if ((rc = env_int("WEFT_REDUCE_THREAD", 0, 1, -1, &v, errmsg, errlen)) != 0)
        return rc;
    thread = v;
    cfg->spare_cores = cores_per_rank(cfg, WEFT__REDUCE_THREAD_CORES);
    cfg->own_core = cores_per_rank(cfg, 1);
    cfg->reduce_thread = v >= 0 ? (int)v : cfg->spare_cores;
    if ((rc = env_int("WEFT_SEND_THREAD", 0, 1, -1, &v, errmsg, errlen)) != 0)
        return rc;
    cfg->send_thread = v >= 0 ? (int)v : cfg->spare_cores;
    send_forced = v == 1;
    if ((rc = env_int("WEFT_SEND_THREAD_MIN_BYTES", 1, 1L << 30,
                      WEFT__SEND_THREAD_MIN_BYTES, &v, errmsg, errlen)) != 0)
        return rc;
    cfg->send_thread_min_bytes = (size_t)v;
    /* WEFT_SEND_THREAD=1 asks for the thread in every pass, as the
     * reducer's does. */
    if ((rc = env_int("WEFT_SEND_THREAD_PASS_BYTES", 0, 1L << 40,
                      send_forced ? 0
                      : cores_per_rank(cfg, WEFT__SEND_THREAD_CORES)
                          ? WEFT__SEND_THREAD_PASS_BYTES
                          : WEFT__SEND_THREAD_SHARED_PASS_BYTES,
                      &v, errmsg, errlen)) != 0)
        return rc;
    cfg->send_thread_pass_bytes = (size_t)v;

    /* A wait polls (yielding the core between polls) this long before it
     * sleeps: measured faster for small operations both with a core per
     * rank and with 4 ranks on 2 cores, and no slower for large ones. */
    if ((rc = env_int("WEFT_SPIN_US", 0, 1000000, WEFT__DEFAULT_SPIN_US, &v,
                      errmsg, errlen)) != 0)
        return rc;
    cfg->spin_us = (int)v;

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
    if ((rc = env_int("WEFT_SHM", 0, 1, 1, &v, errmsg, errlen)) != 0)
        return rc;
    cfg->shm = (int)v;
    /* Every peer of this job is a rank of this host: halving's fewer,
     * larger rounds beat the ring up to several MiB through shared memory
     * and up to 1 MiB over loopback TCP (topo.h). Across hosts the default
     * stays the one measured over cables. */
    one_host = cfg->nhosts == 1 && strcmp(cfg->transport, "tcp") == 0;
    cfg->halving_all_reduce_bytes =
        one_host && cfg->shm ? WEFT__HALVING_SHM_ALL_REDUCE_BYTES
        : one_host           ? WEFT__HALVING_LOOPBACK_ALL_REDUCE_BYTES
                             : WEFT__HALVING_ALL_REDUCE_BYTES;
    cfg->doubling_all_reduce_bytes =
        one_host && cfg->shm && cfg->nranks >= WEFT__DOUBLING_WIDE_RANKS
            ? WEFT__DOUBLING_WIDE_ALL_REDUCE_BYTES
        : one_host && cfg->shm ? WEFT__DOUBLING_SHM_ALL_REDUCE_BYTES
                               : WEFT__DOUBLING_ALL_REDUCE_BYTES;
    /* WEFT_REDUCE_THREAD=1 asks for the thread in every pass. */
    cfg->reduce_thread_pass_bytes =
        pass_bytes >= 0        ? (size_t)pass_bytes
        : thread >= 0          ? 0
        : one_host && cfg->shm ? WEFT__REDUCE_THREAD_SHM_PASS_BYTES
        : one_host             ? WEFT__REDUCE_THREAD_LOOPBACK_PASS_BYTES
                               : 0;
    if ((rc = env_int("WEFT_SHM_RING_BYTES", 4096, 1L << 30,
                      WEFT__DEFAULT_SHM_RING_BYTES, &v, errmsg, errlen)) != 0)
        return rc;
    if ((v & (v - 1)) != 0)
        return CFG_ERR("WEFT_SHM_RING_BYTES=%ld is not a power of two", v);
    cfg->shm_ring_bytes = (size_t)v;
    if ((rc = env_int("WEFT_SHM_CMA_BYTES", 0, 1L << 40,
                      WEFT__DEFAULT_SHM_CMA_BYTES, &v, errmsg, errlen)) != 0)
        return rc;
    cfg->shm_cma_bytes = (size_t)v;
    if ((rc = env_int("WEFT_HIER_PULL_ALL_REDUCE_BYTES", 0, 1L << 40,
                      WEFT__HIER_PULL_ALL_REDUCE_BYTES, &v, errmsg, errlen)) !=
        0)
        return rc;
    cfg->hier_pull_all_reduce_bytes = (size_t)v;
    if ((rc = env_int("WEFT_HIER_PULL_ALL_GATHER_BYTES", 0, 1L << 40,
                      WEFT__HIER_PULL_ALL_GATHER_BYTES, &v, errmsg, errlen)) !=
        0)
        return rc;
    cfg->hier_pull_all_gather_bytes = (size_t)v;
    if ((rc = env_int("WEFT_HIER_PULL_REDUCE_SCATTER_BYTES", 0, 1L << 40,
                      WEFT__HIER_PULL_REDUCE_SCATTER_BYTES, &v, errmsg,
                      errlen)) != 0)
        return rc;
    cfg->hier_pull_reduce_scatter_bytes = (size_t)v;
    if ((rc = env_int("WEFT_PULL_THREADS", 0, 64, -1, &v, errmsg, errlen)) != 0)
        return rc;
    cfg->pull_threads = v >= 0 ? (int)v : auto_pull_threads(cfg);
    if ((rc = env_int("WEFT_IB_SLOTS", 2, 4096, WEFT__DEFAULT_IB_SLOTS, &v,
                      errmsg, errlen)) != 0)
        return rc;
    cfg->ib_slots = (int)v;
    if ((rc = env_int("WEFT_IB_SLOT_BYTES", 4096, 16L << 20,
                      WEFT__DEFAULT_IB_SLOT_BYTES, &v, errmsg, errlen)) != 0)
        return rc;
    cfg->ib_slot_bytes = (size_t)v;
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
