/*
 * The operation header that starts every channel of a pass (see
 * "headers" below).
 */
#include "engine/pass.h"

#include "base/bytes.h"

#include <stdio.h>
#include <string.h>

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

ophdr weft__hdr_make(const weft__call *k, int pass, uint32_t tag, uint64_t seq,
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

void weft__hdr_encode(uint8_t *b, const ophdr *h)
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

void weft__hdr_decode(const uint8_t *b, ophdr *h)
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
        "broadcast", "send/recv",  "barrier",    "reduce",
        "gather",    "scatter",    "all_to_all", "all_to_allv"};
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
             h->kind < sizeof kinds / sizeof kinds[0] ? kinds[h->kind] : "?",
             (unsigned long long)h->count,
             h->dtype < 10 ? dtypes[h->dtype] : "?", extra,
             (unsigned long long)h->seq);
}

/* Compares a received header with the one this rank expects from peer on
 * wire w; a difference fails the pass with a message that names both
 * calls. Returns 0 when they match. */
int weft__hdr_check(run *r, const uint8_t *got, const ophdr *want, int peer,
                    int w)
{
    weft__ctx *c = r->c;
    int *result = &r->err;
    uint8_t wb[HDR_BYTES];
    char mine[128], theirs[128];
    ophdr g;

    weft__hdr_encode(wb, want);
    if (memcmp(wb, got, HDR_MATCH_BYTES) == 0) {
        uint32_t hint = weft__get_le32(got + HDR_MATCH_BYTES);

        if (hint < r->k->hint)
            r->k->hint = hint;
        return 0;
    }
    weft__hdr_decode(got, &g);
    hdr_describe(want, mine, sizeof mine);
    if (g.magic != HDR_MAGIC)
        return weft__fail_into(c, result, WEFT_EMISMATCH,
                               "rank %d: %s: peer %d sent bytes that are no "
                               "operation header on wire %d, where this rank "
                               "expected the start of %s (data an earlier "
                               "call with mismatched arguments left on the "
                               "wire?)",
                               c->rank, r->k->name, peer, w, mine);
    hdr_describe(&g, theirs, sizeof theirs);
    if (strcmp(mine, theirs) == 0 && g.parts != want->parts)
        return weft__fail_into(
            c, result, WEFT_EMISMATCH,
            "rank %d: peer %d ran %s as a batch of other "
            "operations than this rank's (the counts of "
            "consecutive all_reduces differ between ranks): "
            "ranks must call the same collectives with the "
            "same count, dtype, op and root, in the same order",
            c->rank, peer, mine);
    if (strcmp(mine, theirs) != 0)
        return weft__fail_into(
            c, result, WEFT_EMISMATCH,
            "rank %d: peer %d called %s while this rank "
            "called %s: ranks must call the same collectives "
            "with the same count, dtype, op and root, in the "
            "same order",
            c->rank, peer, theirs, mine);
    return weft__fail_into(c, result, WEFT_EMISMATCH,
                           "rank %d: %s: peer %d on wire %d is at pass %u, tag "
                           "%u with %llu bytes where this rank is at pass %u, "
                           "tag %u with %llu bytes (the ranks chose different "
                           "algorithms: mismatched thresholds or topology?)",
                           c->rank, mine, peer, w, g.pass, g.tag,
                           (unsigned long long)g.total, want->pass, want->tag,
                           (unsigned long long)want->total);
}

/* The header of lane `lane`'s sends (is_send) or receives. */
ophdr weft__lane_hdr(const run *r, int lane, int is_send)
{
    return weft__hdr_make(r->k, r->pass, (uint32_t)r->op.lanes[lane].tag,
                          is_send ? r->sseq[lane] : r->rseq[lane],
                          is_send ? r->stotal[lane] : r->rtotal[lane]);
}
