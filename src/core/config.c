/*
 * Configuration from the environment and the hostfile.
 *
 * Every failure says what is wrong and what to set, since the person reading
 * it is usually starting a job by hand.
 */
#include "core/internal.h"
#include "core/plan.h"

#include <errno.h>
#include <jansson.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define CFG_ERR(...) (snprintf(errmsg, errlen, __VA_ARGS__), WEFT_ECONFIG)

/* Parses a decimal integer in [lo, hi]; returns 0 on success. */
static int parse_int(const char *s, long lo, long hi, long *out)
{
    char *end;
    long v;

    if (s == NULL || *s == '\0')
        return -1;
    errno = 0;
    v = strtol(s, &end, 10);
    if (errno != 0 || *end != '\0' || v < lo || v > hi)
        return -1;
    *out = v;
    return 0;
}

static int env_int(const char *name, long lo, long hi, long dflt, long *out,
                   char *errmsg, size_t errlen)
{
    const char *s = getenv(name);

    if (s == NULL || *s == '\0') {
        *out = dflt;
        return WEFT_OK;
    }
    if (parse_int(s, lo, hi, out) != 0)
        return CFG_ERR("%s=\"%s\" is not an integer in [%ld, %ld]; set it to "
                       "one or unset it",
                       name, s, lo, hi);
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

/* Rank and size, from weftrun's variables or another launcher's. */
static int load_rank_size(weft__config *cfg, char *errmsg, size_t errlen)
{
    static const char *const pairs[][2] = {
        {"WEFT_RANK", "WEFT_SIZE"},
        {"OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE"},
        {"PMI_RANK", "PMI_SIZE"},
        {"SLURM_PROCID", "SLURM_NTASKS"},
        {"RANK", "WORLD_SIZE"},
    };
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
        if (parse_int(ss, 1, WEFT__MAX_RANKS, &s) != 0)
            return CFG_ERR("%s=\"%s\" is not a job size in [1, %d]",
                           pairs[i][1], ss, WEFT__MAX_RANKS);
        if (parse_int(rs, 0, s - 1, &r) != 0)
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

static int json_str_field(json_t *obj, const char *key, char *dst,
                          size_t dstlen, int required, const char *path,
                          const char *file, char *errmsg, size_t errlen)
{
    json_t *v = json_object_get(obj, key);

    if (v == NULL) {
        if (required)
            return CFG_ERR("%s: %s: missing field \"%s\" (a string)", file,
                           path, key);
        return WEFT_OK;
    }
    if (!json_is_string(v))
        return CFG_ERR("%s: %s.%s: expected a string", file, path, key);
    if (json_string_length(v) >= dstlen || json_string_length(v) == 0)
        return CFG_ERR("%s: %s.%s: expected a non-empty string shorter than "
                       "%zu bytes",
                       file, path, key, dstlen);
    memcpy(dst, json_string_value(v), json_string_length(v) + 1);
    return WEFT_OK;
}

static int json_port(json_t *v, const char *file, const char *path,
                     int *out, char *errmsg, size_t errlen)
{
    if (!json_is_integer(v) || json_integer_value(v) < 1 ||
        json_integer_value(v) > 65535)
        return CFG_ERR("%s: %s: expected a port number in [1, 65535]", file,
                       path);
    *out = (int)json_integer_value(v);
    return WEFT_OK;
}

static int find_host(const weft__config *cfg, const char *name)
{
    for (int i = 0; i < cfg->nhosts; i++)
        if (strcmp(cfg->hosts[i].name, name) == 0)
            return i;
    return -1;
}

static int load_hosts(weft__config *cfg, json_t *root, const char *file,
                      char *errmsg, size_t errlen)
{
    json_t *hosts = json_object_get(root, "hosts");
    json_t *jport = json_object_get(root, "port");
    int port = WEFT__DEFAULT_PORT, total = 0, rc;
    char path[64];

    if (jport != NULL &&
        (rc = json_port(jport, file, "port", &port, errmsg, errlen)) != 0)
        return rc;
    if (!json_is_array(hosts) || json_array_size(hosts) == 0)
        return CFG_ERR("%s: \"hosts\": expected a non-empty array of hosts",
                       file);
    cfg->nhosts = (int)json_array_size(hosts);
    cfg->hosts = calloc((size_t)cfg->nhosts, sizeof *cfg->hosts);
    if (cfg->hosts == NULL)
        return WEFT_ENOMEM;
    for (int i = 0; i < cfg->nhosts; i++) {
        json_t *h = json_array_get(hosts, (size_t)i);
        weft__host *host = &cfg->hosts[i];
        json_t *jr, *jports;

        snprintf(path, sizeof path, "hosts[%d]", i);
        if (!json_is_object(h))
            return CFG_ERR("%s: %s: expected an object with \"name\" and "
                           "\"ranks\"",
                           file, path);
        if ((rc = json_str_field(h, "name", host->name, sizeof host->name, 1,
                                 path, file, errmsg, errlen)) != 0)
            return rc;
        if (find_host(cfg, host->name) != i)
            return CFG_ERR("%s: %s.name: host \"%s\" is listed twice", file,
                           path, host->name);
        strcpy(host->ssh, host->name);
        if ((rc = json_str_field(h, "ssh", host->ssh, sizeof host->ssh, 0,
                                 path, file, errmsg, errlen)) != 0)
            return rc;
        jr = json_object_get(h, "ranks");
        if (jr == NULL)
            host->nranks = 1;
        else if (!json_is_integer(jr) || json_integer_value(jr) < 1 ||
                 json_integer_value(jr) > WEFT__MAX_RANKS)
            return CFG_ERR("%s: %s.ranks: expected an integer in [1, %d]",
                           file, path, WEFT__MAX_RANKS);
        else
            host->nranks = (int)json_integer_value(jr);
        host->first_rank = total;
        total += host->nranks;
        if (total > WEFT__MAX_RANKS)
            return CFG_ERR("%s: more than %d ranks in \"hosts\"", file,
                           WEFT__MAX_RANKS);
        host->ports = calloc((size_t)host->nranks, sizeof *host->ports);
        if (host->ports == NULL)
            return WEFT_ENOMEM;
        jports = json_object_get(h, "ports");
        if (jports != NULL) {
            if (!json_is_array(jports) ||
                json_array_size(jports) != (size_t)host->nranks)
                return CFG_ERR("%s: %s.ports: expected an array of %d port "
                               "numbers (one per rank)",
                               file, path, host->nranks);
            for (int k = 0; k < host->nranks; k++) {
                char p2[96];
                snprintf(p2, sizeof p2, "%s.ports[%d]", path, k);
                if ((rc = json_port(json_array_get(jports, (size_t)k), file,
                                    p2, &host->ports[k], errmsg, errlen)) != 0)
                    return rc;
                for (int j = 0; j < k; j++)
                    if (host->ports[j] == host->ports[k])
                        return CFG_ERR("%s: %s: port %d is used twice", file,
                                       p2, host->ports[k]);
            }
        } else {
            for (int k = 0; k < host->nranks; k++) {
                if (port + k > 65535)
                    return CFG_ERR("%s: %s: port %d + %d local ranks is past "
                                   "65535",
                                   file, path, port, host->nranks);
                host->ports[k] = port + k;
            }
        }
    }
    if (total != cfg->nranks)
        return CFG_ERR("%s: the hosts hold %d ranks but the job has %d (the "
                       "size variable, e.g. WEFT_SIZE); make them agree",
                       file, total, cfg->nranks);
    cfg->rank_host = calloc((size_t)cfg->nranks, sizeof *cfg->rank_host);
    if (cfg->rank_host == NULL)
        return WEFT_ENOMEM;
    for (int i = 0; i < cfg->nhosts; i++)
        for (int k = 0; k < cfg->hosts[i].nranks; k++)
            cfg->rank_host[cfg->hosts[i].first_rank + k] = i;
    return WEFT_OK;
}

static int load_links(weft__config *cfg, json_t *root, const char *file,
                      char *errmsg, size_t errlen)
{
    json_t *links = json_object_get(root, "links");
    char path[64];
    int rc;

    if (links == NULL)
        return WEFT_OK;
    if (!json_is_array(links))
        return CFG_ERR("%s: \"links\": expected an array of links, each a "
                       "pair of ends",
                       file);
    cfg->nlinks = (int)json_array_size(links);
    if (cfg->nlinks == 0)
        return WEFT_OK;
    cfg->links = calloc((size_t)cfg->nlinks, sizeof *cfg->links);
    if (cfg->links == NULL)
        return WEFT_ENOMEM;
    for (int i = 0; i < cfg->nlinks; i++) {
        json_t *l = json_array_get(links, (size_t)i);
        if (!json_is_array(l) || json_array_size(l) != 2)
            return CFG_ERR("%s: links[%d]: expected an array of two ends", file,
                           i);
        for (int e = 0; e < 2; e++) {
            json_t *end = json_array_get(l, (size_t)e);
            weft__link_end *le = &cfg->links[i].end[e];
            char hname[128];

            snprintf(path, sizeof path, "links[%d][%d]", i, e);
            if (!json_is_object(end))
                return CFG_ERR("%s: %s: expected an object with \"host\" and "
                               "\"addr\"",
                               file, path);
            if ((rc = json_str_field(end, "host", hname, sizeof hname, 1, path,
                                     file, errmsg, errlen)) != 0 ||
                (rc = json_str_field(end, "addr", le->addr, sizeof le->addr,
                                     1, path, file, errmsg, errlen)) != 0 ||
                (rc = json_str_field(end, "device", le->device,
                                     sizeof le->device, 0, path, file, errmsg,
                                     errlen)) != 0)
                return rc;
            le->host = find_host(cfg, hname);
            if (le->host < 0)
                return CFG_ERR("%s: %s.host: unknown host \"%s\" (not in "
                               "\"hosts\")",
                               file, path, hname);
        }
        if (cfg->links[i].end[0].host == cfg->links[i].end[1].host)
            return CFG_ERR("%s: links[%d]: both ends are on host \"%s\"", file,
                           i, cfg->hosts[cfg->links[i].end[0].host].name);
    }
    return WEFT_OK;
}

static int load_hostfile(weft__config *cfg, char *errmsg, size_t errlen)
{
    const char *file = getenv("WEFT_HOSTFILE");
    json_error_t jerr;
    json_t *root;
    int rc;

    if (file == NULL || *file == '\0') {
        if (cfg->nranks == 1) {
            /* A job of one rank needs no peers and so no hostfile. */
            static int one_port[1] = {WEFT__DEFAULT_PORT};
            cfg->nhosts = 1;
            cfg->hosts = calloc(1, sizeof *cfg->hosts);
            cfg->rank_host = calloc(1, sizeof *cfg->rank_host);
            if (cfg->hosts == NULL || cfg->rank_host == NULL)
                return WEFT_ENOMEM;
            strcpy(cfg->hosts[0].name, "localhost");
            cfg->hosts[0].nranks = 1;
            cfg->hosts[0].ports = malloc(sizeof(int));
            if (cfg->hosts[0].ports == NULL)
                return WEFT_ENOMEM;
            cfg->hosts[0].ports[0] = one_port[0];
            return WEFT_OK;
        }
        return CFG_ERR("WEFT_HOSTFILE is not set: set it to the job's "
                       "hostfile (weftrun sets it)");
    }
    snprintf(cfg->hostfile, sizeof cfg->hostfile, "%s", file);
    root = json_load_file(file, JSON_REJECT_DUPLICATES, &jerr);
    if (root == NULL)
        return CFG_ERR("WEFT_HOSTFILE=%s: line %d, column %d: %s", file,
                       jerr.line, jerr.column, jerr.text);
    if (!json_is_object(root)) {
        json_decref(root);
        return CFG_ERR("%s: expected a JSON object with \"hosts\" and "
                       "\"links\" (this form of hostfile is not supported "
                       "yet)",
                       file);
    }
    rc = json_str_field(root, "transport", cfg->transport,
                        sizeof cfg->transport, 0, "top level", file, errmsg,
                        errlen);
    if (rc == 0)
        rc = json_str_field(root, "topology", cfg->topology,
                            sizeof cfg->topology, 0, "top level", file, errmsg,
                            errlen);
    if (rc == 0)
        rc = load_hosts(cfg, root, file, errmsg, errlen);
    if (rc == 0)
        rc = load_links(cfg, root, file, errmsg, errlen);
    json_decref(root);
    return rc;
}

int weft__config_load(weft__config *cfg, char *errmsg, size_t errlen)
{
    const char *s;
    long v;
    int rc;

    memset(cfg, 0, sizeof *cfg);
    strcpy(cfg->transport, "tcp");
    strcpy(cfg->topology, "auto");
    if ((rc = load_rank_size(cfg, errmsg, errlen)) != 0)
        return rc;
    if ((rc = env_int("WEFT_TIMEOUT_MS", 1, INT_MAX, WEFT__DEFAULT_TIMEOUT_MS,
                      &v, errmsg, errlen)) != 0)
        return rc;
    cfg->timeout_ms = (int)v;
    if ((rc = env_int("WEFT_CONNECT_TIMEOUT_MS", 1, INT_MAX,
                      WEFT__DEFAULT_CONNECT_TIMEOUT_MS, &v, errmsg,
                      errlen)) != 0)
        return rc;
    cfg->connect_timeout_ms = (int)v;
    if ((rc = env_int("WEFT_WIRES", 1, 16, 1, &v, errmsg, errlen)) != 0)
        return rc;
    cfg->wires = (int)v;
    if ((rc = env_int("WEFT_FRAME_BYTES", 4096, 64L << 20,
                      WEFT__DEFAULT_FRAME_BYTES, &v, errmsg, errlen)) != 0)
        return rc;
    cfg->frame_bytes = (size_t)v & ~(size_t)7; /* whole elements of any dtype */
    if ((rc = env_int("WEFT_SOCKBUF_BYTES", 0, 1L << 30,
                      WEFT__DEFAULT_SOCKBUF_BYTES, &v, errmsg, errlen)) != 0)
        return rc;
    cfg->sockbuf_bytes = (int)v;
    if ((rc = env_int("WEFT_MIN_WIRE_BYTES", 1, 1L << 30,
                      WEFT__MIN_WIRE_BYTES, &v, errmsg, errlen)) != 0)
        return rc;
    cfg->min_wire_bytes = (size_t)v;
    if ((rc = env_int("WEFT_SMALL_ALL_REDUCE_BYTES", 0, 1L << 30,
                      WEFT__SMALL_ALL_REDUCE_BYTES, &v, errmsg, errlen)) != 0)
        return rc;
    cfg->small_all_reduce_bytes = (size_t)v;
    if ((rc = env_int("WEFT_BIDIR_MIN_BYTES", 0, 1L << 40,
                      WEFT__BIDIR_MIN_BYTES, &v, errmsg, errlen)) != 0)
        return rc;
    cfg->bidir_min_bytes = (size_t)v;

    s = getenv("WEFT_JOB_TOKEN");
    if (s != NULL && *s != '\0') {
        if (strlen(s) != 2 * WEFT__TOKEN_BYTES)
            return CFG_ERR("WEFT_JOB_TOKEN must be %d hex digits (weftrun "
                           "makes one); got %zu characters",
                           2 * WEFT__TOKEN_BYTES, strlen(s));
        for (int i = 0; i < WEFT__TOKEN_BYTES; i++) {
            int hi = hexval(s[2 * i]), lo = hexval(s[2 * i + 1]);
            if (hi < 0 || lo < 0)
                return CFG_ERR("WEFT_JOB_TOKEN must be %d hex digits "
                               "(weftrun makes one); it has other characters",
                               2 * WEFT__TOKEN_BYTES);
            cfg->token[i] = (uint8_t)(hi << 4 | lo);
        }
    }

    if ((rc = load_hostfile(cfg, errmsg, errlen)) != 0)
        return rc;

    /* A wait polls (yielding the core between polls) this long before it
     * sleeps: measured faster for small operations both with a core per
     * rank and with 4 ranks on 2 cores, and no slower for large ones. */
    if ((rc = env_int("WEFT_SPIN_US", 0, 1000000, WEFT__DEFAULT_SPIN_US, &v,
                      errmsg, errlen)) != 0)
        return rc;
    cfg->spin_us = (int)v;

    s = getenv("WEFT_TRANSPORT");
    if (s != NULL && *s != '\0')
        snprintf(cfg->transport, sizeof cfg->transport, "%s", s);
    if (strcmp(cfg->transport, "tcp") != 0 &&
        strcmp(cfg->transport, "ibverbs") != 0)
        return CFG_ERR("unknown transport \"%s\" (WEFT_TRANSPORT or the "
                       "hostfile's \"transport\"): use tcp or ibverbs",
                       cfg->transport);
    s = getenv("WEFT_TOPOLOGY");
    if (s != NULL && *s != '\0')
        snprintf(cfg->topology, sizeof cfg->topology, "%s", s);
    if (strcmp(cfg->topology, "ring") != 0 &&
        strcmp(cfg->topology, "mesh") != 0 &&
        strcmp(cfg->topology, "auto") != 0)
        return CFG_ERR("unknown topology \"%s\" (WEFT_TOPOLOGY or the "
                       "hostfile's \"topology\"): use ring, mesh or auto",
                       cfg->topology);
    return WEFT_OK;
}

void weft__config_free(weft__config *cfg)
{
    if (cfg->hosts != NULL)
        for (int i = 0; i < cfg->nhosts; i++)
            free(cfg->hosts[i].ports);
    free(cfg->hosts);
    free(cfg->links);
    free(cfg->rank_host);
    memset(cfg, 0, sizeof *cfg);
}

int weft__config_rank_port(const weft__config *cfg, int r)
{
    const weft__host *h = &cfg->hosts[cfg->rank_host[r]];
    return h->ports[r - h->first_rank];
}
