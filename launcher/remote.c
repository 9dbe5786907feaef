/*
 * Starting a rank of a --hostfile job on its host: the command weftrun
 * spawns in place of PROGRAM ARGS.
 *
 * With --launch-cmd, the command given ({host} replaced by the host's
 * name) runs PROGRAM ARGS on the host, and the rank's environment passes
 * through it as through any program. Without it, a host that is this one
 * runs PROGRAM ARGS directly, and another host is reached over ssh (or
 * $WEFTRUN_SSH) in batch mode, where nothing of weftrun's environment
 * arrives: the rank's own variables, and the hostfile's text (the file
 * need not exist there), are written into the remote command line, every
 * word single-quoted for the remote shell.
 *
 * Either way the rank is weftrun's child, so its output, its exit and the
 * signals that stop it go through the ssh or launch command process,
 * whose process group weftrun signals like any rank's.
 */
#define _GNU_SOURCE

#include "weftrun.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* A command line being built: buf holds len bytes and a NUL, in cap. */
struct remote_cmd {
    char *buf;
    size_t len, cap;
};

void remote_argv_free(char **argv)
{
    for (char **a = argv; a != NULL && *a != NULL; a++)
        free(*a);
    free(argv);
}

static int remote_is_local(const weft__host *h)
{
    char me[256];

    if (strcmp(h->ssh, "localhost") == 0 || strcmp(h->ssh, "127.0.0.1") == 0)
        return 1;
    return gethostname(me, sizeof me) == 0 && strcmp(h->ssh, me) == 0;
}

/* Makes room in c for n more bytes and the NUL. Returns 0, or -1 when out
 * of memory (c unchanged). */
static int remote_cmd_room(struct remote_cmd *c, size_t n)
{
    size_t need = c->len + n + 1;
    char *nb;

    if (need <= c->cap)
        return 0;
    nb = realloc(c->buf, need * 2);
    if (nb == NULL)
        return -1;
    c->buf = nb;
    c->cap = need * 2;
    return 0;
}

/* Appends the n bytes at s as they are. Returns 0, or -1 (out of memory). */
static int remote_cmd_add(struct remote_cmd *c, const char *s, size_t n)
{
    if (remote_cmd_room(c, n) != 0)
        return -1;
    memcpy(c->buf + c->len, s, n);
    c->len += n;
    c->buf[c->len] = '\0';
    return 0;
}

/* Appends a blank and s as one single-quoted shell word. Returns 0, or -1
 * (out of memory). */
static int remote_cmd_quote(struct remote_cmd *c, const char *s)
{
    /* Each byte takes at most 4 ('\'' for a quote), plus ' and ' and ' '. */
    if (remote_cmd_room(c, 4 * strlen(s) + 3) != 0)
        return -1;
    c->buf[c->len++] = ' ';
    c->buf[c->len++] = '\'';
    for (; *s != '\0'; s++) {
        if (*s == '\'') {
            memcpy(c->buf + c->len, "'\\''", 4);
            c->len += 4;
        } else {
            c->buf[c->len++] = *s;
        }
    }
    c->buf[c->len++] = '\'';
    c->buf[c->len] = '\0';
    return 0;
}

/* launch_cmd with every {host} replaced by host: a new string ("" for an
 * empty launch_cmd), or NULL when out of memory. */
static char *remote_expand(const char *launch_cmd, const char *host)
{
    struct remote_cmd c = {NULL, 0, 0};

    if (remote_cmd_add(&c, "", 0) != 0)
        return NULL;
    for (const char *p = launch_cmd; *p != '\0';) {
        int rc;

        if (strncmp(p, "{host}", 6) == 0) {
            rc = remote_cmd_add(&c, host, strlen(host));
            p += 6;
        } else {
            rc = remote_cmd_add(&c, p, 1);
            p++;
        }
        if (rc != 0) {
            free(c.buf);
            return NULL;
        }
    }
    return c.buf;
}

/* --launch-cmd: its words, split on blanks, then PROGRAM ARGS. */
static int remote_launch_argv(const struct opts *o, const weft__host *h,
                              char ***out)
{
    size_t nprog = 0, n = 0;
    char *words = remote_expand(o->launch_cmd, h->name);
    char **argv = NULL;
    char *save = NULL;

    while (o->prog_argv[nprog] != NULL)
        nprog++;
    if (words == NULL)
        goto oom;
    /* At most one word per two bytes ("a b c"), and a NULL. */
    argv = calloc(strlen(words) / 2 + 2 + nprog, sizeof *argv);
    if (argv == NULL)
        goto oom;
    for (char *w = strtok_r(words, " \t", &save); w != NULL;
         w = strtok_r(NULL, " \t", &save))
        if ((argv[n++] = strdup(w)) == NULL)
            goto oom;
    free(words);
    words = NULL;
    if (n == 0) {
        msg("--launch-cmd: empty command");
        remote_argv_free(argv);
        return -1;
    }
    for (size_t k = 0; k < nprog; k++)
        if ((argv[n++] = strdup(o->prog_argv[k])) == NULL)
            goto oom;
    *out = argv;
    return 0;

oom:
    msg("out of memory");
    free(words);
    remote_argv_free(argv);
    return -1;
}

/* The command ssh runs on the host: cd DIR && exec env VARS PROGRAM ARGS,
 * DIR being weftrun's working directory. A new string, or NULL when out
 * of memory or when that directory cannot be named. */
static char *remote_ssh_command(const struct opts *o, const char *hf_text,
                                const struct rank_env *env)
{
    struct remote_cmd c = {NULL, 0, 0};
    char cwd[4096];

    if (getcwd(cwd, sizeof cwd) == NULL)
        return NULL;
    if (remote_cmd_add(&c, "cd", 2) != 0 || remote_cmd_quote(&c, cwd) != 0 ||
        remote_cmd_add(&c, " && exec env", 12) != 0)
        goto fail;
    /* The rank's own variables: weftrun's and -x ones, not the whole
     * local environment. */
    if (hf_text != NULL) {
        char *v = NULL;
        int rc;

        if (asprintf(&v, "WEFT_HOSTFILE_TEXT=%s", hf_text) < 0)
            goto fail;
        rc = remote_cmd_quote(&c, v);
        free(v);
        if (rc != 0)
            goto fail;
    }
    for (char **e = env->envp; *e != NULL; e++)
        if (rank_env_forwarded(o, *e) && remote_cmd_quote(&c, *e) != 0)
            goto fail;
    for (char **a = o->prog_argv; *a != NULL; a++)
        if (remote_cmd_quote(&c, *a) != 0)
            goto fail;
    return c.buf;

fail:
    free(c.buf);
    return NULL;
}

/* ssh -o BatchMode=yes HOST COMMAND, ssh being $WEFTRUN_SSH if set. */
static int remote_ssh_argv(const struct opts *o, const weft__host *h,
                           const char *hf_text, const struct rank_env *env,
                           char ***out)
{
    const char *ssh = getenv("WEFTRUN_SSH");
    char **argv = calloc(6, sizeof *argv);
    char *cmd = remote_ssh_command(o, hf_text, env);

    if (ssh == NULL || *ssh == '\0')
        ssh = "ssh";
    if (argv == NULL || cmd == NULL || (argv[0] = strdup(ssh)) == NULL ||
        (argv[1] = strdup("-o")) == NULL ||
        (argv[2] = strdup("BatchMode=yes")) == NULL ||
        (argv[3] = strdup(h->ssh)) == NULL) {
        msg("out of memory");
        free(cmd);
        remote_argv_free(argv);
        return -1;
    }
    argv[4] = cmd;
    *out = argv;
    return 0;
}

int remote_argv(const struct opts *o, const weft__hostfile_out *hf,
                const char *hf_text, int i, const struct rank_env *env,
                char ***out)
{
    const weft__host *h = &hf->hosts[hf->rank_host[i]];

    *out = NULL;
    if (o->launch_cmd != NULL)
        return remote_launch_argv(o, h, out);
    if (remote_is_local(h))
        return 0;
    return remote_ssh_argv(o, h, hf_text, env, out);
}
