/*
 * weftrun --check: what a job from a hostfile would form, in words. The
 * ring (or mesh) through the hosts, each host with its ranks and ports, and
 * each link with its wires: which rank connects to which, at which address
 * and port, so that a person can compare it with the cabling.
 */
#include "topo/hostfile_int.h"

#include <stdio.h>
#include <string.h>

static void put_ranks(FILE *f, const weft__host *hs)
{
    if (hs->nranks == 1)
        fprintf(f, "rank %d", hs->first_rank);
    else
        fprintf(f, "ranks %d-%d", hs->first_rank,
                hs->first_rank + hs->nranks - 1);
}

/* The topology in effect and the ring the ranks are numbered along;
 * missing: whether hosts mi and mj (the first such pair) share no link. */
static void put_topology(const weft__hostfile_out *h, const char *topo,
                         int missing, int mi, int mj, FILE *out)
{
    int mesh;
    char why[160];

    mesh = weft__hostfile_mesh(h, NULL, why, sizeof why);
    fprintf(out, "topology in effect: %s (%s)\n", mesh ? "mesh" : "ring", why);
    if (h->nhosts == 1) {
        fprintf(out, "ring: one host, \"%s\"; its ranks talk over loopback\n",
                h->hosts[0].name);
        return;
    }
    if (mesh)
        fprintf(out,
                "mesh: every pair of the %d hosts shares a link; ranks "
                "exchange directly with every peer, and number along this "
                "ring:\n",
                h->nhosts);
    else if (!missing && strcmp(topo, "ring") != 0 &&
             h->nranks <= WEFT__MESH_MAX_RANKS)
        fprintf(out, "a full mesh: small operations exchange directly, "
                     "large ones go around the ring:\n");
    else if (missing)
        fprintf(out,
                "not a full mesh (\"%s\" and \"%s\" share no link): ranks "
                "on hosts without a link reach each other through the "
                "ring:\n",
                h->hosts[mi].name, h->hosts[mj].name);
    fprintf(out, "ring%s:\n  ",
            h->ring_reordered
                ? " (reordered: the hosts, in the order listed, do not "
                  "form a cycle; ranks are numbered along this ring)"
                : " (hosts in the order listed)");
    for (int i = 0; i < h->nhosts; i++) {
        const weft__host *hs = &h->hosts[h->host_order[i]];
        fprintf(out, "%s [", hs->name);
        put_ranks(out, hs);
        fprintf(out, "] -> ");
    }
    fprintf(out, "%s\n", h->hosts[h->host_order[0]].name);
}

/* The hosts in ring order, each with its ssh name, ranks and ports. */
static void put_hosts(const weft__hostfile_out *h, FILE *out)
{
    fprintf(out, "hosts:\n");
    for (int i = 0; i < h->nhosts; i++) {
        const weft__host *hs = &h->hosts[h->host_order[i]];
        fprintf(out, "  %s: ssh %s, ", hs->name, hs->ssh);
        put_ranks(out, hs);
        fprintf(out, ", port%s", hs->nranks == 1 ? "" : "s");
        for (int k = 0; k < hs->nranks; k++)
            fprintf(out, "%s%d", k ? ", " : " ", hs->ports[k]);
        fprintf(out, "\n");
    }
}

/* Link l: its two ends, each of its wires, and (where several ranks share
 * it) the first pairs of ranks that connect over it. */
static void put_link(const weft__hostfile_out *h, int l, int wires, FILE *out)
{
    const weft__link *lk = &h->links[l];
    const weft__link_end *e0 = &lk->end[0], *e1 = &lk->end[1];
    const weft__host *h0 = &h->hosts[e0->host], *h1 = &h->hosts[e1->host];
    /* The end on the host whose ranks come first listens. */
    int lo = h0->first_rank < h1->first_rank ? 0 : 1;
    const weft__link_end *el = &lk->end[lo], *eh = &lk->end[1 - lo];
    const weft__host *hl = &h->hosts[el->host], *hh = &h->hosts[eh->host];
    int shown = 0, npairs = hl->nranks * hh->nranks;

    fprintf(out, "  link %d: %s %s%s%s%s <-> %s %s%s%s%s\n", l, h0->name,
            e0->addr, e0->device[0] ? " (device " : "", e0->device,
            e0->device[0] ? ")" : "", h1->name, e1->addr,
            e1->device[0] ? " (device " : "", e1->device,
            e1->device[0] ? ")" : "");
    for (int w = 0; w < wires; w++) {
        fprintf(out, "    wire %d of link %d: %s %s <-> %s %s", w, l, h0->name,
                e0->addr, h1->name, e1->addr);
        if (npairs == 1)
            fprintf(out, " (rank %d connects to rank %d at %s:%d)\n",
                    hh->first_rank, hl->first_rank, el->addr, hl->ports[0]);
        else
            fprintf(out, " (one for each of the %d rank pairs)\n", npairs);
    }
    if (npairs > 1) {
        fprintf(out, "    rank pairs:");
        for (int x = 0; x < hh->nranks && shown < 8; x++)
            for (int y = 0; y < hl->nranks && shown < 8; y++, shown++)
                fprintf(out, "%s rank %d -> rank %d at %s:%d", shown ? "," : "",
                        hh->first_rank + x, hl->first_rank + y, el->addr,
                        hl->ports[y]);
        fprintf(out, "%s\n", npairs > shown ? ", ..." : "");
    }
}

int weft__hostfile_describe(const weft__hostfile_out *h, int wires, FILE *out)
{
    static const char *const formats[] = {"?", "weft JSON", "MLX ring",
                                          "mpirun text"};
    const char *topo = h != NULL && h->topology[0] ? h->topology : "auto";
    int mi = -1, mj = -1, missing;

    if (h == NULL || out == NULL || wires < 1 || h->nhosts < 1 ||
        h->host_order == NULL)
        return WEFT_EINVAL;
    missing = weft__hf_unlinked_pair(h, &mi, &mj);
    if (missing < 0)
        return WEFT_ENOMEM;
    fprintf(out,
            "%s hostfile: %d host%s, %d rank%s, %d link%s; transport "
            "%s, topology %s%s\n",
            formats[h->format >= 1 && h->format <= 3 ? h->format : 0],
            h->nhosts, h->nhosts == 1 ? "" : "s", h->nranks,
            h->nranks == 1 ? "" : "s", h->nlinks, h->nlinks == 1 ? "" : "s",
            h->transport[0] ? h->transport : "tcp", topo,
            h->topology[0] ? "" : " (default)");
    put_topology(h, topo, missing, mi, mj, out);
    put_hosts(h, out);
    if (h->nlinks == 0)
        fprintf(out, "links: none\n");
    else
        fprintf(out,
                "links (%d wire%s on each; per pair of ranks on its two "
                "hosts, the higher rank connects to the lower rank's "
                "address and port):\n",
                wires, wires == 1 ? "" : "s");
    for (int l = 0; l < h->nlinks; l++)
        put_link(h, l, wires, out);
    if (fflush(out) != 0 || ferror(out))
        return WEFT_EINVAL;
    return WEFT_OK;
}
