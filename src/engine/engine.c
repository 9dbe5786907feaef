/*
 * The pipeline engine; see engine.h.
 *
 * State is kept per lane and per wire: a send cursor (step, frame of the
 * wire's region) and a receive cursor, each with a FIFO of frames in flight.
 * Frames on one wire complete in order, so the receive side's "done" point
 * is a single (step, end offset) pair per wire, and a send frame that
 * depends on received bytes checks exactly the wires whose regions overlap
 * it. Every cursor advances only within its own wire's region, so no frame
 * is ever posted past the end of a region and no wire waits for a frame
 * its peer will not send.
 */
#include "engine/engine.h"

#include "base/bytes.h"
#include "base/kernels.h"
#include "engine/plan.h"
#include "engine/pool.h"
#include "engine/reducer.h"
#include "transport/transport.h"

#include <assert.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define HDR_MAGIC 0x57464f50u /* "WFOP" */
#define HDR_BYTES 52
/* The bytes ranks must agree on; the hint after them may differ. */
#define HDR_MATCH_BYTES 48
/* A wire's first data frame of a pass, up to this size, travels in one
 * transfer with the header before it (see "headers" below). */
#define HDR_DATA_BYTES 1024
/* The tag of a header on a check channel, and of a relayed message's. */
#define TAG_CHECK 0xffffu
#define TAG_RELAY 0xfffeu
#define FIFO_CAP 8 /* > max(SEND_DEPTH, RECV_DEPTH, RECV_DEPTH_REDUCER) */
/* Staging slots per lane and wire, for either receive depth. */
#define STAGE_SLOTS                                                            \
    (WEFT__RECV_DEPTH > WEFT__RECV_DEPTH_REDUCER ? WEFT__RECV_DEPTH            \
                                                 : WEFT__RECV_DEPTH_REDUCER)
_Static_assert(FIFO_CAP > WEFT__SEND_DEPTH && FIFO_CAP > STAGE_SLOTS,
               "a wire's FIFOs hold every frame it may have in flight");

#define container_of(ptr, type, member)                                        \
    ((type *)(void *)((char *)(ptr)-offsetof(type, member)))

struct wstate;

/* A received frame handed to the reducer thread (reducer.h): once the
 * job is back, bytes [a, end) of step `step` count as received on the
 * wire, as they would have right after an inline reduction. */
typedef struct rframe {
    weft__rjob job;
    struct wstate *ws;
    int step;
    size_t end;
} rframe;

/* An operation header, decoded (see "headers" below). */
typedef struct ophdr {
    uint32_t magic;
    uint32_t kind, dtype, redop, pass; /* one byte each on the wire */
    uint32_t tag;
    int32_t root;
    uint64_t seq, count, total;
    uint64_t parts; /* weft__call.parts */
    uint32_t hint;  /* the sender's weft__call.hint when it sent this */
} ophdr;

typedef struct frame {
    weft__xfer x; /* what the transport hands back (container_of) */
    struct wstate *ws;
    int step;
    int hdr;  /* a channel header, not data (a send's may carry the wire's
                 first data frame behind it) */
    size_t a; /* offset in the step's buffer */
    size_t len;
    int slot; /* staging slot of a reduced frame, -1 if none */
} frame;

/* A place in a wire's send queue (txq): a lane's wire or a check
 * channel waiting to start its bytes on the stream. */
typedef struct txw {
    struct txw *next;
    struct wstate *ws; /* or */
    struct check *k;
} txw;

typedef struct wstate {
    struct weft__pass *run;
    int lane;
    int w;
    /* send side */
    int s_step;
    size_t s_frame; /* next frame of the step's region on this wire */
    int s_hdr;
    int s_queued; /* waits in the wire's send queue (txq) */
    int s_head, s_count;
    /* receive side */
    int r_step;
    size_t r_frame;
    int r_hdr;   /* its header came (and was checked) */
    int r_asked; /* it waits for its header from the wire's reader (rxq) */
    int r_owns;  /* the wire's stream is its own until its frames are posted */
    struct unexp *r_unexp; /* its message, read early, still arriving */
    int r_head, r_count;
    int r_slot;
    /* Frames received but not yet done: with the reducer, rj[j_head] and
     * the r_reducing - 1 after it, in the wire's order. Each holds its
     * staging slot (if it has one) until it is done. */
    int r_reducing;
    int j_head;
    int d_step;   /* last step with a completed frame, -1 if none */
    size_t d_end; /* end offset in that step's buffer of the done frames */
    /* From here on, each is written before it is read (a pass starts by
     * zeroing what is above only). */
    frame s_fr[FIFO_CAP];
    frame r_fr[FIFO_CAP];
    rframe rj[FIFO_CAP];
    struct txw s_wait; /* its place in the wire's send queue */
    uint8_t s_hdrbuf[HDR_BYTES + HDR_DATA_BYTES];
    uint8_t r_hdrbuf[HDR_BYTES];
} wstate;

struct weft__engine {
    size_t frame_bytes;
    int maxw;
    /* staging: [lane][wire][slot], frame_bytes each, allocated on demand */
    char **stage;
    struct weft__pass *spare; /* the last pass's memory, for the next */
    weft__reducer *reducer;   /* started with the first frame it reduces */
    int reducer_failed;       /* it could not start: reduce inline */
    /* Each wire's two streams as passes share them ("sharing wires"
     * below): [peer * maxw + wire]. */
    struct rxq *rx;
    struct txq *tx;
    size_t unexp_bytes; /* held by messages read before their receive */
};

/* A check channel: headers only, exchanged on wire 0 with a peer that a
 * collective pass moves no data to (or from), so that every rank compares
 * its call with its neighbours' even where data flows one way (the root
 * of a broadcast receives nothing, yet must not return WEFT_OK when its
 * neighbours named another root), and sees a dead neighbour. */
typedef struct check {
    struct weft__pass *run;
    int peer;
    int send, recv; /* this pass sends (receives) a check header */
    int sent, got;  /* ... and it completed */
    int asked;      /* it waits for its header from the wire's reader */
    txw s_wait;     /* its place in wire 0's send queue */
    weft__xfer sx, rx;
    uint8_t sbuf[HDR_BYTES], rbuf[HDR_BYTES];
} check;

/* One of the four transfers of a relayed message: its header or its
 * bytes, one way or the other. */
typedef struct relay_xfer {
    weft__xfer x;
    int done;
} relay_xfer;

/* An engine pass in flight (weft__pass, engine.h). */
typedef struct weft__pass {
    weft__ctx *c;
    weft__call *k;
    size_t frame;
    int rdepth; /* receives in flight per wire, with those being reduced */
    int bulk;   /* its sends may leave from a transport's thread (xfer) */
    int err;
    int pass; /* this pass's number in the call */
    int nchecks;
    unsigned waits; /* weft__pass_wait's calls */
    /* Relayed point to point (see below): the peers, -1 for a way that
     * is left out; the transfers are at the end. */
    int rdst, rsrc;
    /* A box pass (weft__box_start): no lanes; its message is published
     * (box_put), box_left peers' messages still to come (box_got: which
     * came), each landing at box_out + peer * box_len. */
    int box;
    int box_put;
    int box_waited; /* the transport watches the box for it */
    int box_left;
    uint64_t box_got;
    size_t box_len;
    char *box_out;
    /* A pass starts by zeroing what is above; below, what it sets for
     * each of its op's lanes, and what the engine's spare pass keeps for
     * the next one. */
    weft__op op;             /* its lanes; the pass owns their steps */
    int sw[WEFT__MAX_LANES]; /* wires to the lane's send peer */
    int rw[WEFT__MAX_LANES]; /* wires to the lane's receive peer */
    uint64_t sseq[WEFT__MAX_LANES];
    uint64_t rseq[WEFT__MAX_LANES];
    uint64_t stotal[WEFT__MAX_LANES];
    uint64_t rtotal[WEFT__MAX_LANES];
    wstate *ws[WEFT__MAX_LANES]; /* max(sw, rw) entries per lane, in wsmem */
    /* The wires' states (wscap of them), and the check channels, each
     * zeroed when planned. */
    wstate *wsmem;
    size_t wscap;
    check checks[WEFT__MAX_LANES * 2];
    /* Relayed point to point: each way, a header then bytes, done from
     * the start for a way that is left out (every pass sets the done
     * flags); the rest is zeroed only by a pass that relays (most never
     * do: a pass started by zeroing 480 bytes, 2% of an 8-byte
     * all_reduce). */
    relay_xfer rl_sh, rl_sx, rl_rh, rl_rx;
    uint8_t rl_shdr[HDR_BYTES], rl_rhdr[HDR_BYTES];
    ophdr rl_want;
    /* A box pass's message: its header, then its data. */
    uint8_t box_msg[WEFT__BOX_MSG_MAX];
} run;

static void pump_lane(run *r, int lane);
static int box_poll(run *r);
static int box_wait(run *r);
static void box_announce(run *r);

/* How many wire states lane l has: one per wire it sends or receives on. */
static int lane_wires(const run *r, int l)
{
    return r->sw[l] > r->rw[l] ? r->sw[l] : r->rw[l];
}

/* Frees a pass's memory, the engine's spare included. */
static void pass_destroy(weft__pass *r)
{
    if (r != NULL)
        free(r->wsmem);
    free(r);
}

/* Wire w's region of a step of len bytes over nw wires; len 0 or an unused
 * wire gives an empty region. */
static weft__region step_region(const run *r, size_t len, int nw, int w)
{
    weft__region reg = {0, 0};
    int used;

    if (len == 0 || nw <= 0)
        return reg;
    used = weft__plan_wires(len, nw, r->c->cfg->min_wire_bytes);
    if (w >= used)
        return reg;
    return weft__plan_region(len, used, r->op.esize, w);
}

static int fail_into(weft__ctx *c, int *result, int err, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

/* Records a failure on the communicator's one error record and makes it
 * the result of the pass (*result) unless it has one: whatever that
 * record holds, the first cause. */
static int fail_into(weft__ctx *c, int *result, int err, const char *fmt, ...)
{
    va_list ap;

    va_start(ap, fmt);
    err = weft__vfail(&c->fail, err, fmt, ap);
    va_end(ap);
    if (*result == 0)
        *result = err;
    return *result;
}

#define engine_fail(r, ...) fail_into((r)->c, &(r)->err, __VA_ARGS__)

static char *stage_slot(run *r, int lane, int w, int slot)
{
    struct weft__engine *e = r->c->eng;
    size_t i = ((size_t)lane * (size_t)e->maxw + (size_t)w) * STAGE_SLOTS +
               (size_t)slot;

    if (e->stage[i] == NULL)
        e->stage[i] = malloc(e->frame_bytes);
    return e->stage[i];
}

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

/* ---- headers ----
 *
 * Every channel of a pass (each wire of a lane, each check channel, each
 * relayed message) starts with a header that says which call the sender
 * is in: the call's kind, dtype, op, count and root, its sequence number
 * (collectives: the communicator's count of them; point to point: the
 * pair's count of messages that way), the pass within the call, the
 * channel's tag and the bytes that follow on it, and the digest of the
 * operations a batch is made of. A receiver compares it
 * with its own before it uses a byte after it, so ranks that called
 * different things fail with WEFT_EMISMATCH, and bytes an earlier
 * mismatched call left on a wire never pass for a later call's.
 *
 * A wire's first data frame of a pass, where it is at most HDR_DATA_BYTES
 * and its bytes are ready, leaves in the same transfer as the header: the
 * sender copies it behind the header (a post and a completion fewer for
 * small operations). A wire is a byte stream (transport.h), so the bytes
 * are the same as with two transfers and the receiver needs to know
 * nothing of it. The receiver still takes the header alone: were it to
 * wait for the header and the frame in one transfer, a peer that called
 * with a smaller count would never send them all, and this rank would
 * report the peer's leaving (or its deadline) instead of the mismatch.
 *
 * After what must match, a header carries the sender's hint (engine.h,
 * weft__call.hint): a receiver keeps the smaller of its own and the one
 * it got, so a call whose passes hear from every rank ends with the same
 * minimum on every rank. */

static ophdr hdr_make(const weft__call *k, int pass, uint32_t tag, uint64_t seq,
                      uint64_t total)
{
    ophdr h = {
        .magic = HDR_MAGIC,
        .kind = (uint32_t)k->kind & 0xff,
        .dtype = (uint32_t)k->dtype & 0xff,
        .redop = (uint32_t)k->redop & 0xff,
        .pass = (uint32_t)pass & 0xff,
        .tag = tag,
        .root = k->root,
        .seq = seq,
        .count = k->count,
        .total = total,
        .parts = k->parts,
        .hint = k->hint,
    };
    return h;
}

static void hdr_encode(uint8_t *b, const ophdr *h)
{
    weft__put_le32(b, h->magic);
    b[4] = (uint8_t)h->kind;
    b[5] = (uint8_t)h->dtype;
    b[6] = (uint8_t)h->redop;
    b[7] = (uint8_t)h->pass;
    weft__put_le32(b + 8, h->tag);
    weft__put_le32(b + 12, (uint32_t)h->root);
    weft__put_le64(b + 16, h->seq);
    weft__put_le64(b + 24, h->count);
    weft__put_le64(b + 32, h->total);
    weft__put_le64(b + 40, h->parts);
    weft__put_le32(b + 48, h->hint);
}

static void hdr_decode(const uint8_t *b, ophdr *h)
{
    h->magic = weft__get_le32(b);
    h->kind = b[4];
    h->dtype = b[5];
    h->redop = b[6];
    h->pass = b[7];
    h->tag = weft__get_le32(b + 8);
    h->root = (int32_t)weft__get_le32(b + 12);
    h->seq = weft__get_le64(b + 16);
    h->count = weft__get_le64(b + 24);
    h->total = weft__get_le64(b + 32);
    h->parts = weft__get_le64(b + 40);
    h->hint = weft__get_le32(b + 48);
}

/* "broadcast(count 1024, float32, root 1) #7", for messages. */
static void hdr_describe(const ophdr *h, char *out, size_t len)
{
    static const char *kinds[] = {
        "?",         "all_reduce", "all_gather", "reduce_scatter",
        "broadcast", "send/recv",  "barrier"};
    static const char *dtypes[] = {"int8",    "uint8",  "int32",   "uint32",
                                   "int64",   "uint64", "float16", "bfloat16",
                                   "float32", "float64"};
    static const char *ops[] = {"sum", "prod", "min", "max"};
    char extra[48] = "";
    size_t n;

    if (h->redop < 4)
        snprintf(extra, sizeof extra, ", %s", ops[h->redop]);
    n = strlen(extra);
    if (h->root >= 0)
        snprintf(extra + n, sizeof extra - n, ", root %d", (int)h->root);
    snprintf(out, len, "%s(count %llu, %s%s) #%llu",
             h->kind < 7 ? kinds[h->kind] : "?", (unsigned long long)h->count,
             h->dtype < 10 ? dtypes[h->dtype] : "?", extra,
             (unsigned long long)h->seq);
}

/* Compares a received header with the one this rank expects from peer on
 * wire w; a difference fails the pass with a message that names both
 * calls. Returns 0 when they match. */
static int hdr_check(run *r, const uint8_t *got, const ophdr *want, int peer,
                     int w)
{
    weft__ctx *c = r->c;
    int *result = &r->err;
    uint8_t wb[HDR_BYTES];
    char mine[128], theirs[128];
    ophdr g;

    hdr_encode(wb, want);
    if (memcmp(wb, got, HDR_MATCH_BYTES) == 0) {
        uint32_t hint = weft__get_le32(got + HDR_MATCH_BYTES);

        if (hint < r->k->hint)
            r->k->hint = hint;
        return 0;
    }
    hdr_decode(got, &g);
    hdr_describe(want, mine, sizeof mine);
    if (g.magic != HDR_MAGIC)
        return fail_into(c, result, WEFT_EMISMATCH,
                         "rank %d: %s: peer %d sent bytes that are no "
                         "operation header on wire %d, where this rank "
                         "expected the start of %s (data an earlier "
                         "call with mismatched arguments left on the "
                         "wire?)",
                         c->rank, r->k->name, peer, w, mine);
    hdr_describe(&g, theirs, sizeof theirs);
    if (strcmp(mine, theirs) == 0 && g.parts != want->parts)
        return fail_into(c, result, WEFT_EMISMATCH,
                         "rank %d: peer %d ran %s as a batch of other "
                         "operations than this rank's (the counts of "
                         "consecutive all_reduces differ between ranks): "
                         "ranks must call the same collectives with the "
                         "same count, dtype, op and root, in the same order",
                         c->rank, peer, mine);
    if (strcmp(mine, theirs) != 0)
        return fail_into(c, result, WEFT_EMISMATCH,
                         "rank %d: peer %d called %s while this rank "
                         "called %s: ranks must call the same collectives "
                         "with the same count, dtype, op and root, in the "
                         "same order",
                         c->rank, peer, theirs, mine);
    return fail_into(c, result, WEFT_EMISMATCH,
                     "rank %d: %s: peer %d on wire %d is at pass %u, tag "
                     "%u with %llu bytes where this rank is at pass %u, "
                     "tag %u with %llu bytes (the ranks chose different "
                     "algorithms: mismatched thresholds or topology?)",
                     c->rank, mine, peer, w, g.pass, g.tag,
                     (unsigned long long)g.total, want->pass, want->tag,
                     (unsigned long long)want->total);
}

/* The header of lane `lane`'s sends (is_send) or receives. */
static ophdr lane_hdr(const run *r, int lane, int is_send)
{
    return hdr_make(r->k, r->pass, (uint32_t)r->op.lanes[lane].tag,
                    is_send ? r->sseq[lane] : r->rseq[lane],
                    is_send ? r->stotal[lane] : r->rtotal[lane]);
}

/* ---- the reducer thread ----
 *
 * A reduced frame that arrives is reduced inline by the thread that runs
 * the transport, unless the configuration hands frames of its size to the
 * reducer (reducer.h): then the driver goes back to the sockets at once,
 * and the frame is done (its bytes may leave in a later step, its staging
 * slot is posted again) only once the reducer has finished it and the
 * driver has taken it back (reap). A wire's frames are done in its order:
 * while any of its frames is with the reducer, the frames that arrive
 * after it on that wire follow it there, the ones with nothing to reduce
 * as empty jobs. */

static void reducer_wake(void *arg)
{
    weft__ctx *c = arg;

    c->tpo->wake(c->tp);
}

/* Does frame f, just received on ws, go to the reducer? */
static int reduce_later(run *r, const wstate *ws, const frame *f)
{
    struct weft__engine *e = r->c->eng;
    const weft__config *cfg = r->c->cfg;

    if (ws->r_reducing > 0)
        return 1;
    if (f->slot < 0 || r->op.inline_reduce || !cfg->reduce_thread ||
        f->len < cfg->reduce_thread_min_bytes || e->reducer_failed)
        return 0;
    /* Without the thread the frame is reduced inline, as before: slower,
     * never wrong, so this is no failure of the call. */
    if (e->reducer == NULL &&
        weft__reducer_create(reducer_wake, r->c, &e->reducer) != WEFT_OK)
        e->reducer_failed = 1;
    return e->reducer != NULL;
}

/* Hands frame f of step st, received on ws, to the reducer. */
static void reduce_post(run *r, wstate *ws, const frame *f,
                        const weft__step *st)
{
    rframe *rf = &ws->rj[(ws->j_head + ws->r_reducing) % FIFO_CAP];

    memset(rf, 0, sizeof *rf);
    rf->ws = ws;
    rf->step = f->step;
    rf->end = f->a + f->len;
    if (f->slot >= 0) {
        rf->job.dst = st->recv_dst + f->a;
        rf->job.a = st->recv_a + f->a;
        rf->job.b = stage_slot(r, ws->lane, ws->w, f->slot);
        rf->job.count = f->len / r->op.esize;
        rf->job.dtype = r->op.dtype;
        rf->job.op = r->op.redop;
    }
    ws->r_reducing++;
    weft__reducer_post(r->c->eng->reducer, &rf->job);
}

/* Takes back the frames the reducer has finished: each is done on its
 * wire, and its lane posts what that allows. Returns 1 if any came. */
static int reap(run *r)
{
    weft__rjob *j = weft__reducer_take(r->c->eng->reducer), *next;
    char touched[WEFT__MAX_LANES] = {0};
    int any = j != NULL;

    for (; j != NULL; j = next) {
        rframe *rf = container_of(j, rframe, job);
        wstate *ws = rf->ws;

        next = j->next;
        assert(ws->r_reducing > 0 && &ws->rj[ws->j_head] == rf);
        /* Only the collective reduces: every job is its pass's. */
        assert(ws->run == r || r->k->kind == WEFT__OP_P2P);
        r = ws->run;
        ws->j_head = (ws->j_head + 1) % FIFO_CAP;
        ws->r_reducing--;
        ws->d_step = rf->step;
        ws->d_end = rf->end;
        touched[ws->lane] = 1;
    }
    for (int l = 0; any && l < r->op.nlanes && r->err == 0; l++)
        if (touched[l])
            pump_lane(r, l);
    return any;
}

/* ---- sharing wires ----
 *
 * Several passes may be in flight at once: point-to-point messages
 * progress beside each other and beside the one collective call that
 * runs (core/request.c). They share each wire's two byte streams, so:
 *
 * - Sending, a lane's wire puts its header and every frame of its region
 *   on the stream before another pass's bytes go there: the first to
 *   start holds the stream (txq.owner) until its last frame is posted;
 *   the others queue, and so do check channels' headers.
 * - Receiving, the engine reads each stream's headers itself (rxq) and
 *   hands each to the pass it belongs to: point-to-point headers (kind
 *   P2P) to the receive of that peer that runs, any other to the
 *   collective's lane or check channel. The pass then reads its frames
 *   and gives the stream back once they are all posted. A collective's
 *   header that no started pass takes yet waits, unread past, until the
 *   collective starts; a point-to-point message that comes while the
 *   collective waits behind it is read into memory (unexp) and handed to
 *   its receive when that starts, so that a send posted before a
 *   collective never holds the collective back on the other side. Past
 *   UNEXP_MAX bytes held so, the stream waits instead.
 *
 * One pass per collective call runs at a time, and at most one receive
 * (and one send) per peer of point-to-point (the scheduler's rules), so
 * each stream has at most one point-to-point and one collective taker. */

#define UNEXP_MAX ((size_t)64 << 20)

enum { RX_IDLE, RX_READING, RX_HAVE, RX_BUSY };

/* A point-to-point message's part on one wire, read before its receive
 * started. */
typedef struct unexp {
    weft__xfer x;
    struct rxq *q;
    uint8_t hdr[HDR_BYTES];
    char *buf;
    size_t len;
    int done;
    wstate *taker; /* the receive that took it while it still arrived */
    struct unexp *next;
} unexp;

typedef struct rxq {
    weft__xfer x;
    weft__ctx *c;
    int peer, w;
    int state; /* RX_* */
    uint8_t hdr[HDR_BYTES];
    wstate *coll; /* a collective's lane waiting for its header */
    check *chk;   /* a collective's check channel waiting (wire 0) */
    wstate *p2p;  /* a point-to-point receive waiting */
    unexp *uq_head, *uq_tail;
} rxq;

typedef struct txq {
    wstate *owner;
    txw *head, *tail;
} txq;

static rxq *rxq_of(weft__ctx *c, int peer, int w)
{
    return &c->eng->rx[(size_t)peer * (size_t)c->eng->maxw + (size_t)w];
}

static txq *txq_of(weft__ctx *c, int peer, int w)
{
    return &c->eng->tx[(size_t)peer * (size_t)c->eng->maxw + (size_t)w];
}

static int run_p2p(const run *r)
{
    return r->k->kind == WEFT__OP_P2P;
}

/* Wire w's region of len bytes (elements of esize) over nw wires. */
static weft__region wire_region(const weft__ctx *c, size_t len, size_t esize,
                                int nw, int w)
{
    weft__region reg = {0, 0};
    int used;

    if (len == 0 || nw <= 0)
        return reg;
    used = weft__plan_wires(len, nw, c->cfg->min_wire_bytes);
    if (w >= used)
        return reg;
    return weft__plan_region(len, used, esize, w);
}

/* A lane's header came: checked against what the lane expects. */
static void rx_deliver(wstate *ws, const uint8_t *hdr)
{
    run *r = ws->run;
    ophdr want = lane_hdr(r, ws->lane, 0);

    ws->r_asked = 0;
    ws->r_hdr = 1;
    memcpy(ws->r_hdrbuf, hdr, HDR_BYTES);
    hdr_check(r, ws->r_hdrbuf, &want, r->op.lanes[ws->lane].recv_peer, ws->w);
}

static void check_got(check *k, const uint8_t *hdr)
{
    run *r = k->run;
    ophdr want = hdr_make(r->k, r->pass, TAG_CHECK, r->k->seq, 0);

    k->asked = 0;
    memcpy(k->rbuf, hdr, HDR_BYTES);
    if (hdr_check(r, k->rbuf, &want, k->peer, 0) == 0)
        k->got = 1;
}

/* An early message's bytes land in the receive that took it: its wire's
 * part of the message is done. It leaves its wire's list (it is the
 * oldest there: one receive per peer runs at a time). */
static void unexp_land(wstate *ws, unexp *u)
{
    run *r = ws->run;
    const weft__lane *ln = &r->op.lanes[ws->lane];
    weft__region reg =
        step_region(r, ln->steps[0].recv_len, r->rw[ws->lane], ws->w);
    rxq *q = u->q;

    assert(q->uq_head == u);
    q->uq_head = u->next;
    if (q->uq_head == NULL)
        q->uq_tail = NULL;
    ws->r_unexp = NULL;
    if (r->err == 0 && reg.len != u->len)
        engine_fail(r, WEFT_EMISMATCH,
                    "rank %d: %s: peer %d sent %zu bytes on wire %d where "
                    "this rank expected %zu",
                    r->c->rank, r->k->name, ln->recv_peer, u->len, ws->w,
                    reg.len);
    else if (r->err == 0) {
        memcpy(ln->steps[0].recv_dst + reg.off, u->buf, reg.len);
        ws->r_step = ln->nsteps;
        ws->r_frame = 0;
        ws->d_step = ln->nsteps - 1;
        ws->d_end = reg.off + reg.len;
    }
    r->c->eng->unexp_bytes -= u->len;
    free(u->buf);
    free(u);
}

static void unexp_done(weft__xfer *x)
{
    unexp *u = container_of(x, unexp, x);
    wstate *ws = u->taker;

    u->done = 1;
    if (ws != NULL) {
        unexp_land(ws, u);
        pump_lane(ws->run, ws->lane);
    }
}

/* A receive takes the oldest early message of its wire, once its header
 * matched (where it does not, the pass fails and the message stays, to
 * go with the transport). */
static void unexp_take(wstate *ws, unexp *u)
{
    rx_deliver(ws, u->hdr);
    if (ws->run->err != 0)
        return;
    if (u->done)
        unexp_land(ws, u);
    else {
        u->taker = ws;
        ws->r_unexp = u;
    }
}

/* Reads the point-to-point message whose header q holds into memory:
 * 0, or -1 where it may not (too much held already, no memory). */
static int unexp_read(weft__ctx *c, rxq *q)
{
    struct weft__engine *e = c->eng;
    ophdr h;
    weft__region reg;
    unexp *u;

    hdr_decode(q->hdr, &h);
    if (h.dtype >= 10)
        return -1;
    reg = wire_region(c, h.total, weft_dtype_size((weft_dtype)h.dtype),
                      c->tpo->nwires(c->tp, q->peer), q->w);
    if (reg.len == 0 || e->unexp_bytes + reg.len > UNEXP_MAX)
        return -1;
    if ((u = calloc(1, sizeof *u)) == NULL)
        return -1;
    if ((u->buf = malloc(reg.len)) == NULL) {
        free(u);
        return -1;
    }
    u->q = q;
    u->len = reg.len;
    memcpy(u->hdr, q->hdr, HDR_BYTES);
    u->x.done = unexp_done;
    u->x.buf = u->buf;
    u->x.len = u->len;
    if (c->tpo->post_recv(c->tp, q->peer, q->w, &u->x) != 0) {
        free(u->buf);
        free(u);
        return -1;
    }
    e->unexp_bytes += u->len;
    if (q->uq_tail != NULL)
        q->uq_tail->next = u;
    else
        q->uq_head = u;
    q->uq_tail = u;
    return 0;
}

/* The wire's reader cannot post: whoever waits on it fails. */
static void rx_fail(rxq *q, int rc)
{
    run *rs[3] = {q->coll != NULL ? q->coll->run : NULL,
                  q->chk != NULL ? q->chk->run : NULL,
                  q->p2p != NULL ? q->p2p->run : NULL};

    for (int i = 0; i < 3; i++)
        if (rs[i] != NULL && rs[i]->err == 0)
            engine_fail(rs[i], rc,
                        "rank %d: %s: cannot receive from peer %d: %s",
                        q->c->rank, rs[i]->k->name, q->peer, weft_strerror(rc));
}

static void rx_hdr_done(weft__xfer *x);

/* Moves q's stream on: hands a header that came to its taker, reads
 * early messages, or posts the next header's read where someone waits
 * for one. */
static void rx_kick(rxq *q)
{
    weft__ctx *c = q->c;

    for (;;) {
        wstate *ws;
        int p2p, rc;

        if (q->state == RX_READING || q->state == RX_BUSY)
            return;
        if (q->state == RX_IDLE) {
            if (q->coll == NULL && q->chk == NULL && q->p2p == NULL)
                return;
            q->x = (weft__xfer){0};
            q->x.done = rx_hdr_done;
            q->x.buf = (char *)q->hdr;
            q->x.len = HDR_BYTES;
            q->state = RX_READING;
            if ((rc = c->tpo->post_recv(c->tp, q->peer, q->w, &q->x)) != 0) {
                q->state = RX_IDLE;
                rx_fail(q, rc);
            }
            return;
        }
        /* RX_HAVE */
        p2p = weft__get_le32(q->hdr) == HDR_MAGIC && q->hdr[4] == WEFT__OP_P2P;
        ws = p2p ? q->p2p : q->coll;
        if (ws != NULL) {
            if (p2p)
                q->p2p = NULL;
            else
                q->coll = NULL;
            q->state = RX_BUSY;
            ws->r_owns = 1;
            rx_deliver(ws, q->hdr);
            pump_lane(ws->run, ws->lane);
            return;
        }
        if (!p2p && q->chk != NULL) {
            check *k = q->chk;

            q->chk = NULL;
            q->state = RX_IDLE;
            check_got(k, q->hdr);
            continue;
        }
        if (p2p && (q->coll != NULL || q->chk != NULL) &&
            unexp_read(c, q) == 0) {
            q->state = RX_IDLE;
            continue;
        }
        return; /* nobody started here takes it yet: the stream waits */
    }
}

static void rx_hdr_done(weft__xfer *x)
{
    rxq *q = container_of(x, rxq, x);

    q->state = RX_HAVE;
    rx_kick(q);
}

/* A lane's wire asks for its header; 1 where it has it already. */
static int rx_ask(run *r, wstate *ws)
{
    rxq *q = rxq_of(r->c, r->op.lanes[ws->lane].recv_peer, ws->w);

    ws->r_asked = 1;
    if (run_p2p(r)) {
        if (q->uq_head != NULL) {
            unexp_take(ws, q->uq_head);
            return 1;
        }
        q->p2p = ws;
    } else
        q->coll = ws;
    rx_kick(q);
    return ws->r_hdr;
}

static void rx_release(weft__ctx *c, int peer, int w)
{
    rxq *q = rxq_of(c, peer, w);

    q->state = RX_IDLE;
    rx_kick(q);
}

/* 1 where ws may put its bytes on its wire's stream now; else it queues
 * and is pumped again once the stream is its own. */
static int tx_take(run *r, wstate *ws)
{
    txq *q = txq_of(r->c, r->op.lanes[ws->lane].send_peer, ws->w);

    if (q->owner == ws)
        return 1;
    if (q->owner == NULL && q->head == NULL) {
        q->owner = ws;
        return 1;
    }
    if (!ws->s_queued) {
        ws->s_queued = 1;
        ws->s_wait = (txw){NULL, ws, NULL};
        if (q->tail != NULL)
            q->tail->next = &ws->s_wait;
        else
            q->head = &ws->s_wait;
        q->tail = &ws->s_wait;
    }
    return 0;
}

static void check_send(check *k);

/* The stream's owner posted its last frame: the next in line starts. */
static void tx_next(weft__ctx *c, txq *q)
{
    while (q->owner == NULL && q->head != NULL) {
        txw *w = q->head;

        q->head = w->next;
        if (q->head == NULL)
            q->tail = NULL;
        if (w->k != NULL) {
            check_send(w->k);
            continue;
        }
        w->ws->s_queued = 0;
        q->owner = w->ws;
        pump_lane(w->ws->run, w->ws->lane);
    }
    (void)c;
}

/* Forgets every stream's state (the transport was shut down: nothing is
 * in flight), and frees the early messages. */
static void wires_reset(weft__ctx *c)
{
    struct weft__engine *e = c->eng;
    size_t n;

    if (e == NULL || e->rx == NULL)
        return;
    n = (size_t)c->nranks * (size_t)e->maxw;
    for (size_t i = 0; i < n; i++) {
        rxq *q = &e->rx[i];
        unexp *u = q->uq_head, *next;

        for (; u != NULL; u = next) {
            next = u->next;
            free(u->buf);
            free(u);
        }
        q->uq_head = q->uq_tail = NULL;
        q->state = RX_IDLE;
        q->coll = q->p2p = NULL;
        q->chk = NULL;
        e->tx[i] = (txq){0};
    }
    e->unexp_bytes = 0;
}

/* ---- completions ---- */

static void send_done(weft__xfer *x)
{
    frame *f = container_of(x, frame, x);
    wstate *ws = f->ws;

    assert(&ws->s_fr[ws->s_head] == f);
    ws->s_head = (ws->s_head + 1) % FIFO_CAP;
    ws->s_count--;
    pump_lane(ws->run, ws->lane);
}

static void recv_done(weft__xfer *x)
{
    frame *f = container_of(x, frame, x);
    wstate *ws = f->ws;
    run *r = ws->run;
    const weft__step *st = &r->op.lanes[ws->lane].steps[f->step];

    assert(&ws->r_fr[ws->r_head] == f);
    ws->r_head = (ws->r_head + 1) % FIFO_CAP;
    ws->r_count--;
    assert(!f->hdr);
    if (reduce_later(r, ws, f)) {
        reduce_post(r, ws, f, st);
        /* Its slot stays taken: nothing more can be posted for it yet. */
        reap(r);
        return;
    } else {
        if (f->slot >= 0)
            weft__reduce3(st->recv_dst + f->a, st->recv_a + f->a,
                          stage_slot(r, ws->lane, ws->w, f->slot),
                          f->len / r->op.esize, r->op.dtype, r->op.redop);
        ws->d_step = f->step;
        ws->d_end = f->a + f->len;
    }
    pump_lane(r, ws->lane);
}

static void check_send_done(weft__xfer *x)
{
    container_of(x, check, sx)->sent = 1;
}

/* ---- posting ---- */

/* Have bytes [a, b) of receive step k of the lane arrived on every wire
 * whose region overlaps them? */
static int recv_ready(run *r, int lane, int k, size_t a, size_t b)
{
    const weft__step *st = &r->op.lanes[lane].steps[k];

    for (int w = 0; w < r->rw[lane]; w++) {
        weft__region reg = step_region(r, st->recv_len, r->rw[lane], w);
        size_t lo = a > reg.off ? a : reg.off;
        size_t hi = b < reg.off + reg.len ? b : reg.off + reg.len;
        const wstate *ws = &r->ws[lane][w];

        if (lo >= hi)
            continue;
        if (ws->d_step > k)
            continue;
        if (ws->d_step < k || ws->d_end < hi)
            return 0;
    }
    return 1;
}

static int post(run *r, wstate *ws, int is_send, int step, int hdr, char *buf,
                size_t a, size_t len, int slot)
{
    const weft__lane *ln = &r->op.lanes[ws->lane];
    frame *f;
    int rc;

    if (is_send)
        f = &ws->s_fr[(ws->s_head + ws->s_count) % FIFO_CAP];
    else
        f = &ws->r_fr[(ws->r_head + ws->r_count) % FIFO_CAP];
    f->x = (weft__xfer){0};
    f->ws = ws;
    f->step = step;
    f->hdr = hdr;
    f->a = a;
    f->len = len;
    f->slot = slot;
    f->x.done = is_send ? send_done : recv_done;
    f->x.bulk = is_send && r->bulk;
    f->x.buf = buf;
    f->x.len = len;
    if (is_send) {
        rc = r->c->tpo->post_send(r->c->tp, ln->send_peer, ws->w, &f->x);
        if (rc == 0)
            ws->s_count++;
    } else {
        rc = r->c->tpo->post_recv(r->c->tp, ln->recv_peer, ws->w, &f->x);
        if (rc == 0)
            ws->r_count++;
    }
    if (rc != 0 && r->err == 0)
        r->err = rc;
    return rc;
}

static void pump_send(run *r, int lane, wstate *ws)
{
    const weft__lane *ln = &r->op.lanes[lane];

    while (r->err == 0 && ws->s_count < WEFT__SEND_DEPTH &&
           ws->s_step < ln->nsteps) {
        const weft__step *st = &ln->steps[ws->s_step];
        weft__region reg = step_region(r, st->send_len, r->sw[lane], ws->w);
        size_t flen, a;

        /* The planner's frames of this wire's own region, and no more:
         * a wire never posts past its region, nor waits for a frame its
         * peer (which computes the same plan) will not send. */
        if (ws->s_frame >= weft__plan_frames(reg.len, r->frame)) {
            ws->s_step++;
            ws->s_frame = 0;
            continue;
        }
        flen = weft__plan_frame_len(reg.len, r->frame, ws->s_frame);
        a = reg.off + ws->s_frame * r->frame;
        assert(flen > 0 && a + flen <= reg.off + reg.len);
        if (!ws->s_hdr) {
            ophdr h = lane_hdr(r, lane, 1);

            /* The stream is this pass's from its header to its last
             * frame ("sharing wires"). */
            if (!tx_take(r, ws))
                break;
            hdr_encode(ws->s_hdrbuf, &h);
            ws->s_hdr = 1;
            if (flen <= HDR_DATA_BYTES &&
                (st->send_dep < 0 ||
                 recv_ready(r, lane, st->send_dep, a, a + flen))) {
                /* The stream carries the same bytes either way. */
                memcpy(ws->s_hdrbuf + HDR_BYTES, st->send_buf + a, flen);
                if (post(r, ws, 1, ws->s_step, 1, (char *)ws->s_hdrbuf, a,
                         HDR_BYTES + flen, -1) != 0)
                    break;
                ws->s_frame++;
                continue;
            }
            post(r, ws, 1, ws->s_step, 1, (char *)ws->s_hdrbuf, 0, HDR_BYTES,
                 -1);
            continue;
        }
        if (st->send_dep >= 0 &&
            !recv_ready(r, lane, st->send_dep, a, a + flen))
            break;
        if (post(r, ws, 1, ws->s_step, 0, (char *)st->send_buf + a, a, flen,
                 -1) != 0)
            break;
        ws->s_frame++;
    }
    if (ws->s_hdr && ws->s_step >= ln->nsteps && r->err == 0) {
        txq *q = txq_of(r->c, ln->send_peer, ws->w);

        if (q->owner == ws) {
            q->owner = NULL;
            tx_next(r->c, q);
        }
    }
}

static void pump_recv(run *r, int lane, wstate *ws)
{
    const weft__lane *ln = &r->op.lanes[lane];

    /* A message read early lands whole (unexp_land): no frames. */
    while (r->err == 0 && ws->r_count + ws->r_reducing < r->rdepth &&
           ws->r_step < ln->nsteps && ws->r_unexp == NULL) {
        const weft__step *st = &ln->steps[ws->r_step];
        weft__region reg = step_region(r, st->recv_len, r->rw[lane], ws->w);
        size_t flen, a;
        int slot = -1;
        char *buf;

        if (ws->r_frame >= weft__plan_frames(reg.len, r->frame)) {
            ws->r_step++;
            ws->r_frame = 0;
            continue;
        }
        flen = weft__plan_frame_len(reg.len, r->frame, ws->r_frame);
        a = reg.off + ws->r_frame * r->frame;
        assert(flen > 0 && a + flen <= reg.off + reg.len);
        if (!ws->r_hdr) {
            /* The wire's reader hands the header over ("sharing
             * wires"), at once where it came already. */
            if (ws->r_asked || !rx_ask(r, ws))
                break;
            continue;
        }
        if (st->recv_a != NULL) {
            slot = ws->r_slot;
            ws->r_slot = (ws->r_slot + 1) % r->rdepth;
            buf = stage_slot(r, lane, ws->w, slot);
            if (buf == NULL) {
                engine_fail(r, WEFT_ENOMEM, "rank %d: no memory for staging",
                            r->c->rank);
                break;
            }
        } else {
            buf = st->recv_dst + a;
        }
        if (post(r, ws, 0, ws->r_step, 0, buf, a, flen, slot) != 0)
            break;
        ws->r_frame++;
    }
    if (ws->r_owns && ws->r_step >= ln->nsteps && r->err == 0) {
        ws->r_owns = 0;
        rx_release(r->c, ln->recv_peer, ws->w);
    }
}

static void pump_lane(run *r, int lane)
{
    int n = lane_wires(r, lane);

    for (int w = 0; w < n && r->err == 0; w++) {
        if (w < r->rw[lane])
            pump_recv(r, lane, &r->ws[lane][w]);
        if (w < r->sw[lane])
            pump_send(r, lane, &r->ws[lane][w]);
    }
}

static int lane_done(const run *r, int lane)
{
    const weft__lane *ln = &r->op.lanes[lane];
    int n = lane_wires(r, lane);

    for (int w = 0; w < n; w++) {
        const wstate *ws = &r->ws[lane][w];
        if (w < r->sw[lane] && (ws->s_step < ln->nsteps || ws->s_count > 0))
            return 0;
        if (w < r->rw[lane] &&
            (ws->r_step < ln->nsteps || ws->r_count > 0 || ws->r_reducing > 0))
            return 0;
    }
    return 1;
}

/* Names what the operation was still waiting for, for a timeout message. */
static void describe_wait(const run *r, char *out, size_t outlen)
{
    snprintf(out, outlen, "nothing");
    if (r->box) {
        for (int p = 0; p < r->c->nranks; p++)
            if (p != r->c->rank && (r->box_got >> p & 1) == 0) {
                snprintf(out, outlen,
                         "peer %d to start the same call (its message in "
                         "shared memory)",
                         p);
                return;
            }
        if (!r->box_put)
            snprintf(out, outlen,
                     "a peer several calls behind to take this rank's "
                     "earlier messages from shared memory");
        return;
    }
    for (int i = 0; i < r->nchecks; i++) {
        const check *k = &r->checks[i];
        if (k->recv && !k->got) {
            snprintf(out, outlen,
                     "peer %d to start the same call (its header on wire 0)",
                     k->peer);
            return;
        }
    }
    for (int l = 0; l < r->op.nlanes; l++) {
        const weft__lane *ln = &r->op.lanes[l];
        for (int w = 0; w < r->rw[l]; w++) {
            const wstate *ws = &r->ws[l][w];
            if (ws->r_count > 0 || ws->r_step < ln->nsteps) {
                int step =
                    ws->r_count > 0 ? ws->r_fr[ws->r_head].step : ws->r_step;
                snprintf(out, outlen,
                         "data from peer %d on wire %d (step %d of %d)",
                         ln->recv_peer, w, step + 1, ln->nsteps);
                return;
            }
        }
        for (int w = 0; w < r->sw[l]; w++) {
            const wstate *ws = &r->ws[l][w];
            if (ws->s_count > 0 || ws->s_step < ln->nsteps) {
                int step =
                    ws->s_count > 0 ? ws->s_fr[ws->s_head].step : ws->s_step;
                snprintf(out, outlen,
                         "peer %d to take data on wire %d (step %d of %d)",
                         ln->send_peer, w, step + 1, ln->nsteps);
                return;
            }
        }
    }
    if (!r->rl_rh.done || !r->rl_rx.done)
        snprintf(out, outlen, "a message relayed from rank %d", r->rsrc);
    else if (!r->rl_sh.done || !r->rl_sx.done)
        snprintf(out, outlen, "a message relayed to rank %d to leave", r->rdst);
}

void weft__pass_wait(weft__pass *r)
{
    weft__ctx *c = r->c;
    const char *name = r->k->name;
    uint64_t deadline = r->k->deadline_ms;
    char what[160];
    int rc;

    if (r->err != 0 || (r->box ? box_wait(r) : reap(r)))
        return;
    /* The deadline is checked here too, not only by the transport: one
     * whose progress() keeps returning early (events that move nothing
     * this pass waits for) must not keep a caller past it. Every 8th wait
     * of a pass is enough for that (progress() itself returns by the
     * deadline where nothing happens); a clock read per wait took 4% of an
     * 8-byte all_reduce among ranks of one host. */
    if (atomic_load(&c->aborted))
        rc = weft__set_error(c, WEFT_EABORTED,
                             "rank %d: %s aborted by weft_abort()", c->rank,
                             name);
    else if ((rc = (++r->waits & 7) == 0 && weft__now_ms() >= deadline
                       ? WEFT_ETIMEDOUT
                       : c->tpo->progress(c->tp, deadline)) == 0) {
        if (r->box)
            box_poll(r);
        else
            reap(r);
        return;
    } else if (r->err != 0)
        /* A completion failed the pass meanwhile: the first cause wins. */
        return;
    else if (rc == WEFT_ETIMEDOUT) {
        describe_wait(r, what, sizeof what);
        rc = weft__set_error(c, rc,
                             "rank %d: %s passed its deadline of %d ms "
                             "(weft_set_timeout or WEFT_TIMEOUT_MS) waiting "
                             "for %s",
                             c->rank, name, r->k->timeout_ms, what);
    } else {
        /* The transport recorded its cause; the first one stands. */
        rc = weft__set_error(c, rc, "rank %d: %s failed: %s", c->rank, name,
                             weft_strerror(rc));
    }
    r->err = rc;
}

void weft__passes_wait(weft__pass *const *ps, int n)
{
    weft__ctx *c = ps[0]->c;
    uint64_t deadline = UINT64_MAX, now;
    char what[160];
    int rc;

    if (n == 1) {
        weft__pass_wait(ps[0]);
        return;
    }
    for (int i = 0; i < n; i++) {
        run *r = ps[i];

        if (r->err != 0 || (r->box && box_wait(r)))
            return;
        if (r->k->deadline_ms < deadline)
            deadline = r->k->deadline_ms;
    }
    if (reap(ps[0]))
        return;
    if (atomic_load(&c->aborted)) {
        rc = weft__set_error(c, WEFT_EABORTED,
                             "rank %d: %s aborted by weft_abort()", c->rank,
                             ps[0]->k->name);
        for (int i = 0; i < n; i++)
            ps[i]->err = rc;
        return;
    }
    now = weft__now_ms();
    rc = now >= deadline ? WEFT_ETIMEDOUT : c->tpo->progress(c->tp, deadline);
    if (rc == WEFT_OK) {
        for (int i = 0; i < n; i++)
            if (ps[i]->box)
                box_poll(ps[i]);
        reap(ps[0]);
        return;
    }
    for (int i = 0; i < n; i++)
        if (ps[i]->err != 0)
            return; /* a completion failed a pass meanwhile */
    if (rc == WEFT_ETIMEDOUT) {
        /* Each operation has its own deadline: those past theirs fail. */
        now = weft__now_ms();
        for (int i = 0; i < n; i++) {
            run *r = ps[i];

            if (now < r->k->deadline_ms)
                continue;
            describe_wait(r, what, sizeof what);
            r->err = weft__set_error(
                c, WEFT_ETIMEDOUT,
                "rank %d: %s passed its deadline of %d ms "
                "(weft_set_timeout or WEFT_TIMEOUT_MS) waiting for %s",
                c->rank, r->k->name, r->k->timeout_ms, what);
        }
        return;
    }
    rc = weft__set_error(c, rc, "rank %d: %s failed: %s", c->rank,
                         ps[0]->k->name, weft_strerror(rc));
    for (int i = 0; i < n; i++)
        ps[i]->err = rc;
}

static int engine_ensure(weft__ctx *c)
{
    struct weft__engine *e = c->eng;
    int maxw = 1;

    if (e != NULL)
        return WEFT_OK;
    for (int p = 0; p < c->nranks; p++) {
        int n = c->tpo->nwires(c->tp, p);
        if (n > maxw)
            maxw = n;
    }
    e = calloc(1, sizeof *e);
    if (e == NULL)
        return WEFT_ENOMEM;
    e->frame_bytes = c->cfg->frame_bytes;
    e->maxw = maxw;
    e->stage = calloc((size_t)WEFT__MAX_LANES * (size_t)maxw * STAGE_SLOTS,
                      sizeof *e->stage);
    e->rx = calloc((size_t)c->nranks * (size_t)maxw, sizeof *e->rx);
    e->tx = calloc((size_t)c->nranks * (size_t)maxw, sizeof *e->tx);
    if (e->stage == NULL || e->rx == NULL || e->tx == NULL) {
        free(e->stage);
        free(e->rx);
        free(e->tx);
        free(e);
        return WEFT_ENOMEM;
    }
    for (int p = 0; p < c->nranks; p++)
        for (int w = 0; w < maxw; w++) {
            rxq *q = &e->rx[(size_t)p * (size_t)maxw + (size_t)w];

            q->c = c;
            q->peer = p;
            q->w = w;
        }
    c->eng = e;
    return WEFT_OK;
}

void weft__engine_free(weft__ctx *c)
{
    struct weft__engine *e = c->eng;

    weft__pool_destroy(c->pool);
    c->pool = NULL;
    free(c->pull_tmp);
    c->pull_tmp = NULL;
    c->pull_tmp_bytes = 0;
    if (e == NULL)
        return;
    weft__reducer_destroy(e->reducer);
    wires_reset(c);
    free(e->rx);
    free(e->tx);
    for (size_t i = 0;
         i < (size_t)WEFT__MAX_LANES * (size_t)e->maxw * STAGE_SLOTS; i++)
        free(e->stage[i]);
    free(e->stage);
    pass_destroy(e->spare);
    free(e);
    c->eng = NULL;
}

static int check_done(const run *r)
{
    for (int i = 0; i < r->nchecks; i++) {
        const check *k = &r->checks[i];
        if ((k->send && !k->sent) || (k->recv && !k->got))
            return 0;
    }
    return 1;
}

/* The check channels of a collective pass: with every peer it moves data
 * to or from, and every peer of its op's check set (its ring neighbours,
 * or every peer), headers go both ways; a check channel carries the ones
 * that no lane carries. Point-to-point passes have none: a send must not
 * wait for its receiver. */
static void plan_checks(run *r)
{
    const weft__ctx *c = r->c;
    const weft__op *op = &r->op;
    int cand[2 * WEFT__MAX_LANES + WEFT__MESH_MAX_RANKS + 2], ncand = 0;
    const weft__group g =
        op->group.n > 0 ? op->group : (weft__group){c->nranks, c->rank, 0, 1};

    if (r->k->kind == WEFT__OP_P2P)
        return;
    for (int l = 0; l < op->nlanes; l++) {
        cand[ncand++] = op->lanes[l].send_peer;
        cand[ncand++] = op->lanes[l].recv_peer;
    }
    if (op->check == WEFT__CHECK_RING) {
        cand[ncand++] = weft__group_rank(&g, (g.me + 1) % g.n);
        cand[ncand++] = weft__group_rank(&g, (g.me + g.n - 1) % g.n);
    } else if (op->check == WEFT__CHECK_ALL && g.n <= WEFT__MESH_MAX_RANKS) {
        for (int p = 0; p < g.n; p++)
            if (p != g.me)
                cand[ncand++] = weft__group_rank(&g, p);
    }
    for (int i = 0; i < ncand; i++) {
        int p = cand[i], dup = 0, sends = 0, recvs = 0;
        check *k;

        for (int j = 0; j < i; j++)
            dup |= cand[j] == p;
        if (p < 0 || p == c->rank || dup || c->tpo->nwires(c->tp, p) == 0)
            continue;
        for (int l = 0; l < op->nlanes; l++) {
            sends |= op->lanes[l].send_peer == p;
            recvs |= op->lanes[l].recv_peer == p;
        }
        if (sends && recvs)
            continue;
        k = &r->checks[r->nchecks++];
        memset(k, 0, sizeof *k);
        k->run = r;
        k->peer = p;
        k->send = !sends;
        k->recv = !recvs;
    }
}

/* Posts a check channel's header on wire 0 (its stream is free). */
static void check_send(check *k)
{
    run *r = k->run;
    weft__ctx *c = r->c;
    int rc;

    if (r->err != 0)
        return;
    k->sx.done = check_send_done;
    k->sx.buf = (char *)k->sbuf;
    k->sx.len = HDR_BYTES;
    if ((rc = c->tpo->post_send(c->tp, k->peer, 0, &k->sx)) != 0)
        engine_fail(r, rc, "rank %d: %s: cannot post to peer %d: %s", c->rank,
                    r->k->name, k->peer, weft_strerror(rc));
}

static void post_checks(run *r)
{
    weft__ctx *c = r->c;

    for (int i = 0; i < r->nchecks && r->err == 0; i++) {
        check *k = &r->checks[i];

        if (k->recv) {
            rxq *q = rxq_of(c, k->peer, 0);

            k->asked = 1;
            q->chk = k;
            rx_kick(q);
        }
        if (k->send && r->err == 0) {
            ophdr h = hdr_make(r->k, r->pass, TAG_CHECK, r->k->seq, 0);
            txq *q = txq_of(c, k->peer, 0);

            hdr_encode(k->sbuf, &h);
            if (q->owner == NULL && q->head == NULL)
                check_send(k);
            else {
                /* Behind another pass's bytes on the stream. */
                k->s_wait = (txw){NULL, NULL, k};
                if (q->tail != NULL)
                    q->tail->next = &k->s_wait;
                else
                    q->head = &k->s_wait;
                q->tail = &k->s_wait;
            }
        }
    }
}

/* ---- relayed point to point ----
 *
 * A message to a rank with no wires to this one goes around the ring
 * through the transport's relay, as two relayed messages: its header (the
 * same as a wire's, with the pair's message number and the length), then
 * its bytes. The receiver checks the header before it takes a byte, so a
 * relayed send and receive are matched exactly as direct ones are. The
 * halves with wires of their own run meanwhile as the pass's lanes. */

static void relay_done(weft__xfer *x)
{
    container_of(x, relay_xfer, x)->done = 1;
}

static void relay_hdr_done(weft__xfer *x)
{
    run *r = container_of(x, run, rl_rh.x);

    r->rl_rh.done = 1;
    hdr_check(r, r->rl_rhdr, &r->rl_want, r->rsrc, -1);
}

static int relay_post(run *r, int is_send, int peer, relay_xfer *rx, void *buf,
                      size_t len, void (*done)(weft__xfer *))
{
    weft__ctx *c = r->c;

    rx->x.done = done;
    rx->x.buf = buf;
    rx->x.len = len;
    return is_send ? c->tpo->relay_send(c->tp, peer, &rx->x)
                   : c->tpo->relay_recv(c->tp, peer, &rx->x);
}

static void post_relay(run *r, const weft__relay *rl)
{
    weft__ctx *c = r->c;
    int rc = 0;

    if (rl->dst >= 0) {
        ophdr h =
            hdr_make(r->k, 0, TAG_RELAY, c->send_seq[rl->dst]++, rl->nbytes);
        hdr_encode(r->rl_shdr, &h);
        rc = relay_post(r, 1, rl->dst, &r->rl_sh, r->rl_shdr, HDR_BYTES,
                        relay_done);
        if (rc == 0)
            rc = relay_post(r, 1, rl->dst, &r->rl_sx,
                            (void *)(uintptr_t)rl->sendbuf, rl->nbytes,
                            relay_done);
    }
    if (rc == 0 && rl->src >= 0) {
        r->rl_want =
            hdr_make(r->k, 0, TAG_RELAY, c->recv_seq[rl->src]++, rl->nbytes);
        rc = relay_post(r, 0, rl->src, &r->rl_rh, r->rl_rhdr, HDR_BYTES,
                        relay_hdr_done);
        if (rc == 0)
            rc = relay_post(r, 0, rl->src, &r->rl_rx, rl->recvbuf, rl->nbytes,
                            relay_done);
    }
    if (rc != 0 && r->err == 0)
        r->err = rc;
}

static int relay_done_all(const run *r)
{
    return r->rl_sh.done && r->rl_sx.done && r->rl_rh.done && r->rl_rx.done;
}

/* ---- passes ---- */

static void op_free_steps(weft__op *op)
{
    for (int l = 0; l < op->nlanes; l++)
        free(op->lanes[l].steps);
}

void weft__op_init(weft__op *op, weft_dtype dt, weft_redop redop)
{
    memset(op, 0, sizeof *op);
    op->dtype = dt;
    op->redop = redop;
    op->esize = weft_dtype_size(dt);
}

weft__step *weft__op_steps(weft__op *op, int lane, int nsteps)
{
    weft__step *st = calloc((size_t)(nsteps > 0 ? nsteps : 1), sizeof *st);

    op->lanes[lane].steps = st;
    op->lanes[lane].nsteps = nsteps;
    for (int k = 0; st != NULL && k < nsteps; k++)
        st[k].send_dep = -1;
    return st;
}

/* A pass that cannot start: op's steps are freed; before anything of its
 * call moved, c stays usable (the error is only noted); later, the call
 * is broken half way and c fails. */
static int start_error(weft__ctx *c, weft__call *k, weft__op *op, int err,
                       const char *fmt, ...)
    __attribute__((format(printf, 5, 6)));

static int start_error(weft__ctx *c, weft__call *k, weft__op *op, int err,
                       const char *fmt, ...)
{
    va_list ap;

    op_free_steps(op);
    va_start(ap, fmt);
    if (k->passes == 0)
        vsnprintf(c->errmsg, sizeof c->errmsg, fmt, ap);
    else {
        weft__vfail(&c->fail, err, fmt, ap);
        c->tpo->shutdown(c->tp);
    }
    va_end(ap);
    return err;
}

/* Frees the pass's own memory; the engine keeps one for the next pass. */
static void pass_free(weft__ctx *c, weft__pass *r)
{
    op_free_steps(&r->op);
    if (c->eng != NULL && c->eng->spare == NULL)
        c->eng->spare = r;
    else
        pass_destroy(r);
}

/* Points each lane of r at its wires' states, zeroed but for what each
 * is (r->wsmem grows where the pass needs more than the last one). */
static int pass_wires(run *r)
{
    size_t need = 0, at = 0;

    for (int l = 0; l < r->op.nlanes; l++)
        need += (size_t)lane_wires(r, l);
    if (need > r->wscap) {
        wstate *m = malloc(need * sizeof *m);

        if (m == NULL)
            return WEFT_ENOMEM;
        free(r->wsmem);
        r->wsmem = m;
        r->wscap = need;
    }
    for (int l = 0; l < r->op.nlanes; l++) {
        int n = lane_wires(r, l);

        r->ws[l] = r->wsmem + at;
        at += (size_t)n;
        for (int w = 0; w < n; w++) {
            wstate *ws = &r->ws[l][w];

            memset(ws, 0, offsetof(wstate, s_fr));
            ws->run = r;
            ws->lane = l;
            ws->w = w;
            ws->d_step = -1;
        }
    }
    return WEFT_OK;
}

/* The bytes op's steps reduce on arrival, all lanes together. */
static size_t pass_reduces(const weft__op *op)
{
    size_t n = 0;

    for (int l = 0; l < op->nlanes; l++)
        for (int s = 0; s < op->lanes[l].nsteps; s++)
            if (op->lanes[l].steps[s].recv_a != NULL)
                n += op->lanes[l].steps[s].recv_len;
    return n;
}

/* The bytes a pass sends, over all its lanes. */
static size_t pass_sends(const weft__op *op)
{
    size_t n = 0;

    for (int l = 0; l < op->nlanes; l++)
        for (int s = 0; s < op->lanes[l].nsteps; s++)
            n += op->lanes[l].steps[s].send_len;
    return n;
}

int weft__pass_start(weft__ctx *c, weft__call *k, weft__op *op,
                     const weft__relay *relay, weft__pass **out)
{
    int sw[WEFT__MAX_LANES], rw[WEFT__MAX_LANES], rc;
    run *r;

    *out = NULL;
    for (int l = 0; l < op->nlanes; l++)
        if (op->lanes[l].steps == NULL)
            return start_error(c, k, op, WEFT_ENOMEM,
                               "rank %d: %s: out of memory", c->rank, k->name);
    if ((rc = engine_ensure(c)) != 0)
        return start_error(c, k, op, rc,
                           "rank %d: %s: no memory for the engine", c->rank,
                           k->name);
    if (relay != NULL &&
        (c->tpo->relay_send == NULL || c->tpo->relay_recv == NULL))
        return start_error(c, k, op, WEFT_ENOTSUP,
                           "rank %d: %s: no wires to rank %d, and the %s "
                           "transport cannot relay",
                           c->rank, k->name,
                           relay->dst >= 0 ? relay->dst : relay->src,
                           c->tpo->name);
    /* Every lane's peers have wires, found before anything moved. */
    for (int l = 0; l < op->nlanes; l++) {
        const weft__lane *ln = &op->lanes[l];

        sw[l] = ln->send_peer >= 0 ? c->tpo->nwires(c->tp, ln->send_peer) : 0;
        rw[l] = ln->recv_peer >= 0 ? c->tpo->nwires(c->tp, ln->recv_peer) : 0;
        if ((ln->send_peer >= 0 && sw[l] == 0) ||
            (ln->recv_peer >= 0 && rw[l] == 0))
            return start_error(c, k, op, WEFT_ENOTSUP,
                               "rank %d: %s needs a direct link to peer %d, "
                               "and this job has none",
                               c->rank, k->name,
                               sw[l] == 0 && ln->send_peer >= 0
                                   ? ln->send_peer
                                   : ln->recv_peer);
    }
    if ((r = c->eng->spare) != NULL) {
        c->eng->spare = NULL;
        memset(r, 0, offsetof(run, op));
    } else if ((r = calloc(1, sizeof *r)) == NULL)
        return start_error(c, k, op, WEFT_ENOMEM, "rank %d: %s: out of memory",
                           c->rank, k->name);
    r->c = c;
    r->k = k;
    /* The op's own fields and its lanes, not the unused ones. */
    memcpy(&r->op, op,
           offsetof(weft__op, lanes) +
               (size_t)op->nlanes * sizeof op->lanes[0]);
    op->nlanes = 0; /* the steps are the pass's now */
    op = &r->op;
    r->frame = c->cfg->frame_bytes;
    /* Counted only where the thread could take the pass's frames. */
    if (c->cfg->reduce_thread && !op->inline_reduce &&
        pass_reduces(op) < c->cfg->reduce_thread_pass_bytes)
        op->inline_reduce = 1;
    /* With the reducer, a frame holds its slot while it waits to be
     * reduced: more slots keep the sockets read meanwhile. */
    r->rdepth = c->cfg->reduce_thread && !op->inline_reduce
                    ? WEFT__RECV_DEPTH_REDUCER
                    : WEFT__RECV_DEPTH;
    r->bulk =
        c->cfg->send_thread && pass_sends(op) >= c->cfg->send_thread_pass_bytes;
    r->pass = k->passes++;
    r->rdst = relay != NULL ? relay->dst : -1;
    r->rsrc = relay != NULL ? relay->src : -1;
    if (relay != NULL)
        memset(&r->rl_sh, 0, sizeof *r - offsetof(run, rl_sh));
    r->rl_sh.done = r->rl_sx.done = r->rdst < 0;
    r->rl_rh.done = r->rl_rx.done = r->rsrc < 0;
    for (int l = 0; l < op->nlanes; l++) {
        r->sw[l] = sw[l];
        r->rw[l] = rw[l];
    }
    if (pass_wires(r) != WEFT_OK)
        engine_fail(r, WEFT_ENOMEM, "rank %d: %s: out of memory", c->rank,
                    k->name);
    for (int l = 0; l < op->nlanes && r->err == 0; l++) {
        const weft__lane *ln = &op->lanes[l];

        r->stotal[l] = r->rtotal[l] = 0;
        for (int s = 0; s < ln->nsteps; s++) {
            r->stotal[l] += ln->steps[s].send_len;
            r->rtotal[l] += ln->steps[s].recv_len;
        }
        /* Collectives are matched by the call's number; point-to-point
         * messages by their number between the pair, each way. */
        r->sseq[l] = r->rseq[l] = k->seq;
        if (k->kind == WEFT__OP_P2P) {
            if (ln->send_peer >= 0)
                r->sseq[l] = c->send_seq[ln->send_peer]++;
            if (ln->recv_peer >= 0)
                r->rseq[l] = c->recv_seq[ln->recv_peer]++;
        }
    }
    if (r->err == 0 && r->pass == 0 && c->box != 0 && k->kind != WEFT__OP_P2P)
        box_announce(r);
    if (r->err == 0) {
        /* The relayed halves first, then the lanes: a check channel never
         * shares a direction of a wire with a lane, and a check sent to a
         * peer the lanes receive from then finds that wire read (no look
         * for a close before it, tcp/data.c). */
        if (relay != NULL)
            post_relay(r, relay);
        plan_checks(r);
        for (int l = 0; l < op->nlanes && r->err == 0; l++)
            pump_lane(r, l);
        post_checks(r);
    }
    *out = r;
    return WEFT_OK;
}

int weft__pass_test(const weft__pass *r)
{
    if (r->err != 0)
        return r->err;
    if (r->box)
        return r->box_put && r->box_left == 0 ? WEFT_OK : WEFT__PENDING;
    if (!check_done(r) || !relay_done_all(r))
        return WEFT__PENDING;
    for (int l = 0; l < r->op.nlanes; l++)
        if (!lane_done(r, l))
            return WEFT__PENDING;
    return WEFT_OK;
}

void weft__pass_end(weft__pass *r, int rc)
{
    weft__ctx *c = r->c;

    if (rc == WEFT_OK)
        rc = weft__pass_test(r);
    if (r->box)
        c->tpo->box_watch(c->tp, 0);
#ifndef NDEBUG
    /* The design's invariant: an operation that ends has no frame in
     * flight on any wire (a failed one is shut down below instead). */
    for (int l = 0; rc == 0 && l < r->op.nlanes; l++)
        for (int w = 0; w < lane_wires(r, l); w++)
            assert(r->ws[l][w].s_count == 0 && r->ws[l][w].r_count == 0 &&
                   r->ws[l][w].r_reducing == 0);
#endif
    if (rc != WEFT_OK) {
        if (rc == WEFT__PENDING)
            rc = WEFT_EABORTED;
        /* The reducer may still be writing the caller's buffer, or about
         * to: it stops before the call returns. */
        if (c->eng != NULL)
            weft__reducer_cancel(c->eng->reducer);
        /* Drop every frame in flight (none may touch the caller's buffers
         * once we return) and fail the communicator. */
        weft__call_fail(c, rc, "rank %d: %s failed: %s", c->rank, r->k->name,
                        weft_strerror(rc));
        /* Nothing is in flight now: every stream starts afresh (no
         * later operation runs on c but to fail at once). */
        wires_reset(c);
    }
    pass_free(c, r);
}

/* ---- the box (engine.h) ---- */

/* The tags of a box pass's header, and of the header a call that runs on
 * frames publishes in the box (so that a rank whose call went to the box
 * sees a peer's call that did not, and fails with WEFT_EMISMATCH instead
 * of waiting for its deadline). */
#define TAG_BOX 0xfffdu
#define TAG_BOX_FRAMES 0xfffcu

/* A box message's header: what the call's header holds that its slot
 * does not (the slot has the call's number; the message's length gives
 * the data's), 24 bytes where the full one takes 52, so that a small
 * message fits the slot's first cache line. */
#define BOX_HDR_BYTES 24
/* The most ranks a box pass serves: one bit each in box_got. */
#define BOX_MAX_RANKS 64

static void box_hdr_encode(uint8_t *b, const weft__call *k, int pass)
{
    b[0] = (uint8_t)k->kind;
    b[1] = (uint8_t)k->dtype;
    b[2] = (uint8_t)k->redop;
    b[3] = (uint8_t)pass;
    weft__put_le32(b + 4, (uint32_t)k->root);
    weft__put_le64(b + 8, k->count);
    weft__put_le64(b + 16, k->parts);
}

/* The full header (HDR_BYTES, to compare as the frames' are) of a box
 * message of len bytes for call k, whose hint is taken as this rank's. */
static void box_hdr_full(const uint8_t *b, size_t len, const weft__call *k,
                         uint8_t *out)
{
    ophdr h = {
        .magic = HDR_MAGIC,
        .kind = b[0],
        .dtype = b[1],
        .redop = b[2],
        .pass = b[3],
        .tag = TAG_BOX,
        .root = (int32_t)weft__get_le32(b + 4),
        .seq = k->seq,
        .count = weft__get_le64(b + 8),
        .total = len - BOX_HDR_BYTES,
        .parts = weft__get_le64(b + 16),
        .hint = k->hint,
    };
    hdr_encode(out, &h);
}

void weft__box_init(weft__ctx *c)
{
    size_t least = WEFT__BOX_MSG_MAX;

    c->box = 0;
    if (c->tpo->box_bytes == NULL || c->nranks > BOX_MAX_RANKS)
        return;
    for (int p = 0; p < c->nranks; p++) {
        size_t b = p == c->rank ? least : c->tpo->box_bytes(c->tp, p);

        if (b < least)
            least = b;
    }
    if (least > BOX_HDR_BYTES)
        c->box = least - BOX_HDR_BYTES;
}

/* Publishes r's message where it is not yet, and takes the peers' that
 * came: their headers are checked, their data lands in box_out. Returns
 * r->err. */
static int box_poll(run *r)
{
    weft__ctx *c = r->c;
    const uint64_t seq = r->k->seq;
    uint8_t m[WEFT__BOX_MSG_MAX], full[HDR_BYTES];
    ophdr want;
    int rc, left = -1, left_mid = -1;

    if (r->err != 0)
        return r->err;
    if (!r->box_put) {
        rc =
            c->tpo->box_put(c->tp, seq, r->box_msg, BOX_HDR_BYTES + r->box_len);
        if (rc < 0)
            return fail_into(c, &r->err, rc, "rank %d: %s failed: %s", c->rank,
                             r->k->name, weft_strerror(rc));
        r->box_put = rc == 0;
    }
    for (int p = 0; p < c->nranks && r->box_left > 0; p++) {
        size_t len;

        if (p == c->rank || (r->box_got >> p & 1) != 0)
            continue;
        rc = c->tpo->box_get(c->tp, p, seq, m, sizeof m, &len);
        if (rc < 0)
            return fail_into(c, &r->err, rc, "rank %d: %s failed: %s", c->rank,
                             r->k->name, weft_strerror(rc));
        if (rc == 0)
            continue;
        if (rc == 3) {
            left = left < 0 ? p : left;
            continue;
        }
        /* A message's header, in full; a note (4) has it in full. */
        if (len < (rc == 4 ? HDR_BYTES : BOX_HDR_BYTES))
            memset(full, 0, HDR_BYTES); /* no header: fails */
        else if (rc == 4)
            memcpy(full, m, HDR_BYTES);
        else
            box_hdr_full(m, len, r->k, full);
        want = hdr_make(r->k, r->pass, TAG_BOX, seq, r->box_len);
        /* A note differs in its tag at least: it says which call. */
        if (hdr_check(r, full, &want, p, 0) != 0 || rc == 4)
            return fail_into(c, &r->err, WEFT_EMISMATCH,
                             "rank %d: %s: peer %d runs it on frames where "
                             "this rank runs it in shared memory's box "
                             "(mismatched WEFT_BOX_BYTES?)",
                             c->rank, r->k->name, p);
        if (rc == 2) {
            left_mid = left_mid < 0 ? p : left_mid;
            continue;
        }
        /* The header's total says the length: they matched. */
        if (r->box_len > 0)
            memcpy(r->box_out + (size_t)p * r->box_len, m + BOX_HDR_BYTES,
                   r->box_len);
        r->box_got |= (uint64_t)1 << p;
        r->box_left--;
    }
    /* A peer's leaving, once every peer's header that is there matched
     * (a call that differs is the cause, where there is one). */
    if (left_mid >= 0 || left >= 0)
        return fail_into(c, &r->err, WEFT_EPEER,
                         "rank %d: %s: peer %d (same host) closed its side "
                         "(finalized, failed or exited) %s the call",
                         c->rank, r->k->name, left_mid >= 0 ? left_mid : left,
                         left_mid >= 0 ? "in the middle of"
                                       : "before its part of");
    return 0;
}

int weft__box_start(weft__ctx *c, weft__call *k, const void *data, size_t len,
                    char *out, weft__pass **pass)
{
    run *r;

    *pass = NULL;
    if (len > c->box)
        return start_error(c, k, &(weft__op){0}, WEFT_EINVAL,
                           "rank %d: %s: %zu bytes in the box, where it "
                           "holds %zu",
                           c->rank, k->name, len, c->box);
    if (engine_ensure(c) != 0)
        return start_error(c, k, &(weft__op){0}, WEFT_ENOMEM,
                           "rank %d: %s: no memory for the engine", c->rank,
                           k->name);
    if ((r = c->eng->spare) != NULL) {
        c->eng->spare = NULL;
        memset(r, 0, offsetof(run, op));
    } else if ((r = calloc(1, sizeof *r)) == NULL)
        return start_error(c, k, &(weft__op){0}, WEFT_ENOMEM,
                           "rank %d: %s: out of memory", c->rank, k->name);
    r->op.nlanes = 0;
    r->c = c;
    r->k = k;
    r->pass = k->passes++;
    r->rdst = r->rsrc = -1;
    r->rl_sh.done = r->rl_sx.done = r->rl_rh.done = r->rl_rx.done = 1;
    r->box = 1;
    r->box_len = len;
    r->box_out = out;
    r->box_left = c->nranks - 1;
    box_hdr_encode(r->box_msg, k, r->pass);
    if (len > 0) {
        memcpy(r->box_msg + BOX_HDR_BYTES, data, len);
        memmove(out + (size_t)c->rank * len, data, len);
    }
    box_poll(r);
    *pass = r;
    return WEFT_OK;
}

/* A box pass's wait before the transport's: 1 where it ended (or
 * failed). Before its first wait the transport is told to watch the box,
 * so that its progress() returns when a message comes. (A first wait that
 * looked at the slots alone for a while before that was no faster on the
 * 16-core host once a message fit one cache line, 8 B at 2-16 ranks, and
 * 35% slower on the 2-core VM with another process taking a core: it
 * held the core the peer waited for.) */
static int box_wait(run *r)
{
    weft__ctx *c = r->c;

    if (box_poll(r) != 0 || weft__pass_test(r) == WEFT_OK)
        return 1;
    if (r->box_waited)
        return 0;
    r->box_waited = 1;
    /* The watch reports changes from what the slots hold now: one more
     * look, for a message that came since the last. */
    c->tpo->box_watch(c->tp, r->k->seq);
    return box_poll(r) != 0 || weft__pass_test(r) == WEFT_OK;
}

/* The first pass of a collective call that runs on frames, where c has
 * a box: its header goes to the box's note, where a rank whose call went
 * to the box finds it instead of a message. */
static void box_announce(run *r)
{
    weft__ctx *c = r->c;
    uint8_t b[HDR_BYTES];
    ophdr h = hdr_make(r->k, r->pass, TAG_BOX_FRAMES, r->k->seq, 0);

    hdr_encode(b, &h);
    c->tpo->box_announce(c->tp, r->k->seq, b, sizeof b);
}

/* ---- the one-copy all_reduce's set-up (engine.h) ---- */

/* Whether this rank can read ranks [lo, lo + n) but itself. */
static int can_read_all(weft__ctx *c, int lo, int n)
{
    for (int p = lo; p < lo + n; p++)
        if (p != c->rank && !c->tpo->can_read(c->tp, p))
            return 0;
    return 1;
}

void weft__pull_init(weft__ctx *c)
{
    const int local = c->cfg->hier_local;

    c->pull = 0;
    c->pull_host = 0;
    if (c->cfg->pull_threads < 1 || c->tpo->can_read == NULL ||
        c->tpo->peer_read == NULL)
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
    return c->tpo->peer_read(c->tp, peer, dst, addr, len, err);
}

void weft__call_end(weft__ctx *c, uint64_t seq)
{
    if (c->box != 0)
        c->tpo->box_done(c->tp, seq);
}
