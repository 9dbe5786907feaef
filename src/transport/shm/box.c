/*
 * The box (shm.h, transport.h): a slot per rank and collective call in
 * the box segment, for calls whose few bytes every rank of the host sends
 * to every other. Writing a message is a copy into this rank's slot and a
 * release store of the call's number; reading one is an acquire load of
 * that number and a copy out. Sleepers are woken as for the rings: the
 * writer stores, fences, then looks at the peer's sleeping flag; the
 * sleeper raises its flag, fences, then looks at the slots once more
 * (weft__shm_box_moved, from shm_pass). The writer's fence and look come
 * later than its stores (weft__shm_box_flush): when its call ends, when
 * it has spun a while, or before it sleeps itself, whichever is first; a
 * peer that sleeps meanwhile is woken that much later, where a fence
 * right after the stores would delay every call.
 *
 * Nothing else is written per call: a call on frames writes its note (a
 * line this rank owns), and what a peer has ended is read from its slots
 * and note, so no line moves between cores for the box's own sake. (Slots
 * in each pair's segment, written n - 1 times per call, made 16 ranks no
 * faster than recursive doubling on frames on the 16-core host.) (A
 * done count written at every call's end, read by the writers, cost the
 * frames' 512-byte all_reduce 10-15% on the 16-core host.)
 */
#include "transport/shm/shm.h"

#include <string.h>

size_t weft__shm_box_bytes(weft__tp *t, int peer)
{
    shm_tp *tp = (shm_tp *)t;

    if (tp->box_seg == NULL || peer < 0 || peer >= tp->nranks ||
        tp->local[peer] == NULL)
        return 0;
    return SHM_BOX_MSG;
}

/* Whether w's peer has left: its TCP connection ended (noticed by the
 * last pass that looked), or it marked the segment on its failure or its
 * finalize. */
static int peer_gone(const shm_wire *w)
{
    return w->dead || atomic_load(w->peer_aborted) != 0;
}

/* The last call w's peer is known to have ended: it started the next one
 * where its slot or note holds it, or it said so when it left. Kept in
 * box_peer_done. */
static uint64_t peer_ended(shm_tp *tp, shm_wire *w)
{
    shm_box_area *pa = shm_box_area_of(tp, w->peer);
    /* Acquire: the peer's last read of this rank's slot happened before
     * what these say, so the slot's next write comes after it. */
    uint64_t e = atomic_load_explicit(&pa->done, memory_order_acquire);
    uint64_t n = atomic_load_explicit(&pa->note.seq, memory_order_acquire);

    for (int k = 0; k < SHM_BOX_DEPTH; k++) {
        uint64_t at =
            atomic_load_explicit(&pa->slot[k].seq, memory_order_acquire);
        if (at > e + 1)
            e = at - 1;
    }
    if (n > e + 1)
        e = n - 1;
    if (e > w->box_peer_done)
        w->box_peer_done = e;
    return w->box_peer_done;
}

void weft__shm_box_announce(weft__tp *t, uint64_t seq, const void *hdr,
                            size_t len)
{
    shm_tp *tp = (shm_tp *)t;
    uint64_t words[SHM_NOTE_WORDS] = {0};
    shm_box_note *n;

    if (tp->err != 0 || tp->shut || seq == 0 || tp->box_seg == NULL)
        return;
    n = &shm_box_area_of(tp, tp->rank)->note;
    memcpy(words, hdr, len < sizeof words ? len : sizeof words);
    /* A seqlock: 0 while the words change. */
    atomic_store_explicit(&n->seq, 0, memory_order_relaxed);
    shm_fence(memory_order_release); /* the 0 before the words */
    for (int k = 0; k < SHM_NOTE_WORDS; k++)
        atomic_store_explicit(&n->w[k], words[k], memory_order_relaxed);
    atomic_store_explicit(&n->seq, seq, memory_order_release);
    tp->box_shown = seq;
}

/* Whether w's peer's note says it runs call seq on frames: 1 with its
 * header in out. */
static int note_says(shm_box_note *n, uint64_t seq, void *out, size_t cap,
                     size_t *len)
{
    uint64_t words[SHM_NOTE_WORDS];

    if (atomic_load_explicit(&n->seq, memory_order_acquire) != seq)
        return 0;
    for (int k = 0; k < SHM_NOTE_WORDS; k++)
        words[k] = atomic_load_explicit(&n->w[k], memory_order_relaxed);
    shm_fence(memory_order_acquire); /* the words before seq */
    if (atomic_load_explicit(&n->seq, memory_order_relaxed) != seq)
        return 0; /* rewritten meanwhile: a later call's */
    *len = cap < sizeof words ? cap : sizeof words;
    memcpy(out, words, *len);
    return 1;
}

int weft__shm_box_put(weft__tp *t, uint64_t seq, const void *msg, size_t len)
{
    shm_tp *tp = (shm_tp *)t;
    shm_box_slot *slot;

    if (tp->err != 0)
        return tp->err;
    if (tp->shut)
        return WEFT_EABORTED;
    if (len > SHM_BOX_MSG || seq == 0) {
        weft__shm_fail(tp, WEFT_EINVAL,
                       "rank %d: a box message of %zu bytes for call #%llu "
                       "(at most %d bytes, calls from #1)",
                       tp->rank, len, (unsigned long long)seq, SHM_BOX_MSG);
        return tp->err;
    }
    /* Every peer has ended the call whose slot this one takes. */
    for (int i = 0; seq > SHM_BOX_DEPTH && i < tp->nlocal; i++) {
        shm_wire *w = &tp->wires[i];
        int gone;

        if (w->box_peer_done >= seq - SHM_BOX_DEPTH)
            continue;
        gone = peer_gone(w);
        if (peer_ended(tp, w) >= seq - SHM_BOX_DEPTH)
            continue;
        if (!gone) {
            /* A note moves without a wake-up: sleep briefly. */
            tp->box_room = tp->box_watch != 0;
            return WEFT__BOX_NO_ROOM;
        }
        weft__shm_fail(tp, WEFT_EPEER,
                       "rank %d: peer %d (same host, pid %d) closed its "
                       "side (finalized, failed or exited) %d or more "
                       "calls before call #%llu",
                       tp->rank, w->peer, (int)w->pid, SHM_BOX_DEPTH,
                       (unsigned long long)seq);
        return tp->err;
    }
    tp->box_room = 0;
    slot = &shm_box_area_of(tp, tp->rank)->slot[seq % SHM_BOX_DEPTH];
    slot->len = (uint32_t)len;
    memcpy(slot->msg, msg, len);
    atomic_store_explicit(&slot->seq, seq, memory_order_release);
    tp->box_shown = seq;
    /* The sleepers are woken later (weft__shm_box_flush): a fence here
     * would wait for these stores to reach the peers' cores before this
     * rank looks for their messages, which it can do meanwhile. But a
     * peer seen asleep already (a look without the fence, which may miss
     * one that is just going to sleep: the later flush finds that one) is
     * woken now, as the rings wake it: on a loaded host, where peers
     * sleep, waking them a few microseconds later made calls slower than
     * on frames. */
    tp->box_unflushed = 1;
    for (int i = 0; i < tp->nlocal; i++)
        if (atomic_load_explicit(tp->wires[i].peer_sleep,
                                 memory_order_relaxed) != 0) {
            weft__shm_box_flush(tp);
            break;
        }
    return WEFT__BOX_PUBLISHED;
}

void weft__shm_box_flush(shm_tp *tp)
{
    if (!tp->box_unflushed)
        return;
    tp->box_unflushed = 0;
    weft__shm_poke_sleepers(tp);
}

int weft__shm_box_get(weft__tp *t, int peer, uint64_t seq, void *out,
                      size_t cap, size_t *len)
{
    shm_tp *tp = (shm_tp *)t;
    shm_wire *w = tp->local[peer];
    shm_box_area *pa = shm_box_area_of(tp, peer);
    shm_box_slot *s = &pa->slot[seq % SHM_BOX_DEPTH];
    /* Looked at before the slot and its done count: a peer that left
     * after writing them wrote them before. */
    int said = atomic_load(w->peer_aborted) != 0;
    int gone = said || w->dead;
    uint64_t at = atomic_load_explicit(&s->seq, memory_order_acquire);

    if (tp->err != 0)
        return tp->err;
    if (at > seq) {
        /* It cannot write call seq + SHM_BOX_DEPTH before this rank has
         * started call seq + 1: a peer that broke the protocol. */
        weft__shm_fail(tp, WEFT_ETRANSPORT,
                       "rank %d: peer %d's box holds call #%llu where this "
                       "rank waits for call #%llu",
                       tp->rank, peer, (unsigned long long)at,
                       (unsigned long long)seq);
        return tp->err;
    }
    if (at == seq) {
        size_t n = s->len;

        if (n > SHM_BOX_MSG)
            n = SHM_BOX_MSG;
        if (n > cap)
            n = cap;
        memcpy(out, s->msg, n);
        *len = n;
        /* A peer that left by its own hand (its finalize, or a failure:
         * the flag, with its done count first) ended the call where the
         * count says so; else it failed in it, and its message must not
         * make a call succeed here that failed there. One that died (its
         * connection closed, no flag) said nothing and returned nothing:
         * its message is whole (its number is stored after it), so a
         * rank killed just after its call, or in it, took its part. */
        return !said || atomic_load_explicit(&pa->done, memory_order_acquire) >=
                            seq
                   ? WEFT__BOX_READY
                   : WEFT__BOX_LEFT_MID;
    }
    if (note_says(&pa->note, seq, out, cap, len))
        return WEFT__BOX_FRAMES;
    return gone ? WEFT__BOX_LEFT_BEFORE : WEFT__BOX_NOT_YET;
}

void weft__shm_box_done(weft__tp *t, uint64_t seq)
{
    shm_tp *tp = (shm_tp *)t;

    /* This rank's messages reach the peers that sleep, now that its call
     * ended (by now the fence waits for nothing). */
    weft__shm_box_flush(tp);
    if (seq <= tp->box_done)
        return;
    tp->box_done = seq;
    /* Its slots and note say that this rank ended the calls before the
     * last one it wrote; a call that took the numbers of several (a batch
     * of all_reduces) ends past what they say, so it is written here
     * (else a peer waiting for room would wait for this rank, and this
     * rank for it). Other calls write nothing. */
    if (seq > tp->box_shown && tp->box_seg != NULL && !tp->shut)
        atomic_store_explicit(&shm_box_area_of(tp, tp->rank)->done, seq,
                              memory_order_release);
}

/* What a watch compares: every peer's slots (the watched call's, and
 * those that say it started a call after it), its note, its done count,
 * and whether it left. All grow (a note is 0 only while it is written),
 * so their sum changes when one does. */
static uint64_t box_sig(shm_tp *tp)
{
    uint64_t sig = 0;

    for (int i = 0; i < tp->nlocal; i++) {
        shm_wire *w = &tp->wires[i];
        shm_box_area *pa = shm_box_area_of(tp, w->peer);

        for (int k = 0; k < SHM_BOX_DEPTH; k++)
            sig += atomic_load_explicit(&pa->slot[k].seq, memory_order_relaxed);
        sig += atomic_load_explicit(&pa->note.seq, memory_order_relaxed);
        sig += atomic_load_explicit(&pa->done, memory_order_relaxed);
        sig += atomic_load_explicit(w->peer_aborted, memory_order_relaxed);
        sig += (uint64_t)w->dead; /* its connection's end, noticed */
    }
    return sig;
}

void weft__shm_box_watch(weft__tp *t, uint64_t seq)
{
    shm_tp *tp = (shm_tp *)t;

    tp->box_watch = seq;
    if (seq == 0) {
        tp->box_room = 0;
        weft__shm_box_flush(tp);
    } else
        tp->box_sig = box_sig(tp);
}

int weft__shm_box_moved(shm_tp *tp)
{
    uint64_t sig = box_sig(tp);

    if (sig == tp->box_sig)
        return 0;
    tp->box_sig = sig;
    return 1;
}
