/*
 * The stubs of a transport's optional parts (transport.h): the tables a
 * transport points at for a part it lacks, whose entries answer "not
 * here" instead of being NULL.
 */
#include "transport/transport.h"

static int no_relay(weft__tp *tp, int peer, weft__xfer *x)
{
    return WEFT_ENOTSUP;
}

const weft__tp_relay_ops weft__tp_no_relay = {
    .offered = 0,
    .send = no_relay,
    .recv = no_relay,
};

/* No peer is reached: every message holds 0 bytes. */
static size_t no_box_bytes(weft__tp *tp, int peer)
{
    return 0;
}

static int no_box_put(weft__tp *tp, uint64_t seq, const void *msg, size_t len)
{
    return WEFT_ENOTSUP;
}

static void no_box_announce(weft__tp *tp, uint64_t seq, const void *hdr,
                            size_t len)
{
}

static int no_box_get(weft__tp *tp, int peer, uint64_t seq, void *out,
                      size_t cap, size_t *len)
{
    return WEFT_ENOTSUP;
}

/* done and watch: nothing to tell, nothing to watch. */
static void no_box_seq(weft__tp *tp, uint64_t seq)
{
}

const weft__tp_box_ops weft__tp_no_box = {
    .offered = 0,
    .bytes = no_box_bytes,
    .put = no_box_put,
    .announce = no_box_announce,
    .get = no_box_get,
    .done = no_box_seq,
    .watch = no_box_seq,
};

static int no_can_read(weft__tp *tp, int peer)
{
    return 0;
}

static int no_peer_read(weft__tp *tp, int peer, void *dst, uint64_t addr,
                        size_t len, int *err)
{
    return WEFT_ENOTSUP;
}

const weft__tp_read_ops weft__tp_no_read = {
    .offered = 0,
    .can_read = no_can_read,
    .peer_read = no_peer_read,
};
