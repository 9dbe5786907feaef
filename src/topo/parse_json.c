/*
 * weft's JSON hostfile object (README / API.md "Hostfile"): "hosts" (each
 * with "name", optional "ssh", "ranks" and "ports"), "links" (pairs of
 * ends, each {"host", "addr", optional "device"}), optional "transport",
 * "topology" and "port". Messages name the field by its path, such as
 * hosts[1].ranks or links[0][1].addr.
 */
#include "topo/hostfile_int.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* What v is, for "expected X, got Y". */
static const char *jtype(const json_t *v)
{
    switch (json_typeof(v)) {
    case JSON_OBJECT:
        return "an object";
    case JSON_ARRAY:
        return "an array";
    case JSON_STRING:
        return "a string";
    case JSON_INTEGER:
        return "an integer";
    case JSON_REAL:
        return "a real number";
    case JSON_TRUE:
    case JSON_FALSE:
        return "a boolean";
    default:
        return "null";
    }
}

/* A string field of obj at path: copied to dst (non-empty, shorter than
 * dstlen). Absent and not required: dst is left as it is. */
static int json_str(hf_ctx *c, json_t *obj, const char *key, char *dst,
                    size_t dstlen, int required, const char *path)
{
    json_t *v = json_object_get(obj, key);
    const char *sep = *path ? "." : "";

    if (v == NULL) {
        if (required)
            return weft__hf_fail(c, "%s%smissing field \"%s\" (a string)", path,
                                 *path ? ": " : "", key);
        return WEFT_OK;
    }
    if (!json_is_string(v))
        return weft__hf_fail(c, "%s%s%s: expected a string, got %s", path, sep,
                             key, jtype(v));
    if (json_string_length(v) >= dstlen || json_string_length(v) == 0)
        return weft__hf_fail(c,
                             "%s%s%s: expected a non-empty string shorter "
                             "than %zu bytes",
                             path, sep, key, dstlen);
    if (strlen(json_string_value(v)) != json_string_length(v))
        return weft__hf_fail(c,
                             "%s%s%s: expected a string without NUL "
                             "characters",
                             path, sep, key);
    memcpy(dst, json_string_value(v), json_string_length(v) + 1);
    return WEFT_OK;
}

static int json_port(hf_ctx *c, json_t *v, const char *path, int *out)
{
    if (!json_is_integer(v))
        return weft__hf_fail(c,
                             "%s: expected a port number in [1, 65535], got "
                             "%s",
                             path, jtype(v));
    if (json_integer_value(v) < 1 || json_integer_value(v) > 65535)
        return weft__hf_fail(c,
                             "%s: expected a port number in [1, 65535], got "
                             "%" JSON_INTEGER_FORMAT,
                             path, json_integer_value(v));
    *out = (int)json_integer_value(v);
    return WEFT_OK;
}

/* host->ports (allocated, host->nranks entries): the host's "ports" where
 * it gives them, one per rank and all different, else port, port + 1, ...
 * (port: the file's "port" or the default). */
static int obj_ports(hf_ctx *c, json_t *jh, weft__host *host, int port,
                     const char *path)
{
    json_t *jports = json_object_get(jh, "ports");
    int rc;

    if (jports == NULL) {
        if (weft__hf_default_ports(host, port) != 0)
            return weft__hf_fail(c,
                                 "%s: port %d + %d local ranks is past "
                                 "65535; lower \"port\" or give \"ports\"",
                                 path, port, host->nranks);
        return WEFT_OK;
    }
    if (!json_is_array(jports) ||
        json_array_size(jports) != (size_t)host->nranks)
        return weft__hf_fail(c,
                             "%s.ports: expected an array of %d port "
                             "numbers (one per rank)",
                             path, host->nranks);
    for (int k = 0; k < host->nranks; k++) {
        char p2[96];
        snprintf(p2, sizeof p2, "%s.ports[%d]", path, k);
        if ((rc = json_port(c, json_array_get(jports, (size_t)k), p2,
                            &host->ports[k])) != 0)
            return rc;
        for (int j = 0; j < k; j++)
            if (host->ports[j] == host->ports[k])
                return weft__hf_fail(c,
                                     "%s: port %d is already %s.ports[%d]; "
                                     "each rank of a host needs a port of "
                                     "its own",
                                     p2, host->ports[k], path, j);
    }
    return WEFT_OK;
}

/* hosts[i] (at path): name, ssh and ranks, with the hosts before it
 * already read (for the duplicate check). */
static int obj_host(hf_ctx *c, json_t *jh, weft__hostfile_out *h, int i,
                    const char *path)
{
    weft__host *host = &h->hosts[i];
    json_t *jr;
    int other, rc;

    if (!json_is_object(jh))
        return weft__hf_fail(c,
                             "%s: expected an object with \"name\" and "
                             "\"ranks\"",
                             path);
    if ((rc = json_str(c, jh, "name", host->name, sizeof host->name, 1,
                       path)) != 0)
        return rc;
    other = weft__hf_find_host(h, i, host->name);
    if (other >= 0)
        return weft__hf_fail(c,
                             "%s.name: host \"%s\" is already hosts[%d]; "
                             "list each host once",
                             path, host->name, other);
    strcpy(host->ssh, host->name);
    if ((rc = json_str(c, jh, "ssh", host->ssh, sizeof host->ssh, 0, path)) !=
        0)
        return rc;
    jr = json_object_get(jh, "ranks");
    if (jr == NULL)
        host->nranks = 1;
    else if (!json_is_integer(jr))
        return weft__hf_fail(c,
                             "%s.ranks: expected an integer in [1, %d], got "
                             "%s",
                             path, WEFT__MAX_RANKS, jtype(jr));
    else if (json_integer_value(jr) < 1 ||
             json_integer_value(jr) > WEFT__MAX_RANKS)
        return weft__hf_fail(c,
                             "%s.ranks: expected an integer in [1, %d], got "
                             "%" JSON_INTEGER_FORMAT,
                             path, WEFT__MAX_RANKS, json_integer_value(jr));
    else
        host->nranks = (int)json_integer_value(jr);
    return WEFT_OK;
}

static int obj_hosts(hf_ctx *c, json_t *root, weft__hostfile_out *h)
{
    json_t *hosts = json_object_get(root, "hosts");
    json_t *jport = json_object_get(root, "port");
    int port = WEFT__DEFAULT_PORT, total = 0, rc;
    char path[64];

    if (jport != NULL && (rc = json_port(c, jport, "port", &port)) != 0)
        return rc;
    if (hosts == NULL)
        return weft__hf_fail(c, "missing field \"hosts\" (a non-empty array "
                                "of hosts, each {\"name\": ..., \"ranks\": "
                                "...})");
    if (!json_is_array(hosts) || json_array_size(hosts) == 0)
        return weft__hf_fail(c, "hosts: expected a non-empty array of hosts, "
                                "each {\"name\": ..., \"ranks\": ...}");
    if (json_array_size(hosts) > WEFT__MAX_RANKS)
        return weft__hf_fail(c, "hosts: more than %d hosts", WEFT__MAX_RANKS);
    h->hosts = calloc(json_array_size(hosts), sizeof *h->hosts);
    if (h->hosts == NULL)
        return weft__hf_nomem(c);
    for (size_t i = 0; i < json_array_size(hosts); i++) {
        weft__host *host = &h->hosts[i];

        h->nhosts = (int)i + 1; /* so that free sees the ports below */
        snprintf(path, sizeof path, "hosts[%zu]", i);
        if ((rc = obj_host(c, json_array_get(hosts, i), h, (int)i, path)) != 0)
            return rc;
        total += host->nranks;
        if (total > WEFT__MAX_RANKS)
            return weft__hf_fail(c, "hosts: more than %d ranks in all",
                                 WEFT__MAX_RANKS);
        host->ports = calloc((size_t)host->nranks, sizeof *host->ports);
        if (host->ports == NULL)
            return weft__hf_nomem(c);
        if ((rc = obj_ports(c, json_array_get(hosts, i), host, port, path)) !=
            0)
            return rc;
    }
    h->nranks = total;
    return WEFT_OK;
}

/* links[i][e] (at path): its host (by name), address and device. */
static int obj_end(hf_ctx *c, json_t *end, const weft__hostfile_out *h,
                   weft__link_end *le, const char *path)
{
    char hname[128];
    int rc;

    if (!json_is_object(end))
        return weft__hf_fail(c,
                             "%s: expected an object with \"host\" and "
                             "\"addr\"",
                             path);
    if ((rc = json_str(c, end, "host", hname, sizeof hname, 1, path)) != 0 ||
        (rc = json_str(c, end, "addr", le->addr, sizeof le->addr, 1, path)) !=
            0 ||
        (rc = json_str(c, end, "device", le->device, sizeof le->device, 0,
                       path)) != 0)
        return rc;
    le->host = weft__hf_find_host(h, h->nhosts, hname);
    if (le->host < 0)
        return weft__hf_fail(c,
                             "%s.host: unknown host \"%s\" (expected the "
                             "name of one of \"hosts\")",
                             path, hname);
    return WEFT_OK;
}

static int obj_links(hf_ctx *c, json_t *root, weft__hostfile_out *h)
{
    json_t *links = json_object_get(root, "links");
    char path[64];
    int rc;

    if (links == NULL)
        return WEFT_OK;
    if (!json_is_array(links))
        return weft__hf_fail(c, "links: expected an array of links, each a "
                                "pair of ends [{\"host\": ..., \"addr\": "
                                "...}, {...}]");
    if (json_array_size(links) == 0)
        return WEFT_OK;
    if (json_array_size(links) > (1u << 20))
        return weft__hf_fail(c, "links: more than %u links", 1u << 20);
    h->links = calloc(json_array_size(links), sizeof *h->links);
    if (h->links == NULL)
        return weft__hf_nomem(c);
    h->nlinks = (int)json_array_size(links);
    for (int i = 0; i < h->nlinks; i++) {
        json_t *l = json_array_get(links, (size_t)i);
        if (!json_is_array(l) || json_array_size(l) != 2)
            return weft__hf_fail(c,
                                 "links[%d]: expected an array of two ends, "
                                 "each {\"host\": ..., \"addr\": ...}",
                                 i);
        for (int e = 0; e < 2; e++) {
            snprintf(path, sizeof path, "links[%d][%d]", i, e);
            if ((rc = obj_end(c, json_array_get(l, (size_t)e), h,
                              &h->links[i].end[e], path)) != 0)
                return rc;
        }
        if (h->links[i].end[0].host == h->links[i].end[1].host)
            return weft__hf_fail(c,
                                 "links[%d]: both ends are on host \"%s\"; a "
                                 "link joins two different hosts",
                                 i, h->hosts[h->links[i].end[0].host].name);
    }
    return WEFT_OK;
}

/* One link end, for sorting the ends by address. */
typedef struct {
    const char *addr;
    int pos; /* 2 * link + end: file order */
} end_ref;

static int end_cmp(const void *a, const void *b)
{
    const end_ref *x = a, *y = b;
    int s = strcmp(x->addr, y->addr);
    return s != 0 ? s : (x->pos > y->pos) - (x->pos < y->pos);
}

/* Each address ends one cable: not two hosts' address, not two links' end
 * on one host. Reports the duplicate met first in file order. */
static int obj_addresses(hf_ctx *c, const weft__hostfile_out *h)
{
    int n = 2 * h->nlinks, first = -1, second = -1;
    end_ref *refs;

    if (n == 0)
        return WEFT_OK;
    refs = malloc((size_t)n * sizeof *refs);
    if (refs == NULL)
        return weft__hf_nomem(c);
    for (int i = 0; i < n; i++) {
        refs[i].addr = h->links[i / 2].end[i % 2].addr;
        refs[i].pos = i;
    }
    qsort(refs, (size_t)n, sizeof *refs, end_cmp);
    for (int i = 1; i < n; i++)
        if (strcmp(refs[i].addr, refs[i - 1].addr) == 0 &&
            (i < 2 || strcmp(refs[i - 1].addr, refs[i - 2].addr) != 0) &&
            (second < 0 || refs[i].pos < second)) {
            first = refs[i - 1].pos;
            second = refs[i].pos;
        }
    free(refs);
    if (second >= 0) {
        const weft__link_end *a = &h->links[first / 2].end[first % 2];
        const weft__link_end *b = &h->links[second / 2].end[second % 2];
        if (a->host != b->host)
            return weft__hf_fail(c,
                                 "links[%d][%d].addr: address \"%s\" is on "
                                 "host \"%s\" here but on host \"%s\" in "
                                 "links[%d][%d]; expected each address to "
                                 "belong to one host",
                                 second / 2, second % 2, b->addr,
                                 h->hosts[b->host].name, h->hosts[a->host].name,
                                 first / 2, first % 2);
        if (first / 2 == second / 2)
            return weft__hf_fail(c, "links[%d]: both ends have address \"%s\"",
                                 first / 2, a->addr);
        return weft__hf_fail(c,
                             "links[%d][%d].addr: address \"%s\" of host "
                             "\"%s\" already ends links[%d]; expected each "
                             "link (one cable) to have an address of its own "
                             "at each end",
                             second / 2, second % 2, b->addr,
                             h->hosts[b->host].name, first / 2);
    }
    return WEFT_OK;
}

static int check_choice(hf_ctx *c, const char *field, const char *v,
                        const char *const *allowed, const char *say)
{
    if (*v == '\0')
        return WEFT_OK;
    for (int i = 0; allowed[i] != NULL; i++)
        if (strcmp(v, allowed[i]) == 0)
            return WEFT_OK;
    return weft__hf_fail(c, "%s: unknown value \"%s\": expected %s", field, v,
                         say);
}

int weft__hf_parse_json(hf_ctx *c, json_t *root, weft__hostfile_out *h)
{
    static const char *const transports[] = {"tcp", "ibverbs", NULL};
    static const char *const topologies[] = {"ring", "mesh", "auto", NULL};
    int rc;

    h->format = WEFT__HOSTFILE_JSON;
    if ((rc = json_str(c, root, "transport", h->transport, sizeof h->transport,
                       0, "")) != 0 ||
        (rc = check_choice(c, "transport", h->transport, transports,
                           "\"tcp\" or \"ibverbs\"")) != 0 ||
        (rc = json_str(c, root, "topology", h->topology, sizeof h->topology, 0,
                       "")) != 0 ||
        (rc = check_choice(c, "topology", h->topology, topologies,
                           "\"ring\", \"mesh\" or \"auto\"")) != 0 ||
        (rc = obj_hosts(c, root, h)) != 0 ||
        (rc = obj_links(c, root, h)) != 0 || (rc = obj_addresses(c, h)) != 0)
        return rc;
    return WEFT_OK;
}
