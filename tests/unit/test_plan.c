/*
 * The wire planner's invariants, for W = 1..4, element sizes 1/2/4/8, every
 * byte size from 0 to W*DEPTH*frame + 3*frame, and large awkward sizes:
 * regions partition the buffer and are element-aligned, frames never cross
 * a region, and sender and receiver (which compute the same pure function)
 * prefill the same number of frames, bounded by each wire's own region.
 */
#include <criterion/criterion.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

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
        (1u << 20) + 8,           (64u << 20) - 8,
        (64u << 20) + 1016,       1000000007ull * 8,
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
    cr_assert_eq(
        weft__plan_wires(WEFT__MIN_WIRE_BYTES, 3, WEFT__MIN_WIRE_BYTES), 1);
    cr_assert_eq(
        weft__plan_wires(WEFT__MIN_WIRE_BYTES + 1, 3, WEFT__MIN_WIRE_BYTES), 2);
    cr_assert_eq(weft__plan_wires(100u << 20, 3, WEFT__MIN_WIRE_BYTES), 3);
}

/* ---- recursive halving + doubling (weft__plan_halving) ----
 *
 * Every rank's rounds are simulated together on symbolic elements: each
 * element holds the set of ranks whose inputs it sums (a bit mask) and
 * the number of the reduction that made it (inputs have their own), so
 * the test sees that sends and receives pair up exactly, that nothing is
 * read before it is written (the result buffer starts empty, and the
 * input is read only where a round says so), that no input is counted
 * twice, that every rank ends with every input in every element, and
 * that every rank's element came out of the same reduction (the
 * bitwise-identical results of API.md). In place, the input and the
 * result are one buffer. */

#define HV_MAX_RANKS 64
#define HV_MAX_COUNT 1200

typedef struct {
    uint64_t mask; /* 0: nothing written here yet */
    uint32_t id;
} hv_elem;

static hv_elem hv_in[HV_MAX_RANKS][HV_MAX_COUNT];
static hv_elem hv_out[HV_MAX_RANKS][HV_MAX_COUNT];
static hv_elem hv_msg[HV_MAX_RANKS][HV_MAX_COUNT];

static int regions_overlap(weft__region a, weft__region b)
{
    return a.len > 0 && b.len > 0 && a.off < b.off + b.len &&
           b.off < a.off + a.len;
}

static void check_halving(size_t count, int n, int inplace)
{
    const int rounds = weft__plan_halving_rounds(n);
    int lg = 0;
    uint32_t next_id = HV_MAX_RANKS + 1;

    while ((2 << lg) <= n)
        lg++;
    cr_assert_eq(rounds, 2 * lg + ((1 << lg) < n ? 2 : 0), "n=%d", n);
    for (int r = 0; r < n; r++)
        for (size_t e = 0; e < count; e++) {
            hv_in[r][e] = (hv_elem){1ull << r, (uint32_t)r + 1};
            hv_out[r][e] = inplace ? hv_in[r][e] : (hv_elem){0, 0};
        }
    for (int k = 0; k < rounds; k++) {
        weft__halving_round hr[HV_MAX_RANKS];

        for (int r = 0; r < n; r++)
            hr[r] = weft__plan_halving(count, n, r, k);
        /* Pairing, regions, and what each rank sends, read before any
         * receive of the round lands (they run at once). */
        for (int r = 0; r < n; r++) {
            const weft__halving_round *h = &hr[r];
            hv_elem(*own)[HV_MAX_COUNT] =
                h->from_input && !inplace ? hv_in : hv_out;

            cr_assert(h->send_peer != r && h->recv_peer != r);
            cr_assert(!regions_overlap(h->send, h->recv),
                      "n=%d count=%zu round %d rank %d: the send and the "
                      "receive overlap",
                      n, count, k, r);
            if (h->recv_peer >= 0) {
                const weft__halving_round *g = &hr[h->recv_peer];
                cr_assert_eq(g->send_peer, r, "n=%d round %d: %d waits for %d",
                             n, k, r, h->recv_peer);
                cr_assert(g->send.off == h->recv.off &&
                              g->send.len == h->recv.len,
                          "n=%d count=%zu round %d: %d sends other elements "
                          "than %d receives",
                          n, count, k, h->recv_peer, r);
                if (count >= (size_t)n)
                    cr_assert(h->recv.len > 0,
                              "n=%d count=%zu round %d: an empty receive", n,
                              count, k);
            }
            if (h->send_peer < 0)
                continue;
            cr_assert_eq(hr[h->send_peer].recv_peer, r,
                         "n=%d round %d: %d sends to %d, which does not "
                         "receive",
                         n, k, r, h->send_peer);
            cr_assert(h->send.off + h->send.len <= count);
            if (count >= (size_t)n)
                cr_assert(h->send.len > 0,
                          "n=%d count=%zu round %d: an "
                          "empty send",
                          n, count, k);
            for (size_t e = 0; e < h->send.len; e++) {
                hv_elem x = own[r][h->send.off + e];
                cr_assert(x.mask != 0,
                          "n=%d count=%zu round %d: rank %d sends element "
                          "%zu before it has it",
                          n, count, k, r, h->send.off + e);
                hv_msg[r][e] = x;
            }
        }
        for (int r = 0; r < n; r++) {
            const weft__halving_round *h = &hr[r];
            hv_elem(*own)[HV_MAX_COUNT] =
                h->from_input && !inplace ? hv_in : hv_out;

            if (h->recv_peer < 0)
                continue;
            cr_assert(h->recv.off + h->recv.len <= count);
            for (size_t e = 0; e < h->recv.len; e++) {
                size_t i = h->recv.off + e;
                hv_elem got = hv_msg[h->recv_peer][e], mine = own[r][i];

                if (!h->reduce) {
                    hv_out[r][i] = got;
                    continue;
                }
                cr_assert(mine.mask != 0,
                          "n=%d round %d: rank %d reduces into element %zu "
                          "before it has it",
                          n, k, r, i);
                cr_assert_eq(mine.mask & got.mask, 0,
                             "n=%d round %d: rank %d counts an input twice "
                             "in element %zu",
                             n, k, r, i);
                hv_out[r][i] = (hv_elem){mine.mask | got.mask, next_id++};
            }
        }
    }
    for (size_t e = 0; e < count; e++)
        for (int r = 0; r < n; r++) {
            cr_assert_eq(hv_out[r][e].mask, n == 64 ? ~0ull : (1ull << n) - 1,
                         "n=%d count=%zu: rank %d element %zu misses inputs", n,
                         count, r, e);
            cr_assert_eq(hv_out[r][e].id, hv_out[0][e].id,
                         "n=%d count=%zu: element %zu reduced differently "
                         "on rank %d and rank 0",
                         n, count, e, r);
        }
}

Test(plan, halving_every_rank_count)
{
    for (int n = 2; n <= 40; n++) {
        const size_t counts[] = {1,
                                 (size_t)n - 1,
                                 (size_t)n,
                                 (size_t)n + 1,
                                 2 * (size_t)n - 1,
                                 3 * (size_t)n + 7,
                                 1000};
        for (size_t i = 0; i < sizeof counts / sizeof counts[0]; i++)
            for (int inplace = 0; inplace < 2; inplace++)
                if (counts[i] > 0)
                    check_halving(counts[i], n, inplace);
    }
    check_halving(HV_MAX_COUNT, 64, 0);
    check_halving(HV_MAX_COUNT - 1, 63, 1);
}

Test(plan, halving_rounds)
{
    cr_assert_eq(weft__plan_halving_rounds(2), 2);
    cr_assert_eq(weft__plan_halving_rounds(3), 4);
    cr_assert_eq(weft__plan_halving_rounds(8), 6);
    cr_assert_eq(weft__plan_halving_rounds(12), 8);
    cr_assert_eq(weft__plan_halving_rounds(16), 8);
    cr_assert_eq(weft__plan_halving_rounds(17), 10);
}

/* ---- weft__hier_local: where the hierarchical algorithms run ---- */

/* A job of hosts with per[h] ranks each, in order, linked around a ring
 * (ring: host h to h+1, the last to 0; two hosts once) or along a line
 * (no link from the last to 0), on transport. */
struct hier_job {
    weft__config cfg;
    weft__host hosts[8];
    weft__link links[8];
};

static void hier_job_make(struct hier_job *j, int nhosts, const int *per,
                          int ring, const char *transport)
{
    int first = 0;

    memset(j, 0, sizeof *j);
    j->cfg.nhosts = nhosts;
    j->cfg.hosts = j->hosts;
    j->cfg.links = j->links;
    snprintf(j->cfg.transport, sizeof j->cfg.transport, "%s", transport);
    for (int h = 0; h < nhosts; h++) {
        j->hosts[h].nranks = per[h];
        j->hosts[h].first_rank = first;
        first += per[h];
    }
    j->cfg.nranks = first;
    for (int h = 0; h < nhosts; h++) {
        int next = (h + 1) % nhosts;
        if ((next == 0 && !ring) || (nhosts == 2 && h == 1))
            continue;
        j->links[j->cfg.nlinks].end[0].host = h;
        j->links[j->cfg.nlinks].end[1].host = next;
        j->cfg.nlinks++;
    }
}

Test(hier, shapes)
{
    static const int two[] = {2, 2, 2, 2}, four[] = {4, 4, 4},
                     one[] = {1, 1, 1}, uneven[] = {2, 3}, big[] = {18, 18};
    struct hier_job j;

    hier_job_make(&j, 2, two, 1, "tcp");
    cr_assert_eq(weft__hier_local(&j.cfg), 2, "2 hosts x 2 ranks");
    hier_job_make(&j, 4, two, 1, "tcp");
    cr_assert_eq(weft__hier_local(&j.cfg), 2, "4 hosts x 2 ranks, a ring");
    hier_job_make(&j, 3, four, 1, "tcp");
    cr_assert_eq(weft__hier_local(&j.cfg), 4, "3 hosts x 4 ranks");
    /* Links given the other way round join the same hosts. */
    for (int l = 0; l < j.cfg.nlinks; l++) {
        int h = j.links[l].end[0].host;
        j.links[l].end[0].host = j.links[l].end[1].host;
        j.links[l].end[1].host = h;
    }
    cr_assert_eq(weft__hier_local(&j.cfg), 4, "links reversed");

    hier_job_make(&j, 1, four, 1, "tcp");
    cr_assert_eq(weft__hier_local(&j.cfg), 0, "one host");
    hier_job_make(&j, 3, one, 1, "tcp");
    cr_assert_eq(weft__hier_local(&j.cfg), 0, "one rank per host");
    hier_job_make(&j, 2, uneven, 1, "tcp");
    cr_assert_eq(weft__hier_local(&j.cfg), 0, "hosts of 2 and 3 ranks");
    hier_job_make(&j, 2, big, 1, "tcp");
    cr_assert_eq(weft__hier_local(&j.cfg), 0,
                 "more ranks per host than "
                 "the mesh's lanes");
    hier_job_make(&j, 2, two, 1, "ibverbs");
    cr_assert_eq(weft__hier_local(&j.cfg), 0, "ibverbs: no local wires");
    hier_job_make(&j, 4, two, 0, "tcp");
    cr_assert_eq(weft__hier_local(&j.cfg), 0,
                 "hosts in a line: the last "
                 "and the first share no cable");
    hier_job_make(&j, 3, four, 1, "tcp");
    j.hosts[1].first_rank = 8;
    j.hosts[2].first_rank = 4;
    cr_assert_eq(weft__hier_local(&j.cfg), 0, "hosts not in rank order");
}
