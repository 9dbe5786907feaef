/*
 * The configuration of a communicator shrunk or split from a ring of
 * hosts whose hosts left form a chain (weft__config_subset): where no
 * cable joins two hosts next in rank order, a path through the hosts
 * between (topo.h, weft__link.nvia), one per cable of its steps; where
 * none joins them, WEFT_ENOTSUP naming the two parts; under ibverbs,
 * WEFT_ENOTSUP saying that only TCP runs paths.
 */
#include "topo/topo.h"

#include <criterion/criterion.h>
#include <stdio.h>
#include <string.h>

/* A ring of nh hosts, one rank each, with nl cables between neighbours
 * (host i's address on cable k to host i+1: 169.254.<10 i + k>.1). */
static void load_ring(weft__config *cfg, int nh, int nl, const char *tp)
{
    char text[8192], err[512];
    size_t at = 0;
    weft_config uc;

    at += (size_t)snprintf(text + at, sizeof text - at,
                           "{\"topology\": \"ring\", \"port\": 40000, "
                           "\"hosts\": [");
    for (int h = 0; h < nh; h++)
        at += (size_t)snprintf(text + at, sizeof text - at,
                               "%s{\"name\": \"h%d\", \"ranks\": 1}",
                               h ? ", " : "", h);
    at += (size_t)snprintf(text + at, sizeof text - at, "], \"links\": [");
    for (int h = 0; h < nh; h++)
        for (int k = 0; k < nl; k++)
            at += (size_t)snprintf(
                text + at, sizeof text - at,
                "%s[{\"host\": \"h%d\", \"addr\": \"169.254.%d.1\"}, "
                "{\"host\": \"h%d\", \"addr\": \"169.254.%d.2\"}]",
                h || k ? ", " : "", h, 10 * h + k, (h + 1) % nh, 10 * h + k);
    snprintf(text + at, sizeof text - at, "]}");
    memset(&uc, 0, sizeof uc);
    uc.rank = 0;
    uc.size = nh;
    uc.hostfile_text = text;
    uc.transport = tp;
    cr_assert_eq(weft__config_load(cfg, &uc, err, sizeof err), WEFT_OK, "%s",
                 err);
}

static int npaths(const weft__config *c)
{
    int n = 0;
    for (int l = 0; l < c->nlinks; l++)
        n += c->links[l].nvia > 0;
    return n;
}

/* The cable joining hosts a and b that a path's step takes is one. */
static void assert_cable(const weft__config *c, int l, int a, int b)
{
    cr_assert(l >= 0 && l < c->nlinks, "cable %d out of range", l);
    cr_assert_eq(c->links[l].nvia, 0, "step %d is itself a path", l);
    cr_assert(weft__link_joins(&c->links[l], a, b),
              "step %d does not join hosts %d and %d", l, a, b);
}

/* A ring of 4, the last host lost (under transport tp: ibverbs runs the
 * path on its TCP side): the step from host 2 to host 0 goes through
 * host 1. */
static void host_lost_from_ring_of_4(const char *tp)
{
    weft__config cfg, out;
    const int members[] = {0, 1, 2};
    char err[512] = "";

    load_ring(&cfg, 4, 1, tp);
    cr_assert_eq(
        weft__config_subset(&cfg, members, 3, 0, NULL, &out, err, sizeof err),
        WEFT_OK, "%s", err);
    cr_assert_str_eq(out.transport, tp);
    cr_assert_eq(out.nhosts, 3);
    cr_assert_eq(npaths(&out), 1);
    for (int l = 0; l < out.nlinks; l++) {
        const weft__link *lk = &out.links[l];
        if (lk->nvia == 0)
            continue;
        /* The ring's step from host 2 to host 0, through host 1. */
        cr_assert(lk->end[0].host == 2 && lk->end[1].host == 0);
        cr_assert_eq(lk->nvia, 1);
        cr_assert_eq(lk->via[0], 1);
        assert_cable(&out, lk->hop[0], 2, 1);
        assert_cable(&out, lk->hop[1], 1, 0);
    }
    cr_assert_eq(out.mesh, 0, "a path is no cable for a mesh");
    /* Shrunk again to a pair with a cable: the path goes. */
    {
        weft__config two;
        const int m2[] = {0, 1};
        cr_assert_eq(
            weft__config_subset(&out, m2, 2, 0, NULL, &two, err, sizeof err),
            WEFT_OK, "%s", err);
        cr_assert_eq(npaths(&two), 0);
        cr_assert_eq(two.nlinks, 1);
        weft__config_free(&two);
    }
    weft__config_free(&out);
    weft__config_free(&cfg);
}

Test(paths, host_lost_from_ring_of_4)
{
    host_lost_from_ring_of_4("tcp");
}

Test(paths, under_ibverbs_too)
{
    host_lost_from_ring_of_4("ibverbs");
}

/* A ring of 5, the last host lost: the step from host 3 to host 0 goes
 * through hosts 2 and 1; two cables a pair give two paths, the k-th over
 * the k-th cable of each step. */
Test(paths, two_hosts_between_two_cables)
{
    weft__config cfg, out;
    const int members[] = {0, 1, 2, 3};
    char err[512] = "";

    load_ring(&cfg, 5, 2, "tcp");
    cr_assert_eq(
        weft__config_subset(&cfg, members, 4, 3, NULL, &out, err, sizeof err),
        WEFT_OK, "%s", err);
    cr_assert_eq(npaths(&out), 2);
    for (int l = 0; l < out.nlinks; l++) {
        const weft__link *lk = &out.links[l];
        if (lk->nvia == 0)
            continue;
        cr_assert(lk->end[0].host == 3 && lk->end[1].host == 0);
        cr_assert_eq(lk->nvia, 2);
        cr_assert(lk->via[0] == 2 && lk->via[1] == 1);
        assert_cable(&out, lk->hop[0], 3, 2);
        assert_cable(&out, lk->hop[1], 2, 1);
        assert_cable(&out, lk->hop[2], 1, 0);
        cr_assert_str_eq(lk->end[0].addr, "");
    }
    {
        /* The two paths take different cables at every step. */
        int first = -1;
        for (int l = 0; l < out.nlinks; l++) {
            const weft__link *lk = &out.links[l];
            if (lk->nvia == 0)
                continue;
            if (first < 0) {
                first = l;
                continue;
            }
            for (int i = 0; i <= lk->nvia; i++)
                cr_assert_neq(lk->hop[i], out.links[first].hop[i],
                              "both paths take cable %d at step %d", lk->hop[i],
                              i);
        }
    }
    weft__config_free(&out);
    weft__config_free(&cfg);
}

/* Hosts 0 and 2 of a ring of 4, hosts 1 and 3 gone: cut in two. */
Test(paths, cut_in_two)
{
    weft__config cfg, out;
    const int members[] = {0, 2};
    char err[512] = "";

    load_ring(&cfg, 4, 1, "tcp");
    cr_assert_eq(
        weft__config_subset(&cfg, members, 2, 0, NULL, &out, err, sizeof err),
        WEFT_ENOTSUP);
    cr_assert(strstr(err, "cut in two") != NULL, "%s", err);
    cr_assert(strstr(err, "joins h0 to h2") != NULL, "%s", err);
    weft__config_free(&cfg);
}
