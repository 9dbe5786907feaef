/* The wire planner; see plan.h. Everything here is a pure function. */
#include "engine/plan.h"

/* Each function answers its common cases (one wire, one frame) before it
 * divides: the engine asks several times per frame, and a small operation
 * spent 7% of its time on these divisions (2-core VM, 8 B all_reduce). */

int weft__plan_wires(size_t nbytes, int nwires, size_t min_wire_bytes)
{
    size_t want;

    if (nwires <= 1 || nbytes <= min_wire_bytes)
        return nwires < 1 ? nwires : 1;
    want = (nbytes + min_wire_bytes - 1) / min_wire_bytes;

    if (want < 1)
        want = 1;
    return want < (size_t)nwires ? (int)want : nwires;
}

weft__region weft__plan_region(size_t nbytes, int nwires, size_t elem_size,
                               int w)
{
    size_t elems, base, rem, uw = (size_t)w;
    weft__region r;

    if (nwires == 1) {
        /* Whole elements (every dtype's size is a power of two). */
        r.off = 0;
        r.len = (elem_size & (elem_size - 1)) == 0
                    ? nbytes & ~(elem_size - 1)
                    : nbytes / elem_size * elem_size;
        return r;
    }
    elems = nbytes / elem_size;
    base = elems / (size_t)nwires;
    rem = elems % (size_t)nwires;
    /* The first rem wires carry one element more; regions stay contiguous. */
    r.off = (uw * base + (uw < rem ? uw : rem)) * elem_size;
    r.len = (base + (uw < rem ? 1 : 0)) * elem_size;
    return r;
}

size_t weft__plan_frames(size_t len, size_t frame)
{
    if (len <= frame)
        return len != 0;
    return (len + frame - 1) / frame;
}

size_t weft__plan_frame_len(size_t len, size_t frame, size_t f)
{
    size_t start = f * frame;

    if (start >= len)
        return 0;
    return len - start < frame ? len - start : frame;
}

size_t weft__plan_prefill(size_t region_len, size_t frame, size_t depth)
{
    size_t frames = weft__plan_frames(region_len, frame);
    return frames < depth ? frames : depth;
}

weft__region weft__plan_chunk(size_t m, int n, int i)
{
    size_t base = m / (size_t)n, rem = m % (size_t)n, ui = (size_t)i;
    weft__region r = {ui * base + (ui < rem ? ui : rem),
                      base + (ui < rem ? 1 : 0)};
    return r;
}

/* The largest power of two <= n (n >= 1), and its log2. */
static int pow2_floor(int n, int *lg)
{
    int p = 1;

    *lg = 0;
    while (p * 2 <= n) {
        p *= 2;
        (*lg)++;
    }
    return p;
}

int weft__plan_halving_rounds(int nranks)
{
    int lg, p = pow2_floor(nranks, &lg);

    return 2 * lg + (p < nranks ? 2 : 0);
}

/* Chunks [lo, lo + m) of count elements cut into p, as one region. */
static weft__region chunk_span(size_t count, int p, int lo, int m)
{
    weft__region first = weft__plan_chunk(count, p, lo);
    size_t end = lo + m >= p ? count : weft__plan_chunk(count, p, lo + m).off;
    weft__region r = {first.off, end - first.off};

    return r;
}

weft__halving_round weft__plan_halving(size_t count, int nranks, int rank,
                                       int round)
{
    int lg, p = pow2_floor(nranks, &lg);
    int r = nranks - p, folds = r > 0;
    weft__halving_round hr = {-1, -1, {0, 0}, {0, 0}, 0, 0};
    weft__region all = {0, count};
    /* Rank v of the p that run the halving and doubling; -1 for the even
     * ranks that folded into their odd neighbour. */
    int v = rank < 2 * r ? (rank % 2 == 1 ? rank / 2 : -1) : rank - r;
    int j = round - folds, m, mine, peer_v;

    if (folds && (round == 0 || round == 2 * lg + 1)) {
        int last = round != 0;

        if (rank >= 2 * r)
            return hr;
        /* Round 0: the even rank's input to the odd one, reduced there;
         * the last round: the odd one's result back. */
        if ((rank % 2 == 0) != last) {
            hr.send_peer = rank % 2 == 0 ? rank + 1 : rank - 1;
            hr.send = all;
        } else {
            hr.recv_peer = rank % 2 == 0 ? rank + 1 : rank - 1;
            hr.recv = all;
            hr.reduce = !last;
        }
        hr.from_input = !last;
        return hr;
    }
    if (v < 0)
        return hr;
    if (j < lg) {
        /* Reduce-scatter, windows halving: of the window of 2m chunks
         * that holds v, keep the half that holds v. */
        m = p >> (j + 1);
        mine = (v & ~(2 * m - 1)) + (v & m);
        hr.send = chunk_span(count, p, mine ^ m, m);
        hr.recv = chunk_span(count, p, mine, m);
        hr.reduce = 1;
        hr.from_input = j == 0 && rank >= 2 * r;
    } else {
        /* All-gather, windows doubling: swap the m chunks each holds. */
        m = 1 << (j - lg);
        mine = v & ~(m - 1);
        hr.send = chunk_span(count, p, mine, m);
        hr.recv = chunk_span(count, p, mine ^ m, m);
    }
    peer_v = v ^ m;
    hr.send_peer = hr.recv_peer = peer_v < r ? 2 * peer_v + 1 : peer_v + r;
    return hr;
}
