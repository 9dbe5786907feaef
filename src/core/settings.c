/*
 * The ranks compare their settings when a communicator is made: every
 * setting that must be alike on every rank (params.c, WEFT__PF_SAME), the
 * transport and topology asked for, and the tuning table in effect. Each
 * rank packs its own into a record and the records are all-gathered by
 * the topology's own algorithm (never by one the tables choose, which may
 * be what differs), so every rank holds the same records and reaches the
 * same verdict at the same moment: either all go on, or all fail
 * weft_init with WEFT_ECONFIG naming the first setting that differs and
 * two ranks that differ in it, or the first rank whose settings cannot
 * run (a WEFT_ALGO row that its host cannot run: that rank's own error).
 *
 * The settings a connection needs before it can carry anything (the
 * number of wires, shared memory between ranks of a host) are compared
 * earlier, in the transports' handshakes.
 */
#include "base/bytes.h"
#include "core/internal.h"
#include "core/tune.h"
#include "topo/params.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define REC_BYTES 2048
#define REC_MAGIC 0x77667331u  /* "wfs1" */
#define STR_BYTES 16           /* transport, topology */
#define ERR_BYTES 320          /* a rank's own configuration error */
#define PID_AT (REC_BYTES - 4) /* the rank's process id (shrink.c) */

/* Record layout: magic; then each numeric WEFT__PF_SAME setting's value
 * (8 bytes each, in the table's order); transport and topology; the
 * rank's own configuration error ("" if none: a table that cannot run
 * here, found by this rank alone); the hash and length of the tuning
 * table's text and that text, cut at the record's end (the hash says
 * whether the cut parts differ); the last 4 bytes, the rank's process
 * id. */
typedef struct {
    size_t nums;  /* offset of the numbers */
    size_t strs;  /* of transport and topology */
    size_t err;   /* of the error */
    size_t table; /* of the table: its hash, its length, its text */
} layout;

static layout rec_layout(void)
{
    layout l;
    size_t n = 0;

    for (int p = 0; p < WEFT__P_COUNT; p++)
        if ((weft__params[p].flags & WEFT__PF_SAME) &&
            (weft__params[p].type == WEFT__PT_INT ||
             weft__params[p].type == WEFT__PT_SIZE))
            n++;
    l.nums = 4;
    l.strs = l.nums + 8 * n;
    l.err = l.strs + 2 * STR_BYTES;
    l.table = l.err + ERR_BYTES;
    return l;
}

static uint64_t fnv1a(const char *s)
{
    return weft__fnv1a(WEFT__FNV_BASIS, s, strlen(s));
}

static void pack(const weft_comm *c, const char *table, const char *err,
                 uint8_t *rec)
{
    const layout l = rec_layout();
    size_t at = l.nums, len = strlen(table);
    size_t room = REC_BYTES - l.table - 12 - 1 - 4; /* a NUL, the pid */

    memset(rec, 0, REC_BYTES);
    weft__put_be32(rec, REC_MAGIC);
    for (int p = 0; p < WEFT__P_COUNT; p++) {
        const weft__param *d = &weft__params[p];

        if ((d->flags & WEFT__PF_SAME) &&
            (d->type == WEFT__PT_INT || d->type == WEFT__PT_SIZE)) {
            weft__put_be64(rec + at, (uint64_t)weft__param_get(&c->cfg, p));
            at += 8;
        }
    }
    memcpy(rec + l.strs, c->cfg.transport, STR_BYTES - 1);
    memcpy(rec + l.strs + STR_BYTES, c->cfg.topology, STR_BYTES - 1);
    snprintf((char *)rec + l.err, ERR_BYTES, "%s", err);
    weft__put_be64(rec + l.table, fnv1a(table));
    weft__put_be32(rec + l.table + 8, (uint32_t)len);
    memcpy(rec + l.table + 12, table, len < room ? len : room);
    weft__put_be32(rec + PID_AT, (uint32_t)getpid());
}

/* The first line (operation) where tables a and b differ, as "line" of
 * at most len bytes each. */
static void first_difference(const char *a, const char *b, char *la, char *lb,
                             size_t len)
{
    for (;;) {
        size_t na = strcspn(a, ";"), nb = strcspn(b, ";");

        if (na != nb || memcmp(a, b, na) != 0 || a[na] == '\0' ||
            b[nb] == '\0') {
            snprintf(la, len, "%.*s", (int)na, a);
            snprintf(lb, len, "%.*s", (int)nb, b);
            return;
        }
        a += na + 1;
        b += nb + 1;
    }
}

/* Rank r's record (rr) against rank 0's (r0): 0 where alike, else 1 with
 * why. */
static int differ(const uint8_t *r0, const uint8_t *rr, int r, char *why,
                  size_t len)
{
    const layout l = rec_layout();
    size_t at = l.nums;
    char a[160], b[160];

    for (int p = 0; p < WEFT__P_COUNT; p++) {
        const weft__param *d = &weft__params[p];
        uint64_t v0, vr;

        if (!(d->flags & WEFT__PF_SAME) ||
            (d->type != WEFT__PT_INT && d->type != WEFT__PT_SIZE))
            continue;
        v0 = weft__get_be64(r0 + at);
        vr = weft__get_be64(rr + at);
        at += 8;
        if (v0 != vr) {
            snprintf(why, len,
                     "%s differs between ranks: %lld on rank 0, %lld on "
                     "rank %d; give every rank the same",
                     d->name, (long long)v0, (long long)vr, r);
            return 1;
        }
    }
    for (int s = 0; s < 2; s++) {
        const char *s0 = (const char *)r0 + l.strs + s * STR_BYTES;
        const char *sr = (const char *)rr + l.strs + s * STR_BYTES;

        if (strcmp(s0, sr) != 0) {
            snprintf(why, len,
                     "%s differs between ranks: %s on rank 0, %s on rank "
                     "%d; give every rank the same",
                     s == 0 ? "WEFT_TRANSPORT" : "WEFT_TOPOLOGY", s0, sr, r);
            return 1;
        }
    }
    if (weft__get_be64(r0 + l.table) == weft__get_be64(rr + l.table))
        return 0;
    first_difference((const char *)r0 + l.table + 12,
                     (const char *)rr + l.table + 12, a, b, sizeof a);
    snprintf(why, len,
             "the tuning tables differ between ranks: rank 0 runs \"%s\", "
             "rank %d \"%s\"; give every rank the same WEFT_ALGO "
             "(weftrun --print-config shows the table)",
             a, r, b);
    return 1;
}

/* Runs the all_gather of the records: the topology's own algorithm,
 * within what is left of the connect deadline. */
static int gather(weft_comm *c, const uint8_t *mine, uint8_t *all,
                  uint64_t deadline_ms)
{
    weft__tune own = {.on = c->tune.on};
    weft__opdesc d = {
        .kind = WEFT__OP_ALL_GATHER,
        .name = "weft_init",
        .redop = -1,
        .a = {.sendbuf = mine,
              .recvbuf = all,
              .count = REC_BYTES,
              .dtype = WEFT_UINT8,
              .root = -1,
              .dst = -1,
              .src = -1},
    };
    const uint64_t now = weft__now_ms();
    const int saved = c->x.timeout_ms;
    int rc;

    d.post = weft__tune_pick(&own, &c->x, d.kind, &d.a, &d.batch);
    c->x.timeout_ms = deadline_ms > now ? (int)(deadline_ms - now) : 1;
    rc = weft__submit(c, &d, NULL);
    c->x.timeout_ms = saved;
    return rc;
}

/* The first rank's own configuration error in the records, as errmsg:
 * 1 if there is one. */
static int own_error(const uint8_t *all, size_t n, char *errmsg, size_t errlen)
{
    const layout l = rec_layout();

    for (size_t r = 0; r < n; r++) {
        const char *e = (const char *)all + r * REC_BYTES + l.err;
        if (e[0] != '\0') {
            snprintf(errmsg, errlen, "rank %zu: %.*s", r, ERR_BYTES, e);
            return 1;
        }
    }
    return 0;
}

int weft__settings_agree(weft_comm *c, int own_rc, uint64_t deadline_ms,
                         char *errmsg, size_t errlen)
{
    const size_t n = (size_t)c->x.nranks;
    size_t tlen = weft__tune_print(&c->tune, NULL, 0) + 1;
    uint8_t *mine = malloc(REC_BYTES), *all = malloc(REC_BYTES * n);
    char *table = malloc(tlen);
    int rc = WEFT_ENOMEM;

    if (mine == NULL || all == NULL || table == NULL)
        goto out;
    weft__tune_print(&c->tune, table, tlen);
    pack(c, table, own_rc != 0 ? errmsg : "", mine);
    rc = gather(c, mine, all, deadline_ms);
    if (rc != WEFT_OK && own_rc != 0) {
        rc = own_rc; /* errmsg says why */
        goto out;
    }
    if (rc != WEFT_OK) {
        /* Settings so far apart that the records did not get through
         * (each rank split them differently) are a configuration error
         * too. */
        snprintf(errmsg, errlen, "comparing the ranks' settings: %s",
                 c->x.fail.code != 0 ? c->x.fail.msg : c->x.errmsg);
        if (rc == WEFT_EMISMATCH)
            rc = WEFT_ECONFIG;
        goto out;
    }
    for (size_t r = 0; r < n; r++)
        c->pids[r] = (int32_t)weft__get_be32(all + r * REC_BYTES + PID_AT);
    if (own_error(all, n, errmsg, errlen))
        rc = WEFT_ECONFIG;
    for (size_t r = 1; rc == WEFT_OK && r < n; r++)
        if (differ(all, all + r * REC_BYTES, (int)r, errmsg, errlen))
            rc = WEFT_ECONFIG;
out:
    free(mine);
    free(all);
    free(table);
    return rc;
}
