/*
 * The shape a hostfile's links give the job: the ring through every host
 * (the hosts in the order listed where their links close that cycle, else
 * a search for one) and whether every pair of hosts shares a link (the
 * mesh). Both work on host adjacency: which pairs of hosts share at least
 * one link, however many.
 */
#include "topo/hostfile_int.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Host adjacency as a bit matrix (nhosts^2 bits). */
typedef struct {
    int n;
    uint8_t *bits;
} adj_t;

static int adj_get(const adj_t *a, int i, int j)
{
    size_t b = (size_t)i * (size_t)a->n + (size_t)j;
    return (a->bits[b >> 3] >> (b & 7)) & 1;
}

static void adj_set(adj_t *a, int i, int j)
{
    size_t b = (size_t)i * (size_t)a->n + (size_t)j;
    a->bits[b >> 3] |= (uint8_t)(1u << (b & 7));
}

static int adj_make(const weft__hostfile_out *h, adj_t *a)
{
    size_t nb = ((size_t)h->nhosts * (size_t)h->nhosts + 7) / 8;

    a->n = h->nhosts;
    a->bits = calloc(nb ? nb : 1, 1);
    if (a->bits == NULL)
        return WEFT_ENOMEM;
    for (int l = 0; l < h->nlinks; l++) {
        adj_set(a, h->links[l].end[0].host, h->links[l].end[1].host);
        adj_set(a, h->links[l].end[1].host, h->links[l].end[0].host);
    }
    return WEFT_OK;
}

/* ---- the mesh ---- */

int weft__hf_unlinked_pair(const weft__hostfile_out *h, int *pa, int *pb)
{
    adj_t a;
    int found = 0;

    if (adj_make(h, &a) != 0)
        return WEFT_ENOMEM;
    for (int i = 0; i < h->nhosts && !found; i++)
        for (int j = i + 1; j < h->nhosts && !found; j++)
            if (!adj_get(&a, i, j)) {
                *pa = i;
                *pb = j;
                found = 1;
            }
    free(a.bits);
    return found;
}

int weft__hostfile_check_mesh(const weft__hostfile_out *h, const char *file,
                              char *errmsg, size_t errlen)
{
    hf_ctx c = {file != NULL ? file : "hostfile", errmsg, errlen};
    int i, j, missing;

    if (h == NULL)
        return WEFT_OK;
    if (h->nranks > WEFT__MESH_MAX_RANKS)
        return weft__hf_fail(&c,
                             "topology \"mesh\" runs at most %d ranks (one "
                             "exchange lane per peer), but the job has %d: "
                             "use \"ring\" or \"auto\"",
                             WEFT__MESH_MAX_RANKS, h->nranks);
    if (h->nhosts < 2)
        return WEFT_OK;
    missing = weft__hf_unlinked_pair(h, &i, &j);
    if (missing < 0)
        return weft__hf_nomem(&c);
    if (missing)
        return weft__hf_fail(&c,
                             "topology \"mesh\" needs a link between every "
                             "pair of hosts, but \"%s\" and \"%s\" (hosts[%d] "
                             "and hosts[%d]) share none",
                             h->hosts[i].name, h->hosts[j].name, i, j);
    return WEFT_OK;
}

int weft__hostfile_mesh(const weft__hostfile_out *h, const char *asked,
                        char *why, size_t whylen)
{
    const char *topo = asked != NULL && asked[0] ? asked
                       : h->topology[0]          ? h->topology
                                                 : "auto";
    char dummy[8];
    int i = 0, j = 0, missing;

    if (why == NULL) {
        why = dummy;
        whylen = sizeof dummy;
    }
    if (strcmp(topo, "auto") != 0) {
        snprintf(why, whylen, "asked for");
        return strcmp(topo, "mesh") == 0;
    }
    if (h->nhosts < 2) {
        snprintf(why, whylen,
                 "auto: one host, whose ranks share its loopback; small "
                 "operations still exchange directly");
        return 0;
    }
    missing = weft__hf_unlinked_pair(h, &i, &j);
    if (missing < 0) {
        snprintf(why, whylen, "auto: out of memory checking the links");
        return 0;
    }
    if (missing) {
        snprintf(why, whylen, "auto: \"%s\" and \"%s\" share no link",
                 h->hosts[i].name, h->hosts[j].name);
        return 0;
    }
    if (h->nranks > WEFT__MESH_MAX_RANKS) {
        snprintf(why, whylen,
                 "auto: every pair of hosts shares a link, but a mesh runs "
                 "at most %d ranks, not %d",
                 WEFT__MESH_MAX_RANKS, h->nranks);
        return 0;
    }
    snprintf(why, whylen, "auto: every pair of the %d hosts shares a link",
             h->nhosts);
    return 1;
}

/* ---- the ring ---- */

typedef struct {
    const adj_t *a;
    int n, start;
    uint16_t *dead; /* per visited-set: hosts from which no ring completes */
    int path[WEFT__HOSTFILE_MAX_SEARCH];
    int best[WEFT__HOSTFILE_MAX_SEARCH]; /* longest cycle met */
    int bestlen;
} ring_search;

/* Extends the path path[0..depth-1] (ending at v, visiting mask) to a cycle
 * through every host; hosts tried in index order, so the cycle found is
 * the first in lexicographic order. States known to fail are skipped. */
static int ring_dfs(ring_search *s, uint32_t mask, int v, int depth)
{
    if (depth >= 3 && depth > s->bestlen && adj_get(s->a, v, s->start)) {
        memcpy(s->best, s->path, (size_t)depth * sizeof *s->path);
        s->bestlen = depth;
    }
    if (depth == s->n)
        return adj_get(s->a, v, s->start);
    if ((s->dead[mask] >> v) & 1)
        return 0;
    for (int u = 0; u < s->n; u++) {
        if ((mask >> u) & 1 || !adj_get(s->a, v, u))
            continue;
        s->path[depth] = u;
        if (ring_dfs(s, mask | (1u << u), u, depth + 1))
            return 1;
    }
    s->dead[mask] |= (uint16_t)(1u << v);
    return 0;
}

static int ring_from(ring_search *s, int start)
{
    memset(s->dead, 0, ((size_t)1 << s->n) * sizeof *s->dead);
    s->start = start;
    s->path[0] = start;
    return ring_dfs(s, 1u << start, start, 1);
}

/* Hosts linked to fewer than two others can be in no ring: a failure
 * naming every one of them, or WEFT_OK where there is none. */
static int check_degrees(hf_ctx *c, const weft__hostfile_out *h, const adj_t *a)
{
    char msg[1024] = "";
    int n = h->nhosts, bad = 0;

    for (int i = 0; i < n; i++) {
        int deg = 0, nb = -1;
        for (int j = 0; j < n; j++)
            if (j != i && adj_get(a, i, j)) {
                deg++;
                nb = j;
            }
        if (deg >= 2)
            continue;
        weft__hf_app(msg, sizeof msg, "%s\"%s\" (%s%s%s)", bad ? ", " : "",
                     h->hosts[i].name, deg ? "linked only to \"" : "no links",
                     deg ? h->hosts[nb].name : "", deg ? "\"" : "");
        bad++;
    }
    if (bad)
        return weft__hf_fail(c,
                             "links: no ring passes through every host: %s "
                             "cannot be placed (each host needs links to two "
                             "different hosts)",
                             msg);
    return WEFT_OK;
}

/* Where the search found no ring: the longest cycle it met (s->best),
 * and the hosts off it. */
static int no_ring(hf_ctx *c, const weft__hostfile_out *h, const ring_search *s)
{
    char cyc[512] = "", rest[512] = "";
    uint32_t in = 0;

    if (s->bestlen == 0)
        return weft__hf_fail(c, "links: no ring passes through every host, "
                                "nor any cycle through three or more hosts");
    for (int i = 0; i < s->bestlen; i++) {
        weft__hf_app(cyc, sizeof cyc, "\"%s\" -> ", h->hosts[s->best[i]].name);
        in |= 1u << s->best[i];
    }
    weft__hf_app(cyc, sizeof cyc, "\"%s\"", h->hosts[s->best[0]].name);
    for (int i = 0, k = 0; i < h->nhosts; i++)
        if (!((in >> i) & 1))
            weft__hf_app(rest, sizeof rest, "%s\"%s\"", k++ ? ", " : "",
                         h->hosts[i].name);
    return weft__hf_fail(c,
                         "links: no ring passes through every host: the "
                         "longest cycle is %s, and %s cannot be placed on "
                         "it; expected links that join all hosts in one "
                         "cycle",
                         cyc, rest);
}

/* Searches for a ring through all n <= WEFT__HOSTFILE_MAX_SEARCH hosts:
 * found, it becomes h->host_order. */
static int search_ring(hf_ctx *c, weft__hostfile_out *h, const adj_t *a)
{
    ring_search s;
    int rc = WEFT_OK;

    memset(&s, 0, sizeof s);
    s.a = a;
    s.n = h->nhosts;
    s.dead = malloc(((size_t)1 << s.n) * sizeof *s.dead);
    if (s.dead == NULL)
        return weft__hf_nomem(c);
    if (ring_from(&s, 0)) {
        memcpy(h->host_order, s.path, (size_t)s.n * sizeof *s.path);
        h->ring_reordered = 1;
    } else {
        /* For the message: the longest cycle, through the first host if
         * any passes through it, else through any host. */
        for (int st = 1; s.bestlen == 0 && st < s.n; st++)
            ring_from(&s, st);
        rc = no_ring(c, h, &s);
    }
    free(s.dead);
    return rc;
}

/* A ring through n >= 3 hosts: the hosts as listed where their links close
 * that cycle, else one searched for. */
static int find_ring(hf_ctx *c, weft__hostfile_out *h, const adj_t *a)
{
    int n = h->nhosts, gap = -1, rc;

    for (int i = 0; i < n && gap < 0; i++)
        if (!adj_get(a, i, (i + 1) % n))
            gap = i;
    if (gap < 0)
        return WEFT_OK;
    if ((rc = check_degrees(c, h, a)) != 0)
        return rc;
    if (n > WEFT__HOSTFILE_MAX_SEARCH)
        return weft__hf_fail(c,
                             "links: the %d hosts, in the order listed, do "
                             "not form a ring (\"%s\" and \"%s\" share no "
                             "link), and weft searches for a ring among at "
                             "most %d hosts: list the hosts in ring order",
                             n, h->hosts[gap].name,
                             h->hosts[(gap + 1) % n].name,
                             WEFT__HOSTFILE_MAX_SEARCH);
    return search_ring(c, h, a);
}

int weft__hf_form_ring(hf_ctx *c, weft__hostfile_out *h)
{
    int n = h->nhosts, rc;
    adj_t a;

    h->host_order = malloc((size_t)n * sizeof *h->host_order);
    if (h->host_order == NULL)
        return weft__hf_nomem(c);
    for (int i = 0; i < n; i++)
        h->host_order[i] = i;
    if (strcmp(h->topology, "mesh") == 0 &&
        (rc = weft__hostfile_check_mesh(h, c->file, c->errmsg, c->errlen)) != 0)
        return rc;
    if (n == 1)
        return WEFT_OK;
    if (adj_make(h, &a) != 0)
        return weft__hf_nomem(c);
    /* Two hosts: any link between them is their ring. */
    if (n > 2)
        rc = find_ring(c, h, &a);
    else if (!adj_get(&a, 0, 1))
        rc = weft__hf_fail(c,
                           "hosts \"%s\" and \"%s\" share no link: expected "
                           "at least one entry in \"links\" joining them",
                           h->hosts[0].name, h->hosts[1].name);
    else
        rc = WEFT_OK;
    free(a.bits);
    return rc;
}
