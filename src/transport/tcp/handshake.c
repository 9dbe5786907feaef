/*
 * The TCP transport's handshake: accepting connections and connecting to
 * the lower ranks, the hello with the job token, its answer and the
 * acknowledgement, retries until the connect deadline, and the
 * handshake's own deadlines (the housekeeping timer). A connection that is
 * up is handed to the data path or the relay (conn_up).
 */
#include "transport/tcp/tcp.h"

#include "base/bytes.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

static void tell_on(conn *k, slot *s);
static void send_hello(conn *k);

static conn *conn_new(tcp_tp *tp)
{
    conn *k = calloc(1, sizeof *k);

    if (k == NULL)
        return NULL;
    k->tp = tp;
    k->peer = -1;
    k->wire = -1;
    k->via_link = -1;
    k->route = -1;
    if (uv_tcp_init(&tp->loop, &k->h) != 0) {
        free(k);
        return NULL;
    }
    k->h.data = k;
    tp->nopen++;
    return k;
}

static void pending_remove(tcp_tp *tp, conn *k)
{
    for (conn **pp = &tp->pending; *pp != NULL; pp = &(*pp)->next) {
        if (*pp == k) {
            *pp = k->next;
            k->next = NULL;
            return;
        }
    }
}

static void tune_socket(conn *k)
{
    int sz = k->tp->cfg->sockbuf_bytes;
    int wt = k->tp->cfg->wire_timeout_ms;
    uv_os_fd_t fd;

    uv_tcp_nodelay(&k->h, 1);
    /* A link that goes silent (a cable pulled at the far end, a port
     * gone) is noticed within WEFT_WIRE_TIMEOUT_MS: bytes sent or a
     * keepalive probe (one a second while nothing moves) unanswered that
     * long abort the connection (ETIMEDOUT). A stopped process's kernel
     * still answers both, so it is not a lost link. Loopback (ranks of
     * one host) has no link to lose: a loaded host must not fail it. */
    if (wt > 0 && k->peer >= 0 && k->wire >= 0 &&
        k->tp->peers[k->peer].s[k->wire].link != WEFT__LINK_LOOPBACK &&
        uv_fileno((uv_handle_t *)&k->h, &fd) == 0) {
        int one = 1;
        unsigned ut = weft__tcp_user_timeout(wt);

        uv_tcp_keepalive(&k->h, 1, 1);
        setsockopt(fd, IPPROTO_TCP, TCP_KEEPINTVL, &one, sizeof one);
        setsockopt(fd, IPPROTO_TCP, TCP_USER_TIMEOUT, &ut, sizeof ut);
    }
    /* A refusal (a capped system) only costs speed, so it is not an
     * error. 0 leaves the buffers to the kernel's autotuning. */
    if (sz > 0) {
        uv_send_buffer_size((uv_handle_t *)&k->h, &sz);
        sz = k->tp->cfg->sockbuf_bytes;
        uv_recv_buffer_size((uv_handle_t *)&k->h, &sz);
    }
}

static void housekeep_start(tcp_tp *tp)
{
    if (!uv_is_active((uv_handle_t *)&tp->housekeep) && !tp->shut)
        uv_timer_start(&tp->housekeep, weft__tcp_housekeep_cb, RETRY_MS,
                       RETRY_MS);
}

/* An outgoing connection in set-up broke (why): it is closed and tried
 * again after RETRY_MS, until the connect deadline. */
static void retry_later(conn *k, const char *why)
{
    tcp_tp *tp = k->tp;
    slot *s = &tp->peers[k->peer].s[k->wire];

    weft__log(WEFT__LOG_DEBUG, tp->rank,
              "wire %d to peer %d (%s): %s; trying again", k->wire, k->peer,
              k->name, why);
    /* k: only a connection in set-up is tried again */
    if (k->resume)
        s->resuming = NULL;
    else
        s->trying = NULL;
    s->next_try_ms = weft__now_ms() + RETRY_MS;
    weft__tcp_conn_close(k);
    housekeep_start(tp);
}

void weft__tcp_retry_later(conn *k, const char *why)
{
    retry_later(k, why);
}

void weft__tcp_housekeep_start(tcp_tp *tp)
{
    housekeep_start(tp);
}

/* An accepted connection lost before it was up (the peer gave the attempt
 * up): the slot it claimed is free again, for the peer's next attempt. */
static void slot_lost(conn *k, const char *why)
{
    tcp_tp *tp = k->tp;
    slot *s = &tp->peers[k->peer].s[k->wire];

    weft__log(WEFT__LOG_DEBUG, tp->rank,
              "wire %d from peer %d (%s) went away during set-up: %s", k->wire,
              k->peer, k->name, why);
    if (s->c == k)
        s->c = NULL;
    weft__tcp_conn_close(k);
}

static int token_equal(const uint8_t *a, const uint8_t *b)
{
    uint8_t d = 0;
    for (int i = 0; i < WEFT__TOKEN_BYTES; i++)
        d |= (uint8_t)(a[i] ^ b[i]);
    return d == 0;
}

/* The settings every rank must share (tp->wires; tp->shm between ranks
 * of one host, local), as a hello or an answer carries them at b: 0 if
 * the peer's agree with this rank's, else 1 with why (naming the
 * variable) in why. */
static int settings_differ(const tcp_tp *tp, const uint8_t *b, int other,
                           int local, char *why, size_t len)
{
    uint32_t wires = weft__get_be32(b), shm = weft__get_be32(b + 4);

    if (wires != tp->wires)
        snprintf(why, len,
                 "rank %d runs with %u wires per link and rank %d with %u: "
                 "set WEFT_WIRES (weftrun --wires) alike on every rank",
                 tp->rank, tp->wires, other, wires);
    else if (local && shm != tp->shm)
        snprintf(why, len,
                 "rank %d has shared memory %s and rank %d %s: set WEFT_SHM "
                 "alike on every rank",
                 tp->rank, tp->shm ? "on" : "off", other, shm ? "on" : "off");
    else
        return 0;
    return 1;
}

static void settings_pack(const tcp_tp *tp, uint8_t *b)
{
    weft__put_be32(b, tp->wires);
    weft__put_be32(b + 4, tp->shm);
}

/* The verdict at b (tcp.h): 0, or this rank's failure while it tells. */
static void verdict_pack(const tcp_tp *tp, uint8_t *b)
{
    weft__put_be32(b, tp->telling ? (uint32_t)tp->tell_code : 0);
    memset(b + 4, 0, TELL_WHY);
    if (tp->telling)
        snprintf((char *)b + 4, TELL_WHY, "%s", tp->tell_why);
}

/* A verdict from rank `from` at b: 0 where it has none; else this rank
 * fails with it (and tells its own peers, forwarding why as it is) and
 * 1. */
static int verdict_told(tcp_tp *tp, const uint8_t *b, int from)
{
    int code = (int)weft__get_be32(b);
    char why[TELL_WHY];

    if (code == 0)
        return 0;
    if (code > -1 || code < -64)
        code = WEFT_EPEER;
    memcpy(why, b + 4, TELL_WHY);
    why[TELL_WHY - 1] = '\0';
    if (tp->told != NULL && from >= 0 && from < tp->nranks)
        tp->told[from] = 1;
    if (tp->err == 0)
        snprintf(tp->tell_why, sizeof tp->tell_why, "%s", why);
    weft__tcp_fail(tp, code,
                   "%s (rank %d failed weft_init and told rank %d so)", why,
                   from, tp->rank);
    return 1;
}

/* Hello layout (network byte order): magic, version, from rank, to rank,
 * link, wire on link, the 16-byte token, the settings (wires, shm), the
 * verdict. The answer: magic, the answering rank, its settings, its
 * verdict. */
static void hello_pack(tcp_tp *tp, uint8_t *out, int to, const slot *s)
{
    weft__put_be32(out, HELLO_MAGIC);
    weft__put_be32(out + 4, HELLO_VERSION);
    weft__put_be32(out + 8, (uint32_t)tp->rank);
    weft__put_be32(out + 12, (uint32_t)to);
    weft__put_be32(out + 16, s->link);
    weft__put_be32(out + 20, s->lwire);
    memcpy(out + 24, tp->cfg->token, WEFT__TOKEN_BYTES);
    settings_pack(tp, out + 40);
    verdict_pack(tp, out + 48);
}

static void reject(conn *k, const char *why)
{
    tcp_tp *tp = k->tp;

    weft__log(WEFT__LOG_WARN, tp->rank,
              "rejected a connection from %s: %s (the job goes on)", k->name,
              why);
    pending_remove(tp, k);
    weft__tcp_conn_close(k);
}

static void hs_alloc_cb(uv_handle_t *h, size_t suggested, uv_buf_t *buf)
{
    conn *k = h->data;
    size_t want = k->state == CONN_HELLO_WAIT    ? HELLO_BYTES
                  : k->state == CONN_ACK_WAIT    ? ACK_BYTES
                  : k->state == CONN_SPLICE_WAIT ? SPLICE_OK_BYTES
                                                 : REPLY_BYTES;

    (void)suggested;
    /* Exactly the handshake: bytes after it belong to the data path. */
    buf->base = (char *)k->hbuf + k->hgot;
    buf->len = want - k->hgot;
}

static void reply_write_cb(uv_write_t *req, int status)
{
    conn *k = req->data;
    tcp_tp *tp = k->tp;

    weft__tcp_write_done(tp);
    if (k->telling) {
        weft__tcp_conn_close(k);
        return;
    }
    if (k->bad_settings) {
        /* The answer, which carries this rank's settings, is on its
         * way: the dialling side fails too, naming them. */
        if (!tp->shut)
            weft__tcp_fail(tp, WEFT_ECONFIG, "%s", k->why);
        return;
    }
    if (k->closing || tp->shut)
        return;
    if (status < 0 && k->state == CONN_ACK_WAIT)
        /* The peer gave the attempt up: it tries again. */
        slot_lost(k, uv_strerror(status));
}

/* Writes the answer to k's hello: magic, this rank, its settings. Returns
 * weft__tcp_write's result. */
static int send_answer(conn *k)
{
    tcp_tp *tp = k->tp;
    uv_buf_t b;

    weft__put_be32(k->out, REPLY_MAGIC);
    weft__put_be32(k->out + 4, (uint32_t)tp->rank);
    settings_pack(tp, k->out + 8);
    verdict_pack(tp, k->out + 16);
    weft__put_be64(k->out + REPLY_POS_AT,
                   k->resume ? tp->peers[k->peer].s[k->wire].c->rx_pos : 0);
    b = uv_buf_init((char *)k->out, REPLY_BYTES);
    k->hreq.data = k;
    return weft__tcp_write(tp, &k->hreq, (uv_stream_t *)&k->h, &b, 1,
                           reply_write_cb);
}

/* Peer `from` (lower) says its end of the wire (link, lwire) lost its
 * link: this end, which dials, pauses it (if it had not noticed) and
 * resumes it over the links left. */
static void nudged(tcp_tp *tp, int from, uint32_t link, uint32_t lwire)
{
    for (int w = 0; w < tp->peers[from].nslots; w++) {
        slot *s = &tp->peers[from].s[w];
        conn *k = s->c;

        if (!s->outgoing || s->link != link || s->lwire != lwire || k == NULL ||
            k->state != CONN_UP || k->paused || k->closing ||
            k->successor != NULL)
            continue;
        weft__log(WEFT__LOG_WARN, tp->rank,
                  "%swire %d to peer %d (%s): the peer says its link went "
                  "down",
                  s->relay ? "relay " : "", w, from, k->name);
        weft__tcp_pause(k, UV_ENETDOWN); /* the dialling end: no nudge */
    }
}

/* An accepted connection's hello is complete: check and place it. */
static void hello_done(conn *k)
{
    tcp_tp *tp = k->tp;
    uint32_t from = weft__get_be32(k->hbuf + 8);
    uint32_t to = weft__get_be32(k->hbuf + 12);
    uint32_t link = weft__get_be32(k->hbuf + 16);
    uint32_t lwire = weft__get_be32(k->hbuf + 20);
    slot *s = NULL;

    if (weft__get_be32(k->hbuf) != HELLO_MAGIC)
        return reject(k, "not a weft hello (bad magic)");
    if (weft__get_be32(k->hbuf + 4) != HELLO_VERSION)
        return reject(k, "unsupported protocol version");
    if (!token_equal(k->hbuf + 24, tp->cfg->token))
        return reject(k, "wrong job token (WEFT_JOB_TOKEN)");
    if (weft__get_be32(k->hbuf + HELLO_FLAGS_AT) & HELLO_NUDGE) {
        if (to != (uint32_t)tp->rank || from >= (uint32_t)tp->rank)
            return reject(k, "a nudge names ranks that do not connect here");
        pending_remove(tp, k);
        nudged(tp, (int)from, link, lwire);
        weft__tcp_conn_close(k);
        return;
    }
    if (to != (uint32_t)tp->rank || from >= (uint32_t)tp->nranks ||
        from <= (uint32_t)tp->rank)
        return reject(k, "hello names ranks that do not connect here");
    if (verdict_told(tp, k->hbuf + 48, (int)from) || tp->telling) {
        /* The peer failed and said why (this rank fails too), or this
         * rank did: the answer tells the peer; the connection is closed
         * once it is written. */
        uv_read_stop((uv_stream_t *)&k->h);
        pending_remove(tp, k);
        k->telling = 1;
        if (tp->told != NULL)
            tp->told[from] = 1;
        if (send_answer(k) != 0)
            weft__tcp_conn_close(k);
        return;
    }
    if (settings_differ(tp, k->hbuf + 40, (int)from,
                        link == WEFT__LINK_LOOPBACK, k->why, sizeof k->why)) {
        /* A rank of this job (the token says so) set up otherwise: answer
         * with this rank's settings, then fail (reply_write_cb). The
         * connection claims no slot and reads no more; it stays pending,
         * to be closed with the others. */
        uv_read_stop((uv_stream_t *)&k->h);
        k->bad_settings = 1;
        if (send_answer(k) != 0)
            weft__tcp_fail(tp, WEFT_ECONFIG, "%s", k->why);
        return;
    }
    for (int w = 0; w < tp->peers[from].nslots; w++) {
        slot *c = &tp->peers[from].s[w];
        if (!c->outgoing && c->link == link && c->lwire == lwire)
            s = c;
    }
    if (s == NULL)
        return reject(k, "hello names a link or wire this rank does not have");
    if (weft__get_be32(k->hbuf + HELLO_FLAGS_AT) & HELLO_RESUME) {
        /* The peer lost this wire's link: this side pauses it too (if it
         * had not noticed) and answers with how far it read. */
        int move = (weft__get_be32(k->hbuf + HELLO_FLAGS_AT) & HELLO_MOVE) != 0;

        if (s->c != NULL)
            s->c->peer_knows = 1; /* its resume says it lost the link */
        if (s->c == NULL || s->c->successor != NULL ||
            !(move && !s->c->paused ? weft__tcp_pause_to_move(s->c)
                                    : weft__tcp_pause(s->c, UV_ETIMEDOUT)))
            return reject(k, "hello resumes a wire this rank cannot resume");
        pending_remove(tp, k);
        k->peer = (int)from;
        k->wire = (int)(s - tp->peers[from].s);
        k->resume = 1;
        k->resume_pos = weft__get_be64(k->hbuf + HELLO_FLAGS_AT + 4);
        k->state = CONN_ACK_WAIT;
        k->hgot = 0;
        k->deadline_ms = weft__now_ms() + HANDSHAKE_MS;
        tune_socket(k);
        if (send_answer(k) != 0)
            weft__tcp_conn_close(k);
        return;
    }
    if (s->c != NULL)
        return reject(k, "hello names a wire that is already connected");
    pending_remove(tp, k);
    k->peer = (int)from;
    k->wire = (int)(s - tp->peers[from].s);
    s->c = k;
    /* Read on: the acknowledgement comes next, HANDSHAKE_MS at most. */
    k->state = CONN_ACK_WAIT;
    k->hgot = 0;
    k->deadline_ms = weft__now_ms() + HANDSHAKE_MS;
    tune_socket(k);
    if (send_answer(k) != 0)
        slot_lost(k, "cannot answer its hello");
}

static void ack_write_cb(uv_write_t *req, int status)
{
    conn *k = req->data;

    /* A failure shows on the wire's reads (the peer closed or reset). */
    (void)status;
    weft__tcp_write_done(k->tp);
}

/* A connection came up: it reads from now on, for good (a data wire
 * into its read-ahead while no receive is posted), so that the peer's
 * close is seen at once. */
static void conn_up(conn *k)
{
    tcp_tp *tp = k->tp;
    int relay = tp->peers[k->peer].s[k->wire].relay;
    int rc;

    if (relay)
        rc = uv_read_start((uv_stream_t *)&k->h, weft__tcp_relay_alloc_cb,
                           weft__tcp_relay_read_cb);
    else
        rc = uv_read_start((uv_stream_t *)&k->h, weft__tcp_data_alloc_cb,
                           weft__tcp_data_read_cb);
    if (rc != 0) {
        weft__tcp_fail(tp, WEFT_ETRANSPORT,
                       "rank %d: cannot read the %s connection to %d: %s",
                       tp->rank, relay ? "relay" : "data", k->peer,
                       uv_strerror(rc));
        return;
    }
    k->reading = !relay;
}

static void hs_read_cb(uv_stream_t *st, ssize_t nread, const uv_buf_t *buf)
{
    conn *k = st->data;
    tcp_tp *tp = k->tp;
    uv_buf_t b;

    (void)buf;
    if (nread == 0)
        return;
    if (nread < 0) {
        if (k->state == CONN_HELLO_WAIT)
            return reject(k, nread == UV_EOF ? "closed before its hello"
                                             : uv_strerror((int)nread));
        if (k->state == CONN_ACK_WAIT)
            return slot_lost(k, nread == UV_EOF
                                    ? "closed before it acknowledged"
                                    : uv_strerror((int)nread));
        /* Closed or reset before it answered: the listener may be the
         * peer's previous communicator, which rejects us or is going
         * away. Its next one will answer. */
        retry_later(k, nread == UV_EOF ? "closed before it answered"
                                       : uv_strerror((int)nread));
        return;
    }
    k->hgot += (size_t)nread;
    if (k->state == CONN_SPLICE_WAIT) {
        if (k->hgot < SPLICE_OK_BYTES)
            return;
        uv_read_stop(st);
        k->hgot = 0;
        if (weft__get_be32(k->hbuf) != SPLICE_OK) {
            retry_later(k, "not a weft splice answer");
            return;
        }
        send_hello(k);
        return;
    }
    if (k->state == CONN_HELLO_WAIT) {
        /* A rank that only looked whether this port answers. */
        if (k->hgot >= 4 && weft__get_be32(k->hbuf) == WEFT__PROBE_MAGIC) {
            pending_remove(tp, k);
            weft__tcp_conn_close(k);
            return;
        }
        /* A wire over a path through this rank's host: carried on. */
        if (k->hgot >= 4 && weft__get_be32(k->hbuf) == SPLICE_MAGIC) {
            if (k->hgot >= SPLICE_BYTES) {
                pending_remove(tp, k);
                weft__tcp_splice_take(k);
            }
            return;
        }
        /* Reject garbage as soon as its first word shows it. */
        if (k->hgot >= 4 && weft__get_be32(k->hbuf) != HELLO_MAGIC)
            return reject(k, "not a weft hello (bad magic)");
        if (k->hgot == HELLO_BYTES)
            hello_done(k);
        return;
    }
    if (k->state == CONN_ACK_WAIT) {
        if (k->hgot < ACK_BYTES)
            return;
        uv_read_stop(st);
        if (weft__get_be32(k->hbuf) != ACK_MAGIC)
            return slot_lost(k, "not a weft acknowledgement");
        k->state = CONN_UP;
        if (k->resume) {
            weft__tcp_takeover(tp->peers[k->peer].s[k->wire].c, k,
                               k->resume_pos);
            return;
        }
        conn_up(k);
        if (tp->telling && !tp->peers[k->peer].s[k->wire].relay)
            tell_on(k, &tp->peers[k->peer].s[k->wire]);
        return;
    }
    if (k->hgot == REPLY_BYTES) {
        uv_read_stop(st);
        if (weft__get_be32(k->hbuf) != REPLY_MAGIC ||
            weft__get_be32(k->hbuf + 4) != (uint32_t)k->peer) {
            weft__tcp_fail(
                tp, WEFT_EAUTH,
                "rank %d: %s answered wire %d's hello wrongly: not rank "
                "%d of this job",
                tp->rank, k->name, k->wire, k->peer);
            return;
        }
        if (verdict_told(tp, k->hbuf + 16, k->peer)) {
            retry_later(k, "the peer's set-up failed");
            return;
        }
        if (tp->telling) {
            /* Answered after this rank failed: tell it in a new hello. */
            retry_later(k, "this rank's set-up failed");
            return;
        }
        if (settings_differ(tp, k->hbuf + 8, k->peer,
                            tp->peers[k->peer].s[k->wire].link ==
                                WEFT__LINK_LOOPBACK,
                            k->why, sizeof k->why)) {
            weft__tcp_fail(tp, WEFT_ECONFIG, "%s", k->why);
            return;
        }
        /* Up on this side from here: the acknowledgement goes before any
         * data, and a close from now on is the peer leaving. */
        weft__put_be32(k->ack, ACK_MAGIC);
        b = uv_buf_init((char *)k->ack, ACK_BYTES);
        k->areq.data = k;
        if (weft__tcp_write(tp, &k->areq, st, &b, 1, ack_write_cb) != 0) {
            retry_later(k, "cannot acknowledge the answer");
            return;
        }
        k->state = CONN_UP;
        if (k->resume) {
            slot *rs = &tp->peers[k->peer].s[k->wire];

            rs->resuming = NULL;
            weft__tcp_takeover(rs->c, k,
                               weft__get_be64(k->hbuf + REPLY_POS_AT));
            return;
        }
        tp->peers[k->peer].s[k->wire].c = k;
        tp->peers[k->peer].s[k->wire].trying = NULL;
        conn_up(k);
    }
}

void weft__tcp_on_connection(uv_stream_t *server, int status)
{
    tcp_tp *tp = server->data;
    struct sockaddr_storage ss;
    int len = sizeof ss;
    conn *k;

    if (status < 0 || tp->shut)
        return;
    k = conn_new(tp);
    if (k == NULL)
        return;
    if (uv_accept(server, (uv_stream_t *)&k->h) != 0) {
        weft__tcp_conn_close(k);
        return;
    }
    strcpy(k->name, "?");
    if (uv_tcp_getpeername(&k->h, (struct sockaddr *)&ss, &len) == 0 &&
        ss.ss_family == AF_INET) {
        struct sockaddr_in *sin = (struct sockaddr_in *)&ss;
        char ip[INET_ADDRSTRLEN];
        uv_ip4_name(sin, ip, sizeof ip);
        snprintf(k->name, sizeof k->name, "%s:%d", ip, ntohs(sin->sin_port));
    }
    k->state = CONN_HELLO_WAIT;
    k->deadline_ms = weft__now_ms() + HANDSHAKE_MS;
    k->next = tp->pending;
    tp->pending = k;
    uv_read_start((uv_stream_t *)&k->h, hs_alloc_cb, hs_read_cb);
    housekeep_start(tp);
}

/* How long a dialled connection waits for an answer: while a wire is
 * resumed, not longer than the wire timeout (then over another link). */
static uint64_t answer_ms(const conn *k)
{
    const int wt = k->tp->cfg->wire_timeout_ms;

    return k->resume && wt > 0 && wt < HANDSHAKE_MS ? (uint64_t)wt
                                                    : HANDSHAKE_MS;
}

static void hello_write_cb(uv_write_t *req, int status)
{
    conn *k = req->data;

    weft__tcp_write_done(k->tp);
    if (k->telling) {
        if (status == 0 && k->tp->told != NULL)
            k->tp->told[k->peer] = 1;
        if (!k->closing)
            retry_later(k, "told the peer of this rank's failure");
        return;
    }
    if (status < 0 && !k->closing && !k->tp->shut &&
        k->state == CONN_REPLY_WAIT)
        retry_later(k, uv_strerror(status));
}

/* The hello of k, connected (over a path: the path answered). */
static void send_hello(conn *k)
{
    tcp_tp *tp = k->tp;
    slot *s = &tp->peers[k->peer].s[k->wire];
    uv_buf_t b;

    k->telling = tp->telling;
    if (k->resume == 2 && (s->c == NULL || !weft__tcp_pause_to_move(s->c))) {
        /* The wire is busy resuming, or gone: no move now. */
        retry_later(k, "its wire cannot move now");
        return;
    }
    hello_pack(tp, k->out, k->peer, s);
    if (k->resume) {
        /* It names the wire it resumes and says how far this side read. */
        weft__put_be32(k->out + HELLO_FLAGS_AT,
                       HELLO_RESUME | (k->resume == 2 ? HELLO_MOVE : 0));
        weft__put_be64(k->out + HELLO_FLAGS_AT + 4, s->c->rx_pos);
    }
    b = uv_buf_init((char *)k->out, HELLO_BYTES);
    k->hreq.data = k;
    k->state = CONN_REPLY_WAIT;
    k->deadline_ms = weft__now_ms() + answer_ms(k);
    if (weft__tcp_write(tp, &k->hreq, (uv_stream_t *)&k->h, &b, 1,
                        hello_write_cb) != 0 ||
        uv_read_start((uv_stream_t *)&k->h, hs_alloc_cb, hs_read_cb) != 0)
        retry_later(k, "cannot send the hello");
}

static void splice_write_cb(uv_write_t *req, int status)
{
    conn *k = req->data;

    weft__tcp_write_done(k->tp);
    if (status < 0 && !k->closing && !k->tp->shut &&
        k->state == CONN_SPLICE_WAIT)
        retry_later(k, uv_strerror(status));
}

static void connect_cb(uv_connect_t *req, int status)
{
    conn *k = req->data;
    tcp_tp *tp = k->tp;
    uv_buf_t b;

    if (k->closing || tp->shut)
        return;
    if (status < 0 && k->resume && status == UV_ECONNREFUSED && k->route < 0) {
        /* The peer listens for as long as its communicator lives: it is
         * gone. (Over a path, the refusal is the host between's.) */
        tp->lost_peer = k->peer;
        weft__tcp_fail(tp, WEFT_EPEER,
                       "rank %d: wire %d to peer %d lost its link, and "
                       "resuming it was refused (%s): the peer is gone",
                       tp->rank, k->wire, k->peer, k->name);
        return;
    }
    if (status < 0) {
        /* The peer may not listen yet: try again until the deadline. */
        retry_later(k, uv_strerror(status));
        return;
    }
    tune_socket(k);
    if (k->route < 0) {
        send_hello(k);
        return;
    }
    /* Over a path: the splice request, then its answer (the hosts between
     * reached the peer's), then the hello. */
    if (weft__tcp_splice_request(tp, k->peer, (uint32_t)k->route, k->sreq) !=
        0) {
        retry_later(k, "no path to the peer");
        return;
    }
    b = uv_buf_init((char *)k->sreq, SPLICE_BYTES);
    k->sreqw.data = k;
    k->state = CONN_SPLICE_WAIT;
    k->hgot = 0;
    k->deadline_ms = weft__now_ms() + answer_ms(k);
    if (weft__tcp_write(tp, &k->sreqw, (uv_stream_t *)&k->h, &b, 1,
                        splice_write_cb) != 0 ||
        uv_read_start((uv_stream_t *)&k->h, hs_alloc_cb, hs_read_cb) != 0)
        retry_later(k, "cannot send the splice request");
}

void weft__tcp_dial(tcp_tp *tp, int p, int w, const slot *path, int resume)
{
    slot *s = &tp->peers[p].s[w];
    const char *addr = path->addr;
    const int port = path->port;
    const uint32_t link = (uint32_t)weft__tcp_home_link(tp, p, path);
    struct sockaddr_in sa;
    conn *k;

    if (uv_ip4_addr(addr, port, &sa) != 0) {
        weft__tcp_fail(tp, WEFT_ECONFIG, "rank %d: bad address %s for peer %d",
                       tp->rank, addr, p);
        return;
    }
    k = conn_new(tp);
    if (k == NULL) {
        weft__tcp_fail(tp, WEFT_ENOMEM, "rank %d: out of memory", tp->rank);
        return;
    }
    k->peer = p;
    k->wire = w;
    k->resume = resume;
    if (link < (uint32_t)tp->cfg->nlinks && tp->cfg->links[link].nvia > 0)
        k->route = (int)link;
    k->state = CONN_CONNECTING;
    /* A resume or a move gives a link that does not answer a second
     * (resume.c), then tries again. */
    k->deadline_ms = weft__now_ms() + 1000;
    snprintf(k->name, sizeof k->name, "%s:%d", addr, port);
    k->creq.data = k;
    if (resume)
        s->resuming = k;
    else
        s->trying = k;
    if (uv_tcp_connect(&k->creq, &k->h, (struct sockaddr *)&sa, connect_cb) !=
        0)
        retry_later(k, "cannot start connecting");
}

static void nudge_write_cb(uv_write_t *req, int status)
{
    conn *k = req->data;

    (void)status;
    weft__tcp_write_done(k->tp);
    weft__tcp_conn_close(k);
}

static void nudge_connect_cb(uv_connect_t *req, int status)
{
    conn *k = req->data;
    tcp_tp *tp = k->tp;
    uv_buf_t b = uv_buf_init((char *)k->out, HELLO_BYTES);

    if (k->closing || tp->shut)
        return;
    k->hreq.data = k;
    if (status < 0 || weft__tcp_write(tp, &k->hreq, (uv_stream_t *)&k->h, &b, 1,
                                      nudge_write_cb) != 0)
        weft__tcp_conn_close(k);
}

void weft__tcp_nudge(tcp_tp *tp, int p, int w)
{
    const weft__config *cfg = tp->cfg;
    const slot *s = &tp->peers[p].s[w];
    const int port = weft__config_rank_port(cfg, p);
    struct sockaddr_in sa;
    const char *addr = NULL;
    /* The link the lost connection ran on (a relay connection's is its
     * neighbour's first wire's, or where it was resumed). */
    const uint32_t lost = s->c != NULL && s->c->via_link >= 0
                              ? (uint32_t)s->c->via_link
                              : s->link;
    conn *k;

    /* The peer's address on another link whose wire to it is up. */
    for (int u = 0; u < tp->peers[p].nwires && addr == NULL; u++) {
        const slot *o = &tp->peers[p].s[u];
        uint32_t on;
        const weft__link *lk;

        if (o->c == NULL || o->c->state != CONN_UP || o->c->paused)
            continue;
        on = o->c->via_link >= 0 ? (uint32_t)o->c->via_link : o->link;
        if (on == lost || on >= (uint32_t)cfg->nlinks ||
            cfg->links[on].nvia > 0)
            continue; /* loopback too, and paths (no address of the peer) */
        lk = &cfg->links[on];
        addr = weft__link_addr(lk, cfg->rank_host[p]);
    }
    if (addr == NULL || uv_ip4_addr(addr, port, &sa) != 0 ||
        (k = conn_new(tp)) == NULL)
        return; /* the peer notices by itself */
    hello_pack(tp, k->out, p, s);
    weft__put_be32(k->out + HELLO_FLAGS_AT, HELLO_NUDGE);
    k->state = CONN_CONNECTING;
    snprintf(k->name, sizeof k->name, "%s:%d", addr, port);
    k->creq.data = k;
    if (uv_tcp_connect(&k->creq, &k->h, (struct sockaddr *)&sa,
                       nudge_connect_cb) != 0)
        weft__tcp_conn_close(k);
}

/* Another data wire to peer p, to another address than slot w's (another
 * link), that is up over its own link: the slot, or NULL. */
static const slot *other_link_up(const tcp_tp *tp, int p, int w)
{
    const slot *s = &tp->peers[p].s[w];

    for (int u = 0; u < tp->peers[p].nwires; u++) {
        const slot *o = &tp->peers[p].s[u];

        if (u != w && strcmp(o->addr, s->addr) != 0 && o->c != NULL &&
            o->c->state == CONN_UP && o->alt_link < 0)
            return o;
    }
    return NULL;
}

/* Where slot w of peer p has been tried since first_try_ms for the wire
 * timeout and more without coming up, while another link to the peer has
 * a wire up: that wire's slot, to make w over (a link lost during
 * weft_init); else NULL. */
static const slot *detour(const tcp_tp *tp, int p, int w, uint64_t now)
{
    const slot *s = &tp->peers[p].s[w];

    if (tp->cfg->wire_timeout_ms <= 0 || s->link == WEFT__LINK_LOOPBACK ||
        s->first_try_ms == 0 ||
        now - s->first_try_ms < (uint64_t)tp->cfg->wire_timeout_ms)
        return NULL;
    return other_link_up(tp, p, w);
}

/* Dials slot w of peer p: over its own link, or, where that has not
 * answered within the wire timeout while another link to the peer has a
 * wire up (a link lost during weft_init), over that other link: the wire
 * comes up there (the peer pairs it by the link and wire its hello
 * names, not by the address it came to), and moves to its own link once
 * that answers (resume.c). */
static void start_connect(tcp_tp *tp, int p, int w)
{
    slot *s = &tp->peers[p].s[w];
    const uint64_t now = weft__now_ms();
    const int was = s->alt_link;
    const slot *via;

    if (s->first_try_ms == 0)
        s->first_try_ms = now;
    s->alt_link = -1;
    if ((via = detour(tp, p, w, now)) != NULL) {
        if (was != (int)via->link)
            weft__log(WEFT__LOG_WARN, tp->rank,
                      "wire %d to peer %d: its link (%s) did not answer "
                      "within %d ms; made over %s instead, until it does",
                      w, p, s->addr, tp->cfg->wire_timeout_ms, via->addr);
        s->alt_link = (int)via->link;
        weft__tcp_dial(tp, p, w, via, 0);
        return;
    }
    weft__tcp_dial(tp, p, w, s, 0);
}

void weft__tcp_housekeep_cb(uv_timer_t *t)
{
    tcp_tp *tp = t->data;
    uint64_t now = weft__now_ms();
    conn *k, *next;
    int busy = 0;

    if (tp->shut) {
        uv_timer_stop(t);
        return;
    }

    for (k = tp->pending; k != NULL; k = next) {
        next = k->next;
        if (now >= k->deadline_ms)
            reject(k, "no hello within the handshake deadline");
    }
    for (int p = 0; p < tp->nranks; p++) {
        for (int w = 0; w < tp->peers[p].nslots; w++) {
            slot *s = &tp->peers[p].s[w];
            if (!s->outgoing && s->c != NULL && s->c->state == CONN_ACK_WAIT) {
                busy = 1;
                if (now >= s->c->deadline_ms)
                    slot_lost(s->c, "no acknowledgement of the answer");
                continue;
            }
            if (!s->outgoing || s->c != NULL)
                continue;
            busy = 1;
            /* A listener that holds the hello without answering (the
             * peer's previous communicator, with the connection in its
             * backlog) is given HANDSHAKE_MS. */
            if (s->trying != NULL &&
                (s->trying->state == CONN_REPLY_WAIT ||
                 s->trying->state == CONN_SPLICE_WAIT) &&
                now >= s->trying->deadline_ms)
                retry_later(s->trying, "no answer to its hello");
            /* A connect that hangs on a link that drops everything, past
             * the wire timeout, while another link could carry the wire:
             * given up, to be made over that link. */
            if (s->trying != NULL && s->trying->state == CONN_CONNECTING &&
                s->alt_link < 0 && detour(tp, p, w, now) != NULL)
                retry_later(s->trying, "its link does not answer");
            if (s->trying == NULL && now >= s->next_try_ms &&
                (tp->err == 0 ||
                 (tp->telling && tp->told != NULL && !tp->told[p])))
                start_connect(tp, p, w);
        }
    }
    busy |= weft__tcp_resume_housekeep(tp, now);
    if (!busy && tp->pending == NULL)
        uv_timer_stop(t);
}

/* ---- telling the peers of a failed set-up ----
 *
 * A rank whose weft_init fails before its wires are all up (settings that
 * differ, a peer that told it of its own failure, a peer that left) tells
 * every peer it can reach before it closes, so that the job's other
 * ranks fail at once with the cause instead of waiting for the connect
 * deadline: a connection that is up gets a notice on it; a peer this
 * rank dials gets the verdict in a hello, one that dials it in the
 * answer. A peer told fails too and tells its own peers, forwarding the
 * first cause. */

static void notice_write_cb(uv_write_t *req, int status)
{
    conn *k = req->data;
    tcp_tp *tp = k->tp;

    weft__tcp_write_done(tp);
    if (status == 0 && tp->told != NULL)
        tp->told[k->peer] = 1;
    weft__tcp_conn_close(k);
}

/* Tells the peer of k, a connection that is up, with a notice; k leaves
 * its slot and is closed once the notice is written. */
static void tell_on(conn *k, slot *s)
{
    tcp_tp *tp = k->tp;
    uv_buf_t b;

    s->c = NULL;
    weft__put_be32(k->out, NOTICE_MAGIC);
    weft__put_be32(k->out + 4, (uint32_t)tp->tell_code);
    memset(k->out + 8, 0, TELL_WHY);
    snprintf((char *)k->out + 8, TELL_WHY, "%s", tp->tell_why);
    b = uv_buf_init((char *)k->out, NOTICE_BYTES);
    k->hreq.data = k;
    if (weft__tcp_write(tp, &k->hreq, (uv_stream_t *)&k->h, &b, 1,
                        notice_write_cb) != 0)
        weft__tcp_conn_close(k);
}

void weft__tcp_tell_start(tcp_tp *tp, uint64_t deadline_ms)
{
    uint64_t until = weft__now_ms() + TELL_MS;

    tp->telling = 1;
    tp->tell_code = tp->err;
    if (tp->tell_why[0] == '\0')
        snprintf(tp->tell_why, sizeof tp->tell_why, "%.*s", TELL_WHY - 1,
                 tp->sink->msg);
    tp->tell_until = until < deadline_ms ? until : deadline_ms;
    if (tp->told == NULL &&
        (tp->told = calloc((size_t)tp->nranks, 1)) == NULL) {
        tp->tell_until = 0; /* no room to tell: give up at once */
        return;
    }
    for (int p = 0; p < tp->nranks; p++) {
        if (p == tp->rank || tp->peers[p].nslots == 0)
            tp->told[p] = 1; /* no wire of its own to this rank */
        for (int w = 0; w < tp->peers[p].nslots && !tp->told[p]; w++) {
            slot *s = &tp->peers[p].s[w];

            /* One waiting for its acknowledgement is told once it is up
             * (hs_read_cb): the peer is up on its side already. */
            if (s->c != NULL && s->c->state == CONN_UP && !s->relay)
                tell_on(s->c, s);
        }
    }
    housekeep_start(tp);
}

int weft__tcp_tell_done(const tcp_tp *tp)
{
    if (weft__now_ms() >= tp->tell_until)
        return 1;
    for (int p = 0; p < tp->nranks; p++)
        if (!tp->told[p])
            return 0;
    return 1;
}

void weft__tcp_setup_closed(conn *k)
{
    tcp_tp *tp = k->tp;
    const uint8_t *b = (const uint8_t *)k->rxb + k->rx_lo;

    if (tp->err != 0)
        return;
    if (k->rxb != NULL && k->rx_hi - k->rx_lo >= NOTICE_BYTES &&
        weft__get_be32(b) == NOTICE_MAGIC) {
        verdict_told(tp, b + 4, k->peer);
        return;
    }
    tp->lost_peer = k->peer;
    weft__tcp_fail(tp, WEFT_EPEER,
                   "rank %d: peer %d closed wire %d (%s) before weft_init "
                   "ended (its weft_init failed, or it died)",
                   tp->rank, k->peer, k->wire, k->name);
}
