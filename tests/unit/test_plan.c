/*
 * The wire planner's invariants, for W = 1..4, element sizes 1/2/4/8, every
 * byte size from 0 to W*DEPTH*frame + 3*frame, and large awkward sizes:
 * regions partition the buffer and are element-aligned, frames never cross
 * a region, and sender and receiver (which compute the same pure function)
 * prefill the same number of frames, bounded by each wire's own region.
 */
#include <criterion/criterion.h>

#include "engine/plan.h"
#include "topo/topo.h"

#define FRAME 64
#define DEPTH 4

static void check_plan(size_t n, int nw, size_t es)
{
    int used = weft__plan_wires(n, nw, WEFT__MIN_WIRE_BYTES);
    size_t next = 0;

    cr_assert(used >= 1 && used <= nw, "n=%zu nw=%d used=%d", n, nw, used);
    /* The regions must hold for any wire count, whatever the size policy
     * picks, so check them with all nw wires. */
    used = nw;
    for (int w = 0; w < used; w++) {
        weft__region r = weft__plan_region(n, used, es, w);
        weft__region again = weft__plan_region(n, used, es, w);
        size_t frames = weft__plan_frames(r.len, FRAME), sum = 0;

        cr_assert_eq(r.off, again.off);
        cr_assert_eq(r.len, again.len);
        cr_assert_eq(r.off, next, "n=%zu w=%d: gap or overlap", n, w);
        cr_assert_eq(r.off % es, 0, "n=%zu w=%d: off not aligned", n, w);
        cr_assert_eq(r.len % es, 0, "n=%zu w=%d: len not aligned", n, w);
        for (size_t f = 0; f < frames; f++) {
            size_t fl = weft__plan_frame_len(r.len, FRAME, f);
            cr_assert(fl > 0 && fl <= FRAME);
            cr_assert(f * FRAME + fl <= r.len, "frame crosses its region");
            sum += fl;
        }
        cr_assert_eq(weft__plan_frame_len(r.len, FRAME, frames), 0);
        cr_assert_eq(sum, r.len, "frames do not cover the region");
        cr_assert_eq(weft__plan_prefill(r.len, FRAME, DEPTH),
                     frames < DEPTH ? frames : DEPTH);
        cr_assert(weft__plan_prefill(r.len, FRAME, DEPTH) * FRAME <
                      r.len + FRAME,
                  "prefill reaches past the wire's own region");
        next = r.off + r.len;
    }
    cr_assert_eq(next, n, "regions do not cover the buffer");
}

Test(plan, every_size_small)
{
    static const size_t es[] = {1, 2, 4, 8};
    for (int nw = 1; nw <= 4; nw++)
        for (size_t e = 0; e < 4; e++)
            for (size_t n = 0; n <= (size_t)nw * DEPTH * FRAME + 3 * FRAME;
                 n += es[e])
                check_plan(n, nw, es[e]);
}

Test(plan, large_awkward_sizes)
{
    static const size_t sizes[] = {
        WEFT__MIN_WIRE_BYTES - 8, WEFT__MIN_WIRE_BYTES,
        WEFT__MIN_WIRE_BYTES + 8, 3 * WEFT__MIN_WIRE_BYTES + 24,
        (1u << 20) + 8,          (64u << 20) - 8,
        (64u << 20) + 1016,      1000000007ull * 8,
    };
    for (int nw = 1; nw <= 4; nw++)
        for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++)
            for (size_t es = 1; es <= 8; es *= 2)
                check_plan(sizes[i] / es * es, nw, es);
}

Test(plan, fewer_wires_for_small)
{
    cr_assert_eq(weft__plan_wires(0, 3, WEFT__MIN_WIRE_BYTES), 1);
    cr_assert_eq(weft__plan_wires(1, 3, WEFT__MIN_WIRE_BYTES), 1);
    cr_assert_eq(weft__plan_wires(WEFT__MIN_WIRE_BYTES, 3, WEFT__MIN_WIRE_BYTES), 1);
    cr_assert_eq(weft__plan_wires(WEFT__MIN_WIRE_BYTES + 1, 3, WEFT__MIN_WIRE_BYTES), 2);
    cr_assert_eq(weft__plan_wires(100u << 20, 3, WEFT__MIN_WIRE_BYTES), 3);
}
