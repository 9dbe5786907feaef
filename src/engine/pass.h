/*
 * The engine's pass state, shared by the files of src/engine and private
 * to them: engine.c (passes, pumping, waiting), header.c (the operation
 * header), wires.c (several passes on one wire's streams), channels.c
 * (check channels and relayed point to point), box.c (the box's pass),
 * ctx.c (the context's error record, scratch and reads).
 */
#ifndef WEFT_PASS_H
#define WEFT_PASS_H

#include "engine/engine.h"
#include "engine/plan.h"
#include "engine/reducer.h"
#include "transport/transport.h"

#include <stddef.h>
#include <stdint.h>

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
    struct unexp *r_unexp;  /* its message, read early, still arriving */
    struct wstate *r_tnext; /* the next point-to-point receive waiting on
                               its wire for a header (rxq) */
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
    /* match.c: the probes waiting for a message (any-source receives),
     * and each relayed source's reader ([peer], made when first used). */
    struct weft__pass *probes;
    int probe_next_peer; /* where the next probe starts to look */
    struct rlq *rl;
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
    /* A probe pass (weft__probe_start, match.c): no lanes; it ends once
     * probe_src names the peer whose message of probe_tag it found. */
    int probe;
    int probe_src;
    int *probe_out; /* where the peer goes */
    uint32_t probe_tag;
    struct weft__pass *probe_next; /* the engine's list of those waiting */
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
    /* The relayed receive's tag and buffer, and the next pass waiting for
     * a message from its source (match.c). */
    uint32_t rl_tag;
    void *rl_buf;
    struct weft__pass *rl_next;
    /* A box pass's message: its header, then its data. */
    uint8_t box_msg[WEFT__BOX_MSG_MAX];
} run;

/* Records a failure on the communicator's one error record and makes it
 * the result of the pass (*result) unless it has one: whatever that
 * record holds, the first cause. */
int weft__fail_into(weft__ctx *c, int *result, int err, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
#define engine_fail(r, ...) weft__fail_into((r)->c, &(r)->err, __VA_ARGS__)

/* ---- engine.c ---- */

/* Wire w's region of a step of len bytes over nw wires; len 0 or an unused
 * wire gives an empty region. */
weft__region weft__step_region(const run *r, size_t len, int nw, int w);
/* The same for elements of esize, whatever pass they belong to (a message
 * read before its receive started). */
weft__region weft__wire_region(const weft__ctx *c, size_t len, size_t esize,
                               int nw, int w);
/* Posts what lane `lane` of r may post now, on each of its wires. */
void weft__pump_lane(run *r, int lane);
/* A pass that cannot start: op's steps are freed; before anything of its
 * call moved, c stays usable (the error is only noted); later, the call
 * is broken half way and c fails. */
int weft__start_error(weft__ctx *c, weft__call *k, weft__op *op, int err,
                      const char *fmt, ...)
    __attribute__((format(printf, 5, 6)));
/* Makes c's engine (its staging and streams) where it has none yet. */
int weft__engine_ensure(weft__ctx *c);
/* Takes back the frames the reducer has finished: each is done on its
 * wire, and its lane posts what that allows. Returns 1 if any came. */
int weft__reap(run *r);

/* ---- header.c ---- */

ophdr weft__hdr_make(const weft__call *k, int pass, uint32_t tag, uint64_t seq,
                     uint64_t total);
void weft__hdr_encode(uint8_t *b, const ophdr *h);
void weft__hdr_decode(const uint8_t *b, ophdr *h);
/* Compares a received header with the one this rank expects from peer on
 * wire w; a difference fails the pass with a message that names both
 * calls. Returns 0 when they match. */
int weft__hdr_check(run *r, const uint8_t *got, const ophdr *want, int peer,
                    int w);
/* The header of lane `lane`'s sends (is_send) or receives. */
ophdr weft__lane_hdr(const run *r, int lane, int is_send);

/* ---- wires.c ---- */

/* Makes c's streams' state (e->rx, e->tx); -1 without memory. */
int weft__wires_init(weft__ctx *c, struct weft__engine *e);
/* Forgets every stream's state (the transport was shut down: nothing is
 * in flight), and frees the early messages. */
void weft__wires_reset(weft__ctx *c);
/* A lane's wire asks for its header; 1 where it has it already. */
int weft__rx_ask(run *r, wstate *ws);
/* The lane that owned the stream from peer on wire w posted its frames. */
void weft__rx_release(weft__ctx *c, int peer, int w);
/* 1 where ws may put its bytes on its wire's stream now; else it queues
 * and is pumped again once the stream is its own. */
int weft__tx_take(run *r, wstate *ws);
/* ws posted its last frame: its stream goes to the next in line. */
void weft__tx_done(run *r, wstate *ws);
/* A check channel waits for its header from wire 0, and sends its own
 * there once the stream is free. */
void weft__rx_ask_check(check *k);
void weft__tx_check(check *k);

/* ---- channels.c ---- */

int weft__check_done(const run *r);
/* The check channels of a collective pass (see channels.c). */
void weft__plan_checks(run *r);
void weft__post_checks(run *r);
/* Posts a check channel's header on wire 0 (its stream is free). */
void weft__check_send(check *k);
void weft__post_relay(run *r, const weft__relay *rl);
int weft__relay_done_all(const run *r);

/* ---- match.c (tags and sources) ---- */

/* A relayed receive (r->rsrc, rl_tag, rl_buf, rl_want set) asks for the
 * first message of its tag from its source. */
int weft__relay_take(run *r);
/* channels.c: the relayed header handed to r came (0: it matched), and
 * the receive of its bytes into r's buffer. */
int weft__relay_hdr_got(run *r, const uint8_t *hdr);
int weft__relay_recv_data(run *r);
/* A probe pass that ends leaves the engine's list. */
void weft__probe_leave(run *r);
/* wires.c: a header of a point-to-point message of `tag` is first on
 * wire 0 from peer and nobody takes it: 1 where a probe waiting for that
 * tag takes it (names the peer; the message stays for its receive). */
int weft__probe_claim(weft__ctx *c, int peer, uint32_t tag);
/* Forgets the relayed sources' readers and frees their early messages
 * (weft__wires_reset); frees them (weft__engine_free). */
void weft__match_reset(weft__ctx *c);
void weft__match_free(weft__ctx *c);

/* wires.c, for match.c: 1 where peer's wire 0 holds a point-to-point
 * message of tag that nobody takes yet (read early, or its header first
 * on the stream); and a kick of that stream, so that a probe sees what
 * comes. */
int weft__rx_has_tag(weft__ctx *c, int peer, uint32_t tag);
void weft__rx_kick0(weft__ctx *c, int peer);

/* ---- box.c ---- */

/* Publishes r's message where it is not yet, and takes the peers' that
 * came; returns r->err. */
int weft__box_poll(run *r);
/* A box pass's wait before the transport's: 1 where it ended (or
 * failed). */
int weft__box_wait(run *r);
/* The first pass of a collective call that runs on frames, where c has
 * a box: its header goes to the box's note. */
void weft__box_announce(run *r);

#endif
