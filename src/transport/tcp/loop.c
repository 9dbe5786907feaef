/*
 * Loop helpers of the TCP transport: libuv's runs and writes under the
 * SIGPIPE guard, the record of the transport's first failure and the code
 * of a failed read or write, closing a connection, and the timer that
 * bounds a wait.
 */
#include "transport/tcp/tcp.h"

#include <stdlib.h>

/* SIGPIPE. libuv writes with plain write(), which raises SIGPIPE when the
 * peer has gone, and that would kill the process. The transport's own
 * writes use send(MSG_NOSIGNAL); libuv writes only inside uv_write() and,
 * for requests still queued, inside uv_run(). Those two run under the
 * SIGPIPE guard (weft__sigpipe_block), uv_run only while a request is
 * queued, so a small operation pays no signal-mask system calls. */
void weft__tcp_run(tcp_tp *tp, uv_run_mode mode)
{
    weft__sigpipe_state sp;

    if (tp->uv_writes == 0) {
        uv_run(&tp->loop, mode);
        return;
    }
    weft__sigpipe_block(&sp);
    uv_run(&tp->loop, mode);
    weft__sigpipe_restore(&sp);
}

/* uv_write under the guard; every callback of such a request starts with
 * weft__tcp_write_done(). */
int weft__tcp_write(tcp_tp *tp, uv_write_t *req, uv_stream_t *s,
                    const uv_buf_t *bufs, unsigned int n, uv_write_cb cb)
{
    weft__sigpipe_state sp;
    int rc;

    weft__sigpipe_block(&sp);
    rc = uv_write(req, s, bufs, n, cb);
    weft__sigpipe_restore(&sp);
    if (rc == 0)
        tp->uv_writes++;
    return rc;
}

void weft__tcp_write_done(tcp_tp *tp)
{
    tp->uv_writes--;
}

void weft__tcp_fail(tcp_tp *tp, int err, const char *fmt, ...)
{
    va_list ap;

    va_start(ap, fmt);
    weft__tp_fail(tp->sink, &tp->err, err, fmt, ap);
    va_end(ap);
}

/* A connection's error as weft's code: a peer that closed or reset it is
 * WEFT_EPEER, whichever call noticed; anything else is the transport's. */
int weft__tcp_err_code(int uverr)
{
    switch (uverr) {
    case UV_EOF:
    case UV_EPIPE:
    case UV_ECONNRESET:
    case UV_ECONNABORTED:
    case UV_ENOTCONN:
    /* The link is lost: the peer cannot be reached on this wire (no
     * answer within WEFT_WIRE_TIMEOUT_MS, or the route is gone). */
    case UV_ETIMEDOUT:
    case UV_EHOSTUNREACH:
    case UV_ENETUNREACH:
    case UV_ENETDOWN:
    case UV_EHOSTDOWN:
        return WEFT_EPEER;
    default:
        return WEFT_ETRANSPORT;
    }
}

void weft__tcp_wire_lost(conn *k, int uverr)
{
    tcp_tp *tp = k->tp;

    if (k->lost || k->peer < 0 || k->wire < 0 ||
        k->wire >= tp->peers[k->peer].nwires)
        return;
    k->lost = 1;
    atomic_fetch_add(&tp->peers[k->peer].lost, 1);
    /* A peer that closes (its weft_finalize, or its death) is its own
     * news; a link that fails is this one. */
    if (uverr != UV_EOF && !tp->shut)
        weft__log(WEFT__LOG_WARN, tp->rank,
                  "wire %d to peer %d (%s) lost: %s%s", k->wire, k->peer,
                  k->name, uv_strerror(uverr),
                  uverr == UV_ETIMEDOUT ? " (no answer within "
                                          "WEFT_WIRE_TIMEOUT_MS)"
                                        : "");
}

static void conn_close_cb(uv_handle_t *h)
{
    conn *k = (conn *)h;
    k->tp->nopen--;
    /* A wire resumed on a new connection moves over once this one's
     * cancelled writes have run (resume.c). */
    if (k->successor != NULL)
        weft__tcp_resume_finish(k);
    /* No slot keeps a freed connection: where the transport failed
     * between a resume's takeover and this close, the slot still holds
     * k (the shutdown that follows closes the successor with the rest). */
    if (k->peer >= 0 && k->wire >= 0 && k->tp->peers != NULL &&
        k->wire < k->tp->peers[k->peer].nslots) {
        slot *s = &k->tp->peers[k->peer].s[k->wire];

        if (s->c == k)
            s->c = NULL;
        if (s->trying == k)
            s->trying = NULL;
        if (s->resuming == k)
            s->resuming = NULL;
    }
    free(k->rxb);
    free(k->rdata);
    free(k->ret);
    free(k);
}

void weft__tcp_conn_close(conn *k)
{
    if (k->closing)
        return;
    k->closing = 1;
    uv_close((uv_handle_t *)&k->h, conn_close_cb);
}

void weft__tcp_timer_cb(uv_timer_t *t)
{
    (void)t; /* waking uv_run is all it is for */
}
