/*
 * Hostfiles: which hosts run how many ranks, and which cables (links) join
 * them. Three forms are read, told apart by their first non-blank
 * character:
 *
 *  '{'   weft's JSON object (README / API.md "Hostfile"): "hosts", "links",
 *        optional "transport", "topology", "port", per-host "ssh", "ranks"
 *        and "ports" (one port per local rank).
 *  '['   MLX's ring hostfile (MLX_HOSTFILE): one list of "ip:port" strings
 *        per rank; see hostfile.c for how it maps onto hosts and links.
 *  else  mpirun's text hostfile: "host slots=N" per line ("host" alone is
 *        one slot), '#' comments, blank lines; one link per pair of hosts,
 *        its addresses the host names (resolved when connecting).
 *
 * The result is validated as a whole (addresses, ports, rank count, the
 * ring through every host, the full mesh when "topology" is "mesh") and
 * every failure is WEFT_ECONFIG with a message naming the file and the
 * line and column (syntax) or the field path such as hosts[1].ranks, and
 * what was expected.
 */
#ifndef WEFT_HOSTFILE_H
#define WEFT_HOSTFILE_H

#include "topo/topo.h"

#include <stddef.h>
#include <stdio.h>

/* Most hosts searched for a ring when the hosts, in the order listed, do
 * not form one (the search is exponential in the number of hosts). */
#define WEFT__HOSTFILE_MAX_SEARCH 16

enum {
    WEFT__HOSTFILE_JSON = 1, /* weft's JSON object */
    WEFT__HOSTFILE_MLX,      /* MLX's ring hostfile */
    WEFT__HOSTFILE_MPIRUN    /* mpirun's "host slots=N" text */
};

/* What a hostfile says, in the shapes weft__config holds. */
typedef struct {
    int format;         /* WEFT__HOSTFILE_* */
    char transport[16]; /* "tcp" or "ibverbs"; "" where the file is silent */
    char topology[16];  /* "ring", "mesh" or "auto"; "" where silent */
    int nranks;         /* the sum of the hosts' ranks */
    int nhosts;
    weft__host *hosts; /* in file order; each with nranks ports */
    int nlinks;
    weft__link *links; /* in file order; ends name hosts by index */
    int *rank_host;    /* nranks entries: the host index of each rank */
    /* The ring: host_order[i] (nhosts entries) is the host at position i.
     * Ranks are numbered along it: host_order[0]'s ranks first, and so on,
     * which is what hosts[].first_rank and rank_host say. ring_reordered
     * is 1 where the hosts as listed do not form a cycle and a different
     * order was found (then ranks are not numbered in file order). */
    int ring_reordered;
    int *host_order;
} weft__hostfile_out;

/* Reads (a regular file only, as weft__hostfile_read), detects the form
 * of, and validates the hostfile at path.
 * nranks_expected >= 0: the hosts must hold exactly that many ranks;
 * -1: any number (weftrun --check). On success fills *out (free it with
 * weft__hostfile_free) and returns WEFT_OK. On failure returns
 * WEFT_ECONFIG (or WEFT_ENOMEM), fills errmsg and leaves *out zeroed, with
 * nothing to free. A caller may take hosts, links, rank_host or
 * host_order out of *out (setting the field to NULL) before freeing it. */
int weft__hostfile_load(const char *path, int nranks_expected,
                        weft__hostfile_out *out, char *errmsg, size_t errlen);

/* Reads the hostfile at path, without parsing it, into *text (a new
 * NUL-terminated string the caller frees). Only a regular file is read;
 * a FIFO, a directory or a device is refused at once, without blocking.
 * Returns WEFT_OK, or WEFT_ECONFIG (or WEFT_ENOMEM) with errmsg filled in,
 * starting with the path, and *text NULL. weftrun reads the file once with
 * this and hands the text to weft__hostfile_load_text and to its ranks. */
int weft__hostfile_read(const char *path, char **text, char *errmsg,
                        size_t errlen);

/* As weft__hostfile_load, for a hostfile's text (name stands for the file
 * in messages): how weftrun hands the hostfile to ranks on other hosts. */
int weft__hostfile_load_text(const char *name, const char *text,
                             int nranks_expected, weft__hostfile_out *out,
                             char *errmsg, size_t errlen);

/* The job weft_config.addrs describes: nranks "addr:port" strings in rank
 * order, rank r a host of its own listening at addrs[r], one link between
 * every pair of ranks (so a full mesh). Validated as a hostfile is; name
 * starts every message. */
int weft__hostfile_load_addrs(const char *name, const char *const *addrs,
                              int nranks, weft__hostfile_out *out, char *errmsg,
                              size_t errlen);

/* Frees what *h holds and zeroes it; NULL or a zeroed *h are fine. */
void weft__hostfile_free(weft__hostfile_out *h);

/* For a topology chosen elsewhere (WEFT_TOPOLOGY, weftrun --topology):
 * WEFT_OK where every pair of hosts shares a link and the job has at most
 * WEFT__MESH_MAX_RANKS ranks, else WEFT_ECONFIG with a message naming the
 * first pair that does not (prefixed with file, which may be NULL). */
int weft__hostfile_check_mesh(const weft__hostfile_out *h, const char *file,
                              char *errmsg, size_t errlen);

/* The topology a job from *h runs with, for the topology asked ("ring",
 * "mesh" or "auto"; NULL or "" for the file's own, else "auto"): 1 for the
 * mesh, 0 for the ring. "auto" is the mesh where there are at least two
 * hosts, every pair of hosts shares a link and the job has at most
 * WEFT__MESH_MAX_RANKS ranks; on one host the ring (loopback offers no
 * links to gain, and the ring overlaps reductions with transfers). why
 * (may be NULL) gets the reason in words. */
int weft__hostfile_mesh(const weft__hostfile_out *h, const char *asked,
                        char *why, size_t whylen);

/* Prints, for weftrun --check, what a job from *h would form: the ring
 * (or mesh) through the hosts, each host with its ranks and ports, each
 * link with its two ends and its `wires` wires (wire k of link l between
 * which addresses, and which rank listens). Returns WEFT_OK, or
 * WEFT_EINVAL for a bad argument or a failed write. */
int weft__hostfile_describe(const weft__hostfile_out *h, int wires, FILE *out);

#endif
