/*
 * Hostfiles: reading the three accepted forms into hosts, links and a ring,
 * and validating them. See hostfile.h for the forms and the API.
 *
 * Every failure is WEFT_ECONFIG with a message that starts with the file's
 * path and then says where (line and column, or a field path such as
 * hosts[1].ranks) and what was expected: the reader is usually a person
 * starting a job by hand.
 *
 * MLX's ring hostfile, as weft reads it
 * -------------------------------------
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
 * mpirun's text form: "host slots=N [max_slots=M]" per line, "host" alone
 * is one slot, '#' starts a comment; each host takes the next N ranks (in
 * ring order), listens on the default ports 32323 + k, and every pair of
 * hosts is joined by one link whose ends are the two host names (resolved
 * when connecting; --wires makes more connections on it). max_slots is
 * checked and otherwise ignored.
 */
#include "topo/hostfile.h"

#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define MAX_FILE_BYTES (16L << 20)

typedef struct {
    const char *file;
    char *errmsg;
    size_t errlen;
} hf_ctx;

static int fail(hf_ctx *c, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

/* "FILE: " + the message; returns WEFT_ECONFIG. */
static int fail(hf_ctx *c, const char *fmt, ...)
{
    va_list ap;
    int n;

    if (c->errmsg == NULL || c->errlen == 0)
        return WEFT_ECONFIG;
    n = snprintf(c->errmsg, c->errlen, "%s: ", c->file);
    if (n < 0 || (size_t)n >= c->errlen)
        return WEFT_ECONFIG;
    va_start(ap, fmt);
    vsnprintf(c->errmsg + n, c->errlen - (size_t)n, fmt, ap);
    va_end(ap);
    return WEFT_ECONFIG;
}

static int nomem(hf_ctx *c)
{
    if (c->errmsg != NULL && c->errlen > 0)
        snprintf(c->errmsg, c->errlen, "%s: out of memory reading the hostfile",
                 c->file);
    return WEFT_ENOMEM;
}

void weft__hostfile_free(weft__hostfile_out *h)
{
    if (h == NULL)
        return;
    if (h->hosts != NULL)
        for (int i = 0; i < h->nhosts; i++)
            free(h->hosts[i].ports);
    free(h->hosts);
    free(h->links);
    free(h->rank_host);
    free(h->host_order);
    memset(h, 0, sizeof *h);
}

/* ---- helpers ---- */

static int find_host(const weft__hostfile_out *h, int upto, const char *name)
{
    for (int i = 0; i < upto; i++)
        if (strcmp(h->hosts[i].name, name) == 0)
            return i;
    return -1;
}

/* Appends to a buffer, truncating quietly. */
static void app(char *buf, size_t len, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static void app(char *buf, size_t len, const char *fmt, ...)
{
    size_t n = strlen(buf);
    va_list ap;

    if (n + 1 >= len)
        return;
    va_start(ap, fmt);
    vsnprintf(buf + n, len - n, fmt, ap);
    va_end(ap);
}

/* Copies src to dst, truncated to dstlen - 1 bytes (callers check
 * lengths first where truncation would matter). */
static void copy_str(char *dst, size_t dstlen, const char *src)
{
    size_t n = strlen(src);
    if (n >= dstlen)
        n = dstlen - 1;
    memcpy(dst, src, n);
    dst[n] = '\0';
}

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

/* ---- reading the file ---- */

/* What a file that is not a regular one is, for the message. */
static const char *file_kind(mode_t mode)
{
    if (S_ISFIFO(mode))
        return "a FIFO";
    if (S_ISDIR(mode))
        return "a directory";
    if (S_ISCHR(mode))
        return "a character device";
    if (S_ISBLK(mode))
        return "a block device";
    if (S_ISSOCK(mode))
        return "a socket";
    return "of an unknown kind";
}

/* Reads the whole file into a NUL-terminated buffer. Only a regular file
 * is read: opening a FIFO that no one writes would block the caller
 * (weft_init, weftrun) forever, and a directory or a device such as
 * /dev/zero is no hostfile. O_NONBLOCK makes that open return at once, and
 * fstat of the open descriptor checks the very file that is then read
 * (stat, then open, would race with the path changing in between); for a
 * regular file O_NONBLOCK changes nothing. */
static int read_file(hf_ctx *c, const char *path, char **out, size_t *len)
{
    int fd = open(path, O_RDONLY | O_NONBLOCK | O_NOCTTY | O_CLOEXEC);
    struct stat st;
    char *buf = NULL;
    size_t n = 0, cap = 0;

    if (fd < 0)
        return fail(c, "cannot open the hostfile: %s", strerror(errno));
    if (fstat(fd, &st) != 0) {
        int e = errno;
        close(fd);
        return fail(c, "cannot stat the hostfile: %s", strerror(e));
    }
    if (!S_ISREG(st.st_mode)) {
        close(fd);
        return fail(c, "not a regular file (it is %s)", file_kind(st.st_mode));
    }
    for (;;) {
        ssize_t got;
        if (cap - n < 4097) {
            char *nb;
            cap = cap ? cap * 2 : 8192;
            nb = realloc(buf, cap);
            if (nb == NULL) {
                free(buf);
                close(fd);
                return nomem(c);
            }
            buf = nb;
        }
        got = read(fd, buf + n, cap - n - 1);
        if (got < 0 && errno == EINTR)
            continue;
        if (got < 0) {
            int e = errno;
            free(buf);
            close(fd);
            return fail(c, "cannot read the hostfile: %s", strerror(e));
        }
        n += (size_t)got;
        if ((long)n > MAX_FILE_BYTES) {
            free(buf);
            close(fd);
            return fail(c, "larger than %ld bytes: not a hostfile?",
                        MAX_FILE_BYTES);
        }
        if (got == 0)
            break;
    }
    close(fd);
    buf[n] = '\0';
    *out = buf;
    *len = n;
    return WEFT_OK;
}

int weft__hostfile_read(const char *path, char **text, char *errmsg,
                        size_t errlen)
{
    hf_ctx c = {path != NULL ? path : "(null)", errmsg, errlen};
    size_t len = 0;
    int rc;

    if (errmsg != NULL && errlen > 0)
        errmsg[0] = '\0';
    if (text == NULL)
        return WEFT_EINVAL;
    *text = NULL;
    if (path == NULL || *path == '\0')
        return fail(&c, "no hostfile named");
    if ((rc = read_file(&c, path, text, &len)) != 0)
        return rc;
    if (strlen(*text) != len) {
        free(*text);
        *text = NULL;
        return fail(&c, "contains a NUL byte: not a text hostfile");
    }
    return WEFT_OK;
}

/* ---- weft's JSON object ---- */

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
            return fail(c, "%s%smissing field \"%s\" (a string)", path,
                        *path ? ": " : "", key);
        return WEFT_OK;
    }
    if (!json_is_string(v))
        return fail(c, "%s%s%s: expected a string, got %s", path, sep, key,
                    jtype(v));
    if (json_string_length(v) >= dstlen || json_string_length(v) == 0)
        return fail(c,
                    "%s%s%s: expected a non-empty string shorter than %zu "
                    "bytes",
                    path, sep, key, dstlen);
    if (strlen(json_string_value(v)) != json_string_length(v))
        return fail(c, "%s%s%s: expected a string without NUL characters", path,
                    sep, key);
    memcpy(dst, json_string_value(v), json_string_length(v) + 1);
    return WEFT_OK;
}

static int json_port(hf_ctx *c, json_t *v, const char *path, int *out)
{
    if (!json_is_integer(v))
        return fail(c, "%s: expected a port number in [1, 65535], got %s", path,
                    jtype(v));
    if (json_integer_value(v) < 1 || json_integer_value(v) > 65535)
        return fail(c,
                    "%s: expected a port number in [1, 65535], got "
                    "%" JSON_INTEGER_FORMAT,
                    path, json_integer_value(v));
    *out = (int)json_integer_value(v);
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
        return fail(c, "missing field \"hosts\" (a non-empty array of hosts, "
                       "each {\"name\": ..., \"ranks\": ...})");
    if (!json_is_array(hosts) || json_array_size(hosts) == 0)
        return fail(c, "hosts: expected a non-empty array of hosts, each "
                       "{\"name\": ..., \"ranks\": ...}");
    if (json_array_size(hosts) > WEFT__MAX_RANKS)
        return fail(c, "hosts: more than %d hosts", WEFT__MAX_RANKS);
    h->hosts = calloc(json_array_size(hosts), sizeof *h->hosts);
    if (h->hosts == NULL)
        return nomem(c);
    for (size_t i = 0; i < json_array_size(hosts); i++) {
        json_t *jh = json_array_get(hosts, i);
        weft__host *host = &h->hosts[i];
        json_t *jr, *jports;
        int other;

        h->nhosts = (int)i + 1; /* so that free sees the ports below */
        snprintf(path, sizeof path, "hosts[%zu]", i);
        if (!json_is_object(jh))
            return fail(c,
                        "%s: expected an object with \"name\" and "
                        "\"ranks\"",
                        path);
        if ((rc = json_str(c, jh, "name", host->name, sizeof host->name, 1,
                           path)) != 0)
            return rc;
        other = find_host(h, (int)i, host->name);
        if (other >= 0)
            return fail(c,
                        "%s.name: host \"%s\" is already hosts[%d]; list "
                        "each host once",
                        path, host->name, other);
        strcpy(host->ssh, host->name);
        if ((rc = json_str(c, jh, "ssh", host->ssh, sizeof host->ssh, 0,
                           path)) != 0)
            return rc;
        jr = json_object_get(jh, "ranks");
        if (jr == NULL)
            host->nranks = 1;
        else if (!json_is_integer(jr))
            return fail(c, "%s.ranks: expected an integer in [1, %d], got %s",
                        path, WEFT__MAX_RANKS, jtype(jr));
        else if (json_integer_value(jr) < 1 ||
                 json_integer_value(jr) > WEFT__MAX_RANKS)
            return fail(c,
                        "%s.ranks: expected an integer in [1, %d], got "
                        "%" JSON_INTEGER_FORMAT,
                        path, WEFT__MAX_RANKS, json_integer_value(jr));
        else
            host->nranks = (int)json_integer_value(jr);
        total += host->nranks;
        if (total > WEFT__MAX_RANKS)
            return fail(c, "hosts: more than %d ranks in all", WEFT__MAX_RANKS);
        host->ports = calloc((size_t)host->nranks, sizeof *host->ports);
        if (host->ports == NULL)
            return nomem(c);
        jports = json_object_get(jh, "ports");
        if (jports != NULL) {
            if (!json_is_array(jports) ||
                json_array_size(jports) != (size_t)host->nranks)
                return fail(c,
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
                        return fail(c,
                                    "%s: port %d is already %s.ports[%d]; "
                                    "each rank of a host needs a port of "
                                    "its own",
                                    p2, host->ports[k], path, j);
            }
        } else {
            for (int k = 0; k < host->nranks; k++) {
                if (port + k > 65535)
                    return fail(c,
                                "%s: port %d + %d local ranks is past "
                                "65535; lower \"port\" or give \"ports\"",
                                path, port, host->nranks);
                host->ports[k] = port + k;
            }
        }
    }
    h->nranks = total;
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
        return fail(c, "links: expected an array of links, each a pair of "
                       "ends [{\"host\": ..., \"addr\": ...}, {...}]");
    if (json_array_size(links) == 0)
        return WEFT_OK;
    if (json_array_size(links) > (1u << 20))
        return fail(c, "links: more than %u links", 1u << 20);
    h->links = calloc(json_array_size(links), sizeof *h->links);
    if (h->links == NULL)
        return nomem(c);
    h->nlinks = (int)json_array_size(links);
    for (int i = 0; i < h->nlinks; i++) {
        json_t *l = json_array_get(links, (size_t)i);
        if (!json_is_array(l) || json_array_size(l) != 2)
            return fail(c,
                        "links[%d]: expected an array of two ends, each "
                        "{\"host\": ..., \"addr\": ...}",
                        i);
        for (int e = 0; e < 2; e++) {
            json_t *end = json_array_get(l, (size_t)e);
            weft__link_end *le = &h->links[i].end[e];
            char hname[128];

            snprintf(path, sizeof path, "links[%d][%d]", i, e);
            if (!json_is_object(end))
                return fail(c,
                            "%s: expected an object with \"host\" and "
                            "\"addr\"",
                            path);
            if ((rc = json_str(c, end, "host", hname, sizeof hname, 1, path)) !=
                    0 ||
                (rc = json_str(c, end, "addr", le->addr, sizeof le->addr, 1,
                               path)) != 0 ||
                (rc = json_str(c, end, "device", le->device, sizeof le->device,
                               0, path)) != 0)
                return rc;
            le->host = find_host(h, h->nhosts, hname);
            if (le->host < 0)
                return fail(c,
                            "%s.host: unknown host \"%s\" (expected the "
                            "name of one of \"hosts\")",
                            path, hname);
        }
        if (h->links[i].end[0].host == h->links[i].end[1].host)
            return fail(c,
                        "links[%d]: both ends are on host \"%s\"; a link "
                        "joins two different hosts",
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
        return nomem(c);
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
            return fail(c,
                        "links[%d][%d].addr: address \"%s\" is on host "
                        "\"%s\" here but on host \"%s\" in links[%d][%d]; "
                        "expected each address to belong to one host",
                        second / 2, second % 2, b->addr, h->hosts[b->host].name,
                        h->hosts[a->host].name, first / 2, first % 2);
        if (first / 2 == second / 2)
            return fail(c, "links[%d]: both ends have address \"%s\"",
                        first / 2, a->addr);
        return fail(c,
                    "links[%d][%d].addr: address \"%s\" of host \"%s\" "
                    "already ends links[%d]; expected each link (one "
                    "cable) to have an address of its own at each end",
                    second / 2, second % 2, b->addr, h->hosts[b->host].name,
                    first / 2);
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
    return fail(c, "%s: unknown value \"%s\": expected %s", field, v, say);
}

static int load_object(hf_ctx *c, json_t *root, weft__hostfile_out *h)
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

/* ---- MLX's ring hostfile (see the comment at the top) ---- */

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

static int load_mlx(hf_ctx *c, json_t *root, weft__hostfile_out *h)
{
    size_t n = json_array_size(root), K;
    char(*ips)[64] = NULL; /* n * K: the ip of [r][k] */
    int *ports = NULL;
    int rc = WEFT_OK;

    h->format = WEFT__HOSTFILE_MLX;
    if (n == 0)
        return fail(c, "expected a non-empty list with one entry per rank, "
                       "each a list of \"ip:port\" strings (MLX's ring "
                       "hostfile)");
    if (n > WEFT__MAX_RANKS)
        return fail(c, "more than %d ranks", WEFT__MAX_RANKS);
    if (json_is_object(json_array_get(root, 0)))
        return fail(c, "[0]: expected a list of \"ip:port\" strings (MLX's "
                       "ring hostfile, MLX_HOSTFILE: one list per rank), got "
                       "an object; mlx.launch's {\"ssh\": ..., \"ips\": ...} "
                       "form is not read: write weft's object form");
    if (!json_is_array(json_array_get(root, 0)) ||
        json_array_size(json_array_get(root, 0)) == 0)
        return fail(c, "[0]: expected a non-empty list of \"ip:port\" "
                       "strings (MLX's ring hostfile: one list per rank)");
    K = json_array_size(json_array_get(root, 0));
    if (K > WEFT__MAX_WIRES)
        return fail(c, "[0]: more than %d addresses per rank", WEFT__MAX_WIRES);
    ips = calloc(n * K, sizeof *ips);
    ports = calloc(n * K, sizeof *ports);
    h->hosts = calloc(n, sizeof *h->hosts);
    if (ips == NULL || ports == NULL || h->hosts == NULL) {
        rc = nomem(c);
        goto out;
    }
    for (size_t r = 0; r < n; r++) {
        json_t *jr = json_array_get(root, r);
        weft__host *host = &h->hosts[r];

        h->nhosts = (int)r + 1;
        if (!json_is_array(jr) || json_array_size(jr) != K) {
            rc = fail(c,
                      "[%zu]: expected a list of %zu \"ip:port\" strings "
                      "like [0] (every rank lists as many addresses, one "
                      "per connection to each neighbour)",
                      r, K);
            goto out;
        }
        for (size_t k = 0; k < K; k++) {
            json_t *s = json_array_get(jr, k);
            size_t i = r * K + k;
            if (!json_is_string(s) ||
                strlen(json_string_value(s)) != json_string_length(s) ||
                split_ip_port(json_string_value(s), ips[i], sizeof ips[i],
                              &ports[i]) != 0) {
                rc = fail(c,
                          "[%zu][%zu]: expected an \"ip:port\" string "
                          "with a port in [1, 65535] (e.g. "
                          "\"10.0.0.1:5000\"), got %s%s%s",
                          r, k, json_is_string(s) ? "\"" : "",
                          json_is_string(s) ? json_string_value(s)
                                            : "something else",
                          json_is_string(s) ? "\"" : "");
                goto out;
            }
            for (size_t j = 0; j < i; j++)
                if (ports[j] == ports[i] && strcmp(ips[j], ips[i]) == 0) {
                    rc = fail(c,
                              "[%zu][%zu]: address \"%s\" is already "
                              "[%zu][%zu]; expected each rank's addresses "
                              "to be its own (two ranks cannot listen at "
                              "one ip:port)",
                              r, k, json_string_value(s), j / K, j % K);
                    goto out;
                }
        }
        snprintf(host->name, sizeof host->name, "rank%zu", r);
        snprintf(host->ssh, sizeof host->ssh, "%s", ips[r * K]);
        host->nranks = 1;
        host->ports = malloc(sizeof *host->ports);
        if (host->ports == NULL) {
            rc = nomem(c);
            goto out;
        }
        host->ports[0] = ports[r * K];
    }
    h->nranks = (int)n;
    if (n >= 2) {
        size_t pairs = n == 2 ? 1 : n;
        h->links = calloc(pairs * K, sizeof *h->links);
        if (h->links == NULL) {
            rc = nomem(c);
            goto out;
        }
        h->nlinks = (int)(pairs * K);
        for (size_t r = 0; r < pairs; r++)
            for (size_t k = 0; k < K; k++) {
                weft__link *l = &h->links[r * K + k];
                size_t r1 = (r + 1) % n;
                l->end[0].host = (int)r;
                snprintf(l->end[0].addr, sizeof l->end[0].addr, "%s",
                         ips[r * K + k]);
                l->end[1].host = (int)r1;
                snprintf(l->end[1].addr, sizeof l->end[1].addr, "%s",
                         ips[r1 * K + k]);
            }
    }
out:
    free(ips);
    free(ports);
    return rc;
}

/* ---- mpirun's text form ---- */

static int name_char(char ch)
{
    return (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') ||
           (ch >= '0' && ch <= '9') || ch == '.' || ch == '-' || ch == '_' ||
           ch == ':';
}

/* Parses "key=N", N in [lo, hi]. Returns 0 where tok is not "key=...";
 * else 1, with *ok saying whether N parsed (then in *out). */
static int kv_int(const char *tok, size_t len, const char *key, long lo,
                  long hi, long *out, int *ok)
{
    size_t kl = strlen(key);
    long v = 0;

    if (len < kl + 1 || strncmp(tok, key, kl) != 0 || tok[kl] != '=')
        return 0;
    *ok = 0;
    if (len == kl + 1)
        return 1;
    for (size_t i = kl + 1; i < len; i++) {
        if (tok[i] < '0' || tok[i] > '9' || v > hi)
            return 1;
        v = v * 10 + (tok[i] - '0');
    }
    if (v < lo || v > hi)
        return 1;
    *out = v;
    *ok = 1;
    return 1;
}

static int load_text(hf_ctx *c, char *buf, weft__hostfile_out *h)
{
    int cap = 0, total = 0, lineno = 0;
    int *lines = NULL; /* the line of each host */
    char *p = buf;
    int rc = WEFT_OK;

    h->format = WEFT__HOSTFILE_MPIRUN;
    while (*p != '\0') {
        char *eol = strchr(p, '\n');
        char *line = p, *q, *name;
        size_t namelen;
        long slots = 1, maxs = 0;
        int have_max = 0;

        if (eol != NULL)
            *eol = '\0';
        p = eol != NULL ? eol + 1 : p + strlen(p);
        lineno++;
        q = strchr(line, '#');
        if (q != NULL)
            *q = '\0';
        q = line;
        while (*q == ' ' || *q == '\t' || *q == '\r')
            q++;
        if (*q == '\0')
            continue;
        name = q;
        while (*q != '\0' && *q != ' ' && *q != '\t' && *q != '\r')
            q++;
        namelen = (size_t)(q - name);
        for (size_t i = 0; i < namelen; i++)
            if (!name_char(name[i])) {
                rc = fail(c,
                          "line %d, column %d: unexpected character '%c' "
                          "in a host name: expected \"host slots=N\" (host "
                          "of letters, digits, '.', '-', '_', ':')",
                          lineno, (int)(name - line + (long)i) + 1, name[i]);
                goto out;
            }
        if (namelen >= sizeof h->links[0].end[0].addr) {
            rc = fail(c,
                      "line %d, column %d: host name longer than %zu "
                      "characters",
                      lineno, (int)(name - line) + 1,
                      sizeof h->links[0].end[0].addr - 1);
            goto out;
        }
        while (*q != '\0') {
            char *tok;
            size_t tl;
            long v;
            int ok;

            while (*q == ' ' || *q == '\t' || *q == '\r')
                q++;
            if (*q == '\0')
                break;
            tok = q;
            while (*q != '\0' && *q != ' ' && *q != '\t' && *q != '\r')
                q++;
            tl = (size_t)(q - tok);
            if (kv_int(tok, tl, "slots", 1, WEFT__MAX_RANKS, &v, &ok)) {
                if (!ok) {
                    rc = fail(c,
                              "line %d, column %d: bad \"%.*s\": expected "
                              "slots=N with N an integer in [1, %d]",
                              lineno, (int)(tok - line) + 1, (int)tl, tok,
                              WEFT__MAX_RANKS);
                    goto out;
                }
                slots = v;
            } else if (kv_int(tok, tl, "max_slots", 1, WEFT__MAX_RANKS, &v,
                              &ok)) {
                if (!ok) {
                    rc = fail(c,
                              "line %d, column %d: bad \"%.*s\": expected "
                              "max_slots=N with N an integer in [1, %d]",
                              lineno, (int)(tok - line) + 1, (int)tl, tok,
                              WEFT__MAX_RANKS);
                    goto out;
                }
                have_max = 1;
                maxs = v;
            } else {
                rc = fail(c,
                          "line %d, column %d: unexpected \"%.*s\": "
                          "expected \"host slots=N\" (or \"host\" alone for "
                          "one slot)",
                          lineno, (int)(tok - line) + 1, (int)tl, tok);
                goto out;
            }
        }
        if (have_max && maxs < slots) {
            rc = fail(c, "line %d: max_slots=%ld is less than slots=%ld",
                      lineno, maxs, slots);
            goto out;
        }
        name[namelen] = '\0';
        {
            int other = find_host(h, h->nhosts, name);
            if (other >= 0) {
                rc = fail(c,
                          "line %d: host \"%s\" is already on line %d; "
                          "expected each host once, with all its slots",
                          lineno, name, lines[other]);
                goto out;
            }
        }
        if (h->nhosts == cap) {
            int nc = cap ? cap * 2 : 16;
            weft__host *nh;
            int *nl;
            if (nc > WEFT__MAX_RANKS)
                nc = WEFT__MAX_RANKS;
            if (h->nhosts == WEFT__MAX_RANKS) {
                rc = fail(c, "line %d: more than %d hosts", lineno,
                          WEFT__MAX_RANKS);
                goto out;
            }
            nh = realloc(h->hosts, (size_t)nc * sizeof *nh);
            if (nh == NULL) {
                rc = nomem(c);
                goto out;
            }
            h->hosts = nh;
            nl = realloc(lines, (size_t)nc * sizeof *nl);
            if (nl == NULL) {
                rc = nomem(c);
                goto out;
            }
            lines = nl;
            cap = nc;
        }
        {
            weft__host *host = &h->hosts[h->nhosts];
            memset(host, 0, sizeof *host);
            h->nhosts++;
            lines[h->nhosts - 1] = lineno;
            snprintf(host->name, sizeof host->name, "%s", name);
            snprintf(host->ssh, sizeof host->ssh, "%s", name);
            host->nranks = (int)slots;
            total += host->nranks;
            if (total > WEFT__MAX_RANKS) {
                rc = fail(c, "line %d: more than %d ranks in all", lineno,
                          WEFT__MAX_RANKS);
                goto out;
            }
            host->ports = calloc((size_t)slots, sizeof *host->ports);
            if (host->ports == NULL) {
                rc = nomem(c);
                goto out;
            }
            for (int k = 0; k < host->nranks; k++) {
                if (WEFT__DEFAULT_PORT + k > 65535) {
                    rc = fail(c,
                              "line %d: slots=%ld takes ports past 65535 "
                              "(from %d)",
                              lineno, slots, WEFT__DEFAULT_PORT);
                    goto out;
                }
                host->ports[k] = WEFT__DEFAULT_PORT + k;
            }
        }
    }
    if (h->nhosts == 0) {
        rc = fail(c, "no hosts: expected lines \"host slots=N\" (mpirun's "
                     "form), a JSON object with \"hosts\", or MLX's JSON "
                     "list");
        goto out;
    }
    h->nranks = total;
    if (h->nhosts >= 2) {
        size_t n = (size_t)h->nhosts, nl = n * (n - 1) / 2, l = 0;
        if (nl > (1u << 20)) {
            rc =
                fail(c, "%zu hosts: too many for a link between every pair", n);
            goto out;
        }
        h->links = calloc(nl, sizeof *h->links);
        if (h->links == NULL) {
            rc = nomem(c);
            goto out;
        }
        h->nlinks = (int)nl;
        for (size_t i = 0; i < n; i++)
            for (size_t j = i + 1; j < n; j++, l++) {
                h->links[l].end[0].host = (int)i;
                h->links[l].end[1].host = (int)j;
                copy_str(h->links[l].end[0].addr,
                         sizeof h->links[l].end[0].addr, h->hosts[i].name);
                copy_str(h->links[l].end[1].addr,
                         sizeof h->links[l].end[1].addr, h->hosts[j].name);
            }
    }
out:
    free(lines);
    return rc;
}

/* ---- the ring and the mesh ---- */

static int mesh_missing(const weft__hostfile_out *h, const adj_t *a, int *pa,
                        int *pb)
{
    for (int i = 0; i < h->nhosts; i++)
        for (int j = i + 1; j < h->nhosts; j++)
            if (!adj_get(a, i, j)) {
                *pa = i;
                *pb = j;
                return 1;
            }
    return 0;
}

int weft__hostfile_check_mesh(const weft__hostfile_out *h, const char *file,
                              char *errmsg, size_t errlen)
{
    hf_ctx c = {file != NULL ? file : "hostfile", errmsg, errlen};
    adj_t a;
    int i, j, missing;

    if (h == NULL)
        return WEFT_OK;
    if (h->nranks > WEFT__MESH_MAX_RANKS)
        return fail(&c,
                    "topology \"mesh\" runs at most %d ranks (one "
                    "exchange lane per peer), but the job has %d: use "
                    "\"ring\" or \"auto\"",
                    WEFT__MESH_MAX_RANKS, h->nranks);
    if (h->nhosts < 2)
        return WEFT_OK;
    if (adj_make(h, &a) != 0)
        return nomem(&c);
    missing = mesh_missing(h, &a, &i, &j);
    free(a.bits);
    if (missing)
        return fail(&c,
                    "topology \"mesh\" needs a link between every pair "
                    "of hosts, but \"%s\" and \"%s\" (hosts[%d] and "
                    "hosts[%d]) share none",
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
    adj_t a;
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
    if (adj_make(h, &a) != 0) {
        snprintf(why, whylen, "auto: out of memory checking the links");
        return 0;
    }
    missing = mesh_missing(h, &a, &i, &j);
    free(a.bits);
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

static int form_ring(hf_ctx *c, weft__hostfile_out *h)
{
    int n = h->nhosts, rc = WEFT_OK, gap = -1;
    adj_t a = {0, NULL};
    char msg[1024] = "";

    h->host_order = malloc((size_t)n * sizeof *h->host_order);
    if (h->host_order == NULL)
        return nomem(c);
    for (int i = 0; i < n; i++)
        h->host_order[i] = i;
    if (strcmp(h->topology, "mesh") == 0 &&
        (rc = weft__hostfile_check_mesh(h, c->file, c->errmsg, c->errlen)) !=
            0)
        return rc;
    if (n == 1)
        return WEFT_OK;
    if (adj_make(h, &a) != 0)
        return nomem(c);
    if (n == 2) {
        if (!adj_get(&a, 0, 1))
            rc = fail(c,
                      "hosts \"%s\" and \"%s\" share no link: expected at "
                      "least one entry in \"links\" joining them",
                      h->hosts[0].name, h->hosts[1].name);
        goto out;
    }
    /* In the order listed? */
    for (int i = 0; i < n && gap < 0; i++)
        if (!adj_get(&a, i, (i + 1) % n))
            gap = i;
    if (gap < 0)
        goto out;
    /* Hosts linked to fewer than two others can be in no ring. */
    {
        int bad = 0;
        for (int i = 0; i < n; i++) {
            int deg = 0, nb = -1;
            for (int j = 0; j < n; j++)
                if (j != i && adj_get(&a, i, j)) {
                    deg++;
                    nb = j;
                }
            if (deg >= 2)
                continue;
            app(msg, sizeof msg, "%s\"%s\" (%s%s%s)", bad ? ", " : "",
                h->hosts[i].name, deg ? "linked only to \"" : "no links",
                deg ? h->hosts[nb].name : "", deg ? "\"" : "");
            bad++;
        }
        if (bad) {
            rc = fail(c,
                      "links: no ring passes through every host: %s "
                      "cannot be placed (each host needs links to two "
                      "different hosts)",
                      msg);
            goto out;
        }
    }
    if (n > WEFT__HOSTFILE_MAX_SEARCH) {
        rc = fail(c,
                  "links: the %d hosts, in the order listed, do not form "
                  "a ring (\"%s\" and \"%s\" share no link), and weft "
                  "searches for a ring among at most %d hosts: list the "
                  "hosts in ring order",
                  n, h->hosts[gap].name, h->hosts[(gap + 1) % n].name,
                  WEFT__HOSTFILE_MAX_SEARCH);
        goto out;
    }
    {
        ring_search s;
        int found;

        memset(&s, 0, sizeof s);
        s.a = &a;
        s.n = n;
        s.dead = malloc(((size_t)1 << n) * sizeof *s.dead);
        if (s.dead == NULL) {
            rc = nomem(c);
            goto out;
        }
        found = ring_from(&s, 0);
        if (found) {
            memcpy(h->host_order, s.path, (size_t)n * sizeof *s.path);
            h->ring_reordered = 1;
            free(s.dead);
            goto out;
        }
        /* No ring. For the message: the longest cycle, through the first
         * host if any passes through it, else through any host. */
        for (int st = 1; s.bestlen == 0 && st < n; st++)
            ring_from(&s, st);
        free(s.dead);
        if (s.bestlen == 0) {
            rc = fail(c, "links: no ring passes through every host, nor any "
                         "cycle through three or more hosts");
            goto out;
        }
        {
            char cyc[512] = "", rest[512] = "";
            uint32_t in = 0;
            for (int i = 0; i < s.bestlen; i++) {
                app(cyc, sizeof cyc, "\"%s\" -> ", h->hosts[s.best[i]].name);
                in |= 1u << s.best[i];
            }
            app(cyc, sizeof cyc, "\"%s\"", h->hosts[s.best[0]].name);
            for (int i = 0, k = 0; i < n; i++)
                if (!((in >> i) & 1))
                    app(rest, sizeof rest, "%s\"%s\"", k++ ? ", " : "",
                        h->hosts[i].name);
            rc = fail(c,
                      "links: no ring passes through every host: the "
                      "longest cycle is %s, and %s cannot be placed on it; "
                      "expected links that join all hosts in one cycle",
                      cyc, rest);
        }
    }
out:
    free(a.bits);
    return rc;
}

/* Numbers ranks along the ring: first_rank and rank_host. */
static int number_ranks(hf_ctx *c, weft__hostfile_out *h)
{
    int next = 0;

    h->rank_host = calloc((size_t)h->nranks, sizeof *h->rank_host);
    if (h->rank_host == NULL)
        return nomem(c);
    for (int i = 0; i < h->nhosts; i++) {
        int hi = h->host_order[i];
        h->hosts[hi].first_rank = next;
        for (int k = 0; k < h->hosts[hi].nranks; k++)
            h->rank_host[next + k] = hi;
        next += h->hosts[hi].nranks;
    }
    return WEFT_OK;
}

/* ---- loading ---- */

static int load_buffer(hf_ctx *cp, char *buf, size_t len, int nranks_expected,
                       weft__hostfile_out *out);

int weft__hostfile_load(const char *path, int nranks_expected,
                        weft__hostfile_out *out, char *errmsg, size_t errlen)
{
    hf_ctx c = {path != NULL ? path : "(null)", errmsg, errlen};
    char *buf = NULL;
    size_t len = 0;
    int rc;

    if (errmsg != NULL && errlen > 0)
        errmsg[0] = '\0';
    if (out == NULL)
        return WEFT_EINVAL;
    memset(out, 0, sizeof *out);
    if (path == NULL || *path == '\0')
        return fail(&c, "no hostfile named");
    if ((rc = read_file(&c, path, &buf, &len)) != 0)
        return rc;
    return load_buffer(&c, buf, len, nranks_expected, out);
}

int weft__hostfile_load_text(const char *name, const char *text,
                             int nranks_expected, weft__hostfile_out *out,
                             char *errmsg, size_t errlen)
{
    hf_ctx c = {name, errmsg, errlen};
    char *buf;

    if (errmsg != NULL && errlen > 0)
        errmsg[0] = '\0';
    if (out == NULL || text == NULL)
        return WEFT_EINVAL;
    memset(out, 0, sizeof *out);
    if ((buf = strdup(text)) == NULL)
        return WEFT_ENOMEM;
    return load_buffer(&c, buf, strlen(buf), nranks_expected, out);
}

/* Parses and validates buf (len bytes, NUL-terminated, freed here). */
static int load_buffer(hf_ctx *cp, char *buf, size_t len, int nranks_expected,
                       weft__hostfile_out *out)
{
    hf_ctx c = *cp;
    weft__hostfile_out h;
    char *p;
    size_t bom = 0;
    int rc;

    memset(&h, 0, sizeof h);
    if (len >= 3 && (unsigned char)buf[0] == 0xEF &&
        (unsigned char)buf[1] == 0xBB && (unsigned char)buf[2] == 0xBF)
        bom = 3; /* a UTF-8 byte-order mark: skipped */
    p = buf + bom;
    while (*p == ' ' || *p == '\t' || *p == '\r' || *p == '\n')
        p++;
    if (strlen(buf) != len) {
        rc = fail(&c, "contains a NUL byte: not a text hostfile");
    } else if (*p == '{' || *p == '[') {
        json_error_t jerr;
        json_t *root =
            json_loadb(buf + bom, len - bom, JSON_REJECT_DUPLICATES, &jerr);
        if (root == NULL)
            rc = fail(&c, "line %d, column %d: %s (reading JSON: %s)",
                      jerr.line, jerr.column > 0 ? jerr.column : 1, jerr.text,
                      *p == '{' ? "weft's hostfile object"
                                : "MLX's list of \"ip:port\" lists");
        else if (json_is_object(root))
            rc = load_object(&c, root, &h);
        else
            rc = load_mlx(&c, root, &h);
        json_decref(root);
    } else if (*p == '\0') {
        rc = fail(&c, "empty: expected a JSON object with \"hosts\", MLX's "
                      "JSON list or lines \"host slots=N\"");
    } else {
        rc = load_text(&c, buf + bom, &h);
    }
    free(buf);
    if (rc == 0 && nranks_expected >= 0 && h.nranks != nranks_expected)
        rc = fail(&c,
                  "the hosts hold %d rank%s but the job has %d (the job "
                  "size: weftrun -n, WEFT_SIZE or the launcher's); make "
                  "them agree",
                  h.nranks, h.nranks == 1 ? "" : "s", nranks_expected);
    if (rc == 0)
        rc = form_ring(&c, &h);
    if (rc == 0)
        rc = number_ranks(&c, &h);
    if (rc != 0) {
        weft__hostfile_free(&h);
        return rc;
    }
    *out = h;
    return WEFT_OK;
}

/* ---- describing ---- */

static void put_ranks(FILE *f, const weft__host *hs)
{
    if (hs->nranks == 1)
        fprintf(f, "rank %d", hs->first_rank);
    else
        fprintf(f, "ranks %d-%d", hs->first_rank,
                hs->first_rank + hs->nranks - 1);
}

int weft__hostfile_describe(const weft__hostfile_out *h, int wires, FILE *out)
{
    static const char *const formats[] = {"?", "weft JSON", "MLX ring",
                                          "mpirun text"};
    const char *topo = h != NULL && h->topology[0] ? h->topology : "auto";
    adj_t a = {0, NULL};
    int mi = -1, mj = -1, full, mesh;
    char why[160];

    if (h == NULL || out == NULL || wires < 1 || h->nhosts < 1 ||
        h->host_order == NULL)
        return WEFT_EINVAL;
    if (adj_make(h, &a) != 0)
        return WEFT_ENOMEM;
    full = !mesh_missing(h, &a, &mi, &mj);
    free(a.bits);

    fprintf(out,
            "%s hostfile: %d host%s, %d rank%s, %d link%s; transport "
            "%s, topology %s%s\n",
            formats[h->format >= 1 && h->format <= 3 ? h->format : 0],
            h->nhosts, h->nhosts == 1 ? "" : "s", h->nranks,
            h->nranks == 1 ? "" : "s", h->nlinks, h->nlinks == 1 ? "" : "s",
            h->transport[0] ? h->transport : "tcp", topo,
            h->topology[0] ? "" : " (default)");

    mesh = weft__hostfile_mesh(h, NULL, why, sizeof why);
    fprintf(out, "topology in effect: %s (%s)\n", mesh ? "mesh" : "ring",
            why);
    if (h->nhosts == 1) {
        fprintf(out, "ring: one host, \"%s\"; its ranks talk over loopback\n",
                h->hosts[0].name);
    } else {
        if (mesh)
            fprintf(out,
                    "mesh: every pair of the %d hosts shares a link; "
                    "ranks exchange directly with every peer, and number "
                    "along this ring:\n",
                    h->nhosts);
        else if (full && strcmp(topo, "ring") != 0 &&
                 h->nranks <= WEFT__MESH_MAX_RANKS)
            fprintf(out, "a full mesh: small operations exchange directly, "
                         "large ones go around the ring:\n");
        else if (!full)
            fprintf(out,
                    "not a full mesh (\"%s\" and \"%s\" share no "
                    "link): ranks on hosts without a link reach each "
                    "other through the ring:\n",
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

    if (h->nlinks == 0) {
        fprintf(out, "links: none\n");
    } else {
        fprintf(out,
                "links (%d wire%s on each; per pair of ranks on its two "
                "hosts, the higher rank connects to the lower rank's "
                "address and port):\n",
                wires, wires == 1 ? "" : "s");
    }
    for (int l = 0; l < h->nlinks; l++) {
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
            fprintf(out, "    wire %d of link %d: %s %s <-> %s %s", w, l,
                    h0->name, e0->addr, h1->name, e1->addr);
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
                    fprintf(out, "%s rank %d -> rank %d at %s:%d",
                            shown ? "," : "", hh->first_rank + x,
                            hl->first_rank + y, el->addr, hl->ports[y]);
            fprintf(out, "%s\n", npairs > shown ? ", ..." : "");
        }
    }
    if (fflush(out) != 0 || ferror(out))
        return WEFT_EINVAL;
    return WEFT_OK;
}
