/*
 * The environment each rank gets: weftrun's own, then the variables that
 * tell a weft program its place in the job (WEFT_RANK, WEFT_SIZE,
 * WEFT_LOCAL_RANK, WEFT_LOCAL_SIZE, WEFT_HOSTFILE, WEFT_JOB_TOKEN), those
 * of the options (WEFT_WIRES, WEFT_TRANSPORT, WEFT_TOPOLOGY,
 * WEFT_TIMEOUT_MS), those torchrun gives (RANK, WORLD_SIZE, LOCAL_RANK,
 * LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT), then the -x ones.
 *
 * The torchrun variables make torch.distributed.init_process_group's env://
 * init work under weftrun unchanged: rank 0 serves torch's TCPStore at
 * MASTER_PORT on its host, and every rank connects to MASTER_ADDR. On one
 * host MASTER_ADDR is 127.0.0.1; with a hostfile it is, for each host,
 * where that host reaches rank 0's host (env_master_addr). MASTER_PORT is
 * chosen in setup.c. They are the only variables weftrun sets that -x may
 * give instead: weftrun cannot know every network (a LAN beside the
 * cables, a firewall), and a wrong guess there leaves a torch user no
 * other way out. A MASTER_ADDR or MASTER_PORT merely inherited from
 * weftrun's environment does not win, as it may well be left over from
 * another job.
 *
 * The environment is built once for the whole job and only the rank's own
 * numbers are rewritten in place before each spawn, so that a job of
 * thousands of ranks does not copy weftrun's environment thousands of
 * times. Which variables weftrun sets is decided here and only here: -x
 * cannot override them (MASTER_ADDR and MASTER_PORT aside, as above), and
 * remote.c asks rank_env_forwarded which ones to carry over ssh.
 */
#define _GNU_SOURCE

#include "weftrun.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Variables weftrun sets itself for every rank; -x cannot change them. */
static const char *const env_fixed_vars[] = {
    "WEFT_RANK",       "WEFT_SIZE",     "WEFT_LOCAL_RANK",
    "WEFT_LOCAL_SIZE", "WEFT_HOSTFILE", "WEFT_JOB_TOKEN",
};

/* torchrun's names for the job's numbers; fixed too. */
static const char *const env_torch_vars[] = {
    "RANK",
    "WORLD_SIZE",
    "LOCAL_RANK",
    "LOCAL_WORLD_SIZE",
};

/* Variables weftrun sets for every rank unless -x gives them (see above). */
static const char *const env_master_vars[] = {"MASTER_ADDR", "MASTER_PORT"};

#define ENV_NFIXED (sizeof(env_fixed_vars) / sizeof(env_fixed_vars[0]))
#define ENV_NTORCH (sizeof(env_torch_vars) / sizeof(env_torch_vars[0]))
#define ENV_NMASTER (sizeof(env_master_vars) / sizeof(env_master_vars[0]))
/* The most names weftrun sets: the fixed ones, torchrun's, one per option
 * and the MASTER_ ones. */
#define ENV_NSET (ENV_NFIXED + ENV_NTORCH + 5 + ENV_NMASTER)
/* The longest address MASTER_ADDR is rewritten to: a link end's. */
#define ENV_MASTER_ADDR_MAX (sizeof(((weft__link_end *)0)->addr) - 1)

size_t env_name_len(const char *s)
{
    return strcspn(s, "=");
}

static int env_push(struct rank_env *e, char *s)
{
    if (s == NULL)
        return -1;
    e->envp[e->n++] = s;
    return 0;
}

__attribute__((format(printf, 2, 3))) static int env_pushf(struct rank_env *e,
                                                           const char *fmt, ...)
{
    va_list ap;
    char *s;
    int rc;

    va_start(ap, fmt);
    rc = vasprintf(&s, fmt, ap);
    va_end(ap);
    return env_push(e, rc < 0 ? NULL : s);
}

static int env_name_in(const char *entry, const char *const *names, size_t n)
{
    size_t len = env_name_len(entry);

    for (size_t i = 0; i < n; i++)
        if (names[i] != NULL && env_name_len(names[i]) == len &&
            strncmp(names[i], entry, len) == 0)
            return 1;
    return 0;
}

void rank_env_free(struct rank_env *e)
{
    if (e->envp == NULL)
        return;
    for (size_t i = 0; i < e->n; i++)
        free(e->envp[i]);
    free(e->envp);
    e->envp = NULL;
}

/* Fills names (room for ENV_NSET) with every name weftrun sets for o's
 * job that -x cannot change; returns how many. */
static size_t env_set_names(const struct opts *o, const char **names)
{
    size_t nnames = 0;

    for (size_t i = 0; i < ENV_NFIXED; i++)
        names[nnames++] = env_fixed_vars[i];
    for (size_t i = 0; i < ENV_NTORCH; i++)
        names[nnames++] = env_torch_vars[i];
    if (o->timeout_ms > 0)
        names[nnames++] = "WEFT_TIMEOUT_MS";
    if (o->wires > 0)
        names[nnames++] = "WEFT_WIRES";
    if (o->transport != NULL)
        names[nnames++] = "WEFT_TRANSPORT";
    if (o->topology != NULL)
        names[nnames++] = "WEFT_TOPOLOGY";
    return nnames;
}

/* Decides which -x entries take effect: not the ones weftrun sets itself
 * (names), and for a name given twice the last one. xset[i] is o->xvars[i]
 * where it takes effect, else NULL (xset has room for o->nxvars). */
static void env_choose_x(const struct opts *o, const char *const *names,
                         size_t nnames, const char **xset)
{
    for (int i = 0; i < o->nxvars; i++) {
        const char *x = o->xvars[i];
        size_t len = env_name_len(x);
        int later = 0;

        if (env_name_in(x, names, nnames)) {
            msg("warning: -x %.*s ignored: weftrun sets %.*s itself", (int)len,
                x, (int)len, x);
            continue;
        }
        for (int j = i + 1; j < o->nxvars && !later; j++)
            later = env_name_len(o->xvars[j]) == len &&
                    strncmp(o->xvars[j], x, len) == 0;
        if (later)
            continue;
        if (x[len] == '\0' && getenv(x) == NULL) {
            msg("warning: -x %s: %s is not set in weftrun's environment; not "
                "forwarded",
                x, x);
            continue;
        }
        xset[i] = x;
    }
}

/* Appends the WEFT_* variables. Returns 0, or -1 when out of memory. */
static int env_push_weft(struct rank_env *e, const struct opts *o,
                         const char *hostfile, const char *token)
{
    /* "WEFT_RANK=" and "WEFT_LOCAL_RANK=" with room for any rank number. */
    if (env_pushf(e, "WEFT_RANK=%d", WEFTRUN_MAX_RANKS) != 0)
        return -1;
    e->rank = e->envp[e->n - 1];
    if (env_pushf(e, "WEFT_SIZE=%d", o->nranks) != 0 ||
        env_pushf(e, "WEFT_LOCAL_RANK=%d", WEFTRUN_MAX_RANKS) != 0)
        return -1;
    e->local_rank = e->envp[e->n - 1];
    if (env_pushf(e, "WEFT_LOCAL_SIZE=%d", WEFTRUN_MAX_RANKS) != 0)
        return -1;
    e->local_size = e->envp[e->n - 1];
    if (env_pushf(e, "WEFT_HOSTFILE=%s", hostfile) != 0 ||
        env_pushf(e, "WEFT_JOB_TOKEN=%s", token) != 0)
        return -1;
    if (o->timeout_ms > 0 &&
        env_pushf(e, "WEFT_TIMEOUT_MS=%d", o->timeout_ms) != 0)
        return -1;
    if (o->wires > 0 && env_pushf(e, "WEFT_WIRES=%d", o->wires) != 0)
        return -1;
    if (o->transport != NULL &&
        env_pushf(e, "WEFT_TRANSPORT=%s", o->transport) != 0)
        return -1;
    if (o->topology != NULL &&
        env_pushf(e, "WEFT_TOPOLOGY=%s", o->topology) != 0)
        return -1;
    if (o->print_config && env_pushf(e, "WEFT_PRINT_CONFIG=1") != 0)
        return -1;
    return 0;
}

/* Whether -x gives name (an effective entry of xset, from env_choose_x). */
static int env_x_gives(const struct opts *o, const char *const *xset,
                       const char *name)
{
    return env_name_in(name, xset, (size_t)o->nxvars);
}

/* Appends torchrun's variables, leaving out the MASTER_ ones that -x gives
 * (xset, from env_choose_x). Returns 0, or -1 when out of memory. */
static int env_push_torch(struct rank_env *e, const struct opts *o,
                          int master_port, const char *const *xset)
{
    /* The per-rank entries with room for any rank number, as above. */
    if (env_pushf(e, "RANK=%d", WEFTRUN_MAX_RANKS) != 0)
        return -1;
    e->torch_rank = e->envp[e->n - 1];
    if (env_pushf(e, "WORLD_SIZE=%d", o->nranks) != 0 ||
        env_pushf(e, "LOCAL_RANK=%d", WEFTRUN_MAX_RANKS) != 0)
        return -1;
    e->torch_local_rank = e->envp[e->n - 1];
    if (env_pushf(e, "LOCAL_WORLD_SIZE=%d", WEFTRUN_MAX_RANKS) != 0)
        return -1;
    e->torch_local_size = e->envp[e->n - 1];
    if (!env_x_gives(o, xset, "MASTER_ADDR")) {
        if (env_pushf(e, "MASTER_ADDR=%*s", (int)ENV_MASTER_ADDR_MAX, "") != 0)
            return -1;
        e->master_addr = e->envp[e->n - 1];
        e->master_addr_size = strlen(e->master_addr) + 1;
    }
    if (!env_x_gives(o, xset, "MASTER_PORT") &&
        env_pushf(e, "MASTER_PORT=%d", master_port) != 0)
        return -1;
    return 0;
}

/* Appends the -x variables that take effect (xset, from env_choose_x).
 * Returns 0, or -1 when out of memory. */
static int env_push_x(struct rank_env *e, const struct opts *o,
                      const char *const *xset)
{
    for (int i = 0; i < o->nxvars; i++) {
        const char *x = xset[i];

        if (x == NULL)
            continue;
        if (strchr(x, '=') != NULL) {
            if (env_push(e, strdup(x)) != 0)
                return -1;
        } else if (env_pushf(e, "%s=%s", x, getenv(x)) != 0) {
            return -1;
        }
    }
    return 0;
}

int rank_env_build(struct rank_env *e, const struct opts *o,
                   const char *hostfile, const char *token, int master_port)
{
    extern char **environ;
    /* The names of everything set below, to drop from the inherited part. */
    const char *names[ENV_NSET];
    const char **xset = NULL; /* effective -x entries ("NAME" or "N=V") */
    size_t nnames, nenv = 0;
    int rc = -1;

    for (char **p = environ; *p != NULL; p++)
        nenv++;
    memset(e, 0, sizeof(*e));
    xset = calloc((size_t)o->nxvars + 1, sizeof(*xset));
    e->envp = calloc(nenv + ENV_NSET + 1 + (size_t)o->nxvars, sizeof(*e->envp));
    if (xset == NULL || e->envp == NULL) {
        msg("out of memory");
        goto out;
    }
    nnames = env_set_names(o, names);
    env_choose_x(o, names, nnames, xset);
    /* Set by weftrun or by -x: not inherited either way. */
    for (size_t i = 0; i < ENV_NMASTER; i++)
        names[nnames++] = env_master_vars[i];

    for (char **p = environ; *p != NULL; p++) {
        if (strchr(*p, '=') == NULL || env_name_in(*p, names, nnames) ||
            env_name_in(*p, xset, (size_t)o->nxvars))
            continue;
        if (env_push(e, strdup(*p)) != 0)
            goto oom;
    }
    if (env_push_weft(e, o, hostfile, token) != 0 ||
        env_push_torch(e, o, master_port, xset) != 0 ||
        env_push_x(e, o, xset) != 0)
        goto oom;
    rc = 0;
    goto out;

oom:
    msg("out of memory");
out:
    free(xset);
    if (rc != 0)
        rank_env_free(e);
    return rc;
}

/* MASTER_ADDR for the ranks of host (an index into hf->hosts): where they
 * reach rank 0's host, h0.
 * - On h0 itself, and in a job on this host (hf NULL): 127.0.0.1, as weft's
 *   own ranks on one host reach each other over loopback (torch's TCPStore
 *   listens on every address).
 * - On a host that shares a link with h0: h0's end of the first such link
 *   in the hostfile. That address is on the cable between the two, so it
 *   is reachable from there even where each cable is a subnet of its own.
 * - On any other host (in a ring, a host that is not h0's neighbour): h0's
 *   end of h0's first link. No address of h0 need be reachable from there
 *   (cables that are point-to-point subnets join no other host to h0), so
 *   this is a guess that holds on one LAN or a routed network; elsewhere
 *   the user gives one with -x MASTER_ADDR=..., such as a name of h0 on a
 *   network every host is on.
 * So MASTER_ADDR may differ between hosts; each is an address of h0's,
 * which is all torch asks of it. */
static const char *env_master_addr(const weft__hostfile_out *hf, int host)
{
    const char *first = NULL;
    int h0;

    if (hf == NULL)
        return "127.0.0.1";
    h0 = hf->rank_host[0];
    if (host == h0)
        return "127.0.0.1";
    for (int l = 0; l < hf->nlinks; l++) {
        const weft__link *lk = &hf->links[l];

        for (int k = 0; k < 2; k++) {
            if (lk->end[k].host != h0)
                continue;
            if (lk->end[1 - k].host == host)
                return lk->end[k].addr;
            if (first == NULL)
                first = lk->end[k].addr;
        }
    }
    /* A hostfile of several hosts links h0 to one at least (its ring). */
    return first != NULL ? first : "127.0.0.1";
}

void rank_env_set_rank(struct rank_env *e, const weft__hostfile_out *hf,
                       int rank, int nranks)
{
    int local = rank, nlocal = nranks, host = 0;

    if (hf != NULL) {
        const weft__host *h = &hf->hosts[hf->rank_host[rank]];
        host = hf->rank_host[rank];
        local = rank - h->first_rank;
        nlocal = h->nranks;
    }
    /* The entries were made with room for WEFTRUN_MAX_RANKS. */
    sprintf(e->rank, "WEFT_RANK=%d", rank);
    sprintf(e->local_rank, "WEFT_LOCAL_RANK=%d", local);
    sprintf(e->local_size, "WEFT_LOCAL_SIZE=%d", nlocal);
    sprintf(e->torch_rank, "RANK=%d", rank);
    sprintf(e->torch_local_rank, "LOCAL_RANK=%d", local);
    sprintf(e->torch_local_size, "LOCAL_WORLD_SIZE=%d", nlocal);
    /* Made with room for any link end's address. */
    if (e->master_addr != NULL)
        snprintf(e->master_addr, e->master_addr_size, "MASTER_ADDR=%s",
                 env_master_addr(hf, host));
}

int rank_env_forwarded(const struct opts *o, const char *entry)
{
    /* The remote host reads the hostfile from WEFT_HOSTFILE_TEXT: the
     * path need not exist there. */
    int ours = (strncmp(entry, "WEFT_", 5) == 0 &&
                strncmp(entry, "WEFT_HOSTFILE=", 14) != 0) ||
               env_name_in(entry, env_torch_vars, ENV_NTORCH) ||
               env_name_in(entry, env_master_vars, ENV_NMASTER);

    for (int x = 0; !ours && x < o->nxvars; x++)
        ours = strncmp(entry, o->xvars[x], env_name_len(o->xvars[x])) == 0 &&
               entry[env_name_len(o->xvars[x])] == '=';
    return ours;
}
