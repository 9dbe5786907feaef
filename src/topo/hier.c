/* The job's shape for the hierarchical algorithms; see topo.h. */
#include "topo/topo.h"

#include <string.h>

int weft__hier_local(const weft__config *cfg)
{
    const int nh = cfg->nhosts;
    const int local = nh > 0 ? cfg->hosts[0].nranks : 0;

    /* The ranks of one host talk over shared memory (or loopback under
     * TCP); under ibverbs without shared memory they would go through
     * the device, which the flat algorithms use as well. */
    if (nh < 2 || local < 2 || local > WEFT__MESH_MAX_RANKS ||
        (strcmp(cfg->transport, "tcp") != 0 && !cfg->shm))
        return 0;
    for (int h = 0; h < nh; h++) {
        const int next = (h + 1) % nh;
        int linked = 0;

        if (cfg->hosts[h].nranks != local ||
            cfg->hosts[h].first_rank != h * local)
            return 0;
        /* Around the hosts' ring: 0-1 for two hosts (once), h-(h+1) for
         * more. Every rank of a host has wires to every rank of a host
         * that a cable joins it to. */
        if (nh == 2 && h == 1)
            break;
        for (int l = 0; l < cfg->nlinks && !linked; l++)
            linked = weft__link_joins(&cfg->links[l], h, next);
        if (!linked)
            return 0;
    }
    return local;
}
