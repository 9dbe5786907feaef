/*
 * mpirun's text hostfile: "host slots=N [max_slots=M]" per line, "host"
 * alone is one slot, '#' starts a comment (to the end of the line), blank
 * lines are skipped. Each host takes the next N ranks (in ring order) and
 * listens on the default ports 32323 + k; every pair of hosts is joined by
 * one link whose ends are the two host names (resolved when connecting;
 * --wires makes more connections on it). max_slots is checked and
 * otherwise ignored. Messages give the line, and the column where a token
 * is at fault.
 */
#include "topo/hostfile_int.h"

#include <stdlib.h>
#include <string.h>

/* What reading the text keeps from one line to the next. */
typedef struct {
    hf_ctx *c;
    weft__hostfile_out *h;
    int *lines; /* the line of each host, for "already on line N" */
    int cap;    /* hosts and lines have room for this many hosts */
    int total;  /* the ranks of the hosts so far */
} text_reader;

/* One host line: where it is (columns count from line) and what it says. */
typedef struct {
    const char *line;
    int lineno;
    char *name; /* namelen characters, not NUL-terminated until the end */
    size_t namelen;
    long slots;
} host_line;

/* The options a host line may give after the name, each "key=N" with N in
 * [1, WEFT__MAX_RANKS]: slots, the ranks the host takes, and max_slots,
 * only checked against it. One table, so both read and fail alike. */
enum { OPT_SLOTS, OPT_MAX_SLOTS, NOPTS };
static const char *const opt_keys[NOPTS] = {"slots", "max_slots"};

static int is_blank(char ch)
{
    return ch == ' ' || ch == '\t' || ch == '\r';
}

static int name_char(char ch)
{
    return (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') ||
           (ch >= '0' && ch <= '9') || ch == '.' || ch == '-' || ch == '_' ||
           ch == ':';
}

/* Cuts the next line out of the text at *p, ending it at its '\n' and at
 * its '#', and moves *p past it. */
static char *next_line(char **p)
{
    char *line = *p, *eol = strchr(line, '\n'), *hash;

    if (eol != NULL) {
        *eol = '\0';
        *p = eol + 1;
    } else {
        *p = line + strlen(line);
    }
    hash = strchr(line, '#');
    if (hash != NULL)
        *hash = '\0';
    return line;
}

/* The next blank-separated token at *q: its start, its length in *len, and
 * *q just past it; NULL where only blanks are left. */
static char *next_token(char **q, size_t *len)
{
    char *s = *q, *tok;

    while (is_blank(*s))
        s++;
    *q = s;
    if (*s == '\0')
        return NULL;
    tok = s;
    while (*s != '\0' && !is_blank(*s))
        s++;
    *len = (size_t)(s - tok);
    *q = s;
    return tok;
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

/* The host name: the characters a host name (or address) may hold, and
 * short enough to be the address of the links' ends. */
static int check_name(hf_ctx *c, const weft__hostfile_out *h,
                      const host_line *hl)
{
    for (size_t i = 0; i < hl->namelen; i++)
        if (!name_char(hl->name[i]))
            return weft__hf_fail(c,
                                 "line %d, column %d: unexpected character "
                                 "'%c' in a host name: expected \"host "
                                 "slots=N\" (host of letters, digits, '.', "
                                 "'-', '_', ':')",
                                 hl->lineno,
                                 (int)(hl->name - hl->line + (long)i) + 1,
                                 hl->name[i]);
    if (hl->namelen >= sizeof h->links[0].end[0].addr)
        return weft__hf_fail(c,
                             "line %d, column %d: host name longer than %zu "
                             "characters",
                             hl->lineno, (int)(hl->name - hl->line) + 1,
                             sizeof h->links[0].end[0].addr - 1);
    return WEFT_OK;
}

/* The options after the name, from q to the end of the line, into
 * hl->slots (1 where not given). */
static int read_options(hf_ctx *c, host_line *hl, char *q)
{
    long v[NOPTS] = {1, 0};
    int given[NOPTS] = {0, 0};
    char *tok;
    size_t tl;

    while ((tok = next_token(&q, &tl)) != NULL) {
        int col = (int)(tok - hl->line) + 1, k, ok = 0;

        for (k = 0; k < NOPTS; k++)
            if (kv_int(tok, tl, opt_keys[k], 1, WEFT__MAX_RANKS, &v[k], &ok))
                break;
        if (k == NOPTS)
            return weft__hf_fail(c,
                                 "line %d, column %d: unexpected \"%.*s\": "
                                 "expected \"host slots=N\" (or \"host\" "
                                 "alone for one slot)",
                                 hl->lineno, col, (int)tl, tok);
        if (!ok)
            return weft__hf_fail(c,
                                 "line %d, column %d: bad \"%.*s\": expected "
                                 "%s=N with N an integer in [1, %d]",
                                 hl->lineno, col, (int)tl, tok, opt_keys[k],
                                 WEFT__MAX_RANKS);
        given[k] = 1;
    }
    if (given[OPT_MAX_SLOTS] && v[OPT_MAX_SLOTS] < v[OPT_SLOTS])
        return weft__hf_fail(c, "line %d: max_slots=%ld is less than slots=%ld",
                             hl->lineno, v[OPT_MAX_SLOTS], v[OPT_SLOTS]);
    hl->slots = v[OPT_SLOTS];
    return WEFT_OK;
}

/* Room for one more host: hosts and lines grow together, doubling, up to
 * WEFT__MAX_RANKS hosts (each host has at least one rank). */
static int make_room(text_reader *r, int lineno)
{
    weft__hostfile_out *h = r->h;
    int nc = r->cap ? r->cap * 2 : 16;
    weft__host *nh;
    int *nl;

    if (h->nhosts < r->cap)
        return WEFT_OK;
    if (nc > WEFT__MAX_RANKS)
        nc = WEFT__MAX_RANKS;
    if (h->nhosts == WEFT__MAX_RANKS)
        return weft__hf_fail(r->c, "line %d: more than %d hosts", lineno,
                             WEFT__MAX_RANKS);
    nh = realloc(h->hosts, (size_t)nc * sizeof *nh);
    if (nh == NULL)
        return weft__hf_nomem(r->c);
    h->hosts = nh;
    nl = realloc(r->lines, (size_t)nc * sizeof *nl);
    if (nl == NULL)
        return weft__hf_nomem(r->c);
    r->lines = nl;
    r->cap = nc;
    return WEFT_OK;
}

/* Appends the host of line hl (its name now NUL-terminated): listed once,
 * its slots the next ranks, on the default ports. */
static int add_host(text_reader *r, const host_line *hl)
{
    weft__hostfile_out *h = r->h;
    weft__host *host;
    int other = weft__hf_find_host(h, h->nhosts, hl->name), rc;

    if (other >= 0)
        return weft__hf_fail(r->c,
                             "line %d: host \"%s\" is already on line %d; "
                             "expected each host once, with all its slots",
                             hl->lineno, hl->name, r->lines[other]);
    if ((rc = make_room(r, hl->lineno)) != 0)
        return rc;
    host = &h->hosts[h->nhosts];
    memset(host, 0, sizeof *host);
    r->lines[h->nhosts++] = hl->lineno;
    weft__hf_copy_str(host->name, sizeof host->name, hl->name);
    weft__hf_copy_str(host->ssh, sizeof host->ssh, hl->name);
    host->nranks = (int)hl->slots;
    r->total += host->nranks;
    if (r->total > WEFT__MAX_RANKS)
        return weft__hf_fail(r->c, "line %d: more than %d ranks in all",
                             hl->lineno, WEFT__MAX_RANKS);
    host->ports = calloc((size_t)hl->slots, sizeof *host->ports);
    if (host->ports == NULL)
        return weft__hf_nomem(r->c);
    if (weft__hf_default_ports(host, WEFT__DEFAULT_PORT) != 0)
        return weft__hf_fail(r->c,
                             "line %d: slots=%ld takes ports past 65535 "
                             "(from %d)",
                             hl->lineno, hl->slots, WEFT__DEFAULT_PORT);
    return WEFT_OK;
}

/* One line (its comment cut off): nothing where it is blank, else a host. */
static int read_line(text_reader *r, char *line, int lineno)
{
    host_line hl = {line, lineno, NULL, 0, 1};
    char *q = line;
    int rc;

    hl.name = next_token(&q, &hl.namelen);
    if (hl.name == NULL)
        return WEFT_OK;
    if ((rc = check_name(r->c, r->h, &hl)) != 0 ||
        (rc = read_options(r->c, &hl, q)) != 0)
        return rc;
    /* Ended only now: the options were read from the blank after it. */
    hl.name[hl.namelen] = '\0';
    return add_host(r, &hl);
}

/* The text form names no links: every pair of hosts gets one, its ends
 * the two host names. */
static int link_every_pair(hf_ctx *c, weft__hostfile_out *h)
{
    size_t n = (size_t)h->nhosts, nl = n * (n - 1) / 2, l = 0;

    if (n < 2)
        return WEFT_OK;
    if (nl > (1u << 20))
        return weft__hf_fail(c,
                             "%zu hosts: too many for a link between every "
                             "pair",
                             n);
    h->links = calloc(nl, sizeof *h->links);
    if (h->links == NULL)
        return weft__hf_nomem(c);
    h->nlinks = (int)nl;
    for (size_t i = 0; i < n; i++)
        for (size_t j = i + 1; j < n; j++, l++)
            weft__hf_set_link(&h->links[l], (int)i, h->hosts[i].name, (int)j,
                              h->hosts[j].name);
    return WEFT_OK;
}

int weft__hf_parse_text(hf_ctx *c, char *buf, weft__hostfile_out *h)
{
    text_reader r = {c, h, NULL, 0, 0};
    char *p = buf;
    int lineno = 0, rc = WEFT_OK;

    h->format = WEFT__HOSTFILE_MPIRUN;
    while (*p != '\0' && rc == WEFT_OK)
        rc = read_line(&r, next_line(&p), ++lineno);
    if (rc == WEFT_OK && h->nhosts == 0)
        rc = weft__hf_fail(c, "no hosts: expected lines \"host slots=N\" "
                              "(mpirun's form), a JSON object with \"hosts\", "
                              "or MLX's JSON list");
    if (rc == WEFT_OK) {
        h->nranks = r.total;
        rc = link_every_pair(c, h);
    }
    free(r.lines);
    return rc;
}
