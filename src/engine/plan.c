/* The wire planner; see plan.h. Everything here is a pure function. */
#include "engine/plan.h"

int weft__plan_wires(size_t nbytes, int nwires, size_t min_wire_bytes)
{
    size_t want = (nbytes + min_wire_bytes - 1) / min_wire_bytes;

    if (want < 1)
        want = 1;
    return want < (size_t)nwires ? (int)want : nwires;
}

weft__region weft__plan_region(size_t nbytes, int nwires, size_t elem_size,
                               int w)
{
    size_t elems = nbytes / elem_size;
    size_t base = elems / (size_t)nwires;
    size_t rem = elems % (size_t)nwires;
    size_t uw = (size_t)w;
    weft__region r;

    /* The first rem wires carry one element more; regions stay contiguous. */
    r.off = (uw * base + (uw < rem ? uw : rem)) * elem_size;
    r.len = (base + (uw < rem ? 1 : 0)) * elem_size;
    return r;
}

size_t weft__plan_frames(size_t len, size_t frame)
{
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
