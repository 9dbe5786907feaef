/*
 * The TCP transport's relay.
 *
 * Ranks whose hosts share no cable exchange point-to-point messages through
 * the ranks between them on the ring. Each rank keeps one connection to
 * each ring neighbour for this alone (data wires carry only their own
 * operations' bytes, in order), and reads it whenever it runs progress():
 * a chunk for this rank is handed to the posted relay receive from its
 * source (or kept until one is posted); any other chunk goes on, unchanged,
 * in the direction it was travelling. A message is cut into chunks of
 * RELAY_CHUNK bytes, each with a header (magic, source, destination, chunk
 * length, message length); chunks from one source follow one path, so
 * they arrive in order. Relaying progresses while the ranks in between are
 * inside weft calls, like any MPI without a progress thread.
 */
#include "transport/tcp/tcp.h"

#include "base/bytes.h"

#include <stdlib.h>
#include <string.h>

/* The write of one relayed chunk: its header, and its bytes when they are
 * owned (a forwarded chunk) rather than the sender's buffer. */
typedef struct rwreq {
    uv_write_t req;
    uint8_t hdr[RELAY_HDR];
    char *owned;
    weft__xfer *x; /* the send it belongs to, or NULL when forwarded */
} rwreq;

static int relay_dir(const conn *k)
{
    tcp_tp *tp = k->tp;
    return tp->relay[1] != NULL && tp->relay[1]->c == k ? 1 : 0;
}

static void relay_write_cb(uv_write_t *req, int status)
{
    rwreq *w = (rwreq *)req;
    conn *k = req->handle->data;
    tcp_tp *tp = k->tp;
    weft__xfer *x = w->x;

    weft__tcp_write_done(tp);
    free(w->owned);
    free(w);
    if (tp->shut)
        return;
    /* The relay connection lost its link: the chunk's bytes are kept and
     * go again on the connection that resumes it (resume.c). */
    if (status < 0 && tp->err == 0 &&
        (k->paused || k->successor != NULL || weft__tcp_pause(k, status)))
        status = 0;
    if (status < 0) {
        int code = weft__tcp_err_code(status);

        if (x != NULL && code == WEFT_EPEER) {
            if (tp->err == 0)
                tp->lost_peer = k->peer;
            weft__tcp_fail(tp, code,
                           "rank %d: neighbour %d closed or reset the relay "
                           "connection while this rank was relaying to rank "
                           "%d through it (%s)",
                           tp->rank, k->peer, x->peer, uv_strerror(status));
        } else if (x != NULL)
            weft__tcp_fail(tp, code,
                           "rank %d: relaying to rank %d through neighbour %d "
                           "failed: %s",
                           tp->rank, x->peer, k->peer, uv_strerror(status));
        else
            weft__log(WEFT__LOG_WARN, tp->rank,
                      "a chunk relayed through neighbour %d was lost: %s",
                      k->peer, uv_strerror(status));
        return;
    }
    /* Once the transport has failed nothing more completes (data.c). */
    if (x != NULL && --x->got == 0 && tp->err == 0) {
        tp->events++;
        x->done(x);
    }
}

/* A relayed chunk's header at h (RELAY_HDR bytes). */
static void relay_hdr_pack(uint8_t *h, uint32_t src, uint32_t dst, uint32_t len,
                           uint64_t total)
{
    weft__put_be32(h, RELAY_MAGIC);
    weft__put_be32(h + 4, src);
    weft__put_be32(h + 8, dst);
    weft__put_be32(h + 12, len);
    weft__put_be64(h + 16, total);
}

/* Writes one chunk on the relay connection in direction dir. */
static int relay_write(tcp_tp *tp, int dir, uint32_t src, uint32_t dst,
                       const char *data, uint32_t len, uint64_t total,
                       char *owned, weft__xfer *x)
{
    slot *s = tp->relay[dir];
    conn *k = s != NULL ? s->c : NULL;
    rwreq *w;
    uv_buf_t b[2];
    int rc;

    if (k != NULL && (k->paused || k->successor != NULL)) {
        /* Being resumed: kept, and written by the resume (resume.c), so
         * it counts as sent now. */
        uint8_t hdr[RELAY_HDR];

        relay_hdr_pack(hdr, src, dst, len, total);
        b[0] = uv_buf_init((char *)hdr, RELAY_HDR);
        b[1] = uv_buf_init((char *)data, len);
        weft__tcp_retain(k, b, 2);
        free(owned);
        if (!k->resumable)
            return WEFT_EPEER; /* nothing kept: it cannot go again */
        /* Its send completes inside progress (weft__tcp_relay_forward),
         * never inside a post. */
        if (x != NULL && --x->got == 0)
            weft__xq_push(&tp->rdone_head, &tp->rdone_tail, x);
        return WEFT_OK;
    }
    if (k == NULL || k->closing || k->rx_end != 0) {
        free(owned);
        return WEFT_EPEER;
    }
    w = calloc(1, sizeof *w);
    if (w == NULL) {
        free(owned);
        return WEFT_ENOMEM;
    }
    relay_hdr_pack(w->hdr, src, dst, len, total);
    w->owned = owned;
    w->x = x;
    b[0] = uv_buf_init((char *)w->hdr, RELAY_HDR);
    b[1] = uv_buf_init((char *)data, len);
    weft__tcp_retain(k, b, 2);
    rc = weft__tcp_write(tp, &w->req, (uv_stream_t *)&k->h, b, 2,
                         relay_write_cb);
    if (rc != 0) {
        free(w->owned);
        free(w);
        return WEFT_EPEER;
    }
    return WEFT_OK;
}

/* Hands chunk c (for this rank) to the first posted receive from its
 * source; returns 1 if it was taken (and freed). */
static int relay_deliver(tcp_tp *tp, rchunk *c)
{
    weft__xfer **pp = &tp->rrecv, *x;

    while (*pp != NULL && (*pp)->peer != (int)c->src)
        pp = (weft__xfer **)&(*pp)->tp_next;
    x = *pp;
    if (x == NULL)
        return 0;
    if (c->total != x->len || x->got + c->len > x->len) {
        weft__tcp_fail(
            tp, WEFT_EMISMATCH,
            "rank %d: recv of %zu bytes from rank %u met a message of "
            "%llu bytes",
            tp->rank, x->len, c->src, (unsigned long long)c->total);
        free(c->data);
        free(c);
        return 1;
    }
    memcpy(x->buf + x->got, c->data, c->len);
    x->got += c->len;
    free(c->data);
    free(c);
    if (x->got == x->len) {
        *pp = x->tp_next;
        x->tp_next = NULL;
        tp->events++;
        x->done(x);
    }
    return 1;
}

/* Writes the chunks passing through (relay_chunk), in order. */
void weft__tcp_relay_forward(tcp_tp *tp)
{
    /* Sends written while the relay connection was being resumed. */
    while (tp->rdone_head != NULL && tp->err == 0) {
        weft__xfer *x = tp->rdone_head;

        tp->rdone_head = x->tp_next;
        if (tp->rdone_head == NULL)
            tp->rdone_tail = NULL;
        x->tp_next = NULL;
        tp->events++;
        x->done(x);
    }
    while (tp->fwd_head != NULL) {
        rchunk *c = tp->fwd_head;
        int rc;

        tp->fwd_head = c->next;
        if (tp->fwd_head == NULL)
            tp->fwd_tail = NULL;
        rc = relay_write(tp, c->dir, c->src, c->dst, c->data, c->len, c->total,
                         c->data, NULL);
        if (rc != 0)
            weft__log(WEFT__LOG_WARN, tp->rank,
                      "cannot relay a chunk from rank %u to rank %u: %s",
                      c->src, c->dst, weft_err_name(rc));
        free(c);
    }
}

/* Matches chunks kept for later against the posted receives. */
void weft__tcp_relay_drain(tcp_tp *tp)
{
    rchunk **pp = &tp->rpending;

    tp->relay_ready = 0;
    while (*pp != NULL && tp->err == 0) {
        rchunk *c = *pp;
        *pp = c->next;
        if (!relay_deliver(tp, c)) {
            /* Not taken: put it back where it was. */
            c->next = *pp;
            *pp = c;
            pp = &c->next;
        }
    }
}

static void relay_chunk(conn *k, rchunk *c)
{
    tcp_tp *tp = k->tp;
    rchunk **pp;

    if (c->dst != (uint32_t)tp->rank) {
        /* Passing through: on in the direction it was going, written by
         * weft__tcp_relay_forward once this turn of the loop is over. */
        c->dir = 1 - relay_dir(k);
        c->next = NULL;
        if (tp->fwd_tail != NULL)
            tp->fwd_tail->next = c;
        else
            tp->fwd_head = c;
        tp->fwd_tail = c;
        tp->events++;
        return;
    }
    /* Once the transport has failed nothing completes: kept, and freed
     * with the rest at shutdown. A chunk whose source has chunks kept
     * waits behind them (weft__tcp_relay_drain hands them over in
     * order): delivered at once, it would overtake them into a receive
     * posted for an earlier message that the drain has not reached yet. */
    for (pp = &tp->rpending; *pp != NULL; pp = &(*pp)->next)
        if ((*pp)->src == c->src)
            break;
    if (*pp == NULL && tp->err == 0 && relay_deliver(tp, c))
        return;
    for (; *pp != NULL; pp = &(*pp)->next)
        ;
    c->next = NULL;
    *pp = c;
}

void weft__tcp_relay_alloc_cb(uv_handle_t *h, size_t suggested, uv_buf_t *buf)
{
    conn *k = h->data;

    (void)suggested;
    if (k->rhgot < RELAY_HDR) {
        buf->base = (char *)k->rhdr + k->rhgot;
        buf->len = RELAY_HDR - k->rhgot;
    } else {
        buf->base = k->rdata + k->rdgot;
        buf->len = k->rdlen - k->rdgot;
    }
}

/* Whether a posted relayed receive is waited for (weft__xfer_wanted). */
static int rrecv_wanted(const tcp_tp *tp)
{
    for (const weft__xfer *x = tp->rrecv; x != NULL; x = x->tp_next)
        if (weft__xfer_wanted(x))
            return 1;
    return 0;
}

void weft__tcp_relay_read_cb(uv_stream_t *st, ssize_t nread,
                             const uv_buf_t *buf)
{
    conn *k = st->data;
    tcp_tp *tp = k->tp;

    (void)buf;
    if (nread == 0)
        return;
    if (nread < 0) {
        uv_read_stop(st);
        k->reading = 0;
        if (nread == UV_EOF)
            nread = weft__tcp_eof_cause(k);
        if (weft__tcp_pause(k, (int)nread))
            return; /* resumed on a new connection (resume.c) */
        k->rx_end = (int)nread;
        if (rrecv_wanted(tp))
            weft__tcp_fail(tp, WEFT_EPEER,
                           "rank %d: neighbour %d closed the relay connection "
                           "while a relayed message was awaited",
                           tp->rank, k->peer);
        return;
    }
    tp->events++;
    k->rx_pos += (uint64_t)nread;
    k->rx_ms = uv_now(&tp->loop);
    if (k->rhgot < RELAY_HDR) {
        uint32_t len;
        k->rhgot += (size_t)nread;
        if (k->rhgot < RELAY_HDR)
            return;
        len = weft__get_be32(k->rhdr + 12);
        if (weft__get_be32(k->rhdr) != RELAY_MAGIC || len == 0 ||
            len > RELAY_CHUNK) {
            uv_read_stop(st);
            k->rx_end = UV_EPROTO;
            weft__tcp_fail(tp, WEFT_ETRANSPORT,
                           "rank %d: garbled relay chunk from neighbour %d",
                           tp->rank, k->peer);
            return;
        }
        k->rdlen = len;
        k->rdgot = 0;
        k->rdata = malloc(len);
        if (k->rdata == NULL) {
            uv_read_stop(st);
            weft__tcp_fail(tp, WEFT_ENOMEM, "rank %d: out of memory", tp->rank);
        }
        return;
    }
    k->rdgot += (size_t)nread;
    if (k->rdgot == k->rdlen) {
        rchunk *c = calloc(1, sizeof *c);
        if (c == NULL) {
            weft__tcp_fail(tp, WEFT_ENOMEM, "rank %d: out of memory", tp->rank);
            return;
        }
        c->src = weft__get_be32(k->rhdr + 4);
        c->dst = weft__get_be32(k->rhdr + 8);
        c->len = (uint32_t)k->rdlen;
        c->total = weft__get_be64(k->rhdr + 16);
        c->data = k->rdata;
        k->rdata = NULL;
        k->rhgot = 0;
        relay_chunk(k, c);
    }
}

int weft__tcp_relay_send(weft__tp *t, int to, weft__xfer *x)
{
    tcp_tp *tp = (tcp_tp *)t;
    int n = tp->nranks;
    int right_hops = (to - tp->rank + n) % n;
    int dir = right_hops <= n - right_hops ? 1 : 0;
    size_t nchunks = (x->len + RELAY_CHUNK - 1) / RELAY_CHUNK;

    if (tp->err != 0)
        return tp->err;
    if (tp->relay[0] == NULL)
        return weft__fail(tp->sink, WEFT_ENOTSUP,
                          "rank %d: no wires to rank %d, and no relay",
                          tp->rank, to);
    x->peer = to;
    x->got = nchunks; /* writes still to complete */
    for (size_t i = 0; i < nchunks; i++) {
        size_t off = i * RELAY_CHUNK;
        size_t len = x->len - off < RELAY_CHUNK ? x->len - off : RELAY_CHUNK;
        int rc = relay_write(tp, dir, (uint32_t)tp->rank, (uint32_t)to,
                             x->buf + off, (uint32_t)len, x->len, NULL, x);
        if (rc != 0) {
            weft__tcp_fail(
                tp, rc,
                "rank %d: cannot relay to rank %d: the relay connection "
                "to neighbour %d is down",
                tp->rank, to, tp->relay[dir]->c ? tp->relay[dir]->c->peer : -1);
            return tp->err;
        }
    }
    return WEFT_OK;
}

int weft__tcp_relay_recv(weft__tp *t, int from, weft__xfer *x)
{
    tcp_tp *tp = (tcp_tp *)t;
    weft__xfer **pp = &tp->rrecv;

    if (tp->err != 0)
        return tp->err;
    if (tp->relay[0] == NULL)
        return weft__fail(tp->sink, WEFT_ENOTSUP,
                          "rank %d: no wires to rank %d, and no relay",
                          tp->rank, from);
    x->peer = from;
    x->got = 0;
    x->tp_next = NULL;
    while (*pp != NULL)
        pp = (weft__xfer **)&(*pp)->tp_next;
    *pp = x;
    /* Chunks may be waiting already: progress() hands them over. */
    tp->relay_ready = 1;
    return WEFT_OK;
}
