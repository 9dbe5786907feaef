/*
 * What the hostfile's files share among themselves; the rest of weft sees
 * only hostfile.h. The files, one concern each:
 *
 *  hostfile.c    the entry points (load, load_text, read, free), reading
 *                the file, telling the three forms apart, and what every
 *                form goes through after parsing (rank count, ring, rank
 *                numbers)
 *  hf_common.c   the helpers declared first below, which every other
 *                file uses and which use none of theirs
 *  parse_json.c  weft's JSON object
 *  parse_mlx.c   MLX's ring hostfile (a JSON list of "ip:port" lists)
 *  parse_text.c  mpirun's text form
 *  search.c      the ring through the hosts and the mesh check
 *  describe.c    weftrun --check's description
 */
#ifndef WEFT_HOSTFILE_INT_H
#define WEFT_HOSTFILE_INT_H

#include "topo/hostfile.h"

#include <jansson.h>
#include <stddef.h>

/* Where a failure is reported: every message starts with file (the path,
 * or the name load_text was given). */
typedef struct {
    const char *file;
    char *errmsg;
    size_t errlen;
} hf_ctx;

/* "FILE: " + the message; returns WEFT_ECONFIG. */
int weft__hf_fail(hf_ctx *c, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

/* "FILE: out of memory reading the hostfile"; returns WEFT_ENOMEM. */
int weft__hf_nomem(hf_ctx *c);

/* Appends to a NUL-terminated buffer, truncating quietly. */
void weft__hf_app(char *buf, size_t len, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* Copies src to dst, truncated to dstlen - 1 bytes (callers check
 * lengths first where truncation would matter). */
void weft__hf_copy_str(char *dst, size_t dstlen, const char *src);

/* The index of the host called name among h->hosts[0..upto-1], or -1. */
int weft__hf_find_host(const weft__hostfile_out *h, int upto, const char *name);

/* Gives the host->nranks ranks of host (ports allocated) the ports base,
 * base + 1, ...: 0, or -1 where the last would be past 65535, which each
 * form reports in its own words. */
int weft__hf_default_ports(weft__host *host, int base);

/* Sets link l's ends: end 0 on host h0 at address a0, end 1 on h1 at a1
 * (forms that derive their links rather than list them). */
void weft__hf_set_link(weft__link *l, int h0, const char *a0, int h1,
                       const char *a1);

/* The parsers, one per form. Each sets h->format and fills hosts (with
 * their ports), nranks and links; validation of the whole (rank count,
 * ring, mesh) follows in hostfile.c. On failure *h may hold part of what
 * was allocated, which the caller frees with weft__hostfile_free. */
int weft__hf_parse_json(hf_ctx *c, json_t *root, weft__hostfile_out *h);
/* all_pairs: one link between every pair of ranks (weft_config.addrs)
 * instead of the ring's neighbours. */
int weft__hf_parse_mlx(hf_ctx *c, json_t *root, int all_pairs,
                       weft__hostfile_out *h);
/* buf is the text, NUL-terminated; it is cut up in place. */
int weft__hf_parse_text(hf_ctx *c, char *buf, weft__hostfile_out *h);

/* Sets h->host_order to a ring through every host (the hosts as listed
 * where they form one, else the first found by search, ring_reordered
 * set), after checking the mesh where h->topology is "mesh". */
int weft__hf_form_ring(hf_ctx *c, weft__hostfile_out *h);

/* 1 where some pair of hosts shares no link, the first such pair (in
 * index order) then in *pa < *pb; 0 where every pair shares one;
 * WEFT_ENOMEM where there was no memory to look. */
int weft__hf_unlinked_pair(const weft__hostfile_out *h, int *pa, int *pb);

#endif
