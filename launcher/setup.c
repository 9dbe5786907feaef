/*
 * What weftrun settles before any rank starts: the hosts of the job and
 * which rank runs on which (from --hostfile, or N ranks on this host with
 * a hostfile written for them), --check's description of a hostfile, the
 * ports (the ranks' and torch's MASTER_PORT), the job token, and the
 * open-file limit.
 *
 * Everything here may fail, and all of it runs before the first rank is
 * spawned, so that a job that cannot run is refused whole: no rank is ever
 * left running because a later one could not be set up.
 */
#define _GNU_SOURCE

#include "weftrun.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/random.h>
#include <sys/resource.h>
#include <sys/socket.h>

#include <jansson.h>

int setup_hostfile(struct opts *o, weft__hostfile_out *hf, char **text)
{
    char err[1024];
    int rc;

    /* Read once: the text checked here is the text the ranks on other
     * hosts get in WEFT_HOSTFILE_TEXT. */
    rc = weft__hostfile_read(o->hostfile, text, err, sizeof err);
    if (rc == 0)
        rc = weft__hostfile_load_text(o->hostfile, *text, -1, hf, err,
                                      sizeof err);
    if (rc != 0) {
        msg("%s", err);
        goto fail;
    }
    if (o->check)
        return 0; /* --check describes the file, whatever -n says */
    if (o->nranks != 0 && o->nranks != hf->nranks) {
        msg("-n %d disagrees with %s, whose hosts hold %d ranks", o->nranks,
            o->hostfile, hf->nranks);
        weft__hostfile_free(hf);
        goto fail;
    }
    o->nranks = hf->nranks;
    return 0;

fail:
    free(*text);
    *text = NULL;
    return EXIT_USAGE;
}

int setup_check(const struct opts *o, weft__hostfile_out *hf)
{
    /* Describe the job as the options would run it. */
    if (o->transport != NULL)
        snprintf(hf->transport, sizeof hf->transport, "%s", o->transport);
    if (o->topology != NULL) {
        char why[512];
        if (strcmp(o->topology, "mesh") == 0 &&
            weft__hostfile_check_mesh(hf, o->hostfile, why, sizeof why) != 0) {
            msg("--topology mesh: %s", why);
            return EXIT_USAGE;
        }
        snprintf(hf->topology, sizeof hf->topology, "%s", o->topology);
    }
    return weft__hostfile_describe(hf, o->wires > 0 ? o->wires : 1, stdout) ==
                       0 &&
                   fflush(stdout) == 0
               ? 0
               : 1;
}

/* Each rank costs weftrun two descriptors (its stdout and stderr pipes).
 * Raises the soft limit when N needs more; the ranks inherit the raised
 * limit, which only happens for jobs of several hundred ranks. */
int setup_fd_limit(int nranks)
{
    struct rlimit rl;
    rlim_t need = (rlim_t)nranks * 2 + 64;

    if (getrlimit(RLIMIT_NOFILE, &rl) != 0)
        return 0; /* let the spawns fail if it really is too low */
    if (rl.rlim_cur == RLIM_INFINITY || rl.rlim_cur >= need)
        return 0;
    if (rl.rlim_max != RLIM_INFINITY && rl.rlim_max < need) {
        msg("%d ranks need about %lu open files, but the limit is %lu "
            "(ulimit -n)",
            nranks, (unsigned long)need, (unsigned long)rl.rlim_max);
        return -1;
    }
    rl.rlim_cur = need;
    if (setrlimit(RLIMIT_NOFILE, &rl) != 0) {
        msg("cannot raise the open-file limit to %lu: %s", (unsigned long)need,
            strerror(errno));
        return -1;
    }
    return 0;
}

/* 128 random bits as 32 lowercase hex digits and a NUL. */
int setup_token(char out[33])
{
    static const char hex[] = "0123456789abcdef";
    unsigned char bytes[16];
    size_t got = 0;

    while (got < sizeof(bytes)) {
        ssize_t n = getrandom(bytes + got, sizeof(bytes) - got, 0);
        if (n < 0) {
            if (errno == EINTR)
                continue;
            msg("cannot make the job token: getrandom: %s", strerror(errno));
            return -1;
        }
        got += (size_t)n;
    }
    for (size_t i = 0; i < sizeof(bytes); i++) {
        out[2 * i] = hex[bytes[i] >> 4];
        out[2 * i + 1] = hex[bytes[i] & 0xf];
    }
    out[32] = '\0';
    return 0;
}

/* Picks a free TCP port on addr (network order) that is none of
 * taken[0..ntaken-1] into *port: binds port 0, reads the port the kernel
 * chose, closes, and picks again when it is taken. A port is free when
 * picked, not reserved: nothing stops another process from taking it
 * before its user binds it. Returns 0, or -1 after a message. */
static int setup_pick_port(uint32_t addr, const int *taken, int ntaken,
                           int *port)
{
    for (int tries = 0; tries < 1000; tries++) {
        struct sockaddr_in sa = {
            .sin_family = AF_INET,
            .sin_port = 0,
            .sin_addr.s_addr = addr,
        };
        socklen_t len = sizeof(sa);
        int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
        int got, dup = 0;

        if (fd < 0) {
            msg("cannot pick a port: socket: %s", strerror(errno));
            return -1;
        }
        if (bind(fd, (struct sockaddr *)&sa, sizeof(sa)) != 0 ||
            getsockname(fd, (struct sockaddr *)&sa, &len) != 0) {
            msg("cannot pick a port: %s", strerror(errno));
            close(fd);
            return -1;
        }
        close(fd);
        got = ntohs(sa.sin_port);
        for (int j = 0; j < ntaken && !dup; j++)
            dup = taken[j] == got;
        if (!dup) {
            *port = got;
            return 0;
        }
    }
    msg("cannot find a free port that no rank uses");
    return -1;
}

int setup_ports(int n, int *ports)
{
    for (int i = 0; i < n; i++)
        if (setup_pick_port(htonl(INADDR_LOOPBACK), ports, i, &ports[i]) != 0)
            return -1;
    return 0;
}

int setup_master_port_local(int nranks, const int *ports, int *port)
{
    /* torch's TCPStore listens on every address (0.0.0.0 or ::), not only
     * on MASTER_ADDR: a port free on the wildcard address is free on each
     * one, where a port free on 127.0.0.1 may be held on another. */
    return setup_pick_port(htonl(INADDR_ANY), ports, nranks, port);
}

/* Whether a rank of the job of *hf, on any host, listens on port. */
static int setup_port_of_a_rank(const weft__hostfile_out *hf, int port)
{
    for (int h = 0; h < hf->nhosts; h++)
        for (int k = 0; k < hf->hosts[h].nranks; k++)
            if (hf->hosts[h].ports[k] == port)
                return 1;
    return 0;
}

int setup_master_port_hosts(const weft__hostfile_out *hf)
{
    const weft__host *h0 = &hf->hosts[hf->rank_host[0]];
    int port = 0;

    /* Nothing can be bound on rank 0's host from here (it may be another
     * machine, or another network namespace of this one), so the port is
     * derived from the hostfile: the one after the highest port the ranks
     * of rank 0's host listen on, the next one that no rank of the job
     * listens on, from 1024 again after 65535. It is the same for every
     * run of a hostfile, next to the ports the hostfile already claims
     * (what a firewall may be opened for); a job at most holds
     * WEFTRUN_MAX_RANKS ports of the 64512 tried, so one is always left. */
    for (int k = 0; k < h0->nranks; k++)
        if (h0->ports[k] > port)
            port = h0->ports[k];
    port = port < 1023 ? 1024 : port + 1;
    for (int tries = 0; tries < 65536 - 1024; tries++) {
        if (port > 65535)
            port = 1024;
        if (!setup_port_of_a_rank(hf, port))
            break;
        port++;
    }
    return port;
}

int setup_tmpfiles_create(struct tmpfiles *t)
{
    const char *base = getenv("TMPDIR");
    char *tmpl = NULL;
    char *real;

    if (base == NULL || base[0] == '\0')
        base = "/tmp";
    if (asprintf(&tmpl, "%s/weftrun.XXXXXX", base) < 0) {
        msg("out of memory");
        return -1;
    }
    if (mkdtemp(tmpl) == NULL) {
        msg("cannot create a temporary directory in %s: %s", base,
            strerror(errno));
        free(tmpl);
        return -1;
    }
    /* The ranks may run elsewhere than weftrun's cwd some day; give them an
     * absolute path even when TMPDIR is relative. */
    real = realpath(tmpl, NULL);
    if (real != NULL) {
        free(tmpl);
        tmpl = real;
    }
    t->dir = tmpl;
    if (asprintf(&t->file, "%s/hostfile.json", t->dir) < 0) {
        t->file = NULL;
        msg("out of memory");
        return -1;
    }
    return 0;
}

void setup_tmpfiles_remove(struct tmpfiles *t)
{
    if (t->file != NULL && unlink(t->file) != 0 && errno != ENOENT)
        msg("cannot remove %s: %s", t->file, strerror(errno));
    if (t->dir != NULL && rmdir(t->dir) != 0 && errno != ENOENT)
        msg("cannot remove %s: %s", t->dir, strerror(errno));
    free(t->file);
    free(t->dir);
    t->file = NULL;
    t->dir = NULL;
}

/* {"port": p0, "hosts": [{"name": "localhost", "ranks": N,
 *  "ports": [p0, ..., pN-1]}], "links": []} */
int setup_write_hostfile(const char *path, int nranks, const int *ports)
{
    json_t *root = json_object();
    json_t *hosts = json_array();
    json_t *host = json_object();
    json_t *plist = json_array();
    int bad = root == NULL || hosts == NULL || host == NULL || plist == NULL;

    for (int i = 0; i < nranks && !bad; i++)
        bad |= json_array_append_new(plist, json_integer(ports[i])) != 0;
    if (!bad) {
        bad |= json_object_set_new(host, "name", json_string("localhost"));
        bad |= json_object_set_new(host, "ranks", json_integer(nranks));
        bad |= json_object_set(host, "ports", plist);
        bad |= json_array_append(hosts, host);
        bad |= json_object_set_new(root, "port", json_integer(ports[0]));
        bad |= json_object_set(root, "hosts", hosts);
        bad |= json_object_set_new(root, "links", json_array());
    }
    if (!bad && json_dump_file(root, path, JSON_INDENT(2)) != 0) {
        msg("cannot write the hostfile %s: %s", path, strerror(errno));
        bad = 1;
    } else if (bad) {
        msg("out of memory");
    }
    json_decref(plist);
    json_decref(host);
    json_decref(hosts);
    json_decref(root);
    return bad ? -1 : 0;
}
