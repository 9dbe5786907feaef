/*
 * The hostfile module: every fixture under tests/fixtures/hostfiles (or
 * $WEFT_FIXTURES). Good ones load with the expected hosts, links, ranks and
 * ring order; bad ones fail with WEFT_ECONFIG and a message that names the
 * file and where (line and column, or the field) and what was expected;
 * weftrun --check's description names every link and wire.
 */
#include <criterion/criterion.h>

#include "../fifo.h"
#include "topo/hostfile.h"

#include <dirent.h>
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static const char *fixdir(void)
{
    const char *d = getenv("WEFT_FIXTURES");
    return d != NULL && *d != '\0' ? d : "tests/fixtures/hostfiles";
}

static void fixpath(char *buf, size_t len, const char *name)
{
    snprintf(buf, len, "%s/%s", fixdir(), name);
}

static void load_ok(const char *name, int nexp, weft__hostfile_out *h)
{
    char path[1024], msg[1024];
    int rc;

    fixpath(path, sizeof path, name);
    rc = weft__hostfile_load(path, nexp, h, msg, sizeof msg);
    cr_assert_eq(rc, WEFT_OK, "%s: rc %d: %s", name, rc, msg);
}

/* Loads a bad fixture: WEFT_ECONFIG, *out left zeroed, and the message
 * starts with the path and holds every fragment (NULL-ended). */
static void expect_bad(const char *name, int nexp, ...)
{
    char path[1024], msg[1024];
    weft__hostfile_out h, zero;
    va_list ap;
    int rc;

    memset(&h, 0x5a, sizeof h);
    memset(&zero, 0, sizeof zero);
    fixpath(path, sizeof path, name);
    rc = weft__hostfile_load(path, nexp, &h, msg, sizeof msg);
    cr_assert_eq(rc, WEFT_ECONFIG, "%s: rc %d, expected WEFT_ECONFIG (%s)",
                 name, rc, rc ? msg : "loaded");
    cr_assert_eq(memcmp(&h, &zero, sizeof h), 0, "%s: out not zeroed", name);
    cr_assert_eq(strncmp(msg, path, strlen(path)), 0,
                 "%s: message does not start with the file: %s", name, msg);
    cr_assert(strncmp(msg + strlen(path), ": ", 2) == 0, "%s: %s", name, msg);
    va_start(ap, nexp);
    for (const char *frag; (frag = va_arg(ap, const char *)) != NULL;)
        cr_assert(strstr(msg, frag) != NULL, "%s: message lacks \"%s\": %s",
                  name, frag, msg);
    va_end(ap);
    weft__hostfile_free(&h); /* zeroed: a no-op */
}

static int host_index(const weft__hostfile_out *h, const char *name)
{
    for (int i = 0; i < h->nhosts; i++)
        if (strcmp(h->hosts[i].name, name) == 0)
            return i;
    cr_assert_fail("no host \"%s\"", name);
    return -1;
}

/* The link joining addresses a (on host ha) and b (on host hb), in either
 * order of ends; -1 if none. */
static int find_link(const weft__hostfile_out *h, const char *ha, const char *a,
                     const char *hb, const char *b)
{
    int ia = host_index(h, ha), ib = host_index(h, hb);
    for (int l = 0; l < h->nlinks; l++)
        for (int e = 0; e < 2; e++) {
            const weft__link_end *x = &h->links[l].end[e];
            const weft__link_end *y = &h->links[l].end[1 - e];
            if (x->host == ia && strcmp(x->addr, a) == 0 && y->host == ib &&
                strcmp(y->addr, b) == 0)
                return l;
        }
    return -1;
}

static int linked(const weft__hostfile_out *h, int a, int b)
{
    for (int l = 0; l < h->nlinks; l++)
        if ((h->links[l].end[0].host == a && h->links[l].end[1].host == b) ||
            (h->links[l].end[0].host == b && h->links[l].end[1].host == a))
            return 1;
    return 0;
}

/* What every loaded hostfile must satisfy, whatever its form: ranks
 * numbered along host_order, rank_host agreeing, host_order a
 * permutation forming a cycle of links, ports in range and distinct per
 * host, links between two different known hosts. */
static void check_invariants(const weft__hostfile_out *h)
{
    int next = 0, *seen;

    cr_assert(h->nhosts >= 1 && h->hosts != NULL && h->host_order != NULL &&
              h->rank_host != NULL);
    seen = calloc((size_t)h->nhosts, sizeof *seen);
    cr_assert_not_null(seen);
    for (int i = 0; i < h->nhosts; i++) {
        int hi = h->host_order[i];
        const weft__host *hs;
        cr_assert(hi >= 0 && hi < h->nhosts && !seen[hi], "host_order[%d]", i);
        seen[hi] = 1;
        hs = &h->hosts[hi];
        cr_assert_eq(hs->first_rank, next, "%s.first_rank", hs->name);
        for (int k = 0; k < hs->nranks; k++) {
            cr_assert_eq(h->rank_host[next + k], hi);
            cr_assert(hs->ports[k] >= 1 && hs->ports[k] <= 65535);
            for (int j = 0; j < k; j++)
                cr_assert_neq(hs->ports[j], hs->ports[k]);
        }
        next += hs->nranks;
        if (h->nhosts >= 2)
            cr_assert(linked(h, hi, h->host_order[(i + 1) % h->nhosts]),
                      "ring: %s and the next host share no link", hs->name);
    }
    free(seen);
    cr_assert_eq(next, h->nranks);
    for (int l = 0; l < h->nlinks; l++) {
        const weft__link *lk = &h->links[l];
        cr_assert(lk->end[0].host >= 0 && lk->end[0].host < h->nhosts);
        cr_assert(lk->end[1].host >= 0 && lk->end[1].host < h->nhosts);
        cr_assert_neq(lk->end[0].host, lk->end[1].host);
        cr_assert(lk->end[0].addr[0] && lk->end[1].addr[0]);
    }
    cr_assert(h->ring_reordered == 0 || h->ring_reordered == 1);
}

static void check_order(const weft__hostfile_out *h, const int *order)
{
    for (int i = 0; i < h->nhosts; i++)
        cr_assert_eq(h->host_order[i], order[i], "host_order[%d] = %d, not %d",
                     i, h->host_order[i], order[i]);
}

/* ---- good fixtures ---- */

Test(good, ring4x2)
{
    static const int order[] = {0, 1, 2, 3};
    /* Each neighbour pair's two cables, as (host, addr) pairs: the file
     * lists them interleaved and with ends swapped. */
    static const char *const cables[8][4] = {
        {"m1", "169.254.1.1", "m2", "169.254.1.2"},
        {"m1", "169.254.2.2", "m2", "169.254.2.1"},
        {"m2", "169.254.3.1", "m3", "169.254.3.2"},
        {"m2", "169.254.4.2", "m3", "169.254.4.1"},
        {"m3", "169.254.5.1", "m4", "169.254.5.2"},
        {"m3", "169.254.6.2", "m4", "169.254.6.1"},
        {"m4", "169.254.7.1", "m1", "169.254.7.2"},
        {"m4", "169.254.8.2", "m1", "169.254.8.1"},
    };
    weft__hostfile_out h;
    int used = 0;

    load_ok("good-ring4x2.json", 4, &h);
    check_invariants(&h);
    cr_assert_eq(h.format, WEFT__HOSTFILE_JSON);
    cr_assert_str_eq(h.transport, "tcp");
    cr_assert_str_eq(h.topology, "ring");
    cr_assert_eq(h.nhosts, 4);
    cr_assert_eq(h.nranks, 4);
    cr_assert_eq(h.nlinks, 8);
    cr_assert_eq(h.ring_reordered, 0);
    check_order(&h, order);
    cr_assert_str_eq(h.hosts[0].name, "m1");
    cr_assert_str_eq(h.hosts[0].ssh, "me@m1.local");
    cr_assert_str_eq(h.hosts[1].ssh, "m2", "ssh defaults to the name");
    for (int i = 0; i < 4; i++) {
        cr_assert_eq(h.hosts[i].nranks, 1);
        cr_assert_eq(h.hosts[i].first_rank, i);
        cr_assert_eq(h.hosts[i].ports[0], 40000);
        cr_assert_eq(h.rank_host[i], i);
    }
    for (int k = 0; k < 8; k++) {
        int l = find_link(&h, cables[k][0], cables[k][1], cables[k][2],
                          cables[k][3]);
        cr_assert(l >= 0, "no link %s %s <-> %s %s", cables[k][0], cables[k][1],
                  cables[k][2], cables[k][3]);
        cr_assert_eq(used & (1 << l), 0);
        used |= 1 << l;
    }
    /* Links keep the file's order: links[1] is m3 169.254.4.1 <-> m2. */
    cr_assert_eq(h.links[1].end[0].host, 2);
    cr_assert_str_eq(h.links[1].end[0].addr, "169.254.4.1");
    cr_assert_eq(h.links[1].end[1].host, 1);
    cr_assert_str_eq(h.links[1].end[1].device, "");
    weft__hostfile_free(&h);
    cr_assert_null(h.hosts);
}

Test(good, ring4x2_hosts_shuffled)
{
    /* Hosts listed m1 m3 m2 m4: m1 and m3 share no cable, so the ring is
     * searched for: m1 -> m2 -> m3 -> m4 (indices 0 2 1 3). */
    static const int order[] = {0, 2, 1, 3};
    weft__hostfile_out h;

    load_ok("good-ring4x2-shuffled.json", 4, &h);
    check_invariants(&h);
    cr_assert_eq(h.ring_reordered, 1);
    check_order(&h, order);
    cr_assert_str_eq(h.hosts[1].name, "m3");
    cr_assert_eq(h.hosts[0].first_rank, 0);
    cr_assert_eq(h.hosts[2].first_rank, 1, "m2 takes rank 1");
    cr_assert_eq(h.hosts[1].first_rank, 2, "m3 takes rank 2");
    cr_assert_eq(h.hosts[3].first_rank, 3);
    cr_assert_eq(h.rank_host[1], 2);
    cr_assert_eq(h.rank_host[2], 1);
    cr_assert_eq(h.transport[0], '\0', "absent: empty");
    cr_assert_eq(h.topology[0], '\0', "absent: empty");
    cr_assert_eq(h.hosts[0].ports[0], WEFT__DEFAULT_PORT);
    weft__hostfile_free(&h);
}

Test(good, mesh3)
{
    static const int order[] = {0, 1, 2};
    weft__hostfile_out h;
    char msg[256];

    load_ok("good-mesh3.json", 6, &h);
    check_invariants(&h);
    cr_assert_str_eq(h.topology, "mesh");
    cr_assert_eq(h.nhosts, 3);
    cr_assert_eq(h.nlinks, 3);
    cr_assert_eq(h.ring_reordered, 0);
    check_order(&h, order);
    for (int i = 0; i < 3; i++) {
        cr_assert_eq(h.hosts[i].nranks, 2);
        cr_assert_eq(h.hosts[i].first_rank, 2 * i);
        cr_assert_eq(h.hosts[i].ports[0], WEFT__DEFAULT_PORT);
        cr_assert_eq(h.hosts[i].ports[1], WEFT__DEFAULT_PORT + 1);
    }
    cr_assert(find_link(&h, "c", "10.0.3.1", "a", "10.0.3.2") == 2);
    cr_assert_eq(weft__hostfile_check_mesh(&h, "f", msg, sizeof msg), WEFT_OK);
    weft__hostfile_free(&h);
}

Test(good, two_hosts_three_links)
{
    weft__hostfile_out h;

    load_ok("good-2hosts-3links.json", 2, &h);
    check_invariants(&h);
    cr_assert_eq(h.nhosts, 2);
    cr_assert_eq(h.nlinks, 3);
    cr_assert_eq(h.ring_reordered, 0);
    cr_assert_str_eq(h.hosts[0].ssh, "user@left.example");
    cr_assert_eq(find_link(&h, "left", "192.168.10.1", "right", "192.168.10.2"),
                 0);
    cr_assert_eq(find_link(&h, "left", "192.168.11.1", "right", "192.168.11.2"),
                 1);
    cr_assert_eq(find_link(&h, "right", "192.168.12.2", "left", "192.168.12.1"),
                 2);
    weft__hostfile_free(&h);
}

Test(good, single_host)
{
    static const int ports[] = {41000, 41002, 41004, 41006};
    weft__hostfile_out h;

    load_ok("good-single.json", 4, &h);
    check_invariants(&h);
    cr_assert_eq(h.nhosts, 1);
    cr_assert_eq(h.nlinks, 0);
    cr_assert_null(h.links);
    cr_assert_eq(h.hosts[0].nranks, 4);
    for (int k = 0; k < 4; k++) {
        cr_assert_eq(h.hosts[0].ports[k], ports[k]);
        cr_assert_eq(h.rank_host[k], 0);
    }
    weft__hostfile_free(&h);
}

Test(good, ports_and_devices)
{
    weft__hostfile_out h;

    load_ok("good-ports-ibverbs.json", 5, &h);
    check_invariants(&h);
    cr_assert_str_eq(h.transport, "ibverbs");
    cr_assert_str_eq(h.topology, "auto");
    cr_assert_eq(h.hosts[0].ports[0], 51000);
    cr_assert_eq(h.hosts[0].ports[1], 51001);
    cr_assert_eq(h.hosts[1].nranks, 3);
    cr_assert_eq(h.hosts[1].first_rank, 2);
    cr_assert_eq(h.hosts[1].ports[0], 50000, "the top-level port");
    cr_assert_eq(h.hosts[1].ports[2], 50002);
    cr_assert_str_eq(h.links[0].end[0].device, "rxe0");
    cr_assert_str_eq(h.links[0].end[1].device, "rxe1");
    weft__hostfile_free(&h);
}

Test(good, reorder)
{
    /* a-c-e-b-d-a listed as a b c d e: the first ring from a in index
     * order is a c e b d. */
    static const int order[] = {0, 2, 4, 1, 3};
    static const int rank_host[] = {0, 2, 2, 4, 1, 3};
    weft__hostfile_out h;

    load_ok("good-reorder.json", 6, &h);
    check_invariants(&h);
    cr_assert_eq(h.ring_reordered, 1);
    check_order(&h, order);
    for (int r = 0; r < 6; r++)
        cr_assert_eq(h.rank_host[r], rank_host[r], "rank_host[%d]", r);
    cr_assert_eq(h.hosts[2].first_rank, 1);
    cr_assert_eq(h.hosts[1].first_rank, 4);
    weft__hostfile_free(&h);
}

Test(good, ring16_search)
{
    /* 16 hosts (the search's limit) whose ring is listed shuffled. */
    static const int order[] = {0, 6,  8,  14, 5, 7,  4, 13,
                                1, 10, 15, 3,  2, 12, 9, 11};
    weft__hostfile_out h;

    load_ok("good-ring16-shuffled.json", 16, &h);
    check_invariants(&h);
    cr_assert_eq(h.ring_reordered, 1);
    /* The ring (a cycle) may be found in either direction from h00. */
    if (h.host_order[1] == order[1]) {
        check_order(&h, order);
    } else {
        for (int i = 1; i < 16; i++)
            cr_assert_eq(h.host_order[i], order[16 - i]);
    }
    weft__hostfile_free(&h);
}

Test(good, mlx)
{
    weft__hostfile_out h;

    load_ok("good-mlx.json", 4, &h);
    check_invariants(&h);
    cr_assert_eq(h.format, WEFT__HOSTFILE_MLX);
    cr_assert_eq(h.transport[0], '\0');
    cr_assert_eq(h.nhosts, 4);
    cr_assert_eq(h.nlinks, 8, "4 neighbour pairs x 2 addresses");
    cr_assert_eq(h.ring_reordered, 0);
    for (int r = 0; r < 4; r++) {
        char name[16], ssh[32];
        snprintf(name, sizeof name, "rank%d", r);
        snprintf(ssh, sizeof ssh, "10.0.1.%d", r + 1);
        cr_assert_str_eq(h.hosts[r].name, name);
        cr_assert_str_eq(h.hosts[r].ssh, ssh);
        cr_assert_eq(h.hosts[r].nranks, 1);
        cr_assert_eq(h.hosts[r].first_rank, r);
        cr_assert_eq(h.hosts[r].ports[0], 5000 + r);
    }
    /* The k-th address of each rank pairs with its neighbours' k-th. */
    cr_assert(find_link(&h, "rank0", "10.0.1.1", "rank1", "10.0.1.2") >= 0);
    cr_assert(find_link(&h, "rank0", "10.0.2.1", "rank1", "10.0.2.2") >= 0);
    cr_assert(find_link(&h, "rank1", "10.0.2.2", "rank2", "10.0.2.3") >= 0);
    cr_assert(find_link(&h, "rank3", "10.0.1.4", "rank0", "10.0.1.1") >= 0);
    cr_assert(find_link(&h, "rank3", "10.0.2.4", "rank0", "10.0.2.1") >= 0);
    cr_assert_eq(find_link(&h, "rank0", "10.0.1.1", "rank1", "10.0.2.2"), -1,
                 "no cross pairing");
    cr_assert_eq(linked(&h, 0, 2), 0, "only ring neighbours are linked");
    weft__hostfile_free(&h);
}

Test(good, mlx_two_local_ranks)
{
    weft__hostfile_out h;

    load_ok("good-mlx-local2.json", 2, &h);
    check_invariants(&h);
    cr_assert_eq(h.nhosts, 2);
    cr_assert_eq(h.nlinks, 2, "two ranks: one link per address, not two");
    cr_assert_eq(h.hosts[0].ports[0], 6000);
    cr_assert_eq(h.hosts[1].ports[0], 6002);
    cr_assert_str_eq(h.links[1].end[0].addr, "127.0.0.1");
    weft__hostfile_free(&h);
}

Test(good, mpirun_text)
{
    static const int nranks[] = {2, 1, 1, 3};
    static const char *const names[] = {"node1", "node2", "node3", "node4"};
    weft__hostfile_out h;
    int first = 0;

    load_ok("good-mpirun.txt", 7, &h);
    check_invariants(&h);
    cr_assert_eq(h.format, WEFT__HOSTFILE_MPIRUN);
    cr_assert_eq(h.nhosts, 4);
    cr_assert_eq(h.nlinks, 6, "one link per pair of hosts");
    cr_assert_eq(h.ring_reordered, 0);
    for (int i = 0; i < 4; i++) {
        cr_assert_str_eq(h.hosts[i].name, names[i]);
        cr_assert_str_eq(h.hosts[i].ssh, names[i]);
        cr_assert_eq(h.hosts[i].nranks, nranks[i]);
        cr_assert_eq(h.hosts[i].first_rank, first);
        cr_assert_eq(h.hosts[i].ports[0], WEFT__DEFAULT_PORT);
        first += nranks[i];
        for (int j = i + 1; j < 4; j++)
            cr_assert(find_link(&h, names[i], names[i], names[j], names[j]) >=
                      0);
    }
    weft__hostfile_free(&h);
}

Test(good, any_rank_count_when_unknown)
{
    weft__hostfile_out h;

    load_ok("bad-rank-count.json", -1, &h); /* 3 ranks */
    cr_assert_eq(h.nranks, 3);
    weft__hostfile_free(&h);
    load_ok("bad-rank-count.json", 3, &h);
    weft__hostfile_free(&h);
}

/* Every good-* fixture in the directory loads and can be described. */
Test(good, every_good_fixture)
{
    DIR *d = opendir(fixdir());
    struct dirent *e;
    int n = 0;

    cr_assert_not_null(d, "cannot open %s", fixdir());
    while ((e = readdir(d)) != NULL) {
        weft__hostfile_out h;
        char *buf = NULL;
        size_t len = 0;
        FILE *f;

        if (strncmp(e->d_name, "good-", 5) != 0)
            continue;
        load_ok(e->d_name, -1, &h);
        check_invariants(&h);
        f = open_memstream(&buf, &len);
        cr_assert_not_null(f);
        cr_assert_eq(weft__hostfile_describe(&h, 1, f), WEFT_OK, "%s",
                     e->d_name);
        fclose(f);
        cr_assert(len > 0);
        free(buf);
        weft__hostfile_free(&h);
        n++;
    }
    closedir(d);
    cr_assert_geq(n, 7, "only %d good fixtures", n);
}

/* ---- bad fixtures ---- */

#define BAD(name, nexp, ...) expect_bad(name, nexp, __VA_ARGS__, NULL)

Test(bad, json_syntax)
{
    BAD("bad-json-syntax.json", -1, "line 4, column 25", "'}' expected");
    BAD("bad-json-truncated.json", -1, "line 4", "end of file");
    BAD("bad-json-dup-key.json", -1, "line 4", "duplicate object key");
}

Test(bad, missing_field)
{
    BAD("bad-missing-hosts.json", -1, "missing field \"hosts\"");
    BAD("bad-missing-name.json", -1, "hosts[1]: missing field \"name\"",
        "(a string)");
    BAD("bad-missing-addr.json", -1, "links[0][1]: missing field \"addr\"");
}

Test(bad, wrong_type)
{
    BAD("bad-wrong-type-ranks.json", -1, "hosts[1].ranks: expected an integer",
        "got a string");
    BAD("bad-wrong-type-addr.json", -1, "links[0][1].addr: expected a string",
        "got an integer");
    BAD("bad-link-shape.json", -1, "links[0]: expected an array of two ends");
}

Test(bad, unknown_host)
{
    BAD("bad-unknown-host.json", -1, "links[1][0].host", "unknown host \"m9\"",
        "expected the name of one of \"hosts\"");
}

Test(bad, same_host_link)
{
    BAD("bad-same-host-link.json", -1, "links[1]",
        "both ends are on host \"m1\"");
}

Test(bad, duplicate_address)
{
    BAD("bad-dup-addr-hosts.json", -1, "links[1][1].addr",
        "\"10.0.0.2\" is on host \"m3\" here but on host \"m2\" in "
        "links[0][1]");
    BAD("bad-dup-addr-links.json", -1, "links[1][0].addr",
        "\"10.0.0.1\" of host \"m1\" already ends links[0]");
}

Test(bad, port)
{
    BAD("bad-port-range.json", -1, "port: expected a port number in [1, 65535]",
        "got 70000");
    BAD("bad-port-range-host.json", -1, "hosts[0].ports[1]: expected a port",
        "got 0");
    BAD("bad-port-overflow.json", -1, "hosts[0]: port 65534 + 3", "65535");
    BAD("bad-dup-port.json", -1, "hosts[0].ports[2]: port 5000",
        "already hosts[0].ports[0]");
}

Test(bad, rank_count)
{
    BAD("bad-rank-count.json", 4, "the hosts hold 3 ranks but the job has 4");
    BAD("bad-rank-count.json", 1, "hold 3 ranks", "has 1");
}

Test(bad, ranks)
{
    BAD("bad-ranks-zero.json", -1, "hosts[0].ranks",
        "expected an integer in [1, 4096], got 0");
    BAD("bad-ranks-negative.json", -1, "hosts[1].ranks", "got -2");
}

Test(bad, hosts)
{
    BAD("bad-hosts-empty.json", -1, "hosts: expected a non-empty array");
    BAD("bad-dup-host.json", -1, "hosts[2].name", "\"m1\" is already hosts[0]");
}

Test(bad, ring_not_closed)
{
    BAD("bad-ring-open.json", -1, "no ring passes through every host",
        "\"m1\" (linked only to \"m2\")", "\"m4\" (linked only to \"m3\")",
        "cannot be placed");
    BAD("bad-ring-unlinked-host.json", -1, "\"lonely\" (no links)",
        "cannot be placed");
    BAD("bad-ring-bowtie.json", -1,
        "longest cycle is \"a\" -> \"b\" -> "
        "\"hub\" -> \"a\"",
        "\"d\", \"e\" cannot be placed");
    BAD("bad-2hosts-nolink.json", -1, "\"m1\" and \"m2\" share no link");
}

Test(bad, ring_search_limit)
{
    BAD("bad-ring-too-many.json", -1, "the 17 hosts",
        "do not form a ring (\"h1\" and \"h2\" share no link)",
        "at most 16 hosts", "list the hosts in ring order");
}

Test(bad, mesh)
{
    weft__hostfile_out h;
    char msg[512];

    BAD("bad-mesh-incomplete.json", -1, "topology \"mesh\"",
        "\"m1\" and \"m3\" (hosts[0] and hosts[2]) share none");
    /* A mesh asked for elsewhere, of a ring file. */
    load_ok("good-ring4x2.json", 4, &h);
    cr_assert_eq(weft__hostfile_check_mesh(&h, "ring.json", msg, sizeof msg),
                 WEFT_ECONFIG);
    cr_assert(strstr(msg, "ring.json: ") == msg, "%s", msg);
    cr_assert(strstr(msg, "\"m1\" and \"m3\"") != NULL, "%s", msg);
    weft__hostfile_free(&h);
}

Test(bad, transport_topology)
{
    BAD("bad-transport.json", -1, "transport: unknown value \"udp\"",
        "expected \"tcp\" or \"ibverbs\"");
    BAD("bad-topology.json", -1, "topology: unknown value \"star\"",
        "\"ring\", \"mesh\" or \"auto\"");
}

Test(bad, mlx)
{
    BAD("bad-mlx-entry.json", -1, "[1][0]: expected an \"ip:port\" string",
        "got \"10.0.0.2\"");
    BAD("bad-mlx-port.json", -1, "[0][1]: expected an \"ip:port\"",
        "\"10.0.1.1:99999\"");
    BAD("bad-mlx-type.json", -1, "[1][0]: expected an \"ip:port\"",
        "got something else");
    BAD("bad-mlx-count.json", -1, "[2]: expected a list of 2 \"ip:port\"");
    BAD("bad-mlx-dup.json", -1, "[2][0]: address \"127.0.0.1:5000\"",
        "already [0][0]");
    BAD("bad-mlx-launch-form.json", -1, "[0]: expected a list of \"ip:port\"",
        "got an object", "mlx.launch");
}

Test(bad, mpirun_text)
{
    BAD("bad-mpirun-slots.txt", -1, "line 3, column 7",
        "bad \"slots=abc\": expected slots=N");
    BAD("bad-mpirun-slots-zero.txt", -1, "line 1, column 7", "\"slots=0\"");
    BAD("bad-mpirun-token.txt", -1, "line 3, column 7", "unexpected \"cpus=4\"",
        "expected \"host slots=N\"");
    BAD("bad-mpirun-dup.txt", -1,
        "line 3: host \"node1\" is already on line 1");
    BAD("bad-mpirun-name.txt", -1, "line 2, column 5",
        "unexpected character '/'");
    BAD("bad-empty.txt", -1, "no hosts");
}

Test(bad, unreadable)
{
    BAD("no-such-file.json", -1, "cannot open the hostfile");
}

/* Anything but a regular file is refused without reading it: a FIFO that
 * no one writes would block the open (and weft_init) forever, a directory
 * or a device such as /dev/zero is no hostfile. */
static void expect_not_regular(const char *path)
{
    char msg[1024];
    weft__hostfile_out h;
    int rc;

    rc = weft__hostfile_load(path, -1, &h, msg, sizeof msg);
    cr_assert_eq(rc, WEFT_ECONFIG, "%s: rc %d, expected WEFT_ECONFIG (%s)",
                 path, rc, rc ? msg : "loaded");
    cr_assert_eq(strncmp(msg, path, strlen(path)), 0,
                 "%s: message does not start with the file: %s", path, msg);
    cr_assert(strstr(msg, "not a regular file") != NULL,
              "%s: message lacks \"not a regular file\": %s", path, msg);
}

Test(bad, fifo, .timeout = 10)
{
    with_fifo("hosts.json", expect_not_regular);
}

Test(bad, directory, .timeout = 10)
{
    expect_not_regular(fixdir());
}

Test(bad, device, .timeout = 10)
{
    expect_not_regular("/dev/zero");
}

/* Every bad-* fixture in the directory fails with WEFT_ECONFIG and a
 * message that starts with its path (the rank-count one given 99 ranks). */
Test(bad, every_bad_fixture)
{
    DIR *d = opendir(fixdir());
    struct dirent *e;
    int n = 0;

    cr_assert_not_null(d);
    while ((e = readdir(d)) != NULL)
        if (strncmp(e->d_name, "bad-", 4) == 0) {
            expect_bad(e->d_name, 99, (const char *)NULL);
            n++;
        }
    closedir(d);
    cr_assert_geq(n, 17, "only %d bad fixtures", n);
}

/* ---- API edges ---- */

Test(api, edges)
{
    weft__hostfile_out h;
    char msg[64];

    weft__hostfile_free(NULL);
    memset(&h, 0, sizeof h);
    weft__hostfile_free(&h);
    cr_assert_eq(weft__hostfile_load("x", -1, NULL, msg, sizeof msg),
                 WEFT_EINVAL);
    cr_assert_eq(weft__hostfile_load(NULL, -1, &h, msg, sizeof msg),
                 WEFT_ECONFIG);
    /* A short message buffer truncates, and NULL is fine. */
    load_ok("good-single.json", 4, &h);
    weft__hostfile_free(&h);
    {
        char path[1024];
        fixpath(path, sizeof path, "bad-unknown-host.json");
        cr_assert_eq(weft__hostfile_load(path, -1, &h, msg, sizeof msg),
                     WEFT_ECONFIG);
        cr_assert_eq(strlen(msg), sizeof msg - 1);
        cr_assert_eq(weft__hostfile_load(path, -1, &h, NULL, 0), WEFT_ECONFIG);
    }
    cr_assert_eq(weft__hostfile_describe(NULL, 1, stdout), WEFT_EINVAL);
}

/* ---- describe ---- */

Test(describe, ring4x2_names_every_link_and_wire)
{
    weft__hostfile_out h;
    char *buf = NULL, want[512];
    size_t len = 0;
    FILE *f;

    load_ok("good-ring4x2.json", 4, &h);
    f = open_memstream(&buf, &len);
    cr_assert_not_null(f);
    cr_assert_eq(weft__hostfile_describe(&h, 2, f), WEFT_OK);
    fclose(f);
    cr_assert(strstr(buf, "m1 [rank 0] -> m2 [rank 1] -> m3 [rank 2] -> m4 "
                          "[rank 3] -> m1") != NULL,
              "%s", buf);
    for (int l = 0; l < h.nlinks; l++) {
        const weft__link *lk = &h.links[l];
        const char *n0 = h.hosts[lk->end[0].host].name;
        const char *n1 = h.hosts[lk->end[1].host].name;
        snprintf(want, sizeof want, "link %d: %s %s <-> %s %s\n", l, n0,
                 lk->end[0].addr, n1, lk->end[1].addr);
        cr_assert(strstr(buf, want) != NULL, "lacks \"%s\":\n%s", want, buf);
        for (int w = 0; w < 2; w++) {
            snprintf(want, sizeof want, "wire %d of link %d: %s %s <-> %s %s",
                     w, l, n0, lk->end[0].addr, n1, lk->end[1].addr);
            cr_assert(strstr(buf, want) != NULL, "lacks \"%s\":\n%s", want,
                      buf);
        }
        snprintf(want, sizeof want, "wire 2 of link %d", l);
        cr_assert(strstr(buf, want) == NULL, "only 2 wires");
    }
    /* Who listens where: m4 (rank 3) connects to m1 (rank 0) on m1's end. */
    cr_assert(strstr(buf, "rank 3 connects to rank 0 at 169.254.8.1:40000") !=
                  NULL,
              "%s", buf);
    cr_assert(strstr(buf, "m1: ssh me@m1.local, rank 0, port 40000") != NULL,
              "%s", buf);
    free(buf);
    weft__hostfile_free(&h);
}

Test(describe, reordered_and_mesh)
{
    weft__hostfile_out h;
    char *buf = NULL;
    size_t len = 0;
    FILE *f;

    load_ok("good-reorder.json", 6, &h);
    f = open_memstream(&buf, &len);
    cr_assert_eq(weft__hostfile_describe(&h, 1, f), WEFT_OK);
    fclose(f);
    cr_assert(strstr(buf, "reordered") != NULL, "%s", buf);
    cr_assert(strstr(buf, "a [rank 0] -> c [ranks 1-2] -> e [rank 3] -> b "
                          "[rank 4] -> d [rank 5] -> a") != NULL,
              "%s", buf);
    cr_assert(strstr(buf, "not a full mesh") != NULL, "%s", buf);
    free(buf);
    weft__hostfile_free(&h);

    buf = NULL;
    load_ok("good-mesh3.json", 6, &h);
    f = open_memstream(&buf, &len);
    cr_assert_eq(weft__hostfile_describe(&h, 3, f), WEFT_OK);
    fclose(f);
    cr_assert(strstr(buf, "mesh: every pair of the 3 hosts") != NULL, "%s",
              buf);
    cr_assert(strstr(buf, "wire 2 of link 2: c 10.0.3.1 <-> a 10.0.3.2") !=
                  NULL,
              "%s", buf);
    cr_assert(strstr(buf, "rank pairs:") != NULL, "%s", buf);
    free(buf);
    weft__hostfile_free(&h);
}

/* Which topology a job runs with: "auto" is the mesh only where at least
 * two hosts are all joined pairwise; an asked-for topology stands. */
Test(topology, auto_and_asked)
{
    weft__hostfile_out h;
    char why[256];

    load_ok("good-mesh3.json", 6, &h); /* says "mesh" itself */
    cr_assert_eq(weft__hostfile_mesh(&h, NULL, why, sizeof why), 1);
    cr_assert_str_eq(why, "asked for");
    cr_assert_eq(weft__hostfile_mesh(&h, "auto", why, sizeof why), 1);
    cr_assert(strstr(why, "every pair of the 3 hosts") != NULL, "%s", why);
    cr_assert_eq(weft__hostfile_mesh(&h, "ring", NULL, 0), 0);
    weft__hostfile_free(&h);

    load_ok("good-ring4x2.json", 4, &h);
    cr_assert_eq(weft__hostfile_mesh(&h, "auto", why, sizeof why), 0);
    cr_assert(strstr(why, "share no link") != NULL, "%s", why);
    weft__hostfile_free(&h);

    load_ok("good-single.json", 4, &h);
    cr_assert_eq(weft__hostfile_mesh(&h, NULL, why, sizeof why), 0);
    cr_assert(strstr(why, "one host") != NULL, "%s", why);
    cr_assert_eq(weft__hostfile_mesh(&h, "mesh", NULL, 0), 1);
    weft__hostfile_free(&h);
}

Test(topology, describe_says_which)
{
    weft__hostfile_out h;
    char *buf = NULL;
    size_t len = 0;
    FILE *f;

    load_ok("good-single.json", 4, &h);
    f = open_memstream(&buf, &len);
    cr_assert_eq(weft__hostfile_describe(&h, 1, f), WEFT_OK);
    fclose(f);
    cr_assert(strstr(buf, "topology in effect: ring (auto: one host") != NULL,
              "%s", buf);
    free(buf);
    weft__hostfile_free(&h);
}

/* A mesh has one engine lane per peer: more ranks than that is a clear
 * configuration error, not a silent fallback. */
Test(topology, mesh_rank_limit)
{
    weft__hostfile_out h;
    char text[256], msg[512];
    int n = WEFT__MESH_MAX_RANKS + 1;

    snprintf(text, sizeof text,
             "{\"topology\": \"mesh\", \"hosts\": [{\"name\": \"x\", "
             "\"ranks\": %d}], \"links\": []}",
             n);
    cr_assert_eq(
        weft__hostfile_load_text("big.json", text, n, &h, msg, sizeof msg),
        WEFT_ECONFIG);
    cr_assert(strstr(msg, "at most 17 ranks") != NULL, "%s", msg);
    snprintf(text, sizeof text,
             "{\"hosts\": [{\"name\": \"x\", \"ranks\": %d}], \"links\": []}",
             n);
    cr_assert_eq(
        weft__hostfile_load_text("big.json", text, n, &h, msg, sizeof msg),
        WEFT_OK, "%s", msg);
    cr_assert_eq(weft__hostfile_mesh(&h, "auto", NULL, 0), 0);
    weft__hostfile_free(&h);
}

/* Loads weft_config.addrs (n of them) into *h, which must succeed. */
static void load_addrs_ok(const char *const *addrs, int n,
                          weft__hostfile_out *h)
{
    char err[512];

    cr_assert_eq(weft__hostfile_load_addrs("weft_config.addrs", addrs, n, h,
                                           err, sizeof err),
                 WEFT_OK, "%s", err);
}

/* weft_config.addrs: consecutive ranks at one ip are one host (shared
 * memory, and the collectives see the machine), reached at that ip;
 * every pair of hosts is linked once. */
Test(addrs, consecutive_ranks_at_one_ip_are_one_host)
{
    const char *addrs[] = {"10.0.0.1:5000", "10.0.0.1:5001", "10.0.0.2:5000",
                           "10.0.0.2:5001", "10.0.0.3:7000"};
    weft__hostfile_out h;

    load_addrs_ok(addrs, 5, &h);
    check_invariants(&h);
    cr_assert_eq(h.nranks, 5);
    cr_assert_eq(h.nhosts, 3);
    cr_assert_eq(h.hosts[0].nranks, 2);
    cr_assert_eq(h.hosts[1].nranks, 2);
    cr_assert_eq(h.hosts[2].nranks, 1);
    cr_assert_eq(h.hosts[0].ports[1], 5001);
    cr_assert_eq(h.hosts[1].ports[0], 5000);
    cr_assert_str_eq(h.hosts[1].local_addr, "10.0.0.2");
    for (int r = 0; r < 5; r++)
        cr_assert_eq(h.rank_host[r], r / 2, "rank %d", r);
    cr_assert_eq(h.nlinks, 3, "one link per pair of hosts");
    cr_assert_eq(linked(&h, 0, 2), 1);
    cr_assert_eq(h.ring_reordered, 0, "ranks keep the caller's numbers");
    weft__hostfile_free(&h);
}

Test(addrs, one_ip_is_one_host_without_links)
{
    const char *addrs[] = {"127.0.0.1:5000", "127.0.0.1:5001",
                           "127.0.0.1:5002"};
    weft__hostfile_out h;

    load_addrs_ok(addrs, 3, &h);
    check_invariants(&h);
    cr_assert_eq(h.nhosts, 1);
    cr_assert_eq(h.hosts[0].nranks, 3);
    cr_assert_eq(h.hosts[0].ports[2], 5002);
    cr_assert_eq(h.nlinks, 0);
    weft__hostfile_free(&h);
}

/* A host's ranks are numbered consecutively: an ip that comes back after
 * another stays a host of its own (TCP between them, as before). */
Test(addrs, ip_seen_again_later_is_another_host)
{
    const char *addrs[] = {"10.0.0.1:5000", "10.0.0.2:5000", "10.0.0.1:5001"};
    weft__hostfile_out h;

    load_addrs_ok(addrs, 3, &h);
    check_invariants(&h);
    cr_assert_eq(h.nhosts, 3);
    cr_assert_eq(h.nlinks, 3);
    cr_assert_eq(h.rank_host[2], 2);
    weft__hostfile_free(&h);
}

Test(addrs, same_ip_and_port_twice_is_refused)
{
    const char *addrs[] = {"10.0.0.1:5000", "10.0.0.1:5000"};
    weft__hostfile_out h;
    char err[512];

    cr_assert_eq(weft__hostfile_load_addrs("weft_config.addrs", addrs, 2, &h,
                                           err, sizeof err),
                 WEFT_ECONFIG);
    cr_assert(strstr(err, "already") != NULL, "%s", err);
}
