/*
 * MLX's ring hostfile, as weft reads it.
 *
 * MLX_HOSTFILE is a JSON list with one entry per rank, in rank order; each
 * entry is a list of "ip:port" strings:
 *
 *     [["10.0.1.1:5000", "10.0.2.1:5000"],     <- rank 0
 *      ["10.0.1.2:5000", "10.0.2.2:5000"],     <- rank 1
 *      ...]
 *
 * In MLX's ring backend, rank r listens on each of its own addresses and
 * accepts there one connection from its left neighbour r-1, and it makes
 * one connection to each address of its right neighbour r+1 (ranks taken
 * modulo the size): the ranks form one ring in list order, and the k-th
 * address of every rank carries the k-th connection between neighbours.
 * So every rank must list the same number of addresses, and with several
 * addresses two neighbours are joined by that many parallel connections
 * (one per cable, say, in a Thunderbolt ring).
 *
 * weft's model names both ends of every cable, so the file maps as:
 *  - rank r is a host of its own, named "rank<r>", with one rank, reached
 *    (ssh) at the address of its first entry, and listening on the port of
 *    its first entry (a weft rank takes every connection on one port; the
 *    ports of later entries are checked but not used);
 *  - for each pair of ring neighbours (r, r+1 mod n) and each k there is
 *    one link, whose ends are rank r's k-th address and rank r+1's k-th
 *    address (with two ranks, one link per k, not two). A rank's k-th
 *    address therefore ends two links, the ones to its left and right
 *    neighbours: it stands for "where this rank is reached", not for one
 *    cable's end, so the object form's one-address-one-cable-end check does
 *    not apply. MLX never says which address a rank connects from; weft
 *    (where the lower rank of a pair listens) connects to the addresses
 *    listed. This works wherever each listed address is reachable from
 *    both neighbours (one LAN, loopback, routed networks). A ring wired
 *    with one private subnet per cable, where a rank's address is reachable
 *    only from its left neighbour, needs the object form, which names both
 *    ends of each cable.
 *  - the same "ip:port" twice (in one rank's list or in two ranks') is an
 *    error: two listeners cannot share it. The same ip with different
 *    ports is fine (ranks sharing a machine, e.g. 127.0.0.1:5000/5001).
 *  - there is no "transport" or "topology": both are left "" (defaults).
 *
 * weft_config.addrs (one "ip:port" per rank) is read as this form with one
 * difference (mlx_group): consecutive ranks at one ip are one host, as the
 * object form's "ranks": N, so they use shared memory and the collectives
 * see the machine; every pair of hosts is joined by one link.
 */
#include "topo/hostfile_int.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Every rank's addresses, parsed: [r * K + k] is rank r's k-th. */
typedef struct {
    size_t n, K; /* ranks, addresses per rank */
    char (*ips)[64];
    int *ports;
} mlx_addrs;

/* Splits "ip:port" (or "[v6]:port") into ip and port; 0 if it parses. */
static int split_ip_port(const char *s, char *ip, size_t iplen, int *port)
{
    const char *colon = strrchr(s, ':');
    const char *ip0 = s, *ip1 = colon;
    long p = 0;

    if (colon == NULL || colon == s || colon[1] == '\0')
        return -1;
    if (*s == '[') {
        if (colon[-1] != ']' || colon - s < 3)
            return -1;
        ip0 = s + 1;
        ip1 = colon - 1;
    } else if (memchr(s, ':', (size_t)(colon - s)) != NULL) {
        return -1; /* a bare IPv6 address needs brackets */
    }
    for (const char *q = colon + 1; *q; q++) {
        if (*q < '0' || *q > '9' || p > 65535)
            return -1;
        p = p * 10 + (*q - '0');
    }
    if (p < 1 || p > 65535 || (size_t)(ip1 - ip0) >= iplen)
        return -1;
    for (const char *q = ip0; q < ip1; q++)
        if (*q <= ' ' || *q == '/' || *q == '[' || *q == ']')
            return -1;
    memcpy(ip, ip0, (size_t)(ip1 - ip0));
    ip[ip1 - ip0] = '\0';
    *port = (int)p;
    return 0;
}

/* The list's shape, from its first entry: *K addresses per rank. */
static int mlx_shape(hf_ctx *c, json_t *root, size_t *K)
{
    size_t n = json_array_size(root);
    json_t *first = json_array_get(root, 0);

    if (n == 0)
        return weft__hf_fail(c, "expected a non-empty list with one entry per "
                                "rank, each a list of \"ip:port\" strings "
                                "(MLX's ring hostfile)");
    if (n > WEFT__MAX_RANKS)
        return weft__hf_fail(c, "more than %d ranks", WEFT__MAX_RANKS);
    if (json_is_object(first))
        return weft__hf_fail(c, "[0]: expected a list of \"ip:port\" strings "
                                "(MLX's ring hostfile, MLX_HOSTFILE: one list "
                                "per rank), got an object; mlx.launch's "
                                "{\"ssh\": ..., \"ips\": ...} form is not "
                                "read: write weft's object form");
    if (!json_is_array(first) || json_array_size(first) == 0)
        return weft__hf_fail(c, "[0]: expected a non-empty list of \"ip:port\" "
                                "strings (MLX's ring hostfile: one list per "
                                "rank)");
    *K = json_array_size(first);
    if (*K > WEFT__MAX_WIRES)
        return weft__hf_fail(c, "[0]: more than %d addresses per rank",
                             WEFT__MAX_WIRES);
    return WEFT_OK;
}

/* Rank r (entry jr): its addresses into m, and its host, h->hosts[r]. */
static int mlx_rank(hf_ctx *c, json_t *jr, size_t r, mlx_addrs *m,
                    weft__hostfile_out *h)
{
    weft__host *host = &h->hosts[r];
    size_t K = m->K;

    h->nhosts = (int)r + 1;
    if (!json_is_array(jr) || json_array_size(jr) != K)
        return weft__hf_fail(c,
                             "[%zu]: expected a list of %zu \"ip:port\" "
                             "strings like [0] (every rank lists as many "
                             "addresses, one per connection to each "
                             "neighbour)",
                             r, K);
    for (size_t k = 0; k < K; k++) {
        json_t *s = json_array_get(jr, k);
        size_t i = r * K + k;
        if (!json_is_string(s) ||
            strlen(json_string_value(s)) != json_string_length(s) ||
            split_ip_port(json_string_value(s), m->ips[i], sizeof m->ips[i],
                          &m->ports[i]) != 0)
            return weft__hf_fail(c,
                                 "[%zu][%zu]: expected an \"ip:port\" string "
                                 "with a port in [1, 65535] (e.g. "
                                 "\"10.0.0.1:5000\"), got %s%s%s",
                                 r, k, json_is_string(s) ? "\"" : "",
                                 json_is_string(s) ? json_string_value(s)
                                                   : "something else",
                                 json_is_string(s) ? "\"" : "");
        for (size_t j = 0; j < i; j++)
            if (m->ports[j] == m->ports[i] && strcmp(m->ips[j], m->ips[i]) == 0)
                return weft__hf_fail(c,
                                     "[%zu][%zu]: address \"%s\" is already "
                                     "[%zu][%zu]; expected each rank's "
                                     "addresses to be its own (two ranks "
                                     "cannot listen at one ip:port)",
                                     r, k, json_string_value(s), j / K, j % K);
    }
    snprintf(host->name, sizeof host->name, "rank%zu", r);
    weft__hf_copy_str(host->ssh, sizeof host->ssh, m->ips[r * K]);
    host->nranks = 1;
    host->ports = malloc(sizeof *host->ports);
    if (host->ports == NULL)
        return weft__hf_nomem(c);
    host->ports[0] = m->ports[r * K];
    return WEFT_OK;
}

/* One link per pair of ring neighbours and address index k (with two
 * ranks, one pair); with all_pairs (weft_config.addrs, grouped by
 * mlx_group), one link between every pair of hosts, at their addresses. */
static int mlx_links(hf_ctx *c, const mlx_addrs *m, weft__hostfile_out *h,
                     int all_pairs)
{
    size_t n = m->n, K = m->K, pairs = n == 2 ? 1 : n;

    if (all_pairs) {
        size_t l = 0, nh = (size_t)h->nhosts;
        if (nh < 2)
            return WEFT_OK;
        h->links = calloc(nh * (nh - 1) / 2, sizeof *h->links);
        if (h->links == NULL)
            return weft__hf_nomem(c);
        h->nlinks = (int)(nh * (nh - 1) / 2);
        for (size_t a = 0; a < nh; a++)
            for (size_t b = a + 1; b < nh; b++)
                weft__hf_set_link(&h->links[l++], (int)a,
                                  h->hosts[a].local_addr, (int)b,
                                  h->hosts[b].local_addr);
        return WEFT_OK;
    }
    if (n < 2)
        return WEFT_OK;
    h->links = calloc(pairs * K, sizeof *h->links);
    if (h->links == NULL)
        return weft__hf_nomem(c);
    h->nlinks = (int)(pairs * K);
    for (size_t r = 0; r < pairs; r++)
        for (size_t k = 0; k < K; k++) {
            size_t r1 = (r + 1) % n;
            weft__hf_set_link(&h->links[r * K + k], (int)r, m->ips[r * K + k],
                              (int)r1, m->ips[r1 * K + k]);
        }
    return WEFT_OK;
}

/* weft_config.addrs: consecutive ranks at one ip share a machine, so they
 * become one host of that many ranks (ports in rank order), whose ranks
 * reach each other at that ip (their listeners are bound there, maybe not
 * on loopback). Ranks at one ip that are not consecutive stay hosts of
 * their own (a host's ranks are numbered consecutively). */
static int mlx_group(hf_ctx *c, const mlx_addrs *m, weft__hostfile_out *h)
{
    int nh = 0;

    for (size_t r = 0; r < m->n; r++) {
        weft__host *g = nh > 0 ? &h->hosts[nh - 1] : NULL;

        if (g != NULL && strcmp(m->ips[r * m->K], g->local_addr) == 0) {
            int *p = realloc(g->ports, (size_t)(g->nranks + 1) * sizeof *p);
            if (p == NULL)
                return weft__hf_nomem(c);
            g->ports = p;
            g->ports[g->nranks++] = h->hosts[r].ports[0];
            free(h->hosts[r].ports);
            memset(&h->hosts[r], 0, sizeof h->hosts[r]);
            snprintf(g->name, sizeof g->name, "ranks%zu-%zu",
                     r + 1 - (size_t)g->nranks, r);
            continue;
        }
        if ((size_t)nh != r) {
            h->hosts[nh] = h->hosts[r];
            memset(&h->hosts[r], 0, sizeof h->hosts[r]);
        }
        weft__hf_copy_str(h->hosts[nh].local_addr,
                          sizeof h->hosts[nh].local_addr, m->ips[r * m->K]);
        nh++;
    }
    h->nhosts = nh;
    return WEFT_OK;
}

int weft__hf_parse_mlx(hf_ctx *c, json_t *root, int all_pairs,
                       weft__hostfile_out *h)
{
    mlx_addrs m = {json_array_size(root), 0, NULL, NULL};
    int rc;

    h->format = WEFT__HOSTFILE_MLX;
    if ((rc = mlx_shape(c, root, &m.K)) != 0)
        return rc;
    m.ips = calloc(m.n * m.K, sizeof *m.ips);
    m.ports = calloc(m.n * m.K, sizeof *m.ports);
    h->hosts = calloc(m.n, sizeof *h->hosts);
    if (m.ips == NULL || m.ports == NULL || h->hosts == NULL)
        rc = weft__hf_nomem(c);
    for (size_t r = 0; r < m.n && rc == WEFT_OK; r++)
        rc = mlx_rank(c, json_array_get(root, r), r, &m, h);
    if (rc == WEFT_OK && all_pairs)
        rc = mlx_group(c, &m, h);
    if (rc == WEFT_OK) {
        h->nranks = (int)m.n;
        rc = mlx_links(c, &m, h, all_pairs);
    }
    free(m.ips);
    free(m.ports);
    return rc;
}
