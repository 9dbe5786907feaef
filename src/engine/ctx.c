/*
 * The context's error record, scratch and one-copy reads (engine.h): what
 * every pass and algorithm of a communicator shares besides its wires.
 */
#include "engine/pass.h"

#include "engine/pool.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- the context's error record and scratch ---- */

int weft__set_error(weft__ctx *c, int err, const char *fmt, ...)
{
    va_list ap;
    int rc;

    va_start(ap, fmt);
    rc = weft__vfail(&c->fail, err, fmt, ap);
    va_end(ap);
    return rc;
}

int weft__call_fail(weft__ctx *c, int err, const char *fmt, ...)
{
    va_list ap;
    int rc;

    va_start(ap, fmt);
    rc = weft__vfail(&c->fail, err, fmt, ap);
    va_end(ap);
    c->tpo->shutdown(c->tp);
    return rc;
}

int weft__note(weft__ctx *c, int err, const char *fmt, ...)
{
    va_list ap;

    va_start(ap, fmt);
    vsnprintf(c->errmsg, sizeof c->errmsg, fmt, ap);
    va_end(ap);
    return err;
}

/* Grows *buf (*have bytes) to at least nbytes, for a call before anything
 * of it moved: on failure c stays usable. */
static int grow(weft__ctx *c, void **buf, size_t *have, size_t nbytes,
                const char *what)
{
    if (nbytes > *have) {
        void *p = realloc(*buf, nbytes);
        if (p == NULL)
            return weft__note(c, WEFT_ENOMEM,
                              "rank %d: cannot allocate %zu bytes of %s",
                              c->rank, nbytes, what);
        *buf = p;
        *have = nbytes;
    }
    return WEFT_OK;
}

int weft__scratch(weft__ctx *c, size_t nbytes, void **out)
{
    int rc = grow(c, &c->scratch, &c->scratch_bytes, nbytes, "scratch");

    *out = c->scratch;
    return rc;
}

int weft__pull_tmp(weft__ctx *c, size_t nbytes)
{
    return grow(c, &c->pull_tmp, &c->pull_tmp_bytes, nbytes,
                "scratch for a result (one-copy reads)");
}

/* ---- the one-copy all_reduce's set-up (engine.h) ---- */

/* Whether this rank can read ranks [lo, lo + n) but itself. */
static int can_read_all(weft__ctx *c, int lo, int n)
{
    for (int p = lo; p < lo + n; p++)
        if (p != c->rank && !c->tpo->read->can_read(c->tp, p))
            return 0;
    return 1;
}

void weft__pull_init(weft__ctx *c)
{
    const int local = c->cfg->hier_local;

    c->pull = 0;
    c->pull_host = 0;
    if (c->cfg->pull_threads < 1 || !c->tpo->read->offered)
        return;
    c->pull =
        c->nranks <= WEFT__MESH_MAX_RANKS && can_read_all(c, 0, c->nranks);
    c->pull_host = local >= 2 && local <= WEFT__MESH_MAX_RANKS &&
                   can_read_all(c, c->rank - c->rank % local, local);
}

weft__pool *weft__ctx_pool(weft__ctx *c)
{
    if (c->pool == NULL)
        c->pool = weft__pool_create(c->cfg->pull_threads);
    return c->pool;
}

int weft__peer_read(weft__ctx *c, int peer, void *dst, uint64_t addr,
                    size_t len, int *err)
{
    return c->tpo->read->peer_read(c->tp, peer, dst, addr, len, err);
}

void weft__call_end(weft__ctx *c, uint64_t seq)
{
    if (c->box != 0)
        c->tpo->box->done(c->tp, seq);
}
