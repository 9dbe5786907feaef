/*
 * The box's pass (engine.h): a collective's few bytes through a slot per
 * rank and call, without frames.
 */
#include "engine/pass.h"

#include "base/bytes.h"

#include <stdlib.h>
#include <string.h>

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
    weft__hdr_encode(out, &h);
}

void weft__box_init(weft__ctx *c)
{
    size_t least = WEFT__BOX_MSG_MAX;

    c->box = 0;
    if (!c->tpo->box->offered || c->nranks > BOX_MAX_RANKS)
        return;
    for (int p = 0; p < c->nranks; p++) {
        size_t b = p == c->rank ? least : c->tpo->box->bytes(c->tp, p);

        if (b < least)
            least = b;
    }
    if (least > BOX_HDR_BYTES)
        c->box = least - BOX_HDR_BYTES;
}

/* Publishes r's message where it is not yet, and takes the peers' that
 * came: their headers are checked, their data lands in box_out. Returns
 * r->err. */
int weft__box_poll(run *r)
{
    weft__ctx *c = r->c;
    const uint64_t seq = r->k->seq;
    uint8_t m[WEFT__BOX_MSG_MAX], full[HDR_BYTES];
    ophdr want;
    int rc, left = -1, left_mid = -1;

    if (r->err != 0)
        return r->err;
    if (!r->box_put) {
        rc = c->tpo->box->put(c->tp, seq, r->box_msg,
                              BOX_HDR_BYTES + r->box_len);
        if (rc < 0)
            return weft__fail_into(c, &r->err, rc, "rank %d: %s failed: %s",
                                   c->rank, r->k->name, weft_strerror(rc));
        r->box_put = rc == WEFT__BOX_PUBLISHED;
    }
    for (int p = 0; p < c->nranks && r->box_left > 0; p++) {
        size_t len;

        if (p == c->rank || (r->box_got >> p & 1) != 0)
            continue;
        rc = c->tpo->box->get(c->tp, p, seq, m, sizeof m, &len);
        if (rc < 0)
            return weft__fail_into(c, &r->err, rc, "rank %d: %s failed: %s",
                                   c->rank, r->k->name, weft_strerror(rc));
        if (rc == WEFT__BOX_NOT_YET)
            continue;
        if (rc == WEFT__BOX_LEFT_BEFORE) {
            left = left < 0 ? p : left;
            continue;
        }
        /* A message's header, in full; a note has it in full. */
        if (len < (rc == WEFT__BOX_FRAMES ? HDR_BYTES : BOX_HDR_BYTES))
            memset(full, 0, HDR_BYTES); /* no header: fails */
        else if (rc == WEFT__BOX_FRAMES)
            memcpy(full, m, HDR_BYTES);
        else
            box_hdr_full(m, len, r->k, full);
        want = weft__hdr_make(r->k, r->pass, TAG_BOX, seq, r->box_len);
        /* A note differs in its tag at least: it says which call. */
        if (weft__hdr_check(r, full, &want, p, 0) != 0 ||
            rc == WEFT__BOX_FRAMES)
            return weft__fail_into(
                c, &r->err, WEFT_EMISMATCH,
                "rank %d: %s: peer %d runs it on frames where "
                "this rank runs it in shared memory's box "
                "(mismatched WEFT_ALGO?)",
                c->rank, r->k->name, p);
        if (rc == WEFT__BOX_LEFT_MID) {
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
        return weft__fail_into(
            c, &r->err, WEFT_EPEER,
            "rank %d: %s: peer %d (same host) closed its side "
            "(finalized, failed or exited) %s the call",
            c->rank, r->k->name, left_mid >= 0 ? left_mid : left,
            left_mid >= 0 ? "in the middle of" : "before its part of");
    return 0;
}

int weft__box_start(weft__ctx *c, weft__call *k, const void *data, size_t len,
                    char *out, weft__pass **pass)
{
    run *r;

    *pass = NULL;
    if (len > c->box)
        return weft__start_error(c, k, &(weft__op){0}, WEFT_EINVAL,
                                 "rank %d: %s: %zu bytes in the box, where it "
                                 "holds %zu",
                                 c->rank, k->name, len, c->box);
    if (weft__engine_ensure(c) != 0)
        return weft__start_error(c, k, &(weft__op){0}, WEFT_ENOMEM,
                                 "rank %d: %s: no memory for the engine",
                                 c->rank, k->name);
    if ((r = c->eng->spare) != NULL) {
        c->eng->spare = NULL;
        memset(r, 0, offsetof(run, op));
    } else if ((r = calloc(1, sizeof *r)) == NULL)
        return weft__start_error(c, k, &(weft__op){0}, WEFT_ENOMEM,
                                 "rank %d: %s: out of memory", c->rank,
                                 k->name);
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
    weft__box_poll(r);
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
int weft__box_wait(run *r)
{
    weft__ctx *c = r->c;

    if (weft__box_poll(r) != 0 || weft__pass_test(r) == WEFT_OK)
        return 1;
    if (r->box_waited)
        return 0;
    r->box_waited = 1;
    /* The watch reports changes from what the slots hold now: one more
     * look, for a message that came since the last. */
    c->tpo->box->watch(c->tp, r->k->seq);
    return weft__box_poll(r) != 0 || weft__pass_test(r) == WEFT_OK;
}

/* The first pass of a collective call that runs on frames, where c has
 * a box: its header goes to the box's note, where a rank whose call went
 * to the box finds it instead of a message. */
void weft__box_announce(run *r)
{
    weft__ctx *c = r->c;
    uint8_t b[HDR_BYTES];
    ophdr h = weft__hdr_make(r->k, r->pass, TAG_BOX_FRAMES, r->k->seq, 0);

    weft__hdr_encode(b, &h);
    c->tpo->box->announce(c->tp, r->k->seq, b, sizeof b);
}
