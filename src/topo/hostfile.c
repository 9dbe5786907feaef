/*
 * Hostfiles: the entry points of hostfile.h, reading the file, telling the
 * three forms apart, and what every form goes through after its parser
 * (the job's rank count, the ring, rank numbers). Each form has a file of
 * its own: parse_json.c (weft's object), parse_mlx.c (MLX's ring
 * hostfile, and how it maps onto hosts and links), parse_text.c (mpirun's
 * text); the ring and mesh search is search.c, weftrun --check's
 * description describe.c, and the helpers they all share hf_common.c.
 * hostfile_int.h lists what they share.
 *
 * Every failure is WEFT_ECONFIG with a message that starts with the file's
 * path and then says where (line and column, or a field path such as
 * hosts[1].ranks) and what was expected: the reader is usually a person
 * starting a job by hand.
 */
#include "topo/hostfile_int.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define MAX_FILE_BYTES (16L << 20)

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
        return weft__hf_fail(c, "cannot open the hostfile: %s",
                             strerror(errno));
    if (fstat(fd, &st) != 0) {
        int e = errno;
        close(fd);
        return weft__hf_fail(c, "cannot stat the hostfile: %s", strerror(e));
    }
    if (!S_ISREG(st.st_mode)) {
        close(fd);
        return weft__hf_fail(c, "not a regular file (it is %s)",
                             file_kind(st.st_mode));
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
                return weft__hf_nomem(c);
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
            return weft__hf_fail(c, "cannot read the hostfile: %s",
                                 strerror(e));
        }
        n += (size_t)got;
        if ((long)n > MAX_FILE_BYTES) {
            free(buf);
            close(fd);
            return weft__hf_fail(c, "larger than %ld bytes: not a hostfile?",
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
        return weft__hf_fail(&c, "no hostfile named");
    if ((rc = read_file(&c, path, text, &len)) != 0)
        return rc;
    /* A NUL would end the text early: the parsers would read a part of
     * the file without saying so. */
    if (strlen(*text) != len) {
        free(*text);
        *text = NULL;
        return weft__hf_fail(&c, "contains a NUL byte: not a text hostfile");
    }
    return WEFT_OK;
}

/* ---- loading ---- */

/* Numbers ranks along the ring: first_rank and rank_host. */
static int number_ranks(hf_ctx *c, weft__hostfile_out *h)
{
    int next = 0;

    h->rank_host = calloc((size_t)h->nranks, sizeof *h->rank_host);
    if (h->rank_host == NULL)
        return weft__hf_nomem(c);
    for (int i = 0; i < h->nhosts; i++) {
        int hi = h->host_order[i];
        h->hosts[hi].first_rank = next;
        for (int k = 0; k < h->hosts[hi].nranks; k++)
            h->rank_host[next + k] = hi;
        next += h->hosts[hi].nranks;
    }
    return WEFT_OK;
}

/* Tells the form from the first non-blank character (after a UTF-8
 * byte-order mark, which is skipped) and hands buf to its parser. */
static int parse(hf_ctx *c, char *buf, weft__hostfile_out *h)
{
    size_t len = strlen(buf), bom = 0;
    char *p;
    json_error_t jerr;
    json_t *root;
    int rc;

    if (len >= 3 && (unsigned char)buf[0] == 0xEF &&
        (unsigned char)buf[1] == 0xBB && (unsigned char)buf[2] == 0xBF)
        bom = 3;
    p = buf + bom;
    while (*p == ' ' || *p == '\t' || *p == '\r' || *p == '\n')
        p++;
    if (*p == '\0')
        return weft__hf_fail(c, "empty: expected a JSON object with \"hosts\", "
                                "MLX's JSON list or lines \"host slots=N\"");
    if (*p != '{' && *p != '[')
        return weft__hf_parse_text(c, buf + bom, h);
    root = json_loadb(buf + bom, len - bom, JSON_REJECT_DUPLICATES, &jerr);
    if (root == NULL)
        return weft__hf_fail(c, "line %d, column %d: %s (reading JSON: %s)",
                             jerr.line, jerr.column > 0 ? jerr.column : 1,
                             jerr.text,
                             *p == '{' ? "weft's hostfile object"
                                       : "MLX's list of \"ip:port\" lists");
    if (json_is_object(root))
        rc = weft__hf_parse_json(c, root, h);
    else
        rc = weft__hf_parse_mlx(c, root, 0, h);
    json_decref(root);
    return rc;
}

/* What every form goes through after parsing (rc: the parser's result):
 * the rank count, the ring, the rank numbers. On success *h moves to
 * *out; on failure it is freed. */
static int finish(hf_ctx *c, int rc, weft__hostfile_out h, int nranks_expected,
                  weft__hostfile_out *out)
{
    if (rc == 0 && nranks_expected >= 0 && h.nranks != nranks_expected)
        rc = weft__hf_fail(c,
                           "the hosts hold %d rank%s but the job has %d (the "
                           "job size: weftrun -n, WEFT_SIZE or the "
                           "launcher's); make them agree",
                           h.nranks, h.nranks == 1 ? "" : "s", nranks_expected);
    if (rc == 0)
        rc = weft__hf_form_ring(c, &h);
    if (rc == 0)
        rc = number_ranks(c, &h);
    if (rc != 0) {
        weft__hostfile_free(&h);
        return rc;
    }
    *out = h;
    return WEFT_OK;
}

/* Parses and validates buf (a NUL-terminated copy of the text, freed
 * here) into *out. */
static int load_buffer(hf_ctx *c, char *buf, int nranks_expected,
                       weft__hostfile_out *out)
{
    weft__hostfile_out h;
    int rc;

    memset(&h, 0, sizeof h);
    rc = parse(c, buf, &h);
    free(buf);
    return finish(c, rc, h, nranks_expected, out);
}

int weft__hostfile_load(const char *path, int nranks_expected,
                        weft__hostfile_out *out, char *errmsg, size_t errlen)
{
    hf_ctx c = {path != NULL ? path : "(null)", errmsg, errlen};
    char *buf = NULL;
    int rc;

    if (errmsg != NULL && errlen > 0)
        errmsg[0] = '\0';
    if (out == NULL)
        return WEFT_EINVAL;
    memset(out, 0, sizeof *out);
    if ((rc = weft__hostfile_read(path, &buf, errmsg, errlen)) != 0)
        return rc;
    return load_buffer(&c, buf, nranks_expected, out);
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
    return load_buffer(&c, buf, nranks_expected, out);
}

int weft__hostfile_load_addrs(const char *name, const char *const *addrs,
                              int nranks, weft__hostfile_out *out, char *errmsg,
                              size_t errlen)
{
    hf_ctx c = {name, errmsg, errlen};
    weft__hostfile_out h;
    json_t *root;
    int rc = WEFT_OK;

    if (errmsg != NULL && errlen > 0)
        errmsg[0] = '\0';
    if (out == NULL || addrs == NULL || nranks < 1)
        return WEFT_EINVAL;
    memset(out, 0, sizeof *out);
    /* As MLX's list with one address per rank, which the MLX parser
     * checks (ip:port, no address twice) and maps (rank r is a host of its
     * own); only the links differ. */
    if ((root = json_array()) == NULL)
        return weft__hf_nomem(&c);
    for (int r = 0; r < nranks && rc == WEFT_OK; r++) {
        json_t *str, *one;
        if (addrs[r] == NULL) {
            rc = weft__hf_fail(&c,
                               "[%d] is NULL; expected %d \"addr:port\" "
                               "strings, one per rank (weft_config.size)",
                               r, nranks);
            break;
        }
        if ((str = json_string(addrs[r])) == NULL) {
            rc = weft__hf_fail(&c,
                               "[%d] is not an \"addr:port\" string in "
                               "UTF-8",
                               r);
            break;
        }
        /* An append takes its value over, on failure too. */
        if ((one = json_array()) == NULL) {
            json_decref(str);
            rc = weft__hf_nomem(&c);
        } else if (json_array_append_new(one, str) != 0) {
            json_decref(one);
            rc = weft__hf_nomem(&c);
        } else if (json_array_append_new(root, one) != 0) {
            rc = weft__hf_nomem(&c);
        }
    }
    memset(&h, 0, sizeof h);
    if (rc == WEFT_OK)
        rc = weft__hf_parse_mlx(&c, root, 1, &h);
    json_decref(root);
    return finish(&c, rc, h, nranks, out);
}
